//! docstream against a Kafka and a Postgres that take TLS only
//! (`scripts/services.sh up --secure`): SASL_SSL with SCRAM-SHA-512, an SSL
//! listener that wants a client certificate, and a Postgres whose pg_hba.conf
//! rejects every connection without TLS. Every role runs one job end to end
//! there; a wrong password, an untrusted CA or a host name the certificate
//! does not hold ends a process at start, with the reason and without the
//! secret.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, sample_body, stop, wait_count, wait_for, wait_healthy, TestEnv};
use docstream::config::Settings;
use docstream::events::{encode, ExtractionRequested};
use futures::{SinkExt, StreamExt};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};
use tokio::process::Command;
use uuid::Uuid;

/// Where `scripts/services.sh up --secure` put the secured pair.
struct Secure {
    tls: PathBuf,
    kafka: String,
    kafka_mtls: String,
    user: String,
    password: String,
    postgres: String,
}

impl Secure {
    fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} unset: run under scripts/test.sh, which starts the secured services")
            })
        };
        Self {
            tls: var("DOCSTREAM_TEST_TLS_DIR").into(),
            kafka: var("DOCSTREAM_TEST_SECURE_KAFKA"),
            kafka_mtls: var("DOCSTREAM_TEST_SECURE_KAFKA_MTLS"),
            user: var("DOCSTREAM_TEST_SECURE_KAFKA_USER"),
            password: var("DOCSTREAM_TEST_SECURE_KAFKA_PASSWORD"),
            postgres: var("DOCSTREAM_TEST_SECURE_PG"),
        }
    }

    fn file(&self, name: &str) -> String {
        self.tls.join(name).to_str().unwrap().to_owned()
    }

    /// A `verify-full` URL of database `db` as `user:password` on `host`
    /// (the secured port), trusting `ca`.
    fn database_url(&self, credentials: &str, host: &str, ca: &str) -> String {
        let port = self.postgres.rsplit(':').next().unwrap();
        format!(
            "postgres://{credentials}@{host}:{port}/docstream?sslmode=verify-full&sslrootcert={}",
            self.file(ca)
        )
    }

    /// A properties file for SASL_SSL with SCRAM-SHA-512 trusting `ca`, in
    /// `dir`; the password is not in it (it goes in a file of its own).
    fn sasl_properties(&self, dir: &Path, ca: &str) -> String {
        let path = dir.join(format!("sasl-{ca}.properties"));
        let text = format!(
            "# as a team keeps it for the Kafka tools\nsecurity.protocol=SASL_SSL\n\
             sasl.mechanism=SCRAM-SHA-512\nsasl.username={}\nssl.ca.location={}\n",
            self.user,
            self.file(ca)
        );
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// The environment of a process on the secured pair: the SASL password
    /// read from a file, the database URL from another.
    fn process_env(&self, dir: &Path) -> Vec<(String, String)> {
        let password = dir.join("kafka-password");
        std::fs::write(&password, format!("{}\n", self.password)).unwrap();
        let url = dir.join("database-url");
        let database = self.database_url("docstream:docstream", "localhost", "ca.pem");
        std::fs::write(&url, database).unwrap();
        [
            ("DOCSTREAM_KAFKA_BROKERS", self.kafka.clone()),
            (
                "DOCSTREAM_KAFKA_PROPERTIES_FILE",
                self.sasl_properties(dir, "ca.pem"),
            ),
            ("DOCSTREAM_KAFKA_SASL_PASSWORD_FILE", path(&password)),
            ("DATABASE_URL_FILE", path(&url)),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .to_vec()
    }

    /// Settings loaded as a process loads them from [`Secure::process_env`],
    /// over the test's own environment.
    fn settings(&self, dir: &Path) -> Settings {
        let given = self.process_env(dir);
        Settings::load_from(None, &|var| {
            if var == "DATABASE_URL" {
                return None;
            }
            given
                .iter()
                .find(|(k, _)| k == var)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(var).ok())
        })
        .expect("settings on the secured services")
    }
}

/// A process's environment: (variable, value).
type Env = Vec<(String, String)>;

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

