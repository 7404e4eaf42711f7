//! The caps on WebSocket streams: sockets per process (`max_sockets`), per
//! tenant (`max_sockets_per_tenant`), and export streams per process
//! (`max_export_streams`: each is a Kafka consumer with its own threads and
//! prefetch) and per tenant (`max_export_streams_per_tenant`, so that no
//! tenant holds them all). A stream takes its slots before the upgrade, so one past a cap
//! gets a clear HTTP answer instead of a socket that closes at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use super::ApiError;
use crate::config::Settings;

/// The caps of one `serve` process.
#[derive(Debug, Clone)]
pub struct Sockets {
    all: Arc<Semaphore>,
    exports: Arc<Semaphore>,
    per_tenant: Arc<Mutex<HashMap<Uuid, Held>>>,
    caps: [usize; 4],
}

/// What one tenant holds: its streams, and how many of them export.
#[derive(Debug, Default)]
struct Held {
    sockets: usize,
    exports: usize,
}

/// The slots one open stream holds; dropping it frees them.
#[derive(Debug)]
pub struct Slot {
    _socket: OwnedSemaphorePermit,
    _export: Option<OwnedSemaphorePermit>,
    tenant: Uuid,
    per_tenant: Arc<Mutex<HashMap<Uuid, Held>>>,
}

/// Which kind of stream asks for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `/v1/import`.
    Import,
    /// `/v1/export`.
    Export,
}

impl Sockets {
    /// The caps in `settings`.
    pub fn new(settings: &Settings) -> Self {
        Self {
            all: Arc::new(Semaphore::new(settings.max_sockets)),
            exports: Arc::new(Semaphore::new(settings.max_export_streams)),
            per_tenant: Arc::default(),
            caps: [
                settings.max_sockets,
                settings.max_export_streams,
                settings.max_sockets_per_tenant,
                settings.max_export_streams_per_tenant,
            ],
        }
    }

    /// Slots for a `stream` of `tenant`: 503 when the process is at a cap,
    /// 429 when the tenant is.
    pub fn take(&self, tenant: Uuid, stream: Stream) -> Result<Slot, ApiError> {
        let [all_cap, export_cap, tenant_cap, tenant_export_cap] = self.caps;
        let full = |what: &str, cap: usize| {
            ApiError::Unavailable(format!(
                "this server holds its most {what} ({cap}); retry shortly"
            ))
        };
        let socket = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| full("WebSocket streams", all_cap))?;
        let export = match stream {
            Stream::Import => None,
            Stream::Export => Some(
                self.exports
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| full("export streams", export_cap))?,
            ),
        };
        let mut held = self.per_tenant.lock().expect("socket counts lock");
        let count = held.entry(tenant).or_default();
        let at_cap = |what: &str, cap: usize| ApiError::TooManyRequests {
            message: format!(
                "the tenant holds its most {what} on this server ({cap}); close one first"
            ),
            retry_after_s: 1,
        };
        if count.sockets >= tenant_cap {
            return Err(at_cap("WebSocket streams", tenant_cap));
        }
        if export.is_some() && count.exports >= tenant_export_cap {
            return Err(at_cap("export streams", tenant_export_cap));
        }
        count.sockets += 1;
        count.exports += usize::from(export.is_some());
        Ok(Slot {
            _socket: socket,
            _export: export,
            tenant,
            per_tenant: self.per_tenant.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.per_tenant.lock().expect("socket counts lock");
        if let Some(count) = held.get_mut(&self.tenant) {
            count.sockets -= 1;
            count.exports -= usize::from(self._export.is_some());
            if count.sockets == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_tenant_holds_every_export_stream() {
        let settings = Settings {
            max_export_streams: 4,
            max_export_streams_per_tenant: 2,
            ..Settings::default()
        };
        let sockets = Sockets::new(&settings);
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let held: Vec<Slot> = (0..2)
            .map(|_| sockets.take(a, Stream::Export).unwrap())
            .collect();
        let third = sockets.take(a, Stream::Export).unwrap_err();
        assert_eq!(third.status_and_code().0.as_u16(), 429, "{third:?}");
        let import = sockets
            .take(a, Stream::Import)
            .expect("an import is no export");
        let other = sockets
            .take(b, Stream::Export)
            .expect("another tenant's export");
        drop(held);
        let again = sockets
            .take(a, Stream::Export)
            .expect("freed when its streams end");
        drop((import, other, again));
        assert!(sockets.per_tenant.lock().unwrap().is_empty());
    }
}
