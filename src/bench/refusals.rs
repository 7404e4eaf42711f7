//! What a refusal costs against what an accepted submit costs, in CPU.
//!
//! A `serve` of its own, without workers (the jobs it accepts wait in the
//! scratch database, dropped afterwards), its admission limit pinned at
//! [`LIMIT`] submits in flight and its answer bound raised so that a held
//! submit keeps its permit through the measurement:
//! 1. accepted: [`CLIENTS`] submitters in a closed loop, fewer than the
//!    limit, so every submit is admitted;
//! 2. refused: [`LIMIT`] submits hold every permit (their headers sent,
//!    their bodies held back: a JSON submit takes its permit before its body
//!    is read), and the same submitters, of the same tenant, are refused
//!    with 503 `overloaded`.
//!
//! Each window gives `serve`'s CPU, Postgres's and the broker's, and this
//! process's (the HTTP client's), per answer.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::cost::services_cpu_s;
use super::pipeline::{post, requests_for, spawn_serve, wait_healthy, Rig};
use super::procs::{cpu_of, Proc};

/// Submits `serve` admits at once in this phase.
pub const LIMIT: usize = 16;
/// Submitters of each closed loop: fewer than [`LIMIT`].
pub const CLIENTS: usize = 8;
/// A refusal must cost at most this share of an accepted submit (every
/// process on the server side).
pub const REFUSAL_SHARE: f64 = 0.1;

/// The two windows.
#[derive(Debug, Clone, Serialize)]
pub struct Refusals {
    /// Submits admitted at once (the pinned limit).
    pub limit: usize,
    /// Closed-loop submitters.
    pub clients: usize,
    /// Submits accepted (202), and what each cost.
    pub accepted: Cost,
    /// Submits refused (503 `overloaded`), and what each cost.
    pub refused: Cost,
}

/// One window's answers and their CPU, µs per answer.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    /// Answers of the window's kind.
    pub answers: usize,
    /// Answers per second.
    pub per_s: f64,
    /// `serve`'s CPU.
    pub serve_cpu_us: f64,
    /// Postgres's and the broker's CPU.
    pub services_cpu_us: f64,
    /// This process's CPU: the HTTP client's side of the exchange.
    pub client_cpu_us: f64,
}

impl Cost {
    /// The server side: `serve`, Postgres and the broker.
    pub fn server_cpu_us(&self) -> f64 {
        self.serve_cpu_us + self.services_cpu_us
    }
}

/// Runs both windows on `rig`, each `seconds` long.
pub async fn refusals(rig: &Rig, seconds: f64) -> anyhow::Result<Refusals> {
    let mut rig_env = rig.env.clone();
    rig_env.extend([
        ("DOCSTREAM_SUBMIT_MIN_IN_FLIGHT".into(), LIMIT.to_string()),
        ("DOCSTREAM_SUBMIT_MAX_IN_FLIGHT".into(), LIMIT.to_string()),
        ("DOCSTREAM_HTTP_ANSWER_TIMEOUT_S".into(), "120".into()),
        // The tenant's own rate would refuse first (429).
        ("DOCSTREAM_TENANT_SUBMIT_RATE_PER_S".into(), "0".into()),
    ]);
    let pinned = Rig {
        settings: rig.settings.clone(),
        env: rig_env,
        pool: rig.pool.clone(),
        logs: rig.logs.clone(),
    };
    let (base, serve) = spawn_serve(&pinned)?;
    let mut procs = vec![serve];
    let key = crate::demo::unlimited_key(&rig.pool, "bench").await?;
    let client = crate::demo::api_client(&key.api_key)?;
    wait_healthy(&client, &base, &mut procs).await?;
    let window = Window {
        client: &client,
        base: &base,
        serve: &procs[0],
        seconds: seconds.max(2.0),
    };

    let accepted = window.closed_loop("202").await?;
    let held = hold_every_permit(&base, &key.api_key, &client).await?;
    let refused = window.closed_loop("503 overloaded").await?;
    drop(held);
    for proc in procs {
        proc.stop().await?;
    }
    Ok(Refusals {
        limit: LIMIT,
        clients: CLIENTS,
        accepted,
        refused,
    })
}

/// What a closed loop sends to.
struct Window<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
    serve: &'a Proc,
    seconds: f64,
}

impl Window<'_> {
    /// [`CLIENTS`] submitters, each sending the next as soon as the last
    /// is answered, for the window; every answer must be `expected` (`202`
    /// or a refusal's `503 overloaded`).
    async fn closed_loop(&self, expected: &str) -> anyhow::Result<Cost> {
        let samples = requests_for(None);
        let (serve_before, services_before) = (self.serve.cpu_s()?, services_cpu_s());
        let client_before = cpu_of(std::process::id())?.own;
        let started = Instant::now();
        let until = started + Duration::from_secs_f64(self.seconds);
        let submitter = |n: usize| {
            let samples = &samples;
            async move {
                let mut answers = 0usize;
                for request in samples.iter().cycle().skip(n) {
                    if Instant::now() >= until {
                        break;
                    }
                    let answer = match post(self.client, self.base, request).await {
                        Ok(_) => "202".to_owned(),
                        Err(refused) => refused.0,
                    };
                    anyhow::ensure!(answer == expected, "answered {answer}, not {expected}");
                    answers += 1;
                }
                Ok(answers)
            }
        };
        let counts = futures::future::join_all((0..CLIENTS).map(submitter)).await;
        let seconds = started.elapsed().as_secs_f64();
        let answers: usize = counts.into_iter().sum::<anyhow::Result<usize>>()?;
        let per_answer = |cpu_s: f64| cpu_s * 1e6 / answers.max(1) as f64;
        Ok(Cost {
            answers,
            per_s: answers as f64 / seconds,
            serve_cpu_us: per_answer(self.serve.cpu_s()? - serve_before),
            services_cpu_us: per_answer(services_cpu_s() - services_before),
            client_cpu_us: per_answer(cpu_of(std::process::id())?.own - client_before),
        })
    }
}

/// [`LIMIT`] submits that hold every permit: their headers sent, their
/// bodies never. Held until the connections are dropped; answers once a
/// submit is refused.
async fn hold_every_permit(
    base: &str,
    api_key: &str,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<TcpStream>> {
    let addr = base.trim_start_matches("http://");
    let head = format!(
        "POST /v1/extractions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {api_key}\r\n\
         content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{"
    );
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        let mut socket = TcpStream::connect(addr).await?;
        socket.write_all(head.as_bytes()).await?;
        held.push(socket);
    }
    let request = &requests_for(None)[0];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match post(client, base, request).await {
            Err(refused) if refused.0 == "503 overloaded" => return Ok(held),
            answer => {
                if Instant::now() >= deadline {
                    let answered = first_answer(&mut held[0]).await;
                    anyhow::bail!(
                        "the held submits took no permit: last {answer:?}; a held one: {answered}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// What a held submit's connection was answered, if anything, for the error.
async fn first_answer(socket: &mut TcpStream) -> String {
    let mut read = vec![0; 512];
    match tokio::time::timeout(Duration::from_millis(200), socket.read(&mut read)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&read[..n]).into_owned(),
        Ok(Err(e)) => format!("read failed: {e}"),
        Err(_) => "no answer".into(),
    }
}
