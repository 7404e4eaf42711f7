//! Crash safety with real processes on the real broker and database: workers are
//! SIGKILLed, SIGSTOPped past their lease and thawed, orphans of every class are
//! revived by the reapers, retries back off and give up, and operators cancel and
//! reclaim. Every check is on sets of ids and counts of transitions.

use crate::common;

use docstream::domain::Stage;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{
    assert_exactly_once, count, fast_recovery, free_port, insert_job, percentile, sample_body,
    scrape, signal, stop, submit_jobs, wait_count, wait_for, wins, TestEnv, ALL_BBOX_SUCCEEDED,
};
use docstream::events::{decode, ExtractionSubmitted, PostProcessingRequested, PublishReason};
use docstream::pipeline::{ReaperKind, Sweep};
use docstream::store;
use tokio::process::Child;
use uuid::Uuid;

const KILL_JOBS: usize = 2_500;

/// Two of three workers are SIGKILLed with thousands of jobs in flight and
/// restarted 3 s later: every job still succeeds exactly once, and no recovery
/// takes longer than lease + sweep + 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_two_of_three_workers_under_load_loses_nothing() {
    // 16 records in flight per worker and 100 ms per extraction: three workers
    // take several seconds over the jobs, so thousands are in flight at the kill.
    let env = TestEnv::with_settings("kill_workers", |s| {
        fast_recovery(s);
        s.consumer_max_in_flight = 16;
    })
    .await;
    let mut scenario = three_slow_workers_under_load(&env).await;
    scenario.every_worker_holds_records().await;
    let kill = scenario.sigkill_two_of_them_and_restart_them().await;
    let healed_in = every_job_reaches_bbox_succeeded(&env, &kill).await;
    every_job_succeeded_exactly_once(&env, &scenario.ids).await;
    recovery_was_within_lease_plus_sweep(&env, &kill, healed_in).await;
    scenario.stop_every_worker().await;
}

/// Three slow workers and a bbox worker over [`KILL_JOBS`] submitted jobs.
/// Fields are in the order the test's locals used to be dropped.
struct KillScenario<'a> {
    env: &'a TestEnv,
    bbox: Child,
    workers: Vec<Child>,
    metrics: Vec<String>,
    ids: Vec<Uuid>,
    _services: docstream::roles::Process,
}

/// What the kill left behind: how many jobs were unfinished, and when.
struct Kill {
    in_flight: i64,
    killed_at: Instant,
}

/// Submits the jobs, then starts three workers (100 ms per extraction, each
/// with its own metrics address) and a bbox worker.
async fn three_slow_workers_under_load(env: &TestEnv) -> KillScenario<'_> {
    let services = env.services().await;
    let ids = submit_jobs(&services, KILL_JOBS).await;
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let workers: Vec<Child> = (0..3)
        .map(|i| env.spawn("worker", &slow(&metrics, i), &format!("kill-worker-{i}")))
        .collect();
    let bbox = env.spawn("bbox-worker", &[], "kill-bbox-worker");
    KillScenario {
        env,
        bbox,
        workers,
        metrics,
        ids,
        _services: services,
    }
}

/// The environment of slow worker `i`: 100 ms per extraction, and the
/// metrics address `metrics[i]`.
fn slow(metrics: &[String], i: usize) -> [(&'static str, String); 2] {
    [
        (
            "DOCSTREAM_FAILPOINTS",
            "worker.extract=sleep(100)".to_owned(),
        ),
        ("DOCSTREAM_METRICS_ADDR", metrics[i].clone()),
    ]
}

impl KillScenario<'_> {
    /// The two we kill must hold claims: waits until every worker has records
    /// in flight.
    async fn every_worker_holds_records(&self) {
        let every_worker = "every worker to have records in flight";
        wait_for(every_worker, Duration::from_secs(60), || async {
            let mut holding = 0;
            for addr in &self.metrics {
                if scrape(addr, "docstream_in_flight_records").await >= 1.0 {
                    holding += 1;
                }
            }
            match holding {
                3 => Ok(()),
                n => Err(format!("{n} of 3 workers hold records")),
            }
        })
        .await;
    }

    /// Counts the unfinished jobs, SIGKILLs the first two workers and reaps
    /// them, then restarts both 3 s later.
    async fn sigkill_two_of_them_and_restart_them(&mut self) -> Kill {
        let succeeded = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";
        let in_flight = KILL_JOBS as i64 - count(&self.env.pool, succeeded).await;
        for worker in &mut self.workers[..2] {
            signal(worker, "KILL").await;
            worker.wait().await.unwrap();
        }
        let killed_at = Instant::now();
        // The scenario, not a stand-in for a condition: the orchestrator restarts the
        // killed workers a few seconds later.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let env = self.env;
        self.workers[0] = env.spawn("worker", &slow(&self.metrics, 0), "kill-worker-0-restarted");
        self.workers[1] = env.spawn("worker", &slow(&self.metrics, 1), "kill-worker-1-restarted");
        Kill {
            in_flight,
            killed_at,
        }
    }

    /// SIGTERMs the workers, then the bbox worker, and waits for them.
    async fn stop_every_worker(&mut self) {
        stop(
            self.workers
                .iter_mut()
                .chain(std::iter::once(&mut self.bbox)),
        )
        .await;
    }
}

