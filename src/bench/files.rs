//! The files phase: how fast `serve` takes uploads (`POST /v1/files`), and
//! how much a file adds to a job's latency, submit to bbox succeeded: jobs
//! one at a time on the JSON sample, then as a multipart submit of the same
//! invoice as a PDF of 1 MB and of 20 MB (the sample PDF with an image-sized
//! stream it does not draw, as a scan's PDF with a text layer carries). Each
//! upload is of new bytes, so none is answered from a file kept before.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;
use uuid::Uuid;

use super::pipeline::{start_pipeline, warm_up, Rig};
use super::procs::Proc;
use crate::demo::{accepted, sample_files, SampleFile};

/// What the phase measured.
#[derive(Debug, Clone, Serialize)]
pub struct Files {
    /// Uploads of 1 MB and of 20 MB files.
    pub uploads: Vec<Uploads>,
    /// Jobs on the JSON sample, and on it as PDFs of 1 MB and of 20 MB.
    pub latency: Vec<FileLatency>,
}

/// Back-to-back uploads of files of one size.
#[derive(Debug, Clone, Serialize)]
pub struct Uploads {
    /// Bytes of each file.
    pub bytes: usize,
    /// Files uploaded.
    pub files: usize,
    /// Uploads in flight at once.
    pub concurrency: usize,
    /// Wall time of all of them.
    pub seconds: f64,
    /// Megabytes (10^6 bytes) a second.
    pub mb_per_s: f64,
}

/// Jobs of one kind, one at a time.
#[derive(Debug, Clone, Serialize)]
pub struct FileLatency {
    /// What the job's document was.
    pub document: String,
    /// Bytes of its file (0: JSON).
    pub bytes: usize,
    /// Jobs measured.
    pub jobs: usize,
    /// Submit (the upload with it) to bbox succeeded, median, ms.
    pub p50_ms: f64,
    /// The same, the slowest but one in ten, ms.
    pub p90_ms: f64,
    /// What the file added to the median of the JSON document's jobs, ms.
    pub added_ms: f64,
}

/// One MB and twenty, as the issue of files asks for.
const SIZES: [usize; 2] = [1_000_000, 20_000_000];

/// Runs the phase on `rig` with one worker and one bbox worker.
pub async fn files(rig: &Rig, jobs: usize, progress: &ProgressBar) -> anyhow::Result<Files> {
    let mut rig = rig.clone();
    let dir = rig.logs.join("files");
    rig.env
        .push(("DOCSTREAM_FILES_DIR".into(), dir.display().to_string()));
    rig.env.push((
        "DOCSTREAM_FILE_MAX_BYTES".into(),
        (32 * 1024 * 1024).to_string(),
    ));
    let (client, base, mut procs) = start_pipeline(&rig, 1, 1).await?;
    progress.set_message("warming up");
    warm_up(
        &rig,
        &client,
        &base,
        &super::pipeline::requests_for(None),
        &mut procs,
    )
    .await?;
    let sample = &sample_files()[0];
    let uploads = upload_rates(&client, &base, sample.pdf, progress).await?;
    let mut latency: Vec<FileLatency> = Vec::new();
    for bytes in [0, SIZES[0], SIZES[1]] {
        let document = match bytes {
            0 => "the JSON sample".to_owned(),
            n => format!("the sample as a PDF of {} MB", n / 1_000_000),
        };
        progress.set_message(format!("jobs on {document}, one at a time"));
        let job = (&client, base.as_str(), sample, bytes);
        let took = one_at_a_time(&rig, job, jobs, &mut procs).await?;
        let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
        let baseline = latency.first().map_or(at(0.5), |l| l.p50_ms);
        latency.push(FileLatency {
            document,
            bytes,
            jobs,
            p50_ms: at(0.5),
            p90_ms: at(0.9),
            added_ms: at(0.5) - baseline,
        });
    }
    for proc in procs {
        proc.stop().await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Files { uploads, latency })
}

