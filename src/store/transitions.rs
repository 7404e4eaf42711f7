//! One function per transition of the state machine (the manual, "How it works").
//! Each runs ONE statement: a conditional `UPDATE … WHERE id = $1 AND
//! <legal predecessors> RETURNING *`, wrapped in a data-modifying CTE that logs the
//! win in `extraction_transitions`. A caller that loses the race gets `Ok(None)`
//! and the row is untouched.
//!
//! The transitions on the hot path (claims, successes, the bbox request) also
//! come in a `_many` form: the same single statement over an array of ids (or of
//! id, token, result), so concurrent callers can share one statement and one
//! commit (`store::coalesce`). Every row is still judged by the same `WHERE`, so
//! each request in a batch wins or loses exactly as it would alone; the
//! single-row functions are the batch of one.
//!
//! Completing transitions take the fencing token their claim returned, so a holder
//! whose lease expired and whose job was claimed again cannot complete it.

use std::collections::HashMap;
use std::hash::Hash;

use sqlx::PgExecutor;
use uuid::Uuid;

use super::{Claim, Extraction, StoreError};
use crate::domain::{Stage, Transition};

/// Builds the statement: the update (`moved`), the log row of the transition it
/// won, and the final `SELECT` of the job row (its `extractions` columns only,
/// unless a join is named).
macro_rules! logged {
    ($transition:literal, token = $token:expr, $update:literal) => {
        logged!($transition, token = $token, select = "SELECT moved.* FROM moved", $update)
    };
    // The claims also return what the work needs: the request and, for the
    // bbox refinement, the extraction's result.
    ($transition:literal, token = $token:expr, with_request, $update:literal) => {
        logged!(
            $transition,
            token = $token,
            select = "SELECT moved.*, q.request FROM moved JOIN extraction_requests q ON q.id = moved.id",
            $update
        )
    };
    ($transition:literal, token = $token:expr, with_request_and_result, $update:literal) => {
        logged!(
            $transition,
            token = $token,
            select = "SELECT moved.*, q.request, r.result FROM moved
                        JOIN extraction_requests q ON q.id = moved.id
                        LEFT JOIN extraction_results r ON r.id = moved.id AND r.stage = 'extraction'",
            $update
        )
    };
    // A terminal transition: the same statement also writes the webhook
    // delivery that announces it (see `webhook_tail!`).
    ($transition:literal, token = $token:expr, webhook = $event:literal, bbox = $bbox:literal, $update:literal) => {
        logged!(
            $transition,
            token = $token,
            select = webhook_tail!($event, $bbox),
            $update
        )
    };
    ($transition:literal, token = $token:expr, select = $select:expr, $update:literal) => {
        concat!(
            "WITH moved AS (",
            $update,
            " RETURNING extractions.*), logged AS (INSERT INTO extraction_transitions ",
            "(extraction_id, transition, token) SELECT id, '",
            $transition,
            "', ",
            $token,
            " FROM moved) ",
            $select
        )
    };
}

/// The tail of a terminal transition's statement, after its `moved` and
/// `logged` parts: it writes the webhook delivery that announces the change
/// when the request named a `webhook_url` (the outbox: a crash after the state
/// change cannot lose the webhook), and returns the job row with the
/// delivery's id as `webhook_id`. `$bbox` is the grounded boxes the payload
/// carries.
macro_rules! webhook_tail {
    ($event:literal, $bbox:literal) => {
        concat!(
            ", hooked AS (INSERT INTO webhook_deliveries (id, extraction_id, event_type, url, payload) ",
            "SELECT 'msg_' || replace(m.id::text, '-', '') || '_", $event, "', m.id, ",
            "'extraction.", $event, "', q.request->>'webhook_url', ",
            "jsonb_build_object('type', 'extraction.", $event, "', 'timestamp', now(), ",
            "'data', jsonb_build_object('id', m.id, 'status', m.status, 'bbox_status', m.bbox_status, ",
            "'result', r.result, 'bbox', ", $bbox, ", 'error', COALESCE(m.error, m.bbox_error), ",
            "'metadata', q.request->'metadata')) ",
            "FROM moved m JOIN extraction_requests q ON q.id = m.id ",
            "LEFT JOIN extraction_results r ON r.id = m.id AND r.stage = 'extraction' ",
            "WHERE m.webhook AND q.request->>'webhook_url' IS NOT NULL ",
            "ON CONFLICT (id) DO NOTHING RETURNING id, extraction_id) ",
            "SELECT moved.*, (SELECT h.id FROM hooked h WHERE h.extraction_id = moved.id) AS webhook_id FROM moved"
        )
    };
}

