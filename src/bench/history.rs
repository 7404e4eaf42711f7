//! The `history` phase: what a tenant's finished jobs cost once there are
//! many of them. On a scratch database filled with generated history (ids,
//! times and states as the pipeline leaves them: a request, a result for a
//! success, three transitions each), it times pages of the list at each
//! size asked for, then lets jobs pass through a short retention in rounds
//! (a round's jobs written, purged, vacuumed as autovacuum would) and
//! reports the purge's rate and the tables' sizes and dead rows after each
//! round: the sizes stay flat when the purge keeps up and the space is
//! reused.

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::Scratch;
use docstream::config::Settings;
use docstream::domain::ExtractionStatus;
use docstream::store;
use docstream::store::list::{self, JobFilter, Order, PageRequest};
use docstream::store::{retention, tenants};

/// Pages timed per kind of page.
const PAGES: usize = 25;

/// Jobs per purge statement, as the purge loop runs it.
const PURGE_BATCH: i64 = 500;

/// What the phase measured.
#[derive(Debug, Clone, Serialize)]
pub struct History {
    /// Page times at each size.
    pub lists: Vec<ListAtSize>,
    /// The retention rounds.
    pub churn: Vec<ChurnRound>,
}

/// Page times on a history of `jobs` jobs.
#[derive(Debug, Clone, Serialize)]
pub struct ListAtSize {
    /// Jobs of the tenant.
    pub jobs: u64,
    /// Seconds to generate them (and analyze).
    pub generate_s: f64,
    /// Each kind of page: its name, median and 95th percentile, ms.
    pub pages: Vec<PageTime>,
    /// The job tables' total size (heap and indexes), MB.
    pub tables_mb: f64,
}

/// One kind of page, timed.
#[derive(Debug, Clone, Serialize)]
pub struct PageTime {
    /// What the page asks for.
    pub page: String,
    /// Median, ms.
    pub p50_ms: f64,
    /// 95th percentile, ms.
    pub p95_ms: f64,
}

/// One round of jobs through a short retention.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnRound {
    /// Rounds so far.
    pub round: usize,
    /// Jobs purged this round.
    pub purged: u64,
    /// Purged jobs per second (each job is its rows in four tables).
    pub purged_per_s: f64,
    /// Dead rows of the job tables right after the purge.
    pub dead_after_purge: i64,
    /// The same after the vacuum.
    pub dead_after_vacuum: i64,
    /// The job tables' total size after the vacuum, MB.
    pub tables_mb: f64,
}

/// The tables a job's rows live in.
const TABLES: [&str; 4] = [
    "extractions",
    "extraction_requests",
    "extraction_results",
    "extraction_transitions",
];

/// Times the list at each of `sizes` (a fresh history each), then runs
/// `rounds` rounds of `round_jobs` jobs through a one-day retention.
pub async fn run(
    settings: &Settings,
    stamp: u64,
    sizes: &[u64],
    (rounds, round_jobs): (usize, u64),
) -> anyhow::Result<History> {
    let scratch = async |name: &str| -> anyhow::Result<(Scratch, PgPool)> {
        let scratch = Scratch::create(settings, &format!("docstream_bench_{name}_{stamp}")).await?;
        // One connection: the purge's dead rows are counted by the backend
        // that made them, which `dead_rows` asks to report them.
        let pool = store::connect(&scratch.url, 1).await?;
        Ok((scratch, pool))
    };
    let mut history = History {
        lists: Vec::new(),
        churn: Vec::new(),
    };
    for &jobs in sizes {
        let (scratch, pool) = scratch(&format!("list_{jobs}")).await?;
        let tenant = tenants::create_tenant(&pool, "history")
            .await?
            .key
            .tenant_id;
        let started = Instant::now();
        generate(&pool, tenant, jobs, 0).await?;
        let generate_s = started.elapsed().as_secs_f64();
        let pages = time_pages(&pool, tenant).await?;
        let tables_mb = tables_mb(&pool).await?;
        history.lists.push(ListAtSize {
            jobs,
            generate_s,
            pages,
            tables_mb,
        });
        pool.close().await;
        scratch.drop_database().await?;
    }
    if rounds > 0 {
        let (scratch, pool) = scratch("churn").await?;
        let tenant = tenants::create_tenant(&pool, "history")
            .await?
            .key
            .tenant_id;
        tenants::set_retention(&pool, "history", Some(1)).await?;
        for round in 1..=rounds {
            // Each round's jobs are older than the retention: all of them go.
            generate(&pool, tenant, round_jobs, round as u64 * round_jobs).await?;
            let started = Instant::now();
            let mut purged = 0;
            loop {
                let default = Duration::from_secs(30 * 86_400);
                let n = retention::purge_expired(&pool, default, PURGE_BATCH).await?;
                purged += n;
                if n < PURGE_BATCH as u64 {
                    break;
                }
            }
            let took = started.elapsed().as_secs_f64();
            let dead_after_purge = dead_rows(&pool).await?;
            for table in TABLES {
                sqlx::query(AssertSqlSafe(format!("VACUUM {table}")))
                    .execute(&pool)
                    .await?;
            }
            history.churn.push(ChurnRound {
                round,
                purged,
                purged_per_s: purged as f64 / took,
                dead_after_purge,
                dead_after_vacuum: dead_rows(&pool).await?,
                tables_mb: tables_mb(&pool).await?,
            });
        }
        pool.close().await;
        scratch.drop_database().await?;
    }
    Ok(history)
}

