//! docstream behind a real PgBouncer (`scripts/services.sh up --pooler`).
//! Session mode is supported: two workers and a bbox worker revive orphans
//! and finish each exactly once through it, and a session-level lock taken
//! through it is held by one session only (the sweepers' single-sweeper
//! lock). Transaction mode is refused at start, with the reason.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    assert_exactly_once, fast_recovery, insert_job, stop, wait_count, wins, TestEnv,
    ALL_BBOX_SUCCEEDED,
};
use sqlx::{Connection, PgConnection};

/// `url` with its host and port replaced by the pooler at `var`.
fn through(var: &str, url: &str) -> String {
    let pooler = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} unset: run under scripts/test.sh, which starts the PgBouncers")
    });
    let (host, port) = pooler.rsplit_once(':').unwrap();
    let mut url = reqwest::Url::parse(url).unwrap();
    url.set_host(Some(host)).unwrap();
    url.set_port(Some(port.parse().unwrap())).unwrap();
    url.to_string()
}

/// A session-level advisory lock through the session pooler: a second
/// client's try fails while the first holds it, and succeeds once it lets go.
async fn a_session_lock_is_one_sessions(url: &str) {
    const KEY: i64 = 0x706f_6f6c;
    let mut first = PgConnection::connect(url).await.unwrap();
    let mut second = PgConnection::connect(url).await.unwrap();
    let try_lock = "SELECT pg_try_advisory_lock($1)";
    let held: bool = sqlx::query_scalar(try_lock)
        .bind(KEY)
        .fetch_one(&mut first)
        .await
        .unwrap();
    assert!(held, "the first session takes the lock");
    let also: bool = sqlx::query_scalar(try_lock)
        .bind(KEY)
        .fetch_one(&mut second)
        .await
        .unwrap();
    assert!(
        !also,
        "a second session got a lock the first holds: the pooler shares sessions"
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(KEY)
        .execute(&mut first)
        .await
        .unwrap();
    let now: bool = sqlx::query_scalar(try_lock)
        .bind(KEY)
        .fetch_one(&mut second)
        .await
        .unwrap();
    assert!(now, "free once the first let go");
    second.close().await.unwrap();
    first.close().await.unwrap();
}

/// 24 orphans (jobs stored, never published) left for the sweepers; two
/// workers and a bbox worker, all through PgBouncer in session mode, revive
/// them: each finishes extraction and bbox exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_in_session_mode_runs_the_sweepers_and_the_pipeline() {
    let mut env = TestEnv::with_settings("pooler_session", fast_recovery).await;
    let pooled = through("DOCSTREAM_TEST_POOLER_SESSION", &env.settings.database_url);
    a_session_lock_is_one_sessions(&pooled).await;
    let mut orphans = Vec::new();
    for _ in 0..24 {
        orphans.push(insert_job(&env.pool).await);
    }
    env.settings.database_url = pooled;
    let sweep_often = [("DOCSTREAM_REAPER_SWEEP_INTERVAL_S", "0.2".to_owned())];
    let mut children = [
        env.spawn("worker", &sweep_often, "pooler-worker-1"),
        env.spawn("worker", &sweep_often, "pooler-worker-2"),
        env.spawn("bbox-worker", &sweep_often, "pooler-bbox-worker"),
    ];
    wait_count(
        &env.pool,
        "the orphans finished through the pooler",
        ALL_BBOX_SUCCEEDED,
        orphans.len() as i64,
        Duration::from_secs(120),
    )
    .await;
    stop(children.iter_mut()).await;
    assert_exactly_once(
        &wins(&env.pool, "mark_succeeded").await,
        &orphans,
        "extraction",
    );
    assert_exactly_once(
        &wins(&env.pool, "mark_bbox_refinement_succeeded").await,
        &orphans,
        "bbox",
    );
}

/// A worker pointed at PgBouncer in transaction mode ends at start, within
/// 30 s, saying that it needs session mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_in_transaction_mode_is_refused_at_start() {
    let env = TestEnv::postgres_only("pooler_transaction").await;
    let pooled = through(
        "DOCSTREAM_TEST_POOLER_TRANSACTION",
        &env.settings.database_url,
    );
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
            .arg("worker")
            .envs(env.child_env())
            .env("DATABASE_URL", &pooled)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the worker ends within 30 s")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the worker ran on: {stderr}");
    assert!(stderr.contains("transaction or statement mode"), "{stderr}");
    assert!(stderr.contains("session mode"), "{stderr}");
    eprintln!("refused in {:?}", started.elapsed());
}
