//! The extension's one error type. Every variant carries the SQLSTATE the
//! contract names for it; nothing leaves as a bare 22000/XX000.

use keyturn_core::CoreError;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum KeyturnError {
    /// Input that keyturn cannot accept as given (22023).
    #[error("keyturn: {0}")]
    Invalid(#[from] CoreError),
    /// An argument keyturn cannot act on, beyond what keyturn-core checks
    /// (22023), e.g. a tenant-explicit call that names no tenant.
    #[error("keyturn: {message}")]
    InvalidArgument { message: String, hint: &'static str },
    /// The caller may not do this (42501).
    #[error("keyturn: {message}")]
    Forbidden { message: String, hint: &'static str },
    /// The installation itself is broken, e.g. the extension row is missing (55000).
    #[error("keyturn: {0}")]
    NotReady(String),
    /// The row is not in a state that allows this (55000), e.g. a status
    /// change the state machine does not have.
    #[error("keyturn: {message}")]
    WrongState { message: String, hint: &'static str },
    /// A concurrent transaction got there first; the same call again succeeds (40001).
    #[error("keyturn: {0}")]
    Busy(String),
    /// Something keyturn does not do, e.g. PREPARE TRANSACTION of a
    /// transaction that changed actions (0A000, as PostgreSQL refuses to
    /// prepare one that used temporary objects).
    #[error("keyturn: {message}")]
    NotSupported { message: String, hint: &'static str },
    /// A transaction made read only after it changed actions, whose audit
    /// events cannot then be written at its commit (25006, PostgreSQL's own
    /// code for a write in a read-only transaction).
    #[error("keyturn: {message}")]
    ReadOnly { message: String, hint: &'static str },
}

impl KeyturnError {
    fn sqlstate(&self) -> PgSqlErrorCode {
        match self {
            KeyturnError::Invalid(_) | KeyturnError::InvalidArgument { .. } => {
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
            }
            KeyturnError::Forbidden { .. } => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            KeyturnError::NotReady(_) | KeyturnError::WrongState { .. } => {
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            KeyturnError::Busy(_) => PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            KeyturnError::NotSupported { .. } => PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            KeyturnError::ReadOnly { .. } => PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        }
    }

    /// Raises this error as a PostgreSQL ERROR; never returns.
    pub fn raise(self) -> ! {
        let code = self.sqlstate();
        let hint = match &self {
            KeyturnError::Forbidden { hint, .. }
            | KeyturnError::WrongState { hint, .. }
            | KeyturnError::InvalidArgument { hint, .. }
            | KeyturnError::NotSupported { hint, .. }
            | KeyturnError::ReadOnly { hint, .. } => Some(*hint),
            _ => None,
        };
        let mut report = ErrorReport::new(code, self.to_string(), "pg_keyturn");
        if let Some(hint) = hint {
            report = report.set_hint(hint);
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ERROR-level reports do not return")
    }
}

/// Unwraps a result, raising the error with its SQLSTATE.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T, E: Into<KeyturnError>> OrRaise<T> for Result<T, E> {
    fn or_raise(self) -> T {
        match self {
            Ok(value) => value,
            Err(error) => error.into().raise(),
        }
    }
}

/// Keeps Rust backtraces out of every error a client sees. pgrx's panic hook
/// captures one (`Backtrace::capture`) whenever `RUST_BACKTRACE` or
/// `RUST_LIB_BACKTRACE` asks for it, and sends it in the error's DETAIL, with
/// the build's source paths: a postmaster started from a developer's shell,
/// or an image that sets `RUST_BACKTRACE=1`, would hand them to every caller.
/// std reads `RUST_LIB_BACKTRACE` before `RUST_BACKTRACE`, once per process,
/// so `0` set before any error is raised decides it, whatever the
/// environment said. Called from `_PG_init`.
pub fn keep_backtraces_out() {
    // The backend is single-threaded, and this runs before any error could
    // have read the variable.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
}
