//! External extractors with real worker processes on the real broker and
//! database, against a provider that lives in the test and records every call
//! it sees (`common::provider`): long calls under short leases, the
//! concurrency cap and the rate limit across two workers, 429/503 with and
//! without `Retry-After`, calls that hang past their timeout, permanent
//! failures, a cancel during a call, a SIGTERM during calls, and the two
//! providers the project ships (`docstream extractor-serve` and the Python
//! example).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::provider::{Call, FakeProvider, Plan};
use common::{
    count, free_port, sample_body, scrape, signal, stop, wait_count, wait_for, wins, TestEnv,
};
use docstream::config::{ExtractorSettings, Settings};
use docstream::events::{decode, ExtractionSubmitted};
use docstream::pipeline::Services;
use docstream::store::{self, NewExtraction, SubmitError};
use uuid::Uuid;

const SUCCEEDED: &str = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";
const FINISHED: &str =
    "SELECT count(*) FROM extractions WHERE status IN ('succeeded', 'failed', 'cancelled')";

/// Registers extractor `name` at `url` in the test's settings, which the
/// in-process submit path checks and `TestEnv::spawn` hands to children.
fn add_extractor(
    settings: &mut Settings,
    name: &str,
    url: &str,
    adjust: impl FnOnce(&mut ExtractorSettings),
) {
    let mut extractor = ExtractorSettings {
        url: url.to_owned(),
        ..ExtractorSettings::default()
    };
    adjust(&mut extractor);
    settings.extractors.insert(name.to_owned(), extractor);
}

/// Submits `n` sample jobs for `extractor` through the submit path, with
/// `metadata` in each (which the fake provider may read).
async fn submit_for(
    services: &Services,
    n: usize,
    extractor: &str,
    metadata: serde_json::Value,
) -> Vec<Uuid> {
    common::submit_bodies(services, n, |i| {
        let mut body = sample_body(i);
        body["extractor"] = extractor.into();
        body["metadata"] = metadata.clone();
        body
    })
    .await
}

/// Waits until `n` jobs succeeded.
async fn wait_succeeded(env: &TestEnv, n: i64, timeout_s: u64) {
    let timeout = Duration::from_secs(timeout_s);
    wait_count(&env.pool, "jobs to succeed", SUCCEEDED, n, timeout).await;
}

/// A worker with its metrics on a port of its own: (process, metrics address).
fn worker_with_metrics(env: &TestEnv, log_name: &str) -> (tokio::process::Child, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let env_vars = [("DOCSTREAM_METRICS_ADDR", metrics.clone())];
    (env.spawn("worker", &env_vars, log_name), metrics)
}

/// The calls the provider saw, by job, in arrival order.
fn calls_by_job(calls: &[Call]) -> HashMap<Uuid, Vec<Call>> {
    let mut by_job: HashMap<Uuid, Vec<Call>> = HashMap::new();
    for call in calls {
        by_job.entry(call.job_id).or_default().push(call.clone());
    }
    by_job
}

