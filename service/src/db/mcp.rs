//! The SQL of `/mcp` ([`crate::mcp`]) and of the upstream MCP servers
//! ([`crate::mcp::upstream`], [`crate::providers::mcp`]). Every agent call
//! runs in the request's transaction, after [`super::rpc::run_as`] and the
//! claims; `propose`'s token is never selected, so keyturnd never holds it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use super::{bounded, get, query_one, query_one_for};
use crate::error::Error;

/// One row of `keyturn.mcp_tools()`.
#[derive(Clone, Debug)]
pub struct McpTool {
    pub name: String,
    pub kind: String,
    pub description: String,
    pub input_schema: Value,
    pub annotations: Value,
    /// The upstream MCP server of a discovered tool.
    pub upstream: Option<String>,
}

/// `keyturn.mcp_tools()`: what the calling principal may call.
pub async fn tools(tx: &Transaction<'_>) -> Result<Vec<McpTool>, Error> {
    let rows = bounded(tx.query_typed(
        "SELECT name, kind, description, input_schema, annotations, upstream FROM keyturn.mcp_tools()",
        &[],
    ))
    .await?;
    rows.iter()
        .map(|r| {
            Ok(McpTool {
                name: get(r, "name")?,
                kind: get(r, "kind")?,
                description: get(r, "description")?,
                input_schema: get(r, "input_schema")?,
                annotations: get(r, "annotations")?,
                upstream: get(r, "upstream")?,
            })
        })
        .collect()
}

/// What `propose` answered, without its token.
#[derive(Clone, Debug)]
pub struct Proposed {
    pub action_id: Uuid,
    pub status: String,
    pub summary: String,
    pub expires_at: DateTime<Utc>,
}

/// `keyturn.propose` (or, with `tenant`, `keyturn.propose_for`) as the
/// agent. The token column is never read.
pub async fn propose(
    tx: &Transaction<'_>,
    tenant: Option<&str>,
    tool: &str,
    params: &Value,
    origin: &Value,
) -> Result<Proposed, Error> {
    let sql = match tenant {
        None => "SELECT p.action_id, p.status, p.summary, p.expires_at FROM keyturn.propose($1, $2, $3) AS p",
        Some(_) => "SELECT p.action_id, p.status, p.summary, p.expires_at FROM keyturn.propose_for($4, $1, $2, $3) AS p",
    };
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&tool, Type::TEXT),
        (params, Type::JSONB),
        (origin, Type::JSONB),
        (&tenant, Type::TEXT),
    ];
    let n = if tenant.is_some() { 4 } else { 3 };
    let row = bounded(tx.query_typed_one(sql, &params[..n])).await?;
    Ok(Proposed {
        action_id: get(&row, "action_id")?,
        status: get(&row, "status")?,
        summary: get(&row, "summary")?,
        expires_at: get(&row, "expires_at")?,
    })
}

/// What `keyturn.fence` (or `keyturn.read`) gave.
#[derive(Clone, Debug)]
pub struct Fenced {
    pub guard: String,
    pub reference: String,
    pub evidence_id: Option<Uuid>,
}

fn fenced(row: &tokio_postgres::Row) -> Result<Fenced, Error> {
    Ok(Fenced {
        guard: get(row, "guard")?,
        reference: get(row, "reference")?,
        evidence_id: get(row, "evidence_id")?,
    })
}

/// `keyturn.read`: an sql read tool, run and fenced by the database.
pub async fn read(tx: &Transaction<'_>, tool: &str, args: &Value) -> Result<Fenced, Error> {
    let row = bounded(tx.query_typed_one(
        "SELECT f.guard, f.reference, f.evidence_id FROM keyturn.read($1, $2) AS f",
        &[(&tool, Type::TEXT), (args, Type::JSONB)],
    ))
    .await?;
    fenced(&row)
}

