//! The bodies of the document (`components.schemas`), read off the types that
//! parse requests and write answers: each derives `JsonSchema` beside its
//! `Deserialize` or `Serialize`, so a field added to a request is in the
//! contract by the same change. What depends on the settings is filled in
//! here: the bounds the types mark with `x-limit` and name as `{SETTING}` in
//! their descriptions (`domain::schema`), the extractors a request may name,
//! what the rules extractor needs of a field, and whether webhooks are on.
//!
//! The error bodies and the streams' answer frames are built by hand where
//! they are sent, and described by hand at the end of this file.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::transform::RecursiveTransform;
use schemars::Schema;
use serde_json::{json, Map, Value};

use super::schema;
use crate::config::Settings;
use crate::domain::{ExtractionRequest, RequestLimits, RULES_EXTRACTOR};

/// Every schema of the document, for `settings`.
pub(super) fn schemas(settings: &Settings) -> Value {
    let mut requests = generator(SchemaSettings::draft2020_12().for_deserialize());
    requests.subschema_for::<ExtractionRequest>();
    requests.subschema_for::<crate::api::import::Frame>();
    requests.subschema_for::<crate::api::bulk::BulkRequest>();
    requests.subschema_for::<crate::api::corrections::CorrectionRequest>();
    let mut answers = generator(SchemaSettings::draft2020_12().for_serialize());
    answers.subschema_for::<crate::api::extractions::Accepted>();
    answers.subschema_for::<crate::api::extractions::ExtractionView>();
    answers.subschema_for::<crate::api::list::JobPage>();
    answers.subschema_for::<crate::api::bulk::OperationView>();
    answers.subschema_for::<crate::api::letters::LetterPage>();
    answers.subschema_for::<crate::api::overview::Overview>();
    answers.subschema_for::<crate::api::letters::Replayed>();
    answers.subschema_for::<crate::api::account::Me>();
    answers.subschema_for::<crate::api::account::TenantView>();
    answers.subschema_for::<crate::api::account::TenantList>();
    answers.subschema_for::<crate::store::transitions::Logged>();
    answers.subschema_for::<crate::store::corrections::Correction>();
    answers.subschema_for::<crate::api::results::Recorded>();
    answers.subschema_for::<crate::files::StoredFile>();
    answers.subschema_for::<crate::events::ExtractionEvent>();
    let mut schemas = requests.take_definitions(true);
    for (name, answer) in answers.take_definitions(true) {
        match schemas.get(&name) {
            // A type both read and written (a status) must mean one thing.
            Some(read) => assert_eq!(read, &answer, "{name} is read and written differently"),
            None => {
                schemas.insert(name, answer);
            }
        }
    }
    schemas.extend(by_hand());
    let mut schemas = Value::Object(schemas);
    bound(&mut schemas, &settings.request_limits());
    extractors(&mut schemas, settings);
    // A grounding is answered as it was stored: one stored before words
    // had confidences has no `confidence` or `needs_review`, which read as
    // their defaults (null, false and 0).
    not_required(
        &mut schemas["GroundedField"],
        &["confidence", "needs_review"],
    );
    not_required(&mut schemas["Grounding"], &["needs_review"]);
    if !settings.webhooks_enabled {
        schemas["ExtractionRequest"]["properties"]["webhook_url"] = json!({
            "type": "null",
            "description": "Webhooks are off in this deployment (`DOCSTREAM_WEBHOOKS_ENABLED`): \
                            a `webhook_url` other than null gets 422.",
        });
    }
    schemas
}

/// Takes `names` out of `schema`'s required properties.
fn not_required(schema: &mut Value, names: &[&str]) {
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| !names.iter().any(|n| name == n));
    }
}

/// A generator whose references point into `components.schemas`, with the
/// descriptions read as prose and no formats OpenAPI does not name.
pub(super) fn generator(settings: SchemaSettings) -> SchemaGenerator {
    settings
        .with(|s| {
            s.meta_schema = None;
            s.definitions_path = "/components/schemas/".into();
        })
        .with_transform(RecursiveTransform(tidy))
        .into_generator()
}

