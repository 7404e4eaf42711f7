//! The queue between a stream's consumer (many record handlers) and its
//! socket (one writer), bounded by the backpressure strategy.

use std::collections::VecDeque;
use std::sync::Mutex;

use prometheus::{IntCounter, IntGauge};
use tokio::sync::{oneshot, Notify};

use crate::config::Backpressure;
use crate::events::ExtractionEvent;
use crate::metrics::Metrics;

use super::STREAM;

/// An event waiting for the socket; `done` tells its record's handler that
/// the client has it (or that it was dropped by the strategy).
pub(super) struct Outgoing {
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) event: ExtractionEvent,
    pub(super) done: oneshot::Sender<()>,
}

/// The queue between the stream's consumer (many record handlers) and its
/// socket (one writer), bounded by the backpressure strategy.
pub(super) struct Outbound {
    queue: Mutex<Queue>,
    /// An event entered the queue.
    ready: Notify,
    /// An event left the queue.
    room: Notify,
    strategy: Backpressure,
    capacity: usize,
    depth: IntGauge,
    dropped: IntCounter,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Outgoing>,
    closed: bool,
}

pub(super) enum Offered {
    Queued,
    Dropped,
    Closed,
}

impl Outbound {
    /// A queue of at most `capacity` events.
    pub(super) fn new(capacity: usize, metrics: &Metrics, strategy: Backpressure) -> Self {
        Outbound {
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
            room: Notify::new(),
            strategy,
            capacity,
            depth: metrics.streams.queue_depth.with_label_values(&[STREAM]),
            dropped: metrics
                .streams
                .dropped
                .with_label_values(&[STREAM, strategy.as_str()]),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("export queue lock")
    }

    /// Queues `item` per the strategy; with `block`, waits for room.
    pub(super) async fn offer(&self, item: Outgoing) -> Offered {
        let mut item = Some(item);
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut queue = self.lock();
                if queue.closed {
                    return Offered::Closed;
                }
                if queue.items.len() >= self.capacity {
                    match self.strategy {
                        Backpressure::Block => {}
                        Backpressure::DropNew => {
                            self.dropped.inc();
                            return Offered::Dropped;
                        }
                        Backpressure::DropOldest => {
                            if let Some(oldest) = queue.items.pop_front() {
                                // Decided, not lost: its record is committed.
                                let _ = oldest.done.send(());
                                self.dropped.inc();
                                self.depth.dec();
                            }
                        }
                    }
                }
                if queue.items.len() < self.capacity {
                    queue.items.push_back(item.take().expect("offered once"));
                    self.depth.inc();
                    self.ready.notify_one();
                    return Offered::Queued;
                }
            }
            room.await;
        }
    }

    /// The next queued event; waits for one. Cancel-safe.
    pub(super) async fn next(&self) -> Outgoing {
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(item) = self.lock().items.pop_front() {
                self.depth.dec();
                self.room.notify_waiters();
                return item;
            }
            ready.await;
        }
    }

    /// Refuses further events and forgets the queued ones: their handlers see
    /// their record abandoned, so it is not committed.
    pub(super) fn close(&self) {
        let mut queue = self.lock();
        queue.closed = true;
        self.depth.sub(queue.items.len() as i64);
        queue.items.clear();
        self.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    fn outbound(strategy: Backpressure, capacity: usize) -> Outbound {
        Outbound {
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
            room: Notify::new(),
            strategy,
            capacity,
            depth: IntGauge::new("depth", "test").unwrap(),
            dropped: IntCounter::new("dropped", "test").unwrap(),
        }
    }

    fn item(offset: i64) -> (Outgoing, oneshot::Receiver<()>) {
        let (done, received) = oneshot::channel();
        let event = super::super::running_event(&offset.to_string());
        let outgoing = Outgoing {
            partition: 0,
            offset,
            event,
            done,
        };
        (outgoing, received)
    }

    #[tokio::test]
    async fn a_full_queue_drops_per_strategy_and_blocks_otherwise() {
        let drop_new = outbound(Backpressure::DropNew, 1);
        assert!(matches!(drop_new.offer(item(1).0).await, Offered::Queued));
        assert!(matches!(drop_new.offer(item(2).0).await, Offered::Dropped));
        assert_eq!((drop_new.dropped.get(), drop_new.depth.get()), (1, 1));
        assert_eq!(drop_new.next().await.offset, 1);

        let drop_oldest = outbound(Backpressure::DropOldest, 1);
        let (first, mut first_done) = item(1);
        assert!(matches!(drop_oldest.offer(first).await, Offered::Queued));
        assert!(matches!(
            drop_oldest.offer(item(2).0).await,
            Offered::Queued
        ));
        assert_eq!(
            first_done.try_recv(),
            Ok(()),
            "the evicted event counts as decided"
        );
        assert_eq!(drop_oldest.dropped.get(), 1);
        assert_eq!(drop_oldest.next().await.offset, 2);

        let block = Arc::new(outbound(Backpressure::Block, 1));
        assert!(matches!(block.offer(item(1).0).await, Offered::Queued));
        let waiting = tokio::spawn({
            let block = block.clone();
            async move { matches!(block.offer(item(2).0).await, Offered::Queued) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "block waits for room");
        assert_eq!(block.next().await.offset, 1);
        assert!(waiting.await.unwrap(), "room made, the event is queued");
        assert_eq!(block.dropped.get(), 0);
        block.close();
        assert!(matches!(block.offer(item(3).0).await, Offered::Closed));
    }
}
