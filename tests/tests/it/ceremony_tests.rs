//! docs/sql-api.md, "The approval ceremony": the queue, batch approval,
//! M-of-N quorum, edit before approve.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};

/// `approve_many` answers as (action_id, status, result) rows.
async fn approve_many(
    c: &Conn,
    items: Value,
) -> Result<Vec<(uuid::Uuid, String, Option<Value>)>, tokio_postgres::Error> {
    Ok(c.query(
        "SELECT action_id, status, result FROM keyturn.approve_many($1)",
        &[&items],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect())
}

fn item(p: &Proposal) -> Value {
    json!({"action_id": p.id, "token": p.token})
}

#[tokio::test]
async fn test_pending_is_the_callers_queue_soonest_expiry_first() {
    let w = World::new("member").await;
    let long = w.webhook_tool(json!({"expires_in": "2 hours"})).await;
    let short = w.webhook_tool(json!({"expires_in": "5 minutes"})).await;
    let later = w
        .propose(&long, json!({"channel": "c", "text": "later"}))
        .await
        .unwrap();
    let sooner = w
        .propose(&short, json!({"channel": "c", "text": "sooner"}))
        .await
        .unwrap();
    // Another member's proposal is not in this member's queue.
    let (other, other_agent) = w.other("member", "app_agent", "s-other").await;
    w.grant(&other, &long).await;
    let theirs = propose_on(
        &other_agent,
        &long,
        json!({"channel": "c", "text": "x"}),
        json!({}),
    )
    .await
    .unwrap();
    let rows = w
        .human
        .query("SELECT * FROM keyturn.pending()", &[])
        .await
        .unwrap();
    let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.get("action_id")).collect();
    assert_eq!(
        ids,
        vec![sooner.id, later.id],
        "own actions, soonest expiry first"
    );
    let columns: Vec<&str> = rows[0].columns().iter().map(|c| c.name()).collect();
    assert!(!columns.contains(&"token"), "never a token: {columns:?}");
    assert_eq!(rows[0].get::<_, i32>("quorum"), 1);
    assert_eq!(rows[0].get::<_, String>("summary"), sooner.summary);
    // An approver of the tenant sees the tenant's queue, the other member's included.
    let (_, approver) = w.other("approver", "app_human", "s-a").await;
    let ids: Vec<uuid::Uuid> = approver
        .query("SELECT action_id FROM keyturn.pending(100)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(ids.contains(&theirs.id) && ids.contains(&later.id));
    // Decided actions leave the queue.
    assert_eq!(w.approve(&sooner).await.unwrap().0, "queued");
    let n = count(&w.human, "SELECT count(*) FROM keyturn.pending()", &[]).await;
    assert_eq!(n, 1);
    assert_eq!(
        sqlstate(w.human.query("SELECT * FROM keyturn.pending(0)", &[]).await),
        "22023"
    );
    assert_eq!(
        sqlstate(w.agent.query("SELECT * FROM keyturn.pending()", &[]).await),
        "42501"
    );
}

#[tokio::test]
async fn test_approve_many_answers_each_element_on_its_own() {
    let w = World::new("member").await;
    let b = World::new("member").await;
    let sql = w.deal_tool(json!({})).await;
    let short = w.deal_tool(json!({"expires_in": "1 second"})).await;
    let deals = w.deals(&w.principal, 5).await;
    let form = |d: i64| json!({"where": {"id": d}, "set": {"stage": "won"}});
    let good = w.propose(&sql, form(deals[0])).await.unwrap();
    let wrong_token = w.propose(&sql, form(deals[1])).await.unwrap();
    let expiring = w.propose(&short, form(deals[2])).await.unwrap();
    let tampered = w.propose(&sql, form(deals[3])).await.unwrap();
    let replayed = w.propose(&sql, form(deals[4])).await.unwrap();
    assert_eq!(w.approve(&replayed).await.unwrap().0, "succeeded");
    let b_tool = b.webhook_tool(json!({})).await;
    let foreign = b
        .propose(&b_tool, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    tamper(
        &w.superuser,
        "UPDATE keyturn.action SET params = jsonb_set(params, '{set,stage}', '\"lost\"') WHERE id = $1",
        &[&tampered.id],
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let answers = approve_many(
        &w.human,
        json!([
            item(&good),
            {"action_id": wrong_token.id, "token": "not-the-token"},
            item(&foreign),
            item(&expiring),
            item(&tampered),
            item(&replayed),
        ]),
    )
    .await
    .unwrap();
    let statuses: Vec<&str> = answers.iter().map(|a| a.1.as_str()).collect();
    assert_eq!(
        statuses,
        [
            "succeeded",
            "refused",
            "refused",
            "expired",
            "rejected_tampered",
            "succeeded"
        ]
    );
    assert_eq!(answers[1].2.as_ref().unwrap()["sqlstate"], "55000");
    assert_eq!(answers[2].2.as_ref().unwrap()["sqlstate"], "55000");
    assert_eq!(
        w.status(wrong_token.id).await,
        "pending",
        "a refusal uses nothing up"
    );
    assert_eq!(b.status(foreign.id).await, "pending");
    assert_eq!(w.stage_of(deals[0]).await, "won");
    assert_eq!(w.writes(deals[4]).await, 1, "the replay ran nothing twice");
    // One batch: its events say so.
    let batches = count(
        &w.superuser,
        "SELECT count(DISTINCT detail ->> 'batch') FROM keyturn.event \
          WHERE action_id = ANY ($1) AND detail ? 'batch'",
        &[&vec![good.id, expiring.id, tampered.id]],
    )
    .await;
    assert_eq!(batches, 1);
    // Each element's status change is in the audit, refused elements after
    // it or not.
    for (p, to) in [
        (&good, "succeeded"),
        (&expiring, "expired"),
        (&tampered, "rejected_tampered"),
    ] {
        let n = count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.event WHERE action_id = $1 AND from_status = 'pending' AND to_status::text = $2",
            &[&p.id, &to],
        )
        .await;
        assert_eq!(n, 1, "{to}");
    }
}

#[tokio::test]
async fn test_approve_many_refuses_what_is_not_a_list_of_items() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let many: Vec<Value> = (0..101).map(|_| item(&p)).collect();
    for items in [
        json!({}),
        json!([]),
        json!(many),
        json!([{"action_id": p.id}]),
        json!([{"action_id": p.id, "token": p.token, "extra": 1}]),
        json!([{"action_id": "not-a-uuid", "token": p.token}]),
        json!(["x"]),
    ] {
        assert_eq!(
            sqlstate(approve_many(&w.human, items.clone()).await),
            "22023",
            "{items}"
        );
    }
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(
        sqlstate(approve_many(&w.agent, json!([item(&p)])).await),
        "42501"
    );
}

/// A tenant with a quorum-2 tool, its proposer (a member) and three approvers.
async fn quorum_world(extra: Value) -> (World, String, Vec<(String, Conn)>) {
    let w = World::new("member").await;
    let mut spec = json!({"approval": "independent", "quorum": 2});
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    let t = w.webhook_tool(spec).await;
    let mut approvers = Vec::new();
    for i in 0..3 {
        let (p, c) = w.other("approver", "app_human", &format!("s{i}")).await;
        w.grant(&p, &t).await;
        approvers.push((p, c));
    }
    (w, t, approvers)
}

#[tokio::test]
async fn test_quorum_takes_two_different_approvers() {
    let (w, t, approvers) = quorum_world(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let vote = |i: usize| approve_on(&approvers[i].1, p.id, &p.token, None);
    let (status, result) = vote(0).await.unwrap();
    assert_eq!(status, "pending");
    assert_eq!(result.unwrap(), json!({"votes": 1, "quorum": 2}));
    let (status, result) = vote(0).await.unwrap();
    assert_eq!(
        (status.as_str(), result.unwrap()),
        ("pending", json!({"votes": 1, "quorum": 2})),
        "the same voter again is no second vote"
    );
    // The proposer never votes.
    assert_eq!(
        sqlstate(approve_on(&w.human, p.id, &p.token, None).await),
        "42501"
    );
    let preview: Value = approvers[2]
        .1
        .query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (preview["votes"].clone(), preview["quorum"].clone()),
        (json!(1), json!(2))
    );
    let pending = approvers[2]
        .1
        .query_one(
            "SELECT votes, quorum FROM keyturn.pending() WHERE action_id = $1",
            &[&p.id],
        )
        .await
        .unwrap();
    assert_eq!((pending.get::<_, i32>(0), pending.get::<_, i32>(1)), (1, 2));
    assert_eq!(
        vote(1).await.unwrap().0,
        "queued",
        "the deciding vote performs the claim"
    );
    assert_eq!(
        vote(2).await.unwrap().0,
        "queued",
        "a vote after the decision is a replay"
    );
    let votes = w
        .superuser
        .query(
            "SELECT principal, detail FROM keyturn.event WHERE action_id = $1 \
              AND from_status = 'pending' AND to_status = 'pending' ORDER BY id",
            &[&p.id],
        )
        .await
        .unwrap();
    let voters: Vec<String> = votes.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        voters,
        vec![approvers[0].0.clone(), approvers[1].0.clone()],
        "who voted, in order"
    );
    assert_eq!(votes[1].get::<_, Value>(1)["vote"], 2);
}

