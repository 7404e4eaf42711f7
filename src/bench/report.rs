//! The benchmark's report: every measurement, the ratios between docstream and
//! the ceilings of the same run, and each against its target. Printed as a table
//! and serialised as JSON.

use std::fmt;

use serde::Serialize;

use super::cost::JobCost;
use super::external::number;
use super::fairness::{Fairness, Run};
use super::pipeline::{BurnDown, Hop, Latency, ProviderSteady, StatementCost, Steady};
use super::postgres::PgCeiling;
use super::refusals::{Refusals, REFUSAL_SHARE};
use super::saturation::{Saturation, RECOVERED_P99_MS};
use super::BenchArgs;

/// The machine a run was on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub cores: usize,
    /// The CPU's model name (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// graphile-worker's burn-down on it in this run, jobs/s.
    pub graphile_worker_jobs_per_s: Option<f64>,
    /// River's burn-down on it in this run, jobs/s.
    pub river_jobs_per_s: Option<f64>,
}

impl Machine {
    fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown CPU".to_owned(), |(_, m)| m.trim().to_owned());
        Self {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            graphile_worker_jobs_per_s: None,
            river_jobs_per_s: None,
        }
    }
}

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
    /// The machine: its CPU model and the peers' rates on it, so runs on
    /// different machines can be told apart.
    pub machine: Machine,
    /// Jobs in the burn-downs.
    pub jobs: usize,
    /// Whether this was a smoke run (sizes too small to mean anything).
    pub smoke: bool,
    /// pgbench on docstream's statements: one row, then many per statement.
    pub postgres: Vec<PgCeiling>,
    /// Kafka's perf tools (`scripts/bench/kafka.sh`).
    pub kafka: Option<serde_json::Value>,
    /// graphile-worker (`scripts/bench/peer.sh`), one answer per mode: its
    /// no-op job, then its two-stage chain.
    pub peer: Vec<serde_json::Value>,
    /// River (`scripts/bench/river.sh`), one answer per mode: its no-op job,
    /// then its two chains.
    pub river: Vec<serde_json::Value>,
    /// docstream draining a queued backlog.
    pub burn_down: Option<BurnDown>,
    /// The same with two and three processes of each worker kind.
    pub scaling: Vec<BurnDown>,
    /// docstream under an open-loop HTTP load.
    pub steady: Option<Steady>,
    /// docstream under 0.5× to 3× its capacity, and its recovery.
    pub saturation: Option<Saturation>,
    /// What a refusal costs against an accepted submit.
    pub refusals: Option<Refusals>,
    /// The same through an external extractor with a fixed latency.
    pub provider: Option<ProviderSteady>,
    /// One tenant's flood and another's steady jobs: without A's cap, then with it.
    pub fairness: Vec<Fairness>,
    /// List pages on a large history, and the purge through a short retention.
    pub history: Option<super::history::History>,
    /// Uploads, and what a file adds to a job's latency.
    pub files: Option<super::files::Files>,
    /// Ratios and targets.
    pub checks: Vec<Check>,
}

impl Report {
    pub(super) fn new(args: &BenchArgs) -> Self {
        Self {
            started_at: chrono::Utc::now().to_rfc3339(),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            machine: Machine::this(),
            jobs: args.jobs,
            smoke: args.smoke,
            postgres: Vec::new(),
            kafka: None,
            peer: Vec::new(),
            river: Vec::new(),
            burn_down: None,
            scaling: Vec::new(),
            steady: None,
            saturation: None,
            refusals: None,
            provider: None,
            fairness: Vec::new(),
            history: None,
            files: None,
            checks: Vec::new(),
        }
    }

    /// Computes the ratios and checks from what was measured.
    pub(super) fn finish(&mut self) {
        let rate = |runs: &[serde_json::Value]| {
            let noop = runs.iter().find(|r| r["mode"] == "noop")?;
            number(noop, "jobs_per_s").ok()
        };
        self.machine.graphile_worker_jobs_per_s = rate(&self.peer);
        self.machine.river_jobs_per_s = rate(&self.river);
        let mut checks = Vec::new();
        if let Some(burn) = &self.burn_down {
            checks.extend(self.burn_down_checks(burn));
        }
        if let Some(steady) = &self.steady {
            checks.extend(steady_checks(steady));
        }
        if let Some(saturation) = &self.saturation {
            checks.extend(saturation_checks(saturation));
        }
        if let Some(refusals) = &self.refusals {
            checks.push(refusal_check(refusals));
        }
        if let Some(provider) = &self.provider {
            checks.extend(provider_checks(provider));
        }
        checks.extend(fairness_checks(&self.fairness));
        self.checks = checks;
    }

