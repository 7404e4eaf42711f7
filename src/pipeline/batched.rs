//! The hot-path transitions of one process, each behind a [`Coalescer`]: the
//! records a consumer handles concurrently share their claims, completions and
//! stamps, one statement (and one commit) per batch instead of per job.
//!
//! The completions and the bbox stamp are retried in place while the database
//! is unavailable (`persist`), a completion telling its own win whose answer
//! was lost from a takeover; the insert and the claims are not: a submit
//! answers its client within a bound, and a claim that failed is claimed again
//! when its record is retried.

use sqlx::PgPool;
use uuid::Uuid;

use super::jobs::{persist, persist_completion};
use crate::admission::Admission;
use crate::config::{Settings, StageSettings};
use crate::domain::{PerStage, Stage};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::store::coalesce::Coalescer;
use crate::store::transitions::{self, Completion};
use crate::store::{self, orphans, Claim, Extraction, Insert, StoreError};

/// Submit INSERTs in flight at once, whatever `db_batch_concurrency` says.
const SUBMIT_CONCURRENCY: usize = 2;

/// How the batchers group: at most `max` inputs per statement, and
/// `concurrency` statements of one kind in flight.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Inputs per statement, at most.
    pub max: usize,
    /// Statements of one kind in flight at once.
    pub concurrency: usize,
}

impl BatchLimits {
    /// The limits of `settings`.
    pub fn of(settings: &Settings) -> Self {
        Self {
            max: settings.db_batch_max,
            concurrency: settings.db_batch_concurrency,
        }
    }
}

/// The grouped statements; clones share the batchers.
#[derive(Clone)]
pub struct Batched {
    /// The submit INSERT; each job gets its own answer, so a value one job
    /// carries cannot fail the others of its batch.
    pub insert: Coalescer<Insert, Result<Option<Extraction>, StoreError>>,
    /// The job an idempotency key (with its tenant) names: a repeated
    /// submit's answer. Grouped like the INSERT, so a burst of retries
    /// after a slow spell costs a few statements, not a pooled connection
    /// each.
    pub by_key: Coalescer<(Uuid, String), Option<Extraction>>,
    /// Each stage's claim, for its lease.
    pub claim: PerStage<Coalescer<Uuid, Option<Claim>>>,
    /// Each stage's success (the extraction's with `start_bbox_refinement`,
    /// in one statement).
    pub succeed: PerStage<Coalescer<Completion, Option<Extraction>>>,
    /// The bbox request of a job was acknowledged.
    pub bbox_requested: Coalescer<Uuid, ()>,
}

impl Batched {
    /// Starts the batchers on `pool` (needs a Tokio runtime).
    /// Each submit INSERT's duration goes to `admission`, whose target
    /// latency follows the database's pace.
    pub fn new(
        limits: BatchLimits,
        stages: &PerStage<StageSettings>,
        pool: &PgPool,
        health: &Health,
        metrics: &Metrics,
        admission: &Admission,
    ) -> Self {
        let BatchLimits { max, concurrency } = limits;
        macro_rules! batcher {
            (|$pool:ident, $inputs:ident| $statement:expr) => {{
                let $pool = pool.clone();
                Coalescer::spawn(max, concurrency, move |$inputs| {
                    let $pool = $pool.clone();
                    async move { $statement }
                })
            }};
            (persist $name:expr, |$pool:ident, $inputs:ident| $statement:expr) => {{
                let ($pool, health, metrics) = (pool.clone(), health.clone(), metrics.clone());
                Coalescer::spawn(max, concurrency, move |$inputs| {
                    let ($pool, health, metrics) = ($pool.clone(), health.clone(), metrics.clone());
                    async move { persist(&health, &metrics, $name, || async { $statement }).await }
                })
            }};
        }
        Self {
            insert: {
                let (pool, admission) = (pool.clone(), admission.clone());
                // Two at once at least: a submit that arrives while a slow
                // INSERT runs goes out in the next at once, instead of
                // waiting for it (with 1 s per statement, two statement
                // times came near the answer bound). Submits are spread out
                // in time, so this costs their batches little.
                let concurrency = concurrency.max(SUBMIT_CONCURRENCY);
                Coalescer::spawn(max, concurrency, move |inserts| {
                    let (pool, admission) = (pool.clone(), admission.clone());
                    async move {
                        let started = std::time::Instant::now();
                        let inserted = store::insert_each(&pool, &inserts).await;
                        // Only an answered statement tells the database's pace.
                        if inserted.is_ok() {
                            admission.statement_took(started.elapsed());
                        }
                        inserted
                    }
                })
            },
            by_key: batcher!(|pool, keys| store::by_keys(&pool, &keys).await),
            claim: PerStage::new(|stage| {
                let lease_s = stages[stage].lease.as_secs_f64();
                batcher!(|pool, ids| transitions::claim_many(&pool, stage, &ids, lease_s).await)
            }),
            succeed: PerStage::new(|stage| {
                let (pool, health, metrics) = (pool.clone(), health.clone(), metrics.clone());
                let transition = stage.success_transition();
                Coalescer::spawn(max, concurrency, move |done: Vec<Completion>| {
                    let (pool, health, metrics) = (pool.clone(), health.clone(), metrics.clone());
                    async move {
                        let claims: Vec<(Uuid, i32)> = done.iter().map(Completion::key).collect();
                        let succeed = || transitions::succeed_many(&pool, stage, &done);
                        let parts = (&health, &metrics, &pool);
                        persist_completion(parts, transition, &claims, succeed).await
                    }
                })
            }),
            bbox_requested: batcher!(persist "record_bbox_request_published", |pool, ids| {
                let stage = Stage::BboxRefinement;
                let stamped = orphans::record_published_many(&pool, stage, &ids).await;
                stamped.map(|()| vec![(); ids.len()])
            }),
        }
    }
}
