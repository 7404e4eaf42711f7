//! Orphans: jobs that nothing is going to deliver to (the orphan classes
//! are listed in the manual, "Operating it").
//!
//! An event that the broker acknowledged is not lost: the consumer groups commit
//! offsets only after delivery, so it will be consumed. Each publisher therefore
//! stamps the row once its event is acknowledged ([`record_published`]; a new
//! job's stamp is written late and in bulk, see `pipeline::stamps`), and a
//! queued job or pending bbox refinement without that stamp, past its
//! threshold, is an orphan (classes 1, 3, 4). A job that waits in a legitimate
//! backlog has its stamp and is left alone. A running claim is an orphan once
//! its lease expired (classes 2, 5).
//!
//! The last net (classes 7, 8): a stamped job nobody claimed within a long
//! grace. Its record was acknowledged, so it should have been consumed; if
//! it was not, an offset was committed past it (a bug the consumer's ledger
//! exists to rule out) or a backlog is older than the grace. Either way a
//! second record costs one more read and a claim that makes it harmless, and
//! the job never stays queued for good.
//!
//! The reapers call [`take`], one stage each: one statement that finds the
//! orphans, stamps them as republished, and returns them, so a row is handed
//! out at most once per threshold however many reapers sweep (rows locked by
//! a concurrent sweep are skipped). The stamp also records since when the row
//! was an orphan; the claim that recovers it turns that into the recovery
//! time.

use crate::config::Settings;
use crate::domain::{Priority, Stage};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{transitions, StoreError};

/// The windows that tell an orphan from slow work, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// A queued job older than this (since submit, or since its retry was due)
    /// lost its event: classes 1 and 3.
    pub queued_s: f64,
    /// The extraction lease: a running job is orphaned once it expired (class 2);
    /// also the least time between two republishes of one running job.
    pub run_lease_s: f64,
    /// A pending bbox refinement older than this (since requested, or since the
    /// extraction finished) lost its event: class 4.
    pub post_processing_pending_s: f64,
    /// The bbox lease: the least time between two republishes of class 5.
    pub bbox_lease_s: f64,
    /// A pending webhook delivery due longer ago than this, held by nobody,
    /// lost its dispatcher: class 6 (`store::webhooks`).
    pub webhook_pending_s: f64,
    /// A stage whose event was acknowledged and that nobody claimed for this
    /// long is revived anyway (classes 7 and 8); also the least time
    /// between two such revivals of one job.
    pub unclaimed_s: f64,
}

impl Thresholds {
    /// The thresholds `settings` give, as the reapers and `docstream orphans` use them.
    pub fn of(settings: &Settings) -> Self {
        let extraction = settings.stage(Stage::Extraction);
        let bbox = settings.stage(Stage::BboxRefinement);
        Self {
            queued_s: extraction.orphan_after.as_secs_f64(),
            run_lease_s: extraction.lease.as_secs_f64(),
            post_processing_pending_s: bbox.orphan_after.as_secs_f64(),
            bbox_lease_s: bbox.lease.as_secs_f64(),
            webhook_pending_s: settings.webhook_orphan_threshold_s.as_secs_f64(),
            unclaimed_s: settings.unclaimed_orphan_threshold_s.as_secs_f64(),
        }
    }

    /// `stage`'s pending threshold and lease, in seconds.
    fn of_stage(self, stage: Stage) -> (f64, f64) {
        match stage {
            Stage::Extraction => (self.queued_s, self.run_lease_s),
            Stage::BboxRefinement => (self.post_processing_pending_s, self.bbox_lease_s),
        }
    }
}

/// The eight ways a job can be left with nothing to deliver to it. The SQL
/// below numbers them 1 to 8; the number is also the `class` label of the
/// orphan metrics and what `docstream orphans` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "i16")]
pub enum OrphanClass {
    /// 1: queued, and its event was never acknowledged.
    QueuedNeverPublished = 1,
    /// 2: running, past its lease.
    RunningPastLease = 2,
    /// 3: queued for a retry whose event was lost.
    RetryPublishLost = 3,
    /// 4: bbox refinement pending, its request never acknowledged.
    BboxNeverPublished = 4,
    /// 5: bbox refinement running, past its lease.
    BboxPastLease = 5,
    /// 6: a webhook delivery due, held by no dispatcher.
    WebhookUnsent = 6,
    /// 7: queued, its event acknowledged, and unclaimed past the grace.
    QueuedUnclaimed = 7,
    /// 8: bbox refinement pending, its request acknowledged, and unclaimed
    /// past the grace.
    BboxUnclaimed = 8,
}

