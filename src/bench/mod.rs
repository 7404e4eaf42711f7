//! `docstream bench`: docstream side by side with the ceilings of what it is
//! built on and with a peer job queue, all in one run on the same machine and
//! services, so that the ratios (not the drifting absolute numbers) are what
//! the report stands on.
//!
//! Phases, in order: the Postgres ceiling (pgbench on docstream's own
//! statements, one row and many rows per statement), the Kafka ceiling (Kafka's
//! perf tools), the peers (graphile-worker and River burning down no-op jobs,
//! then two-stage chains, each the way its documentation chains jobs),
//! docstream's burn-down, the same with two and three worker processes of each
//! kind, docstream's steady state (by default at half the burn-down's rate),
//! the saturation curve (0.5× to 3× the burn-down's rate over HTTP, and the
//! recovery from 3×), what a refusal costs against an accepted submit, the
//! steady state through an
//! external extractor (`extractor-serve` with a fixed latency), and fairness
//! between two tenants (one floods, one does not; with and without a cap).
//! A refused submit is a row of the report, never the end of the run. Every phase runs on a scratch
//! database and its own topics, dropped at the end. The report is printed as a
//! table and written as JSON under `--out`.

mod cost;
mod external;
mod fairness;
mod files;
mod history;
mod pipeline;
mod postgres;
pub(crate) mod procs;
mod refusals;
mod report;
mod saturation;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use sqlx::{AssertSqlSafe, PgPool};

use crate::demo::sample_requests;
use docstream::config::Settings;
use docstream::extract::rule_extract;
use docstream::kafka::admin::create_topics;
use docstream::kafka::topics::topic_specs;
use docstream::store;
use pipeline::Rig;
pub use report::Report;

