//! Process assembly: connects what a process shares (the pool, the
//! producer, the lifecycle, the metrics: a [`Process`]), hands each role the
//! parts it uses, and runs it until the shutdown token fires. Each role is a
//! function of (process, shutdown), so `all` and `demo` are the same roles
//! run side by side in one process.
//!
//! In a role the consumer loop and its companions are cooperating tasks: if one
//! of them fails, every other is stopped and the role returns the error, so the
//! process exits non-zero and the orchestrator restarts it whole.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use sqlx::PgPool;

use crate::admission::{Admission, AdmissionSettings};
use crate::api;
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::domain::schedule::Weights;
use crate::domain::PerStage;
use crate::extract::{CpuPool, Extractors};
use crate::files::Files;
use crate::health::{Dependency, Health};
use crate::kafka::{Consumers, Publisher, RecordHandler};
use crate::metrics::Metrics;
use crate::pipeline::bulk::Bulk;
use crate::pipeline::{
    census, retention, BatchLimits, Batched, BboxParts, BboxWorker, ExtractionWorker, Intake,
    IntakeParts, Jobs, Reaper, ReaperKind, Stamps, SubmitParts, Submitter, WorkerParts,
};
use crate::quota::{FailedAuthentications, SubmitRates};
use crate::store;
use crate::webhook::{WebhookSettings, Webhooks};

