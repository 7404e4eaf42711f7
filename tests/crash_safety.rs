//! Crash safety with real processes on the real broker and database: workers are
//! SIGKILLed, SIGSTOPped past their lease and thawed, orphans of every class are
//! revived by the reapers, retries back off and give up, and operators cancel and
//! reclaim. Every check is on sets of ids and counts of transitions.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{
    assert_exactly_once, count, fast_recovery, free_port, insert_job, percentile, sample_body,
    scrape, signal, stop, submit_jobs, wait_count, wait_for, wins, TestEnv, ALL_BBOX_SUCCEEDED,
};
use docstream::events::{decode, ExtractionSubmitted, PostProcessingRequested, PublishReason};
use docstream::pipeline::ExtractionReaper;
use docstream::store;
use tokio::process::Child;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_two_of_three_workers_under_load_loses_nothing() {
    const JOBS: usize = 2_500;
    // 16 records in flight per worker and 100 ms per extraction: three workers
    // take several seconds over the jobs, so thousands are in flight at the kill.
    let env = TestEnv::with_settings("kill_workers", |s| {
        fast_recovery(s);
        s.consumer_max_in_flight = 16;
    })
    .await;
    let services = env.services().await;
    let ids = submit_jobs(&services, JOBS).await;
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let slow = |i: usize| {
        [
            (
                "DOCSTREAM_FAILPOINTS",
                "worker.extract=sleep(100)".to_owned(),
            ),
            ("DOCSTREAM_METRICS_ADDR", metrics[i].clone()),
        ]
    };
    let mut workers: Vec<Child> = (0..3)
        .map(|i| env.spawn("worker", &slow(i), &format!("kill-worker-{i}")))
        .collect();
    let mut bbox = env.spawn("bbox-worker", &[], "kill-bbox-worker");
    let pool = &env.pool;
    let succeeded = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";
    // The two we kill must hold claims: wait until every worker has records in flight.
    let every_worker = "every worker to have records in flight";
    wait_for(every_worker, Duration::from_secs(60), || async {
        let mut holding = 0;
        for addr in &metrics {
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

    let in_flight = JOBS as i64 - count(pool, succeeded).await;
    for worker in &mut workers[..2] {
        signal(worker, "KILL").await;
        worker.wait().await.unwrap();
    }
    let killed_at = Instant::now();
    // The scenario, not a stand-in for a condition: the orchestrator restarts the
    // killed workers a few seconds later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    workers[0] = env.spawn("worker", &slow(0), "kill-worker-0-restarted");
    workers[1] = env.spawn("worker", &slow(1), "kill-worker-1-restarted");

    wait_count(
        pool,
        "every job to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        JOBS as i64,
        Duration::from_secs(300),
    )
    .await;
    let healed_in = killed_at.elapsed();
    assert_exactly_once(&wins(pool, "mark_succeeded").await, &ids, "mark_succeeded");
    assert_exactly_once(
        &wins(pool, "mark_bbox_refinement_succeeded").await,
        &ids,
        "bbox succeeded",
    );

    let mut recoveries: Vec<f64> = sqlx::query_scalar(
        "SELECT last_recovery_s FROM extractions WHERE last_recovery_s IS NOT NULL ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    recoveries.sort_by(f64::total_cmp);
    let s = &env.settings;
    let bound =
        s.extraction_run_lease_s.as_secs_f64() + s.reaper_sweep_interval_s.as_secs_f64() + 3.0;
    let max = recoveries.last().copied().unwrap_or(0.0);
    eprintln!(
        "kill test: jobs={JOBS} in_flight_at_kill={in_flight} killed=2 lost=0 duplicate_succeeded=0 \
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

    stop(workers.iter_mut().chain(std::iter::once(&mut bbox))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_past_its_lease_is_fenced_out_when_thawed() {
    let env = TestEnv::with_settings("sigstop", fast_recovery).await;
    let services = env.services().await;
    let pool = &env.pool;
    let metrics_a = format!("127.0.0.1:{}", free_port());
    let frozen_env = [
        (
            "DOCSTREAM_FAILPOINTS",
            "worker.extract=sleep(1500)".to_owned(),
        ),
        ("DOCSTREAM_METRICS_ADDR", metrics_a.clone()),
    ];
    let mut a = env.spawn("worker", &frozen_env, "sigstop-worker-a");
    let ids = submit_jobs(&services, 20).await;
    let running = "SELECT count(*) FROM extractions WHERE status = 'running'";
    wait_count(
        pool,
        "worker A to hold claims",
        running,
        1,
        Duration::from_secs(60),
    )
    .await;
    signal(&a, "STOP").await;
    let held: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM extractions WHERE status = 'running'")
        .fetch_all(pool)
        .await
        .unwrap();

    let mut b = env.spawn("worker", &[], "sigstop-worker-b");
    let succeeded = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";
    wait_count(
        pool,
        "worker B to finish every job",
        succeeded,
        ids.len() as i64,
        Duration::from_secs(120),
    )
    .await;
    signal(&a, "CONT").await;
    let stale = "docstream_stale_completions_total";
    wait_for(
        "A's stale work to be rejected",
        Duration::from_secs(60),
        || {
            let metrics_a = metrics_a.clone();
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
    let rejected = scrape(&metrics_a, stale).await;

    assert_exactly_once(&wins(pool, "mark_succeeded").await, &ids, "mark_succeeded");
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
    for id in &held {
        let row = store::get(pool, *id).await.unwrap().unwrap();
        assert_eq!(row.attempts, 2, "{id} was re-claimed exactly once");
    }
    eprintln!(
        "sigstop test: jobs={} frozen_claims={} stale_completions_rejected={rejected} duplicate_succeeded=0 \
         duplicate_follow_ups=0",
        ids.len(),
        held.len()
    );
    stop([&mut a, &mut b]).await;
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
        let mut query = sqlx::query(&sql).bind(id);
        if class >= 4 {
            query = query.bind(&result);
        }
        assert_eq!(query.execute(pool).await.unwrap().rows_affected(), 1);
        orphans.push((class, id));
    }
    orphans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_orphan_class_is_listed_and_revived_by_the_reapers() {
    let env = TestEnv::with_settings("orphan_classes", fast_recovery).await;
    let pool = &env.pool;
    let orphans = craft_orphans(&env).await;

    // The operator's view first: `docstream orphans --json` names all five.
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

    let started = Instant::now();
    let mut worker = env.spawn("worker", &[], "orphans-worker");
    let mut bbox = env.spawn("bbox-worker", &[], "orphans-bbox-worker");
    wait_count(
        pool,
        "all five orphans to finish",
        ALL_BBOX_SUCCEEDED,
        5,
        Duration::from_secs(60),
    )
    .await;
    let revived_in = started.elapsed();

    // Each was republished by a reaper exactly once, on the topic of its class.
    // (A revived job's follow-up events carry the reason of the chain that
    // caused them, so classes 1-3 also send one reaper-reason bbox request.)
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
    for (class, id) in &orphans {
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
    let recovered = count(
        pool,
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
    stop([&mut worker, &mut bbox]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reapers_republish_each_orphan_once_per_threshold() {
    const ORPHANS: usize = 60;
    let env = TestEnv::with_settings("two_reapers", fast_recovery).await;
    let pool = &env.pool;
    let mut ids = Vec::new();
    for _ in 0..ORPHANS {
        ids.push(insert_job(pool).await);
    }
    sqlx::query("UPDATE extractions SET submitted_at = now() - interval '1 hour'")
        .execute(pool)
        .await
        .unwrap();
    let replicas = [env.services().await, env.services().await];
    let sweep_round = || async {
        let sweeps = replicas.iter().flat_map(|services| {
            (0..10).map(move |_| async move {
                ExtractionReaper::new(services.clone())
                    .sweep()
                    .await
                    .unwrap()
            })
        });
        futures::future::join_all(sweeps).await
    };

    let outcomes = sweep_round().await;
    let count_per_id = |expected: usize| {
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
    };
    count_per_id(1);
    let swept = outcomes
        .iter()
        .filter(|o| matches!(o, docstream::pipeline::Sweep::Swept { .. }))
        .count();
    eprintln!("two reapers: 20 concurrent sweeps, {swept} swept, {} found the lock taken; {ORPHANS} orphans republished once each", 20 - swept);

    // An acknowledged republish is recorded: the job is waiting in Kafka, not lost.
    sweep_round().await;
    count_per_id(1);
    // Had the record been lost, the orphan is still not republished before its
    // threshold passes...
    sqlx::query("UPDATE extractions SET published_at = NULL")
        .execute(pool)
        .await
        .unwrap();
    sweep_round().await;
    count_per_id(1);
    // ...and once it has passed (moved back in SQL), exactly once more.
    sqlx::query("UPDATE extractions SET republished_at = republished_at - interval '1 hour'")
        .execute(pool)
        .await
        .unwrap();
    sweep_round().await;
    count_per_id(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_bbox_worker_mid_grounding_is_healed() {
    let env = TestEnv::with_settings("kill_bbox", fast_recovery).await;
    let services = env.services().await;
    let pool = &env.pool;
    let mut worker = env.spawn("worker", &[], "kill-bbox-worker");
    let stuck = [(
        "DOCSTREAM_FAILPOINTS",
        "bbox.after_claim=sleep(60000)".to_owned(),
    )];
    let mut doomed = env.spawn("bbox-worker", &stuck, "kill-bbox-doomed");
    let ids = submit_jobs(&services, 10).await;
    let grounding = "SELECT count(*) FROM extractions WHERE bbox_status = 'running'";
    wait_count(pool, "bbox claims", grounding, 1, Duration::from_secs(60)).await;
    let held: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM extractions WHERE bbox_status = 'running'")
            .fetch_all(pool)
            .await
            .unwrap();
    signal(&doomed, "KILL").await;
    doomed.wait().await.unwrap();

    let mut healer = env.spawn("bbox-worker", &[], "kill-bbox-healer");
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
        &ids,
        "bbox succeeded",
    );
    for id in &held {
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
    eprintln!(
        "bbox kill: {} claims held by the killed bbox-worker, all re-claimed and succeeded",
        held.len()
    );
    stop([&mut worker, &mut healer]).await;
}

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
    let failed = "SELECT count(*) FROM extractions WHERE status = 'failed'";
    wait_count(
        &env.pool,
        "the jobs to give up",
        failed,
        3,
        Duration::from_secs(60),
    )
    .await;

    for id in &ids {
        let log: Vec<(String, f64)> = sqlx::query_as(
            "SELECT transition::text, extract(epoch FROM at)::float8 FROM extraction_transitions
              WHERE extraction_id = $1 ORDER BY at, transition",
        )
        .bind(id)
        .fetch_all(&env.pool)
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
        // The wait between a requeue and the next claim is at least the backoff's
        // floor (half of base · 2^(n-1)), and the floors double.
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
        let row = store::get(&env.pool, *id).await.unwrap().unwrap();
        assert_eq!(row.attempts, 4);
        assert!(row.error.unwrap().contains("gave up after 4 attempts"));
        eprintln!("retries: {id} waited {waits:.3?} s between attempts, failed after 4");
    }
    stop([&mut worker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reclaim_of_a_running_job() {
    let env = TestEnv::with_settings("cancel_reclaim", fast_recovery).await;
    let services = env.services().await;
    let pool = &env.pool;
    let metrics = format!("127.0.0.1:{}", free_port());
    let port = free_port();
    let slow = [
        (
            "DOCSTREAM_FAILPOINTS",
            "worker.extract=sleep(4000)".to_owned(),
        ),
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
    ];
    let mut worker = env.spawn("worker", &slow, "cancel-worker");
    let mut serve = env.spawn(
        "serve",
        &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
        "cancel-serve",
    );
    let base = format!("http://127.0.0.1:{port}");
    common::wait_healthy(&base).await;

    // Cancel: the holder learns at its next heartbeat and the job ends cancelled.
    let ids = submit_jobs(&services, 2).await;
    let (to_cancel, to_reclaim) = (ids[0], ids[1]);
    let running = "SELECT count(*) FROM extractions WHERE status = 'running'";
    wait_count(
        pool,
        "both jobs running",
        running,
        2,
        Duration::from_secs(60),
    )
    .await;
    let answer = env
        .client()
        .post(format!("{base}/v1/extractions/{to_cancel}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::ACCEPTED);

    // Reclaim: the live holder is fenced out; a fresh claim finishes the job.
    let reclaimed = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
        .args(["reclaim", &to_reclaim.to_string()])
        .envs(env.child_env())
        .output()
        .await
        .unwrap();
    assert!(
        reclaimed.status.success(),
        "{}",
        String::from_utf8_lossy(&reclaimed.stderr)
    );

    let settled = "SELECT count(*) FROM extractions WHERE status IN ('cancelled', 'succeeded')";
    wait_count(
        pool,
        "cancel and reclaim to settle",
        settled,
        2,
        Duration::from_secs(60),
    )
    .await;
    let cancelled = store::get(pool, to_cancel).await.unwrap().unwrap();
    assert_eq!(cancelled.status.as_str(), "cancelled");
    assert!(
        !wins(pool, "mark_succeeded").await.contains_key(&to_cancel),
        "a cancelled job never succeeds"
    );
    let reclaimed_row = store::get(pool, to_reclaim).await.unwrap().unwrap();
    assert_eq!(
        (reclaimed_row.status.as_str(), reclaimed_row.attempts),
        ("succeeded", 2)
    );
    assert_eq!(
        wins(pool, "mark_succeeded").await.get(&to_reclaim),
        Some(&1)
    );
    let stale = scrape(&metrics, "docstream_stale_completions_total").await;
    assert!(
        stale >= 1.0,
        "the reclaimed job's first holder was fenced out"
    );
    stop([&mut worker, &mut serve]).await;
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

    let claimed = store::transitions::mark_running(&env.pool, ids[0], 30.0)
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
