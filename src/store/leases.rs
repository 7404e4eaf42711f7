//! Lease renewal (heartbeats). Not a transition: the state does not change, only
//! how long the current claim is held. Each renewal is fenced by the claim's
//! token, so a holder that lost its claim learns it here (`None`).

use sqlx::PgExecutor;
use uuid::Uuid;

use super::StoreError;

/// What the holder learns from a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    /// A client asked to cancel the job; the holder should stop and cancel it.
    pub cancel_requested: bool,
}

const RENEW_EXTRACTION: &str = "UPDATE extractions
        SET lease_expires_at = now() + make_interval(secs => $3)
      WHERE id = $1 AND status = 'running' AND attempts = $2
  RETURNING cancel_requested_at IS NOT NULL";

const RENEW_BBOX: &str = "UPDATE extractions
        SET bbox_lease_expires_at = now() + make_interval(secs => $3)
      WHERE id = $1 AND bbox_status = 'running' AND bbox_attempts = $2
  RETURNING false";

/// Extends claim `token` on extraction `id` to `lease_s` seconds from now.
pub async fn renew_extraction_lease<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    lease_s: f64,
) -> Result<Option<Renewed>, StoreError> {
    renew(executor, RENEW_EXTRACTION, id, token, lease_s).await
}

/// Ends claim `token` on extraction `id` now, without a transition: its holder
/// gives the work up (a drain ran out) and the next claim need not wait for the
/// lease. `None` when the claim was no longer held.
pub async fn release_extraction_lease<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
) -> Result<Option<Renewed>, StoreError> {
    renew(executor, RENEW_EXTRACTION, id, token, 0.0).await
}

/// Extends bbox claim `token` on extraction `id` to `lease_s` seconds from now.
pub async fn renew_bbox_lease<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
    token: i32,
    lease_s: f64,
) -> Result<Option<Renewed>, StoreError> {
    renew(executor, RENEW_BBOX, id, token, lease_s).await
}

async fn renew<'e>(
    executor: impl PgExecutor<'e>,
    sql: &'static str,
    id: Uuid,
    token: i32,
    lease_s: f64,
) -> Result<Option<Renewed>, StoreError> {
    let cancel_requested: Option<bool> = sqlx::query_scalar(sql)
        .bind(id)
        .bind(token)
        .bind(lease_s)
        .fetch_optional(executor)
        .await?;
    Ok(cancel_requested.map(|cancel_requested| Renewed { cancel_requested }))
}

/// Whether job `id`'s extraction is held under a live lease right now (database
/// clock); `None` when the job does not exist.
pub async fn extraction_claim_is_live<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<bool>, StoreError> {
    let live = sqlx::query_scalar(
        "SELECT COALESCE(status = 'running' AND lease_expires_at >= now(), false)
           FROM extractions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(executor)
    .await?;
    Ok(live)
}

/// Whether job `id`'s bbox refinement is held under a live lease right now.
pub async fn bbox_claim_is_live<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<bool>, StoreError> {
    let live = sqlx::query_scalar(
        "SELECT COALESCE(bbox_status = 'running' AND bbox_lease_expires_at >= now(), false)
           FROM extractions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(executor)
    .await?;
    Ok(live)
}