/// Why a process could not start, or a role of it stopped.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// Postgres refused or failed a statement a role needed.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// Postgres could not be reached or refused a statement.
    #[error(transparent)]
    Postgres(#[from] sqlx::Error),
    /// The broker, or the client's configuration of it.
    #[error(transparent)]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A listener could not be bound, or a socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Kafka or Postgres refused the credentials or certificates given.
    #[error(transparent)]
    Refused(#[from] crate::preflight::Refused),
    /// An HTTP client (webhooks, extractors, file fetches) could not be built.
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    /// A role's task panicked or was cancelled.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    /// A consumer could not subscribe, or stopped on an error.
    #[error(transparent)]
    Consumer(#[from] crate::kafka::consumer::ConsumerError),
    /// Role `role` failed with `source`; the process stops.
    #[error("{role} failed: {source}")]
    Failed {
        /// The role's name.
        role: &'static str,
        /// Why.
        source: Box<RoleError>,
    },
    /// A role returned although the process was not shutting down.
    #[error("{0} ended unexpectedly")]
    Ended(&'static str),
    /// The HTTP server returned while the process was not shutting down.
    #[error("the HTTP server stopped on its own")]
    ServerStopped,
    /// `serve`'s requests or its publisher's queue were not drained in time.
    #[error("serve: drain timed out after {0} ms")]
    DrainTimedOut(u64),
    /// The mix runs `serve` but was given no listener.
    #[error("serve needs a listener")]
    NoListener,
}

/// A role's outcome: `Ok` once it stopped because the process is shutting
/// down.
pub type RoleResult = Result<(), RoleError>;

type Role = Pin<Box<dyn Future<Output = RoleResult> + Send>>;

/// What one process holds once, whichever roles it runs: the pool, the
/// producer and the consumers, the lifecycle and the submit path, the
/// process-wide limits, the metrics. Nothing below `roles` sees it: each
/// role gets the parts it uses, built here. A clone shares every part.
#[derive(Clone)]
pub struct Process {
    /// Settings of this process.
    pub settings: Arc<Settings>,
    /// Postgres pool.
    pub pool: PgPool,
    /// The process's producer.
    pub publisher: Publisher,
    /// The process's consumers.
    pub consumers: Consumers,
    /// The process's metrics.
    pub metrics: Metrics,
    /// What this process knows of Kafka's and Postgres's outages.
    pub health: Health,
    /// The hot-path transitions, grouped across concurrent records.
    pub batched: Batched,
    /// The job lifecycle: claims, completions and their events.
    pub jobs: Jobs,
    /// The submit path, shared by the API and the intakes.
    pub submitter: Submitter,
    /// Bulk operations.
    pub bulk: Bulk,
    /// This process's webhook dispatcher.
    pub webhooks: Webhooks,
    /// The extractors this process can run, with their per-process limits.
    pub extractors: Extractors,
    /// Where CPU-bound work runs (the rule extractor, reading files, bbox
    /// grounding).
    pub cpu: CpuPool,
    /// The "published" stamps of this process's new jobs.
    pub stamps: Stamps,
    /// API keys to callers (the API and the Kafka intake).
    pub auth: Authenticator,
    /// The limit on this process's submits in flight (the HTTP route's).
    pub admission: Admission,
    /// Tenants' weights, for the share of a consumer's slots each gets when
    /// several have records waiting, and of the admission limit (kept
    /// current by `weights::keep_current`).
    pub weights: Weights,
    /// The files tenants uploaded.
    pub files: Files,
}

impl Process {
    /// The process's parts on `pool` and `publisher`; starts the statement
    /// batchers, the stamps and the webhook dispatcher.
    fn new(
        settings: Settings,
        (pool, publisher): (PgPool, Publisher),
        (metrics, health): (Metrics, Health),
    ) -> Result<Self, reqwest::Error> {
        let weights = Weights::default();
        let admission = Admission::new(AdmissionSettings::of(&settings), weights.clone());
        let stages = PerStage::new(|stage| settings.stage(stage));
        let limits = BatchLimits::of(&settings);
        let batched = Batched::new(limits, &stages, &pool, &health, &metrics, &admission);
        let stamps = Stamps::spawn(pool.clone(), settings.published_stamp_delay());
        let webhook_settings = WebhookSettings::of(&settings);
        let webhooks = Webhooks::start(webhook_settings, pool.clone(), metrics.clone());
        let jobs = Jobs::new(
            &settings,
            pool.clone(),
            publisher.clone(),
            metrics.clone(),
            health.clone(),
            batched.clone(),
            webhooks.clone(),
        );
        let cpu = CpuPool::new(settings.extraction_threads);
        let extractors = Extractors::new(&settings, &metrics, cpu.clone(), (&pool, &weights))?;
        let submitter = Submitter::new(
            &settings,
            SubmitParts {
                pool: pool.clone(),
                jobs: jobs.clone(),
                batched: batched.clone(),
                extractors: extractors.clone(),
                webhooks: webhooks.clone(),
                stamps: stamps.clone(),
                health: health.clone(),
                compiler: CpuPool::new(0),
            },
        );
        let bulk = Bulk {
            pool: pool.clone(),
            jobs: jobs.clone(),
            max_running_per_tenant: i64::try_from(settings.bulk_max_running_per_tenant)
                .unwrap_or(i64::MAX),
        };
        let consumers = Consumers::new(
            &settings,
            weights.clone(),
            publisher.clone(),
            (metrics.clone(), health.clone()),
        );
        let key_cache = settings.api_key_cache_s.get();
        let answer_bound = settings.http_answer_timeout_s.get();
        let auth = Authenticator::new(pool.clone(), key_cache, answer_bound);
        let files = Files::new(&settings, pool.clone());
        Ok(Self {
            settings: Arc::new(settings),
            pool,
            publisher,
            consumers,
            metrics,
            health,
            batched,
            jobs,
            submitter,
            bulk,
            webhooks,
            extractors,
            cpu,
            stamps,
            auth,
            admission,
            weights,
            files,
        })
    }
}

/// The pool and the producer for `settings`, and the process's parts on
/// them. Neither needs its dependency up yet: a process started during an
/// outage comes up not ready, and becomes ready when the probes reach both
/// (see [`run`]).
pub async fn connect(settings: Settings) -> Result<Process, RoleError> {
    crate::preflight::check(&settings).await?;
    let metrics = Metrics::new();
    let health = Health::new(metrics.clone());
    let pool = store::connect_lazy(
        &settings.database_url,
        settings.db_max_connections,
        settings.db_acquire_timeout_s.get(),
    )?;
    metrics.register(Box::new(crate::metrics::PoolCollector::new(pool.clone())));
    let publish_timeout = settings.publish_timeout_s.get();
    let publisher = Publisher::new(
        &settings.kafka(),
        publish_timeout,
        (settings.publisher_queue_size, settings.publisher_linger_ms),
        settings.kafka_statistics_interval_ms(),
        metrics.clone(),
        health.clone(),
    )?;
    Ok(Process::new(
        settings,
        (pool, publisher),
        (metrics, health),
    )?)
}

/// Probes Postgres and the broker every `health_probe_interval_s` until
/// `shutdown`, and marks the process draining once it fires.
fn watch_dependencies(process: &Process, shutdown: CancellationToken) {
    let health = &process.health;
    let interval = process.settings.health_probe_interval_s.get();
    let timing = (interval, process.settings.http_answer_timeout_s.get());
    let (pool, acquire) = (
        process.pool.clone(),
        process.metrics.store.pool_acquire.clone(),
    );
    let url = process.settings.database_url.clone();
    let probe_connection: ProbeConnection = Arc::default();
    health.spawn_probe(Dependency::Postgres, timing, shutdown.clone(), move || {
        let (pool, acquire) = (pool.clone(), acquire.clone());
        sample_pool_wait(pool, acquire);
        let (connection, url) = (probe_connection.clone(), url.clone());
        async move { probe_postgres(&connection, &url).await }
    });
    let publisher = process.publisher.clone();
    let topic = process.settings.topic(&process.settings.topic_submitted);
    health.spawn_probe(Dependency::Kafka, timing, shutdown.clone(), move || {
        let (publisher, topic) = (publisher.clone(), topic.clone());
        async move { publisher.probe(&topic, timing.1).await }
    });
    let health = health.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        health.set_draining();
    });
}

/// The Postgres probe's own connection, made again after any failure.
type ProbeConnection = Arc<tokio::sync::Mutex<Option<sqlx::PgConnection>>>;

/// `SELECT 1` on the probe's own connection, not on one of the pool's: the
/// probe asks whether Postgres answers, and a pool whose connections are all
/// busy (a burst of slow statements) is not an outage. Declaring one would
/// refuse every submit at once while the database is working.
async fn probe_postgres(connection: &ProbeConnection, url: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut held = connection.lock().await;
    // Taken out while in use: a probe cut short by its timeout drops (and
    // so closes) a connection that may be mid-answer.
    let mut conn = match held.take() {
        Some(conn) => conn,
        None => sqlx::PgConnection::connect(url).await?,
    };
    sqlx::query("SELECT 1").execute(&mut conn).await?;
    *held = Some(conn);
    Ok(())
}

/// Samples the pool's wait for a connection (`docstream_store_pool_acquire_seconds`)
/// beside the probe, without making it part of the probe's verdict.
fn sample_pool_wait(pool: sqlx::PgPool, acquire: prometheus::Histogram) {
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        if let Ok(conn) = pool.acquire().await {
            acquire.observe(started.elapsed().as_secs_f64());
            drop(conn);
        }
    });
}

