//! Jobs: sample submissions, jobs submitted or inserted, and counts and
//! transition wins read back.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use docstream::roles::Process;
use docstream::store::tenants::DEFAULT_TENANT_ID;
use docstream::store::{self, NewExtraction};
use futures::stream::{self, StreamExt};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::process::wait_for;

/// A count from the database.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A valid request body with word geometry: one of the shipped samples in
/// `samples/`, in the demo's order.
pub fn sample_body(i: usize) -> serde_json::Value {
    static SAMPLES: std::sync::OnceLock<Vec<serde_json::Value>> = std::sync::OnceLock::new();
    let samples = SAMPLES.get_or_init(|| {
        [
            "invoice-northwind",
            "invoice-contoso",
            "receipt-bakery",
            "receipt-hardware",
        ]
        .map(|name| {
            let path = format!("{}/samples/{name}.json", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let mut sample: serde_json::Value = serde_json::from_str(&text).unwrap();
            sample["request"].take()
        })
        .to_vec()
    });
    samples[i % samples.len()].clone()
}

/// Submits `n` jobs through the same path as `POST /v1/extractions`.
pub async fn submit_jobs(services: &Process, n: usize) -> Vec<Uuid> {
    submit_bodies(services, n, sample_body).await
}

/// Submits `n` jobs whose bodies `body(i)` gives, through the submit path.
pub async fn submit_bodies(
    services: &Process,
    n: usize,
    body: impl Fn(usize) -> serde_json::Value,
) -> Vec<Uuid> {
    submit_as(services, DEFAULT_TENANT_ID, n, body).await
}

/// [`submit_bodies`] for `tenant`'s jobs.
pub async fn submit_as(
    services: &Process,
    tenant: Uuid,
    n: usize,
    body: impl Fn(usize) -> serde_json::Value,
) -> Vec<Uuid> {
    let body = &body;
    stream::iter(0..n)
        .map(|i| async move {
            let new = NewExtraction {
                id: Uuid::new_v4(),
                tenant_id: tenant,
                max_open_jobs: None,
                idempotency_key: None,
                request: serde_json::from_value(body(i)).unwrap(),
            };
            services
                .submitter
                .submit(new, || ())
                .await
                .unwrap()
                .extraction()
                .id
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Inserts a job without publishing anything: the raw material of an orphan.
pub async fn insert_job(pool: &PgPool) -> Uuid {
    let request = serde_json::from_value(sample_body(0)).unwrap();
    let new = NewExtraction {
        id: Uuid::new_v4(),
        tenant_id: DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: None,
        request,
    };
    store::submit(pool, new).await.unwrap().extraction().id
}

/// The job at `url` (read over `client`, which carries its key) once it is
/// finished: failed, cancelled, or its bbox refinement finished.
pub async fn finished(client: &reqwest::Client, url: &str, timeout: Duration) -> serde_json::Value {
    wait_for("the job to finish", timeout, || {
        let get = client.get(url).send();
        async move {
            let job: serde_json::Value =
                get.await.map_err(|e| e.to_string())?.json().await.unwrap();
            let bbox = job["post_processing"]["bbox_refinement"]["status"].as_str();
            match (job["status"].as_str(), bbox) {
                (Some("failed" | "cancelled"), _) | (_, Some("succeeded" | "failed")) => Ok(job),
                _ => Err(job.to_string()),
            }
        }
    })
    .await
}

/// Waits until `sql` counts at least `at_least`.
pub async fn wait_count(pool: &PgPool, what: &str, sql: &str, at_least: i64, timeout: Duration) {
    wait_for(what, timeout, || {
        let pool = pool.clone();
        let sql = sql.to_owned();
        async move {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
            if n >= at_least {
                Ok(())
            } else {
                Err(format!("{n}/{at_least}"))
            }
        }
    })
    .await
}

/// Jobs finished with their bbox refinement.
pub const ALL_BBOX_SUCCEEDED: &str = "SELECT count(*) FROM extractions
    WHERE status = 'succeeded' AND bbox_status = 'succeeded'";

/// How many times each id won `transition`.
pub async fn wins(pool: &PgPool, transition: &str) -> HashMap<Uuid, i64> {
    let rows: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT extraction_id, count(*) FROM extraction_transitions WHERE transition::text = $1 GROUP BY 1",
    )
    .bind(transition)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Asserts that exactly `ids` won, each once.
pub fn assert_exactly_once(wins: &HashMap<Uuid, i64>, ids: &[Uuid], what: &str) {
    let expected: HashSet<Uuid> = ids.iter().copied().collect();
    let got: HashSet<Uuid> = wins.keys().copied().collect();
    assert_eq!(
        got, expected,
        "{what}: the set of ids differs (lost or foreign jobs)"
    );
    let twice: Vec<_> = wins.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "{what} won more than once: {twice:?}");
}
