//! The operator console's reads (docs/sql-api.md, "The operator console"):
//! counts by status with every status listed, filtered lists of actions,
//! the tools with their enabled state and the standing approvals, for the
//! operator and the platform admin only, and never a param value or a
//! summary.

use keyturn_tests::*;
use serde_json::json;

#[tokio::test]
async fn test_counts_and_lists_follow_the_filters() {
    let w = World::new("approver").await;
    let t = w.webhook_tool(json!({})).await;
    let other = w.webhook_tool(json!({})).await;
    let secret = "the launch code is 0000";
    let a = w
        .propose(&t, json!({"channel": "c", "text": secret}))
        .await
        .unwrap();
    let b = w
        .propose(&t, json!({"channel": "c", "text": "two"}))
        .await
        .unwrap();
    let c = w
        .propose(&other, json!({"channel": "c", "text": "three"}))
        .await
        .unwrap();
    w.approve(&a).await.unwrap();
    w.human
        .query_one("SELECT keyturn.reject($1, $2, 'no')", &[&b.id, &b.token])
        .await
        .unwrap();
    let op = connect("app_operator").await;

    let counts = op
        .query(
            "SELECT status, actions FROM keyturn.action_counts(tenant => $1, tool => $2)",
            &[&w.tenant, &t],
        )
        .await
        .unwrap();
    let statuses: i64 = op
        .query_one(
            "SELECT count(*) FROM unnest(enum_range(NULL::keyturn.status))",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(counts.len() as i64, statuses, "every status, zeros too");
    let count = |s: &str| {
        counts
            .iter()
            .find(|r| r.get::<_, String>(0) == s)
            .map(|r| r.get::<_, i64>(1))
            .unwrap()
    };
    assert_eq!(count("pending"), 0);
    assert_eq!(count("queued"), 1);
    assert_eq!(count("rejected"), 1);
    assert_eq!(
        counts[0].get::<_, String>(0),
        "pending",
        "the lifecycle's order"
    );
    let all: i64 = op
        .query_one(
            "SELECT sum(actions)::bigint FROM keyturn.action_counts(tenant => $1)",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(all, 3);

    let found = op
        .query(
            "SELECT action_id, tool, status FROM keyturn.find_actions(tenant => $1)",
            &[&w.tenant],
        )
        .await
        .unwrap();
    let ids: Vec<uuid::Uuid> = found.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, vec![c.id, b.id, a.id], "newest first");
    let pending = op
        .query(
            "SELECT action_id FROM keyturn.find_actions(status => 'pending', tenant => $1)",
            &[&w.tenant],
        )
        .await
        .unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].get::<_, uuid::Uuid>(0), c.id);
    let one = op
        .query(
            "SELECT status FROM keyturn.find_actions(id => $1)",
            &[&a.id],
        )
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].get::<_, String>(0), "queued");
    let none = op
        .query(
            "SELECT 1 FROM keyturn.find_actions(tenant => $1, since => now() + interval '1 hour')",
            &[&w.tenant],
        )
        .await
        .unwrap();
    assert!(none.is_empty());
    let limited = op
        .query(
            "SELECT 1 FROM keyturn.find_actions(tenant => $1, max_rows => 2)",
            &[&w.tenant],
        )
        .await
        .unwrap();
    assert_eq!(limited.len(), 2);

    // Nothing an agent wrote: the rows as JSON hold no param value.
    let rows: String = op
        .query_one(
            "SELECT string_agg(to_jsonb(f)::text, ' ') FROM keyturn.find_actions(tenant => $1) f",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!rows.contains("launch code"), "{rows}");

    // Bad filters say what is wrong.
    for (sql, state) in [
        ("SELECT * FROM keyturn.find_actions(status => 'done')", "22023"),
        ("SELECT * FROM keyturn.find_actions(max_rows => 0)", "22023"),
        ("SELECT * FROM keyturn.find_actions(max_rows => 501)", "22023"),
        (
            "SELECT * FROM keyturn.action_counts(since => now(), until => now() - interval '1 day')",
            "22023",
        ),
    ] {
        assert_eq!(sqlstate(op.query(sql, &[]).await), state, "{sql}");
    }
}

#[tokio::test]
async fn test_tools_and_standing_approvals_show_what_the_console_shows() {
    let w = World::new("approver").await;
    let t = w.webhook_tool(json!({"delegable": true})).await;
    let d = w
        .delegate(
            &t,
            json!({"params": {"channel": {"any": true}, "text": {"any": true}}}),
            5,
            "1 hour",
        )
        .await
        .unwrap();
    let op = connect("app_operator").await;
    let tool = op
        .query_one(
            "SELECT version, enabled, executor, effect, approval FROM keyturn.tools() WHERE tool = $1",
            &[&t],
        )
        .await
        .unwrap();
    assert!(tool.get::<_, bool>(1));
    assert_eq!(
        tool.get::<_, Option<String>>(2).as_deref(),
        Some("external")
    );

    // The kill switch, as the platform admin, shows at once.
    w.admin
        .query_one("SELECT keyturn.set_tool_enabled($1, false)", &[&t])
        .await
        .unwrap();
    let enabled: bool = op
        .query_one("SELECT enabled FROM keyturn.tools() WHERE tool = $1", &[&t])
        .await
        .unwrap()
        .get(0);
    assert!(!enabled);

    let rows = op
        .query(
            "SELECT delegation_id, principal, uses, max_uses, ended FROM keyturn.standing_approvals($1)",
            &[&w.tenant],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, uuid::Uuid>(0), d);
    assert_eq!(rows[0].get::<_, String>(1), w.principal);
    assert_eq!(rows[0].get::<_, i32>(3), 5);
    assert_eq!(rows[0].get::<_, Option<String>>(4), None, "live");
    w.human
        .query_one("SELECT keyturn.revoke_delegation($1)", &[&d])
        .await
        .unwrap();
    let ended: Option<String> = op
        .query_one(
            "SELECT ended FROM keyturn.standing_approvals($1)",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended.as_deref(), Some("revoked"));
}

#[tokio::test]
async fn test_only_the_operator_and_the_admin_read_the_console() {
    let w = World::new("admin").await;
    let calls = [
        "SELECT * FROM keyturn.action_counts()",
        "SELECT * FROM keyturn.find_actions()",
        "SELECT * FROM keyturn.tools()",
        "SELECT * FROM keyturn.standing_approvals()",
    ];
    for sql in calls {
        // A tenant's admin member is a person, not the console's operator.
        assert_eq!(
            sqlstate(w.human.query(sql, &[]).await),
            "42501",
            "human: {sql}"
        );
        assert_eq!(
            sqlstate(w.agent.query(sql, &[]).await),
            "42501",
            "agent: {sql}"
        );
        let dispatcher = connect("app_dispatcher").await;
        assert_eq!(
            sqlstate(dispatcher.query(sql, &[]).await),
            "42501",
            "dispatcher: {sql}"
        );
        w.admin.query(sql, &[]).await.unwrap();
        connect("app_operator").await.query(sql, &[]).await.unwrap();
    }
}