/// Waits (up to 300 s) for every job to reach bbox succeeded; returns how
/// long after the kill that was.
async fn every_job_reaches_bbox_succeeded(env: &TestEnv, kill: &Kill) -> Duration {
    wait_count(
        &env.pool,
        "every job to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        KILL_JOBS as i64,
        Duration::from_secs(300),
    )
    .await;
    kill.killed_at.elapsed()
}

/// Nothing lost, nothing run twice: one extraction success and one bbox
/// success per submitted job.
async fn every_job_succeeded_exactly_once(env: &TestEnv, ids: &[Uuid]) {
    let pool = &env.pool;
    assert_exactly_once(&wins(pool, "mark_succeeded").await, ids, "mark_succeeded");
    assert_exactly_once(
        &wins(pool, "mark_bbox_refinement_succeeded").await,
        ids,
        "bbox succeeded",
    );
}

/// Prints the kill test's figures, then checks that thousands of jobs were
/// in flight at the kill, that some were recovered, and that no recovery
/// took longer than lease + sweep + 3 s.
async fn recovery_was_within_lease_plus_sweep(env: &TestEnv, kill: &Kill, healed_in: Duration) {
    let recoveries = recovery_times(&env.pool).await;
    let in_flight = kill.in_flight;
    let s = &env.settings;
    let bound =
        s.extraction_run_lease_s.as_secs_f64() + s.reaper_sweep_interval_s.as_secs_f64() + 3.0;
    let max = recoveries.last().copied().unwrap_or(0.0);
    eprintln!(
        "kill test: jobs={KILL_JOBS} in_flight_at_kill={in_flight} killed=2 lost=0 duplicate_succeeded=0 \
         recovered={} recovery_p50={:.2}s recovery_max={max:.2}s (lease {}s, sweep {}s) all_done_after_kill={:.1}s",
        recoveries.len(),
        percentile(&recoveries, 0.5),
        s.extraction_run_lease_s.as_secs_f64(),
        s.reaper_sweep_interval_s.as_secs_f64(),
        healed_in.as_secs_f64()
    );
    assert!(
        in_flight >= 2_000,
        "only {in_flight} jobs were in flight at the kill"
    );
    assert!(
        !recoveries.is_empty(),
        "the killed workers held claims; some job must have been recovered"
    );
    assert!(
        max <= bound,
        "recovery took {max:.2}s, above lease + sweep + 3s = {bound}s"
    );
}

/// Every recorded recovery time (`last_recovery_s`), sorted.
async fn recovery_times(pool: &sqlx::PgPool) -> Vec<f64> {
    let mut recoveries: Vec<f64> = sqlx::query_scalar(
        "SELECT last_recovery_s FROM extractions WHERE last_recovery_s IS NOT NULL ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    recoveries.sort_by(f64::total_cmp);
    recoveries
}

/// A worker SIGSTOPped while it holds claims, past its lease: another worker
/// finishes every job, and once thawed the frozen one's completions are
/// rejected as stale; no job succeeds twice or gets two follow-ups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_past_its_lease_is_fenced_out_when_thawed() {
    let env = TestEnv::with_settings("sigstop", fast_recovery).await;
    let mut frozen = a_slow_worker_holding_claims_on_twenty_jobs(&env).await;
    let held = frozen.sigstop_it().await;
    let mut b = worker_b_finishes_every_job(&env, &frozen.ids).await;
    let rejected = frozen.thaw_it_and_see_its_stale_work_rejected(&held).await;
    every_job_succeeded_once_with_one_follow_up(&env, &frozen.ids).await;
    each_frozen_claim_was_claimed_once_more(&env, &held).await;
    eprintln!(
        "sigstop test: jobs={} frozen_claims={} stale_completions_rejected={rejected} duplicate_succeeded=0 \
         duplicate_follow_ups=0",
        frozen.ids.len(),
        held.len()
    );
    stop([&mut frozen.a, &mut b]).await;
}

/// Worker A (1.5 s per extraction, on its own metrics address) and the
/// jobs it was given. Fields are in the order the test's locals used to be
/// dropped.
struct Frozen<'a> {
    env: &'a TestEnv,
    ids: Vec<Uuid>,
    a: Child,
    metrics_a: String,
    _services: docstream::roles::Process,
}

