//! What a printed amount or date means: `RM1,234.50` is 123450 cents,
//! `25 Dec 2018` and `25/12/18` are 2018-12-25. The rule extractor reads
//! candidates with these, and `docstream eval` compares values with them
//! ("right after normalisation").

use chrono::NaiveDate;

/// An amount in hundredths, as printed: `80.90`, `RM80.90`, `$1,234.50`,
/// `1.234,50`, `-0.01`, `12,50`. Two decimals are required, so a
/// quantity, a phone number or a year is not an amount.
pub fn money_cents(raw: &str) -> Option<i64> {
    // Most words of a page hold no digit: they are not amounts.
    if !raw.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    // Quotes, brackets and rules OCR reads around a number.
    let text = raw.trim_matches(|c: char| {
        !(c.is_alphanumeric() || matches!(c, '-' | '$' | '€' | '£' | '¥' | '.' | ','))
    });
    let text = strip_currency(
        text.trim_end_matches(['.', ','])
            .trim_end_matches(|c: char| {
                !(c.is_alphanumeric() || matches!(c, '-' | '$' | '€' | '£' | '¥'))
            }),
    );
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => match text.strip_suffix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        },
    };
    let text = strip_currency(text);
    let bytes = text.as_bytes();
    if !text.is_ascii() || bytes.len() < 4 || !bytes[0].is_ascii_digit() {
        return None;
    }
    // The decimal separator is the third byte from the end; any other
    // separator groups thousands.
    let (whole, fraction) = text.split_at(text.len() - 2);
    let separator = whole.chars().last()?;
    let whole = &whole[..whole.len() - 1];
    if !matches!(separator, '.' | ',') || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let grouping = match separator {
        '.' => ',',
        _ => '.',
    };
    let digits = grouped_digits(whole, grouping)?;
    let units: i64 = digits.parse().ok()?;
    let cents = units
        .checked_mul(100)?
        .checked_add(fraction.parse().ok()?)?;
    Some(if negative { -cents } else { cents })
}

/// `1,234` as `1234` (groups of three after the first), or plain digits.
fn grouped_digits(whole: &str, grouping: char) -> Option<String> {
    let groups: Vec<&str> = whole.split(grouping).collect();
    let first_ok = (1..=3).contains(&groups[0].len()) || groups.len() == 1;
    let rest_ok = groups[1..].iter().all(|g| g.len() == 3);
    let digits: String = groups.concat();
    let all_digits = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    (first_ok && rest_ok && all_digits && digits.len() <= 12).then_some(digits)
}

/// `RM80.90` → `80.90`: a currency sign or code printed against the number.
fn strip_currency(text: &str) -> &str {
    const CODES: [&str; 12] = [
        "RM", "MYR", "USD", "EUR", "GBP", "SGD", "S$", "US$", "$", "€", "£", "¥",
    ];
    let mut text = text.trim_end_matches([':', ';']);
    for code in CODES {
        if let Some(rest) = text.strip_prefix(code) {
            text = rest.trim_start();
            break;
        }
    }
    for code in CODES {
        if let Some(rest) = text.strip_suffix(code) {
            text = rest.trim_end();
            break;
        }
    }
    text
}

/// Cents as a value: `8090` → `80.90`, `-1` → `-0.01`.
pub fn cents_text(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    format!("{sign}{}.{:02}", cents / 100, cents % 100)
}

/// The date a printed date means, day first where the order is open:
/// `25/12/2018`, `25-12-18`, `25.12.2018`, `2018-12-25`, `2018/12/25`,
/// `25 Dec 2018`, `25-DEC-18`, `Dec 25, 2018`, `25DEC2018`. Two-digit years
/// are 2000–2069 or 1970–1999. `None` for anything else, and for a day
/// the calendar does not have.
pub fn date(raw: &str) -> Option<NaiveDate> {
    let text = raw.trim().trim_matches(|c: char| !c.is_alphanumeric());
    let (parts, separators) = split_date(text)?;
    match parts {
        [Part::Num(a, la), Part::Num(b, _), Part::Num(c, lc)] => {
            let (a, la, b, c, lc) = (&a, &la, &b, &c, &lc);
            // Numbers alone need one separator twice: `12 31 00` is a time.
            let [first, second] = separators;
            if first != second || !matches!(first, '/' | '-' | '.') {
                None
            } else if *la == 4 {
                ymd(*a, *b, *c)
            } else if *lc == 4 || *lc == 2 {
                // Day first; a month over 12 means the other order.
                ymd(year(*c, *lc)?, *b, *a).or_else(|| ymd(year(*c, *lc)?, *a, *b))
            } else {
                None
            }
        }
        [Part::Num(d, ld), Part::Month(m), Part::Num(y, ly)] if ld <= 2 => ymd(year(y, ly)?, m, d),
        [Part::Month(m), Part::Num(d, ld), Part::Num(y, ly)] if ld <= 2 => ymd(year(y, ly)?, m, d),
        [Part::Num(y, 4), Part::Month(m), Part::Num(d, ld)] if ld <= 2 => ymd(y, m, d),
        _ => None,
    }
}

/// The first numeric date inside `text`, glued to other characters:
/// `Date25/12/20188:13:39PM` holds 2018-12-25 (a four-digit year is taken
/// before a two-digit one).
pub fn date_within(text: &str) -> Option<NaiveDate> {
    static NUMERIC: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}([/.-])\d{1,2}([/.-])(?:\d{4}|\d{2})")
            .expect("a valid pattern")
    });
    NUMERIC.find_iter(text).find_map(|m| date(m.as_str()))
}

