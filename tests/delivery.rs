//! The delivery contract with real processes on the real broker: offsets are
//! committed only after delivery — through a graceful shutdown under load, a
//! rebalance under load (both group protocols), poison records, a backlog far
//! larger than memory should hold, and a `serve` stopped mid-burst.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    fast_recovery, free_port, peak_rss_kib, sample_body, scrape, signal, stop, submit_jobs,
    topic_size, wait_count, wait_for, wins, TestEnv,
};
use docstream::events::{decode, DeadLetter, ExtractionSubmitted, PublishReason};
use futures::stream::{self, StreamExt};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const SUCCEEDED: &str = "SELECT count(*) FROM extractions WHERE status = 'succeeded'";

/// One observation: the group's committed offsets, then the jobs delivered by then.
struct Sample {
    committed: HashMap<i32, i64>,
    delivered: HashSet<Uuid>,
}

/// Samples every ~500 ms until stopped. Committed offsets are read first and
/// deliveries after: deliveries only grow, so a record still undelivered at the
/// later read was undelivered when the offsets were read. The check can miss a
/// violation, never invent one.
fn sample_offsets(
    env: &TestEnv,
    pool: PgPool,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let brokers = env.settings.kafka_brokers.clone();
    let group = env.settings.group(&env.settings.worker_group);
    let topic = env.topic("extraction.submitted");
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.is_cancelled() {
            let (b, g, t) = (brokers.clone(), group.clone(), topic.clone());
            let committed =
                tokio::task::spawn_blocking(move || common::committed_offsets(&b, &g, &t))
                    .await
                    .unwrap();
            // Delivered: the record's transition is durable and its follow-up
            // event acknowledged (the stamp is written after the ack).
            let delivered: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM extractions WHERE bbox_published_at IS NOT NULL",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            samples.push(Sample {
                committed,
                delivered: delivered.into_iter().collect(),
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        samples
    })
}

