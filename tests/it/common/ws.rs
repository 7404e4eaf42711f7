//! WebSocket clients: authenticated requests and the import stream's
//! frames and answers.

use futures::stream::StreamExt;

use super::jobs::sample_body;
use super::TestEnv;

impl TestEnv {
    /// A WebSocket request for `url` carrying this test's API key.
    pub fn ws_request(&self, url: &str) -> tokio_tungstenite::tungstenite::http::Request<()> {
        ws_request(url, &self.api_key)
    }
}

/// A WebSocket request for `url` carrying API key `key`.
pub fn ws_request(url: &str, key: &str) -> tokio_tungstenite::tungstenite::http::Request<()> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().expect("a WebSocket URL");
    let value = format!("Bearer {key}").parse().expect("a header value");
    request.headers_mut().insert("authorization", value);
    request
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
