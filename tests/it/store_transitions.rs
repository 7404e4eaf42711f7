//! The state machine against a real Postgres: racing transitions have exactly one
//! winner, illegal transitions change nothing, fencing tokens shut out stale
//! holders, and submits are idempotent per key.
//!
//! Each test gets a freshly migrated database of its own from `#[sqlx::test]`
//! (it reads `DATABASE_URL`, as `scripts/test.sh` sets it); the database is
//! dropped when the test passes and kept for a look when it fails.

use crate::common;

use docstream::domain::Stage;
use docstream::store::tenants::DEFAULT_TENANT_ID;
use std::future::Future;

use docstream::domain::ExtractionRequest;
use docstream::store::orphans::OrphanClass;
use docstream::store::webhooks::{self, Final};
use docstream::store::{
    self, leases, orphans, transitions, Extraction, NewExtraction, SubmitError, Submitted,
};
use futures::future::join_all;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use uuid::Uuid;

const LEASE_S: f64 = 30.0;

fn request() -> ExtractionRequest {
    serde_json::from_value(common::sample_body(0)).unwrap()
}

async fn queued(pool: &PgPool) -> Uuid {
    let new = NewExtraction {
        id: Uuid::new_v4(),
        tenant_id: DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: None,
        request: request(),
    };
    store::submit(pool, new).await.unwrap().extraction().id
}

async fn running(pool: &PgPool) -> (Uuid, i32) {
    let id = queued(pool).await;
    let claim = transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    (id, claim.token)
}

async fn succeeded(pool: &PgPool) -> Uuid {
    let (id, token) = running(pool).await;
    let result = serde_json::json!({"fields": {}});
    transitions::succeed(pool, Stage::Extraction, id, token, &result)
        .await
        .unwrap()
        .unwrap();
    id
}

/// This test's own migrated database (`#[sqlx::test]` makes it, and drops it
/// when the test passes), with a connection for each of the 50 racers. The
/// options `#[sqlx::test]` offers borrow from its shared pool of 20, too few
/// for 50 at once, so the pool is a new one.
async fn racing_pool(_shared: PgPoolOptions, connect: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(60)
        .connect_with(connect)
        .await
        .unwrap()
}

/// Runs one statement about job `id` ($1), as a test's time machine.
async fn exec(pool: &PgPool, sql: &'static str, id: Uuid) {
    sqlx::query(sql).bind(id).execute(pool).await.unwrap();
}

/// Rows and transition-log entries: the whole observable state of a job.
async fn snapshot(pool: &PgPool, id: Uuid) -> (String, i64) {
    let row: Extraction = store::get(pool, id).await.unwrap().unwrap();
    let log: i64 =
        sqlx::query_scalar("SELECT count(*) FROM extraction_transitions WHERE extraction_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    let state = format!(
        "{} {} {:?} {:?} {:?} {:?}",
        row.status,
        row.attempts,
        row.lease_expires_at,
        row.result,
        row.error,
        row.bbox_refinement()
    );
    (state, log)
}

async fn wins_of(pool: &PgPool, id: Uuid, transition: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM extraction_transitions WHERE extraction_id = $1 AND transition::text = $2",
    )
    .bind(id)
    .bind(transition)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Runs 50 racers at once and returns how many won.
async fn race<F, Fut, T>(racer: F) -> usize
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<Option<T>, store::StoreError>>,
{
    let outcomes = join_all((0..50).map(racer)).await;
    outcomes
        .into_iter()
        .map(|o| o.unwrap())
        .filter(Option::is_some)
        .count()
}

#[sqlx::test]
async fn fifty_concurrent_claims_have_one_winner(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = &racing_pool(options, connect).await;
    let id = queued(pool).await;
    let winners = race(|_| transitions::claim(pool, Stage::Extraction, id, LEASE_S)).await;
    assert_eq!(winners, 1);
    assert_eq!(wins_of(pool, id, "mark_running").await, 1);
    let row = store::get(pool, id).await.unwrap().unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("running", 1));
}

/// A batch statement judges every row by the same `WHERE` as the single-row one:
/// in one batch, claimable rows are won, others and repeats lose; batches racing
/// over overlapping ids claim each id once; completions are fenced per row.
#[sqlx::test]
async fn batch_statements_win_and_lose_row_by_row(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = &racing_pool(options, connect).await;
    let (ids, taken) = forty_queued_jobs_and_a_running_one(pool).await;
    one_batch_wins_the_claimable_rows_and_loses_the_rest(pool, &ids, taken).await;
    racing_batches_over_overlapping_ids_claim_each_once(pool, &ids[2..]).await;
    completions_win_with_the_right_token_only_once(pool, &ids, taken).await;
}

/// Forty queued jobs, then a running one: (the forty, the running one).
async fn forty_queued_jobs_and_a_running_one(pool: &PgPool) -> (Vec<Uuid>, Uuid) {
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(queued(pool).await);
    }
    let (taken, _) = running(pool).await;
    (ids, taken)
}

/// One batch of two queued jobs, the running one, a repeat and an unknown id:
/// only the two queued jobs are won.
async fn one_batch_wins_the_claimable_rows_and_loses_the_rest(
    pool: &PgPool,
    ids: &[Uuid],
    taken: Uuid,
) {
    let batch = [ids[0], taken, ids[1], ids[0], Uuid::new_v4()];
    let claims = transitions::claim_many(pool, Stage::Extraction, &batch, LEASE_S)
        .await
        .unwrap();
    let won: Vec<bool> = claims.iter().map(Option::is_some).collect();
    assert_eq!(won, [true, false, true, false, false]);
}

