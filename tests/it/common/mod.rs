//! Test harness: every test gets its own database (migrated) and its own topics
//! (a unique prefix), on the real Postgres and Kafka that `scripts/services.sh`
//! starts, so tests run in parallel and repeat without cleanup. Also: spawning
//! real `docstream` processes, reading topics back, and waiting on conditions.
//!
//! By what they help with: [`env`] (the test's world and its clean-up),
//! [`commits`] (committed offsets never ahead of delivery), [`cluster`] (the
//! three-node Kafka cluster: who leads what),
//! [`process`] (children, signals, waiting), [`kafka`] (reading topics,
//! offsets, watermarks), [`ws`] (WebSocket clients), [`jobs`] (jobs and
//! counts), [`provider`] (a fake extraction provider), [`scans`] (the
//! samples as scans) and [`workers`] (worker processes with external
//! extractors). Most is re-exported here, so tests import from `common`
//! directly.
#![allow(dead_code)]

pub mod cluster;
pub mod commits;
#[cfg(feature = "docker")]
mod docker;
pub mod env;
pub mod jobs;
pub mod kafka;
pub mod process;
pub mod provider;
pub mod scans;
pub mod workers;
pub mod ws;

// Each test binary compiles this harness and uses only part of it.
#[allow(unused_imports)]
pub use env::*;
#[allow(unused_imports)]
pub use jobs::*;
#[allow(unused_imports)]
pub use kafka::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use workers::*;
#[allow(unused_imports)]
pub use ws::*;
