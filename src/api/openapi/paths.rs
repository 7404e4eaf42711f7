//! The route table of the document: each operation, its parameters and
//! answers, and the error answers they share. The bodies they name are in
//! [`super::schemas`].

use serde_json::{json, Value};

use super::{response, schema, PATH};
use crate::api::export::MAX_GROUP_LEN;
use crate::api::list::DEFAULT_PAGE;
use crate::config::Settings;
use crate::domain::{BboxStatus, ExtractionStatus, Scope, MAX_IDEMPOTENCY_KEY_LEN};
use crate::store::list::{MAX_ERROR_PREFIX_CHARS, MAX_METADATA_KEYS, MAX_PAGE, SCAN_BUDGET};

/// The document's `info`, with the limits every route shares.
pub(super) fn info(settings: &Settings) -> Value {
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
pub(super) fn websockets(settings: &Settings) -> Value {
    json!({
        "/v1/import": {"get": import()},
        "/v1/export": {"get": export(settings)},
    })
}

/// The HTTP routes.
pub(super) fn paths(settings: &Settings) -> Value {
    json!({
        "/v1/extractions": {"get": list(), "post": submit(settings)},
        "/v1/extractions/{id}": {"get": read(), "delete": erase()},
        "/v1/extractions/{id}/cancel": {"post": cancel()},
        "/v1/extractions/{id}/retry": {"post": retry()},
        "/v1/extractions/{id}/transitions": {"get": transitions()},
        "/v1/extractions/{id}/fields/{field}/corrections": {"post": correct()},
        "/v1/extractions/{id}/corrections": {"get": corrections()},
        "/v1/extractions/{id}/document": {"get": job_document()},
        "/v1/extractions/{id}/pages/{page}": {"get": job_page()},
        "/v1/extractions/{id}/result": {"post": deferred_result(settings)},
        "/v1/extractions/actions": {"post": bulk_action()},
        "/v1/extractions/actions/{id}": {"get": bulk_operation()},
        "/v1/dead-letters": {"get": dead_letters()},
        "/v1/dead-letters/{id}/replay": {"post": replay_letter()},
        "/v1/files": {"post": upload_file(settings)},
        "/v1/files/{id}": {"get": read_file()},
        "/v1/extractions/{id}/file": {"get": job_file()},
        "/v1/overview": {"get": overview(false)},
        "/v1/me": {"get": me()},
        "/v1/tenant": {"get": tenant()},
        "/v1/operator/overview": {"get": overview(true)},
        "/v1/operator/tenants": {"get": every_tenant()},
        "/healthz": {"get": healthz()},
        "/readyz": {"get": readyz()},
        PATH: {"get": openapi()},
    })
}

/// An operation's answers: `success` (its own, by status) and the shared
/// error answers of `refusals`.
fn answers(success: Value, refusals: &[u16]) -> Value {
    let mut answers = match success {
        Value::Object(map) => map,
        _ => unreachable!("answers by status"),
    };
    for status in refusals {
        let name = match status {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            408 => "BodyTimeout",
            409 => "Conflict",
            410 => "Gone",
            413 => "PayloadTooLarge",
            415 => "UnsupportedMediaType",
            422 => "Unprocessable",
            429 => "TooManyRequests",
            503 => "Unavailable",
            other => unreachable!("no shared answer for {other}"),
        };
        answers.insert(status.to_string(), response(name));
    }
    Value::Object(answers)
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
    links_from("$response.body#/id", to)
}

/// Links from the extraction id at `id` (a runtime expression) of an answer
/// to the routes that take it.
fn links_from(id: &str, to: &[(&str, &str)]) -> Value {
    let links: serde_json::Map<String, Value> = to
        .iter()
        .map(|(name, operation)| {
            let link = json!({
                "operationId": operation,
                "parameters": {"id": id},
            });
            (name.to_string(), link)
        })
        .collect();
    Value::Object(links)
}

/// The optional `Idempotency-Key` header of a `what` (a submit, a bulk action).
fn idempotency_key_header(what: &str) -> Value {
    json!({
        "name": "Idempotency-Key",
        "in": "header",
        "required": false,
        "description": format!(
            "Makes the {what} safe to repeat: 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible \
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
         same key with another request gets 422, and the key of a job that was erased \
         410. Keys are unique within a tenant, and remembered until their job is purged \
         (`DOCSTREAM_RETENTION_DAYS` after it finished).\n\n\
         Past the tenant's submit rate or its cap on open jobs the answer is 429 with \
         `Retry-After`, and nothing is written. A JSON body is at most {body} bytes.\n\n\
         The document may also come as a file: `multipart/form-data` with a part \
         `request` (the JSON request without `document`) and a part `file` (at most \
         {file} bytes; a PDF, PNG, JPEG, TIFF or text file, known by its bytes). The \
         file is stored as `POST /v1/files` stores it and the job names it \
         (`document.object`), so the same key with the same file is the same job. A \
         refused request part stores nothing.\n\n\
         A multipart submit, or one whose `document.url` is fetched, is an upload: \
         past the tenant's uploads in progress on this server ({uploads}, \
         `DOCSTREAM_TENANT_MAX_UPLOADS`) it gets 429 with `Retry-After`; a body that \
         does not arrive whole within {timeout} s (`DOCSTREAM_HTTP_BODY_TIMEOUT_S`) \
         gets 408. A `Content-Length` past the limit gets 413 before a byte is read.",
        body = settings.http_body_limit_bytes,
        file = settings.file_max_bytes,
        uploads = settings.tenant_max_uploads,
        timeout = settings.http_body_timeout_s.get().as_secs_f64(),
    );
    json!({
        "operationId": "submitExtraction",
        "tags": ["extractions"],
        "summary": "Submit an extraction",
        "description": description,
        "parameters": [idempotency_key_header("submit")],
        "requestBody": {
            "required": true,
            "description": "The job. A body that is not JSON gets 400, one without \
                            `Content-Type: application/json` 415, one that does not \
                            describe a valid request 422.",
            // The multipart form is described in prose (above) only: the
            // fuzzer would send schema-valid forms whose parts the schema
            // cannot make valid requests of.
            "content": {"application/json": {"schema": schema("ExtractionRequest")}},
        },
        "responses": answers(json!({
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
        }), &[400, 401, 403, 408, 410, 413, 415, 422, 429, 503]),
    })
}

/// A comma-separated list of `names`, as a pattern.
fn names_pattern(names: &[&str]) -> String {
    let one = names.join("|");
    format!("^({one})(,({one}))*$")
}

fn list() -> Value {
    json!({
        "operationId": "listExtractions",
        "tags": ["extractions"],
        "summary": "List extractions",
        "description": format!(
            "The caller's tenant's jobs a page at a time (scope `read`), newest first by \
             id (a UUIDv7, so submit order to the millisecond), narrowed by the \
             parameters; another tenant's jobs never appear. Follow `next_cursor` until \
             it is null: a page continues strictly after the previous one, so no job is \
             on two pages and none that existed when the walk began is skipped, however \
             many are submitted meanwhile (new jobs land before the first page).\n\n\
             `metadata.KEY=VALUE` (up to {MAX_METADATA_KEYS} of them) keeps the jobs whose \
             `metadata` has the top-level KEY with that value, compared as text (`7` \
             matches the number and the string). Each job is the `Extraction` that `GET \
             /v1/extractions/{{id}}` answers, but its `result` is null unless \
             `include=result`.\n\n\
             A page of statuses and an idempotency key reads only the jobs it returns. \
             The other filters are checked job by job, over at most {budget} jobs per \
             page: such a page may return fewer than `limit` jobs (even none) and a \
             `next_cursor` to go on. A parameter given twice, unknown, or not of its \
             form gets 400.",
            budget = SCAN_BUDGET,
        ),
        "parameters": list_parameters(),
        "responses": answers(json!({
            "200": {
                "description": "A page of jobs.",
                "content": {"application/json": {"schema": schema("ExtractionPage")}},
                "links": links_from("$response.body#/items/0/id", &[
                    ("GetFirstExtraction", "getExtraction"),
                    ("RetryFirstExtraction", "retryExtraction"),
                ]),
            },
        }), &[400, 401, 403, 429, 503]),
    })
}

/// The list's query parameters: its filters, then its page.
fn list_parameters() -> Value {
    let mut parameters = list_filters();
    parameters.extend(list_page());
    Value::Array(parameters)
}

/// The list's filters.
fn list_filters() -> Vec<Value> {
    let statuses: Vec<&str> = ExtractionStatus::ALL.map(ExtractionStatus::as_str).to_vec();
    let bbox_statuses: Vec<&str> = BboxStatus::ALL.map(BboxStatus::as_str).to_vec();
    let time = |name: &str, description: &str| {
        query_parameter(
            name,
            false,
            description,
            json!({"type": "string", "format": "date-time"}),
        )
    };
    vec![
        // Repeats are allowed (and mean nothing), so the pattern alone
        // admits any length; the list refuses every value past its bound.
        query_parameter(
            "status",
            false,
            "Comma-separated job states: jobs in one of them.",
            json!({"type": "string", "pattern": names_pattern(&statuses),
                   "maxLength": crate::api::query::MAX_QUERY_TEXT}),
        ),
        query_parameter(
            "bbox_status",
            false,
            "Comma-separated bbox refinement states: jobs whose refinement is in one of them.",
            json!({"type": "string", "pattern": names_pattern(&bbox_statuses),
                   "maxLength": crate::api::query::MAX_QUERY_TEXT}),
        ),
        query_parameter(
            "extractor",
            false,
            "Jobs of this extractor (`rules` includes the requests that named none).",
            json!({"type": "string", "pattern": "^[a-z0-9_-]{1,64}$"}),
        ),
        time(
            "submitted_after",
            "Jobs submitted at or after this time (RFC 3339).",
        ),
        time("submitted_before", "Jobs submitted before this time."),
        time("finished_after", "Jobs finished at or after this time."),
        time("finished_before", "Jobs finished before this time."),
        query_parameter(
            "idempotency_key",
            false,
            "The job submitted with this key.",
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_IDEMPOTENCY_KEY_LEN,
                "pattern": "^[\\u0020-\\u007e]+$",
            }),
        ),
        query_parameter(
            "error_prefix",
            false,
            "Jobs whose `error` starts with this text.",
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_ERROR_PREFIX_CHARS,
                "pattern": "^[^\\u0000]+$",
            }),
        ),
        query_parameter(
            "needs_review",
            false,
            "`true`: jobs with a grounded value flagged `needs_review` (under its \
             request's `min_confidence`) that no correction settled yet, a reviewer's \
             queue; `false`: jobs with none.",
            json!({"type": "string", "enum": ["true", "false"]}),
        ),
    ]
}