/// Ten batches over overlapping windows of the other 38 ids (`rest`), at
/// once: each id is claimed exactly once.
async fn racing_batches_over_overlapping_ids_claim_each_once(pool: &PgPool, rest: &[Uuid]) {
    let windows: Vec<Vec<Uuid>> = (0..10)
        .map(|i| rest.iter().cycle().skip(i * 7).take(20).copied().collect())
        .collect();
    let racing = join_all(
        windows
            .iter()
            .map(|window| transitions::claim_many(pool, Stage::Extraction, window, LEASE_S)),
    )
    .await;
    let mut winners: Vec<Uuid> = racing
        .into_iter()
        .flat_map(|claims| claims.unwrap().into_iter().flatten())
        .map(|claim| claim.extraction.id)
        .collect();
    winners.sort();
    let mut expected = rest.to_vec();
    expected.sort();
    assert_eq!(winners, expected, "each id is claimed exactly once");
    for id in rest {
        assert_eq!(wins_of(pool, *id, "mark_running").await, 1);
    }
}

/// Completions: the right token wins, a wrong token and a repeat lose.
async fn completions_win_with_the_right_token_only_once(pool: &PgPool, ids: &[Uuid], taken: Uuid) {
    let result = serde_json::json!({"fields": {}});
    let completion = |id, token| transitions::Completion {
        id,
        token,
        result: result.clone(),
    };
    let done = [
        completion(ids[0], 1),
        completion(ids[1], 7),
        completion(ids[0], 1),
        completion(taken, 1),
    ];
    let outcomes = transitions::succeed_many(pool, Stage::Extraction, &done)
        .await
        .unwrap();
    let won: Vec<bool> = outcomes.iter().map(Option::is_some).collect();
    assert_eq!(won, [true, false, false, true]);
    assert_eq!(wins_of(pool, ids[0], "mark_succeeded").await, 1);
    assert_eq!(wins_of(pool, ids[1], "mark_succeeded").await, 0);
}

#[sqlx::test]
async fn succeeded_and_failed_race_has_one_winner(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = &racing_pool(options, connect).await;
    let (id, token) = running(pool).await;
    let result = serde_json::json!({"fields": {}});
    let winners = race(|i| {
        let result = result.clone();
        async move {
            if i % 2 == 0 {
                transitions::succeed(pool, Stage::Extraction, id, token, &result).await
            } else {
                transitions::fail(pool, Stage::Extraction, id, token, "boom").await
            }
        }
    })
    .await;
    assert_eq!(winners, 1);
    let total = wins_of(pool, id, "mark_succeeded").await + wins_of(pool, id, "mark_failed").await;
    assert_eq!(total, 1);
}

#[sqlx::test]
async fn cancel_and_claim_race_has_one_winner(options: PgPoolOptions, connect: PgConnectOptions) {
    let pool = &racing_pool(options, connect).await;
    for _ in 0..5 {
        let id = queued(pool).await;
        let winners = race(|i| async move {
            if i % 2 == 0 {
                transitions::mark_cancelled(pool, id, None).await
            } else {
                Ok(transitions::claim(pool, Stage::Extraction, id, LEASE_S)
                    .await?
                    .map(|c| c.extraction))
            }
        })
        .await;
        assert_eq!(winners, 1);
        let row = store::get(pool, id).await.unwrap().unwrap();
        assert!(
            matches!(row.status.as_str(), "cancelled" | "running"),
            "{}",
            row.status
        );
    }
}

#[sqlx::test]
async fn bbox_claims_and_completions_have_one_winner(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = &racing_pool(options, connect).await;
    let id = succeeded(pool).await;
    let winners = race(|_| transitions::claim(pool, Stage::BboxRefinement, id, LEASE_S)).await;
    assert_eq!(winners, 1);
    let token = store::get(pool, id)
        .await
        .unwrap()
        .unwrap()
        .bbox_refinement()
        .unwrap()
        .attempts;
    assert_eq!(token, 1);
    let result = serde_json::json!({"fields": {}});
    let winners = race(|i| {
        let result = result.clone();
        async move {
            if i % 2 == 0 {
                transitions::succeed(pool, Stage::BboxRefinement, id, token, &result).await
            } else {
                transitions::fail(pool, Stage::BboxRefinement, id, token, "boom").await
            }
        }
    })
    .await;
    assert_eq!(winners, 1);
    assert_eq!(wins_of(pool, id, "mark_bbox_refinement_running").await, 1);
}

#[sqlx::test]
async fn illegal_transitions_return_none_and_change_nothing(pool: PgPool) {
    let pool = &pool;
    let id = queued(pool).await;
    from_queued_nothing_that_needs_a_claim_or_a_success_happens(pool, id).await;
    let (id, token) = running(pool).await;
    under_a_live_lease_no_second_claim_no_cancel_no_stale_success(pool, id, token).await;
    let (id, claim) = both_stages_succeeded(pool).await;
    once_both_stages_succeeded_everything_is_over(pool, id, &claim).await;
}

/// From queued: nothing that needs a claim or a success may happen, and the
/// job is as it was.
async fn from_queued_nothing_that_needs_a_claim_or_a_success_happens(pool: &PgPool, id: Uuid) {
    let result = serde_json::json!({"fields": {}});
    let before = snapshot(pool, id).await;
    assert!(
        transitions::succeed(pool, Stage::Extraction, id, 0, &result)
            .await
            .unwrap()
            .is_none()
    );
    assert!(transitions::fail(pool, Stage::Extraction, id, 0, "x")
        .await
        .unwrap()
        .is_none());
    assert!(transitions::requeue_for_retry(pool, id, 0, "x", 0.0)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::start_bbox_refinement(pool, id)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::claim(pool, Stage::BboxRefinement, id, LEASE_S)
        .await
        .unwrap()
        .is_none());
    assert!(
        transitions::succeed(pool, Stage::BboxRefinement, id, 0, &result)
            .await
            .unwrap()
            .is_none()
    );
    assert!(transitions::requeue_bbox_refinement(pool, id)
        .await
        .unwrap()
        .is_none());
    assert_eq!(snapshot(pool, id).await, before);
}

