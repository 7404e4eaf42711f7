//! The console in a real Chromium: `tests/it/console/browser.py` (Playwright,
//! Debian's `chromium`) against `serve` (in this process), a worker and a
//! bbox worker (processes), Kafka and Postgres. The jobs it looks at are
//! made here: four samples run through both stages (boxes to draw), a scan
//! read by OCR (its page drawn under its boxes, to review), a failed
//! one to retry from the list, a failed one whose metadata and error are
//! markup, a dead letter to replay, and 10,000 finished jobs of a third tenant whose
//! list's first render is timed. Skipped, with a line saying so, when `DOCSTREAM_TEST_PLAYWRIGHT`
//! (the Python that has Playwright; `scripts/test.sh` installs it) is unset.

use crate::common;

use std::time::Duration;

use common::{sample_body, stop, submit_jobs, wait_count, TestEnv, ALL_BBOX_SUCCEEDED};
use docstream::domain::{Scope, Stage};
use docstream::store::{self, transitions, NewExtraction};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium() {
    let Ok(python) = std::env::var("DOCSTREAM_TEST_PLAYWRIGHT") else {
        eprintln!("console: DOCSTREAM_TEST_PLAYWRIGHT unset; the browser test did not run");
        return;
    };
    let env = TestEnv::new("console").await;
    let services = env.services().await;
    let (base, _serving) = env.serve_here(services.clone()).await;
    // A census every second, so the overview's charts fill while it is open.
    let census = [("DOCSTREAM_CENSUS_INTERVAL_S", "1".to_owned())];
    let mut children = [
        env.spawn("worker", &census, "console-worker"),
        env.spawn("bbox-worker", &[], "console-bbox-worker"),
    ];
    let done = submit_jobs(&services, 4).await;
    wait_count(
        &env.pool,
        "the samples",
        ALL_BBOX_SUCCEEDED,
        4,
        Duration::from_secs(60),
    )
    .await;
    let scanned = a_scanned_job(&env, &base).await;
    let failed = failed_job(
        &env,
        sample_body(1),
        "extractor \"model\" refused: page 2 is blank",
    )
    .await;
    let mut markup = sample_body(2);
    markup["metadata"] =
        serde_json::json!({"note": "<img src=x onerror=alert(1)>", "end": "</script>"});
    let xss = failed_job(&env, markup, "</script><img src=x onerror=alert(2)>").await;
    let other = store::tenants::create_tenant(&env.pool, "console-b")
        .await
        .unwrap()
        .key;
    let operator = store::tenants::create_key(&env.pool, "default", &Scope::ALL)
        .await
        .unwrap()
        .api_key;
    let letter = a_dead_letter(&env).await;
    let many = store::tenants::create_tenant(&env.pool, "console-many")
        .await
        .unwrap()
        .key;
    insert_jobs(&env.pool, many.tenant_id, 10_000).await;

    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&out).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/console/browser.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .env("BASE", &base)
        .env("KEY", &env.api_key)
        .env("KEY_B", &other.api_key)
        .env("KEY_OP", &operator)
        .env("KEY_MANY", &many.api_key)
        .env("LETTER", letter.to_string())
        .env("SAMPLE", sample_body(7).to_string())
        .env("BOXED", done[0].to_string())
        .env("SCANNED", &scanned)
        .env("FAILED", failed.to_string())
        .env("XSS", xss.to_string())
        .env("OUT", &out)
        .output()
        .await
        .expect("run the browser test");
    eprintln!("{}", String::from_utf8_lossy(&run.stdout));
    stop(children.iter_mut()).await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    eprintln!("console: screenshots in {}", out.display());
}