    /// The burn-down against the ceilings, the peers and itself with more
    /// processes, and the workers' memory.
    fn burn_down_checks(&self, burn: &BurnDown) -> Vec<Check> {
        let rate = burn.jobs_per_s;
        let mut checks = self.postgres_ratios(rate);
        checks.extend(self.peer_ratios(rate));
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
        checks.push(at_most(
            "CPU per job, every process (burn-down)".into(),
            burn.cost.total_cpu_ms,
            "ms",
            CPU_MS_PER_JOB,
        ));
        checks.push(worker_rss_check(burn));
        checks
    }

    /// The burn-down's `rate` over each Postgres ceiling.
    fn postgres_ratios(&self, rate: f64) -> Vec<Check> {
        let mut checks = Vec::new();
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
        checks
    }

    /// The burn-down's `rate` over graphile-worker's and River's: on the same
    /// work (documents through two stages per second, against the faster of
    /// a peer's chains), with a target; and against a single-stage no-op
    /// job, for reference only (it compares two stages with one).
    fn peer_ratios(&self, rate: f64) -> Vec<Check> {
        let mut checks = Vec::new();
        let peers = [
            (
                "graphile-worker",
                &self.peer,
                SAME_WORK_OVER_GRAPHILE_WORKER,
            ),
            ("River", &self.river, SAME_WORK_OVER_RIVER),
        ];
        for (name, runs, target) in peers {
            let chained = runs
                .iter()
                .filter(|r| r["stages"] == 2)
                .filter_map(|r| Some((number(r, "documents_per_s").ok()?, r["mode"].as_str()?)))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((documents_per_s, mode)) = chained {
                let what = format!("burn-down / {name}, same work (two stages; its {mode})");
                checks.push(ratio(&what, rate / documents_per_s, Some(target)));
            }
        }
        for (name, runs, _) in peers {
            let noop = runs.iter().find(|r| r["mode"] == "noop");
            if let Some(jobs_per_s) = noop.and_then(|r| number(r, "jobs_per_s").ok()) {
                let what =
                    format!("burn-down / {name}, single-stage no-op job (not the same work)");
                checks.push(ratio(&what, rate / jobs_per_s, None));
            }
        }
        checks
    }
}

/// Documents through two stages per second, docstream's over graphile-worker's
/// on the same work: at least this.
const SAME_WORK_OVER_GRAPHILE_WORKER: f64 = 4.0;
/// The same over the faster of River's two chains.
const SAME_WORK_OVER_RIVER: f64 = 2.0;
/// CPU per job of every process in the burn-down (docstream's, Postgres, the
/// broker), ms: at most this.
const CPU_MS_PER_JOB: f64 = 0.45;

/// A ratio, with its target when it has one (at least `at_least`).
fn ratio(name: &str, value: f64, at_least: Option<f64>) -> Check {
    Check {
        name: name.to_owned(),
        value,
        unit: "x",
        target: at_least.map(|t| format!(">= {t}")),
        met: at_least.map(|t| value >= t),
    }
}

/// A value that must stay at most `bound`.
fn at_most(name: String, value: f64, unit: &'static str, bound: f64) -> Check {
    Check {
        name,
        value,
        unit,
        target: Some(format!("<= {bound}")),
        met: Some(value <= bound),
    }
}

/// The largest worker's peak RSS during the burn-down, against its bound.
fn worker_rss_check(burn: &BurnDown) -> Check {
    let worker_rss = burn
        .processes
        .iter()
        .filter(|p| p.name.starts_with("worker"))
        .map(|p| p.peak_rss_mib)
        .fold(0.0, f64::max);
    let name = "worker peak RSS at full throughput (burn-down)".into();
    at_most(name, worker_rss, "MiB", 64.0)
}

