//! The dashboard and the alert rules query metrics that exist: after a real
//! run through every role (`serve`, `worker`, `bbox-worker`, `intake`), each
//! metric named in `scripts/compose/grafana/dashboards/docstream.json` and in
//! `scripts/compose/prometheus/alerts.yml` is exported by some process, with
//! every label its query aggregates by or matches on (and, for `=` and `=~`
//! matchers, a value the matcher selects). A renamed metric or label breaks
//! this test.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{free_port, wait_count, wait_for, wait_healthy, TestEnv, ALL_BBOX_SUCCEEDED};
use docstream::config::ExtractorSettings;
use docstream::events::{encode, ExtractionRequested};
use docstream::store::tenants;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

const DASHBOARD: &str = "scripts/compose/grafana/dashboards/docstream.json";
const ALERTS: &str = "scripts/compose/prometheus/alerts.yml";

/// Jobs the run submits over HTTP; every third names the HTTP extractor and
/// every fourth a webhook.
const JOBS: usize = 24;

// ---------------------------------------------------------------------------
// What the queries ask for.
// ---------------------------------------------------------------------------

/// A label a query needs on a metric, and the values its matcher selects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Wanted {
    /// Only that the label is there (`by (…)`, `!=`, `!~`).
    Present,
    /// `label="value"`.
    Equal(String),
    /// `label=~"regex"` (anchored, as PromQL's are).
    Matches(String),
}

/// Each metric a set of queries names, with the labels they need on it.
type Requirements = BTreeMap<String, BTreeSet<(String, Wanted)>>;

/// Labels Prometheus adds at scrape time.
const SCRAPE_LABELS: [&str; 2] = ["job", "instance"];

/// The requirements of one PromQL expression. Metrics are the names starting
/// with `docstream_` or `process_` (Prometheus's own `up` and the recording
/// rules' `docstream:…` names are not exported by docstream); a `by (…)`
/// clause applies to every metric in the aggregation it groups.
fn requirements_of(expr: &str, into: &mut Requirements) {
    let metric = regex::Regex::new(r"\b((?:docstream|process)_[a-z0-9_]+)\b(\{[^}]*\})?").unwrap();
    let matcher = regex::Regex::new(r#"(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
    for found in metric.captures_iter(expr) {
        let name = found[1].to_owned();
        let labels = into.entry(name).or_default();
        if let Some(selector) = found.get(2) {
            for m in matcher.captures_iter(selector.as_str()) {
                // A PromQL string's `\\` is one backslash.
                let value = m[3].replace("\\\\", "\\");
                let wanted = match &m[2] {
                    "=" => Wanted::Equal(value),
                    "=~" => Wanted::Matches(value),
                    _ => Wanted::Present,
                };
                labels.insert((m[1].to_owned(), wanted));
            }
        }
    }
    let by = regex::Regex::new(r"\bby\s*\(([^)]*)\)").unwrap();
    for clause in by.captures_iter(expr) {
        let end = clause.get(0).unwrap().end();
        let argument = aggregated(&expr[end..]).unwrap_or_else(|| {
            panic!("`by (…)` not followed by its aggregation's argument in {expr}")
        });
        let mut inside = Requirements::new();
        for found in metric.captures_iter(argument) {
            inside.entry(found[1].to_owned()).or_default();
        }
        for name in inside.keys() {
            let labels = into.entry(name.clone()).or_default();
            for label in clause[1]
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
            {
                labels.insert((label.to_owned(), Wanted::Present));
            }
        }
    }
    for labels in into.values_mut() {
        labels.retain(|(label, _)| !SCRAPE_LABELS.contains(&label.as_str()));
    }
}

/// The parenthesised argument at the start of `rest` (after spaces).
fn aggregated(rest: &str) -> Option<&str> {
    let rest = rest.trim_start();
    if !rest.starts_with('(') {
        return None;
    }
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[..=i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every panel target's expression.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(DASHBOARD).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    queries
}

/// Every rule's `expr`: a one-line value, or a folded (`>`) block of the
/// lines indented under it, the two forms alerts.yml uses.
fn alert_queries() -> Vec<String> {
    let text = std::fs::read_to_string(ALERTS).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut queries = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        i += 1;
        let Some(value) = trimmed.strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if value != ">" && value != "|" {
            queries.push(value.to_owned());
            continue;
        }
        let indent = line.len() - trimmed.len();
        let mut block = Vec::new();
        while i < lines.len() {
            let next = lines[i];
            let next_indent = next.len() - next.trim_start().len();
            if !next.trim().is_empty() && next_indent <= indent {
                break;
            }
            block.push(next.trim());
            i += 1;
        }
        queries.push(block.join(" "));
    }
    queries
}

// ---------------------------------------------------------------------------
// What the processes export.
// ---------------------------------------------------------------------------

/// Every series scraped: metric name → the label sets it has.
type Scraped = HashMap<String, Vec<HashMap<String, String>>>;

/// Parses Prometheus text exposition (label values may hold `{`, `}`, `,`).
fn parse_exposition(text: &str, into: &mut Scraped) {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..name_end].to_owned();
        let mut labels = HashMap::new();
        if line[name_end..].starts_with('{') {
            let mut chars = line[name_end + 1..].chars().peekable();
            loop {
                let label: String = chars.by_ref().take_while(|c| *c != '=').collect();
                let label = label.trim_start_matches(',').trim().to_owned();
                if label.is_empty() {
                    break;
                }
                assert_eq!(chars.next(), Some('"'), "a quoted value in {line}");
                let mut value = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
                labels.insert(label, value);
                if chars.peek() == Some(&'}') {
                    break;
                }
            }
        }
        into.entry(name).or_default().push(labels);
    }
}

