//! docs/sql-api.md: action_status visibility, the audit trail, append-only
//! tables, and the status graph guard.

use keyturn_tests::*;
use serde_json::{json, Value};

async fn status_rows(
    c: &impl Sql,
    id: uuid::Uuid,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    c.query("SELECT * FROM keyturn.action_status($1)", &[&id])
        .await
}

#[tokio::test]
async fn test_action_status_shows_visible_rows_only() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let rows = status_rows(&w.agent, p.id).await.unwrap();
    assert_eq!(rows.len(), 1, "the member sees its own action");
    let r = &rows[0];
    assert_eq!(r.get::<_, uuid::Uuid>("action_id"), p.id);
    assert_eq!(r.get::<_, String>("tool"), t);
    assert_eq!(r.get::<_, String>("status"), "pending");
    assert_eq!(r.get::<_, i32>("attempts"), 0);
    // Another member of the tenant: nothing. An approver of the tenant: the row.
    let (_m, member) = w.other("member", "app_human", "s2").await;
    assert_eq!(status_rows(&member, p.id).await.unwrap().len(), 0);
    let (_a, approver) = w.other("approver", "app_human", "s3").await;
    assert_eq!(status_rows(&approver, p.id).await.unwrap().len(), 1);
    // Another tenant's admin: nothing.
    let other = World::new("admin").await;
    assert_eq!(status_rows(&other.human, p.id).await.unwrap().len(), 0);
    // No identity: 42501.
    let anon = connect("app_human").await;
    assert_eq!(sqlstate(status_rows(&anon, p.id).await), "42501");
}

#[tokio::test]
async fn test_audit_lists_events_in_order_without_param_values() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let marker = "unmistakable-param-value-q7x";
    let _g = DISPATCH_LOCK.lock().await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": marker}))
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    let disp = connect("app_dispatcher").await;
    let l = lease_mine(&disp, &[p.id], "30 seconds").await;
    assert_eq!(l.len(), 1);
    disp.query_one(
        "SELECT keyturn.begin_dispatch($1, $2)",
        &[&p.id, &l[0].lease_id],
    )
    .await
    .unwrap();
    disp.query_one(
        "SELECT keyturn.complete($1, $2, 'succeeded', '{\"status\": 200}')",
        &[&p.id, &l[0].lease_id],
    )
    .await
    .unwrap();
    drop(_g);

    let rows = w
        .human
        .query(
            "SELECT db_role, principal, from_status, to_status, detail FROM keyturn.audit($1)",
            &[&p.id],
        )
        .await
        .unwrap();
    let steps: Vec<(Option<String>, String)> = rows.iter().map(|r| (r.get(2), r.get(3))).collect();
    let want = [
        (None, "pending"),
        (Some("pending"), "queued"),
        (Some("queued"), "leased"),
        (Some("leased"), "executing"),
        (Some("executing"), "succeeded"),
    ];
    assert_eq!(steps.len(), want.len(), "{steps:?}");
    for ((from, to), (wf, wt)) in steps.iter().zip(want) {
        assert_eq!(from.as_deref(), wf);
        assert_eq!(to, wt);
    }
    let roles: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        roles,
        [
            "app_agent",
            "app_human",
            "app_dispatcher",
            "app_dispatcher",
            "app_dispatcher"
        ]
    );
    let principals: Vec<Option<String>> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(principals[0].as_deref(), Some(w.principal.as_str()));
    assert_eq!(principals[1].as_deref(), Some(w.principal.as_str()));
    assert_eq!(principals[2], None, "role-only callers have no principal");
    for r in &rows {
        let d: Value = r.get(4);
        assert!(
            !d.to_string().contains(marker),
            "event detail leaks a param value: {d}"
        );
    }
    // Other callers: the agent (own action) sees it; no identity sees nothing; superuser all.
    assert_eq!(
        w.agent
            .query("SELECT * FROM keyturn.audit($1)", &[&p.id])
            .await
            .unwrap()
            .len(),
        5
    );
    let anon = connect("app_human").await;
    assert_eq!(
        anon.query("SELECT * FROM keyturn.audit($1)", &[&p.id])
            .await
            .unwrap()
            .len(),
        0
    );
    let other = World::new("admin").await;
    assert_eq!(
        other
            .human
            .query("SELECT * FROM keyturn.audit($1)", &[&p.id])
            .await
            .unwrap()
            .len(),
        0
    );
    let su = connect("postgres").await;
    assert_eq!(
        su.query("SELECT * FROM keyturn.audit($1)", &[&p.id])
            .await
            .unwrap()
            .len(),
        5
    );
}

