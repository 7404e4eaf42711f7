//! The queue census: how many jobs wait and run, how old the oldest is, and
//! how many orphans are open, for the dashboards. One process per interval
//! takes it ([`take_turn`]), so its cost is one set of indexed counts per
//! deployment, however many processes run.
//!
//! Only the open states are counted (queued and running; bbox pending and
//! running). Each has a partial index, so the counts walk the open jobs and
//! never the finished ones, which grow without end; how many jobs finish is
//! `docstream_transitions_total`'s to say.
//!
//! Each turn also keeps a sample per tenant and one for the deployment
//! ([`record_samples`]) for an hour: the console's overview draws them
//! ([`samples`]), next to the tenant's open jobs counted as it asks
//! ([`count_tenant`]).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::StoreError;

/// The open jobs, counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, sqlx::FromRow, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Census {
    /// Queued jobs (due now, or waiting for a retry's backoff).
    pub queued: i64,
    /// Running jobs.
    pub running: i64,
    /// Succeeded jobs whose bbox refinement is pending.
    pub bbox_pending: i64,
    /// Bbox refinements running.
    pub bbox_running: i64,
    /// Seconds the oldest due queued job has waited since it became due
    /// (submitted, or its retry's backoff ended); 0 when none is due.
    pub oldest_queued_s: f64,
    /// Seconds the oldest running job has run; 0 when none runs.
    pub oldest_running_s: f64,
    /// Seconds the oldest pending bbox refinement has waited; 0 when none.
    pub oldest_bbox_pending_s: f64,
    /// Seconds the oldest running bbox refinement has run; 0 when none.
    pub oldest_bbox_running_s: f64,
}

const TAKE_TURN: &str = "UPDATE census_turn SET taken_at = now()
 WHERE taken_at < now() - make_interval(secs => $1)
RETURNING true";

/// `bbox_open!` as the head of a `WHERE` clause's conditions.
const BBOX_OPEN: &str = concat!(bbox_open!(), " AND ");

/// The census's counts, of every job (`scope` empty) or of those `scope`
/// names (`"tenant_id = $1 AND "`).
fn count_statement(scope: &str) -> String {
    format!(
        "SELECT
  (SELECT count(*) FROM extractions WHERE {scope}status = 'queued') AS queued,
  (SELECT count(*) FROM extractions WHERE {scope}status = 'running') AS running,
  (SELECT count(*) FROM extractions WHERE {scope}{BBOX_OPEN}bbox_status = 'pending') AS bbox_pending,
  (SELECT count(*) FROM extractions WHERE {scope}{BBOX_OPEN}bbox_status = 'running') AS bbox_running,
  (SELECT COALESCE(extract(epoch FROM now() - min(COALESCE(next_attempt_at, submitted_at))), 0)
     FROM extractions
    WHERE {scope}status = 'queued' AND COALESCE(next_attempt_at, submitted_at) <= now())::float8
    AS oldest_queued_s,
  (SELECT COALESCE(extract(epoch FROM now() - min(started_at)), 0)
     FROM extractions WHERE {scope}status = 'running')::float8 AS oldest_running_s,
  (SELECT COALESCE(extract(epoch FROM now() - min(COALESCE(bbox_requested_at, finished_at))), 0)
     FROM extractions WHERE {scope}{BBOX_OPEN}bbox_status = 'pending')::float8 AS oldest_bbox_pending_s,
  (SELECT COALESCE(extract(epoch FROM now() - min(bbox_started_at)), 0)
     FROM extractions WHERE {scope}{BBOX_OPEN}bbox_status = 'running')::float8 AS oldest_bbox_running_s"
    )
}

static COUNT: LazyLock<String> = LazyLock::new(|| count_statement(""));
static COUNT_TENANT: LazyLock<String> = LazyLock::new(|| count_statement("tenant_id = $1 AND "));

/// Takes this interval's census turn: true when no process took one in the
/// last `interval_s` seconds (the caller now takes the census), false when
/// another did.
pub async fn take_turn<'e>(
    executor: impl PgExecutor<'e>,
    interval_s: f64,
) -> Result<bool, StoreError> {
    // A little under the interval, so the process whose turn it was keeps it
    // despite its timer's jitter instead of the turn wandering.
    let taken: Option<bool> = sqlx::query_scalar(TAKE_TURN)
        .bind(interval_s * 0.9)
        .fetch_optional(executor)
        .await?;
    Ok(taken.is_some())
}

/// Counts the open jobs.
pub async fn count<'e>(executor: impl PgExecutor<'e>) -> Result<Census, StoreError> {
    Ok(sqlx::query_as::<_, Census>(COUNT.as_str())
        .fetch_one(executor)
        .await?)
}

