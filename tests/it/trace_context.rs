//! One job is one trace across every process: its records carry a W3C
//! `traceparent` whose trace id is the job's, each log line about it carries
//! its id and trace id, and with `OTEL_EXPORTER_OTLP_ENDPOINT` set each
//! process exports its spans of the job over OTLP/HTTP (received here by a
//! minimal receiver that keeps the request bodies).

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{free_port, wait_count, wait_for, wait_healthy, TestEnv, ALL_BBOX_SUCCEEDED};
use docstream::trace::TraceParent;
use tokio::process::Child;
use uuid::Uuid;

const JOBS: usize = 6;

/// OTLP/HTTP export requests received: (path, content type, body).
type Exports = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A receiver of OTLP/HTTP exports on a free port: answers 200 with an
/// empty (valid) protobuf `ExportTraceServiceResponse` and keeps each body.
async fn start_otlp_receiver() -> (String, Exports) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let exports = Exports::default();
    let kept = exports.clone();
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let content_type = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                kept.lock()
                    .unwrap()
                    .push((uri.path().to_owned(), content_type, body.to_vec()));
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        },
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, exports)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Six jobs through `serve`, a worker and a bbox worker, each exporting spans:
/// every record of a job carries a traceparent in the job's trace, every log
/// line about a job carries its trace id, and every process exports spans of
/// every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_one_trace_across_its_records_its_log_lines_and_its_exported_spans() {
    let env = TestEnv::new("trace_context").await;
    let (endpoint, exports) = start_otlp_receiver().await;
    let mut processes = three_processes_exporting_to(&env, &endpoint).await;
    let ids = processes.submit_the_jobs().await;
    every_job_finishes(&env).await;
    processes.stop_gracefully().await;
    let records_per_job = every_record_carries_its_jobs_trace(&env, &ids);
    let lines_per_process = every_log_line_about_a_job_carries_its_trace_id(&ids);
    let exports = every_process_exported_spans_of_every_job(&exports, &ids).await;
    eprintln!(
        "trace context: {JOBS} jobs, {} records each at least, all with their job's trace id; log lines about a job per process {:?}; {} OTLP exports",
        records_per_job.values().min().unwrap(),
        lines_per_process,
        exports.len()
    );
}

/// `serve`, a worker and a bbox worker, exporting their spans, and the client
/// that submits to `serve`.
struct Processes {
    children: [Child; 3],
    api: String,
    client: reqwest::Client,
}

/// Starts the three processes with spans exported to `endpoint` every 200 ms
/// and debug logs, and waits for the API to be healthy.
async fn three_processes_exporting_to(env: &TestEnv, endpoint: &str) -> Processes {
    let http_port = free_port();
    let traced = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".to_owned()),
        (
            "DOCSTREAM_LOG",
            "info,docstream=debug,rdkafka=warn,sqlx=warn".to_owned(),
        ),
    ];
    let mut serve_env = traced.to_vec();
    serve_env.push(("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{http_port}")));
    let children = [
        env.spawn("serve", &serve_env, "trace-serve"),
        env.spawn("worker", &traced, "trace-worker"),
        env.spawn("bbox-worker", &traced, "trace-bbox-worker"),
    ];
    let api = format!("http://127.0.0.1:{http_port}");
    wait_healthy(&api).await;
    Processes {
        children,
        api,
        client: env.client(),
    }
}

impl Processes {
    /// Submits [`JOBS`] sample documents one after another, each with its own
    /// idempotency key and answered 202; returns their ids.
    async fn submit_the_jobs(&self) -> Vec<Uuid> {
        let (client, api) = (&self.client, &self.api);
        let mut ids = Vec::new();
        for i in 0..JOBS {
            let answer = client
                .post(format!("{api}/v1/extractions"))
                .header("Idempotency-Key", format!("trace-{i}"))
                .json(&common::sample_body(i))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 202);
            let body: serde_json::Value = answer.json().await.unwrap();
            ids.push(body["id"].as_str().unwrap().parse::<Uuid>().unwrap());
        }
        ids
    }

    /// A graceful stop flushes each process's spans.
    async fn stop_gracefully(&mut self) {
        common::stop(self.children.iter_mut()).await;
    }
}

/// Waits (up to 120 s) for every job to reach bbox succeeded.
async fn every_job_finishes(env: &TestEnv) {
    wait_count(
        &env.pool,
        "every job to finish",
        ALL_BBOX_SUCCEEDED,
        JOBS as i64,
        Duration::from_secs(120),
    )
    .await;
}