#[tokio::test]
async fn test_event_and_usage_are_append_only_even_for_superuser() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    let su = &w.superuser;
    for sql in [
        "UPDATE keyturn.event SET to_status = 'failed' WHERE action_id = $1",
        "DELETE FROM keyturn.event WHERE action_id = $1",
        "UPDATE keyturn.usage SET tool = 'x' WHERE action_id = $1",
        "DELETE FROM keyturn.usage WHERE action_id = $1",
        "DELETE FROM keyturn.action WHERE id = $1",
    ] {
        assert!(
            su.execute(sql, &[&p.id]).await.is_err(),
            "superuser: {sql} must be refused"
        );
    }
    assert!(su.batch_execute("TRUNCATE keyturn.event").await.is_err());
    assert!(su.batch_execute("TRUNCATE keyturn.usage").await.is_err());
    assert_eq!(w.event_rows(p.id).await, 2);
    assert_eq!(w.usage_rows(p.id).await, 1);
}

#[tokio::test]
async fn test_status_graph_and_proposal_columns_are_guarded() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    let su = &w.superuser;
    for (sql, why) in [
        (
            "UPDATE keyturn.action SET params = '{}' WHERE id = $1",
            "params",
        ),
        (
            "UPDATE keyturn.action SET params_hash = 'x' WHERE id = $1",
            "params_hash",
        ),
        (
            "UPDATE keyturn.action SET expires_at = expires_at + interval '1 day' WHERE id = $1",
            "expires_at",
        ),
        (
            "UPDATE keyturn.action SET principal = 'someone' WHERE id = $1",
            "principal",
        ),
        (
            "UPDATE keyturn.action SET status = 'executing' WHERE id = $1",
            "pending -> executing",
        ),
        (
            "UPDATE keyturn.action SET status = 'leased' WHERE id = $1",
            "pending -> leased",
        ),
        (
            "UPDATE keyturn.action SET status = 'uncertain' WHERE id = $1",
            "pending -> uncertain",
        ),
    ] {
        assert!(
            su.execute(sql, &[&p.id]).await.is_err(),
            "{why} must be refused"
        );
    }
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    for to in ["pending", "queued", "failed", "cancelled", "uncertain"] {
        let r = su
            .execute(
                "UPDATE keyturn.action SET status = $2::text::keyturn.status WHERE id = $1",
                &[&p.id, &to],
            )
            .await;
        assert!(r.is_err(), "succeeded -> {to} must be refused");
    }
    assert_eq!(w.status(p.id).await, "succeeded");
    assert_eq!(
        w.event_rows(p.id).await,
        2,
        "one event per status change, creation included"
    );
}

const STATUSES: &[&str] = &[
    "pending",
    "queued",
    "leased",
    "executing",
    "succeeded",
    "failed",
    "uncertain",
    "rejected",
    "rejected_tampered",
    "expired",
    "cancelled",
    "conflict",
    "invalidated",
    "superseded",
];

/// The graph of docs/concepts.md, edge by edge.
fn contract_allows(from: &str, to: &str) -> bool {
    match from {
        "pending" => [
            "expired",
            "invalidated",
            "rejected_tampered",
            "succeeded",
            "conflict",
            "failed",
            "queued",
            "rejected",
            "cancelled",
            "superseded",
        ]
        .contains(&to),
        "queued" => ["leased", "cancelled", "invalidated"].contains(&to),
        // leased -> failed: begin_dispatch's deterministic failure (an
        // approved attachment's metadata cannot be read), nothing sent.
        "leased" => ["executing", "queued", "cancelled", "invalidated", "failed"].contains(&to),
        // invalidated: an upstream MCP tool's drift, found right before the
        // call (keyturn.check_upstream_tool), nothing sent.
        "executing" => ["succeeded", "failed", "uncertain", "queued", "invalidated"].contains(&to),
        "uncertain" => ["succeeded", "failed"].contains(&to),
        _ => false,
    }
}

/// The changes only an approval makes: a table write gets 42501 for them,
/// however legal they are in the graph.
fn needs_approval(from: &str, to: &str) -> bool {
    from == "pending" && ["queued", "succeeded", "conflict", "failed"].contains(&to)
}

