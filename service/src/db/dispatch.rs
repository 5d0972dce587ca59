//! The dispatcher's calls: which tenants have work, lease, begin, complete
//! and sweep (docs/keyturnd.md, the dispatcher).

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};
use uuid::Uuid;

use super::{get, query, query_for, query_one, query_one_for, secs};
use crate::error::Error;

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
    let rows = query_for(
        client,
        tenant,
        "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                 FROM keyturn.lease($1, $2, $3 * interval '1 second', $4)",
        "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                 FROM keyturn.lease_for($5, $1, $2, $3 * interval '1 second', $4)",
        &params,
    )
    .await?;
    rows.iter().map(LeasedJob::from_row).collect()
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
    let row = query_one_for(
        client,
        tenant,
        "SELECT keyturn.complete($1, $2, $3, $4, $5 * interval '1 second') AS status",
        "SELECT keyturn.complete_for($6, $1, $2, $3, $4, $5 * interval '1 second') AS status",
        &params,
    )
    .await?;
    get(&row, "status")
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
    let rows = query_for(
        client,
        tenant,
        "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)",
        "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many_for($3, $1, $2)",
        &params,
    )
    .await?;
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
    let row = query_one_for(
        client,
        tenant,
        "SELECT expired, requeued, uncertain FROM keyturn.sweep()",
        "SELECT expired, requeued, uncertain FROM keyturn.sweep_for($1)",
        &[(&tenant, Type::TEXT)],
    )
    .await?;
    Ok(SweepCounts {
        expired: get(&row, "expired")?,
        requeued: get(&row, "requeued")?,
        uncertain: get(&row, "uncertain")?,
    })
}