/// How many tenants the census names in its count of queued jobs; the rest
/// are counted together (a metric label per tenant would grow without end).
pub const QUEUED_TENANTS: i64 = 20;

/// The label of the tenants counted together (no tenant's name: names
/// start with a letter or a digit).
pub const OTHER_TENANTS: &str = "(others)";

/// Queued jobs of one tenant (or of [`OTHER_TENANTS`]) and one priority.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Queued {
    /// The tenant's name, or [`OTHER_TENANTS`].
    pub tenant: String,
    /// `high`, `normal` or `low`.
    pub priority: String,
    /// Queued jobs.
    pub jobs: i64,
}

/// Queued jobs by tenant and priority, for the [`QUEUED_TENANTS`] tenants
/// with the most, the rest together: the waiting work a tenant has, beside
/// what each worker holds (`docstream_consumer_waiting_records`).
pub async fn queued_by_tenant<'e>(
    executor: impl PgExecutor<'e>,
) -> Result<Vec<Queued>, StoreError> {
    Ok(sqlx::query_as(
        "WITH q AS (
           SELECT tenant_id, priority, count(*) AS jobs
             FROM extractions WHERE status = 'queued' GROUP BY tenant_id, priority
         ), ranked AS (
           SELECT tenant_id, row_number() OVER (ORDER BY sum(jobs) DESC, tenant_id) AS rank
             FROM q GROUP BY tenant_id
         )
         SELECT CASE WHEN r.rank <= $1 THEN t.name ELSE $2 END AS tenant,
                q.priority, sum(q.jobs)::int8 AS jobs
           FROM q JOIN ranked r USING (tenant_id) JOIN tenants t ON t.id = q.tenant_id
          GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(QUEUED_TENANTS)
    .bind(OTHER_TENANTS)
    .fetch_all(executor)
    .await?)
}

/// One census turn's sample of a tenant's queue, or the deployment's.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Sample {
    /// When the census took it.
    pub taken_at: DateTime<Utc>,
    /// Queued jobs.
    pub queued: i64,
    /// Running jobs.
    pub running: i64,
    /// Succeeded jobs whose bbox refinement is pending.
    pub bbox_pending: i64,
    /// Bbox refinements running.
    pub bbox_running: i64,
    /// Seconds the oldest due queued job had waited (0: none waits).
    pub oldest_queued_s: f64,
    /// Jobs submitted since the previous sample.
    pub submitted: i64,
    /// Jobs that finished (succeeded, failed or cancelled) since the
    /// previous sample, net of failed jobs retried since.
    pub finished: i64,
}

/// Writes this turn's samples: one per tenant with jobs open or submitted
/// since the previous turn (or open at it), one for the deployment with
/// `orphans` (open orphans by class) and `lag` (the consumer groups'), and drops samples past the hour. The
/// jobs submitted since the previous turn are counted over the primary key
/// from the previous turn's time (ids are UUIDv7), so a turn reads the
/// open jobs and the last interval's submits, never the history.
pub async fn record_samples<'e>(
    executor: impl PgExecutor<'e>,
    interval_s: f64,
    orphans: &serde_json::Value,
    lag: Option<&serde_json::Value>,
) -> Result<(), StoreError> {
    sqlx::query(RECORD_SAMPLES)
        .bind(interval_s)
        .bind(orphans)
        .bind(lag)
        .execute(executor)
        .await?;
    Ok(())
}

