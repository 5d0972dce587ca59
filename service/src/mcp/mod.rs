//! `/mcp`: keyturn over the Model Context Protocol (docs/mcp.md), on the
//! official Rust SDK's Streamable HTTP server, mounted in keyturnd's axum
//! app. Off unless `KEYTURN_MCP_ROLES` is set.
//!
//! An agent's JWT is verified with the people's keys ([`crate::jwt`]); its
//! `role` claim must be one of `KEYTURN_MCP_ROLES` (else 403), a missing or
//! bad JWT is 401 with `WWW-Authenticate: Bearer`. Each tool call is one
//! transaction on the MCP pool (`KEYTURN_MCP_DATABASE_URL`, a NOINHERIT login
//! of its own): `SET LOCAL ROLE <role>`, the verified claims with
//! `set_config(…, true)`, then keyturn's call ([`crate::db::mcp`]). keyturnd
//! decides nothing: which tools exist, what a read returns and what a write
//! becomes are the database's answers.
//!
//! | module | what |
//! |---|---|
//! | [`server`] | the MCP handler: `tools/list`, `tools/call`, `tasks/*` |
//! | [`streams`] | the standalone streams (`GET /mcp`): one per session, half the connections in all |
//! | [`task`] | the Tasks extension: a proposal's task, its card link |
//! | [`upstream`] | the upstream MCP servers: sessions, discovery, calls |
//! | [`raw_tools`] | the upstream client's HTTP, keeping `tools/list` answers as received |

pub mod raw_tools;
pub mod server;
pub mod streams;
pub mod task;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use deadpool_postgres::Pool;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db;
use crate::error::Error;
use crate::jwt::Verifier;
use crate::metrics::Metrics;
use upstream::Upstreams;

/// The largest `/mcp` request body: a tool call's arguments fit many times.
pub const BODY_LIMIT: usize = 1 << 20;

/// Everything `/mcp` needs.
pub struct Mcp {
    verifier: Verifier,
    pool: Pool,
    /// The dispatcher's pool: the person's link code for an elicitation.
    dispatcher: Pool,
    public_url: Option<url::Url>,
    /// Whether a write's card link goes to the client by URL elicitation
    /// (KEYTURN_MCP_ELICITATION, with a public URL).
    elicit: bool,
    upstreams: Arc<Upstreams>,
    metrics: Arc<Metrics>,
    call_timeout: Duration,
    /// Ends every MCP session (shutdown).
    sessions: CancellationToken,
    /// Whose each session is: a session id works only with the identity
    /// that opened it, and only while keyturnd holds its binding.
    owners: std::sync::Mutex<std::collections::HashMap<String, Binding>>,
    /// rmcp's sessions, which keyturnd ends when an identity opens too many
    /// or when none may be added.
    manager: Arc<LocalSessionManager>,
    /// Sessions open at most (KEYTURN_MCP_MAX_SESSIONS).
    max_sessions: usize,
    /// The card link of each pending task (`task`).
    links: task::Links,
    /// Upstream reads in flight at most, across every agent: as many as the
    /// `/mcp` pool has connections (KEYTURN_MCP_CONNECTIONS). A read holds
    /// no connection while the upstream works (docs/security.md, row 77),
    /// so this bounds what one agent spends of the upstream's quota, which
    /// every tenant shares through keyturnd's credentials.
    upstream_reads: tokio::sync::Semaphore,
    /// The sessions' standalone streams (`GET /mcp`).
    streams: Arc<streams::Streams>,
}

/// Sessions one identity holds at most: opening another ends its oldest. A
/// client needs one; this bounds what one agent can make keyturnd hold.
const SESSIONS_PER_IDENTITY: usize = 8;

/// A session's owner, and when it was opened.
#[derive(Debug)]
struct Binding {
    owner: String,
    opened: std::time::Instant,
}

/// The header rmcp names a legacy session with.
const SESSION_HEADER: &str = "mcp-session-id";

impl std::fmt::Debug for Mcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mcp")
            .field("verifier", &self.verifier)
            .field(
                "public_url",
                &self.public_url.as_ref().map(url::Url::as_str),
            )
            .finish_non_exhaustive()
    }
}

