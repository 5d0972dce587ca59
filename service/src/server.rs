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
//!   connection takes the place of the one that has waited longest for a
//!   request head (none sent yet, or an idle keep-alive after its answer),
//!   which is closed; with none such, the new one is closed as soon as it
//!   is accepted, so a client learns at once instead of waiting behind
//!   stalled ones, and the descriptors left keep `/healthz` and the
//!   database connections working. A connection whose request head arrived
//!   but not yet its whole body waits still. Without the first half one
//!   client holding the cap in connections that each sent a byte (or one
//!   request, or a head with no body), opened again as the timeouts closed
//!   them, kept everyone else out (docs/security.md, row 137);
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

/// The connections waiting for a whole request, each with what closes it:
/// the ones a connection accepted at the cap may take the place of. First
/// those with no request under way (none sent yet, or an idle keep-alive
/// after its answer), longest waiting first; then those whose request body
/// is still arriving, the one whose last bytes came longest ago first, so
/// that a body that keeps coming (an upload) is closed last (one client
/// holding the cap in connections that each sent a byte, one request, or
/// a head without its body kept everyone out; docs/security.md, row 137).
#[derive(Clone, Default)]
struct Waiting(Arc<Mutex<Line>>);

/// The next key's number, and who waits by key.
type Line = (u64, BTreeMap<(Wait, u64), CancellationToken>);

/// How a connection waits, in the order they are closed at the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wait {
    /// For a request head.
    Head,
    /// For the rest of a request's body.
    Body,
}

impl Waiting {
    /// Enters `close` as waiting from now; its key.
    fn enter(&self, wait: Wait, close: &CancellationToken) -> (Wait, u64) {
        let mut w = self.lock();
        let key = (wait, w.0);
        w.0 += 1;
        w.1.insert(key, close.clone());
        key
    }

    fn leave(&self, key: (Wait, u64)) {
        self.lock().1.remove(&key);
    }

