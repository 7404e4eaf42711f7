//! What a job costs the whole system, measured around a burn-down: CPU of
//! every process involved (the submitter, the workers, Postgres, the broker,
//! all read from `/proc`), WAL written, statements executed, and Kafka records
//! and bytes produced, each divided by the number of jobs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use sqlx::PgPool;

use super::procs::{cpu_of, pids_matching, server_cpu_s, ProcCost};
use docstream::config::Settings;
use docstream::kafka::topics::topic_specs;

/// One job's cost, averaged over a burn-down.
#[derive(Debug, Clone, Serialize)]
pub struct JobCost {
    /// CPU milliseconds per job, by process (the submitting process, each
    /// worker, `postgres`, `kafka`).
    pub cpu_ms: Vec<(String, f64)>,
    /// All of them together.
    pub total_cpu_ms: f64,
    /// WAL bytes Postgres wrote per job.
    pub wal_bytes: f64,
    /// Statements executed per job in the pipeline's database (the bench's
    /// own progress polls left out); `None` without pg_stat_statements. Under
    /// group commit one statement serves many jobs, so this is below one.
    pub statements: Option<f64>,
    /// Rows those statements returned or changed, per job: the row work a
    /// job costs whatever the batching.
    pub statement_rows: Option<f64>,
    /// Kafka records produced per job, every topic.
    pub kafka_records: f64,
    /// Their keys and values, bytes per job.
    pub kafka_bytes: f64,
}

/// The counters a cost is the difference of.
pub struct Snapshot {
    taken: Instant,
    submitter_cpu_s: f64,
    postgres_cpu_s: f64,
    kafka_cpu_s: f64,
    wal_lsn: String,
}

/// The broker and Postgres, as their command lines name them.
const POSTGRES: &str = "postgres";
const KAFKA: &str = "kafka.Kafka";

impl Snapshot {
    /// Reads every counter now.
    pub async fn take(pool: &PgPool) -> anyhow::Result<Self> {
        let wal_lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(pool)
            .await?;
        Ok(Self {
            taken: Instant::now(),
            submitter_cpu_s: cpu_of(std::process::id())?.own,
            postgres_cpu_s: server_cpu_s(&servers(POSTGRES)),
            kafka_cpu_s: server_cpu_s(&servers(KAFKA)),
            wal_lsn,
        })
    }

    /// The cost per job of `jobs` jobs since this snapshot; `workers` are the
    /// worker processes' own costs over the same window.
    pub async fn cost(
        &self,
        jobs: usize,
        workers: &[ProcCost],
        (pool, counts_statements): (&PgPool, bool),
        settings: &Settings,
    ) -> anyhow::Result<JobCost> {
        let per_job = |total: f64| total / jobs as f64;
        let wal_bytes: f64 =
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
                .bind(&self.wal_lsn)
                .fetch_one(pool)
                .await?;
        let mut cpu_ms = vec![(
            "submitter (this process)".to_owned(),
            per_job(cpu_of(std::process::id())?.own - self.submitter_cpu_s) * 1e3,
        )];
        cpu_ms.extend(
            workers
                .iter()
                .map(|w| (w.name.clone(), per_job(w.cpu_s) * 1e3)),
        );
        cpu_ms.push((
            "postgres".to_owned(),
            per_job(server_cpu_s(&servers(POSTGRES)) - self.postgres_cpu_s) * 1e3,
        ));
        cpu_ms.push((
            "kafka".to_owned(),
            per_job(server_cpu_s(&servers(KAFKA)) - self.kafka_cpu_s) * 1e3,
        ));
        let (records, bytes) = kafka_footprint(settings).await?;
        let counted = match counts_statements {
            true => Some(statements(pool).await?),
            false => None,
        };
        tracing::debug!(elapsed = ?self.taken.elapsed(), "job cost measured");
        Ok(JobCost {
            total_cpu_ms: cpu_ms.iter().map(|(_, ms)| ms).sum(),
            cpu_ms,
            wal_bytes: per_job(wal_bytes),
            statements: counted.map(|(calls, _)| per_job(calls as f64)),
            statement_rows: counted.map(|(_, rows)| per_job(rows as f64)),
            kafka_records: per_job(records as f64),
            kafka_bytes: per_job(bytes as f64),
        })
    }
}

/// The processes of a server, leaving this process out (its command line may
/// name the server too).
/// CPU seconds Postgres and the broker have used so far, all their processes.
pub fn services_cpu_s() -> f64 {
    server_cpu_s(&servers(POSTGRES)) + server_cpu_s(&servers(KAFKA))
}

fn servers(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    pids_matching(needle)
        .into_iter()
        .filter(|pid| *pid != me)
        .collect()
}

/// Statements executed in this database since the statistics were reset, and
/// the rows they returned or changed, without the bench's own progress polls
/// and statistics reads.
async fn statements(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let calls = sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND query NOT LIKE '%count(*)%' AND query NOT LIKE '%pg_stat_statements%'
            AND query NOT LIKE '%pg_current_wal_lsn%'",
    )
    .fetch_one(pool)
    .await?;
    Ok(calls)
}

/// Records and key + value bytes on every topic of `settings` (fresh topics,
/// so all of it was produced by the phase).
async fn kafka_footprint(settings: &Settings) -> anyhow::Result<(u64, u64)> {
    let (kafka, group) = (
        settings.kafka(),
        settings.group("docstream-bench-footprint"),
    );
    let topics: Vec<String> = topic_specs(settings).into_iter().map(|t| t.name).collect();
    tokio::task::spawn_blocking(move || {
        let mut totals = (0, 0);
        for topic in &topics {
            let (records, bytes) = read_sizes(&kafka, &group, topic)?;
            totals = (totals.0 + records, totals.1 + bytes);
        }
        Ok(totals)
    })
    .await?
}

/// Reads `topic` from the beginning to its end: (records, key + value bytes).
fn read_sizes(
    kafka: &docstream::config::KafkaClient,
    group: &str,
    topic: &str,
) -> anyhow::Result<(u64, u64)> {
    let consumer: BaseConsumer = kafka
        .config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let partitions = metadata
        .topics()
        .first()
        .context("no such topic")?
        .partitions();
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, partition.id(), timeout)?;
        if high > low {
            ends.insert(partition.id(), high);
            assignment.add_partition_offset(topic, partition.id(), Offset::Offset(low))?;
        }
    }
    let (mut records, mut bytes) = (0, 0);
    if ends.is_empty() {
        return Ok((0, 0));
    }
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ends.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "reading {topic} timed out");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message?;
        records += 1;
        bytes += (message.key().map_or(0, <[u8]>::len) + message.payload().map_or(0, <[u8]>::len))
            as u64;
        if ends
            .get(&message.partition())
            .is_some_and(|end| message.offset() + 1 >= *end)
        {
            ends.remove(&message.partition());
        }
    }
    Ok((records, bytes))
}
