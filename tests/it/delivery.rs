//! The delivery contract with real processes on the real broker: offsets are
//! committed only after delivery — through a graceful shutdown under load, a
//! rebalance under load (both group protocols), poison records, a backlog far
//! larger than memory should hold, and a `serve` stopped mid-burst.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::commits::{offset_ahead_violations, sample_offsets, Sample};
use common::{
    fast_recovery, free_port, peak_rss_kib, sample_body, scrape, signal, stop, submit_jobs,
    topic_size, wait_count, wait_for, wait_for_log_line, wins, TestEnv,
};
use docstream::events::{decode, DeadLetter, ExtractionSubmitted, PublishReason};
use docstream::roles::Process;
use futures::stream::{self, StreamExt};
use sqlx::PgPool;
use tokio::process::Child;
use uuid::Uuid;

const SUCCEEDED: &str = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";

/// Jobs in the worker SIGTERM test.
const SIGTERM_JOBS: usize = 2_000;

/// A worker SIGTERMed a quarter of the way through its jobs drains within its
/// timeout and exits 0; with a replacement, no job is lost or run twice, and
/// no committed offset was ever past an undelivered record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_commits_only_delivered_and_runs_nothing_twice() {
    // 16 records in flight (not the default 256) keeps the run long enough for
    // the offset sampler to see the commits move between its samples.
    let env = TestEnv::with_settings("sigterm_worker", |s| {
        fast_recovery(s);
        s.consumer_max_in_flight = 16;
    })
    .await;
    let services = env.services().await;
    let mut first = a_worker_taking_50ms_per_job(&env);
    let ids = submit_jobs(&services, SIGTERM_JOBS).await;
    let mut sampler = sample_offsets(&env, env.pool.clone());
    a_quarter_of_the_jobs_succeed(&env.pool).await;
    sampler.first_sample().await;
    let drained = sigterm_it_and_time_the_drain(&mut first).await;
    let mut replacement = env.spawn("worker", &[], "sigterm-worker-replacement");
    every_job_of_the_sigterm_test_succeeds(&env.pool).await;
    let samples = sampler.finish().await;
    it_drained_and_nothing_was_lost_run_twice_or_committed_ahead(&env, &ids, &samples, drained)
        .await;
    stop([&mut replacement]).await;
}

/// A worker whose records outlast its drain timeout is stopped by force: it
/// exits non-zero soon after the timeout and says so, and commits nothing it
/// did not deliver: the worker group's committed offsets, sampled through
/// the run and once after the exit, never pass a record whose job is not
/// delivered. Its records stall after their success and before their
/// bbox request is published (the follow-up the record owes), so a
/// replacement gets them again, publishes each follow-up, and runs no job
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_past_its_timeout_is_forced_and_commits_nothing_undelivered() {
    let env = TestEnv::with_settings("forced_drain", |s| {
        fast_recovery(s);
        s.subscriber_drain_timeout_s = common::secs(1.0);
    })
    .await;
    let services = env.services().await;
    let stalled = [(
        "DOCSTREAM_FAILPOINTS",
        "worker.after_mark_succeeded=sleep(60000)".to_owned(),
    )];
    let mut first = env.spawn("worker", &stalled, "forced-drain-first");
    let ids = submit_jobs(&services, 8).await;
    let mut sampler = sample_offsets(&env, env.pool.clone());
    sampler.first_sample().await;
    wait_count(
        &env.pool,
        "a success",
        SUCCEEDED,
        1,
        Duration::from_secs(60),
    )
    .await;

    let signalled = Instant::now();
    signal(&first, "TERM").await;
    let status = first.wait().await.unwrap();
    let took = signalled.elapsed();
    assert!(!status.success(), "a forced drain exited {status}");
    assert!(
        took < Duration::from_secs(15),
        "the drain of 1 s took {took:?} to give up"
    );
    let log = std::fs::read_to_string(common::log_path("forced-drain-first")).unwrap();
    assert!(
        log.contains("shutdown: forced; undelivered records not committed"),
        "the worker did not say its shutdown was forced"
    );
    // The last sample is taken now, after the forced drain's commit and
    // before a replacement delivers anything: the stalled jobs are still
    // undelivered, and no committed offset may have passed their records.
    let samples = sampler.finish().await;
    let last = samples.last().expect("a sample after the forced drain");
    assert!(
        !last.undelivered.is_empty(),
        "no job was undelivered after the forced drain: the check would check nothing"
    );
    let violations = offset_ahead_violations(&env, &samples, false);
    assert_eq!(
        violations,
        0,
        "a committed offset passed a record not delivered ({} samples)",
        samples.len()
    );

    let mut replacement = env.spawn("worker", &[], "forced-drain-replacement");
    let topic = env.topic(&env.settings.topic_post_processing);
    let brokers = env.settings.kafka_brokers.clone();
    let requested = || {
        common::read_topic(&brokers, &topic)
            .into_iter()
            .filter_map(|(_, payload)| {
                decode::<docstream::events::PostProcessingRequested>(&payload).ok()
            })
            .filter_map(|event| Uuid::parse_str(&event.extraction_id).ok())
            .collect::<HashSet<Uuid>>()
    };
    let every_bbox_request = || async {
        let missing = ids.iter().filter(|id| !requested().contains(id)).count();
        match missing {
            0 => Ok(()),
            n => Err(format!("{n} jobs without a bbox request")),
        }
    };
    wait_for(
        "every job's bbox request",
        Duration::from_secs(90),
        every_bbox_request,
    )
    .await;
    common::assert_exactly_once(&wins(&env.pool, "mark_succeeded").await, &ids, "successes");
    stop([&mut replacement]).await;
}

