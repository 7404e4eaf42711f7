//! Which offset of a partition may be committed: the end of its contiguous
//! delivered prefix. Pure bookkeeping, no I/O; the consumer runtime feeds it.
//!
//! Records of one partition are received in offset order and may start and
//! finish in any order (the consumer starts urgent work first). The commit
//! point is the lowest offset received and not delivered (everything below it
//! was received earlier and was delivered), or one past the highest delivered
//! offset when nothing is in flight. A partition's state is dropped when it is revoked and begins afresh,
//! with a new generation, when it is assigned again, so a record that finishes
//! after its partition moved away can never advance the new owner's state.

use std::collections::{BTreeSet, HashMap};

/// A topic partition.
pub type TopicPartition = (String, i32);

/// Bookkeeping of one assigned partition.
#[derive(Debug, Default)]
struct PartitionState {
    generation: u64,
    /// Received and not delivered (started or not).
    in_flight: BTreeSet<i64>,
    /// Records started whose handling has not finished yet (delivered or not).
    running: usize,
    /// One past the highest finished offset.
    finished_end: Option<i64>,
    /// The last commit point handed out.
    committed: Option<i64>,
    /// A record not received (passed over, to be read again: `passing`):
    /// the commit point stays at or below it until the hold is released.
    held: Option<i64>,
}

impl PartitionState {
    /// The commit point, if it moved forward since it was last handed out.
    fn advance(&mut self) -> Option<i64> {
        let point = self.in_flight.first().copied().or(self.finished_end)?;
        let point = self.held.map_or(point, |held| point.min(held));
        if self.committed.is_some_and(|c| c >= point) {
            return None;
        }
        self.committed = Some(point);
        Some(point)
    }
}

/// Commit points of every partition this consumer owns.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    partitions: HashMap<TopicPartition, PartitionState>,
    generations: u64,
}

/// A record's ticket: which partition generation it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// Topic and partition.
    pub partition: TopicPartition,
    /// Generation of the partition's assignment when the record was received.
    pub generation: u64,
    /// The record's offset.
    pub offset: i64,
}

impl OffsetTracker {
    /// Starts fresh bookkeeping for a newly assigned partition.
    pub fn assign(&mut self, partition: TopicPartition) {
        self.generations += 1;
        let state = PartitionState {
            generation: self.generations,
            ..PartitionState::default()
        };
        self.partitions.insert(partition, state);
    }

    /// Forgets a revoked partition; its late completions will be ignored.
    pub fn revoke(&mut self, partition: &TopicPartition) {
        self.partitions.remove(partition);
    }

    /// Records that `offset` was received: it is in flight from now on, and
    /// holds the commit point back until it is delivered, whenever it
    /// starts. Records of a partition must be received in offset order; they
    /// may start in any order.
    pub fn receive(&mut self, partition: TopicPartition, offset: i64) -> Ticket {
        if !self.partitions.contains_key(&partition) {
            tracing::debug!(
                ?partition,
                offset,
                "record for a partition not assigned; tracking it afresh"
            );
            self.assign(partition.clone());
        }
        let state = self.partitions.get_mut(&partition).expect("just ensured");
        state.in_flight.insert(offset);
        Ticket {
            generation: state.generation,
            partition,
            offset,
        }
    }

    /// Records that the ticket's record starts handling; false (and nothing
    /// recorded) when its partition was revoked or assigned again since it
    /// was received, so the record is not this consumer's to handle.
    pub fn start(&mut self, ticket: &Ticket) -> bool {
        match self.partitions.get_mut(&ticket.partition) {
            Some(state) if state.generation == ticket.generation => {
                state.running += 1;
                true
            }
            _ => false,
        }
    }

    /// Receives and starts `offset` at once.
    pub fn begin(&mut self, partition: TopicPartition, offset: i64) -> Ticket {
        let ticket = self.receive(partition, offset);
        self.start(&ticket);
        ticket
    }

    /// Records that the ticket's record finished handling, delivered or not.
    /// Returns the partition's new commit point when it moved forward.
    pub fn finish(&mut self, ticket: &Ticket, delivered: bool) -> Option<i64> {
        let state = self.partitions.get_mut(&ticket.partition)?;
        if state.generation != ticket.generation {
            return None;
        }
        state.running = state.running.saturating_sub(1);
        if !delivered || !state.in_flight.remove(&ticket.offset) {
            return None;
        }
        let end = ticket.offset + 1;
        state.finished_end = Some(state.finished_end.map_or(end, |e| e.max(end)));
        state.advance()
    }

    /// Holds `partition`'s commit point at or below `hold` (records from
    /// there on may have been passed over without being received:
    /// `passing`), or releases it (`None`).
    /// Returns the partition's new commit point when it moved forward.
    pub fn hold(&mut self, partition: &TopicPartition, hold: Option<i64>) -> Option<i64> {
        let state = self.partitions.get_mut(partition)?;
        state.held = hold;
        state.advance()
    }

    /// The generation of `partition`'s current assignment, if it is assigned.
    pub fn generation(&self, partition: &TopicPartition) -> Option<u64> {
        self.partitions.get(partition).map(|s| s.generation)
    }

    /// Records of `partition` whose handling has not finished.
    pub fn running(&self, partition: &TopicPartition) -> usize {
        self.partitions.get(partition).map_or(0, |s| s.running)
    }

    /// The last commit point of `partition`, if it has one.
    pub fn commit_point(&self, partition: &TopicPartition) -> Option<i64> {
        self.partitions.get(partition)?.committed
    }

