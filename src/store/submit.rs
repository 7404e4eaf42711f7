//! Idempotent submit (invariant 3): INSERT unless the key is taken; a repeat,
//! or a concurrent twin that lost the INSERT on the partial unique index, then
//! reads the key's job, so every caller with one key sees one row. The same key with another body is refused.
//! A key is unique within its tenant: two tenants' equal keys name two jobs.
//!
//! The INSERT takes arrays: concurrent submits can share one statement (and one
//! commit) through [`submit_with`]; a row that lost on its key is skipped by the
//! statement, not failed, so one twin cannot fail the others of its batch.

use std::collections::HashMap;
use std::future::Future;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Extraction, StoreError};
use crate::domain::{
    idempotency_key_is_valid, ExtractionRequest, RequestError, RequestLimits,
    MAX_IDEMPOTENCY_KEY_LEN,
};

/// Written over arrays (one element from `submit`) so that the benchmark's
/// Postgres ceiling runs this very statement with one row and with a hundred.
/// First the caps: a tenant with a cap on its open jobs (`$7`, NULL for none)
/// gets only as many new jobs as it has room for, in the order given; its open
/// jobs are counted up to the cap, never further. The caller holds the
/// tenant's quota lock (`LOCK_TENANTS`, an earlier statement of the same
/// transaction, so this statement's snapshot sees every job committed before
/// it), which makes the cap exact across processes.
/// A request whose key its tenant has used already takes no room and is left
/// out (the caller then reads the key's job).
/// Then the request row: a request with an idempotency key is inserted only if
/// no other request holds its key (a speculative insert, which costs more, so
/// requests without a key skip it), and only the requests inserted get a job
/// row and a log row. The request is not returned: the caller has it.
pub const INSERT: &str = "WITH new AS (
        SELECT * FROM unnest($1::uuid[], $6::uuid[], $2::text[], $3::text[], $4::text[],
                             $5::bool[], $7::int8[])
               WITH ORDINALITY AS new(id, tenant_id, key, hash, request, webhook, cap, ord)),
    capped AS (
        SELECT c.tenant_id, c.cap,
               (SELECT count(*) FROM (SELECT 1 FROM extractions e
                                       WHERE e.tenant_id = c.tenant_id
                                         AND e.status IN ('queued', 'running')
                                       LIMIT c.cap) o) AS open
          FROM (SELECT tenant_id, min(cap) AS cap FROM new WHERE cap IS NOT NULL
                 GROUP BY tenant_id) c),
    admitted AS (
        SELECT * FROM (
            SELECT new.*, capped.cap AS room_of, capped.open,
                   row_number() OVER (PARTITION BY new.tenant_id ORDER BY new.ord) AS place
                FROM new LEFT JOIN capped ON capped.tenant_id = new.tenant_id
             WHERE new.key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM extraction_requests q
                    WHERE q.tenant_id = new.tenant_id AND q.idempotency_key = new.key)) ranked
         WHERE room_of IS NULL OR open + place <= room_of),
    keyed AS (
        INSERT INTO extraction_requests (id, tenant_id, idempotency_key, request_hash, request)
        SELECT id, tenant_id, key, hash, request::json FROM admitted WHERE key IS NOT NULL
        ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, tenant_id, idempotency_key, request_hash),
    unkeyed AS (
        INSERT INTO extraction_requests (id, tenant_id, idempotency_key, request_hash, request)
        SELECT id, tenant_id, NULL, NULL, request::json FROM admitted WHERE key IS NULL
        RETURNING id, tenant_id, idempotency_key, request_hash),
    requested AS (
        SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed),
    created AS (
        INSERT INTO extractions (id, tenant_id, status, webhook)
        SELECT requested.id, requested.tenant_id, 'queued', admitted.webhook
          FROM requested JOIN admitted ON admitted.id = requested.id
        RETURNING *),
    logged AS (
        INSERT INTO extraction_transitions (extraction_id, transition, token)
        SELECT id, 'submit', NULL FROM created)
    SELECT created.*, requested.idempotency_key, requested.request_hash
      FROM created JOIN requested ON requested.id = created.id";

/// Takes the quota lock of each tenant in `$1` until the transaction ends, in
/// one order (so two batches never deadlock): submits of one capped tenant
/// run one statement at a time, those of different tenants side by side.
const LOCK_TENANTS: &str = "SELECT pg_advisory_xact_lock(1146, hashtext(t::text))
      FROM (SELECT DISTINCT t FROM unnest($1::uuid[]) t ORDER BY t) tenants";

const BY_KEY: &str = "SELECT * FROM extraction_rows WHERE tenant_id = $1 AND idempotency_key = $2";

/// A job about to be inserted.
#[derive(Debug, Clone)]
pub struct NewExtraction {
    /// Id the row will have if it is created.
    pub id: Uuid,
    /// The tenant the job belongs to (the caller's key names it).
    pub tenant_id: Uuid,
    /// The most jobs the tenant may have queued or running, this one
    /// included; `None`: no cap.
    pub max_open_jobs: Option<i64>,
    /// The client's `Idempotency-Key`, if any.
    pub idempotency_key: Option<String>,
    /// The validated request.
    pub request: ExtractionRequest,
}

