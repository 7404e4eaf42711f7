//! The reapers: revive jobs that a crash left with nothing to deliver to them.
//!
//! Each sweep, one replica at a time (a session-level `pg_try_advisory_lock`,
//! released by Postgres if the process dies) takes the orphans of its classes in
//! one statement that also stamps them as republished, then revives each one.
//! The stamp keeps a job from being revived again before its threshold passes,
//! so a legitimate backlog causes no storm; the atomic claim makes any
//! duplicate harmless anyway.
//!
//! - [`ExtractionReaper`] (in `worker`): classes 1–3 → `extraction.submitted`.
//! - [`BboxReaper`] (in `bbox-worker`): classes 4–5 →
//!   `extraction.post_processing.requested`.
//! - [`WebhookReaper`] (in every process with a worker or bbox worker):
//!   class 6, a pending webhook delivery nobody works on → this process's
//!   dispatcher.
//!
//! What they share is here: the sweep loop, the sweep lock, the counts.

mod bbox;
mod extraction;
mod webhook;

pub use bbox::BboxReaper;
pub use extraction::ExtractionReaper;
pub use webhook::WebhookReaper;

use futures::future::join_all;
use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{RepublishError, Services, Stage};
use crate::events::PublishReason;
use crate::health::Dependency;
use crate::store::orphans::Orphan;
use crate::store::StoreError;
use crate::trace;

/// What one sweep did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sweep {
    /// Another replica holds the sweep lock; nothing was done.
    LockedElsewhere,
    /// Swept: orphans found and how many were revived (for an event,
    /// acknowledged by the broker).
    Swept {
        /// Orphans taken.
        found: usize,
        /// Of those, revived.
        republished: usize,
    },
}

/// One kind of reaper: its name, its lock, and what a sweep does once it
/// holds the lock.
trait Sweeper {
    /// Name for logs and the `reaper` label of the sweep metric.
    const NAME: &'static str;
    /// The advisory-lock key only this kind's sweeps take.
    const LOCK_KEY: i64;

    fn services(&self) -> &Services;

    /// Takes this kind's orphans and revives them, holding the lock on `conn`.
    async fn take_and_revive(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Sweep, StoreError>;
}

/// Sweeps every sweep interval until `shutdown`. A failed sweep is logged and
/// counted and the next one tries again; a reaper never gives up.
async fn run_sweeps<R: Sweeper>(reaper: &R, shutdown: CancellationToken) {
    let services = reaper.services();
    let mut ticker = tokio::time::interval(services.settings.reaper_sweep_interval_s.get());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match sweep_once(reaper).await {
            Ok(_) => {}
            Err(e) => {
                count_sweep(reaper, "failed");
                if e.is_unavailable() {
                    services.health.failed(Dependency::Postgres, &e);
                } else {
                    tracing::warn!(reaper = R::NAME, error = %e, "sweep failed; retrying next interval");
                }
            }
        }
    }
}

/// One sweep, if this replica gets the sweep lock.
async fn sweep_once<R: Sweeper>(reaper: &R) -> Result<Sweep, StoreError> {
    let mut conn = reaper.services().pool.acquire().await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(R::LOCK_KEY)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        count_sweep(reaper, "locked_elsewhere");
        return Ok(Sweep::LockedElsewhere);
    }
    let swept = reaper.take_and_revive(&mut conn).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(R::LOCK_KEY)
        .execute(&mut *conn)
        .await;
    if unlocked.is_err() {
        // Never hand a connection that may still hold the lock back to the pool.
        drop(conn.detach());
    }
    let swept = swept?;
    count_sweep(reaper, "swept");
    Ok(swept)
}

fn count_sweep<R: Sweeper>(reaper: &R, outcome: &str) {
    reaper
        .services()
        .metrics
        .reapers
        .sweeps
        .with_label_values(&[R::NAME, outcome])
        .inc();
}

/// Revives each orphan taken with `revive` (true once it is revived), in
/// each job's own span, counting what was found and what was revived.
async fn revive_each<R, F, Fut>(reaper: &R, taken: &[Orphan], revive: F) -> Sweep
where
    R: Sweeper,
    F: Fn(Orphan) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let metrics = &reaper.services().metrics;
    let outcomes = join_all(taken.iter().map(|orphan| {
        let label = [orphan.class.label()];
        metrics.reapers.orphans_found.with_label_values(&label).inc();
        tracing::debug!(id = %orphan.id, class = orphan.class.number(), age_s = orphan.age_s, "orphan found");
        let revived = revive(orphan.clone());
        async move {
            let ok = revived.await;
            if ok {
                metrics.reapers.orphans_republished.with_label_values(&label).inc();
            }
            ok
        }
        .instrument(trace::job_span(orphan.id, None))
    }))
    .await;
    let republished = outcomes.iter().filter(|ok| **ok).count();
    if !taken.is_empty() {
        tracing::info!(
            reaper = R::NAME,
            found = taken.len(),
            republished,
            "orphans revived"
        );
    }
    Sweep::Swept {
        found: taken.len(),
        republished,
    }
}

/// Republishes `orphan`'s event for `stage`; true once the broker
/// acknowledged it. A failure is retried at the orphan's next threshold.
async fn republish(services: &Services, stage: Stage, orphan: &Orphan) -> bool {
    match services
        .republish(stage, orphan.id, PublishReason::Reaper)
        .await
    {
        Ok(()) => true,
        Err(e @ RepublishError::Record(_)) => {
            tracing::warn!(id = %orphan.id, error = %e, "it may be republished again");
            true
        }
        Err(e @ RepublishError::Publish(_)) => {
            tracing::warn!(id = %orphan.id, error = %e, "orphan republish failed");
            false
        }
    }
}
