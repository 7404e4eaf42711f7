//! Bulk actions: an operation cancels or retries many of a tenant's jobs,
//! named by ids or by the list's filter, a batch at a time.
//!
//! **A batch is one short transaction** ([`apply`]): it moves the
//! operation's cursor from where its runner found it (so of two runners,
//! one applies a batch and the other learns it was overtaken), makes the
//! batch's transitions with the same statements as the single-job routes,
//! and writes one outcome row per job. Nothing is held between batches: an
//! operation over 100,000 jobs holds no lock and no transaction for its
//! length. A runner that dies leaves the cursor at its last committed batch,
//! and a serving process takes the operation over once its lease ran out
//! ([`take_abandoned`]).
//!
//! **A tenant runs a few at once** ([`create`] refuses one past its cap):
//! each walks every job it names and writes an outcome row per job.
//!
//! **The walk** goes newest first, by id: a filter's down the list's walk,
//! an ids walk down the sorted ids. Its first batch is taken as the
//! operation starts; jobs submitted later have larger ids (UUIDv7) than
//! its cursor, so they are not its jobs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{FromRow, PgPool};
use uuid::Uuid;

use super::{transitions, Extraction, StoreError};
use crate::domain::ExtractionStatus;

/// What an operation does to each of its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "BulkActionName")]
pub enum Action {
    /// As `POST /v1/extractions/{id}/cancel`: a queued job is cancelled, a
    /// running one asked to stop.
    Cancel,
    /// As `POST /v1/extractions/{id}/retry`: a failed job goes back to the
    /// queue with a fresh attempt budget.
    Retry,
}

impl Action {
    /// Its name, in the table and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Retry => "retry",
        }
    }

    fn of(name: &str) -> Option<Self> {
        [Self::Cancel, Self::Retry]
            .into_iter()
            .find(|a| a.as_str() == name)
    }
}

/// Which jobs an operation acts on, as the client named them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// These jobs.
    Ids(Vec<Uuid>),
    /// The jobs the list's filter admits (its query parameters, by name).
    Filter(BTreeMap<String, String>),
}

/// An operation as stored.
#[derive(Debug, Clone, FromRow)]
pub struct Operation {
    /// Its id.
    pub id: Uuid,
    /// Whose jobs it acts on.
    pub tenant_id: Uuid,
    /// The key that makes a repeat the same operation.
    pub operation_key: String,
    action: String,
    selection: Json<Selection>,
    /// The walk goes on below this id (`None`: from the top).
    pub cursor: Option<Uuid>,
    /// Jobs acted on.
    pub done: i64,
    /// Jobs the action did not apply to.
    pub refused: i64,
    /// Ids that are none of the tenant's jobs.
    pub not_found: i64,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When its last batch committed.
    pub finished_at: Option<DateTime<Utc>>,
}

impl Operation {
    /// What it does.
    pub fn action(&self) -> Action {
        Action::of(&self.action).expect("the table's CHECK admits only known actions")
    }

    /// Which jobs it acts on.
    pub fn selection(&self) -> &Selection {
        &self.selection.0
    }
}

/// What an action did to one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "BulkOutcomeKind")]
pub enum Verdict {
    /// The action applied.
    Done,
    /// The job is in a state the action does not apply to.
    Refused,
    /// No job of the tenant has this id.
    NotFound,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Refused => "refused",
            Self::NotFound => "not_found",
        }
    }

    fn of(name: &str) -> Option<Self> {
        [Self::Done, Self::Refused, Self::NotFound]
            .into_iter()
            .find(|v| v.as_str() == name)
    }
}

/// One job's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The job.
    pub id: Uuid,
    /// What happened.
    pub verdict: Verdict,
    /// Its state after the action (none when not found).
    pub status: Option<ExtractionStatus>,
    /// Why it was refused.
    pub reason: Option<String>,
}

