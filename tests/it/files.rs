//! Files on a real Postgres, in the folder store and in a real S3-compatible
//! server (s3s-fs, which `scripts/test.sh` installs; `DOCSTREAM_TEST_S3`
//! names it): an upload is stored once per tenant under its SHA-256 and
//! described by a row; the same bytes again are the same file; another
//! tenant never sees it; and every refused upload (empty, too large, of an
//! unknown kind, or not the kind its Content-Type says) gets a clear 4xx
//! with nothing stored.

use crate::common;

use std::path::Path;

use common::scans::render;
use common::TestEnv;
use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The file limit of the test: above the API's 4 MiB body limit, so an
/// upload between the two shows the route's own limit in force.
const FILE_LIMIT: usize = 5 * 1024 * 1024;

/// What a PDF's streams may inflate to in the test.
const INFLATE_LIMIT: usize = 6 * 1024 * 1024;

/// Where a test keeps its files.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    /// The folder store.
    Dir,
    /// A bucket of an s3s-fs server of the test's own.
    S3,
}

/// The bucket of the S3 tests.
const BUCKET: &str = "docstream-files";

/// One test's `serve`, in-process, with the folder its store keeps the bytes
/// in (the store's own, or the S3 server's bucket) and a second tenant's key.
struct Files {
    env: TestEnv,
    base: String,
    _dir: tempfile::TempDir,
    /// Where the objects are, under `dir`.
    objects: std::path::PathBuf,
    other_key: String,
    _s3: Option<tokio::process::Child>,
    _serving: tokio_util::sync::DropGuard,
}

impl Files {
    async fn start(store: Store) -> Self {
        Self::start_with(store, |_| {}).await
    }

    /// [`Files::start`], with `adjust` applied to the settings last.
    async fn start_with(
        store: Store,
        adjust: impl FnOnce(&mut docstream::config::Settings),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (s3, objects, endpoint) = match store {
            Store::Dir => (None, dir.path().to_owned(), String::new()),
            Store::S3 => {
                let (server, endpoint) = s3_server(dir.path()).await;
                (Some(server), dir.path().join(BUCKET), endpoint)
            }
        };
        let files_dir = dir.path().display().to_string();
        let env = TestEnv::with_settings(&format!("files_{}", store as u8), |s| {
            s.files_dir = files_dir;
            s.file_max_bytes = FILE_LIMIT;
            s.file_max_inflated_bytes = INFLATE_LIMIT;
            if store == Store::S3 {
                s.files_s3_bucket = BUCKET.into();
                s.files_s3_endpoint = endpoint;
                s.files_s3_access_key_id = "docstream-test".into();
                s.files_s3_secret_access_key = "docstream-test-secret".into();
            }
            adjust(s);
        })
        .await;
        let created = env.run_cli(&["tenants", "create", "other"]).await;
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        let created: Value = serde_json::from_slice(&created.stdout).unwrap();
        let other_key = created["api_key"].as_str().unwrap().to_owned();
        let services = env.services().await;
        let (base, serving) = env.serve_here(services).await;
        Self {
            env,
            base,
            _dir: dir,
            objects,
            other_key,
            _s3: s3,
            _serving: serving,
        }
    }

    /// Uploads `bytes` as the default tenant (or with `key`), declared as
    /// `content_type`; the answer's status and body.
    async fn upload(
        &self,
        bytes: Vec<u8>,
        content_type: &str,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .env
            .client()
            .post(format!("{}/v1/files", self.base))
            .header("content-type", content_type)
            .body(bytes);
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        answer(request.send().await.unwrap()).await
    }

    async fn read(&self, id: &str, key: Option<&str>) -> (StatusCode, Value) {
        let mut request = self
            .env
            .client()
            .get(format!("{}/v1/files/{id}", self.base));
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        answer(request.send().await.unwrap()).await
    }

    /// What is stored: the rows, and the objects in the store's folder.
    async fn stored(&self) -> (i64, usize) {
        let rows = sqlx::query_scalar("SELECT count(*) FROM files")
            .fetch_one(&self.env.pool)
            .await
            .unwrap();
        (rows, objects_under(&self.objects))
    }
}

/// Starts s3s-fs on a free loopback port with its data under `root` and an
/// empty bucket [`BUCKET`]; once it accepts connections, the process and
/// its address.
async fn s3_server(root: &Path) -> (tokio::process::Child, String) {
    let binary = std::env::var("DOCSTREAM_TEST_S3").expect(
        "DOCSTREAM_TEST_S3 names the s3s-fs binary: run scripts/test.sh, which installs it",
    );
    std::fs::create_dir_all(root.join(BUCKET)).unwrap();
    let port = common::free_port();
    let log = std::fs::File::create(common::log_path("files-s3s-fs")).unwrap();
    let server = tokio::process::Command::new(binary)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--access-key",
            "docstream-test",
            "--secret-key",
            "docstream-test-secret",
        ])
        .arg(root)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start s3s-fs");
    let addr = format!("127.0.0.1:{port}");
    common::wait_for(
        "s3s-fs to accept connections",
        std::time::Duration::from_secs(30),
        || {
            let addr = addr.clone();
            async move {
                match tokio::net::TcpStream::connect(&addr).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;
    (server, format!("http://{addr}"))
}

async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// Regular files under `dir`, at any depth.
fn objects_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|entry| entry.unwrap().path())
        .map(|path| {
            if path.is_dir() {
                objects_under(&path)
            } else {
                1
            }
        })
        .sum()
}

/// A PDF of one page that draws nothing, padded with a comment in its
/// content to `size` bytes.
fn pdf_of(size: usize) -> Vec<u8> {
    let build = |padding: usize| {
        let content = format!("%{}\n", "x".repeat(padding));
        pdf_with(&[
            "<< /Type /Catalog /Pages 2 0 R >>".into(),
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".into(),
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] /Contents 4 0 R >>".into(),
            format!(
                "<< /Length {} >>\nstream\n{content}\nendstream",
                content.len()
            ),
        ])
    };
    let mut padding = 0;
    loop {
        let pdf = build(padding);
        match pdf.len().cmp(&size) {
            std::cmp::Ordering::Equal => return pdf,
            std::cmp::Ordering::Less => padding += size - pdf.len(),
            std::cmp::Ordering::Greater => padding -= 1,
        }
    }
}

/// A PDF of `objects`, numbered from 1, with its cross-reference table.
fn pdf_with(objects: &[String]) -> Vec<u8> {
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, body) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    let count = objects.len() + 1;
    out.extend_from_slice(format!("xref\n0 {count}\n0000000000 65535 f \n").as_bytes());
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    let trailer = format!("trailer\n<< /Size {count} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n");
    out.extend_from_slice(trailer.as_bytes());
    out
}

