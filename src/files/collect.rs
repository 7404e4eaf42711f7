//! Collecting bytes nothing needs: files no job names (after a grace),
//! uploads whose row never came, and the files of an erased job.

use object_store::ObjectStoreExt;
use uuid::Uuid;

use super::backend::object_path;
use super::{FileError, Files};
use crate::store::files;
use crate::store::StoreError;

impl Files {
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
    pub(super) async fn delete_objects(
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
}