/// What `requirements` asks for and `scraped` lacks, one line each.
fn missing(requirements: &Requirements, scraped: &Scraped) -> Vec<String> {
    let mut missing = Vec::new();
    for (name, labels) in requirements {
        let Some(series) = scraped.get(name) else {
            missing.push(format!("{name}: not exported"));
            continue;
        };
        for (label, wanted) in labels {
            let has = |s: &HashMap<String, String>| match (s.get(label), wanted) {
                (None, _) => false,
                (Some(_), Wanted::Present) => true,
                (Some(v), Wanted::Equal(want)) => v == want,
                (Some(v), Wanted::Matches(re)) => regex::Regex::new(&format!("^(?:{re})$"))
                    .unwrap()
                    .is_match(v),
            };
            if !series.iter().any(has) {
                missing.push(format!("{name}: no series with {label} {wanted:?}"));
            }
        }
    }
    missing
}

async fn scrape_all(addrs: &[String]) -> Scraped {
    let mut scraped = Scraped::new();
    for addr in addrs {
        if let Ok(response) = common::http_client()
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
        {
            parse_exposition(&response.text().await.unwrap_or_default(), &mut scraped);
        }
    }
    scraped
}

#[test]
fn the_checker_finds_a_renamed_metric_and_a_renamed_label() {
    let mut scraped = Scraped::new();
    parse_exposition(
        concat!(
            "# TYPE docstream_events_produced_total counter\n",
            "docstream_events_produced_total{topic=\"extraction.events\"} 3\n",
            "docstream_http_request_duration_seconds_bucket{route=\"/v1/extractions/{id}\",status=\"200\",le=\"0.1\"} 1\n",
        ),
        &mut scraped,
    );
    let route = &scraped["docstream_http_request_duration_seconds_bucket"][0];
    assert_eq!(route["route"], "/v1/extractions/{id}");
    assert_eq!(route["le"], "0.1");
    let check = |expr: &str| {
        let mut wanted = Requirements::new();
        requirements_of(expr, &mut wanted);
        missing(&wanted, &scraped)
    };
    let rate = "sum by (topic) (rate(docstream_events_produced_total[5m]))";
    assert_eq!(check(rate), Vec::<String>::new());
    assert_eq!(
        check(&rate.replace("produced_total", "published_total")).len(),
        1
    );
    assert_eq!(check(&rate.replace("by (topic)", "by (topik)")).len(), 1);
    assert_eq!(
        check("docstream_events_produced_total{topic=\"extraction.dlq\"}").len(),
        1
    );
    assert_eq!(
        check("docstream_events_produced_total{topic=~\"extraction\\\\..*\"}").len(),
        0
    );
    let p99 = "histogram_quantile(0.99, sum by (route, le) (rate(docstream_http_request_duration_seconds_bucket[5m])))";
    assert_eq!(check(p99), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------

/// A webhook receiver that answers 200 and counts what it got.
async fn start_receiver() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

/// Every metric the dashboard and the alert rules query, with the labels they
/// need, is exported by some role after a real run: jobs over HTTP (some
/// through the HTTP extractor, some with a webhook) and an intake topic with
/// a good and a poison record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_query_is_exported_after_a_real_run() {
    let queried = what_the_dashboard_and_the_alerts_query();
    let (mut extractor, env) = an_env_with_the_reference_extractor().await;
    the_default_tenant_signs_webhooks(&env).await;
    let (hook, received) = start_receiver().await;
    let mut roles = every_role_with_fast_metrics(&env).await;
    let hooks = roles
        .submit_jobs_some_external_some_with_a_webhook(&hook)
        .await;
    let _producer = a_good_and_a_poison_record_on_the_intake_topic(&env).await;
    every_job_finishes_and_every_webhook_arrives(&env, &received, hooks).await;
    let scraped = every_queried_metric_is_exported(&roles.metrics, &queried.wanted).await;
    queried.report(&scraped);
    common::stop(roles.children.iter_mut()).await;
    let _ = extractor.kill().await;
}

/// The dashboard's and the rules' queries, and what they require.
struct Queried {
    panels: Vec<String>,
    rules: Vec<String>,
    wanted: Requirements,
}

/// Parses every panel query and rule into the metrics and labels they need,
/// checking that the parsers found enough of each.
fn what_the_dashboard_and_the_alerts_query() -> Queried {
    let mut wanted = Requirements::new();
    let (panels, rules) = (dashboard_queries(), alert_queries());
    for expr in panels.iter().chain(&rules) {
        requirements_of(expr, &mut wanted);
    }
    // A parser that found nothing would pass vacuously.
    assert!(
        panels.len() >= 40 && rules.len() >= 14,
        "{} panel queries, {} rules",
        panels.len(),
        rules.len()
    );
    assert!(
        wanted.len() >= 50,
        "only {} metrics named: {wanted:?}",
        wanted.len()
    );
    Queried {
        panels,
        rules,
        wanted,
    }
}

impl Queried {
    /// Prints how many queries, metrics and series the run covered.
    fn report(&self, scraped: &Scraped) {
        let wanted = &self.wanted;
        let exported: usize = wanted.keys().map(|name| scraped[name].len()).sum();
        eprintln!(
            "observability: {} panel queries and {} rules name {} metrics; all exported ({exported} series) by serve, worker, bbox-worker and intake",
            self.panels.len(),
            self.rules.len(),
            wanted.len()
        );
    }
}

/// Starts `docstream extractor-serve`, then a test environment with it
/// configured as the extractor `reference`.
async fn an_env_with_the_reference_extractor() -> (tokio::process::Child, TestEnv) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"));
    command.args(["extractor-serve", "--addr", "127.0.0.1:0"]);
    let (extractor, extractor_url) = common::start_provider(command).await;
    let env = TestEnv::with_settings("observability", |s| {
        let reference = ExtractorSettings {
            url: extractor_url.clone(),
            ..ExtractorSettings::default()
        };
        s.extractors.insert("reference".into(), reference);
    })
    .await;
    (extractor, env)
}

