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

/// Compiled patterns by their program limit and text.
type Cache = HashMap<(usize, String), Arc<Regex>>;

static COMPILED: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);

/// `pattern` compiled with at most `program_bytes` of program and as much
/// lazy-DFA cache (`DOCSTREAM_MAX_PATTERN_PROGRAM_BYTES`), from the cache when
/// it was seen before. Shared, not cloned: a cloned `Regex` starts with empty
/// search caches, which would throw away the lazy DFA states the previous
/// searches built. The regex crate's matching time is linear in the text, so
/// with its program bounded no pattern can take exponential time.
pub fn compile(pattern: &str, program_bytes: usize) -> Result<Arc<Regex>, regex::Error> {
    let key = (program_bytes, pattern.to_owned());
    if let Some(regex) = lock().get(&key) {
        return Ok(regex.clone());
    }
    let regex = RegexBuilder::new(pattern)
        .size_limit(program_bytes)
        .dfa_size_limit(program_bytes)
        .build()?;
    let regex = Arc::new(regex);
    let mut cache = lock();
    if cache.len() >= CACHED {
        cache.clear();
    }
    cache.insert(key, regex.clone());
    Ok(regex)
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    COMPILED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_once_and_refuses_what_does_not_compile() {
        let first = compile(r"\d{4}-\d{2}", 1 << 20).unwrap();
        let again = compile(r"\d{4}-\d{2}", 1 << 20).unwrap();
        assert!(again.is_match("2026-11"));
        assert!(Arc::ptr_eq(&first, &again));
        assert!(compile("(unclosed", 1 << 20).is_err());
        assert!(
            compile(r"\w{1000}", 1 << 20).is_err(),
            "over the size limit"
        );
        assert!(compile(r"\w{10}", 1 << 20).is_ok());
    }
}
