//! The streams of a PDF found and measured from its bytes, before the parser
//! runs: the parser inflates object and cross-reference streams as it loads,
//! with no cap.
//!
//! The parser reads an object wherever an `N G obj` header is (at the
//! offsets the cross-reference table gives, or wherever it finds one when
//! the table is broken), so every `obj` in the bytes is taken as a header:
//! the object after it is read, and if it is a dictionary followed by
//! `stream`, the stream is measured through the filters the dictionary
//! names ([`super::inflate`]), however long the dictionary is. Reading
//! objects is linear in the bytes: a read stops at the first thing a
//! dictionary cannot hold, and the bytes read over all headers are held to
//! a small multiple of the file's (objects that overlap each other past
//! that are refused).

use super::inflate;
use super::PdfError;

/// What the scan did: the bytes its streams inflate to, and the bytes of
/// objects it read to find them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Bytes the parser would allocate inflating every stream.
    pub inflated: usize,
    /// Bytes read as objects, over all headers.
    pub read: usize,
}

/// Deepest nesting of arrays and dictionaries read (lopdf's own bound).
const MAX_DEPTH: usize = 256;

/// Finds every stream of `bytes` and measures what it inflates to, all
/// together within `cap`.
pub fn inflate_all(bytes: &[u8], cap: usize) -> Result<Scanned, PdfError> {
    let allowance = 2 * bytes.len() + (1 << 20);
    let mut scanned = Scanned {
        inflated: 0,
        read: 0,
    };
    let mut at = 0;
    while let Some(found) = find(&bytes[at..], b"obj") {
        at += found + b"obj".len();
        let mut reader = Reader {
            bytes,
            at,
            depth: 0,
        };
        let stream = reader.stream();
        scanned.read += reader.at - at;
        if scanned.read > allowance {
            return Err(PdfError::Unreadable(
                "its objects overlap one another (it is not a PDF a writer made)".into(),
            ));
        }
        let Some((filters, data)) = stream else {
            continue;
        };
        let chain = inflate::chain(filters.iter().map(Vec::as_slice))?;
        if chain.is_empty() {
            continue;
        }
        let room = cap - scanned.inflated;
        scanned.inflated +=
            inflate::measure(data, &chain, room).map_err(|_| PdfError::Inflates(cap))?;
    }
    Ok(scanned)
}

/// The first place `needle` is in `haystack`, in time linear in it.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A value of a dictionary, as far as the scan needs it.
enum Value {
    Name(Vec<u8>),
    Array(Vec<Value>),
    Other,
}

/// Reads PDF objects from `bytes` at `at`.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    /// The stream whose object starts here: the names of its `/Filter`
    /// and its data (to the end of the file: a decoder stops at its
    /// stream's end, and the parser reads no further than that).
    fn stream(&mut self) -> Option<(Vec<Vec<u8>>, &'a [u8])> {
        self.space();
        let filter = self.dictionary()?;
        self.space();
        if !self.keyword(b"stream") {
            return None;
        }
        let filters = match filter {
            Some(Value::Name(name)) => vec![name],
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::Name(name) => Some(name),
                    _ => None,
                })
                .collect::<Option<_>>()
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let mut data = &self.bytes[self.at..];
        while let Some(rest) = data.strip_prefix(b" ") {
            data = rest;
        }
        for eol in [&b"\r\n"[..], b"\n", b"\r"] {
            if let Some(rest) = data.strip_prefix(eol) {
                data = rest;
                break;
            }
        }
        Some((filters, data))
    }

    /// A dictionary starting here, read to its end: its `/Filter` value.
    fn dictionary(&mut self) -> Option<Option<Value>> {
        if !self.bytes[self.at..].starts_with(b"<<") || self.depth >= MAX_DEPTH {
            return None;
        }
        self.at += 2;
        self.depth += 1;
        let mut filter = None;
        loop {
            self.space();
            if self.bytes[self.at..].starts_with(b">>") {
                self.at += 2;
                self.depth -= 1;
                return Some(filter);
            }
            let key = self.value()?;
            self.space();
            let value = self.value()?;
            if matches!(&key, Value::Name(name) if name == b"Filter") {
                filter = Some(value);
            }
        }
    }

    /// One value, or `None` at the end of the bytes, an unbalanced
    /// delimiter, or a keyword no dictionary holds.
    fn value(&mut self) -> Option<Value> {
        let rest = &self.bytes[self.at..];
        match *rest.first()? {
            b'<' if rest.starts_with(b"<<") => self.dictionary().map(|_| Value::Other),
            b'<' => self.skip_past(b'>').map(|()| Value::Other),
            b'(' => self.string().map(|()| Value::Other),
            b'[' => self.array(),
            b'/' => {
                self.at += 1;
                Some(Value::Name(unescape(self.regular())))
            }
            b'>' | b')' | b']' | b'{' | b'}' => None,
            _ => match self.regular() {
                b"" => None,
                b"obj" | b"endobj" | b"stream" | b"endstream" | b"xref" | b"trailer" => None,
                _ => Some(Value::Other),
            },
        }
    }

    fn array(&mut self) -> Option<Value> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.depth += 1;
        let mut items = Vec::new();
        loop {
            self.space();
            if self.bytes.get(self.at) == Some(&b']') {
                self.at += 1;
                self.depth -= 1;
                return Some(Value::Array(items));
            }
            let item = self.value()?;
            // Only the names of a `/Filter` array are of use.
            if items.len() <= inflate::MAX_FILTERS {
                items.push(item);
            }
        }
    }

    /// A literal string: balanced parentheses, `\` escaping one byte.
    fn string(&mut self) -> Option<()> {
        let mut depth = 0usize;
        while let Some(&b) = self.bytes.get(self.at) {
            self.at += 1;
            match b {
                b'\\' => self.at = (self.at + 1).min(self.bytes.len()),
                b'(' => depth += 1,
                b')' if depth == 1 => return Some(()),
                b')' => depth -= 1,
                _ => {}
            }
        }
        None
    }

    fn skip_past(&mut self, end: u8) -> Option<()> {
        let length = self.bytes[self.at..].iter().position(|&b| b == end)?;
        self.at += length + 1;
        Some(())
    }

    /// A run of regular characters (a number, a keyword, a name's text).
    fn regular(&mut self) -> &'a [u8] {
        let start = self.at;
        while self.bytes.get(self.at).is_some_and(|&b| is_regular(b)) {
            self.at += 1;
        }
        &self.bytes[start..self.at]
    }

    fn keyword(&mut self, word: &[u8]) -> bool {
        let start = self.at;
        match self.regular() == word {
            true => true,
            false => {
                self.at = start;
                false
            }
        }
    }

    /// White space and comments.
    fn space(&mut self) {
        while let Some(&b) = self.bytes.get(self.at) {
            match b {
                b'%' => {
                    let line = self.bytes[self.at..]
                        .iter()
                        .position(|&b| b == b'\n' || b == b'\r');
                    self.at = line.map_or(self.bytes.len(), |n| self.at + n);
                }
                b if is_space(b) => self.at += 1,
                _ => return,
            }
        }
    }
}

