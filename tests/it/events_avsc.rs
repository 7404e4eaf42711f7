//! The events as a stranger sees them: decoded with only the `.avsc` files in
//! `schemas/` and a generic Avro single-object reader, no docstream types.

use apache_avro::types::Value;
use apache_avro::{GenericSingleObjectReader, Schema};
use docstream::events::{
    encode, DeadLetter, ExtractionEvent, ExtractionSubmitted, FieldCorrection,
    PostProcessingRequested, PublishReason, Source,
};

fn reader(file: &str) -> GenericSingleObjectReader {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas")
        .join(file);
    let text = std::fs::read_to_string(path).unwrap();
    GenericSingleObjectReader::builder()
        .schema(Schema::parse_str(&text).unwrap())
        .build()
        .unwrap()
}

fn field<'a>(value: &'a Value, name: &str) -> &'a Value {
    match value {
        Value::Record(fields) => &fields.iter().find(|(n, _)| n == name).unwrap().1,
        other => panic!("not a record: {other:?}"),
    }
}

#[test]
fn submitted_decodes_from_its_avsc_alone() {
    let id = uuid::Uuid::new_v4();
    let bytes = encode(&ExtractionSubmitted::new(id, PublishReason::Reaper)).unwrap();
    let value = reader("ExtractionSubmitted.avsc")
        .read_value(&mut &bytes[..])
        .unwrap();
    assert_eq!(
        field(&value, "extraction_id"),
        &Value::String(id.to_string())
    );
    assert_eq!(field(&value, "reason"), &Value::Enum(2, "reaper".into()));
}

#[test]
fn every_event_decodes_from_its_avsc_alone() {
    let id = uuid::Uuid::new_v4();
    a_post_processing_request_decodes_with_its_step(id);
    an_extraction_event_decodes_with_its_optional_fields(id);
    a_dead_letter_decodes_with_its_payload_excerpt();
}

/// A bbox refinement request decodes, with its step as a string.
fn a_post_processing_request_decodes_with_its_step(id: uuid::Uuid) {
    let post = encode(&PostProcessingRequested::bbox_refinement(
        id,
        PublishReason::Submit,
    ))
    .unwrap();
    let value = reader("PostProcessingRequested.avsc")
        .read_value(&mut &post[..])
        .unwrap();
    assert_eq!(
        field(&value, "step"),
        &Value::String("bbox_refinement".into())
    );
}

/// A transition event decodes, its optional fields as unions: a token, a
/// tenant and a correction set, no error.
fn an_extraction_event_decodes_with_its_optional_fields(id: uuid::Uuid) {
    let event = ExtractionEvent {
        extraction_id: id.to_string(),
        transition: "mark_succeeded".into(),
        status: "succeeded".into(),
        bbox_status: Some("pending".into()),
        token: Some(1),
        error: None,
        reason: PublishReason::Submit,
        published_at_ms: 1,
        tenant_id: Some(id.to_string()),
        correction: Some(FieldCorrection {
            correction_id: 7,
            field: "total".into(),
            value: None,
            key_id: id.to_string(),
            reviewer: None,
        }),
    };
    let bytes = encode(&event).unwrap();
    let value = reader("ExtractionEvent.avsc")
        .read_value(&mut &bytes[..])
        .unwrap();
    assert_eq!(
        field(&value, "token"),
        &Value::Union(1, Box::new(Value::Int(1)))
    );
    assert_eq!(
        field(&value, "error"),
        &Value::Union(0, Box::new(Value::Null))
    );
    assert_eq!(
        field(&value, "tenant_id"),
        &Value::Union(1, Box::new(Value::String(id.to_string())))
    );
    let Value::Union(1, correction) = field(&value, "correction") else {
        panic!("a correction: {value:?}");
    };
    assert_eq!(field(correction, "field"), &Value::String("total".into()));
    assert_eq!(
        field(correction, "value"),
        &Value::Union(0, Box::new(Value::Null))
    );
}

/// A dead letter decodes, with the poison record's bytes and size.
fn a_dead_letter_decodes_with_its_payload_excerpt() {
    let source = Source {
        topic: "t",
        partition: 1,
        offset: 2,
        key: Some(b"k"),
        payload: Some(&[0xff, 0x00]),
    };
    let letter = DeadLetter::new(source, "undecodable", "bad", 16);
    let bytes = encode(&letter).unwrap();
    let value = reader("DeadLetter.avsc")
        .read_value(&mut &bytes[..])
        .unwrap();
    assert_eq!(
        field(&value, "payload_excerpt"),
        &Value::Union(1, Box::new(Value::Bytes(vec![0xff, 0x00])))
    );
    assert_eq!(field(&value, "payload_size"), &Value::Long(2));
}

#[test]
fn a_dead_letter_is_bounded_whatever_the_record_weighs() {
    let payload = vec![b'x'; 10 << 20];
    let key = vec![b'k'; 2 << 20];
    let reason = "é".repeat(10_000);
    let source = Source {
        topic: "extraction.requests",
        partition: 0,
        offset: 7,
        key: Some(&key),
        payload: Some(&payload),
    };
    let letter = DeadLetter::new(source, "invalid_request", &reason, 16 * 1024);
    let bytes = encode(&letter).unwrap();
    assert!(bytes.len() < 24 * 1024, "a letter of {} bytes", bytes.len());
    assert_eq!(letter.payload_size, 10 << 20);
    assert_eq!(
        letter.payload_excerpt.as_ref().map(Vec::len),
        Some(16 * 1024)
    );
    assert_eq!(letter.payload_sha256.len(), 64);
    assert!(letter.error.len() <= DeadLetter::MAX_ERROR);
    let decoded: DeadLetter = docstream::events::decode(&bytes).unwrap();
    assert_eq!(decoded, letter);
}

#[test]
fn a_reader_of_another_schema_refuses_the_record() {
    let bytes = encode(&ExtractionSubmitted::new(
        uuid::Uuid::nil(),
        PublishReason::Submit,
    ))
    .unwrap();
    assert!(reader("DeadLetter.avsc")
        .read_value(&mut &bytes[..])
        .is_err());
}
