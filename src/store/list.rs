//! A tenant's jobs a page at a time, newest (or oldest) first, narrowed by a
//! [`JobFilter`]: what `GET /v1/extractions` answers.
//!
//! **Order.** By id, which is a UUIDv7: creation time to the millisecond,
//! then random bits, so a total order that inserts cannot reshuffle. A page
//! continues strictly after its cursor (the last id the previous page
//! returned, or scanned), so a job is never on two pages, and a job that
//! existed when the walk began is never skipped: a job inserted meanwhile
//! lands at the newest end, before the first page.
//!
//! **Cost.** A page walks `(tenant_id, status, id)` (two partial indexes:
//! open and finished jobs) once per status it lists (all five when it names
//! none) from its cursor, and merges the walks in id order (a `UNION ALL` of ordered, limited scans); it reads the rows of at
//! most `limit` ids, never the finished rows it does not return. An
//! idempotency key walks its own unique index. The other filters (bbox
//! status, extractor, times, metadata, error prefix) no index answers: such
//! a page scans at most [`SCAN_BUDGET`] ids and may return fewer than
//! `limit` jobs with a cursor to go on from, so that no page costs more than
//! a budget whatever the filter matches.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::{Extraction, StoreError};
use crate::domain::{
    extractor_name_is_valid, idempotency_key_is_valid, BboxStatus, ExtractionStatus,
};

/// Ids a page with filters no index answers may scan.
pub const SCAN_BUDGET: i64 = 1_000;

/// The most jobs one page returns.
pub const MAX_PAGE: i64 = 200;

/// How far a job's id time (the submitting process's clock) may be from its
/// `submitted_at` (the database's), so that a time range can bound the ids
/// it walks without missing a job of the range.
const CLOCK_MARGIN_MS: i64 = 60_000;

/// Which of a tenant's jobs to list; every part narrows, an empty one does
/// not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    /// Jobs in one of these states.
    pub statuses: Vec<ExtractionStatus>,
    /// Jobs whose bbox refinement is in one of these states.
    pub bbox_statuses: Vec<BboxStatus>,
    /// Jobs of this extractor (`rules` also matches a request that named none).
    pub extractor: Option<String>,
    /// Submitted at or after.
    pub submitted_after: Option<DateTime<Utc>>,
    /// Submitted before.
    pub submitted_before: Option<DateTime<Utc>>,
    /// Finished at or after.
    pub finished_after: Option<DateTime<Utc>>,
    /// Finished before.
    pub finished_before: Option<DateTime<Utc>>,
    /// Jobs whose `metadata` has each key with this value (as text: `7`
    /// matches the number 7 and the string "7").
    pub metadata: Vec<(String, String)>,
    /// The job submitted with this idempotency key.
    pub idempotency_key: Option<String>,
    /// Jobs whose error starts with this.
    pub error_prefix: Option<String>,
    /// `true`: jobs with a value flagged `needs_review` that no correction
    /// settled yet (a reviewer's queue); `false`: jobs with none.
    pub needs_review: Option<bool>,
}

/// Longest error prefix, in characters.
pub const MAX_ERROR_PREFIX_CHARS: usize = 64;

/// Most `metadata.KEY` parameters of one filter.
pub const MAX_METADATA_KEYS: usize = 8;

impl JobFilter {
    /// The filter a list of parameters names, as a query or a bulk action
    /// gives them (`status=failed,cancelled`, `metadata.customer=acme`, …).
    pub fn of<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, FilterError> {
        let mut filter = Self::default();
        for (name, value) in params {
            filter.set(name, value).map_err(|why| FilterError {
                name: name.to_owned(),
                why,
            })?;
        }
        Ok(filter)
    }