#[tokio::test]
async fn test_status_graph_matches_the_contract_for_every_pair() {
    // Drive a real row through each status (as superuser, through the guard) and
    // try every transition out of it inside a rolled-back transaction.
    // A lease would move the hand-made queued row on under our feet.
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let su = connect("postgres").await;
    for from in STATUSES {
        let p = w
            .propose(&t, json!({"channel": "c", "text": "t"}))
            .await
            .unwrap();
        // Reach `from` along legal edges. Leaving pending for queued (and on
        // to dispatch) takes a real approval; the rest is written directly.
        // conflict is an sql write's outcome only: no webhook action has it.
        if *from == "conflict" {
            continue;
        }
        let approved = [
            "queued",
            "leased",
            "executing",
            "uncertain",
            "succeeded",
            "failed",
        ];
        if approved.contains(from) {
            assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        }
        let path: &[&str] = match *from {
            "pending" | "queued" => &[],
            "leased" => &["leased"],
            "executing" => &["leased", "executing"],
            "uncertain" => &["leased", "executing", "uncertain"],
            "succeeded" => &["leased", "executing", "succeeded"],
            "failed" => &["leased", "executing", "failed"],
            other => std::slice::from_ref(STATUSES.iter().find(|s| **s == other).unwrap()),
        };
        for step in path {
            su.execute(
                "UPDATE keyturn.action SET status = $2::text::keyturn.status WHERE id = $1",
                &[&p.id, step],
            )
            .await
            .unwrap_or_else(|e| panic!("legal step to {step} refused: {e}"));
        }
        for to in STATUSES {
            if to == from {
                continue;
            }
            su.batch_execute("BEGIN").await.unwrap();
            let r = su
                .execute(
                    "UPDATE keyturn.action SET status = $2::text::keyturn.status WHERE id = $1",
                    &[&p.id, to],
                )
                .await;
            su.batch_execute("ROLLBACK").await.unwrap();
            if needs_approval(from, to) {
                assert_eq!(sqlstate(r), "42501", "{from} -> {to} needs an approval");
            } else {
                assert_eq!(r.is_ok(), contract_allows(from, to), "{from} -> {to}");
            }
        }
    }
}

/// Conformance pass of 0.3.0: since the chain, a transaction's events are
/// written at its commit, and keyturn.audit showed a transaction none of
/// its own (a flow and its audit read in one transaction, rolled back at
/// the end as pgTAP does, found no events). audit now shows them after the
/// committed ones, in order; the rollback leaves nothing.
#[tokio::test]
async fn test_a_transaction_sees_its_own_events_in_audit() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    // One login for both sides, as a pooled application (PostgREST's
    // authenticator) has: NOINHERIT, switching roles per request.
    let login = unique("authenticator");
    w.superuser
        .batch_execute(&format!(
            "CREATE ROLE {login} LOGIN NOINHERIT; GRANT app_agent, app_human TO {login}"
        ))
        .await
        .unwrap();
    let su = connect(&login).await;
    let identity = format!(
        "SELECT set_config('keyturn.tenant', '{}', true), set_config('keyturn.principal', '{}', true), \
                set_config('keyturn.session', '{}', true)",
        w.tenant, w.principal, w.session
    );
    su.batch_execute(&format!("BEGIN; SET LOCAL ROLE app_agent; {identity}"))
        .await
        .unwrap();
    let r = su
        .query_one(
            "SELECT action_id, token FROM keyturn.propose($1, $2)",
            &[&t, &json!({"channel": "c", "text": "in one transaction"})],
        )
        .await
        .unwrap();
    let (id, token): (uuid::Uuid, String) = (r.get(0), r.get(1));
    let steps = |rows: Vec<tokio_postgres::Row>| -> Vec<(Option<String>, String, String)> {
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    let audit = "SELECT from_status, to_status, db_role FROM keyturn.audit($1)";
    assert_eq!(
        steps(su.query(audit, &[&id]).await.unwrap()),
        [(None, "pending".to_owned(), "app_agent".to_owned())]
    );
    su.batch_execute("RESET ROLE; SET LOCAL ROLE app_human")
        .await
        .unwrap();
    su.batch_execute(&identity).await.unwrap();
    let status: String = su
        .query_one("SELECT status FROM keyturn.approve($1, $2)", &[&id, &token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "queued");
    assert_eq!(
        steps(su.query(audit, &[&id]).await.unwrap()),
        [
            (None, "pending".to_owned(), "app_agent".to_owned()),
            (
                Some("pending".to_owned()),
                "queued".to_owned(),
                "app_human".to_owned()
            )
        ]
    );
    let in_table: i64 = su
        .query_one(
            "SELECT count(*) FROM keyturn.event WHERE action_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(in_table, 0, "written into the chain at the commit");
    su.batch_execute("ROLLBACK").await.unwrap();
    let after: i64 = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.event WHERE action_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, 0, "nothing of a rolled-back transaction");
}
