//! Where the bytes are kept: a folder on this machine, or a bucket of an
//! S3-compatible service (the `object_store` crate), opened at the first
//! use; each tenant's file at `tenants/<tenant>/<sha256>`.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use uuid::Uuid;

use super::{FileError, Files};
use crate::config::Settings;

/// An open store, and the bucket again as the signer of its URLs.
pub(super) type Opened = (Arc<dyn ObjectStore>, Option<Arc<AmazonS3>>);

/// Where files are kept: a folder on this machine, or a bucket of an
/// S3-compatible service.
#[derive(Debug, Clone)]
pub(super) enum Location {
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
    pub(super) fn of(settings: &Settings) -> Self {
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
    pub(super) async fn open(&self) -> Result<Opened, object_store::Error> {
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

impl Files {
    /// The object store, opened at the first use.
    pub(super) async fn store(&self) -> Result<&Arc<dyn ObjectStore>, FileError> {
        Ok(&self.opened().await?.0)
    }

    /// The object store, and the bucket again as the signer of its URLs.
    pub(super) async fn opened(&self) -> Result<&Opened, FileError> {
        let location = &self.0.location;
        Ok(self.0.store.get_or_try_init(|| location.open()).await?)
    }
}

/// Where tenant `tenant`'s bytes of `sha256` are kept.
pub(super) fn object_path(tenant: Uuid, sha256: &str) -> Path {
    Path::from(format!("tenants/{tenant}/{sha256}"))
}
