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
//! Each process runs as every child that reads a file does ([`child`]): an
//! empty environment but for one thread (`OMP_THREAD_LIMIT=1`, so the CPU
//! pool's slot is the bound), a temporary folder of its own, its address
//! space, CPU time and output capped; the image goes in on standard input
//! and the words come out on standard output. A page (and every process it
//! takes) is stopped at its time limit.
//!
//! Each page is read on its own (a TIFF's too), in three steps:
//! ImageMagick prepares it (grey; a 3 × 3 median against speckle, which
//! otherwise costs a noisy scan a third of its fields; turned upright when
//! `-deskew` measures a skew of 0.3° to 15°, since at 5° the engine misreads
//! digits and drops lines); Tesseract reads it in page segmentation mode 1,
//! which detects the orientation first (the `osd` model), so a page scanned
//! at 90°, 180° or 270° is read upright and reported in the image as it
//! came; and each box is turned back onto the page as it was uploaded.
//!
//! A PDF page without text is rendered by poppler's `pdftoppm` at
//! [`OcrSettings::dpi`] (lower when the page is so large that the pixel cap
//! would be passed), and its boxes are given back in the page's points, as
//! a text layer's are.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use axum::body::Bytes;

use super::child::{self, Caps, Run};
use super::FileType;
use crate::domain::{Page, Word};

/// The least skew a page is turned upright for, in degrees: less, the
/// engine's line finding takes it, and turning would only blur the page.
pub const MIN_SKEW_DEG: f64 = 0.3;

/// Pages whose shorter side has fewer pixels are enlarged before they are
/// read ([`OcrSettings::enlargement`]).
pub const SMALL_SIDE_PX: f64 = 1400.0;

/// The most a page is enlarged: on the development receipts, 1.5 read
/// more totals and dates than 2 (which also costs twice the time).
pub const MAX_ENLARGEMENT: f64 = 1.5;

/// Page segmentation mode 1: the engine finds the page's blocks and lines,
/// after detecting its orientation.
const LAYOUT_PSM: &str = "1";

/// Mode 11, sparse text: as many words as it can find, in no order. Read
/// when mode 1 finds no text at all (a photo whose layout analysis found
/// no block).
const SPARSE_PSM: &str = "11";

/// The most skew a page is turned upright for, in degrees: more is not a
/// page fed askew but one on its side, which the engine's orientation
/// detection turns.
pub const MAX_SKEW_DEG: f64 = 15.0;

/// How OCR runs.
#[derive(Debug, Clone)]
pub struct OcrSettings {
    /// The Tesseract program.
    pub tesseract: PathBuf,
    /// Poppler's `pdftoppm`.
    pub pdftoppm: PathBuf,
    /// ImageMagick's `convert`, which prepares a page for the engine
    /// (grey, despeckled, straightened); empty: pages go as they are.
    pub convert: PathBuf,
    /// Tesseract's languages, `+`-separated (`eng`, `eng+deu`).
    pub languages: String,
    /// Resolution a PDF page is rendered at.
    pub dpi: u32,
    /// Most pixels on a page.
    pub max_pixels: u64,
    /// Most pixels across or down a page.
    pub max_side: u64,
    /// Longest one page may take.
    pub page_timeout: Duration,
    /// Longest all the pages of one job may take together.
    pub job_timeout: Duration,
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
    /// The engine or the renderer failed on the page (crashed, was killed
    /// for its memory, refused the image, found none): the same page would
    /// fail again, so the job fails for good.
    #[error("{0}")]
    Failed(String),
    /// A program could not be started: a fault of this machine, which a
    /// later attempt (on another) may not meet.
    #[error("{0}")]
    Unavailable(String),
}

