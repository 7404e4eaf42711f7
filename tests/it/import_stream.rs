//! The WebSocket import stream against real processes: what a client sent
//! before it closed, or before the server shut down, is all written, published
//! and carried through; nothing is accepted without an answer on a server
//! shutdown, which ends with a normal close.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    answers_until_close, assert_exactly_once, busy_import, first_answers, free_port, import_frame,
    scrape, signal, stop, wait_count, wait_healthy, wins, TestEnv, ALL_BBOX_SUCCEEDED,
};
use docstream::events::{decode, ExtractionSubmitted};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use uuid::Uuid;

/// A WebSocket client's stream.
type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One message (or error) read from a WebSocket.
type WsResult = Result<Message, tokio_tungstenite::tungstenite::Error>;

/// The ids of the requests whose idempotency keys start with `prefix`.
async fn ids_of_keys(pool: &sqlx::PgPool, prefix: &str) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM extraction_requests WHERE idempotency_key LIKE $1 || '%'")
        .bind(prefix)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// How many frames the closing client sends.
const CLOSE_SENT: usize = 100;

/// A `serve` (with its metrics listener), a worker and a bbox worker.
struct Pipeline {
    children: [Child; 3],
    port: u16,
    /// Its /metrics, on the internal listener.
    metrics: String,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// A client's import socket, closed, with the prefix of its frames' keys.
struct Closed {
    prefix: String,
    /// The connection, closed, kept until the test ends.
    _socket: Socket,
}

/// Starts `serve` with a metrics listener, a worker and a bbox worker, and
/// waits until the API is healthy.
async fn a_serve_a_worker_and_a_bbox_worker() -> Pipeline {
    let env = TestEnv::new("import_close").await;
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let serve_env = [
        ("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")),
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
    ];
    let children = [
        env.spawn("serve", &serve_env, "import-serve"),
        env.spawn("worker", &[], "import-worker"),
        env.spawn("bbox-worker", &[], "import-bbox-worker"),
    ];
    wait_healthy(&format!("http://127.0.0.1:{port}")).await;
    Pipeline {
        children,
        port,
        metrics,
        env,
    }
}

/// A client sends 100 frames and closes at once, completing the closing
/// handshake within 30 s.
async fn a_client_sends_100_frames_and_closes_at_once(pipeline: &Pipeline) -> Closed {
    let url = format!("ws://127.0.0.1:{}/v1/import", pipeline.port);
    let (mut socket, _) = tokio_tungstenite::connect_async(pipeline.env.ws_request(&url))
        .await
        .expect("connect");
    let prefix = format!("close-{}", Uuid::new_v4().simple());
    for i in 0..CLOSE_SENT {
        socket
            .send(import_frame(i, &format!("{prefix}-{i}")))
            .await
            .unwrap();
    }
    // Closed at once, without waiting for a single answer. The client still
    // completes the closing handshake (it reads until the server's close), as
    // RFC 6455 asks: dropping the connection outright could make the kernel
    // reset it and discard frames the server had not read yet.
    socket.close(None).await.unwrap();
    let handshake = async { while let Some(Ok(_)) = socket.next().await {} };
    tokio::time::timeout(Duration::from_secs(30), handshake)
        .await
        .expect("the server answers the close");
    Closed {
        prefix,
        _socket: socket,
    }
}

/// Every frame sent reaches bbox succeeded as one row, submitted and
/// succeeded exactly once, and published. Returns the rows' ids.
async fn every_frame_became_one_job_done_once_and_published(
    pipeline: &Pipeline,
    closed: &Closed,
) -> Vec<Uuid> {
    let pool = &pipeline.env.pool;
    wait_count(
        pool,
        "every frame sent to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        CLOSE_SENT as i64,
        Duration::from_secs(120),
    )
    .await;
    let ids = ids_of_keys(pool, &closed.prefix).await;
    assert_eq!(ids.len(), CLOSE_SENT, "one row per frame");
    assert_exactly_once(&wins(pool, "submit").await, &ids, "submit");
    assert_exactly_once(&wins(pool, "mark_succeeded").await, &ids, "mark_succeeded");
    let published: HashSet<String> = pipeline
        .env
        .read_topic("extraction.submitted")
        .into_iter()
        .map(|(_, value)| decode::<ExtractionSubmitted>(&value).unwrap().extraction_id)
        .collect();
    assert!(
        ids.iter().all(|id| published.contains(&id.to_string())),
        "every job was published"
    );
    ids
}

