//! Ending a claim through a Postgres outage. A completing transition (succeed,
//! fail, requeue, cancel) is fenced by the claim's token alone, not by its
//! lease, so running it again after the database came back is safe: it wins if
//! nobody took the job over meanwhile and loses cleanly if someone did. So a
//! completion whose connection failed is retried in place, with backoff, until
//! the database answers. Redelivering the record instead would claim the job
//! again, and spend one of its attempts on the outage.
//!
//! Nothing but an unavailable database is retried here. A statement that keeps
//! failing for that reason holds its record in flight: the consumer's drain
//! timeout bounds that on shutdown, and nothing is committed meanwhile.

use std::future::Future;
use std::time::Duration;

use crate::health::{Dependency, Health};
use crate::metrics::Metrics;
use crate::store::StoreError;

/// The first and the longest wait between two tries.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Runs `statement` until it returns anything but an unavailable database,
/// reporting the outage to `health` and counting each retry of `name`.
pub async fn persist<T, F, Fut>(
    health: &Health,
    metrics: &Metrics,
    name: &'static str,
    mut statement: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = BACKOFF.0;
    loop {
        match statement().await {
            Err(e) if e.is_unavailable() => {
                health.failed(Dependency::Postgres, &e);
                metrics.store.retries.with_label_values(&[name]).inc();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
            }
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_only_while_the_database_is_unavailable() {
        let metrics = Metrics::new();
        let health = Health::new(metrics.clone());
        let tries = AtomicUsize::new(0);
        let done = persist(&health, &metrics, "test", || {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0..=2 => Err(StoreError::from(sqlx::Error::PoolTimedOut)),
                    _ => Ok(n),
                }
            }
        })
        .await;
        assert_eq!(done.unwrap(), 3);
        assert_eq!(metrics.store.retries.with_label_values(&["test"]).get(), 3);

        let tries = AtomicUsize::new(0);
        let failed: Result<(), _> = persist(&health, &metrics, "test", || {
            tries.fetch_add(1, Ordering::SeqCst);
            async { Err(StoreError::from(sqlx::Error::RowNotFound)) }
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(
            tries.load(Ordering::SeqCst),
            1,
            "a real error is not retried"
        );
    }
}
