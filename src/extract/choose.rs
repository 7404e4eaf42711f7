//! Choosing a typed value among every candidate on the page, instead of
//! taking the first match. A receipt prints `TOTAL QTY`, `SUB-TOTAL`,
//! `TOTAL GST`, `ROUNDING`, `TOTAL (INCL GST)`, `CASH` and `CHANGE`; a
//! `money` field anchored on `TOTAL` must return the amount the document
//! means as its total. So:
//!
//! - every line that carries the anchor (`sub-total` and `TOTAL:` do) is a
//!   candidate, with the amount to its right on that line, or alone on the
//!   next line;
//! - its label (the line's other words) says what kind of amount it is: a
//!   part of the total (items, quantity, sub-total, tax, discount,
//!   rounding, tendered, change) scores low, a plain total high, a grand,
//!   net, inclusive or after-rounding total higher;
//! - the arithmetic the page carries confirms or contradicts a candidate:
//!   tendered − change, and sub-total + tax + rounding − discount;
//! - the choice is as sure as it is clear: a confirmed sum, or a winner
//!   far ahead, is sure; a close second, a failed check or a value found
//!   without its anchor is not.
//!
//! A `date` field reads every date on the page in the common printed
//! formats, prefers one labelled as the date (or by its anchor), and
//! returns it as ISO with the text as printed.

use super::layout::Line;
use super::values;
use super::{Candidate, Choice, ExtractedValue};
use crate::domain::WordRef;

/// The page as the chooser reads it.
pub struct Page<'a> {
    words: &'a [WordRef<'a>],
    lines: Vec<Line>,
    /// Each line's amounts, label and lower-cased text.
    amounts: Vec<Vec<Amount>>,
    labels: Vec<Vec<String>>,
    lowered: Vec<String>,
    /// Each line's kind of amount to the page's total, and its dates,
    /// once a field asks.
    kinds: std::cell::OnceCell<Vec<Kind>>,
    dates: std::cell::OnceCell<Vec<Vec<Dated>>>,
    /// The page's arithmetic, read once for every `money` field.
    checks: std::cell::OnceCell<Checks>,
}

/// A date printed on a line: its words (first and last) and the day.
type Dated = ([usize; 2], chrono::NaiveDate);

/// An amount printed on a line.
#[derive(Debug, Clone, Copy)]
struct Amount {
    /// The words it spans, first and last (indices into the document's
    /// words): one, or two when OCR split it at its decimal point.
    words: [usize; 2],
    cents: i64,
}

/// What a line's label says its amount is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Grand, net, inclusive, rounded, due: the total that is paid.
    Final,
    /// Just a total.
    Total,
    /// A part of it, or what paid it.
    Part(Part),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    Items,
    Subtotal,
    Tax,
    Discount,
    Rounding,
    Tendered,
    Change,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Items => "a count of items",
            Part::Subtotal => "a sub-total",
            Part::Tax => "a tax",
            Part::Discount => "a discount",
            Part::Rounding => "a rounding",
            Part::Tendered => "the amount tendered",
            Part::Change => "the change",
        }
    }
}

/// One amount that may be the value, and why.
#[derive(Debug, Clone)]
struct Scored {
    amount: Amount,
    score: f64,
    why: String,
    /// What the line's label says; `None` for an amount printed without
    /// the anchor, or computed.
    kind: Option<Kind>,
    /// Computed from the page's parts, not read as one amount.
    computed: bool,
}

/// Scores of a choice's clarity, and the confidences they give: tuned on
/// receipts so that a value under the default `min_confidence` (0.8) is
/// the one to check.
mod sure {
    /// A check of the page's arithmetic agrees with the winner.
    pub const CONFIRMED: f64 = 0.97;
    /// The winner is ahead of every other amount by this much or more…
    pub const CLEAR_MARGIN: f64 = 1.5;
    /// …and is then this sure.
    pub const CLEAR: f64 = 0.92;
    /// Ahead by less.
    pub const CLOSE: f64 = 0.6;
    /// An amount printed without the anchor, that the page's arithmetic
    /// gives.
    pub const DERIVED: f64 = 0.85;
    /// The page's arithmetic gives another amount.
    pub const CONTRADICTED: f64 = 0.5;
    /// No line the anchor carries holds it, and no amount printed is it:
    /// the page's parts add up to it (the total's line was not read).
    pub const COMPUTED: f64 = 0.4;
    /// Only a part of the total (a sub-total, the cash) carried the anchor,
    /// or the anchor is not on the page.
    pub const WEAK: f64 = 0.3;
}

