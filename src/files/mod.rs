//! Files: documents a tenant sends as bytes (a PDF, a scan, a text file)
//! rather than as JSON. Each is stored once per tenant under its content's
//! SHA-256, in an object store (a folder on this machine by default, or a
//! bucket of an S3-compatible service), and described by a row
//! (`store::files`) written once the bytes are stored.
//!
//! What a file is comes from its bytes ([`FileType::sniff`]); a declared
//! `Content-Type` that names another kind is refused rather than believed.
//! A PDF is checked before it is stored ([`pdf::check`]): its pages within
//! the document limit, its streams within the inflate cap. An image is
//! checked from its headers ([`image::pages`]): its pages within the
//! document limit, each within the pixel cap.
//!
//! A file is read into the same document a JSON submit carries: a PDF's
//! text layer page by page, a text file's text, and every page without text
//! (an image, a PDF page made of one) read by OCR ([`ocr`]), its words
//! with their confidence.
//! Objects live at `tenants/<tenant>/<sha256>`, and every lookup goes
//! through the caller's tenant, so one tenant can never name another's file.

pub mod image;
pub mod ocr;
pub mod pdf;
pub mod signed;
mod sniff;

pub use sniff::FileType;

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sqlx::{PgConnection, PgPool};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::Document;
use crate::extract::protocol::FileRef;
use crate::extract::{Deadline, ExtractError};
use crate::outbound::ssrf::{guarded_client, Guard};
use crate::store::files::{self, FileRow};
use crate::store::StoreError;
use image::{ImageError, ImageLimits};
use ocr::{OcrError, OcrSettings};
use pdf::{PdfError, PdfLimits};

/// The files of every tenant; clones share the store.
#[derive(Clone)]
pub struct Files(Arc<Inner>);

struct Inner {
    pool: PgPool,
    /// Where the bytes are kept.
    location: Location,
    /// Made at the first use: a process that never touches a file creates
    /// no folder and opens no connection. A bucket also presigns URLs.
    store: OnceCell<Opened>,
    /// Where `serve` answers signed file URLs and the key that signs them
    /// (the deferred results' own), for the folder store.
    signing: Option<(String, String)>,
    /// How long a file URL stays valid.
    url_ttl: std::time::Duration,
    /// Bytes of files one tenant may keep (0: no quota).
    quota: u64,
    /// Largest file, in bytes.
    max_bytes: usize,
    /// What a file may hold to be read as a document.
    read: ReadLimits,
    /// The program that reads a PDF's words in a process of its own.
    reader: PathBuf,
    /// How pages without text are read (and PDF pages drawn for people).
    ocr: OcrSettings,
    /// Whether pages without text are read at all.
    ocr_on: bool,
    /// Fetches a submitter's `document.url` past the SSRF guard (with the
    /// allow-list of document URLs, not the webhooks').
    fetcher: (Guard, reqwest::Client),
}

/// An open store, and the bucket again as the signer of its URLs.
type Opened = (Arc<dyn ObjectStore>, Option<Arc<AmazonS3>>);

/// Where files are kept: a folder on this machine, or a bucket of an
/// S3-compatible service.
#[derive(Debug, Clone)]
enum Location {
    Dir(PathBuf),
    /// The bucket, the service's address (empty: AWS's own) and its
    /// credentials (empty: the standard `AWS_*` variables', as the region).
    S3 {
        bucket: String,
        endpoint: String,
        credentials: (String, String),
    },
}

impl Location {
    fn of(settings: &Settings) -> Self {
        match settings.files_s3_bucket.as_str() {
            "" => Self::Dir(PathBuf::from(&settings.files_dir)),
            bucket => Self::S3 {
                bucket: bucket.to_owned(),
                endpoint: settings.files_s3_endpoint.clone(),
                credentials: (
                    settings.files_s3_access_key_id.clone(),
                    settings.files_s3_secret_access_key.clone(),
                ),
            },
        }
    }

    /// The store, its folder made if it is one; a bucket is its own signer.
    async fn open(&self) -> Result<Opened, object_store::Error> {
        match self {
            Self::Dir(dir) => {
                tokio::fs::create_dir_all(dir).await.map_err(|source| {
                    let path = dir.display().to_string();
                    object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source: format!("cannot create {path}: {source}").into(),
                    }
                })?;
                Ok((Arc::new(LocalFileSystem::new_with_prefix(dir)?), None))
            }
            Self::S3 {
                bucket,
                endpoint,
                credentials: (key_id, secret),
            } => {
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
                if !key_id.is_empty() {
                    builder = builder
                        .with_access_key_id(key_id)
                        .with_secret_access_key(secret);
                }
                if !endpoint.is_empty() {
                    // A service of one's own (MinIO, Ceph, …): path-style
                    // addresses, and plain HTTP when its address says so.
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_virtual_hosted_style_request(false)
                        .with_allow_http(endpoint.starts_with("http://"));
                }
                let bucket = Arc::new(builder.build()?);
                Ok((bucket.clone(), Some(bucket)))
            }
        }
    }
}