impl OrphanClass {
    /// Every class, in order.
    pub const ALL: [Self; 8] = [
        Self::QueuedNeverPublished,
        Self::RunningPastLease,
        Self::RetryPublishLost,
        Self::BboxNeverPublished,
        Self::BboxPastLease,
        Self::WebhookUnsent,
        Self::QueuedUnclaimed,
        Self::BboxUnclaimed,
    ];

    /// The class's number, 1 to 8.
    pub fn number(self) -> i16 {
        self as i16
    }

    /// The number as the `class` label of the orphan metrics.
    pub fn label(self) -> &'static str {
        ["1", "2", "3", "4", "5", "6", "7", "8"][self as usize - 1]
    }

    /// What the class means, for people.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::QueuedNeverPublished => "queued, never published",
            Self::RunningPastLease => "running past its lease",
            Self::RetryPublishLost => "queued, retry publish lost",
            Self::BboxNeverPublished => "bbox pending, never published",
            Self::BboxPastLease => "bbox running past its lease",
            Self::WebhookUnsent => "webhook pending, nobody sending",
            Self::QueuedUnclaimed => "queued, published, unclaimed past the grace",
            Self::BboxUnclaimed => "bbox pending, published, unclaimed past the grace",
        }
    }
}

impl From<OrphanClass> for i16 {
    fn from(class: OrphanClass) -> i16 {
        class.number()
    }
}

impl TryFrom<i16> for OrphanClass {
    type Error = String;

    fn try_from(n: i16) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.number() == n)
            .ok_or_else(|| format!("no orphan class {n}"))
    }
}

impl std::fmt::Display for OrphanClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// One orphan.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Orphan {
    /// The job.
    pub id: Uuid,
    /// Its class (for class 6, the job whose webhook it is).
    #[sqlx(try_from = "i16")]
    pub class: OrphanClass,
    /// Seconds since it became an orphan.
    pub age_s: f64,
    /// The job's tenant (in a reaper's take; `None` in a listing).
    #[sqlx(default)]
    #[serde(skip)]
    pub tenant_id: Option<Uuid>,
    /// The job's priority (in a reaper's take).
    #[sqlx(default)]
    #[serde(skip)]
    pub priority: Priority,
}

