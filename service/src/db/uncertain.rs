//! Actions whose outcome keyturnd does not know: the operator's list and
//! gauge, `reconcile`, and keyturnd's own record that an attempt sent
//! nothing.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};
use uuid::Uuid;

use super::{get, query, query_one, query_one_for};
use crate::error::Error;

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
    let row = query_one_for(
        client,
        tenant,
        "SELECT keyturn.reconcile($1, $2, $3) AS status",
        "SELECT keyturn.reconcile_for($4, $1, $2, $3) AS status",
        &params,
    )
    .await?;
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
    let row = query_one_for(
        client,
        tenant,
        "SELECT keyturn.record_not_sent($1, $2, $3) AS taken",
        "SELECT keyturn.record_not_sent_for($4, $1, $2, $3) AS taken",
        &params,
    )
    .await?;
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
