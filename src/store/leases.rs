//! Lease renewal (heartbeats). Not a transition: the state does not change, only
//! how long the current claim is held. Each renewal is fenced by the claim's
//! token, so a holder that lost its claim learns it here (`None`).

use sqlx::PgExecutor;
use uuid::Uuid;

use super::StoreError;
use crate::domain::Stage;

/// What the holder learns from a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    /// A client asked to cancel the job; the holder should stop and cancel it.
    pub cancel_requested: bool,
}

/// A stage's lease statements: the renewal (`$1` id, `$2` token, `$3`
/// seconds), which also says whether a cancel was requested (the bbox
/// refinement has no cancel of its own), and whether a live lease holds it.
struct Statements {
    renew: &'static str,
    is_live: &'static str,
}

fn statements(stage: Stage) -> Statements {
    match stage {
        Stage::Extraction => Statements {
            renew: "UPDATE extractions
                       SET lease_expires_at = now() + make_interval(secs => $3)
                     WHERE id = $1 AND status = 'running' AND attempts = $2
                 RETURNING cancel_requested_at IS NOT NULL",
            is_live: "SELECT COALESCE(status = 'running' AND lease_expires_at >= now(), false)
                        FROM extractions WHERE id = $1",
        },
        Stage::BboxRefinement => Statements {
            renew: "UPDATE extractions
                       SET bbox_lease_expires_at = now() + make_interval(secs => $3)
                     WHERE id = $1 AND bbox_status = 'running' AND bbox_attempts = $2
                 RETURNING false",
            is_live:
                "SELECT COALESCE(bbox_status = 'running' AND bbox_lease_expires_at >= now(), false)
                        FROM extractions WHERE id = $1",
        },
    }
}

/// Extends claim `token` of `stage` on job `id` to `lease_s` seconds from now.
pub async fn renew<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
    token: i32,
    lease_s: f64,
) -> Result<Option<Renewed>, StoreError> {
    let cancel_requested: Option<bool> = sqlx::query_scalar(statements(stage).renew)
        .bind(id)
        .bind(token)
        .bind(lease_s)
        .fetch_optional(executor)
        .await?;
    Ok(cancel_requested.map(|cancel_requested| Renewed { cancel_requested }))
}

/// Ends claim `token` of `stage` on job `id` now, without a transition: its
/// holder gives the work up (a drain ran out) and the next claim need not wait
/// for the lease. `None` when the claim was no longer held.
pub async fn release<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
    token: i32,
) -> Result<Option<Renewed>, StoreError> {
    renew(executor, stage, id, token, 0.0).await
}

/// Whether job `id`'s `stage` is held under a live lease right now (database
/// clock); `None` when the job does not exist.
pub async fn claim_is_live<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
) -> Result<Option<bool>, StoreError> {
    let live = sqlx::query_scalar(statements(stage).is_live)
        .bind(id)
        .fetch_optional(executor)
        .await?;
    Ok(live)
}