impl<'a> Page<'a> {
    /// The page of `words`, in `lines`: each line's amounts, label and
    /// text read once, for every field chosen on it.
    pub fn new(words: &'a [WordRef<'a>], lines: Vec<Line>) -> Self {
        let mut page = Self {
            words,
            lines,
            amounts: Vec::new(),
            labels: Vec::new(),
            lowered: Vec::new(),
            kinds: std::cell::OnceCell::new(),
            dates: std::cell::OnceCell::new(),
            checks: std::cell::OnceCell::new(),
        };
        page.amounts = (0..page.lines.len())
            .map(|l| page.read_amounts(l))
            .collect();
        page.labels = (0..page.lines.len()).map(|l| page.read_label(l)).collect();
        page.lowered = (page.lines.iter())
            .map(|line| {
                let mut text = String::new();
                for &w in &line.words {
                    if !text.is_empty() {
                        text.push(' ');
                    }
                    text.push_str(words[w].text);
                }
                match text.is_ascii() {
                    true => {
                        text.make_ascii_lowercase();
                        text
                    }
                    false => text.to_lowercase(),
                }
            })
            .collect();
        page
    }

    fn text(&self, word: usize) -> &'a str {
        self.words[word].text
    }

    /// What line `l`'s amount is to the page's total.
    fn part_of_total(&self, l: usize) -> Kind {
        let kinds = self.kinds.get_or_init(|| {
            (0..self.lines.len())
                .map(|l| kind(self.label(l), &TOTAL))
                .collect()
        });
        kinds[l]
    }

    /// Every amount of line `l`, left to right.
    fn amounts(&self, l: usize) -> &[Amount] {
        &self.amounts[l]
    }

    /// The words of line `l` that are not amounts, lower-cased, split at
    /// anything that is not a letter: `SUB-TOTAL:` is `sub`, `total`.
    fn label(&self, l: usize) -> &[String] {
        &self.labels[l]
    }

    /// Every amount of line `l`, left to right: a word that is one, or
    /// two next to each other split at the decimal point (`39.` `80`,
    /// as OCR reads a monospaced receipt's `39. 80`).
    fn read_amounts(&self, l: usize) -> Vec<Amount> {
        let words = &self.lines[l].words;
        let mut amounts = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let word = words[i];
            if let Some(cents) = ocr_money(self.text(word)) {
                amounts.push(Amount {
                    words: [word, word],
                    cents,
                });
                i += 1;
                continue;
            }
            let split = words.get(i + 1).and_then(|&next| {
                let (a, b) = (self.text(word), self.text(next));
                // Next to each other in reading order too, so the value
                // is one run of words.
                let at_point =
                    next == word + 1 && (a.ends_with(['.', ',']) || b.starts_with(['.', ',']));
                if !at_point {
                    return None;
                }
                let cents = values::money_cents(&format!("{a}{b}"))?;
                Some(Amount {
                    words: [word, next],
                    cents,
                })
            });
            match split {
                Some(amount) => {
                    amounts.push(amount);
                    i += 2;
                }
                None => i += 1,
            }
        }
        amounts
    }

    /// The words of line `l` that are, or are part of, an amount.
    fn in_amounts(&self, l: usize) -> std::collections::HashSet<usize> {
        (self.amounts(l).iter())
            .flat_map(|a| a.words[0]..=a.words[1])
            .collect()
    }

    fn read_label(&self, l: usize) -> Vec<String> {
        let amounts = self.in_amounts(l);
        (self.lines[l].words.iter())
            .filter(|w| !amounts.contains(w))
            .flat_map(|&w| {
                (self.text(w).split(|c: char| !c.is_alphabetic()))
                    .filter(|s| !s.is_empty())
                    .map(str::to_lowercase)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The line's label as printed, for explanations: at most
    /// [`PRINTED_CHARS`] characters, so a long line cannot fill a result.
    fn printed(&self, l: usize) -> String {
        let amounts = self.in_amounts(l);
        let words = self.lines[l].words.iter().filter(|w| !amounts.contains(w));
        let label = words.map(|&w| self.text(w)).collect::<Vec<_>>().join(" ");
        match label.char_indices().nth(PRINTED_CHARS) {
            Some((end, _)) => format!("{}…", &label[..end]),
            None => label,
        }
    }

    /// The amount line `l`'s label stands for: the rightmost on the line,
    /// or the one alone on the next line (a label with its amount below).
    fn amount_of(&self, l: usize) -> Option<(Amount, bool)> {
        if let Some(last) = self.amounts(l).last() {
            return Some((*last, false));
        }
        let next = l + 1;
        let same_page = self.lines.get(next)?.page == self.lines[l].page;
        let alone = self.label(next).iter().all(|w| is_currency(w));
        match (same_page, alone, self.amounts(next).last()) {
            (true, true, Some(amount)) => Some((*amount, true)),
            _ => None,
        }
    }

    /// Lines whose words hold the anchor's, in order (`total` is in
    /// `SUB-TOTAL` and `TOTAL:`).
    fn anchored(&self, anchor: &[String]) -> Vec<usize> {
        let wanted = anchor.join(" ");
        if wanted.is_empty() {
            return Vec::new();
        }
        (0..self.lines.len())
            .filter(|&l| self.lowered[l].contains(&wanted))
            .collect()
    }

    /// The amount a `money` field anchored on `anchor` stands for, chosen
    /// among every line carrying it; `None` when no line does and the
    /// page's arithmetic gives no total either.
    pub fn money(&self, anchor: &str) -> Option<ExtractedValue> {
        let anchor: Vec<String> = anchor.split_whitespace().map(str::to_lowercase).collect();
        let anchor_words: Vec<String> = (anchor.iter())
            .flat_map(|a| a.split(|c: char| !c.is_alphabetic()).map(str::to_owned))
            .filter(|s| !s.is_empty())
            .collect();
        // The page's arithmetic gives its total: it says nothing of a
        // field anchored on a part (`Subtotal`, `Cash`).
        let none = Checks::none();
        let checks = match kind(&anchor_words, &[""; 0]) {
            Kind::Part(_) => &none,
            _ => self.checks.get_or_init(|| Checks::of(self)),
        };
        let mut scored: Vec<Scored> = Vec::new();
        for l in self.anchored(&anchor) {
            let Some((amount, below)) = self.amount_of(l) else {
                continue;
            };
            let mut kind = kind(self.label(l), &anchor_words);
            // A tax summary's total line (`TOTAL: 26.00 1.56`) ends with
            // the tax it sums, not the total paid.
            let summed_tax = checks.tax != 0 && amount.cents == checks.tax;
            if !below && kind != Kind::Final && summed_tax && self.amounts(l).len() > 1 {
                kind = Kind::Part(Part::Tax);
            }
            let (mut score, mut why) = match kind {
                Kind::Final => (3.0, format!("a final total ({:?})", self.printed(l))),
                Kind::Total => (2.0, format!("a total ({:?})", self.printed(l))),
                Kind::Part(part) => (-1.0, format!("{} ({:?})", part.name(), self.printed(l))),
            };
            if below {
                score -= 0.25;
                why.push_str(", on the next line");
            }
            scored.push(Scored {
                amount,
                score,
                why,
                kind: Some(kind),
                computed: false,
            });
        }
        let anchored = !scored.is_empty();
        // The totals the page's arithmetic gives, where printed without the
        // anchor (OCR misread the label, or it is another word).
        for total in checks.totals() {
            if let Some(amount) = self.unlabelled(total, &scored) {
                scored.push(Scored {
                    amount,
                    score: 1.0,
                    why: "an amount without the anchor".into(),
                    kind: None,
                    computed: false,
                });
            }
        }
        // The total the parts add up to, when no amount read is it: the
        // total's own line was not read. Below any total read, above its
        // parts: a reviewer is shown what the page's arithmetic says.
        if let Some((cents, words, rule)) = checks.computed() {
            if !scored.iter().any(|s| s.amount.cents == cents) {
                scored.push(Scored {
                    amount: Amount { words, cents },
                    score: 0.5,
                    why: format!("computed as {rule}; not read as one amount"),
                    kind: None,
                    computed: true,
                });
            }
        }
        for candidate in scored.iter_mut().filter(|s| !s.computed) {
            if let Some(rule) = checks.confirms(candidate.amount.cents) {
                candidate.score += CHECKED;
                candidate.why.push_str(&format!(", equal to {rule}"));
            }
        }
        self.decide(scored, checks, anchored)
    }

    /// The last place `cents` is printed on a line that is not what paid
    /// it (the cash line alone is no second reading when the change is
    /// nil), unless a candidate that is not a part of the total already
    /// has it.
    fn unlabelled(&self, cents: i64, scored: &[Scored]) -> Option<Amount> {
        let anchored = |s: &Scored| !matches!(s.kind, Some(Kind::Part(_)));
        if scored
            .iter()
            .any(|s| s.amount.cents == cents && anchored(s))
        {
            return None;
        }
        let paid = |l: usize| {
            matches!(
                self.part_of_total(l),
                Kind::Part(Part::Tendered | Part::Change)
            )
        };
        let printed = |l: usize| {
            self.amounts(l)
                .iter()
                .rev()
                .find(|a| a.cents == cents)
                .copied()
        };
        (0..self.lines.len())
            .rev()
            .filter(|&l| !paid(l))
            .find_map(printed)
    }

    /// The best of `scored`, with how sure the choice is.
    fn decide(
        &self,
        scored: Vec<Scored>,
        checks: &Checks,
        anchored: bool,
    ) -> Option<ExtractedValue> {
        // One score per amount: its best candidate's, and a little more for
        // each other line that agrees.
        let mut by_amount: Vec<(Scored, usize)> = Vec::new();
        for candidate in scored {
            match by_amount
                .iter_mut()
                .find(|(s, _)| s.amount.cents == candidate.amount.cents)
            {
                Some((best, agreeing)) => {
                    *agreeing += 1;
                    if candidate.score > best.score {
                        *best = candidate;
                    }
                }
                None => by_amount.push((candidate, 0)),
            }
        }
        let mut ranked: Vec<Scored> = (by_amount.into_iter())
            .map(|(mut s, agreeing)| {
                s.score += (0.25 * agreeing as f64).min(0.5);
                s
            })
            .collect();
        // Best first; between equals, the larger amount (a total is not
        // less than its parts), then the later line.
        ranked.sort_by(|a, b| {
            (b.score.total_cmp(&a.score))
                .then(b.amount.cents.cmp(&a.amount.cents))
                .then(b.amount.words[0].cmp(&a.amount.words[0]))
        });
        let winner = ranked.first()?;
        let runner_up = ranked.get(1).map_or(f64::NEG_INFINITY, |s| s.score);
        let confirmed = checks.confirms(winner.amount.cents);
        let clarity = match (anchored, winner.kind, confirmed) {
            _ if winner.computed => sure::COMPUTED,
            (false, _, _) | (_, Some(Kind::Part(_)), None) => sure::WEAK,
            (_, None, Some(_)) => sure::DERIVED,
            (_, _, Some(_)) => sure::CONFIRMED,
            _ if checks.contradicts(winner.amount.cents) => sure::CONTRADICTED,
            _ if winner.score - runner_up >= sure::CLEAR_MARGIN => sure::CLEAR,
            _ => sure::CLOSE,
        };
        let rule = match (anchored, confirmed) {
            _ if winner.computed => winner.why.clone(),
            (false, _) => format!("no line carries the anchor; {}", winner.why),
            (true, Some(rule)) => format!("{}; {rule} agrees", winner.why),
            (true, None) => winner.why.clone(),
        };
        let mut value = self.value(
            values::cents_text(winner.amount.cents),
            winner.amount.words,
            (clarity, confirmed.is_some() && !winner.computed),
            rule,
            ranked
                .iter()
                .take(MAX_CANDIDATES)
                .map(|s| self.candidate(s))
                .collect(),
        );
        if winner.computed {
            // Printed nowhere as one amount: no text to quote.
            value.raw = None;
        }
        Some(value)
    }

    fn candidate(&self, s: &Scored) -> Candidate {
        Candidate {
            value: values::cents_text(s.amount.cents),
            words: s.amount.words,
            score: (s.score * 100.0).round() / 100.0,
            why: s.why.clone(),
        }
    }

    /// A chosen value: its confidence is the least of the choice's clarity
    /// and its words' OCR confidence, unless the page's arithmetic gave the
    /// same amount from other numbers (`checked`): that is a second reading
    /// of its digits, and the choice's clarity stands alone.
    fn value(
        &self,
        value: String,
        words: [usize; 2],
        (clarity, checked): (f64, bool),
        rule: String,
        candidates: Vec<Candidate>,
    ) -> ExtractedValue {
        let read = (self.words.get(words[0]..=words[1]).into_iter().flatten())
            .filter_map(|w| w.confidence)
            .fold(1.0, f64::min);
        let confidence = if checked { clarity } else { clarity.min(read) };
        let raw = (words[0]..=words[1])
            .map(|w| self.text(w))
            .collect::<Vec<_>>()
            .join(" ");
        ExtractedValue {
            value,
            raw: Some(raw),
            words: Some(words),
            confidence: Some((confidence * 1000.0).round() / 1000.0),
            chosen: Some(Choice { rule, candidates }),
        }
    }

    /// The date a `date` field stands for: every date on the page read in
    /// the common printed formats; one on the anchor's line (or under it,
    /// when the anchor's line holds none) wins, else one labelled as a
    /// date, else the first.
    pub fn date(&self, anchor: Option<&str>) -> Option<ExtractedValue> {
        let anchor: Vec<String> = anchor
            .map(|a| a.split_whitespace().map(str::to_lowercase).collect())
            .unwrap_or_default();
        let anchored = self.anchored(&anchor);
        let dates = self
            .dates
            .get_or_init(|| (0..self.lines.len()).map(|l| self.dates_on(l)).collect());
        // The line under the anchor's, when the anchor's holds no date.
        let under = |l: usize| l > 0 && anchored.contains(&(l - 1)) && dates[l - 1].is_empty();
        let mut found: Vec<(f64, String, [usize; 2], String)> = Vec::new();
        for (l, dated) in dates.iter().enumerate() {
            let label = self.label(l);
            let labelled = label.iter().any(|w| w.starts_with("date") || w == "dated");
            let above = l.checked_sub(1).map(|p| self.label(p)).unwrap_or_default();
            let labelled_above = above.last().is_some_and(|w| w.starts_with("date"));
            let other = label.iter().any(|w| is_other_date(w));
            for &(words, date) in dated {
                let (mut score, mut why) = (1.0, String::from("a date"));
                if anchored.contains(&l) {
                    (score, why) = (score + 4.0, "a date on the anchor's line".into());
                } else if under(l) {
                    (score, why) = (score + 3.5, "a date under the anchor".into());
                } else if labelled || labelled_above {
                    (score, why) = (score + 2.0, "a date labelled as the date".into());
                } else if other {
                    (score, why) = (score - 1.0, "another kind of date (due, expiry)".into());
                }
                found.push((score, values::iso(date), words, why));
            }
        }
        // Best first; between equals, the earlier on the page.
        found.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2[0].cmp(&b.2[0])));
        let (score, value, words, why) = found.first()?.clone();
        let runner_up = (found.iter())
            .find(|f| f.1 != value)
            .map_or(f64::NEG_INFINITY, |f| f.0);
        let clarity = match score - runner_up {
            m if m >= sure::CLEAR_MARGIN => sure::CLEAR,
            _ if anchor.is_empty() || !anchored.is_empty() => sure::CLOSE,
            _ => sure::WEAK,
        };
        let candidates = (found.iter().take(MAX_CANDIDATES))
            .map(|(score, value, words, why)| Candidate {
                value: value.clone(),
                words: *words,
                score: *score,
                why: why.clone(),
            })
            .collect();
        Some(self.value(value, words, (clarity, false), why, candidates))
    }

    /// The dates printed on line `l`: one word (`25/12/2018`,
    /// `Date:25/12/2018`) or up to three (`25 Dec 2018`), longest first.
    fn dates_on(&self, l: usize) -> Vec<Dated> {
        let words = &self.lines[l].words;
        let mut dates = Vec::new();
        // Every printed date has three digits or more.
        if words.iter().map(|&w| digits(self.text(w))).sum::<usize>() < 3 {
            return dates;
        }
        let mut i = 0;
        while i < words.len() {
            let spans = (1..=3.min(words.len() - i)).rev();
            let found = spans.into_iter().find_map(|n| {
                let span = &words[i..i + n];
                // Words of a line run left to right; a date's words are
                // also next to each other in reading order. Every printed
                // date has three digits or more.
                // Only a date with a month's name spans words.
                let adjacent = span.windows(2).all(|p| p[1] == p[0] + 1);
                let digits: usize = span.iter().map(|&w| digits(self.text(w))).sum();
                let named = n == 1 || span.iter().any(|&w| values::is_month(self.text(w)));
                if !adjacent || digits < 3 || !named {
                    return None;
                }
                let joined;
                let text = match n {
                    1 => self.text(span[0]),
                    _ => {
                        joined = span
                            .iter()
                            .map(|&w| self.text(w))
                            .collect::<Vec<_>>()
                            .join(" ");
                        &joined
                    }
                };
                let text = text.rsplit(':').next().unwrap_or(text);
                // One word may hold a date glued to its neighbours
                // (`25/12/20188:13:39PM`, as some readers drop spaces).
                let glued = || {
                    (n == 1 && digits >= 6)
                        .then(|| values::date_within(text))
                        .flatten()
                };
                let date = values::date(text).or_else(glued)?;
                Some((n, [span[0], span[n - 1]], date))
            });
            match found {
                Some((n, span, date)) => {
                    dates.push((span, date));
                    i += n;
                }
                None => i += 1,
            }
        }
        dates
    }
}

