//! The queue census: every `census_interval_s`, one process of the deployment
//! counts the open jobs, the oldest one's age, the queued jobs of the
//! busiest tenants by priority and the open orphans by class
//! (`store::census`), and exports them. Every process runs this loop, so the
//! census goes on while any process lives; each tick, the first to take the
//! turn reports, and a process whose turn it was not clears its own series, so
//! each series has a single source (dashboards take `max` over processes).
//! The turn also keeps the samples the console's overview draws, with the
//! consumer groups' lag as last read in the background ([`Lags`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use sqlx::PgPool;

use crate::config::{KafkaClient, Settings};
use crate::domain::Priority;
use crate::health::{Dependency, Health};
use crate::metrics::CensusMetrics;
use crate::store::orphans::{self, Thresholds};
use crate::store::{census, StoreError};

/// What the census counts with, and where it reports: the census's part of
/// a process.
pub struct Taker {
    pool: PgPool,
    /// How often a turn comes round.
    interval: Duration,
    /// When an open job counts as an orphan.
    thresholds: Thresholds,
    /// Where the consumer groups' lag is read.
    lags: LagSource,
    metrics: CensusMetrics,
    health: Health,
}

impl Taker {
    /// The census of a process with `settings`, on `pool`.
    pub fn new(settings: &Settings, pool: PgPool, metrics: CensusMetrics, health: Health) -> Self {
        Taker {
            pool,
            interval: settings.census_interval_s.get(),
            thresholds: Thresholds::of(settings),
            lags: LagSource::of(settings),
            metrics,
            health,
        }
    }
}

/// Runs the census until `shutdown`; a failed tick is counted and logged, and
/// the next one tries again.
pub async fn run(taker: Taker, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(taker.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let metrics = &taker.metrics;
    let lags = Lags::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // Bounded, so a census stuck on an unanswering database does not
        // keep the turn's series frozen: they are cleared instead.
        let tick = tokio::time::timeout(taker.interval, take(&taker, &lags)).await;
        let outcome = match tick {
            Ok(Ok(true)) => "taken",
            Ok(Ok(false)) => "skipped",
            Ok(Err(e)) => {
                if e.is_unavailable() {
                    taker.health.failed(Dependency::Postgres, &e);
                } else {
                    tracing::warn!(error = %e, "queue census failed; retrying next interval");
                }
                metrics.clear();
                "failed"
            }
            Err(_) => {
                metrics.clear();
                "failed"
            }
        };
        metrics.runs.with_label_values(&[outcome]).inc();
    }
}

/// One tick: takes the census if it is this process's turn (true), else
/// clears this process's census series (false).
async fn take(taker: &Taker, lags: &Lags) -> Result<bool, StoreError> {
    let (pool, metrics, interval) = (&taker.pool, &taker.metrics, taker.interval);
    if !census::take_turn(pool, interval.as_secs_f64()).await? {
        metrics.clear();
        return Ok(false);
    }
    export_jobs(metrics, &census::count(pool).await?);
    let open = orphans::count_open(pool, taker.thresholds).await?;
    export_orphans(metrics, &open);
    export_queued(metrics, census::queued_by_tenant(pool).await?);
    export_files(metrics, crate::store::files::by_tenant(pool).await?);
    let orphans: serde_json::Map<String, serde_json::Value> = open
        .iter()
        .map(|o| (o.class.label().to_owned(), o.open.into()))
        .collect();
    // Fresh for three turns (at least 10 s): a read slower than a turn
    // still counts, a broker gone for longer leaves the lag out.
    let lag = lags.latest(&taker.lags, (interval * 3).max(Duration::from_secs(10)));
    census::record_samples(pool, interval.as_secs_f64(), &orphans.into(), lag.as_ref()).await?;
    Ok(true)
}

/// The open jobs of each stage and status, and the oldest one's age.
fn export_jobs(metrics: &CensusMetrics, counts: &census::Census) {
    let jobs = [
        (
            "extraction",
            "queued",
            counts.queued,
            counts.oldest_queued_s,
        ),
        (
            "extraction",
            "running",
            counts.running,
            counts.oldest_running_s,
        ),
        (
            "bbox",
            "pending",
            counts.bbox_pending,
            counts.oldest_bbox_pending_s,
        ),
        (
            "bbox",
            "running",
            counts.bbox_running,
            counts.oldest_bbox_running_s,
        ),
    ];
    for (stage, status, count, oldest_s) in jobs {
        metrics.jobs.with_label_values(&[stage, status]).set(count);
        metrics
            .oldest_age
            .with_label_values(&[stage, status])
            .set(oldest_s);
    }
}

