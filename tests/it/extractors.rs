//! External extractors with real worker processes on the real broker and
//! database, against a provider that lives in the test and records every call
//! it sees (`common::provider`): long calls under short leases, the
//! concurrency cap and the rate limit across two workers, 429/503 with and
//! without `Retry-After`, calls that hang past their timeout, permanent
//! failures, a cancel during a call, a SIGTERM during calls, and the two
//! providers the project ships (`docstream extractor-serve` and the Python
//! example).

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::provider::{Call, FakeProvider, Plan};
use common::{
    add_extractor, count, every_worker_calls_the_warmup_extractor, free_port, sample_body, scrape,
    signal, stop, submit_for, wait_count, wait_for, wins, worker_with_metrics, workers_calling,
    TestEnv,
};
use docstream::events::{decode, ExtractionSubmitted};
use docstream::roles::Process;
use docstream::store::{self, NewExtraction, SubmitError};
use uuid::Uuid;

const SUCCEEDED: &str = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";
const FINISHED: &str =
    "SELECT count(*) FROM extractions WHERE status IN ('succeeded', 'failed', 'cancelled')";

/// Waits until `n` jobs succeeded.
async fn wait_succeeded(env: &TestEnv, n: i64, timeout_s: u64) {
    let timeout = Duration::from_secs(timeout_s);
    wait_count(&env.pool, "jobs to succeed", SUCCEEDED, n, timeout).await;
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

/// The `max_concurrency` of extractor `capped`, for the whole deployment.
const CAP: usize = 4;
/// The `requests_per_second` of extractor `limited`, for the whole deployment.
const RATE: f64 = 20.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployments_cap_and_rate_hold_across_two_workers() {
    let capped = FakeProvider::start(|_, _| Plan::ok(Duration::from_millis(200))).await;
    let limited = FakeProvider::start(|_, _| Plan::ok(Duration::from_millis(20))).await;
    let warmup = FakeProvider::start(|_, _| Plan::ok(Duration::ZERO)).await;
    let env = a_warmup_a_capped_and_a_limited_extractor(&warmup, &capped, &limited).await;
    let services = env.services().await;
    let (mut workers, metrics): (Vec<_>, Vec<_>) = (0..2)
        .map(|i| worker_with_metrics(&env, &format!("extractor-limits-worker-{i}")))
        .unzip();
    every_worker_calls_the_warmup_extractor(&services, &metrics).await;
    let warmed_up = count(&env.pool, "SELECT count(*) FROM extractions").await;

    let cap = jobs_that_could_all_run_at_once(&env, &services, &capped, &metrics, warmed_up).await;
    let rate =
        jobs_that_could_all_start_within_a_second(&env, &services, &limited, &metrics, warmed_up)
            .await;

    report_the_cap_and_the_rate(&cap, &rate);
    the_cap_held_across_both_workers(&cap);
    the_rate_held_across_both_workers(&rate);
    stop(workers.iter_mut()).await;
}

/// A test world with extractors `warmup`, `capped` (at [`CAP`])
/// and `limited` (16 at once, at [`RATE`]) at the providers.
async fn a_warmup_a_capped_and_a_limited_extractor(
    warmup: &FakeProvider,
    capped: &FakeProvider,
    limited: &FakeProvider,
) -> TestEnv {
    TestEnv::with_settings("extractor_limits", |s| {
        add_extractor(s, "warmup", &warmup.url(), |_| {});
        add_extractor(s, "capped", &capped.url(), |e| e.max_concurrency = CAP);
        add_extractor(s, "limited", &limited.url(), |e| {
            e.max_concurrency = 16;
            e.requests_per_second = RATE;
        });
    })
    .await
}

/// The deployment-wide cap of extractor `model` in the shared-cap test.
const SHARED_CAP: usize = 8;
/// Its slots' lease in that test.
const SLOT_LEASE_S: f64 = 3.0;

/// Three worker processes share one cap of 8: 300 calls of 200 ms never
/// see more than 8 at once and keep the 8 slots at least 90% busy. Then,
/// under 400 more, one worker is SIGKILLed while it holds slots: the
/// provider sees fewer calls at once until the slots' leases run out, and
/// 8 again within one lease; every job succeeds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_one_cap_and_a_killed_ones_slots_come_back() {
    let model = FakeProvider::start(|_, _| Plan::ok(Duration::from_millis(200))).await;
    let warmup = FakeProvider::start(|_, _| Plan::ok(Duration::ZERO)).await;
    let env = TestEnv::with_settings("extractor_shared_cap", |s| {
        add_extractor(s, "warmup", &warmup.url(), |_| {});
        add_extractor(s, "model", &model.url(), |e| e.max_concurrency = SHARED_CAP);
        s.extractor_slot_lease_s = common::secs(SLOT_LEASE_S);
    })
    .await;
    let services = env.services().await;
    let (mut workers, metrics): (Vec<_>, Vec<_>) = (0..3)
        .map(|i| worker_with_metrics(&env, &format!("extractor-shared-cap-worker-{i}")))
        .unzip();
    every_worker_calls_the_warmup_extractor(&services, &metrics).await;
    let warmed_up = count(&env.pool, "SELECT count(*) FROM extractions").await;

    let mut ids = submit_for(&services, 300, "model", serde_json::Value::Null).await;
    wait_succeeded(&env, warmed_up + 300, 120).await;
    let calls = model.calls();
    let busy: f64 = calls
        .iter()
        .map(|c| (c.ended.unwrap() - c.started).as_secs_f64())
        .sum();
    let first = calls.iter().map(|c| c.started).min().unwrap();
    let last = calls.iter().filter_map(|c| c.ended).max().unwrap();
    let utilisation = busy / (SHARED_CAP as f64 * (last - first).as_secs_f64());
    let peak = model.max_concurrency();
    let callers = workers_calling(
        &metrics,
        "docstream_extractor_calls_total{extractor=\"model\"",
    )
    .await;
    eprintln!(
        "shared cap: 300 calls of 200 ms, peak {peak} of {SHARED_CAP}, utilisation {utilisation:.3} \
         over {:.2} s, {callers} workers calling",
        (last - first).as_secs_f64()
    );
    for wait in ["slot", "shared_slot", "token"] {
        let mut total = 0.0;
        for addr in &metrics {
            let series = format!(
                "docstream_extractor_wait_seconds_sum{{extractor=\"model\",wait=\"{wait}\"}}"
            );
            total += scrape(addr, &series).await;
        }
        eprintln!("shared cap: calls waited {total:.2} s in all for wait={wait}");
    }
    assert_eq!(calls.len(), 300);
    assert_eq!(peak, SHARED_CAP, "the provider saw {peak} calls at once");
    assert_eq!(callers, 3, "every worker called");
    assert!(utilisation >= 0.9, "the slots were {utilisation:.3} busy");

    ids.extend(submit_for(&services, 400, "model", serde_json::Value::Null).await);
    let (victim, victim_metrics) = (&mut workers[0], metrics[0].clone());
    let held = "docstream_extractor_shared_slots_held{extractor=\"model\"}";
    wait_for("the victim to hold slots", Duration::from_secs(60), || {
        let victim_metrics = victim_metrics.clone();
        let in_flight = model.in_flight();
        async move {
            let holds = scrape(&victim_metrics, held).await;
            match (holds, in_flight) {
                (h, n) if h >= 1.0 && n == SHARED_CAP => Ok(()),
                seen => Err(format!("held, provider in flight: {seen:?}")),
            }
        }
    })
    .await;
    signal(victim, "KILL").await;
    let (dip, recovered) = model.dip_and_recovery(SHARED_CAP).await;
    eprintln!("shared cap: after SIGKILL, {dip} calls at once until {recovered:?} (lease {SLOT_LEASE_S} s)");
    assert!(dip < SHARED_CAP, "the victim held slots when it was killed");
    let recovered = recovered.expect("the provider saw the cap again");
    assert!(
        recovered.as_secs_f64() <= SLOT_LEASE_S + 1.0,
        "the killed worker's slots came back after {recovered:?}"
    );

    wait_succeeded(&env, warmed_up + 700, 180).await;
    assert!(
        model.max_concurrency() <= SHARED_CAP,
        "never more than the cap"
    );
    let ours: HashSet<Uuid> = ids.iter().copied().collect();
    let mut won = wins(&env.pool, "mark_succeeded").await;
    won.retain(|id, _| ours.contains(id));
    common::assert_exactly_once(&won, &ids, "succeeded");
    stop(workers[1..].iter_mut()).await;
}

