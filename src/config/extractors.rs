//! Named external extractors: each an HTTP service that implements the
//! extractor protocol (see `extract::http`), with its own call timeout, a
//! concurrency cap across the deployment (and optionally per process), and a
//! rate limit across the deployment.
//!
//! In TOML they are tables, `[extractors.NAME]`. In the environment,
//! `DOCSTREAM_EXTRACTORS` lists the names (comma-separated) and each name's
//! settings are `DOCSTREAM_EXTRACTOR_<NAME>_<SETTING>` (the name upper-cased,
//! `-` as `_`), e.g. `DOCSTREAM_EXTRACTOR_OCR_URL`. The environment wins over
//! the file, setting by setting.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::types::{ConfigError, Described};

/// The built-in rule extractor's name; no external extractor may take it.
pub const RULES: &str = crate::domain::RULES_EXTRACTOR;

use crate::domain::{
    extractor_name_is_valid as name_is_valid, MAX_EXTRACTOR_NAME_LEN as MAX_NAME_LEN,
};

/// The longest any of an extractor's durations may be: a day. Longer is a
/// typo, and would not fit the timers and intervals it becomes.
const MAX_SECONDS: f64 = 86_400.0;

/// The lowest rate limit: one call in 1,000 seconds.
const MIN_RATE: f64 = 0.001;

/// Declares an extractor's settings once: field, type, default, and the
/// suffix of its variable (`DOCSTREAM_EXTRACTOR_<NAME>_<SUFFIX>`). It
/// generates the struct, its defaults, reading the environment, writing it
/// for another process, and the description the manual's table is made of.
macro_rules! extractor_settings {
    ($( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr, suffix $suffix:literal; )*) => {
        /// One external extractor.
        #[derive(Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct ExtractorSettings {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        /// Every setting, the token as `***`.
        impl std::fmt::Debug for ExtractorSettings {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let mut out = f.debug_struct("ExtractorSettings");
                $(
                    match $suffix == "TOKEN" {
                        true => out.field(stringify!($field), &"***"),
                        false => out.field(stringify!($field), &self.$field),
                    };
                )*
                out.finish()
            }
        }

        impl Default for ExtractorSettings {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl ExtractorSettings {
            /// Overrides each setting whose variable (of extractor `name`)
            /// `lookup` knows.
            fn apply_env(
                &mut self,
                name: &str,
                lookup: &dyn Fn(&str) -> Option<String>,
            ) -> Result<(), ConfigError> {
                $(
                    let var = env_var(name, $suffix);
                    if let Some(value) = lookup(&var) {
                        self.$field = value.parse().map_err(|e: <$ty as std::str::FromStr>::Err| {
                            ConfigError::Env { var, value, reason: e.to_string() }
                        })?;
                    }
                )*
                Ok(())
            }

            /// Every setting as the variables (of extractor `name`) that set it.
            fn env(&self, name: &str) -> Vec<(String, String)> {
                vec![$( (env_var(name, $suffix), self.$field.to_string()), )*]
            }

            /// Each setting's variable (with `<NAME>` for the extractor's
            /// name), its default and what it is for.
            pub fn described() -> Vec<Described> {
                let defaults = Self::default().env("<NAME>");
                let docs: Vec<&[&str]> = vec![$( &[$($doc),*] ),*];
                defaults
                    .into_iter()
                    .zip(docs)
                    .map(|((var, default), doc)| Described::new(var, default, doc))
                    .collect()
            }
        }
    };
}

extractor_settings! {
    /// Where calls are posted: an absolute http(s) URL. Operators configure it,
    /// so it is trusted (no SSRF guard: the provider usually lives next door).
    url: String = String::new(), suffix "URL";
    /// Longest one call may take, connect to last byte; past it the attempt
    /// fails and is retried. 300 s: model services take seconds to minutes.
    /// The claim's heartbeats run all along, so this may exceed the lease.
    timeout_s: f64 = 300.0, suffix "TIMEOUT_S";
    /// Calls the whole deployment makes at once, however many worker
    /// replicas run: each call leases one of this many slots in Postgres
    /// (see `extract::slots`). Records beyond it wait for a slot while their
    /// claims are renewed. 8 suits a small model service.
    max_concurrency: usize = 8, suffix "MAX_CONCURRENCY";
    /// Calls one worker process makes at once, a second, local bound under
    /// `max_concurrency`; 0, the default, sets none (the deployment's cap
    /// alone).
    process_max_concurrency: usize = 0, suffix "PROCESS_MAX_CONCURRENCY";
    /// Calls one tenant's jobs make at once across the deployment, a share
    /// of `max_concurrency` so that one tenant cannot take every slot (each
    /// call then also leases one of its tenant's slots: see
    /// `extract::slots`). 0, the default, sets none.
    tenant_max_concurrency: usize = 0, suffix "TENANT_MAX_CONCURRENCY";
    /// Calls per second the whole deployment starts, spaced evenly (a next
    /// start time in Postgres that each call moves on). 0, the default,
    /// sets no limit.
    requests_per_second: f64 = 0.0, suffix "REQUESTS_PER_SECOND";
    /// Sent as `Authorization: Bearer …` when not empty.
    token: String = String::new(), suffix "TOKEN";
    /// The longest one attempt waits in total on `Retry-After` answers (429,
    /// 503) before it counts as failed and spends an attempt: a provider that
    /// only ever asks to wait cannot hold a job forever. 600 s.
    retry_after_budget_s: f64 = 600.0, suffix "RETRY_AFTER_BUDGET_S";
    /// The longest a deferred extraction (answered 202) holds its claim
    /// waiting for its result; the provider's `deadline_s` is capped at it.
    /// Past it, the job is retried. 1,200 s: the reference design's 20 minutes.
    deferred_deadline_s: f64 = 1200.0, suffix "DEFERRED_DEADLINE_S";
    /// The version of the extractor protocol the provider speaks: 1 (the
    /// default) takes documents as JSON only; 2 also takes a job's file,
    /// as a signed URL to fetch it from, and may answer the words it found
    /// on each page.
    protocol: u32 = 1, suffix "PROTOCOL";
}

