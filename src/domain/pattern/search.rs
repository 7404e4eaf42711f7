//! A pattern's search that can be stopped. The regex crate's matching time is
//! linear in the text, but the factor is the program's size when its lazy DFA
//! cannot run (a Unicode `\b` before a non-ASCII byte makes it quit; a
//! pattern whose states thrash its cache makes it give up) and the search
//! falls back to the PikeVM: `\b(?s:.){0,1041}\p{Greek}`, within the 1 MiB
//! program limit, took 33 s over 4 MiB of text in one `captures_at` call,
//! far past any deadline, which is checked only between searches. Such a
//! search held a CPU-pool thread, and a few such jobs held them all.
//!
//! [`captures`] gives what `Regex::captures_at` gives (the whole match and
//! group 1, leftmost-first) but asks `keep_going` at least every 64 KiB of
//! text, every 64 lazy-DFA states it builds and every 2^19 PikeVM steps
//! (5-10 ms), and stops when told. It finds the match's end by driving the
//! lazy DFA a byte at a time, its start with the reverse DFA (as the regex
//! crate does), and group 1 within the match; when the DFA quits or gives
//! up, a PikeVM of its own (groups 0 and 1 only, the crate's priorities)
//! takes over, metered too. A text of at most [`SHORT`] bytes past the start
//! is searched by the regex crate itself, unmetered: that costs at most
//! ~0.1 s with the worst pattern, and leaves the usual small document
//! exactly as fast as before.
//!
//! Checked against `captures_at` on random patterns (look-arounds, Unicode
//! and ASCII word boundaries, anchors, lazy and bounded repeats, case
//! folding) over random Unicode texts from random starts, with and without
//! the DFA: see the tests.

use std::ops::Range;
use std::sync::Mutex;

use regex::Regex;
use regex_automata::hybrid::dfa::{Cache as DfaCache, DFA};
use regex_automata::nfa::thompson::{self, State, WhichCaptures, NFA};
use regex_automata::util::primitives::{NonMaxUsize, StateID};
use regex_automata::{meta, Anchored, Input, MatchKind, PatternID};

/// Text (bytes past the start) short enough for the regex crate's own search.
pub const SHORT: usize = 16 * 1024;
/// Text scanned between two questions.
const CHUNK: usize = 64 * 1024;
/// Lazy-DFA states built between two questions (each costs up to the program's size).
const BUILT: usize = 64;
/// PikeVM steps (a thread at a byte) between two questions.
const STEPS: usize = 1 << 19;
/// No position.
const NONE: usize = usize::MAX;

/// The search was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted;

/// A match: the whole of it, and group 1 when the pattern has one and it
/// took part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Group 0.
    pub whole: Range<usize>,
    /// Group 1.
    pub group1: Option<Range<usize>>,
}

/// What a pattern is searched with, beside its `Regex`: a meta regex (for
/// group 1 within a short match), the NFA with its captures, and the forward
/// and reverse lazy DFAs (`None` if they cannot be built: the PikeVM then
/// does all the work). Shared by every thread; the scratch space is pooled.
pub struct Engines {
    meta: meta::Regex,
    nfa: NFA,
    dfas: Option<(DFA, DFA)>,
    has_group1: bool,
    scratch: Mutex<Vec<Scratch>>,
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engines")
            .field("nfa_states", &self.nfa.states().len())
            .finish_non_exhaustive()
    }
}

