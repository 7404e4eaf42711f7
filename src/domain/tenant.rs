//! Tenants and their API keys, as plain data: what a key may do (its
//! [`Scope`]s), what a tenant may be called, and how a key is made and
//! recognised. A key is 256 random bits; only its SHA-256 is ever stored.

use std::fmt;

use rand::TryRng;
use sha2::{Digest, Sha256};

/// What an API key allows. A request needs exactly the scope of its route;
/// no scope implies another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// `POST /v1/extractions`, the import stream, the Kafka intake.
    Submit,
    /// `GET /v1/extractions/{id}`.
    Read,
    /// `POST /v1/extractions/{id}/cancel`.
    Cancel,
    /// The export stream.
    Export,
    /// The tenant's own administration (webhook secrets).
    Admin,
    /// `DELETE /v1/extractions/{id}`: erasing a job's content.
    Delete,
    /// Correcting an extracted value (`POST
    /// /v1/extractions/{id}/fields/{field}/corrections`): a person's review.
    Review,
    /// The deployment's operators: every tenant's queue, quotas and keys
    /// (`/v1/operator/…`). It crosses tenants, so no tenant's own key needs
    /// it; give it to the keys of a tenant kept for operators.
    Operator,
}

impl Scope {
    /// Every scope, in the order they are listed.
    pub const ALL: [Scope; 8] = [
        Self::Submit,
        Self::Read,
        Self::Cancel,
        Self::Export,
        Self::Admin,
        Self::Delete,
        Self::Review,
        Self::Operator,
    ];

    /// What `tenants create` gives its first key: everything but `admin` and
    /// `delete`, which a key is given on purpose.
    pub const DEFAULT: [Scope; 4] = [Self::Submit, Self::Read, Self::Cancel, Self::Export];

    /// The name, as stored (`api_scope`) and as the CLI takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Read => "read",
            Self::Cancel => "cancel",
            Self::Export => "export",
            Self::Admin => "admin",
            Self::Delete => "delete",
            Self::Review => "review",
            Self::Operator => "operator",
        }
    }

    /// The scope named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// A comma-separated list (`submit,read`): sorted, without repeats, and
    /// never empty.
    pub fn parse_list(list: &str) -> Result<Vec<Scope>, TenantError> {
        let mut scopes = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let scope = Self::parse(name).ok_or_else(|| TenantError::UnknownScope(name.into()))?;
            scopes.push(scope);
        }
        scopes.sort();
        scopes.dedup();
        match scopes.is_empty() {
            true => Err(TenantError::NoScopes),
            false => Ok(scopes),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tenant's own quotas, where it has them: `None` takes the deployment's
/// setting; 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct QuotaOverrides {
    /// Submits per second, per `serve` process.
    pub submit_rate_per_s: Option<f64>,
    /// Submits a tenant may make at once before the rate applies.
    pub submit_burst: Option<i32>,
    /// Jobs queued or running at once.
    pub max_open_jobs: Option<i32>,
}

/// The quotas in force for one tenant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    /// Submits per second per `serve` process; `None`: no limit.
    pub submit_rate_per_s: Option<f64>,
    /// The token bucket's size: submits at once before the rate applies.
    pub submit_burst: u32,
    /// Jobs queued or running at once; `None`: no cap.
    pub max_open_jobs: Option<i64>,
}

impl QuotaOverrides {
    /// These overrides on top of the deployment's `defaults`.
    pub fn over(self, defaults: Quota) -> Quota {
        let positive_f = |v: f64| (v > 0.0).then_some(v);
        let positive_i = |v: i32| (v > 0).then_some(i64::from(v));
        Quota {
            submit_rate_per_s: self
                .submit_rate_per_s
                .map_or(defaults.submit_rate_per_s, positive_f),
            submit_burst: self
                .submit_burst
                .map_or(defaults.submit_burst, |b| b.max(1) as u32),
            max_open_jobs: self
                .max_open_jobs
                .map_or(defaults.max_open_jobs, positive_i),
        }
    }
}

/// Why a tenant's name or a key's scopes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// The name does not fit [`tenant_name_is_valid`].
    #[error("a tenant name is 1 to {MAX_TENANT_NAME_LEN} lower-case letters, digits, '-' or '_', starting with a letter or digit")]
    InvalidName,
    /// A scope that does not exist.
    #[error("unknown scope {0:?} (scopes: submit, read, cancel, export, admin)")]
    UnknownScope(String),
    /// A key must be allowed something.
    #[error("a key needs at least one scope")]
    NoScopes,
    /// A webhook secret not in the Standard Webhooks form.
    #[error("a webhook secret is whsec_ followed by base64")]
    InvalidWebhookSecret,
    /// A quota out of its range.
    #[error("a rate is 0 (no limit) or more, a burst 1 or more, a cap 0 (no cap) or more")]
    InvalidQuota,
    /// A weight out of its range.
    #[error("a weight is a whole number from 1 to 1000")]
    InvalidWeight,
    /// A rotation's overlap must be a number of seconds, 0 or more.
    #[error("the overlap is a number of seconds, 0 or more")]
    InvalidOverlap,
}

