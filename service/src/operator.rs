//! The operator commands: `keyturnd reconcile` and `keyturnd uncertain`.
//!
//! They call `keyturn.reconcile` and `keyturn.uncertain_actions` (role
//! `keyturn_operator`) on one short-lived connection and print the result.
//! Where keyturn's tables are distributed by tenant (Citus), `reconcile`
//! finds the action's tenant in `keyturn.uncertain_actions()` and calls
//! `keyturn.reconcile_for`, which Citus runs on that tenant's worker.
//! They never change anything else: resolving an `uncertain` action is a
//! human's decision after checking with the provider.

use uuid::Uuid;

use crate::db::{self, Reconciled, UncertainAction};
use crate::error::Error;

async fn connect(database_url: &str) -> Result<tokio_postgres::Client, Error> {
    let pg = db::pg_config(database_url)?;
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "database connection ended with an error");
        }
    });
    Ok(client)
}

/// Moves an `uncertain` action to `succeeded` or `failed`; returns the line
/// to print.
pub async fn reconcile(
    database_url: &str,
    action_id: Uuid,
    outcome: Reconciled,
    note: &str,
) -> Result<String, Error> {
    let client = connect(database_url).await?;
    let tenant = if db::dispatch_by_tenant(&client).await? {
        let listed = db::uncertain_actions(&client).await?;
        match listed.into_iter().find(|u| u.action_id == action_id) {
            Some(u) => Some(u.tenant),
            None => {
                return Err(Error::Operator(format!(
                    "only an uncertain action can be reconciled; {action_id} is not one (keyturnd uncertain lists them)"
                )))
            }
        }
    } else {
        None
    };
    let status = db::reconcile(&client, tenant.as_deref(), action_id, outcome, note).await?;
    Ok(format!("{action_id} {status}"))
}

/// The operator queue, as a table or as JSON.
pub async fn uncertain(database_url: &str, json: bool) -> Result<String, Error> {
    let client = connect(database_url).await?;
    let rows = db::uncertain_actions(&client).await?;
    if json {
        serde_json::to_string_pretty(&rows).map_err(|e| Error::Io(std::io::Error::other(e)))
    } else {
        Ok(render_table(&rows))
    }
}

/// What the table says of an action whose last attempt keyturnd knows it
/// never sent.
pub const NOT_SENT: &str = "not sent, by keyturnd's own account";

/// A plain aligned table; the receipt as compact JSON. Control characters
/// are dropped so a hostile tool name cannot rewrite the terminal.
pub fn render_table(rows: &[UncertainAction]) -> String {
    if rows.is_empty() {
        return "no uncertain actions\n".to_owned();
    }
    let clean = |s: &str| s.chars().filter(|c| !c.is_control()).collect::<String>();
    let header = [
        "ACTION_ID",
        "TENANT",
        "TOOL",
        "ATTEMPTS",
        "DISPATCHED_AT",
        "SAFE_TO_DECIDE_AFTER",
        "KEYTURND_SAYS",
        "RECEIPT",
    ]
    .map(String::from);
    let mut table = vec![header];
    for r in rows {
        table.push([
            r.action_id.to_string(),
            clean(&r.tenant),
            clean(&r.tool),
            r.attempts.to_string(),
            r.dispatched_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "-".into()),
            r.safe_to_decide_after
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "-".into()),
            match r.not_sent_by_dispatcher {
                Some(true) => NOT_SENT.to_owned(),
                _ => "-".to_owned(),
            },
            r.receipt
                .as_ref()
                .map(|v| clean(&v.to_string()))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    let mut widths = [0usize; 8];
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn test_table_lists_every_row_aligned() {
        let rows = vec![
            UncertainAction {
                action_id: Uuid::from_u128(1),
                tenant: "acme".into(),
                tool: "send_email".into(),
                attempts: 1,
                dispatched_at: chrono::Utc.timestamp_opt(1_700_000_000, 0).single(),
                receipt: Some(serde_json::json!({"status": 504})),
                not_sent_by_dispatcher: Some(false),
                safe_to_decide_after: chrono::Utc.timestamp_opt(1_700_000_030, 0).single(),
            },
            UncertainAction {
                action_id: Uuid::from_u128(2),
                tenant: "globex\u{1b}[2J".into(),
                tool: "post".into(),
                attempts: 3,
                dispatched_at: None,
                receipt: None,
                not_sent_by_dispatcher: Some(true),
                safe_to_decide_after: None,
            },
        ];
        let text = render_table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("ACTION_ID"));
        assert!(
            lines[1].contains("2023-11-14T22:13:20Z") && lines[1].contains(r#"{"status":504}"#)
        );
        assert!(lines[1].contains("2023-11-14T22:13:50Z") && !lines[1].contains(NOT_SENT));
        assert!(lines[2].contains(NOT_SENT), "{text}");
        assert!(!text.contains('\u{1b}'), "control characters dropped");
        let col = lines[0].find("TENANT").expect("header");
        assert_eq!(lines[2].find("globex"), Some(col), "columns align");
        assert_eq!(render_table(&[]), "no uncertain actions\n");
    }
}
