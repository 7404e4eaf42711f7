//! The fairness phase: tenant A floods `flood` jobs as fast as it can (64
//! submits in flight, each retried after `Retry-After` until accepted, as a
//! well-behaved client does), while tenant B submits 100 jobs at 10/s. What
//! B waits for its jobs (submit to started, and to bbox succeeded) is
//! measured in five runs ([`Run`]): B alone (the baseline), B beside A's
//! flood with both at weight 1 and no cap (the workers' shares alone), the
//! same with A capped, priorities (A's flood `low` and the 100 jobs A's too
//! but `high`), and starvation (A's flood `high`, the 100 jobs `low`, with
//! the workers' bound on passing a record over at [`STARVED_BOUND_S`]), and
//! admission: A floods past `serve`'s admission limit (pinned at
//! [`ADMISSION_LIMIT`], [`ADMISSION_FLOOD`] submits in flight), where the
//! limit's shares must keep B's submits admitted. Neither tenant has a
//! submit rate. A refusal of B's is counted, not the end of the run.
//!
//! Every job is extracted by `extractor-serve` with a model's latency (200 ms,
//! 32 calls at a time: 160 jobs/s), so that, as with a real model, the
//! extraction and not the HTTP edge sets the pace, and a flood builds a
//! backlog in the job topics.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::stream::{self, StreamExt};
use indicatif::ProgressBar;
use serde::Serialize;
use uuid::Uuid;

use hdrhistogram::Histogram;

use super::pipeline::{
    histogram, hops, job_times, post, requests_for, spawn_serve, spawn_workers, start_provider,
    transition_times, wait_all_done, wait_healthy, warm_up, Hop, Latency, Rig, REFERENCE,
};
use crate::demo::api_client;
use docstream::domain::{ExtractionRequest, Priority};
use docstream::store::tenants;

/// B's jobs: how many, and at what rate.
const B_JOBS: usize = 100;
const B_RATE: f64 = 10.0;
/// A's submits in flight at once.
const A_CONCURRENCY: usize = 64;
/// The extraction service's latency per call, ms, and the calls a worker
/// makes at once.
const PROVIDER_LATENCY_MS: u64 = 200;
const PROVIDER_CAP: usize = 32;
/// The starvation run's `DOCSTREAM_WORKER_PRIORITY_MAX_WAIT_S`: shorter
/// than the high flood lasts, so the bound is what starts the low jobs.
pub const STARVED_BOUND_S: u64 = 10;
/// The admission run's limit on `serve`'s submits in flight, pinned.
pub const ADMISSION_LIMIT: usize = 32;
/// A's submits in flight in the admission run: well past the limit.
const ADMISSION_FLOOD: usize = 256;

/// What one run of the phase puts beside B's 100 jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Run {
    /// Nothing: B alone, the baseline.
    Alone,
    /// A's flood, no cap, both tenants at weight 1.
    Shared,
    /// A's flood, A capped at this many open jobs.
    Capped(i64),
    /// A's flood at priority `low`; the 100 jobs are A's too, at `high`.
    Priority,
    /// A's flood at priority `high`; the 100 jobs are A's too, at `low`,
    /// and a worker passes a record over for [`STARVED_BOUND_S`] at most.
    Starved,
    /// A's flood past `serve`'s admission limit, both tenants at weight 1.
    Admission,
}

impl Run {
    /// The kinds `--fairness-runs` names.
    pub const KINDS: [&'static str; 6] = [
        "alone",
        "shared",
        "capped",
        "priority",
        "starved",
        "admission",
    ];

