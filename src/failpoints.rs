//! Test-only failpoints, so fault tests can crash a real process between two
//! steps or make a step fail. Off unless `DOCSTREAM_FAILPOINTS` is set, e.g.
//! `worker.after_mark_succeeded=abort;worker.extract=error`.
//!
//! Actions: `abort` (the process dies at once, as under SIGKILL: no cleanup, no
//! commit), `error` (the step fails), `sleep(MS)` (the step stalls). The table is
//! process-global by design, like the `fail` crate's: a failpoint is a property
//! of the process under test, set once at start-up and never changed.
//!
//! Points: `submit.after_insert`, `worker.after_claim`, `worker.extract`,
//! `worker.after_mark_succeeded`, `worker.before_retry_publish`, `bbox.after_claim`,
//! `webhook.after_state_change` (a terminal transition wrote a delivery),
//! `webhook.before_send` (an attempt is claimed).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

/// What a failpoint does when reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Abort the process.
    Abort,
    /// Fail the step.
    Error,
    /// Stall the step for this long.
    Sleep(Duration),
}

/// A step failed because its failpoint said so.
#[derive(Debug, thiserror::Error)]
#[error("failpoint {0} triggered")]
pub struct Triggered(pub &'static str);

static POINTS: OnceLock<HashMap<String, Action>> = OnceLock::new();

/// Reads `DOCSTREAM_FAILPOINTS`; call once at start-up. A release build
/// refuses to arm any unless `DOCSTREAM_ALLOW_FAILPOINTS=1` says it is meant
/// (failpoints abort processes and fail steps on purpose: a stray variable
/// in a production environment must not).
pub fn init_from_env() -> Result<(), String> {
    let spec = std::env::var("DOCSTREAM_FAILPOINTS").unwrap_or_default();
    let allowed = std::env::var("DOCSTREAM_ALLOW_FAILPOINTS").as_deref() == Ok("1");
    let points = parse(&spec)?;
    if !points.is_empty() && !cfg!(debug_assertions) && !allowed {
        return Err(refused(&points));
    }
    if !points.is_empty() {
        tracing::warn!(?points, "failpoints armed");
    }
    let _ = POINTS.set(points);
    Ok(())
}

fn parse(spec: &str) -> Result<HashMap<String, Action>, String> {
    let mut points = HashMap::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, action) = entry
            .split_once('=')
            .ok_or_else(|| format!("failpoint {entry:?}: expected name=action"))?;
        let action = match action {
            "abort" => Action::Abort,
            "error" => Action::Error,
            other => {
                let ms = other
                    .strip_prefix("sleep(")
                    .and_then(|rest| rest.strip_suffix(')'))
                    .and_then(|ms| ms.parse().ok())
                    .ok_or_else(|| format!("failpoint {name}: unknown action {other:?}"))?;
                Action::Sleep(Duration::from_millis(ms))
            }
        };
        points.insert(name.to_owned(), action);
    }
    Ok(points)
}

/// Why a release build refuses `points`.
fn refused(points: &HashMap<String, Action>) -> String {
    let mut names: Vec<&str> = points.keys().map(String::as_str).collect();
    names.sort_unstable();
    format!(
        "failpoints ({}) are for tests: this release build arms them only with \
         DOCSTREAM_ALLOW_FAILPOINTS=1",
        names.join(", ")
    )
}

/// Runs failpoint `name`: nothing unless it is armed.
pub async fn hit(name: &'static str) -> Result<(), Triggered> {
    match POINTS.get().and_then(|p| p.get(name)) {
        None => Ok(()),
        Some(Action::Abort) => {
            tracing::error!(failpoint = name, "failpoint: aborting the process");
            std::process::abort()
        }
        Some(Action::Error) => Err(Triggered(name)),
        Some(Action::Sleep(pause)) => {
            tokio::time::sleep(*pause).await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_action_and_refuses_nonsense() {
        let points = parse("a=abort; b=error;c=sleep(250)").unwrap();
        assert_eq!(points["a"], Action::Abort);
        assert_eq!(points["b"], Action::Error);
        assert_eq!(points["c"], Action::Sleep(Duration::from_millis(250)));
        assert!(parse("a").is_err());
        assert!(parse("a=explode").is_err());
        assert!(parse("").unwrap().is_empty());
        let refusal = refused(&points);
        assert!(refusal.contains("a, b, c") && refusal.contains("DOCSTREAM_ALLOW_FAILPOINTS=1"));
    }
}
