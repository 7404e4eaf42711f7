//! Worker processes with external extractors: registering an extractor,
//! submitting jobs for it, spawning workers with their metrics on ports of
//! their own, and waiting until every worker holds partitions.

use std::time::Duration;

use docstream::config::{ExtractorSettings, Settings};
use docstream::roles::Process;
use uuid::Uuid;

use super::{free_port, sample_body, scrape, wait_for, TestEnv};

/// Registers extractor `name` at `url` in the test's settings, which the
/// in-process submit path checks and `TestEnv::spawn` hands to children.
pub fn add_extractor(
    settings: &mut Settings,
    name: &str,
    url: &str,
    adjust: impl FnOnce(&mut ExtractorSettings),
) {
    let mut extractor = ExtractorSettings {
        url: url.to_owned(),
        ..ExtractorSettings::default()
    };
    adjust(&mut extractor);
    settings.extractors.insert(name.to_owned(), extractor);
}

/// Submits `n` sample jobs for `extractor` through the submit path, with
/// `metadata` in each (which the fake provider may read).
pub async fn submit_for(
    services: &Process,
    n: usize,
    extractor: &str,
    metadata: serde_json::Value,
) -> Vec<Uuid> {
    super::submit_bodies(services, n, |i| {
        let mut body = sample_body(i);
        body["extractor"] = extractor.into();
        body["metadata"] = metadata.clone();
        body
    })
    .await
}

/// A worker with its metrics on a port of its own: (process, metrics address).
/// Its environment names a proxy that answers nothing: the extractor client
/// must go straight to the service, whatever `HTTP(S)_PROXY` say.
pub fn worker_with_metrics(env: &TestEnv, log_name: &str) -> (tokio::process::Child, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let env_vars = [
        ("DOCSTREAM_METRICS_ADDR", metrics.clone()),
        ("HTTP_PROXY", nowhere.clone()),
        ("HTTPS_PROXY", nowhere.clone()),
        ("ALL_PROXY", nowhere),
    ];
    (env.spawn("worker", &env_vars, log_name), metrics)
}

/// How many of the workers at `metrics` show a call in `series`, scraped in turn.
pub async fn workers_calling(metrics: &[String], series: &str) -> usize {
    let mut calling = 0;
    for addr in metrics {
        let calls = scrape(addr, series).await;
        calling += usize::from(calls > 0.0);
    }
    calling
}

/// Every worker holds partitions once each has called the warm-up
/// extractor: submits 6 warm-up jobs per poll until all show calls (90 s at
/// most).
pub async fn every_worker_calls_the_warmup_extractor(services: &Process, metrics: &[String]) {
    let workers = metrics.len();
    wait_for(
        "every worker to call",
        Duration::from_secs(90),
        || async move {
            submit_for(services, 6, "warmup", serde_json::Value::Null).await;
            let calling = workers_calling(
                metrics,
                "docstream_extractor_calls_total{extractor=\"warmup\"",
            )
            .await;
            match calling {
                n if n == workers => Ok(()),
                n => Err(format!("{n} of {workers} workers called")),
            }
        },
    )
    .await;
}