impl ExtractorSettings {
    /// Whether the provider takes a job's file (protocol version 2).
    pub fn takes_files(&self) -> bool {
        self.protocol >= 2
    }

    /// `timeout_s` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }

    /// The calls one process makes at once: its own bound, else the
    /// deployment's cap.
    pub fn process_cap(&self) -> usize {
        match self.process_max_concurrency {
            0 => self.max_concurrency,
            local => local.min(self.max_concurrency),
        }
    }

    /// `retry_after_budget_s` as a duration.
    pub fn retry_after_budget(&self) -> Duration {
        Duration::from_secs_f64(self.retry_after_budget_s)
    }

    fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let var = |setting: &str| env_var(name, setting);
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        match reqwest::Url::parse(&self.url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
            _ => {
                return invalid(format!(
                    "{}={:?}: an extractor needs an absolute http or https URL",
                    var("URL"),
                    self.url
                ))
            }
        }
        for (setting, secs) in [
            ("TIMEOUT_S", self.timeout_s),
            ("RETRY_AFTER_BUDGET_S", self.retry_after_budget_s),
            ("DEFERRED_DEADLINE_S", self.deferred_deadline_s),
        ] {
            if !(secs.is_finite() && secs > 0.0 && secs <= MAX_SECONDS) {
                return invalid(format!(
                    "{} must be a positive number of seconds, at most {MAX_SECONDS} (a day)",
                    var(setting)
                ));
            }
        }
        if self.max_concurrency == 0 {
            return invalid(format!("{} must be at least 1", var("MAX_CONCURRENCY")));
        }
        if !matches!(self.protocol, 1 | 2) {
            return invalid(format!("{} must be 1 or 2", var("PROTOCOL")));
        }
        if self.tenant_max_concurrency > self.max_concurrency {
            return invalid(format!(
                "{} must be 0 (no share) or at most {} ({}): a tenant's share of the cap",
                var("TENANT_MAX_CONCURRENCY"),
                self.max_concurrency,
                var("MAX_CONCURRENCY")
            ));
        }
        let rate = self.requests_per_second;
        if !(rate == 0.0 || (rate.is_finite() && rate >= MIN_RATE)) {
            return invalid(format!(
                "{} must be 0 (no limit) or at least {MIN_RATE} (one call in 1,000 s)",
                var("REQUESTS_PER_SECOND")
            ));
        }
        Ok(())
    }
}

/// The environment variable of `setting` of extractor `name`.
pub fn env_var(name: &str, setting: &str) -> String {
    let upper = name.to_ascii_uppercase().replace('-', "_");
    format!("DOCSTREAM_EXTRACTOR_{upper}_{setting}")
}

/// Adds and overrides extractors from the environment.
pub(super) fn apply_env(
    extractors: &mut BTreeMap<String, ExtractorSettings>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let names = lookup("DOCSTREAM_EXTRACTORS").unwrap_or_default();
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !name_is_valid(name) {
            return Err(ConfigError::Invalid(format!(
                "DOCSTREAM_EXTRACTORS: {name:?} is not a valid extractor name (a-z, 0-9, - and _)"
            )));
        }
        let entry = extractors.entry(name.to_owned()).or_default();
        entry.apply_env(name, lookup)?;
    }
    Ok(())
}

/// The environment that configures `extractors` in another process: the
/// inverse of reading it (`DOCSTREAM_EXTRACTORS` and each extractor's variables).
pub fn env_of(extractors: &BTreeMap<String, ExtractorSettings>) -> Vec<(String, String)> {
    let names: Vec<&str> = extractors.keys().map(String::as_str).collect();
    let mut env = vec![("DOCSTREAM_EXTRACTORS".to_owned(), names.join(","))];
    for (name, settings) in extractors {
        env.extend(settings.env(name));
    }
    env
}

