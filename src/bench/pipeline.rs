//! docstream itself under load, as separate processes (`serve`, `worker`,
//! `bbox-worker`) on the benchmark's scratch database and topics.
//!
//! - **Burn-down**: N jobs are inserted before any worker runs; then the
//!   workers start, and once both consumer groups are stable with every
//!   process assigned, the jobs' events are released at once. The rate is N
//!   over the window from the first claim to the last bbox success, both read
//!   from the transition log, so neither group joins nor the rebalances they
//!   cause are counted as work (with several processes they would be most of
//!   the run).
//! - **Steady state**: an open-loop generator submits over HTTP at a fixed rate,
//!   whatever the answers' timing; each job's latency runs from its *intended*
//!   send time (no coordinated omission) to its transitions' log timestamps.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::stream::{self, StreamExt};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::cost::{JobCost, Snapshot};
use super::procs::{Proc, ProcCost};
use crate::demo::sample_requests;

use docstream::config::{ExtractorSettings, Settings};
use docstream::domain::ExtractionRequest;
use docstream::pipeline::Submitter;
use docstream::roles;
use docstream::store::{tenants, Extraction, NewExtraction};

/// The scratch database and topics, and the environment children run with.
#[derive(Clone)]
pub struct Rig {
    /// Settings pointing at the scratch database and topics.
    pub settings: Settings,
    /// The same, as environment variables for the children.
    pub env: Vec<(String, String)>,
    /// Pool on the scratch database.
    pub pool: PgPool,
    /// Where child logs go.
    pub logs: PathBuf,
}

/// Latency percentiles, ms.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Latency {
    pub(super) fn of(histogram: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            count: histogram.len(),
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            p999_ms: ms(histogram.value_at_quantile(0.999)),
            max_ms: ms(histogram.max()),
        }
    }
}

/// The burn-down's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct BurnDown {
    /// Jobs queued before the workers started.
    pub jobs: usize,
    /// Extraction worker processes.
    pub workers: usize,
    /// Bbox worker processes.
    pub bbox_workers: usize,
    /// Seconds submitting took (not part of the rate).
    pub submit_s: f64,
    /// First claim to last bbox success, from the transition log.
    pub seconds: f64,
    /// Worker start to the last bbox success, wall clock (includes joining the group).
    pub wall_s: f64,
    /// Jobs to bbox succeeded per second, over `seconds`.
    pub jobs_per_s: f64,
    /// Records the two consumer groups consumed per second (one submitted event
    /// and one bbox request per job), over `seconds`.
    pub consumer_records_per_s: f64,
    /// Each worker process's CPU and peak RSS.
    pub processes: Vec<ProcCost>,
    /// Where the server's time went, by statement (pg_stat_statements, when
    /// the server loads it), submits included.
    pub statements: Vec<StatementCost>,
    /// What one job cost the whole system, submit to bbox succeeded.
    pub cost: JobCost,
}

/// One statement's share of the server's time during a phase.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct StatementCost {
    /// Its text, whitespace collapsed and cut short.
    pub query: String,
    /// Executions.
    pub calls: i64,
    /// Rows it returned or changed.
    pub rows: i64,
    /// Total execution time, ms.
    pub total_ms: f64,
}

/// Clears the server's statement statistics, if it keeps them.
async fn reset_statements(pool: &PgPool) -> bool {
    let created = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await;
    created.is_ok()
        && sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(pool)
            .await
            .is_ok()
}

/// The statements that took the most server time in this database since the
/// last reset.
async fn statement_costs(pool: &PgPool) -> anyhow::Result<Vec<StatementCost>> {
    let costs = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS query, calls, rows,
                total_exec_time AS total_ms
           FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          ORDER BY total_exec_time DESC LIMIT 10",
    )
    .fetch_all(pool)
    .await?;
    Ok(costs)
}

