//! The benchmark's report: every measurement, the ratios between docstream and
//! the ceilings of the same run, and each against its target. Printed as a table
//! and serialised as JSON.

use std::fmt;

use serde::Serialize;

use super::external::number;
use super::fairness::Fairness;
use super::pipeline::{BurnDown, Latency, ProviderSteady, Steady};
use super::postgres::PgCeiling;
use super::BenchArgs;

/// One comparison, with its target when the issue sets one.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is compared.
    pub name: String,
    /// The measured value (a ratio, ms or MiB, see `unit`).
    pub value: f64,
    /// `x` for ratios, else the unit.
    pub unit: &'static str,
    /// `>= n` or `<= n`, when there is a target.
    pub target: Option<String>,
    /// Whether the target was met.
    pub met: Option<bool>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// Jobs in the burn-downs.
    pub jobs: usize,
    /// Whether this was a smoke run (sizes too small to mean anything).
    pub smoke: bool,
    /// pgbench on docstream's statements: one row, then many per statement.
    pub postgres: Vec<PgCeiling>,
    /// Kafka's perf tools (`scripts/bench/kafka.sh`).
    pub kafka: Option<serde_json::Value>,
    /// graphile-worker (`scripts/bench/peer.sh`).
    pub peer: Option<serde_json::Value>,
    /// River (`scripts/bench/river.sh`).
    pub river: Option<serde_json::Value>,
    /// docstream draining a queued backlog.
    pub burn_down: Option<BurnDown>,
    /// The same with two and three processes of each worker kind.
    pub scaling: Vec<BurnDown>,
    /// docstream under an open-loop HTTP load.
    pub steady: Option<Steady>,
    /// The same through an external extractor with a fixed latency.
    pub provider: Option<ProviderSteady>,
    /// One tenant's flood and another's steady jobs: without A's cap, then with it.
    pub fairness: Vec<Fairness>,
    /// Ratios and targets.
    pub checks: Vec<Check>,
}

impl Report {
    pub(super) fn new(args: &BenchArgs) -> Self {
        Self {
            started_at: chrono::Utc::now().to_rfc3339(),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            jobs: args.jobs,
            smoke: args.smoke,
            postgres: Vec::new(),
            kafka: None,
            peer: None,
            river: None,
            burn_down: None,
            scaling: Vec::new(),
            steady: None,
            provider: None,
            fairness: Vec::new(),
            checks: Vec::new(),
        }
    }

    /// Computes the ratios and checks from what was measured.
    pub(super) fn finish(&mut self) {
        let mut checks = Vec::new();
        let ratio = |name: &str, value: f64, at_least: Option<f64>| Check {
            name: name.to_owned(),
            value,
            unit: "x",
            target: at_least.map(|t| format!(">= {t}")),
            met: at_least.map(|t| value >= t),
        };
        if let Some(burn) = &self.burn_down {
            let rate = burn.jobs_per_s;
            let single = self.postgres.iter().find(|c| c.rows_per_statement == 1);
            let batched = self.postgres.iter().find(|c| c.rows_per_statement > 1);
            if let Some(single) = single {
                checks.push(ratio(
                    "burn-down / Postgres ceiling, 1 row per statement",
                    rate / single.lifecycles_per_s,
                    Some(2.0),
                ));
            }
            if let Some(batched) = batched {
                let name = format!(
                    "burn-down / Postgres ceiling, {} rows per statement",
                    batched.rows_per_statement
                );
                checks.push(ratio(&name, rate / batched.lifecycles_per_s, None));
            }
            if let Some(peer) = self
                .peer
                .as_ref()
                .and_then(|p| number(p, "jobs_per_s").ok())
            {
                checks.push(ratio("burn-down / graphile-worker", rate / peer, Some(2.0)));
            }
            if let Some(river) = self
                .river
                .as_ref()
                .and_then(|p| number(p, "jobs_per_s").ok())
            {
                // A docstream job is two stages; half of River's rate is
                // River's rate per stage (the stretch target).
                checks.push(ratio("burn-down / River", rate / river, Some(0.5)));
            }
            for more in &self.scaling {
                checks.push(ratio(
                    &format!(
                        "burn-down with {} + {} workers / with {} + {}",
                        more.workers, more.bbox_workers, burn.workers, burn.bbox_workers
                    ),
                    more.jobs_per_s / rate,
                    Some(0.9),
                ));
            }
            let kafka = self.kafka.as_ref();
            if let Some(ceiling) = kafka.and_then(|k| number(k, "consumer_records_per_s").ok()) {
                checks.push(ratio(
                    "consumer records/s / Kafka consumer ceiling",
                    burn.consumer_records_per_s / ceiling,
                    None,
                ));
            }
            let worker_rss = burn
                .processes
                .iter()
                .filter(|p| p.name.starts_with("worker"))
                .map(|p| p.peak_rss_mib)
                .fold(0.0, f64::max);
            checks.push(Check {
                name: "worker peak RSS at full throughput (burn-down)".into(),
                value: worker_rss,
                unit: "MiB",
                target: Some("<= 64".into()),
                met: Some(worker_rss <= 64.0),
            });
        }
        if let Some(steady) = &self.steady {
            let mut at_most = |what: &str, p99: f64, bound: f64| {
                checks.push(Check {
                    name: format!("steady p99 {what} at {}/s", steady.rate),
                    value: p99,
                    unit: "ms",
                    target: Some(format!("<= {bound}")),
                    met: Some(p99 <= bound),
                });
            };
            at_most("submit answered", steady.submit_answer.p99_ms, 20.0);
            let to_bbox = steady.submit_to_bbox_succeeded.p99_ms;
            at_most("submit->bbox succeeded", to_bbox, 50.0);
        }
        if let Some(p) = &self.provider {
            checks.push(Check {
                name: "extractor utilisation (succeeded/s / cap x workers / latency)".into(),
                value: p.utilisation,
                unit: "x",
                target: Some(">= 0.9".into()),
                met: Some(p.utilisation >= 0.9),
            });
            let p99 = p.steady.submit_to_succeeded.p99_ms;
            let bound = p.latency_ms as f64 + 50.0;
            checks.push(Check {
                name: format!("extractor p99 submit->succeeded at {}/s", p.steady.rate),
                value: p99,
                unit: "ms",
                target: Some(format!("<= {bound}")),
                met: Some(p99 <= bound),
            });
        }
        if let [free, capped] = &self.fairness[..] {
            let (free_p99, capped_p99) =
                (free.b_submit_to_bbox.p99_ms, capped.b_submit_to_bbox.p99_ms);
            checks.push(ratio(
                "fairness: B's p99 without A's cap / with it",
                free_p99 / capped_p99.max(f64::EPSILON),
                None,
            ));
        }
        self.checks = checks;
    }
}

