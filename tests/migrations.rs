//! Existing data moves by migration, never by a reset: jobs written under the
//! wide layout (migrations 1–4) read back the same under the narrow one.

mod common;

use docstream::domain::BboxStatus;
use docstream::store;
use serde_json::json;
use sqlx::migrate::Migrator;
use uuid::Uuid;

/// The first migration of the narrow job row.
const NARROW_ROW: &str = "20261201000005";

#[tokio::test]
async fn jobs_written_under_the_wide_row_read_back_the_same_under_the_narrow_one() {
    let env = common::TestEnv::unmigrated("migrations").await;
    let pool = env.pool.clone();
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
        .run(&pool)
        .await
        .unwrap();

    let request = |total: &str| {
        json!({"document": {"text": format!("Total {total}")},
               "fields": [{"name": "total", "type": "money", "anchor": "Total"}],
               "webhook_url": "https://example.com/hook", "metadata": {"n": total}})
    };
    let (queued, grounding, done) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let wide = "INSERT INTO extractions (id, status, idempotency_key, request_hash, request,
                    result, attempts, published_at, finished_at, post_processing)
                VALUES ($1, $2, $3, 'hash', $4, $5, $6, now(), $7, $8)";
    let result = json!({"total": {"value": "12.50"}});
    let boxes = json!({"total": [[0, 0, 1, 1]]});
    let rows = [
        (
            queued,
            "queued",
            Some("key-1"),
            request("1"),
            None,
            0,
            None,
            json!({}),
        ),
        (
            grounding,
            "succeeded",
            None,
            request("2"),
            Some(result.clone()),
            1,
            Some(chrono::Utc::now()),
            json!({"bbox_refinement": {"status": "running", "attempts": 2,
                   "requested_at": "2026-11-30T10:00:00Z", "published_at": "2026-11-30T10:00:01Z",
                   "lease_expires_at": "2026-11-30T10:05:00Z"}}),
        ),
        (
            done,
            "succeeded",
            Some("key-3"),
            request("3"),
            Some(result.clone()),
            1,
            Some(chrono::Utc::now()),
            json!({"bbox_refinement": {"status": "succeeded", "attempts": 1,
                   "finished_at": "2026-11-30T10:00:02Z", "result": boxes.clone()}}),
        ),
    ];
    for (id, status, key, request, result, attempts, finished_at, post_processing) in rows {
        sqlx::query(wide)
            .bind(id)
            .bind(status)
            .bind(key)
            .bind(request)
            .bind(result)
            .bind(attempts)
            .bind(finished_at)
            .bind(post_processing)
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query("INSERT INTO extraction_transitions (extraction_id, transition, token) VALUES ($1, 'submit', NULL)")
        .bind(queued)
        .execute(&pool)
        .await
        .unwrap();

    store::migrate(&pool).await.unwrap();

    let queued_row = store::get(&pool, queued).await.unwrap().unwrap();
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

    let grounding_row = store::get(&pool, grounding).await.unwrap().unwrap();
    assert_eq!(grounding_row.result, Some(result.clone()));
    let bbox = grounding_row.bbox_refinement().unwrap();
    assert_eq!(bbox.status, BboxStatus::Running);
    assert_eq!(bbox.attempts, 2);
    assert!(bbox.requested_at.is_some() && bbox.published_at.is_some());
    assert!(bbox.lease_expires_at.is_some() && bbox.result.is_none());

    let done_row = store::get(&pool, done).await.unwrap().unwrap();
    let bbox = done_row.bbox_refinement().unwrap();
    assert_eq!(bbox.status, BboxStatus::Succeeded);
    assert_eq!(bbox.result, Some(boxes));
    assert_eq!(done_row.result, Some(result));

    // The log stays, and a migrated job goes on through the transitions.
    let log: i64 = sqlx::query_scalar("SELECT count(*) FROM extraction_transitions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(log, 1);
    let claim = store::transitions::mark_running(&pool, queued, 30.0)
        .await
        .unwrap()
        .expect("the migrated queued job can be claimed");
    assert_eq!(claim.token, 1);
    assert!(claim.extraction.request.is_some());
}