/// What a committed batch changed, for the effects its runner owes (events,
/// webhooks, hand-overs), which follow the commit.
#[derive(Debug, Default)]
pub struct Applied {
    /// Queued jobs now cancelled.
    pub cancelled: Vec<Extraction>,
    /// Running jobs whose holder was asked to stop.
    pub cancel_requested: Vec<Extraction>,
    /// Failed jobs now queued again.
    pub retried: Vec<Extraction>,
    /// The batch's outcomes.
    pub outcomes: Vec<Outcome>,
}

/// What [`create`] came to.
#[derive(Debug)]
pub enum Created {
    /// A new operation, for the caller to run.
    New(Operation),
    /// The operation a first call with this key made: a repeat changes
    /// nothing.
    Repeat(Operation),
    /// The tenant runs this many operations already, its cap: nothing was
    /// made.
    AtCap(i64),
}

/// Makes the operation of `key`, unless the tenant runs `cap` operations
/// already, or finds the one a first call with `key` made (whatever the
/// tenant runs).
///
/// The tenant's row is held while its running operations are counted and
/// the new one written (`FOR NO KEY UPDATE`, which the foreign-key checks
/// of its submits do not wait for), so starts of one tenant at once each
/// count the others' operations and never all pass the cap together.
pub async fn create(
    pool: &PgPool,
    (tenant_id, key): (Uuid, &str),
    (action, selection): (Action, &Selection),
    lease: Duration,
    cap: i64,
) -> Result<Created, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT 1 FROM tenants WHERE id = $1 FOR NO KEY UPDATE")
        .bind(tenant_id)
        .execute(&mut *tx)
        .await?;
    let first: Option<Operation> =
        sqlx::query_as("SELECT * FROM bulk_operations WHERE tenant_id = $1 AND operation_key = $2")
            .bind(tenant_id)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some(first) = first {
        return Ok(Created::Repeat(first));
    }
    let running: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM bulk_operations WHERE tenant_id = $1 AND finished_at IS NULL",
    )
    .bind(tenant_id)
    .fetch_one(&mut *tx)
    .await?;
    if running >= cap {
        return Ok(Created::AtCap(running));
    }
    let made = sqlx::query_as(
        "INSERT INTO bulk_operations
             (id, tenant_id, operation_key, action, selection, lease_until)
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
         RETURNING *",
    )
    .bind(crate::domain::new_job_id())
    .bind(tenant_id)
    .bind(key)
    .bind(action.as_str())
    .bind(Json(selection))
    .bind(lease.as_secs_f64())
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Created::New(made))
}

