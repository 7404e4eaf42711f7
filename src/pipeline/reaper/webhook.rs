//! Class 6: webhook deliveries due and held by no dispatcher, handed to this
//! process's dispatcher.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio_util::sync::CancellationToken;

use super::{run_sweeps, sweep_once, Sweep, Sweeper};
use crate::pipeline::Services;
use crate::store::orphans::OrphanClass;
use crate::store::webhooks;
use crate::store::StoreError;

/// The reaper of webhook deliveries, in every process with a worker.
pub struct WebhookReaper {
    services: Services,
}

impl WebhookReaper {
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

impl Sweeper for WebhookReaper {
    const NAME: &'static str = "webhook";
    const LOCK_KEY: i64 = 0x646f_6373_7472_0003;

    fn services(&self) -> &Services {
        &self.services
    }

    async fn take_and_revive(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<Sweep, StoreError> {
        let services = &self.services;
        let settings = &services.settings;
        let threshold_s = settings.webhook_orphan_threshold_s.as_secs_f64();
        let taken =
            webhooks::take_orphans(&mut **conn, threshold_s, settings.reaper_batch_size).await?;
        let label = [OrphanClass::WebhookUnsent.label()];
        for (id, tenant, age_s) in &taken {
            tracing::debug!(id, class = 6, age_s, "orphan found");
            services
                .metrics
                .reapers
                .orphans_found
                .with_label_values(&label)
                .inc();
            services.webhooks.wake(Some(id), *tenant);
            services
                .metrics
                .reapers
                .orphans_republished
                .with_label_values(&label)
                .inc();
        }
        if !taken.is_empty() {
            tracing::info!(reaper = Self::NAME, found = taken.len(), "orphans revived");
        }
        Ok(Sweep::Swept {
            found: taken.len(),
            republished: taken.len(),
        })
    }
}