/// Starts worker A, submits twenty jobs, and waits (up to 60 s) until one
/// is running.
async fn a_slow_worker_holding_claims_on_twenty_jobs(env: &TestEnv) -> Frozen<'_> {
    let services = env.services().await;
    let metrics_a = format!("127.0.0.1:{}", free_port());
    let frozen_env = [
        (
            "DOCSTREAM_FAILPOINTS",
            "worker.extract=sleep(1500)".to_owned(),
        ),
        ("DOCSTREAM_METRICS_ADDR", metrics_a.clone()),
    ];
    let a = env.spawn("worker", &frozen_env, "sigstop-worker-a");
    let ids = submit_jobs(&services, 20).await;
    let running = "SELECT count(*) FROM extractions WHERE status = 'running'";
    wait_count(
        &env.pool,
        "worker A to hold claims",
        running,
        1,
        Duration::from_secs(60),
    )
    .await;
    Frozen {
        env,
        ids,
        a,
        metrics_a,
        _services: services,
    }
}

impl Frozen<'_> {
    /// SIGSTOPs worker A; returns the jobs running then, the claims it holds.
    async fn sigstop_it(&self) -> Vec<Uuid> {
        signal(&self.a, "STOP").await;
        sqlx::query_scalar("SELECT id FROM extractions WHERE status = 'running'")
            .fetch_all(&self.env.pool)
            .await
            .unwrap()
    }

    /// SIGCONTs worker A and waits (up to 60 s) until it has had as many
    /// stale completions rejected as it held claims; returns the count
    /// scraped once more after that.
    async fn thaw_it_and_see_its_stale_work_rejected(&self, held: &[Uuid]) -> f64 {
        signal(&self.a, "CONT").await;
        let stale = "docstream_stale_completions_total";
        wait_for(
            "A's stale work to be rejected",
            Duration::from_secs(60),
            || {
                let metrics_a = self.metrics_a.clone();
                let want = held.len() as f64;
                async move {
                    let n = scrape(&metrics_a, stale).await;
                    if n >= want {
                        Ok(n)
                    } else {
                        Err(format!("{n}/{want} rejected"))
                    }
                }
            },
        )
        .await;
        scrape(&self.metrics_a, stale).await
    }
}

/// Starts worker B and waits (up to 120 s) until every job has succeeded.
async fn worker_b_finishes_every_job(env: &TestEnv, ids: &[Uuid]) -> Child {
    let b = env.spawn("worker", &[], "sigstop-worker-b");
    let succeeded = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";
    wait_count(
        &env.pool,
        "worker B to finish every job",
        succeeded,
        ids.len() as i64,
        Duration::from_secs(120),
    )
    .await;
    b
}

/// Every job succeeded once, and had exactly one follow-up event.
async fn every_job_succeeded_once_with_one_follow_up(env: &TestEnv, ids: &[Uuid]) {
    assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        ids,
        "mark_succeeded",
    );
    let mut follow_ups: HashMap<String, usize> = HashMap::new();
    for (_, payload) in env.read_topic("extraction.post_processing.requested") {
        let event: PostProcessingRequested = decode(&payload).unwrap();
        *follow_ups.entry(event.extraction_id).or_default() += 1;
    }
    assert_eq!(follow_ups.len(), ids.len());
    assert!(
        follow_ups.values().all(|&n| n == 1),
        "duplicate follow-up events: {follow_ups:?}"
    );
}

/// Each job the frozen worker held was claimed exactly once more.
async fn each_frozen_claim_was_claimed_once_more(env: &TestEnv, held: &[Uuid]) {
    for id in held {
        let row = store::get(&env.pool, *id).await.unwrap().unwrap();
        assert_eq!(row.attempts, 2, "{id} was re-claimed exactly once");
    }
}