/// Options of `docstream bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Jobs in the burn-downs (docstream's and the peer's).
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,
    /// Steady state: submissions per second (default: `--steady-share` of
    /// this run's burn-down, or 300/s when the burn-down is skipped).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Steady state: its rate as a share of this run's burn-down, so that a
    /// slower machine is offered what it can take. A quarter: over HTTP, with
    /// `serve` and the load generator on the same two cores, the pipeline
    /// takes about a third of what the workers burn down (the saturation
    /// phase measures it), and a steady state is meant to be below that.
    #[arg(long, default_value_t = 0.25)]
    pub steady_share: f64,
    /// Saturation: seconds of each offered load.
    #[arg(long, default_value_t = 15.0)]
    pub saturation_s: f64,
    /// Refusals: seconds of each window (accepted, then refused).
    #[arg(long, default_value_t = 5.0)]
    pub refusal_s: f64,
    /// Saturation: the capacity the loads are multiples of, jobs/s (default:
    /// measured at the start of the phase by a closed loop).
    #[arg(long)]
    pub saturation_rate: Option<f64>,
    /// Steady state: seconds of sending.
    #[arg(long, default_value_t = 20.0)]
    pub duration_s: f64,
    /// Extraction worker processes.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Bbox worker processes.
    #[arg(long, default_value_t = 1)]
    pub bbox_workers: usize,
    /// Seconds each pgbench run lasts.
    #[arg(long, default_value_t = 10)]
    pub pg_seconds: u64,
    /// pgbench clients. 16 gave the highest single-row rate of 4, 8, 16 and
    /// 32 on our 2-core machine.
    #[arg(long, default_value_t = 16)]
    pub pg_clients: usize,
    /// Rows per statement of the batched Postgres ceiling.
    #[arg(long, default_value_t = 100)]
    pub pg_batch: usize,
    /// Records for Kafka's perf tools.
    #[arg(long, default_value_t = 1_000_000)]
    pub kafka_records: usize,
    /// Record size for Kafka's perf tools, bytes (about one docstream event).
    #[arg(long, default_value_t = 200)]
    pub record_size: usize,
    /// graphile-worker concurrency.
    #[arg(long, default_value_t = 16)]
    pub peer_concurrency: usize,
    /// River's `MaxWorkers`: its default queue settings cap it well below
    /// what it can do, so the bench lets it run at its speed (with a 1 ms
    /// fetch cooldown and a 20 ms poll interval, set in its program).
    #[arg(long, default_value_t = 1000)]
    pub river_max_workers: usize,
    /// River's pool of Postgres connections. Its chains insert the next job
    /// from each worker: with pgxpool's default (4 here) the chain gave
    /// 1,365-1,388 documents/s, with 16 1,681-1,688, with 32 1,699-1,888,
    /// with 64 1,652; its no-op jobs are as fast with 16 as with 4.
    #[arg(long, default_value_t = 32)]
    pub river_max_conns: usize,
    /// Provider phase: the reference extraction service's latency per call, ms.
    #[arg(long, default_value_t = 200)]
    pub provider_latency_ms: u64,
    /// Provider phase: `max_concurrency` per worker process.
    #[arg(long, default_value_t = 32)]
    pub provider_cap: usize,
    /// Provider phase: offered load as a share of cap × workers ÷ latency.
    /// Arrivals are evenly spaced, but each call holds its slot a few ms past
    /// the provider's latency: at 0.95 calls queued for slots; at 0.92 none
    /// did.
    #[arg(long, default_value_t = 0.92)]
    pub provider_load: f64,
    /// Fairness phase: the jobs tenant A floods.
    #[arg(long, default_value_t = 20_000)]
    pub flood: usize,
    /// Fairness phase: A's cap on open jobs in the capped run.
    #[arg(long, default_value_t = 500)]
    pub flood_cap: i64,
    /// Fairness phase: the runs to make, of alone, shared, capped, priority,
    /// starved and admission (all by default; the ratios need `alone`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "alone,shared,capped,priority,starved,admission"
    )]
    pub fairness_runs: Vec<String>,
    /// History phase: the sizes (jobs) at which list pages are timed, each
    /// a generated history on a scratch database (1,000,000 took 21 s to
    /// generate here, 10,000,000 three minutes and 8.7 GB).
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    pub history_jobs: Vec<u64>,
    /// History phase: rounds of jobs through a one-day retention (written,
    /// purged, vacuumed).
    #[arg(long, default_value_t = 4)]
    pub churn_rounds: usize,
    /// History phase: jobs per round (4 × 250,000: a million pass through).
    #[arg(long, default_value_t = 250_000)]
    pub churn_jobs: u64,
    /// Files phase: jobs of each kind (the JSON sample, PDFs of 1 and of
    /// 20 MB), one at a time.
    #[arg(long, default_value_t = 15)]
    pub file_jobs: usize,
    /// Phases to leave out: postgres, kafka, peer, river, burndown, scaling,
    /// steady, saturation, refusals, provider, fairness, history, files.
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// A seconds-long run of every phase (sizes override the others), to check
    /// that the benchmark works, not to measure.
    #[arg(long)]
    pub smoke: bool,
    /// Where the JSON report and the child logs go.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// Where the helper scripts (kafka.sh, peer.sh) are.
    #[arg(long, default_value = "scripts/bench")]
    pub scripts: PathBuf,
}

impl BenchArgs {
    fn smoke_sized(mut self) -> Self {
        if self.smoke {
            self.jobs = 300;
            self.rate = Some(100.0);
            self.duration_s = 2.0;
            self.saturation_s = 1.0;
            self.refusal_s = 1.0;
            self.pg_seconds = 1;
            self.kafka_records = 5_000;
            self.flood = 300;
            self.flood_cap = 50;
            self.history_jobs = vec![5_000];
            self.churn_rounds = 2;
            self.churn_jobs = 2_000;
            self.file_jobs = 2;
        }
        self
    }

    /// Fails on a `--skip` that names no phase, or that would leave the
    /// scaling phase without the burn-down it is measured against.
    fn ensure_skips_known(&self) -> anyhow::Result<()> {
        for phase in &self.skip {
            anyhow::ensure!(
                PHASES.contains(&phase.as_str()),
                "--skip: unknown phase `{phase}`"
            );
        }
        for run in &self.fairness_runs {
            anyhow::ensure!(
                fairness::Run::KINDS.contains(&run.as_str()),
                "--fairness-runs: unknown run `{run}` (one of {})",
                fairness::Run::KINDS.join(", ")
            );
        }
        anyhow::ensure!(
            self.runs("burndown") || !self.runs("scaling"),
            "--skip: the scaling phase is measured against the burn-down; skip both or neither"
        );
        Ok(())
    }

