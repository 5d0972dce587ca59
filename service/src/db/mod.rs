//! The SQL keyturnd runs: one function per dispatcher or operator call
//! (README, section SQL API), typed rows in, typed rows out.
//!
//! Every function takes a plain `&tokio_postgres::Client`, so the worker
//! passes pooled connections and tests can pass any connection they like.
//! Each call is one statement, in autocommit except for the worker's lease
//! step, which runs `lease`, its hand-backs and `begin_dispatch_many` in one
//! transaction ([`transaction`] … [`commit`]) and calls no provider before
//! [`commit`] returned `Ok`.
//!
//! Statements go through `query_typed` (parameter types stated here, one
//! round trip, no named prepared statements), which also works behind a
//! transaction-mode connection pooler.
//!
//! Intervals are sent as `float8` seconds and multiplied by
//! `interval '1 second'` in SQL, so that a `NULL` delay stays `NULL` (the
//! database then applies its own backoff).
//!
//! **Tenant by tenant.** The calls that act on actions take a `tenant`:
//! `None` runs the plain call (`keyturn.lease`, …), `Some` its
//! tenant-explicit form (`keyturn.lease_for`, …), which keyturnd uses once
//! [`dispatch_by_tenant`] says keyturn's tables are distributed by tenant
//! (Citus): Citus then sends each call whole to that tenant's worker. Those
//! statements are `SELECT … FROM keyturn.<fn>(…)` with only parameters and
//! immutable expressions of them as arguments, the form Citus delegates.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, Transaction};
use uuid::Uuid;

use crate::error::Error;
use crate::metrics::Metrics;

pub mod mcp;
pub mod rpc;

/// Longest any single keyturn call may take before it counts as lost. The
/// calls are small; a database that needs longer is in trouble, and the
/// worker's own deadlines matter more than waiting it out.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for a pooled connection (or to open one).
const POOL_TIMEOUT: Duration = Duration::from_secs(5);

/// One row of `keyturn.lease`.
#[derive(Clone, Debug, PartialEq)]
pub struct LeasedJob {
    /// The action.
    pub action_id: Uuid,
    /// This lease; every later call for the job must present it.
    pub lease_id: Uuid,
    /// The action's tenant.
    pub tenant: String,
    /// The tool name.
    pub tool: String,
    /// The adapter that carries it out (`webhook`, `smtp`, …).
    pub provider: String,
    /// The approved params. Never logged.
    pub params: serde_json::Value,
    /// Stable per action; sent to the provider on every attempt.
    pub idempotency_key: String,
    /// The attempt this lease is for (counted at `begin_dispatch`).
    pub attempt: i32,
}

impl LeasedJob {
    fn from_row(row: &Row) -> Result<Self, Error> {
        Ok(LeasedJob {
            action_id: get(row, "action_id")?,
            lease_id: get(row, "lease_id")?,
            tenant: get(row, "tenant")?,
            tool: get(row, "tool")?,
            provider: get(row, "provider")?,
            params: get(row, "params")?,
            idempotency_key: get(row, "idempotency_key")?,
            attempt: get(row, "attempt")?,
        })
    }

    /// A job for tests (fixed ids, an email-shaped params object).
    #[cfg(test)]
    pub fn example() -> Self {
        LeasedJob {
            action_id: Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
            lease_id: Uuid::from_u128(1),
            tenant: "acme".into(),
            tool: "send_email".into(),
            provider: "webhook".into(),
            params: serde_json::json!({"to": "a@example.com", "subject": "Hi", "body": "Hello"}),
            idempotency_key: "ik-0123456789abcdef".into(),
            attempt: 1,
        }
    }
}

/// One row of `keyturn.sweep()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepCounts {
    /// `pending` past expiry → `expired`.
    pub expired: i32,
    /// `leased` with a lapsed lease → `queued`.
    pub requeued: i32,
    /// `executing` with a lapsed lease → `uncertain`.
    pub uncertain: i32,
}

