//! The `files` rows: what a tenant uploaded, by its content's SHA-256. A row
//! is written once its bytes are in the object store, so a row always has its
//! object; an object whose row never came (a crash between the two) is
//! unreferenced bytes, never a file a job can name.
//!
//! An upload notes that it is about to store its bytes ([`note_upload`])
//! and clears the note once their row is written ([`clear_upload_note`]):
//! a note left behind (the row's insert failed, the process died between
//! the two) names bytes no row describes, which the collection deletes
//! once they are older than the grace ([`collect_unrecorded`]).
//!
//! Deleting a file races a new upload of the same bytes, which writes the
//! same object. The deleter removes the row and then the object inside one
//! transaction, so an upload's `record` of the row waits for it; the
//! uploader then checks that its object is still there and writes it again
//! if the deleter took it (`Files::upload`). Deleting the bytes of a note
//! races the same way: the uploader's clearing of its note waits for the
//! collector that holds it, then checks its object.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::StoreError;

/// A stored file, as its row describes it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FileRow {
    /// Hex SHA-256 of the bytes: the file's id within its tenant.
    pub sha256: String,
    /// Bytes.
    pub size: i64,
    /// The sniffed media type.
    pub content_type: String,
    /// The first upload of these bytes by this tenant.
    pub created_at: DateTime<Utc>,
}

/// Records tenant `tenant`'s file `row` (its bytes are stored). The row
/// already there when the same bytes were uploaded before (its last use
/// now), and whether this call made it.
pub async fn record<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
    row: &FileRow,
) -> Result<(FileRow, bool), StoreError> {
    #[derive(sqlx::FromRow)]
    struct Recorded {
        #[sqlx(flatten)]
        row: FileRow,
        made: bool,
    }
    let recorded: Recorded = sqlx::query_as(
        "INSERT INTO files (tenant_id, sha256, size, content_type)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant_id, sha256) DO UPDATE SET last_used_at = now()
         RETURNING sha256, size, content_type, created_at, xmax = 0 AS made",
    )
    .bind(tenant)
    .bind(&row.sha256)
    .bind(row.size)
    .bind(&row.content_type)
    .fetch_one(executor)
    .await?;
    Ok((recorded.row, recorded.made))
}

/// Notes that tenant `tenant`'s bytes of `sha256` are about to be stored
/// (a fresh note, if one was there).
pub async fn note_upload<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
    sha256: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO file_uploads (tenant_id, sha256) VALUES ($1, $2)
         ON CONFLICT (tenant_id, sha256) DO UPDATE SET started_at = now()",
    )
    .bind(tenant)
    .bind(sha256)
    .execute(executor)
    .await?;
    Ok(())
}

/// Clears the note of an upload whose row is written; waits for a
/// collector that holds the note, so that the uploader's check of its
/// object, next, sees what the collector left.
pub async fn clear_upload_note<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
    sha256: &str,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM file_uploads WHERE tenant_id = $1 AND sha256 = $2")
        .bind(tenant)
        .bind(sha256)
        .execute(executor)
        .await?;
    Ok(())
}

/// Deletes up to `batch` notes of uploads that began longer than `grace`
/// ago: the tenant and SHA-256 of each, and whether a row describes the
/// bytes (then they stay). The caller deletes the others' objects before
/// it commits `tx`. Collectors skip each other's notes.
pub async fn collect_unrecorded(
    tx: &mut PgConnection,
    grace: std::time::Duration,
    batch: i64,
) -> Result<Vec<(Uuid, String, bool)>, StoreError> {
    let collected = sqlx::query_as(
        "DELETE FROM file_uploads u WHERE (u.tenant_id, u.sha256) IN (
             SELECT tenant_id, sha256 FROM file_uploads
              WHERE started_at < now() - make_interval(secs => $1)
              LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING u.tenant_id, u.sha256,
                   EXISTS (SELECT 1 FROM files f
                            WHERE f.tenant_id = u.tenant_id AND f.sha256 = u.sha256)",
    )
    .bind(grace.as_secs_f64())
    .bind(batch)
    .fetch_all(tx)
    .await?;
    Ok(collected)
}

/// Marks tenant `tenant`'s file `sha256` as used now (a job about to name
/// it); false when the tenant has no such file.
pub async fn touch<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
    sha256: &str,
) -> Result<bool, StoreError> {
    let touched =
        sqlx::query("UPDATE files SET last_used_at = now() WHERE tenant_id = $1 AND sha256 = $2")
            .bind(tenant)
            .bind(sha256)
            .execute(executor)
            .await?;
    Ok(touched.rows_affected() == 1)
}

/// Records that job `job` names tenant `tenant`'s file `sha256` (again:
/// a no-op).
pub async fn link<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
    sha256: &str,
    job: Uuid,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO file_jobs (tenant_id, sha256, extraction_id) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(sha256)
    .bind(job)
    .execute(executor)
    .await?;
    Ok(())
}