/// The HTTP API on an already bound listener. On shutdown: new requests get
/// 503 with Retry-After, accepted requests and the publisher's queue drain within
/// the publisher drain timeout, the producer is flushed, and only then does the
/// listener close. A drain that times out is reported as an error (forced).
pub async fn serve(
    process: Process,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> RoleResult {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "serve: listening");
    let gate = api::Gate::new(process.metrics.clone());
    let close_listener = CancellationToken::new();
    let settings = &process.settings;
    let router = api::app(settings, api(&process), gate.clone());
    let limits = api::ConnectionLimits::of(settings);
    let mut server = tokio::spawn(api::serve(listener, router, limits, close_listener.clone()));
    let bulk = tokio::spawn(process.bulk.clone().resume_abandoned(shutdown.clone()));
    tokio::select! {
        _ = shutdown.cancelled() => {}
        ended = &mut server => {
            ended??;
            return Err(RoleError::ServerStopped);
        }
    }
    let started = std::time::Instant::now();
    let budget = settings.publisher_drain_timeout_s.get();
    // An export stream may take its whole drain, then its closing handshake.
    let streams = settings.export_drain_timeout_s.get() + std::time::Duration::from_secs(5);
    gate.close();
    let requests_drained = gate.wait_idle(budget.max(streams)).await;
    let queue_drained = process.publisher.drain(budget).await;
    process.stamps.flush().await;
    close_listener.cancel();
    server.await??;
    bulk.abort();
    let drain_ms = started.elapsed().as_millis() as u64;
    if requests_drained && queue_drained {
        tracing::info!(
            drain_ms,
            "serve: graceful shutdown; every accepted request was answered"
        );
        Ok(())
    } else {
        tracing::error!(
            drain_ms,
            requests_drained,
            queue_drained,
            "serve: forced shutdown"
        );
        Err(RoleError::DrainTimedOut(drain_ms))
    }
}

/// The API's handle on `process`'s parts.
fn api(process: &Process) -> api::Api {
    let settings = &process.settings;
    api::Api::new(api::ApiParts {
        settings: api::ApiSettings::of(settings),
        pool: process.pool.clone(),
        submitter: process.submitter.clone(),
        jobs: process.jobs.clone(),
        bulk: process.bulk.clone(),
        files: process.files.clone(),
        extractors: process.extractors.clone(),
        consumers: process.consumers.clone(),
        auth: process.auth.clone(),
        submit_rates: SubmitRates::default(),
        failed_authentications: FailedAuthentications::default(),
        correction_rates: Default::default(),
        admission: process.admission.clone(),
        metrics: process.metrics.clone(),
        health: process.health.clone(),
    })
}

