//! A request's `document.url`: fetched past the SSRF guard, and stored as
//! an upload would be.

use axum::body::Bytes;
use uuid::Uuid;

use super::{FileError, Files, StoredFile};

impl Files {
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
}
