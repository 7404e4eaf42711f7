//! Bulk actions: `POST /v1/extractions/actions` cancels or retries many of
//! the caller's tenant's jobs, named by ids or by the list's filter, and
//! `GET /v1/extractions/actions/{id}` follows one, with each job's outcome.
//!
//! An operation runs in the background a batch at a time (see
//! [`crate::pipeline::bulk`]); the POST waits for it briefly, so a short
//! one is answered finished (200) and a long one running (202). Its
//! `Idempotency-Key` makes a repeat the same operation: the repeat answers
//! it as it is and does nothing. A tenant runs a few operations at once
//! (`DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT`); one more is answered 429.

use std::collections::BTreeMap;
use std::time::Duration;

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::describe;
use super::query::{cursor, cursor_of, each_param, page_limit, MAX_QUERY_TEXT};
use super::state::Api;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::{idempotency_key_is_valid, ExtractionStatus, Scope, MAX_IDEMPOTENCY_KEY_LEN};
use crate::pipeline::bulk;
use crate::store::bulk::{Action, Created, Operation, Outcome, Selection, Verdict};
use crate::store::list::{JobFilter, MAX_METADATA_KEYS, MAX_PAGE};
use crate::store::{self, StoreError};

/// How long the POST waits for its operation to finish before it answers
/// 202 (within the REST answer bound).
const WAIT: Duration = Duration::from_millis(1_000);

/// Seconds a tenant at its cap on running bulk actions is asked to wait: a
/// few batches' time.
const AT_CAP_RETRY_AFTER_S: u64 = 5;

/// Outcomes per page when the query does not say.
pub(super) const DEFAULT_OUTCOMES: i64 = 50;

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route("/v1/extractions/actions", post_with(start, describe_start))
        .api_route(
            "/v1/extractions/actions/{id}",
            get_with(follow, describe_follow),
        )
}

/// A bulk action: what to do, and to which jobs (exactly one of `ids` and
/// `filter`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    rename = "BulkAction",
    extend("oneOf" = [{"required": ["ids"]}, {"required": ["filter"]}])
)]
pub(super) struct BulkRequest {
    action: Action,
    /// The jobs, by id; an id that is none of the caller's jobs is
    /// reported `not_found`.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Vec<Uuid>", length(min = 1, max = 1000), transform = no_default)]
    ids: Option<Vec<Uuid>>,
    /// The jobs `GET /v1/extractions` lists with these parameters (jobs
    /// submitted after the action began are not acted on).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "FilterBody", transform = no_default)]
    filter: Option<FilterBody>,
}

/// A field that may be left out, but is not null when it is there.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// A field left out has no value (not the `null` its default would say).
fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// The list's filter as a JSON object: each field is the query parameter
/// of the same name, and `metadata` holds the `metadata.KEY` parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "JobFilter")]
pub(super) struct FilterBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(queued|running|succeeded|failed|cancelled)(,(queued|running|succeeded|failed|cancelled))*$"
    ))]
    status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(pending|running|succeeded|failed)(,(pending|running|succeeded|failed))*$"
    ))]
    bbox_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9_-]{1,64}$"))]
    extractor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    submitted_after: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    submitted_before: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_after: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_before: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), regex(pattern = r"^[\u0020-\u007e]+$"))]
    idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[^\u0000]+$"))]
    error_prefix: Option<String>,
    /// `true`: jobs with a value flagged `needs_review` not corrected yet;
    /// `false`: jobs with none.
    #[serde(skip_serializing_if = "Option::is_none")]
    needs_review: Option<bool>,
    /// Top-level metadata keys and the value each must have (as text).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 8,
        "propertyNames" = {"minLength": 1, "maxLength": 256, "pattern": "^[^\\u0000]+$"},
        "additionalProperties" = {"type": "string", "maxLength": 256, "pattern": "^[^\\u0000]*$"}
    ))]
    metadata: BTreeMap<String, String>,
}

