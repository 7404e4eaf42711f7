//! The HTTP API's contract: an OpenAPI 3.1 document, built from the running
//! [`Settings`] so that every limit it states is the one this server
//! enforces. `serve` answers it at `GET /openapi.json` (no key needed);
//! `docs/openapi.json` is the document with the default settings
//! (`tests/openapi.rs` keeps the two equal), and `scripts/fuzz-api.sh` runs
//! schemathesis against a live `serve` with it.
//!
//! What JSON Schema cannot say (a byte length, unique field names, a pattern
//! that compiles, an ordered box, a webhook host that resolves to a public
//! address, a reused idempotency key) the descriptions say, and the server
//! answers 422.

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::export::MAX_GROUP_LEN;
use crate::config::Settings;
use crate::domain::{
    BboxStatus, ExtractionStatus, FieldType, Scope, MAX_EXTRACTOR_NAME_LEN,
    MAX_IDEMPOTENCY_KEY_LEN, RULES_EXTRACTOR,
};

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

/// Text Postgres can store: no NUL character.
const NO_NUL: &str = "^[^\\u0000]*$";

/// Text with something besides whitespace (as Rust's `trim` sees it) and no
/// NUL: what a field name, an anchor and a text document must be.
const NOT_BLANK: &str = "^[^\\u0000]*[^\\u0000\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$";

/// `$ref` to a schema of `components`.
fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// `$ref` to a response of `components`.
fn response(name: &str) -> Value {
    json!({ "$ref": format!("#/components/responses/{name}") })
}

/// The job states, as the API spells them.
fn statuses() -> Vec<&'static str> {
    use ExtractionStatus::*;
    let all = [Queued, Running, Succeeded, Failed, Cancelled];
    // A new state must be added above: this match stops compiling without it.
    all.iter()
        .map(|s| match s {
            Queued | Running | Succeeded | Failed | Cancelled => s.as_str(),
        })
        .collect()
}

/// The bbox refinement sub-states.
fn bbox_statuses() -> Vec<&'static str> {
    use BboxStatus::*;
    let all = [Pending, Running, Succeeded, Failed];
    all.iter()
        .map(|s| match s {
            Pending | Running | Succeeded | Failed => s.as_str(),
        })
        .collect()
}

/// The field types, as a request spells them.
fn field_types() -> Vec<Value> {
    use FieldType::*;
    let all = [String, Number, Money, Date];
    all.iter()
        .map(|t| match t {
            String | Number | Money | Date => {
                serde_json::to_value(t).expect("a field type serialises")
            }
        })
        .collect()
}

/// The extractors a request may name: `rules` and the configured ones.
fn extractor_names(settings: &Settings) -> Vec<String> {
    let configured = settings.extractors.keys().cloned();
    std::iter::once(RULES_EXTRACTOR.to_owned())
        .chain(configured)
        .collect()
}

/// The OpenAPI 3.1 document of the API as `settings` configure it.
pub(crate) fn document(settings: &Settings) -> Value {
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": info(settings),
        "tags": [
            {"name": "extractions", "description": "Submit, read and cancel extraction jobs."},
            {"name": "streams", "description": "WebSocket streams: submissions in, events out."},
            {"name": "extractors", "description": "Called by extraction services, not by clients."},
            {"name": "probes", "description": "Liveness, readiness and this document; no key needed."}
        ],
        "security": [{"ApiKey": []}],
        "paths": paths(settings),
        "x-websockets": websockets(settings),
        "components": components(settings),
    })
}

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
         This document is rendered from the server's settings, so the limits it states \
         are the ones it enforces.",
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

/// The WebSocket routes, in an extension of their own: OpenAPI has no
/// words for a WebSocket, and in `paths` they read as HTTP operations whose
/// success is `101 Switching Protocols`, which HTTP clients generated from
/// the document and generic fuzzers take for a broken answer (and then send
/// their next request on a connection that speaks WebSocket). Each is
/// described as an operation all the same: its query, its upgrade answer,
/// its refusals.
fn websockets(settings: &Settings) -> Value {
    json!({
        "/v1/import": {"get": import()},
        "/v1/export": {"get": export(settings)},
    })
}

fn paths(settings: &Settings) -> Value {
    json!({
        "/v1/extractions": {"post": submit(settings)},
        "/v1/extractions/{id}": {"get": read()},
        "/v1/extractions/{id}/cancel": {"post": cancel()},
        "/v1/extractions/{id}/result": {"post": deferred_result(settings)},
        "/healthz": {"get": healthz()},
        "/readyz": {"get": readyz()},
        PATH: {"get": openapi()},
    })
}

