//! The extractor protocol's wire types, shared by the HTTP extractor (the
//! client) and `docstream extractor-serve` (a reference server). One call per
//! attempt: `POST <url>` with a [`CallBody`], answered by a [`ResultBody`] (200)
//! or a status that tells the worker what to do next. The manual (`docs/src/extractors.md`) and
//! `docs/extractor-protocol.openapi.yaml` document it for provider authors.
//!
//! Version 2 adds files: a call for a job whose document is a file carries
//! `file` ([`FileRef`]: a URL to fetch it from for a limited time, what it
//! is and its size) instead of `document`, and the answer may carry the
//! words the provider found on each page (`pages`), which docstream keeps
//! as the job's document for bbox refinement. A provider of version 1 never
//! gets a file.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::deferred::Callback;
use super::{ExtractedValue, ExtractionOutput, Job};
use crate::domain::{Document, ExtractionRequest, FieldSpec, Page, RequestLimits};

/// Largest 200 body the client reads; a provider that sends more is broken.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// What the worker posts for one attempt.
#[derive(Debug, Serialize, Deserialize)]
pub struct CallBody<'a> {
    /// The job's id.
    pub job_id: Uuid,
    /// The claim's attempt number, from 1.
    pub attempt: i32,
    /// The document as submitted; absent when the job's document is a file
    /// (version 2: `file` instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<std::borrow::Cow<'a, Document>>,
    /// Version 2, for a job whose document is a file: where to fetch it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<std::borrow::Cow<'a, FileRef>>,
    /// The field specs as validated: as submitted, with `type` and
    /// `required` always written out (the protocol document says so).
    pub fields: std::borrow::Cow<'a, [FieldSpec]>,
    /// The submitter's opaque data, or null.
    pub metadata: Option<std::borrow::Cow<'a, serde_json::Value>>,
    /// Where to post the result if the provider answers 202 (deferred results
    /// on), else absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<std::borrow::Cow<'a, Callback>>,
}

/// Where a provider fetches a job's file, and what it is (version 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRef {
    /// `GET` it for the bytes, until `expires_at`: it opens this job's
    /// file and nothing else, and asks for no credentials.
    pub url: String,
    /// What the bytes are, as docstream sniffed them: `application/pdf`,
    /// `image/png`, `image/jpeg`, `image/tiff` or `text/plain`.
    pub content_type: String,
    /// Bytes.
    pub size: i64,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
    /// When the URL stops working.
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// A deferred answer (202): the result follows, within `deadline_s`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DeferredBody {
    /// Seconds within which the result will be posted; the extractor's
    /// `deferred_deadline_s` when absent, and capped at it.
    #[serde(default)]
    pub deadline_s: Option<f64>,
}

impl<'a> CallBody<'a> {
    /// The body of `job`'s call.
    pub fn of(job: &Job<'a>) -> Self {
        let request: &'a ExtractionRequest = job.request;
        Self {
            job_id: job.id,
            attempt: job.attempt,
            document: match job.file {
                Some(_) => None,
                None => Some(std::borrow::Cow::Borrowed(&request.document)),
            },
            file: job.file.map(std::borrow::Cow::Borrowed),
            fields: std::borrow::Cow::Borrowed(&request.fields),
            metadata: request.metadata.as_ref().map(std::borrow::Cow::Borrowed),
            callback: job.callback.map(std::borrow::Cow::Borrowed),
        }
    }
}

/// A successful answer: each field found, or null.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResultBody {
    /// Values by field name; a missing name means not found.
    pub fields: BTreeMap<String, Option<ExtractedValue>>,
    /// Version 2, for a file: the words found on each page, in reading
    /// order, with their boxes (the provider's OCR layer). Values' `words`
    /// ranges index them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<Vec<Page>>,
}

/// An error answer (422, 400): `{"error": "message"}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What the provider says went wrong.
    pub error: String,
}

/// The `Idempotency-Key` of `job`'s call: the same for every call of one attempt.
pub fn idempotency_key(job: &Job<'_>) -> String {
    format!("{}:{}", job.id, job.attempt)
}

/// A W3C `traceparent` whose trace id is the job id, so every call of a job
/// shares one trace.
pub fn traceparent(job: &Job<'_>) -> String {
    let span: u64 = rand::random::<u64>() | 1;
    format!("00-{}-{span:016x}-01", job.id.simple())
}

