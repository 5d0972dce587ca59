//! The upstream MCP servers of `[[mcp_upstream]]`: one long-lived client
//! session each (rmcp's Streamable HTTP client), their tools discovered at
//! start, every `KEYTURN_MCP_REFRESH_SECONDS` and on
//! `notifications/tools/list_changed`, and registered through
//! `keyturn.register_discovered_tool` (the database classifies, hashes and
//! registers; keyturnd only reports what the upstream said).
//!
//! **Credentials.** An upstream's headers are configuration: sent on every
//! request to it, never logged, never a param, never in a receipt. Errors
//! are logged by their kind, never with a request.
//!
//! **Sent or not.** A call that fails before its request could have left
//! (no session, connection refused) is [`CallError::NotSent`]; anything else
//! once the request may have left is [`CallError::AfterSend`] or a JSON-RPC
//! error, which the `mcp` provider records as `unknown`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, ErrorData, JsonObject,
    PaginatedRequestParams, RequestMetaObject, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::raw_tools::RawTools;
use crate::config::{self, Config};
use crate::db;
use crate::error::Error;
use crate::log::quote;
use crate::metrics::{Metrics, UpstreamLabel};

/// Pages of `tools/list` read at most from one upstream.
const MAX_PAGES: usize = 50;

/// The shortest time between two discoveries of one upstream that its
/// `notifications/tools/list_changed` starts: an upstream may say its list
/// changed as often as it likes, and each discovery writes the catalog every
/// tenant reads (thirtieth red-team pass, docs/security.md row 142).
/// Notifications in the meantime are one discovery at its end.
const LIST_CHANGED_GAP: Duration = Duration::from_secs(10);

/// Tools of one discovery that are not registered, logged one by one; the
/// rest are only counted (`not_registered` on the discovery's line).
const REFUSALS_LOGGED: usize = 3;

/// Why an upstream call did not give a result.
#[derive(Debug)]
pub enum CallError {
    /// Nothing can have reached the upstream.
    NotSent(String),
    /// The request may have reached it; what became of it is unknown.
    AfterSend(String),
    /// The upstream answered with a JSON-RPC error.
    Rpc(ErrorData),
}

/// For the log: on one line and short, whatever an upstream put in its
/// error (its message is the upstream's words, up to rmcp's 16 MiB).
impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotSent(why) => write!(f, "not sent: {why}"),
            CallError::AfterSend(why) => write!(f, "after the request may have left: {why}"),
            CallError::Rpc(e) => write!(f, "JSON-RPC error {}: {}", e.code.0, quote(&e.message)),
        }
    }
}

/// Hears an upstream's notifications.
#[derive(Clone)]
struct Listener {
    changed: Arc<Notify>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }
}