/// A doc comment's lines joined into paragraphs, and the unsigned-integer
/// formats (Rust's, not OpenAPI's) dropped: `minimum` says it.
fn tidy(schema: &mut Schema) {
    if let Some(Value::String(text)) = schema.get_mut("description") {
        *text = text
            .split("\n\n")
            .map(|paragraph| paragraph.replace('\n', " "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    if schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|format| format.starts_with("uint"))
    {
        schema.remove("format");
    }
}

/// The settings a schema may be bounded by (`x-limit`) or name in its
/// description (`{name}`), by the setting's name.
fn limits(limits: &RequestLimits) -> [(&'static str, usize); 11] {
    [
        ("max_fields", limits.fields),
        ("max_field_name_bytes", limits.field_name_bytes),
        ("max_pattern_bytes", limits.pattern_bytes),
        ("max_pattern_program_bytes", limits.pattern_program_bytes),
        ("max_anchor_bytes", limits.anchor_bytes),
        ("max_pages", limits.pages),
        ("max_words_per_page", limits.words_per_page),
        ("max_text_words", limits.text_words),
        ("max_metadata_bytes", limits.metadata_bytes),
        ("max_json_depth", limits.json_depth),
        ("max_url_bytes", limits.url_bytes),
    ]
}

/// Fills in every `x-limit` (as `maxItems` of an array, `maxLength` of a
/// string) and every `{setting}` of a description.
fn bound(value: &mut Value, request_limits: &RequestLimits) {
    let limits = limits(request_limits);
    let limit = |name: &str| {
        let found = limits.iter().find(|(known, _)| *known == name);
        found
            .unwrap_or_else(|| panic!("x-limit names an unknown setting {name}"))
            .1
    };
    match value {
        Value::Object(map) => {
            if let Some(Value::String(name)) = map.remove("x-limit") {
                let array = match &map["type"] {
                    Value::Array(types) => types.contains(&json!("array")),
                    kind => kind == "array",
                };
                let keyword = if array { "maxItems" } else { "maxLength" };
                map.insert(keyword.into(), limit(&name).into());
            }
            if let Some(Value::String(text)) = map.get_mut("description") {
                for (name, value) in &limits {
                    *text = text.replace(&format!("{{{name}}}"), &value.to_string());
                }
            }
            map.values_mut().for_each(|v| bound(v, request_limits));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| bound(v, request_limits)),
        _ => {}
    }
}

/// The extractors a request may name (`rules` and the configured ones), and
/// what the rules extractor needs of a field: with it alone, every field
/// has a `pattern` or an anchor; with others, only a request for it.
fn extractors(schemas: &mut Value, settings: &Settings) {
    let configured = settings.extractors.keys().map(|name| json!(name));
    let names: Vec<Value> = std::iter::once(json!(RULES_EXTRACTOR))
        .chain(configured)
        .chain([Value::Null])
        .collect();
    let external = names.len() > 2;
    schemas["ExtractionRequest"]["properties"]["extractor"]["enum"] = Value::Array(names);
    let rule_field = json!({
        "anyOf": [
            {"required": ["pattern"], "properties": {"pattern": {"type": "string"}}},
            {"required": ["anchor"], "properties": {"anchor": {"type": "string", "pattern": crate::domain::schema::NOT_BLANK}}},
        ],
    });
    if external {
        let request = &mut schemas["ExtractionRequest"];
        request["if"] = json!({"properties": {"extractor": {"enum": [RULES_EXTRACTOR, null]}}});
        request["then"] = json!({"properties": {"fields": {"items": rule_field}}});
    } else {
        schemas["FieldSpec"]["anyOf"] = rule_field["anyOf"].clone();
    }
}

/// The schemas of bodies no type describes: the extractor protocol's answer
/// as posted later, the error bodies, and the streams' frames.
fn by_hand() -> Map<String, Value> {
    let schemas = json!({
        "DeferredResult": deferred_result(),
        "Error": error(),
        "RetryError": retry_error(),
        "ErrorDetail": error_detail(),
        "ImportAnswer": import_answer(),
        "ExportFrame": export_frame(),
        "ExportAck": export_ack(),
    });
    match schemas {
        Value::Object(map) => map,
        _ => unreachable!("a map"),
    }
}

/// `DeferredResult`: what an extraction service posts later.
fn deferred_result() -> Value {
    json!({
        "description": "The extractor protocol's 200 answer, or a failure.",
        "oneOf": [
            {
                "type": "object",
                "required": ["fields"],
                "properties": {"fields": {"type": "object"}},
            },
            {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {"type": "string"},
                    "retryable": {"type": "boolean", "default": false},
                },
            },
        ],
    })
}

/// `Error`: the body of every failure.
fn error() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["error"],
        "properties": {"error": schema("ErrorDetail")},
    })
}

/// `RetryError`: the body of a 429, with `retry_after_s`.
fn retry_error() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["error"],
        "properties": {
            "error": {
                "allOf": [schema("ErrorDetail")],
                "required": ["retry_after_s"],
            },
        },
    })
}

/// `ErrorDetail`: a failure's code and message.
fn error_detail() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["code", "message"],
        "properties": {
            "code": {
                "type": "string",
                "description": "The kind of failure, stable for programs: `bad_request`, \
                                `malformed_json` (400); `invalid_request`, \
                                `limit_exceeded`, `too_deep`, `unrepresentable_text` \
                                (422: a request refused for what it says); \
                                `body_timeout` (408: an upload's body did not \
                                arrive in time), `payload_too_large`, \
                                `unsupported_media_type`, \
                                `unauthorized`, `forbidden`, `not_found`, `conflict`, \
                                `too_many_requests`, `overloaded` (503: a submit \
                                refused at once, nothing done), `shutting_down`, \
                                `unavailable`, `internal` (a bug). More may come.",
                "examples": ["invalid_request"],
            },
            "message": {"type": "string", "description": "What went wrong, for people."},
            "retry_after_s": {
                "type": "integer",
                "minimum": 1,
                "description": "On a 429: seconds until a retry may succeed.",
            },
        },
    })
}

/// `ImportAnswer`: the server's answer to one import frame.
fn import_answer() -> Value {
    json!({
        "description": "The server's answer to one frame of the import stream.",
        "oneOf": [
            {
                "type": "object",
                "required": ["ref", "id", "status"],
                "properties": {
                    "ref": {},
                    "id": {"type": "string", "format": "uuid"},
                    "status": schema("ExtractionStatus"),
                },
            },
            {
                "type": "object",
                "required": ["ref", "error"],
                "properties": {"ref": {}, "error": schema("ErrorDetail")},
            },
        ],
    })
}

/// `ExportFrame`: an event of the export stream.
fn export_frame() -> Value {
    json!({
        "description": "An event of the export stream.",
        "type": "object",
        "required": ["seq", "partition", "offset", "event"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "The stream's own counter, from 1."},
            "partition": {"type": "integer", "minimum": 0},
            "offset": {"type": "integer", "minimum": 0},
            "event": schema("ExtractionEvent"),
        },
    })
}

/// `ExportAck`: a client frame of the export stream.
fn export_ack() -> Value {
    json!({
        "description": "A client frame of the export stream: acknowledges every event up to `seq` `ack`.",
        "type": "object",
        "additionalProperties": false,
        "required": ["ack"],
        "properties": {"ack": {"type": "integer", "minimum": 0}},
    })
}
