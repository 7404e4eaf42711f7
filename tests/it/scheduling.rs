//! What a worker starts first, with real worker processes on the real broker
//! and database: high-priority jobs pass a low flood, a low job is passed
//! over no longer than the bound, a tenant that arrives after another's
//! flood gets its weighted share at once, a tenant's share of an extractor's
//! cap holds across workers (and comes back after one of them is killed),
//! and a rebalance in the middle of a priority flood loses nothing, finishes
//! nothing twice, and leaves every record committed.
//!
//! Each worker runs few records at once (`DOCSTREAM_CONSUMER_MAX_IN_FLIGHT`)
//! against a provider that takes 200 ms a call, so records wait in the
//! worker and the order it starts them in is what the test sees.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::commits::{offset_ahead_violations, sample_offsets};
use common::provider::{FakeProvider, Plan};
use common::{
    add_extractor, assert_exactly_once, committed_offsets, every_worker_calls_the_warmup_extractor,
    fast_recovery, sample_body, scrape, secs, signal, stop, submit_as, topic_size, wait_count,
    wait_for, wins, worker_with_metrics, TestEnv,
};
use docstream::roles::Process;
use docstream::store::tenants::{self, DEFAULT_TENANT_ID};
use uuid::Uuid;

/// Records a worker runs at once in these tests.
const IN_FLIGHT: usize = 4;
/// The provider's time per call.
const CALL: Duration = Duration::from_millis(200);

/// A test's world: a slow `model` extractor (no cap) and a fast `warmup` one,
/// workers that run [`IN_FLIGHT`] records at once.
async fn slow_model_env(
    name: &str,
    adjust: impl FnOnce(&mut docstream::config::Settings),
) -> (TestEnv, FakeProvider, FakeProvider) {
    let model = FakeProvider::start(|_, _| Plan::ok(CALL)).await;
    let warmup = FakeProvider::start(|_, _| Plan::ok(Duration::ZERO)).await;
    let env = TestEnv::with_settings(name, |s| {
        add_extractor(s, "warmup", &warmup.url(), |_| {});
        add_extractor(s, "model", &model.url(), |_| {});
        s.consumer_max_in_flight = IN_FLIGHT;
        adjust(s);
    })
    .await;
    (env, model, warmup)
}

/// Submits `n` jobs of `tenant` for the model with `priority`.
async fn submit(services: &Process, tenant: Uuid, n: usize, priority: &str) -> Vec<Uuid> {
    submit_as(services, tenant, n, |i| {
        let mut body = sample_body(i);
        body["extractor"] = "model".into();
        body["priority"] = priority.into();
        body
    })
    .await
}

/// Workers that hold partitions (each called the warm-up extractor), and
/// the addresses of their metrics.
async fn warm_workers(
    env: &TestEnv,
    services: &Process,
    n: usize,
    name: &str,
) -> (Vec<tokio::process::Child>, Vec<String>) {
    let (workers, metrics): (Vec<_>, Vec<_>) = (0..n)
        .map(|i| worker_with_metrics(env, &format!("{name}-worker-{i}")))
        .unzip();
    every_worker_calls_the_warmup_extractor(services, &metrics).await;
    (workers, metrics)
}

/// Waits until `n` of `ids` (`whose`) succeeded: a flood under way.
async fn wait_under_way(env: &TestEnv, ids: &[Uuid], n: usize, whose: &str) {
    let what = format!("{whose} flood to be under way");
    wait_for(&what, Duration::from_secs(60), || async {
        let done = times(env, ids).await.len();
        if done >= n {
            Ok(())
        } else {
            Err(format!("{done} of {whose} done"))
        }
    })
    .await;
}

/// A job's submit, its latest claim's start, and its finish.
type Times = (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>);

/// A job's id and its [`Times`], as Postgres gives them.
type TimesRow = (Uuid, DateTime<Utc>, DateTime<Utc>, DateTime<Utc>);

