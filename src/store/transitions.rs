//! One function per transition of the state machine (DESIGN.md, "The job state
//! machine"). Each runs ONE statement: a conditional `UPDATE … WHERE id = $1 AND
//! <legal predecessors> RETURNING *`, wrapped in a data-modifying CTE that logs the
//! win in `extraction_transitions`. A caller that loses the race gets `Ok(None)`
//! and the row is untouched.
//!
//! Completing transitions take the fencing token their claim returned, so a holder
//! whose lease expired and whose job was claimed again cannot complete it.

use sqlx::PgExecutor;
use uuid::Uuid;

use super::{Claim, Extraction, StoreError};

/// Builds the statement: the update, then the log row for the transition it won.
macro_rules! logged {
    ($transition:literal, token = $token:expr, $update:literal) => {
        concat!(
            "WITH moved AS (",
            $update,
            " RETURNING *), logged AS (INSERT INTO extraction_transitions ",
            "(extraction_id, transition, token) SELECT id, '",
            $transition,
            "', ",
            $token,
            " FROM moved) SELECT * FROM moved"
        )
    };
}

/// The bbox claim's token, read from the updated row.
macro_rules! bbox_token {
    () => {
        "(post_processing->'bbox_refinement'->>'attempts')::int"
    };
}

// SET expressions read the row as it was, so the recovery time is measured from
// the expired lease (class 2) or from when a reaper judged the job orphaned.
const MARK_RUNNING: &str = logged!(
    "mark_running",
    token = "attempts",
    "UPDATE extractions
        SET status = 'running', attempts = attempts + 1, started_at = now(),
            lease_expires_at = now() + make_interval(secs => $2),
            next_attempt_at = NULL,
            last_recovery_s = CASE
                WHEN status = 'running' THEN extract(epoch FROM now() - lease_expires_at)::float8
                WHEN orphaned_at IS NOT NULL THEN extract(epoch FROM now() - orphaned_at)::float8
            END,
            orphaned_at = NULL
      WHERE id = $1
        AND (status = 'queued' OR (status = 'running' AND lease_expires_at < now()))"
);

const MARK_SUCCEEDED: &str = logged!(
    "mark_succeeded",
    token = "attempts",
    "UPDATE extractions
        SET status = 'succeeded', result = $3, error = NULL, finished_at = now(),
            lease_expires_at = NULL,
            post_processing = jsonb_set(post_processing, '{bbox_refinement}',
                                        jsonb_build_object('status', 'pending', 'attempts', 0))
      WHERE id = $1 AND status = 'running' AND attempts = $2"
);

const MARK_FAILED: &str = logged!(
    "mark_failed",
    token = "attempts",
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

// A queued job is cancelled by anyone; a running one only by its holder ($2),
// after a cancel was requested (cooperative cancel).
const MARK_CANCELLED: &str = logged!(
    "mark_cancelled",
    token = "NULL::int",
    "UPDATE extractions
        SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL
      WHERE id = $1
        AND (status = 'queued'
             OR (status = 'running' AND attempts = $2 AND cancel_requested_at IS NOT NULL))"
);

const REQUEST_CANCEL: &str = logged!(
    "request_cancel",
    token = "attempts",
    "UPDATE extractions
        SET cancel_requested_at = now()
      WHERE id = $1 AND status = 'running' AND cancel_requested_at IS NULL"
);

const START_BBOX_REFINEMENT: &str = logged!(
    "start_bbox_refinement",
    token = "NULL::int",
    "UPDATE extractions
        SET post_processing = jsonb_set(post_processing, '{bbox_refinement,requested_at}',
                                        to_jsonb(now()))
      WHERE id = $1 AND status = 'succeeded'
        AND post_processing->'bbox_refinement'->>'status' = 'pending'"
);

const MARK_BBOX_REFINEMENT_RUNNING: &str = logged!(
    "mark_bbox_refinement_running",
    token = bbox_token!(),
    "UPDATE extractions
        SET post_processing = jsonb_set(post_processing, '{bbox_refinement}',
              ((post_processing->'bbox_refinement') - 'orphaned_at') || jsonb_build_object(
                  'status', 'running',
                  'started_at', now(),
                  'attempts', COALESCE((post_processing->'bbox_refinement'->>'attempts')::int, 0) + 1,
                  'lease_expires_at', now() + make_interval(secs => $2),
                  'last_recovery_s', CASE
                      WHEN post_processing->'bbox_refinement'->>'status' = 'running' THEN extract(epoch FROM
                          now() - (post_processing->'bbox_refinement'->>'lease_expires_at')::timestamptz)::float8
                      WHEN post_processing->'bbox_refinement' ? 'orphaned_at' THEN extract(epoch FROM
                          now() - (post_processing->'bbox_refinement'->>'orphaned_at')::timestamptz)::float8
                  END))
      WHERE id = $1 AND status = 'succeeded'
        AND (post_processing->'bbox_refinement'->>'status' = 'pending'
             OR (post_processing->'bbox_refinement'->>'status' = 'running'
                 AND (post_processing->'bbox_refinement'->>'lease_expires_at')::timestamptz < now()))"
);

const MARK_BBOX_REFINEMENT_SUCCEEDED: &str = logged!(
    "mark_bbox_refinement_succeeded",
    token = bbox_token!(),
    "UPDATE extractions
        SET post_processing = jsonb_set(post_processing, '{bbox_refinement}',
              ((post_processing->'bbox_refinement') - 'lease_expires_at') || jsonb_build_object(
                  'status', 'succeeded', 'finished_at', now(), 'result', $3::jsonb, 'error', NULL))
      WHERE id = $1 AND status = 'succeeded'
        AND post_processing->'bbox_refinement'->>'status' = 'running'
        AND (post_processing->'bbox_refinement'->>'attempts')::int = $2"
);

const MARK_BBOX_REFINEMENT_FAILED: &str = logged!(
    "mark_bbox_refinement_failed",
    token = bbox_token!(),
    "UPDATE extractions
        SET post_processing = jsonb_set(post_processing, '{bbox_refinement}',
              ((post_processing->'bbox_refinement') - 'lease_expires_at') || jsonb_build_object(
                  'status', 'failed', 'finished_at', now(), 'error', $3::text))
      WHERE id = $1 AND status = 'succeeded'
        AND post_processing->'bbox_refinement'->>'status' = 'running'
        AND (post_processing->'bbox_refinement'->>'attempts')::int = $2"
);

const REQUEUE_BBOX_REFINEMENT: &str = logged!(
    "requeue_bbox_refinement",
    token = bbox_token!(),
    "UPDATE extractions
        SET post_processing = jsonb_set(post_processing, '{bbox_refinement}',
              ((post_processing->'bbox_refinement') - 'lease_expires_at')
                || jsonb_build_object('status', 'pending'))
      WHERE id = $1 AND status = 'succeeded'
        AND post_processing->'bbox_refinement'->>'status' IN ('pending', 'running')"
);

/// Claims a queued job, or one whose holder's lease ran out, for `lease_s` seconds.
pub async fn mark_running<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    lease_s: f64,
) -> Result<Option<Claim>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(MARK_RUNNING)
        .bind(id)
        .bind(lease_s)
        .fetch_optional(executor)
        .await?;
    Ok(row.map(|extraction| Claim {
        token: extraction.attempts,
        extraction,
    }))
}

