//! The crate's one error type.
//!
//! Provider calls never return this: their failures are *outcomes* (see
//! [`crate::classify`]), recorded in the database. This enum covers what can
//! go wrong around them: configuration, the database, the network stack, and
//! the operator commands.

use tokio_postgres::error::SqlState;

/// Everything that can fail in keyturnd outside a classified provider call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is missing, malformed or inconsistent. The
    /// message names the setting and what to change.
    #[error("configuration: {0}")]
    Config(String),

    /// The database's `pg_keyturn` is missing or of another release than
    /// this keyturnd. The message says which and what to do.
    #[error("incompatible database: {0}")]
    Incompatible(String),

    /// A statement failed or the connection broke. `tokio_postgres::Error`
    /// never carries the connection string, so printing it is safe.
    #[error("database: {}", chain(.0))]
    Db(#[from] tokio_postgres::Error),

    /// A row came back in a shape this build does not expect (a contract
    /// mismatch between keyturnd and the installed extension). Not transient.
    #[error("database returned an unexpected row: {}", chain(.0))]
    Decode(#[source] tokio_postgres::Error),

    /// No pooled connection could be had (the database is down or the pool
    /// is exhausted past its wait timeout).
    #[error("database pool: {}", chain(.0))]
    Pool(#[from] deadpool_postgres::PoolError),

    /// A database call did not answer in time.
    #[error("database call timed out after {0:?}")]
    DbTimeout(std::time::Duration),

    /// The outcome journal's directory or file cannot be used, or holds
    /// outcomes of another database. The message says what to do.
    #[error("journal: {0}")]
    Journal(String),

    /// Binding the HTTP listener or another local I/O step failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),

    /// The HTTP client could not be built (TLS backend, bad settings).
    #[error("http client: {0}")]
    HttpClient(#[from] reqwest::Error),
}

/// An error and its sources, `a: b: c`. `tokio_postgres::Error` prints only
/// its kind ("db error"); the server's message and SQLSTATE, or the I/O
/// cause, live in its sources. Repeated texts (wrappers that already print
/// their source) are skipped.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let text = match e.downcast_ref::<tokio_postgres::error::DbError>() {
            Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

impl Error {
    /// The SQLSTATE the server answered with, if the server answered at all.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            Error::Db(e) => e.code(),
            Error::Pool(deadpool_postgres::PoolError::Backend(e)) => e.code(),
            _ => None,
        }
    }

    /// True when the database itself refused the call (`55000`): a wrong or
    /// lapsed lease, or an action no longer in the expected status. Retrying
    /// such a call can never succeed.
    pub fn is_object_not_in_state(&self) -> bool {
        self.sqlstate() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
    }

    /// True when the same call may succeed if made again later: the
    /// connection was lost, the pool had none, the call timed out, or the
    /// server asked for a retry (serialization failure, deadlock, shutdown,
    /// too many connections). A statement the server rejected for its
    /// content is not transient.
    pub fn is_transient(&self) -> bool {
        match self.sqlstate() {
            Some(code) => {
                let c = code.code();
                *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED
                    || *code == SqlState::TOO_MANY_CONNECTIONS
                    || c.starts_with("08") // connection exception
                    || c.starts_with("57P") // admin/crash shutdown, cannot connect now
            }
            None => matches!(
                self,
                Error::Db(_) | Error::Pool(_) | Error::DbTimeout(_) | Error::Io(_)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn test_chain_shows_sources_once() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(chain(&e), "outer: refused");
        let io = std::io::Error::other("same");
        assert_eq!(chain(&io), "same");
    }

    #[test]
    fn test_transient_errors() {
        assert!(Error::DbTimeout(std::time::Duration::from_secs(1)).is_transient());
        assert!(!Error::Config("x".into()).is_transient());
        assert!(!Error::Config("x".into()).is_object_not_in_state());
    }
}
