//! `docstream eval`: how well docstream reads, measured on documents whose
//! values are known. It runs the real pipeline in this process (the API,
//! a worker, a bbox worker, on the local Kafka and Postgres), submits every
//! document of a folder as a file, one at a time, and compares each job's
//! values and boxes with the document's ground truth, then prints by
//! document kind and by variant (resolution, rotation, noise, …):
//!
//! - the share of fields whose value is exactly the truth's;
//! - the share whose box overlaps the truth's with IoU ≥ 0.5, on its page;
//! - the share flagged `needs_review`;
//! - pages per second per core, from the CPU time this process and its
//!   children (the OCR engine, the PDF reader) spent while the jobs ran,
//!   and the worker's time per page (p50/p99), from each job's start and
//!   end.
//!
//! A document `<name>.<ext>` comes with `<name>.truth.json`: its kind, its
//! variant, the request's fields, and each field's value, page and box in
//! the document's own unit (`scripts/make_scans.py` writes the shipped
//! samples' scans so; a tenant's corrected fields are exported so).
//! Documents are submitted one at a time, so a page's time is its own, not
//! a queue's.
//!
//! A folder of documents with gold fields instead (`NAME.jpg` beside
//! `NAME.json`, a flat object of field values as printed, as public
//! receipt sets ship them) is read with `--request FILE` (the request's
//! fields, the same for every document) and `--gold field=key,…` (which
//! gold value each requested field is compared with; by default the one of
//! its own name). Then the table by field also gives the share right after
//! normalisation (amounts as numbers, dates as dates, text without case or
//! spacing) and how well `needs_review` separates wrong values from right
//! ones: its precision (of the flagged, the share wrong) and recall (of
//! the wrong, the share flagged). A field not found counts as flagged: the
//! reviewer sees it missing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::bench::procs;
use docstream::config::Settings;
use docstream::roles::{self, Mix};
use docstream::store::tenants;

/// Options of `docstream eval`.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// The folder of documents and their `.truth.json` files.
    #[arg(default_value = "samples/scans")]
    pub dir: PathBuf,
    /// Only the documents whose variant is one of these (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// The `min_confidence` every job is submitted with (default: the
    /// request's own, or docstream's default).
    #[arg(long)]
    pub min_confidence: Option<f64>,
    /// Fail unless at least this share of fields (0 to 1) is exact, over
    /// the documents of at least `--at-dpi` (and the PDFs).
    #[arg(long)]
    pub min_exact: Option<f64>,
    /// Fail unless at least this share of boxes has IoU ≥ 0.5, over the same.
    #[arg(long)]
    pub min_iou: Option<f64>,
    /// The least resolution the targets hold for.
    #[arg(long, default_value_t = 200)]
    pub at_dpi: u32,
    /// Give up on a document after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    /// For a folder of documents with gold fields (`NAME.json` beside each
    /// image or PDF): a JSON file of the request every document is
    /// submitted with (its `fields`, and anything else a request takes but
    /// the document).
    #[arg(long)]
    pub request: Option<PathBuf>,
    /// For gold fields: the gold key each requested field is compared with,
    /// `field=key` (comma-separated); a field not named is compared with
    /// the key of its own name.
    #[arg(long, value_delimiter = ',')]
    pub gold: Vec<String>,
    /// Write each job as it finished (`NAME.job.json`) and the document
    /// its file was read into (`NAME.document.json`) into this folder: to
    /// tell what the reader saw from what the extractor chose.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Submit the documents already read, as `--keep` wrote them
    /// (`NAME.document.json` in this folder), instead of the files: to
    /// measure the extractor's choices apart from the reader, in seconds.
    /// A document without one is submitted as its file.
    #[arg(long)]
    pub read_from: Option<PathBuf>,
}

/// A document's ground truth.
#[derive(Debug, Deserialize)]
struct Truth {
    /// The document's file name, in the truth's folder.
    document: String,
    /// `invoice`, `receipt`, …
    kind: String,
    /// How it was made: `300dpi`, `rot90`, `text`, `corrected`, …
    variant: String,
    /// The resolution of a scan; none for a PDF.
    #[serde(default)]
    dpi: Option<u32>,
    /// Its pages.
    #[serde(default = "one")]
    pages: usize,
    /// The request to submit with it (its fields).
    request: serde_json::Value,
    /// Each field's truth; `null` for a field the document does not have.
    fields: BTreeMap<String, Option<FieldTruth>>,
}

