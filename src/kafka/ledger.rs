//! A consumer's bookkeeping of its partitions in one place: what arrived,
//! what was passed over ([`Passing`]), what is in flight and delivered, and
//! so what may be committed ([`OffsetTracker`]).
//!
//! Guarantee: no commit point handed out passes an offset that is not yet
//! delivered. The two halves meet in [`Ledger::arrive`], and the order
//! matters there: the hold [`Passing`] reports for an arrival may already
//! count that arrival as read (while a partition is read again after a seek
//! back, the hold follows the reading to one past the record that arrived,
//! and it is released once the reading is back where it was). So a record
//! taken is received by the tracker before the hold moves; the other way
//! round, the point may pass the record for a moment, and a moment is enough
//! for it to be stored and committed.
//!
//! The consumer runtime keeps one `Ledger` under its lock and calls nothing
//! else, so the order it calls these pieces in is the order its tests drive.

use super::offsets::{OffsetTracker, Ticket, TopicPartition};
use super::passing::{Arrival, Passing};
use crate::domain::Lane;

/// The bookkeeping of the partitions of one topic a consumer reads.
#[derive(Debug)]
pub struct Ledger {
    /// The topic whose partitions these are.
    topic: String,
    /// Received, in flight, delivered: the commit points.
    tracker: OffsetTracker,
    /// Where full lanes were passed over and must be read again.
    passing: Passing,
}

/// What became of a record that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrived {
    /// Taken (received and waiting for a slot), passed over, or left
    /// (received before the last seek back).
    pub arrival: Arrival,
    /// The partition's assignment generation the record belongs to.
    pub generation: u64,
    /// The partition's new commit point, when the arrival moved it forward.
    pub point: Option<i64>,
}

impl Ledger {
    /// Bookkeeping for `topic`, whose partitions hold `bound` waiting records
    /// before they pass over full lanes, if `pass_full_lanes`.
    pub fn new(topic: &str, bound: usize, pass_full_lanes: bool) -> Self {
        Self {
            topic: topic.to_owned(),
            tracker: OffsetTracker::default(),
            passing: Passing::new(bound, pass_full_lanes),
        }
    }

    fn tp(&self, partition: i32) -> TopicPartition {
        (self.topic.clone(), partition)
    }

    /// `partition` was assigned: it starts afresh, in a new generation.
    pub fn assign(&mut self, partition: TopicPartition) {
        self.tracker.assign(partition);
    }

    /// `partition` was revoked: its late completions are ignored from now
    /// on, and what was passed over is forgotten with its generation.
    pub fn revoke(&mut self, partition: &TopicPartition) {
        self.tracker.revoke(partition);
        self.passing.forget(partition.1);
    }

    /// A record of `lane` arrived at `offset` of `partition`, while
    /// `waiting` of the partition's records wait for a slot.
    pub fn arrive(&mut self, partition: i32, offset: i64, lane: Lane, waiting: usize) -> Arrived {
        let tp = self.tp(partition);
        let mut generation = self.generation(partition);
        let verdict = (self.passing).arrive(partition, generation, offset, lane, waiting);
        // Received first, then the hold moves (the module's guarantee).
        if verdict.arrival == Arrival::Take {
            generation = self.tracker.receive(tp.clone(), offset).generation;
        }
        let point = verdict.hold.and_then(|hold| self.tracker.hold(&tp, hold));
        Arrived {
            arrival: verdict.arrival,
            generation,
            point,
        }
    }

    /// The ticket's record starts handling; false when its partition was
    /// reassigned since it was received (it is not this consumer's to
    /// handle).
    pub fn start(&mut self, ticket: &Ticket) -> bool {
        self.tracker.start(ticket)
    }

    /// The ticket's record finished handling, `delivered` or not: the
    /// partition's new commit point, when it moved forward.
    pub fn finish(&mut self, ticket: &Ticket, delivered: bool) -> Option<i64> {
        self.tracker.finish(ticket, delivered)
    }

    /// A waiting record of `lane` of `partition` left the queue (started or
    /// dropped).
    pub fn left(&mut self, partition: i32, lane: Lane) {
        self.passing.left(partition, lane);
    }

