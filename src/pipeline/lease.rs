//! Holding a claim while work runs: renew the lease every heartbeat until the
//! work finishes. A renewal that matches nothing means the claim was lost (the
//! lease expired and someone else claimed the job), and the work is dropped; a
//! renewal that reports a cancel request stops the work too.

use std::future::Future;
use std::time::Duration;

use crate::health::{Dependency, Health};
use crate::store::leases::Renewed;
use crate::store::StoreError;

/// How holding a claim ended.
#[derive(Debug)]
pub enum Held<T> {
    /// The work finished while the claim was held.
    Done(T),
    /// A renewal found the claim gone; the work was abandoned.
    Lost,
    /// A client asked to cancel; the work was abandoned.
    CancelRequested,
}

/// Runs `work`, calling `renew` every `interval` until it finishes.
pub async fn hold<T, R, RF>(
    work: impl Future<Output = T>,
    interval: Duration,
    health: &Health,
    mut renew: R,
) -> Held<T>
where
    R: FnMut() -> RF,
    RF: Future<Output = Result<Option<Renewed>, StoreError>>,
{
    tokio::pin!(work);
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // Finished work wins a tie: a holder thawed after its lease expired
            // then meets the fencing token at completion, where it is counted.
            biased;
            output = &mut work => return Held::Done(output),
            _ = heartbeat.tick() => match renew().await {
                Ok(Some(Renewed { cancel_requested: true })) => return Held::CancelRequested,
                Ok(Some(_)) => {}
                Ok(None) => return Held::Lost,
                // The claim stays ours unless someone else takes the job, and
                // the next renewal that reaches the database extends it again.
                Err(e) if e.is_unavailable() => health.failed(Dependency::Postgres, &e),
                Err(e) => tracing::warn!(error = %e, "lease renewal failed; retrying at the next heartbeat"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const BEAT: Duration = Duration::from_millis(10);

    fn health() -> Health {
        Health::new(crate::metrics::Metrics::new())
    }

    #[tokio::test(start_paused = true)]
    async fn renews_until_the_work_is_done() {
        let renewals = AtomicUsize::new(0);
        let held = hold(
            tokio::time::sleep(BEAT * 5 + BEAT / 2),
            BEAT,
            &health(),
            || {
                renewals.fetch_add(1, Ordering::SeqCst);
                async {
                    Ok(Some(Renewed {
                        cancel_requested: false,
                    }))
                }
            },
        )
        .await;
        assert!(matches!(held, Held::Done(())));
        assert_eq!(renewals.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_claim_or_a_cancel_stops_the_work() {
        let held = hold(std::future::pending::<()>(), BEAT, &health(), || async {
            Ok(None)
        })
        .await;
        assert!(matches!(held, Held::Lost));
        let held = hold(std::future::pending::<()>(), BEAT, &health(), || async {
            Ok(Some(Renewed {
                cancel_requested: true,
            }))
        })
        .await;
        assert!(matches!(held, Held::CancelRequested));
    }
}
