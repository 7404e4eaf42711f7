//! Tenants and API keys, against a real `serve` process, the Kafka intake, the
//! CLI and Postgres: every request needs a live key with the route's scope;
//! another tenant's job answers 404 as if it did not exist; idempotency keys
//! are per tenant; a revoked key, or one whose tenant was deleted, is refused
//! within 5 s by a running `serve` and by the intake.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{free_port, sample_body, TestEnv};
use docstream::events::{decode, encode, DeadLetter, ExtractionRequested};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{json, Value};
use tokio::process::Child;
use uuid::Uuid;

/// The longest a revocation may take to be seen, as promised.
const REVOCATION_BOUND: Duration = Duration::from_secs(5);

/// Runs `docstream ARGS` on the test's database; its JSON output.
async fn cli(env: &TestEnv, args: &[&str]) -> Value {
    let output = env.run_cli(args).await;
    assert!(
        output.status.success(),
        "docstream {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

/// Deleting a tenant with `--purge` cancels its queued jobs through the
/// lifecycle, as a client's cancel does: each one's `mark_cancelled` is one
/// transition and one `ExtractionEvent` on `extraction.events`, before the
/// purge takes every row. Another tenant's jobs are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_tenants_queued_jobs_are_cancelled_with_their_events() {
    let env = TestEnv::new("tenancy_purge").await;
    let services = env.services().await;
    let doomed = cli(&env, &["tenants", "create", "doomed"]).await;
    let doomed_id = Uuid::parse_str(doomed["tenant_id"].as_str().unwrap()).unwrap();
    let kept = cli(&env, &["tenants", "create", "kept"]).await;
    let kept_id = Uuid::parse_str(kept["tenant_id"].as_str().unwrap()).unwrap();
    // No worker runs: every job stays queued.
    let purged = common::submit_as(&services, doomed_id, 12, sample_body).await;
    let left = common::submit_as(&services, kept_id, 3, sample_body).await;
    services.publisher.flush(Duration::from_secs(10)).unwrap();

    let deleted = cli(&env, &["tenants", "delete", "doomed", "--purge"]).await;
    assert_eq!(deleted["purged_jobs"], 12, "{deleted}");

    let events = env.topic(&env.settings.topic_events);
    let cancels: Vec<Uuid> = common::read_topic(&env.settings.kafka_brokers, &events)
        .into_iter()
        .map(|(_, payload)| decode::<docstream::events::ExtractionEvent>(&payload).unwrap())
        .filter(|event| event.transition == "mark_cancelled")
        .map(|event| Uuid::parse_str(&event.extraction_id).unwrap())
        .collect();
    let mut expected = purged.clone();
    expected.sort();
    let mut got = cancels.clone();
    got.sort();
    assert_eq!(
        got, expected,
        "one mark_cancelled event per purged job, and no other"
    );
    let pool = &services.pool;
    let rows = common::count(
        pool,
        &format!("SELECT count(*) FROM extractions WHERE tenant_id = '{doomed_id}'"),
    )
    .await;
    assert_eq!(rows, 0, "the purge left rows behind");
    let queued = common::count(
        pool,
        &format!(
            "SELECT count(*) FROM extractions WHERE tenant_id = '{kept_id}' AND status = 'queued'"
        ),
    )
    .await;
    assert_eq!(
        queued,
        left.len() as i64,
        "another tenant's jobs were touched"
    );
}

/// A `serve` process on a free port; its base URL.
fn serve(env: &TestEnv, log: &str) -> (tokio::process::Child, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = env.spawn("serve", &[("DOCSTREAM_HTTP_ADDR", addr.clone())], log);
    (child, format!("http://{addr}"))
}

/// Sends `request`; its status and JSON body (null when it has none).
async fn call(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("an answer");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The `authorization` header value for API key `key`.
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
    let mut t = tenants_a_and_b_with_full_keys_and_a_read_key_of_a().await;
    callers_without_a_live_key_get_401_with_a_challenge(&t).await;
    a_key_without_the_scope_gets_403_and_nothing_is_written(&t).await;
    let made = a_submits_with_idempotency_key_order_1(&t).await;
    let id = made["id"].as_str().unwrap().to_owned();
    a_reads_its_job_and_b_gets_404_as_for_no_job(&t, &id).await;
    let b_made = the_same_idempotency_key_is_a_job_of_each_tenant(&t, &made).await;
    each_job_belongs_to_the_tenant_that_submitted_it(&t, &id, &b_made).await;
    a_cancels_its_own_job(&t, &id).await;
    metrics_are_not_on_the_api_port(&t).await;
    common::stop([&mut t.child]).await;
}

/// Tenants A and B with their full keys, a read-only key of A, and a `serve`.
struct TwoTenants {
    api: Api,
    child: Child,
    /// What creating tenant A printed.
    a: Value,
    /// What creating tenant B printed.
    b: Value,
    a_key: String,
    b_key: String,
    /// A's key with only the `read` scope.
    reader: String,
    env: TestEnv,
}

impl TwoTenants {
    /// A submission of sample 0, with `key` if there is one.
    fn submit(&self, key: Option<&str>) -> RequestBuilder {
        self.api.post("/v1/extractions", key).json(&sample_body(0))
    }

    /// A read of job `id` with `key`.
    fn read(&self, id: &str, key: &str) -> RequestBuilder {
        self.api.get(&format!("/v1/extractions/{id}"), key)
    }

    /// A cancel of job `id` with `key`.
    fn cancel(&self, id: &str, key: &str) -> RequestBuilder {
        self.api
            .post(&format!("/v1/extractions/{id}/cancel"), Some(key))
    }
}

/// `serve`'s API: requests to a path under its base URL, with a key.
struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    /// A POST to `path` with `key`, if any.
    fn post(&self, path: &str, key: Option<&str>) -> RequestBuilder {
        let request = self.client.post(format!("{}{path}", self.base));
        match key {
            Some(key) => request.header("authorization", bearer(key)),
            None => request,
        }
    }

    /// A GET of `path` with `key`.
    fn get(&self, path: &str, key: &str) -> RequestBuilder {
        self.client
            .get(format!("{}{path}", self.base))
            .header("authorization", bearer(key))
    }
}