/// The steady state's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Steady {
    /// Target submissions per second.
    pub rate: f64,
    /// Seconds of sending.
    pub duration_s: f64,
    /// Submissions sent.
    pub sent: usize,
    /// Answered 202.
    pub accepted: usize,
    /// Submissions actually sent per second.
    pub achieved_rate: f64,
    /// Jobs succeeded per second: accepted jobs over the time from the first
    /// intended send to the last `mark_succeeded`.
    pub succeeded_per_s: f64,
    /// Intended send time to the 202 answer.
    pub submit_answer: Latency,
    /// Intended send time to `mark_succeeded`.
    pub submit_to_succeeded: Latency,
    /// Intended send time to `mark_bbox_refinement_succeeded`.
    pub submit_to_bbox_succeeded: Latency,
    /// Where the time goes: each hop between consecutive transitions.
    pub hops: Vec<Hop>,
    /// CPU seconds per 1,000 jobs, all processes of the pipeline together.
    pub cpu_s_per_1000_jobs: f64,
    /// Each process's CPU over the window and peak RSS.
    pub processes: Vec<ProcCost>,
    /// Submissions not accepted, by why (`503 overloaded`, `no answer (timeout)`).
    pub refused: BTreeMap<String, usize>,
}

/// One hop of a job's path, between two logged transitions.
#[derive(Debug, Clone, Serialize)]
pub struct Hop {
    /// Transition the hop starts at.
    pub from: String,
    /// Transition it ends at.
    pub to: String,
    /// How long it took.
    pub latency: Latency,
}

/// The transitions of a successful job, in order.
const PATH: [&str; 6] = [
    "submit",
    "mark_running",
    "mark_succeeded",
    "start_bbox_refinement",
    "mark_bbox_refinement_running",
    "mark_bbox_refinement_succeeded",
];

/// Submits `jobs` jobs, then starts the workers and waits until all are done.
pub async fn burn_down(
    rig: &Rig,
    jobs: usize,
    workers: usize,
    bbox_workers: usize,
    progress: &ProgressBar,
) -> anyhow::Result<BurnDown> {
    progress.set_length(jobs as u64);
    progress.set_message("submitting (no worker running)");
    let process = roles::connect(rig.settings.clone()).await?;
    let keeps_statistics = reset_statements(&rig.pool).await;
    let before = Snapshot::take(&rig.pool).await?;
    let started = Instant::now();
    let rows = insert_backlog(&process.submitter, jobs, progress).await?;
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    let submit_s = started.elapsed().as_secs_f64();

    progress.set_position(0);
    progress.set_message("workers joining their groups");
    let started = Instant::now();
    let mut procs = spawn_stable_workers(rig, workers, bbox_workers).await?;
    progress.set_message("workers draining the backlog");
    publish_backlog(&process.submitter, &rows).await?;
    let deadline = Duration::from_secs(120.max(jobs as u64 / 100));
    wait_all_done(rig, jobs, &mut procs, deadline, progress).await?;
    process.stamps.flush().await;
    drop(process);
    let wall_s = started.elapsed().as_secs_f64();
    let processes = costs(&procs, &[])?;
    let statistics = (&rig.pool, keeps_statistics);
    let cost = before
        .cost(jobs, &processes, statistics, &rig.settings)
        .await?;
    for proc in procs {
        proc.stop().await?;
    }
    let statements = match keeps_statistics {
        true => statement_costs(&rig.pool).await?,
        false => Vec::new(),
    };
    ensure_exactly_once(&rig.pool, &ids).await?;
    let seconds = claim_to_last_bbox_s(&rig.pool, &ids).await?;
    Ok(BurnDown {
        jobs,
        workers,
        bbox_workers,
        submit_s,
        seconds,
        wall_s,
        jobs_per_s: jobs as f64 / seconds,
        consumer_records_per_s: 2.0 * jobs as f64 / seconds,
        processes,
        statements,
        cost,
    })
}

