//! Admission of submits: `serve` lets a submit in only while it has room to
//! answer it quickly, and refuses the rest at once (503 `overloaded` with
//! `Retry-After`), once their caller is known (from the key cache, as a
//! rule) and before their body is read or a pool connection taken. An
//! overloaded process therefore answers every request in milliseconds, and
//! the submits it admits finish near the target latency instead of queueing
//! into the answer bound.
//!
//! The room is a limit on submits in flight, adapted to what the process can
//! do right now by additive increase and multiplicative decrease, as TCP's
//! congestion window is. Its signal is how long a submit takes to make its
//! row durable (parsing aside, that is the work a submit queues for: the
//! runtime, the statement batcher, the pool and Postgres), not how long it
//! waits for the broker's acknowledgement, which costs nothing while it waits
//! and is cut short by the answer bound anyway:
//! - while the recent latency (an average over about the last ten submits)
//!   is within the target, each submit admitted while at least half of the
//!   limit was in use raises the limit by `1 / limit` (about one per round of
//!   submits);
//! - past the target (a submit abandoned before its row was durable, when
//!   the REST backstop fired or the client hung up, counts as late as the
//!   answer bound), the limit is cut by a tenth, at most once per round
//!   trip, so one congestion episode is one cut rather than one per late
//!   submit; and only while nine tenths of it or more are in flight, since
//!   cutting a limit that is not reached changes nothing but the next
//!   burst's fate.
//!
//! A submit that moves a file's bytes (a multipart submit, a fetched
//! `document.url`) holds no permit while they move: they take as long as
//! their sender does, which says nothing of the process's room. It takes
//! its permit once its file is stored, and its sample is the rest.
//!
//! The limit is shared fairly between tenants, by the weights the workers
//! share their slots by (`docstream tenants set-weight`). Below the limit
//! every submit is admitted, whoever sends it. At the limit, a submit is
//! still admitted while its tenant holds fewer than its share of the limit,
//! `limit × weight ÷ the weights of the tenants with submits in flight`
//! (its own included), and at least one: a tenant that floods takes the
//! refusals, and another tenant's submits still get in. Those admissions go
//! past the limit; they stop at twice it, which is what the shares of all
//! tenants can add up to, so the overshoot is bounded. This is the partitioned
//! limit of Netflix's concurrency-limits: guaranteed shares that lend what
//! they do not use.
//!
//! The target is `submit_target_latency_ms`, or three times the submit
//! INSERT's recent duration when that is longer: a database that is slow for
//! everyone (a slow network, a failover) is not overload, and cutting the
//! limit would not make it faster; more submits in flight then share each
//! statement and keep the rate up. The target never exceeds three quarters
//! of the answer bound. Under overload the limit settles where rows become durable in about
//! the target; with less load the limit is never reached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::domain::schedule::Weights;

use crate::config::Settings;

/// The limit's bounds and its start.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionSettings {
    /// Latency the limit aims for when the database is fast.
    pub target: Duration,
    /// The answer bound: the target stays below three quarters of it.
    pub answer_bound: Duration,
    /// The fewest submits in flight the limit allows.
    pub min_limit: usize,
    /// The most.
    pub max_limit: usize,
}

/// The admission limit of one process; clones share it.
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

struct Inner {
    settings: AdmissionSettings,
    /// The tenants' weights, which their shares of the limit follow.
    weights: Weights,
    state: Mutex<State>,
}

struct State {
    /// Submits allowed in flight (fractional: increases are small steps).
    limit: f64,
    in_flight: usize,
    /// The submit INSERT's recent duration, seconds (an exponential average).
    statement_s: f64,
    /// The last INSERT's duration, seconds.
    last_statement_s: f64,
    /// Admitted submits' recent latency to a durable row, seconds (an
    /// exponential average): what the limit is steered by, so that one slow
    /// submit among fast ones is noise, not congestion.
    latency_s: f64,
    /// When the limit was last cut.
    last_cut: Instant,
    /// The tenants with submits in flight: how many, and the weight each
    /// had when its first was admitted.
    tenants: HashMap<Uuid, Held>,
    /// The sum of the weights in `tenants`.
    weight_in_flight: u64,
}