/// The plaintext services' ports: nothing in a secured run may name them.
fn plaintext_ports() -> [String; 2] {
    let port = |var: &str| {
        let value = std::env::var(var).unwrap_or_default();
        value.rsplit(':').next().unwrap_or_default().to_owned()
    };
    let postgres = std::env::var("DATABASE_URL")
        .ok()
        .and_then(|u| reqwest::Url::parse(&u).ok())
        .and_then(|u| u.port())
        .map(|p| p.to_string())
        .unwrap_or_default();
    [port("DOCSTREAM_KAFKA_BROKERS"), postgres]
}

/// serve, worker, bbox worker and intake, each its own process on the
/// secured pair, run two jobs to bbox succeeded: one submitted over HTTP
/// with a webhook and read back on the export stream, one produced to the
/// intake broken, dead-lettered, fixed and replayed. `migrate` and `topics`
/// work there too, and nothing is told a plaintext port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_runs_a_job_over_tls_only() {
    let secure = Secure::from_env();
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::on(secure.settings(dir.path()), "secure_roles").await;
    assert!(env.settings.database_url.contains("sslmode=verify-full"));
    let children_env = env.child_env();
    for port in plaintext_ports() {
        assert!(!port.is_empty(), "the plaintext services' ports are known");
        for (var, value) in &children_env {
            assert!(
                !value.contains(&format!(":{port}")),
                "{var} names the plaintext port {port}"
            );
        }
    }
    for command in ["migrate", "topics"] {
        let out = env.run_cli(&[command]).await;
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let hooks = Hooks::start().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let roles_env = [
        ("DOCSTREAM_WEBHOOK_ALLOW", "127.0.0.1/32".to_owned()),
        ("DOCSTREAM_WEBHOOK_RETRY_BASE_DELAY_S", "0.2".to_owned()),
    ];
    let mut serve_env = roles_env.to_vec();
    serve_env.push(("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")));
    let mut children = [
        env.spawn("serve", &serve_env, "secure-serve"),
        env.spawn("worker", &roles_env, "secure-worker"),
        env.spawn("bbox-worker", &roles_env, "secure-bbox-worker"),
        env.spawn("intake", &roles_env, "secure-intake"),
    ];
    wait_healthy(&base).await;

    let mut body = sample_body(0);
    body["webhook_url"] = json!(hooks.url);
    let answer: Value = env
        .client()
        .post(format!("{base}/v1/extractions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    let submitted: Uuid = answer["id"].as_str().unwrap().parse().unwrap();

    let replayed_key = a_dead_letter_fixed_and_replayed(&env, dir.path()).await;
    wait_count(
        &env.pool,
        "both jobs at bbox succeeded",
        common::ALL_BBOX_SUCCEEDED,
        2,
        Duration::from_secs(120),
    )
    .await;
    let replayed: i64 = common::count(
        &env.pool,
        &format!(
            "SELECT count(*) FROM extraction_requests WHERE idempotency_key = '{replayed_key}'"
        ),
    )
    .await;
    assert_eq!(replayed, 1, "the replayed request became one job");

    the_export_stream_carries(&base, &env.api_key, submitted).await;
    wait_for(
        "the webhook of the submitted job",
        Duration::from_secs(60),
        || {
            let got = hooks.jobs();
            async move {
                match got.iter().any(|body| body.contains(&submitted.to_string())) {
                    true => Ok(()),
                    false => Err(format!("webhooks so far: {got:?}")),
                }
            }
        },
    )
    .await;
    stop(children.iter_mut()).await;
}

/// A request produced to the intake with no fields is a dead letter; the
/// operator's `dlq` commands, on the secured pair too, show it, fix it and
/// replay it. The key of the replayed request.
async fn a_dead_letter_fixed_and_replayed(env: &TestEnv, dir: &Path) -> String {
    let key = format!("secure-fix-{}", Uuid::new_v4().simple());
    let mut broken = sample_body(1);
    broken["fields"] = json!([]);
    let requested = ExtractionRequested {
        idempotency_key: key.clone(),
        request_json: broken.to_string(),
        requested_at_ms: 0,
    };
    let producer: FutureProducer = env.settings.kafka().config().create().unwrap();
    let record = encode(&requested).unwrap();
    let topic = env.topic("extraction.requests");
    producer
        .send(
            FutureRecord::to(&topic)
                .key(key.as_bytes())
                .payload(&record)
                .headers(common::intake_headers("default", &env.api_key)),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let json = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let letter = wait_for("the dead letter", Duration::from_secs(60), || async {
        let listed = json(
            env.run_cli(&["dlq", "list", "--json", "--kind", "invalid_request"])
                .await,
        );
        match listed.as_array().and_then(|a| a.first()) {
            Some(letter) => Ok(letter["letter"].as_str().unwrap().to_owned()),
            None => Err("no letter yet".to_owned()),
        }
    })
    .await;
    let shown = json(env.run_cli(&["dlq", "show", &letter]).await);
    let mut fixed = shown["original"].clone();
    fixed["request"]["fields"] = sample_body(1)["fields"].clone();
    let edit = dir.join("fixed.json");
    std::fs::write(&edit, fixed.to_string()).unwrap();
    let replayed = json(
        env.run_cli(&["dlq", "replay", &letter, "--edit", &path(&edit)])
            .await,
    );
    assert_eq!(replayed["to"], topic.as_str(), "{replayed}");
    key
}

/// Reads the export stream from the start until an event of `job` comes.
async fn the_export_stream_carries(base: &str, key: &str, job: Uuid) {
    let url = format!(
        "{}/v1/export?group=secure&from=earliest",
        base.replace("http://", "ws://")
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(common::ws_request(&url, key))
        .await
        .expect("the export stream");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, socket.next())
            .await
            .expect("an event of the job on the export stream within 60 s")
            .expect("the stream open")
            .expect("a frame");
        let Ok(text) = frame.into_text() else {
            continue;
        };
        let Ok(frame) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if let Some(seq) = frame["seq"].as_u64() {
            let ack = json!({ "ack": seq }).to_string();
            socket
                .send(tokio_tungstenite::tungstenite::Message::Text(ack.into()))
                .await
                .unwrap();
        }
        if frame["event"]["extraction_id"] == job.to_string().as_str() {
            return;
        }
    }
}

/// A webhook receiver on loopback: the bodies it was sent.
struct Hooks {
    url: String,
    received: Arc<Mutex<Vec<String>>>,
}

impl Hooks {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let received: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = received.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: axum::Json<Value>| {
                let seen = seen.clone();
                async move {
                    let body = body.to_string();
                    seen.lock().unwrap().push(body);
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, received }
    }

    fn jobs(&self) -> Vec<String> {
        self.received.lock().unwrap().clone()
    }
}

/// `docstream ARGS` with `env` over the test's environment, to its end,
/// which must come within 30 s.
async fn docstream(args: &[&str], env: &[(String, String)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_docstream"));
    if env.iter().any(|(k, _)| k == "DATABASE_URL_FILE") {
        // The test's own (plaintext) URL would clash with the file.
        command.env_remove("DATABASE_URL");
    }
    let run = command
        .args(args)
        .env("DOCSTREAM_LOG", "warn")
        .env("DOCSTREAM_METRICS_ADDR", "127.0.0.1:0")
        .envs(env.iter().cloned())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap_or_else(|_| panic!("docstream {args:?} ends within 30 s"))
        .unwrap()
}

/// `docstream worker` with `env`: whether it succeeded, its stderr, and
/// how long it ran.
async fn a_worker_with(env: &[(String, String)]) -> (bool, String, Duration) {
    let started = Instant::now();
    let env = with(env, "DOCSTREAM_TOPIC_PREFIX", "secure-refusals.".into());
    let out = docstream(&["worker"], &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr, started.elapsed())
}

/// `base` with `var` set to `value`.
fn with(base: &[(String, String)], var: &str, value: String) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base.iter().filter(|(k, _)| k != var).cloned().collect();
    env.push((var.to_owned(), value));
    env
}

/// A wrong password, a CA that signed nothing of the server's and a host
/// name its certificate does not hold, for Kafka and for Postgres: each ends
/// the process at start, within 30 s, saying why, and no password is in
/// what it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_ends_the_process_at_start_without_the_secret() {
    let secure = Secure::from_env();
    let dir = tempfile::tempdir().unwrap();
    let good = secure.process_env(dir.path());
    let wrong_kafka = dir.path().join("wrong-kafka-password");
    std::fs::write(&wrong_kafka, "wrong-kafka-secret-7f3a").unwrap();
    let host = secure.kafka.replace("localhost", "127.0.0.1");
    let cases: Vec<(&str, Env, &str)> = vec![
        (
            "a wrong Kafka password",
            with(
                &good,
                "DOCSTREAM_KAFKA_SASL_PASSWORD_FILE",
                path(&wrong_kafka),
            ),
            "Authentication failed",
        ),
        (
            "an untrusted CA for Kafka",
            with(
                &good,
                "DOCSTREAM_KAFKA_PROPERTIES_FILE",
                secure.sasl_properties(dir.path(), "rogue-ca.pem"),
            ),
            "certificate verify failed",
        ),
        (
            "a Kafka host its certificate does not name",
            with(&good, "DOCSTREAM_KAFKA_BROKERS", host),
            "certificate verify failed",
        ),
        (
            "a wrong Postgres password",
            with(
                &without(&good, "DATABASE_URL_FILE"),
                "DATABASE_URL",
                secure.database_url("docstream:wrong-pg-secret-91c2", "localhost", "ca.pem"),
            ),
            "password authentication failed",
        ),
        (
            "an untrusted CA for Postgres",
            with(
                &without(&good, "DATABASE_URL_FILE"),
                "DATABASE_URL",
                secure.database_url("docstream:docstream", "localhost", "rogue-ca.pem"),
            ),
            "UnknownIssuer",
        ),
        (
            "a Postgres host its certificate does not name",
            with(
                &without(&good, "DATABASE_URL_FILE"),
                "DATABASE_URL",
                secure.database_url("docstream:docstream", "127.0.0.1", "ca.pem"),
            ),
            "not valid for name",
        ),
        (
            "a Postgres CA file that is not there",
            with(
                &without(&good, "DATABASE_URL_FILE"),
                "DATABASE_URL",
                secure.database_url("docstream:docstream", "localhost", "no-such-ca.pem"),
            ),
            "cannot be read",
        ),
    ];
    let secrets = [
        secure.password.as_str(),
        "wrong-kafka-secret-7f3a",
        "wrong-pg-secret-91c2",
    ];
    for (case, env, reason) in cases {
        let (succeeded, stderr, took) = a_worker_with(&env).await;
        assert!(!succeeded, "{case}: the worker ran on");
        assert!(
            stderr.contains("refused the connection"),
            "{case}: {stderr}"
        );
        assert!(stderr.contains(reason), "{case}: no {reason:?} in {stderr}");
        for secret in secrets {
            assert!(
                !stderr.contains(secret),
                "{case}: the secret is in {stderr}"
            );
        }
        eprintln!("{case}: ended in {took:?}");
    }
}

