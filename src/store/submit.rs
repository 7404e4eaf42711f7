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

use sqlx::PgPool;
use uuid::Uuid;

use super::error::StoreError;
use super::row::Extraction;
use crate::domain::{
    idempotency_key_is_valid, ExtractionRequest, RequestError, RequestLimits,
    MAX_IDEMPOTENCY_KEY_LEN,
};

/// Written over arrays (one element from `submit`) so that the benchmark's
/// Postgres ceiling runs this very statement with one row and with a hundred:
/// the migration's `submit_jobs`, which takes the capped tenants' quota locks
/// and then inserts (caps first, a key already used takes no room, keyed
/// requests by a speculative insert), in one round trip. `$1` ids, `$2` keys,
/// `$3` hashes, `$4` requests as JSON text, `$5` whether each names a
/// webhook, `$6` tenants, `$7` their caps or NULL. Each created job's row
/// comes back, without its request (the caller has it).
pub(crate) const INSERT: &str =
    "SELECT * FROM submit_jobs($1::uuid[], $2::text[], $3::text[], $4::text[],
                                    $5::bool[], $6::uuid[], $7::int8[], $8::text[])";

/// The jobs of `$1` tenants' `$2` keys, pairwise.
const BY_KEYS: &str = "SELECT r.* FROM unnest($1::uuid[], $2::text[]) AS k(tenant_id, key)
    JOIN extraction_rows r ON r.tenant_id = k.tenant_id AND r.idempotency_key = k.key";

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
    /// The key names a job whose content was erased on request: it is not
    /// made again.
    #[error("the job of this idempotency key ({0}) was erased")]
    Erased(Uuid),
    /// The request's webhook URL was refused (SSRF guard, or webhooks are off);
    /// nothing was written.
    #[error("{0}")]
    WebhookRefused(String),
    /// The request names an extractor this deployment does not have; nothing
    /// was written.
    #[error("unknown extractor {0:?}")]
    UnknownExtractor(String),
    /// The request's document is a file, and its extractor speaks a
    /// version of the extractor protocol that takes documents as JSON only.
    #[error("extractor {0:?} speaks extractor protocol version 1, which takes documents as JSON only: a file needs `rules` or an extractor of version 2")]
    TakesNoFiles(String),
    /// The request's `document.object` names no file of the tenant's;
    /// nothing was written.
    #[error("document.object: no file {0} of this tenant: upload it with POST /v1/files first")]
    NoSuchFile(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The row was not written within the bound the caller answers in; it may
    /// still be written (so retry with the same idempotency key).
    #[error("the database did not answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The request names a file, and its tenant keeps as many bytes as its
    /// quota allows: the job would keep another document of it. Nothing
    /// was written.
    #[error("the tenant keeps {used} bytes of files, of the documents its jobs read from them (one for each job) and of corrections: its quota is {quota} bytes (DOCSTREAM_TENANT_MAX_FILE_BYTES); erase jobs or let files go to submit more on files")]
    OverQuota {
        /// Bytes it keeps.
        used: i64,
        /// Its quota.
        quota: u64,
    },
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
    crate::domain::sha256_hex(canonical.as_bytes())
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
    let insert = |insert| async move { Ok(insert_many(pool, &[insert]).await?.pop().flatten()) };
    let find = |key| async move { Ok(by_keys(pool, &[key]).await?.pop().flatten()) };
    submit_with(new, insert, find).await
}