impl OcrSettings {
    /// OCR as `settings` configure it.
    pub fn of(settings: &crate::config::Settings) -> Self {
        Self {
            tesseract: PathBuf::from(&settings.ocr_tesseract),
            pdftoppm: PathBuf::from(&settings.ocr_pdftoppm),
            convert: PathBuf::from(&settings.ocr_convert),
            languages: settings.ocr_languages.clone(),
            dpi: settings.ocr_dpi,
            max_pixels: settings.ocr_max_pixels as u64,
            max_side: settings.ocr_max_side_pixels as u64,
            page_timeout: settings.ocr_page_timeout_s.get(),
            job_timeout: settings.ocr_job_timeout_s.get(),
            memory_bytes: settings.ocr_max_memory_bytes as u64,
            words_per_page: settings.max_words_per_page,
        }
    }

    /// The words of page `index` (from 0) of the image `bytes`, of kind
    /// `kind` (a PNG, a JPEG, a TIFF), `size` pixels wide and high: in
    /// those pixels.
    pub async fn image_page(
        &self,
        bytes: Bytes,
        kind: FileType,
        index: usize,
        size: (u64, u64),
    ) -> Result<Page, OcrError> {
        let what = format!("page {} of the image", index + 1);
        let coder = match kind {
            FileType::Png => "png",
            FileType::Jpeg => "jpeg",
            _ => "tiff",
        };
        let before = (size.0 as f64, size.1 as f64);
        let read = self.read_page(bytes, (coder, index, before), &what, index + 1);
        let page = self.within_page_time(read, &what).await?;
        let (width, height) = (size.0 as f64, size.1 as f64);
        Ok(Page {
            width,
            height,
            words: page,
        })
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
        let read = async {
            let png = self.render(pdf, number, dpi, None).await?;
            let size = super::image::png_size(&png).unwrap_or_default();
            let before = (size.0 as f64, size.1 as f64);
            self.read_page(Bytes::from(png), ("png", 0, before), &what, number)
                .await
        };
        let words = self.within_page_time(read, &what).await?;
        // Pixels at `dpi` back to the page's points.
        let scale = 72.0 / dpi;
        let words = (words.into_iter())
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

    /// `read`, stopped (its processes killed) past the time a page may take.
    async fn within_page_time<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, OcrError>>,
        what: &str,
    ) -> Result<T, OcrError> {
        match tokio::time::timeout(self.page_timeout, read).await {
            Ok(read) => read,
            Err(_) => Err(self.timed_out(what)),
        }
    }

    /// The words of frame `index` of the image `bytes` (read with
    /// ImageMagick's `coder`, its size in pixels `before`), in its pixels: the frame prepared (grey, a
    /// median filter against speckle, straightened), read by Tesseract,
    /// and each box mapped back onto the frame as it was. `number` names
    /// the page in a refusal.
    async fn read_page(
        &self,
        bytes: Bytes,
        frame: (&str, usize, (f64, f64)),
        what: &str,
        number: usize,
    ) -> Result<Vec<Word>, OcrError> {
        let prepared = self.prepare(bytes, frame, what).await?;
        let png = Bytes::from(prepared.png);
        let mut page = self.words_of(png.clone(), LAYOUT_PSM, what, number).await?;
        if page.words.is_empty() {
            page = self.words_of(png, SPARSE_PSM, what, number).await?;
        }
        let (straightened, scale) = (prepared.straightened, prepared.scale);
        let words = (page.words.into_iter())
            .map(|w| Word {
                bbox: straightened
                    .map_or(w.bbox, |turn| turn.back(w.bbox))
                    .map(|v| v / scale),
                ..w
            })
            .collect();
        Ok(words)
    }

    /// The words Tesseract reads on the prepared page `png` in page
    /// segmentation mode `psm`.
    async fn words_of(
        &self,
        png: Bytes,
        psm: &str,
        what: &str,
        number: usize,
    ) -> Result<Page, OcrError> {
        let tsv = self.tesseract(png, psm, what).await?;
        let mut pages = parse_tsv(&tsv, self.words_per_page).map_err(|e| match e {
            OcrError::TooManyWords { limit, .. } => OcrError::TooManyWords {
                page: number,
                limit,
            },
            e => e,
        })?;
        pages
            .pop()
            .ok_or_else(|| OcrError::Failed(format!("the OCR engine read nothing of {what}")))
    }

