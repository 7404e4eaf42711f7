//! Tenants and API keys, against a real `serve` process, the Kafka intake, the
//! CLI and Postgres: every request needs a live key with the route's scope;
//! another tenant's job answers 404 as if it did not exist; idempotency keys
//! are per tenant; a revoked key, or one whose tenant was deleted, is refused
//! within 5 s by a running `serve` and by the intake.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{free_port, sample_body, TestEnv};
use docstream::events::{decode, encode, DeadLetter, ExtractionRequested};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

/// The longest a revocation may take to be seen, as promised.
const REVOCATION_BOUND: Duration = Duration::from_secs(5);

/// Runs `docstream ARGS` on the test's database; its JSON output.
async fn cli(env: &TestEnv, args: &[&str]) -> Value {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
        .args(args)
        .envs(env.child_env())
        .output()
        .await
        .expect("run docstream");
    assert!(
        output.status.success(),
        "docstream {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

/// A `serve` process on a free port; its base URL.
fn serve(env: &TestEnv, log: &str) -> (tokio::process::Child, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = env.spawn("serve", &[("DOCSTREAM_HTTP_ADDR", addr.clone())], log);
    (child, format!("http://{addr}"))
}

async fn call(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("an answer");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_makes_tenants_and_keys_and_shows_a_secret_only_once() {
    let env = TestEnv::postgres_only("tenancy_cli").await;
    let made = cli(&env, &["tenants", "create", "acme"]).await;
    assert_eq!(made["tenant"], "acme");
    let key = made["api_key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("dsk_") && key.len() == 68, "{key}");
    assert_eq!(
        made["scopes"],
        json!(["submit", "read", "cancel", "export"])
    );
    Uuid::parse_str(made["tenant_id"].as_str().unwrap()).unwrap();

    let reader = cli(&env, &["keys", "create", "acme", "--scopes", "read"]).await;
    assert_eq!(reader["scopes"], json!(["read"]));
    let listed = cli(&env, &["keys", "list", "acme"]).await;
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2);
    let text = serde_json::to_string(listed).unwrap();
    assert!(
        !text.contains(&key[4..]),
        "a listing shows a secret: {text}"
    );
    assert!(listed.iter().all(|k| k["revoked_at"].is_null()));

    let revoked = cli(
        &env,
        &["keys", "revoke", reader["key_id"].as_str().unwrap()],
    )
    .await;
    assert!(revoked["revoked_at"].is_string());
    let tenants = cli(&env, &["tenants", "list"]).await;
    let names: HashSet<&str> = tenants
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, HashSet::from(["acme", "default"]));

    // Refusals: an existing name, a bad name, an unknown scope, no tenant.
    for args in [
        &["tenants", "create", "acme"][..],
        &["tenants", "create", "Not A Name"],
        &["keys", "create", "acme", "--scopes", "root"],
        &["keys", "list", "nobody"],
    ] {
        let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
            .args(args)
            .envs(env.child_env())
            .output()
            .await
            .unwrap()
            .status;
        assert!(!status.success(), "docstream {args:?} succeeded");
    }
    let deleted = cli(&env, &["tenants", "delete", "acme"]).await;
    assert!(deleted["deleted_at"].is_string());
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_needs_a_live_key_with_its_scope_and_sees_only_its_tenant() {
    let env = TestEnv::new("tenancy_api").await;
    let a = cli(&env, &["tenants", "create", "a"]).await;
    let b = cli(&env, &["tenants", "create", "b"]).await;
    let (a_key, b_key) = (
        a["api_key"].as_str().unwrap(),
        b["api_key"].as_str().unwrap(),
    );
    let reader = cli(&env, &["keys", "create", "a", "--scopes", "read"]).await;
    let reader = reader["api_key"].as_str().unwrap();
    let (mut child, base) = serve(&env, "tenancy-api-serve");
    common::wait_healthy(&base).await;
    let client = reqwest::Client::new();
    let submit = |key: Option<&str>| {
        let request = client
            .post(format!("{base}/v1/extractions"))
            .json(&sample_body(0));
        match key {
            Some(key) => request.header("authorization", bearer(key)),
            None => request,
        }
    };

    // No key, a malformed header, an unknown key: 401 with a challenge, nothing written.
    let unknown = format!("dsk_{}", "0".repeat(64));
    for request in [
        submit(None),
        submit(None).header("authorization", "Basic YTpi"),
        submit(Some(&unknown)),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    // A key without the scope: 403.
    let (status, body) = call(submit(Some(reader))).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    assert_eq!(
        common::count(&env.pool, "SELECT count(*) FROM extractions").await,
        0
    );

    // A's job: A reads it; B gets 404 on read and cancel, as for no job at all.
    let (status, made) = call(submit(Some(a_key)).header("idempotency-key", "order-1")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    let job = format!("{base}/v1/extractions/{id}");
    let read = |key: &str| client.get(&job).header("authorization", bearer(key));
    assert_eq!(call(read(a_key)).await.0, StatusCode::OK);
    assert_eq!(call(read(reader)).await.0, StatusCode::OK);
    let (status, body) = call(read(b_key)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let cancel = |key: &str| {
        client
            .post(format!("{job}/cancel"))
            .header("authorization", bearer(key))
    };
    assert_eq!(call(cancel(b_key)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(call(cancel(reader)).await.0, StatusCode::FORBIDDEN);

    // The same idempotency key in B is B's own job; in A it is A's again.
    let (_, b_made) = call(submit(Some(b_key)).header("idempotency-key", "order-1")).await;
    assert_ne!(b_made["id"], made["id"], "B was given A's job");
    let (_, replayed) = call(submit(Some(a_key)).header("idempotency-key", "order-1")).await;
    assert_eq!(replayed["id"], made["id"]);
    let owners: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, tenant_id FROM extraction_requests ORDER BY id")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let tenant_of = |t: &Value| Uuid::parse_str(t["tenant_id"].as_str().unwrap()).unwrap();
    let expected: HashSet<(Uuid, Uuid)> = HashSet::from([
        (Uuid::parse_str(&id).unwrap(), tenant_of(&a)),
        (
            Uuid::parse_str(b_made["id"].as_str().unwrap()).unwrap(),
            tenant_of(&b),
        ),
    ]);
    assert_eq!(owners.into_iter().collect::<HashSet<_>>(), expected);

    // A cancels its own job.
    assert_eq!(call(cancel(a_key)).await.0, StatusCode::OK);

    // /metrics is not on the API port, with or without a key.
    let metrics = client
        .get(format!("{base}/metrics"))
        .header("authorization", bearer(a_key))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::NOT_FOUND);
    common::stop([&mut child]).await;
    env.cleanup().await;
}

/// How long after `revoke` ran the key was first refused by `refused`, which
/// is polled until it says so.
async fn time_to_refusal<F, Fut>(mut refused: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let since = Instant::now();
    while !refused().await {
        assert!(
            since.elapsed() < REVOCATION_BOUND * 3,
            "still accepted after {:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_or_deleted_tenant_is_refused_within_5s_by_serve_and_the_intake() {
    let env = TestEnv::new("tenancy_revoke").await;
    let made = cli(&env, &["tenants", "create", "acme"]).await;
    let key = made["api_key"].as_str().unwrap().to_owned();
    let other = cli(&env, &["tenants", "create", "gone"]).await;
    let other_key = other["api_key"].as_str().unwrap().to_owned();
    let (mut serve_child, base) = serve(&env, "tenancy-revoke-serve");
    let mut intake = env.spawn("intake", &[], "tenancy-revoke-intake");
    common::wait_healthy(&base).await;
    let client = reqwest::Client::new();
    let read_status = |key: String| {
        let request = client
            .get(format!("{base}/v1/extractions/{}", Uuid::now_v7()))
            .header("authorization", bearer(&key));
        async move { request.send().await.unwrap().status() }
    };
    // Both keys work (404: no such job), and are now in serve's cache.
    assert_eq!(read_status(key.clone()).await, StatusCode::NOT_FOUND);
    assert_eq!(read_status(other_key.clone()).await, StatusCode::NOT_FOUND);

    // The intake takes a record signed with the key (and caches it too).
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .create()
        .unwrap();
    let topic = env.topic("extraction.requests");
    let produce = |n: &str, tenant: &str, key: &str| {
        let requested = ExtractionRequested {
            idempotency_key: n.to_owned(),
            request_json: sample_body(0).to_string(),
            requested_at_ms: 0,
        };
        let payload = encode(&requested).unwrap();
        let headers = common::intake_headers(tenant, key);
        let (producer, topic, n) = (producer.clone(), topic.clone(), n.to_owned());
        async move {
            let record = FutureRecord::to(&topic)
                .key(n.as_bytes())
                .payload(&payload)
                .headers(headers);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .unwrap();
        }
    };
    produce("before", "acme", &key).await;
    let jobs = "SELECT count(*) FROM extraction_requests WHERE idempotency_key = 'before'";
    common::wait_count(
        &env.pool,
        "the intake's job",
        jobs,
        1,
        Duration::from_secs(60),
    )
    .await;

    let dlq_unauthorized = || {
        let letters: Vec<DeadLetter> = env
            .read_topic("extraction.dlq")
            .into_iter()
            .map(|(_, value)| decode(&value).unwrap())
            .collect();
        letters
            .iter()
            .filter(|l| l.error_kind == "unauthorized")
            .count()
    };

    // Revoke; serve and the intake are watched at once, each from the
    // revocation on. The intake is sent a record with the key every 200 ms
    // until one is dead-lettered as unauthorized.
    cli(&env, &["keys", "revoke", made["key_id"].as_str().unwrap()]).await;
    let by_serve = time_to_refusal(|| {
        let status = read_status(key.clone());
        async move { status.await == StatusCode::UNAUTHORIZED }
    });
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let by_intake = time_to_refusal(|| {
        let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let produced = produce(&format!("after-{n}"), "acme", &key);
        let refused = dlq_unauthorized() > 0;
        async move {
            produced.await;
            refused
        }
    });
    let (by_serve, by_intake) = tokio::join!(by_serve, by_intake);
    cli(&env, &["tenants", "delete", "gone"]).await;
    let deleted = time_to_refusal(|| {
        let status = read_status(other_key.clone());
        async move { status.await == StatusCode::UNAUTHORIZED }
    })
    .await;

    // Once refused, refused for good; and refused too: a record without
    // headers, and a live key named for another tenant. A live key works.
    let refused_before = dlq_unauthorized();
    produce("after-refusal", "acme", &key).await;
    let live = cli(&env, &["keys", "create", "acme"]).await;
    let live = live["api_key"].as_str().unwrap().to_owned();
    produce("wrong-tenant", "default", &live).await;
    let bare = FutureRecord::to(&topic).key("bare").payload(&[]);
    producer.send(bare, Duration::from_secs(10)).await.unwrap();
    produce("after-live", "acme", &live).await;
    let live_jobs = "SELECT count(*) FROM extraction_requests WHERE idempotency_key = 'after-live'";
    common::wait_count(
        &env.pool,
        "the live key's job",
        live_jobs,
        1,
        Duration::from_secs(60),
    )
    .await;
    common::wait_for("three more dead letters", Duration::from_secs(30), || {
        let n = dlq_unauthorized();
        async move {
            match n >= refused_before + 3 {
                true => Ok(()),
                false => Err(format!("{n} unauthorized")),
            }
        }
    })
    .await;
    common::stop([&mut serve_child, &mut intake]).await;

    let refused_jobs = common::count(
        &env.pool,
        "SELECT count(*) FROM extraction_requests
          WHERE idempotency_key IN ('after-refusal', 'wrong-tenant', 'bare')",
    )
    .await;
    let sent = sent.into_inner();
    eprintln!(
        "tenancy: revoked key refused by serve after {by_serve:?} and by the intake after \
         {by_intake:?} ({sent} records sent meanwhile); deleted tenant's key refused after {deleted:?}"
    );
    assert!(by_serve <= REVOCATION_BOUND, "serve took {by_serve:?}");
    assert!(
        by_intake <= REVOCATION_BOUND,
        "the intake took {by_intake:?}"
    );
    assert!(deleted <= REVOCATION_BOUND, "serve took {deleted:?}");
    assert_eq!(refused_jobs, 0, "a refused record became a job");
    env.cleanup().await;
}
