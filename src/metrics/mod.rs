//! Prometheus metrics. One [`Metrics`] per process, created at start-up and passed
//! to every component that counts something; rendered at `/metrics`.
//!
//! Most series are counted where the thing happens. Three families are read
//! from elsewhere: the queue census (`census`, one process per interval asks
//! Postgres), librdkafka's statistics (`kafka`: consumer lag, the producer's
//! queue), and the process and pool collectors, read at each scrape.

mod kafka;
mod pool;

pub use kafka::KafkaStats;
pub use pool::PoolCollector;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::domain::Transition;

/// Every metric docstream exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `docstream_transitions_total{transition, outcome="won|lost"}`.
    pub transitions: IntCounterVec,
    /// `docstream_claim_losers_total{claim}`: duplicate deliveries skipped.
    pub claim_losers: IntCounterVec,
    /// `docstream_events_consumed_total{topic}`.
    pub events_consumed: IntCounterVec,
    /// `docstream_events_produced_total{topic}`: acknowledged by the broker.
    pub events_produced: IntCounterVec,
    /// `docstream_publish_failures_total{topic}`.
    pub publish_failures: IntCounterVec,
    /// `docstream_handler_errors_total{topic, kind}`: records whose handling failed.
    pub handler_errors: IntCounterVec,
    /// `docstream_in_flight_records{topic, partition}`.
    pub in_flight: IntGaugeVec,
    /// `docstream_extraction_duration_seconds{outcome}`: extractor run time.
    pub extraction_duration: HistogramVec,
    /// `docstream_bbox_refinement_duration_seconds`.
    pub bbox_duration: Histogram,
    /// `docstream_http_requests_total{route, status}`.
    pub http_requests: IntCounterVec,
    /// `docstream_stale_completions_total{claim, stage}`: work of a holder whose
    /// claim was taken over, dropped without side effects.
    pub stale_completions: IntCounterVec,
    /// `docstream_retries_scheduled_total`: attempts requeued with a backoff.
    pub retries_scheduled: IntCounterVec,
    /// `docstream_orphans_found_total{class}`.
    pub orphans_found: IntCounterVec,
    /// `docstream_orphans_republished_total{class}`.
    pub orphans_republished: IntCounterVec,
    /// `docstream_reaper_sweeps_total{reaper, outcome}`.
    pub reaper_sweeps: IntCounterVec,
    /// `docstream_recovery_seconds{claim}`: from lease expiry or orphaning to the
    /// claim that recovered the job.
    pub recovery: HistogramVec,
    /// `docstream_consumer_paused_partitions{topic}`: paused for backpressure.
    pub paused_partitions: IntGaugeVec,
    /// `docstream_consumer_pauses_total{topic}`: times the in-flight bound was hit.
    pub consumer_pauses: IntCounterVec,
    /// `docstream_rebalance_drains_total{outcome="drained|timed_out"}`.
    pub rebalance_drains: IntCounterVec,
    /// `docstream_records_abandoned_total{cause="revoke|shutdown"}`: in-flight
    /// records a drain gave up on; not committed, so redelivered.
    pub records_abandoned: IntCounterVec,
    /// `docstream_consumer_shutdowns_total{kind="graceful|forced"}`.
    pub consumer_shutdowns: IntCounterVec,
    /// `docstream_dead_letters_total{reason}`: poison records acknowledged by the DLQ.
    pub dead_letters: IntCounterVec,
    /// `docstream_dead_letter_failures_total`: dead letters the broker did
    /// not take (each is retried with its record).
    pub dead_letter_failures: prometheus::IntCounter,
    /// `docstream_publisher_queue_depth`: records waiting for the send point.
    pub publisher_queue_depth: prometheus::IntGauge,
    /// `docstream_http_shutdown_rejections_total`: requests answered 503 while draining.
    pub http_shutdown_rejections: prometheus::IntCounter,
    /// `docstream_stream_queue_depth{stream}`: frames read and not yet answered.
    pub stream_queue_depth: IntGaugeVec,
    /// `docstream_stream_frames_total{stream, outcome="accepted|refused"}`.
    pub stream_frames: IntCounterVec,
    /// `docstream_stream_closes_total{stream, kind="client|graceful|forced|too_large"}`:
    /// closed by the client, by the server after a drain on shutdown, by the
    /// server without one (drain timed out, client kept failing, Kafka
    /// failed), or (import) for a frame past the size limit.
    pub stream_closes: IntCounterVec,
    /// `docstream_stream_dropped_total{stream, strategy}`: events an export
    /// stream dropped for a slow client, by backpressure strategy.
    pub stream_dropped: IntCounterVec,
    /// `docstream_stream_redeliveries_total{stream}`: events sent to an export
    /// client and not acknowledged when its stream ended; the group's next
    /// connection receives them again.
    pub stream_redeliveries: IntCounterVec,
    /// `docstream_webhook_deliveries_total{outcome="delivered|retried|failed|disabled|forbidden"}`:
    /// webhook attempts by how they ended (`retried`: failed, another is scheduled).
    pub webhook_deliveries: IntCounterVec,
    /// `docstream_webhook_attempts_total`: HTTP requests made to webhook endpoints.
    pub webhook_attempts: prometheus::IntCounter,
    /// `docstream_webhook_disabled_endpoints_total`: endpoints disabled after 410 Gone.
    pub webhook_disabled_endpoints: prometheus::IntCounter,
    /// `docstream_webhook_ssrf_rejections_total{stage="submit|send"}`: webhook
    /// URLs refused by the SSRF guard.
    pub webhook_ssrf_rejections: IntCounterVec,
    /// Calls to external extractors.
    pub extractors: ExtractorMetrics,
    /// `docstream_dependency_up{dependency="kafka|postgres"}`: 1 while the last
    /// call or probe to it succeeded.
    pub dependency_up: IntGaugeVec,
    /// `docstream_dependency_outages_total{dependency}`: outages seen (each
    /// counted at its first failure, however many calls failed during it).
    pub dependency_outages: IntCounterVec,
    /// `docstream_store_retries_total{statement}`: statements run again because
    /// the connection failed (the job's attempts are untouched).
    pub store_retries: IntCounterVec,
    /// `docstream_producer_restarts_total`: producers replaced after a fatal error.
    pub producer_restarts: prometheus::IntCounter,
    /// `docstream_http_request_duration_seconds{route, status}`: arrival to
    /// answer (for a WebSocket route, to the upgrade).
    pub http_duration: HistogramVec,
    /// The queue census (`pipeline::census`).
    pub census: CensusMetrics,
    /// `docstream_consumer_lag{group, topic, partition}` and
    /// `docstream_consumer_committed_offset{…}`, from librdkafka's statistics.
    pub consumer_lag: IntGaugeVec,
    /// See [`Metrics::consumer_lag`].
    pub consumer_committed_offset: IntGaugeVec,
    /// `docstream_producer_queue_records`: records in librdkafka's producer
    /// queue, not yet acknowledged (from its statistics).
    pub producer_queue_records: prometheus::IntGauge,
    /// `docstream_producer_in_flight_requests`: produce requests sent to a
    /// broker and waiting for its answer (from its statistics).
    pub producer_in_flight_requests: prometheus::IntGauge,
    /// `docstream_producer_delivery_seconds{topic}`: publish to the broker's
    /// acknowledgement, for acknowledged records.
    pub producer_delivery: HistogramVec,
    /// `docstream_webhook_delivery_seconds{outcome="delivered|gone|failed|unanswered"}`:
    /// one webhook request, sent to answered (or to its failure).
    pub webhook_delivery: HistogramVec,
    /// `docstream_db_pool_acquire_seconds`: the wait for a pooled connection,
    /// sampled by every Postgres probe.
    pub db_pool_acquire: Histogram,
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
    /// `docstream_census_runs_total{outcome="taken|skipped|failed"}`: census
    /// ticks of this process: taken (its turn), skipped (another's), failed.
    pub runs: IntCounterVec,
}