/// From running under a live lease: no second claim, no cancel, no success
/// with another token, and the job is as it was.
async fn under_a_live_lease_no_second_claim_no_cancel_no_stale_success(
    pool: &PgPool,
    id: Uuid,
    token: i32,
) {
    let result = serde_json::json!({"fields": {}});
    let before = snapshot(pool, id).await;
    assert!(transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::mark_cancelled(pool, id, None)
        .await
        .unwrap()
        .is_none());
    assert!(
        transitions::succeed(pool, Stage::Extraction, id, token + 1, &result)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(snapshot(pool, id).await, before);
}

/// A succeeded job whose bbox refinement succeeded too: (id, the bbox
/// claim).
async fn both_stages_succeeded(pool: &PgPool) -> (Uuid, store::Claim) {
    let result = serde_json::json!({"fields": {}});
    let (id, claim) = a_running_bbox_refinement(pool).await;
    transitions::succeed(pool, Stage::BboxRefinement, id, claim.token, &result)
        .await
        .unwrap()
        .unwrap();
    (id, claim)
}

/// A succeeded job whose bbox refinement is claimed: (id, the bbox claim).
async fn a_running_bbox_refinement(pool: &PgPool) -> (Uuid, store::Claim) {
    let id = succeeded(pool).await;
    let claim = transitions::claim(pool, Stage::BboxRefinement, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    (id, claim)
}

/// From succeeded with bbox succeeded: everything is over, and the job is as
/// it was.
async fn once_both_stages_succeeded_everything_is_over(
    pool: &PgPool,
    id: Uuid,
    claim: &store::Claim,
) {
    let before = snapshot(pool, id).await;
    assert!(transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::mark_cancelled(pool, id, None)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::fail(pool, Stage::Extraction, id, 1, "x")
        .await
        .unwrap()
        .is_none());
    assert!(transitions::claim(pool, Stage::BboxRefinement, id, LEASE_S)
        .await
        .unwrap()
        .is_none());
    assert!(
        transitions::fail(pool, Stage::BboxRefinement, id, claim.token, "x")
            .await
            .unwrap()
            .is_none()
    );
    assert!(transitions::requeue_bbox_refinement(pool, id)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::start_bbox_refinement(pool, id)
        .await
        .unwrap()
        .is_none());
    assert_eq!(snapshot(pool, id).await, before);
}

#[sqlx::test]
async fn a_stale_holder_is_fenced_out_after_its_lease_expired(pool: PgPool) {
    let pool = &pool;
    let (id, stale_token) = running(pool).await;
    // The holder froze past its lease (expired 2 s ago on the database clock).
    exec(
        pool,
        "UPDATE extractions SET lease_expires_at = now() - interval '2 seconds' WHERE id = $1",
        id,
    )
    .await;
    let fresh = transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fresh.token, stale_token + 1);
    let recovery = fresh.extraction.last_recovery_s.unwrap();
    assert!(
        (2.0..3.0).contains(&recovery),
        "recovery measured from lease expiry: {recovery}"
    );
    let result = serde_json::json!({"fields": {}});
    assert!(
        transitions::succeed(pool, Stage::Extraction, id, stale_token, &result)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        transitions::fail(pool, Stage::Extraction, id, stale_token, "late")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        transitions::succeed(pool, Stage::Extraction, id, fresh.token, &result)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(wins_of(pool, id, "mark_succeeded").await, 1);
}

/// A completion whose first try committed but whose answer was lost (the
/// connection broke) loses its retry, since the row moved on under its own
/// token; the transition log tells that win from a takeover, where the
/// stale holder's retry loses for good.
#[sqlx::test]
async fn a_completion_whose_answer_was_lost_is_told_from_a_takeover(pool: PgPool) {
    let pool = &pool;
    let (won, token) = running(pool).await;
    let answered = complete_with_a_lost_first_answer(pool, (won, token), true).await;
    let row = answered.expect("the first try won; its retry is told so");
    assert_eq!((row.id, row.status.as_str()), (won, "succeeded"));
    assert_eq!(wins_of(pool, won, "mark_succeeded").await, 1);

    let (taken, stale_token) = running(pool).await;
    exec(
        pool,
        "UPDATE extractions SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        taken,
    )
    .await;
    let fresh = transitions::claim(pool, Stage::Extraction, taken, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    let result = serde_json::json!({"fields": {}});
    transitions::succeed(pool, Stage::Extraction, taken, fresh.token, &result)
        .await
        .unwrap()
        .unwrap();
    let answered = complete_with_a_lost_first_answer(pool, (taken, stale_token), false).await;
    assert!(answered.is_none(), "a takeover is still a loss");
}

/// Completes `claim` with a success through `persist_completion`, whose first
/// try fails as a broken connection would: after running the statement
/// (`committed`) or before.
async fn complete_with_a_lost_first_answer(
    pool: &PgPool,
    claim: (Uuid, i32),
    committed: bool,
) -> Option<Extraction> {
    let metrics = docstream::metrics::Metrics::new();
    let health = docstream::health::Health::new(metrics.clone());
    let (id, token) = claim;
    let result = serde_json::json!({"fields": {}});
    let done = [transitions::Completion { id, token, result }];
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let statement = || async {
        let first = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        if first && !committed {
            return Err(sqlx::Error::PoolTimedOut.into());
        }
        let answer = transitions::succeed_many(pool, Stage::Extraction, &done).await;
        match first {
            true => Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()).into()),
            false => answer,
        }
    };
    let parts = (&health, &metrics, pool);
    let transition = docstream::domain::Transition::MarkSucceeded;
    let claims = [claim];
    let answered =
        docstream::pipeline::jobs::persist_completion(parts, transition, &claims, statement);
    let mut rows = answered.await.unwrap();
    assert_eq!(tries.into_inner(), 2);
    rows.pop().flatten()
}

/// A failed job goes back to the queue on request with a fresh budget: the
/// run starts at the claims it had and the token keeps counting, so the
/// holder of an attempt before the retry is fenced out. A job that is not
/// failed is left as it is; each retry is logged once.
#[sqlx::test]
async fn a_failed_job_retried_on_request_runs_again_and_fences_its_old_holder(pool: PgPool) {
    let pool = &pool;
    let (id, token) = running(pool).await;
    let retried = transitions::retry_failed(pool, id).await.unwrap();
    assert!(retried.is_none(), "a running job is not retried");
    transitions::fail(pool, Stage::Extraction, id, token, "extractor down")
        .await
        .unwrap()
        .unwrap();
    let row = transitions::retry_failed(pool, id).await.unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.attempts, row.attempts_base),
        ("queued", 1, 1)
    );
    assert!(row.finished_at.is_none() && row.published_at.is_none());
    let again = transitions::retry_failed(pool, id).await.unwrap();
    assert!(again.is_none(), "a queued job is not retried");
    let claim = transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.token, 2);
    let result = serde_json::json!({"fields": {}});
    let stale = transitions::succeed(pool, Stage::Extraction, id, token, &result)
        .await
        .unwrap();
    assert!(stale.is_none(), "attempt 1's holder ended attempt 2's run");
    assert_eq!(wins_of(pool, id, "retry_failed").await, 1);
    let done = succeeded(pool).await;
    let retried = transitions::retry_failed(pool, done).await.unwrap();
    assert!(retried.is_none(), "a succeeded job is not retried");
}