#[tokio::test]
async fn test_quorum_is_vetoed_by_any_eligible_reject() {
    let (w, t, approvers) = quorum_world(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    approve_on(&approvers[0].1, p.id, &p.token, None)
        .await
        .unwrap();
    let s: String = approvers[1]
        .1
        .query_one("SELECT keyturn.reject($1, $2, 'no')", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(s, "rejected");
    assert_eq!(
        approve_on(&approvers[2].1, p.id, &p.token, None)
            .await
            .unwrap()
            .0,
        "rejected"
    );
}

#[tokio::test]
async fn test_quorum_expiry_between_votes_expires() {
    let (w, t, approvers) = quorum_world(json!({"expires_in": "1 second"})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    assert_eq!(
        approve_on(&approvers[0].1, p.id, &p.token, None)
            .await
            .unwrap()
            .0,
        "pending"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        approve_on(&approvers[1].1, p.id, &p.token, None)
            .await
            .unwrap()
            .0,
        "expired"
    );
}

#[tokio::test]
async fn test_quorum_vote_after_a_revoke_invalidates() {
    let (w, t, approvers) = quorum_world(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    approve_on(&approvers[0].1, p.id, &p.token, None)
        .await
        .unwrap();
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    assert_eq!(
        approve_on(&approvers[1].1, p.id, &p.token, None)
            .await
            .unwrap()
            .0,
        "invalidated"
    );
}

#[tokio::test]
async fn test_a_voter_who_lost_the_grant_no_longer_counts() {
    let (w, t, approvers) = quorum_world(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    approve_on(&approvers[0].1, p.id, &p.token, None)
        .await
        .unwrap();
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &approvers[0].0, &t],
        )
        .await
        .unwrap();
    let (status, result) = approve_on(&approvers[1].1, p.id, &p.token, None)
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), result.unwrap()),
        ("pending", json!({"votes": 1, "quorum": 2}))
    );
}

