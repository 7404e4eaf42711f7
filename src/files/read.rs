//! Reading a file into the document a JSON submit carries: a PDF's text
//! layer page by page, a text file's text, and every page without text (an
//! image, a PDF page made of one) read by OCR, its words with their
//! confidence. Also a page drawn as an image for people (the console).

use axum::body::Bytes;
use uuid::Uuid;

use super::drawn::DRAWN_DPI;
use super::image::{self, ImageLimits};
use super::ocr::{OcrError, OcrSettings};
use super::pdf::{self, PdfError, PdfLimits};
use super::{text_within, FileError, FileType, Files};
use crate::config::Settings;
use crate::domain::Document;
use crate::extract::{Deadline, ExtractError};

impl Files {
    /// Page `index` (from 0) of tenant `tenant`'s file `id` as an image a
    /// browser draws, and its media type: a PNG's own bytes, a JPEG's
    /// without the EXIF that would turn it (OCR's boxes are on its pixels
    /// as stored), a PDF page drawn as a PNG ([`super::drawn`]). A TIFF is
    /// not drawn: browsers do not read it.
    pub async fn page_image(
        &self,
        tenant: Uuid,
        id: &str,
        index: usize,
    ) -> Result<(&'static str, Bytes), FileError> {
        let file = self.get(tenant, id).await?;
        let kind = file
            .ok_or_else(|| FileError::Missing(id.to_owned()))?
            .content_type;
        match kind {
            FileType::Png | FileType::Jpeg if index > 0 => Err(FileError::NoPage(index)),
            FileType::Png => Ok((kind.as_str(), self.read(tenant, id).await?.1)),
            FileType::Jpeg => {
                let (_, bytes) = self.read(tenant, id).await?;
                Ok((kind.as_str(), image::without_exif(bytes)))
            }
            FileType::Pdf => {
                let png = self.pdf_page_image(tenant, id, index).await?;
                Ok((FileType::Png.as_str(), png))
            }
            FileType::Tiff | FileType::Text => Err(FileError::NotDrawn(format!(
                "a {} file is not drawn as an image (browsers do not read it)",
                kind.as_str()
            ))),
        }
    }

    /// Page `index` of the PDF `id` as a PNG: kept from an earlier request,
    /// or drawn now in a slot of this process's (refused when none is
    /// free), on a task of its own that keeps what it drew.
    async fn pdf_page_image(
        &self,
        tenant: Uuid,
        id: &str,
        index: usize,
    ) -> Result<Bytes, FileError> {
        let key = (tenant, id.to_owned(), index);
        let drawings = &self.0.drawings;
        if let Some(png) = drawings.cached(&key) {
            return Ok(png);
        }
        let slot = drawings.slot()?;
        let files = self.clone();
        let drawn = tokio::spawn(async move {
            let _slot = slot;
            let png = files.draw_pdf_page(tenant, &key.1, index).await?;
            files.0.drawings.keep(key, png.clone());
            Ok(png)
        });
        let drawn = drawn.await;
        drawn.map_err(|e| FileError::NotNow(format!("drawing the page failed: {e}")))?
    }