/// A date as ISO 8601: `2018-12-25`.
pub fn iso(date: NaiveDate) -> String {
    date.format("%Y-%m-%d").to_string()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    /// A number and how many digits it was printed with.
    Num(u32, usize),
    /// A month's name, as its number.
    Month(u32),
}

/// `25/12/2018` → three numbers and the two separators (`/`, `/`);
/// `25DEC2018` → number, month, number (no separators: `_`).
fn split_date(text: &str) -> Option<([Part; 3], [char; 2])> {
    let mut parts = [Part::Num(0, 0); 3];
    let mut count = 0;
    let mut separators = ['_'; 2];
    let mut rest = text;
    while !rest.is_empty() {
        let start = rest.trim_start_matches(['/', '-', '.', ' ', ',']);
        if start.is_empty() {
            break;
        }
        let digits = start.bytes().take_while(u8::is_ascii_digit).count();
        let (part, len) = match digits {
            0 => {
                let letters = start.chars().take_while(|c| c.is_alphabetic()).count();
                let word: String = start.chars().take(letters).collect();
                (Part::Month(month(&word)?), word.len())
            }
            1..=4 => (Part::Num(start[..digits].parse().ok()?, digits), digits),
            _ => return None,
        };
        *parts.get_mut(count)? = part;
        count += 1;
        rest = &start[len..];
        // Separators are short: `25 / 12` is not one date.
        let after = rest.trim_start_matches(['/', '-', '.', ' ', ',']);
        let gap = &rest[..rest.len() - after.len()];
        if gap.len() > 2 {
            return None;
        }
        if let (Some(slot), Some(c)) = (separators.get_mut(count - 1), gap.chars().next()) {
            *slot = c;
        }
    }
    (count == 3).then_some((parts, separators))
}

/// True when `word` (letters, maybe with punctuation around) names a
/// month: `Dec`, `december,`.
pub fn is_month(word: &str) -> bool {
    month(word.trim_matches(|c: char| !c.is_alphabetic())).is_some()
}

fn month(word: &str) -> Option<u32> {
    const NAMES: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    if word.len() < 3 || word.len() > 9 || !word.is_ascii() {
        return None;
    }
    let lower = word.to_ascii_lowercase();
    let prefix = lower.get(..3)?;
    let index = NAMES.iter().position(|n| *n == prefix)?;
    let full = [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ][index];
    let spelled = lower.len() == 3 || full.starts_with(&lower) || lower == "sept";
    spelled.then_some(index as u32 + 1)
}

fn year(value: u32, digits: usize) -> Option<i32> {
    match digits {
        4 => Some(value as i32),
        2 if value < 70 => Some(2000 + value as i32),
        2 => Some(1900 + value as i32),
        _ => None,
    }
}

fn ymd(year: impl TryInto<i32>, month: u32, day: u32) -> Option<NaiveDate> {
    let year = year.try_into().ok()?;
    if !(1900..=2100).contains(&year) {
        return None;
    }
    NaiveDate::from_ymd_opt(year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_as_printed() {
        let cases = [
            ("80.90", Some(8090)),
            ("RM80.90", Some(8090)),
            ("RM 80.90", Some(8090)),
            ("$1,234.50", Some(123_450)),
            ("1.234,50", Some(123_450)),
            ("12,50", Some(1250)),
            ("-0.01", Some(-1)),
            ("0.01-", Some(-1)),
            ("80.90:", Some(8090)),
            ("1,23.45", None),
            ("2018", None),
            ("07-3523888", None),
            ("12.5", None),
            ("1.2.34", None),
            ("abc", None),
            ("1.2é", None),
            ("€€€€", None),
            ("€12.50", Some(1250)),
            ("‘101.00", Some(10100)),
            ("(12.50)", Some(1250)),
            ("12.50.", Some(1250)),
        ];
        for (raw, cents) in cases {
            assert_eq!(money_cents(raw), cents, "{raw}");
        }
        assert_eq!(cents_text(8090), "80.90");
        assert_eq!(cents_text(-1), "-0.01");
    }

    #[test]
    fn dates_in_the_common_printed_formats() {
        let day = NaiveDate::from_ymd_opt(2018, 12, 25);
        for raw in [
            "25/12/2018",
            "25-12-18",
            "25.12.2018",
            "2018-12-25",
            "2018/12/25",
            "25 Dec 2018",
            "25-DEC-18",
            "Dec 25, 2018",
            "25DEC2018",
            "25 December 2018",
            "12/25/2018",
        ] {
            assert_eq!(date(raw), day, "{raw}");
        }
        assert_eq!(date("05/01/2019"), NaiveDate::from_ymd_opt(2019, 1, 5));
        for raw in [
            "31/02/2018",
            "12 31 00",
            "07-3523888",
            "1/2",
            "Decor 25 2018",
            "25 / 12 / 2018x",
        ] {
            assert_eq!(date(raw), None, "{raw}");
        }
        assert_eq!(iso(day.unwrap()), "2018-12-25");
        assert_eq!(date_within("Date:25/12/20188:13:39PM"), day);
        assert_eq!(date_within("Tel07-3523888"), None);
    }
}