/// A scan of the sample invoice (its PDF rendered by poppler at 150 dpi)
/// uploaded and read by OCR through both stages, with a `min_confidence`
/// some of its values fall under: the job's id.
async fn a_scanned_job(env: &TestEnv, base: &str) -> String {
    let pdf = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/files/invoice-northwind.pdf"
    );
    let scan = common::scans::render(&std::fs::read(pdf).unwrap(), 150, "png");
    let client = env.client();
    let file: serde_json::Value = client
        .post(format!("{base}/v1/files"))
        .header("content-type", "image/png")
        .body(scan)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/files/invoice-northwind.json"
    ))
    .unwrap();
    let mut request =
        serde_json::from_str::<serde_json::Value>(&sample).unwrap()["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});
    request["min_confidence"] = serde_json::json!(0.97);
    let accepted: serde_json::Value = client
        .post(format!("{base}/v1/extractions"))
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = (accepted["id"].as_str())
        .unwrap_or_else(|| panic!("the scan's submit: {accepted}; its file: {file}"))
        .to_owned();
    common::wait_for("the scan's job", Duration::from_secs(60), || {
        let get = client.get(format!("{base}/v1/extractions/{id}")).send();
        async move {
            let job: serde_json::Value =
                get.await.map_err(|e| e.to_string())?.json().await.unwrap();
            match job["post_processing"]["bbox_refinement"]["status"].as_str() {
                Some("succeeded") => Ok(()),
                _ => Err(job.to_string()),
            }
        }
    })
    .await;
    id
}

/// A job of the default tenant that failed with `error` on its first attempt.
async fn failed_job(env: &TestEnv, body: serde_json::Value, error: &str) -> Uuid {
    let new = NewExtraction {
        id: docstream::domain::new_job_id(),
        tenant_id: store::tenants::DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: None,
        request: serde_json::from_value(body).unwrap(),
    };
    // Not published: no worker sees it before it fails here.
    let id = store::submit(&env.pool, new).await.unwrap().extraction().id;
    let claim = transitions::claim(&env.pool, Stage::Extraction, id, 30.0)
        .await
        .unwrap()
        .unwrap();
    transitions::fail(&env.pool, Stage::Extraction, id, claim.token, error)
        .await
        .unwrap()
        .unwrap();
    id
}

/// A dead letter of the default tenant whose original record is on the
/// intake topic (no intake runs here, so it stays there): its id.
async fn a_dead_letter(env: &TestEnv) -> i64 {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .create()
        .unwrap();
    let topic = env.topic("extraction.requests");
    let record = FutureRecord::to(&topic)
        .key("letter-1")
        .payload("a request the intake refused");
    let delivery = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let place = (topic.as_str(), delivery.partition, delivery.offset);
    let refused = ("invalid_request", "`fields` must name at least one field");
    // Markup in the excerpt, which the page must show as text.
    let request = r#"{"document": {"text": "<img src=x onerror=alert(3)>"}, "fields": []}"#;
    store::letters::record(
        &env.pool,
        store::tenants::DEFAULT_TENANT_ID,
        place,
        (Some("letter-1"), Some(request)),
        refused,
    )
    .await
    .unwrap();
    sqlx::query_scalar(
        "SELECT id FROM tenant_dead_letters WHERE source_offset = $1 AND source_topic = $2",
    )
    .bind(delivery.offset)
    .bind(&topic)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

/// `n` succeeded jobs of tenant `tenant_id` (finished, so no worker or
/// reaper takes them).
async fn insert_jobs(pool: &sqlx::PgPool, tenant_id: Uuid, n: usize) {
    use docstream::store::{insert_many, Insert};
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let inserts: Vec<Insert> = chunk
            .iter()
            .map(|i| {
                Insert::new(NewExtraction {
                    id: docstream::domain::new_job_id(),
                    tenant_id,
                    max_open_jobs: None,
                    idempotency_key: None,
                    request: serde_json::from_value(sample_body(*i)).unwrap(),
                })
            })
            .collect();
        insert_many(pool, &inserts).await.unwrap();
    }
    sqlx::query(
        "UPDATE extractions SET status = 'succeeded', finished_at = now() WHERE tenant_id = $1",
    )
    .bind(tenant_id)
    .execute(pool)
    .await
    .unwrap();
}
