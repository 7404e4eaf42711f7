//! Extraction itself: the built-in rule extractor, the HTTP extractor that
//! calls a team's own service over the extractor protocol, bbox grounding (mapping each extracted value back
//! to the words it came from), and the bounded pool where the CPU-bound ones
//! run ([`CpuPool`]). Every result is held to the result limits
//! ([`ResultSize`]), whichever extractor made it.
//!
//! A job names its extractor (`"extractor": "ocr"`, default `rules`); the
//! worker process holds one [`Extractors`] with every configured extractor and
//! its limits, shared by all of the process's records.

mod bbox;
mod choose;
mod cpu;
pub mod deferred;
mod gate;
mod http;
mod layout;
mod limits;
pub mod protocol;
mod registry;
mod rule;
pub mod slots;
pub mod values;

pub use bbox::{ground, iou};
pub use cpu::{CpuPool, Deadline};
pub use http::HttpExtractor;
pub use limits::Limits;
pub use registry::Extractors;
pub use rule::{extract as extract_rules, find_fields, rule_extract, RuleBudget};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::{ExtractionRequest, Lane, ResultLimits};

/// One value found, and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExtractedValue {
    /// Normalised value: `1234.50` for money, `2026-11-30` for dates.
    pub value: String,
    /// The text as it appears in the document, when the extractor knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub raw: Option<String>,
    /// First and last index (inclusive) of the words it spans, in reading
    /// order, when the extractor knows them; bbox grounding needs them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "[usize; 2]")]
    pub words: Option<[usize; 2]>,
    /// How sure the extractor is of the value, from 0 to 1: the least of
    /// its words' OCR confidence and how clear its choice among the
    /// page's candidates was. Absent when the extractor does not say;
    /// bbox refinement then takes the words' confidence alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0), with = "f64")]
    pub confidence: Option<f64>,
    /// How the value was chosen among the candidates on the page, when it
    /// was (a typed field of the rules extractor) and its confidence is
    /// under the request's `min_confidence`: what a reviewer needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Choice")]
    pub chosen: Option<Choice>,
}

/// How a value was chosen: the rule that won and the candidates it was
/// chosen from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Choice {
    /// Why the value won, in words: its label, and the check of the page's
    /// arithmetic that agrees with it, if one does.
    pub rule: String,
    /// The best candidates, best first (at most five), the winner included.
    pub candidates: Vec<Candidate>,
}

/// One value a field could have had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Candidate {
    /// The value, normalised.
    pub value: String,
    /// The words it spans: first and last index.
    pub words: [usize; 2],
    /// Its score: higher is better.
    pub score: f64,
    /// What kind of value its label says it is.
    pub why: String,
}

/// What an extractor returns: each requested field, found or not (`null`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ExtractionResult")]
pub struct ExtractionOutput {
    /// Each requested field by name: its value, or null when it was not found.
    pub fields: BTreeMap<String, Option<ExtractedValue>>,
}

/// One attempt at one job, as an extractor sees it.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    /// The job's id.
    pub id: Uuid,
    /// The claim's attempt number (its fencing token), from 1.
    pub attempt: i32,
    /// What was submitted (shared, so CPU-bound work can take it to its thread).
    pub request: &'a std::sync::Arc<ExtractionRequest>,
    /// Where an HTTP extractor may post the result later instead of answering
    /// with it; `None` when deferred results are off.
    pub callback: Option<&'a deferred::Callback>,
    /// The job's tenant and priority: where its call waits for a slot.
    pub lane: Lane,
    /// Where an extractor of protocol version 2 fetches the job's file, when
    /// its document is one.
    pub file: Option<&'a protocol::FileRef>,
}

/// What an attempt's extraction came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Extracted {
    /// The values, now.
    Output(ExtractionOutput),
    /// The values, and the document they were found in as it was read from
    /// the job's file (kept for bbox refinement).
    Read(ExtractionOutput, crate::domain::Document),
    /// The extractor took the job and will post the result to the job's
    /// callback within this long.
    Deferred(std::time::Duration),
}