impl Engines {
    /// The engines of `pattern`, configured as `RegexBuilder` configures
    /// the regex crate's with `size_limit` and `dfa_size_limit` both
    /// `program_bytes`.
    pub fn new(pattern: &str, program_bytes: usize) -> Result<Self, String> {
        let config = meta::Config::new()
            .nfa_size_limit(Some(program_bytes))
            .hybrid_cache_capacity(program_bytes);
        let meta = meta::Builder::new()
            .configure(config)
            .build(pattern)
            .map_err(|e| e.to_string())?;
        let thompson = thompson::Config::new()
            .nfa_size_limit(Some(program_bytes))
            .shrink(false)
            .utf8(true);
        let nfa = thompson::Compiler::new()
            .configure(thompson.clone().which_captures(WhichCaptures::All))
            .build(pattern)
            .map_err(|e| e.to_string())?;
        let dfas = (|| {
            let reverse = thompson::Compiler::new()
                .configure(thompson.which_captures(WhichCaptures::None).reverse(true))
                .build(pattern)
                .ok()?;
            // The regex crate's own settings: 10 bytes a state, and three
            // cache clears before the lazy DFA gives up.
            let config = DFA::config()
                .unicode_word_boundary(true)
                .cache_capacity(program_bytes)
                .skip_cache_capacity_check(false)
                .minimum_cache_clear_count(Some(3))
                .minimum_bytes_per_state(Some(10));
            let build = |kind, nfa| {
                DFA::builder()
                    .configure(config.clone().match_kind(kind))
                    .build_from_nfa(nfa)
                    .ok()
            };
            Some((
                build(MatchKind::LeftmostFirst, nfa.clone())?,
                build(MatchKind::All, reverse)?,
            ))
        })();
        let has_group1 = nfa.group_info().group_len(PatternID::ZERO) > 1;
        Ok(Self {
            meta,
            nfa,
            dfas,
            has_group1,
            scratch: Mutex::default(),
        })
    }

    /// Without the lazy DFAs: every search in the PikeVM (for the tests).
    #[cfg(test)]
    fn without_dfas(mut self) -> Self {
        self.dfas = None;
        self
    }

    fn meta_slots(&self, input: &Input<'_>) -> Option<[usize; 4]> {
        let mut slots = [None::<NonMaxUsize>; 4];
        self.meta.search_slots(input, &mut slots)?;
        Some(slots.map(|slot| slot.map_or(NONE, NonMaxUsize::get)))
    }

    /// The leftmost-first match from `from` with the lazy DFAs; `Dfa` when
    /// they cannot say.
    fn dfa_find(
        &self,
        scratch: &mut Scratch,
        text: &[u8],
        from: usize,
        meter: &mut Meter<'_>,
    ) -> Result<Option<[usize; 4]>, Stop> {
        let (forward, reverse) = self.dfas.as_ref().ok_or(Stop::Dfa)?;
        let (fwd_cache, rev_cache) = scratch.dfa_caches.as_mut().ok_or(Stop::Dfa)?;
        let Some(end) = dfa_run(forward, fwd_cache, text, from..text.len(), true, meter)? else {
            return Ok(None);
        };
        let start = dfa_run(reverse, rev_cache, text, from..end, false, meter)?.ok_or(Stop::Dfa)?;
        if !self.has_group1 || (start == end && !is_char_boundary(text, end)) {
            return Ok(Some([start, end, NONE, NONE]));
        }
        let within = Input::new(text).span(start..end).anchored(Anchored::Yes);
        if end - start <= SHORT {
            return Ok(self.meta_slots(&within));
        }
        pike(&self.nfa, scratch, text, start..end, true, meter)
    }

    fn take_scratch(&self) -> Scratch {
        let pooled = self.scratch.lock().ok().and_then(|mut pool| pool.pop());
        pooled.unwrap_or_else(|| {
            let states = self.nfa.states().len();
            let dfa_caches = self
                .dfas
                .as_ref()
                .map(|(f, r)| (DfaCache::new(f), DfaCache::new(r)));
            Scratch {
                dfa_caches,
                now: Set::new(states),
                next: Set::new(states),
                stack: Vec::new(),
            }
        })
    }

    fn give_back(&self, scratch: Scratch) {
        if let Ok(mut pool) = self.scratch.lock() {
            pool.push(scratch);
        }
    }
}

