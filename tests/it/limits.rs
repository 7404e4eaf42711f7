//! Hostile input against real processes, Postgres and Kafka: every bound is
//! held, every refusal is a clear 4xx (or a dead letter), and nothing a
//! request or record does can stall a partition, buy unbounded memory, or
//! hold up the runtime.

use crate::common;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, peak_rss_kib, scrape, stop, wait_count, wait_for, wait_healthy, TestEnv};

/// Held by the tests that flood the machine (thousands of sockets at once)
/// and the one that times `/healthz`, so none of them runs beside another:
/// on a 2-core machine, the 4,096 sockets of the idle test opened beside the
/// `/healthz` test made one probe wait 669 ms (150 ms on a faster machine;
/// 6 to 14 ms alone), which measured the other test, not the process.
static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
use docstream::events::{decode, encode, DeadLetter, ExtractionRequested};
use futures::{FutureExt, SinkExt, StreamExt};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use uuid::Uuid;

/// A WebSocket client's stream.
type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The server's answer to a WebSocket handshake.
type WsResponse = tokio_tungstenite::tungstenite::handshake::client::Response;

/// A `serve` process on free ports: (child, API base URL, metrics address).
fn spawn_serve(
    env: &TestEnv,
    extra: &[(&str, String)],
    log: &str,
) -> (tokio::process::Child, String, String) {
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut vars = vec![
        ("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")),
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
    ];
    vars.extend(extra.iter().cloned());
    let child = env.spawn("serve", &vars, log);
    (child, format!("127.0.0.1:{port}"), metrics)
}

/// Waits until the intake's committed offset on partition 0 of its topic is
/// past `offset`, and returns it.
async fn intake_commits_past(env: &TestEnv, offset: i64) -> i64 {
    let group = env.settings.group(&env.settings.intake_group);
    wait_for(
        "the intake to commit past the record",
        Duration::from_secs(30),
        || {
            let committed = env.committed(&group, "extraction.requests");
            async move {
                match committed.get(&0) {
                    Some(&at) if at > offset => Ok(at),
                    other => Err(format!("committed {other:?}")),
                }
            }
        },
    )
    .await
}

/// Submits `body` and returns the new job's id; it must be accepted.
async fn accepted(client: &reqwest::Client, base: &str, body: &serde_json::Value) -> Uuid {
    let response = client
        .post(format!("{base}/v1/extractions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let answer: serde_json::Value = response.json().await.unwrap();
    answer["id"].as_str().unwrap().parse().unwrap()
}

fn good_body(i: usize) -> serde_json::Value {
    common::sample_body(i)
}

/// `{"document": {"text": TEXT}, …}` with `text` spliced in as raw JSON, so
/// escapes a JSON library would never write (a lone surrogate) reach the server.
fn raw_text_body(text_json: &str) -> String {
    format!(
        r#"{{"document":{{"text":"Total {text_json} 12"}},"fields":[{{"name":"x","anchor":"Total"}}]}}"#
    )
}

const NUL: &str = r"a\u0000b";
const LONE_SURROGATE: &str = r"a\ud800b";

/// A `serve`, an intake and a worker, and this run's idempotency-key prefix.
struct Intakes {
    env: TestEnv,
    addr: String,
    base: String,
    client: reqwest::Client,
    run: String,
    children: [Child; 3],
}

/// An HTTP submission's index, status and answer.
type Answer = (usize, u16, serde_json::Value);

/// A `serve`, an intake and a worker, the API healthy.
async fn a_serve_an_intake_and_a_worker() -> Intakes {
    let env = TestEnv::new("limits_text").await;
    let (serve, addr, _) = spawn_serve(&env, &[], "limits-text-serve");
    let children = [
        serve,
        env.spawn("intake", &[], "limits-text-intake"),
        env.spawn("worker", &[], "limits-text-worker"),
    ];
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    let client = env.client();
    let run = Uuid::new_v4().simple().to_string();
    Intakes {
        env,
        addr,
        base,
        client,
        run,
        children,
    }
}

/// HTTP: 10 NUL, 10 lone surrogates and 50 good submissions at once.
async fn http_submissions_with_bad_text_beside_good_ones(intakes: &Intakes) -> Vec<Answer> {
    let (client, base, run) = (&intakes.client, &intakes.base, &intakes.run);
    let mut submits = Vec::new();
    for i in 0..70 {
        let body = match i % 7 {
            0 => raw_text_body(NUL),
            1 => raw_text_body(LONE_SURROGATE),
            _ => good_body(i).to_string(),
        };
        let request = client
            .post(format!("{base}/v1/extractions"))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("{run}-{i}"))
            .body(body);
        submits.push(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap();
            (i, status, body)
        });
    }
    futures::future::join_all(submits).await
}

/// Each bad submission was refused 422 `unrepresentable_text`, and each of
/// the 50 good ones beside them accepted.
fn bad_text_got_422_and_every_good_submission_202(answers: &[Answer]) {
    let mut accepted = 0;
    for (i, status, body) in answers {
        match i % 7 {
            0 | 1 => {
                assert_eq!(*status, 422, "submit {i}: {body}");
                assert_eq!(body["error"]["code"], "unrepresentable_text", "{body}");
            }
            _ => {
                assert_eq!(
                    *status, 202,
                    "good submit {i} failed beside a bad one: {body}"
                );
                accepted += 1;
            }
        }
    }
    assert_eq!(accepted, 50);
}

