//! The Postgres pool's size, read at each scrape.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Opts};
use sqlx::PgPool;

/// `docstream_db_pool_connections` (open), `docstream_db_pool_idle_connections`
/// and `docstream_db_pool_max_connections`, read from the pool when scraped.
/// How long a caller waits for a connection is
/// `docstream_db_pool_acquire_seconds`, sampled by the health probe.
pub struct PoolCollector {
    pool: PgPool,
    open: IntGauge,
    idle: IntGauge,
    max: IntGauge,
}

impl PoolCollector {
    /// A collector of `pool`'s gauges.
    pub fn new(pool: PgPool) -> Self {
        let gauge = |name: &str, help: &str| {
            IntGauge::with_opts(Opts::new(name, help)).expect("valid metric")
        };
        let max = gauge(
            "docstream_db_pool_max_connections",
            "The most Postgres connections this process's pool opens (DOCSTREAM_DB_MAX_CONNECTIONS).",
        );
        max.set(i64::from(pool.options().get_max_connections()));
        Self {
            open: gauge(
                "docstream_db_pool_connections",
                "Postgres connections open in this process's pool, idle or in use.",
            ),
            idle: gauge(
                "docstream_db_pool_idle_connections",
                "Postgres connections open and idle in this process's pool.",
            ),
            max,
            pool,
        }
    }
}

impl Collector for PoolCollector {
    fn desc(&self) -> Vec<&Desc> {
        [&self.open, &self.idle, &self.max]
            .into_iter()
            .flat_map(|gauge| gauge.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.open.set(i64::from(self.pool.size()));
        self.idle.set(self.pool.num_idle() as i64);
        [&self.open, &self.idle, &self.max]
            .into_iter()
            .flat_map(|gauge| gauge.collect())
            .collect()
    }
}
