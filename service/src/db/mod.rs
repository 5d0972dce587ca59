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
//!
//! Here: the pool, the statement bound and the transaction. The calls, by
//! who makes them: the dispatcher (`dispatch`), its providers (`payload`),
//! the operator (`uncertain`), the MCP front door (`mcp`) and a person's
//! `/rpc` (`rpc`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, Transaction};

use crate::error::Error;
use crate::metrics::Metrics;

mod dispatch;
pub mod mcp;
mod payload;
pub mod rpc;
mod uncertain;

pub use dispatch::{
    begin_dispatch_many, complete, complete_many, dispatch_by_tenant, dispatch_nodes, lease, sweep,
    tenants_due, BeginAnswer, CompleteAnswer, Completion, LeasedJob, SweepCounts, TenantDue,
};
pub use payload::{attachments, file_content, is_missing_file, notification_message, ListedFile};
pub use uncertain::{
    may_count_uncertain, reconcile, record_not_sent, uncertain_actions, uncertain_count,
    Reconciled, UncertainAction,
};

/// Longest any single keyturn call may take before it counts as lost. The
/// calls are small; a database that needs longer is in trouble, and the
/// worker's own deadlines matter more than waiting it out.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for a pooled connection (or to open one).
const POOL_TIMEOUT: Duration = Duration::from_secs(5);

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

/// The plain call, or with a tenant its tenant-explicit form (module
/// docs). `params` end with the tenant, which only `for_tenant` reads.
async fn query_for(
    client: &Client,
    tenant: Option<&str>,
    plain: &str,
    for_tenant: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, Error> {
    match tenant {
        None => query(client, plain, &params[..params.len() - 1]).await,
        Some(_) => query(client, for_tenant, params).await,
    }
}

/// [`query_for`] of a call that answers one row.
async fn query_one_for(
    client: &Client,
    tenant: Option<&str>,
    plain: &str,
    for_tenant: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Row, Error> {
    match tenant {
        None => query_one(client, plain, &params[..params.len() - 1]).await,
        Some(_) => query_one(client, for_tenant, params).await,
    }
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