const RECORD_SAMPLES: &str = concat!(
    "WITH prev AS (
  SELECT max(taken_at) AS at FROM census_samples
   WHERE tenant_id IS NULL AND taken_at > now() - make_interval(secs => 4 * $1)
), open AS (
  SELECT tenant_id,
         count(*) FILTER (WHERE status = 'queued') AS queued,
         count(*) FILTER (WHERE status = 'running') AS running,
         COALESCE(extract(epoch FROM now() - min(COALESCE(next_attempt_at, submitted_at))
           FILTER (WHERE status = 'queued' AND COALESCE(next_attempt_at, submitted_at) <= now())),
           0)::float8 AS oldest_queued_s
    FROM extractions WHERE status IN ('queued', 'running') GROUP BY tenant_id
), bbox AS (
  SELECT tenant_id,
         count(*) FILTER (WHERE bbox_status = 'pending') AS bbox_pending,
         count(*) FILTER (WHERE bbox_status = 'running') AS bbox_running
    FROM extractions
   WHERE ",
    bbox_open!(),
    " AND bbox_status IN ('pending', 'running')
   GROUP BY tenant_id
), recent AS (
  SELECT tenant_id, count(*) AS submitted FROM extractions
   WHERE id >= uuid_floor(COALESCE((SELECT at FROM prev), now() - make_interval(secs => $1)))
     AND id < uuid_floor(now())
   GROUP BY tenant_id
), last AS (
  SELECT tenant_id, queued + running AS open FROM census_samples
   WHERE taken_at = (SELECT at FROM prev) AND tenant_id IS NOT NULL
), tenant AS (
  SELECT t.tenant_id,
         COALESCE(o.queued, 0) AS queued, COALESCE(o.running, 0) AS running,
         COALESCE(b.bbox_pending, 0) AS bbox_pending, COALESCE(b.bbox_running, 0) AS bbox_running,
         COALESCE(o.oldest_queued_s, 0) AS oldest_queued_s,
         COALESCE(r.submitted, 0) AS submitted,
         greatest(COALESCE(r.submitted, 0)
                  - (COALESCE(o.queued + o.running, 0) - COALESCE(l.open, 0)), 0) AS finished
    FROM (SELECT tenant_id FROM open UNION SELECT tenant_id FROM bbox
          UNION SELECT tenant_id FROM recent UNION SELECT tenant_id FROM last) t
    LEFT JOIN open o USING (tenant_id) LEFT JOIN bbox b USING (tenant_id)
    LEFT JOIN recent r USING (tenant_id) LEFT JOIN last l USING (tenant_id)
), dropped AS (
  -- Kept for the overview's hour, and a little more.
  DELETE FROM census_samples WHERE taken_at < now() - interval '65 minutes'
)
INSERT INTO census_samples (taken_at, tenant_id, queued, running, bbox_pending, bbox_running,
                            oldest_queued_s, submitted, finished, orphans, lag)
SELECT now(), tenant_id, queued, running, bbox_pending, bbox_running,
       oldest_queued_s, submitted, finished, NULL, NULL
  FROM tenant
UNION ALL
SELECT now(), NULL, COALESCE(sum(queued), 0), COALESCE(sum(running), 0),
       COALESCE(sum(bbox_pending), 0), COALESCE(sum(bbox_running), 0),
       COALESCE(max(oldest_queued_s), 0), COALESCE(sum(submitted), 0),
       COALESCE(sum(finished), 0), $2, $3
  FROM tenant"
);

/// The last hour's samples of tenant `tenant_id` (the deployment's with
/// `None`), oldest first: one per census turn, zeros where the tenant had no
/// row (nothing open, nothing submitted).
pub async fn samples<'e>(
    executor: impl PgExecutor<'e>,
    tenant_id: Option<Uuid>,
) -> Result<Vec<Sample>, StoreError> {
    Ok(sqlx::query_as::<_, Sample>(SAMPLES)
        .bind(tenant_id)
        .fetch_all(executor)
        .await?)
}

const SAMPLES: &str = "SELECT d.taken_at,
       COALESCE(s.queued, 0) AS queued, COALESCE(s.running, 0) AS running,
       COALESCE(s.bbox_pending, 0) AS bbox_pending, COALESCE(s.bbox_running, 0) AS bbox_running,
       COALESCE(s.oldest_queued_s, 0) AS oldest_queued_s,
       COALESCE(s.submitted, 0) AS submitted, COALESCE(s.finished, 0) AS finished
  FROM census_samples d
  LEFT JOIN census_samples s ON s.taken_at = d.taken_at AND s.tenant_id IS NOT DISTINCT FROM $1
 WHERE d.tenant_id IS NULL AND d.taken_at > now() - interval '1 hour'
 ORDER BY d.taken_at";

/// The open orphans by class (class number → count) and the consumer
/// groups' lag of the deployment's latest sample in the last hour.
pub async fn latest_orphans_and_lag<'e>(
    executor: impl PgExecutor<'e>,
) -> Result<(Option<serde_json::Value>, Option<serde_json::Value>), StoreError> {
    let latest: Option<(Option<serde_json::Value>, Option<serde_json::Value>)> = sqlx::query_as(
        "SELECT orphans, lag FROM census_samples
          WHERE tenant_id IS NULL AND taken_at > now() - interval '1 hour'
          ORDER BY taken_at DESC LIMIT 1",
    )
    .fetch_optional(executor)
    .await?;
    Ok(latest.unwrap_or_default())
}

/// Tenant `tenant_id`'s open jobs, counted now (the partial indexes of the
/// open states keep this to the tenant's open jobs).
pub async fn count_tenant<'e>(
    executor: impl PgExecutor<'e>,
    tenant_id: Uuid,
) -> Result<Census, StoreError> {
    Ok(sqlx::query_as::<_, Census>(COUNT_TENANT.as_str())
        .bind(tenant_id)
        .fetch_one(executor)
        .await?)
}