/// The steady state's p99s against their bounds.
fn steady_checks(steady: &Steady) -> [Check; 2] {
    let p99 = |what: &str, p99: f64, bound: f64| {
        at_most(
            format!("steady p99 {what} at {}/s", steady.rate),
            p99,
            "ms",
            bound,
        )
    };
    let to_bbox = steady.submit_to_bbox_succeeded.p99_ms;
    [
        p99("submit answered", steady.submit_answer.p99_ms, 20.0),
        p99("submit->bbox succeeded", to_bbox, 50.0),
    ]
}

/// Past capacity (2× and 3×): the accepted rate stays near the peak and the
/// accepted submits fast; after the drop, p99 is fast again within 5 s.
fn saturation_checks(curve: &Saturation) -> Vec<Check> {
    let peak = curve
        .steps
        .iter()
        .map(|s| s.accepted_per_s)
        .fold(0.0, f64::max);
    let mut checks = Vec::new();
    for step in curve.steps.iter().filter(|s| s.load >= 2.0) {
        checks.push(ratio(
            &format!("saturation {}x: accepted/s / peak accepted/s", step.load),
            step.accepted_per_s / peak.max(f64::EPSILON),
            Some(0.9),
        ));
        checks.push(at_most(
            format!("saturation {}x: p99 accepted submit answered", step.load),
            step.submit_answer.p99_ms,
            "ms",
            RECOVERED_P99_MS,
        ));
    }
    let recovered = curve.recovery.recovered_after_s.unwrap_or(f64::INFINITY);
    checks.push(at_most(
        format!(
            "saturation: s after 3x -> {}x until p99 <= {RECOVERED_P99_MS} ms",
            curve.recovery.load
        ),
        recovered,
        "s",
        5.0,
    ));
    checks
}

/// A refusal's CPU on the server side (`serve`, Postgres, the broker) as a
/// share of an accepted submit's.
fn refusal_check(r: &Refusals) -> Check {
    let share = r.refused.server_cpu_us() / r.accepted.server_cpu_us().max(f64::EPSILON);
    let name = "refusal CPU / accepted submit CPU (serve, Postgres, broker)".into();
    at_most(name, share, "x", REFUSAL_SHARE)
}

/// How much of the extractor's capacity was used, and the latency it added.
fn provider_checks(p: &ProviderSteady) -> [Check; 2] {
    let utilisation = Check {
        name: "extractor utilisation (succeeded/s / cap x workers / latency)".into(),
        value: p.utilisation,
        unit: "x",
        target: Some(">= 0.9".into()),
        met: Some(p.utilisation >= 0.9),
    };
    let p99 = p.steady.submit_to_succeeded.p99_ms;
    let bound = p.latency_ms as f64 + 50.0;
    let name = format!("extractor p99 submit->succeeded at {}/s", p.steady.rate);
    [utilisation, at_most(name, p99, "ms", bound)]
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
            "\ndocstream bench, {} CPUs ({}), {}{smoke}",
            self.cpus, self.machine.cpu_model, self.started_at
        )?;
        self.ceilings(f)?;
        if let Some(b) = &self.burn_down {
            burn_down(f, b)?;
        }
        if let (Some(one), false) = (&self.burn_down, self.scaling.is_empty()) {
            self.scaling(f, one)?;
        }
        if let Some(s) = &self.steady {
            steady(f, s)?;
        }
        if let Some(s) = &self.saturation {
            saturation(f, s)?;
        }
        if let Some(r) = &self.refusals {
            refusal_costs(f, r)?;
        }
        if let Some(p) = &self.provider {
            provider(f, p)?;
        }
        for run in &self.fairness {
            fairness(f, run)?;
        }
        if let Some(h) = &self.history {
            history(f, h)?;
        }
        if let Some(files) = &self.files {
            files_section(f, files)?;
        }
        writeln!(f, "\nratios and targets")?;
        for c in &self.checks {
            check(f, c)?;
        }
        Ok(())
    }
}

impl Report {
    /// The `ceilings` section: Postgres, Kafka and the peers.
    fn ceilings(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        for p in &self.peer {
            let name = format!("graphile-worker {}", p["version"].as_str().unwrap_or("?"));
            peer_line(f, &name, p, &format!("concurrency {}", p["concurrency"]))?;
        }
        for r in &self.river {
            let name = format!("River {}", r["version"].as_str().unwrap_or("?"));
            let how = format!(
                "MaxWorkers {}, {} connections, FetchCooldown {} ms, FetchPollInterval {} ms",
                r["max_workers"],
                r["max_conns"],
                r["fetch_cooldown_ms"],
                r["fetch_poll_interval_ms"]
            );
            peer_line(f, &name, r, &how)?;
        }
        Ok(())
    }