/// The open orphans of each class. Every class has a series, 0 when none is
/// open, so an alert on it ends when the reaper catches up instead of going
/// stale.
fn export_orphans(metrics: &CensusMetrics, open: &[orphans::OpenOrphans]) {
    for class in orphans::OrphanClass::ALL {
        let found = open.iter().find(|o| o.class == class);
        let (count, oldest_s) = found.map_or((0, 0.0), |o| (o.open, o.oldest_s));
        let label = [class.label()];
        metrics.orphans_open.with_label_values(&label).set(count);
        metrics
            .oldest_orphan_age
            .with_label_values(&label)
            .set(oldest_s);
    }
}

/// The queued jobs of the busiest tenants, by priority. Set whole each turn:
/// a tenant whose queue emptied loses its series. The others' are always
/// there (0 when none), as every orphan class is.
fn export_queued(metrics: &CensusMetrics, queued: Vec<census::Queued>) {
    metrics.queued.reset();
    for priority in Priority::ALL {
        (metrics.queued)
            .with_label_values(&[census::OTHER_TENANTS, priority.as_str()])
            .set(0);
    }
    for q in queued {
        (metrics.queued)
            .with_label_values(&[&q.tenant, &q.priority])
            .set(q.jobs);
    }
}

/// Each tenant's files and their bytes. Set whole too: a tenant whose files
/// were all deleted loses its series.
fn export_files(metrics: &CensusMetrics, files: Vec<(String, i64, i64)>) {
    metrics.file_bytes.reset();
    metrics.files.reset();
    for (tenant, count, bytes) in files {
        metrics.files.with_label_values(&[&tenant]).set(count);
        metrics.file_bytes.with_label_values(&[&tenant]).set(bytes);
    }
}

/// The consumer groups' lag, read off the census's path: a turn starts a
/// read (unless one is under way) and takes the latest one that is fresh. A
/// read asks the broker for each group's committed offsets and each
/// partition's watermarks, a round trip apiece, which a loaded machine can
/// stretch past any bound a turn could wait for; so the census never waits
/// for it, and a slow read still arrives, for the next turn.
#[derive(Clone, Default)]
struct Lags {
    latest: Arc<Mutex<Option<(Instant, serde_json::Value)>>>,
    reading: Arc<AtomicBool>,
}

impl Lags {
    /// Starts a read if none is under way; the latest read, if it is no
    /// older than `fresh`.
    fn latest(&self, source: &LagSource, fresh: Duration) -> Option<serde_json::Value> {
        if !self.reading.swap(true, Ordering::SeqCst) {
            let (latest, reading) = (self.latest.clone(), self.reading.clone());
            let read = source.read();
            tokio::task::spawn_blocking(move || {
                match read() {
                    Ok(lags) => *latest.lock().expect("lags") = Some((Instant::now(), lags)),
                    Err(e) => tracing::debug!(error = %e, "consumer lag not read for the census"),
                }
                reading.store(false, Ordering::SeqCst);
            });
        }
        let latest = self.latest.lock().expect("lags");
        (latest.as_ref())
            .filter(|(at, _)| at.elapsed() <= fresh)
            .map(|(_, lags)| lags.clone())
    }
}

/// The consumer groups whose lag the census reads, each on its topic, and
/// the brokers that know it.
struct LagSource {
    kafka: KafkaClient,
    groups: [(String, String); 3],
    /// How long each request may take: a census interval, up to 5 s (a read
    /// under way when the process stops holds its exit up for that long).
    timeout: Duration,
}

impl LagSource {
    fn of(settings: &Settings) -> Self {
        let groups = [
            (&settings.intake_group, &settings.topic_requests),
            (&settings.worker_group, &settings.topic_submitted),
            (&settings.bbox_worker_group, &settings.topic_post_processing),
        ]
        .map(|(group, topic)| (settings.group(group), settings.topic(topic)));
        LagSource {
            kafka: settings.kafka(),
            groups,
            timeout: settings.census_interval_s.get().min(Duration::from_secs(5)),
        }
    }

    /// A read of each group's lag (blocking), to run off the runtime.
    fn read(&self) -> impl FnOnce() -> Result<serde_json::Value, rdkafka::error::KafkaError> {
        let (kafka, groups, timeout) = (self.kafka.clone(), self.groups.clone(), self.timeout);
        move || {
            let mut lags = Vec::new();
            for (group, topic) in groups {
                let lag = crate::kafka::groups::lag(&kafka, &group, &topic, timeout)?;
                lags.push(serde_json::json!({"group": group, "topic": topic, "lag": lag}));
            }
            Ok(lags.into())
        }
    }
}
