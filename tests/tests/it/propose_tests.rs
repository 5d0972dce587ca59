//! docs/sql-api.md: propose fails closed.

use keyturn_tests::*;
use serde_json::{json, Value};

fn msg(channel: &str) -> Value {
    json!({"channel": channel, "text": "hello"})
}

#[tokio::test]
async fn test_unknown_disabled_and_read_tools_are_refused() {
    let w = World::new("member").await;
    assert_eq!(
        sqlstate(w.propose(&unique("ghost"), msg("c")).await),
        "42704"
    );
    assert_eq!(
        sqlstate(propose_on(&w.agent, "", msg("c"), json!({})).await),
        "42704"
    );
    let t = w.webhook_tool(json!({})).await;
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&t])
        .await
        .unwrap();
    assert_eq!(sqlstate(w.propose(&t, msg("c")).await), "42704");
    let read = w.tool("lookup", json!({"kind": "read"})).await;
    assert_eq!(sqlstate(w.propose(&read, json!({})).await), "22023");
    assert_eq!(w.actions().await, 0);
}

#[tokio::test]
async fn test_no_grant_is_42501() {
    let w = World::new("approver").await;
    let name = unique("ungranted");
    w.admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &name,
                &json!({"executor": "external", "provider": "webhook"}),
            ],
        )
        .await
        .unwrap();
    assert_eq!(sqlstate(w.propose(&name, json!({})).await), "42501");
    // A grant in another tenant is not a grant here.
    let other = World::new("member").await;
    other
        .admin
        .execute(
            "SELECT keyturn.grant_tool($1, $2, $3)",
            &[&other.tenant, &w.principal, &name],
        )
        .await
        .unwrap();
    assert_eq!(sqlstate(w.propose(&name, json!({})).await), "42501");
    assert_eq!(w.actions().await, 0);
}

#[tokio::test]
async fn test_params_failing_schema_are_22023() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let bad = [
        json!({"channel": "c"}),                          // required missing
        json!({"channel": "c", "text": "t", "extra": 1}), // additionalProperties false
        json!({"channel": 5, "text": "t"}),               // wrong type
        json!({"channel": "c", "text": "x".repeat(501)}), // maxLength
        json!(["channel", "text"]),                       // not an object
        json!("text"),
    ];
    for p in bad {
        assert_eq!(sqlstate(w.propose(&t, p.clone()).await), "22023", "{p}");
    }
    assert_eq!(
        sqlstate(
            w.agent
                .query("SELECT * FROM keyturn.propose($1, NULL)", &[&t])
                .await
        ),
        "22023"
    );
    assert_eq!(w.actions().await, 0);
    w.propose(&t, msg("ok")).await.expect("valid params");
}

#[tokio::test]
async fn test_blast_radius_external_targets() {
    let w = World::new("member").await;
    let t = w
        .tool(
            "mail",
            json!({"executor": "external", "provider": "smtp", "targets_param": "to", "max_targets": 2,
                   "summary": "Email {to} about {subject}",
                   "params_schema": {"type": "object", "required": ["to", "subject"],
                     "properties": {"to": {"type": "array", "items": {"type": "string", "format": "email"}},
                                    "subject": {"type": "string"}}}}),
        )
        .await;
    let three = json!({"to": ["a@x.io", "b@x.io", "c@x.io"], "subject": "s"});
    assert_eq!(sqlstate(w.propose(&t, three).await), "22023");
    let none = json!({"to": [], "subject": "s"});
    assert_eq!(sqlstate(w.propose(&t, none).await), "22023");
    let bad_email = json!({"to": ["not-an-email"], "subject": "s"});
    assert_eq!(sqlstate(w.propose(&t, bad_email).await), "22023");
    w.propose(&t, json!({"to": ["a@x.io", "b@x.io"], "subject": "s"}))
        .await
        .expect("two targets fit");
    assert_eq!(w.actions().await, 1);
}

