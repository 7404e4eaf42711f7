//! Test harness: every test gets its own database (migrated) and its own topics
//! (a unique prefix), on the real Postgres and Kafka that `scripts/services.sh`
//! starts, so tests run in parallel and repeat without cleanup. Also: spawning
//! real `docstream` processes, reading topics back, and waiting on conditions.
#![allow(dead_code)]

#[cfg(feature = "docker")]
mod docker;
pub mod provider;

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use docstream::config::Settings;
use docstream::domain::Scope;
use docstream::pipeline::Services;
use docstream::store::tenants::DEFAULT_TENANT_ID;
use docstream::store::{self, NewExtraction};
use futures::stream::{self, StreamExt};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::process::{Child, Command};
use uuid::Uuid;

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

fn unique(name: &str) -> String {
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
        let mut settings = Settings::load_from(None, &|var| std::env::var(var).ok())
            .expect("settings from the environment");
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
            for spec in docstream::kafka::admin::topic_specs(&settings) {
                wait_topic_ready(&settings.kafka_brokers, &spec.name).await;
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
        reqwest::Client::builder().default_headers(headers)
    }

    /// A WebSocket request for `url` carrying this test's API key.
    pub fn ws_request(&self, url: &str) -> tokio_tungstenite::tungstenite::http::Request<()> {
        ws_request(url, &self.api_key)
    }

    /// Deletes this test's topics and database, so repeated runs do not pile up
    /// partitions on the shared broker. Call it at the end of a passing test; a
    /// failing test leaves its state behind for inspection.
    pub async fn cleanup(self) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.settings.kafka_brokers)
            .create()
            .expect("admin client");
        let names: Vec<String> = docstream::kafka::admin::topic_specs(&self.settings)
            .into_iter()
            .map(|t| t.name)
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        // Deleting topics that were never created (postgres-only tests) is harmless.
        let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
        self.pool.close().await;
        let name = reqwest::Url::parse(&self.settings.database_url)
            .unwrap()
            .path()[1..]
            .to_owned();
        let mut admin_url = reqwest::Url::parse(&self.settings.database_url).unwrap();
        admin_url.set_path("postgres");
        if let Ok(admin) = PgPool::connect(admin_url.as_str()).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(&admin)
                .await;
        }
    }

    /// Connected services (pool, producer, metrics) for in-process roles.
    pub async fn services(&self) -> docstream::pipeline::Services {
        docstream::roles::connect(self.settings.clone())
            .await
            .expect("services")
    }

    /// Full name of a topic of this test.
    pub fn topic(&self, name: &str) -> String {
        self.settings.topic(name)
    }

    /// Environment for a `docstream` child process of this test: every
    /// setting, so children run exactly what the test configured, except that
    /// each child's internal listener takes a free port.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let mut env = self.settings.to_env();
        env.push(("DOCSTREAM_METRICS_ADDR".into(), "127.0.0.1:0".into()));
        env.push(("DOCSTREAM_LOG".into(), "info,rdkafka=warn,sqlx=warn".into()));
        env
    }

    /// Starts `docstream <role>` as a separate OS process; its output goes to
    /// `target/tmp/test-logs/<log_name>.log`.
    pub fn spawn(&self, role: &str, extra_env: &[(&str, String)], log_name: &str) -> Child {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-logs");
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join(format!("{log_name}.log"))).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_docstream"));
        command
            .arg(role)
            .envs(self.child_env())
            .envs(extra_env.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        command.spawn().expect("spawn docstream")
    }

    /// The committed offsets of consumer group `group` (full name) on `topic`.
    pub fn committed(&self, group: &str, topic: &str) -> HashMap<i32, i64> {
        committed_offsets(&self.settings.kafka_brokers, group, &self.topic(topic))
    }

    /// Every record of `topic` written so far: (key, value).
    pub fn read_topic(&self, topic: &str) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
        read_topic(&self.settings.kafka_brokers, &self.topic(topic))
    }
}

