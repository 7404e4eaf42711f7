//! Keeps this process's copy of the tenants' weights current: a worker's
//! consumer shares its slots among the tenants with records waiting by
//! these (`domain::schedule`), and reads them from memory, never from
//! Postgres, on the record path.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use sqlx::PgPool;

use crate::domain::schedule::Weights;
use crate::store::tenants;

/// How often the weights are read again: a changed weight holds within it.
pub const REFRESH: Duration = Duration::from_secs(5);

/// Reads the weights every [`REFRESH`] until `shutdown`. A failed read keeps
/// the last weights (and is retried at the next turn).
pub async fn keep_current(pool: PgPool, weights: Weights, shutdown: CancellationToken) {
    loop {
        match tenants::weights(&pool).await {
            Ok(rows) => weights.replace(
                rows.into_iter()
                    .map(|(tenant, weight)| (tenant, weight.max(1) as u32))
                    .collect(),
            ),
            Err(e) => tracing::debug!(error = %e, "tenants' weights not read; keeping the last"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REFRESH) => {}
        }
    }
}
