//! The webhook outbox (`webhook_deliveries`, migration 4), and the endpoints
//! that answered 410 Gone (`webhook_endpoints`, keyed by the URL's SHA-256
//! since migration 7, so URLs of any length can be recorded, and by the
//! tenant since migration 10: one tenant's 410 disables no other's).
//!
//! Rows are written by the terminal transitions themselves (see
//! `transitions::logged!`). A dispatcher works a delivery in attempts: each
//! attempt is claimed by one conditional statement that raises `attempts` (the
//! fencing token) and takes a lease, so two dispatchers never send the same
//! delivery at once, and only the holder of the current attempt can record its
//! outcome. Between attempts the row is pending with no lease and a due time.
//!
//! Orphan class 6: a pending delivery that was due longer than the threshold
//! ago and that nobody holds. Its dispatcher died, or lost the wake-up; a
//! reaper takes it ([`take_orphans`]) and hands it to its own dispatcher.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::StoreError;

/// One delivery, as an attempt sees it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Delivery {
    /// The `webhook-id`.
    pub id: String,
    /// The job it announces.
    pub extraction_id: Uuid,
    /// `extraction.succeeded`, `.failed` or `.cancelled`.
    pub event_type: String,
    /// Where it goes.
    pub url: String,
    /// The body, as fixed at the state change.
    pub payload: serde_json::Value,
    /// `pending`, `delivered`, `failed` or `disabled`.
    pub status: String,
    /// Attempts so far, this one included once claimed: the fencing token.
    pub attempts: i32,
    /// When the current attempt was due.
    pub next_attempt_at: DateTime<Utc>,
    /// When the state change wrote it.
    pub created_at: DateTime<Utc>,
    /// The endpoint answered 410 Gone to an earlier delivery of this job's
    /// tenant (claims only).
    #[sqlx(default)]
    pub endpoint_disabled: bool,
    /// The job's tenant (claims only).
    #[sqlx(default)]
    pub tenant_id: Uuid,
    /// The secrets this attempt is signed with: the job's tenant's current
    /// one, then, during a rotation, the previous one (claims only).
    #[sqlx(default)]
    pub secrets: Option<Vec<String>>,
}

/// How an attempt ended, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Final {
    /// The endpoint answered 2xx.
    Delivered,
    /// No more attempts: refused by the SSRF guard, or out of attempts.
    Failed,
    /// The endpoint answered 410 Gone, now or before.
    Disabled,
}

impl Final {
    fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Disabled => "disabled",
        }
    }
}

/// Claims the next attempt of delivery `id` for `lease_s` seconds, if it is
/// pending, due, and nobody holds it.
pub async fn claim<'e>(
    executor: impl PgExecutor<'e>,
    id: &str,
    lease_s: f64,
) -> Result<Option<Delivery>, StoreError> {
    let row = sqlx::query_as::<_, Delivery>(
        "UPDATE webhook_deliveries
            SET attempts = attempts + 1, orphaned_at = NULL,
                lease_expires_at = now() + make_interval(secs => $2)
          WHERE id = $1 AND status = 'pending' AND next_attempt_at <= now()
            AND (lease_expires_at IS NULL OR lease_expires_at < now())
      RETURNING webhook_deliveries.*,
                EXISTS (SELECT 1 FROM webhook_endpoints e JOIN extractions j
                                        ON j.tenant_id = e.tenant_id
                         WHERE j.id = webhook_deliveries.extraction_id
                           AND e.url_sha256 = webhook_url_sha256(webhook_deliveries.url)
                           AND e.url = webhook_deliveries.url) AS endpoint_disabled,
                (SELECT j.tenant_id FROM extractions j
                  WHERE j.id = webhook_deliveries.extraction_id) AS tenant_id,
                (SELECT array_remove(ARRAY[t.webhook_secret,
                                           CASE WHEN t.webhook_previous_until > now()
                                                THEN t.webhook_secret_previous END], NULL)
                   FROM extractions j JOIN tenants t ON t.id = j.tenant_id
                  WHERE j.id = webhook_deliveries.extraction_id) AS secrets",
    )
    .bind(id)
    .bind(lease_s)
    .fetch_optional(executor)
    .await?;
    Ok(row)
}