/// Starts the first worker, 50 ms per extraction.
fn a_worker_taking_50ms_per_job(env: &TestEnv) -> Child {
    let slow = [(
        "DOCSTREAM_FAILPOINTS",
        "worker.extract=sleep(50)".to_owned(),
    )];
    env.spawn("worker", &slow, "sigterm-worker-first")
}

/// Waits (up to 120 s) until a quarter of the jobs have succeeded.
async fn a_quarter_of_the_jobs_succeed(pool: &PgPool) {
    wait_count(
        pool,
        "a quarter of the jobs",
        SUCCEEDED,
        SIGTERM_JOBS as i64 / 4,
        Duration::from_secs(120),
    )
    .await;
}

/// The first worker's shutdown: its exit status, how long from the SIGTERM to
/// its exit, and when (ms since the epoch) it was signalled and exited.
struct Drained {
    status: std::process::ExitStatus,
    drain: Duration,
    signalled_ms: i64,
    exited_ms: i64,
}

/// SIGTERMs the worker, waits for it, and times the drain.
async fn sigterm_it_and_time_the_drain(worker: &mut Child) -> Drained {
    let signalled_ms = chrono::Utc::now().timestamp_millis();
    let terminated = Instant::now();
    signal(worker, "TERM").await;
    let status = worker.wait().await.unwrap();
    let drain = terminated.elapsed();
    let exited_ms = chrono::Utc::now().timestamp_millis();
    Drained {
        status,
        drain,
        signalled_ms,
        exited_ms,
    }
}

/// Waits (up to 180 s) until every job has succeeded.
async fn every_job_of_the_sigterm_test_succeeds(pool: &PgPool) {
    wait_count(
        pool,
        "every job",
        SUCCEEDED,
        SIGTERM_JOBS as i64,
        Duration::from_secs(180),
    )
    .await;
}