async fn create_database(admin_url: &str, name: &str) -> String {
    let admin = PgPool::connect(admin_url).await.expect("admin connection");
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&admin)
        .await
        .expect("create test database");
    admin.close().await;
    let mut url = reqwest::Url::parse(admin_url).expect("DATABASE_URL is a URL");
    url.set_path(name);
    url.to_string()
}

/// Waits until every partition of `topic` has a leader that answers for it.
pub async fn wait_topic_ready(brokers: &str, topic: &str) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("client");
    wait_for(
        &format!("topic {topic} to have leaders"),
        Duration::from_secs(60),
        || {
            let ready = (|| {
                let metadata = consumer
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .map_err(|e| e.to_string())?;
                let partitions = metadata.topics()[0].partitions();
                if partitions.is_empty() {
                    return Err("no partitions yet".to_owned());
                }
                for p in partitions {
                    consumer
                        .fetch_watermarks(topic, p.id(), Duration::from_secs(5))
                        .map_err(|e| format!("partition {}: {e}", p.id()))?;
                }
                Ok(())
            })();
            async move { ready }
        },
    )
    .await
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

/// Sends `signal` (KILL, STOP, CONT, TERM) to a child process.
pub async fn signal(child: &Child, signal: &str) {
    let pid = child.id().expect("child still running");
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The value of one metric series scraped from `http://{addr}/metrics`, or 0.
pub async fn scrape(addr: &str, series: &str) -> f64 {
    let text = match reqwest::get(format!("http://{addr}/metrics")).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |total, value| total + value)
}

/// A count from the database.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `timeout`
/// with `what` and the last state `describe` gives.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(state) if Instant::now() >= deadline => {
                panic!("timed out waiting for {what}: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until `GET {base}/healthz` answers 200.
pub async fn wait_healthy(base: &str) {
    let client = reqwest::Client::new();
    wait_for("the API to be healthy", Duration::from_secs(60), || {
        let request = client.get(format!("{base}/healthz")).send();
        async move {
            match request.await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}

/// A WebSocket request for `url` carrying API key `key`.
pub fn ws_request(url: &str, key: &str) -> tokio_tungstenite::tungstenite::http::Request<()> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().expect("a WebSocket URL");
    let value = format!("Bearer {key}").parse().expect("a header value");
    request.headers_mut().insert("authorization", value);
    request
}

/// The headers that submit a Kafka intake record as `tenant` with `api_key`.
pub fn intake_headers(tenant: &str, api_key: &str) -> rdkafka::message::OwnedHeaders {
    use rdkafka::message::{Header, OwnedHeaders};
    OwnedHeaders::new()
        .insert(Header {
            key: docstream::pipeline::TENANT_HEADER,
            value: Some(tenant),
        })
        .insert(Header {
            key: docstream::pipeline::API_KEY_HEADER,
            value: Some(api_key),
        })
}

/// A record read back: partition, offset, key, value.
pub type Positioned = (i32, i64, Option<Vec<u8>>, Vec<u8>);

/// Reads a topic from the beginning to its current end.
pub fn read_topic(brokers: &str, topic: &str) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    read_topic_positioned(brokers, topic)
        .into_iter()
        .map(|(_, _, key, value)| (key, value))
        .collect()
}

/// Reads a topic from the beginning to its current end, with positions.
pub fn read_topic_positioned(brokers: &str, topic: &str) -> Vec<Positioned> {
    read_topic_as(brokers, topic, |message| {
        (
            message.partition(),
            message.offset(),
            message.key().map(<[u8]>::to_vec),
            message.payload().unwrap_or_default().to_vec(),
        )
    })
}

/// Each record's key and `traceparent` header, from the beginning of `topic`
/// to its current end.
pub fn read_traceparents(brokers: &str, topic: &str) -> Vec<(Option<Vec<u8>>, Option<String>)> {
    use rdkafka::message::Headers;
    read_topic_as(brokers, topic, |message| {
        let traceparent = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == docstream::trace::TRACEPARENT)
                .and_then(|h| String::from_utf8(h.value?.to_vec()).ok())
        });
        (message.key().map(<[u8]>::to_vec), traceparent)
    })
}