    /// The last commit point of every owned partition that has one.
    pub fn commit_points(&self) -> Vec<(TopicPartition, i64)> {
        self.partitions
            .iter()
            .filter_map(|(tp, s)| s.committed.map(|c| (tp.clone(), c)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        ("t".to_owned(), 0)
    }

    #[test]
    fn commit_point_waits_for_the_lowest_in_flight_record() {
        let mut tracker = OffsetTracker::default();
        tracker.assign(tp());
        let tickets: Vec<_> = (10..14).map(|o| tracker.begin(tp(), o)).collect();
        // 12 done but 10 still in flight: the point may not pass 10.
        assert_eq!(tracker.finish(&tickets[2], true), Some(10));
        assert_eq!(
            tracker.finish(&tickets[1], true),
            None,
            "still 10: nothing new to store"
        );
        assert_eq!(
            tracker.finish(&tickets[0], true),
            Some(13),
            "10..=12 done, 13 in flight"
        );
        assert_eq!(tracker.finish(&tickets[3], true), Some(14));
        assert_eq!(
            tracker.finish(&tickets[3], true),
            None,
            "finishing twice changes nothing"
        );
    }

    #[test]
    fn a_held_point_stays_below_a_record_passed_over_until_released() {
        let mut tracker = OffsetTracker::default();
        tracker.assign(tp());
        let first = tracker.begin(tp(), 0);
        // 1 and 2 are passed over; 3, another lane's, is received and done.
        tracker.hold(&tp(), Some(1));
        let later = tracker.begin(tp(), 3);
        assert_eq!(tracker.finish(&first, true), Some(1));
        assert_eq!(tracker.finish(&later, true), None, "held at 1");
        // Read again: 1 is received, the hold released, 1 and 2 delivered.
        let again: Vec<_> = (1..3).map(|o| tracker.begin(tp(), o)).collect();
        assert_eq!(tracker.hold(&tp(), None), None, "1 in flight");
        assert_eq!(tracker.finish(&again[1], true), None, "1 still in flight");
        assert_eq!(tracker.finish(&again[0], true), Some(4));
        // A hold released after the last finish moves the point itself.
        let last = tracker.begin(tp(), 4);
        tracker.hold(&tp(), Some(5));
        let more = tracker.begin(tp(), 6);
        assert_eq!(tracker.finish(&last, true), Some(5));
        assert_eq!(tracker.finish(&more, true), None, "held at 5");
        assert_eq!(tracker.hold(&tp(), None), Some(7));
    }

    #[test]
    fn a_revoked_partition_ignores_late_completions() {
        let mut tracker = OffsetTracker::default();
        tracker.assign(tp());
        let old = tracker.begin(tp(), 5);
        tracker.revoke(&tp());
        tracker.assign(tp());
        let new = tracker.begin(tp(), 3);
        assert_eq!(tracker.finish(&old, true), None);
        assert_eq!(tracker.running(&tp()), 1);
        assert_eq!(tracker.finish(&new, true), Some(4));
        assert_eq!(tracker.commit_points(), vec![(tp(), 4)]);
    }

    #[test]
    fn out_of_order_completion_never_commits_past_a_gap() {
        // Randomised order, checked against the definition.
        use rand::seq::SliceRandom;
        let mut rng = rand::rng();
        for _ in 0..200 {
            let mut tracker = OffsetTracker::default();
            let mut tickets: Vec<_> = (0..20).map(|o| tracker.begin(tp(), o)).collect();
            tickets.shuffle(&mut rng);
            let mut done = BTreeSet::new();
            for t in &tickets {
                done.insert(t.offset);
                let prefix_end = (0..=20).find(|o| !done.contains(o)).unwrap();
                if let Some(point) = tracker.finish(t, true) {
                    assert_eq!(point, prefix_end);
                }
            }
            assert_eq!(tracker.commit_points(), vec![(tp(), 20)]);
        }
    }

    #[test]
    fn an_undelivered_record_holds_the_commit_point_back_for_good() {
        let mut tracker = OffsetTracker::default();
        let first = tracker.begin(tp(), 0);
        let second = tracker.begin(tp(), 1);
        assert_eq!(tracker.running(&tp()), 2);
        assert_eq!(tracker.finish(&first, false), None);
        assert_eq!(tracker.finish(&second, true), Some(0));
        assert_eq!(tracker.running(&tp()), 0, "both finished");
        assert_eq!(
            tracker.commit_point(&tp()),
            Some(0),
            "offset 0 is redelivered"
        );
    }

    #[test]
    fn a_record_received_and_not_started_holds_the_point_back() {
        let mut tracker = OffsetTracker::default();
        tracker.assign(tp());
        let waiting = tracker.receive(tp(), 0);
        let urgent = tracker.receive(tp(), 1);
        assert!(tracker.start(&urgent));
        assert_eq!(tracker.running(&tp()), 1, "only the started one runs");
        assert_eq!(
            tracker.finish(&urgent, true),
            Some(0),
            "0 is not delivered yet: the point stays before it"
        );
        assert!(tracker.start(&waiting));
        assert_eq!(tracker.finish(&waiting, true), Some(2));
    }

    #[test]
    fn a_record_received_before_a_reassignment_does_not_start() {
        let mut tracker = OffsetTracker::default();
        tracker.assign(tp());
        let old = tracker.receive(tp(), 7);
        tracker.revoke(&tp());
        tracker.assign(tp());
        assert!(!tracker.start(&old));
        assert_eq!(tracker.running(&tp()), 0);
        let new = tracker.begin(tp(), 7);
        assert_eq!(tracker.finish(&new, true), Some(8));
    }
}