/// Why an extraction failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExtractError {
    /// Something the extractor depends on failed or timed out; a later attempt
    /// may succeed.
    #[error("extractor unavailable: {0}")]
    Unavailable(String),
    /// A field marked `required` is not in the document.
    #[error("required field {0:?} not found in the document")]
    RequiredFieldMissing(String),
    /// A pattern failed to compile (validation should have caught it).
    #[error("field {name:?}: {reason}")]
    Pattern {
        /// Field name.
        name: String,
        /// Compiler message.
        reason: String,
    },
    /// The extractor refused the document for good (HTTP 422 or 400).
    #[error("extractor {extractor:?} refused the document: {message}")]
    Refused {
        /// The extractor's name.
        extractor: String,
        /// What it said.
        message: String,
    },
    /// The worker is stopping, and the extraction had not started its call
    /// yet (it was waiting for a slot, a token or a `Retry-After`).
    #[error("the worker stopped before the extractor was called")]
    Interrupted,
    /// The result is past the result limits. The same input would give the
    /// same result, so it is not retried.
    #[error("result_too_large: {0}")]
    ResultTooLarge(String),
    /// CPU-bound extraction ran past its deadline (seconds). The same input
    /// would take as long again, so it is not retried.
    #[error("deadline_exceeded: the extraction ran past its deadline of {0} s (DOCSTREAM_EXTRACTION_DEADLINE_S)")]
    DeadlineExceeded(f64),
    /// The extractor answered success with something that is not a result.
    #[error("extractor {extractor:?} answered with an invalid result: {reason}")]
    InvalidAnswer {
        /// The extractor's name.
        extractor: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ExtractError {
    /// True when retrying the job may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Fails an output that lacks a field its request marked `required`.
pub fn check_required(
    request: &ExtractionRequest,
    output: &ExtractionOutput,
) -> Result<(), ExtractError> {
    let missing = request
        .fields
        .iter()
        .find(|f| f.required && output.fields.get(&f.name).is_none_or(Option::is_none));
    match missing {
        Some(field) => Err(ExtractError::RequiredFieldMissing(field.name.clone())),
        None => Ok(()),
    }
}

/// The size of a result as it is built, held to the result limits: each
/// field's value as JSON, and their sum.
#[derive(Debug)]
pub struct ResultSize {
    limits: ResultLimits,
    total: usize,
}

impl ResultSize {
    /// An empty result under `limits`.
    pub fn new(limits: ResultLimits) -> Self {
        Self { limits, total: 0 }
    }

    /// Adds field `name`'s `value`, or fails once a limit is past.
    pub fn add(&mut self, name: &str, value: &Option<ExtractedValue>) -> Result<(), ExtractError> {
        // A cheap bound first: a value's JSON is at least its text, so a
        // huge match is refused without being serialised.
        let texts = value
            .as_ref()
            .map_or(0, |v| v.value.len() + v.raw.as_ref().map_or(0, String::len));
        let size = match texts > self.limits.field_bytes {
            true => texts,
            false => json_len(value),
        };
        if size > self.limits.field_bytes {
            return Err(ExtractError::ResultTooLarge(format!(
                "field {name:?} is {size} bytes, over the limit of {} bytes per field",
                self.limits.field_bytes
            )));
        }
        self.total = self.total.saturating_add(size + name.len());
        if self.total > self.limits.total_bytes {
            return Err(ExtractError::ResultTooLarge(format!(
                "the result is over the limit of {} bytes (at field {name:?})",
                self.limits.total_bytes
            )));
        }
        Ok(())
    }

    /// Checks a whole result, as an HTTP extractor returns it.
    pub fn check(output: &ExtractionOutput, limits: ResultLimits) -> Result<(), ExtractError> {
        let mut size = Self::new(limits);
        output
            .fields
            .iter()
            .try_for_each(|(name, value)| size.add(name, value))
    }
}

/// The length of `value` as compact JSON, counted without building it: this
/// runs for every field of every job.
fn json_len(value: &impl Serialize) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_measured_as_its_json_and_held_to_both_limits() {
        let value = Some(ExtractedValue {
            value: "1234.50".into(),
            raw: Some("$1,234.50 \"é\"".into()),
            words: Some([3, 4]),
            confidence: None,
            chosen: None,
        });
        assert_eq!(json_len(&value), serde_json::to_vec(&value).unwrap().len());
        let limits = ResultLimits {
            field_bytes: 64,
            total_bytes: 100,
        };
        let mut size = ResultSize::new(limits);
        assert!(size.add("a", &value).is_ok());
        assert!(matches!(
            size.add("b", &value),
            Err(ExtractError::ResultTooLarge(_))
        ));
        let big = Some(ExtractedValue {
            value: "x".repeat(65),
            raw: None,
            words: None,
            confidence: None,
            chosen: None,
        });
        let refused = ResultSize::new(limits).add("c", &big);
        assert!(matches!(refused, Err(ExtractError::ResultTooLarge(_))));
    }
}