/// One row of `keyturn.uncertain_actions()`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UncertainAction {
    /// The action.
    pub action_id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Its tool.
    pub tool: String,
    /// Attempts made.
    pub attempts: i32,
    /// When the last attempt began.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// The last receipt recorded (credential-shaped keys redacted by the
    /// database).
    pub receipt: Option<serde_json::Value>,
    /// `Some(true)`: keyturnd's own account of the last attempt is that
    /// nothing was sent (it knew, but the sweep had made the action
    /// uncertain before its `retry` arrived; see [`record_not_sent`]).
    /// `None` from a `pg_keyturn` that keeps no such account.
    pub not_sent_by_dispatcher: Option<bool>,
    /// When the last attempt's lease ended: no keyturnd starts a call after
    /// it (docs/operations.md says what an operator may conclude, and when).
    pub safe_to_decide_after: Option<DateTime<Utc>>,
}

/// The `outcome` argument of `keyturn.reconcile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Reconciled {
    /// The provider did it.
    Succeeded,
    /// The provider did not.
    Failed,
}

impl Reconciled {
    fn word(self) -> &'static str {
        match self {
            Reconciled::Succeeded => "succeeded",
            Reconciled::Failed => "failed",
        }
    }
}

/// Builds the connection pool. Connections open lazily, so this succeeds
/// while the database is down; the first call reports it.
pub fn pool(database_url: &str, max_size: usize, metrics: Arc<Metrics>) -> Result<Pool, Error> {
    pool_named(database_url, max_size, metrics, "pool")
}

