//! The HTTP API's contract: an OpenAPI 3.1 document, built from the routes
//! themselves and the running [`Settings`], so that every route it lists is
//! one the server has and every limit it states is one this server
//! enforces. `serve` answers it at `GET /openapi.json` (no key needed);
//! `docs/openapi.json` is the document with the default settings
//! (`tests/it/openapi.rs` keeps the two equal), and `scripts/fuzz-api.sh`
//! runs schemathesis against a live `serve` with it.
//!
//! Each route is added with its operation (`api_route(path,
//! get_with(handler, describe))`, aide): the handler's extractors and
//! answer types give its body and its answers' schemas, a `Caller` its
//! security and refusals, each layer the answers it gives to the routes it
//! wraps, and the describing function beside the handler the rest, in the
//! words of [`describe`]. The bodies' schemas are read off the Rust types
//! (`schemas`).
//!
//! What JSON Schema cannot say (a byte length, unique field names, a pattern
//! that compiles, an ordered box, a webhook host that resolves to a public
//! address, a reused idempotency key) the descriptions say, and the server
//! answers 422.

mod schemas;

use std::sync::Arc;

use aide::axum::ApiRouter;
use aide::openapi::{OpenApi, Operation, PathItem};
use axum::routing::get;
use axum::{Json, Router};
use schemars::generate::SchemaSettings;
use serde_json::{json, Value};

use super::describe;
use crate::config::Settings;
use crate::domain::Scope;

/// The document's own route.
pub(super) const PATH: &str = "/openapi.json";

/// The router `routes` builds, and the document of its routes for
/// `settings`. Each operation is generated as its route is added, so the
/// routes are built here, after the generator is set up.
pub(super) fn finish<S>(
    settings: &Settings,
    routes: impl FnOnce() -> ApiRouter<S>,
) -> (Router<S>, Value)
where
    S: Clone + Send + Sync + 'static,
{
    aide::generate::reset_context();
    aide::generate::infer_responses(false);
    aide::generate::in_context(|context| {
        context.schema = schemas::generator(SchemaSettings::draft2020_12().for_serialize());
    });
    let mut api = OpenApi::default();
    let router = routes().finish_api(&mut api);
    (router, document_of(api, settings))
}

/// `GET /openapi.json`: `document`, rendered once.
pub(super) fn router(document: Value) -> Router {
    let document = Arc::new(document);
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

/// The OpenAPI 3.1 document of `api`'s routes as `settings` configure them.
fn document_of(mut api: OpenApi, settings: &Settings) -> Value {
    let mut paths = api.paths.take().unwrap_or_default();
    let document_route = PathItem {
        get: Some(describe::from_json::<Operation>(openapi_operation())),
        ..PathItem::default()
    };
    paths.paths.insert(
        PATH.to_owned(),
        aide::openapi::ReferenceOr::Item(document_route),
    );
    let mut paths = serde_json::to_value(paths).expect("paths as JSON");
    let websockets = websockets(&mut paths);
    // The operations name their types' schemas by `$ref`; the schemas
    // themselves are `schemas`' (with the settings' bounds), and a type a
    // handler names that `schemas` does not list is a `$ref` that does not
    // resolve, which the tests catch.
    let named = schemas::schemas(settings);
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": info(settings),
        "tags": [
            {"name": "extractions", "description": "Submit, read and cancel extraction jobs."},
            {"name": "streams", "description": "WebSocket streams: submissions in, events out."},
            {"name": "files", "description": "Documents sent as files: uploaded once, named by their SHA-256."},
            {"name": "tenant", "description": "The caller's tenant: who it is, its queue, quotas and keys."},
            {"name": "operators", "description": "The whole deployment, for keys with the `operator` scope."},
            {"name": "extractors", "description": "Called by extraction services, not by clients."},
            {"name": "probes", "description": "Liveness, readiness and this document; no key needed."}
        ],
        "paths": paths,
        "x-websockets": websockets,
        "components": {
            "securitySchemes": security_schemes(),
            "schemas": named,
            "responses": error_answers(),
        },
    })
}