impl FilterBody {
    /// The list's query parameters it stands for.
    fn params(&self) -> BTreeMap<String, String> {
        let time = |t: &Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339());
        let named = [
            ("status", self.status.clone()),
            ("bbox_status", self.bbox_status.clone()),
            ("extractor", self.extractor.clone()),
            ("submitted_after", time(&self.submitted_after)),
            ("submitted_before", time(&self.submitted_before)),
            ("finished_after", time(&self.finished_after)),
            ("finished_before", time(&self.finished_before)),
            ("idempotency_key", self.idempotency_key.clone()),
            ("error_prefix", self.error_prefix.clone()),
            ("needs_review", self.needs_review.map(|b| b.to_string())),
        ];
        let named = named
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_owned(), value?)));
        let metadata = (self.metadata.iter()).map(|(k, v)| (format!("metadata.{k}"), v.clone()));
        named.chain(metadata).collect()
    }

    /// The filter of query parameters `params` (what [`Self::params`] made).
    fn of(params: &BTreeMap<String, String>) -> Self {
        let mut body = Self::default();
        let time = |v: &str| DateTime::parse_from_rfc3339(v).ok().map(|t| t.to_utc());
        for (name, value) in params {
            let text = Some(value.clone());
            match name.as_str() {
                "status" => body.status = text,
                "bbox_status" => body.bbox_status = text,
                "extractor" => body.extractor = text,
                "submitted_after" => body.submitted_after = time(value),
                "submitted_before" => body.submitted_before = time(value),
                "finished_after" => body.finished_after = time(value),
                "finished_before" => body.finished_before = time(value),
                "idempotency_key" => body.idempotency_key = text,
                "error_prefix" => body.error_prefix = text,
                "needs_review" => body.needs_review = value.parse().ok(),
                other => {
                    let key = other.strip_prefix("metadata.").unwrap_or(other);
                    body.metadata.insert(key.to_owned(), value.clone());
                }
            }
        }
        body
    }
}

/// A bulk operation: what it did so far, and a page of its outcomes.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "BulkOperation", deny_unknown_fields)]
pub(super) struct OperationView {
    id: Uuid,
    action: Action,
    /// The jobs it acts on, as the request named them.
    #[serde(skip_serializing_if = "Option::is_none")]
    ids: Option<Vec<Uuid>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filter: Option<FilterBody>,
    /// `running` until its last batch committed, then `finished`.
    #[schemars(extend("enum" = ["running", "finished"]))]
    state: &'static str,
    /// Jobs acted on.
    #[schemars(range(min = 0))]
    done: i64,
    /// Jobs the action does not apply to in their state.
    #[schemars(range(min = 0))]
    refused: i64,
    /// Ids that are none of the caller's jobs.
    #[schemars(range(min = 0))]
    not_found: i64,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    /// A page of the outcomes so far, newest job first.
    outcomes: Vec<OutcomeView>,
    /// Where the next page of outcomes starts (pass it as `cursor`), or
    /// null when this page is the last so far.
    next_cursor: Option<String>,
}

/// What the action did to one job.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "BulkOutcome", deny_unknown_fields)]
struct OutcomeView {
    id: Uuid,
    outcome: Verdict,
    /// The job's state after the action (null when not found).
    status: Option<ExtractionStatus>,
    /// Why it was refused.
    reason: Option<String>,
}

impl From<Outcome> for OutcomeView {
    fn from(o: Outcome) -> Self {
        Self {
            id: o.id,
            outcome: o.verdict,
            status: o.status,
            reason: o.reason,
        }
    }
}