    /// The scaling section: the first burn-down (`one`) and those with more
    /// processes, each against the first.
    fn scaling(&self, f: &mut fmt::Formatter<'_>, one: &BurnDown) -> fmt::Result {
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
        Ok(())
    }
}

/// One peer run: its documents through every stage per second, and its jobs.
fn peer_line(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    run: &serde_json::Value,
    how: &str,
) -> fmt::Result {
    let mode = run["mode"].as_str().unwrap_or("?");
    writeln!(
        f,
        "  {:<38} {:>10.0} documents/s  ({} stage(s), {:.0} jobs/s; {} documents; {how})",
        format!("{name}, {mode}"),
        number(run, "documents_per_s").unwrap_or(f64::NAN),
        run["stages"],
        number(run, "jobs_per_s").unwrap_or(f64::NAN),
        run["documents"],
    )
}

/// The burn-down section: its rates, then its processes, statements and cost.
fn burn_down(f: &mut fmt::Formatter<'_>, b: &BurnDown) -> fmt::Result {
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
    statements(f, &b.statements)?;
    job_cost(f, &b.cost)
}

/// The table of where the server's time went, when there is one.
fn statements(f: &mut fmt::Formatter<'_>, statements: &[StatementCost]) -> fmt::Result {
    if !statements.is_empty() {
        writeln!(f, "  where the server's time goes (pg_stat_statements):")?;
        writeln!(
            f,
            "  {:>9} {:>8} {:>9}  statement",
            "total ms", "calls", "rows"
        )?;
    }
    for st in statements {
        writeln!(
            f,
            "  {:>9.0} {:>8} {:>9}  {}",
            st.total_ms, st.calls, st.rows, st.query
        )?;
    }
    Ok(())
}

/// The table of what one job cost.
fn job_cost(f: &mut fmt::Formatter<'_>, c: &JobCost) -> fmt::Result {
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
    )
}

/// The steady-state section: latencies, the hops they are made of, and CPU.
fn steady(f: &mut fmt::Formatter<'_>, s: &Steady) -> fmt::Result {
    writeln!(
        f,
        "\ndocstream steady state ({} submissions at {}/s over {} s; sent at {:.0}/s)",
        s.sent, s.rate, s.duration_s, s.achieved_rate
    )?;
    refusals(f, s.sent, s.accepted, &s.refused)?;
    latencies(f, s)?;
    writeln!(f, "  where the time goes:")?;
    hops(f, &s.hops)?;
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
    Ok(())
}

/// The saturation section: one row per offered load, then the recovery.
fn saturation(f: &mut fmt::Formatter<'_>, c: &Saturation) -> fmt::Result {
    writeln!(
        f,
        "\nsaturation curve (capacity {:.0} jobs/s: {}; burn-down {:.0} jobs/s; {} s per load)",
        c.capacity_per_s,
        c.capacity_from,
        c.burn_down_per_s.unwrap_or(f64::NAN),
        c.steps.first().map_or(0.0, |s| s.seconds)
    )?;
    writeln!(
        f,
        "  {:>5} {:>9} {:>11} {:>6}  {:>21}  {:>21}  {:>10}",
        "load",
        "offered/s",
        "accepted/s",
        "shed",
        "submit p50/p99 ms",
        "to bbox p50/p99 ms",
        "CPU ms/job"
    )?;
    for s in &c.steps {
        writeln!(
            f,
            "  {:>4.1}x {:>9.0} {:>11.0} {:>5.1}%  {:>10.1}/{:<10.1}  {:>10.1}/{:<10.1}  {:>10.3}",
            s.load,
            s.offered_per_s,
            s.accepted_per_s,
            s.shed_share * 100.0,
            s.submit_answer.p50_ms,
            s.submit_answer.p99_ms,
            s.submit_to_bbox_succeeded.p50_ms,
            s.submit_to_bbox_succeeded.p99_ms,
            s.cpu_ms_per_accepted_job
        )?;
        for (why, count) in &s.refused {
            writeln!(f, "        refused: {why:<29} {count:>10}")?;
        }
    }
    let r = &c.recovery;
    let by_second: Vec<String> = r
        .p99_by_second_ms
        .iter()
        .map(|p| format!("{p:.0}"))
        .collect();
    writeln!(
        f,
        "  recovery: {:.0} s at 3x, then {}x; p99 of each second after, ms: {}",
        r.overload_s,
        r.load,
        by_second.join(" ")
    )?;
    match r.recovered_after_s {
        Some(s) => writeln!(
            f,
            "  p99 <= {RECOVERED_P99_MS} ms from {s:.0} s after the drop"
        ),
        None => writeln!(f, "  p99 never came back under {RECOVERED_P99_MS} ms"),
    }
}