/// Turns a 200 body into the job's output: the requested fields only, each
/// value's word range checked against the document (`word_count` words).
/// With `file`, the document is the answer's `pages` (none: no words), each
/// checked as a submitted document's would be; for a document submitted as
/// JSON, `pages` are ignored.
pub fn read_result(
    body: &[u8],
    request: &ExtractionRequest,
    word_count: usize,
    file: bool,
) -> Result<(ExtractionOutput, Option<Document>), String> {
    let mut answer: ResultBody = serde_json::from_slice(body).map_err(|e| {
        format!(
            "expected {{\"fields\": {{name: {{\"value\", \"raw\"?, \"words\"?}} | null}}}}: {e}"
        )
    })?;
    let document = match (file, answer.pages.take()) {
        (false, _) => None,
        (true, None) => Some(Document::default()),
        (true, Some(pages)) => {
            let document = Document {
                pages: Some(pages),
                ..Document::default()
            };
            document
                .validate(&RequestLimits::DEFAULT)
                .map_err(|e| format!("pages: {}", e.to_string().replacen("document.", "", 1)))?;
            Some(document)
        }
    };
    let word_count = match &document {
        Some(document) => document.words().len(),
        None => word_count,
    };
    let mut output = ExtractionOutput::default();
    for field in &request.fields {
        let value = answer.fields.remove(&field.name).flatten();
        let chosen = (value.iter().flat_map(|v| &v.chosen)).flat_map(|c| {
            let candidates = c.candidates.iter().flat_map(|c| [&c.value, &c.why]);
            std::iter::once(&c.rule).chain(candidates)
        });
        let text = value.iter().flat_map(|v| [Some(&v.value), v.raw.as_ref()]);
        if text.flatten().chain(chosen).any(|t| t.contains('\0')) {
            return Err(format!(
                "field {:?}: the value holds a NUL character, which cannot be stored",
                field.name
            ));
        }
        if let Some(confidence) = value.as_ref().and_then(|v| v.confidence) {
            if !(0.0..=1.0).contains(&confidence) {
                return Err(format!(
                    "field {:?}: confidence {confidence} is not from 0 to 1",
                    field.name
                ));
            }
        }
        if let Some([first, last]) = value.as_ref().and_then(|v| v.words) {
            if first > last || last >= word_count {
                return Err(format!(
                    "field {:?}: words [{first}, {last}] are not a range of the document's {word_count} words",
                    field.name
                ));
            }
        }
        output.fields.insert(field.name.clone(), value);
    }
    Ok((output, document))
}

/// How long a 202 answer's result may take: the body's `deadline_s`, at most
/// `cap` (also the default). A body that is not a [`DeferredBody`] is an error.
pub fn deferred_deadline(body: &[u8], cap: Duration) -> Result<Duration, String> {
    let deferred: DeferredBody = if body.iter().all(u8::is_ascii_whitespace) {
        DeferredBody::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| format!("expected {{\"deadline_s\"?: seconds}}: {e}"))?
    };
    match deferred.deadline_s {
        None => Ok(cap),
        // Capped before the conversion, which panics on values past u64 seconds.
        Some(s) if s.is_finite() && s > 0.0 => {
            Ok(Duration::from_secs_f64(s.min(cap.as_secs_f64())))
        }
        Some(s) => Err(format!(
            "deadline_s must be a positive number of seconds, not {s}"
        )),
    }
}

/// The message of an error answer: `{"error": "…"}`, or the body's text, at
/// most 1,000 characters.
pub fn error_message(body: &[u8]) -> String {
    let message = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody { error }) => error,
        Err(_) => String::from_utf8_lossy(body).trim().to_owned(),
    };
    shortened(message)
}

/// A provider's message as docstream keeps it: at most 1,000 characters, so
/// it fits a row, an event and a webhook, with any NUL replaced (Postgres
/// text cannot hold one, and the failure could never be recorded).
pub fn shortened(message: String) -> String {
    let message = match message.contains('\0') {
        true => message.replace('\0', "\u{FFFD}"),
        false => message,
    };
    match message.char_indices().nth(1000) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None if message.is_empty() => "(no message)".to_owned(),
        None => message,
    }
}

/// The longest wait a `Retry-After` is read as.
const MAX_RETRY_AFTER_S: f64 = 86_400.0;