/// `keyturn.fence`: an upstream read's data under its projection.
pub async fn fence(tx: &Transaction<'_>, projection: &str, data: &Value) -> Result<Fenced, Error> {
    let row = bounded(tx.query_typed_one(
        "SELECT f.guard, f.reference, f.evidence_id FROM keyturn.fence($1, $2) AS f",
        &[(&projection, Type::TEXT), (data, Type::JSONB)],
    ))
    .await?;
    fenced(&row)
}

/// What `keyturn.upstream_read` allows: the upstream, the tool's name
/// there, the projection.
#[derive(Clone, Debug)]
pub struct UpstreamRead {
    pub upstream: String,
    pub tool: String,
    pub projection: String,
}

/// `keyturn.upstream_read`: whether this upstream read may run.
pub async fn upstream_read(
    tx: &Transaction<'_>,
    tool: &str,
    args: &Value,
) -> Result<UpstreamRead, Error> {
    let row = bounded(tx.query_typed_one(
        "SELECT u.upstream, u.upstream_tool, u.projection FROM keyturn.upstream_read($1, $2) AS u",
        &[(&tool, Type::TEXT), (args, Type::JSONB)],
    ))
    .await?;
    Ok(UpstreamRead {
        upstream: get(&row, "upstream")?,
        tool: get(&row, "upstream_tool")?,
        projection: get(&row, "projection")?,
    })
}

/// `keyturn.mcp_action_status`: the caller's own action, or `None`.
pub async fn action_status(
    tx: &Transaction<'_>,
    action_id: Uuid,
) -> Result<Option<(String, Option<Value>)>, Error> {
    let row = bounded(tx.query_typed_opt(
        "SELECT s.status, s.result FROM keyturn.mcp_action_status($1) AS s",
        &[(&action_id, Type::UUID)],
    ))
    .await?;
    row.map(|r| Ok((get(&r, "status")?, get(&r, "result")?)))
        .transpose()
}

/// An action of the calling agent's, as `/mcp` answers for it after the
/// call that proposed it: a retry of that call, or its task.
#[derive(Clone, Debug)]
pub struct OwnAction {
    pub proposed: Proposed,
    /// Its result, once final.
    pub result: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Whether the caller is in the agent session that proposed it, as the
    /// database reads the session: the only one its card link is shown to.
    pub same_session: bool,
}

/// `keyturn.mcp_resume`: the action a write call proposed, when `tool` and
/// `params` are that call's (a client's retry after `input_required`);
/// `None` for anything else.
pub async fn resume(
    tx: &Transaction<'_>,
    action_id: Uuid,
    tool: &str,
    params: &Value,
) -> Result<Option<OwnAction>, Error> {
    let row = bounded(tx.query_typed_opt(
        "SELECT s.* FROM keyturn.mcp_resume($1, $2, $3) AS s",
        &[
            (&action_id, Type::UUID),
            (&tool, Type::TEXT),
            (params, Type::JSONB),
        ],
    ))
    .await?;
    row.map(|r| own_action(action_id, &r)).transpose()
}

/// `keyturn.mcp_task`: the calling agent's action `action_id`, or `None`.
pub async fn task(tx: &Transaction<'_>, action_id: Uuid) -> Result<Option<OwnAction>, Error> {
    let row = bounded(tx.query_typed_opt(
        "SELECT s.* FROM keyturn.mcp_task($1) AS s",
        &[(&action_id, Type::UUID)],
    ))
    .await?;
    row.map(|r| own_action(action_id, &r)).transpose()
}

fn own_action(action_id: Uuid, r: &tokio_postgres::Row) -> Result<OwnAction, Error> {
    Ok(OwnAction {
        proposed: Proposed {
            action_id,
            status: get(r, "status")?,
            summary: get(r, "summary")?,
            expires_at: get(r, "expires_at")?,
        },
        result: get(r, "result")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
        same_session: get(r, "same_session")?,
    })
}