impl Mcp {
    /// `/mcp` as configured, once the database has answered the start-up
    /// checks ([`check_roles`]). `Ok(None)`: off, or shutdown came first.
    pub async fn start(
        config: &Config,
        metrics: Arc<Metrics>,
        dispatcher: Pool,
        upstreams: Arc<Upstreams>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Mcp>, Error> {
        if !config.mcp_enabled() {
            return Ok(None);
        }
        let Some(verifier) = Verifier::from_config(config)? else {
            return Err(Error::Config("KEYTURN_MCP_ROLES needs a JWT key".into()));
        };
        let verifier = verifier.for_roles(config.mcp_roles.iter().map(|r| r.trim().to_owned()));
        let url = config.mcp_database_url.as_ref().ok_or_else(|| {
            Error::Config("KEYTURN_MCP_DATABASE_URL is required with KEYTURN_MCP_ROLES".into())
        })?;
        let pool = db::pool_named(url.expose(), config.mcp_connections, metrics.clone(), "mcp")?;
        let rpc_url = config.rpc_database_url.clone();
        let roles: Vec<String> = verifier.roles().map(str::to_owned).collect();
        let checked = db::until_answered(
            shutdown,
            "MCP database unavailable; waiting for it before serving /mcp",
            || async {
                let client = pool.get().await?;
                let d = dispatcher.get().await?;
                let mut others = vec![db::mcp::login(&d).await?];
                if let Some(rpc) = &rpc_url {
                    let (c, conn) =
                        tokio_postgres::connect(rpc.expose(), tokio_postgres::NoTls).await?;
                    let task = tokio::spawn(conn);
                    others.push(db::mcp::login(&c).await?);
                    drop(c);
                    let _ = task.await;
                }
                check_roles(&client, &roles, &others).await
            },
        )
        .await?;
        if checked.is_none() {
            return Ok(None);
        }
        if config.public_url.is_none() && config.mcp_elicitation {
            tracing::warn!("KEYTURN_PUBLIC_URL is not set: /mcp reaches no person by elicitation; proposals wait in their queue");
        }
        tracing::info!(roles = ?roles, "serving /mcp");
        Ok(Some(Mcp {
            verifier,
            pool,
            dispatcher,
            public_url: config.public_url.clone(),
            elicit: config.mcp_elicitation && config.public_url.is_some(),
            upstreams,
            metrics,
            call_timeout: config.call_timeout(),
            sessions: CancellationToken::new(),
            owners: std::sync::Mutex::new(std::collections::HashMap::new()),
            manager: Arc::new(LocalSessionManager::default()),
            max_sessions: config.mcp_max_sessions,
            links: task::Links::default(),
            upstream_reads: tokio::sync::Semaphore::new(config.mcp_connections.max(1)),
            streams: streams::Streams::new(config.server_connections),
        }))
    }

    /// Ends every MCP session: their streams close, their requests end.
    pub fn close_sessions(&self) {
        self.sessions.cancel();
    }

    /// The `/mcp` routes: rmcp's Streamable HTTP service behind the JWT check.
    pub fn routes<S: Clone + Send + Sync + 'static>(self: &Arc<Self>) -> Router<S> {
        let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
        if let Some(host) = self.public_url.as_ref().and_then(|u| u.host_str()) {
            hosts.push(host.to_owned());
            if let Some(port) = self.public_url.as_ref().and_then(url::Url::port) {
                hosts.push(format!("{host}:{port}"));
            }
        }
        // A page a browser loaded from anywhere else must not reach /mcp
        // (DNS rebinding): a present Origin must be keyturnd's public one or
        // a loopback page's; a client that sends none (the SDKs, an agent
        // process) is not a browser page and passes.
        let mut origins: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .flat_map(|host| [format!("http://{host}:*"), format!("https://{host}:*")])
            .collect();
        if let Some(url) = &self.public_url {
            if let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) {
                origins.push(format!("{}://{host}:{port}", url.scheme()));
            }
        }
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_allowed_origins(origins)
            .enforce_origin_validation()
            .with_cancellation_token(self.sessions.clone())
            .with_max_request_body_bytes(BODY_LIMIT);
        let mcp = Arc::clone(self);
        let service = StreamableHttpService::new(
            move || Ok(server::Handler::new(Arc::clone(&mcp))),
            Arc::clone(&self.manager),
            config,
        );
        Router::new()
            .nest_service("/mcp", service)
            .layer(middleware::from_fn_with_state(
                Arc::clone(self),
                authenticate,
            ))
    }
}

