//! Avro single-object encoding: `C3 01`, the schema's 8-byte CRC-64-AVRO (Rabin)
//! fingerprint in little-endian order, then the Avro binary datum.
//!
//! Schemas evolve compatibly (a new field has a default). The schema a
//! record was written with is told by its fingerprint: a record written under
//! an earlier version (`schemas/history/`) is read with that version and
//! resolved to the current one, so what was produced before an upgrade still
//! decodes after it.
//!
//! Decoding never panics: a short buffer, a wrong marker, a fingerprint we do not
//! know, a fingerprint of another event type, and a corrupt datum are each a
//! [`CodecError`] variant, so a consumer can route the record to the DLQ by kind.

use std::collections::HashMap;
use std::sync::LazyLock;

use apache_avro::rabin::Rabin;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use serde::{Deserialize, Serialize};

/// A Rust type bound to one `.avsc` file.
pub trait Event: Serialize + for<'de> Deserialize<'de> {
    /// The schema's full name, e.g. `dev.docstream.events.ExtractionSubmitted`.
    const NAME: &'static str;
}

/// The two marker bytes that open every single-object encoded value.
pub const SINGLE_OBJECT_MAGIC: [u8; 2] = [0xC3, 0x01];

const HEADER_LEN: usize = 10;

/// The `.avsc` files, compiled into the binary.
const SCHEMA_SOURCES: [&str; 5] = [
    include_str!("../../schemas/ExtractionRequested.avsc"),
    include_str!("../../schemas/ExtractionSubmitted.avsc"),
    include_str!("../../schemas/PostProcessingRequested.avsc"),
    include_str!("../../schemas/ExtractionEvent.avsc"),
    include_str!("../../schemas/DeadLetter.avsc"),
];

/// Earlier versions of the schemas, which records written before an upgrade
/// carry: read only, never written.
const HISTORY_SOURCES: [&str; 3] = [
    include_str!("../../schemas/history/ExtractionEvent.v1.avsc"),
    include_str!("../../schemas/history/ExtractionEvent.v2.avsc"),
    include_str!("../../schemas/history/DeadLetter.v1.avsc"),
];

/// A parsed schema and its fingerprint.
struct Known {
    schema: Schema,
    fingerprint: [u8; 8],
}

impl Known {
    fn parse(source: &str) -> (String, Self) {
        let schema = Schema::parse_str(source).expect("shipped schemas are valid Avro");
        let name = match &schema {
            Schema::Record(record) => record.name.fullname(None),
            _ => unreachable!("every shipped schema is a record"),
        };
        let fingerprint: [u8; 8] = schema.fingerprint::<Rabin>().bytes[..]
            .try_into()
            .expect("a Rabin fingerprint has 8 bytes");
        let known = Known {
            schema,
            fingerprint,
        };
        (name, known)
    }
}

/// Every schema we speak, by full name.
static SCHEMAS: LazyLock<HashMap<String, Known>> =
    LazyLock::new(|| SCHEMA_SOURCES.iter().map(|s| Known::parse(s)).collect());

/// A writer for each schema we speak, resolved once.
static WRITERS: LazyLock<HashMap<&'static str, GenericDatumWriter<'static>>> =
    LazyLock::new(|| {
        let schemas: &'static HashMap<String, Known> = &SCHEMAS;
        schemas
            .iter()
            .map(|(name, known)| {
                let writer = GenericDatumWriter::builder(&known.schema)
                    .build()
                    .expect("shipped schemas resolve");
                (name.as_str(), writer)
            })
            .collect()
    });

/// The earlier versions, with the full name of the schema each preceded.
static HISTORY: LazyLock<Vec<(String, Known)>> =
    LazyLock::new(|| HISTORY_SOURCES.iter().map(|s| Known::parse(s)).collect());

/// How a record is read, by the fingerprint of the schema it was written with.
struct Reading {
    /// The full name of the event it decodes to.
    name: &'static str,
    /// Resolved once: a record of an earlier version is resolved to the
    /// current schema as it is read.
    reader: GenericDatumReader<'static>,
    /// Written under an earlier version of the schema.
    earlier: bool,
}

/// A reader for every schema we speak and every earlier version of one.
static READERS: LazyLock<HashMap<[u8; 8], Reading>> = LazyLock::new(|| {
    let current: &'static HashMap<String, Known> = &SCHEMAS;
    let history: &'static Vec<(String, Known)> = &HISTORY;
    let reading = |name: &'static str, writer: &'static Schema, earlier: bool| {
        let reader = GenericDatumReader::builder(writer)
            .maybe_reader_schema(earlier.then(|| &current[name].schema))
            .build()
            .expect("shipped schemas resolve");
        Reading {
            name,
            reader,
            earlier,
        }
    };
    let now = current
        .iter()
        .map(|(name, k)| (k.fingerprint, reading(name, &k.schema, false)));
    let before = history
        .iter()
        .map(|(name, k)| (k.fingerprint, reading(name, &k.schema, true)));
    now.chain(before).collect()
});

