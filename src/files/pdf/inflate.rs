//! Inflating a stream the way the parser would, under a cap, without keeping
//! what it inflates to.
//!
//! lopdf applies a stream's filters in order (`/Filter [/ASCII85Decode
//! /FlateDecode]`), holds every layer's output in memory, and retries a
//! zlib stream that gave nothing as raw deflate from its third byte. Here
//! each layer reads the one below it as it goes, so measuring any chain
//! holds a few buffers, and every layer's output counts against one budget:
//! what the parser would allocate. Measuring stops one byte past the cap.

use std::cell::Cell;
use std::io::{self, Read};

use flate2::read::{DeflateDecoder, ZlibDecoder};

use super::PdfError;

/// Deepest filter chain a stream may name: each layer re-reads the ones
/// below it when it falls back to raw deflate, so the chain is kept short.
pub const MAX_FILTERS: usize = 4;

/// One filter of a stream's chain, as the parser reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `/FlateDecode` (or `/Fl`): zlib, or raw deflate if zlib gives nothing.
    Flate,
    /// `/ASCII85Decode` (or `/A85`).
    Ascii85,
    /// A filter the parser does not decode: the chain stops here.
    Other,
}

impl Filter {
    /// The filter `name` names, or the refusal of a filter the parser would
    /// inflate without a cap that docstream does not measure.
    pub fn named(name: &[u8]) -> Result<Self, PdfError> {
        match name {
            b"FlateDecode" | b"Fl" => Ok(Self::Flate),
            b"ASCII85Decode" | b"A85" => Ok(Self::Ascii85),
            b"LZWDecode" | b"LZW" => Err(PdfError::Filter("LZW".into())),
            b"RunLengthDecode" | b"RL" => Err(PdfError::Filter("RunLength".into())),
            b"JBIG2Decode" => Err(PdfError::Filter("JBIG2".into())),
            b"Crypt" => Err(PdfError::Filter("Crypt".into())),
            _ => Ok(Self::Other),
        }
    }
}

/// The filters the parser applies to a stream whose `/Filter` names
/// `names`, in order, up to the first one it does not decode.
pub fn chain<'n>(names: impl IntoIterator<Item = &'n [u8]>) -> Result<Vec<Filter>, PdfError> {
    let mut chain = Vec::new();
    for name in names {
        match Filter::named(name)? {
            Filter::Other => break,
            filter => chain.push(filter),
        }
    }
    if chain.len() > MAX_FILTERS {
        return Err(PdfError::Filter(format!(
            "a chain of {} filters (at most {MAX_FILTERS})",
            chain.len()
        )));
    }
    Ok(chain)
}

/// The filters of a parsed stream's dictionary, as lopdf's
/// `Stream::filters` reads them: a name, or an array of names (anything
/// else and the stream is read as it is).
pub fn chain_of(dict: &pdf_extract::Dictionary) -> Result<Vec<Filter>, PdfError> {
    use pdf_extract::Object;
    match dict.get(b"Filter") {
        Ok(Object::Name(name)) => chain([name.as_slice()]),
        Ok(Object::Array(names)) => {
            match names
                .iter()
                .map(|n| n.as_name())
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(names) => chain(names),
                Err(_) => Ok(Vec::new()),
            }
        }
        _ => Ok(Vec::new()),
    }
}

/// The bytes decoding `data` through `chain` allocates (every layer's
/// output), or [`PdfError::Inflates`] once that passes `room`.
pub fn measure(data: &[u8], chain: &[Filter], room: usize) -> Result<usize, PdfError> {
    match allocated(data, chain, room) {
        used if used > room => Err(PdfError::Inflates(room)),
        used => Ok(used),
    }
}

/// The bytes decoding `data` through `chain` allocates, counted to one
/// past `room` and no further.
fn allocated(data: &[u8], chain: &[Filter], room: usize) -> usize {
    let budget = Budget {
        used: Cell::new(0),
        room,
    };
    let mut top = open(data, chain, &budget);
    let mut buffer = [0u8; 16 * 1024];
    // A corrupt stream ends where it breaks, as the parser keeps what it got.
    while matches!(top.read(&mut buffer), Ok(n) if n > 0) {}
    budget.used.get()
}

/// Bytes the layers gave so far, and how many they may give.
struct Budget {
    used: Cell<usize>,
    room: usize,
}

/// `data` read through `chain`, each layer counted against `budget`.
fn open<'a>(data: &'a [u8], chain: &'a [Filter], budget: &'a Budget) -> Box<dyn Read + 'a> {
    match chain.split_last() {
        None => Box::new(data),
        Some((Filter::Ascii85, below)) => Box::new(Counted {
            inner: Ascii85::new(open(data, below, budget)),
            budget,
        }),
        Some((_, below)) => Box::new(Counted {
            inner: Flate::new(data, below, budget),
            budget,
        }),
    }
}