async fn start(
    caller: Caller,
    State(api): State<Api>,
    headers: HeaderMap,
    body: Result<Json<BulkRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Cancel)?;
    let limit = api.settings.body_limit;
    let Json(request) = body.map_err(|r| ApiError::from_json_rejection(r, limit))?;
    let key = match headers.get("idempotency-key") {
        None => Uuid::new_v4().to_string(),
        Some(key) => match key.to_str() {
            Ok(key) if idempotency_key_is_valid(key) => key.to_owned(),
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
                )))
            }
        },
    };
    let selection = selection(request.ids, request.filter)?;
    let owner = (caller.tenant_id, key.as_str());
    let (operation, new) = match api.bulk.create(owner, request.action, &selection).await? {
        Created::New(operation) => (operation, true),
        Created::Repeat(operation) => (operation, false),
        Created::AtCap(running) => return Err(at_cap(running)),
    };
    if !new && (operation.action() != request.action || operation.selection() != &selection) {
        return Err(ApiError::Unprocessable(
            "Idempotency-Key was used for another bulk action; use a new key".into(),
        ));
    }
    if new {
        let running = tokio::spawn(api.bulk.clone().run(operation.clone()));
        let _ = tokio::time::timeout(WAIT, running).await;
    }
    let operation = store::bulk::get(&api.pool, caller.tenant_id, operation.id)
        .await?
        .ok_or_else(|| ApiError::Internal("a bulk operation vanished".into()))?;
    let status = match operation.finished_at {
        Some(_) => StatusCode::OK,
        None => StatusCode::ACCEPTED,
    };
    let location = format!("/v1/extractions/actions/{}", operation.id);
    let view = view(&api, operation, None, None, DEFAULT_OUTCOMES).await?;
    Ok((status, [(header::LOCATION, location)], Json(view)).into_response())
}

fn describe_start(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let description = format!(
        "Cancels or retries many of the caller's tenant's jobs (scope `cancel`), named by \
         `ids` (up to {max_ids}) or by `filter`, the parameters of `GET /v1/extractions` \
         (the jobs it admits as the walk reaches them, newest first; jobs submitted after \
         the action began are not acted on). Each job is treated as its own route treats \
         it: a cancel cancels a queued job and asks a running one to stop; a retry sends \
         a failed job back to the queue with a fresh budget of attempts. A job the action \
         does not apply to is `refused` with the reason, and the rest go on; an id that \
         is none of the caller's jobs is `not_found`.\n\n\
         The action runs in batches of {batch} jobs, each its own short transaction, so \
         that no lock is held for its length; the answer waits briefly, then gives the \
         operation as it is: 200 when it finished, 202 while it runs (follow \
         `Location`). If the server running it stops, another resumes it from its last \
         batch. With an `Idempotency-Key`, a repeat answers the first operation and does \
         nothing; the same key with another action gets 422.\n\n\
         A tenant runs at most `DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT` actions at once, \
         across the deployment: one more gets 429 with `Retry-After` (a repeat of a \
         running one is answered as it is).",
        max_ids = bulk::MAX_IDS,
        batch = bulk::BATCH,
    );
    let op = describe::operation(
        op,
        "startBulkAction",
        "extractions",
        "Cancel or retry many extractions",
        &description,
    );
    let op = describe::body_described(
        op,
        "The action and its jobs. A body that is not JSON gets 400, one that does not \
         describe an action 422.",
    );
    let op = describe::parameters(op, [describe::idempotency_key_header("bulk action")]);
    let op = op
        .response_with::<200, Json<OperationView>, _>(operation_answer)
        .response_with::<202, Json<OperationView>, _>(operation_answer);
    describe::refusals(op, &[400, 403, 415, 422, 429])
}

/// The refusal of a tenant that runs `running` bulk actions, its cap: each
/// walks every job it names and writes an outcome per job, so a tenant
/// that starts hundreds at once would hold the database for everyone.
fn at_cap(running: i64) -> ApiError {
    ApiError::TooManyRequests {
        message: format!(
            "the tenant has {running} bulk actions running, the most it may \
             (DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT): start this one once one of them finished"
        ),
        retry_after_s: AT_CAP_RETRY_AFTER_S,
    }
}

