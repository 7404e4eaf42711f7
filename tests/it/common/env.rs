//! The test's isolated world: settings, its own database (migrated) and its
//! own topics (a unique prefix), and the clean-up that removes them again
//! when the test passes.

use std::sync::atomic::{AtomicU64, Ordering};

use docstream::config::Settings;
use docstream::domain::Scope;
use docstream::store;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use sqlx::{AssertSqlSafe, PgPool};

#[cfg(feature = "docker")]
use super::docker;
use super::kafka::wait_topic_ready_on;

/// One test's isolated world.
pub struct TestEnv {
    /// Settings pointing at this test's database and topics.
    pub settings: Settings,
    /// A pool on this test's database.
    pub pool: PgPool,
    /// An API key of the tenant `default` (which jobs inserted straight into
    /// the store belong to), with every scope but admin; empty for an
    /// unmigrated database.
    pub api_key: String,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name no other test of this or an earlier run uses: `name`, the process
/// id, a counter and the time.
pub(super) fn unique(name: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{name}_{}_{n}_{:x}",
        std::process::id(),
        nanos % 0xffff_ffff
    )
}

impl TestEnv {
    /// A fresh database and fresh topics named after `name`.
    pub async fn new(name: &str) -> Self {
        Self::with_settings(name, |_| {}).await
    }

    /// A fresh database only, for tests that never touch Kafka.
    pub async fn postgres_only(name: &str) -> Self {
        Self::build(name, |_| {}, false).await
    }

    /// A fresh database with no migration applied, for tests of the
    /// migrations themselves.
    pub async fn unmigrated(name: &str) -> Self {
        let mut settings = Settings::load_from(None, &|var| std::env::var(var).ok())
            .expect("settings from the environment");
        let id = unique(name);
        settings.database_url = create_database(&settings.database_url, &id).await;
        settings.topic_prefix = format!("{id}.");
        let pool = PgPool::connect(&settings.database_url)
            .await
            .expect("connect");
        let api_key = String::new();
        Self {
            settings,
            pool,
            api_key,
        }
    }

    /// Like [`TestEnv::new`], with a chance to adjust settings first.
    pub async fn with_settings(name: &str, adjust: impl FnOnce(&mut Settings)) -> Self {
        Self::build(name, adjust, true).await
    }

    async fn build(name: &str, adjust: impl FnOnce(&mut Settings), kafka: bool) -> Self {
        let settings = Settings::load_from(None, &|var| std::env::var(var).ok())
            .expect("settings from the environment");
        Self::build_on(settings, name, adjust, kafka).await
    }

    /// Like [`TestEnv::new`], on `settings` the test loaded itself (its own
    /// Postgres and brokers): a database and topics of its own there.
    pub async fn on(settings: Settings, name: &str) -> Self {
        Self::build_on(settings, name, |_| {}, true).await
    }

    async fn build_on(
        mut settings: Settings,
        name: &str,
        adjust: impl FnOnce(&mut Settings),
        kafka: bool,
    ) -> Self {
        #[cfg(feature = "docker")]
        if std::env::var("DOCSTREAM_TEST_SERVICES").as_deref() == Ok("docker") {
            let (database_url, brokers) =
                tokio::task::spawn_blocking(docker::services).await.unwrap();
            settings.database_url = database_url;
            settings.kafka_brokers = brokers;
        }
        let id = unique(name);
        settings.database_url = create_database(&settings.database_url, &id).await;
        settings.topic_prefix = format!("{id}.");
        // Tests submit in bursts far past the default rate; the tests of the
        // rate give their tenant one of its own.
        settings.tenant_submit_rate_per_s = 0.0;
        adjust(&mut settings);
        let pool = docstream::store::connect(&settings.database_url, 60)
            .await
            .expect("connect");
        docstream::store::migrate(&pool).await.expect("migrate");
        let api_key = store::tenants::create_key(&pool, "default", &Scope::DEFAULT)
            .await
            .expect("an API key")
            .api_key;
        if kafka {
            docstream::kafka::admin::create_topics(&settings)
                .await
                .expect("create topics");
            for spec in docstream::kafka::topics::topic_specs(&settings) {
                wait_topic_ready_on(&settings.kafka(), &spec.name).await;
            }
        }
        Self {
            settings,
            pool,
            api_key,
        }
    }

