//! A PDF's text layer as pages of positioned words: what the built-in rule
//! extractor reads of an uploaded PDF, and what bbox refinement grounds its
//! values in.
//!
//! The text is read by `pdf-extract` (fonts, encodings, the text state), and
//! words are put together here from each character's place. A hostile PDF
//! is held off before it is parsed: every stream the bytes hold is found
//! and inflated under a cap first, through the chain of filters its
//! dictionary names ([`scan`], [`inflate`]), since the parser inflates
//! without one; a page's content cannot reach past the same cap by naming
//! one stream many times; a page's content (and each form it draws) may not
//! decode into more objects than a limit ([`tokens`]), since the parser
//! holds them all; form XObjects may not nest past [`MAX_FORM_DEPTH`] or
//! draw themselves (the parser follows them without a bound); and a panic
//! in the parser is a refusal of the file, not a crash of the worker.
//!
//! A word's box is its glyphs' em boxes: from 0.8 of the font size above the
//! baseline to 0.2 below it, in points from the page's top-left corner.

pub mod apart;
mod inflate;
mod scan;
mod tokens;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pdf_extract::{Document as Pdf, MediaBox, Object, ObjectId, OutputDev, OutputError, Transform};

use crate::domain::{Page, Word};
use crate::extract::Deadline;

/// Deepest nesting of form XObjects a page may draw.
pub const MAX_FORM_DEPTH: usize = 8;

/// What one PDF may hold.
#[derive(Debug, Clone, Copy)]
pub struct PdfLimits {
    /// Most pages.
    pub pages: usize,
    /// Most bytes its streams inflate to, and its pages' content with
    /// them.
    pub inflated_bytes: usize,
    /// Most words on a page.
    pub words_per_page: usize,
    /// Most objects (operators and operands) a page's content, or a form it
    /// draws, may decode into.
    pub content_objects: usize,
}

/// Why a PDF was refused, or had no text to read.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PdfError {
    /// Not a PDF the parser can read.
    #[error("the PDF cannot be read: {0}")]
    Unreadable(String),
    /// More pages than the limit.
    #[error("the PDF has {pages} pages, more than the limit of {limit} (DOCSTREAM_MAX_PAGES)")]
    TooManyPages {
        /// Its pages.
        pages: usize,
        /// The limit.
        limit: usize,
    },
    /// Its streams inflate past the limit: a decompression bomb, or a
    /// document too large to read.
    #[error(
        "the PDF's streams inflate to more than {0} bytes (DOCSTREAM_FILE_MAX_INFLATED_BYTES)"
    )]
    Inflates(usize),
    /// A stream compressed in a way docstream does not inflate under a cap.
    #[error("the PDF has a stream compressed with {0}, which docstream does not read; save it with Flate compression")]
    Filter(String),
    /// A page's content, or a form it draws, decodes into more objects than
    /// the limit: a memory bomb within the inflate cap.
    #[error("page {page} of the PDF draws more than {limit} operators and operands (DOCSTREAM_FILE_MAX_CONTENT_OBJECTS)")]
    TooManyObjects {
        /// The page, from 1.
        page: usize,
        /// The limit.
        limit: usize,
    },
    /// Form XObjects nested too deep, or drawing themselves.
    #[error("the PDF's forms nest deeper than {MAX_FORM_DEPTH} levels or draw themselves")]
    Forms,
    /// A page with more words than the limit.
    #[error("page {page} of the PDF has more than {limit} words (DOCSTREAM_MAX_WORDS_PER_PAGE)")]
    TooManyWords {
        /// The page, from 1.
        page: usize,
        /// The limit.
        limit: usize,
    },
    /// The process that reads PDFs ([`apart`]) could not be run: a fault of
    /// this machine, not of the file.
    #[error("the PDF reader could not be run: {0}")]
    Reader(String),
    /// Reading the text ran past the deadline.
    #[error("reading the PDF's text ran past its deadline")]
    Deadline,
}

