//! What one worker process may ask of one provider at once: at most
//! `process_max_concurrency` calls (when set; else the deployment's cap,
//! which `slots` holds across processes). The bound is separate from the
//! consumer's in-flight bound: a worker can hold hundreds of claimed records
//! while making a handful of calls, and the rest wait here (their leases
//! renewed by their heartbeats), in the worker's order: by priority, then
//! by tenants' shares (`gate`).

use std::time::Duration;

use tokio::time::Instant;

use super::gate::{Gate, Pass};
use crate::domain::schedule::Weights;
use crate::domain::Lane;

/// The concurrency bound of one extractor in one process.
pub struct Limits {
    slots: Gate,
}

/// A held slot, with how long getting it took.
pub struct Admitted<'a> {
    _slot: Pass<'a>,
    /// Time spent waiting for a free slot.
    pub slot_wait: Duration,
}

impl Limits {
    /// `max_concurrency` calls at once; waiting calls are ordered as a
    /// worker orders its records (`max_wait`, `weights`).
    pub fn new(max_concurrency: usize, max_wait: Duration, weights: Weights) -> Self {
        Self {
            slots: Gate::new(max_concurrency, max_wait, weights),
        }
    }

    /// Waits for a slot, in `lane`'s place.
    pub async fn admit(&self, lane: Lane) -> Admitted<'_> {
        let asked = Instant::now();
        let slot = self.slots.enter(lane).await;
        Admitted {
            _slot: slot,
            slot_wait: asked.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_cap_at_once() {
        let limits = Arc::new(Limits::new(2, Duration::from_secs(60), Weights::default()));
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let (limits, running, peak) = (limits.clone(), running.clone(), peak.clone());
            tasks.spawn(async move {
                let admitted = limits.admit(Lane::default()).await;
                let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                admitted.slot_wait
            });
        }
        let mut waits = Vec::new();
        while let Some(wait) = tasks.join_next().await {
            waits.push(wait.unwrap());
        }
        waits.sort();
        assert_eq!(peak.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(waits.last(), Some(&Duration::from_millis(100)));
    }
}
