//! docs/sql-api.md: approve — the happy path, replays, and the pre-claim checks.

use keyturn_tests::*;
use serde_json::{json, Value};

fn form(deals: &[i64], stage: &str) -> Value {
    json!({"where": {"id": deals}, "set": {"stage": stage}})
}

#[tokio::test]
async fn test_sql_tool_succeeds_with_rows_keys_and_one_usage_row() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let p = w.propose(&t, form(&deals, "negotiation")).await.unwrap();
    assert_eq!(w.usage_rows(p.id).await, 0);
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "succeeded");
    let result = result.expect("a result");
    assert_eq!(result["rows"], 2);
    let mut keys: Vec<String> = result["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    keys.sort();
    let mut want: Vec<String> = deals.iter().map(|d| d.to_string()).collect();
    want.sort();
    assert_eq!(keys, want);
    for d in &deals {
        assert_eq!(w.stage_of(*d).await, "negotiation");
        assert_eq!(w.writes(*d).await, 1);
    }
    assert_eq!(w.usage_rows(p.id).await, 1);
    // The usage row was written in the same transaction: same tenant/tool.
    let n = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.usage WHERE action_id = $1 AND tenant = $2 AND tool = $3",
        &[&p.id, &w.tenant, &t],
    )
    .await;
    assert_eq!(n, 1);
    // The write ran as the approving role, under its RLS.
    let by: String = w
        .superuser
        .query_one(
            "SELECT by_role FROM crm.deal_writes WHERE deal_id = $1",
            &[&deals[0]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(by, "app_human");
}

#[tokio::test]
async fn test_replay_returns_stored_outcome_without_second_write() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let first = w.approve(&p).await.unwrap();
    // Another connection of the same principal and session replays.
    let again = Conn::connect("app_human", w.identity()).await;
    for _ in 0..3 {
        let replay = approve_on(&again, p.id, &p.token, None).await.unwrap();
        assert_eq!(replay, first);
    }
    assert_eq!(w.writes(deals[0]).await, 1);
    assert_eq!(w.usage_rows(p.id).await, 1);
    let events = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.event WHERE action_id = $1",
        &[&p.id],
    )
    .await;
    assert_eq!(events, 2, "creation + succeeded; replays add nothing");
    // A replay passes the same checks: the wrong token still fails.
    assert_eq!(
        sqlstate(approve_on(&again, p.id, "nope", None).await),
        "55000"
    );
}

#[tokio::test]
async fn test_wrong_token_and_unknown_id_are_55000_and_burn_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let other = w.propose(&t, form(&deals, "lost")).await.unwrap();
    for bad in ["", "x", other.token.as_str(), &p.token[1..]] {
        assert_eq!(
            sqlstate(approve_on(&w.human, p.id, bad, None).await),
            "55000",
            "token {bad:?}"
        );
    }
    assert_eq!(
        sqlstate(
            w.human
                .query("SELECT * FROM keyturn.approve($1, NULL)", &[&p.id])
                .await
        ),
        "55000"
    );
    assert_eq!(
        sqlstate(approve_on(&w.human, uuid::Uuid::new_v4(), &p.token, None).await),
        "55000"
    );
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(w.writes(deals[0]).await, 0);
    assert_eq!(
        w.approve(&p).await.unwrap().0,
        "succeeded",
        "a wrong token never burns a proposal"
    );
}

#[tokio::test]
async fn test_cross_tenant_approval_is_55000_and_changes_nothing() {
    let a = World::new("approver").await;
    let t = a.deal_tool(json!({"approval": "independent"})).await;
    let deals = a.deals(&a.principal, 1).await;
    let p = a.propose(&t, form(&deals, "won")).await.unwrap();
    // An approver of tenant B, granted the same tool in B, holding the right token.
    let b = World::new("approver").await;
    b.grant(&b.principal, &t).await;
    assert_eq!(
        sqlstate(approve_on(&b.human, p.id, &p.token, None).await),
        "55000"
    );
    assert_eq!(
        sqlstate(
            b.human
                .query("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
                .await
        ),
        "55000"
    );
    assert_eq!(
        sqlstate(
            b.human
                .query("SELECT keyturn.reject($1, $2)", &[&p.id, &p.token])
                .await
        ),
        "55000"
    );
    // Same principal name in tenant B is still someone else.
    b.admin
        .execute(
            "SELECT keyturn.add_member($1, $2, 'approver')",
            &[&b.tenant, &a.principal],
        )
        .await
        .unwrap();
    let c = Conn::connect(
        "app_human",
        Identity::gucs(&b.tenant, &a.principal, &a.session),
    )
    .await;
    assert_eq!(
        sqlstate(approve_on(&c, p.id, &p.token, None).await),
        "55000"
    );
    assert_eq!(a.status(p.id).await, "pending");
    assert_eq!(a.writes(deals[0]).await, 0);
    assert_eq!(a.event_rows(p.id).await, 1);
}

#[tokio::test]
async fn test_member_cannot_approve_another_members_action() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let (other, human2) = w.other("member", "app_human", &w.session).await;
    w.grant(&other, &t).await;
    assert_eq!(
        sqlstate(approve_on(&human2, p.id, &p.token, None).await),
        "55000"
    );
    assert_eq!(w.status(p.id).await, "pending");
}