/// The path parameter `id`.
fn id_parameter() -> Value {
    json!({
        "name": "id",
        "in": "path",
        "required": true,
        "description": "The extraction's id (a UUID); anything else gets 400.",
        "schema": {"type": "string", "format": "uuid"},
    })
}

/// Links from an answer carrying an extraction's `id` to the routes that take it.
fn links(to: &[(&str, &str)]) -> Value {
    let links: serde_json::Map<String, Value> = to
        .iter()
        .map(|(name, operation)| {
            let link = json!({
                "operationId": operation,
                "parameters": {"id": "$response.body#/id"},
            });
            (name.to_string(), link)
        })
        .collect();
    Value::Object(links)
}

/// The submit's optional `Idempotency-Key` header.
fn idempotency_key_header() -> Value {
    json!({
        "name": "Idempotency-Key",
        "in": "header",
        "required": false,
        "description": format!(
            "Makes the submit safe to repeat: 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible \
             ASCII characters (spaces allowed inside; HTTP drops them at either end). \
             Anything else gets 400."
        ),
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IDEMPOTENCY_KEY_LEN,
            "pattern": "^[\\u0021-\\u007e]([\\u0020-\\u007e]*[\\u0021-\\u007e])?$",
        },
    })
}

fn submit(settings: &Settings) -> Value {
    let description = format!(
        "Submits one extraction job (scope `submit`). It is answered 202 once the job's \
         row is committed; the job's event follows (the reaper republishes it if the \
         broker was away). With an `Idempotency-Key`, a repeat of the same request answers \
         the first job (with its current status) instead of making a second one; the \
         same key with another request gets 422. Keys are unique within a tenant.\n\n\
         Past the tenant's submit rate or its cap on open jobs the answer is 429 with \
         `Retry-After`, and nothing is written. The body is at most {body} bytes.",
        body = settings.http_body_limit_bytes,
    );
    json!({
        "operationId": "submitExtraction",
        "tags": ["extractions"],
        "summary": "Submit an extraction",
        "description": description,
        "parameters": [idempotency_key_header()],
        "requestBody": {
            "required": true,
            "description": "The job. A body that is not JSON gets 400, one without \
                            `Content-Type: application/json` 415, one that does not \
                            describe a valid request 422.",
            "content": {"application/json": {"schema": schema("ExtractionRequest")}},
        },
        "responses": {
            "202": {
                "description": "Accepted: the job is durable. `Location` names it.",
                "headers": {
                    "Location": {
                        "required": true,
                        "description": "`/v1/extractions/{id}`.",
                        "schema": {"type": "string", "pattern": "^/v1/extractions/[0-9a-f-]{36}$"},
                    },
                },
                "content": {"application/json": {"schema": schema("Accepted")}},
                "links": links(&[("GetExtraction", "getExtraction"), ("CancelExtraction", "cancelExtraction")]),
            },
            "400": response("BadRequest"),
            "401": response("Unauthorized"),
            "403": response("Forbidden"),
            "413": response("PayloadTooLarge"),
            "415": response("UnsupportedMediaType"),
            "422": response("Unprocessable"),
            "429": response("TooManyRequests"),
            "503": response("Unavailable"),
        },
    })
}

fn read() -> Value {
    json!({
        "operationId": "getExtraction",
        "tags": ["extractions"],
        "summary": "Read an extraction",
        "description": "The job (scope `read`): its status, attempts, timestamps, result, \
                        error and bbox refinement. The document itself is not echoed. \
                        Another tenant's job is not found, exactly like one that does not exist.",
        "parameters": [id_parameter()],
        "responses": {
            "200": {
                "description": "The job.",
                "content": {"application/json": {"schema": schema("Extraction")}},
                "links": links(&[("CancelExtraction", "cancelExtraction")]),
            },
            "400": response("BadRequest"),
            "401": response("Unauthorized"),
            "403": response("Forbidden"),
            "404": response("NotFound"),
            "429": response("TooManyRequests"),
            "503": response("Unavailable"),
        },
    })
}