fn without(base: &[(String, String)], var: &str) -> Vec<(String, String)> {
    base.iter().filter(|(k, _)| k != var).cloned().collect()
}

/// Client certificates: `topics` through the broker's listener that
/// requires one, and `migrate` as a Postgres role that logs in with one.
/// Without the certificate, the broker refuses at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_open_kafka_and_postgres() {
    let secure = Secure::from_env();
    let dir = tempfile::tempdir().unwrap();
    let properties = |with_certificate: bool| {
        let path = dir
            .path()
            .join(format!("mtls-{with_certificate}.properties"));
        let mut text = format!(
            "security.protocol=SSL\nssl.ca.location={}\n",
            secure.file("ca.pem")
        );
        if with_certificate {
            text += &format!(
                "ssl.certificate.location={}\nssl.key.location={}\n",
                secure.file("client.pem"),
                secure.file("client.key")
            );
        }
        std::fs::write(&path, text).unwrap();
        path
    };
    let url = format!(
        "{}&sslcert={}&sslkey={}",
        secure.database_url("docstream_cert", "localhost", "ca.pem"),
        secure.file("client-cert-user.pem"),
        secure.file("client-cert-user.key")
    );
    let env = |properties: PathBuf| -> Env {
        vec![
            ("DOCSTREAM_KAFKA_BROKERS".into(), secure.kafka_mtls.clone()),
            ("DOCSTREAM_KAFKA_PROPERTIES_FILE".into(), path(&properties)),
            ("DATABASE_URL".into(), url.clone()),
            ("DOCSTREAM_TOPIC_PREFIX".into(), "secure-mtls.".into()),
        ]
    };
    for args in [&["topics"][..], &["migrate"][..]] {
        let out = docstream(args, &env(properties(true))).await;
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let refused = docstream(&["topics"], &env(properties(false))).await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("Kafka refused the connection"), "{stderr}");
    assert!(stderr.contains("alert"), "the broker's TLS alert: {stderr}");
}