/// A layer whose output counts against the budget; past it, it fails.
struct Counted<'a, R> {
    inner: R,
    budget: &'a Budget,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.budget.used.get() > self.budget.room {
            return Err(io::Error::other("past the inflate cap"));
        }
        // Never more than one byte past the room, so the count stays exact.
        let left = self.budget.room - self.budget.used.get() + 1;
        let len = buf.len().min(left);
        let n = self.inner.read(&mut buf[..len])?;
        self.budget.used.set(self.budget.used.get() + n);
        Ok(n)
    }
}

/// A Flate layer: zlib, and if that fails before giving a byte, raw
/// deflate of the layer below from its third byte, as lopdf retries.
struct Flate<'a> {
    data: &'a [u8],
    below: &'a [Filter],
    budget: &'a Budget,
    state: FlateState<'a>,
}

enum FlateState<'a> {
    Zlib {
        decoder: ZlibDecoder<Box<dyn Read + 'a>>,
        given: usize,
    },
    Deflate(DeflateDecoder<Box<dyn Read + 'a>>),
}

impl<'a> Flate<'a> {
    fn new(data: &'a [u8], below: &'a [Filter], budget: &'a Budget) -> Self {
        let decoder = ZlibDecoder::new(open(data, below, budget));
        Self {
            data,
            below,
            budget,
            state: FlateState::Zlib { decoder, given: 0 },
        }
    }

    /// The layer below read again, without its first two bytes.
    fn raw_deflate(&self) -> FlateState<'a> {
        let mut input = open(self.data, self.below, self.budget);
        let mut skipped = [0u8; 2];
        // lopdf retries only an input longer than the two bytes it skips.
        let source = match read_up_to(&mut input, &mut skipped) {
            2 => input,
            _ => Box::new(io::empty()),
        };
        FlateState::Deflate(DeflateDecoder::new(source))
    }
}

impl Read for Flate<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.state {
            FlateState::Zlib { decoder, given } => match decoder.read(buf) {
                Ok(n) => {
                    *given += n;
                    Ok(n)
                }
                Err(_) if *given == 0 && self.budget.used.get() <= self.budget.room => {
                    self.state = self.raw_deflate();
                    self.read(buf)
                }
                Err(e) => Err(e),
            },
            FlateState::Deflate(decoder) => decoder.read(buf),
        }
    }
}

/// Reads into `buf` until it is full or the input ends; how many bytes.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => filled += n,
        }
    }
    filled
}

/// An ASCII85 layer, decoded as lopdf decodes it: whitespace skipped, `z`
/// for four zeros, and the end at the first byte outside `!`..=`u` (the
/// `~>` marker is one), with a last partial group.
struct Ascii85<R> {
    inner: R,
    input: Box<[u8; 4096]>,
    /// Unread input: `input[at..len]`.
    at: usize,
    len: usize,
    group: u32,
    count: usize,
    /// Decoded bytes not handed out yet: `output[out_at..out_len]`.
    output: [u8; 4],
    out_at: usize,
    out_len: usize,
    ended: bool,
}

impl<R: Read> Ascii85<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            input: Box::new([0; 4096]),
            at: 0,
            len: 0,
            group: 0,
            count: 0,
            output: [0; 4],
            out_at: 0,
            out_len: 0,
            ended: false,
        }
    }

    /// The next input byte, if any.
    fn next_byte(&mut self) -> io::Result<Option<u8>> {
        if self.at == self.len {
            self.len = self.inner.read(&mut self.input[..])?;
            self.at = 0;
            if self.len == 0 {
                return Ok(None);
            }
        }
        self.at += 1;
        Ok(Some(self.input[self.at - 1]))
    }

    /// Decodes until some output is ready or the input ends.
    fn refill(&mut self) -> io::Result<()> {
        while self.out_at == self.out_len && !self.ended {
            match self.next_byte()? {
                Some(b'z') if self.count == 0 => self.emit([0; 4], 4),
                Some(b'z') => return Err(io::Error::other("z inside an ASCII85 group")),
                Some(c) if c.is_ascii_whitespace() => {}
                Some(c @ b'!'..=b'u') => {
                    self.group = self
                        .group
                        .wrapping_mul(85)
                        .wrapping_add(u32::from(c - b'!'));
                    self.count += 1;
                    if self.count == 5 {
                        self.emit(self.group.to_be_bytes(), 4);
                        (self.group, self.count) = (0, 0);
                    }
                }
                _ => self.finish(),
            }
        }
        Ok(())
    }

    /// The last, partial group.
    fn finish(&mut self) {
        self.ended = true;
        if self.count > 0 {
            let mut group = self.group;
            for _ in self.count..5 {
                group = group.wrapping_mul(85).wrapping_add(84);
            }
            self.emit(group.to_be_bytes(), self.count - 1);
        }
    }

    fn emit(&mut self, bytes: [u8; 4], len: usize) {
        self.output = bytes;
        (self.out_at, self.out_len) = (0, len);
    }
}