/// Why a file was not stored or read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// No bytes.
    #[error("the file is empty")]
    Empty,
    /// More bytes than the limit.
    #[error("the file is larger than {0} bytes (DOCSTREAM_FILE_MAX_BYTES)")]
    TooLarge(usize),
    /// Bytes of a kind docstream does not take.
    #[error("the file is not a PDF, PNG, JPEG, TIFF or UTF-8 text file")]
    Unsupported,
    /// The declared `Content-Type` names another kind than the bytes are.
    #[error("the Content-Type says {declared} but the bytes are {found}")]
    Mismatch {
        /// What the request said.
        declared: String,
        /// What the bytes are.
        found: &'static str,
    },
    /// A text file of more words than a text document may hold.
    #[error("the text file has more than {0} words (DOCSTREAM_MAX_TEXT_WORDS); send a longer document as pages")]
    TooManyWords(usize),
    /// A PDF that is damaged, a bomb, or past a limit.
    #[error(transparent)]
    Pdf(#[from] PdfError),
    /// An image that is damaged, a bomb, or past a limit.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// A `document.url` refused by the SSRF guard, or whose fetch failed.
    #[error("{0}")]
    Url(String),
    /// The tenant keeps as many bytes of files as its quota allows.
    #[error("the tenant keeps {used} bytes of files and of the documents its jobs read from them; with this one it would pass its quota of {quota} bytes (DOCSTREAM_TENANT_MAX_FILE_BYTES): files no job names are deleted after DOCSTREAM_FILE_GRACE_S")]
    Quota {
        /// Bytes it keeps.
        used: i64,
        /// Its quota.
        quota: u64,
    },
    /// A file URL for the folder store needs `serve`'s address and the
    /// key that signs it.
    #[error("files in the folder store reach an extractor of protocol version 2 through serve: set DOCSTREAM_PUBLIC_URL and DOCSTREAM_CALLBACK_SECRET")]
    NoUrl,
    /// The file has no page of this index.
    #[error("the file has no page {0} (pages count from 0)")]
    NoPage(usize),
    /// The page cannot be drawn as an image.
    #[error("{0}")]
    NotDrawn(String),
    /// The tenant has no file of this id (or it was deleted).
    #[error("no file {0} of this tenant: upload it with POST /v1/files first")]
    Missing(String),
    /// The object store failed.
    #[error("the file store failed: {0}")]
    Store(#[from] object_store::Error),
    /// Postgres failed.
    #[error(transparent)]
    Database(#[from] StoreError),
}

/// A stored file.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[schemars(rename = "File", deny_unknown_fields)]
pub struct StoredFile {
    /// The file's id within its tenant: its SHA-256, so the same bytes
    /// uploaded again are the same file.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub id: String,
    /// Hex SHA-256 of the bytes.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub sha256: String,
    /// Bytes.
    #[schemars(range(min = 1))]
    pub size: i64,
    /// What the bytes are (sniffed, not taken from the request).
    pub content_type: FileType,
    /// When the tenant first uploaded these bytes.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl StoredFile {
    fn of(row: FileRow) -> Self {
        // Rows are written from a sniffed kind only.
        let content_type = FileType::named(&row.content_type).unwrap_or(FileType::Text);
        Self {
            id: row.sha256.clone(),
            sha256: row.sha256,
            size: row.size,
            content_type,
            created_at: row.created_at,
        }
    }
}

impl Files {
    /// The files of `settings`' store, described in `pool`.
    pub fn new(settings: &Settings, pool: PgPool) -> Self {
        Self(Arc::new(Inner {
            pool,
            location: Location::of(settings),
            store: OnceCell::new(),
            max_bytes: settings.file_max_bytes,
            read: ReadLimits::of(settings),
            reader: match settings.pdf_reader.as_str() {
                // Resolved now: the binary may be replaced on disk while
                // this process runs.
                "" => std::env::current_exe().unwrap_or_else(|_| "docstream".into()),
                program => PathBuf::from(program),
            },
            ocr_on: !settings.ocr_tesseract.is_empty(),
            ocr: OcrSettings::of(settings),
            signing: settings
                .deferred_results()
                .map(|(url, secret)| (url.to_owned(), secret.to_owned())),
            url_ttl: settings.file_url_ttl_s.get(),
            quota: settings.tenant_max_file_bytes,
            fetcher: {
                let guard = Guard::new(settings.file_fetch_allow.clone());
                let timeout = settings.file_fetch_timeout_s.get();
                let agent = concat!("docstream-files/", env!("CARGO_PKG_VERSION"));
                let client = guarded_client(&guard, timeout, agent);
                (guard, client)
            },
        }))
    }

    /// Largest file, in bytes.
    pub fn max_bytes(&self) -> usize {
        self.0.max_bytes
    }

    /// Stores `bytes` as a file of `tenant`, checked against the
    /// `declared` media type if the request named one other than
    /// `application/octet-stream`. The file, and whether these bytes were
    /// new to the tenant. Stored twice, the same bytes are one object and
    /// one row.
    pub async fn upload(
        &self,
        tenant: Uuid,
        declared: Option<&str>,
        bytes: Bytes,
    ) -> Result<(StoredFile, bool), FileError> {
        let kind = check(declared, &bytes, self.0.max_bytes)?;
        match kind {
            FileType::Pdf => {
                let (pdf, limits) = (bytes.clone(), self.0.read.pdf);
                let checked = tokio::task::spawn_blocking(move || pdf::check(&pdf, &limits)).await;
                checked.map_err(|e| PdfError::Unreadable(e.to_string()))??;
            }
            FileType::Text => text_within(&bytes, self.0.read.text_words)?,
            image => drop(image::pages(image, &bytes, &self.0.read.image)?),
        }
        let sha256 = crate::domain::sha256_hex(&bytes);
        let size = bytes.len() as i64;
        // Refused before its bytes are written, as a rule; `record` decides.
        let mut db = self.0.pool.acquire().await.map_err(StoreError::from)?;
        self.within_quota(&mut db, tenant, &sha256, size).await?;
        drop(db);
        let store = self.store().await?;
        let path = object_path(tenant, &sha256);
        // Noted first, so bytes whose row never comes are collected.
        files::note_upload(&self.0.pool, tenant, &sha256).await?;
        store.put(&path, PutPayload::from(bytes.clone())).await?;
        let row = FileRow {
            sha256,
            size,
            content_type: kind.as_str().to_owned(),
            created_at: chrono::Utc::now(),
        };
        let (row, made) = self.record(tenant, &row).await?;
        files::clear_upload_note(&self.0.pool, tenant, &row.sha256).await?;
        // A collector that deleted these bytes' earlier row (or an old note
        // of them) may have deleted the object just written too; its
        // transaction ended before `record` (or the note's clearing)
        // returned, so the object is either here now or gone for good.
        match store.head(&path).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => {
                store.put(&path, PutPayload::from(bytes)).await?;
            }
            Err(e) => return Err(e.into()),
        }
        Ok((StoredFile::of(row), made))
    }

    /// Fetches `url` (a request's `document.url`) and stores what it
    /// answers as a file of `tenant`'s, as [`Files::upload`] would. The URL
    /// passes the SSRF guard first (admitting what `DOCSTREAM_FILE_FETCH_ALLOW`
    /// names, not `DOCSTREAM_WEBHOOK_ALLOW`), and the connection goes
    /// only to the addresses it checked; redirects are not followed; the
    /// body is held to the file limit as it arrives, and the whole fetch to
    /// its timeout.
    pub async fn fetch(&self, tenant: Uuid, url: &str) -> Result<(StoredFile, bool), FileError> {
        let (guard, client) = &self.0.fetcher;
        guard.check(url).await.map_err(|e| {
            tracing::debug!(%tenant, detail = %e.detail(), "document.url refused by the SSRF guard");
            FileError::Url(e.of("document.url"))
        })?;
        let failed = |e: reqwest::Error| {
            let what = match e.is_timeout() {
                true => "did not answer in time".to_owned(),
                false => format!("failed: {}", crate::outbound::error_chain(&e)),
            };
            FileError::Url(format!("fetching document.url {what}"))
        };
        let mut response = client.get(url).send().await.map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            let redirect = status
                .is_redirection()
                .then_some(" (redirects are not followed)");
            return Err(FileError::Url(format!(
                "fetching document.url answered {status}{}",
                redirect.unwrap_or_default()
            )));
        }
        let max = self.0.max_bytes;
        if response.content_length().is_some_and(|n| n > max as u64) {
            return Err(FileError::TooLarge(max));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > max {
                return Err(FileError::TooLarge(max));
            }
            body.extend_from_slice(&chunk);
        }
        // What the file is comes from its bytes alone: the server's
        // Content-Type is not the submitter's claim (and often generic).
        self.upload(tenant, None, Bytes::from(body)).await
    }

    /// Tenant `tenant`'s file `id`, if it has one.
    pub async fn get(&self, tenant: Uuid, id: &str) -> Result<Option<StoredFile>, FileError> {
        if !is_sha256(id) {
            return Ok(None);
        }
        let row = files::get(&self.0.pool, tenant, id).await?;
        Ok(row.map(StoredFile::of))
    }

    /// Refuses `size` more bytes of `tenant`'s past its quota, unless it
    /// keeps these bytes (`sha256`) already.
    async fn within_quota(
        &self,
        db: &mut PgConnection,
        tenant: Uuid,
        sha256: &str,
        size: i64,
    ) -> Result<(), FileError> {
        let quota = self.0.quota;
        if quota == 0 {
            return Ok(());
        }
        let used = files::stored_bytes(&mut *db, tenant).await?;
        let over = u64::try_from(used + size).unwrap_or(u64::MAX) > quota;
        if over && files::get(&mut *db, tenant, sha256).await?.is_none() {
            return Err(FileError::Quota { used, quota });
        }
        Ok(())
    }

    /// Records `row` (its bytes are stored) as tenant `tenant`'s file,
    /// within its quota: the check and the insert run under the tenant's
    /// lock (`files::lock_tenant`), so uploads at once cannot pass the quota
    /// together. Refused, its bytes are deleted under the same lock: an
    /// upload of the same bytes waiting for it finds them gone after its
    /// own `record`, and writes them again.
    async fn record(&self, tenant: Uuid, row: &FileRow) -> Result<(FileRow, bool), FileError> {
        if self.0.quota == 0 {
            return Ok(files::record(&self.0.pool, tenant, row).await?);
        }
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        files::lock_tenant(&mut tx, tenant).await?;
        let within = self.within_quota(&mut tx, tenant, &row.sha256, row.size);
        if let Err(refused) = within.await {
            if matches!(refused, FileError::Quota { .. }) {
                self.delete_objects([(tenant, row.sha256.clone())]).await?;
            }
            return Err(refused);
        }
        let recorded = files::record(&mut *tx, tenant, row).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(recorded)
    }

    /// Deletes files no job names and nothing used for `grace`, `batch` at
    /// a time until none is left: their rows, then their bytes; and the
    /// bytes of uploads begun longer than `grace` ago whose row never came.
    /// How many of both.
    pub async fn collect(&self, grace: std::time::Duration, batch: i64) -> Result<u64, FileError> {
        let mut total = self.collect_unrecorded(grace, batch).await?;
        loop {
            let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
            let collected = files::collect(&mut tx, grace, batch).await?;
            let n = collected.len();
            self.delete_objects(collected).await?;
            tx.commit().await.map_err(StoreError::from)?;
            total += n as u64;
            if (n as i64) < batch {
                return Ok(total);
            }
        }
    }

    /// Deletes the bytes of uploads begun longer than `grace` ago whose row
    /// was never written (`store::files::collect_unrecorded`), `batch` at a
    /// time. How many.
    async fn collect_unrecorded(
        &self,
        grace: std::time::Duration,
        batch: i64,
    ) -> Result<u64, FileError> {
        let mut total = 0;
        loop {
            let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
            let noted = files::collect_unrecorded(&mut tx, grace, batch).await?;
            let n = noted.len();
            let unrecorded: Vec<(Uuid, String)> = (noted.into_iter())
                .filter(|(_, _, recorded)| !recorded)
                .map(|(tenant, sha256, _)| (tenant, sha256))
                .collect();
            total += unrecorded.len() as u64;
            self.delete_objects(unrecorded).await?;
            tx.commit().await.map_err(StoreError::from)?;
            if (n as i64) < batch {
                return Ok(total);
            }
        }
    }

    /// Deletes tenant `tenant`'s files `sha256s` that no job names now,
    /// rows and bytes, however recently they were used: the files of a job
    /// whose content was erased. How many.
    pub async fn forget(&self, tenant: Uuid, sha256s: &[String]) -> Result<u64, FileError> {
        if sha256s.is_empty() {
            return Ok(0);
        }
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        let forgotten = files::forget(&mut tx, tenant, sha256s).await?;
        let n = forgotten.len() as u64;
        self.delete_objects(forgotten.into_iter().map(|sha256| (tenant, sha256)))
            .await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(n)
    }

    /// Deletes the objects of files whose rows the caller deleted in a
    /// transaction it commits next (see `store::files` for why in between).
    async fn delete_objects(
        &self,
        doomed: impl IntoIterator<Item = (Uuid, String)>,
    ) -> Result<(), FileError> {
        let mut doomed = doomed.into_iter().peekable();
        if doomed.peek().is_none() {
            return Ok(());
        }
        let store = self.store().await?;
        for (tenant, sha256) in doomed {
            match store.delete(&object_path(tenant, &sha256)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                // The row goes all the same: the bytes are unreferenced,
                // never a file a job can name.
                Err(e) => tracing::warn!(%tenant, file = %sha256, error = %e,
                    "a deleted file's bytes were not deleted"),
            }
        }
        Ok(())
    }

    /// Tenant `tenant`'s file `id`: what it is, and its bytes.
    pub async fn read(&self, tenant: Uuid, id: &str) -> Result<(FileType, Bytes), FileError> {
        let row = self.get(tenant, id).await?;
        let file = row.ok_or_else(|| FileError::Missing(id.to_owned()))?;
        let store = self.store().await?;
        let object = store.get(&object_path(tenant, &file.sha256)).await;
        let bytes = match object {
            Ok(object) => object.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(FileError::Missing(id.to_owned()))
            }
            Err(e) => return Err(e.into()),
        };
        Ok((file.content_type, bytes))
    }

    /// What a file may hold here to be read as a document.
    pub fn read_limits(&self) -> ReadLimits {
        self.0.read
    }

    /// The program that reads a PDF's words in a process of its own.
    pub fn pdf_reader(&self) -> &std::path::Path {
        &self.0.reader
    }

    /// How pages without text are read, if they are.
    pub fn ocr(&self) -> Option<&OcrSettings> {
        self.0.ocr_on.then_some(&self.0.ocr)
    }

    /// Page `index` (from 0) of tenant `tenant`'s file `id` as an image a
    /// browser draws, and its media type: a PNG's or a JPEG's own bytes
    /// (their one page), a PDF page rendered to a PNG at [`DRAWN_DPI`] (in
    /// a process of its own, under OCR's limits). A TIFF is not drawn:
    /// browsers do not read it.
    pub async fn page_image(
        &self,
        tenant: Uuid,
        id: &str,
        index: usize,
    ) -> Result<(&'static str, Bytes), FileError> {
        let (kind, bytes) = self.read(tenant, id).await?;
        match kind {
            FileType::Png | FileType::Jpeg if index == 0 => Ok((kind.as_str(), bytes)),
            FileType::Png | FileType::Jpeg => Err(FileError::NoPage(index)),
            FileType::Pdf => {
                let (pdf, limits) = (bytes.clone(), self.0.read.pdf);
                let checked = tokio::task::spawn_blocking(move || pdf::check(&pdf, &limits)).await;
                let pages = checked.map_err(|e| PdfError::Unreadable(e.to_string()))??;
                if index >= pages {
                    return Err(FileError::NoPage(index));
                }
                let png = self.0.ocr.render(bytes, index + 1, DRAWN_DPI).await;
                let png = png.map_err(|e| FileError::NotDrawn(e.to_string()))?;
                Ok((FileType::Png.as_str(), Bytes::from(png)))
            }
            FileType::Tiff | FileType::Text => Err(FileError::NotDrawn(format!(
                "a {} file is not drawn as an image (browsers do not read it)",
                kind.as_str()
            ))),
        }
    }

    async fn store(&self) -> Result<&Arc<dyn ObjectStore>, FileError> {
        Ok(&self.opened().await?.0)
    }

    async fn opened(&self) -> Result<&Opened, FileError> {
        let location = &self.0.location;
        Ok(self.0.store.get_or_try_init(|| location.open()).await?)
    }

    /// Where an extractor of protocol version 2 fetches tenant `tenant`'s
    /// file `id` for attempt `attempt` of job `job`, and what the file is:
    /// a URL the bucket presigned, or one `serve` answers, signed for this
    /// attempt of this job. Valid for `DOCSTREAM_FILE_URL_TTL_S`.
    pub async fn url_for(
        &self,
        tenant: Uuid,
        id: &str,
        (job, attempt): (Uuid, i32),
    ) -> Result<FileRef, FileError> {
        let file = self.get(tenant, id).await?;
        let file = file.ok_or_else(|| FileError::Missing(id.to_owned()))?;
        let ttl = self.0.url_ttl;
        let expires_at = chrono::Utc::now() + ttl;
        let url = match &self.opened().await?.1 {
            Some(bucket) => {
                use object_store::signer::Signer;
                let path = object_path(tenant, &file.sha256);
                let signed = bucket.signed_url(reqwest::Method::GET, &path, ttl).await?;
                signed.to_string()
            }
            None => {
                let (public_url, secret) = self.0.signing.as_ref().ok_or(FileError::NoUrl)?;
                signed::url(public_url, secret, job, attempt, expires_at.timestamp())
            }
        };
        Ok(FileRef {
            url,
            content_type: file.content_type.as_str().to_owned(),
            size: file.size,
            sha256: file.sha256,
            expires_at,
        })
    }
}