fn digits(text: &str) -> usize {
    text.bytes().filter(u8::is_ascii_digit).count()
}

/// An amount as OCR may print it: `15.u0` and `iS.00` are read as
/// `15.00`, when the word has a decimal point and two digits or more
/// (letters the engine takes for digits: o, u, D as 0; i, l, I, | as 1;
/// S, s as 5; B as 8; Z as 2).
fn ocr_money(text: &str) -> Option<i64> {
    if let Some(cents) = values::money_cents(text) {
        return Some(cents);
    }
    let point = text.contains(['.', ',']);
    if !point || text.len() > 12 || digits(text) < 2 {
        return None;
    }
    let (prefix, number) = match text.strip_prefix("RM") {
        Some(rest) => ("RM", rest),
        None => ("", text),
    };
    let mapped: String = number
        .chars()
        .map(|c| match c {
            'o' | 'O' | 'u' | 'U' | 'D' => '0',
            'i' | 'l' | 'I' | '|' => '1',
            'S' | 's' => '5',
            'B' => '8',
            'Z' => '2',
            c => c,
        })
        .collect();
    // Only the number itself may have been misread: a word with other
    // letters is not an amount.
    let misread = !mapped.chars().any(char::is_alphabetic);
    values::money_cents(&format!("{prefix}{mapped}")).filter(|_| misread)
}