#[tokio::test]
async fn test_self_tool_needs_same_principal_and_session() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let elsewhere = Conn::connect(
        "app_human",
        Identity::gucs(&w.tenant, &w.principal, "another-session"),
    )
    .await;
    assert_eq!(
        sqlstate(approve_on(&elsewhere, p.id, &p.token, None).await),
        "42501"
    );
    // An approver of the same tenant is not "self" either.
    let (appr, human2) = w.other("approver", "app_human", &w.session).await;
    w.grant(&appr, &t).await;
    assert_eq!(
        sqlstate(approve_on(&human2, p.id, &p.token, None).await),
        "42501"
    );
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
}

#[tokio::test]
async fn test_independent_tool_needs_a_different_approver() {
    let w = World::new("approver").await;
    let t = w.deal_tool(json!({"approval": "independent"})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    // Same principal (even with the approver role, same session): 42501.
    assert_eq!(sqlstate(w.approve(&p).await), "42501");
    // A different 'member': the action is not even visible to it.
    let (m, member) = w.other("member", "app_human", "s-m").await;
    w.grant(&m, &t).await;
    assert_eq!(
        sqlstate(approve_on(&member, p.id, &p.token, None).await),
        "55000"
    );
    // A different approver without the grant: 42501.
    let (a, approver) = w.other("approver", "app_human", "s-a").await;
    assert_eq!(
        sqlstate(approve_on(&approver, p.id, &p.token, None).await),
        "42501"
    );
    assert_eq!(w.status(p.id).await, "pending");
    // With the grant, from any session: succeeds, and records who approved.
    w.grant(&a, &t).await;
    let (status, _) = approve_on(&approver, p.id, &p.token, None).await.unwrap();
    assert_eq!(status, "succeeded");
    let by: String = w
        .superuser
        .query_one(
            "SELECT approved_by FROM keyturn.action WHERE id = $1",
            &[&p.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(by, a);
    assert_eq!(w.writes(deals[0]).await, 1);
}

#[tokio::test]
async fn test_approver_without_grant_is_42501() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    // Revoke changes the epoch too, but the pre-claim grant check comes first and raises.
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    assert_eq!(sqlstate(w.approve(&p).await), "42501");
    assert_eq!(w.status(p.id).await, "pending");
}

#[tokio::test]
async fn test_concurrent_approvals_claim_once() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..6 {
        let (tenant, principal, session, p) = (
            w.tenant.clone(),
            w.principal.clone(),
            w.session.clone(),
            p.clone(),
        );
        handles.push(tokio::spawn(async move {
            let c = Conn::connect("app_human", Identity::gucs(&tenant, &principal, &session)).await;
            approve_on(&c, p.id, &p.token, None).await.map(|r| r.0)
        }));
    }
    for h in handles {
        assert_eq!(
            h.await
                .unwrap()
                .expect("READ COMMITTED approvals never raise"),
            "succeeded"
        );
    }
    assert_eq!(w.writes(deals[0]).await, 1);
    assert_eq!(w.usage_rows(p.id).await, 1);
}

#[tokio::test]
async fn test_repeatable_read_loser_gets_40001_or_the_outcome() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let late = Conn::connect("app_human", w.identity()).await;
    let tx = late
        .transaction_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    tx.query_one("SELECT count(*) FROM keyturn.action", &[])
        .await
        .unwrap(); // snapshot taken: pending
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    match approve_on(&tx, p.id, &p.token, None).await {
        Ok((status, _)) => assert_eq!(status, "succeeded"),
        Err(e) => assert_eq!(e.code().map(|c| c.code()), Some("40001"), "{e}"),
    }
    let _ = tx.rollback().await;
    assert_eq!(w.writes(deals[0]).await, 1);
    assert_eq!(w.usage_rows(p.id).await, 1);
}

#[tokio::test]
async fn test_replay_passes_the_same_checks() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    let elsewhere = Conn::connect(
        "app_human",
        Identity::gucs(&w.tenant, &w.principal, "another-session"),
    )
    .await;
    assert_eq!(
        sqlstate(approve_on(&elsewhere, p.id, &p.token, None).await),
        "42501"
    );
    let other = World::new("approver").await;
    assert_eq!(
        sqlstate(approve_on(&other.human, p.id, &p.token, None).await),
        "55000"
    );
    assert_eq!(
        sqlstate(approve_on(&w.agent, p.id, &p.token, None).await),
        "42501"
    );
}

