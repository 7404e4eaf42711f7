//! The lines of a page, as a reader sees them: a label and the amount
//! printed to its right are one line, even when OCR read the labels'
//! column and the amounts' column as separate blocks. Positioned words are
//! grouped by where they sit (a word joins the line it overlaps most in
//! height, by half its height or more); a text document's lines are its
//! text's. Within a line, words run left to right.

use crate::domain::WordRef;

/// One line: its page and its words, as indices into the document's words,
/// left to right.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Page index.
    pub page: usize,
    /// Word indices, left to right.
    pub words: Vec<usize>,
}

/// The lines of a document, top to bottom, page by page. `text` is the
/// text of a text document (its newlines end lines); positioned words
/// carry their boxes.
pub fn lines(words: &[WordRef<'_>], text: Option<&str>) -> Vec<Line> {
    match words.first().and_then(|w| w.bbox) {
        Some(_) => positioned(words),
        None => text_lines(text.unwrap_or_default()),
    }
}

/// The lines of a text: its words numbered as `Document::words` numbers
/// them (split on whitespace), ended by its newlines.
fn text_lines(text: &str) -> Vec<Line> {
    let mut next = 0;
    let mut lines = Vec::new();
    for line in text.lines() {
        let count = line.split_whitespace().count();
        if count > 0 {
            lines.push(Line {
                page: 0,
                words: (next..next + count).collect(),
            });
        }
        next += count;
    }
    lines
}

/// A line as it is built: its words and the mean of their tops and bottoms.
struct Band {
    page: usize,
    words: Vec<usize>,
    top: f64,
    bottom: f64,
}

impl Band {
    /// How much of `[top, bottom]` the band overlaps, as a share of the
    /// smaller of the two heights.
    fn overlap(&self, top: f64, bottom: f64) -> f64 {
        let shared = self.bottom.min(bottom) - self.top.max(top);
        let least = (self.bottom - self.top).min(bottom - top).max(f64::EPSILON);
        shared / least
    }

    fn add(&mut self, index: usize, top: f64, bottom: f64) {
        let n = self.words.len() as f64;
        self.top = (self.top * n + top) / (n + 1.0);
        self.bottom = (self.bottom * n + bottom) / (n + 1.0);
        self.words.push(index);
    }
}

/// Positioned words into lines: taken top to bottom (by the middle of
/// their height), each joins the open line it overlaps most, by half its
/// height or more, or starts one.
fn positioned(words: &[WordRef<'_>]) -> Vec<Line> {
    let frame = Frame::of(words);
    let boxes: Vec<[f64; 4]> = (words.iter())
        .map(|w| frame.turn(w.bbox.unwrap_or_default()))
        .collect();
    let mut order: Vec<usize> = (0..words.len())
        .filter(|&i| words[i].bbox.is_some())
        .collect();
    let middle = |i: usize| (boxes[i][1] + boxes[i][3]) / 2.0;
    order.sort_by(|&a, &b| {
        (words[a].page.cmp(&words[b].page)).then(middle(a).total_cmp(&middle(b)))
    });
    let mut bands: Vec<Band> = Vec::new();
    // Lines still open: those whose bottom a later word may reach.
    let mut open_from = 0;
    for index in order {
        let (page, [_, top, _, bottom]) = (words[index].page, boxes[index]);
        while open_from < bands.len()
            && (bands[open_from].page != page || bands[open_from].bottom < top)
        {
            open_from += 1;
        }
        let best = (open_from..bands.len())
            .map(|b| (b, bands[b].overlap(top, bottom)))
            .filter(|&(_, overlap)| overlap >= 0.5)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((b, _)) => bands[b].add(index, top, bottom),
            None => bands.push(Band {
                page,
                words: vec![index],
                top,
                bottom,
            }),
        }
    }
    let left = |i: &usize| boxes[*i][0];
    bands.sort_by(|a, b| {
        a.page
            .cmp(&b.page)
            .then((a.top + a.bottom).total_cmp(&(b.top + b.bottom)))
    });
    bands
        .into_iter()
        .map(|mut band| {
            band.words.sort_by(|a, b| left(a).total_cmp(&left(b)));
            Line {
                page: band.page,
                words: band.words,
            }
        })
        .collect()
}

/// The direction a page's text runs, as uploaded.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Frame {
    /// Left to right: the page is upright.
    Right,
    /// Top to bottom: turned 90° clockwise.
    Down,
    /// Right to left: upside down.
    Left,
    /// Bottom to top: turned 90° counter-clockwise.
    Up,
}