/// The extraction worker: one consumer-group member on `extraction.submitted`.
pub async fn worker(process: Process, shutdown: CancellationToken) -> RoleResult {
    let parts = WorkerParts {
        pool: process.pool.clone(),
        jobs: process.jobs.clone(),
        extractors: process.extractors.clone(),
        files: process.files.clone(),
        cpu: process.cpu.clone(),
        metrics: process.metrics.jobs.clone(),
    };
    let settings = &process.settings;
    let handler = ExtractionWorker::new(settings, parts);
    let (group, topic) = (&settings.worker_group, &settings.topic_submitted);
    consumer(&process, (group, topic), handler, shutdown).await
}

/// The intake: one consumer-group member on `extraction.requests`.
/// Beside it, the releaser of the requests it held for tenants at their cap.
pub async fn intake(process: Process, shutdown: CancellationToken) -> RoleResult {
    let parts = IntakeParts {
        submitter: process.submitter.clone(),
        pool: process.pool.clone(),
        auth: process.auth.clone(),
        publisher: process.publisher.clone(),
        metrics: process.metrics.consumer.clone(),
    };
    let settings = &process.settings;
    let handler = Intake::new(settings, parts);
    let releaser = tokio::spawn(handler.clone().release_held(shutdown.clone()));
    let (group, topic) = (&settings.intake_group, &settings.topic_requests);
    let consumed = consumer(&process, (group, topic), handler, shutdown).await;
    releaser.abort();
    consumed
}

/// The bbox worker: one consumer-group member on `extraction.post_processing.requested`.
pub async fn bbox_worker(process: Process, shutdown: CancellationToken) -> RoleResult {
    let parts = BboxParts {
        pool: process.pool.clone(),
        jobs: process.jobs.clone(),
        batched: process.batched.clone(),
        cpu: process.cpu.clone(),
        metrics: process.metrics.jobs.clone(),
    };
    let settings = &process.settings;
    let handler = BboxWorker::new(parts, settings.bbox_refine_timeout_s.get());
    let (group, topic) = (&settings.bbox_worker_group, &settings.topic_post_processing);
    consumer(&process, (group, topic), handler, shutdown).await
}

/// Runs `handler` on `topic` in `group` until `shutdown`, then flushes.
async fn consumer<H: RecordHandler>(
    process: &Process,
    (group, topic): (&str, &str),
    handler: H,
    shutdown: CancellationToken,
) -> RoleResult {
    process
        .consumers
        .run(group, topic, handler, shutdown)
        .await?;
    flush(&process.publisher);
    process.stamps.flush().await;
    Ok(())
}

/// A loop that runs beside the role's consumers until its shutdown (a
/// reaper's sweeps, the weights' refresh), as a role.
async fn companion(run: impl Future<Output = ()>) -> RoleResult {
    run.await;
    Ok(())
}

/// The queue census (`pipeline::census`) until `shutdown`, in every process.
pub async fn census(process: Process, shutdown: CancellationToken) -> RoleResult {
    let taker = census::Taker::new(
        &process.settings,
        process.pool.clone(),
        process.metrics.census.clone(),
        process.health.clone(),
    );
    census::run(taker, shutdown).await;
    Ok(())
}

/// The retention purge (`pipeline::retention`) until `shutdown`, in every process.
pub async fn retention(process: Process, shutdown: CancellationToken) -> RoleResult {
    let purger = retention::Purger::new(
        &process.settings,
        (process.pool.clone(), process.files.clone()),
        process.metrics.jobs.purged.clone(),
        process.health.clone(),
    );
    retention::run(purger, shutdown).await;
    Ok(())
}

/// `/metrics`, `/healthz` and `/readyz` on `metrics_addr`, in every process.
pub async fn metrics_endpoint(process: Process, shutdown: CancellationToken) -> RoleResult {
    let listener = TcpListener::bind(&process.settings.metrics_addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "metrics: listening");
    let (router, limits) = (
        api::metrics_router(process.metrics.clone(), process.health.clone()),
        api::ConnectionLimits::of(&process.settings),
    );
    api::serve(listener, router, limits, shutdown).await?;
    Ok(())
}

/// How many of each role a process runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mix {
    /// Whether to serve the HTTP API.
    pub serve: bool,
    /// Extraction worker consumers.
    pub workers: usize,
    /// Bbox worker consumers.
    pub bbox_workers: usize,
    /// Intake consumers (Kafka submissions).
    pub intakes: usize,
}