fn cancel() -> Value {
    json!({
        "operationId": "cancelExtraction",
        "tags": ["extractions"],
        "summary": "Cancel an extraction",
        "description": "Cancels a job (scope `cancel`). A queued job is cancelled at once \
                        (200); a running one is asked to stop, and its holder cancels it at \
                        its next heartbeat (202). A finished job answers 409.",
        "parameters": [id_parameter()],
        "responses": {
            "200": {
                "description": "Cancelled: the job as it is now.",
                "content": {"application/json": {"schema": schema("Extraction")}},
                "links": links(&[("GetExtraction", "getExtraction")]),
            },
            "202": {
                "description": "Running: cancellation requested (`cancel_requested_at`).",
                "content": {"application/json": {"schema": schema("Extraction")}},
                "links": links(&[("GetExtraction", "getExtraction")]),
            },
            "400": response("BadRequest"),
            "401": response("Unauthorized"),
            "403": response("Forbidden"),
            "404": response("NotFound"),
            "429": response("TooManyRequests"),
            "409": response("Conflict"),
            "503": response("Unavailable"),
        },
    })
}

fn deferred_result(settings: &Settings) -> Value {
    let description = format!(
        "Where an extraction service that answered a call with 202 posts the result \
         later, with the bearer token it got with the call (it names the job and the \
         attempt; API keys are not accepted here). The body is the extractor protocol's \
         200 answer, `{{\"fields\": {{…}}}}`, or a failure, `{{\"error\": \"…\", \
         \"retryable\": false}}`; it is read as JSON whatever its `Content-Type`, and is \
         at most {body} bytes. A result for an attempt that no longer holds the job (it \
         finished, was retried or cancelled) gets 409 and changes nothing. When \
         deferred results are off (`DOCSTREAM_PUBLIC_URL` or `DOCSTREAM_CALLBACK_SECRET` \
         unset) every call gets 401.",
        body = settings.http_body_limit_bytes,
    );
    json!({
        "operationId": "postExtractionResult",
        "tags": ["extractors"],
        "summary": "Post a deferred result",
        "description": description,
        "security": [{"ResultToken": []}],
        "parameters": [id_parameter()],
        "requestBody": {
            "required": true,
            "content": {"application/json": {"schema": schema("DeferredResult")}},
        },
        "responses": {
            "200": {
                "description": "What the result did to the job.",
                "content": {"application/json": {"schema": schema("ResultRecorded")}},
            },
            "400": response("BadRequest"),
            "401": response("Unauthorized"),
            "404": response("NotFound"),
            "409": response("Conflict"),
            "413": response("PayloadTooLarge"),
            "422": response("Unprocessable"),
            "503": response("Unavailable"),
        },
    })
}

/// The headers of a WebSocket upgrade (RFC 6455) that the server checks; a
/// request without them gets 400.
fn upgrade_headers() -> Value {
    let header = |name: &str, description: &str, schema: Value| {
        json!({
            "name": name,
            "in": "header",
            "required": true,
            "description": description,
            "schema": schema,
        })
    };
    json!([
        header(
            "Connection",
            "A list of tokens that has `Upgrade` (any case).",
            json!({
                "type": "string",
                "pattern": "^([^,]*,)*[ \\t]*[Uu][Pp][Gg][Rr][Aa][Dd][Ee][ \\t]*(,.*)?$",
            }),
        ),
        header(
            "Upgrade",
            "`websocket` (any case).",
            json!({"type": "string", "pattern": "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$"}),
        ),
        header(
            "Sec-WebSocket-Version",
            "`13`.",
            json!({"type": "string", "const": "13"}),
        ),
        header(
            "Sec-WebSocket-Key",
            "The client's nonce, the base64 of 16 random bytes; the server answers its \
             digest in `Sec-WebSocket-Accept`.",
            json!({"type": "string"}),
        ),
    ])
}

/// The answers of a WebSocket upgrade.
fn upgrade_responses(protocol: &str) -> Value {
    json!({
        "101": {
            "description": format!("Switching Protocols: the WebSocket. {protocol}"),
            "headers": {
                "Upgrade": {"required": true, "schema": {"type": "string", "const": "websocket"}},
                "Sec-WebSocket-Accept": {"required": true, "schema": {"type": "string"}},
            },
        },
        "400": response("BadRequest"),
        "401": response("Unauthorized"),
        "403": response("Forbidden"),
        "429": response("TooManyRequests"),
        "503": response("Unavailable"),
    })
}