/// Reads a topic from the beginning to its current end, each record as `map`
/// makes it.
fn read_topic_as<T>(
    brokers: &str,
    topic: &str,
    map: impl Fn(&rdkafka::message::BorrowedMessage<'_>) -> T,
) -> Vec<T> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        if high > low {
            ends.insert(p, high);
            assignment
                .add_partition_offset(topic, p, Offset::Offset(low))
                .unwrap();
        }
    }
    let mut records = Vec::new();
    if ends.is_empty() {
        return records;
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "reading {topic} timed out; {ends:?} left"
        );
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("consume");
        let end = ends.get(&message.partition()).copied();
        if let Some(end) = end {
            records.push(map(&message));
            if message.offset() + 1 >= end {
                ends.remove(&message.partition());
            }
        }
    }
    records
}

/// The committed offsets of `group` on `topic`, by partition (absent when none).
pub fn committed_offsets(brokers: &str, group: &str, topic: &str) -> HashMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("client");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut partitions = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        partitions.add_partition(topic, p.id());
    }
    let committed = consumer
        .committed_offsets(partitions, Duration::from_secs(10))
        .expect("committed offsets");
    committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Peak resident memory of a process, in KiB (VmHWM), if it is still there.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Sum of the high watermarks of every partition of `topic`: records ever written.
pub fn topic_size(brokers: &str, topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("client");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap()
                .1
        })
        .sum()
}

