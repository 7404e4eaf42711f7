//! The child processes files are read and drawn with (`docstream read-pdf`,
//! Tesseract, ImageMagick's `convert`, poppler's `pdftoppm`), each run the
//! same way, so none is trusted with more than its work needs:
//!
//! - an empty environment plus what the program needs (`PATH`, and the
//!   variables the caller names): no database URL, key or secret of the
//!   parent reaches a program fed untrusted bytes;
//! - a private temporary folder, its working directory and `TMPDIR` (and
//!   ImageMagick's), removed when the run ends, however it ends: a child
//!   killed mid-page leaves nothing in `/tmp`;
//! - its address space and CPU time capped (`prlimit`); in a process group
//!   of its own, which is killed, whatever it started included, at its time
//!   limit or when the future is dropped;
//! - at most a cap of bytes read back from its standard output (past it, it
//!   is killed), and the last few kilobytes of its standard error kept (all
//!   of it is read: a program that reports every flaw of a damaged file is
//!   not stopped by a full pipe).
//!
//! The input goes in on standard input, the answer comes out on standard
//! output.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use axum::body::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// What a child may take.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Longest it may run (and, plus a second, its CPU time).
    pub time: Duration,
    /// Most bytes of address space.
    pub memory: u64,
    /// Most bytes it may write to its standard output.
    pub output: usize,
}

/// How a child ended, when not well.
#[derive(Debug)]
pub enum Run {
    /// It ran past its time (or its CPU time).
    TimedOut,
    /// It failed on its input: its exit, and the last line it wrote to
    /// standard error.
    Failed(String),
    /// It wrote more than its cap of output.
    TooMuchOutput(usize),
    /// It could not be started, was stopped from outside (SIGTERM, SIGINT,
    /// SIGHUP: the machine shutting down), or its pipes failed: a fault of
    /// this machine, not of the input.
    Unavailable(String),
}

/// Most bytes of a child's standard error kept (its last line names the
/// failure).
const STDERR_CAP: usize = 16 * 1024;

/// Runs `program args` under `caps` with `input` on its standard input, in
/// an empty environment but for `PATH` and `env`, in a temporary folder of
/// its own. Its standard output.
pub async fn run(
    program: &Path,
    args: &[String],
    env: &[(&str, OsString)],
    input: Bytes,
    caps: Caps,
) -> Result<Vec<u8>, Run> {
    let place = tempfile::Builder::new()
        .prefix("docstream-child-")
        .tempdir()
        .map_err(|e| Run::Unavailable(format!("cannot make a temporary folder: {e}")))?;
    let cpu_s = caps.time.as_secs().saturating_add(1);
    let mut command = tokio::process::Command::new("prlimit");
    command
        .arg(format!("--as={}", caps.memory))
        .arg(format!("--cpu={cpu_s}"))
        .arg("--")
        .arg(program)
        .args(args)
        .env_clear()
        .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
        .env("TMPDIR", place.path())
        .env("MAGICK_TEMPORARY_PATH", place.path())
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .current_dir(place.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| Run::Unavailable(format!("cannot run {}: {e}", program.display())))?;
    // Dropped before `place`: the group is gone before its folder is.
    let _group = Group(child.id());
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let write = async move {
        // A program that stops reading early (a refusal) closes its end.
        let _ = stdin.write_all(&input).await;
    };
    let ran = async {
        let (_, out, err) = tokio::join!(
            write,
            read_within(stdout, caps.output),
            read_tail(stderr, STDERR_CAP)
        );
        let broken =
            |e: std::io::Error| Run::Unavailable(format!("reading its answer failed: {e}"));
        match out {
            // Past the cap: killed (the child is dropped with the future
            // below, and `kill_on_drop` and its group's guard end it).
            Err(Within::Past) => Err(Run::TooMuchOutput(caps.output)),
            Err(Within::Io(e)) => Err(broken(e)),
            Ok(out) => {
                let status = child.wait().await.map_err(broken)?;
                Ok((status, out, err.unwrap_or_default()))
            }
        }
    };
    let (status, stdout, stderr) = match tokio::time::timeout(caps.time, ran).await {
        Ok(ran) => ran?,
        Err(_) => return Err(Run::TimedOut),
    };
    // The folder goes when `place` is dropped, here or on any way out.
    drop(place);
    if status.success() {
        return Ok(stdout);
    }
    let said = String::from_utf8_lossy(&stderr);
    let said = said
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    // prlimit runs the program in its own place: its exit is the program's.
    // Killed for its CPU time, it timed out.
    use std::os::unix::process::ExitStatusExt;
    if status.signal() == Some(libc::SIGKILL) || status.signal() == Some(libc::SIGXCPU) {
        return Err(Run::TimedOut);
    }
    let outside = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    if status.signal().is_some_and(|s| outside.contains(&s)) {
        return Err(Run::Unavailable(format!(
            "{} was stopped from outside ({status})",
            program.display()
        )));
    }
    if status.code() == Some(127) || said.contains("failed to execute") {
        return Err(Run::Unavailable(format!(
            "cannot run {}: {said}",
            program.display()
        )));
    }
    Err(Run::Failed(format!("{status} ({said})")))
}