/// What `Regex::captures_at(text, start)` gives, with `keep_going` asked
/// as the search goes (not for a text of at most [`SHORT`] bytes past
/// `start`, which `regex` searches at once). `start` is a char boundary.
pub fn captures(
    regex: &Regex,
    engines: &Engines,
    text: &str,
    start: usize,
    keep_going: &mut dyn FnMut() -> bool,
) -> Result<Option<Found>, Interrupted> {
    captures_past(SHORT, regex, engines, text, start, keep_going)
}

/// `Regex::captures_at`, unmetered.
pub fn captured(regex: &Regex, text: &str, start: usize) -> Option<Found> {
    let captures = regex.captures_at(text, start)?;
    Some(Found {
        whole: captures.get(0)?.range(),
        group1: captures.get(1).map(|m| m.range()),
    })
}

/// [`captures`], metered past `short` bytes.
fn captures_past(
    short: usize,
    regex: &Regex,
    engines: &Engines,
    text: &str,
    start: usize,
    keep_going: &mut dyn FnMut() -> bool,
) -> Result<Option<Found>, Interrupted> {
    if text.len() - start <= short {
        return Ok(captured(regex, text, start));
    }
    let bytes = text.as_bytes();
    let mut scratch = engines.take_scratch();
    let mut meter = Meter {
        keep_going,
        bytes: 0,
        steps: 0,
    };
    let mut from = start;
    let found = loop {
        let found = match engines.dfa_find(&mut scratch, bytes, from, &mut meter) {
            Err(Stop::Dfa) => pike(
                &engines.nfa,
                &mut scratch,
                bytes,
                from..bytes.len(),
                false,
                &mut meter,
            ),
            found => found,
        };
        match found {
            // An empty match inside a character is skipped, as the regex
            // crate does; no match can start before the next position.
            Ok(Some(s)) if s[0] == s[1] && !is_char_boundary(bytes, s[1]) => from = s[1] + 1,
            Ok(found) => break Ok(found.map(into_found)),
            Err(_) => break Err(Interrupted),
        }
    };
    engines.give_back(scratch);
    found
}

fn into_found(slots: [usize; 4]) -> Found {
    let group1 = (slots[2] != NONE && slots[3] != NONE).then_some(slots[2]..slots[3]);
    Found {
        whole: slots[0]..slots[1],
        group1,
    }
}

fn is_char_boundary(text: &[u8], at: usize) -> bool {
    at >= text.len() || (text[at] as i8) >= -0x40
}

/// Why a metered search stopped short.
enum Stop {
    /// `keep_going` said so.
    Told,
    /// The lazy DFA quit or gave up.
    Dfa,
}

/// Counts the work since `keep_going` was last asked.
struct Meter<'a> {
    keep_going: &'a mut dyn FnMut() -> bool,
    bytes: usize,
    steps: usize,
}

impl Meter<'_> {
    #[inline]
    fn tick(&mut self, bytes: usize, steps: usize) -> Result<(), Stop> {
        self.bytes += bytes;
        self.steps += steps;
        if self.bytes >= CHUNK || self.steps >= STEPS {
            self.bytes = 0;
            self.steps = 0;
            if !(self.keep_going)() {
                return Err(Stop::Told);
            }
        }
        Ok(())
    }

    /// Asks now.
    fn ask(&mut self) -> Result<(), Stop> {
        self.tick(CHUNK, 0)
    }
}

/// One search's scratch space: the lazy DFAs' caches, and the PikeVM's
/// thread sets and stack.
struct Scratch {
    dfa_caches: Option<(DfaCache, DfaCache)>,
    now: Set,
    next: Set,
    stack: Vec<Frame>,
}

/// A sparse set of NFA states, each with its group 0 and 1 slots.
struct Set {
    ids: Vec<StateID>,
    sparse: Vec<u32>,
    slots: Vec<[usize; 4]>,
}

impl Set {
    fn new(states: usize) -> Self {
        Self {
            ids: Vec::with_capacity(states),
            sparse: vec![0; states],
            slots: vec![[NONE; 4]; states],
        }
    }

