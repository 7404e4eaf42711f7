//! The saturation curve: `serve` and the workers under an open-loop HTTP load
//! of 0.5×, 1×, 1.5×, 2× and 3× the capacity measured at the start of the
//! phase (what [`CLIENTS`] submitters in a closed loop get accepted per
//! second: the whole pipeline's pace over HTTP, which on a small machine is
//! well below the burn-down's, since `serve` and this generator share the
//! cores), each step drained before the next. Past capacity,
//! `serve` should shed what it cannot take at once (503 `overloaded`) and keep
//! its accepted rate near the peak and its accepted submits fast. Then the
//! recovery: 3× for a few seconds straight into 0.5×, and how soon the
//! accepted submits are fast again.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use serde::Serialize;
use uuid::Uuid;

use super::cost::services_cpu_s;
use super::pipeline::{
    costs, ensure_exactly_once, histogram, job_times, open_loop, post, requests_for,
    start_pipeline, wait_all_done, warm_up, Latency, OpenLoop, Rig,
};
use super::procs::Proc;

/// Submitters of the closed loop that measures the capacity: enough that
/// the loop is held back by `serve`, not by its own round trips (32 measured
/// 32 ÷ the latency on a loaded machine, well below what `serve` then took
/// at 3×), and fewer than the admission limit starts at.
pub const CLIENTS: usize = 128;

/// The offered loads, as multiples of the capacity.
pub const LOADS: [f64; 5] = [0.5, 1.0, 1.5, 2.0, 3.0];
/// The p99 an accepted submit must stay under once the load has dropped.
pub const RECOVERED_P99_MS: f64 = 250.0;

/// The curve and the recovery after it.
#[derive(Debug, Clone, Serialize)]
pub struct Saturation {
    /// Jobs per second the steps are multiples of: accepted per second by
    /// [`CLIENTS`] submitters in a closed loop (or `--rate`, when given).
    pub capacity_per_s: f64,
    /// What the capacity is (`closed loop`, or `--rate`).
    pub capacity_from: String,
    /// This run's burn-down, jobs/s, for comparison.
    pub burn_down_per_s: Option<f64>,
    /// One per offered load.
    pub steps: Vec<Step>,
    /// 3× straight into 0.5×.
    pub recovery: Recovery,
}

/// One offered load, sent for its seconds and drained.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Offered load ÷ capacity.
    pub load: f64,
    /// Submissions offered per second.
    pub offered_per_s: f64,
    /// Seconds of sending.
    pub seconds: f64,
    /// Submissions sent.
    pub sent: usize,
    /// Of them, accepted (202).
    pub accepted: usize,
    /// Accepted per second of sending.
    pub accepted_per_s: f64,
    /// Not accepted, by why.
    pub refused: BTreeMap<String, usize>,
    /// Share of the sent answered 503 or 429.
    pub shed_share: f64,
    /// Due time to the 202, accepted submits only.
    pub submit_answer: Latency,
    /// Due time to bbox succeeded, accepted jobs.
    pub submit_to_bbox_succeeded: Latency,
    /// CPU ms per accepted job: every docstream process, Postgres and the
    /// broker, from the first send until the step's jobs were done.
    pub cpu_ms_per_accepted_job: f64,
}

/// How soon accepted submits are fast again once the load drops.
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    /// Seconds at 3× before the drop.
    pub overload_s: f64,
    /// The load dropped to.
    pub load: f64,
    /// p99 of the accepted submits due in each second after the drop, ms.
    pub p99_by_second_ms: Vec<f64>,
    /// Seconds after the drop from which every second's p99 stays under
    /// [`RECOVERED_P99_MS`]; `None` if it never did.
    pub recovered_after_s: Option<f64>,
}