/// The resolution a PDF page is drawn at for people (the console): sharp
/// enough on a screen, a fraction of OCR's pixels.
pub const DRAWN_DPI: f64 = 100.0;

/// What a file may hold to be read as a document.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// What a PDF may hold.
    pub pdf: PdfLimits,
    /// Most words of a text file, as of a text document.
    pub text_words: usize,
    /// What an image may be.
    pub image: ImageLimits,
}

impl ReadLimits {
    /// The limits `settings` set.
    pub fn of(settings: &Settings) -> Self {
        Self {
            pdf: PdfLimits {
                pages: settings.max_pages,
                inflated_bytes: settings.file_max_inflated_bytes,
                words_per_page: settings.max_words_per_page,
                content_objects: settings.file_max_content_objects,
            },
            text_words: settings.max_text_words,
            image: ImageLimits {
                pixels: settings.ocr_max_pixels as u64,
                pages: settings.max_pages,
            },
        }
    }
}

/// Refuses a text file of more than `limit` words (runs of
/// non-whitespace, as a text document's are counted).
fn text_within(bytes: &[u8], limit: usize) -> Result<(), FileError> {
    let text = String::from_utf8_lossy(bytes);
    match text.split_whitespace().take(limit + 1).count() > limit {
        true => Err(FileError::TooManyWords(limit)),
        false => Ok(()),
    }
}

