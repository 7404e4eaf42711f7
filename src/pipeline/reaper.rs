//! The reapers: revive jobs that a crash left with nothing to deliver to them.
//!
//! Each sweep, one replica at a time (a session-level `pg_try_advisory_lock`,
//! released by Postgres if the process dies) takes the orphans of its classes in
//! one statement that also stamps them as republished, then republishes one event
//! per orphan with reason `reaper`. The stamp keeps a job from being republished
//! again before its threshold passes, so a legitimate backlog causes no storm;
//! the atomic claim makes any duplicate harmless anyway.
//!
//! ExtractionReaper (in `worker`): classes 1–3 → `extraction.submitted`.
//! BboxReaper (in `bbox-worker`): classes 4–5 → `extraction.post_processing.requested`.
//! WebhookReaper (in every process with a worker or bbox worker): class 6, a
//! pending webhook delivery nobody works on → this process's dispatcher.

use futures::future::join_all;
use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Services;
use crate::events::{ExtractionSubmitted, PostProcessingRequested, PublishReason};
use crate::health::Dependency;
use crate::store::orphans::{self, Orphan};
use crate::store::webhooks;
use crate::store::StoreError;
use crate::trace;

/// Which reaper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaperKind {
    /// Classes 1–3.
    Extraction,
    /// Classes 4–5.
    Bbox,
    /// Class 6.
    Webhook,
}