/// Inserts `jobs` jobs (the sample requests in turn) without publishing
/// their events, so that no worker sees them until they are released.
async fn insert_backlog(
    submitter: &Submitter,
    jobs: usize,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Extraction>> {
    let samples = sample_requests();
    stream::iter(0..jobs)
        .map(|i| {
            let new = NewExtraction {
                id: docstream::domain::new_job_id(),
                tenant_id: tenants::DEFAULT_TENANT_ID,
                max_open_jobs: None,
                idempotency_key: None,
                request: samples[i % samples.len()].request.clone(),
            };
            async move {
                let submitted = submitter.insert(new).await?;
                progress.inc(1);
                anyhow::Ok(submitted.extraction().clone())
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Starts the workers and waits until both consumer groups are stable with
/// every process assigned, so that no group join is counted as work.
async fn spawn_stable_workers(
    rig: &Rig,
    workers: usize,
    bbox_workers: usize,
) -> anyhow::Result<Vec<Proc>> {
    let mut procs = spawn_workers(rig, workers, bbox_workers)?;
    let groups = [
        (rig.settings.group(&rig.settings.worker_group), workers),
        (
            rig.settings.group(&rig.settings.bbox_worker_group),
            bbox_workers,
        ),
    ];
    wait_groups_stable(&rig.settings.kafka(), &groups, &mut procs).await?;
    Ok(procs)
}

/// Releases the backlog: publishes every job's created event at once.
async fn publish_backlog(submitter: &Submitter, rows: &[Extraction]) -> anyhow::Result<()> {
    stream::iter(rows)
        .map(|row| submitter.publish_created(row))
        .buffer_unordered(1024)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    Ok(())
}

/// The burn-down's window, from the transition log: the first claim to the
/// last bbox success of the jobs `ids`, seconds.
async fn claim_to_last_bbox_s(pool: &PgPool, ids: &[Uuid]) -> anyhow::Result<f64> {
    let seconds = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(at) FILTER (WHERE transition = 'mark_bbox_refinement_succeeded')
                              - min(at) FILTER (WHERE transition = 'mark_running'))::float8
           FROM extraction_transitions WHERE extraction_id = ANY($1)",
    )
    .bind(ids)
    .fetch_one(pool)
    .await?;
    Ok(seconds)
}

/// Runs `serve` and the workers, sends `rate` submissions per second for
/// `duration_s` (for `extractor`, when given), and waits until every accepted
/// job is done.
pub async fn steady(
    rig: &Rig,
    rate: f64,
    duration_s: f64,
    (workers, bbox_workers): (usize, usize),
    extractor: Option<&str>,
    progress: &ProgressBar,
) -> anyhow::Result<Steady> {
    let (client, base, mut procs) = start_pipeline(rig, workers, bbox_workers).await?;
    progress.set_message("warming up");
    let samples = requests_for(extractor);
    warm_up(rig, &client, &base, &samples, &mut procs).await?;

    let cpu_before: Vec<f64> = procs
        .iter()
        .map(Proc::cpu_s)
        .collect::<anyhow::Result<_>>()?;
    let total = (rate * duration_s).round() as usize;
    progress.set_length(total as u64);
    progress.set_position(0);
    progress.set_message(format!("open loop at {rate}/s"));
    let sent = open_loop(&client, &base, &samples, rate, total, progress).await?;

    progress.set_message("waiting for the last jobs");
    let ids: Vec<Uuid> = sent.accepted.iter().map(|(id, _)| *id).collect();
    let last = Duration::from_secs(120);
    let hidden = ProgressBar::hidden();
    wait_all_done(rig, ids.len(), &mut procs, last, &hidden).await?;
    let processes = costs(&procs, &cpu_before)?;
    for proc in procs {
        proc.stop().await?;
    }
    ensure_exactly_once(&rig.pool, &ids).await?;

    let refused = sent.refused.clone();
    let times = job_times(&rig.pool, &ids, &sent.accepted).await?;
    let cpu: f64 = processes.iter().map(|p| p.cpu_s).sum();
    let first_send = sent.start_wall.duration_since(UNIX_EPOCH)?.as_secs_f64();
    let accepted = sent.accepted.len();
    let since_first_send = (times.last_succeeded - first_send).max(f64::EPSILON);
    Ok(Steady {
        succeeded_per_s: accepted as f64 / since_first_send,
        rate,
        duration_s,
        sent: total,
        accepted,
        achieved_rate: total as f64 / sent.sent_s.max(f64::EPSILON),
        submit_answer: Latency::of(&sent.answer),
        submit_to_succeeded: Latency::of(&times.to_succeeded),
        submit_to_bbox_succeeded: Latency::of(&times.to_bbox),
        hops: hops(&times.hops),
        cpu_s_per_1000_jobs: cpu / (accepted as f64 / 1000.0),
        processes,
        refused,
    })
}

/// Starts `serve` and the workers, and a tenant `bench` without quotas: its
/// client, the base URL and the processes, once `serve` is healthy.
pub(super) async fn start_pipeline(
    rig: &Rig,
    workers: usize,
    bbox_workers: usize,
) -> anyhow::Result<(reqwest::Client, String, Vec<Proc>)> {
    let (base, serve) = spawn_serve(rig)?;
    let mut procs = vec![serve];
    procs.extend(spawn_workers(rig, workers, bbox_workers)?);
    // The load is the point: no quota of the tenant's holds it back.
    let key = crate::demo::unlimited_key(&rig.pool, "bench").await?;
    let client = crate::demo::api_client(&key.api_key)?;
    wait_healthy(&client, &base, &mut procs).await?;
    Ok((client, base, procs))
}

/// The sample requests, each for `extractor` (`None`: the built-in rules).
pub(super) fn requests_for(extractor: Option<&str>) -> Vec<ExtractionRequest> {
    sample_requests()
        .into_iter()
        .map(|sample| ExtractionRequest {
            extractor: extractor.map(str::to_owned),
            ..sample.request
        })
        .collect()
}

/// Submits 20 jobs and waits until they are done: by then the consumers have
/// joined their groups, and no measurement waits for a join.
pub(super) async fn warm_up(
    rig: &Rig,
    client: &reqwest::Client,
    base: &str,
    samples: &[ExtractionRequest],
    procs: &mut [Proc],
) -> anyhow::Result<()> {
    for request in samples.iter().cycle().take(20) {
        post(client, base, request).await?;
    }
    let hidden = ProgressBar::hidden();
    wait_all_done(rig, 20, procs, Duration::from_secs(60), &hidden).await
}

/// What the open loop sent, and how its submits were answered.
pub(super) struct OpenLoop {
    /// When the first send was due, wall clock.
    pub start_wall: SystemTime,
    /// Seconds from the first send's due time until the last was sent.
    pub sent_s: f64,
    /// Each accepted job, and when its submit was due.
    pub accepted: Vec<(Uuid, SystemTime)>,
    /// Due time to the 202 answer, µs.
    pub answer: Histogram<u64>,
    /// Each accepted submit's place in the sequence and how long after its
    /// due time it was answered.
    pub answered: Vec<(usize, Duration)>,
    /// Submits not accepted, by why.
    pub refused: BTreeMap<String, usize>,
}

impl OpenLoop {
    /// Submits not accepted, whatever the reason.
    pub fn refused_total(&self) -> usize {
        self.refused.values().sum()
    }
}

/// Sends `total` submissions, `rate` per second on the clock whatever the
/// answers' timing (open loop), and counts how each was answered: a refusal
/// is a measurement, never a failure of the run.
pub(super) async fn open_loop(
    client: &reqwest::Client,
    base: &str,
    samples: &[ExtractionRequest],
    rate: f64,
    total: usize,
    progress: &ProgressBar,
) -> anyhow::Result<OpenLoop> {
    let interval = Duration::from_secs_f64(1.0 / rate);
    // Bodies serialised once: the generator shares the machine it measures,
    // and every µs it spends per request is taken from the pipeline.
    let bodies: Vec<String> = samples
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    let url = format!("{base}/v1/extractions");
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let start_wall = SystemTime::now() + Duration::from_millis(50);
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due).await;
        let sent = client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bodies[i % bodies.len()].clone())
            .send();
        sends.spawn(async move {
            let outcome = answer(sent.await).await;
            (i, outcome, due.elapsed())
        });
        progress.inc(1);
    }
    let sent_s = start.elapsed().as_secs_f64();
    let intended = |i: usize| start_wall + interval.mul_f64(i as f64);
    let mut answer = histogram();
    let mut accepted: Vec<(Uuid, SystemTime)> = Vec::with_capacity(total);
    let mut answered = Vec::with_capacity(total);
    let mut refused = BTreeMap::new();
    while let Some(joined) = sends.join_next().await {
        let (i, outcome, answered_after) = joined?;
        match outcome {
            Ok(id) => {
                accepted.push((id, intended(i)));
                answer.saturating_record(answered_after.as_micros() as u64);
                answered.push((i, answered_after));
            }
            Err(why) => *refused.entry(why.0).or_insert(0) += 1,
        }
    }
    Ok(OpenLoop {
        start_wall,
        sent_s,
        accepted,
        answer,
        answered,
        refused,
    })
}

