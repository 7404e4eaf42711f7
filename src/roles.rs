//! Process assembly: connects the services a role needs and runs it until the
//! shutdown token fires. Each role is a function of (services, shutdown), so
//! `all` and `demo` are the same roles run side by side in one process.
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

use crate::api;
use crate::config::Settings;
use crate::health::{Dependency, Health};
use crate::kafka::{Publisher, RecordHandler};
use crate::metrics::Metrics;
use crate::pipeline::{
    bulk, census, release_held, retention, BboxWorker, ExtractionWorker, Holding, Intake, Reaper,
    ReaperKind, Services,
};
use crate::store;

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

/// The pool and the producer for `settings`. Neither needs its dependency up
/// yet: a process started during an outage comes up not ready, and becomes
/// ready when the probes reach both (see [`run`]).
pub async fn connect(settings: Settings) -> Result<Services, RoleError> {
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
        &settings.kafka_brokers,
        publish_timeout,
        (settings.publisher_queue_size, settings.publisher_linger_ms),
        settings.kafka_statistics_interval_ms(),
        metrics.clone(),
        health.clone(),
    )?;
    Ok(Services::new(settings, pool, publisher, metrics, health)?)
}

/// Probes Postgres and the broker every `health_probe_interval_s` until
/// `shutdown`, and marks the process draining once it fires.
fn watch_dependencies(services: &Services, shutdown: CancellationToken) {
    let health = &services.health;
    let interval = services.settings.health_probe_interval_s.get();
    let timing = (interval, services.settings.http_answer_timeout_s.get());
    let (pool, acquire) = (
        services.pool.clone(),
        services.metrics.store.pool_acquire.clone(),
    );
    let url = services.settings.database_url.clone();
    let probe_connection: ProbeConnection = Arc::default();
    health.spawn_probe(Dependency::Postgres, timing, shutdown.clone(), move || {
        let (pool, acquire) = (pool.clone(), acquire.clone());
        sample_pool_wait(pool, acquire);
        let (connection, url) = (probe_connection.clone(), url.clone());
        async move { probe_postgres(&connection, &url).await }
    });
    let publisher = services.publisher.clone();
    let topic = services.settings.topic(&services.settings.topic_submitted);
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
    services: Services,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> RoleResult {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "serve: listening");
    let gate = api::Gate::new(services.metrics.clone());
    let close_listener = CancellationToken::new();
    let router = api::app(services.clone(), gate.clone());
    let limits = api::ConnectionLimits::of(&services.settings);
    let mut server = tokio::spawn(api::serve(listener, router, limits, close_listener.clone()));
    let bulk = tokio::spawn(bulk::resume_abandoned(services.clone(), shutdown.clone()));
    tokio::select! {
        _ = shutdown.cancelled() => {}
        ended = &mut server => {
            ended??;
            return Err(RoleError::ServerStopped);
        }
    }
    let started = std::time::Instant::now();
    let settings = &services.settings;
    let budget = settings.publisher_drain_timeout_s.get();
    // An export stream may take its whole drain, then its closing handshake.
    let streams = settings.export_drain_timeout_s.get() + std::time::Duration::from_secs(5);
    gate.close();
    let requests_drained = gate.wait_idle(budget.max(streams)).await;
    let queue_drained = services.publisher.drain(budget).await;
    services.stamps.flush().await;
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

/// The extraction worker: one consumer-group member on `extraction.submitted`.
pub async fn worker(services: Services, shutdown: CancellationToken) -> RoleResult {
    let handler = ExtractionWorker::new(services.clone());
    let settings = services.settings.clone();
    let (group, topic) = (&settings.worker_group, &settings.topic_submitted);
    consumer(services, group, topic, handler, shutdown).await
}

/// The intake: one consumer-group member on `extraction.requests`.
/// Beside it, the releaser of the requests it held for tenants at their cap.
pub async fn intake(services: Services, shutdown: CancellationToken) -> RoleResult {
    let holding = Holding::default();
    let handler = Intake::new(services.clone(), holding.clone());
    let releaser = tokio::spawn(release_held(services.clone(), holding, shutdown.clone()));
    let settings = services.settings.clone();
    let (group, topic) = (&settings.intake_group, &settings.topic_requests);
    let consumed = consumer(services, group, topic, handler, shutdown).await;
    releaser.abort();
    consumed
}

/// The bbox worker: one consumer-group member on `extraction.post_processing.requested`.
pub async fn bbox_worker(services: Services, shutdown: CancellationToken) -> RoleResult {
    let handler = BboxWorker::new(services.clone());
    let settings = services.settings.clone();
    let (group, topic) = (&settings.bbox_worker_group, &settings.topic_post_processing);
    consumer(services, group, topic, handler, shutdown).await
}

/// Runs `handler` on `topic` in `group` until `shutdown`, then flushes.
async fn consumer<H: RecordHandler>(
    services: Services,
    group: &str,
    topic: &str,
    handler: H,
    shutdown: CancellationToken,
) -> RoleResult {
    services.consume(group, topic, handler, shutdown).await?;
    flush(&services);
    services.stamps.flush().await;
    Ok(())
}

/// A loop that runs beside the role's consumers until its shutdown (a
/// reaper's sweeps, the weights' refresh), as a role.
async fn companion(run: impl Future<Output = ()>) -> RoleResult {
    run.await;
    Ok(())
}

/// The queue census (`pipeline::census`) until `shutdown`, in every process.
pub async fn census(services: Services, shutdown: CancellationToken) -> RoleResult {
    let taker = census::Taker::new(
        &services.settings,
        services.pool.clone(),
        services.metrics.census.clone(),
        services.health.clone(),
    );
    census::run(taker, shutdown).await;
    Ok(())
}

/// The retention purge (`pipeline::retention`) until `shutdown`, in every process.
pub async fn retention(services: Services, shutdown: CancellationToken) -> RoleResult {
    let purger = retention::Purger::new(
        &services.settings,
        (services.pool.clone(), services.files.clone()),
        services.metrics.jobs.purged.clone(),
        services.health.clone(),
    );
    retention::run(purger, shutdown).await;
    Ok(())
}

/// `/metrics`, `/healthz` and `/readyz` on `metrics_addr`, in every process.
pub async fn metrics_endpoint(services: Services, shutdown: CancellationToken) -> RoleResult {
    let listener = TcpListener::bind(&services.settings.metrics_addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "metrics: listening");
    let (router, limits) = (
        api::metrics_router(&services),
        api::ConnectionLimits::of(&services.settings),
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
    services: Services,
    mix: Mix,
    http: Option<TcpListener>,
    shutdown: CancellationToken,
) -> RoleResult {
    let stop = shutdown.child_token();
    watch_dependencies(&services, stop.clone());
    tokio::spawn(crate::kafka::durability::log_survey(
        services.settings.clone(),
        stop.clone(),
    ));
    let mut roles: Vec<(&'static str, Role)> = Vec::new();
    match (mix.serve, http) {
        (true, Some(listener)) => roles.push((
            "serve",
            Box::pin(serve(services.clone(), listener, stop.clone())),
        )),
        (true, None) => return Err(RoleError::NoListener),
        (false, _) => {}
    }
    roles.push((
        "metrics",
        Box::pin(metrics_endpoint(services.clone(), stop.clone())),
    ));
    roles.push(("census", Box::pin(census(services.clone(), stop.clone()))));
    roles.push((
        "retention",
        Box::pin(retention(services.clone(), stop.clone())),
    ));
    for _ in 0..mix.intakes {
        roles.push(("intake", Box::pin(intake(services.clone(), stop.clone()))));
    }
    for _ in 0..mix.workers {
        roles.push(("worker", Box::pin(worker(services.clone(), stop.clone()))));
    }
    if mix.workers > 0 {
        let reaper = companion(reaper(&services, ReaperKind::Extraction).run(stop.clone()));
        roles.push(("extraction-reaper", Box::pin(reaper)));
    }
    for _ in 0..mix.bbox_workers {
        roles.push((
            "bbox-worker",
            Box::pin(bbox_worker(services.clone(), stop.clone())),
        ));
    }
    if mix.bbox_workers > 0 {
        let reaper = companion(reaper(&services, ReaperKind::Bbox).run(stop.clone()));
        roles.push(("bbox-reaper", Box::pin(reaper)));
    }
    if mix.workers + mix.bbox_workers > 0 {
        let reaper = companion(reaper(&services, ReaperKind::Webhook).run(stop.clone()));
        roles.push(("webhook-reaper", Box::pin(reaper)));
    }
    // The workers share their slots by the tenants' weights, and `serve` its
    // admission limit.
    if mix.serve || mix.workers + mix.bbox_workers > 0 {
        let (pool, weights) = (services.pool.clone(), services.weights.clone());
        let weights = crate::pipeline::weights::keep_current(pool, weights, stop.clone());
        roles.push(("weights", Box::pin(companion(weights))));
    }
    supervise(roles, stop).await
}

/// A reaper of `kind` on this process's parts.
pub fn reaper(services: &Services, kind: ReaperKind) -> Reaper {
    let parts = crate::pipeline::reaper::Parts {
        pool: services.pool.clone(),
        jobs: services.jobs.clone(),
        webhooks: services.webhooks.clone(),
        metrics: services.metrics.reapers.clone(),
        health: services.health.clone(),
    };
    Reaper::new(kind, parts, &services.settings)
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

fn flush(services: &Services) {
    if let Err(e) = services.publisher.flush(std::time::Duration::from_secs(10)) {
        tracing::warn!(error = %e, "producer flush incomplete");
    }
}