/// Checks `bytes` against `limits` before anything else reads them: every
/// stream inflates within the cap, the pages are within theirs, each page's
/// content (its streams with their repeats, and the forms it draws) within
/// the inflate cap too. The number of pages.
pub fn check(bytes: &[u8], limits: &PdfLimits) -> Result<usize, PdfError> {
    checked(bytes, limits).map(|(_, pages)| pages.len())
}

/// [`check`], then the size of each page in points as it is drawn: its
/// media box (the page's own or the nearest ancestor's, times its
/// `UserUnit` when that is more than 1), turned by its `/Rotate`. What a
/// renderer draws of a page is within it (its crop box is clipped to it),
/// so pixels counted from it are a bound on the pixels drawn; a drawing
/// is also cropped to it, in case a renderer reads the page otherwise. A
/// page that names none is US Letter, as poppler draws it.
pub fn page_sizes(bytes: &[u8], limits: &PdfLimits) -> Result<Vec<(f64, f64)>, PdfError> {
    let (pdf, pages) = checked(bytes, limits)?;
    Ok(pages.values().map(|&page| media_size(&pdf, page)).collect())
}

/// The parsed document and its pages, once held to `limits`.
fn checked(
    bytes: &[u8],
    limits: &PdfLimits,
) -> Result<(Pdf, std::collections::BTreeMap<u32, ObjectId>), PdfError> {
    scan::inflate_all(bytes, limits.inflated_bytes)?;
    let pdf = parse(bytes)?;
    let pages = pdf.get_pages();
    if pages.is_empty() {
        return Err(PdfError::Unreadable("it has no pages".into()));
    }
    if pages.len() > limits.pages {
        return Err(PdfError::TooManyPages {
            pages: pages.len(),
            limit: limits.pages,
        });
    }
    let mut content = ContentSize::new(&pdf, limits);
    for (number, &page) in pages.values().enumerate() {
        content.page(number + 1, page)?;
    }
    Ok((pdf, pages))
}

/// How many ancestors a page's inherited attributes are looked for in
/// (the page tree of a real document is a few levels deep; a loop is not
/// followed forever).
const MAX_TREE_DEPTH: usize = 64;

/// Page `page`'s size in points, as [`page_sizes`] describes it.
fn media_size(pdf: &Pdf, page: ObjectId) -> (f64, f64) {
    const LETTER: (f64, f64) = (612.0, 792.0);
    let resolved = |object: &Object| match object {
        Object::Reference(id) => pdf.get_object(*id).ok().cloned(),
        other => Some(other.clone()),
    };
    let number = |object: &Object| match resolved(object)? {
        Object::Integer(n) => Some(n as f64),
        Object::Real(r) => Some(f64::from(r)),
        _ => None,
    };
    let page = pdf.get_dictionary(page).ok();
    // Not inherited; a unit under 1 would make the count smaller than a
    // renderer that ignores it draws.
    let unit = page.and_then(|p| p.get(b"UserUnit").ok()).and_then(number);
    let unit = unit.filter(|u| u.is_finite() && *u > 1.0).unwrap_or(1.0);
    let mut rotate = None;
    let mut size = None;
    let mut at = page;
    for _ in 0..MAX_TREE_DEPTH {
        let Some(dict) = at else { break };
        if rotate.is_none() {
            rotate = dict.get(b"Rotate").ok().and_then(number);
        }
        if size.is_none() {
            let corners = dict.get(b"MediaBox").ok().and_then(resolved);
            let corners = corners.as_ref().and_then(|c| c.as_array().ok());
            let corners: Option<Vec<f64>> = corners.map(|c| c.iter().filter_map(number).collect());
            if let Some([x0, y0, x1, y1]) = corners.as_deref() {
                size = Some(((x1 - x0).abs(), (y1 - y0).abs()));
            }
        }
        if rotate.is_some() && size.is_some() {
            break;
        }
        let parent = dict.get(b"Parent").ok().and_then(|p| p.as_reference().ok());
        at = parent.and_then(|id| pdf.get_dictionary(id).ok());
    }
    let (width, height) = size
        .filter(|(w, h)| w.is_finite() && h.is_finite())
        .unwrap_or(LETTER);
    let quarter_turns = (rotate.unwrap_or(0.0) / 90.0).round().rem_euclid(4.0);
    match quarter_turns == 1.0 || quarter_turns == 3.0 {
        true => (height * unit, width * unit),
        false => (width * unit, height * unit),
    }
}

