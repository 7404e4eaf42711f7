//! Before a process starts: can it reach Kafka and Postgres with what it was
//! given? A process rides through an outage (it starts not ready and becomes
//! ready when both answer), but no retry makes a wrong password, a CA that
//! does not sign the server's certificate or a host name the certificate does
//! not name pass. Those end the process at start, with the error that says
//! which, and never with a secret in it.
//!
//! Each check waits at most [`PATIENCE`]. A refusal ends the process;
//! anything else (nobody listens, no answer in time) is an outage, and the
//! process goes on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use sqlx::Connection;

use crate::config::{KafkaClient, Settings};

/// How long a check waits for its dependency to answer.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// How long the Kafka check watches on after its first error that is not a
/// refusal: librdkafka may report the brokers down just before the TLS or
/// SASL failure that downed them.
const OUTAGE_GRACE: Duration = Duration::from_secs(2);

/// A dependency refused what the process was given.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The brokers refused the credentials, or their certificate.
    #[error("Kafka refused the connection ({brokers}): {reason}")]
    Kafka {
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's words.
        reason: String,
    },
    /// Postgres refused the credentials, or its certificate.
    #[error("Postgres refused the connection: {0}")]
    Postgres(String),
}

/// What a check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reached {
    /// The dependency answered.
    Yes,
    /// It did not answer within [`PATIENCE`] (or could not be reached at
    /// all): an outage to ride through. The last error, for the log.
    NotYet(String),
}

/// Checks Kafka and Postgres at once; an outage is logged, a refusal returned.
pub async fn check(settings: &Settings) -> Result<(), Refused> {
    let client = settings.kafka();
    let (kafka, postgres) = tokio::join!(
        check_kafka(&client, PATIENCE),
        check_postgres(&settings.database_url, PATIENCE)
    );
    for (name, reached) in [("kafka", kafka?), ("postgres", postgres?)] {
        if let Reached::NotYet(last) = reached {
            tracing::warn!(dependency = name, error = %last, "not reachable at start; starting not ready");
        }
    }
    Ok(())
}

/// Whether `error` is a refusal (credentials, certificates, permissions)
/// rather than an outage.
fn kafka_refusal(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::SSL | RDKafkaErrorCode::Authentication)
    ) || crate::kafka::context::is_fatal(error)
}

/// The OAuth errors a token endpoint answers a client it refuses with (RFC
/// 6749, 5.2), and the HTTP statuses librdkafka quotes with them.
const TOKEN_REFUSALS: &[&str] = &[
    "invalid_client",
    "unauthorized_client",
    "invalid_grant",
    "invalid_scope",
    "invalid_request",
    "(400)",
    "(401)",
    "(403)",
];

/// Whether librdkafka's `reason` for `error` is a refusal. A token that could
/// not be fetched is one only when the endpoint answered with a refusal; an
/// endpoint that cannot be reached, or fails, is an outage.
fn kafka_reason_refuses(error: &KafkaError, reason: &str) -> bool {
    if reason.contains("OAUTHBEARER token") || reason.contains("OIDC token") {
        return TOKEN_REFUSALS.iter().any(|r| reason.contains(r));
    }
    // A TLS alert from the broker (a client certificate it does not accept,
    // say) reaches librdkafka as a failed receive: still a refusal.
    kafka_refusal(error) || (reason.contains("SSL routines") && reason.contains("alert"))
}

/// The errors librdkafka raised while the check waited: whether each is a
/// refusal, and what it said.
#[derive(Clone, Default)]
struct Witness(Arc<Mutex<Vec<(bool, String)>>>);

impl Witness {
    fn take(&self) -> Vec<(bool, String)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl ClientContext for Witness {
    fn error(&self, error: KafkaError, reason: &str) {
        let refusal = kafka_reason_refuses(&error, reason);
        let hint = match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::SSL) => {
                " (is ssl.ca.location the CA that signed the broker's certificate, and does \
                 the certificate name the host in DOCSTREAM_KAFKA_BROKERS?)"
            }
            _ => "",
        };
        let seen = (refusal, format!("{reason}{hint}"));
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
    }
}