/// [`pool`], its reconnects counted under `conn` = `conn` (`rpc` for the
/// `/rpc` pool).
pub fn pool_named(
    database_url: &str,
    max_size: usize,
    metrics: Arc<Metrics>,
    conn: &'static str,
) -> Result<Pool, Error> {
    let pg = pg_config(database_url)?;
    let manager = Manager::from_config(
        pg,
        NoTls,
        ManagerConfig {
            // Fast: a closed connection is detected without a round trip; a
            // connection that broke silently fails its next statement, which
            // the callers retry.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .recycle_timeout(Some(POOL_TIMEOUT))
        .pre_recycle(Hook::sync_fn(move |client, _| {
            // The pool is about to find this connection dead and open
            // another: that is a reconnect.
            if client.is_closed() {
                metrics.reconnect(conn);
            }
            Ok(())
        }))
        .build()
        .map_err(|e| Error::Config(format!("database pool: {e}")))
}

/// Parses `DATABASE_URL` and names the application for `pg_stat_activity`.
pub fn pg_config(database_url: &str) -> Result<tokio_postgres::Config, Error> {
    let mut pg = tokio_postgres::Config::from_str(database_url)
        .map_err(|e| Error::Config(format!("DATABASE_URL does not parse: {e}")))?;
    if pg.get_application_name().is_none() {
        pg.application_name("keyturnd");
    }
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(POOL_TIMEOUT);
    }
    // Notice a half-open connection (the LISTEN one above all) within
    // minutes rather than the kernel's default two hours.
    pg.keepalives(true).keepalives_idle(Duration::from_secs(30));
    Ok(pg)
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, col: &str) -> Result<T, Error> {
    row.try_get(col).map_err(Error::Decode)
}

/// `fut`, failing with [`Error::DbTimeout`] after [`STATEMENT_TIMEOUT`].
pub async fn bounded<T>(
    fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(STATEMENT_TIMEOUT, fut).await {
        Ok(result) => result.map_err(Error::Db),
        Err(_) => Err(Error::DbTimeout(STATEMENT_TIMEOUT)),
    }
}

async fn query(
    client: &Client,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, Error> {
    bounded(client.query_typed(sql, params)).await
}

async fn query_one(
    client: &Client,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Row, Error> {
    bounded(client.query_typed_one(sql, params)).await
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Runs `attempt` until the database answers it: its result, or `Ok(None)`
/// once `shutdown` fires. A transient failure is tried again with a growing
/// pause (the first logged with `waiting`); any other ends it.
pub async fn until_answered<T, F, Fut>(
    shutdown: &tokio_util::sync::CancellationToken,
    waiting: &'static str,
    mut attempt: F,
) -> Result<Option<T>, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    const RETRY_MIN: Duration = Duration::from_millis(100);
    const RETRY_MAX: Duration = Duration::from_secs(5);
    let mut backoff = RETRY_MIN;
    let mut logged = false;
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            r = attempt() => r,
        };
        match result {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.is_transient() => {
                if !logged {
                    tracing::warn!(error = %e, "{waiting}");
                    logged = true;
                }
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// `BEGIN` on `client`. Dropping the returned transaction without
/// [`commit`] rolls it back (tokio-postgres queues a `ROLLBACK`), and a
/// connection lost before [`commit`] rolls it back on the server: either
/// way nothing done inside it ever happened.
pub async fn transaction(client: &mut Client) -> Result<Transaction<'_>, Error> {
    bounded(client.transaction()).await
}

/// `COMMIT`. `Ok` means committed. An error means the outcome is unknown
/// to the caller (the connection may have broken after the server
/// committed), and callers must treat it so.
pub async fn commit(tx: Transaction<'_>) -> Result<(), Error> {
    bounded(tx.commit()).await
}

/// `keyturn.dispatch_by_tenant()`: whether keyturn's tables are distributed
/// by tenant, so that every call here must name its tenant.
pub async fn dispatch_by_tenant(client: &Client) -> Result<bool, Error> {
    let row = query_one(client, "SELECT keyturn.dispatch_by_tenant() AS b", &[]).await?;
    get(&row, "b")
}

/// `keyturn.dispatch_nodes()`: the other nodes whose notifications keyturnd
/// must hear when it dispatches by tenant, as (host, port).
pub async fn dispatch_nodes(client: &Client) -> Result<Vec<(String, u16)>, Error> {
    let rows = query(
        client,
        "SELECT host, port FROM keyturn.dispatch_nodes()",
        &[],
    )
    .await?;
    rows.iter()
        .map(|r| {
            let port: i32 = get(r, "port")?;
            let port = u16::try_from(port).map_err(|_| {
                Error::Config(format!("keyturn.dispatch_nodes() names port {port}"))
            })?;
            Ok((get(r, "host")?, port))
        })
        .collect()
}

/// One row of `keyturn.tenants_due`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantDue {
    /// The tenant.
    pub tenant: String,
    /// Its queued actions due now, of the providers asked about.
    pub to_lease: i64,
    /// What its sweep would move on or delete.
    pub to_sweep: i64,
}

/// `keyturn.tenants_due(providers, max_tenants)`: the tenants with work due,
/// oldest first (a hint, read without locks).
pub async fn tenants_due(
    client: &Client,
    providers: Option<&[&str]>,
    max_tenants: i32,
) -> Result<Vec<TenantDue>, Error> {
    let rows = query(
        client,
        "SELECT tenant, to_lease, to_sweep FROM keyturn.tenants_due($1, $2)",
        &[(&providers, Type::TEXT_ARRAY), (&max_tenants, Type::INT4)],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(TenantDue {
                tenant: get(r, "tenant")?,
                to_lease: get(r, "to_lease")?,
                to_sweep: get(r, "to_sweep")?,
            })
        })
        .collect()
}

/// `keyturn.lease(worker, max_jobs, lease_for, providers)`, or with a tenant
/// `keyturn.lease_for(tenant, …)`, which leases that tenant's jobs only.
///
/// `providers` names the adapters this process has; the database leases only
/// actions whose tool's provider is among them, so an action no running
/// keyturnd can carry out stays `queued` (fail closed) instead of being
/// leased and handed back over and over. An empty list leases nothing.
pub async fn lease(
    client: &Client,
    tenant: Option<&str>,
    worker: &str,
    max_jobs: i32,
    lease_for: Duration,
    providers: &[&str],
) -> Result<Vec<LeasedJob>, Error> {
    let lease_secs = secs(lease_for);
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&worker, Type::TEXT),
        (&max_jobs, Type::INT4),
        (&lease_secs, Type::FLOAT8),
        (&providers, Type::TEXT_ARRAY),
        (&tenant, Type::TEXT),
    ];
    let rows = match tenant {
        None => query(
            client,
            "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                 FROM keyturn.lease($1, $2, $3 * interval '1 second', $4)",
            &params[..4],
        )
        .await?,
        Some(_) => query(
            client,
            "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                 FROM keyturn.lease_for($5, $1, $2, $3 * interval '1 second', $4)",
            &params,
        )
        .await?,
    };
    rows.iter().map(LeasedJob::from_row).collect()
}

