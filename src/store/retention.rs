//! What a tenant no longer keeps: a job's content erased on request
//! ([`erase`]), finished jobs purged once their tenant's retention ran out
//! ([`purge_expired`]), and a deleted tenant's jobs purged on request
//! ([`purge_tenant`]).
//!
//! **Where a job's content lives:** the request (`extraction_requests`),
//! the results (`extraction_results`), the webhook deliveries (their
//! payloads carry the result and the metadata), the error texts on the
//! job row (an extractor's message may quote the document), and the
//! tenant's dead letters of its idempotency key (`tenant_dead_letters`: a
//! refused record of that key, whose excerpt and reason quote the request).
//! An erasure removes all of these and keeps a tombstone: the job row and
//! its request row without the request, so the idempotency key still names
//! the job; a letter keeps where its record was and its kind. A purge
//! removes every row of the job, the transition log with it.
//!
//! Copies outside Postgres are not reached: the events on the Kafka topics
//! (which carry errors, never documents or results) and the letters on
//! the DLQ topic (which carry an excerpt of the record) expire with their
//! topics' retention.
//!
//! Each purge statement deletes at most a batch, in one short transaction,
//! skipping rows another purger holds; the callers loop.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{Extraction, StoreError};

/// What [`erase`] found.
#[derive(Debug)]
pub enum Erased {
    /// The content is gone now: the tombstone, and the files (SHA-256) the
    /// job named, which the caller deletes unless another job names them
    /// (`Files::forget`).
    Now(Extraction, Vec<String>),
    /// It was erased before.
    Already,
    /// The job is not finished (or its bbox refinement is still to run):
    /// cancel it, or wait for it, first.
    NotFinished(Extraction),
    /// No job of the tenant has this id.
    NotFound,
}

/// What an erased job's dead letters say in place of their reason (whose
/// text may quote the refused request); their kind stays.
pub const ERASED_LETTER: &str = "erased on request with the extraction of its idempotency key";

/// Erases tenant `tenant_id`'s finished job `id`: its request, results,
/// the document read from its file and its claim on the file, webhook
/// deliveries, error texts, and the excerpts and reasons of the tenant's
/// dead letters of its idempotency key, in one statement that also logs
/// the transition `erase`.
///
/// The job's row is locked first, in a statement of its own: a correction
/// that locked it first ([`super::corrections::correct`]) has committed by
/// then, and the erasing statement, which reads the database afresh, sees
/// its rows and deletes them. In one statement, what a correction wrote
/// after the statement began would be left behind.
pub async fn erase(pool: &PgPool, tenant_id: Uuid, id: Uuid) -> Result<Erased, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Tombstone {
        #[sqlx(flatten)]
        job: Extraction,
        files: Vec<String>,
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT 1 FROM extractions WHERE id = $1 AND tenant_id = $2 FOR NO KEY UPDATE")
        .bind(id)
        .bind(tenant_id)
        .execute(&mut *tx)
        .await?;
    let erased: Option<Tombstone> = sqlx::query_as(
        "WITH erased AS (
             UPDATE extractions SET erased_at = now(), error = NULL, bbox_error = NULL
              WHERE id = $1 AND tenant_id = $2 AND erased_at IS NULL
                AND status IN ('succeeded', 'failed', 'cancelled')
                AND (bbox_status IS NULL OR bbox_status IN ('succeeded', 'failed'))
             RETURNING extractions.*),
         requests AS (
             UPDATE extraction_requests SET request = NULL
              WHERE id IN (SELECT id FROM erased)),
         results AS (
             DELETE FROM extraction_results WHERE id IN (SELECT id FROM erased)),
         documents AS (
             DELETE FROM extraction_documents WHERE id IN (SELECT id FROM erased)),
         corrections AS (
             DELETE FROM field_corrections WHERE extraction_id IN (SELECT id FROM erased)),
         files AS (
             DELETE FROM file_jobs WHERE extraction_id IN (SELECT id FROM erased)
             RETURNING sha256),
         hooks AS (
             DELETE FROM webhook_deliveries WHERE extraction_id IN (SELECT id FROM erased)),
         letters AS (
             UPDATE tenant_dead_letters l SET excerpt = NULL, error = $3
               FROM erased JOIN extraction_requests q ON q.id = erased.id
              WHERE l.tenant_id = erased.tenant_id AND l.idempotency_key = q.idempotency_key),
         logged AS (
             INSERT INTO extraction_transitions (extraction_id, transition, token)
             SELECT id, 'erase', NULL FROM erased)
         SELECT erased.*, ARRAY(SELECT sha256 FROM files) AS files FROM erased",
    )
    .bind(id)
    .bind(tenant_id)
    .bind(ERASED_LETTER)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    if let Some(Tombstone { job, files }) = erased {
        return Ok(Erased::Now(job, files));
    }
    match super::get_for_tenant(pool, tenant_id, id).await? {
        None => Ok(Erased::NotFound),
        Some(row) if row.erased_at.is_some() => Ok(Erased::Already),
        Some(row) => Ok(Erased::NotFinished(row)),
    }
}

