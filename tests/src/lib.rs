//! Shared fixtures for keyturn's integration tests.
//!
//! The tests run against the private cluster that `tests/run-all` starts (see
//! `tests/harness.sh`), reached through `KT_PGPORT`. Each test makes its own
//! tenant and tool names, so tests run in parallel without seeing each other.
//! Login roles come from `tests/fixtures/crm.sql`: app_agent (keyturn_agent),
//! app_human (keyturn_approver), app_admin, app_dispatcher, app_operator.
//!
//! Identity is asserted the way a pooled application must: inside each
//! transaction, with `set_config(…, true)`, never for the whole session (a
//! session value travels with a pooled connection to its next client). A
//! [`Conn`] does that for every statement it runs; the admin, superuser and
//! dispatcher connections carry no identity and are plain `Client`s.
//!
//! [`tally`] and [`server_log`] are what the load and fuzz binaries
//! (`src/bin/keyturn-load`, `src/bin/keyturn-fuzz`) share: counts of calls by
//! outcome, and the server log's word on crashes.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, NoTls, Row, ToStatement};

pub use tokio_postgres::error::SqlState;

pub mod server_log;
pub mod tally;

/// The private cluster's port; tests refuse to guess one.
pub fn port() -> u16 {
    std::env::var("KT_PGPORT")
        .expect("KT_PGPORT is not set: run the integration tests through tests/run-all")
        .parse()
        .expect("KT_PGPORT must be a port number")
}

/// The database under test: `keyturn`, or `KT_DBNAME` (the upgrade layer runs
/// this suite again on a database upgraded from the previous release).
pub fn dbname() -> String {
    std::env::var("KT_DBNAME").unwrap_or_else(|_| "keyturn".into())
}

/// A connection as `role` (trust authentication on the private cluster).
pub async fn connect(role: &str) -> Client {
    let url = format!(
        "host=127.0.0.1 port={} user={role} dbname={}",
        port(),
        dbname()
    );
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

/// Who a [`Conn`] says its caller is. keyturn reads `request.jwt.claims` if
/// it is set to anything but '', else the `keyturn.*` GUCs; a Conn sets the
/// ones held here at the start of each transaction it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// keyturn.tenant, keyturn.principal, keyturn.session.
    pub gucs: Option<(String, String, String)>,
    /// request.jwt.claims, exactly this text.
    pub claims: Option<String>,
}

impl Identity {
    /// Nothing asserted.
    pub fn none() -> Identity {
        Identity::default()
    }

    pub fn gucs(tenant: &str, principal: &str, session: &str) -> Identity {
        Identity {
            gucs: Some((tenant.into(), principal.into(), session.into())),
            claims: None,
        }
    }

    pub fn claims(claims: &str) -> Identity {
        Identity::none().with_claims(claims)
    }

    /// This identity, and `request.jwt.claims` as well.
    pub fn with_claims(mut self, claims: &str) -> Identity {
        self.claims = Some(claims.into());
        self
    }
}

struct Link {
    client: Client,
    identity: Identity,
    /// A transaction is still open on the connection: a [`Tx`] was dropped,
    /// or a call cancelled, before it ended. The next call rolls it back.
    open: bool,
}

/// A connection that asserts an [`Identity`] transaction-locally. Each of
/// `query`, `query_one`, `query_opt`, `execute` and `batch_execute` runs its
/// statement in a transaction of its own: `BEGIN`, the identity with
/// `set_config(…, true)`, the statement, then `COMMIT`, or `ROLLBACK` when
/// the statement failed, whose error is returned unchanged. Calls on one
/// Conn are serialized, so tasks sharing it never interleave transactions.
/// It deliberately does not deref to `Client`: a statement on the bare
/// client would run without identity.
pub struct Conn {
    link: Arc<Mutex<Link>>,
}

impl Conn {
    pub fn new(client: Client, identity: Identity) -> Conn {
        Conn {
            link: Arc::new(Mutex::new(Link {
                client,
                identity,
                open: false,
            })),
        }
    }