/// Records: every one has a traceparent in its job's trace, and each job has
/// at least seven. Returns how many records each job has.
fn every_record_carries_its_jobs_trace(env: &TestEnv, ids: &[Uuid]) -> HashMap<Uuid, usize> {
    let brokers = &env.settings.kafka_brokers;
    let mut records_per_job: HashMap<Uuid, usize> = HashMap::new();
    for topic in [
        "extraction.submitted",
        "extraction.post_processing.requested",
        "extraction.events",
    ] {
        let records = common::read_traceparents(brokers, &env.topic(topic));
        assert!(!records.is_empty(), "{topic} has records");
        for (key, traceparent) in records {
            let id = in_its_jobs_trace(topic, key, traceparent);
            *records_per_job.entry(id).or_default() += 1;
        }
    }
    for id in ids {
        // submitted, post-processing requested, and five lifecycle events.
        assert!(
            records_per_job.get(id).copied().unwrap_or(0) >= 7,
            "{id}: {records_per_job:?}"
        );
    }
    records_per_job
}

/// The job id a record of `topic` is keyed by, asserting that its
/// `traceparent` is present, well formed and in that job's trace.
fn in_its_jobs_trace(topic: &str, key: Option<Vec<u8>>, traceparent: Option<String>) -> Uuid {
    let id: Uuid = String::from_utf8(key.expect("a job's record has its id as key"))
        .unwrap()
        .parse()
        .unwrap();
    let header =
        traceparent.unwrap_or_else(|| panic!("{topic}: a record of {id} has no traceparent"));
    let parsed = TraceParent::parse(&header)
        .unwrap_or_else(|| panic!("{topic}: {header:?} is not a W3C traceparent"));
    assert_eq!(
        parsed.trace_id,
        *id.as_bytes(),
        "{topic}: {header} is not in {id}'s trace"
    );
    id
}

/// Log lines: greps each job's id across the three processes' logs; each
/// process has lines about each job, all with the job's trace id. Returns
/// (process, lines) for each process and job.
fn every_log_line_about_a_job_carries_its_trace_id(ids: &[Uuid]) -> Vec<(&'static str, usize)> {
    let logs = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-logs");
    let mut lines_per_process = Vec::new();
    for process in ["trace-serve", "trace-worker", "trace-bbox-worker"] {
        let text = std::fs::read_to_string(logs.join(format!("{process}.log"))).unwrap();
        for id in ids {
            let trace_id = id.simple().to_string();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains(&id.to_string()))
                .collect();
            assert!(!lines.is_empty(), "{process}: no log line about {id}");
            for line in &lines {
                assert!(
                    line.contains(&format!("trace_id={trace_id}")),
                    "{process}: a line about {id} without its trace id: {line}"
                );
            }
            lines_per_process.push((process, lines.len()));
        }
    }
    lines_per_process
}

/// Exported spans: waits (up to 30 s) until each process has sent protobuf
/// naming itself and every job's trace id is in what was exported; then
/// checks every export went to /v1/traces as protobuf. Returns the exports.
async fn every_process_exported_spans_of_every_job(
    exports: &Exports,
    ids: &[Uuid],
) -> Vec<(String, String, Vec<u8>)> {
    let exports = wait_for("spans to be exported", Duration::from_secs(30), || {
        let got = exports.lock().unwrap().clone();
        let ids = ids.to_vec();
        async move {
            let bodies: Vec<&Vec<u8>> = got.iter().map(|(_, _, body)| body).collect();
            let services: HashSet<&str> = [
                "docstream-serve",
                "docstream-worker",
                "docstream-bbox-worker",
            ]
            .into_iter()
            .filter(|s| bodies.iter().any(|b| contains(b, s.as_bytes())))
            .collect();
            let traced = ids
                .iter()
                .filter(|id| bodies.iter().any(|b| contains(b, id.as_bytes())))
                .count();
            if services.len() == 3 && traced == ids.len() {
                Ok(got)
            } else {
                Err(format!(
                    "{} exports; services seen {services:?}; {traced} of {} jobs' traces",
                    got.len(),
                    ids.len()
                ))
            }
        }
    })
    .await;
    for (path, content_type, _) in &exports {
        assert_eq!(path, "/v1/traces");
        assert_eq!(content_type, "application/x-protobuf");
    }
    exports
}
