//! Which waiting piece of work goes next: a received record to a consumer's
//! free slot (`kafka::consumer`), a call to an extractor's free slot
//! (`extract::slots`). Pure bookkeeping, no I/O. The order:
//!
//! 1. **Priority.** The most urgent priority with waiting records goes first,
//!    unless a record of a lower one has waited `max_wait` or longer: the
//!    oldest such record then goes first. A record is never passed over by
//!    more urgent work for longer than `max_wait`.
//! 2. **Tenants.** Within a priority, tenants with waiting records take turns
//!    in proportion to their weights, whatever order their records arrived
//!    in (stride scheduling: each start moves its tenant's pass on by one
//!    over its weight, and the tenant with the lowest pass goes next; a
//!    tenant that starts waiting joins at the pass of the last start, so
//!    idle time earns no credit).
//! 3. **Partitions.** Within a tenant's line, partitions take turns and each
//!    keeps its offset order: one deep backlog cannot starve the others
//!    (among them, the head records a dead member left behind).
//!
//! For a consumer, the order only chooses among records already received.
//! Offsets still commit at the end of each partition's delivered prefix, so
//! a record that waits here holds its partition's commit point back, and the
//! consumer pauses a partition once `read_ahead` of its records wait. Work
//! that has no partition (an extractor's calls) uses one, 0.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Priority;

/// Which line a job's work waits in: its tenant and its priority.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Lane {
    /// The job's tenant; `None` when the work does not say.
    pub tenant: Option<Uuid>,
    /// The job's priority.
    pub priority: Priority,
}

impl Lane {
    /// The lane of a job of `tenant` with `priority`.
    pub fn new(tenant: Uuid, priority: Priority) -> Self {
        Self {
            tenant: Some(tenant),
            priority,
        }
    }
}

/// Tenants' weights, shared with whatever keeps them current (the worker
/// reads them from Postgres); a tenant not named has weight 1.
#[derive(Debug, Clone, Default)]
pub struct Weights(Arc<RwLock<HashMap<Uuid, u32>>>);

impl Weights {
    /// The weight of `tenant`: at least 1.
    pub fn of(&self, tenant: Option<Uuid>) -> u32 {
        let Some(tenant) = tenant else { return 1 };
        let weights = self.0.read().expect("weights lock");
        weights.get(&tenant).copied().unwrap_or(1).max(1)
    }

    /// Replaces every weight: the tenants named, with theirs; the rest, 1.
    pub fn replace(&self, weights: HashMap<Uuid, u32>) {
        *self.0.write().expect("weights lock") = weights;
    }
}

/// A waiting record and when it arrived.
struct Entry<T> {
    seq: u64,
    since: Instant,
    item: T,
}

/// One tenant's records of one priority, a queue per partition.
struct Line<T> {
    queues: BTreeMap<i32, VecDeque<Entry<T>>>,
    /// The partition after which the next start looks.
    last: Option<i32>,
    /// Stride pass: the line with the lowest goes next.
    pass: f64,
}

impl<T> Line<T> {
    /// The partition whose turn it is.
    fn next_partition(&self) -> Option<i32> {
        let after = self.last.map_or(i32::MIN, |p| p.saturating_add(1));
        self.queues
            .range(after..)
            .chain(self.queues.range(..after))
            .find(|(_, queue)| !queue.is_empty())
            .map(|(p, _)| *p)
    }
}

/// Where a waiting partition queue's oldest record is: (its arrival, its
/// tenant, its partition). Each class keeps one per non-empty queue, so its
/// oldest record is the first.
type Front = (u64, Option<Uuid>, i32);

/// The waiting records of one priority.
struct Class<T> {
    lines: HashMap<Option<Uuid>, Line<T>>,
    fronts: BTreeSet<Front>,
    /// The pass of the last start: where a line that starts waiting joins.
    clock: f64,
    len: usize,
}

impl<T> Default for Class<T> {
    fn default() -> Self {
        Self {
            lines: HashMap::new(),
            fronts: BTreeSet::new(),
            clock: 0.0,
            len: 0,
        }
    }
}

impl<T> Class<T> {
    fn push(&mut self, tenant: Option<Uuid>, partition: i32, entry: Entry<T>) {
        let clock = self.clock;
        let line = self.lines.entry(tenant).or_insert_with(|| Line {
            queues: BTreeMap::new(),
            last: None,
            pass: clock,
        });
        let queue = line.queues.entry(partition).or_default();
        if queue.is_empty() {
            self.fronts.insert((entry.seq, tenant, partition));
        }
        queue.push_back(entry);
        self.len += 1;
    }

