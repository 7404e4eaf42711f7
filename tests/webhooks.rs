//! Webhooks against real processes and real HTTP receivers on loopback: each
//! job's terminal event is delivered under one `webhook-id`, signed, retried
//! through a receiver outage and 500s, never twice once answered 2xx, still
//! delivered when the delivering process is SIGKILLed right after the state
//! change, and never sent where the SSRF guard forbids. Each tenant signs
//! with its own secret, and a rotation signs with both secrets until its
//! overlap ends. A 410 from a URL too long for a btree key is recorded, and
//! its delivery is not retried.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use common::{
    fast_recovery, free_port, insert_job, sample_body, scrape, signal, stop, wait_for,
    wait_healthy, TestEnv,
};
use docstream::store::tenants;
use docstream::webhook::Signer;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use uuid::Uuid;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request a receiver got.
#[derive(Debug, Clone)]
struct Receipt {
    id: String,
    body: Value,
    /// The signature verifies with [`SECRET`].
    signed: bool,
    /// What verifying needs: the timestamp, the raw body and the header.
    timestamp: i64,
    raw: Bytes,
    signatures: String,
    answered: u16,
    /// The request target: path and query, as received.
    target: String,
}

impl Receipt {
    /// Whether a receiver that knows only `secret` accepts this delivery
    /// (Standard Webhooks: any of the header's signatures may match).
    fn verifies_with(&self, secret: &str) -> bool {
        let expected = Signer::new(secret)
            .unwrap()
            .sign(&self.id, self.timestamp, &self.raw);
        self.signatures.split(' ').any(|s| s == expected)
    }
}

/// What a receiver got, and how it answers: `fail_first` 500s per webhook-id,
/// then `then`.
#[derive(Clone)]
struct Receiver {
    url: String,
    receipts: Arc<Mutex<Vec<Receipt>>>,
    fail_first: usize,
    then: u16,
}

impl Receiver {
    fn receipts(&self) -> Vec<Receipt> {
        self.receipts.lock().unwrap().clone()
    }

    /// Checks that the receiver got exactly one signed request per job, under
    /// the job's webhook-id; returns the receipts by id.
    fn assert_once_each(&self, jobs: &[Uuid]) -> HashMap<String, Vec<Receipt>> {
        let by_id = self.by_id();
        let expected: HashSet<String> = jobs.iter().map(|j| expected_id(*j)).collect();
        assert_eq!(by_id.keys().cloned().collect::<HashSet<_>>(), expected);
        for (id, receipts) in &by_id {
            assert_eq!(receipts.len(), 1, "{id} arrived {} times", receipts.len());
            assert!(receipts[0].signed, "{id} carries a valid signature");
        }
        by_id
    }