/// Why bytes could not become an event, or an event bytes.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Fewer bytes than the 10-byte header, or a wrong marker.
    #[error("not Avro single-object encoded (missing C3 01 header)")]
    NotSingleObject,
    /// The fingerprint names no schema we know.
    #[error("unknown schema fingerprint {0:02x?}")]
    UnknownFingerprint([u8; 8]),
    /// The fingerprint names another of our schemas than the one expected.
    #[error("expected a {expected} but the record is a {found}")]
    WrongSchema {
        /// The schema the caller asked for.
        expected: &'static str,
        /// The schema the fingerprint names.
        found: String,
    },
    /// The datum does not match its schema, or the value does not fit the type.
    #[error("invalid Avro datum: {0}")]
    Datum(String),
}

impl CodecError {
    /// Short class for metric labels and dead letters.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotSingleObject | Self::Datum(_) => "undecodable",
            Self::UnknownFingerprint(_) => "unknown_schema",
            Self::WrongSchema { .. } => "wrong_schema",
        }
    }
}

fn known<E: Event>() -> &'static Known {
    SCHEMAS
        .get(E::NAME)
        .unwrap_or_else(|| panic!("no schema shipped for {}", E::NAME))
}

/// Encodes `event` as an Avro single object.
pub fn encode<E: Event>(event: &E) -> Result<Vec<u8>, CodecError> {
    let known = known::<E>();
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(&SINGLE_OBJECT_MAGIC);
    bytes.extend_from_slice(&known.fingerprint);
    // Serialised straight against the schema: going through an
    // `apache_avro::Value` and resolving it against the schema first was
    // about a seventh of a worker's CPU.
    WRITERS[E::NAME]
        .write_ser(&mut bytes, event)
        .map_err(|e| CodecError::Datum(e.to_string()))?;
    Ok(bytes)
}

/// Decodes an Avro single object that must be an `E`.
pub fn decode<E: Event>(bytes: &[u8]) -> Result<E, CodecError> {
    if bytes.len() < HEADER_LEN || bytes[..2] != SINGLE_OBJECT_MAGIC {
        return Err(CodecError::NotSingleObject);
    }
    let fingerprint: [u8; 8] = bytes[2..HEADER_LEN].try_into().expect("slice of 8");
    let mut datum = &bytes[HEADER_LEN..];
    let value = reader::<E>(fingerprint)?
        .read_value(&mut datum)
        .map_err(|e| CodecError::Datum(e.to_string()))?;
    if !datum.is_empty() {
        return Err(CodecError::Datum(format!("{} trailing bytes", datum.len())));
    }
    apache_avro::from_value(&value).map_err(|e| CodecError::Datum(e.to_string()))
}