    /// Its kind, as `--fairness-runs` names it.
    pub fn kind(self) -> &'static str {
        match self {
            Run::Alone => "alone",
            Run::Shared => "shared",
            Run::Capped(_) => "capped",
            Run::Priority => "priority",
            Run::Starved => "starved",
            Run::Admission => "admission",
        }
    }

    /// Its short name, in scratch databases' and topics' names.
    pub fn name(self) -> String {
        match self {
            Run::Alone => "alone".into(),
            Run::Shared => "shared".into(),
            Run::Capped(cap) => format!("cap{cap}"),
            Run::Priority => "priority".into(),
            Run::Starved => "starved".into(),
            Run::Admission => "admission".into(),
        }
    }

    /// How the report names it.
    pub fn describe(self) -> String {
        match self {
            Run::Alone => "B alone".into(),
            Run::Shared => "no cap, weights 1 : 1".into(),
            Run::Capped(cap) => format!("A capped at {cap} open jobs"),
            Run::Priority => "A's flood low, the 100 jobs A's and high".into(),
            Run::Starved => format!(
                "A's flood high, the 100 jobs A's and low, passed over {STARVED_BOUND_S} s at most"
            ),
            Run::Admission => format!(
                "A past serve's admission limit, pinned at {ADMISSION_LIMIT}; {ADMISSION_FLOOD} \
                 of A's submits in flight"
            ),
        }
    }
}

/// One run of the phase.
#[derive(Debug, Clone, Serialize)]
pub struct Fairness {
    /// What ran beside B's jobs.
    pub run: Run,
    /// Jobs A submitted (all were accepted in the end).
    pub a_jobs: usize,
    /// Submits of A's answered 429 or 503 (each retried).
    pub a_refusals: u64,
    /// Of them, 503 `overloaded`: the admission limit's.
    pub a_overloaded: u64,
    /// From A's first submit until its last job was done, s.
    pub a_done_s: f64,
    /// B's jobs (accepted).
    pub b_jobs: usize,
    /// B's submits not accepted, by why.
    pub b_refused: BTreeMap<String, usize>,
    /// B's submit (the moment it was due) to its first claim.
    pub b_submit_to_start: Latency,
    /// B's submit (the moment it was due) to bbox succeeded.
    pub b_submit_to_bbox: Latency,
    /// Where B's time goes: each hop between consecutive transitions.
    pub b_hops: Vec<Hop>,
}

/// Runs serve and a worker of each kind, the flood and B's jobs; waits until
/// every job is done.
pub async fn fairness(
    rig: &Rig,
    flood: usize,
    run_kind: Run,
    progress: &ProgressBar,
) -> anyhow::Result<Fairness> {
    let (mut rig, provider) = start_provider(rig, PROVIDER_LATENCY_MS, (PROVIDER_CAP, 0)).await?;
    if run_kind == Run::Starved {
        let bound = ("DOCSTREAM_WORKER_PRIORITY_MAX_WAIT_S", STARVED_BOUND_S);
        rig.env.push((bound.0.into(), bound.1.to_string()));
    }
    if run_kind == Run::Admission {
        for bound in ["MIN", "MAX"] {
            let name = format!("DOCSTREAM_SUBMIT_{bound}_IN_FLIGHT");
            rig.env.push((name, ADMISSION_LIMIT.to_string()));
        }
    }
    let flood = if run_kind == Run::Alone { 0 } else { flood };
    let outcome = run(&rig, flood, run_kind, progress).await;
    provider.stop().await?;
    outcome
}

