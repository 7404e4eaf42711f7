//! The `docstream` command line: parse, set up tracing, wire signals to a
//! cancellation token, and hand over to the library.

// The binary's own commands: they drive the library, and it does not know them.
mod bench;
mod demo;
mod eval;
mod reference;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use docstream::config::Settings;
use docstream::roles::{self, Mix};
use docstream::{failpoints, kafka, ops, preflight, store, trace};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Kafka-native document-extraction pipeline.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// TOML settings file; environment variables override it.
    #[arg(long, global = true, env = "DOCSTREAM_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// HTTP API: submit, read and cancel extractions.
    Serve,
    /// Extraction worker: consumes extraction.submitted.
    Worker,
    /// Bbox refinement worker: consumes extraction.post_processing.requested.
    BboxWorker,
    /// Intake: consumes extraction.requests (submissions from Kafka producers).
    Intake,
    /// Every role in one process (API, intake, one worker, one bbox worker).
    All,
    /// Apply database migrations.
    Migrate,
    /// Create the Kafka topics with their configured partition counts.
    Topics,
    /// Check the settings (file and environment) without connecting: every
    /// rule, and no DOCSTREAM_ variable that no setting reads. Prints them,
    /// secrets as ***.
    Settings,
    /// List the current orphans by class, with ids and ages.
    Orphans {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Only this tenant's jobs.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Force a re-claim of one extraction now (expires its lease; fenced holders lose).
    Reclaim {
        /// The extraction id.
        id: uuid::Uuid,
        /// Refuse unless the job is this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Manage tenants (JSON output).
    #[command(subcommand)]
    Tenants(ops::tenants::TenantsCommand),
    /// Manage a tenant's API keys (JSON output).
    #[command(subcommand)]
    Keys(ops::tenants::KeysCommand),
    /// A tenant's jobs: list, show, retry and cancel them.
    #[command(subcommand)]
    Jobs(ops::jobs::JobsCommand),
    /// Read and replay the dead letters of extraction.dlq.
    #[command(subcommand)]
    Dlq(ops::dlq::DlqCommand),
    /// Run the pipeline on the shipped sample documents and print a summary.
    Demo(demo::DemoArgs),
    /// How well docstream reads: run a folder of documents with their
    /// ground truth through the pipeline and print the shares read right.
    Eval(eval::EvalArgs),
    /// A reference extraction service (the extractor protocol, with the
    /// built-in rules): for the demo, the benchmark, and trying the protocol.
    ExtractorServe(docstream::provider::ProviderArgs),
    /// Reads a PDF from standard input and writes its words as JSON: how a
    /// worker reads a file's words in a process it can kill.
    #[command(hide = true)]
    ReadPdf(docstream::files::pdf::apart::ReadArgs),
    /// Prints a table of the manual, made from the code (the test that keeps
    /// docs/src/reference/ current runs it).
    #[command(hide = true)]
    Reference {
        /// Which table.
        #[arg(value_enum)]
        table: reference::Table,
    },
    /// Benchmark: the Postgres and Kafka ceilings, graphile-worker, and
    /// docstream's burn-down and steady state, in one run (scripts/bench.sh).
    Bench(bench::BenchArgs),
}

/// One malloc arena for the whole process, instead of glibc's up to eight
/// per core: a thread that frees what another allocated no longer leaves
/// the memory stranded in the other's arena. In the burn-down the worker
/// peaked at 57-60 MiB RSS with one arena against 64-71 MiB with glibc's
/// default, at the same CPU per job (its heap itself peaks near 25 MB,
/// heaptrack). mimalloc cost 15% less worker CPU but peaked at 103-106 MiB
/// (68-72 MiB without its eager commit).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn one_malloc_arena() {
    // SAFETY: mallopt sets a tunable of glibc's allocator and touches no
    // memory of ours; it runs first in `main`, before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn one_malloc_arena() {}

fn main() -> ExitCode {
    one_malloc_arena();
    let cli = Cli::parse();
    // Before settings and tracing: a worker runs it per file, and its
    // standard output is its answer.
    if let Command::Reference { table } = &cli.command {
        let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
        let _inside = runtime.enter();
        print!(
            "{}",
            reference::render(*table, &<Cli as clap::CommandFactory>::command())
        );
        return ExitCode::SUCCESS;
    }
    if let Command::ReadPdf(args) = &cli.command {
        return match docstream::files::pdf::apart::read_stdin(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("docstream read-pdf: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("docstream: {e}");
            return ExitCode::from(2);
        }
    };
    if let Command::Settings = &cli.command {
        return check_settings(&settings);
    }
    // Before the runtime: the span exporter's HTTP client blocks, on its own
    // thread, and is dropped (flushing) after the runtime is.
    let _exporter = match init_tracing(settings.log_json, cli.command.service_name()) {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("docstream: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = failpoints::init_from_env() {
        eprintln!("docstream: DOCSTREAM_FAILPOINTS: {e}");
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match runtime.block_on(run(cli.command, settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("docstream: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `docstream settings`: loading them checked every rule; what is left is
/// a variable set that nothing reads.
fn check_settings(settings: &Settings) -> ExitCode {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    let unknown = docstream::config::check::unknown_variables(names.iter().map(String::as_str));
    for variable in &unknown {
        eprintln!("docstream: {variable}");
    }
    if !unknown.is_empty() {
        return ExitCode::from(2);
    }
    print!("{}", docstream::config::check::listing(settings));
    ExitCode::SUCCESS
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    let shutdown = shutdown_on_signal();
    let mix = match command {
        Command::Serve => Mix {
            serve: true,
            ..Mix::default()
        },
        Command::Worker => Mix {
            workers: 1,
            ..Mix::default()
        },
        Command::BboxWorker => Mix {
            bbox_workers: 1,
            ..Mix::default()
        },
        Command::Intake => Mix {
            intakes: 1,
            ..Mix::default()
        },
        Command::All => Mix {
            serve: true,
            workers: 1,
            bbox_workers: 1,
            intakes: 1,
        },
        once => return run_once(once, settings, shutdown).await,
    };
    let http = match mix.serve {
        true => Some(roles::bind_http(&settings).await?),
        false => None,
    };
    let process = roles::connect(settings).await?;
    Ok(roles::run(process, mix, http, shutdown).await?)
}

/// A command that does its work and exits: not one of the roles.
async fn run_once(
    command: Command,
    settings: Settings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            preflight::check_postgres(&settings.database_url, preflight::PATIENCE).await?;
            let pool = store::connect(&settings.database_url, 2).await?;
            store::migrate(&pool).await?;
            println!("migrations applied");
        }
        Command::Topics => topics(&settings).await?,
        Command::Orphans { json, tenant } => {
            let pool = store::connect(&settings.database_url, 2).await?;
            let report = ops::orphans_report(&pool, &settings, tenant.as_deref(), json).await?;
            print!("{report}");
        }
        Command::Tenants(command) => {
            // Deleting a tenant cancels its jobs, with their events.
            let process = roles::connect(settings).await?;
            print!(
                "{}",
                ops::tenants::tenants(&roles::operator(&process), command).await?
            );
            process
                .publisher
                .flush(std::time::Duration::from_secs(10))?;
        }
        Command::Keys(command) => {
            let pool = store::connect(&settings.database_url, 2).await?;
            print!("{}", ops::tenants::keys(&pool, command).await?);
        }
        Command::Jobs(command) => {
            let process = roles::connect(settings).await?;
            print!(
                "{}",
                ops::jobs::jobs(&roles::operator(&process), command).await?
            );
            process
                .publisher
                .flush(std::time::Duration::from_secs(10))?;
        }
        Command::Dlq(command) => {
            let pool = store::connect(&settings.database_url, 2).await?;
            print!("{}", ops::dlq::dlq(&settings, &pool, command).await?);
        }
        Command::Reclaim { id, tenant } => {
            let process = roles::connect(settings).await?;
            print!(
                "{}",
                ops::reclaim(&roles::operator(&process), id, tenant.as_deref()).await?
            );
            process
                .publisher
                .flush(std::time::Duration::from_secs(10))?;
        }
        Command::Demo(args) => demo::run(settings, args, shutdown).await?,
        Command::Eval(args) => eval::run(settings, args, shutdown).await?,
        Command::ExtractorServe(args) => docstream::provider::run(args, shutdown).await?,
        Command::Bench(args) => {
            print!("{}", bench::run(settings, args).await?);
        }
        // Answered by `main` before anything is set up.
        Command::ReadPdf(_) | Command::Reference { .. } | Command::Settings => {}
        Command::Serve | Command::Worker | Command::BboxWorker | Command::Intake | Command::All => {
            unreachable!("a role is run by `run`, not once")
        }
    }
    Ok(())
}

/// `docstream topics`: creates the topics that are missing and says what it
/// found.
async fn topics(settings: &Settings) -> anyhow::Result<()> {
    preflight::check_kafka(&settings.kafka(), preflight::PATIENCE).await?;
    let (replication, outcomes) = kafka::admin::create_topics(settings).await?;
    for (topic, outcome) in outcomes {
        println!(
            "{:<48} partitions={:<3} {:?}",
            topic.name, topic.partitions, outcome
        );
    }
    println!(
        "new topics: replication factor {}, min.insync.replicas {} (topics that existed are left as they are)",
        replication.factor, replication.min_insync
    );
    Ok(())
}

/// A token cancelled on the first SIGTERM or SIGINT.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        cancel.cancel();
    });
    token
}

/// Logs to stderr (JSON on request) filtered by `DOCSTREAM_LOG`, and spans
/// over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (`trace::init`). A
/// job's log lines carry its span's `job_id` and `trace_id` either way.
fn init_tracing(json: bool, service: &str) -> Result<trace::Exporter, String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DOCSTREAM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rdkafka=warn,sqlx=warn"));
    let (spans, exporter) = trace::init(service)?;
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter).with(spans);
    if json {
        registry.with(logs.json()).init();
    } else {
        registry.with(logs).init();
    }
    Ok(exporter)
}

impl Command {
    /// The service name of this process's spans.
    fn service_name(&self) -> &'static str {
        match self {
            Self::Serve => "docstream-serve",
            Self::Worker => "docstream-worker",
            Self::BboxWorker => "docstream-bbox-worker",
            Self::Intake => "docstream-intake",
            Self::All | Self::Demo(_) | Self::Eval(_) => "docstream",
            _ => "docstream-cli",
        }
    }
}