/// Prints the test's figures, then checks: the worker exited 0 within the
/// drain timeout and 2 s, no job was lost or run twice, no committed offset
/// was ahead of delivery, and the offsets were sampled before the SIGTERM and
/// after the exit.
async fn it_drained_and_nothing_was_lost_run_twice_or_committed_ahead(
    env: &TestEnv,
    ids: &[Uuid],
    samples: &[Sample],
    drained: Drained,
) {
    let Drained {
        status,
        drain,
        signalled_ms,
        exited_ms,
    } = drained;
    let runs = wins(&env.pool, "mark_running").await;
    let lost = ids.iter().filter(|id| !runs.contains_key(id)).count();
    let twice = runs.values().filter(|&&n| n > 1).count();
    let violations = offset_ahead_violations(env, samples, false);
    eprintln!(
        "sigterm test: jobs={SIGTERM_JOBS} exit={status} drain={:.2}s lost={lost} run_twice={twice} \
         offset_samples={} offset_ahead_violations={violations}",
        drain.as_secs_f64(),
        samples.len()
    );
    assert!(status.success(), "graceful shutdown exits 0");
    assert!(drain < env.settings.subscriber_drain_timeout_s.get() + Duration::from_secs(2));
    assert_eq!((lost, twice, violations), (0, 0, 0));
    let before = samples.iter().filter(|s| s.at_ms < signalled_ms).count();
    let after = samples.iter().filter(|s| s.at_ms > exited_ms).count();
    assert!(
        before > 0 && after > 0,
        "the offsets were sampled before the SIGTERM ({before}) and after the exit ({after})"
    );
}

/// Jobs in the rebalance test.
const REBALANCE_JOBS: usize = 3_000;

/// Three workers join one after another under load, then the first is
/// SIGKILLed: every job succeeds exactly once, and the group's committed
/// offsets never go backwards nor past an undelivered record.
async fn rebalance_under_load(protocol: &str) {
    // 16 records in flight and 200 ms per extraction: 80 jobs/s a worker, so
    // the joins and the kill happen with most of the jobs still to do.
    let env = TestEnv::with_settings(&format!("rebalance_{protocol}"), |s| {
        fast_recovery(s);
        s.kafka_group_protocol = protocol.parse().unwrap();
        s.consumer_max_in_flight = 16;
    })
    .await;
    let services = env.services().await;
    let ids = submit_jobs(&services, REBALANCE_JOBS).await;
    let mut sampler = sample_offsets(&env, env.pool.clone());
    sampler.first_sample().await;
    let mut workers = three_join_then_the_first_is_killed(&env, protocol).await;
    every_rebalanced_job_succeeds(&env.pool).await;
    let samples = sampler.finish().await;
    let duplicate_runs = every_job_succeeded_exactly_once(&env.pool, &ids).await;
    let figures = (workers.done_at_kill, duplicate_runs);
    offsets_never_went_backwards_nor_ahead(&env, protocol, &samples, figures);
    stop([&mut workers.b, &mut workers.c]).await;
}

/// The three workers of the rebalance test, and how many jobs had succeeded
/// when the first was killed.
struct Rebalancing {
    _a: Child,
    b: Child,
    c: Child,
    done_at_kill: i64,
}

/// The scenario: worker A starts; once a tenth of the jobs succeeded, B
/// joins; once B was assigned partitions, C joins; once C was, A is
/// SIGKILLed and reaped. Each step is checked to find jobs still to do, so
/// the rebalances happen under load or the test fails.
async fn three_join_then_the_first_is_killed(env: &TestEnv, protocol: &str) -> Rebalancing {
    let slow = [(
        "DOCSTREAM_FAILPOINTS",
        "worker.extract=sleep(200)".to_owned(),
    )];
    let name = |worker: &str| format!("rebalance-{protocol}-{worker}");
    let mut a = env.spawn("worker", &slow, &name("a"));
    let tenth = REBALANCE_JOBS as i64 / 10;
    wait_count(
        &env.pool,
        "a tenth of the jobs",
        SUCCEEDED,
        tenth,
        Duration::from_secs(120),
    )
    .await;
    let b = env.spawn("worker", &slow, &name("b"));
    assigned_partitions(&name("b")).await;
    still_under_load(&env.pool, "B joined").await;
    let c = env.spawn("worker", &slow, &name("c"));
    assigned_partitions(&name("c")).await;
    let done_at_kill = still_under_load(&env.pool, "C joined").await;
    signal(&a, "KILL").await;
    a.wait().await.unwrap();
    Rebalancing {
        _a: a,
        b,
        c,
        done_at_kill,
    }
}