/// The list's page: its size, where it continues, its order, and whether
/// each job comes with its result.
fn list_page() -> Vec<Value> {
    vec![
        query_parameter(
            "limit",
            false,
            "Jobs per page.",
            json!({"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}),
        ),
        query_parameter(
            "cursor",
            false,
            "The previous page's `next_cursor`.",
            json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{21}[AQgw]$"}),
        ),
        query_parameter(
            "order",
            false,
            "`desc` (newest first) or `asc`.",
            json!({"type": "string", "enum": ["desc", "asc"], "default": "desc"}),
        ),
        query_parameter(
            "include",
            false,
            "`result`: each job with its result.",
            json!({"type": "string", "enum": ["result"]}),
        ),
    ]
}

fn read() -> Value {
    json!({
        "operationId": "getExtraction",
        "tags": ["extractions"],
        "summary": "Read an extraction",
        "description": "The job (scope `read`): its status, attempts, timestamps, result, \
                        error and bbox refinement. The document itself is not echoed. \
                        Another tenant's job is not found, exactly like one that does not exist. \
                        A job whose content was erased answers 410.",
        "parameters": [
            id_parameter(),
            query_parameter("include", false,
                "`request`: the job with its request as submitted (document, fields, metadata).",
                json!({"type": "string", "enum": ["request"]})),
        ],
        "responses": answers(json!({
            "200": {
                "description": "The job.",
                "content": {"application/json": {"schema": schema("Extraction")}},
                "links": links(&[("CancelExtraction", "cancelExtraction")]),
            },
        }), &[400, 401, 403, 404, 410, 429, 503]),
    })
}

fn upload_file(settings: &Settings) -> Value {
    let binary = json!({"schema": {
        "type": "string",
        "contentMediaType": "application/octet-stream",
        "minLength": 1,
    }});
    let description = format!(
        "Stores a document sent as its bytes, the whole body (scope `submit`): a PDF, PNG, \
         JPEG, TIFF or UTF-8 text file of at most {max} bytes \
         (`DOCSTREAM_FILE_MAX_BYTES`). What it is comes from its bytes; a `Content-Type` \
         naming another kind answers 415 (send `application/octet-stream` to let the bytes \
         say). The file's id is its SHA-256: the same bytes uploaded again by the same \
         tenant answer the same file, 200 instead of 201. A tenant never sees another's \
         files.\n\n\
         A `Content-Length` past the limit gets 413 before a byte is read. Past the \
         tenant's uploads in progress on this server ({uploads}, \
         `DOCSTREAM_TENANT_MAX_UPLOADS`) the answer is 429 with `Retry-After`, and so it \
         is past the tenant's bytes of files and of the documents its jobs read from \
         them (`DOCSTREAM_TENANT_MAX_FILE_BYTES`). A body that does not arrive whole \
         within {timeout} s (`DOCSTREAM_HTTP_BODY_TIMEOUT_S`) gets 408.",
        max = settings.file_max_bytes,
        uploads = settings.tenant_max_uploads,
        timeout = settings.http_body_timeout_s.get().as_secs_f64(),
    );
    json!({
        "operationId": "uploadFile",
        "tags": ["files"],
        "summary": "Upload a file",
        "description": description,
        "requestBody": {
            "required": true,
            "content": {
                "application/octet-stream": binary,
                "application/pdf": binary,
                "image/png": binary,
                "image/jpeg": binary,
                "image/tiff": binary,
                "text/plain": binary,
            },
        },
        "responses": answers(json!({
            "201": {
                "description": "Stored: these bytes are new to the tenant.",
                "content": {"application/json": {"schema": schema("File")}},
            },
            "200": {
                "description": "The tenant had uploaded these bytes before: the same file.",
                "content": {"application/json": {"schema": schema("File")}},
            },
        }), &[400, 401, 403, 408, 413, 415, 422, 429, 503]),
    })
}

fn read_file() -> Value {
    json!({
        "operationId": "getFile",
        "tags": ["files"],
        "summary": "Read a file's description",
        "description": "The tenant's file (scope `read`): its id, SHA-256, size, kind and \
                        when it was first uploaded. Another tenant's file is not found, \
                        exactly like one that does not exist.",
        "parameters": [{
            "name": "id",
            "in": "path",
            "required": true,
            "description": "The file's id: its SHA-256, lower-case hex.",
            "schema": {"type": "string"},
        }],
        "responses": answers(json!({
            "200": {
                "description": "The file.",
                "content": {"application/json": {"schema": schema("File")}},
            },
        }), &[401, 403, 404, 429, 503]),
    })
}

fn job_file() -> Value {
    let query = |name: &str, description: &str, schema: Value| {
        json!({"name": name, "in": "query", "required": true,
               "description": description, "schema": schema})
    };
    json!({
        "operationId": "getExtractionFile",
        "tags": ["files"],
        "summary": "Fetch a job's file (extractor protocol version 2)",
        "description": "The bytes of the job's file, for the extraction service that got \
                        this URL in its call (files in the folder store; a bucket presigns \
                        its own URLs). No API key: the URL is signed with the deployment's \
                        callback secret for one attempt of one job, and works while that \
                        attempt holds the job, until it expires (`DOCSTREAM_FILE_URL_TTL_S`). \
                        An expired, altered or unsigned URL gets 403; one whose attempt \
                        ended (the job finished, or another attempt holds it) 410.",
        "security": [],
        "parameters": [
            id_parameter(),
            query("attempt", "The attempt the URL was made for.", json!({"type": "integer", "minimum": 1})),
            query("expires", "Unix seconds past which it is refused.", json!({"type": "integer"})),
            query("signature", "base64url HMAC-SHA256 of the job, the attempt and the expiry.", json!({"type": "string"})),
        ],
        "responses": answers(json!({
            "200": {
                "description": "The file's bytes, with its sniffed media type.",
                "content": {
                    "application/pdf": {"schema": {"type": "string", "format": "binary"}},
                    "image/png": {"schema": {"type": "string", "format": "binary"}},
                    "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
                    "image/tiff": {"schema": {"type": "string", "format": "binary"}},
                    "text/plain": {"schema": {"type": "string"}},
                },
            },
        }), &[400, 403, 404, 410, 503]),
    })
}

fn transitions() -> Value {
    json!({
        "operationId": "getExtractionTransitions",
        "tags": ["extractions"],
        "summary": "Read an extraction's transition log",
        "description": "Every transition the job went through, oldest first (scope `read`): \
                        its submit, each claim with its attempt, each ending. At most 1,000.",
        "parameters": [id_parameter()],
        "responses": answers(json!({
            "200": {
                "description": "The log.",
                "content": {"application/json": {"schema": {
                    "type": "array", "items": schema("TransitionLogEntry")}}},
            },
        }), &[400, 401, 403, 404, 429, 503]),
    })
}

fn correct() -> Value {
    json!({
        "operationId": "correctExtractionField",
        "tags": ["extractions"],
        "summary": "Correct an extracted value",
        "description": "A person's review of a succeeded job's value (scope `review`), most \
                        often one flagged `needs_review`. The correction is stored beside the \
                        extracted value, which stays in the result as the extractor gave it; \
                        it is logged as the transition `correct_field`, published on the \
                        events topic (and so the export stream) with what was corrected, and \
                        sent to the job's webhook as `extraction.field_corrected`. A later \
                        correction of the same field supersedes it. A job that has not \
                        succeeded answers 409; an erased one 410; a field the request did \
                        not name 422.",
        "parameters": [id_parameter(), {
            "name": "field", "in": "path", "required": true,
            "description": "The field's name, as the request gave it.",
            "schema": {"type": "string", "minLength": 1},
        }],
        "requestBody": {
            "required": true,
            "content": {"application/json": {"schema": schema("CorrectionRequest")}},
        },
        "responses": answers(json!({
            "201": {
                "description": "Stored.",
                "content": {"application/json": {"schema": schema("Correction")}},
            },
        }), &[400, 401, 403, 404, 409, 410, 422, 429, 503]),
    })
}

fn job_document() -> Value {
    json!({
        "operationId": "getExtractionDocument",
        "tags": ["extractions"],
        "summary": "Read the document an extraction was read from",
        "description": "The words the job's values were found in, on their pages (scope \
                        `read`): the request's document, or for a file what its extraction \
                        read of it (a text layer's words, or OCR's with their `confidence`). \
                        404 until a file's extraction read it; 410 once erased.",
        "parameters": [id_parameter()],
        "responses": answers(json!({
            "200": {
                "description": "The document.",
                "content": {"application/json": {"schema": schema("Document")}},
            },
        }), &[400, 401, 403, 404, 410, 429, 503]),
    })
}

fn job_page() -> Value {
    json!({
        "operationId": "getExtractionPage",
        "tags": ["extractions"],
        "summary": "Draw a page of an extraction's file",
        "description": "Page `page` (from 0, as a grounded field's `page`) of the job's file as \
                        an image, to check a box against (scope `read`): a PNG's or JPEG's own \
                        bytes, or a PDF page rendered to a PNG at 100 dpi (its boxes are in \
                        points: scale by 100/72). A TIFF is not drawn (422): browsers do not \
                        read it. A job whose document was JSON, or a page past the last, is \
                        404.",
        "parameters": [id_parameter(), {
            "name": "page", "in": "path", "required": true,
            "description": "The page, from 0 (no file has more pages than this maximum).",
            "schema": {"type": "integer", "minimum": 0, "maximum": crate::config::MAX_PAGES - 1},
        }],
        "responses": answers(json!({
            "200": {
                "description": "The page.",
                "content": {
                    "image/png": {"schema": {"type": "string", "format": "binary"}},
                    "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
                },
            },
        }), &[400, 401, 403, 404, 410, 422, 429, 503]),
    })
}

fn corrections() -> Value {
    json!({
        "operationId": "getExtractionCorrections",
        "tags": ["extractions"],
        "summary": "Read an extraction's corrections",
        "description": "Every correction of the job's values, oldest first (scope `read`): \
                        the latest of a field is its value now.",
        "parameters": [id_parameter()],
        "responses": answers(json!({
            "200": {
                "description": "The corrections.",
                "content": {"application/json": {"schema": {
                    "type": "array", "items": schema("Correction")}}},
            },
        }), &[400, 401, 403, 404, 410, 429, 503]),
    })
}

fn erase() -> Value {
    json!({
        "operationId": "eraseExtraction",
        "tags": ["extractions"],
        "summary": "Erase an extraction",
        "description": "Erases a finished job's content now (scope `delete`): its request \
                        (document, fields, metadata, webhook URL), its results, its error \
                        texts and its webhook deliveries. The job stays as a tombstone \
                        without content: `GET` answers 410, the list shows it with \
                        `erased_at`, and a submit that repeats its `Idempotency-Key` \
                        answers 410 instead of making the job again. A job still queued or \
                        running, or whose bbox refinement has yet to run, answers 409: \
                        cancel it (or wait for it) first. Erasing an erased job answers \
                        204 again. Copies on Kafka topics (events, which carry errors but \
                        never documents or results, and dead letters' excerpts) expire \
                        with the topics' retention.",
        "parameters": [id_parameter()],
        "responses": answers(json!({
            "204": {"description": "Erased (now or before)."},
        }), &[400, 401, 403, 404, 409, 429, 503]),
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
        "responses": answers(json!({
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
        }), &[400, 401, 403, 404, 429, 409, 503]),
    })
}

fn retry() -> Value {
    json!({
        "operationId": "retryExtraction",
        "tags": ["extractions"],
        "summary": "Retry a failed extraction",
        "description": "Sends a failed job back to the queue (scope `cancel`), with a fresh \
                        budget of attempts: it runs again as if just submitted, and its \
                        `attempts` keep counting. The retry is logged as the transition \
                        `retry_failed` and published as every transition is. A job that is \
                        not failed answers 409 and is left as it is; an erased one 410.",
        "parameters": [id_parameter()],
        "responses": answers(json!({
            "200": {
                "description": "Retried: the job as it is now (queued).",
                "content": {"application/json": {"schema": schema("Extraction")}},
                "links": links(&[("GetExtraction", "getExtraction")]),
            },
        }), &[400, 401, 403, 404, 409, 410, 429, 503]),
    })
}

fn bulk_action() -> Value {
    let operation = json!({
        "description": "The operation: its counts so far and the first page of its outcomes.",
        "headers": {
            "Location": {
                "required": true,
                "description": "`/v1/extractions/actions/{id}`: follow the operation there.",
                "schema": {"type": "string", "pattern": "^/v1/extractions/actions/[0-9a-f-]{36}$"},
            },
        },
        "content": {"application/json": {"schema": schema("BulkOperation")}},
        "links": links(&[("GetBulkOperation", "getBulkOperation")]),
    });
    json!({
        "operationId": "startBulkAction",
        "tags": ["extractions"],
        "summary": "Cancel or retry many extractions",
        "description": format!(
            "Cancels or retries many of the caller's tenant's jobs (scope `cancel`), named \
             by `ids` (up to {max_ids}) or by `filter`, the parameters of `GET \
             /v1/extractions` (the jobs it admits as the walk reaches them, newest first; \
             jobs submitted after the action began are not acted on). Each job is treated as its own route treats it: a \
             cancel cancels a queued job and asks a running one to stop; a retry sends a \
             failed job back to the queue with a fresh budget of attempts. A job the \
             action does not apply to is `refused` with the reason, and the rest go on; an \
             id that is none of the caller's jobs is `not_found`.\n\n\
             The action runs in batches of {batch} jobs, each its own short transaction, so \
             that no lock is held for its length; the answer waits briefly, then gives the \
             operation as it is: 200 when it finished, 202 while it runs (follow \
             `Location`). If the server running it stops, another resumes it from its last \
             batch. With an `Idempotency-Key`, a repeat answers the first operation and \
             does nothing; the same key with another action gets 422.\n\n\
             A tenant runs at most `DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT` actions at \
             once, across the deployment: one more gets 429 with `Retry-After` (a repeat \
             of a running one is answered as it is).",
            max_ids = crate::pipeline::bulk::MAX_IDS,
            batch = crate::pipeline::bulk::BATCH,
        ),
        "parameters": [idempotency_key_header("bulk action")],
        "requestBody": {
            "required": true,
            "description": "The action and its jobs. A body that is not JSON gets 400, one \
                            that does not describe an action 422.",
            "content": {"application/json": {"schema": schema("BulkAction")}},
        },
        "responses": answers(json!({"200": operation, "202": operation}),
            &[400, 401, 403, 413, 415, 422, 429, 503]),
    })
}

fn bulk_operation() -> Value {
    json!({
        "operationId": "getBulkOperation",
        "tags": ["extractions"],
        "summary": "Follow a bulk action",
        "description": "A bulk operation of the caller's tenant (scope `read`): its state, \
                        its counts, and a page of its outcomes, newest job first. Follow \
                        `next_cursor` for the rest; `outcome` keeps one kind.",
        "parameters": [
            {
                "name": "id",
                "in": "path",
                "required": true,
                "description": "The operation's id (a UUID); anything else gets 400.",
                "schema": {"type": "string", "format": "uuid"},
            },
            query_parameter("outcome", false, "Only the outcomes of this kind.",
                json!({"type": "string", "enum": ["done", "refused", "not_found"]})),
            query_parameter("limit", false, "Outcomes per page.",
                json!({"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": crate::api::bulk::DEFAULT_OUTCOMES})),
            query_parameter("cursor", false, "The previous page's `next_cursor`.",
                json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{21}[AQgw]$"})),
        ],
        "responses": answers(json!({
            "200": {
                "description": "The operation.",
                "content": {"application/json": {"schema": schema("BulkOperation")}},
            },
        }), &[400, 401, 403, 404, 429, 503]),
    })
}

fn dead_letters() -> Value {
    json!({
        "operationId": "listDeadLetters",
        "tags": ["extractions"],
        "summary": "List dead letters",
        "description": "The caller's tenant's dead letters, newest first (scope `read`): the \
                        records of the Kafka intake that were refused after their key named \
                        the tenant (an invalid request, a reused key, a full queue), each \
                        with where it was and why. Records refused before (no key, a wrong \
                        one) belong to no tenant, and only operators see them. Follow \
                        `next_cursor` until it is null.",
        "parameters": [
            query_parameter("limit", false, "Letters per page.",
                json!({"type": "integer", "minimum": 1, "maximum": MAX_PAGE,
                       "default": crate::api::letters::DEFAULT_LETTERS})),
            query_parameter("cursor", false, "The previous page's `next_cursor`.",
                json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$"})),
        ],
        "responses": answers(json!({
            "200": {
                "description": "A page of letters.",
                "content": {"application/json": {"schema": schema("DeadLetterPage")}},
            },
        }), &[400, 401, 403, 429, 503]),
    })
}

fn replay_letter() -> Value {
    json!({
        "operationId": "replayDeadLetter",
        "tags": ["extractions"],
        "summary": "Replay a dead letter",
        "description": "Produces the letter's original record to its topic again (scope \
                        `submit`): the same bytes, key and headers, once. Use it when what \
                        refused the record has changed; its idempotency key still makes a \
                        record that became a job the same job. A record the intake refuses \
                        again is a new letter. 409 when the letter was replayed before, 410 \
                        when the topic no longer retains the record.",
        "parameters": [{
            "name": "id", "in": "path", "required": true,
            "description": "The letter's `id`.",
            "schema": {"type": "integer", "format": "int64", "minimum": 1},
        }],
        "responses": answers(json!({
            "200": {
                "description": "Where the copy went.",
                "content": {"application/json": {"schema": schema("Replayed")}},
            },
        }), &[400, 401, 403, 404, 409, 410, 429, 503]),
    })
}

fn overview(deployment: bool) -> Value {
    let (id, summary, description) = match deployment {
        false => (
            "getOverview",
            "The tenant's queue at a glance",
            "The caller's tenant's open jobs counted now (scope `read`), and the last \
             hour's census samples: one per `census_interval_s`, each with the jobs \
             open then, the oldest due job's wait, and the jobs submitted and finished \
             since the sample before.",
        ),
        true => (
            "getDeploymentOverview",
            "The deployment's queue at a glance",
            "The same for every tenant together (scope `operator`), with the open \
             orphans by class as the latest census found them.",
        ),
    };
    json!({
        "operationId": id,
        "tags": [if deployment { "operators" } else { "tenant" }],
        "summary": summary,
        "description": description,
        "responses": answers(json!({
            "200": {
                "description": "The open jobs and the samples.",
                "content": {"application/json": {"schema": schema("Overview")}},
            },
        }), &[401, 403, 429, 503]),
    })
}

fn me() -> Value {
    json!({
        "operationId": "getMe",
        "tags": ["tenant"],
        "summary": "Who the key belongs to",
        "description": "The key's tenant and its scopes (any key), so a client can tell \
                        what it may offer.",
        "responses": answers(json!({
            "200": {
                "description": "The caller.",
                "content": {"application/json": {"schema": schema("Me")}},
            },
        }), &[401, 429, 503]),
    })
}

fn tenant() -> Value {
    json!({
        "operationId": "getTenant",
        "tags": ["tenant"],
        "summary": "The tenant's quotas, keys and disabled webhook endpoints",
        "description": "The caller's tenant (scope `admin`): its quotas in force (its own, \
                        else the deployment's) and its open jobs against them, its \
                        retention, every key it has had (prefix, scopes, created, revoked; \
                        never the key), and the webhook endpoints its deliveries stopped \
                        going to.",
        "responses": answers(json!({
            "200": {
                "description": "The tenant.",
                "content": {"application/json": {"schema": schema("Tenant")}},
            },
        }), &[401, 403, 429, 503]),
    })
}

fn every_tenant() -> Value {
    json!({
        "operationId": "listTenants",
        "tags": ["operators"],
        "summary": "Every tenant's quotas, keys and disabled webhook endpoints",
        "description": "What `GET /v1/tenant` answers, for every live tenant by name \
                        (scope `operator`).",
        "responses": answers(json!({
            "200": {
                "description": "The tenants.",
                "content": {"application/json": {"schema": schema("TenantList")}},
            },
        }), &[401, 403, 429, 503]),
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
        "responses": answers(json!({
            "200": {
                "description": "What the result did to the job.",
                "content": {"application/json": {"schema": schema("ResultRecorded")}},
            },
        }), &[400, 401, 404, 409, 413, 422, 503]),
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
    let upgraded = json!({
        "101": {
            "description": format!("Switching Protocols: the WebSocket. {protocol}"),
            "headers": {
                "Upgrade": {"required": true, "schema": {"type": "string", "const": "websocket"}},
                "Sec-WebSocket-Accept": {"required": true, "schema": {"type": "string"}},
            },
        },
    });
    answers(upgraded, &[400, 401, 403, 429, 503])
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
        "responses": answers(json!({
            "200": {
                "description": "Alive.",
                "content": {"text/plain": {"schema": {"type": "string", "const": "ok"}}},
            },
        }), &[503]),
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
        "responses": answers(json!({
            "200": {
                "description": "Ready for traffic.",
                "content": {"text/plain": {"schema": {"type": "string", "const": "ready"}}},
            },
        }), &[503]),
    })
}

fn openapi() -> Value {
    json!({
        "operationId": "getOpenApi",
        "tags": ["probes"],
        "summary": "This document",
        "description": "The OpenAPI document of this server, with the limits its settings set.",
        "security": [],
        "responses": answers(json!({
            "200": {
                "description": "The document.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
        }), &[503]),
    })
}

/// Security schemes, schemas and shared answers.
pub(super) fn components(settings: &Settings) -> Value {
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
        "schemas": super::schemas::schemas(settings),
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
                            uploads in progress, bytes of files).",
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
