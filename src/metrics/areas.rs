//! The metrics of most areas of the pipeline, one struct per area, each
//! registering its own series (and creating its fixed series at 0, see
//! [`at_zero`], with the helpers of `registrar`). The census's and the
//! extractors' structs live in `mod.rs` beside what only they use.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::registrar::{
    at_zero, counter, counter_vec, gauge, gauge_vec, histogram, histogram_vec, Registrar,
    LATENCY_BUCKETS, STAGE_BUCKETS,
};

/// Claims, transitions and stage work of extraction and bbox jobs.
#[derive(Clone)]
pub struct JobMetrics {
    /// `docstream_transitions_total{transition, outcome="won|lost"}`.
    pub transitions: IntCounterVec,
    /// `docstream_claim_losers_total{claim}`: duplicate deliveries skipped.
    pub claim_losers: IntCounterVec,
    /// `docstream_stale_completions_total{claim, stage}`: work of a holder whose
    /// claim was taken over, dropped without side effects.
    pub stale_completions: IntCounterVec,
    /// `docstream_retries_scheduled_total`: attempts requeued with a backoff.
    pub retries_scheduled: IntCounterVec,
    /// `docstream_extraction_duration_seconds{outcome}`: extractor run time.
    pub extraction_duration: HistogramVec,
    /// `docstream_bbox_refinement_duration_seconds`.
    pub bbox_duration: Histogram,
    /// `docstream_ocr_page_seconds`: time OCR took on one page, its
    /// rendering and preparation included.
    pub ocr_page_duration: Histogram,
    /// `docstream_recovery_seconds{claim}`: from lease expiry or orphaning to the
    /// claim that recovered the job.
    pub recovery: HistogramVec,
    /// `docstream_purged_total{what="jobs|bulk_operations|dead_letters|files"}`: rows past their
    /// retention, purged.
    pub purged: IntCounterVec,
}

impl JobMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            transitions: counter_vec(
                registry,
                "docstream_transitions_total",
                "State transitions attempted, by transition and outcome (won or lost).",
                &["transition", "outcome"],
            ),
            claim_losers: counter_vec(
                registry,
                "docstream_claim_losers_total",
                "Deliveries whose claim was lost to another holder or a finished job.",
                &["claim"],
            ),
            purged: counter_vec(
                registry,
                "docstream_purged_total",
                "Finished jobs and bulk operations purged past their retention.",
                &["what"],
            ),
            stale_completions: counter_vec(
                registry,
                "docstream_stale_completions_total",
                "Work of a holder whose claim was taken over, dropped without side effects.",
                &["claim", "stage"],
            ),
            retries_scheduled: counter_vec(
                registry,
                "docstream_retries_scheduled_total",
                "Failed attempts requeued with a backoff.",
                &["claim"],
            ),
            extraction_duration: histogram_vec(
                registry,
                "docstream_extraction_duration_seconds",
                "Time the extractor took, by outcome.",
                STAGE_BUCKETS,
                &["outcome"],
            ),
            bbox_duration: histogram(
                registry,
                "docstream_bbox_refinement_duration_seconds",
                "Time bbox grounding took.",
                STAGE_BUCKETS,
            ),
            ocr_page_duration: histogram(
                registry,
                "docstream_ocr_page_seconds",
                "Time OCR took on one page, its rendering and preparation included.",
                &[0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 60.0],
            ),
            recovery: histogram_vec(
                registry,
                "docstream_recovery_seconds",
                "From lease expiry or orphaning to the claim that recovered the job.",
                &[
                    0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
                ],
                &["claim"],
            ),
        };
        at_zero(
            &metrics.claim_losers,
            &[&["extraction"], &["bbox_refinement"]],
        );
        metrics
    }
}

/// What the Kafka consumers receive, hold and give up on.
#[derive(Clone)]
pub struct ConsumerMetrics {
    /// `docstream_events_consumed_total{topic}`.
    pub events_consumed: IntCounterVec,
    /// `docstream_handler_errors_total{topic, kind}`: records whose handling failed.
    pub handler_errors: IntCounterVec,
    /// `docstream_in_flight_records{topic, partition}`.
    pub in_flight: IntGaugeVec,
    /// `docstream_consumer_paused_partitions{topic}`: paused for backpressure.
    pub paused_partitions: IntGaugeVec,
    /// `docstream_consumer_waiting_records{topic, priority}`: received and
    /// not started, by the priority their records name.
    pub waiting: IntGaugeVec,
    /// `docstream_consumer_pauses_total{topic}`: times the in-flight bound was hit.
    pub pauses: IntCounterVec,
    /// `docstream_consumer_passed_over_total{topic}`: records of a lane that
    /// filled its partition's read-ahead, passed over to reach the others'
    /// and read again later (`kafka::passing`).
    pub passed_over: IntCounterVec,
    /// `docstream_dead_letters_total{reason}`: poison records acknowledged by the DLQ.
    pub dead_letters: IntCounterVec,
    /// `docstream_dead_letter_failures_total`: dead letters the broker did
    /// not take (each is retried with its record).
    pub dead_letter_failures: IntCounter,
    /// `docstream_intake_held_total{event="held|released"}`: requests of the
    /// Kafka intake held while their tenant was at its cap, and released.
    pub intake_held: IntCounterVec,
}

