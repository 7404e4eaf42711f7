//! What bbox refinement makes of an extraction: each value's place on the
//! page and how sure its reader was of it (computed by `extract::ground`,
//! kept as `post_processing.bbox_refinement.result`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where one value sits on the page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GroundedField {
    /// Page index (0 for a text document).
    pub page: usize,
    /// Union box `[x0, y0, x1, y1]` of the value's words on that page, in
    /// their `Word.bbox` units, top-left origin.
    pub bbox: [f64; 4],
    /// The words it spans, as in the extraction result: first and last index.
    pub words: [usize; 2],
    /// The lowest confidence (0 to 1) among the words it spans on that
    /// page; null when none has one (a text layer's words).
    #[serde(default)]
    pub confidence: Option<f64>,
    /// Its confidence is under the request's `min_confidence`: reported,
    /// but for a person to check.
    #[serde(default)]
    pub needs_review: bool,
}

/// Boxes by field: null for a field not found, or a document without geometry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Grounding {
    /// Per field.
    pub fields: BTreeMap<String, Option<GroundedField>>,
    /// How many fields need review.
    #[serde(default)]
    pub needs_review: usize,
}