/// One upstream MCP server and its session.
pub struct Upstream {
    config: config::Upstream,
    http: RawTools,
    session: tokio::sync::Mutex<Option<RunningService<RoleClient, Listener>>>,
    changed: Arc<Notify>,
    up: AtomicBool,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the headers: they are credentials.
        f.debug_struct("Upstream")
            .field("name", &self.config.name)
            .field("url", &self.config.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    fn new(config: config::Upstream, connect_timeout: Duration) -> Result<Self, Error> {
        let http = reqwest013::Client::builder()
            .redirect(reqwest013::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .no_proxy()
            .build()
            .map_err(|e| Error::Config(format!("mcp_upstream {}: {e}", config.name)))?;
        Ok(Upstream {
            config,
            http: RawTools::new(http),
            session: tokio::sync::Mutex::new(None),
            changed: Arc::new(Notify::new()),
            up: AtomicBool::new(false),
        })
    }

    /// Its configured name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether its last `tools/list` was answered.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The session's peer, connecting (the `initialize` handshake) first
    /// when there is none. A failure here sent nothing of any call.
    async fn peer(&self) -> Result<rmcp::Peer<RoleClient>, CallError> {
        let mut session = self.session.lock().await;
        if let Some(s) = session.as_ref() {
            if !s.is_closed() {
                return Ok(s.peer().clone());
            }
        }
        // A new session numbers its requests from the start again.
        self.http.forget();
        let mut headers = HashMap::new();
        for (name, value) in &self.config.headers {
            let (Ok(n), Ok(v)) = (
                axum::http::HeaderName::from_bytes(name.as_bytes()),
                axum::http::HeaderValue::from_str(value.expose()),
            ) else {
                return Err(CallError::NotSent(
                    "a configured header is not valid".into(),
                ));
            };
            headers.insert(n, v);
        }
        let transport = CallsAsApproved(StreamableHttpClientTransport::with_client(
            self.http.clone(),
            StreamableHttpClientTransportConfig::with_uri(self.config.url.as_str())
                .custom_headers(headers),
        ));
        let listener = Listener {
            changed: self.changed.clone(),
        };
        let running = listener.serve(transport).await.map_err(|e| {
            CallError::NotSent(format!("could not open a session: {}", kind_of(&e)))
        })?;
        let peer = running.peer().clone();
        *session = Some(running);
        Ok(peer)
    }

    /// Drops the session (its calls in flight end with it); the next
    /// request opens another.
    async fn reset(&self) {
        if let Some(s) = self.session.lock().await.take() {
            let _ = s.cancel().await;
        }
        self.http.forget();
    }

    /// Closes the session (shutdown).
    pub async fn close(&self) {
        self.reset().await;
    }

    /// Every tool definition of its `tools/list`, each the JSON object as
    /// received ([`RawTools`]; where an answer came as a plain JSON body, as
    /// rmcp reads it), ended by `by`. Never served from a cache.
    pub async fn list(&self, by: Instant) -> Result<Vec<Value>, CallError> {
        let result = match tokio::time::timeout_at(by, self.list_pages()).await {
            Ok(Err(e @ CallError::NotSent(_))) => {
                // The session failed where no agent's input was involved:
                // the next request opens another.
                self.reset().await;
                Err(e)
            }
            Ok(r) => r,
            // A slow answer is the upstream's, not the session's: the
            // calls in flight on it go on.
            Err(_) => Err(CallError::NotSent("tools/list timed out".into())),
        };
        self.up.store(result.is_ok(), Ordering::Relaxed);
        result
    }

    async fn list_pages(&self) -> Result<Vec<Value>, CallError> {
        let peer = self.peer().await?;
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = cursor.take().map(|c| {
                let mut p = PaginatedRequestParams::default();
                p.cursor = Some(c);
                p
            });
            let request = ClientRequest::ListToolsRequest(rmcp::model::ListToolsRequest {
                method: Default::default(),
                params,
                extensions: Default::default(),
            });
            let failed = |e: ServiceError| match e {
                ServiceError::McpError(e) => CallError::Rpc(e),
                other => CallError::NotSent(format!("tools/list failed: {}", kind_of(&other))),
            };
            let handle = peer
                .send_request_with_option(request, PeerRequestOptions::no_options())
                .await
                .map_err(failed)?;
            let id = handle.id.clone();
            let answer = handle.await_response().await.map_err(failed)?;
            let raw = self.http.take(&id);
            let next = match answer {
                ServerResult::ListToolsResult(r) => {
                    match raw.and_then(|raw| same_tools(&raw, &r.tools)) {
                        Some(as_sent) => tools.extend(as_sent),
                        None => {
                            for tool in &r.tools {
                                tools.push(serde_json::to_value(tool).map_err(|e| {
                                    CallError::NotSent(format!("a tool does not serialize: {e}"))
                                })?);
                            }
                        }
                    }
                    r.next_cursor
                }
                // What rmcp cannot read (an annotation that is not a
                // boolean, say) arrives raw: passed on as it is, so the
                // database classifies it (a write) and hashes it.
                ServerResult::CustomResult(raw) => {
                    let raw = raw.0;
                    if let Some(list) = raw.get("tools").and_then(Value::as_array) {
                        tools.extend(list.iter().cloned());
                    }
                    raw.get("nextCursor")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                }
                _ => {
                    return Err(CallError::NotSent(
                        "tools/list: an unexpected answer".into(),
                    ))
                }
            };
            match next {
                Some(c) if !c.is_empty() => cursor = Some(c),
                _ => return Ok(tools),
            }
        }
        Ok(tools)
    }

    /// The live definition of its tool `name`; `None` when it no longer
    /// lists one.
    pub async fn definition(&self, name: &str, by: Instant) -> Result<Option<Value>, CallError> {
        let tools = self.list(by).await?;
        Ok(tools
            .into_iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name)))
    }

    /// One `tools/call` of `name` with `arguments` and `meta`, ended by `by`.
    pub async fn call(
        &self,
        name: &str,
        arguments: JsonObject,
        meta: Option<JsonObject>,
        by: Instant,
    ) -> Result<CallToolResult, CallError> {
        let peer = self.peer().await?;
        if Instant::now() >= by {
            return Err(CallError::NotSent("no time left before the call".into()));
        }
        let mut params = CallToolRequestParams::new(name.to_owned());
        params.arguments = Some(arguments);
        params.meta = meta.map(|m| RequestMetaObject(rmcp::model::MetaObject(m)));
        // One call's failure is its own. The session is shared by every
        // agent's reads and every approved call, so a call that fails or
        // is slow (which an agent's arguments can make a read) never ends
        // it: rmcp closes a session whose transport ended, and `peer` opens
        // another. A timed-out call is dropped, which cancels it at the
        // upstream (`notifications/cancelled`).
        let called = tokio::time::timeout_at(by, peer.call_tool(params)).await;
        match called {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(ServiceError::McpError(e))) => Err(CallError::Rpc(e)),
            Ok(Err(e)) => {
                // The upstream said the session is gone: the next call
                // opens one (rmcp would have sent this call again on it).
                if self.http.took_expired() {
                    self.reset().await;
                }
                let why = format!("tools/call failed: {}", kind_of(&e));
                if never_left(&e) {
                    Err(CallError::NotSent(why))
                } else {
                    Err(CallError::AfterSend(why))
                }
            }
            Err(_) => Err(CallError::AfterSend("tools/call timed out".into())),
        }
    }
}

