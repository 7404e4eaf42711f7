//! The sample documents shipped with docstream: invoices and receipts with OCR
//! word geometry (see `scripts/make_samples.py`), each with its field specs.

use serde::Deserialize;

use docstream::domain::ExtractionRequest;

/// One shipped sample.
#[derive(Debug, Clone, Deserialize)]
pub struct Sample {
    /// File stem, e.g. `invoice-northwind` (the tests' messages name it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: String,
    /// The request the demo submits.
    pub request: ExtractionRequest,
}

const SOURCES: [&str; 4] = [
    include_str!("../../samples/invoice-northwind.json"),
    include_str!("../../samples/invoice-contoso.json"),
    include_str!("../../samples/receipt-bakery.json"),
    include_str!("../../samples/receipt-hardware.json"),
];

/// A sample PDF (`samples/files/`, drawn by `scripts/make_samples.py`) and
/// the request to submit with it, without its document.
pub struct SampleFile {
    /// File stem, e.g. `invoice-northwind`.
    pub name: &'static str,
    /// The PDF.
    pub pdf: &'static [u8],
    /// The request part of its multipart submit.
    pub request: serde_json::Value,
    /// Its pages.
    pub pages: usize,
}

const FILES: [(&str, &[u8], &str); 3] = [
    (
        "invoice-northwind",
        include_bytes!("../../samples/files/invoice-northwind.pdf"),
        include_str!("../../samples/files/invoice-northwind.json"),
    ),
    (
        "invoice-contoso",
        include_bytes!("../../samples/files/invoice-contoso.pdf"),
        include_str!("../../samples/files/invoice-contoso.json"),
    ),
    (
        "receipt-bakery",
        include_bytes!("../../samples/files/receipt-bakery.pdf"),
        include_str!("../../samples/files/receipt-bakery.json"),
    ),
];

/// Every sample PDF with its request.
pub fn sample_files() -> Vec<SampleFile> {
    FILES
        .iter()
        .map(|&(name, pdf, json)| {
            let sample: serde_json::Value =
                serde_json::from_str(json).expect("shipped samples are valid");
            SampleFile {
                name,
                pdf,
                request: sample["request"].clone(),
                pages: sample["pages"].as_array().map_or(1, Vec::len),
            }
        })
        .collect()
}

/// Every sample, parsed.
pub fn sample_requests() -> Vec<Sample> {
    SOURCES
        .iter()
        .map(|s| serde_json::from_str(s).expect("shipped samples are valid"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use docstream::extract::{ground, rule_extract};

    #[test]
    fn every_sample_is_valid_and_yields_every_field_with_a_box() {
        for sample in sample_requests() {
            let limits = docstream::domain::RequestLimits::DEFAULT;
            sample.request.validate(&limits).unwrap();
            let output =
                rule_extract(&sample.request).unwrap_or_else(|e| panic!("{}: {e}", sample.name));
            let grounding = ground(&sample.request.document, &output, 0.8);
            for (field, value) in &output.fields {
                assert!(value.is_some(), "{}: {field} not found", sample.name);
                assert!(
                    grounding.fields[field].is_some(),
                    "{}: {field} has no box",
                    sample.name
                );
            }
        }
    }
}
