//! A PDF's words read in a process of its own, so reading can be stopped.
//!
//! Parsing a PDF is not cut into steps that could check a deadline (the
//! parser loads, inflates and decodes in calls of its own), and a thread
//! cannot be stopped from outside: a parse that runs long would keep its
//! thread, and its slot of the CPU pool, until it ended. A process can be
//! killed. The worker runs `docstream read-pdf` with the file on its
//! standard input; it answers the words, or why it refused the file, as
//! JSON on its standard output. Dropping [`words`]' future (at the
//! deadline) kills the process. It runs as every child that reads a file
//! does ([`crate::files::child`]): no environment of the worker's (its
//! database URL, its secrets), a temporary folder of its own, its memory,
//! time and output capped.

use std::path::PathBuf;
use std::time::Duration;

use super::{PdfError, PdfLimits};
use crate::domain::Page;
use crate::files::child::{self, Caps, Run};

/// The program PDFs are read with, and what it may take.
#[derive(Debug, Clone)]
pub struct Reader {
    /// Run as `<program> read-pdf`.
    pub program: PathBuf,
    /// Most bytes of address space it may use.
    pub memory: u64,
}

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
    reader: &Reader,
    bytes: axum::body::Bytes,
    limits: &PdfLimits,
    time: Duration,
) -> Result<Vec<Page>, PdfError> {
    let unreadable = |why: String| PdfError::Unreadable(why);
    let mut args = vec!["read-pdf".to_owned()];
    args.extend(ReadArgs::of(limits));
    // Every word as JSON (its text, box and confidence: well under 256
    // bytes) on every page the limits allow, and a megabyte.
    let words = limits.pages.saturating_mul(limits.words_per_page);
    let caps = Caps {
        time,
        memory: reader.memory,
        output: words.saturating_mul(256).saturating_add(1 << 20),
    };
    let env = [("RUST_BACKTRACE", "0".into())];
    match child::run(&reader.program, &args, &env, bytes, caps).await {
        Ok(out) => serde_json::from_slice(&out)
            .map_err(|e| unreadable(format!("its reader answered no words ({e})")))?,
        Err(Run::Unavailable(why)) => Err(PdfError::Reader(why)),
        Err(Run::TimedOut) => Err(PdfError::Deadline),
        Err(Run::TooMuchOutput(cap)) => Err(unreadable(format!(
            "its reader answered more than {cap} bytes"
        ))),
        Err(Run::Failed(why)) => Err(unreadable(format!("its reader failed: {why}"))),
    }
}
