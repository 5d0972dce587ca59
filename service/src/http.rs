//! The HTTP surface: health, readiness and metrics. Nothing here touches
//! actions: keyturnd takes no orders over HTTP.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 once the database connection and its `LISTEN` work (with `KEYTURN_LISTEN_NOTIFY=false`: once a lease call succeeded); 503 before, while the connection is lost, while notifications are stalled (the heartbeat sent through the pool does not arrive), and from SIGTERM on |
//! | `GET /metrics` | Prometheus / OpenMetrics text, see [`crate::metrics`] |

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::metrics::Metrics;

/// Readiness inputs, written by the dispatcher and the signal handler.
#[derive(Debug, Default)]
pub struct Health {
    db_ready: AtomicBool,
    notify_stalled: AtomicBool,
    shutting_down: AtomicBool,
}

impl Health {
    /// Marks the database connection (and its `LISTEN`) as working or not.
    pub fn set_db_ready(&self, ready: bool) {
        self.db_ready.store(ready, Ordering::Release);
    }

    /// Whether the database connection works.
    pub fn db_ready(&self) -> bool {
        self.db_ready.load(Ordering::Acquire)
    }

    /// Marks notifications as stalled (a heartbeat sent through the pool
    /// did not reach the `LISTEN` connection in time) or flowing.
    pub fn set_notify_stalled(&self, stalled: bool) {
        self.notify_stalled.store(stalled, Ordering::Release);
    }

    /// Whether notifications are stalled.
    pub fn notify_stalled(&self) -> bool {
        self.notify_stalled.load(Ordering::Acquire)
    }

    /// Marks the process as draining: `/readyz` answers 503 from now on.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// What the routes read.
#[derive(Clone)]
pub struct AppState {
    /// Readiness inputs.
    pub health: Arc<Health>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
}

impl AppState {
    /// A fresh state: not ready, not shutting down, empty metrics.
    pub fn new() -> Self {
        AppState {
            health: Arc::new(Health::default()),
            metrics: Arc::new(Metrics::new()),
        }
    }
}

impl Default for AppState {
    fn default() -> Self {
        Self::new()
    }
}

/// The router, without a server, so tests can drive it with `oneshot`.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// The `/readyz` body while notifications are stalled: what is wrong and
/// what to do.
pub const STALLED: &str = "notifications stalled: a heartbeat NOTIFY sent through the pool did \
not reach the LISTEN connection; LISTEN behind a transaction-mode pooler? set \
KEYTURN_LISTEN_DATABASE_URL to a direct connection (dispatch continues by polling)\n";

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.health.shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if !state.health.db_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "database not ready\n")
    } else if state.health.notify_stalled() {
        // Dispatch still works, a poll period late: saying 503 is what makes
        // a deployment that silently lost its wake-ups visible.
        (StatusCode::SERVICE_UNAVAILABLE, STALLED)
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let body = state
        .metrics
        .render()
        .map_err(|e| ApiError::internal("encoding metrics", e))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response())
}

/// The one error type of the routes: it logs what went wrong and tells the
/// client only the status.
#[derive(Debug)]
pub enum ApiError {
    /// Something on our side failed.
    Internal {
        /// What we were doing.
        context: &'static str,
        /// The details, for the log only.
        detail: String,
    },
}

impl ApiError {
    /// An internal error while doing `context`.
    pub fn internal(context: &'static str, err: impl std::fmt::Display) -> Self {
        ApiError::Internal {
            context,
            detail: err.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Internal { context, detail } => {
                tracing::error!(context, detail, "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
            }
        }
    }
}
