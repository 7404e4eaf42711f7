//! Webhooks: announcing a job's terminal state to the `webhook_url` its request
//! named, following the Standard Webhooks spec.
//!
//! - **Outbox.** The terminal transition writes the delivery row in the same
//!   statement (`store::transitions`), so a crash after the state change still
//!   delivers. The process that made the change wakes its [`Webhooks`]
//!   dispatcher with the delivery's id; a delivery nobody works on is orphan
//!   class 6, which the webhook reaper hands to its own dispatcher.
//! - **Attempts.** Each attempt is claimed in the store (a lease and a fencing
//!   token), signed afresh with the job's tenant's secrets ([`Signer`]:
//!   `webhook-id`, `webhook-timestamp`, `webhook-signature`) and sent with a bounded timeout, without following
//!   redirects or proxies. 2xx delivers; 410 Gone disables the endpoint (no
//!   further deliveries to it); anything else is retried with capped
//!   exponential backoff and jitter, always with the same `webhook-id`, until
//!   `webhook_max_attempts`.
//! - **Shares.** A tenant has at most `webhook_concurrency_per_tenant` of a
//!   process's `webhook_concurrency` attempts under way; its further
//!   deliveries wait in its own queue ([`fair`]), so a tenant whose endpoint
//!   is a tarpit holds only its share while every other tenant's deliveries
//!   go on.
//! - **SSRF.** [`Guard`] refuses URLs that reach loopback, private,
//!   link-local, metadata or reserved addresses, at submit and again at send,
//!   where it is also the client's resolver.

mod fair;
mod sign;

pub use fair::Due;
pub use sign::{signature_header, Signer};

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use sqlx::PgPool;
use tokio::sync::{mpsc, Semaphore};
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::Backoff;
use crate::failpoints;
use crate::metrics::Metrics;
use crate::outbound::error_chain;
use crate::outbound::ssrf::{guarded_client, AllowList, Forbidden, Guard, LOOKUP_TIMEOUT};
use crate::store::webhooks::{self as outbox, Delivery, Final};
use crate::trace;
use fair::Shares;

/// What the dispatcher is configured with.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Whether jobs may name a `webhook_url` at all.
    pub enabled: bool,
    /// The addresses a webhook may reach beyond the public ones.
    pub allow: AllowList,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Attempts under way at once in this process.
    pub concurrency: usize,
    /// Of those, at most this many for one tenant.
    pub concurrency_per_tenant: usize,
    /// A pending delivery held by nobody this long is an orphan (class 6).
    pub orphan_after: Duration,
    /// Attempts before a delivery fails for good.
    pub max_attempts: i32,
    /// The delay before each retry.
    pub backoff: Backoff,
}

impl WebhookSettings {
    /// The dispatcher's settings of `settings`.
    pub fn of(settings: &Settings) -> Self {
        Self {
            enabled: settings.webhooks_enabled,
            allow: settings.webhook_allow.clone(),
            timeout: settings.webhook_timeout_s.get(),
            concurrency: settings.webhook_concurrency,
            concurrency_per_tenant: settings.webhook_concurrency_per_tenant,
            orphan_after: settings.webhook_orphan_threshold_s.get(),
            max_attempts: settings.webhook_max_attempts,
            backoff: Backoff {
                base: settings.webhook_retry_base_delay_s.get(),
                max: settings.webhook_retry_max_delay_s.get(),
            },
        }
    }
}

/// A process's webhook dispatcher: wake it with a delivery's id and it makes
/// the attempts that are due.
#[derive(Clone)]
pub struct Webhooks {
    wake: mpsc::Sender<Due>,
    guard: Guard,
    enabled: bool,
    metrics: Metrics,
}

impl Webhooks {
    /// Starts this process's dispatcher (a task that lives as long as the
    /// process; deliveries it leaves unfinished are orphans the reaper revives).
    pub fn start(settings: WebhookSettings, pool: PgPool, metrics: Metrics) -> Self {
        let guard = Guard::new(settings.allow);
        let agent = concat!("docstream-webhooks/", env!("CARGO_PKG_VERSION"));
        let client = guarded_client(&guard, settings.timeout, agent);
        let (wake, woken) = mpsc::channel(WAKE_QUEUE);
        let enabled = settings.enabled;
        let dispatcher = Dispatcher {
            pool,
            metrics: metrics.clone(),
            client,
            guard: guard.clone(),
            wake: wake.clone(),
            shares: Shares::new(settings.concurrency_per_tenant, WAKE_QUEUE),
            // The lease outlives an attempt (its lookup, then its request),
            // so only a dead dispatcher's attempt is ever taken over.
            lease_s: (settings.timeout + LOOKUP_TIMEOUT + settings.orphan_after).as_secs_f64(),
            max_attempts: settings.max_attempts,
            backoff: settings.backoff,
        };
        tokio::spawn(Arc::new(dispatcher).run(woken, settings.concurrency));
        Self {
            wake,
            guard,
            enabled,
            metrics,
        }
    }

