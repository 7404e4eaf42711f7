//! `GET /v1/extractions`: the caller's tenant's jobs a page at a time,
//! narrowed by the query (see [`crate::store::list`] for the order and what
//! a page costs). Another tenant's jobs are never read: every walk starts
//! from the caller's tenant.

use axum::extract::{RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use schemars::JsonSchema;
use serde::Serialize;

use super::extractions::ExtractionView;
use super::query::{cursor, cursor_of, each_param, page_limit, MAX_QUERY_TEXT};
use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::pipeline::Services;
use crate::store::list::{self, JobFilter, Order, PageRequest};
use crate::store::StoreError;

/// Jobs a page holds when the query does not say.
pub(super) const DEFAULT_PAGE: i64 = 50;

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
