//! A PDF's words read in a process of its own, so reading can be stopped.
//!
//! Parsing a PDF is not cut into steps that could check a deadline (the
//! parser loads, inflates and decodes in calls of its own), and a thread
//! cannot be stopped from outside: a parse that runs long would keep its
//! thread, and its slot of the CPU pool, until it ended. A process can be
//! killed. The worker runs `docstream read-pdf` with the file on its
//! standard input; it answers the words, or why it refused the file, as
//! JSON on its standard output. Dropping [`words`]' future (at the
//! deadline) kills the process.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::{PdfError, PdfLimits};
use crate::domain::Page;

/// The command line of `docstream read-pdf`: the limits to read under.
#[derive(Debug, Clone, clap::Args)]
pub struct ReadArgs {
    /// Most pages.
    #[arg(long)]
    pub pages: usize,
    /// Most bytes the streams inflate to.
    #[arg(long)]
    pub inflated_bytes: usize,
    /// Most words on a page.
    #[arg(long)]
    pub words_per_page: usize,
    /// Most objects a page's content decodes into.
    #[arg(long)]
    pub content_objects: usize,
}

impl ReadArgs {
    fn of(limits: &PdfLimits) -> Vec<String> {
        let PdfLimits {
            pages,
            inflated_bytes,
            words_per_page,
            content_objects,
        } = *limits;
        [
            ("--pages", pages),
            ("--inflated-bytes", inflated_bytes),
            ("--words-per-page", words_per_page),
            ("--content-objects", content_objects),
        ]
        .iter()
        .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
        .collect()
    }

    fn limits(&self) -> PdfLimits {
        PdfLimits {
            pages: self.pages,
            inflated_bytes: self.inflated_bytes,
            words_per_page: self.words_per_page,
            content_objects: self.content_objects,
        }
    }
}

/// `docstream read-pdf`: reads a PDF from standard input and writes its
/// words, or why it was refused, to standard output.
pub fn read_stdin(args: &ReadArgs) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let mut bytes = Vec::new();
    std::io::stdin().lock().read_to_end(&mut bytes)?;
    let read = super::words(&bytes, &args.limits(), &crate::extract::Deadline::none());
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &read)?;
    out.flush()
}

/// The words of the PDF `bytes`, read by `program read-pdf` under
/// `limits`. The process is killed when the future is dropped. A process
/// that fails (crashes, is killed for its memory) refuses the file.
pub async fn words(
    program: &Path,
    bytes: axum::body::Bytes,
    limits: &PdfLimits,
) -> Result<Vec<Page>, PdfError> {
    let unreadable = |why: String| PdfError::Unreadable(why);
    let mut child = tokio::process::Command::new(program)
        .arg("read-pdf")
        .args(ReadArgs::of(limits))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| PdfError::Reader(format!("{}: {e}", program.display())))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let write = async move {
        // A reader that stops early (a refusal) closes its end: not an error.
        let _ = stdin.write_all(&bytes).await;
    };
    let (_, output) = tokio::join!(write, child.wait_with_output());
    let output = output.map_err(|e| PdfError::Reader(e.to_string()))?;
    if !output.status.success() {
        return Err(unreadable(format!("its reader failed ({})", output.status)));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| unreadable(format!("its reader answered no words ({e})")))?
}
