//! The deterministic rule extractor. A field with a pattern of its own is
//! found by it, searched after an optional anchor phrase, over the
//! document's words joined by single spaces: every match maps back to exact
//! word indices, which is what bbox grounding needs. A typed field without
//! one is chosen among every candidate on the page ([`choose`]): a `money`
//! field with an anchor, and a `date` field, read the page's lines
//! ([`layout`]) for the amount or the date the document means.
//!
//! [`choose`]: super::choose
//! [`layout`]: super::layout

use super::choose::Page;
use super::{layout, Deadline, ExtractError, ExtractedValue, ExtractionOutput, ResultSize};
use crate::domain::pattern::{self, Found, Pattern};
use crate::domain::{
    ExtractionRequest, FieldSpec, FieldType, RequestLimits, ResultLimits, WordRef,
};

/// What one run of the rule extractor may use: the compiled-pattern limit it
/// was validated with, and the result limits.
#[derive(Debug, Clone, Copy)]
pub struct RuleBudget {
    /// Largest compiled pattern, in bytes.
    pub program_bytes: usize,
    /// How large the result may be.
    pub result: ResultLimits,
}

impl Default for RuleBudget {
    fn default() -> Self {
        Self {
            program_bytes: RequestLimits::DEFAULT.pattern_program_bytes,
            result: ResultLimits::DEFAULT,
        }
    }
}

/// The document's words joined by single spaces, with each word's byte range.
struct JoinedText {
    text: String,
    spans: Vec<(usize, usize)>,
}

impl JoinedText {
    fn new(words: &[WordRef<'_>]) -> Self {
        let mut text = String::new();
        let mut spans = Vec::with_capacity(words.len());
        for word in words {
            if !text.is_empty() {
                text.push(' ');
            }
            spans.push((text.len(), text.len() + word.text.len()));
            text.push_str(word.text);
        }
        Self { text, spans }
    }

    /// Indices of the first and last word overlapping `start..end`.
    fn word_range(&self, start: usize, end: usize) -> Option<[usize; 2]> {
        let first = self.spans.iter().position(|&(s, e)| e > start && s < end)?;
        let last = self
            .spans
            .iter()
            .rposition(|&(s, e)| e > start && s < end)?;
        Some([first, last])
    }
}

/// Runs every field spec over the document within `budget` and `deadline`;
/// a `required` field that is not found fails the extraction.
pub fn extract(
    request: &ExtractionRequest,
    budget: &RuleBudget,
    deadline: &Deadline,
) -> Result<ExtractionOutput, ExtractError> {
    let output = find_fields(request, budget, deadline)?;
    super::check_required(request, &output)?;
    Ok(output)
}

/// [`extract`] with the default limits and no deadline: for tools and tests.
pub fn rule_extract(request: &ExtractionRequest) -> Result<ExtractionOutput, ExtractError> {
    extract(request, &RuleBudget::default(), &Deadline::none())
}

/// Runs every field spec over the document, reporting what was not found as
/// `null` whether it is required or not. The deadline is checked before
/// each search, and the result's size after each field, so neither a slow
/// document nor a pattern that matches everything runs on unchecked.
pub fn find_fields(
    request: &ExtractionRequest,
    budget: &RuleBudget,
    deadline: &Deadline,
) -> Result<ExtractionOutput, ExtractError> {
    let words = request.document.words();
    let joined = JoinedText::new(&words);
    let mut page = None;
    let mut output = ExtractionOutput::default();
    let mut size = ResultSize::new(budget.result);
    for field in &request.fields {
        deadline.check()?;
        let value = match chosen(field) {
            Some(choice) => {
                let text = request.document.text.as_deref();
                let page =
                    page.get_or_insert_with(|| Page::new(&words, layout::lines(&words, text)));
                match choice {
                    Chosen::Money(anchor) => page.money(anchor),
                    Chosen::Date(anchor) => page.date(anchor),
                }
            }
            None => find(field, &joined, budget.program_bytes, deadline)?,
        };
        // How a value was chosen is for the values a person is to check:
        // a sure one goes without it (it is most of a result's bytes).
        let value = value.map(|mut v| {
            if v.confidence.is_some_and(|c| c >= request.min_confidence()) {
                v.chosen = None;
            }
            v
        });
        size.add(&field.name, &value)?;
        output.fields.insert(field.name.clone(), value);
    }
    Ok(output)
}

/// How a field is chosen among the page's candidates, when it is.
enum Chosen<'a> {
    /// A `money` field's amount, by its anchor.
    Money(&'a str),
    /// A `date` field's date, by its anchor if it has one.
    Date(Option<&'a str>),
}

/// Whether `field` is chosen among candidates: a typed field without a
/// pattern of its own (a pattern says exactly what to take).
fn chosen(field: &FieldSpec) -> Option<Chosen<'_>> {
    let anchor = field.anchor.as_deref().filter(|a| !a.trim().is_empty());
    match (field.field_type, &field.pattern, anchor) {
        (FieldType::Money, None, Some(anchor)) => Some(Chosen::Money(anchor)),
        (FieldType::Date, None, anchor) => Some(Chosen::Date(anchor)),
        _ => None,
    }
}

fn find(
    field: &FieldSpec,
    doc: &JoinedText,
    program_bytes: usize,
    deadline: &Deadline,
) -> Result<Option<ExtractedValue>, ExtractError> {
    let compile = |pattern: &str| {
        pattern::compile(pattern, program_bytes).map_err(|e| ExtractError::Pattern {
            name: field.name.clone(),
            reason: e.to_string(),
        })
    };
    deadline.check()?;
    let start = match &field.anchor {
        Some(anchor) => match search(&*compile(&anchor_pattern(anchor))?, doc, 0, deadline)? {
            Some(found) => found.whole.end,
            None => return Ok(None),
        },
        None => 0,
    };
    let pattern = match &field.pattern {
        Some(p) => compile(p)?,
        None => compile(default_pattern(field.field_type))?,
    };
    deadline.check()?;
    let found = search(&pattern, doc, start, deadline)?;
    Ok(found.and_then(|found| first_value(found, field.field_type, doc)))
}

/// The first match of `pattern` in `doc` at or after `start`, unless the
/// deadline passes first (checked as the search goes over a long text: one
/// search can otherwise take seconds).
fn search(
    pattern: &Pattern,
    doc: &JoinedText,
    start: usize,
    deadline: &Deadline,
) -> Result<Option<Found>, ExtractError> {
    pattern
        .captures(&doc.text, start, &mut || deadline.check().is_ok())
        .map_err(|_| deadline.exceeded())
}

/// The anchor's words, case-insensitive, separated by any whitespace, starting
/// at a word boundary.
fn anchor_pattern(anchor: &str) -> String {
    let words: Vec<String> = anchor.split_whitespace().map(regex::escape).collect();
    format!(r"(?i)(?:^|\s){}", words.join(r"\s+"))
}

fn default_pattern(field_type: FieldType) -> &'static str {
    match field_type {
        FieldType::String => r"\S+",
        FieldType::Number => r"-?\d+(?:\.\d+)?",
        FieldType::Money => r"[$€£]?(\d{1,3}(?:,\d{3})+\.\d{2}|\d+\.\d{2})",
        FieldType::Date => r"\d{4}-\d{2}-\d{2}|\d{1,2}[./]\d{1,2}[./]\d{4}",
    }
}

