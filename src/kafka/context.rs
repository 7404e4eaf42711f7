//! How every docstream Kafka client reports trouble. librdkafka reconnects on
//! its own, so a lost broker is an outage to ride through, not an error to
//! exit on: its errors and connection failures go to [`Health`], which logs
//! the first of an outage and counts it. Only a fatal error (a fatal
//! idempotent-producer state, failed authentication or authorisation) is
//! logged as an error each time: no retry makes it pass.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use crate::health::{Dependency, Health};
use crate::metrics::KafkaStats;

/// Whether `error` ends the client for good: retrying cannot make it pass.
pub fn is_fatal(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(
            // Not the local `Authentication`: librdkafka raises it too when an
            // OAUTHBEARER token cannot be fetched (the identity provider away
            // for a while, the last token still good). At start, the
            // preflight tells a refused client from that (src/preflight.rs).
            Code::Fatal
                | Code::SaslAuthenticationFailed
                | Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::TransactionalIdAuthorizationFailed
                | Code::DelegationTokenAuthorizationFailed
        )
    )
}

/// A client error as librdkafka raises it (outside any one call).
pub(crate) fn report_error(health: &Health, error: KafkaError, reason: &str) {
    if is_fatal(&error) {
        tracing::error!(%error, reason, "kafka: fatal client error");
    } else {
        health.failed(Dependency::Kafka, &format_args!("{error}: {reason}"));
    }
}

/// One of librdkafka's log lines. Connection failures (`FAIL`) repeat for as
/// long as a broker is away, so they are outage reports, not log lines.
pub(crate) fn report_log(health: &Health, level: RDKafkaLogLevel, fac: &str, message: &str) {
    if fac == "FAIL" {
        health.failed(Dependency::Kafka, &format_args!("{fac} {message}"));
        return;
    }
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", "{fac} {message}"),
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "{fac} {message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", "{fac} {message}")
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "{fac} {message}"),
    }
}

/// The context of a client that needs nothing else (the producer).
#[derive(Clone)]
pub struct Reporting {
    /// Where outages are reported.
    pub health: Health,
    /// Where librdkafka's statistics go.
    pub stats: KafkaStats,
}

impl ClientContext for Reporting {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        report_log(&self.health, level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        report_error(&self.health, error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.stats.report(&statistics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_pass_and_authentication_does_not() {
        let consumption = |code| KafkaError::MessageConsumption(code);
        assert!(!is_fatal(&consumption(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!is_fatal(&consumption(RDKafkaErrorCode::AllBrokersDown)));
        assert!(!is_fatal(&consumption(RDKafkaErrorCode::OperationTimedOut)));
        assert!(is_fatal(&consumption(
            RDKafkaErrorCode::SaslAuthenticationFailed
        )));
        assert!(is_fatal(&KafkaError::Global(RDKafkaErrorCode::Fatal)));
        assert!(!is_fatal(&consumption(RDKafkaErrorCode::Authentication)));
    }
}