    #[inline]
    fn insert(&mut self, state: StateID) -> bool {
        let i = self.sparse[state.as_usize()] as usize;
        if i < self.ids.len() && self.ids[i] == state {
            return false;
        }
        self.sparse[state.as_usize()] = self.ids.len() as u32;
        self.ids.push(state);
        true
    }
}

/// The epsilon closure's work list.
enum Frame {
    Explore(StateID),
    Restore(usize, usize),
}

/// The lazy DFA over `span` of `text`, driven a byte at a time: forward
/// (leftmost-first, unanchored: the match's end) or in reverse (anchored at
/// the span's end, every match kind: the match's start). Look-arounds see
/// the whole text, and a match is reported a byte late, as in
/// `try_search_fwd`/`try_search_rev`.
fn dfa_run(
    dfa: &DFA,
    cache: &mut DfaCache,
    text: &[u8],
    span: Range<usize>,
    forward: bool,
    meter: &mut Meter<'_>,
) -> Result<Option<usize>, Stop> {
    let (from, end) = (span.start, span.end);
    let anchored = if forward { Anchored::No } else { Anchored::Yes };
    let input = Input::new(text).span(span).anchored(anchored);
    let start = match forward {
        true => dfa.start_state_forward(cache, &input),
        false => dfa.start_state_reverse(cache, &input),
    };
    let mut state = start.map_err(|_| Stop::Dfa)?;
    let mut at = if forward { from } else { end };
    let mut last = None;
    cache.search_start(at);
    let (mut scanned, mut built) = (0usize, 0usize);
    while if forward { at < end } else { at > from } {
        let byte = text[if forward { at } else { at - 1 }];
        let known = match state.is_tagged() {
            true => None,
            false => Some(dfa.next_state_untagged(cache, state, byte)).filter(|s| !s.is_unknown()),
        };
        state = match known {
            Some(next) => next,
            // A state to build: up to the program's size in work.
            None => {
                let before = cache.memory_usage();
                cache.search_update(at);
                let next = dfa.next_state(cache, state, byte).map_err(|_| Stop::Dfa)?;
                built += usize::from(cache.memory_usage() != before);
                next
            }
        };
        if state.is_tagged() {
            if state.is_match() {
                last = Some(at);
            } else if state.is_dead() {
                cache.search_finish(at);
                return Ok(last);
            } else if state.is_quit() {
                return Err(Stop::Dfa);
            }
        }
        at = if forward { at + 1 } else { at - 1 };
        scanned += 1;
        if scanned >= CHUNK || built >= BUILT {
            cache.search_update(at);
            meter.ask()?;
            (scanned, built) = (0, 0);
        }
    }
    cache.search_finish(at);
    let (at, context) = match forward {
        true => (end, text.get(end).copied()),
        false => (from, from.checked_sub(1).map(|before| text[before])),
    };
    let last_state = match context {
        Some(byte) => dfa.next_state(cache, state, byte),
        None => dfa.next_eoi_state(cache, state),
    };
    let last_state = last_state.map_err(|_| Stop::Dfa)?;
    if last_state.is_match() {
        last = Some(at);
    } else if last_state.is_quit() {
        return Err(Stop::Dfa);
    }
    Ok(last)
}

/// Leftmost-first PikeVM over `span` of `text` (look-arounds see all of
/// it), keeping the slots of groups 0 and 1 only, with the regex crate's
/// priorities.
fn pike(
    nfa: &NFA,
    scratch: &mut Scratch,
    text: &[u8],
    span: Range<usize>,
    anchored: bool,
    meter: &mut Meter<'_>,
) -> Result<Option<[usize; 4]>, Stop> {
    let Scratch {
        now, next, stack, ..
    } = scratch;
    now.ids.clear();
    let start = match anchored {
        true => nfa.start_anchored(),
        false => nfa.start_unanchored(),
    };
    closure(nfa, text, stack, now, start, [NONE; 4], span.start);
    let (mut at, mut best) = (span.start, None);
    while !now.ids.is_empty() {
        meter.tick(1, now.ids.len())?;
        next.ids.clear();
        let byte = (at < span.end).then(|| text[at]);
        for i in 0..now.ids.len() {
            let id = now.ids[i];
            let to = match (nfa.state(id), byte) {
                (State::Match { .. }, _) => {
                    best = Some(now.slots[id.as_usize()]);
                    break;
                }
                (State::ByteRange { trans }, Some(b)) => {
                    Some(trans.next).filter(|_| trans.matches_byte(b))
                }
                (State::Sparse(t), Some(b)) => t.matches_byte(b),
                (State::Dense(t), Some(b)) => t.matches_byte(b),
                _ => None,
            };
            if let Some(to) = to {
                closure(nfa, text, stack, next, to, now.slots[id.as_usize()], at + 1);
            }
        }
        if at >= span.end {
            break;
        }
        std::mem::swap(now, next);
        at += 1;
    }
    Ok(best)
}