/// Creates tenants A and B and a read-only key of A, and starts `serve`.
async fn tenants_a_and_b_with_full_keys_and_a_read_key_of_a() -> TwoTenants {
    let env = TestEnv::new("tenancy_api").await;
    let a = cli(&env, &["tenants", "create", "a"]).await;
    let b = cli(&env, &["tenants", "create", "b"]).await;
    let (a_key, b_key) = (
        a["api_key"].as_str().unwrap().to_owned(),
        b["api_key"].as_str().unwrap().to_owned(),
    );
    let reader = cli(&env, &["keys", "create", "a", "--scopes", "read"]).await;
    let reader = reader["api_key"].as_str().unwrap().to_owned();
    let (child, base) = serve(&env, "tenancy-api-serve");
    common::wait_healthy(&base).await;
    let api = Api {
        client: common::http_client(),
        base,
    };
    TwoTenants {
        api,
        child,
        a,
        b,
        a_key,
        b_key,
        reader,
        env,
    }
}

/// No key, a malformed header, an unknown key: 401 with a challenge, nothing written.
async fn callers_without_a_live_key_get_401_with_a_challenge(t: &TwoTenants) {
    let unknown = format!("dsk_{}", "0".repeat(64));
    for request in [
        t.submit(None),
        t.submit(None).header("authorization", "Basic YTpi"),
        t.submit(Some(&unknown)),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
    }
}

/// A key without the scope: 403; and no job was written by any refusal.
async fn a_key_without_the_scope_gets_403_and_nothing_is_written(t: &TwoTenants) {
    let (status, body) = call(t.submit(Some(&t.reader))).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    assert_eq!(
        common::count(&t.env.pool, "SELECT count(*) FROM extractions").await,
        0
    );
}

/// A submits with idempotency key `order-1`, accepted; the answer.
async fn a_submits_with_idempotency_key_order_1(t: &TwoTenants) -> Value {
    let (status, made) = call(
        t.submit(Some(&t.a_key))
            .header("idempotency-key", "order-1"),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{made}");
    made
}

/// A's job: A reads it; B gets 404 on read and cancel, as for no job at all;
/// A's read-only key reads it but may not cancel it.
async fn a_reads_its_job_and_b_gets_404_as_for_no_job(t: &TwoTenants, id: &str) {
    assert_eq!(call(t.read(id, &t.a_key)).await.0, StatusCode::OK);
    assert_eq!(call(t.read(id, &t.reader)).await.0, StatusCode::OK);
    let (status, body) = call(t.read(id, &t.b_key)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(call(t.cancel(id, &t.b_key)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(call(t.cancel(id, &t.reader)).await.0, StatusCode::FORBIDDEN);
}

/// The same idempotency key in B is B's own job; in A it is A's again. B's answer.
async fn the_same_idempotency_key_is_a_job_of_each_tenant(t: &TwoTenants, made: &Value) -> Value {
    let (_, b_made) = call(
        t.submit(Some(&t.b_key))
            .header("idempotency-key", "order-1"),
    )
    .await;
    assert_ne!(b_made["id"], made["id"], "B was given A's job");
    let (_, replayed) = call(
        t.submit(Some(&t.a_key))
            .header("idempotency-key", "order-1"),
    )
    .await;
    assert_eq!(replayed["id"], made["id"]);
    b_made
}

/// In Postgres, exactly two jobs: A's job `id` is A's, B's (`b_made`) is B's.
async fn each_job_belongs_to_the_tenant_that_submitted_it(
    t: &TwoTenants,
    id: &str,
    b_made: &Value,
) {
    let owners: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, tenant_id FROM extraction_requests ORDER BY id")
            .fetch_all(&t.env.pool)
            .await
            .unwrap();
    let tenant_of = |t: &Value| Uuid::parse_str(t["tenant_id"].as_str().unwrap()).unwrap();
    let expected: HashSet<(Uuid, Uuid)> = HashSet::from([
        (Uuid::parse_str(id).unwrap(), tenant_of(&t.a)),
        (
            Uuid::parse_str(b_made["id"].as_str().unwrap()).unwrap(),
            tenant_of(&t.b),
        ),
    ]);
    assert_eq!(owners.into_iter().collect::<HashSet<_>>(), expected);
}

/// A cancels its own job.
async fn a_cancels_its_own_job(t: &TwoTenants, id: &str) {
    assert_eq!(call(t.cancel(id, &t.a_key)).await.0, StatusCode::OK);
}

/// /metrics is not on the API port, with or without a key.
async fn metrics_are_not_on_the_api_port(t: &TwoTenants) {
    let metrics = t.api.get("/metrics", &t.a_key).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::NOT_FOUND);
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
    let mut s = acme_and_gone_with_serve_and_the_intake_running().await;
    both_keys_work_and_are_in_serves_cache(&s).await;
    let records = IntakeRecords::connect(&s.env);
    the_intake_takes_a_record_signed_with_the_key(&s, &records).await;
    let revoked = revoke_the_key_and_time_its_refusal(&s, &records).await;
    let deleted = delete_gone_and_time_its_keys_refusal(&s).await;
    let refused_before = unauthorized_dead_letters(&s.env);
    send_refusable_records_then_one_with_a_live_key(&s, &records).await;
    the_live_keys_job_and_three_more_dead_letters_arrive(&s.env, refused_before).await;
    common::stop([&mut s.serve, &mut s.intake]).await;
    let refused_jobs = jobs_of_refused_records(&s.env).await;
    each_refusal_came_within_the_bound_and_none_made_a_job(&revoked, deleted, refused_jobs);
}

/// A key lookup whose requests all went away (an HTTP/2 stream reset, the
/// answer bound passing while Postgres is slow) still ends and gives its
/// connection back. Here the process's pool has one connection, the keys
/// table is locked, and the one request waiting for the lookup gives up
/// after 100 ms; once the lock is released, the pool's connection is free
/// again within a second. A lookup driven only by its waiters was never
/// polled again, and held the connection for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_lookup_nobody_waits_for_still_ends_and_frees_its_connection() {
    let env = TestEnv::new("tenancy_abandoned_lookup").await;
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&env.settings.database_url)
        .await
        .unwrap();
    let auth = docstream::auth::Authenticator::new(
        one.clone(),
        Duration::from_secs(2),
        Duration::from_secs(30),
    );
    let mut lock = env.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let waiting = tokio::time::timeout(
        Duration::from_millis(100),
        auth.authenticate(Some(&env.api_key)),
    );
    assert!(waiting.await.is_err(), "the lookup waits for the lock");
    lock.rollback().await.unwrap();
    let released = Instant::now();
    let freed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Ok(connection) = one.acquire().await {
                return connection;
            }
        }
    })
    .await;
    assert!(
        freed.is_ok(),
        "the lookup still holds the pool's one connection"
    );
    println!(
        "tenancy: the abandoned lookup gave its connection back {:?} after the lock was released",
        released.elapsed()
    );
    drop(freed);
    let caller = auth.authenticate(Some(&env.api_key)).await.unwrap();
    assert_eq!(caller.tenant, "default");
}

