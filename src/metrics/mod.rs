//! Prometheus metrics. One [`Metrics`] per process, created at start-up and passed
//! to every component that counts something; rendered at `/metrics`.
//!
//! Most series are counted where the thing happens. Three families are read
//! from elsewhere: the queue census (`census`, one process per interval asks
//! Postgres), librdkafka's statistics (`kafka`: consumer lag, the producer's
//! queue), and the process and pool collectors, read at each scrape.

mod areas;
mod kafka;
mod pool;
mod registrar;

pub use areas::{
    ConsumerMetrics, DependencyMetrics, DrainMetrics, HttpMetrics, JobMetrics, OffsetMetrics,
    ProducerMetrics, ReaperMetrics, StoreMetrics, StreamMetrics, WebhookMetrics,
};
pub use kafka::KafkaStats;
pub use pool::PoolCollector;
pub use registrar::DescribedMetric;
use registrar::{
    at_zero, counter_vec, float_counter_vec, float_gauge_vec, gauge_vec, histogram_vec, Registrar,
};

use std::ops::Deref;
use std::sync::Arc;

use prometheus::{Encoder, HistogramVec, IntCounterVec, IntGaugeVec, TextEncoder};

use crate::domain::Transition;

/// The process's metrics: a handle on one [`Families`]. Requests, batches
/// and roles each hold one, so a clone must be one reference count, not one
/// per metric family (cloning the families themselves took a tenth of
/// `serve`'s CPU under load).
#[derive(Clone)]
pub struct Metrics(Arc<Families>);

impl Deref for Metrics {
    type Target = Families;

    fn deref(&self) -> &Families {
        &self.0
    }
}

/// Every metric docstream exports, grouped by the area that counts it.
pub struct Families {
    registry: Registrar,
    /// Claims, transitions and stage work of jobs.
    pub jobs: JobMetrics,
    /// What the Kafka consumers receive, hold and give up on.
    pub consumer: ConsumerMetrics,
    /// How the consumers' drains ended.
    pub drains: DrainMetrics,
    /// The consumer groups' positions (librdkafka's statistics).
    pub offsets: OffsetMetrics,
    /// The publisher and the Kafka producer.
    pub producer: ProducerMetrics,
    /// The import and export streams.
    pub streams: StreamMetrics,
    /// Webhook deliveries.
    pub webhooks: WebhookMetrics,
    /// The HTTP server.
    pub http: HttpMetrics,
    /// The reapers and the orphans they find.
    pub reapers: ReaperMetrics,
    /// Kafka's and Postgres's health.
    pub dependencies: DependencyMetrics,
    /// The Postgres store and its pool.
    pub store: StoreMetrics,
    /// Calls to external extractors.
    pub extractors: ExtractorMetrics,
    /// The queue census (`pipeline::census`).
    pub census: CensusMetrics,
}

/// The queue census: one process per interval sets these, every other one
/// clears its own, so each series has one source at a time.
#[derive(Clone)]
pub struct CensusMetrics {
    /// `docstream_jobs{stage="extraction|bbox", status}`: open jobs
    /// (extraction: queued, running; bbox: pending, running).
    pub jobs: IntGaugeVec,
    /// `docstream_oldest_job_age_seconds{stage, status}`: the oldest open
    /// job's wait (queued, pending: since due) or run (running); 0 when none.
    pub oldest_age: prometheus::GaugeVec,
    /// `docstream_orphans_open{class}`: orphans open now, by class (1–6).
    pub orphans_open: IntGaugeVec,
    /// `docstream_oldest_orphan_age_seconds{class}`: since when the oldest
    /// open orphan of the class is one.
    pub oldest_orphan_age: prometheus::GaugeVec,
    /// `docstream_queued_jobs{tenant, priority}`: queued jobs of the tenants
    /// with the most (`store::census::QUEUED_TENANTS`), by priority; the
    /// others' together as `tenant="(others)"`.
    pub queued: IntGaugeVec,
    /// `docstream_tenant_file_bytes{tenant}`: bytes of files each tenant
    /// keeps (its quota is `DOCSTREAM_TENANT_MAX_FILE_BYTES`).
    pub file_bytes: IntGaugeVec,
    /// `docstream_tenant_files{tenant}`: files each tenant keeps.
    pub files: IntGaugeVec,
    /// `docstream_census_runs_total{outcome="taken|skipped|failed"}`: census
    /// ticks of this process: taken (its turn), skipped (another's), failed.
    pub runs: IntCounterVec,
}