/// Completes the claim `token` with `result`; bbox refinement becomes pending.
pub async fn mark_succeeded<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    result: &serde_json::Value,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(MARK_SUCCEEDED)
        .bind(id)
        .bind(token)
        .bind(result)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// Ends the claim `token` as failed with `error`.
pub async fn mark_failed<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    error: &str,
) -> Result<Option<Extraction>, StoreError> {
    fenced_with_text(executor, MARK_FAILED, id, token, error).await
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

/// Cancels a queued job (`holder: None`), or, as the holder of claim `token`, a
/// running job whose cancel was requested.
pub async fn mark_cancelled<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    holder: Option<i32>,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(MARK_CANCELLED)
        .bind(id)
        .bind(holder)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// Asks the holder of a running job to cancel it; it learns at its next heartbeat.
pub async fn request_cancel<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    by_id(executor, REQUEST_CANCEL, id).await
}

/// Stamps the pending bbox refinement as requested, just before its event is
/// published.
pub async fn start_bbox_refinement<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    by_id(executor, START_BBOX_REFINEMENT, id).await
}

/// Claims the bbox refinement of `id` for `lease_s` seconds.
pub async fn mark_bbox_refinement_running<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    lease_s: f64,
) -> Result<Option<Claim>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(MARK_BBOX_REFINEMENT_RUNNING)
        .bind(id)
        .bind(lease_s)
        .fetch_optional(executor)
        .await?;
    Ok(row.and_then(|extraction| {
        let token = extraction.bbox_refinement()?.attempts;
        Some(Claim { extraction, token })
    }))
}

/// Completes the bbox claim `token` with the grounded boxes.
pub async fn mark_bbox_refinement_succeeded<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    result: &serde_json::Value,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(MARK_BBOX_REFINEMENT_SUCCEEDED)
        .bind(id)
        .bind(token)
        .bind(result)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}

/// Ends the bbox claim `token` as failed with `error`.
pub async fn mark_bbox_refinement_failed<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    error: &str,
) -> Result<Option<Extraction>, StoreError> {
    fenced_with_text(executor, MARK_BBOX_REFINEMENT_FAILED, id, token, error).await
}

/// Puts a pending or running bbox refinement back to pending.
pub async fn requeue_bbox_refinement<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Extraction>, StoreError> {
    by_id(executor, REQUEUE_BBOX_REFINEMENT, id).await
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

async fn fenced_with_text<'e>(
    executor: impl PgExecutor<'e>,
    sql: &'static str,
    id: Uuid,
    token: i32,
    text: &str,
) -> Result<Option<Extraction>, StoreError> {
    let row = sqlx::query_as::<_, Extraction>(sql)
        .bind(id)
        .bind(token)
        .bind(text)
        .fetch_optional(executor)
        .await?;
    Ok(row)
}
