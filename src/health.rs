//! What a process knows about its dependencies, for its logs, its metrics and
//! its readiness.
//!
//! Kafka and Postgres go away for seconds at a time (a broker restart, a
//! failover, a stalled network). A process rides through that: librdkafka and
//! the pool reconnect on their own, and every caller treats the failure as
//! passing. What it must not do is log every failed poll or statement. So every
//! failure is reported here, and only the first of an outage is logged (with
//! `docstream_dependency_outages_total` counting it); the rest go to debug.
//! The end of an outage is logged once too, with its length. A failure within
//! 10 s of the end is the same outage settling (a restarted broker blinks as
//! its partitions come back), not a new one: it is not logged again.
//!
//! A dependency is back only when a probe (or a successful call) says so: a
//! probe task asks Postgres `SELECT 1` and the broker for metadata every
//! `health_probe_interval_s`, and a probe unanswered within
//! `http_answer_timeout_s` is a failure (a slow network is not an outage;
//! one too slow for the API to answer in time is). `/readyz` is ready while both are up and the
//! process is not draining.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// A dependency whose outages are tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// The Kafka cluster.
    Kafka,
    /// The Postgres database.
    Postgres,
}

impl Dependency {
    /// Label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kafka => "kafka",
            Self::Postgres => "postgres",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Kafka => 0,
            Self::Postgres => 1,
        }
    }
}

/// What is known of one dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not probed yet.
    Unknown,
    Up,
    /// Back since then, after an outage; a failure within [`SETTLE`] is the
    /// same outage still settling, not a new one.
    Back(Instant),
    /// Failing since `since`; `settling` when it failed again within
    /// [`SETTLE`] of coming back (the outage before it was logged).
    Down {
        since: Instant,
        settling: bool,
    },
}

/// How long a dependency that came back may blink (fail again) without that
/// being logged and counted as a new outage: a restarted broker accepts
/// connections before it serves every request, and a recovering database
/// refuses connections while it replays its log.
const SETTLE: Duration = Duration::from_secs(10);

/// Shared by every component of a process; cheap to clone.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    states: [Mutex<State>; 2],
    draining: AtomicBool,
    metrics: Metrics,
}