    /// Renders page `index` of tenant `tenant`'s PDF `id`, checked as an
    /// upload is, at [`DRAWN_DPI`] or lower to stay within the pixel cap.
    async fn draw_pdf_page(
        &self,
        tenant: Uuid,
        id: &str,
        index: usize,
    ) -> Result<Bytes, FileError> {
        let (_, bytes) = self.read(tenant, id).await?;
        let (pdf, limits) = (bytes.clone(), self.0.read.pdf);
        let sized = tokio::task::spawn_blocking(move || pdf::page_sizes(&pdf, &limits)).await;
        let sizes = sized.map_err(|e| PdfError::Unreadable(e.to_string()))??;
        let &(width, height) = sizes.get(index).ok_or(FileError::NoPage(index))?;
        let ocr = &self.0.ocr;
        let dpi = ocr.dpi_within(DRAWN_DPI, width, height);
        let pixels = (width * dpi / 72.0) * (height * dpi / 72.0);
        if pixels > ocr.max_pixels as f64 {
            return Err(FileError::NotDrawn(format!(
                "page {index} is {width} × {height} points, too large to draw within {} pixels \
                 (DOCSTREAM_OCR_MAX_PIXELS)",
                ocr.max_pixels
            )));
        }
        let most = (pixels_of(width, dpi), pixels_of(height, dpi));
        let png = ocr.render(bytes, index + 1, dpi, Some(most)).await;
        let png = png.map_err(|e| match e {
            // The machine's, not the page's: another try may draw it.
            OcrError::Unavailable(_) | OcrError::TimedOut { .. } => {
                FileError::NotNow(e.to_string())
            }
            e => FileError::NotDrawn(e.to_string()),
        })?;
        Ok(Bytes::from(png))
    }
}

/// Pixels across `points` at `dpi`, and one for rounding.
fn pixels_of(points: f64, dpi: f64) -> u64 {
    (points * dpi / 72.0).ceil() as u64 + 1
}

/// What a file may hold to be read as a document.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// What a PDF may hold.
    pub pdf: PdfLimits,
    /// Most words of a text file, as of a text document.
    pub text_words: usize,
    /// What an image may be.
    pub image: ImageLimits,
}

impl ReadLimits {
    /// The limits `settings` set.
    pub fn of(settings: &Settings) -> Self {
        Self {
            pdf: PdfLimits {
                pages: settings.max_pages,
                inflated_bytes: settings.file_max_inflated_bytes,
                words_per_page: settings.max_words_per_page,
                content_objects: settings.file_max_content_objects,
            },
            text_words: settings.max_text_words,
            image: ImageLimits {
                pixels: settings.ocr_max_pixels as u64,
                side: settings.ocr_max_side_pixels as u64,
                pages: settings.max_pages,
            },
        }
    }
}

/// What a document with no words needs when OCR is off.
const OCR: &str = "OCR is off in this deployment (DOCSTREAM_OCR_TESSERACT is empty): \
    turn it on, or use an extractor that does OCR (an external extractor of the settings)";

/// A file read as far as it can be without OCR: its document, and the
/// pages of it still to read by OCR.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// What was read: a PDF's pages (empty where they have no text), a
    /// text file's text; no pages yet for an image.
    pub document: Document,
    /// What OCR is to read.
    pub scans: Vec<Scan>,
}

/// A page of a file to read by OCR.
#[derive(Debug, Clone, PartialEq)]
pub enum Scan {
    /// A page of an image (a TIFF may have several).
    ImagePage {
        /// What the image is.
        kind: FileType,
        /// From 0.
        index: usize,
        /// Its size in pixels.
        size: (u64, u64),
    },
    /// A PDF page without text: its index, and its size in points.
    PdfPage {
        /// From 0.
        index: usize,
        /// Width and height.
        size: (f64, f64),
    },
}

impl Reading {
    /// The document once every scan is read, or why it cannot be: OCR is
    /// off and nothing but scans is there, or nothing has words.
    fn finish(self, ocr_on: bool) -> Result<Document, ExtractError> {
        let words = (self.document.pages.iter().flatten()).any(|p| !p.words.is_empty());
        let text = self.document.text.is_some();
        match (words || text, self.scans.first()) {
            (true, _) => Ok(self.document),
            (false, Some(Scan::ImagePage { .. })) if !ocr_on => Err(refused(format!(
                "the file is an image, which has no text layer: {OCR}"
            ))),
            (false, Some(_)) if !ocr_on => Err(refused(format!(
                "the PDF has no text layer (a scan?): {OCR}"
            ))),
            (false, _) => Err(refused("OCR found no text in the file".into())),
        }
    }
}