/// When each of `ids` that succeeded was submitted, started and finished.
async fn times(env: &TestEnv, ids: &[Uuid]) -> HashMap<Uuid, Times> {
    let rows: Vec<TimesRow> = sqlx::query_as(
        "SELECT id, submitted_at, started_at, finished_at FROM extractions
          WHERE id = ANY($1) AND status = 'succeeded'",
    )
    .bind(ids)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, s, b, f)| (id, (s, b, f)))
        .collect()
}

/// Waits until every one of `ids` succeeded.
async fn wait_all_succeeded(env: &TestEnv, ids: &[Uuid], timeout_s: u64) {
    let sql = format!(
        "SELECT count(*) FROM extractions WHERE status = 'succeeded' AND id IN ({})",
        ids.iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let timeout = Duration::from_secs(timeout_s);
    wait_count(
        &env.pool,
        "jobs to succeed",
        &sql,
        ids.len() as i64,
        timeout,
    )
    .await;
}

/// 300 low jobs flood one worker (20 jobs/s at most); once the flood is
/// under way 20 high ones arrive. Started in arrival order, the high ones
/// would finish after every low one; started first, they finish while few
/// low ones do. Here the worker's consumer is what holds the jobs back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_jobs_pass_a_low_flood() {
    let (env, _model, _warmup) = slow_model_env("sched_priority", |_| {}).await;
    high_jobs_pass_a_low_flood(env, "sched-priority").await;
}

/// The same, with the worker starting every record at once and the
/// extractor's deployment-wide cap (4) holding the jobs back: the calls
/// waiting for a slot go in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_calls_pass_a_low_flood_at_the_extractors_cap() {
    let (env, _model, _warmup) = slow_model_env("sched_priority_cap", |s| {
        s.consumer_max_in_flight = 384;
        let model = s.extractors.get_mut("model").expect("the model extractor");
        model.max_concurrency = IN_FLIGHT;
    })
    .await;
    high_jobs_pass_a_low_flood(env, "sched-priority-cap").await;
}

async fn high_jobs_pass_a_low_flood(env: TestEnv, name: &str) {
    let services = env.services().await;
    let (mut workers, _) = warm_workers(&env, &services, 1, name).await;
    let low = submit(&services, DEFAULT_TENANT_ID, 300, "low").await;
    wait_under_way(&env, &low, 20, "the low").await;
    let high = submit(&services, DEFAULT_TENANT_ID, 20, "high").await;
    wait_all_succeeded(&env, &high, 60).await;
    let high_times = times(&env, &high).await;
    let arrived = high_times.values().map(|t| t.0).min().unwrap();
    let last_high = high_times.values().map(|t| t.2).max().unwrap();
    let low_times = times(&env, &low).await;
    let low_passed = low_times
        .values()
        .filter(|t| t.2 > arrived && t.2 <= last_high)
        .count();
    let low_open = 300 - low_times.values().filter(|t| t.2 <= arrived).count();
    let high_s = (last_high - arrived).num_milliseconds() as f64 / 1000.0;
    eprintln!(
        "priority: 20 high jobs done {high_s:.2} s after they arrived; \
         {low_passed} low jobs finished meanwhile, of {low_open} waiting"
    );
    // In arrival order every waiting low job (over 200) would finish first;
    // started first, the high ones finish within about 20 / 4 calls while
    // the 4 slots finish what they had begun.
    assert!(low_open >= 200, "the flood was still waiting: {low_open}");
    assert!(
        low_passed <= 30,
        "{low_passed} low jobs finished before the last high one"
    );
    wait_all_succeeded(&env, &low, 120).await;
    stop(workers.iter_mut()).await;
}

