//! What the routes read ([`AppState`]) and the readiness inputs the
//! dispatcher and the signal handler write ([`Health`]): a module of its
//! own, so the routes, the pages and the workers share it without depending
//! on each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::HeaderValue;

use crate::config::{csp_header, DEFAULT_FRAME_ANCESTORS};
use crate::mcp::upstream::Upstreams;
use crate::mcp::Mcp;
use crate::metrics::Metrics;
use crate::rpc::Rpc;

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
    /// `/rpc`, when a JWT key is configured.
    pub rpc: Option<Arc<Rpc>>,
    /// `/mcp`, when MCP roles are configured.
    pub mcp: Option<Arc<Mcp>>,
    /// The upstream MCP servers, whose reachability `/readyz` reports.
    pub upstreams: Option<Arc<Upstreams>>,
    /// The Content-Security-Policy of every answer.
    pub csp: HeaderValue,
    /// The VAPID public key browsers subscribe to Web Push with
    /// (`/card/push-key`), when the webpush channel is on.
    pub vapid_public_key: Option<String>,
}

impl AppState {
    /// A fresh state: not ready, not shutting down, empty metrics, no
    /// `/rpc`, pages that no other site may frame.
    pub fn new() -> Self {
        AppState {
            health: Arc::new(Health::default()),
            metrics: Arc::new(Metrics::new()),
            rpc: None,
            mcp: None,
            upstreams: None,
            csp: csp_header(DEFAULT_FRAME_ANCESTORS).expect("the default frame-ancestors is valid"),
            vapid_public_key: None,
        }
    }

    /// This state serving `/rpc` with `rpc`.
    pub fn with_rpc(mut self, rpc: Rpc) -> Self {
        self.rpc = Some(Arc::new(rpc));
        self
    }

    /// This state serving `/mcp` with `mcp`.
    pub fn with_mcp(mut self, mcp: Arc<Mcp>) -> Self {
        self.mcp = Some(mcp);
        self
    }

    /// This state reporting the reachability of `upstreams` on `/readyz`.
    pub fn with_upstreams(mut self, upstreams: Arc<Upstreams>) -> Self {
        self.upstreams = Some(upstreams);
        self
    }

    /// This state offering `key` to browsers that subscribe to Web Push.
    pub fn with_vapid_public_key(mut self, key: Option<String>) -> Self {
        self.vapid_public_key = key;
        self
    }

    /// This state answering with `csp` (what [`Config::validate`](crate::config::Config::validate)
    /// made of `KEYTURN_FRAME_ANCESTORS`).
    pub fn with_csp(mut self, csp: HeaderValue) -> Self {
        self.csp = csp;
        self
    }
}

impl Default for AppState {
    fn default() -> Self {
        Self::new()
    }
}