/// Waits (up to 60 s) until the worker logged as `log_name` was assigned
/// partitions.
async fn assigned_partitions(log_name: &str) {
    let assigned = |line: &str| {
        line.split_once("partitions assigned partitions=")
            .is_some_and(|(_, n)| n.trim().parse::<u32>().is_ok_and(|n| n > 0))
    };
    let what = "partitions assigned";
    wait_for_log_line(log_name, what, assigned, Duration::from_secs(60)).await;
}

/// Jobs succeeded so far; panics if that is all of them (after `step`, the
/// test would no longer be under load).
async fn still_under_load(pool: &PgPool, step: &str) -> i64 {
    let done = common::count(pool, SUCCEEDED).await;
    assert!(
        done < REBALANCE_JOBS as i64,
        "every job had succeeded when {step}: the rebalance was not under load"
    );
    done
}

/// Waits (up to 240 s) for every job of the rebalance test to succeed.
async fn every_rebalanced_job_succeeds(pool: &PgPool) {
    wait_count(
        pool,
        "every job",
        SUCCEEDED,
        REBALANCE_JOBS as i64,
        Duration::from_secs(240),
    )
    .await;
}

/// Every id succeeded, none twice. Returns how many runs were repeats (the
/// jobs A held when killed, re-claimed after its lease).
async fn every_job_succeeded_exactly_once(pool: &PgPool, ids: &[Uuid]) -> i64 {
    let runs = wins(pool, "mark_running").await;
    let succeeded = wins(pool, "mark_succeeded").await;
    let all: HashSet<Uuid> = ids.iter().copied().collect();
    assert_eq!(
        succeeded.keys().copied().collect::<HashSet<_>>(),
        all,
        "every id succeeded"
    );
    assert!(
        succeeded.values().all(|&n| n == 1),
        "no job succeeded twice"
    );
    runs.values().map(|n| n - 1).sum()
}

/// How many times a partition's committed offset was lower than in the
/// sample before.
fn offsets_going_backwards(samples: &[Sample]) -> usize {
    let mut backwards = 0;
    for pair in samples.windows(2) {
        for (partition, later) in &pair[1].committed {
            if pair[0]
                .committed
                .get(partition)
                .is_some_and(|earlier| later < earlier)
            {
                backwards += 1;
            }
        }
    }
    backwards
}

