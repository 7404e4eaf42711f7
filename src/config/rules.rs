//! The rules settings must keep. A rule of one setting sits next to its
//! declaration in `settings!` and says what is wrong in a few words; the
//! message names the variable. [`ACROSS`] holds the rules between settings,
//! each with the reason it exists.

use std::fmt::Display;

use super::{Seconds, Settings, MAX_API_KEY_CACHE_S};

/// What a rule of one setting returns: `Err` says what is wrong with it.
pub(super) type Verdict = Result<(), String>;

fn ok_if(holds: bool, otherwise: impl FnOnce() -> String) -> Verdict {
    if holds {
        Ok(())
    } else {
        Err(otherwise())
    }
}

pub(super) fn positive(v: &Seconds) -> Verdict {
    ok_if(!v.is_zero(), || {
        "must be a positive number of seconds".into()
    })
}

pub(super) fn at_least<T: PartialOrd + Display>(min: T) -> impl Fn(&T) -> Verdict {
    move |v| ok_if(*v >= min, || format!("must be at least {min}"))
}

pub(super) fn at_most<T: PartialOrd + Display>(max: T) -> impl Fn(&T) -> Verdict {
    move |v| ok_if(*v <= max, || format!("must be at most {max}"))
}

pub(super) fn within<T: PartialOrd + Display>(min: T, max: T) -> impl Fn(&T) -> Verdict {
    move |v| {
        ok_if(min <= *v && *v <= max, || {
            format!("must be between {min} and {max}")
        })
    }
}

pub(super) fn zero_or_more(v: &f64) -> Verdict {
    ok_if(v.is_finite() && *v >= 0.0, || {
        "must be 0 (no limit) or more".into()
    })
}

pub(super) fn revocations_in_time(v: &Seconds) -> Verdict {
    ok_if(v.as_secs_f64() <= MAX_API_KEY_CACHE_S, || {
        format!(
            "must be 0 to {MAX_API_KEY_CACHE_S} seconds: a revoked key must stop working within 5 s"
        )
    })
}

#[allow(clippy::ptr_arg)] // a rule takes its setting as the setting's type
pub(super) fn http_url_or_empty(v: &String) -> Verdict {
    let url = reqwest::Url::parse(v);
    let absolute = url.is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    ok_if(v.is_empty() || absolute, || {
        format!("({v:?}) is not an absolute http or https URL")
    })
}

#[allow(clippy::ptr_arg)]
pub(super) fn empty_or_at_least_16_bytes(v: &String) -> Verdict {
    ok_if(v.is_empty() || v.len() >= 16, || {
        "must be at least 16 bytes".into()
    })
}

/// A rule between settings.
pub(super) type Across = fn(&Settings) -> Verdict;

/// Every rule between settings.
pub(super) const ACROSS: &[Across] = &[
    heartbeats_fit_the_leases,
    drains_end_within_the_session,
    retry_caps_are_above_their_bases,
    a_result_field_fits_a_result,
];

/// A holder renews at least twice per lease, or one slow renewal loses a live claim.
fn heartbeats_fit_the_leases(s: &Settings) -> Verdict {
    let shorter_lease = s.extraction_run_lease_s.min(s.bbox_refinement_lease_s);
    ok_if(
        s.heartbeat_interval_s.get() * 2 <= shorter_lease.get(),
        || {
            format!(
            "DOCSTREAM_HEARTBEAT_INTERVAL_S ({}) must be at most half of the shorter lease ({} s): \
             a holder must renew at least twice per lease, or one slow renewal loses a live claim",
            s.heartbeat_interval_s, shorter_lease
        )
        },
    )
}

/// A member that drains longer than its session is expelled mid-rebalance.
fn drains_end_within_the_session(s: &Settings) -> Verdict {
    let session = std::time::Duration::from_millis(s.kafka_session_timeout_ms.into());
    ok_if(s.rebalance_drain_timeout_s.get() < session, || {
        format!(
            "DOCSTREAM_REBALANCE_DRAIN_TIMEOUT_S ({} s) must be below DOCSTREAM_KAFKA_SESSION_TIMEOUT_MS ({} ms): \
             a member that drains longer than its session is expelled mid-rebalance",
            s.rebalance_drain_timeout_s, s.kafka_session_timeout_ms
        )
    })
}

/// Backoff grows from its base up to its cap, never down to it.
fn retry_caps_are_above_their_bases(s: &Settings) -> Verdict {
    ok_if(s.retry_max_delay_s >= s.retry_base_delay_s, || {
        "DOCSTREAM_RETRY_MAX_DELAY_S must be at least DOCSTREAM_RETRY_BASE_DELAY_S".into()
    })?;
    ok_if(
        s.webhook_retry_max_delay_s >= s.webhook_retry_base_delay_s,
        || {
            "DOCSTREAM_WEBHOOK_RETRY_MAX_DELAY_S must be at least DOCSTREAM_WEBHOOK_RETRY_BASE_DELAY_S"
                .into()
        },
    )
}

/// A result holds at least one field of the largest size.
fn a_result_field_fits_a_result(s: &Settings) -> Verdict {
    ok_if(s.max_result_field_bytes <= s.max_result_bytes, || {
        "DOCSTREAM_MAX_RESULT_FIELD_BYTES must be at most DOCSTREAM_MAX_RESULT_BYTES".into()
    })
}