fn one() -> usize {
    1
}

/// One field's truth.
#[derive(Debug, Deserialize)]
struct FieldTruth {
    value: String,
    #[serde(default)]
    page: usize,
    /// `[x0, y0, x1, y1]` in the document's unit; none when unknown.
    #[serde(default)]
    bbox: Option<[f64; 4]>,
}

/// How one document was read.
#[derive(Debug, Default, Clone)]
struct Scored {
    fields: usize,
    exact: usize,
    /// Fields with a truth box, and those read within IoU ≥ 0.5 of it.
    boxed: usize,
    overlapping: usize,
    needs_review: usize,
    pages: usize,
    /// The worker's time on the job, per page.
    per_page: Vec<f64>,
    /// Documents that failed outright.
    failed: usize,
    /// The fields read wrong, a line each.
    misses: Vec<String>,
    documents: usize,
    /// By field name.
    by_field: BTreeMap<String, FieldScore>,
}

/// How one field was read over the documents.
#[derive(Debug, Default, Clone)]
struct FieldScore {
    documents: usize,
    exact: usize,
    /// Right once normalised: amounts as numbers, dates as dates, text
    /// without case or spacing.
    normalised: usize,
    /// Flagged `needs_review`, or not found.
    flagged: usize,
    /// Flagged and wrong (after normalisation).
    flagged_wrong: usize,
}

impl FieldScore {
    fn add(&mut self, other: &FieldScore) {
        self.documents += other.documents;
        self.exact += other.exact;
        self.normalised += other.normalised;
        self.flagged += other.flagged;
        self.flagged_wrong += other.flagged_wrong;
    }
}

impl Scored {
    fn add(&mut self, other: &Scored) {
        self.fields += other.fields;
        self.exact += other.exact;
        self.boxed += other.boxed;
        self.overlapping += other.overlapping;
        self.needs_review += other.needs_review;
        self.pages += other.pages;
        self.per_page.extend(&other.per_page);
        self.failed += other.failed;
        self.documents += other.documents;
        for (name, field) in &other.by_field {
            self.by_field.entry(name.clone()).or_default().add(field);
        }
    }
}

/// Runs the evaluation; see the module docs.
pub async fn run(
    settings: Settings,
    args: EvalArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let truths = load(&args)?;
    anyhow::ensure!(
        !truths.is_empty(),
        "no *.truth.json in {} (write the sample scans with: /usr/bin/python3 scripts/make_scans.py)",
        args.dir.display()
    );
    let mut settings = settings;
    settings.metrics_addr = ([127, 0, 0, 1], 0).into();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let services = roles::connect(settings).await?;
    let pool = services.pool.clone();
    let key = own_tenant(&pool)
        .await
        .context("making the evaluation's tenant (did `docstream migrate` run?)")?;
    // The key is revoked however the run ends.
    let evaluated = evaluate_with(services, listener, &base, &key, &args, &truths, &shutdown).await;
    let revoked = docstream::store::tenants::revoke_key(&pool, key.key_id).await;
    let (by_document, cpu_s, ocr_cpu_s, pipeline_mib, child_mib) = evaluated?;
    revoked?;
    report(&truths, &by_document, cpu_s, ocr_cpu_s);
    println!(
        "peak resident memory: {:.1} MiB this process (the API, the worker and the bbox worker \
         together), {:.1} MiB the largest child (one page's OCR engine, ImageMagick or poppler)",
        pipeline_mib, child_mib
    );
    check_targets(&args, &truths, &by_document)
}

/// A tenant of the evaluation's own, made now under a name nobody else
/// has, without quotas, and its key: an existing tenant is never given
/// unlimited quotas, whatever database the evaluation is pointed at.
async fn own_tenant(pool: &sqlx::PgPool) -> anyhow::Result<tenants::CreatedKey> {
    let name = format!("eval-{}", uuid::Uuid::now_v7().simple());
    let created = tenants::create_tenant(pool, &name).await?;
    tenants::set_quota(pool, &name, Some(Some(0.0)), None, Some(Some(0))).await?;
    Ok(created.key)
}