/// OAUTHBEARER with OIDC client credentials: librdkafka asks the test's token
/// endpoint for a token (the secret from a file), and the broker checks its
/// signature against the endpoint's JWKS. `topics` (admin) and `dlq list` (a
/// reader) work through it; a wrong client secret ends the process at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_tokens_from_an_oidc_endpoint_open_the_broker() {
    let secure = Secure::from_env();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"));
    let dir = tempfile::tempdir().unwrap();
    let properties = dir.path().join("oauth.properties");
    let text = format!(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.method=oidc\n\
         sasl.oauthbearer.client.id={}\nsasl.oauthbearer.token.endpoint.url={}\n\
         sasl.oauthbearer.scope=kafka\nssl.ca.location={}\n",
        var("DOCSTREAM_TEST_OIDC_CLIENT"),
        var("DOCSTREAM_TEST_OIDC_TOKEN_URL"),
        secure.file("ca.pem")
    );
    std::fs::write(&properties, text).unwrap();
    let right = dir.path().join("client-secret");
    std::fs::write(&right, var("DOCSTREAM_TEST_OIDC_SECRET")).unwrap();
    let wrong = dir.path().join("wrong-client-secret");
    std::fs::write(&wrong, "wrong-oidc-secret-5d0e").unwrap();
    let env = |secret: &Path| -> Env {
        vec![
            (
                "DOCSTREAM_KAFKA_BROKERS".into(),
                var("DOCSTREAM_TEST_SECURE_KAFKA_OAUTH"),
            ),
            ("DOCSTREAM_KAFKA_PROPERTIES_FILE".into(), path(&properties)),
            (
                "DOCSTREAM_KAFKA_OAUTH_CLIENT_SECRET_FILE".into(),
                path(secret),
            ),
            ("DOCSTREAM_TOPIC_PREFIX".into(), "secure-oauth.".into()),
        ]
    };
    for args in [&["topics"][..], &["dlq", "list", "--json"][..]] {
        let out = docstream(args, &env(&right)).await;
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    the_endpoint_away_is_an_outage(&secure, &var("DOCSTREAM_TEST_SECURE_KAFKA_OAUTH"), &right)
        .await;
    let refused = docstream(&["topics"], &env(&wrong)).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("Kafka refused the connection"), "{stderr}");
    assert!(
        stderr.contains("invalid_client"),
        "the endpoint's answer: {stderr}"
    );
    assert!(!stderr.contains("wrong-oidc-secret-5d0e"), "{stderr}");
}

/// The same client with a token endpoint nobody listens on: librdkafka's
/// failure to fetch a token is an outage at start, not a refusal.
async fn the_endpoint_away_is_an_outage(secure: &Secure, brokers: &str, secret: &Path) {
    let secret = std::fs::read_to_string(secret).unwrap();
    let text = format!(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.method=oidc\n\
         sasl.oauthbearer.client.id=docstream\nsasl.oauthbearer.client.secret={}\n\
         sasl.oauthbearer.token.endpoint.url=http://127.0.0.1:{}/token\nssl.ca.location={}\n",
        secret.trim(),
        free_port(),
        secure.file("ca.pem")
    );
    let properties = docstream::config::KafkaProperties::parse(&text).unwrap();
    let kafka = docstream::config::KafkaClient::new(brokers, properties);
    let reached = docstream::preflight::check_kafka(&kafka, Duration::from_secs(5))
        .await
        .expect("an endpoint away is not a refusal");
    assert!(
        matches!(reached, docstream::preflight::Reached::NotYet(_)),
        "{reached:?}"
    );
}
