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
//! [`learn`] on a blocking thread first (see `Submitter::learn_patterns`), so
//! the validation that follows, on the async runtime, finds each one here.

mod search;

pub use search::{Found, Interrupted};

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use regex::{Regex, RegexBuilder};

/// Patterns kept (compiled or refused) in each of the cache's two
/// generations: room for ten requests of a hundred new patterns each.
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

/// Compiled patterns of one program limit, looked up by `&str` (no key to
/// allocate), in two generations. New patterns go into `recent`; when it is
/// full it becomes `older` and the one before is dropped, and a pattern found
/// in `older` moves back to `recent`. So a pattern stays for at least
/// [`CACHED`] insertions after it came in or moved back: a request's patterns,
/// learned on a blocking thread just before its validation, are still there
/// when the validation looks, however many other requests' new patterns
/// came in between (a cache emptied whole when full could drop them, and
/// the validation then compiled them all on the async runtime).
#[derive(Default)]
struct Generations {
    recent: HashMap<String, Compiled>,
    older: HashMap<String, Compiled>,
}

impl Generations {
    fn get(&mut self, pattern: &str) -> Option<Compiled> {
        if let Some(compiled) = self.recent.get(pattern) {
            return Some(compiled.clone());
        }
        let (pattern, compiled) = self.older.remove_entry(pattern)?;
        self.insert(pattern, compiled.clone());
        Some(compiled)
    }

    fn insert(&mut self, pattern: String, compiled: Compiled) {
        if self.recent.len() >= CACHED {
            self.older = std::mem::take(&mut self.recent);
        }
        self.recent.insert(pattern, compiled);
    }

    fn contains(&self, pattern: &str) -> bool {
        self.recent.contains_key(pattern) || self.older.contains_key(pattern)
    }
}

/// The caches by program limit.
type Cache = HashMap<usize, Generations>;

static COMPILED: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);

/// `pattern` compiled with at most `program_bytes` of program and as much
/// lazy-DFA cache (`DOCSTREAM_MAX_PATTERN_PROGRAM_BYTES`), from the cache when
/// it was seen before. Shared, not cloned: a cloned `Regex` starts with empty
/// search caches, which would throw away the lazy DFA states the previous
/// searches built. The regex crate's matching time is linear in the text, so
/// with its program bounded no pattern can take exponential time; and a
/// search over a long text can be stopped at its deadline ([`Pattern::captures`]).
pub fn compile(pattern: &str, program_bytes: usize) -> Compiled {
    if let Some(compiled) = lock().get_mut(&program_bytes).and_then(|c| c.get(pattern)) {
        return compiled;
    }
    let compiled = Pattern::new(pattern, program_bytes).map(Arc::new);
    (lock().entry(program_bytes).or_default()).insert(pattern.to_owned(), compiled.clone());
    compiled
}

/// Whether `pattern` was compiled (or refused) before with this limit.
pub fn known(pattern: &str, program_bytes: usize) -> bool {
    lock()
        .get(&program_bytes)
        .is_some_and(|c| c.contains(pattern))
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
    fn a_pattern_stays_a_generation_after_it_came_in_or_was_used_from_the_older() {
        let limit = 1 << 18;
        let first = r"first-\d+";
        compile(first, limit).unwrap();
        for n in 0..CACHED {
            compile(&format!("filler-a-{n}"), limit).unwrap();
        }
        assert!(known(first, limit), "one generation of insertions later");
        // Used again: back among the recent, past the next turnover.
        compile(first, limit).unwrap();
        for n in 0..CACHED {
            compile(&format!("filler-b-{n}"), limit).unwrap();
        }
        assert!(known(first, limit), "a use keeps it");
        for n in 0..2 * CACHED + 1 {
            compile(&format!("filler-c-{n}"), limit).unwrap();
        }
        assert!(!known(first, limit), "two generations unused: dropped");
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