/// Runs the curve on `rig`, each step `seconds` long, against the capacity it
/// measures first (or `rate`, when given); `burn_down` is for the report.
pub async fn saturation(
    rig: &Rig,
    (rate, burn_down): (Option<f64>, Option<f64>),
    seconds: f64,
    (workers, bbox_workers): (usize, usize),
    progress: &ProgressBar,
) -> anyhow::Result<Saturation> {
    let (client, base, mut procs) = start_pipeline(rig, workers, bbox_workers).await?;
    let samples = requests_for(None);
    progress.set_message("warming up");
    warm_up(rig, &client, &base, &samples, &mut procs).await?;
    let load = Load {
        rig,
        client: &client,
        base: &base,
        samples: &samples,
        progress,
    };
    let (capacity_per_s, capacity_from) = match rate {
        Some(rate) => (rate, "--rate".to_owned()),
        None => {
            progress.set_message(format!("capacity: {CLIENTS} submitters, closed loop"));
            let capacity = load.capacity(seconds, &mut procs).await?;
            (capacity, format!("closed loop, {CLIENTS} submitters"))
        }
    };
    let mut steps = Vec::new();
    for multiple in LOADS {
        let rate = capacity_per_s * multiple;
        progress.set_message(format!("{multiple}x = {rate:.0}/s"));
        let step = load.step(multiple, rate, seconds, &mut procs).await?;
        steps.push(step);
    }
    progress.set_message("recovery: 3x, then 0.5x");
    let recovery = load.recovery(capacity_per_s, seconds, &mut procs).await?;
    for proc in procs {
        proc.stop().await?;
    }
    Ok(Saturation {
        capacity_per_s,
        capacity_from,
        burn_down_per_s: burn_down,
        steps,
        recovery,
    })
}

/// What every step sends with.
struct Load<'a> {
    rig: &'a Rig,
    client: &'a reqwest::Client,
    base: &'a str,
    samples: &'a [docstream::domain::ExtractionRequest],
    progress: &'a ProgressBar,
}