impl CensusMetrics {
    fn register(registry: &Registry) -> Self {
        Self {
            jobs: register(
                registry,
                IntGaugeVec::new(
                    Opts::new("docstream_jobs", "Open jobs, by stage and status (queue census)."),
                    &["stage", "status"],
                ),
            ),
            oldest_age: register(
                registry,
                prometheus::GaugeVec::new(
                    Opts::new(
                        "docstream_oldest_job_age_seconds",
                        "Age of the oldest open job, by stage and status: waiting since due, or running since claimed (queue census).",
                    ),
                    &["stage", "status"],
                ),
            ),
            orphans_open: register(
                registry,
                IntGaugeVec::new(
                    Opts::new("docstream_orphans_open", "Orphans open now, by class (queue census)."),
                    &["class"],
                ),
            ),
            oldest_orphan_age: register(
                registry,
                prometheus::GaugeVec::new(
                    Opts::new(
                        "docstream_oldest_orphan_age_seconds",
                        "Since when the oldest open orphan of each class is one (queue census).",
                    ),
                    &["class"],
                ),
            ),
            runs: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "docstream_census_runs_total",
                        "Queue census ticks of this process: taken (its turn), skipped (another process's), failed.",
                    ),
                    &["outcome"],
                ),
            ),
        }
    }

    /// Drops every census series: another process reports them now.
    pub fn clear(&self) {
        self.jobs.reset();
        self.oldest_age.reset();
        self.orphans_open.reset();
        self.oldest_orphan_age.reset();
    }
}

