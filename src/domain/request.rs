//! What a client submits: a document, the fields to extract from it, and where to
//! report. Validation lives here so every intake path (HTTP, WebSocket, Kafka)
//! refuses the same bad input with the same message.

use std::collections::HashSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{schema, Priority, RequestLimits};

/// Longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// Whether `key` can name a job: 1 to [`MAX_IDEMPOTENCY_KEY_LEN`] visible ASCII
/// characters (what an HTTP header carries), whichever intake it came through.
pub fn idempotency_key_is_valid(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && key.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// serde_json's own nesting limit: JSON deeper than this does not parse.
const PARSER_DEPTH: usize = 128;

/// One extraction job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtractionRequest {
    /// The document to read.
    pub document: Document,
    /// What to extract, in the order it is reported. Names are unique
    /// within a request (else 422).
    #[schemars(length(min = 1), extend("x-limit" = "max_fields"))]
    pub fields: Vec<FieldSpec>,
    /// Where the terminal state is reported: an absolute http or https URL
    /// with a host, at most {max_url_bytes} bytes. A host that is, or
    /// resolves to, an address webhooks may not reach (loopback, private,
    /// link-local and other special-use addresses, unless
    /// `DOCSTREAM_WEBHOOK_ALLOW` admits it) gets 422; a name that does not
    /// resolve yet is accepted, and judged again before each delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(url, pattern(schema::HTTP_URL), extend("x-limit" = "max_url_bytes"))]
    pub webhook_url: Option<String>,
    /// Opaque client data, echoed in every answer and event: at most
    /// {max_metadata_bytes} bytes as compact JSON, nested at most
    /// {max_json_depth} levels deep (else 422).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "schema::JsonValue")]
    pub metadata: Option<serde_json::Value>,
    /// Who extracts: `rules` (the default) is the built-in rule extractor,
    /// which needs a `pattern` or an `anchor` in every field; any other is an
    /// external extractor of the settings, for which both are hints. An
    /// unknown name gets 422. Names are 1 to 64 of a-z, 0-9, `-` and `_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_EXTRACTOR_NAME_LEN))]
    pub extractor: Option<String>,
    /// `high`, `normal` (the default) or `low`: which waiting work a worker
    /// starts first. A low job is never passed over for longer than the
    /// deployment's bound (`DOCSTREAM_WORKER_PRIORITY_MAX_WAIT_S`). Any other
    /// value gets 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// A grounded value read from words less sure than this (0 to 1, else
    /// 422) is reported but flagged `needs_review`; default 0.8. Only OCR gives words a confidence: a text layer's,
    /// or words sent without one, never need review.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_confidence: Option<f64>,
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

/// A document as plain text, as pages of OCR words with geometry, or as a
/// file the tenant uploaded. Exactly one of the three is present (its schema
/// says so: a [`TextDocument`], a [`PagesDocument`] or an
/// [`ObjectDocument`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// Plain text; values extracted from it have no bounding boxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Pages of positioned words, in reading order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<Vec<Page>>,
    /// The id of a file of the tenant's (`POST /v1/files`): the document is
    /// read from it when the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// An http(s) URL the API fetches the file from at the submit, and
    /// stores as a file of the tenant's; the job then names that file
    /// (`object`). Only `POST /v1/extractions` fetches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl JsonSchema for Document {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Document".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Exactly one of `text`, `pages`, `object` and `url`.",
            "oneOf": [
                generator.subschema_for::<TextDocument>(),
                generator.subschema_for::<PagesDocument>(),
                generator.subschema_for::<ObjectDocument>(),
                generator.subschema_for::<UrlDocument>(),
            ],
        })
    }
}

/// A document of plain text (the schema of a `Document` with `text`).
#[derive(JsonSchema)]
#[schemars(deny_unknown_fields)]
#[allow(dead_code)]
struct TextDocument {
    /// Plain text, not blank, of at most {max_text_words} words (runs of
    /// non-whitespace; more is refused 422 `limit_exceeded`); values found
    /// in it have no boxes.
    #[schemars(pattern(schema::NOT_BLANK))]
    text: String,
    #[schemars(default, with = "()")]
    pages: (),
    #[schemars(default, with = "()")]
    object: (),
    #[schemars(default, with = "()")]
    url: (),
}