/// The words of the PDF `bytes`, page by page, once [`check`] passed.
pub fn words(bytes: &[u8], limits: &PdfLimits, deadline: &Deadline) -> Result<Vec<Page>, PdfError> {
    check(bytes, limits)?;
    let pdf = parse(bytes)?;
    let mut words = Words::new(limits.words_per_page, deadline);
    let read = catch_unwind(AssertUnwindSafe(|| {
        pdf_extract::output_doc(&pdf, &mut words)
    }));
    match read {
        Ok(Ok(())) => Ok(words.pages),
        Ok(Err(_)) if words.failed.is_some() => Err(words.failed.unwrap_or(PdfError::Deadline)),
        Ok(Err(e)) => Err(PdfError::Unreadable(e.to_string())),
        Err(panic) => Err(PdfError::Unreadable(panic_message(&panic))),
    }
}

/// The parsed document; a parser panic is an unreadable file.
fn parse(bytes: &[u8]) -> Result<Pdf, PdfError> {
    match catch_unwind(|| Pdf::load_mem(bytes)) {
        Ok(Ok(pdf)) if pdf.is_encrypted() => Err(PdfError::Unreadable("it is encrypted".into())),
        Ok(Ok(pdf)) => Ok(pdf),
        Ok(Err(e)) => Err(PdfError::Unreadable(e.to_string())),
        Err(panic) => Err(PdfError::Unreadable(panic_message(&panic))),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned());
    format!("the parser failed ({})", text.unwrap_or_default())
}

/// The inflated size of what pages draw: their content streams, each as
/// often as it is named, and the forms they draw, followed as the text
/// reader follows them.
struct ContentSize<'a> {
    pdf: &'a Pdf,
    cap: usize,
    total: usize,
    /// Most objects one content stream may decode into.
    content_objects: usize,
    /// The page being measured, from 1.
    page: usize,
    /// Inflated size of each stream measured so far.
    sizes: HashMap<ObjectId, usize>,
}

impl<'a> ContentSize<'a> {
    fn new(pdf: &'a Pdf, limits: &PdfLimits) -> Self {
        Self {
            pdf,
            cap: limits.inflated_bytes,
            total: 0,
            content_objects: limits.content_objects,
            page: 0,
            sizes: HashMap::new(),
        }
    }

    fn page(&mut self, number: usize, page: ObjectId) -> Result<(), PdfError> {
        self.page = number;
        for stream in self.pdf.get_page_contents(page) {
            self.add(stream)?;
        }
        let content = self.pdf.get_page_content(page);
        let content = content.map_err(|e| PdfError::Unreadable(e.to_string()))?;
        let content = self.decode(&content)?;
        let (resources, inherited) = self.pdf.get_page_resources(page).unwrap_or((None, vec![]));
        let mut scopes: Vec<&pdf_extract::Dictionary> = resources.into_iter().collect();
        scopes.extend(
            inherited
                .iter()
                .filter_map(|id| self.pdf.get_dictionary(*id).ok()),
        );
        let mut path = Vec::new();
        self.draws(&content.operations, &scopes, &mut path)
    }