/// Takes the WebSocket routes (those whose success is `101 Switching
/// Protocols`) out of `paths`, into an extension of their own: OpenAPI has
/// no words for a WebSocket, and in `paths` they read as HTTP operations
/// whose success is a 101, which HTTP clients generated from the document
/// and generic fuzzers take for a broken answer (and then send their next
/// request on a connection that speaks WebSocket). Each is described as an
/// operation all the same: its query, its upgrade answer, its refusals.
fn websockets(paths: &mut Value) -> Value {
    let paths = paths.as_object_mut().expect("paths by route");
    let upgrades: Vec<String> = paths
        .iter()
        .filter(|(_, item)| {
            let operations = item.as_object().expect("a path item");
            operations
                .values()
                .any(|o| o["responses"]["101"].is_object())
        })
        .map(|(path, _)| path.clone())
        .collect();
    let mut websockets = serde_json::Map::new();
    for path in upgrades {
        websockets.insert(path.clone(), paths.remove(&path).expect("listed"));
    }
    Value::Object(websockets)
}

/// The document's `info`, with the limits every route shares.
fn info(settings: &Settings) -> Value {
    let description = format!(
        "docstream's HTTP API. Every route but the probes and this document needs \
         `Authorization: Bearer <key>` with the route's scope (scopes: {scopes}); the \
         deferred-result route takes the extraction service's token instead. An address \
         that keeps presenting keys that are not valid gets 429 for a key this server \
         does not know yet ({failures}/s, ten seconds' worth at once; \
         `DOCSTREAM_AUTH_FAILURES_PER_PEER_PER_S`); keys it knows pass.\n\n\
         Every failure answers `{{\"error\": {{\"code\", \"message\"}}}}` with its status \
         (a 429 adds `retry_after_s`). A 401 carries `WWW-Authenticate: Bearer`; a 429 and \
         a 503 carry `Retry-After`. A REST request is answered within \
         {answer_s} s (`DOCSTREAM_HTTP_ANSWER_TIMEOUT_S`), with 503 when a dependency \
         did not answer in time, or at once with code `overloaded` when the server has \
         no room for another submit: repeat a submit that got a 503, or no answer, with \
         the same `Idempotency-Key`. A 500 is a bug.\n\n\
         Request bodies are at most {body} bytes (`DOCSTREAM_HTTP_BODY_LIMIT_BYTES`); a \
         larger one gets 413. String limits are in UTF-8 bytes, which `maxLength` (in \
         characters) states exactly for ASCII text only.\n\n\
         The WebSocket streams (`GET /v1/import`, `GET /v1/export`) are described \
         under `x-websockets`, not `paths`: their success is `101 Switching Protocols`, \
         after which the connection speaks WebSocket.\n\n\
         This document is rendered from the server's routes and settings, so the routes \
         it lists are the ones it serves and the limits it states are the ones it enforces.",
        scopes = Scope::ALL.map(Scope::as_str).join(", "),
        answer_s = settings.http_answer_timeout_s,
        body = settings.http_body_limit_bytes,
        failures = settings.auth_failures_per_peer_per_s,
    );
    json!({
        "title": "docstream",
        "version": env!("CARGO_PKG_VERSION"),
        "description": description,
        "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
    })
}

/// How a caller proves who it is: an API key, or (on the deferred-result
/// route) the token an extraction service got with its call.
fn security_schemes() -> Value {
    json!({
        "ApiKey": {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "dsk_…",
            "description": "An API key of a tenant (`docstream tenants create`, \
                            `docstream keys create`). A missing, malformed, unknown or \
                            revoked key gets 401; a key without the route's scope 403.",
        },
        "ResultToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "The token an extraction service got with the call it \
                            answered 202; it names the job and the attempt.",
        },
    })
}

/// The error answers the operations share, by name (`components.responses`).
fn error_answers() -> Value {
    let plain = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": schema("Error")}},
        })
    };
    let retry_after = json!({
        "required": true,
        "description": "Seconds to wait before a retry.",
        "schema": {"type": "integer", "minimum": 1},
    });
    json!({
        "BadRequest": plain(
            "Malformed: the body is not JSON, a header, the id or a query parameter is \
             invalid, or a WebSocket route was called without an upgrade."
        ),
        "Unauthorized": {
            "description": "The key (or result token) is missing, malformed, unknown or revoked.",
            "headers": {
                "WWW-Authenticate": {
                    "required": true,
                    "schema": {"type": "string", "const": "Bearer"},
                },
            },
            "content": {"application/json": {"schema": schema("Error")}},
        },
        "Forbidden": plain("The key does not have the route's scope."),
        "NotFound": plain("No such extraction (or another tenant's)."),
        "Conflict": plain("The job's state does not allow it (e.g. it finished)."),
        "Gone": plain("The job's content was erased (`DELETE /v1/extractions/{id}`)."),
        "BodyTimeout": {
            "description": "An upload's body did not arrive whole within \
                            `DOCSTREAM_HTTP_BODY_TIMEOUT_S` of when its reading began; \
                            the connection is closed.",
            "headers": {
                "Connection": {"required": true, "schema": {"type": "string", "const": "close"}},
            },
            "content": {"application/json": {"schema": schema("Error")}},
        },
        "PayloadTooLarge": plain(
            "The body is larger than the limit: refused from its `Content-Length` \
             before a byte of it is read, or as soon as it passes the limit."
        ),
        "UnsupportedMediaType": plain("The body is not declared as `application/json`."),
        "Unprocessable": plain(
            "The JSON does not describe a valid request, or the `Idempotency-Key` names \
             a job with another request."
        ),
        "TooManyRequests": {
            "description": "Past a quota of the tenant (submit rate, open jobs, sockets, \
                            uploads in progress, bytes of files), or an address that \
                            keeps presenting keys that are not valid.",
            "headers": {"Retry-After": retry_after.clone()},
            "content": {"application/json": {"schema": schema("RetryError")}},
        },
        "Unavailable": {
            "description": "A dependency is away or did not answer in time, or the server \
                            is shutting down (or at its socket limit): retry after \
                            `Retry-After`.",
            "headers": {"Retry-After": retry_after},
            "content": {"application/json": {"schema": schema("Error")}},
        },
    })
}