    fn runs(&self, phase: &str) -> bool {
        !self.skip.iter().any(|s| s == phase)
    }
}

/// The phases, in the order they run.
const PHASES: [&str; 13] = [
    "postgres",
    "kafka",
    "peer",
    "river",
    "burndown",
    "scaling",
    "steady",
    "saturation",
    "refusals",
    "provider",
    "fairness",
    "history",
    "files",
];

/// How graphile-worker runs: its no-op job, then two stages chained the way
/// its documentation says (the first task's `helpers.addJob`), the same work
/// as a docstream job's extraction and bbox refinement.
const GRAPHILE_WORKER_MODES: [&str; 2] = ["noop", "chain"];
/// How River runs: its no-op job, then both chains its documentation gives
/// (`Insert` from the first worker; `InsertTx` with `JobCompleteTx`).
const RIVER_MODES: [&str; 3] = ["noop", "chain", "chain-tx"];

/// The steady rate when neither `--rate` nor a burn-down gives one.
const FALLBACK_RATE: f64 = 300.0;

/// Runs the benchmark; see the module docs.
pub async fn run(settings: Settings, args: BenchArgs) -> anyhow::Result<Report> {
    let args = args.smoke_sized();
    args.ensure_skips_known()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let logs = args.out.join(format!("run-{stamp}"));
    std::fs::create_dir_all(&logs)?;
    let mut report = Report::new(&args);

    ceilings(&settings, &args, stamp, &logs, &mut report).await?;
    burn_downs(&settings, &args, stamp, &logs, &mut report).await?;
    if ["steady", "saturation", "refusals", "provider"]
        .iter()
        .any(|phase| args.runs(phase))
    {
        steady_states(&settings, &args, stamp, &logs, &mut report).await?;
    }
    fairness_runs(&settings, &args, stamp, &logs, &mut report).await?;
    if args.runs("history") {
        let bar = phase_bar("history: list pages, purge through a short retention", 0);
        let churn = (args.churn_rounds, args.churn_jobs);
        let history = history::run(&settings, stamp, &args.history_jobs, churn).await;
        bar.finish();
        report.history = Some(history?);
    }

    if args.runs("files") {
        report.files = Some(files_phase(&settings, &args, stamp, &logs).await?);
    }

    report.finish();
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(logs.join("report.json"), &json)?;
    std::fs::write(args.out.join("latest.json"), &json)?;
    Ok(report)
}

/// The ceilings and the peers: Postgres alone, the broker alone,
/// graphile-worker and River, each on the same machine.
async fn ceilings(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    logs: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    if args.runs("postgres") {
        report.postgres = postgres_ceilings(settings, args, stamp, logs).await?;
    }
    if args.runs("kafka") {
        report.kafka = Some(kafka_ceiling(args, logs).await?);
    }
    if args.runs("peer") {
        for mode in GRAPHILE_WORKER_MODES {
            let answer = graphile_worker(settings, args, mode, logs).await?;
            report.peer.push(answer);
        }
    }
    if args.runs("river") {
        for mode in RIVER_MODES {
            report.river.push(river(settings, args, mode, logs).await?);
        }
    }
    Ok(())
}

/// The burn-downs: one worker and one bbox worker, then more processes on
/// the same cores.
async fn burn_downs(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    logs: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    // Each burn-down starts from a fresh database and fresh topics, so that
    // none inherits the dead rows, the vacuum debt and the bigger indexes of
    // the one before it (the scaling runs compare with the first).
    if args.runs("burndown") {
        let mix = (args.workers, args.bbox_workers);
        let outcome = fresh_burn_down(settings, args, stamp, mix, logs).await;
        report.burn_down = Some(outcome?);
    }
    if args.runs("scaling") {
        // More processes on the same cores: they cannot add throughput
        // here, but they must not lose much of it either.
        for processes in [2, 3] {
            let mix = (processes, processes);
            let outcome = fresh_burn_down(settings, args, stamp, mix, logs).await;
            report.scaling.push(outcome?);
        }
    }
    Ok(())
}