/// Writes `jobs` finished jobs of `tenant` (numbered from `first`), spread
/// over the 90 days before a week ago: 80% succeeded, 15% failed, 5%
/// cancelled, each with its request, a success's result and three
/// transitions; then analyzes.
async fn generate(pool: &PgPool, tenant: Uuid, jobs: u64, first: u64) -> anyhow::Result<()> {
    let statements = [
        // A UUIDv7 of the job's submit time, then bits of its number.
        "CREATE TEMP TABLE gen AS
         SELECT i,
                (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
                 || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid AS id,
                at,
                CASE WHEN i % 20 < 16 THEN 'succeeded' WHEN i % 20 < 19 THEN 'failed' ELSE 'cancelled' END AS status
           FROM (SELECT i, now() - interval '7 days' - make_interval(secs => (($2 - i) % $3) * (7776000.0 / $3)) AS at
                   FROM generate_series($1, $1 + $3 - 1) AS i) g",
        "INSERT INTO extractions (id, tenant_id, status, attempts, submitted_at, started_at, finished_at,
                                  error, bbox_status, bbox_attempts)
         SELECT id, $1, status, 1, at, at + interval '1 second', at + interval '2 seconds',
                CASE WHEN status = 'failed' THEN 'extractor \"model\" refused the document: page ' || (i % 7) END,
                CASE WHEN status = 'succeeded' THEN 'succeeded' END,
                CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END
           FROM gen",
        "INSERT INTO extraction_requests (id, tenant_id, request)
         SELECT id, $1, json_build_object('document', json_build_object('text', 'Invoice ' || i || ' total 12.50'),
                                      'fields', json_build_array(json_build_object('name', 'total', 'anchor', 'total')),
                                      'metadata', json_build_object('customer', 'c' || (i % 100), 'batch', i / 1000))
           FROM gen",
        "INSERT INTO extraction_results (id, stage, result)
         SELECT id, 'extraction', json_build_object('total', json_build_object('value', '12.50', 'words', json_build_array(3, 3)))
           FROM gen WHERE status = 'succeeded'",
        "INSERT INTO extraction_transitions (extraction_id, transition, token, at)
         SELECT id, t.transition::extraction_transition, t.token, at
           FROM gen CROSS JOIN LATERAL (VALUES ('submit', NULL::int), ('mark_running', 1),
                (CASE status WHEN 'succeeded' THEN 'mark_succeeded' WHEN 'failed' THEN 'mark_failed'
                             ELSE 'mark_cancelled' END, 1)) AS t(transition, token)",
        "DROP TABLE gen",
    ];
    let mut tx = pool.begin().await?;
    let n = i64::try_from(jobs)?;
    let start = i64::try_from(first)?;
    for (i, statement) in statements.into_iter().enumerate() {
        let mut query = sqlx::query(statement);
        if i == 0 {
            query = query.bind(start).bind(start + n).bind(n);
        } else if i == 1 || i == 2 {
            query = query.bind(tenant);
        }
        query.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(())
}

/// The median and 95th percentile of [`PAGES`] pages of each kind.
async fn time_pages(pool: &PgPool, tenant: Uuid) -> anyhow::Result<Vec<PageTime>> {
    let mut connection = pool.acquire().await?;
    // A cursor halfway down the history.
    let middle: Uuid = sqlx::query_scalar(
        "SELECT id FROM extractions WHERE tenant_id = $1 ORDER BY id
         OFFSET (SELECT count(*) / 2 FROM extractions WHERE tenant_id = $1) LIMIT 1",
    )
    .bind(tenant)
    .fetch_one(&mut *connection)
    .await?;
    let failed = JobFilter {
        statuses: vec![ExtractionStatus::Failed],
        ..JobFilter::default()
    };
    let customer = JobFilter {
        metadata: vec![("customer".into(), "c7".into())],
        ..JobFilter::default()
    };
    let kinds: [(&str, JobFilter, Option<Uuid>); 5] = [
        ("first page, no filter", JobFilter::default(), None),
        ("a page halfway down", JobFilter::default(), Some(middle)),
        ("status=failed, first page", failed.clone(), None),
        ("status=failed, halfway down", failed, Some(middle)),
        ("metadata.customer (scans)", customer, None),
    ];
    let mut times = Vec::new();
    for (name, filter, after) in kinds {
        let page = PageRequest {
            after,
            limit: 50,
            order: Order::NewestFirst,
            with_results: false,
        };
        let mut took = Vec::with_capacity(PAGES);
        for _ in 0..PAGES {
            let started = Instant::now();
            list::list(&mut connection, tenant, &filter, page).await?;
            took.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        took.sort_by(f64::total_cmp);
        times.push(PageTime {
            page: name.to_owned(),
            p50_ms: took[PAGES / 2],
            p95_ms: took[PAGES * 95 / 100],
        });
    }
    Ok(times)
}

/// The job tables' total size (heap, TOAST and indexes), MB.
async fn tables_mb(pool: &PgPool) -> anyhow::Result<f64> {
    let bytes: i64 = sqlx::query_scalar(
        "SELECT sum(pg_total_relation_size(c))::bigint FROM unnest($1::regclass[]) AS c",
    )
    .bind(TABLES.to_vec())
    .fetch_one(pool)
    .await?;
    Ok(bytes as f64 / 1e6)
}

/// The job tables' dead rows, as the statistics collector counts them.
async fn dead_rows(pool: &PgPool) -> anyhow::Result<i64> {
    // A backend reports its counts when it goes idle, at most once a
    // second: ask this one (the pool's only one, which made the rows) to
    // report at once, and read past the snapshot of the last read.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await?;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await?;
    let dead: Option<i64> = sqlx::query_scalar(
        "SELECT sum(n_dead_tup)::bigint FROM pg_stat_user_tables WHERE relname = ANY($1)",
    )
    .bind(TABLES.to_vec())
    .fetch_one(pool)
    .await?;
    Ok(dead.unwrap_or(0))
}