fn import() -> Value {
    let protocol = "Each text frame from the client is one submission, an `ImportFrame`: \
        `{\"ref\": any, \"idempotency_key\": \"…\" (optional), \"request\": {…}}`, where \
        `request` is the body `POST /v1/extractions` takes. It takes the submit path of \
        the REST API (the same checks, quotas, idempotency and answers) and is answered on \
        the socket, in completion order, with an `ImportAnswer`: `{\"ref\", \"id\", \
        \"status\"}` or `{\"ref\", \"error\": {\"code\", \"message\"}}` with the REST API's \
        codes. A binary frame is answered with `bad_request`. At most 64 submissions of a \
        socket are in progress; the next frame is read only when one finishes, so a fast \
        client is slowed down, never dropped. When the client closes, reading stops and \
        every frame already read is still written, published and answered. When the \
        server shuts down it stops reading, answers every frame it read, and closes with \
        1000; a client should read until the server's close.";
    json!({
        "operationId": "importStream",
        "tags": ["streams"],
        "summary": "Import stream (WebSocket)",
        "description": format!(
            "Upgrades to a WebSocket on which a client streams submissions (scope \
             `submit`). A request that is not a WebSocket upgrade gets 400.\n\n{protocol}"
        ),
        "parameters": upgrade_headers(),
        "responses": upgrade_responses(protocol),
    })
}

/// What the export stream's frames are and when it closes, with the
/// settings' limits; both the operation and its 101 answer say it.
fn export_protocol(settings: &Settings) -> String {
    format!(
        "The server sends the caller's tenant's `extraction.events` as `ExportFrame`s, \
         `{{\"seq\", \"partition\", \"offset\", \"event\": {{…}}}}`, in offset order within \
         a partition (so a job's events in the order they happened). The client answers \
         `{{\"ack\": N}}` (an `ExportAck`), which acknowledges every event up to `seq` N; \
         at most {unacked} events are sent and not yet acknowledged \
         (`DOCSTREAM_EXPORT_MAX_UNACKED`). An event's offset is committed only once it is \
         acknowledged (or dropped by a drop strategy), so a group that reconnects resumes \
         after the last event it acknowledged. A malformed client frame is answered \
         `{{\"error\": {{\"code\": \"bad_request\", \"message\"}}}}`; \
         {errors} in a row (`DOCSTREAM_EXPORT_MAX_CONSECUTIVE_ERRORS`), an event left \
         unacknowledged for {ack_s} s (`DOCSTREAM_EXPORT_ACK_TIMEOUT_S`), a client that \
         stops reading, or a Kafka failure close the stream with 1011. On shutdown the \
         server stops consuming, sends what was queued, waits up to {drain_s} s for every \
         event sent to be acknowledged, commits, and closes with 1000.",
        unacked = settings.export_max_unacked,
        errors = settings.export_max_consecutive_errors,
        ack_s = settings.export_ack_timeout_s,
        drain_s = settings.export_drain_timeout_s,
    )
}

/// A parameter of the query string.
fn query_parameter(name: &str, required: bool, description: &str, schema: Value) -> Value {
    json!({
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    })
}

/// The export stream's query parameters: its group and what it streams.
fn export_query(settings: &Settings) -> Value {
    json!([
        query_parameter(
            "group",
            true,
            "The stream's name: a consumer group of the caller's tenant of its own, so \
             a client that reconnects with the same name resumes where it left off.",
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_GROUP_LEN,
                "pattern": "^[A-Za-z0-9._-]+$",
            }),
        ),
        query_parameter(
            "strategy",
            false,
            &format!(
                "What happens to an event when the stream's queue \
                 (`DOCSTREAM_EXPORT_MAX_QUEUE_SIZE`, {}) is full: `block` waits (nothing \
                 is skipped), `drop_oldest` and `drop_new` drop and count. The default is \
                 `DOCSTREAM_EXPORT_BACKPRESSURE_STRATEGY` ({}).",
                settings.export_max_queue_size, settings.export_backpressure_strategy
            ),
            json!({"type": "string", "enum": ["block", "drop_oldest", "drop_new"]}),
        ),
        query_parameter(
            "ack",
            false,
            "`client` (the default): the client acknowledges; `auto`: an event counts as \
             received once the socket took it.",
            json!({"type": "string", "enum": ["client", "auto"], "default": "client"}),
        ),
        query_parameter(
            "status",
            false,
            "Comma-separated statuses: only events whose job has one of them.",
            json!({"type": "string"}),
        ),
        query_parameter(
            "transition",
            false,
            "Comma-separated transitions: only events of one of them.",
            json!({"type": "string"}),
        ),
        query_parameter(
            "from",
            false,
            "Where a group with nothing committed yet starts: `latest` (events from now \
             on) or `earliest` (what the topic still holds). A group that committed \
             resumes where it was.",
            json!({"type": "string", "enum": ["latest", "earliest"], "default": "latest"}),
        ),
    ])
}

