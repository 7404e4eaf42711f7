//! The HTTP API's contract: an OpenAPI 3.1 document, built from the running
//! [`Settings`] so that every limit it states is the one this server
//! enforces. `serve` answers it at `GET /openapi.json` (no key needed);
//! `docs/openapi.json` is the document with the default settings
//! (`tests/it/openapi.rs` keeps the two equal), and `scripts/fuzz-api.sh` runs
//! schemathesis against a live `serve` with it.
//!
//! The bodies' schemas are read off the Rust types that parse and answer
//! them (`schemas`); the routes are a table (`paths`).
//!
//! What JSON Schema cannot say (a byte length, unique field names, a pattern
//! that compiles, an ordered box, a webhook host that resolves to a public
//! address, a reused idempotency key) the descriptions say, and the server
//! answers 422.

mod paths;
mod schemas;

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::config::Settings;

/// The document's own route.
pub(super) const PATH: &str = "/openapi.json";

/// `GET /openapi.json`: the document for `settings`, rendered once.
pub(super) fn router(settings: &Settings) -> Router {
    let document = Arc::new(document(settings));
    Router::new().route(
        PATH,
        get(move || {
            let document = document.clone();
            async move { Json(document.as_ref().clone()) }
        }),
    )
}

/// `$ref` to a schema of `components`.
fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// `$ref` to a response of `components`.
fn response(name: &str) -> Value {
    json!({ "$ref": format!("#/components/responses/{name}") })
}