/// The upstream transport, with each `tools/call` sent as approved: its
/// `_meta` is exactly what keyturn put there (`{"idempotency_key": …}`).
/// rmcp gives every request a `progressToken` from a per-session counter,
/// so the same approved call would differ from one attempt to the next,
/// and keyturn asks for no progress.
struct CallsAsApproved<T>(T);

impl<T: rmcp::transport::Transport<RoleClient>> rmcp::transport::Transport<RoleClient>
    for CallsAsApproved<T>
{
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let rmcp::model::JsonRpcMessage::Request(r) = &mut item {
            if matches!(r.request, ClientRequest::CallToolRequest(_)) {
                use rmcp::model::GetMeta;
                r.request.get_meta_mut().0.remove("progressToken");
            }
        }
        self.0.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send
    {
        self.0.receive()
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.0.close()
    }
}

/// The tools of a raw `tools/list` result, when they are the ones rmcp read
/// (the same names, in the same order): what keyturn takes as received.
fn same_tools(raw: &Value, read: &[rmcp::model::Tool]) -> Option<Vec<Value>> {
    let list = raw.get("tools")?.as_array()?;
    let names = list.iter().map(|t| t.get("name").and_then(Value::as_str));
    (list.len() == read.len() && names.eq(read.iter().map(|t| Some(t.name.as_ref()))))
        .then(|| list.clone())
}

/// Whether an rmcp error proves the request never left: a connection that
/// could not be made.
fn never_left(e: &ServiceError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(r) = err.downcast_ref::<reqwest013::Error>() {
            return r.is_connect();
        }
        source = err.source();
    }
    false
}

/// An error's words for the log, quoted (what an upstream says could
/// otherwise write lines of its own into keyturnd's log).
fn kind_of(e: &dyn std::fmt::Display) -> String {
    quote(&e.to_string())
}

/// Every configured upstream.
#[derive(Debug, Default)]
pub struct Upstreams {
    by_name: HashMap<String, Arc<Upstream>>,
    order: Vec<String>,
}

impl Upstreams {
    /// The upstreams of `config` (none connected yet).
    pub fn from_config(config: &Config) -> Result<Upstreams, Error> {
        let mut upstreams = Upstreams::default();
        for u in &config.mcp_upstreams {
            let name = u.name.clone();
            let upstream = Upstream::new(u.clone(), config.call_timeout() / 2)?;
            upstreams.order.push(name.clone());
            upstreams.by_name.insert(name, Arc::new(upstream));
        }
        Ok(upstreams)
    }

    /// Whether none is configured.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The upstream of that name.
    pub fn get(&self, name: &str) -> Option<Arc<Upstream>> {
        self.by_name.get(name).cloned()
    }