impl ConsumerMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        Self {
            events_consumed: counter_vec(
                registry,
                "docstream_events_consumed_total",
                "Records received from Kafka.",
                &["topic"],
            ),
            handler_errors: counter_vec(
                registry,
                "docstream_handler_errors_total",
                "Records whose handling failed, by kind.",
                &["topic", "kind"],
            ),
            in_flight: gauge_vec(
                registry,
                "docstream_in_flight_records",
                "Records received and not yet delivered.",
                &["topic", "partition"],
            ),
            paused_partitions: gauge_vec(
                registry,
                "docstream_consumer_paused_partitions",
                "Partitions paused for backpressure.",
                &["topic"],
            ),
            waiting: gauge_vec(
                registry,
                "docstream_consumer_waiting_records",
                "Records received and not started yet, by priority.",
                &["topic", "priority"],
            ),
            pauses: counter_vec(
                registry,
                "docstream_consumer_pauses_total",
                "Times a consumer hit its in-flight bound and paused its partitions.",
                &["topic"],
            ),
            passed_over: counter_vec(
                registry,
                "docstream_consumer_passed_over_total",
                "Records passed over because their lane filled the partition's read-ahead; each is read again later.",
                &["topic"],
            ),
            dead_letters: counter_vec(
                registry,
                "docstream_dead_letters_total",
                "Poison records acknowledged by the DLQ, by reason.",
                &["reason"],
            ),
            dead_letter_failures: counter(
                registry,
                "docstream_dead_letter_failures_total",
                "Dead letters the broker did not take; each is retried with its record.",
            ),
            intake_held: counter_vec(
                registry,
                "docstream_intake_held_total",
                "Intake requests held while their tenant was at its cap on open jobs, and released.",
                &["event"],
            ),
        }
    }
}

/// How the consumers' drains (on a revoke, on shutdown) ended.
#[derive(Clone)]
pub struct DrainMetrics {
    /// `docstream_rebalance_drains_total{outcome="drained|timed_out"}`.
    pub rebalance_drains: IntCounterVec,
    /// `docstream_records_abandoned_total{cause="revoke|shutdown"}`: in-flight
    /// records a drain gave up on; not committed, so redelivered.
    pub records_abandoned: IntCounterVec,
    /// `docstream_consumer_shutdowns_total{kind="graceful|forced"}`.
    pub shutdowns: IntCounterVec,
}

impl DrainMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            rebalance_drains: counter_vec(
                registry,
                "docstream_rebalance_drains_total",
                "Revokes, by whether their in-flight records drained within the budget.",
                &["outcome"],
            ),
            records_abandoned: counter_vec(
                registry,
                "docstream_records_abandoned_total",
                "In-flight records a drain gave up on (not committed; redelivered).",
                &["cause"],
            ),
            shutdowns: counter_vec(
                registry,
                "docstream_consumer_shutdowns_total",
                "Consumer shutdowns: graceful (drained) or forced (drain timed out).",
                &["kind"],
            ),
        };
        at_zero(&metrics.shutdowns, &[&["graceful"], &["forced"]]);
        at_zero(&metrics.rebalance_drains, &[&["drained"], &["timed_out"]]);
        at_zero(&metrics.records_abandoned, &[&["revoke"], &["shutdown"]]);
        metrics
    }
}

/// The consumer groups' positions, from librdkafka's statistics.
#[derive(Clone)]
pub struct OffsetMetrics {
    /// `docstream_consumer_lag{group, topic, partition}`.
    pub lag: IntGaugeVec,
    /// `docstream_consumer_committed_offset{group, topic, partition}`.
    pub committed: IntGaugeVec,
}

impl OffsetMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let partition = &["group", "topic", "partition"];
        Self {
            lag: gauge_vec(
                registry,
                "docstream_consumer_lag",
                "Records on an assigned partition past the group's committed offset (librdkafka statistics).",
                partition,
            ),
            committed: gauge_vec(
                registry,
                "docstream_consumer_committed_offset",
                "The group's committed offset on an assigned partition (librdkafka statistics).",
                partition,
            ),
        }
    }
}

