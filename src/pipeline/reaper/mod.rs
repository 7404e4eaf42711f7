//! The reapers: revive jobs that a crash left with nothing to deliver to them.
//!
//! Each sweep, one replica at a time (a session-level `pg_try_advisory_lock`,
//! released by Postgres if the process dies) takes the orphans of its classes in
//! one statement that also stamps them as republished, then revives each one.
//! The stamp keeps a job from being revived again before its threshold passes,
//! so a legitimate backlog causes no storm; the atomic claim makes any
//! duplicate harmless anyway.
//!
//! - [`Kind::Extraction`] (in `worker`): classes 1–3 and 7 →
//!   `extraction.submitted`.
//! - [`Kind::Bbox`] (in `bbox-worker`): classes 4–5 and 8 →
//!   `extraction.post_processing.requested`.
//! - [`Kind::Webhook`] (in every process with a worker or bbox worker):
//!   class 6, a pending webhook delivery nobody works on → this process's
//!   dispatcher.
//!
//! One [`Reaper`] does each: the sweep loop, the sweep lock and the counts
//! are the same, and a kind says only its name, its lock and what it takes.

use futures::future::join_all;
use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use sqlx::PgPool;

use super::{Jobs, RepublishError, Stage};
use crate::config::Settings;
use crate::domain::Lane;
use crate::events::PublishReason;
use crate::health::{Dependency, Health};
use crate::metrics::ReaperMetrics;
use crate::store::orphans::{self, Orphan, OrphanClass, Thresholds};
use crate::store::{webhooks, StoreError};
use crate::trace;
use crate::webhook::Webhooks;

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

/// The orphans a reaper sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Classes 1–3 and 7: jobs of the extraction stage.
    Extraction,
    /// Classes 4–5 and 8: jobs of the bbox refinement stage.
    Bbox,
    /// Class 6: webhook deliveries.
    Webhook,
}

impl Kind {
    /// Name for logs and the `reaper` label of the sweep metric.
    fn name(self) -> &'static str {
        match self {
            Kind::Extraction => "extraction",
            Kind::Bbox => "bbox",
            Kind::Webhook => "webhook",
        }
    }

    /// The advisory-lock key only this kind's sweeps take.
    fn lock_key(self) -> i64 {
        0x646f_6373_7472_0000
            + match self {
                Kind::Extraction => 1,
                Kind::Bbox => 2,
                Kind::Webhook => 3,
            }
    }
}

/// A reaper of one kind of orphan.
pub struct Reaper {
    parts: Parts,
    kind: Kind,
    settings: ReaperSettings,
}

/// What a reaper takes orphans with and revives them through: the reapers'
/// part of a process.
pub struct Parts {
    /// Where the orphans and the sweep lock are.
    pub pool: PgPool,
    /// The door a job's event is republished through.
    pub jobs: Jobs,
    /// This process's dispatcher, woken for a delivery nobody works on.
    pub webhooks: Webhooks,
    /// The sweeps and the orphans found and revived.
    pub metrics: ReaperMetrics,
    /// Told when a sweep finds Postgres away.
    pub health: Health,
}

/// What a reaper reads of the settings.
#[derive(Debug, Clone, Copy)]
struct ReaperSettings {
    /// Time between two sweeps.
    sweep_interval: std::time::Duration,
    /// Orphans taken per sweep, at most.
    batch: i64,
    /// The windows that tell an orphan from slow work.
    thresholds: Thresholds,
}

impl Reaper {
    /// A reaper of `kind` with `parts`, as `settings` set it.
    pub fn new(kind: Kind, parts: Parts, settings: &Settings) -> Self {
        let settings = ReaperSettings {
            sweep_interval: settings.reaper_sweep_interval_s.get(),
            batch: settings.reaper_batch_size,
            thresholds: Thresholds::of(settings),
        };
        Self {
            parts,
            kind,
            settings,
        }
    }