/// Prints the rebalance test's figures (`done_at_kill`, `duplicate_runs`),
/// then checks that no committed offset went backwards or ahead of delivery.
fn offsets_never_went_backwards_nor_ahead(
    env: &TestEnv,
    protocol: &str,
    samples: &[Sample],
    (done_at_kill, duplicate_runs): (i64, i64),
) {
    let backwards = offsets_going_backwards(samples);
    let violations = offset_ahead_violations(env, samples, false);
    eprintln!(
        "rebalance test ({protocol}): jobs={REBALANCE_JOBS} done_when_a_killed={done_at_kill} lost=0 \
         duplicate_runs={duplicate_runs} (jobs A held when killed, re-claimed after its lease) \
         offsets_backwards={backwards} offset_ahead_violations={violations} samples={}",
        samples.len()
    );
    assert_eq!((backwards, violations), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_under_load_classic_protocol() {
    rebalance_under_load("classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_under_load_consumer_protocol() {
    rebalance_under_load("consumer").await;
}

/// Good jobs in the poison test, submitted 50 at a time.
const GOOD: usize = 1_000;

/// Three kinds of poison interleaved with good jobs (undecodable, of an
/// unknown schema, of a job with no row): each becomes one dead letter of its
/// kind, every good job succeeds, and the worker never crashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_go_to_the_dlq_and_never_stall_a_partition() {
    let env = TestEnv::with_settings("poison", fast_recovery).await;
    let services = env.services().await;
    let topic = env.topic("extraction.submitted");
    let mut worker = env.spawn("worker", &[], "poison-worker");
    let (ids, injected) = good_jobs_with_poison_interleaved(&services, &topic).await;
    let total_injected: usize = injected.values().sum();
    every_good_job_succeeds(&env.pool).await;
    the_dlq_holds_every_poison_record(&env, total_injected).await;
    let parked = one_dead_letter_per_poison_record(&env, &topic, &injected);
    assert_eq!(wins(&env.pool, "mark_succeeded").await.len(), ids.len());
    the_worker_never_crashed_and_exits_0(&mut worker).await;
    eprintln!(
        "poison test: good={GOOD} injected={total_injected} {injected:?} dlq={} processed={}",
        parked.values().sum::<usize>(),
        ids.len()
    );
}

/// Good submissions with three kinds of poison interleaved, on random keys
/// so they land on every partition: after each 50 jobs, one record of each
/// kind. Returns the good jobs' ids and how many of each kind went in.
async fn good_jobs_with_poison_interleaved(
    services: &Process,
    topic: &str,
) -> (Vec<Uuid>, HashMap<&'static str, usize>) {
    let mut injected: HashMap<&str, usize> = HashMap::new();
    let mut ids = Vec::new();
    for chunk in 0..GOOD / 50 {
        ids.extend(submit_jobs(services, 50).await);
        let key = Uuid::new_v4().to_string();
        let garbage = format!("not avro {chunk}").into_bytes();
        services
            .publisher
            .publish_bytes(topic, Some(key.as_bytes()), garbage)
            .await
            .unwrap();
        *injected.entry("undecodable").or_default() += 1;
        let mut stranger = vec![0xC3, 0x01, 9, 9, 9, 9, 9, 9, 9, 9];
        stranger.extend_from_slice(b"\x02x");
        services
            .publisher
            .publish_bytes(topic, Some(key.as_bytes()), stranger)
            .await
            .unwrap();
        *injected.entry("unknown_schema").or_default() += 1;
        let missing = ExtractionSubmitted::new(Uuid::new_v4(), PublishReason::Submit);
        services
            .publisher
            .publish(topic, key.as_bytes(), &missing)
            .await
            .unwrap();
        *injected.entry("missing_row").or_default() += 1;
    }
    (ids, injected)
}

/// Waits (up to 180 s) for every good job to succeed.
async fn every_good_job_succeeds(pool: &PgPool) {
    wait_count(
        pool,
        "every good job",
        SUCCEEDED,
        GOOD as i64,
        Duration::from_secs(180),
    )
    .await;
}

/// Waits (up to 60 s) until the DLQ holds `total_injected` records.
async fn the_dlq_holds_every_poison_record(env: &TestEnv, total_injected: usize) {
    let dlq = env.topic("extraction.dlq");
    let brokers = env.settings.kafka_brokers.clone();
    wait_for(
        "the DLQ to hold every poison record",
        Duration::from_secs(60),
        || {
            let n = topic_size(&brokers, &dlq);
            async move {
                if n >= total_injected as i64 {
                    Ok(())
                } else {
                    Err(format!("{n}/{total_injected}"))
                }
            }
        },
    )
    .await;
}

/// Every dead letter names `topic`, and there is one per poison record, by
/// reason. Returns the letters counted by reason.
fn one_dead_letter_per_poison_record(
    env: &TestEnv,
    topic: &str,
    injected: &HashMap<&str, usize>,
) -> HashMap<String, usize> {
    let mut parked: HashMap<String, usize> = HashMap::new();
    for (_, payload) in env.read_topic("extraction.dlq") {
        let letter: DeadLetter = decode(&payload).unwrap();
        assert_eq!(letter.topic, topic);
        *parked.entry(letter.error_kind).or_default() += 1;
    }
    let expected: HashMap<String, usize> =
        injected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(
        parked, expected,
        "one dead letter per poison record, by reason"
    );
    parked
}

/// The worker is still running; on SIGTERM it exits 0.
async fn the_worker_never_crashed_and_exits_0(worker: &mut Child) {
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker never crashed"
    );
    signal(worker, "TERM").await;
    assert!(worker.wait().await.unwrap().success());
}

/// Events in the backlog test.
const BACKLOG: i64 = 50_000;
/// The worker's peak RSS must stay below this.
const RSS_BOUND_MIB: u64 = 128;

/// A backlog of fifty thousand events far larger than memory should hold:
/// the worker's consumer pauses at its bound and its peak RSS stays below
/// [`RSS_BOUND_MIB`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_fifty_thousand_events_keeps_memory_bounded() {
    let env = TestEnv::with_settings("backlog", fast_recovery).await;
    let services = env.services().await;
    let ids = small_jobs_inserted_in_bulk(&env.pool).await;
    publish_every_one(&env, &services, &ids).await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut worker = env.spawn(
        "worker",
        &[("DOCSTREAM_METRICS_ADDR", metrics.clone())],
        "backlog-worker",
    );
    let pid = worker.id().unwrap();
    the_worker_chews_into_the_backlog(&env.pool).await;
    memory_stayed_bounded_as_the_consumer_paused(&env.pool, pid, &metrics).await;
    stop([&mut worker]).await;
}

