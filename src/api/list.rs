//! `GET /v1/extractions`: the caller's tenant's jobs a page at a time,
//! narrowed by the query (see [`crate::store::list`] for the order and what
//! a page costs). Another tenant's jobs are never read: every walk starts
//! from the caller's tenant.

use axum::extract::{RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

use super::extractions::ExtractionView;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::pipeline::Services;
use crate::store::list::{self, JobFilter, Order, PageRequest, MAX_PAGE};
use crate::store::StoreError;

/// Jobs a page holds when the query does not say.
pub(super) const DEFAULT_PAGE: i64 = 50;

/// Longest metadata key or value, error prefix, or cursor a query may hold.
pub(super) const MAX_QUERY_TEXT: usize = 256;

pub(super) fn router() -> axum::Router<Services> {
    Router::new().route("/v1/extractions", get(list_jobs))
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
    State(services): State<Services>,
    RawQuery(query): RawQuery,
) -> Result<Json<JobPage>, ApiError> {
    caller.require(Scope::Read)?;
    let (filter, page) = parse(query.as_deref().unwrap_or_default())?;
    let mut connection = services.pool.acquire().await.map_err(StoreError::from)?;
    let listed = list::list(&mut connection, caller.tenant_id, &filter, page).await?;
    let items = listed.jobs.into_iter().map(ExtractionView::from).collect();
    let next_cursor = listed.next.map(cursor_of);
    Ok(Json(JobPage { items, next_cursor }))
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
    let mut seen = std::collections::HashSet::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |why: &str| ApiError::BadRequest(format!("query parameter `{name}`: {why}"));
        if !seen.insert(name.to_string()) {
            return Err(bad("given twice"));
        }
        if value.len() > MAX_QUERY_TEXT {
            return Err(bad(&format!("longer than {MAX_QUERY_TEXT} bytes")));
        }
        match name.as_ref() {
            "limit" => page.limit = page_limit(&value).map_err(|e| bad(&e))?,
            "cursor" => page.after = Some(cursor(&value).ok_or_else(|| bad("not a cursor"))?),
            "order" => match value.as_ref() {
                "desc" => page.order = Order::NewestFirst,
                "asc" => page.order = Order::OldestFirst,
                _ => return Err(bad("`desc` or `asc`")),
            },
            "include" => match value.as_ref() {
                "result" => page.with_results = true,
                _ => return Err(bad("only `result`")),
            },
            _ => filter.set(&name, &value).map_err(|e| bad(&e))?,
        }
    }
    Ok((filter, page))
}

/// A page size a query asks for: 1 to [`MAX_PAGE`] (the list's, an
/// operation's outcomes, the dead letters).
pub(super) fn page_limit(value: &str) -> Result<i64, String> {
    match value.parse::<i64>() {
        Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(format!("not a whole number from 1 to {MAX_PAGE}")),
    }
}

/// The cursor of a page that continues after job `id`.
pub(super) fn cursor_of(id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// A cursor [`cursor_of`] made.
pub(super) fn cursor(value: &str) -> Option<Uuid> {
    let bytes = URL_SAFE_NO_PAD.decode(value).ok()?;
    Uuid::from_slice(&bytes).ok()
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
        let made = URL_SAFE_NO_PAD.encode(id.as_bytes());
        assert_eq!(cursor(&made), Some(id));
    }
}