    /// How much a page of `width` × `height` pixels is enlarged before it
    /// is read: print on a narrow page (a receipt photographed or scanned
    /// at 460 to 900 pixels across) is too small for the engine, which
    /// reads best at 20 pixels or more a letter. A page whose shorter side
    /// is under [`SMALL_SIDE_PX`] is enlarged towards it, by at most
    /// [`MAX_ENLARGEMENT`], and never past the pixel caps.
    fn enlargement(&self, width: f64, height: f64) -> f64 {
        let short = width.min(height).max(1.0);
        let wanted = (SMALL_SIDE_PX / short).clamp(1.0, MAX_ENLARGEMENT);
        let by_pixels = (self.max_pixels as f64 / (width * height).max(1.0)).sqrt();
        let by_side = self.max_side as f64 / width.max(height).max(1.0);
        wanted.min(by_pixels).min(by_side).max(1.0)
    }

    /// Frame `index` of the image `bytes` made ready for the engine by
    /// ImageMagick: grey, speckle filtered out (a 3 × 3 median), and turned
    /// upright when it is skewed by [`MIN_SKEW_DEG`] to [`MAX_SKEW_DEG`]
    /// (the skew `-deskew` measures on a quarter-size copy: a fifth of the
    /// time, within 0.2°). Without ImageMagick (`DOCSTREAM_OCR_CONVERT`
    /// empty), the frame as it is.
    async fn prepare(
        &self,
        bytes: Bytes,
        (coder, index, (width, height)): (&str, usize, (f64, f64)),
        what: &str,
    ) -> Result<Prepared, OcrError> {
        if self.convert.as_os_str().is_empty() {
            return Ok(Prepared {
                png: bytes.to_vec(),
                straightened: None,
                scale: 1.0,
            });
        }
        // The coder named, never guessed from the bytes: ImageMagick reads
        // only the kind the upload was checked as.
        let input = format!("{coder}:-[{index}]");
        let gray = [input.as_str(), "-colorspace", "Gray"];
        let measure = [
            "-sample",
            "25%",
            "-deskew",
            "40%",
            "-format",
            "%[deskew:angle]",
            "info:-",
        ];
        let measured = self
            .convert(bytes.clone(), &[&gray[..], &measure].concat(), what)
            .await?;
        let measured = String::from_utf8_lossy(&measured);
        let Ok(angle) = measured.trim().parse::<f64>() else {
            return Err(OcrError::Failed(format!(
                "preparing {what} for OCR measured no skew ({measured:?})"
            )));
        };
        let turn = (MIN_SKEW_DEG..=MAX_SKEW_DEG).contains(&angle.abs());
        let rotate = format!("{angle:.4}");
        let scale = self.enlargement(width, height);
        // The size ImageMagick gives: each side rounded.
        let (width, height) = ((width * scale).round(), (height * scale).round());
        let resize = format!("{}x{}!", width, height);
        let mut args = gray.to_vec();
        if scale > 1.0 {
            args.extend(["-resize", resize.as_str()]);
        }
        args.extend(["-statistic", "Median", "3x3"]);
        if turn {
            args.extend(["-background", "white", "-rotate", rotate.as_str()]);
        }
        args.push("png:-");
        let png = self.convert(bytes, &args, what).await?;
        let straightened = match turn {
            false => None,
            true => {
                let after = super::image::png_size(&png).ok_or_else(|| {
                    OcrError::Failed(format!("preparing {what} for OCR gave no image"))
                })?;
                Some(Turn {
                    angle,
                    before: (width, height),
                    after: (after.0 as f64, after.1 as f64),
                })
            }
        };
        Ok(Prepared {
            png,
            straightened,
            scale,
        })
    }

