//! What a client submits: a document, the fields to extract from it, and where to
//! report. Validation lives here so every intake path (HTTP, WebSocket, Kafka)
//! refuses the same bad input with the same message.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// Most field specs one request may carry.
pub const MAX_FIELDS: usize = 100;
/// Longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// Whether `key` can name a job: 1 to [`MAX_IDEMPOTENCY_KEY_LEN`] visible ASCII
/// characters (what an HTTP header carries), whichever intake it came through.
pub fn idempotency_key_is_valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && key.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// Longest pattern accepted, in bytes; the compiled regex is size-limited too.
pub const MAX_PATTERN_LEN: usize = 512;

/// One extraction job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractionRequest {
    /// The document to read.
    pub document: Document,
    /// The fields to extract, in the order they are reported.
    pub fields: Vec<FieldSpec>,
    /// Where to report the terminal state; delivered by a later stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// Opaque client data, echoed back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// The extractor to run: `rules` (the built-in one, the default) or the
    /// name of an extractor in the settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extractor: Option<String>,
}

/// The built-in rule extractor's name, used when a request names none.
pub const RULES_EXTRACTOR: &str = "rules";

/// Longest extractor name, in bytes.
pub const MAX_EXTRACTOR_NAME_LEN: usize = 64;

/// Whether `name` can name an extractor: 1 to 64 of `a-z`, `0-9`, `-`, `_`
/// (it becomes part of environment variables and metric labels).
pub fn extractor_name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_EXTRACTOR_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A document either as plain text or as pages of OCR words with geometry.
/// Exactly one of the two is present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// Plain text; values extracted from it have no bounding boxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Pages of positioned words, in reading order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<Vec<Page>>,
}

/// One page of positioned words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// Page width in the unit of the boxes (points, pixels: the client's choice).
    pub width: f64,
    /// Page height in the same unit.
    pub height: f64,
    /// Words in reading order.
    pub words: Vec<Word>,
}

/// A word and its box `[x0, y0, x1, y1]` (top-left origin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Word {
    /// The word's text, without surrounding whitespace.
    pub text: String,
    /// Bounding box `[x0, y0, x1, y1]`.
    pub bbox: [f64; 4],
}

/// What to extract and how to find it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Key of the value in the result; unique within a request.
    pub name: String,
    /// How the value is recognised and normalised.
    #[serde(rename = "type", default)]
    pub field_type: FieldType,
    /// A regular expression; capture group 1, if any, is the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Words that precede the value ("Invoice number", "Total"); the value is the
    /// first match after them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    /// When true, a document without this field fails the extraction.
    #[serde(default)]
    pub required: bool,
}

/// The kinds of value the rule extractor recognises.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldType {
    /// One word, or the pattern's match.
    #[default]
    String,
    /// A decimal number.
    Number,
    /// An amount with two decimals, optionally with a currency sign.
    Money,
    /// A date such as 2026-11-30, 30/11/2026 or 30.11.2026.
    Date,
}

/// A word of the document flattened across pages, as extractors see it.
#[derive(Debug, Clone, PartialEq)]
pub struct WordRef<'a> {
    /// The word's text.
    pub text: &'a str,
    /// Page index (0 for a text document).
    pub page: usize,
    /// Its box, when the document has geometry.
    pub bbox: Option<[f64; 4]>,
}

/// Why a request was refused. Messages are shown to clients as they are.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// Neither or both of `document.text` and `document.pages` were given.
    #[error("document must have exactly one of `text` or `pages`")]
    DocumentShape,
    /// The document has no words at all.
    #[error("document is empty")]
    EmptyDocument,
    /// A word box is not finite or not ordered.
    #[error("page {page} word {word}: bbox must be finite with x0 <= x1 and y0 <= y1")]
    BadBox {
        /// Page index.
        page: usize,
        /// Word index within the page.
        word: usize,
    },
    /// `fields` is empty or too long.
    #[error("fields must list between 1 and {MAX_FIELDS} field specs")]
    FieldCount,
    /// A field name is empty or repeated.
    #[error("field name {0:?} is empty or repeated")]
    FieldName(String),
    /// A field has neither a pattern nor an anchor.
    #[error(
        "field {0:?} needs a `pattern` or an `anchor` (the rules extractor finds values by them)"
    )]
    FieldRule(String),
    /// The extractor's name cannot name one.
    #[error("extractor must be 1 to 64 of a-z, 0-9, - and _")]
    ExtractorName,
    /// A pattern does not compile or is too long.
    #[error("field {name:?}: invalid pattern: {reason}")]
    Pattern {
        /// Field name.
        name: String,
        /// What the regex compiler said.
        reason: String,
    },
    /// The webhook URL is not an absolute http(s) URL.
    #[error("webhook_url must be an absolute http or https URL")]
    WebhookUrl,
}

impl ExtractionRequest {
    /// Checks everything the pipeline will rely on, so a job that was accepted can
    /// only fail for reasons of its content, never of its shape.
    pub fn validate(&self) -> Result<(), RequestError> {
        self.document.validate()?;
        if self.fields.is_empty() || self.fields.len() > MAX_FIELDS {
            return Err(RequestError::FieldCount);
        }
        if !extractor_name_is_valid(self.extractor_name()) {
            return Err(RequestError::ExtractorName);
        }
        let rules = self.extractor_name() == RULES_EXTRACTOR;
        let mut names = HashSet::new();
        for field in &self.fields {
            field.validate(rules)?;
            if !names.insert(field.name.as_str()) {
                return Err(RequestError::FieldName(field.name.clone()));
            }
        }
        if let Some(url) = &self.webhook_url {
            let parsed = reqwest::Url::parse(url).map_err(|_| RequestError::WebhookUrl)?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                return Err(RequestError::WebhookUrl);
            }
        }
        Ok(())
    }
}

