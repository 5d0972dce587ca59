//! The MCP handler: `tools/list` and `tools/call`, each one transaction as
//! the agent ([`super`]).
//!
//! **The token never reaches the model.** `propose`'s token is never read
//! (see [`crate::db::mcp::propose`]); a card link, with its one-time code,
//! goes only into a URL-mode elicitation, which the client shows the person
//! and never puts in a tool result.

use std::sync::Arc;

use keyturn_core::text::{holds_nul, members_hold_nul};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, ElicitRequest, ElicitRequestParams, GetTaskParams, GetTaskResult,
    Implementation, InputRequest, InputRequests, InputRequiredResult, JsonObject, ListToolsResult,
    MetaObject, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tokio::time::Instant;
use uuid::Uuid;

use super::upstream::CallError;
use super::{task, Mcp};
use crate::db::{self, mcp::Proposed};
use crate::error::{sqlstate_status, Error};
use crate::jwt::Verified;

/// The one tool keyturn adds of its own.
pub const STATUS_TOOL: &str = "keyturn_action_status";

/// The key of the card link's elicitation in an `input_required` answer.
const CARD_INPUT: &str = "keyturn_card";

/// The origin keys a proposal takes from the request's `_meta`, else from
/// the claims.
const ORIGIN_KEYS: &[&str] = &[
    "conversation_id",
    "turn_id",
    "message_id",
    "assistant_message_id",
];

/// Serves one MCP session.
#[derive(Clone)]
pub struct Handler {
    mcp: Arc<Mcp>,
}

impl Handler {
    /// A handler for a new session.
    pub fn new(mcp: Arc<Mcp>) -> Self {
        Handler { mcp }
    }
}

/// The identity the authentication layer verified for this request.
fn verified(context: &RequestContext<RoleServer>) -> Result<Verified, ErrorData> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Verified>())
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("no verified identity on the request", None))
}