    /// Narrows the filter by parameter `name`; why not, when the name is
    /// unknown or the value cannot mean what the name says.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "status" => self.statuses = names(value)?,
            "bbox_status" => self.bbox_statuses = names(value)?,
            "extractor" if extractor_name_is_valid(value) => {
                self.extractor = Some(value.to_owned())
            }
            "extractor" => return Err("not an extractor name".into()),
            "submitted_after" => self.submitted_after = Some(time(value)?),
            "submitted_before" => self.submitted_before = Some(time(value)?),
            "finished_after" => self.finished_after = Some(time(value)?),
            "finished_before" => self.finished_before = Some(time(value)?),
            "idempotency_key" if idempotency_key_is_valid(value) => {
                self.idempotency_key = Some(value.to_owned())
            }
            "idempotency_key" => return Err("not an idempotency key".into()),
            "error_prefix" if error_prefix_is_valid(value) => {
                self.error_prefix = Some(value.to_owned())
            }
            "error_prefix" => {
                return Err(format!(
                    "1 to {MAX_ERROR_PREFIX_CHARS} characters, none a NUL"
                ))
            }
            "needs_review" => {
                let flag = value.parse().map_err(|_| "`true` or `false`".to_owned());
                self.needs_review = Some(flag?)
            }
            other => match other.strip_prefix("metadata.") {
                Some(key) if !key.is_empty() && !key.contains('\0') && !value.contains('\0') => {
                    if self.metadata.len() == MAX_METADATA_KEYS {
                        return Err(format!("more than {MAX_METADATA_KEYS} metadata keys"));
                    }
                    self.metadata.push((key.to_owned(), value.to_owned()));
                }
                Some(_) => return Err("an empty key, or a NUL".into()),
                None => return Err("unknown".into()),
            },
        }
        Ok(())
    }

    /// Whether a filter no index answers is set: then a page has a scan budget.
    fn scans(&self) -> bool {
        !self.bbox_statuses.is_empty()
            || self.extractor.is_some()
            || self.submitted_after.is_some()
            || self.submitted_before.is_some()
            || self.finished_after.is_some()
            || self.finished_before.is_some()
            || !self.metadata.is_empty()
            || self.error_prefix.is_some()
            || self.needs_review.is_some()
    }
}

/// A filter parameter that was refused, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{name}`: {why}")]
pub struct FilterError {
    /// The parameter.
    pub name: String,
    /// Why it was refused.
    pub why: String,
}

/// Whether `prefix` can start an error: 1 to [`MAX_ERROR_PREFIX_CHARS`]
/// characters, none a NUL (which no stored text holds).
fn error_prefix_is_valid(prefix: &str) -> bool {
    let chars = prefix.chars().count();
    (1..=MAX_ERROR_PREFIX_CHARS).contains(&chars) && !prefix.contains('\0')
}

/// Comma-separated state names, each known, each once.
fn names<T: std::str::FromStr + PartialEq>(value: &str) -> Result<Vec<T>, String> {
    let mut states: Vec<T> = Vec::new();
    for name in value.split(',') {
        let state = name
            .parse()
            .map_err(|_| format!("`{name}` is not a state"))?;
        if !states.contains(&state) {
            states.push(state);
        }
    }
    Ok(states)
}

/// An RFC 3339 time.
fn time(value: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| "not an RFC 3339 time (2026-12-03T10:00:00Z)".to_owned())
}

/// Newest first (the default) or oldest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// Descending ids.
    #[default]
    NewestFirst,
    /// Ascending ids.
    OldestFirst,
}

impl Order {
    fn sql(self) -> &'static str {
        match self {
            Self::NewestFirst => "DESC",
            Self::OldestFirst => "ASC",
        }
    }

    /// The comparison that continues after a cursor.
    fn after(self) -> &'static str {
        match self {
            Self::NewestFirst => "<",
            Self::OldestFirst => ">",
        }
    }
}

/// Where a page starts and how much it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// The id to continue after; `None` for the first page.
    pub after: Option<Uuid>,
    /// The most jobs to return, 1 to [`MAX_PAGE`].
    pub limit: i64,
    /// The order.
    pub order: Order,
    /// Whether each job's results are read too.
    pub with_results: bool,
}

/// A page of jobs.
#[derive(Debug, Clone)]
pub struct Page {
    /// The jobs, in the page's order, each with its request (and its results
    /// when they were asked for).
    pub jobs: Vec<Extraction>,
    /// The id to continue after, while there may be more.
    pub next: Option<Uuid>,
}

/// A page of tenant `tenant_id`'s jobs that `filter` admits.
pub async fn list(
    executor: &mut PgConnection,
    tenant_id: Uuid,
    filter: &JobFilter,
    page: PageRequest,
) -> Result<Page, StoreError> {
    let (rows, next) = walk(executor, tenant_id, filter, page, Columns::Jobs).await?;
    let jobs = rows
        .iter()
        .map(Extraction::from_row)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Page { jobs, next })
}

/// The ids of a page of tenant `tenant_id`'s jobs that `filter` admits, and
/// where the next page starts: what a bulk action walks (no job's request
/// or result is read, unless a filter looks into it).
pub async fn list_ids(
    executor: &mut PgConnection,
    tenant_id: Uuid,
    filter: &JobFilter,
    page: PageRequest,
) -> Result<(Vec<Uuid>, Option<Uuid>), StoreError> {
    let (rows, next) = walk(executor, tenant_id, filter, page, Columns::Ids).await?;
    let ids = rows
        .iter()
        .map(|row| row.try_get("id"))
        .collect::<Result<Vec<Uuid>, _>>()?;
    Ok((ids, next))
}