/// Kills a child's process group when dropped: what the program started
/// goes with it.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        let group = self.0.and_then(|pid| i32::try_from(pid).ok());
        if let Some(group) = group.and_then(rustix::process::Pid::from_raw) {
            // A group already gone is ESRCH: nothing to do.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

enum Within {
    Past,
    Io(std::io::Error),
}

/// All of `from` read, the last `cap` bytes of it kept.
async fn read_tail(mut from: impl AsyncRead + Unpin, cap: usize) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return Ok(kept);
        }
        kept.extend_from_slice(&chunk[..n]);
        if kept.len() > 2 * cap {
            kept.drain(..kept.len() - cap);
        }
    }
}

/// All of `from`, unless it is more than `cap` bytes.
async fn read_within(from: impl AsyncRead + Unpin, cap: usize) -> Result<Vec<u8>, Within> {
    let mut read = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    from.take(limit)
        .read_to_end(&mut read)
        .await
        .map_err(Within::Io)?;
    match read.len() > cap {
        true => Err(Within::Past),
        false => Ok(read),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps {
        time: Duration::from_secs(5),
        memory: 1 << 30,
        output: 1024,
    };

    fn sh(script: &str) -> Vec<String> {
        vec!["-c".to_owned(), script.to_owned()]
    }

    #[tokio::test]
    async fn a_child_sees_only_the_environment_it_is_given_and_a_folder_of_its_own() {
        // The test's own environment has HOME (and cargo's variables).
        assert!(std::env::var_os("HOME").is_some());
        let env = [("OMP_THREAD_LIMIT", OsString::from("1"))];
        let out = run(
            Path::new("/bin/sh"),
            &sh("env; pwd"),
            &env,
            Bytes::new(),
            CAPS,
        )
        .await
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("HOME=") && !out.contains("CARGO"), "{out}");
        assert!(out.contains("OMP_THREAD_LIMIT=1"), "{out}");
        let place = out.lines().last().unwrap().to_owned();
        assert!(place.contains("docstream-child-"), "{out}");
        assert!(out.contains(&format!("TMPDIR={place}")), "{out}");
        assert!(!Path::new(&place).exists(), "{place} is left behind");
    }

    #[tokio::test]
    async fn a_child_killed_at_its_time_leaves_no_folder_behind() {
        let caps = Caps {
            time: Duration::from_millis(500),
            ..CAPS
        };
        let marker =
            std::env::temp_dir().join(format!("docstream-child-probe-{}", std::process::id()));
        let script = format!("pwd > {}; touch left.tmp; exec sleep 30", marker.display());
        let ran = run(Path::new("/bin/sh"), &sh(&script), &[], Bytes::new(), caps).await;
        assert!(matches!(ran, Err(Run::TimedOut)), "{ran:?}");
        let place = std::fs::read_to_string(&marker).unwrap();
        std::fs::remove_file(&marker).unwrap();
        assert!(!Path::new(place.trim()).exists(), "{place} is left behind");
    }

    #[tokio::test]
    async fn a_child_past_its_output_cap_is_stopped() {
        let ran = run(
            Path::new("/bin/sh"),
            &sh("exec yes"),
            &[],
            Bytes::new(),
            CAPS,
        )
        .await;
        assert!(matches!(ran, Err(Run::TooMuchOutput(1024))), "{ran:?}");
        let ran = run(
            Path::new("/bin/sh"),
            &sh("head -c 1024 /dev/zero"),
            &[],
            Bytes::new(),
            CAPS,
        )
        .await;
        assert_eq!(ran.unwrap().len(), 1024);
    }

    #[tokio::test]
    async fn a_child_that_says_much_on_standard_error_is_not_stopped_by_it() {
        let script = "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo the last line >&2; echo done";
        let ran = run(Path::new("/bin/sh"), &sh(script), &[], Bytes::new(), CAPS).await;
        assert_eq!(ran.unwrap(), b"done\n");
        let script =
            "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo the last line >&2; exit 3";
        let ran = run(Path::new("/bin/sh"), &sh(script), &[], Bytes::new(), CAPS).await;
        assert!(
            matches!(&ran, Err(Run::Failed(why)) if why.contains("the last line")),
            "{ran:?}"
        );
    }

    #[tokio::test]
    async fn a_child_stopped_from_outside_is_not_a_failure_of_its_input() {
        let ran = run(
            Path::new("/bin/sh"),
            &sh("kill -TERM $$"),
            &[],
            Bytes::new(),
            CAPS,
        )
        .await;
        assert!(matches!(ran, Err(Run::Unavailable(_))), "{ran:?}");
        let ran = run(
            Path::new("/bin/sh"),
            &sh("kill -SEGV $$"),
            &[],
            Bytes::new(),
            CAPS,
        )
        .await;
        assert!(matches!(ran, Err(Run::Failed(_))), "{ran:?}");
    }

    #[tokio::test]
    async fn what_a_child_started_is_killed_with_it() {
        let caps = Caps {
            time: Duration::from_millis(500),
            ..CAPS
        };
        let marker =
            std::env::temp_dir().join(format!("docstream-child-group-{}", std::process::id()));
        // A grandchild that would outlive its parent, and says its pid.
        let script = format!("sleep 30 & echo $! > {}; wait", marker.display());
        let ran = run(Path::new("/bin/sh"), &sh(&script), &[], Bytes::new(), caps).await;
        assert!(matches!(ran, Err(Run::TimedOut)), "{ran:?}");
        let pid: i32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::remove_file(&marker).unwrap();
        let gone = || {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        };
        let started = std::time::Instant::now();
        while !gone() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the grandchild {pid} lives on"
            );
            tokio::task::yield_now().await;
        }
    }
}
