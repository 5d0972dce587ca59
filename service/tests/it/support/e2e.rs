//! End-to-end helpers: the real database (the private cluster of
//! `tests/run-all`, reached through `KT_PGPORT`), the real `keyturnd` binary
//! as a child process, and a real axum webhook receiver on loopback that
//! verifies every signature.
//!
//! **Isolation.** Tools are global and every keyturnd leases every due
//! action of its providers, so two keyturnd processes running at once would
//! deliver each other's actions. Every e2e test therefore holds
//! [`serial`] for its whole life (the tests of the one test binary run on
//! parallel threads), and each receiver tells its own tenant's actions from
//! *foreign* ones (left queued by other layers or by an earlier test): a
//! foreign request is answered 200 and only counted apart, so it can never
//! disturb a test's counts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

// ---------------------------------------------------------------------------
// Skipping, serializing, naming
// ---------------------------------------------------------------------------

/// The private cluster's port, `None` without one (see `require_db!`).
pub fn pg_port() -> Option<u16> {
    std::env::var("KT_PGPORT")
        .ok()
        .map(|p| p.parse().expect("KT_PGPORT must be a port number"))
}

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for a whole test: only one keyturnd of this binary runs at a time.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A name no other test (nor an earlier run) uses; valid as tenant and tool.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", &Uuid::new_v4().simple().to_string()[..12])
}

/// Polls `check` every 50 ms until it returns `Some` or `within` passes.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// The database, through the real SQL API
// ---------------------------------------------------------------------------