impl CensusMetrics {
    fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            jobs: gauge_vec(
                registry,
                "docstream_jobs",
                "Open jobs, by stage and status (queue census).",
                &["stage", "status"],
            ),
            oldest_age: float_gauge_vec(
                registry,
                "docstream_oldest_job_age_seconds",
                "Age of the oldest open job, by stage and status: waiting since due, or running since claimed (queue census).",
                &["stage", "status"],
            ),
            orphans_open: gauge_vec(
                registry,
                "docstream_orphans_open",
                "Orphans open now, by class (queue census).",
                &["class"],
            ),
            oldest_orphan_age: float_gauge_vec(
                registry,
                "docstream_oldest_orphan_age_seconds",
                "Since when the oldest open orphan of each class is one (queue census).",
                &["class"],
            ),
            queued: gauge_vec(
                registry,
                "docstream_queued_jobs",
                "Queued jobs by tenant and priority, for the tenants with the most queued; the rest as tenant=\"(others)\" (queue census).",
                &["tenant", "priority"],
            ),
            file_bytes: gauge_vec(
                registry,
                "docstream_tenant_file_bytes",
                "Bytes of files each tenant keeps, against its quota (queue census).",
                &["tenant"],
            ),
            files: gauge_vec(
                registry,
                "docstream_tenant_files",
                "Files each tenant keeps (queue census).",
                &["tenant"],
            ),
            runs: counter_vec(
                registry,
                "docstream_census_runs_total",
                "Queue census ticks of this process: taken (its turn), skipped (another process's), failed.",
                &["outcome"],
            ),
        };
        at_zero(&metrics.runs, &[&["taken"], &["skipped"], &["failed"]]);
        metrics
    }

    /// Drops every census series: another process reports them now.
    pub fn clear(&self) {
        self.jobs.reset();
        self.oldest_age.reset();
        self.orphans_open.reset();
        self.oldest_orphan_age.reset();
        self.queued.reset();
        self.file_bytes.reset();
        self.files.reset();
    }
}

/// Calls to external extractors, each series labelled with the extractor's name.
#[derive(Clone)]
pub struct ExtractorMetrics {
    /// `docstream_extractor_calls_total{extractor, outcome}`: HTTP calls by how
    /// they ended: `succeeded`, `refused` (422/400), `invalid_answer`,
    /// `retry_after` (429/503 with Retry-After), `failed` (other statuses),
    /// `timed_out`, `unreachable`.
    pub calls: IntCounterVec,
    /// `docstream_extractor_call_seconds{extractor}`: one call, request to answer.
    pub call_seconds: HistogramVec,
    /// `docstream_extractor_in_flight_calls{extractor}`: calls in progress.
    pub in_flight: IntGaugeVec,
    /// `docstream_extractor_max_concurrency{extractor}`: the deployment-wide
    /// cap of in-flight calls (every worker exports it; take `max`).
    pub max_concurrency: IntGaugeVec,
    /// `docstream_extractor_shared_slots_held{extractor}`: slots of the
    /// deployment-wide cap this process holds (summed over processes: the
    /// slots in use).
    pub shared_slots_held: IntGaugeVec,
    /// `docstream_extractor_shared_slot_losses_total{extractor}`: leases of
    /// shared slots that ran out under a call (a stalled process).
    pub shared_slot_losses: IntCounterVec,
    /// `docstream_extractor_wait_seconds{extractor, wait="slot|tenant_slot|shared_slot|token"}`:
    /// time a call waited for this process's slot, then its tenant's share
    /// (extractors that give one), then a deployment-wide slot, then the
    /// rate limit.
    pub wait_seconds: HistogramVec,
    /// `docstream_extractor_retry_after_seconds_total{extractor}`: seconds
    /// waited because the provider answered with `Retry-After`.
    pub retry_after_seconds: prometheus::CounterVec,
}