/// The publisher and the Kafka producer under it.
#[derive(Clone)]
pub struct ProducerMetrics {
    /// `docstream_events_produced_total{topic}`: acknowledged by the broker.
    pub events_produced: IntCounterVec,
    /// `docstream_publish_failures_total{topic}`.
    pub publish_failures: IntCounterVec,
    /// `docstream_publisher_queue_depth`: records waiting for the send point.
    pub publisher_queue_depth: IntGauge,
    /// `docstream_producer_restarts_total`: producers replaced after a fatal error.
    pub restarts: IntCounter,
    /// `docstream_producer_queue_records`: records in librdkafka's producer
    /// queue, not yet acknowledged (from its statistics).
    pub queue_records: IntGauge,
    /// `docstream_producer_in_flight_requests`: produce requests sent to a
    /// broker and waiting for its answer (from its statistics).
    pub in_flight_requests: IntGauge,
    /// `docstream_producer_delivery_seconds{topic}`: publish to the broker's
    /// acknowledgement, for acknowledged records.
    pub delivery_seconds: HistogramVec,
}

impl ProducerMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        Self {
            events_produced: counter_vec(
                registry,
                "docstream_events_produced_total",
                "Records acknowledged by the broker.",
                &["topic"],
            ),
            publish_failures: counter_vec(
                registry,
                "docstream_publish_failures_total",
                "Records the broker did not acknowledge.",
                &["topic"],
            ),
            publisher_queue_depth: gauge(
                registry,
                "docstream_publisher_queue_depth",
                "Records waiting in the publisher's queue for the send point.",
            ),
            restarts: counter(
                registry,
                "docstream_producer_restarts_total",
                "Kafka producers replaced after a fatal producer error.",
            ),
            queue_records: gauge(
                registry,
                "docstream_producer_queue_records",
                "Records in the Kafka producer's queue, not yet acknowledged (librdkafka statistics).",
            ),
            in_flight_requests: gauge(
                registry,
                "docstream_producer_in_flight_requests",
                "Produce requests sent to a broker and waiting for its answer (librdkafka statistics).",
            ),
            delivery_seconds: histogram_vec(
                registry,
                "docstream_producer_delivery_seconds",
                "Publish to the broker's acknowledgement, for acknowledged records, by topic.",
                LATENCY_BUCKETS,
                &["topic"],
            ),
        }
    }
}

/// The import and export WebSocket streams.
#[derive(Clone)]
pub struct StreamMetrics {
    /// `docstream_stream_queue_depth{stream}`: frames read and not yet answered.
    pub queue_depth: IntGaugeVec,
    /// `docstream_stream_frames_total{stream, outcome="accepted|refused"}`.
    pub frames: IntCounterVec,
    /// `docstream_stream_closes_total{stream, kind="client|graceful|forced|too_large"}`:
    /// closed by the client, by the server after a drain on shutdown, by the
    /// server without one (drain timed out, client kept failing, Kafka
    /// failed), or (import) for a frame past the size limit.
    pub closes: IntCounterVec,
    /// `docstream_stream_dropped_total{stream, strategy}`: events an export
    /// stream dropped for a slow client, by backpressure strategy.
    pub dropped: IntCounterVec,
    /// `docstream_stream_redeliveries_total{stream}`: events sent to an export
    /// client and not acknowledged when its stream ended; the group's next
    /// connection receives them again.
    pub redeliveries: IntCounterVec,
}

impl StreamMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            queue_depth: gauge_vec(
                registry,
                "docstream_stream_queue_depth",
                "Import: frames read and not yet answered. Export: events waiting for the socket.",
                &["stream"],
            ),
            frames: counter_vec(
                registry,
                "docstream_stream_frames_total",
                "Frames of a stream, accepted (submitted) or refused with an error.",
                &["stream", "outcome"],
            ),
            closes: counter_vec(
                registry,
                "docstream_stream_closes_total",
                "Streams closed by the client, by the server after a drain (graceful), or without one (forced).",
                &["stream", "kind"],
            ),
            dropped: counter_vec(
                registry,
                "docstream_stream_dropped_total",
                "Events an export stream dropped for a slow client, by backpressure strategy.",
                &["stream", "strategy"],
            ),
            redeliveries: counter_vec(
                registry,
                "docstream_stream_redeliveries_total",
                "Events sent on a stream and not acknowledged when it ended: sent again on the next connection.",
                &["stream"],
            ),
        };
        metrics.create_fixed_series();
        metrics
    }

    fn create_fixed_series(&self) {
        for kind in ["client", "graceful", "too_large"] {
            self.closes.with_label_values(&["import", kind]);
        }
        for kind in ["client", "graceful", "forced"] {
            self.closes.with_label_values(&["export", kind]);
        }
        for strategy in ["drop_oldest", "drop_new"] {
            self.dropped.with_label_values(&["export", strategy]);
        }
        self.redeliveries.with_label_values(&["export"]);
    }
}

