//! The WebSocket import stream against real processes: what a client sent
//! before it closed, or before the server shut down, is all written, published
//! and carried through; nothing is accepted without an answer on a server
//! shutdown, which ends with a normal close.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    answers_until_close, assert_exactly_once, busy_import, first_answers, free_port, import_frame,
    scrape, signal, stop, wait_count, wait_healthy, wins, TestEnv, ALL_BBOX_SUCCEEDED,
};
use docstream::events::{decode, ExtractionSubmitted};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use uuid::Uuid;

async fn ids_of_keys(pool: &sqlx::PgPool, prefix: &str) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM extraction_requests WHERE idempotency_key LIKE $1 || '%'")
        .bind(prefix)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_at_once_loses_none_of_what_it_sent() {
    const SENT: usize = 100;
    let env = TestEnv::new("import_close").await;
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let serve_env = [
        ("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}")),
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
    ];
    let mut children = [
        env.spawn("serve", &serve_env, "import-serve"),
        env.spawn("worker", &[], "import-worker"),
        env.spawn("bbox-worker", &[], "import-bbox-worker"),
    ];
    wait_healthy(&format!("http://127.0.0.1:{port}")).await;

    let url = format!("ws://127.0.0.1:{port}/v1/import");
    let (mut socket, _) = tokio_tungstenite::connect_async(env.ws_request(&url))
        .await
        .expect("connect");
    let prefix = format!("close-{}", Uuid::new_v4().simple());
    for i in 0..SENT {
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

    let pool = &env.pool;
    wait_count(
        pool,
        "every frame sent to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        SENT as i64,
        Duration::from_secs(120),
    )
    .await;
    let ids = ids_of_keys(pool, &prefix).await;
    assert_eq!(ids.len(), SENT, "one row per frame");
    assert_exactly_once(&wins(pool, "submit").await, &ids, "submit");
    assert_exactly_once(&wins(pool, "mark_succeeded").await, &ids, "mark_succeeded");
    let published: HashSet<String> = env
        .read_topic("extraction.submitted")
        .into_iter()
        .map(|(_, value)| decode::<ExtractionSubmitted>(&value).unwrap().extraction_id)
        .collect();
    assert!(
        ids.iter().all(|id| published.contains(&id.to_string())),
        "every job was published"
    );
    let accepted = scrape(
        &metrics,
        "docstream_stream_frames_total{outcome=\"accepted\",stream=\"import\"}",
    )
    .await;
    let closes = scrape(
        &metrics,
        "docstream_stream_closes_total{kind=\"client\",stream=\"import\"}",
    )
    .await;
    assert_eq!((accepted, closes), (SENT as f64, 1.0));
    eprintln!(
        "import close test: sent={SENT} rows={} published_and_succeeded={} frames_accepted={accepted} client_closes={closes}",
        ids.len(),
        ids.len()
    );
    stop(children.iter_mut()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_shutdown_answers_what_it_read_then_closes_normally() {
    const SENT: usize = 300;
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
    let mut serve = env.spawn("serve", &serve_env, "import-shutdown-serve");
    let mut workers = [
        env.spawn("worker", &[], "import-shutdown-worker"),
        env.spawn("bbox-worker", &[], "import-shutdown-bbox-worker"),
    ];
    wait_healthy(&format!("http://127.0.0.1:{port}")).await;
    let prefix = format!("shutdown-{}", Uuid::new_v4().simple());
    let (sending, mut receiver) =
        busy_import(&format!("127.0.0.1:{port}"), &env.api_key, &prefix, SENT).await;
    // Once the first answers arrive, the stream is busy: stop the server.
    let mut answered = first_answers(&mut receiver, 10).await;
    signal(&serve, "TERM").await;
    let close = answers_until_close(&mut receiver, &mut answered).await;
    let _sender = sending.await.unwrap();
    let status = serve.wait().await.unwrap();
    assert!(status.success(), "serve exits 0 after a graceful drain");
    let close = close.expect("the server closes the stream with a close frame");
    assert_eq!(close.code, CloseCode::Normal);

    let accepted: HashSet<Uuid> = answered
        .iter()
        .filter_map(|a| a["id"].as_str().map(|id| id.parse().unwrap()))
        .collect();
    assert!(
        answered.iter().all(|a| a["error"].is_null()),
        "no frame was refused: {answered:?}"
    );
    assert!(
        accepted.len() < SENT,
        "the shutdown came while frames were still coming"
    );

    // Nothing was written without an answer, and everything answered is done.
    let pool = &env.pool;
    wait_count(
        pool,
        "every answered frame to reach bbox succeeded",
        ALL_BBOX_SUCCEEDED,
        accepted.len() as i64,
        Duration::from_secs(120),
    )
    .await;
    let rows: HashSet<Uuid> = ids_of_keys(pool, &prefix).await.into_iter().collect();
    assert_eq!(rows, accepted, "the rows are exactly the answered frames");
    eprintln!(
        "import shutdown test: sent_up_to={SENT} answered={} rows={} close={:?}",
        accepted.len(),
        rows.len(),
        close.code
    );
    stop(workers.iter_mut()).await;
}