/// The refusal of a job whose pages took longer by OCR, together, than
/// `limit` allows.
pub fn ocr_budget_spent(limit: std::time::Duration) -> ExtractError {
    refused(format!(
        "reading the file's pages by OCR took longer than the limit of {} s a job \
         (DOCSTREAM_OCR_JOB_TIMEOUT_S)",
        limit.as_secs_f64()
    ))
}

/// A refusal of the file by the built-in reading.
fn refused(message: String) -> ExtractError {
    ExtractError::Refused {
        extractor: crate::domain::RULES_EXTRACTOR.to_owned(),
        message,
    }
}

/// The document a file of kind `kind` holds as far as it can be read
/// without OCR ([`Reading`]): a PDF's text layer, a text file's text; an
/// image is all scan. A text file past the word limit is too long, and
/// fails for good. CPU-bound: run it on the CPU pool.
pub fn document(
    kind: FileType,
    bytes: &[u8],
    limits: &ReadLimits,
    deadline: &Deadline,
) -> Result<Reading, ExtractError> {
    match kind {
        FileType::Pdf => pdf_reading(pdf::words(bytes, &limits.pdf, deadline), deadline),
        FileType::Text => {
            text_within(bytes, limits.text_words).map_err(|e| refused(e.to_string()))?;
            let text = String::from_utf8_lossy(bytes).into_owned();
            match text.trim().is_empty() {
                true => Err(refused("the text file holds no words".into())),
                false => Ok(Reading {
                    document: Document {
                        text: Some(text),
                        ..Document::default()
                    },
                    scans: Vec::new(),
                }),
            }
        }
        image => {
            let pages = image::pages(image, bytes, &limits.image);
            let pages = pages.map_err(|e| refused(e.to_string()))?;
            let blank = |&(width, height): &(u64, u64)| crate::domain::Page {
                width: width as f64,
                height: height as f64,
                words: Vec::new(),
            };
            let scans = (pages.iter().enumerate())
                .map(|(index, &size)| Scan::ImagePage {
                    kind: image,
                    index,
                    size,
                })
                .collect();
            Ok(Reading {
                document: Document {
                    pages: Some(pages.iter().map(blank).collect()),
                    ..Document::default()
                },
                scans,
            })
        }
    }
}

/// [`document`], a PDF read in a process of its own (`reader`, see
/// [`pdf::apart`]) that dropping the future kills: run it on the CPU pool
/// with [`crate::extract::CpuPool::run_apart`], which drops it at the
/// deadline and frees its slot.
pub async fn document_apart(
    reader: &pdf::apart::Reader,
    kind: FileType,
    bytes: Bytes,
    limits: &ReadLimits,
    deadline: &Deadline,
) -> Result<Reading, ExtractError> {
    match kind {
        FileType::Pdf => {
            // Killed at the deadline by the caller; never alive past a day.
            let time = deadline
                .left()
                .unwrap_or(std::time::Duration::from_secs(86_400));
            let read = pdf::apart::words(reader, bytes, &limits.pdf, time).await;
            pdf_reading(read, deadline)
        }
        other => document(other, &bytes, limits, deadline),
    }
}

/// Reads `scan` of the file `bytes` by OCR into `reading`'s document. A
/// page the engine or its helpers failed on (a crash, its memory cap, a
/// policy refusal, no image found), or past its time or word limit, fails
/// the job for good: the same page would fail again. Only a program that
/// could not be started fails the attempt, to be retried.
pub async fn read_scan(
    ocr: &OcrSettings,
    bytes: Bytes,
    scan: &Scan,
    reading: &mut Reading,
) -> Result<(), ExtractError> {
    let (read, index) = match *scan {
        Scan::ImagePage { kind, index, size } => {
            (ocr.image_page(bytes, kind, index, size).await, index)
        }
        Scan::PdfPage { index, size } => (ocr.pdf_page(bytes, index + 1, size).await, index),
    };
    let page = read.map_err(|e| match e {
        OcrError::TimedOut { .. } | OcrError::TooManyWords { .. } | OcrError::Failed(_) => {
            refused(e.to_string())
        }
        OcrError::Unavailable(why) => ExtractError::Unavailable(why),
    })?;
    // The page's place was kept for it, blank.
    let pages = reading.document.pages.get_or_insert_with(Vec::new);
    if let Some(slot) = pages.get_mut(index) {
        *slot = page;
    }
    Ok(())
}

