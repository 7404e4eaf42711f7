//! What `serve` hands its handlers: [`Api`], the parts the routes use and
//! the settings they read, built once per process in `roles.rs`. A handler
//! takes it as `State<Api>`; the probes take only [`Health`].

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use sqlx::PgPool;

use crate::admission::Admission;
use crate::auth::Authenticator;
use crate::config::{Backpressure, Settings};
use crate::domain::{Quota, RequestLimits};
use crate::extract::Extractors;
use crate::files::Files;
use crate::health::Health;
use crate::kafka::Consumers;
use crate::metrics::Metrics;
use crate::pipeline::bulk::Bulk;
use crate::pipeline::{Jobs, Submitter};
use crate::quota::{FailedAuthentications, RateBuckets, SubmitRates};

/// The API's handle. A clone (one per request) is one reference count.
#[derive(Clone)]
pub struct Api(Arc<Parts>);

impl Deref for Api {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

impl Api {
    /// The API on `parts`.
    pub fn new(parts: Parts) -> Self {
        Self(Arc::new(parts))
    }
}

/// What the routes use.
pub struct Parts {
    /// What the routes read of the settings.
    pub settings: ApiSettings,
    /// The pool the read-only routes query.
    pub pool: PgPool,
    /// The submit path, shared with the intake.
    pub submitter: Submitter,
    /// The lifecycle: cancels, retries, deferred results.
    pub jobs: Jobs,
    /// Bulk operations.
    pub bulk: Bulk,
    /// The files tenants uploaded.
    pub files: Files,
    /// The extractors a request may name, and their result limits.
    pub extractors: Extractors,
    /// The export streams' consumers.
    pub consumers: Consumers,
    /// API keys to callers.
    pub auth: Authenticator,
    /// This process's per-tenant submit rates.
    pub submit_rates: SubmitRates,
    /// This process's count of requests without a valid key, per peer.
    pub failed_authentications: FailedAuthentications,
    /// This process's corrections, per API key.
    pub correction_rates: RateBuckets<uuid::Uuid>,
    /// The limit on this process's submits in flight.
    pub admission: Admission,
    /// The HTTP server's and the streams' metrics.
    pub metrics: Metrics,
    /// What this process knows of Kafka's and Postgres's outages.
    pub health: Health,
}

/// What the routes read of the settings.
pub struct ApiSettings {
    /// The largest JSON body (`http_body_limit_bytes`).
    pub(super) body_limit: usize,
    /// The largest multipart submit: a file, its request and their framing.
    pub(super) multipart_limit: usize,
    /// The largest document URL (`max_url_bytes`).
    pub(super) url_limit: usize,
    /// Every request limit.
    pub(super) request_limits: RequestLimits,
    /// The quotas of a tenant without its own.
    pub(super) quota: Quota,
    /// Requests a peer may make without a valid key, per second.
    pub(super) auth_failures_per_peer_per_s: u32,
    /// What corrections may be.
    pub(super) corrections: crate::store::corrections::Caps,
    /// Corrections one key may make per minute here.
    pub(super) corrections_per_key_per_min: u32,
    /// The key of deferred results' tokens, when deferred results are on.
    pub(super) callback_secret: Option<String>,
    /// Attempts before a job fails for good.
    pub(super) max_attempts: i32,
    /// How long jobs are kept, unless a tenant keeps them less.
    pub(super) retention_days: u32,
    /// How often the queue census is taken.
    pub(super) census_interval: Duration,
    /// Request bytes an import stream may hold in flight.
    pub(super) import_max_in_flight_bytes: usize,
    /// How often a socket is pinged.
    pub(super) ws_ping_interval: Duration,
    /// An export stream's limits.
    pub(super) export: ExportSettings,
    /// An export stream's back-pressure, unless it asks for another.
    pub(super) export_backpressure: Backpressure,
    /// The prefix of export streams' consumer groups.
    pub(super) export_group_prefix: String,
    /// The topic every job's events go to (unprefixed).
    pub(super) events_topic: String,
}

impl ApiSettings {
    /// What the routes read of `settings`.
    pub fn of(settings: &Settings) -> Self {
        Self {
            body_limit: settings.http_body_limit_bytes,
            multipart_limit: multipart_limit(settings),
            url_limit: settings.max_url_bytes,
            request_limits: settings.request_limits(),
            quota: settings.tenant_quota(),
            auth_failures_per_peer_per_s: settings.auth_failures_per_peer_per_s,
            corrections: crate::store::corrections::Caps {
                per_field: settings.max_corrections_per_field as i64,
                per_job: settings.max_corrections_per_job as i64,
                storage: settings.tenant_max_file_bytes,
            },
            corrections_per_key_per_min: settings.corrections_per_key_per_min,
            callback_secret: (settings.deferred_results()).map(|(_, secret)| secret.to_owned()),
            max_attempts: settings.max_attempts,
            retention_days: settings.retention_days,
            census_interval: settings.census_interval_s.get(),
            import_max_in_flight_bytes: settings.import_max_in_flight_bytes,
            ws_ping_interval: settings.ws_ping_interval_s.get(),
            export: ExportSettings::of(settings),
            export_backpressure: settings.export_backpressure_strategy,
            export_group_prefix: settings.export_group_prefix.clone(),
            events_topic: settings.topic_events.clone(),
        }
    }
}

/// The largest multipart submit: a file at its limit, and room for the
/// request part and the form's framing.
pub(super) fn multipart_limit(settings: &Settings) -> usize {
    let request = settings.http_body_limit_bytes;
    settings
        .file_max_bytes
        .saturating_add(request)
        .saturating_add(64 * 1024)
}

/// What a stream reads of the settings, for its queue and its socket loop.
/// (Its consumer's group and topic are named by the process's Kafka
/// settings, through [`Parts::consumers`].)
#[derive(Debug, Clone, Copy)]
pub(super) struct ExportSettings {
    /// Events queued for the socket, at most (`export_max_queue_size`).
    pub(super) max_queue_size: usize,
    /// Events sent and not acknowledged, at most (`export_max_unacked`).
    pub(super) max_unacked: usize,
    /// How long an event may stay unacknowledged.
    pub(super) ack_timeout: std::time::Duration,
    /// How long a drain (and any one send) may take.
    pub(super) drain_timeout: std::time::Duration,
    /// Malformed client frames in a row that close the stream.
    pub(super) max_consecutive_errors: u32,
    /// How often the socket is pinged.
    pub(super) ping_interval: std::time::Duration,
}

impl ExportSettings {
    fn of(settings: &Settings) -> Self {
        ExportSettings {
            max_queue_size: settings.export_max_queue_size,
            max_unacked: settings.export_max_unacked,
            ack_timeout: settings.export_ack_timeout_s.get(),
            drain_timeout: settings.export_drain_timeout_s.get(),
            max_consecutive_errors: settings.export_max_consecutive_errors,
            ping_interval: settings.ws_ping_interval_s.get(),
        }
    }
}

impl FromRef<Api> for Health {
    fn from_ref(api: &Api) -> Health {
        api.health.clone()
    }
}