#[sqlx::test]
async fn retry_and_bbox_requeue_return_work_to_pending(pool: PgPool) {
    let pool = &pool;
    let (id, token) = running(pool).await;
    let row = transitions::requeue_for_retry(pool, id, token, "flaky", 0.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_deref()),
        ("queued", Some("flaky"))
    );
    let again = transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.token, 2);

    let id = succeeded(pool).await;
    transitions::claim(pool, Stage::BboxRefinement, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    let row = transitions::requeue_bbox_refinement(pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.bbox_refinement().unwrap().status,
        docstream::domain::BboxStatus::Pending
    );
    let claim = transitions::claim(pool, Stage::BboxRefinement, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.token, 2);
}

#[sqlx::test]
async fn fifty_concurrent_submits_with_one_key_make_one_row(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = &racing_pool(options, connect).await;
    let outcomes = fifty_concurrent_submits_under_key_1(pool).await;
    one_created_the_only_row_and_all_answer_its_id(pool, &outcomes).await;
    key_1_with_another_request_is_refused_as_reused(pool).await;
}

/// A new extraction of `request` under the idempotency key "key-1".
fn under_key_1(request: ExtractionRequest) -> NewExtraction {
    NewExtraction {
        id: Uuid::new_v4(),
        tenant_id: DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: Some("key-1".into()),
        request,
    }
}

/// Fifty submits of the same request under "key-1", at once.
async fn fifty_concurrent_submits_under_key_1(pool: &PgPool) -> Vec<Submitted> {
    let submits = (0..50).map(|_| store::submit(pool, under_key_1(request())));
    join_all(submits)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// One submit created the row, every submit answers its id, and there is
/// one row.
async fn one_created_the_only_row_and_all_answer_its_id(pool: &PgPool, outcomes: &[Submitted]) {
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, Submitted::Created(_)))
        .count();
    assert_eq!(created, 1);
    let ids: std::collections::HashSet<Uuid> = outcomes.iter().map(|o| o.extraction().id).collect();
    assert_eq!(ids.len(), 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// The same key with a different request is refused: the key was reused.
async fn key_1_with_another_request_is_refused_as_reused(pool: &PgPool) {
    let mut other = request();
    other.fields.truncate(1);
    let reused = store::submit(pool, under_key_1(other)).await;
    assert!(matches!(reused, Err(SubmitError::KeyReused)));
}

#[sqlx::test]
async fn only_unpublished_queued_jobs_past_their_threshold_are_orphans(pool: PgPool) {
    let pool = &pool;
    let jobs = a_fresh_an_old_and_a_retried_queued_job(pool).await;
    the_old_and_the_retried_are_orphans_of_their_tenant_only(pool, &jobs).await;
    their_events_are_acknowledged(pool, &jobs).await;
    no_job_is_an_orphan(pool).await;
    let stuck = a_queued_job_submitted_an_hour_ago(pool).await;
    a_reaper_takes_it_once_per_threshold(pool, stuck).await;
}

/// The orphan thresholds of these tests: 10 s for what waits on an event,
/// [`LEASE_S`] for the leases.
const THRESHOLDS: orphans::Thresholds = orphans::Thresholds {
    queued_s: 10.0,
    run_lease_s: LEASE_S,
    post_processing_pending_s: 10.0,
    bbox_lease_s: LEASE_S,
    webhook_pending_s: 10.0,
    unclaimed_s: 7200.0,
};

/// The queued jobs past their threshold: one never claimed, one requeued for
/// a retry.
struct PastThreshold {
    old: Uuid,
    retried: Uuid,
}

/// A fresh queued job, and two submitted (and due) an hour ago: one never
/// claimed, one requeued for a retry.
async fn a_fresh_an_old_and_a_retried_queued_job(pool: &PgPool) -> PastThreshold {
    let fresh = queued(pool).await;
    let old = queued(pool).await;
    let (retried, token) = running(pool).await;
    transitions::requeue_for_retry(pool, retried, token, "flaky", 0.0)
        .await
        .unwrap()
        .unwrap();
    exec(pool, "UPDATE extractions SET submitted_at = now() - interval '1 hour', next_attempt_at = now() - interval '1 hour' WHERE id <> $1", fresh).await;
    PastThreshold { old, retried }
}

/// The orphans of `tenant` (of every tenant with `None`), as (class, id).
async fn orphans_of(pool: &PgPool, tenant: Option<Uuid>) -> Vec<(i16, Uuid)> {
    orphans::list_orphans(pool, THRESHOLDS, tenant)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.class.number(), o.id))
        .collect::<Vec<(i16, Uuid)>>()
}

