//! The record handler of a stream's consumer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::events::{decode, ExtractionEvent};
use crate::kafka::{HandlerError, Record, RecordHandler};

use super::order::Line;
use super::query::Filter;
use super::queue::{Offered, Outbound, Outgoing};

/// The record handler of a stream's consumer: an event is delivered when the
/// client acknowledged it.
pub(super) struct Exporter {
    outbound: Arc<Outbound>,
    line: Line,
    filter: Filter,
    /// Set when the stream's own shutdown began: from then on a stopped
    /// record drains instead of giving up.
    draining: Arc<AtomicBool>,
}

impl Exporter {
    /// The handler of a stream whose events go to `outbound`.
    pub(super) fn new(outbound: Arc<Outbound>, filter: Filter, draining: Arc<AtomicBool>) -> Self {
        Self {
            outbound,
            line: Line::default(),
            filter,
            draining,
        }
    }
}

impl RecordHandler for Exporter {
    fn starting(&self, record: &Record) {
        self.line.join(record.partition, record.offset);
    }

    async fn handle(&self, record: &Record, stop: &CancellationToken) -> Result<(), HandlerError> {
        let place = self.line.place(record.partition, record.offset);
        let payload = record.payload.as_deref().unwrap_or_default();
        let event: ExtractionEvent = decode(payload)?;
        if !self.filter.admits(&event) {
            return Ok(());
        }
        let (done, received) = oneshot::channel();
        let item = Outgoing {
            partition: record.partition,
            offset: record.offset,
            event,
            done,
        };
        // Waiting for its turn or for room is given up when the partition is
        // revoked (another connection of the group takes it over; this
        // member forgot it), but not when the stream's own shutdown stopped
        // the consumer: then what is in flight drains. Once queued, the event
        // waits for the client: on a revoke, the drain lets it be
        // acknowledged; when the client is gone, closing the queue abandons it.
        let entered = async {
            place.turn().await;
            self.outbound.offer(item).await
        };
        let offered = tokio::select! {
            offered = entered => offered,
            _ = revoked(stop, &self.draining) => {
                return Err(HandlerError::Abandoned("partition revoked".into()));
            }
        };
        drop(place);
        let gone = || HandlerError::Abandoned("the export client is gone".into());
        match offered {
            Offered::Queued => received.await.map_err(|_| gone()),
            Offered::Dropped => Ok(()),
            Offered::Closed => Err(gone()),
        }
    }
}

/// Fires when `stop` does, unless the stream is draining.
async fn revoked(stop: &CancellationToken, draining: &AtomicBool) {
    stop.cancelled().await;
    if draining.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
}
