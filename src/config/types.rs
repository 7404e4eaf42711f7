//! The types settings are written in: each parses from its environment
//! variable's text, reads from and writes to TOML, and prints back to the
//! text it parsed from (so [`super::Settings::to_env`] hands a child process
//! exactly the settings of its parent). Also why settings are refused
//! ([`ConfigError`]) and how the manual lists one ([`Described`]).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A span of time written in seconds, fractions allowed (`0.5`, `10`): how
/// every duration setting is written. Never negative, never infinite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Seconds(Duration);

impl Seconds {
    /// Whole seconds, for defaults.
    pub const fn new(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// Milliseconds, for defaults below a second.
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }

    /// The duration in seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0.as_secs_f64()
    }

    /// Whether it is zero (which some settings read as "off").
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<Duration> for Seconds {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl TryFrom<f64> for Seconds {
    type Error = String;

    fn try_from(secs: f64) -> Result<Self, String> {
        Duration::try_from_secs_f64(secs)
            .map(Self)
            .map_err(|_| format!("{secs} is not a number of seconds (0 or more, finite)"))
    }
}

impl FromStr for Seconds {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let secs: f64 = text
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not a number of seconds"))?;
        Self::try_from(secs)
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // f64's Display is the shortest text that parses back to the same value.
        write!(f, "{}", self.as_secs_f64())
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.as_secs_f64())
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::try_from(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Implements `FromStr`, `Display` and serde (as the name) for a settings
/// enum from its variants' names.
macro_rules! named_enum {
    ($ty:ident { $($variant:ident = $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The name, as settings, query parameters and metric labels write it.
            pub fn as_str(self) -> &'static str {
                match self { $( Self::$variant => $name, )+ }
            }
        }

        impl FromStr for $ty {
            type Err = String;

            fn from_str(name: &str) -> Result<Self, String> {
                match name {
                    $( $name => Ok(Self::$variant), )+
                    _ => Err(format!(
                        "{name:?}: expected {}",
                        [$($name),+].join(" or ")
                    )),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// What an export stream does with an event when its queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backpressure {
    /// Wait for room: nothing is lost, and a slow client slows its stream.
    Block,
    /// Drop the oldest queued event to make room (counted).
    DropOldest,
    /// Drop the new event (counted).
    DropNew,
}

named_enum!(Backpressure { Block = "block", DropOldest = "drop_oldest", DropNew = "drop_new" });

/// The consumer group protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol, with cooperative-sticky assignment by the members.
    Classic,
    /// KIP-848: assignment by the broker (Kafka 4.0+).
    Consumer,
}

named_enum!(GroupProtocol { Classic = "classic", Consumer = "consumer" });

/// Addresses admitted despite the webhook guard: IPs and CIDR blocks,
/// written `127.0.0.1/32,::1,10.0.0.0/8`. Empty admits nothing extra.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<(IpAddr, u8)>);

impl AllowList {
    /// Whether `ip` is in one of the blocks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|&(block, len)| match (block, ip) {
            (IpAddr::V4(b), IpAddr::V4(a)) => {
                same_prefix(u32::from(b).into(), u32::from(a).into(), len, 32)
            }
            (IpAddr::V6(b), IpAddr::V6(a)) => same_prefix(u128::from(b), u128::from(a), len, 128),
            _ => false,
        })
    }
}

impl FromStr for AllowList {
    type Err = String;

    fn from_str(list: &str) -> Result<Self, String> {
        let mut blocks = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (addr, len) = match item.split_once('/') {
                Some((addr, len)) => (addr, Some(len)),
                None => (item, None),
            };
            let bad = || format!("{item:?} is not an IP address or CIDR block");
            let ip = canonical(addr.parse::<IpAddr>().map_err(|_| bad())?);
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                Some(len) => len
                    .parse::<u8>()
                    .ok()
                    .filter(|l| *l <= bits)
                    .ok_or_else(bad)?,
                None => bits,
            };
            blocks.push((ip, len));
        }
        Ok(Self(blocks))
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let blocks: Vec<String> = self
            .0
            .iter()
            .map(|(ip, len)| format!("{ip}/{len}"))
            .collect();
        f.write_str(&blocks.join(","))
    }
}

impl Serialize for AllowList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AllowList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

fn same_prefix(a: u128, b: u128, len: u8, bits: u8) -> bool {
    len == 0 || (a >> (bits - len)) == (b >> (bits - len))
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// An environment variable does not parse as its setting's type.
    #[error("{var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What the parser said.
        reason: String,
    },
    /// A combination of settings that cannot work.
    #[error("invalid settings: {0}")]
    Invalid(String),
}

/// One setting as the manual's tables list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// The environment variable that sets it.
    pub var: String,
    /// Its default, as the variable would give it.
    pub default: String,
    /// What it is for: its doc comment, as one paragraph.
    pub doc: String,
}

impl Described {
    pub(super) fn new(var: String, default: String, doc: &[&str]) -> Self {
        let doc = doc
            .iter()
            .map(|line| line.trim())
            .collect::<Vec<_>>()
            .join(" ");
        Self { var, default, doc }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_prints_back_to_what_it_parses_from() {
        for text in ["0", "0.25", "10", "86400"] {
            assert_eq!(text.parse::<Seconds>().unwrap().to_string(), text);
        }
        for bad in ["-1", "inf", "NaN", "ten"] {
            assert!(bad.parse::<Seconds>().is_err(), "{bad}");
        }
        let list: AllowList = "127.0.0.1, ::1, 10.1.0.0/16".parse().unwrap();
        assert_eq!(list.to_string().parse::<AllowList>().unwrap(), list);
        assert_eq!(
            "drop_oldest".parse::<Backpressure>(),
            Ok(Backpressure::DropOldest)
        );
        let err = "eager".parse::<GroupProtocol>().unwrap_err();
        assert!(err.contains("classic or consumer"), "{err}");
    }
}