/// One file an action sends, as `keyturn.attachments` lists it.
#[derive(Clone, Debug)]
pub struct ListedFile {
    /// The params key whose list names it (the tool's `attachments_param`).
    pub param: String,
    /// The staged file.
    pub file_id: Uuid,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
    /// The name it is sent under.
    pub filename: String,
    /// `type/subtype`.
    pub content_type: String,
    /// Length in bytes.
    pub size: i64,
}

/// `keyturn.attachments(action_id, lease_id)`: the files an action sends,
/// from its approved params, in their order; none when its tool takes no
/// attachments. `55000` unless it is leased or executing under this lease.
pub async fn attachments(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
) -> Result<Vec<ListedFile>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (&tenant, Type::TEXT),
    ];
    let rows = match tenant {
        None => {
            query(
                client,
                "SELECT param, file_id, sha256, filename, content_type, size \
                   FROM keyturn.attachments($1, $2) ORDER BY ord",
                &params[..2],
            )
            .await?
        }
        Some(_) => {
            query(
                client,
                "SELECT param, file_id, sha256, filename, content_type, size \
                   FROM keyturn.attachments_for($3, $1, $2) ORDER BY ord",
                &params,
            )
            .await?
        }
    };
    rows.iter()
        .map(|r| {
            Ok(ListedFile {
                param: get(r, "param")?,
                file_id: get(r, "file_id")?,
                sha256: get(r, "sha256")?,
                filename: get(r, "filename")?,
                content_type: get(r, "content_type")?,
                size: get(r, "size")?,
            })
        })
        .collect()
}

/// `keyturn.file_content(action_id, lease_id, file_id)`: the bytes of one
/// attachment of an action `executing` under this lease (else `55000`).
/// Never log or store what it returns.
pub async fn file_content(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
    file_id: Uuid,
) -> Result<Vec<u8>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (&file_id, Type::UUID),
        (&tenant, Type::TEXT),
    ];
    let row = match tenant {
        None => {
            query_one(
                client,
                "SELECT keyturn.file_content($1, $2, $3) AS content",
                &params[..3],
            )
            .await?
        }
        Some(_) => {
            query_one(
                client,
                "SELECT keyturn.file_content_for($4, $1, $2, $3) AS content",
                &params,
            )
            .await?
        }
    };
    get(&row, "content")
}

