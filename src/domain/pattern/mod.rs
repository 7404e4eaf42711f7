//! Field patterns: what a valid one is (size-limited), compiled once per
//! process. Jobs of one template repeat the same few patterns, and compiling a
//! regex costs far more than running it on a page, so compiled patterns are
//! kept in a bounded cache shared by submit-time validation and the
//! extractor. Refusals are kept too: a client that resends a pattern that
//! does not compile (or outgrows its program limit) costs one compile, not
//! one per request.
//!
//! Compiling is CPU work of up to milliseconds a pattern, and a request may
//! carry a hundred. An intake that meets patterns it has not seen calls
//! [`learn`] on a blocking thread first (see `Services::learn_patterns`), so
//! the validation that follows, on the async runtime, finds each one here.

mod search;

pub use search::{Found, Interrupted};

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use regex::{Regex, RegexBuilder};

/// Most patterns kept (compiled or refused); the cache starts over when it
/// is full. Room for ten requests of a hundred new patterns each.
const CACHED: usize = 1024;

/// What compiling a pattern gave: the pattern, or the compiler's refusal.
type Compiled = Result<Arc<Pattern>, regex::Error>;

/// A compiled field pattern: the regex crate's `Regex` (which decides what
/// compiles, and searches short texts), and the engines of a search that
/// can be stopped ([`Pattern::captures`]).
#[derive(Debug)]
pub struct Pattern {
    regex: Regex,
    /// `None` only if they would not build where the `Regex` did; searches
    /// then cannot be stopped.
    engines: Option<search::Engines>,
}

impl Pattern {
    fn new(pattern: &str, program_bytes: usize) -> Result<Self, regex::Error> {
        let regex = RegexBuilder::new(pattern)
            .size_limit(program_bytes)
            .dfa_size_limit(program_bytes)
            .build()?;
        let engines = search::Engines::new(pattern, program_bytes)
            .inspect_err(
                |e| tracing::warn!(pattern, error = %e, "a pattern's search cannot be stopped"),
            )
            .ok();
        Ok(Self { regex, engines })
    }

    /// The first match at or after `start` (a char boundary), with group 1,
    /// as `Regex::captures_at` finds it; `keep_going` is asked as the search
    /// goes over a long text, and the search ends when it says no.
    pub fn captures(
        &self,
        text: &str,
        start: usize,
        keep_going: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Found>, Interrupted> {
        match &self.engines {
            Some(engines) => search::captures(&self.regex, engines, text, start, keep_going),
            None => Ok(search::captured(&self.regex, text, start)),
        }
    }

    /// Whether `text` matches anywhere (for tests and tools).
    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

/// Compiled patterns by their program limit, then their text (looked up by
/// `&str`, with no key to allocate).
type Cache = HashMap<usize, HashMap<String, Compiled>>;

static COMPILED: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);

/// `pattern` compiled with at most `program_bytes` of program and as much
/// lazy-DFA cache (`DOCSTREAM_MAX_PATTERN_PROGRAM_BYTES`), from the cache when
/// it was seen before. Shared, not cloned: a cloned `Regex` starts with empty
/// search caches, which would throw away the lazy DFA states the previous
/// searches built. The regex crate's matching time is linear in the text, so
/// with its program bounded no pattern can take exponential time; and a
/// search over a long text can be stopped at its deadline ([`Pattern::captures`]).
pub fn compile(pattern: &str, program_bytes: usize) -> Compiled {
    if let Some(compiled) = lock().get(&program_bytes).and_then(|c| c.get(pattern)) {
        return compiled.clone();
    }
    let compiled = Pattern::new(pattern, program_bytes).map(Arc::new);
    let mut cache = lock();
    let cache = cache.entry(program_bytes).or_default();
    if cache.len() >= CACHED {
        cache.clear();
    }
    cache.insert(pattern.to_owned(), compiled.clone());
    compiled
}

/// Whether `pattern` was compiled (or refused) before with this limit.
pub fn known(pattern: &str, program_bytes: usize) -> bool {
    lock()
        .get(&program_bytes)
        .is_some_and(|c| c.contains_key(pattern))
}

/// Compiles each of `patterns` not seen before, keeping what it gives,
/// up to the first that does not compile (validation stops at it too).
/// Blocking: milliseconds a pattern, so run it off the async runtime.
pub fn learn(patterns: &[String], program_bytes: usize) {
    for pattern in patterns {
        if compile(pattern, program_bytes).is_err() {
            return;
        }
    }
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

    #[test]
    fn a_refusal_is_kept_like_a_regex() {
        let pattern = r"(refused-\w{1000}";
        assert!(!known(pattern, 1 << 20));
        let after = r"\d{3}-after-a-refusal";
        learn(&[pattern.to_owned(), after.to_owned()], 1 << 20);
        assert!(
            known(pattern, 1 << 20),
            "learned, though it does not compile"
        );
        assert!(!known(after, 1 << 20), "validation never gets that far");
        assert!(compile(pattern, 1 << 20).is_err());
        assert!(!known(pattern, 1 << 19), "per program limit");
    }
}