impl Load<'_> {
    /// Accepted submits per second of [`CLIENTS`] submitters that each send
    /// the next as soon as the last was answered, for `seconds` (at least 3);
    /// then their jobs are drained.
    async fn capacity(&self, seconds: f64, procs: &mut [Proc]) -> anyhow::Result<f64> {
        let until = tokio::time::Instant::now() + Duration::from_secs_f64(seconds.max(3.0));
        let started = std::time::Instant::now();
        let submitter = |n: usize| async move {
            let mut accepted = Vec::new();
            for request in self.samples.iter().cycle().skip(n) {
                if tokio::time::Instant::now() >= until {
                    break;
                }
                // A refusal (the limit, a slow moment) is retried at once:
                // the loop measures what gets in, not what is asked.
                match post(self.client, self.base, request).await {
                    Ok(id) => accepted.push(id),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            accepted
        };
        let accepted: Vec<Uuid> = futures::future::join_all((0..CLIENTS).map(submitter))
            .await
            .into_iter()
            .flatten()
            .collect();
        let rate = accepted.len() as f64 / started.elapsed().as_secs_f64();
        let timeout = Duration::from_secs(120);
        wait_all_done(self.rig, accepted.len(), procs, timeout, self.progress).await?;
        ensure_exactly_once(&self.rig.pool, &accepted).await?;
        Ok(rate)
    }

    /// `rate` for `seconds`, then until every accepted job is done.
    async fn step(
        &self,
        multiple: f64,
        rate: f64,
        seconds: f64,
        procs: &mut [Proc],
    ) -> anyhow::Result<Step> {
        let cpu_before = cpu_now(procs)?;
        let sent = self.send(rate, seconds).await?;
        let ids = self.drain(&sent, procs).await?;
        let cpu_s = cpu_now(procs)? - cpu_before;
        let times = job_times(&self.rig.pool, &ids, &sent.accepted).await?;
        let total = sent.accepted.len() + sent.refused_total();
        let shed: usize = sent
            .refused
            .iter()
            .filter(|(why, _)| why.starts_with("503") || why.starts_with("429"))
            .map(|(_, count)| count)
            .sum();
        Ok(Step {
            load: multiple,
            offered_per_s: rate,
            seconds,
            sent: total,
            accepted: ids.len(),
            accepted_per_s: ids.len() as f64 / sent.sent_s.max(f64::EPSILON),
            shed_share: shed as f64 / total.max(1) as f64,
            refused: sent.refused,
            submit_answer: Latency::of(&sent.answer),
            submit_to_bbox_succeeded: Latency::of(&times.to_bbox),
            cpu_ms_per_accepted_job: cpu_s * 1000.0 / ids.len().max(1) as f64,
        })
    }

    /// 3× for `seconds / 3` (at least 2 s), then 0.5× for `seconds` straight
    /// after, and the p99 of each second after the drop.
    async fn recovery(
        &self,
        capacity_per_s: f64,
        seconds: f64,
        procs: &mut [Proc],
    ) -> anyhow::Result<Recovery> {
        let overload_s = (seconds / 3.0).max(2.0);
        let calm = 0.5;
        let (overload, after) = tokio::join!(self.send(capacity_per_s * 3.0, overload_s), async {
            tokio::time::sleep(Duration::from_secs_f64(overload_s)).await;
            self.send(capacity_per_s * calm, seconds).await
        });
        let (overload, after) = (overload?, after?);
        self.drain(&overload, procs).await?;
        self.drain(&after, procs).await?;
        let rate = capacity_per_s * calm;
        let p99_by_second_ms = p99_by_second(&after, rate, seconds);
        let recovered_after_s = p99_by_second_ms
            .iter()
            .rposition(|p99| *p99 > RECOVERED_P99_MS)
            .map_or(Some(0.0), |late| {
                let next = late + 1;
                (next < p99_by_second_ms.len()).then_some(next as f64)
            });
        Ok(Recovery {
            overload_s,
            load: calm,
            p99_by_second_ms,
            recovered_after_s,
        })
    }

    async fn send(&self, rate: f64, seconds: f64) -> anyhow::Result<OpenLoop> {
        let total = (rate * seconds).round().max(1.0) as usize;
        let hidden = ProgressBar::hidden();
        let client = self.client;
        open_loop(client, self.base, self.samples, rate, total, &hidden).await
    }

    /// Waits until the jobs `sent` accepted are done, checks each was done
    /// once, and answers their ids.
    async fn drain(&self, sent: &OpenLoop, procs: &mut [Proc]) -> anyhow::Result<Vec<Uuid>> {
        let ids: Vec<Uuid> = sent.accepted.iter().map(|(id, _)| *id).collect();
        let timeout = Duration::from_secs(120.max(ids.len() as u64 / 100));
        wait_all_done(self.rig, ids.len(), procs, timeout, self.progress).await?;
        ensure_exactly_once(&self.rig.pool, &ids).await?;
        Ok(ids)
    }
}

/// CPU seconds so far of `procs`, Postgres and the broker.
fn cpu_now(procs: &[Proc]) -> anyhow::Result<f64> {
    let own: f64 = costs(procs, &[])?.iter().map(|p| p.cpu_s).sum();
    Ok(own + services_cpu_s())
}

/// The p99 of the accepted submits of `sent` due in each whole second, ms
/// (0 for a second with none accepted).
fn p99_by_second(sent: &OpenLoop, rate: f64, seconds: f64) -> Vec<f64> {
    let buckets = seconds.ceil() as usize;
    let mut by_second: Vec<Histogram<u64>> = (0..buckets).map(|_| histogram()).collect();
    for (i, answered_after) in &sent.answered {
        let second = (*i as f64 / rate) as usize;
        if let Some(bucket) = by_second.get_mut(second) {
            bucket.saturating_record(answered_after.as_micros() as u64);
        }
    }
    by_second
        .iter()
        .map(|h| h.value_at_quantile(0.99) as f64 / 1000.0)
        .collect()
}
