//! What a refusal costs against what an accepted submit costs, in CPU.
//!
//! Two `serve`s of their own, without workers (the jobs they accept wait in
//! the scratch database, dropped afterwards), their admission limit pinned
//! at [`LIMIT`] submits in flight:
//! 1. accepted: [`CLIENTS`] submitters in a closed loop, fewer than the
//!    limit, so every submit is admitted;
//! 2. refused: on the second `serve`, every submit stalls after its INSERT
//!    (the `submit.after_insert` failpoint) for longer than the window, so
//!    [`LIMIT`] submits hold every permit, and the same submitters, of the
//!    same tenant, are refused with 503 `overloaded`. The held ones are
//!    answered 202 after the window, before that `serve` stops.
//!
//! Each window gives `serve`'s CPU, Postgres's and the broker's, and this
//! process's (the HTTP client's), per answer.

use std::time::{Duration, Instant};

use serde::Serialize;

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
    let seconds = seconds.max(2.0);
    let key = crate::demo::unlimited_key(&rig.pool, "bench").await?;
    let client = crate::demo::api_client(&key.api_key)?;
    let accepted = {
        let serve = Pinned::start(rig, &client, None).await?;
        let cost = serve.window(&client, seconds).closed_loop("202").await;
        serve.stop().await?;
        cost?
    };
    // Held past the window, so that no permit frees while it runs.
    let stall = Duration::from_secs_f64(seconds + 5.0);
    let serve = Pinned::start(rig, &client, Some(stall)).await?;
    let refused = match hold_every_permit(&client, &serve.base, &rig.pool).await {
        Ok(held) => {
            let cost = serve
                .window(&client, seconds)
                .closed_loop("503 overloaded")
                .await;
            for submit in held {
                submit.await?;
            }
            cost
        }
        Err(e) => Err(e),
    };
    serve.stop().await?;
    Ok(Refusals {
        limit: LIMIT,
        clients: CLIENTS,
        accepted,
        refused: refused?,
    })
}

/// A `serve` with its limit pinned at [`LIMIT`], every submit stalled after
/// its INSERT for `stall` when given.
struct Pinned {
    base: String,
    proc: Proc,
}

impl Pinned {
    async fn start(
        rig: &Rig,
        client: &reqwest::Client,
        stall: Option<Duration>,
    ) -> anyhow::Result<Self> {
        let mut env = rig.env.clone();
        env.extend([
            ("DOCSTREAM_SUBMIT_MIN_IN_FLIGHT".into(), LIMIT.to_string()),
            ("DOCSTREAM_SUBMIT_MAX_IN_FLIGHT".into(), LIMIT.to_string()),
            ("DOCSTREAM_HTTP_ANSWER_TIMEOUT_S".into(), "120".into()),
            // The tenant's own rate would refuse first (429).
            ("DOCSTREAM_TENANT_SUBMIT_RATE_PER_S".into(), "0".into()),
        ]);
        if let Some(stall) = stall {
            let point = format!("submit.after_insert=sleep({})", stall.as_millis());
            env.push(("DOCSTREAM_FAILPOINTS".into(), point));
            // The bench runs a release build, which arms failpoints only when told.
            env.push(("DOCSTREAM_ALLOW_FAILPOINTS".into(), "1".into()));
        }
        let pinned = Rig {
            settings: rig.settings.clone(),
            env,
            pool: rig.pool.clone(),
            logs: rig.logs.clone(),
        };
        let (base, proc) = spawn_serve(&pinned)?;
        let mut procs = [proc];
        wait_healthy(client, &base, &mut procs).await?;
        let [proc] = procs;
        Ok(Self { base, proc })
    }

    fn window<'a>(&'a self, client: &'a reqwest::Client, seconds: f64) -> Window<'a> {
        Window {
            client,
            base: &self.base,
            serve: &self.proc,
            seconds,
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.proc.stop().await
    }
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

/// [`LIMIT`] submits that hold every permit (each stalls after its
/// INSERT): answers once all their rows are written and a submit is
/// refused. Each held one is a task that ends with its 202.
async fn hold_every_permit(
    client: &reqwest::Client,
    base: &str,
    pool: &sqlx::PgPool,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let rows = "SELECT count(*) FROM extractions";
    let before: i64 = sqlx::query_scalar(rows).fetch_one(pool).await?;
    let request = &requests_for(None)[0];
    let held: Vec<_> = (0..LIMIT)
        .map(|_| {
            let (client, base, request) = (client.clone(), base.to_owned(), request.clone());
            tokio::spawn(async move {
                let _ = post(&client, &base, &request).await;
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now: i64 = sqlx::query_scalar(rows).fetch_one(pool).await?;
        if now - before >= LIMIT as i64 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {LIMIT} held submits wrote their rows",
            now - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match post(client, base, request).await {
        Err(refused) if refused.0 == "503 overloaded" => Ok(held),
        answer => anyhow::bail!("with every permit held, a submit was answered {answer:?}"),
    }
}
