//! Webhooks against real processes and real HTTP receivers on loopback: each
//! job's terminal event is delivered under one `webhook-id`, signed, retried
//! through a receiver outage and 500s, never twice once answered 2xx, still
//! delivered when the delivering process is SIGKILLed right after the state
//! change, and never sent where the SSRF guard forbids. Each tenant signs
//! with its own secret, and a rotation signs with both secrets until its
//! overlap ends. A 410 from a URL too long for a btree key is recorded, and
//! its delivery is not retried.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
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

// ---------------------------------------------------------------------------
// Shared steps.
// ---------------------------------------------------------------------------

/// A receiver on a loopback port of its own: `fail_first` 500s per
/// webhook-id, then `then`.
async fn a_receiver(fail_first: usize, then: u16) -> Receiver {
    start_receiver(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        fail_first,
        then,
    )
}

/// A receiver that answers every request 200.
async fn a_receiver_that_answers_200() -> Receiver {
    a_receiver(0, 200).await
}

/// A receiver that answers every request 410 Gone.
async fn a_receiver_that_answers_410() -> Receiver {
    a_receiver(0, 410).await
}

/// `serve` on `port`, a worker and a bbox worker, all with `base` (see
/// [`spawn_pipeline`]), once the API is healthy; the API's base URL and the
/// children.
async fn a_healthy_pipeline(
    env: &TestEnv,
    base: &[(&'static str, String)],
    port: u16,
    name: &str,
) -> (String, [tokio::process::Child; 3]) {
    let api = format!("http://127.0.0.1:{port}");
    let children = spawn_pipeline(env, base, port, name);
    wait_healthy(&api).await;
    (api, children)
}

/// A child process and the port of its `/metrics`.
struct Metered {
    child: tokio::process::Child,
    metrics: u16,
}

/// `base` with `serve`'s API on `port`.
fn with_http_on(base: &[(&'static str, String)], port: u16) -> Vec<(&'static str, String)> {
    with(
        base,
        &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
    )
}

/// Submits `n` jobs whose webhooks go to `url`, one after the other.
async fn jobs_to(env: &TestEnv, api: &str, url: &str, n: usize) -> Vec<Uuid> {
    let mut jobs = Vec::new();
    for _ in 0..n {
        jobs.push(submit(env, api, url).await.unwrap());
    }
    jobs
}

// ---------------------------------------------------------------------------
// Outages, 500s and a 410.
// ---------------------------------------------------------------------------

/// Jobs whose webhooks go to the receiver that is down at first.
const OUTAGE_JOBS: usize = 20;
/// How long that receiver is down.
const OUTAGE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_and_500s_cost_attempts_never_duplicates_and_410_disables_the_endpoint() {
    let env = TestEnv::new("webhooks_retry").await;
    sign_with_secret(&env).await;
    let mut pipeline = a_pipeline_whose_bbox_worker_serves_metrics(&env).await;
    let outage = jobs_to_a_receiver_that_is_down(&env, &pipeline.api).await;
    let flaky = a_receiver_that_answers_500_three_times_then_200().await;
    let flaky_job = submit(&env, &pipeline.api, &flaky.url).await.unwrap();

    let attempts_during_outage = the_outage_lasts_its_10_s(&env.pool, &outage).await;
    let back = the_receiver_comes_back(&outage).await;
    let all = OUTAGE_JOBS as i64 + 1;
    wait_delivered(&env.pool, "delivered", all, Duration::from_secs(60)).await;

    let by_id = each_outage_job_was_delivered_once_as_succeeded(&back, &outage.jobs);
    let (answers, flaky_attempts) =
        the_flaky_job_took_four_signed_attempts(&env.pool, &flaky, flaky_job).await;
    let gone = a_receiver_that_answers_410().await;
    two_jobs_to_an_endpoint_that_answers_410(&env, &pipeline.api, &gone).await;
    nothing_is_sent_to_a_disabled_endpoint(&gone);
    let counted = WebhookMetrics::scrape(pipeline.metrics).await;
    the_worker_counted_every_delivery_and_one_disabled_endpoint(&counted);
    eprintln!(
        "webhook retry test: outage={}s jobs={OUTAGE_JOBS} attempts_during_outage={attempts_during_outage} distinct_ids_after={} \
         receipts_per_id=1 flaky_answers={answers:?} flaky_attempts={flaky_attempts} gone_receipts={} \
         metrics: delivered={} retried={} disabled_endpoints={}",
        OUTAGE.as_secs(),
        by_id.len(),
        gone.receipts().len(),
        counted.delivered,
        counted.retried,
        counted.disabled,
    );
    stop(pipeline.children.iter_mut()).await;
}

/// The processes of the retry test: the API's base URL, the port of the bbox
/// worker's `/metrics`, and the children.
struct Pipeline {
    api: String,
    metrics: u16,
    children: [tokio::process::Child; 3],
}

/// `serve`, a worker and a bbox worker whose `/metrics` the test reads, with
/// loopback allowed and fast retries, once the API is healthy.
async fn a_pipeline_whose_bbox_worker_serves_metrics(env: &TestEnv) -> Pipeline {
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(true);
    let metrics = free_port();
    let children = [
        env.spawn("serve", &with_http_on(&base, port), "webhooks-retry-serve"),
        env.spawn("worker", &base, "webhooks-retry-worker"),
        env.spawn(
            "bbox-worker",
            &with_metrics_on(&base, metrics),
            "webhooks-retry-bbox-worker",
        ),
    ];
    wait_healthy(&api).await;
    Pipeline {
        api,
        metrics,
        children,
    }
}

/// Jobs whose webhooks go to a receiver that is down, and when it went down.
struct Outage {
    /// Nothing listens on it until [`the_receiver_comes_back`].
    port: u16,
    url: String,
    began: Instant,
    jobs: Vec<Uuid>,
}

/// Receiver 1 is down: nothing listens on its port for the first 10 s, and
/// [`OUTAGE_JOBS`] jobs are submitted with their webhooks to it.
async fn jobs_to_a_receiver_that_is_down(env: &TestEnv, api: &str) -> Outage {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let began = Instant::now();
    let jobs = jobs_to(env, api, &url, OUTAGE_JOBS).await;
    Outage {
        port,
        url,
        began,
        jobs,
    }
}

/// Receiver 2 answers 500 three times per webhook-id, then 200.
async fn a_receiver_that_answers_500_three_times_then_200() -> Receiver {
    a_receiver(3, 200).await
}

/// Every outage job fails an attempt while the receiver is down, and the
/// outage lasts its 10 s; the attempts made at the receiver meanwhile.
async fn the_outage_lasts_its_10_s(pool: &sqlx::PgPool, outage: &Outage) -> i64 {
    wait_until_every_outage_delivery_was_tried(pool, &outage.url).await;
    // The outage lasts its 10 s: this sleep is the scenario, not a wait.
    tokio::time::sleep(OUTAGE.saturating_sub(outage.began.elapsed())).await;
    sqlx::query_scalar(
        "SELECT COALESCE(sum(attempts), 0)::int8 FROM webhook_deliveries WHERE url = $1",
    )
    .bind(&outage.url)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits (at most [`OUTAGE`]) until every outage job reached its terminal
/// state and its delivery to `down` failed an attempt, still pending.
async fn wait_until_every_outage_delivery_was_tried(pool: &sqlx::PgPool, down: &str) {
    wait_for("an attempt at every outage delivery", OUTAGE, || async move {
        let tried: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries WHERE url = $1 AND attempts >= 1 AND status = 'pending'",
        )
        .bind(down)
        .fetch_one(pool)
        .await
        .unwrap();
        (tried == OUTAGE_JOBS as i64)
            .then_some(())
            .ok_or(format!("{tried} tried"))
    })
    .await;
}

/// The receiver that was down listens on its port, answering 200.
async fn the_receiver_comes_back(outage: &Outage) -> Receiver {
    let listener = TcpListener::bind(format!("127.0.0.1:{}", outage.port))
        .await
        .unwrap();
    start_receiver(listener, 0, 200)
}

/// The outage: one distinct id per job event, each answered 2xx exactly once,
/// each a succeeded job whose bbox refinement succeeded; the receipts by id.
fn each_outage_job_was_delivered_once_as_succeeded(
    back: &Receiver,
    jobs: &[Uuid],
) -> HashMap<String, Vec<Receipt>> {
    let by_id = back.assert_once_each(jobs);
    for receipts in by_id.values() {
        assert_eq!(receipts[0].body["type"], "extraction.succeeded");
        assert_eq!(receipts[0].body["data"]["bbox_status"], "succeeded");
    }
    by_id
}

/// The 500s: one id, four attempts, all signed, the last one answered 200,
/// and 4 attempts recorded; the answers and the recorded attempts.
async fn the_flaky_job_took_four_signed_attempts(
    pool: &sqlx::PgPool,
    flaky: &Receiver,
    job: Uuid,
) -> (Vec<u16>, i32) {
    let receipts = flaky.receipts();
    let ids: HashSet<&str> = receipts.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, HashSet::from([expected_id(job).as_str()]));
    let answers: Vec<u16> = receipts.iter().map(|r| r.answered).collect();
    assert_eq!(answers, vec![500, 500, 500, 200]);
    assert!(receipts.iter().all(|r| r.signed));
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM webhook_deliveries WHERE extraction_id = $1")
            .bind(job)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(attempts, 4);
    (answers, attempts)
}

/// 410 Gone: a job whose webhook `gone` answers 410, until its endpoint is
/// disabled, then a second job to it, until its delivery is disabled too.
async fn two_jobs_to_an_endpoint_that_answers_410(env: &TestEnv, api: &str, gone: &Receiver) {
    submit(env, api, &gone.url).await.unwrap();
    wait_delivered(&env.pool, "disabled", 1, Duration::from_secs(60)).await;
    submit(env, api, &gone.url).await.unwrap();
    wait_delivered(&env.pool, "disabled", 2, Duration::from_secs(60)).await;
}

/// The second job's webhook was not sent: `gone` got one request.
fn nothing_is_sent_to_a_disabled_endpoint(gone: &Receiver) {
    assert_eq!(
        gone.receipts().len(),
        1,
        "nothing is sent to a disabled endpoint"
    );
}

/// What a process's `/metrics` counted of webhook deliveries.
struct WebhookMetrics {
    delivered: f64,
    retried: f64,
    disabled: f64,
}

impl WebhookMetrics {
    /// Reads them from the `/metrics` on loopback port `port`.
    async fn scrape(port: u16) -> Self {
        let metrics = format!("127.0.0.1:{port}");
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
        Self {
            delivered,
            retried,
            disabled,
        }
    }
}

/// Every job's delivery counted as delivered, and one endpoint as disabled.
fn the_worker_counted_every_delivery_and_one_disabled_endpoint(counted: &WebhookMetrics) {
    assert_eq!(counted.delivered, OUTAGE_JOBS as f64 + 1.0);
    assert_eq!(counted.disabled, 1.0);
}

// ---------------------------------------------------------------------------
// A SIGKILL right after the state change.
// ---------------------------------------------------------------------------

/// Jobs of the SIGKILL test.
const KILL_JOBS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_right_after_the_state_change_still_delivers_once() {
    let env = TestEnv::with_settings("webhooks_kill", fast_recovery).await;
    sign_with_secret(&env).await;
    let port = free_port();
    let receiver = a_receiver_that_answers_200().await;
    let mut kill = a_pipeline_whose_bbox_worker_stalls_after_each_state_change(&env, port).await;
    let jobs = jobs_to(&env, &kill.api, &receiver.url, KILL_JOBS).await;

    let written_before_kill =
        the_victim_is_sigkilled_once_a_delivery_is_written(&env.pool, &mut kill.victim).await;
    nothing_was_sent_before_the_kill(&receiver);
    let mut survivor = a_bbox_worker_that_survives(&env).await;
    let all = KILL_JOBS as i64;
    wait_delivered(&env.pool, "delivered", all, Duration::from_secs(120)).await;

    let by_id = receiver.assert_once_each(&jobs);
    let (by_worker, by_survivor) = the_reapers_revived_every_orphaned_delivery(
        kill.worker.metrics,
        survivor.metrics,
        written_before_kill,
    )
    .await;
    eprintln!(
        "webhook kill test: jobs={KILL_JOBS} deliveries_written_before_kill={written_before_kill} \
         distinct_ids={} receipts_per_id=1 class6_orphans_revived: worker={by_worker} survivor={by_survivor}",
        by_id.len()
    );
    stop([&mut kill.serve, &mut kill.worker.child, &mut survivor.child]).await;
}

/// The processes of the SIGKILL test before the kill.
struct KillPipeline {
    api: String,
    serve: tokio::process::Child,
    worker: Metered,
    /// The bbox worker that stalls after each terminal state change.
    victim: tokio::process::Child,
}

/// `serve` on `port`, a worker whose `/metrics` the test reads, and a bbox
/// worker that stalls right after each terminal state change, before it
/// wakes its dispatcher (the test kills it there); once the API is healthy.
async fn a_pipeline_whose_bbox_worker_stalls_after_each_state_change(
    env: &TestEnv,
    port: u16,
) -> KillPipeline {
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(true);
    let serve = env.spawn("serve", &with_http_on(&base, port), "webhooks-kill-serve");
    let metrics = free_port();
    let child = env.spawn(
        "worker",
        &with_metrics_on(&base, metrics),
        "webhooks-kill-worker",
    );
    let stalled = [(
        "DOCSTREAM_FAILPOINTS",
        "webhook.after_state_change=sleep(60000)".to_owned(),
    )];
    let victim = env.spawn(
        "bbox-worker",
        &with(&base, &stalled),
        "webhooks-kill-victim",
    );
    wait_healthy(&api).await;
    KillPipeline {
        api,
        serve,
        worker: Metered { child, metrics },
        victim,
    }
}

/// Once a delivery is written (pending), SIGKILLs the victim and waits for
/// it; the pending deliveries then.
async fn the_victim_is_sigkilled_once_a_delivery_is_written(
    pool: &sqlx::PgPool,
    victim: &mut tokio::process::Child,
) -> i64 {
    wait_delivered(pool, "pending", 1, Duration::from_secs(60)).await;
    signal(victim, "KILL").await;
    let _ = victim.wait().await;
    deliveries(pool, "pending").await
}

/// The receiver got nothing before the kill.
fn nothing_was_sent_before_the_kill(receiver: &Receiver) {
    assert_eq!(
        receiver.receipts().len(),
        0,
        "nothing was sent before the kill"
    );
}

/// A second bbox worker, without the stall, whose `/metrics` the test reads.
async fn a_bbox_worker_that_survives(env: &TestEnv) -> Metered {
    let metrics = free_port();
    let child = env.spawn(
        "bbox-worker",
        &with_metrics_on(&webhook_env(true), metrics),
        "webhooks-kill-survivor",
    );
    Metered { child, metrics }
}

/// Nothing woke those deliveries but a reaper (the victim died first): the
/// class-6 orphans the worker and the survivor found cover every delivery
/// written before the kill; what each found.
async fn the_reapers_revived_every_orphaned_delivery(
    worker_metrics: u16,
    survivor_metrics: u16,
    written_before_kill: i64,
) -> (f64, f64) {
    let class6 = "docstream_orphans_found_total{class=\"6\"}";
    let by_worker = scrape(&format!("127.0.0.1:{worker_metrics}"), class6).await;
    let by_survivor = scrape(&format!("127.0.0.1:{survivor_metrics}"), class6).await;
    assert!(
        by_worker + by_survivor >= written_before_kill as f64,
        "the reapers revived {by_worker} + {by_survivor} of {written_before_kill} orphaned deliveries"
    );
    (by_worker, by_survivor)
}

// ---------------------------------------------------------------------------
// The SSRF guard.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_refuses_at_submit_and_at_send_and_the_canary_hears_nothing() {
    let env = TestEnv::new("webhooks_ssrf").await;
    sign_with_secret(&env).await;
    let canary = a_canary_that_counts_connections().await;
    let (api, mut serve) = a_serve_that_guards_loopback(&env).await;
    let refused_urls = urls_the_guard_refuses(canary.port);

    let refusals = every_submit_is_refused_with_422(&env, &api, &refused_urls).await;
    a_refused_submit_writes_nothing(&env.pool).await;
    let at_submit = the_guard_counted_each_but_the_file_url(serve.metrics, &refused_urls).await;

    a_delivery_to_the_canary_already_in_the_outbox(&env.pool, canary.port).await;
    let mut worker = a_worker_that_guards_loopback(&env).await;
    wait_delivered(&env.pool, "failed", 1, Duration::from_secs(60)).await;
    the_delivery_failed_naming_the_canary(&env.pool).await;
    let at_send = the_guard_counted_one_refusal_at_send(worker.metrics).await;
    let heard = canary.heard_nothing();
    eprintln!(
        "webhook ssrf test: refused_at_submit={} (metric {at_submit}) refused_at_send={at_send} canary_connections={heard}\n  {}",
        refusals.len(),
        refusals.join("\n  ")
    );
    stop([&mut serve.child, &mut worker.child]).await;
}

/// Loopback listeners on one port that count every connection.
struct Canary {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Canary {
    /// The connections it heard, which must be none.
    fn heard_nothing(&self) -> usize {
        let heard = self.connections.load(Ordering::SeqCst);
        assert_eq!(heard, 0, "the canary heard a connection");
        heard
    }
}

/// The canary: loopback listeners (IPv4 and, where there is one, IPv6)
/// that count every connection.
async fn a_canary_that_counts_connections() -> Canary {
    let canary = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = canary.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let mut listeners = vec![canary];
    if let Ok(v6) = TcpListener::bind(format!("[::1]:{port}")).await {
        listeners.push(v6);
    }
    for listener in listeners {
        let connections = connections.clone();
        tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                connections.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    Canary { port, connections }
}

/// `serve` with loopback not allowed and its `/metrics` read by the test,
/// once healthy; the API's base URL and the process.
async fn a_serve_that_guards_loopback(env: &TestEnv) -> (String, Metered) {
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let base = webhook_env(false);
    let metrics = free_port();
    let child = env.spawn(
        "serve",
        &with_metrics_on(&with_http_on(&base, port), metrics),
        "webhooks-ssrf-serve",
    );
    wait_healthy(&api).await;
    (api, Metered { child, metrics })
}

/// Webhook URLs the guard refuses at submit, most of them at the canary.
fn urls_the_guard_refuses(p: u16) -> [String; 11] {
    [
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
    ]
}

/// Submits a job to each of `urls`; each is answered 422. The refusals'
/// messages, by URL.
async fn every_submit_is_refused_with_422(
    env: &TestEnv,
    api: &str,
    urls: &[String],
) -> Vec<String> {
    let mut refusals = Vec::new();
    for url in urls {
        match submit(env, api, url).await {
            Ok(id) => panic!("{url} was accepted as job {id}"),
            Err((status, answer)) => {
                assert_eq!(status, 422, "{url}: {answer}");
                refusals.push(format!("{url} -> {}", answer["error"]["message"]));
            }
        }
    }
    refusals
}

/// No extraction row was written.
async fn a_refused_submit_writes_nothing(pool: &sqlx::PgPool) {
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "a refused submit writes nothing");
}

/// Every URL but file:// (refused earlier, by request validation) reached
/// the guard, as `serve`'s `/metrics` counts; the count.
async fn the_guard_counted_each_but_the_file_url(metrics: u16, urls: &[String]) -> f64 {
    let at_submit = scrape(
        &format!("127.0.0.1:{metrics}"),
        "docstream_webhook_ssrf_rejections_total{stage=\"submit\"}",
    )
    .await;
    assert_eq!(at_submit, urls.len() as f64 - 1.0);
    at_submit
}

/// At send: a delivery to the canary already in the outbox (as if its name
/// had resolved elsewhere at submit), due a minute ago.
async fn a_delivery_to_the_canary_already_in_the_outbox(pool: &sqlx::PgPool, port: u16) {
    let job = insert_job(pool).await;
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, extraction_id, event_type, url, payload, next_attempt_at)
         VALUES ('msg_canary', $1, 'extraction.succeeded', $2, '{}', now() - interval '1 minute')",
    )
    .bind(job)
    .bind(format!("http://127.0.0.1:{port}/hook"))
    .execute(pool)
    .await
    .unwrap();
}

/// A worker with loopback not allowed, its `/metrics` read by the test.
async fn a_worker_that_guards_loopback(env: &TestEnv) -> Metered {
    let metrics = free_port();
    let child = env.spawn(
        "worker",
        &with_metrics_on(&webhook_env(false), metrics),
        "webhooks-ssrf-worker",
    );
    Metered { child, metrics }
}

/// The canary's delivery was refused, not sent: its error names the address.
async fn the_delivery_failed_naming_the_canary(pool: &sqlx::PgPool) {
    let error: String =
        sqlx::query_scalar("SELECT last_error FROM webhook_deliveries WHERE id = 'msg_canary'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(error.contains("127.0.0.1"), "{error}");
}

/// The worker's `/metrics` counts one refusal at send; the count.
async fn the_guard_counted_one_refusal_at_send(metrics: u16) -> f64 {
    let at_send = scrape(
        &format!("127.0.0.1:{metrics}"),
        "docstream_webhook_ssrf_rejections_total{stage=\"send\"}",
    )
    .await;
    assert_eq!(at_send, 1.0);
    at_send
}

// ---------------------------------------------------------------------------
// Secret rotation.
// ---------------------------------------------------------------------------

/// How long the rotated-out secret still signs.
const OVERLAP_S: f64 = 4.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends() {
    let env = TestEnv::new("webhooks_rotation").await;
    sign_with_secret(&env).await;
    let port = free_port();
    let receiver = a_receiver_that_answers_200().await;
    let base = webhook_env(true);
    let (api, mut children) = a_healthy_pipeline(&env, &base, port, "webhooks-rotation").await;

    let before = a_job_delivered_to(&env, &api, &receiver, "the first delivery").await;
    let new = the_secret_is_rotated_with_an_overlap(&env.pool).await;
    let during = a_job_delivered_to(&env, &api, &receiver, "the delivery during the overlap").await;
    wait_until_the_overlap_ends(&env).await;
    let after = a_job_delivered_to(&env, &api, &receiver, "the delivery after the overlap").await;
    stop(children.iter_mut()).await;

    print_who_signed(&before, &during, &after, &new);
    the_old_secret_alone_signed_before(&before, &new);
    both_secrets_signed_during_the_overlap(&during, &new);
    the_new_secret_alone_signed_after(&after, &new);
}

/// Submits a job whose webhook goes to `receiver` and waits (60 s at most,
/// as `what`) for its first receipt.
async fn a_job_delivered_to(env: &TestEnv, api: &str, receiver: &Receiver, what: &str) -> Receipt {
    let job = submit(env, api, &receiver.url).await.unwrap();
    wait_for(what, Duration::from_secs(60), || {
        let got = receiver.by_id().remove(&expected_id(job));
        async move {
            got.and_then(|r| r.into_iter().next())
                .ok_or("not yet".to_owned())
        }
    })
    .await
}

/// Rotates the tenant's secret to a new one, the old one signing beside it
/// for [`OVERLAP_S`]; the new secret.
async fn the_secret_is_rotated_with_an_overlap(pool: &sqlx::PgPool) -> String {
    let rotated = tenants::rotate_webhook_secret(pool, "default", None, OVERLAP_S)
        .await
        .unwrap();
    rotated.webhook_secret.clone()
}

/// Waits (60 s at most) until the tenant's overlap is over.
async fn wait_until_the_overlap_ends(env: &TestEnv) {
    wait_for("the overlap to end", Duration::from_secs(60), || {
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
}

/// How many signatures a receipt carries.
fn signature_count(r: &Receipt) -> usize {
    r.signatures.split(' ').count()
}

/// Prints each delivery's signatures, and which secrets verify them.
fn print_who_signed(before: &Receipt, during: &Receipt, after: &Receipt, new: &str) {
    let count = signature_count;
    eprintln!(
        "webhooks rotation test: before: {} signature(s), old {}, new {}; during: {}, old {}, new {}; after: {}, old {}, new {}",
        count(before), before.verifies_with(SECRET), before.verifies_with(new),
        count(during), during.verifies_with(SECRET), during.verifies_with(new),
        count(after), after.verifies_with(SECRET), after.verifies_with(new),
    );
}

/// Before the rotation, the old secret signs and the new one does not.
fn the_old_secret_alone_signed_before(before: &Receipt, new: &str) {
    assert!(before.verifies_with(SECRET) && !before.verifies_with(new));
}

/// During the overlap, two signatures: the old secret's and the new one's.
fn both_secrets_signed_during_the_overlap(during: &Receipt, new: &str) {
    assert_eq!(
        signature_count(during),
        2,
        "both secrets sign during the overlap"
    );
    assert!(during.verifies_with(SECRET) && during.verifies_with(new));
}

/// After the overlap, one signature: the new secret's.
fn the_new_secret_alone_signed_after(after: &Receipt, new: &str) {
    assert_eq!(signature_count(after), 1);
    assert!(after.verifies_with(new) && !after.verifies_with(SECRET));
}

// ---------------------------------------------------------------------------
// A 410 from a 6,000-character URL.
// ---------------------------------------------------------------------------

/// The long webhook URL, in characters.
const LONG_URL_CHARS: usize = 6_000;
/// Submit to recorded 410: the job's extraction, bbox refinement and one
/// attempt; the other tests give a delivery 60 s.
const RECORDED_WITHIN: Duration = Duration::from_secs(60);
/// After the 410 is recorded: retries here come at most 1 s apart
/// (DOCSTREAM_WEBHOOK_RETRY_MAX_DELAY_S) and the reapers revive a delivery
/// 1 s after it was due (the orphan threshold), so 3 s is three of either.
const QUIET: Duration = Duration::from_secs(3);
/// Attempts before the long URL's delivery would be given up.
const LONG_URL_MAX_ATTEMPTS: i32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_from_a_6000_character_url_is_recorded_once_and_never_retried() {
    let env = TestEnv::new("webhooks_long_url").await;
    sign_with_secret(&env).await;
    let port = free_port();
    let base = with(
        &webhook_env(true),
        &[(
            "DOCSTREAM_WEBHOOK_MAX_ATTEMPTS",
            LONG_URL_MAX_ATTEMPTS.to_string(),
        )],
    );
    let (api, mut children) = a_healthy_pipeline(&env, &base, port, "webhooks-long-url").await;
    let gone = a_receiver_that_answers_410().await;
    let url = a_6000_character_url_to(&gone);

    let submitted = Instant::now();
    let job = a_job_whose_webhook_goes_to(&env, &api, &url).await;
    let recorded = wait_until_the_410_is_recorded(&env.pool, job, submitted, &gone).await;
    no_request_follows_for_3_s(&gone).await;
    let after = AfterQuiet::read(&env.pool, &gone, job).await;
    stop(children.iter_mut()).await;

    print_the_long_url_figures(&recorded, &after);
    exactly_one_signed_request_got_the_whole_url(&after.receipts, &gone, job, &url);
    the_delivery_was_attempted_once_and_disabled_by_the_410(&recorded, &after);
    the_endpoint_is_recorded_under_its_whole_url(&after.endpoint, &url);
}

/// `gone`'s URL with a query of random letters and digits, which Postgres
/// cannot compress below the btree limit (2,704 bytes) the way it would a
/// run of one character, to [`LONG_URL_CHARS`] in all.
fn a_6000_character_url_to(gone: &Receiver) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mut url = format!("{}?pad=", gone.url);
    let pad = LONG_URL_CHARS - url.len();
    url.push_str(&Alphanumeric.sample_string(&mut rand::rng(), pad));
    assert_eq!(url.len(), LONG_URL_CHARS);
    url
}

/// Submits a job whose webhook goes to `url`, which must be accepted.
async fn a_job_whose_webhook_goes_to(env: &TestEnv, api: &str, url: &str) -> Uuid {
    match submit(env, api, url).await {
        Ok(job) => job,
        Err((status, answer)) => {
            panic!("a {LONG_URL_CHARS}-character webhook_url was refused: {status} {answer}")
        }
    }
}

/// The delivery when its 410 was recorded, and how soon.
struct Recorded {
    attempts: i32,
    code: Option<i32>,
    /// From the submit to the record.
    after: Duration,
    /// What the receiver had got by then.
    receipts: usize,
}

/// Waits ([`RECORDED_WITHIN`] at most) until `job`'s delivery is disabled.
async fn wait_until_the_410_is_recorded(
    pool: &sqlx::PgPool,
    job: Uuid,
    submitted: Instant,
    gone: &Receiver,
) -> Recorded {
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
    Recorded {
        attempts,
        code,
        after: submitted.elapsed(),
        receipts: gone.receipts().len(),
    }
}

/// No further request for [`QUIET`]: the receiver's count stays at one.
async fn no_request_follows_for_3_s(gone: &Receiver) {
    let quiet_began = Instant::now();
    while quiet_began.elapsed() < QUIET {
        assert_eq!(gone.receipts().len(), 1, "a request after the recorded 410");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the receiver, the delivery and the endpoints hold after the quiet.
struct AfterQuiet {
    receipts: Vec<Receipt>,
    status: String,
    attempts: i32,
    /// The one endpoint's URL, its SHA-256 and the reason.
    endpoint: (String, Vec<u8>, String),
}

impl AfterQuiet {
    /// Reads the receiver's receipts, `job`'s delivery and the endpoint.
    async fn read(pool: &sqlx::PgPool, gone: &Receiver, job: Uuid) -> Self {
        let receipts = gone.receipts();
        let (status, attempts): (String, i32) = sqlx::query_as(
            "SELECT status, attempts FROM webhook_deliveries WHERE extraction_id = $1",
        )
        .bind(job)
        .fetch_one(pool)
        .await
        .unwrap();
        let endpoint: (String, Vec<u8>, String) =
            sqlx::query_as("SELECT url, url_sha256, reason FROM webhook_endpoints")
                .fetch_one(pool)
                .await
                .unwrap();
        Self {
            receipts,
            status,
            attempts,
            endpoint,
        }
    }
}

/// Prints when the 410 was recorded and what the quiet left.
fn print_the_long_url_figures(recorded: &Recorded, after: &AfterQuiet) {
    let Recorded {
        attempts,
        code,
        after: recorded_after,
        receipts: receipts_at_record,
    } = recorded;
    let (status, attempts_after) = (&after.status, after.attempts);
    eprintln!(
        "webhook long url test: url_chars={LONG_URL_CHARS} recorded_410_after={:.2}s receipts_at_record={receipts_at_record} \
         receipts_after_{}s_quiet={} attempts={attempts} attempts_after_quiet={attempts_after} status={status} \
         last_status_code={code:?} endpoint_url_chars={} max_attempts={LONG_URL_MAX_ATTEMPTS}",
        recorded_after.as_secs_f64(),
        QUIET.as_secs(),
        after.receipts.len(),
        after.endpoint.0.len(),
    );
}

/// One request reached `gone`, answered 410, under the job's webhook-id,
/// signed, for the whole URL.
fn exactly_one_signed_request_got_the_whole_url(
    receipts: &[Receipt],
    gone: &Receiver,
    job: Uuid,
    url: &str,
) {
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
}

/// One attempt, at the record and after the quiet, and the delivery
/// disabled with the 410 as its last status.
fn the_delivery_was_attempted_once_and_disabled_by_the_410(
    recorded: &Recorded,
    after: &AfterQuiet,
) {
    assert_eq!((recorded.attempts, after.attempts), (1, 1));
    assert_eq!(after.status, "disabled");
    assert_eq!(recorded.code, Some(410));
}

/// The endpoint row holds the whole URL, its SHA-256 and the 410 as reason.
fn the_endpoint_is_recorded_under_its_whole_url(endpoint: &(String, Vec<u8>, String), url: &str) {
    use sha2::{Digest, Sha256};
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

// ---------------------------------------------------------------------------
// An endpoint disabled before the URL-hash key.
// ---------------------------------------------------------------------------

/// The first migration that keys endpoints by the URL's digest.
const URL_HASH: &str = "20261201000007";
/// The endpoint disabled before that migration.
const GONE_URL: &str = "https://gone.example/hook?ü=1";

#[tokio::test]
async fn an_endpoint_disabled_before_the_url_hash_key_stays_disabled() {
    let env = TestEnv::unmigrated("webhooks_url_hash").await;
    let pool = &env.pool;
    migrate_to_just_before_the_url_hash_key(pool).await;
    an_endpoint_disabled_by_a_410(pool, GONE_URL).await;

    docstream::store::migrate(pool).await.unwrap();
    the_endpoint_is_keyed_by_its_urls_digest(pool, GONE_URL).await;
    let indexed = no_index_holds_a_urls_text(pool).await;

    // A delivery to it is claimed as disabled, and recording it again is a no-op.
    a_delivery_to(pool, GONE_URL).await;
    the_delivery_is_claimed_as_disabled(pool).await;
    recording_the_endpoint_again_is_a_no_op(pool, GONE_URL).await;
    eprintln!("webhook url hash migration test: endpoint kept, digest matches, claim sees it disabled; indexes: {indexed:?}");
}

/// Runs the migrations before [`URL_HASH`] only.
async fn migrate_to_just_before_the_url_hash_key(pool: &sqlx::PgPool) {
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
}

/// Records `url` as an endpoint that answered 410.
async fn an_endpoint_disabled_by_a_410(pool: &sqlx::PgPool, url: &str) {
    sqlx::query("INSERT INTO webhook_endpoints (url, reason) VALUES ($1, 'answered 410 Gone')")
        .bind(url)
        .execute(pool)
        .await
        .unwrap();
}

/// The endpoint's `url_sha256` is the SHA-256 of its URL.
async fn the_endpoint_is_keyed_by_its_urls_digest(pool: &sqlx::PgPool, url: &str) {
    use sha2::{Digest, Sha256};
    let digest: Vec<u8> =
        sqlx::query_scalar("SELECT url_sha256 FROM webhook_endpoints WHERE url = $1")
            .bind(url)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(digest, Sha256::digest(url.as_bytes()).to_vec());
}

/// No index of the webhook tables is on a URL's text; their definitions.
async fn no_index_holds_a_urls_text(pool: &sqlx::PgPool) -> Vec<String> {
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
    indexed
}

/// A job, and its delivery `msg_gone` to `url`.
async fn a_delivery_to(pool: &sqlx::PgPool, url: &str) {
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
}

/// Claiming `msg_gone` finds it due and unheld, its endpoint disabled.
async fn the_delivery_is_claimed_as_disabled(pool: &sqlx::PgPool) {
    let claimed = docstream::store::webhooks::claim(pool, "msg_gone", 10.0)
        .await
        .unwrap()
        .expect("due and unheld");
    assert!(claimed.endpoint_disabled);
}

/// Disabling `url` again (for `msg_gone`'s tenant) reports it was recorded
/// already.
async fn recording_the_endpoint_again_is_a_no_op(pool: &sqlx::PgPool, url: &str) {
    let delivery = sqlx::query_as::<_, docstream::store::webhooks::Delivery>(
        "SELECT * FROM webhook_deliveries WHERE id = 'msg_gone'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(delivery.url, url);
    let again = docstream::store::webhooks::disable_endpoint(pool, &delivery, "again")
        .await
        .unwrap();
    assert!(!again, "the endpoint was recorded already");
}

// ---------------------------------------------------------------------------
// Attempts that never record an outcome.
// ---------------------------------------------------------------------------

/// Attempts before the unrecorded delivery is given up.
const UNRECORDED_MAX_ATTEMPTS: i32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_that_never_record_an_outcome_still_count_and_the_delivery_is_given_up() {
    let env = TestEnv::new("webhooks_unrecorded").await;
    let port = free_port();
    let receiver = a_receiver_that_answers_200().await;
    let base = every_attempt_abandoned_before_its_request();
    let (api, mut children) = a_healthy_pipeline(&env, &base, port, "webhooks-unrecorded").await;
    submit(&env, &api, &receiver.url).await.unwrap();
    wait_delivered(&env.pool, "failed", 1, Duration::from_secs(90)).await;
    let (attempts, error) = the_claim_past_the_maximum_gave_up(&env.pool).await;
    assert_eq!(receiver.receipts().len(), 0);
    eprintln!("webhook unrecorded attempts: given up at attempt {attempts}: {error:?}");
    stop(&mut children).await;
}

/// Every attempt is claimed and then abandoned before its request, as a
/// dispatcher that fails to record its outcome leaves it: only the reaper
/// brings the delivery back.
fn every_attempt_abandoned_before_its_request() -> Vec<(&'static str, String)> {
    with(
        &webhook_env(true),
        &[
            ("DOCSTREAM_WEBHOOK_TIMEOUT_S", "0.5".to_owned()),
            ("DOCSTREAM_WEBHOOK_ORPHAN_THRESHOLD_S", "0.5".to_owned()),
            (
                "DOCSTREAM_WEBHOOK_MAX_ATTEMPTS",
                UNRECORDED_MAX_ATTEMPTS.to_string(),
            ),
            (
                "DOCSTREAM_FAILPOINTS",
                "webhook.before_send=error".to_owned(),
            ),
        ],
    )
}

/// The delivery counted one attempt past the maximum, the claim that gave
/// up, and says so; its attempts and last error.
async fn the_claim_past_the_maximum_gave_up(pool: &sqlx::PgPool) -> (i32, Option<String>) {
    let (attempts, error): (i32, Option<String>) =
        sqlx::query_as("SELECT attempts, last_error FROM webhook_deliveries")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        UNRECORDED_MAX_ATTEMPTS + 1,
        "the claim past the maximum gives up"
    );
    assert!(
        error
            .as_deref()
            .unwrap_or_default()
            .starts_with("gave up after 3 attempts"),
        "{error:?}"
    );
    (attempts, error)
}

// ---------------------------------------------------------------------------
// One tenant's tarpit does not hold up another tenant's deliveries.
// ---------------------------------------------------------------------------

/// Jobs of the tarpit's tenant: more than a process's attempts at once (32).
const TARPIT_JOBS: usize = 40;
/// How late another tenant's delivery may be while a tarpit holds its share.
const FAIR_BOUND: Duration = Duration::from_secs(3);

/// An endpoint that accepts connections and never answers: each attempt to
/// it holds its slot for the whole webhook timeout. Its URL, and how many
/// connections it has taken.
async fn a_tarpit() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (url, accepted)
}

/// The default tenant's 40 webhooks go to a tarpit (a 10 s webhook timeout,
/// so each attempt holds its slot 10 s); once all 40 deliveries are due,
/// tenant `other` submits one job whose webhook goes to a receiver that
/// answers 200. It is delivered within [`FAIR_BOUND`] of the submit, and the
/// tarpit holds only the tenant's share of the bbox worker's attempts. With
/// one pool of 32 slots for everyone, the tarpit held all 32 and the other
/// tenant's delivery waited for the first of them to time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_whose_endpoint_is_a_tarpit_does_not_delay_another_tenants_deliveries() {
    let env = TestEnv::new("webhooks_fair").await;
    // The waiting deliveries are not orphans within the test (the reapers of
    // the other processes would attempt them too: a share is per process).
    let timeout = [
        ("DOCSTREAM_WEBHOOK_TIMEOUT_S", "10".to_owned()),
        ("DOCSTREAM_WEBHOOK_ORPHAN_THRESHOLD_S", "30".to_owned()),
    ];
    let base = with(&webhook_env(true), &timeout);
    let (api, mut children) = a_healthy_pipeline(&env, &base, free_port(), "webhooks-fair").await;
    let (tarpit, accepted) = a_tarpit().await;
    jobs_to(&env, &api, &tarpit, TARPIT_JOBS).await;
    let all_due = "SELECT count(*) FROM webhook_deliveries";
    let due = Duration::from_secs(60);
    common::wait_count(
        &env.pool,
        "the tarpit's deliveries",
        all_due,
        TARPIT_JOBS as i64,
        due,
    )
    .await;
    wait_for("the tarpit's first attempts", due, || {
        let accepted = accepted.clone();
        let started = accepted.load(Ordering::SeqCst);
        async move {
            (started >= 4)
                .then_some(())
                .ok_or(format!("{started} attempts"))
        }
    })
    .await;

    let other = tenants::create_tenant(&env.pool, "other").await.unwrap();
    let receiver = a_receiver_that_answers_200().await;
    let mut body = sample_body(0);
    body["webhook_url"] = json!(receiver.url);
    let submitted = Instant::now();
    let answer = common::http_client()
        .post(format!("{api}/v1/extractions"))
        .bearer_auth(&other.key.api_key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202);
    wait_for(
        "the other tenant's delivery",
        Duration::from_secs(30),
        || {
            let delivered = !receiver.receipts().is_empty();
            async move { delivered.then_some(()).ok_or("not yet".to_owned()) }
        },
    )
    .await;
    let took = submitted.elapsed();
    let held = accepted.load(Ordering::SeqCst);
    stop(children.iter_mut()).await;
    println!("webhooks: another tenant's delivery {took:?} after its submit; the tarpit held {held} attempts");
    assert!(took <= FAIR_BOUND, "delivered {took:?} after the submit");
    assert!(
        held <= 4,
        "the tarpit's tenant held {held} attempts at once, past its share"
    );
}

// ---------------------------------------------------------------------------
// Review: a correction is stored beside the value, logged, published and
// delivered as an event of its own.
// ---------------------------------------------------------------------------

/// A person with the `review` scope corrects a value of a succeeded job:
/// the result keeps the extracted value, the correction is listed beside it
/// with who made it, the transition `correct_field` is logged, the events
/// topic carries which field was corrected (never the value), and the
/// job's webhook gets `extraction.field_corrected`, signed, once. A key
/// without the scope, a field the request did not name and a value that is
/// not text are refused; erasing the job erases its corrections, and no
/// record of any topic docstream writes holds a value the job ever had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_is_stored_beside_the_value_logged_published_and_delivered() {
    let env = TestEnv::new("webhooks_correction").await;
    sign_with_secret(&env).await;
    let receiver = a_receiver_that_answers_200().await;
    let port = free_port();
    let (api, _children) = a_healthy_pipeline(&env, &webhook_env(true), port, "correction").await;
    let job = submit(&env, &api, &receiver.url).await.unwrap();
    wait_delivered(&env.pool, "delivered", 1, Duration::from_secs(60)).await;
    let read = |key: Option<String>| {
        let mut get = env.client().get(format!("{api}/v1/extractions/{job}"));
        if let Some(key) = key {
            get = get.bearer_auth(key);
        }
        async move { get.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let extracted = read(None).await["result"]["fields"]["total"].clone();
    assert!(extracted["value"].is_string(), "{extracted}");

    let reviewer = tenants::create_key(
        &env.pool,
        "default",
        &[
            docstream::domain::Scope::Read,
            docstream::domain::Scope::Review,
            docstream::domain::Scope::Delete,
        ],
    )
    .await
    .unwrap();
    let correct = |key: &str, field: &str, body: Value| {
        let post = env
            .client()
            .post(format!(
                "{api}/v1/extractions/{job}/fields/{field}/corrections"
            ))
            .bearer_auth(key)
            .json(&body);
        async move {
            let response = post.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, _) = correct(&env.api_key, "total", json!({"value": "999.00"})).await;
    assert_eq!(status, 403, "the submitting key has no review scope");
    let (status, body) = correct(&reviewer.api_key, "nope", json!({"value": "1"})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = correct(&reviewer.api_key, "total", json!({"value": 5})).await;
    assert_eq!(status, 422, "{body}");
    // A value found nowhere else, to look for on every topic afterwards.
    let secret = format!("999.00-{}", Uuid::new_v4().simple());
    let (status, made) = correct(
        &reviewer.api_key,
        "total",
        json!({"value": secret, "reviewer": "Ada"}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        (&made["field"], &made["value"], &made["reviewer"]),
        (&json!("total"), &json!(secret), &json!("Ada"))
    );
    assert_eq!(made["key_id"], json!(reviewer.key_id.to_string()));

    // Beside the value, never over it.
    assert_eq!(read(None).await["result"]["fields"]["total"], extracted);
    let listed: Value = env
        .client()
        .get(format!("{api}/v1/extractions/{job}/corrections"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let log: Value = env
        .client()
        .get(format!("{api}/v1/extractions/{job}/transitions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let corrected = (log.as_array().unwrap().iter())
        .filter(|t| t["transition"] == "correct_field")
        .count();
    assert_eq!(corrected, 1, "{log}");

    // Announced to the webhook, under an id of its own, once.
    wait_delivered(&env.pool, "delivered", 2, Duration::from_secs(60)).await;
    let id = format!("msg_{}_corrected_{}", job.simple(), made["id"]);
    let by_id = receiver.by_id();
    let receipts = by_id.get(&id).unwrap_or_else(|| panic!("{id}: {by_id:?}"));
    assert_eq!(receipts.len(), 1);
    assert!(receipts[0].signed);
    let data = &receipts[0].body["data"];
    assert_eq!(receipts[0].body["type"], "extraction.field_corrected");
    assert_eq!(
        (&data["field"], &data["value"]),
        (&json!("total"), &json!(secret))
    );
    assert_eq!(data["extracted"], extracted);

    // And on the events topic, so on the export stream.
    let topic = env.topic("extraction.events");
    let events = common::read_topic_as(&env.settings.kafka_brokers, &topic, |m| {
        use rdkafka::Message;
        docstream::events::decode::<docstream::events::ExtractionEvent>(m.payload().unwrap())
            .unwrap()
    });
    let announced: Vec<_> = (events.iter())
        .filter(|e| e.transition == "correct_field")
        .collect();
    assert_eq!(announced.len(), 1, "{events:?}");
    let correction = announced[0].correction.as_ref().unwrap();
    assert_eq!(correction.field, "total");
    assert_eq!(correction.value, None, "the value stays off Kafka");
    assert_eq!(correction.reviewer.as_deref(), Some("Ada"));

    // Erasing the job erases its corrections.
    let erased = env
        .client()
        .delete(format!("{api}/v1/extractions/{job}"))
        .bearer_auth(&reviewer.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), StatusCode::NO_CONTENT);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM field_corrections")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    let extracted = extracted["value"].as_str().unwrap().to_owned();
    let found = records_holding(&env, &[&secret, &extracted]);
    assert!(
        found.is_empty(),
        "values of an erased job on Kafka: {found:?}"
    );
}

/// Every record of every topic of the test's (all docstream wrote) that
/// holds one of `values`: its topic and offset.
fn records_holding(env: &TestEnv, values: &[&str]) -> Vec<(String, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let brokers = &env.settings.kafka_brokers;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    let prefix = env.topic("");
    let topics: Vec<String> = (metadata.topics().iter())
        .map(|t| t.name().to_owned())
        .filter(|name| name.starts_with(&prefix))
        .collect();
    assert!(
        topics.contains(&env.topic("extraction.events")),
        "{topics:?}"
    );
    let mut found = Vec::new();
    for topic in topics {
        let records = common::read_topic_as(brokers, &topic, |m| {
            let bytes = [m.key().unwrap_or_default(), m.payload().unwrap_or_default()].concat();
            (m.offset(), bytes)
        });
        for (offset, bytes) in records {
            let holds = |value: &&str| bytes.windows(value.len()).any(|w| w == value.as_bytes());
            if values.iter().any(holds) {
                found.push((topic.clone(), offset));
            }
        }
    }
    found
}

/// An erase while a correction's statement runs: the correction took the
/// job's row first, so the erase waits for it and then deletes it and its
/// webhook delivery. A trigger of the test's own holds the correction's
/// insert after its statement began, and the erase is sent once Postgres
/// shows it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_racing_a_correction_leaves_neither_the_correction_nor_its_delivery() {
    let env = TestEnv::new("webhooks_erase_race").await;
    sign_with_secret(&env).await;
    let receiver = a_receiver_that_answers_200().await;
    let port = free_port();
    let (api, _children) = a_healthy_pipeline(&env, &webhook_env(true), port, "erase_race").await;
    let job = submit(&env, &api, &receiver.url).await.unwrap();
    wait_delivered(&env.pool, "delivered", 1, Duration::from_secs(60)).await;
    let pool = &env.pool;
    wait_for(
        "the job's bbox refinement to end",
        Duration::from_secs(60),
        || async move {
            let bbox: Option<String> =
                sqlx::query_scalar("SELECT bbox_status::text FROM extractions WHERE id = $1")
                    .bind(job)
                    .fetch_one(pool)
                    .await
                    .unwrap();
            match bbox.as_deref() {
                None | Some("succeeded" | "failed") => Ok(()),
                Some(other) => Err(other.to_owned()),
            }
        },
    )
    .await;
    sqlx::raw_sql(
        "CREATE FUNCTION held_correction() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
         CREATE TRIGGER held_correction BEFORE INSERT ON field_corrections
           FOR EACH ROW EXECUTE FUNCTION held_correction();",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let reviewer = tenants::create_key(
        &env.pool,
        "default",
        &[
            docstream::domain::Scope::Review,
            docstream::domain::Scope::Delete,
        ],
    )
    .await
    .unwrap();
    let correct = env
        .client()
        .post(format!(
            "{api}/v1/extractions/{job}/fields/total/corrections"
        ))
        .bearer_auth(&reviewer.api_key)
        .json(&json!({"value": "racing"}))
        .send();
    let correct = tokio::spawn(correct);
    let started = Instant::now();
    loop {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()
                AND state = 'active' AND query LIKE '%INSERT INTO field_corrections%'",
        )
        .fetch_one(&env.pool)
        .await
        .unwrap();
        if held > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the correction never ran"
        );
        tokio::task::yield_now().await;
    }
    let erased = env
        .client()
        .delete(format!("{api}/v1/extractions/{job}"))
        .bearer_auth(&reviewer.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), StatusCode::NO_CONTENT);
    let corrected = correct.await.unwrap().unwrap();
    assert_eq!(corrected.status(), StatusCode::CREATED, "it went first");
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM field_corrections WHERE extraction_id = $1),
                (SELECT count(*) FROM webhook_deliveries WHERE extraction_id = $1)",
    )
    .bind(job)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        (0, 0),
        "corrections and deliveries left after the erase"
    );
}

/// Corrections are bounded: a field takes at most its cap, a job its own,
/// a key its rate (429 with `Retry-After`), and their bytes count toward
/// the tenant's storage quota, past which one is refused. The listing
/// comes a page at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrections_are_capped_rated_counted_and_paged() {
    let env = TestEnv::new("webhooks_correction_caps").await;
    let port = free_port();
    let limits = [
        ("DOCSTREAM_MAX_CORRECTIONS_PER_FIELD", "3".to_owned()),
        ("DOCSTREAM_MAX_CORRECTIONS_PER_JOB", "5".to_owned()),
        ("DOCSTREAM_CORRECTIONS_PER_KEY_PER_MIN", "120".to_owned()),
        ("DOCSTREAM_TENANT_MAX_FILE_BYTES", "1000".to_owned()),
    ];
    let base = with(&webhook_env(true), &limits);
    let (api, _children) = a_healthy_pipeline(&env, &base, port, "correction_caps").await;
    let succeeded = |job: Uuid| {
        let (client, api) = (env.client(), api.clone());
        async move {
            wait_for("the job to succeed", Duration::from_secs(60), || {
                let get = client.get(format!("{api}/v1/extractions/{job}")).send();
                async move {
                    let job: Value = get.await.map_err(|e| e.to_string())?.json().await.unwrap();
                    (job["status"] == "succeeded")
                        .then_some(())
                        .ok_or(job.to_string())
                }
            })
            .await
        }
    };
    let scopes = [
        docstream::domain::Scope::Read,
        docstream::domain::Scope::Review,
    ];
    let reviewer = tenants::create_key(&env.pool, "default", &scopes)
        .await
        .unwrap();
    let correct = |key: String, job: Uuid, field: &'static str, value: String| {
        let post = env
            .client()
            .post(format!(
                "{api}/v1/extractions/{job}/fields/{field}/corrections"
            ))
            .bearer_auth(key)
            .json(&json!({"value": value}));
        async move {
            let response = post.send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").is_some();
            let body = response.json::<Value>().await.unwrap_or(Value::Null);
            (status, body, retry_after)
        }
    };
    let submit = || {
        let post = env
            .client()
            .post(format!("{api}/v1/extractions"))
            .json(&sample_body(0));
        async move {
            let accepted: Value = post.send().await.unwrap().json().await.unwrap();
            accepted["id"].as_str().unwrap().parse::<Uuid>().unwrap()
        }
    };
    let job = submit().await;
    succeeded(job).await;
    let key = || reviewer.api_key.clone();

    // The field's cap, then the job's.
    for n in 0..3 {
        let (status, body, _) = correct(key(), job, "total", format!("1{n}.00")).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body, _) = correct(key(), job, "total", "13.00".into()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.to_string()
            .contains("DOCSTREAM_MAX_CORRECTIONS_PER_FIELD"),
        "{body}"
    );
    for field in ["tax", "subtotal"] {
        let (status, body, _) = correct(key(), job, field, "1.00".into()).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body, _) = correct(key(), job, "iban", "DE00".into()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.to_string()
            .contains("DOCSTREAM_MAX_CORRECTIONS_PER_JOB"),
        "{body}"
    );

    // A page at a time.
    let list = |query: &str| {
        let get = env
            .client()
            .get(format!("{api}/v1/extractions/{job}/corrections?{query}"))
            .bearer_auth(reviewer.api_key.clone())
            .send();
        async move {
            let response = get.await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, all) = list("").await;
    assert_eq!((status, all.as_array().unwrap().len()), (200, 5), "{all}");
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = list(&format!("after={after}&limit=2")).await;
        assert_eq!(status, 200, "{page}");
        let page = page.as_array().unwrap().clone();
        pages.push(page.len());
        match page.last() {
            Some(last) if page.len() == 2 => after = last["id"].as_i64().unwrap(),
            _ => break,
        }
    }
    assert_eq!(pages, [2, 2, 1]);
    for refused in ["limit=0", "limit=1001", "after=-1", "page=2"] {
        let (status, body) = list(refused).await;
        assert_eq!(status, 400, "{refused}: {body}");
    }

    // The bytes count toward the quota (1000 bytes; no file here).
    let tenant = docstream::store::tenants::DEFAULT_TENANT_ID;
    let stored = docstream::store::files::stored_bytes(&env.pool, tenant)
        .await
        .unwrap();
    assert_eq!(stored, 3 * 5 + 2 * 4, "the five values' bytes");
    let second = submit().await;
    succeeded(second).await;
    let (status, body, _) = correct(key(), second, "total", "x".repeat(900)).await;
    assert_eq!(status, 201, "{body}");
    let (status, body, retry_after) = correct(key(), second, "tax", "y".repeat(100)).await;
    assert_eq!((status, retry_after), (429, true), "{body}");
    assert!(body.to_string().contains("quota of 1000 bytes"), "{body}");

    // A key's rate: 120 a minute, a burst of 12, whatever the answers.
    let other = tenants::create_key(&env.pool, "default", &scopes)
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let (status, _, retry_after) =
            correct(other.api_key.clone(), job, "nope", "1".into()).await;
        assert_eq!(retry_after, status == 429);
        statuses.push(status);
    }
    assert_eq!(statuses[..12], [422; 12], "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    // Another key's rate is its own.
    let (status, body, _) = correct(key(), job, "nope", "1".into()).await;
    assert_eq!(status, 422, "{body}");
}