/// The reader of an `E` written with the schema of `fingerprint`: the
/// current one, or an earlier version of it.
fn reader<E: Event>(
    fingerprint: [u8; 8],
) -> Result<&'static GenericDatumReader<'static>, CodecError> {
    match READERS.get(&fingerprint) {
        Some(reading) if reading.name == E::NAME => Ok(&reading.reader),
        Some(reading) if !reading.earlier => Err(CodecError::WrongSchema {
            expected: E::NAME,
            found: reading.name.to_owned(),
        }),
        // An earlier version of another event is as unknown to an `E` as
        // any fingerprint we never shipped.
        _ => Err(CodecError::UnknownFingerprint(fingerprint)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{
        DeadLetter, ExtractionEvent, ExtractionRequested, ExtractionSubmitted,
        PostProcessingRequested, PublishReason,
    };

    fn round_trip<E: Event + PartialEq + std::fmt::Debug>(event: E) {
        let bytes = encode(&event).unwrap();
        assert_eq!(bytes[..2], SINGLE_OBJECT_MAGIC);
        assert_eq!(decode::<E>(&bytes).unwrap(), event);
        // The same bytes as the generic path: a value resolved against the
        // schema, then written.
        let known = known::<E>();
        let value = apache_avro::to_value(&event)
            .and_then(|value| value.resolve(&known.schema))
            .unwrap();
        let datum = GenericDatumWriter::builder(&known.schema)
            .build()
            .and_then(|writer| writer.write_value_to_vec(value))
            .unwrap();
        assert_eq!(bytes[HEADER_LEN..], datum[..]);
    }

    #[test]
    fn every_event_round_trips() {
        round_trip(ExtractionRequested {
            idempotency_key: "order-17".into(),
            request_json: r#"{"document":{"pages":[]},"fields":[]}"#.into(),
            requested_at_ms: 1_764_460_800_000,
        });
        round_trip(ExtractionSubmitted {
            extraction_id: "5b0c".into(),
            reason: PublishReason::Reaper,
            published_at_ms: 1_764_460_800_000,
        });
        round_trip(PostProcessingRequested {
            extraction_id: "5b0c".into(),
            step: "bbox_refinement".into(),
            reason: PublishReason::Submit,
            published_at_ms: 7,
        });
        round_trip(ExtractionEvent {
            extraction_id: "5b0c".into(),
            transition: "mark_failed".into(),
            status: "failed".into(),
            bbox_status: None,
            token: Some(2),
            error: Some("required field total not found".into()),
            reason: PublishReason::Retry,
            published_at_ms: 7,
            tenant_id: Some(uuid::Uuid::now_v7().to_string()),
            correction: None,
        });
        round_trip(DeadLetter {
            topic: "extraction.submitted".into(),
            partition: 3,
            offset: 42,
            key: Some(vec![0, 1, 2]),
            payload_size: -1,
            payload_sha256: String::new(),
            payload_excerpt: None,
            error_kind: "undecodable".into(),
            error: "garbage".into(),
            published_at_ms: 7,
        });
    }

    /// An `ExtractionEvent` as version 1 of its schema had it.
    #[derive(serde::Serialize)]
    struct EventV1 {
        extraction_id: String,
        transition: String,
        status: String,
        bbox_status: Option<String>,
        token: Option<i32>,
        error: Option<String>,
        reason: PublishReason,
        published_at_ms: i64,
    }

    #[test]
    fn an_event_written_under_version_1_decodes_without_a_tenant() {
        let (name, v1) = &HISTORY[0];
        assert_eq!(name, ExtractionEvent::NAME);
        assert_ne!(v1.fingerprint, known::<ExtractionEvent>().fingerprint);
        let old = EventV1 {
            extraction_id: "5b0c".into(),
            transition: "mark_succeeded".into(),
            status: "succeeded".into(),
            bbox_status: Some("pending".into()),
            token: Some(1),
            error: None,
            reason: PublishReason::Submit,
            published_at_ms: 9,
        };
        let value = apache_avro::to_value(&old)
            .and_then(|value| value.resolve(&v1.schema))
            .unwrap();
        let mut bytes = SINGLE_OBJECT_MAGIC.to_vec();
        bytes.extend_from_slice(&v1.fingerprint);
        bytes.extend(
            GenericDatumWriter::builder(&v1.schema)
                .build()
                .and_then(|writer| writer.write_value_to_vec(value))
                .unwrap(),
        );

        let decoded = decode::<ExtractionEvent>(&bytes).unwrap();
        assert_eq!(decoded.tenant_id, None);
        assert_eq!(
            (
                decoded.extraction_id.as_str(),
                decoded.token,
                decoded.published_at_ms
            ),
            ("5b0c", Some(1), 9)
        );
        assert!(decoded.belongs_to(crate::store::tenants::DEFAULT_TENANT_ID));
        assert!(!decoded.belongs_to(uuid::Uuid::now_v7()));
        // Version 1 is only read: what is written is the current version.
        let written = encode(&decoded).unwrap();
        assert_eq!(
            written[2..HEADER_LEN],
            known::<ExtractionEvent>().fingerprint
        );
    }

    #[test]
    fn garbage_and_strangers_are_typed_errors() {
        assert!(matches!(
            decode::<ExtractionSubmitted>(b"hello"),
            Err(CodecError::NotSingleObject)
        ));
        let mut unknown = vec![0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8];
        unknown.extend_from_slice(b"\x02a");
        assert!(matches!(
            decode::<ExtractionSubmitted>(&unknown),
            Err(CodecError::UnknownFingerprint([1, 2, 3, 4, 5, 6, 7, 8]))
        ));
        let submitted = encode(&ExtractionSubmitted::new(
            uuid::Uuid::nil(),
            PublishReason::Submit,
        ))
        .unwrap();
        assert!(matches!(
            decode::<PostProcessingRequested>(&submitted),
            Err(CodecError::WrongSchema { .. })
        ));
        // Right header, truncated datum.
        assert!(matches!(
            decode::<ExtractionSubmitted>(&submitted[..12]),
            Err(CodecError::Datum(_))
        ));
    }
}