/// The old job is class 1 and the retried one class 3, listed for every
/// tenant and for theirs, not for another; the fresh one is no orphan yet.
async fn the_old_and_the_retried_are_orphans_of_their_tenant_only(
    pool: &PgPool,
    jobs: &PastThreshold,
) {
    let found = orphans_of(pool, None).await;
    assert_eq!(
        found,
        vec![(1, jobs.old), (3, jobs.retried)],
        "a fresh job is not an orphan yet"
    );
    assert_eq!(
        orphans_of(pool, Some(DEFAULT_TENANT_ID)).await,
        found,
        "the jobs' tenant"
    );
    assert!(
        orphans_of(pool, Some(Uuid::now_v7())).await.is_empty(),
        "another tenant"
    );
}

/// Records both jobs' events as published (acknowledged by the broker).
async fn their_events_are_acknowledged(pool: &PgPool, jobs: &PastThreshold) {
    orphans::record_published(pool, Stage::Extraction, jobs.old)
        .await
        .unwrap();
    orphans::record_published(pool, Stage::Extraction, jobs.retried)
        .await
        .unwrap();
}

/// An acknowledged event is waiting in a backlog, not lost: no orphan is
/// listed.
async fn no_job_is_an_orphan(pool: &PgPool) {
    assert!(orphans_of(pool, None).await.is_empty());
}

/// A queued job submitted an hour ago whose event was never published.
async fn a_queued_job_submitted_an_hour_ago(pool: &PgPool) -> Uuid {
    let stuck = queued(pool).await;
    exec(
        pool,
        "UPDATE extractions SET submitted_at = now() - interval '1 hour' WHERE id = $1",
        stuck,
    )
    .await;
    stuck
}

/// A reaper takes an orphan once per threshold: the first take is `stuck`,
/// the one straight after is empty.
async fn a_reaper_takes_it_once_per_threshold(pool: &PgPool, stuck: Uuid) {
    let taken = orphans::take(pool, Stage::Extraction, THRESHOLDS, 100)
        .await
        .unwrap();
    assert_eq!(taken.iter().map(|o| o.id).collect::<Vec<_>>(), vec![stuck]);
    assert!(orphans::take(pool, Stage::Extraction, THRESHOLDS, 100)
        .await
        .unwrap()
        .is_empty());
}

/// Classes 7 and 8, the last net: a stage whose event was acknowledged and
/// that nobody claimed past the grace (two hours here) is taken, once per
/// grace; one stamped within the grace is waiting in a backlog and is left
/// alone.
#[sqlx::test]
async fn a_stamped_stage_unclaimed_past_the_grace_is_taken_once_per_grace(pool: PgPool) {
    let pool = &pool;
    let (waiting, lost) = (queued(pool).await, queued(pool).await);
    let (bbox_waiting, bbox_lost) = (succeeded(pool).await, succeeded(pool).await);
    exec(pool, "UPDATE extractions SET submitted_at = now() - interval '4 hours', published_at = now() - interval '1 hour' WHERE id = $1", waiting).await;
    exec(pool, "UPDATE extractions SET submitted_at = now() - interval '4 hours', published_at = now() - interval '3 hours' WHERE id = $1", lost).await;
    exec(
        pool,
        "UPDATE extractions SET bbox_published_at = now() - interval '1 hour' WHERE id = $1",
        bbox_waiting,
    )
    .await;
    exec(
        pool,
        "UPDATE extractions SET bbox_published_at = now() - interval '3 hours' WHERE id = $1",
        bbox_lost,
    )
    .await;
    assert_eq!(
        orphans_of(pool, None).await,
        vec![(7, lost), (8, bbox_lost)],
        "stamped within the grace: a backlog, not an orphan"
    );
    for (stage, id, class) in [
        (Stage::Extraction, lost, OrphanClass::QueuedUnclaimed),
        (Stage::BboxRefinement, bbox_lost, OrphanClass::BboxUnclaimed),
    ] {
        let taken = orphans::take(pool, stage, THRESHOLDS, 100).await.unwrap();
        let taken: Vec<_> = taken.iter().map(|o| (o.id, o.class)).collect();
        assert_eq!(taken, vec![(id, class)], "{stage:?}");
        let again = orphans::take(pool, stage, THRESHOLDS, 100).await.unwrap();
        assert!(again.is_empty(), "{stage:?}: once per grace");
    }
}

