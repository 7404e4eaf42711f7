//! The URL an extractor of protocol version 2 fetches a job's file from
//! ([`Files::url_for`]). With the files in a bucket, the bucket presigns
//! it. With the folder store, `serve` answers it (`GET
//! /v1/extractions/{id}/file`), for one attempt of one job while that
//! attempt holds the job, until it expires; it is signed with the
//! deployment's callback secret, which `serve` and the workers share, so no
//! key of the tenant's travels with it and it opens no other file.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use uuid::Uuid;

use super::backend::object_path;
use super::{FileError, Files};
use crate::extract::deferred::{sign, signed_by};
use crate::extract::protocol::FileRef;

/// Why a file URL was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Past its expiry.
    #[error("this file URL has expired")]
    Expired,
    /// Not signed for this job and attempt.
    #[error("this file URL is not signed for this job")]
    Forged,
}

/// The query of a signed file URL: which attempt, until when (Unix
/// seconds), and the signature.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
pub struct Signed {
    /// The attempt the URL was made for.
    #[schemars(range(min = 1))]
    pub attempt: i32,
    /// Unix seconds past which it is refused.
    pub expires: i64,
    /// base64url HMAC-SHA256 of the job, the attempt and the expiry.
    pub signature: String,
}

fn message(id: Uuid, attempt: i32, expires: i64) -> String {
    format!("docstream-file:{id}:{attempt}:{expires}")
}

/// The URL of job `id`'s file for attempt `attempt`, valid until `expires`
/// (Unix seconds), on the API at `public_url`.
pub fn url(public_url: &str, secret: &str, id: Uuid, attempt: i32, expires: i64) -> String {
    let signature = URL_SAFE_NO_PAD.encode(sign(secret, &message(id, attempt, expires)));
    format!("{public_url}/v1/extractions/{id}/file?attempt={attempt}&expires={expires}&signature={signature}")
}

/// Checks `signed` for job `id` at `now` (Unix seconds).
pub fn verify(secret: &str, id: Uuid, signed: &Signed, now: i64) -> Result<(), Refused> {
    if !signed_by(
        secret,
        &message(id, signed.attempt, signed.expires),
        &signed.signature,
    ) {
        return Err(Refused::Forged);
    }
    match now <= signed.expires {
        true => Ok(()),
        false => Err(Refused::Expired),
    }
}

impl Files {
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
                url(public_url, secret, job, attempt, expires_at.timestamp())
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "a-callback-secret-for-tests";

    fn query(url: &str) -> Signed {
        let query = url.split_once('?').unwrap().1;
        let pairs: std::collections::HashMap<_, _> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        Signed {
            attempt: pairs["attempt"].parse().unwrap(),
            expires: pairs["expires"].parse().unwrap(),
            signature: pairs["signature"].clone(),
        }
    }

    #[test]
    fn a_url_opens_its_own_job_until_it_expires() {
        let id = Uuid::new_v4();
        let url = url("https://ds.example", SECRET, id, 2, 1_000);
        assert!(url.starts_with(&format!("https://ds.example/v1/extractions/{id}/file?")));
        let signed = query(&url);
        assert_eq!(verify(SECRET, id, &signed, 1_000), Ok(()));
        assert_eq!(verify(SECRET, id, &signed, 1_001), Err(Refused::Expired));
        assert_eq!(
            verify(SECRET, Uuid::new_v4(), &signed, 0),
            Err(Refused::Forged)
        );
        let later = Signed {
            expires: 9_999,
            ..signed.clone()
        };
        assert_eq!(verify(SECRET, id, &later, 0), Err(Refused::Forged));
        let other = Signed {
            attempt: 3,
            ..signed
        };
        assert_eq!(verify(SECRET, id, &other, 0), Err(Refused::Forged));
    }
}
