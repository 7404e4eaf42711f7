//! Existing data moves by migration, never by a reset: jobs written under the
//! wide layout (migrations 1–4) read back the same under the narrow one.

use crate::common;

use docstream::domain::BboxStatus;
use docstream::domain::Stage;
use docstream::store;
use serde_json::{json, Value};
use sqlx::migrate::Migrator;
use sqlx::PgPool;
use uuid::Uuid;

/// The first migration of the narrow job row.
const NARROW_ROW: &str = "20261201000005";

/// The wide row's insert: every column the narrow row splits up.
const WIDE_INSERT: &str =
    "INSERT INTO extractions (id, status, idempotency_key, request_hash, request,
                    result, attempts, published_at, finished_at, post_processing)
                VALUES ($1, $2, $3, 'hash', $4, $5, $6, now(), $7, $8)";

#[tokio::test]
async fn jobs_written_under_the_wide_row_read_back_the_same_under_the_narrow_one() {
    let env = common::TestEnv::unmigrated("migrations").await;
    let pool = env.pool.clone();
    let _wide_migrations = a_database_migrated_up_to_the_wide_row(&pool).await;
    let jobs = a_queued_a_grounding_and_a_done_job_in_wide_rows(&pool).await;

    store::migrate(&pool).await.unwrap();

    the_queued_job_reads_back_the_same(&pool, jobs.queued).await;
    the_grounding_job_reads_back_the_same(&pool, jobs.grounding).await;
    the_done_job_reads_back_the_same(&pool, jobs.done).await;
    the_log_stays_and_the_queued_job_goes_on(&pool, jobs.queued).await;
}

/// Runs the migrations before [`NARROW_ROW`] from a copy of them; the copy is
/// returned so it lives as long as the test.
async fn a_database_migrated_up_to_the_wide_row(pool: &PgPool) -> tempfile::TempDir {
    let before = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir("migrations").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.as_str() < NARROW_ROW {
            std::fs::copy(&path, before.path().join(&name)).unwrap();
        }
    }
    Migrator::new(before.path())
        .await
        .unwrap()
        .run(pool)
        .await
        .unwrap();
    before
}

/// The three jobs written under the wide row.
struct WideJobs {
    queued: Uuid,
    grounding: Uuid,
    done: Uuid,
}

/// One job as the wide row holds it (`request_hash` and `published_at` are
/// the same for all).
struct WideRow {
    id: Uuid,
    status: &'static str,
    key: Option<&'static str>,
    request: Value,
    result: Option<Value>,
    attempts: i32,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    post_processing: Value,
}

/// A request with a webhook and metadata, for a document with `total`.
fn a_request(total: &str) -> Value {
    json!({"document": {"text": format!("Total {total}")},
           "fields": [{"name": "total", "type": "money", "anchor": "Total"}],
           "webhook_url": "https://example.com/hook", "metadata": {"n": total}})
}

/// The result the succeeded jobs hold.
fn the_result() -> Value {
    json!({"total": {"value": "12.50"}})
}

/// The boxes the done job's refinement found.
fn the_boxes() -> Value {
    json!({"total": [[0, 0, 1, 1]]})
}

/// Writes a queued job (with a key and a `submit` in the log), a succeeded one
/// whose bbox refinement runs, and a succeeded one whose refinement is done.
async fn a_queued_a_grounding_and_a_done_job_in_wide_rows(pool: &PgPool) -> WideJobs {
    let jobs = WideJobs {
        queued: Uuid::new_v4(),
        grounding: Uuid::new_v4(),
        done: Uuid::new_v4(),
    };
    for row in wide_rows(&jobs) {
        write_a_wide_row(pool, row).await;
    }
    sqlx::query("INSERT INTO extraction_transitions (extraction_id, transition, token) VALUES ($1, 'submit', NULL)")
        .bind(jobs.queued)
        .execute(pool)
        .await
        .unwrap();
    jobs
}