/// A PDF whose one stream inflates to `inflated` bytes (of spaces).
fn bomb(inflated: usize) -> Vec<u8> {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&vec![b' '; inflated]).unwrap();
    let deflated = z.finish().unwrap();
    let head = format!(
        "%PDF-1.4\n1 0 obj\n<< /Length {} /Filter /FlateDecode >>\nstream\n",
        deflated.len()
    );
    let mut pdf = head.into_bytes();
    pdf.extend_from_slice(&deflated);
    pdf.extend_from_slice(b"\nendstream\nendobj\n%%EOF\n");
    pdf
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_stored_once_per_tenant_and_seen_by_it_alone() {
    stored_once_per_tenant_and_seen_by_it_alone(Store::Dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_stored_once_per_tenant_in_an_s3_bucket() {
    stored_once_per_tenant_and_seen_by_it_alone(Store::S3).await;
}

async fn stored_once_per_tenant_and_seen_by_it_alone(store: Store) {
    let files = Files::start(store).await;
    let pdf = pdf_of(2_000);
    let sha = sha256_hex(&pdf);

    let (status, first) = files.upload(pdf.clone(), "application/pdf", None).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["id"], sha.as_str());
    assert_eq!(first["sha256"], sha.as_str());
    assert_eq!(first["size"], 2_000);
    assert_eq!(first["content_type"], "application/pdf");
    assert_eq!(files.stored().await, (1, 1));

    // The same bytes again, letting the bytes say what they are: the same file.
    let (status, again) = files
        .upload(pdf.clone(), "application/octet-stream", None)
        .await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    assert_eq!(files.stored().await, (1, 1));
    let (status, read) = files.read(&sha, None).await;
    assert_eq!((status, &read), (StatusCode::OK, &first));

    // Another tenant: not found, and its own upload of the same bytes is its own.
    let other = Some(files.other_key.as_str());
    let (status, body) = files.read(&sha, other).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, theirs) = files.upload(pdf, "application/pdf", other).await;
    assert_eq!(status, StatusCode::CREATED, "{theirs}");
    assert_eq!(theirs["id"], sha.as_str());
    assert_eq!(files.stored().await, (2, 2));

    // A name that is not an id, or walks out of the store: not found.
    for id in ["nope", "..%2F..%2Fetc%2Fpasswd", &sha.to_uppercase()] {
        let (status, _) = files.read(id, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_upload_gets_a_clear_4xx_and_stores_nothing() {
    let files = Files::start(Store::Dir).await;
    let png = png_header(1700, 2200);
    let refusals: [(&str, Vec<u8>, &str, StatusCode, &str); 9] = [
        (
            "a decompression bomb",
            bomb(4 * INFLATE_LIMIT),
            "application/pdf",
            StatusCode::UNPROCESSABLE_ENTITY,
            "inflate to more than 6291456 bytes",
        ),
        (
            "a damaged PDF",
            b"%PDF-1.4\n%not really\n".to_vec(),
            "application/pdf",
            StatusCode::UNPROCESSABLE_ENTITY,
            "the PDF cannot be read",
        ),
        (
            "empty",
            Vec::new(),
            "application/pdf",
            StatusCode::UNPROCESSABLE_ENTITY,
            "empty",
        ),
        (
            "over the limit",
            pdf_of(FILE_LIMIT + 1),
            "application/pdf",
            StatusCode::PAYLOAD_TOO_LARGE,
            "5242880",
        ),
        (
            "a zip",
            b"PK\x03\x04\x14\0\0\0".to_vec(),
            "application/octet-stream",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not a PDF",
        ),
        (
            "a PNG said to be a PDF",
            png.clone(),
            "application/pdf",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the bytes are image/png",
        ),
        (
            "a PDF said to be JSON",
            pdf_of(1_000),
            "application/json",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the bytes are application/pdf",
        ),
        (
            "a PNG bomb: 30,000 × 30,000 pixels in a few bytes",
            png_header(30_000, 30_000),
            "image/png",
            StatusCode::UNPROCESSABLE_ENTITY,
            "more than the limit of 50000000 pixels a page (DOCSTREAM_OCR_MAX_PIXELS)",
        ),
        (
            "a PNG cut short before its size",
            png[..18].to_vec(),
            "image/png",
            StatusCode::UNPROCESSABLE_ENTITY,
            "the image cannot be read",
        ),
    ];
    for (what, bytes, content_type, expected, says) in refusals {
        let (status, body) = files.upload(bytes, content_type, None).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, expected, "{what}: {body}");
        assert!(message.contains(says), "{what}: {message}");
        assert_eq!(files.stored().await, (0, 0), "{what}: nothing stored");
    }
    // Between the API's 4 MiB body limit and the file limit: taken.
    let (status, body) = files
        .upload(pdf_of(4_500_000), "application/pdf", None)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = files.upload(png, "image/png", None).await;
    assert_eq!(
        (status, body["content_type"].as_str()),
        (StatusCode::CREATED, Some("image/png"))
    );
    assert_eq!(files.stored().await, (2, 2));
}

/// The sample PDFs (`samples/files/`), each beside the request to submit
/// with it and the words its text layer holds.
const SAMPLES: [&str; 3] = ["invoice-northwind", "invoice-contoso", "receipt-bakery"];

/// A sample's PDF and its JSON.
fn sample(name: &str) -> (Vec<u8>, Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/files");
    let pdf = std::fs::read(dir.join(format!("{name}.pdf"))).unwrap();
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
    (pdf, serde_json::from_str(&json).unwrap())
}

impl Files {
    /// Submits `request` as the default tenant (or with `key`).
    async fn submit(&self, request: &Value, key: Option<&str>) -> (StatusCode, Value) {
        let mut post = self
            .env
            .client()
            .post(format!("{}/v1/extractions", self.base))
            .json(request);
        if let Some(key) = key {
            post = post.header("authorization", format!("Bearer {key}"));
        }
        answer(post.send().await.unwrap()).await
    }

    /// Job `id` once it is finished: failed, cancelled, or its bbox
    /// refinement finished.
    async fn finished(&self, id: &str) -> Value {
        let url = format!("{}/v1/extractions/{id}", self.base);
        let timeout = std::time::Duration::from_secs(60);
        common::jobs::finished(&self.env.client(), &url, timeout).await
    }
}

/// Every number of `got` within 0.01 of `want`'s, everything else equal.
fn assert_close(got: &Value, want: &Value, at: &str) {
    match (got, want) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() < 0.01, "{at}: {a} vs {b}");
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{at}");
            for (i, (a, b)) in a.iter().zip(b).enumerate() {
                assert_close(a, b, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(a), keys(b), "{at}");
            for (k, v) in a {
                assert_close(v, &b[k], &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(got, want, "{at}"),
    }
}

/// Upload → job → a worker reads the PDF from the S3 bucket → the rule
/// extractor's values → bbox refinement grounds them in the PDF's words,
/// at the places the sample drew them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_pdfs_in_an_s3_bucket_are_read_and_grounded_where_they_were_drawn() {
    let files = Files::start(Store::S3).await;
    let _workers = [
        files.env.spawn("worker", &[], "files-worker"),
        files.env.spawn("bbox-worker", &[], "files-bbox-worker"),
    ];
    let mut jobs = Vec::new();
    for name in SAMPLES {
        let (pdf, sample) = sample(name);
        let (status, file) = files.upload(pdf, "application/pdf", None).await;
        assert_eq!(status, StatusCode::CREATED, "{name}: {file}");
        let mut request = sample["request"].clone();
        request["document"] = serde_json::json!({"object": file["id"]});
        let (status, accepted) = files.submit(&request, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{name}: {accepted}");
        jobs.push((accepted["id"].as_str().unwrap().to_owned(), sample));
    }
    for (id, sample) in &jobs {
        let job = files.finished(id).await;
        let name = sample["name"].as_str().unwrap();
        assert_eq!(job["status"], "succeeded", "{name}: {job}");
        let bbox = &job["post_processing"]["bbox_refinement"];
        assert_eq!(bbox["status"], "succeeded", "{name}: {job}");
        // What the rule extractor finds in the words the sample drew, and
        // where they are.
        let mut drawn = sample["request"].clone();
        drawn["document"] = serde_json::json!({"pages": sample["pages"]});
        let drawn: docstream::domain::ExtractionRequest = serde_json::from_value(drawn).unwrap();
        let values = docstream::extract::rule_extract(&drawn).unwrap();
        let boxes = docstream::extract::ground(&drawn.document, &values, 0.8);
        assert_eq!(
            job["result"],
            serde_json::to_value(&values).unwrap(),
            "{name}"
        );
        let boxes = serde_json::to_value(&boxes).unwrap();
        assert_close(&bbox["result"], &boxes, name);
        let found = boxes["fields"].as_object().unwrap();
        assert!(
            found.values().filter(|f| !f.is_null()).count() >= 4,
            "{name}: most fields are found and boxed: {boxes}"
        );
    }
}

/// A job naming a file its tenant does not have (another tenant's, or
/// none) is refused 422 and nothing is written; a document naming a file
/// and words too is refused as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_naming_a_file_its_tenant_does_not_have_is_refused() {
    let files = Files::start(Store::Dir).await;
    let (pdf, sample) = sample(SAMPLES[0]);
    let (status, file) = files.upload(pdf, "application/pdf", None).await;
    assert_eq!(status, StatusCode::CREATED, "{file}");
    let id = file["id"].as_str().unwrap();
    let mut request = sample["request"].clone();
    let other = Some(files.other_key.as_str());
    let refusals = [
        (
            "another tenant's file",
            serde_json::json!({"object": id}),
            other,
            "no file",
        ),
        (
            "no such file",
            serde_json::json!({"object": "0".repeat(64)}),
            None,
            "no file",
        ),
        (
            "not a file id",
            serde_json::json!({"object": "../x"}),
            None,
            "file id",
        ),
        (
            "a file and text",
            serde_json::json!({"object": id, "text": "x"}),
            None,
            "exactly one",
        ),
    ];
    for (what, document, key, says) in refusals {
        request["document"] = document;
        let (status, body) = files.submit(&request, key).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{what}: {message}");
    }
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM extractions")
        .fetch_one(&files.env.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 0, "nothing was written");
}

/// A `multipart/form-data` body of `parts`: (name, content type, bytes).
fn multipart(parts: &[(&str, &str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "docstream-test-boundary-7d1f";
    let mut body = Vec::new();
    for (name, content_type, bytes) in parts {
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: {content_type}\r\n\r\n"
        );
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A submit as `multipart/form-data` stores the file and makes the job on
/// it; the same key with the same file is the same job, with another file
/// a refusal. A refused request part stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_submit_stores_the_file_and_makes_its_job_once() {
    let files = Files::start(Store::Dir).await;
    let (pdf, receipt) = sample(SAMPLES[2]);
    let request = serde_json::to_vec(&receipt["request"]).unwrap();
    let post = |parts: Vec<(&'static str, &'static str, Vec<u8>)>, key: &'static str| {
        let parts: Vec<(&str, &str, &[u8])> = parts
            .iter()
            .map(|(n, t, b)| (*n, *t, b.as_slice()))
            .collect();
        let (content_type, body) = multipart(&parts);
        let sent = files
            .env
            .client()
            .post(format!("{}/v1/extractions", files.base))
            .header("content-type", content_type)
            .header("idempotency-key", key)
            .body(body)
            .send();
        async move { answer(sent.await.unwrap()).await }
    };
    let with_pdf = vec![
        ("request", "application/json", request.clone()),
        ("file", "application/pdf", pdf.clone()),
    ];
    let (status, first) = post(with_pdf.clone(), "receipt-1").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let (status, again) = post(with_pdf, "receipt-1").await;
    assert_eq!((status, &again["id"]), (StatusCode::ACCEPTED, &first["id"]));
    let id = first["id"].as_str().unwrap();
    let job: Value = files
        .env
        .client()
        .get(format!(
            "{}/v1/extractions/{id}?include=request",
            files.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        job["request"]["document"]["object"],
        sha256_hex(&pdf).as_str()
    );
    assert_eq!(files.stored().await, (1, 1));

    let (northwind, _) = sample(SAMPLES[0]);
    let another_file = vec![
        ("request", "application/json", request.clone()),
        ("file", "application/pdf", northwind),
    ];
    let (status, body) = post(another_file, "receipt-1").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let stored = files.stored().await;
    let bad_request = vec![
        ("request", "application/json", br#"{"fields": []}"#.to_vec()),
        ("file", "application/pdf", pdf_of(2_000)),
    ];
    let (status, body) = post(bad_request, "receipt-2").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let with_document = vec![
        (
            "request",
            "application/json",
            br#"{"document": {"text": "x"}, "fields": [{"name": "a", "pattern": "x"}]}"#.to_vec(),
        ),
        ("file", "application/pdf", pdf_of(2_000)),
    ];
    let (status, body) = post(with_document, "receipt-3").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let no_file = vec![("request", "application/json", request.clone())];
    let (status, body) = post(no_file, "receipt-4").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let lying = vec![
        ("request", "application/json", request),
        ("file", "image/png", pdf_of(2_000)),
    ];
    let (status, body) = post(lying, "receipt-5").await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    assert_eq!(
        files.stored().await,
        stored,
        "no refused submit stored its file"
    );
}

/// A one-route HTTP server on loopback answering `GET /<name>` from
/// `routes` (status, body); its base URL.
async fn file_server(routes: Vec<(&'static str, u16, Vec<u8>)>) -> String {
    use axum::http::StatusCode as Status;
    let mut router = axum::Router::new();
    for (name, status, body) in routes {
        let answer = move || async move {
            let status = Status::from_u16(status).unwrap();
            let location = [("location", "http://127.0.0.1:1/elsewhere.pdf")];
            (status, location, body)
        };
        router = router.route(&format!("/{name}"), axum::routing::get(answer));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

/// A `document.url` is fetched through the SSRF guard: refused where
/// webhooks may not go, and past it stored as a file the job names and the
/// worker reads; a redirect, an error answer, a body past the file limit
/// and an unreadable PDF are each a clear 4xx with nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_url_is_fetched_through_the_ssrf_guard() {
    let (pdf, receipt) = sample(SAMPLES[2]);
    let server = file_server(vec![
        ("receipt.pdf", 200, pdf.clone()),
        ("moved.pdf", 302, Vec::new()),
        ("missing.pdf", 404, Vec::new()),
        ("huge.pdf", 200, pdf_of(FILE_LIMIT + 10)),
        ("damaged.pdf", 200, b"%PDF-1.4\n%damaged\n".to_vec()),
    ])
    .await;
    let mut request = receipt["request"].clone();

    // Without an allow-list, loopback is where webhooks may not go.
    let guarded = Files::start(Store::Dir).await;
    request["document"] = serde_json::json!({"url": format!("{server}/receipt.pdf")});
    let (status, body) = guarded.submit(&request, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("is not a host the server may reach"),
        "{message}"
    );
    assert_eq!(guarded.stored().await, (0, 0));
    drop(guarded);

    let files = Files::start_with(Store::Dir, |s| {
        s.file_fetch_allow = "127.0.0.1".parse().unwrap();
    })
    .await;
    let _workers = [
        files.env.spawn("worker", &[], "files-url-worker"),
        files.env.spawn("bbox-worker", &[], "files-url-bbox-worker"),
    ];
    let refusals = [
        (
            "moved.pdf",
            StatusCode::UNPROCESSABLE_ENTITY,
            "redirects are not followed",
        ),
        (
            "missing.pdf",
            StatusCode::UNPROCESSABLE_ENTITY,
            "answered 404",
        ),
        ("huge.pdf", StatusCode::PAYLOAD_TOO_LARGE, "5242880"),
        (
            "damaged.pdf",
            StatusCode::UNPROCESSABLE_ENTITY,
            "the PDF cannot be read",
        ),
    ];
    for (name, expected, says) in refusals {
        request["document"] = serde_json::json!({"url": format!("{server}/{name}")});
        let (status, body) = files.submit(&request, None).await;
        assert_eq!(status, expected, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{name}: {message}");
        assert_eq!(files.stored().await, (0, 0), "{name}: nothing stored");
    }

    request["document"] = serde_json::json!({"url": format!("{server}/receipt.pdf")});
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(files.stored().await, (1, 1));
    let job = files.finished(accepted["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["result"]["fields"]["total"]["value"], "8.60", "{job}");
    assert_eq!(
        job["post_processing"]["bbox_refinement"]["status"],
        "succeeded"
    );
}

/// Allowing webhooks to reach an address does not let a `document.url`
/// read from it: what the server fetched would come back in the job's
/// results. The allow-list of webhooks is theirs alone, and document URLs
/// have their own (`DOCSTREAM_FILE_FETCH_ALLOW`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_allow_list_does_not_open_document_urls() {
    let (pdf, receipt) = sample(SAMPLES[2]);
    let server = file_server(vec![("receipt.pdf", 200, pdf)]).await;
    let mut request = receipt["request"].clone();
    request["document"] = serde_json::json!({"url": format!("{server}/receipt.pdf")});
    let files = Files::start_with(Store::Dir, |s| {
        s.webhook_allow = "127.0.0.1".parse().unwrap();
    })
    .await;
    let (status, body) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(files.stored().await, (0, 0), "nothing fetched or stored");
    drop(files);

    let files = Files::start_with(Store::Dir, |s| {
        s.file_fetch_allow = "127.0.0.1".parse().unwrap();
    })
    .await;
    let (status, body) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(files.stored().await, (1, 1));
}

/// The secret that signs file URLs (and deferred results) in the tests.
const SECRET: &str = "a-callback-secret-for-the-file-tests";

/// The reference provider (`extractor-serve`, protocol version 2) in this
/// process: its URL, and a guard that stops it.
async fn reference_provider() -> (String, tokio_util::sync::DropGuard) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let args = docstream::provider::ProviderArgs {
        addr: listener.local_addr().unwrap(),
        latency_ms: 0,
        token: None,
        ocr_tesseract: "tesseract".into(),
        ocr_languages: "eng".into(),
    };
    let url = format!("http://{}{}", args.addr, docstream::provider::PATH);
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = stop.clone();
    tokio::spawn(async move { docstream::provider::serve(listener, &args, serving).await });
    (url, stop.drop_guard())
}

/// Protocol version 2, end to end: the worker gives the reference provider
/// a URL to the job's file (signed by `serve` for the folder store,
/// presigned by the bucket for S3); the provider fetches it, reads the
/// PDF and answers the values and the words it read; bbox refinement
/// grounds the values in those words at the places the sample drew them.
/// An extractor of version 1 is refused a file at the submit.
async fn protocol_2_reads_a_file_through_its_url(store: Store, provider: &str, rules_values: bool) {
    let provider = provider.to_owned();
    let files = Files::start_with(store, |s| {
        let v2 = docstream::config::ExtractorSettings {
            url: provider.clone(),
            protocol: 2,
            ..Default::default()
        };
        let v1 = docstream::config::ExtractorSettings {
            url: provider.clone(),
            ..Default::default()
        };
        s.extractors.insert("reference".into(), v2);
        s.extractors.insert("json-only".into(), v1);
        // serve verifies with the secret; the workers get its address below.
        s.public_url = "http://127.0.0.1:9".into();
        s.callback_secret = SECRET.into();
    })
    .await;
    let public_url = [("DOCSTREAM_PUBLIC_URL", files.base.clone())];
    let _workers = [
        files.env.spawn(
            "worker",
            &public_url,
            &format!("files-v2-worker-{}", store as u8),
        ),
        files.env.spawn(
            "bbox-worker",
            &[],
            &format!("files-v2-bbox-{}", store as u8),
        ),
    ];
    let (pdf, invoice) = sample(SAMPLES[0]);
    let (status, file) = files.upload(pdf, "application/pdf", None).await;
    assert_eq!(status, StatusCode::CREATED, "{file}");
    let mut request = invoice["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});

    request["extractor"] = "json-only".into();
    let (status, body) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("protocol version 1"), "{message}");

    request["extractor"] = "reference".into();
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let job = files.finished(accepted["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let bbox = &job["post_processing"]["bbox_refinement"];
    assert_eq!(bbox["status"], "succeeded", "{job}");
    let mut drawn = invoice["request"].clone();
    drawn["document"] = serde_json::json!({"pages": invoice["pages"]});
    let drawn: docstream::domain::ExtractionRequest = serde_json::from_value(drawn).unwrap();
    // Whatever the provider found, its boxes are those of the words the
    // sample drew; the reference provider finds what the rules do.
    let values: docstream::extract::ExtractionOutput =
        serde_json::from_value(job["result"].clone()).unwrap();
    if rules_values {
        let rules = docstream::extract::rule_extract(&drawn).unwrap();
        assert_eq!(values, rules);
    }
    let boxes =
        serde_json::to_value(docstream::extract::ground(&drawn.document, &values, 0.8)).unwrap();
    assert_close(&bbox["result"], &boxes, "invoice-northwind via protocol 2");
    let boxed = boxes["fields"]
        .as_object()
        .unwrap()
        .values()
        .filter(|f| !f.is_null());
    assert!(boxed.count() >= 5, "the values have boxes: {boxes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_2_reads_a_file_through_a_url_signed_by_serve() {
    let (provider, _provider) = reference_provider().await;
    protocol_2_reads_a_file_through_its_url(Store::Dir, &provider, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_2_reads_a_file_through_a_url_presigned_by_the_bucket() {
    let (provider, _provider) = reference_provider().await;
    protocol_2_reads_a_file_through_its_url(Store::S3, &provider, true).await;
}

/// The Python example provider, reading the PDF's text layer with pypdf
/// (which `scripts/test.sh` installs; `DOCSTREAM_TEST_PYPDF_PYTHON` names
/// the python that has it), answers the words at the places the sample
/// drew them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_2_through_the_python_example_provider() {
    let python = std::env::var("DOCSTREAM_TEST_PYPDF_PYTHON").expect(
        "DOCSTREAM_TEST_PYPDF_PYTHON names a python with pypdf: run scripts/test.sh, which installs it",
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/extractor-provider/provider.py"
    );
    let mut command = tokio::process::Command::new(python);
    command.args([script, "--port", "0"]).kill_on_drop(true);
    let (_python, provider) = common::start_provider(command).await;
    protocol_2_reads_a_file_through_its_url(Store::Dir, &provider, false).await;
}

/// `serve` answers a job's file to a URL signed for that job's running
/// attempt, and to no other: not past its expiry, not for another job, not with its
/// signature changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_file_url_opens_its_own_job_until_it_expires() {
    let files = Files::start_with(Store::Dir, |s| {
        s.public_url = "http://127.0.0.1:9".into();
        s.callback_secret = SECRET.into();
    })
    .await;
    let (pdf, invoice) = sample(SAMPLES[0]);
    let (_, file) = files.upload(pdf.clone(), "application/pdf", None).await;
    let mut request = invoice["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});
    let mut jobs = Vec::new();
    for _ in 0..2 {
        let (status, accepted) = files.submit(&request, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
        jobs.push(
            accepted["id"]
                .as_str()
                .unwrap()
                .parse::<uuid::Uuid>()
                .unwrap(),
        );
    }
    // Its first attempt runs: the URL is that attempt's.
    let pool = &files.env.pool;
    let stage = docstream::domain::Stage::Extraction;
    let claim = docstream::store::transitions::claim(pool, stage, jobs[0], 30.0).await;
    assert_eq!(claim.unwrap().expect("the first claim").token, 1);
    let now = chrono::Utc::now().timestamp();
    let url = |id, expires| docstream::files::signed::url(&files.base, SECRET, id, 1, expires);
    let get = |url: String| {
        let sent = files.env.client().get(url).send();
        async move { sent.await.unwrap() }
    };

    let valid = get(url(jobs[0], now + 60)).await;
    assert_eq!(valid.status(), StatusCode::OK);
    assert_eq!(valid.headers()["content-type"], "application/pdf");
    assert_eq!(valid.bytes().await.unwrap().as_ref(), pdf.as_slice());

    let expired = get(url(jobs[0], now - 1)).await;
    assert_eq!(expired.status(), StatusCode::FORBIDDEN);
    assert!(expired.text().await.unwrap().contains("expired"));
    let another_job = url(jobs[0], now + 60).replace(&jobs[0].to_string(), &jobs[1].to_string());
    let another_job = get(another_job).await;
    assert_eq!(another_job.status(), StatusCode::FORBIDDEN);
    assert!(another_job
        .text()
        .await
        .unwrap()
        .contains("not signed for this job"));
    let later = url(jobs[0], now + 60).replace(
        &format!("expires={}", now + 60),
        &format!("expires={}", now + 6000),
    );
    assert_eq!(get(later).await.status(), StatusCode::FORBIDDEN);
    let unsigned = format!("{}/v1/extractions/{}/file", files.base, jobs[0]);
    assert_eq!(get(unsigned).await.status(), StatusCode::FORBIDDEN);
}

/// A file no job names is deleted once its grace has passed, rows and
/// bytes; one a job names is kept while the job is, and goes with the
/// job's content when the job is erased. Past its quota, a tenant's upload of new bytes gets 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_no_job_names_are_collected_and_a_tenant_keeps_its_quota() {
    let files = Files::start_with(Store::Dir, |s| s.tenant_max_file_bytes = 5_000).await;
    let services = files.env.services().await;
    let (unnamed, named) = (pdf_of(1_000), pdf_of(1_001));
    for pdf in [&unnamed, &named] {
        let (status, body) = files.upload(pdf.clone(), "application/pdf", None).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (_, invoice) = sample(SAMPLES[0]);
    let mut request = invoice["request"].clone();
    request["document"] = serde_json::json!({"object": sha256_hex(&named)});
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();

    // Past its quota: new bytes are refused, the same bytes again are not.
    let (status, body) = files.upload(pdf_of(3_500), "application/pdf", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("quota of 5000 bytes"), "{message}");
    let (status, _) = files.upload(named.clone(), "application/pdf", None).await;
    assert_eq!(status, StatusCode::OK);
    let by_tenant = docstream::store::files::by_tenant(&files.env.pool)
        .await
        .unwrap();
    let kept: Vec<(i64, i64)> = by_tenant.iter().map(|(_, n, bytes)| (*n, *bytes)).collect();
    assert_eq!(
        kept,
        [(2, 2_001)],
        "the census's files and bytes of the tenant"
    );

    // Within the grace nothing goes; past it, the file no job names does.
    let day = std::time::Duration::from_secs(86_400);
    assert_eq!(services.files.collect(day, 100).await.unwrap(), 0);
    assert_eq!(files.stored().await, (2, 2));
    let now = std::time::Duration::ZERO;
    assert_eq!(services.files.collect(now, 100).await.unwrap(), 1);
    assert_eq!(files.stored().await, (1, 1));
    let (status, _) = files.read(&sha256_hex(&unnamed), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The job's file goes once the job is erased.
    let client = files.env.client();
    let cancelled = client
        .post(format!("{}/v1/extractions/{id}/cancel", files.base))
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success(), "{}", cancelled.status());
    let created = files
        .env
        .run_cli(&["keys", "create", "default", "--scopes", "read,delete"])
        .await;
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    let deleter = created["api_key"].as_str().unwrap();
    let erased = client
        .delete(format!("{}/v1/extractions/{id}", files.base))
        .header("authorization", format!("Bearer {deleter}"))
        .send()
        .await
        .unwrap();
    assert!(erased.status().is_success(), "{}", erased.status());
    assert_eq!(
        files.stored().await,
        (0, 0),
        "the erased job's file, at once"
    );
    assert_eq!(services.files.collect(now, 100).await.unwrap(), 0);
    let (status, body) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

/// A file URL opens its job's file only while the attempt it was signed
/// for holds the job: once that attempt failed it answers 410, and after a
/// retry only the new attempt's URL opens the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_file_url_closes_when_its_attempt_ends() {
    use docstream::domain::Stage;
    use docstream::store::transitions;
    let files = Files::start_with(Store::Dir, |s| {
        s.public_url = "http://127.0.0.1:9".into();
        s.callback_secret = SECRET.into();
    })
    .await;
    let pool = &files.env.pool;
    let (pdf, invoice) = sample(SAMPLES[0]);
    let (_, file) = files.upload(pdf, "application/pdf", None).await;
    let mut request = invoice["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id: uuid::Uuid = accepted["id"].as_str().unwrap().parse().unwrap();
    let expires = chrono::Utc::now().timestamp() + 600;
    let url = |attempt| docstream::files::signed::url(&files.base, SECRET, id, attempt, expires);
    let get = |url: String| {
        let sent = files.env.client().get(url).send();
        async move { sent.await.unwrap().status() }
    };

    let first = transitions::claim(pool, Stage::Extraction, id, 30.0)
        .await
        .unwrap()
        .expect("the first claim");
    assert_eq!(get(url(first.token)).await, StatusCode::OK, "while it runs");
    transitions::fail(pool, Stage::Extraction, id, first.token, "provider down")
        .await
        .unwrap()
        .expect("the attempt failed");
    assert_eq!(
        get(url(first.token)).await,
        StatusCode::GONE,
        "once it failed"
    );

    let retried = files
        .env
        .client()
        .post(format!("{}/v1/extractions/{id}/retry", files.base))
        .send()
        .await
        .unwrap();
    assert!(retried.status().is_success(), "{}", retried.status());
    let second = transitions::claim(pool, Stage::Extraction, id, 30.0)
        .await
        .unwrap()
        .expect("the second claim");
    assert_ne!(second.token, first.token);
    assert_eq!(get(url(second.token)).await, StatusCode::OK);
    assert_eq!(
        get(url(first.token)).await,
        StatusCode::GONE,
        "the first attempt's URL, while the second runs"
    );
}

/// An upload whose row the database refused leaves its bytes in the store
/// with no row (no file a job can name): the collection deletes them once
/// the grace has passed, as it deletes a file no job names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_whose_row_was_never_written_are_collected() {
    let files = Files::start(Store::Dir).await;
    let services = files.env.services().await;
    let pool = &files.env.pool;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_files() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN RAISE EXCEPTION 'the test refuses file rows'; END $$;
         CREATE TRIGGER refuse_files BEFORE INSERT ON files
             FOR EACH ROW EXECUTE FUNCTION refuse_files();",
    )
    .execute(pool)
    .await
    .unwrap();
    let (status, body) = files.upload(pdf_of(1_000), "application/pdf", None).await;
    assert!(status.is_server_error(), "{status}: {body}");
    assert_eq!(files.stored().await, (0, 1), "the bytes, without their row");
    sqlx::raw_sql("DROP TRIGGER refuse_files ON files")
        .execute(pool)
        .await
        .unwrap();

    let day = std::time::Duration::from_secs(86_400);
    services.files.collect(day, 100).await.unwrap();
    assert_eq!(files.stored().await, (0, 1), "within the grace, kept");
    services
        .files
        .collect(std::time::Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(files.stored().await, (0, 0), "past it, collected");
    let (status, body) = files.upload(pdf_of(1_000), "application/pdf", None).await;
    assert_eq!(status, StatusCode::CREATED, "the same bytes again: {body}");
    assert_eq!(files.stored().await, (1, 1));
}

/// Files and bytes the default tenant's rows hold.
async fn stored_bytes(files: &Files) -> i64 {
    let sql = "SELECT COALESCE(sum(size), 0)::int8 FROM files";
    sqlx::query_scalar(sql)
        .fetch_one(&files.env.pool)
        .await
        .unwrap()
}

/// Uploads sent at once cannot pass the quota together: 24 files of
/// 1,000 bytes or so against a quota of 5,000 leave at most 5,000 bytes
/// stored, the others refused 429 with their bytes gone from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_uploads_never_store_more_than_the_quota() {
    let files = Files::start_with(Store::Dir, |s| {
        s.tenant_max_file_bytes = 5_000;
        s.tenant_max_uploads = 64;
    })
    .await;
    let sent = (0..24).map(|i| files.upload(pdf_of(1_000 + i), "application/pdf", None));
    let answers = futures::future::join_all(sent).await;
    let mut statuses: Vec<u16> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    statuses.sort();
    let stored = stored_bytes(&files).await;
    let (rows, objects) = files.stored().await;
    eprintln!("files quota: {rows} files stored, {stored} bytes; answers {statuses:?}");
    assert!(
        stored <= 5_000,
        "{stored} bytes stored past a quota of 5000"
    );
    let made = statuses.iter().filter(|s| **s == 201).count() as i64;
    assert_eq!(made, rows, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| matches!(s, 201 | 429)),
        "{statuses:?}"
    );
    assert_eq!(
        objects as i64, rows,
        "no refused upload's bytes stay in the store"
    );
}

/// A text file is held to the word limit of a text document
/// (`DOCSTREAM_MAX_TEXT_WORDS`), uploaded or read: one past it is refused
/// 422, as the same text in a JSON request is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_file_past_the_word_limit_is_refused() {
    let files = Files::start_with(Store::Dir, |s| s.max_text_words = 10).await;
    let words = |n: usize| vec!["word"; n].join(" ").into_bytes();
    let (status, body) = files.upload(words(10), "text/plain", None).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = files.upload(words(11), "text/plain", None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("DOCSTREAM_MAX_TEXT_WORDS"), "{message}");
    assert_eq!(files.stored().await, (1, 1));
}

/// The document a job keeps of its file (`extraction_documents`) is the
/// tenant's storage too: with it, an upload that the files alone would
/// leave within the quota is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_kept_document_counts_against_its_tenants_quota() {
    let files = Files::start_with(Store::Dir, |s| s.tenant_max_file_bytes = 20_000).await;
    let text = b"Invoice number: INV-1".to_vec();
    let (status, file) = files.upload(text.clone(), "text/plain", None).await;
    assert_eq!(status, StatusCode::CREATED, "{file}");
    let request = serde_json::json!({
        "document": {"object": sha256_hex(&text)},
        "fields": [{"name": "number", "pattern": "INV-\\d+"}],
    });
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id: uuid::Uuid = accepted["id"].as_str().unwrap().parse().unwrap();
    let pool = &files.env.pool;
    let stage = docstream::domain::Stage::Extraction;
    let claim = docstream::store::transitions::claim(pool, stage, id, 30.0)
        .await
        .unwrap()
        .expect("the job claimed");
    // What a worker keeps of a file it read: some 15,000 bytes here.
    let document = docstream::domain::Document {
        text: Some("word ".repeat(3_000)),
        ..Default::default()
    };
    let kept = docstream::store::documents::keep(pool, (id, claim.token), &document);
    assert!(kept.await.unwrap());

    let (status, body) = files.upload(pdf_of(6_000), "application/pdf", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("quota of 20000 bytes"), "{message}");
    let (status, body) = files.upload(pdf_of(3_000), "application/pdf", None).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Each job on the file keeps a document of its own, counted each time:
    // at the quota, another job on a file is refused, and one on JSON is not.
    let document = docstream::domain::Document {
        text: Some("word ".repeat(4_000)),
        ..Default::default()
    };
    let filler = docstream::store::documents::keep(pool, (id, claim.token), &document);
    assert!(filler.await.unwrap());
    let stored =
        docstream::store::files::stored_bytes(pool, docstream::store::tenants::DEFAULT_TENANT_ID);
    let stored = stored.await.unwrap();
    assert!(stored >= 20_000, "{stored}");
    // The submit path sums a tenant's bytes at most every few seconds: the
    // same request, under one key (so at most one more job), until it is
    // refused.
    let url = format!("{}/v1/extractions", files.base);
    let body = common::wait_for(
        "a job on the file refused",
        std::time::Duration::from_secs(30),
        || {
            let post = (files.env.client().post(&url))
                .header("idempotency-key", "past-the-quota")
                .json(&request)
                .send();
            async move {
                let (status, body) = answer(post.await.unwrap()).await;
                match status {
                    StatusCode::TOO_MANY_REQUESTS => Ok(body),
                    _ => Err(format!("{status}: {body}")),
                }
            }
        },
    )
    .await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("one for each job"), "{message}");
    let json = serde_json::json!({
        "document": {"text": "Invoice number: INV-2"},
        "fields": [{"name": "number", "pattern": "INV-\\d+"}],
    });
    let (status, body) = files.submit(&json, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

/// A multipart submit's `request` part is read only up to the API's body
/// limit: one past it is answered 413 as soon as the byte past the limit
/// arrives, though the rest of the body never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_part_past_the_body_limit_is_refused_as_it_arrives() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limit = 64 * 1024;
    let files = Files::start_with(Store::Dir, |s| s.http_body_limit_bytes = limit).await;
    let addr = files.base.trim_start_matches("http://").to_owned();
    let boundary = "docstream-part-limit";
    let opening = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"request\"\r\n\
         content-type: application/json\r\n\r\n"
    );
    let head = format!(
        "POST /v1/extractions HTTP/1.1\r\nhost: docstream\r\nauthorization: Bearer {}\r\n\
         content-type: multipart/form-data; boundary={boundary}\r\ncontent-length: {}\r\n\r\n",
        files.env.api_key,
        4 * 1024 * 1024
    );
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(opening.as_bytes()).await.unwrap();
    socket.write_all(&vec![b' '; limit + 1]).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), socket.read(&mut answer));
    let n = read
        .await
        .expect("an answer within 10 s, the rest of the body unsent")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// A PDF whose one stream inflates to `inflated` zeros through two Flate
/// layers: the check once measured only the outer one.
fn chained_bomb(inflated: usize) -> Vec<u8> {
    use std::io::Write;
    let mut inner = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![0u8; 1 << 20];
    for _ in 0..inflated / block.len() {
        inner.write_all(&block).unwrap();
    }
    let mut outer = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    outer.write_all(&inner.finish().unwrap()).unwrap();
    let data = outer.finish().unwrap();
    let head = format!(
        "%PDF-1.4\n1 0 obj\n<< /Length {} /Filter [/FlateDecode /FlateDecode] >>\nstream\n",
        data.len()
    );
    let mut pdf = head.into_bytes();
    pdf.extend_from_slice(&data);
    pdf.extend_from_slice(b"\nendstream\nendobj\n%%EOF\n");
    pdf
}

/// A PDF of one page whose content is `0 ` repeated `n` times: small
/// compressed, within the inflate cap, and millions of objects parsed.
fn zeros_page(n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&b"0 ".repeat(n)).unwrap();
    let data = z.finish().unwrap();
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    let stream = {
        let mut s = format!(
            "<< /Length {} /Filter /FlateDecode >>\nstream\n",
            data.len()
        )
        .into_bytes();
        s.extend_from_slice(&data);
        s.extend_from_slice(b"\nendstream");
        s
    };
    let objects: [&[u8]; 4] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] /Contents 4 0 R >>",
        &stream,
    ];
    for (i, body) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        pdf.extend_from_slice(body);
        pdf.extend_from_slice(b"\nendobj\n");
    }
    let xref = pdf.len();
    pdf.extend_from_slice(b"xref\n0 5\n0000000000 65535 f \n");
    for offset in offsets {
        pdf.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    let trailer = format!("trailer\n<< /Size 5 /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n");
    pdf.extend_from_slice(trailer.as_bytes());
    pdf
}

/// A bomb behind a filter chain, and content of millions of operands
/// within the inflate cap, are refused at the upload, naming the limit
/// each is past, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_past_the_old_check_are_refused_at_the_upload_naming_their_limit() {
    let files = Files::start_with(Store::Dir, |s| s.file_max_content_objects = 100_000).await;
    let refusals = [
        (
            "a bomb of two flate layers",
            chained_bomb(64 << 20),
            "inflate to more than 6291456 bytes (DOCSTREAM_FILE_MAX_INFLATED_BYTES)",
        ),
        (
            "two million operands",
            zeros_page(2_000_000),
            "more than 100000 operators and operands (DOCSTREAM_FILE_MAX_CONTENT_OBJECTS)",
        ),
    ];
    for (what, pdf, says) in refusals {
        assert!(pdf.len() < 1 << 20, "{what}: a small upload");
        let (status, body) = files.upload(pdf, "application/pdf", None).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
        assert!(message.contains(says), "{what}: {message}");
        assert_eq!(files.stored().await, (0, 0), "{what}: nothing stored");
    }
}

/// A worker reads a PDF's words in a process it kills at the deadline: a
/// read that never ends fails its job for good, naming the limit, and the
/// worker's one CPU slot serves the next job at once. The reader here is
/// docstream behind a script that, for a file marked so, never answers
/// (as a parse that runs on would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdf_read_past_its_deadline_fails_for_good_and_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dir.path().join("reader.sh");
    let script = format!(
        "#!/bin/sh\n\
         input=$(mktemp)\n\
         cat > \"$input\"\n\
         if grep -q NEVER-ENDS \"$input\"; then rm -f \"$input\"; exec sleep 600; fi\n\
         exec 3< \"$input\"\n\
         rm -f \"$input\"\n\
         exec '{}' \"$@\" <&3 3<&-\n",
        env!("CARGO_BIN_EXE_docstream")
    );
    std::fs::write(&reader, script).unwrap();
    std::fs::set_permissions(&reader, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let program = reader.display().to_string();
    let files = Files::start_with(Store::Dir, |s| {
        s.pdf_reader = program;
        s.extraction_deadline_s = common::secs(1.0);
        s.extraction_threads = 1;
    })
    .await;
    let _workers = [
        files.env.spawn("worker", &[], "files-deadline-worker"),
        files
            .env
            .spawn("bbox-worker", &[], "files-deadline-bbox-worker"),
    ];
    let (pdf, sample) = sample(SAMPLES[0]);
    let mut stuck = pdf.clone();
    stuck.extend_from_slice(b"%NEVER-ENDS\n");
    let mut jobs = Vec::new();
    for bytes in [stuck, pdf] {
        let (status, file) = files.upload(bytes, "application/pdf", None).await;
        assert_eq!(status, StatusCode::CREATED, "{file}");
        let mut request = sample["request"].clone();
        request["document"] = serde_json::json!({"object": file["id"]});
        let (status, accepted) = files.submit(&request, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
        jobs.push(accepted["id"].as_str().unwrap().to_owned());
    }
    let job = files.finished(&jobs[0]).await;
    assert_eq!(job["status"], "failed", "{job}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.contains("DOCSTREAM_EXTRACTION_DEADLINE_S"), "{error}");
    assert_eq!(
        job["attempts"], 1,
        "a read past its deadline is not retried"
    );
    // The one slot was given back: the next file's read got it and ended.
    let job = files.finished(&jobs[1]).await;
    assert_eq!(job["status"], "succeeded", "{job}");
}

/// A PNG's first bytes, declaring `width` × `height` pixels: an upload is
/// checked from its headers alone.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    png.extend(width.to_be_bytes());
    png.extend(height.to_be_bytes());
    png.extend([8, 0, 0, 0, 0]);
    png
}

/// `pdf` with its page turned 90° clockwise, as a page scanned on its side
/// (poppler reads past the offsets this moves).
fn turned(pdf: &[u8]) -> Vec<u8> {
    let at = pdf
        .windows(19)
        .position(|w| w == b"/Type /Page /Parent")
        .unwrap();
    let mut bytes = pdf[..at].to_vec();
    bytes.extend_from_slice(b"/Type /Page /Rotate 90 /Parent");
    bytes.extend_from_slice(&pdf[at + 19..]);
    bytes
}

/// A PDF whose one page, `size` points, is the JPEG `jpeg` of `pixels`:
/// a scanned page, without a text layer.
fn image_pdf(jpeg: &[u8], pixels: (u32, u32), size: (f64, f64)) -> Vec<u8> {
    let (width, height) = size;
    let draw = format!("q {width} 0 0 {height} 0 0 cm /Im0 Do Q");
    let objects: [Vec<u8>; 5] = [
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
        format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] /Resources << /XObject << /Im0 4 0 R >> >> /Contents 5 0 R >>").into_bytes(),
        [
            format!("<< /Type /XObject /Subtype /Image /Width {} /Height {} /ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter /DCTDecode /Length {} >>\nstream\n", pixels.0, pixels.1, jpeg.len()).into_bytes(),
            jpeg.to_vec(),
            b"\nendstream".to_vec(),
        ]
        .concat(),
        format!("<< /Length {} >>\nstream\n{draw}\nendstream", draw.len()).into_bytes(),
    ];
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend(format!("{} 0 obj\n", i + 1).into_bytes());
        pdf.extend(object);
        pdf.extend(b"\nendobj\n");
    }
    let xref = pdf.len();
    pdf.extend(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).into_bytes());
    for offset in offsets {
        pdf.extend(format!("{offset:010} 00000 n \n").into_bytes());
    }
    let trailer = format!(
        "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
        objects.len() + 1
    );
    pdf.extend(trailer.into_bytes());
    pdf
}

/// A TIFF of the grey pages `pgms` (as [`render`] gives them), each an
/// uncompressed page of its own directory.
fn tiff_of(pgms: &[Vec<u8>]) -> Vec<u8> {
    let mut tiff = b"II*\0\0\0\0\0".to_vec();
    let mut next_at = 4;
    for pgm in pgms {
        // "P5\n<width> <height>\n255\n" and the pixels.
        let mut fields = pgm.splitn(5, |b| b.is_ascii_whitespace());
        let _magic = fields.next();
        let mut number = || -> u32 {
            let field = fields.next().unwrap();
            std::str::from_utf8(field).unwrap().parse().unwrap()
        };
        let (width, height, _max) = (number(), number(), number());
        let pixels = &pgm[pgm.len() - (width * height) as usize..];
        let data_at = tiff.len() as u32;
        tiff.extend_from_slice(pixels);
        if tiff.len() % 2 == 1 {
            tiff.push(0);
        }
        let ifd_at = tiff.len() as u32;
        tiff[next_at..next_at + 4].copy_from_slice(&ifd_at.to_le_bytes());
        // (tag, type: 3 SHORT or 4 LONG, value), in tag order.
        let entries: [(u16, u16, u32); 9] = [
            (256, 4, width),
            (257, 4, height),
            (258, 3, 8),
            (259, 3, 1),
            (262, 3, 1),
            (273, 4, data_at),
            (277, 3, 1),
            (278, 4, height),
            (279, 4, width * height),
        ];
        tiff.extend((entries.len() as u16).to_le_bytes());
        for (tag, kind, value) in entries {
            tiff.extend(tag.to_le_bytes());
            tiff.extend(kind.to_le_bytes());
            tiff.extend(1u32.to_le_bytes());
            match kind {
                3 => tiff.extend([(value as u16).to_le_bytes().as_slice(), &[0, 0]].concat()),
                _ => tiff.extend(value.to_le_bytes()),
            }
        }
        next_at = tiff.len();
        tiff.extend(0u32.to_le_bytes());
    }
    tiff
}

/// What the rule extractor finds in the words sample `sample` drew, and
/// where (in points): the truth a scan of it is read against.
fn drawn(
    sample: &Value,
) -> (
    docstream::extract::ExtractionOutput,
    docstream::domain::Grounding,
) {
    let mut drawn = sample["request"].clone();
    drawn["document"] = serde_json::json!({"pages": sample["pages"]});
    let drawn: docstream::domain::ExtractionRequest = serde_json::from_value(drawn).unwrap();
    let values = docstream::extract::rule_extract(&drawn).unwrap();
    let boxes = docstream::extract::ground(&drawn.document, &values, 0.8);
    (values, boxes)
}

/// A scan to submit: what it is, its bytes and media type, how a box of
/// the sample (points) maps onto it, and the page the values are on.
type Scan<'a> = (
    &'a str,
    Vec<u8>,
    &'a str,
    &'a dyn Fn([f64; 4]) -> [f64; 4],
    usize,
);