    /// What ImageMagick's `convert` writes for `args` on `bytes`.
    async fn convert(&self, bytes: Bytes, args: &[&str], what: &str) -> Result<Vec<u8>, OcrError> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let caps = self.caps(self.image_output());
        match child::run(&self.convert, &args, &self.env(), bytes, caps).await {
            Ok(out) => Ok(out),
            Err(Run::TimedOut) => Err(self.timed_out(what)),
            Err(Run::Unavailable(why)) => Err(OcrError::Unavailable(why)),
            Err(failed) => Err(OcrError::Failed(format!(
                "preparing {what} for OCR failed: {}",
                failed_as(failed)
            ))),
        }
    }

    /// Page `number` (from 1) of the PDF `pdf` as a PNG at `dpi`, rendered
    /// by poppler under the page's limits; cropped to at most `most`
    /// pixels across and down, when given (poppler then draws no more).
    pub async fn render(
        &self,
        pdf: Bytes,
        number: usize,
        dpi: f64,
        most: Option<(u64, u64)>,
    ) -> Result<Vec<u8>, OcrError> {
        let what = format!("page {number} of the PDF");
        let mut args = vec![
            "-r".to_owned(),
            format!("{dpi:.2}"),
            "-f".to_owned(),
            number.to_string(),
            "-l".to_owned(),
            number.to_string(),
        ];
        if let Some((width, height)) = most {
            let crop = [("-x", 0), ("-y", 0), ("-W", width), ("-H", height)];
            args.extend(
                crop.iter()
                    .flat_map(|(flag, v)| [flag.to_string(), v.to_string()]),
            );
        }
        args.extend(["-png".to_owned(), "-".to_owned()]);
        let caps = self.caps(self.image_output());
        match child::run(&self.pdftoppm, &args, &self.env(), pdf, caps).await {
            Ok(png) if png.is_empty() => Err(OcrError::Failed(format!("{what} does not exist"))),
            Ok(png) => Ok(png),
            Err(Run::TimedOut) => Err(self.timed_out(&what)),
            Err(Run::Unavailable(why)) => Err(OcrError::Unavailable(why)),
            Err(failed) => Err(OcrError::Failed(format!(
                "rendering {what} failed: {}",
                failed_as(failed)
            ))),
        }
    }

    /// The resolution to render a page of `width` × `height` points at: the
    /// configured one, or less when that would pass the pixel cap.
    fn dpi_for(&self, width: f64, height: f64) -> f64 {
        self.dpi_within(f64::from(self.dpi), width, height)
    }

    /// The resolution to draw a page of `width` × `height` points at for
    /// people: `dpi`, or less when that would pass the pixel cap OCR reads
    /// pages under.
    pub fn dpi_within(&self, dpi: f64, width: f64, height: f64) -> f64 {
        let pixels = (width * dpi / 72.0) * (height * dpi / 72.0);
        let dpi = match pixels > self.max_pixels as f64 && pixels > 0.0 {
            true => dpi * (self.max_pixels as f64 / pixels).sqrt(),
            false => dpi,
        };
        let side = width.max(height) * dpi / 72.0;
        let dpi = match side > self.max_side as f64 {
            true => dpi * self.max_side as f64 / side,
            false => dpi,
        };
        dpi.floor().max(1.0)
    }

    /// Tesseract's TSV for the image `bytes`, read in page segmentation
    /// mode `psm`.
    async fn tesseract(&self, bytes: Bytes, psm: &str, what: &str) -> Result<String, OcrError> {
        let limit = self.page_timeout;
        let args = [
            "stdin",
            "stdout",
            "--psm",
            psm,
            "-l",
            &self.languages,
            "tsv",
        ]
        .map(str::to_owned);
        // A word's line of TSV is its place, confidence and text: a few
        // hundred bytes at most, with the block, paragraph and line rows.
        let output = self
            .words_per_page
            .saturating_mul(512)
            .saturating_add(1 << 20);
        let caps = Caps {
            time: limit,
            ..self.caps(output)
        };
        match child::run(&self.tesseract, &args, &self.env(), bytes, caps).await {
            Ok(tsv) => Ok(String::from_utf8_lossy(&tsv).into_owned()),
            Err(Run::TimedOut) => Err(OcrError::TimedOut {
                what: what.to_owned(),
                limit_s: self.page_timeout.as_secs_f64(),
            }),
            Err(Run::Unavailable(why)) => Err(OcrError::Unavailable(why)),
            Err(failed) => Err(OcrError::Failed(format!(
                "the OCR engine failed on {what}: {}",
                failed_as(failed)
            ))),
        }
    }

    /// What every OCR child may take: a page's time and the engine's
    /// memory, and `output` bytes of answer.
    fn caps(&self, output: usize) -> Caps {
        Caps {
            time: self.page_timeout,
            memory: self.memory_bytes,
            output,
        }
    }

    /// Most bytes of an image a child may answer: a page within the pixel
    /// cap as a PNG of four bytes a pixel (more than any filter and
    /// compression adds), and a megabyte.
    fn image_output(&self) -> usize {
        let pixels = usize::try_from(self.max_pixels).unwrap_or(usize::MAX);
        pixels.saturating_mul(4).saturating_add(1 << 20)
    }

    /// What an OCR child needs of the environment: one thread each (the
    /// CPU pool's slot is the bound), and where Tesseract's models are
    /// when this process was told.
    fn env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = vec![
            ("OMP_THREAD_LIMIT", OsString::from("1")),
            ("MAGICK_THREAD_LIMIT", OsString::from("1")),
        ];
        env.extend(std::env::var_os("TESSDATA_PREFIX").map(|p| ("TESSDATA_PREFIX", p)));
        env
    }

    fn timed_out(&self, what: &str) -> OcrError {
        OcrError::TimedOut {
            what: what.to_owned(),
            limit_s: self.page_timeout.as_secs_f64(),
        }
    }
}