impl<R: Read> Read for Ascii85<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut given = 0;
        while given < buf.len() {
            self.refill()?;
            if self.out_at == self.out_len {
                break;
            }
            let n = (self.out_len - self.out_at).min(buf.len() - given);
            buf[given..given + n].copy_from_slice(&self.output[self.out_at..self.out_at + n]);
            self.out_at += n;
            given += n;
        }
        Ok(given)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::io::Write;

    /// `bytes` zlib-compressed, as a `/FlateDecode` stream holds them.
    pub(crate) fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(bytes).unwrap();
        z.finish().unwrap()
    }

    /// `bytes` in ASCII85, as an `/ASCII85Decode` stream holds them.
    pub(crate) fn ascii85(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for group in bytes.chunks(4) {
            let mut word = [0u8; 4];
            word[..group.len()].copy_from_slice(group);
            let mut n = u32::from_be_bytes(word);
            let mut digits = [0u8; 5];
            for d in digits.iter_mut().rev() {
                *d = (n % 85) as u8 + b'!';
                n /= 85;
            }
            out.extend_from_slice(&digits[..group.len() + 1]);
        }
        out.extend_from_slice(b"~>");
        out
    }

    /// What lopdf's own decoding gives, for comparison.
    fn lopdf_decoded(content: &[u8], filters: &[&str]) -> Vec<u8> {
        use pdf_extract::{Dictionary, Object, Stream};
        let names = filters.iter().map(|f| Object::Name(f.as_bytes().to_vec()));
        let mut dict = Dictionary::new();
        dict.set("Filter", Object::Array(names.collect()));
        Stream::new(dict, content.to_vec())
            .decompressed_content()
            .unwrap()
    }

    #[test]
    fn every_layer_of_a_chain_counts_as_the_parser_allocates_it() {
        let text = b"BT /F1 12 Tf (hello) Tj ET\n".repeat(100);
        let once = zlib(&text);
        let twice = zlib(&once);
        let armoured = ascii85(&once);
        let cases: [(&[u8], &[&str], usize); 3] = [
            (&once, &["FlateDecode"], text.len()),
            (
                &twice,
                &["FlateDecode", "FlateDecode"],
                once.len() + text.len(),
            ),
            (
                &armoured,
                &["ASCII85Decode", "FlateDecode"],
                once.len() + text.len(),
            ),
        ];
        for (data, filters, allocated) in cases {
            let chain = chain(filters.iter().map(|f| f.as_bytes())).unwrap();
            assert_eq!(lopdf_decoded(data, filters), text, "{filters:?}");
            assert_eq!(measure(data, &chain, 1 << 20), Ok(allocated), "{filters:?}");
        }
    }

    #[test]
    fn a_zlib_stream_that_fails_is_read_again_as_raw_deflate() {
        let text = vec![b'x'; 10_000];
        let mut data = b"??".to_vec();
        let z = zlib(&text);
        // Past a zlib header of its own: raw deflate.
        data.extend_from_slice(&z[2..]);
        assert_eq!(lopdf_decoded(&data, &["FlateDecode"]).len(), text.len());
        assert_eq!(measure(&data, &[Filter::Flate], 1 << 20), Ok(text.len()));
    }

    #[test]
    fn measuring_stops_one_byte_past_the_room() {
        let bomb = zlib(&vec![0u8; 64 << 20]);
        let outer = zlib(&bomb);
        let room = 1 << 20;
        let chain = [Filter::Flate, Filter::Flate];
        assert_eq!(measure(&outer, &chain, room), Err(PdfError::Inflates(room)));
        // Both layers together: the inner bomb's 64 KiB and the zeros it
        // gave until the room was gone, not its 64 MiB.
        assert_eq!(allocated(&outer, &chain, room), room + 1);
    }

    #[test]
    fn filters_the_parser_inflates_uncapped_are_refused() {
        assert_eq!(
            chain([&b"ASCII85Decode"[..], b"LZWDecode"]),
            Err(PdfError::Filter("LZW".into()))
        );
        let long = chain(std::iter::repeat_n(&b"FlateDecode"[..], MAX_FILTERS + 1));
        assert!(matches!(long, Err(PdfError::Filter(_))));
        // What the parser does not decode ends the chain.
        assert_eq!(
            chain([&b"FlateDecode"[..], b"DCTDecode", b"FlateDecode"]),
            Ok(vec![Filter::Flate])
        );
    }
}