/// What a document with no words needs when OCR is off.
const OCR: &str = "OCR is off in this deployment (DOCSTREAM_OCR_TESSERACT is empty): \
    turn it on, or use an extractor that does OCR (an external extractor of the settings)";

/// A file read as far as it can be without OCR: its document, and the
/// pages of it still to read by OCR.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// What was read: a PDF's pages (empty where they have no text), a
    /// text file's text; no pages yet for an image.
    pub document: Document,
    /// What OCR is to read.
    pub scans: Vec<Scan>,
}

/// A page of a file to read by OCR.
#[derive(Debug, Clone, PartialEq)]
pub enum Scan {
    /// A page of an image (a TIFF may have several).
    ImagePage {
        /// What the image is.
        kind: FileType,
        /// From 0.
        index: usize,
        /// Its size in pixels.
        size: (u64, u64),
    },
    /// A PDF page without text: its index, and its size in points.
    PdfPage {
        /// From 0.
        index: usize,
        /// Width and height.
        size: (f64, f64),
    },
}

impl Reading {
    /// The document once every scan is read, or why it cannot be: OCR is
    /// off and nothing but scans is there, or nothing has words.
    fn finish(self, ocr_on: bool) -> Result<Document, ExtractError> {
        let words = (self.document.pages.iter().flatten()).any(|p| !p.words.is_empty());
        let text = self.document.text.is_some();
        match (words || text, self.scans.first()) {
            (true, _) => Ok(self.document),
            (false, Some(Scan::ImagePage { .. })) if !ocr_on => Err(refused(format!(
                "the file is an image, which has no text layer: {OCR}"
            ))),
            (false, Some(_)) if !ocr_on => Err(refused(format!(
                "the PDF has no text layer (a scan?): {OCR}"
            ))),
            (false, _) => Err(refused("OCR found no text in the file".into())),
        }
    }
}

