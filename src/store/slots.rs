//! Deployment-wide extractor slots (`extractor_slots`): an extractor's
//! `max_concurrency` held by every worker process together. A call leases a
//! free slot (one whose lease is not running), renews the lease while it
//! lasts, and gives the slot back when it ends; a crashed holder's slots come
//! back when their leases run out. Each lease carries a token that rises with
//! every lease of the slot, so renewing or releasing under a token that is no
//! longer the slot's changes nothing (the fencing of job claims).
//!
//! A release notifies [`FREED`] with the extractor's name, so processes
//! waiting for a slot ask again at once instead of at their next poll.
//!
//! An extractor's rate limit is held the same way (`extractor_rates`): each
//! call takes the next start time and moves it one spacing on
//! ([`next_start`]).

use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

/// The channel a released slot is announced on (payload: the extractor).
pub const FREED: &str = "docstream_extractor_slot_freed";

/// A leased slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The slot's number, below the cap.
    pub slot: i32,
    /// The lease's token.
    pub token: i64,
}

/// Makes slots `0..cap` of `extractor` (those missing).
pub async fn provision(pool: &PgPool, extractor: &str, cap: i32) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO extractor_slots (extractor, slot)
         SELECT $1, n FROM generate_series(0, $2 - 1) AS n
         ON CONFLICT DO NOTHING",
    )
    .bind(extractor)
    .bind(cap)
    .execute(pool)
    .await?;
    Ok(())
}

/// Leases a free slot below `cap` of `extractor` to `holder` for `lease_s`
/// seconds, if one is free. Slots another transaction is taking are skipped,
/// so concurrent callers never wait on each other here.
pub async fn acquire(
    pool: &PgPool,
    extractor: &str,
    cap: i32,
    holder: Uuid,
    lease_s: f64,
) -> Result<Option<Lease>, StoreError> {
    // The free slot is chosen once, in a materialised CTE: as a subquery
    // in FROM, a plan that rescans it per row makes each rescan skip the
    // row this statement just updated and return the next, leasing every
    // free slot at once while the caller uses one (seen as 7 of 8 slots idle
    // for a lease's length).
    let leased: Option<(i32, i64)> = sqlx::query_as(
        "WITH free AS MATERIALIZED (
           SELECT slot FROM extractor_slots
            WHERE extractor = $1 AND slot < $2 AND leased_until < now()
            ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)
         UPDATE extractor_slots s
            SET holder = $3, token = s.token + 1,
                leased_until = now() + make_interval(secs => $4)
           FROM free
          WHERE s.extractor = $1 AND s.slot = free.slot
      RETURNING s.slot, s.token",
    )
    .bind(extractor)
    .bind(cap)
    .bind(holder)
    .bind(lease_s)
    .fetch_optional(pool)
    .await?;
    Ok(leased.map(|(slot, token)| Lease { slot, token }))
}

/// Extends `lease` of `extractor`'s slot by `lease_s` from now: false when
/// the lease is no longer the slot's (it ran out and was taken again).
pub async fn renew(
    pool: &PgPool,
    extractor: &str,
    lease: Lease,
    lease_s: f64,
) -> Result<bool, StoreError> {
    let renewed = sqlx::query(
        "UPDATE extractor_slots SET leased_until = now() + make_interval(secs => $4)
          WHERE extractor = $1 AND slot = $2 AND token = $3",
    )
    .bind(extractor)
    .bind(lease.slot)
    .bind(lease.token)
    .bind(lease_s)
    .execute(pool)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Gives `lease` of `extractor`'s slot back and announces it on [`FREED`];
/// false (and no announcement) when the lease was no longer the slot's.
pub async fn release(pool: &PgPool, extractor: &str, lease: Lease) -> Result<bool, StoreError> {
    let released: Option<bool> = sqlx::query_scalar(
        "WITH released AS (
           UPDATE extractor_slots SET holder = NULL, leased_until = '-infinity'
            WHERE extractor = $1 AND slot = $2 AND token = $3
           RETURNING 1)
         SELECT pg_notify($4, $1) IS NOT NULL FROM released",
    )
    .bind(extractor)
    .bind(lease.slot)
    .bind(lease.token)
    .bind(FREED)
    .fetch_optional(pool)
    .await?;
    Ok(released.is_some())
}

/// Slots leased now, by extractor (for the census and the dashboards).
pub async fn in_use(pool: &PgPool) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT extractor, count(*) FILTER (WHERE leased_until > now())
           FROM extractor_slots GROUP BY extractor ORDER BY extractor",
    )
    .fetch_all(pool)
    .await?)
}

/// Takes the next start of a call to `extractor`, at most one per
/// `spacing_s` across the deployment: how long to wait before starting
/// (zero when the start is now).
pub async fn next_start(
    pool: &PgPool,
    extractor: &str,
    spacing_s: f64,
) -> Result<std::time::Duration, StoreError> {
    let wait_s: f64 = sqlx::query_scalar(
        "INSERT INTO extractor_rates AS r (extractor, next_start)
         VALUES ($1, now() + make_interval(secs => $2))
         ON CONFLICT (extractor) DO UPDATE
            SET next_start = greatest(r.next_start, now()) + make_interval(secs => $2)
      RETURNING extract(epoch FROM r.next_start - now())::float8 - $2",
    )
    .bind(extractor)
    .bind(spacing_s)
    .fetch_one(pool)
    .await?;
    Ok(std::time::Duration::from_secs_f64(wait_s.max(0.0)))
}
