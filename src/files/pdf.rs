//! A PDF's text layer as pages of positioned words: what the built-in rule
//! extractor reads of an uploaded PDF, and what bbox refinement grounds its
//! values in.
//!
//! The text is read by `pdf-extract` (fonts, encodings, the text state), and
//! words are put together here from each character's place. A hostile PDF
//! is held off before it is parsed: every compressed stream is inflated
//! under a cap first ([`check`]), since the parser inflates without one; a
//! page's content cannot reach past the same cap by naming one stream many
//! times; form XObjects may not nest past [`MAX_FORM_DEPTH`] or draw
//! themselves (the parser follows them without a bound); and a panic in the
//! parser is a refusal of the file, not a crash of the worker.
//!
//! A word's box is its glyphs' em boxes: from 0.8 of the font size above the
//! baseline to 0.2 below it, in points from the page's top-left corner.

use std::collections::HashMap;
use std::io::Read;
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
}

/// Why a PDF was refused, or had no text to read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
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
    /// Reading the text ran past the deadline.
    #[error("reading the PDF's text ran past its deadline")]
    Deadline,
}

/// Checks `bytes` against `limits` before anything else reads them: every
/// stream inflates within the cap, the pages are within theirs, each page's
/// content (its streams with their repeats, and the forms it draws) within
/// the inflate cap too. The number of pages.
pub fn check(bytes: &[u8], limits: &PdfLimits) -> Result<usize, PdfError> {
    inflate_all(bytes, limits.inflated_bytes)?;
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
    let mut content = ContentSize::new(&pdf, limits.inflated_bytes);
    for &page in pages.values() {
        content.page(page)?;
    }
    Ok(pages.len())
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

/// Inflates every compressed stream of `bytes` under one cap, without
/// parsing: from each `stream` keyword, the way the parser would. A stream
/// the parser would inflate another way (LZW, run length) is refused.
fn inflate_all(bytes: &[u8], cap: usize) -> Result<(), PdfError> {
    let mut total = 0usize;
    let mut at = 0;
    while let Some(found) = find(&bytes[at..], b"stream") {
        let keyword = at + found;
        at = keyword + b"stream".len();
        if bytes[..keyword].ends_with(b"end") {
            continue;
        }
        let dictionary = &bytes[keyword.saturating_sub(4096)..keyword];
        let dictionary = match rfind(dictionary, b"obj") {
            Some(start) => &dictionary[start..],
            None => dictionary,
        };
        for refused in [&b"/LZW"[..], b"/RunLength", b"/RL", b"/JBIG2", b"/Crypt"] {
            if find(dictionary, refused).is_some() {
                let name = String::from_utf8_lossy(&refused[1..]).into_owned();
                return Err(PdfError::Filter(name));
            }
        }
        if find(dictionary, b"/Fl").is_none() {
            continue;
        }
        let mut data = &bytes[at..];
        for eol in [&b"\r\n"[..], b"\n", b"\r"] {
            if let Some(rest) = data.strip_prefix(eol) {
                data = rest;
                break;
            }
        }
        total += inflated_len(data, cap - total.min(cap))?;
        if total > cap {
            return Err(PdfError::Inflates(cap));
        }
    }
    Ok(())
}

/// How many bytes the zlib (or raw deflate) stream at the start of `data`
/// inflates to, counting to one past `room`. A stream that is corrupt
/// counts what it gave before the error, as the parser would keep.
fn inflated_len(data: &[u8], room: usize) -> Result<usize, PdfError> {
    let limit = room as u64 + 1;
    let counted = count(flate2::read::ZlibDecoder::new(data).take(limit));
    let deflate = || count(flate2::read::DeflateDecoder::new(data).take(limit));
    let n = match counted {
        (n, true) => n,
        (0, false) => deflate().0,
        (n, false) => n,
    };
    match n > room {
        true => Err(PdfError::Inflates(room)),
        false => Ok(n),
    }
}

/// Bytes read from `reader` until its end or an error, and whether it ended
/// cleanly.
fn count(mut reader: impl Read) -> (usize, bool) {
    let mut total = 0;
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return (total, true),
            Ok(n) => total += n,
            Err(_) => return (total, false),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// The inflated size of what pages draw: their content streams, each as
/// often as it is named, and the forms they draw, followed as the text
/// reader follows them.
struct ContentSize<'a> {
    pdf: &'a Pdf,
    cap: usize,
    total: usize,
    /// Inflated size of each stream measured so far.
    sizes: HashMap<ObjectId, usize>,
}

impl<'a> ContentSize<'a> {
    fn new(pdf: &'a Pdf, cap: usize) -> Self {
        Self {
            pdf,
            cap,
            total: 0,
            sizes: HashMap::new(),
        }
    }

    fn page(&mut self, page: ObjectId) -> Result<(), PdfError> {
        for stream in self.pdf.get_page_contents(page) {
            self.add(stream)?;
        }
        let content = self.pdf.get_and_decode_page_content(page);
        let content = content.map_err(|e| PdfError::Unreadable(e.to_string()))?;
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
            let Ok(content) = pdf_extract::content::Content::decode(&content) else {
                continue;
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

    /// Counts stream `id` once more.
    fn add(&mut self, id: ObjectId) -> Result<(), PdfError> {
        let size = match self.sizes.get(&id) {
            Some(&size) => size,
            None => {
                let stream = self.pdf.get_object(id).and_then(Object::as_stream);
                let size = stream.map_or(0, |s| {
                    s.decompressed_content()
                        .map_or(s.content.len(), |c| c.len())
                });
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
        page.words.push(Word { text, bbox });
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
        let mut out = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
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