/// Adds `from`'s epsilon closure at `at` to `set`, in priority order.
fn closure(
    nfa: &NFA,
    text: &[u8],
    stack: &mut Vec<Frame>,
    set: &mut Set,
    from: StateID,
    mut slots: [usize; 4],
    at: usize,
) {
    stack.push(Frame::Explore(from));
    while let Some(frame) = stack.pop() {
        let mut id = match frame {
            Frame::Restore(slot, value) => {
                slots[slot] = value;
                continue;
            }
            Frame::Explore(id) => id,
        };
        while set.insert(id) {
            match nfa.state(id) {
                State::Look { look, next } => {
                    if !nfa.look_matcher().matches(*look, text, at) {
                        break;
                    }
                    id = *next;
                }
                State::Union { alternates } => {
                    let Some(&first) = alternates.first() else {
                        break;
                    };
                    stack.extend(alternates[1..].iter().rev().map(|&a| Frame::Explore(a)));
                    id = first;
                }
                State::BinaryUnion { alt1, alt2 } => {
                    stack.push(Frame::Explore(*alt2));
                    id = *alt1;
                }
                State::Capture { next, slot, .. } => {
                    let slot = slot.as_usize();
                    if slot < 4 {
                        stack.push(Frame::Restore(slot, slots[slot]));
                        slots[slot] = at;
                    }
                    id = *next;
                }
                _ => {
                    set.slots[id.as_usize()] = slots;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const LIMIT: usize = 1 << 20;

    /// A small xorshift generator: the cases are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
            of[self.below(of.len())]
        }
    }

    fn random_pattern(rng: &mut Rng, depth: usize) -> String {
        const ATOMS: &[&str] = &[
            "a",
            "b",
            "é",
            "ж",
            " ",
            "1",
            "\\n",
            ".",
            "\\w",
            "\\s",
            "\\d",
            "\\pL",
            "[a-cé]",
            "[^a ]",
            "\\b",
            "\\B",
            "^",
            "$",
            "(?m:^)",
            "(?m:$)",
            "\\A",
            "\\z",
            "(?-u:\\b)",
            "(?-u:\\w)",
            "",
            "(?i)A",
            "(?s:.)",
            "\\b{start}",
            "\\b{end}",
        ];
        const REPEATS: &[&str] = &[
            "", "", "", "*", "+", "?", "{0,3}", "{2}", "*?", "+?", "??", "{1,4}?",
        ];
        if depth == 0 || rng.below(3) == 0 {
            let repeat = if rng.below(3) == 0 {
                rng.pick(REPEATS)
            } else {
                ""
            };
            return format!("{}{repeat}", rng.pick(ATOMS));
        }
        let parts: Vec<String> = (0..1 + rng.below(3))
            .map(|_| random_pattern(rng, depth - 1))
            .collect();
        let body = match rng.below(3) {
            0 => parts.join("|"),
            _ => parts.concat(),
        };
        let open = ["(", "(?:"][rng.below(2)];
        format!("{open}{body}){}", rng.pick(REPEATS))
    }

    fn random_text(rng: &mut Rng, len: usize) -> String {
        const CHARS: &[&str] = &[
            "a",
            "b",
            "c",
            "é",
            "ж",
            " ",
            "1",
            "\n",
            "A",
            "\u{1F600}",
            "_",
            "-",
        ];
        let mut text = String::new();
        while text.len() < len {
            text.push_str(rng.pick(CHARS));
        }
        text
    }

    /// Words with accents and Cyrillic (no Greek), a line break now and then.
    fn words(size: usize) -> String {
        const WORDS: &[&str] = &[
            "lörem", "ipsüm", "dolor", "sít", "амет", "invoice", "totäl", "12,50", "€",
        ];
        let mut rng = Rng(42);
        let mut text = String::with_capacity(size + 16);
        while text.len() < size {
            text.push_str(rng.pick(WORDS));
            text.push(if rng.below(12) == 0 { '\n' } else { ' ' });
        }
        text
    }

    fn engines(pattern: &str) -> (Regex, Engines) {
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(LIMIT)
            .dfa_size_limit(LIMIT)
            .build()
            .unwrap();
        (regex, Engines::new(pattern, LIMIT).unwrap())
    }

    #[test]
    fn finds_what_captures_at_finds_with_and_without_the_lazy_dfa() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut compared, mut found) = (0, 0);
        for case in 0..300 {
            let pattern = random_pattern(&mut rng, 3);
            let Ok(regex) = regex::RegexBuilder::new(&pattern).size_limit(LIMIT).build() else {
                continue;
            };
            let with_dfa = Engines::new(&pattern, LIMIT).unwrap();
            let pike_only = Engines::new(&pattern, LIMIT).unwrap().without_dfas();
            for _ in 0..8 {
                // Now and then a text long enough for the long-match paths.
                let len = if case % 50 == 0 {
                    70_000
                } else {
                    rng.below(40)
                };
                let text = random_text(&mut rng, len);
                let mut start = rng.below(text.len() + 1);
                while !text.is_char_boundary(start) {
                    start -= 1;
                }
                let expected = captured(&regex, &text, start);
                for engines in [&with_dfa, &pike_only] {
                    let got = captures_past(0, &regex, engines, &text, start, &mut || true);
                    assert_eq!(
                        got,
                        Ok(expected.clone()),
                        "{pattern:?} in {text:?} from {start}"
                    );
                    compared += 1;
                }
                found += usize::from(expected.is_some());
            }
        }
        assert!(
            compared > 4000 && found > 1000,
            "{compared} compared, {found} found"
        );
    }

    #[test]
    fn a_search_that_would_take_seconds_stops_when_told() {
        // 1.5 s over 256 KiB in one captures_at: the Unicode \b makes the
        // lazy DFA quit at the first non-ASCII byte, and the PikeVM keeps
        // about a thousand states alive at each byte.
        let (regex, engines) = engines(r"\b(?s:.){0,1041}\p{Greek}");
        let text = words(256 * 1024);
        let deadline = Instant::now() + Duration::from_millis(20);
        let started = Instant::now();
        let stopped = captures(&regex, &engines, &text, 0, &mut || {
            Instant::now() < deadline
        });
        let took = started.elapsed();
        assert_eq!(stopped, Err(Interrupted));
        assert!(took < Duration::from_millis(200), "stopped after {took:?}");
    }

    #[test]
    fn the_usual_field_searches_find_what_they_found_before() {
        let text = format!(
            "{} INVOICE NUMBER INV-2024-00731 Total 1,234.50",
            words(100 * 1024)
        );
        for pattern in [
            r"\S+",
            r"-?\d+(?:\.\d+)?",
            r"(?i)(?:^|\s)invoice\s+number",
            r"INV-(\d+)-(\d+)",
        ] {
            let (regex, engines) = engines(pattern);
            for start in [0, 50_000, text.len() - 40] {
                let start = (start..).find(|&s| text.is_char_boundary(s)).unwrap();
                let got = captures(&regex, &engines, &text, start, &mut || true);
                assert_eq!(got, Ok(captured(&regex, &text, start)), "{pattern}");
            }
        }
    }
}