/// `keyturn.notification_message(notification_id, lease_id)`, or
/// `keyturn.notification_message_for(tenant, …)`: what the notification
/// `executing` under this lease says now, with a fresh link code (else
/// `55000`). Never log what it returns.
pub async fn notification_message(
    client: &Client,
    tenant: Option<&str>,
    id: Uuid,
    lease_id: Uuid,
) -> Result<crate::providers::notify::Message, Error> {
    const COLUMNS: &str = "send, reason, channel, target, secret, kind, title, body, actions, \
                           link_action_ids, code, code_expires_at, waiting";
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&id, Type::UUID),
        (&lease_id, Type::UUID),
        (&tenant, Type::TEXT),
    ];
    let row = match tenant {
        None => {
            query_one(
                client,
                &format!("SELECT {COLUMNS} FROM keyturn.notification_message($1, $2)"),
                &params[..2],
            )
            .await?
        }
        Some(_) => {
            query_one(
                client,
                &format!("SELECT {COLUMNS} FROM keyturn.notification_message_for($3, $1, $2)"),
                &params,
            )
            .await?
        }
    };
    let text = |col: &str| -> Result<String, Error> {
        Ok(get::<Option<String>>(&row, col)?.unwrap_or_default())
    };
    let secret = |col: &str| -> Result<Option<crate::config::Secret>, Error> {
        Ok(get::<Option<String>>(&row, col)?.map(crate::config::Secret::from))
    };
    let actions: Option<serde_json::Value> = get(&row, "actions")?;
    Ok(crate::providers::notify::Message {
        send: get(&row, "send")?,
        reason: get(&row, "reason")?,
        channel: text("channel")?,
        target: secret("target")?,
        secret: secret("secret")?,
        kind: text("kind")?,
        title: text("title")?,
        body: text("body")?,
        actions: match actions {
            Some(a) => serde_json::from_value(a)
                .map_err(|e| Error::internal("reading a notification's actions", e))?,
            None => Vec::new(),
        },
        link_action_ids: get::<Option<Vec<Uuid>>>(&row, "link_action_ids")?.unwrap_or_default(),
        code: secret("code")?,
        code_expires_at: get(&row, "code_expires_at")?,
        waiting: get(&row, "waiting")?,
    })
}

/// Whether `e` is `file_content` saying the file is not stored for this
/// action (as opposed to the lease or the action's status): both are
/// `55000`, and only the message tells them apart.
pub fn is_missing_file(e: &Error) -> bool {
    match e {
        Error::Db(db) if e.is_object_not_in_state() => db
            .as_db_error()
            .is_some_and(|d| d.message().contains("is not an attachment of action")),
        _ => false,
    }
}

/// `keyturn.complete(action_id, lease_id, outcome, receipt, retry_after)`,
/// or `keyturn.complete_for(tenant, …)`; returns the new status.
pub async fn complete(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
    outcome: &str,
    receipt: &serde_json::Value,
    retry_after: Option<Duration>,
) -> Result<String, Error> {
    let retry_secs = retry_after.map(secs);
    let params: [(&(dyn ToSql + Sync), Type); 6] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (&outcome, Type::TEXT),
        (receipt, Type::JSONB),
        (&retry_secs, Type::FLOAT8),
        (&tenant, Type::TEXT),
    ];
    let row = match tenant {
        None => {
            query_one(
                client,
                "SELECT keyturn.complete($1, $2, $3, $4, $5 * interval '1 second') AS status",
                &params[..5],
            )
            .await?
        }
        Some(_) => query_one(
            client,
            "SELECT keyturn.complete_for($6, $1, $2, $3, $4, $5 * interval '1 second') AS status",
            &params,
        )
        .await?,
    };
    get(&row, "status")
}

/// `pg_extension.extversion` of `pg_keyturn`; `None` when it is not
/// installed in this database.
pub async fn extension_version(client: &Client) -> Result<Option<String>, Error> {
    let rows = query(
        client,
        "SELECT extversion::text AS v FROM pg_catalog.pg_extension WHERE extname = 'pg_keyturn'",
        &[],
    )
    .await?;
    rows.first().map(|row| get(row, "v")).transpose()
}

