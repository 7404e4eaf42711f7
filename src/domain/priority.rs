//! A job's priority: which waiting work a worker starts first.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How urgent a job is. A worker starts the waiting work of a higher
/// priority first, but never passes over a waiting job for longer than
/// `DOCSTREAM_WORKER_PRIORITY_MAX_WAIT_S`: past that, it starts in the order
/// it arrived, whatever its priority.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Started before everything else that waits.
    High,
    /// The default.
    #[default]
    Normal,
    /// Started when nothing more urgent waits (or once it waited too long).
    Low,
}

impl Priority {
    /// Every priority, most urgent first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The name in requests, rows, record headers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The priority named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// Its place in [`Priority::ALL`]: 0 is the most urgent.
    pub fn rank(self) -> usize {
        self as usize
    }
}

impl TryFrom<String> for Priority {
    type Error = String;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        Self::parse(&name).ok_or_else(|| format!("unknown priority {name:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_rank_in_order() {
        for (rank, p) in Priority::ALL.into_iter().enumerate() {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
            assert_eq!(p.rank(), rank);
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.as_str()));
        }
        assert_eq!(Priority::parse("urgent"), None);
        assert!(serde_json::from_str::<Priority>("\"HIGH\"").is_err());
    }
}
