//! Everything a job's records go through, behind the consumer roles that
//! drive it: the Kafka intake (`intake`), the submit path shared with the API
//! (`submit`, `stamps`), the two stages' workers (`worker`, `bbox_worker`)
//! over the job lifecycle (`jobs`: claim, hold, end and hand over a stage,
//! with each transition's event), the batched statements of the hot path
//! (`batched`), the reapers that revive orphans (`reaper`) and the queue
//! census (`census`). Each role is a
//! [`RecordHandler`](crate::kafka::RecordHandler) run by the consumer
//! runtime, on the [`Services`] its process assembled.
//!
//! Every role claims before it works (a duplicate delivery loses the claim and is
//! skipped), completes with the claim's fencing token, and publishes one
//! `ExtractionEvent` per transition it won. A record counts as delivered only
//! after all of that was acknowledged.

mod batched;
mod bbox_worker;
pub mod bulk;
pub mod census;
mod intake;
pub mod jobs;
pub mod lease;
pub mod reaper;
pub mod retention;
mod stamps;
pub(crate) mod submit;
pub mod weights;
mod worker;

pub use batched::{BatchLimits, Batched};
pub use bbox_worker::BboxWorker;
pub use intake::{release_held, Holding, Intake, API_KEY_HEADER, TENANT_HEADER};
pub use jobs::{JobError, Jobs, RepublishError};
pub use reaper::{Kind as ReaperKind, Reaper, Sweep};
pub use stamps::Stamps;
pub use submit::{submit, submit_durably, DurableSubmitError};
pub use worker::ExtractionWorker;

use std::ops::Deref;
use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::admission::{Admission, AdmissionSettings};
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::domain::schedule::Weights;
pub use crate::domain::Stage;
use crate::domain::{pattern, ExtractionRequest, PerStage};
use crate::events::{decode, Event};
use crate::extract::{CpuPool, Extractors};
use crate::files::Files;
use crate::health::Health;
use crate::kafka::consumer::{ConsumerError, ConsumerRuntime};
use crate::kafka::{ConsumerSpec, HandlerError, Publisher, Record, RecordHandler};
use crate::metrics::Metrics;
use crate::quota::{FailedAuthentications, SubmitRates};
use crate::webhook::{WebhookSettings, Webhooks};

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
    /// The job lifecycle: claims, completions and their events.
    pub jobs: Jobs,
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
    /// Tenants' weights, for the share of a consumer's slots each gets when
    /// several have records waiting, and of the admission limit (kept
    /// current by `weights::keep_current`).
    pub weights: Weights,
    /// The files tenants uploaded.
    pub files: Files,
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
        let weights = Weights::default();
        let admission = Admission::new(AdmissionSettings::of(&settings), weights.clone());
        let stages = PerStage::new(|stage| settings.stage(stage));
        let limits = BatchLimits::of(&settings);
        let batched = Batched::new(limits, &stages, &pool, &health, &metrics, &admission);
        let stamps = Stamps::spawn(pool.clone(), settings.published_stamp_delay());
        let webhooks = Webhooks::start(
            WebhookSettings::of(&settings),
            pool.clone(),
            metrics.clone(),
        );
        let jobs = Jobs::new(
            &settings,
            pool.clone(),
            publisher.clone(),
            metrics.clone(),
            health.clone(),
            batched.clone(),
            webhooks.clone(),
        );
        let cpu = CpuPool::new(settings.extraction_threads);
        let extractors = Extractors::new(&settings, &metrics, cpu.clone(), (&pool, &weights))?;
        let key_cache = settings.api_key_cache_s.get();
        let answer_bound = settings.http_answer_timeout_s.get();
        let auth = Authenticator::new(pool.clone(), key_cache, answer_bound);
        let files = Files::new(&settings, pool.clone());
        Ok(Self(Arc::new(Parts {
            settings: Arc::new(settings),
            pool,
            publisher,
            metrics,
            batched,
            jobs,
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
            weights,
            files,
        })))
    }

    /// Compiles the patterns of `request` this process has not met (within
    /// the size limit, and of the fields the limit allows) on the compiler pool,
    /// so that validating the request on the runtime finds each compiled or
    /// refused already: a hundred new worst-case patterns take the runtime
    /// threads for tens of milliseconds (seconds in a debug build), and
    /// `/healthz` and every other request with them. A request of known
    /// patterns pays a lookup each.
    ///
    /// The compiling is never cut short: had it stopped at a deadline, the
    /// validation would compile the rest on the runtime, where nothing can
    /// stop it. A caller with a bound stops waiting instead (the REST
    /// backstop answers 503), and the patterns compiled meanwhile are there
    /// for the client's retry.
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
        // Only a panic is an error here; validation then compiles what is
        // still unknown.
        let _ = (self.compiler)
            .run_to_end(move || pattern::learn(&unknown, program))
            .await;
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
            read_ahead: settings.consumer_read_ahead,
            // The job stages' records name their lanes; the intake's and
            // the export streams' do not.
            pass_full_lanes: topic == settings.topic_submitted
                || topic == settings.topic_post_processing,
            priority_max_wait: settings.worker_priority_max_wait_s.get(),
            weights: self.weights.clone(),
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

/// Decodes a job's record: its event `E`, the job's id, and the job's span
/// (continuing the record's trace). A record that does not decode is poison.
fn job_record<E: Event>(
    record: &Record,
    id_of: impl Fn(&E) -> &str,
) -> Result<(E, Uuid, tracing::Span), HandlerError> {
    let (event, id) = decode_record(record, id_of)?;
    let span = crate::trace::job_span(id, record.traceparent().as_ref());
    Ok((event, id, span))
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