/// What the outcome journal is bound to: the cluster's system identifier
/// (fixed at `initdb`, kept by physical replicas, so a failover keeps it)
/// and the database's name. Outcomes journaled for one database are never
/// replayed into another. Where `pg_control_system()` is not granted (some
/// hosted services), the database's name alone.
pub async fn database_identity(client: &Client) -> Result<String, Error> {
    let asked = query_one(
        client,
        "SELECT (SELECT system_identifier FROM pg_catalog.pg_control_system())::text \
                || '/' || pg_catalog.current_database() AS id",
        &[],
    )
    .await;
    let row = match asked {
        Err(e)
            if e.sqlstate() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
        {
            query_one(
                client,
                "SELECT 'unknown-cluster/' || pg_catalog.current_database() AS id",
                &[],
            )
            .await?
        }
        other => other?,
    };
    get(&row, "id")
}

/// One row of `keyturn.begin_dispatch_many`: what `keyturn.begin_dispatch`
/// would have answered for that element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeginAnswer {
    /// The action.
    pub action_id: Uuid,
    /// True: now `executing`, committed; call the provider.
    pub dispatch: bool,
    /// `None` with `dispatch = false`: invalidated. `Some("<SQLSTATE> …")`:
    /// refused (wrong or lapsed lease, not leased), nothing changed.
    pub error: Option<String>,
}

impl BeginAnswer {
    /// The SQLSTATE at the head of `error`, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        self.error.as_deref().map(error_sqlstate)
    }
}

/// One element of `keyturn.complete_many`.
#[derive(Clone, Copy, Debug)]
pub struct Completion<'a> {
    /// The action.
    pub action_id: Uuid,
    /// Its lease.
    pub lease_id: Uuid,
    /// `succeeded`, `failed`, `retry` or `unknown`.
    pub outcome: &'a str,
    /// The receipt (redacted by the database).
    pub receipt: &'a serde_json::Value,
    /// `None`: the database's backoff.
    pub retry_after: Option<Duration>,
}

/// One row of `keyturn.complete_many`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompleteAnswer {
    /// The action.
    pub action_id: Uuid,
    /// The new status, or `None` when refused.
    pub status: Option<String>,
    /// `Some("<SQLSTATE> …")` when refused (nothing changed for it).
    pub error: Option<String>,
}

impl CompleteAnswer {
    /// The SQLSTATE at the head of `error`, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        self.error.as_deref().map(error_sqlstate)
    }
}

fn error_sqlstate(e: &str) -> &str {
    e.split_once(' ').map_or(e, |(code, _)| code)
}

/// `keyturn.begin_dispatch_many(action_ids, lease_ids)`, or
/// `keyturn.begin_dispatch_many_for(tenant, …)`: one statement for the
/// batch, committed before any provider call (the worker runs it inside the
/// lease's transaction and calls providers only after [`commit`]). One
/// answer per pair, in order.
pub async fn begin_dispatch_many(
    client: &Client,
    tenant: Option<&str>,
    jobs: &[(Uuid, Uuid)],
) -> Result<Vec<BeginAnswer>, Error> {
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.0).collect();
    let leases: Vec<Uuid> = jobs.iter().map(|j| j.1).collect();
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&ids, Type::UUID_ARRAY),
        (&leases, Type::UUID_ARRAY),
        (&tenant, Type::TEXT),
    ];
    let rows = match tenant {
        None => {
            query(
                client,
                "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)",
                &params[..2],
            )
            .await?
        }
        Some(_) => query(
            client,
            "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many_for($3, $1, $2)",
            &params,
        )
        .await?,
    };
    rows.iter()
        .map(|row| {
            Ok(BeginAnswer {
                action_id: get(row, "action_id")?,
                dispatch: get(row, "dispatch")?,
                error: get(row, "error")?,
            })
        })
        .collect()
}

