//! Review: values a person corrected (`field_corrections`), stored beside
//! the extracted ones, never over them. A correction is a transition of its
//! own (`correct_field`, logged like every other) and, when the job named a
//! `webhook_url`, a webhook delivery of its own
//! (`extraction.field_corrected`), written by the same statement as the
//! correction: a crash after it cannot lose the webhook.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::StoreError;

/// One correction.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema, sqlx::FromRow)]
#[schemars(rename = "Correction", deny_unknown_fields)]
pub struct Correction {
    /// Its id: the latest of a field is its value now.
    pub id: i64,
    /// The job.
    pub extraction_id: Uuid,
    /// The field's name.
    pub field: String,
    /// The right value; null: the document does not hold the field.
    pub value: Option<String>,
    /// The API key (with the `review` scope) that made it.
    pub key_id: Uuid,
    /// The name the reviewer gave, if any.
    pub reviewer: Option<String>,
    /// When.
    pub corrected_at: DateTime<Utc>,
}

/// A correction as made, and the webhook delivery that announces it.
#[derive(Debug, sqlx::FromRow)]
pub struct Made {
    #[sqlx(flatten)]
    /// The correction.
    pub correction: Correction,
    /// The delivery's id, when the job has a webhook.
    pub webhook_id: Option<String>,
}

/// What a correction says: of which field of which job, what, and who.
#[derive(Debug, Clone)]
pub struct NewCorrection<'a> {
    /// The job.
    pub extraction_id: Uuid,
    /// Its tenant: another tenant's job is not corrected.
    pub tenant_id: Uuid,
    /// The field.
    pub field: &'a str,
    /// The right value, or none.
    pub value: Option<&'a str>,
    /// The key that makes it.
    pub key_id: Uuid,
    /// The reviewer's name.
    pub reviewer: Option<&'a str>,
}

/// Corrects a field of a succeeded job of the tenant's whose content was
/// not erased, logging the transition and writing its webhook delivery in
/// the same statement. `None` when there is no such job (the caller tells
/// why). The caller checks that the request named the field.
///
/// The job's row is share-locked first: an erase (which locks it before it
/// deletes, [`super::retention::erase`]) either waits for this statement
/// and then deletes what it wrote, or went first, and the row, read again
/// once its lock is free, is no longer one to correct.
pub async fn correct(pool: &PgPool, new: &NewCorrection<'_>) -> Result<Option<Made>, StoreError> {
    let made = sqlx::query_as::<_, Made>(
        "WITH job AS (
             SELECT id, tenant_id, webhook FROM extractions
              WHERE id = $1 AND tenant_id = $2 AND status = 'succeeded' AND erased_at IS NULL
                FOR SHARE),
         made AS (
             INSERT INTO field_corrections (extraction_id, tenant_id, field, value, key_id, reviewer)
             SELECT id, tenant_id, $3, $4, $5, $6 FROM job
             RETURNING *),
         logged AS (
             INSERT INTO extraction_transitions (extraction_id, transition, token)
             SELECT extraction_id, 'correct_field', NULL FROM made),
         hooked AS (
             INSERT INTO webhook_deliveries (id, extraction_id, event_type, url, payload)
             SELECT 'msg_' || replace(m.extraction_id::text, '-', '') || '_corrected_' || m.id,
                    m.extraction_id, 'extraction.field_corrected', q.request->>'webhook_url',
                    jsonb_build_object('type', 'extraction.field_corrected', 'timestamp', now(),
                        'data', jsonb_build_object('id', m.extraction_id,
                            'correction_id', m.id, 'field', m.field, 'value', m.value,
                            'extracted', r.result->'fields'->m.field,
                            'key_id', m.key_id, 'reviewer', m.reviewer,
                            'corrected_at', m.corrected_at,
                            'metadata', q.request->'metadata'))
               FROM made m
               JOIN job ON job.id = m.extraction_id
               JOIN extraction_requests q ON q.id = m.extraction_id
               LEFT JOIN extraction_results r ON r.id = m.extraction_id AND r.stage = 'extraction'
              WHERE job.webhook AND q.request->>'webhook_url' IS NOT NULL
             RETURNING id)
         SELECT made.*, (SELECT id FROM hooked) AS webhook_id FROM made",
    )
    .bind(new.extraction_id)
    .bind(new.tenant_id)
    .bind(new.field)
    .bind(new.value)
    .bind(new.key_id)
    .bind(new.reviewer)
    .fetch_optional(pool)
    .await?;
    Ok(made)
}

/// Every correction of job `id`, oldest first.
pub async fn of_job(pool: &PgPool, id: Uuid) -> Result<Vec<Correction>, StoreError> {
    let corrections = sqlx::query_as::<_, Correction>(
        "SELECT id, extraction_id, field, value, key_id, reviewer, corrected_at
           FROM field_corrections WHERE extraction_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(corrections)
}

/// The jobs of tenant `tenant` with a correction, newest correction first,
/// at most `limit`: what it exports as ground truth.
pub async fn corrected_jobs(
    pool: &PgPool,
    tenant: Uuid,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let ids: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT extraction_id FROM field_corrections WHERE tenant_id = $1
          GROUP BY extraction_id ORDER BY max(id) DESC LIMIT $2",
    )
    .bind(tenant)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

/// Whether job `id`'s request names field `field`.
pub async fn request_names(
    db: impl PgExecutor<'_>,
    id: Uuid,
    field: &str,
) -> Result<bool, StoreError> {
    let named: Option<(bool,)> = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM json_array_elements(request->'fields') f
                         WHERE f->>'name' = $2)
           FROM extraction_requests WHERE id = $1",
    )
    .bind(id)
    .bind(field)
    .fetch_optional(db)
    .await?;
    Ok(named.is_some_and(|(named,)| named))
}
