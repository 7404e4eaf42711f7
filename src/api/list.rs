//! `GET /v1/extractions`: the caller's tenant's jobs a page at a time,
//! narrowed by the query (see [`crate::store::list`] for the order and what
//! a page costs). Another tenant's jobs are never read: every walk starts
//! from the caller's tenant.

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::{RawQuery, State};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{json, Value};

use super::describe;
use super::extractions::ExtractionView;
use super::query::{cursor, cursor_of, each_param, page_limit, MAX_QUERY_TEXT};
use super::state::Api;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::{BboxStatus, ExtractionStatus, Scope, MAX_IDEMPOTENCY_KEY_LEN};
use crate::store::list::{self, JobFilter, Order, PageRequest};
use crate::store::list::{MAX_ERROR_PREFIX_CHARS, MAX_METADATA_KEYS, MAX_PAGE, SCAN_BUDGET};
use crate::store::StoreError;

/// Jobs a page holds when the query does not say.
pub(super) const DEFAULT_PAGE: i64 = 50;

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new().api_route("/v1/extractions", get_with(list_jobs, describe_list))
}

/// A page of the caller's tenant's jobs.
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "ExtractionPage", deny_unknown_fields)]
pub(super) struct JobPage {
    /// The jobs, newest first (or oldest, with `order=asc`). A job's
    /// `result` is null unless the query has `include=result`.
    items: Vec<ExtractionView>,
    /// Where the next page starts (pass it as `cursor`), or null when this
    /// page is the last. A page may hold fewer jobs than `limit` and still
    /// have a next one: a filter no index answers scans a bounded number of
    /// jobs per page.
    next_cursor: Option<String>,
}

async fn list_jobs(
    caller: Caller,
    State(api): State<Api>,
    RawQuery(query): RawQuery,
) -> Result<Json<JobPage>, ApiError> {
    caller.require(Scope::Read)?;
    let (filter, page) = parse(query.as_deref().unwrap_or_default())?;
    let mut connection = api.pool.acquire().await.map_err(StoreError::from)?;
    let listed = list::list(&mut connection, caller.tenant_id, &filter, page).await?;
    let items = listed.jobs.into_iter().map(ExtractionView::from).collect();
    let next_cursor = listed.next.map(cursor_of);
    Ok(Json(JobPage { items, next_cursor }))
}

fn describe_list(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let description = format!(
        "The caller's tenant's jobs a page at a time (scope `read`), newest first by id \
         (a UUIDv7, so submit order to the millisecond), narrowed by the parameters; \
         another tenant's jobs never appear. Follow `next_cursor` until it is null: a \
         page continues strictly after the previous one, so no job is on two pages and \
         none that existed when the walk began is skipped, however many are submitted \
         meanwhile (new jobs land before the first page).\n\n\
         `metadata.KEY=VALUE` (up to {MAX_METADATA_KEYS} of them) keeps the jobs whose \
         `metadata` has the top-level KEY with that value, compared as text (`7` \
         matches the number and the string). Each job is the `Extraction` that `GET \
         /v1/extractions/{{id}}` answers, but its `result` is null unless \
         `include=result`.\n\n\
         A page of statuses and an idempotency key reads only the jobs it returns. The \
         other filters are checked job by job, over at most {SCAN_BUDGET} jobs per page: \
         such a page may return fewer than `limit` jobs (even none) and a `next_cursor` \
         to go on. A parameter given twice, unknown, or not of its form gets 400.",
    );
    let op = describe::operation(
        op,
        "listExtractions",
        "extractions",
        "List extractions",
        &description,
    );
    let op = describe::parameters(op, filters().into_iter().chain(page()));
    let op = op.response_with::<200, Json<JobPage>, _>(|answer| {
        let answer = answer.description("A page of jobs.");
        describe::links_from(
            answer,
            "$response.body#/items/0/id",
            &[
                ("GetFirstExtraction", "getExtraction"),
                ("RetryFirstExtraction", "retryExtraction"),
            ],
        )
    });
    describe::refusals(op, &[400, 403])
}