/// The refusals section: CPU per answer, accepted and refused.
fn refusal_costs(f: &mut fmt::Formatter<'_>, r: &Refusals) -> fmt::Result {
    writeln!(
        f,
        "\nrefusals (limit pinned at {}, {} submitters in a closed loop; CPU per answer)",
        r.limit, r.clients
    )?;
    writeln!(
        f,
        "  {:<10} {:>8} {:>9} {:>12} {:>18} {:>12}",
        "answer", "answers", "per s", "serve µs", "Postgres+broker µs", "client µs"
    )?;
    for (name, c) in [("202", &r.accepted), ("503", &r.refused)] {
        writeln!(
            f,
            "  {name:<10} {:>8} {:>9.0} {:>12.1} {:>18.1} {:>12.1}",
            c.answers, c.per_s, c.serve_cpu_us, c.services_cpu_us, c.client_cpu_us
        )?;
    }
    Ok(())
}

/// How many of `sent` were accepted, and why the others were not.
pub(super) fn refusals(
    f: &mut fmt::Formatter<'_>,
    sent: usize,
    accepted: usize,
    refused: &std::collections::BTreeMap<String, usize>,
) -> fmt::Result {
    writeln!(
        f,
        "  accepted                               {accepted:>10} of {sent}"
    )?;
    for (why, count) in refused {
        writeln!(f, "  refused: {why:<29} {count:>10}")?;
    }
    Ok(())
}

/// The section of the steady state through extractor-serve.
fn provider(f: &mut fmt::Formatter<'_>, p: &ProviderSteady) -> fmt::Result {
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
    latencies(f, s)?;
    hops(f, &s.hops)
}

/// A steady state's three latencies from submit.
fn latencies(f: &mut fmt::Formatter<'_>, s: &Steady) -> fmt::Result {
    latency(f, "submit answered (202)", &s.submit_answer)?;
    latency(f, "submit -> succeeded", &s.submit_to_succeeded)?;
    latency(f, "submit -> bbox succeeded", &s.submit_to_bbox_succeeded)
}

/// Each hop's latency, named by the transitions it runs between.
fn hops(f: &mut fmt::Formatter<'_>, hops: &[Hop]) -> fmt::Result {
    for hop in hops {
        let name = format!("  {} -> {}", short(&hop.from), short(&hop.to));
        latency(f, &name, &hop.latency)?;
    }
    Ok(())
}

/// The fairness runs' ratios to B alone: shared without a cap (target 2×),
/// with A capped, and the high jobs under a low flood (target 2×).
fn fairness_checks(runs: &[Fairness]) -> Vec<Check> {
    let p99 = |kind: Run| {
        (runs.iter())
            .find(|r| r.run == kind)
            .map(|r| r.b_submit_to_bbox.p99_ms)
    };
    let Some(alone) = p99(Run::Alone) else {
        return Vec::new();
    };
    let alone = alone.max(f64::EPSILON);
    let mut checks = Vec::new();
    if let Some(shared) = p99(Run::Shared) {
        let name = "fairness: B's p99 beside A's flood, no cap / alone";
        checks.push(at_most(name.into(), shared / alone, "x", 2.0));
    }
    if let Some(capped) = (runs.iter()).find(|r| matches!(r.run, Run::Capped(_))) {
        let name = "fairness: B's p99 beside A's flood, A capped / alone";
        checks.push(ratio(name, capped.b_submit_to_bbox.p99_ms / alone, None));
    }
    if let Some(high) = p99(Run::Priority) {
        let name = "priorities: high p99 under a low flood / idle";
        checks.push(at_most(name.into(), high / alone, "x", 2.0));
    }
    if let Some(admission) = (runs.iter()).find(|r| r.run == Run::Admission) {
        let refused: usize = admission.b_refused.values().sum();
        let name = "admission: B's submits refused, A past the limit";
        checks.push(at_most(name.into(), refused as f64, "", 0.0));
        let name = "admission: B's p99 submit -> started, A past the limit / alone";
        let alone_start = (runs.iter())
            .find(|r| r.run == Run::Alone)
            .map_or(f64::EPSILON, |r| {
                r.b_submit_to_start.p99_ms.max(f64::EPSILON)
            });
        let start = admission.b_submit_to_start.p99_ms / alone_start;
        checks.push(ratio(name, start, None));
    }
    if let Some(starved) = (runs.iter()).find(|r| r.run == Run::Starved) {
        // Passed over for the bound, then started: its wait for a slot, and
        // the pipeline's second, come on top.
        let name = "starvation: low's longest submit -> start, high flood";
        let bound = super::fairness::STARVED_BOUND_S as f64 + 3.0;
        let longest = starved.b_submit_to_start.max_ms / 1000.0;
        checks.push(at_most(name.into(), longest, "s", bound));
    }
    checks
}

