//! The words each handler's contract is written in, beside its handler
//! (`api_route(path, get_with(handler, describe))`): the shared error
//! answers by status, the parameters several routes take, and answers whose
//! headers, links or bytes the types cannot say.
//!
//! What the types can say they say: a handler's JSON body is its
//! extractor's type, a JSON answer the type it names
//! (`response_with::<200, Json<T>, _>`), a keyed route's security and
//! refusals its `Caller` (`api::auth`). What is written here by hand is
//! what the HTTP layer decides: the path's own words, a header, a page's
//! query (the list routes read their query strings themselves, to refuse
//! what serde would let pass).

use aide::openapi::{Operation, Parameter, ReferenceOr, Response, StatusCode};
use aide::transform::{TransformOperation, TransformResponse};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::domain::MAX_IDEMPOTENCY_KEY_LEN;

/// `json` as the OpenAPI object `T`. The JSON is this crate's own, so a
/// shape aide does not read is a bug, found by every test that builds the
/// document.
pub(crate) fn from_json<T: DeserializeOwned>(json: Value) -> T {
    serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("not an OpenAPI {}: {e}: {json}", std::any::type_name::<T>()))
}

/// An operation's name, tag, summary and description.
pub(crate) fn operation<'t>(
    op: TransformOperation<'t>,
    id: &str,
    tag: &str,
    summary: &str,
    description: &str,
) -> TransformOperation<'t> {
    op.id(id).tag(tag).summary(summary).description(description)
}

/// The shared error answers of `statuses` (each a `$ref` to
/// `components.responses`, which the document lists).
pub(crate) fn refusals<'t>(
    mut op: TransformOperation<'t>,
    statuses: &[u16],
) -> TransformOperation<'t> {
    refuse(op.inner_mut(), statuses);
    op
}

/// [`refusals`] on the operation itself, for an extractor's or a layer's answers.
pub(crate) fn refuse(operation: &mut Operation, statuses: &[u16]) {
    let responses = operation.responses.get_or_insert_with(Default::default);
    for &status in statuses {
        let reference = format!("#/components/responses/{}", error_answer(status));
        responses.responses.insert(
            StatusCode::Code(status),
            ReferenceOr::Reference {
                reference,
                description: None,
                summary: None,
            },
        );
    }
}

/// The name in `components.responses` of the error answer for `status`.
fn error_answer(status: u16) -> &'static str {
    match status {
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
    }
}

/// Adds `parameters` (OpenAPI parameter objects) in their order.
pub(crate) fn parameters(
    mut op: TransformOperation<'_>,
    parameters: impl IntoIterator<Item = Value>,
) -> TransformOperation<'_> {
    let operation = op.inner_mut();
    for parameter in parameters {
        let parameter: Parameter = from_json(parameter);
        operation.parameters.push(ReferenceOr::Item(parameter));
    }
    op
}

/// The path parameter `id`, an extraction's.
pub(crate) fn id_parameter() -> Value {
    uuid_parameter("The extraction's id (a UUID); anything else gets 400.")
}

/// A path parameter `id` that is a UUID.
pub(crate) fn uuid_parameter(description: &str) -> Value {
    path_parameter(
        "id",
        description,
        json!({"type": "string", "format": "uuid"}),
    )
}

/// A parameter of the path.
pub(crate) fn path_parameter(name: &str, description: &str, schema: Value) -> Value {
    json!({
        "name": name,
        "in": "path",
        "required": true,
        "description": description,
        "schema": schema,
    })
}

/// A parameter of the query string.
pub(crate) fn query_parameter(
    name: &str,
    required: bool,
    description: &str,
    schema: Value,
) -> Value {
    json!({
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    })
}

/// The optional `Idempotency-Key` header of a `what` (a submit, a bulk action).
pub(crate) fn idempotency_key_header(what: &str) -> Value {
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

/// The request body's description, and that it is required.
pub(crate) fn body_described<'t>(
    mut op: TransformOperation<'t>,
    description: &str,
) -> TransformOperation<'t> {
    if let Some(ReferenceOr::Item(body)) = op.inner_mut().request_body.as_mut() {
        body.description = Some(description.to_owned());
        body.required = true;
    }
    op
}

/// Replaces the request body with `body` (an OpenAPI request body object),
/// for a body no extractor type names (the bytes of a file, say).
pub(crate) fn raw_body<'t>(mut op: TransformOperation<'t>, body: Value) -> TransformOperation<'t> {
    op.inner_mut().request_body = Some(ReferenceOr::Item(from_json(body)));
    op
}

/// An answer no type names (bytes, plain text), as an OpenAPI response object.
pub(crate) fn raw_answer<'t>(
    mut op: TransformOperation<'t>,
    status: u16,
    answer: Value,
) -> TransformOperation<'t> {
    let response: Response = from_json(answer);
    let responses = op
        .inner_mut()
        .responses
        .get_or_insert_with(Default::default);
    responses
        .responses
        .insert(StatusCode::Code(status), ReferenceOr::Item(response));
    op
}

/// A header the answer always carries.
pub(crate) fn with_header<'t, T>(
    mut answer: TransformResponse<'t, T>,
    name: &str,
    description: &str,
    schema: Value,
) -> TransformResponse<'t, T> {
    let header = json!({"required": true, "description": description, "schema": schema});
    let header = ReferenceOr::Item(from_json(header));
    answer.inner().headers.insert(name.to_owned(), header);
    answer
}

/// Links from an answer carrying an extraction's `id` to the routes that take it.
pub(crate) fn links<'t, T>(
    answer: TransformResponse<'t, T>,
    to: &[(&str, &str)],
) -> TransformResponse<'t, T> {
    links_from(answer, "$response.body#/id", to)
}

/// Links from the extraction id at `id` (a runtime expression) of an answer
/// to the routes (by operation id) that take it.
pub(crate) fn links_from<'t, T>(
    mut answer: TransformResponse<'t, T>,
    id: &str,
    to: &[(&str, &str)],
) -> TransformResponse<'t, T> {
    for (name, operation) in to {
        let link = json!({"operationId": operation, "parameters": {"id": id}});
        let link = ReferenceOr::Item(from_json(link));
        answer.inner().links.insert((*name).to_owned(), link);
    }
    answer
}

/// A comma-separated list of `names`, as a pattern.
pub(crate) fn names_pattern(names: &[&str]) -> String {
    let one = names.join("|");
    format!("^({one})(,({one}))*$")
}
