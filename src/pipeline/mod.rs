//! The pipeline roles: the intake, the extraction worker and the bbox worker, each a
//! [`RecordHandler`](crate::kafka::RecordHandler) run by the consumer runtime.
//!
//! Every role claims before it works (a duplicate delivery loses the claim and is
//! skipped), completes with the claim's fencing token, and publishes one
//! `ExtractionEvent` per transition it won. A record counts as delivered only
//! after all of that was acknowledged.

mod batched;
mod bbox_worker;
pub mod census;
mod complete;
mod intake;
pub mod lease;
mod persist;
pub mod reaper;
mod stamps;
pub mod submit;
mod worker;

pub use batched::Batched;
pub use bbox_worker::BboxWorker;
pub use intake::{release_held, Holding, Intake, API_KEY_HEADER, TENANT_HEADER};
pub use reaper::{Kind as ReaperKind, Reaper, Sweep};
pub use stamps::Stamps;
pub use submit::{submit, submit_durably, DurableSubmitError};
pub use worker::ExtractionWorker;

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::admission::{Admission, AdmissionSettings};
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::domain::{pattern, ExtractionRequest, Transition};
use crate::events::{
    decode, Event, ExtractionEvent, ExtractionSubmitted, PostProcessingRequested, PublishReason,
};
use crate::extract::{CpuPool, Deadline, Extractors};
use crate::failpoints;
use crate::health::Health;
use crate::kafka::consumer::{ConsumerError, ConsumerRuntime};
use crate::kafka::{ConsumerSpec, HandlerError, PublishError, Publisher, Record, RecordHandler};
use crate::metrics::Metrics;
use crate::quota::{FailedAuthentications, SubmitRates};
use crate::store::{leases, orphans, Claim, Extraction, StoreError};
use crate::webhook::Webhooks;

/// What every role shares: a handle on one [`Parts`]. Each request, record
/// and spawned task holds one, so a clone is one reference count.
#[derive(Clone)]
pub struct Services(Arc<Parts>);

impl Deref for Services {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

/// What every role shares: settings, the pool, the producer and the metrics.
pub struct Parts {
    /// Settings of this process.
    pub settings: Arc<Settings>,
    /// Postgres pool.
    pub pool: PgPool,
    /// The process's producer.
    pub publisher: Publisher,
    /// The process's metrics.
    pub metrics: Metrics,
    /// The hot-path transitions, grouped across concurrent records.
    pub batched: Batched,
    /// This process's webhook dispatcher.
    pub webhooks: Webhooks,
    /// The extractors the worker can run, with their per-process limits.
    pub extractors: Extractors,
    /// Where CPU-bound work runs (the rule extractor, bbox grounding).
    pub cpu: CpuPool,
    /// Where a request's new patterns compile: a pool of its own, so that
    /// extractions holding every thread of `cpu` (a slow pattern runs until
    /// its deadline) never hold up a submit.
    pub compiler: CpuPool,
    /// The "published" stamps of this process's new jobs.
    pub stamps: Stamps,
    /// What this process knows of Kafka's and Postgres's outages.
    pub health: Health,
    /// API keys to callers (the API and the Kafka intake).
    pub auth: Authenticator,
    /// This process's per-tenant submit rates.
    pub submit_rates: SubmitRates,
    /// This process's count of requests without a valid key, per peer.
    pub failed_authentications: FailedAuthentications,
    /// The limit on this process's submits in flight (the HTTP route's).
    pub admission: Admission,
}

impl Services {
    /// Services on `pool` and `publisher`; starts the statement batchers.
    pub fn new(
        settings: Settings,
        pool: PgPool,
        publisher: Publisher,
        metrics: Metrics,
        health: Health,
    ) -> Result<Self, reqwest::Error> {
        let admission = Admission::new(AdmissionSettings::of(&settings));
        let batched = Batched::new(&settings, &pool, &health, &metrics, &admission);
        let stamps = Stamps::spawn(pool.clone(), settings.published_stamp_delay());
        let webhooks = Webhooks::start(&settings, pool.clone(), metrics.clone());
        let cpu = CpuPool::new(settings.extraction_threads);
        let extractors = Extractors::new(&settings, &metrics, cpu.clone())?;
        let key_cache = settings.api_key_cache_s.get();
        let answer_bound = settings.http_answer_timeout_s.get();
        let auth = Authenticator::new(pool.clone(), key_cache, answer_bound);
        Ok(Self(Arc::new(Parts {
            settings: Arc::new(settings),
            pool,
            publisher,
            metrics,
            batched,
            webhooks,
            extractors,
            cpu,
            compiler: CpuPool::new(0),
            stamps,
            health,
            auth,
            submit_rates: SubmitRates::default(),
            failed_authentications: FailedAuthentications::default(),
            admission,
        })))
    }