/// A connection as login role `role` (trust authentication on loopback).
pub async fn connect(port: u16, role: &str) -> Client {
    let url = format!("host=127.0.0.1 port={port} user={role} dbname=keyturn");
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect as {role}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// `postgres://<role>@127.0.0.1:<port>/keyturn`.
pub fn url(port: u16, role: &str) -> String {
    format!("postgres://{role}@127.0.0.1:{port}/keyturn")
}

/// One approved external action: its id and stable idempotency key.
#[derive(Clone, Debug)]
pub struct Queued {
    pub id: Uuid,
    pub idempotency_key: String,
}

/// A tenant with one principal (role `member`), acting through the fixture's
/// login roles: app_admin registers and grants, app_agent proposes,
/// app_human approves (same principal and session: a `self` approval), each
/// call with the identity set for its transaction only ([`World::as_identity`]).
pub struct World {
    pub port: u16,
    pub tenant: String,
    pub principal: String,
    pub session: String,
    pub admin: Client,
    pub agent: Client,
    pub human: Client,
    /// For checks only (reads, the text of every table); never for writes.
    pub superuser: Client,
}

impl World {
    pub async fn new(port: u16) -> World {
        let tenant = unique("e2e_tenant");
        let principal = unique("user");
        let session = unique("session");
        let admin = connect(port, "app_admin").await;
        admin
            .execute(
                "SELECT keyturn.add_member($1, $2, 'member')",
                &[&tenant, &principal],
            )
            .await
            .expect("add_member");
        let agent = connect(port, "app_agent").await;
        let human = connect(port, "app_human").await;
        let superuser = connect(port, "postgres").await;
        World {
            port,
            tenant,
            principal,
            session,
            admin,
            agent,
            human,
            superuser,
        }
    }

    /// New connections (after a database restart).
    pub async fn reconnect(&mut self) {
        self.admin = connect(self.port, "app_admin").await;
        self.agent = connect(self.port, "app_agent").await;
        self.human = connect(self.port, "app_human").await;
        self.superuser = connect(self.port, "postgres").await;
    }

    /// Registers an external tool (unique name) and grants it.
    pub async fn tool(&self, prefix: &str, spec: Value) -> String {
        let name = unique(prefix);
        self.admin
            .execute("SELECT keyturn.register_tool($1, $2)", &[&name, &spec])
            .await
            .unwrap_or_else(|e| panic!("register_tool {name}: {e}"));
        self.admin
            .execute(
                "SELECT keyturn.grant_tool($1, $2, $3)",
                &[&self.tenant, &self.principal, &name],
            )
            .await
            .expect("grant_tool");
        name
    }

    /// A webhook tool taking `{"text": string}`; `extra` adds spec keys.
    pub async fn webhook_tool(&self, extra: Value) -> String {
        let mut spec = json!({
            "executor": "external",
            "provider": "webhook",
            "summary": "Notify: {text}",
            "params_schema": {
                "type": "object",
                "properties": {"text": {"type": "string", "maxLength": 500}},
                "required": ["text"]
            }
        });
        if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
            s.extend(e);
        }
        self.tool("e2e_hook", spec).await
    }

    /// An smtp tool named `name`: to, subject and body, `to` a bare address.
    pub async fn smtp_tool(&self, name: &str) -> String {
        self.tool(
            name,
            json!({
                "executor": "external",
                "provider": "smtp",
                "summary": "Send email to {to} about \"{subject}\"",
                "params_schema": {
                    "type": "object",
                    "properties": {
                        "to": {"type": "string", "format": "email"},
                        "subject": {"type": "string", "maxLength": 200},
                        "body": {"type": "string", "maxLength": 5000}
                    },
                    "required": ["to", "subject", "body"]
                }
            }),
        )
        .await
    }

    /// Proposes (as the agent) and approves (as the human): the action is
    /// `queued`. `resubmit` passes the params again at approve (digest tools).
    pub async fn queue(&self, tool: &str, params: Value, resubmit: bool) -> Queued {
        let row = self
            .as_identity(
                &self.agent,
                "SELECT action_id, token FROM keyturn.propose($1, $2)",
                &[&tool, &params],
            )
            .await
            .unwrap_or_else(|e| panic!("propose {tool}: {e}"));
        let id: Uuid = row.get(0);
        let token: String = row.get(1);
        let again: Option<Value> = resubmit.then(|| params.clone());
        let row = self
            .as_identity(
                &self.human,
                "SELECT status FROM keyturn.approve($1, $2, $3)",
                &[&id, &token, &again],
            )
            .await
            .unwrap_or_else(|e| panic!("approve {id}: {e}"));
        let status: String = row.get(0);
        assert_eq!(status, "queued", "an approved external action is queued");
        let idempotency_key: String = self
            .superuser
            .query_one(
                "SELECT idempotency_key FROM keyturn.action WHERE id = $1",
                &[&id],
            )
            .await
            .expect("idempotency_key")
            .get(0);
        Queued {
            id,
            idempotency_key,
        }
    }

    /// One keyturn call on `client` carrying this world's identity, set
    /// transaction-locally: `BEGIN; set_config(…, true) …; <call>; COMMIT`.
    /// Session-level identity would outlive the call on a pooled
    /// connection, so keyturn refuses it.
    pub async fn as_identity(
        &self,
        client: &Client,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        client.batch_execute("BEGIN").await?;
        let called = async {
            client
                .execute(
                    "SELECT set_config('keyturn.tenant', $1, true), \
                            set_config('keyturn.principal', $2, true), \
                            set_config('keyturn.session', $3, true)",
                    &[&self.tenant, &self.principal, &self.session],
                )
                .await?;
            client.query_one(sql, params).await
        }
        .await;
        match called {
            Ok(row) => {
                client.batch_execute("COMMIT").await?;
                Ok(row)
            }
            Err(e) => {
                client.batch_execute("ROLLBACK").await?;
                Err(e)
            }
        }
    }

    /// (status, attempts) of an action.
    pub async fn state(&self, id: Uuid) -> (String, i32) {
        let row = self
            .superuser
            .query_one(
                "SELECT status::text, attempts FROM keyturn.action WHERE id = $1",
                &[&id],
            )
            .await
            .expect("action row");
        (row.get(0), row.get(1))
    }

    pub async fn status(&self, id: Uuid) -> String {
        self.state(id).await.0
    }

    /// Waits until the action reaches `want`; panics with the last status.
    pub async fn wait_status(&self, id: Uuid, want: &str, within: Duration) {
        let start = Instant::now();
        loop {
            let (status, attempts) = self.state(id).await;
            if status == want {
                return;
            }
            if start.elapsed() > within {
                panic!(
                    "action {id} is {status} (attempts {attempts}), not {want}, after {within:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The stored receipt of the action.
    pub async fn receipt(&self, id: Uuid) -> Option<Value> {
        self.superuser
            .query_one("SELECT receipt FROM keyturn.action WHERE id = $1", &[&id])
            .await
            .expect("receipt")
            .get(0)
    }

    pub async fn count(&self, sql: &str, id: Uuid) -> i64 {
        self.superuser
            .query_one(sql, &[&id])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// keyturn.usage rows of the action.
    pub async fn usage_rows(&self, id: Uuid) -> i64 {
        self.count(
            "SELECT count(*) FROM keyturn.usage WHERE action_id = $1",
            id,
        )
        .await
    }

    /// (attempt, outcome) rows of keyturn.attempt, in order.
    pub async fn attempts(&self, id: Uuid) -> Vec<(i32, Option<String>)> {
        self.superuser
            .query(
                "SELECT attempt, outcome::text FROM keyturn.attempt WHERE action_id = $1 ORDER BY attempt",
                &[&id],
            )
            .await
            .expect("attempt rows")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Events of the action that moved it to `to_status`.
    pub async fn events_to(&self, id: Uuid, to_status: &str) -> i64 {
        self.superuser
            .query_one(
                "SELECT count(*) FROM keyturn.event WHERE action_id = $1 AND to_status::text = $2",
                &[&id, &to_status],
            )
            .await
            .expect("events")
            .get(0)
    }

    /// Every `keyturn.<table>` whose row text contains `needle` (read as
    /// superuser, so RLS hides nothing), with the number of such rows.
    pub async fn tables_containing(&self, needle: &str) -> Vec<(String, i64)> {
        let tables: Vec<String> = self
            .superuser
            .query(
                "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = 'keyturn' AND c.relkind IN ('r', 'p') ORDER BY 1",
                &[],
            )
            .await
            .expect("keyturn tables")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            tables.iter().any(|t| t == "action"),
            "found the keyturn tables: {tables:?}"
        );
        let mut hits = Vec::new();
        for table in tables {
            let sql = format!(
                "SELECT count(*) FROM keyturn.{} t WHERE strpos(t::text, $1) > 0",
                quote_ident(&table)
            );
            let n: i64 = self
                .superuser
                .query_one(&sql, &[&needle])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get(0);
            if n > 0 {
                hits.push((table, n));
            }
        }
        hits
    }
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

// ---------------------------------------------------------------------------
// The webhook receiver
// ---------------------------------------------------------------------------

/// What the receiver answers to the n-th request for one action (the last
/// entry repeats).
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Answer only once a permit is added to this (the test says when).
    pub hold: Option<Arc<tokio::sync::Semaphore>>,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
            hold: None,
        }
    }
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
    pub fn body(mut self, body: impl Into<String>) -> Reply {
        self.body = body.into();
        self
    }
    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
    /// Answers once `gate` has a permit, taking it.
    pub fn until(mut self, gate: Arc<tokio::sync::Semaphore>) -> Reply {
        self.hold = Some(gate);
        self
    }
}

/// One request as it arrived.
#[derive(Clone, Debug)]
pub struct Received {
    pub action_id: Option<Uuid>,
    pub idempotency_key: Option<String>,
    /// The deprecated `X-Keyturn-Signature` verified.
    pub signature_ok: bool,
    /// `webhook-signature` verified (Standard Webhooks, key = the decoded
    /// `whsec_` secret).
    pub standard_ok: bool,
    pub webhook_id: Option<String>,
    pub has_timestamp: bool,
    pub body: Vec<u8>,
}

#[derive(Default)]
struct Seen {
    mine: Vec<Received>,
    foreign: usize,
    /// When the answer to each of its tenant's requests was handed to the
    /// server to send, by action.
    answered: Vec<(Option<Uuid>, Instant)>,
}

/// Chooses the reply to the n-th request (from 0) for one action.
pub type Pick = Arc<dyn Fn(usize) -> Reply + Send + Sync>;

#[derive(Clone)]
struct RecvState {
    secret: Arc<Vec<u8>>,
    standard_key: Arc<Vec<u8>>,
    tenant: String,
    pick: Pick,
    seen: Arc<Mutex<Seen>>,
}

/// A real HTTP server on 127.0.0.1 that verifies `X-Keyturn-Signature` and
/// answers requests of its tenant by `plan`.
pub struct Receiver {
    pub addr: SocketAddr,
    pub secret: String,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn hmac_hex(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `webhook-signature` holds `v1,<base64 HMAC(key, id.timestamp.body)>`.
fn standard_ok(key: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sigs)) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    ) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    let want = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    sigs.split(' ').any(|s| s == want)
}

async fn receive(State(s): State<RecvState>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let expected = format!("sha256={}", hmac_hex(&s.secret, &body));
    let signature_ok = header("x-keyturn-signature").is_some_and(|got| {
        // Constant-time comparison is the receiver's job in production; a
        // test compares plainly.
        got == expected
    });
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let tenant = parsed
        .as_ref()
        .and_then(|v| v.get("tenant"))
        .and_then(Value::as_str);
    if tenant != Some(s.tenant.as_str()) {
        s.seen.lock().unwrap().foreign += 1;
        return StatusCode::OK.into_response();
    }
    let received = Received {
        action_id: parsed
            .as_ref()
            .and_then(|v| v.get("action_id"))
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok()),
        idempotency_key: header("idempotency-key"),
        signature_ok,
        standard_ok: standard_ok(&s.standard_key, &headers, &body),
        webhook_id: header("webhook-id"),
        has_timestamp: header("x-keyturn-timestamp").is_some(),
        body: body.to_vec(),
    };
    let action_id = received.action_id;
    let nth = {
        let mut seen = s.seen.lock().unwrap();
        let nth = seen
            .mine
            .iter()
            .filter(|r| r.action_id == received.action_id)
            .count();
        seen.mine.push(received);
        nth
    };
    if !signature_ok {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let reply = (s.pick)(nth);
    if let Some(gate) = &reply.hold {
        if let Ok(permit) = gate.acquire().await {
            permit.forget();
        }
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = (
        StatusCode::from_u16(reply.status).expect("status"),
        reply.body,
    )
        .into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).expect("header value"),
        );
    }
    s.seen
        .lock()
        .unwrap()
        .answered
        .push((action_id, Instant::now()));
    response
}