/// With the bound at 2 s, high jobs arriving faster than one worker can
/// run them would pass a low job over for as long as they come; a low job
/// submitted into that stream starts within the bound (plus one call for a
/// slot to free, plus the pipeline's own second), while high jobs that
/// arrived before it are still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_job_is_passed_over_no_longer_than_the_bound() {
    const MAX_WAIT_S: f64 = 2.0;
    let (env, _model, _warmup) = slow_model_env("sched_starvation", |s| {
        s.worker_priority_max_wait_s = common::secs(MAX_WAIT_S);
    })
    .await;
    let services = env.services().await;
    let (mut workers, _) = warm_workers(&env, &services, 1, "sched-starvation").await;
    // 40 high jobs a second for 8 s, twice what the worker runs, so the
    // high backlog grows by 20 a second; 3 low ones after 4 s.
    let mut high = Vec::new();
    let mut low = Vec::new();
    for tick in 0..32 {
        high.extend(submit(&services, DEFAULT_TENANT_ID, 10, "high").await);
        if tick == 16 {
            low.extend(submit(&services, DEFAULT_TENANT_ID, 3, "low").await);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_all_succeeded(&env, &low, 60).await;
    let low_times = times(&env, &low).await;
    let low_started = low_times.values().map(|t| t.1).max().unwrap();
    let low_submitted = low_times.values().map(|t| t.0).min().unwrap();
    let waits: Vec<f64> = low_times
        .values()
        .map(|t| (t.1 - t.0).num_milliseconds() as f64 / 1000.0)
        .collect();
    // High jobs that arrived before the low ones and had not started when
    // the last low one did: the low ones were not simply next in line.
    let high_rows: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)> =
        sqlx::query_as("SELECT submitted_at, started_at FROM extractions WHERE id = ANY($1)")
            .bind(&high)
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let passed = high_rows
        .iter()
        .filter(|(submitted, started)| {
            *submitted < low_submitted && started.is_none_or(|s| s > low_started)
        })
        .count();
    eprintln!("starvation: low jobs waited {waits:?} s (bound {MAX_WAIT_S} s); {passed} earlier high jobs still waiting then");
    assert!(
        passed > 0,
        "the low jobs were not passed over at all: the test proves nothing"
    );
    for wait in &waits {
        assert!(*wait <= MAX_WAIT_S + 1.5, "a low job waited {wait} s");
    }
    wait_all_succeeded(&env, &high, 120).await;
    stop(workers.iter_mut()).await;
}

/// Tenant A floods 300 jobs; then tenant B (weight 3) submits 30. B's jobs
/// start at once, 3 for each of A's, so B is done after about 40 starts,
/// not after A's 300.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_after_anothers_flood_gets_its_weighted_share_at_once() {
    let (env, _model, _warmup) = slow_model_env("sched_fair", |_| {}).await;
    let services = env.services().await;
    let b = tenants::create_tenant(&env.pool, "sched-b").await.unwrap();
    let set = env
        .run_cli(&["tenants", "set-weight", "sched-b", "3"])
        .await;
    let printed = String::from_utf8_lossy(&set.stdout);
    assert!(set.status.success(), "set-weight: {set:?}");
    assert!(
        printed.contains("\"weight\": 3"),
        "set-weight printed {printed}"
    );
    let refused = env
        .run_cli(&["tenants", "set-weight", "sched-b", "0"])
        .await;
    assert!(!refused.status.success(), "a weight of 0 is refused");
    let (mut workers, _) = warm_workers(&env, &services, 1, "sched-fair").await;
    let a_ids = submit(&services, DEFAULT_TENANT_ID, 300, "normal").await;
    wait_under_way(&env, &a_ids, 20, "A's").await;
    // The weights are read every 5 s: this one was set before the workers
    // started, so they have it.
    let b_ids = submit(&services, b.key.tenant_id, 30, "normal").await;
    wait_all_succeeded(&env, &b_ids, 60).await;
    let b_times = times(&env, &b_ids).await;
    let (b_first, b_last) = (
        b_times.values().map(|t| t.1).min().unwrap(),
        b_times.values().map(|t| t.2).max().unwrap(),
    );
    let a_times = times(&env, &a_ids).await;
    let a_meanwhile = a_times
        .values()
        .filter(|t| t.1 >= b_first && t.1 <= b_last)
        .count();
    let a_left = a_ids.len() - a_times.values().filter(|t| t.2 <= b_first).count();
    let b_s = (b_last - b_first).num_milliseconds() as f64 / 1000.0;
    eprintln!(
        "fair share: B's 30 jobs done in {b_s:.2} s; A started {a_meanwhile} meanwhile \
         (weights 1 : 3), {a_left} of A's were waiting"
    );
    assert!(a_left >= 200, "A's flood was still waiting: {a_left}");
    // 3 : 1 gives A 10 starts while B makes 30; allow for the slots A
    // held when B arrived and a start either side.
    assert!(
        a_meanwhile <= 16,
        "A started {a_meanwhile} while B ran its 30"
    );
    wait_all_succeeded(&env, &a_ids, 120).await;
    stop(workers.iter_mut()).await;
}

