//! `docstream jobs …`: a tenant's jobs for operators, with the filters of
//! `GET /v1/extractions`. `list` and `show` read them; `retry` and `cancel`
//! run a bulk operation (by ids or by the filters) in this process, exactly
//! as `POST /v1/extractions/actions` does, and print each job's outcome. A
//! table for people, `--json` for scripts. `truth` exports the fields
//! people corrected, with their documents, as ground truth for `docstream
//! eval`.

use super::OpsError;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::Parts;
use crate::pipeline::bulk;
use crate::store::bulk::{Action, Created, Outcome, Selection, Verdict};
use crate::store::list::{self, JobFilter, Order, PageRequest, MAX_PAGE};
use crate::store::{self, tenants, Extraction};

/// `docstream jobs …`
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List a tenant's jobs, newest first.
    List {
        /// Whose jobs, and which.
        #[command(flatten)]
        filter: FilterArgs,
        /// Jobs to print (follows pages until it has them).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job (JSON), with its request and results.
    Show {
        /// The job's id.
        id: Uuid,
        /// Whose job it is.
        #[arg(long, default_value = "default")]
        tenant: String,
    },
    /// Retry failed jobs, named by id or by the filters: each failed one
    /// goes back to the queue with a fresh budget of attempts.
    Retry(ActArgs),
    /// Cancel jobs, named by id or by the filters: a queued one at once, a
    /// running one at its holder's next heartbeat.
    Cancel(ActArgs),
    /// Export the fields people corrected, with the files they were read
    /// from, as ground truth for `docstream eval`: a document and its
    /// `.truth.json` per job with a correction, newest first.
    Truth {
        /// Whose corrections.
        #[arg(long, default_value = "default")]
        tenant: String,
        /// The folder to write (made if missing).
        #[arg(long)]
        out: std::path::PathBuf,
        /// Most jobs.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
    },
}

/// The filters of `GET /v1/extractions`, and whose jobs they look at.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Whose jobs.
    #[arg(long, default_value = "default")]
    tenant: String,
    /// Comma-separated states.
    #[arg(long)]
    status: Option<String>,
    /// Comma-separated bbox refinement states.
    #[arg(long)]
    bbox_status: Option<String>,
    /// The extractor.
    #[arg(long)]
    extractor: Option<String>,
    /// Submitted at or after (RFC 3339).
    #[arg(long)]
    submitted_after: Option<String>,
    /// Submitted before.
    #[arg(long)]
    submitted_before: Option<String>,
    /// Finished at or after.
    #[arg(long)]
    finished_after: Option<String>,
    /// Finished before.
    #[arg(long)]
    finished_before: Option<String>,
    /// The job submitted with this key.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Jobs whose error starts with this.
    #[arg(long)]
    error_prefix: Option<String>,
    /// `true`: jobs with a value flagged needs_review not corrected yet;
    /// `false`: jobs with none.
    #[arg(long)]
    needs_review: Option<String>,
    /// KEY=VALUE: jobs whose metadata has KEY with this value (repeatable).
    #[arg(long, value_parser = key_value)]
    metadata: Vec<(String, String)>,
}

/// What `retry` and `cancel` act on.
#[derive(Debug, Args)]
pub struct ActArgs {
    /// The jobs, by id; without ids, the jobs the filters admit.
    ids: Vec<Uuid>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Makes a repeat of the command the same operation (a no-op).
    #[arg(long)]
    key: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once('=').ok_or("expected KEY=VALUE")?;
    Ok((key.to_owned(), value.to_owned()))
}

impl FilterArgs {
    /// The list's query parameters the flags name.
    fn params(&self) -> BTreeMap<String, String> {
        let named = [
            ("status", &self.status),
            ("bbox_status", &self.bbox_status),
            ("extractor", &self.extractor),
            ("submitted_after", &self.submitted_after),
            ("submitted_before", &self.submitted_before),
            ("finished_after", &self.finished_after),
            ("finished_before", &self.finished_before),
            ("idempotency_key", &self.idempotency_key),
            ("error_prefix", &self.error_prefix),
            ("needs_review", &self.needs_review),
        ];
        let named = (named.into_iter()).filter_map(|(n, v)| Some((n.to_owned(), v.clone()?)));
        let metadata = (self.metadata.iter()).map(|(k, v)| (format!("metadata.{k}"), v.clone()));
        named.chain(metadata).collect()
    }

    /// The filter, checked as the list checks its query.
    fn filter(&self) -> Result<JobFilter, OpsError> {
        let params = self.params();
        let pairs = params.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        JobFilter::of(pairs)
            .map_err(|e| OpsError::Refused(format!("--{}: {}", e.name.replace('_', "-"), e.why)))
    }
}

/// A job as `list` prints it.
#[derive(Debug, Serialize)]
struct Listed {
    id: Uuid,
    status: String,
    bbox_status: Option<String>,
    attempts: i32,
    submitted_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    error: Option<String>,
}

