//! keyturnd's HTTP server: [`crate::http::app`] on hyper's HTTP/1, with the
//! bounds `axum::serve` does not set, so that no client can hold keyturnd:
//!
//! - a **header-read timeout** (`KEYTURN_SERVER_HEADER_SECONDS`, hyper's own
//!   timer): a connection that has not sent a whole request head in time,
//!   whether it dribbles bytes or sends none (an idle keep-alive one
//!   included), is closed;
//! - a **request timeout** (`KEYTURN_SERVER_REQUEST_SECONDS`, tower-http's
//!   `TimeoutLayer`): a request whose handler, body read included, takes
//!   longer is answered `408`;
//! - a **write timeout** (the same seconds, `tokio-io-timeout` on the
//!   socket): a write that makes no progress for that long ends the
//!   connection, so a client that stops reading its answers (pipelined
//!   requests it never reads) cannot hold one. It runs only while a write
//!   waits: an idle `GET /mcp` stream is not timed, one whose client stopped
//!   reading is;
//! - a **connection cap** (`KEYTURN_SERVER_CONNECTIONS`): at it, a new
//!   connection takes the place of the oldest one that has not yet sent a
//!   whole request head, which is closed; with none such, the new one is
//!   closed as soon as it is accepted, so a client learns at once instead of
//!   waiting behind stalled ones, and the descriptors left keep `/healthz`
//!   and the database connections working. Without the first half one
//!   client holding the cap in connections that each sent a byte, opened
//!   again as the header timeout closed them, kept everyone else out
//!   (docs/security.md, row 137);
//! - a **shutdown with a deadline**: once told to stop, keyturnd accepts no
//!   more connections, closes idle ones, lets requests under way finish, and
//!   at the deadline (the SIGTERM plus `KEYTURN_SHUTDOWN_SECONDS`) closes
//!   whatever is still open, a half-sent request included.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::TimeoutLayer;

use crate::config::Config;

/// A pause after a failed `accept` (out of descriptors, say), so the loop
/// does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long a connection accepted at the cap waits for the slot of the one
/// it closed (its task drops it at once).
const TAKE_OVER_WAIT: Duration = Duration::from_secs(1);

/// The connections that have not yet sent a whole request head, oldest
/// first, each with what closes it: the ones a connection accepted at the
/// cap may take the place of.
#[derive(Clone, Default)]
struct Unserved(Arc<Mutex<BTreeMap<u64, CancellationToken>>>);

impl Unserved {
    fn insert(&self, id: u64) -> CancellationToken {
        let close = CancellationToken::new();
        self.lock().insert(id, close.clone());
        close
    }

    /// Its first request head arrived (or it ended).
    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes the oldest; false when there is none.
    fn close_oldest(&self) -> bool {
        let oldest = self.lock().pop_first();
        oldest.map(|(_, close)| close.cancel()).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one client may hold of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time to send a whole request head.
    pub header_read: Duration,
    /// Time for a whole request, its body included.
    pub request: Duration,
    /// Connections open at most.
    pub connections: usize,
}

impl Limits {
    /// The limits a [`Config`] sets.
    pub fn from_config(config: &Config) -> Self {
        Limits {
            header_read: Duration::from_secs(config.server_header_seconds),
            request: Duration::from_secs(config.server_request_seconds),
            connections: config.server_connections,
        }
    }
}

/// Serves `router` on `listener` within `limits` until `stop` resolves; its
/// value is the deadline by which every connection is closed (see the
/// module's docs).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = Instant>,
) {
    let router = router.layer(TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        limits.request,
    ));
    let service = TowerToHyperService::new(router);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let slots = Arc::new(Semaphore::new(limits.connections));
    let unserved = Unserved::default();
    let mut next_id: u64 = 0;
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    let deadline = loop {
        tokio::select! {
            deadline = &mut stop => break deadline,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let slot = match slots.clone().try_acquire_owned() {
                    Ok(slot) => Some(slot),
                    Err(_) if unserved.close_oldest() => {
                        tracing::debug!(cap = limits.connections, "at the connection cap; closing the oldest connection that sent no request for a new one");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(cap = limits.connections, "at the connection cap; closing a new connection");
                        drop(stream);
                        continue;
                    }
                };
                let id = next_id;
                next_id += 1;
                let close = unserved.insert(id);
                let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
                stream.set_write_timeout(Some(limits.request));
                let stream = TokioIo::new(Box::pin(stream));
                let (inner, marks) = (service.clone(), unserved.clone());
                let service = hyper::service::service_fn(move |request| {
                    marks.remove(id);
                    hyper::service::Service::call(&inner, request)
                });
                let conn = graceful.watch(http.serve_connection(stream, service));
                let (slots, unserved) = (slots.clone(), unserved.clone());
                conns.spawn(async move {
                    let slot = match slot {
                        Some(slot) => slot,
                        None => match tokio::time::timeout(TAKE_OVER_WAIT, slots.acquire_owned()).await {
                            Ok(Ok(slot)) => slot,
                            _ => {
                                unserved.remove(id);
                                return;
                            }
                        },
                    };
                    tokio::select! {
                        ended = conn => if let Err(e) = ended {
                            tracing::debug!(error = %e, "connection ended");
                        },
                        () = close.cancelled() => {}
                    }
                    unserved.remove(id);
                    drop(slot);
                });
            }
        }
    };
    drop(listener);
    let closing = async {
        graceful.shutdown().await;
        while conns.join_next().await.is_some() {}
    };
    if tokio::time::timeout_at(deadline, closing).await.is_err() {
        tracing::warn!(
            connections = conns.len(),
            "closing the connections still open at the shutdown deadline"
        );
        conns.shutdown().await;
    }
}