async fn status_times(w: &World, id: uuid::Uuid) -> (std::time::SystemTime, std::time::SystemTime) {
    let r = w
        .agent
        .query_one(
            "SELECT created_at, updated_at FROM keyturn.action_status($1)",
            &[&id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// action_status.updated_at (docs/sql-api.md) moves with every change of the
/// row and stays put on a replay, which changes nothing.
#[tokio::test]
async fn test_updated_at_moves_with_each_change_and_not_on_replay() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let (created, proposed) = status_times(&w, p.id).await;
    assert!(proposed >= created);
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    let (_, settled) = status_times(&w, p.id).await;
    assert!(settled > proposed, "approve must move updated_at");
    w.approve(&p).await.unwrap();
    let (_, replayed) = status_times(&w, p.id).await;
    assert_eq!(replayed, settled, "a replay changes nothing");
}

/// propose_for / approve_for (docs/sql-api.md): the plain calls with the
/// caller's tenant named, for Citus to route by; on one node, exactly them.
#[tokio::test]
async fn test_propose_for_and_approve_for_naming_the_callers_tenant_are_propose_and_approve() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let row = w
        .agent
        .query_one(
            "SELECT action_id, token, status FROM keyturn.propose_for($1, $2, $3)",
            &[&w.tenant, &t, &form(&deals, "won")],
        )
        .await
        .unwrap();
    let (id, token, status): (uuid::Uuid, String, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(status, "pending");
    let row = w
        .human
        .query_one(
            "SELECT status, result FROM keyturn.approve_for($1, $2, $3)",
            &[&w.tenant, &id, &token],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "succeeded");
    assert_eq!(row.get::<_, Option<Value>>(1).unwrap()["rows"], 1);
    assert_eq!(w.stage_of(deals[0]).await, "won");
    assert_eq!(w.usage_rows(id).await, 1);
}

/// preview_for: preview with the caller's tenant named, the same card; another
/// tenant, none, or an agent: 42501.
#[tokio::test]
async fn test_preview_for_is_preview_for_the_callers_own_tenant_only() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let plain: Value = w
        .human
        .query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    let named: Value = w
        .human
        .query_one(
            "SELECT keyturn.preview_for($1, $2, $3)",
            &[&w.tenant, &p.id, &p.token],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(named, plain);
    assert_eq!(named["targets"].as_array().map(Vec::len), Some(2));
    let sql = "SELECT keyturn.preview_for($1, $2, $3)";
    let other = unique("other_tenant");
    for (tenant, code) in [(Some(other.as_str()), "42501"), (None, "22023")] {
        let refused = w.human.query_one(sql, &[&tenant, &p.id, &p.token]).await;
        assert_eq!(sqlstate(refused), code, "preview_for naming {tenant:?}");
    }
    let refused = w.agent.query_one(sql, &[&w.tenant, &p.id, &p.token]).await;
    assert_eq!(
        sqlstate(refused),
        "42501",
        "an agent never previews as a person"
    );
    assert_eq!(w.status(p.id).await, "pending");
}

#[tokio::test]
async fn test_propose_for_and_approve_for_naming_another_tenant_are_refused_before_anything() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let other = unique("other_tenant");
    let before = w.actions().await;
    for (tenant, code) in [(Some(other.as_str()), "42501"), (None, "22023")] {
        let refused = w
            .agent
            .query_one(
                "SELECT action_id FROM keyturn.propose_for($1, $2, $3)",
                &[&tenant, &t, &form(&deals, "won")],
            )
            .await;
        assert_eq!(sqlstate(refused), code, "propose_for naming {tenant:?}");
    }
    let after = w.actions().await;
    assert_eq!(after, before, "nothing proposed");

    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let sql = "SELECT status FROM keyturn.approve_for($1, $2, $3)";
    let refused = w.human.query_one(sql, &[&other, &p.id, &p.token]).await;
    assert_eq!(sqlstate(refused), "42501");
    let refused = w.human.query_one(sql, &[&other, &p.id, &p.token]).await;
    assert!(message(refused).contains("which is not the caller's"));
    // The agent may not approve in any form, whatever tenant it names.
    let refused = w
        .agent
        .query_one(
            "SELECT status FROM keyturn.approve_for($1, $2, $3)",
            &[&w.tenant, &p.id, &p.token],
        )
        .await;
    assert_eq!(sqlstate(refused), "42501");
    assert_eq!(
        w.status(p.id).await,
        "pending",
        "neither refusal claimed it"
    );
    assert_eq!(w.writes(deals[0]).await, 0);
}

#[tokio::test]
async fn test_reject_for_is_reject_for_the_callers_tenant_only() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    let p = w.propose(&t, form(&deals, "won")).await.unwrap();
    let other = unique("other_tenant");

    for (tenant, code) in [(Some(other.as_str()), "42501"), (None, "22023")] {
        let refused = w
            .human
            .query_one(
                "SELECT keyturn.reject_for($1, $2, $3)",
                &[&tenant, &p.id, &p.token],
            )
            .await;
        assert_eq!(sqlstate(refused), code, "reject_for naming {tenant:?}");
    }
    assert_eq!(
        w.status(p.id).await,
        "pending",
        "a refused reject_for changes nothing"
    );

    let status: String = w
        .human
        .query_one(
            "SELECT keyturn.reject_for($1, $2, $3, 'not now')",
            &[&w.tenant, &p.id, &p.token],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "rejected");
    assert_eq!(w.writes(deals[0]).await, 0);
}
