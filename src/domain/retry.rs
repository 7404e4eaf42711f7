//! Retry backoff, for jobs and webhook deliveries alike: capped exponential
//! with "equal jitter". The delay before attempt n+1 lies in [d/2, d] where
//! d = min(max, base · 2^(n-1)), so it never shrinks from one attempt to the
//! next, and replicas (or receivers) that failed together do not retry in
//! lockstep.

use std::time::Duration;

use rand::RngExt;

/// A backoff: its first delay and its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failed attempt (before jitter).
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay after failed attempt `attempt` (1-based), jittered at random.
    pub fn after(&self, attempt: i32) -> Duration {
        self.with_jitter(attempt, rand::rng().random())
    }

    /// The delay after failed attempt `attempt` for a given `jitter` in [0, 1).
    pub fn with_jitter(&self, attempt: i32, jitter: f64) -> Duration {
        let doublings = attempt.saturating_sub(1).clamp(0, 62);
        let ceiling = (self.base.as_secs_f64() * 2f64.powi(doublings)).min(self.max.as_secs_f64());
        Duration::from_secs_f64(ceiling / 2.0 + ceiling / 2.0 * jitter.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_below_the_cap_and_stays_within_it() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(30),
        };
        let secs = |attempt, jitter| backoff.with_jitter(attempt, jitter).as_secs_f64();
        // Uncapped (1, 2, 4, 8, 16 s ceilings): the shortest next delay is at least
        // the longest previous one.
        for attempt in 2..=5 {
            let previous_longest = secs(attempt - 1, 0.999_999);
            let shortest = secs(attempt, 0.0);
            assert!(shortest >= previous_longest - 1e-5, "attempt {attempt}");
        }
        assert_eq!(secs(1, 0.0), 0.5);
        for attempt in 6..40 {
            let delay = secs(attempt, 0.5);
            assert!((15.0..=30.0).contains(&delay), "attempt {attempt}: {delay}");
            let random = backoff.after(attempt).as_secs_f64();
            assert!(
                (15.0..=30.0).contains(&random),
                "attempt {attempt}: {random}"
            );
        }
    }
}