/// Small jobs, inserted in bulk and marked published (they are, just
/// after); returns their ids.
async fn small_jobs_inserted_in_bulk(pool: &PgPool) -> Vec<Uuid> {
    let request = serde_json::json!({
        "document": {"text": "Invoice INV-1 Total 12.50"},
        "fields": [{"name": "total", "type": "money", "anchor": "Total"}]
    });
    sqlx::query_scalar(
        "WITH created AS (
             INSERT INTO extractions (id, tenant_id, status, published_at)
             SELECT gen_random_uuid(), $3, 'queued', now() FROM generate_series(1, $2)
             RETURNING id),
         requested AS (
             INSERT INTO extraction_requests (id, tenant_id, request_hash, request)
             SELECT id, $3, 'bulk', $1::json FROM created)
         SELECT id FROM created",
    )
    .bind(&request)
    .bind(BACKLOG)
    .bind(docstream::store::tenants::DEFAULT_TENANT_ID)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Publishes each job's submitted event, 2,000 at a time.
async fn publish_every_one(env: &TestEnv, services: &Process, ids: &[Uuid]) {
    let topic = env.topic("extraction.submitted");
    stream::iter(ids.iter())
        .map(|id| {
            let event = ExtractionSubmitted::new(*id, PublishReason::Submit);
            let (topic, publisher) = (&topic, &services.publisher);
            async move {
                publisher
                    .publish(topic, id.to_string().as_bytes(), &event)
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(2_000)
        .collect::<Vec<()>>()
        .await;
}

/// Waits (up to 120 s) until 2,000 jobs have succeeded.
async fn the_worker_chews_into_the_backlog(pool: &PgPool) {
    wait_count(
        pool,
        "the worker to chew into the backlog",
        SUCCEEDED,
        2_000,
        Duration::from_secs(120),
    )
    .await;
}

/// Reads the worker's peak RSS and its consumer's pauses and records passed
/// over, prints them, and checks it stopped receiving at its bound at least
/// once and stayed below [`RSS_BOUND_MIB`].
async fn memory_stayed_bounded_as_the_consumer_paused(pool: &PgPool, pid: u32, metrics: &str) {
    let peak_kib = peak_rss_kib(pid).expect("worker alive");
    let pauses = scrape(metrics, "docstream_consumer_pauses_total").await;
    let passed = scrape(metrics, "docstream_consumer_passed_over_total").await;
    let done = common::count(pool, SUCCEEDED).await;
    eprintln!(
        "backlog test: backlog={BACKLOG} processed_so_far={done} peak_rss={:.1} MiB (bound {RSS_BOUND_MIB} MiB) pauses={pauses} passed_over={passed}",
        peak_kib as f64 / 1024.0
    );
    // At its bound a partition pauses, or passes over the full lane's
    // records (kafka::passing) without receiving them.
    assert!(
        pauses + passed >= 1.0,
        "the consumer stopped receiving at its bound"
    );
    assert!(peak_kib < RSS_BOUND_MIB * 1024, "peak RSS {peak_kib} KiB");
}

/// Submissions in the mid-burst test.
const BURST: usize = 500;

/// `serve` SIGTERMed while a burst of submissions is in flight: every burst
/// answer is 202 or 503, requests after shutdown began are refused (503 or not
/// connected), `serve` exits 0, and every accepted submission succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_serve_mid_burst_loses_no_accepted_request() {
    let env = TestEnv::with_settings("sigterm_serve", fast_recovery).await;
    let mut run = a_slow_serve_and_a_worker(&env).await;
    let burst = run.a_burst_of_submissions();
    requests_are_in_flight(&env.pool).await;
    run.sigterm_serve().await;
    run.the_gate_closes().await;
    let late = run.twenty_late_submissions().await;
    let outcome = run.after_the_burst_and_serve_end(burst, late).await;
    let accepted = outcome.every_answer_is_202_or_503_and_serve_drained();
    every_accepted_submission_succeeds(&env.pool, &accepted).await;
    outcome.report(&accepted);
    stop([&mut run.worker]).await;
}

/// What each burst request got: its status and JSON body, or `None` when it
/// was not answered.
type Answers = Vec<Option<(reqwest::StatusCode, serde_json::Value)>>;

/// `serve` (slow to publish), a worker, and a client that keeps no idle
/// connections.
struct ServeRun {
    client: reqwest::Client,
    worker: Child,
    serve: Child,
    base: String,
}

/// The burst's task, and the answers it collects.
struct Burst {
    task: tokio::task::JoinHandle<()>,
    answers: Arc<Mutex<Answers>>,
}

/// What the burst, the late requests and `serve`'s exit came to.
struct Outcome {
    answers: Answers,
    late: Vec<Option<reqwest::StatusCode>>,
    status: std::process::ExitStatus,
}

/// Starts `serve` with 300 ms between a submit's INSERT and its publish, and
/// a worker; waits for the API to be healthy.
async fn a_slow_serve_and_a_worker(env: &TestEnv) -> ServeRun {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // Each submit takes 300 ms between INSERT and publish, so the burst is in flight.
    let serve_env = [
        ("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")),
        (
            "DOCSTREAM_FAILPOINTS",
            "submit.after_insert=sleep(300)".to_owned(),
        ),
    ];
    let serve = env.spawn("serve", &serve_env, "sigterm-serve");
    let worker = env.spawn("worker", &[], "sigterm-serve-worker");
    common::wait_healthy(&base).await;
    let client = env
        .client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    ServeRun {
        client,
        worker,
        serve,
        base,
    }
}

/// Waits (up to 30 s) until at least 50 submissions have their row.
async fn requests_are_in_flight(pool: &PgPool) {
    wait_for("requests in flight", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let n = common::count(&pool, "SELECT count(*) FROM extractions").await;
            if n >= 50 {
                Ok(())
            } else {
                Err(format!("{n} rows"))
            }
        }
    })
    .await;
}