/// Deletes every row of the jobs the CTE `doomed` (a query of `id`s) names:
/// the job, its request, results, the document read from its file, its
/// corrections, its claim on the file and its transition log (which have no foreign key), and through its foreign key
/// its webhook deliveries.
macro_rules! purge {
    ($doomed:literal) => {
        concat!(
            "WITH doomed AS (",
            $doomed,
            "),
             requests AS (DELETE FROM extraction_requests WHERE id IN (SELECT id FROM doomed)),
             results AS (DELETE FROM extraction_results WHERE id IN (SELECT id FROM doomed)),
             documents AS (DELETE FROM extraction_documents WHERE id IN (SELECT id FROM doomed)),
             corrections AS (DELETE FROM field_corrections
                              WHERE extraction_id IN (SELECT id FROM doomed)),
             files AS (DELETE FROM file_jobs WHERE extraction_id IN (SELECT id FROM doomed)),
             log AS (DELETE FROM extraction_transitions
                      WHERE extraction_id IN (SELECT id FROM doomed)),
             jobs AS (DELETE FROM extractions WHERE id IN (SELECT id FROM doomed) RETURNING id)
             SELECT count(*) FROM jobs"
        )
    };
}

/// Purges up to `batch` finished jobs (of any tenant) that have been
/// finished longer than their tenant's retention (`default` where the
/// tenant has none; zero keeps them); how many.
///
/// Each tenant's finished jobs are walked oldest id first (a UUIDv7 starts
/// with its submit time), below the id of the retention's cut-off: a job
/// submitted after it cannot have finished before it, so the walk never
/// reads the jobs that are kept.
pub async fn purge_expired(
    pool: &PgPool,
    default: Duration,
    batch: i64,
) -> Result<u64, StoreError> {
    let purged: i64 = sqlx::query_scalar(purge!(
        "SELECT e.id
           FROM tenants t
           CROSS JOIN LATERAL (SELECT make_interval(secs => COALESCE(t.retention_s, $1)) AS keep) k
           CROSS JOIN LATERAL (
               SELECT e.id FROM extractions e
                WHERE e.tenant_id = t.id
                  AND e.status IN ('succeeded', 'failed', 'cancelled')
                  AND e.id < uuid_floor(now() - k.keep)
                  AND e.finished_at < now() - k.keep
                  AND (e.bbox_status IS NULL OR e.bbox_status IN ('succeeded', 'failed'))
                ORDER BY e.id
                LIMIT $2
                FOR UPDATE OF e SKIP LOCKED) e
          WHERE COALESCE(t.retention_s, $1) > 0
          LIMIT $2"
    ))
    .bind(default.as_secs() as i64)
    .bind(batch)
    .fetch_one(pool)
    .await?;
    Ok(purged as u64)
}

/// Purges up to `batch` of tenant `tenant_id`'s finished jobs (bbox
/// refinement done), whatever their age; how many.
pub async fn purge_tenant(pool: &PgPool, tenant_id: Uuid, batch: i64) -> Result<u64, StoreError> {
    let purged: i64 = sqlx::query_scalar(purge!(
        "SELECT id FROM extractions
          WHERE tenant_id = $1 AND status IN ('succeeded', 'failed', 'cancelled')
            AND (bbox_status IS NULL OR bbox_status IN ('succeeded', 'failed'))
          LIMIT $2
          FOR UPDATE SKIP LOCKED"
    ))
    .bind(tenant_id)
    .bind(batch)
    .fetch_one(pool)
    .await?;
    Ok(purged as u64)
}

/// What a tenant keeps only for its retention, besides its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aged {
    /// Finished bulk operations, with their outcomes.
    BulkOperations,
    /// The rows of its dead letters (`store::letters`).
    DeadLetters,
}

impl Aged {
    /// Its name, as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BulkOperations => "bulk_operations",
            Self::DeadLetters => "dead_letters",
        }
    }
}

/// Deletes up to `batch` rows of `aged` that their tenant's retention
/// (`default` where it has none; zero keeps them) has run out for; how many.
pub async fn purge_aged(
    pool: &PgPool,
    aged: Aged,
    default: Duration,
    batch: i64,
) -> Result<u64, StoreError> {
    let sql = match aged {
        Aged::BulkOperations => {
            "DELETE FROM bulk_operations WHERE id IN (
                 SELECT o.id FROM bulk_operations o JOIN tenants t ON t.id = o.tenant_id
                  WHERE COALESCE(t.retention_s, $1) > 0
                    AND o.finished_at < now() - make_interval(secs => COALESCE(t.retention_s, $1))
                  LIMIT $2 FOR UPDATE OF o SKIP LOCKED)"
        }
        Aged::DeadLetters => {
            "DELETE FROM tenant_dead_letters WHERE id IN (
                 SELECT l.id FROM tenant_dead_letters l JOIN tenants t ON t.id = l.tenant_id
                  WHERE COALESCE(t.retention_s, $1) > 0
                    AND l.created_at < now() - make_interval(secs => COALESCE(t.retention_s, $1))
                  LIMIT $2 FOR UPDATE OF l SKIP LOCKED)"
        }
    };
    let purged = sqlx::query(sql)
        .bind(default.as_secs() as i64)
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(purged.rows_affected())
}