/// Why a submission was refused before it reached the store.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The request breaks a rule or a limit.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The idempotency key is empty, too long, or not visible ASCII.
    #[error("the idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters")]
    IdempotencyKey,
}

impl NewExtraction {
    /// A new job of tenant `tenant_id` (whose cap on open jobs is
    /// `max_open_jobs`), after the checks every intake makes (HTTP, the
    /// import stream and the Kafka intake alike): the request against
    /// `limits`, then the form of the idempotency key.
    pub fn checked(
        (tenant_id, max_open_jobs): (Uuid, Option<i64>),
        idempotency_key: Option<String>,
        request: ExtractionRequest,
        limits: &RequestLimits,
    ) -> Result<Self, Refusal> {
        request.validate(limits)?;
        if idempotency_key
            .as_deref()
            .is_some_and(|key| !idempotency_key_is_valid(key))
        {
            return Err(Refusal::IdempotencyKey);
        }
        Ok(Self {
            id: crate::domain::new_job_id(),
            tenant_id,
            max_open_jobs,
            idempotency_key,
            request,
        })
    }
}

/// The outcome of a submit.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// A new row was inserted; its event still has to be published.
    Created(Extraction),
    /// The key was seen before with the same body; this is that row.
    Replayed(Extraction),
}

impl Submitted {
    /// The row, whichever way it came.
    pub fn extraction(&self) -> &Extraction {
        match self {
            Self::Created(row) | Self::Replayed(row) => row,
        }
    }
}

/// Why a submit was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The key belongs to a job with a different request body.
    #[error("idempotency key was already used with a different request")]
    KeyReused,
    /// The request's webhook URL was refused (SSRF guard, or webhooks are off);
    /// nothing was written.
    #[error("{0}")]
    WebhookRefused(String),
    /// The request names an extractor this deployment does not have; nothing
    /// was written.
    #[error("unknown extractor {0:?}")]
    UnknownExtractor(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The row was not written within the bound the caller answers in; it may
    /// still be written (so retry with the same idempotency key).
    #[error("the database did not answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The tenant has as many jobs queued or running as its cap allows;
    /// nothing was written.
    #[error("the tenant has {0} jobs queued or running, its cap: retry once some have finished")]
    TooManyOpenJobs(i64),
}

impl From<sqlx::Error> for SubmitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::from(e))
    }
}

/// Hash of the request's canonical JSON (struct field order, sorted maps).
pub fn request_hash(request: &ExtractionRequest) -> String {
    hash_of(&canonical_json(request))
}

fn canonical_json(request: &ExtractionRequest) -> String {
    serde_json::to_string(request).expect("a request always serialises")
}