/// A transition's name in the table.
fn short(transition: &str) -> &str {
    match transition {
        "mark_running" => "running",
        "mark_succeeded" => "succeeded",
        "start_bbox_refinement" => "bbox requested",
        "mark_bbox_refinement_running" => "bbox running",
        "mark_bbox_refinement_succeeded" => "bbox succeeded",
        other => other,
    }
}

fn latency(f: &mut fmt::Formatter<'_>, name: &str, l: &Latency) -> fmt::Result {
    writeln!(
        f,
        "  {name:<38} p50 {:>8.1} ms  p99 {:>8.1} ms  p99.9 {:>8.1} ms  max {:>8.1} ms",
        l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let smoke = if self.smoke {
            " (SMOKE: sizes too small to mean anything)"
        } else {
            ""
        };
        writeln!(
            f,
            "\ndocstream bench, {} CPUs, {}{smoke}",
            self.cpus, self.started_at
        )?;
        writeln!(f, "\nceilings")?;
        for c in &self.postgres {
            writeln!(
                f,
                "  postgres, {:>3} row(s)/statement       {:>10.0} lifecycles/s  ({} clients, {} s)",
                c.rows_per_statement, c.lifecycles_per_s, c.clients, c.seconds
            )?;
        }
        if let Some(k) = &self.kafka {
            let n = |field| number(k, field).unwrap_or(f64::NAN);
            writeln!(
                f,
                "  kafka producer perf test               {:>10.0} records/s",
                n("producer_records_per_s")
            )?;
            writeln!(
                f,
                "  kafka consumer perf test               {:>10.0} records/s",
                n("consumer_records_per_s")
            )?;
        }
        if let Some(p) = &self.peer {
            writeln!(
                f,
                "  graphile-worker {} burn-down       {:>10.0} jobs/s  ({} jobs)",
                p["version"].as_str().unwrap_or("?"),
                number(p, "jobs_per_s").unwrap_or(f64::NAN),
                p["jobs"]
            )?;
        }
        if let Some(r) = &self.river {
            writeln!(
                f,
                "  River {} burn-down                  {:>10.0} jobs/s  ({} jobs; MaxWorkers {}, FetchCooldown {} ms, FetchPollInterval {} ms)",
                r["version"].as_str().unwrap_or("?"),
                number(r, "jobs_per_s").unwrap_or(f64::NAN),
                r["jobs"],
                r["max_workers"],
                r["fetch_cooldown_ms"],
                r["fetch_poll_interval_ms"]
            )?;
        }
        if let Some(b) = &self.burn_down {
            writeln!(
                f,
                "\ndocstream burn-down ({} jobs, {} worker(s), {} bbox worker(s))",
                b.jobs, b.workers, b.bbox_workers
            )?;
            writeln!(f, "  jobs to bbox succeeded                 {:>10.0} jobs/s  ({:.2} s; {:.2} s wall incl. group join)", b.jobs_per_s, b.seconds, b.wall_s)?;
            writeln!(
                f,
                "  consumed                               {:>10.0} records/s",
                b.consumer_records_per_s
            )?;
            for p in &b.processes {
                writeln!(
                    f,
                    "  {:<38} {:>7.2} CPU-s  peak RSS {:>6.1} MiB",
                    p.name, p.cpu_s, p.peak_rss_mib
                )?;
            }
            if !b.statements.is_empty() {
                writeln!(f, "  where the server's time goes (pg_stat_statements):")?;
                writeln!(
                    f,
                    "  {:>9} {:>8} {:>9}  statement",
                    "total ms", "calls", "rows"
                )?;
            }
            for st in &b.statements {
                writeln!(
                    f,
                    "  {:>9.0} {:>8} {:>9}  {}",
                    st.total_ms, st.calls, st.rows, st.query
                )?;
            }
            let c = &b.cost;
            writeln!(f, "  cost per job, submit to bbox succeeded:")?;
            for (name, ms) in &c.cpu_ms {
                writeln!(f, "    CPU {name:<34} {ms:>8.3} ms")?;
            }
            writeln!(
                f,
                "    CPU, all processes                     {:>8.3} ms",
                c.total_cpu_ms
            )?;
            writeln!(
                f,
                "    WAL                                    {:>8.0} bytes",
                c.wal_bytes
            )?;
            if let (Some(statements), Some(rows)) = (c.statements, c.statement_rows) {
                writeln!(
                    f,
                    "    statements / their rows                {statements:>8.2} / {rows:.2}"
                )?;
            }
            writeln!(
                f,
                "    Kafka records / bytes                  {:>8.2} / {:.0}",
                c.kafka_records, c.kafka_bytes
            )?;
        }
        if let (Some(one), false) = (&self.burn_down, self.scaling.is_empty()) {
            writeln!(
                f,
                "\ndocstream burn-down by worker processes ({} jobs each)",
                one.jobs
            )?;
            for b in std::iter::once(one).chain(&self.scaling) {
                writeln!(
                    f,
                    "  {} worker(s) + {} bbox worker(s)          {:>10.0} jobs/s  ({:.2}x of {} + {}; CPU {:.3} ms/job)",
                    b.workers,
                    b.bbox_workers,
                    b.jobs_per_s,
                    b.jobs_per_s / one.jobs_per_s,
                    one.workers,
                    one.bbox_workers,
                    b.cost.total_cpu_ms
                )?;
            }
        }
        if let Some(s) = &self.steady {
            writeln!(
                f,
                "\ndocstream steady state ({} submissions at {}/s over {} s; sent at {:.0}/s)",
                s.sent, s.rate, s.duration_s, s.achieved_rate
            )?;
            latency(f, "submit answered (202)", &s.submit_answer)?;
            latency(f, "submit -> succeeded", &s.submit_to_succeeded)?;
            latency(f, "submit -> bbox succeeded", &s.submit_to_bbox_succeeded)?;
            writeln!(f, "  where the time goes:")?;
            for hop in &s.hops {
                let name = format!("  {} -> {}", short(&hop.from), short(&hop.to));
                latency(f, &name, &hop.latency)?;
            }
            writeln!(
                f,
                "  CPU per 1,000 jobs, all processes      {:>10.2} CPU-s",
                s.cpu_s_per_1000_jobs
            )?;
            for p in &s.processes {
                let per_1000 = p.cpu_s / (s.accepted as f64 / 1000.0);
                writeln!(
                    f,
                    "  {:<38} {:>7.2} CPU-s/1000 jobs  peak RSS {:>6.1} MiB",
                    p.name, per_1000, p.peak_rss_mib
                )?;
            }
        }
        if let Some(p) = &self.provider {
            let s = &p.steady;
            writeln!(
                f,
                "\nthrough extractor-serve ({} ms per call, cap {} x {} worker(s) = {:.0} jobs/s; offered {}/s = {:.2} of it)",
                p.latency_ms, p.cap, p.workers, p.capacity_per_s, s.rate, p.load
            )?;
            writeln!(
                f,
                "  succeeded                              {:>10.1} jobs/s  utilisation {:.3}",
                s.succeeded_per_s, p.utilisation
            )?;
            latency(f, "submit answered (202)", &s.submit_answer)?;
            latency(f, "submit -> succeeded", &s.submit_to_succeeded)?;
            latency(f, "submit -> bbox succeeded", &s.submit_to_bbox_succeeded)?;
            for hop in &s.hops {
                let name = format!("  {} -> {}", short(&hop.from), short(&hop.to));
                latency(f, &name, &hop.latency)?;
            }
        }
        for run in &self.fairness {
            let cap = run.a_cap.map_or("no cap on A".to_owned(), |c| {
                format!("A capped at {c} open jobs")
            });
            writeln!(
                f,
                "\nfairness: A floods {} jobs, B sends {} at 10/s ({cap})",
                run.a_jobs, run.b_jobs
            )?;
            writeln!(
                f,
                "  A done after                           {:>10.1} s  ({} submits answered 429, each retried)",
                run.a_done_s, run.a_refusals
            )?;
            latency(f, "B: submit -> bbox succeeded", &run.b_submit_to_bbox)?;
        }
        writeln!(f, "\nratios and targets")?;
        for c in &self.checks {
            let verdict = match c.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "",
            };
            writeln!(
                f,
                "  {:<52} {:>9.2} {:<3} {:<8} {verdict}",
                c.name,
                c.value,
                c.unit,
                c.target.as_deref().unwrap_or("")
            )?;
        }
        Ok(())
    }
}