    /// Receipts by webhook-id.
    fn by_id(&self) -> HashMap<String, Vec<Receipt>> {
        let mut by_id: HashMap<String, Vec<Receipt>> = HashMap::new();
        for receipt in self.receipts() {
            by_id.entry(receipt.id.clone()).or_default().push(receipt);
        }
        by_id
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let id = header("webhook-id");
    let timestamp: i64 = header("webhook-timestamp").parse().unwrap_or_default();
    let mut receipt = Receipt {
        id,
        body: serde_json::from_slice(&body).unwrap_or_default(),
        signed: false,
        timestamp,
        raw: body,
        signatures: header("webhook-signature"),
        answered: 0,
        target: uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
    };
    receipt.signed = receipt.verifies_with(SECRET);
    let id = receipt.id.clone();
    let mut receipts = receiver.receipts.lock().unwrap();
    let before = receipts.iter().filter(|r| r.id == id).count();
    let answered = match before < receiver.fail_first {
        true => 500,
        false => receiver.then,
    };
    receipt.answered = answered;
    receipts.push(receipt);
    StatusCode::from_u16(answered).unwrap()
}

/// Serves a receiver on `listener` (loopback).
fn start_receiver(listener: TcpListener, fail_first: usize, then: u16) -> Receiver {
    let port = listener.local_addr().unwrap().port();
    let receiver = Receiver {
        url: format!("http://127.0.0.1:{port}/hook"),
        receipts: Arc::default(),
        fail_first,
        then,
    };
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    receiver
}

/// Gives the tenant `default` (the test's jobs' tenant) the secret [`SECRET`].
async fn sign_with_secret(env: &TestEnv) {
    tenants::rotate_webhook_secret(&env.pool, "default", Some(SECRET), 0.0)
        .await
        .unwrap();
}

/// Webhook settings for child processes: loopback allowed, fast retries.
fn webhook_env(allow_loopback: bool) -> Vec<(&'static str, String)> {
    let allow = if allow_loopback { "127.0.0.1/32" } else { "" };
    vec![
        ("DOCSTREAM_WEBHOOK_ALLOW", allow.into()),
        ("DOCSTREAM_WEBHOOK_RETRY_BASE_DELAY_S", "0.2".into()),
        ("DOCSTREAM_WEBHOOK_RETRY_MAX_DELAY_S", "1".into()),
        ("DOCSTREAM_WEBHOOK_TIMEOUT_S", "2".into()),
        ("DOCSTREAM_WEBHOOK_ORPHAN_THRESHOLD_S", "1".into()),
        ("DOCSTREAM_WEBHOOK_MAX_ATTEMPTS", "50".into()),
    ]
}

fn with(
    base: &[(&'static str, String)],
    more: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    base.iter().chain(more).cloned().collect()
}

/// `base`, with the process's `/metrics` on `port`.
fn with_metrics_on(base: &[(&'static str, String)], port: u16) -> Vec<(&'static str, String)> {
    with(
        base,
        &[("DOCSTREAM_METRICS_ADDR", format!("127.0.0.1:{port}"))],
    )
}

/// `serve` on `port`, a worker and a bbox worker, all with `base`; logs
/// named after `name`.
fn spawn_pipeline(
    env: &TestEnv,
    base: &[(&'static str, String)],
    port: u16,
    name: &str,
) -> [tokio::process::Child; 3] {
    let http = [("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))];
    [
        env.spawn("serve", &with(base, &http), &format!("{name}-serve")),
        env.spawn("worker", base, &format!("{name}-worker")),
        env.spawn("bbox-worker", base, &format!("{name}-bbox-worker")),
    ]
}

/// Submits one job over HTTP; its id, or the refusal.
async fn submit(env: &TestEnv, api: &str, webhook_url: &str) -> Result<Uuid, (u16, Value)> {
    let mut body = sample_body(0);
    body["webhook_url"] = json!(webhook_url);
    let response = env
        .client()
        .post(format!("{api}/v1/extractions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap();
    match status {
        200..=299 => Ok(answer["id"].as_str().unwrap().parse().unwrap()),
        _ => Err((status, answer)),
    }
}

/// Counts deliveries in `status`.
async fn deliveries(pool: &sqlx::PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wait_delivered(pool: &sqlx::PgPool, status: &str, n: i64, timeout: Duration) {
    wait_for(
        &format!("{n} deliveries {status}"),
        timeout,
        || async move {
            let count = deliveries(pool, status).await;
            (count >= n)
                .then_some(())
                .ok_or(format!("{count} {status}"))
        },
    )
    .await;
}

fn expected_id(job: Uuid) -> String {
    format!("msg_{}_succeeded", job.simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_and_500s_cost_attempts_never_duplicates_and_410_disables_the_endpoint() {
    const JOBS: usize = 20;
    const OUTAGE: Duration = Duration::from_secs(10);
    let env = TestEnv::new("webhooks_retry").await;
    sign_with_secret(&env).await;
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(true);
    let worker_metrics = free_port();
    let mut children = [
        env.spawn(
            "serve",
            &with(
                &base,
                &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
            ),
            "webhooks-retry-serve",
        ),
        env.spawn("worker", &base, "webhooks-retry-worker"),
        env.spawn(
            "bbox-worker",
            &with_metrics_on(&base, worker_metrics),
            "webhooks-retry-bbox-worker",
        ),
    ];
    wait_healthy(&api).await;

    // Receiver 1 is down: nothing listens on its port for the first 10 s.
    let down_port = free_port();
    let down_url = format!("http://127.0.0.1:{down_port}/hook");
    let outage_began = Instant::now();
    let mut outage_jobs = Vec::new();
    for _ in 0..JOBS {
        outage_jobs.push(submit(&env, &api, &down_url).await.unwrap());
    }
    // Receiver 2 answers 500 three times per webhook-id, then 200.
    let flaky = start_receiver(TcpListener::bind("127.0.0.1:0").await.unwrap(), 3, 200);
    let flaky_job = submit(&env, &api, &flaky.url).await.unwrap();

    // Every outage job reaches its terminal state and fails an attempt while
    // the receiver is down.
    let pool = &env.pool;
    let down = &down_url;
    wait_for("an attempt at every outage delivery", OUTAGE, || async move {
        let tried: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries WHERE url = $1 AND attempts >= 1 AND status = 'pending'",
        )
        .bind(down)
        .fetch_one(pool)
        .await
        .unwrap();
        (tried == JOBS as i64).then_some(()).ok_or(format!("{tried} tried"))
    })
    .await;
    // The outage lasts its 10 s: this sleep is the scenario, not a wait.
    tokio::time::sleep(OUTAGE.saturating_sub(outage_began.elapsed())).await;
    let attempts_during_outage: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(attempts), 0)::int8 FROM webhook_deliveries WHERE url = $1",
    )
    .bind(&down_url)
    .fetch_one(pool)
    .await
    .unwrap();
    let listener = TcpListener::bind(format!("127.0.0.1:{down_port}"))
        .await
        .unwrap();
    let back = start_receiver(listener, 0, 200);
    wait_delivered(pool, "delivered", JOBS as i64 + 1, Duration::from_secs(60)).await;

    // The outage: one distinct id per job event, each answered 2xx exactly once.
    let by_id = back.assert_once_each(&outage_jobs);
    for receipts in by_id.values() {
        assert_eq!(receipts[0].body["type"], "extraction.succeeded");
        assert_eq!(receipts[0].body["data"]["bbox_status"], "succeeded");
    }
    // The 500s: one id, four attempts, all signed, the last one answered 200.
    let flaky_receipts = flaky.receipts();
    let ids: HashSet<&str> = flaky_receipts.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, HashSet::from([expected_id(flaky_job).as_str()]));
    let answers: Vec<u16> = flaky_receipts.iter().map(|r| r.answered).collect();
    assert_eq!(answers, vec![500, 500, 500, 200]);
    assert!(flaky_receipts.iter().all(|r| r.signed));
    let flaky_attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM webhook_deliveries WHERE extraction_id = $1")
            .bind(flaky_job)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(flaky_attempts, 4);

    // 410 Gone: the endpoint is disabled, and the next job's webhook is not sent.
    let gone = start_receiver(TcpListener::bind("127.0.0.1:0").await.unwrap(), 0, 410);
    submit(&env, &api, &gone.url).await.unwrap();
    wait_delivered(pool, "disabled", 1, Duration::from_secs(60)).await;
    submit(&env, &api, &gone.url).await.unwrap();
    wait_delivered(pool, "disabled", 2, Duration::from_secs(60)).await;
    assert_eq!(
        gone.receipts().len(),
        1,
        "nothing is sent to a disabled endpoint"
    );

    let metrics = format!("127.0.0.1:{worker_metrics}");
    let delivered = scrape(
        &metrics,
        "docstream_webhook_deliveries_total{outcome=\"delivered\"}",
    )
    .await;
    let retried = scrape(
        &metrics,
        "docstream_webhook_deliveries_total{outcome=\"retried\"}",
    )
    .await;
    let disabled = scrape(&metrics, "docstream_webhook_disabled_endpoints_total").await;
    assert_eq!(delivered, JOBS as f64 + 1.0);
    assert_eq!(disabled, 1.0);
    eprintln!(
        "webhook retry test: outage={}s jobs={JOBS} attempts_during_outage={attempts_during_outage} distinct_ids_after={} \
         receipts_per_id=1 flaky_answers={answers:?} flaky_attempts={flaky_attempts} gone_receipts={} \
         metrics: delivered={delivered} retried={retried} disabled_endpoints={disabled}",
        OUTAGE.as_secs(),
        by_id.len(),
        gone.receipts().len(),
    );
    stop(children.iter_mut()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_right_after_the_state_change_still_delivers_once() {
    const JOBS: usize = 5;
    let env = TestEnv::with_settings("webhooks_kill", fast_recovery).await;
    sign_with_secret(&env).await;
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(true);
    let receiver = start_receiver(TcpListener::bind("127.0.0.1:0").await.unwrap(), 0, 200);
    let mut serve = env.spawn(
        "serve",
        &with(
            &base,
            &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
        ),
        "webhooks-kill-serve",
    );
    let worker_metrics = free_port();
    let mut worker = env.spawn(
        "worker",
        &with_metrics_on(&base, worker_metrics),
        "webhooks-kill-worker",
    );
    // The first bbox worker stalls right after each terminal state change,
    // before it wakes its dispatcher; the test kills it there.
    let stalled = [(
        "DOCSTREAM_FAILPOINTS",
        "webhook.after_state_change=sleep(60000)".to_owned(),
    )];
    let mut victim = env.spawn(
        "bbox-worker",
        &with(&base, &stalled),
        "webhooks-kill-victim",
    );
    wait_healthy(&api).await;
    let mut jobs = Vec::new();
    for _ in 0..JOBS {
        jobs.push(submit(&env, &api, &receiver.url).await.unwrap());
    }
    let pool = &env.pool;
    wait_delivered(pool, "pending", 1, Duration::from_secs(60)).await;
    signal(&victim, "KILL").await;
    let _ = victim.wait().await;
    let written_before_kill = deliveries(pool, "pending").await;
    assert_eq!(
        receiver.receipts().len(),
        0,
        "nothing was sent before the kill"
    );

    let survivor_metrics = free_port();
    let mut survivor = env.spawn(
        "bbox-worker",
        &with_metrics_on(&base, survivor_metrics),
        "webhooks-kill-survivor",
    );
    wait_delivered(pool, "delivered", JOBS as i64, Duration::from_secs(120)).await;
    let by_id = receiver.assert_once_each(&jobs);
    // Nothing woke those deliveries but a reaper: the victim died first.
    let class6 = "docstream_orphans_found_total{class=\"6\"}";
    let by_worker = scrape(&format!("127.0.0.1:{worker_metrics}"), class6).await;
    let by_survivor = scrape(&format!("127.0.0.1:{survivor_metrics}"), class6).await;
    assert!(
        by_worker + by_survivor >= written_before_kill as f64,
        "the reapers revived {by_worker} + {by_survivor} of {written_before_kill} orphaned deliveries"
    );
    eprintln!(
        "webhook kill test: jobs={JOBS} deliveries_written_before_kill={written_before_kill} \
         distinct_ids={} receipts_per_id=1 class6_orphans_revived: worker={by_worker} survivor={by_survivor}",
        by_id.len()
    );
    stop([&mut serve, &mut worker, &mut survivor]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_refuses_at_submit_and_at_send_and_the_canary_hears_nothing() {
    let env = TestEnv::new("webhooks_ssrf").await;
    sign_with_secret(&env).await;
    // The canary: loopback listeners (IPv4 and, where there is one, IPv6)
    // that count every connection.
    let canary = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let canary_port = canary.local_addr().unwrap().port();
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut listeners = vec![canary];
    if let Ok(v6) = TcpListener::bind(format!("[::1]:{canary_port}")).await {
        listeners.push(v6);
    }
    for listener in listeners {
        let connections = connections.clone();
        tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(false);
    let serve_metrics = free_port();
    let mut serve = env.spawn(
        "serve",
        &with_metrics_on(
            &with(
                &base,
                &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
            ),
            serve_metrics,
        ),
        "webhooks-ssrf-serve",
    );
    wait_healthy(&api).await;

    let p = canary_port;
    let refused_urls = [
        format!("http://127.0.0.1:{p}/hook"),
        format!("http://[::1]:{p}/hook"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://[::ffff:169.254.169.254]/".to_owned(),
        format!("http://0x7f000001:{p}/hook"),
        format!("http://2130706433:{p}/hook"),
        format!("http://127.1:{p}/hook"),
        "http://10.0.0.1/hook".to_owned(),
        format!("http://localhost.:{p}/hook"),
        "file:///etc/passwd".to_owned(),
        format!("http://localhost:{p}/hook"),
    ];
    let mut refusals = Vec::new();
    for url in &refused_urls {
        match submit(&env, &api, url).await {
            Ok(id) => panic!("{url} was accepted as job {id}"),
            Err((status, answer)) => {
                assert_eq!(status, 422, "{url}: {answer}");
                refusals.push(format!("{url} -> {}", answer["error"]["message"]));
            }
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "a refused submit writes nothing");
    let at_submit = scrape(
        &format!("127.0.0.1:{serve_metrics}"),
        "docstream_webhook_ssrf_rejections_total{stage=\"submit\"}",
    )
    .await;
    // Every URL but file:// (refused earlier, by request validation) reached the guard.
    assert_eq!(at_submit, refused_urls.len() as f64 - 1.0);

    // At send: a delivery to the canary already in the outbox (as if its
    // name had resolved elsewhere at submit) is refused, not sent.
    let job = insert_job(&env.pool).await;
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, extraction_id, event_type, url, payload, next_attempt_at)
         VALUES ('msg_canary', $1, 'extraction.succeeded', $2, '{}', now() - interval '1 minute')",
    )
    .bind(job)
    .bind(format!("http://127.0.0.1:{p}/hook"))
    .execute(&env.pool)
    .await
    .unwrap();
    let worker_metrics = free_port();
    let mut worker = env.spawn(
        "worker",
        &with_metrics_on(&base, worker_metrics),
        "webhooks-ssrf-worker",
    );
    wait_delivered(&env.pool, "failed", 1, Duration::from_secs(60)).await;
    let error: String =
        sqlx::query_scalar("SELECT last_error FROM webhook_deliveries WHERE id = 'msg_canary'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(error.contains("127.0.0.1"), "{error}");
    let at_send = scrape(
        &format!("127.0.0.1:{worker_metrics}"),
        "docstream_webhook_ssrf_rejections_total{stage=\"send\"}",
    )
    .await;
    assert_eq!(at_send, 1.0);
    let heard = connections.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(heard, 0, "the canary heard a connection");
    eprintln!(
        "webhook ssrf test: refused_at_submit={} (metric {at_submit}) refused_at_send={at_send} canary_connections={heard}\n  {}",
        refusals.len(),
        refusals.join("\n  ")
    );
    stop([&mut serve, &mut worker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends() {
    const OVERLAP_S: f64 = 4.0;
    let env = TestEnv::new("webhooks_rotation").await;
    sign_with_secret(&env).await;
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(true);
    let receiver = start_receiver(TcpListener::bind("127.0.0.1:0").await.unwrap(), 0, 200);
    let http = with(
        &base,
        &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
    );
    let mut children = [
        env.spawn("serve", &http, "webhooks-rotation-serve"),
        env.spawn("worker", &base, "webhooks-rotation-worker"),
        env.spawn("bbox-worker", &base, "webhooks-rotation-bbox-worker"),
    ];
    wait_healthy(&api).await;
    let delivered = |job: Uuid| {
        let receiver = receiver.clone();
        move || {
            let got = receiver.by_id().remove(&expected_id(job));
            async move {
                got.and_then(|r| r.into_iter().next())
                    .ok_or("not yet".to_owned())
            }
        }
    };
    let within = Duration::from_secs(60);

    let before = submit(&env, &api, &receiver.url).await.unwrap();
    let before = wait_for("the first delivery", within, delivered(before)).await;
    let rotated = tenants::rotate_webhook_secret(&env.pool, "default", None, OVERLAP_S)
        .await
        .unwrap();
    let new = rotated.webhook_secret.clone();
    let during = submit(&env, &api, &receiver.url).await.unwrap();
    let during = wait_for("the delivery during the overlap", within, delivered(during)).await;
    wait_for("the overlap to end", within, || {
        let pool = env.pool.clone();
        async move {
            let open: bool = sqlx::query_scalar(
                "SELECT webhook_previous_until > now() FROM tenants WHERE name = 'default'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (!open).then_some(()).ok_or("open".to_owned())
        }
    })
    .await;
    let after = submit(&env, &api, &receiver.url).await.unwrap();
    let after = wait_for("the delivery after the overlap", within, delivered(after)).await;
    stop(children.iter_mut()).await;

    let count = |r: &Receipt| r.signatures.split(' ').count();
    eprintln!(
        "webhooks rotation test: before: {} signature(s), old {}, new {}; during: {}, old {}, new {}; after: {}, old {}, new {}",
        count(&before), before.verifies_with(SECRET), before.verifies_with(&new),
        count(&during), during.verifies_with(SECRET), during.verifies_with(&new),
        count(&after), after.verifies_with(SECRET), after.verifies_with(&new),
    );
    assert!(before.verifies_with(SECRET) && !before.verifies_with(&new));
    assert_eq!(count(&during), 2, "both secrets sign during the overlap");
    assert!(during.verifies_with(SECRET) && during.verifies_with(&new));
    assert_eq!(count(&after), 1);
    assert!(after.verifies_with(&new) && !after.verifies_with(SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_from_a_6000_character_url_is_recorded_once_and_never_retried() {
    use rand::distributions::{Alphanumeric, DistString};
    use sha2::{Digest, Sha256};
    const URL_CHARS: usize = 6_000;
    // Submit to recorded 410: the job's extraction, bbox refinement and one
    // attempt; the other tests give a delivery 60 s.
    const RECORDED_WITHIN: Duration = Duration::from_secs(60);
    // After the 410 is recorded: retries here come at most 1 s apart
    // (DOCSTREAM_WEBHOOK_RETRY_MAX_DELAY_S) and the reapers revive a delivery
    // 1 s after it was due (the orphan threshold), so 3 s is three of either.
    const QUIET: Duration = Duration::from_secs(3);
    const MAX_ATTEMPTS: i32 = 3;
    let env = TestEnv::new("webhooks_long_url").await;
    sign_with_secret(&env).await;
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = with(
        &webhook_env(true),
        &[("DOCSTREAM_WEBHOOK_MAX_ATTEMPTS", MAX_ATTEMPTS.to_string())],
    );
    let mut children = spawn_pipeline(&env, &base, port, "webhooks-long-url");
    wait_healthy(&api).await;

    let gone = start_receiver(TcpListener::bind("127.0.0.1:0").await.unwrap(), 0, 410);
    // Random letters and digits, which Postgres cannot compress below the
    // btree limit (2,704 bytes) the way it would a run of one character.
    let mut url = format!("{}?pad=", gone.url);
    let pad = URL_CHARS - url.len();
    url.push_str(&Alphanumeric.sample_string(&mut rand::thread_rng(), pad));
    assert_eq!(url.len(), URL_CHARS);
    let submitted = Instant::now();
    let job = match submit(&env, &api, &url).await {
        Ok(job) => job,
        Err((status, answer)) => {
            panic!("a {URL_CHARS}-character webhook_url was refused: {status} {answer}")
        }
    };

    let pool = &env.pool;
    let (attempts, code): (i32, Option<i32>) =
        wait_for("the 410 to be recorded", RECORDED_WITHIN, || async move {
            let row: Option<(String, i32, Option<i32>)> = sqlx::query_as(
                "SELECT status, attempts, last_status_code FROM webhook_deliveries
                  WHERE extraction_id = $1",
            )
            .bind(job)
            .fetch_optional(pool)
            .await
            .unwrap();
            match row {
                Some((status, attempts, code)) if status == "disabled" => Ok((attempts, code)),
                other => Err(format!("delivery: {other:?}")),
            }
        })
        .await;
    let recorded_after = submitted.elapsed();
    let receipts_at_record = gone.receipts().len();

    // No further request: the receiver's count, and the row, stay put.
    let quiet_began = Instant::now();
    while quiet_began.elapsed() < QUIET {
        assert_eq!(gone.receipts().len(), 1, "a request after the recorded 410");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let receipts = gone.receipts();
    let (status, attempts_after): (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM webhook_deliveries WHERE extraction_id = $1")
            .bind(job)
            .fetch_one(pool)
            .await
            .unwrap();
    let endpoint: (String, Vec<u8>, String) =
        sqlx::query_as("SELECT url, url_sha256, reason FROM webhook_endpoints")
            .fetch_one(pool)
            .await
            .unwrap();
    stop(children.iter_mut()).await;

    eprintln!(
        "webhook long url test: url_chars={URL_CHARS} recorded_410_after={:.2}s receipts_at_record={receipts_at_record} \
         receipts_after_{}s_quiet={} attempts={attempts} attempts_after_quiet={attempts_after} status={status} \
         last_status_code={code:?} endpoint_url_chars={} max_attempts={MAX_ATTEMPTS}",
        recorded_after.as_secs_f64(),
        QUIET.as_secs(),
        receipts.len(),
        endpoint.0.len(),
    );
    assert_eq!(
        receipts.len(),
        1,
        "exactly one request reached the receiver"
    );
    assert_eq!(receipts[0].answered, 410);
    assert_eq!(receipts[0].id, expected_id(job));
    assert!(receipts[0].signed);
    assert_eq!(
        format!("{}{}", origin_of(&gone.url), receipts[0].target),
        url,
        "the receiver got the whole URL"
    );
    assert_eq!((attempts, attempts_after), (1, 1));
    assert_eq!(status, "disabled");
    assert_eq!(code, Some(410));
    assert_eq!(
        endpoint.0, url,
        "the endpoint is recorded under its whole URL"
    );
    assert_eq!(endpoint.1, Sha256::digest(url.as_bytes()).to_vec());
    assert_eq!(endpoint.2, "answered 410 Gone");
}

/// `http://host:port` of `url`.
fn origin_of(url: &str) -> String {
    let parsed = reqwest::Url::parse(url).unwrap();
    parsed.origin().ascii_serialization()
}

#[tokio::test]
async fn an_endpoint_disabled_before_the_url_hash_key_stays_disabled() {
    use sha2::{Digest, Sha256};
    // The first migration that keys endpoints by the URL's digest.
    const URL_HASH: &str = "20261201000007";
    let env = TestEnv::unmigrated("webhooks_url_hash").await;
    let pool = &env.pool;
    let before = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir("migrations").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.as_str() < URL_HASH {
            std::fs::copy(&path, before.path().join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(before.path())
        .await
        .unwrap()
        .run(pool)
        .await
        .unwrap();
    let url = "https://gone.example/hook?ü=1";
    sqlx::query("INSERT INTO webhook_endpoints (url, reason) VALUES ($1, 'answered 410 Gone')")
        .bind(url)
        .execute(pool)
        .await
        .unwrap();

    docstream::store::migrate(pool).await.unwrap();
    let digest: Vec<u8> =
        sqlx::query_scalar("SELECT url_sha256 FROM webhook_endpoints WHERE url = $1")
            .bind(url)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(digest, Sha256::digest(url.as_bytes()).to_vec());
    let indexed: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE tablename IN ('webhook_endpoints', 'webhook_deliveries')
          ORDER BY indexname",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        indexed.iter().all(|def| !def.contains("(url)")),
        "an index on a URL's text: {indexed:?}"
    );

    // A delivery to it is claimed as disabled, and recording it again is a no-op.
    let job = insert_job(pool).await;
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, extraction_id, event_type, url, payload)
         VALUES ('msg_gone', $1, 'extraction.succeeded', $2, '{}')",
    )
    .bind(job)
    .bind(url)
    .execute(pool)
    .await
    .unwrap();
    let claimed = docstream::store::webhooks::claim(pool, "msg_gone", 10.0)
        .await
        .unwrap()
        .expect("due and unheld");
    assert!(claimed.endpoint_disabled);
    let again = docstream::store::webhooks::disable_endpoint(pool, url, "again")
        .await
        .unwrap();
    assert!(!again, "the endpoint was recorded already");
    eprintln!("webhook url hash migration test: endpoint kept, digest matches, claim sees it disabled; indexes: {indexed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_that_never_record_an_outcome_still_count_and_the_delivery_is_given_up() {
    const MAX_ATTEMPTS: i32 = 3;
    let env = TestEnv::new("webhooks_unrecorded").await;
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let receiver = start_receiver(TcpListener::bind("127.0.0.1:0").await.unwrap(), 0, 200);
    // Every attempt is claimed and then abandoned before its request, as a
    // dispatcher that fails to record its outcome leaves it: only the reaper
    // brings the delivery back.
    let base = with(
        &webhook_env(true),
        &[
            ("DOCSTREAM_WEBHOOK_TIMEOUT_S", "0.5".to_owned()),
            ("DOCSTREAM_WEBHOOK_ORPHAN_THRESHOLD_S", "0.5".to_owned()),
            ("DOCSTREAM_WEBHOOK_MAX_ATTEMPTS", MAX_ATTEMPTS.to_string()),
            (
                "DOCSTREAM_FAILPOINTS",
                "webhook.before_send=error".to_owned(),
            ),
        ],
    );
    let mut children = spawn_pipeline(&env, &base, port, "webhooks-unrecorded");
    wait_healthy(&api).await;
    submit(&env, &api, &receiver.url).await.unwrap();
    let pool = &env.pool;
    wait_delivered(pool, "failed", 1, Duration::from_secs(90)).await;
    let (attempts, error): (i32, Option<String>) =
        sqlx::query_as("SELECT attempts, last_error FROM webhook_deliveries")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        MAX_ATTEMPTS + 1,
        "the claim past the maximum gives up"
    );
    assert!(
        error
            .as_deref()
            .unwrap_or_default()
            .starts_with("gave up after 3 attempts"),
        "{error:?}"
    );
    assert_eq!(receiver.receipts().len(), 0);
    eprintln!("webhook unrecorded attempts: given up at attempt {attempts}: {error:?}");
    stop(&mut children).await;
}