/// Crafts one orphan of each class in SQL and returns (class, id).
async fn craft_orphans(env: &TestEnv) -> Vec<(i16, Uuid)> {
    let pool = &env.pool;
    let s = &env.settings;
    let queued_old = format!(
        "now() - make_interval(secs => {})",
        s.queued_orphan_threshold_s.as_secs_f64() + 1.0
    );
    let pp_old = format!(
        "now() - make_interval(secs => {})",
        s.post_processing_pending_orphan_threshold_s.as_secs_f64() + 1.0
    );
    let request: docstream::domain::ExtractionRequest =
        serde_json::from_value(sample_body(0)).unwrap();
    let result = serde_json::to_value(docstream::extract::rule_extract(&request).unwrap()).unwrap();
    let crafted = [
        (1, format!("UPDATE extractions SET submitted_at = {queued_old} WHERE id = $1")),
        (2, "UPDATE extractions SET status = 'running', attempts = 1, started_at = now() - interval '5 seconds',
                lease_expires_at = now() - interval '1 second' WHERE id = $1".to_owned()),
        (3, format!("UPDATE extractions SET attempts = 1, error = 'flaky', next_attempt_at = {queued_old} WHERE id = $1")),
        (4, format!("WITH stored AS (INSERT INTO extraction_results (id, stage, result) VALUES ($1, 'extraction', $2))
                UPDATE extractions SET status = 'succeeded', attempts = 1, finished_at = {pp_old},
                bbox_status = 'pending', bbox_attempts = 0 WHERE id = $1")),
        (5, "WITH stored AS (INSERT INTO extraction_results (id, stage, result) VALUES ($1, 'extraction', $2))
                UPDATE extractions SET status = 'succeeded', attempts = 1, finished_at = now(),
                bbox_status = 'running', bbox_attempts = 1, bbox_lease_expires_at = now() - interval '1 second'
                WHERE id = $1".to_owned()),
    ];
    let mut orphans = Vec::new();
    for (class, sql) in crafted {
        let id = insert_job(pool).await;
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id);
        if class >= 4 {
            query = query.bind(&result);
        }
        assert_eq!(query.execute(pool).await.unwrap().rows_affected(), 1);
        orphans.push((class, id));
    }
    orphans
}

/// One orphan of each class, crafted in SQL: `docstream orphans` lists all
/// five, and the reapers revive each, republishing it once on the topic of
/// its class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_orphan_class_is_listed_and_revived_by_the_reapers() {
    let env = TestEnv::with_settings("orphan_classes", fast_recovery).await;
    let orphans = craft_orphans(&env).await;
    the_operator_sees_all_five_listed(&env, &orphans).await;
    let started = Instant::now();
    let mut worker = env.spawn("worker", &[], "orphans-worker");
    let mut bbox = env.spawn("bbox-worker", &[], "orphans-bbox-worker");
    let revived_in = all_five_finish(&env, started).await;
    each_was_republished_once_on_the_topic_of_its_class(&env, &orphans);
    the_claims_recorded_their_recovery(&env, &orphans, revived_in).await;
    stop([&mut worker, &mut bbox]).await;
}

/// The operator's view first: `docstream orphans --json` names all five.
async fn the_operator_sees_all_five_listed(env: &TestEnv, orphans: &[(i16, Uuid)]) {
    let listed = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
        .args(["orphans", "--json"])
        .envs(env.child_env())
        .output()
        .await
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let listed: HashSet<(i64, String)> = listed
        .iter()
        .map(|o| {
            (
                o["class"].as_i64().unwrap(),
                o["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let crafted: HashSet<(i64, String)> = orphans
        .iter()
        .map(|(c, id)| (*c as i64, id.to_string()))
        .collect();
    assert_eq!(listed, crafted);
}

/// Waits (up to 60 s) for all five to reach bbox succeeded; returns how long
/// after `started` that was.
async fn all_five_finish(env: &TestEnv, started: Instant) -> Duration {
    wait_count(
        &env.pool,
        "all five orphans to finish",
        ALL_BBOX_SUCCEEDED,
        5,
        Duration::from_secs(60),
    )
    .await;
    started.elapsed()
}

/// Each was republished by a reaper exactly once, on the topic of its class.
/// (A revived job's follow-up events carry the reason of the chain that
/// caused them, so classes 1-3 also send one reaper-reason bbox request.)
fn each_was_republished_once_on_the_topic_of_its_class(env: &TestEnv, orphans: &[(i16, Uuid)]) {
    let mut submitted: HashMap<String, usize> = HashMap::new();
    for (_, payload) in env.read_topic("extraction.submitted") {
        let event: ExtractionSubmitted = decode(&payload).unwrap();
        assert_eq!(event.reason, PublishReason::Reaper);
        *submitted.entry(event.extraction_id).or_default() += 1;
    }
    let mut bbox_requests: HashMap<String, usize> = HashMap::new();
    for (_, payload) in env.read_topic("extraction.post_processing.requested") {
        let event: PostProcessingRequested = decode(&payload).unwrap();
        assert_eq!(event.reason, PublishReason::Reaper);
        *bbox_requests.entry(event.extraction_id).or_default() += 1;
    }
    for (class, id) in orphans {
        let topic = if *class <= 3 {
            &submitted
        } else {
            &bbox_requests
        };
        assert_eq!(
            topic.get(&id.to_string()),
            Some(&1),
            "class {class} orphan {id}"
        );
    }
}

/// Prints how fast the orphans were revived, then checks that classes 1-3
/// recorded their recovery on the claim.
async fn the_claims_recorded_their_recovery(
    env: &TestEnv,
    orphans: &[(i16, Uuid)],
    revived_in: Duration,
) {
    let recovered = count(
        &env.pool,
        "SELECT count(*) FROM extractions WHERE last_recovery_s IS NOT NULL",
    )
    .await;
    eprintln!(
        "orphan classes 1-5: revived {} of 5 in {:.1}s (processes started from cold)",
        orphans.len(),
        revived_in.as_secs_f64()
    );
    assert!(
        recovered >= 3,
        "classes 1-3 record their recovery on the claim"
    );
}

/// Orphans in the two-reapers test.
const ORPHANS: usize = 60;

/// Two replicas' reapers sweeping at once (ten sweeps each) republish each
/// orphan once; an acknowledged republish is not repeated, and a lost one
/// only once its threshold has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reapers_republish_each_orphan_once_per_threshold() {
    let env = TestEnv::with_settings("two_reapers", fast_recovery).await;
    orphans_queued_an_hour_ago(&env.pool).await;
    let replicas = [env.services().await, env.services().await];
    let outcomes = sweep_round(&replicas).await;
    each_orphan_republished(&env, 1);
    report_who_took_the_lock(&outcomes);

    // An acknowledged republish is recorded: the job is waiting in Kafka, not lost.
    sweep_round(&replicas).await;
    each_orphan_republished(&env, 1);
    // Had the record been lost, the orphan is still not republished before its
    // threshold passes...
    forget_every_publish(&env.pool).await;
    sweep_round(&replicas).await;
    each_orphan_republished(&env, 1);
    // ...and once it has passed (moved back in SQL), exactly once more.
    move_every_republish_an_hour_back(&env.pool).await;
    sweep_round(&replicas).await;
    each_orphan_republished(&env, 2);
}

/// Inserts [`ORPHANS`] jobs and backdates their submission by an hour.
async fn orphans_queued_an_hour_ago(pool: &sqlx::PgPool) {
    for _ in 0..ORPHANS {
        insert_job(pool).await;
    }
    sqlx::query("UPDATE extractions SET submitted_at = now() - interval '1 hour'")
        .execute(pool)
        .await
        .unwrap();
}

/// Ten concurrent extraction-reaper sweeps on each replica, all at once.
async fn sweep_round(replicas: &[docstream::roles::Process]) -> Vec<Sweep> {
    let sweeps = replicas.iter().flat_map(|services| {
        (0..10).map(move |_| async move {
            docstream::roles::reaper(services, ReaperKind::Extraction)
                .sweep()
                .await
                .unwrap()
        })
    });
    futures::future::join_all(sweeps).await
}

/// Every orphan is on the submitted topic, each exactly `expected` times.
fn each_orphan_republished(env: &TestEnv, expected: usize) {
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for (_, payload) in env.read_topic("extraction.submitted") {
        *per_id
            .entry(
                decode::<ExtractionSubmitted>(&payload)
                    .unwrap()
                    .extraction_id,
            )
            .or_default() += 1;
    }
    assert_eq!(per_id.len(), ORPHANS);
    let off: Vec<_> = per_id.values().filter(|&&n| n != expected).collect();
    assert!(
        off.is_empty(),
        "expected {expected} republish per orphan, got {off:?}"
    );
}

/// Prints how many of the first round's sweeps swept and how many found the
/// lock taken.
fn report_who_took_the_lock(outcomes: &[Sweep]) {
    let swept = outcomes
        .iter()
        .filter(|o| matches!(o, Sweep::Swept { .. }))
        .count();
    eprintln!("two reapers: 20 concurrent sweeps, {swept} swept, {} found the lock taken; {ORPHANS} orphans republished once each", 20 - swept);
}

/// Clears every job's `published_at`, as if the republished record was lost.
async fn forget_every_publish(pool: &sqlx::PgPool) {
    sqlx::query("UPDATE extractions SET published_at = NULL")
        .execute(pool)
        .await
        .unwrap();
}

/// Moves every `republished_at` an hour back, past the threshold.
async fn move_every_republish_an_hour_back(pool: &sqlx::PgPool) {
    sqlx::query("UPDATE extractions SET republished_at = republished_at - interval '1 hour'")
        .execute(pool)
        .await
        .unwrap();
}

/// The last net: a job whose record the worker group committed past without
/// delivering it (what the consumer's ledger rules out) is stamped
/// published, so classes 1 and 3 leave it alone. Once the unclaimed grace
/// passed, the extraction reaper revives it (class 7), and it succeeds on
/// its first claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_committed_past_without_delivery_is_revived() {
    let env = TestEnv::with_settings("committed_past", |s| {
        fast_recovery(s);
        s.unclaimed_orphan_threshold_s = common::secs(4.0);
    })
    .await;
    let id = a_job_published_and_stamped(&env).await;
    the_worker_group_commits_past_the_topic(&env);
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut worker = env.spawn(
        "worker",
        &[("DOCSTREAM_METRICS_ADDR", metrics.clone())],
        "committed-past-worker",
    );
    wait_count(
        &env.pool,
        "the job committed past to succeed",
        &format!("SELECT count(*) FROM extractions WHERE id = '{id}' AND status = 'succeeded'"),
        1,
        Duration::from_secs(60),
    )
    .await;
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM extractions WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 1, "claimed once, on the revived record");
    let revived = scrape(&metrics, "docstream_orphans_republished_total{class=\"7\"}").await;
    assert_eq!(revived, 1.0, "counted as class 7, once");
    let records = env.read_topic("extraction.submitted").len();
    assert_eq!(records, 2, "the record committed past, and the revived one");
    stop([&mut worker]).await;
}

/// A queued job with its record on the submitted topic and its "published"
/// stamp: one class-1 revival by a reaper in this process does both.
async fn a_job_published_and_stamped(env: &TestEnv) -> Uuid {
    let id = insert_job(&env.pool).await;
    sqlx::query("UPDATE extractions SET submitted_at = now() - interval '1 hour' WHERE id = $1")
        .bind(id)
        .execute(&env.pool)
        .await
        .unwrap();
    let services = env.services().await;
    let reaper = docstream::roles::reaper(&services, ReaperKind::Extraction);
    let swept = reaper.sweep().await.unwrap();
    assert_eq!(
        swept,
        Sweep::Swept {
            found: 1,
            republished: 1
        }
    );
    wait_count(
        &env.pool,
        "the republished record's stamp",
        &format!("SELECT count(*) FROM extractions WHERE id = '{id}' AND published_at IS NOT NULL"),
        1,
        Duration::from_secs(30),
    )
    .await;
    id
}

/// Commits the worker group's offset of every partition of the submitted
/// topic at its end, as a consumer that committed past a record would.
fn the_worker_group_commits_past_the_topic(env: &TestEnv) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let topic = env.settings.topic("extraction.submitted");
    let group = env.settings.group(&env.settings.worker_group);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let metadata = (consumer)
        .fetch_metadata(Some(&topic), Duration::from_secs(10))
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        let (_, end) = (consumer)
            .fetch_watermarks(&topic, partition.id(), Duration::from_secs(10))
            .unwrap();
        offsets
            .add_partition_offset(&topic, partition.id(), Offset::Offset(end))
            .unwrap();
    }
    consumer.commit(&offsets, CommitMode::Sync).unwrap();
    let committed = env.committed(&group, "extraction.submitted");
    assert_eq!(committed.values().sum::<i64>(), 1, "past the one record");
}

/// A bbox worker SIGKILLed while it holds claims (stuck right after
/// claiming): a second bbox worker heals every job; each held claim is
/// claimed once more, with its recovery measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_bbox_worker_mid_grounding_is_healed() {
    let env = TestEnv::with_settings("kill_bbox", fast_recovery).await;
    let services = env.services().await;
    let mut worker = env.spawn("worker", &[], "kill-bbox-worker");
    let mut doomed = a_bbox_worker_stuck_after_each_claim(&env);
    let ids = submit_jobs(&services, 10).await;
    let held = it_holds_bbox_claims(&env.pool).await;
    sigkill_and_reap(&mut doomed).await;
    let mut healer = env.spawn("bbox-worker", &[], "kill-bbox-healer");
    every_bbox_refinement_succeeds_once(&env.pool, &ids).await;
    each_held_claim_was_claimed_once_more_and_recovered(&env.pool, &held).await;
    eprintln!(
        "bbox kill: {} claims held by the killed bbox-worker, all re-claimed and succeeded",
        held.len()
    );
    stop([&mut worker, &mut healer]).await;
}

