//! A scriptable fake extraction provider for integration tests.
//!
//! [`FakeProvider`] speaks the worker ↔ provider protocol (one `POST` per attempt of
//! a job, JSON body with `job_id`, `attempt`, `document`, `fields`, `metadata`) over
//! plain HTTP/1.1 on a raw [`TcpListener`], so the test controls every byte and every
//! moment: a closure decides, per call, whether to answer (after a delay, with any
//! status, headers and body) or to hang, and the provider records what it saw of each
//! call (headers, timing, the status answered, and whether the client closed the
//! connection before the answer came).
//!
//! While a call waits (its delay, or a hang) the provider keeps watching the socket, so
//! a client that abandons the call by closing its connection is seen at once: the call
//! is marked `closed_by_client` and stops counting as in flight.
//!
//! Keep-alive is supported (reqwest pools connections); chunked request bodies are not
//! (the worker always sends `Content-Length`), and such a request is answered 400.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use uuid::Uuid;

/// Largest request head (request line and headers) accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// How long a [`Plan::Hang`] holds a connection before closing it without an answer.
const HANG_LIMIT: Duration = Duration::from_secs(120);

/// What the provider does with one call.
#[derive(Clone, Debug)]
pub enum Plan {
    /// Wait `delay`, then answer `status` with `headers` and `body`.
    ///
    /// `Content-Length` is always set by the provider (a `Content-Length` in `headers`
    /// is ignored); `Content-Type` defaults to `application/json` when `body` is valid
    /// JSON and `text/plain` otherwise, unless `headers` has one.
    Answer {
        /// How long to wait before answering (the socket is watched meanwhile).
        delay: Duration,
        /// The HTTP status code.
        status: u16,
        /// Extra response headers, written as given.
        headers: Vec<(String, String)>,
        /// The response body.
        body: String,
    },
    /// Wait `delay`, then answer 200 with every requested field found: the body is
    /// [`all_found_body`] of the request.
    AllFound {
        /// How long to wait before answering (the socket is watched meanwhile).
        delay: Duration,
    },
    /// Never answer: hold the connection until the client closes it (or 120 s pass,
    /// after which the provider closes it without an answer).
    Hang,
}

impl Plan {
    /// 200 after `delay` with a valid result body in which every requested field is
    /// found (see [`all_found_body`]).
    pub fn ok(delay: Duration) -> Plan {
        Plan::AllFound { delay }
    }

