//! Retry backoff: capped exponential with "equal jitter". The delay before
//! attempt n+1 lies in [d/2, d] where d = min(max, base · 2^(n-1)), so it never
//! shrinks from one attempt to the next, and replicas that failed together do not
//! retry in lockstep.

/// Seconds to wait after failed attempt `attempt` (1-based); `jitter` in [0, 1).
pub fn retry_delay_s(attempt: i32, base_s: f64, max_s: f64, jitter: f64) -> f64 {
    let doublings = attempt.saturating_sub(1).clamp(0, 62);
    let ceiling = (base_s * 2f64.powi(doublings)).min(max_s);
    ceiling / 2.0 + ceiling / 2.0 * jitter.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_below_the_cap_and_stays_within_it() {
        // Uncapped (1, 2, 4, 8, 16 s ceilings): the shortest next delay is at least
        // the longest previous one.
        for attempt in 2..=5 {
            let previous_longest = retry_delay_s(attempt - 1, 1.0, 30.0, 0.999_999);
            let shortest = retry_delay_s(attempt, 1.0, 30.0, 0.0);
            assert!(shortest >= previous_longest - 1e-5, "attempt {attempt}");
        }
        assert_eq!(retry_delay_s(1, 1.0, 30.0, 0.0), 0.5);
        for attempt in 6..40 {
            let delay = retry_delay_s(attempt, 1.0, 30.0, 0.5);
            assert!((15.0..=30.0).contains(&delay), "attempt {attempt}: {delay}");
        }
    }
}