#[tokio::test]
async fn test_blast_radius_sql_targets() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({"max_targets": 2})).await;
    let owner = unique("owner");
    let deals = w.deals(&owner, 3).await;
    let r = w
        .propose(
            &t,
            json!({"where": {"owner": owner}, "set": {"stage": "won"}}),
        )
        .await;
    assert_eq!(sqlstate(r), "22023", "3 rows > max_targets 2");
    let r = w
        .propose(&t, json!({"where": {"id": deals}, "set": {"stage": "won"}}))
        .await;
    assert_eq!(sqlstate(r), "22023", "3 ids > max_targets 2");
    let r = w
        .propose(
            &t,
            json!({"where": {"owner": unique("nobody")}, "set": {"stage": "won"}}),
        )
        .await;
    assert_eq!(sqlstate(r), "22023", "zero rows");
    let p = w
        .propose(
            &t,
            json!({"where": {"id": [deals[0], deals[1]]}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    // Each target's key and before-state version are stored.
    let stored = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.action_target t JOIN crm.deal d ON d.id::text = t.key \
         WHERE t.action_id = $1 AND t.version = d.xmin::text",
        &[&p.id],
    )
    .await;
    assert_eq!(stored, 2);
    for d in deals {
        assert_eq!(w.writes(d).await, 0, "propose writes nothing");
    }
}

#[tokio::test]
async fn test_other_tenants_row_is_invisible_at_propose() {
    let a = World::new("member").await;
    let b = World::new("member").await;
    let t = a.deal_tool(json!({})).await;
    let theirs = b.deals(&b.principal, 1).await[0];
    let r = a
        .propose(
            &t,
            json!({"where": {"id": theirs}, "set": {"stage": "lost"}}),
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    let r = a
        .propose(
            &t,
            json!({"where": {"owner": b.principal}, "set": {"stage": "lost"}}),
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    assert_eq!(b.stage_of(theirs).await, "lead");
    assert_eq!(a.actions().await, 0);
}

#[tokio::test]
async fn test_sql_injection_in_form_is_refused_and_runs_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let bad = [
        json!({"where": {"stage; DROP TABLE crm.deal": "x"}, "set": {"stage": "won"}}),
        json!({"where": {"id": deal}, "set": {"stage = 'won', owner": "x"}}),
        json!({"where": {"id": deal}, "set": {"owner": "mallory"}}), // not settable
        json!({"where": {"tenant": w.tenant}, "set": {"stage": "won"}}), // not filterable
        json!({"where": {"id": format!("{deal} OR 1=1")}, "set": {"stage": "won"}}),
        json!({"where": {"id": deal}, "set": {"stage": "won"}, "sql": "DELETE FROM crm.deal"}),
        json!({"where": {}, "set": {"stage": "won"}}),
        json!({"where": {"id": deal}, "set": {}}),
        json!({"where": {"id": {"$gt": 0}}, "set": {"stage": "won"}}),
        json!({"set": {"stage": "won"}}),
    ];
    for p in bad {
        assert_eq!(sqlstate(w.propose(&t, p.clone()).await), "22023", "{p}");
    }
    assert_eq!(w.actions().await, 0);
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM crm.deal WHERE id = $1",
            &[&deal]
        )
        .await,
        1
    );
    assert_eq!(w.writes(deal).await, 0);
    // An injection attempt in a value is just a value: bound as a parameter,
    // refused by the CHECK constraint at approve, and the table survives.
    let p = w
        .propose(
            &t,
            json!({"where": {"id": deal}, "set": {"stage": "won'; DROP TABLE crm.deal; --"}}),
        )
        .await
        .unwrap();
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "failed");
    assert_eq!(result.unwrap()["sqlstate"], "23514");
    assert_eq!(w.stage_of(deal).await, "lead");
}

