//! The standalone streams of `/mcp` (`GET /mcp`, server-sent events): the
//! only requests the request timeout does not end, so each is a connection
//! held for as long as the client likes. One per session, as the official
//! TypeScript SDK's server allows (a second is `409`), and all of them
//! together at most half of `KEYTURN_SERVER_CONNECTIONS` (past it `503`):
//! the other half stays for cards, `/rpc`, `/healthz` and tool calls
//! (docs/security.md, row 84). An identity holds at most eight sessions, so
//! eight streams.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;

/// Why a stream was not opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The session has its stream already.
    Open,
    /// Every slot for streams is taken.
    Full,
}

/// The sessions with a stream open.
#[derive(Debug)]
pub struct Streams {
    open: Mutex<HashSet<String>>,
    max: usize,
}

/// A session's stream slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    streams: Arc<Streams>,
    session: String,
}

impl Streams {
    /// Room for half of `connections` streams (at least one).
    pub fn new(connections: usize) -> Arc<Streams> {
        Arc::new(Streams {
            open: Mutex::new(HashSet::new()),
            max: (connections / 2).max(1),
        })
    }

    /// Takes the slot of `session`'s stream.
    pub fn open(self: &Arc<Self>, session: &str) -> Result<Slot, Refused> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.contains(session) {
            return Err(Refused::Open);
        }
        if open.len() >= self.max {
            return Err(Refused::Full);
        }
        open.insert(session.to_owned());
        Ok(Slot {
            streams: Arc::clone(self),
            session: session.to_owned(),
        })
    }

    /// Streams open now.
    pub fn open_now(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.streams
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.session);
    }
}

impl Slot {
    /// `response` with the slot held until its body is dropped: when the
    /// stream ends or the client goes away.
    pub fn hold(self, response: Response) -> Response {
        let (parts, body) = response.into_parts();
        let body = body.into_data_stream().map(move |chunk| {
            let _held = &self;
            chunk
        });
        Response::from_parts(parts, Body::from_stream(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_one_stream_per_session_and_half_the_connections_in_all() {
        let streams = Streams::new(4);
        let a = streams.open("a").unwrap();
        assert_eq!(streams.open("a").unwrap_err(), Refused::Open);
        let _b = streams.open("b").unwrap();
        assert_eq!(streams.open("c").unwrap_err(), Refused::Full);
        drop(a);
        assert_eq!(streams.open_now(), 1);
        let _a = streams.open("a").unwrap();
    }

    #[tokio::test]
    async fn test_the_slot_is_given_back_when_the_body_is_dropped() {
        let streams = Streams::new(2);
        let held = streams
            .open("s")
            .unwrap()
            .hold(Response::new(Body::from("data: x\n\n")));
        assert_eq!(streams.open("s").unwrap_err(), Refused::Open);
        let bytes = axum::body::to_bytes(held.into_body(), 1024).await.unwrap();
        assert_eq!(&bytes[..], b"data: x\n\n");
        assert_eq!(streams.open_now(), 0);
    }
}