/// Longest tenant name: it is part of export group names.
pub const MAX_TENANT_NAME_LEN: usize = 63;

/// Whether `name` may name a tenant (the database checks the same).
pub fn tenant_name_is_valid(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= MAX_TENANT_NAME_LEN
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// What every key starts with, so a leaked one is recognisable (secret
/// scanners match on it).
pub const KEY_PREFIX: &str = "dsk_";

/// How many characters of a key are kept in the clear to tell keys apart.
const SHOWN_LEN: usize = KEY_PREFIX.len() + 8;

/// A key as its owner holds it: shown once, at creation.
pub struct NewApiKey {
    /// The whole key, `dsk_` and 64 hex digits.
    pub secret: String,
}

impl NewApiKey {
    /// A new key of 256 random bits.
    pub fn generate() -> Self {
        let bytes = os_random_bytes();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self {
            secret: format!("{KEY_PREFIX}{hex}"),
        }
    }

    /// The key's first characters, stored in the clear.
    pub fn shown_prefix(&self) -> String {
        self.secret[..SHOWN_LEN].to_owned()
    }
}

/// 32 bytes from the operating system's generator, for secrets.
fn os_random_bytes() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random number generator is available");
    bytes
}

/// A new webhook signing secret: `whsec_` and 32 random bytes in base64, the
/// Standard Webhooks form that receivers' libraries take as it is.
pub fn new_webhook_secret() -> String {
    use base64::Engine;
    let bytes = os_random_bytes();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Whether `secret` is a webhook secret in the Standard Webhooks form:
/// `whsec_` and a non-empty base64 key.
pub fn webhook_secret_is_valid(secret: &str) -> bool {
    use base64::Engine;
    secret.strip_prefix("whsec_").is_some_and(|encoded| {
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .is_ok_and(|key| !key.is_empty())
    })
}

/// The SHA-256 of a key's text: what is stored, and what a presented key is
/// looked up by.
pub fn key_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Whether `secret` has the shape of a key; anything else is refused without
/// a lookup.
pub fn key_is_well_formed(secret: &str) -> bool {
    secret.len() == KEY_PREFIX.len() + 64
        && secret.starts_with(KEY_PREFIX)
        && secret[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let (a, b) = (NewApiKey::generate(), NewApiKey::generate());
        assert!(key_is_well_formed(&a.secret));
        assert_ne!(a.secret, b.secret);
        assert_ne!(key_hash(&a.secret), key_hash(&b.secret));
        assert!(a.secret.starts_with(&a.shown_prefix()));
    }

    #[test]
    fn malformed_keys_are_recognised() {
        for bad in ["", "dsk_", "dsk_xyz", "Bearer dsk_00", &"a".repeat(68)] {
            assert!(!key_is_well_formed(bad), "{bad:?}");
        }
    }

    #[test]
    fn scope_lists_parse_sorted_and_refuse_unknown_or_empty() {
        assert_eq!(
            Scope::parse_list("read, submit,read").unwrap(),
            vec![Scope::Submit, Scope::Read]
        );
        assert_eq!(
            Scope::parse_list("read,root"),
            Err(TenantError::UnknownScope("root".into()))
        );
        assert_eq!(Scope::parse_list(" , "), Err(TenantError::NoScopes));
    }

    #[test]
    fn webhook_secrets_are_in_the_standard_form() {
        assert!(webhook_secret_is_valid(&new_webhook_secret()));
        assert!(webhook_secret_is_valid(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        ));
        for bad in ["", "whsec_", "whsec_!!", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] {
            assert!(!webhook_secret_is_valid(bad), "{bad}");
        }
    }

    #[test]
    fn a_tenants_quota_overrides_the_default_and_zero_lifts_it() {
        let defaults = Quota {
            submit_rate_per_s: Some(100.0),
            submit_burst: 200,
            max_open_jobs: Some(10_000),
        };
        assert_eq!(QuotaOverrides::default().over(defaults), defaults);
        let own = QuotaOverrides {
            submit_rate_per_s: Some(0.0),
            submit_burst: Some(5),
            max_open_jobs: Some(50),
        };
        let quota = own.over(defaults);
        assert_eq!(quota.submit_rate_per_s, None, "0: no limit");
        assert_eq!((quota.submit_burst, quota.max_open_jobs), (5, Some(50)));
        let lifted = QuotaOverrides {
            max_open_jobs: Some(0),
            ..Default::default()
        };
        assert_eq!(lifted.over(defaults).max_open_jobs, None);
    }

    #[test]
    fn tenant_names() {
        for good in ["acme", "team-7", "a", "0_x"] {
            assert!(tenant_name_is_valid(good), "{good}");
        }
        for bad in ["", "Acme", "-x", "a b", "é", &"a".repeat(64)] {
            assert!(!tenant_name_is_valid(bad), "{bad}");
        }
    }
}