/// Waits until the workers' group committed every record of the submitted
/// topic (a record read again after a seek back is committed once it was
/// delivered again, shortly after its job finished): the topic's size.
async fn wait_all_committed(env: &TestEnv) -> i64 {
    let topic = env.topic(&env.settings.topic_submitted);
    let brokers = env.settings.kafka_brokers.clone();
    let group = env.settings.group(&env.settings.worker_group);
    wait_for(
        "every record to be committed",
        Duration::from_secs(30),
        || {
            let (brokers, group, topic) = (brokers.clone(), group.clone(), topic.clone());
            async move {
                let (committed, size) = tokio::task::spawn_blocking(move || {
                    let committed: i64 = committed_offsets(&brokers, &group, &topic).values().sum();
                    (committed, topic_size(&brokers, &topic))
                })
                .await
                .unwrap();
                match committed == size {
                    true => Ok(size),
                    false => Err(format!("{committed} of {size} committed")),
                }
            }
        },
    )
    .await
}

/// The most of `calls` (of the jobs `ids`) the provider had at once.
fn peak_of(calls: &[common::provider::Call], ids: &HashSet<Uuid>) -> usize {
    let mut edges: Vec<(std::time::Instant, i32)> = calls
        .iter()
        .filter(|c| ids.contains(&c.job_id))
        .flat_map(|c| [(c.started, 1), (c.ended.expect("every call ended"), -1)])
        .collect();
    // An end before a start at the same instant: back to back is not at once.
    edges.sort();
    let (mut now, mut peak) = (0, 0);
    for (_, step) in edges {
        now += step;
        peak = peak.max(now);
    }
    usize::try_from(peak).unwrap_or(0)
}

/// Calls one tenant makes at once of the model, across the deployment.
const SHARE: usize = 3;
/// The model's deployment-wide cap.
const MODEL_CAP: usize = 8;
/// The slots' lease, short so a killed worker's slots come back soon.
const SLOT_LEASE_S: f64 = 3.0;

