//! The job lifecycle: every transition a process makes after a submit, with
//! the events it owes. [`Jobs`] claims a stage (or waits out a live holder),
//! holds the claim with heartbeats, ends it (succeeded, failed, retried,
//! cancelled), publishes one `ExtractionEvent` per transition won, and hands
//! a job to a stage again. The workers, the API (submits, cancels, retries,
//! bulk actions, deferred results), the reapers and the operator's commands
//! all go through it: no caller changes a job's state and then repeats the
//! follow-up by hand.
//!
//! - `client`: what clients and operators ask: a new job's hand-over, a
//!   cancel, a bulk action's batch, a deleted tenant's jobs.
//! - `stage`: what both stages do alike, over a [`Stage`].
//! - `extraction`: how an extraction attempt ends.
//! - `persist`: completions retried in place through a database outage.
//!
//! Every failure is a [`JobError`] that keeps its cause; the consumers turn
//! it into a `HandlerError` (a missing row is poison, the rest transient),
//! the API into an `ApiError`.

mod client;
mod extraction;
mod persist;
mod stage;

pub use client::Cancel;
pub use persist::{persist, persist_completion};
pub use stage::RepublishError;

/// The lane a job's hand-over records wait in at their workers: its tenant
/// and priority.
pub fn lane(row: &Extraction) -> Lane {
    Lane::new(row.tenant_id, row.priority)
}

use std::future::Future;
use std::sync::Arc;

use sqlx::PgPool;
use uuid::Uuid;

use super::Batched;
use crate::config::{Settings, StageSettings};
use crate::domain::Lane;
use crate::domain::{Backoff, PerStage, Stage, Transition};
use crate::events::{ExtractionEvent, PublishReason};
use crate::failpoints::{self, Triggered};
use crate::health::Health;
use crate::kafka::{HandlerError, PublishError, Publisher};
use crate::metrics::Metrics;
use crate::store::{Extraction, StoreError};
use crate::webhook::Webhooks;

/// The lifecycle of this process's jobs; clones share it.
#[derive(Clone)]
pub struct Jobs(Arc<Parts>);

/// What the lifecycle needs of its process.
struct Parts {
    pool: PgPool,
    publisher: Publisher,
    metrics: Metrics,
    health: Health,
    batched: Batched,
    webhooks: Webhooks,
    settings: Lifecycle,
}

/// The settings the lifecycle reads.
struct Lifecycle {
    stages: PerStage<StageSettings>,
    /// The topic of every transition's event, prefixed.
    events_topic: String,
    /// Attempts before a job fails for good.
    max_attempts: i32,
    /// The delay before each retry.
    backoff: Backoff,
    /// How often a holder renews its lease.
    heartbeat: std::time::Duration,
}

impl Lifecycle {
    fn of(settings: &Settings) -> Self {
        Self {
            stages: PerStage::new(|stage| settings.stage(stage)),
            events_topic: settings.topic(&settings.topic_events),
            max_attempts: settings.max_attempts,
            backoff: Backoff {
                base: settings.retry_base_delay_s.get(),
                max: settings.retry_max_delay_s.get(),
            },
            heartbeat: settings.heartbeat_interval_s.get(),
        }
    }
}

/// Why a step of the lifecycle did not happen. Each keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// Postgres did not answer or refused the statement.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker did not acknowledge an event.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A fault test made this step fail.
    #[error(transparent)]
    Failpoint(#[from] Triggered),
    /// The record names a job that does not exist.
    #[error("no extraction {0}")]
    MissingRow(Uuid),
    /// The consumer stopped while another holder's live lease held the job.
    #[error("stopped while {0} was held under a live lease; left for the next owner")]
    StoppedWhileHeld(Uuid),
}

/// A missing row is poison (the same record never finds it); every other
/// failure passes, and the record is handled again.
impl From<JobError> for HandlerError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::MissingRow(_) => HandlerError::Poison {
                kind: "missing_row",
                reason: e.to_string(),
            },
            e => HandlerError::Transient(e.to_string()),
        }
    }
}

