//! Requests of the Kafka intake held while their tenant is at its cap on
//! open jobs (table `intake_held`): the intake holds a valid request there
//! instead of retrying its record in place, and its releaser submits held
//! requests, oldest first, once the tenant has room. One row per tenant and
//! idempotency key, so a record delivered twice is held once.

use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{NewExtraction, StoreError};
use crate::domain::ExtractionRequest;

/// The record a held request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

/// What [`hold`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Hold {
    /// The request is held.
    Held,
    /// The same request was held under its key already.
    Repeat,
    /// Another request is held under its key.
    KeyReused,
    /// The tenant has `max_held` requests held already; nothing was written.
    Full,
}

/// Holds `new` (which has an idempotency key), unless its tenant holds
/// `max_held` requests already.
pub async fn hold(
    pool: &PgPool,
    new: &NewExtraction,
    origin: &Origin,
    max_held: i64,
) -> Result<Hold, StoreError> {
    let key = new.idempotency_key.as_deref().unwrap_or_default();
    // The snapshot the outer SELECT reads predates the INSERT: `same` is NULL
    // for a row inserted now, and compares the request of a row held before.
    let (inserted, same, room): (i64, Option<bool>, bool) = sqlx::query_as(
        "WITH room AS (
             SELECT count(*) < $5 AS ok
               FROM (SELECT 1 FROM intake_held WHERE tenant_id = $1 LIMIT $5) h),
         ins AS (
             INSERT INTO intake_held (tenant_id, idempotency_key, id, request,
                                      source_topic, source_partition, source_offset)
             SELECT $1, $2, $3, $4, $6, $7, $8 FROM room WHERE room.ok
             ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
             RETURNING 1)
         SELECT (SELECT count(*) FROM ins),
                (SELECT request = $4 FROM intake_held WHERE tenant_id = $1 AND idempotency_key = $2),
                (SELECT ok FROM room)",
    )
    .bind(new.tenant_id)
    .bind(key)
    .bind(new.id)
    .bind(Json(&new.request))
    .bind(max_held)
    .bind(&origin.topic)
    .bind(origin.partition)
    .bind(origin.offset)
    .fetch_one(pool)
    .await?;
    Ok(match (inserted, same, room) {
        (1, _, _) => Hold::Held,
        (_, Some(true), _) => Hold::Repeat,
        (_, Some(false), _) => Hold::KeyReused,
        (_, None, false) => Hold::Full,
        // A twin held it after this statement's snapshot was taken: try again.
        (_, None, true) => return Err(sqlx::Error::RowNotFound.into()),
    })
}

/// The tenants that have requests held.
pub async fn tenants(pool: &PgPool) -> Result<Vec<Uuid>, StoreError> {
    let tenants = sqlx::query_scalar("SELECT DISTINCT tenant_id FROM intake_held")
        .fetch_all(pool)
        .await?;
    Ok(tenants)
}

/// A held request, as the job it becomes.
#[derive(Debug, Clone)]
pub struct Held {
    /// The job, as it was validated when it was held.
    pub new: NewExtraction,
    /// Its record.
    pub origin: Origin,
}

/// The `limit` oldest requests `tenant` has held, each as a job under the
/// tenant's cap as it is now: its own (`tenants.max_open_jobs`), or
/// `default_cap` where it has none.
pub async fn oldest(
    pool: &PgPool,
    tenant: Uuid,
    default_cap: Option<i64>,
    limit: i64,
) -> Result<Vec<Held>, StoreError> {
    type Row = (
        String,
        Uuid,
        Option<i32>,
        Json<ExtractionRequest>,
        String,
        i32,
        i64,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT h.idempotency_key, h.id, t.max_open_jobs, h.request,
                h.source_topic, h.source_partition, h.source_offset
           FROM intake_held h JOIN tenants t ON t.id = h.tenant_id
          WHERE h.tenant_id = $1
          ORDER BY h.held_at LIMIT $2",
    )
    .bind(tenant)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let cap = |own: Option<i32>| match own {
        None => default_cap,
        Some(own) => (own > 0).then_some(i64::from(own)),
    };
    let held = |(key, id, own_cap, request, topic, partition, offset): Row| Held {
        new: NewExtraction {
            id,
            tenant_id: tenant,
            max_open_jobs: cap(own_cap),
            idempotency_key: Some(key),
            request: request.0,
        },
        origin: Origin {
            topic,
            partition,
            offset,
        },
    };
    Ok(rows.into_iter().map(held).collect())
}

/// Forgets a held request: it was submitted, or dead-lettered.
pub async fn release(pool: &PgPool, tenant: Uuid, key: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM intake_held WHERE tenant_id = $1 AND idempotency_key = $2")
        .bind(tenant)
        .bind(key)
        .execute(pool)
        .await?;
    Ok(())
}