/// `GET /openapi.json`'s operation.
fn openapi_operation() -> Value {
    json!({
        "operationId": "getOpenApi",
        "tags": ["probes"],
        "summary": "This document",
        "description": "The OpenAPI document of this server, with the limits its settings set.",
        "security": [],
        "responses": {
            "200": {
                "description": "The document.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "503": {"$ref": "#/components/responses/Unavailable"},
        },
    })
}

/// The document for `settings` alone, without a process to serve it.
#[cfg(test)]
pub(crate) fn document(settings: &Settings) -> Value {
    finish(settings, || super::routes(settings)).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BboxStatus, ExtractionStatus, FieldType};

    /// The routes the API serves, by method: a route added or taken away
    /// changes the document, and this list says so in review.
    const ROUTES: [(&str, &str); 29] = [
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
    ];

    /// Every operation of the document, as (path, method, operation).
    fn operations(document: &Value) -> Vec<(String, String, Value)> {
        ["paths", "x-websockets"]
            .iter()
            .flat_map(|part| document[part].as_object().unwrap())
            .flat_map(|(path, item)| {
                item.as_object()
                    .unwrap()
                    .iter()
                    .map(|(method, operation)| (path.clone(), method.clone(), operation.clone()))
            })
            .collect()
    }

    /// Each route is described where it is added: a route added without
    /// its describing function has no name, summary or success answer.
    #[test]
    fn every_route_is_described() {
        let document = document(&Settings::default());
        let operations = operations(&document);
        let mut listed: Vec<(String, String)> = operations
            .iter()
            .map(|(p, m, _)| (p.clone(), m.clone()))
            .collect();
        listed.sort();
        let expected: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(p, m)| (p.to_string(), m.to_string()))
            .collect();
        assert_eq!(listed, expected, "the routes changed: update ROUTES");
        for (path, method, operation) in operations {
            for part in ["operationId", "summary", "description"] {
                assert!(operation[part].is_string(), "{method} {path} has no {part}");
            }
            assert!(
                operation["tags"][0].is_string(),
                "{method} {path} has no tag"
            );
            let answers = operation["responses"].as_object().expect("answers");
            assert!(
                answers.keys().any(|s| s.starts_with('2') || s == "101"),
                "{method} {path} has no success answer"
            );
            assert!(
                answers.contains_key("503"),
                "{method} {path}: every route may answer 503 (the gate)"
            );
        }
    }

    /// The keyed routes are the ones whose handler takes a `Caller`; the
    /// rest say how they are called.
    #[test]
    fn a_keyed_route_declares_its_key_and_its_refusals() {
        let document = document(&Settings::default());
        let unkeyed = [
            "/healthz",
            "/readyz",
            "/openapi.json",
            "/v1/extractions/{id}/file",
            "/v1/extractions/{id}/result",
        ];
        for (path, method, operation) in operations(&document) {
            let keyed = operation["security"] == json!([{"ApiKey": []}]);
            assert_eq!(keyed, !unkeyed.contains(&path.as_str()), "{method} {path}");
            if keyed {
                for status in ["401", "429"] {
                    assert!(
                        operation["responses"][status].is_object(),
                        "{method} {path} has no {status}"
                    );
                }
            }
        }
        let result = &document["paths"]["/v1/extractions/{id}/result"]["post"];
        assert_eq!(result["security"], json!([{"ResultToken": []}]));
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