impl ProducerContext for Witness {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// Asks the brokers of `kafka` for the cluster's metadata until they answer,
/// refuse, or `patience` passes.
pub async fn check_kafka(kafka: &KafkaClient, patience: Duration) -> Result<Reached, Refused> {
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || check_kafka_blocking(&kafka, patience))
        .await
        .unwrap_or_else(|e| Ok(Reached::NotYet(format!("the check did not finish: {e}"))))
}

fn check_kafka_blocking(kafka: &KafkaClient, patience: Duration) -> Result<Reached, Refused> {
    let refused = |reason: String| Refused::Kafka {
        brokers: kafka.brokers().to_owned(),
        reason: crate::config::redact_kafka(&reason, kafka.properties()),
    };
    let witness = Witness::default();
    let producer: BaseProducer<Witness> = kafka
        .config()
        .create_with_context(witness.clone())
        .map_err(|e| refused(e.to_string()))?;
    let mut deadline = Instant::now() + patience;
    let mut outage: Option<String> = None;
    while Instant::now() < deadline {
        let answer = producer
            .client()
            .fetch_metadata(None, Duration::from_secs(1));
        if answer.is_ok() {
            return Ok(Reached::Yes);
        }
        // Serves the error callbacks of what happened meanwhile. A refusal
        // decides at once. Other errors (nobody listens, all brokers down)
        // may come just before the refusal behind them, so they decide only
        // after a short grace, in which the next attempts are watched too.
        producer.poll(Duration::from_millis(100));
        for (refusal, said) in witness.take() {
            if refusal {
                return Err(refused(said));
            }
            if outage.is_none() {
                deadline = deadline.min(Instant::now() + OUTAGE_GRACE);
            }
            outage.get_or_insert(said);
        }
        // The call's own error carries no reason: a token librdkafka could
        // not fetch looks like a refusal there, and is judged by the
        // callback's reason above instead.
        if let Err(e) = answer {
            if kafka_refusal(&e) && e.rdkafka_error_code() != Some(RDKafkaErrorCode::Authentication)
            {
                return Err(refused(e.to_string()));
            }
        }
    }
    let last = outage.unwrap_or_else(|| "no answer".into());
    Ok(Reached::NotYet(crate::config::redact_kafka(
        &last,
        kafka.properties(),
    )))
}

/// Opens a connection to `url`, checks that it keeps its server session
/// ([`sessions_are_kept`]), and closes it.
pub async fn check_postgres(url: &str, patience: Duration) -> Result<Reached, Refused> {
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .map_err(|e: sqlx::Error| Refused::Postgres(e.to_string()))?;
    let attempt = tokio::time::timeout(patience, async {
        let connection = sqlx::PgConnection::connect_with(&options).await?;
        let kept = sessions_are_kept(connection, &options).await;
        Ok::<_, sqlx::Error>(kept)
    })
    .await;
    match attempt {
        Ok(Ok(Ok(()))) => Ok(Reached::Yes),
        Ok(Ok(Err(refused))) => Err(refused),
        Ok(Err(e)) if postgres_refusal(&e) => Err(Refused::Postgres(postgres_said(&e))),
        Ok(Err(e)) => Ok(Reached::NotYet(e.to_string())),
        Err(_) => Ok(Reached::NotYet("no answer".into())),
    }
}