/// Refuses names and settings that cannot work.
pub(super) fn validate(
    extractors: &BTreeMap<String, ExtractorSettings>,
) -> Result<(), ConfigError> {
    for (name, settings) in extractors {
        if name == RULES || !name_is_valid(name) {
            return Err(ConfigError::Invalid(format!(
                "extractor name {name:?}: names are 1 to {MAX_NAME_LEN} of a-z, 0-9, - and _, and {RULES:?} is the built-in one"
            )));
        }
        settings.validate(name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_env(vars: &[(&str, &str)]) -> Result<BTreeMap<String, ExtractorSettings>, ConfigError> {
        let mut extractors = BTreeMap::new();
        apply_env(&mut extractors, &|var| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        })?;
        validate(&extractors)?;
        Ok(extractors)
    }

    #[test]
    fn extractors_are_named_in_one_variable_and_set_in_their_own() {
        let extractors = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr, layout-v2"),
            (
                "DOCSTREAM_EXTRACTOR_OCR_URL",
                "http://ocr.internal:8000/extract",
            ),
            ("DOCSTREAM_EXTRACTOR_OCR_MAX_CONCURRENCY", "4"),
            ("DOCSTREAM_EXTRACTOR_LAYOUT_V2_URL", "https://layout/x"),
            ("DOCSTREAM_EXTRACTOR_LAYOUT_V2_REQUESTS_PER_SECOND", "2.5"),
        ])
        .unwrap();
        assert_eq!(extractors["ocr"].max_concurrency, 4);
        assert_eq!(extractors["layout-v2"].requests_per_second, 2.5);
        assert_eq!(extractors["layout-v2"].max_concurrency, 8);
    }

    #[test]
    fn the_environment_written_for_a_child_reads_back_the_same() {
        let extractors = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr,layout"),
            ("DOCSTREAM_EXTRACTOR_OCR_URL", "http://ocr/x"),
            ("DOCSTREAM_EXTRACTOR_OCR_TOKEN", "t"),
            ("DOCSTREAM_EXTRACTOR_LAYOUT_URL", "http://layout/x"),
            ("DOCSTREAM_EXTRACTOR_LAYOUT_DEFERRED_DEADLINE_S", "60"),
            ("DOCSTREAM_EXTRACTOR_LAYOUT_TENANT_MAX_CONCURRENCY", "2"),
        ])
        .unwrap();
        assert_eq!(extractors["layout"].tenant_max_concurrency, 2);
        let env = env_of(&extractors);
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(from_env(&pairs).unwrap(), extractors);
    }

    #[test]
    fn bad_extractors_are_refused_by_their_variable() {
        let err = from_env(&[("DOCSTREAM_EXTRACTORS", "ocr")]).unwrap_err();
        assert!(
            err.to_string().contains("DOCSTREAM_EXTRACTOR_OCR_URL"),
            "{err}"
        );
        let err = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr"),
            ("DOCSTREAM_EXTRACTOR_OCR_URL", "http://x/"),
            ("DOCSTREAM_EXTRACTOR_OCR_MAX_CONCURRENCY", "0"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("MAX_CONCURRENCY"), "{err}");
        let err = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr"),
            ("DOCSTREAM_EXTRACTOR_OCR_URL", "http://x/"),
            ("DOCSTREAM_EXTRACTOR_OCR_TIMEOUT_S", "soon"),
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("DOCSTREAM_EXTRACTOR_OCR_TIMEOUT_S"),
            "{err}"
        );
        let err = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr"),
            ("DOCSTREAM_EXTRACTOR_OCR_URL", "http://x/"),
            ("DOCSTREAM_EXTRACTOR_OCR_DEFERRED_DEADLINE_S", "1e20"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        let err = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr"),
            ("DOCSTREAM_EXTRACTOR_OCR_URL", "http://x/"),
            ("DOCSTREAM_EXTRACTOR_OCR_REQUESTS_PER_SECOND", "1e-320"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("REQUESTS_PER_SECOND"), "{err}");
        let err = from_env(&[
            ("DOCSTREAM_EXTRACTORS", "ocr"),
            ("DOCSTREAM_EXTRACTOR_OCR_URL", "http://x/"),
            ("DOCSTREAM_EXTRACTOR_OCR_MAX_CONCURRENCY", "4"),
            ("DOCSTREAM_EXTRACTOR_OCR_TENANT_MAX_CONCURRENCY", "5"),
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains(
                "DOCSTREAM_EXTRACTOR_OCR_TENANT_MAX_CONCURRENCY must be 0 (no share) or at most 4"
            ),
            "{err}"
        );
        assert!(from_env(&[("DOCSTREAM_EXTRACTORS", "rules")]).is_err());
        assert!(from_env(&[("DOCSTREAM_EXTRACTORS", "OCR")]).is_err());
    }
}