/// The fairness runs `--fairness-runs` names, in their order.
async fn fairness_runs(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    logs: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    if args.runs("fairness") {
        use fairness::Run;
        for run in [
            Run::Alone,
            Run::Shared,
            Run::Capped(args.flood_cap),
            Run::Priority,
            Run::Starved,
            Run::Admission,
        ] {
            if !args.fairness_runs.iter().any(|r| *r == run.kind()) {
                continue;
            }
            let run = fairness_run(settings, args, stamp, run, logs).await?;
            report.fairness.push(run);
        }
    }
    Ok(())
}

/// The files phase, on a database and topics of its own.
async fn files_phase(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    logs: &Path,
) -> anyhow::Result<files::Files> {
    let name = format!("docstream_bench_{stamp}_files");
    let scratch = Scratch::create(settings, &name).await?;
    let rig = scratch
        .rig(settings, &format!("bench{stamp}files."), logs.to_path_buf())
        .await?;
    let bar = phase_bar("files: uploads, and what a file adds to a job", 0);
    let outcome = files::files(&rig, args.file_jobs, &bar).await;
    bar.finish();
    delete_topics(&rig.settings).await;
    rig.pool.close().await;
    scratch.drop_database().await?;
    outcome
}

/// The Postgres ceilings, one row and `--pg-batch` rows per statement, on a
/// scratch database dropped afterwards.
async fn postgres_ceilings(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    logs: &Path,
) -> anyhow::Result<Vec<postgres::PgCeiling>> {
    let scratch = Scratch::create(settings, &format!("docstream_bench_pg_{stamp}")).await?;
    let sample = &sample_requests()[0].request;
    let request = serde_json::to_value(sample)?;
    let result = serde_json::to_value(rule_extract(sample)?)?;
    let mut ceilings = Vec::new();
    for rows in [1, args.pg_batch] {
        let bar = phase_bar(
            &format!("postgres ceiling, {rows} row(s)/statement"),
            args.pg_seconds,
        );
        let ticker = tick_seconds(bar.clone());
        let ceiling = postgres::ceiling(
            &scratch.url,
            rows,
            args.pg_clients,
            args.pg_seconds,
            &request,
            &result,
            logs,
        )
        .await;
        ticker.abort();
        bar.finish();
        ceilings.push(ceiling?);
    }
    scratch.drop_database().await?;
    Ok(ceilings)
}

/// Kafka's perf tools (`kafka.sh`).
async fn kafka_ceiling(args: &BenchArgs, logs: &Path) -> anyhow::Result<serde_json::Value> {
    let records = ["--records".into(), args.kafka_records.to_string()];
    let size = ["--record-size".into(), args.record_size.to_string()];
    let name = "kafka ceiling (perf tools)";
    let script = ("kafka.sh", "kafka");
    external_phase(args, name, script, &[records, size], logs).await
}

/// graphile-worker's burn-down (`peer.sh`) of `--jobs` documents in `mode`.
async fn graphile_worker(
    settings: &Settings,
    args: &BenchArgs,
    mode: &str,
    logs: &Path,
) -> anyhow::Result<serde_json::Value> {
    let jobs = ["--jobs".into(), args.jobs.to_string()];
    let how = ["--mode".into(), mode.to_owned()];
    let concurrency = ["--concurrency".into(), args.peer_concurrency.to_string()];
    let database = ["--database-url".into(), settings.database_url.clone()];
    let name = format!("peer: graphile-worker burn-down, {mode}");
    let options = [jobs, how, concurrency, database];
    let script = ("peer.sh", &*format!("peer-{mode}"));
    external_phase(args, &name, script, &options, logs).await
}