/// Starts a bbox worker that sleeps 60 s after each claim.
fn a_bbox_worker_stuck_after_each_claim(env: &TestEnv) -> Child {
    let stuck = [(
        "DOCSTREAM_FAILPOINTS",
        "bbox.after_claim=sleep(60000)".to_owned(),
    )];
    env.spawn("bbox-worker", &stuck, "kill-bbox-doomed")
}

/// Waits (up to 60 s) for a bbox claim; returns the jobs being grounded then.
async fn it_holds_bbox_claims(pool: &sqlx::PgPool) -> Vec<Uuid> {
    let grounding = "SELECT count(*) FROM extractions WHERE bbox_status = 'running'";
    wait_count(pool, "bbox claims", grounding, 1, Duration::from_secs(60)).await;
    sqlx::query_scalar("SELECT id FROM extractions WHERE bbox_status = 'running'")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// SIGKILLs a child and waits for it.
async fn sigkill_and_reap(child: &mut Child) {
    signal(child, "KILL").await;
    child.wait().await.unwrap();
}

/// Waits (up to 90 s) for every job to reach bbox succeeded; each won it once.
async fn every_bbox_refinement_succeeds_once(pool: &sqlx::PgPool, ids: &[Uuid]) {
    wait_count(
        pool,
        "every bbox refinement",
        ALL_BBOX_SUCCEEDED,
        ids.len() as i64,
        Duration::from_secs(90),
    )
    .await;
    assert_exactly_once(
        &wins(pool, "mark_bbox_refinement_succeeded").await,
        ids,
        "bbox succeeded",
    );
}

/// Each job the killed bbox worker held was claimed once more, and its
/// recovery was measured.
async fn each_held_claim_was_claimed_once_more_and_recovered(pool: &sqlx::PgPool, held: &[Uuid]) {
    for id in held {
        let bbox = store::get(pool, *id)
            .await
            .unwrap()
            .unwrap()
            .bbox_refinement()
            .unwrap();
        assert_eq!(
            bbox.attempts, 2,
            "{id}: claimed by the killed worker, then once more"
        );
        assert!(bbox.last_recovery_s.is_some(), "{id}: recovery measured");
    }
}

/// A job whose every extraction fails is retried with growing backoff, then
/// fails after its fourth attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_keeps_failing_backs_off_then_fails() {
    let env = TestEnv::with_settings("retries", |s| {
        fast_recovery(s);
        s.max_attempts = 4;
        s.retry_base_delay_s = common::secs(0.4);
        s.retry_max_delay_s = common::secs(5.0);
    })
    .await;
    let services = env.services().await;
    let failing = [("DOCSTREAM_FAILPOINTS", "worker.extract=error".to_owned())];
    let mut worker = env.spawn("worker", &failing, "retries-worker");
    let ids = submit_jobs(&services, 3).await;
    the_jobs_give_up(&env.pool).await;
    for id in &ids {
        it_backed_off_then_gave_up(&env.pool, *id).await;
    }
    stop([&mut worker]).await;
}

