//! Each partition's events in offset order on their way into the queue.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Keeps each partition's events in offset order on their way into the
/// queue: the consumer starts a partition's records in order, but their tasks
/// run concurrently, and a client reads a job's events in the order they
/// happened (a job's events share a key, hence a partition).
#[derive(Default)]
pub(super) struct Line {
    partitions: Mutex<HashMap<i32, Waiting>>,
}

/// A partition's records in line: offset, and how to wake the record.
type Waiting = VecDeque<(i64, Arc<Notify>)>;

impl Line {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Waiting>> {
        self.partitions.lock().expect("export line lock")
    }

    /// The place of the record at `offset` of `partition`, which
    /// [`Line::join`] put in line.
    pub(super) fn place(&self, partition: i32, offset: i64) -> Place<'_> {
        Place {
            line: self,
            partition,
            offset,
        }
    }

    /// Puts the record at `offset` of `partition` in line, behind the
    /// partition's earlier records.
    pub(super) fn join(&self, partition: i32, offset: i64) {
        let mut partitions = self.lock();
        let line = partitions.entry(partition).or_default();
        line.push_back((offset, Arc::new(Notify::new())));
    }
}

/// A record's place in its partition's line; leaving (on drop) lets the next
/// record go.
pub(super) struct Place<'a> {
    line: &'a Line,
    partition: i32,
    offset: i64,
}

impl Place<'_> {
    /// Waits until every earlier record of the partition has left the line.
    pub(super) async fn turn(&self) {
        loop {
            let wake = {
                let partitions = self.line.lock();
                let Some(line) = partitions.get(&self.partition) else {
                    return;
                };
                match line.iter().position(|(o, _)| *o == self.offset) {
                    Some(0) | None => return,
                    Some(i) => line[i].1.clone(),
                }
            };
            wake.notified().await;
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut partitions = self.line.lock();
        let Some(line) = partitions.get_mut(&self.partition) else {
            return;
        };
        if let Some(i) = line.iter().position(|(o, _)| *o == self.offset) {
            line.remove(i);
            if let (0, Some((_, next))) = (i, line.front()) {
                next.notify_one();
            }
        }
        if line.is_empty() {
            partitions.remove(&self.partition);
        }
    }
}