#[sqlx::test]
async fn heartbeats_renew_only_the_current_claim_and_carry_cancel_requests(pool: PgPool) {
    let pool = &pool;
    let (id, token) = running(pool).await;
    only_the_current_token_renews_the_lease(pool, id, token).await;
    // Cooperative cancel: only the holder ends it, and only once it was asked.
    the_holder_cannot_cancel_before_it_is_asked(pool, id, token).await;
    a_cancel_request_reaches_the_holder_with_its_heartbeat(pool, id, token).await;
    only_the_holder_ends_it_and_then_its_lease_is_gone(pool, id, token).await;
    // The bbox lease too.
    let (id, claim) = a_running_bbox_refinement(pool).await;
    only_the_current_token_renews_the_bbox_lease(pool, id, &claim).await;
}

/// The holder's token renews the lease (no cancel asked); the next token
/// does not.
async fn only_the_current_token_renews_the_lease(pool: &PgPool, id: Uuid, token: i32) {
    let renewed = leases::renew(pool, Stage::Extraction, id, token, LEASE_S)
        .await
        .unwrap();
    assert_eq!(
        renewed,
        Some(leases::Renewed {
            cancel_requested: false
        })
    );
    assert!(
        leases::renew(pool, Stage::Extraction, id, token + 1, LEASE_S)
            .await
            .unwrap()
            .is_none()
    );
}

/// Not asked to, the holder cannot cancel the job.
async fn the_holder_cannot_cancel_before_it_is_asked(pool: &PgPool, id: Uuid, token: i32) {
    assert!(transitions::mark_cancelled(pool, id, Some(token))
        .await
        .unwrap()
        .is_none());
}

/// A cancel is requested, and the holder's next renewal says so.
async fn a_cancel_request_reaches_the_holder_with_its_heartbeat(
    pool: &PgPool,
    id: Uuid,
    token: i32,
) {
    assert!(transitions::request_cancel(pool, id)
        .await
        .unwrap()
        .is_some());
    let renewed = leases::renew(pool, Stage::Extraction, id, token, LEASE_S)
        .await
        .unwrap();
    assert_eq!(
        renewed,
        Some(leases::Renewed {
            cancel_requested: true
        })
    );
}

/// Neither an operator's cancel nor the next token ends the job; the holder
/// does, and then its lease no longer renews.
async fn only_the_holder_ends_it_and_then_its_lease_is_gone(pool: &PgPool, id: Uuid, token: i32) {
    assert!(transitions::mark_cancelled(pool, id, None)
        .await
        .unwrap()
        .is_none());
    assert!(transitions::mark_cancelled(pool, id, Some(token + 1))
        .await
        .unwrap()
        .is_none());
    let row = transitions::mark_cancelled(pool, id, Some(token))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status.as_str(), "cancelled");
    assert!(leases::renew(pool, Stage::Extraction, id, token, LEASE_S)
        .await
        .unwrap()
        .is_none());
}