impl Frame {
    /// The direction the text runs: along the longer side of most words'
    /// boxes (of three bytes or more), towards where the reading order
    /// steps from one word to the next on the same line (columns read one
    /// after the other step across lines, and do not count).
    fn of(words: &[WordRef<'_>]) -> Self {
        let (mut across, mut down) = (0usize, 0usize);
        for word in words.iter().filter(|w| w.text.len() >= 3) {
            let Some([x0, y0, x1, y1]) = word.bbox else {
                continue;
            };
            match x1 - x0 >= y1 - y0 {
                true => across += 1,
                false => down += 1,
            }
        }
        let across = across >= down;
        let (mut forward, mut back) = (0usize, 0usize);
        for pair in words.windows(2) {
            let (Some(a), Some(b)) = (pair[0].bbox, pair[1].bbox) else {
                continue;
            };
            if pair[0].page != pair[1].page {
                continue;
            }
            // Along the text, and across it (where a line's words agree).
            let (along, off, thickness) = match across {
                true => (
                    b[0] - a[0],
                    (b[1] + b[3] - a[1] - a[3]) / 2.0,
                    (a[3] - a[1]).min(b[3] - b[1]),
                ),
                false => (
                    b[1] - a[1],
                    (b[0] + b[2] - a[0] - a[2]) / 2.0,
                    (a[2] - a[0]).min(b[2] - b[0]),
                ),
            };
            if off.abs() < thickness / 2.0 {
                match along >= 0.0 {
                    true => forward += 1,
                    false => back += 1,
                }
            }
        }
        match (across, forward >= back) {
            (true, true) => Frame::Right,
            (true, false) => Frame::Left,
            (false, true) => Frame::Down,
            (false, false) => Frame::Up,
        }
    }

    /// `[x0, y0, x1, y1]` on the page as uploaded, in the frame where the
    /// text runs left to right and lines follow top to bottom.
    fn turn(self, [x0, y0, x1, y1]: [f64; 4]) -> [f64; 4] {
        match self {
            Frame::Right => [x0, y0, x1, y1],
            Frame::Down => [y0, -x1, y1, -x0],
            Frame::Left => [-x1, -y1, -x0, -y0],
            Frame::Up => [-y1, x0, -y0, x1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(text: &str, bbox: [f64; 4]) -> WordRef<'_> {
        WordRef {
            text,
            page: 0,
            bbox: Some(bbox),
            confidence: None,
        }
    }

    #[test]
    fn a_label_and_its_amount_are_one_line_whatever_the_reading_order() {
        // OCR read the labels' column, then the amounts' column.
        let words = [
            word("TOTAL", [10.0, 100.0, 60.0, 112.0]),
            word("CASH", [10.0, 120.0, 50.0, 132.0]),
            word("80.90", [200.0, 101.0, 240.0, 113.0]),
            word("100.00", [200.0, 121.0, 250.0, 133.0]),
        ];
        let lines = lines(&words, None);
        let texts: Vec<Vec<&str>> = lines
            .iter()
            .map(|l| l.words.iter().map(|&i| words[i].text).collect())
            .collect();
        assert_eq!(texts, vec![vec!["TOTAL", "80.90"], vec!["CASH", "100.00"]]);
    }

    #[test]
    fn a_page_on_its_side_or_upside_down_has_the_same_lines() {
        let upright = [
            ("TOTAL", [10.0, 100.0, 60.0, 112.0]),
            ("DUE", [70.0, 100.0, 100.0, 112.0]),
            ("CASH", [10.0, 120.0, 50.0, 132.0]),
            ("80.90", [200.0, 101.0, 240.0, 113.0]),
            ("100.00", [200.0, 121.0, 250.0, 133.0]),
        ];
        let (w, h) = (300.0, 400.0);
        type Turn<'a> = &'a dyn Fn([f64; 4]) -> [f64; 4];
        let turns: [(&str, Turn); 4] = [
            ("upright", &|b| b),
            ("90° clockwise", &|[x0, y0, x1, y1]| {
                [h - y1, x0, h - y0, x1]
            }),
            ("180°", &|[x0, y0, x1, y1]| {
                [w - x1, h - y1, w - x0, h - y0]
            }),
            ("90° counter-clockwise", &|[x0, y0, x1, y1]| {
                [y0, w - x1, y1, w - x0]
            }),
        ];
        for (what, turn) in turns {
            let words: Vec<WordRef> = upright.iter().map(|(t, b)| word(t, turn(*b))).collect();
            let texts: Vec<Vec<&str>> = lines(&words, None)
                .iter()
                .map(|l| l.words.iter().map(|&i| words[i].text).collect())
                .collect();
            assert_eq!(
                texts,
                vec![vec!["TOTAL", "DUE", "80.90"], vec!["CASH", "100.00"]],
                "{what}"
            );
        }
    }

    #[test]
    fn a_text_documents_lines_are_its_texts() {
        let text = "Subtotal 10.00\n\n  Total   12.00 \nThanks";
        let words: Vec<WordRef> = text
            .split_whitespace()
            .map(|text| WordRef {
                text,
                page: 0,
                bbox: None,
                confidence: None,
            })
            .collect();
        let lines = lines(&words, Some(text));
        let indices: Vec<Vec<usize>> = lines.into_iter().map(|l| l.words).collect();
        assert_eq!(indices, vec![vec![0, 1], vec![2, 3], vec![4]]);
    }
}