/// Two workers start every record at once; the model's cap is 8 and each
/// tenant's share of it 3. Tenant A's flood never has more than 3 calls
/// at once although 5 slots stay free; B, arriving during it, gets its 3 at
/// once. Then, with 200 more of A's, a worker is SIGKILLed while it holds
/// A's slots: A calls fewer at once until the leases run out, and 3 again
/// within one lease.
/// Every job succeeds exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_share_of_the_cap_holds_across_workers_and_comes_back_after_a_kill() {
    let (env, model, _warmup) = slow_model_env("sched_share", |s| {
        fast_recovery(s);
        s.consumer_max_in_flight = 384;
        s.extractor_slot_lease_s = secs(SLOT_LEASE_S);
        let model = s.extractors.get_mut("model").expect("the model extractor");
        model.max_concurrency = MODEL_CAP;
        model.tenant_max_concurrency = SHARE;
    })
    .await;
    let services = env.services().await;
    let b = tenants::create_tenant(&env.pool, "sched-share-b")
        .await
        .unwrap();
    let (mut workers, metrics) = warm_workers(&env, &services, 2, "sched-share").await;
    let mut a_ids = submit(&services, DEFAULT_TENANT_ID, 200, "normal").await;
    wait_under_way(&env, &a_ids, 10, "A's").await;
    let b_ids = submit(&services, b.key.tenant_id, 30, "normal").await;
    wait_all_succeeded(&env, &b_ids, 60).await;
    let (a_set, b_set): (HashSet<Uuid>, HashSet<Uuid>) = (
        a_ids.iter().copied().collect(),
        b_ids.iter().copied().collect(),
    );
    let calls: Vec<_> = model
        .calls()
        .into_iter()
        .filter(|c| c.ended.is_some())
        .collect();
    let (a_peak, b_peak) = (peak_of(&calls, &a_set), peak_of(&calls, &b_set));
    let both = a_set.union(&b_set).copied().collect();
    let all_peak = peak_of(&calls, &both);
    let a_left = a_ids.len() - times(&env, &a_ids).await.len();
    eprintln!(
        "tenant share: A peaked at {a_peak}, B at {b_peak}, together {all_peak} calls at once \
         (share {SHARE}, cap {MODEL_CAP}); {a_left} of A's still open when B was done"
    );
    assert!(a_left >= 50, "A's flood outlasted B's jobs: {a_left} left");
    assert_eq!(
        a_peak, SHARE,
        "A, alone with 5 free slots, is held to its share"
    );
    assert_eq!(b_peak, SHARE, "B gets its whole share during A's flood");
    assert!(all_peak <= 2 * SHARE, "{all_peak} at once");

    // A alone now, with a flood long enough to outlast the kill however
    // far the first one got: its 3 calls at once, some in the victim.
    a_ids.extend(submit(&services, DEFAULT_TENANT_ID, 200, "normal").await);
    let held = "docstream_extractor_shared_slots_held{extractor=\"model\"}";
    let victim_metrics = metrics[0].clone();
    wait_for("the victim to hold slots", Duration::from_secs(30), || {
        let victim_metrics = victim_metrics.clone();
        let in_flight = model.in_flight();
        async move {
            match (scrape(&victim_metrics, held).await, in_flight) {
                (h, n) if h >= 1.0 && n == SHARE => Ok(()),
                seen => Err(format!("held, provider in flight: {seen:?}")),
            }
        }
    })
    .await;
    signal(&workers[0], "KILL").await;
    let (dip, recovered) = model.dip_and_recovery(SHARE).await;
    eprintln!("tenant share: after SIGKILL, {dip} of A's calls at once until {recovered:?} (lease {SLOT_LEASE_S} s)");
    assert!(dip < SHARE, "the victim held A's slots when it was killed");
    let recovered = recovered.expect("A had its share again");
    assert!(
        recovered.as_secs_f64() <= SLOT_LEASE_S + 1.0,
        "the killed worker's slots came back after {recovered:?}"
    );
    wait_all_succeeded(&env, &a_ids, 180).await;
    assert!(
        model.max_concurrency() <= SHARE * 2,
        "never past the shares"
    );
    let ids: Vec<Uuid> = a_ids.iter().chain(&b_ids).copied().collect();
    let ours: HashSet<Uuid> = ids.iter().copied().collect();
    let mut won = wins(&env.pool, "mark_succeeded").await;
    won.retain(|id, _| ours.contains(id));
    assert_exactly_once(&won, &ids, "succeeded");
    let _ = workers[0].wait().await;
    stop(workers[1..].iter_mut()).await;
}

