//! The console in a real Chromium: `tests/console/browser.py` (Playwright,
//! Debian's `chromium`) against `serve` (in this process), a worker and a
//! bbox worker (processes), Kafka and Postgres. The jobs it looks at are
//! made here: four samples run through both stages (boxes to draw), a failed
//! one to retry from the list, and a failed one whose metadata and error are
//! markup. Skipped, with a line saying so, when `DOCSTREAM_TEST_PLAYWRIGHT`
//! (the Python that has Playwright; `scripts/test.sh` installs it) is unset.

mod common;

use std::time::Duration;

use common::{sample_body, stop, submit_jobs, wait_count, TestEnv, ALL_BBOX_SUCCEEDED};
use docstream::domain::Stage;
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
    let mut children = [
        env.spawn("worker", &[], "console-worker"),
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

    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&out).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console/browser.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .env("BASE", &base)
        .env("KEY", &env.api_key)
        .env("KEY_B", &other.api_key)
        .env("BOXED", done[0].to_string())
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
