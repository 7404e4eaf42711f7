//! `docstream settings`: the settings a process would run with, checked
//! without connecting to anything. A deployment (a Helm chart's rendered
//! environment, a compose file) runs it to learn that every variable it
//! sets is one docstream reads, and that the values keep their rules.

use super::{Settings, SECRET_SETTINGS};

/// Variables docstream reads that are not settings of [`Settings`]: the
/// settings file, the external extractors (`DOCSTREAM_EXTRACTORS`, then
/// `DOCSTREAM_EXTRACTOR_<NAME>_…`), logging, fault injection for tests, and
/// the reference extractor's token.
const OTHER_VARIABLES: &[&str] = &[
    "DOCSTREAM_CONFIG",
    "DOCSTREAM_EXTRACTORS",
    "DOCSTREAM_LOG",
    "DOCSTREAM_FAILPOINTS",
    "DOCSTREAM_ALLOW_FAILPOINTS",
    "DOCSTREAM_PROVIDER_TOKEN",
];

/// Each external extractor's variables start with this.
const EXTRACTOR_PREFIX: &str = "DOCSTREAM_EXTRACTOR_";

/// A variable no setting reads, and the known one nearest its spelling.
#[derive(Debug, PartialEq)]
pub struct Unknown {
    /// The variable as set.
    pub variable: String,
    /// The variable docstream reads that it is likely a misspelling of.
    pub nearest: Option<String>,
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not a setting", self.variable)?;
        match &self.nearest {
            Some(nearest) => write!(f, " (did you mean {nearest}?)"),
            None => Ok(()),
        }
    }
}

/// Every variable docstream reads by that name.
fn known() -> Vec<String> {
    let settings = Settings::described().into_iter().map(|(_, d)| d.var);
    let files = SECRET_SETTINGS.iter().map(|s| format!("{s}_FILE"));
    (settings.chain(files))
        .chain(OTHER_VARIABLES.iter().map(|s| s.to_string()))
        .collect()
}

/// The `DOCSTREAM_…` variables among `names` that docstream does not read:
/// a misspelt one is a setting silently left at its default.
pub fn unknown_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<Unknown> {
    let known = known();
    let mut unknown: Vec<Unknown> = (names.into_iter())
        .filter(|name| name.starts_with("DOCSTREAM_") && !name.starts_with(EXTRACTOR_PREFIX))
        .filter(|name| !known.iter().any(|k| k == name))
        .map(|name| Unknown {
            variable: name.to_owned(),
            nearest: nearest(name, &known),
        })
        .collect();
    unknown.sort_by(|a, b| a.variable.cmp(&b.variable));
    unknown
}

/// The name in `known` at most a few edits from `name`, if one is.
fn nearest(name: &str, known: &[String]) -> Option<String> {
    const MOST_EDITS: usize = 3;
    (known.iter())
        .map(|k| (edits(name, k), k))
        .filter(|(d, _)| *d <= MOST_EDITS)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.clone())
}

/// Levenshtein distance between `a` and `b`.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Whether variable `name` holds a secret: one of [`SECRET_SETTINGS`], or
/// an external extractor's token.
fn is_secret(name: &str) -> bool {
    SECRET_SETTINGS.contains(&name)
        || (name.starts_with(EXTRACTOR_PREFIX) && name.ends_with("_TOKEN"))
}

/// The settings as the variables that set them, one `NAME=value` a line,
/// sorted, each secret as `***` (a URL's password only, so the host shows).
pub fn listing(settings: &Settings) -> String {
    let mut env = settings.to_env();
    env.sort();
    let mut out = String::new();
    for (name, value) in env {
        let shown = match (is_secret(&name), reqwest::Url::parse(&value)) {
            (false, _) => value,
            (true, _) if value.is_empty() => value,
            (true, Ok(mut url)) if url.password().is_some() => {
                let _ = url.set_password(Some("***"));
                url.to_string()
            }
            (true, _) => "***".to_owned(),
        };
        out.push_str(&format!("{name}={shown}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_no_setting_reads_is_named_with_the_one_meant() {
        let given = [
            "DOCSTREAM_KAFKA_BROKERS",
            "DATABASE_URL_FILE",
            "DOCSTREAM_KAFKA_BROKER",
            "DOCSTREAM_EXTRACTOR_OCR_URL",
            "DOCSTREAM_WHATEVER_ELSE_ENTIRELY",
            "HOME",
        ];
        let unknown = unknown_variables(given);
        assert_eq!(
            unknown,
            vec![
                Unknown {
                    variable: "DOCSTREAM_KAFKA_BROKER".into(),
                    nearest: Some("DOCSTREAM_KAFKA_BROKERS".into()),
                },
                Unknown {
                    variable: "DOCSTREAM_WHATEVER_ELSE_ENTIRELY".into(),
                    nearest: None,
                },
            ]
        );
        assert_eq!(
            unknown[0].to_string(),
            "DOCSTREAM_KAFKA_BROKER is not a setting (did you mean DOCSTREAM_KAFKA_BROKERS?)"
        );
    }

    #[test]
    fn the_listing_hides_secrets_and_keeps_where_they_lead() {
        let settings = Settings {
            database_url: "postgres://app:hunter2@db.internal:5432/docstream".into(),
            callback_secret: "0123456789abcdef0123".into(),
            ..Settings::default()
        };
        let listing = listing(&settings);
        assert!(!listing.contains("hunter2"), "{listing}");
        assert!(!listing.contains("0123456789abcdef0123"), "{listing}");
        assert!(listing.contains("DATABASE_URL=postgres://app:***@db.internal:5432/docstream\n"));
        assert!(listing.contains("DOCSTREAM_CALLBACK_SECRET=***\n"));
        assert!(listing.contains("DOCSTREAM_KAFKA_BROKERS=127.0.0.1:59092\n"));
    }
}