/// The part of a completion's statement, after its `moved` part, that writes
/// the result of each claim it won to the stage's result row: the results
/// come as `$3` (JSON text), beside `$1` ids and `$2` tokens, and `$token`
/// names the claim's token column.
macro_rules! store_result {
    ($stage:literal, $token:literal) => {
        concat!(
            "stored AS (
    INSERT INTO extraction_results (id, stage, result)
    SELECT DISTINCT ON (m.id) m.id, '",
            $stage,
            "', done.result::json
      FROM moved m
      JOIN unnest($1::uuid[], $2::int[], $3::text[]) AS done(id, token, result)
        ON done.id = m.id AND done.token = m.",
            $token,
            "
    RETURNING id, result),"
        )
    };
}

/// SET expressions read the row as it was, so the recovery time is measured from
/// the expired lease (class 2) or from when a reaper judged the job orphaned.
pub(crate) const MARK_RUNNING: &str = logged!(
    "mark_running",
    token = "attempts",
    with_request,
    "UPDATE extractions
        SET status = 'running', attempts = attempts + 1, started_at = now(),
            lease_expires_at = now() + make_interval(secs => $2),
            next_attempt_at = NULL,
            last_recovery_s = CASE
                WHEN status = 'running' THEN extract(epoch FROM now() - lease_expires_at)::float8
                WHEN orphaned_at IS NOT NULL THEN extract(epoch FROM now() - orphaned_at)::float8
            END,
            orphaned_at = NULL
       FROM unnest($1::uuid[]) AS batch(id)
      WHERE extractions.id = batch.id
        AND (status = 'queued' OR (status = 'running' AND lease_expires_at < now()))"
);

/// Two transitions in one statement: the success, and the bbox request it
/// leads to (pending, requested now). Both are logged, in that order, and the
/// result is written to its own row.
pub(crate) const MARK_SUCCEEDED: &str = concat!(
    "WITH moved AS (
    UPDATE extractions
       SET status = 'succeeded', error = NULL, finished_at = now(), lease_expires_at = NULL,
           bbox_status = 'pending', bbox_attempts = 0, bbox_requested_at = now()
      FROM unnest($1::uuid[], $2::int[]) AS done(id, token)
     WHERE extractions.id = done.id AND status = 'running' AND attempts = done.token
 RETURNING extractions.*),
",
    store_result!("extraction", "attempts"),
    "
logged AS (
    INSERT INTO extraction_transitions (extraction_id, transition, token)
    SELECT m.id, t.transition, CASE WHEN t.step = 1 THEN m.attempts END
      FROM moved m
     CROSS JOIN (VALUES (1, 'mark_succeeded'::extraction_transition),
                        (2, 'start_bbox_refinement'::extraction_transition)) AS t(step, transition)
     ORDER BY m.id, t.step)
SELECT moved.* FROM moved"
);

const MARK_FAILED: &str = logged!(
    "mark_failed",
    token = "attempts",
    webhook = "failed",
    bbox = "NULL::jsonb",
    "UPDATE extractions
        SET status = 'failed', error = $3, finished_at = now(), lease_expires_at = NULL
      WHERE id = $1 AND status = 'running' AND attempts = $2"
);

const REQUEUE_FOR_RETRY: &str = logged!(
    "requeue_for_retry",
    token = "attempts",
    "UPDATE extractions
        SET status = 'queued', error = $3, lease_expires_at = NULL, published_at = NULL,
            next_attempt_at = now() + make_interval(secs => $4)
      WHERE id = $1 AND status = 'running' AND attempts = $2"
);

