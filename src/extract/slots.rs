//! An extractor's `max_concurrency` and `requests_per_second` across the
//! whole deployment. Before a
//! call, a worker process leases one of the extractor's slots in Postgres
//! (`store::slots`), renews the lease while the call lasts, and gives the
//! slot back when it ends, however it ends. A process that crashes or
//! stalls keeps its slots only until their leases run out.
//!
//! One task per process and extractor asks Postgres at a time (the others
//! queue behind it here, in the worker's order: `gate`), so waiting costs one
//! query per poll per process, not one per waiting call. It asks again as
//! soon as any process announces a freed slot (`LISTEN`), and at the latest
//! every [`POLL`] (a lease that ran out announces nothing).
//!
//! The rate is a next-start time per extractor in Postgres: a call takes it
//! and moves it one spacing on in one statement, then waits until its start
//! ([`SharedCap::pace`]).
//!
//! A call that ends while another call of the same process waits hands its
//! lease over in memory instead of through Postgres (three round trips and
//! a notification saved per call, which kept a busy machine's slots idle a
//! quarter of the time). So that a process cannot keep a slot from the
//! others for ever, a lease is handed over only until it has been held for
//! one lease length; then it goes back to Postgres, where every waiting
//! process competes for it.
//!
//! A tenant's share of an extractor (`tenant_max_concurrency`) is a second
//! set of slots of the same kind, one per tenant and extractor (rows keyed
//! `extractor@tenant`). A call of a tenant with a share leases one of its
//! tenant's slots first and only then waits for one of the extractor's, so
//! no more than the share of one tenant's calls ever hold or wait for the
//! extractor's slots, and the others' calls pass them in the worker's order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use super::gate::Gate;
use crate::domain::schedule::Weights;
use crate::domain::Lane;
use crate::metrics::ExtractorMetrics;
use crate::store::slots::{self, Lease};

/// The longest a waiting process goes without asking for a slot.
const POLL: Duration = Duration::from_millis(250);

/// How long a process waits before asking again after Postgres failed.
const AFTER_FAILURE: Duration = Duration::from_millis(500);

/// How long a lease handed over waits for its taker before it goes back to
/// Postgres (the waiter that was counted took another slot meanwhile).
const HANDOVER_WAIT: Duration = Duration::from_millis(50);

/// What this process needs to make the deployment's shared caps: one per
/// process, so every cap shares one listener.
#[derive(Clone)]
pub struct SharedCaps {
    pool: PgPool,
    signals: FreedSignals,
    /// How long a lease lasts unless renewed.
    lease: Duration,
    /// The priority bound and tenants' weights, for the calls waiting in
    /// this process.
    order: (Duration, Weights),
    metrics: ExtractorMetrics,
}

impl SharedCaps {
    /// Caps on `pool`'s slots, leased for `lease` at a time; this process's
    /// waiting calls ask in `order` (the priority bound and the weights).
    pub fn new(
        pool: &PgPool,
        lease: Duration,
        order: (Duration, Weights),
        metrics: ExtractorMetrics,
    ) -> Self {
        Self {
            pool: pool.clone(),
            signals: FreedSignals::new(pool),
            lease,
            order,
            metrics,
        }
    }

    /// The `cap` slots of `extractor`.
    pub fn extractor(&self, extractor: &str, cap: usize) -> SharedCap {
        SharedCap::new(self, extractor, extractor.to_owned(), cap)
    }

    /// The `cap` slots of `tenant`'s calls of `extractor`.
    pub fn tenant(&self, extractor: &str, tenant: Uuid, cap: usize) -> SharedCap {
        SharedCap::new(self, extractor, format!("{extractor}@{tenant}"), cap)
    }

    /// The priority bound and the tenants' weights.
    pub fn order(&self) -> (Duration, Weights) {
        self.order.clone()
    }

    /// The extractors' metrics.
    pub fn metrics(&self) -> ExtractorMetrics {
        self.metrics.clone()
    }
}

/// The deployment-wide slots of one extractor (or of one tenant's calls of
/// it), as one process uses them.
pub struct SharedCap {
    /// The extractor, as metrics name it.
    extractor: String,
    /// The slots' rows and their announcements: the extractor's name, or
    /// `extractor@tenant` for a tenant's share (`@` is in no name).
    key: String,
    /// Whether held slots are counted in `shared_slots_held` (the
    /// extractor's own, not a tenant's share of them).
    counted: bool,
    cap: i32,
    lease: Duration,
    pool: PgPool,
    /// This process, as the holder of its leases.
    holder: Uuid,
    /// Held by the one task of this process asking Postgres.
    turn: Gate,
    signals: FreedSignals,
    provisioned: tokio::sync::OnceCell<()>,
    metrics: ExtractorMetrics,
    handover: Arc<Handover>,
}