/// A document of pages of positioned words (the schema of a `Document`
/// with `pages`).
#[derive(JsonSchema)]
#[schemars(deny_unknown_fields)]
#[allow(dead_code)]
struct PagesDocument {
    /// Pages of positioned words, in reading order; at least one page has a
    /// word.
    #[schemars(
        length(min = 1),
        extend("x-limit" = "max_pages"),
        extend("contains" = {"type": "object", "properties": {"words": {"minItems": 1}}})
    )]
    pages: Vec<Page>,
    #[schemars(default, with = "()")]
    text: (),
    #[schemars(default, with = "()")]
    object: (),
    #[schemars(default, with = "()")]
    url: (),
}

/// A document in a file the tenant uploaded (the schema of a `Document`
/// with `object`).
#[derive(JsonSchema)]
#[schemars(deny_unknown_fields)]
#[allow(dead_code)]
struct ObjectDocument {
    /// The file's id (`POST /v1/files` answers it): a file of the caller's
    /// tenant, else 422. A PDF is read for its text layer, a text file for
    /// its text; an image needs an extractor that does OCR.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    object: String,
    #[schemars(default, with = "()")]
    text: (),
    #[schemars(default, with = "()")]
    pages: (),
    #[schemars(default, with = "()")]
    url: (),
}

/// A document at a URL (the schema of a `Document` with `url`).
#[derive(JsonSchema)]
#[schemars(deny_unknown_fields)]
#[allow(dead_code)]
struct UrlDocument {
    /// An absolute http or https URL of at most {max_url_bytes} bytes. The
    /// API fetches it at the submit through the SSRF guard (a host that
    /// does not resolve, or resolves to a loopback, private, link-local or
    /// other special-use address that `DOCSTREAM_FILE_FETCH_ALLOW` does not
    /// admit, gets 422), following no redirect, within `DOCSTREAM_FILE_FETCH_TIMEOUT_S`
    /// and the file limit (413); what it answers is stored as a file of the
    /// tenant's, known by its bytes, and the job names it (`object`). Only
    /// `POST /v1/extractions` fetches: the import stream and the Kafka
    /// intake refuse it.
    #[schemars(url, pattern(schema::HTTP_URL), extend("x-limit" = "max_url_bytes"))]
    url: String,
    #[schemars(default, with = "()")]
    text: (),
    #[schemars(default, with = "()")]
    pages: (),
    #[schemars(default, with = "()")]
    object: (),
}

/// One page of positioned words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// Page width in the unit of the boxes (points, pixels: the client's choice).
    #[schemars(range(min = -schema::FINITE, max = schema::FINITE))]
    pub width: f64,
    /// Page height in the same unit.
    #[schemars(range(min = -schema::FINITE, max = schema::FINITE))]
    pub height: f64,
    /// Words in reading order.
    #[schemars(extend("x-limit" = "max_words_per_page"))]
    pub words: Vec<Word>,
}

/// A word and its box.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Word {
    /// The word's text, without surrounding whitespace.
    #[schemars(pattern(schema::NO_NUL))]
    pub text: String,
    /// `[x0, y0, x1, y1]`, top-left origin, with x0 <= x1 and y0 <= y1
    /// (else 422).
    #[schemars(inner(range(min = -schema::FINITE, max = schema::FINITE)))]
    pub bbox: [f64; 4],
    /// How sure the reader is of the word, from 0 to 1 (else 422): OCR's
    /// confidence. Absent for a text layer's words, which are certain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: Option<f64>,
}

/// One field to extract, and how to find it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// The value's key in the result: not blank, at most
    /// {max_field_name_bytes} bytes, unique within the request.
    #[schemars(
        length(min = 1),
        pattern(schema::NOT_BLANK),
        extend("x-limit" = "max_field_name_bytes")
    )]
    pub name: String,
    /// How the value is recognised and normalised.
    #[serde(rename = "type", default)]
    pub field_type: FieldType,
    /// A regular expression (Rust `regex` syntax); capture group 1, if any,
    /// is the value. At most {max_pattern_bytes} bytes; one that does not
    /// compile, or compiles to more than {max_pattern_program_bytes} bytes,
    /// gets 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        pattern(schema::NO_NUL),
        extend("format" = "rust-regex", "x-limit" = "max_pattern_bytes")
    )]
    pub pattern: Option<String>,
    /// The words that come before the value ("Invoice number", "Total"); the
    /// value is the first match after them. At most {max_anchor_bytes}
    /// bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(schema::NO_NUL), extend("x-limit" = "max_anchor_bytes"))]
    pub anchor: Option<String>,
    /// When true, a document without this field fails the job.
    #[serde(default)]
    pub required: bool,
}