/// The page's parts are what they are to its total: `TotalExcl.ofGST`
/// is a sub-total.
const TOTAL: [&str; 1] = ["total"];

/// What agreeing with the page's arithmetic adds to a candidate's score:
/// more than a final total's label adds over a plain one, since the
/// arithmetic is a second reading from other numbers, and a label is one
/// reading of a few words.
const CHECKED: f64 = 2.5;

/// The most characters of a label an explanation quotes.
const PRINTED_CHARS: usize = 60;

/// The most candidates a choice lists.
const MAX_CANDIDATES: usize = 5;

/// Labels of dates that are not the document's: a due date, an expiry.
fn is_other_date(word: &str) -> bool {
    ["due", "expir", "exp", "valid", "until", "birth"]
        .iter()
        .any(|p| word.starts_with(p))
}

fn is_currency(word: &str) -> bool {
    matches!(word, "rm" | "myr" | "usd" | "eur" | "gbp" | "sgd" | "us")
}

/// What a label says, leaving out the anchor's own words: a label
/// `sub total` is a part when the anchor is `total`, but a field anchored
/// on `subtotal` or `sub total` is asking for exactly that.
fn kind(label: &[String], anchor: &[impl AsRef<str>]) -> Kind {
    let anchor: Vec<&str> = anchor.iter().map(AsRef::as_ref).collect();
    let joined_anchor = anchor.concat();
    let words: Vec<&str> = (label.iter())
        .map(String::as_str)
        .filter(|w| !anchor.contains(w) && *w != joined_anchor)
        .collect();
    // Qualifiers glued to the anchor: `subtotal`, `grandtotal`,
    // `totalamtrounded` hold `sub`, `grand`, `amtrounded`.
    let glued: Vec<&str> = (label.iter())
        .flat_map(|w| {
            (anchor.iter())
                .filter(move |a| w.len() > a.len() && w.contains(*a))
                .flat_map(move |a| w.split(*a))
        })
        .filter(|piece| !piece.is_empty())
        .collect();
    let has = |prefixes: &[&str]| {
        let starts = |w: &&str| prefixes.iter().any(|p| w.starts_with(p));
        let holds = |w: &&str| prefixes.iter().any(|p| w.contains(p));
        words.iter().any(starts) || glued.iter().any(holds)
    };
    let final_total = has(&[
        "grand",
        "nett",
        "incl",
        "inclusive",
        "after",
        "rounded",
        "payable",
        "due",
        "final",
    ]) || words.contains(&"net")
        || words.contains(&"inc");
    let part = if has(&["item", "qty", "quantity", "pcs"]) && !final_total {
        Some(Part::Items)
    } else if has(&["sub", "excl", "before"]) {
        Some(Part::Subtotal)
    } else if has(&["tax", "gst", "vat", "sst", "service"]) && !final_total {
        Some(Part::Tax)
    } else if has(&["disc", "saving", "saved", "promo", "voucher", "less"]) {
        Some(Part::Discount)
    } else if has(&["round", "adj"]) && !final_total {
        Some(Part::Rounding)
    } else if has(&[
        "cash", "tender", "paid", "payment", "card", "visa", "master", "credit", "debit",
    ]) {
        Some(Part::Tendered)
    } else if has(&["change", "refund"]) || (has(&["balance", "bal"]) && !has(&["due"])) {
        // `Balance due` is what is owed; `change due` is the change.
        Some(Part::Change)
    } else {
        None
    };
    match (part, final_total) {
        (Some(part), _) => Kind::Part(part),
        (None, true) => Kind::Final,
        (None, false) => Kind::Total,
    }
}

