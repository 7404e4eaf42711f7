//! The store's one error: a database failure, and what kind of failure it
//! is (the database away, or a value it refused).

use std::sync::Arc;

/// A database failure; operators see the detail in logs, clients never do.
/// Cloneable, so one failed batch statement can fail each of its requests.
#[derive(Debug, Clone, thiserror::Error)]
#[error("database error: {0}")]
pub struct StoreError(pub Arc<sqlx::Error>);

impl StoreError {
    /// Whether the database could not be reached or stopped answering
    /// (connection refused or lost, no free connection in time, the server
    /// restarting or out of connections): a failure that passes, so the call
    /// may be made again unchanged, and it says nothing about the job.
    pub fn is_unavailable(&self) -> bool {
        match self.0.as_ref() {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(e) => e.code().is_some_and(|code| {
                // 08: connection exception; 57P01-03: admin shutdown, crash
                // shutdown, cannot connect now; 53300: too many connections.
                code.starts_with("08") || ["57P01", "57P02", "57P03", "53300"].contains(&&*code)
            }),
            _ => false,
        }
    }

    /// Whether the statement failed for a value it was given (SQLSTATE
    /// class 22, data exception, such as text Postgres cannot store; class
    /// 54, a value past a program limit): the same values fail again.
    pub fn is_data_error(&self) -> bool {
        match self.0.as_ref() {
            sqlx::Error::Database(e) => e
                .code()
                .is_some_and(|code| code.starts_with("22") || code.starts_with("54")),
            _ => false,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self(Arc::new(e))
    }
}
