//! The commit rule, observed from outside: samples of a consumer group's
//! committed offsets on `extraction.submitted` beside the jobs delivered by
//! then, and the records a committed offset had passed before their job was
//! delivered (which must never happen).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use docstream::events::{decode, ExtractionSubmitted};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::env::TestEnv;
use super::kafka::{read_topic_positioned, CommittedReader};

/// One observation: the group's committed offsets, then the jobs not yet
/// delivered.
pub struct Sample {
    pub committed: HashMap<i32, i64>,
    pub undelivered: HashSet<Uuid>,
}

/// Samples the worker group every second until stopped. Committed offsets are
/// read first and the undelivered jobs after: deliveries only grow, so a job
/// still undelivered at the later read was undelivered when the offsets were
/// read. The check can miss a violation, never invent one. A read that fails
/// (the broker or database is down in a fault test) is skipped. Reading the
/// few jobs in flight, not the many delivered, keeps the sampler light beside
/// a loaded pipeline.
pub fn sample_offsets(
    env: &TestEnv,
    pool: PgPool,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let brokers = env.settings.kafka_brokers.clone();
    let group = env.settings.group(&env.settings.worker_group);
    let topic = env.topic("extraction.submitted");
    tokio::spawn(async move {
        let mut samples = Vec::new();
        let reader = Arc::new(CommittedReader::new(&brokers, &group, &topic));
        while !stop.is_cancelled() {
            let r = reader.clone();
            let committed = tokio::task::spawn_blocking(move || r.read()).await.unwrap();
            // Delivered: the record's transition is durable and its follow-up
            // event acknowledged: the stamp is written after the ack, unless a
            // bbox worker has taken the follow-up already (then it was
            // acknowledged too, and the stamp is skipped). Undelivered: still
            // in the first stage, or through it with the follow-up unstamped.
            let undelivered: Result<Vec<Uuid>, _> = sqlx::query_scalar(
                "SELECT id FROM extractions
                  WHERE status IN ('queued', 'running')
                     OR (bbox_status = 'pending' AND bbox_published_at IS NULL)",
            )
            .fetch_all(&pool)
            .await;
            if let (Ok(committed), Ok(undelivered)) = (committed, undelivered) {
                samples.push(Sample {
                    committed,
                    undelivered: undelivered.into_iter().collect(),
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        samples
    })
}

/// Offset-ahead violations: committed offsets past a record not yet delivered.
/// Only first records of a job count (a duplicate of a delivered job is
/// delivered by skipping it).
pub fn offset_ahead_violations(env: &TestEnv, samples: &[Sample]) -> usize {
    let mut by_partition: BTreeMap<i32, Vec<(i64, Uuid)>> = BTreeMap::new();
    for (partition, offset, _, payload) in read_topic_positioned(
        &env.settings.kafka_brokers,
        &env.topic("extraction.submitted"),
    ) {
        let event: ExtractionSubmitted = decode(&payload).unwrap();
        by_partition
            .entry(partition)
            .or_default()
            .push((offset, event.extraction_id.parse().unwrap()));
    }
    let mut violations = 0;
    for sample in samples {
        for (partition, committed) in &sample.committed {
            let records = by_partition
                .get(partition)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let ahead: Vec<_> = records
                .iter()
                .filter(|(offset, id)| offset < committed && sample.undelivered.contains(id))
                .collect();
            if let Some((offset, id)) = ahead.first() {
                eprintln!("offset ahead: partition {partition} committed {committed} > undelivered offset {offset} ({id}), {} records", ahead.len());
            }
            violations += ahead.len();
        }
    }
    violations
}