/// `keyturn.link_code` on the dispatcher's connection, asserting the
/// person's identity (`claims`) for this transaction only: the one-time
/// code of the card link an elicitation shows the person.
pub async fn link_code(
    client: &mut Client,
    claims: &str,
    action_id: Uuid,
) -> Result<String, Error> {
    let tx = super::transaction(client).await?;
    let row = bounded(tx.query_typed_one(
        "SELECT pg_catalog.set_config('request.jwt.claims', $1, true) IS NOT NULL AS set, \
                keyturn.link_code(ARRAY[$2]::uuid[]) AS code",
        &[(&claims, Type::TEXT), (&action_id, Type::UUID)],
    ))
    .await?;
    let code: String = get(&row, "code")?;
    super::commit(tx).await?;
    Ok(code)
}

/// `keyturn.register_discovered_tool`: the tool's current version.
pub async fn register_discovered_tool(
    client: &Client,
    upstream: &str,
    definition: &Value,
    trust_annotations: bool,
) -> Result<i32, Error> {
    let row = query_one(
        client,
        "SELECT keyturn.register_discovered_tool($1, $2, $3) AS version",
        &[
            (&upstream, Type::TEXT),
            (definition, Type::JSONB),
            (&trust_annotations, Type::BOOL),
        ],
    )
    .await?;
    get(&row, "version")
}

/// `keyturn.check_upstream_tool(_for)`: whether the live `definition` is
/// the approved one; `false`: the action is now invalidated, send nothing.
pub async fn check_upstream_tool(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
    definition: &Value,
) -> Result<bool, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (definition, Type::JSONB),
        (&tenant, Type::TEXT),
    ];
    let row = query_one_for(
        client,
        tenant,
        "SELECT keyturn.check_upstream_tool($1, $2, $3) AS same",
        "SELECT keyturn.check_upstream_tool_for($4, $1, $2, $3) AS same",
        &params,
    )
    .await?;
    get(&row, "same")
}

/// What the database says of one role of `KEYTURN_MCP_ROLES` and the MCP
/// login, for the start-up checks.
#[derive(Clone, Debug)]
pub struct McpRoleCheck {
    pub name: String,
    pub present: bool,
    /// A member of keyturn_agent.
    pub agent: bool,
    /// A member of a role that approves, operates, administers or dispatches.
    pub other_side: Option<String>,
    /// The MCP login is a member of it.
    pub can_set: bool,
    pub login: String,
    /// The MCP login inherits its roles' privileges.
    pub login_inherits: bool,
}

/// [`McpRoleCheck`] of each of `roles`, in order.
pub async fn role_checks(client: &Client, roles: &[String]) -> Result<Vec<McpRoleCheck>, Error> {
    let rows = bounded(client.query_typed(
        "SELECT w.name, r.oid IS NOT NULL AS present, \
                coalesce(pg_catalog.pg_has_role(r.oid, 'keyturn_agent', 'MEMBER'), false) AS agent, \
                (SELECT o.g FROM unnest(ARRAY['keyturn_approver', 'keyturn_operator', 'keyturn_admin', \
                                              'keyturn_dispatcher']) AS o (g) \
                  WHERE r.oid IS NOT NULL AND pg_catalog.pg_has_role(r.oid, o.g, 'MEMBER') LIMIT 1) AS other_side, \
                coalesce(pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER'), false) AS can_set, \
                session_user::text AS login, \
                (SELECT l.rolinherit FROM pg_catalog.pg_roles l WHERE l.rolname = session_user) AS login_inherits \
           FROM unnest($1::text[]) WITH ORDINALITY AS w(name, ord) \
           LEFT JOIN pg_catalog.pg_roles r ON r.rolname = w.name ORDER BY w.ord",
        &[(&roles, Type::TEXT_ARRAY)],
    ))
    .await?;
    rows.iter()
        .map(|row| {
            Ok(McpRoleCheck {
                name: get(row, "name")?,
                present: get(row, "present")?,
                agent: get(row, "agent")?,
                other_side: get(row, "other_side")?,
                can_set: get(row, "can_set")?,
                login: get(row, "login")?,
                login_inherits: get(row, "login_inherits")?,
            })
        })
        .collect()
}

/// The login a connection runs as.
pub async fn login(client: &Client) -> Result<String, Error> {
    let row = query_one(client, "SELECT session_user::text AS login", &[]).await?;
    get(&row, "login")
}