impl Health {
    /// Both dependencies unknown until probed or used.
    pub fn new(metrics: Metrics) -> Self {
        let inner = Inner {
            states: [Mutex::new(State::Unknown), Mutex::new(State::Unknown)],
            draining: AtomicBool::new(false),
            metrics,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    fn state(&self, dependency: Dependency) -> std::sync::MutexGuard<'_, State> {
        self.inner.states[dependency.index()]
            .lock()
            .expect("health state lock")
    }

    /// A call to `dependency` failed for a reason that may pass. The first
    /// failure of an outage is logged as a warning and counted; the rest are
    /// debug lines, and so is a blink of a dependency that came back less
    /// than [`SETTLE`] ago.
    pub fn failed(&self, dependency: Dependency, error: &dyn Display) {
        let name = dependency.as_str();
        let previous = {
            let mut state = self.state(dependency);
            let previous = *state;
            *state = match previous {
                State::Down { .. } => previous,
                State::Back(at) if at.elapsed() < SETTLE => State::Down {
                    since: Instant::now(),
                    settling: true,
                },
                State::Up | State::Back(_) | State::Unknown => State::Down {
                    since: Instant::now(),
                    settling: false,
                },
            };
            previous
        };
        let metrics = &self.inner.metrics;
        match previous {
            State::Down { .. } => {
                tracing::debug!(dependency = name, %error, "dependency still unreachable");
            }
            State::Back(at) if at.elapsed() < SETTLE => {
                metrics.dependencies.up.with_label_values(&[name]).set(0);
                tracing::debug!(dependency = name, %error, "dependency unreachable again as it settles (the same outage)");
            }
            State::Up | State::Back(_) | State::Unknown => {
                metrics.dependencies.up.with_label_values(&[name]).set(0);
                let outages = &metrics.dependencies.outages;
                outages.with_label_values(&[name]).inc();
                tracing::warn!(dependency = name, %error, "dependency unreachable; retrying until it is back (logged once per outage)");
            }
        }
    }

    /// A call to `dependency` succeeded: an outage, if one was on, is over.
    pub fn succeeded(&self, dependency: Dependency) {
        let name = dependency.as_str();
        let previous = {
            let mut state = self.state(dependency);
            let previous = *state;
            *state = match previous {
                State::Down { .. } => State::Back(Instant::now()),
                State::Back(at) if at.elapsed() < SETTLE => previous,
                State::Up | State::Back(_) | State::Unknown => State::Up,
            };
            previous
        };
        match previous {
            State::Up | State::Back(_) => return,
            State::Down {
                since,
                settling: false,
            } => {
                let outage_s = since.elapsed().as_secs_f64();
                tracing::info!(
                    dependency = name,
                    outage_s = format!("{outage_s:.1}"),
                    "dependency reachable again"
                );
            }
            State::Down { settling: true, .. } => {
                tracing::debug!(
                    dependency = name,
                    "dependency reachable again after a blink"
                );
            }
            State::Unknown => {}
        }
        let metrics = &self.inner.metrics;
        metrics.dependencies.up.with_label_values(&[name]).set(1);
    }

    /// Whether the last word on `dependency` was a success.
    pub fn is_up(&self, dependency: Dependency) -> bool {
        matches!(*self.state(dependency), State::Up | State::Back(_))
    }

    /// Whether `dependency` is in an outage (failed since its last success).
    pub fn is_down(&self, dependency: Dependency) -> bool {
        matches!(*self.state(dependency), State::Down { .. })
    }

    /// The process began to drain: from now on it is not ready.
    pub fn set_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// `Ok` when both dependencies are up and the process is not draining;
    /// otherwise why not.
    pub fn ready(&self) -> Result<(), String> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err("draining for shutdown".into());
        }
        let down: Vec<&str> = [Dependency::Kafka, Dependency::Postgres]
            .into_iter()
            .filter(|d| !self.is_up(*d))
            .map(Dependency::as_str)
            .collect();
        match down.is_empty() {
            true => Ok(()),
            false => Err(format!("not reachable: {}", down.join(", "))),
        }
    }

    /// Probes `dependency` with `probe` every `interval` until `shutdown`; a
    /// probe without an answer within `timeout` is a failure.
    pub fn spawn_probe<F, Fut, E>(
        &self,
        dependency: Dependency,
        (interval, timeout): (Duration, Duration),
        shutdown: CancellationToken,
        probe: F,
    ) where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: Display,
    {
        let health = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match tokio::time::timeout(timeout, probe()).await {
                    Ok(Ok(())) => health.succeeded(dependency),
                    Ok(Err(e)) => health.failed(dependency, &e),
                    Err(_) => health.failed(
                        dependency,
                        &format!("no answer to the probe within {timeout:?}"),
                    ),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(metrics: &Metrics, name: &str, dependency: &str) -> f64 {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("dependency=\"{dependency}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(f64::NAN)
    }

    #[test]
    fn an_outage_is_counted_once_however_many_calls_fail() {
        let metrics = Metrics::new();
        let health = Health::new(metrics.clone());
        assert!(health.ready().is_err(), "unknown is not ready");
        health.succeeded(Dependency::Kafka);
        health.succeeded(Dependency::Postgres);
        assert_eq!(health.ready(), Ok(()));
        for _ in 0..5 {
            health.failed(Dependency::Kafka, &"connection refused");
        }
        let outages = "docstream_dependency_outages_total";
        assert_eq!(series(&metrics, outages, "kafka"), 1.0);
        assert_eq!(series(&metrics, "docstream_dependency_up", "kafka"), 0.0);
        assert_eq!(health.ready(), Err("not reachable: kafka".into()));
        health.succeeded(Dependency::Kafka);
        assert_eq!(health.ready(), Ok(()));
        // A blink as it settles is the same outage.
        health.failed(Dependency::Kafka, &"blink");
        assert_eq!(series(&metrics, outages, "kafka"), 1.0);
        assert!(health.is_down(Dependency::Kafka));
        health.succeeded(Dependency::Kafka);
        // Once it has been back for SETTLE, a failure is a new outage.
        *health.state(Dependency::Kafka) = State::Back(Instant::now() - SETTLE);
        health.failed(Dependency::Kafka, &"again");
        assert_eq!(series(&metrics, outages, "kafka"), 2.0);
        health.succeeded(Dependency::Kafka);
        assert_eq!(series(&metrics, "docstream_dependency_up", "kafka"), 1.0);
        health.set_draining();
        assert!(health.ready().is_err());
    }
}