/// Tenant `tenant_id`'s operation `id`.
pub async fn get(
    pool: &PgPool,
    tenant_id: Uuid,
    id: Uuid,
) -> Result<Option<Operation>, StoreError> {
    let found = sqlx::query_as("SELECT * FROM bulk_operations WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(pool)
        .await?;
    Ok(found)
}

/// Unfinished operations whose runner's lease ran out, now held for `lease`
/// by the caller (at most `limit`; rows another sweep holds are skipped).
pub async fn take_abandoned(
    pool: &PgPool,
    lease: Duration,
    limit: i64,
) -> Result<Vec<Operation>, StoreError> {
    let taken = sqlx::query_as(
        "UPDATE bulk_operations SET lease_until = now() + make_interval(secs => $1)
          WHERE id IN (SELECT id FROM bulk_operations
                        WHERE finished_at IS NULL AND lease_until < now()
                        ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING *",
    )
    .bind(lease.as_secs_f64())
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(taken)
}

/// The next batch of `operation`: acts on `ids` (ids of its walk, below its
/// cursor), moves the cursor to `next` (`None`: the walk is over, and the
/// operation finishes) and holds it for `lease` more. `None` when another
/// runner moved the cursor first: nothing was done, and this runner stops.
pub async fn apply(
    pool: &PgPool,
    operation: &Operation,
    ids: &[Uuid],
    next: Option<Uuid>,
    lease: Duration,
) -> Result<Option<Applied>, StoreError> {
    let mut tx = pool.begin().await?;
    if !advance(&mut tx, operation, next, lease).await? {
        return Ok(None);
    }
    // Only the tenant's own jobs: another tenant's id is not found.
    let owned: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM extractions WHERE id = ANY($1) AND tenant_id = $2")
            .bind(ids)
            .bind(operation.tenant_id)
            .fetch_all(&mut *tx)
            .await?;
    let (mut applied, rest) = act(&mut tx, operation.action(), &owned).await?;
    let mut outcomes = outcomes_of_rest(&mut tx, operation.action(), rest).await?;
    for row in applied
        .cancelled
        .iter()
        .chain(&applied.cancel_requested)
        .chain(&applied.retried)
    {
        outcomes.insert(row.id, outcome(row.id, Verdict::Done, Some(row.status)));
    }
    // Each id once, in the walk's order; an id not owned is not found.
    let mut seen = std::collections::HashSet::new();
    for &id in ids.iter().filter(|id| seen.insert(**id)) {
        applied.outcomes.push(
            outcomes
                .remove(&id)
                .unwrap_or_else(|| outcome(id, Verdict::NotFound, None)),
        );
    }
    record(&mut tx, operation.id, &applied.outcomes).await?;
    tx.commit().await?;
    Ok(Some(applied))
}

/// Moves `operation`'s cursor to `next` and holds it for `lease` more (and
/// finishes it when `next` is `None`), fenced on the cursor this runner read:
/// `false` when another runner moved it first.
async fn advance(
    tx: &mut sqlx::PgConnection,
    operation: &Operation,
    next: Option<Uuid>,
    lease: Duration,
) -> Result<bool, StoreError> {
    let fenced = sqlx::query(
        "UPDATE bulk_operations
            SET cursor = $3, lease_until = now() + make_interval(secs => $4),
                finished_at = CASE WHEN $5 THEN now() END
          WHERE id = $1 AND finished_at IS NULL AND cursor IS NOT DISTINCT FROM $2",
    )
    .bind(operation.id)
    .bind(operation.cursor)
    .bind(next)
    .bind(lease.as_secs_f64())
    .bind(next.is_none())
    .execute(&mut *tx)
    .await?;
    Ok(fenced.rows_affected() > 0)
}

/// Applies `action` to the `owned` jobs it fits: the jobs changed, and the
/// ids left over (in a state the action does not fit, or gone).
async fn act(
    tx: &mut sqlx::PgConnection,
    action: Action,
    owned: &[Uuid],
) -> Result<(Applied, Vec<Uuid>), StoreError> {
    let mut applied = Applied::default();
    let rest = match action {
        Action::Retry => {
            let won = transitions::retry_failed_many(&mut *tx, owned).await?;
            let lost;
            (applied.retried, lost) = split(owned, won);
            lost
        }
        Action::Cancel => {
            let won = transitions::cancel_queued_many(&mut *tx, owned).await?;
            let not_queued;
            (applied.cancelled, not_queued) = split(owned, won);
            let won = transitions::request_cancel_many(&mut *tx, &not_queued).await?;
            let lost;
            (applied.cancel_requested, lost) = split(&not_queued, won);
            lost
        }
    };
    Ok((applied, rest))
}

/// What the ids `action` did not change are now: a running job whose cancel
/// was requested before is being cancelled (done, as the single route
/// answers it); any other is refused with its state, or not found when it was
/// deleted between the two reads.
async fn outcomes_of_rest(
    tx: &mut sqlx::PgConnection,
    action: Action,
    rest: Vec<Uuid>,
) -> Result<HashMap<Uuid, Outcome>, StoreError> {
    let states: HashMap<Uuid, String> = sqlx::query_as::<_, (Uuid, String)>(
        "SELECT id, status FROM extractions WHERE id = ANY($1)",
    )
    .bind(&rest)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    Ok(rest
        .into_iter()
        .map(|id| {
            let status: Option<ExtractionStatus> = states.get(&id).and_then(|s| s.parse().ok());
            let outcome = match (action, status) {
                (Action::Cancel, Some(ExtractionStatus::Running)) => {
                    outcome(id, Verdict::Done, status)
                }
                (_, Some(now)) => Outcome {
                    reason: Some(refusal(action, now)),
                    ..outcome(id, Verdict::Refused, status)
                },
                (_, None) => outcome(id, Verdict::NotFound, None),
            };
            (id, outcome)
        })
        .collect())
}

/// The outcome of `id`, with no reason.
fn outcome(id: Uuid, verdict: Verdict, status: Option<ExtractionStatus>) -> Outcome {
    Outcome {
        id,
        verdict,
        status,
        reason: None,
    }
}

/// Why `action` does not apply to a job in state `now`.
fn refusal(action: Action, now: ExtractionStatus) -> String {
    match action {
        Action::Retry => format!("only a failed job can be retried; this one is {now}"),
        Action::Cancel => {
            format!("only a queued or running job can be cancelled; this one is {now}")
        }
    }
}

/// The rows a statement over `ids` won, and the ids it lost.
fn split(ids: &[Uuid], won: Vec<Option<Extraction>>) -> (Vec<Extraction>, Vec<Uuid>) {
    let mut rows = Vec::new();
    let mut lost = Vec::new();
    for (id, row) in ids.iter().zip(won) {
        match row {
            Some(row) => rows.push(row),
            None => lost.push(*id),
        }
    }
    (rows, lost)
}

/// Writes a batch's outcomes and adds them to the operation's counts.
async fn record(
    tx: &mut sqlx::PgConnection,
    operation: Uuid,
    outcomes: &[Outcome],
) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = outcomes.iter().map(|o| o.id).collect();
    let verdicts: Vec<&str> = outcomes.iter().map(|o| o.verdict.as_str()).collect();
    let statuses: Vec<Option<&str>> = outcomes
        .iter()
        .map(|o| o.status.map(|s| s.as_str()))
        .collect();
    let reasons: Vec<Option<&str>> = outcomes.iter().map(|o| o.reason.as_deref()).collect();
    sqlx::query(
        "WITH written AS (
             INSERT INTO bulk_outcomes (operation_id, extraction_id, outcome, status, reason)
             SELECT $1, * FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[])
             ON CONFLICT DO NOTHING RETURNING outcome)
         UPDATE bulk_operations
            SET done = done + (SELECT count(*) FROM written WHERE outcome = 'done'),
                refused = refused + (SELECT count(*) FROM written WHERE outcome = 'refused'),
                not_found = not_found + (SELECT count(*) FROM written WHERE outcome = 'not_found')
          WHERE id = $1",
    )
    .bind(operation)
    .bind(ids)
    .bind(verdicts)
    .bind(statuses)
    .bind(reasons)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A page of `operation`'s outcomes in id order (newest job first), after
/// `after`, of one verdict if named.
pub async fn outcomes(
    pool: &PgPool,
    operation: Uuid,
    verdict: Option<Verdict>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<Outcome>, StoreError> {
    let rows: Vec<(Uuid, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT extraction_id, outcome, status, reason FROM bulk_outcomes
          WHERE operation_id = $1
            AND ($2::text IS NULL OR outcome = $2)
            AND ($3::uuid IS NULL OR extraction_id < $3)
          ORDER BY extraction_id DESC LIMIT $4",
    )
    .bind(operation)
    .bind(verdict.map(Verdict::as_str))
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, verdict, status, reason)| Outcome {
            id,
            verdict: Verdict::of(&verdict).unwrap_or(Verdict::Refused),
            status: status.and_then(|s| s.parse().ok()),
            reason,
        })
        .collect())
}
