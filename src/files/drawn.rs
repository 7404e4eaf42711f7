//! Pages drawn for people (`GET /v1/extractions/{id}/pages/{page}`, the
//! console), bounded as the work behind them is:
//!
//! - a PDF page is rendered by poppler in a child process of its own
//!   ([`super::child`]) under OCR's memory and time caps, at
//!   [`DRAWN_DPI`] or lower, so that it stays within the pixel cap OCR
//!   reads pages under (`DOCSTREAM_OCR_MAX_PIXELS`), counted from the page's
//!   media box;
//! - at most `DOCSTREAM_RENDER_SLOTS` renders run at once in one `serve`
//!   process; a request past them is refused at once (503, `Retry-After`),
//!   not queued, so a burst of them costs nothing but their answers;
//! - a render runs on a task of its own, holding its slot: a request that
//!   stops waiting (the answer bound passed, the client left) does not
//!   waste the work, whose page is kept by content and page in a cache of
//!   at most `DOCSTREAM_RENDER_CACHE_BYTES`, where the retry finds it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use super::FileError;

/// The resolution a PDF page is drawn at for people: sharp enough on a
/// screen, a fraction of OCR's pixels.
pub const DRAWN_DPI: f64 = 100.0;

/// A drawn page: whose file (its tenant, its SHA-256), which page.
pub type Key = (Uuid, String, usize);

/// The renders of one process: its slots and the pages they drew.
pub struct Drawings {
    slots: Arc<Semaphore>,
    cache: Mutex<Cache>,
}

impl Drawings {
    /// `slots` renders at once, and a cache of at most `cache_bytes`.
    pub fn new(slots: usize, cache_bytes: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(slots)),
            cache: Mutex::new(Cache {
                limit: cache_bytes,
                ..Cache::default()
            }),
        }
    }

    /// A slot to render in, or [`FileError::Busy`] when every one is taken.
    pub fn slot(&self) -> Result<OwnedSemaphorePermit, FileError> {
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| FileError::Busy)
    }

    /// The page `key` if it was drawn and is still kept.
    pub fn cached(&self, key: &Key) -> Option<Bytes> {
        self.lock().pages.get(key).cloned()
    }

    /// Keeps the page `key`, drawn as `png`, dropping the oldest kept pages
    /// for room; one larger than the whole cache is not kept.
    pub fn keep(&self, key: Key, png: Bytes) {
        self.lock().keep(key, png);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding it leaves a map and a queue, never half an entry.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Pages kept, oldest first out.
#[derive(Default)]
struct Cache {
    pages: HashMap<Key, Bytes>,
    order: VecDeque<Key>,
    bytes: usize,
    limit: usize,
}

impl Cache {
    fn keep(&mut self, key: Key, png: Bytes) {
        if png.len() > self.limit || self.pages.contains_key(&key) {
            return;
        }
        while self.bytes + png.len() > self.limit {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.pages.remove(&oldest) {
                self.bytes -= gone.len();
            }
        }
        self.bytes += png.len();
        self.order.push_back(key.clone());
        self.pages.insert(key, png);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(page: usize) -> Key {
        (Uuid::nil(), "ab".repeat(32), page)
    }

    #[test]
    fn the_cache_keeps_the_newest_pages_within_its_bytes() {
        let drawings = Drawings::new(1, 10);
        drawings.keep(key(0), Bytes::from_static(b"aaaa"));
        drawings.keep(key(1), Bytes::from_static(b"bbbb"));
        drawings.keep(key(2), Bytes::from_static(b"cccc"));
        assert_eq!(drawings.cached(&key(0)), None);
        assert_eq!(drawings.cached(&key(2)).as_deref(), Some(&b"cccc"[..]));
        drawings.keep(key(3), Bytes::from(vec![0; 11]));
        assert_eq!(drawings.cached(&key(3)), None, "larger than the cache");
        assert!(drawings.lock().bytes <= 10);
    }

    #[test]
    fn past_its_slots_a_render_is_refused_at_once() {
        let drawings = Drawings::new(2, 0);
        let first = drawings.slot().unwrap();
        let _second = drawings.slot().unwrap();
        assert!(matches!(drawings.slot(), Err(FileError::Busy)));
        drop(first);
        assert!(drawings.slot().is_ok());
    }
}