/// Webhook deliveries.
#[derive(Clone)]
pub struct WebhookMetrics {
    /// `docstream_webhook_deliveries_total{outcome="delivered|retried|failed|disabled|forbidden"}`:
    /// webhook attempts by how they ended (`retried`: failed, another is scheduled).
    pub deliveries: IntCounterVec,
    /// `docstream_webhook_attempts_total`: HTTP requests made to webhook endpoints.
    pub attempts: IntCounter,
    /// `docstream_webhook_disabled_endpoints_total`: endpoints disabled after 410 Gone.
    pub disabled_endpoints: IntCounter,
    /// `docstream_webhook_ssrf_rejections_total{stage="submit|send"}`: webhook
    /// URLs refused by the SSRF guard.
    pub ssrf_rejections: IntCounterVec,
    /// `docstream_webhook_delivery_seconds{outcome="delivered|gone|failed|unanswered"}`:
    /// one webhook request, sent to answered (or to its failure).
    pub delivery_seconds: HistogramVec,
}

impl WebhookMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            deliveries: counter_vec(
                registry,
                "docstream_webhook_deliveries_total",
                "Webhook attempts by how they ended: delivered, retried, failed (given up), disabled (410 Gone), forbidden (SSRF guard).",
                &["outcome"],
            ),
            attempts: counter(
                registry,
                "docstream_webhook_attempts_total",
                "HTTP requests made to webhook endpoints.",
            ),
            disabled_endpoints: counter(
                registry,
                "docstream_webhook_disabled_endpoints_total",
                "Webhook endpoints disabled after answering 410 Gone.",
            ),
            ssrf_rejections: counter_vec(
                registry,
                "docstream_webhook_ssrf_rejections_total",
                "Webhook URLs refused by the SSRF guard, at submit or at send.",
                &["stage"],
            ),
            delivery_seconds: histogram_vec(
                registry,
                "docstream_webhook_delivery_seconds",
                "One webhook request, sent to answered or failed: delivered (2xx), gone (410), failed (another status), unanswered.",
                LATENCY_BUCKETS,
                &["outcome"],
            ),
        };
        for outcome in ["delivered", "retried", "failed", "disabled", "forbidden"] {
            metrics.deliveries.with_label_values(&[outcome]);
        }
        at_zero(&metrics.ssrf_rejections, &[&["submit"], &["send"]]);
        metrics
    }
}

/// The HTTP server.
#[derive(Clone)]
pub struct HttpMetrics {
    /// `docstream_http_requests_total{route, status}`.
    pub requests: IntCounterVec,
    /// `docstream_http_request_duration_seconds{route, status}`: arrival to
    /// answer (for a WebSocket route, to the upgrade).
    pub duration: HistogramVec,
    /// `docstream_http_shutdown_rejections_total`: requests answered 503 while draining.
    pub shutdown_rejections: IntCounter,
    /// `docstream_submit_overload_rejections_total`: submits refused at once
    /// (503 `overloaded`) because the admission limit was reached.
    pub overload_rejections: IntCounter,
    /// `docstream_submit_admission_limit`: submits the process admits at once now.
    pub admission_limit: IntGauge,
    /// `docstream_submits_in_flight`: submits admitted and not yet answered.
    pub submits_in_flight: IntGauge,
    /// `docstream_uploads_in_flight`: uploads (files, multipart submits,
    /// `document.url` fetches) in progress.
    pub uploads_in_flight: IntGauge,
    /// `docstream_upload_refusals_total{reason}`: uploads refused for a
    /// bound of uploads: `too_large` (declared past the limit),
    /// `tenant_cap` (the tenant's uploads in progress), `body_timeout`.
    pub upload_refusals: IntCounterVec,
}