    /// An HTTP client that sends this test's API key with every request.
    pub fn client(&self) -> reqwest::Client {
        self.client_builder().build().expect("a client")
    }

    /// A builder of such a client, for tests that tune it.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {}", self.api_key)
            .parse()
            .expect("a header");
        headers.insert(reqwest::header::AUTHORIZATION, value);
        http_builder().default_headers(headers)
    }

    /// Connected services (pool, producer, metrics) for in-process roles.
    pub async fn services(&self) -> docstream::roles::Process {
        docstream::roles::connect(self.settings.clone())
            .await
            .expect("services")
    }

    /// `serve` on `services` in this process, on a free loopback port: its
    /// base URL, and a guard that stops it when dropped.
    pub async fn serve_here(
        &self,
        services: docstream::roles::Process,
    ) -> (String, tokio_util::sync::DropGuard) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(docstream::roles::serve(services, listener, stop.clone()));
        super::wait_healthy(&base).await;
        (base, stop.drop_guard())
    }

    /// Full name of a topic of this test.
    pub fn topic(&self, name: &str) -> String {
        self.settings.topic(name)
    }
}

/// Deletes the test's topics and database when it passed, so repeated runs do
/// not pile up partitions on the shared broker; a failing (panicking) test
/// leaves its state behind for inspection.
impl Drop for TestEnv {
    fn drop(&mut self) {
        // A failed test keeps its database and topics to look at, and so does
        // every test run with DOCSTREAM_TEST_KEEP set.
        if std::thread::panicking() || std::env::var_os("DOCSTREAM_TEST_KEEP").is_some() {
            return;
        }
        // Drop cannot await, and blocking on the test's own runtime from
        // inside it panics: the clean-up gets a thread and a runtime of its own.
        let settings = self.settings.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a clean-up runtime")
                .block_on(remove(&settings))
        })
        .join()
        .expect("the clean-up thread");
    }
}

/// Deletes the topics and drops the database of `settings`. The test's own
/// pool and services may still hold connections: `WITH (FORCE)` ends them.
async fn remove(settings: &Settings) {
    let admin: AdminClient<DefaultClientContext> =
        settings.kafka().config().create().expect("admin client");
    let names: Vec<String> = docstream::kafka::topics::topic_specs(settings)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // Deleting topics that were never created (postgres-only tests) is harmless.
    let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    let name = reqwest::Url::parse(&settings.database_url).unwrap().path()[1..].to_owned();
    let mut admin_url = reqwest::Url::parse(&settings.database_url).unwrap();
    admin_url.set_path("postgres");
    if let Ok(admin) = PgPool::connect(admin_url.as_str()).await {
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .execute(&admin)
        .await;
        admin.close().await;
    }
}

async fn create_database(admin_url: &str, name: &str) -> String {
    let admin = PgPool::connect(admin_url).await.expect("admin connection");
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin)
        .await
        .expect("create test database");
    admin.close().await;
    let mut url = reqwest::Url::parse(admin_url).expect("DATABASE_URL is a URL");
    url.set_path(name);
    url.to_string()
}

/// Short leases and sweeps for fault tests: recovery in a few seconds.
pub fn fast_recovery(settings: &mut Settings) {
    settings.extraction_run_lease_s = secs(3.0);
    settings.bbox_refinement_lease_s = secs(3.0);
    settings.heartbeat_interval_s = secs(0.5);
    settings.reaper_sweep_interval_s = secs(0.5);
    settings.queued_orphan_threshold_s = secs(3.0);
    settings.post_processing_pending_orphan_threshold_s = secs(3.0);
    settings.kafka_session_timeout_ms = 3_000;
    settings.rebalance_drain_timeout_s = secs(1.5);
}

/// A duration setting of `s` seconds.
pub fn secs(s: f64) -> docstream::config::Seconds {
    docstream::config::Seconds::try_from(s).expect("a number of seconds")
}

/// A builder of HTTP clients for tests. The library's clients run on rustls
/// with the provider it installs, and reqwest is built without one of its
/// own, so every client a test makes starts here.
pub fn http_builder() -> reqwest::ClientBuilder {
    docstream::outbound::install_tls_provider();
    reqwest::Client::builder()
}

/// A plain HTTP client for tests (see [`http_builder`]).
pub fn http_client() -> reqwest::Client {
    http_builder().build().expect("a client")
}