fn export(settings: &Settings) -> Value {
    let protocol = export_protocol(settings);
    let parameters = upgrade_headers()
        .as_array()
        .expect("a list")
        .iter()
        .chain(export_query(settings).as_array().expect("a list"))
        .cloned()
        .collect::<Vec<_>>();
    json!({
        "operationId": "exportStream",
        "tags": ["streams"],
        "summary": "Export stream (WebSocket)",
        "description": format!(
            "Upgrades to a WebSocket that streams the caller's tenant's events (scope \
             `export`). A request that is not a WebSocket upgrade, or has a missing, \
             malformed or unknown query parameter, gets 400.\n\n{protocol}"
        ),
        "parameters": parameters,
        "responses": upgrade_responses(&protocol),
    })
}

fn healthz() -> Value {
    json!({
        "operationId": "healthz",
        "tags": ["probes"],
        "summary": "Liveness",
        "description": "`ok` while the process serves requests.",
        "security": [],
        "responses": {
            "200": {
                "description": "Alive.",
                "content": {"text/plain": {"schema": {"type": "string", "const": "ok"}}},
            },
            "503": response("Unavailable"),
        },
    })
}

fn readyz() -> Value {
    json!({
        "operationId": "readyz",
        "tags": ["probes"],
        "summary": "Readiness",
        "description": "`ready` when Postgres and the broker answered the last probes and \
                        the process is not draining; else 503.",
        "security": [],
        "responses": {
            "200": {
                "description": "Ready for traffic.",
                "content": {"text/plain": {"schema": {"type": "string", "const": "ready"}}},
            },
            "503": response("Unavailable"),
        },
    })
}

fn openapi() -> Value {
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
            "503": response("Unavailable"),
        },
    })
}

fn components(settings: &Settings) -> Value {
    json!({
        "securitySchemes": {
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
        },
        "schemas": schemas(settings),
        "responses": error_responses(),
    })
}