impl HttpMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        Self {
            requests: counter_vec(
                registry,
                "docstream_http_requests_total",
                "HTTP requests answered, by route and status code.",
                &["route", "status"],
            ),
            duration: histogram_vec(
                registry,
                "docstream_http_request_duration_seconds",
                "HTTP requests, arrival to answer, by route and status code.",
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 3.0,
                    5.0, 10.0,
                ],
                &["route", "status"],
            ),
            shutdown_rejections: counter(
                registry,
                "docstream_http_shutdown_rejections_total",
                "Requests answered 503 because the server was shutting down.",
            ),
            overload_rejections: counter(
                registry,
                "docstream_submit_overload_rejections_total",
                "Submits refused at once (503 overloaded): the admission limit was reached.",
            ),
            admission_limit: gauge(
                registry,
                "docstream_submit_admission_limit",
                "Submits this process admits at once now (adapted to its latency).",
            ),
            submits_in_flight: gauge(
                registry,
                "docstream_submits_in_flight",
                "Submits admitted and not yet answered.",
            ),
            uploads_in_flight: gauge(
                registry,
                "docstream_uploads_in_flight",
                "Uploads in progress: files, multipart submits, document.url fetches.",
            ),
            upload_refusals: counter_vec(
                registry,
                "docstream_upload_refusals_total",
                "Uploads refused for a bound of uploads, by reason.",
                &["reason"],
            ),
        }
        .with_upload_reasons()
    }

    fn with_upload_reasons(self) -> Self {
        let reasons = [&["too_large"][..], &["tenant_cap"], &["body_timeout"]];
        at_zero(&self.upload_refusals, &reasons);
        self
    }
}

/// The reapers and the orphans they find.
#[derive(Clone)]
pub struct ReaperMetrics {
    /// `docstream_orphans_found_total{class}`.
    pub orphans_found: IntCounterVec,
    /// `docstream_orphans_republished_total{class}`.
    pub orphans_republished: IntCounterVec,
    /// `docstream_reaper_sweeps_total{reaper, outcome}`.
    pub sweeps: IntCounterVec,
}

impl ReaperMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            orphans_found: counter_vec(
                registry,
                "docstream_orphans_found_total",
                "Orphans a reaper found, by orphan class.",
                &["class"],
            ),
            orphans_republished: counter_vec(
                registry,
                "docstream_orphans_republished_total",
                "Orphans whose event a reaper republished (acknowledged), by class.",
                &["class"],
            ),
            sweeps: counter_vec(
                registry,
                "docstream_reaper_sweeps_total",
                "Reaper sweeps, by reaper and outcome (swept, locked_elsewhere, failed).",
                &["reaper", "outcome"],
            ),
        };
        metrics.create_fixed_series();
        metrics
    }

    fn create_fixed_series(&self) {
        for class in (1..=8).map(|c| c.to_string()) {
            self.orphans_found.with_label_values(&[&class]);
            self.orphans_republished.with_label_values(&[&class]);
        }
        for reaper in ["extraction", "bbox", "webhook"] {
            for outcome in ["swept", "locked_elsewhere", "failed"] {
                self.sweeps.with_label_values(&[reaper, outcome]);
            }
        }
    }
}

/// Kafka's and Postgres's health as this process sees it.
#[derive(Clone)]
pub struct DependencyMetrics {
    /// `docstream_dependency_up{dependency="kafka|postgres"}`: 1 while the last
    /// call or probe to it succeeded.
    pub up: IntGaugeVec,
    /// `docstream_dependency_outages_total{dependency}`: outages seen (each
    /// counted at its first failure, however many calls failed during it).
    pub outages: IntCounterVec,
}

impl DependencyMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        let metrics = Self {
            up: gauge_vec(
                registry,
                "docstream_dependency_up",
                "1 while the dependency answers this process's calls and probes, else 0.",
                &["dependency"],
            ),
            outages: counter_vec(
                registry,
                "docstream_dependency_outages_total",
                "Outages of a dependency this process saw (one per outage).",
                &["dependency"],
            ),
        };
        at_zero(&metrics.outages, &[&["kafka"], &["postgres"]]);
        metrics
    }
}

/// The Postgres store and its connection pool.
#[derive(Clone)]
pub struct StoreMetrics {
    /// `docstream_store_retries_total{statement}`: statements run again because
    /// the connection failed (the job's attempts are untouched).
    pub retries: IntCounterVec,
    /// `docstream_db_pool_acquire_seconds`: the wait for a pooled connection,
    /// sampled by every Postgres probe.
    pub pool_acquire: Histogram,
}

impl StoreMetrics {
    pub(super) fn register(registry: &Registrar) -> Self {
        Self {
            retries: counter_vec(
                registry,
                "docstream_store_retries_total",
                "Statements run again after their connection failed.",
                &["statement"],
            ),
            pool_acquire: histogram(
                registry,
                "docstream_db_pool_acquire_seconds",
                "Wait for a pooled Postgres connection, sampled by each health probe.",
                LATENCY_BUCKETS,
            ),
        }
    }
}