    /// Attempts delivery `id` of a job of `tenant` now (if it is due and
    /// nobody holds it), or once the tenant's share is free. Never waits:
    /// with the wake-up queue full, the delivery stays pending in the outbox
    /// and the reaper revives it (class 6).
    pub fn wake(&self, id: Option<&str>, tenant: Uuid) {
        if let Some(id) = id {
            let id = id.to_owned();
            wake(&self.wake, Due { id, tenant });
        }
    }

    /// Checks a submitted request's webhook URL; counts refusals.
    pub async fn check_submitted(&self, url: &str) -> Result<(), String> {
        if !self.enabled {
            return Err(
                "webhooks are disabled on this deployment (DOCSTREAM_WEBHOOKS_ENABLED=false): \
                 submit without webhook_url"
                    .into(),
            );
        }
        match self.guard.check(url).await {
            Ok(_) => Ok(()),
            // No address to judge yet (a typo, or the resolver is down): the
            // job is accepted, and the name is resolved and judged again
            // before each attempt, which is where the guard must hold anyway.
            // Refusing it would turn a resolver outage into lost jobs (the
            // Kafka intake dead-letters refused requests).
            Err(Forbidden::Unresolvable { host, reason }) => {
                tracing::debug!(%host, %reason, "webhook host does not resolve at submit; judged at send");
                Ok(())
            }
            Err(forbidden) => {
                tracing::debug!(detail = %forbidden.detail(), "webhook_url refused at submit");
                self.metrics
                    .webhooks
                    .ssrf_rejections
                    .with_label_values(&["submit"])
                    .inc();
                Err(forbidden.of("webhook_url"))
            }
        }
    }
}

/// How one attempt went.
#[derive(Debug)]
enum Outcome {
    /// 2xx.
    Delivered(u16),
    /// 410 Gone: the endpoint wants no more.
    Gone,
    /// The endpoint said 410 before; nothing was sent.
    Disabled,
    /// The SSRF guard refused the URL; nothing was sent.
    Forbidden(String),
    /// Anything else: try again later.
    Failed { status: Option<u16>, error: String },
}

struct Dispatcher {
    pool: PgPool,
    metrics: Metrics,
    client: reqwest::Client,
    guard: Guard,
    wake: mpsc::Sender<Due>,
    /// Each tenant's share of the attempts.
    shares: Shares,
    lease_s: f64,
    max_attempts: i32,
    /// Between attempts: the delay grows from the base to the cap, with
    /// jitter, so the deliveries of a receiver that was down do not return
    /// in lockstep.
    backoff: Backoff,
}

impl Dispatcher {
    async fn run(self: Arc<Self>, mut woken: mpsc::Receiver<Due>, concurrency: usize) {
        let slots = Arc::new(Semaphore::new(concurrency));
        while let Some(due) = woken.recv().await {
            if !self.shares.start(&due) {
                continue;
            }
            let slot = slots.clone().acquire_owned().await.expect("never closed");
            let dispatcher = self.clone();
            tokio::spawn(async move {
                dispatcher.attempt(&due.id).await;
                drop(slot);
                if let Some(next) = dispatcher.shares.end(due.tenant) {
                    wake(&dispatcher.wake, next);
                }
            });
        }
    }