    /// `code` at once with `body` and no extra headers.
    pub fn status(code: u16, body: &str) -> Plan {
        Plan::Answer {
            delay: Duration::ZERO,
            status: code,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    /// `code` (typically 429 or 503) at once with `Retry-After: secs` and an
    /// `{"error": "overloaded"}` body.
    pub fn retry_after(code: u16, secs: u64) -> Plan {
        Plan::Answer {
            delay: Duration::ZERO,
            status: code,
            headers: vec![("Retry-After".to_string(), secs.to_string())],
            body: json!({"error": "overloaded"}).to_string(),
        }
    }
}

/// The 200 body that finds every field named in `request["fields"]`:
/// `{"fields": {"<name>": {"value": "v-<name>", "raw": "v-<name>", "words": [0, 0]}, ...}}`.
pub fn all_found_body(request: &Value) -> String {
    let mut fields = serde_json::Map::new();
    let specs = request.get("fields").and_then(Value::as_array);
    for name in specs
        .into_iter()
        .flatten()
        .filter_map(|spec| spec.get("name").and_then(Value::as_str))
    {
        let value = format!("v-{name}");
        fields.insert(
            name.to_string(),
            json!({"value": value, "raw": value, "words": [0, 0]}),
        );
    }
    json!({ "fields": fields }).to_string()
}

/// What the provider saw of one call.
#[derive(Clone, Debug)]
pub struct Call {
    /// `job_id` from the JSON body.
    pub job_id: Uuid,
    /// `attempt` from the JSON body.
    pub attempt: i64,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
    /// The `traceparent` header, if sent.
    pub traceparent: Option<String>,
    /// The `Authorization` header, if sent.
    pub authorization: Option<String>,
    /// When the request (head and body) was fully read.
    pub started: Instant,
    /// When the answer was written, or the close was seen; `None` while in flight.
    pub ended: Option<Instant>,
    /// The status answered; `None` while in flight, if the client closed first, or if
    /// a [`Plan::Hang`] ran out.
    pub status: Option<u16>,
    /// The client closed the connection before the answer was written.
    pub closed_by_client: bool,
}

/// Calls seen so far and the concurrency counters.
#[derive(Default)]
struct State {
    calls: Vec<Call>,
    in_flight: usize,
    max_concurrency: usize,
}

/// The test's script: (call number, request body) → what to do.
type PlanFn = Box<dyn Fn(usize, &Value) -> Plan + Send + Sync>;

/// What the accept loop and every connection task share with the [`FakeProvider`].
struct Shared {
    state: Mutex<State>,
    plan: PlanFn,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a fully read request as a new call in flight; returns its number.
    fn begin(&self, request: &Request, job_id: Uuid, attempt: i64) -> usize {
        let call = Call {
            job_id,
            attempt,
            idempotency_key: request.header("idempotency-key"),
            traceparent: request.header("traceparent"),
            authorization: request.header("authorization"),
            started: Instant::now(),
            ended: None,
            status: None,
            closed_by_client: false,
        };
        let mut state = self.lock();
        state.calls.push(call);
        state.in_flight += 1;
        state.max_concurrency = state.max_concurrency.max(state.in_flight);
        state.calls.len() - 1
    }

    /// Ends call `n`: answered with `status`, or closed (by the client or by the provider).
    fn finish(&self, n: usize, status: Option<u16>, closed_by_client: bool) {
        let mut state = self.lock();
        let call = &mut state.calls[n];
        call.ended = Some(Instant::now());
        call.status = status;
        call.closed_by_client = closed_by_client;
        state.in_flight -= 1;
    }
}

/// A fake extraction provider on `127.0.0.1`, serving until dropped.
pub struct FakeProvider {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl FakeProvider {
    /// Binds `127.0.0.1:0` and serves until dropped. `plan` decides each call from
    /// (the call number, starting at 0 across all calls and connections, the parsed
    /// JSON request body).
    pub async fn start(plan: impl Fn(usize, &Value) -> Plan + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake provider: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake provider: local addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            plan: Box::new(plan),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        FakeProvider {
            shared,
            addr,
            accept,
        }
    }

    /// The extraction endpoint: `http://127.0.0.1:PORT/extract`.
    pub fn url(&self) -> String {
        format!("http://{}/extract", self.addr)
    }

    /// Every call so far, in arrival order (index = call number).
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// The most calls that were in progress at once (from request read to answer
    /// written or close seen).
    pub fn max_concurrency(&self) -> usize {
        self.shared.lock().max_concurrency
    }

    /// Calls in progress now.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight
    }

    /// From now (just after a holder of `full` calls' slots was killed), for
    /// 20 s at most: the fewest calls in progress seen, and how long until
    /// `full` were in progress again after fewer (`None`: not within 20 s).
    pub async fn dip_and_recovery(&self, full: usize) -> (usize, Option<Duration>) {
        let killed = Instant::now();
        let mut dip = full;
        while killed.elapsed() < Duration::from_secs(20) {
            let in_flight = self.in_flight();
            dip = dip.min(in_flight);
            if dip < full && in_flight == full {
                return (dip, Some(killed.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (dip, None)
    }
}

impl Drop for FakeProvider {
    /// Stops accepting; the connection tasks (owned by the accept task) go with it.
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Accepts connections, each served by its own task in a [`JoinSet`] owned here, so
/// aborting this task aborts every connection too.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(stream, shared.clone()));
                }
                // e.g. out of file descriptors: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connection tasks.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One parsed HTTP request.
struct Request {
    /// Header names lowercased, in order received.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The connection is to be closed after the answer.
    close: bool,
}

impl Request {
    /// The first value of header `name` (lowercase).
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// The result of reading one request off a connection.
enum Read {
    Request(Request),
    /// EOF or an I/O error (before or during a request).
    Closed,
    /// Not a request this provider understands: answer 400 and close.
    Malformed(String),
}

/// Serves requests on one connection until EOF, a close, or a malformed request.
async fn serve_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    // Bytes read but not yet consumed (the start of the next request).
    let mut buf = Vec::new();
    loop {
        let request = match read_request(&mut stream, &mut buf).await {
            Read::Request(request) => request,
            Read::Closed => return,
            Read::Malformed(message) => return reject(&mut stream, &message).await,
        };
        let (body, job_id, attempt) = match parse_body(&request.body) {
            Ok(parsed) => parsed,
            Err(message) => return reject(&mut stream, &message).await,
        };
        let n = shared.begin(&request, job_id, attempt);
        let (delay, answer) = match (shared.plan)(n, &body) {
            Plan::Answer {
                delay,
                status,
                headers,
                body,
            } => (delay, Some((status, headers, body))),
            Plan::AllFound { delay } => (delay, Some((200, Vec::new(), all_found_body(&body)))),
            Plan::Hang => (HANG_LIMIT, None),
        };
        if !wait_watching(&mut stream, &mut buf, delay).await {
            shared.finish(n, None, true);
            return;
        }
        let Some((status, headers, body)) = answer else {
            // A hang ran out: close without an answer.
            shared.finish(n, None, false);
            return;
        };
        match write_response(&mut stream, status, &headers, &body, request.close).await {
            Ok(()) => shared.finish(n, Some(status), false),
            Err(_) => {
                shared.finish(n, None, true);
                return;
            }
        }
        if request.close {
            return;
        }
    }
}

/// Answers 400 with `{"error": message}` and closes the connection.
async fn reject(stream: &mut TcpStream, message: &str) {
    let body = json!({ "error": format!("fake provider: {message}") }).to_string();
    let _ = write_response(stream, 400, &[], &body, true).await;
    let _ = stream.shutdown().await;
}

/// Waits `delay` while watching the socket; returns false if the client closed the
/// connection (EOF or error) first. Bytes that arrive meanwhile (pipelining) are kept
/// in `buf` for the next request.
async fn wait_watching(stream: &mut TcpStream, buf: &mut Vec<u8>, delay: Duration) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    let mut chunk = [0u8; 4096];
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            read = stream.read(&mut chunk) => match read {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
        }
    }
}

/// Reads more bytes into `buf`; false on EOF or error.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// Reads one request (head up to `\r\n\r\n`, then exactly `Content-Length` bytes of
/// body), consuming it from `buf`.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Read {
    let head_len = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > MAX_HEAD {
            return Read::Malformed("request head too large".into());
        }
        if !fill(stream, buf).await {
            return Read::Closed;
        }
    };
    let head = match std::str::from_utf8(&buf[..head_len]) {
        Ok(head) => head.to_string(),
        Err(_) => return Read::Malformed("request head is not UTF-8".into()),
    };
    buf.drain(..head_len + 4);

    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split_whitespace().collect();
    let [_method, _target, version] = parts[..] else {
        return Read::Malformed(format!("bad request line {request_line:?}"));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Read::Malformed(format!("unsupported version {version:?}"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Read::Malformed(format!("bad header line {line:?}"));
        };
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Read::Malformed(format!("bad header line {line:?}"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut request = Request {
        headers,
        body: Vec::new(),
        close: false,
    };

    if request.header("transfer-encoding").is_some() {
        return Read::Malformed("Transfer-Encoding is not supported; send Content-Length".into());
    }
    let length = match request.header("content-length") {
        None => 0,
        Some(value) => match value.parse::<usize>() {
            Ok(length) if length <= MAX_BODY => length,
            Ok(_) => return Read::Malformed("request body too large".into()),
            Err(_) => return Read::Malformed(format!("bad Content-Length {value:?}")),
        },
    };
    let connection = request
        .header("connection")
        .unwrap_or_default()
        .to_ascii_lowercase();
    request.close = if version == "HTTP/1.0" {
        !connection.contains("keep-alive")
    } else {
        connection.contains("close")
    };

    while buf.len() < length {
        if !fill(stream, buf).await {
            return Read::Closed;
        }
    }
    request.body = buf.drain(..length).collect();
    Read::Request(request)
}

/// Parses a request body: the JSON value, its `job_id` and its `attempt`.
fn parse_body(body: &[u8]) -> Result<(Value, Uuid, i64), String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let job_id = value
        .get("job_id")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<Uuid>().ok())
        .ok_or("body has no job_id UUID string")?;
    let attempt = value
        .get("attempt")
        .and_then(Value::as_i64)
        .ok_or("body has no integer attempt")?;
    Ok((value, job_id, attempt))
}

/// Writes one response with `Content-Length` (and `Connection: close` if `close`).
async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &str,
    close: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    let mut has_content_type = false;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        has_content_type |= name.eq_ignore_ascii_case("content-type");
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_content_type {
        let content_type = if serde_json::from_str::<Value>(body).is_ok() {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        };
        out.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    if close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    stream.write_all(out.as_bytes()).await?;
    stream.flush().await
}

/// The reason phrase for `status` (any phrase is valid HTTP; these read well in logs).
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