/// Runs `mix` in this process until `shutdown` fires or a role fails; a failing
/// role stops the others. `http` is the API's listener when `mix.serve`.
pub async fn run(
    process: Process,
    mix: Mix,
    http: Option<TcpListener>,
    shutdown: CancellationToken,
) -> RoleResult {
    let stop = shutdown.child_token();
    watch_dependencies(&process, stop.clone());
    tokio::spawn(crate::kafka::durability::log_survey(
        process.settings.clone(),
        stop.clone(),
    ));
    let mut roles: Vec<(&'static str, Role)> = Vec::new();
    match (mix.serve, http) {
        (true, Some(listener)) => roles.push((
            "serve",
            Box::pin(serve(process.clone(), listener, stop.clone())),
        )),
        (true, None) => return Err(RoleError::NoListener),
        (false, _) => {}
    }
    roles.push((
        "metrics",
        Box::pin(metrics_endpoint(process.clone(), stop.clone())),
    ));
    roles.push(("census", Box::pin(census(process.clone(), stop.clone()))));
    roles.push((
        "retention",
        Box::pin(retention(process.clone(), stop.clone())),
    ));
    for _ in 0..mix.intakes {
        roles.push(("intake", Box::pin(intake(process.clone(), stop.clone()))));
    }
    for _ in 0..mix.workers {
        roles.push(("worker", Box::pin(worker(process.clone(), stop.clone()))));
    }
    if mix.workers > 0 {
        let reaper = companion(reaper(&process, ReaperKind::Extraction).run(stop.clone()));
        roles.push(("extraction-reaper", Box::pin(reaper)));
    }
    for _ in 0..mix.bbox_workers {
        roles.push((
            "bbox-worker",
            Box::pin(bbox_worker(process.clone(), stop.clone())),
        ));
    }
    if mix.bbox_workers > 0 {
        let reaper = companion(reaper(&process, ReaperKind::Bbox).run(stop.clone()));
        roles.push(("bbox-reaper", Box::pin(reaper)));
    }
    if mix.workers + mix.bbox_workers > 0 {
        let reaper = companion(reaper(&process, ReaperKind::Webhook).run(stop.clone()));
        roles.push(("webhook-reaper", Box::pin(reaper)));
    }
    // The workers share their slots by the tenants' weights, and `serve` its
    // admission limit.
    if mix.serve || mix.workers + mix.bbox_workers > 0 {
        let (pool, weights) = (process.pool.clone(), process.weights.clone());
        let weights = crate::pipeline::weights::keep_current(pool, weights, stop.clone());
        roles.push(("weights", Box::pin(companion(weights))));
    }
    supervise(roles, stop).await
}

/// A reaper of `kind` on this process's parts.
pub fn reaper(process: &Process, kind: ReaperKind) -> Reaper {
    let parts = crate::pipeline::reaper::Parts {
        pool: process.pool.clone(),
        jobs: process.jobs.clone(),
        webhooks: process.webhooks.clone(),
        metrics: process.metrics.reapers.clone(),
        health: process.health.clone(),
    };
    Reaper::new(kind, parts, &process.settings)
}

/// The parts the operator's commands (`docstream jobs|tenants|reclaim`) use.
pub fn operator(process: &Process) -> crate::ops::Parts {
    crate::ops::Parts {
        pool: process.pool.clone(),
        jobs: process.jobs.clone(),
        files: process.files.clone(),
        bulk: process.bulk.clone(),
    }
}

/// Runs roles side by side; the first failure cancels the rest and is returned.
async fn supervise(roles: Vec<(&'static str, Role)>, stop: CancellationToken) -> RoleResult {
    let mut set = JoinSet::new();
    for (name, role) in roles {
        set.spawn(async move { (name, role.await) });
    }
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        let (name, result) = joined?;
        if let Err(e) = result {
            tracing::error!(role = name, error = %e, "role failed; stopping the process");
            stop.cancel();
            first_error.get_or_insert(RoleError::Failed {
                role: name,
                source: Box::new(e),
            });
        } else if !stop.is_cancelled() {
            tracing::error!(role = name, "role ended on its own; stopping the process");
            stop.cancel();
            first_error.get_or_insert(RoleError::Ended(name));
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Binds the API's listener on `http_addr`, with a backlog as deep as the
/// connection cap (the kernel clamps it to `net.core.somaxconn`). With the
/// usual 128, a burst of connects (clients coming back after a restart)
/// had every 129th SYN dropped and retried a second later here, however
/// fast `serve` accepted.
pub async fn bind_http(settings: &Settings) -> Result<TcpListener, RoleError> {
    let addr = settings.http_addr;
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let backlog = u32::try_from(settings.http_max_connections).unwrap_or(u32::MAX);
    Ok(socket.listen(backlog)?)
}

fn flush(publisher: &Publisher) {
    if let Err(e) = publisher.flush(std::time::Duration::from_secs(10)) {
        tracing::warn!(error = %e, "producer flush incomplete");
    }
}
