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

mod backend;
pub mod child;
mod collect;
pub mod drawn;
mod fetch;
pub mod image;
pub mod ocr;
pub mod pdf;
mod read;
pub mod signed;
mod sniff;

pub use drawn::DRAWN_DPI;
pub use read::{
    document, document_apart, ocr_budget_spent, read_all, read_scan, ReadLimits, Reading, Scan,
};
pub use sniff::FileType;

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use sqlx::{PgConnection, PgPool};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::config::Settings;
use crate::outbound::ssrf::{guarded_client, Guard};
use crate::store::files::{self, FileRow};
use crate::store::StoreError;
use backend::{object_path, Location, Opened};
use image::ImageError;
use ocr::OcrSettings;
use pdf::PdfError;

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
    reader: pdf::apart::Reader,
    /// How pages without text are read (and PDF pages drawn for people).
    ocr: OcrSettings,
    /// Whether pages without text are read at all.
    ocr_on: bool,
    /// Pages drawn for people: the slots to draw them in, and those kept.
    drawings: drawn::Drawings,
    /// Fetches a submitter's `document.url` past the SSRF guard (with the
    /// allow-list of document URLs, not the webhooks').
    fetcher: (Guard, reqwest::Client),
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
    /// The page could not be drawn now (its renderer could not run, or ran
    /// past its time on a busy machine): retry shortly.
    #[error("the page could not be drawn now: {0}; retry shortly")]
    NotNow(String),
    /// Every slot to draw a page in is taken: retry shortly.
    #[error("this server is drawing as many pages as it may at once (DOCSTREAM_RENDER_SLOTS); retry shortly")]
    Busy,
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
            reader: pdf::apart::Reader {
                program: match settings.pdf_reader.as_str() {
                    // Resolved now: the binary may be replaced on disk while
                    // this process runs.
                    "" => std::env::current_exe().unwrap_or_else(|_| "docstream".into()),
                    // A path made absolute: the reader runs in a folder of
                    // its own. A bare name is looked up on the PATH.
                    program if program.contains('/') => {
                        std::path::absolute(program).unwrap_or_else(|_| program.into())
                    }
                    program => PathBuf::from(program),
                },
                memory: settings.pdf_reader_max_memory_bytes as u64,
            },
            ocr_on: !settings.ocr_tesseract.is_empty(),
            ocr: OcrSettings::of(settings),
            drawings: drawn::Drawings::new(settings.render_slots, settings.render_cache_bytes),
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
    pub fn pdf_reader(&self) -> &pdf::apart::Reader {
        &self.0.reader
    }

    /// How pages without text are read, if they are.
    pub fn ocr(&self) -> Option<&OcrSettings> {
        self.0.ocr_on.then_some(&self.0.ocr)
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
    fn ids_are_lower_case_hex_sha256() {
        assert!(is_sha256(&"ab".repeat(32)));
        assert!(!is_sha256(&"AB".repeat(32)));
        assert!(!is_sha256("../../etc/passwd"));
    }
}