/// One tenant's submits in flight.
#[derive(Debug, Clone, Copy)]
struct Held {
    in_flight: usize,
    weight: u32,
}

/// A submit admitted; it leaves the limit when dropped. One dropped before
/// its row was [`durable`](Permit::durable) counts as late.
pub struct Permit {
    inner: Arc<Inner>,
    tenant: Uuid,
    admitted: Instant,
    /// Whether half the limit or more was in use when it was admitted.
    busy: bool,
    sampled: bool,
}

/// Weight of a new statement duration in the average (about the last five):
/// statements run a few a second when the database is slow, and the target
/// must follow it within a second or two, before the limit is cut for it.
const STATEMENT_WEIGHT: f64 = 0.2;
/// Weight of a new latency sample in the average (about the last ten).
const LATENCY_WEIGHT: f64 = 0.1;
/// The target is at least this many statement durations: a submit may wait
/// for the running statement, then runs in the next.
const STATEMENTS_PER_TARGET: f64 = 3.0;
/// The share of the limit in flight from which it is what holds submits
/// back, and a late one cuts it.
const BINDING: f64 = 0.9;
/// What a late submit leaves of the limit.
const CUT: f64 = 0.9;
/// The most submits in flight, as a multiple of the limit, that tenants
/// below their shares may take it to.
const SHARES_OVER_LIMIT: f64 = 2.0;

impl AdmissionSettings {
    /// The limit's settings in `settings`.
    pub fn of(settings: &Settings) -> Self {
        Self {
            target: Duration::from_millis(settings.submit_target_latency_ms),
            answer_bound: settings.http_answer_timeout_s.get(),
            min_limit: settings.submit_min_in_flight,
            max_limit: settings.submit_max_in_flight,
        }
    }
}

impl Admission {
    /// A limit starting at a quarter of the way from `min_limit` to
    /// `max_limit`, shared by `weights` at its top.
    pub fn new(settings: AdmissionSettings, weights: Weights) -> Self {
        let min = settings.min_limit.max(1) as f64;
        let max = (settings.max_limit as f64).max(min);
        let state = State {
            limit: min + (max - min) / 4.0,
            in_flight: 0,
            statement_s: 0.0,
            last_statement_s: 0.0,
            latency_s: 0.0,
            last_cut: Instant::now(),
            tenants: HashMap::new(),
            weight_in_flight: 0,
        };
        let settings = AdmissionSettings {
            min_limit: min as usize,
            max_limit: max as usize,
            ..settings
        };
        Self {
            inner: Arc::new(Inner {
                settings,
                weights,
                state: Mutex::new(state),
            }),
        }
    }

    /// A permit if a submit of `tenant` has room now: below the limit, or
    /// within the tenant's share of it; `None` means refuse it.
    pub fn try_admit(&self, tenant: Uuid) -> Option<Permit> {
        let weight = self.inner.weights.of(Some(tenant));
        let mut state = self.inner.lock();
        let limit = state.limit.floor();
        if state.in_flight as f64 >= limit && !state.within_share(tenant, weight, limit) {
            return None;
        }
        state.in_flight += 1;
        let held = state.tenants.entry(tenant).or_insert(Held {
            in_flight: 0,
            weight: weight.max(1),
        });
        held.in_flight += 1;
        if held.in_flight == 1 {
            state.weight_in_flight += u64::from(held.weight);
        }
        let busy = state.in_flight as f64 * 2.0 >= state.limit;
        Some(Permit {
            inner: self.inner.clone(),
            tenant,
            admitted: Instant::now(),
            busy,
            sampled: false,
        })
    }