/// The accepted jobs' latencies from their intended send time, µs, read from
/// the transition log.
pub(super) struct JobTimes {
    /// To `mark_succeeded`.
    pub to_succeeded: Histogram<u64>,
    /// To `mark_bbox_refinement_succeeded`.
    pub to_bbox: Histogram<u64>,
    /// Each hop of `PATH`, in order.
    pub hops: Vec<Histogram<u64>>,
    /// The last `mark_succeeded`, epoch seconds.
    pub last_succeeded: f64,
}

/// The latencies of the jobs `ids`, each `accepted` with its intended send time.
pub(super) async fn job_times(
    pool: &PgPool,
    ids: &[Uuid],
    accepted: &[(Uuid, SystemTime)],
) -> anyhow::Result<JobTimes> {
    let log = transition_times(pool, ids).await?;
    let mut to_succeeded = histogram();
    let mut to_bbox = histogram();
    let mut hops: Vec<Histogram<u64>> = (1..PATH.len()).map(|_| histogram()).collect();
    let mut last_succeeded = 0.0_f64;
    for (id, sent_at) in accepted {
        let sent_at = sent_at.duration_since(UNIX_EPOCH)?.as_secs_f64();
        let times = log.get(id).context("a job without its transitions")?;
        let at = |t: &str| times.get(t).copied().context("a missing transition");
        let us = |seconds: f64| (seconds.max(0.0) * 1e6) as u64;
        last_succeeded = last_succeeded.max(at("mark_succeeded")?);
        to_succeeded.saturating_record(us(at("mark_succeeded")? - sent_at));
        to_bbox.saturating_record(us(at("mark_bbox_refinement_succeeded")? - sent_at));
        for (hop, pair) in hops.iter_mut().zip(PATH.windows(2)) {
            hop.saturating_record(us(at(pair[1])? - at(pair[0])?));
        }
    }
    Ok(JobTimes {
        to_succeeded,
        to_bbox,
        hops,
        last_succeeded,
    })
}