    /// Each upstream, in configuration order.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.order.iter().filter_map(|n| self.by_name.get(n))
    }

    /// Closes every session.
    pub async fn close(&self) {
        for u in self.all() {
            u.close().await;
        }
    }
}

/// Discovers each upstream's tools and registers them, at start, every
/// `refresh` and whenever an upstream says its list changed, until
/// `shutdown`.
pub async fn discovery_loop(
    upstreams: Arc<Upstreams>,
    pool: Pool,
    metrics: Arc<Metrics>,
    refresh: Duration,
    call_timeout: Duration,
    shutdown: CancellationToken,
) {
    let tasks: Vec<_> = upstreams
        .all()
        .cloned()
        .map(|u| {
            let (pool, metrics, shutdown) = (pool.clone(), metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                loop {
                    let started = Instant::now();
                    discover(&u, &pool, &metrics, call_timeout).await;
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(refresh) => {}
                        _ = u.changed.notified() => {
                            tracing::info!(upstream = u.name(), "upstream says its tool list changed; discovering again");
                            tokio::select! {
                                _ = shutdown.cancelled() => break,
                                _ = tokio::time::sleep_until(started + LIST_CHANGED_GAP) => {}
                            }
                        }
                    }
                }
                u.close().await;
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// One discovery of `u`: its tools, each registered (or left as it is).
pub async fn discover(u: &Upstream, pool: &Pool, metrics: &Metrics, call_timeout: Duration) {
    let label = UpstreamLabel {
        upstream: u.name().to_owned(),
    };
    let tools = match u.list(Instant::now() + call_timeout).await {
        Ok(tools) => tools,
        Err(e) => {
            metrics.mcp_upstream_up.get_or_create(&label).set(0);
            tracing::warn!(upstream = u.name(), error = %e, "upstream MCP server unreachable; its tools stay as registered");
            return;
        }
    };
    metrics.mcp_upstream_up.get_or_create(&label).set(1);
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(upstream = u.name(), error = %e, "cannot register the upstream's tools: no database connection");
            return;
        }
    };
    let (mut registered, mut refused) = (0, 0);
    for tool in &tools {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or("?");
        // The database's error for a NUL in jsonb would quote the definition
        // into its log (docs/security.md, row 131); no such tool is kept.
        let why = if keyturn_core::text::holds_nul(tool) {
            "its definition holds the NUL character (U+0000)".to_owned()
        } else {
            match db::mcp::register_discovered_tool(
                &client,
                u.name(),
                tool,
                u.config.trust_annotations,
            )
            .await
            {
                Ok(_) => {
                    registered += 1;
                    continue;
                }
                // The database quotes the upstream's name for the tool.
                Err(e) => e
                    .db_error()
                    .map(|d| d.message().to_owned())
                    .unwrap_or_else(|| e.to_string()),
            }
        };
        refused += 1;
        // An upstream chooses how many tools it lists: a line for each
        // would let it fill the log at every discovery.
        if refused <= REFUSALS_LOGGED {
            tracing::warn!(upstream = u.name(), tool = %quote(name), reason = %quote(&why), "upstream tool not registered");
        }
    }
    tracing::info!(
        upstream = u.name(),
        tools = tools.len(),
        registered,
        not_registered = refused,
        "upstream tools discovered"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fifteenth red-team pass (docs/security.md, row 113): an upstream's
    /// JSON-RPC error of 1 MiB went into keyturnd's log whole, on every
    /// discovery. What is logged of it is one short line.
    #[test]
    fn test_an_upstream_error_is_logged_on_one_short_line() {
        let words = format!(
            "UPSTREAM WORDS\n2026-12-07T00:00:00Z WARN forged{}",
            "x".repeat(1 << 20)
        );
        let e = CallError::Rpc(ErrorData::new(
            rmcp::model::ErrorCode(-32000),
            words,
            Some(serde_json::json!({"more": "y".repeat(1 << 16)})),
        ));
        let logged = e.to_string();
        assert!(logged.len() < 400, "{} characters", logged.len());
        assert!(!logged.contains('\n'), "{logged}");
        assert!(
            logged.starts_with("JSON-RPC error -32000: UPSTREAM WORDS\\n2026"),
            "{logged}"
        );
    }
}