/// The list's filters, as query parameters.
fn filters() -> Vec<Value> {
    let statuses: Vec<&str> = ExtractionStatus::ALL.map(ExtractionStatus::as_str).to_vec();
    let bbox_statuses: Vec<&str> = BboxStatus::ALL.map(BboxStatus::as_str).to_vec();
    let query = |name: &str, description: &str, schema: Value| {
        describe::query_parameter(name, false, description, schema)
    };
    let time = |name: &str, description: &str| {
        query(
            name,
            description,
            json!({"type": "string", "format": "date-time"}),
        )
    };
    vec![
        // Repeats are allowed (and mean nothing), so the pattern alone
        // admits any length; the list refuses every value past its bound.
        query(
            "status",
            "Comma-separated job states: jobs in one of them.",
            json!({"type": "string", "pattern": describe::names_pattern(&statuses),
                   "maxLength": MAX_QUERY_TEXT}),
        ),
        query(
            "bbox_status",
            "Comma-separated bbox refinement states: jobs whose refinement is in one of them.",
            json!({"type": "string", "pattern": describe::names_pattern(&bbox_statuses),
                   "maxLength": MAX_QUERY_TEXT}),
        ),
        query(
            "extractor",
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
        query(
            "idempotency_key",
            "The job submitted with this key.",
            json!({"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_LEN,
                   "pattern": "^[\\u0020-\\u007e]+$"}),
        ),
        query(
            "error_prefix",
            "Jobs whose `error` starts with this text.",
            json!({"type": "string", "minLength": 1, "maxLength": MAX_ERROR_PREFIX_CHARS,
                   "pattern": "^[^\\u0000]+$"}),
        ),
        query(
            "needs_review",
            "`true`: jobs with a grounded value flagged `needs_review` (under its \
             request's `min_confidence`) that no correction settled yet, a reviewer's \
             queue; `false`: jobs with none.",
            json!({"type": "string", "enum": ["true", "false"]}),
        ),
    ]
}

/// The list's page: its size, where it continues, its order, and whether
/// each job comes with its result.
fn page() -> Vec<Value> {
    let query = |name: &str, description: &str, schema: Value| {
        describe::query_parameter(name, false, description, schema)
    };
    vec![
        query(
            "limit",
            "Jobs per page.",
            json!({"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}),
        ),
        query(
            "cursor",
            "The previous page's `next_cursor`.",
            json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{21}[AQgw]$"}),
        ),
        query(
            "order",
            "`desc` (newest first) or `asc`.",
            json!({"type": "string", "enum": ["desc", "asc"], "default": "desc"}),
        ),
        query(
            "include",
            "`result`: each job with its result.",
            json!({"type": "string", "enum": ["result"]}),
        ),
    ]
}

/// The filter and page a query asks for; anything it cannot mean is a 400
/// that names the parameter.
fn parse(query: &str) -> Result<(JobFilter, PageRequest), ApiError> {
    let mut filter = JobFilter::default();
    let mut page = PageRequest {
        after: None,
        limit: DEFAULT_PAGE,
        order: Order::NewestFirst,
        with_results: false,
    };
    each_param(query, |name, value| {
        if value.len() > MAX_QUERY_TEXT {
            return Err(format!("longer than {MAX_QUERY_TEXT} bytes"));
        }
        match (name, value) {
            ("limit", _) => page.limit = page_limit(value)?,
            ("cursor", _) => page.after = Some(cursor(value)?),
            ("order", "desc") => page.order = Order::NewestFirst,
            ("order", "asc") => page.order = Order::OldestFirst,
            ("order", _) => return Err("`desc` or `asc`".into()),
            ("include", "result") => page.with_results = true,
            ("include", _) => return Err("only `result`".into()),
            _ => filter.set(name, value)?,
        }
        Ok(())
    })?;
    Ok((filter, page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BboxStatus, ExtractionStatus};

    fn refused(query: &str) -> String {
        match parse(query) {
            Err(ApiError::BadRequest(why)) => why,
            other => panic!("{query}: {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn a_query_names_its_filters() {
        let (filter, page) = parse(
            "status=failed,cancelled&bbox_status=pending&extractor=ocr&metadata.customer=acme\
             &error_prefix=timeout%20after&submitted_after=2026-12-01T00:00:00Z&limit=10\
             &order=asc&include=result",
        )
        .unwrap();
        assert_eq!(
            filter.statuses,
            vec![ExtractionStatus::Failed, ExtractionStatus::Cancelled]
        );
        assert_eq!(filter.bbox_statuses, vec![BboxStatus::Pending]);
        assert_eq!(filter.extractor.as_deref(), Some("ocr"));
        assert_eq!(filter.metadata, vec![("customer".into(), "acme".into())]);
        assert_eq!(filter.error_prefix.as_deref(), Some("timeout after"));
        assert!(filter.submitted_after.is_some());
        assert_eq!(page.limit, 10);
        assert_eq!(page.order, Order::OldestFirst);
        assert!(page.with_results);
        let (_, page) = parse("").unwrap();
        assert_eq!((page.limit, page.order), (DEFAULT_PAGE, Order::NewestFirst));
    }

    #[test]
    fn what_a_query_cannot_mean_is_refused_by_name() {
        assert!(refused("status=done").contains("`status`"));
        assert!(refused("limit=0").contains("`limit`"));
        assert!(refused("limit=201").contains("`limit`"));
        assert!(refused("cursor=xyz").contains("`cursor`"));
        assert!(refused("colour=red").contains("unknown"));
        assert!(refused("status=failed&status=queued").contains("twice"));
        assert!(refused("submitted_after=yesterday").contains("RFC 3339"));
        assert!(refused("metadata.=x").contains("`metadata.`"));
        assert!(refused("extractor=OCR!").contains("`extractor`"));
        assert!(refused(&format!("error_prefix={}", "0".repeat(65))).contains("`error_prefix`"));
        assert!(parse(&format!("error_prefix={}", "é".repeat(64))).is_ok());
    }

    #[test]
    fn a_cursor_is_the_id_it_was_made_of() {
        let id = crate::domain::new_job_id();
        assert_eq!(cursor(&cursor_of(id)), Ok(id));
    }
}
