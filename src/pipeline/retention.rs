//! Retention: every `retention_purge_interval_s`, each process purges the
//! finished jobs (and bulk operations, and the tenants' dead-letter rows)
//! past their tenant's retention, a batch per transaction until none is
//! left (`store::retention`), then deletes the files no job names that
//! nothing used for `file_grace_s` (`Files::collect`). Every
//! process runs it, so it goes on while any process lives; purgers skip the
//! rows another is purging, so two never wait on each other.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use prometheus::IntCounterVec;
use sqlx::PgPool;

use crate::config::Settings;
use crate::files::Files;
use crate::health::{Dependency, Health};
use crate::store::retention::{self, Aged};
use crate::store::StoreError;

/// Jobs per purge statement (and transaction).
pub const BATCH: i64 = 500;

/// What the purge deletes with, and how long things are kept: the purge's
/// part of a process.
pub struct Purger {
    pool: PgPool,
    files: Files,
    /// The deployment's retention, for tenants without their own.
    retention: Duration,
    /// How often a purge runs.
    interval: Duration,
    /// How long a file no job names is kept after its last use.
    file_grace: Duration,
    /// `docstream_purged_total`.
    purged: IntCounterVec,
    health: Health,
}

impl Purger {
    /// The purge of a process with `settings`, on `pool` and `files`.
    pub fn new(
        settings: &Settings,
        (pool, files): (PgPool, Files),
        purged: IntCounterVec,
        health: Health,
    ) -> Self {
        Purger {
            pool,
            files,
            retention: Duration::from_secs(u64::from(settings.retention_days) * 86_400),
            interval: settings.retention_purge_interval_s.get(),
            file_grace: settings.file_grace_s.get(),
            purged,
            health,
        }
    }
}

/// Runs the purge until `shutdown`; a failed pass is logged, and the next
/// interval tries again.
pub async fn run(purger: Purger, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(purger.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(e) = purge(&purger, &shutdown).await {
            match e.is_unavailable() {
                true => purger.health.failed(Dependency::Postgres, &e),
                false => {
                    tracing::warn!(error = %e, "retention purge failed; retrying next interval")
                }
            }
        }
    }
}

/// Purges batches of each kind until a short one says nothing is left past
/// its retention.
async fn purge(purger: &Purger, shutdown: &CancellationToken) -> Result<(), StoreError> {
    let (pool, purged, default) = (&purger.pool, &purger.purged, purger.retention);
    for aged in [None, Some(Aged::BulkOperations), Some(Aged::DeadLetters)] {
        let what = aged.map_or("jobs", Aged::as_str);
        let mut total = 0;
        while !shutdown.is_cancelled() {
            let n = match aged {
                None => retention::purge_expired(pool, default, BATCH).await?,
                Some(aged) => retention::purge_aged(pool, aged, default, BATCH).await?,
            };
            purged.with_label_values(&[what]).inc_by(n);
            total += n;
            if n < BATCH as u64 {
                break;
            }
        }
        if total > 0 {
            tracing::info!(
                what,
                purged = total,
                "retention: purged what is past its retention"
            );
        }
    }
    match purger.files.collect(purger.file_grace, BATCH).await {
        Ok(0) => {}
        Ok(n) => {
            purged.with_label_values(&["files"]).inc_by(n);
            tracing::info!(deleted = n, "retention: deleted the files no job names");
        }
        Err(crate::files::FileError::Database(e)) => return Err(e),
        Err(e) => tracing::warn!(error = %e, "retention: files not collected; next interval"),
    }
    Ok(())
}