    /// A connection as `login` (see [`connect`]) asserting `identity`.
    pub async fn connect(login: &str, identity: Identity) -> Conn {
        Conn::new(connect(login).await, identity)
    }

    /// What the transactions begun from now on assert. It waits for a
    /// transaction in progress, which keeps the identity it began with.
    pub async fn set_identity(&self, identity: Identity) {
        self.link.lock().await.identity = identity;
    }

    /// A transaction with the identity already set, for several statements
    /// in one transaction.
    pub async fn transaction(&self) -> Result<Tx, Error> {
        self.transaction_with("BEGIN").await
    }

    /// As [`Conn::transaction`], begun with `begin` (such as
    /// `BEGIN ISOLATION LEVEL REPEATABLE READ`).
    pub async fn transaction_with(&self, begin: &str) -> Result<Tx, Error> {
        Ok(Tx {
            link: Some(open(&self.link, begin).await?),
        })
    }

    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.query(statement, params).await;
        close(link, r).await
    }

    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.query_one(statement, params).await;
        close(link, r).await
    }

    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.query_opt(statement, params).await;
        close(link, r).await
    }

    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.execute(statement, params).await;
        close(link, r).await
    }

    pub async fn batch_execute(&self, query: &str) -> Result<(), Error> {
        refuse_transaction_control(query);
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.batch_execute(query).await;
        close(link, r).await
    }
}

/// Takes the connection, ends what a dropped [`Tx`] left open, and begins a
/// transaction asserting the connection's identity.
async fn open(link: &Arc<Mutex<Link>>, begin: &str) -> Result<OwnedMutexGuard<Link>, Error> {
    let mut link = link.clone().lock_owned().await;
    if link.open {
        link.client.batch_execute("ROLLBACK").await?;
        link.open = false;
    }
    link.client.batch_execute(begin).await?;
    link.open = true;
    if let Some((tenant, principal, session)) = &link.identity.gucs {
        link.client
            .execute(
                "SELECT set_config('keyturn.tenant', $1, true), set_config('keyturn.principal', $2, true), \
                 set_config('keyturn.session', $3, true)",
                &[tenant, principal, session],
            )
            .await?;
    }
    if let Some(claims) = &link.identity.claims {
        link.client
            .execute(
                "SELECT set_config('request.jwt.claims', $1, true)",
                &[claims],
            )
            .await?;
    }
    Ok(link)
}

/// Ends a one-statement transaction: its result if it committed, else the
/// statement's own error (a failed ROLLBACK hides nothing).
async fn close<R>(mut link: OwnedMutexGuard<Link>, r: Result<R, Error>) -> Result<R, Error> {
    let ended = link
        .client
        .batch_execute(if r.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .await;
    link.open = false;
    let v = r?;
    ended.map(|()| v)
}

/// A hand-written BEGIN or COMMIT inside a Conn's transaction would end it
/// early, and what follows would run without the identity.
fn refuse_transaction_control(query: &str) {
    let first = query
        .split(|c: char| c.is_whitespace() || c == ';')
        .find(|w| !w.is_empty())
        .unwrap_or("")
        .to_ascii_uppercase();
    assert!(
        !["BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"].contains(&first.as_str()),
        "{query:?}: use Conn::transaction for a transaction of several statements"
    );
}

/// A transaction of a [`Conn`], its identity set locally. Dropped without
/// `commit` or `rollback`, it is rolled back, as a tokio_postgres
/// transaction is; the Conn stays taken until then.
pub struct Tx {
    link: Option<OwnedMutexGuard<Link>>,
}

impl Tx {
    fn client(&self) -> &Client {
        &self
            .link
            .as_ref()
            .expect("the transaction is live until it ends")
            .client
    }

    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().query(statement, params).await
    }

    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().query_one(statement, params).await
    }

    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().query_opt(statement, params).await
    }

    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().execute(statement, params).await
    }

    pub async fn batch_execute(&self, query: &str) -> Result<(), Error> {
        refuse_transaction_control(query);
        self.client().batch_execute(query).await
    }

    pub async fn commit(mut self) -> Result<(), Error> {
        self.end("COMMIT").await
    }

    pub async fn rollback(mut self) -> Result<(), Error> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, how: &str) -> Result<(), Error> {
        let mut link = self.link.take().expect("a transaction ends once");
        let r = link.client.batch_execute(how).await;
        link.open = false;
        r
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // The rollback holds the connection, so the Conn's next call waits
        // for it; without a runtime, that next call rolls back instead.
        if let Some(mut link) = self.link.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if link.client.batch_execute("ROLLBACK").await.is_ok() {
                        link.open = false;
                    }
                });
            }
        }
    }
}