/// The bbox claim's token renews the bbox lease; the next token does not.
async fn only_the_current_token_renews_the_bbox_lease(
    pool: &PgPool,
    id: Uuid,
    claim: &store::Claim,
) {
    assert!(
        leases::renew(pool, Stage::BboxRefinement, id, claim.token, LEASE_S)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        leases::renew(pool, Stage::BboxRefinement, id, claim.token + 1, LEASE_S)
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test]
async fn a_terminal_transition_writes_its_webhook_delivery_and_attempts_are_fenced(pool: PgPool) {
    let pool = &pool;
    let (hooked, claim) = a_running_job_with_a_webhook_url(pool).await;
    let id = its_failure_writes_a_delivery_named_after_it(pool, hooked, &claim).await;
    let plain = a_failure_without_a_webhook_url_writes_none(pool).await;
    // One attempt at a time; only its holder records the outcome.
    the_first_attempt_is_leased_until_it_is_retried_later(pool, &id).await;
    only_the_second_attempts_holder_records_it_delivered(pool, &id).await;
    // Class 6: due long ago, held by nobody; handed out once per threshold.
    a_stuck_and_a_fresh_delivery_of(pool, plain).await;
    only_the_stuck_one_is_handed_out_and_only_once(pool).await;
}

/// A job submitted with a `webhook_url`, claimed: (id, its claim).
async fn a_running_job_with_a_webhook_url(pool: &PgPool) -> (Uuid, store::Claim) {
    let url = "https://hooks.example.com/docstream";
    a_running_job_of(pool, DEFAULT_TENANT_ID, url).await
}

/// A job of `tenant_id` with a webhook to `url`, claimed: (id, its claim).
async fn a_running_job_of(pool: &PgPool, tenant_id: Uuid, url: &str) -> (Uuid, store::Claim) {
    let mut hooked = request();
    hooked.webhook_url = Some(url.into());
    let new = NewExtraction {
        id: Uuid::new_v4(),
        tenant_id,
        max_open_jobs: None,
        idempotency_key: None,
        request: hooked,
    };
    let id = store::submit(pool, new).await.unwrap().extraction().id;
    let claim = transitions::claim(pool, Stage::Extraction, id, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    (id, claim)
}

/// Fails the job: the row names its delivery `msg_<id>_failed`, which is
/// returned.
async fn its_failure_writes_a_delivery_named_after_it(
    pool: &PgPool,
    hooked: Uuid,
    claim: &store::Claim,
) -> String {
    let failed = transitions::fail(pool, Stage::Extraction, hooked, claim.token, "broken")
        .await
        .unwrap()
        .unwrap();
    let id = format!("msg_{}_failed", hooked.simple());
    assert_eq!(failed.webhook_id.as_deref(), Some(id.as_str()));
    id
}

/// Without a webhook_url the same transition writes no delivery: the one
/// delivery is the first job's. Returns the job's id.
async fn a_failure_without_a_webhook_url_writes_none(pool: &PgPool) -> Uuid {
    let (plain, token) = running(pool).await;
    let row = transitions::fail(pool, Stage::Extraction, plain, token, "broken")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.webhook_id, None);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    plain
}

/// The first attempt carries the failure; while it is leased there is no
/// second; its holder schedules a retry.
async fn the_first_attempt_is_leased_until_it_is_retried_later(pool: &PgPool, id: &str) {
    let first = webhooks::claim(pool, id, LEASE_S).await.unwrap().unwrap();
    assert_eq!(
        (first.attempts, first.event_type.as_str()),
        (1, "extraction.failed")
    );
    assert_eq!(first.payload["data"]["error"], "broken");
    assert!(
        webhooks::claim(pool, id, LEASE_S).await.unwrap().is_none(),
        "leased"
    );
    assert!(webhooks::retry_later(pool, id, 1, 0.0, Some(500), "500")
        .await
        .unwrap());
}

/// The second attempt is claimed; the first attempt's holder cannot finish
/// it, the second's can, and a delivered delivery is claimed no more.
async fn only_the_second_attempts_holder_records_it_delivered(pool: &PgPool, id: &str) {
    let second = webhooks::claim(pool, id, LEASE_S).await.unwrap().unwrap();
    assert_eq!(second.attempts, 2);
    assert!(
        !webhooks::finish(pool, id, 1, Final::Delivered, Some(200), None)
            .await
            .unwrap()
    );
    assert!(
        webhooks::finish(pool, id, 2, Final::Delivered, Some(200), None)
            .await
            .unwrap()
    );
    assert!(
        webhooks::claim(pool, id, LEASE_S).await.unwrap().is_none(),
        "delivered"
    );
}

/// Two pending deliveries of job `plain`: `msg_stuck`, due a minute ago, and
/// `msg_fresh`, due now.
async fn a_stuck_and_a_fresh_delivery_of(pool: &PgPool, plain: Uuid) {
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, extraction_id, event_type, url, payload, next_attempt_at)
         VALUES ('msg_stuck', $1, 'extraction.failed', 'https://x.example/', '{}', now() - interval '1 minute'),
                ('msg_fresh', $1, 'extraction.failed', 'https://x.example/', '{}', now())",
    )
    .bind(plain)
    .execute(pool)
    .await
    .unwrap();
}

/// With a 10 s threshold, the first take hands out `msg_stuck` alone and the
/// next nothing.
async fn only_the_stuck_one_is_handed_out_and_only_once(pool: &PgPool) {
    let taken = webhooks::take_orphans(pool, 10.0, 100).await.unwrap();
    assert_eq!(
        taken.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(),
        ["msg_stuck"]
    );
    assert!(webhooks::take_orphans(pool, 10.0, 100)
        .await
        .unwrap()
        .is_empty());
}

#[sqlx::test]
async fn a_value_postgres_cannot_hold_fails_only_its_own_insert_in_a_batch(pool: PgPool) {
    let pool = &pool;
    let new = |key: &str| {
        store::Insert::new(NewExtraction {
            id: Uuid::new_v4(),
            tenant_id: DEFAULT_TENANT_ID,
            max_open_jobs: None,
            idempotency_key: Some(key.to_owned()),
            request: request(),
        })
    };
    // Validation refuses a NUL in a key (or anywhere) before a submit gets
    // here; this batch skips it, as a value validation missed would.
    let batch = vec![new("key-1"), new("key-\0"), new("key-3")];
    let together = store::insert_many(pool, &batch).await;
    let together = together.map(|rows| rows.len());
    assert!(
        matches!(&together, Err(e) if e.is_data_error()),
        "{together:?}"
    );
    let each = store::insert_each(pool, &batch).await.unwrap();
    assert!(each[0].as_ref().is_ok_and(Option::is_some));
    assert!(each[1].as_ref().is_err_and(|e| e.is_data_error()));
    assert!(each[2].as_ref().is_ok_and(Option::is_some));
    let rows = common::count(pool, "SELECT count(*) FROM extraction_requests").await;
    assert_eq!(rows, 2);
}

/// A job of `tenant_id` with a webhook to `url`, failed: its delivery's id.
async fn a_failed_job_of(pool: &PgPool, tenant_id: Uuid, url: &str) -> String {
    let (id, claim) = a_running_job_of(pool, tenant_id, url).await;
    let failed = transitions::fail(pool, Stage::Extraction, id, claim.token, "broken")
        .await
        .unwrap()
        .unwrap();
    failed.webhook_id.unwrap()
}

/// Whether the claim of delivery `id` finds its endpoint disabled.
async fn claimed_as_disabled(pool: &PgPool, id: &str) -> bool {
    let claimed = webhooks::claim(pool, id, LEASE_S).await.unwrap().unwrap();
    claimed.endpoint_disabled
}