impl ServeRun {
    /// Starts [`BURST`] submissions all at once in a task of their own.
    fn a_burst_of_submissions(&self) -> Burst {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (client, base, kept) = (self.client.clone(), self.base.clone(), answers.clone());
        let task = tokio::spawn(async move {
            stream::iter(0..BURST)
                .for_each_concurrent(BURST, |i| {
                    let (client, base, answers) = (client.clone(), base.clone(), kept.clone());
                    async move {
                        let sent = client
                            .post(format!("{base}/v1/extractions"))
                            .json(&sample_body(i))
                            .send()
                            .await;
                        let answer = match sent {
                            Ok(r) => Some((
                                r.status(),
                                r.json::<serde_json::Value>().await.unwrap_or_default(),
                            )),
                            Err(_) => None,
                        };
                        answers.lock().unwrap().push(answer);
                    }
                })
                .await
        });
        Burst { task, answers }
    }

    /// Sends SIGTERM to `serve`.
    async fn sigterm_serve(&self) {
        signal(&self.serve, "TERM").await;
    }

    /// Once the gate is closed, every new request is refused with 503 (or, after
    /// the listener closed, not connected at all) — never accepted. Waits (up
    /// to 10 s) for `/healthz` to answer 503.
    async fn the_gate_closes(&self) {
        let (client, base) = (&self.client, &self.base);
        wait_for("the gate to close", Duration::from_secs(10), || {
            let request = client.get(format!("{base}/healthz")).send();
            async move {
                match request.await {
                    Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => Ok(()),
                    Ok(r) => Err(format!("status {}", r.status())),
                    Err(e) => Err(format!("not connected: {e}")),
                }
            }
        })
        .await;
    }

