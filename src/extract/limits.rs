//! What one worker process may ask of one provider: at most `max_concurrency`
//! calls at once, started at most `requests_per_second` times a second. The
//! limits are separate from the consumer's in-flight bound: a worker can hold
//! hundreds of claimed records while making a handful of calls, and the rest
//! wait here (their leases renewed by their heartbeats).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// The concurrency cap and the rate limit of one extractor in one process.
#[derive(Debug)]
pub struct Limits {
    slots: Semaphore,
    /// Time between two call starts; zero when there is no rate limit.
    spacing: Duration,
    /// When the next call may start: a token bucket that holds one token, so
    /// calls are spaced evenly and never burst past the rate.
    next_start: Mutex<Instant>,
}

/// A held slot, with how long getting it (and its token) took.
#[derive(Debug)]
pub struct Admitted<'a> {
    _slot: SemaphorePermit<'a>,
    /// Time spent waiting for a free slot.
    pub slot_wait: Duration,
    /// Time spent waiting for the rate limit, after the slot.
    pub token_wait: Duration,
}

impl Limits {
    /// `max_concurrency` calls at once, `requests_per_second` starts a second
    /// (0: no rate limit).
    pub fn new(max_concurrency: usize, requests_per_second: f64) -> Self {
        let spacing = if requests_per_second > 0.0 {
            Duration::from_secs_f64(1.0 / requests_per_second)
        } else {
            Duration::ZERO
        };
        Self {
            slots: Semaphore::new(max_concurrency),
            spacing,
            next_start: Mutex::new(Instant::now()),
        }
    }

    /// Waits for a slot, then for the rate limit's next start. The slot comes
    /// first, so a call that waits for a token is one that will start at that
    /// token's time.
    pub async fn admit(&self) -> Admitted<'_> {
        let asked = Instant::now();
        let slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let slotted = Instant::now();
        if !self.spacing.is_zero() {
            let start = {
                let mut next = self.next_start.lock().expect("rate limit lock");
                let start = (*next).max(slotted);
                *next = start + self.spacing;
                start
            };
            tokio::time::sleep_until(start).await;
        }
        Admitted {
            _slot: slot,
            slot_wait: slotted - asked,
            token_wait: slotted.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_start_evenly_spaced_at_the_rate() {
        let limits = Arc::new(Limits::new(100, 10.0));
        let origin = Instant::now();
        let mut starts = Vec::new();
        for _ in 0..5 {
            let admitted = limits.admit().await;
            starts.push(origin.elapsed());
            drop(admitted);
        }
        let expected: Vec<Duration> = (0..5).map(|i| Duration::from_millis(100 * i)).collect();
        assert_eq!(starts, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_cap_at_once() {
        let limits = Arc::new(Limits::new(2, 0.0));
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let (limits, running, peak) = (limits.clone(), running.clone(), peak.clone());
            tasks.spawn(async move {
                let admitted = limits.admit().await;
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