/// Leases passed from a call that ended to one that waits, in this process.
struct Handover {
    pool: PgPool,
    /// The slots' key (`SharedCap::key`).
    key: String,
    lease_length: Duration,
    /// Calls waiting for a slot now.
    waiting: AtomicUsize,
    /// Leases given up by ended calls and not taken yet.
    spare: std::sync::Mutex<Vec<Held>>,
    /// Wakes the waiter asking Postgres: a slot was freed here or anywhere.
    freed: Arc<Notify>,
}

/// A lease as this process holds it.
#[derive(Debug, Clone, Copy)]
struct Held {
    lease: Lease,
    /// When it was leased from Postgres.
    since: Instant,
    /// When it was last extended (leased or renewed): it runs out one lease
    /// length after, unless renewed.
    renewed: Instant,
}

impl Handover {
    /// Takes a spare lease, if there is one.
    fn take(&self) -> Option<Held> {
        self.spare.lock().expect("spare leases").pop()
    }

    /// Gives up `held`: to a waiting call of this process while there is one
    /// and the lease was leased less than a lease length ago, else back to
    /// Postgres.
    fn give_up(self: &Arc<Self>, held: Held) {
        let waiting = self.waiting.load(Ordering::SeqCst) > 0;
        if waiting && held.since.elapsed() < self.lease_length {
            self.spare.lock().expect("spare leases").push(held);
            self.freed.notify_waiters();
            let handover = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(HANDOVER_WAIT).await;
                let left = {
                    let mut spare = handover.spare.lock().expect("spare leases");
                    let at = spare.iter().position(|h| h.lease == held.lease);
                    at.map(|i| spare.swap_remove(i))
                };
                if left.is_some() {
                    handover.release(held.lease).await;
                }
            });
            return;
        }
        let handover = self.clone();
        tokio::spawn(async move { handover.release(held.lease).await });
    }

    /// Gives `lease` back to Postgres. A slot not given back (Postgres away)
    /// comes back when its lease runs out.
    async fn release(&self, lease: Lease) {
        if let Err(e) = slots::release(&self.pool, &self.key, lease).await {
            tracing::debug!(error = %e, slots = %self.key,
                "shared slot not released; its lease will run out");
        }
    }
}

/// A leased slot: renewed while held, given up when dropped.
pub struct SharedSlot {
    held: Arc<std::sync::Mutex<Held>>,
    handover: Arc<Handover>,
    _renewing: DropGuard,
    /// The extractor's held-slots gauge (none for a tenant's share).
    gauge: Option<prometheus::IntGauge>,
}

impl Drop for SharedSlot {
    fn drop(&mut self) {
        if let Some(gauge) = &self.gauge {
            gauge.dec();
        }
        let held = *self.held.lock().expect("held lease");
        self.handover.give_up(held);
    }
}