/// Widen `span` to hold `words`.
fn span(span: &mut Option<[usize; 2]>, words: [usize; 2]) {
    *span = Some(match *span {
        Some([first, last]) => [first.min(words[0]), last.max(words[1])],
        None => words,
    });
}

/// The page's arithmetic: the amounts of its parts, wherever printed.
struct Checks {
    tendered: Option<i64>,
    change: Option<i64>,
    subtotal: Option<i64>,
    /// The first amount labelled a total and nothing more (later ones are
    /// often a tax summary's).
    total: Option<i64>,
    tax: i64,
    discount: i64,
    rounding: i64,
    /// The words from the first part's amount to the last's: where a
    /// total computed from them is shown.
    sum_words: Option<[usize; 2]>,
    paid_words: Option<[usize; 2]>,
}

impl Checks {
    /// The parts printed on `page`, each the last of its kind (a page's
    /// summary comes after its lines), whatever the field's anchor.
    fn of(page: &Page<'_>) -> Self {
        let mut checks = Self::none();
        for l in 0..page.lines.len() {
            let label = page.label(l);
            if label.is_empty() {
                continue;
            }
            let Some((amount, _)) = page.amount_of(l) else {
                continue;
            };
            let cents = amount.cents;
            let (sum, paid) = (&mut checks.sum_words, &mut checks.paid_words);
            match page.part_of_total(l) {
                Kind::Part(Part::Tendered) => {
                    checks.tendered = Some(cents);
                    span(paid, amount.words);
                }
                Kind::Part(Part::Change) => {
                    checks.change = Some(cents);
                    span(paid, amount.words);
                }
                Kind::Part(Part::Subtotal) => {
                    checks.subtotal = Some(cents);
                    span(sum, amount.words);
                }
                Kind::Part(Part::Tax) => {
                    checks.tax = cents;
                    span(sum, amount.words);
                }
                Kind::Part(Part::Discount) => {
                    checks.discount = cents.abs();
                    span(sum, amount.words);
                }
                // A rounding is to the nearest 5 or 10 cents: a larger one
                // is a line misread, or read beside another's amount.
                Kind::Part(Part::Rounding) if cents.abs() < 10 => {
                    checks.rounding = cents;
                    span(sum, amount.words);
                }
                Kind::Total if label.iter().any(|w| w.contains("total")) => {
                    checks.total = checks.total.or(Some(cents))
                }
                _ => {}
            }
        }
        checks
    }

