//! The queue census: every `census_interval_s`, one process of the deployment
//! counts the open jobs, the oldest one's age, the queued jobs of the
//! busiest tenants by priority and the open orphans by class
//! (`store::census`), and exports them. Every process runs this loop, so the
//! census goes on while any process lives; each tick, the first to take the
//! turn reports, and a process whose turn it was not clears its own series, so
//! each series has a single source (dashboards take `max` over processes).
//! The turn also keeps the samples the console's overview draws.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Services;
use crate::domain::Priority;
use crate::health::Dependency;
use crate::metrics::CensusMetrics;
use crate::store::orphans::{self, Thresholds};
use crate::store::{census, StoreError};

/// Runs the census until `shutdown`; a failed tick is counted and logged, and
/// the next one tries again.
pub async fn run(services: Services, shutdown: CancellationToken) {
    let interval = services.settings.census_interval_s.get();
    let thresholds = Thresholds::of(&services.settings);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let metrics = &services.metrics.census;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // Bounded, so a census stuck on an unanswering database does not
        // keep the turn's series frozen: they are cleared instead.
        let took = take(&services, metrics, interval, thresholds);
        let tick = tokio::time::timeout(interval, took).await;
        let outcome = match tick {
            Ok(Ok(true)) => "taken",
            Ok(Ok(false)) => "skipped",
            Ok(Err(e)) => {
                if e.is_unavailable() {
                    services.health.failed(Dependency::Postgres, &e);
                } else {
                    tracing::warn!(error = %e, "queue census failed; retrying next interval");
                }
                metrics.clear();
                "failed"
            }
            Err(_) => {
                metrics.clear();
                "failed"
            }
        };
        metrics.runs.with_label_values(&[outcome]).inc();
    }
}

/// One tick: takes the census if it is this process's turn (true), else
/// clears this process's census series (false).
async fn take(
    services: &Services,
    metrics: &CensusMetrics,
    interval: Duration,
    thresholds: Thresholds,
) -> Result<bool, StoreError> {
    let pool = &services.pool;
    if !census::take_turn(pool, interval.as_secs_f64()).await? {
        metrics.clear();
        return Ok(false);
    }
    let counts = census::count(pool).await?;
    let open = orphans::count_open(pool, thresholds).await?;
    let jobs = [
        (
            "extraction",
            "queued",
            counts.queued,
            counts.oldest_queued_s,
        ),
        (
            "extraction",
            "running",
            counts.running,
            counts.oldest_running_s,
        ),
        (
            "bbox",
            "pending",
            counts.bbox_pending,
            counts.oldest_bbox_pending_s,
        ),
        (
            "bbox",
            "running",
            counts.bbox_running,
            counts.oldest_bbox_running_s,
        ),
    ];
    for (stage, status, count, oldest_s) in jobs {
        metrics.jobs.with_label_values(&[stage, status]).set(count);
        metrics
            .oldest_age
            .with_label_values(&[stage, status])
            .set(oldest_s);
    }
    // Every class has a series, 0 when none is open, so an alert on it
    // ends when the reaper catches up instead of going stale.
    for class in orphans::OrphanClass::ALL {
        let found = open.iter().find(|o| o.class == class);
        let (count, oldest_s) = found.map_or((0, 0.0), |o| (o.open, o.oldest_s));
        let label = [class.label()];
        metrics.orphans_open.with_label_values(&label).set(count);
        metrics
            .oldest_orphan_age
            .with_label_values(&label)
            .set(oldest_s);
    }
    // Set whole each turn: a tenant whose queue emptied loses its series.
    // The others' are always there (0 when none), as every orphan class is.
    let queued = census::queued_by_tenant(pool).await?;
    metrics.queued.reset();
    for priority in Priority::ALL {
        (metrics.queued)
            .with_label_values(&[census::OTHER_TENANTS, priority.as_str()])
            .set(0);
    }
    for q in queued {
        (metrics.queued)
            .with_label_values(&[&q.tenant, &q.priority])
            .set(q.jobs);
    }
    let orphans: serde_json::Map<String, serde_json::Value> = open
        .iter()
        .map(|o| (o.class.label().to_owned(), o.open.into()))
        .collect();
    let lag = group_lags(services, interval / 2).await;
    census::record_samples(pool, interval.as_secs_f64(), &orphans.into(), lag.as_ref()).await?;
    Ok(true)
}

/// Each consumer group's lag on its topic, for the deployment's sample, or
/// `None` when the broker did not tell within `bound` (the sample is taken
/// without it: the census never waits on the broker).
async fn group_lags(services: &Services, bound: Duration) -> Option<serde_json::Value> {
    let settings = &services.settings;
    let groups = [
        (&settings.intake_group, &settings.topic_requests),
        (&settings.worker_group, &settings.topic_submitted),
        (&settings.bbox_worker_group, &settings.topic_post_processing),
    ]
    .map(|(group, topic)| (settings.group(group), settings.topic(topic)));
    let brokers = settings.kafka_brokers.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut lags = Vec::new();
        for (group, topic) in groups {
            let lag = crate::kafka::groups::lag(&brokers, &group, &topic, bound)?;
            lags.push(serde_json::json!({"group": group, "topic": topic, "lag": lag}));
        }
        Ok::<_, rdkafka::error::KafkaError>(lags)
    });
    match tokio::time::timeout(bound, read).await {
        Ok(Ok(Ok(lags))) => Some(lags.into()),
        Ok(Ok(Err(e))) => {
            tracing::debug!(error = %e, "consumer lag not read for the census");
            None
        }
        _ => None,
    }
}