// A failed job back to the queue on request, with a fresh attempt budget:
// the token (attempts) keeps counting, the run's budget starts where it is.
const RETRY_FAILED: &str = logged!(
    "retry_failed",
    token = "NULL::int",
    "UPDATE extractions
        SET status = 'queued', attempts_base = attempts, finished_at = NULL,
            lease_expires_at = NULL, published_at = NULL, next_attempt_at = NULL,
            cancel_requested_at = NULL, republished_at = NULL, orphaned_at = NULL
       FROM unnest($1::uuid[]) AS batch(id)
      WHERE extractions.id = batch.id AND status = 'failed' AND erased_at IS NULL"
);

// A queued job is cancelled by anyone; a running one only by its holder ($2),
// after a cancel was requested (cooperative cancel). The log keeps the
// holder's token (none for a queued job).
const MARK_CANCELLED: &str = logged!(
    "mark_cancelled",
    token = "$2::int",
    webhook = "cancelled",
    bbox = "NULL::jsonb",
    "UPDATE extractions
        SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL
       FROM unnest($1::uuid[]) AS batch(id)
      WHERE extractions.id = batch.id
        AND (status = 'queued'
             OR (status = 'running' AND attempts = $2 AND cancel_requested_at IS NOT NULL))"
);

const REQUEST_CANCEL: &str = logged!(
    "request_cancel",
    token = "attempts",
    "UPDATE extractions
        SET cancel_requested_at = now()
       FROM unnest($1::uuid[]) AS batch(id)
      WHERE extractions.id = batch.id AND status = 'running' AND cancel_requested_at IS NULL"
);

// On its own only where a success's bbox request is made again (see
// `pipeline::complete`); a success makes it in the same statement.
const START_BBOX_REFINEMENT: &str = logged!(
    "start_bbox_refinement",
    token = "NULL::int",
    "UPDATE extractions
        SET bbox_requested_at = now()
       FROM unnest($1::uuid[]) AS batch(id)
      WHERE extractions.id = batch.id AND status = 'succeeded' AND bbox_status = 'pending'"
);

const MARK_BBOX_REFINEMENT_RUNNING: &str = logged!(
    "mark_bbox_refinement_running",
    token = "bbox_attempts",
    with_request_and_result,
    "UPDATE extractions
        SET bbox_status = 'running', bbox_started_at = now(), bbox_attempts = bbox_attempts + 1,
            bbox_lease_expires_at = now() + make_interval(secs => $2),
            bbox_last_recovery_s = CASE
                WHEN bbox_status = 'running' THEN extract(epoch FROM now() - bbox_lease_expires_at)::float8
                WHEN bbox_orphaned_at IS NOT NULL THEN extract(epoch FROM now() - bbox_orphaned_at)::float8
            END,
            bbox_orphaned_at = NULL
       FROM unnest($1::uuid[]) AS batch(id)
      WHERE extractions.id = batch.id AND status = 'succeeded'
        AND (bbox_status = 'pending'
             OR (bbox_status = 'running' AND bbox_lease_expires_at < now()))"
);

// The grounded boxes are written to their own row by the same statement, and
// the webhook's payload takes them from there (`stored`).
const MARK_BBOX_REFINEMENT_SUCCEEDED: &str = concat!(
    "WITH moved AS (
    UPDATE extractions
       SET bbox_status = 'succeeded', bbox_finished_at = now(), bbox_error = NULL,
           bbox_lease_expires_at = NULL
      FROM unnest($1::uuid[], $2::int[]) AS done(id, token)
     WHERE extractions.id = done.id AND status = 'succeeded'
       AND bbox_status = 'running' AND bbox_attempts = done.token
 RETURNING extractions.*),
",
    store_result!("bbox_refinement", "bbox_attempts"),
    "
logged AS (
    INSERT INTO extraction_transitions (extraction_id, transition, token)
    SELECT id, 'mark_bbox_refinement_succeeded', bbox_attempts FROM moved)",
    webhook_tail!(
        "succeeded",
        "(SELECT s.result FROM stored s WHERE s.id = m.id)"
    )
);