/// A refusal of the file by the built-in reading.
fn refused(message: String) -> ExtractError {
    ExtractError::Refused {
        extractor: crate::domain::RULES_EXTRACTOR.to_owned(),
        message,
    }
}

/// The document a file of kind `kind` holds as far as it can be read
/// without OCR ([`Reading`]): a PDF's text layer, a text file's text; an
/// image is all scan. A text file past the word limit is too long, and
/// fails for good. CPU-bound: run it on the CPU pool.
pub fn document(
    kind: FileType,
    bytes: &[u8],
    limits: &ReadLimits,
    deadline: &Deadline,
) -> Result<Reading, ExtractError> {
    match kind {
        FileType::Pdf => pdf_reading(pdf::words(bytes, &limits.pdf, deadline), deadline),
        FileType::Text => {
            text_within(bytes, limits.text_words).map_err(|e| refused(e.to_string()))?;
            let text = String::from_utf8_lossy(bytes).into_owned();
            match text.trim().is_empty() {
                true => Err(refused("the text file holds no words".into())),
                false => Ok(Reading {
                    document: Document {
                        text: Some(text),
                        ..Document::default()
                    },
                    scans: Vec::new(),
                }),
            }
        }
        image => {
            let pages = image::pages(image, bytes, &limits.image);
            let pages = pages.map_err(|e| refused(e.to_string()))?;
            let blank = |&(width, height): &(u64, u64)| crate::domain::Page {
                width: width as f64,
                height: height as f64,
                words: Vec::new(),
            };
            let scans = (pages.iter().enumerate())
                .map(|(index, &size)| Scan::ImagePage {
                    kind: image,
                    index,
                    size,
                })
                .collect();
            Ok(Reading {
                document: Document {
                    pages: Some(pages.iter().map(blank).collect()),
                    ..Document::default()
                },
                scans,
            })
        }
    }
}