/// Gives the tenant `default` a webhook secret, so its webhooks are sent.
async fn the_default_tenant_signs_webhooks(env: &TestEnv) {
    tenants::rotate_webhook_secret(
        &env.pool,
        "default",
        Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        0.0,
    )
    .await
    .unwrap();
}

/// Every role's process, the addresses they export metrics on, the API's
/// base URL and a client of it.
struct Roles {
    children: Vec<tokio::process::Child>,
    metrics: Vec<String>,
    api: String,
    client: reqwest::Client,
}

/// Starts `serve`, `worker`, `bbox-worker` and `intake`, each with its own
/// metrics port, a census and Kafka statistics every second, and webhooks
/// allowed to loopback; waits for the API to be healthy.
async fn every_role_with_fast_metrics(env: &TestEnv) -> Roles {
    let http_port = free_port();
    let fast = [
        ("DOCSTREAM_CENSUS_INTERVAL_S", "1".to_owned()),
        ("DOCSTREAM_KAFKA_STATISTICS_INTERVAL_S", "1".to_owned()),
        ("DOCSTREAM_WEBHOOK_ALLOW", "127.0.0.1/32".to_owned()),
    ];
    let mut children = Vec::new();
    let mut metrics = Vec::new();
    for role in ["serve", "worker", "bbox-worker", "intake"] {
        let port = free_port();
        let mut extra = fast.to_vec();
        extra.push(("DOCSTREAM_METRICS_ADDR", format!("127.0.0.1:{port}")));
        if role == "serve" {
            extra.push(("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{http_port}")));
        }
        children.push(env.spawn(role, &extra, &format!("observability-{role}")));
        metrics.push(format!("127.0.0.1:{port}"));
    }
    let api = format!("http://127.0.0.1:{http_port}");
    wait_healthy(&api).await;
    Roles {
        children,
        metrics,
        api,
        client: env.client(),
    }
}