/// What a page reads of each job it keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    /// The job row with its request (and results, when asked for).
    Jobs,
    /// Only the id.
    Ids,
}

/// A page's rows, and the id to continue after while there may be more.
async fn walk(
    executor: &mut PgConnection,
    tenant_id: Uuid,
    filter: &JobFilter,
    page: PageRequest,
    columns: Columns,
) -> Result<(Vec<PgRow>, Option<Uuid>), StoreError> {
    let limit = page.limit.clamp(1, MAX_PAGE);
    let budget = if filter.scans() {
        SCAN_BUDGET.max(limit)
    } else {
        limit
    };
    // The page: the walk's ids in order, each joined to its row and kept if
    // the filters admit it, until `limit` are kept (the joins preserve the
    // walk's order, so the walk stops there, short of its budget).
    let mut sql = QueryBuilder::<Postgres>::new("");
    matched(&mut sql, tenant_id, filter, page, columns, (budget, limit));
    let rows: Vec<PgRow> = sql.build().fetch_all(&mut *executor).await?;
    let last: Option<Uuid> = rows.last().map(|row| row.try_get("id")).transpose()?;
    if let Some(last) = last.filter(|_| rows.len() as i64 == limit) {
        return Ok((rows, Some(last)));
    }
    if !filter.scans() {
        // Every id walked was kept: a short page is the last.
        return Ok((rows, None));
    }
    // A short page of a scanning filter: if the walk used its whole budget,
    // there may be more past where it ended.
    let last = match page.order {
        Order::NewestFirst => "min",
        Order::OldestFirst => "max",
    };
    let mut sql =
        QueryBuilder::<Postgres>::new(format!("SELECT count(*), {last}(id::text)::uuid FROM ("));
    scanned(&mut sql, tenant_id, filter, page, budget);
    sql.push(") AS walked");
    let (walked, end): (i64, Option<Uuid>) = sql.build_query_as().fetch_one(&mut *executor).await?;
    let next = (walked == budget).then_some(end).flatten();
    Ok((rows, next))
}

/// The ids a page looks at, in its order, at most `budget`: per status, a
/// walk of `(tenant_id, status, id)` from the cursor, merged.
fn scanned(
    sql: &mut QueryBuilder<Postgres>,
    tenant_id: Uuid,
    filter: &JobFilter,
    page: PageRequest,
    budget: i64,
) {
    let (order, after) = (page.order.sql(), page.order.after());
    if let Some(key) = &filter.idempotency_key {
        sql.push("SELECT id FROM extraction_requests WHERE tenant_id = ")
            .push_bind(tenant_id)
            .push(" AND idempotency_key = ")
            .push_bind(key.clone());
        if let Some(cursor) = page.after {
            sql.push(format_args!(" AND id {after} ")).push_bind(cursor);
        }
        return;
    }
    let statuses: Vec<ExtractionStatus> = match filter.statuses.is_empty() {
        true => ExtractionStatus::ALL.to_vec(),
        false => filter.statuses.clone(),
    };
    let (low, high) = id_range(filter);
    sql.push("SELECT id FROM (");
    for (i, status) in statuses.iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        // The state as a literal, not a parameter: only then does a generic
        // plan (which a prepared statement gets after five runs) know that
        // the walk is within one of the partial indexes; with `status = $1`
        // it walked the primary key instead, filtering every job (450 ms
        // rather than 3 at a million jobs). The names are the enum's own.
        sql.push(format_args!(
            "(SELECT id FROM extractions WHERE status = '{}'",
            status.as_str()
        ))
        .push(" AND tenant_id = ")
        .push_bind(tenant_id);
        if let Some(cursor) = page.after {
            sql.push(format_args!(" AND id {after} ")).push_bind(cursor);
        }
        if let Some(low) = low {
            sql.push(" AND id >= ").push_bind(low);
        }
        if let Some(high) = high {
            sql.push(" AND id < ").push_bind(high);
        }
        sql.push(format_args!(" ORDER BY id {order} LIMIT "))
            .push_bind(budget)
            .push(")");
    }
    sql.push(format_args!(") AS walks ORDER BY id {order} LIMIT "))
        .push_bind(budget);
}