/// Waits (up to 60 s) until all three jobs have failed.
async fn the_jobs_give_up(pool: &sqlx::PgPool) {
    let failed = "SELECT count(*) FROM extractions WHERE status = 'failed'";
    wait_count(
        pool,
        "the jobs to give up",
        failed,
        3,
        Duration::from_secs(60),
    )
    .await;
}

/// The job ran four times with a requeue between each, the waits between a
/// requeue and the next claim kept to the backoff's floors, and it failed
/// after 4 attempts.
async fn it_backed_off_then_gave_up(pool: &sqlx::PgPool, id: Uuid) {
    let log: Vec<(String, f64)> = sqlx::query_as(
        "SELECT transition::text, extract(epoch FROM at)::float8 FROM extraction_transitions
          WHERE extraction_id = $1 ORDER BY at, transition",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    let names: Vec<&str> = log.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        names,
        [
            "submit",
            "mark_running",
            "requeue_for_retry",
            "mark_running",
            "requeue_for_retry",
            "mark_running",
            "requeue_for_retry",
            "mark_running",
            "mark_failed"
        ]
    );
    let waits = the_waits_kept_to_the_doubling_floors(&log);
    let row = store::get(pool, id).await.unwrap().unwrap();
    assert_eq!(row.attempts, 4);
    assert!(row.error.unwrap().contains("gave up after 4 attempts"));
    eprintln!("retries: {id} waited {waits:.3?} s between attempts, failed after 4");
}

