//! Who is calling: an API key, presented as `Authorization: Bearer <key>` (or
//! in a Kafka record's headers), becomes a [`Caller`]: the tenant that owns
//! the key and the scopes it has.
//!
//! What a process learns about a key it keeps for `api_key_cache_s` (at most
//! 5 s), so a busy client costs one lookup per key per period, and a key that
//! is revoked, or whose tenant is deleted, is refused by every process within
//! that period. A key in use is looked up again in the background from a
//! quarter of the period on, so its requests do not wait for the lookup. Only one lookup of a key runs at a time; the requests that
//! present the key meanwhile wait for it. A lookup runs detached, within the
//! answer bound, so one whose requests all went away still ends and frees its
//! pool connection. Unknown keys are remembered too, so
//! one bad key repeated does not cost a lookup per request; failed lookups
//! (the database is away) are not. The cache holds at most
//! [`MAX_CACHED_KEYS`] keys; when it is full, the keys that are not valid
//! are dropped first, so made-up keys cannot push out working ones. A caller
//! may gate the lookups of keys the process does not know
//! ([`Authenticator::authenticate_gated`]): the API limits them per peer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{key_hash, key_is_well_formed, QuotaOverrides, Scope};
use crate::store::tenants::{self, KeyOwner};
use crate::store::StoreError;

/// The most keys a process remembers; past it, the expired ones are dropped,
/// and if none had expired, all of them.
pub const MAX_CACHED_KEYS: usize = 10_000;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// The tenant the key belongs to: every job the caller makes or sees is this tenant's.
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant: String,
    /// The key's id (for logs; never the key).
    pub key_id: Uuid,
    /// The tenant's own quotas (the deployment's settings fill the rest).
    pub quota: QuotaOverrides,
    scopes: Vec<Scope>,
    /// The digest of the key it presented, to look the key up again
    /// ([`Authenticator::recheck`]); empty for a caller made without one.
    key_hash: KeyHash,
}

/// A key's SHA-256, kept out of `Debug` output (and so out of logs).
#[derive(Clone, Default, PartialEq)]
struct KeyHash(Vec<u8>);

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHash(…)")
    }
}

impl Caller {
    /// `Ok` when the caller's key has `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        match self.scopes.contains(&scope) {
            true => Ok(()),
            false => Err(AuthError::MissingScope(scope)),
        }
    }

    /// The scopes of the caller's key.
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }
}

impl From<KeyOwner> for Caller {
    fn from(owner: KeyOwner) -> Self {
        Self {
            tenant_id: owner.tenant_id,
            tenant: owner.tenant,
            key_id: owner.key_id,
            quota: owner.quota,
            scopes: owner.scopes,
            key_hash: KeyHash::default(),
        }
    }
}

/// Why a caller was not let in.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// No key was presented.
    #[error("an API key is required: send Authorization: Bearer <key>")]
    Missing,
    /// The key is not one this deployment issued, or it was revoked, or its
    /// tenant was deleted (the caller is not told which).
    #[error("the API key is not valid")]
    Invalid,
    /// The key lacks the scope the request needs.
    #[error("the API key lacks the {0} scope")]
    MissingScope(Scope),
    /// The key could not be looked up: the database is away.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The key is not one this process knows, and its sender has presented
    /// too many keys that were not valid lately to have another looked up;
    /// how long until it may.
    #[error("too many requests from this address presented no valid API key; retry with a valid key after {}s", .0.as_secs_f64().ceil().max(1.0))]
    Throttled(Duration),
}

/// A key's lookup: shared by every request that presents the key while it
/// runs, and remembered for the cache period once it is done.
type Lookup = Shared<BoxFuture<'static, Result<Option<KeyOwner>, StoreError>>>;

/// A lookup, and when it started.
struct Remembered {
    lookup: Lookup,
    at: Instant,
    /// A lookup to replace this one is under way.
    refreshing: bool,
}

/// Turns presented keys into callers, through a short-lived cache.
#[derive(Clone)]
pub struct Authenticator {
    pool: PgPool,
    ttl: Duration,
    bound: Duration,
    cache: Arc<Mutex<HashMap<Vec<u8>, Remembered>>>,
}

impl Authenticator {
    /// Looks keys up in `pool`, each lookup within `bound`, remembering each
    /// for `ttl`.
    pub fn new(pool: PgPool, ttl: Duration, bound: Duration) -> Self {
        Self {
            pool,
            ttl,
            bound,
            cache: Arc::default(),
        }
    }