    /// Sweeps every sweep interval until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        run_sweeps(&self, shutdown).await
    }

    /// One sweep, if this replica gets the sweep lock.
    pub async fn sweep(&self) -> Result<Sweep, StoreError> {
        sweep_once(self).await
    }

    /// Takes this kind's orphans and revives them, holding the lock on `conn`.
    async fn take_and_revive(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Sweep, StoreError> {
        let ReaperSettings {
            thresholds, batch, ..
        } = self.settings;
        let stage = match self.kind {
            Kind::Webhook => return self.wake_unsent(conn).await,
            Kind::Extraction => Stage::Extraction,
            Kind::Bbox => Stage::BboxRefinement,
        };
        let taken = orphans::take(&mut **conn, stage, thresholds, batch).await?;
        let revive =
            |orphan: Orphan| async move { republish(&self.parts.jobs, stage, &orphan).await };
        Ok(revive_each(self, &taken, revive).await)
    }

    /// Class 6: hands each delivery nobody works on to this process's
    /// dispatcher (which claims it, so a second hand-out is harmless).
    async fn wake_unsent(&self, conn: &mut PoolConnection<Postgres>) -> Result<Sweep, StoreError> {
        let parts = &self.parts;
        let (threshold_s, batch) = (
            self.settings.thresholds.webhook_pending_s,
            self.settings.batch,
        );
        let taken = webhooks::take_orphans(&mut **conn, threshold_s, batch).await?;
        let label = [OrphanClass::WebhookUnsent.label()];
        let reapers = &parts.metrics;
        for (id, tenant, age_s) in &taken {
            tracing::debug!(id, class = 6, age_s, "orphan found");
            reapers.orphans_found.with_label_values(&label).inc();
            parts.webhooks.wake(Some(id), *tenant);
            reapers.orphans_republished.with_label_values(&label).inc();
        }
        if !taken.is_empty() {
            tracing::info!(
                reaper = self.kind.name(),
                found = taken.len(),
                "orphans revived"
            );
        }
        Ok(Sweep::Swept {
            found: taken.len(),
            republished: taken.len(),
        })
    }
}

/// Sweeps every sweep interval until `shutdown`. A failed sweep is logged and
/// counted and the next one tries again; a reaper never gives up.
async fn run_sweeps(reaper: &Reaper, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(reaper.settings.sweep_interval);
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
                    reaper.parts.health.failed(Dependency::Postgres, &e);
                } else {
                    tracing::warn!(reaper = reaper.kind.name(), error = %e, "sweep failed; retrying next interval");
                }
            }
        }
    }
}

/// One sweep, if this replica gets the sweep lock.
async fn sweep_once(reaper: &Reaper) -> Result<Sweep, StoreError> {
    let mut conn = reaper.parts.pool.acquire().await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(reaper.kind.lock_key())
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        count_sweep(reaper, "locked_elsewhere");
        return Ok(Sweep::LockedElsewhere);
    }
    let swept = reaper.take_and_revive(&mut conn).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(reaper.kind.lock_key())
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

fn count_sweep(reaper: &Reaper, outcome: &str) {
    reaper
        .parts
        .metrics
        .sweeps
        .with_label_values(&[reaper.kind.name(), outcome])
        .inc();
}

/// Revives each orphan taken with `revive` (true once it is revived), in
/// each job's own span, counting what was found and what was revived.
async fn revive_each<F, Fut>(reaper: &Reaper, taken: &[Orphan], revive: F) -> Sweep
where
    F: Fn(Orphan) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let metrics = &reaper.parts.metrics;
    let outcomes = join_all(taken.iter().map(|orphan| {
        let label = [orphan.class.label()];
        metrics.orphans_found.with_label_values(&label).inc();
        tracing::debug!(id = %orphan.id, class = orphan.class.number(), age_s = orphan.age_s, "orphan found");
        let revived = revive(orphan.clone());
        async move {
            let ok = revived.await;
            if ok {
                metrics.orphans_republished.with_label_values(&label).inc();
            }
            ok
        }
        .instrument(trace::job_span(orphan.id, None))
    }))
    .await;
    let republished = outcomes.iter().filter(|ok| **ok).count();
    if !taken.is_empty() {
        tracing::info!(
            reaper = reaper.kind.name(),
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
async fn republish(jobs: &Jobs, stage: Stage, orphan: &Orphan) -> bool {
    let lane = Lane {
        tenant: orphan.tenant_id,
        priority: orphan.priority,
    };
    match jobs
        .republish(stage, orphan.id, lane, PublishReason::Reaper)
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