/// What the capped jobs showed.
struct Cap {
    /// The most calls the provider saw at once.
    peak: usize,
    /// The workers' `max_concurrency` gauges.
    gauges: Vec<f64>,
    /// Workers that called the capped extractor.
    workers_busy: usize,
}

/// The cap: 200 jobs of 200 ms each could run 200 at once. Runs them to
/// success (120 s at most) and reads the peak and the gauges.
async fn jobs_that_could_all_run_at_once(
    env: &TestEnv,
    services: &Process,
    capped: &FakeProvider,
    metrics: &[String],
    warmed_up: i64,
) -> Cap {
    submit_for(services, 200, "capped", serde_json::Value::Null).await;
    wait_succeeded(env, warmed_up + 200, 120).await;
    let peak = capped.max_concurrency();
    let mut gauges = Vec::new();
    for addr in metrics {
        let series = "docstream_extractor_max_concurrency{extractor=\"capped\"}";
        gauges.push(scrape(addr, series).await);
    }
    let series = "docstream_extractor_calls_total{extractor=\"capped\"";
    let workers_busy = workers_calling(metrics, series).await;
    Cap {
        peak,
        gauges,
        workers_busy,
    }
}

/// What the limited jobs' calls showed.
struct Rate {
    calls: Vec<Call>,
    /// Seconds from the first call's start to the last's.
    span: f64,
    /// Calls per second over the span.
    overall: f64,
    /// The most calls that started within 2 s.
    busiest: usize,
    /// Workers that called the limited extractor.
    workers_busy: usize,
}

/// The rate: 100 jobs the provider could answer in well under a second.
/// Runs them to success (120 s at most) and measures their calls.
async fn jobs_that_could_all_start_within_a_second(
    env: &TestEnv,
    services: &Process,
    limited: &FakeProvider,
    metrics: &[String],
    warmed_up: i64,
) -> Rate {
    submit_for(services, 100, "limited", serde_json::Value::Null).await;
    wait_succeeded(env, warmed_up + 300, 120).await;
    let calls = limited.calls();
    let first = calls.iter().map(|c| c.started).min().unwrap();
    let last = calls.iter().map(|c| c.started).max().unwrap();
    let span = (last - first).as_secs_f64();
    let overall = (calls.len() - 1) as f64 / span;
    let busiest = busiest_window(&calls, Duration::from_secs(2));
    let workers_busy = workers_calling(
        metrics,
        "docstream_extractor_calls_total{extractor=\"limited\"",
    )
    .await;
    Rate {
        calls,
        span,
        overall,
        busiest,
        workers_busy,
    }
}

/// Prints the peak, the calls' spread and the workers calling.
fn report_the_cap_and_the_rate(cap: &Cap, rate: &Rate) {
    let Cap {
        peak,
        workers_busy: capped_workers,
        ..
    } = cap;
    let Rate {
        span,
        overall,
        busiest,
        workers_busy,
        ..
    } = rate;
    eprintln!(
        "limits: capped peak={peak} (cap {CAP} across {capped_workers} workers); limited calls={} span={span:.2}s \
         overall={overall:.1}/s busiest_2s_window={busiest} (limit {RATE}/s); workers calling={workers_busy}",
        rate.calls.len()
    );
}

/// Both workers called, and the provider saw the deployment's cap at once,
/// never more; each worker's gauge shows the cap.
fn the_cap_held_across_both_workers(cap: &Cap) {
    assert_eq!(
        cap.workers_busy, 2,
        "both workers called the capped extractor"
    );
    assert_eq!(cap.peak, CAP, "the provider saw {} calls at once", cap.peak);
    assert_eq!(cap.gauges, [CAP as f64; 2]);
}

/// Both workers called, 100 calls in all, none closer together than the
/// deployment's rate allows.
fn the_rate_held_across_both_workers(rate: &Rate) {
    let (busiest, overall) = (rate.busiest, rate.overall);
    assert_eq!(
        rate.workers_busy, 2,
        "both workers called the limited extractor"
    );
    assert_eq!(rate.calls.len(), 100);
    // The deployment starts at most 2 s × RATE calls in two seconds,
    // whichever worker makes them. Arrivals lag starts: a call started just
    // before the window may arrive inside it, and a stall of the machine can
    // bunch a second one, so two per worker are allowed. Without the limit,
    // all 100 arrive in well under a second; with a rate per worker, twice
    // as many as allowed would.
    assert!(
        busiest <= 2 * RATE as usize + 2 * 2,
        "{busiest} calls in 2 s"
    );
    assert!(overall <= RATE * 1.05, "{overall:.1} calls/s overall");
}

