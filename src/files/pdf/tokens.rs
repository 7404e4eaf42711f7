//! How many objects a content stream decodes into, counted before the
//! parser decodes it.
//!
//! lopdf turns every operand and operator of a content stream into an
//! object of tens of bytes, all held at once: `0 ` repeated through 120 MiB
//! of content (a 120 KB upload) is 63 million objects, several GB. A cap on
//! inflated bytes does not bound that; a count of the objects does, and the
//! count is one pass over bytes already inflated under the cap.

use super::scan::{is_regular, is_space};

/// The objects `content` decodes into (operators, operands, and the items
/// of arrays and dictionaries), counted to one past `limit`.
pub fn count(content: &[u8], limit: usize) -> usize {
    let mut objects = 0;
    let mut at = 0;
    while at < content.len() && objects <= limit {
        let b = content[at];
        at += 1;
        match b {
            b'%' => at = end_of_line(content, at),
            b'(' => {
                at = end_of_string(content, at);
                objects += 1;
            }
            b'<' if content.get(at) == Some(&b'<') => {
                at += 1;
                objects += 1;
            }
            b'<' => {
                at = content[at..]
                    .iter()
                    .position(|&b| b == b'>')
                    .map_or(content.len(), |n| at + n + 1);
                objects += 1;
            }
            b'[' | b'{' => objects += 1,
            b if is_space(b) || b")>]}".contains(&b) => {}
            // A name, number or operator: a run of regular bytes.
            _ => {
                while content.get(at).is_some_and(|&b| is_regular(b)) {
                    at += 1;
                }
                objects += 1;
            }
        }
    }
    objects
}

fn end_of_line(content: &[u8], from: usize) -> usize {
    let line = content[from..]
        .iter()
        .position(|&b| b == b'\n' || b == b'\r');
    line.map_or(content.len(), |n| from + n)
}

/// Where the literal string opened before `from` ends.
fn end_of_string(content: &[u8], from: usize) -> usize {
    let mut depth = 1usize;
    let mut at = from;
    while at < content.len() {
        match content[at] {
            b'\\' => at += 1,
            b'(' => depth += 1,
            b')' if depth == 1 => return at + 1,
            b')' => depth -= 1,
            _ => {}
        }
        at += 1;
    }
    content.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_and_operands_are_counted_strings_whole() {
        let content = b"BT /F1 12 Tf 72 700 Td (Hello (nested) \\) world) Tj [(a) -20 (b)] TJ ET % note\n<</MCID 0>> BDC <48656c6c6f> Tj";
        // BT /F1 12 Tf 72 700 Td (..) Tj [ (a) -20 (b) TJ ET << /MCID 0 BDC <..> Tj: 21
        assert_eq!(count(content, 100), 21);
    }

    #[test]
    fn counting_stops_one_past_the_limit() {
        let zeros = b"0 ".repeat(1_000_000);
        assert_eq!(count(&zeros, 1000), 1001);
        assert_eq!(count(&zeros, usize::MAX), 1_000_000);
    }
}