/// `keyturn.complete_many(...)`, or `keyturn.complete_many_for(tenant, …)`:
/// per element `keyturn.complete`, one statement and one commit for the
/// batch. One answer per element, in order.
pub async fn complete_many(
    client: &Client,
    tenant: Option<&str>,
    items: &[Completion<'_>],
) -> Result<Vec<CompleteAnswer>, Error> {
    let ids: Vec<Uuid> = items.iter().map(|i| i.action_id).collect();
    let leases: Vec<Uuid> = items.iter().map(|i| i.lease_id).collect();
    let outcomes: Vec<&str> = items.iter().map(|i| i.outcome).collect();
    let receipts: Vec<&serde_json::Value> = items.iter().map(|i| i.receipt).collect();
    let rows = match tenant {
        None => {
            let retry: Vec<Option<f64>> = items.iter().map(|i| i.retry_after.map(secs)).collect();
            query(
                client,
                "SELECT action_id, status, error FROM keyturn.complete_many($1, $2, $3, $4, \
                   coalesce((SELECT array_agg(s * interval '1 second' ORDER BY o) \
                               FROM unnest($5::float8[]) WITH ORDINALITY AS u(s, o)), '{}'))",
                &[
                    (&ids, Type::UUID_ARRAY),
                    (&leases, Type::UUID_ARRAY),
                    (&outcomes, Type::TEXT_ARRAY),
                    (&receipts, Type::JSONB_ARRAY),
                    (&retry, Type::FLOAT8_ARRAY),
                ],
            )
            .await?
        }
        Some(_) => {
            // No subquery in a delegated call's arguments: the delays go as
            // text ("1.5 seconds"), cast in the call.
            let retry: Vec<Option<String>> = items
                .iter()
                .map(|i| i.retry_after.map(|d| format!("{} seconds", secs(d))))
                .collect();
            query(
                client,
                "SELECT action_id, status, error \
                   FROM keyturn.complete_many_for($6, $1, $2, $3, $4, $5::text[]::interval[])",
                &[
                    (&ids, Type::UUID_ARRAY),
                    (&leases, Type::UUID_ARRAY),
                    (&outcomes, Type::TEXT_ARRAY),
                    (&receipts, Type::JSONB_ARRAY),
                    (&retry, Type::TEXT_ARRAY),
                    (&tenant, Type::TEXT),
                ],
            )
            .await?
        }
    };
    rows.iter()
        .map(|row| {
            Ok(CompleteAnswer {
                action_id: get(row, "action_id")?,
                status: get(row, "status")?,
                error: get(row, "error")?,
            })
        })
        .collect()
}

/// `keyturn.sweep()`, or `keyturn.sweep_for(tenant)`.
pub async fn sweep(client: &Client, tenant: Option<&str>) -> Result<SweepCounts, Error> {
    let row = match tenant {
        None => {
            query_one(
                client,
                "SELECT expired, requeued, uncertain FROM keyturn.sweep()",
                &[],
            )
            .await?
        }
        Some(t) => {
            query_one(
                client,
                "SELECT expired, requeued, uncertain FROM keyturn.sweep_for($1)",
                &[(&t, Type::TEXT)],
            )
            .await?
        }
    };
    Ok(SweepCounts {
        expired: get(&row, "expired")?,
        requeued: get(&row, "requeued")?,
        uncertain: get(&row, "uncertain")?,
    })
}

/// `pg_notify(channel, payload)` in a transaction of its own: keyturnd's
/// heartbeat, sent the way an approval's wake-up is, to see that it arrives
/// on the `LISTEN` connection.
pub async fn notify(client: &Client, channel: &str, payload: &str) -> Result<(), Error> {
    query(
        client,
        "SELECT 1 FROM pg_catalog.pg_notify($1, $2)",
        &[(&channel, Type::TEXT), (&payload, Type::TEXT)],
    )
    .await?;
    Ok(())
}

/// `LISTEN` on each of `channels`, on the connection that keeps them.
pub async fn listen(client: &Client, channels: &[&str]) -> Result<(), Error> {
    let sql: Vec<String> = channels
        .iter()
        .map(|c| format!("LISTEN {}", rpc::ident(c)))
        .collect();
    bounded(client.batch_execute(&sql.join("; "))).await
}

/// `keyturn.reconcile(action_id, outcome, note)`, or
/// `keyturn.reconcile_for(tenant, …)`; returns the new status.
pub async fn reconcile(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    outcome: Reconciled,
    note: &str,
) -> Result<String, Error> {
    let word = outcome.word();
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&action_id, Type::UUID),
        (&word, Type::TEXT),
        (&note, Type::TEXT),
        (&tenant, Type::TEXT),
    ];
    let row = match tenant {
        None => {
            query_one(
                client,
                "SELECT keyturn.reconcile($1, $2, $3) AS status",
                &params[..3],
            )
            .await?
        }
        Some(_) => {
            query_one(
                client,
                "SELECT keyturn.reconcile_for($4, $1, $2, $3) AS status",
                &params,
            )
            .await?
        }
    };
    get(&row, "status")
}