/// How a value is recognised and normalised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    /// Its reader's confidence (0 to 1), when the reader gave one (OCR).
    pub confidence: Option<f64>,
}

/// Why a request was refused. Messages are shown to clients as they are;
/// [`RequestError::code`] names the kind of refusal for programs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// The body is not JSON at all.
    #[error("not valid JSON: {0}")]
    MalformedJson(String),
    /// JSON that does not describe a request (a wrong type, an unknown field).
    #[error("{0}")]
    Shape(String),
    /// Text that Postgres cannot store and JSON should not carry: a NUL
    /// character, a lone surrogate, bytes that are not UTF-8.
    #[error("{0}: text must not contain NUL characters, lone surrogates or invalid UTF-8")]
    Unrepresentable(String),
    /// JSON nested deeper than its limit.
    #[error("{what} is nested deeper than {limit} levels")]
    TooDeep {
        /// What is too deep.
        what: String,
        /// The limit.
        limit: usize,
    },
    /// A part of the request is past its limit.
    #[error("{what} is larger than the limit of {limit} {unit}")]
    TooLarge {
        /// What is too large.
        what: String,
        /// The limit.
        limit: usize,
        /// What the limit counts: bytes, fields, pages, words.
        unit: &'static str,
    },
    /// Not exactly one of `document.text`, `document.pages`,
    /// `document.object` and `document.url` was given.
    #[error("document must have exactly one of `text`, `pages`, `object` or `url`")]
    DocumentShape,
    /// `document.url` where nothing fetches it (the import stream, the
    /// Kafka intake).
    #[error("document.url is fetched by POST /v1/extractions only: upload the file (POST /v1/files) and name it in document.object")]
    UrlNotFetched,
    /// `document.object` is not a file id.
    #[error("document.object must be a file id: the 64 lower-case hex digits of its SHA-256")]
    FileId,
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
    /// A word's confidence is not a number from 0 to 1.
    #[error("page {page} word {word}: confidence must be a number from 0 to 1")]
    BadConfidence {
        /// Page index.
        page: usize,
        /// Word index within the page.
        word: usize,
    },
    /// `min_confidence` is not a number from 0 to 1.
    #[error("min_confidence must be a number from 0 to 1")]
    BadMinConfidence,
    /// `fields` is empty.
    #[error("fields must list at least one field spec")]
    NoFields,
    /// A field name is empty or repeated.
    #[error("field name {0:?} is empty or repeated")]
    FieldName(String),
    /// A field has neither a pattern nor an anchor.
    #[error(
        "field {0:?} needs a `pattern` or an `anchor` (the rules extractor finds values by them; only a `date` field is found by its type alone)"
    )]
    FieldRule(String),
    /// The extractor's name cannot name one.
    #[error("extractor must be 1 to 64 of a-z, 0-9, - and _")]
    ExtractorName,
    /// A pattern does not compile (or compiles past its size limit).
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

impl RequestError {
    /// The refusal's kind, stable for programs: `malformed_json` (the body
    /// is not JSON), `unrepresentable_text`, `too_deep`, `limit_exceeded`,
    /// or `invalid_request` for everything else.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed_json",
            Self::Unrepresentable(_) => "unrepresentable_text",
            Self::TooDeep { .. } => "too_deep",
            Self::TooLarge { .. } => "limit_exceeded",
            _ => "invalid_request",
        }
    }

    /// Whether the refusal is of the body's syntax (HTTP 400) rather than of
    /// what it says (422).
    pub fn is_syntax(&self) -> bool {
        matches!(self, Self::MalformedJson(_))
    }

    /// Why `text` did not parse as what it should be, from serde_json's error.
    pub fn from_json(error: &serde_json::Error) -> Self {
        let data = matches!(error.classify(), serde_json::error::Category::Data);
        Self::from_json_message(error.to_string(), data)
    }

    /// The same from serde_json's message alone (what a framework's rejection
    /// keeps of it); `data`: the JSON parsed, but does not fit the type.
    /// serde_json reports lone surrogates, invalid UTF-8 and its own depth
    /// limit as syntax errors; they are refusals of content, so 422.
    pub fn from_json_message(message: String, data: bool) -> Self {
        let unrepresentable = ["surrogate", "unicode code point", "hex escape"];
        if unrepresentable.iter().any(|m| message.contains(m)) {
            return Self::Unrepresentable(format!("the JSON ({message})"));
        }
        if message.contains("recursion limit exceeded") {
            return Self::TooDeep {
                what: "the JSON".into(),
                limit: PARSER_DEPTH,
            };
        }
        match data {
            true => Self::Shape(message),
            false => Self::MalformedJson(message),
        }
    }
}

