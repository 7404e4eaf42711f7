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

/// What corrections may be, besides the result's limit on a value.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Most corrections of one field of a job.
    pub per_field: i64,
    /// Most corrections of one job.
    pub per_job: i64,
    /// The tenant's quota of stored bytes, which corrections count toward
    /// with its files and documents (`files::stored_bytes`); 0: none.
    pub storage: u64,
}

/// What [`correct`] did.
#[derive(Debug)]
pub enum Corrected {
    /// The correction, as made.
    Made(Made),
    /// No succeeded job of the tenant's with its content has this id: the
    /// caller tells why.
    NoJob,
    /// The field has as many corrections as it may.
    FieldFull(i64),
    /// The job has as many corrections as it may.
    JobFull(i64),
    /// The tenant keeps `used` bytes: with this correction it would pass
    /// its quota.
    OverQuota {
        /// Bytes it keeps.
        used: i64,
        /// Its quota.
        quota: u64,
    },
}

/// Corrects a field of a succeeded job of the tenant's whose content was
/// not erased, within `caps`, logging the transition and writing its
/// webhook delivery in the same statement. The caller checks that the
/// request named the field.
///
/// The job's row is locked first, in a statement of its own, and the rest
/// reads the database afresh once it holds it: two corrections of a job
/// count each other's rows against the caps, and an erase (which locks the
/// row before it deletes, [`super::retention::erase`]) either waits for the
/// correction and then deletes what it wrote, or went first, and the row,
/// read again once its lock is free, is no longer one to correct.
pub async fn correct(
    pool: &PgPool,
    new: &NewCorrection<'_>,
    caps: Caps,
) -> Result<Corrected, StoreError> {
    let mut tx = pool.begin().await?;
    let job: Option<(Uuid,)> = sqlx::query_as(
        "SELECT id FROM extractions
          WHERE id = $1 AND tenant_id = $2 AND status = 'succeeded' AND erased_at IS NULL
            FOR NO KEY UPDATE",
    )
    .bind(new.extraction_id)
    .bind(new.tenant_id)
    .fetch_optional(&mut *tx)
    .await?;
    if job.is_none() {
        return Ok(Corrected::NoJob);
    }
    let (field, job): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE field = $2), count(*)
           FROM field_corrections WHERE extraction_id = $1",
    )
    .bind(new.extraction_id)
    .bind(new.field)
    .fetch_one(&mut *tx)
    .await?;
    if field >= caps.per_field {
        return Ok(Corrected::FieldFull(caps.per_field));
    }
    if job >= caps.per_job {
        return Ok(Corrected::JobFull(caps.per_job));
    }
    if caps.storage > 0 {
        // Under the tenant's quota lock, as an upload checks it.
        super::files::lock_tenant(&mut tx, new.tenant_id).await?;
        let used = super::files::stored_bytes(&mut *tx, new.tenant_id).await?;
        let size = new.value.map_or(0, str::len) + new.reviewer.map_or(0, str::len);
        if u64::try_from(used).unwrap_or(0) + size as u64 > caps.storage {
            return Ok(Corrected::OverQuota {
                used,
                quota: caps.storage,
            });
        }
    }
    let made = sqlx::query_as::<_, Made>(
        "WITH job AS (
             SELECT id, tenant_id, webhook FROM extractions WHERE id = $1 AND tenant_id = $2),
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
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Corrected::Made(made))
}

/// Most corrections one page of a listing holds.
pub const MAX_PAGE: i64 = 1_000;

/// Job `id`'s corrections after the one of id `after` (from the first
/// without), oldest first, at most `limit`.
pub async fn of_job(
    pool: &PgPool,
    id: Uuid,
    after: i64,
    limit: i64,
) -> Result<Vec<Correction>, StoreError> {
    let corrections = sqlx::query_as::<_, Correction>(
        "SELECT id, extraction_id, field, value, key_id, reviewer, corrected_at
           FROM field_corrections WHERE extraction_id = $1 AND id > $2 ORDER BY id LIMIT $3",
    )
    .bind(id)
    .bind(after)
    .bind(limit.clamp(1, MAX_PAGE))
    .fetch_all(pool)
    .await?;
    Ok(corrections)
}

/// Every correction of job `id`, oldest first, page by page.
pub async fn all_of_job(pool: &PgPool, id: Uuid) -> Result<Vec<Correction>, StoreError> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map_or(0, |c: &Correction| c.id);
        let page = of_job(pool, id, after, MAX_PAGE).await?;
        let last = page.len() < MAX_PAGE as usize;
        all.extend(page);
        if last {
            return Ok(all);
        }
    }
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