/// A pseudo-random number in 0..100 for a call, the same on every run.
fn roll(call: usize) -> u64 {
    let mut x = call as u64 + 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) % 100
}

/// The jobs of the flaky provider's test.
const FLAKY_JOBS: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_provider_costs_attempts_only_for_its_failures() {
    let provider = a_provider_that_is_unavailable_or_throttles_now_and_then().await;
    let env = TestEnv::with_settings("extractor_flaky", |s| {
        s.max_attempts = 12;
        s.retry_base_delay_s = common::secs(0.1);
        s.retry_max_delay_s = common::secs(0.5);
        add_extractor(s, "flaky", &provider.url(), |e| e.max_concurrency = 16);
    })
    .await;
    let services = env.services().await;
    let (mut worker, metrics) = worker_with_metrics(&env, "extractor-flaky-worker");
    let ids = submit_for(&services, FLAKY_JOBS, "flaky", serde_json::Value::Null).await;
    wait_succeeded(&env, FLAKY_JOBS as i64, 120).await;

    let calls = provider.calls();
    let retries = each_job_spent_attempts_only_on_its_503s(&env, &ids, &calls).await;
    let honoured = scrape(&metrics, "docstream_extractor_retry_after_seconds_total").await;
    report_the_retries(&retries, &calls, honoured);
    both_kinds_happened_and_retry_after_was_honoured(&retries, honoured);
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &ids,
        "mark_succeeded",
    );
    stop([&mut worker]).await;
}

/// The extractor's one slot is not held while a call waits out a
/// `Retry-After`: job A's first call gets 429 with `Retry-After: 3`; job B,
/// submitted then, is called (and done) before A calls again, and A's
/// repeat is the same attempt with the same `Idempotency-Key`, 3 s later,
/// as the protocol documents say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_out_a_retry_after_holds_no_slot_and_repeats_the_same_call() {
    let provider = FakeProvider::start(|n, _| match n {
        0 => Plan::retry_after(429, 3),
        _ => Plan::ok(Duration::ZERO),
    })
    .await;
    let env = TestEnv::with_settings("extractor_retry_after_slot", |s| {
        add_extractor(s, "one", &provider.url(), |e| e.max_concurrency = 1);
    })
    .await;
    let services = env.services().await;
    let (mut worker, _) = worker_with_metrics(&env, "extractor-retry-after-slot-worker");
    let a = submit_for(&services, 1, "one", serde_json::Value::Null).await[0];
    common::wait_for("job A's 429", Duration::from_secs(60), || {
        let answered = provider.calls().first().and_then(|c| c.status) == Some(429);
        async move { answered.then_some(()).ok_or("not yet".to_owned()) }
    })
    .await;
    let b = submit_for(&services, 1, "one", serde_json::Value::Null).await[0];
    wait_succeeded(&env, 2, 60).await;
    stop([&mut worker]).await;

    let by_job = calls_by_job(&provider.calls());
    let (a_calls, b_calls) = (&by_job[&a], &by_job[&b]);
    assert_eq!((a_calls.len(), b_calls.len()), (2, 1), "{by_job:?}");
    let (first, repeat) = (&a_calls[0], &a_calls[1]);
    let waited = repeat.started - first.ended.unwrap();
    println!(
        "extractors: B called {:?} after A's 429; A called again {waited:?} after it",
        b_calls[0].started - first.ended.unwrap()
    );
    assert!(b_calls[0].started < repeat.started, "B waited for A's slot");
    assert!(
        waited >= Duration::from_secs(3),
        "Retry-After honoured: {waited:?}"
    );
    assert_eq!(
        (first.attempt, &first.idempotency_key),
        (repeat.attempt, &repeat.idempotency_key)
    );
}

