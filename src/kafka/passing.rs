//! Passing over a full lane: how a consumer keeps reading a partition behind
//! one lane's backlog.
//!
//! A worker orders only the records it has received (`domain::schedule`),
//! and it receives at most its read-ahead of a partition. Kafka hands a
//! partition's records over in offset order, so when one tenant's flood
//! fills a partition's read-ahead, another tenant's records behind it were
//! out of reach: the partition was paused until the flood's waiting records
//! fell to half, which at a model's pace takes minutes.
//!
//! Now a partition whose read-ahead is full goes on reading and passes over
//! the records of its full lanes (a lane with half the read-ahead or more
//! waiting): they are not received, so they cost no memory, and the records
//! of every other lane are received as usual. The first record passed over
//! holds the partition's commit point back (`OffsetTracker::hold`): nothing
//! at or after it is committed until it was read again and delivered. Once
//! the partition's waiting records fell to half, the consumer seeks back to
//! it and reads on from there, leaving out the records it already received
//! after it. A rebalance forgets all of this with the partition's
//! generation: the next owner reads on from the committed offset, which is
//! never past a record passed over.
//!
//! The records received behind a passed-over one are remembered until the
//! reading passes them again. A partition that read [`PASS_LIMIT`] times its
//! read-ahead past the first record it passed over pauses instead, so each
//! seek back reads a bounded stretch again and what is remembered is
//! bounded too. Another tenant's
//! records are therefore reached behind a flood of up to about nine
//! read-aheads per partition (2,048 each by default). The price is reading:
//! each seek back fetches the stretch passed over again, so a flood of one
//! lane that is deeper than the read-ahead is fetched up to `2 ×
//! PASS_LIMIT` times over (broker reads and header checks, no database
//! work).

use std::collections::{BTreeSet, HashMap};

use crate::domain::Lane;

/// How far past its first record passed over a partition reads on, in
/// multiples of its bound, before it pauses instead.
pub const PASS_LIMIT: usize = 8;

/// What to do with a record that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Receive it.
    Take,
    /// Pass it over: its lane is full.
    Pass,
    /// Leave it: received before the seek back, or fetched before it (and
    /// so read again from the offset sought to).
    Again,
}

/// What to do with a record that arrived, and where the partition's commit
/// point must now stay at or below, when that changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The record's fate.
    pub arrival: Arrival,
    /// `Some(hold)` when the hold changed: `Some(Some(offset))` holds the
    /// commit point at or below `offset`, `Some(None)` releases it.
    pub hold: Option<Option<i64>>,
}

/// The lanes of every partition a consumer reads, and where it passed over.
#[derive(Debug)]
pub struct Passing {
    /// Records of a partition that may wait before it passes over full lanes.
    bound: usize,
    /// Whether it passes over at all (otherwise every record is taken).
    enabled: bool,
    partitions: HashMap<i32, PartitionLanes>,
}

#[derive(Debug, Default)]
struct PartitionLanes {
    /// The partition's assignment generation this state belongs to.
    generation: u64,
    /// Waiting records per lane.
    waiting: HashMap<Lane, usize>,
    /// One past the last offset that arrived.
    position: i64,
    /// The lowest offset passed over since the last seek back: where the
    /// next one goes.
    rewind: Option<i64>,
    /// After a seek back, until the reading is back where it was.
    rereading: Option<Rereading>,
    /// Offsets received past one passed over: left out when read again,
    /// and forgotten once read again with nothing passed over before them.
    taken: BTreeSet<i64>,
    /// The hold last reported.
    hold: Option<i64>,
}

/// A partition read again after a seek back.
#[derive(Debug, Clone, Copy)]
struct Rereading {
    /// The offset sought back to.
    from: i64,
    /// One past the furthest offset read before: everything from the
    /// position up to it may be a record passed over, so the hold follows
    /// the position until it gets there.
    end: i64,
    /// Whether the record at `from` arrived. Until it does, what arrives
    /// was fetched before the seek (librdkafka drops such records, but this
    /// bookkeeping does not count on it): it lies at or past `from`, so the
    /// reading reaches it again, and it is left and moves nothing. (Taking
    /// it was tried: a stale record passed over moved the next seek back
    /// past records not yet read again.)
    resumed: bool,
}

