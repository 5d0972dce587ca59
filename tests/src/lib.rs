//! Shared fixtures for keyturn's integration tests.
//!
//! The tests run against the private cluster that `tests/run-all` starts (see
//! `tests/harness.sh`), reached through `KT_PGPORT`. Each test makes its own
//! tenant and tool names, so tests run in parallel without seeing each other.
//! Login roles come from `tests/fixtures/crm.sql`: app_agent (keyturn_agent),
//! app_human (keyturn_approver), app_admin, app_dispatcher, app_operator.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};
use tokio_postgres::{Client, NoTls, Row};

pub use tokio_postgres::error::SqlState;

/// The private cluster's port; tests refuse to guess one.
pub fn port() -> u16 {
    std::env::var("KT_PGPORT")
        .expect("KT_PGPORT is not set: run the integration tests through tests/run-all")
        .parse()
        .expect("KT_PGPORT must be a port number")
}

/// A connection as `role` (trust authentication on the private cluster).
pub async fn connect(role: &str) -> Client {
    let url = format!("host=127.0.0.1 port={} user={role} dbname=keyturn", port());
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect as {role}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A name no other test uses: lowercase ASCII, valid as tool and tenant name.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// Sets the call identity on a connection with the GUCs (session-wide, as a
/// pooled app would per request with SET LOCAL).
pub async fn set_identity(client: &Client, tenant: &str, principal: &str, session: &str) {
    client
        .execute(
            "SELECT set_config('keyturn.tenant', $1, false), set_config('keyturn.principal', $2, false), \
             set_config('keyturn.session', $3, false)",
            &[&tenant, &principal, &session],
        )
        .await
        .expect("set identity");
}

/// The SQLSTATE of a failed statement, for assertions.
pub fn sqlstate<T: std::fmt::Debug>(result: Result<T, tokio_postgres::Error>) -> String {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .code()
            .map(|c| c.code().to_string())
            .unwrap_or_else(|| panic!("not a database error: {e}")),
    }
}

/// One tenant with an agent connection and a human connection acting for the
/// same principal in the same session (a `self` approval), plus an admin.
pub struct World {
    pub tenant: String,
    pub principal: String,
    pub session: String,
    pub agent: Client,
    pub human: Client,
    pub admin: Client,
    pub superuser: Client,
}

impl World {
    /// A tenant with `principal` as a member of role `role`.
    pub async fn new(role: &str) -> World {
        let tenant = unique("tenant");
        let principal = unique("user");
        let session = unique("session");
        let admin = connect("app_admin").await;
        admin
            .execute("SELECT keyturn.add_member($1, $2, $3)", &[&tenant, &principal, &role])
            .await
            .expect("add_member");
        let agent = connect("app_agent").await;
        let human = connect("app_human").await;
        set_identity(&agent, &tenant, &principal, &session).await;
        set_identity(&human, &tenant, &principal, &session).await;
        let superuser = connect("postgres").await;
        World { tenant, principal, session, agent, human, admin, superuser }
    }

    /// Registers a tool (unique name) and grants it to the world's principal.
    pub async fn tool(&self, prefix: &str, spec: Value) -> String {
        let name = unique(prefix);
        self.admin
            .execute("SELECT keyturn.register_tool($1, $2)", &[&name, &spec])
            .await
            .unwrap_or_else(|e| panic!("register_tool {name}: {e}"));
        self.grant(&self.principal, &name).await;
        name
    }

    pub async fn grant(&self, principal: &str, tool: &str) {
        self.admin
            .execute("SELECT keyturn.grant_tool($1, $2, $3)", &[&self.tenant, &principal, &tool])
            .await
            .expect("grant_tool");
    }

    /// An sql tool over crm.deal that may set stage (and amount), filtering by id or owner.
    pub async fn deal_tool(&self, extra: Value) -> String {
        let mut spec = json!({
            "executor": "sql",
            "summary": "Set stage {set.stage} on {count} deal(s)",
            "effect": "reversible",
            "sql": {"table": "crm.deal", "key": "id", "version": "xmin",
                    "set": ["stage", "amount"], "where": ["id", "owner"]}
        });
        merge(&mut spec, extra);
        self.tool("deal_stage", spec).await
    }

    /// An external webhook tool.
    pub async fn webhook_tool(&self, extra: Value) -> String {
        let mut spec = json!({
            "executor": "external",
            "provider": "webhook",
            "summary": "Notify {channel}: {text}",
            "params_schema": {
                "type": "object",
                "properties": {"channel": {"type": "string"}, "text": {"type": "string", "maxLength": 500}},
                "required": ["channel", "text"]
            }
        });
        merge(&mut spec, extra);
        self.tool("notify", spec).await
    }

    /// Inserts deals for this tenant (as superuser) and returns their ids.
    pub async fn deals(&self, owner: &str, n: i64) -> Vec<i64> {
        let base: i64 = self
            .superuser
            .query_one("SELECT coalesce(max(id), 0) + 1 FROM crm.deal", &[])
            .await
            .expect("next deal id")
            .get(0);
        let mut ids = Vec::new();
        for i in 0..n {
            let id = base + i + (std::process::id() as i64 % 1000) * 1_000_000;
            self.superuser
                .execute(
                    "INSERT INTO crm.deal (id, tenant, owner, name) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[&id, &self.tenant, &owner, &format!("deal {id}")],
                )
                .await
                .expect("insert deal");
            ids.push(id);
        }
        ids
    }

    pub async fn propose(&self, tool: &str, params: Value) -> Result<Proposal, tokio_postgres::Error> {
        propose_on(&self.agent, tool, params, json!({})).await
    }

    pub async fn approve(&self, p: &Proposal) -> Result<(String, Option<Value>), tokio_postgres::Error> {
        approve_on(&self.human, p.id, &p.token, None).await
    }

    /// The action's current status, read as superuser.
    pub async fn status(&self, id: uuid::Uuid) -> String {
        self.superuser
            .query_one("SELECT status FROM keyturn.action WHERE id = $1", &[&id])
            .await
            .expect("status")
            .get(0)
    }

    pub async fn stage_of(&self, deal: i64) -> String {
        self.superuser
            .query_one("SELECT stage FROM crm.deal WHERE id = $1", &[&deal])
            .await
            .expect("stage")
            .get(0)
    }
}

fn merge(base: &mut Value, extra: Value) {
    if let (Value::Object(b), Value::Object(e)) = (base, extra) {
        for (k, v) in e {
            if v.is_null() {
                b.remove(&k);
            } else {
                b.insert(k, v);
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Proposal {
    pub id: uuid::Uuid,
    pub token: String,
    pub summary: String,
    pub params_hash: String,
}

pub async fn propose_on(
    client: &Client,
    tool: &str,
    params: Value,
    origin: Value,
) -> Result<Proposal, tokio_postgres::Error> {
    let row: Row = client
        .query_one(
            "SELECT action_id, token, summary, params_hash FROM keyturn.propose($1, $2, $3)",
            &[&tool, &params, &origin],
        )
        .await?;
    Ok(Proposal { id: row.get(0), token: row.get(1), summary: row.get(2), params_hash: row.get(3) })
}

pub async fn approve_on(
    client: &Client,
    id: uuid::Uuid,
    token: &str,
    params: Option<Value>,
) -> Result<(String, Option<Value>), tokio_postgres::Error> {
    let row = client
        .query_one("SELECT status, result FROM keyturn.approve($1, $2, $3)", &[&id, &token, &params])
        .await?;
    Ok((row.get(0), row.get(1)))
}
