//! The crate's one error type, and its HTTP answer.
//!
//! Provider calls never return this: their failures are *outcomes* (see
//! [`crate::classify`]), recorded in the database. This enum covers what can
//! go wrong around them: configuration, the database, the network stack, the
//! operator commands, and the refusals of `/rpc`.
//!
//! Every HTTP error answers PostgREST's shape, `{"code", "message",
//! "details", "hint"}`, so clients written for PostgREST read it unchanged
//! (docs/http.md has the table of statuses).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio_postgres::error::{DbError, SqlState};

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

    /// `/rpc` without a usable JWT: missing, malformed, expired, not yet
    /// valid, wrongly signed, of another audience or algorithm. The text
    /// says which, never what the token was.
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),

    /// The JWT is valid but its `role` claim is missing or not one of
    /// `KEYTURN_JWT_ROLES`.
    #[error("the JWT's role claim is not one keyturnd may select")]
    RoleNotAllowed,

    /// A card session's call outside what it is for: another function, or
    /// an action its link did not name.
    #[error("forbidden: {0}")]
    CardForbidden(&'static str),

    /// An agent's JWT on `/mcp` is valid but its `role` claim is missing or
    /// not one of `KEYTURN_MCP_ROLES` (a person's role included).
    #[error("the JWT's role claim is not one /mcp serves")]
    McpRoleNotAllowed,

    /// `/mcp` holds `KEYTURN_MCP_MAX_SESSIONS` sessions: a new one waits
    /// until one ends (an idle session ends after five minutes).
    #[error("/mcp holds as many sessions as it may")]
    McpSessionsFull,

    /// A session's second standalone stream (`GET /mcp`) while its first is
    /// open: one per session (`mcp::streams`).
    #[error("this MCP session has its stream open already")]
    McpStreamOpen,

    /// Every slot for standalone streams is taken (half of
    /// `KEYTURN_SERVER_CONNECTIONS`).
    #[error("/mcp holds as many streams as it may")]
    McpStreamsFull,

    /// `/rpc/<name>` for a function keyturnd does not expose, or with
    /// arguments it does not take (PostgREST's `PGRST202`).
    #[error("{message}")]
    NoSuchFunction {
        /// PostgREST's wording: which function and arguments were looked for.
        message: String,
        /// What the caller can do about it.
        hint: Option<String>,
    },

    /// The request body is not a JSON object (PostgREST's `PGRST102`).
    #[error("invalid request body: {0}")]
    BadBody(String),

    /// An `/rpc` argument that cannot be its argument's type (PostgreSQL's
    /// `22P02`), refused before the database sees it: the database's own
    /// refusal quotes the value whole into its log (thirty-first red-team
    /// pass, docs/security.md row 141). Names the argument, never the value.
    #[error("invalid input for argument {name}: not a {ty}")]
    BadArgument { name: String, ty: String },

    /// The request body is over the limit.
    #[error("request body too large")]
    BodyTooLarge,

    /// `/rpc` is configured but its start-up checks have not finished.
    #[error("not ready")]
    NotReady,

    /// An operator command named an action it cannot act on, found out
    /// before any change (by tenant, `reconcile` looks the action up among
    /// the uncertain ones first, as the database would refuse it).
    #[error("{0}")]
    Operator(String),

    /// Something on our side failed while answering a request; the context
    /// goes to the log, the client sees only a 500.
    #[error("internal: {context}: {detail}")]
    Internal {
        /// What we were doing.
        context: &'static str,
        /// The details, for the log only.
        detail: String,
    },
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
    /// An internal error while doing `context`.
    pub fn internal(context: &'static str, err: impl std::fmt::Display) -> Self {
        Error::Internal {
            context,
            detail: err.to_string(),
        }
    }

    /// The server's error report, if the server answered with one.
    pub fn db_error(&self) -> Option<&DbError> {
        let source = match self {
            Error::Db(e) | Error::Decode(e) => e,
            Error::Pool(deadpool_postgres::PoolError::Backend(e)) => e,
            _ => return None,
        };
        source.as_db_error()
    }

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

/// The HTTP status of a database refusal, by SQLSTATE (docs/http.md).
/// `None`: not the caller's doing; answered 500 without the server's words.
pub fn sqlstate_status(code: &str) -> Option<StatusCode> {
    Some(match code {
        "42501" => StatusCode::FORBIDDEN,
        "55000" => StatusCode::CONFLICT,
        "22023" | "22P02" => StatusCode::BAD_REQUEST,
        "42704" | "42883" => StatusCode::NOT_FOUND,
        "54000" => StatusCode::TOO_MANY_REQUESTS,
        _ => return None,
    })
}

fn body(
    status: StatusCode,
    code: &str,
    message: &str,
    details: Option<&str>,
    hint: Option<&str>,
) -> Response {
    let body = json!({"code": code, "message": message, "details": details, "hint": hint});
    let mut response = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )],
        body.to_string(),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if let Error::Internal { context, detail } = &self {
            tracing::error!(context, detail, "request failed");
        }
        match &self {
            Error::Unauthorized(why) => body(StatusCode::UNAUTHORIZED, "PGRST301", why, None, None),
            Error::RoleNotAllowed => body(
                StatusCode::FORBIDDEN,
                "PGRST300",
                "the JWT's role claim is missing or not one keyturnd may select",
                None,
                Some("keyturnd lets a JWT select only the roles in KEYTURN_JWT_ROLES"),
            ),
            Error::CardForbidden(why) => body(StatusCode::FORBIDDEN, "KT403", why, None, None),
            Error::McpRoleNotAllowed => body(
                StatusCode::FORBIDDEN,
                "PGRST300",
                "the JWT's role claim is missing or not one /mcp serves",
                None,
                Some("keyturnd lets an agent's JWT select only the roles in KEYTURN_MCP_ROLES"),
            ),
            Error::NoSuchFunction { message, hint } => body(
                StatusCode::NOT_FOUND,
                "PGRST202",
                message,
                None,
                hint.as_deref(),
            ),
            Error::BadBody(why) => body(StatusCode::BAD_REQUEST, "PGRST102", why, None, None),
            Error::BadArgument { .. } => body(
                StatusCode::BAD_REQUEST,
                "22P02",
                &self.to_string(),
                None,
                Some("a value of that type is at most 100 characters of printable ASCII"),
            ),
            Error::BodyTooLarge => body(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PGRST413",
                "request body too large",
                None,
                None,
            ),
            Error::McpSessionsFull => body(
                StatusCode::SERVICE_UNAVAILABLE,
                "KT503",
                "/mcp holds as many sessions as KEYTURN_MCP_MAX_SESSIONS allows; try again shortly",
                None,
                Some("a client that ends its session (DELETE /mcp) frees it at once; an idle one ends after five minutes"),
            ),
            Error::McpStreamOpen => body(
                StatusCode::CONFLICT,
                "KT409",
                "this MCP session has its stream (GET /mcp) open already; one per session",
                None,
                Some("close the open stream first; requests of the session are answered on their own POSTs"),
            ),
            Error::McpStreamsFull => body(
                StatusCode::SERVICE_UNAVAILABLE,
                "KT503",
                "/mcp holds as many streams (GET /mcp) as it may: half of KEYTURN_SERVER_CONNECTIONS; try again shortly",
                None,
                Some("the other half stays for cards, /rpc and tool calls; a client does not need the stream to call tools"),
            ),
            Error::NotReady => body(
                StatusCode::SERVICE_UNAVAILABLE,
                "PGRST002",
                "keyturnd is still checking the database; try again shortly",
                None,
                None,
            ),
            _ => match self.db_error() {
                Some(db) => match sqlstate_status(db.code().code()) {
                    Some(status) => body(
                        status,
                        db.code().code(),
                        db.message(),
                        db.detail(),
                        db.hint(),
                    ),
                    // The caller learns the class of the failure (a 40001
                    // may be retried) but not the server's words, which can
                    // name tables, columns and values.
                    None => body(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        db.code().code(),
                        "internal error; keyturnd's log has the details",
                        None,
                        None,
                    ),
                },
                None if self.is_transient() => body(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "PGRST000",
                    "the database is unavailable; try again shortly",
                    None,
                    None,
                ),
                None => body(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "XX000",
                    "internal error; keyturnd's log has the details",
                    None,
                    None,
                ),
            },
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

    #[test]
    fn test_sqlstates_map_to_the_documented_statuses() {
        for (code, status) in [
            ("42501", Some(403)),
            ("55000", Some(409)),
            ("22023", Some(400)),
            ("22P02", Some(400)),
            ("42704", Some(404)),
            ("42883", Some(404)),
            ("54000", Some(429)),
            ("XX000", None),
            ("23505", None),
        ] {
            assert_eq!(sqlstate_status(code).map(|s| s.as_u16()), status, "{code}");
        }
    }
}