/// The bytes tenant `tenant` keeps: its files, the documents its jobs read
/// from them (`extraction_documents`, one for each job, however many name
/// the same file), which can be many times larger, and the values and
/// names of its corrections.
pub async fn stored_bytes<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
) -> Result<i64, StoreError> {
    let bytes = sqlx::query_scalar(
        "SELECT ((SELECT COALESCE(sum(size), 0) FROM files WHERE tenant_id = $1)
               + (SELECT COALESCE(sum(size), 0) FROM extraction_documents WHERE tenant_id = $1)
               + (SELECT COALESCE(sum(COALESCE(octet_length(value), 0)
                                      + COALESCE(octet_length(reviewer), 0)), 0)
                    FROM field_corrections WHERE tenant_id = $1)
               )::int8",
    )
    .bind(tenant)
    .fetch_one(executor)
    .await?;
    Ok(bytes)
}

/// The advisory-lock class of a tenant's quota of files (with the hash of
/// its id as the second key).
const QUOTA_LOCK: i32 = 0x6669_6c65;

/// Takes tenant `tenant`'s quota lock until `tx` ends: whoever checks the
/// quota and records a file under it sees every file recorded before.
pub async fn lock_tenant(tx: &mut PgConnection, tenant: Uuid) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2::text))")
        .bind(QUOTA_LOCK)
        .bind(tenant)
        .execute(tx)
        .await?;
    Ok(())
}

/// Deletes up to `batch` rows of files that no job names and nothing has
/// used for `grace`; the tenant and SHA-256 of each, whose objects the
/// caller deletes next, before it commits `tx`. Collectors skip each
/// other's rows.
pub async fn collect(
    tx: &mut PgConnection,
    grace: std::time::Duration,
    batch: i64,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let collected = sqlx::query_as(
        "DELETE FROM files WHERE (tenant_id, sha256) IN (
             SELECT f.tenant_id, f.sha256 FROM files f
              WHERE f.last_used_at < now() - make_interval(secs => $1)
                AND NOT EXISTS (SELECT 1 FROM file_jobs j
                                 WHERE j.tenant_id = f.tenant_id AND j.sha256 = f.sha256)
              LIMIT $2 FOR UPDATE OF f SKIP LOCKED)
         RETURNING tenant_id, sha256",
    )
    .bind(grace.as_secs_f64())
    .bind(batch)
    .fetch_all(tx)
    .await?;
    Ok(collected)
}

/// Deletes the rows of tenant `tenant`'s files `sha256s` that no job names
/// now, however recently used (an erased job's file); the SHA-256 of each,
/// whose objects the caller deletes next, before it commits `tx`. A file
/// another transaction holds (a job naming it being submitted) is left to
/// [`collect`].
pub async fn forget(
    tx: &mut PgConnection,
    tenant: Uuid,
    sha256s: &[String],
) -> Result<Vec<String>, StoreError> {
    let forgotten = sqlx::query_scalar(
        "DELETE FROM files WHERE tenant_id = $1 AND sha256 IN (
             SELECT f.sha256 FROM files f
              WHERE f.tenant_id = $1 AND f.sha256 = ANY($2)
                AND NOT EXISTS (SELECT 1 FROM file_jobs j
                                 WHERE j.tenant_id = f.tenant_id AND j.sha256 = f.sha256)
              FOR UPDATE OF f SKIP LOCKED)
         RETURNING sha256",
    )
    .bind(tenant)
    .bind(sha256s)
    .fetch_all(tx)
    .await?;
    Ok(forgotten)
}

/// Files and their bytes per tenant (by name), for the census.
pub async fn by_tenant<'e>(
    executor: impl PgExecutor<'e>,
) -> Result<Vec<(String, i64, i64)>, StoreError> {
    let rows = sqlx::query_as(
        "SELECT t.name, count(*)::int8, COALESCE(sum(f.size), 0)::int8
           FROM files f JOIN tenants t ON t.id = f.tenant_id
          GROUP BY t.name ORDER BY t.name",
    )
    .fetch_all(executor)
    .await?;
    Ok(rows)
}

/// Tenant `tenant`'s file `sha256`, if it has one.
pub async fn get<'e>(
    executor: impl PgExecutor<'e>,
    tenant: Uuid,
    sha256: &str,
) -> Result<Option<FileRow>, StoreError> {
    let row = sqlx::query_as(
        "SELECT sha256, size, content_type, created_at FROM files
          WHERE tenant_id = $1 AND sha256 = $2",
    )
    .bind(tenant)
    .bind(sha256)
    .fetch_optional(executor)
    .await?;
    Ok(row)
}