    /// Follows each `Do` of `operations` to the form it names in `scopes`.
    fn draws(
        &mut self,
        operations: &[pdf_extract::content::Operation],
        scopes: &[&'a pdf_extract::Dictionary],
        path: &mut Vec<ObjectId>,
    ) -> Result<(), PdfError> {
        for operation in operations.iter().filter(|o| o.operator == "Do") {
            let Some(name) = operation.operands.first().and_then(|o| o.as_name().ok()) else {
                continue;
            };
            let Some(id) = scopes.iter().find_map(|scope| self.xobject(scope, name)) else {
                continue;
            };
            if path.contains(&id) || path.len() >= MAX_FORM_DEPTH {
                return Err(PdfError::Forms);
            }
            let Ok(form) = self.pdf.get_object(id).and_then(Object::as_stream) else {
                continue;
            };
            let is_form = form.dict.get(b"Subtype").and_then(Object::as_name).ok() == Some(b"Form");
            if !is_form {
                continue;
            }
            self.add(id)?;
            let content = form
                .decompressed_content()
                .unwrap_or_else(|_| form.content.clone());
            let content = match self.decode(&content) {
                Ok(content) => content,
                Err(PdfError::Unreadable(_)) => continue,
                Err(refused) => return Err(refused),
            };
            let own = form.dict.get(b"Resources").ok().and_then(|r| match r {
                Object::Reference(id) => self.pdf.get_dictionary(*id).ok(),
                other => other.as_dict().ok(),
            });
            let mut inner: Vec<&pdf_extract::Dictionary> = own.into_iter().collect();
            inner.extend_from_slice(scopes);
            path.push(id);
            self.draws(&content.operations, &inner, path)?;
            path.pop();
        }
        Ok(())
    }

    /// The object `name` names among `resources`' XObjects.
    fn xobject(&self, resources: &pdf_extract::Dictionary, name: &[u8]) -> Option<ObjectId> {
        let xobjects = match resources.get(b"XObject").ok()? {
            Object::Reference(id) => self.pdf.get_dictionary(*id).ok()?,
            other => other.as_dict().ok()?,
        };
        xobjects.get(name).ok()?.as_reference().ok()
    }

    /// The operations of `content`, once its objects are counted within
    /// the limit (the parser holds them all at once).
    fn decode(&self, content: &[u8]) -> Result<pdf_extract::content::Content, PdfError> {
        let limit = self.content_objects;
        if tokens::count(content, limit) > limit {
            let page = self.page;
            return Err(PdfError::TooManyObjects { page, limit });
        }
        pdf_extract::content::Content::decode(content)
            .map_err(|e| PdfError::Unreadable(e.to_string()))
    }

    /// Counts stream `id` once more, measured under what is left of the
    /// cap before the parser inflates it.
    fn add(&mut self, id: ObjectId) -> Result<(), PdfError> {
        let size = match self.sizes.get(&id) {
            Some(&size) => size,
            None => {
                let room = self.cap - self.total.min(self.cap);
                let size = match self.pdf.get_object(id).and_then(Object::as_stream) {
                    Ok(s) => inflate::measure(&s.content, &inflate::chain_of(&s.dict)?, room)
                        .map_err(|_| PdfError::Inflates(self.cap))?
                        .max(s.content.len()),
                    Err(_) => 0,
                };
                self.sizes.insert(id, size);
                size
            }
        };
        self.total = self.total.saturating_add(size);
        match self.total > self.cap {
            true => Err(PdfError::Inflates(self.cap)),
            false => Ok(()),
        }
    }
}

/// Collects positioned words from the text reader's characters.
struct Words<'d> {
    pages: Vec<Page>,
    /// The page being read: its media box, and its words so far.
    media: MediaBox,
    /// The word being read: its text, box, and where its next character
    /// would start (page space, origin bottom-left).
    word: Option<(String, [f64; 4], (f64, f64))>,
    words_per_page: usize,
    deadline: &'d Deadline,
    characters: usize,
    /// Why reading was stopped, if this collector stopped it.
    failed: Option<PdfError>,
}

impl<'d> Words<'d> {
    fn new(words_per_page: usize, deadline: &'d Deadline) -> Self {
        Self {
            pages: Vec::new(),
            media: MediaBox {
                llx: 0.0,
                lly: 0.0,
                urx: 0.0,
                ury: 0.0,
            },
            word: None,
            words_per_page,
            deadline,
            characters: 0,
            failed: None,
        }
    }