const MARK_BBOX_REFINEMENT_FAILED: &str = logged!(
    "mark_bbox_refinement_failed",
    token = "bbox_attempts",
    webhook = "succeeded",
    bbox = "NULL::jsonb",
    "UPDATE extractions
        SET bbox_status = 'failed', bbox_finished_at = now(), bbox_error = $3,
            bbox_lease_expires_at = NULL
      WHERE id = $1 AND status = 'succeeded' AND bbox_status = 'running' AND bbox_attempts = $2"
);

const REQUEUE_BBOX_REFINEMENT: &str = logged!(
    "requeue_bbox_refinement",
    token = "bbox_attempts",
    "UPDATE extractions
        SET bbox_status = 'pending', bbox_lease_expires_at = NULL
      WHERE id = $1 AND status = 'succeeded' AND bbox_status IN ('pending', 'running')"
);

/// The statements that differ between the stages; the rest of a stage's
/// transitions are its own (the extraction's retry and cancel).
struct Statements {
    /// Claims a pending stage, or one whose holder's lease ran out.
    claim: &'static str,
    /// Completes a claim with its result.
    succeed: &'static str,
    /// Ends a claim as failed for good.
    fail: &'static str,
}

fn statements(stage: Stage) -> Statements {
    match stage {
        Stage::Extraction => Statements {
            claim: MARK_RUNNING,
            succeed: MARK_SUCCEEDED,
            fail: MARK_FAILED,
        },
        Stage::BboxRefinement => Statements {
            claim: MARK_BBOX_REFINEMENT_RUNNING,
            succeed: MARK_BBOX_REFINEMENT_SUCCEEDED,
            fail: MARK_BBOX_REFINEMENT_FAILED,
        },
    }
}

/// The fencing token of `row`'s claim of `stage`.
fn token_of(stage: Stage, row: &Extraction) -> i32 {
    match stage {
        Stage::Extraction => row.attempts,
        Stage::BboxRefinement => row.bbox_attempts,
    }
}

/// Claims `stage` of job `id` for `lease_s` seconds: `mark_running` (a queued
/// job, or one whose holder's lease ran out) or `mark_bbox_refinement_running`.
pub async fn claim<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
    lease_s: f64,
) -> Result<Option<Claim>, StoreError> {
    let claimed = claim_many(executor, stage, &[id], lease_s).await?;
    Ok(claimed.into_iter().next().flatten())
}

/// [`claim`] for many jobs in one statement; one answer per id, in order.
pub async fn claim_many<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    ids: &[Uuid],
    lease_s: f64,
) -> Result<Vec<Option<Claim>>, StoreError> {
    let rows = sqlx::query_as::<_, Extraction>(statements(stage).claim)
        .bind(in_lock_order(ids))
        .bind(lease_s)
        .fetch_all(executor)
        .await?;
    let claims = rows.into_iter().map(|extraction| Claim {
        token: token_of(stage, &extraction),
        extraction,
    });
    Ok(align(ids.iter().copied(), claims, |c| c.extraction.id))
}

/// Completes claim `token` of `stage` with `result`. The extraction's success
/// also requests the bbox refinement (pending): two logged transitions, one
/// statement.
pub async fn succeed<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
    token: i32,
    result: &serde_json::Value,
) -> Result<Option<Extraction>, StoreError> {
    let result = result.clone();
    let done = [Completion { id, token, result }];
    let succeeded = succeed_many(executor, stage, &done).await?;
    Ok(succeeded.into_iter().next().flatten())
}

/// [`succeed`] for many claims in one statement; one answer per claim.
pub async fn succeed_many<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    done: &[Completion],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let rows = completing(executor, statements(stage).succeed, done).await?;
    Ok(align(done.iter().map(Completion::key), rows, |row| {
        (row.id, token_of(stage, row))
    }))
}

/// Ends claim `token` of `stage` as failed with `error`.
pub async fn fail<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
    token: i32,
    error: &str,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(statements(stage).fail)
        .bind(id)
        .bind(token)
        .bind(error)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// Gives the claim `token` back to the queue, keeping `error` as the reason; the
/// job is due again in `delay_s` seconds (database clock).
pub async fn requeue_for_retry<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    error: &str,
    delay_s: f64,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(REQUEUE_FOR_RETRY)
        .bind(id)
        .bind(token)
        .bind(error)
        .bind(delay_s)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// Sends failed job `id` back to the queue with a fresh attempt budget;
