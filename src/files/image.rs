//! An image's pages and their sizes, read from its headers alone: what an
//! upload is checked against before anything decodes it. A PNG of a few
//! kilobytes can declare 30,000 × 30,000 pixels (a decompression bomb, 900
//! megapixels to hold once decoded), and a TIFF can chain thousands of
//! pages; both are refused from the few bytes that say so.
//!
//! A PNG's size is its `IHDR` chunk; a JPEG's, its start-of-frame segment;
//! a TIFF's pages are its chain of image file directories, each with its
//! `ImageWidth` and `ImageLength` tags. Nothing else of the file is read.

/// What an image may be to be read.
#[derive(Debug, Clone, Copy)]
pub struct ImageLimits {
    /// Most pixels on one page.
    pub pixels: u64,
    /// Most pixels across or down one page.
    pub side: u64,
    /// Most pages (a TIFF's directories).
    pub pages: usize,
}

/// Why an image was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    /// Headers that do not describe an image.
    #[error("the image cannot be read: {0}")]
    Unreadable(&'static str),
    /// A page larger than the pixel cap.
    #[error("page {page} of the image is {width} × {height} pixels, more than the limit of {limit} pixels a page (DOCSTREAM_OCR_MAX_PIXELS)")]
    TooManyPixels {
        /// The page, from 1.
        page: usize,
        /// Its width.
        width: u64,
        /// Its height.
        height: u64,
        /// The limit.
        limit: u64,
    },
    /// A page wider or taller than the limit.
    #[error("page {page} of the image is {width} × {height} pixels, more than the limit of {limit} pixels across or down (DOCSTREAM_OCR_MAX_SIDE_PIXELS)")]
    TooWide {
        /// The page, from 1.
        page: usize,
        /// Its width.
        width: u64,
        /// Its height.
        height: u64,
        /// The limit.
        limit: u64,
    },
    /// A TIFF page that names its width or height twice: decoders take the
    /// first, a reader of its last would check another image than the one
    /// decoded.
    #[error("page {page} of the TIFF gives its {tag} more than once")]
    Repeated {
        /// The page, from 1.
        page: usize,
        /// Which: `ImageWidth` or `ImageLength`.
        tag: &'static str,
    },
    /// More pages than the limit.
    #[error("the image has more than {limit} pages (DOCSTREAM_MAX_PAGES)")]
    TooManyPages {
        /// The limit.
        limit: usize,
    },
}

/// The size in pixels of each page of the image `bytes` of kind `kind`
/// (a PNG, a JPEG or a TIFF), held to `limits`.
pub fn pages(
    kind: super::FileType,
    bytes: &[u8],
    limits: &ImageLimits,
) -> Result<Vec<(u64, u64)>, ImageError> {
    use super::FileType;
    let sizes = match kind {
        FileType::Png => vec![png(bytes)?],
        FileType::Jpeg => vec![jpeg(bytes)?],
        FileType::Tiff => tiff(bytes, limits.pages)?,
        FileType::Pdf | FileType::Text => return Err(ImageError::Unreadable("it is not an image")),
    };
    for (number, &(width, height)) in sizes.iter().enumerate() {
        if width == 0 || height == 0 {
            return Err(ImageError::Unreadable("a page has no pixels"));
        }
        if width.saturating_mul(height) > limits.pixels {
            return Err(ImageError::TooManyPixels {
                page: number + 1,
                width,
                height,
                limit: limits.pixels,
            });
        }
        if width.max(height) > limits.side {
            return Err(ImageError::TooWide {
                page: number + 1,
                width,
                height,
                limit: limits.side,
            });
        }
    }
    Ok(sizes)
}

/// The size of the PNG `bytes`, from its header.
pub fn png_size(bytes: &[u8]) -> Option<(u64, u64)> {
    png(bytes).ok()
}

fn png(bytes: &[u8]) -> Result<(u64, u64), ImageError> {
    // Signature (8), then the first chunk: its length (4), `IHDR` (4),
    // width (4), height (4).
    if bytes.get(12..16) != Some(b"IHDR") {
        return Err(ImageError::Unreadable(
            "the PNG does not start with its header",
        ));
    }
    let width = be32(bytes, 16).ok_or(ImageError::Unreadable("the PNG's header is cut short"))?;
    let height = be32(bytes, 20).ok_or(ImageError::Unreadable("the PNG's header is cut short"))?;
    Ok((width.into(), height.into()))
}