/// Uploads of files of each of [`SIZES`] (the sample `pdf`, padded), a few
/// at a time, and the rate each size went at.
async fn upload_rates(
    client: &reqwest::Client,
    base: &str,
    pdf: &[u8],
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Uploads>> {
    let mut uploads = Vec::new();
    for (bytes, files, concurrency) in [(SIZES[0], 40, 4), (SIZES[1], 6, 2)] {
        progress.set_message(format!("uploading {files} files of {bytes} bytes"));
        let pdfs: Vec<Vec<u8>> = (0..files)
            .map(|_| padded(pdf, bytes))
            .collect::<anyhow::Result<_>>()?;
        let started = Instant::now();
        let sent: Vec<anyhow::Result<()>> = futures::stream::iter(pdfs)
            .map(|pdf| upload(client, base, pdf))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        sent.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        let seconds = started.elapsed().as_secs_f64();
        uploads.push(Uploads {
            bytes,
            files,
            concurrency,
            seconds,
            mb_per_s: (bytes * files) as f64 / 1e6 / seconds,
        });
    }
    Ok(uploads)
}

/// `jobs` jobs on `sample`, one at a time: as JSON when `bytes` is 0, else
/// with its PDF padded to `bytes`. Each one's milliseconds from submit to
/// its boxes, sorted.
async fn one_at_a_time(
    rig: &Rig,
    (client, base, sample, bytes): (&reqwest::Client, &str, &SampleFile, usize),
    jobs: usize,
    procs: &mut [Proc],
) -> anyhow::Result<Vec<f64>> {
    let mut took = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let pdf = match bytes {
            0 => None,
            n => Some(padded(sample.pdf, n)?),
        };
        let started = Instant::now();
        let id = match pdf {
            None => submit_json(client, base, &sample.request).await?,
            Some(pdf) => submit_file(client, base, &sample.request, pdf).await?,
        };
        until_bbox_succeeded(rig, id, procs).await?;
        took.push(started.elapsed().as_secs_f64() * 1e3);
    }
    took.sort_by(f64::total_cmp);
    Ok(took)
}

/// `pdf` with an undrawn stream of random bytes added, `size` bytes in all.
fn padded(pdf: &[u8], size: usize) -> anyhow::Result<Vec<u8>> {
    use pdf_extract::{Dictionary, Object, Stream};
    let mut document = pdf_extract::Document::load_mem(pdf).context("the sample PDF")?;
    let mut dict = Dictionary::new();
    dict.set("Type", Object::Name(b"XObject".to_vec()));
    dict.set("Subtype", Object::Name(b"Image".to_vec()));
    let room = size.saturating_sub(pdf.len() + 200);
    let filler: Vec<u8> = (0..room).map(|_| rand::random::<u8>()).collect();
    document.add_object(Stream::new(dict, filler));
    let mut out = Vec::with_capacity(size);
    document
        .save_to(&mut out)
        .context("writing the padded PDF")?;
    Ok(out)
}

async fn upload(client: &reqwest::Client, base: &str, pdf: Vec<u8>) -> anyhow::Result<()> {
    let response = client
        .post(format!("{base}/v1/files"))
        .header(reqwest::header::CONTENT_TYPE, "application/pdf")
        .body(pdf)
        .send()
        .await?;
    let status = response.status();
    anyhow::ensure!(
        status.is_success(),
        "upload answered {status}: {}",
        response.text().await?
    );
    Ok(())
}

async fn submit_json(
    client: &reqwest::Client,
    base: &str,
    request: &serde_json::Value,
) -> anyhow::Result<Uuid> {
    let (pages, _) = crate::demo::sample_requests()
        .into_iter()
        .map(|s| (s.request.document, s.name))
        .find(|(_, name)| name == "invoice-northwind")
        .context("the JSON northwind sample")?;
    let mut request = request.clone();
    request["document"] = serde_json::to_value(pages)?;
    let response = client
        .post(format!("{base}/v1/extractions"))
        .json(&request)
        .send()
        .await?;
    accepted(response).await
}

async fn submit_file(
    client: &reqwest::Client,
    base: &str,
    request: &serde_json::Value,
    pdf: Vec<u8>,
) -> anyhow::Result<Uuid> {
    let (content_type, body) =
        crate::demo::multipart_body(request, "invoice.pdf", "application/pdf", &pdf)?;
    let response = client
        .post(format!("{base}/v1/extractions"))
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(body)
        .send()
        .await?;
    accepted(response).await
}

/// Waits for job `id`'s bbox refinement to succeed (polled every 2 ms),
/// failing if it fails or a process of the pipeline died.
async fn until_bbox_succeeded(rig: &Rig, id: Uuid, procs: &mut [Proc]) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let row: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT status, bbox_status FROM extractions WHERE id = $1")
                .bind(id)
                .fetch_optional(&rig.pool)
                .await?;
        match row {
            Some((_, Some(bbox))) if bbox == "succeeded" => return Ok(()),
            Some((status, bbox)) if status == "failed" || bbox.as_deref() == Some("failed") => {
                anyhow::bail!("job {id} failed")
            }
            _ => {}
        }
        for proc in procs.iter_mut() {
            proc.ensure_running()?;
        }
        anyhow::ensure!(
            Instant::now() < give_up,
            "job {id} did not finish within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