/// Each hop of `PATH` with its latency.
pub(super) fn hops(histograms: &[Histogram<u64>]) -> Vec<Hop> {
    PATH.windows(2)
        .zip(histograms)
        .map(|(pair, histogram)| Hop {
            from: pair[0].into(),
            to: pair[1].into(),
            latency: Latency::of(histogram),
        })
        .collect()
}

/// The steady state through an external extractor: `docstream extractor-serve`
/// answering every call after a fixed latency, with a concurrency cap per
/// worker (and the deployment's cap their sum), at a load just under what
/// the caps allow.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderSteady {
    /// The provider's latency per call, ms.
    pub latency_ms: u64,
    /// `max_concurrency` per worker process.
    pub cap: usize,
    /// Worker processes.
    pub workers: usize,
    /// What the cap allows: cap × workers ÷ latency, jobs per second.
    pub capacity_per_s: f64,
    /// Offered load as a share of the capacity.
    pub load: f64,
    /// Jobs succeeded per second ÷ capacity.
    pub utilisation: f64,
    /// The steady state itself.
    pub steady: Steady,
}

/// Options of the provider phase.
#[derive(Debug, Clone, Copy)]
pub struct ProviderLoad {
    /// The provider's latency per call, ms.
    pub latency_ms: u64,
    /// `max_concurrency` per worker process.
    pub cap: usize,
    /// Offered load as a share of cap × workers ÷ latency.
    pub load: f64,
    /// Seconds of sending.
    pub duration_s: f64,
}

/// The name the provider phase gives the reference extraction service.
pub(super) const REFERENCE: &str = "reference";

/// Starts `extractor-serve` with `latency_ms` per call, and a rig whose
/// workers call it as the extractor `reference`, `cap` calls at a time
/// across the deployment and `process_cap` per worker (0: no local bound).
pub(super) async fn start_provider(
    rig: &Rig,
    latency_ms: u64,
    (cap, process_cap): (usize, usize),
) -> anyhow::Result<(Rig, Proc)> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let args = [
        "extractor-serve".to_owned(),
        "--addr".to_owned(),
        addr.to_string(),
        "--latency-ms".to_owned(),
        latency_ms.to_string(),
    ];
    let provider = Proc::spawn_args("extractor-serve", &args, &rig.env, &rig.logs)?;
    let url = format!("http://{addr}{}", docstream::provider::PATH);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "extractor-serve did not listen on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut rig = rig.clone();
    let extractor = ExtractorSettings {
        url,
        max_concurrency: cap,
        process_max_concurrency: process_cap,
        ..ExtractorSettings::default()
    };
    rig.settings
        .extractors
        .insert(REFERENCE.to_owned(), extractor);
    rig.env
        .extend(docstream::config::extractors_env(&rig.settings.extractors));
    Ok((rig, provider))
}

