//! Reading pages that have no text: an uploaded scan or photo, or a PDF
//! page made of an image, read by Tesseract 5 into the same positioned
//! words a text layer gives, each with the engine's confidence.
//!
//! Tesseract runs as a child process (`tesseract stdin stdout --psm 1 …
//! tsv`), not through its library, for four reasons: a crash of the engine
//! (it is C++ over image decoders, fed untrusted bytes) ends that process
//! and fails one attempt, never the worker; a page that runs long is
//! stopped by killing the process at its time limit, which a library call
//! could not be; the engine's memory (about 110 MB a page at 200 dpi) is
//! held to a cap of its own and given back when the page is done, so the
//! worker's footprint does not grow with OCR; and the build needs no C++
//! toolchain. The price is loading the model for every page (about 0.1 s).
//!
//! Each process runs with an empty environment (one thread,
//! `OMP_THREAD_LIMIT=1`, so the CPU pool's slot is the bound), its address
//! space and CPU time capped (`prlimit`), nothing on disk: the image goes
//! in on standard input and the words come out on standard output.
//!
//! Page segmentation mode 1 detects the page's orientation first (the
//! `osd` model), so a page scanned at 90°, 180° or 270° is read upright,
//! and reports every box in the image as it was uploaded. Skew of a few
//! degrees is taken by the engine's line finding.
//!
//! A PDF page without text is rendered by poppler's `pdftoppm` at
//! [`OcrSettings::dpi`] (lower when the page is so large that the pixel cap
//! would be passed), and its boxes are given back in the page's points, as
//! a text layer's are.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use axum::body::Bytes;
use tokio::io::AsyncWriteExt;

use crate::domain::{Page, Word};

/// How OCR runs.
#[derive(Debug, Clone)]
pub struct OcrSettings {
    /// The Tesseract program.
    pub tesseract: PathBuf,
    /// Poppler's `pdftoppm`.
    pub pdftoppm: PathBuf,
    /// Tesseract's languages, `+`-separated (`eng`, `eng+deu`).
    pub languages: String,
    /// Resolution a PDF page is rendered at.
    pub dpi: u32,
    /// Most pixels on a page.
    pub max_pixels: u64,
    /// Longest one page may take.
    pub page_timeout: Duration,
    /// Most bytes of address space the engine may use.
    pub memory_bytes: u64,
    /// Most words on a page.
    pub words_per_page: usize,
}

/// Why a page was not read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OcrError {
    /// The page took longer than its limit: the same page would again.
    #[error("reading {what} by OCR took longer than the limit of {limit_s} s a page (DOCSTREAM_OCR_PAGE_TIMEOUT_S)")]
    TimedOut {
        /// Which page, or the image.
        what: String,
        /// The limit.
        limit_s: f64,
    },
    /// More words than a page may hold.
    #[error("page {page} read by OCR has more than {limit} words (DOCSTREAM_MAX_WORDS_PER_PAGE)")]
    TooManyWords {
        /// The page, from 1.
        page: usize,
        /// The limit.
        limit: usize,
    },
    /// The engine or the renderer failed (crashed, was killed for its
    /// memory, refused the image): this attempt fails.
    #[error("{0}")]
    Failed(String),
    /// A program could not be started: a fault of this machine.
    #[error("{0}")]
    Unavailable(String),
}

impl OcrSettings {
    /// OCR as `settings` configure it.
    pub fn of(settings: &crate::config::Settings) -> Self {
        Self {
            tesseract: PathBuf::from(&settings.ocr_tesseract),
            pdftoppm: PathBuf::from(&settings.ocr_pdftoppm),
            languages: settings.ocr_languages.clone(),
            dpi: settings.ocr_dpi,
            max_pixels: settings.ocr_max_pixels as u64,
            page_timeout: settings.ocr_page_timeout_s.get(),
            memory_bytes: settings.ocr_max_memory_bytes as u64,
            words_per_page: settings.max_words_per_page,
        }
    }

    /// The words of the image `bytes` (a PNG, a JPEG, or a TIFF of `pages`
    /// pages), in its pixels: one [`Page`] per image page.
    pub async fn image(&self, bytes: Bytes, pages: usize) -> Result<Vec<Page>, OcrError> {
        let limit = self.page_timeout * pages.max(1) as u32;
        let what = match pages {
            1 => "the image".to_owned(),
            n => format!("the image's {n} pages"),
        };
        let tsv = self.tesseract(bytes, limit, &what).await?;
        let read = parse_tsv(&tsv, self.words_per_page)?;
        match read.len() {
            0 => Err(OcrError::Failed(
                "the OCR engine read no page of the image".into(),
            )),
            _ => Ok(read),
        }
    }