/// A name's text with its `#xx` escapes decoded, as the parser reads it.
fn unescape(text: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let hex = text
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (text[at], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'#', Some(byte)) => {
                name.push(byte);
                at += 3;
            }
            (b, _) => {
                name.push(b);
                at += 1;
            }
        }
    }
    name
}

/// PDF white space.
pub(super) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b'\x0c' | b'\0')
}

/// A byte of a name or a number: neither white space nor a delimiter.
pub(super) fn is_regular(b: u8) -> bool {
    !is_space(b) && !b"()<>[]{}/%".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::pdf::inflate::Filter;

    /// The filters the object after `header` is read with, if it is a stream.
    fn filters_of(object: &[u8]) -> Option<Vec<Filter>> {
        let mut reader = Reader {
            bytes: object,
            at: 0,
            depth: 0,
        };
        let (names, _) = reader.stream()?;
        inflate::chain(names.iter().map(Vec::as_slice)).ok()
    }

    #[test]
    fn a_stream_dictionary_is_read_whole_whatever_it_holds() {
        let padding = format!(
            "/Pad ({}) /Strings [(obj) (>>) (\\)) <3E3E>]",
            "x".repeat(10_000)
        );
        let cases: [(String, Option<Vec<Filter>>); 5] = [
            (
                " << /Filter /FlateDecode >>\nstream\n".into(),
                Some(vec![Filter::Flate]),
            ),
            (
                format!(" << {padding} /Filter [/ASCII85Decode /FlateDecode] >> stream\r\n"),
                Some(vec![Filter::Ascii85, Filter::Flate]),
            ),
            (
                " << /Filter /Flate#44ecode % a comment\n >> stream\n".into(),
                Some(vec![Filter::Flate]),
            ),
            (
                " << /Filter 5 0 R /Length 3 >>\nstream\n".into(),
                Some(vec![]),
            ),
            (" << /Filter /FlateDecode >> endobj".into(), None),
        ];
        for (object, filters) in cases {
            assert_eq!(filters_of(object.as_bytes()), filters, "{object}");
        }
    }

    /// 32 MiB of `unit` repeated.
    fn repeated(unit: &[u8]) -> Vec<u8> {
        unit.repeat((32 << 20) / unit.len())
    }

    #[test]
    fn objects_are_read_once_however_their_keywords_repeat() {
        for unit in [
            &b"stream"[..],
            b"obj stream ",
            b"1 0 obj << /Filter /FlateDecode >> stream\n",
            b"obj<<obj<<",
        ] {
            let bytes = repeated(unit);
            let scanned = inflate_all(&bytes, 1 << 20).unwrap();
            let unit = String::from_utf8_lossy(unit);
            assert!(scanned.read <= bytes.len(), "{unit}: read {}", scanned.read);
        }
    }

    #[test]
    fn objects_that_overlap_past_the_allowance_are_refused() {
        // Each header's dictionary holds a string that holds the next
        // header: read from every one, the bytes would be read n²/2 times.
        let mut bytes = b"obj<</A(".repeat(200_000);
        bytes.extend_from_slice(&b")".repeat(200_000));
        let refused = inflate_all(&bytes, 1 << 20);
        assert!(
            matches!(refused, Err(PdfError::Unreadable(_))),
            "{refused:?}"
        );
    }
}