    /// No parts known: nothing to check.
    fn none() -> Self {
        Checks {
            tendered: None,
            change: None,
            subtotal: None,
            total: None,
            tax: 0,
            discount: 0,
            rounding: 0,
            sum_words: None,
            paid_words: None,
        }
    }

    /// The total the page's parts give, where they are its words, and
    /// how: tendered − change, or the sub-total with its tax, discount
    /// and rounding (as printed, sign and all). `None` when the page
    /// gives neither, or the two disagree.
    fn computed(&self) -> Option<(i64, [usize; 2], &'static str)> {
        let adjusted = self.tax != 0 || self.rounding != 0 || self.discount != 0;
        let by_sum = (self.subtotal.filter(|_| adjusted))
            .map(|s| s + self.tax - self.discount + self.rounding)
            .filter(|&total| total > 0);
        let by_change = self.tendered_less_change();
        match (by_sum, by_change) {
            (Some(sum), Some(paid)) if sum != paid => None,
            (Some(sum), _) => Some((
                sum,
                self.sum_words?,
                "sub-total + tax + rounding − discount",
            )),
            (None, Some(paid)) => Some((paid, self.paid_words?, "tendered − change")),
            (None, None) => None,
        }
    }

    /// Tendered − change, when the page prints both and they make sense.
    fn tendered_less_change(&self) -> Option<i64> {
        let (tendered, change) = (self.tendered?, self.change?);
        (tendered > 0 && (0..tendered).contains(&change)).then_some(tendered - change)
    }