impl ReaperKind {
    /// Name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Extraction => "extraction",
            Self::Bbox => "bbox",
            Self::Webhook => "webhook",
        }
    }

    /// The advisory-lock key only this reaper's sweeps take.
    fn lock_key(self) -> i64 {
        match self {
            Self::Extraction => 0x646f_6373_7472_0001,
            Self::Bbox => 0x646f_6373_7472_0002,
            Self::Webhook => 0x646f_6373_7472_0003,
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sweep {
    /// Another replica holds the sweep lock; nothing was done.
    LockedElsewhere,
    /// Swept: orphans found and how many were republished (acknowledged).
    Swept {
        /// Orphans taken.
        found: usize,
        /// Of those, republished.
        republished: usize,
    },
}

/// One reaper.
pub struct Reaper {
    services: Services,
    kind: ReaperKind,
}

impl Reaper {
    /// A reaper of `kind` on `services`.
    pub fn new(services: Services, kind: ReaperKind) -> Self {
        Self { services, kind }
    }

    /// Sweeps every sweep interval until `shutdown`. A failed sweep is logged and
    /// counted and the next one tries again; the reaper itself never gives up.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker =
            tokio::time::interval(self.services.settings.reaper_sweep_interval_s.get());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match self.sweep().await {
                Ok(_) => {}
                Err(e) if e.is_unavailable() => {
                    self.count_sweep("failed");
                    self.services.health.failed(Dependency::Postgres, &e);
                }
                Err(e) => {
                    self.count_sweep("failed");
                    tracing::warn!(reaper = self.kind.as_str(), error = %e, "sweep failed; retrying next interval");
                }
            }
        }
    }

    /// One sweep, if this replica gets the sweep lock.
    pub async fn sweep(&self) -> Result<Sweep, StoreError> {
        let mut conn = self.services.pool.acquire().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(self.kind.lock_key())
            .fetch_one(&mut *conn)
            .await?;
        if !locked {
            self.count_sweep("locked_elsewhere");
            return Ok(Sweep::LockedElsewhere);
        }
        let swept = self.take_and_republish(&mut conn).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(self.kind.lock_key())
            .execute(&mut *conn)
            .await;
        if unlocked.is_err() {
            // Never hand a connection that may still hold the lock back to the pool.
            drop(conn.detach());
        }
        let swept = swept?;
        self.count_sweep("swept");
        Ok(swept)
    }

    async fn take_and_republish(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Sweep, StoreError> {
        let settings = &self.services.settings;
        let thresholds = orphans::Thresholds::of(settings);
        let limit = settings.reaper_batch_size;
        let taken = match self.kind {
            ReaperKind::Extraction => {
                orphans::take_extraction_orphans(&mut **conn, thresholds, limit).await?
            }
            ReaperKind::Bbox => orphans::take_bbox_orphans(&mut **conn, thresholds, limit).await?,
            ReaperKind::Webhook => return self.revive_webhooks(conn).await,
        };
        let outcomes = join_all(taken.iter().map(|orphan| {
            let span = trace::job_span(orphan.id, None);
            self.republish(orphan).instrument(span)
        }))
        .await;
        let republished = outcomes.iter().filter(|ok| **ok).count();
        if !taken.is_empty() {
            tracing::info!(
                reaper = self.kind.as_str(),
                found = taken.len(),
                republished,
                "orphans revived"
            );
        }
        Ok(Sweep::Swept {
            found: taken.len(),
            republished,
        })
    }

    /// Class 6: hands each orphaned delivery to this process's dispatcher.
    async fn revive_webhooks(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Sweep, StoreError> {
        let services = &self.services;
        let settings = &services.settings;
        let threshold = settings.webhook_orphan_threshold_s.as_secs_f64();
        let taken =
            webhooks::take_orphans(&mut **conn, threshold, settings.reaper_batch_size).await?;
        let metrics = &services.metrics;
        for (id, age_s) in &taken {
            tracing::debug!(id, class = 6, age_s, "orphan found");
            metrics.orphans_found.with_label_values(&["6"]).inc();
            services.webhooks.wake(Some(id));
            metrics.orphans_republished.with_label_values(&["6"]).inc();
        }
        if !taken.is_empty() {
            tracing::info!(
                reaper = self.kind.as_str(),
                found = taken.len(),
                "orphans revived"
            );
        }
        Ok(Sweep::Swept {
            found: taken.len(),
            republished: taken.len(),
        })
    }

    /// Republishes one orphan's event; true once the broker acknowledged it. A
    /// failure is retried at the orphan's next threshold.
    async fn republish(&self, orphan: &Orphan) -> bool {
        let services = &self.services;
        let settings = &services.settings;
        let class = orphan.class.to_string();
        services
            .metrics
            .orphans_found
            .with_label_values(&[&class])
            .inc();
        tracing::debug!(id = %orphan.id, class = orphan.class, age_s = orphan.age_s, "orphan found");
        let published = match self.kind {
            ReaperKind::Extraction => {
                let topic = settings.topic(&settings.topic_submitted);
                let event = ExtractionSubmitted::new(orphan.id, PublishReason::Reaper);
                services
                    .publisher
                    .publish_job(&topic, orphan.id, &event)
                    .await
            }
            ReaperKind::Webhook => unreachable!("class 6 is revived by revive_webhooks"),
            ReaperKind::Bbox => {
                let topic = settings.topic(&settings.topic_post_processing);
                let event =
                    PostProcessingRequested::bbox_refinement(orphan.id, PublishReason::Reaper);
                services
                    .publisher
                    .publish_job(&topic, orphan.id, &event)
                    .await
            }
        };
        let recorded = match (&published, self.kind) {
            (Err(_), _) => Ok(()),
            (Ok(()), ReaperKind::Extraction) => {
                orphans::record_published(&services.pool, orphan.id).await
            }
            (Ok(()), _) => orphans::record_bbox_request_published(&services.pool, orphan.id).await,
        };
        if let Err(e) = recorded {
            tracing::warn!(id = %orphan.id, error = %e, "republish not recorded; it may be republished again");
        }
        match published {
            Ok(()) => {
                services
                    .metrics
                    .orphans_republished
                    .with_label_values(&[&class])
                    .inc();
                true
            }
            Err(e) => {
                tracing::warn!(id = %orphan.id, error = %e, "orphan republish failed");
                false
            }
        }
    }

    fn count_sweep(&self, outcome: &str) {
        let metrics = &self.services.metrics;
        metrics
            .reaper_sweeps
            .with_label_values(&[self.kind.as_str(), outcome])
            .inc();
    }
}