/// 401 for a missing or bad JWT, 403 for a role outside `KEYTURN_MCP_ROLES`;
/// otherwise the verified identity travels with the request to the handler.
async fn authenticate(State(mcp): State<Arc<Mcp>>, mut request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    match mcp.verifier.verify(authorization) {
        Ok(verified) => {
            let owner = session_owner(&verified);
            let session = request
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if let Some(id) = &session {
                let owners = mcp.owners.lock().unwrap_or_else(|e| e.into_inner());
                if owners.get(id).is_none_or(|b| b.owner != owner) {
                    // Another identity's session, or one keyturnd no longer
                    // binds (ended, or closed for a newer one): as if it did
                    // not exist, and the client opens a new one. Never bound
                    // to whoever presents it next.
                    mcp.metrics.mcp_call("auth", "foreign_session");
                    return axum::http::StatusCode::NOT_FOUND.into_response();
                }
            }
            request.extensions_mut().insert(verified);
            if request.method() == axum::http::Method::POST {
                request = match read_strictly(request).await {
                    Ok(request) => request,
                    Err(refused) => {
                        mcp.metrics.mcp_call("auth", "bad_body");
                        return refused.into_response();
                    }
                };
            }
            let ends_session = request.method() == axum::http::Method::DELETE;
            // A standalone stream is held until the client lets it go: its
            // slot first (docs/security.md, row 84).
            let slot = match (&session, request.method() == axum::http::Method::GET) {
                (Some(id), true) => match mcp.streams.open(id) {
                    Ok(slot) => Some(slot),
                    Err(refused) => {
                        mcp.metrics.mcp_call("auth", "stream_refused");
                        return match refused {
                            streams::Refused::Open => Error::McpStreamOpen,
                            streams::Refused::Full => Error::McpStreamsFull,
                        }
                        .into_response();
                    }
                },
                _ => None,
            };
            let mut response = next.run(request).await;
            if let Some(slot) = slot {
                if response.status() == axum::http::StatusCode::OK {
                    response = slot.hold(response);
                }
            }
            if ends_session && response.status() == axum::http::StatusCode::ACCEPTED {
                // rmcp answers a session's end 202; the official SDKs take 200
                // or 204 (the Python client logs any other as a failure).
                *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
                *response.body_mut() = axum::body::Body::empty();
                if let Some(id) = &session {
                    mcp.owners
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(id);
                }
            }
            if session.is_none() {
                let opened = response
                    .headers()
                    .get(SESSION_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                if let Some(id) = opened {
                    if !mcp.bind(id, owner).await {
                        mcp.metrics.mcp_call("auth", "too_many_sessions");
                        return Error::McpSessionsFull.into_response();
                    }
                }
            }
            response
        }
        Err(Error::RoleNotAllowed) => {
            mcp.metrics.mcp_call("auth", "forbidden");
            Error::McpRoleNotAllowed.into_response()
        }
        Err(e) => {
            mcp.metrics.mcp_call("auth", "unauthorized");
            e.into_response()
        }
    }
}

/// The request with its body read whole (at most [`BODY_LIMIT`]), refused
/// when the SDK's JSON reader and the database's would read it apart
/// ([`crate::body`]).
async fn read_strictly(request: Request) -> Result<Request, Error> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .map_err(|_| Error::BodyTooLarge)?;
    if let Some(why) = crate::body::read_apart(&bytes) {
        return Err(Error::BadBody(why.into()));
    }
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

impl Mcp {
    /// Binds a session rmcp just opened to its owner. The owner's oldest
    /// session is ended when it would hold more than
    /// [`SESSIONS_PER_IDENTITY`]; when keyturnd holds `max_sessions` (those
    /// rmcp ended for idleness forgotten first), the new one is ended and
    /// `false` returned. Nothing another identity opened is ever ended.
    async fn bind(&self, id: String, owner: String) -> bool {
        let full = self.owners.lock().unwrap_or_else(|e| e.into_inner()).len() >= self.max_sessions;
        let live: Option<std::collections::HashSet<String>> = if full {
            let sessions = self.manager.sessions.read().await;
            Some(sessions.keys().map(|k| k.to_string()).collect())
        } else {
            None
        };
        let mut ended = Vec::new();
        let bound = {
            let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(live) = &live {
                owners.retain(|k, _| live.contains(k));
            }
            if owners.len() >= self.max_sessions {
                ended.push(id);
                false
            } else {
                let mut mine: Vec<(std::time::Instant, String)> = owners
                    .iter()
                    .filter(|(_, b)| b.owner == owner)
                    .map(|(k, b)| (b.opened, k.clone()))
                    .collect();
                mine.sort();
                let over = (mine.len() + 1).saturating_sub(SESSIONS_PER_IDENTITY);
                for (_, old) in mine.into_iter().take(over) {
                    owners.remove(&old);
                    ended.push(old);
                }
                let opened = std::time::Instant::now();
                owners.insert(id, Binding { owner, opened });
                true
            }
        };
        for id in ended {
            use rmcp::transport::streamable_http_server::session::SessionManager;
            if let Err(e) = self.manager.close_session(&id.into()).await {
                tracing::debug!(error = %e, "ending an MCP session");
            }
        }
        bound
    }
}

/// Who a session belongs to: the role and the claims, without those a
/// renewed JWT of the same agent changes.
fn session_owner(verified: &crate::jwt::Verified) -> String {
    let mut claims: serde_json::Value =
        serde_json::from_str(&verified.claims).unwrap_or(serde_json::Value::Null);
    if let Some(o) = claims.as_object_mut() {
        for k in ["exp", "iat", "nbf", "jti"] {
            o.remove(k);
        }
    }
    format!("{}\u{0}{claims}", verified.role)
}

/// The start-up checks of `/mcp` (docs/mcp.md): each role of `roles` exists,
/// is a member of keyturn_agent and of no role that approves, operates,
/// administers or dispatches; the MCP login is NOINHERIT, a member of each,
/// and is none of `other_logins` (the dispatcher's and `/rpc`'s).
pub async fn check_roles(
    client: &tokio_postgres::Client,
    roles: &[String],
    other_logins: &[String],
) -> Result<(), Error> {
    let refuse = |why: String| Err(Error::Config(why));
    for c in db::mcp::role_checks(client, roles).await? {
        let (name, login) = (&c.name, &c.login);
        if other_logins.contains(login) {
            return refuse(format!(
                "KEYTURN_MCP_DATABASE_URL logs in as {login}, which is also the dispatcher's or /rpc's login: /mcp needs a login of its own"
            ));
        }
        if c.login_inherits {
            return refuse(format!(
                "KEYTURN_MCP_DATABASE_URL logs in as {login}, which inherits its roles' privileges: make it NOINHERIT (ALTER ROLE {login} NOINHERIT), so that it acts only as the role a JWT selects"
            ));
        }
        if !c.present {
            return refuse(format!("KEYTURN_MCP_ROLES: role {name} does not exist"));
        }
        if !c.agent {
            return refuse(format!(
                "KEYTURN_MCP_ROLES: role {name} is not a member of keyturn_agent; an MCP caller is an agent"
            ));
        }
        if let Some(other) = &c.other_side {
            return refuse(format!(
                "KEYTURN_MCP_ROLES: role {name} is a member of {other}; an agent's role must never approve, operate, administer or dispatch"
            ));
        }
        if !c.can_set {
            return refuse(format!(
                "KEYTURN_MCP_ROLES: the MCP login {login} is not a member of role {name}: GRANT {name} TO {login}"
            ));
        }
    }
    for role in roles {
        if let Err(e) = db::rpc::try_set_role(client, role).await {
            if e.is_transient() {
                return Err(e);
            }
            return refuse(format!(
                "KEYTURN_MCP_ROLES: the MCP login cannot SET ROLE {role}: {e}"
            ));
        }
    }
    Ok(())
}