/// The `min_confidence` of a request that names none.
pub const DEFAULT_MIN_CONFIDENCE: f64 = 0.8;

impl ExtractionRequest {
    /// The confidence under which a grounded value needs review.
    pub fn min_confidence(&self) -> f64 {
        self.min_confidence.unwrap_or(DEFAULT_MIN_CONFIDENCE)
    }

    /// `json` as a request, checked against `limits`: what every intake
    /// accepts.
    pub fn from_json(json: &str, limits: &RequestLimits) -> Result<Self, RequestError> {
        let request: Self = serde_json::from_str(json).map_err(|e| RequestError::from_json(&e))?;
        request.validate(limits)?;
        Ok(request)
    }

    /// Checks everything the pipeline will rely on, so a job that was accepted can
    /// only fail for reasons of its content, never of its shape: every part
    /// within `limits`, and no text Postgres cannot store.
    pub fn validate(&self, limits: &RequestLimits) -> Result<(), RequestError> {
        self.document.validate(limits)?;
        if self.fields.is_empty() {
            return Err(RequestError::NoFields);
        }
        within("fields", self.fields.len(), limits.fields, "field specs")?;
        if !extractor_name_is_valid(self.extractor_name()) {
            return Err(RequestError::ExtractorName);
        }
        let rules = self.extractor_name() == RULES_EXTRACTOR;
        let mut names = HashSet::new();
        for (i, field) in self.fields.iter().enumerate() {
            field.validate(i, rules, limits)?;
            if !names.insert(field.name.as_str()) {
                return Err(RequestError::FieldName(field.name.clone()));
            }
        }
        if let Some(url) = &self.webhook_url {
            storable("webhook_url", url)?;
            within("webhook_url", url.len(), limits.url_bytes, "bytes")?;
            let parsed = reqwest::Url::parse(url).map_err(|_| RequestError::WebhookUrl)?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                return Err(RequestError::WebhookUrl);
            }
        }
        if (self.min_confidence).is_some_and(|c| !(0.0..=1.0).contains(&c)) {
            return Err(RequestError::BadMinConfidence);
        }
        if let Some(metadata) = &self.metadata {
            check_json(metadata, "metadata", limits.json_depth)?;
            let size = serde_json::to_vec(metadata).map_or(usize::MAX, |v| v.len());
            within("metadata", size, limits.metadata_bytes, "bytes")?;
        }
        Ok(())
    }
}

/// Refuses `n` past `limit`.
fn within(what: &str, n: usize, limit: usize, unit: &'static str) -> Result<(), RequestError> {
    match n <= limit {
        true => Ok(()),
        false => Err(RequestError::TooLarge {
            what: what.to_owned(),
            limit,
            unit,
        }),
    }
}

/// Refuses text Postgres cannot store. A Rust string is valid UTF-8 without
/// surrogates by construction, so NUL is the one character left to refuse.
fn storable(what: &str, text: &str) -> Result<(), RequestError> {
    match text.contains('\0') {
        true => Err(RequestError::Unrepresentable(what.to_owned())),
        false => Ok(()),
    }
}

/// Refuses `value` nested deeper than `limit` containers, or holding text
/// Postgres cannot store.
fn check_json(value: &serde_json::Value, what: &str, limit: usize) -> Result<(), RequestError> {
    fn walk(
        value: &serde_json::Value,
        what: &str,
        depth: usize,
        limit: usize,
    ) -> Result<(), RequestError> {
        use serde_json::Value;
        let children: Vec<&Value> = match value {
            Value::String(text) => return storable(what, text),
            Value::Array(items) => items.iter().collect(),
            Value::Object(map) => {
                for key in map.keys() {
                    storable(what, key)?;
                }
                map.values().collect()
            }
            _ => return Ok(()),
        };
        if depth >= limit {
            return Err(RequestError::TooDeep {
                what: what.to_owned(),
                limit,
            });
        }
        children
            .into_iter()
            .try_for_each(|child| walk(child, what, depth + 1, limit))
    }
    walk(value, what, 0, limit)
}

