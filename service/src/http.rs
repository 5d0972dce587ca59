//! The HTTP surface. keyturnd takes no orders over HTTP: `/rpc` only
//! passes a person's own calls to the database, which decides.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 once the database connection and its `LISTEN` work (with `KEYTURN_LISTEN_NOTIFY=false`: once a lease call succeeded); 503 before, while the connection is lost, while notifications are stalled (the heartbeat sent through the pool does not arrive), and from SIGTERM on |
//! | `GET /metrics` | Prometheus / OpenMetrics text, see [`crate::metrics`] |
//! | `POST /rpc/<function>` | with a JWT key configured: the keyturn call, see [`crate::rpc`] and docs/http.md |
//! | `POST /card/session` | with `/rpc`: a link's one-time code for a card session, see [`crate::rpc::card`] |
//! | `POST /card/token` | with `/rpc`: a fresh token for one of a card session's actions |
//! | `GET /card`, `GET /console`, `GET /card/<asset>` | the approval card and the operator console, see [`crate::pages`] |
//!
//! Every answer carries `X-Content-Type-Options: nosniff`,
//! `Referrer-Policy: no-referrer` and the pages' Content-Security-Policy;
//! `/rpc` and `/card/session` answers also `Cache-Control: no-store`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::Error;
use crate::state::AppState;

/// The largest `/rpc` body accepted; `approve_many`'s 100 items with their
/// params fit many times over.
pub const BODY_LIMIT: usize = 1 << 20;

/// The largest `/card/session` body: a code and a hundred action ids.
pub const CARD_SESSION_LIMIT: usize = 16 << 10;

/// The router, without a server, so tests can drive it with `oneshot`.
pub fn app(state: AppState) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::pages::routes());
    if state.rpc.is_some() {
        router = router
            .route(
                "/rpc/{function}",
                post(rpc).layer(DefaultBodyLimit::max(BODY_LIMIT)),
            )
            .route(
                "/card/session",
                post(card_session).layer(DefaultBodyLimit::max(CARD_SESSION_LIMIT)),
            )
            .route(
                "/card/token",
                post(card_token).layer(DefaultBodyLimit::max(CARD_SESSION_LIMIT)),
            );
    }
    if let Some(mcp) = &state.mcp {
        router = router.merge(mcp.routes());
    }
    router
        .layer(middleware::from_fn_with_state(
            state.clone(),
            security_headers,
        ))
        .with_state(state)
}

async fn security_headers(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let rpc = request.uri().path().starts_with("/rpc/")
        || matches!(request.uri().path(), "/card/session" | "/card/token");
    // The path only: a query string is never logged, in case someone put a
    // token into one (the card and the console never do).
    tracing::debug!(
        method = %request.method(),
        path = request.uri().path(),
        has_query = request.uri().query().is_some(),
        "request"
    );
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CONTENT_SECURITY_POLICY, state.csp.clone());
    if rpc {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn rpc(
    State(state): State<AppState>,
    Path(function): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let rpc = state.rpc.as_ref().ok_or(Error::NotReady)?;
    let body = body_of(body)?;
    let authorization = authorization(&headers)?;
    Ok(json(rpc.call(&function, authorization, &body).await?))
}

/// `POST /card/session`: a link's one-time code for a card session
/// ([`crate::rpc::card`]).
async fn card_session(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let rpc = state.rpc.as_ref().ok_or(Error::NotReady)?;
    Ok(json(rpc.redeem(&body_of(body)?).await?))
}

/// `POST /card/token`: a fresh token for one of a card session's actions
/// ([`crate::rpc::card`]).
async fn card_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let rpc = state.rpc.as_ref().ok_or(Error::NotReady)?;
    let authorization = authorization(&headers)?;
    Ok(json(rpc.card_token(authorization, &body_of(body)?).await?))
}

/// The request's `Authorization` header, if it has one as text.
fn authorization(headers: &HeaderMap) -> Result<Option<&str>, Error> {
    headers
        .get(header::AUTHORIZATION)
        .map(|v| {
            v.to_str()
                .map_err(|_| Error::Unauthorized("the Authorization header is not text"))
        })
        .transpose()
}

/// The request's body, or why there is none: too large (413) or unreadable.
fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Error> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::BodyTooLarge
        } else {
            Error::BadBody(rejection.body_text())
        }
    })
}

fn json(value: serde_json::Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )],
        value.to_string(),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// The `/readyz` body while notifications are stalled: what is wrong and
/// what to do.
pub const STALLED: &str = "notifications stalled: a heartbeat NOTIFY sent through the pool did \
not reach the LISTEN connection; LISTEN behind a transaction-mode pooler? set \
KEYTURN_LISTEN_DATABASE_URL to a direct connection (dispatch continues by polling)\n";

async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let (status, text) = if state.health.shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if !state.health.db_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "database not ready\n")
    } else if state.health.notify_stalled() {
        // Dispatch still works, a poll period late: saying 503 is what makes
        // a deployment that silently lost its wake-ups visible.
        (StatusCode::SERVICE_UNAVAILABLE, STALLED)
    } else {
        (StatusCode::OK, "ready\n")
    };
    // An upstream MCP server that is down stops only its own tools, never
    // keyturnd: reported, never a 503.
    let mut text = text.to_owned();
    for u in state.upstreams.iter().flat_map(|u| u.all()) {
        let word = if u.is_up() {
            "reachable"
        } else {
            "unreachable"
        };
        text.push_str(&format!("upstream {}: {word}\n", u.name()));
    }
    (status, text)
}

async fn metrics(State(state): State<AppState>) -> Result<Response, Error> {
    let body = state
        .metrics
        .render()
        .map_err(|e| Error::internal("encoding metrics", e))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response())
}