/// River's burn-down (`river.sh`) of `--jobs` documents in `mode`.
async fn river(
    settings: &Settings,
    args: &BenchArgs,
    mode: &str,
    logs: &Path,
) -> anyhow::Result<serde_json::Value> {
    let jobs = ["--jobs".into(), args.jobs.to_string()];
    let how = ["--mode".into(), mode.to_owned()];
    let workers = ["--max-workers".into(), args.river_max_workers.to_string()];
    let conns = ["--max-conns".into(), args.river_max_conns.to_string()];
    let database = ["--database-url".into(), settings.database_url.clone()];
    let name = format!("peer: River burn-down, {mode}");
    let options = [jobs, how, workers, conns, database];
    let script = ("river.sh", &*format!("river-{mode}"));
    external_phase(args, &name, script, &options, logs).await
}

/// The steady state and the steady state through extractor-serve (each
/// unless skipped), on one scratch database and topics, dropped afterwards.
async fn steady_states(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    logs: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    let scratch = Scratch::create(settings, &format!("docstream_bench_{stamp}")).await?;
    let rig = scratch
        .rig(settings, &format!("bench{stamp}."), logs.to_owned())
        .await?;
    let mix = (args.workers, args.bbox_workers);
    let burn_down = report.burn_down.as_ref().map(|b| b.jobs_per_s);
    if args.runs("steady") {
        let rate = args.rate.unwrap_or(match burn_down {
            Some(rate) => (rate * args.steady_share).round().max(1.0),
            None => FALLBACK_RATE,
        });
        let bar = phase_bar("docstream steady state", 0);
        let outcome = pipeline::steady(&rig, rate, args.duration_s, mix, None, &bar).await;
        bar.finish();
        report.steady = Some(outcome?);
    }
    if args.runs("saturation") {
        let bar = phase_bar("saturation curve, 0.5x to 3x", 0);
        let capacity = (args.saturation_rate, burn_down);
        let seconds = args.saturation_s;
        let outcome = saturation::saturation(&rig, capacity, seconds, mix, &bar).await;
        bar.finish();
        report.saturation = Some(outcome?);
    }
    if args.runs("refusals") {
        let bar = spinner("refusals: CPU of a 503 against a 202");
        let outcome = refusals::refusals(&rig, args.refusal_s).await;
        bar.finish();
        report.refusals = Some(outcome?);
    }
    if args.runs("provider") {
        let bar = phase_bar("steady state through extractor-serve", 0);
        let load = pipeline::ProviderLoad {
            latency_ms: args.provider_latency_ms,
            cap: args.provider_cap,
            load: args.provider_load,
            duration_s: args.duration_s,
        };
        let outcome = pipeline::provider_steady(&rig, load, mix, &bar).await;
        bar.finish();
        report.provider = Some(outcome?);
    }
    delete_topics(&rig.settings).await;
    rig.pool.close().await;
    scratch.drop_database().await
}

/// One fairness run, on a scratch database and topics of its own, dropped
/// afterwards.
async fn fairness_run(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    run_kind: fairness::Run,
    logs: &Path,
) -> anyhow::Result<fairness::Fairness> {
    let run = run_kind.name();
    let name = format!("docstream_bench_{stamp}_fair_{run}");
    let scratch = Scratch::create(settings, &name).await?;
    let rig = scratch
        .rig(settings, &format!("bench{stamp}f{run}."), logs.to_owned())
        .await?;
    let title = format!("fairness, {}", run_kind.describe());
    let bar = phase_bar(&title, 0);
    let outcome = fairness::fairness(&rig, args.flood, run_kind, &bar).await;
    bar.finish();
    delete_topics(&rig.settings).await;
    rig.pool.close().await;
    scratch.drop_database().await?;
    outcome
}