#[tokio::test]
async fn test_quorum_needs_an_independent_tool_of_at_most_five() {
    let w = World::new("member").await;
    for spec in [
        json!({"executor": "external", "provider": "webhook", "quorum": 2}),
        json!({"executor": "external", "provider": "webhook", "approval": "independent", "quorum": 6}),
        json!({"executor": "external", "provider": "webhook", "approval": "independent", "quorum": 0}),
    ] {
        let r = w
            .admin
            .execute(
                "SELECT keyturn.register_tool($1, $2)",
                &[&unique("q"), &spec],
            )
            .await;
        assert_eq!(sqlstate(r), "22023", "{spec}");
    }
}

#[tokio::test]
async fn test_revise_supersedes_and_links_both_ways() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let old = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    let r = w
        .human
        .query_one(
            "SELECT action_id, token, summary, params_hash FROM keyturn.revise($1, $2, $3)",
            &[
                &old.id,
                &old.token,
                &json!({"where": {"id": deal}, "set": {"stage": "lost"}}),
            ],
        )
        .await
        .unwrap();
    let new = Proposal {
        id: r.get(0),
        token: r.get(1),
        summary: r.get(2),
        params_hash: r.get(3),
    };
    assert_ne!(new.params_hash, old.params_hash);
    assert_eq!(new.summary, "Set stage lost on 1 deal(s)");
    assert_eq!(w.status(old.id).await, "superseded");
    // The agent sees where its proposal went.
    let result: Value = w
        .agent
        .query_one("SELECT result FROM keyturn.action_status($1)", &[&old.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(result["superseded_by"], json!(new.id));
    let from: Option<uuid::Uuid> = w
        .superuser
        .query_one(
            "SELECT revised_from FROM keyturn.action WHERE id = $1",
            &[&new.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(from, Some(old.id));
    // Approving the old one runs nothing; the new one runs what was edited.
    assert_eq!(w.approve(&old).await.unwrap().0, "superseded");
    assert_eq!(w.stage_of(deal).await, "lead");
    // Revised twice: a chain.
    let r = w
        .human
        .query_one(
            "SELECT action_id, token FROM keyturn.revise($1, $2, $3)",
            &[
                &new.id,
                &new.token,
                &json!({"where": {"id": deal}, "set": {"stage": "negotiation"}}),
            ],
        )
        .await
        .unwrap();
    let third = Proposal {
        id: r.get(0),
        token: r.get(1),
        summary: String::new(),
        params_hash: String::new(),
    };
    assert_eq!(w.status(new.id).await, "superseded");
    assert_eq!(w.approve(&third).await.unwrap().0, "succeeded");
    assert_eq!(w.stage_of(deal).await, "negotiation");
    // Who revised is in the audit.
    let revised_by = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.event WHERE action_id = $1 AND to_status = 'superseded' \
            AND detail ->> 'revised_by' = $2",
        &[&old.id, &w.principal],
    )
    .await;
    assert_eq!(revised_by, 1);
}

#[tokio::test]
async fn test_revise_is_refused_outside_its_rules() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    async fn revise(
        c: &Conn,
        p: &Proposal,
        params: Value,
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        c.query_one(
            "SELECT action_id FROM keyturn.revise($1, $2, $3)",
            &[&p.id, &p.token, &params],
        )
        .await
    }
    assert_eq!(
        sqlstate(
            revise(
                &w.agent,
                &p,
                json!({"where": {"id": deal}, "set": {"stage": "lost"}})
            )
            .await
        ),
        "42501",
        "an agent never revises"
    );
    assert_eq!(
        sqlstate(
            revise(
                &w.human,
                &p,
                json!({"where": {"id": deal}, "set": {"name": "x"}})
            )
            .await
        ),
        "22023",
        "outside the form"
    );
    assert_eq!(
        w.status(p.id).await,
        "pending",
        "a refused revise changes nothing"
    );
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    assert_eq!(
        sqlstate(
            revise(
                &w.human,
                &p,
                json!({"where": {"id": deal}, "set": {"stage": "lost"}})
            )
            .await
        ),
        "55000",
        "only from pending"
    );
}

#[tokio::test]
async fn test_a_reviser_does_not_approve_its_own_revision_of_an_independent_tool() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"approval": "independent"})).await;
    let (a, alice) = w.other("approver", "app_human", "s-a").await;
    let (b, bob) = w.other("approver", "app_human", "s-b").await;
    w.grant(&a, &t).await;
    w.grant(&b, &t).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let r = alice
        .query_one(
            "SELECT action_id, token FROM keyturn.revise($1, $2, $3)",
            &[&p.id, &p.token, &json!({"channel": "c", "text": "edited"})],
        )
        .await
        .unwrap();
    let (id, token): (uuid::Uuid, String) = (r.get(0), r.get(1));
    assert_eq!(
        sqlstate(approve_on(&alice, id, &token, None).await),
        "42501",
        "not its own edit"
    );
    assert_eq!(
        approve_on(&bob, id, &token, None).await.unwrap().0,
        "queued"
    );
}