/// Scans and photos are read by OCR, in the default deployment: a PNG, a
/// JPEG of a page scanned on its side, a PDF made of a page image, and a
/// two-page TIFF. Each job finds the values the sample's text layer gives,
/// each value's box lands on the page as it was uploaded (IoU ≥ 0.5 with
/// where the sample drew it, turned and scaled as the scan was), and each
/// grounded value reports its words' lowest confidence, flagged for review
/// under the request's `min_confidence`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_are_read_by_ocr_and_grounded_on_the_page_as_uploaded() {
    let files = Files::start(Store::Dir).await;
    let _workers = [
        files.env.spawn("worker", &[], "ocr-worker"),
        files.env.spawn("bbox-worker", &[], "ocr-bbox-worker"),
    ];
    let (pdf, sample) = sample("invoice-northwind");
    let (values, boxes) = drawn(&sample);
    let (receipt, _) = self::sample("receipt-bakery");
    // From the sample's points to the scan's pixels at 200 dpi, upright or
    // turned 90° clockwise (the page's height in pixels, 2200, becomes the
    // scan's width).
    let px = 200.0 / 72.0;
    let upright = |b: [f64; 4]| b.map(|v| v * px);
    let turned_90 = |b: [f64; 4]| {
        let [x0, y0, x1, y1] = upright(b);
        [2200.0 - y1, x0, 2200.0 - y0, x1]
    };
    let points = |b: [f64; 4]| b;
    let jpeg = render(&pdf, 200, "jpeg");
    let scans: [Scan; 4] = [
        (
            "a PNG at 200 dpi",
            render(&pdf, 200, "png"),
            "image/png",
            &upright,
            0,
        ),
        (
            "a JPEG scanned on its side",
            render(&turned(&pdf), 200, "jpeg"),
            "image/jpeg",
            &turned_90,
            0,
        ),
        (
            "a PDF of a page image",
            image_pdf(&jpeg, (1700, 2200), (612.0, 792.0)),
            "application/pdf",
            &points,
            0,
        ),
        (
            "a TIFF of a receipt, then the invoice",
            tiff_of(&[render(&receipt, 200, "gray"), render(&pdf, 200, "gray")]),
            "image/tiff",
            &upright,
            1,
        ),
    ];
    let mut jobs = Vec::new();
    for (what, bytes, content_type, _, _) in &scans {
        let (status, file) = files.upload(bytes.clone(), content_type, None).await;
        assert_eq!(status, StatusCode::CREATED, "{what}: {file}");
        let mut request = sample["request"].clone();
        request["document"] = serde_json::json!({"object": file["id"]});
        request["min_confidence"] = serde_json::json!(0.9);
        let (status, accepted) = files.submit(&request, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{what}: {accepted}");
        jobs.push(accepted["id"].as_str().unwrap().to_owned());
    }
    for ((what, _, _, to_scan, page), id) in scans.iter().zip(&jobs) {
        let job = files.finished(id).await;
        assert_eq!(job["status"], "succeeded", "{what}: {job}");
        let bbox = &job["post_processing"]["bbox_refinement"];
        assert_eq!(bbox["status"], "succeeded", "{what}: {job}");
        let grounded = &bbox["result"]["fields"];
        let mut review = 0;
        for (field, value) in &values.fields {
            let want = value.as_ref().unwrap();
            assert_eq!(
                job["result"]["fields"][field]["value"],
                want.value.as_str(),
                "{what}: {field}"
            );
            let truth = boxes.fields[field].as_ref().unwrap();
            let got = &grounded[field];
            assert_eq!(got["page"], *page, "{what}: {field}: {got}");
            let bbox: [f64; 4] = serde_json::from_value(got["bbox"].clone()).unwrap();
            let overlap = docstream::extract::iou(bbox, to_scan(truth.bbox));
            assert!(
                overlap >= 0.5,
                "{what}: {field}: {bbox:?} vs {:?} (IoU {overlap:.2})",
                to_scan(truth.bbox)
            );
            let confidence = got["confidence"].as_f64().unwrap_or(-1.0);
            assert!((0.0..=1.0).contains(&confidence), "{what}: {field}: {got}");
            assert_eq!(
                got["needs_review"],
                confidence < 0.9,
                "{what}: {field}: {got}"
            );
            review += usize::from(confidence < 0.9);
        }
        assert_eq!(bbox["result"]["needs_review"], review, "{what}: {bbox}");
    }
    review_queue_and_ground_truth(&files, &scans[0].1).await;
}