/// The selection a request names: exactly one of ids and a filter, each
/// within its bounds.
fn selection(ids: Option<Vec<Uuid>>, filter: Option<FilterBody>) -> Result<Selection, ApiError> {
    let refuse = |why: String| Err(ApiError::Unprocessable(why));
    match (ids, filter) {
        (Some(ids), None) if ids.is_empty() || ids.len() > bulk::MAX_IDS => refuse(format!(
            "ids: 1 to {} ids, not {}",
            bulk::MAX_IDS,
            ids.len()
        )),
        (Some(ids), None) => Ok(Selection::Ids(ids)),
        (None, Some(filter)) => {
            if filter.metadata.len() > MAX_METADATA_KEYS {
                return refuse(format!(
                    "filter.metadata: more than {MAX_METADATA_KEYS} keys"
                ));
            }
            for text in filter.metadata.iter().flat_map(|(k, v)| [k, v]) {
                if text.len() > MAX_QUERY_TEXT {
                    return refuse(format!(
                        "filter.metadata: {text:?} is larger than the limit of {MAX_QUERY_TEXT} bytes"
                    ));
                }
            }
            let params = filter.params();
            let pairs = params.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            JobFilter::of(pairs).map_err(|e| ApiError::Unprocessable(format!("filter: {e}")))?;
            Ok(Selection::Filter(params))
        }
        _ => refuse("exactly one of `ids` and `filter`".into()),
    }
}

/// `GET /v1/extractions/actions/{id}`: the operation, and a page of its
/// outcomes (`outcome`, `cursor`, `limit`).
async fn follow(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<OperationView>, ApiError> {
    caller.require(Scope::Read)?;
    let Path(id) = id?;
    let (verdict, after, limit) = outcome_query(query.as_deref().unwrap_or_default())?;
    let operation = store::bulk::get(&api.pool, caller.tenant_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    Ok(Json(view(&api, operation, verdict, after, limit).await?))
}

/// A bulk action's answer, whether it finished (200) or runs (202).
fn operation_answer(
    answer: aide::transform::TransformResponse<'_, OperationView>,
) -> aide::transform::TransformResponse<'_, OperationView> {
    let answer =
        answer.description("The operation: its counts so far and the first page of its outcomes.");
    let answer = describe::with_header(
        answer,
        "Location",
        "`/v1/extractions/actions/{id}`: follow the operation there.",
        json!({"type": "string", "pattern": "^/v1/extractions/actions/[0-9a-f-]{36}$"}),
    );
    describe::links(answer, &[("GetBulkOperation", "getBulkOperation")])
}

fn describe_follow(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getBulkOperation",
        "extractions",
        "Follow a bulk action",
        "A bulk operation of the caller's tenant (scope `read`): its state, its counts, \
         and a page of its outcomes, newest job first. Follow `next_cursor` for the \
         rest; `outcome` keeps one kind.",
    );
    let query = |name: &str, description: &str, schema| {
        describe::query_parameter(name, false, description, schema)
    };
    let parameters = [
        describe::uuid_parameter("The operation's id (a UUID); anything else gets 400."),
        query(
            "outcome",
            "Only the outcomes of this kind.",
            json!({"type": "string", "enum": ["done", "refused", "not_found"]}),
        ),
        query(
            "limit",
            "Outcomes per page.",
            json!({"type": "integer", "minimum": 1, "maximum": MAX_PAGE,
                   "default": DEFAULT_OUTCOMES}),
        ),
        query(
            "cursor",
            "The previous page's `next_cursor`.",
            json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{21}[AQgw]$"}),
        ),
    ];
    let op = describe::parameters(op, parameters);
    let op = op.response_with::<200, Json<OperationView>, _>(|a| a.description("The operation."));
    describe::refusals(op, &[400, 403, 404])
}