impl PartitionLanes {
    /// Where the commit point must stay at or below: the first record
    /// passed over, and while reading again, the reading's position.
    fn hold(&self) -> Option<i64> {
        let rereading = (self.rereading).map(|r| if r.resumed { self.position } else { r.from });
        match (self.rewind, rereading) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The hold, if it changed since it was last reported.
    fn hold_change(&mut self) -> Option<Option<i64>> {
        let hold = self.hold();
        (hold != self.hold).then(|| {
            self.hold = hold;
            hold
        })
    }
}

impl Passing {
    /// Bookkeeping for a consumer whose partitions hold `bound` waiting
    /// records before they pass over full lanes, if `enabled`.
    pub fn new(bound: usize, enabled: bool) -> Self {
        Self {
            bound,
            enabled,
            partitions: HashMap::new(),
        }
    }

    /// A record of `lane` arrived at `offset` of `partition` (assignment
    /// `generation`), while `waiting` of the partition's records wait.
    pub fn arrive(
        &mut self,
        partition: i32,
        generation: u64,
        offset: i64,
        lane: Lane,
        waiting: usize,
    ) -> Verdict {
        if !self.enabled {
            let hold = None;
            return Verdict {
                arrival: Arrival::Take,
                hold,
            };
        }
        let state = self.partitions.entry(partition).or_default();
        if state.generation != generation {
            *state = PartitionLanes {
                generation,
                ..PartitionLanes::default()
            };
        }
        match &mut state.rereading {
            Some(again) if !again.resumed && offset != again.from => {
                return Verdict {
                    arrival: Arrival::Again,
                    hold: None,
                };
            }
            Some(again) if !again.resumed => {
                again.resumed = true;
                state.position = offset + 1;
            }
            _ => state.position = offset + 1,
        }
        if (state.rereading).is_some_and(|again| again.resumed && state.position >= again.end) {
            state.rereading = None;
        }
        let arrival = if state.taken.contains(&offset) {
            // Past a record passed over again, it is left out again at the
            // next seek back too.
            if state.rewind.is_none() {
                state.taken.remove(&offset);
            }
            Arrival::Again
        } else if waiting >= self.bound
            && state.waiting.get(&lane).copied().unwrap_or(0) >= self.bound.div_ceil(2)
        {
            state.rewind = Some(state.rewind.map_or(offset, |r| r.min(offset)));
            Arrival::Pass
        } else {
            *state.waiting.entry(lane).or_default() += 1;
            if state.rewind.is_some() {
                state.taken.insert(offset);
            }
            Arrival::Take
        };
        Verdict {
            arrival,
            hold: state.hold_change(),
        }
    }

    /// A waiting record of `lane` of `partition` started (or was dropped).
    pub fn left(&mut self, partition: i32, lane: Lane) {
        let Some(state) = self.partitions.get_mut(&partition) else {
            return;
        };
        if let Some(waiting) = state.waiting.get_mut(&lane) {
            *waiting -= 1;
            if *waiting == 0 {
                state.waiting.remove(&lane);
            }
        }
    }

    /// Where to seek `partition` (now in its assignment `generation`) back
    /// to, now that `waiting` of its records wait: the first record passed
    /// over, once no more than half the bound wait. The caller seeks, and
    /// says so with [`Passing::sought`]. State of another generation than
    /// the current one is dropped: a seek for an assignment that ended would
    /// move the new one's reading past records it must read.
    pub fn rewind_due(&mut self, partition: i32, generation: u64, waiting: usize) -> Option<i64> {
        let state = self.partitions.get(&partition)?;
        if state.generation != generation {
            self.partitions.remove(&partition);
            return None;
        }
        state.rewind.filter(|_| waiting <= self.bound / 2)
    }

    /// The consumer sought `partition` back to `offset`: it reads again
    /// from there up to where it was.
    pub fn sought(&mut self, partition: i32, offset: i64) {
        if let Some(state) = self.partitions.get_mut(&partition) {
            let end = state.rereading.map_or(0, |again| again.end);
            state.rereading = Some(Rereading {
                from: offset,
                end: end.max(state.position),
                resumed: false,
            });
            state.position = offset;
            state.rewind = None;
        }
    }

    /// Forgets `partition` (revoked): what it passed over is read by its
    /// next owner from the committed offset.
    pub fn forget(&mut self, partition: i32) {
        self.partitions.remove(&partition);
    }

    /// Whether `partition` must pause rather than read on: it has read
    /// [`PASS_LIMIT`] times the bound past the first record it passed over
    /// (each seek back reads that far again). This also bounds the records
    /// it remembers as received past one passed over: they lie in the same
    /// stretch, or in the one read before the seek, which the reading is
    /// going through again.
    pub fn must_pause(&self, partition: i32) -> bool {
        let Some(state) = self.partitions.get(&partition) else {
            return false;
        };
        let limit = (self.bound * PASS_LIMIT) as i64;
        state
            .rewind
            .is_some_and(|rewind| state.position - rewind > limit)
    }