/// A scan whose every value is under its `min_confidence` is in the
/// reviewers' queue (`needs_review=true`) until each flagged value is
/// corrected; the corrections export as ground truth for `docstream eval`,
/// beside the document.
async fn review_queue_and_ground_truth(files: &Files, png: &[u8]) {
    let (_, file) = files.upload(png.to_vec(), "image/png", None).await;
    let (_, sample) = sample("invoice-northwind");
    let mut request = sample["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});
    request["min_confidence"] = serde_json::json!(1.0);
    let (_, accepted) = files.submit(&request, None).await;
    let id = accepted["id"].as_str().unwrap().to_owned();
    let job = files.finished(&id).await;
    let grounded = job["post_processing"]["bbox_refinement"]["result"].clone();
    let flagged: Vec<String> = (grounded["fields"].as_object().unwrap().iter())
        .filter(|(_, place)| place["needs_review"] == true)
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(grounded["needs_review"], flagged.len(), "{grounded}");
    assert!(!flagged.is_empty(), "OCR is never certain: {grounded}");
    let queue = |flag: &'static str| async move {
        let url = format!(
            "{}/v1/extractions?needs_review={flag}&limit=200",
            files.base
        );
        let page: Value = files
            .env
            .client()
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<String> = (page["items"].as_array().unwrap().iter())
            .map(|j| j["id"].as_str().unwrap().to_owned())
            .collect();
        ids
    };
    assert!(queue("true").await.contains(&id));
    assert!(!queue("false").await.contains(&id));

    let reviewer = docstream::store::tenants::create_key(
        &files.env.pool,
        "default",
        &[docstream::domain::Scope::Review],
    )
    .await
    .unwrap();
    for (n, field) in flagged.iter().enumerate() {
        let url = format!(
            "{}/v1/extractions/{id}/fields/{field}/corrections",
            files.base
        );
        // The first one set right by hand; the others confirmed as read.
        let value = match n {
            0 => serde_json::json!("corrected by hand"),
            _ => job["result"]["fields"][field]["value"].clone(),
        };
        let response = (files.env.client().post(url))
            .bearer_auth(&reviewer.api_key)
            .json(&serde_json::json!({"value": value}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "{field}");
        let still = queue("true").await.contains(&id);
        assert_eq!(still, n + 1 < flagged.len(), "after {} corrections", n + 1);
    }
    assert!(queue("false").await.contains(&id));

    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let exported = files
        .env
        .run_cli(&["jobs", "truth", "--tenant", "default", "--out", dir])
        .await;
    assert!(exported.status.success(), "{exported:?}");
    let truth: Value = serde_json::from_slice(
        &std::fs::read(out.path().join(format!("{id}.truth.json"))).unwrap(),
    )
    .unwrap();
    let document = std::fs::read(out.path().join(truth["document"].as_str().unwrap())).unwrap();
    assert_eq!(document, png, "the document beside its truth is the file");
    assert_eq!(truth["fields"].as_object().unwrap().len(), flagged.len());
    let first = &truth["fields"][&flagged[0]];
    assert_eq!(first["value"], "corrected by hand");
    assert!(
        first["bbox"].is_null(),
        "nobody said where the right value is"
    );
    let confirmed = flagged.get(1).map(|field| &truth["fields"][field]);
    if let Some(confirmed) = confirmed {
        assert!(
            confirmed["bbox"].is_array(),
            "a confirmed value keeps its box: {truth}"
        );
    }
}

/// A page drawn for people stays within the pixel cap however large its
/// PDF says it is; past the process's render slots a request is refused
/// at once (503 with `Retry-After`), not queued; and the page a refused
/// request asked for is there when it retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drawn_pages_are_held_to_the_pixel_cap_and_the_render_slots() {
    const PIXELS: usize = 4_000_000;
    let files = Files::start_with(Store::Dir, |s| {
        s.ocr_max_pixels = PIXELS;
        s.render_slots = 2;
    })
    .await;
    // 120 inches square in a few hundred bytes: 144 megapixels at 100 dpi.
    let line = "0 0 m 8640 8640 l S";
    let pdf = pdf_with(&[
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 /MediaBox [0 0 8640 8640] >>".into(),
        "<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>".into(),
        format!("<< /Length {} >>\nstream\n{line}\nendstream", line.len()),
    ]);
    let (status, file) = files.upload(pdf, "application/pdf", None).await;
    assert_eq!(status, StatusCode::CREATED, "{file}");
    let (_, sample) = sample("invoice-northwind");
    let mut request = sample["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let url = format!(
        "{}/v1/extractions/{}/pages/0",
        files.base,
        accepted["id"].as_str().unwrap()
    );

    let asks = (0..12).map(|_| files.env.client().get(&url).send());
    let mut statuses = Vec::new();
    for answer in futures::future::join_all(asks).await {
        let answer = answer.unwrap();
        let status = answer.status().as_u16();
        if status == 503 {
            assert!(answer.headers().contains_key("retry-after"));
        }
        statuses.push(status);
    }
    assert!(
        statuses.iter().all(|s| [200, 503].contains(s)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&503), "12 at once, 2 slots: {statuses:?}");

    let png = common::wait_for(
        "the page, drawn",
        std::time::Duration::from_secs(60),
        || {
            let get = files.env.client().get(&url).send();
            async move {
                let answer = get.await.map_err(|e| e.to_string())?;
                match answer.status().as_u16() {
                    200 => Ok(answer.bytes().await.unwrap()),
                    // Asked to retry after a second.
                    503 => {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        Err("503".into())
                    }
                    other => panic!("{other}: {}", answer.text().await.unwrap()),
                }
            }
        },
    )
    .await;
    assert_eq!(&png[1..4], b"PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap()) as usize;
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap()) as usize;
    assert!(width * height <= PIXELS, "{width} × {height}");
    assert!(
        width >= 1000,
        "drawn as large as the cap allows: {width} × {height}"
    );
}

