//! The header check of an uploaded image (`files::image::pages`) against
//! the decoder that reads it afterwards (ImageMagick, which OCR prepares
//! every page with): real PNGs, JPEGs and TIFFs, mutated where their sizes
//! are said, must never pass the check with a size the decoder does not
//! see. Whatever the check lets through, ImageMagick either refuses or
//! reads at exactly the sizes the check held to the caps.

use std::io::Write;
use std::process::{Command, Stdio};

use docstream::files::image::{self, ImageLimits};
use docstream::files::FileType;

const LIMITS: ImageLimits = ImageLimits {
    pixels: 50_000_000,
    side: 16_000,
    pages: 8,
};

/// Mutants of each kind, from a fixed seed (so a failure repeats).
const MUTANTS: usize = 150;

/// A small, repeatable generator (xorshift64*).
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// An image ImageMagick makes: `frames` white frames of `size`, as `coder`.
fn made(coder: &str, size: &str, frames: usize) -> Vec<u8> {
    let mut convert = Command::new("convert");
    for _ in 0..frames {
        convert.args(["-size", size, "xc:white"]);
    }
    let out = convert
        .arg(format!("{coder}:-"))
        .output()
        .expect("ImageMagick's convert");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The sizes ImageMagick reads of each frame of `bytes` as `coder`, or
/// `None` when it refuses them.
fn decoded(coder: &str, bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    let mut identify = Command::new("identify")
        .args(["-format", "%w %h\n", &format!("{coder}:-")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ImageMagick's identify");
    // It may stop reading a file it refuses.
    let _ = identify.stdin.take().unwrap().write_all(bytes);
    let out = identify.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let sizes: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
        .collect();
    (out.status.success() && !sizes.is_empty()).then_some(sizes)
}

/// The entries of a little-endian TIFF's first directory: their offsets.
fn tiff_entries(tiff: &[u8]) -> Vec<usize> {
    assert_eq!(
        &tiff[..4],
        b"II*\0",
        "ImageMagick writes little-endian TIFFs here"
    );
    let ifd = u32::from_le_bytes(tiff[4..8].try_into().unwrap()) as usize;
    let count = u16::from_le_bytes(tiff[ifd..ifd + 2].try_into().unwrap()) as usize;
    (0..count).map(|i| ifd + 2 + i * 12).collect()
}

/// `tiff` with one of its directory's entries changed where a size is
/// said: a tag made ImageWidth or ImageLength (a repeat), a size's type or
/// count changed, a size's value changed, or a byte of the directory
/// flipped.
fn tiff_mutant(tiff: &[u8], dice: &mut Dice) -> Vec<u8> {
    let mut out = tiff.to_vec();
    let entries = tiff_entries(tiff);
    let at = entries[dice.below(entries.len())];
    let sizes = [
        0u32,
        1,
        30,
        40,
        255,
        16_000,
        16_001,
        65_535,
        70_000,
        1 << 31,
    ];
    match dice.below(5) {
        0 => {
            let tag: u16 = [256, 257][dice.below(2)];
            out[at..at + 2].copy_from_slice(&tag.to_le_bytes());
            let value = sizes[dice.below(sizes.len())];
            out[at + 8..at + 12].copy_from_slice(&value.to_le_bytes());
        }
        1 => {
            let kind: u16 = [1, 3, 4, 8, 9, 16][dice.below(6)];
            out[at + 2..at + 4].copy_from_slice(&kind.to_le_bytes());
        }
        2 => {
            let count: u32 = [0, 1, 2, 3][dice.below(4)];
            out[at + 4..at + 8].copy_from_slice(&count.to_le_bytes());
        }
        3 => {
            let value = sizes[dice.below(sizes.len())];
            out[at + 8..at + 12].copy_from_slice(&value.to_le_bytes());
        }
        _ => {
            let byte = at + dice.below(12);
            out[byte] ^= 1 << dice.below(8);
        }
    }
    out
}

/// `bytes` with one of its first `within` bytes changed.
fn flipped(bytes: &[u8], within: usize, dice: &mut Dice) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let at = dice.below(within.min(out.len()));
    out[at] = match dice.below(3) {
        0 => out[at] ^ (1 << dice.below(8)),
        1 => 0xff,
        _ => dice.next() as u8,
    };
    out
}

/// Checks `bytes` both ways: `Err` naming the disagreement.
fn agree(kind: FileType, coder: &str, bytes: &[u8]) -> Result<bool, String> {
    let Ok(checked) = image::pages(kind, bytes, &LIMITS) else {
        return Ok(false);
    };
    match decoded(coder, bytes) {
        Some(read) if read != checked => Err(format!(
            "the check passed {checked:?}, ImageMagick reads {read:?}"
        )),
        _ => Ok(true),
    }
}

#[test]
fn what_the_header_check_passes_the_decoder_reads_at_the_same_size() {
    let mut dice = Dice(0x5eed_1e55_d0c5_7e4d);
    let bases = [
        (FileType::Png, "png", made("png", "40x30", 1), 40),
        (FileType::Jpeg, "jpeg", made("jpeg", "40x30", 1), 200),
        (FileType::Tiff, "tiff", made("tiff", "40x30", 1), 0),
        (FileType::Tiff, "tiff", made("tiff", "40x30", 2), 0),
    ];
    let mut passed = 0;
    for (kind, coder, base, header) in &bases {
        assert_eq!(
            agree(*kind, coder, base),
            Ok(true),
            "{coder}: the image as made"
        );
        for n in 0..MUTANTS {
            let mutant = match kind {
                FileType::Tiff => tiff_mutant(base, &mut dice),
                _ => flipped(base, *header, &mut dice),
            };
            match agree(*kind, coder, &mutant) {
                Ok(through) => passed += usize::from(through),
                Err(why) => {
                    let path = std::env::temp_dir().join(format!("disagreeing-{coder}-{n}"));
                    std::fs::write(&path, &mutant).unwrap();
                    panic!("{coder} mutant {n} ({}): {why}", path.display());
                }
            }
        }
    }
    // The mutants are near enough to real images that many still pass.
    assert!(passed > MUTANTS, "only {passed} mutants passed the check");
}

#[test]
fn a_tiff_that_names_its_width_twice_is_refused_whichever_comes_first() {
    let base = made("tiff", "40x30", 1);
    let entries = tiff_entries(&base);
    // An entry past ImageWidth turned into a second ImageWidth of 60,000.
    let second = entries
        .iter()
        .copied()
        .find(|&at| u16::from_le_bytes(base[at..at + 2].try_into().unwrap()) > 257)
        .unwrap();
    let mut twice = base.clone();
    twice[second..second + 2].copy_from_slice(&256u16.to_le_bytes());
    twice[second + 2..second + 4].copy_from_slice(&4u16.to_le_bytes());
    twice[second + 4..second + 8].copy_from_slice(&1u32.to_le_bytes());
    twice[second + 8..second + 12].copy_from_slice(&60_000u32.to_le_bytes());
    let refused = image::pages(FileType::Tiff, &twice, &LIMITS).unwrap_err();
    assert!(
        refused.to_string().contains("ImageWidth more than once"),
        "{refused}"
    );
}