/// The error answers every route shares.
fn error_responses() -> Value {
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
        "PayloadTooLarge": plain("The body is larger than the limit."),
        "UnsupportedMediaType": plain("The body is not declared as `application/json`."),
        "Unprocessable": plain(
            "The JSON does not describe a valid request, or the `Idempotency-Key` names \
             a job with another request."
        ),
        "TooManyRequests": {
            "description": "Past a quota of the tenant (submit rate, open jobs, sockets).",
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

/// The schemas of `components`, one function each, listed in the order a
/// reader meets them: the request and its answer, the job as it is read, the
/// deferred result, the errors, the streams' frames. (The rendered map is sorted by
/// name, so this order is for the source only.)
fn schemas(settings: &Settings) -> Value {
    json!({
        "ExtractionRequest": extraction_request(settings),
        "Document": document_schema(),
        "TextDocument": text_document(settings),
        "PagesDocument": pages_document(settings),
        "Page": page(settings),
        "Word": word(),
        "FieldSpec": field_spec(settings),
        "JsonValue": json_value(),
        "Accepted": accepted(),
        "Extraction": extraction(),
        "ExtractionResult": extraction_result(),
        "ExtractedValue": extracted_value(),
        "BboxRefinement": bbox_refinement(),
        "DeferredResult": deferred_result_schema(),
        "ResultRecorded": result_recorded(),
        "Error": error_schema(),
        "RetryError": retry_error(),
        "ErrorDetail": error_detail(),
        "ImportFrame": import_frame(),
        "ImportAnswer": import_answer(),
        "ExportFrame": export_frame(),
        "ExtractionEvent": extraction_event(),
        "ExportAck": export_ack(),
    })
}

/// A value of `kind`, or null.
fn nullable(kind: &str) -> Value {
    json!({"type": [kind, "null"]})
}

/// A moment that has happened.
fn timestamp() -> Value {
    json!({"type": "string", "format": "date-time"})
}

/// A timestamp, or null while it has not happened.
fn maybe_timestamp() -> Value {
    json!({"type": ["string", "null"], "format": "date-time"})
}

/// A finite number: a page's size or a box's edge.
fn coordinate() -> Value {
    json!({"type": "number", "minimum": -f64::MAX, "maximum": f64::MAX})
}

/// `ExtractionRequest`: the body of a submit, with the settings' limits and
/// the extractors they configure.
fn extraction_request(settings: &Settings) -> Value {
    let names = extractor_names(settings);
    let properties = json!({
        "document": schema("Document"),
        "fields": {
            "type": "array",
            "description": "What to extract, in the order it is reported. Names are unique \
                            within a request (else 422).",
            "minItems": 1,
            "maxItems": settings.max_fields,
            "items": schema("FieldSpec"),
        },
        "metadata": {
            "description": format!(
                "Opaque client data, echoed in every answer and event: at most {} bytes \
                 as compact JSON, nested at most {} levels deep (else 422).",
                settings.max_metadata_bytes, settings.max_json_depth
            ),
            "anyOf": [schema("JsonValue")],
        },
        "extractor": {
            "type": ["string", "null"],
            "description": format!(
                "Who extracts: `{RULES_EXTRACTOR}` (the default) is the built-in rule \
                 extractor, which needs a `pattern` or an `anchor` in every field; any \
                 other is an external extractor of the settings, for which both are hints. \
                 An unknown name gets 422. Names are 1 to {MAX_EXTRACTOR_NAME_LEN} of a-z, \
                 0-9, `-` and `_`."
            ),
            "maxLength": MAX_EXTRACTOR_NAME_LEN,
            "enum": names.iter().map(|n| Value::from(n.as_str())).chain([Value::Null]).collect::<Vec<_>>(),
        },
        "webhook_url": webhook_url(settings),
    });
    let mut request = json!({
        "type": "object",
        "description": "One extraction job.",
        "additionalProperties": false,
        "required": ["document", "fields"],
        "properties": properties,
    });
    // With external extractors, only a request for the rules extractor needs
    // a way to find each value.
    if names.len() > 1 {
        request["if"] = json!({"properties": {"extractor": {"enum": [RULES_EXTRACTOR, null]}}});
        request["then"] = json!({"properties": {"fields": {"items": rule_field()}}});
    }
    request
}

/// The request's `webhook_url`: a URL webhooks may reach, or only null when
/// webhooks are off, so that a client learns from the document which it is.
fn webhook_url(settings: &Settings) -> Value {
    if settings.webhooks_enabled {
        json!({
            "type": ["string", "null"],
            "description": format!(
                "Where the terminal state is reported: an absolute http or https URL with \
                 a host, at most {} bytes. A host that is, or resolves to, an address \
                 webhooks may not reach (loopback, private, link-local and other \
                 special-use addresses, unless `DOCSTREAM_WEBHOOK_ALLOW` admits it) gets \
                 422; a name that does not resolve yet is accepted, and judged again \
                 before each delivery.",
                settings.max_url_bytes
            ),
            "format": "uri",
            "maxLength": settings.max_url_bytes,
            "pattern": "^[hH][tT][tT][pP][sS]?://[^\\u0000]+$",
        })
    } else {
        json!({
            "type": "null",
            "description": "Webhooks are off in this deployment (`DOCSTREAM_WEBHOOKS_ENABLED`): \
                            a `webhook_url` other than null gets 422.",
        })
    }
}

/// `Document`: a text or pages of positioned words.
fn document_schema() -> Value {
    json!({
        "description": "Exactly one of `text` and `pages`.",
        "oneOf": [schema("TextDocument"), schema("PagesDocument")],
    })
}

/// `TextDocument`: plain text.
fn text_document(settings: &Settings) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["text"],
        "properties": {
            "text": {
                "type": "string",
                "description": format!(
                    "Plain text, not blank, of at most {} words (runs of non-whitespace; \
                     more is refused 422 `limit_exceeded`); values found in it have no boxes.",
                    settings.max_text_words
                ),
                "pattern": NOT_BLANK,
            },
            "pages": {"type": "null"},
        },
    })
}

/// `PagesDocument`: pages of positioned words, at most `max_pages`.
fn pages_document(settings: &Settings) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["pages"],
        "properties": {
            "pages": {
                "type": "array",
                "description": "Pages of positioned words, in reading order; at least one \
                                page has a word.",
                "minItems": 1,
                "maxItems": settings.max_pages,
                "items": schema("Page"),
                "contains": {"type": "object", "properties": {"words": {"minItems": 1}}},
            },
            "text": {"type": "null"},
        },
    })
}

/// `Page`: one page's size and words, at most `max_words_per_page`.
fn page(settings: &Settings) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["width", "height", "words"],
        "properties": {
            "width": coordinate(),
            "height": coordinate(),
            "words": {
                "type": "array",
                "description": "Words in reading order.",
                "maxItems": settings.max_words_per_page,
                "items": schema("Word"),
            },
        },
    })
}

/// `Word`: a word and its box.
fn word() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["text", "bbox"],
        "properties": {
            "text": {"type": "string", "pattern": NO_NUL},
            "bbox": {
                "type": "array",
                "description": "`[x0, y0, x1, y1]`, top-left origin, with x0 <= x1 and \
                                y0 <= y1 (else 422).",
                "minItems": 4,
                "maxItems": 4,
                "items": coordinate(),
            },
        },
    })
}

