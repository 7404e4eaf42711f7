//! Files on a real Postgres, in the folder store and in a real S3-compatible
//! server (s3s-fs, which `scripts/test.sh` installs; `DOCSTREAM_TEST_S3`
//! names it): an upload is stored once per tenant under its SHA-256 and
//! described by a row; the same bytes again are the same file; another
//! tenant never sees it; and every refused upload (empty, too large, of an
//! unknown kind, or not the kind its Content-Type says) gets a clear 4xx
//! with nothing stored.

mod common;

use std::path::Path;

use common::TestEnv;
use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The file limit of the test: above the API's 4 MiB body limit, so an
/// upload between the two shows the route's own limit in force.
const FILE_LIMIT: usize = 5 * 1024 * 1024;

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
            if store == Store::S3 {
                s.files_s3_bucket = BUCKET.into();
                s.files_s3_endpoint = endpoint;
                s.files_s3_access_key_id = "docstream-test".into();
                s.files_s3_secret_access_key = "docstream-test-secret".into();
            }
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

/// A PDF's first bytes, padded with a comment to `size` bytes.
fn pdf_of(size: usize) -> Vec<u8> {
    let mut bytes = b"%PDF-1.4\n%".to_vec();
    bytes.resize(size, b'x');
    bytes
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
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    let refusals: [(&str, Vec<u8>, &str, StatusCode, &str); 5] = [
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
            pdf_of(100),
            "application/json",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the bytes are application/pdf",
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