/// The wide rows of `jobs`.
fn wide_rows(jobs: &WideJobs) -> [WideRow; 3] {
    [
        WideRow {
            id: jobs.queued,
            status: "queued",
            key: Some("key-1"),
            request: a_request("1"),
            result: None,
            attempts: 0,
            finished_at: None,
            post_processing: json!({}),
        },
        WideRow {
            id: jobs.grounding,
            status: "succeeded",
            key: None,
            request: a_request("2"),
            result: Some(the_result()),
            attempts: 1,
            finished_at: Some(chrono::Utc::now()),
            post_processing: json!({"bbox_refinement": {"status": "running", "attempts": 2,
                   "requested_at": "2026-11-30T10:00:00Z", "published_at": "2026-11-30T10:00:01Z",
                   "lease_expires_at": "2026-11-30T10:05:00Z"}}),
        },
        WideRow {
            id: jobs.done,
            status: "succeeded",
            key: Some("key-3"),
            request: a_request("3"),
            result: Some(the_result()),
            attempts: 1,
            finished_at: Some(chrono::Utc::now()),
            post_processing: json!({"bbox_refinement": {"status": "succeeded", "attempts": 1,
                   "finished_at": "2026-11-30T10:00:02Z", "result": the_boxes()}}),
        },
    ]
}

/// Inserts `row` with the wide row's insert.
async fn write_a_wide_row(pool: &PgPool, row: WideRow) {
    sqlx::query(WIDE_INSERT)
        .bind(row.id)
        .bind(row.status)
        .bind(row.key)
        .bind(row.request)
        .bind(row.result)
        .bind(row.attempts)
        .bind(row.finished_at)
        .bind(row.post_processing)
        .execute(pool)
        .await
        .unwrap();
}

/// The queued job keeps its status, key, hash and request, and belongs to
/// the default tenant.
async fn the_queued_job_reads_back_the_same(pool: &PgPool, queued: Uuid) {
    let queued_row = store::get(pool, queued).await.unwrap().unwrap();
    assert_eq!(queued_row.status.as_str(), "queued");
    assert_eq!(
        queued_row.tenant_id,
        store::tenants::DEFAULT_TENANT_ID,
        "rows from before tenants belong to the tenant default"
    );
    assert_eq!(queued_row.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(queued_row.request_hash.as_deref(), Some("hash"));
    assert!(queued_row.webhook, "the request names a webhook_url");
    assert!(queued_row.published_at.is_some());
    assert!(queued_row.bbox_refinement().is_none());
    let stored = serde_json::to_value(&queued_row.request.unwrap().0).unwrap();
    assert_eq!(stored["metadata"], json!({"n": "1"}));
    assert_eq!(stored["webhook_url"], json!("https://example.com/hook"));
}

/// The grounding job keeps its result and its running refinement.
async fn the_grounding_job_reads_back_the_same(pool: &PgPool, grounding: Uuid) {
    let grounding_row = store::get(pool, grounding).await.unwrap().unwrap();
    assert_eq!(grounding_row.result, Some(the_result()));
    let bbox = grounding_row.bbox_refinement().unwrap();
    assert_eq!(bbox.status, BboxStatus::Running);
    assert_eq!(bbox.attempts, 2);
    assert!(bbox.requested_at.is_some() && bbox.published_at.is_some());
    assert!(bbox.lease_expires_at.is_some() && bbox.result.is_none());
}

/// The done job keeps its result and its refinement's boxes.
async fn the_done_job_reads_back_the_same(pool: &PgPool, done: Uuid) {
    let done_row = store::get(pool, done).await.unwrap().unwrap();
    let bbox = done_row.bbox_refinement().unwrap();
    assert_eq!(bbox.status, BboxStatus::Succeeded);
    assert_eq!(bbox.result, Some(the_boxes()));
    assert_eq!(done_row.result, Some(the_result()));
}

/// The log stays, and a migrated job goes on through the transitions.
async fn the_log_stays_and_the_queued_job_goes_on(pool: &PgPool, queued: Uuid) {
    let log: i64 = sqlx::query_scalar("SELECT count(*) FROM extraction_transitions")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(log, 1);
    let claim = store::transitions::claim(pool, Stage::Extraction, queued, 30.0)
        .await
        .unwrap()
        .expect("the migrated queued job can be claimed");
    assert_eq!(claim.token, 1);
    assert!(claim.extraction.request.is_some());
}
