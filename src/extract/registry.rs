//! Every extractor a worker process can run, by name: the built-in `rules`
//! and each configured HTTP extractor. One per process, so each extractor's
//! limits hold for the whole process however many consumers it runs.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use sqlx::PgPool;

use super::slots::{SharedCap, SharedCaps, SharedSlot};
use super::{CpuPool, ExtractError, Extracted, HttpExtractor, Job, ResultSize, RuleBudget};
use crate::config::{Settings, RULES};
use crate::domain::schedule::Weights;
use crate::domain::{Lane, ResultLimits};
use crate::metrics::Metrics;

/// The extractors of one process.
#[derive(Clone)]
pub struct Extractors {
    /// Where the rule extractor runs, off the async runtime.
    cpu: CpuPool,
    /// The rule extractor's limits.
    rules: RuleBudget,
    /// The rule extractor's deadline.
    rules_deadline: std::time::Duration,
    /// The result limits every extractor's results are held to.
    result: ResultLimits,
    http: Arc<HashMap<String, HttpExtractor>>,
    /// The deployment's slots for pages read by OCR.
    ocr: Arc<SharedCap>,
}

/// The name OCR's shared slots go by: not an extractor's (those have no
/// colon), so it cannot share one's slots.
pub const OCR_SLOTS: &str = "rules:ocr";

impl Extractors {
    /// The rule extractor, on `cpu`, and every extractor in `settings`,
    /// each capped across the deployment through `pool`.
    pub fn new(
        settings: &Settings,
        metrics: &Metrics,
        cpu: CpuPool,
        (pool, weights): (&PgPool, &Weights),
    ) -> reqwest::Result<Self> {
        let mut http = HashMap::new();
        let order = (settings.worker_priority_max_wait_s.get(), weights.clone());
        let lease = settings.extractor_slot_lease_s.get();
        let shared = SharedCaps::new(pool, lease, order, metrics.extractors.clone());
        for (name, extractor) in &settings.extractors {
            let client = HttpExtractor::new(name, extractor, &shared)?;
            http.insert(name.clone(), client);
        }
        let ocr = Arc::new(shared.extractor(OCR_SLOTS, settings.ocr_max_concurrency));
        let result = settings.result_limits();
        let rules = RuleBudget {
            program_bytes: settings.max_pattern_program_bytes,
            result,
        };
        Ok(Self {
            cpu,
            rules,
            rules_deadline: settings.extraction_deadline_s.get(),
            result,
            http: Arc::new(http),
            ocr,
        })
    }

    /// Waits for one of the deployment's slots for a page read by OCR
    /// (`DOCSTREAM_OCR_MAX_CONCURRENCY`), in `lane`'s turn.
    pub async fn ocr_slot(&self, lane: Lane) -> SharedSlot {
        self.ocr.acquire(lane).await
    }

    /// Runs the extractor `name` on `job`. The rule extractor runs on the
    /// CPU pool within its deadline; an HTTP extractor bounds each call by
    /// its own timeout, and may wait for a slot, a token or a `Retry-After`
    /// besides; once `stop` fires it starts no new call
    /// ([`ExtractError::Interrupted`]). Every result is held to the result
    /// limits.
    pub async fn extract(
        &self,
        name: &str,
        job: &Job<'_>,
        stop: &CancellationToken,
    ) -> Result<Extracted, ExtractError> {
        if name == RULES {
            let (request, budget) = (job.request.clone(), self.rules);
            let size = request.document.text_bytes() * request.fields.len().max(1);
            let output = self
                .cpu
                .run(self.rules_deadline, size, move |deadline| {
                    super::extract_rules(&request, &budget, deadline)
                })
                .await?;
            return Ok(Extracted::Output(output));
        }
        let Some(extractor) = self.http.get(name) else {
            // Accepted by an API that knows it, so this worker's settings lag
            // behind: retrying gives the deployment time to catch up.
            return Err(ExtractError::Unavailable(format!(
                "no extractor named {name:?} is configured in this worker"
            )));
        };
        let extracted = extractor.run(job, stop).await?;
        if let Extracted::Output(output) = &extracted {
            ResultSize::check(output, self.result)?;
        }
        Ok(extracted)
    }

    /// Whether the extractor `name` takes a job's file: `rules` does, an
    /// HTTP extractor if it speaks protocol version 2; `None` for a name
    /// this process does not know.
    pub fn takes_files(&self, name: &str) -> Option<bool> {
        match name == RULES {
            true => Some(true),
            false => self.http.get(name).map(HttpExtractor::takes_files),
        }
    }

    /// The result limits, for results that arrive later (deferred ones).
    pub fn result_limits(&self) -> ResultLimits {
        self.result
    }
}