    /// The words of page `number` (from 1) of the PDF `pdf`, `size` points
    /// wide and high, in those points.
    pub async fn pdf_page(
        &self,
        pdf: Bytes,
        number: usize,
        (width, height): (f64, f64),
    ) -> Result<Page, OcrError> {
        let dpi = self.dpi_for(width, height);
        let what = format!("page {number} of the PDF");
        let png = self.render(pdf, number, dpi).await?;
        let tsv = self.tesseract(Bytes::from(png), self.page_timeout, &what);
        let mut pages = parse_tsv(&tsv.await?, self.words_per_page).map_err(|e| match e {
            OcrError::TooManyWords { limit, .. } => OcrError::TooManyWords {
                page: number,
                limit,
            },
            e => e,
        })?;
        let rendered = pages
            .pop()
            .ok_or_else(|| OcrError::Failed(format!("the OCR engine read nothing of {what}")))?;
        // Pixels at `dpi` back to the page's points.
        let scale = 72.0 / dpi;
        let words = (rendered.words.into_iter())
            .map(|w| Word {
                bbox: w.bbox.map(|v| v * scale),
                ..w
            })
            .collect();
        Ok(Page {
            width,
            height,
            words,
        })
    }

    /// Page `number` (from 1) of the PDF `pdf` as a PNG at `dpi`, rendered
    /// by poppler under the page's limits.
    pub async fn render(&self, pdf: Bytes, number: usize, dpi: f64) -> Result<Vec<u8>, OcrError> {
        let what = format!("page {number} of the PDF");
        let args = [
            "-r".to_owned(),
            format!("{dpi:.2}"),
            "-f".to_owned(),
            number.to_string(),
            "-l".to_owned(),
            number.to_string(),
            "-png".to_owned(),
            "-".to_owned(),
        ];
        let limits = (self.page_timeout, self.memory_bytes);
        match run(&self.pdftoppm, &args, pdf, limits).await {
            Ok(png) if png.is_empty() => Err(OcrError::Failed(format!("{what} does not exist"))),
            Ok(png) => Ok(png),
            Err(Run::TimedOut) => Err(self.timed_out(&what)),
            Err(Run::Failed(why)) => {
                Err(OcrError::Failed(format!("rendering {what} failed: {why}")))
            }
            Err(Run::Unavailable(why)) => Err(OcrError::Unavailable(why)),
        }
    }

    /// The resolution to render a page of `width` × `height` points at: the
    /// configured one, or less when that would pass the pixel cap.
    fn dpi_for(&self, width: f64, height: f64) -> f64 {
        let dpi = f64::from(self.dpi);
        let pixels = (width * dpi / 72.0) * (height * dpi / 72.0);
        match pixels > self.max_pixels as f64 && pixels > 0.0 {
            true => (dpi * (self.max_pixels as f64 / pixels).sqrt())
                .floor()
                .max(1.0),
            false => dpi,
        }
    }

    /// Tesseract's TSV for the image `bytes`, within `limit`.
    async fn tesseract(
        &self,
        bytes: Bytes,
        limit: Duration,
        what: &str,
    ) -> Result<String, OcrError> {
        let args = [
            "stdin",
            "stdout",
            "--psm",
            "1",
            "-l",
            &self.languages,
            "tsv",
        ]
        .map(str::to_owned);
        match run(&self.tesseract, &args, bytes, (limit, self.memory_bytes)).await {
            Ok(tsv) => Ok(String::from_utf8_lossy(&tsv).into_owned()),
            Err(Run::TimedOut) => Err(OcrError::TimedOut {
                what: what.to_owned(),
                limit_s: self.page_timeout.as_secs_f64(),
            }),
            Err(Run::Failed(why)) => Err(OcrError::Failed(format!(
                "the OCR engine failed on {what}: {why}"
            ))),
            Err(Run::Unavailable(why)) => Err(OcrError::Unavailable(why)),
        }
    }

    fn timed_out(&self, what: &str) -> OcrError {
        OcrError::TimedOut {
            what: what.to_owned(),
            limit_s: self.page_timeout.as_secs_f64(),
        }
    }
}

/// How a child process ended, when not well.
enum Run {
    TimedOut,
    Failed(String),
    Unavailable(String),
}