/// The jobs of the walk's ids that every filter admits, at most `limit`.
fn matched(
    sql: &mut QueryBuilder<Postgres>,
    tenant_id: Uuid,
    filter: &JobFilter,
    page: PageRequest,
    columns: Columns,
    (budget, limit): (i64, i64),
) {
    let with_results = page.with_results && columns == Columns::Jobs;
    match columns {
        Columns::Jobs => sql.push("SELECT e.*, q.idempotency_key, q.request"),
        Columns::Ids => sql.push("SELECT e.id"),
    };
    if with_results {
        sql.push(", r.result, b.result AS bbox_result");
    }
    sql.push(" FROM (");
    scanned(sql, tenant_id, filter, page, budget);
    sql.push(
        ") AS s
          JOIN extractions e ON e.id = s.id
          JOIN extraction_requests q ON q.id = s.id",
    );
    if with_results {
        sql.push(
            " LEFT JOIN extraction_results r ON r.id = e.id AND r.stage = 'extraction'
              LEFT JOIN extraction_results b ON b.id = e.id AND b.stage = 'bbox_refinement'",
        );
    }
    sql.push(" WHERE true");
    if !filter.bbox_statuses.is_empty() {
        let names: Vec<&str> = filter.bbox_statuses.iter().map(|s| s.as_str()).collect();
        sql.push(" AND e.bbox_status = ANY(")
            .push_bind(names)
            .push(")");
    }
    if let Some(extractor) = &filter.extractor {
        sql.push(" AND COALESCE(q.request->>'extractor', 'rules') = ")
            .push_bind(extractor.clone());
    }
    if let Some(at) = filter.submitted_after {
        sql.push(" AND e.submitted_at >= ").push_bind(at);
    }
    if let Some(at) = filter.submitted_before {
        sql.push(" AND e.submitted_at < ").push_bind(at);
    }
    if let Some(at) = filter.finished_after {
        sql.push(" AND e.finished_at >= ").push_bind(at);
    }
    if let Some(at) = filter.finished_before {
        sql.push(" AND e.finished_at < ").push_bind(at);
    }
    for (key, value) in &filter.metadata {
        sql.push(" AND q.request->'metadata'->>")
            .push_bind(key.clone())
            .push(" = ")
            .push_bind(value.clone());
    }
    if let Some(prefix) = &filter.error_prefix {
        // starts_with, not LIKE: a prefix's `%` and `_` are its own letters.
        sql.push(" AND starts_with(e.error, ")
            .push_bind(prefix.clone())
            .push(")");
    }
    if let Some(flagged) = filter.needs_review {
        // A grounded value under its request's `min_confidence`, not
        // corrected since.
        let not = if flagged { "" } else { "NOT " };
        sql.push(format_args!(
            " AND {not}EXISTS (SELECT 1 FROM extraction_results g,
                      json_each(g.result->'fields') AS f(field, place)
                WHERE g.id = e.id AND g.stage = 'bbox_refinement'
                  AND (f.place->>'needs_review')::boolean
                  AND NOT EXISTS (SELECT 1 FROM field_corrections c
                                   WHERE c.extraction_id = e.id AND c.field = f.field))"
        ));
    }
    sql.push(format_args!(" ORDER BY s.id {} LIMIT ", page.order.sql()))
        .push_bind(limit);
}

/// The ids a submitted-time range can hold, widened by the clock margin: a
/// UUIDv7 starts with its creation time in milliseconds.
fn id_range(filter: &JobFilter) -> (Option<Uuid>, Option<Uuid>) {
    let floor = |at: DateTime<Utc>, shift_ms: i64| {
        let ms = (at.timestamp_millis() + shift_ms).max(0) as u64;
        let mut bytes = [0_u8; 16];
        bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        bytes[6] = 0x70;
        Uuid::from_bytes(bytes)
    };
    let low = filter.submitted_after.map(|at| floor(at, -CLOCK_MARGIN_MS));
    let high = filter.submitted_before.map(|at| floor(at, CLOCK_MARGIN_MS));
    (low, high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_bounds_the_ids_of_that_millisecond_widened_by_the_margin() {
        let at = DateTime::from_timestamp_millis(1_800_000_000_000).unwrap();
        let filter = JobFilter {
            submitted_after: Some(at),
            submitted_before: Some(at),
            ..JobFilter::default()
        };
        let (low, high) = id_range(&filter);
        let ms = |id: Uuid| id.get_timestamp().unwrap().to_unix();
        let (low, high) = (low.unwrap(), high.unwrap());
        assert_eq!(ms(low), (1_800_000_000 - 60, 0));
        assert_eq!(ms(high), (1_800_000_000 + 60, 0));
        let made_then = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_800_000_000,
            0,
        ));
        assert!(low < made_then && made_then < high);
    }

    #[test]
    fn only_filters_no_index_answers_bring_a_scan_budget() {
        let indexed = JobFilter {
            statuses: vec![ExtractionStatus::Failed],
            idempotency_key: Some("k".into()),
            ..JobFilter::default()
        };
        assert!(!indexed.scans());
        let scanned = JobFilter {
            error_prefix: Some("timeout".into()),
            ..indexed
        };
        assert!(scanned.scans());
    }
}
