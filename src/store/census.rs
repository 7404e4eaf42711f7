//! The queue census: how many jobs wait and run, how old the oldest is, and
//! how many orphans are open, for the dashboards. One process per interval
//! takes it ([`take_turn`]), so its cost is one set of indexed counts per
//! deployment, however many processes run.
//!
//! Only the open states are counted (queued and running; bbox pending and
//! running). Each has a partial index, so the counts walk the open jobs and
//! never the finished ones, which grow without end; how many jobs finish is
//! `docstream_transitions_total`'s to say.

use sqlx::PgExecutor;

use super::StoreError;

/// The open jobs, counted.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
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

const COUNT: &str = "SELECT
  (SELECT count(*) FROM extractions WHERE status = 'queued') AS queued,
  (SELECT count(*) FROM extractions WHERE status = 'running') AS running,
  (SELECT count(*) FROM extractions WHERE bbox_status = 'pending') AS bbox_pending,
  (SELECT count(*) FROM extractions WHERE bbox_status = 'running') AS bbox_running,
  (SELECT COALESCE(extract(epoch FROM now() - min(COALESCE(next_attempt_at, submitted_at))), 0)
     FROM extractions
    WHERE status = 'queued' AND COALESCE(next_attempt_at, submitted_at) <= now())::float8
    AS oldest_queued_s,
  (SELECT COALESCE(extract(epoch FROM now() - min(started_at)), 0)
     FROM extractions WHERE status = 'running')::float8 AS oldest_running_s,
  (SELECT COALESCE(extract(epoch FROM now() - min(COALESCE(bbox_requested_at, finished_at))), 0)
     FROM extractions WHERE bbox_status = 'pending')::float8 AS oldest_bbox_pending_s,
  (SELECT COALESCE(extract(epoch FROM now() - min(bbox_started_at)), 0)
     FROM extractions WHERE bbox_status = 'running')::float8 AS oldest_bbox_running_s";

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
    Ok(sqlx::query_as::<_, Census>(COUNT)
        .fetch_one(executor)
        .await?)
}