fn first_value(found: Found, field_type: FieldType, doc: &JoinedText) -> Option<ExtractedValue> {
    let whole = found.whole;
    let value = found.group1.unwrap_or(whole.clone());
    let words = doc.word_range(whole.start, whole.end.max(whole.start + 1))?;
    Some(ExtractedValue {
        value: normalise(field_type, &doc.text[value]),
        raw: Some(doc.text[whole].to_owned()),
        words: Some(words),
        confidence: None,
        chosen: None,
    })
}

fn normalise(field_type: FieldType, raw: &str) -> String {
    match field_type {
        FieldType::String => raw.to_owned(),
        FieldType::Number | FieldType::Money => raw
            .chars()
            .filter(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
            .collect(),
        FieldType::Date => normalise_date(raw).unwrap_or_else(|| raw.to_owned()),
    }
}

/// `30/11/2026` and `30.11.2026` (day first) become `2026-11-30`.
fn normalise_date(raw: &str) -> Option<String> {
    let parts: Vec<&str> = raw.split(['/', '.']).collect();
    match parts.as_slice() {
        [day, month, year] if year.len() == 4 => {
            let (d, m): (u32, u32) = (day.parse().ok()?, month.parse().ok()?);
            Some(format!("{year}-{m:02}-{d:02}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str, fields: serde_json::Value) -> ExtractionRequest {
        serde_json::from_value(serde_json::json!({"document": {"text": text}, "fields": fields}))
            .unwrap()
    }

    #[test]
    fn anchors_types_and_word_indices() {
        let req = request(
            "ACME Invoice number INV-0042 Date 30/11/2026 Subtotal $1,000.00 Total $1,234.50",
            serde_json::json!([
                {"name": "number", "anchor": "invoice number"},
                {"name": "date", "type": "date", "anchor": "Date"},
                {"name": "total", "type": "money", "anchor": "Total"},
                {"name": "vendor", "pattern": "^(\\S+)"},
                {"name": "po", "anchor": "PO"}
            ]),
        );
        let out = rule_extract(&req).unwrap();
        let get = |k: &str| out.fields[k].clone();
        assert_eq!(get("number").unwrap().value, "INV-0042");
        assert_eq!(get("number").unwrap().words, Some([3, 3]));
        assert_eq!(get("date").unwrap().value, "2026-11-30");
        let total = get("total").unwrap();
        assert_eq!(
            (total.value.as_str(), total.raw.as_deref(), total.words),
            ("1234.50", Some("$1,234.50"), Some([9, 9]))
        );
        assert_eq!(get("vendor").unwrap().value, "ACME");
        assert_eq!(get("po"), None);
    }

    #[test]
    fn one_slow_search_ends_at_the_deadline_not_seconds_past_it() {
        // 1 MiB of words with accents: the Unicode \b makes the lazy DFA
        // quit, and this pattern's one search took ~6 s here, checked
        // against the deadline only once it was over.
        let words = ["lörem", "ipsüm", "dolor", "sít", "амет", "invoice", "12,50"];
        let text: Vec<&str> = words.iter().cycle().take(150_000).copied().collect();
        let req = request(
            &text.join(" "),
            serde_json::json!([{"name": "slow", "pattern": "\\b(?s:.){0,1041}\\p{Greek}"}]),
        );
        let deadline = Deadline::after(std::time::Duration::from_millis(100));
        let started = std::time::Instant::now();
        let outcome = extract(&req, &RuleBudget::default(), &deadline);
        let took = started.elapsed();
        assert_eq!(outcome, Err(ExtractError::DeadlineExceeded(0.1)));
        assert!(
            took < std::time::Duration::from_millis(400),
            "ended after {took:?}"
        );
    }

    /// The worst pages a request may send to the choice (10,000 words, the
    /// limit a page has): one line of 5,000 labels and 5,000 amounts, and a
    /// staircase of one-word lines beside a word as tall as the page (which
    /// keeps its line open, so every later word tries every line: 0.2 s
    /// in a debug build). Each is chosen on within a deadline, and the
    /// explanation quotes at most 60 characters of a label: quoting the
    /// whole line put the result past its 64 KiB a field, and failed the
    /// job.
    #[test]
    fn the_worst_page_a_request_may_send_is_chosen_on_within_the_result_limits() {
        let limit = RequestLimits::DEFAULT.words_per_page;
        let word = |text: String, [x0, y0, x1, y1]: [f64; 4]| serde_json::json!({"text": text, "bbox": [x0, y0, x1, y1], "confidence": 0.9});
        let one_line: Vec<_> = (0..limit)
            .map(|i| {
                let text = match i % 2 {
                    0 => "TOTAL".to_owned(),
                    _ => format!("{}.{:02}", i, i % 100),
                };
                word(text, [i as f64 * 50.0, 0.0, i as f64 * 50.0 + 40.0, 10.0])
            })
            .collect();
        let mut staircase = vec![word("TOTAL".into(), [0.0, 0.0, 5.0, 1e6])];
        staircase.extend((1..limit).map(|i| {
            let y = i as f64 * 20.0;
            word(format!("{i}.00"), [10.0, y, 30.0, y + 10.0])
        }));
        for words in [one_line, staircase] {
            let req: ExtractionRequest = serde_json::from_value(serde_json::json!({
                "document": {"pages": [{"width": 1e6, "height": 1e6, "words": words}]},
                "fields": [{"name": "total", "type": "money", "anchor": "TOTAL"},
                           {"name": "date", "type": "date"}],
                "min_confidence": 1.0
            }))
            .unwrap();
            req.validate(&RequestLimits::DEFAULT).unwrap();
            let deadline = Deadline::after(std::time::Duration::from_secs(5));
            let out = extract(&req, &RuleBudget::default(), &deadline).unwrap();
            let total = out.fields["total"].clone().unwrap();
            let rule = total.chosen.unwrap().rule;
            assert!(rule.chars().count() < 300, "{} characters", rule.len());
        }
    }

    #[test]
    fn a_missing_required_field_fails() {
        let req = request(
            "nothing here",
            serde_json::json!([{"name": "total", "type": "money", "anchor": "Total", "required": true}]),
        );
        assert_eq!(
            rule_extract(&req),
            Err(ExtractError::RequiredFieldMissing("total".into()))
        );
    }
}