impl Jobs {
    /// The lifecycle of the jobs of a process, on its pool, producer and
    /// statement batchers.
    pub fn new(
        settings: &Settings,
        pool: PgPool,
        publisher: Publisher,
        metrics: Metrics,
        health: Health,
        batched: Batched,
        webhooks: Webhooks,
    ) -> Self {
        Self(Arc::new(Parts {
            pool,
            publisher,
            metrics,
            health,
            batched,
            webhooks,
            settings: Lifecycle::of(settings),
        }))
    }

    /// `stage`'s settings.
    pub fn stage(&self, stage: Stage) -> &StageSettings {
        &self.0.settings.stages[stage]
    }

    /// Publishes the `ExtractionEvent` of a won transition and waits for its ack.
    /// The event is built at once, so the future does not hold on to `row`
    /// (which may carry a whole document) while it waits.
    pub fn emit<'s>(
        &'s self,
        transition: Transition,
        row: &Extraction,
        token: Option<i32>,
        reason: PublishReason,
    ) -> impl Future<Output = Result<(), JobError>> + use<'s> {
        self.announce(row.id, ExtractionEvent::of(transition, row, token, reason))
    }

    /// Publishes `event`, of job `id`, on the events topic.
    pub async fn announce(&self, id: Uuid, event: ExtractionEvent) -> Result<(), JobError> {
        let topic = &self.0.settings.events_topic;
        self.0.publisher.publish_job(topic, id, &event).await?;
        Ok(())
    }

    /// Concludes a completing transition of claim `token`: publishes its event
    /// when it won; when it lost, the claim was taken over, so the work is
    /// dropped without side effects and counted as a stale completion.
    pub async fn conclude(
        &self,
        stage: Stage,
        transition: Transition,
        (id, token): (Uuid, i32),
        row: Option<Extraction>,
        reason: PublishReason,
    ) -> Result<Option<Extraction>, JobError> {
        self.0.metrics.transition(transition, &row);
        match row {
            Some(row) => {
                if row.webhook_id.is_some() {
                    // The delivery is durable with the state change; a crash
                    // here leaves it to the webhook reaper (orphan class 6).
                    failpoints::hit("webhook.after_state_change").await?;
                    let webhooks = &self.0.webhooks;
                    webhooks.wake(row.webhook_id.as_deref(), row.tenant_id);
                }
                self.emit(transition, &row, Some(token), reason).await?;
                Ok(Some(row))
            }
            None => {
                self.stale(stage, id, token, "completion");
                Ok(None)
            }
        }
    }

    /// Work under a claim that is no longer ours, found at a heartbeat or at
    /// completion: dropped and counted.
    pub fn stale(&self, stage: Stage, id: Uuid, token: i32, at: &'static str) {
        let labels = [stage.as_str(), at];
        let stale = &self.0.metrics.jobs.stale_completions;
        stale.with_label_values(&labels).inc();
        tracing::warn!(%id, token, stage = stage.as_str(), at, "stale holder: the claim was taken over; work dropped");
    }

    /// Runs the completing `statement` of `transition` on claim `token` of
    /// job `id` until the database answers, and tells a win whose answer was
    /// lost from a takeover (see `persist`).
    async fn complete_claim<F, Fut>(
        &self,
        transition: Transition,
        claim: (Uuid, i32),
        mut statement: F,
    ) -> Result<Option<Extraction>, JobError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<Extraction>, StoreError>>,
    {
        let Parts {
            health,
            metrics,
            pool,
            ..
        } = &*self.0;
        let one = || {
            let answer = statement();
            async move { Ok(vec![answer.await?]) }
        };
        let rows = persist_completion((health, metrics, pool), transition, &[claim], one).await?;
        Ok(rows.into_iter().next().flatten())
    }

    /// Runs a completing `statement` until the database answers (see `persist`).
    async fn persist<T, F, Fut>(&self, name: &'static str, statement: F) -> Result<T, JobError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let (health, metrics) = (&self.0.health, &self.0.metrics);
        Ok(persist::persist(health, metrics, name, statement).await?)
    }
}