/// How long a `Retry-After` value asks to wait: delta-seconds or an HTTP date.
pub fn retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        // Any wait longer than a day is as good as a day: every budget is shorter.
        let valid = secs.is_finite() && secs >= 0.0;
        return valid.then(|| Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER_S)));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = (at.with_timezone(&chrono::Utc) - now)
        .to_std()
        .unwrap_or_default();
    Some(wait.min(Duration::from_secs_f64(MAX_RETRY_AFTER_S)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ExtractionRequest {
        serde_json::from_value(serde_json::json!({
            "document": {"text": "Total 12.50"},
            "fields": [{"name": "total", "type": "money"}, {"name": "date", "type": "date"}],
            "extractor": "ocr"
        }))
        .unwrap()
    }

    #[test]
    fn a_result_keeps_requested_fields_and_checks_word_ranges() {
        let body = br#"{"fields": {"total": {"value": "12.50", "words": [1, 1]}, "extra": null}}"#;
        let (output, _) = read_result(body, &request(), 2, false).unwrap();
        assert_eq!(output.fields["total"].as_ref().unwrap().value, "12.50");
        assert_eq!(output.fields["date"], None);
        assert!(!output.fields.contains_key("extra"));
        let body = br#"{"fields": {"total": {"value": "12.50", "words": [1, 5]}}}"#;
        assert!(read_result(body, &request(), 2, false)
            .unwrap_err()
            .contains("words [1, 5]"));
        assert!(read_result(b"<html>", &request(), 2, false).is_err());
        assert!(read_result(br#"{"fields": {"total": 12.5}}"#, &request(), 2, false).is_err());
    }

    #[test]
    fn a_nul_from_a_provider_is_refused_in_a_value_and_replaced_in_a_message() {
        for body in [
            br#"{"fields": {"total": {"value": "12\u00000"}}}"#.as_slice(),
            br#"{"fields": {"total": {"value": "12.50", "raw": "\u0000"}}}"#.as_slice(),
            br#"{"fields": {"total": {"value": "12.50", "chosen": {"rule": "a\u0000", "candidates": []}}}}"#.as_slice(),
        ] {
            let refused = read_result(body, &request(), 2, false).unwrap_err();
            assert!(refused.contains("NUL"), "{refused}");
        }
        let sure = br#"{"fields": {"total": {"value": "12.50", "confidence": 1.5}}}"#;
        let refused = read_result(sure, &request(), 2, false).unwrap_err();
        assert!(refused.contains("not from 0 to 1"), "{refused}");
        assert_eq!(shortened("bad\0input".into()), "bad\u{FFFD}input");
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            retry_after("Tue, 01 Dec 2026 10:00:05 GMT", now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(retry_after("soon", now), None);
        let a_day = Some(Duration::from_secs(86_400));
        assert_eq!(
            retry_after("1e300", now),
            a_day,
            "a huge value must not panic"
        );
        assert_eq!(retry_after("NaN", now), None);
        assert_eq!(retry_after("inf", now), None);
        assert_eq!(retry_after("-1", now), None);
    }

    #[test]
    fn a_call_carries_fields_with_their_defaults_written_out() {
        let submitted: Vec<FieldSpec> = serde_json::from_str(r#"[{"name": "total"}]"#).unwrap();
        let sent = serde_json::to_value(std::borrow::Cow::<[FieldSpec]>::Borrowed(&submitted));
        assert_eq!(
            sent.unwrap(),
            serde_json::json!([{"name": "total", "type": "string", "required": false}])
        );
    }

    #[test]
    fn a_deadline_is_capped_and_checked() {
        let cap = Duration::from_secs(1200);
        assert_eq!(deferred_deadline(b"", cap), Ok(cap));
        assert_eq!(deferred_deadline(b"{}", cap), Ok(cap));
        assert_eq!(
            deferred_deadline(br#"{"deadline_s": 30}"#, cap),
            Ok(Duration::from_secs(30))
        );
        assert_eq!(deferred_deadline(br#"{"deadline_s": 1e300}"#, cap), Ok(cap));
        assert!(deferred_deadline(br#"{"deadline_s": -1}"#, cap).is_err());
        assert!(deferred_deadline(b"soon", cap).is_err());
    }

    #[test]
    fn error_messages_come_from_json_or_text() {
        assert_eq!(
            error_message(br#"{"error": "not an invoice"}"#),
            "not an invoice"
        );
        assert_eq!(error_message(b"bad scan\n"), "bad scan");
        assert_eq!(error_message(b""), "(no message)");
    }
}