/// approve_many_for, revise_for, end_session_for, cancel_origin_for,
/// archive_conversation_for (docs/sql-api.md): the plain calls with the
/// caller's tenant named, for Citus to route by; another tenant, or none,
/// 42501 before anything changes.
#[tokio::test]
async fn test_the_ceremony_and_session_calls_for_the_callers_own_tenant_only() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 3).await;
    let form = |d: i64, stage: &str| json!({"where": {"id": d}, "set": {"stage": stage}});
    let other = unique("other_tenant");
    let none: Option<&str> = None;

    // revise_for: named the caller's tenant, exactly revise.
    let old = w.propose(&t, form(deals[0], "won")).await.unwrap();
    for (tenant, code) in [(Some(other.as_str()), "42501"), (none, "22023")] {
        let refused = w
            .human
            .query_one(
                "SELECT action_id FROM keyturn.revise_for($1, $2, $3, $4)",
                &[&tenant, &old.id, &old.token, &form(deals[0], "lost")],
            )
            .await;
        assert_eq!(sqlstate(refused), code, "revise_for naming {tenant:?}");
    }
    assert_eq!(w.status(old.id).await, "pending", "nothing revised");
    let r = w
        .human
        .query_one(
            "SELECT action_id, token FROM keyturn.revise_for($1, $2, $3, $4)",
            &[&w.tenant, &old.id, &old.token, &form(deals[0], "lost")],
        )
        .await
        .unwrap();
    let (new_id, new_token): (uuid::Uuid, String) = (r.get(0), r.get(1));
    assert_eq!(w.status(old.id).await, "superseded");

    // approve_many_for: the same batch answers as approve_many.
    let second = w.propose(&t, form(deals[1], "won")).await.unwrap();
    let items = json!([{"action_id": new_id, "token": new_token}, item(&second)]);
    let refused = w
        .human
        .query(
            "SELECT status FROM keyturn.approve_many_for($1, $2)",
            &[&other, &items],
        )
        .await;
    assert_eq!(sqlstate(refused), "42501");
    let refused = w
        .agent
        .query(
            "SELECT status FROM keyturn.approve_many_for($1, $2)",
            &[&w.tenant, &items],
        )
        .await;
    assert_eq!(sqlstate(refused), "42501", "an agent approves in no form");
    assert_eq!(w.status(new_id).await, "pending");
    let statuses: Vec<String> = w
        .human
        .query(
            "SELECT status FROM keyturn.approve_many_for($1, $2)",
            &[&w.tenant, &items],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(statuses, ["succeeded", "succeeded"]);
    assert_eq!(w.stage_of(deals[0]).await, "lost");

    // end_session_for, cancel_origin_for, archive_conversation_for: the
    // session's and the conversations' pending actions cancelled, once
    // named the caller's tenant.
    let in_session = w.propose(&t, form(deals[2], "won")).await.unwrap();
    for sql in [
        "SELECT keyturn.end_session_for($1)",
        "SELECT keyturn.cancel_origin_for($1, 'conv-for')",
        "SELECT keyturn.archive_conversation_for($1, 'conv-for-2')",
    ] {
        for (tenant, code) in [(Some(other.as_str()), "42501"), (none, "22023")] {
            let refused = w.agent.query_one(sql, &[&tenant]).await;
            assert_eq!(sqlstate(refused), code, "{sql} naming {tenant:?}");
        }
    }
    assert_eq!(
        w.status(in_session.id).await,
        "pending",
        "nothing cancelled"
    );
    let ended: i32 = w
        .agent
        .query_one("SELECT keyturn.end_session_for($1)", &[&w.tenant])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended, 1);
    assert_eq!(w.status(in_session.id).await, "cancelled");
    for (sql, conv) in [
        ("SELECT keyturn.cancel_origin_for($1, $2)", "conv-for"),
        (
            "SELECT keyturn.archive_conversation_for($1, $2)",
            "conv-for-2",
        ),
    ] {
        let n: i32 = w
            .human
            .query_one(sql, &[&w.tenant, &conv])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{sql}: nothing of that conversation was open");
        let refused = propose_on(
            &w.agent,
            &t,
            form(deals[2], "won"),
            json!({"conversation_id": conv}),
        )
        .await;
        assert_eq!(
            sqlstate(refused),
            "55000",
            "{conv} ended: it starts no new action"
        );
    }
}