/// What the rules extractor needs of a field: a `pattern`, or an anchor
/// that is not blank.
fn rule_field() -> Value {
    json!({
        "anyOf": [
            {"required": ["pattern"], "properties": {"pattern": {"type": "string"}}},
            {"required": ["anchor"], "properties": {"anchor": {"type": "string", "pattern": NOT_BLANK}}},
        ],
    })
}

/// `FieldSpec`: one field to extract, with the settings' limits.
fn field_spec(settings: &Settings) -> Value {
    let mut spec = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["name"],
        "properties": {
            "name": {
                "type": "string",
                "description": format!(
                    "The value's key in the result: not blank, at most {} bytes, unique \
                     within the request.",
                    settings.max_field_name_bytes
                ),
                "minLength": 1,
                "maxLength": settings.max_field_name_bytes,
                "pattern": NOT_BLANK,
            },
            "type": {
                "type": "string",
                "description": "How the value is recognised and normalised.",
                "enum": field_types(),
                "default": "string",
            },
            "pattern": {
                "type": ["string", "null"],
                "description": format!(
                    "A regular expression (Rust `regex` syntax); capture group 1, if any, \
                     is the value. At most {} bytes; one that does not compile, or \
                     compiles to more than {} bytes, gets 422.",
                    settings.max_pattern_bytes, settings.max_pattern_program_bytes
                ),
                "format": "rust-regex",
                "maxLength": settings.max_pattern_bytes,
                "pattern": NO_NUL,
            },
            "anchor": {
                "type": ["string", "null"],
                "description": format!(
                    "The words that come before the value (\"Invoice number\", \"Total\"); \
                     at most {} bytes.",
                    settings.max_anchor_bytes
                ),
                "maxLength": settings.max_anchor_bytes,
                "pattern": NO_NUL,
            },
            "required": {
                "type": "boolean",
                "description": "When true, a document without this field fails the job.",
                "default": false,
            },
        },
    });
    // With the rules extractor alone, every field needs a way to be found.
    if extractor_names(settings).len() == 1 {
        spec["anyOf"] = rule_field()["anyOf"].clone();
    }
    spec
}

/// `JsonValue`: any JSON Postgres can store (the request's `metadata`).
fn json_value() -> Value {
    json!({
        "description": "Any JSON without NUL characters in its strings.",
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", "pattern": NO_NUL},
            {"type": "array", "items": schema("JsonValue")},
            {
                "type": "object",
                "propertyNames": {"pattern": NO_NUL},
                "additionalProperties": schema("JsonValue"),
            },
        ],
    })
}

/// `Accepted`: the answer to a submit.
fn accepted() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "status"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "status": {
                "type": "string",
                "description": "`queued` for a new job; a repeated key answers its job's status.",
                "enum": statuses(),
            },
        },
    })
}

/// `Extraction`: a job as `GET /v1/extractions/{id}` answers it.
fn extraction() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": [
            "id", "status", "attempts", "idempotency_key", "submitted_at", "started_at",
            "finished_at", "result", "error", "next_attempt_at", "cancel_requested_at",
            "post_processing", "webhook_url", "metadata"
        ],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "status": {"type": "string", "enum": statuses()},
            "attempts": {"type": "integer", "minimum": 0, "description": "Claims so far."},
            "idempotency_key": nullable("string"),
            "submitted_at": timestamp(),
            "started_at": maybe_timestamp(),
            "finished_at": maybe_timestamp(),
            "result": {
                "description": "The extracted values once the job succeeded, else null.",
                "oneOf": [{"type": "null"}, schema("ExtractionResult")],
            },
            "error": {"type": ["string", "null"], "description": "Why the job failed or was retried."},
            "next_attempt_at": maybe_timestamp(),
            "cancel_requested_at": maybe_timestamp(),
            "post_processing": {
                "type": "object",
                "additionalProperties": false,
                "description": "`bbox_refinement` once the extraction succeeded, else empty.",
                "properties": {"bbox_refinement": schema("BboxRefinement")},
            },
            "webhook_url": nullable("string"),
            "metadata": {"description": "The request's `metadata`, unchanged (null without one)."},
        },
    })
}

/// `ExtractionResult`: the values a job found.
fn extraction_result() -> Value {
    json!({
        "type": "object",
        "required": ["fields"],
        "properties": {
            "fields": {
                "type": "object",
                "description": "Each requested field by name: its value, or null when it was not found.",
                "additionalProperties": {"oneOf": [{"type": "null"}, schema("ExtractedValue")]},
            },
        },
    })
}