/// Each job's `attempts` column.
async fn attempts(pool: &sqlx::PgPool) -> HashMap<Uuid, i32> {
    let rows: Vec<(Uuid, i32)> = sqlx::query_as("SELECT id, attempts FROM extractions")
        .fetch_all(pool)
        .await
        .unwrap();
    rows.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_three_times_longer_than_the_lease_keep_their_claims() {
    const JOBS: usize = 12;
    let provider = FakeProvider::start(|_, _| Plan::ok(Duration::from_secs(3))).await;
    let env = TestEnv::with_settings("extractor_slow", |s| {
        s.extraction_run_lease_s = common::secs(1.0);
        s.heartbeat_interval_s = common::secs(0.3);
        add_extractor(s, "slow", &provider.url(), |e| {
            e.max_concurrency = JOBS;
            e.token = "sesame".into();
        });
    })
    .await;
    let services = env.services().await;
    let (mut worker, metrics) = worker_with_metrics(&env, "extractor-slow-worker");
    let ids = submit_for(&services, JOBS, "slow", serde_json::Value::Null).await;
    wait_succeeded(&env, JOBS as i64, 90).await;

    let calls = provider.calls();
    let stale = scrape(&metrics, "docstream_stale_completions_total").await;
    let running = wins(&env.pool, "mark_running").await;
    let succeeded = wins(&env.pool, "mark_succeeded").await;
    let longest = calls
        .iter()
        .filter_map(|c| Some(c.ended? - c.started))
        .max()
        .unwrap();
    eprintln!(
        "slow: jobs={JOBS} calls={} longest_call={:.2}s lease=1s heartbeat=0.3s stale={stale}",
        calls.len(),
        longest.as_secs_f64()
    );
    assert!(
        longest >= Duration::from_secs(3),
        "calls outlasted the lease"
    );
    common::assert_exactly_once(&running, &ids, "mark_running (a claim taken over)");
    common::assert_exactly_once(&succeeded, &ids, "mark_succeeded");
    let made = scrape(&metrics, "docstream_extractor_calls_total").await;
    assert_eq!(made, JOBS as f64, "the worker's metrics were read");
    assert_eq!(stale, 0.0, "no holder was fenced out");
    assert_eq!(calls.len(), JOBS, "one call per job");
    for call in &calls {
        assert_eq!(call.attempt, 1);
        assert_eq!(
            call.idempotency_key.as_deref(),
            Some(format!("{}:1", call.job_id).as_str())
        );
        let trace = call.traceparent.as_deref().unwrap();
        assert!(
            trace.starts_with(&format!("00-{}-", call.job_id.simple())),
            "{trace}"
        );
        assert_eq!(call.authorization.as_deref(), Some("Bearer sesame"));
        assert_eq!(call.status, Some(200));
    }
    stop([&mut worker]).await;
}

/// Most calls that started within any window of `window` (by arrival).
fn busiest_window(calls: &[Call], window: Duration) -> usize {
    let mut starts: Vec<Instant> = calls.iter().map(|c| c.started).collect();
    starts.sort();
    (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|&&t| t - starts[i] < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_and_the_rate_hold_across_two_workers() {
    const CAP: usize = 4;
    const RATE: f64 = 10.0;
    let capped = FakeProvider::start(|_, _| Plan::ok(Duration::from_millis(200))).await;
    let limited = FakeProvider::start(|_, _| Plan::ok(Duration::from_millis(20))).await;
    let warmup = FakeProvider::start(|_, _| Plan::ok(Duration::ZERO)).await;
    let env = TestEnv::with_settings("extractor_limits", |s| {
        add_extractor(s, "warmup", &warmup.url(), |_| {});
        add_extractor(s, "capped", &capped.url(), |e| e.max_concurrency = CAP);
        add_extractor(s, "limited", &limited.url(), |e| {
            e.max_concurrency = 16;
            e.requests_per_second = RATE;
        });
    })
    .await;
    let services = env.services().await;
    let (mut workers, metrics): (Vec<_>, Vec<_>) = (0..2)
        .map(|i| worker_with_metrics(&env, &format!("extractor-limits-worker-{i}")))
        .unzip();

    // Both workers hold partitions once each has called the warm-up extractor.
    wait_for("both workers to call", Duration::from_secs(90), || {
        let (services, metrics) = (&services, &metrics);
        async move {
            submit_for(services, 6, "warmup", serde_json::Value::Null).await;
            let mut calling = 0;
            for addr in metrics {
                let calls =
                    scrape(addr, "docstream_extractor_calls_total{extractor=\"warmup\"").await;
                calling += usize::from(calls > 0.0);
            }
            match calling {
                2 => Ok(()),
                n => Err(format!("{n} workers called")),
            }
        }
    })
    .await;
    let warmed_up = count(&env.pool, "SELECT count(*) FROM extractions").await;

    // The cap: 200 jobs of 200 ms each could run 200 at once.
    submit_for(&services, 200, "capped", serde_json::Value::Null).await;
    wait_succeeded(&env, warmed_up + 200, 120).await;
    let peak = capped.max_concurrency();
    let mut cap_gauges = 0.0;
    for addr in &metrics {
        cap_gauges += scrape(
            addr,
            "docstream_extractor_max_concurrency{extractor=\"capped\"}",
        )
        .await;
    }

    // The rate: 100 jobs the provider could answer in well under a second.
    submit_for(&services, 100, "limited", serde_json::Value::Null).await;
    wait_succeeded(&env, warmed_up + 300, 120).await;
    let calls = limited.calls();
    let first = calls.iter().map(|c| c.started).min().unwrap();
    let last = calls.iter().map(|c| c.started).max().unwrap();
    let span = (last - first).as_secs_f64();
    let overall = (calls.len() - 1) as f64 / span;
    let busiest = busiest_window(&calls, Duration::from_secs(2));
    let workers_busy: usize = {
        let mut busy = 0;
        for addr in &metrics {
            let calls = scrape(
                addr,
                "docstream_extractor_calls_total{extractor=\"limited\"",
            )
            .await;
            busy += usize::from(calls > 0.0);
        }
        busy
    };
    eprintln!(
        "limits: capped peak={peak} (2 workers x cap {CAP}); limited calls={} span={span:.2}s \
         overall={overall:.1}/s busiest_2s_window={busiest} (limit 2 x {RATE}/s); workers calling={workers_busy}",
        calls.len()
    );
    assert!(peak <= 2 * CAP, "the provider saw {peak} calls at once");
    assert!(peak > CAP, "both workers called at once (peak {peak})");
    assert_eq!(cap_gauges, (2 * CAP) as f64);
    assert_eq!(workers_busy, 2, "both workers called the limited extractor");
    assert_eq!(calls.len(), 100);
    // Two workers at RATE each start at most 2 × 2 s × RATE calls in two
    // seconds. Arrivals lag starts: a call started just before the window may
    // arrive inside it, and a stall of the machine can bunch a second one, so
    // two per worker are allowed. Without the limit, all 100 arrive in well
    // under a second.
    assert!(
        busiest <= 2 * (2 * RATE as usize + 2),
        "{busiest} calls in 2 s"
    );
    assert!(overall <= 2.0 * RATE * 1.05, "{overall:.1} calls/s overall");
    stop(workers.iter_mut()).await;
}

/// A pseudo-random number in 0..100 for a call, the same on every run.
fn roll(call: usize) -> u64 {
    let mut x = call as u64 + 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) % 100
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_provider_costs_attempts_only_for_its_failures() {
    const JOBS: usize = 60;
    // 30% answer 503 without Retry-After (an attempt spent), 10% 429 with
    // Retry-After: 1 (a wait within the attempt), the rest succeed.
    let provider = FakeProvider::start(|n, _| match roll(n) {
        0..30 => Plan::status(503, r#"{"error": "warming up"}"#),
        30..40 => Plan::retry_after(429, 1),
        _ => Plan::ok(Duration::from_millis(20)),
    })
    .await;
    let env = TestEnv::with_settings("extractor_flaky", |s| {
        s.max_attempts = 12;
        s.retry_base_delay_s = common::secs(0.1);
        s.retry_max_delay_s = common::secs(0.5);
        add_extractor(s, "flaky", &provider.url(), |e| e.max_concurrency = 16);
    })
    .await;
    let services = env.services().await;
    let (mut worker, metrics) = worker_with_metrics(&env, "extractor-flaky-worker");
    let ids = submit_for(&services, JOBS, "flaky", serde_json::Value::Null).await;
    wait_succeeded(&env, JOBS as i64, 120).await;

    let calls = provider.calls();
    let by_job = calls_by_job(&calls);
    let attempts = attempts(&env.pool).await;
    let (mut unavailable, mut throttled, mut shortest_wait) = (0, 0, Duration::MAX);
    for id in &ids {
        let job_calls = &by_job[id];
        let failures = job_calls.iter().filter(|c| c.status == Some(503)).count();
        assert_eq!(
            attempts[id] as usize,
            1 + failures,
            "{id}: attempts are spent on the 503s only: {job_calls:?}"
        );
        for pair in job_calls.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            match before.status {
                Some(429) => {
                    throttled += 1;
                    assert_eq!(after.attempt, before.attempt, "a 429 spends no attempt");
                    assert_eq!(after.idempotency_key, before.idempotency_key);
                    let waited = after.started - before.ended.unwrap();
                    shortest_wait = shortest_wait.min(waited);
                }
                Some(503) => {
                    unavailable += 1;
                    assert_eq!(after.attempt, before.attempt + 1, "a 503 spends one");
                }
                other => panic!("{id}: a call after {other:?}"),
            }
        }
        assert_eq!(job_calls.last().unwrap().status, Some(200));
    }
    let honoured = scrape(&metrics, "docstream_extractor_retry_after_seconds_total").await;
    eprintln!(
        "flaky: jobs={JOBS} calls={} 503s={unavailable} 429s={throttled} \
         shortest_wait_after_429={:.3}s retry_after_seconds_total={honoured}",
        calls.len(),
        shortest_wait.as_secs_f64()
    );
    assert!(
        unavailable > 0 && throttled > 0,
        "both kinds of answer happened"
    );
    assert!(
        shortest_wait >= Duration::from_millis(950),
        "Retry-After was honoured"
    );
    assert_eq!(honoured, throttled as f64);
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &ids,
        "mark_succeeded",
    );
    stop([&mut worker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_hangs_past_its_timeout_is_retried_then_given_up() {
    let provider = FakeProvider::start(|_, _| Plan::Hang).await;
    let env = TestEnv::with_settings("extractor_hang", |s| {
        s.max_attempts = 3;
        s.retry_base_delay_s = common::secs(0.1);
        s.retry_max_delay_s = common::secs(0.2);
        add_extractor(s, "hangs", &provider.url(), |e| e.timeout_s = 1.0);
    })
    .await;
    let services = env.services().await;
    let mut worker = env.spawn("worker", &[], "extractor-hang-worker");
    let ids = submit_for(&services, 2, "hangs", serde_json::Value::Null).await;
    wait_count(
        &env.pool,
        "both jobs to finish",
        FINISHED,
        2,
        Duration::from_secs(60),
    )
    .await;

    let calls = provider.calls();
    for id in &ids {
        let row = store::get(&env.pool, *id).await.unwrap().unwrap();
        let error = row.error.unwrap_or_default();
        eprintln!(
            "hang: {id} {} attempts={} error={error:?}",
            row.status, row.attempts
        );
        assert_eq!((row.status.as_str(), row.attempts), ("failed", 3));
        assert!(error.contains("timed out after 1 s"), "{error}");
        assert!(error.contains("gave up after 3 attempts"), "{error}");
        let job_calls: Vec<&Call> = calls.iter().filter(|c| c.job_id == *id).collect();
        let attempts: Vec<i64> = job_calls.iter().map(|c| c.attempt).collect();
        assert_eq!(attempts, [1, 2, 3]);
        assert!(
            job_calls.iter().all(|c| c.closed_by_client),
            "each call was closed at its timeout"
        );
    }
    stop([&mut worker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_broken_answers_fail_the_job_at_once() {
    let provider = FakeProvider::start(|_, body| {
        match body["metadata"]["case"].as_str().unwrap_or_default() {
            "refused" => Plan::status(422, r#"{"error": "page 2 is not an invoice"}"#),
            "garbage" => Plan::status(200, "<html>upstream proxy error</html>"),
            "deferred" => Plan::status(202, ""),
            "out_of_range" => Plan::status(
                200,
                r#"{"fields": {"invoice_number": {"value": "X", "words": [0, 100000]}}}"#,
            ),
            other => panic!("no case {other:?}"),
        }
    })
    .await;
    let env = TestEnv::with_settings("extractor_permanent", |s| {
        add_extractor(s, "model", &provider.url(), |_| {});
    })
    .await;
    let services = env.services().await;

    // An extractor the deployment does not have is refused before anything is written.
    let mut body = sample_body(0);
    body["extractor"] = "nope".into();
    let new = NewExtraction {
        id: Uuid::new_v4(),
        tenant_id: docstream::store::tenants::DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: None,
        request: serde_json::from_value(body).unwrap(),
    };
    let refused = docstream::pipeline::submit(&services, new).await;
    assert!(
        matches!(&refused, Err(SubmitError::UnknownExtractor(name)) if name == "nope"),
        "{:?}",
        refused.err()
    );
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM extractions").await,
        0
    );

    let mut worker = env.spawn("worker", &[], "extractor-permanent-worker");
    let mut cases = BTreeMap::new();
    for case in ["refused", "garbage", "out_of_range", "deferred"] {
        let id = submit_for(&services, 1, "model", serde_json::json!({"case": case})).await[0];
        cases.insert(case, id);
    }
    wait_count(
        &env.pool,
        "every job to fail",
        FINISHED,
        4,
        Duration::from_secs(60),
    )
    .await;
    let calls = provider.calls();
    let mut errors = BTreeMap::new();
    for (case, id) in &cases {
        let row = store::get(&env.pool, *id).await.unwrap().unwrap();
        eprintln!(
            "permanent: {case}: {} attempts={} error={:?}",
            row.status, row.attempts, row.error
        );
        assert_eq!((row.status.as_str(), row.attempts), ("failed", 1), "{case}");
        assert_eq!(
            calls.iter().filter(|c| c.job_id == *id).count(),
            1,
            "{case}: one call"
        );
        errors.insert(*case, row.error.unwrap());
    }
    assert_eq!(
        errors["refused"],
        "extractor \"model\" refused the document: page 2 is not an invoice"
    );
    assert!(
        errors["garbage"].contains("invalid result"),
        "{}",
        errors["garbage"]
    );
    assert!(
        errors["garbage"].contains("expected {\"fields\""),
        "{}",
        errors["garbage"]
    );
    assert!(
        errors["out_of_range"].contains("words [0, 100000]"),
        "{}",
        errors["out_of_range"]
    );
    assert!(
        errors["deferred"].contains("deferred results are off"),
        "{}",
        errors["deferred"]
    );
    stop([&mut worker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_job_closes_its_call() {
    let provider = FakeProvider::start(|_, _| Plan::Hang).await;
    let env = TestEnv::with_settings("extractor_cancel", |s| {
        s.extraction_run_lease_s = common::secs(2.0);
        s.heartbeat_interval_s = common::secs(0.3);
        add_extractor(s, "model", &provider.url(), |_| {});
    })
    .await;
    let port = free_port();
    let http = [("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))];
    let mut serve = env.spawn("serve", &http, "extractor-cancel-serve");
    let mut worker = env.spawn("worker", &[], "extractor-cancel-worker");
    let base = format!("http://127.0.0.1:{port}");
    common::wait_healthy(&base).await;
    let client = env.client();
    let mut body = sample_body(0);
    body["extractor"] = "model".into();
    let submitted: serde_json::Value = client
        .post(format!("{base}/v1/extractions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: Uuid = submitted["id"].as_str().unwrap().parse().unwrap();
    wait_for(
        "the call to be in progress",
        Duration::from_secs(60),
        || async {
            match provider.in_flight() {
                1 => Ok(()),
                n => Err(format!("{n} calls")),
            }
        },
    )
    .await;

    let cancelled = Instant::now();
    let answer = client
        .post(format!("{base}/v1/extractions/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::ACCEPTED);
    wait_count(
        &env.pool,
        "the job to end",
        FINISHED,
        1,
        Duration::from_secs(30),
    )
    .await;
    let ended = cancelled.elapsed();
    wait_for(
        "the provider to see the close",
        Duration::from_secs(10),
        || async {
            match provider.calls()[0].closed_by_client {
                true => Ok(()),
                false => Err("the connection is still open".to_owned()),
            }
        },
    )
    .await;
    let row = store::get(&env.pool, id).await.unwrap().unwrap();
    let calls = provider.calls();
    eprintln!(
        "cancel: status={} after {:.2}s; calls={} closed_by_client={}",
        row.status,
        ended.as_secs_f64(),
        calls.len(),
        calls[0].closed_by_client
    );
    assert_eq!(row.status.as_str(), "cancelled");
    assert!(
        ended < Duration::from_secs(2),
        "seen within a lease: {ended:?}"
    );
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].status, None, "the call was never answered");
    assert!(!wins(&env.pool, "mark_succeeded").await.contains_key(&id));
    stop([&mut worker, &mut serve]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_calls_finishes_them_and_commits_only_what_was_delivered() {
    const JOBS: usize = 40;
    const CAP: usize = 4;
    let provider = FakeProvider::start(|_, _| Plan::ok(Duration::from_secs(2))).await;
    let env = TestEnv::with_settings("extractor_sigterm", |s| {
        s.subscriber_drain_timeout_s = common::secs(10.0);
        common::fast_recovery(s);
        add_extractor(s, "model", &provider.url(), |e| e.max_concurrency = CAP);
    })
    .await;
    let services = env.services().await;
    let mut first = env.spawn("worker", &[], "extractor-sigterm-first");
    let ids = submit_for(&services, JOBS, "model", serde_json::Value::Null).await;
    wait_succeeded(&env, CAP as i64, 60).await;
    wait_for("calls in progress", Duration::from_secs(30), || async {
        match provider.in_flight() {
            CAP => Ok(()),
            n => Err(format!("{n} calls")),
        }
    })
    .await;

    let terminated = Instant::now();
    signal(&first, "TERM").await;
    let status = first.wait().await.unwrap();
    let drain = terminated.elapsed();
    let calls_then = provider.calls();
    let unfinished = calls_then.iter().filter(|c| c.status != Some(200)).count();
    let started_after = calls_then
        .iter()
        .filter(|c| c.started > terminated + Duration::from_millis(100))
        .count();
    let succeeded_then = count(&env.pool, SUCCEEDED).await;
    let live_leases =
        "SELECT count(*) FROM extractions WHERE status = 'running' AND lease_expires_at > now()";
    let held_after_exit = count(&env.pool, live_leases).await;

    // Nothing committed ahead of delivery: every record below the committed
    // offset belongs to a job whose bbox request was acknowledged.
    let group = env.settings.group(&env.settings.worker_group);
    let committed = env.committed(&group, "extraction.submitted");
    let delivered: HashSet<Uuid> =
        sqlx::query_scalar("SELECT id FROM extractions WHERE bbox_published_at IS NOT NULL")
            .fetch_all(&env.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let records: Vec<(i32, i64, Uuid)> = common::read_topic_positioned(
        &env.settings.kafka_brokers,
        &env.topic("extraction.submitted"),
    )
    .into_iter()
    .map(|(partition, offset, _, payload)| {
        let id: Uuid = decode::<ExtractionSubmitted>(&payload)
            .unwrap()
            .extraction_id
            .parse()
            .unwrap();
        (partition, offset, id)
    })
    .collect();
    let ahead = records
        .iter()
        .filter(|(partition, offset, id)| {
            committed.get(partition).is_some_and(|c| offset < c) && !delivered.contains(id)
        })
        .count();
    // And nothing delivered left behind: each partition's commit is the end of
    // its delivered prefix (which records got the extractor's slots first, and
    // so whether any prefix exists, is up to the scheduler).
    let mut prefix_end: HashMap<i32, i64> = HashMap::new();
    let mut ordered = records.clone();
    ordered.sort_by_key(|(partition, offset, _)| (*partition, *offset));
    let mut blocked: HashSet<i32> = HashSet::new();
    for (partition, offset, id) in &ordered {
        if blocked.contains(partition) {
            continue;
        }
        match delivered.contains(id) {
            true => {
                prefix_end.insert(*partition, offset + 1);
            }
            false => {
                blocked.insert(*partition);
            }
        }
    }
    let behind: Vec<(i32, i64, i64)> = prefix_end
        .iter()
        .map(|(p, end)| (*p, *end, committed.get(p).copied().unwrap_or(0)))
        .filter(|(_, end, got)| got < end)
        .collect();

    let mut replacement = env.spawn("worker", &[], "extractor-sigterm-replacement");
    wait_succeeded(&env, JOBS as i64, 120).await;
    let calls = provider.calls();
    let answered: HashMap<Uuid, usize> =
        calls
            .iter()
            .filter(|c| c.status == Some(200))
            .fold(HashMap::new(), |mut n, c| {
                *n.entry(c.job_id).or_default() += 1;
                n
            });
    eprintln!(
        "sigterm: jobs={JOBS} exit={status} drain={:.2}s succeeded_before_exit={succeeded_then} \
         calls_before_exit={} unfinished={unfinished} started_after_sigterm={started_after} held_after_exit={held_after_exit} \
         committed={committed:?} delivered_prefixes={prefix_end:?} offset_ahead={ahead} calls_total={}",
        drain.as_secs_f64(),
        calls_then.len(),
        calls.len()
    );
    assert!(status.success(), "a graceful drain exits 0");
    assert!(
        drain < Duration::from_secs(5),
        "the drain waited for the calls, not for its timeout"
    );
    assert_eq!(
        unfinished, 0,
        "every call in progress finished within the drain"
    );
    assert_eq!(started_after, 0, "no call started after SIGTERM");
    assert_eq!(
        held_after_exit, 0,
        "every unfinished claim was released, not left to expire"
    );
    assert_eq!(ahead, 0, "no offset committed ahead of delivery");
    assert!(
        behind.is_empty(),
        "the drain committed what it delivered: (partition, prefix end, committed) {behind:?}"
    );
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &ids,
        "mark_succeeded",
    );
    let twice: Vec<_> = answered.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "jobs extracted more than once: {twice:?}");
    assert_eq!(answered.len(), JOBS);
    stop([&mut replacement]).await;
}

/// Runs `n` sample jobs through extractor `name` at `url` to bbox succeeded,
/// and returns each job's result beside what the rule extractor finds in it.
async fn through_the_pipeline(
    test: &str,
    name: &str,
    url: &str,
    n: usize,
) -> Vec<(serde_json::Value, serde_json::Value)> {
    let env = TestEnv::with_settings(test, |s| add_extractor(s, name, url, |_| {})).await;
    let services = env.services().await;
    let mut worker = env.spawn("worker", &[], &format!("{test}-worker"));
    let mut bbox = env.spawn("bbox-worker", &[], &format!("{test}-bbox-worker"));
    let ids = submit_for(&services, n, name, serde_json::Value::Null).await;
    wait_count(
        &env.pool,
        "every job through bbox refinement",
        common::ALL_BBOX_SUCCEEDED,
        n as i64,
        Duration::from_secs(120),
    )
    .await;
    let mut results = Vec::new();
    for id in &ids {
        let row = store::get(&env.pool, *id).await.unwrap().unwrap();
        let request = row.request().unwrap();
        let rules = docstream::extract::rule_extract(request).unwrap();
        results.push((row.result.unwrap(), serde_json::to_value(rules).unwrap()));
    }
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &ids,
        "mark_succeeded",
    );
    stop([&mut worker, &mut bbox]).await;
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_provider_extracts_what_the_rules_do() {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"));
    command.args(["extractor-serve", "--addr", "127.0.0.1:0"]);
    let (mut provider, url) = common::start_provider(command).await;
    let results = through_the_pipeline("extractor_reference", "reference", &url, 40).await;
    let same = results.iter().filter(|(got, rules)| got == rules).count();
    eprintln!(
        "reference provider: {} jobs, {same} results identical to the rules'",
        results.len()
    );
    assert_eq!(same, results.len());
    let _ = provider.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_provider_serves_a_hundred_jobs() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/extractor-provider/provider.py"
    );
    let mut command = tokio::process::Command::new("python3");
    command.args([script, "--port", "0"]);
    let (mut provider, url) = common::start_provider(command).await;
    let results = through_the_pipeline("extractor_python", "python", &url, 100).await;
    let found = results
        .iter()
        .filter(|(got, _)| {
            got["fields"]
                .as_object()
                .is_some_and(|f| f.values().any(|v| !v.is_null()))
        })
        .count();
    eprintln!(
        "python provider: {} jobs succeeded, {found} with values",
        results.len()
    );
    assert_eq!(results.len(), 100);
    assert_eq!(found, 100, "every job came back with values");
    let _ = provider.kill().await;
}

/// Posts `body` to a deferred result's `url` with `token`: (status, answer).
async fn post_result(url: &str, token: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let answer = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_results_arrive_later_and_hold_no_worker_slot() {
    const JOBS: usize = 8;
    let deferred = |deadline: &str| Plan::Answer {
        delay: Duration::ZERO,
        status: 202,
        headers: Vec::new(),
        body: deadline.to_owned(),
    };
    // Every call is deferred, and the provider keeps what each call asked
    // (where to post, with which token). A job tagged "lapse" gets a 1 s
    // deadline (raised to the lease) on its first attempt and never a result;
    // one tagged "always_lapse" gets that on every attempt.
    let asked: Arc<Mutex<HashMap<(Uuid, i64), serde_json::Value>>> = Arc::default();
    let keep = asked.clone();
    let provider = FakeProvider::start(move |_, body| {
        let job = (
            body["job_id"].as_str().unwrap().parse().unwrap(),
            body["attempt"].as_i64().unwrap(),
        );
        keep.lock().unwrap().insert(job, body.clone());
        match (body["metadata"]["case"].as_str(), job.1) {
            (Some("lapse"), 1) | (Some("always_lapse"), _) => deferred(r#"{"deadline_s": 1}"#),
            _ => deferred(""),
        }
    })
    .await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let env = TestEnv::with_settings("extractor_deferred", |s| {
        common::fast_recovery(s);
        s.max_attempts = 2;
        s.consumer_max_in_flight = 2;
        s.public_url = base.clone();
        s.callback_secret = "deferred-results-test-secret".into();
        add_extractor(s, "model", &provider.url(), |e| {
            e.deferred_deadline_s = 120.0
        });
    })
    .await;
    let services = env.services().await;
    let http = [("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))];
    let mut serve = env.spawn("serve", &http, "extractor-deferred-serve");
    let mut worker = env.spawn("worker", &[], "extractor-deferred-worker");
    common::wait_healthy(&base).await;
    let ids = submit_for(&services, JOBS, "model", serde_json::Value::Null).await;

    // Two records in flight at most, yet every job is called and every record
    // committed while all the jobs still run: a deferred job holds no slot.
    wait_for(
        "every job to be called",
        Duration::from_secs(60),
        || async {
            match provider.calls().len() {
                n if n >= JOBS => Ok(()),
                n => Err(format!("{n} calls")),
            }
        },
    )
    .await;
    let group = env.settings.group(&env.settings.worker_group);
    wait_for(
        "the worker to commit every record",
        Duration::from_secs(30),
        || async {
            let committed: i64 = env.committed(&group, "extraction.submitted").values().sum();
            match committed {
                n if n >= JOBS as i64 => Ok(()),
                n => Err(format!("{n} committed")),
            }
        },
    )
    .await;
    let running = "SELECT count(*) FROM extractions WHERE status = 'running'";
    assert_eq!(
        count(&env.pool, running).await,
        JOBS as i64,
        "every job still runs"
    );

    let callback = |id: Uuid| {
        let asked = asked.lock().unwrap()[&(id, 1)].clone();
        let url = asked["callback"]["url"].as_str().unwrap().to_owned();
        let token = asked["callback"]["token"].as_str().unwrap().to_owned();
        (url, token, asked)
    };
    let (url0, token0, asked0) = callback(ids[0]);
    let (_, token1, _) = callback(ids[1]);
    let result0 = serde_json::from_str(&common::provider::all_found_body(&asked0)).unwrap();
    let forged = format!("{token0}x");
    assert_eq!(
        post_result(&url0, &forged, &result0).await.0,
        401,
        "a forged token"
    );
    assert_eq!(
        post_result(&url0, &token1, &result0).await.0,
        401,
        "another job's token"
    );
    let garbage = serde_json::json!({"fields": "none"});
    assert_eq!(
        post_result(&url0, &token0, &garbage).await.0,
        422,
        "not a result"
    );
    for id in &ids[..JOBS - 1] {
        let (url, token, asked) = callback(*id);
        let result = serde_json::from_str(&common::provider::all_found_body(&asked)).unwrap();
        let (status, answer) = post_result(&url, &token, &result).await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (200, Some("succeeded")),
            "{answer}"
        );
    }
    let (url, token, _) = callback(ids[JOBS - 1]);
    let failure = serde_json::json!({"error": "the scan is unreadable"});
    let (status, answer) = post_result(&url, &token, &failure).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("failed")),
        "{answer}"
    );
    let (status, _) = post_result(&url0, &token0, &result0).await;
    assert_eq!(status, 409, "a second result for the same attempt");

    // A deadline that passes without a result: the job is revived, and the
    // lapsed attempt's token no longer ends it while the next one runs.
    let lapsed = submit_for(&services, 1, "model", serde_json::json!({"case": "lapse"})).await[0];
    let always = submit_for(
        &services,
        1,
        "model",
        serde_json::json!({"case": "always_lapse"}),
    )
    .await[0];
    let cancelled = submit_for(&services, 1, "model", serde_json::Value::Null).await[0];
    wait_for(
        "the lapsed job's second call",
        Duration::from_secs(60),
        || async {
            match asked.lock().unwrap().contains_key(&(lapsed, 2)) {
                true => Ok(()),
                false => Err("one call so far".to_owned()),
            }
        },
    )
    .await;
    let (url1, token1, asked1) = callback(lapsed);
    let result1 = serde_json::from_str(&common::provider::all_found_body(&asked1)).unwrap();
    let (status, _) = post_result(&url1, &token1, &result1).await;
    assert_eq!(
        status, 409,
        "attempt 1's result while attempt 2 holds the job"
    );
    let token2 = asked.lock().unwrap()[&(lapsed, 2)]["callback"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, answer) = post_result(&url1, &token2, &result1).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );

    // A cancel while the result is pending: the result that comes is refused
    // and the job ends cancelled.
    let (url_c, token_c, asked_c) = callback(cancelled);
    let cancel = env
        .client()
        .post(format!("{base}/v1/extractions/{cancelled}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status().as_u16(), 202);
    let result_c = serde_json::from_str(&common::provider::all_found_body(&asked_c)).unwrap();
    let (status, _) = post_result(&url_c, &token_c, &result_c).await;
    assert_eq!(status, 409, "the result of a cancelled job");

    // A provider that never posts spends the job's attempts, then fails it.
    wait_count(
        &env.pool,
        "every job to end",
        FINISHED,
        JOBS as i64 + 3,
        Duration::from_secs(90),
    )
    .await;

    let row = |id: Uuid| {
        let pool = env.pool.clone();
        async move { store::get(&pool, id).await.unwrap().unwrap() }
    };
    let (lapsed_row, always_row) = (row(lapsed).await, row(always).await);
    let (failed_row, cancelled_row) = (row(ids[JOBS - 1]).await, row(cancelled).await);
    let calls_of = |id: Uuid| -> Vec<i64> {
        let calls = provider.calls();
        calls
            .iter()
            .filter(|c| c.job_id == id)
            .map(|c| c.attempt)
            .collect()
    };
    eprintln!(
        "deferred: {JOBS} jobs called with 2 in flight; lapsed job {} after attempts {:?}; \
         always lapsing: {} after attempts {:?} ({:?}); cancelled: {}; failed job: {:?}",
        lapsed_row.status,
        calls_of(lapsed),
        always_row.status,
        calls_of(always),
        always_row.error,
        cancelled_row.status,
        failed_row.error
    );
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &[&ids[..JOBS - 1], &[lapsed]].concat(),
        "mark_succeeded",
    );
    assert_eq!(failed_row.status.as_str(), "failed");
    assert_eq!(
        failed_row.error.as_deref(),
        Some("extractor \"model\" refused the document: the scan is unreadable")
    );
    assert_eq!(
        (lapsed_row.status.as_str(), lapsed_row.attempts),
        ("succeeded", 2)
    );
    assert_eq!(calls_of(lapsed), [1, 2]);
    assert_eq!(cancelled_row.status.as_str(), "cancelled");
    assert_eq!(always_row.status.as_str(), "failed");
    assert_eq!(calls_of(always), [1, 2], "no call past the last attempt");
    let error = always_row.error.unwrap_or_default();
    assert!(error.contains("gave up after 2 attempts"), "{error}");
    stop([&mut worker, &mut serve]).await;
}