/// A page OCR's programs cannot read (a PNG of a header and no pixels,
/// within every cap) fails its job on its first attempt, naming why: the
/// same page would fail again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_ocr_cannot_read_fails_its_job_at_once() {
    let files = Files::start(Store::Dir).await;
    let _worker = files.env.spawn("worker", &[], "undecodable-worker");
    let (status, file) = files.upload(png_header(100, 100), "image/png", None).await;
    assert_eq!(status, StatusCode::CREATED, "{file}");
    let (_, sample) = sample("invoice-northwind");
    let mut request = sample["request"].clone();
    request["document"] = serde_json::json!({"object": file["id"]});
    let (status, accepted) = files.submit(&request, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = accepted["id"].as_str().unwrap();
    let job = files.finished(id).await;
    assert_eq!(job["status"], "failed", "{job}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.contains("for OCR failed"), "{job}");
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM extractions WHERE id = $1")
        .bind(id.parse::<uuid::Uuid>().unwrap())
        .fetch_one(&files.env.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 1, "{job}");
}

/// A receipt as OCR gives it: each line's label, then (read as a column of
/// its own, after every label) the amounts, each word with a confidence.
fn ocr_receipt(lines: &[(&str, &str)]) -> Value {
    let mut words = Vec::new();
    let word = |text: &str, x: f64, y: f64, confidence: f64| serde_json::json!({"text": text, "bbox": [x, y, x + 40.0, y + 12.0], "confidence": confidence});
    for (row, (label, _)) in lines.iter().enumerate() {
        for (i, text) in label.split_whitespace().enumerate() {
            words.push(word(text, 10.0 + 45.0 * i as f64, 20.0 * row as f64, 0.95));
        }
    }
    for (row, (_, amount)) in lines.iter().enumerate() {
        if !amount.is_empty() {
            words.push(word(amount, 400.0, 20.0 * row as f64 + 1.0, 0.93));
        }
    }
    serde_json::json!({"pages": [{"width": 460.0, "height": 20.0 * lines.len() as f64, "words": words}]})
}

/// Through the pipeline, as a team would ask (the request a user wrote
/// for real receipts, plus a typed date): a receipt's total is the amount
/// it means, not the first line with `TOTAL`; the date is read in any
/// common format and returned as ISO; each value says how it was chosen;
/// and a value whose choice is unclear is flagged for review while a
/// clear one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipts_total_is_chosen_among_its_lines_and_an_unclear_choice_is_flagged() {
    let files = Files::start(Store::Dir).await;
    let _workers = [
        files.env.spawn("worker", &[], "receipt-worker"),
        files.env.spawn("bbox-worker", &[], "receipt-bbox-worker"),
    ];
    let fields = serde_json::json!([
        {"name": "total", "anchor": "TOTAL", "type": "money"},
        {"name": "printed", "pattern": "\\b(\\d{1,2}[/.-]\\d{1,2}[/.-]\\d{2,4})\\b"},
        {"name": "date", "type": "date"}
    ]);
    let clear = ocr_receipt(&[
        ("YONGFATT ENTERPRISE", ""),
        ("TEL 07-3523888", ""),
        ("Date: 25 Dec 2018 Time 12:31", ""),
        ("ELEGANT BAG", "80.91"),
        ("TOTAL QTY: 1", "80.91"),
        ("TOTAL SALES (EXCLUDING GST) :", "80.91"),
        ("TOTAL GST :", "0.00"),
        ("ROUNDING", "-0.01"),
        ("TOTAL SALES (INCLUSIVE OF GST) :", "80.90"),
        ("CASH :", "100.00"),
        ("CHANGE :", "19.10"),
        ("Printed 25/12/2018", ""),
    ]);
    // Two plain totals, and what was paid says neither.
    let unclear = ocr_receipt(&[
        ("TOTAL", "57.00"),
        ("TOTAL", "18.90"),
        ("CASH", "50.00"),
        ("CHANGE", "1.10"),
    ]);
    let mut ids = Vec::new();
    for document in [&clear, &unclear] {
        let request = serde_json::json!({"document": document, "fields": fields});
        let (status, accepted) = files.submit(&request, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
        ids.push(accepted["id"].as_str().unwrap().to_owned());
    }
    let job = files.finished(&ids[0]).await;
    let (result, grounded) = (
        &job["result"]["fields"],
        &job["post_processing"]["bbox_refinement"]["result"]["fields"],
    );
    assert_eq!(result["total"]["value"], "80.90", "{job}");
    assert_eq!(result["total"]["confidence"], 0.97, "{job}");
    // A sure value goes without how it was chosen; an unsure one has it.
    assert_eq!(result["total"].get("chosen"), None, "{job}");
    assert_eq!(grounded["total"]["needs_review"], false, "{job}");
    assert_eq!(
        grounded["total"]["bbox"],
        serde_json::json!([400.0, 161.0, 440.0, 173.0])
    );
    assert_eq!(result["printed"]["value"], "25/12/2018", "{job}");
    assert_eq!(result["date"]["value"], "2018-12-25", "{job}");
    assert_eq!(result["date"]["raw"], "25 Dec 2018", "{job}");
    let job = files.finished(&ids[1]).await;
    let total = &job["post_processing"]["bbox_refinement"]["result"]["fields"]["total"];
    assert_eq!(total["needs_review"], true, "{job}");
    assert!(total["confidence"].as_f64().unwrap() < 0.8, "{job}");
    let chosen = &job["result"]["fields"]["total"]["chosen"];
    let candidates = chosen["candidates"].as_array().unwrap();
    let values: Vec<&str> = candidates
        .iter()
        .filter_map(|c| c["value"].as_str())
        .collect();
    assert!(
        values.contains(&"57.00") && values.contains(&"18.90"),
        "{chosen}"
    );
    assert!(
        !chosen["rule"].as_str().unwrap_or_default().is_empty(),
        "{chosen}"
    );
}
