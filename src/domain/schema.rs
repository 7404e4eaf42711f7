//! What a JSON Schema of the wire types says beyond their Rust shape: the
//! patterns of text the checks accept, finite numbers, any storable JSON, and
//! the marks that tie a bound to its setting. The types carry these in
//! `#[schemars(...)]` attributes beside their fields, so the API's contract
//! (`api::openapi`) is read off the types that parse and answer, not written
//! a second time.
//!
//! A bound that is a setting cannot be a constant in an attribute: the field
//! carries `extend("x-limit" = "SETTING")` instead, and a description may
//! name `{SETTING}`; the document fills both in from the running settings.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

/// Text Postgres can store: no NUL character.
pub const NO_NUL: &str = "^[^\\u0000]*$";

/// Text with something besides whitespace (as Rust's `trim` sees it) and no
/// NUL: what a field name, an anchor and a text document must be.
pub const NOT_BLANK: &str = "^[^\\u0000]*[^\\u0000\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$";

/// Visible ASCII, what an HTTP header carries: an idempotency key's letters.
pub const VISIBLE_ASCII: &str = "^[\\u0020-\\u007e]+$";

/// An absolute http or https URL, as far as a pattern can tell.
pub const HTTP_URL: &str = "^[hH][tT][tT][pP][sS]?://[^\\u0000]+$";

/// The most a finite number can be; JSON numbers past it do not parse.
pub const FINITE: f64 = f64::MAX;

/// Any JSON Postgres can store (a request's `metadata`): no NUL in a string
/// or a key. Named in the document as `JsonValue`.
pub struct JsonValue;

impl JsonSchema for JsonValue {
    fn schema_name() -> Cow<'static, str> {
        "JsonValue".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let value = generator.subschema_for::<Self>();
        json_schema!({
            "description": "Any JSON without NUL characters in its strings.",
            "anyOf": [
                {"type": ["null", "boolean", "number"]},
                {"type": "string", "pattern": NO_NUL},
                {"type": "array", "items": value},
                {
                    "type": "object",
                    "propertyNames": {"pattern": NO_NUL},
                    "additionalProperties": value,
                },
            ],
        })
    }
}