    /// Every total the page's arithmetic gives.
    fn totals(&self) -> Vec<i64> {
        let adjusted = self.tax != 0 || self.rounding != 0 || self.discount != 0;
        let sums = self.sums().into_iter().filter(|_| adjusted);
        (self.tendered_less_change().into_iter())
            .chain(sums)
            .chain(self.rounded())
            .collect()
    }

    /// The sums the sub-total and its adjustments can make (a rounding is
    /// printed with its sign or without it).
    fn sums(&self) -> Vec<i64> {
        let Some(subtotal) = self.subtotal else {
            return Vec::new();
        };
        let base = subtotal + self.tax - self.discount;
        vec![base + self.rounding, base - self.rounding]
    }

    /// A total and its rounding: what is paid once rounded.
    fn rounded(&self) -> Vec<i64> {
        match (self.total, self.rounding) {
            (Some(total), rounding) if rounding != 0 => vec![total + rounding, total - rounding],
            _ => Vec::new(),
        }
    }

    /// The check `cents` passes, if any.
    fn confirms(&self, cents: i64) -> Option<&'static str> {
        if self.tendered_less_change() == Some(cents) {
            return Some("tendered − change");
        }
        if self.rounded().contains(&cents) {
            return Some("total + rounding");
        }
        let adjusted = self.tax != 0 || self.rounding != 0 || self.discount != 0;
        (adjusted && self.sums().contains(&cents))
            .then_some("sub-total + tax + rounding − discount")
    }

    /// True when the page's arithmetic gives an amount and `cents` is not it.
    fn contradicts(&self, cents: i64) -> bool {
        let by_change = self.tendered_less_change().is_some_and(|t| t != cents);
        let adjusted = self.tax != 0 || self.rounding != 0 || self.discount != 0;
        let by_sum = adjusted && !self.sums().contains(&cents);
        by_change || by_sum
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout;
    use super::*;

    /// A page of text lines, each word positioned: `lines` of `(label,
    /// amount)` with the amounts in a column of their own, read after the
    /// labels (as OCR reads a receipt's two columns).
    fn receipt(lines: &[(&str, &str)]) -> Vec<WordRef<'static>> {
        let mut words = Vec::new();
        for (row, (label, _)) in lines.iter().enumerate() {
            let y = row as f64 * 20.0;
            for (i, w) in label.split_whitespace().enumerate() {
                let x = i as f64 * 60.0;
                let text: &'static str = Box::leak(w.to_owned().into_boxed_str());
                words.push(WordRef {
                    text,
                    page: 0,
                    bbox: Some([x, y, x + 50.0, y + 12.0]),
                    confidence: Some(0.95),
                });
            }
        }
        for (row, (_, amount)) in lines.iter().enumerate() {
            if amount.is_empty() {
                continue;
            }
            let y = row as f64 * 20.0 + 1.0;
            let text: &'static str = Box::leak(amount.to_string().into_boxed_str());
            words.push(WordRef {
                text,
                page: 0,
                bbox: Some([500.0, y, 560.0, y + 12.0]),
                confidence: Some(0.9),
            });
        }
        words
    }

    fn total(words: &[WordRef<'_>], anchor: &str) -> ExtractedValue {
        let page = Page::new(words, layout::lines(words, None));
        page.money(anchor).expect("a total")
    }

    #[test]
    fn the_total_is_the_final_amount_not_the_first_line_with_the_anchor() {
        let words = receipt(&[
            ("ELEGANT BAG", "80.91"),
            ("TOTAL QTY: 1", "80.91"),
            ("TOTAL SALES (EXCLUDING GST) :", "80.91"),
            ("DISCOUNT :", "0.00"),
            ("TOTAL GST :", "0.00"),
            ("ROUNDING", "-0.01"),
            ("TOTAL SALES (INCLUSIVE OF GST) :", "80.90"),
            ("CASH :", "100.00"),
            ("CHANGE :", "19.10"),
        ]);
        let value = total(&words, "TOTAL");
        assert_eq!(value.value, "80.90");
        assert_eq!(value.raw.as_deref(), Some("80.90"));
        let confidence = value.confidence.unwrap();
        assert!(confidence >= 0.8, "{confidence}: {value:?}");
        assert!(value.chosen.unwrap().rule.contains("tendered − change"));
    }

    #[test]
    fn a_close_call_or_a_failed_check_is_unsure() {
        // Two plain totals, and the cash and change say neither.
        let words = receipt(&[
            ("TOTAL", "57.00"),
            ("TOTAL", "18.90"),
            ("CASH", "50.00"),
            ("CHANGE", "1.10"),
        ]);
        let value = total(&words, "TOTAL");
        assert!(value.confidence.unwrap() < 0.8, "{value:?}");
        // The anchor on a sub-total only.
        let words = receipt(&[("SUB-TOTAL", "12.00"), ("CASH", "20.00")]);
        let value = total(&words, "TOTAL");
        assert_eq!(value.value, "12.00");
        assert!(value.confidence.unwrap() < 0.5, "{value:?}");
    }

    #[test]
    fn a_total_the_page_does_not_show_is_computed_from_its_parts_and_flagged() {
        // The total's own line was not read; the tax summary's `TOTAL:`
        // line ends with the tax, not the total.
        let words = receipt(&[
            ("SUB-TOTAL (EX) :", "26.00"),
            ("TOTAL TAX", "1.56"),
            ("ROUNDING", "-0.01"),
            ("CASH", ""),
            ("GST SUMMARY", ""),
            ("TOTAL: 26.00", "1.56"),
        ]);
        let value = total(&words, "TOTAL");
        assert_eq!(value.value, "27.55", "{value:?}");
        assert_eq!(value.raw, None, "printed nowhere: {value:?}");
        let confidence = value.confidence.unwrap();
        assert!(confidence < 0.8, "a computed total is checked: {value:?}");
        // Shown where its parts are: from the sub-total to the rounding.
        let [first, last] = value.words.unwrap();
        assert_eq!((words[first].text, words[last].text), ("26.00", "-0.01"));
        let rule = value.chosen.unwrap().rule;
        assert!(rule.starts_with("computed as sub-total + tax"), "{rule}");

        // A total read wins over the computed one, checked or not.
        let words = receipt(&[("SUB-TOTAL", "26.00"), ("TAX", "1.56"), ("TOTAL", "27.50")]);
        let value = total(&words, "TOTAL");
        assert_eq!(value.value, "27.50");
        assert!(value.confidence.unwrap() < 0.8, "contradicted: {value:?}");
        // Parts that disagree with each other give no total.
        let words = receipt(&[
            ("SUB-TOTAL", "26.00"),
            ("TAX", "1.56"),
            ("CASH", "50.00"),
            ("CHANGE", "20.00"),
        ]);
        let page = Page::new(&words, layout::lines(&words, None));
        let value = page.money("TOTAL").unwrap();
        assert_eq!(value.value, "26.00", "the sub-total, weakly: {value:?}");
        assert!(value.confidence.unwrap() <= sure::WEAK);
    }

    #[test]
    fn the_amount_may_sit_on_the_next_line() {
        let words = receipt(&[("GRAND TOTAL", ""), ("RM", "39.60"), ("Thank you", "")]);
        assert_eq!(total(&words, "total").value, "39.60");
    }

    #[test]
    fn a_field_anchored_on_a_part_asks_for_that_part() {
        let words = receipt(&[("Subtotal", "10.00"), ("Tax", "0.60"), ("Total", "10.60")]);
        assert_eq!(total(&words, "Subtotal").value, "10.00");
        assert_eq!(total(&words, "Total").value, "10.60");
        assert!(total(&words, "Total").confidence.unwrap() >= 0.9);
    }

    #[test]
    fn dates_are_read_in_any_common_format_and_returned_as_iso() {
        let words = receipt(&[
            ("TEL 07-3523888", ""),
            ("Date: 25 Dec 2018", ""),
            ("Valid until 31/01/2019", ""),
        ]);
        let page = Page::new(&words, layout::lines(&words, None));
        let date = page.date(None).unwrap();
        assert_eq!(date.value, "2018-12-25");
        assert_eq!(date.raw.as_deref(), Some("25 Dec 2018"));
        assert!(date.confidence.unwrap() >= 0.8);
        // Two anchored dates one under the other: each field its own.
        let words = receipt(&[("Invoice Date 2026-11-15", ""), ("Due Date 2026-12-15", "")]);
        let page = Page::new(&words, layout::lines(&words, None));
        let invoiced = page.date(Some("Invoice Date")).unwrap();
        assert_eq!(invoiced.value, "2026-11-15");
        assert!(invoiced.confidence.unwrap() >= 0.9, "{invoiced:?}");
        assert_eq!(page.date(Some("Due Date")).unwrap().value, "2026-12-15");
        let words = receipt(&[("Date:25/12/2018", "")]);
        let page = Page::new(&words, layout::lines(&words, None));
        assert_eq!(page.date(None).unwrap().value, "2018-12-25");
    }
}