/// 30% answer 503 without Retry-After (an attempt spent), 10% 429 with
/// Retry-After: 1 (a wait within the attempt), the rest succeed.
async fn a_provider_that_is_unavailable_or_throttles_now_and_then() -> FakeProvider {
    FakeProvider::start(|n, _| match roll(n) {
        0..30 => Plan::status(503, r#"{"error": "warming up"}"#),
        30..40 => Plan::retry_after(429, 1),
        _ => Plan::ok(Duration::from_millis(20)),
    })
    .await
}

/// The retries the flaky provider's answers caused.
struct Retries {
    /// Calls answered 503 that another call followed.
    unavailable: usize,
    /// Calls answered 429 that another call followed.
    throttled: usize,
    /// The shortest time from a 429's end to the next call's start.
    shortest_wait: Duration,
}

/// Checks each job's calls: attempts spent on the 503s only, a 429 retried
/// within its attempt, a 503 with the next, and the last call a 200.
async fn each_job_spent_attempts_only_on_its_503s(
    env: &TestEnv,
    ids: &[Uuid],
    calls: &[Call],
) -> Retries {
    let by_job = calls_by_job(calls);
    let attempts = attempts(&env.pool).await;
    let (mut unavailable, mut throttled, mut shortest_wait) = (0, 0, Duration::MAX);
    for id in ids {
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
    Retries {
        unavailable,
        throttled,
        shortest_wait,
    }
}

/// Prints the calls, the retries and the Retry-After seconds the worker counted.
fn report_the_retries(retries: &Retries, calls: &[Call], honoured: f64) {
    let Retries {
        unavailable,
        throttled,
        ..
    } = retries;
    eprintln!(
        "flaky: jobs={FLAKY_JOBS} calls={} 503s={unavailable} 429s={throttled} \
         shortest_wait_after_429={:.3}s retry_after_seconds_total={honoured}",
        calls.len(),
        retries.shortest_wait.as_secs_f64()
    );
}

/// Both answers happened, and the worker waited out every Retry-After.
fn both_kinds_happened_and_retry_after_was_honoured(retries: &Retries, honoured: f64) {
    assert!(
        retries.unavailable > 0 && retries.throttled > 0,
        "both kinds of answer happened"
    );
    assert!(
        retries.shortest_wait >= Duration::from_millis(950),
        "Retry-After was honoured"
    );
    assert_eq!(honoured, retries.throttled as f64);
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
    let provider = a_provider_that_answers_as_each_case_says().await;
    let env = TestEnv::with_settings("extractor_permanent", |s| {
        add_extractor(s, "model", &provider.url(), |_| {});
    })
    .await;
    let services = env.services().await;
    an_unknown_extractor_is_refused_before_anything_is_written(&env, &services).await;

    let mut worker = env.spawn("worker", &[], "extractor-permanent-worker");
    let cases = one_job_per_case(&services).await;
    wait_count(
        &env.pool,
        "every job to fail",
        FINISHED,
        4,
        Duration::from_secs(60),
    )
    .await;
    let errors = each_job_failed_on_its_one_call(&env, &provider, &cases).await;
    each_error_says_what_was_wrong(&errors);
    stop([&mut worker]).await;
}

/// Answers by the job's `metadata.case`: a 422 refusal, a 200 that is not
/// JSON, a 202 (deferred results are off), or words out of range.
async fn a_provider_that_answers_as_each_case_says() -> FakeProvider {
    FakeProvider::start(
        |_, body| match body["metadata"]["case"].as_str().unwrap_or_default() {
            "refused" => Plan::status(422, r#"{"error": "page 2 is not an invoice"}"#),
            "garbage" => Plan::status(200, "<html>upstream proxy error</html>"),
            "deferred" => Plan::status(202, ""),
            "out_of_range" => Plan::status(
                200,
                r#"{"fields": {"invoice_number": {"value": "X", "words": [0, 100000]}}}"#,
            ),
            other => panic!("no case {other:?}"),
        },
    )
    .await
}

/// An extractor the deployment does not have is refused before anything is written.
async fn an_unknown_extractor_is_refused_before_anything_is_written(
    env: &TestEnv,
    services: &Process,
) {
    let mut body = sample_body(0);
    body["extractor"] = "nope".into();
    let new = NewExtraction {
        id: Uuid::new_v4(),
        tenant_id: docstream::store::tenants::DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: None,
        request: serde_json::from_value(body).unwrap(),
    };
    let refused = services.submitter.submit(new, || ()).await;
    assert!(
        matches!(&refused, Err(SubmitError::UnknownExtractor(name)) if name == "nope"),
        "{:?}",
        refused.err()
    );
    assert_eq!(
        count(&env.pool, "SELECT count(*) FROM extractions").await,
        0
    );
}

/// Submits one job per case, in turn: each case's job.
async fn one_job_per_case(services: &Process) -> BTreeMap<&'static str, Uuid> {
    let mut cases = BTreeMap::new();
    for case in ["refused", "garbage", "out_of_range", "deferred"] {
        let id = submit_for(services, 1, "model", serde_json::json!({"case": case})).await[0];
        cases.insert(case, id);
    }
    cases
}

/// Checks each case's job failed on its first attempt after one call: each
/// case's error.
async fn each_job_failed_on_its_one_call(
    env: &TestEnv,
    provider: &FakeProvider,
    cases: &BTreeMap<&'static str, Uuid>,
) -> BTreeMap<&'static str, String> {
    let calls = provider.calls();
    let mut errors = BTreeMap::new();
    for (case, id) in cases {
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
    errors
}

/// The refusal carries the provider's reason; the others say what was wrong
/// with the answer.
fn each_error_says_what_was_wrong(errors: &BTreeMap<&'static str, String>) {
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
    let id = a_job_whose_call_is_in_progress(&client, &base, &provider).await;

    let ended = cancel_and_wait_for_the_job_to_end(&env, &client, &base, id).await;
    the_provider_sees_the_connection_closed(&provider).await;
    the_job_ended_cancelled_within_a_lease_and_unanswered(&env, &provider, id, ended).await;
    stop([&mut worker, &mut serve]).await;
}

/// Submits a sample job for `model` over HTTP and waits (60 s at most) until
/// its call is in progress: the job.
async fn a_job_whose_call_is_in_progress(
    client: &reqwest::Client,
    base: &str,
    provider: &FakeProvider,
) -> Uuid {
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
    id
}

/// Cancels job `id` (answered 202) and waits (30 s at most) until it ended:
/// the time from the cancel to the end.
async fn cancel_and_wait_for_the_job_to_end(
    env: &TestEnv,
    client: &reqwest::Client,
    base: &str,
    id: Uuid,
) -> Duration {
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
    cancelled.elapsed()
}

/// Waits (10 s at most) until the provider saw the first call's connection
/// closed by the worker.
async fn the_provider_sees_the_connection_closed(provider: &FakeProvider) {
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
}

/// The job ended cancelled less than 2 s after the cancel, after one call
/// that was never answered, and never won `mark_succeeded`.
async fn the_job_ended_cancelled_within_a_lease_and_unanswered(
    env: &TestEnv,
    provider: &FakeProvider,
    id: Uuid,
    ended: Duration,
) {
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
}

/// The jobs of the SIGTERM test.
const SIGTERM_JOBS: usize = 40;
/// The SIGTERM test's extractor's `max_concurrency`: the calls in progress
/// when the first worker is told to stop.
const SIGTERM_CAP: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_calls_finishes_them_and_commits_only_what_was_delivered() {
    let provider = FakeProvider::start(|_, _| Plan::ok(Duration::from_secs(2))).await;
    let env = a_capped_extractor_and_a_10s_drain(&provider).await;
    let services = env.services().await;
    let mut first = env.spawn("worker", &[], "extractor-sigterm-first");
    let ids = submit_for(&services, SIGTERM_JOBS, "model", serde_json::Value::Null).await;
    the_first_calls_succeed_and_the_next_fill_the_cap(&env, &provider).await;

    let exit = sigterm_and_wait_for_the_exit(&env, &provider, &mut first).await;
    let commits = the_commits_beside_the_deliveries(&env).await;

    let mut replacement = env.spawn("worker", &[], "extractor-sigterm-replacement");
    wait_succeeded(&env, SIGTERM_JOBS as i64, 120).await;
    let calls = provider.calls();
    let answered = answered_calls_per_job(&calls);
    report_the_drain(&exit, &commits, &calls);
    the_drain_finished_its_calls_and_released_its_claims(&exit);
    the_drain_committed_exactly_what_it_delivered(&commits);
    every_job_succeeded_once_from_one_answered_call(&env, &ids, &answered).await;
    stop([&mut replacement]).await;
}

/// A test world with a 10 s subscriber drain, fast recovery, and extractor
/// `model` at `provider` capped at [`SIGTERM_CAP`] calls.
async fn a_capped_extractor_and_a_10s_drain(provider: &FakeProvider) -> TestEnv {
    TestEnv::with_settings("extractor_sigterm", |s| {
        s.subscriber_drain_timeout_s = common::secs(10.0);
        common::fast_recovery(s);
        add_extractor(s, "model", &provider.url(), |e| {
            e.max_concurrency = SIGTERM_CAP
        });
    })
    .await
}

/// Waits until [`SIGTERM_CAP`] jobs succeeded (60 s at most), then until
/// [`SIGTERM_CAP`] calls are in progress (30 s at most).
async fn the_first_calls_succeed_and_the_next_fill_the_cap(env: &TestEnv, provider: &FakeProvider) {
    wait_succeeded(env, SIGTERM_CAP as i64, 60).await;
    wait_for("calls in progress", Duration::from_secs(30), || async {
        match provider.in_flight() {
            SIGTERM_CAP => Ok(()),
            n => Err(format!("{n} calls")),
        }
    })
    .await;
}

/// What was seen when the first worker exited after its SIGTERM.
struct Exit {
    status: std::process::ExitStatus,
    /// From the signal to the exit.
    drain: Duration,
    /// The calls the provider had seen by then.
    calls_then: Vec<Call>,
    /// Of those, calls not answered 200.
    unfinished: usize,
    /// Of those, calls that started more than 100 ms after the signal.
    started_after: usize,
    succeeded_then: i64,
    /// Jobs still running under a lease that has not expired.
    held_after_exit: i64,
}

/// SIGTERMs `worker`, waits for it to exit, and takes stock at once.
async fn sigterm_and_wait_for_the_exit(
    env: &TestEnv,
    provider: &FakeProvider,
    worker: &mut tokio::process::Child,
) -> Exit {
    let terminated = Instant::now();
    signal(worker, "TERM").await;
    let status = worker.wait().await.unwrap();
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
    Exit {
        status,
        drain,
        calls_then,
        unfinished,
        started_after,
        succeeded_then,
        held_after_exit,
    }
}

/// The worker group's commits on `extraction.submitted` beside what was delivered.
struct Commits {
    /// Committed offset by partition.
    committed: HashMap<i32, i64>,
    /// Records below the commit whose job's bbox request was not acknowledged.
    ahead: usize,
    /// By partition, the end of the prefix of records whose jobs were delivered.
    prefix_end: HashMap<i32, i64>,
    /// (partition, prefix end, committed) where the commit is short of the prefix.
    behind: Vec<(i32, i64, i64)>,
}

/// Reads the worker group's commits, the delivered jobs and the submitted
/// records, and compares them.
async fn the_commits_beside_the_deliveries(env: &TestEnv) -> Commits {
    // Nothing committed ahead of delivery: every record below the committed
    // offset belongs to a job whose bbox request was acknowledged.
    let group = env.settings.group(&env.settings.worker_group);
    let committed = env.committed(&group, "extraction.submitted");
    let delivered = delivered_jobs(&env.pool).await;
    let records = submitted_records(env);
    let ahead = records
        .iter()
        .filter(|(partition, offset, id)| {
            committed.get(partition).is_some_and(|c| offset < c) && !delivered.contains(id)
        })
        .count();
    // And nothing delivered left behind: each partition's commit is the end of
    // its delivered prefix (which records got the extractor's slots first, and
    // so whether any prefix exists, is up to the scheduler).
    let prefix_end = delivered_prefix_ends(&records, &delivered);
    let behind: Vec<(i32, i64, i64)> = prefix_end
        .iter()
        .map(|(p, end)| (*p, *end, committed.get(p).copied().unwrap_or(0)))
        .filter(|(_, end, got)| got < end)
        .collect();
    Commits {
        committed,
        ahead,
        prefix_end,
        behind,
    }
}

/// The jobs whose bbox request was acknowledged.
async fn delivered_jobs(pool: &sqlx::PgPool) -> HashSet<Uuid> {
    sqlx::query_scalar("SELECT id FROM extractions WHERE bbox_published_at IS NOT NULL")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Every record of `extraction.submitted`: (partition, offset, job).
fn submitted_records(env: &TestEnv) -> Vec<(i32, i64, Uuid)> {
    common::read_topic_positioned(
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
    .collect()
}

/// By partition, the offset after the last record of the prefix whose jobs
/// are all delivered (no entry where the first record's job is not).
fn delivered_prefix_ends(
    records: &[(i32, i64, Uuid)],
    delivered: &HashSet<Uuid>,
) -> HashMap<i32, i64> {
    let mut prefix_end: HashMap<i32, i64> = HashMap::new();
    let mut ordered = records.to_vec();
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
    prefix_end
}

/// How many calls the provider answered 200, by job.
fn answered_calls_per_job(calls: &[Call]) -> HashMap<Uuid, usize> {
    calls
        .iter()
        .filter(|c| c.status == Some(200))
        .fold(HashMap::new(), |mut n, c| {
            *n.entry(c.job_id).or_default() += 1;
            n
        })
}

/// Prints the drain, the commits and the calls.
fn report_the_drain(exit: &Exit, commits: &Commits, calls: &[Call]) {
    let Exit {
        status,
        succeeded_then,
        unfinished,
        started_after,
        held_after_exit,
        ..
    } = exit;
    let Commits {
        committed,
        prefix_end,
        ahead,
        ..
    } = commits;
    eprintln!(
        "sigterm: jobs={SIGTERM_JOBS} exit={status} drain={:.2}s succeeded_before_exit={succeeded_then} \
         calls_before_exit={} unfinished={unfinished} started_after_sigterm={started_after} held_after_exit={held_after_exit} \
         committed={committed:?} delivered_prefixes={prefix_end:?} offset_ahead={ahead} calls_total={}",
        exit.drain.as_secs_f64(),
        exit.calls_then.len(),
        calls.len()
    );
}

/// The worker exited 0 within 5 s, having finished every call in progress,
/// started none after the signal, and released every claim it held.
fn the_drain_finished_its_calls_and_released_its_claims(exit: &Exit) {
    assert!(exit.status.success(), "a graceful drain exits 0");
    assert!(
        exit.drain < Duration::from_secs(5),
        "the drain waited for the calls, not for its timeout"
    );
    assert_eq!(
        exit.unfinished, 0,
        "every call in progress finished within the drain"
    );
    assert_eq!(exit.started_after, 0, "no call started after SIGTERM");
    assert_eq!(
        exit.held_after_exit, 0,
        "every unfinished claim was released, not left to expire"
    );
}

/// No offset was committed ahead of delivery, and none short of it.
fn the_drain_committed_exactly_what_it_delivered(commits: &Commits) {
    assert_eq!(commits.ahead, 0, "no offset committed ahead of delivery");
    let behind = &commits.behind;
    assert!(
        behind.is_empty(),
        "the drain committed what it delivered: (partition, prefix end, committed) {behind:?}"
    );
}

/// Every job won `mark_succeeded` once, and was answered 200 once: none was
/// extracted twice across the two workers.
async fn every_job_succeeded_once_from_one_answered_call(
    env: &TestEnv,
    ids: &[Uuid],
    answered: &HashMap<Uuid, usize>,
) {
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        ids,
        "mark_succeeded",
    );
    let twice: Vec<_> = answered.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "jobs extracted more than once: {twice:?}");
    assert_eq!(answered.len(), SIGTERM_JOBS);
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
    let answer = common::http_client()
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

/// The jobs the deferred test submits first.
const DEFERRED_JOBS: usize = 8;

/// What each deferred call asked of the provider, by (job, attempt).
type Asked = Arc<Mutex<HashMap<(Uuid, i64), serde_json::Value>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_results_arrive_later_and_hold_no_worker_slot() {
    let (provider, asked) = a_provider_that_defers_every_result().await;
    let mut s = Deferred::serve_and_a_worker_with_deferred_results_on(provider, asked).await;
    let ids = submit_for(&s.services, DEFERRED_JOBS, "model", serde_json::Value::Null).await;

    // Two records in flight at most, yet every job is called and every record
    // committed while all the jobs still run: a deferred job holds no slot.
    every_job_is_called_and_committed_while_all_still_run(&s).await;

    let first = s.callback(ids[0]);
    let other_token = s.callback(ids[1]).token;
    let first_result = a_result_for(&first.asked);
    forged_tokens_and_broken_results_are_refused(&first, &other_token, &first_result).await;
    results_end_all_but_the_last_job_which_a_failure_ends(&s, &ids).await;
    a_second_result_for_the_same_attempt_is_refused(&first, &first_result).await;

    // A deadline that passes without a result: the job is revived, and the
    // lapsed attempt's token no longer ends it while the next one runs.
    let cases = a_lapsing_an_always_lapsing_and_a_plain_job(&s).await;
    the_lapsed_job_is_called_again(&s, cases.lapsed).await;
    only_the_next_attempts_token_ends_the_lapsed_job(&s, cases.lapsed).await;

    // A cancel while the result is pending: the result that comes is refused
    // and the job ends cancelled.
    a_cancelled_jobs_result_is_refused(&s, cases.cancelled).await;

    // A provider that never posts spends the job's attempts, then fails it.
    every_job_ends(&s).await;
    let rows = Rows::of(&s, &ids, &cases).await;
    s.report(&cases, &rows);
    each_job_ended_as_its_case_says(&s, &ids, &cases, rows).await;
    stop([&mut s.worker, &mut s.serve]).await;
}

/// A 202 answer (a deferred result) with `body`.
fn a_deferred_answer(body: &str) -> Plan {
    Plan::Answer {
        delay: Duration::ZERO,
        status: 202,
        headers: Vec::new(),
        body: body.to_owned(),
    }
}

/// Every call is deferred, and the provider keeps what each call asked
/// (where to post, with which token). A job tagged "lapse" gets a 1 s
/// deadline (raised to the lease) on its first attempt and never a result;
/// one tagged "always_lapse" gets that on every attempt.
async fn a_provider_that_defers_every_result() -> (FakeProvider, Asked) {
    let asked: Asked = Arc::default();
    let keep = asked.clone();
    let provider = FakeProvider::start(move |_, body| {
        let job = (
            body["job_id"].as_str().unwrap().parse().unwrap(),
            body["attempt"].as_i64().unwrap(),
        );
        keep.lock().unwrap().insert(job, body.clone());
        match (body["metadata"]["case"].as_str(), job.1) {
            (Some("lapse"), 1) | (Some("always_lapse"), _) => {
                a_deferred_answer(r#"{"deadline_s": 1}"#)
            }
            _ => a_deferred_answer(""),
        }
    })
    .await;
    (provider, asked)
}

/// The deferred test's world. Fields drop in the order the test's locals did.
struct Deferred {
    worker: tokio::process::Child,
    serve: tokio::process::Child,
    services: Process,
    env: TestEnv,
    /// The API's base URL, also the public URL results are posted to.
    base: String,
    provider: FakeProvider,
    asked: Asked,
}

/// Where a deferred call said to post its result, with which token, and the
/// whole request it made.
struct Callback {
    url: String,
    token: String,
    asked: serde_json::Value,
}

impl Deferred {
    /// `serve` and a worker, with deferred results on (2 records in flight,
    /// 2 attempts, fast recovery) and extractor `model` at `provider` with a
    /// 120 s deferred deadline; waits until the API is healthy.
    async fn serve_and_a_worker_with_deferred_results_on(
        provider: FakeProvider,
        asked: Asked,
    ) -> Self {
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
        let serve = env.spawn("serve", &http, "extractor-deferred-serve");
        let worker = env.spawn("worker", &[], "extractor-deferred-worker");
        common::wait_healthy(&base).await;
        Deferred {
            worker,
            serve,
            services,
            env,
            base,
            provider,
            asked,
        }
    }

    /// The callback the first attempt of job `id` was given.
    fn callback(&self, id: Uuid) -> Callback {
        let asked = self.asked.lock().unwrap()[&(id, 1)].clone();
        let url = asked["callback"]["url"].as_str().unwrap().to_owned();
        let token = asked["callback"]["token"].as_str().unwrap().to_owned();
        Callback { url, token, asked }
    }

    /// The attempts the provider was called for job `id`, in arrival order.
    fn calls_of(&self, id: Uuid) -> Vec<i64> {
        let calls = self.provider.calls();
        calls
            .iter()
            .filter(|c| c.job_id == id)
            .map(|c| c.attempt)
            .collect()
    }

    /// Prints how each case ended.
    fn report(&self, cases: &Cases, rows: &Rows) {
        eprintln!(
            "deferred: {DEFERRED_JOBS} jobs called with 2 in flight; lapsed job {} after attempts {:?}; \
             always lapsing: {} after attempts {:?} ({:?}); cancelled: {}; failed job: {:?}",
            rows.lapsed.status,
            self.calls_of(cases.lapsed),
            rows.always.status,
            self.calls_of(cases.always),
            rows.always.error,
            rows.cancelled.status,
            rows.failed.error
        );
    }
}

/// The result that finds every field `request` asks for.
fn a_result_for(request: &serde_json::Value) -> serde_json::Value {
    serde_json::from_str(&common::provider::all_found_body(request)).unwrap()
}

/// Waits until the provider saw a call per job (60 s at most) and the worker
/// committed a record per job (30 s at most); then checks every job still runs.
async fn every_job_is_called_and_committed_while_all_still_run(s: &Deferred) {
    wait_for(
        "every job to be called",
        Duration::from_secs(60),
        || async {
            match s.provider.calls().len() {
                n if n >= DEFERRED_JOBS => Ok(()),
                n => Err(format!("{n} calls")),
            }
        },
    )
    .await;
    let env = &s.env;
    let group = env.settings.group(&env.settings.worker_group);
    wait_for(
        "the worker to commit every record",
        Duration::from_secs(30),
        || async {
            let committed: i64 = env.committed(&group, "extraction.submitted").values().sum();
            match committed {
                n if n >= DEFERRED_JOBS as i64 => Ok(()),
                n => Err(format!("{n} committed")),
            }
        },
    )
    .await;
    let running = "SELECT count(*) FROM extractions WHERE status = 'running'";
    assert_eq!(
        count(&env.pool, running).await,
        DEFERRED_JOBS as i64,
        "every job still runs"
    );
}

/// Posts to `url` with `token`, headers announcing a body of 4 MB that is
/// never sent: the answer's status line, and how soon it came. The token is
/// checked before the body is read, so a forged one is answered at once,
/// not after the body (or the answer bound) arrives.
async fn a_forged_post_that_never_sends_its_body(url: &str, token: &str) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = reqwest::Url::parse(url).unwrap();
    let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 4000000\r\n\r\n",
        url.path()
    );
    let sent = Instant::now();
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = [0u8; 12];
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read_exact(&mut answer));
    read.await.unwrap().unwrap();
    (
        String::from_utf8_lossy(&answer).into_owned(),
        sent.elapsed(),
    )
}

/// A result posted to `first`'s url with a forged token or another job's
/// (`other_token`) is refused 401, and one that is not a result 422.
async fn forged_tokens_and_broken_results_are_refused(
    first: &Callback,
    other_token: &str,
    first_result: &serde_json::Value,
) {
    let Callback {
        url: url0,
        token: token0,
        ..
    } = first;
    let forged = format!("{token0}x");
    assert_eq!(
        post_result(url0, &forged, first_result).await.0,
        401,
        "a forged token"
    );
    assert_eq!(
        post_result(url0, other_token, first_result).await.0,
        401,
        "another job's token"
    );
    let (status, after) = a_forged_post_that_never_sends_its_body(url0, &forged).await;
    assert_eq!(
        status, "HTTP/1.1 401",
        "a forged token with a 4 MiB body to come"
    );
    assert!(after < Duration::from_secs(1), "answered after {after:?}");
    let garbage = serde_json::json!({"fields": "none"});
    assert_eq!(
        post_result(url0, token0, &garbage).await.0,
        422,
        "not a result"
    );
}

/// Posts a result for each job but the last (each answered succeeded), then
/// an error for the last (answered failed).
async fn results_end_all_but_the_last_job_which_a_failure_ends(s: &Deferred, ids: &[Uuid]) {
    for id in &ids[..DEFERRED_JOBS - 1] {
        let Callback { url, token, asked } = s.callback(*id);
        let result = a_result_for(&asked);
        let (status, answer) = post_result(&url, &token, &result).await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (200, Some("succeeded")),
            "{answer}"
        );
    }
    let Callback { url, token, .. } = s.callback(ids[DEFERRED_JOBS - 1]);
    let failure = serde_json::json!({"error": "the scan is unreadable"});
    let (status, answer) = post_result(&url, &token, &failure).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("failed")),
        "{answer}"
    );
}