/// What the shared helpers need of a connection, so they take a `Client`
/// (no identity), a [`Conn`] or a [`Tx`] alike.
pub trait Sql: Sync {
    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send;
}

impl Sql for Client {
    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        Client::query(self, sql, params)
    }

    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send {
        Client::query_one(self, sql, params)
    }
}

impl Sql for Conn {
    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        Conn::query(self, sql, params)
    }

    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send {
        Conn::query_one(self, sql, params)
    }
}

impl Sql for Tx {
    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
        Tx::query(self, sql, params)
    }

    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send {
        Tx::query_one(self, sql, params)
    }
}

/// The SQLSTATE of a failed statement, for assertions.
pub fn sqlstate<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
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

/// keyturn.open_action (the work list lease, sweep, end_session and
/// cancel_origin search) holds exactly the actions that are not final, with
/// their current status and times. One snapshot sees both tables as one
/// transaction left them, so this holds at any moment, concurrent tests or not.
pub async fn assert_work_list_in_step(superuser: &Client) {
    let rows = superuser
        .query(
            "SELECT coalesce(a.id, o.action_id)::text, a.status::text, o.status::text \
               FROM (SELECT * FROM keyturn.action WHERE NOT keyturn._is_final(status)) a \
               FULL JOIN keyturn.open_action o ON o.action_id = a.id \
              WHERE a.id IS NULL OR o.action_id IS NULL \
                 OR (a.tenant, a.principal, a.session, a.conversation_id, a.status, a.expires_at, \
                     a.next_attempt_at, a.lease_expires_at, a.dispatched_at) \
                    IS DISTINCT FROM \
                    (o.tenant, o.principal, o.session, o.conversation_id, o.status, o.expires_at, \
                     o.next_attempt_at, o.lease_expires_at, o.dispatched_at)",
            &[],
        )
        .await
        .unwrap();
    let out_of_step: Vec<(String, Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        out_of_step.is_empty(),
        "open_action out of step with action (id, action status, work-list status): {out_of_step:?}"
    );
}

/// The message of a failed statement.
pub fn message<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string()),
    }
}