impl ExtractionRequest {
    /// The extractor this request asks for.
    pub fn extractor_name(&self) -> &str {
        self.extractor.as_deref().unwrap_or(RULES_EXTRACTOR)
    }
}

impl Document {
    /// Checks the document against `limits`: exactly one form, and within
    /// every limit of its form.
    pub fn validate(&self, limits: &RequestLimits) -> Result<(), RequestError> {
        if self.url.is_some() {
            // Fetched, and replaced by the file it named, before any check
            // of a request that reaches here: only where nothing fetches.
            return match (&self.text, &self.pages, &self.object) {
                (None, None, None) => Err(RequestError::UrlNotFetched),
                _ => Err(RequestError::DocumentShape),
            };
        }
        if let Some(id) = &self.object {
            let hex = |b: u8| matches!(b, b'0'..=b'9' | b'a'..=b'f');
            return match (&self.text, &self.pages) {
                (None, None) if id.len() == 64 && id.bytes().all(hex) => Ok(()),
                (None, None) => Err(RequestError::FileId),
                _ => Err(RequestError::DocumentShape),
            };
        }
        match (&self.text, &self.pages) {
            (Some(text), None) => {
                storable("document.text", text)?;
                let words = text.split_whitespace().take(limits.text_words + 1).count();
                within("document.text", words, limits.text_words, "words")?;
                match text.trim().is_empty() {
                    true => Err(RequestError::EmptyDocument),
                    false => Ok(()),
                }
            }
            (None, Some(pages)) => {
                within("document.pages", pages.len(), limits.pages, "pages")?;
                for (p, page) in pages.iter().enumerate() {
                    let what = || format!("document.pages[{p}].words");
                    within(&what(), page.words.len(), limits.words_per_page, "words")?;
                    for (w, word) in page.words.iter().enumerate() {
                        storable(&format!("document.pages[{p}].words[{w}].text"), &word.text)?;
                        let [x0, y0, x1, y1] = word.bbox;
                        let finite = word.bbox.iter().all(|v| v.is_finite());
                        if !finite || x0 > x1 || y0 > y1 {
                            return Err(RequestError::BadBox { page: p, word: w });
                        }
                        if word.confidence.is_some_and(|c| !(0.0..=1.0).contains(&c)) {
                            return Err(RequestError::BadConfidence { page: p, word: w });
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

    /// Bytes of text the document holds: its text, or its words'.
    pub fn text_bytes(&self) -> usize {
        let words = self.pages.iter().flatten().flat_map(|p| &p.words);
        self.text.as_ref().map_or(0, String::len) + words.map(|w| w.text.len()).sum::<usize>()
    }

    /// The document's words in reading order, across pages (none for a
    /// file, until it is read).
    pub fn words(&self) -> Vec<WordRef<'_>> {
        if let Some(pages) = &self.pages {
            let positioned = pages.iter().enumerate().flat_map(|(page, p)| {
                p.words.iter().map(move |w| WordRef {
                    text: w.text.as_str(),
                    page,
                    bbox: Some(w.bbox),
                    confidence: w.confidence,
                })
            });
            return positioned.collect();
        }
        let text = self.text.as_deref().unwrap_or_default();
        let plain = text.split_whitespace().map(|text| WordRef {
            text,
            page: 0,
            bbox: None,
            confidence: None,
        });
        plain.collect()
    }
}

impl FieldSpec {
    /// Field `index` of its request. `rules`: the rule extractor will run it,
    /// so it needs a way to find the value; other extractors may take the
    /// name (and type) alone.
    fn validate(
        &self,
        index: usize,
        rules: bool,
        limits: &RequestLimits,
    ) -> Result<(), RequestError> {
        let what = |part: &str| format!("fields[{index}].{part}");
        storable(&what("name"), &self.name)?;
        within(
            &what("name"),
            self.name.len(),
            limits.field_name_bytes,
            "bytes",
        )?;
        if self.name.trim().is_empty() {
            return Err(RequestError::FieldName(self.name.clone()));
        }
        if let Some(anchor) = &self.anchor {
            storable(&what("anchor"), anchor)?;
            within(&what("anchor"), anchor.len(), limits.anchor_bytes, "bytes")?;
        }
        let no_anchor = self.anchor.as_deref().is_none_or(|a| a.trim().is_empty());
        // A date is known by its form alone; any other value needs a
        // pattern or an anchor to say which it is.
        let known_by_type = self.field_type == FieldType::Date;
        if rules && self.pattern.is_none() && no_anchor && !known_by_type {
            return Err(RequestError::FieldRule(self.name.clone()));
        }
        if let Some(pattern) = &self.pattern {
            storable(&what("pattern"), pattern)?;
            within(
                &what("pattern"),
                pattern.len(),
                limits.pattern_bytes,
                "bytes",
            )?;
            super::pattern::compile(pattern, limits.pattern_program_bytes).map_err(|e| {
                RequestError::Pattern {
                    name: self.name.clone(),
                    reason: e.to_string(),
                }
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RequestLimits = RequestLimits::DEFAULT;

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
        assert_eq!(req.validate(&LIMITS), Ok(()));
    }

    #[test]
    fn refuses_bad_shapes_with_their_reason() {
        let mut req = text_request(serde_json::json!([{"name": "x"}]));
        assert_eq!(
            req.validate(&LIMITS),
            Err(RequestError::FieldRule("x".into()))
        );
        req.extractor = Some("ocr".into());
        assert_eq!(
            req.validate(&LIMITS),
            Ok(()),
            "a model service needs no pattern"
        );
        req.extractor = Some("OCR!".into());
        assert_eq!(req.validate(&LIMITS), Err(RequestError::ExtractorName));
        let req = text_request(serde_json::json!([{"name": "x", "pattern": "("}]));
        assert!(matches!(
            req.validate(&LIMITS),
            Err(RequestError::Pattern { .. })
        ));
        let req = text_request(serde_json::json!([
            {"name": "x", "anchor": "a"}, {"name": "x", "anchor": "b"}
        ]));
        assert_eq!(
            req.validate(&LIMITS),
            Err(RequestError::FieldName("x".into()))
        );
        let mut req = text_request(serde_json::json!([{"name": "x", "anchor": "a"}]));
        req.webhook_url = Some("ftp://example.com/hook".into());
        assert_eq!(req.validate(&LIMITS), Err(RequestError::WebhookUrl));
        req.webhook_url = None;
        req.document.pages = Some(vec![]);
        assert_eq!(req.validate(&LIMITS), Err(RequestError::DocumentShape));
    }

    #[test]
    fn text_postgres_cannot_store_is_refused_wherever_it_is() {
        let nul_text =
            r#"{"document":{"text":"Total a\u0000b 12"},"fields":[{"name":"x","anchor":"Total"}]}"#;
        let refused = ExtractionRequest::from_json(nul_text, &LIMITS).unwrap_err();
        assert_eq!(refused.code(), "unrepresentable_text", "{refused}");
        assert!(
            refused.to_string().starts_with("document.text"),
            "{refused}"
        );
        let nul_key = r#"{"document":{"text":"a"},"fields":[{"name":"x","anchor":"a"}],"metadata":{"k\u0000":1}}"#;
        let refused = ExtractionRequest::from_json(nul_key, &LIMITS).unwrap_err();
        assert_eq!(refused.code(), "unrepresentable_text");
        for lone in [r#"\ud800"#, r#"\udc00"#, r#"\ud800\u0041"#] {
            let json = format!(
                r#"{{"document":{{"text":"a{lone}"}},"fields":[{{"name":"x","anchor":"a"}}]}}"#
            );
            let refused = ExtractionRequest::from_json(&json, &LIMITS).unwrap_err();
            assert_eq!(refused.code(), "unrepresentable_text", "{lone}: {refused}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let json = format!(
            r#"{{"document":{{"text":"a"}},"fields":[{{"name":"x","anchor":"a"}}],"metadata":{deep}}}"#
        );
        let refused = ExtractionRequest::from_json(&json, &LIMITS).unwrap_err();
        assert_eq!(refused.code(), "too_deep", "{refused}");
        let refused = ExtractionRequest::from_json("{\"document\": ", &LIMITS).unwrap_err();
        assert!(refused.is_syntax(), "{refused}");
    }

    #[test]
    fn every_part_is_held_to_its_limit() {
        let limits = RequestLimits {
            fields: 2,
            anchor_bytes: 4,
            json_depth: 2,
            metadata_bytes: 20,
            url_bytes: 30,
            ..LIMITS
        };
        let three = text_request(serde_json::json!([
            {"name": "a", "anchor": "a"}, {"name": "b", "anchor": "b"}, {"name": "c", "anchor": "c"}
        ]));
        assert_eq!(
            three.validate(&limits).unwrap_err().code(),
            "limit_exceeded"
        );
        let long_anchor = text_request(serde_json::json!([{"name": "a", "anchor": "Total due"}]));
        let refused = long_anchor.validate(&limits).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "fields[0].anchor is larger than the limit of 4 bytes"
        );
        let mut req = text_request(serde_json::json!([{"name": "a", "anchor": "a"}]));
        req.metadata = Some(serde_json::json!({"a": {"b": 1}}));
        assert_eq!(req.validate(&limits), Ok(()));
        req.metadata = Some(serde_json::json!({"a": {"b": [1]}}));
        assert_eq!(req.validate(&limits).unwrap_err().code(), "too_deep");
        req.metadata = Some(serde_json::json!({"a": "x".repeat(20)}));
        assert_eq!(req.validate(&limits).unwrap_err().code(), "limit_exceeded");
        req.metadata = None;
        req.webhook_url = Some(format!("https://example.com/{}", "p".repeat(20)));
        assert_eq!(req.validate(&limits).unwrap_err().code(), "limit_exceeded");
        let mut many_words = text_request(serde_json::json!([{"name": "a", "anchor": "a"}]));
        many_words.document = serde_json::from_value(serde_json::json!({"pages": [
            {"width": 1.0, "height": 1.0, "words": [
                {"text": "a", "bbox": [0.0, 0.0, 1.0, 1.0]}, {"text": "b", "bbox": [0.0, 0.0, 1.0, 1.0]}
            ]}
        ]}))
        .unwrap();
        let two_words = RequestLimits {
            words_per_page: 1,
            ..LIMITS
        };
        let three_words = text_request(serde_json::json!([{"name": "a", "anchor": "a"}]));
        let two_text_words = RequestLimits {
            text_words: 2,
            ..LIMITS
        };
        assert_eq!(three_words.validate(&LIMITS), Ok(()));
        assert_eq!(
            three_words.validate(&two_text_words).unwrap_err().code(),
            "limit_exceeded"
        );
        assert_eq!(
            many_words.validate(&two_words).unwrap_err().code(),
            "limit_exceeded"
        );
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any text as a request: parsed and validated, or refused with one
        /// of the codes; never a panic.
        #[test]
        fn any_text_is_a_request_or_a_refusal_with_a_code(text in "\\PC{0,64}|[\\[\\]{}\":,0-9a-z\\\\u]{0,64}") {
            if let Err(refused) = ExtractionRequest::from_json(&text, &LIMITS) {
                let codes = ["malformed_json", "unrepresentable_text", "too_deep", "limit_exceeded", "invalid_request"];
                proptest::prop_assert!(codes.contains(&refused.code()));
            }
        }

        /// A valid request with hostile values in its strings: accepted
        /// only if every string is storable and within its limit.
        #[test]
        fn hostile_strings_are_refused_by_their_code(
            text in proptest::option::of("(\\PC|\\u{0}){0,40}"),
            name in "(\\PC|\\u{0}){0,200}",
            anchor in "(\\PC|\\u{0}){0,300}",
            depth in 0usize..40,
        ) {
            let metadata = (0..depth).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner]));
            let request = serde_json::json!({
                "document": {"text": text.clone().unwrap_or_else(|| "a".into())},
                "fields": [{"name": name.clone(), "anchor": anchor.clone()}],
                "metadata": metadata,
            });
            let outcome = ExtractionRequest::from_json(&request.to_string(), &LIMITS);
            let storable = |s: &str| !s.contains('\0');
            let fits = name.len() <= LIMITS.field_name_bytes && anchor.len() <= LIMITS.anchor_bytes
                && depth <= LIMITS.json_depth;
            let all_storable = text.as_deref().is_none_or(storable) && storable(&name) && storable(&anchor);
            match outcome {
                Ok(_) => proptest::prop_assert!(fits && all_storable),
                Err(e) if !all_storable => {
                    // The first bad part found decides the code.
                    proptest::prop_assert!(["unrepresentable_text", "limit_exceeded", "invalid_request", "too_deep"].contains(&e.code()), "{e}");
                }
                Err(e) => proptest::prop_assert!(!fits || e.code() == "invalid_request", "{e}"),
            }
        }
    }
}
