//! Job states and the named transitions of the state machine.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where an extraction is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExtractionStatus {
    /// Accepted and waiting for a worker to claim it.
    Queued,
    /// Claimed by a worker that holds the lease.
    Running,
    /// Extraction finished; bbox refinement may still be pending.
    Succeeded,
    /// Extraction gave up; `error` says why.
    Failed,
    /// Cancelled by the client before it ran.
    Cancelled,
}

impl ExtractionStatus {
    /// Every state, in the order of a job's life.
    pub const ALL: [Self; 5] = [
        Self::Queued,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The spelling stored in the `status` column and shown by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// State of the out-of-band bbox refinement that follows a successful extraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BboxStatus {
    /// Waiting for a bbox worker.
    Pending,
    /// Claimed by a bbox worker that holds the bbox lease.
    Running,
    /// Every extracted value was grounded (or had no geometry to ground to).
    Succeeded,
    /// Grounding gave up; the extraction result itself stands.
    Failed,
}

impl BboxStatus {
    /// Every bbox refinement state, in the order of its life.
    pub const ALL: [Self; 4] = [Self::Pending, Self::Running, Self::Succeeded, Self::Failed];

    /// The spelling stored in `bbox_status` and shown by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// Error for a state name that is not one of ours.
#[derive(Debug, thiserror::Error)]
#[error("unknown state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for ExtractionStatus {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => return Err(UnknownState(other.to_owned())),
        })
    }
}

impl FromStr for BboxStatus {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            other => return Err(UnknownState(other.to_owned())),
        })
    }
}

impl TryFrom<String> for ExtractionStatus {
    type Error = UnknownState;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for ExtractionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every transition of the state machine, by the name of the store function that
/// performs it. Used as the `transition` label in metrics, in the transition log
/// and in `ExtractionEvent`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// A new row, queued (not a matrix entry: the row did not exist before).
    Submit,
    /// queued, or running with an expired lease → running.
    MarkRunning,
    /// running (token held) → succeeded, bbox pending.
    MarkSucceeded,
    /// running (token held) → failed.
    MarkFailed,
    /// running (token held) → queued.
    RequeueForRetry,
    /// queued → cancelled; or running (holder, after a cancel request) → cancelled.
    MarkCancelled,
    /// running: flags the job so its holder cancels it at the next heartbeat.
    RequestCancel,
    /// succeeded with bbox pending: the post-processing request is being published.
    StartBboxRefinement,
    /// bbox pending, or running with an expired lease → bbox running.
    MarkBboxRefinementRunning,
    /// bbox running (token held) → bbox succeeded.
    MarkBboxRefinementSucceeded,
    /// bbox running (token held) → bbox failed.
    MarkBboxRefinementFailed,
    /// bbox pending or running → bbox pending.
    RequeueBboxRefinement,
    /// failed → queued, on request, with a fresh attempt budget.
    RetryFailed,
    /// A finished job's content erased on request; the state stays.
    Erase,
    /// A succeeded job's value corrected by a person; the state stays.
    CorrectField,
}

impl Transition {
    /// Snake-case name, identical to the store function's.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::MarkRunning => "mark_running",
            Self::MarkSucceeded => "mark_succeeded",
            Self::MarkFailed => "mark_failed",
            Self::RequeueForRetry => "requeue_for_retry",
            Self::MarkCancelled => "mark_cancelled",
            Self::RequestCancel => "request_cancel",
            Self::StartBboxRefinement => "start_bbox_refinement",
            Self::MarkBboxRefinementRunning => "mark_bbox_refinement_running",
            Self::MarkBboxRefinementSucceeded => "mark_bbox_refinement_succeeded",
            Self::MarkBboxRefinementFailed => "mark_bbox_refinement_failed",
            Self::RequeueBboxRefinement => "requeue_bbox_refinement",
            Self::RetryFailed => "retry_failed",
            Self::Erase => "erase",
            Self::CorrectField => "correct_field",
        }
    }
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in [
            ExtractionStatus::Queued,
            ExtractionStatus::Running,
            ExtractionStatus::Succeeded,
            ExtractionStatus::Failed,
            ExtractionStatus::Cancelled,
        ] {
            assert_eq!(s.as_str().parse::<ExtractionStatus>().unwrap(), s);
        }
        assert!("done".parse::<ExtractionStatus>().is_err());
        assert_eq!(
            "running".parse::<BboxStatus>().unwrap(),
            BboxStatus::Running
        );
    }
}