    fn stop(&mut self, why: PdfError) -> OutputError {
        let message = why.to_string();
        self.failed = Some(why);
        OutputError::IoError(std::io::Error::other(message))
    }

    /// Ends the word being read, if any, as a word of the current page.
    fn end(&mut self) -> Result<(), OutputError> {
        let Some((text, [x0, y0, x1, y1], _)) = self.word.take() else {
            return Ok(());
        };
        let limit = self.words_per_page;
        let number = self.pages.len();
        let Some(page) = self.pages.last_mut() else {
            return Ok(());
        };
        if page.words.len() >= limit {
            return Err(self.stop(PdfError::TooManyWords {
                page: number,
                limit,
            }));
        }
        // To the top-left origin of a document's boxes.
        let (left, top) = (self.media.llx, self.media.ury);
        let bbox = [x0 - left, top - y1, x1 - left, top - y0].map(|v| (v * 100.0).round() / 100.0);
        page.words.push(Word {
            text,
            bbox,
            confidence: None,
        });
        Ok(())
    }
}

impl OutputDev for Words<'_> {
    fn begin_page(
        &mut self,
        _page: u32,
        media: &MediaBox,
        _art: Option<(f64, f64, f64, f64)>,
    ) -> Result<(), OutputError> {
        self.media = *media;
        self.pages.push(Page {
            width: (media.urx - media.llx).abs(),
            height: (media.ury - media.lly).abs(),
            words: Vec::new(),
        });
        Ok(())
    }

    fn end_page(&mut self) -> Result<(), OutputError> {
        self.end()
    }

    fn output_character(
        &mut self,
        trm: &Transform,
        width: f64,
        spacing: f64,
        size: f64,
        text: &str,
    ) -> Result<(), OutputError> {
        self.characters += 1;
        if self.characters.is_multiple_of(256) && self.deadline.check().is_err() {
            return Err(self.stop(PdfError::Deadline));
        }
        let text: String = text.chars().filter(|c| !c.is_control()).collect();
        if text.trim().is_empty() {
            return self.end();
        }
        let advance = width * size;
        let corners = [
            (0.0, -0.2 * size),
            (advance, -0.2 * size),
            (0.0, 0.8 * size),
            (advance, 0.8 * size),
        ]
        .map(|(x, y)| apply(trm, x, y));
        let xs = corners.map(|p| p.0);
        let ys = corners.map(|p| p.1);
        let fold = |v: [f64; 4], f: fn(f64, f64) -> f64| v.into_iter().reduce(f).unwrap_or(0.0);
        let bbox = [
            fold(xs, f64::min),
            fold(ys, f64::min),
            fold(xs, f64::max),
            fold(ys, f64::max),
        ];
        if bbox.iter().any(|v| !v.is_finite()) {
            return self.end();
        }
        let origin = apply(trm, 0.0, 0.0);
        let next = apply(trm, advance + spacing, 0.0);
        // The em's height on the page: how far a character may sit from
        // where the last one ended and still continue its word.
        let em = (bbox[3] - bbox[1]).max(bbox[2] - bbox[0]).max(f64::EPSILON);
        let continues = self.word.as_ref().is_some_and(|(_, _, (x, y))| {
            (origin.0 - x).abs() <= 0.15 * em && (origin.1 - y).abs() <= 0.15 * em
        });
        if !continues {
            self.end()?;
        }
        match &mut self.word {
            Some((word, b, end)) => {
                word.push_str(&text);
                *b = [
                    b[0].min(bbox[0]),
                    b[1].min(bbox[1]),
                    b[2].max(bbox[2]),
                    b[3].max(bbox[3]),
                ];
                *end = next;
            }
            None => self.word = Some((text, bbox, next)),
        }
        Ok(())
    }

    fn begin_word(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn end_word(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn end_line(&mut self) -> Result<(), OutputError> {
        self.end()
    }
}

/// Where text-space point (`x`, `y`) lands on the page under `trm`.
fn apply(trm: &Transform, x: f64, y: f64) -> (f64, f64) {
    (
        x * trm.m11 + y * trm.m21 + trm.m31,
        x * trm.m12 + y * trm.m22 + trm.m32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PdfLimits = PdfLimits {
        pages: 10,
        inflated_bytes: 1 << 20,
        words_per_page: 5000,
        content_objects: 100_000,
    };

    #[test]
    fn a_bomb_is_refused_before_it_is_parsed() {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&vec![b' '; 8 << 20]).unwrap();
        let bomb = z.finish().unwrap();
        let mut pdf = b"%PDF-1.4\n1 0 obj\n<< /Length 9 /Filter /FlateDecode >>\nstream\n".to_vec();
        pdf.extend_from_slice(&bomb);
        pdf.extend_from_slice(b"\nendstream\nendobj\n");
        assert_eq!(check(&pdf, &LIMITS), Err(PdfError::Inflates(1 << 20)));
        let lzw = b"%PDF-1.4\n1 0 obj\n<< /Filter /LZWDecode >>\nstream\nxx\nendstream\n";
        assert_eq!(check(lzw, &LIMITS), Err(PdfError::Filter("LZW".into())));
    }

    /// Zlib of `zeros` zero bytes, made without holding them.
    fn zeros_zlib(zeros: usize) -> Vec<u8> {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        let block = vec![0u8; 1 << 20];
        for _ in 0..zeros / block.len() {
            z.write_all(&block).unwrap();
        }
        z.finish().unwrap()
    }

    use super::inflate::tests::{ascii85, zlib};

    /// Zeros a bomb inflates to: 64 times the cap of [`LIMITS`].
    const BOMB: usize = 64 << 20;

    /// The bombs that slipped past the check: a page whose content is a
    /// stream inflating to [`BOMB`] zeros, in each form that was missed.
    fn bypasses() -> Vec<(&'static str, Vec<u8>)> {
        let bomb = zeros_zlib(BOMB);
        let mut raw = b"??".to_vec();
        raw.extend_from_slice(&bomb[2..]);
        let forms: [(&str, &str, Vec<u8>); 5] = [
            (
                "ascii85 over flate",
                "/Filter [/ASCII85Decode /FlateDecode]",
                ascii85(&bomb),
            ),
            (
                "flate over flate",
                "/Filter [/FlateDecode /FlateDecode]",
                zlib(&bomb),
            ),
            (
                "a dictionary past 4 KiB",
                &format!("/Filter /FlateDecode /Padding ({})", "x".repeat(5000)),
                bomb.clone(),
            ),
            (
                "(obj) in the dictionary",
                "/Filter /FlateDecode /Note (obj)",
                bomb.clone(),
            ),
            (
                "a zlib header the parser skips",
                "/Filter /FlateDecode",
                raw,
            ),
        ];
        forms
            .into_iter()
            .map(|(name, filter, data)| (name, page_drawing(filter, &data)))
            .collect()
    }

    /// A one-page PDF whose content is a stream of `data`, with `filter`
    /// (and more) in its dictionary.
    fn page_drawing(filter: &str, data: &[u8]) -> Vec<u8> {
        let mut stream = format!("<< /Length {} {filter} >>\nstream\n", data.len()).into_bytes();
        stream.extend_from_slice(data);
        stream.extend_from_slice(b"\nendstream");
        pdf_of_bytes(&[
            b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] /Contents 4 0 R >>".to_vec(),
            stream,
        ])
    }

    /// Runs `case` of [`checked_in_a_process_of_its_own`] in this test
    /// binary run again for it alone: what `check` answered, and the
    /// process's peak resident memory in KiB.
    fn check_alone(case: &str) -> (String, u64) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "files::pdf::tests::checked_in_a_process_of_its_own",
                "--exact",
                "--nocapture",
            ])
            .env("DOCSTREAM_TEST_PDF_CASE", case)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find_map(|l| l.strip_prefix("checked: "));
        let line = line.unwrap_or_else(|| panic!("{case}: {stdout}"));
        let (peak, outcome) = line.split_once(' ').unwrap();
        (outcome.to_owned(), peak.parse().unwrap())
    }

    /// Not a test of its own: [`check_alone`] runs it in a process of its
    /// own, where the peak memory is the check's.
    #[test]
    fn checked_in_a_process_of_its_own() {
        let Ok(case) = std::env::var("DOCSTREAM_TEST_PDF_CASE") else {
            return;
        };
        let pdf = match case.strip_prefix("bypass:") {
            Some(name) => bypasses().into_iter().find(|(n, _)| *n == name).unwrap().1,
            None => zeros_page(),
        };
        // Room for the zeros' 4 MiB of content: what stops them is their count.
        let limits = match case.as_str() {
            "zeros" => PdfLimits {
                inflated_bytes: 8 << 20,
                ..LIMITS
            },
            _ => LIMITS,
        };
        let outcome = check(&pdf, &limits);
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let peak = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .unwrap();
        let peak = peak.trim().trim_end_matches(" kB");
        println!("checked: {peak} {outcome:?}");
    }

    /// Resident memory the check may add to a test process: buffers and the
    /// file, not what a bomb inflates to.
    const FLAT_KIB: u64 = 48 * 1024;

    #[test]
    fn every_form_of_bomb_is_refused_with_flat_memory() {
        for (name, pdf) in bypasses() {
            assert!(pdf.len() < 1 << 20, "{name}: a small upload");
            let (outcome, peak) = check_alone(&format!("bypass:{name}"));
            assert_eq!(outcome, "Err(Inflates(1048576))", "{name}");
            assert!(peak < FLAT_KIB, "{name}: peak {peak} KiB");
        }
    }

    /// A page whose content is `0 ` repeated: 2 million operands from 4 MiB,
    /// within the inflate cap of the test.
    fn zeros_page() -> Vec<u8> {
        let content = zlib(&b"0 ".repeat(2_000_000));
        page_drawing("/Filter /FlateDecode", &content)
    }

    #[test]
    fn content_of_millions_of_operands_is_refused_before_it_is_decoded() {
        let (outcome, peak) = check_alone("zeros");
        assert_eq!(outcome, "Err(TooManyObjects { page: 1, limit: 100000 })");
        assert!(peak < FLAT_KIB, "peak {peak} KiB");
    }

    #[test]
    fn a_file_of_stream_keywords_is_refused_in_about_a_second() {
        let mut pdf = b"%PDF-1.4\n".to_vec();
        pdf.extend_from_slice(&b"stream".repeat((32 << 20) / 6));
        let started = std::time::Instant::now();
        let refused = check(&pdf, &LIMITS);
        let took = started.elapsed();
        assert!(
            matches!(refused, Err(PdfError::Unreadable(_))),
            "{refused:?}"
        );
        // Generous for a debug build on a shared machine; the quadratic
        // scan took minutes.
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    }

    const SAMPLES: [(&[u8], &str); 3] = [
        (
            include_bytes!("../../samples/files/invoice-northwind.pdf"),
            include_str!("../../samples/files/invoice-northwind.json"),
        ),
        (
            include_bytes!("../../samples/files/invoice-contoso.pdf"),
            include_str!("../../samples/files/invoice-contoso.json"),
        ),
        (
            include_bytes!("../../samples/files/receipt-bakery.pdf"),
            include_str!("../../samples/files/receipt-bakery.json"),
        ),
    ];

    #[test]
    fn the_samples_read_as_the_words_they_were_drawn_as() {
        for (pdf, json) in SAMPLES {
            let sample: serde_json::Value = serde_json::from_str(json).unwrap();
            let expected: Vec<Page> = serde_json::from_value(sample["pages"].clone()).unwrap();
            let read = words(pdf, &LIMITS, &Deadline::none()).unwrap();
            assert_eq!(read.len(), expected.len(), "{}", sample["name"]);
            for (page, want) in read.iter().zip(&expected) {
                assert_eq!((page.width, page.height), (want.width, want.height));
                let texts = |p: &Page| p.words.iter().map(|w| w.text.clone()).collect::<Vec<_>>();
                assert_eq!(texts(page), texts(want), "{}", sample["name"]);
                for (got, want) in page.words.iter().zip(&want.words) {
                    let off = got.bbox.iter().zip(want.bbox).map(|(a, b)| (a - b).abs());
                    assert!(
                        off.fold(0.0, f64::max) < 0.01,
                        "{} {:?} vs {:?}",
                        got.text,
                        got.bbox,
                        want.bbox
                    );
                }
            }
        }
    }

    #[test]
    fn pages_past_the_limit_are_refused() {
        let (contoso, _) = SAMPLES[1];
        let one_page = PdfLimits { pages: 1, ..LIMITS };
        assert_eq!(
            check(contoso, &one_page),
            Err(PdfError::TooManyPages { pages: 2, limit: 1 })
        );
        let few_words = PdfLimits {
            words_per_page: 3,
            ..LIMITS
        };
        let refused = words(contoso, &few_words, &Deadline::none());
        assert_eq!(refused, Err(PdfError::TooManyWords { page: 1, limit: 3 }));
    }

    #[test]
    fn a_form_that_draws_itself_is_refused() {
        let pdf = pdf_of(&[
            "<< /Type /Catalog /Pages 2 0 R >>",
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] /Resources << /XObject << /X 4 0 R >> >> /Contents 5 0 R >>",
            "<< /Type /XObject /Subtype /Form /BBox [0 0 1 1] /Length 5 >>\nstream\n/X Do\nendstream",
            "<< /Length 5 >>\nstream\n/X Do\nendstream",
        ]);
        assert_eq!(check(&pdf, &LIMITS), Err(PdfError::Forms));
    }

    #[test]
    fn a_page_naming_one_stream_many_times_is_held_to_the_cap() {
        let many = vec!["6 0 R"; 2000].join(" ");
        let page =
            format!("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] /Contents [{many}] >>");
        let text = "BT /F1 10 Tf (x) Tj ET\n".repeat(40);
        let stream = format!("<< /Length {} >>\nstream\n{text}\nendstream", text.len());
        let pdf = pdf_of(&[
            "<< /Type /Catalog /Pages 2 0 R >>",
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            &page,
            "<< >>",
            "<< >>",
            &stream,
        ]);
        let small = PdfLimits {
            inflated_bytes: 64 * 1024,
            ..LIMITS
        };
        assert_eq!(check(&pdf, &small), Err(PdfError::Inflates(64 * 1024)));
    }

    #[test]
    fn damaged_files_are_refused_not_crashed_on() {
        let (northwind, _) = SAMPLES[0];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut refused = 0;
        for round in 0..300 {
            let mut bytes = northwind.to_vec();
            match round % 3 {
                0 => bytes.truncate((next() as usize) % bytes.len()),
                _ => {
                    for _ in 0..1 + next() % 8 {
                        let at = (next() as usize) % bytes.len();
                        bytes[at] = next() as u8;
                    }
                }
            }
            if words(&bytes, &LIMITS, &Deadline::none()).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 0, "no damaged file was refused");
    }

    /// A PDF of `objects`, numbered from 1, with a cross-reference table.
    fn pdf_of(objects: &[&str]) -> Vec<u8> {
        let objects: Vec<Vec<u8>> = objects.iter().map(|o| o.as_bytes().to_vec()).collect();
        pdf_of_bytes(&objects)
    }

    /// [`pdf_of`], of objects that may hold any bytes.
    fn pdf_of_bytes(objects: &[Vec<u8>]) -> Vec<u8> {
        let mut out = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
            out.extend_from_slice(body);
            out.extend_from_slice(b"\nendobj\n");
        }
        let xref = out.len();
        out.extend_from_slice(
            format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
        );
        for offset in offsets {
            out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
        }
        let trailer = format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        );
        out.extend_from_slice(trailer.as_bytes());
        out
    }
}