/// `ExtractedValue`: one value found, and where.
fn extracted_value() -> Value {
    json!({
        "type": "object",
        "required": ["value"],
        "properties": {
            "value": {"type": "string", "description": "Normalised: `1234.50` for money, `2026-11-30` for dates."},
            "raw": {"type": "string", "description": "The text as the document has it."},
            "words": {
                "type": "array",
                "description": "First and last index (inclusive) of the words it spans.",
                "minItems": 2,
                "maxItems": 2,
                "items": {"type": "integer", "minimum": 0},
            },
        },
    })
}

/// `BboxRefinement`: the state of a job's bbox refinement.
fn bbox_refinement() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": [
            "status", "attempts", "requested_at", "published_at", "started_at",
            "lease_expires_at", "finished_at", "result", "error", "republished_at",
            "last_recovery_s"
        ],
        "properties": {
            "status": {"type": "string", "enum": bbox_statuses()},
            "attempts": {"type": "integer", "minimum": 0},
            "requested_at": maybe_timestamp(),
            "published_at": maybe_timestamp(),
            "started_at": maybe_timestamp(),
            "lease_expires_at": maybe_timestamp(),
            "finished_at": maybe_timestamp(),
            "result": {"description": "Grounded boxes per field, once grounding finished (else null)."},
            "error": nullable("string"),
            "republished_at": maybe_timestamp(),
            "last_recovery_s": nullable("number"),
        },
    })
}

/// `DeferredResult`: what an extraction service posts later.
fn deferred_result_schema() -> Value {
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

/// `ResultRecorded`: what a deferred result did to the job.
fn result_recorded() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "status"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "status": {"type": "string", "enum": ["succeeded", "retried", "failed"]},
        },
    })
}

/// `Error`: the body of every failure.
fn error_schema() -> Value {
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
                                `payload_too_large`, `unsupported_media_type`, \
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

/// `ImportFrame`: a client frame of the import stream.
fn import_frame() -> Value {
    json!({
        "description": "A client frame of the import stream.",
        "type": "object",
        "additionalProperties": false,
        "required": ["request"],
        "properties": {
            "ref": {"description": "Anything; echoed in the answer."},
            "idempotency_key": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": MAX_IDEMPOTENCY_KEY_LEN,
                "pattern": "^[\\u0020-\\u007e]+$",
            },
            "request": schema("ExtractionRequest"),
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
                    "status": {"type": "string", "enum": statuses()},
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

/// `ExtractionEvent`: one won transition of a job.
fn extraction_event() -> Value {
    json!({
        "description": "One won transition of a job (`extraction.events`).",
        "type": "object",
        "required": ["extraction_id", "transition", "status", "reason", "published_at_ms"],
        "properties": {
            "extraction_id": {"type": "string", "format": "uuid"},
            "transition": {"type": "string"},
            "status": {"type": "string", "enum": statuses()},
            "bbox_status": {"type": ["string", "null"], "enum": bbox_statuses().into_iter().map(Value::from).chain([Value::Null]).collect::<Vec<_>>()},
            "token": {"type": ["integer", "null"]},
            "error": nullable("string"),
            "reason": {"type": "string", "enum": ["submit", "retry", "reaper", "operator"]},
            "published_at_ms": {"type": "integer"},
            "tenant_id": {"type": ["string", "null"], "format": "uuid"},
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.route("PATH", METHOD(…))` in the source of `src/api/` and its
    /// folders, so that a route added there (in any file) and not here fails.
    fn routes() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
        let route =
            regex::Regex::new(r#"\.route\(\s*("[^"]+"|PATH),\s*(get|post|put|patch|delete|any)\("#)
                .expect("a regex");
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
                routes.push((path, found[2].to_owned()));
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
            // The internal listener's route is not on the API's port.
            .filter(|(path, _)| path != "/metrics")
            .cloned()
            .collect();
        listed.sort();
        listed.dedup();
        let expected: Vec<(String, String)> = [
            ("/healthz", "get"),
            ("/openapi.json", "get"),
            ("/readyz", "get"),
            ("/v1/export", "get"),
            ("/v1/extractions", "post"),
            ("/v1/extractions/{id}", "get"),
            ("/v1/extractions/{id}/cancel", "post"),
            ("/v1/extractions/{id}/result", "post"),
            ("/v1/import", "get"),
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

    #[test]
    fn the_names_it_lists_are_the_ones_the_server_reads() {
        for status in statuses() {
            assert!(status.parse::<ExtractionStatus>().is_ok());
        }
        for status in bbox_statuses() {
            assert!(status.parse::<BboxStatus>().is_ok());
        }
        for field_type in field_types() {
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