    /// Whether `caller`'s key still names the same tenant and still has
    /// `scope`, as of the cache (at most `api_key_cache_s` old): a stream
    /// opened with a key asks this while it runs, so a revoked key or a
    /// deleted tenant does not keep its sockets. `Ok` while the store cannot
    /// be asked: an outage is not a revocation.
    pub async fn recheck(&self, caller: &Caller, scope: Scope) -> Result<(), AuthError> {
        if caller.key_hash.0.is_empty() {
            return Ok(());
        }
        let hash = &caller.key_hash.0;
        let Ok(lookup) = self.lookup(hash, || Ok(())) else {
            return Ok(());
        };
        match lookup.await {
            Ok(Some(owner)) if owner.key_id == caller.key_id && owner.scopes.contains(&scope) => {
                Ok(())
            }
            Ok(Some(_)) => Err(AuthError::MissingScope(scope)),
            Ok(None) => Err(AuthError::Invalid),
            Err(_) => {
                self.forget_failed(hash);
                Ok(())
            }
        }
    }

    /// The caller whose key is `secret` (`None`: no key was presented).
    pub async fn authenticate(&self, secret: Option<&str>) -> Result<Caller, AuthError> {
        self.authenticate_gated(secret, || Ok(())).await
    }

    /// [`authenticate`](Self::authenticate), but a key this process does not
    /// know is looked up only if `gate` lets it (else [`AuthError::Throttled`]
    /// with the wait `gate` gives): a known key is never held up by it.
    pub async fn authenticate_gated(
        &self,
        secret: Option<&str>,
        gate: impl FnOnce() -> Result<(), Duration>,
    ) -> Result<Caller, AuthError> {
        let secret = secret.ok_or(AuthError::Missing)?;
        if !key_is_well_formed(secret) {
            return Err(AuthError::Invalid);
        }
        let hash = key_hash(secret);
        let lookup = self.lookup(&hash, gate)?;
        match lookup.await {
            Ok(owner) => {
                let caller = owner.map(Caller::from).ok_or(AuthError::Invalid)?;
                Ok(Caller {
                    key_hash: KeyHash(hash),
                    ..caller
                })
            }
            Err(e) => {
                // A failed lookup is not remembered: the next request asks again.
                self.forget_failed(&hash);
                Err(AuthError::Store(e))
            }
        }
    }

    /// The lookup of `hash`: the one under way or remembered, else a new one.
    /// Only one runs per key at a time, so when a busy key's entry expires,
    /// its concurrent requests wait for one statement instead of each
    /// sending their own (which, on a slow database, would take the pool).
    /// A key in use is looked up again in the background once its entry is
    /// a quarter of its period old, so its requests never wait for a lookup
    /// (on a slow database, a stall of every request of the key each
    /// period), as long as a lookup takes under three quarters of it. A new
    /// lookup starts only if `gate` lets it.
    fn lookup(
        &self,
        hash: &[u8],
        gate: impl FnOnce() -> Result<(), Duration>,
    ) -> Result<Lookup, AuthError> {
        let mut cache = self.cache.lock().expect("key cache lock");
        if let Some(remembered) = cache.get_mut(hash) {
            let running = remembered.lookup.peek().is_none();
            let age = remembered.at.elapsed();
            if running || age < self.ttl {
                let known = matches!(remembered.lookup.peek(), Some(Ok(_)));
                if known && age >= self.ttl / 4 && !remembered.refreshing {
                    remembered.refreshing = true;
                    self.refresh(hash.to_vec());
                }
                return Ok(remembered.lookup.clone());
            }
        }
        gate().map_err(AuthError::Throttled)?;
        if cache.len() >= MAX_CACHED_KEYS {
            // Keys that are not valid go first, so a flood of made-up keys
            // cannot push out the keys of the clients that are working.
            let ttl = self.ttl;
            cache.retain(|_, r| {
                r.at.elapsed() < ttl && matches!(r.lookup.peek(), Some(Ok(Some(_))))
            });
            if cache.len() >= MAX_CACHED_KEYS {
                cache.clear();
            }
        }
        let lookup = self.start(hash.to_vec());
        let remembered = Remembered {
            lookup: lookup.clone(),
            at: Instant::now(),
            refreshing: false,
        };
        if !self.ttl.is_zero() {
            cache.insert(hash.to_vec(), remembered);
        }
        Ok(lookup)
    }