    /// Where to seek `partition` back to, now that `waiting` of its records
    /// wait, if it passed over records and enough room was made.
    pub fn rewind_due(&mut self, partition: i32, waiting: usize) -> Option<i64> {
        let generation = self.generation(partition);
        self.passing.rewind_due(partition, generation, waiting)
    }

    /// The consumer sought `partition` back to `offset`.
    pub fn sought(&mut self, partition: i32, offset: i64) {
        self.passing.sought(partition, offset);
    }

    /// Whether `partition` passed over as far as it may and must pause.
    pub fn must_pause(&self, partition: i32) -> bool {
        self.passing.must_pause(partition)
    }

    /// Partitions with records passed over and not sought back to yet.
    pub fn rewinding(&self) -> Vec<i32> {
        self.passing.rewinding()
    }

    /// The generation of `partition`'s assignment (0: not assigned).
    pub fn generation(&self, partition: i32) -> u64 {
        self.tracker.generation(&self.tp(partition)).unwrap_or(0)
    }

    /// Records of `partition` whose handling has not finished.
    pub fn running(&self, partition: &TopicPartition) -> usize {
        self.tracker.running(partition)
    }

    /// The last commit point of `partition`, if it has one.
    pub fn commit_point(&self, partition: &TopicPartition) -> Option<i64> {
        self.tracker.commit_point(partition)
    }

    /// The last commit point of every owned partition that has one (the
    /// model test reads them; the consumer commits the partitions it drains,
    /// one by one, through [`Ledger::commit_point`]).
    #[cfg(test)]
    pub fn commit_points(&self) -> Vec<(TopicPartition, i64)> {
        self.tracker.commit_points()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, VecDeque};

    use proptest::prelude::*;
    use uuid::Uuid;

    use super::*;
    use crate::domain::Priority;

    const TOPIC: &str = "t";

    fn lane(n: u128) -> Lane {
        Lane::new(Uuid::from_u128(n), Priority::Normal)
    }

    fn ticket(generation: u64, offset: i64) -> Ticket {
        Ticket {
            partition: (TOPIC.to_owned(), 0),
            generation,
            offset,
        }
    }

    /// The sequence the consumer runs when a lane fills, a record is passed
    /// over, and the partition is read again from it.
    #[test]
    fn a_record_read_again_is_received_before_the_point_passes_it() {
        let (a, b) = (lane(1), lane(2));
        let mut ledger = Ledger::new(TOPIC, 4, true);
        ledger.assign((TOPIC.to_owned(), 0));
        let generation = ledger.generation(0);
        // Lane A takes 0..4; A's 4 is passed over; B's 5 is taken.
        for offset in 0..4 {
            let arrived = ledger.arrive(0, offset, a, offset as usize);
            assert_eq!(arrived.arrival, Arrival::Take);
        }
        assert_eq!(ledger.arrive(0, 4, a, 4).arrival, Arrival::Pass);
        assert_eq!(ledger.arrive(0, 5, b, 4).arrival, Arrival::Take);
        // 0..4 and 5 are delivered: the point stops at 4, passed over.
        for offset in [0, 1, 2, 3, 5] {
            let t = ticket(generation, offset);
            assert!(ledger.start(&t));
            if let Some(point) = ledger.finish(&t, true) {
                assert!(point <= 4, "point {point} passes 4, passed over");
            }
        }
        // Sought back to 4; 4 arrives again and is taken: the point may not
        // pass it until it is delivered.
        assert_eq!(ledger.rewind_due(0, 0), Some(4));
        ledger.sought(0, 4);
        let again = ledger.arrive(0, 4, a, 0);
        assert_eq!(again.arrival, Arrival::Take);
        assert_eq!(again.point, None, "4 is received, not delivered");
        assert_eq!(ledger.commit_point(&(TOPIC.to_owned(), 0)), Some(4));
        // 5 is left (received before), 6 is new: the reading is back.
        assert_eq!(ledger.arrive(0, 5, b, 1).arrival, Arrival::Again);
        assert_eq!(ledger.commit_point(&(TOPIC.to_owned(), 0)), Some(4));
        let t = ticket(generation, 4);
        assert!(ledger.start(&t));
        assert_eq!(ledger.finish(&t, true), Some(6));
    }