/// Registers `metric` (created by `new`) on `registry` and returns it.
fn register<M>(registry: &Registry, metric: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
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
    /// `docstream_extractor_max_concurrency{extractor}`: the cap of in-flight calls.
    pub max_concurrency: IntGaugeVec,
    /// `docstream_extractor_wait_seconds{extractor, wait="slot|token"}`: time a
    /// call waited for a concurrency slot, then for the rate limit.
    pub wait_seconds: HistogramVec,
    /// `docstream_extractor_retry_after_seconds_total{extractor}`: seconds
    /// waited because the provider answered with `Retry-After`.
    pub retry_after_seconds: prometheus::CounterVec,
}

impl ExtractorMetrics {
    fn register(registry: &Registry) -> Self {
        let calls = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "docstream_extractor_calls_total",
                    "Calls to external extractors, by extractor and outcome.",
                ),
                &["extractor", "outcome"],
            ),
        );
        // Model services take from tens of milliseconds to many minutes.
        let call_buckets = vec![
            0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            600.0, 1200.0,
        ];
        let call_seconds = register(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "docstream_extractor_call_seconds",
                    "Duration of one call to an external extractor.",
                )
                .buckets(call_buckets.clone()),
                &["extractor"],
            ),
        );
        let in_flight = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_extractor_in_flight_calls",
                    "Calls to an external extractor in progress in this process.",
                ),
                &["extractor"],
            ),
        );
        let max_concurrency = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_extractor_max_concurrency",
                    "The most calls this process makes to an external extractor at once.",
                ),
                &["extractor"],
            ),
        );
        let wait_seconds = register(registry, HistogramVec::new(
            HistogramOpts::new(
                "docstream_extractor_wait_seconds",
                "Time a call waited for a concurrency slot (wait=slot), then for the rate limit (wait=token).",
            )
            .buckets(vec![0.001, 0.005].into_iter().chain(call_buckets).collect()),
            &["extractor", "wait"],
        ));
        let retry_after_seconds = register(
            registry,
            prometheus::CounterVec::new(
                Opts::new(
                    "docstream_extractor_retry_after_seconds_total",
                    "Seconds waited on Retry-After answers of an external extractor.",
                ),
                &["extractor"],
            ),
        );
        Self {
            calls,
            call_seconds,
            in_flight,
            max_concurrency,
            wait_seconds,
            retry_after_seconds,
        }
    }
}