impl From<&Extraction> for Listed {
    fn from(row: &Extraction) -> Self {
        Self {
            id: row.id,
            status: row.status.to_string(),
            bbox_status: row.bbox_status.clone(),
            attempts: row.attempts,
            submitted_at: row.submitted_at,
            finished_at: row.finished_at,
            error: row.error.clone(),
        }
    }
}

/// Runs a `jobs` command on `parts`; what it prints.
pub async fn jobs(parts: &Parts, command: JobsCommand) -> Result<String, OpsError> {
    let pool = &parts.pool;
    match command {
        JobsCommand::List {
            filter,
            limit,
            json,
        } => {
            let tenant = tenants::tenant_by_name(pool, &filter.tenant)
                .await?
                .tenant_id;
            let job_filter = filter.filter()?;
            let mut listed = Vec::new();
            let mut after = None;
            let mut connection = pool.acquire().await?;
            while listed.len() < limit {
                let page = PageRequest {
                    after,
                    limit: MAX_PAGE.min((limit - listed.len()) as i64),
                    order: Order::NewestFirst,
                    with_results: false,
                };
                let page = list::list(&mut connection, tenant, &job_filter, page).await?;
                listed.extend(page.jobs.iter().map(Listed::from));
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            match json {
                true => Ok(serde_json::to_string_pretty(&listed)? + "\n"),
                false => Ok(jobs_table(&listed)),
            }
        }
        JobsCommand::Show { id, tenant } => {
            let owner = tenants::tenant_by_name(pool, &tenant).await?.tenant_id;
            let Some(row) = store::get_for_tenant(pool, owner, id).await? else {
                refuse!("tenant {tenant:?} has no extraction {id}");
            };
            let shown = json!({
                "job": Listed::from(&row),
                "attempts_base": row.attempts_base,
                "next_attempt_at": row.next_attempt_at,
                "cancel_requested_at": row.cancel_requested_at,
                "erased_at": row.erased_at,
                "request": row.request.map(|r| r.0),
                "result": row.result,
                "bbox_result": row.bbox_result,
            });
            Ok(serde_json::to_string_pretty(&shown)? + "\n")
        }
        JobsCommand::Retry(args) => act(parts, Action::Retry, args).await,
        JobsCommand::Cancel(args) => act(parts, Action::Cancel, args).await,
        JobsCommand::Truth { tenant, out, limit } => truth(parts, &tenant, &out, limit).await,
    }
}

/// Writes each of `tenant`'s jobs with a correction (at most `limit`, the
/// newest first) whose document is a file: the file, and a truth of the
/// fields corrected, in `docstream eval`'s form. A field's truth is its
/// latest correction; its box, the grounded one when the correction kept
/// the extracted value (else none: nobody said where the right one is).
async fn truth(
    parts: &Parts,
    tenant: &str,
    out: &std::path::Path,
    limit: i64,
) -> Result<String, OpsError> {
    use crate::store::corrections;
    let pool = &parts.pool;
    let owner = tenants::tenant_by_name(pool, tenant).await?.tenant_id;
    std::fs::create_dir_all(out)?;
    let (mut written, mut fields) = (0, 0);
    for id in corrections::corrected_jobs(pool, owner, limit).await? {
        let Some(row) = store::get_for_tenant(pool, owner, id).await? else {
            continue;
        };
        let Some(request) = row.request.map(|r| r.0) else {
            continue; // erased
        };
        let Some(object) = request.document.object.as_deref() else {
            continue; // a JSON document: nothing to read again
        };
        let (kind, bytes) = parts.files.read(owner, object).await?;
        let extension = match kind.as_str() {
            "application/pdf" => "pdf",
            "image/png" => "png",
            "image/jpeg" => "jpg",
            "image/tiff" => "tif",
            _ => "txt",
        };
        let document = format!("{id}.{extension}");
        std::fs::write(out.join(&document), &bytes)?;
        let latest: BTreeMap<String, Option<String>> = corrections::all_of_job(pool, id)
            .await?
            .into_iter()
            .map(|c| (c.field, c.value))
            .collect();
        let extracted = |name: &str| row.result.as_ref().map(|r| &r["fields"][name]);
        let grounded = |name: &str| row.bbox_result.as_ref().map(|r| &r["fields"][name]);
        let truths: serde_json::Map<String, serde_json::Value> = (latest.iter())
            .map(|(name, value)| {
                let kept = extracted(name).and_then(|v| v["value"].as_str()) == value.as_deref();
                let place = grounded(name).filter(|_| kept && value.is_some());
                let truth = value.as_ref().map(|value| {
                    json!({
                        "value": value,
                        "page": place.map_or(json!(0), |p| p["page"].clone()),
                        "bbox": place.map_or(json!(null), |p| p["bbox"].clone()),
                    })
                });
                (name.clone(), truth.unwrap_or(json!(null)))
            })
            .collect();
        let pages = crate::store::documents::get(pool, id)
            .await?
            .and_then(|d| d.pages.map(|p| p.len()))
            .unwrap_or(1);
        let kind_of = (request.metadata.as_ref())
            .and_then(|m| m["kind"].as_str())
            .unwrap_or("corrected");
        let truth = json!({
            "document": document,
            "sample": id,
            "kind": kind_of,
            "variant": "corrected",
            "dpi": null,
            "pages": pages,
            "request": {"fields": request.fields, "min_confidence": request.min_confidence},
            "fields": truths,
        });
        let path = out.join(format!("{id}.truth.json"));
        std::fs::write(path, serde_json::to_string_pretty(&truth)? + "\n")?;
        written += 1;
        fields += latest.len();
    }
    Ok(format!(
        "wrote {written} documents with {fields} corrected fields to {}\n",
        out.display()
    ))
}

/// Runs a bulk `action` on the jobs `args` name, to its end, here.
async fn act(parts: &Parts, action: Action, args: ActArgs) -> Result<String, OpsError> {
    let pool = &parts.pool;
    let tenant = tenants::tenant_by_name(pool, &args.filter.tenant)
        .await?
        .tenant_id;
    let selection = match args.ids.is_empty() {
        true if args.filter.params().is_empty() => {
            refuse!("name the jobs: by ids, or by at least one filter (--status failed, …)")
        }
        true => {
            args.filter.filter()?;
            Selection::Filter(args.filter.params())
        }
        false if args.ids.len() > bulk::MAX_IDS => {
            refuse!("at most {} ids at once; use the filters", bulk::MAX_IDS)
        }
        false if !args.filter.params().is_empty() => {
            refuse!("name the jobs by ids or by filters, not both")
        }
        false => Selection::Ids(args.ids.clone()),
    };
    let key = args.key.unwrap_or_else(|| Uuid::new_v4().to_string());
    let (operation, new) = match parts
        .bulk
        .create((tenant, &key), action, &selection)
        .await?
    {
        Created::New(operation) => (operation, true),
        Created::Repeat(operation) => (operation, false),
        Created::AtCap(running) => {
            refuse!(
                "the tenant runs {running} bulk operations, the most it may \
             (DOCSTREAM_BULK_MAX_RUNNING_PER_TENANT): try again once one finished"
            )
        }
    };
    if !new && (operation.action() != action || operation.selection() != &selection) {
        refuse!("--key {key} was used for another operation");
    }
    if new {
        parts.bulk.clone().run(operation.clone()).await;
    }
    let Some(done) = store::bulk::get(pool, tenant, operation.id).await? else {
        refuse!("operation {} vanished", operation.id);
    };
    if done.finished_at.is_none() {
        refuse!(
            "operation {} paused (the database?): a serving process resumes it",
            done.id
        );
    }
    let mut outcomes = Vec::new();
    let mut after = None;
    loop {
        let page = store::bulk::outcomes(pool, done.id, None, after, MAX_PAGE).await?;
        after = page.last().map(|o| o.id);
        let last = (page.len() as i64) < MAX_PAGE;
        outcomes.extend(page);
        if last {
            break;
        }
    }
    if args.json {
        let outcomes: Vec<_> = outcomes.iter().map(outcome_json).collect();
        let printed = json!({
            "operation": done.id, "action": action, "done": done.done,
            "refused": done.refused, "not_found": done.not_found, "outcomes": outcomes,
        });
        return Ok(serde_json::to_string_pretty(&printed)? + "\n");
    }
    let mut out = format!(
        "operation {}: {} done, {} refused, {} not found\n",
        done.id, done.done, done.refused, done.not_found
    );
    for o in outcomes.iter().filter(|o| o.verdict != Verdict::Done) {
        let reason = o.reason.as_deref().unwrap_or("not found");
        let _ = writeln!(out, "  {}  {reason}", o.id);
    }
    Ok(out)
}

fn outcome_json(o: &Outcome) -> serde_json::Value {
    json!({"id": o.id, "outcome": o.verdict, "status": o.status, "reason": o.reason})
}

/// Jobs as a table for people.
fn jobs_table(listed: &[Listed]) -> String {
    let mut out = String::new();
    if listed.is_empty() {
        out.push_str("no jobs\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<36}  {:<9}  {:<9}  {:>3}  {:<19}  {:<19}  ERROR",
        "ID", "STATUS", "BBOX", "TRY", "SUBMITTED", "FINISHED"
    );
    let time = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M:%S").to_string();
    for job in listed {
        let error: String = job
            .error
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(60)
            .collect();
        let _ = writeln!(
            out,
            "{:<36}  {:<9}  {:<9}  {:>3}  {:<19}  {:<19}  {error}",
            job.id,
            job.status,
            job.bbox_status.as_deref().unwrap_or("-"),
            job.attempts,
            time(job.submitted_at),
            job.finished_at.map(time).unwrap_or_default(),
        );
    }
    out
}