impl Receiver {
    /// Starts a receiver for `tenant`'s actions answering by `plan`.
    pub async fn start(tenant: &str, plan: Vec<Reply>) -> Receiver {
        let pick: Pick = Arc::new(move |nth| {
            plan.get(nth)
                .or(plan.last())
                .cloned()
                .unwrap_or(Reply::status(200))
        });
        Receiver::start_with(tenant, pick).await
    }

    /// Starts a receiver for `tenant`'s actions answering what `pick` says.
    pub async fn start_with(tenant: &str, pick: Pick) -> Receiver {
        let key = Uuid::new_v4().into_bytes();
        let secret = format!("whsec_{}", STANDARD.encode(key));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let state = RecvState {
            secret: Arc::new(secret.clone().into_bytes()),
            standard_key: Arc::new(key.to_vec()),
            tenant: tenant.to_owned(),
            pick,
            seen: seen.clone(),
        };
        let app = axum::Router::new().fallback(receive).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            addr,
            secret,
            seen,
            task,
        }
    }

    /// A receiver that answers 200 only once the test adds a permit to the
    /// gate it returns, one request a permit.
    pub async fn held(tenant: &str) -> (Receiver, Arc<tokio::sync::Semaphore>) {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let rx = Receiver::start(tenant, vec![Reply::status(200).until(gate.clone())]).await;
        (rx, gate)
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// How many requests for other tenants' actions (foreign ones) it saw.
    pub fn foreign(&self) -> usize {
        self.seen.lock().unwrap().foreign
    }

    /// The requests this receiver saw for `id`.
    pub fn requests(&self, id: Uuid) -> Vec<Received> {
        self.seen
            .lock()
            .unwrap()
            .mine
            .iter()
            .filter(|r| r.action_id == Some(id))
            .cloned()
            .collect()
    }

    /// Every request of its own tenant.
    pub fn all(&self) -> Vec<Received> {
        self.seen.lock().unwrap().mine.clone()
    }

    /// When each answer of its tenant's requests was handed over to be
    /// sent, by action, in order.
    pub fn answered(&self) -> Vec<(Option<Uuid>, Instant)> {
        self.seen.lock().unwrap().answered.clone()
    }

    /// Waits until `id` has had `n` requests.
    pub async fn wait_requests(&self, id: Uuid, n: usize, within: Duration) {
        eventually(within, &format!("{n} request(s) for {id}"), || async {
            (self.requests(id).len() >= n).then_some(())
        })
        .await
    }

    /// Keyturnd settings for this receiver.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("KEYTURN_WEBHOOK_URL", self.url()),
            ("KEYTURN_WEBHOOK_SECRET", self.secret.clone()),
        ]
    }
}