impl Metrics {
    /// Creates and registers every metric on a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let transitions = counter(
            "docstream_transitions_total",
            "State transitions attempted, by transition and outcome (won or lost).",
            &["transition", "outcome"],
        );
        let claim_losers = counter(
            "docstream_claim_losers_total",
            "Deliveries whose claim was lost to another holder or a finished job.",
            &["claim"],
        );
        let events_consumed = counter(
            "docstream_events_consumed_total",
            "Records received from Kafka.",
            &["topic"],
        );
        let events_produced = counter(
            "docstream_events_produced_total",
            "Records acknowledged by the broker.",
            &["topic"],
        );
        let publish_failures = counter(
            "docstream_publish_failures_total",
            "Records the broker did not acknowledge.",
            &["topic"],
        );
        let handler_errors = counter(
            "docstream_handler_errors_total",
            "Records whose handling failed, by kind.",
            &["topic", "kind"],
        );
        let http_requests = counter(
            "docstream_http_requests_total",
            "HTTP requests answered, by route and status code.",
            &["route", "status"],
        );
        let stale_completions = counter(
            "docstream_stale_completions_total",
            "Work of a holder whose claim was taken over, dropped without side effects.",
            &["claim", "stage"],
        );
        let retries_scheduled = counter(
            "docstream_retries_scheduled_total",
            "Failed attempts requeued with a backoff.",
            &["claim"],
        );
        let orphans_found = counter(
            "docstream_orphans_found_total",
            "Orphans a reaper found, by orphan class.",
            &["class"],
        );
        let orphans_republished = counter(
            "docstream_orphans_republished_total",
            "Orphans whose event a reaper republished (acknowledged), by class.",
            &["class"],
        );
        let reaper_sweeps = counter(
            "docstream_reaper_sweeps_total",
            "Reaper sweeps, by reaper and outcome (swept, locked_elsewhere, failed).",
            &["reaper", "outcome"],
        );
        let consumer_pauses = counter(
            "docstream_consumer_pauses_total",
            "Times a consumer hit its in-flight bound and paused its partitions.",
            &["topic"],
        );
        let rebalance_drains = counter(
            "docstream_rebalance_drains_total",
            "Revokes, by whether their in-flight records drained within the budget.",
            &["outcome"],
        );
        let records_abandoned = counter(
            "docstream_records_abandoned_total",
            "In-flight records a drain gave up on (not committed; redelivered).",
            &["cause"],
        );
        let consumer_shutdowns = counter(
            "docstream_consumer_shutdowns_total",
            "Consumer shutdowns: graceful (drained) or forced (drain timed out).",
            &["kind"],
        );
        let stream_frames = counter(
            "docstream_stream_frames_total",
            "Frames of a stream, accepted (submitted) or refused with an error.",
            &["stream", "outcome"],
        );
        let stream_closes = counter(
            "docstream_stream_closes_total",
            "Streams closed by the client, by the server after a drain (graceful), or without one (forced).",
            &["stream", "kind"],
        );
        let stream_dropped = counter(
            "docstream_stream_dropped_total",
            "Events an export stream dropped for a slow client, by backpressure strategy.",
            &["stream", "strategy"],
        );
        let stream_redeliveries = counter(
            "docstream_stream_redeliveries_total",
            "Events sent on a stream and not acknowledged when it ended: sent again on the next connection.",
            &["stream"],
        );
        let webhook_deliveries = counter(
            "docstream_webhook_deliveries_total",
            "Webhook attempts by how they ended: delivered, retried, failed (given up), disabled (410 Gone), forbidden (SSRF guard).",
            &["outcome"],
        );
        let webhook_ssrf_rejections = counter(
            "docstream_webhook_ssrf_rejections_total",
            "Webhook URLs refused by the SSRF guard, at submit or at send.",
            &["stage"],
        );
        let webhook_attempts = register(
            &registry,
            prometheus::IntCounter::new(
                "docstream_webhook_attempts_total",
                "HTTP requests made to webhook endpoints.",
            ),
        );
        let webhook_disabled_endpoints = register(
            &registry,
            prometheus::IntCounter::new(
                "docstream_webhook_disabled_endpoints_total",
                "Webhook endpoints disabled after answering 410 Gone.",
            ),
        );
        let stream_queue_depth = register(&registry, IntGaugeVec::new(
            Opts::new(
                "docstream_stream_queue_depth",
                "Import: frames read and not yet answered. Export: events waiting for the socket.",
            ),
            &["stream"],
        ));
        let dead_letters = counter(
            "docstream_dead_letters_total",
            "Poison records acknowledged by the DLQ, by reason.",
            &["reason"],
        );
        let dead_letter_failures = register(
            &registry,
            prometheus::IntCounter::new(
                "docstream_dead_letter_failures_total",
                "Dead letters the broker did not take; each is retried with its record.",
            ),
        );
        let paused_partitions = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_consumer_paused_partitions",
                    "Partitions paused for backpressure.",
                ),
                &["topic"],
            ),
        );
        let publisher_queue_depth = register(
            &registry,
            prometheus::IntGauge::new(
                "docstream_publisher_queue_depth",
                "Records waiting in the publisher's queue for the send point.",
            ),
        );
        let http_shutdown_rejections = register(
            &registry,
            prometheus::IntCounter::new(
                "docstream_http_shutdown_rejections_total",
                "Requests answered 503 because the server was shutting down.",
            ),
        );
        let dependency_up = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_dependency_up",
                    "1 while the dependency answers this process's calls and probes, else 0.",
                ),
                &["dependency"],
            ),
        );
        let dependency_outages = counter(
            "docstream_dependency_outages_total",
            "Outages of a dependency this process saw (one per outage).",
            &["dependency"],
        );
        let store_retries = counter(
            "docstream_store_retries_total",
            "Statements run again after their connection failed.",
            &["statement"],
        );
        let producer_restarts = register(
            &registry,
            prometheus::IntCounter::new(
                "docstream_producer_restarts_total",
                "Kafka producers replaced after a fatal producer error.",
            ),
        );
        let in_flight = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_in_flight_records",
                    "Records received and not yet delivered.",
                ),
                &["topic", "partition"],
            ),
        );
        let buckets = vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ];
        let extraction_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "docstream_extraction_duration_seconds",
                    "Time the extractor took, by outcome.",
                )
                .buckets(buckets.clone()),
                &["outcome"],
            ),
        );
        let bbox_duration = register(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "docstream_bbox_refinement_duration_seconds",
                    "Time bbox grounding took.",
                )
                .buckets(buckets),
            ),
        );
        let recovery = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "docstream_recovery_seconds",
                    "From lease expiry or orphaning to the claim that recovered the job.",
                )
                .buckets(vec![
                    0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
                ]),
                &["claim"],
            ),
        );
        let http_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "docstream_http_request_duration_seconds",
                    "HTTP requests, arrival to answer, by route and status code.",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 3.0,
                    5.0, 10.0,
                ]),
                &["route", "status"],
            ),
        );
        let census = CensusMetrics::register(&registry);
        let partition = &["group", "topic", "partition"];
        let consumer_lag = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_consumer_lag",
                    "Records on an assigned partition past the group's committed offset (librdkafka statistics).",
                ),
                partition,
            ),
        );
        let consumer_committed_offset = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "docstream_consumer_committed_offset",
                    "The group's committed offset on an assigned partition (librdkafka statistics).",
                ),
                partition,
            ),
        );
        let producer_queue_records = register(
            &registry,
            prometheus::IntGauge::new(
                "docstream_producer_queue_records",
                "Records in the Kafka producer's queue, not yet acknowledged (librdkafka statistics).",
            ),
        );
        let producer_in_flight_requests = register(
            &registry,
            prometheus::IntGauge::new(
                "docstream_producer_in_flight_requests",
                "Produce requests sent to a broker and waiting for its answer (librdkafka statistics).",
            ),
        );
        let latency_buckets = vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ];
        let producer_delivery = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "docstream_producer_delivery_seconds",
                    "Publish to the broker's acknowledgement, for acknowledged records, by topic.",
                )
                .buckets(latency_buckets.clone()),
                &["topic"],
            ),
        );
        let webhook_delivery = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "docstream_webhook_delivery_seconds",
                    "One webhook request, sent to answered or failed: delivered (2xx), gone (410), failed (another status), unanswered.",
                )
                .buckets(latency_buckets.clone()),
                &["outcome"],
            ),
        );
        let db_pool_acquire = register(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "docstream_db_pool_acquire_seconds",
                    "Wait for a pooled Postgres connection, sampled by each health probe.",
                )
                .buckets(latency_buckets),
            ),
        );
        // RSS, CPU seconds, open and maximum file descriptors, threads:
        // process_resident_memory_bytes, process_cpu_seconds_total, ….
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");
        let extractors = ExtractorMetrics::register(&registry);
        let metrics = Self {
            http_duration,
            census,
            consumer_lag,
            consumer_committed_offset,
            producer_queue_records,
            producer_in_flight_requests,
            producer_delivery,
            webhook_delivery,
            db_pool_acquire,
            extractors,
            dependency_up,
            dependency_outages,
            store_retries,
            producer_restarts,
            paused_partitions,
            consumer_pauses,
            rebalance_drains,
            records_abandoned,
            consumer_shutdowns,
            dead_letters,
            dead_letter_failures,
            publisher_queue_depth,
            http_shutdown_rejections,
            stream_queue_depth,
            stream_frames,
            stream_closes,
            stream_dropped,
            stream_redeliveries,
            webhook_deliveries,
            webhook_attempts,
            webhook_disabled_endpoints,
            webhook_ssrf_rejections,
            stale_completions,
            retries_scheduled,
            orphans_found,
            orphans_republished,
            reaper_sweeps,
            recovery,
            registry,
            transitions,
            claim_losers,
            events_consumed,
            events_produced,
            publish_failures,
            handler_errors,
            in_flight,
            extraction_duration,
            bbox_duration,
            http_requests,
        };
        metrics.create_fixed_series();
        metrics
    }

    /// Creates, at 0, every series whose labels are a fixed set. A series
    /// that first appears at 1 has no earlier sample, so `increase()` and
    /// `rate()` miss its first event (an alert on the first forced shutdown
    /// would never fire); created at start-up, each event is an increase.
    /// Series labelled by a topic, route or extractor start with their first
    /// use instead.
    fn create_fixed_series(&self) {
        let each = |vec: &IntCounterVec, values: &[&[&str]]| {
            for labels in values {
                vec.with_label_values(labels);
            }
        };
        let classes: Vec<String> = (1..=6).map(|c| c.to_string()).collect();
        for class in &classes {
            self.orphans_found.with_label_values(&[class]);
            self.orphans_republished.with_label_values(&[class]);
        }
        for reaper in ["extraction", "bbox", "webhook"] {
            for outcome in ["swept", "locked_elsewhere", "failed"] {
                self.reaper_sweeps.with_label_values(&[reaper, outcome]);
            }
        }
        each(&self.claim_losers, &[&["extraction"], &["bbox_refinement"]]);
        each(&self.consumer_shutdowns, &[&["graceful"], &["forced"]]);
        each(&self.rebalance_drains, &[&["drained"], &["timed_out"]]);
        each(&self.records_abandoned, &[&["revoke"], &["shutdown"]]);
        for outcome in ["delivered", "retried", "failed", "disabled", "forbidden"] {
            self.webhook_deliveries.with_label_values(&[outcome]);
        }
        each(&self.webhook_ssrf_rejections, &[&["submit"], &["send"]]);
        for kind in ["client", "graceful", "too_large"] {
            self.stream_closes.with_label_values(&["import", kind]);
        }
        for kind in ["client", "graceful", "forced"] {
            self.stream_closes.with_label_values(&["export", kind]);
        }
        for strategy in ["drop_oldest", "drop_new"] {
            self.stream_dropped.with_label_values(&["export", strategy]);
        }
        self.stream_redeliveries.with_label_values(&["export"]);
        for dependency in ["kafka", "postgres"] {
            self.dependency_outages.with_label_values(&[dependency]);
        }
        for outcome in ["taken", "skipped", "failed"] {
            self.census.runs.with_label_values(&[outcome]);
        }
    }

    /// Counts one attempt of `transition`: won when the store returned a row.
    pub fn transition<T>(&self, transition: Transition, outcome: &Option<T>) {
        let label = if outcome.is_some() { "won" } else { "lost" };
        self.transitions
            .with_label_values(&[transition.as_str(), label])
            .inc();
    }

    /// Adds a collector read at each scrape (the pool's).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        self.registry.register(collector).expect("unique metric");
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding cannot fail");
        String::from_utf8(buffer).expect("Prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