    /// The line whose turn it is: the lowest pass, ties to the lowest tenant.
    fn next_line(&self) -> Option<Option<Uuid>> {
        self.lines
            .iter()
            .min_by(|(a, x), (b, y)| x.pass.total_cmp(&y.pass).then(a.cmp(b)))
            .map(|(tenant, _)| *tenant)
    }

    /// Takes the oldest record of `tenant`'s queue of `partition`, and moves
    /// the tenant's pass on by one start.
    fn take(&mut self, tenant: Option<Uuid>, partition: i32, weight: u32) -> Option<Entry<T>> {
        let line = self.lines.get_mut(&tenant)?;
        let queue = line.queues.get_mut(&partition)?;
        let entry = queue.pop_front()?;
        self.fronts.remove(&(entry.seq, tenant, partition));
        match queue.front() {
            Some(next) => {
                self.fronts.insert((next.seq, tenant, partition));
            }
            None => {
                line.queues.remove(&partition);
            }
        }
        line.last = Some(partition);
        self.clock = self.clock.max(line.pass);
        line.pass += 1.0 / f64::from(weight.max(1));
        if line.queues.is_empty() {
            self.lines.remove(&tenant);
        }
        self.len -= 1;
        Some(entry)
    }

    /// The oldest waiting record: its place in the order of receipt, when it
    /// arrived, and where it is.
    fn oldest(&self) -> Option<(u64, Instant, Option<Uuid>, i32)> {
        let &(seq, tenant, partition) = self.fronts.first()?;
        let entry = self.lines.get(&tenant)?.queues.get(&partition)?.front()?;
        Some((seq, entry.since, tenant, partition))
    }
}

/// The records a consumer received and has not started, in the order above.
pub struct Scheduler<T> {
    classes: [Class<T>; 3],
    max_wait: Duration,
    weights: Weights,
    /// Waiting records of each partition, for the pause bound.
    per_partition: HashMap<i32, usize>,
    seq: u64,
}

impl<T> Scheduler<T> {
    /// A scheduler that passes over no record for longer than `max_wait`, and
    /// shares among tenants by `weights`.
    pub fn new(max_wait: Duration, weights: Weights) -> Self {
        Self {
            classes: Default::default(),
            max_wait,
            weights,
            per_partition: HashMap::new(),
            seq: 0,
        }
    }

    /// Adds a record of `partition` in `lane`, arrived `now`; returns how
    /// many of its partition's records wait now.
    pub fn push(&mut self, item: T, partition: i32, lane: Lane, now: Instant) -> usize {
        self.seq += 1;
        let entry = Entry {
            seq: self.seq,
            since: now,
            item,
        };
        self.classes[lane.priority.rank()].push(lane.tenant, partition, entry);
        let waiting = self.per_partition.entry(partition).or_default();
        *waiting += 1;
        *waiting
    }

    /// The record to start next, with its partition, if any waits.
    pub fn pop(&mut self, now: Instant) -> Option<(T, i32)> {
        let top = self.classes.iter().position(|c| c.len > 0)?;
        let overdue = self.classes[top + 1..]
            .iter()
            .enumerate()
            .filter_map(|(i, class)| class.oldest().map(|oldest| (oldest, top + 1 + i)))
            .min_by_key(|((seq, ..), _)| *seq)
            .filter(|((_, since, ..), _)| now.saturating_duration_since(*since) >= self.max_wait);
        let (rank, tenant, partition) = match overdue {
            Some(((_, _, tenant, partition), rank)) => (rank, tenant, partition),
            None => {
                let class = &self.classes[top];
                let tenant = class.next_line()?;
                let partition = class.lines.get(&tenant)?.next_partition()?;
                (top, tenant, partition)
            }
        };
        let weight = self.weights.of(tenant);
        let entry = self.classes[rank].take(tenant, partition, weight)?;
        if let Some(waiting) = self.per_partition.get_mut(&partition) {
            *waiting -= 1;
            if *waiting == 0 {
                self.per_partition.remove(&partition);
            }
        }
        Some((entry.item, partition))
    }

    /// How many records of `partition` wait.
    pub fn waiting(&self, partition: i32) -> usize {
        self.per_partition.get(&partition).copied().unwrap_or(0)
    }