/// `None` when it is not failed.
pub async fn retry_failed<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    Ok(retry_failed_many(executor, &[id]).await?.pop().flatten())
}

/// [`retry_failed`] for many jobs in one statement; one answer per id, in order.
pub async fn retry_failed_many<'e>(
    executor: impl PgExecutor<'e>,
    ids: &[Uuid],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let query = sqlx::query_as(RETRY_FAILED).bind(in_lock_order(ids));
    Ok(align(
        ids.iter().copied(),
        query.fetch_all(executor).await?,
        |row: &Extraction| row.id,
    ))
}

/// The claims job `id` had before its last retry on request (0 if none).
pub async fn attempts_base<'e>(executor: impl PgExecutor<'e>, id: Uuid) -> Result<i32, StoreError> {
    let base: Option<i32> =
        sqlx::query_scalar("SELECT attempts_base FROM extractions WHERE id = $1")
            .bind(id)
            .fetch_optional(executor)
            .await?;
    Ok(base.unwrap_or(0))
}

/// Cancels a queued job (`holder: None`), or, as the holder of claim `token`, a
/// running job whose cancel was requested.
pub async fn mark_cancelled<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    holder: Option<i32>,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(MARK_CANCELLED)
        .bind([id].as_slice())
        .bind(holder)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// Cancels those of `ids` that are queued, in one statement; one answer per
/// id, in order.
pub async fn cancel_queued_many<'e>(
    executor: impl PgExecutor<'e>,
    ids: &[Uuid],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let query = sqlx::query_as(MARK_CANCELLED).bind(in_lock_order(ids));
    let rows = query.bind(None::<i32>).fetch_all(executor).await?;
    Ok(align(ids.iter().copied(), rows, |row: &Extraction| row.id))
}

/// Asks the holder of a running job to cancel it; it learns at its next heartbeat.
pub async fn request_cancel<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    Ok(request_cancel_many(executor, &[id]).await?.pop().flatten())
}

/// [`request_cancel`] for many jobs in one statement; one answer per id, in order.
pub async fn request_cancel_many<'e>(
    executor: impl PgExecutor<'e>,
    ids: &[Uuid],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let query = sqlx::query_as(REQUEST_CANCEL).bind(in_lock_order(ids));
    Ok(align(
        ids.iter().copied(),
        query.fetch_all(executor).await?,
        |row: &Extraction| row.id,
    ))
}

/// Stamps the pending bbox refinement as requested again, just before its
/// event is published once more.
pub async fn start_bbox_refinement<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    Ok(start_bbox_refinement_many(executor, &[id])
        .await?
        .pop()
        .flatten())
}

/// [`start_bbox_refinement`] for many jobs in one statement.
pub async fn start_bbox_refinement_many<'e>(
    executor: impl PgExecutor<'e>,
    ids: &[Uuid],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let rows = sqlx::query_as::<_, Extraction>(START_BBOX_REFINEMENT)
        .bind(in_lock_order(ids))
        .fetch_all(executor)
        .await?;
    Ok(align(ids.iter().copied(), rows, |row| row.id))
}

/// Puts a pending or running bbox refinement back to pending.
pub async fn requeue_bbox_refinement<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    by_id(executor, REQUEUE_BBOX_REFINEMENT, id).await
}

/// A claim completed with its result, for the batch completions.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The job.
    pub id: Uuid,
    /// The claim's fencing token.
    pub token: i32,
    /// What the work produced.
    pub result: serde_json::Value,
}

impl Completion {
    /// The claim: (job, token).
    pub fn key(&self) -> (Uuid, i32) {
        (self.id, self.token)
    }
}