/// The whole document of the file `bytes` of kind `kind`, every page
/// without text read by `ocr` (if any) one after the other, with no
/// deadline: for a reader of its own (the reference provider), not the
/// worker, which bounds each step on its CPU pool.
pub async fn read_all(
    kind: FileType,
    bytes: Bytes,
    limits: &ReadLimits,
    ocr: Option<&OcrSettings>,
) -> Result<Document, ExtractError> {
    let (file, limits) = (bytes.clone(), *limits);
    let read =
        tokio::task::spawn_blocking(move || document(kind, &file, &limits, &Deadline::none()));
    let reading = read.await.map_err(|e| {
        ExtractError::Unavailable(format!("reading the file failed unexpectedly: {e}"))
    })??;
    let run = |scan: Scan, mut reading: Reading| {
        let bytes = bytes.clone();
        async move {
            let ocr = ocr.expect("scans are read only with OCR on");
            read_scan(ocr, bytes, &scan, &mut reading).await?;
            Ok(reading)
        }
    };
    reading.read_scans(ocr, run).await
}

impl Reading {
    /// The document, every scan read by `ocr` if there is one: each scan
    /// run by `run` (which bounds it, in the worker on the CPU pool).
    pub async fn read_scans<F, Fut>(
        mut self,
        ocr: Option<&OcrSettings>,
        run: F,
    ) -> Result<Document, ExtractError>
    where
        F: Fn(Scan, Reading) -> Fut,
        Fut: std::future::Future<Output = Result<Reading, ExtractError>>,
    {
        if ocr.is_none() || self.scans.is_empty() {
            return self.finish(ocr.is_some());
        }
        for scan in std::mem::take(&mut self.scans) {
            self = run(scan, self).await?;
        }
        self.finish(true)
    }
}

/// The reading of a PDF whose words were `read`: its pages without words
/// are scans.
fn pdf_reading(
    read: Result<Vec<crate::domain::Page>, PdfError>,
    deadline: &Deadline,
) -> Result<Reading, ExtractError> {
    let pages = read.map_err(|e| match e {
        PdfError::Deadline => deadline.exceeded(),
        PdfError::Reader(why) => ExtractError::Unavailable(why),
        e => refused(e.to_string()),
    })?;
    let scans = (pages.iter().enumerate())
        .filter(|(_, p)| p.words.is_empty())
        .map(|(index, p)| Scan::PdfPage {
            index,
            size: (p.width, p.height),
        })
        .collect();
    Ok(Reading {
        document: Document {
            pages: Some(pages),
            ..Document::default()
        },
        scans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_file_past_the_word_limit_is_not_read() {
        let limits = ReadLimits {
            pdf: PdfLimits {
                pages: 1,
                inflated_bytes: 1,
                words_per_page: 1,
                content_objects: 1,
            },
            text_words: 3,
            image: ImageLimits {
                pixels: 1,
                side: 1,
                pages: 1,
            },
        };
        let read = |text: &str| {
            let read = document(FileType::Text, text.as_bytes(), &limits, &Deadline::none());
            read.and_then(|reading| reading.finish(false))
        };
        assert!(read("one two\nthree").is_ok());
        let refused = read("one two three four").unwrap_err().to_string();
        assert!(refused.contains("DOCSTREAM_MAX_TEXT_WORDS"), "{refused}");
    }
}