    /// Records how long one submit INSERT statement took.
    pub fn statement_took(&self, took: Duration) {
        let mut state = self.inner.lock();
        let took = took.as_secs_f64();
        state.last_statement_s = took;
        state.statement_s = match state.statement_s {
            0.0 => took,
            average => average + STATEMENT_WEIGHT * (took - average),
        };
    }

    /// The limit now, and the submits in flight.
    pub fn snapshot(&self) -> (usize, usize) {
        let state = self.inner.lock();
        (state.limit.floor() as usize, state.in_flight)
    }

    /// The latency the limit aims for now (read by the tests only).
    #[cfg(test)]
    fn target(&self) -> Duration {
        let state = self.inner.lock();
        self.inner.target(&state)
    }
}

impl State {
    /// Whether `tenant` (weight `weight`) holds fewer submits than its share
    /// of `limit`, and the whole is below [`SHARES_OVER_LIMIT`] times it.
    fn within_share(&self, tenant: Uuid, weight: u32, limit: f64) -> bool {
        if self.in_flight as f64 >= limit * SHARES_OVER_LIMIT {
            return false;
        }
        let (held, weight) = match self.tenants.get(&tenant) {
            Some(held) => (held.in_flight, held.weight),
            None => (0, weight.max(1)),
        };
        let others = self.weight_in_flight - if held > 0 { u64::from(weight) } else { 0 };
        let share = (limit * f64::from(weight) / (others + u64::from(weight)) as f64).floor();
        (held as f64) < share.max(1.0)
    }

