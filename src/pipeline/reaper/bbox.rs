//! Classes 4–5: pending bbox refinements whose request was lost, and running
//! ones past their lease, republished to `extraction.post_processing.requested`.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio_util::sync::CancellationToken;

use super::{republish, revive_each, run_sweeps, sweep_once, Sweep, Sweeper};
use crate::pipeline::Services;
use crate::pipeline::Stage;
use crate::store::orphans::{self, Orphan, Thresholds};
use crate::store::StoreError;

/// The reaper of bbox orphans, beside every `bbox-worker`.
pub struct BboxReaper {
    services: Services,
}

impl BboxReaper {
    /// A reaper on `services`.
    pub fn new(services: Services) -> Self {
        Self { services }
    }

    /// Sweeps every sweep interval until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        run_sweeps(&self, shutdown).await
    }

    /// One sweep, if this replica gets the sweep lock.
    pub async fn sweep(&self) -> Result<Sweep, StoreError> {
        sweep_once(self).await
    }
}

impl Sweeper for BboxReaper {
    const NAME: &'static str = "bbox";
    const LOCK_KEY: i64 = 0x646f_6373_7472_0002;

    fn services(&self) -> &Services {
        &self.services
    }

    async fn take_and_revive(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Sweep, StoreError> {
        let settings = &self.services.settings;
        let thresholds = Thresholds::of(settings);
        let taken =
            orphans::take_bbox_orphans(&mut **conn, thresholds, settings.reaper_batch_size).await?;
        let revive = |orphan: Orphan| async move {
            republish(&self.services, Stage::BboxRefinement, &orphan).await
        };
        Ok(revive_each(self, &taken, revive).await)
    }
}
