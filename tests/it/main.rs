//! docstream's integration tests: one binary, a module per area, every test on
//! the real Kafka and Postgres that `scripts/test.sh` starts.
//!
//! Run one area with a filter on its module: `cargo test --test it faults::`.
//! `scripts/test.sh` runs `faults` and `limits` in passes of their own, after the
//! rest: the faults stop the services every test shares, and some limits tests
//! flood the machine or time its answers.

mod common;

mod api;
mod bench_smoke;
mod console;
mod crash_safety;
mod delivery;
mod events_avsc;
mod export_stream;
mod extractors;
mod faults;
mod files;
mod image;
mod image_headers;
mod import_stream;
mod intake;
mod limits;
mod migrations;
mod observability;
mod openapi;
mod pipeline_e2e;
mod pooler;
mod reference;
mod scheduling;
mod secure;
mod store_transitions;
mod tenancy;
mod trace_context;
mod webhooks;