/// Posting the first job's result again is refused 409.
async fn a_second_result_for_the_same_attempt_is_refused(
    first: &Callback,
    first_result: &serde_json::Value,
) {
    let Callback {
        url: url0,
        token: token0,
        ..
    } = first;
    let (status, _) = post_result(url0, token0, first_result).await;
    assert_eq!(status, 409, "a second result for the same attempt");
}

/// The jobs submitted after the first ones, one per case.
struct Cases {
    /// Tagged "lapse": its first attempt's deadline passes.
    lapsed: Uuid,
    /// Tagged "always_lapse": every attempt's deadline passes.
    always: Uuid,
    /// Untagged, and cancelled while its result is pending.
    cancelled: Uuid,
}

/// Submits a job tagged "lapse", one tagged "always_lapse" and a plain one.
async fn a_lapsing_an_always_lapsing_and_a_plain_job(s: &Deferred) -> Cases {
    let services = &s.services;
    let lapsed = submit_for(services, 1, "model", serde_json::json!({"case": "lapse"})).await[0];
    let always = submit_for(
        services,
        1,
        "model",
        serde_json::json!({"case": "always_lapse"}),
    )
    .await[0];
    let cancelled = submit_for(services, 1, "model", serde_json::Value::Null).await[0];
    Cases {
        lapsed,
        always,
        cancelled,
    }
}