    /// Compiles the patterns of `request` this process has not met (within
    /// the size limit, and of the fields the limit allows) on the compiler pool,
    /// so that validating the request on the runtime finds each compiled or
    /// refused already: a hundred new worst-case patterns take the runtime
    /// threads for tens of milliseconds, and `/healthz` and every other
    /// request with them. A request of known patterns pays a lookup each.
    pub async fn learn_patterns(&self, request: &ExtractionRequest) {
        let limits = self.settings.request_limits();
        let program = limits.pattern_program_bytes;
        let unknown: Vec<String> = (request.fields.iter().take(limits.fields))
            .filter_map(|field| field.pattern.as_deref())
            .filter(|p| p.len() <= limits.pattern_bytes && !pattern::known(p, program))
            .map(str::to_owned)
            .collect();
        if unknown.is_empty() {
            return;
        }
        let learn = move |_: &Deadline| {
            pattern::learn(&unknown, program);
            Ok(())
        };
        // Whatever the pool says (a deadline past), validation compiles
        // what is still unknown.
        let budget = self.settings.http_answer_timeout_s.get();
        let _ = self.compiler.run(budget, usize::MAX, learn).await;
    }

    /// Publishes the `ExtractionEvent` of a won transition and waits for its ack.
    /// The event is built at once, so the future does not hold on to `row`
    /// (which may carry a whole document) while it waits.
    pub fn emit<'s>(
        &'s self,
        transition: Transition,
        row: &Extraction,
        token: Option<i32>,
        reason: PublishReason,
    ) -> impl Future<Output = Result<(), HandlerError>> + use<'s> {
        let event = ExtractionEvent::of(transition, row, token, reason);
        let id = row.id;
        let topic = self.settings.topic(&self.settings.topic_events);
        async move {
            self.publisher
                .publish_job(&topic, id, &event)
                .await
                .map_err(|e| HandlerError::Transient(e.to_string()))
        }
    }

    /// Concludes a completing transition of claim `token`: publishes its event
    /// when it won; when it lost, the claim was taken over, so the work is
    /// dropped without side effects and counted as a stale completion.
    async fn conclude(
        &self,
        stage: Stage,
        transition: Transition,
        (id, token): (Uuid, i32),
        row: Option<Extraction>,
        reason: PublishReason,
    ) -> Result<Option<Extraction>, HandlerError> {
        self.metrics.transition(transition, &row);
        match row {
            Some(row) => {
                if row.webhook_id.is_some() {
                    // The delivery is durable with the state change; a crash
                    // here leaves it to the webhook reaper (orphan class 6).
                    failpoints::hit("webhook.after_state_change")
                        .await
                        .map_err(transient)?;
                    self.webhooks.wake(row.webhook_id.as_deref(), row.tenant_id);
                }
                self.emit(transition, &row, Some(token), reason).await?;
                Ok(Some(row))
            }
            None => {
                self.stale(stage, id, token, "completion");
                Ok(None)
            }
        }
    }

    /// Runs a completing `statement` until the database answers (see `persist`).
    async fn persist<T, F, Fut>(&self, name: &'static str, statement: F) -> Result<T, HandlerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let persisted = persist::persist(&self.health, &self.metrics, name, statement);
        persisted.await.map_err(transient)
    }

    /// Work under a claim that is no longer ours, found at a heartbeat or at
    /// completion: dropped and counted.
    fn stale(&self, stage: Stage, id: Uuid, token: i32, at: &'static str) {
        let labels = [stage.as_str(), at];
        self.metrics
            .jobs
            .stale_completions
            .with_label_values(&labels)
            .inc();
        tracing::warn!(%id, token, stage = stage.as_str(), at, "stale holder: the claim was taken over; work dropped");
    }

    /// Claims with `try_claim`. When another holder's lease is live, waits for it
    /// heartbeat by heartbeat, for up to two leases: a record redelivered after
    /// its holder died (its partition moved on) then takes the job over as soon
    /// as the lease expires, without waiting behind the backlog for a reaper's
    /// republish. `None` is a duplicate delivery to skip; an event for a row that
    /// does not exist is poison. `stop` (revoke, shutdown) ends the wait with the
    /// record undelivered.
    async fn claim_or_wait<F, Fut, E>(
        &self,
        stage: Stage,
        id: Uuid,
        stop: &CancellationToken,
        mut try_claim: F,
    ) -> Result<Option<Claim>, HandlerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<Claim>, E>>,
        E: std::fmt::Display,
    {
        let settings = &self.settings;
        let lease_s = match stage {
            Stage::Extraction => settings.extraction_run_lease_s,
            Stage::BboxRefinement => settings.bbox_refinement_lease_s,
        };
        let give_up = tokio::time::Instant::now() + lease_s.get() * 2;
        loop {
            let claim = try_claim().await.map_err(transient)?;
            if claim.is_some() {
                self.metrics.transition(stage.claim_transition(), &claim);
                return Ok(claim);
            }
            let live = match stage {
                Stage::Extraction => leases::extraction_claim_is_live(&self.pool, id).await,
                Stage::BboxRefinement => leases::bbox_claim_is_live(&self.pool, id).await,
            };
            match live.map_err(transient)? {
                None => {
                    return Err(HandlerError::Poison {
                        kind: "missing_row",
                        reason: format!("no extraction {id}"),
                    })
                }
                // Stopping (revoke or shutdown) ends the wait undelivered: the
                // record is not committed, and the partition's next owner waits
                // for the lease in our place (its holder may be dead).
                Some(true) if stop.is_cancelled() => {
                    return Err(HandlerError::Transient(format!(
                        "stopped while {id} was held under a live lease; left for the next owner"
                    )));
                }
                Some(true) if tokio::time::Instant::now() < give_up => {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(settings.heartbeat_interval_s.get()) => {}
                    }
                }
                // The holder has kept its lease for two leases: it is alive and
                // owns the job; this delivery is a duplicate.
                Some(_) => {
                    self.metrics.transition(stage.claim_transition(), &claim);
                    self.metrics
                        .jobs
                        .claim_losers
                        .with_label_values(&[stage.as_str()])
                        .inc();
                    tracing::debug!(%id, stage = stage.as_str(), "claim lost; delivery skipped");
                    return Ok(None);
                }
            }
        }
    }

    /// Runs `handler` on `topic` as a member of `group` until `shutdown`.
    pub async fn consume<H: RecordHandler>(
        &self,
        group: &str,
        topic: &str,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<(), ConsumerError> {
        let spec = self.consumer_spec(group, topic);
        self.consume_with(spec, handler, shutdown)?.run().await
    }

    /// The consumer of `group` on `topic` as the settings describe it.
    pub fn consumer_spec(&self, group: &str, topic: &str) -> ConsumerSpec {
        let settings = &self.settings;
        ConsumerSpec {
            brokers: settings.kafka_brokers.clone(),
            group: settings.group(group),
            topic: settings.topic(topic),
            dlq_topic: settings.topic(&settings.topic_dlq),
            dlq_excerpt_bytes: settings.dlq_excerpt_bytes,
            max_in_flight: settings.consumer_max_in_flight,
            drain_timeout: settings.subscriber_drain_timeout_s.get(),
            rebalance_drain_timeout: settings.rebalance_drain_timeout_s.get(),
            session_timeout_ms: settings.kafka_session_timeout_ms,
            group_protocol: settings.kafka_group_protocol,
            prefetch_kbytes: settings.consumer_prefetch_kbytes,
            from_earliest: true,
            statistics_interval_ms: settings.kafka_statistics_interval_ms(),
        }
    }

    /// A consumer per `spec` running `handler`, subscribed and ready to run
    /// until `shutdown`.
    pub fn consume_with<H: RecordHandler>(
        &self,
        spec: ConsumerSpec,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerRuntime<H>, ConsumerError> {
        ConsumerRuntime::new(
            spec,
            Arc::new(handler),
            self.publisher.clone(),
            self.metrics.clone(),
            self.health.clone(),
            shutdown,
        )
    }
}

/// Why a republish did not fully happen.
#[derive(Debug, thiserror::Error)]
pub enum RepublishError {
    /// The event was not acknowledged: nothing changed, try again later.
    #[error("republish failed: {0}")]
    Publish(#[from] PublishError),
    /// The event went out, but its stamp was not written: the job may be
    /// republished again before its threshold (harmless, since claims are
    /// atomic).
    #[error("republished, but not recorded: {0}")]
    Record(#[from] StoreError),
}

impl Services {
    /// Publishes again the event that hands job `id`'s `stage` to its
    /// workers (`extraction.submitted`, or the bbox request), with `reason`,
    /// and once the broker acknowledged it stamps the row as republished.
    /// The reapers and `docstream reclaim` revive jobs through here.
    pub async fn republish(
        &self,
        stage: Stage,
        id: Uuid,
        reason: PublishReason,
    ) -> Result<(), RepublishError> {
        let settings = &self.settings;
        match stage {
            Stage::Extraction => {
                let topic = settings.topic(&settings.topic_submitted);
                let event = ExtractionSubmitted::new(id, reason);
                self.publisher.publish_job(&topic, id, &event).await?;
                orphans::record_published(&self.pool, id).await?;
            }
            Stage::BboxRefinement => {
                let topic = settings.topic(&settings.topic_post_processing);
                let event = PostProcessingRequested::bbox_refinement(id, reason);
                self.publisher.publish_job(&topic, id, &event).await?;
                orphans::record_bbox_request_published(&self.pool, id).await?;
            }
        }
        Ok(())
    }
}

/// The two claimable stages of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The extraction itself.
    Extraction,
    /// Its bbox refinement.
    BboxRefinement,
}

impl Stage {
    /// Label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Extraction => "extraction",
            Self::BboxRefinement => "bbox_refinement",
        }
    }

    fn claim_transition(self) -> Transition {
        match self {
            Self::Extraction => Transition::MarkRunning,
            Self::BboxRefinement => Transition::MarkBboxRefinementRunning,
        }
    }
}

/// Decodes a record's value as `E` and its extraction id; failures are poison.
fn decode_record<E: Event>(
    record: &Record,
    id_of: impl Fn(&E) -> &str,
) -> Result<(E, Uuid), HandlerError> {
    let payload = record.payload.as_deref().unwrap_or_default();
    let event: E = decode(payload)?;
    let id = Uuid::parse_str(id_of(&event)).map_err(|e| HandlerError::Poison {
        kind: "undecodable",
        reason: format!("extraction_id is not a UUID: {e}"),
    })?;
    Ok((event, id))
}

fn transient(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::Transient(e.to_string())
}
