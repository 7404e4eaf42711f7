//! The pipeline's processes as the benchmark runs them: children of this very
//! binary, measured from `/proc` (CPU seconds, peak RSS) and stopped with SIGTERM
//! like any deployment would stop them.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use tokio::process::{Child, Command};

/// Clock ticks per second in `/proc/<pid>/stat`: Linux's `USER_HZ`, 100 on
/// every architecture Linux exports to user space.
const USER_HZ: f64 = 100.0;

/// A running `docstream <role>` child.
pub struct Proc {
    /// Name in the report, e.g. `worker-1`.
    pub name: String,
    child: Child,
    pid: u32,
}

/// What one process cost over a measured window.
#[derive(Debug, Clone, Serialize)]
pub struct ProcCost {
    /// Name in the report.
    pub name: String,
    /// User + system CPU seconds spent in the window.
    pub cpu_s: f64,
    /// Peak resident set size over the process's life (VmHWM), MiB.
    pub peak_rss_mib: f64,
}

impl Proc {
    /// Starts `docstream <role>` with `env` on top of ours; its output goes to
    /// `<logs>/<name>.log`.
    pub fn spawn(
        name: &str,
        role: &str,
        env: &[(String, String)],
        logs: &Path,
    ) -> anyhow::Result<Self> {
        Self::spawn_args(name, &[role.to_owned()], env, logs)
    }

    /// Like [`Proc::spawn`], with the whole command line after `docstream`.
    pub fn spawn_args(
        name: &str,
        args: &[String],
        env: &[(String, String)],
        logs: &Path,
    ) -> anyhow::Result<Self> {
        let log = std::fs::File::create(logs.join(format!("{name}.log")))?;
        let child = Command::new(std::env::current_exe()?)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("child without pid")?;
        Ok(Self {
            name: name.to_owned(),
            child,
            pid,
        })
    }

    /// User + system CPU seconds so far.
    pub fn cpu_s(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // Fields after the parenthesised command: state is the 3rd field overall,
        // utime the 14th and stime the 15th.
        let after = stat.rsplit_once(')').context("malformed /proc stat")?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
        Ok(ticks as f64 / USER_HZ)
    }

    /// Peak resident set size (VmHWM), MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmHWM")?;
        Ok(kib / 1024.0)
    }

    /// The cost since `cpu_at_start` (from [`cpu_s`](Self::cpu_s)).
    pub fn cost_since(&self, cpu_at_start: f64) -> anyhow::Result<ProcCost> {
        Ok(ProcCost {
            name: self.name.clone(),
            cpu_s: self.cpu_s()? - cpu_at_start,
            peak_rss_mib: self.peak_rss_mib()?,
        })
    }

    /// Fails when the process already exited (it should be serving).
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!("{} exited early: {status}", self.name),
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let signalled = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await?;
        anyhow::ensure!(signalled.success(), "could not signal {}", self.name);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .with_context(|| format!("{} did not stop within 60 s of SIGTERM", self.name))??;
        anyhow::ensure!(status.success(), "{} exited with {status}", self.name);
        Ok(())
    }
}