/// A page made ready for the engine, and how it was turned.
struct Prepared {
    /// The page, a PNG.
    png: Vec<u8>,
    /// How it was turned upright, if it was.
    straightened: Option<Turn>,
    /// How much it was enlarged (1: not at all); the turn is on the
    /// enlarged page.
    scale: f64,
}

/// A page turned `angle` degrees clockwise by ImageMagick's `-rotate`,
/// which grows the canvas to hold the turned page, centred on it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Turn {
    angle: f64,
    /// The page's size before, in pixels.
    before: (f64, f64),
    /// The canvas's after.
    after: (f64, f64),
}

impl Turn {
    /// The box on the page as it was that holds `bbox`, a box on the
    /// turned page: its corners turned back about the centres, within the
    /// page.
    fn back(&self, [x0, y0, x1, y1]: [f64; 4]) -> [f64; 4] {
        let (sin, cos) = self.angle.to_radians().sin_cos();
        let ((w, h), (tw, th)) = (self.before, self.after);
        let back = |(x, y): (f64, f64)| {
            let (dx, dy) = (x - tw / 2.0, y - th / 2.0);
            (
                cos * dx + sin * dy + w / 2.0,
                -sin * dx + cos * dy + h / 2.0,
            )
        };
        let corners = [(x0, y0), (x1, y0), (x0, y1), (x1, y1)].map(back);
        let xs = corners.map(|c| c.0);
        let ys = corners.map(|c| c.1);
        let least = |v: [f64; 4]| v.into_iter().fold(f64::INFINITY, f64::min);
        let most = |v: [f64; 4]| v.into_iter().fold(f64::NEG_INFINITY, f64::max);
        [
            least(xs).clamp(0.0, w),
            least(ys).clamp(0.0, h),
            most(xs).clamp(0.0, w),
            most(ys).clamp(0.0, h),
        ]
    }
}

