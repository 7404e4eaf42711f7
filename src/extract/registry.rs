//! Every extractor a worker process can run, by name: the built-in `rules`
//! and each configured HTTP extractor. One per process, so each extractor's
//! limits hold for the whole process however many consumers it runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ExtractError, Extracted, Extractor, HttpExtractor, Job, RuleExtractor};
use crate::config::{Settings, RULES};
use crate::metrics::Metrics;

/// The extractors of one process.
#[derive(Clone)]
pub struct Extractors {
    /// How long the rule extractor may run (`DOCSTREAM_ASYNC_TIMEOUT_S`).
    rules_timeout: Duration,
    http: Arc<HashMap<String, HttpExtractor>>,
}

impl Extractors {
    /// The rule extractor and every extractor in `settings`.
    pub fn new(settings: &Settings, metrics: &Metrics) -> reqwest::Result<Self> {
        let mut http = HashMap::new();
        for (name, extractor) in &settings.extractors {
            let client = HttpExtractor::new(name, extractor, metrics.extractors.clone())?;
            http.insert(name.clone(), client);
        }
        Ok(Self {
            rules_timeout: settings.async_timeout(),
            http: Arc::new(http),
        })
    }

    /// Runs the extractor `name` on `job`. The rule extractor is bounded by the
    /// async timeout; an HTTP extractor bounds each call by its own timeout, and
    /// may wait for a slot, a token or a `Retry-After` besides; once `stop`
    /// fires it starts no new call ([`ExtractError::Interrupted`]).
    pub async fn extract(
        &self,
        name: &str,
        job: &Job<'_>,
        stop: &CancellationToken,
    ) -> Result<Extracted, ExtractError> {
        if name == RULES {
            let rules = RuleExtractor.extract(job);
            return tokio::time::timeout(self.rules_timeout, rules)
                .await
                .map(|done| done.map(Extracted::Output))
                .unwrap_or_else(|_| {
                    Err(ExtractError::Unavailable(format!(
                        "extraction timed out after {} s",
                        self.rules_timeout.as_secs_f64()
                    )))
                });
        }
        match self.http.get(name) {
            Some(extractor) => extractor.run(job, stop).await,
            // Accepted by an API that knows it, so this worker's settings lag
            // behind: retrying gives the deployment time to catch up.
            None => Err(ExtractError::Unavailable(format!(
                "no extractor named {name:?} is configured in this worker"
            ))),
        }
    }
}