/// [`document`], a PDF read in a process of its own (`reader`, see
/// [`pdf::apart`]) that dropping the future kills: run it on the CPU pool
/// with [`crate::extract::CpuPool::run_apart`], which drops it at the
/// deadline and frees its slot.
pub async fn document_apart(
    reader: &std::path::Path,
    kind: FileType,
    bytes: Bytes,
    limits: &ReadLimits,
    deadline: &Deadline,
) -> Result<Reading, ExtractError> {
    match kind {
        FileType::Pdf => {
            let read = pdf::apart::words(reader, bytes, &limits.pdf).await;
            pdf_reading(read, deadline)
        }
        other => document(other, &bytes, limits, deadline),
    }
}

/// Reads `scan` of the file `bytes` by OCR into `reading`'s document. The
/// engine's own failures (a crash, its memory cap) fail the attempt, to be
/// retried; a page past its time or word limit fails for good.
pub async fn read_scan(
    ocr: &OcrSettings,
    bytes: Bytes,
    scan: &Scan,
    reading: &mut Reading,
) -> Result<(), ExtractError> {
    let (read, index) = match *scan {
        Scan::ImagePage { kind, index, size } => {
            (ocr.image_page(bytes, kind, index, size).await, index)
        }
        Scan::PdfPage { index, size } => (ocr.pdf_page(bytes, index + 1, size).await, index),
    };
    let page = read.map_err(|e| match e {
        OcrError::TimedOut { .. } | OcrError::TooManyWords { .. } => refused(e.to_string()),
        OcrError::Failed(why) | OcrError::Unavailable(why) => ExtractError::Unavailable(why),
    })?;
    // The page's place was kept for it, blank.
    let pages = reading.document.pages.get_or_insert_with(Vec::new);
    if let Some(slot) = pages.get_mut(index) {
        *slot = page;
    }
    Ok(())
}