/// Why a child failed, for a person.
fn failed_as(run: Run) -> String {
    match run {
        Run::Failed(why) | Run::Unavailable(why) => why,
        Run::TooMuchOutput(cap) => format!("it answered more than {cap} bytes"),
        Run::TimedOut => "it ran past its time".to_owned(),
    }
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
    fn a_box_on_the_straightened_page_is_turned_back_onto_the_page_as_it_came() {
        // A 1000 × 600 page turned 5° clockwise onto a canvas that holds it.
        let angle: f64 = 5.0;
        let (sin, cos) = angle.to_radians().sin_cos();
        let (w, h) = (1000.0, 600.0);
        let after = (w * cos + h * sin, w * sin + h * cos);
        let turn = Turn {
            angle,
            before: (w, h),
            after,
        };
        // Where a point of the page lands once turned.
        let turned = |(x, y): (f64, f64)| {
            let (dx, dy) = (x - w / 2.0, y - h / 2.0);
            (
                cos * dx - sin * dy + after.0 / 2.0,
                sin * dx + cos * dy + after.1 / 2.0,
            )
        };
        // A word's box on the page, then the box that holds it turned.
        let word = [400.0, 300.0, 500.0, 320.0];
        let corners = [
            (400.0, 300.0),
            (500.0, 300.0),
            (400.0, 320.0),
            (500.0, 320.0),
        ]
        .map(turned);
        let fold = |f: fn(f64, f64) -> f64, v: [f64; 4], start: f64| v.into_iter().fold(start, f);
        let xs = corners.map(|c| c.0);
        let ys = corners.map(|c| c.1);
        let on_turned = [
            fold(f64::min, xs, f64::INFINITY),
            fold(f64::min, ys, f64::INFINITY),
            fold(f64::max, xs, f64::NEG_INFINITY),
            fold(f64::max, ys, f64::NEG_INFINITY),
        ];
        let back = turn.back(on_turned);
        // The hull of a hull: a little larger, around the same word.
        assert!(back[0] <= word[0] && back[1] <= word[1], "{back:?}");
        assert!(back[2] >= word[2] && back[3] >= word[3], "{back:?}");
        let centre = |b: [f64; 4]| ((b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0);
        let (a, b) = (centre(back), centre(word));
        assert!(
            (a.0 - b.0).abs() < 1e-9 && (a.1 - b.1).abs() < 1e-9,
            "{a:?} vs {b:?}"
        );
        // Near an edge, the box stays on the page.
        let corner = turn.back([0.0, 0.0, 30.0, 30.0]);
        assert!(corner.iter().all(|v| (0.0..=w).contains(v)), "{corner:?}");
    }

    #[test]
    fn a_page_too_large_for_the_pixel_cap_is_rendered_at_a_lower_resolution() {
        let settings = OcrSettings {
            tesseract: "tesseract".into(),
            pdftoppm: "pdftoppm".into(),
            convert: "convert".into(),
            languages: "eng".into(),
            dpi: 300,
            max_pixels: 10_000_000,
            max_side: 16_000,
            page_timeout: Duration::from_secs(1),
            job_timeout: Duration::from_secs(5),
            memory_bytes: 1 << 30,
            words_per_page: 10,
        };
        // A4-ish letter: 8.4 megapixels at 300 dpi.
        assert_eq!(settings.dpi_for(612.0, 792.0), 300.0);
        // A poster, 100 inches square: far past the cap at 300 dpi.
        let dpi = settings.dpi_for(7200.0, 7200.0);
        assert!(dpi < 32.0 && (dpi * 100.0).powi(2) <= 10_000_000.0, "{dpi}");
        // A strip, 120 inches by 1.4: within the pixels, past the side.
        let dpi = settings.dpi_for(8640.0, 100.0);
        assert!(dpi * 120.0 <= 16_000.0, "{dpi}");
    }
}