fn jpeg(bytes: &[u8]) -> Result<(u64, u64), ImageError> {
    let short = ImageError::Unreadable("the JPEG ends before its frame header");
    let mut at = 2; // past SOI
    loop {
        // Fill bytes may precede a marker.
        while bytes.get(at) == Some(&0xff) && bytes.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        if bytes.get(at) != Some(&0xff) {
            return Err(ImageError::Unreadable("the JPEG's segments are damaged"));
        }
        let marker = *bytes.get(at + 1).ok_or(short.clone())?;
        // Markers without a length.
        if matches!(marker, 0x01 | 0xd0..=0xd7) {
            at += 2;
            continue;
        }
        if matches!(marker, 0xd9 | 0xda) {
            return Err(short);
        }
        let length = usize::from(be16(bytes, at + 2).ok_or(short.clone())?);
        // Start of frame: every SOFn but DHT (c4), JPG (c8) and DAC (cc).
        if matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc) {
            let height = be16(bytes, at + 5).ok_or(short.clone())?;
            let width = be16(bytes, at + 7).ok_or(short)?;
            return Ok((width.into(), height.into()));
        }
        if length < 2 {
            return Err(ImageError::Unreadable("the JPEG's segments are damaged"));
        }
        at += 2 + length;
    }
}

/// A TIFF's pages: the chain of its directories, at most `max` of them.
fn tiff(bytes: &[u8], max: usize) -> Result<Vec<(u64, u64)>, ImageError> {
    let big_endian = match bytes.get(..4) {
        Some(b"II*\0") => false,
        Some(b"MM\0*") => true,
        _ => return Err(ImageError::Unreadable("the TIFF's header is damaged")),
    };
    let short = ImageError::Unreadable("a TIFF directory points past the end of the file");
    let u16_at = |at: usize| {
        let b: [u8; 2] = bytes.get(at..at + 2)?.try_into().ok()?;
        Some(match big_endian {
            true => u16::from_be_bytes(b),
            false => u16::from_le_bytes(b),
        })
    };
    let u32_at = |at: usize| {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(match big_endian {
            true => u32::from_be_bytes(b),
            false => u32::from_le_bytes(b),
        })
    };
    let mut pages = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut next = u32_at(4).ok_or(short.clone())? as usize;
    while next != 0 {
        if !seen.insert(next) {
            return Err(ImageError::Unreadable("the TIFF's directories form a loop"));
        }
        if pages.len() == max {
            return Err(ImageError::TooManyPages { limit: max });
        }
        let entries = usize::from(u16_at(next).ok_or(short.clone())?);
        let (mut width, mut height) = (None, None);
        for entry in 0..entries {
            let at = next + 2 + entry * 12;
            let tag = u16_at(at).ok_or(short.clone())?;
            let kind = u16_at(at + 2).ok_or(short.clone())?;
            // SHORT (3) values sit in the entry's first two bytes; LONG (4)
            // values fill it.
            let value = match kind {
                3 => u16_at(at + 8).map(u64::from),
                4 => u32_at(at + 8).map(u64::from),
                _ => None,
            };
            let (name, slot) = match tag {
                256 => ("ImageWidth", &mut width),
                257 => ("ImageLength", &mut height),
                _ => continue,
            };
            if slot.is_some() {
                return Err(ImageError::Repeated {
                    page: pages.len() + 1,
                    tag: name,
                });
            }
            // A size of another type is no size: the page is refused below.
            *slot = Some(value.ok_or(ImageError::Unreadable(
                "a TIFF page gives its width or height in a type that is not a whole number",
            ))?);
        }
        let size = width.zip(height).ok_or(ImageError::Unreadable(
            "a TIFF page does not say its width and height",
        ))?;
        pages.push(size);
        next = u32_at(next + 2 + entries * 12).ok_or(short.clone())? as usize;
    }
    if pages.is_empty() {
        return Err(ImageError::Unreadable("the TIFF has no pages"));
    }
    Ok(pages)
}