/// The whole document of the file `bytes` of kind `kind`, every page
/// without text read by `ocr` (if any) one after the other, with no
/// deadline: for a reader of its own (the reference provider), not the
/// worker, which bounds each step on its CPU pool.
pub async fn read_all(
    kind: FileType,
    bytes: Bytes,
    limits: &ReadLimits,
    ocr: Option<&OcrSettings>,
) -> Result<Document, ExtractError> {
    let (file, limits) = (bytes.clone(), *limits);
    let read =
        tokio::task::spawn_blocking(move || document(kind, &file, &limits, &Deadline::none()));
    let reading = read.await.map_err(|e| {
        ExtractError::Unavailable(format!("reading the file failed unexpectedly: {e}"))
    })??;
    let run = |scan: Scan, mut reading: Reading| {
        let bytes = bytes.clone();
        async move {
            let ocr = ocr.expect("scans are read only with OCR on");
            read_scan(ocr, bytes, &scan, &mut reading).await?;
            Ok(reading)
        }
    };
    reading.read_scans(ocr, run).await
}

impl Reading {
    /// The document, every scan read by `ocr` if there is one: each scan
    /// run by `run` (which bounds it, in the worker on the CPU pool).
    pub async fn read_scans<F, Fut>(
        mut self,
        ocr: Option<&OcrSettings>,
        run: F,
    ) -> Result<Document, ExtractError>
    where
        F: Fn(Scan, Reading) -> Fut,
        Fut: std::future::Future<Output = Result<Reading, ExtractError>>,
    {
        if ocr.is_none() || self.scans.is_empty() {
            return self.finish(ocr.is_some());
        }
        for scan in std::mem::take(&mut self.scans) {
            self = run(scan, self).await?;
        }
        self.finish(true)
    }
}

