//! End to end through separate OS processes on the real broker and database:
//! 1,000 submissions over HTTP to `serve`, two `worker` processes and one
//! `bbox-worker` process. Every job must reach bbox succeeded, each extraction
//! must have run exactly once, and no transition may have won twice — checked on
//! the transition log and, independently, on the events topic.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{free_port, sample_body, wait_for, TestEnv};
use docstream::events::{decode, ExtractionEvent};
use futures::stream::{self, StreamExt};
use tokio::process::Child;
use uuid::Uuid;

const DOCUMENTS: usize = 1_000;

/// The transitions every job goes through, each won once.
const TRANSITIONS: [&str; 6] = [
    "submit",
    "mark_running",
    "mark_succeeded",
    "start_bbox_refinement",
    "mark_bbox_refinement_running",
    "mark_bbox_refinement_succeeded",
];

/// A thousand jobs through `serve`, two workers and a bbox worker, each its
/// own process: every job succeeds, each transition is won once, and the
/// events topic agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_jobs_through_separate_processes_run_exactly_once() {
    let env = TestEnv::new("e2e").await;
    let mut pipeline = serve_two_workers_and_a_bbox_worker(&env).await;
    let ids = pipeline.submit_a_thousand_documents().await;
    every_job_reaches_bbox_succeeded(&env).await;
    pipeline.sigterm_every_process_and_see_each_exit_0().await;
    each_transition_won_once_and_each_job_claimed_once(&env).await;
    the_events_topic_tells_the_same_story(&env, &ids);
}

/// The processes of the run, and the client that submits to `serve`.
struct Pipeline {
    base: String,
    client: reqwest::Client,
    workers: [Child; 3],
    serve: Child,
}

/// Starts `serve`, two `worker`s and a `bbox-worker` as separate processes
/// and waits for the API to be healthy.
async fn serve_two_workers_and_a_bbox_worker(env: &TestEnv) -> Pipeline {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let serve = env.spawn(
        "serve",
        &[("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))],
        "e2e-serve",
    );
    let workers = [
        env.spawn("worker", &[], "e2e-worker-1"),
        env.spawn("worker", &[], "e2e-worker-2"),
        env.spawn("bbox-worker", &[], "e2e-bbox-worker"),
    ];
    common::wait_healthy(&base).await;
    Pipeline {
        base,
        client: env.client(),
        workers,
        serve,
    }
}

impl Pipeline {
    /// Submits the sample documents over HTTP, 32 at a time, each answered
    /// 202; returns their ids.
    async fn submit_a_thousand_documents(&self) -> Vec<Uuid> {
        let (client, base) = (&self.client, &self.base);
        let ids: Vec<Uuid> = stream::iter(0..DOCUMENTS)
            .map(|i| {
                let request = client
                    .post(format!("{base}/v1/extractions"))
                    .json(&sample_body(i))
                    .send();
                async move {
                    let response = request.await.expect("submit");
                    assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
                    let body: serde_json::Value = response.json().await.unwrap();
                    body["id"].as_str().unwrap().parse::<Uuid>().unwrap()
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        assert_eq!(ids.len(), DOCUMENTS);
        ids
    }

    /// Graceful stop: every process exits 0 on SIGTERM (workers first, then
    /// `serve`; all signalled before any is waited for).
    async fn sigterm_every_process_and_see_each_exit_0(&mut self) {
        for child in self.workers.iter().chain(std::iter::once(&self.serve)) {
            common::signal(child, "TERM").await;
        }
        for child in self
            .workers
            .iter_mut()
            .chain(std::iter::once(&mut self.serve))
        {
            let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .unwrap()
                .unwrap();
            assert!(status.success(), "exit status {status}");
        }
    }
}

/// Waits (up to 300 s) until every job is succeeded and bbox succeeded.
async fn every_job_reaches_bbox_succeeded(env: &TestEnv) {
    let pool = env.pool.clone();
    wait_for(
        "every job to reach bbox succeeded",
        Duration::from_secs(300),
        || {
            let pool = pool.clone();
            async move {
                let done: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM extractions
                  WHERE status = 'succeeded' AND bbox_status = 'succeeded'",
                )
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
                if done == DOCUMENTS as i64 {
                    Ok(())
                } else {
                    Err(format!("{done}/{DOCUMENTS} done"))
                }
            }
        },
    )
    .await;
}

/// The transition log: each transition won exactly once per id; one claim each.
async fn each_transition_won_once_and_each_job_claimed_once(env: &TestEnv) {
    let wins: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT extraction_id, transition::text, count(*) FROM extraction_transitions GROUP BY 1, 2",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        wins.len(),
        DOCUMENTS * TRANSITIONS.len(),
        "one entry per (id, transition)"
    );
    for (id, transition, count) in &wins {
        assert!(
            TRANSITIONS.contains(&transition.as_str()),
            "unexpected {transition} for {id}"
        );
        assert_eq!(*count, 1, "{transition} won {count} times for {id}");
    }
    let attempts: Vec<i32> = sqlx::query_scalar("SELECT attempts FROM extractions")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    assert!(
        attempts.iter().all(|&a| a == 1),
        "an extraction was claimed twice"
    );
}

/// The events topic tells the same story, independently of the database:
/// each event keyed by its id, published once, one run per job, and every
/// submitted job's bbox success there.
fn the_events_topic_tells_the_same_story(env: &TestEnv, ids: &[Uuid]) {
    let per_id = events_per_id_and_transition(env);
    assert_eq!(per_id.len(), DOCUMENTS * TRANSITIONS.len());
    assert!(
        per_id.values().all(|&n| n == 1),
        "an event was published twice"
    );
    let runs = per_id.keys().filter(|(_, t)| t == "mark_running").count();
    assert_eq!(runs, DOCUMENTS, "each extraction ran exactly once");
    for id in ids {
        assert!(per_id.contains_key(&(id.to_string(), "mark_bbox_refinement_succeeded".to_owned())));
    }
}

/// How many times each (extraction id, transition) was published on the
/// events topic; asserts each event is keyed by its extraction id.
fn events_per_id_and_transition(env: &TestEnv) -> HashMap<(String, String), usize> {
    let mut per_id: HashMap<(String, String), usize> = HashMap::new();
    for (key, payload) in env.read_topic("extraction.events") {
        let event: ExtractionEvent = decode(&payload).expect("events decode");
        assert_eq!(
            key.as_deref(),
            Some(event.extraction_id.as_bytes()),
            "keyed by extraction id"
        );
        *per_id
            .entry((event.extraction_id, event.transition))
            .or_default() += 1;
    }
    per_id
}