/// Runs `extractor-serve` with `load.latency_ms`, then the steady state through
/// it at `load.load` of the capacity its cap allows.
pub async fn provider_steady(
    rig: &Rig,
    load: ProviderLoad,
    (workers, bbox_workers): (usize, usize),
    progress: &ProgressBar,
) -> anyhow::Result<ProviderSteady> {
    // The deployment's cap is the workers' together, each held to its share,
    // so the phase measures what it did when caps were per process.
    let caps = (load.cap * workers, load.cap);
    let (rig, provider) = start_provider(rig, load.latency_ms, caps).await?;
    let capacity = (load.cap * workers) as f64 / (load.latency_ms as f64 / 1000.0);
    let rate = (capacity * load.load).round();
    let mix = (workers, bbox_workers);
    let outcome = steady(&rig, rate, load.duration_s, mix, Some(REFERENCE), progress).await;
    let provider_cost = provider.cost_since(0.0)?;
    provider.stop().await?;
    let mut steady = outcome?;
    steady.processes.push(provider_cost);
    Ok(ProviderSteady {
        latency_ms: load.latency_ms,
        cap: load.cap,
        workers,
        capacity_per_s: capacity,
        load: load.load,
        utilisation: steady.succeeded_per_s / capacity,
        steady,
    })
}

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// A `serve` process on a free loopback port, and its base URL.
pub(super) fn spawn_serve(rig: &Rig) -> anyhow::Result<(String, Proc)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut env = rig.env.clone();
    env.push(("DOCSTREAM_HTTP_ADDR".into(), format!("127.0.0.1:{port}")));
    let serve = Proc::spawn("serve", "serve", &env, &rig.logs)?;
    Ok((format!("http://127.0.0.1:{port}"), serve))
}

pub(super) fn spawn_workers(
    rig: &Rig,
    workers: usize,
    bbox_workers: usize,
) -> anyhow::Result<Vec<Proc>> {
    let mut procs = Vec::new();
    for n in 1..=workers {
        procs.push(Proc::spawn(
            &format!("worker-{n}"),
            "worker",
            &rig.env,
            &rig.logs,
        )?);
    }
    for n in 1..=bbox_workers {
        let name = format!("bbox-worker-{n}");
        procs.push(Proc::spawn(&name, "bbox-worker", &rig.env, &rig.logs)?);
    }
    Ok(procs)
}

/// Each process's cost since `cpu_before` (empty: since it started).
pub(super) fn costs(procs: &[Proc], cpu_before: &[f64]) -> anyhow::Result<Vec<ProcCost>> {
    procs
        .iter()
        .enumerate()
        .map(|(i, p)| p.cost_since(cpu_before.get(i).copied().unwrap_or(0.0)))
        .collect()
}

pub(super) async fn post(
    client: &reqwest::Client,
    base: &str,
    request: &docstream::domain::ExtractionRequest,
) -> Result<Uuid, Refused> {
    let sent = client
        .post(format!("{base}/v1/extractions"))
        .json(request)
        .send()
        .await;
    answer(sent).await
}

/// The job id of a 202, or why there was none.
async fn answer(sent: reqwest::Result<reqwest::Response>) -> Result<Uuid, Refused> {
    let response = sent.map_err(|e| Refused(format!("no answer ({})", transport_kind(&e))))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.map_err(|e| {
        Refused(format!(
            "{} unreadable ({})",
            status.as_u16(),
            transport_kind(&e)
        ))
    })?;
    if status != reqwest::StatusCode::ACCEPTED {
        let code = body["error"]["code"].as_str().unwrap_or("?");
        return Err(Refused(format!("{} {code}", status.as_u16())));
    }
    body["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| Refused("202 without an id".into()))
}

/// Why a submit was not accepted: its status and error code (`503
/// overloaded`), or that no answer came; a row of the report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// What kind of transport failure `e` was, in a word.
fn transport_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    }
}

