//! Runs bulk operations ([`store::bulk`]): walks an operation's jobs a
//! batch at a time, commits each batch's transitions and outcomes, then owes
//! what each transition owes (its event, its webhook, a retried job's
//! hand-over to the workers) as the single-job routes do.
//!
//! The process that accepted an operation runs it at once; every serving
//! process also resumes operations whose runner stopped answering
//! ([`Bulk::resume_abandoned`]). A runner that was overtaken (its lease ran out
//! and another took over) finds the cursor moved at its next batch and
//! stops, so a batch is applied once.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use sqlx::PgPool;

use super::Jobs;
use crate::store::bulk::{self, Action, Created, Operation, Selection};
use crate::store::list::{self, JobFilter, Order, PageRequest, MAX_PAGE};
use crate::store::StoreError;

/// How long a runner holds its operation past each batch. A runner that
/// makes no batch for this long is taken for dead.
pub const LEASE: Duration = Duration::from_secs(30);

/// Jobs per batch (and per transaction).
pub const BATCH: i64 = MAX_PAGE;

/// Most ids one operation may name.
pub const MAX_IDS: usize = 1_000;

/// How often a serving process looks for abandoned operations.
const SWEEP: Duration = Duration::from_secs(5);

/// Tries of one batch while the database does not answer, before the
/// runner leaves the operation to a sweep.
const TRIES: u32 = 4;

/// Bulk operations' handle: what makes and runs them. A clone is two
/// reference counts.
#[derive(Clone)]
pub struct Bulk {
    /// The pool the operations and their batches are kept in.
    pub pool: PgPool,
    /// The lifecycle, which owes each batch's follow-up.
    pub jobs: Jobs,
    /// Operations a tenant may have running at once
    /// (`DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT`).
    pub max_running_per_tenant: i64,
}

impl Bulk {
    /// Makes the operation of `key`, unless its tenant runs as many as
    /// `DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT` already; or finds the one a
    /// first call with that key made.
    pub async fn create(
        &self,
        owner: (Uuid, &str),
        action: Action,
        selection: &Selection,
    ) -> Result<Created, StoreError> {
        let cap = self.max_running_per_tenant;
        bulk::create(&self.pool, owner, (action, selection), LEASE, cap).await
    }

    /// Runs `operation` to its end, or until another runner overtakes it or
    /// the database stays away (a sweep resumes it then).
    pub async fn run(self, operation: Operation) {
        run(&self, operation).await
    }

    /// Resumes, until `shutdown`, the operations whose runner's lease ran out.
    pub async fn resume_abandoned(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(SWEEP) => {}
            }
            match bulk::take_abandoned(&self.pool, LEASE, 8).await {
                Ok(taken) => {
                    for operation in taken {
                        tracing::info!(operation = %operation.id, "resuming an abandoned bulk operation");
                        tokio::spawn(self.clone().run(operation));
                    }
                }
                Err(e) => tracing::debug!(error = %e, "bulk sweep failed"),
            }
        }
    }
}

async fn run(runner: &Bulk, mut operation: Operation) {
    let id = operation.id;
    loop {
        let mut tries = 0;
        let step = loop {
            match step(runner, &operation).await {
                Err(e) if tries + 1 < TRIES => {
                    tries += 1;
                    tracing::warn!(operation = %id, error = %e, "bulk batch failed; trying again");
                    tokio::time::sleep(Duration::from_secs(1 << tries)).await;
                }
                ended => break ended,
            }
        };
        match step {
            Ok(Some(next)) if next.is_some() => operation.cursor = next,
            Ok(Some(_)) => {
                tracing::info!(operation = %id, action = operation.action().as_str(), "bulk operation finished");
                return;
            }
            Ok(None) => {
                tracing::info!(operation = %id, "bulk operation taken over by another runner");
                return;
            }
            Err(e) => {
                tracing::warn!(operation = %id, error = %e, "bulk operation paused; a sweep resumes it");
                return;
            }
        }
    }
}

/// One batch: `Some(next cursor)` (`Some(None)`: the walk is over), or `None`
/// when another runner moved the cursor first.
async fn step(runner: &Bulk, operation: &Operation) -> Result<Option<Option<Uuid>>, StoreError> {
    let (ids, next) = batch(&runner.pool, operation).await?;
    let Some(applied) = bulk::apply(&runner.pool, operation, &ids, next, LEASE).await? else {
        return Ok(None);
    };
    runner.jobs.followed_batch(&applied).await;
    Ok(Some(next))
}

/// The ids of the next batch, and where the walk goes on after it.
async fn batch(
    pool: &PgPool,
    operation: &Operation,
) -> Result<(Vec<Uuid>, Option<Uuid>), StoreError> {
    match operation.selection() {
        Selection::Ids(ids) => Ok(ids_batch(ids, operation.cursor)),
        Selection::Filter(params) => {
            let params = params.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            let Ok(filter) = JobFilter::of(params) else {
                // Checked when the operation was made; a filter that no
                // longer parses (a renamed state) acts on nothing.
                tracing::error!(operation = %operation.id, "bulk filter no longer parses; finishing");
                return Ok((Vec::new(), None));
            };
            let page = PageRequest {
                after: operation.cursor,
                limit: BATCH,
                order: Order::NewestFirst,
                with_results: false,
            };
            let mut connection = pool.acquire().await?;
            list::list_ids(&mut connection, operation.tenant_id, &filter, page).await
        }
    }
}

/// The next batch of `ids` below `cursor`, newest first.
fn ids_batch(ids: &[Uuid], cursor: Option<Uuid>) -> (Vec<Uuid>, Option<Uuid>) {
    let mut below: Vec<Uuid> = (ids.iter().copied())
        .filter(|id| cursor.is_none_or(|c| *id < c))
        .collect();
    below.sort_unstable_by(|a, b| b.cmp(a));
    below.dedup();
    let more = below.len() > BATCH as usize;
    below.truncate(BATCH as usize);
    let next = more.then(|| below.last().copied()).flatten();
    (below, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ids_walk_goes_down_the_sorted_ids_once_each() {
        let mut ids: Vec<Uuid> = (0..450).map(|_| crate::domain::new_job_id()).collect();
        ids.push(ids[3]);
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let (batch, next) = ids_batch(&ids, cursor);
            assert!(batch.len() <= BATCH as usize);
            seen.extend(batch);
            match next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let mut expected = ids.clone();
        expected.sort_unstable_by(|a, b| b.cmp(a));
        expected.dedup();
        assert_eq!(seen, expected);
    }
}