/// Of `claims` (id, token), those whose `transition` the log holds: the job
/// rows as they are now, one answer per claim, in order. A completion whose
/// connection broke after the statement was sent cannot tell from its retry
/// (which loses, the row having moved on) whether its first try committed;
/// the log row, written by the same statement, tells.
pub async fn won_by(
    pool: &sqlx::PgPool,
    transition: Transition,
    claims: &[(Uuid, i32)],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let (ids, tokens): (Vec<Uuid>, Vec<i32>) = claims.iter().copied().unzip();
    let logged: Vec<(Uuid, i32)> = sqlx::query_as(
        "SELECT c.id, c.token FROM unnest($2::uuid[], $3::int[]) AS c(id, token)
          WHERE EXISTS (SELECT 1 FROM extraction_transitions t
                         WHERE t.extraction_id = c.id AND t.token = c.token
                           AND t.transition = $1::extraction_transition)",
    )
    .bind(transition.as_str())
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(pool)
    .await?;
    let won: Vec<Uuid> = logged.iter().map(|&(id, _)| id).collect();
    let rows = sqlx::query_as::<_, Extraction>("SELECT * FROM extractions WHERE id = ANY($1)")
        .bind(&won)
        .fetch_all(pool)
        .await?;
    let rows: HashMap<Uuid, Extraction> = rows.into_iter().map(|row| (row.id, row)).collect();
    let logged: std::collections::HashSet<(Uuid, i32)> = logged.into_iter().collect();
    let answer = |claim: &(Uuid, i32)| match logged.contains(claim) {
        true => rows.get(&claim.0).cloned(),
        false => None,
    };
    Ok(claims.iter().map(answer).collect())
}

/// Runs a completing statement over `done`, bound as three parallel arrays.
async fn completing<'e>(
    executor: impl PgExecutor<'e>,
    sql: &'static str,
    done: &[Completion],
) -> Result<Vec<Extraction>, StoreError> {
    let mut done: Vec<&Completion> = done.iter().collect();
    done.sort_by_key(|c| c.id);
    let ids: Vec<Uuid> = done.iter().map(|c| c.id).collect();
    let tokens: Vec<i32> = done.iter().map(|c| c.token).collect();
    let results: Vec<String> = done.iter().map(|c| c.result.to_string()).collect();
    let rows = sqlx::query_as::<_, Extraction>(sql)
        .bind(ids)
        .bind(tokens)
        .bind(results)
        .fetch_all(executor)
        .await?;
    Ok(rows)
}

/// `ids` sorted. Batch statements join their ids in array order, so they lock
/// rows in that order; with every batch sorted, two batches that share rows
/// (a stamp and a claim of the same jobs, say) queue behind each other instead
/// of deadlocking.
pub(crate) fn in_lock_order(ids: &[Uuid]) -> Vec<Uuid> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted
}

/// Matches the rows a batch statement returned to its requests, in request
/// order: a request whose row the statement did not move, or a repeat of a
/// request earlier in the same batch, gets `None` (it lost, as a single-row
/// statement would have).
fn align<K: Eq + Hash, T>(
    requests: impl IntoIterator<Item = K>,
    won: impl IntoIterator<Item = T>,
    key_of: impl Fn(&T) -> K,
) -> Vec<Option<T>> {
    let mut won: HashMap<K, T> = won.into_iter().map(|row| (key_of(&row), row)).collect();
    requests.into_iter().map(|key| won.remove(&key)).collect()
}

async fn by_id<'e>(
    executor: impl PgExecutor<'e>,
    sql: &'static str,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(sql)
        .bind(id)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// One transition a job went through, as its log has it.
#[derive(serde::Serialize, schemars::JsonSchema, sqlx::FromRow)]
#[schemars(rename = "TransitionLogEntry", deny_unknown_fields)]
pub struct Logged {
    /// The transition's name (`mark_running`, `mark_succeeded`, …).
    transition: String,
    /// The fencing token (attempt) it ran under, if any.
    token: Option<i32>,
    /// When its transaction ran.
    at: chrono::DateTime<chrono::Utc>,
}

/// Job `id`'s transition log, oldest first: who claimed it and when, each
/// attempt and how it ended. At most 1,000 entries.
pub async fn log_of(db: impl PgExecutor<'_>, id: Uuid) -> Result<Vec<Logged>, StoreError> {
    let log = sqlx::query_as::<_, Logged>(
        "SELECT transition::text AS transition, token, at FROM extraction_transitions
          WHERE extraction_id = $1 ORDER BY at, transition LIMIT 1000",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    Ok(log)
}