/// Runs `program args` with `input` on its standard input, in an empty
/// environment, its address space and CPU time capped, killed at `limit`
/// (or when the future is dropped). Its standard output.
async fn run(
    program: &Path,
    args: &[String],
    input: Bytes,
    (limit, memory): (Duration, u64),
) -> Result<Vec<u8>, Run> {
    let cpu_s = limit.as_secs().saturating_add(1);
    let mut child = tokio::process::Command::new("prlimit")
        .arg(format!("--as={memory}"))
        .arg(format!("--cpu={cpu_s}"))
        .arg("--")
        .arg(program)
        .args(args)
        .env_clear()
        .env("OMP_THREAD_LIMIT", "1")
        .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
        .envs(std::env::var_os("TESSDATA_PREFIX").map(|p| ("TESSDATA_PREFIX", p)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Run::Unavailable(format!("cannot run {}: {e}", program.display())))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let write = async move {
        // A program that stops reading early (a refusal) closes its end.
        let _ = stdin.write_all(&input).await;
    };
    let ran = async { tokio::join!(write, child.wait_with_output()).1 };
    let output = match tokio::time::timeout(limit, ran).await {
        Ok(output) => output.map_err(|e| Run::Failed(e.to_string()))?,
        Err(_) => return Err(Run::TimedOut),
    };
    if output.status.success() {
        return Ok(output.stdout);
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said = said
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    // prlimit runs the program in its own place: its exit is the program's.
    // Killed for its CPU time, it timed out.
    use std::os::unix::process::ExitStatusExt;
    if output.status.signal() == Some(9) || output.status.signal() == Some(24) {
        return Err(Run::TimedOut);
    }
    if output.status.code() == Some(127) || said.contains("failed to execute") {
        return Err(Run::Unavailable(format!(
            "cannot run {}: {said}",
            program.display()
        )));
    }
    Err(Run::Failed(format!("{} ({said})", output.status)))
}

/// Tesseract's TSV: one [`Page`] per page it read, its size in pixels,
/// its words in reading order with their confidence (0 to 1).
fn parse_tsv(tsv: &str, words_per_page: usize) -> Result<Vec<Page>, OcrError> {
    let mut pages: Vec<Page> = Vec::new();
    for line in tsv.lines().skip(1) {
        let cols: Vec<&str> = line.splitn(12, '\t').collect();
        let [level, _page, _block, _par, _line, _word, left, top, width, height, conf, text] =
            cols[..]
        else {
            continue;
        };
        let number = |s: &str| s.trim().parse::<f64>().ok();
        let (Some(left), Some(top), Some(width), Some(height)) =
            (number(left), number(top), number(width), number(height))
        else {
            continue;
        };
        match level {
            "1" => pages.push(Page {
                width,
                height,
                words: Vec::new(),
            }),
            "5" => {
                let text = text.trim();
                let Some(page) = pages.last_mut().filter(|_| !text.is_empty()) else {
                    continue;
                };
                if page.words.len() == words_per_page {
                    let page = pages.len();
                    return Err(OcrError::TooManyWords {
                        page,
                        limit: words_per_page,
                    });
                }
                let confidence = number(conf).map(|c| (c / 100.0).clamp(0.0, 1.0));
                page.words.push(Word {
                    text: text.to_owned(),
                    bbox: [left, top, left + width, top + height],
                    confidence,
                });
            }
            _ => {}
        }
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsv_becomes_pages_of_words_with_their_confidence() {
        let tsv = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n\
            1\t1\t0\t0\t0\t0\t0\t0\t1700\t2200\t-1\t\n\
            4\t1\t1\t1\t1\t0\t135\t157\t496\t26\t-1\t\n\
            5\t1\t1\t1\t1\t1\t135\t157\t146\t20\t96.363174\tNorthwind\n\
            5\t1\t1\t1\t1\t2\t301\t157\t97\t20\t41.5\tOffice\n\
            5\t1\t1\t1\t1\t3\t400\t157\t10\t20\t95\t \n\
            1\t2\t0\t0\t0\t0\t0\t0\t2200\t1700\t-1\t\n\
            5\t2\t1\t1\t1\t1\t202\t1069\t26\t112\t96.779678\tHamburg\n";
        let pages = parse_tsv(tsv, 10).unwrap();
        assert_eq!(pages.len(), 2);
        assert_eq!((pages[0].width, pages[0].height), (1700.0, 2200.0));
        let words: Vec<_> = pages[0].words.iter().map(|w| w.text.as_str()).collect();
        assert_eq!(words, ["Northwind", "Office"]);
        assert_eq!(pages[0].words[1].bbox, [301.0, 157.0, 398.0, 177.0]);
        assert_eq!(pages[0].words[1].confidence, Some(0.415));
        assert_eq!(pages[1].words[0].bbox, [202.0, 1069.0, 228.0, 1181.0]);
        let refused = parse_tsv(tsv, 1);
        assert_eq!(refused, Err(OcrError::TooManyWords { page: 1, limit: 1 }));
    }

    #[test]
    fn a_page_too_large_for_the_pixel_cap_is_rendered_at_a_lower_resolution() {
        let settings = OcrSettings {
            tesseract: "tesseract".into(),
            pdftoppm: "pdftoppm".into(),
            languages: "eng".into(),
            dpi: 300,
            max_pixels: 10_000_000,
            page_timeout: Duration::from_secs(1),
            memory_bytes: 1 << 30,
            words_per_page: 10,
        };
        // A4-ish letter: 8.4 megapixels at 300 dpi.
        assert_eq!(settings.dpi_for(612.0, 792.0), 300.0);
        // A poster, 100 inches square: far past the cap at 300 dpi.
        let dpi = settings.dpi_for(7200.0, 7200.0);
        assert!(dpi < 32.0 && (dpi * 100.0).powi(2) <= 10_000_000.0, "{dpi}");
    }
}