    /// Closes the connection first in line; false when none waits.
    fn close_longest(&self) -> bool {
        let longest = self.lock().1.pop_first();
        longest.map(|(_, close)| close.cancel()).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Line> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One connection's place among the [`Waiting`]: its requests under way
/// (a whole request arrived, body included, its answer's body not yet sent
/// or dropped), and its key while none is. A head whose body stalls leaves
/// the connection waiting: one client holding the cap in requests whose
/// bodies it never sent kept everyone out until the request timeout, and
/// again at once after it (docs/security.md, row 137).
struct Place {
    waiting: Waiting,
    close: CancellationToken,
    state: Mutex<PlaceState>,
}

#[derive(Default)]
struct PlaceState {
    key: Option<(Wait, u64)>,
    answering: usize,
    gone: bool,
}

impl Place {
    /// A connection just accepted: in no line until it holds a slot
    /// ([`Place::holds_a_slot`]), so a newcomer waiting for the slot of the
    /// connection it closed is never closed for the next one (twenty-ninth
    /// red-team pass).
    fn new(waiting: &Waiting) -> Arc<Place> {
        Arc::new(Place {
            waiting: waiting.clone(),
            close: CancellationToken::new(),
            state: Mutex::new(PlaceState::default()),
        })
    }

    /// It holds a slot now: it waits for its first head.
    fn holds_a_slot(&self) {
        let mut state = self.lock();
        if state.answering == 0 && !state.gone && state.key.is_none() {
            state.key = Some(self.waiting.enter(Wait::Head, &self.close));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PlaceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A whole request arrived (or its answer came first): no longer
    /// waiting until its answer ends.
    fn answering(self: &Arc<Self>) -> Answering {
        let mut state = self.lock();
        state.answering += 1;
        if let Some(key) = state.key.take() {
            self.waiting.leave(key);
        }
        Answering(self.clone())
    }

    /// Bytes of a request's body arrived (or its head, with a body to
    /// come): it waits for the rest, behind those that sent nothing lately.
    fn body_arriving(&self) {
        let mut state = self.lock();
        if state.answering == 0 && !state.gone {
            if let Some(key) = state.key.take() {
                self.waiting.leave(key);
            }
            state.key = Some(self.waiting.enter(Wait::Body, &self.close));
        }
    }

    /// The connection ended.
    fn gone(&self) {
        let mut state = self.lock();
        state.gone = true;
        if let Some(key) = state.key.take() {
            self.waiting.leave(key);
        }
    }
}

/// A request under way on a [`Place`]; dropped with its answer's body (sent,
/// or the connection ended), the connection waits again.
struct Answering(Arc<Place>);

impl Drop for Answering {
    fn drop(&mut self) {
        let place = &self.0;
        let mut state = place.lock();
        state.answering -= 1;
        if state.answering == 0 && !state.gone && state.key.is_none() {
            state.key = Some(place.waiting.enter(Wait::Head, &place.close));
        }
    }
}

/// One request's way from its head to its answer: [`Answering`] from the
/// moment its body has arrived whole (for a request without one, when its
/// handler first runs), or from its answer's, whichever comes first.
struct Arrival {
    place: Arc<Place>,
    answering: Mutex<Option<Answering>>,
    started: std::sync::atomic::AtomicBool,
}

impl Arrival {
    fn new(place: &Arc<Place>) -> Arc<Arrival> {
        Arc::new(Arrival {
            place: place.clone(),
            answering: Mutex::new(None),
            started: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The body arrived whole.
    fn arrived(&self) {
        if !self.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            *self
                .answering
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(self.place.answering());
        }
    }

    /// The answer is ready: what its body holds until it is sent.
    fn answer(&self) -> Option<Answering> {
        if !self.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Some(self.place.answering());
        }
        self.answering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// A request's body, telling its [`Arrival`] when it has arrived whole.
struct ArrivingBody {
    body: hyper::body::Incoming,
    arrival: Arc<Arrival>,
}

impl hyper::body::Body for ArrivingBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.body.is_end_stream() {
            self.arrival.arrived();
        } else if matches!(polled, std::task::Poll::Ready(Some(Ok(_)))) {
            self.arrival.place.body_arriving();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// An answer's body, holding its request's [`Answering`] until it is sent.
struct AnswerBody {
    body: axum::body::Body,
    _answering: Option<Answering>,
}

impl hyper::body::Body for AnswerBody {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
    let waiting = Waiting::default();
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
                    Err(_) if waiting.close_longest() => {
                        tracing::debug!(cap = limits.connections, "at the connection cap; closing the connection waiting longest for a request for a new one");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(cap = limits.connections, "at the connection cap; closing a new connection");
                        drop(stream);
                        continue;
                    }
                };
                let place = Place::new(&waiting);
                let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
                stream.set_write_timeout(Some(limits.request));
                let stream = TokioIo::new(Box::pin(stream));
                let (inner, at) = (service.clone(), place.clone());
                let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let arrival = Arrival::new(&at);
                    let whole = hyper::body::Body::is_end_stream(request.body());
                    if !whole {
                        at.body_arriving();
                    }
                    let request = request.map(|body| ArrivingBody { body, arrival: arrival.clone() });
                    let answer = hyper::service::Service::call(&inner, request);
                    async move {
                        // Under way once its handler runs, not when hyper
                        // reads its head: a pipelined request waits behind
                        // the answers before it, which the client may never
                        // read (twenty-eighth red-team pass).
                        if whole {
                            arrival.arrived();
                        }
                        let answer = answer.await?;
                        Ok::<_, std::convert::Infallible>(answer.map(|body| {
                            axum::body::Body::new(AnswerBody { body, _answering: arrival.answer() })
                        }))
                    }
                });
                let conn = graceful.watch(http.serve_connection(stream, service));
                let slots = slots.clone();
                conns.spawn(async move {
                    let slot = match slot {
                        Some(slot) => slot,
                        None => match tokio::time::timeout(TAKE_OVER_WAIT, slots.acquire_owned()).await {
                            Ok(Ok(slot)) => slot,
                            _ => {
                                place.gone();
                                return;
                            }
                        },
                    };
                    place.holds_a_slot();
                    tokio::select! {
                        ended = conn => if let Err(e) = ended {
                            tracing::debug!(error = %e, "connection ended");
                        },
                        () = place.close.cancelled() => {}
                    }
                    place.gone();
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
