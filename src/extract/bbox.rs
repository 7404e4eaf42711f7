//! Bbox refinement: ground each extracted value to the boxes of the words it was
//! read from, as the union box on the page of its first word.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ExtractionOutput;
use crate::domain::Document;

/// Where one value sits on the page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroundedField {
    /// Page index.
    pub page: usize,
    /// Union box `[x0, y0, x1, y1]` of the value's words on that page.
    pub bbox: [f64; 4],
    /// The words it spans, as in the extraction result.
    pub words: [usize; 2],
}

/// Boxes by field; `null` for a field not found or a document without geometry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Grounding {
    /// Per field.
    pub fields: BTreeMap<String, Option<GroundedField>>,
}

/// Grounds every value of `output` in `document`.
pub fn ground(document: &Document, output: &ExtractionOutput) -> Grounding {
    let words = document.words();
    let fields = output
        .fields
        .iter()
        .map(|(name, value)| {
            let grounded = value.as_ref().and_then(|v| {
                let [first, last] = v.words?;
                let page = words.get(first)?.page;
                let boxes = words.get(first..=last)?.iter().filter(|w| w.page == page);
                let bbox = boxes.filter_map(|w| w.bbox).reduce(union)?;
                Some(GroundedField {
                    page,
                    bbox,
                    words: [first, last],
                })
            });
            (name.clone(), grounded)
        })
        .collect();
    Grounding { fields }
}

fn union(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
    [
        a[0].min(b[0]),
        a[1].min(b[1]),
        a[2].max(b[2]),
        a[3].max(b[3]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::ExtractedValue;

    #[test]
    fn union_box_on_the_first_page() {
        let document: Document = serde_json::from_value(serde_json::json!({"pages": [
            {"width": 600.0, "height": 800.0, "words": [
                {"text": "Total", "bbox": [10.0, 700.0, 50.0, 712.0]},
                {"text": "USD", "bbox": [60.0, 700.0, 90.0, 712.0]},
                {"text": "12.50", "bbox": [95.0, 699.0, 130.0, 713.0]}
            ]}
        ]}))
        .unwrap();
        let mut output = ExtractionOutput::default();
        let value = ExtractedValue {
            value: "12.50".into(),
            raw: Some("USD 12.50".into()),
            words: Some([1, 2]),
        };
        output.fields.insert("total".into(), Some(value));
        output.fields.insert("missing".into(), None);
        let grounding = ground(&document, &output);
        let total = grounding.fields["total"].clone().unwrap();
        assert_eq!((total.page, total.bbox), (0, [60.0, 699.0, 130.0, 713.0]));
        assert_eq!(grounding.fields["missing"], None);
    }
}