/// The extraction orphans (classes 1–3 and 7) with their class and since
/// when they are orphans, `$threshold` being the queued threshold's
/// parameter and `$grace` the unclaimed one's: the one definition that the
/// reaper's take and the operator's list share. (Both queued conditions
/// bound the due time first, so one range of `ix_extractions_queued` holds
/// every candidate.)
macro_rules! extraction_orphans {
    ($threshold:literal, $grace:literal) => {
        concat!(
            "SELECT id,
           CASE WHEN status = 'running' THEN 2 WHEN published_at IS NOT NULL THEN 7
                WHEN attempts = 0 THEN 1 ELSE 3 END AS class,
           CASE WHEN status = 'running' THEN lease_expires_at
                WHEN published_at IS NOT NULL
                THEN GREATEST(published_at, COALESCE(next_attempt_at, submitted_at))
                     + make_interval(secs => ",
            $grace,
            ")
                ELSE COALESCE(next_attempt_at, submitted_at) + make_interval(secs => ",
            $threshold,
            ") END AS since
      FROM extractions
     WHERE ((status = 'queued'
             AND COALESCE(next_attempt_at, submitted_at)
                 < now() - make_interval(secs => LEAST(",
            $threshold,
            ", ",
            $grace,
            "))
             AND ((published_at IS NULL
                   AND COALESCE(next_attempt_at, submitted_at) < now() - make_interval(secs => ",
            $threshold,
            "))
                  OR (published_at < now() - make_interval(secs => ",
            $grace,
            ")
                      AND COALESCE(next_attempt_at, submitted_at) < now() - make_interval(secs => ",
            $grace,
            "))))
            OR (status = 'running' AND lease_expires_at < now()))"
        )
    };
}

/// The bbox orphans (classes 4–5 and 8), as `extraction_orphans!` gives
/// those of the extraction; `$threshold` is the post-processing threshold's
/// parameter and `$grace` the unclaimed one's.
macro_rules! bbox_orphans {
    ($threshold:literal, $grace:literal) => {
        concat!(
            "SELECT id,
           CASE WHEN bbox_status = 'running' THEN 5 WHEN bbox_published_at IS NOT NULL THEN 8
                ELSE 4 END AS class,
           CASE WHEN bbox_status = 'running' THEN bbox_lease_expires_at
                WHEN bbox_published_at IS NOT NULL
                THEN bbox_published_at + make_interval(secs => ",
            $grace,
            ")
                ELSE COALESCE(bbox_requested_at, finished_at) + make_interval(secs => ",
            $threshold,
            ") END AS since
      FROM extractions
     WHERE ",
            bbox_open!(),
            "
       AND bbox_status IN ('pending', 'running')
       AND ((bbox_status = 'pending' AND bbox_published_at IS NULL
             AND COALESCE(bbox_requested_at, finished_at) < now() - make_interval(secs => ",
            $threshold,
            "))
            OR (bbox_status = 'pending'
                AND bbox_published_at < now() - make_interval(secs => ",
            $grace,
            "))
            OR (bbox_status = 'running' AND bbox_lease_expires_at < now()))"
        )
    };
}

/// A stage's take: its orphans (`$found`, over `$1` the pending threshold
/// and `$4` the unclaimed grace) less the rows republished within their
/// class's threshold (`$2` the lease for a running claim), up to `$3`; it
/// stamps those it takes. `$prefix` is the stage's column prefix (`bbox_`
/// for the bbox refinement).
macro_rules! take_orphans {
    ($found:expr, $prefix:literal) => {
        concat!(
            "WITH found AS (",
            $found,
            "
       AND (", $prefix, "republished_at IS NULL
            OR ", $prefix, "republished_at < now() - make_interval(secs =>
                   CASE WHEN ", $prefix, "status = 'running' THEN $2
                        WHEN ", $prefix, "published_at IS NOT NULL THEN $4
                        ELSE $1 END))
     ORDER BY since
     LIMIT $3
       FOR UPDATE SKIP LOCKED)
UPDATE extractions e
   SET ", $prefix, "republished_at = now(),
       ", $prefix, "orphaned_at = COALESCE(e.", $prefix, "orphaned_at, found.since)
  FROM found
 WHERE e.id = found.id
RETURNING e.id, e.tenant_id, e.priority, found.class::int2 AS class, extract(epoch FROM now() - found.since)::float8 AS age_s"
        )
    };
}

const TAKE_EXTRACTION_ORPHANS: &str = take_orphans!(extraction_orphans!("$1", "$4"), "");

const TAKE_BBOX_ORPHANS: &str = take_orphans!(bbox_orphans!("$1", "$4"), "bbox_");

/// Every orphan of the eight classes with since when it is one: `$1`, `$2`
/// and `$3` are the queued, post-processing and webhook thresholds, `$grace`
/// the unclaimed grace's parameter.
macro_rules! every_orphan {
    ($grace:literal) => {
        concat!(
            "SELECT id, class::int2 AS class, since FROM (",
            extraction_orphans!("$1", $grace),
            "
    UNION ALL
    ",
            bbox_orphans!("$2", $grace),
            "
    UNION ALL
    SELECT extraction_id, 6, next_attempt_at + make_interval(secs => $3)
      FROM webhook_deliveries
     WHERE status = 'pending' AND next_attempt_at < now() - make_interval(secs => $3)
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
) orphans"
        )
    };
}

const LIST_ORPHANS: &str = concat!(
    "SELECT id, class, extract(epoch FROM now() - since)::float8 AS age_s FROM (",
    every_orphan!("$5"),
    ") o
WHERE $4::uuid IS NULL OR id IN (SELECT id FROM extractions WHERE tenant_id = $4)
ORDER BY class, since"
);

const COUNT_ORPHANS: &str = concat!(
    "SELECT class, count(*) AS open, extract(epoch FROM now() - min(since))::float8 AS oldest_s
  FROM (",
    every_orphan!("$4"),
    ") o
 GROUP BY class
 ORDER BY class"
);

/// Takes up to `limit` orphans of `stage` (classes 1–3 and 7 of the
/// extraction, 4–5 and 8 of the bbox refinement) for republishing.
pub async fn take<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    thresholds: Thresholds,
    limit: i64,
) -> Result<Vec<Orphan>, StoreError> {
    let (pending_s, lease_s) = thresholds.of_stage(stage);
    let take = match stage {
        Stage::Extraction => TAKE_EXTRACTION_ORPHANS,
        Stage::BboxRefinement => TAKE_BBOX_ORPHANS,
    };
    let rows = sqlx::query_as::<_, Orphan>(take)
        .bind(pending_s)
        .bind(lease_s)
        .bind(limit)
        .bind(thresholds.unclaimed_s)
        .fetch_all(executor)
        .await?;
    Ok(rows)
}

/// Every current orphan (of `tenant`'s jobs only, when given), oldest first
/// within each class; changes nothing.
pub async fn list_orphans<'e>(
    executor: impl PgExecutor<'e>,
    thresholds: Thresholds,
    tenant: Option<Uuid>,
) -> Result<Vec<Orphan>, StoreError> {
    let rows = sqlx::query_as::<_, Orphan>(LIST_ORPHANS)
        .bind(thresholds.queued_s)
        .bind(thresholds.post_processing_pending_s)
        .bind(thresholds.webhook_pending_s)
        .bind(tenant)
        .bind(thresholds.unclaimed_s)
        .fetch_all(executor)
        .await?;
    Ok(rows)
}

/// The orphans open now, of one class.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OpenOrphans {
    /// The class.
    #[sqlx(try_from = "i16")]
    pub class: OrphanClass,
    /// How many are open.
    pub open: i64,
    /// Seconds since the oldest of them became an orphan.
    pub oldest_s: f64,
}

/// How many orphans of each class are open now (classes with none are left
/// out); changes nothing. The census runs it, so it is what the reapers will
/// take next, counted.
pub async fn count_open<'e>(
    executor: impl PgExecutor<'e>,
    thresholds: Thresholds,
) -> Result<Vec<OpenOrphans>, StoreError> {
    let rows = sqlx::query_as::<_, OpenOrphans>(COUNT_ORPHANS)
        .bind(thresholds.queued_s)
        .bind(thresholds.post_processing_pending_s)
        .bind(thresholds.webhook_pending_s)
        .bind(thresholds.unclaimed_s)
        .fetch_all(executor)
        .await?;
    Ok(rows)
}

/// Records that the event handing job `id`'s `stage` to its workers was
/// acknowledged: `extraction.submitted` of a queued job's current attempt, or
/// the bbox refinement's request.
///
/// A stamp never waits for a row another transaction holds: that holder is
/// almost always the claim the acknowledged event just caused, after which the
/// stamp has nothing left to say. Should that transaction roll back instead,
/// the job looks unpublished and, past its threshold, the reaper publishes it
/// again, which a claim makes harmless. Waiting instead made every stamp queue
/// behind the claims of its batch (and the claims behind the stamps).
pub async fn record_published<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    id: Uuid,
) -> Result<(), StoreError> {
    record_published_many(executor, stage, &[id]).await
}

/// [`record_published`] for many jobs in one statement, in lock order.
pub async fn record_published_many<'e>(
    executor: impl PgExecutor<'e>,
    stage: Stage,
    ids: &[Uuid],
) -> Result<(), StoreError> {
    let stamp = match stage {
        Stage::Extraction => STAMP_PUBLISHED,
        Stage::BboxRefinement => STAMP_BBOX_REQUEST_PUBLISHED,
    };
    sqlx::query(stamp)
        .bind(transitions::in_lock_order(ids))
        .execute(executor)
        .await?;
    Ok(())
}

const STAMP_PUBLISHED: &str = "WITH unstamped AS (
         SELECT extractions.id FROM unnest($1::uuid[]) AS batch(id)
           JOIN extractions ON extractions.id = batch.id
          WHERE status = 'queued' AND published_at IS NULL
            FOR UPDATE OF extractions SKIP LOCKED)
     UPDATE extractions SET published_at = now()
       FROM unstamped WHERE extractions.id = unstamped.id";

const STAMP_BBOX_REQUEST_PUBLISHED: &str = "WITH unstamped AS (
         SELECT extractions.id FROM unnest($1::uuid[]) AS batch(id)
           JOIN extractions ON extractions.id = batch.id
          WHERE bbox_status = 'pending' AND bbox_published_at IS NULL
            FOR UPDATE OF extractions SKIP LOCKED)
     UPDATE extractions SET bbox_published_at = now()
       FROM unstamped WHERE extractions.id = unstamped.id";

// Expires a live lease (the holder is fenced out by its token) and makes a
// delayed retry due now, so the next event for the job is claimed at once.
const RECLAIM: &str = "
UPDATE extractions
   SET lease_expires_at = CASE WHEN status = 'running' THEN now() - interval '1 millisecond'
                               ELSE lease_expires_at END,
       next_attempt_at = CASE WHEN status = 'queued' THEN NULL ELSE next_attempt_at END,
       bbox_lease_expires_at = CASE WHEN bbox_status = 'running'
                                    THEN now() - interval '1 millisecond'
                                    ELSE bbox_lease_expires_at END
 WHERE id = $1
   AND (status IN ('queued', 'running') OR bbox_status IN ('pending', 'running'))
RETURNING status";

/// Makes job `id` claimable now, whatever holds it, and says which stage to
/// hand it to; `None` when it has nothing left to do (terminal, or unknown).
pub async fn reclaim<'e>(
    executor: impl PgExecutor<'e>,
    id: Uuid,
) -> Result<Option<Stage>, StoreError> {
    let status: Option<String> = sqlx::query_scalar(RECLAIM)
        .bind(id)
        .fetch_optional(executor)
        .await?;
    Ok(status.map(|s| match s.as_str() {
        "succeeded" => Stage::BboxRefinement,
        _ => Stage::Extraction,
    }))
}
