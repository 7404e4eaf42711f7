//! Scans made from the shipped PDFs, as a scanner would give them.

use std::io::Write;
use std::process::{Command, Stdio};

/// The first page of `pdf` rendered by poppler at `dpi`, as `format`
/// (`png`, `jpeg`, or `gray`: a PGM of 8-bit grey).
pub fn render(pdf: &[u8], dpi: u32, format: &str) -> Vec<u8> {
    let mut child = Command::new("pdftoppm")
        .args(["-r", &dpi.to_string(), "-f", "1", "-l", "1"])
        .args([&format!("-{format}"), "-singlefile", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("pdftoppm (poppler-utils, which scripts/test.sh installs)");
    let mut stdin = child.stdin.take().unwrap();
    let pdf = pdf.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&pdf));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success(), "pdftoppm failed");
    output.stdout
}