/// One fairness run's section.
fn fairness(f: &mut fmt::Formatter<'_>, run: &Fairness) -> fmt::Result {
    let what = run.run.describe();
    writeln!(
        f,
        "\nfairness: A floods {} jobs, B sends {} at 10/s ({what})",
        run.a_jobs, run.b_jobs
    )?;
    if run.a_jobs > 0 {
        writeln!(
            f,
            "  A done after                           {:>10.1} s  ({} submits answered 429 or 503, {} of them 503 overloaded; each retried)",
            run.a_done_s, run.a_refusals, run.a_overloaded
        )?;
    }
    for (why, count) in &run.b_refused {
        writeln!(f, "  B refused: {why:<29} {count:>10}")?;
    }
    latency(f, "B: submit -> started", &run.b_submit_to_start)?;
    latency(f, "B: submit -> bbox succeeded", &run.b_submit_to_bbox)?;
    hops(f, &run.b_hops)
}

/// One line of the ratios and targets.
fn check(f: &mut fmt::Formatter<'_>, c: &Check) -> fmt::Result {
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
    )
}

/// The files section: upload rates, then jobs on files one at a time.
fn files_section(f: &mut fmt::Formatter<'_>, files: &super::files::Files) -> fmt::Result {
    writeln!(
        f,
        "\nuploads (POST /v1/files, new bytes each, folder store)"
    )?;
    for u in &files.uploads {
        writeln!(
            f,
            "  {:>3} files of {:>5.1} MB, {} at once   {:>7.1} MB/s  ({:.2} s)",
            u.files,
            u.bytes as f64 / 1e6,
            u.concurrency,
            u.mb_per_s,
            u.seconds
        )?;
    }
    writeln!(f, "\nwhat a file adds to a job, submit (with its upload) to bbox succeeded, one job at a time")?;
    for l in &files.latency {
        writeln!(
            f,
            "  {:<36} {:>3} jobs   p50 {:>8.1} ms   p90 {:>8.1} ms   added {:>+8.1} ms",
            l.document, l.jobs, l.p50_ms, l.p90_ms, l.added_ms
        )?;
    }
    Ok(())
}