fn hash_of(canonical: &str) -> String {
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A job ready to insert: the request, its canonical JSON (what is stored)
/// and, when it has an idempotency key, the hash of that JSON (only a replay
/// of the key compares it).
#[derive(Debug, Clone)]
pub struct Insert {
    /// The job.
    pub new: NewExtraction,
    /// The request's canonical JSON.
    pub json: String,
    /// [`request_hash`] of its request, when it has an idempotency key.
    pub hash: Option<String>,
}

impl Insert {
    /// Serialises `new`'s request, and hashes it if it has a key.
    pub fn new(new: NewExtraction) -> Self {
        let json = canonical_json(&new.request);
        let hash = new.idempotency_key.as_ref().map(|_| hash_of(&json));
        Self { new, json, hash }
    }
}

/// Inserts `new`, or returns the row its idempotency key already names.
pub async fn submit(pool: &PgPool, new: NewExtraction) -> Result<Submitted, SubmitError> {
    submit_with(pool, new, |insert| async move {
        Ok(insert_many(pool, &[insert]).await?.pop().flatten())
    })
    .await
}

/// [`submit`] with the INSERT done by `insert` (one of a batch, say), which
/// answers `None` when the key was taken meanwhile.
pub async fn submit_with<F, Fut>(
    pool: &PgPool,
    new: NewExtraction,
    insert: F,
) -> Result<Submitted, SubmitError>
where
    F: FnOnce(Insert) -> Fut,
    Fut: Future<Output = Result<Option<Extraction>, StoreError>>,
{
    // No lookup of the key first: the INSERT leaves out a key its tenant has
    // used already, and only then (a repeat, or a concurrent twin that won)
    // is the key's job read. A first submit costs one statement, shared with
    // its batch, and never takes a pool connection of its own.
    let insert_row = Insert::new(new);
    let hash = insert_row.hash.clone().unwrap_or_default();
    let key = insert_row.new.idempotency_key.clone().unwrap_or_default();
    let tenant_id = insert_row.new.tenant_id;
    let cap = insert_row.new.max_open_jobs;
    let inserted = insert(insert_row).await?;
    match inserted {
        Some(row) => Ok(Submitted::Created(row)),
        // Not inserted: a concurrent twin with the same key won the INSERT
        // (answer with its row), or the tenant's cap left no room.
        None => match (by_key_if_keyed(pool, tenant_id, &key).await?, cap) {
            (Some(winner), _) => replay(winner, &hash),
            (None, Some(cap)) => Err(SubmitError::TooManyOpenJobs(cap)),
            // Neither a twin nor a cap: the statement lost the row.
            (None, None) => Err(sqlx::Error::RowNotFound.into()),
        },
    }
}

/// Inserts many jobs in one statement; a job whose key another row holds, or
/// whose tenant's cap leaves no room, gets `None`. One answer per job, in
/// order. The rows come back without their request (`Extraction::request` is
/// `None`): the caller has it already. With a cap among them, the statement
/// runs in a transaction that holds the capped tenants' quota locks.
pub async fn insert_many(
    pool: &PgPool,
    inserts: &[Insert],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let capped: Vec<Uuid> = inserts
        .iter()
        .filter(|i| i.new.max_open_jobs.is_some())
        .map(|i| i.new.tenant_id)
        .collect();
    let rows = match capped.is_empty() {
        true => insert_statement(inserts).fetch_all(pool).await?,
        false => {
            let mut tx = pool.begin().await?;
            sqlx::query(LOCK_TENANTS)
                .bind(&capped)
                .execute(&mut *tx)
                .await?;
            let rows = insert_statement(inserts).fetch_all(&mut *tx).await?;
            tx.commit().await?;
            rows
        }
    };
    let mut created: HashMap<Uuid, Extraction> = rows.into_iter().map(|r| (r.id, r)).collect();
    Ok(inserts.iter().map(|i| created.remove(&i.new.id)).collect())
}

/// [`insert_many`], with each job's own answer: when the statement fails for
/// a value of one of its jobs ([`StoreError::is_data_error`]), each job is
/// inserted alone, so only the submits whose values fail get the error.
/// Validation refuses such values first; this keeps a value it missed from
/// failing every submit that shared its statement.
pub async fn insert_each(
    pool: &PgPool,
    inserts: &[Insert],
) -> Result<Vec<Result<Option<Extraction>, StoreError>>, StoreError> {
    match insert_many(pool, inserts).await {
        Ok(rows) => Ok(rows.into_iter().map(Ok).collect()),
        Err(e) if inserts.len() > 1 && e.is_data_error() => {
            tracing::warn!(error = %e, jobs = inserts.len(),
                "a batched insert failed for a value; inserting its jobs one by one");
            let mut each = Vec::with_capacity(inserts.len());
            for insert in inserts {
                let alone = insert_many(pool, std::slice::from_ref(insert)).await;
                each.push(alone.map(|mut rows| rows.pop().flatten()));
            }
            Ok(each)
        }
        Err(e) => Err(e),
    }
}

type InsertQuery<'q> =
    sqlx::query::QueryAs<'q, sqlx::Postgres, Extraction, sqlx::postgres::PgArguments>;

fn insert_statement(inserts: &[Insert]) -> InsertQuery<'_> {
    let ids: Vec<Uuid> = inserts.iter().map(|i| i.new.id).collect();
    let keys: Vec<Option<&str>> = inserts
        .iter()
        .map(|i| i.new.idempotency_key.as_deref())
        .collect();
    let hashes: Vec<Option<&str>> = inserts.iter().map(|i| i.hash.as_deref()).collect();
    let requests: Vec<&str> = inserts.iter().map(|i| i.json.as_str()).collect();
    let tenants: Vec<Uuid> = inserts.iter().map(|i| i.new.tenant_id).collect();
    let webhooks: Vec<bool> = inserts
        .iter()
        .map(|i| i.new.request.webhook_url.is_some())
        .collect();
    let caps: Vec<Option<i64>> = inserts.iter().map(|i| i.new.max_open_jobs).collect();
    sqlx::query_as::<_, Extraction>(INSERT)
        .bind(ids)
        .bind(keys)
        .bind(hashes)
        .bind(requests)
        .bind(webhooks)
        .bind(tenants)
        .bind(caps)
}

async fn by_key_if_keyed(
    pool: &PgPool,
    tenant_id: Uuid,
    key: &str,
) -> Result<Option<Extraction>, sqlx::Error> {
    match key.is_empty() {
        true => Ok(None),
        false => by_key(pool, tenant_id, key).await,
    }
}

async fn by_key(
    pool: &PgPool,
    tenant_id: Uuid,
    key: &str,
) -> Result<Option<Extraction>, sqlx::Error> {
    sqlx::query_as::<_, Extraction>(BY_KEY)
        .bind(tenant_id)
        .bind(key)
        .fetch_optional(pool)
        .await
}

fn replay(existing: Extraction, hash: &str) -> Result<Submitted, SubmitError> {
    if existing.request_hash.as_deref() == Some(hash) {
        Ok(Submitted::Replayed(existing))
    } else {
        Err(SubmitError::KeyReused)
    }
}