    /// How many records of `priority` wait.
    pub fn waiting_of(&self, priority: Priority) -> usize {
        self.classes[priority.rank()].len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(tenant: u128, priority: Priority) -> Lane {
        Lane::new(Uuid::from_u128(tenant), priority)
    }

    fn drain(s: &mut Scheduler<&'static str>, now: Instant) -> Vec<&'static str> {
        std::iter::from_fn(|| s.pop(now).map(|(item, _)| item)).collect()
    }

    #[test]
    fn more_urgent_work_goes_first_and_each_priority_keeps_its_order() {
        let now = Instant::now();
        let mut s = Scheduler::new(Duration::from_secs(10), Weights::default());
        s.push("low1", 0, lane(1, Priority::Low), now);
        s.push("normal1", 0, lane(1, Priority::Normal), now);
        s.push("low2", 0, lane(1, Priority::Low), now);
        s.push("high1", 0, lane(1, Priority::High), now);
        s.push("normal2", 0, lane(1, Priority::Normal), now);
        assert_eq!(s.waiting(0), 5);
        assert_eq!(s.waiting_of(Priority::Low), 2);
        assert_eq!(
            drain(&mut s, now),
            ["high1", "normal1", "normal2", "low1", "low2"]
        );
        assert_eq!(s.waiting(0), 0);
    }

    #[test]
    fn a_record_waiting_past_the_bound_is_passed_over_no_more() {
        let start = Instant::now();
        let max_wait = Duration::from_secs(10);
        let mut s = Scheduler::new(max_wait, Weights::default());
        s.push("low-old", 0, lane(1, Priority::Low), start);
        s.push("normal-old", 1, lane(1, Priority::Normal), start);
        let later = start + Duration::from_secs(5);
        s.push("high", 2, lane(2, Priority::High), later);
        // Within the bound, urgency decides.
        assert_eq!(s.pop(later).map(|(i, _)| i), Some("high"));
        s.push("high2", 2, lane(2, Priority::High), later);
        // Past it, the oldest overdue record goes, whatever its priority (of
        // two that arrived at once, the one received first).
        let overdue = start + max_wait;
        assert_eq!(drain(&mut s, overdue), ["low-old", "normal-old", "high2"]);
    }

    #[test]
    fn tenants_take_turns_by_weight_whatever_order_they_arrived_in() {
        let now = Instant::now();
        let weights = Weights::default();
        weights.replace(HashMap::from([(Uuid::from_u128(2), 3)]));
        let mut s = Scheduler::new(Duration::from_secs(60), weights);
        // A's flood arrives first, then B's (weight 3) and C's.
        for _ in 0..100 {
            s.push("a", 0, lane(1, Priority::Normal), now);
        }
        for _ in 0..30 {
            s.push("b", 1, lane(2, Priority::Normal), now);
        }
        for _ in 0..10 {
            s.push("c", 2, lane(3, Priority::Normal), now);
        }
        let first: Vec<_> = (0..50).map(|_| s.pop(now).unwrap().0).collect();
        let count = |who| first.iter().filter(|x| **x == who).count();
        // Shares 1 : 3 : 1 of 50 starts.
        assert_eq!((count("a"), count("b"), count("c")), (10, 30, 10));
    }

    #[test]
    fn a_tenant_that_starts_waiting_late_gets_no_credit_for_idle_time() {
        let now = Instant::now();
        let mut s = Scheduler::new(Duration::from_secs(60), Weights::default());
        for _ in 0..20 {
            s.push("a", 0, lane(1, Priority::Normal), now);
        }
        for _ in 0..10 {
            s.pop(now);
        }
        for _ in 0..10 {
            s.push("b", 0, lane(2, Priority::Normal), now);
        }
        let next: Vec<_> = (0..4).map(|_| s.pop(now).unwrap().0).collect();
        let bs = next.iter().filter(|x| **x == "b").count();
        assert_eq!(bs, 2, "B alternates with A from its arrival on: {next:?}");
    }

    #[test]
    fn partitions_take_turns_within_a_line() {
        let now = Instant::now();
        let mut s = Scheduler::new(Duration::from_secs(60), Weights::default());
        for item in ["p0a", "p0b", "p0c"] {
            s.push(item, 0, Lane::default(), now);
        }
        s.push("p1a", 1, Lane::default(), now);
        assert_eq!(drain(&mut s, now), ["p0a", "p1a", "p0b", "p0c"]);
    }
}