    /// A permit of `tenant` left.
    fn release(&mut self, tenant: Uuid) {
        self.in_flight -= 1;
        if let Some(held) = self.tenants.get_mut(&tenant) {
            held.in_flight -= 1;
            if held.in_flight == 0 {
                self.weight_in_flight -= u64::from(held.weight);
                self.tenants.remove(&tenant);
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is numbers updated in place: a panic elsewhere cannot
        // leave it inconsistent, so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The settings' target, or [`STATEMENTS_PER_TARGET`] INSERTs (the
    /// average or the last, whichever is longer: a database that turned slow
    /// raises the target with its first slow statement), within 3/4 of the
    /// answer bound.
    fn target(&self, state: &State) -> Duration {
        let statement_s = state.statement_s.max(state.last_statement_s);
        let slow_database = Duration::from_secs_f64(statement_s * STATEMENTS_PER_TARGET);
        self.settings
            .target
            .max(slow_database)
            .min(self.settings.answer_bound * 3 / 4)
    }

    /// Adapts the limit to one sample: `latency` (`None`: abandoned, as late
    /// as the answer bound). While the recent latency is within the target,
    /// a busy limit grows; past it, the limit is cut, at most once per
    /// round trip (the recent latency, or the target if longer).
    fn sample(&self, latency: Option<Duration>, busy: bool) {
        let mut state = self.lock();
        let latency = latency.unwrap_or(self.settings.answer_bound).as_secs_f64();
        state.latency_s = match state.latency_s {
            0.0 => latency,
            average => average + LATENCY_WEIGHT * (latency - average),
        };
        let target = self.target(&state).as_secs_f64();
        let (min, max) = (
            self.settings.min_limit as f64,
            self.settings.max_limit as f64,
        );
        if state.latency_s <= target {
            if busy {
                state.limit = (state.limit + 1.0 / state.limit).min(max);
            }
            return;
        }
        // A cut only matters while the limit is what holds submits back: a
        // database slow for everyone makes every submit late, and cutting a
        // limit that is not reached would only turn clients away once it is.
        let binding = state.in_flight as f64 + 1.0 >= state.limit * BINDING;
        let now = Instant::now();
        let round_trip = Duration::from_secs_f64(state.latency_s.max(target));
        if binding && now.duration_since(state.last_cut) >= round_trip {
            state.limit = (state.limit * CUT).max(min);
            state.last_cut = now;
        }
    }
}

impl Permit {
    /// The submit's row is durable (or its submit was refused for what it
    /// said, or failed): the time since admission is the limit's sample.
    /// Only the first call counts.
    pub fn durable(&mut self) {
        if !self.sampled {
            self.sampled = true;
            self.inner.sample(Some(self.admitted.elapsed()), self.busy);
        }
    }
}

impl Permit {
    /// Leaves the limit without a sample: what the submit does next (move
    /// a file's bytes) takes as long as its sender does, and says nothing
    /// of the room the process has.
    pub fn set_aside(mut self) {
        self.sampled = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.sampled {
            self.inner.sample(None, self.busy);
        }
        self.inner.lock().release(self.tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tenants.
    const A: Uuid = Uuid::from_u128(0xa);
    const B: Uuid = Uuid::from_u128(0xb);

    fn admission(min: usize, max: usize) -> Admission {
        let settings = AdmissionSettings {
            target: Duration::from_millis(100),
            answer_bound: Duration::from_secs(2),
            min_limit: min,
            max_limit: max,
        };
        Admission::new(settings, Weights::default())
    }

    #[test]
    fn refuses_past_the_limit_and_admits_again_once_one_leaves() {
        let admission = admission(4, 4);
        let permits: Vec<Permit> = (0..4).map(|_| admission.try_admit(A).unwrap()).collect();
        assert!(admission.try_admit(A).is_none());
        drop(permits);
        assert_eq!(admission.snapshot().1, 0);
        assert!(admission.try_admit(A).is_some());
    }

    #[test]
    fn fast_answers_under_load_raise_the_limit() {
        let admission = admission(4, 100);
        let start = admission.snapshot().0;
        for _ in 0..200 {
            let permits: Vec<Permit> = (0..start).filter_map(|_| admission.try_admit(A)).collect();
            for mut permit in permits {
                permit.durable();
            }
        }
        assert!(admission.snapshot().0 > start, "{:?}", admission.snapshot());
    }

    #[test]
    fn fast_answers_without_load_leave_the_limit_alone() {
        let admission = admission(4, 100);
        let start = admission.snapshot().0;
        for _ in 0..1000 {
            admission.try_admit(A).unwrap().durable();
        }
        assert_eq!(admission.snapshot().0, start);
    }

    /// Every permit the limit gives now: with them held, it is binding.
    fn fill(admission: &Admission) -> Vec<Permit> {
        std::iter::from_fn(|| admission.try_admit(A)).collect()
    }

    #[test]
    fn a_late_answer_cuts_a_binding_limit_once_per_round_trip() {
        let admission = admission(4, 100);
        let start = admission.snapshot().0;
        // The first cut needs a round trip since the limit was made.
        admission.inner.lock().last_cut -= Duration::from_secs(1);
        let permits = fill(&admission);
        std::thread::sleep(Duration::from_millis(101));
        for mut permit in permits {
            permit.durable();
        }
        let after = admission.snapshot().0;
        assert_eq!(after, (start as f64 * CUT).floor() as usize);
    }

    #[test]
    fn a_late_answer_leaves_a_limit_that_is_not_reached_alone() {
        let admission = admission(4, 100);
        let start = admission.snapshot().0;
        admission.inner.lock().last_cut -= Duration::from_secs(10);
        let mut permit = admission.try_admit(A).unwrap();
        std::thread::sleep(Duration::from_millis(101));
        permit.durable();
        assert_eq!(admission.snapshot().0, start);
    }

    #[test]
    fn an_abandoned_submit_counts_as_late_and_leaves() {
        let admission = admission(4, 100);
        admission.inner.lock().last_cut -= Duration::from_secs(10);
        let start = admission.snapshot().0;
        drop(fill(&admission));
        assert_eq!(admission.snapshot(), ((start as f64 * CUT) as usize, 0));
    }

    #[test]
    fn permits_set_aside_leave_without_cutting_the_limit() {
        let admission = admission(4, 100);
        admission.inner.lock().last_cut -= Duration::from_secs(10);
        let start = admission.snapshot().0;
        fill(&admission).into_iter().for_each(Permit::set_aside);
        assert_eq!(admission.snapshot(), (start, 0));
    }

    #[test]
    fn the_limit_never_falls_below_its_minimum() {
        let admission = admission(4, 100);
        for _ in 0..100 {
            admission.inner.lock().last_cut -= Duration::from_secs(10);
            drop(fill(&admission));
        }
        assert_eq!(admission.snapshot().0, 4);
    }

    #[test]
    fn a_slow_database_raises_the_target_up_to_three_quarters_of_the_bound() {
        let admission = admission(4, 100);
        assert_eq!(admission.target(), Duration::from_millis(100));
        admission.statement_took(Duration::from_millis(200));
        assert_eq!(admission.target(), Duration::from_millis(600));
        // A database that turns slow raises it with its first slow statement.
        admission.statement_took(Duration::from_millis(400));
        assert_eq!(admission.target(), Duration::from_millis(1200));
        admission.statement_took(Duration::from_secs(5));
        assert_eq!(admission.target(), Duration::from_millis(1500));
    }

    #[test]
    fn one_slow_submit_among_fast_ones_is_no_reason_to_cut() {
        let admission = admission(4, 100);
        admission.inner.lock().last_cut -= Duration::from_secs(10);
        let start = admission.snapshot().0;
        let _binding = fill(&admission);
        for _ in 0..20 {
            admission
                .inner
                .sample(Some(Duration::from_millis(10)), false);
        }
        admission
            .inner
            .sample(Some(Duration::from_millis(500)), false);
        assert_eq!(admission.snapshot().0, start);
        // Slow ones in a row are.
        for _ in 0..10 {
            admission
                .inner
                .sample(Some(Duration::from_millis(500)), false);
        }
        assert!(admission.snapshot().0 < start);
    }

    #[test]
    fn at_the_limit_a_tenant_below_its_share_is_still_admitted() {
        let admission = admission(4, 4);
        let flood = fill(&admission);
        assert_eq!(flood.len(), 4);
        // B's share of 4 beside A, both of weight 1: 2.
        let b: Vec<Permit> = (0..2).map(|_| admission.try_admit(B).unwrap()).collect();
        assert!(admission.try_admit(B).is_none());
        assert!(admission.try_admit(A).is_none());
        assert_eq!(admission.snapshot(), (4, 6));
        // A is refused until it is back under its own share.
        drop(flood);
        let a: Vec<Permit> = (0..2).map(|_| admission.try_admit(A).unwrap()).collect();
        assert!(admission.try_admit(A).is_none());
        drop((a, b));
        let state = admission.inner.lock();
        assert_eq!((state.in_flight, state.weight_in_flight), (0, 0));
        assert!(state.tenants.is_empty());
    }

    #[test]
    fn shares_follow_the_weights() {
        let admission = admission(8, 8);
        let _flood = fill(&admission);
        // B of weight 3 beside A of weight 1: 6 of 8.
        admission.inner.weights.replace([(B, 3)].into());
        let b: Vec<Permit> = std::iter::from_fn(|| admission.try_admit(B)).collect();
        assert_eq!(b.len(), 6);
    }

    #[test]
    fn admissions_past_the_limit_stop_at_twice_it() {
        let admission = admission(4, 4);
        let _flood = fill(&admission);
        // Every tenant's share is at least one: many tenants, one each.
        let many: Vec<Permit> = (1..100u128)
            .filter_map(|n| admission.try_admit(Uuid::from_u128(0x100 + n)))
            .collect();
        assert_eq!(many.len(), 4);
        assert_eq!(admission.snapshot(), (4, 8));
    }
}