/// Two workers run a flood of low and high jobs; a third joins and one of
/// the first is SIGKILLed in the middle of it. Every job succeeds exactly
/// once, and once the workers stop, every record of the submitted topic is
/// committed: the records started out of order all came to their commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_during_a_priority_flood_loses_nothing_and_repeats_nothing() {
    // A read-ahead of 8 records: the low floods fill it, so the high jobs
    // are reached by passing over low records, which the kill and the
    // rebalances interrupt.
    let (env, _model, _warmup) = slow_model_env("sched_rebalance", |s| {
        fast_recovery(s);
        s.consumer_read_ahead = 8;
    })
    .await;
    let services = env.services().await;
    let (mut workers, _) = warm_workers(&env, &services, 2, "sched-rebalance").await;
    let mut ids = Vec::new();
    for round in 0..4 {
        ids.extend(submit(&services, DEFAULT_TENANT_ID, 100, "low").await);
        ids.extend(submit(&services, DEFAULT_TENANT_ID, 20, "high").await);
        if round == 1 {
            let (joined, _) = worker_with_metrics(&env, "sched-rebalance-worker-2");
            workers.push(joined);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    signal(&workers[0], "KILL").await;
    let _ = workers[0].wait().await;
    ids.extend(submit(&services, DEFAULT_TENANT_ID, 50, "high").await);
    wait_all_succeeded(&env, &ids, 180).await;

    let ours: HashSet<Uuid> = ids.iter().copied().collect();
    let mut won = wins(&env.pool, "mark_succeeded").await;
    won.retain(|id, _| ours.contains(id));
    assert_exactly_once(&won, &ids, "succeeded");
    let size = wait_all_committed(&env).await;
    eprintln!(
        "rebalance: {} jobs, {size} records, all committed",
        ids.len()
    );
    stop(workers[1..].iter_mut()).await;
}

/// A flood deeper than the worker's read-ahead (8 records per partition,
/// 50 of A's in each): B's jobs, behind A's in every partition, are reached
/// by passing over A's records, which are read again later, instead of
/// after A's flood. Nothing is lost, done twice, or left uncommitted, and
/// the group's committed offsets, sampled throughout the passes and seeks
/// back, never pass a record whose job was not delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_deeper_than_the_read_ahead_is_passed_over_and_read_again() {
    let (env, _model, _warmup) = slow_model_env("sched_pass", |s| s.consumer_read_ahead = 8).await;
    let services = env.services().await;
    let b = tenants::create_tenant(&env.pool, "pass-b").await.unwrap();
    let (mut workers, metrics) = warm_workers(&env, &services, 1, "sched-pass").await;
    let mut sampler = sample_offsets(&env, env.pool.clone());
    sampler.first_sample().await;
    let a_ids = submit(&services, DEFAULT_TENANT_ID, 300, "normal").await;
    wait_under_way(&env, &a_ids, 10, "A's").await;
    let b_ids = submit(&services, b.key.tenant_id, 30, "normal").await;
    wait_all_succeeded(&env, &b_ids, 60).await;
    let a_done = times(&env, &a_ids).await.len();
    let passed = scrape(&metrics[0], "docstream_consumer_passed_over_total").await;
    eprintln!(
        "passing over: {a_done} of A's 300 done when B's 30 were; {passed} records passed over"
    );
    // Reached only after A's records ahead of them, B's would finish after
    // about 250 of A's; at 1 : 1 from the moment they arrive, after 60 or so.
    assert!(
        a_done <= 150,
        "B waited behind A's flood: {a_done} of A's done first"
    );
    assert!(passed > 0.0, "no record was passed over");
    wait_all_succeeded(&env, &a_ids, 120).await;
    let ids: Vec<Uuid> = a_ids.iter().chain(&b_ids).copied().collect();
    let ours: HashSet<Uuid> = ids.iter().copied().collect();
    let mut won = wins(&env.pool, "mark_succeeded").await;
    won.retain(|id, _| ours.contains(id));
    assert_exactly_once(&won, &ids, "succeeded");
    wait_all_committed(&env).await;
    let samples = sampler.finish().await;
    let ahead = offset_ahead_violations(&env, &samples, false);
    eprintln!(
        "passing over: {} samples of the committed offsets",
        samples.len()
    );
    assert_eq!(ahead, 0, "a committed offset passed an undelivered record");
    stop(workers.iter_mut()).await;
}