/// Records the last attempt's end; false if `attempt` is no longer current.
pub async fn finish<'e>(
    executor: impl PgExecutor<'e>,
    id: &str,
    attempt: i32,
    outcome: Final,
    status_code: Option<u16>,
    error: Option<&str>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE webhook_deliveries
            SET status = $3, finished_at = now(), lease_expires_at = NULL,
                last_status_code = $4, last_error = $5
          WHERE id = $1 AND attempts = $2 AND status = 'pending'",
    )
    .bind(id)
    .bind(attempt)
    .bind(outcome.as_str())
    .bind(status_code.map(i32::from))
    .bind(error)
    .execute(executor)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Schedules the next attempt `delay_s` from now; false if `attempt` is no
/// longer current.
pub async fn retry_later<'e>(
    executor: impl PgExecutor<'e>,
    id: &str,
    attempt: i32,
    delay_s: f64,
    status_code: Option<u16>,
    error: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE webhook_deliveries
            SET next_attempt_at = now() + make_interval(secs => $3), lease_expires_at = NULL,
                last_status_code = $4, last_error = $5
          WHERE id = $1 AND attempts = $2 AND status = 'pending'",
    )
    .bind(id)
    .bind(attempt)
    .bind(delay_s)
    .bind(status_code.map(i32::from))
    .bind(error)
    .execute(executor)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks `url` as gone (it answered 410) for the tenant of `delivery`'s
/// job, and for no other (migration 10); true if it was not already.
///
/// Endpoints are keyed by the SHA-256 of the URL (`url_sha256`, generated by
/// Postgres, migration 7), not by its text: a btree entry holds at most
/// 2,704 bytes, and a longer URL's 410 must be recorded all the same.
pub async fn disable_endpoint<'e>(
    executor: impl PgExecutor<'e>,
    delivery: &Delivery,
    reason: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO webhook_endpoints (tenant_id, url, reason)
         SELECT tenant_id, $2, $3 FROM extractions WHERE id = $1
         ON CONFLICT (tenant_id, url_sha256) DO NOTHING",
    )
    .bind(delivery.extraction_id)
    .bind(&delivery.url)
    .bind(reason)
    .execute(executor)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Takes up to `limit` class-6 orphans: pending, due more than `threshold_s`
/// ago, held by nobody, and not revived within the threshold (each with its
/// job's tenant). Stamps them, so
/// concurrent sweeps hand each out once per threshold.
pub async fn take_orphans<'e>(
    executor: impl PgExecutor<'e>,
    threshold_s: f64,
    limit: i64,
) -> Result<Vec<(String, Uuid, f64)>, StoreError> {
    let rows = sqlx::query_as::<_, (String, Uuid, f64)>(
        "WITH found AS (
             SELECT id, next_attempt_at + make_interval(secs => $1) AS since
               FROM webhook_deliveries
              WHERE status = 'pending'
                AND next_attempt_at < now() - make_interval(secs => $1)
                AND (lease_expires_at IS NULL OR lease_expires_at < now())
                AND (revived_at IS NULL OR revived_at < now() - make_interval(secs => $1))
              ORDER BY next_attempt_at
              LIMIT $2
                FOR UPDATE SKIP LOCKED)
         UPDATE webhook_deliveries d
            SET revived_at = now(), orphaned_at = COALESCE(d.orphaned_at, found.since)
           FROM found
          WHERE d.id = found.id
      RETURNING d.id, (SELECT j.tenant_id FROM extractions j WHERE j.id = d.extraction_id),
                extract(epoch FROM now() - found.since)::float8",
    )
    .bind(threshold_s)
    .bind(limit)
    .fetch_all(executor)
    .await?;
    Ok(rows)
}