/// Runs the pipeline on `services` and evaluates `truths` through it as
/// `key`'s tenant: the scores, the CPU seconds (all, and OCR's), and the
/// peak memory of this process and of its largest child, in MiB.
async fn evaluate_with(
    services: roles::Process,
    listener: TcpListener,
    base: &str,
    key: &tenants::CreatedKey,
    args: &EvalArgs,
    truths: &[(PathBuf, Truth)],
    shutdown: &CancellationToken,
) -> anyhow::Result<(Vec<Scored>, f64, f64, f64, f64)> {
    let mix = Mix {
        serve: true,
        workers: 1,
        bbox_workers: 1,
        intakes: 0,
    };
    let stop = shutdown.child_token();
    let pipeline = tokio::spawn(roles::run(services, mix, Some(listener), stop.clone()));
    let client = crate::demo::api_client(&key.api_key)?;
    let sampling = CancellationToken::new();
    let children = tokio::spawn(children_peak_rss_mib(sampling.clone()));
    let scored = evaluate(&client, base, args, truths, shutdown).await;
    sampling.cancel();
    let pipeline_mib = procs::peak_rss_mib_of(std::process::id())?;
    let child_mib = children.await?;
    stop.cancel();
    pipeline.await??;
    let (by_document, cpu_s, ocr_cpu_s) = scored?;
    Ok((by_document, cpu_s, ocr_cpu_s, pipeline_mib, child_mib))
}

/// Every truth of the folder, in name order, of the variants asked for;
/// with `--request`, the folder's gold fields instead.
fn load(args: &EvalArgs) -> anyhow::Result<Vec<(PathBuf, Truth)>> {
    if let Some(request) = &args.request {
        return load_gold(&args.dir, request, &args.gold);
    }
    let listing =
        std::fs::read_dir(&args.dir).with_context(|| format!("reading {}", args.dir.display()))?;
    let mut paths: Vec<PathBuf> = listing
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".truth.json"))
        .collect();
    paths.sort();
    let mut truths = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let truth: Truth = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a truth file", path.display()))?;
        if args.variants.is_empty() || args.variants.contains(&truth.variant) {
            let document = path.with_file_name(&truth.document);
            truths.push((document, truth));
        }
    }
    Ok(truths)
}

/// The documents of `dir` that have gold fields (`NAME.json` beside
/// `NAME.jpg`, `.jpeg`, `.png`, `.tif`, `.tiff` or `.pdf`), in name order,
/// each to be submitted with the request in the file `request`, its
/// fields compared with the gold keys `map` names.
fn load_gold(
    dir: &std::path::Path,
    request: &std::path::Path,
    map: &[String],
) -> anyhow::Result<Vec<(PathBuf, Truth)>> {
    let text = std::fs::read_to_string(request)
        .with_context(|| format!("reading the request {}", request.display()))?;
    let request: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", request.display()))?;
    let names: Vec<String> = (request["fields"].as_array())
        .context("the request has no `fields` array")?
        .iter()
        .filter_map(|f| f["name"].as_str().map(str::to_owned))
        .collect();
    let mut keys: BTreeMap<String, String> = names.iter().map(|n| (n.clone(), n.clone())).collect();
    for pair in map {
        let (field, key) = pair
            .split_once('=')
            .with_context(|| format!("--gold {pair:?} is not field=key"))?;
        anyhow::ensure!(
            keys.contains_key(field),
            "--gold names {field:?}, which the request does not ask for"
        );
        keys.insert(field.to_owned(), key.to_owned());
    }
    let kind = dir
        .file_name()
        .map_or("documents".into(), |n| n.to_string_lossy().into_owned());
    let listing = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut golds: Vec<PathBuf> = listing
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    golds.sort();
    let mut truths = Vec::new();
    for gold in golds {
        let Some(document) = ["jpg", "jpeg", "png", "tif", "tiff", "pdf"]
            .iter()
            .map(|ext| gold.with_extension(ext))
            .find(|p| p.is_file())
        else {
            continue;
        };
        let values: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&gold)?)
                .with_context(|| format!("{} is not an object of gold fields", gold.display()))?;
        let fields = (keys.iter())
            .map(|(field, key)| {
                let value = values
                    .get(key)
                    .and_then(|v| v.as_str())
                    .map(|v| FieldTruth {
                        value: v.trim().to_owned(),
                        page: 0,
                        bbox: None,
                    });
                (field.clone(), value)
            })
            .collect();
        let name = document.file_name().unwrap_or_default().to_string_lossy();
        truths.push((
            document.clone(),
            Truth {
                document: name.into_owned(),
                kind: kind.clone(),
                variant: "gold".into(),
                dpi: None,
                pages: 1,
                request: request.clone(),
                fields,
            },
        ));
    }
    Ok(truths)
}