    /// Twenty submissions one after another, after the gate closed: the
    /// status of each, or `None` when it was not answered.
    async fn twenty_late_submissions(&self) -> Vec<Option<reqwest::StatusCode>> {
        let (client, base) = (&self.client, &self.base);
        stream::iter(0..20)
            .then(|i| {
                let request = client
                    .post(format!("{base}/v1/extractions"))
                    .json(&sample_body(i))
                    .send();
                async move { request.await.ok().map(|r| r.status()) }
            })
            .collect()
            .await
    }

    /// Waits for the burst to end, then for `serve` to exit.
    async fn after_the_burst_and_serve_end(
        &mut self,
        burst: Burst,
        late: Vec<Option<reqwest::StatusCode>>,
    ) -> Outcome {
        burst.task.await.unwrap();
        let status = self.serve.wait().await.unwrap();
        let answers = burst.answers.lock().unwrap().clone();
        Outcome {
            answers,
            late,
            status,
        }
    }
}

impl Outcome {
    /// Every burst answer is 202 or 503, every late request was refused (503
    /// or not connected) and at least one was answered 503, and `serve` exited
    /// 0. Returns the ids of the accepted submissions.
    fn every_answer_is_202_or_503_and_serve_drained(&self) -> Vec<Uuid> {
        let (answers, late, status) = (&self.answers, &self.late, self.status);
        let accepted: Vec<Uuid> = answers
            .iter()
            .flatten()
            .filter(|(s, _)| *s == reqwest::StatusCode::ACCEPTED)
            .map(|(_, body)| body["id"].as_str().unwrap().parse().unwrap())
            .collect();
        let other: Vec<_> = answers
            .iter()
            .flatten()
            .filter(|(s, _)| {
                *s != reqwest::StatusCode::ACCEPTED
                    && *s != reqwest::StatusCode::SERVICE_UNAVAILABLE
            })
            .collect();
        assert!(other.is_empty(), "every answer is 202 or 503: {other:?}");
        let late_503 = self.late_503();
        assert!(
            late.iter()
                .all(|s| s.is_none() || *s == Some(reqwest::StatusCode::SERVICE_UNAVAILABLE)),
            "requests after shutdown began: {late:?}"
        );
        assert!(late_503 >= 1, "the gate answered while draining: {late:?}");
        assert!(status.success(), "serve drained gracefully: {status}");
        accepted
    }

    /// How many late requests were answered 503.
    fn late_503(&self) -> usize {
        self.late
            .iter()
            .filter(|s| **s == Some(reqwest::StatusCode::SERVICE_UNAVAILABLE))
            .count()
    }

    /// Prints the test's figures.
    fn report(&self, accepted: &[Uuid]) {
        let refused = self
            .answers
            .iter()
            .flatten()
            .filter(|(s, _)| *s == reqwest::StatusCode::SERVICE_UNAVAILABLE)
            .count();
        let late_503 = self.late_503();
        eprintln!(
            "serve sigterm test: burst={BURST} accepted={} refused_503={refused} not_connected={} \
             late_requests_503={late_503}/{} lost=0",
            accepted.len(),
            self.answers.iter().filter(|a| a.is_none()).count(),
            self.late.len()
        );
    }
}

/// Waits (up to 120 s) until every accepted submission has succeeded.
async fn every_accepted_submission_succeeds(pool: &PgPool, accepted: &[Uuid]) {
    let wanted = accepted.len() as i64;
    let accepted_done = format!(
        "SELECT count(*) FROM extractions WHERE status = 'succeeded' AND id IN ({})",
        accepted
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(",")
    );
    wait_count(
        pool,
        "every accepted submission to succeed",
        &accepted_done,
        wanted,
        Duration::from_secs(120),
    )
    .await;
}