async fn run(
    rig: &Rig,
    flood: usize,
    run_kind: Run,
    progress: &ProgressBar,
) -> anyhow::Result<Fairness> {
    let (base, serve) = spawn_serve(rig)?;
    let mut procs = vec![serve];
    procs.extend(spawn_workers(rig, 1, 1)?);
    let (a_client, b_client) = create_tenants(rig, run_kind).await?;
    wait_healthy(&b_client, &base, &mut procs).await?;

    let samples = requests_for(Some(REFERENCE));
    let (a_samples, b_samples) = match run_kind {
        Run::Priority => (
            with_priority(&samples, Priority::Low),
            with_priority(&samples, Priority::High),
        ),
        Run::Starved => (
            with_priority(&samples, Priority::High),
            with_priority(&samples, Priority::Low),
        ),
        _ => (samples.clone(), samples.clone()),
    };
    progress.set_message("warming up");
    warm_up(rig, &b_client, &base, &samples, &mut procs).await?;

    progress.set_message(format!(
        "A floods {flood} jobs, B sends {B_JOBS} at {B_RATE}/s"
    ));
    progress.set_length((flood + B_JOBS) as u64);
    progress.set_position(0);
    let started = SystemTime::now();
    let flooding = {
        let (client, base, samples) = (a_client.clone(), base.clone(), a_samples);
        let in_flight = match run_kind {
            Run::Admission => ADMISSION_FLOOD,
            _ => A_CONCURRENCY,
        };
        let flood = (flood, in_flight);
        tokio::spawn(async move { flood_jobs(&client, &base, &samples, flood).await })
    };
    // B starts once A's flood is under way.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (b_sent, b_refused) = send_b_jobs(&b_client, &base, &b_samples, progress).await?;
    let (a_ids, (a_refusals, a_overloaded)) = flooding.await??;
    progress.set_message("waiting for the last jobs");
    let total = 20 + flood + b_sent.len();
    let hidden = ProgressBar::hidden();
    wait_all_done(rig, total, &mut procs, Duration::from_secs(600), &hidden).await?;
    for proc in procs {
        proc.stop().await?;
    }

    let b_ids: Vec<Uuid> = b_sent.iter().map(|(id, _)| *id).collect();
    let b_start = b_start(rig, &b_ids, &b_sent).await?;
    let b_times = job_times(&rig.pool, &b_ids, &b_sent).await?;
    let a_last = last_bbox_succeeded(rig, &a_ids).await?;
    let a_first = started.duration_since(UNIX_EPOCH)?.as_secs_f64();
    Ok(Fairness {
        run: run_kind,
        a_jobs: a_ids.len(),
        a_refusals,
        a_overloaded,
        // B alone: A submitted nothing, and finished nothing.
        a_done_s: if a_ids.is_empty() {
            0.0
        } else {
            a_last - a_first
        },
        b_jobs: b_ids.len(),
        b_refused,
        b_submit_to_start: Latency::of(&b_start),
        b_submit_to_bbox: Latency::of(&b_times.to_bbox),
        b_hops: hops(&b_times.hops),
    })
}

/// Tenants A (capped in a `Capped` run) and B, neither with a submit rate,
/// named after the run: a client for each (in a `Priority` or `Starved`
/// run, both are A's).
async fn create_tenants(
    rig: &Rig,
    run_kind: Run,
) -> anyhow::Result<(reqwest::Client, reqwest::Client)> {
    let run = run_kind.name();
    let (a_name, b_name) = (format!("flood-{run}"), format!("steady-{run}"));
    let a = tenants::create_tenant(&rig.pool, &a_name).await?.key;
    let b = tenants::create_tenant(&rig.pool, &b_name).await?.key;
    let cap = match run_kind {
        Run::Capped(cap) => cap as i32,
        _ => 0,
    };
    tenants::set_quota(&rig.pool, &a_name, Some(Some(0.0)), None, Some(Some(cap))).await?;
    tenants::set_quota(&rig.pool, &b_name, Some(Some(0.0)), None, Some(Some(0))).await?;
    let a_client = api_client(&a.api_key)?;
    let b_client = match run_kind {
        Run::Priority | Run::Starved => a_client.clone(),
        _ => api_client(&b.api_key)?,
    };
    Ok((a_client, b_client))
}

/// `samples`, each with `priority`.
fn with_priority(samples: &[ExtractionRequest], priority: Priority) -> Vec<ExtractionRequest> {
    (samples.iter())
        .map(|sample| ExtractionRequest {
            priority: Some(priority),
            ..sample.clone()
        })
        .collect()
}