/// Waits (60 s at most) until the provider saw the lapsed job's second attempt.
async fn the_lapsed_job_is_called_again(s: &Deferred, lapsed: Uuid) {
    wait_for(
        "the lapsed job's second call",
        Duration::from_secs(60),
        || async {
            match s.asked.lock().unwrap().contains_key(&(lapsed, 2)) {
                true => Ok(()),
                false => Err("one call so far".to_owned()),
            }
        },
    )
    .await;
}

/// The lapsed first attempt's result is refused 409; with the second
/// attempt's token it ends the job succeeded.
async fn only_the_next_attempts_token_ends_the_lapsed_job(s: &Deferred, lapsed: Uuid) {
    let Callback {
        url: url1,
        token: token1,
        asked: asked1,
    } = s.callback(lapsed);
    let result1 = a_result_for(&asked1);
    let (status, _) = post_result(&url1, &token1, &result1).await;
    assert_eq!(
        status, 409,
        "attempt 1's result while attempt 2 holds the job"
    );
    let token2 = s.asked.lock().unwrap()[&(lapsed, 2)]["callback"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, answer) = post_result(&url1, &token2, &result1).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
}

/// Cancels job `cancelled` through the API (answered 202), then posts its
/// result, which is refused 409.
async fn a_cancelled_jobs_result_is_refused(s: &Deferred, cancelled: Uuid) {
    let Callback {
        url: url_c,
        token: token_c,
        asked: asked_c,
    } = s.callback(cancelled);
    let base = &s.base;
    let cancel = s
        .env
        .client()
        .post(format!("{base}/v1/extractions/{cancelled}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status().as_u16(), 202);
    let result_c = a_result_for(&asked_c);
    let (status, _) = post_result(&url_c, &token_c, &result_c).await;
    assert_eq!(status, 409, "the result of a cancelled job");
}

/// Waits (90 s at most) until the first jobs and the three cases all ended.
async fn every_job_ends(s: &Deferred) {
    wait_count(
        &s.env.pool,
        "every job to end",
        FINISHED,
        DEFERRED_JOBS as i64 + 3,
        Duration::from_secs(90),
    )
    .await;
}

/// The rows of the jobs whose ends the test checks.
struct Rows {
    lapsed: store::Extraction,
    always: store::Extraction,
    /// The last of the first jobs, which a posted error ended.
    failed: store::Extraction,
    cancelled: store::Extraction,
}

impl Rows {
    /// Reads the rows, in the order lapsed, always, failed, cancelled.
    async fn of(s: &Deferred, ids: &[Uuid], cases: &Cases) -> Rows {
        let row = |id: Uuid| {
            let pool = s.env.pool.clone();
            async move { store::get(&pool, id).await.unwrap().unwrap() }
        };
        let (lapsed, always) = (row(cases.lapsed).await, row(cases.always).await);
        let (failed, cancelled) = (
            row(ids[DEFERRED_JOBS - 1]).await,
            row(cases.cancelled).await,
        );
        Rows {
            lapsed,
            always,
            failed,
            cancelled,
        }
    }
}

/// Each job that got a result succeeded once; the last first job failed
/// with the provider's error; the lapsed job succeeded on its second
/// attempt; the cancelled one stayed cancelled; the always lapsing one
/// failed after its two attempts.
async fn each_job_ended_as_its_case_says(s: &Deferred, ids: &[Uuid], cases: &Cases, rows: Rows) {
    common::assert_exactly_once(
        &wins(&s.env.pool, "mark_succeeded").await,
        &[&ids[..DEFERRED_JOBS - 1], &[cases.lapsed]].concat(),
        "mark_succeeded",
    );
    assert_eq!(rows.failed.status.as_str(), "failed");
    assert_eq!(
        rows.failed.error.as_deref(),
        Some("extractor \"model\" refused the document: the scan is unreadable")
    );
    assert_eq!(
        (rows.lapsed.status.as_str(), rows.lapsed.attempts),
        ("succeeded", 2)
    );
    assert_eq!(s.calls_of(cases.lapsed), [1, 2]);
    assert_eq!(rows.cancelled.status.as_str(), "cancelled");
    assert_eq!(rows.always.status.as_str(), "failed");
    assert_eq!(
        s.calls_of(cases.always),
        [1, 2],
        "no call past the last attempt"
    );
    let error = rows.always.error.unwrap_or_default();
    assert!(error.contains("gave up after 2 attempts"), "{error}");
}

/// A bad extractor deploy fails 300 jobs for good (the provider refuses
/// them: 422); once it is fixed, one bulk retry by filter runs each of them
/// again: 300 successes, each job retried once and succeeded once, two
/// calls each. The same retry repeated (same key) does nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_jobs_failed_by_a_bad_deploy_succeed_once_each_after_a_bulk_retry() {
    const JOBS: usize = 300;
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deployed = fixed.clone();
    let provider =
        FakeProvider::start(
            move |_, _| match deployed.load(std::sync::atomic::Ordering::SeqCst) {
                true => Plan::ok(Duration::ZERO),
                false => Plan::status(422, r#"{"error": "model v2 cannot read this layout"}"#),
            },
        )
        .await;
    let env = TestEnv::with_settings("extractor_bulk_retry", |s| {
        add_extractor(s, "model", &provider.url(), |e| e.max_concurrency = 32);
    })
    .await;
    let services = env.services().await;
    let mut worker = env.spawn("worker", &[], "extractor-bulk-retry-worker");
    let ids = submit_for(
        &services,
        JOBS,
        "model",
        serde_json::json!({"batch": "invoices"}),
    )
    .await;
    let failed = "SELECT count(*) FROM extractions WHERE status = 'failed'";
    wait_count(
        &env.pool,
        "the bad deploy to fail every job",
        failed,
        JOBS as i64,
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(
        provider.calls().len(),
        JOBS,
        "one call each: a refusal is not retried"
    );

    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    let (base, _serving) = env.serve_here(services.clone()).await;
    let client = env.client();
    let retry = serde_json::json!({
        "action": "retry",
        "filter": {"status": "failed", "extractor": "model", "error_prefix": "extractor \"model\" refused"},
    });
    let post = || {
        client
            .post(format!("{base}/v1/extractions/actions"))
            .header("Idempotency-Key", "after-the-fix")
            .json(&retry)
            .send()
    };
    let first: serde_json::Value = post().await.unwrap().json().await.unwrap();
    let operation = format!(
        "{base}/v1/extractions/actions/{}",
        first["id"].as_str().unwrap()
    );
    wait_for(
        "the bulk retry to finish",
        Duration::from_secs(60),
        || async {
            let now: serde_json::Value = client
                .get(&operation)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            match now["state"] == "finished" {
                true => Ok(()),
                false => Err(now.to_string()),
            }
        },
    )
    .await;
    wait_succeeded(&env, JOBS as i64, 120).await;
    let again: serde_json::Value = post().await.unwrap().json().await.unwrap();
    assert_eq!(
        (&again["id"], &again["done"], &again["refused"]),
        (
            &first["id"],
            &serde_json::json!(JOBS),
            &serde_json::json!(0)
        ),
        "{again}"
    );

    common::assert_exactly_once(&wins(&env.pool, "retry_failed").await, &ids, "retry_failed");
    common::assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &ids,
        "mark_succeeded",
    );
    let calls = calls_by_job(&provider.calls());
    assert_eq!(calls.len(), JOBS);
    for (id, calls) in &calls {
        let attempts: Vec<i64> = calls.iter().map(|c| c.attempt).collect();
        assert_eq!(
            attempts,
            [1, 2],
            "{id}: the refused attempt, then the retried one"
        );
    }
    stop([&mut worker]).await;
}