// ---------------------------------------------------------------------------
// The keyturnd process
// ---------------------------------------------------------------------------

/// A running `keyturnd` (the real binary), its log captured.
pub struct Keyturnd {
    child: Child,
    pub base: String,
    log: Arc<Mutex<String>>,
    http: reqwest::Client,
}

impl Drop for Keyturnd {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The journal directory of the running test: shared by every keyturnd a
/// test starts (a restarted one replays what a killed one left), apart from
/// every other test's. Under `KT_SCRATCH` (removed with the run's scratch
/// directory) when set, else the system's temporary directory.
pub fn journal_dir() -> std::path::PathBuf {
    let base = std::env::var_os("KT_SCRATCH")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    // libtest names each test's thread after the test. Hashed, so that
    // keyturnd's log (which names the directory) never holds the test's
    // name: some tests look for words in that log.
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().name().unwrap_or("main").hash(&mut h);
    base.join(format!("keyturnd-it-{}", std::process::id()))
        .join(format!("t{:016x}", h.finish()))
}

/// Short timings, so leases lapse and sweeps run within a test.
pub fn fast_env() -> Vec<(&'static str, String)> {
    vec![
        ("KEYTURN_LEASE_SECONDS", "4".into()),
        ("KEYTURN_HTTP_TIMEOUT_SECONDS", "1".into()),
        ("KEYTURN_SWEEP_SECONDS", "1".into()),
        ("KEYTURN_POLL_MS", "200".into()),
        ("KEYTURN_SHUTDOWN_SECONDS", "10".into()),
    ]
}

impl Keyturnd {
    /// Starts keyturnd as app_dispatcher with [`fast_env`], then `env`
    /// (later entries win), and waits until `/readyz` says 200.
    pub async fn start(port: u16, env: Vec<(&'static str, String)>) -> Keyturnd {
        let k = Keyturnd::spawn(port, env);
        k.wait_ready(Duration::from_secs(20)).await;
        k
    }

    /// Starts keyturnd without waiting for readiness.
    pub fn spawn(port: u16, env: Vec<(&'static str, String)>) -> Keyturnd {
        let http_port = super::closed_port();
        let mut vars: HashMap<&'static str, String> = HashMap::new();
        vars.insert("DATABASE_URL", url(port, "app_dispatcher"));
        vars.insert("KEYTURN_LISTEN", format!("127.0.0.1:{http_port}"));
        vars.insert("RUST_LOG", "info".into());
        vars.insert(
            "KEYTURN_JOURNAL_DIR",
            journal_dir().to_string_lossy().into_owned(),
        );
        for (k, v) in fast_env().into_iter().chain(env) {
            vars.insert(k, v);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
            .env_clear()
            .envs(vars)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start keyturnd");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Keyturnd {
            child,
            base: format!("http://127.0.0.1:{http_port}"),
            log,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("http client"),
        }
    }

    /// Everything keyturnd wrote so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("keyturnd still running")
    }

    /// The status of `GET <path>`, `None` when nothing answers.
    pub async fn get_status(&self, path: &str) -> Option<u16> {
        self.http
            .get(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn wait_ready(&self, within: Duration) {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.get_status("/readyz").await == Some(200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("keyturnd not ready within {within:?}; log:\n{}", self.log());
    }

    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill(1)")
            .success();
        assert!(ok, "kill {sig}");
        if sig == "-STOP" {
            self.wait_stopped();
        }
    }

    /// Waits until every thread of keyturnd is stopped (state `T` in
    /// /proc): kill(2) returns once SIGSTOP is sent, and a thread running
    /// on another core may still act on what arrives meanwhile, which a
    /// test that pauses keyturnd before releasing an answer must exclude.
    fn wait_stopped(&self) {
        let tasks = format!("/proc/{}/task", self.pid());
        let start = std::time::Instant::now();
        loop {
            let all = std::fs::read_dir(&tasks)
                .map(|dir| {
                    dir.filter_map(Result::ok).all(|t| {
                        std::fs::read_to_string(t.path().join("stat"))
                            .ok()
                            .and_then(|stat| {
                                let state = stat.rsplit_once(") ")?.1.chars().next()?;
                                Some(state == 'T' || state == 't')
                            })
                            .unwrap_or(true)
                    })
                })
                .unwrap_or(true);
            if all {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "keyturnd did not stop within 10 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILL: no handler runs, nothing is recorded.
    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("wait"),
            Err(_) => panic!(
                "keyturnd did not exit within {within:?}; log:\n{}",
                self.log()
            ),
        }
    }

    /// SIGTERM, then waits for a clean exit (code 0).
    pub async fn stop(mut self) -> String {
        self.signal("-TERM");
        let status = self.wait_exit(Duration::from_secs(20)).await;
        // Give the log reader a moment to drain the pipe.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = self.log();
        assert_eq!(
            status.code(),
            Some(0),
            "keyturnd exit after SIGTERM; log:\n{log}"
        );
        log
    }
}

/// Restarts the private cluster (`KT_PGDATA`) with `pg_ctl restart -m
/// <mode>` (`fast`: a clean shutdown; `immediate`: a crash, recovered at
/// start), which starts it again with the options in `postmaster.opts`.
/// The server log goes to `KT_PGLOG`, else `$KT_PGSOCK/postgres.log`.
pub fn restart_postgres(mode: &str) {
    let data = std::env::var("KT_PGDATA").expect("KT_PGDATA must be set with KT_PGPORT");
    let log = std::env::var("KT_PGLOG").unwrap_or_else(|_| {
        let sock = std::env::var("KT_PGSOCK").expect("KT_PGSOCK must be set with KT_PGPORT");
        format!("{sock}/postgres.log")
    });
    let bin = std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    let pg_ctl = format!("{bin}/pg_ctl");
    let args = [
        "-D",
        data.as_str(),
        "-l",
        log.as_str(),
        "-w",
        "-t",
        "60",
        "restart",
        "-m",
        mode,
    ];
    // PostgreSQL refuses to run as root: the cluster belongs to `postgres`.
    let is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut cmd = if is_root {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "postgres", "--", pg_ctl.as_str()]);
        c
    } else {
        std::process::Command::new(&pg_ctl)
    };
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pg_ctl restart");
    assert!(
        out.status.success(),
        "pg_ctl restart -m {mode} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the keyturnd binary once with `args` as `role` (an operator
/// command); returns (exit code, stdout, stderr).
pub async fn run_cli(port: u16, role: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_keyturnd"))
        .env_clear()
        .env("DATABASE_URL", url(port, role))
        .env("RUST_LOG", "info")
        .args(args)
        .output()
        .await
        .expect("run keyturnd");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