/// One burn-down with `(workers, bbox_workers)` processes, on a scratch
/// database and topics of its own, dropped afterwards.
async fn fresh_burn_down(
    settings: &Settings,
    args: &BenchArgs,
    stamp: u64,
    (workers, bbox_workers): (usize, usize),
    logs: &Path,
) -> anyhow::Result<pipeline::BurnDown> {
    let name = format!("docstream_bench_{stamp}_{workers}_{bbox_workers}");
    let scratch = Scratch::create(settings, &name).await?;
    let prefix = format!("bench{stamp}w{workers}b{bbox_workers}.");
    let rig = scratch.rig(settings, &prefix, logs.to_owned()).await?;
    let title = match (workers, bbox_workers) {
        (1, 1) => "docstream burn-down".to_owned(),
        _ => format!("docstream burn-down, {workers} + {bbox_workers} workers"),
    };
    let bar = phase_bar(&title, args.jobs as u64);
    let outcome = pipeline::burn_down(&rig, args.jobs, workers, bbox_workers, &bar).await;
    bar.finish();
    delete_topics(&rig.settings).await;
    rig.pool.close().await;
    scratch.drop_database().await?;
    outcome
}

/// Runs `scripts/<script>` with `options` (flag, value) under a spinner;
/// `script` is the script and the name of its log.
async fn external_phase(
    args: &BenchArgs,
    name: &str,
    script: (&str, &str),
    options: &[[String; 2]],
    logs: &Path,
) -> anyhow::Result<serde_json::Value> {
    let bar = spinner(name);
    let argv: Vec<String> = options.iter().flatten().cloned().collect();
    let answer = external::run(&args.scripts, script, &argv, logs).await;
    bar.finish();
    answer
}

/// A throw-away database on the configured server.
struct Scratch {
    admin: PgPool,
    name: String,
    url: String,
}

impl Scratch {
    async fn create(settings: &Settings, name: &str) -> anyhow::Result<Self> {
        let admin = store::connect(&settings.database_url, 1).await?;
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .execute(&admin)
        .await?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&admin)
            .await
            .context(
                "the benchmark creates scratch databases: DATABASE_URL's role needs CREATEDB",
            )?;
        let mut url = url::Url::parse(&settings.database_url)?;
        url.set_path(name);
        let pool = store::connect(url.as_str(), 1).await?;
        store::migrate(&pool).await?;
        pool.close().await;
        Ok(Self {
            admin,
            name: name.to_owned(),
            url: url.to_string(),
        })
    }

    /// Settings, child environment and pool for running docstream here, on
    /// topics named with `prefix`.
    async fn rig(&self, settings: &Settings, prefix: &str, logs: PathBuf) -> anyhow::Result<Rig> {
        let mut settings = settings.clone();
        settings.database_url = self.url.clone();
        // Under the configured prefix: on a cluster with ACLs, the one granted.
        let prefix = format!("{}{prefix}", settings.topic_prefix);
        settings.topic_prefix = prefix.clone();
        create_topics(&settings).await?;
        let env = vec![
            ("DATABASE_URL".into(), self.url.clone()),
            ("DOCSTREAM_TOPIC_PREFIX".into(), prefix),
            (
                "DOCSTREAM_KAFKA_BROKERS".into(),
                settings.kafka_brokers.clone(),
            ),
            ("DOCSTREAM_METRICS_ADDR".into(), "127.0.0.1:0".into()),
            ("DOCSTREAM_LOG".into(), "warn".into()),
        ];
        let pool = store::connect(&self.url, 4).await?;
        Ok(Rig {
            settings,
            env,
            pool,
            logs,
        })
    }

    async fn drop_database(self) -> anyhow::Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }
}

async fn delete_topics(settings: &Settings) {
    let admin: Result<AdminClient<DefaultClientContext>, _> = settings.kafka().config().create();
    let Ok(admin) = admin else { return };
    let names: Vec<String> = topic_specs(settings).into_iter().map(|t| t.name).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    if let Err(e) = admin.delete_topics(&names, &AdminOptions::new()).await {
        tracing::warn!(error = %e, "bench topics not deleted");
    }
}

fn phase_bar(name: &str, length: u64) -> ProgressBar {
    let bar = ProgressBar::new(length);
    bar.set_style(
        ProgressStyle::with_template("{prefix:<40} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_owned());
    bar
}

fn spinner(name: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{prefix:<40} {spinner} ({elapsed})").expect("valid template"),
    );
    bar.set_prefix(name.to_owned());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Advances a time-boxed phase's bar once a second.
fn tick_seconds(bar: ProgressBar) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            bar.inc(1);
        }
    })
}