/// `keyturn.uncertain_actions()`, oldest dispatch first. Its columns
/// `not_sent_by_dispatcher` and `safe_to_decide_after` are read where the
/// installed `pg_keyturn` has them.
pub async fn uncertain_actions(client: &Client) -> Result<Vec<UncertainAction>, Error> {
    let rows = query(
        client,
        "SELECT * FROM keyturn.uncertain_actions() ORDER BY dispatched_at NULLS FIRST, action_id",
        &[],
    )
    .await?;
    let optional = |row: &Row, col: &str| row.columns().iter().any(|c| c.name() == col);
    rows.iter()
        .map(|row| {
            Ok(UncertainAction {
                action_id: get(row, "action_id")?,
                tenant: get(row, "tenant")?,
                tool: get(row, "tool")?,
                attempts: get(row, "attempts")?,
                dispatched_at: get(row, "dispatched_at")?,
                receipt: get(row, "receipt")?,
                not_sent_by_dispatcher: if optional(row, "not_sent_by_dispatcher") {
                    get(row, "not_sent_by_dispatcher")?
                } else {
                    None
                },
                safe_to_decide_after: if optional(row, "safe_to_decide_after") {
                    get(row, "safe_to_decide_after")?
                } else {
                    None
                },
            })
        })
        .collect()
}

/// `keyturn.record_not_sent(action_id, lease_id, receipt)`, or
/// `keyturn.record_not_sent_for(tenant, …)`: keyturnd's own account that
/// the attempt under `lease_id` sent nothing, kept on an action the sweep
/// made `uncertain` before its `retry` could be recorded. It changes no
/// status: the operator still decides. `Ok(false)`: the database did not
/// take it (the action is not uncertain under that lease).
pub async fn record_not_sent(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
    receipt: &serde_json::Value,
) -> Result<bool, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (receipt, Type::JSONB),
        (&tenant, Type::TEXT),
    ];
    let row = match tenant {
        None => {
            query_one(
                client,
                "SELECT keyturn.record_not_sent($1, $2, $3) AS taken",
                &params[..3],
            )
            .await?
        }
        Some(_) => {
            query_one(
                client,
                "SELECT keyturn.record_not_sent_for($4, $1, $2, $3) AS taken",
                &params,
            )
            .await?
        }
    };
    get(&row, "taken")
}

/// Whether this role may call `keyturn.uncertain_actions()` (the gauge
/// needs `keyturn_operator`). PostgreSQL is asked rather than the call
/// tried: a refused call is an ERROR in the server's log at every keyturnd
/// start, which a DBA reads as a fault.
pub async fn may_count_uncertain(client: &Client) -> Result<bool, Error> {
    let row = query_one(
        client,
        "SELECT pg_catalog.has_function_privilege('keyturn.uncertain_actions()', 'EXECUTE') AS may",
        &[],
    )
    .await?;
    get(&row, "may")
}

/// How many rows `keyturn.uncertain_actions()` holds (the gauge).
pub async fn uncertain_count(client: &Client) -> Result<i64, Error> {
    let row = query_one(
        client,
        "SELECT count(*) AS n FROM keyturn.uncertain_actions()",
        &[],
    )
    .await?;
    get(&row, "n")
}
