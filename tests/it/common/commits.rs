//! The commit rule, observed from outside: samples of a consumer group's
//! committed offsets on `extraction.submitted` beside the jobs delivered by
//! then, and the records a committed offset had passed before their job was
//! delivered (which must never happen).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use docstream::events::{decode, ExtractionSubmitted, PostProcessingRequested};
use rdkafka::Message;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::env::TestEnv;
use super::kafka::{read_topic_as, CommittedReader};

/// One observation: when it began (ms since the epoch), the group's committed
/// offsets, then the jobs not yet delivered.
pub struct Sample {
    pub at_ms: i64,
    pub committed: HashMap<i32, i64>,
    pub undelivered: HashSet<Uuid>,
}

/// Samples of the worker group's committed offsets, taken every half second
/// until [`Sampler::finish`], which takes one last sample after the stop.
/// Committed offsets are read first and the undelivered jobs after:
/// deliveries only grow, so a job still undelivered at the later read was
/// undelivered when the offsets were read. The check can miss a violation,
/// never invent one. A read that fails or takes over 5 s (the broker or
/// database is down in a fault test) is skipped. Reading the few jobs in
/// flight, not the many delivered, keeps the sampler light beside a loaded
/// pipeline.
pub struct Sampler {
    stop: CancellationToken,
    taken: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

/// Time between two samples.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Starts sampling the worker group, reading deliveries from `pool`.
pub fn sample_offsets(env: &TestEnv, pool: PgPool) -> Sampler {
    let brokers = env.settings.kafka_brokers.clone();
    let group = env.settings.group(&env.settings.worker_group);
    let topic = env.topic("extraction.submitted");
    let stop = CancellationToken::new();
    let (count, taken) = tokio::sync::watch::channel(0);
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let reader = Arc::new(CommittedReader::new(&brokers, &group, &topic));
        loop {
            // Read before looking at the stop: the last sample is taken after it.
            let last = stopped.is_cancelled();
            if let Some(sample) = one_sample(&reader, &pool).await {
                samples.push(sample);
                count.send_replace(samples.len());
            }
            if last {
                return samples;
            }
            tokio::select! {
                _ = stopped.cancelled() => {}
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    });
    Sampler { stop, taken, task }
}

impl Sampler {
    /// Waits (up to 60 s) until the first sample is in.
    pub async fn first_sample(&mut self) {
        tokio::time::timeout(Duration::from_secs(60), self.taken.wait_for(|n| *n > 0))
            .await
            .expect("the offset sampler took a sample within 60 s")
            .expect("the offset sampler is running");
    }

    /// Stops sampling after one last sample; every sample taken.
    pub async fn finish(self) -> Vec<Sample> {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

/// One sample, or none if a read failed or took over 5 s.
async fn one_sample(reader: &Arc<CommittedReader>, pool: &PgPool) -> Option<Sample> {
    let at_ms = chrono::Utc::now().timestamp_millis();
    let r = reader.clone();
    let committed = tokio::task::spawn_blocking(move || r.read()).await.unwrap();
    // Delivered: the record's transition is durable and its follow-up event
    // acknowledged: the stamp is written after the ack, unless a bbox worker
    // has taken the follow-up already (then it was acknowledged too, and the
    // stamp is skipped). Undelivered: still in the first stage, or through it
    // with the follow-up unstamped. Bounded: a fault test may blackhole the
    // database's address.
    let undelivered = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::query_scalar::<_, Uuid>(
            "SELECT id FROM extractions
              WHERE status IN ('queued', 'running')
                 OR (bbox_status = 'pending' AND bbox_published_at IS NULL)",
        )
        .fetch_all(pool),
    )
    .await;
    match (committed, undelivered) {
        (Ok(committed), Ok(Ok(undelivered))) => Some(Sample {
            at_ms,
            committed,
            undelivered: undelivered.into_iter().collect(),
        }),
        _ => None,
    }
}

/// Offset-ahead violations: committed offsets past a record not yet delivered.
/// A job counts by its last record produced before the sample began: a
/// duplicate of a delivered job is delivered by skipping it, and a record
/// whose claim was taken over (its holder fenced out after its lease ran out
/// under a fault) hands the job to the later record that the new holder
/// claimed from, so committing the earlier one is right while the later one
/// is not committed.
///
/// With `stamps_may_fail`, for tests that take the database away: the
/// "published" stamp is written after the follow-up's acknowledgement, and a
/// stamp that fails is left to the reaper, so the database can call a
/// delivered job undelivered. Such a job counts only if no follow-up for it
/// had been produced when the sample began (the follow-up records' create
/// times, on this machine's clock). That misses a commit between a
/// follow-up's send and its acknowledgement; a commit before the work's
/// follow-up was sent is still caught.
pub fn offset_ahead_violations(env: &TestEnv, samples: &[Sample], stamps_may_fail: bool) -> usize {
    let brokers = &env.settings.kafka_brokers;
    // Each partition's records: (offset, create time, job), in offset order.
    let mut by_partition: BTreeMap<i32, Vec<(i64, i64, Uuid)>> = BTreeMap::new();
    for (partition, offset, at, payload) in
        read_topic_as(brokers, &env.topic("extraction.submitted"), |message| {
            let at = message.timestamp().to_millis().unwrap_or(i64::MAX);
            let payload = message.payload().unwrap_or_default().to_vec();
            (message.partition(), message.offset(), at, payload)
        })
    {
        let event: ExtractionSubmitted = decode(&payload).unwrap();
        by_partition.entry(partition).or_default().push((
            offset,
            at,
            event.extraction_id.parse().unwrap(),
        ));
    }
    for records in by_partition.values_mut() {
        records.sort_unstable();
    }
    let mut followed_up: HashMap<Uuid, i64> = HashMap::new();
    let topic = env.topic("extraction.post_processing.requested");
    for (at, payload) in read_topic_as(brokers, &topic, |message| {
        let at = message.timestamp().to_millis().unwrap_or(i64::MAX);
        (at, message.payload().unwrap_or_default().to_vec())
    }) {
        let event: PostProcessingRequested = decode(&payload).unwrap();
        let first = followed_up
            .entry(event.extraction_id.parse().unwrap())
            .or_insert(at);
        *first = (*first).min(at);
    }
    let mut violations = 0;
    for sample in samples {
        for (partition, committed) in &sample.committed {
            let records = by_partition
                .get(partition)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut last: HashMap<Uuid, i64> = HashMap::new();
            for (offset, at, id) in records {
                if *at <= sample.at_ms {
                    last.insert(*id, *offset);
                }
            }
            let mut ahead: Vec<_> = last
                .into_iter()
                .filter(|(id, offset)| {
                    let produced = stamps_may_fail
                        && followed_up.get(id).is_some_and(|at| *at <= sample.at_ms);
                    offset < committed && sample.undelivered.contains(id) && !produced
                })
                .map(|(id, offset)| (offset, id))
                .collect();
            ahead.sort_unstable();
            if let Some((offset, id)) = ahead.first() {
                eprintln!("offset ahead: partition {partition} committed {committed} > undelivered offset {offset} ({id}), {} records", ahead.len());
            }
            violations += ahead.len();
        }
    }
    violations
}