impl ExtractorMetrics {
    fn register(registry: &Registrar) -> Self {
        let by_extractor = &["extractor"];
        Self {
            calls: counter_vec(
                registry,
                "docstream_extractor_calls_total",
                "Calls to external extractors, by extractor and outcome.",
                &["extractor", "outcome"],
            ),
            call_seconds: histogram_vec(
                registry,
                "docstream_extractor_call_seconds",
                "Duration of one call to an external extractor.",
                CALL_BUCKETS,
                by_extractor,
            ),
            in_flight: gauge_vec(
                registry,
                "docstream_extractor_in_flight_calls",
                "Calls to an external extractor in progress in this process.",
                by_extractor,
            ),
            max_concurrency: gauge_vec(
                registry,
                "docstream_extractor_max_concurrency",
                "The most calls the whole deployment makes to an external extractor at once.",
                by_extractor,
            ),
            shared_slots_held: gauge_vec(
                registry,
                "docstream_extractor_shared_slots_held",
                "Slots of an extractor's deployment-wide cap this process holds.",
                by_extractor,
            ),
            shared_slot_losses: counter_vec(
                registry,
                "docstream_extractor_shared_slot_losses_total",
                "Leases of deployment-wide slots that ran out while a call held them.",
                by_extractor,
            ),
            wait_seconds: histogram_vec(
                registry,
                "docstream_extractor_wait_seconds",
                "Time a call waited for this process's slot (wait=slot), its tenant's share of the extractor's slots (wait=tenant_slot, when it has one), a deployment-wide slot (wait=shared_slot), then the rate limit (wait=token).",
                &[[0.001, 0.005].as_slice(), CALL_BUCKETS].concat(),
                &["extractor", "wait"],
            ),
            retry_after_seconds: float_counter_vec(
                registry,
                "docstream_extractor_retry_after_seconds_total",
                "Seconds waited on Retry-After answers of an external extractor.",
                by_extractor,
            ),
        }
    }
}

/// Buckets of a call to an external extractor: model services take from
/// tens of milliseconds to many minutes.
const CALL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1200.0,
];

impl Metrics {
    /// Creates and registers every metric on a fresh registry.
    pub fn new() -> Self {
        let registry = Registrar::new();
        // RSS, CPU seconds, open and maximum file descriptors, threads:
        // process_resident_memory_bytes, process_cpu_seconds_total, ….
        registry.add(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        Self(Arc::new(Families {
            jobs: JobMetrics::register(&registry),
            consumer: ConsumerMetrics::register(&registry),
            drains: DrainMetrics::register(&registry),
            offsets: OffsetMetrics::register(&registry),
            producer: ProducerMetrics::register(&registry),
            streams: StreamMetrics::register(&registry),
            webhooks: WebhookMetrics::register(&registry),
            http: HttpMetrics::register(&registry),
            reapers: ReaperMetrics::register(&registry),
            dependencies: DependencyMetrics::register(&registry),
            store: StoreMetrics::register(&registry),
            extractors: ExtractorMetrics::register(&registry),
            census: CensusMetrics::register(&registry),
            registry,
        }))
    }

    /// Counts one attempt of `transition`: won when the store returned a row.
    pub fn transition<T>(&self, transition: Transition, outcome: &Option<T>) {
        let label = if outcome.is_some() { "won" } else { "lost" };
        self.jobs
            .transitions
            .with_label_values(&[transition.as_str(), label])
            .inc();
    }

    /// Adds a collector read at each scrape (the pool's).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        self.registry.add(collector);
    }

    /// Every metric registered so far, by name.
    pub fn described(&self) -> Vec<DescribedMetric> {
        let mut described = self
            .registry
            .described
            .lock()
            .expect("not poisoned")
            .clone();
        described.sort_by(|a, b| a.name.cmp(&b.name));
        described
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.registry.gather(), &mut buffer)
            .expect("text encoding cannot fail");
        String::from_utf8(buffer).expect("Prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