    /// Partitions with records passed over and not sought back to yet.
    pub fn rewinding(&self) -> Vec<i32> {
        (self.partitions.iter())
            .filter(|(_, state)| state.rewind.is_some())
            .map(|(partition, _)| *partition)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;
    use uuid::Uuid;

    fn lane(n: u128) -> Lane {
        Lane::new(Uuid::from_u128(n), Priority::Normal)
    }

    fn verdict(arrival: Arrival, hold: Option<Option<i64>>) -> Verdict {
        Verdict { arrival, hold }
    }

    #[test]
    fn a_full_lane_is_passed_over_and_read_again_after_the_seek() {
        let (a, b) = (lane(1), lane(2));
        let mut passing = Passing::new(4, true);
        // A fills the read-ahead: offsets 0..4 are taken.
        for offset in 0..4 {
            let v = passing.arrive(0, 1, offset, a, offset as usize);
            assert_eq!(v, verdict(Arrival::Take, None));
        }
        // A's next is passed over and holds the point; the one after too,
        // without a new hold; B's is taken.
        assert_eq!(
            passing.arrive(0, 1, 4, a, 4),
            verdict(Arrival::Pass, Some(Some(4)))
        );
        assert_eq!(passing.arrive(0, 1, 5, a, 4), verdict(Arrival::Pass, None));
        assert_eq!(passing.arrive(0, 1, 6, b, 4), verdict(Arrival::Take, None));
        assert_eq!(passing.arrive(0, 1, 7, a, 5), verdict(Arrival::Pass, None));
        assert_eq!(passing.rewind_due(0, 1, 5), None, "still full");
        for _ in 0..3 {
            passing.left(0, a);
        }
        passing.left(0, b);
        assert_eq!(passing.rewind_due(0, 1, 2), Some(4));
        passing.sought(0, 4);
        assert_eq!(passing.rewind_due(0, 1, 2), None);
        // Read again: the hold follows the reading until it is back at 8,
        // 6 was received already.
        assert_eq!(
            passing.arrive(0, 1, 4, a, 1),
            verdict(Arrival::Take, Some(Some(5)))
        );
        assert_eq!(
            passing.arrive(0, 1, 5, a, 2),
            verdict(Arrival::Take, Some(Some(6)))
        );
        assert_eq!(
            passing.arrive(0, 1, 6, b, 3),
            verdict(Arrival::Again, Some(Some(7)))
        );
        assert_eq!(
            passing.arrive(0, 1, 7, a, 3),
            verdict(Arrival::Take, Some(None))
        );
        assert_eq!(passing.arrive(0, 1, 8, b, 4), verdict(Arrival::Take, None));
    }

    #[test]
    fn records_fetched_before_the_seek_move_neither_the_reading_nor_the_hold() {
        let a = lane(1);
        let mut passing = Passing::new(2, true);
        passing.arrive(0, 1, 0, a, 0);
        passing.arrive(0, 1, 1, a, 1);
        for offset in 2..10 {
            passing.arrive(0, 1, offset, a, 2);
        }
        passing.left(0, a);
        passing.left(0, a);
        passing.sought(0, 2);
        // 9 again, fetched before the seek: left, and the hold stays at 2.
        assert_eq!(passing.arrive(0, 1, 9, a, 0), verdict(Arrival::Again, None));
        assert_eq!(passing.arrive(0, 1, 2, a, 1).hold, Some(Some(3)));
        for offset in 3..9 {
            assert_eq!(
                passing.arrive(0, 1, offset, lane(offset as u128), 1).hold,
                Some(Some(offset + 1))
            );
        }
        assert_eq!(passing.arrive(0, 1, 9, lane(9), 1).hold, Some(None));
    }

    #[test]
    fn a_lane_full_again_while_reading_again_holds_at_its_first_pass() {
        let a = lane(1);
        let mut passing = Passing::new(2, true);
        passing.arrive(0, 1, 0, a, 0);
        passing.arrive(0, 1, 1, a, 1);
        for offset in 2..10 {
            passing.arrive(0, 1, offset, a, 2);
        }
        passing.left(0, a);
        passing.left(0, a);
        assert_eq!(passing.rewind_due(0, 1, 0), Some(2));
        passing.sought(0, 2);
        passing.arrive(0, 1, 2, a, 0);
        passing.arrive(0, 1, 3, a, 1);
        // Full again at 4: the hold stays at 4 while the reading goes on.
        assert_eq!(passing.arrive(0, 1, 4, a, 2), verdict(Arrival::Pass, None));
        assert_eq!(passing.arrive(0, 1, 5, a, 2).hold, None);
        for offset in 6..10 {
            passing.arrive(0, 1, offset, a, 2);
        }
        assert_eq!(passing.arrive(0, 1, 10, a, 2).hold, None, "still 4");
        assert_eq!(passing.rewind_due(0, 1, 1), Some(4));
    }

    #[test]
    fn a_record_received_is_left_out_at_every_seek_back_that_reads_it_again() {
        let (a, b) = (lane(1), lane(2));
        let mut passing = Passing::new(2, true);
        passing.arrive(0, 1, 0, a, 0);
        passing.arrive(0, 1, 1, a, 1);
        assert_eq!(passing.arrive(0, 1, 2, a, 2).arrival, Arrival::Pass);
        assert_eq!(passing.arrive(0, 1, 3, a, 2).arrival, Arrival::Pass);
        assert_eq!(passing.arrive(0, 1, 4, b, 2).arrival, Arrival::Take);
        passing.left(0, a);
        passing.left(0, a);
        passing.sought(0, 2);
        // Read again: 2 taken, A full again at 3, so B's 4 lies past a
        // record passed over a second time.
        assert_eq!(passing.arrive(0, 1, 2, a, 0).arrival, Arrival::Take);
        assert_eq!(passing.arrive(0, 1, 3, a, 2).arrival, Arrival::Pass);
        assert_eq!(passing.arrive(0, 1, 4, b, 2).arrival, Arrival::Again);
        passing.left(0, a);
        passing.sought(0, 3);
        assert_eq!(passing.arrive(0, 1, 3, a, 0).arrival, Arrival::Take);
        assert_eq!(passing.arrive(0, 1, 4, b, 1).arrival, Arrival::Again);
        // Read with nothing passed over before it: forgotten.
        assert_eq!(passing.arrive(0, 1, 5, b, 1).arrival, Arrival::Take);
    }

    #[test]
    fn a_new_generation_forgets_what_was_passed_over_and_taken() {
        let (a, b) = (lane(1), lane(2));
        let mut passing = Passing::new(2, true);
        passing.arrive(0, 1, 0, a, 0);
        passing.arrive(0, 1, 1, a, 1);
        assert_eq!(
            passing.arrive(0, 1, 2, a, 2),
            verdict(Arrival::Pass, Some(Some(2)))
        );
        assert_eq!(passing.arrive(0, 1, 3, b, 2), verdict(Arrival::Take, None));
        // Reassigned before the seek back: it must not happen (the new
        // assignment reads from the commit point, at 2 or before).
        assert_eq!(passing.rewind_due(0, 2, 0), None);
        assert!(passing.rewinding().is_empty());
        // And B's record at 3 must be received again.
        assert_eq!(passing.arrive(0, 2, 2, a, 0), verdict(Arrival::Take, None));
        assert_eq!(passing.arrive(0, 2, 3, b, 1), verdict(Arrival::Take, None));
    }

    #[test]
    fn a_consumer_that_does_not_pass_over_takes_every_record() {
        let mut passing = Passing::new(2, false);
        for offset in 0..10 {
            let v = passing.arrive(0, 1, offset, lane(1), offset as usize);
            assert_eq!(v, verdict(Arrival::Take, None));
        }
        assert!(passing.rewinding().is_empty());
    }

    #[test]
    fn no_lane_is_full_while_the_waiting_records_are_spread() {
        let mut passing = Passing::new(4, true);
        for (offset, n) in [1, 2, 3, 4, 5, 6].into_iter().enumerate() {
            let v = passing.arrive(0, 1, offset as i64, lane(n), offset);
            assert_eq!(v, verdict(Arrival::Take, None), "lane {n}");
        }
    }

    #[test]
    fn a_partition_passes_over_no_further_than_the_limit() {
        let a = lane(1);
        let mut passing = Passing::new(2, true);
        passing.arrive(0, 1, 0, a, 0);
        passing.arrive(0, 1, 1, a, 1);
        let limit = (2 * PASS_LIMIT) as i64;
        for offset in 2..2 + limit {
            assert_eq!(passing.arrive(0, 1, offset, a, 2).arrival, Arrival::Pass);
            assert!(!passing.must_pause(0), "at {offset}");
        }
        passing.arrive(0, 1, 2 + limit, a, 2);
        assert!(passing.must_pause(0));
        assert_eq!(passing.rewinding(), vec![0]);
    }
}