/// `serve`'s metrics count every frame accepted and one client close; the
/// test's report line.
async fn the_metrics_count_every_frame_and_one_client_close(pipeline: &Pipeline, ids: &[Uuid]) {
    let accepted = scrape(
        &pipeline.metrics,
        "docstream_stream_frames_total{outcome=\"accepted\",stream=\"import\"}",
    )
    .await;
    let closes = scrape(
        &pipeline.metrics,
        "docstream_stream_closes_total{kind=\"client\",stream=\"import\"}",
    )
    .await;
    assert_eq!((accepted, closes), (CLOSE_SENT as f64, 1.0));
    eprintln!(
        "import close test: sent={CLOSE_SENT} rows={} published_and_succeeded={} frames_accepted={accepted} client_closes={closes}",
        ids.len(),
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_at_once_loses_none_of_what_it_sent() {
    let mut pipeline = a_serve_a_worker_and_a_bbox_worker().await;
    let closed = a_client_sends_100_frames_and_closes_at_once(&pipeline).await;
    let ids = every_frame_became_one_job_done_once_and_published(&pipeline, &closed).await;
    the_metrics_count_every_frame_and_one_client_close(&pipeline, &ids).await;
    stop(pipeline.children.iter_mut()).await;
}

/// How many frames the busy client sends at most.
const SHUTDOWN_SENT: usize = 300;

/// A `serve` whose submits take 100 ms, with a worker and a bbox worker.
struct SlowSubmits {
    port: u16,
    workers: [Child; 2],
    serve: Child,
    /// Held to the end: dropping it cleans up the test's database and topics.
    env: TestEnv,
}

/// How the server's shutdown ended a busy import stream.
struct Shutdown<A, S> {
    /// The idempotency keys' prefix of this test's frames.
    prefix: String,
    answered: Vec<serde_json::Value>,
    close: Option<CloseFrame>,
    status: std::process::ExitStatus,
    // Both halves of the import socket stay open until the test ends.
    _sender: S,
    _answers: A,
}

/// Starts a `serve` whose submits take 100 ms between INSERT and publish,
/// a worker and a bbox worker, and waits until the API is healthy.
async fn a_serve_whose_submits_take_100_ms_and_two_workers() -> SlowSubmits {
    let env = TestEnv::new("import_shutdown").await;
    let port = free_port();
    // Each submit takes 100 ms between INSERT and publish, so the stream is busy
    // when the server is told to stop.
    let serve_env = [
        ("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")),
        (
            "DOCSTREAM_FAILPOINTS",
            "submit.after_insert=sleep(100)".to_owned(),
        ),
    ];
    let serve = env.spawn("serve", &serve_env, "import-shutdown-serve");
    let workers = [
        env.spawn("worker", &[], "import-shutdown-worker"),
        env.spawn("bbox-worker", &[], "import-shutdown-bbox-worker"),
    ];
    wait_healthy(&format!("http://127.0.0.1:{port}")).await;
    SlowSubmits {
        port,
        workers,
        serve,
        env,
    }
}

/// A client keeps submitting; once the first 10 answers arrive, `serve` is
/// SIGTERMed. Reads the answers to the close, and waits for `serve` to exit.
async fn serve_is_stopped_while_the_import_stream_is_busy(
    given: &mut SlowSubmits,
) -> Shutdown<impl futures::Stream<Item = WsResult> + Unpin, impl Sized> {
    let prefix = format!("shutdown-{}", Uuid::new_v4().simple());
    let addr = format!("127.0.0.1:{}", given.port);
    let (sending, mut receiver) =
        busy_import(&addr, &given.env.api_key, &prefix, SHUTDOWN_SENT).await;
    // Once the first answers arrive, the stream is busy: stop the server.
    let mut answered = first_answers(&mut receiver, 10).await;
    signal(&given.serve, "TERM").await;
    let close = answers_until_close(&mut receiver, &mut answered).await;
    let sender = sending.await.unwrap();
    let status = given.serve.wait().await.unwrap();
    Shutdown {
        prefix,
        answered,
        close,
        status,
        _sender: sender,
        _answers: receiver,
    }
}

/// `serve` exited 0 and closed the stream with a normal close frame; returns
/// its code.
fn serve_exited_0_and_closed_the_stream_normally<A, S>(shutdown: &Shutdown<A, S>) -> CloseCode {
    assert!(
        shutdown.status.success(),
        "serve exits 0 after a graceful drain"
    );
    let close = shutdown
        .close
        .as_ref()
        .expect("the server closes the stream with a close frame");
    assert_eq!(close.code, CloseCode::Normal);
    close.code
}

/// No frame was refused, and the shutdown came while frames were still
/// coming. Returns the ids of the answered frames.
fn every_answer_accepted_a_frame_before_the_last_was_sent<A, S>(
    shutdown: &Shutdown<A, S>,
) -> HashSet<Uuid> {
    let answered = &shutdown.answered;
    let accepted: HashSet<Uuid> = answered
        .iter()
        .filter_map(|a| a["id"].as_str().map(|id| id.parse().unwrap()))
        .collect();
    assert!(
        answered.iter().all(|a| a["error"].is_null()),
        "no frame was refused: {answered:?}"
    );
    assert!(
        accepted.len() < SHUTDOWN_SENT,
        "the shutdown came while frames were still coming"
    );
    accepted
}

/// Nothing was written without an answer, and everything answered is done:
/// once every answered frame reached bbox succeeded, the rows are exactly
/// the answered frames. Returns how many rows there are.
async fn the_rows_are_exactly_the_answered_frames_once_done<A, S>(
    given: &SlowSubmits,
    shutdown: &Shutdown<A, S>,
    accepted: &HashSet<Uuid>,
) -> usize {
    let pool = &given.env.pool;
    wait_count(
        pool,
        "every answered frame to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        accepted.len() as i64,
        Duration::from_secs(120),
    )
    .await;
    let rows: HashSet<Uuid> = ids_of_keys(pool, &shutdown.prefix)
        .await
        .into_iter()
        .collect();
    assert_eq!(&rows, accepted, "the rows are exactly the answered frames");
    rows.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_shutdown_answers_what_it_read_then_closes_normally() {
    let mut given = a_serve_whose_submits_take_100_ms_and_two_workers().await;
    let shutdown = serve_is_stopped_while_the_import_stream_is_busy(&mut given).await;
    let close = serve_exited_0_and_closed_the_stream_normally(&shutdown);
    let accepted = every_answer_accepted_a_frame_before_the_last_was_sent(&shutdown);
    let rows =
        the_rows_are_exactly_the_answered_frames_once_done(&given, &shutdown, &accepted).await;
    eprintln!(
        "import shutdown test: sent_up_to={SHUTDOWN_SENT} answered={} rows={rows} close={close:?}",
        accepted.len(),
    );
    stop(given.workers.iter_mut()).await;
}
