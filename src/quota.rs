//! Per-tenant submit rates: a token bucket for each tenant in this process,
//! refilled at the tenant's rate and holding at most its burst. A submit takes
//! one token or is refused with how long until one is there (the API's 429
//! and `Retry-After`). The buckets are this process's: with N `serve`
//! replicas, a tenant may submit N times its rate in all.
//!
//! The same buckets, keyed by a peer's address, bound the failed
//! authentications one client may cause ([`FailedAuthentications`]).
//!
//! The other quota, the cap on a tenant's open jobs, is the store's: it is
//! checked in the statement that inserts (`store::insert_many`), exactly,
//! across every process.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// The most buckets a process keeps; past it, full buckets (of keys not
/// seen for a while) are forgotten, which costs them nothing.
const MAX_BUCKETS: usize = 100_000;

/// One key's bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets by key, in this process.
pub struct RateBuckets<K> {
    buckets: Arc<Mutex<HashMap<K, Bucket>>>,
}

impl<K> Clone for RateBuckets<K> {
    fn clone(&self) -> Self {
        Self {
            buckets: self.buckets.clone(),
        }
    }
}

impl<K> Default for RateBuckets<K> {
    fn default() -> Self {
        Self {
            buckets: Arc::default(),
        }
    }
}

/// This process's submit buckets, by tenant.
pub type SubmitRates = RateBuckets<Uuid>;

/// This process's buckets of failed authentications, by the peer's address:
/// a client that keeps presenting keys that do not exist (each one a lookup
/// in the store) is refused before its next lookup.
pub type FailedAuthentications = RateBuckets<IpAddr>;

impl<K: Hash + Eq> RateBuckets<K> {
    /// Takes one token of `key` at `rate` per second with `burst`: `Ok`, or
    /// how long until the next one would be there.
    pub fn take(&self, key: K, rate: f64, burst: u32) -> Result<(), Duration> {
        self.with(key, rate, burst, true)
    }

    /// Whether `key` has a token (none is taken); if not, how long until it has.
    pub fn check(&self, key: K, rate: f64, burst: u32) -> Result<(), Duration> {
        self.with(key, rate, burst, false)
    }

    fn with(&self, key: K, rate: f64, burst: u32, take: bool) -> Result<(), Duration> {
        let now = Instant::now();
        let burst = f64::from(burst.max(1));
        let mut buckets = self.buckets.lock().expect("rate buckets lock");
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, b| b.tokens + b.at.elapsed().as_secs_f64() * rate < burst);
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refilled = bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate;
        bucket.tokens = refilled.min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= f64::from(u8::from(take));
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_then_a_wait_that_says_how_long() {
        let rates = SubmitRates::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        for _ in 0..5 {
            rates.take(a, 1.0, 5).unwrap();
        }
        let wait = rates.take(a, 1.0, 5).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        // Another tenant's bucket is its own.
        rates.take(b, 1.0, 5).unwrap();
        // Checking takes nothing.
        for _ in 0..10 {
            rates.check(b, 1.0, 5).unwrap();
        }
        assert!(rates.check(a, 1.0, 5).is_err());
    }
}