/// The outcome filter and page a query asks for.
fn outcome_query(query: &str) -> Result<(Option<Verdict>, Option<Uuid>, i64), ApiError> {
    let (mut verdict, mut after, mut limit) = (None, None, DEFAULT_OUTCOMES);
    each_param(query, |name, value| {
        match name {
            "outcome" => {
                let parsed = serde_json::from_value(serde_json::Value::String(value.to_owned()));
                verdict = Some(parsed.map_err(|_| "`done`, `refused` or `not_found`")?);
            }
            "cursor" => after = Some(cursor(value)?),
            "limit" => limit = page_limit(value)?,
            _ => return Err("unknown".into()),
        }
        Ok(())
    })?;
    Ok((verdict, after, limit))
}

/// `operation` as answered, with a page of its outcomes.
async fn view(
    api: &Api,
    operation: Operation,
    verdict: Option<Verdict>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<OperationView, StoreError> {
    let pool = &api.pool;
    let mut outcomes = store::bulk::outcomes(pool, operation.id, verdict, after, limit + 1).await?;
    let more = outcomes.len() as i64 > limit;
    outcomes.truncate(limit as usize);
    let next_cursor = (more.then(|| outcomes.last().map(|o| o.id)).flatten()).map(cursor_of);
    let (ids, filter) = match operation.selection() {
        Selection::Ids(ids) => (Some(ids.clone()), None),
        Selection::Filter(params) => (None, Some(FilterBody::of(params))),
    };
    Ok(OperationView {
        id: operation.id,
        action: operation.action(),
        ids,
        filter,
        state: match operation.finished_at {
            Some(_) => "finished",
            None => "running",
        },
        done: operation.done,
        refused: operation.refused,
        not_found: operation.not_found,
        created_at: operation.created_at,
        finished_at: operation.finished_at,
        outcomes: outcomes.into_iter().map(OutcomeView::from).collect(),
        next_cursor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_body_is_the_list_query_it_stands_for_and_back() {
        let body: FilterBody = serde_json::from_value(serde_json::json!({
            "status": "failed",
            "extractor": "ocr",
            "submitted_after": "2026-12-01T00:00:00Z",
            "metadata": {"customer": "acme"},
        }))
        .unwrap();
        let params = body.params();
        assert_eq!(params["metadata.customer"], "acme");
        assert_eq!(params["status"], "failed");
        let pairs = params.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let filter = JobFilter::of(pairs).unwrap();
        assert_eq!(filter.statuses, vec![ExtractionStatus::Failed]);
        assert_eq!(FilterBody::of(&params).params(), params);
    }

    #[test]
    fn a_selection_is_one_of_ids_and_a_filter_within_bounds() {
        let refused = |ids: Option<Vec<Uuid>>, filter: Option<FilterBody>| {
            matches!(selection(ids, filter), Err(ApiError::Unprocessable(_)))
        };
        assert!(refused(None, None));
        assert!(refused(
            Some(vec![Uuid::nil()]),
            Some(FilterBody::default())
        ));
        assert!(refused(Some(vec![]), None));
        assert!(refused(Some(vec![Uuid::nil(); bulk::MAX_IDS + 1]), None));
        let nine = (0..9).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let filter = FilterBody {
            metadata: nine,
            ..FilterBody::default()
        };
        assert!(refused(None, Some(filter)));
        assert!(selection(None, Some(FilterBody::default())).is_ok());
    }

    #[test]
    fn the_filter_patterns_name_every_state() {
        let statuses = ExtractionStatus::ALL
            .map(ExtractionStatus::as_str)
            .join("|");
        let bbox = crate::domain::BboxStatus::ALL.map(|s| s.as_str()).join("|");
        let schema = schemars::schema_for!(FilterBody);
        let pattern = |field: &str| schema.as_value()["properties"][field]["pattern"].clone();
        assert_eq!(pattern("status"), format!("^({statuses})(,({statuses}))*$"));
        assert_eq!(pattern("bbox_status"), format!("^({bbox})(,({bbox}))*$"));
    }
}