/// The wait between a requeue and the next claim is at least the backoff's
/// floor (half of base · 2^(n-1)), and the floors double; the third wait is
/// longer than the first. Returns the waits.
fn the_waits_kept_to_the_doubling_floors(log: &[(String, f64)]) -> Vec<f64> {
    let waits: Vec<f64> = log
        .windows(2)
        .filter(|w| w[0].0 == "requeue_for_retry")
        .map(|w| w[1].1 - w[0].1)
        .collect();
    for (n, wait) in waits.iter().enumerate() {
        let floor = 0.4 * 2f64.powi(n as i32) / 2.0;
        assert!(
            *wait >= floor - 0.01,
            "retry {} came after {wait:.3}s, below the {floor}s floor",
            n + 1
        );
    }
    assert!(waits[2] > waits[0], "delays grow: {waits:?}");
    waits
}

/// An operator cancels one running job and reclaims another: the cancelled
/// one ends cancelled and never succeeds, the reclaimed one's live holder is
/// fenced out and a second claim succeeds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reclaim_of_a_running_job() {
    let env = TestEnv::with_settings("cancel_reclaim", fast_recovery).await;
    let mut run = a_slow_worker_and_serve(&env).await;
    // Cancel: the holder learns at its next heartbeat and the job ends cancelled.
    let (to_cancel, to_reclaim) = run.two_running_jobs().await;
    run.cancel(to_cancel).await;
    // Reclaim: the live holder is fenced out; a fresh claim finishes the job.
    reclaim(&env, to_reclaim).await;
    both_settle(&env.pool).await;
    the_cancelled_job_never_succeeded(&env.pool, to_cancel).await;
    the_reclaimed_job_succeeded_once_on_a_second_claim(&env.pool, to_reclaim).await;
    run.its_first_holder_was_fenced_out().await;
    stop([&mut run.worker, &mut run.serve]).await;
}

/// A worker (12 s per extraction, on its own metrics address) and `serve`.
/// The first holder's stall must outlast the reclaim's new claim: at 4 s, a
/// loaded machine let the first holder finish before anyone claimed the job
/// again, and its completion (fenced by its token only) rightly won.
/// Fields are in the order the test's locals used to be dropped.
struct CancelRun<'a> {
    env: &'a TestEnv,
    base: String,
    serve: Child,
    worker: Child,
    metrics: String,
    services: docstream::roles::Process,
}