pub(super) async fn wait_healthy(
    client: &reqwest::Client,
    base: &str,
    procs: &mut [Proc],
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for proc in procs.iter_mut() {
            proc.ensure_running()?;
        }
        let answer = client.get(format!("{base}/healthz")).send().await;
        if answer.is_ok_and(|a| a.status().is_success()) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "serve not healthy after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Jobs in the scratch database with work left: queued or running, or with
/// their bbox refinement pending or running. Counted on the reapers' partial
/// indexes, so polling it costs little however many jobs are done.
async fn open_count(pool: &PgPool) -> anyhow::Result<i64> {
    let open = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM extractions WHERE status IN ('queued', 'running'))
              + (SELECT count(*) FROM extractions WHERE status = 'succeeded'
                   AND bbox_finished_at IS NULL AND bbox_status IN ('pending', 'running'))",
    )
    .fetch_one(pool)
    .await?;
    Ok(open)
}

/// Waits until no job has work left (`jobs` of them were the last to come
/// in), showing progress; fails if a process dies or `timeout` passes.
pub(super) async fn wait_all_done(
    rig: &Rig,
    jobs: usize,
    procs: &mut [Proc],
    timeout: Duration,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let open = open_count(&rig.pool).await?;
        progress.set_position((jobs as i64 - open).max(0) as u64);
        if open == 0 {
            return Ok(());
        }
        for proc in procs.iter_mut() {
            proc.ensure_running()?;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{open} of {jobs} jobs not done after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until each group `(name, members)` is stable with that many members,
/// every one of them assigned something (classic protocol: the group's state
/// and each member's assignment, as the coordinator reports them).
async fn wait_groups_stable(
    kafka: &docstream::config::KafkaClient,
    groups: &[(String, usize)],
    procs: &mut [Proc],
) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = kafka.config().create()?;
    let client = std::sync::Arc::new(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut unstable = Vec::new();
        for (group, members) in groups {
            let (client, name, members) = (client.clone(), group.clone(), *members);
            let stable = tokio::task::spawn_blocking(move || {
                let list = client.fetch_group_list(Some(&name), Duration::from_secs(5))?;
                let stable = list.groups().iter().any(|g| {
                    g.state() == "Stable"
                        && g.members().len() == members
                        && g.members()
                            .iter()
                            .all(|m| m.assignment().is_some_and(assigns_something))
                });
                anyhow::Ok(stable)
            })
            .await?;
            // A broker that has just started answers CoordinatorLoadInProgress
            // for a while: not stable yet, asked again until the deadline.
            if !stable.unwrap_or(false) {
                unstable.push(group.as_str());
            }
        }
        if unstable.is_empty() {
            return Ok(());
        }
        for proc in procs.iter_mut() {
            proc.ensure_running()?;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "consumer groups not stable after 60 s: {unstable:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a classic consumer-protocol assignment (a version, then the count
/// of its topics, big-endian) names any topic.
fn assigns_something(assignment: &[u8]) -> bool {
    assignment
        .get(2..6)
        .is_some_and(|count| i32::from_be_bytes(count.try_into().expect("four bytes")) > 0)
}

/// The benchmark counts only runs that kept the contract: every job claimed,
/// succeeded and bbox-refined exactly once (no duplicate work was done to win).
pub(super) async fn ensure_exactly_once(pool: &PgPool, ids: &[Uuid]) -> anyhow::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT transition::text, count(*) FROM extraction_transitions
          WHERE extraction_id = ANY($1) AND transition IN ('mark_succeeded', 'mark_bbox_refinement_succeeded')
          GROUP BY transition",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(
        rows.len() == 2,
        "jobs finished without their transitions: {rows:?}"
    );
    for (transition, count) in rows {
        anyhow::ensure!(
            count as usize == ids.len(),
            "{transition}: {count} wins for {} jobs",
            ids.len()
        );
    }
    Ok(())
}

/// Each job's transition timestamps (epoch seconds), first win of each kind.
pub(super) async fn transition_times(
    pool: &PgPool,
    ids: &[Uuid],
) -> anyhow::Result<HashMap<Uuid, HashMap<String, f64>>> {
    let rows: Vec<(Uuid, String, f64)> = sqlx::query_as(
        "SELECT extraction_id, transition::text, extract(epoch FROM min(at))::float8
           FROM extraction_transitions WHERE extraction_id = ANY($1)
          GROUP BY extraction_id, transition",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    let mut log: HashMap<Uuid, HashMap<String, f64>> = HashMap::new();
    for (id, transition, at) in rows {
        log.entry(id).or_default().insert(transition, at);
    }
    Ok(log)
}