/// A vote whose token was replaced while it waited for the action row (a
/// colleague took a fresh token from the queue, `issue_token`) is the wrong
/// token, as it would have been a moment later: 55000, no vote counted.
/// It had been counted, had met the quorum, and then the claim with the
/// old token found nothing and failed with an internal error (XX000), which
/// `approve_many` re-raised, undoing the batch's other decisions
/// (docs/security.md, row 134).
#[tokio::test]
async fn test_a_vote_whose_token_was_replaced_while_it_waited_counts_for_nothing() {
    let (w, t, mut approvers) = quorum_world(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    approve_on(&approvers[0].1, p.id, &p.token, None)
        .await
        .unwrap();
    let fresh = approvers[0].1.transaction().await.unwrap();
    let new_token: String = fresh
        .query_one("SELECT keyturn.issue_token($1)", &[&p.id])
        .await
        .unwrap()
        .get(0);
    let (id, old_token, (_, voter)) = (p.id, p.token.clone(), approvers.remove(1));
    let voting = tokio::spawn(async move {
        let answer = approve_on(&voter, id, &old_token, None).await;
        (answer, voter)
    });
    while count(
        &w.superuser,
        "SELECT count(*) FROM pg_stat_activity \
          WHERE wait_event_type = 'Lock' AND query LIKE '%keyturn.approve(%'",
        &[],
    )
    .await
        == 0
    {
        assert!(
            !voting.is_finished(),
            "the vote did not wait for the action row"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fresh.commit().await.unwrap();
    let (answer, voter) = voting.await.unwrap();
    assert_eq!(sqlstate(answer), "55000");
    assert_eq!(w.status(p.id).await, "pending");
    let votes = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.vote WHERE action_id = $1",
        &[&p.id],
    )
    .await;
    assert_eq!(votes, 1, "the stale token's vote is not counted");
    let (status, _) = approve_on(&voter, p.id, &new_token, None).await.unwrap();
    assert_eq!(status, "queued", "the fresh token's vote decides");
}
