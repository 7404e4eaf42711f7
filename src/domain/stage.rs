//! The two claimable stages of a job: the extraction, then its bbox
//! refinement. Each is claimed under a lease, completed with its claim's
//! fencing token, and revived by a reaper when its event or its holder is
//! lost. What differs between them is named here, once: the transitions a
//! stage makes, and its label. Its SQL lives in `store` (keyed by the
//! stage), its settings in `config::StageSettings`.

use super::Transition;

/// One of a job's claimable stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The extraction itself.
    Extraction,
    /// Its bbox refinement, requested when the extraction succeeds.
    BboxRefinement,
}

impl Stage {
    /// Both stages, in the order a job goes through them.
    pub const ALL: [Self; 2] = [Self::Extraction, Self::BboxRefinement];

    /// The `stage` label of metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Extraction => "extraction",
            Self::BboxRefinement => "bbox_refinement",
        }
    }

    /// The transition that claims the stage.
    pub fn claim_transition(self) -> Transition {
        match self {
            Self::Extraction => Transition::MarkRunning,
            Self::BboxRefinement => Transition::MarkBboxRefinementRunning,
        }
    }

    /// The transition that completes a claim with its result.
    pub fn success_transition(self) -> Transition {
        match self {
            Self::Extraction => Transition::MarkSucceeded,
            Self::BboxRefinement => Transition::MarkBboxRefinementSucceeded,
        }
    }

    /// The transition that ends a claim as failed for good.
    pub fn failure_transition(self) -> Transition {
        match self {
            Self::Extraction => Transition::MarkFailed,
            Self::BboxRefinement => Transition::MarkBboxRefinementFailed,
        }
    }
}

/// One value per stage, looked up by the stage.
#[derive(Debug, Clone, Default)]
pub struct PerStage<T> {
    /// The extraction's.
    pub extraction: T,
    /// The bbox refinement's.
    pub bbox_refinement: T,
}

impl<T> PerStage<T> {
    /// The value `of` gives each stage.
    pub fn new(mut of: impl FnMut(Stage) -> T) -> Self {
        Self {
            extraction: of(Stage::Extraction),
            bbox_refinement: of(Stage::BboxRefinement),
        }
    }
}

impl<T> std::ops::Index<Stage> for PerStage<T> {
    type Output = T;

    fn index(&self, stage: Stage) -> &T {
        match stage {
            Stage::Extraction => &self.extraction,
            Stage::BboxRefinement => &self.bbox_refinement,
        }
    }
}
