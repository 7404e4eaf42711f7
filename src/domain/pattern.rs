//! Field patterns: what a valid one is (size-limited), compiled once per
//! process. Jobs of one template repeat the same few patterns, and compiling a
//! regex costs far more than running it on a page, so compiled patterns are
//! kept in a small bounded cache shared by submit-time validation and the
//! extractor.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use regex::{Regex, RegexBuilder};

/// Most compiled patterns kept; the cache starts over when it is full.
const CACHED: usize = 256;

/// Most memory one compiled pattern may take.
const SIZE_LIMIT: usize = 1 << 20;

static COMPILED: LazyLock<Mutex<HashMap<String, Arc<Regex>>>> = LazyLock::new(Mutex::default);

/// `pattern` compiled, from the cache when it was seen before. Shared, not
/// cloned: a cloned `Regex` starts with empty search caches, which would throw
/// away the lazy DFA states the previous searches built.
pub fn compile(pattern: &str) -> Result<Arc<Regex>, regex::Error> {
    if let Some(regex) = lock().get(pattern) {
        return Ok(regex.clone());
    }
    let regex = Arc::new(RegexBuilder::new(pattern).size_limit(SIZE_LIMIT).build()?);
    let mut cache = lock();
    if cache.len() >= CACHED {
        cache.clear();
    }
    cache.insert(pattern.to_owned(), regex.clone());
    Ok(regex)
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<String, Arc<Regex>>> {
    COMPILED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_once_and_refuses_what_does_not_compile() {
        let first = compile(r"\d{4}-\d{2}").unwrap();
        let again = compile(r"\d{4}-\d{2}").unwrap();
        assert!(again.is_match("2026-11"));
        assert!(Arc::ptr_eq(&first, &again));
        assert!(compile("(unclosed").is_err());
        assert!(compile(r"\w{1000}{1000}").is_err(), "over the size limit");
    }
}