/// The import stream: a NUL frame, a lone-surrogate frame and a good one;
/// returns the socket and the three answers by `ref`.
async fn import_frames_with_bad_text_beside_a_good_one(
    intakes: &Intakes,
) -> (Socket, HashMap<String, serde_json::Value>) {
    let url = format!("ws://{}/v1/import", intakes.addr);
    let (mut socket, _) = tokio_tungstenite::connect_async(intakes.env.ws_request(&url))
        .await
        .unwrap();
    let frames = [
        format!(r#"{{"ref":"nul","request":{}}}"#, raw_text_body(NUL)),
        format!(
            r#"{{"ref":"surrogate","request":{}}}"#,
            raw_text_body(LONE_SURROGATE)
        ),
        serde_json::json!({"ref": "good", "idempotency_key": format!("{}-ws", intakes.run), "request": good_body(1)})
            .to_string(),
    ];
    for frame in frames {
        socket.send(Message::Text(frame.into())).await.unwrap();
    }
    let mut by_ref = HashMap::new();
    while by_ref.len() < 3 {
        let Some(Ok(Message::Text(text))) = socket.next().await else {
            panic!("the import stream closed before answering");
        };
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        by_ref.insert(answer["ref"].as_str().unwrap().to_owned(), answer);
    }
    (socket, by_ref)
}

/// The same refusals on the import stream, and the good frame queued.
fn the_bad_frames_were_refused_and_the_good_one_queued(
    by_ref: &HashMap<String, serde_json::Value>,
) {
    for bad in ["nul", "surrogate"] {
        assert_eq!(
            by_ref[bad]["error"]["code"], "unrepresentable_text",
            "{bad}: {}",
            by_ref[bad]
        );
    }
    assert_eq!(by_ref["good"]["status"], "queued", "{}", by_ref["good"]);
}

/// The intake: a NUL record, a lone-surrogate record and a good one behind
/// them, on partition 0; returns the last one's offset, and the producer
/// (kept until the test ends).
async fn intake_records_with_bad_text_before_a_good_one(
    intakes: &Intakes,
) -> (i64, FutureProducer) {
    let (env, run) = (&intakes.env, &intakes.run);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .create()
        .unwrap();
    let topic = env.topic("extraction.requests");
    let records = [
        (format!("{run}-k-nul"), raw_text_body(NUL)),
        (format!("{run}-k-surrogate"), raw_text_body(LONE_SURROGATE)),
        (format!("{run}-k-good"), good_body(2).to_string()),
    ];
    let mut last_offset = 0;
    for (key, json) in &records {
        let requested = ExtractionRequested {
            idempotency_key: key.clone(),
            request_json: json.clone(),
            requested_at_ms: 0,
        };
        let payload = encode(&requested).unwrap();
        let record = FutureRecord::to(&topic)
            .partition(0)
            .key(key.as_bytes())
            .payload(&payload)
            .headers(common::intake_headers("default", &env.api_key));
        let delivered = producer.send(record, Duration::from_secs(30)).await;
        last_offset = delivered.unwrap().offset;
    }
    (last_offset, producer)
}

/// The good record behind the bad ones on the same partition became a job,
/// the intake committed past them all, and the bad ones became dead letters.
/// Returns the committed offset.
async fn the_good_record_became_a_job_and_the_bad_ones_dead_letters(
    intakes: &Intakes,
    last_offset: i64,
) -> i64 {
    let env = &intakes.env;
    let good_key = format!("{}-k-good", intakes.run);
    wait_count(
        &env.pool,
        "the good intake record to become a job",
        &format!("SELECT count(*) FROM extraction_requests WHERE idempotency_key = '{good_key}'"),
        1,
        Duration::from_secs(60),
    )
    .await;
    let committed = intake_commits_past(env, last_offset).await;
    let letters: Vec<DeadLetter> = env
        .read_topic("extraction.dlq")
        .into_iter()
        .map(|(_, value)| decode(&value).unwrap())
        .collect();
    let kinds: Vec<&str> = letters.iter().map(|l| l.error_kind.as_str()).collect();
    assert_eq!(kinds, ["unrepresentable_text", "unrepresentable_text"]);
    committed
}

/// Every good submission, whichever intake, finishes, and no job failed.
async fn every_good_submission_succeeded_and_none_failed(intakes: &Intakes) {
    let env = &intakes.env;
    let finished = wait_count(
        &env.pool,
        "every accepted job to succeed",
        "SELECT count(*) FROM extractions WHERE status = 'succeeded'",
        52,
        Duration::from_secs(90),
    );
    finished.await;
    let failed = common::count(
        &env.pool,
        "SELECT count(*) FROM extractions WHERE status <> 'succeeded'",
    )
    .await;
    assert_eq!(failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_postgres_cannot_store_is_refused_on_every_intake_and_nothing_else_fails() {
    let mut intakes = a_serve_an_intake_and_a_worker().await;
    let answers = http_submissions_with_bad_text_beside_good_ones(&intakes).await;
    bad_text_got_422_and_every_good_submission_202(&answers);
    let (mut socket, by_ref) = import_frames_with_bad_text_beside_a_good_one(&intakes).await;
    the_bad_frames_were_refused_and_the_good_one_queued(&by_ref);
    socket.close(None).await.unwrap();
    let (last_offset, _producer) = intake_records_with_bad_text_before_a_good_one(&intakes).await;
    let committed =
        the_good_record_became_a_job_and_the_bad_ones_dead_letters(&intakes, last_offset).await;
    every_good_submission_succeeded_and_none_failed(&intakes).await;
    eprintln!(
        "limits text: http 20 refused (422 unrepresentable_text) and 50 accepted; import 2 refused, \
         1 accepted; intake 2 dead letters, committed offset {committed} past {last_offset}; \
         52 jobs succeeded"
    );
    stop(&mut intakes.children).await;
}

/// RSS bound the amplification test states for each process.
const AMPLIFICATION_RSS_KIB: u64 = 160 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_past_its_limit_fails_after_one_attempt_and_memory_stays_bounded() {
    let env = TestEnv::new("limits_result").await;
    let (serve, addr, _) = spawn_serve(&env, &[], "limits-result-serve");
    let mut children = [serve, env.spawn("worker", &[], "limits-result-worker")];
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    // 1 MB of text and 30 fields that each match all of it: 60 MB of
    // result before the limits.
    let text: String = (0..100_000).map(|i| format!("w{:07} ", i)).collect();
    let fields: Vec<serde_json::Value> = (0..30)
        .map(|i| serde_json::json!({"name": format!("f{i}"), "pattern": "(.+)"}))
        .collect();
    let body = serde_json::json!({"document": {"text": text}, "fields": fields});
    let id = accepted(&env.client(), &base, &body).await;
    let (attempts, error): (i32, String) =
        wait_for("the job to fail", Duration::from_secs(60), || async {
            let row: Option<(String, i32, Option<String>)> =
                sqlx::query_as("SELECT status, attempts, error FROM extractions WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&env.pool)
                    .await
                    .unwrap();
            match row {
                Some((status, attempts, error)) if status == "failed" => {
                    Ok((attempts, error.unwrap_or_default()))
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert_eq!(attempts, 1, "a result past its limit is not retried");
    assert!(error.starts_with("result_too_large:"), "{error}");
    let peaks: Vec<u64> = children
        .iter()
        .map(|c| peak_rss_kib(c.id().unwrap()).unwrap())
        .collect();
    for peak in &peaks {
        assert!(*peak < AMPLIFICATION_RSS_KIB, "peak RSS {peak} KiB");
    }
    eprintln!("limits result: failed after {attempts} attempt: {error}; peak RSS serve/worker {peaks:?} KiB (bound {AMPLIFICATION_RSS_KIB})");
    stop(&mut children).await;
}

/// The body limit the import test runs with, and its RSS bound for `serve`.
const IMPORT_LIMIT: usize = 1 << 20;
const IMPORT_RSS_KIB: u64 = 200 * 1024;

/// An import frame of exactly `size` bytes.
fn frame_of_size(i: usize, run: &str, size: usize) -> String {
    let frame = |pad: usize| {
        serde_json::json!({
            "ref": i,
            "idempotency_key": format!("{run}-{i}"),
            "request": {
                "document": {"text": format!("Total 12.50 {}", "x".repeat(pad))},
                "fields": [{"name": "total", "type": "money", "anchor": "Total"}],
            },
        })
        .to_string()
    };
    let bare = frame(0).len();
    let text = frame(size - bare);
    assert_eq!(text.len(), size);
    text
}

/// A `serve` whose body (and import frame) limit is 1 MiB.
struct ImportLimit {
    children: [Child; 1],
    addr: String,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// An import socket, both halves kept until the test ends, and how long its
/// 64 frames took to be answered.
struct FramesSent {
    sink: futures::stream::SplitSink<Socket, Message>,
    answers: futures::stream::SplitStream<Socket>,
    took: Duration,
}

/// Starts a `serve` with a 1 MiB body limit, and waits until it is healthy.
async fn a_serve_with_a_1_mib_body_limit() -> ImportLimit {
    let env = TestEnv::new("limits_import").await;
    let limit = ("DOCSTREAM_HTTP_BODY_LIMIT_BYTES", IMPORT_LIMIT.to_string());
    let (serve, addr, _) = spawn_serve(&env, &[limit], "limits-import-serve");
    let children = [serve];
    wait_healthy(&format!("http://{addr}")).await;
    ImportLimit {
        children,
        addr,
        env,
    }
}

/// Sends 64 frames of exactly the limit in the background; each is
/// answered `queued`. A frame answered `unavailable` (the database slower
/// than the answer bound, on a loaded machine) is sent again with its key
/// a moment later, as its answer asks a client to: while `serve` knows
/// Postgres is away it answers so at once, and a resend without a pause
/// only meets the same answer again.
async fn sixty_four_frames_of_the_limit_are_each_queued(given: &ImportLimit) -> FramesSent {
    let url = format!("ws://{}/v1/import", given.addr);
    let (socket, _) = tokio_tungstenite::connect_async(given.env.ws_request(&url))
        .await
        .unwrap();
    let (mut sink, mut answers) = socket.split();
    let run = Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    let (resend, mut to_send) = tokio::sync::mpsc::unbounded_channel::<usize>();
    for i in 0..64 {
        resend.send(i).unwrap();
    }
    let sender = tokio::spawn(async move {
        while let Some(i) = to_send.recv().await {
            let frame = frame_of_size(i, &run, IMPORT_LIMIT);
            sink.send(Message::Text(frame.into())).await.unwrap();
        }
        sink
    });
    let (mut accepted, mut retried) = (0, 0);
    while accepted < 64 {
        match answers.next().await {
            Some(Ok(Message::Text(text))) => {
                let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
                if answer["error"]["code"] == "unavailable" && started.elapsed() < RETRY_FOR {
                    retried += 1;
                    let (resend, i) = (resend.clone(), answer["ref"].as_u64().unwrap() as usize);
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        let _ = resend.send(i);
                    });
                    continue;
                }
                assert_eq!(answer["status"], "queued", "{answer}");
                accepted += 1;
            }
            other => panic!("the stream ended after {accepted} answers: {other:?}"),
        }
    }
    drop(resend);
    if retried > 0 {
        eprintln!("limits import: {retried} frames answered unavailable were sent again");
    }
    let took = started.elapsed();
    let sink = sender.await.unwrap();
    FramesSent {
        sink,
        answers,
        took,
    }
}

/// How long frames answered `unavailable` are sent again.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// The pause before a frame answered `unavailable` is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// A frame one byte over the limit: the server closes the stream with 1009.
/// Returns the close frame.
async fn a_frame_one_byte_over_closes_the_stream_with_1009(sent: &mut FramesSent) -> CloseFrame {
    let over = frame_of_size(64, "over", IMPORT_LIMIT + 1);
    let _ = sent.sink.send(Message::Text(over.into())).await;
    let close = match sent.answers.next().await {
        Some(Ok(Message::Close(frame))) => frame,
        other => panic!("expected the close frame, got {other:?}"),
    };
    let close = close.expect("a close frame with a code");
    assert_eq!(u16::from(close.code), 1009, "{close:?}");
    close
}

/// `serve`'s peak RSS stayed under its bound, and the 64 frames are 64 rows.
/// Returns the peak, in KiB.
async fn serve_stayed_under_its_memory_bound_and_wrote_64_rows(given: &ImportLimit) -> u64 {
    let peak = peak_rss_kib(given.children[0].id().unwrap()).unwrap();
    assert!(peak < IMPORT_RSS_KIB, "serve's peak RSS {peak} KiB");
    let rows = common::count(&given.env.pool, "SELECT count(*) FROM extraction_requests").await;
    assert_eq!(rows, 64);
    peak
}

/// The import-limit test's report line.
fn report_the_import_limit(sent: &FramesSent, close: &CloseFrame, peak: u64) {
    let took = sent.took;
    eprintln!(
        "limits import: 64 frames of {IMPORT_LIMIT} bytes accepted in {took:?}; one byte over closed \
         with {} ({}); serve peak RSS {peak} KiB (bound {IMPORT_RSS_KIB})",
        u16::from(close.code),
        close.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_frames_are_held_to_the_body_limit_and_a_larger_one_closes_with_1009() {
    let mut given = a_serve_with_a_1_mib_body_limit().await;
    let mut sent = sixty_four_frames_of_the_limit_are_each_queued(&given).await;
    let close = a_frame_one_byte_over_closes_the_stream_with_1009(&mut sent).await;
    let peak = serve_stayed_under_its_memory_bound_and_wrote_64_rows(&given).await;
    report_the_import_limit(&sent, &close, peak);
    stop(&mut given.children).await;
}

/// A pattern the lazy DFA cannot run (Unicode word boundaries), so each
/// search of a few MB of Cyrillic text takes about a second.
const SLOW_PATTERN: &str = r"\b\w{1,8}\b\s\b\w{1,8}\b\d{3}";

/// An all-in-one process whose rule extractor has a 2 s deadline and one
/// thread, on a 3 s extraction lease heartbeated every 0.5 s.
struct SlowPatternServer {
    children: [Child; 1],
    base: String,
    /// Its /metrics, on the internal listener.
    metrics: String,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// The slow job and the 20 good ones beside it.
struct SlowAndOthers {
    slow_id: Uuid,
    others: Vec<Uuid>,
    /// The client that submitted them, kept until the test ends.
    _client: reqwest::Client,
}

/// How the slow job failed, and how /healthz answered meanwhile.
struct Probed {
    /// The slow job's error.
    error: String,
    failed_after: Duration,
    slowest: Duration,
    probes: u32,
    /// The probing client, kept until the test ends.
    _probe: reqwest::Client,
}

/// Starts `all` with a 2 s extraction deadline and one extraction thread,
/// on a 3 s lease heartbeated every 0.5 s, and waits until it is healthy.
async fn one_process_with_a_2_s_deadline_and_one_extraction_thread() -> SlowPatternServer {
    let env = TestEnv::with_settings("limits_slow", |s| {
        s.extraction_run_lease_s = common::secs(3.0);
        s.heartbeat_interval_s = common::secs(0.5);
    })
    .await;
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let vars = [
        ("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")),
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
        ("DOCSTREAM_EXTRACTION_DEADLINE_S", "2".to_owned()),
        ("DOCSTREAM_EXTRACTION_THREADS", "1".to_owned()),
    ];
    let children = [env.spawn("all", &vars, "limits-slow-all")];
    let base = format!("http://127.0.0.1:{port}");
    wait_healthy(&base).await;
    SlowPatternServer {
        children,
        base,
        metrics,
        env,
    }
}

/// Submits a job of 10 slow-pattern fields over a few MB of Cyrillic text,
/// then 20 good jobs.
async fn a_slow_pattern_job_and_20_good_ones_are_submitted(
    server: &SlowPatternServer,
) -> SlowAndOthers {
    let (base, client) = (&server.base, server.env.client());
    let text: String = (0..200_000).map(|i| format!("слово{}é ", i % 97)).collect();
    let fields: Vec<serde_json::Value> = (0..10)
        .map(|i| serde_json::json!({"name": format!("f{i}"), "pattern": SLOW_PATTERN}))
        .collect();
    let slow = serde_json::json!({"document": {"text": text}, "fields": fields});
    let slow_id = accepted(&client, base, &slow).await;
    let mut others = Vec::new();
    for i in 0..20 {
        others.push(accepted(&client, base, &good_body(i)).await);
    }
    SlowAndOthers {
        slow_id,
        others,
        _client: client,
    }
}

/// Asks /healthz (with a 5 s timeout), which must answer with success;
/// returns how long it took.
async fn a_healthz_answer_time(probe: &reqwest::Client, base: &str) -> Duration {
    let asked = Instant::now();
    let answered = probe
        .get(format!("{base}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert!(answered.status().is_success());
    asked.elapsed()
}

/// /healthz, every 50 ms, until the slow job has failed (within 60 s),
/// after one attempt.
async fn healthz_is_probed_every_50_ms_until_the_slow_job_fails(
    server: &SlowPatternServer,
    jobs: &SlowAndOthers,
) -> Probed {
    let probe = common::http_client();
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    let started = Instant::now();
    let error = loop {
        slowest = slowest.max(a_healthz_answer_time(&probe, &server.base).await);
        probes += 1;
        let row: (String, i32, Option<String>) =
            sqlx::query_as("SELECT status, attempts, error FROM extractions WHERE id = $1")
                .bind(jobs.slow_id)
                .fetch_one(&server.env.pool)
                .await
                .unwrap();
        if row.0 == "failed" {
            assert_eq!(row.1, 1, "a job past its deadline is not retried");
            break row.2.unwrap_or_default();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the slow job is still {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Probed {
        error,
        failed_after: started.elapsed(),
        slowest,
        probes,
        _probe: probe,
    }
}

/// The slow job failed on its deadline, and /healthz always answered
/// within 100 ms.
fn it_failed_on_its_deadline_while_healthz_stayed_fast(probed: &Probed) {
    let (error, slowest) = (&probed.error, probed.slowest);
    assert!(error.starts_with("deadline_exceeded:"), "{error}");
    assert!(
        slowest < Duration::from_millis(100),
        "/healthz took {slowest:?}"
    );
}

/// The other 20 jobs succeed, each once, and no claim was lost meanwhile
/// (no stale completion).
async fn the_others_succeed_once_each_and_no_claim_was_lost(
    server: &SlowPatternServer,
    jobs: &SlowAndOthers,
) {
    let pool = &server.env.pool;
    wait_count(
        pool,
        "the other jobs to succeed",
        "SELECT count(*) FROM extractions WHERE status = 'succeeded'",
        20,
        Duration::from_secs(60),
    )
    .await;
    let wins = common::wins(pool, "mark_succeeded").await;
    common::assert_exactly_once(&wins, &jobs.others, "mark_succeeded");
    let stale = scrape(&server.metrics, "docstream_stale_completions_total").await;
    assert_eq!(stale, 0.0, "a claim was lost while the slow job ran");
}

/// The slow-pattern test's report line.
fn report_the_slow_pattern(probed: &Probed) {
    let (failed_after, error) = (probed.failed_after, &probed.error);
    let (probes, slowest) = (probed.probes, probed.slowest);
    eprintln!(
        "limits slow pattern: failed after {failed_after:?} ({error}); {probes} /healthz probes, \
         slowest {slowest:?}; 20 other jobs succeeded once each, 0 stale completions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_pattern_fails_on_its_deadline_while_the_process_keeps_its_claims_and_answers() {
    let mut server = one_process_with_a_2_s_deadline_and_one_extraction_thread().await;
    let jobs = a_slow_pattern_job_and_20_good_ones_are_submitted(&server).await;
    let probed = healthz_is_probed_every_50_ms_until_the_slow_job_fails(&server, &jobs).await;
    it_failed_on_its_deadline_while_healthz_stayed_fast(&probed);
    the_others_succeed_once_each_and_no_claim_was_lost(&server, &jobs).await;
    report_the_slow_pattern(&probed);
    stop(&mut server.children).await;
}

/// Raises `topic`'s record size limit so records past the broker's 1 MB
/// default can be produced to it.
async fn allow_large_records(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let config =
        AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", "16777216");
    let altered = admin
        .alter_configs(&[config], &AdminOptions::new())
        .await
        .unwrap();
    assert!(altered.iter().all(Result::is_ok), "{altered:?}");
}

/// The intake's topic, open to records up to 16 MiB, and a producer for it.
struct LargeRecordsTopic {
    /// The test's `extraction.requests`.
    topic: String,
    /// Kept until the test ends.
    producer: FutureProducer,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// Two poison records and a good one behind them, on partition 0.
struct PoisonRecords {
    /// This run's idempotency-key prefix.
    run: String,
    /// The records' values: 1.1 MB without fields, 10 MB of non-Avro, good.
    payloads: [Vec<u8>; 3],
    offsets: Vec<i64>,
}

/// Raises the intake topic's record size limit to 16 MiB, with a producer
/// allowed as much.
async fn a_requests_topic_open_to_16_mib_records() -> LargeRecordsTopic {
    let env = TestEnv::new("limits_poison").await;
    let topic = env.topic("extraction.requests");
    allow_large_records(&env.settings.kafka_brokers, &topic).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .set("message.max.bytes", "16777216")
        .create()
        .unwrap();
    LargeRecordsTopic {
        topic,
        producer,
        env,
    }
}

/// Produces, to partition 0: a 1.1 MB request without fields, 10 MB that is
/// not Avro at all, and a good request.
async fn two_oversized_poison_records_then_a_good_one(given: &LargeRecordsTopic) -> PoisonRecords {
    let run = Uuid::new_v4().simple().to_string();
    // 1.1 MB: a request without fields; 10 MB: not Avro at all.
    let big_request = ExtractionRequested {
        idempotency_key: format!("{run}-big"),
        request_json: format!(r#"{{"document":{{"text":"{}"}}}}"#, "x".repeat(1_100_000)),
        requested_at_ms: 0,
    };
    let good = ExtractionRequested {
        idempotency_key: format!("{run}-good"),
        request_json: good_body(3).to_string(),
        requested_at_ms: 0,
    };
    let payloads = [
        encode(&big_request).unwrap(),
        vec![0x5a; 10 << 20],
        encode(&good).unwrap(),
    ];
    let mut offsets = Vec::new();
    for (i, payload) in payloads.iter().enumerate() {
        let key = format!("{run}-{i}");
        let record = FutureRecord::to(&given.topic)
            .partition(0)
            .key(key.as_bytes())
            .payload(payload)
            .headers(common::intake_headers("default", &given.env.api_key));
        let delivered = given.producer.send(record, Duration::from_secs(60)).await;
        offsets.push(delivered.unwrap().offset);
    }
    PoisonRecords {
        run,
        payloads,
        offsets,
    }
}

/// The good record behind the poison ones becomes a job (within 90 s), and
/// the intake commits past it. Returns its offset.
async fn the_good_record_becomes_a_job_and_the_commit_passes_it(
    given: &LargeRecordsTopic,
    records: &PoisonRecords,
) -> i64 {
    let run = &records.run;
    wait_count(
        &given.env.pool,
        "the good record behind the poison ones to become a job",
        &format!("SELECT count(*) FROM extraction_requests WHERE idempotency_key = '{run}-good'"),
        1,
        Duration::from_secs(90),
    )
    .await;
    let last = records.offsets[2];
    intake_commits_past(&given.env, last).await;
    last
}

/// One dead letter for each poison record, telling its size and kind.
/// Returns each letter with its size in bytes.
fn one_letter_for_each_poison_record(
    given: &LargeRecordsTopic,
    records: &PoisonRecords,
) -> Vec<(usize, DeadLetter)> {
    let payloads = &records.payloads;
    let letters: Vec<(usize, DeadLetter)> = given
        .env
        .read_topic("extraction.dlq")
        .into_iter()
        .map(|(_, value)| (value.len(), decode(&value).unwrap()))
        .collect();
    assert_eq!(letters.len(), 2, "one letter for each poison record");
    let sizes: Vec<i64> = letters.iter().map(|(_, l)| l.payload_size).collect();
    assert_eq!(
        sizes,
        [payloads[0].len() as i64, payloads[1].len() as i64],
        "the letters tell the records' sizes"
    );
    let kinds: Vec<&str> = letters.iter().map(|(_, l)| l.error_kind.as_str()).collect();
    assert_eq!(kinds, ["invalid_request", "undecodable"]);
    letters
}

/// Each letter carries its record's SHA-256 and is under 32 KiB.
fn each_letter_has_its_records_digest_and_is_bounded(
    letters: &[(usize, DeadLetter)],
    records: &PoisonRecords,
) {
    for ((bytes, letter), payload) in letters.iter().zip(&records.payloads) {
        use sha2::Digest;
        let digest: String = sha2::Sha256::digest(payload)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(letter.payload_sha256, digest);
        assert!(*bytes < 32 * 1024, "a letter of {bytes} bytes");
    }
}

/// The poison test's report line.
fn report_the_poison(records: &PoisonRecords, letters: &[(usize, DeadLetter)], last: i64) {
    let payloads = &records.payloads;
    eprintln!(
        "limits poison: records of {} and {} bytes gave letters of {} and {} bytes; the good \
         record behind them became a job and the commit passed offset {last}",
        payloads[0].len(),
        payloads[1].len(),
        letters[0].0,
        letters[1].0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_poison_records_get_one_bounded_letter_each_and_the_partition_flows_on() {
    let given = a_requests_topic_open_to_16_mib_records().await;
    let records = two_oversized_poison_records_then_a_good_one(&given).await;
    let mut children = [given.env.spawn("intake", &[], "limits-poison-intake")];
    let last = the_good_record_becomes_a_job_and_the_commit_passes_it(&given, &records).await;
    let letters = one_letter_for_each_poison_record(&given, &records);
    each_letter_has_its_records_digest_and_is_bounded(&letters, &records);
    report_the_poison(&records, &letters, last);
    stop(&mut children).await;
}

/// A `serve` with small caps, and its address.
struct Capped {
    env: TestEnv,
    addr: String,
    children: [Child; 1],
}

/// How a slowloris client fared: when it was cut off, after how many header
/// lines, and its connection (kept until the test ends).
struct Slowloris {
    cut_after: Duration,
    lines: i32,
    _socket: TcpStream,
}

/// A `serve` allowing 2 export streams, 3 sockets per tenant and 8
/// connections, and 1 s to send a request's headers.
async fn a_server_with_small_caps() -> Capped {
    let env = TestEnv::new("limits_caps").await;
    let caps = [
        ("DOCSTREAM_MAX_EXPORT_STREAMS", "2".to_owned()),
        ("DOCSTREAM_MAX_SOCKETS_PER_TENANT", "3".to_owned()),
        ("DOCSTREAM_HTTP_MAX_CONNECTIONS", "8".to_owned()),
        ("DOCSTREAM_HTTP_HEADER_READ_TIMEOUT_S", "1".to_owned()),
    ];
    let (serve, addr, _) = spawn_serve(&env, &caps, "limits-caps-serve");
    let children = [serve];
    wait_healthy(&format!("http://{addr}")).await;
    Capped {
        env,
        addr,
        children,
    }
}

/// The HTTP status a WebSocket handshake was refused with; panics, saying
/// `what` was not refused, if it was not.
fn refused_status(
    attempt: Result<(Socket, WsResponse), tokio_tungstenite::tungstenite::Error>,
    what: &str,
) -> u16 {
    match attempt {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        other => panic!("{what} was not refused: {:?}", other.map(|_| ())),
    }
}

/// Export streams: two open, the third refused with 503. Returns the two.
async fn two_export_streams_open_and_a_third_is_refused_503(capped: &Capped) -> Vec<Socket> {
    let (env, addr) = (&capped.env, &capped.addr);
    let export = |n: usize| format!("ws://{addr}/v1/export?group=caps-{n}");
    let mut open = Vec::new();
    for n in 0..2 {
        let (socket, _) = tokio_tungstenite::connect_async(env.ws_request(&export(n)))
            .await
            .unwrap();
        open.push(socket);
    }
    let refused = tokio_tungstenite::connect_async(env.ws_request(&export(2))).await;
    let status = refused_status(refused, "the third export stream");
    assert_eq!(status, 503);
    open
}

/// Sockets per tenant: with two exports open, one import fits (it joins
/// `open`), the next gets 429.
async fn one_import_fits_beside_them_and_the_next_gets_429(
    capped: &Capped,
    open: &mut Vec<Socket>,
) {
    let env = &capped.env;
    let import = format!("ws://{}/v1/import", capped.addr);
    let (third, _) = tokio_tungstenite::connect_async(env.ws_request(&import))
        .await
        .unwrap();
    open.push(third);
    let refused = tokio_tungstenite::connect_async(env.ws_request(&import)).await;
    let tenant_status = refused_status(refused, "the fourth socket");
    assert_eq!(tenant_status, 429);
}

/// Connections: once the closed sockets' connections end, the cap filled
/// with idle connections, the next one is answered 503
/// (`too_many_connections`) and closed. Returns that answer.
async fn past_the_connection_cap_the_next_is_answered_503(capped: &Capped) -> String {
    let addr = &capped.addr;
    let connections = wait_for(
        "the closed sockets' connections to end",
        Duration::from_secs(10),
        || {
            let addr = addr.clone();
            async move {
                let mut held = Vec::new();
                for _ in 0..8 {
                    held.push(TcpStream::connect(&addr).await.map_err(|e| e.to_string())?);
                }
                let mut extra = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
                let mut answer = String::new();
                let read =
                    tokio::time::timeout(Duration::from_secs(2), extra.read_to_string(&mut answer));
                match read.await {
                    Ok(Ok(_)) if answer.starts_with("HTTP/1.1 503") => Ok((held, answer)),
                    other => Err(format!("the ninth connection got {other:?}: {answer:?}")),
                }
            }
        },
    )
    .await;
    let (held, answer) = connections;
    assert!(answer.contains("too_many_connections"), "{answer}");
    drop(held);
    answer
}

/// A slowloris client: once it has a connection, it trickles a header line
/// every 200 ms until it is cut off (within 10 s).
async fn a_slowloris_trickles_its_headers(capped: &Capped) -> Slowloris {
    let addr = &capped.addr;
    let mut slow = wait_for("a connection slot", Duration::from_secs(10), || {
        let addr = addr.clone();
        async move { TcpStream::connect(&addr).await.map_err(|e| e.to_string()) }
    })
    .await;
    let started = Instant::now();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut lines = 0;
    let cut_after = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let written = slow
            .write_all(format!("x-slow-{lines}: 1\r\n").as_bytes())
            .await;
        lines += 1;
        let mut probe = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await;
        let closed = matches!(closed, Ok(Ok(0)) | Ok(Err(_)));
        if written.is_err() || closed {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the slowloris was never cut off"
        );
    };
    Slowloris {
        cut_after,
        lines,
        _socket: slow,
    }
}

/// The slowloris was cut off after the 1 s header-read timeout, not long past it.
fn it_was_cut_off_after_the_header_read_timeout(slowloris: &Slowloris) {
    let cut_after = slowloris.cut_after;
    assert!(
        cut_after >= Duration::from_millis(900),
        "cut after {cut_after:?}"
    );
    assert!(
        cut_after < Duration::from_secs(3),
        "cut after {cut_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_connections_past_their_caps_are_refused_and_a_slowloris_is_cut_off() {
    let _machine = MACHINE.lock().await;
    let mut capped = a_server_with_small_caps().await;
    let mut open = two_export_streams_open_and_a_third_is_refused_503(&capped).await;
    one_import_fits_beside_them_and_the_next_gets_429(&capped, &mut open).await;
    drop(open);
    let answer = past_the_connection_cap_the_next_is_answered_503(&capped).await;
    let slowloris = a_slowloris_trickles_its_headers(&capped).await;
    it_was_cut_off_after_the_header_read_timeout(&slowloris);
    eprintln!(
        "limits caps: third export stream 503, fourth socket of the tenant 429, ninth connection \
         503 ({}), slowloris cut off after {:?} and {} header lines",
        answer.lines().next().unwrap_or_default(),
        slowloris.cut_after,
        slowloris.lines
    );
    stop(&mut capped.children).await;
}

/// The ways a connection can sit without a request: silent from the start,
/// stopped half-way through the HTTP/2 preface (before the server can even
/// tell which protocol it speaks), and a whole HTTP/2 preface and SETTINGS
/// with no stream after them.
const IDLE_KINDS: [(&str, &[u8]); 3] = [
    ("silent", b""),
    ("half an HTTP/2 preface", b"PRI * HTTP/2.0\r\n"),
    (
        "an HTTP/2 preface and nothing after",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    ),
];

/// Sockets that fill the default connection cap.
const IDLE_SOCKETS: usize = 4096;

/// One `GET /healthz` on a connection of its own: the answer's text.
async fn one_request(addr: &str) -> String {
    let exchange = async {
        let mut socket = TcpStream::connect(addr).await?;
        let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        socket.write_all(request).await?;
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await?;
        std::io::Result::Ok(answer)
    };
    match tokio::time::timeout(Duration::from_secs(2), exchange).await {
        Ok(Ok(answer)) => answer,
        other => format!("{other:?}"),
    }
}

/// How an idle socket ended.
enum IdleEnd {
    /// Closed by the server this long after it opened.
    Closed(Duration),
    /// Refused at once: the cap was full when it came (a probe held a slot).
    Refused,
    /// Still open 15 s after it opened.
    Open,
}

/// Opens a socket to `addr` and sends `bytes`; the task it returns reads
/// until the server closes it. Sockets are opened one at a time: a burst
/// of connects overflows the listen backlog, and the dropped ones retry
/// seconds later, past the idle limit of the first.
async fn an_idle_socket(addr: &str, bytes: &'static [u8]) -> impl Future<Output = IdleEnd> {
    let opened = Instant::now();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(bytes).await.unwrap();
    async move {
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(15), socket.read_to_end(&mut sink));
        match read.await {
            Err(_) => IdleEnd::Open,
            Ok(_) if sink.starts_with(b"HTTP/1.1 503") => IdleEnd::Refused,
            Ok(_) => IdleEnd::Closed(opened.elapsed()),
        }
    }
}

/// 4,096 connections that never send a request, a third of each kind in
/// [`IDLE_KINDS`], against a `serve` with its default cap (4,096) and a 5 s
/// idle limit: once they fill the cap (a request is answered
/// `too_many_connections`), a real client is served within 8 s, and each is
/// closed past the limit and within 8 s of opening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_open_connections_are_closed_at_the_idle_limit_and_a_real_client_is_served() {
    let _machine = MACHINE.lock().await;
    let env = TestEnv::new("limits_idle").await;
    let idle = [("DOCSTREAM_HTTP_HEADER_READ_TIMEOUT_S", "5".to_owned())];
    let (mut serve, addr, _) = spawn_serve(&env, &idle, "limits-idle-serve");
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    let started = Instant::now();
    let mut sockets = tokio::task::JoinSet::new();
    for i in 0..IDLE_SOCKETS {
        let (_, bytes) = IDLE_KINDS[i % IDLE_KINDS.len()];
        let until_closed = an_idle_socket(&addr, bytes).await;
        sockets.spawn(until_closed.map(move |end| (i, end)));
    }
    let opened = started.elapsed();
    let full = wait_for("the cap to be full", Duration::from_secs(2), || {
        let addr = addr.clone();
        async move {
            match one_request(&addr).await {
                answer if answer.contains("too_many_connections") => Ok(Instant::now()),
                answer => Err(answer),
            }
        }
    })
    .await;
    let served = wait_for(
        "a real client to be served",
        Duration::from_secs(10),
        || {
            let addr = addr.clone();
            async move {
                match one_request(&addr).await {
                    answer if answer.starts_with("HTTP/1.1 200") => Ok(full.elapsed()),
                    answer => Err(answer),
                }
            }
        },
    )
    .await;
    let mut closed_after: Vec<Vec<Duration>> = vec![Vec::new(); IDLE_KINDS.len()];
    let mut refused = 0;
    while let Some(joined) = sockets.join_next().await {
        let (i, end) = joined.unwrap();
        let (kind, _) = IDLE_KINDS[i % IDLE_KINDS.len()];
        match end {
            IdleEnd::Closed(after) => closed_after[i % IDLE_KINDS.len()].push(after),
            IdleEnd::Refused => refused += 1,
            IdleEnd::Open => panic!("a socket ({kind}) was still open after 15 s"),
        }
    }
    assert!(
        refused < 16,
        "{refused} idle sockets were refused, not held"
    );
    let mut report = Vec::new();
    for (k, times) in closed_after.iter().enumerate() {
        let (kind, _) = IDLE_KINDS[k];
        let first = times.iter().min().unwrap();
        let last = times.iter().max().unwrap();
        assert!(
            *first >= Duration::from_millis(4900),
            "{kind}: closed after {first:?}"
        );
        assert!(
            *last < Duration::from_secs(8),
            "{kind}: closed after {last:?}"
        );
        report.push(format!(
            "{kind}: {} closed after {first:?}..{last:?}",
            times.len()
        ));
    }
    assert!(
        served < Duration::from_secs(8),
        "a real client waited {served:?}"
    );
    eprintln!(
        "limits idle: {IDLE_SOCKETS} opened in {opened:?}; {}; {refused} refused while probes \
         held slots; with the cap full of them, a real client was served after {served:?}",
        report.join("; ")
    );
    stop([&mut serve]).await;
}

/// A valid pattern the compiler takes long over (5 ms in a release build
/// here): a Unicode class repeated until the program nears its 1 MiB limit
/// (`\w{30}` is past it, and refused in as long, but a refusal stops a
/// request's validation). `n` makes each one new, so no cache helps.
fn a_slow_to_compile_pattern(n: usize) -> String {
    format!(r"\w{{20}}x{n}")
}

/// Clients sending requests of new slow-to-compile patterns, and the
/// seconds they send for.
const PATTERN_CLIENTS: usize = 8;
const PATTERN_SECONDS: u64 = 5;

/// Each client's answers, by status.
type Statuses = HashMap<u16, usize>;

/// One client: requests of 100 new slow-to-compile patterns, one after the
/// other, until `until`.
async fn a_client_sends_new_patterns(
    client: reqwest::Client,
    base: String,
    next: Arc<AtomicUsize>,
    until: Instant,
) -> Statuses {
    let mut statuses = Statuses::new();
    while Instant::now() < until {
        let fields: Vec<serde_json::Value> = (0..100)
            .map(|i| {
                let n = next.fetch_add(1, Ordering::Relaxed);
                serde_json::json!({"name": format!("f{i}"), "pattern": a_slow_to_compile_pattern(n)})
            })
            .collect();
        let body = serde_json::json!({"document": {"text": "Total 12.50"}, "fields": fields});
        let answer = client
            .post(format!("{base}/v1/extractions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        *statuses.entry(answer.status().as_u16()).or_default() += 1;
    }
    statuses
}

/// 8 clients send requests of 100 patterns the process has never seen, each
/// slow to compile, for 5 s; `/healthz`, probed every 50 ms meanwhile,
/// always answers within 500 ms, half a liveness probe's usual timeout (the
/// patterns compile on blocking threads of their own, not on the runtime
/// threads that answer it; compiled on the runtime, they held it for 1.9 s),
/// and every submit is answered: 202, or 503 when the pool could not compile
/// its patterns within the answer bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_slow_to_compile_patterns_leave_healthz_fast() {
    let _machine = MACHINE.lock().await;
    let env = TestEnv::new("limits_patterns").await;
    let (mut serve, addr, _) = spawn_serve(&env, &[], "limits-patterns-serve");
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    let until = Instant::now() + Duration::from_secs(PATTERN_SECONDS);
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..PATTERN_CLIENTS)
        .map(|_| {
            let sent = a_client_sends_new_patterns(env.client(), base.clone(), next.clone(), until);
            tokio::spawn(sent)
        })
        .collect();
    let probe = common::http_client();
    let (mut slowest, mut probes) = (Duration::ZERO, 0);
    while Instant::now() < until {
        slowest = slowest.max(a_healthz_answer_time(&probe, &base).await);
        probes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Statuses::new();
    for client in clients {
        for (status, n) in client.await.unwrap() {
            *statuses.entry(status).or_default() += n;
        }
    }
    let compiled = next.load(Ordering::Relaxed);
    eprintln!(
        "limits patterns: {PATTERN_CLIENTS} clients sent {compiled} new patterns in {PATTERN_SECONDS} s \
         (answers {statuses:?}); /healthz slowest of {probes}: {slowest:?}"
    );
    assert!(
        statuses.keys().all(|s| [202, 503].contains(s)),
        "{statuses:?}"
    );
    assert!(
        slowest < Duration::from_millis(500),
        "/healthz took {slowest:?}"
    );
    stop([&mut serve]).await;
}

/// A stream whose client never reads answers no ping: silent export and
/// import streams hold two of a tenant's three sockets, beside an export
/// stream whose client reads (and so answers each ping). With a ping every
/// second, the silent two are closed within seconds (the tenant can open
/// two sockets again), and the reading one stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_whose_clients_answer_no_ping_are_closed_and_free_their_sockets() {
    let env = TestEnv::new("limits_ping").await;
    let settings = [
        ("DOCSTREAM_WS_PING_INTERVAL_S", "1".to_owned()),
        ("DOCSTREAM_MAX_SOCKETS_PER_TENANT", "3".to_owned()),
    ];
    let (mut serve, addr, _) = spawn_serve(&env, &settings, "limits-ping-serve");
    wait_healthy(&format!("http://{addr}")).await;
    let export = |group: &str| format!("ws://{addr}/v1/export?group={group}");
    let import = format!("ws://{addr}/v1/import");
    let open = |url: String| tokio_tungstenite::connect_async(env.ws_request(&url));
    let (silent_export, _) = open(export("silent")).await.unwrap();
    let (silent_import, _) = open(import.clone()).await.unwrap();
    let (mut reading, _) = open(export("reading")).await.unwrap();
    let opened = Instant::now();
    let reader = tokio::spawn(async move {
        // Reading answers the pings; the stream ends only if the server closes it.
        while let Some(Ok(frame)) = reading.next().await {
            if let Message::Close(close) = frame {
                return Some(close);
            }
        }
        None
    });
    // One socket per try: a refused handshake leaves nothing open behind it.
    let mut two_more = Vec::new();
    for url in [import.clone(), export("again")] {
        let socket = wait_for(
            "a silent stream's socket to be freed",
            Duration::from_secs(15),
            || {
                let url = url.clone();
                async move {
                    open(url)
                        .await
                        .map(|(socket, _)| socket)
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await;
        two_more.push(socket);
    }
    let freed_after = opened.elapsed();
    assert!(
        freed_after >= Duration::from_secs(2),
        "freed after {freed_after:?}"
    );
    assert!(
        !reader.is_finished(),
        "the reading stream was closed: {:?}",
        reader.await
    );
    eprintln!(
        "limits ping: with a ping each second, the silent export and import streams' sockets \
         were free {freed_after:?} after they opened; the reading stream stayed open"
    );
    reader.abort();
    drop((silent_export, silent_import, two_more));
    stop([&mut serve]).await;
}

/// Reads `socket` (answering its pings) until the server closes it: the
/// close frame, and when it came.
async fn until_closed(mut socket: Socket) -> Option<(CloseFrame, Instant)> {
    while let Some(Ok(frame)) = socket.next().await {
        if let Message::Close(close) = frame {
            return close.map(|c| (c, Instant::now()));
        }
    }
    None
}

/// An export and an import stream opened with a key that is then revoked
/// are closed with 1008 (policy violation) within seconds: the streams look
/// their key up again at each ping (every second here), through the key
/// cache (1 s here, 2 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_whose_key_is_revoked_are_closed_with_1008() {
    let env = TestEnv::new("limits_revoked").await;
    let settings = [
        ("DOCSTREAM_WS_PING_INTERVAL_S", "1".to_owned()),
        ("DOCSTREAM_API_KEY_CACHE_S", "1".to_owned()),
    ];
    let (mut serve, addr, _) = spawn_serve(&env, &settings, "limits-revoked-serve");
    wait_healthy(&format!("http://{addr}")).await;
    let mut closes = Vec::new();
    for url in [
        format!("ws://{addr}/v1/export?group=revoked"),
        format!("ws://{addr}/v1/import"),
    ] {
        let (socket, _) = tokio_tungstenite::connect_async(env.ws_request(&url))
            .await
            .unwrap();
        closes.push(tokio::spawn(until_closed(socket)));
    }
    let prefix: String = env.api_key.chars().take(12).collect();
    let key_id: Uuid = sqlx::query_scalar("SELECT id FROM api_keys WHERE prefix = $1")
        .bind(&prefix)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    docstream::store::tenants::revoke_key(&env.pool, key_id)
        .await
        .unwrap();
    let revoked = Instant::now();
    let mut after = Vec::new();
    for close in closes {
        let closed = tokio::time::timeout(Duration::from_secs(15), close).await;
        let (frame, at) = closed
            .expect("closed within 15 s")
            .unwrap()
            .expect("a close frame");
        assert_eq!(u16::from(frame.code), 1008, "{frame:?}");
        after.push(at.duration_since(revoked));
    }
    eprintln!("limits revoked: the export and import streams were closed with 1008 {after:?} after the key was revoked");
    stop([&mut serve]).await;
}

/// Past its admission limit, `serve` refuses a submit at once with `503
/// overloaded` and `Retry-After`, while the admitted ones are still under
/// way, and writes nothing for it; once they are answered, the next is
/// admitted. (The limit is pinned at 2, and each admitted submit is held
/// after its INSERT by a failpoint.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_admission_limit_a_submit_is_refused_at_once_and_nothing_is_written() {
    let env = TestEnv::new("limits_admission").await;
    let pinned = [
        ("DOCSTREAM_SUBMIT_MIN_IN_FLIGHT", "2".to_owned()),
        ("DOCSTREAM_SUBMIT_MAX_IN_FLIGHT", "2".to_owned()),
        // Held long enough that the refusal surely comes first on a loaded
        // machine, within a bound that does not answer them 503 first.
        (
            "DOCSTREAM_FAILPOINTS",
            "submit.after_insert=sleep(5000)".to_owned(),
        ),
        ("DOCSTREAM_HTTP_ANSWER_TIMEOUT_S", "10".to_owned()),
    ];
    let (mut serve, addr, metrics) = spawn_serve(&env, &pinned, "limits-admission-serve");
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    let client = env.client();
    let submit = |i: usize| {
        let request = client
            .post(format!("{base}/v1/extractions"))
            .json(&common::sample_body(i));
        async move { request.send().await.unwrap() }
    };

    // Two submits are admitted and held after their INSERT.
    let held: Vec<_> = (0..2).map(|i| tokio::spawn(submit(i))).collect();
    let rows = "SELECT count(*) FROM extractions";
    wait_count(
        &env.pool,
        "the two held rows",
        rows,
        2,
        Duration::from_secs(30),
    )
    .await;

    // A third is refused while both are still held.
    let refused = submit(2).await;
    assert!(
        held.iter().all(|h| !h.is_finished()),
        "the refusal came after an admitted submit was answered"
    );
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");

    // The held ones are accepted; nothing was written for the refused one.
    for answer in held {
        assert_eq!(answer.await.unwrap().status(), 202);
    }
    assert_eq!(common::count(&env.pool, rows).await, 2);
    let refusals = scrape(&metrics, "docstream_submit_overload_rejections_total").await;
    assert_eq!(refusals, 1.0);

    // With room again, the next submit is admitted.
    assert_eq!(submit(3).await.status(), 202);
    stop([&mut serve]).await;
}

/// At its admission limit, `serve` shares the limit between tenants by
/// their weights: tenant A floods past the limit and gets the 503s, while
/// tenant B, submitting at 10/s meanwhile, is admitted every time. (The
/// limit is pinned at 8 and each admitted submit is held 200 ms after its
/// INSERT by a failpoint, so A's flood keeps the limit full; B's submits,
/// two in flight at 10/s, stay under its share of 4.) With one limit for
/// everyone, B's submits met a full limit and were refused like A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_takes_the_refusals_and_another_is_still_admitted() {
    let env = TestEnv::new("limits_fair_admission").await;
    let pinned = [
        ("DOCSTREAM_SUBMIT_MIN_IN_FLIGHT", "8".to_owned()),
        ("DOCSTREAM_SUBMIT_MAX_IN_FLIGHT", "8".to_owned()),
        (
            "DOCSTREAM_FAILPOINTS",
            "submit.after_insert=sleep(200)".to_owned(),
        ),
        // The flood meets the admission limit, not the tenant's rate.
        ("DOCSTREAM_TENANT_SUBMIT_RATE_PER_S", "0".to_owned()),
    ];
    let (mut serve, addr, metrics) = spawn_serve(&env, &pinned, "limits-fair-serve");
    let base = format!("http://{addr}");
    wait_healthy(&base).await;
    let b_key = docstream::store::tenants::create_tenant(&env.pool, "fair-b")
        .await
        .unwrap()
        .key
        .api_key;

    // A: 16 submitters, each sending its next as soon as the last is
    // answered (10 ms after a refusal).
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let a_refused = Arc::new(AtomicUsize::new(0));
    let a_accepted = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..16)
        .map(|n| {
            let (client, url) = (env.client(), format!("{base}/v1/extractions"));
            let (flooding, refused) = (flooding.clone(), a_refused.clone());
            let accepted = a_accepted.clone();
            tokio::spawn(async move {
                let mut i = n * 100_000;
                while flooding.load(Ordering::Relaxed) {
                    i += 1;
                    let body = common::sample_body(i);
                    let answer = client.post(&url).json(&body).send().await.unwrap();
                    match answer.status().as_u16() {
                        202 => accepted.fetch_add(1, Ordering::Relaxed),
                        503 => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            refused.fetch_add(1, Ordering::Relaxed)
                        }
                        other => panic!("A's submit answered {other}"),
                    };
                }
            })
        })
        .collect();
    let refusals = "docstream_submit_overload_rejections_total";
    wait_for("A's flood to be refused", Duration::from_secs(30), || {
        let metrics = metrics.clone();
        async move {
            match scrape(&metrics, refusals).await {
                n if n >= 20.0 => Ok(()),
                n => Err(format!("{n} refusals")),
            }
        }
    })
    .await;

    // B: 30 submits at 10/s, each on its own, so the rate holds whatever
    // the answers' timing.
    let a_refused_before = a_refused.load(Ordering::Relaxed);
    let b_client = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut b_submits = Vec::new();
    for i in 0..30 {
        tick.tick().await;
        let request = b_client
            .post(format!("{base}/v1/extractions"))
            .bearer_auth(&b_key)
            .json(&common::sample_body(i));
        b_submits.push(tokio::spawn(async move {
            let answer = request.send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap())
        }));
    }
    let mut b_answers = Vec::new();
    for submit in b_submits {
        b_answers.push(submit.await.unwrap());
    }
    let a_refused_meanwhile = a_refused.load(Ordering::Relaxed) - a_refused_before;
    flooding.store(false, Ordering::Relaxed);
    for submitter in flood {
        submitter.await.unwrap();
    }

    let b_refused: Vec<_> = b_answers
        .iter()
        .filter(|(status, _)| *status != 202)
        .collect();
    eprintln!(
        "limits fair admission: while B sent 30 submits at 10/s, A had {a_refused_meanwhile} \
         refused ({} accepted, {} refused in all); B had {} refused",
        a_accepted.load(Ordering::Relaxed),
        a_refused.load(Ordering::Relaxed),
        b_refused.len()
    );
    assert!(
        a_refused_meanwhile >= 30,
        "A's flood was not past the limit while B submitted: {a_refused_meanwhile} refusals"
    );
    assert!(b_refused.is_empty(), "B was refused: {b_refused:?}");
    let b_tenant: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM extractions e JOIN tenants t ON t.id = e.tenant_id
         WHERE t.name = 'fair-b'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(b_tenant, 30, "B's accepted submits are its rows");
    stop([&mut serve]).await;
}

/// An HTTP/1.1 request written by hand on a connection of its own, so a
/// test can send its headers and hold back its body; and the answers read
/// off it (an interim `100 Continue` is one).
struct RawRequest {
    socket: TcpStream,
    /// What was read and not yet taken as an answer.
    read: Vec<u8>,
}

/// One answer on a [`RawRequest`]'s connection.
#[derive(Debug)]
struct RawAnswer {
    status: u16,
    head: String,
    body: String,
}

/// The form's boundary of the hand-written multipart submits.
const BOUNDARY: &str = "docstream-raw-boundary";

/// The opening of a multipart submit's `file` part, whose bytes follow.
fn file_part_opening() -> String {
    format!(
        "--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         content-type: text/plain\r\n\r\n"
    )
}

impl RawRequest {
    /// Sends the headers of `POST path` with `key`, declaring `length` bytes
    /// of `content_type` and asking to be told to go on (`Expect:
    /// 100-continue`): the server says `100 Continue` once it reads the body.
    async fn post(addr: &str, key: &str, path: &str, content_type: &str, length: u64) -> Self {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: docstream\r\nauthorization: Bearer {key}\r\n\
             content-type: {content_type}\r\ncontent-length: {length}\r\n\
             expect: 100-continue\r\n\r\n"
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        Self {
            socket,
            read: Vec::new(),
        }
    }

    /// A multipart submit declaring `length` bytes.
    async fn multipart_submit(addr: &str, key: &str, length: u64) -> Self {
        let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
        Self::post(addr, key, "/v1/extractions", &content_type, length).await
    }

    /// Writes `bytes` of the body; a connection the server closed takes
    /// none, which the answer read next shows.
    async fn send(&mut self, bytes: &[u8]) {
        let _ = self.socket.write_all(bytes).await;
    }

    /// The next answer, if a whole one arrives within `bound`.
    async fn answer(&mut self, bound: Duration) -> Option<RawAnswer> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if let Some(answer) = self.take_answer() {
                return Some(answer);
            }
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout_at(deadline, self.socket.read(&mut chunk)).await;
            match read {
                Ok(Ok(n)) if n > 0 => self.read.extend_from_slice(&chunk[..n]),
                // Closed, failed or out of time, with no whole answer.
                _ => return None,
            }
        }
    }

    /// Whether an answer (or the end of the connection) is already waiting,
    /// without waiting for one.
    fn answered(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.socket.try_read(&mut chunk) {
            Ok(n) => {
                self.read.extend_from_slice(&chunk[..n]);
                true
            }
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }

    /// A whole answer off the front of what was read, if there is one.
    fn take_answer(&mut self) -> Option<RawAnswer> {
        let end = self.read.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = String::from_utf8_lossy(&self.read[..end]).into_owned();
        let length = head
            .lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, value)| value.trim().parse::<usize>().unwrap());
        if self.read.len() < end + length {
            return None;
        }
        let body = String::from_utf8_lossy(&self.read[end..end + length]).into_owned();
        self.read.drain(..end + length);
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some(RawAnswer { status, head, body })
    }
}

impl RawAnswer {
    /// The value of header `name`, if the answer has it.
    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.trim())
    }

    /// The error code of its JSON body.
    fn code(&self) -> String {
        let body: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_default();
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// A `serve` process with `settings`, healthy: the child, its address and
/// its metrics address.
async fn serve_with(
    env: &TestEnv,
    settings: &[(&str, &str)],
    log: &str,
) -> (Child, String, String) {
    let settings: Vec<(&str, String)> = settings
        .iter()
        .map(|(name, value)| (*name, (*value).to_owned()))
        .collect();
    let (serve, addr, metrics) = spawn_serve(env, &settings, log);
    wait_healthy(&format!("http://{addr}")).await;
    (serve, addr, metrics)
}

/// An upload whose body trickles in, a byte every 100 ms, is answered 408
/// once the body timeout (1 s here) has passed, whether it is a file
/// (`POST /v1/files`) or a multipart submit, and its connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_body_trickles_gets_408_at_the_body_timeout() {
    let env = TestEnv::new("limits_body_timeout").await;
    let timeout = [("DOCSTREAM_HTTP_BODY_TIMEOUT_S", "1")];
    let (mut serve, addr, metrics) = serve_with(&env, &timeout, "limits-body-timeout").await;
    let key = &env.api_key;
    for n in 0..2 {
        // One at a time: the timeout runs from when the body's reading begins.
        let mut upload = match n {
            0 => RawRequest::post(&addr, key, "/v1/files", "text/plain", 100_000).await,
            _ => RawRequest::multipart_submit(&addr, key, 100_000).await,
        };
        let go_on = upload.answer(Duration::from_secs(10)).await;
        assert_eq!(go_on.map(|a| a.status), Some(100), "upload {n}");
        let started = Instant::now();
        if n == 1 {
            upload.send(file_part_opening().as_bytes()).await;
        }
        let answer = loop {
            upload.send(b"x").await;
            if let Some(answer) = upload.answer(Duration::from_millis(100)).await {
                break answer;
            }
            let waited = started.elapsed();
            assert!(
                waited < Duration::from_secs(15),
                "upload {n}: no answer after {waited:?} of a trickling body"
            );
        };
        let waited = started.elapsed();
        assert_eq!(answer.status, 408, "upload {n}: {answer:?}");
        assert_eq!(answer.code(), "body_timeout", "{answer:?}");
        assert_eq!(answer.header("connection"), Some("close"), "{answer:?}");
        assert!(
            waited >= Duration::from_millis(900),
            "upload {n}: {waited:?}"
        );
        assert!(waited < Duration::from_secs(5), "upload {n}: {waited:?}");
        eprintln!("limits body timeout: upload {n} answered 408 after {waited:?}");
    }
    let refused = "docstream_upload_refusals_total{reason=\"body_timeout\"}";
    assert_eq!(scrape(&metrics, refused).await, 2.0);
    stop([&mut serve]).await;
}

/// A tenant with as many uploads in progress as its cap (2 here) gets 429
/// with `Retry-After` for the next, a file or a multipart submit, while
/// another tenant's upload is served; once one of its own ends, its next
/// upload is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_upload_cap_a_tenants_next_upload_gets_429_and_another_tenants_is_served() {
    let env = TestEnv::new("limits_upload_cap").await;
    let caps = [
        ("DOCSTREAM_TENANT_MAX_UPLOADS", "2"),
        ("DOCSTREAM_HTTP_BODY_TIMEOUT_S", "60"),
    ];
    let (mut serve, addr, metrics) = serve_with(&env, &caps, "limits-upload-cap").await;
    let base = format!("http://{addr}");
    let key = &env.api_key;
    let mut held = vec![
        RawRequest::post(&addr, key, "/v1/files", "text/plain", 100_000).await,
        RawRequest::multipart_submit(&addr, key, 100_000).await,
    ];
    for upload in &mut held {
        let go_on = upload.answer(Duration::from_secs(10)).await;
        assert_eq!(
            go_on.map(|a| a.status),
            Some(100),
            "a held upload reads its body"
        );
    }

    let client = env.client();
    let upload = |text: String, key: String| {
        let request = client
            .post(format!("{base}/v1/files"))
            .header("content-type", "text/plain")
            .header("authorization", format!("Bearer {key}"))
            .body(text);
        async move { request.send().await.unwrap() }
    };
    let refused = upload("one more file".into(), key.clone()).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("most uploads in progress (2,"),
        "{message}"
    );
    let mut submit = RawRequest::multipart_submit(&addr, key, 100_000).await;
    let answer = submit.answer(Duration::from_secs(10)).await.unwrap();
    assert_eq!(answer.status, 429, "{answer:?}");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");

    let created = env.run_cli(&["tenants", "create", "other"]).await;
    let created: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let other_key = created["api_key"].as_str().unwrap().to_owned();
    let others = upload("another tenant's file".into(), other_key).await;
    assert_eq!(others.status(), 201);

    drop(held.pop());
    let mut n = 0;
    wait_for("an upload slot freed", Duration::from_secs(10), || {
        n += 1;
        let sent = upload(format!("a file once a slot is free {n}"), key.clone());
        async move {
            match sent.await.status().as_u16() {
                201 => Ok(()),
                status => Err(format!("answered {status}")),
            }
        }
    })
    .await;
    let refusals = "docstream_upload_refusals_total{reason=\"tenant_cap\"}";
    assert!(scrape(&metrics, refusals).await >= 2.0);
    drop(held);
    stop([&mut serve]).await;
}

/// A body declared past its route's limit is refused 413 from its headers
/// alone: the server answers at once, without asking for a byte of it
/// (no `100 Continue`), on each route that takes a body that large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_past_the_limit_gets_413_before_a_byte_is_read() {
    let env = TestEnv::new("limits_declared_length").await;
    let (mut serve, addr, _) = serve_with(&env, &[], "limits-declared-length").await;
    let key = &env.api_key;
    let huge = 1u64 << 40;
    let multipart = format!("multipart/form-data; boundary={BOUNDARY}");
    let routes = [
        ("/v1/files", "application/pdf"),
        ("/v1/extractions", multipart.as_str()),
        ("/v1/extractions", "application/json"),
    ];
    for (path, content_type) in routes {
        let mut request = RawRequest::post(&addr, key, path, content_type, huge).await;
        let answer = request.answer(Duration::from_secs(5)).await;
        let answer = answer.unwrap_or_else(|| panic!("{path} ({content_type}): no answer in 5 s"));
        assert_eq!(answer.status, 413, "{path} ({content_type}): {answer:?}");
        assert_eq!(answer.code(), "payload_too_large", "{answer:?}");
    }
    stop([&mut serve]).await;
}

/// Tenant A's 300 slow uploads (multipart submits that stall after their
/// first bytes) leave tenant B's JSON submits answered 202, never 503
/// `overloaded`: past its upload cap A's uploads get 429 at once, and the
/// ones in progress hold no admission permit while their bytes move. Once
/// they are abandoned, the admission limit has not been cut for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_300_slow_uploads_leave_another_tenants_submits_answered_202() {
    let _machine = MACHINE.lock().await;
    let env = TestEnv::new("limits_slow_uploads").await;
    let settings = [
        ("DOCSTREAM_HTTP_BODY_TIMEOUT_S", "60"),
        // B's submits are answered by their row, not cut short by the
        // answer bound on a loaded machine.
        ("DOCSTREAM_HTTP_ANSWER_TIMEOUT_S", "10"),
    ];
    let (mut serve, addr, metrics) = serve_with(&env, &settings, "limits-slow-uploads").await;
    let created = env.run_cli(&["tenants", "create", "tenant-b"]).await;
    let created: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let b_key = created["api_key"].as_str().unwrap().to_owned();

    // A's uploads: each either reads its body (100 Continue) and stalls
    // after its first bytes, or is refused.
    let mut uploads = Vec::new();
    for _ in 0..300 {
        uploads.push(RawRequest::multipart_submit(&addr, &env.api_key, 1_000_000).await);
    }
    let (mut stalled, mut refused) = (Vec::new(), HashMap::<u16, usize>::new());
    for mut upload in uploads {
        let answer = upload.answer(Duration::from_secs(60)).await;
        let answer = answer.expect("an answer to each upload's headers");
        if answer.status == 100 {
            upload.send(file_part_opening().as_bytes()).await;
            upload.send(b"the first bytes of a slow file").await;
            stalled.push(upload);
        } else {
            *refused.entry(answer.status).or_default() += 1;
        }
    }

    let b_submits = |round: usize| {
        let client = env.client();
        let base = format!("http://{addr}");
        let b_key = b_key.clone();
        let sent = (0..32).map(move |i| {
            let request = client
                .post(format!("{base}/v1/extractions"))
                .header("authorization", format!("Bearer {b_key}"))
                .json(&common::sample_body(round * 32 + i));
            async move { request.send().await.unwrap().status().as_u16() }
        });
        futures::future::join_all(sent)
    };
    let statuses = b_submits(0).await;
    let mut answered = HashMap::<u16, usize>::new();
    for status in &statuses {
        *answered.entry(*status).or_default() += 1;
    }
    eprintln!(
        "limits slow uploads: A's 300 uploads: {} stalled in progress, refused {refused:?}; \
         B's 32 submits answered {answered:?}",
        stalled.len()
    );
    assert_eq!(answered, HashMap::from([(202, 32)]), "B's submits");
    let mut still_open = 0;
    for upload in &mut stalled {
        still_open += usize::from(!upload.answered());
    }
    assert_eq!(
        still_open,
        stalled.len(),
        "A's stalled uploads were in progress"
    );
    assert!(!stalled.is_empty(), "some of A's uploads were in progress");
    assert_eq!(refused.keys().copied().collect::<Vec<_>>(), [429]);
    let overloaded = scrape(&metrics, "docstream_submit_overload_rejections_total").await;
    assert_eq!(overloaded, 0.0);

    // Abandoned, A's uploads leave; the limit was not cut for them.
    let limit = scrape(&metrics, "docstream_submit_admission_limit").await;
    drop(stalled);
    wait_for("A's uploads to end", Duration::from_secs(30), || async {
        match scrape(&metrics, "docstream_uploads_in_flight").await {
            0.0 => Ok(()),
            n => Err(format!("{n} in flight")),
        }
    })
    .await;
    let statuses = b_submits(1).await;
    assert!(statuses.iter().all(|s| *s == 202), "{statuses:?}");
    let after = scrape(&metrics, "docstream_submit_admission_limit").await;
    assert!(after >= limit, "the limit went from {limit} to {after}");
    stop([&mut serve]).await;
}