    /// One attempt of delivery `id`, if this dispatcher gets to claim it.
    async fn attempt(&self, id: &str) {
        let delivery = match outbox::claim(&self.pool, id, self.lease_s).await {
            Ok(Some(delivery)) => delivery,
            // Delivered, not due, or someone else's attempt.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(id, error = %e, "webhook not claimed; the reaper will revive it");
                return;
            }
        };
        // Attempts whose outcome was never recorded (a crash, a database
        // error) still count: past the maximum the delivery is given up
        // without another request, so no failure can retry it for ever.
        if delivery.attempts > self.max_attempts {
            let error = format!(
                "gave up after {} attempts (the last ended without a recorded outcome)",
                self.max_attempts
            );
            let failed = Outcome::Failed {
                status: None,
                error,
            };
            if let Err(e) = self.record(&delivery, failed).await {
                tracing::warn!(id, error = %e, "webhook outcome not recorded; the reaper will revive it");
            }
            return;
        }
        let span = trace::job_span(delivery.extraction_id, None);
        self.deliver(delivery).instrument(span).await;
    }

    /// Sends claimed `delivery` and records how it went.
    async fn deliver(&self, delivery: Delivery) {
        let id = delivery.id.as_str();
        if let Err(e) = failpoints::hit("webhook.before_send").await {
            tracing::warn!(id, error = %e, "attempt abandoned; the reaper will revive it");
            return;
        }
        let outcome = match delivery.endpoint_disabled {
            true => Outcome::Disabled,
            false => self.send(&delivery).await,
        };
        if let Err(e) = self.record(&delivery, outcome).await {
            tracing::warn!(id, error = %e, "webhook outcome not recorded; the reaper will revive it");
        }
    }

    async fn send(&self, delivery: &Delivery) -> Outcome {
        let timestamp = chrono::Utc::now().timestamp();
        let body = delivery.payload.to_string().into_bytes();
        let secrets = delivery.secrets.as_deref().unwrap_or_default();
        let signature = match signature_header(secrets, &delivery.id, timestamp, &body) {
            Ok(signature) => signature,
            Err(error) => {
                return Outcome::Failed {
                    status: None,
                    error,
                }
            }
        };
        match self.guard.check(&delivery.url).await {
            Ok(_) => {}
            Err(e @ Forbidden::Unresolvable { .. }) => {
                tracing::info!(id = %delivery.id, detail = %e.detail(), "webhook host does not resolve");
                return Outcome::Failed {
                    status: None,
                    error: e.of("webhook_url"),
                };
            }
            Err(forbidden) => {
                tracing::warn!(id = %delivery.id, detail = %forbidden.detail(), "webhook refused by the SSRF guard");
                return Outcome::Forbidden(forbidden.of("webhook_url"));
            }
        }
        self.metrics.webhooks.attempts.inc();
        let started = std::time::Instant::now();
        let sent = self
            .client
            .post(&delivery.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &delivery.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let (outcome, answered) = match sent {
            Ok(response) => match response.status().as_u16() {
                code @ 200..=299 => (Outcome::Delivered(code), "delivered"),
                410 => (Outcome::Gone, "gone"),
                code => {
                    let error = format!("the endpoint answered {code}");
                    let status = Some(code);
                    (Outcome::Failed { status, error }, "failed")
                }
            },
            Err(e) => {
                let error = error_chain(&e);
                (
                    Outcome::Failed {
                        status: None,
                        error,
                    },
                    "unanswered",
                )
            }
        };
        self.metrics
            .webhooks
            .delivery_seconds
            .with_label_values(&[answered])
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    async fn record(
        &self,
        delivery: &Delivery,
        outcome: Outcome,
    ) -> Result<(), crate::store::StoreError> {
        let (id, attempt, pool) = (&delivery.id, delivery.attempts, &self.pool);
        let counted = match outcome {
            Outcome::Delivered(code) => {
                outbox::finish(pool, id, attempt, Final::Delivered, Some(code), None).await?;
                tracing::info!(id, attempt, code, "webhook delivered");
                "delivered"
            }
            Outcome::Gone => {
                if outbox::disable_endpoint(pool, delivery, "answered 410 Gone").await? {
                    self.metrics.webhooks.disabled_endpoints.inc();
                    tracing::warn!(id, url = %delivery.url, "endpoint answered 410 Gone; disabled");
                }
                outbox::finish(pool, id, attempt, Final::Disabled, Some(410), None).await?;
                "disabled"
            }
            Outcome::Disabled => {
                let why = Some("the endpoint answered 410 Gone before");
                outbox::finish(pool, id, attempt, Final::Disabled, None, why).await?;
                "disabled"
            }
            Outcome::Forbidden(reason) => {
                self.metrics
                    .webhooks
                    .ssrf_rejections
                    .with_label_values(&["send"])
                    .inc();
                outbox::finish(pool, id, attempt, Final::Failed, None, Some(&reason)).await?;
                "forbidden"
            }
            Outcome::Failed { status, error } if attempt >= self.max_attempts => {
                tracing::warn!(id, attempt, %error, "webhook given up");
                outbox::finish(pool, id, attempt, Final::Failed, status, Some(&error)).await?;
                "failed"
            }
            Outcome::Failed { status, error } => {
                let delay = self.backoff.after(attempt);
                tracing::info!(id, attempt, %error, delay_s = delay.as_secs_f64(), "webhook attempt failed; retrying");
                outbox::retry_later(pool, id, attempt, delay.as_secs_f64(), status, &error).await?;
                let (wake, id) = (self.wake.clone(), id.clone());
                let due = Due {
                    id,
                    tenant: delivery.tenant_id,
                };
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    self::wake(&wake, due);
                });
                "retried"
            }
        };
        self.metrics
            .webhooks
            .deliveries
            .with_label_values(&[counted])
            .inc();
        Ok(())
    }
}

/// Wake-ups waiting for the dispatcher; beyond them, the reaper's sweep takes over.
const WAKE_QUEUE: usize = 10_000;

fn wake(queue: &mpsc::Sender<Due>, due: Due) {
    if let Err(mpsc::error::TrySendError::Full(due)) = queue.try_send(due) {
        tracing::debug!(id = %due.id, "webhook wake-up queue full; the reaper will revive the delivery");
    }
}