/// Made-up keys from one address (a client guessing, or flooding the store
/// with lookups): at 10/s with ten seconds' worth at once, the first 100 get
/// 401, then 429 with `Retry-After`, before any lookup; the key of a client
/// that is working, known to the process, is still served from the same
/// address. Before the limit, all 300 were 401s, each a lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_keys_from_one_address_are_throttled_and_a_known_key_still_works() {
    let env = TestEnv::new("tenancy_throttle").await;
    let made = cli(&env, &["tenants", "create", "acme"]).await;
    let key = made["api_key"].as_str().unwrap().to_owned();
    let (mut child, base) = serve(&env, "tenancy-throttle-serve");
    common::wait_healthy(&base).await;
    let client = common::http_client();
    let read = |key: String| {
        let url = format!("{base}/v1/extractions/{}", Uuid::now_v7());
        client.get(url).header("authorization", bearer(&key)).send()
    };
    assert_eq!(
        read(key.clone()).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );

    let mut rng = StdRng::seed_from_u64(7);
    let started = Instant::now();
    let mut answers: HashMap<u16, usize> = HashMap::new();
    let mut retry_after = None;
    for _ in 0..300 {
        let made_up: String = (0..64)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap())
            .collect();
        let answer = read(format!("dsk_{made_up}")).await.unwrap();
        if answer.status() == StatusCode::TOO_MANY_REQUESTS {
            retry_after = answer.headers().get("retry-after").cloned();
        }
        *answers.entry(answer.status().as_u16()).or_default() += 1;
    }
    let took = started.elapsed().as_secs_f64();
    let known = read(key).await.unwrap().status();
    common::stop([&mut child]).await;
    println!("tenancy: 300 made-up keys in {took:.2}s: {answers:?}; the known key: {known}");
    let (refused, throttled) = (answers[&401], answers.get(&429).copied().unwrap_or(0));
    assert_eq!(refused + throttled, 300, "{answers:?}");
    let allowed = 100 + (10.0 * took).ceil() as usize + 1;
    assert!(
        (100..=allowed).contains(&refused),
        "{refused} made-up keys looked up"
    );
    assert!(retry_after.is_some(), "429 says when to retry");
    assert_eq!(known, StatusCode::NOT_FOUND, "the known key is served");
}

/// How soon another tenant's intake record must become a job while one
/// tenant is at its cap.
const HELD_BOUND: Duration = Duration::from_secs(10);

/// Tenant `capped` (cap 1; no workers run, so its first job stays queued)
/// sends 400 records to the intake, then tenant `other` one. `other`'s record
/// becomes a job within [`HELD_BOUND`], and `capped`'s 399 others are held.
/// Once `capped`'s cap is lifted, each of its 400 keys is exactly one job and
/// nothing stays held. The intake's in-flight window is 64 here, so records
/// retried in place (the old way) would fill it and pause every partition
/// for certain: `other`'s record would never have been read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_cap_does_not_hold_up_another_tenants_intake_records() {
    let env = TestEnv::new("tenancy_held").await;
    let capped = cli(&env, &["tenants", "create", "capped"]).await;
    let capped_key = capped["api_key"].as_str().unwrap().to_owned();
    let other = cli(&env, &["tenants", "create", "other"]).await;
    let other_key = other["api_key"].as_str().unwrap().to_owned();
    let set_cap = |cap: &'static str| ["tenants", "set-quota", "capped", "--max-open-jobs", cap];
    cli(&env, &set_cap("1")).await;
    let window = [("DOCSTREAM_CONSUMER_MAX_IN_FLIGHT", "64".to_owned())];
    let mut intake = env.spawn("intake", &window, "tenancy-held-intake");
    let records = IntakeRecords::connect(&env);
    let sends = (0..400).map(|n| records.produce(&format!("a-{n}"), "capped", &capped_key));
    futures::future::join_all(sends).await;
    let sent = Instant::now();
    records.produce("b-0", "other", &other_key).await;

    let pool = &env.pool;
    let jobs_of = |prefix: &str| {
        format!("SELECT count(*) FROM extraction_requests WHERE idempotency_key LIKE '{prefix}%'")
    };
    common::wait_count(pool, "other's job", &jobs_of("b-"), 1, HELD_BOUND).await;
    let waited = sent.elapsed();
    let held = "SELECT count(*) FROM intake_held";
    common::wait_count(pool, "capped's held requests", held, 399, HELD_BOUND).await;
    let count = |sql: String| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert_eq!(count(jobs_of("a-")).await, 1, "capped's cap held");
    assert_eq!(count(held.to_owned()).await, 399);

    cli(&env, &set_cap("0")).await;
    // What is bounded is `other`'s wait, above; the release's pace is the
    // releaser's, one submit at a time (about 30 a second on a loaded
    // machine, where 10 s fell short in two runs).
    common::wait_count(
        pool,
        "capped's released jobs",
        &jobs_of("a-"),
        400,
        Duration::from_secs(60),
    )
    .await;
    common::stop([&mut intake]).await;
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT idempotency_key FROM extraction_requests WHERE idempotency_key LIKE 'a-%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let distinct: HashSet<&String> = keys.iter().collect();
    let expected: HashSet<String> = (0..400).map(|n| format!("a-{n}")).collect();
    assert_eq!((keys.len(), distinct.len()), (400, 400), "one job per key");
    assert_eq!(distinct, expected.iter().collect());
    assert_eq!(count(held.to_owned()).await, 0, "nothing stays held");
    println!(
        "tenancy: other tenant's record was a job {waited:?} after it was sent, behind 399 held"
    );
}

/// Tenants acme and gone with their keys, and `serve` and the intake running.
struct Revocation {
    client: reqwest::Client,
    intake: Child,
    serve: Child,
    base: String,
    /// What creating acme printed (its key's id).
    made: Value,
    /// acme's key, to be revoked.
    key: String,
    /// gone's key, whose tenant is to be deleted.
    other_key: String,
    env: TestEnv,
}

impl Revocation {
    /// The status of reading a job nobody has with `key`: 404 while it is
    /// live. The request is made now, sent when awaited.
    fn read_status(&self, key: &str) -> impl Future<Output = StatusCode> {
        let request = self
            .client
            .get(format!("{}/v1/extractions/{}", self.base, Uuid::now_v7()))
            .header("authorization", bearer(key));
        async move { request.send().await.unwrap().status() }
    }