/// A call's transaction: the role, the claims; `Some(tenant)` when the
/// database says calls must name their tenant (Citus, layout B).
async fn as_agent<'a>(
    tx: &tokio_postgres::Transaction<'a>,
    who: &Verified,
) -> Result<Option<String>, Error> {
    db::rpc::run_as(tx, &who.role).await?;
    if db::rpc::assert_claims_by_tenant(tx, &who.claims).await? {
        db::rpc::callers_tenant(tx, &who.claims).await
    } else {
        Ok(None)
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("keyturn", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "keyturn: read tools answer at once, their data fenced; a write tool's call becomes a \
                 proposal that a person approves on their own device before anything happens. \
                 Follow a proposal with keyturn_action_status.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let who = verified(&context)?;
        let listed = self
            .read_as_agent(&who, async |tx| db::mcp::tools(tx).await)
            .await;
        let tools = match listed {
            Ok(t) => t,
            Err(e) => {
                self.mcp.metrics.mcp_call("list", "refused");
                return Err(protocol_error(&e));
            }
        };
        self.mcp.metrics.mcp_call("list", "listed");
        let mut out = Vec::with_capacity(tools.len() + 1);
        for t in tools {
            let schema = match t.input_schema {
                Value::Object(o) => o,
                _ => JsonObject::new(),
            };
            let annotations: ToolAnnotations =
                serde_json::from_value(t.annotations).unwrap_or_default();
            out.push(Tool::new(t.name, t.description, Arc::new(schema)).annotate(annotations));
        }
        out.push(status_tool());
        Ok(ListToolsResult::with_all_items(out))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let who = verified(&context)?;
        let name = request.name.to_string();
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        tracing::debug!(tool = %name, "mcp tools/call");
        // Refused before the database sees it: PostgreSQL's error for a NUL
        // in jsonb quotes the values into its log (docs/security.md, row 85).
        if holds_nul(&args)
            || name.contains('\0')
            || members_hold_nul(&context.meta.0 .0)
            || request
                .meta
                .as_ref()
                .is_some_and(|m| members_hold_nul(&m.0 .0))
        {
            self.mcp.metrics.mcp_call("write", "refused");
            return Err(ErrorData::invalid_params(
                "the call holds the NUL character (U+0000) in its arguments or _meta, which keyturn cannot store; remove it",
                None,
            ));
        }
        if name == STATUS_TOOL {
            Ok(self.status(&who, &args).await.into())
        } else if let Some(state) = request.request_state.as_deref() {
            self.resume(&who, &name, &args, state).await
        } else {
            Ok(self.tool(&who, &name, &args, &request, &context).await)
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let who = verified(&context)?;
        let action = self.own_task(&who, &request.task_id).await?;
        let p = &action.proposed;
        let asked = if p.status == "pending" {
            self.mcp
                .links
                .get(p.action_id)
                .filter(|_| action.same_session)
                .map(|url| card_input(p, &url))
        } else {
            self.mcp.links.forget(p.action_id);
            None
        };
        let done = action.result.clone().map(|r| {
            let mut out = proposed(p, Some(r));
            out.is_error = Some(p.status != "succeeded");
            out
        });
        self.mcp.metrics.mcp_call("task", "read");
        Ok(GetTaskResult::new(task::detailed(&action, asked, done)))
    }

    /// The client's answer to the card link's elicitation: acknowledged,
    /// and nothing else; the person decides on the card, never through the
    /// agent's client.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let who = verified(&context)?;
        let action = self.own_task(&who, &request.task_id).await?;
        let outstanding = action.proposed.status == "pending"
            && action.same_session
            && self.mcp.links.get(action.proposed.action_id).is_some();
        if !outstanding || request.input_responses.keys().any(|k| k != CARD_INPUT) {
            self.mcp.metrics.mcp_call("task", "refused");
            return Err(ErrorData::invalid_params(
                format!("the task asks for no input but {CARD_INPUT}, and only while it waits for a person"),
                None,
            ));
        }
        self.mcp.metrics.mcp_call("task", "updated");
        Ok(())
    }

    /// Refused: an agent cannot withdraw what it proposed; a person rejects
    /// it, or it expires.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let who = verified(&context)?;
        let action = self.own_task(&who, &request.task_id).await?;
        self.mcp.metrics.mcp_call("task", "refused");
        Err(ErrorData::invalid_request(
            format!(
                "keyturn does not let an agent cancel its proposal: a person rejects it, or it expires at {}",
                action.proposed.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None,
        ))
    }
}

impl Handler {
    /// One read as the agent: a transaction of its own on the MCP pool, the
    /// role and claims asserted, `read`, commit.
    async fn read_as_agent<T>(
        &self,
        who: &Verified,
        read: impl AsyncFnOnce(&tokio_postgres::Transaction<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut client = self.mcp.pool.get().await?;
        let tx = db::transaction(&mut client).await?;
        as_agent(&tx, who).await?;
        let out = read(&tx).await?;
        db::commit(tx).await?;
        Ok(out)
    }

    /// `keyturn_action_status`: the caller's own action, or the same
    /// refusal for anything else.
    async fn status(&self, who: &Verified, args: &Value) -> CallToolResult {
        let not_found =
            || CallToolResult::error(vec![ContentBlock::text("No action of yours has that id.")]);
        let Some(id) = args
            .get("action_id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            self.mcp.metrics.mcp_call("status", "refused");
            return not_found();
        };
        let answer = self
            .read_as_agent(who, async |tx| db::mcp::action_status(tx, id).await)
            .await;
        match answer {
            Ok(Some((status, result))) => {
                self.mcp.metrics.mcp_call("status", "read");
                let mut structured = json!({"action_id": id, "status": status});
                if let Some(r) = result {
                    structured["result"] = r;
                }
                let mut out = CallToolResult::structured(structured);
                out.content = vec![ContentBlock::text(format!("Action {id} is {status}."))];
                out
            }
            Ok(None) => {
                self.mcp.metrics.mcp_call("status", "refused");
                not_found()
            }
            Err(e) => {
                self.mcp.metrics.mcp_call("status", "error");
                refusal(&e)
            }
        }
    }

    /// A client's retry of a write call that keyturn answered with
    /// `input_required` (2026-07-28): its request state is the proposal's
    /// id, and the database says whether the retry is that call (its
    /// principal, tool and params). The answer is the proposal as it stands
    /// now; nothing is proposed again. Anything else is refused as invalid
    /// params, which the client reports instead of calling again.
    async fn resume(
        &self,
        who: &Verified,
        name: &str,
        args: &Value,
        state: &str,
    ) -> Result<CallToolResponse, ErrorData> {
        let stale = || {
            ErrorData::invalid_params(
                "requestState does not name a proposal of this call; call the tool again without it",
                None,
            )
        };
        let Ok(action_id) = Uuid::parse_str(state) else {
            self.mcp.metrics.mcp_call("write", "refused");
            return Err(stale());
        };
        let answer = self
            .read_as_agent(who, async |tx| {
                db::mcp::resume(tx, action_id, name, args).await
            })
            .await;
        match answer {
            Ok(Some(action)) => {
                self.mcp.metrics.mcp_call("write", "resumed");
                Ok(proposed(&action.proposed, action.result).into())
            }
            Ok(None) => {
                self.mcp.metrics.mcp_call("write", "refused");
                Err(stale())
            }
            Err(e) => {
                self.mcp.metrics.mcp_call("write", "refused");
                Ok(refusal(&e).into())
            }
        }
    }

    /// A tool of the catalog: a read answers fenced, a write proposes.
    async fn tool(
        &self,
        who: &Verified,
        name: &str,
        args: &Value,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let mut client = match self.mcp.pool.get().await {
            Ok(c) => c,
            Err(e) => return refusal(&e.into()).into(),
        };
        let run = async {
            let tx = db::transaction(&mut client).await?;
            let tenant = as_agent(&tx, who).await?;
            let tools = db::mcp::tools(&tx).await?;
            let found = tools.into_iter().find(|t| t.name == name);
            let outcome = match found {
                Some(t) if t.kind == "read" && t.upstream.is_none() => {
                    let fenced = db::mcp::read(&tx, name, args).await?;
                    Answer::Read(fenced, "read")
                }
                // Only checked here: the upstream is called with no
                // connection held (below).
                Some(t) if t.kind == "read" => {
                    Answer::Upstream(db::mcp::upstream_read(&tx, name, args).await?)
                }
                // A write, or a tool the principal may not call: propose
                // refuses the latter with its own SQLSTATE.
                _ => {
                    let origin = origin(request, &context.meta.0 .0, &who.claims);
                    let proposed =
                        db::mcp::propose(&tx, tenant.as_deref(), name, args, &origin).await?;
                    Answer::Proposed(proposed, None)
                }
            };
            db::commit(tx).await?;
            // A covered proposal's result, read once it committed: on Citus
            // layout B the propose_for changed the tenant's shards as the
            // agent, and Citus refuses reading them back as anyone else in
            // that transaction (keyturn.mcp_action_status is the owner's).
            // The proposal stands whatever this read does: a failure leaves
            // the result out (keyturn_action_status has it), never an error
            // the agent would answer by proposing again.
            let outcome = match outcome {
                Answer::Proposed(p, _) if p.status != "pending" => {
                    let read = async {
                        let tx = db::transaction(&mut client).await?;
                        as_agent(&tx, who).await?;
                        let row = db::mcp::action_status(&tx, p.action_id).await?;
                        db::commit(tx).await?;
                        Ok::<_, Error>(row.and_then(|(_, r)| r))
                    };
                    let result = read.await.unwrap_or_else(|e| {
                        tracing::warn!(action_id = %p.action_id, error = %e, "could not read a covered proposal's result");
                        None
                    });
                    Answer::Proposed(p, result)
                }
                other => other,
            };
            Ok::<_, Error>(outcome)
        }
        .await;
        // Back to the pool before the person is reached or an upstream is
        // called: a legacy client may take its time answering the
        // elicitation (or never answer), an upstream read as long as the
        // HTTP timeout, and neither may hold a connection (or a snapshot)
        // every other agent needs (docs/security.md, rows 62 and 77).
        drop(client);
        let run = match run {
            Ok(Answer::Upstream(allowed)) => match self.upstream_read(&allowed, args).await {
                Ok(data) => self.fenced_for(who, name, args, &data).await,
                Err(text) => Ok(Answer::Failed(text)),
            },
            other => other,
        };
        let done = match run {
            Ok(Answer::Read(fenced, kind)) => {
                self.mcp.metrics.mcp_call(kind, "read");
                let mut out = CallToolResult::success(vec![ContentBlock::text(fenced.reference)]);
                let mut meta = Map::new();
                meta.insert("guard".into(), Value::String(fenced.guard));
                meta.insert("evidence_id".into(), json!(fenced.evidence_id));
                out.meta = Some(MetaObject(meta));
                out
            }
            Ok(Answer::Failed(text)) => {
                self.mcp.metrics.mcp_call("upstream_read", "error");
                CallToolResult::error(vec![ContentBlock::text(text)])
            }
            Ok(Answer::Proposed(p, result)) => {
                self.mcp.metrics.mcp_call("write", "proposed");
                if p.status == "pending" {
                    let tasks = context
                        .client_capabilities()
                        .is_some_and(|c| c.supports_tasks());
                    if tasks {
                        return CallToolResponse::Task(self.start_task(who, &p, context).await);
                    }
                    if let Some(asked) = self.reach_person(who, &p, context).await {
                        return asked.into();
                    }
                }
                proposed(&p, result)
            }
            // Called above; never here.
            Ok(Answer::Upstream(_)) => {
                CallToolResult::error(vec![ContentBlock::text("The upstream was not called.")])
            }
            Err(e) => {
                self.mcp.metrics.mcp_call("write", "refused");
                refusal(&e)
            }
        };
        done.into()
    }

    /// An upstream read's answer fenced for the agent, in a transaction of
    /// its own, after the upstream call: the call is checked again first, so
    /// a grant revoked or a tool turned off while the upstream worked
    /// returns nothing.
    async fn fenced_for(
        &self,
        who: &Verified,
        name: &str,
        args: &Value,
        data: &Value,
    ) -> Result<Answer, Error> {
        let mut client = self.mcp.pool.get().await?;
        let tx = db::transaction(&mut client).await?;
        as_agent(&tx, who).await?;
        let allowed = db::mcp::upstream_read(&tx, name, args).await?;
        let fenced = db::mcp::fence(&tx, &allowed.projection, data).await?;
        db::commit(tx).await?;
        Ok(Answer::Read(fenced, "upstream_read"))
    }

    /// Calls an upstream read tool; `Err`: the text of an error result
    /// (never the upstream's own words, which are unfenced data).
    async fn upstream_read(
        &self,
        allowed: &db::mcp::UpstreamRead,
        args: &Value,
    ) -> Result<Value, String> {
        let Some(upstream) = self.mcp.upstreams.get(&allowed.upstream) else {
            return Err(format!(
                "The upstream {} is not configured in this keyturnd.",
                allowed.upstream
            ));
        };
        let arguments = match args {
            Value::Object(o) => o.clone(),
            _ => JsonObject::new(),
        };
        let by = Instant::now() + self.mcp.call_timeout;
        // A slot, waited for no longer than the call itself may take.
        let Ok(Ok(_slot)) = tokio::time::timeout_at(by, self.mcp.upstream_reads.acquire()).await
        else {
            return Err("Too many upstream reads are running; try again shortly.".into());
        };
        match upstream.call(&allowed.tool, arguments, None, by).await {
            Ok(r) if r.is_error == Some(true) => {
                Err("The upstream answered with an error; its text is not passed on.".into())
            }
            Ok(r) => {
                let data = match r.structured_content {
                    Some(v) if !v.is_null() => v,
                    _ => {
                        let text: Vec<String> = r
                            .content
                            .iter()
                            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                            .collect();
                        json!({"text": text.join("\n")})
                    }
                };
                // Refused before the database: its error for a NUL in jsonb
                // quotes the answer into the server log (docs/security.md,
                // rows 85 and 131).
                if holds_nul(&data) {
                    return Err(
                        "The upstream's answer holds the NUL character (U+0000), which \
                                keyturn cannot store; it is not passed on."
                            .into(),
                    );
                }
                Ok(data)
            }
            Err(CallError::NotSent(_) | CallError::AfterSend(_) | CallError::Rpc(_)) => {
                Err("The upstream could not be reached; try again later.".into())
            }
        }
    }

    /// The card link for the person behind this client (a fresh one-time
    /// code, minted on the dispatcher's connection for the person), when
    /// the client declared URL elicitation, a public URL is configured and
    /// elicitation is on. `None` leaves the proposal in the person's queue;
    /// so does an independent tool, whose proposer may not decide it (the
    /// database mints no code).
    async fn card_url(
        &self,
        who: &Verified,
        p: &Proposed,
        context: &RequestContext<RoleServer>,
    ) -> Option<url::Url> {
        let base = self.mcp.public_url.as_ref().filter(|_| self.mcp.elicit)?;
        let url_mode = context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            .is_some_and(|e| e.url.is_some());
        if !url_mode {
            return None;
        }
        let code = async {
            let mut client = self.mcp.dispatcher.get().await?;
            db::mcp::link_code(&mut client, &who.claims, p.action_id).await
        }
        .await;
        match code {
            Ok(code) => Some(card_link(base, p.action_id, &code)),
            Err(e) => {
                tracing::debug!(action_id = %p.action_id, error = %e, "no card link for the elicitation");
                None
            }
        }
    }

    /// The card link as a URL-mode elicitation ([`Self::card_url`]).
    ///
    /// Before 2026-07-28 it is a request to the client, while the call
    /// waits. 2026-07-28 has no requests to the client: the call's answer
    /// is then `input_required`, carrying the elicitation, with the
    /// proposal's id as the request state; the client's retry of the call
    /// gets the proposal ([`Self::resume`]). That answer is returned.
    async fn reach_person(
        &self,
        who: &Verified,
        p: &Proposed,
        context: &RequestContext<RoleServer>,
    ) -> Option<InputRequiredResult> {
        let url = self.card_url(who, p, context).await?;
        if context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
        {
            return Some(InputRequiredResult::new(
                Some(card_input(p, &url)),
                Some(p.action_id.to_string()),
            ));
        }
        let sent = context
            .peer
            .elicit_url_with_timeout(
                card_message(p),
                url,
                p.action_id.to_string(),
                Some(std::time::Duration::from_secs(20)),
            )
            .await;
        tracing::debug!(action_id = %p.action_id, elicited = ?sent.map(|a| format!("{a:?}")).map_err(|e| e.to_string()), "elicitation");
        None
    }

    /// A pending proposal as a task ([`task`]), for a client that declared
    /// the Tasks extension: the card link is minted now and kept for the
    /// task's `tasks/get`.
    async fn start_task(
        &self,
        who: &Verified,
        p: &Proposed,
        context: &RequestContext<RoleServer>,
    ) -> CreateTaskResult {
        let url = self.card_url(who, p, context).await;
        let given = url.is_some_and(|url| {
            self.mcp
                .links
                .keep(p.action_id, url, p.expires_at, &super::session_owner(who))
        });
        self.mcp.metrics.mcp_call("task", "created");
        CreateTaskResult::new(task::created(p.action_id, given))
    }

    /// The calling agent's action behind a task id, or the same refusal for
    /// anything else (no such task, another's, not a uuid).
    async fn own_task(
        &self,
        who: &Verified,
        task_id: &str,
    ) -> Result<db::mcp::OwnAction, ErrorData> {
        let unknown = || ErrorData::invalid_params("no task of yours has that id", None);
        let Ok(id) = Uuid::parse_str(task_id) else {
            self.mcp.metrics.mcp_call("task", "refused");
            return Err(unknown());
        };
        let read = self
            .read_as_agent(who, async |tx| db::mcp::task(tx, id).await)
            .await;
        match read {
            Ok(Some(action)) => Ok(action),
            Ok(None) => {
                self.mcp.metrics.mcp_call("task", "refused");
                Err(unknown())
            }
            Err(e) => {
                self.mcp.metrics.mcp_call("task", "error");
                Err(protocol_error(&e))
            }
        }
    }
}

/// The card link's elicitation, as an input request.
fn card_input(p: &Proposed, url: &url::Url) -> InputRequests {
    let elicit = ElicitRequest::new(ElicitRequestParams::UrlElicitationParams {
        meta: None,
        message: card_message(p),
        url: url.to_string(),
        elicitation_id: p.action_id.to_string(),
    });
    InputRequests::from([(CARD_INPUT.to_owned(), InputRequest::Elicitation(elicit))])
}

fn card_message(p: &Proposed) -> String {
    format!("Review and approve on keyturn: {}", p.summary)
}

/// What a call came to, before its answer is written.
enum Answer {
    Read(db::mcp::Fenced, &'static str),
    /// An upstream read the database allowed, not yet called.
    Upstream(db::mcp::UpstreamRead),
    Failed(String),
    Proposed(Proposed, Option<Value>),
}

/// `<base>/card#a=<id>&c=<code>`.
pub fn card_link(base: &url::Url, action_id: Uuid, code: &str) -> url::Url {
    let mut url = base.clone();
    let path = format!("{}/card", base.path().trim_end_matches('/'));
    url.set_path(&path);
    url.set_query(None);
    // RFC 3986's unreserved characters stay as they are (a link code is
    // base64url); anything else is escaped, so a code can never add a
    // fragment parameter of its own.
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    let code: String = percent_encoding::utf8_percent_encode(code, ESCAPED).to_string();
    url.set_fragment(Some(&format!("a={action_id}&c={code}")));
    url
}

/// The origin of a proposal: each key from the request's `_meta`, else from
/// the claims of the same name; `evidence` likewise.
fn origin(request: &CallToolRequestParams, context_meta: &JsonObject, claims: &str) -> Value {
    // rmcp hands the request's `_meta` to the context; a client that put
    // it in the params (as some do) is read there too.
    let meta: Option<&JsonObject> = if context_meta.is_empty() {
        request.meta.as_ref().map(|m| &m.0 .0)
    } else {
        Some(context_meta)
    };
    let claims: Value = serde_json::from_str(claims).unwrap_or(Value::Null);
    let mut out = Map::new();
    for key in ORIGIN_KEYS.iter().chain(std::iter::once(&"evidence")) {
        let v = meta
            .and_then(|m| m.get(*key))
            .or_else(|| claims.get(*key))
            .cloned();
        if let Some(v) = v {
            out.insert((*key).to_owned(), v);
        }
    }
    Value::Object(out)
}

/// The result of a proposal: structured, and one plain sentence.
fn proposed(p: &Proposed, result: Option<Value>) -> CallToolResult {
    let expires = p
        .expires_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut structured = json!({
        "action_id": p.action_id,
        "status": p.status,
        "summary": p.summary,
        "expires_at": expires,
    });
    let text = if p.status == "pending" {
        format!(
            "Proposed \"{}\" as action {}: nothing happens unless the person approves it before {expires}; \
             keyturn_action_status tells you when they have.",
            p.summary, p.action_id
        )
    } else {
        format!(
            "Proposed \"{}\" as action {}, which a standing approval or the person's request covered: it is {}.",
            p.summary, p.action_id, p.status
        )
    };
    if let Some(r) = result {
        structured["result"] = r;
    }
    let mut out = CallToolResult::structured(structured);
    out.content = vec![ContentBlock::text(text)];
    out
}

/// A refusal as a tool result: the database's SQLSTATE and message when it
/// refused the call, a generic sentence otherwise (the log has the rest).
fn refusal(e: &Error) -> CallToolResult {
    let (code, message) = match e.db_error() {
        Some(db) if sqlstate_status(db.code().code()).is_some() => {
            (db.code().code().to_owned(), db.message().to_owned())
        }
        Some(db) => {
            tracing::warn!(
                sqlstate = db.code().code(),
                message = db.message(),
                "mcp call failed"
            );
            (
                db.code().code().to_owned(),
                "internal error; keyturnd's log has the details".to_owned(),
            )
        }
        None if e.is_transient() => (
            "08000".to_owned(),
            "the database is unavailable; try again shortly".to_owned(),
        ),
        None => {
            tracing::warn!(error = %e, "mcp call failed");
            (
                "XX000".to_owned(),
                "internal error; keyturnd's log has the details".to_owned(),
            )
        }
    };
    let mut out = CallToolResult::structured_error(json!({"code": code, "message": message}));
    out.content = vec![ContentBlock::text(format!(
        "keyturn refused the call (SQLSTATE {code}): {message}"
    ))];
    out
}

/// A JSON-RPC error for `tools/list` and `tasks/*`.
fn protocol_error(e: &Error) -> ErrorData {
    match e.db_error() {
        Some(db) if sqlstate_status(db.code().code()).is_some() => ErrorData::invalid_request(
            format!(
                "keyturn refused (SQLSTATE {}): {}",
                db.code().code(),
                db.message()
            ),
            None,
        ),
        _ => {
            tracing::warn!(error = %e, "mcp request failed");
            ErrorData::internal_error("keyturn could not answer; try again", None)
        }
    }
}

/// `keyturn_action_status`'s definition.
fn status_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {"action_id": {"type": "string", "format": "uuid",
                                     "description": "The action_id a write tool's call returned."}},
        "required": ["action_id"],
        "additionalProperties": false
    });
    let Value::Object(schema) = schema else {
        unreachable!("an object literal")
    };
    Tool::new(
        STATUS_TOOL,
        "The status of an action you proposed (pending, succeeded, failed, ...) and, once final, its result.",
        Arc::new(schema),
    )
    .annotate(
        ToolAnnotations::new()
            .read_only(true)
            .open_world(false),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_card_link_carries_only_the_action_and_the_code() {
        let base = url::Url::parse("https://keyturn.example.com/base/").unwrap();
        let id = Uuid::nil();
        let link = card_link(&base, id, "abc-_1&a=x");
        assert_eq!(
            link.as_str(),
            "https://keyturn.example.com/base/card#a=00000000-0000-0000-0000-000000000000&c=abc-_1%26a%3Dx"
        );
    }

    #[test]
    fn test_origin_prefers_meta_and_takes_only_its_keys() {
        let mut p = CallToolRequestParams::new("x");
        let mut meta = JsonObject::new();
        meta.insert("conversation_id".into(), json!("c-meta"));
        meta.insert("token".into(), json!("nope"));
        p.meta = Some(rmcp::model::RequestMetaObject(MetaObject(meta)));
        let o = origin(
            &p,
            &JsonObject::new(),
            r#"{"conversation_id": "c-claim", "turn_id": "t1", "sub": "alice"}"#,
        );
        assert_eq!(o, json!({"conversation_id": "c-meta", "turn_id": "t1"}));
    }
}
