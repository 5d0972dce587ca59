//! docs/sql-api.md: preview, reject, end_session, cancel_origin.

use keyturn_tests::*;
use serde_json::{json, Value};

async fn preview(c: &impl Sql, p: &Proposal) -> Result<Value, tokio_postgres::Error> {
    c.query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await
        .map(|r| r.get(0))
}

async fn reject(c: &impl Sql, p: &Proposal) -> Result<String, tokio_postgres::Error> {
    c.query_one(
        "SELECT keyturn.reject($1, $2, 'not today')",
        &[&p.id, &p.token],
    )
    .await
    .map(|r| r.get(0))
}

#[tokio::test]
async fn test_preview_shows_the_card_with_current_values_and_changes_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    w.superuser
        .execute(
            "UPDATE crm.deal SET stage = 'qualified', amount = 10 WHERE id = $1",
            &[&deals[1]],
        )
        .await
        .unwrap();
    let params = json!({"where": {"id": deals}, "set": {"stage": "won", "amount": 4.5}});
    let p = w.propose(&t, params.clone()).await.unwrap();
    let writes = w.writes(deals[0]).await + w.writes(deals[1]).await;
    let card = preview(&w.human, &p).await.unwrap();
    assert_eq!(card["summary"], "Set stage won on 2 deal(s)");
    assert_eq!(card["tool"], t.as_str());
    assert_eq!(card["effect"], "reversible");
    assert_eq!(card["status"], "pending");
    assert!(card["expires_at"].is_string());
    assert_eq!(card["params"], params);
    let targets = card["targets"].as_array().expect("targets for sql tools");
    assert_eq!(targets.len(), 2);
    let t1 = targets
        .iter()
        .find(|x| x["key"].as_str() == Some(&*deals[1].to_string()))
        .expect("target per key");
    assert_eq!(t1["before"]["stage"], "qualified");
    assert_eq!(t1["before"]["amount"].as_f64(), Some(10.0));
    assert_eq!(t1["after"]["stage"], "won");
    let t0 = targets
        .iter()
        .find(|x| x["key"].as_str() == Some(&*deals[0].to_string()))
        .unwrap();
    assert_eq!(t0["before"]["stage"], "lead");
    // Read-only: nothing written, status unchanged, no event.
    assert_eq!(w.writes(deals[0]).await + w.writes(deals[1]).await, writes);
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(w.event_rows(p.id).await, 1);
    // Works in any status.
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    assert_eq!(preview(&w.human, &p).await.unwrap()["status"], "succeeded");
}

#[tokio::test]
async fn test_preview_checks_token_identity_and_agents_but_not_grant() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "hi"}))
        .await
        .unwrap();
    let card = preview(&w.human, &p).await.unwrap();
    assert_eq!(card["params"], json!({"channel": "ops", "text": "hi"}));
    assert!(
        card.get("targets").is_none() || card["targets"].is_null(),
        "no targets for external tools"
    );
    let wrong = Proposal {
        token: "wrong".into(),
        ..p.clone()
    };
    assert_eq!(sqlstate(preview(&w.human, &wrong).await), "55000");
    let unknown = Proposal {
        id: uuid::Uuid::new_v4(),
        ..p.clone()
    };
    assert_eq!(sqlstate(preview(&w.human, &unknown).await), "55000");
    assert_eq!(sqlstate(preview(&w.agent, &p).await), "42501");
    let anon = connect("app_human").await;
    assert_eq!(sqlstate(preview(&anon, &p).await), "42501");
    let other_session = Conn::connect(
        "app_human",
        Identity::gucs(&w.tenant, &w.principal, "elsewhere"),
    )
    .await;
    assert_eq!(
        sqlstate(preview(&other_session, &p).await),
        "42501",
        "bound context"
    );
    // The grant is excepted: after a revoke, preview still works (approve would not).
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    assert_eq!(preview(&w.human, &p).await.unwrap()["status"], "pending");
}