/// The pid of the server session `conn` is on, by a simple query.
async fn server_pid(conn: &mut sqlx::PgConnection) -> Result<i32, sqlx::Error> {
    let row = sqlx::raw_sql("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await?;
    sqlx::Row::try_get(&row, 0)
}

/// Whether a connection keeps one server session from statement to
/// statement, as Postgres itself and a pooler in session mode do. A pooler in
/// transaction (or statement) mode hands the session to whoever asks next
/// once a statement ends; then the sweepers' session-level locks would be
/// shared (two sweeping at once), `LISTEN` would hear nothing, and a
/// prepared statement would vanish. So: the first connection notes its
/// server's pid, a second one holds a transaction open (taking the
/// session the first just left, if the pooler hands sessions out), and the
/// first asks again. Simple queries only, which any pooler passes.
async fn sessions_are_kept(
    mut first: sqlx::PgConnection,
    options: &sqlx::postgres::PgConnectOptions,
) -> Result<(), Refused> {
    let check = async {
        let before = server_pid(&mut first).await?;
        let mut second = sqlx::PgConnection::connect_with(options).await?;
        // Postgres always takes a BEGIN; a pooler in statement mode does not.
        if sqlx::raw_sql("BEGIN").execute(&mut second).await.is_err() {
            return Ok(false);
        }
        let held = server_pid(&mut second).await?;
        // A pool of one session makes the first wait for the second's
        // transaction: as good as handing the session on.
        let after = tokio::time::timeout(Duration::from_secs(2), server_pid(&mut first)).await;
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut second).await;
        let _ = second.close().await;
        let Ok(after) = after else { return Ok(false) };
        let after = after?;
        let _ = first.close().await;
        Ok::<_, sqlx::Error>(before == after && held != before)
    };
    match check.await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Refused::Postgres(
            "the connection does not keep its server session from one statement to the next: \
             a pooler in transaction or statement mode (PgBouncer's pool_mode) is in between. \
             docstream needs session mode: the sweepers hold session-level locks and the \
             extractor slots LISTEN; point DATABASE_URL at Postgres or at a pool in session mode"
                .into(),
        )),
        // Not the pooler's doing: the caller's own connection answered.
        Err(e) => {
            tracing::warn!(error = %e, "could not check that Postgres sessions are kept");
            Ok(())
        }
    }
}

/// What `error` says, with a hint where sqlx's words leave the cause open.
fn postgres_said(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            format!("{error} (a certificate or key file that DATABASE_URL names cannot be read)")
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => format!(
            "{error} (is sslrootcert the CA that signed the server's certificate, and does the \
             certificate name the host in DATABASE_URL?)"
        ),
        _ => error.to_string(),
    }
}

/// Whether `error` is a refusal: a TLS failure, or the server turning the
/// role away (a wrong password, no `pg_hba.conf` line for this connection, an
/// unknown role or database, a startup parameter a pooler does not take).
fn postgres_refusal(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) | sqlx::Error::Configuration(_) => true,
        // A certificate refused in the handshake comes back as the stream's
        // error, carrying rustls's.
        sqlx::Error::Io(e) => {
            e.get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
                // A certificate or key file of the URL that cannot be read.
                || matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                )
        }
        // The server turned the role away (class 28: a password,
        // pg_hba.conf; 3D000: no such database), or a pooler refused a
        // startup parameter. A pooler that cannot reach the server says so
        // with 08P01 too: that one is an outage.
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default();
            code.starts_with("28")
                || code == "3D000"
                || e.message().contains("unsupported startup parameter")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_nobody_listens_on_is_an_outage_not_a_refusal() {
        let kafka = KafkaClient::plaintext("127.0.0.1:1");
        let reached = check_kafka(&kafka, Duration::from_secs(1)).await.unwrap();
        assert!(matches!(reached, Reached::NotYet(_)), "{reached:?}");
        let pg = check_postgres("postgres://u:p@127.0.0.1:1/x", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(matches!(pg, Reached::NotYet(_)), "{pg:?}");
    }

    #[tokio::test]
    async fn a_url_that_does_not_parse_is_refused_without_its_password() {
        let e = check_postgres(
            "postgres://u:s3cret@127.0.0.1:1/x?sslmode=sideways",
            Duration::from_secs(1),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"sideways\""), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
}