    /// Whether `serve` refuses `key` (401) on a read.
    fn serve_refuses(&self, key: &str) -> impl Future<Output = bool> {
        let status = self.read_status(key);
        async move { status.await == StatusCode::UNAUTHORIZED }
    }
}

/// Creates tenants acme and gone, and starts `serve` and the intake.
async fn acme_and_gone_with_serve_and_the_intake_running() -> Revocation {
    let env = TestEnv::new("tenancy_revoke").await;
    let made = cli(&env, &["tenants", "create", "acme"]).await;
    let key = made["api_key"].as_str().unwrap().to_owned();
    let other = cli(&env, &["tenants", "create", "gone"]).await;
    let other_key = other["api_key"].as_str().unwrap().to_owned();
    let (serve_child, base) = serve(&env, "tenancy-revoke-serve");
    let intake = env.spawn("intake", &[], "tenancy-revoke-intake");
    common::wait_healthy(&base).await;
    let client = common::http_client();
    Revocation {
        client,
        intake,
        serve: serve_child,
        base,
        made,
        key,
        other_key,
        env,
    }
}

/// Both keys work (404: no such job), and are now in serve's cache.
async fn both_keys_work_and_are_in_serves_cache(s: &Revocation) {
    assert_eq!(s.read_status(&s.key).await, StatusCode::NOT_FOUND);
    assert_eq!(s.read_status(&s.other_key).await, StatusCode::NOT_FOUND);
}

/// A producer of records on the test's intake topic.
struct IntakeRecords {
    producer: FutureProducer,
    topic: String,
}

impl IntakeRecords {
    /// A producer on the test's Kafka, for its `extraction.requests` topic.
    fn connect(env: &TestEnv) -> Self {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &env.settings.kafka_brokers)
            .create()
            .unwrap();
        let topic = env.topic("extraction.requests");
        IntakeRecords { producer, topic }
    }

    /// Sends sample request 0 with idempotency key (and record key) `n`, its
    /// headers naming `tenant` and `key`. The record is made now, sent when awaited.
    fn produce(&self, n: &str, tenant: &str, key: &str) -> impl Future<Output = ()> {
        let requested = ExtractionRequested {
            idempotency_key: n.to_owned(),
            request_json: sample_body(0).to_string(),
            requested_at_ms: 0,
        };
        let payload = encode(&requested).unwrap();
        let headers = common::intake_headers(tenant, key);
        let (producer, topic, n) = (self.producer.clone(), self.topic.clone(), n.to_owned());
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
    }

    /// Sends a record keyed `bare` with no headers and an empty value.
    async fn produce_bare(&self) {
        let bare = FutureRecord::to(&self.topic).key("bare").payload(&[]);
        self.producer
            .send(bare, Duration::from_secs(10))
            .await
            .unwrap();
    }
}

/// The intake takes a record signed with the key (and caches it too).
async fn the_intake_takes_a_record_signed_with_the_key(s: &Revocation, records: &IntakeRecords) {
    records.produce("before", "acme", &s.key).await;
    let jobs = "SELECT count(*) FROM extraction_requests WHERE idempotency_key = 'before'";
    common::wait_count(
        &s.env.pool,
        "the intake's job",
        jobs,
        1,
        Duration::from_secs(60),
    )
    .await;
}

/// How many dead letters on `extraction.dlq` are for unauthorized records.
fn unauthorized_dead_letters(env: &TestEnv) -> usize {
    let letters: Vec<DeadLetter> = env
        .read_topic("extraction.dlq")
        .into_iter()
        .map(|(_, value)| decode(&value).unwrap())
        .collect();
    letters
        .iter()
        .filter(|l| l.error_kind == "unauthorized")
        .count()
}

/// How long serve and the intake took to refuse the revoked key, and how
/// many records were sent to the intake meanwhile.
struct Revoked {
    by_serve: Duration,
    by_intake: Duration,
    sent: usize,
}

/// Revokes acme's key; serve and the intake are watched at once, each from
/// the revocation on. The intake is sent a record with the key every 200 ms
/// until one is dead-lettered as unauthorized.
async fn revoke_the_key_and_time_its_refusal(s: &Revocation, records: &IntakeRecords) -> Revoked {
    cli(
        &s.env,
        &["keys", "revoke", s.made["key_id"].as_str().unwrap()],
    )
    .await;
    let by_serve = time_to_refusal(|| s.serve_refuses(&s.key));
    let sent = AtomicUsize::new(0);
    let by_intake = time_to_refusal(|| {
        let n = sent.fetch_add(1, Ordering::Relaxed);
        let produced = records.produce(&format!("after-{n}"), "acme", &s.key);
        let refused = unauthorized_dead_letters(&s.env) > 0;
        async move {
            produced.await;
            refused
        }
    });
    let (by_serve, by_intake) = tokio::join!(by_serve, by_intake);
    Revoked {
        by_serve,
        by_intake,
        sent: sent.into_inner(),
    }
}

/// Deletes tenant gone; how long serve took to refuse its key.
async fn delete_gone_and_time_its_keys_refusal(s: &Revocation) -> Duration {
    cli(&s.env, &["tenants", "delete", "gone"]).await;
    time_to_refusal(|| s.serve_refuses(&s.other_key)).await
}

/// Once refused, refused for good; and refused too: a record without
/// headers, and a live key named for another tenant. Then a live key's record.
async fn send_refusable_records_then_one_with_a_live_key(s: &Revocation, records: &IntakeRecords) {
    records.produce("after-refusal", "acme", &s.key).await;
    let live = cli(&s.env, &["keys", "create", "acme"]).await;
    let live = live["api_key"].as_str().unwrap().to_owned();
    records.produce("wrong-tenant", "default", &live).await;
    records.produce_bare().await;
    records.produce("after-live", "acme", &live).await;
}

/// A live key works: its job is made; the three refusable records are
/// dead-lettered as unauthorized (past `refused_before`).
async fn the_live_keys_job_and_three_more_dead_letters_arrive(
    env: &TestEnv,
    refused_before: usize,
) {
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
        let n = unauthorized_dead_letters(env);
        async move {
            match n >= refused_before + 3 {
                true => Ok(()),
                false => Err(format!("{n} unauthorized")),
            }
        }
    })
    .await;
}