    /// The last record of a reading again releases the hold: it is received
    /// before that.
    #[test]
    fn the_hold_released_at_the_end_of_a_reading_again_waits_for_the_record() {
        let (a, b) = (lane(1), lane(2));
        let mut ledger = Ledger::new(TOPIC, 2, true);
        ledger.assign((TOPIC.to_owned(), 0));
        let generation = ledger.generation(0);
        ledger.arrive(0, 0, a, 0);
        ledger.arrive(0, 1, a, 1);
        assert_eq!(ledger.arrive(0, 2, a, 2).arrival, Arrival::Pass);
        // B's 3 is taken and delivered past the record passed over.
        assert_eq!(ledger.arrive(0, 3, b, 2).arrival, Arrival::Take);
        for offset in [0, 1, 3] {
            let t = ticket(generation, offset);
            ledger.left(0, if offset == 3 { b } else { a });
            assert!(ledger.start(&t));
            if let Some(point) = ledger.finish(&t, true) {
                assert!(point <= 2, "held at 2");
            }
        }
        assert_eq!(ledger.rewind_due(0, 0), Some(2));
        ledger.sought(0, 2);
        // 2 is taken again; 3, received before, ends the reading again and
        // releases the hold, while 2 is received and not delivered.
        assert_eq!(ledger.arrive(0, 2, a, 0).arrival, Arrival::Take);
        let end = ledger.arrive(0, 3, b, 1);
        assert_eq!(end.arrival, Arrival::Again);
        assert_eq!(end.point, None);
        assert_eq!(ledger.commit_point(&(TOPIC.to_owned(), 0)), Some(2));
        let t = ticket(generation, 2);
        assert!(ledger.start(&t));
        assert_eq!(ledger.finish(&t, true), Some(4));
    }

    /// A record fetched before a seek back (librdkafka drops them; the
    /// bookkeeping does not count on it) is left, and read again in its turn:
    /// passed over, it would have moved the next seek back past records not
    /// read again yet.
    #[test]
    fn a_record_fetched_before_the_seek_back_is_left_and_read_again() {
        let a = lane(1);
        let mut ledger = Ledger::new(TOPIC, 2, true);
        ledger.assign((TOPIC.to_owned(), 0));
        let generation = ledger.generation(0);
        ledger.arrive(0, 0, a, 0);
        ledger.arrive(0, 1, a, 1);
        for offset in 2..6 {
            assert_eq!(ledger.arrive(0, offset, a, 2).arrival, Arrival::Pass);
        }
        // 0 is delivered, 1 still waits: A's lane is still full at half.
        ledger.left(0, a);
        let first = ticket(generation, 0);
        assert!(ledger.start(&first));
        ledger.finish(&first, true);
        assert_eq!(ledger.rewind_due(0, 1), Some(2));
        ledger.sought(0, 2);
        // 6, fetched before the seek, arrives while A's lane is full.
        assert_eq!(ledger.arrive(0, 6, a, 2).arrival, Arrival::Again);
        assert_eq!(ledger.rewind_due(0, 1), None, "nothing new passed over");
        // The reading again takes 2..7, 6 among them, in its turn.
        let mut tickets = vec![ticket(generation, 1)];
        for offset in 2..7 {
            assert_eq!(
                ledger.arrive(0, offset, a, 1).arrival,
                Arrival::Take,
                "{offset}"
            );
            tickets.push(ticket(generation, offset));
        }
        for t in &tickets {
            ledger.left(0, a);
            assert!(ledger.start(t));
            ledger.finish(t, true);
        }
        assert_eq!(ledger.commit_point(&(TOPIC.to_owned(), 0)), Some(7));
    }

