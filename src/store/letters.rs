//! The dead letters that belong to a tenant (`tenant_dead_letters`): the
//! intake records a row for each record it refused after the record's key
//! named its tenant, so that the tenant can list its own letters
//! (`GET /v1/dead-letters`) while operators read the topic itself.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

/// Where a refused record was, and why it was refused.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, schemars::JsonSchema)]
#[schemars(rename = "DeadLetter", deny_unknown_fields)]
pub struct TenantLetter {
    /// The letter's id (`POST /v1/dead-letters/{id}/replay`); the list runs
    /// newest first by it.
    pub id: i64,
    /// The topic the record was produced to.
    pub source_topic: String,
    /// Its partition.
    pub source_partition: i32,
    /// Its offset.
    pub source_offset: i64,
    /// The record's idempotency key, if it decoded far enough to tell.
    pub idempotency_key: Option<String>,
    /// Machine-readable class (`invalid_request`, `key_reused`, …).
    pub error_kind: String,
    /// Why it was refused.
    pub error: String,
    /// When it was refused.
    pub created_at: DateTime<Utc>,
    /// When the tenant replayed it, if it did.
    pub replayed_at: Option<DateTime<Utc>>,
    /// The start of the refused request's JSON text (at most
    /// [`EXCERPT_CHARS`] characters), if it decoded that far.
    pub excerpt: Option<String>,
}

/// How much of a refused request a tenant's letter keeps.
pub const EXCERPT_CHARS: usize = 2048;

/// A refused record of tenant `tenant_id`, at `source` (topic, partition,
/// offset), with its idempotency key and request text where they decoded;
/// recorded once however often the record is handled.
pub async fn record(
    pool: &PgPool,
    tenant_id: Uuid,
    source: (&str, i32, i64),
    (idempotency_key, request): (Option<&str>, Option<&str>),
    (kind, error): (&str, &str),
) -> Result<(), StoreError> {
    let excerpt = request.map(|r| r.chars().take(EXCERPT_CHARS).collect::<String>());
    sqlx::query(
        "INSERT INTO tenant_dead_letters
             (tenant_id, source_topic, source_partition, source_offset, idempotency_key, error_kind,
              error, excerpt)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (source_topic, source_partition, source_offset) DO NOTHING",
    )
    .bind(tenant_id)
    .bind(source.0)
    .bind(source.1)
    .bind(source.2)
    .bind(idempotency_key)
    .bind(kind)
    .bind(error)
    .bind(excerpt)
    .execute(pool)
    .await?;
    Ok(())
}

/// A page of tenant `tenant_id`'s letters, newest first, below `before`.
pub async fn list(
    pool: &PgPool,
    tenant_id: Uuid,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<TenantLetter>, StoreError> {
    let letters = sqlx::query_as(
        "SELECT id, source_topic, source_partition, source_offset, idempotency_key,
                error_kind, error, created_at, replayed_at, excerpt
           FROM tenant_dead_letters
          WHERE tenant_id = $1 AND ($2::bigint IS NULL OR id < $2)
          ORDER BY id DESC LIMIT $3",
    )
    .bind(tenant_id)
    .bind(before)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(letters)
}

/// Why a letter cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayRefused {
    /// The tenant has no letter with this id.
    #[error("no dead letter {0}")]
    NotFound(i64),
    /// It was replayed before (or is being replayed now).
    #[error("dead letter {0} was replayed at {1}")]
    Replayed(i64, DateTime<Utc>),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ReplayRefused {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// Claims letter `id` of tenant `tenant_id` for its one replay: where its
/// original record is (topic, partition, offset).
pub async fn claim_replay(
    pool: &PgPool,
    tenant_id: Uuid,
    id: i64,
) -> Result<(String, i32, i64), ReplayRefused> {
    let claimed: Option<(String, i32, i64)> = sqlx::query_as(
        "UPDATE tenant_dead_letters SET replayed_at = now()
          WHERE tenant_id = $1 AND id = $2 AND replayed_at IS NULL
      RETURNING source_topic, source_partition, source_offset",
    )
    .bind(tenant_id)
    .bind(id)
    .fetch_optional(pool)
    .await?;
    if let Some(source) = claimed {
        return Ok(source);
    }
    let replayed: Option<Option<DateTime<Utc>>> = sqlx::query_scalar(
        "SELECT replayed_at FROM tenant_dead_letters WHERE tenant_id = $1 AND id = $2",
    )
    .bind(tenant_id)
    .bind(id)
    .fetch_optional(pool)
    .await?;
    match replayed.flatten() {
        Some(at) => Err(ReplayRefused::Replayed(id, at)),
        None => Err(ReplayRefused::NotFound(id)),
    }
}

/// Ends letter `id`'s replay: where the copy went, or (`None`: the broker
/// refused it) gives the claim back.
pub async fn finish_replay(
    pool: &PgPool,
    id: i64,
    place: Option<(i32, i64)>,
) -> Result<(), StoreError> {
    let statement = match place {
        Some(_) => {
            "UPDATE tenant_dead_letters SET replay_partition = $2, replay_offset = $3 WHERE id = $1"
        }
        None => "UPDATE tenant_dead_letters SET replayed_at = NULL WHERE id = $1",
    };
    sqlx::query(statement)
        .bind(id)
        .bind(place.map(|p| p.0))
        .bind(place.map(|p| p.1))
        .execute(pool)
        .await?;
    Ok(())
}