/// Sends B's `B_JOBS` jobs at `B_RATE`: each accepted job's id and when it
/// was due, and the submits not accepted, by why.
async fn send_b_jobs(
    client: &reqwest::Client,
    base: &str,
    samples: &[ExtractionRequest],
    progress: &ProgressBar,
) -> anyhow::Result<(Vec<(Uuid, SystemTime)>, BTreeMap<String, usize>)> {
    let interval = Duration::from_secs_f64(1.0 / B_RATE);
    let start = tokio::time::Instant::now();
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..B_JOBS {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due).await;
        let due_wall = SystemTime::now();
        let (client, base, request) = (
            client.clone(),
            base.to_owned(),
            samples[i % samples.len()].clone(),
        );
        sends.spawn(async move { (post(&client, &base, &request).await, due_wall) });
        progress.inc(1);
    }
    let mut b_sent = Vec::with_capacity(B_JOBS);
    let mut refused = BTreeMap::new();
    while let Some(joined) = sends.join_next().await {
        match joined? {
            (Ok(id), due) => b_sent.push((id, due)),
            (Err(why), _) => *refused.entry(why.0).or_default() += 1,
        }
    }
    Ok((b_sent, refused))
}

/// B's jobs `b_ids`, each `b_sent` with its due time: due to first claim, µs.
async fn b_start(
    rig: &Rig,
    b_ids: &[Uuid],
    b_sent: &[(Uuid, SystemTime)],
) -> anyhow::Result<Histogram<u64>> {
    let log = transition_times(&rig.pool, b_ids).await?;
    let mut b_start = histogram();
    for (id, due) in b_sent {
        let due = due.duration_since(UNIX_EPOCH)?.as_secs_f64();
        let started = (log.get(id))
            .and_then(|times| times.get("mark_running").copied())
            .context("a job of B's without mark_running")?;
        b_start.saturating_record(((started - due).max(0.0) * 1e6) as u64);
    }
    Ok(b_start)
}

/// When the last of A's jobs `a_ids` was bbox succeeded, epoch seconds.
async fn last_bbox_succeeded(rig: &Rig, a_ids: &[Uuid]) -> anyhow::Result<f64> {
    let a_log = transition_times(&rig.pool, a_ids).await?;
    Ok(a_log
        .values()
        .filter_map(|t| t.get("mark_bbox_refinement_succeeded").copied())
        .fold(0.0_f64, f64::max))
}

/// Submits `n` jobs with `in_flight` at once, each retried after its
/// `Retry-After` until accepted: their ids, and how many 429s and 503s it
/// took, and of them the 503s.
async fn flood_jobs(
    client: &reqwest::Client,
    base: &str,
    samples: &[ExtractionRequest],
    (n, in_flight): (usize, usize),
) -> anyhow::Result<(Vec<Uuid>, (u64, u64))> {
    let answers: Vec<anyhow::Result<(Uuid, u64, u64)>> = stream::iter(0..n)
        .map(|i| async move {
            let (mut refusals, mut overloaded) = (0, 0);
            loop {
                let response = client
                    .post(format!("{base}/v1/extractions"))
                    .json(&samples[i % samples.len()])
                    .send()
                    .await?;
                let status = response.status();
                if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
                    overloaded += 1;
                }
                if status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || status == reqwest::StatusCode::SERVICE_UNAVAILABLE
                {
                    refusals += 1;
                    let wait = response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .unwrap_or(1);
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                    continue;
                }
                let body: serde_json::Value = response.json().await?;
                anyhow::ensure!(
                    status == reqwest::StatusCode::ACCEPTED,
                    "A's submit answered {status}: {body}"
                );
                let id = body["id"].as_str().context("answer without id")?.parse()?;
                return Ok((id, refusals, overloaded));
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let mut ids = Vec::with_capacity(n);
    let (mut refusals, mut overloaded) = (0, 0);
    for answer in answers {
        let (id, refused, over) = answer?;
        ids.push(id);
        refusals += refused;
        overloaded += over;
    }
    Ok((ids, (refusals, overloaded)))
}