/// [`submit`] with the INSERT done by `insert` (one of a batch, say), which
/// answers `None` when the key was taken meanwhile, and the key's job read
/// by `find` (one of a batch too) when it was.
pub async fn submit_with<I, IFut, F, FFut>(
    new: NewExtraction,
    insert: I,
    find: F,
) -> Result<Submitted, SubmitError>
where
    I: FnOnce(Insert) -> IFut,
    IFut: Future<Output = Result<Option<Extraction>, StoreError>>,
    F: FnOnce((Uuid, String)) -> FFut,
    FFut: Future<Output = Result<Option<Extraction>, StoreError>>,
{
    // No lookup of the key first: the INSERT leaves out a key its tenant has
    // used already, and only then (a repeat, or a concurrent twin that won)
    // is the key's job read. A first submit costs one statement, shared with
    // its batch, and never takes a pool connection of its own.
    let insert_row = Insert::new(new);
    let hash = insert_row.hash.clone().unwrap_or_default();
    let key = insert_row.new.idempotency_key.clone();
    let tenant_id = insert_row.new.tenant_id;
    let cap = insert_row.new.max_open_jobs;
    let inserted = insert(insert_row).await?;
    if let Some(row) = inserted {
        return Ok(Submitted::Created(row));
    }
    // Not inserted: a concurrent twin with the same key won the INSERT
    // (answer with its row), or the tenant's cap left no room.
    let winner = match key {
        Some(key) => find((tenant_id, key)).await?,
        None => None,
    };
    match (winner, cap) {
        (Some(winner), _) => replay(winner, &hash),
        (None, Some(cap)) => Err(SubmitError::TooManyOpenJobs(cap)),
        // Neither a twin nor a cap: the statement lost the row.
        (None, None) => Err(sqlx::Error::RowNotFound.into()),
    }
}

/// The jobs the idempotency keys `keys` (each with its tenant) name, in one
/// statement; `None` for a key no job has. One answer per key, in order.
pub async fn by_keys(
    pool: &PgPool,
    keys: &[(Uuid, String)],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let tenants: Vec<Uuid> = keys.iter().map(|(tenant, _)| *tenant).collect();
    let names: Vec<&str> = keys.iter().map(|(_, key)| key.as_str()).collect();
    let rows: Vec<Extraction> = sqlx::query_as(BY_KEYS)
        .bind(tenants)
        .bind(names)
        .fetch_all(pool)
        .await?;
    let found: HashMap<(Uuid, String), Extraction> = rows
        .into_iter()
        .filter_map(|row| Some(((row.tenant_id, row.idempotency_key.clone()?), row)))
        .collect();
    // Twins may ask for one key in one batch: each gets the job.
    Ok(keys.iter().map(|key| found.get(key).cloned()).collect())
}

/// Inserts many jobs in one statement; a job whose key another row holds, or
/// whose tenant's cap leaves no room, gets `None`. One answer per job, in
/// order. The rows come back without their request (`Extraction::request` is
/// `None`): the caller has it.
pub async fn insert_many(
    pool: &PgPool,
    inserts: &[Insert],
) -> Result<Vec<Option<Extraction>>, StoreError> {
    let rows = insert_statement(inserts).fetch_all(pool).await?;
    let mut created: HashMap<Uuid, Extraction> = rows.into_iter().map(|r| (r.id, r)).collect();
    let answer = |insert: &Insert| {
        let mut row = created.remove(&insert.new.id)?;
        row.idempotency_key.clone_from(&insert.new.idempotency_key);
        row.request_hash.clone_from(&insert.hash);
        Some(row)
    };
    Ok(inserts.iter().map(answer).collect())
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
    let priorities: Vec<&str> = inserts
        .iter()
        .map(|i| i.new.request.priority.unwrap_or_default().as_str())
        .collect();
    sqlx::query_as::<_, Extraction>(INSERT)
        .bind(ids)
        .bind(keys)
        .bind(hashes)
        .bind(requests)
        .bind(webhooks)
        .bind(tenants)
        .bind(caps)
        .bind(priorities)
}

fn replay(existing: Extraction, hash: &str) -> Result<Submitted, SubmitError> {
    if existing.erased_at.is_some() {
        return Err(SubmitError::Erased(existing.id));
    }
    if existing.request_hash.as_deref() == Some(hash) {
        Ok(Submitted::Replayed(existing))
    } else {
        Err(SubmitError::KeyReused)
    }
}