impl Roles {
    /// Jobs over HTTP, some through the HTTP extractor, some with a webhook
    /// to `hook`, each answered 202; returns how many have a webhook.
    async fn submit_jobs_some_external_some_with_a_webhook(&self, hook: &str) -> usize {
        let (client, api) = (&self.client, &self.api);
        let mut hooks = 0;
        for i in 0..JOBS {
            let mut body = common::sample_body(i);
            if i % 3 == 0 {
                body["extractor"] = "reference".into();
            }
            if i % 4 == 0 {
                body["webhook_url"] = hook.to_owned().into();
                hooks += 1;
            }
            let answer = client
                .post(format!("{api}/v1/extractions"))
                .header("Idempotency-Key", format!("observability-{i}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 202, "{}", answer.text().await.unwrap());
        }
        hooks
    }
}

/// On the intake topic: one good submission and one poison record. Returns
/// the producer, which the test keeps until its end.
async fn a_good_and_a_poison_record_on_the_intake_topic(env: &TestEnv) -> FutureProducer {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.settings.kafka_brokers)
        .create()
        .unwrap();
    let topic = env.topic("extraction.requests");
    let good = ExtractionRequested {
        idempotency_key: "observability-intake".into(),
        request_json: common::sample_body(0).to_string(),
        requested_at_ms: 0,
    };
    for (key, payload) in [
        ("good", encode(&good).unwrap()),
        ("poison", b"not avro".to_vec()),
    ] {
        let record = FutureRecord::to(&topic)
            .key(key)
            .payload(&payload)
            .headers(common::intake_headers("default", &env.api_key));
        producer
            .send(record, Duration::from_secs(30))
            .await
            .unwrap();
    }
    producer
}

/// Waits (up to 120 s) for every job, the intake's included, to finish, then
/// (up to 60 s) for `hooks` webhooks to arrive.
async fn every_job_finishes_and_every_webhook_arrives(
    env: &TestEnv,
    received: &AtomicUsize,
    hooks: usize,
) {
    wait_count(
        &env.pool,
        "every job to finish",
        ALL_BBOX_SUCCEEDED,
        JOBS as i64 + 1,
        Duration::from_secs(120),
    )
    .await;
    wait_for("every webhook to arrive", Duration::from_secs(60), || {
        let got = received.load(Ordering::SeqCst);
        async move {
            (got >= hooks)
                .then_some(())
                .ok_or(format!("{got} of {hooks}"))
        }
    })
    .await;
}

/// The census and librdkafka's statistics report every second; the
/// poison record's letter is counted once the DLQ acknowledged it. Waits (up
/// to 60 s) until a scrape of every process has all that `wanted` asks for;
/// returns that scrape.
async fn every_queried_metric_is_exported(metrics: &[String], wanted: &Requirements) -> Scraped {
    wait_for(
        "every queried metric to be exported",
        Duration::from_secs(60),
        || {
            let (metrics, wanted) = (metrics.to_vec(), wanted.clone());
            async move {
                let scraped = scrape_all(&metrics).await;
                let missing = missing(&wanted, &scraped);
                if missing.is_empty() {
                    Ok(scraped)
                } else {
                    Err(format!("missing:\n  {}", missing.join("\n  ")))
                }
            }
        },
    )
    .await
}
