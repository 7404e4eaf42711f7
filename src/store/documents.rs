//! The documents read from files: a job that names a file keeps what its
//! extraction read of it (`extraction_documents`), for bbox refinement to
//! ground the values in.

use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
use crate::domain::Document;

/// Keeps `document` as job `id`'s, read under claim `token`: only while
/// that claim holds the running extraction (else false, nothing written).
/// A later claim's reading replaces an earlier one's. Its size (as JSON)
/// counts against the tenant's quota of files (`files::stored_bytes`).
pub async fn keep(
    pool: &PgPool,
    (id, token): (Uuid, i32),
    document: &Document,
) -> Result<bool, StoreError> {
    let json = serde_json::to_string(document).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let kept: Option<(Uuid,)> = sqlx::query_as(
        "INSERT INTO extraction_documents (id, tenant_id, size, document)
         SELECT id, tenant_id, octet_length($3), $3::json FROM extractions
          WHERE id = $1 AND attempts = $2 AND status = 'running'
         ON CONFLICT (id) DO UPDATE SET document = excluded.document, size = excluded.size
         RETURNING id",
    )
    .bind(id)
    .bind(token)
    .bind(json)
    .fetch_optional(pool)
    .await?;
    Ok(kept.is_some())
}

/// The document job `id`'s extraction read from its file, if it kept one.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<Document>, StoreError> {
    let row: Option<(Json<Document>,)> =
        sqlx::query_as("SELECT document FROM extraction_documents WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(Json(document),)| document))
}