#[tokio::test]
async fn test_origin_is_checked_and_cancelled_origin_refused() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    for origin in [
        json!({"conversation": "c"}),
        json!({"conversation_id": 5}),
        json!({"evidence": "e1"}),
        json!([]),
    ] {
        assert_eq!(
            sqlstate(propose_on(&w.agent, &t, msg("c"), origin.clone()).await),
            "22023",
            "{origin}"
        );
    }
    let conv = unique("conv");
    // Evidence ids name evidence recorded for the principal
    // (evidence_tests); one the person recorded:
    let doc: uuid::Uuid = w
        .human
        .query_one(
            "SELECT keyturn.record_evidence('document', 'q3.pdf', repeat('0', 64))",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let origin =
        json!({"conversation_id": conv, "turn_id": "t1", "message_id": "m1", "evidence": [doc]});
    let p = propose_on(&w.agent, &t, msg("c"), origin.clone())
        .await
        .unwrap();
    let stored: Value = w
        .superuser
        .query_one("SELECT origin FROM keyturn.action WHERE id = $1", &[&p.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, origin, "origin is stored");
    let n: i32 = w
        .agent
        .query_one("SELECT keyturn.cancel_origin($1)", &[&conv])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(w.status(p.id).await, "cancelled");
    assert_eq!(
        sqlstate(propose_on(&w.agent, &t, msg("c"), json!({"conversation_id": conv})).await),
        "55000"
    );
    // Another principal's conversation of the same name is unaffected.
    let (other, agent2) = w.other("member", "app_agent", "s2").await;
    w.grant(&other, &t).await;
    propose_on(&agent2, &t, msg("c"), json!({"conversation_id": conv}))
        .await
        .expect("other principal unaffected");
}

#[tokio::test]
async fn test_rate_limit_counts_created_proposals_only() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"rate_limit": {"max": 2, "per": "1 hour"}}))
        .await;
    // Refused proposals do not count.
    for _ in 0..3 {
        assert_eq!(
            sqlstate(w.propose(&t, json!({"channel": "c"})).await),
            "22023"
        );
    }
    let first = w.propose(&t, msg("a")).await.expect("first within limit");
    w.human
        .query_one("SELECT keyturn.reject($1, $2)", &[&first.id, &first.token])
        .await
        .unwrap();
    w.propose(&t, msg("b")).await.expect("second within limit");
    // Whatever their status, both count.
    assert_eq!(sqlstate(w.propose(&t, msg("c")).await), "54000");
    assert_eq!(w.actions().await, 2);
    // Per principal: another principal has its own window.
    let (other, agent2) = w.other("member", "app_agent", "s2").await;
    w.grant(&other, &t).await;
    propose_on(&agent2, &t, msg("d"), json!({}))
        .await
        .expect("separate window per principal");
}

#[tokio::test]
async fn test_summary_is_rendered_by_the_server() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "deploy done"}))
        .await
        .unwrap();
    // A value with spaces is quoted, so it cannot pass for the template's prose.
    assert_eq!(p.summary, "Notify ops: \"deploy done\"");
    let s: String = w
        .agent
        .query_one("SELECT summary FROM keyturn.action_status($1)", &[&p.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(s, p.summary);
    // The agent cannot supply its own summary, in params or in origin.
    let r = w
        .propose(
            &t,
            json!({"channel": "ops", "text": "x", "summary": "Harmless"}),
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    let r = propose_on(&w.agent, &t, msg("ops"), json!({"summary": "Harmless"})).await;
    assert_eq!(sqlstate(r), "22023");
    // A value that looks like a placeholder is printed, not expanded.
    let p = w
        .propose(&t, json!({"channel": "{text}", "text": "{channel}"}))
        .await
        .unwrap();
    assert_eq!(p.summary, "Notify {text}: {channel}");
    // sql tool template with {set.stage} and {count}.
    let d = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let p = w
        .propose(&d, json!({"where": {"id": deals}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    assert_eq!(p.summary, "Set stage won on 2 deal(s)");
}

#[tokio::test]
async fn test_deep_and_large_json_get_a_clear_22023() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"params_schema": {"type": "object", "additionalProperties": true}}))
        .await;
    let deep = format!("{{\"channel\": {}1{}}}", "[".repeat(200), "]".repeat(200));
    let r = w
        .agent
        .query(
            "SELECT * FROM keyturn.propose($1, $2::text::jsonb)",
            &[&t, &deep],
        )
        .await;
    assert_eq!(sqlstate(r), "22023", "200 levels deep");
    let large = json!({"channel": "c", "text": "x".repeat(2 * 1024 * 1024)});
    assert_eq!(sqlstate(w.propose(&t, large).await), "22023", "2 MB");
    let wide = json!({"channel": "c", "items": (0..200_000).collect::<Vec<_>>()});
    assert_eq!(
        sqlstate(w.propose(&t, wide).await),
        "22023",
        "over 1 MB of numbers"
    );
    assert_eq!(w.actions().await, 0);
    // The same shapes, small, are fine: the refusals above are about size and depth.
    w.propose(&t, json!({"channel": [[[[1]]]], "text": "x".repeat(1000)}))
        .await
        .expect("small nested params");
    let deep_origin = json!({"evidence": [json!([[[["x"]]]])]});
    assert_eq!(
        sqlstate(propose_on(&w.agent, &t, msg("c"), deep_origin).await),
        "22023"
    );
}