    /// One step of the consumer's run loop, as the model below takes it.
    #[derive(Debug, Clone)]
    enum Step {
        /// The next record of the log arrives (if the partition reads).
        Arrive,
        /// A record fetched before the last seek back arrives (librdkafka
        /// drops these; the bookkeeping does not count on it).
        ArriveStale,
        /// A waiting record starts (any of them: the scheduler orders by
        /// lane and priority).
        Start(usize),
        /// A running record finishes, delivered or not.
        Finish(usize, bool),
        /// The loop looks at partitions due a seek back or a resume.
        ReadOn,
        /// The partition is revoked and assigned again.
        Rebalance,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => Just(Step::Arrive),
            1 => Just(Step::ArriveStale),
            4 => any::<usize>().prop_map(Step::Start),
            4 => (any::<usize>(), prop::bool::weighted(0.97)).prop_map(|(i, d)| Step::Finish(i, d)),
            2 => Just(Step::ReadOn),
            1 => Just(Step::Rebalance),
        ]
    }

    /// A partition's log: offsets (with gaps, as transaction markers leave)
    /// and the lane of each record, mostly one flooding lane.
    fn log() -> impl Strategy<Value = Vec<(i64, u128)>> {
        prop::collection::vec((1..3i64, prop::bool::weighted(0.75)), 1..60).prop_map(|records| {
            let mut offset = -1;
            (records.into_iter())
                .enumerate()
                .map(|(i, (gap, flood))| {
                    offset += if i == 0 { 1 } else { gap };
                    (offset, if flood { 1 } else { 2 + (i % 3) as u128 })
                })
                .collect()
        })
    }

    /// The consumer runtime's use of a [`Ledger`], reduced to one partition:
    /// the same calls, in the same order, as `consumer.rs` makes them, with
    /// a broker that reads a log from a position and seeks.
    struct Model {
        ledger: Ledger,
        bound: usize,
        max_in_flight: usize,
        log: Vec<(i64, u128)>,
        /// Index of the next record the broker hands over.
        next: usize,
        /// Records fetched before the last seek back, not yet handed over.
        stale: VecDeque<usize>,
        paused: bool,
        /// Received records waiting for a slot: (log index, generation).
        waiting: Vec<(usize, u64)>,
        running: Vec<Ticket>,
        /// Every offset delivered, in any generation.
        delivered: BTreeSet<i64>,
        /// The group's committed offset.
        committed: Option<i64>,
        /// Whether a record finished undelivered in this generation (it
        /// holds the point until the partition moves).
        stuck: bool,
    }

    impl Model {
        fn new(log: Vec<(i64, u128)>, bound: usize, max_in_flight: usize) -> Self {
            let mut ledger = Ledger::new(TOPIC, bound, true);
            ledger.assign((TOPIC.to_owned(), 0));
            Self {
                ledger,
                bound,
                max_in_flight,
                log,
                next: 0,
                stale: VecDeque::new(),
                paused: false,
                waiting: Vec::new(),
                running: Vec::new(),
                delivered: BTreeSet::new(),
                committed: None,
                stuck: false,
            }
        }

        /// The lowest offset not delivered yet (one past the log when all
        /// are).
        fn lowest_undelivered(&self) -> i64 {
            (self.log.iter())
                .map(|(offset, _)| *offset)
                .find(|offset| !self.delivered.contains(offset))
                .unwrap_or_else(|| self.log.last().map_or(0, |(o, _)| o + 1))
        }

        fn check(&self, point: Option<i64>, what: &str) -> Result<(), TestCaseError> {
            let low = self.lowest_undelivered();
            for point in point
                .into_iter()
                .chain(self.ledger.commit_points().iter().map(|p| p.1))
            {
                prop_assert!(
                    point <= low,
                    "{what}: commit point {point} passes {low}, not delivered"
                );
            }
            Ok(())
        }

        fn arrived(&mut self, index: usize) -> Result<(), TestCaseError> {
            let (offset, lane_id) = self.log[index];
            let arrived = self
                .ledger
                .arrive(0, offset, lane(lane_id), self.waiting.len());
            self.check(arrived.point, &format!("arrival of {offset}"))?;
            if arrived.arrival == Arrival::Take {
                self.waiting.push((index, arrived.generation));
            }
            // pause_at_bound
            if self.waiting.len() >= self.bound * 2 || self.ledger.must_pause(0) {
                self.paused = true;
            }
            Ok(())
        }

        fn read_on(&mut self) {
            if let Some(offset) = self.ledger.rewind_due(0, self.waiting.len()) {
                let to = (self.log.iter()).position(|(o, _)| *o >= offset).unwrap();
                self.stale = (self.next..self.log.len().min(self.next + 3)).collect();
                self.next = to;
                self.ledger.sought(0, offset);
            }
            if self.paused && self.waiting.len() <= self.bound / 2 && !self.ledger.must_pause(0) {
                self.paused = false;
            }
        }

        fn start(&mut self, pick: usize) {
            if self.waiting.is_empty() || self.running.len() >= self.max_in_flight {
                return;
            }
            let (index, generation) = self.waiting.remove(pick % self.waiting.len());
            let (offset, lane_id) = self.log[index];
            self.ledger.left(0, lane(lane_id));
            self.read_on();
            let t = ticket(generation, offset);
            if self.ledger.start(&t) {
                self.running.push(t);
            }
        }

        fn finish(&mut self, pick: usize, delivered: bool) -> Result<(), TestCaseError> {
            if self.running.is_empty() {
                return Ok(());
            }
            let t = self.running.remove(pick % self.running.len());
            if delivered {
                self.delivered.insert(t.offset);
            } else if t.generation == self.ledger.generation(0) {
                self.stuck = true;
            }
            let point = self.ledger.finish(&t, delivered);
            self.check(point, &format!("finish of {}", t.offset))
        }

        fn rebalance(&mut self) -> Result<(), TestCaseError> {
            let tp = (TOPIC.to_owned(), 0);
            if let Some(point) = self.ledger.commit_point(&tp) {
                self.check(Some(point), "revoke")?;
                self.committed = Some(point);
            }
            self.ledger.revoke(&tp);
            self.ledger.assign(tp);
            let from = self.committed.unwrap_or(0);
            self.next = (self.log.iter())
                .position(|(o, _)| *o >= from)
                .unwrap_or(self.log.len());
            self.stale.clear();
            self.paused = false;
            self.stuck = false;
            Ok(())
        }

        fn take(&mut self, step: &Step) -> Result<(), TestCaseError> {
            match *step {
                Step::Arrive if !self.paused && self.next < self.log.len() => {
                    self.stale.clear();
                    self.next += 1;
                    self.arrived(self.next - 1)?;
                }
                Step::ArriveStale => {
                    if let Some(index) = self.stale.pop_front() {
                        self.arrived(index)?;
                    }
                }
                Step::Start(pick) => self.start(pick),
                Step::Finish(pick, delivered) => self.finish(pick, delivered)?,
                Step::ReadOn => self.read_on(),
                Step::Rebalance => self.rebalance()?,
                Step::Arrive => {}
            }
            self.check(None, &format!("{step:?}"))
        }

        /// Runs the loop with every record delivered until the log is read
        /// and nothing waits: every record must be delivered, and the point
        /// must reach the end.
        fn drain(&mut self) -> Result<(), TestCaseError> {
            if self.stuck {
                self.rebalance()?;
            }
            for _ in 0..100_000 {
                while !self.waiting.is_empty() && self.running.len() < self.max_in_flight {
                    self.start(0);
                }
                while !self.running.is_empty() {
                    self.finish(0, true)?;
                }
                self.read_on();
                if !self.paused && self.next < self.log.len() {
                    self.take(&Step::Arrive)?;
                } else if self.waiting.is_empty()
                    && self.running.is_empty()
                    && self.ledger.rewinding().is_empty()
                    && self.next == self.log.len()
                {
                    break;
                }
            }
            let low = self.lowest_undelivered();
            let end = self.log.last().map_or(0, |(o, _)| o + 1);
            prop_assert_eq!(low, end, "a record was never delivered");
            // The point of this generation, or what the last one committed
            // when this one received nothing.
            let point = self.ledger.commit_points().first().map(|p| p.1);
            prop_assert_eq!(
                point.or(self.committed),
                Some(end),
                "the point reaches the end"
            );
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Arrivals by lane, passes, starts and deliveries in any order,
        /// seeks back, stale fetches and rebalances: no commit point ever
        /// passes a record not delivered, and once everything is delivered
        /// the point reaches the end of the log.
        #[test]
        fn no_commit_point_passes_a_record_not_delivered(
            log in log(),
            steps in prop::collection::vec(step(), 0..300),
            bound in 2..7usize,
            max_in_flight in 1..4usize,
        ) {
            let mut model = Model::new(log, bound, max_in_flight);
            for step in &steps {
                model.take(step)?;
            }
            model.drain()?;
        }
    }
}