/// A valid request body with word geometry: one of the shipped samples in
/// `samples/`, in the demo's order.
pub fn sample_body(i: usize) -> serde_json::Value {
    static SAMPLES: std::sync::OnceLock<Vec<serde_json::Value>> = std::sync::OnceLock::new();
    let samples = SAMPLES.get_or_init(|| {
        [
            "invoice-northwind",
            "invoice-contoso",
            "receipt-bakery",
            "receipt-hardware",
        ]
        .map(|name| {
            let path = format!("{}/samples/{name}.json", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let mut sample: serde_json::Value = serde_json::from_str(&text).unwrap();
            sample["request"].take()
        })
        .to_vec()
    });
    samples[i % samples.len()].clone()
}

/// Submits `n` jobs through the same path as `POST /v1/extractions`.
pub async fn submit_jobs(services: &Services, n: usize) -> Vec<Uuid> {
    submit_bodies(services, n, sample_body).await
}

/// Submits `n` jobs whose bodies `body(i)` gives, through the submit path.
pub async fn submit_bodies(
    services: &Services,
    n: usize,
    body: impl Fn(usize) -> serde_json::Value,
) -> Vec<Uuid> {
    let body = &body;
    stream::iter(0..n)
        .map(|i| async move {
            let new = NewExtraction {
                id: Uuid::new_v4(),
                tenant_id: DEFAULT_TENANT_ID,
                max_open_jobs: None,
                idempotency_key: None,
                request: serde_json::from_value(body(i)).unwrap(),
            };
            docstream::pipeline::submit(services, new)
                .await
                .unwrap()
                .extraction()
                .id
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Inserts a job without publishing anything: the raw material of an orphan.
pub async fn insert_job(pool: &PgPool) -> Uuid {
    let request = serde_json::from_value(sample_body(0)).unwrap();
    let new = NewExtraction {
        id: Uuid::new_v4(),
        tenant_id: DEFAULT_TENANT_ID,
        max_open_jobs: None,
        idempotency_key: None,
        request,
    };
    store::submit(pool, new).await.unwrap().extraction().id
}

/// Waits until `sql` counts at least `at_least`.
pub async fn wait_count(pool: &PgPool, what: &str, sql: &str, at_least: i64, timeout: Duration) {
    wait_for(what, timeout, || {
        let pool = pool.clone();
        let sql = sql.to_owned();
        async move {
            let n: i64 = sqlx::query_scalar(&sql)
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
            if n >= at_least {
                Ok(())
            } else {
                Err(format!("{n}/{at_least}"))
            }
        }
    })
    .await
}

/// Jobs finished with their bbox refinement.
pub const ALL_BBOX_SUCCEEDED: &str = "SELECT count(*) FROM extractions
    WHERE status = 'succeeded' AND bbox_status = 'succeeded'";

/// How many times each id won `transition`.
pub async fn wins(pool: &PgPool, transition: &str) -> HashMap<Uuid, i64> {
    let rows: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT extraction_id, count(*) FROM extraction_transitions WHERE transition::text = $1 GROUP BY 1",
    )
    .bind(transition)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Asserts that exactly `ids` won, each once.
pub fn assert_exactly_once(wins: &HashMap<Uuid, i64>, ids: &[Uuid], what: &str) {
    let expected: HashSet<Uuid> = ids.iter().copied().collect();
    let got: HashSet<Uuid> = wins.keys().copied().collect();
    assert_eq!(
        got, expected,
        "{what}: the set of ids differs (lost or foreign jobs)"
    );
    let twice: Vec<_> = wins.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "{what} won more than once: {twice:?}");
}

/// SIGTERMs the children still running and waits for them.
pub async fn stop(children: impl IntoIterator<Item = &mut Child>) {
    for child in children {
        if child.id().is_some() {
            let _ = signal(child, "TERM").await;
            let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        }
    }
}

/// The `p` quantile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One frame of the import stream: sample submission `i` under `key`.
pub fn import_frame(i: usize, key: &str) -> tokio_tungstenite::tungstenite::Message {
    let frame = serde_json::json!({
        "ref": i,
        "idempotency_key": key,
        "request": sample_body(i),
    });
    tokio_tungstenite::tungstenite::Message::Text(frame.to_string().into())
}

/// Reads import-stream answers into `answered` until the server's close
/// frame, which it returns; panics if the stream breaks instead of closing.
pub async fn answers_until_close<S>(
    answers: &mut S,
    answered: &mut Vec<serde_json::Value>,
) -> Option<tokio_tungstenite::tungstenite::protocol::CloseFrame>
where
    S: futures::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use tokio_tungstenite::tungstenite::Message as Frame;
    while let Some(message) = answers.next().await {
        match message {
            Ok(Frame::Text(text)) => answered.push(serde_json::from_str(&text).unwrap()),
            Ok(Frame::Close(frame)) => return frame,
            Ok(_) => {}
            Err(e) => panic!("the import stream broke instead of closing: {e}"),
        }
    }
    None
}

/// The import stream of a client that keeps submitting: `n` sample frames
/// keyed `{prefix}-{i}`, sent in the background (stopping if the socket
/// closes), and the stream of their answers.
pub async fn busy_import(
    addr: &str,
    api_key: &str,
    prefix: &str,
    n: usize,
) -> (
    tokio::task::JoinHandle<impl Sized>,
    impl futures::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
) {
    use futures::SinkExt;
    let request = ws_request(&format!("ws://{addr}/v1/import"), api_key);
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("connect to the import stream");
    let (mut sender, answers) = socket.split();
    let prefix = prefix.to_owned();
    let sending = tokio::spawn(async move {
        for i in 0..n {
            let frame = import_frame(i, &format!("{prefix}-{i}"));
            if sender.send(frame).await.is_err() {
                break;
            }
        }
        sender
    });
    (sending, answers)
}

/// The first `k` answers of an import stream; panics on anything else.
pub async fn first_answers<S>(answers: &mut S, k: usize) -> Vec<serde_json::Value>
where
    S: futures::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    let mut answered = Vec::new();
    while answered.len() < k {
        match answers.next().await {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text))) => {
                answered.push(serde_json::from_str(&text).unwrap())
            }
            other => panic!("unexpected before shutdown: {other:?}"),
        }
    }
    answered
}

/// Starts a provider process and returns it with the URL it printed.
pub async fn start_provider(
    mut command: tokio::process::Command,
) -> (tokio::process::Child, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the provider");
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the provider prints its URL")
        .unwrap()
        .expect("a line");
    let url = line.rsplit(' ').next().unwrap().to_owned();
    (child, url)
}

/// A duration setting of `s` seconds.
pub fn secs(s: f64) -> docstream::config::Seconds {
    docstream::config::Seconds::try_from(s).expect("a number of seconds")
}
