//! The pipeline's processes as the benchmark runs them: children of this very
//! binary, measured from `/proc` (CPU seconds, peak RSS) and stopped with SIGTERM
//! like any deployment would stop them.
//!
//! A heap profile of some of them: `DOCSTREAM_BENCH_HEAPTRACK=worker-1,serve`
//! (process names as the report gives them) starts each named process with
//! heaptrack's preload library, which writes to a FIFO that heaptrack's
//! interpreter reads into `<logs>/<name>.heaptrack.gz` (read it with
//! `heaptrack_print`). The process keeps its own pid, so its CPU and memory
//! are still measured, with heaptrack's cost on top.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use tokio::process::{Child, Command};

/// Clock ticks per second in `/proc/<pid>/stat`: Linux's `USER_HZ`, 100 on
/// every architecture Linux exports to user space.
const USER_HZ: f64 = 100.0;

/// CPU seconds of one process from `/proc/<pid>/stat`: its own (utime +
/// stime) and that of its children it has reaped (cutime + cstime).
pub struct CpuTimes {
    /// User + system seconds of the process itself.
    pub own: f64,
    /// User + system seconds of its exited, reaped children.
    pub reaped_children: f64,
}

/// The CPU times of process `pid`.
pub fn cpu_of(pid: u32) -> anyhow::Result<CpuTimes> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command: state is the 3rd field overall,
    // utime the 14th, stime the 15th, cutime the 16th and cstime the 17th.
    let after = stat.rsplit_once(')').context("malformed /proc stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks =
        |i: usize| -> anyhow::Result<f64> { Ok(fields[i].parse::<u64>()? as f64 / USER_HZ) };
    Ok(CpuTimes {
        own: ticks(11)? + ticks(12)?,
        reaped_children: ticks(13)? + ticks(14)?,
    })
}

/// Peak resident set size of process `pid` over its life so far (VmHWM),
/// MiB.
pub fn peak_rss_mib_of(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM")?;
    Ok(kib / 1024.0)
}

/// Every process on this machine.
fn pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// The live children of process `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let parent = |child: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        // The 4th field overall, the 2nd after the parenthesised command.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    pids()
        .into_iter()
        .filter(|&child| parent(child) == Some(pid))
        .collect()
}

/// The processes on this machine whose command line contains `needle`.
pub fn pids_matching(needle: &str) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
        })
        .collect()
}

/// CPU seconds so far of a server made of `pids`: every live process, plus
/// the exited children the parents reaped (Postgres backends of closed
/// connections live on in the postmaster's children time).
pub fn server_cpu_s(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| cpu_of(*pid).ok())
        .map(|t| t.own + t.reaped_children)
        .sum()
}

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
        let heaptrack = heap_profiled(name)
            .then(|| heaptrack(name, logs))
            .transpose()?
            .unwrap_or_default();
        let mut command = Command::new(std::env::current_exe()?);
        // A secret the run gives outright wins over the file the benchmark
        // itself may have read it from.
        for (var, _) in env {
            command.env_remove(format!("{var}_FILE"));
        }
        let child = command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .envs(heaptrack)
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
        Ok(cpu_of(self.pid)?.own)
    }

    /// Peak resident set size (VmHWM), MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        peak_rss_mib_of(self.pid)
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

/// Whether `DOCSTREAM_BENCH_HEAPTRACK` names process `name`.
fn heap_profiled(name: &str) -> bool {
    let names = std::env::var("DOCSTREAM_BENCH_HEAPTRACK").unwrap_or_default();
    names.split(',').any(|n| n.trim() == name)
}

/// heaptrack's installation (Debian's `heaptrack` package).
const HEAPTRACK_PRELOAD: &str = "/usr/lib/heaptrack/libheaptrack_preload.so";
const HEAPTRACK_INTERPRET: &str = "/usr/lib/heaptrack/libexec/heaptrack_interpret";

/// Starts heaptrack's interpreter on a FIFO that process `name` is to write
/// to, into `<logs>/<name>.heaptrack.gz`: the environment that makes the
/// process write there. The interpreter ends when the process does.
fn heaptrack(name: &str, logs: &Path) -> anyhow::Result<Vec<(String, String)>> {
    for path in [HEAPTRACK_PRELOAD, HEAPTRACK_INTERPRET] {
        anyhow::ensure!(
            Path::new(path).exists(),
            "DOCSTREAM_BENCH_HEAPTRACK: no {path} (apt-get install heaptrack)"
        );
    }
    let fifo = logs.join(format!("{name}.heaptrack.fifo"));
    let output = logs.join(format!("{name}.heaptrack.gz"));
    let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
    anyhow::ensure!(made.success(), "mkfifo {} failed", fifo.display());
    let script = format!(
        "{HEAPTRACK_INTERPRET} < '{}' | gzip > '{}'; rm -f '{}'",
        fifo.display(),
        output.display(),
        fifo.display()
    );
    // It reads until the profiled process closes the FIFO; reaped then.
    let mut interpreter = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .context("starting heaptrack_interpret")?;
    tokio::spawn(async move { interpreter.wait().await });
    Ok(vec![
        ("LD_PRELOAD".into(), HEAPTRACK_PRELOAD.into()),
        (
            "DUMP_HEAPTRACK_OUTPUT".into(),
            fifo.to_string_lossy().into_owned(),
        ),
    ])
}
