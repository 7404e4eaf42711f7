//! The ceilings measured by other programs: Kafka's own perf tools and the peer
//! job queues (graphile-worker, River), each run by its script in
//! `scripts/bench/`, which prints one JSON object as its last line.

use std::path::Path;

use anyhow::Context;
use tokio::process::Command;

/// Runs `scripts/bench/<script>` with `args`; returns its JSON answer. Its
/// progress (stderr) goes to `<logs>/<log>.log`.
pub async fn run(
    scripts: &Path,
    (script, log): (&str, &str),
    args: &[String],
    logs: &Path,
) -> anyhow::Result<serde_json::Value> {
    let path = scripts.join(script);
    let log = logs.join(format!("{log}.log"));
    let output = Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .await
        .with_context(|| format!("running {}", path.display()))?;
    std::fs::write(&log, &output.stderr)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{script} failed ({}); see {}: {}",
        output.status,
        log.display(),
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .last()
            .unwrap_or_default()
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).with_context(|| format!("{script} printed no JSON: {stdout}"))
}

/// A numeric field of a script's answer.
pub fn number(answer: &serde_json::Value, field: &str) -> anyhow::Result<f64> {
    answer[field]
        .as_f64()
        .with_context(|| format!("no number `{field}` in {answer}"))
}
