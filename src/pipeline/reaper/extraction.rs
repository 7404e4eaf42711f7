//! Classes 1–3: queued jobs whose event was lost, and running jobs past
//! their lease, republished to `extraction.submitted`.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio_util::sync::CancellationToken;

use super::{republish, revive_each, run_sweeps, sweep_once, Sweep, Sweeper};
use crate::pipeline::Services;
use crate::pipeline::Stage;
use crate::store::orphans::{self, Orphan, Thresholds};
use crate::store::StoreError;

/// The reaper of extraction orphans, beside every `worker`.
pub struct ExtractionReaper {
    services: Services,
}

impl ExtractionReaper {
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

impl Sweeper for ExtractionReaper {
    const NAME: &'static str = "extraction";
    const LOCK_KEY: i64 = 0x646f_6373_7472_0001;

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
            orphans::take_extraction_orphans(&mut **conn, thresholds, settings.reaper_batch_size)
                .await?;
        let revive = |orphan: Orphan| async move {
            republish(&self.services, Stage::Extraction, &orphan).await
        };
        Ok(revive_each(self, &taken, revive).await)
    }
}
