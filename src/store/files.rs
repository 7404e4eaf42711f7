//! The `files` rows: what a tenant uploaded, by its content's SHA-256. A row
//! is written once its bytes are in the object store, so a row always has its
//! object; an object whose row never came (a crash between the two) is
//! unreferenced bytes, never a file a job can name.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
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
/// already there when the same bytes were uploaded before, and whether this
/// call made it.
pub async fn record<'e>(
    executor: impl PgExecutor<'e> + Copy,
    tenant: Uuid,
    row: &FileRow,
) -> Result<(FileRow, bool), StoreError> {
    let made: Option<FileRow> = sqlx::query_as(
        "INSERT INTO files (tenant_id, sha256, size, content_type)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant_id, sha256) DO NOTHING
         RETURNING sha256, size, content_type, created_at",
    )
    .bind(tenant)
    .bind(&row.sha256)
    .bind(row.size)
    .bind(&row.content_type)
    .fetch_optional(executor)
    .await?;
    match made {
        Some(made) => Ok((made, true)),
        None => {
            // Files are not deleted yet, so the row that stopped the insert
            // is there.
            let there = get(executor, tenant, &row.sha256).await?;
            Ok((there.ok_or(sqlx::Error::RowNotFound)?, false))
        }
    }
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