/// Counts a call as waiting for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SharedCap {
    fn new(caps: &SharedCaps, extractor: &str, key: String, cap: usize) -> Self {
        let handover = Arc::new(Handover {
            pool: caps.pool.clone(),
            key: key.clone(),
            lease_length: caps.lease,
            waiting: AtomicUsize::new(0),
            spare: std::sync::Mutex::new(Vec::new()),
            freed: caps.signals.of(&key),
        });
        Self {
            extractor: extractor.to_owned(),
            counted: key == extractor,
            key,
            cap: i32::try_from(cap).unwrap_or(i32::MAX),
            lease: caps.lease,
            holder: process_id(),
            signals: caps.signals.clone(),
            pool: caps.pool.clone(),
            turn: Gate::new(1, caps.order.0, caps.order.1.clone()),
            provisioned: tokio::sync::OnceCell::new(),
            metrics: caps.metrics.clone(),
            handover,
        }
    }

    /// Waits for a free slot of the deployment and leases it. Cancel-safe:
    /// dropped while waiting, it holds nothing.
    pub async fn acquire(&self, lane: Lane) -> SharedSlot {
        let _waiting = Waiting::new(&self.handover.waiting);
        let _turn = self.turn.enter(lane).await;
        self.signals.listen();
        loop {
            let freed = self.handover.freed.notified();
            tokio::pin!(freed);
            // Registered before asking, so a release between the answer and
            // the wait is not missed.
            freed.as_mut().enable();
            if let Some(held) = self.handover.take() {
                return self.hold(held);
            }
            let asked = Instant::now();
            match self.try_acquire().await {
                Ok(Some(lease)) => {
                    let (since, renewed) = (asked, asked);
                    return self.hold(Held {
                        lease,
                        since,
                        renewed,
                    });
                }
                Ok(None) => {
                    tokio::select! {
                        _ = freed => {}
                        _ = tokio::time::sleep(POLL) => {}
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, slots = %self.key,
                        "asking for a shared slot failed; asking again");
                    tokio::time::sleep(AFTER_FAILURE).await;
                }
            }
        }
    }

    /// Waits for this call's turn under the deployment's rate of one call
    /// per `spacing`: how long it waited. Should Postgres not answer, the
    /// call waits one spacing and goes (the rate then holds per process).
    pub async fn pace(&self, spacing: Duration) -> Duration {
        let asked = Instant::now();
        let spacing_s = spacing.as_secs_f64();
        let wait = match slots::next_start(&self.pool, &self.key, spacing_s).await {
            Ok(wait) => wait,
            Err(e) => {
                tracing::debug!(error = %e, extractor = %self.extractor,
                    "the deployment's rate not read; spacing this call locally");
                spacing
            }
        };
        tokio::time::sleep(wait).await;
        asked.elapsed()
    }

    async fn try_acquire(&self) -> Result<Option<Lease>, crate::store::StoreError> {
        self.provisioned
            .get_or_try_init(|| slots::provision(&self.pool, &self.key, self.cap))
            .await?;
        let lease_s = self.lease.as_secs_f64();
        slots::acquire(&self.pool, &self.key, self.cap, self.holder, lease_s).await
    }

    /// `held`, renewed a third of a lease length after its last extension,
    /// and every third from then on, until the slot is dropped.
    fn hold(&self, held: Held) -> SharedSlot {
        let stop = CancellationToken::new();
        let (pool, key, length) = (self.pool.clone(), self.key.clone(), self.lease);
        let losses = self
            .metrics
            .shared_slot_losses
            .with_label_values(&[&self.extractor]);
        let shared = Arc::new(std::sync::Mutex::new(held));
        let (renewing, renewed) = (stop.clone(), shared.clone());
        tokio::spawn(async move {
            let lease = held.lease;
            loop {
                let last = renewed.lock().expect("held lease").renewed;
                tokio::select! {
                    _ = renewing.cancelled() => return,
                    _ = tokio::time::sleep_until((last + length / 3).into()) => {}
                }
                let asked = Instant::now();
                match slots::renew(&pool, &key, lease, length.as_secs_f64()).await {
                    Ok(true) => renewed.lock().expect("held lease").renewed = asked,
                    Ok(false) => {
                        // Renewals failed past the lease (a stall): the slot
                        // may be another call's now. The call goes on; it
                        // is counted, and the cap was briefly exceeded.
                        losses.inc();
                        tracing::warn!(
                            slots = key,
                            slot = lease.slot,
                            "a shared slot's lease ran out under its call"
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, slots = key, "shared slot not renewed");
                        tokio::time::sleep(AFTER_FAILURE).await;
                    }
                }
            }
        });
        let gauge = self.counted.then(|| {
            self.metrics
                .shared_slots_held
                .with_label_values(&[&self.extractor])
        });
        if let Some(gauge) = &gauge {
            gauge.inc();
        }
        SharedSlot {
            held: shared,
            handover: self.handover.clone(),
            _renewing: stop.drop_guard(),
            gauge,
        }
    }
}

/// This process's id as a holder of slots.
fn process_id() -> Uuid {
    static ID: OnceLock<Uuid> = OnceLock::new();
    *ID.get_or_init(Uuid::new_v4)
}

type Signals = std::sync::Mutex<HashMap<String, Arc<Notify>>>;

/// The signals that some process freed a slot, one per key, from one
/// listener (a connection of its own), started by the first wait and
/// stopped when the last clone of this value is dropped.
#[derive(Clone)]
struct FreedSignals {
    signals: Arc<Signals>,
    pool: PgPool,
    listening: Arc<OnceLock<DropGuard>>,
}

impl FreedSignals {
    /// Signals of `pool`'s database (nothing listens until a wait).
    fn new(pool: &PgPool) -> Self {
        Self {
            signals: Arc::default(),
            pool: pool.clone(),
            listening: Arc::default(),
        }
    }

    /// Starts the listener, once.
    fn listen(&self) {
        self.listening.get_or_init(|| {
            let stop = CancellationToken::new();
            let listening = listen(self.pool.clone(), self.signals.clone());
            let stopped = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = stopped.cancelled() => {}
                    _ = listening => {}
                }
            });
            stop.drop_guard()
        });
    }

    fn of(&self, key: &str) -> Arc<Notify> {
        let mut signals = self.signals.lock().expect("slot signals");
        signals.entry(key.to_owned()).or_default().clone()
    }
}

/// Wakes the waiters of each key whose slot a process freed;
/// reconnects after a failure (meanwhile the waiters poll).
async fn listen(pool: PgPool, signals: Arc<Signals>) {
    loop {
        let listened = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(slots::FREED).await?;
            loop {
                let freed = listener.recv().await?;
                let signal = signals
                    .lock()
                    .expect("slot signals")
                    .get(freed.payload())
                    .cloned();
                if let Some(signal) = signal {
                    signal.notify_waiters();
                }
            }
        };
        let failed: Result<(), sqlx::Error> = listened.await;
        if let Err(e) = failed {
            tracing::debug!(error = %e, "listening for freed extractor slots; reconnecting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
