//! docstream: a Kafka-native stream processor that runs an asynchronous
//! document-extraction pipeline safely across any number of worker replicas.
//!
//! The manual's Architecture chapter (`docs/src/architecture.md`) states what
//! the code promises (the four invariants, the state machine's legal
//! predecessors, the delivery contract, the orphan classes) and where each
//! promise is kept.
//!
//! The binary (`src/main.rs`, with its `demo` and `bench` commands) drives
//! this library; nothing here knows of them.
//!
//! Map of the crate, edge first (arrows point one way: edge → kafka/store → domain):
//! - [`roles`] assembles processes (`serve`, `worker`, `bbox-worker`, `all`);
//!   [`api`] is the HTTP edge; [`pipeline`] holds the consumer roles;
//!   [`webhook`] delivers the outbox of terminal-state webhooks.
//! - [`kafka`] is the producer, the consumer runtime (offsets stored only after
//!   delivery) and topic admin; [`store`] is Postgres (one statement per
//!   transition); [`events`] binds Avro schemas to types.
//! - [`health`] tracks the dependencies' outages and the process's readiness;
//!   [`metrics`] is every series `/metrics` shows; [`trace`] the W3C trace
//!   context of a job (its records' `traceparent`, its log lines' ids);
//!   [`auth`] turns API keys into callers (a tenant and its scopes);
//!   [`quota`] holds the per-tenant submit rates; [`admission`] the limit
//!   on submits in flight that sheds overload at once.
//! - [`domain`] is the job model; [`extract`] the extractors and bbox grounding.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod api;
pub mod auth;
pub mod config;
pub mod domain;
pub mod events;
pub mod extract;
pub mod failpoints;
pub mod files;
pub mod health;
pub mod kafka;
pub mod metrics;
pub mod ops;
pub mod outbound;
pub mod pipeline;
pub mod preflight;
pub mod provider;
pub mod quota;
pub mod roles;
pub mod store;
pub mod trace;
pub mod webhook;

/// What the benchmark (a module of the binary) reaches below the public
/// API, so that it measures the pipeline's own paths and not copies of them.
/// Not for users of the crate: hidden from its documentation, and free to
/// change with the benchmark.
#[doc(hidden)]
pub mod bench_support {
    /// The statements of a job's life in the store, as the benchmark's
    /// Postgres ceiling runs them: insert (`$1` ids, `$2` keys, `$3` hashes,
    /// `$4` requests as JSON text, `$5` whether each names a webhook, `$6`
    /// tenants, `$7` their caps on open jobs or NULL), claim (`$1` ids, `$2`
    /// lease seconds), complete (`$1` ids, `$2` tokens, `$3` results as JSON
    /// text). Each takes arrays: one row per statement or many.
    pub mod lifecycle {
        /// The submit INSERT.
        pub const INSERT: &str = crate::store::submit::INSERT;
        /// The extraction's claim.
        pub const CLAIM: &str = crate::store::transitions::MARK_RUNNING;
        /// The extraction's success, with its bbox request.
        pub const COMPLETE: &str = crate::store::transitions::MARK_SUCCEEDED;
    }
}