/// How many jobs the refused records made (none should have).
async fn jobs_of_refused_records(env: &TestEnv) -> i64 {
    common::count(
        &env.pool,
        "SELECT count(*) FROM extraction_requests
          WHERE idempotency_key IN ('after-refusal', 'wrong-tenant', 'bare')",
    )
    .await
}

/// Reports the refusal times; each is within the bound, and no refused
/// record became a job.
fn each_refusal_came_within_the_bound_and_none_made_a_job(
    revoked: &Revoked,
    deleted: Duration,
    refused_jobs: i64,
) {
    let Revoked {
        by_serve,
        by_intake,
        sent,
    } = revoked;
    eprintln!(
        "tenancy: revoked key refused by serve after {by_serve:?} and by the intake after \
         {by_intake:?} ({sent} records sent meanwhile); deleted tenant's key refused after {deleted:?}"
    );
    assert!(*by_serve <= REVOCATION_BOUND, "serve took {by_serve:?}");
    assert!(
        *by_intake <= REVOCATION_BOUND,
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
    let client = common::http_client();
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

/// The open-jobs cap of the capped tenant.
const CAP: usize = 20;
/// How many submitters submit at once.
const SUBMITTERS: usize = 50;
/// How many submissions each submitter makes, one after another.
const EACH: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_on_open_jobs_holds_exactly_under_fifty_concurrent_submitters() {
    let mut c = a_capped_tenant_on_two_serve_processes_and_no_worker().await;
    let statuses = fifty_submitters_submit_at_once_over_both_processes(&c).await;
    exactly_the_cap_was_accepted_and_is_open(&c, &statuses).await;
    a_finished_job_makes_room_for_exactly_one_more(&c).await;
    common::stop([&mut c.one, &mut c.two]).await;
}

/// Tenant capped at [`CAP`] open jobs, and two `serve` processes on it.
struct Capped {
    client: reqwest::Client,
    two: Child,
    base_two: String,
    one: Child,
    base_one: String,
    /// capped's key.
    key: String,
    env: TestEnv,
}

/// Creates tenant capped, at [`CAP`] open jobs and no submit rate limit, and
/// starts two serve processes: the cap holds across them. No worker runs, so
/// every accepted job stays queued (open).
async fn a_capped_tenant_on_two_serve_processes_and_no_worker() -> Capped {
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
    let (one, base_one) = serve(&env, "tenancy-cap-serve-1");
    let (two, base_two) = serve(&env, "tenancy-cap-serve-2");
    common::wait_healthy(&base_one).await;
    common::wait_healthy(&base_two).await;
    let client = common::http_client();
    Capped {
        client,
        two,
        base_two,
        one,
        base_one,
        key,
        env,
    }
}

/// [`SUBMITTERS`] submitters at once, alternately on either process, each
/// submitting [`EACH`] times in turn; the statuses of all their answers.
async fn fifty_submitters_submit_at_once_over_both_processes(c: &Capped) -> Vec<u16> {
    let submitters = (0..SUBMITTERS).map(|i| {
        let base = if i % 2 == 0 { &c.base_one } else { &c.base_two };
        let (client, key) = (c.client.clone(), c.key.clone());
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
    futures::future::join_all(submitters)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Every answer was 202 or 429, exactly [`CAP`] were 202, and [`CAP`] jobs are open.
async fn exactly_the_cap_was_accepted_and_is_open(c: &Capped, statuses: &[u16]) {
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    let open = common::count(
        &c.env.pool,
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
}

/// A finished (cancelled) job makes room for exactly one more: accepted by
/// the second process, then 429 again on the first.
async fn a_finished_job_makes_room_for_exactly_one_more(c: &Capped) {
    let job: Uuid = sqlx::query_scalar("SELECT id FROM extractions LIMIT 1")
        .fetch_one(&c.env.pool)
        .await
        .unwrap();
    let cancelled = c
        .client
        .post(format!("{}/v1/extractions/{job}/cancel", c.base_one))
        .header("authorization", bearer(&c.key))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let again = |base: &str| {
        c.client
            .post(format!("{base}/v1/extractions"))
            .header("authorization", bearer(&c.key))
            .json(&sample_body(0))
            .send()
    };
    assert_eq!(
        again(&c.base_two).await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        again(&c.base_one).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// How many requests the generated test sends.
const GENERATED_REQUESTS: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_generated_requests_of_two_tenants_never_cross() {
    let mut given = left_and_right_with_full_and_read_keys_and_no_submit_rate().await;
    // A failed run prints its seed; DOCSTREAM_TENANCY_SEED repeats it.
    let seed = std::env::var("DOCSTREAM_TENANCY_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut run = Run::seeded(seed.unwrap_or_else(rand::random));
    run.send_generated_requests(&given.callers).await;
    let exported = each_export_stream_saw_all_its_own_jobs(&given.callers, &run.model).await;
    common::stop([&mut given.child]).await;
    run.report(&exported);
    run.no_answer_crossed_tenants();
    no_event_crossed_tenants(&exported);
}

/// What the generated requests of one tenant expect, as they go.
#[derive(Default)]
struct Model {
    /// Jobs by id: (tenant index, idempotency key, body seed, cancelled).
    jobs: HashMap<Uuid, (usize, Option<String>, usize, bool)>,
    /// (tenant index, idempotency key) -> (job, body seed).
    keys: HashMap<(usize, String), (Uuid, usize)>,
    /// Jobs whose content was erased.
    erased: HashSet<Uuid>,
}

impl Model {
    /// The ids of tenant `tenant`'s jobs, in the map's order.
    fn ids_of(&self, tenant: usize) -> Vec<Uuid> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.0 == tenant)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The status a submission of body `seed_body` under `key` must get: 410
    /// for the key of an erased job, 422 for a replay of the key with
    /// another body, else 202. The samples
    /// repeat, so two seeds may be one body: compare bodies.
    fn expected_submit(&self, tenant: usize, key: Option<&String>, seed_body: usize) -> u16 {
        match key.and_then(|k| self.keys.get(&(tenant, k.clone()))) {
            Some((job, _)) if self.erased.contains(job) => 410,
            Some((_, first)) if sample_body(*first) != sample_body(seed_body) => 422,
            _ => 202,
        }
    }
}

/// Tenants left and right (indexes 0 and 1) with no submit rate limit, and a `serve`.
struct Generated {
    child: Child,
    callers: Callers,
    /// Held to the end: dropping it cleans up the test's database and topics.
    _env: TestEnv,
}

/// Where the generated requests go, and each tenant's keys.
struct Callers {
    api: Api,
    /// Each tenant's full key, by tenant index.
    keys: Vec<String>,
    /// Each tenant's read-only key, by tenant index.
    readers: Vec<String>,
}

impl Callers {
    /// A submission of sample `seed_body` by `tenant`, with idempotency key `key` if any.
    fn submission(&self, tenant: usize, key: Option<&String>, seed_body: usize) -> RequestBuilder {
        let mut request = self
            .api
            .post("/v1/extractions", Some(&self.keys[tenant]))
            .json(&sample_body(seed_body));
        if let Some(k) = key {
            request = request.header("idempotency-key", k);
        }
        request
    }
}

/// Creates tenants left and right, each with a full and a read-only key and
/// no submit rate limit, and starts `serve`.
async fn left_and_right_with_full_and_read_keys_and_no_submit_rate() -> Generated {
    let env = TestEnv::new("tenancy_generated").await;
    for name in ["left", "right"] {
        cli(&env, &["tenants", "create", name]).await;
    }
    // Full keys: every scope but admin, `delete` too.
    let mut keys = Vec::new();
    for name in ["left", "right"] {
        let scopes = "submit,read,cancel,export,delete";
        let key = cli(&env, &["keys", "create", name, "--scopes", scopes]).await;
        keys.push(key["api_key"].as_str().unwrap().to_owned());
    }
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
    let (child, base) = serve(&env, "tenancy-generated-serve");
    common::wait_healthy(&base).await;
    let callers = Callers {
        api: Api {
            client: common::http_client(),
            base,
        },
        keys,
        readers,
    };
    Generated {
        child,
        callers,
        _env: env,
    }
}

/// One generated request's answer: what it was, the status the model
/// expects, and the status and body that came.
struct Answer {
    op: &'static str,
    expected: u16,
    status: u16,
    body: Value,
}

/// The generated run: its seeded RNG, the model, and what it has seen.
struct Run {
    seed: u64,
    rng: StdRng,
    model: Model,
    /// Answers by (operation, status).
    statuses: HashMap<(&'static str, u16), usize>,
    /// Every answer that crossed tenants or was not what the model expects.
    crossings: Vec<String>,
}

/// One of `ids`, drawn from `rng`, or none if there are none (it draws all the same).
fn pick(rng: &mut StdRng, ids: &[Uuid]) -> Option<Uuid> {
    ids.get(rng.random_range(0..ids.len().max(1))).copied()
}

impl Run {
    /// A run drawing from `seed`, with nothing sent yet.
    fn seeded(seed: u64) -> Self {
        Run {
            seed,
            rng: StdRng::seed_from_u64(seed),
            model: Model::default(),
            statuses: HashMap::new(),
            crossings: Vec::new(),
        }
    }

    /// Sends [`GENERATED_REQUESTS`] requests, each drawn from the RNG and
    /// checked against the model.
    async fn send_generated_requests(&mut self, callers: &Callers) {
        for i in 0..GENERATED_REQUESTS {
            let answer = self.one_generated_request(callers, i).await;
            self.tally(i, answer);
        }
    }

    /// Draws request `i`'s tenant and kind, and sends it.
    async fn one_generated_request(&mut self, callers: &Callers, i: usize) -> Answer {
        let tenant = self.rng.random_range(0..2);
        let roll = self.rng.random_range(0..100);
        if roll < 35 {
            self.submit(callers, i, tenant).await
        } else if roll < 55 {
            self.read(callers, i, tenant).await
        } else if roll < 60 {
            self.list(callers, i, tenant).await
        } else if roll < 65 {
            self.bulk_cancel(callers, i, tenant).await
        } else if roll < 75 {
            self.cancel(callers, i, tenant).await
        } else if roll < 78 {
            self.retry(callers, i, tenant).await
        } else if roll < 83 {
            self.erase(callers, i, tenant).await
        } else if roll < 85 {
            self.dead_letters(callers, i, tenant).await
        } else if roll < 92 {
            self.refused_caller(callers, tenant).await
        } else {
            self.bad_input(callers, tenant).await
        }
    }

    /// Notes a mismatch of `answer` with the model, and counts it.
    fn tally(&mut self, i: usize, answer: Answer) {
        let Answer {
            op,
            expected,
            status,
            body,
        } = answer;
        if status != expected {
            self.crossings.push(format!(
                "{i}: {op} answered {status}, expected {expected}: {body}"
            ));
        }
        *self.statuses.entry((op, status)).or_default() += 1;
    }

    /// Submit, half of them with a key from a small pool both tenants use.
    async fn submit(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let (key, seed_body) = self.draw_submission(tenant);
        let request = callers.submission(tenant, key.as_ref(), seed_body);
        let expected = self.model.expected_submit(tenant, key.as_ref(), seed_body);
        let (status, body) = call(request).await;
        if status == StatusCode::ACCEPTED {
            self.take_in_accepted(i, tenant, &key, seed_body, &body);
        }
        Answer {
            op: "submit",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// Draws a submission's idempotency key (or none) and body seed.
    fn draw_submission(&mut self, tenant: usize) -> (Option<String>, usize) {
        let key = self
            .rng
            .random_bool(0.5)
            .then(|| format!("k-{}", self.rng.random_range(0..40)));
        let seed_body = match &key {
            // A replay of the key sends the first body, now and then another.
            Some(k) => match self.model.keys.get(&(tenant, k.clone())) {
                Some((_, first)) if self.rng.random_bool(0.9) => *first,
                _ => self.rng.random_range(0..1000),
            },
            None => self.rng.random_range(0..1000),
        };
        (key, seed_body)
    }

    /// Adds an accepted submission's job to the model, noting a crossing if
    /// it is the other tenant's job, or a replay that answered another job or
    /// made a second one.
    fn take_in_accepted(
        &mut self,
        i: usize,
        tenant: usize,
        key: &Option<String>,
        seed_body: usize,
        body: &Value,
    ) {
        let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
        match self.model.jobs.get(&id) {
            Some(job) if job.0 != tenant => self
                .crossings
                .push(format!("{i}: submit answered the other tenant's job {id}")),
            Some(_) => {
                let k = key.clone().expect("a new id for a replay without a key");
                if self.model.keys.get(&(tenant, k)).map(|(id, _)| *id) != Some(id) {
                    self.crossings
                        .push(format!("{i}: a replay answered another job"));
                }
            }
            None => {
                if let Some(k) = key {
                    if self.model.keys.contains_key(&(tenant, k.clone())) {
                        self.crossings
                            .push(format!("{i}: a replay of {k} made a second job"));
                    }
                    self.model.keys.insert((tenant, k.clone()), (id, seed_body));
                }
                self.model
                    .jobs
                    .insert(id, (tenant, key.clone(), seed_body, false));
            }
        }
    }

    /// Draws a job id: `tenant`'s own, the other's, or one nobody has.
    fn draw_job_id(&mut self, tenant: usize) -> Uuid {
        let own_ids = self.model.ids_of(tenant);
        let their_ids = self.model.ids_of(1 - tenant);
        match self.rng.random_range(0..3) {
            0 => pick(&mut self.rng, &own_ids),
            1 => pick(&mut self.rng, &their_ids),
            _ => None,
        }
        .unwrap_or_else(Uuid::now_v7)
    }

    /// Read: own, the other's, or an id nobody has; with the full key or the reader.
    async fn read(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let id = self.draw_job_id(tenant);
        let key = if self.rng.random_bool(0.5) {
            &callers.keys[tenant]
        } else {
            &callers.readers[tenant]
        };
        let (status, body) = call(callers.api.get(&format!("/v1/extractions/{id}"), key)).await;
        let mine = self.model.jobs.get(&id).is_some_and(|j| j.0 == tenant);
        if status == StatusCode::OK && !mine {
            self.crossings
                .push(format!("{i}: read another tenant's job {id}"));
        }
        let expected = match (mine, self.model.erased.contains(&id)) {
            (true, true) => 410,
            (true, false) => 200,
            (false, _) => 404,
        };
        Answer {
            op: "read",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// List: the newest page, or the job of a key from the pool both
    /// tenants use, with the reader; every job listed must be the caller's
    /// own, and a key's job the one the model has for it.
    async fn list(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let key = format!("k-{}", self.rng.random_range(0..40));
        let by_key = self.rng.random_bool(0.5);
        let path = match by_key {
            true => format!("/v1/extractions?idempotency_key={key}"),
            false => "/v1/extractions?limit=20".to_owned(),
        };
        let (status, body) = call(callers.api.get(&path, &callers.readers[tenant])).await;
        let listed: Vec<Uuid> = body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| item["id"].as_str().unwrap().parse().unwrap())
            .collect();
        for id in &listed {
            if self.model.jobs.get(id).is_none_or(|j| j.0 != tenant) {
                self.crossings
                    .push(format!("{i}: listed job {id}, not its own"));
            }
        }
        let keyed = self.model.keys.get(&(tenant, key.clone()));
        if by_key
            && status == StatusCode::OK
            && listed != keyed.map(|(id, _)| *id).into_iter().collect::<Vec<_>>()
        {
            self.crossings.push(format!(
                "{i}: key {key} listed {listed:?}, expected {keyed:?}"
            ));
        }
        Answer {
            op: "list",
            expected: 200,
            status: status.as_u16(),
            body,
        }
    }

    /// Cancel: own, the other's, or nobody's.
    async fn cancel(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let id = self.draw_job_id(tenant);
        let path = format!("/v1/extractions/{id}/cancel");
        let (status, body) = call(callers.api.post(&path, Some(&callers.keys[tenant]))).await;
        let expected = match self.model.jobs.get_mut(&id) {
            Some(job) if job.0 == tenant && !job.3 => {
                job.3 = status == StatusCode::OK;
                200
            }
            Some(job) if job.0 == tenant => 409,
            _ => 404,
        };
        if status == StatusCode::OK && expected == 404 {
            self.crossings
                .push(format!("{i}: cancelled another tenant's job {id}"));
        }
        Answer {
            op: "cancel",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// Retry: own (never failed here: 409, or 410 once erased), the other's
    /// or nobody's (404).
    async fn retry(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let id = self.draw_job_id(tenant);
        let path = format!("/v1/extractions/{id}/retry");
        let (status, body) = call(callers.api.post(&path, Some(&callers.keys[tenant]))).await;
        let expected = match self.model.jobs.get(&id) {
            Some(job) if job.0 == tenant && self.model.erased.contains(&id) => 410,
            Some(job) if job.0 == tenant => 409,
            _ => 404,
        };
        if status.is_success() {
            self.crossings
                .push(format!("{i}: retried job {id}, never failed"));
        }
        Answer {
            op: "retry",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// Erase: an own cancelled job (204, again 204 once erased), an own
    /// queued one (409), the other's or nobody's (404).
    async fn erase(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let id = self.draw_job_id(tenant);
        let request = callers
            .api
            .client
            .delete(format!("{}/v1/extractions/{id}", callers.api.base))
            .header("authorization", bearer(&callers.keys[tenant]));
        let (status, body) = call(request).await;
        let expected = match self.model.jobs.get(&id) {
            Some(job) if job.0 == tenant && job.3 => {
                if status == StatusCode::NO_CONTENT {
                    self.model.erased.insert(id);
                }
                204
            }
            Some(job) if job.0 == tenant => 409,
            _ => 404,
        };
        if status == StatusCode::NO_CONTENT && expected == 404 {
            self.crossings
                .push(format!("{i}: erased another tenant's job {id}"));
        }
        Answer {
            op: "erase",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// Dead letters, with the reader: none here (no intake runs), so any
    /// letter listed crossed.
    async fn dead_letters(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let request = callers
            .api
            .get("/v1/dead-letters", &callers.readers[tenant]);
        let (status, body) = call(request).await;
        if body["items"]
            .as_array()
            .is_some_and(|items| !items.is_empty())
        {
            self.crossings.push(format!("{i}: letters listed: {body}"));
        }
        Answer {
            op: "dead letters",
            expected: 200,
            status: status.as_u16(),
            body,
        }
    }

    /// Bulk cancel, by three drawn ids (own, the other's or nobody's) or by
    /// a filter on a key from the pool both tenants use: an own job not yet
    /// cancelled is done, an own cancelled one refused, and any other id not
    /// found; no outcome may name a job of the other tenant.
    async fn bulk_cancel(&mut self, callers: &Callers, i: usize, tenant: usize) -> Answer {
        let key = format!("k-{}", self.rng.random_range(0..40));
        let named: Vec<Uuid> = match self.rng.random_bool(0.5) {
            true => (0..3).map(|_| self.draw_job_id(tenant)).collect(),
            false => Vec::new(),
        };
        let body = match named.is_empty() {
            true => json!({"action": "cancel", "filter": {"idempotency_key": key}}),
            false => json!({"action": "cancel", "ids": named}),
        };
        let request = callers
            .api
            .post("/v1/extractions/actions", Some(&callers.keys[tenant]));
        let (status, mut body) = call(request.json(&body)).await;
        if status == StatusCode::ACCEPTED {
            body = finished_operation(callers, &callers.keys[tenant], &body).await;
        }
        let keyed = self.model.keys.get(&(tenant, key)).map(|(id, _)| *id);
        let expected: Vec<Uuid> = match named.is_empty() {
            true => keyed.into_iter().collect(),
            false => named,
        };
        let outcomes: HashMap<Uuid, String> = body["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                (
                    o["id"].as_str().unwrap().parse().unwrap(),
                    o["outcome"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        // An id drawn twice is one job, with one outcome.
        let mut once = HashSet::new();
        for id in expected.iter().filter(|id| once.insert(**id)) {
            let want = match self.model.jobs.get_mut(id) {
                Some(job) if job.0 == tenant && !job.3 => {
                    job.3 = true;
                    "done"
                }
                Some(job) if job.0 == tenant => "refused",
                _ => "not_found",
            };
            let got = outcomes.get(id).map(String::as_str);
            if status.is_success() && got != Some(want) {
                self.crossings.push(format!(
                    "{i}: bulk cancel of {id} was {got:?}, expected {want}"
                ));
            }
        }
        if outcomes.len() > expected.iter().collect::<HashSet<_>>().len() {
            self.crossings.push(format!(
                "{i}: bulk cancel acted on jobs it was not given: {body}"
            ));
        }
        Answer {
            op: "bulk cancel",
            expected: if status == StatusCode::ACCEPTED {
                202
            } else {
                200
            },
            status: status.as_u16(),
            body,
        }
    }

    /// Refused callers: no key, a key without the scope, a key that is not one.
    async fn refused_caller(&mut self, callers: &Callers, tenant: usize) -> Answer {
        let (request, expected) = match self.rng.random_range(0..3) {
            0 => (
                callers
                    .api
                    .post("/v1/extractions", None)
                    .json(&sample_body(0)),
                401,
            ),
            1 => (
                callers
                    .api
                    .post("/v1/extractions", Some(&callers.readers[tenant]))
                    .json(&sample_body(0)),
                403,
            ),
            _ => (
                callers.api.get(
                    &format!("/v1/extractions/{}", Uuid::now_v7()),
                    &format!("dsk_{}", "f".repeat(64)),
                ),
                401,
            ),
        };
        let (status, body) = call(request).await;
        Answer {
            op: "refused caller",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// Bad input from a good caller: malformed JSON, a bad id.
    async fn bad_input(&mut self, callers: &Callers, tenant: usize) -> Answer {
        let key = &callers.keys[tenant];
        let (request, expected) = match self.rng.random_range(0..2) {
            0 => (
                callers
                    .api
                    .post("/v1/extractions", Some(key))
                    .header("content-type", "application/json")
                    .body("{\"document\":"),
                400,
            ),
            _ => (callers.api.get("/v1/extractions/not-an-id", key), 400),
        };
        let (status, body) = call(request).await;
        Answer {
            op: "bad input",
            expected,
            status: status.as_u16(),
            body,
        }
    }

    /// Prints the seed and what the run and the export streams saw.
    fn report(&self, exported: &Exported) {
        let (seed, model, crossings) = (self.seed, &self.model, &self.crossings);
        let Exported {
            seen_per_tenant,
            leaks,
        } = exported;
        let mut summary: Vec<_> = self.statuses.iter().collect();
        summary.sort();
        eprintln!(
            "tenancy generated: seed {seed}, {GENERATED_REQUESTS} requests, jobs {} ({} keyed), answers by (operation, status): {summary:?}; export events seen per tenant {seen_per_tenant:?}, from the other tenant {leaks}; mismatches {}",
            model.jobs.len(),
            model.keys.len(),
            crossings.len()
        );
    }

    /// Every answer was what the model expects, and none crossed tenants.
    fn no_answer_crossed_tenants(&self) {
        let (seed, crossings) = (self.seed, &self.crossings);
        assert!(
            crossings.is_empty(),
            "seed {seed}: {:?}",
            &crossings[..crossings.len().min(10)]
        );
    }
}

/// Follows bulk operation `started` with `key` until it finished.
async fn finished_operation(callers: &Callers, key: &str, started: &Value) -> Value {
    let path = format!(
        "/v1/extractions/actions/{}",
        started["id"].as_str().unwrap()
    );
    loop {
        let (status, now) = call(callers.api.get(&path, key)).await;
        assert_eq!(status, StatusCode::OK, "{now}");
        if now["state"] == "finished" {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the export streams saw: each tenant's count of events' jobs, and how
/// many events of the other tenant's jobs.
struct Exported {
    seen_per_tenant: Vec<usize>,
    leaks: usize,
}

/// The export streams: one group name in both tenants; each sees all its
/// own jobs' events (asserted here); any of the other's are counted.
async fn each_export_stream_saw_all_its_own_jobs(callers: &Callers, model: &Model) -> Exported {
    let port: u16 = callers
        .api
        .base
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut exported = Exported {
        seen_per_tenant: Vec::new(),
        leaks: 0,
    };
    for (tenant, key) in callers.keys.iter().enumerate() {
        let (seen, leaks) = one_tenants_export_stream(port, tenant, key, model).await;
        exported.leaks += leaks;
        exported.seen_per_tenant.push(seen);
    }
    exported
}

/// Reads `tenant`'s export stream (group `same`, from the earliest) until it
/// has seen each of its jobs, or 10 s pass without an event; asserts it saw
/// exactly its own jobs. How many it saw, and how many events were not its own.
async fn one_tenants_export_stream(
    port: u16,
    tenant: usize,
    key: &str,
    model: &Model,
) -> (usize, usize) {
    use futures::StreamExt;
    let url = format!("ws://127.0.0.1:{port}/v1/export?group=same&ack=auto&from=earliest");
    let (mut socket, _) = tokio_tungstenite::connect_async(common::ws_request(&url, key))
        .await
        .unwrap();
    let own: HashSet<Uuid> = model.ids_of(tenant).into_iter().collect();
    let (mut seen, mut leaks) = (HashSet::new(), 0);
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
    let _ = socket.close(None).await;
    (seen.len(), leaks)
}

/// No export stream saw an event of the other tenant's jobs.
fn no_event_crossed_tenants(exported: &Exported) {
    assert_eq!(exported.leaks, 0, "events crossed tenants");
}