/// A 410 disables an endpoint for the tenant whose delivery got it: that
/// tenant's next delivery to the URL is claimed as disabled, and another
/// tenant's delivery to the same URL is not.
#[sqlx::test]
async fn a_410_disables_an_endpoint_for_its_tenant_only(pool: PgPool) {
    let pool = &pool;
    let url = "https://hooks.example.com/shared";
    let other = store::tenants::create_tenant(pool, "other")
        .await
        .unwrap()
        .key
        .tenant_id;
    let gone = a_failed_job_of(pool, DEFAULT_TENANT_ID, url).await;
    let answered = webhooks::claim(pool, &gone, LEASE_S)
        .await
        .unwrap()
        .unwrap();
    assert!(!answered.endpoint_disabled);
    assert!(
        webhooks::disable_endpoint(pool, &answered, "answered 410 Gone")
            .await
            .unwrap()
    );
    assert!(
        !webhooks::disable_endpoint(pool, &answered, "answered 410 Gone")
            .await
            .unwrap(),
        "already disabled"
    );
    let same_tenant = a_failed_job_of(pool, DEFAULT_TENANT_ID, url).await;
    let other_tenant = a_failed_job_of(pool, other, url).await;
    assert!(
        claimed_as_disabled(pool, &same_tenant).await,
        "the tenant that got the 410"
    );
    assert!(
        !claimed_as_disabled(pool, &other_tenant).await,
        "another tenant"
    );
}

/// A job of `tenant` submitted `age_days` ago (its id and `submitted_at`
/// say so), in the state `finish` leaves it; `finished_days` ago, if it
/// finished.
async fn aged(
    pool: &PgPool,
    tenant: Uuid,
    age_days: u64,
    state: &str,
    finished_days: Option<f64>,
) -> Uuid {
    let submitted =
        std::time::SystemTime::now() - std::time::Duration::from_secs(age_days * 86_400);
    let since = submitted.duration_since(std::time::UNIX_EPOCH).unwrap();
    let id = Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        since.as_secs(),
        since.subsec_nanos(),
    ));
    let new = NewExtraction {
        id,
        tenant_id: tenant,
        max_open_jobs: None,
        idempotency_key: None,
        request: request(),
    };
    store::submit(pool, new).await.unwrap();
    let status = match state {
        "bbox_pending" => "succeeded",
        other => other,
    };
    let bbox = (state == "bbox_pending").then_some("pending");
    sqlx::query(
        "UPDATE extractions SET status = $2, bbox_status = $3,
                submitted_at = now() - make_interval(days => $4),
                finished_at = now() - make_interval(secs => $5 * 86400)
          WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(bbox)
    .bind(age_days as i32)
    .bind(finished_days)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO extraction_results (id, stage, result) VALUES ($1, 'extraction', '{}')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// The purge takes exactly the finished jobs past their tenant's retention
/// (1 day for one tenant, the default 30 for another, for ever for a third),
/// every row of theirs in every table, and nothing open, nothing refining
/// its boxes, nothing recent; a second pass finds nothing.
#[sqlx::test]
async fn retention_purges_exactly_the_expired_finished_jobs(pool: PgPool) {
    use docstream::store::{retention, tenants};
    let short = tenants::create_tenant(&pool, "short")
        .await
        .unwrap()
        .key
        .tenant_id;
    let forever = tenants::create_tenant(&pool, "forever")
        .await
        .unwrap()
        .key
        .tenant_id;
    tenants::set_retention(&pool, "short", Some(1))
        .await
        .unwrap();
    tenants::set_retention(&pool, "forever", Some(0))
        .await
        .unwrap();
    let default = DEFAULT_TENANT_ID;

    let expired = vec![
        aged(&pool, short, 3, "succeeded", Some(2.0)).await,
        aged(&pool, short, 3, "failed", Some(1.5)).await,
        aged(&pool, short, 2, "cancelled", Some(1.1)).await,
        aged(&pool, default, 45, "succeeded", Some(40.0)).await,
    ];
    let kept = vec![
        aged(&pool, short, 3, "succeeded", Some(0.2)).await,
        aged(&pool, short, 3, "running", None).await,
        aged(&pool, short, 3, "queued", None).await,
        aged(&pool, short, 3, "bbox_pending", Some(2.0)).await,
        aged(&pool, short, 0, "succeeded", Some(0.0)).await,
        aged(&pool, default, 45, "failed", Some(10.0)).await,
        aged(&pool, forever, 400, "succeeded", Some(399.0)).await,
    ];
    let thirty_days = std::time::Duration::from_secs(30 * 86_400);
    let purged = retention::purge_expired(&pool, thirty_days, 2)
        .await
        .unwrap();
    assert_eq!(purged, 2, "a batch is at most its size");
    let purged = purged
        + retention::purge_expired(&pool, thirty_days, 500)
            .await
            .unwrap();
    assert_eq!(purged, expired.len() as u64);
    assert_eq!(
        retention::purge_expired(&pool, thirty_days, 500)
            .await
            .unwrap(),
        0
    );

    for table in [
        "SELECT count(*) FROM extractions WHERE id = ANY($1)",
        "SELECT count(*) FROM extraction_requests WHERE id = ANY($1)",
        "SELECT count(*) FROM extraction_results WHERE id = ANY($1)",
        "SELECT count(*) FROM extraction_transitions WHERE extraction_id = ANY($1)",
        "SELECT count(*) FROM webhook_deliveries WHERE extraction_id = ANY($1)",
    ] {
        let left: i64 = sqlx::query_scalar(table)
            .bind(&expired)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(left, 0, "{table}: rows of purged jobs");
        let there: i64 = sqlx::query_scalar(table)
            .bind(&kept)
            .fetch_one(&pool)
            .await
            .unwrap();
        if table.contains("extractions WHERE") || table.contains("requests") {
            assert_eq!(there, kept.len() as i64, "{table}: the kept jobs are whole");
        }
    }
}
