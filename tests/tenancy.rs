//! Tenants and API keys, against a real `serve` process, the Kafka intake, the
//! CLI and Postgres: every request needs a live key with the route's scope;
//! another tenant's job answers 404 as if it did not exist; idempotency keys
//! are per tenant; a revoked key, or one whose tenant was deleted, is refused
//! within 5 s by a running `serve` and by the intake.

mod common;

use std::collections::{HashMap, HashSet};
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_submit_rate_a_tenant_gets_429_with_retry_after_and_others_do_not() {
    let env = TestEnv::new("tenancy_rate").await;
    let fast = cli(&env, &["tenants", "create", "fast"]).await;
    let other = cli(&env, &["tenants", "create", "other"]).await;
    let set = [
        "tenants",
        "set-quota",
        "fast",
        "--submit-rate-per-s",
        "0.2",
        "--submit-burst",
        "5",
    ];
    let quota = cli(&env, &set).await;
    assert_eq!(
        (
            quota["submit_rate_per_s"].as_f64(),
            quota["submit_burst"].as_i64()
        ),
        (Some(0.2), Some(5))
    );
    let (mut child, base) = serve(&env, "tenancy-rate-serve");
    common::wait_healthy(&base).await;
    let client = reqwest::Client::new();
    let submit = |key: &Value| {
        client
            .post(format!("{base}/v1/extractions"))
            .header("authorization", bearer(key["api_key"].as_str().unwrap()))
            .json(&sample_body(0))
            .send()
    };
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(submit(&fast).await.unwrap().status().as_u16());
    }
    let refused = submit(&fast).await.unwrap();
    assert_eq!(statuses[..5], [202; 5], "the burst");
    assert_eq!(statuses[5], 429, "past the burst at 0.2/s");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_requests");
    assert!((1..=5).contains(&retry_after), "Retry-After {retry_after}");
    // Another tenant is not slowed down.
    for _ in 0..6 {
        assert_eq!(submit(&other).await.unwrap().status(), StatusCode::ACCEPTED);
    }
    // After Retry-After, the tenant may submit again.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(submit(&fast).await.unwrap().status(), StatusCode::ACCEPTED);
    let rows = common::count(&env.pool, "SELECT count(*) FROM extractions").await;
    assert_eq!(rows, 5 + 6 + 1, "a refused submit writes nothing");
    common::stop([&mut child]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_on_open_jobs_holds_exactly_under_fifty_concurrent_submitters() {
    const CAP: usize = 20;
    const SUBMITTERS: usize = 50;
    const EACH: usize = 4;
    let env = TestEnv::new("tenancy_cap").await;
    let capped = cli(&env, &["tenants", "create", "capped"]).await;
    let cap = CAP.to_string();
    let set = [
        "tenants",
        "set-quota",
        "capped",
        "--max-open-jobs",
        &cap,
        "--submit-rate-per-s",
        "0",
    ];
    cli(&env, &set).await;
    let key = capped["api_key"].as_str().unwrap().to_owned();
    // Two serve processes: the cap holds across them. No worker runs, so
    // every accepted job stays queued (open).
    let (mut one, base_one) = serve(&env, "tenancy-cap-serve-1");
    let (mut two, base_two) = serve(&env, "tenancy-cap-serve-2");
    common::wait_healthy(&base_one).await;
    common::wait_healthy(&base_two).await;
    let client = reqwest::Client::new();
    let submitters = (0..SUBMITTERS).map(|i| {
        let base = if i % 2 == 0 { &base_one } else { &base_two };
        let (client, key) = (client.clone(), key.clone());
        let url = format!("{base}/v1/extractions");
        async move {
            let mut statuses = Vec::new();
            for _ in 0..EACH {
                let response = client
                    .post(&url)
                    .header("authorization", bearer(&key))
                    .json(&sample_body(i))
                    .send()
                    .await
                    .unwrap();
                statuses.push(response.status().as_u16());
            }
            statuses
        }
    });
    let statuses: Vec<u16> = futures::future::join_all(submitters)
        .await
        .into_iter()
        .flatten()
        .collect();
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    let open = common::count(
        &env.pool,
        "SELECT count(*) FROM extractions WHERE status IN ('queued', 'running')",
    )
    .await;
    eprintln!(
        "tenancy: cap {CAP}, {SUBMITTERS} concurrent submitters x {EACH} over 2 serve processes: accepted {accepted}, 429 {refused}, open jobs {open}"
    );
    assert_eq!(
        accepted + refused,
        SUBMITTERS * EACH,
        "only 202 and 429: {statuses:?}"
    );
    assert_eq!(accepted, CAP, "exactly the cap was accepted");
    assert_eq!(open as usize, CAP);

    // A finished job makes room for exactly one more.
    let job: Uuid = sqlx::query_scalar("SELECT id FROM extractions LIMIT 1")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    let cancelled = client
        .post(format!("{base_one}/v1/extractions/{job}/cancel"))
        .header("authorization", bearer(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let again = |base: &str| {
        client
            .post(format!("{base}/v1/extractions"))
            .header("authorization", bearer(&key))
            .json(&sample_body(0))
            .send()
    };
    assert_eq!(
        again(&base_two).await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        again(&base_one).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    common::stop([&mut one, &mut two]).await;
}

/// What the generated requests of one tenant expect, as they go.
#[derive(Default)]
struct Model {
    /// Jobs by id: (tenant index, idempotency key, body seed, cancelled).
    jobs: HashMap<Uuid, (usize, Option<String>, usize, bool)>,
    /// (tenant index, idempotency key) -> (job, body seed).
    keys: HashMap<(usize, String), (Uuid, usize)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_generated_requests_of_two_tenants_never_cross() {
    use rand::{Rng, SeedableRng};
    const REQUESTS: usize = 10_000;
    let env = TestEnv::new("tenancy_generated").await;
    let made: Vec<Value> = vec![
        cli(&env, &["tenants", "create", "left"]).await,
        cli(&env, &["tenants", "create", "right"]).await,
    ];
    let keys: Vec<String> = made
        .iter()
        .map(|t| t["api_key"].as_str().unwrap().to_owned())
        .collect();
    let readers: Vec<String> = {
        let mut readers = Vec::new();
        for name in ["left", "right"] {
            let key = cli(&env, &["keys", "create", name, "--scopes", "read"]).await;
            readers.push(key["api_key"].as_str().unwrap().to_owned());
        }
        readers
    };
    for name in ["left", "right"] {
        cli(
            &env,
            &["tenants", "set-quota", name, "--submit-rate-per-s", "0"],
        )
        .await;
    }
    let (mut child, base) = serve(&env, "tenancy-generated-serve");
    common::wait_healthy(&base).await;
    let client = reqwest::Client::new();
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut statuses: HashMap<(&str, u16), usize> = HashMap::new();
    let mut crossings = Vec::new();
    for i in 0..REQUESTS {
        let tenant = rng.gen_range(0..2);
        let other = 1 - tenant;
        let own_ids: Vec<Uuid> = model
            .jobs
            .iter()
            .filter(|(_, j)| j.0 == tenant)
            .map(|(id, _)| *id)
            .collect();
        let their_ids: Vec<Uuid> = model
            .jobs
            .iter()
            .filter(|(_, j)| j.0 == other)
            .map(|(id, _)| *id)
            .collect();
        let pick = |rng: &mut rand::rngs::StdRng, ids: &[Uuid]| {
            ids.get(rng.gen_range(0..ids.len().max(1))).copied()
        };
        let roll = rng.gen_range(0..100);
        let (op, expected, status, body): (&str, u16, u16, Value) = if roll < 35 {
            // Submit, half of them with a key from a small pool both tenants use.
            let key = rng
                .gen_bool(0.5)
                .then(|| format!("k-{}", rng.gen_range(0..40)));
            let seed_body = match &key {
                // A replay of the key sends the first body, now and then another.
                Some(k) => match model.keys.get(&(tenant, k.clone())) {
                    Some((_, first)) if rng.gen_bool(0.9) => *first,
                    _ => rng.gen_range(0..1000),
                },
                None => rng.gen_range(0..1000),
            };
            let mut request = client
                .post(format!("{base}/v1/extractions"))
                .header("authorization", bearer(&keys[tenant]))
                .json(&sample_body(seed_body));
            if let Some(k) = &key {
                request = request.header("idempotency-key", k);
            }
            // The samples repeat, so two seeds may be one body: compare bodies.
            let expected = match key
                .as_ref()
                .and_then(|k| model.keys.get(&(tenant, k.clone())))
            {
                Some((_, first)) if sample_body(*first) != sample_body(seed_body) => 422,
                _ => 202,
            };
            let (status, body) = call(request).await;
            if status == StatusCode::ACCEPTED {
                let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
                match model.jobs.get(&id) {
                    Some(job) if job.0 != tenant => {
                        crossings.push(format!("{i}: submit answered the other tenant's job {id}"))
                    }
                    Some(_) => {
                        let k = key.clone().expect("a new id for a replay without a key");
                        if model.keys.get(&(tenant, k)).map(|(id, _)| *id) != Some(id) {
                            crossings.push(format!("{i}: a replay answered another job"));
                        }
                    }
                    None => {
                        if let Some(k) = &key {
                            if model.keys.contains_key(&(tenant, k.clone())) {
                                crossings.push(format!("{i}: a replay of {k} made a second job"));
                            }
                            model.keys.insert((tenant, k.clone()), (id, seed_body));
                        }
                        model
                            .jobs
                            .insert(id, (tenant, key.clone(), seed_body, false));
                    }
                }
            }
            ("submit", expected, status.as_u16(), body)
        } else if roll < 60 {
            // Read: own, the other's, or an id nobody has; with the full key or the reader.
            let which = rng.gen_range(0..3);
            let id = match which {
                0 => pick(&mut rng, &own_ids),
                1 => pick(&mut rng, &their_ids),
                _ => None,
            }
            .unwrap_or_else(Uuid::now_v7);
            let key = if rng.gen_bool(0.5) {
                &keys[tenant]
            } else {
                &readers[tenant]
            };
            let (status, body) = call(
                client
                    .get(format!("{base}/v1/extractions/{id}"))
                    .header("authorization", bearer(key)),
            )
            .await;
            let mine = model.jobs.get(&id).is_some_and(|j| j.0 == tenant);
            if status == StatusCode::OK && !mine {
                crossings.push(format!("{i}: read another tenant's job {id}"));
            }
            ("read", if mine { 200 } else { 404 }, status.as_u16(), body)
        } else if roll < 80 {
            // Cancel: own, the other's, or nobody's.
            let id = match rng.gen_range(0..3) {
                0 => pick(&mut rng, &own_ids),
                1 => pick(&mut rng, &their_ids),
                _ => None,
            }
            .unwrap_or_else(Uuid::now_v7);
            let (status, body) = call(
                client
                    .post(format!("{base}/v1/extractions/{id}/cancel"))
                    .header("authorization", bearer(&keys[tenant])),
            )
            .await;
            let expected = match model.jobs.get_mut(&id) {
                Some(job) if job.0 == tenant && !job.3 => {
                    job.3 = status == StatusCode::OK;
                    200
                }
                Some(job) if job.0 == tenant => 409,
                _ => 404,
            };
            if status == StatusCode::OK && expected == 404 {
                crossings.push(format!("{i}: cancelled another tenant's job {id}"));
            }
            ("cancel", expected, status.as_u16(), body)
        } else if roll < 90 {
            // Refused callers: no key, a key without the scope, a key that is not one.
            let (request, expected) = match rng.gen_range(0..3) {
                0 => (
                    client
                        .post(format!("{base}/v1/extractions"))
                        .json(&sample_body(0)),
                    401,
                ),
                1 => (
                    client
                        .post(format!("{base}/v1/extractions"))
                        .header("authorization", bearer(&readers[tenant]))
                        .json(&sample_body(0)),
                    403,
                ),
                _ => (
                    client
                        .get(format!("{base}/v1/extractions/{}", Uuid::now_v7()))
                        .header("authorization", bearer(&format!("dsk_{}", "f".repeat(64)))),
                    401,
                ),
            };
            let (status, body) = call(request).await;
            ("refused caller", expected, status.as_u16(), body)
        } else {
            // Bad input from a good caller: malformed JSON, a bad id.
            let (request, expected) = match rng.gen_range(0..2) {
                0 => (
                    client
                        .post(format!("{base}/v1/extractions"))
                        .header("authorization", bearer(&keys[tenant]))
                        .header("content-type", "application/json")
                        .body("{\"document\":"),
                    400,
                ),
                _ => (
                    client
                        .get(format!("{base}/v1/extractions/not-an-id"))
                        .header("authorization", bearer(&keys[tenant])),
                    400,
                ),
            };
            let (status, body) = call(request).await;
            ("bad input", expected, status.as_u16(), body)
        };
        if status != expected {
            crossings.push(format!(
                "{i}: {op} answered {status}, expected {expected}: {body}"
            ));
        }
        *statuses.entry((op, status)).or_default() += 1;
    }

    // The export streams: one group name in both tenants; each sees only its
    // own jobs' events, all of them.
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let mut leaks = 0;
    let mut seen_per_tenant = Vec::new();
    for (tenant, key) in keys.iter().enumerate() {
        let url = format!("ws://127.0.0.1:{port}/v1/export?group=same&ack=auto&from=earliest");
        let (mut socket, _) = tokio_tungstenite::connect_async(common::ws_request(&url, key))
            .await
            .unwrap();
        let own: HashSet<Uuid> = model
            .jobs
            .iter()
            .filter(|(_, j)| j.0 == tenant)
            .map(|(id, _)| *id)
            .collect();
        let mut seen = HashSet::new();
        use futures::StreamExt;
        while seen.len() < own.len() {
            let next = tokio::time::timeout(Duration::from_secs(10), socket.next()).await;
            let Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text)))) = next else {
                break;
            };
            let frame: Value = serde_json::from_str(&text).unwrap();
            let id: Uuid = frame["event"]["extraction_id"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            if !own.contains(&id) {
                leaks += 1;
            }
            seen.insert(id);
        }
        assert_eq!(
            seen, own,
            "tenant {tenant}'s stream saw its own jobs' events"
        );
        seen_per_tenant.push(seen.len());
        let _ = socket.close(None).await;
    }
    common::stop([&mut child]).await;
    let mut summary: Vec<_> = statuses.iter().collect();
    summary.sort();
    eprintln!(
        "tenancy generated: seed {seed}, {REQUESTS} requests, jobs {} ({} keyed), answers by (operation, status): {summary:?}; export events seen per tenant {seen_per_tenant:?}, from the other tenant {leaks}; mismatches {}",
        model.jobs.len(),
        model.keys.len(),
        crossings.len()
    );
    assert!(
        crossings.is_empty(),
        "seed {seed}: {:?}",
        &crossings[..crossings.len().min(10)]
    );
    assert_eq!(leaks, 0, "events crossed tenants");
}
