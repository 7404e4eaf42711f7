//! Ending a claim through a Postgres outage. A completing transition (succeed,
//! fail, requeue, cancel) is fenced by the claim's token alone, not by its
//! lease, so running it again after the database came back is safe: it wins if
//! nobody took the job over meanwhile and loses cleanly if someone did. So a
//! completion whose connection failed is retried in place, with backoff, until
//! the database answers. Redelivering the record instead would claim the job
//! again, and spend one of its attempts on the outage.
//!
//! One case is not clean: a try whose connection broke after the statement
//! was sent may have committed, its answer lost. The retry then loses (the
//! row moved on, under our own token), and the holder would take its own win
//! for a takeover: drop its events and the bbox request, and commit its
//! record with the job undelivered. So a completion that loses after a failed
//! try asks the transition log, written by the same statement, whether the
//! claim's transition is there, and if so concludes it as won.
//!
//! Nothing but an unavailable database is retried here. A statement that keeps
//! failing for that reason holds its record in flight: the consumer's drain
//! timeout bounds that on shutdown, and nothing is committed meanwhile.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::Transition;
use crate::health::{Dependency, Health};
use crate::metrics::Metrics;
use crate::store::{transitions, Extraction, StoreError};

/// The first and the longest wait between two tries.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Runs `statement` until it returns anything but an unavailable database,
/// reporting the outage to `health` and counting each retry of `name`.
pub async fn persist<T, F, Fut>(
    health: &Health,
    metrics: &Metrics,
    name: &'static str,
    statement: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    Ok(retried(health, metrics, name, statement).await?.0)
}

/// [`persist`] for the completing `statement` of `transition` over `claims`
/// (id, token), one answer per claim, in order: a claim it lost after a
/// failed try is looked up in the transition log, and answered with the job
/// row if that try won it.
pub async fn persist_completion<F, Fut>(
    (health, metrics, pool): (&Health, &Metrics, &PgPool),
    transition: Transition,
    claims: &[(Uuid, i32)],
    statement: F,
) -> Result<Vec<Option<Extraction>>, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<Option<Extraction>>, StoreError>>,
{
    let name = transition.as_str();
    let (mut rows, retried_after_a_failure) = retried(health, metrics, name, statement).await?;
    let lost: Vec<(Uuid, i32)> = claims
        .iter()
        .zip(&rows)
        .filter_map(|(claim, row)| row.is_none().then_some(*claim))
        .collect();
    if !retried_after_a_failure || lost.is_empty() {
        return Ok(rows);
    }
    let logged = || transitions::won_by(pool, transition, &lost);
    let mut won = persist(health, metrics, "won_by", logged)
        .await?
        .into_iter();
    for row in rows.iter_mut().filter(|row| row.is_none()) {
        *row = won.next().flatten();
        if let Some(row) = row {
            let id = row.id;
            tracing::info!(%id, transition = name, "completion won by a try whose answer was lost");
        }
    }
    Ok(rows)
}

/// Runs `statement` until the database answers; the answer, and whether a
/// try before it failed (then it may have committed).
async fn retried<T, F, Fut>(
    health: &Health,
    metrics: &Metrics,
    name: &'static str,
    mut statement: F,
) -> Result<(T, bool), StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = BACKOFF.0;
    let mut failed_before = false;
    loop {
        match statement().await {
            Err(e) if e.is_unavailable() => {
                failed_before = true;
                health.failed(Dependency::Postgres, &e);
                metrics.store.retries.with_label_values(&[name]).inc();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
            }
            done => return done.map(|answer| (answer, failed_before)),
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