    /// Starts a lookup of `hash`. Detached, with its own bound: the
    /// statement runs to its end (and gives its connection back) even when
    /// every request waiting for it has gone, and never longer than the bound.
    fn start(&self, hash: Vec<u8>) -> Lookup {
        let (pool, bound) = (self.pool.clone(), self.bound);
        let running = tokio::spawn(async move {
            let owner = tokio::time::timeout(bound, tenants::key_owner(&pool, &hash)).await;
            owner.unwrap_or_else(|_| Err(StoreError::from(sqlx::Error::PoolTimedOut)))
        });
        async move {
            running
                .await
                .unwrap_or_else(|_| Err(StoreError::from(sqlx::Error::PoolClosed)))
        }
        .boxed()
        .shared()
    }

    /// Looks `hash` up again and, once answered, puts the answer in place of
    /// the remembered one (a failed lookup leaves it, to expire as it would).
    fn refresh(&self, hash: Vec<u8>) {
        let (cache, at) = (self.cache.clone(), Instant::now());
        let lookup = self.start(hash.clone());
        tokio::spawn(async move {
            let answered = lookup.clone().await.is_ok();
            let mut cache = cache.lock().expect("key cache lock");
            match (answered, cache.get_mut(&hash)) {
                (true, _) => {
                    let refreshing = false;
                    cache.insert(
                        hash,
                        Remembered {
                            lookup,
                            at,
                            refreshing,
                        },
                    );
                }
                (false, Some(remembered)) => remembered.refreshing = false,
                (false, None) => {}
            }
        });
    }

    fn forget_failed(&self, hash: &[u8]) {
        let mut cache = self.cache.lock().expect("key cache lock");
        let failed = cache
            .get(hash)
            .is_some_and(|r| matches!(r.lookup.peek(), Some(Err(_))));
        if failed {
            cache.remove(hash);
        }
    }
}

/// The key in an `Authorization` header's value: `Bearer <key>`, the scheme's
/// case ignored.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer("Bearer dsk_1"), Some("dsk_1"));
        assert_eq!(bearer("bearer  dsk_1 "), Some("dsk_1"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("dsk_1"), None);
    }

    #[tokio::test]
    async fn made_up_keys_do_not_push_a_working_key_out_of_a_full_cache() {
        // The store is away: every lookup started here fails.
        let pool = PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none").unwrap();
        let auth = Authenticator::new(pool, Duration::from_secs(60), Duration::from_millis(100));
        let working = vec![7; 32];
        let owner = KeyOwner {
            tenant_id: Uuid::nil(),
            tenant: "t".into(),
            key_id: Uuid::nil(),
            scopes: vec![Scope::Read],
            quota: QuotaOverrides::default(),
        };
        let known: Lookup = futures::future::ready(Ok(Some(owner))).boxed().shared();
        let _ = known.clone().await;
        auth.cache.lock().unwrap().insert(
            working.clone(),
            Remembered {
                lookup: known,
                at: Instant::now(),
                refreshing: false,
            },
        );
        for n in 0..MAX_CACHED_KEYS as u32 + 10 {
            let made_up = n.to_be_bytes().to_vec();
            let _ = auth.lookup(&made_up, || Ok(()));
        }
        assert!(auth.cache.lock().unwrap().contains_key(&working));
        // A gate that says no stops a new lookup, not a known key.
        let shut = || Err(Duration::from_secs(3));
        assert!(matches!(
            auth.lookup(&[1; 32], shut),
            Err(AuthError::Throttled(_))
        ));
        assert!(auth.lookup(&working, shut).is_ok());
    }

    #[test]
    fn a_caller_has_only_its_scopes() {
        let caller = Caller {
            tenant_id: Uuid::nil(),
            tenant: "t".into(),
            key_id: Uuid::nil(),
            quota: QuotaOverrides::default(),
            scopes: vec![Scope::Read],
            key_hash: KeyHash(vec![1; 32]),
        };
        assert!(
            !format!("{caller:?}").contains("[1, 1"),
            "the key's digest stays out of logs"
        );
        assert!(caller.require(Scope::Read).is_ok());
        assert!(matches!(
            caller.require(Scope::Submit),
            Err(AuthError::MissingScope(Scope::Submit))
        ));
    }
}
