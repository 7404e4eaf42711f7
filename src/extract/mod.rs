//! Extraction itself: the [`Extractor`] trait, the built-in rule extractor, and
//! bbox grounding (mapping each extracted value back to the words it came from).

mod bbox;
mod rule;

pub use bbox::{ground, GroundedField, Grounding};
pub use rule::{extract_sync as rule_extract, RuleExtractor};

use std::collections::BTreeMap;
use std::future::Future;

use serde::{Deserialize, Serialize};

use crate::domain::ExtractionRequest;

/// One extracted value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExtractedValue {
    /// Normalised value: `1234.50` for money, `2026-11-30` for dates.
    pub value: String,
    /// The text as it appears in the document.
    pub raw: String,
    /// First and last index (inclusive) of the words it spans, in reading order.
    pub words: [usize; 2],
}

/// What an extractor returns: each requested field, found or not (`null`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtractionOutput {
    /// Values by field name.
    pub fields: BTreeMap<String, Option<ExtractedValue>>,
}

/// Why an extraction failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExtractError {
    /// Something the extractor depends on failed; a later attempt may succeed.
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
}

impl ExtractError {
    /// True when retrying the job may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Turns a request into values.
pub trait Extractor: Send + Sync + 'static {
    /// Extracts every field of `request`.
    fn extract(
        &self,
        request: &ExtractionRequest,
    ) -> impl Future<Output = Result<ExtractionOutput, ExtractError>> + Send;
}