/// The JPEG `bytes` without its EXIF segments: a browser turns a photo by
/// its EXIF orientation, while OCR (and so every box on it) reads its
/// pixels as stored. Bytes that are not a JPEG's segments come back as
/// they are.
pub fn without_exif(bytes: axum::body::Bytes) -> axum::body::Bytes {
    let mut kept = Vec::with_capacity(bytes.len());
    kept.extend_from_slice(b"\xff\xd8");
    let mut at = 2;
    let mut dropped = false;
    loop {
        let (Some(0xff), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
            return bytes;
        };
        // The scan, and everything after it, as it is.
        if matches!(marker, 0xda | 0xd9) || !(0xc0..=0xfe).contains(&marker) {
            break;
        }
        let Some(length) = be16(&bytes, at + 2).map(usize::from) else {
            return bytes;
        };
        let Some(segment) = bytes.get(at..at + 2 + length) else {
            return bytes;
        };
        let exif = marker == 0xe1 && segment.get(4..10) == Some(b"Exif\0\0");
        match exif {
            true => dropped = true,
            false => kept.extend_from_slice(segment),
        }
        at += 2 + length;
    }
    if !dropped || bytes.get(..2) != Some(b"\xff\xd8") {
        return bytes;
    }
    kept.extend_from_slice(&bytes[at..]);
    kept.into()
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::FileType;
    use super::*;

    const LIMITS: ImageLimits = ImageLimits {
        pixels: 50_000_000,
        side: 16_000,
        pages: 4,
    };

    /// A PNG header declaring `width` × `height` (no pixel data follows:
    /// the size is all a check reads).
    pub(crate) fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend(width.to_be_bytes());
        png.extend(height.to_be_bytes());
        png.extend([8, 0, 0, 0, 0]);
        png
    }

    /// A little-endian TIFF of `pages` directories of `width` × `height`,
    /// the last pointing back at the first when `looped`.
    fn tiff_of(pages: usize, (width, height): (u32, u16), looped: bool) -> Vec<u8> {
        let mut tiff = b"II*\0".to_vec();
        tiff.extend(8u32.to_le_bytes());
        for page in 0..pages {
            let at = tiff.len();
            tiff.extend(2u16.to_le_bytes());
            // ImageWidth as a LONG, ImageLength as a SHORT.
            tiff.extend(256u16.to_le_bytes());
            tiff.extend(4u16.to_le_bytes());
            tiff.extend(1u32.to_le_bytes());
            tiff.extend(width.to_le_bytes());
            tiff.extend(257u16.to_le_bytes());
            tiff.extend(3u16.to_le_bytes());
            tiff.extend(1u32.to_le_bytes());
            tiff.extend(height.to_le_bytes());
            tiff.extend([0, 0]);
            let next = match (page + 1 == pages, looped) {
                (false, _) => (at + 2 + 24 + 4) as u32,
                (true, true) => 8,
                (true, false) => 0,
            };
            tiff.extend(next.to_le_bytes());
        }
        tiff
    }

    #[test]
    fn a_png_bomb_is_refused_from_its_header() {
        let bomb = png_header(30_000, 30_000);
        let refused = pages(FileType::Png, &bomb, &LIMITS).unwrap_err();
        assert!(matches!(refused, ImageError::TooManyPixels { page: 1, .. }));
        assert!(refused.to_string().contains("DOCSTREAM_OCR_MAX_PIXELS"));
        let page = png_header(1700, 2200);
        assert_eq!(pages(FileType::Png, &page, &LIMITS), Ok(vec![(1700, 2200)]));
        assert!(pages(FileType::Png, &page[..18], &LIMITS).is_err());
    }

    #[test]
    fn a_jpeg_size_is_its_frame_header_past_the_other_segments() {
        let mut jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0".to_vec();
        // SOF0: length 17, precision 8, height 2200, width 1700.
        jpeg.extend(b"\xff\xc0\x00\x11\x08\x08\x98\x06\xa4");
        assert_eq!(
            pages(FileType::Jpeg, &jpeg, &LIMITS),
            Ok(vec![(1700, 2200)])
        );
        assert!(pages(FileType::Jpeg, &jpeg[..22], &LIMITS).is_err());
    }

    #[test]
    fn a_jpeg_is_drawn_without_its_exif_and_nothing_else_changes() {
        let exif = b"\xff\xe1\x00\x10Exif\0\0MM\0*\0\0\0\x08";
        let jfif = b"\xff\xe0\x00\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0";
        let rest = b"\xff\xc0\x00\x08\x08\x08\x98\x06\xa4\x00\xff\xda\x00\x02\x12\x34\xff\xd9";
        let photo = [&b"\xff\xd8"[..], exif, jfif, rest].concat();
        let drawn = without_exif(photo.into());
        assert_eq!(drawn, [&b"\xff\xd8"[..], jfif, rest].concat());
        let plain = [&b"\xff\xd8"[..], jfif, rest].concat();
        assert_eq!(without_exif(plain.clone().into()), plain);
        let cut = [&b"\xff\xd8"[..], &exif[..9]].concat();
        assert_eq!(without_exif(cut.clone().into()), cut);
    }

    #[test]
    fn a_tiff_is_its_pages_within_the_page_limit_and_without_loops() {
        let three = tiff_of(3, (1700, 2200), false);
        assert_eq!(pages(FileType::Tiff, &three, &LIMITS).unwrap().len(), 3);
        let many = tiff_of(5, (10, 10), false);
        let refused = pages(FileType::Tiff, &many, &LIMITS);
        assert_eq!(refused, Err(ImageError::TooManyPages { limit: 4 }));
        let looped = tiff_of(2, (10, 10), true);
        let refused = pages(FileType::Tiff, &looped, &LIMITS).unwrap_err();
        assert!(refused.to_string().contains("loop"), "{refused}");
        let big = tiff_of(1, (15_000, 15_000), false);
        let refused = pages(FileType::Tiff, &big, &LIMITS);
        assert!(matches!(refused, Err(ImageError::TooManyPixels { .. })));
        let wide = tiff_of(1, (20_000, 1_000), false);
        let refused = pages(FileType::Tiff, &wide, &LIMITS);
        assert!(matches!(refused, Err(ImageError::TooWide { .. })));
        let wide = png_header(20_000, 1_000);
        let refused = pages(FileType::Png, &wide, &LIMITS).unwrap_err();
        assert!(refused
            .to_string()
            .contains("DOCSTREAM_OCR_MAX_SIDE_PIXELS"));
    }
}