/// Starts the slow worker, then `serve`, and waits for the API to be healthy.
async fn a_slow_worker_and_serve(env: &TestEnv) -> CancelRun<'_> {
    let services = env.services().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let port = free_port();
    let slow = [
        (
            "DOCSTREAM_FAILPOINTS",
            "worker.extract=sleep(12000)".to_owned(),
        ),
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
    ];
    let worker = env.spawn("worker", &slow, "cancel-worker");
    let serve = env.spawn(
        "serve",
        &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
        "cancel-serve",
    );
    let base = format!("http://127.0.0.1:{port}");
    common::wait_healthy(&base).await;
    CancelRun {
        env,
        base,
        serve,
        worker,
        metrics,
        services,
    }
}

impl CancelRun<'_> {
    /// Submits two jobs and waits (up to 60 s) until both are running;
    /// returns (the one to cancel, the one to reclaim).
    async fn two_running_jobs(&self) -> (Uuid, Uuid) {
        let ids = submit_jobs(&self.services, 2).await;
        let running = "SELECT count(*) FROM extractions WHERE status = 'running'";
        wait_count(
            &self.env.pool,
            "both jobs running",
            running,
            2,
            Duration::from_secs(60),
        )
        .await;
        (ids[0], ids[1])
    }

    /// Cancels `id` over HTTP; the answer is 202.
    async fn cancel(&self, id: Uuid) {
        let answer = self
            .env
            .client()
            .post(format!("{}/v1/extractions/{id}/cancel", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), reqwest::StatusCode::ACCEPTED);
    }

    /// The worker's metrics count at least one stale completion.
    async fn its_first_holder_was_fenced_out(&self) {
        let stale = scrape(&self.metrics, "docstream_stale_completions_total").await;
        assert!(
            stale >= 1.0,
            "the reclaimed job's first holder was fenced out"
        );
    }
}

/// `docstream reclaim <id>`, which must exit 0.
async fn reclaim(env: &TestEnv, id: Uuid) {
    let reclaimed = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
        .args(["reclaim", &id.to_string()])
        .envs(env.child_env())
        .output()
        .await
        .unwrap();
    assert!(
        reclaimed.status.success(),
        "{}",
        String::from_utf8_lossy(&reclaimed.stderr)
    );
}

/// Waits (up to 60 s) until both jobs are cancelled or succeeded.
async fn both_settle(pool: &sqlx::PgPool) {
    let settled = "SELECT count(*) FROM extractions WHERE status IN ('cancelled', 'succeeded')";
    wait_count(
        pool,
        "cancel and reclaim to settle",
        settled,
        2,
        Duration::from_secs(60),
    )
    .await;
}

/// The cancelled job is cancelled and never won `mark_succeeded`.
async fn the_cancelled_job_never_succeeded(pool: &sqlx::PgPool, id: Uuid) {
    let cancelled = store::get(pool, id).await.unwrap().unwrap();
    assert_eq!(cancelled.status.as_str(), "cancelled");
    assert!(
        !wins(pool, "mark_succeeded").await.contains_key(&id),
        "a cancelled job never succeeds"
    );
}

/// The reclaimed job succeeded on its second attempt, and won
/// `mark_succeeded` once.
async fn the_reclaimed_job_succeeded_once_on_a_second_claim(pool: &sqlx::PgPool, id: Uuid) {
    let reclaimed_row = store::get(pool, id).await.unwrap().unwrap();
    assert_eq!(
        (reclaimed_row.status.as_str(), reclaimed_row.attempts),
        ("succeeded", 2)
    );
    assert_eq!(wins(pool, "mark_succeeded").await.get(&id), Some(&1));
}

/// A new job's "published" stamp is written late and in bulk: not at the
/// acknowledgement, then, for every job still queued, by one statement; a job
/// claimed in between is never stamped (its claim says more than the stamp).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_jobs_are_stamped_late_and_only_while_still_queued() {
    // The default 10 s threshold puts the stamps 5 s after the ack; the flush
    // below writes them at once, as a graceful shutdown does.
    let env = TestEnv::new("late_stamps").await;
    let services = env.services().await;
    let ids = submit_jobs(&services, 6).await;
    let stamped = "SELECT count(*) FROM extractions WHERE published_at IS NOT NULL";
    assert_eq!(
        count(&env.pool, stamped).await,
        0,
        "no stamp at the acknowledgement"
    );

    let claimed = store::transitions::claim(&env.pool, Stage::Extraction, ids[0], 30.0)
        .await
        .unwrap()
        .expect("a queued job is claimable");
    services.stamps.flush().await;

    let rows: Vec<(Uuid, bool)> =
        sqlx::query_as("SELECT id, published_at IS NOT NULL FROM extractions")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let stamped: HashSet<Uuid> = rows.iter().filter(|(_, s)| *s).map(|(id, _)| *id).collect();
    let queued: HashSet<Uuid> = ids[1..].iter().copied().collect();
    assert_eq!(stamped, queued, "every job still queued, and only those");
    assert!(!stamped.contains(&claimed.extraction.id));
}
