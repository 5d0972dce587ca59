//! A tenant to test in ([`World`]): its connections, tools, grants and
//! roles, and the calls the tests make through it (propose, approve,
//! delegate, record a request, stage a file).

use crate::conn::{connect, message, unique, Conn, Identity, Sql};
use serde_json::{json, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, Row};

/// One tenant with an agent connection and a human connection acting for the
/// same principal in the same session (a `self` approval), plus an admin.
pub struct World {
    pub tenant: String,
    pub principal: String,
    pub session: String,
    pub agent: Conn,
    pub human: Conn,
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
            .execute(
                "SELECT keyturn.add_member($1, $2, $3)",
                &[&tenant, &principal, &role],
            )
            .await
            .expect("add_member");
        let agent = Conn::connect("app_agent", Identity::gucs(&tenant, &principal, &session)).await;
        let human = Conn::connect("app_human", Identity::gucs(&tenant, &principal, &session)).await;
        let superuser = connect("postgres").await;
        World {
            tenant,
            principal,
            session,
            agent,
            human,
            admin,
            superuser,
        }
    }

    /// The identity of the world's principal in the world's session.
    pub fn identity(&self) -> Identity {
        Identity::gucs(&self.tenant, &self.principal, &self.session)
    }

    /// Registers a tool (unique name) and grants it to the world's principal.
    pub async fn tool(&self, prefix: &str, spec: Value) -> String {
        let name = unique(prefix);
        self.admin
            .execute("SELECT keyturn.register_tool($1, $2)", &[&name, &spec])
            .await
            .unwrap_or_else(|e| panic!("register_tool {name}: {}", message::<u64>(Err(e))));
        self.grant(&self.principal, &name).await;
        name
    }

    pub async fn grant(&self, principal: &str, tool: &str) {
        self.admin
            .execute(
                "SELECT keyturn.grant_tool($1, $2, $3)",
                &[&self.tenant, &principal, &tool],
            )
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
    /// Ids are random (tests run in parallel and leave rows behind), and an
    /// id collision fails loudly instead of handing a test another tenant's row.
    pub async fn deals(&self, owner: &str, n: i64) -> Vec<i64> {
        let mut ids = Vec::new();
        for _ in 0..n {
            let id = random_id();
            self.superuser
                .execute(
                    "INSERT INTO crm.deal (id, tenant, owner, name) VALUES ($1, $2, $3, $4)",
                    &[&id, &self.tenant, &owner, &format!("deal {id}")],
                )
                .await
                .expect("insert deal");
            ids.push(id);
        }
        ids
    }

    /// Inserts a contact for this tenant (as superuser) and returns its id.
    pub async fn contact(&self, email: &str) -> i64 {
        let id = random_id();
        self.superuser
            .execute(
                "INSERT INTO crm.contact (id, tenant, email) VALUES ($1, $2, $3)",
                &[&id, &self.tenant, &email],
            )
            .await
            .expect("insert contact");
        id
    }

    /// An sql tool over crm.contact that may set email, filtering by id.
    pub async fn contact_tool(&self) -> String {
        self.tool(
            "contact_email",
            json!({"executor": "sql", "summary": "Set email on {count} contact(s)",
                   "sql": {"table": "crm.contact", "key": "id", "set": ["email"], "where": ["id"]}}),
        )
        .await
    }

    /// A second principal of this tenant with role `role`, and a connection as
    /// login role `login` asserting its identity (session `session`).
    pub async fn other(&self, role: &str, login: &str, session: &str) -> (String, Conn) {
        let principal = unique("user");
        self.admin
            .execute(
                "SELECT keyturn.add_member($1, $2, $3)",
                &[&self.tenant, &principal, &role],
            )
            .await
            .expect("add_member");
        let conn = Conn::connect(login, Identity::gucs(&self.tenant, &principal, session)).await;
        (principal, conn)
    }

    /// Business writes recorded for a deal by the crm.deal trigger.
    pub async fn writes(&self, deal: i64) -> i64 {
        count(
            &self.superuser,
            "SELECT count(*) FROM crm.deal_writes WHERE deal_id = $1",
            &[&deal],
        )
        .await
    }

    /// keyturn.usage rows for an action.
    pub async fn usage_rows(&self, id: uuid::Uuid) -> i64 {
        count(
            &self.superuser,
            "SELECT count(*) FROM keyturn.usage WHERE action_id = $1",
            &[&id],
        )
        .await
    }

    /// keyturn.event rows for an action.
    pub async fn event_rows(&self, id: uuid::Uuid) -> i64 {
        count(
            &self.superuser,
            "SELECT count(*) FROM keyturn.event WHERE action_id = $1",
            &[&id],
        )
        .await
    }

    pub async fn propose(&self, tool: &str, params: Value) -> Result<Proposal, Error> {
        propose_on(&self.agent, tool, params, json!({})).await
    }

    pub async fn approve(&self, p: &Proposal) -> Result<(String, Option<Value>), Error> {
        approve_on(&self.human, p.id, &p.token, None).await
    }

    /// How many actions this tenant has, read as superuser.
    pub async fn actions(&self) -> i64 {
        count(
            &self.superuser,
            "SELECT count(*) FROM keyturn.action WHERE tenant = $1",
            &[&self.tenant],
        )
        .await
    }

    /// The action's current status, read as superuser.
    pub async fn status(&self, id: uuid::Uuid) -> String {
        self.superuser
            .query_one(
                "SELECT status::text FROM keyturn.action WHERE id = $1",
                &[&id],
            )
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
    client: &impl Sql,
    tool: &str,
    params: Value,
    origin: Value,
) -> Result<Proposal, Error> {
    let row: Row = client
        .query_one(
            "SELECT action_id, token, summary, params_hash FROM keyturn.propose($1, $2, $3)",
            &[&tool, &params, &origin],
        )
        .await?;
    Ok(Proposal {
        id: row.get(0),
        token: row.get(1),
        summary: row.get(2),
        params_hash: row.get(3),
    })
}

pub async fn approve_on(
    client: &impl Sql,
    id: uuid::Uuid,
    token: &str,
    params: Option<Value>,
) -> Result<(String, Option<Value>), Error> {
    let row = client
        .query_one(
            "SELECT status, result FROM keyturn.approve($1, $2, $3)",
            &[&id, &token, &params],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// A random positive id for fixture rows.
pub fn random_id() -> i64 {
    (uuid::Uuid::new_v4().as_u128() as i64 & 0x0000_7fff_ffff_ffff).max(1)
}

/// The single bigint of a `SELECT count(*) ...`.
pub async fn count(client: &impl Sql, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
    client
        .query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Everything propose returns, the approval columns included: `status` is
/// `pending`, or the outcome of the approval a standing approval or a task
/// request gave in the same call; `token` is NULL when a task request's
/// replay returns the action it already admitted.
#[derive(Debug, Clone)]
pub struct Proposed {
    pub id: uuid::Uuid,
    pub token: Option<String>,
    pub summary: String,
    pub params_hash: String,
    pub status: String,
    pub delegation_id: Option<uuid::Uuid>,
}

impl Proposed {
    /// As a [`Proposal`], for approve_on and the like; panics without a token.
    pub fn proposal(&self) -> Proposal {
        Proposal {
            id: self.id,
            token: self.token.clone().expect("a proposal with a token"),
            summary: self.summary.clone(),
            params_hash: self.params_hash.clone(),
        }
    }
}

pub async fn propose_full(
    client: &impl Sql,
    tool: &str,
    params: Value,
    origin: Value,
) -> Result<Proposed, Error> {
    let row: Row = client
        .query_one(
            "SELECT action_id, token, summary, params_hash, status, delegation_id \
               FROM keyturn.propose($1, $2, $3)",
            &[&tool, &params, &origin],
        )
        .await?;
    Ok(Proposed {
        id: row.get(0),
        token: row.get(1),
        summary: row.get(2),
        params_hash: row.get(3),
        status: row.get(4),
        delegation_id: row.get(5),
    })
}

/// `keyturn.delegate` on a person's connection.
pub async fn delegate_on(
    client: &impl Sql,
    tool: &str,
    scope: Value,
    max_uses: i32,
    valid_for: &str,
) -> Result<uuid::Uuid, Error> {
    client
        .query_one(
            "SELECT keyturn.delegate($1, $2, $3, $4::text::interval)",
            &[&tool, &scope, &max_uses, &valid_for],
        )
        .await
        .map(|r| r.get(0))
}

/// `keyturn.record_request` for the message `text` (hashed by the server, as
/// the human side would hash the text it showed).
pub async fn record_request_on(
    client: &impl Sql,
    conversation: &str,
    turn: &str,
    message: &str,
    text: &str,
) -> Result<bool, Error> {
    client
        .query_one(
            "SELECT keyturn.record_request($1, $2, $3, encode(sha256(convert_to($4, 'UTF8')), 'hex'))",
            &[&conversation, &turn, &message, &text],
        )
        .await
        .map(|r| r.get(0))
}

/// The origin a task proposal cites: the person's message of a turn, and an
/// assistant reply carrying the call.
pub fn task_origin(conversation: &str, turn: &str, message: &str) -> Value {
    json!({"conversation_id": conversation, "turn_id": turn, "message_id": message,
           "assistant_message_id": format!("{message}-reply")})
}

/// A file staged with `keyturn.stage_file`, with what its attachment
/// metadata must repeat.
#[derive(Debug, Clone)]
pub struct StagedFile {
    pub id: uuid::Uuid,
    pub sha256: String,
    pub size: i64,
    pub filename: String,
    pub content_type: String,
}

impl StagedFile {
    /// The params element that names this file, exactly as staged.
    pub fn attachment(&self) -> Value {
        json!({"file_id": self.id, "sha256": self.sha256, "filename": self.filename,
               "content_type": self.content_type, "size": self.size})
    }
}

pub async fn stage_file_on(
    client: &impl Sql,
    content: &[u8],
    filename: &str,
    content_type: &str,
) -> Result<StagedFile, Error> {
    let row = client
        .query_one(
            "SELECT file_id, sha256, size FROM keyturn.stage_file($1, $2, $3)",
            &[&content, &filename, &content_type],
        )
        .await?;
    Ok(StagedFile {
        id: row.get(0),
        sha256: row.get(1),
        size: row.get(2),
        filename: filename.into(),
        content_type: content_type.into(),
    })
}

/// A LOGIN role of its own in keyturn_approver, for tests that must tell
/// which person-side role a write ran as.
pub async fn approver_login(superuser: &Client) -> String {
    let role = unique("approver_login");
    superuser
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN IN ROLE keyturn_approver"
        ))
        .await
        .expect("create approver login");
    role
}

impl World {
    /// `keyturn.grant_tool` with all six arguments, as the platform admin.
    pub async fn grant_with(
        &self,
        principal: &str,
        tool: &str,
        scope: Option<Value>,
        valid_until: Option<std::time::SystemTime>,
        max_uses: Option<i32>,
    ) -> Result<bool, Error> {
        self.admin
            .query_one(
                "SELECT keyturn.grant_tool($1, $2, $3, $4, $5, $6)",
                &[
                    &self.tenant,
                    &principal,
                    &tool,
                    &scope,
                    &valid_until,
                    &max_uses,
                ],
            )
            .await
            .map(|r| r.get(0))
    }

    /// The principal's authorization epoch, read as superuser.
    pub async fn epoch(&self, principal: &str) -> i64 {
        self.superuser
            .query_opt(
                "SELECT epoch FROM keyturn.auth_epoch WHERE tenant = $1 AND principal = $2",
                &[&self.tenant, &principal],
            )
            .await
            .expect("epoch")
            .map_or(0, |r| r.get(0))
    }

    /// A standing approval of the world's principal, made on its human connection.
    pub async fn delegate(
        &self,
        tool: &str,
        scope: Value,
        max_uses: i32,
        valid_for: &str,
    ) -> Result<uuid::Uuid, Error> {
        delegate_on(&self.human, tool, scope, max_uses, valid_for).await
    }

    /// A table of this tenant's rows, in a schema of its own, whose row-level
    /// security shows `hidden` rows to app_agent only: the agent resolves
    /// them, no person-side role can read or write them. A trigger notes in
    /// `written_by` the role each write ran as. Its policies read the tenant
    /// setting a [`Conn`] asserts, not keyturn's functions, so that nothing
    /// it leaves behind stops `DROP EXTENSION`. Only `writers` may UPDATE it
    /// (never a group: some tests leave roles that are agents and approvers
    /// at once, which register_tool rightly counts as agents that can write).
    /// Returns `schema.table`.
    pub async fn role_table(&self, writers: &[&str]) -> String {
        let schema = unique("rolet");
        let table = format!("{schema}.item");
        self.superuser
            .batch_execute(&format!(
                "CREATE SCHEMA {schema};
                 GRANT USAGE ON SCHEMA {schema} TO keyturn_agent, keyturn_approver;
                 CREATE TABLE {table} (id bigint PRIMARY KEY, tenant text NOT NULL,
                     stage text NOT NULL DEFAULT 'lead', hidden boolean NOT NULL DEFAULT false,
                     written_by text);
                 ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
                 ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
                 CREATE POLICY item_read ON {table} FOR SELECT
                     USING (tenant = current_setting('keyturn.tenant', true)
                            AND (NOT hidden OR current_user = 'app_agent'));
                 CREATE POLICY item_write ON {table} FOR UPDATE
                     USING (tenant = current_setting('keyturn.tenant', true) AND NOT hidden)
                     WITH CHECK (tenant = current_setting('keyturn.tenant', true));
                 CREATE FUNCTION {schema}.note_writer() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN NEW.written_by := current_user; RETURN NEW; END $$;
                 CREATE TRIGGER item_writer BEFORE UPDATE ON {table}
                     FOR EACH ROW EXECUTE FUNCTION {schema}.note_writer();
                 GRANT SELECT ON {table} TO keyturn_agent;
                 GRANT SELECT, UPDATE ON {table} TO {writers};",
                writers = writers.join(", ")
            ))
            .await
            .expect("create role table");
        table
    }

    /// A row of a [`World::role_table`] for this tenant; returns its id.
    pub async fn role_table_row(&self, table: &str, hidden: bool) -> i64 {
        let id = random_id();
        self.superuser
            .execute(
                &format!("INSERT INTO {table} (id, tenant, hidden) VALUES ($1, $2, $3)"),
                &[&id, &self.tenant, &hidden],
            )
            .await
            .expect("insert role table row");
        id
    }

    /// (stage, written_by) of a [`World::role_table`] row, read as superuser.
    pub async fn role_table_state(&self, table: &str, id: i64) -> (String, Option<String>) {
        let r = self
            .superuser
            .query_one(
                &format!("SELECT stage, written_by FROM {table} WHERE id = $1"),
                &[&id],
            )
            .await
            .expect("role table row");
        (r.get(0), r.get(1))
    }

    /// An sql tool over a [`World::role_table`] that sets stage by id.
    pub async fn role_table_tool(&self, table: &str, extra: Value) -> String {
        let mut spec = json!({
            "executor": "sql",
            "summary": "Set stage {set.stage} on {count} item(s)",
            "effect": "reversible",
            "sql": {"table": table, "key": "id", "set": ["stage"], "where": ["id"]}
        });
        merge(&mut spec, extra);
        self.tool("item_stage", spec).await
    }
}