/// The OpenAPI 3.1 document of the API as `settings` configure it.
pub(crate) fn document(settings: &Settings) -> Value {
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": paths::info(settings),
        "tags": [
            {"name": "extractions", "description": "Submit, read and cancel extraction jobs."},
            {"name": "streams", "description": "WebSocket streams: submissions in, events out."},
            {"name": "files", "description": "Documents sent as files: uploaded once, named by their SHA-256."},
            {"name": "tenant", "description": "The caller's tenant: who it is, its queue, quotas and keys."},
            {"name": "operators", "description": "The whole deployment, for keys with the `operator` scope."},
            {"name": "extractors", "description": "Called by extraction services, not by clients."},
            {"name": "probes", "description": "Liveness, readiness and this document; no key needed."}
        ],
        "security": [{"ApiKey": []}],
        "paths": paths::paths(settings),
        "x-websockets": paths::websockets(settings),
        "components": paths::components(settings),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BboxStatus, ExtractionStatus, FieldType};

    /// Every `.route("PATH", METHOD(…))` in the source of `src/api/` and its
    /// folders, so that a route added there (in any file) and not here fails.
    fn routes() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
        let route =
            regex::Regex::new(r#"\.route\(\s*("[^"]+"|PATH),\s*([^\n]*)"#).expect("a regex");
        // The methods of a route's line: `get(read)`, `get(read).delete(erase)`.
        let method = regex::Regex::new(r"\b(get|post|put|patch|delete|any)\(").expect("a regex");
        let mut routes = Vec::new();
        let mut folders = vec![dir];
        let mut files = Vec::new();
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("a folder of src/api") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        for path in files {
            let source = std::fs::read_to_string(&path).expect("a source file");
            for found in route.captures_iter(&source) {
                let path = match &found[1] {
                    "PATH" => PATH.to_owned(),
                    quoted => quoted.trim_matches('"').to_owned(),
                };
                for name in method.captures_iter(&found[2]) {
                    routes.push((path.clone(), name[1].to_owned()));
                }
            }
        }
        routes
    }

    #[test]
    fn every_route_of_the_router_is_in_the_document() {
        let document = document(&Settings::default());
        let routes = routes();
        let mut listed: Vec<(String, String)> = routes
            .iter()
            // The internal listener's route is not on the API's port, and
            // the console's pages are a client of the API, not part of it.
            .filter(|(path, _)| path != "/metrics" && !path.starts_with("/console"))
            .cloned()
            .collect();
        listed.sort();
        listed.dedup();
        let expected: Vec<(String, String)> = [
            ("/healthz", "get"),
            ("/openapi.json", "get"),
            ("/readyz", "get"),
            ("/v1/dead-letters", "get"),
            ("/v1/dead-letters/{id}/replay", "post"),
            ("/v1/export", "get"),
            ("/v1/extractions", "get"),
            ("/v1/extractions", "post"),
            ("/v1/extractions/actions", "post"),
            ("/v1/extractions/actions/{id}", "get"),
            ("/v1/extractions/{id}", "delete"),
            ("/v1/extractions/{id}", "get"),
            ("/v1/extractions/{id}/cancel", "post"),
            ("/v1/extractions/{id}/corrections", "get"),
            ("/v1/extractions/{id}/document", "get"),
            ("/v1/extractions/{id}/fields/{field}/corrections", "post"),
            ("/v1/extractions/{id}/file", "get"),
            ("/v1/extractions/{id}/pages/{page}", "get"),
            ("/v1/extractions/{id}/result", "post"),
            ("/v1/extractions/{id}/retry", "post"),
            ("/v1/extractions/{id}/transitions", "get"),
            ("/v1/files", "post"),
            ("/v1/files/{id}", "get"),
            ("/v1/import", "get"),
            ("/v1/me", "get"),
            ("/v1/operator/overview", "get"),
            ("/v1/operator/tenants", "get"),
            ("/v1/overview", "get"),
            ("/v1/tenant", "get"),
        ]
        .iter()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect();
        assert_eq!(
            listed, expected,
            "the routers' routes changed: document them"
        );
        let described = |path: &str, method: &str| {
            ["paths", "x-websockets"]
                .iter()
                .any(|part| document[part][path][method].is_object())
        };
        for (path, method) in &listed {
            assert!(
                described(path, method),
                "{method} {path} is not in the document"
            );
        }
        let documented: usize = ["paths", "x-websockets"]
            .iter()
            .flat_map(|part| document[part].as_object().unwrap().values())
            .map(|item| item.as_object().unwrap().len())
            .sum();
        assert_eq!(
            documented,
            listed.len(),
            "the document has a route the routers do not"
        );
    }

    #[test]
    fn the_document_is_openapi_3_1_json() {
        let document = document(&Settings::default());
        assert_eq!(document["openapi"], "3.1.0");
        let text = serde_json::to_string_pretty(&document).unwrap();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, document);
        assert!(document["info"]["title"].is_string() && document["info"]["version"].is_string());
    }

    /// Every `$ref` points at something the document has.
    #[test]
    fn every_reference_resolves() {
        fn walk(value: &Value, document: &Value, seen: &mut usize) {
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(target)) = map.get("$ref") {
                        let pointer = target.strip_prefix('#').expect("a local $ref");
                        assert!(
                            document.pointer(pointer).is_some(),
                            "{target} does not resolve"
                        );
                        *seen += 1;
                    }
                    map.values().for_each(|v| walk(v, document, seen));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, document, seen)),
                _ => {}
            }
        }
        let document = document(&Settings::default());
        let mut seen = 0;
        walk(&document, &document, &mut seen);
        assert!(seen > 20);
    }

    #[test]
    fn operations_have_unique_ids_and_answer_errors_as_error_bodies() {
        let document = document(&Settings::default());
        let mut ids = std::collections::HashSet::new();
        let operations = ["paths", "x-websockets"]
            .iter()
            .flat_map(|part| document[part].as_object().unwrap());
        for (path, item) in operations {
            for (method, operation) in item.as_object().unwrap() {
                let id = operation["operationId"].as_str().expect("an operationId");
                assert!(ids.insert(id.to_owned()), "{id} twice");
                for (status, answer) in operation["responses"].as_object().unwrap() {
                    let code: u16 = status.parse().unwrap();
                    if code >= 400 {
                        assert!(
                            answer["$ref"].is_string(),
                            "{method} {path} {status}: use an error response of components"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_limits_are_the_settings() {
        let settings = Settings {
            max_fields: 7,
            max_field_name_bytes: 9,
            max_pattern_bytes: 11,
            max_anchor_bytes: 13,
            max_pages: 15,
            max_words_per_page: 17,
            max_url_bytes: 19,
            http_body_limit_bytes: 12_345,
            ..Settings::default()
        };
        let document = document(&settings);
        let description = document["info"]["description"].as_str().unwrap();
        assert!(description.contains("at most 12345 bytes"), "{description}");
        let schemas = &document["components"]["schemas"];
        let request = &schemas["ExtractionRequest"]["properties"];
        assert_eq!(request["fields"]["maxItems"], 7);
        assert_eq!(request["webhook_url"]["maxLength"], 19);
        let field = &schemas["FieldSpec"]["properties"];
        assert_eq!(field["name"]["maxLength"], 9);
        assert_eq!(field["pattern"]["maxLength"], 11);
        assert_eq!(field["anchor"]["maxLength"], 13);
        assert_eq!(
            schemas["PagesDocument"]["properties"]["pages"]["maxItems"],
            15
        );
        assert_eq!(schemas["Page"]["properties"]["words"]["maxItems"], 17);
        let submit = &document["paths"]["/v1/extractions"]["post"];
        assert_eq!(submit["parameters"][0]["schema"]["maxLength"], 255);
        assert_eq!(request["extractor"]["maxLength"], 64);
    }

    /// The values an enumeration of the document lists (`enum`, or a
    /// `oneOf` of `const`s).
    fn listed(schema: &Value) -> Vec<Value> {
        if let Some(values) = schema["enum"].as_array() {
            return values.clone();
        }
        let choices = schema["oneOf"].as_array().expect("an enum or a oneOf");
        choices.iter().map(|c| c["const"].clone()).collect()
    }

    #[test]
    fn the_names_it_lists_are_the_ones_the_server_reads() {
        let document = document(&Settings::default());
        let schemas = &document["components"]["schemas"];
        let statuses = listed(&schemas["ExtractionStatus"]);
        assert_eq!(statuses.len(), 5);
        for status in statuses {
            assert!(status.as_str().unwrap().parse::<ExtractionStatus>().is_ok());
        }
        let bbox_statuses = listed(&schemas["BboxStatus"]);
        assert_eq!(bbox_statuses.len(), 4);
        for status in bbox_statuses {
            assert!(status.as_str().unwrap().parse::<BboxStatus>().is_ok());
        }
        let field_types = listed(&schemas["FieldType"]);
        assert_eq!(field_types.len(), 4);
        for field_type in field_types {
            serde_json::from_value::<FieldType>(field_type).unwrap();
        }
    }

    /// The rules-only requirement (a pattern or an anchor) moves to an
    /// `if` on the extractor once other extractors exist.
    #[test]
    fn external_extractors_are_listed_and_need_no_rule() {
        let default = document(&Settings::default());
        let schemas = &default["components"]["schemas"];
        assert!(schemas["FieldSpec"]["anyOf"].is_array());
        assert!(schemas["ExtractionRequest"]["if"].is_null());
        let mut settings = Settings::default();
        let extractor: crate::config::ExtractorSettings =
            serde_json::from_value(json!({"url": "http://127.0.0.1:9/extract"})).unwrap();
        settings.extractors.insert("ocr".into(), extractor);
        let document = document(&settings);
        let schemas = &document["components"]["schemas"];
        assert!(schemas["FieldSpec"]["anyOf"].is_null());
        assert!(schemas["ExtractionRequest"]["then"].is_object());
        let names = &schemas["ExtractionRequest"]["properties"]["extractor"]["enum"];
        assert_eq!(names, &json!(["rules", "ocr", null]));
    }

    #[test]
    fn only_a_null_webhook_url_when_webhooks_are_off() {
        let settings = Settings {
            webhooks_enabled: false,
            ..Settings::default()
        };
        let document = document(&settings);
        let request = &document["components"]["schemas"]["ExtractionRequest"];
        assert_eq!(request["properties"]["webhook_url"]["type"], "null");
    }
}
