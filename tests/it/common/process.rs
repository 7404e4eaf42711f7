//! Processes: spawning `docstream` children, signalling and stopping them,
//! waiting on conditions (health, anything polled), and measuring them.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::TestEnv;

impl TestEnv {
    /// Environment for a `docstream` child process of this test: every
    /// setting, so children run exactly what the test configured, except that
    /// each child's internal listener takes a free port.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let mut env = self.settings.to_env();
        env.push(("DOCSTREAM_METRICS_ADDR".into(), "127.0.0.1:0".into()));
        // `DOCSTREAM_TEST_CHILD_LOG` overrides the children's filter, to
        // debug a test (their logs are under target/tmp/test-logs).
        let log = std::env::var("DOCSTREAM_TEST_CHILD_LOG");
        let log = log.unwrap_or_else(|_| "info,rdkafka=warn,sqlx=warn".into());
        env.push(("DOCSTREAM_LOG".into(), log));
        env
    }

    /// Runs `docstream ARGS` (a command, not a role) on this test's
    /// settings, to its end: its exit status and output.
    pub async fn run_cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_docstream"))
            .args(args)
            .envs(self.child_env())
            .output()
            .await
            .expect("run docstream")
    }

    /// Starts `docstream <role>` as a separate OS process; its output goes to
    /// `target/tmp/test-logs/<log_name>.log`.
    pub fn spawn(&self, role: &str, extra_env: &[(&str, String)], log_name: &str) -> Child {
        let path = log_path(log_name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let log = std::fs::File::create(path).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_docstream"));
        command
            .arg(role)
            .envs(self.child_env())
            .envs(extra_env.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        command.spawn().expect("spawn docstream")
    }
}

/// Where a child spawned as `log_name` writes its output.
pub fn log_path(log_name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("test-logs")
        .join(format!("{log_name}.log"))
}

/// Waits (up to `bound`) until a line of `log_name`'s output satisfies
/// `wanted`, as the child writes it; panics naming `what` if none does.
pub async fn wait_for_log_line(
    log_name: &str,
    what: &str,
    wanted: impl Fn(&str) -> bool,
    bound: Duration,
) {
    let path = log_path(log_name);
    let deadline = Instant::now() + bound;
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().any(&wanted) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{log_name}: {what} within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `signal` (KILL, STOP, CONT, TERM) to a child process.
pub async fn signal(child: &Child, signal: &str) {
    let pid = child.id().expect("child still running");
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The value of one metric series scraped from `http://{addr}/metrics`, or 0.
pub async fn scrape(addr: &str, series: &str) -> f64 {
    let text = match super::env::http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
    {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |total, value| total + value)
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `timeout`
/// with `what` and the last state `describe` gives.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(state) if Instant::now() >= deadline => {
                panic!("timed out waiting for {what}: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until `GET {base}/healthz` answers 200.
pub async fn wait_healthy(base: &str) {
    let client = super::env::http_client();
    wait_for("the API to be healthy", Duration::from_secs(60), || {
        let request = client.get(format!("{base}/healthz")).send();
        async move {
            match request.await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}

/// Peak resident memory of a process, in KiB (VmHWM), if it is still there.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// SIGTERMs the children still running and waits for them.
pub async fn stop(children: impl IntoIterator<Item = &mut Child>) {
    for child in children {
        if child.id().is_some() {
            let _ = signal(child, "TERM").await;
            let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        }
    }
}

/// The `p` quantile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Starts a provider process and returns it with the URL it printed.
pub async fn start_provider(
    mut command: tokio::process::Command,
) -> (tokio::process::Child, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the provider");
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the provider prints its URL")
        .unwrap()
        .expect("a line");
    let url = line.rsplit(' ').next().unwrap().to_owned();
    (child, url)
}