/// Submits each document alone, waits for its job, and scores it: the
/// scores by document, and the CPU seconds this process and its children
/// spent, all of it and the children's alone.
async fn evaluate(
    client: &reqwest::Client,
    base: &str,
    args: &EvalArgs,
    truths: &[(PathBuf, Truth)],
    shutdown: &CancellationToken,
) -> anyhow::Result<(Vec<Scored>, f64, f64)> {
    let before = cpu_seconds()?;
    let mut scored = Vec::new();
    for (path, truth) in truths {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let mut request = truth.request.clone();
        if let Some(min) = args.min_confidence {
            request["min_confidence"] = serde_json::json!(min);
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let read = (args.read_from.as_ref())
            .map(|dir| dir.join(format!("{name}.document.json")))
            .filter(|p| p.is_file());
        let (content_type, body) = match read {
            Some(read) => {
                request["document"] = serde_json::from_slice(&std::fs::read(&read)?)
                    .with_context(|| format!("{} is not a document", read.display()))?;
                ("application/json".to_owned(), serde_json::to_vec(&request)?)
            }
            None => {
                crate::demo::multipart_body(&request, &name, "application/octet-stream", &bytes)?
            }
        };
        let response = client
            .post(format!("{base}/v1/extractions"))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .with_context(|| format!("submitting {name}"))?;
        let id = crate::demo::accepted(response).await?;
        let job = finished(client, base, id, args.timeout_s, shutdown).await?;
        if let Some(dir) = &args.keep {
            keep(client, base, id, &job, &dir.join(&*name)).await?;
        }
        let score = score(truth, &job);
        if score.failed > 0 {
            println!("{name}: {}: {}", job["status"], job["error"]);
        }
        for miss in &score.misses {
            println!("{name}: {miss}");
        }
        scored.push(score);
    }
    let after = cpu_seconds()?;
    Ok((scored, after.0 - before.0, after.1 - before.1))
}

/// Writes `job` and the document read from its file beside `path`
/// (`path.job.json`, `path.document.json`).
async fn keep(
    client: &reqwest::Client,
    base: &str,
    id: uuid::Uuid,
    job: &serde_json::Value,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let write = |suffix: &str, value: &serde_json::Value| {
        let to = format!("{}.{suffix}.json", path.display());
        std::fs::write(&to, serde_json::to_vec_pretty(value)?)
            .with_context(|| format!("writing {to}"))
    };
    write("job", job)?;
    let response = client
        .get(format!("{base}/v1/extractions/{id}/document"))
        .send()
        .await?;
    if response.status().is_success() {
        write("document", &response.json().await?)?;
    }
    Ok(())
}

/// Job `id` once its extraction failed or its bbox refinement ended.
async fn finished(
    client: &reqwest::Client,
    base: &str,
    id: uuid::Uuid,
    timeout_s: u64,
    shutdown: &CancellationToken,
) -> anyhow::Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_s);
    loop {
        let job: serde_json::Value = client
            .get(format!("{base}/v1/extractions/{id}"))
            .send()
            .await?
            .json()
            .await?;
        let bbox = job["post_processing"]["bbox_refinement"]["status"].as_str();
        match (job["status"].as_str(), bbox) {
            (Some("failed" | "cancelled"), _) => return Ok(job),
            (_, Some("succeeded" | "failed")) => return Ok(job),
            _ => {}
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "job {id} did not finish in {timeout_s} s: {job}"
        );
        tokio::select! {
            _ = shutdown.cancelled() => anyhow::bail!("interrupted"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// How `job` read the document of `truth`.
fn score(truth: &Truth, job: &serde_json::Value) -> Scored {
    let mut scored = Scored {
        documents: 1,
        pages: truth.pages,
        fields: truth.fields.len(),
        ..Scored::default()
    };
    if job["status"] != "succeeded" {
        scored.failed = 1;
        for (name, want) in &truth.fields {
            let wrong = want.is_some();
            let field = FieldScore {
                documents: 1,
                exact: usize::from(!wrong),
                normalised: usize::from(!wrong),
                flagged: 1,
                flagged_wrong: usize::from(wrong),
            };
            scored.by_field.insert(name.clone(), field);
        }
        scored.boxed = truth
            .fields
            .values()
            .flatten()
            .filter(|f| f.bbox.is_some())
            .count();
        return scored;
    }
    let times = (job["started_at"].as_str(), job["finished_at"].as_str());
    if let (Some(started), Some(finished)) = times {
        let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
        if let (Some(started), Some(finished)) = (at(started), at(finished)) {
            let seconds = (finished - started).num_microseconds().unwrap_or(0) as f64 / 1e6;
            scored.per_page = vec![seconds / truth.pages.max(1) as f64; truth.pages.max(1)];
        }
    }
    let grounded = &job["post_processing"]["bbox_refinement"]["result"]["fields"];
    for (name, want) in &truth.fields {
        let read = &job["result"]["fields"][name];
        let value = read["value"].as_str();
        let got = &grounded[name];
        if got["needs_review"] == true {
            scored.needs_review += 1;
        }
        let want_value = want.as_ref().map(|w| w.value.as_str());
        let exact = value == want_value || (value.is_some() && read["raw"].as_str() == want_value);
        let right = match (value, want_value) {
            (Some(got), Some(want)) => same(got, want),
            (got, want) => got == want,
        };
        let flagged = got["needs_review"] == true || (value.is_none() && want.is_some());
        scored.by_field.insert(
            name.clone(),
            FieldScore {
                documents: 1,
                exact: usize::from(exact),
                normalised: usize::from(right),
                flagged: usize::from(flagged),
                flagged_wrong: usize::from(flagged && !right),
            },
        );
        match exact {
            true => scored.exact += 1,
            false => scored.misses.push(format!(
                "{name}: read {value:?} (confidence {}{}), truth {want_value:?}{}",
                got["confidence"],
                if flagged { ", flagged" } else { "" },
                if right { ": right once normalised" } else { "" },
            )),
        }
        let Some(want) = want else {
            continue;
        };
        let Some(truth_box) = want.bbox else {
            continue;
        };
        scored.boxed += 1;
        let bbox: Option<[f64; 4]> = serde_json::from_value(got["bbox"].clone()).ok();
        let on_page = got["page"].as_u64() == Some(want.page as u64);
        if bbox.is_some_and(|b| on_page && docstream::extract::iou(b, truth_box) >= 0.5) {
            scored.overlapping += 1;
        }
    }
    scored
}

/// True when `got` and `want` say the same: as amounts, as dates, or as
/// text without case, spacing or punctuation around it.
fn same(got: &str, want: &str) -> bool {
    use docstream::extract::values;
    if let (Some(a), Some(b)) = (values::money_cents(got), values::money_cents(want)) {
        return a == b;
    }
    if let (Some(a), Some(b)) = (values::date(got), values::date(want)) {
        return a == b;
    }
    let fold = |s: &str| {
        (s.split(|c: char| !c.is_alphanumeric()))
            .filter(|w| !w.is_empty())
            .map(str::to_uppercase)
            .collect::<Vec<_>>()
    };
    fold(got) == fold(want)
}

/// CPU seconds (user and system) this process has used, and those of its
/// children that ended (the OCR engine, the PDF reader).
fn cpu_seconds() -> anyhow::Result<(f64, f64)> {
    let times = procs::cpu_of(std::process::id())?;
    Ok((times.own + times.reaped_children, times.reaped_children))
}

/// The largest peak resident set size of this process's children (the OCR
/// engine, ImageMagick, poppler, the PDF reader), MiB: sampled every 20 ms
/// until `stop`, each child's own peak so far, so a child's peak counts
/// when it lives 20 ms or more.
async fn children_peak_rss_mib(stop: CancellationToken) -> f64 {
    let me = std::process::id();
    let mut peak: f64 = 0.0;
    while !stop.is_cancelled() {
        for child in procs::children_of(me) {
            peak = peak.max(procs::peak_rss_mib_of(child).unwrap_or(0.0));
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    peak
}

/// The tables: by kind, by variant, and the whole.
fn report(truths: &[(PathBuf, Truth)], scored: &[Scored], cpu_s: f64, ocr_cpu_s: f64) {
    let group = |key: &dyn Fn(&Truth) -> String| {
        let mut groups: BTreeMap<String, Scored> = BTreeMap::new();
        for ((_, truth), score) in truths.iter().zip(scored) {
            groups.entry(key(truth)).or_default().add(score);
        }
        groups
    };
    let mut all = Scored::default();
    scored.iter().for_each(|s| all.add(s));
    println!("{}", header("kind"));
    for (kind, s) in group(&|t| t.kind.clone()) {
        println!("{}", row(&kind, &s));
    }
    println!("{}", row("all", &all));
    println!("\n{}", header("variant"));
    for (variant, s) in group(&|t| t.variant.clone()) {
        println!("{}", row(&variant, &s));
    }
    println!("\n{}", field_header());
    for (name, field) in &all.by_field {
        println!("{}", field_row(name, field));
    }
    let pages = all.pages as f64;
    let per_core = |cpu_s: f64| match cpu_s > 0.05 {
        true => format!("{:.2}", pages / cpu_s),
        false => "-".to_owned(),
    };
    println!(
        "\n{} pages in {cpu_s:.1} CPU-seconds: {} pages/s per core, the whole pipeline \
         (API, worker, bbox worker, the OCR engine and the PDF reader); the OCR engine and \
         the PDF reader alone: {ocr_cpu_s:.1} CPU-seconds, {} pages/s per core",
        all.pages,
        per_core(cpu_s),
        per_core(ocr_cpu_s),
    );
}

fn header(by: &str) -> String {
    format!(
        "{by:<10} {:>5} {:>7} {:>8} {:>10} {:>13} {:>10} {:>10}",
        "docs", "fields", "exact", "IoU≥0.5", "needs_review", "p50 s/page", "p99 s/page"
    )
}

fn row(name: &str, s: &Scored) -> String {
    let share = |n: usize, of: usize| match of {
        0 => "-".to_owned(),
        _ => format!("{:.1}%", 100.0 * n as f64 / of as f64),
    };
    let failed = match s.failed {
        0 => String::new(),
        n => format!("  ({n} failed)"),
    };
    format!(
        "{name:<10} {:>5} {:>7} {:>8} {:>10} {:>13} {:>10} {:>10}{failed}",
        s.documents,
        s.fields,
        share(s.exact, s.fields),
        share(s.overlapping, s.boxed),
        share(s.needs_review, s.fields),
        quantile(&s.per_page, 0.5),
        quantile(&s.per_page, 0.99),
    )
}

fn field_header() -> String {
    format!(
        "{:<10} {:>5} {:>7} {:>11} {:>8} {:>17} {:>14} {:>15}",
        "field",
        "docs",
        "exact",
        "normalised",
        "flagged",
        "review precision",
        "review recall",
        "right flagged"
    )
}

/// A field's row: its shares right, and how `needs_review` separates the
/// wrong values (which it should flag) from the right ones (which it
/// should not).
fn field_row(name: &str, f: &FieldScore) -> String {
    let share = |n: usize, of: usize| match of {
        0 => "-".to_owned(),
        _ => format!("{:.1}%", 100.0 * n as f64 / of as f64),
    };
    let wrong = f.documents - f.normalised;
    let right_flagged = f.flagged - f.flagged_wrong;
    format!(
        "{name:<10} {:>5} {:>7} {:>11} {:>8} {:>17} {:>14} {:>15}",
        f.documents,
        share(f.exact, f.documents),
        share(f.normalised, f.documents),
        share(f.flagged, f.documents),
        share(f.flagged_wrong, f.flagged),
        share(f.flagged_wrong, wrong),
        share(right_flagged, f.normalised),
    )
}

/// The `q` quantile of `values` (nearest rank), in seconds to 3 places.
fn quantile(values: &[f64], q: f64) -> String {
    if values.is_empty() {
        return "-".into();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    format!("{:.3}", sorted[rank - 1])
}

/// Fails when the documents the targets hold for (scans of at least
/// `--at-dpi`, and PDFs) read below `--min-exact` or `--min-iou`.
fn check_targets(
    args: &EvalArgs,
    truths: &[(PathBuf, Truth)],
    scored: &[Scored],
) -> anyhow::Result<()> {
    let mut held = Scored::default();
    for ((_, truth), score) in truths.iter().zip(scored) {
        if truth.dpi.is_none_or(|dpi| dpi >= args.at_dpi) {
            held.add(score);
        }
    }
    let share = |n: usize, of: usize| n as f64 / of.max(1) as f64;
    let exact = share(held.exact, held.fields);
    let overlapping = share(held.overlapping, held.boxed);
    if let Some(min) = args.min_exact {
        anyhow::ensure!(
            exact >= min,
            "{:.1}% of fields exact, under the target of {:.1}%",
            exact * 100.0,
            min * 100.0
        );
    }
    if let Some(min) = args.min_iou {
        anyhow::ensure!(
            overlapping >= min,
            "{:.1}% of boxes with IoU ≥ 0.5, under the target of {:.1}%",
            overlapping * 100.0,
            min * 100.0
        );
    }
    Ok(())
}