/// The history section: list pages by size, then the retention rounds.
fn history(f: &mut fmt::Formatter<'_>, h: &super::history::History) -> fmt::Result {
    for size in &h.lists {
        writeln!(
            f,
            "\nlist pages of 50 on {} jobs of one tenant ({:.0} MB of job tables; generated in {:.0} s)",
            size.jobs, size.tables_mb, size.generate_s
        )?;
        for page in &size.pages {
            writeln!(
                f,
                "  {:<36} p50 {:>7.2} ms   p95 {:>7.2} ms",
                page.page, page.p50_ms, page.p95_ms
            )?;
        }
    }
    if !h.churn.is_empty() {
        writeln!(f, "\njobs through a one-day retention (each round: written, purged 500 per statement, vacuumed)")?;
        for r in &h.churn {
            writeln!(
                f,
                "  round {}: {:>8} purged at {:>7.0} jobs/s; dead rows {:>8} after the purge, {:>6} after vacuum; job tables {:>7.1} MB",
                r.round, r.purged, r.purged_per_s, r.dead_after_purge, r.dead_after_vacuum, r.tables_mb
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cost::JobCost;
    use crate::bench::fairness::Fairness;
    use crate::bench::pipeline::{Hop, StatementCost};
    use crate::bench::procs::ProcCost;

    fn latency(base: f64) -> Latency {
        Latency {
            count: 100,
            p50_ms: base,
            p99_ms: base * 2.0,
            p999_ms: base * 3.0,
            max_ms: base * 4.0,
        }
    }

    fn proc(name: &str, cpu_s: f64) -> ProcCost {
        ProcCost {
            name: name.into(),
            cpu_s,
            peak_rss_mib: 40.5,
        }
    }

    fn burn(processes: usize, jobs_per_s: f64) -> BurnDown {
        BurnDown {
            jobs: 300,
            workers: processes,
            bbox_workers: processes,
            submit_s: 0.5,
            seconds: 1.25,
            wall_s: 3.5,
            jobs_per_s,
            consumer_records_per_s: 2.0 * jobs_per_s,
            processes: vec![proc("worker-1", 1.5), proc("bbox-worker-1", 0.75)],
            statements: vec![StatementCost {
                query: "UPDATE extractions SET status = $1".into(),
                calls: 12,
                rows: 300,
                total_ms: 45.0,
            }],
            cost: JobCost {
                cpu_ms: vec![("postgres".into(), 1.25), ("kafka".into(), 0.5)],
                total_cpu_ms: 1.75,
                wal_bytes: 2048.0,
                statements: Some(0.25),
                statement_rows: Some(3.0),
                kafka_records: 4.0,
                kafka_bytes: 900.0,
            },
        }
    }

    fn steady(rate: f64) -> Steady {
        Steady {
            rate,
            duration_s: 2.0,
            sent: 200,
            accepted: 200,
            achieved_rate: rate - 0.5,
            succeeded_per_s: rate - 1.0,
            submit_answer: latency(1.5),
            submit_to_succeeded: latency(10.0),
            submit_to_bbox_succeeded: latency(20.0),
            hops: vec![Hop {
                from: "submit".into(),
                to: "mark_running".into(),
                latency: latency(2.5),
            }],
            cpu_s_per_1000_jobs: 3.25,
            processes: vec![proc("serve", 0.5)],
            refused: [("503 overloaded".to_owned(), 3)].into(),
        }
    }

    fn fairness(run: Run, b_p50: f64) -> Fairness {
        Fairness {
            run,
            a_jobs: 300,
            a_refusals: 7,
            a_overloaded: 0,
            a_done_s: 12.5,
            b_jobs: 100,
            b_refused: std::collections::BTreeMap::new(),
            b_submit_to_start: latency(b_p50 / 2.0),
            b_submit_to_bbox: latency(b_p50),
            b_hops: Vec::new(),
        }
    }

    /// A report with every phase measured, and fixed numbers.
    fn full_report() -> Report {
        let json = |s: &str| serde_json::from_str(s).unwrap();
        let mut report = Report {
            started_at: "2026-01-01T00:00:00+00:00".into(),
            cpus: 2,
            machine: Machine::this(),
            jobs: 300,
            smoke: true,
            postgres: [1, 100]
                .map(|rows| PgCeiling {
                    rows_per_statement: rows,
                    clients: 16,
                    seconds: 1,
                    scripts_per_s: 10.0 * rows as f64,
                    lifecycles_per_s: 100.0 * rows as f64,
                })
                .into(),
            kafka: Some(json(
                r#"{"producer_records_per_s": 50000.0, "consumer_records_per_s": 80000.0}"#,
            )),
            peer: vec![
                json(
                    r#"{"version": "0.16.6", "mode": "noop", "stages": 1, "documents": 300,
                        "jobs": 300, "jobs_per_s": 400.0, "documents_per_s": 400.0}"#,
                ),
                json(
                    r#"{"version": "0.16.6", "mode": "chain", "stages": 2, "documents": 300,
                        "jobs": 600, "jobs_per_s": 200.0, "documents_per_s": 100.0}"#,
                ),
            ],
            river: ["noop", "chain", "chain-tx"]
                .iter()
                .zip([(1, 900.0), (2, 250.0), (2, 200.0)])
                .map(|(mode, (stages, documents_per_s))| {
                    json(&format!(
                        r#"{{"version": "0.51.2", "mode": "{mode}", "stages": {stages},
                            "documents": 300, "jobs": {}, "jobs_per_s": {},
                            "documents_per_s": {documents_per_s}, "max_workers": 1000,
                            "fetch_cooldown_ms": 1, "fetch_poll_interval_ms": 20}}"#,
                        300 * stages,
                        documents_per_s * f64::from(stages)
                    ))
                })
                .collect(),
            burn_down: Some(burn(1, 500.0)),
            scaling: vec![burn(2, 480.0), burn(3, 430.0)],
            steady: Some(steady(100.0)),
            saturation: None,
            refusals: None,
            provider: Some(ProviderSteady {
                latency_ms: 200,
                cap: 32,
                workers: 1,
                capacity_per_s: 160.0,
                load: 0.92,
                utilisation: 0.91,
                steady: steady(147.0),
            }),
            fairness: vec![
                fairness(Run::Alone, 200.0),
                fairness(Run::Shared, 300.0),
                fairness(Run::Capped(50), 250.0),
                fairness(Run::Priority, 500.0),
                fairness(Run::Starved, 4000.0),
                fairness(Run::Admission, 300.0),
            ],
            history: None,
            files: None,
            checks: Vec::new(),
        };
        report.finish();
        report
    }

    #[test]
    fn the_table_has_every_section_and_check() {
        let report = full_report();
        let text = report.to_string();
        for section in [
            "\nceilings\n",
            "\ndocstream burn-down (300 jobs, 1 worker(s), 1 bbox worker(s))\n",
            "  where the server's time goes (pg_stat_statements):\n",
            "  cost per job, submit to bbox succeeded:\n",
            "\ndocstream burn-down by worker processes (300 jobs each)\n",
            "\ndocstream steady state (200 submissions at 100/s over 2 s; sent at 100/s)\n",
            "\nthrough extractor-serve (200 ms per call,",
            "(B alone)\n",
            "(no cap, weights 1 : 1)\n",
            "(A capped at 50 open jobs)\n",
            "(A's flood low, the 100 jobs A's and high)\n",
            "\nratios and targets\n",
        ] {
            assert!(text.contains(section), "no {section:?} in\n{text}");
        }
        let refused = text.lines().find(|l| l.contains("refused: 503 overloaded"));
        assert!(refused.is_some_and(|l| l.ends_with(" 3")), "{text}");
        // Every check of a full run, in order, each on its own line.
        assert_eq!(report.checks.len(), 21, "{:#?}", report.checks);
        let lines: Vec<&str> = text.lines().collect();
        let table = &lines[lines.len() - report.checks.len()..];
        for (line, check) in table.iter().zip(&report.checks) {
            assert!(line.contains(&check.name), "{line:?} is not {check:?}");
        }
        // The same work against the faster chain of each peer, with a
        // target; the no-op jobs for reference, without one.
        let peers: Vec<(&str, f64, Option<bool>)> = report.checks[2..6]
            .iter()
            .map(|c| (c.name.as_str(), c.value, c.met))
            .collect();
        assert_eq!(
            peers,
            [
                (
                    "burn-down / graphile-worker, same work (two stages; its chain)",
                    5.0,
                    Some(true)
                ),
                (
                    "burn-down / River, same work (two stages; its chain)",
                    2.0,
                    Some(true)
                ),
                (
                    "burn-down / graphile-worker, single-stage no-op job (not the same work)",
                    1.25,
                    None
                ),
                (
                    "burn-down / River, single-stage no-op job (not the same work)",
                    500.0 / 900.0,
                    None
                ),
            ]
        );
        let fairness: Vec<_> = report.checks[report.checks.len() - 6..].to_vec();
        let values: Vec<(f64, Option<bool>)> = fairness.iter().map(|c| (c.value, c.met)).collect();
        assert_eq!(
            values,
            [
                (1.5, Some(true)),
                (1.25, None),
                (2.5, Some(false)),
                (0.0, Some(true)),
                (1.5, None),
                (8.0, Some(true))
            ],
            "B's p99 (latency() makes it twice the p50) over B alone's, B's refusals \
             and its p99 start beside a flood past the admission limit over alone's, and \
             the starved run's longest start (4 times its p50, in s): {fairness:#?}"
        );
    }
}