/// Runs `sql` as the superuser with every trigger off for that statement only
/// (session_replication_role = replica, transaction-local): how an attacker who
/// can write the table would tamper with it. Other sessions keep their guards.
pub async fn tamper(superuser: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> u64 {
    superuser
        .batch_execute("BEGIN; SET LOCAL session_replication_role = replica")
        .await
        .expect("begin tamper");
    let n = superuser
        .execute(sql, params)
        .await
        .unwrap_or_else(|e| panic!("tamper {sql}: {e}"));
    superuser
        .batch_execute("COMMIT")
        .await
        .expect("commit tamper");
    n
}

/// A connection that has run `LISTEN channel`; notifications arrive on the receiver.
pub async fn listen(
    channel: &str,
) -> (
    Client,
    tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
) {
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={}",
        port(),
        dbname()
    );
    let (client, mut connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect listener");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let msg = std::future::poll_fn(|cx| connection.poll_message(cx)).await;
            match msg {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    if tx.send(n).is_err() {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                _ => break,
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .expect("listen");
    (client, rx)
}

/// Serializes the tests that lease or sweep, and the tests whose rows a lease
/// or a sweep would disturb: lease() and sweep() work across tenants, and all
/// integration tests share one process, so a test holding this lock may lease
/// (and hand back) any queued row and expire any pending row past its expiry.
/// Take it before creating the rows a test wants to lease itself: a foreign
/// lease_mine hands a queued row back for a day.
pub static DISPATCH_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One leased job.
#[derive(Debug, Clone)]
pub struct Lease {
    pub action_id: uuid::Uuid,
    pub lease_id: uuid::Uuid,
    pub tenant: String,
    pub tool: String,
    pub provider: Option<String>,
    pub params: Option<Value>,
    pub idempotency_key: String,
    pub attempt: i32,
}

impl Lease {
    /// A row of `lease` or `lease_for`, its columns in their order.
    pub fn from_row(r: &tokio_postgres::Row) -> Lease {
        Lease {
            action_id: r.get(0),
            lease_id: r.get(1),
            tenant: r.get(2),
            tool: r.get(3),
            provider: r.get(4),
            params: r.get(5),
            idempotency_key: r.get(6),
            attempt: r.get(7),
        }
    }
}

/// Leases every due job as `worker` and returns those among `mine`; any other
/// due job (left queued by earlier tests) is handed back for a day, untouched.
pub async fn lease_mine(dispatcher: &Client, mine: &[uuid::Uuid], lease_for: &str) -> Vec<Lease> {
    // The cluster is shared with every other test: lease in batches until ours
    // are found or nothing is due, handing every foreign job back for a day.
    let mut out = Vec::new();
    loop {
        let rows = dispatcher
            .query(
                "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                 FROM keyturn.lease('itest-worker', 1000, $1::text::interval)",
                &[&lease_for],
            )
            .await
            .expect("lease");
        if rows.is_empty() {
            break;
        }
        for r in rows {
            let l = Lease::from_row(&r);
            if mine.contains(&l.action_id) {
                out.push(l);
            } else {
                // A test that does not lease may cancel or invalidate its own
                // job while we hold it; then it is no longer ours to hand back.
                let r = dispatcher
                    .execute(
                        "SELECT keyturn.complete($1, $2, 'retry', '{}', interval '1 day')",
                        &[&l.action_id, &l.lease_id],
                    )
                    .await;
                if let Err(e) = r {
                    assert_eq!(
                        e.code(),
                        Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
                        "hand back a foreign job: {e}"
                    );
                }
            }
        }
        if out.len() == mine.len() {
            break;
        }
    }
    out
}

/// A world with an external (webhook) tool and `n` approved, `queued` actions.
pub async fn queued(n: usize) -> (World, String, Vec<uuid::Uuid>) {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let p = w
            .propose(&t, json!({"channel": "c", "text": format!("m{i}")}))
            .await
            .unwrap();
        assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        ids.push(p.id);
    }
    (w, t, ids)
}

/// `keyturn.begin_dispatch` for a lease.
pub async fn begin(d: &Client, l: &Lease) -> Result<bool, Error> {
    d.query_one(
        "SELECT keyturn.begin_dispatch($1, $2)",
        &[&l.action_id, &l.lease_id],
    )
    .await
    .map(|r| r.get(0))
}

/// `keyturn.complete` for a lease; `retry` is an interval text such as "1 hour".
pub async fn complete(
    d: &Client,
    l: &Lease,
    outcome: &str,
    receipt: Value,
    retry: Option<&str>,
) -> Result<String, Error> {
    d.query_one(
        "SELECT keyturn.complete($1, $2, $3, $4, $5::text::interval)",
        &[&l.action_id, &l.lease_id, &outcome, &receipt, &retry],
    )
    .await
    .map(|r| r.get(0))
}

/// The action's attempt counter, read as superuser.
pub async fn attempts(w: &World, id: uuid::Uuid) -> i32 {
    w.superuser
        .query_one("SELECT attempts FROM keyturn.action WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// How many attempt rows (keyturn.attempt) the action has, read as superuser.
pub async fn attempt_rows(w: &World, id: uuid::Uuid) -> i64 {
    count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.attempt WHERE action_id = $1",
        &[&id],
    )
    .await
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
