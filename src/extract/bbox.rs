//! Bbox refinement: ground each extracted value to the boxes of the words it was
//! read from, as the union box on the page of its first word, and to how
//! sure its reading is: the extractor's own confidence when it gives one
//! (the rules extractor's combines the words' OCR confidence with how clear
//! its choice among the page's candidates was), else the least confidence
//! among those words (OCR gives one; a text layer's words have none, and
//! are certain). A value less sure than its request's `min_confidence`
//! needs review.

use std::collections::BTreeMap;

use super::ExtractionOutput;
use crate::domain::{Document, GroundedField, Grounding};

/// Grounds every value of `output` in `document`; a value of confidence
/// under `min_confidence` needs review.
pub fn ground(document: &Document, output: &ExtractionOutput, min_confidence: f64) -> Grounding {
    let words = document.words();
    let fields = output
        .fields
        .iter()
        .map(|(name, value)| {
            let grounded = value.as_ref().and_then(|v| {
                let [first, last] = v.words?;
                let page = words.get(first)?.page;
                let on_page = || words.get(first..=last).into_iter().flatten();
                let on_page = || on_page().filter(|w| w.page == page);
                let bbox = on_page().filter_map(|w| w.bbox).reduce(union)?;
                let read = on_page().filter_map(|w| w.confidence).reduce(f64::min);
                let confidence = v.confidence.or(read);
                Some(GroundedField {
                    page,
                    bbox,
                    words: [first, last],
                    confidence,
                    needs_review: confidence.is_some_and(|c| c < min_confidence),
                })
            });
            (name.clone(), grounded)
        })
        .collect::<BTreeMap<_, _>>();
    let needs_review = (fields.values().flatten())
        .filter(|f| f.needs_review)
        .count();
    Grounding {
        fields,
        needs_review,
    }
}

fn union(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
    [
        a[0].min(b[0]),
        a[1].min(b[1]),
        a[2].max(b[2]),
        a[3].max(b[3]),
    ]
}

/// How well two boxes agree: the area they share over the area they cover
/// together (0 for boxes that do not meet or have no area). `docstream
/// eval` counts a box right at 0.5 or more.
pub fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let area = |r: [f64; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let shared = w * h;
    let total = area(a) + area(b) - shared;
    match total > 0.0 {
        true => shared / total,
        false => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::ExtractedValue;

    #[test]
    fn iou_of_boxes_that_meet_apart_or_have_no_area() {
        let a = [0.0, 0.0, 10.0, 10.0];
        assert_eq!(iou(a, a), 1.0);
        assert_eq!(iou(a, [5.0, 0.0, 15.0, 10.0]), 50.0 / 150.0);
        assert_eq!(iou(a, [20.0, 20.0, 30.0, 30.0]), 0.0);
        assert_eq!(iou([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]), 0.0);
    }

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
            confidence: None,
            chosen: None,
        };
        output.fields.insert("total".into(), Some(value));
        output.fields.insert("missing".into(), None);
        let grounding = ground(&document, &output, 0.8);
        let total = grounding.fields["total"].clone().unwrap();
        assert_eq!((total.page, total.bbox), (0, [60.0, 699.0, 130.0, 713.0]));
        assert_eq!((total.confidence, total.needs_review), (None, false));
        assert_eq!(grounding.fields["missing"], None);
        assert_eq!(grounding.needs_review, 0);
    }

    #[test]
    fn a_value_is_as_sure_as_its_least_sure_word_and_needs_review_under_the_threshold() {
        let document: Document = serde_json::from_value(serde_json::json!({"pages": [
            {"width": 1700.0, "height": 2200.0, "words": [
                {"text": "Total", "bbox": [10.0, 700.0, 50.0, 712.0], "confidence": 0.2},
                {"text": "NW-", "bbox": [60.0, 700.0, 90.0, 712.0], "confidence": 0.41},
                {"text": "2026-00417", "bbox": [95.0, 699.0, 130.0, 713.0], "confidence": 0.93}
            ]}
        ]}))
        .unwrap();
        let mut output = ExtractionOutput::default();
        let value = |words| ExtractedValue {
            value: "x".into(),
            raw: None,
            words: Some(words),
            confidence: None,
            chosen: None,
        };
        output.fields.insert("number".into(), Some(value([1, 2])));
        output.fields.insert("sure".into(), Some(value([2, 2])));
        let grounding = ground(&document, &output, 0.8);
        let number = grounding.fields["number"].clone().unwrap();
        assert_eq!((number.confidence, number.needs_review), (Some(0.41), true));
        let sure = grounding.fields["sure"].clone().unwrap();
        assert_eq!((sure.confidence, sure.needs_review), (Some(0.93), false));
        assert_eq!(grounding.needs_review, 1);
        assert_eq!(ground(&document, &output, 0.4).needs_review, 0);
    }
}