/// The reading of a PDF whose words were `read`: its pages without words
/// are scans.
fn pdf_reading(
    read: Result<Vec<crate::domain::Page>, PdfError>,
    deadline: &Deadline,
) -> Result<Reading, ExtractError> {
    let pages = read.map_err(|e| match e {
        PdfError::Deadline => deadline.exceeded(),
        PdfError::Reader(why) => ExtractError::Unavailable(why),
        e => refused(e.to_string()),
    })?;
    let scans = (pages.iter().enumerate())
        .filter(|(_, p)| p.words.is_empty())
        .map(|(index, p)| Scan::PdfPage {
            index,
            size: (p.width, p.height),
        })
        .collect();
    Ok(Reading {
        document: Document {
            pages: Some(pages),
            ..Document::default()
        },
        scans,
    })
}

/// What `bytes` are, or why they are refused: empty, over `max_bytes`, of a
/// kind docstream does not take, or of another kind than `declared`.
fn check(declared: Option<&str>, bytes: &[u8], max_bytes: usize) -> Result<FileType, FileError> {
    if bytes.is_empty() {
        return Err(FileError::Empty);
    }
    if bytes.len() > max_bytes {
        return Err(FileError::TooLarge(max_bytes));
    }
    let found = FileType::sniff(bytes).ok_or(FileError::Unsupported)?;
    let declared = declared.map(str::trim).filter(|d| {
        let essence = d.split(';').next().unwrap_or_default().trim();
        !essence.is_empty() && !essence.eq_ignore_ascii_case("application/octet-stream")
    });
    match declared {
        Some(d) if FileType::named(d) != Some(found) => Err(FileError::Mismatch {
            declared: d.to_owned(),
            found: found.as_str(),
        }),
        _ => Ok(found),
    }
}

/// Where tenant `tenant`'s bytes of `sha256` are kept.
fn object_path(tenant: Uuid, sha256: &str) -> Path {
    Path::from(format!("tenants/{tenant}/{sha256}"))
}

fn is_sha256(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_refused_empty_too_large_unknown_or_declared_as_another_kind() {
        let pdf = b"%PDF-1.4\n";
        assert!(matches!(check(None, b"", 10), Err(FileError::Empty)));
        assert!(matches!(check(None, pdf, 4), Err(FileError::TooLarge(4))));
        assert!(matches!(
            check(None, b"PK\x03\x04", 10),
            Err(FileError::Unsupported)
        ));
        let lying = check(Some("image/png"), pdf, 10);
        assert!(matches!(
            lying,
            Err(FileError::Mismatch {
                found: "application/pdf",
                ..
            })
        ));
        let zip_declared = check(Some("application/zip"), pdf, 10);
        assert!(matches!(zip_declared, Err(FileError::Mismatch { .. })));
        for declared in [
            None,
            Some("application/octet-stream"),
            Some("application/pdf"),
        ] {
            assert_eq!(check(declared, pdf, 10).unwrap(), FileType::Pdf);
        }
    }

    #[test]
    fn a_text_file_past_the_word_limit_is_not_read() {
        let limits = ReadLimits {
            pdf: PdfLimits {
                pages: 1,
                inflated_bytes: 1,
                words_per_page: 1,
                content_objects: 1,
            },
            text_words: 3,
            image: ImageLimits {
                pixels: 1,
                pages: 1,
            },
        };
        let read = |text: &str| {
            let read = document(FileType::Text, text.as_bytes(), &limits, &Deadline::none());
            read.and_then(|reading| reading.finish(false))
        };
        assert!(read("one two\nthree").is_ok());
        let refused = read("one two three four").unwrap_err().to_string();
        assert!(refused.contains("DOCSTREAM_MAX_TEXT_WORDS"), "{refused}");
    }

    #[test]
    fn ids_are_lower_case_hex_sha256() {
        assert!(is_sha256(&"ab".repeat(32)));
        assert!(!is_sha256(&"AB".repeat(32)));
        assert!(!is_sha256("../../etc/passwd"));
    }
}