/// Offset-ahead violations: committed offsets past a record not yet delivered.
/// Only first records of a job count (a duplicate of a delivered job is
/// delivered by skipping it).
fn offset_ahead_violations(env: &TestEnv, samples: &[Sample]) -> usize {
    let mut by_partition: BTreeMap<i32, Vec<(i64, Uuid)>> = BTreeMap::new();
    for (partition, offset, _, payload) in common::read_topic_positioned(
        &env.settings.kafka_brokers,
        &env.topic("extraction.submitted"),
    ) {
        let event: ExtractionSubmitted = decode(&payload).unwrap();
        by_partition
            .entry(partition)
            .or_default()
            .push((offset, event.extraction_id.parse().unwrap()));
    }
    let mut violations = 0;
    for sample in samples {
        for (partition, committed) in &sample.committed {
            let records = by_partition
                .get(partition)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let ahead: Vec<_> = records
                .iter()
                .filter(|(offset, id)| offset < committed && !sample.delivered.contains(id))
                .collect();
            if let Some((offset, id)) = ahead.first() {
                eprintln!("offset ahead: partition {partition} committed {committed} > undelivered offset {offset} ({id}), {} records", ahead.len());
            }
            violations += ahead.len();
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_commits_only_delivered_and_runs_nothing_twice() {
    const JOBS: usize = 2_000;
    // 16 records in flight (not the default 256) keeps the run long enough for
    // the offset sampler to see the commits move several times.
    let env = TestEnv::with_settings("sigterm_worker", |s| {
        fast_recovery(s);
        s.consumer_max_in_flight = 16;
    })
    .await;
    let services = env.services().await;
    let pool = &env.pool;
    let slow = [(
        "DOCSTREAM_FAILPOINTS",
        "worker.extract=sleep(50)".to_owned(),
    )];
    let mut first = env.spawn("worker", &slow, "sigterm-worker-first");
    let ids = submit_jobs(&services, JOBS).await;
    let stop_sampling = CancellationToken::new();
    let sampler = sample_offsets(&env, pool.clone(), stop_sampling.clone());
    wait_count(
        pool,
        "a quarter of the jobs",
        SUCCEEDED,
        JOBS as i64 / 4,
        Duration::from_secs(120),
    )
    .await;

    let terminated = Instant::now();
    signal(&first, "TERM").await;
    let status = first.wait().await.unwrap();
    let drain = terminated.elapsed();
    let mut replacement = env.spawn("worker", &[], "sigterm-worker-replacement");
    wait_count(
        pool,
        "every job",
        SUCCEEDED,
        JOBS as i64,
        Duration::from_secs(180),
    )
    .await;
    stop_sampling.cancel();
    let samples = sampler.await.unwrap();

    let runs = wins(pool, "mark_running").await;
    let lost = ids.iter().filter(|id| !runs.contains_key(id)).count();
    let twice = runs.values().filter(|&&n| n > 1).count();
    let violations = offset_ahead_violations(&env, &samples);
    eprintln!(
        "sigterm test: jobs={JOBS} exit={status} drain={:.2}s lost={lost} run_twice={twice} \
         offset_samples={} offset_ahead_violations={violations}",
        drain.as_secs_f64(),
        samples.len()
    );
    assert!(status.success(), "graceful shutdown exits 0");
    assert!(drain < env.settings.subscriber_drain_timeout_s.get() + Duration::from_secs(2));
    assert_eq!((lost, twice, violations), (0, 0, 0));
    assert!(samples.len() >= 5, "the sampler ran throughout");
    stop([&mut replacement]).await;
}

async fn rebalance_under_load(protocol: &str) {
    const JOBS: usize = 2_000;
    let env = TestEnv::with_settings(&format!("rebalance_{protocol}"), |s| {
        fast_recovery(s);
        s.kafka_group_protocol = protocol.parse().unwrap();
    })
    .await;
    let services = env.services().await;
    let pool = &env.pool;
    let ids = submit_jobs(&services, JOBS).await;
    let slow = [(
        "DOCSTREAM_FAILPOINTS",
        "worker.extract=sleep(50)".to_owned(),
    )];
    let stop_sampling = CancellationToken::new();
    let sampler = sample_offsets(&env, pool.clone(), stop_sampling.clone());
    // The scenario's timeline (sleeps are the script, not stand-ins for conditions).
    let mut a = env.spawn("worker", &slow, &format!("rebalance-{protocol}-a"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut b = env.spawn("worker", &slow, &format!("rebalance-{protocol}-b"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut c = env.spawn("worker", &slow, &format!("rebalance-{protocol}-c"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let done_at_kill = common::count(pool, SUCCEEDED).await;
    signal(&a, "KILL").await;
    a.wait().await.unwrap();
    wait_count(
        pool,
        "every job",
        SUCCEEDED,
        JOBS as i64,
        Duration::from_secs(240),
    )
    .await;
    stop_sampling.cancel();
    let samples = sampler.await.unwrap();

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
    let duplicate_runs: i64 = runs.values().map(|n| n - 1).sum();
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
    let violations = offset_ahead_violations(&env, &samples);
    eprintln!(
        "rebalance test ({protocol}): jobs={JOBS} done_when_a_killed={done_at_kill} lost=0 \
         duplicate_runs={duplicate_runs} (jobs A held when killed, re-claimed after its lease) \
         offsets_backwards={backwards} offset_ahead_violations={violations} samples={}",
        samples.len()
    );
    assert_eq!((backwards, violations), (0, 0));
    stop([&mut b, &mut c]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_under_load_classic_protocol() {
    rebalance_under_load("classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_under_load_consumer_protocol() {
    rebalance_under_load("consumer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_go_to_the_dlq_and_never_stall_a_partition() {
    const GOOD: usize = 1_000;
    let env = TestEnv::with_settings("poison", fast_recovery).await;
    let services = env.services().await;
    let pool = &env.pool;
    let topic = env.topic("extraction.submitted");
    let mut worker = env.spawn("worker", &[], "poison-worker");

    // Good submissions with three kinds of poison interleaved, on random keys
    // so they land on every partition.
    let mut injected: HashMap<&str, usize> = HashMap::new();
    let mut ids = Vec::new();
    for chunk in 0..GOOD / 50 {
        ids.extend(submit_jobs(&services, 50).await);
        let key = Uuid::new_v4().to_string();
        let garbage = format!("not avro {chunk}").into_bytes();
        services
            .publisher
            .publish_bytes(&topic, Some(key.as_bytes()), garbage)
            .await
            .unwrap();
        *injected.entry("undecodable").or_default() += 1;
        let mut stranger = vec![0xC3, 0x01, 9, 9, 9, 9, 9, 9, 9, 9];
        stranger.extend_from_slice(b"\x02x");
        services
            .publisher
            .publish_bytes(&topic, Some(key.as_bytes()), stranger)
            .await
            .unwrap();
        *injected.entry("unknown_schema").or_default() += 1;
        let missing = ExtractionSubmitted::new(Uuid::new_v4(), PublishReason::Submit);
        services
            .publisher
            .publish(&topic, key.as_bytes(), &missing)
            .await
            .unwrap();
        *injected.entry("missing_row").or_default() += 1;
    }
    let total_injected: usize = injected.values().sum();
    wait_count(
        pool,
        "every good job",
        SUCCEEDED,
        GOOD as i64,
        Duration::from_secs(180),
    )
    .await;
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
    assert_eq!(wins(pool, "mark_succeeded").await.len(), ids.len());
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker never crashed"
    );
    signal(&worker, "TERM").await;
    assert!(worker.wait().await.unwrap().success());
    eprintln!(
        "poison test: good={GOOD} injected={total_injected} {injected:?} dlq={} processed={}",
        parked.values().sum::<usize>(),
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_fifty_thousand_events_keeps_memory_bounded() {
    const BACKLOG: i64 = 50_000;
    const RSS_BOUND_MIB: u64 = 128;
    let env = TestEnv::with_settings("backlog", fast_recovery).await;
    let services = env.services().await;
    let pool = &env.pool;
    // Small jobs, inserted in bulk and marked published (they are, just below).
    let request = serde_json::json!({
        "document": {"text": "Invoice INV-1 Total 12.50"},
        "fields": [{"name": "total", "type": "money", "anchor": "Total"}]
    });
    let ids: Vec<Uuid> = sqlx::query_scalar(
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
    .unwrap();
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

    let metrics = format!("127.0.0.1:{}", free_port());
    let mut worker = env.spawn(
        "worker",
        &[("DOCSTREAM_METRICS_ADDR", metrics.clone())],
        "backlog-worker",
    );
    let pid = worker.id().unwrap();
    wait_count(
        pool,
        "the worker to chew into the backlog",
        SUCCEEDED,
        2_000,
        Duration::from_secs(120),
    )
    .await;
    let peak_kib = peak_rss_kib(pid).expect("worker alive");
    let pauses = scrape(&metrics, "docstream_consumer_pauses_total").await;
    let done = common::count(pool, SUCCEEDED).await;
    eprintln!(
        "backlog test: backlog={BACKLOG} processed_so_far={done} peak_rss={:.1} MiB (bound {RSS_BOUND_MIB} MiB) pauses={pauses}",
        peak_kib as f64 / 1024.0
    );
    assert!(pauses >= 1.0, "the consumer paused at its bound");
    assert!(peak_kib < RSS_BOUND_MIB * 1024, "peak RSS {peak_kib} KiB");
    stop([&mut worker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_serve_mid_burst_loses_no_accepted_request() {
    const BURST: usize = 500;
    let env = TestEnv::with_settings("sigterm_serve", fast_recovery).await;
    let pool = &env.pool;
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
    let mut serve = env.spawn("serve", &serve_env, "sigterm-serve");
    let mut worker = env.spawn("worker", &[], "sigterm-serve-worker");
    common::wait_healthy(&base).await;

    let client = env
        .client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let burst = {
        let (client, base, answers) = (client.clone(), base.clone(), answers.clone());
        tokio::spawn(async move {
            stream::iter(0..BURST)
                .for_each_concurrent(BURST, |i| {
                    let (client, base, answers) = (client.clone(), base.clone(), answers.clone());
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
        })
    };
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
    signal(&serve, "TERM").await;
    // Once the gate is closed, every new request is refused with 503 (or, after
    // the listener closed, not connected at all) — never accepted.
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
    let late: Vec<Option<reqwest::StatusCode>> = stream::iter(0..20)
        .then(|i| {
            let request = client
                .post(format!("{base}/v1/extractions"))
                .json(&sample_body(i))
                .send();
            async move { request.await.ok().map(|r| r.status()) }
        })
        .collect()
        .await;
    burst.await.unwrap();
    let status = serve.wait().await.unwrap();

    let answers = answers.lock().unwrap().clone();
    let accepted: Vec<Uuid> = answers
        .iter()
        .flatten()
        .filter(|(s, _)| *s == reqwest::StatusCode::ACCEPTED)
        .map(|(_, body)| body["id"].as_str().unwrap().parse().unwrap())
        .collect();
    let refused = answers
        .iter()
        .flatten()
        .filter(|(s, _)| *s == reqwest::StatusCode::SERVICE_UNAVAILABLE)
        .count();
    let other: Vec<_> = answers
        .iter()
        .flatten()
        .filter(|(s, _)| {
            *s != reqwest::StatusCode::ACCEPTED && *s != reqwest::StatusCode::SERVICE_UNAVAILABLE
        })
        .collect();
    assert!(other.is_empty(), "every answer is 202 or 503: {other:?}");
    let late_503 = late
        .iter()
        .filter(|s| **s == Some(reqwest::StatusCode::SERVICE_UNAVAILABLE))
        .count();
    assert!(
        late.iter()
            .all(|s| s.is_none() || *s == Some(reqwest::StatusCode::SERVICE_UNAVAILABLE)),
        "requests after shutdown began: {late:?}"
    );
    assert!(late_503 >= 1, "the gate answered while draining: {late:?}");
    assert!(status.success(), "serve drained gracefully: {status}");

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
    eprintln!(
        "serve sigterm test: burst={BURST} accepted={} refused_503={refused} not_connected={} \
         late_requests_503={late_503}/{} lost=0",
        accepted.len(),
        answers.iter().filter(|a| a.is_none()).count(),
        late.len()
    );
    stop([&mut worker]).await;
}