impl ExtractionRequest {
    /// The extractor this request asks for.
    pub fn extractor_name(&self) -> &str {
        self.extractor.as_deref().unwrap_or(RULES_EXTRACTOR)
    }
}

impl Document {
    fn validate(&self) -> Result<(), RequestError> {
        match (&self.text, &self.pages) {
            (Some(text), None) if text.trim().is_empty() => Err(RequestError::EmptyDocument),
            (Some(_), None) => Ok(()),
            (None, Some(pages)) => {
                for (p, page) in pages.iter().enumerate() {
                    for (w, word) in page.words.iter().enumerate() {
                        let [x0, y0, x1, y1] = word.bbox;
                        let finite = word.bbox.iter().all(|v| v.is_finite());
                        if !finite || x0 > x1 || y0 > y1 {
                            return Err(RequestError::BadBox { page: p, word: w });
                        }
                    }
                }
                if pages.iter().all(|p| p.words.is_empty()) {
                    return Err(RequestError::EmptyDocument);
                }
                Ok(())
            }
            _ => Err(RequestError::DocumentShape),
        }
    }

    /// The document's words in reading order, across pages.
    pub fn words(&self) -> Vec<WordRef<'_>> {
        if let Some(pages) = &self.pages {
            let positioned = pages.iter().enumerate().flat_map(|(page, p)| {
                p.words.iter().map(move |w| WordRef {
                    text: w.text.as_str(),
                    page,
                    bbox: Some(w.bbox),
                })
            });
            return positioned.collect();
        }
        let text = self.text.as_deref().unwrap_or_default();
        let plain = text.split_whitespace().map(|text| WordRef {
            text,
            page: 0,
            bbox: None,
        });
        plain.collect()
    }
}

impl FieldSpec {
    /// `rules`: the rule extractor will run it, so it needs a way to find the
    /// value; other extractors may take the name (and type) alone.
    fn validate(&self, rules: bool) -> Result<(), RequestError> {
        if self.name.trim().is_empty() || self.name.len() > 128 {
            return Err(RequestError::FieldName(self.name.clone()));
        }
        let no_anchor = self.anchor.as_deref().is_none_or(|a| a.trim().is_empty());
        if rules && self.pattern.is_none() && no_anchor {
            return Err(RequestError::FieldRule(self.name.clone()));
        }
        if let Some(pattern) = &self.pattern {
            let invalid = |reason: String| RequestError::Pattern {
                name: self.name.clone(),
                reason,
            };
            if pattern.len() > MAX_PATTERN_LEN {
                return Err(invalid(format!("longer than {MAX_PATTERN_LEN} bytes")));
            }
            super::pattern::compile(pattern).map_err(|e| invalid(e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_request(fields: serde_json::Value) -> ExtractionRequest {
        serde_json::from_value(serde_json::json!({
            "document": {"text": "Invoice number INV-7 Total 12.50"},
            "fields": fields,
        }))
        .unwrap()
    }

    #[test]
    fn accepts_a_minimal_request() {
        let req = text_request(
            serde_json::json!([{"name": "total", "type": "money", "anchor": "Total"}]),
        );
        assert_eq!(req.validate(), Ok(()));
    }

    #[test]
    fn refuses_bad_shapes_with_their_reason() {
        let mut req = text_request(serde_json::json!([{"name": "x"}]));
        assert_eq!(req.validate(), Err(RequestError::FieldRule("x".into())));
        req.extractor = Some("ocr".into());
        assert_eq!(req.validate(), Ok(()), "a model service needs no pattern");
        req.extractor = Some("OCR!".into());
        assert_eq!(req.validate(), Err(RequestError::ExtractorName));
        let req = text_request(serde_json::json!([{"name": "x", "pattern": "("}]));
        assert!(matches!(req.validate(), Err(RequestError::Pattern { .. })));
        let req = text_request(serde_json::json!([
            {"name": "x", "anchor": "a"}, {"name": "x", "anchor": "b"}
        ]));
        assert_eq!(req.validate(), Err(RequestError::FieldName("x".into())));
        let mut req = text_request(serde_json::json!([{"name": "x", "anchor": "a"}]));
        req.webhook_url = Some("ftp://example.com/hook".into());
        assert_eq!(req.validate(), Err(RequestError::WebhookUrl));
        req.webhook_url = None;
        req.document.pages = Some(vec![]);
        assert_eq!(req.validate(), Err(RequestError::DocumentShape));
    }

    #[test]
    fn words_flatten_pages_in_order() {
        let doc: Document = serde_json::from_value(serde_json::json!({"pages": [
            {"width": 100.0, "height": 100.0, "words": [{"text": "a", "bbox": [0.0, 0.0, 1.0, 1.0]}]},
            {"width": 100.0, "height": 100.0, "words": [{"text": "b", "bbox": [2.0, 2.0, 3.0, 3.0]}]}
        ]}))
        .unwrap();
        let words = doc.words();
        assert_eq!(words.len(), 2);
        assert_eq!((words[1].text, words[1].page), ("b", 1));
    }
}
