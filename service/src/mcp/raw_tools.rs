//! rmcp's Streamable HTTP client, keeping each `tools/list` answer as the
//! upstream sent it.
//!
//! rmcp reads a tool into its `Tool`, which keeps only the fields it knows:
//! the 2025-11-25 `execution` (which the official TypeScript SDK sets on
//! every tool) and vendor keys are gone by the time keyturnd sees it. keyturn
//! hashes a definition as received (`upstream_schema_sha256`), and a change
//! to any of it is a new tool version. So this client passes every exchange
//! to reqwest's, as rmcp would, and keeps the raw `result` of each
//! `tools/list` answer that arrives as an SSE event (the default of both
//! official SDKs' servers), by its JSON-RPC id, for [`RawTools::take`]. An
//! answer in a plain JSON body is read inside rmcp's client before anything
//! else sees it: for those, rmcp's reading stands.
//!
//! It also keeps a `tools/call` to one send: rmcp answers an HTTP 404 (the
//! upstream's "session expired") by opening a new session and sending the
//! request again, which for an approved call would be a second call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderName, HeaderValue};
use futures_util::stream::{BoxStream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde_json::Value;
use sse_stream::Sse;

/// Answers kept and not yet taken, at most (one whose request timed out is
/// never taken).
const KEPT: usize = 16;

/// reqwest's client for rmcp: the raw `tools/list` answers it saw, and each
/// `tools/call` sent once.
#[derive(Clone)]
pub struct RawTools {
    http: reqwest013::Client,
    kept: Arc<Mutex<HashMap<String, Value>>>,
    /// The upstream answered a `tools/call` that its session had expired.
    expired: Arc<AtomicBool>,
}

impl RawTools {
    pub fn new(http: reqwest013::Client) -> Self {
        RawTools {
            http,
            kept: Arc::default(),
            expired: Arc::default(),
        }
    }

    /// The raw `result` of the `tools/list` answer to request `id`, once.
    pub fn take(&self, id: &RequestId) -> Option<Value> {
        self.kept.lock().ok()?.remove(&key(id))
    }

    /// Whether the upstream has said, since the last ask, that the session
    /// a `tools/call` went over had expired (its session is then gone).
    pub fn took_expired(&self) -> bool {
        self.expired.swap(false, Ordering::Relaxed)
    }

    /// Forgets every answer not taken: a new session numbers its requests
    /// from the start again.
    pub fn forget(&self) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.clear();
        }
    }

    /// `stream`, noting the answer to request `id` when it passes.
    fn tap(
        &self,
        stream: BoxStream<'static, Result<Sse, SseError>>,
        id: String,
    ) -> BoxStream<'static, Result<Sse, SseError>> {
        let kept = self.kept.clone();
        stream
            .inspect(move |event| {
                let Some(data) = event.as_ref().ok().and_then(|e| e.data.as_deref()) else {
                    return;
                };
                let Ok(Value::Object(mut answer)) = serde_json::from_str::<Value>(data) else {
                    return;
                };
                if answer.get("id").map(Value::to_string).as_deref() != Some(id.as_str()) {
                    return;
                }
                // The first answer to the id, as rmcp takes the first.
                if let (Some(result), Ok(mut kept)) = (answer.remove("result"), kept.lock()) {
                    if kept.len() >= KEPT {
                        kept.clear();
                    }
                    kept.entry(id.clone()).or_insert(result);
                }
            })
            .boxed()
    }
}

/// A request id as its JSON text (a number and a string never collide).
fn key(id: &RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

/// The id of a `tools/list` request, the only answers kept.
fn tools_list_id(message: &ClientJsonRpcMessage) -> Option<String> {
    match message {
        JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::ListToolsRequest(_)) => {
            Some(key(&r.id))
        }
        _ => None,
    }
}

/// Whether `message` is a `tools/call` request, which is sent at most once.
fn is_tools_call(message: &ClientJsonRpcMessage) -> bool {
    matches!(message, JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::CallToolRequest(_)))
}

type Stream = BoxStream<'static, Result<Sse, SseError>>;
type HttpError = StreamableHttpError<reqwest013::Error>;

impl StreamableHttpClient for RawTools {
    type Error = reqwest013::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let id = tools_list_id(&message);
        let is_call = is_tools_call(&message);
        let answer = match self
            .http
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
        {
            // rmcp opens a new session on a 404 and sends the request again.
            // A tools/call was sent: whatever the upstream did with it is
            // unknown, and it is never sent a second time.
            Err(StreamableHttpError::SessionExpired) if is_call => {
                self.expired.store(true, Ordering::Relaxed);
                return Err(StreamableHttpError::UnexpectedServerResponse(
                    "HTTP 404 (session expired) to a tools/call it was sent; not sent again".into(),
                ));
            }
            answer => answer?,
        };
        Ok(match (answer, id) {
            (StreamableHttpPostResponse::Sse(stream, session), Some(id)) => {
                StreamableHttpPostResponse::Sse(self.tap(stream, id), session)
            }
            (answer, _) => answer,
        })
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.http
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Stream, HttpError> {
        self.http
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Stream, HttpError> {
        self.http
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