#[tokio::test]
async fn test_reject_then_approve_returns_rejected_and_writes_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    assert_eq!(
        sqlstate(
            reject(
                &w.human,
                &Proposal {
                    token: "bad".into(),
                    ..p.clone()
                }
            )
            .await
        ),
        "55000"
    );
    assert_eq!(sqlstate(reject(&w.agent, &p).await), "42501");
    assert_eq!(reject(&w.human, &p).await.unwrap(), "rejected");
    assert_eq!(w.approve(&p).await.unwrap().0, "rejected");
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(w.usage_rows(p.id).await, 0);
    assert_eq!(
        reject(&w.human, &p).await.unwrap(),
        "rejected",
        "reject is idempotent"
    );
    // Reject of an action that already left pending returns its current status.
    let p2 = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "lost"}}))
        .await
        .unwrap();
    assert_eq!(w.approve(&p2).await.unwrap().0, "succeeded");
    assert_eq!(reject(&w.human, &p2).await.unwrap(), "succeeded");
    assert_eq!(w.status(p2.id).await, "succeeded");
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_end_session_cancels_only_that_sessions_actions_of_the_caller() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let params = json!({"channel": "c", "text": "t"});
    let mine1 = w.propose(&t, params.clone()).await.unwrap();
    let mine2 = w.propose(&t, params.clone()).await.unwrap();
    let queued = w.propose(&t, params.clone()).await.unwrap();
    assert_eq!(w.approve(&queued).await.unwrap().0, "queued");
    let done = w.propose(&t, params.clone()).await.unwrap();
    w.human
        .query_one("SELECT keyturn.reject($1, $2)", &[&done.id, &done.token])
        .await
        .unwrap();
    // Same principal, another session.
    let s2 = Conn::connect(
        "app_agent",
        Identity::gucs(&w.tenant, &w.principal, "session-two"),
    )
    .await;
    let other_session = propose_on(&s2, &t, params.clone(), json!({}))
        .await
        .unwrap();
    // Another principal, same session name.
    let (other, agent2) = w.other("member", "app_agent", &w.session).await;
    w.grant(&other, &t).await;
    let others = propose_on(&agent2, &t, params.clone(), json!({}))
        .await
        .unwrap();

    let n: i32 = w
        .human
        .query_one("SELECT keyturn.end_session()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3, "two pending and one queued");
    for id in [mine1.id, mine2.id, queued.id] {
        assert_eq!(w.status(id).await, "cancelled");
    }
    assert_eq!(w.status(done.id).await, "rejected");
    assert_eq!(w.status(other_session.id).await, "pending");
    assert_eq!(w.status(others.id).await, "pending");
    // A cancelled action cannot be approved afterwards.
    assert_eq!(w.approve(&mine1).await.unwrap().0, "cancelled");
    // Naming the other session explicitly (the agent may call it too).
    let n: i32 = w
        .agent
        .query_one("SELECT keyturn.end_session('session-two')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(w.status(other_session.id).await, "cancelled");
    assert_eq!(w.status(others.id).await, "pending");
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_cancel_origin_cancels_by_conversation_for_the_caller_only() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let params = json!({"channel": "c", "text": "t"});
    let conv = unique("conv");
    let a = propose_on(
        &w.agent,
        &t,
        params.clone(),
        json!({"conversation_id": conv}),
    )
    .await
    .unwrap();
    let b = propose_on(
        &w.agent,
        &t,
        params.clone(),
        json!({"conversation_id": conv, "turn_id": "2"}),
    )
    .await
    .unwrap();
    let unrelated = propose_on(
        &w.agent,
        &t,
        params.clone(),
        json!({"conversation_id": "other"}),
    )
    .await
    .unwrap();
    let (other, agent2) = w.other("member", "app_agent", "s2").await;
    w.grant(&other, &t).await;
    let theirs = propose_on(
        &agent2,
        &t,
        params.clone(),
        json!({"conversation_id": conv}),
    )
    .await
    .unwrap();
    let n: i32 = w
        .agent
        .query_one("SELECT keyturn.cancel_origin($1)", &[&conv])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    assert_eq!(w.status(a.id).await, "cancelled");
    assert_eq!(w.status(b.id).await, "cancelled");
    assert_eq!(w.status(unrelated.id).await, "pending");
    assert_eq!(w.status(theirs.id).await, "pending");
    assert_eq!(
        sqlstate(
            propose_on(
                &w.agent,
                &t,
                params.clone(),
                json!({"conversation_id": conv})
            )
            .await
        ),
        "55000"
    );
    propose_on(&agent2, &t, params, json!({"conversation_id": conv}))
        .await
        .expect("other principal's conversation lives");
    assert_eq!(
        sqlstate(w.agent.query("SELECT keyturn.cancel_origin('')", &[]).await),
        "22023"
    );
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_cancel_origin_cancels_queued_actions_too() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let conv = unique("conv");
    let p = propose_on(
        &w.agent,
        &t,
        json!({"channel": "c", "text": "t"}),
        json!({"conversation_id": conv}),
    )
    .await
    .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    let n: i32 = w
        .agent
        .query_one("SELECT keyturn.cancel_origin($1)", &[&conv])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "queued actions of the conversation are cancelled");
    assert_eq!(w.status(p.id).await, "cancelled");
    assert_work_list_in_step(&w.superuser).await;
}

/// Found testing a red-team finding of 0.3.0 (docs/security.md, row 78):
/// preview stripped JSON nulls from its whole answer, so from the params and
/// each target's after too. A write that sets a column to NULL showed no
/// change of that column on the card: the person approved a write they
/// were not shown. Only preview's own absent members are left out now.
#[tokio::test]
async fn test_preview_shows_a_null_the_write_sets() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    w.superuser
        .execute(
            "UPDATE crm.deal SET amount = 10 WHERE id = $1",
            &[&deals[0]],
        )
        .await
        .unwrap();
    let params = json!({"where": {"id": deals}, "set": {"stage": "won", "amount": null}});
    let p = w.propose(&t, params.clone()).await.unwrap();
    let card = preview(&w.human, &p).await.unwrap();
    assert_eq!(card["params"], params, "{card}");
    let after = &card["targets"][0]["after"];
    assert!(
        after
            .as_object()
            .is_some_and(|a| a.get("amount") == Some(&Value::Null)),
        "the card's after says amount becomes null: {card}"
    );
    assert_eq!(card["targets"][0]["before"]["amount"].as_f64(), Some(10.0));
    assert!(
        card.get("result").is_none(),
        "absent members stay absent: {card}"
    );
}
