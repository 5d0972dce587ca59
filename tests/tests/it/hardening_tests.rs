//! The third security pass (docs/security.md, rows 18 on): what an adversary
//! broke in 0.2.0 on the SQL surface, each written as the attack and run
//! against 0.2.0 first, where it succeeded. A standing approval means what
//! the person saw; admission decides on committed data under every
//! isolation level; no agent transaction stalls the kill switch; nothing
//! gets stuck after approval; staged bytes stay private.

use keyturn_tests::*;
use serde_json::{json, Value};
use tokio_postgres::{Client, Error};

const BOSS: &str = "boss@acme.example";
const MALLORY: &str = "mallory@evil.example";

/// A mail-like external tool: `to` and `cc` are lists of addresses.
async fn mail_tool(w: &World) -> String {
    w.tool(
        "mail",
        json!({
            "executor": "external", "provider": "webhook", "effect": "reversible",
            "summary": "Mail to {to}",
            "params_schema": {"type": "object", "required": ["to"], "properties": {
                "to": {"type": "array"},
                "cc": {"type": "array"},
                "subject": {"type": "string"}}}
        }),
    )
    .await
}

async fn covered(w: &World, tool: &str, params: Value) -> Proposed {
    propose_full(&w.agent, tool, params, json!({}))
        .await
        .unwrap()
}

fn form(deal: i64, set: Value) -> Value {
    json!({"where": {"id": deal}, "set": set})
}

// --- 1. A scope covers only what it names -----------------------------------

/// alice lets her agent mail the boss; the agent adds a cc. 0.2.0 queued it
/// at once: the scope bounded `to` and said nothing of `cc`.
#[tokio::test]
async fn test_a_standing_approval_does_not_cover_a_path_its_scope_leaves_out() {
    let w = World::new("member").await;
    let t = mail_tool(&w).await;
    w.delegate(&t, json!({"params": {"to": {"in": [BOSS]}}}), 5, "1 hour")
        .await
        .unwrap();
    let p = covered(&w, &t, json!({"to": [BOSS], "cc": [MALLORY]})).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    let p = covered(&w, &t, json!({"to": [BOSS], "subject": "hi"})).await;
    assert_eq!(p.status, "pending", "subject is not named either");
    // What the scope names in full is covered.
    let p = covered(&w, &t, json!({"to": [BOSS]})).await;
    assert_eq!(p.status, "queued");
    assert!(p.delegation_id.is_some());
}

/// `{"any": true}` is how a person leaves a path free, and delegations()
/// shows it as such.
#[tokio::test]
async fn test_any_marks_a_free_path_and_is_listed() {
    let w = World::new("member").await;
    let t = mail_tool(&w).await;
    let scope =
        json!({"params": {"to": {"in": [BOSS]}, "cc": {"any": true}, "subject": {"any": true}}});
    let d = w.delegate(&t, scope.clone(), 5, "1 hour").await.unwrap();
    let p = covered(
        &w,
        &t,
        json!({"to": [BOSS], "cc": [MALLORY], "subject": "x"}),
    )
    .await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("queued", Some(d)));
    let listed: Value = w
        .human
        .query_one(
            "SELECT scope FROM keyturn.delegations() WHERE delegation_id = $1",
            &[&d],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listed, scope);
    for bad in [
        json!({"params": {"cc": {"any": false}}}),
        json!({"params": {"cc": {"any": true, "eq": 1}}}),
        json!({"params": {"cc": {"any": "yes"}}}),
    ] {
        assert_eq!(
            sqlstate(w.delegate(&t, bad.clone(), 1, "1 hour").await),
            "22023",
            "{bad}"
        );
    }
}

/// An sql tool: a scope on `set.stage` let `set.amount = 0.01` run.
#[tokio::test]
async fn test_an_sql_scope_on_the_stage_does_not_cover_the_amount() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    w.delegate(
        &t,
        json!({"params": {"set.stage": {"eq": "won"}, "where.id": {"min": 0}}}),
        5,
        "1 hour",
    )
    .await
    .unwrap();
    let p = covered(&w, &t, form(deal, json!({"stage": "won", "amount": 0.01}))).await;
    assert_eq!(p.status, "pending");
    assert_eq!(w.writes(deal).await, 0);
    let p = covered(&w, &t, form(deal, json!({"stage": "won"}))).await;
    assert_eq!(p.status, "succeeded");
}

/// Arrays element by element: every element must pass, and an element that
/// is not a listed scalar (an object smuggling an address) never does.
#[tokio::test]
async fn test_a_scope_checks_every_element_of_an_array() {
    let w = World::new("member").await;
    let t = mail_tool(&w).await;
    w.delegate(&t, json!({"params": {"to": {"in": [BOSS]}}}), 5, "1 hour")
        .await
        .unwrap();
    for to in [
        json!([BOSS, MALLORY]),
        json!([BOSS, {"address": MALLORY}]),
        json!([[BOSS]]),
    ] {
        let p = covered(&w, &t, json!({"to": to})).await;
        assert_eq!(p.status, "pending", "{to}");
    }
}

/// The decision for scoped grants: a grant bounds what the agent may
/// propose, and a person still approves the proposal, so a path the grant
/// leaves out stays open (docs/sql-api.md says so); `{"any": true}` is
/// accepted there too, to say it.
#[tokio::test]
async fn test_a_scoped_grant_bounds_what_it_names_and_a_person_approves_the_rest() {
    let w = World::new("member").await;
    let t = mail_tool(&w).await;
    w.grant_with(
        &w.principal,
        &t,
        Some(json!({"params": {"to": {"in": [BOSS]}, "cc": {"any": true}}})),
        None,
        None,
    )
    .await
    .unwrap();
    let p = covered(
        &w,
        &t,
        json!({"to": [BOSS], "cc": [MALLORY], "subject": "x"}),
    )
    .await;
    assert_eq!(p.status, "pending", "proposed, for a person to approve");
    assert_eq!(
        sqlstate(propose_full(&w.agent, &t, json!({"to": [MALLORY]}), json!({})).await),
        "42501"
    );
}

// --- 2. A standing approval is bound to its tool version -----------------------

#[tokio::test]
async fn test_a_new_tool_version_ends_a_standing_approvals_cover() {
    let w = World::new("member").await;
    let t = w
        .tool(
            "deal_v",
            json!({"executor": "sql", "effect": "reversible",
               "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"]}}),
        )
        .await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w
        .delegate(
            &t,
            json!({"params": {"where.id": {"min": 0}, "set.name": {"max_length": 100}}}),
            5,
            "1 hour",
        )
        .await
        .unwrap();
    // The tool may now also set name, which the scope names: the standing
    // approval was given when no call could change a name.
    w.admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[&t, &json!({"executor": "sql", "effect": "reversible",
               "sql": {"table": "crm.deal", "key": "id", "set": ["stage", "name"], "where": ["id"]}})],
        )
        .await
        .unwrap();
    let p = covered(&w, &t, form(deal, json!({"name": "renamed"}))).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    let r = w
        .human
        .query_one(
            "SELECT revoked, ended FROM keyturn.delegations() WHERE delegation_id = $1",
            &[&d],
        )
        .await
        .unwrap();
    assert!(!r.get::<_, bool>(0));
    let ended: Option<String> = r.get(1);
    assert!(
        ended.as_deref().unwrap_or("").contains("version"),
        "delegations() says why it no longer covers: {ended:?}"
    );
}

// --- 3. Every author of a revision chain is a proposer ------------------------

async fn independent_tool(w: &World, quorum: i32) -> String {
    w.webhook_tool(json!({"approval": "independent", "quorum": quorum}))
        .await
}

async fn revise_on(
    c: &Conn,
    p: &Proposal,
    params: Value,
) -> Result<Proposal, tokio_postgres::Error> {
    let r = c
        .query_one(
            "SELECT action_id, token, summary, params_hash FROM keyturn.revise($1, $2, $3)",
            &[&p.id, &p.token, &params],
        )
        .await?;
    Ok(Proposal {
        id: r.get(0),
        token: r.get(1),
        summary: r.get(2),
        params_hash: r.get(3),
    })
}

/// carol re-revises bob's revision with identical params; bob then approves
/// content he wrote. 0.2.0 let him: only the last reviser counted.
#[tokio::test]
async fn test_a_reviser_never_approves_a_later_revision_of_his_own_content() {
    let w = World::new("member").await;
    let t = independent_tool(&w, 1).await;
    let (bob, bob_c) = w.other("approver", "app_human", "s-bob").await;
    let (carol, carol_c) = w.other("approver", "app_human", "s-carol").await;
    w.grant(&bob, &t).await;
    w.grant(&carol, &t).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "hello"}))
        .await
        .unwrap();
    let bobs = revise_on(&bob_c, &p, json!({"channel": "ops", "text": "bob's words"}))
        .await
        .unwrap();
    let carols = revise_on(
        &carol_c,
        &bobs,
        json!({"channel": "ops", "text": "bob's words"}),
    )
    .await
    .unwrap();
    assert_eq!(
        sqlstate(approve_on(&bob_c, carols.id, &carols.token, None).await),
        "42501"
    );
    assert_eq!(w.status(carols.id).await, "pending");
    let (dave, dave_c) = w.other("approver", "app_human", "s-dave").await;
    w.grant(&dave, &t).await;
    assert_eq!(
        approve_on(&dave_c, carols.id, &carols.token, None)
            .await
            .unwrap()
            .0,
        "queued"
    );
}

/// The same for a quorum: a vote of an author does not count.
#[tokio::test]
async fn test_an_author_of_a_revision_chain_does_not_vote_on_it() {
    let w = World::new("member").await;
    let t = independent_tool(&w, 2).await;
    let (bob, bob_c) = w.other("approver", "app_human", "s-bob").await;
    let (carol, carol_c) = w.other("approver", "app_human", "s-carol").await;
    w.grant(&bob, &t).await;
    w.grant(&carol, &t).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "hello"}))
        .await
        .unwrap();
    let bobs = revise_on(&bob_c, &p, json!({"channel": "ops", "text": "bob's words"}))
        .await
        .unwrap();
    let carols = revise_on(
        &carol_c,
        &bobs,
        json!({"channel": "ops", "text": "bob's words"}),
    )
    .await
    .unwrap();
    assert_eq!(
        sqlstate(approve_on(&bob_c, carols.id, &carols.token, None).await),
        "42501"
    );
    assert_eq!(
        sqlstate(approve_on(&carol_c, carols.id, &carols.token, None).await),
        "42501"
    );
    let votes = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.vote WHERE action_id = $1",
        &[&carols.id],
    )
    .await;
    assert_eq!(votes, 0);
}

// --- 4. A role that became an agent records nothing that still covers ----------

#[tokio::test]
async fn test_a_standing_approval_of_a_role_that_became_an_agent_covers_nothing() {
    let w = World::new("member").await;
    let login = approver_login(&w.superuser).await;
    let table = w.role_table(&[&login]).await;
    let t = w.role_table_tool(&table, json!({})).await;
    let row = w.role_table_row(&table, false).await;
    let person = Conn::connect(&login, w.identity()).await;
    let scope = json!({"params": {"where.id": {"min": 0}, "set.stage": {"max_length": 20}}});
    let d = delegate_on(&person, &t, scope, 5, "1 hour").await.unwrap();
    w.superuser
        .batch_execute(&format!("GRANT keyturn_agent TO {login}"))
        .await
        .unwrap();
    let p = covered(&w, &t, form(row, json!({"stage": "won"}))).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    assert_eq!(
        w.role_table_state(&table, row).await,
        ("lead".to_owned(), None)
    );
    let ended = ended_why(&w, d).await;
    assert!(ended.is_some(), "listed as ended");
}

/// Why `delegations()` says a standing approval ended, or None while it covers.
async fn ended_why(w: &World, d: uuid::Uuid) -> Option<String> {
    w.human
        .query_one(
            "SELECT ended FROM keyturn.delegations() WHERE delegation_id = $1",
            &[&d],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn test_a_task_request_of_a_role_that_became_an_agent_admits_nothing() {
    let w = World::new("member").await;
    let login = approver_login(&w.superuser).await;
    let person = Conn::connect(&login, w.identity()).await;
    let t = w
        .webhook_tool(json!({"approval": "task", "effect": "reversible"}))
        .await;
    assert!(
        record_request_on(&person, "conv", "turn-1", "msg-1", "please")
            .await
            .unwrap()
    );
    w.superuser
        .batch_execute(&format!("GRANT keyturn_agent TO {login}"))
        .await
        .unwrap();
    let r = propose_full(
        &w.agent,
        &t,
        json!({"channel": "ops", "text": "x"}),
        task_origin("conv", "turn-1", "msg-1"),
    )
    .await;
    assert_eq!(sqlstate(r), "42501");
}

// --- 5. Admission on committed data under REPEATABLE READ ------------------------

const RR: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ";

/// A proposal in a REPEATABLE READ transaction whose snapshot was taken
/// before `meanwhile` committed: refused, 40001 or the error the committed
/// state gives (`refused`), never admitted on the old snapshot.
async fn stale_propose(
    w: &World,
    tool: &str,
    params: Value,
    origin: Value,
    refused: &[&str],
    meanwhile: impl std::future::Future<Output = ()>,
) -> String {
    let tx = w.agent.transaction_with(RR).await.unwrap();
    // The snapshot is taken here (set_config ran inside the transaction).
    tx.query_one("SELECT 1", &[]).await.unwrap();
    meanwhile.await;
    let r = tx
        .query_one(
            "SELECT status FROM keyturn.propose($1, $2, $3)",
            &[&tool, &params, &origin],
        )
        .await
        .map(|r| r.get::<_, String>(0));
    let answer = match r {
        Ok(status) => {
            tx.commit().await.unwrap();
            status
        }
        Err(e) => {
            let state = sqlstate::<()>(Err(e));
            tx.rollback().await.ok();
            state
        }
    };
    assert!(
        answer == "40001" || refused.contains(&answer.as_str()),
        "admitted on a stale snapshot: {answer}"
    );
    answer
}

/// Three transactions that took their snapshots before each other's
/// commits were all admitted by a 1-per-hour rate limit.
#[tokio::test]
async fn test_a_rate_limit_counts_proposals_committed_after_the_snapshot() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"rate_limit": {"max": 1, "per": "1 hour"}}))
        .await;
    let tx = w.agent.transaction_with(RR).await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    let second_agent = Conn::connect("app_agent", w.identity()).await;
    propose_on(
        &second_agent,
        &t,
        json!({"channel": "a", "text": "first"}),
        json!({}),
    )
    .await
    .unwrap();
    let r = tx
        .query_one(
            "SELECT status FROM keyturn.propose($1, $2)",
            &[&t, &json!({"channel": "a", "text": "second"})],
        )
        .await;
    let state = sqlstate(r);
    assert!(state == "40001" || state == "54000", "{state}");
    tx.rollback().await.ok();
    let n = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.action WHERE tenant = $1 AND tool = $2",
        &[&w.tenant, &t],
    )
    .await;
    assert_eq!(n, 1);
}

#[tokio::test]
async fn test_a_task_call_after_the_archive_is_refused_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"approval": "task", "effect": "reversible"}))
        .await;
    assert!(
        record_request_on(&w.human, "conv", "turn-1", "msg-1", "please")
            .await
            .unwrap()
    );
    let human = &w.human;
    stale_propose(
        &w,
        &t,
        json!({"channel": "ops", "text": "x"}),
        task_origin("conv", "turn-1", "msg-1"),
        &["55000"],
        async {
            human
                .query_one("SELECT keyturn.archive_conversation('conv')", &[])
                .await
                .unwrap();
        },
    )
    .await;
}

#[tokio::test]
async fn test_a_task_call_on_a_turn_no_longer_the_latest_is_refused_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"approval": "task", "effect": "reversible"}))
        .await;
    assert!(
        record_request_on(&w.human, "conv", "turn-1", "msg-1", "please")
            .await
            .unwrap()
    );
    let human = &w.human;
    stale_propose(
        &w,
        &t,
        json!({"channel": "ops", "text": "x"}),
        task_origin("conv", "turn-1", "msg-1"),
        &["55000"],
        async {
            assert!(
                record_request_on(human, "conv", "turn-2", "msg-2", "no, stop")
                    .await
                    .unwrap()
            );
        },
    )
    .await;
}

#[tokio::test]
async fn test_a_proposal_in_a_cancelled_conversation_is_refused_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let human = &w.human;
    stale_propose(
        &w,
        &t,
        json!({"channel": "ops", "text": "x"}),
        json!({"conversation_id": "conv-c"}),
        &["55000"],
        async {
            human
                .query_one("SELECT keyturn.cancel_origin('conv-c')", &[])
                .await
                .unwrap();
        },
    )
    .await;
}

#[tokio::test]
async fn test_a_revoked_grant_admits_nothing_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let (admin, tenant, principal) = (&w.admin, w.tenant.clone(), w.principal.clone());
    stale_propose(
        &w,
        &t,
        json!({"channel": "ops", "text": "x"}),
        json!({}),
        &["42501"],
        async {
            admin
                .execute(
                    "SELECT keyturn.revoke_tool($1, $2, $3)",
                    &[&tenant, &principal, &t],
                )
                .await
                .unwrap();
        },
    )
    .await;
}

/// A standing approval with one use, spent by a proposal committed after
/// the snapshot: the stale one is not covered (or fails to serialize).
#[tokio::test]
async fn test_a_spent_use_is_not_spent_again_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"effect": "reversible"})).await;
    let scope = json!({"params": {"channel": {"max_length": 100}, "text": {"max_length": 100}}});
    w.delegate(&t, scope, 1, "1 hour").await.unwrap();
    let tx = w.agent.transaction_with(RR).await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    let second_agent = Conn::connect("app_agent", w.identity()).await;
    let first = propose_full(
        &second_agent,
        &t,
        json!({"channel": "a", "text": "1"}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(first.status, "queued");
    let r = tx
        .query_one(
            "SELECT status FROM keyturn.propose($1, $2)",
            &[&t, &json!({"channel": "a", "text": "2"})],
        )
        .await
        .map(|r| r.get::<_, String>(0));
    match r {
        Ok(status) => {
            assert_eq!(status, "pending");
            tx.commit().await.unwrap();
        }
        Err(e) => assert_eq!(sqlstate::<()>(Err(e)), "40001"),
    }
    let approved = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.action WHERE tenant = $1 AND tool = $2 AND approved_via LIKE 'delegation:%'",
        &[&w.tenant, &t],
    )
    .await;
    assert_eq!(approved, 1);
}

/// A standing approval revoked after the snapshot covers nothing.
#[tokio::test]
async fn test_a_revoked_standing_approval_covers_nothing_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"effect": "reversible"})).await;
    let scope = json!({"params": {"channel": {"max_length": 100}, "text": {"max_length": 100}}});
    let d = w.delegate(&t, scope, 5, "1 hour").await.unwrap();
    let human = &w.human;
    stale_propose(
        &w,
        &t,
        json!({"channel": "a", "text": "1"}),
        json!({}),
        &["pending"],
        async {
            assert!(human
                .query_one("SELECT keyturn.revoke_delegation($1)", &[&d])
                .await
                .unwrap()
                .get::<_, bool>(0));
        },
    )
    .await;
}

// --- 5b. The approver's own authorization, on committed data (fifth pass) ------

/// A tenant with a webhook tool that needs an independent approver, that
/// approver (principal `approver`, session `session`, granted the tool) and
/// a proposal of the tool by the world's principal, with `text`.
async fn independent_proposal(
    session: &str,
    text: &str,
) -> (World, String, String, Conn, Proposal) {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"approval": "independent"})).await;
    let (approver, conn) = w.other("approver", "app_human", session).await;
    w.grant(&approver, &t).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": text}))
        .await
        .unwrap();
    (w, t, approver, conn, p)
}

/// `approve` of `p` in `tx`, then its commit: "committed <status>", or the
/// SQLSTATE of whichever failed (the transaction rolled back).
async fn approve_and_commit(tx: Tx, p: &Proposal) -> String {
    match tx
        .query_one(
            "SELECT status FROM keyturn.approve($1, $2)",
            &[&p.id, &p.token],
        )
        .await
    {
        Ok(row) => {
            let status: String = row.get(0);
            match tx.commit().await {
                Ok(()) => format!("committed {status}"),
                Err(e) => sqlstate::<()>(Err(e)),
            }
        }
        Err(e) => {
            let state = sqlstate::<()>(Err(e));
            tx.rollback().await.ok();
            state
        }
    }
}

/// Under REPEATABLE READ an approve whose snapshot was taken before
/// `meanwhile` changed the approver's own membership, role or grant (each
/// bumps the approver's epoch): refused, or its commit fails (40001); the
/// action stays pending. On the earlier build the approver's side was read
/// on the snapshot alone, and the approval committed.
async fn approve_after_the_approver_changed(meanwhile: &str, with_tool: bool) {
    let (w, t, erin, erin_conn, p) = independent_proposal("erin-1", "x").await;
    let tx = erin_conn.transaction_with(RR).await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    if with_tool {
        w.admin
            .execute(meanwhile, &[&w.tenant, &erin, &t])
            .await
            .unwrap();
    } else {
        w.admin
            .execute(meanwhile, &[&w.tenant, &erin])
            .await
            .unwrap();
    }
    let answer = approve_and_commit(tx, &p).await;
    assert!(
        answer == "40001" || answer == "42501",
        "{meanwhile}: approved on a stale snapshot: {answer}"
    );
    assert_eq!(w.status(p.id).await, "pending");
}

#[tokio::test]
async fn test_a_removed_approver_approves_nothing_under_repeatable_read() {
    approve_after_the_approver_changed("SELECT keyturn.remove_member($1, $2)", false).await;
}

#[tokio::test]
async fn test_a_demoted_approver_approves_nothing_under_repeatable_read() {
    approve_after_the_approver_changed("SELECT keyturn.add_member($1, $2, 'member')", false).await;
}

#[tokio::test]
async fn test_an_approver_whose_grant_was_revoked_approves_nothing_under_repeatable_read() {
    approve_after_the_approver_changed("SELECT keyturn.revoke_tool($1, $2, $3)", true).await;
}

/// Under REPEATABLE READ an approve whose snapshot was taken before
/// `meanwhile` turned the tool off, registered a new version of it or
/// revoked the proposer's grant is refused by the call itself (40001),
/// before anything is decided or written, and nothing of it stays. On the
/// earlier build the re-check read the snapshot (`FOR KEY SHARE` does not
/// fail on a change outside the key), so approve answered `queued`, an sql
/// tool's business write and its triggers ran, and only the commit failed
/// (eleventh red-team pass, F2).
async fn approve_after_the_tool_or_proposer_changed(meanwhile: &str) {
    let (w, t, _, erin_conn, p) = independent_proposal("erin-1", "x").await;
    let tx = erin_conn.transaction_with(RR).await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    if meanwhile == "register" {
        w.webhook_tool(json!({"approval": "independent", "description": "v2"}))
            .await;
    } else {
        w.admin
            .execute(meanwhile, &[&w.tenant, &w.principal, &t])
            .await
            .unwrap();
    }
    let answer = tx
        .query_one(
            "SELECT status FROM keyturn.approve($1, $2)",
            &[&p.id, &p.token],
        )
        .await;
    assert_eq!(
        sqlstate(answer),
        "40001",
        "{meanwhile}: decided on a stale snapshot"
    );
    tx.rollback().await.ok();
    assert_eq!(w.status(p.id).await, "pending");
}

#[tokio::test]
async fn test_a_tool_turned_off_after_the_snapshot_approves_nothing_under_repeatable_read() {
    approve_after_the_tool_or_proposer_changed(
        "SELECT keyturn.set_tool_enabled($3, false) OR $1 = $2",
    )
    .await;
}

#[tokio::test]
async fn test_a_tool_registered_again_after_the_snapshot_approves_nothing_under_repeatable_read() {
    approve_after_the_tool_or_proposer_changed("register").await;
}

#[tokio::test]
async fn test_a_proposer_revoked_after_the_snapshot_approves_nothing_under_repeatable_read() {
    approve_after_the_tool_or_proposer_changed("SELECT keyturn.revoke_tool($1, $2, $3)").await;
}

/// Nor does a snapshot that shows the tool off, when it is on again,
/// decide anything: 40001, and the same call in a new transaction approves.
/// On the earlier build the proposal ended `invalidated`, for a reason no
/// longer true (eleventh red-team pass, F4).
#[tokio::test]
async fn test_a_tool_off_only_in_the_snapshot_invalidates_nothing_under_repeatable_read() {
    let (w, t, _, erin_conn, p) = independent_proposal("erin-1", "x").await;
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&t])
        .await
        .unwrap();
    let tx = erin_conn.transaction_with(RR).await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, true)", &[&t])
        .await
        .unwrap();
    assert_eq!(approve_and_commit(tx, &p).await, "40001");
    assert_eq!(w.status(p.id).await, "pending");
    let again = erin_conn.transaction_with(RR).await.unwrap();
    assert_eq!(approve_and_commit(again, &p).await, "committed queued");
}

/// A quorum vote cast by an approver removed since no longer counts, even
/// for a deciding voter whose REPEATABLE READ snapshot predates the removal.
#[tokio::test]
async fn test_a_removed_voters_vote_does_not_complete_a_quorum_under_repeatable_read() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"approval": "independent", "quorum": 2}))
        .await;
    let mut voters = Vec::new();
    for i in 0..2 {
        let (v, c) = w.other("approver", "app_human", &format!("v{i}")).await;
        w.grant(&v, &t).await;
        voters.push((v, c));
    }
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "x"}))
        .await
        .unwrap();
    let (status, _) = approve_on(&voters[0].1, p.id, &p.token, None)
        .await
        .unwrap();
    assert_eq!(status, "pending");
    let tx = voters[1].1.transaction_with(RR).await.unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    w.admin
        .execute(
            "SELECT keyturn.remove_member($1, $2)",
            &[&w.tenant, &voters[0].0],
        )
        .await
        .unwrap();
    let answer = approve_and_commit(tx, &p).await;
    assert!(
        answer == "40001" || answer == "committed pending",
        "a removed voter's vote completed the quorum: {answer}"
    );
    assert_eq!(w.status(p.id).await, "pending");
}

/// Waits, within a bound, until `probe` (one boolean, on the superuser's
/// connection) is true.
async fn until_true(
    w: &World,
    what: &str,
    probe: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let row = w.superuser.query_one(probe, params).await.unwrap();
        if row.get::<_, Option<bool>>(0) == Some(true) {
            return;
        }
        assert!(std::time::Instant::now() < until, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Seventh red-team pass (docs/security.md, row 90): the commit read the
/// decisions again before it waited for its tenant's chain, which another
/// commit of that tenant may hold for as long as its own commit takes. A
/// revocation (or the kill switch, which takes no chain lock) that
/// committed during that wait was not seen: the approval, checked before,
/// committed after it. The recheck now runs once the chain is held, and
/// (row 95) the commit holds what it rechecks from before that wait: a
/// revocation made meanwhile waits for the approval's commit to end, so it
/// never returns before the approval commits. The other commit is held here
/// by a trigger on its event's insert (run under the chain's lock) that
/// waits for an advisory lock the test holds.
#[tokio::test]
async fn test_an_approval_waiting_for_its_chain_and_a_revocation_made_meanwhile_commit_in_order() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "approve me"}))
        .await
        .unwrap();
    let (holder, holder_conn) = w.other("member", "app_agent", "holder-1").await;
    w.grant(&holder, &t).await;
    let key = uuid::Uuid::new_v4().as_u128() as i64;
    let hold = format!("kt_test_hold_{}", unique("f").replace('-', "_"));
    w.superuser
        .batch_execute(&format!(
            "CREATE FUNCTION public.{hold}() RETURNS trigger LANGUAGE plpgsql AS $f$ \
             BEGIN PERFORM pg_catalog.pg_advisory_xact_lock({key}); RETURN NEW; END $f$; \
             CREATE TRIGGER {hold} BEFORE INSERT ON keyturn.event FOR EACH ROW \
             WHEN (NEW.tenant = '{tenant}' AND NEW.principal = '{holder}') EXECUTE FUNCTION public.{hold}();",
            tenant = w.tenant
        ))
        .await
        .unwrap();
    w.superuser
        .execute("SELECT pg_catalog.pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();

    // The holder's commit takes the tenant's chain and waits in its trigger.
    let holder_commits = async {
        let tx = holder_conn.transaction().await.unwrap();
        let pid: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        propose_on(
            &tx,
            &t,
            json!({"channel": "ops", "text": "held"}),
            json!({}),
        )
        .await
        .unwrap();
        (pid, tx.commit().await)
    };
    let approval_commits = async {
        until_true(
            &w,
            "the holder waits in its commit, holding the chain",
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a USING (pid) \
              WHERE l.locktype = 'advisory' AND NOT l.granted AND a.usename = 'app_agent')",
            &[],
        )
        .await;
        let tx = w.human.transaction().await.unwrap();
        let pid: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let (status, _) = approve_on(&tx, p.id, &p.token, None).await.unwrap();
        assert_eq!(status, "queued");
        let meanwhile = async {
            until_true(
                &w,
                "the approval's commit waits for the chain",
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE pid = $1 AND NOT granted)",
                &[&pid],
            )
            .await;
            let revoke = async {
                w.admin
                    .execute(
                        "SELECT keyturn.revoke_tool($1, $2, $3)",
                        &[&w.tenant, &w.principal, &t],
                    )
                    .await
                    .unwrap();
                // What anyone sees once the revocation has returned.
                w.status(p.id).await
            };
            let release = async {
                until_true(
                    &w,
                    "the revocation waits for the approval's commit",
                    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a \
                       USING (pid) WHERE a.usename = 'app_admin' AND l.locktype = 'object' AND NOT l.granted)",
                    &[],
                )
                .await;
                w.superuser
                    .execute("SELECT pg_catalog.pg_advisory_unlock($1)", &[&key])
                    .await
                    .unwrap();
            };
            tokio::join!(revoke, release).0
        };
        let (committed, seen) = tokio::join!(tx.commit(), meanwhile);
        (committed, seen)
    };
    let ((_, held), approved) = tokio::join!(holder_commits, approval_commits);
    w.superuser
        .batch_execute(&format!(
            "DROP TRIGGER {hold} ON keyturn.event; DROP FUNCTION public.{hold}();"
        ))
        .await
        .unwrap();
    held.expect("the holder commits once released");
    let (approved, seen_after_revocation) = approved;
    approved.expect("the approval was decided and rechecked before the revocation");
    assert_eq!(
        seen_after_revocation, "queued",
        "the revocation returned before the approval it waited for committed"
    );
}

// --- 5c. No prepared transaction holds a tenant's chain (sixth pass) ----------

/// PREPARE TRANSACTION after `call` (a status change, so audit events and,
/// for a decision, a commit recheck): refused with 0A000 and nothing of it
/// remains. On the earlier build it was prepared, its events chained under
/// the tenant's lock, which it then kept until COMMIT PREPARED: every
/// commit of that tenant, and keyturnd's work across tenants, waited.
async fn prepare_after(
    conn: &Conn,
    call: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    gid: &str,
) -> String {
    let tx = conn.transaction().await.unwrap();
    tx.query(call, params).await.unwrap();
    let answer = match tx
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await
    {
        Ok(()) => "prepared".to_owned(),
        Err(e) => sqlstate::<()>(Err(e)),
    };
    if answer == "prepared" {
        // Leave nothing prepared behind, whatever the assertion says.
        connect("postgres")
            .await
            .batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .await
            .ok();
    } else {
        tx.rollback().await.ok();
    }
    answer
}

/// Whether the cluster allows prepared transactions; if not, `test` is
/// noted as skipped, with the reason.
async fn prepared_transactions_on(su: &tokio_postgres::Client, test: &str) -> bool {
    let max: String = su
        .query_one("SHOW max_prepared_transactions", &[])
        .await
        .unwrap()
        .get(0);
    if max == "0" {
        note_skip(test, "max_prepared_transactions is 0 on this cluster");
    }
    max != "0"
}

#[tokio::test]
async fn test_a_transaction_that_changed_actions_cannot_be_prepared() {
    let su = connect("postgres").await;
    if !prepared_transactions_on(
        &su,
        "hardening_tests::test_a_transaction_that_changed_actions_cannot_be_prepared",
    )
    .await
    {
        return;
    }
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "x"}))
        .await
        .unwrap();
    let gid = unique("kt_prepared");
    // An agent's status change (ending its session cancels the proposal).
    let answer = prepare_after(&w.agent, "SELECT keyturn.end_session()", &[], &gid).await;
    assert_eq!(answer, "0A000", "the agent's end_session was prepared");
    assert_eq!(w.status(p.id).await, "pending");
    // A person's decision.
    let answer = prepare_after(
        &w.human,
        "SELECT * FROM keyturn.reject($1, $2, 'no')",
        &[&p.id, &p.token],
        &gid,
    )
    .await;
    assert_eq!(answer, "0A000", "the person's reject was prepared");
    assert_eq!(w.status(p.id).await, "pending");
    // A transaction that changed no action may still be prepared.
    let tx = w.agent.transaction().await.unwrap();
    tx.query("SELECT keyturn.current_tenant()", &[])
        .await
        .unwrap();
    tx.batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await
        .unwrap();
    su.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
        .await
        .unwrap();
    // And the tenant's chain is free: a decision commits at once.
    assert_eq!(
        w.approve(&p).await.unwrap().0,
        "queued",
        "the tenant's commits go on"
    );
}

/// Fourteenth red-team pass (docs/security.md, row 107): keyturn calls that
/// write or lock keyturn's rows without an audit event were prepared, and
/// kept their locks until someone rolled them back. An agent cancelled its
/// own conversation and prepared the transaction: the conversation stayed
/// live for it (the cancellation never committed) and the person's
/// `cancel_origin` of it waited on the prepared row for ever. Any
/// transaction in which keyturn acted is refused now.
#[tokio::test]
async fn test_a_transaction_in_which_keyturn_acted_cannot_be_prepared() {
    let su = connect("postgres").await;
    if !prepared_transactions_on(
        &su,
        "hardening_tests::test_a_transaction_in_which_keyturn_acted_cannot_be_prepared",
    )
    .await
    {
        return;
    }
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let conversation = unique("conv");
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "x"}))
        .await
        .unwrap();
    let gid = unique("kt_prepared");
    for (conn, call, what) in [
        (
            &w.agent,
            "SELECT keyturn.cancel_origin($1)::text",
            "the agent's cancel_origin",
        ),
        (
            &w.agent,
            "SELECT keyturn.archive_conversation($1)::text",
            "the agent's archive_conversation",
        ),
    ] {
        let answer = prepare_after(conn, call, &[&conversation], &gid).await;
        assert_eq!(answer, "0A000", "{what} was prepared");
    }
    let answer = prepare_after(
        &w.agent,
        "SELECT keyturn.stage_file('\\x00'::bytea, 'a.txt', 'text/plain')::text",
        &[],
        &gid,
    )
    .await;
    assert_eq!(answer, "0A000", "the agent's stage_file was prepared");
    let answer = prepare_after(&w.human, "SELECT keyturn.issue_token($1)", &[&p.id], &gid).await;
    assert_eq!(answer, "0A000", "the person's issue_token was prepared");
    let answer = prepare_after(
        &w.human,
        "SELECT keyturn.link_code($1)",
        &[&vec![p.id]],
        &gid,
    )
    .await;
    assert_eq!(answer, "0A000", "the person's link_code was prepared");
    // Fifteenth pass (row 112): calls that wrote or locked keyturn's rows
    // without noting an actor. The dispatcher's discovery held the tool's
    // recheck lock, so every approval of the tool waited in its COMMIT; an
    // admin's grant, likewise through the epoch; even a read entered keyturn.
    let dispatcher = Conn::connect("app_dispatcher", Identity::none()).await;
    let answer = prepare_after(
        &dispatcher,
        "SELECT keyturn.register_discovered_tool($1, $2, false)::text",
        &[
            &unique("up").replace('_', ""),
            &json!({"name": "post", "inputSchema": {"type": "object"}}),
        ],
        &gid,
    )
    .await;
    assert_eq!(answer, "0A000", "the dispatcher's discovery was prepared");
    let admin = Conn::connect("app_admin", Identity::none()).await;
    let answer = prepare_after(
        &admin,
        "SELECT keyturn.grant_tool($1, $2, $3)::text",
        &[&w.tenant, &w.principal, &t],
        &gid,
    )
    .await;
    assert_eq!(answer, "0A000", "the admin's grant was prepared");
    let answer = prepare_after(
        &w.human,
        "SELECT status FROM keyturn.action_status($1)",
        &[&p.id],
        &gid,
    )
    .await;
    assert_eq!(answer, "0A000", "a read of keyturn's was prepared");
    // Nothing was left holding a lock: the person's own cancellation of the
    // conversation commits at once.
    w.human
        .batch_execute(&format!(
            "SET lock_timeout = '5s'; SELECT keyturn.cancel_origin('{conversation}'); RESET lock_timeout"
        ))
        .await
        .expect("the person's cancel_origin");
    assert_eq!(
        count(
            &su,
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1",
            &[&gid]
        )
        .await,
        0
    );
}

// --- 6. No agent transaction delays the kill switch --------------------------

/// A covered proposal left open by its agent: 0.2.0 held FOR SHARE on the
/// global tool row, and set_tool_enabled waited for it (here: ran into its
/// lock_timeout). The switch takes effect now, and the open transaction's
/// write does not commit after it.
#[tokio::test]
async fn test_an_open_covered_proposal_does_not_delay_the_kill_switch() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let scope = json!({"params": {"where.id": {"min": 0}, "set.stage": {"max_length": 20}}});
    w.delegate(&t, scope, 5, "1 hour").await.unwrap();
    let tx = w.agent.transaction().await.unwrap();
    let status: String = tx
        .query_one(
            "SELECT status FROM keyturn.propose($1, $2)",
            &[&t, &form(deal, json!({"stage": "won"}))],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "succeeded");
    // The platform admin, with a lock_timeout: a wait for the agent's lock
    // fails the statement (55P03) rather than hanging the test.
    w.admin
        .batch_execute("SET lock_timeout = '5s'")
        .await
        .unwrap();
    let switched = w
        .admin
        .query_one("SELECT keyturn.set_tool_enabled($1, false)", &[&t])
        .await;
    w.admin.batch_execute("RESET lock_timeout").await.unwrap();
    assert!(
        switched.unwrap().get::<_, bool>(0),
        "the switch took effect"
    );
    // The agent's transaction, still open, cannot commit a write of a tool
    // that was switched off while it was open.
    assert_eq!(sqlstate(tx.commit().await), "40001");
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(w.stage_of(deal).await, "lead");
}

/// register_tool likewise.
#[tokio::test]
async fn test_an_open_task_proposal_does_not_delay_register_tool() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"approval": "task", "effect": "reversible"}))
        .await;
    assert!(
        record_request_on(&w.human, "conv", "turn-1", "msg-1", "please")
            .await
            .unwrap()
    );
    let tx = w.agent.transaction().await.unwrap();
    tx.query_one(
        "SELECT status FROM keyturn.propose($1, $2, $3)",
        &[
            &t,
            &json!({"channel": "ops", "text": "x"}),
            &task_origin("conv", "turn-1", "msg-1"),
        ],
    )
    .await
    .unwrap();
    w.admin
        .batch_execute("SET lock_timeout = '5s'")
        .await
        .unwrap();
    let r = w
        .admin
        .query_one(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &t,
                &json!({"executor": "external", "provider": "webhook", "approval": "task",
                          "effect": "reversible"}),
            ],
        )
        .await;
    w.admin.batch_execute("RESET lock_timeout").await.unwrap();
    r.unwrap();
    assert_eq!(sqlstate(tx.commit().await), "40001");
}

// --- 7. Attachment metadata typed at propose -----------------------------------

async fn files_tool(w: &World) -> String {
    w.tool(
        "files",
        json!({
            "executor": "external", "provider": "webhook", "effect": "reversible",
            "params_schema": {"type": "object", "required": ["files"], "properties": {
                "files": {"type": "array", "items": {"type": "object", "properties": {
                    "file_id": {"type": "string"}, "sha256": {"type": "string"},
                    "filename": {"type": "string"}, "content_type": {"type": "string"},
                    "size": {"type": "integer"}}}}}},
            "attachments_param": "files", "attachment_types": ["application/pdf"]
        }),
    )
    .await
}

/// `"size": 14.0` passed propose in 0.2.0, was approved, and then
/// keyturn.attachments() raised 22P02 after begin_dispatch, leaving the
/// action executing. Now propose types the metadata.
#[tokio::test]
async fn test_attachment_metadata_is_typed_at_propose() {
    let w = World::new("member").await;
    let t = files_tool(&w).await;
    let f = stage_file_on(
        &w.agent,
        b"%PDF-1.7 fourteen byt",
        "a.pdf",
        "application/pdf",
    )
    .await
    .unwrap();
    let good = f.attachment();
    let mut cases = Vec::new();
    for (key, value) in [
        ("size", json!(f.size as f64 + 0.0)),
        ("size", json!(format!("{}", f.size))),
        ("size", json!(-1)),
        ("sha256", json!(f.sha256.to_uppercase())),
        ("sha256", json!(format!("{}0", f.sha256))),
        ("file_id", json!(42)),
        ("filename", json!("a\u{202e}fdp.exe")),
    ] {
        let mut a = good.clone();
        a[key] = value;
        cases.push(a);
    }
    // 14.0 is written as a float: serde_json keeps the decimal point.
    let mut float_size = good.clone();
    float_size["size"] = serde_json::from_str(&format!("{}.0", f.size)).unwrap();
    cases.push(float_size);
    for a in cases {
        let r = propose_full(&w.agent, &t, json!({"files": [a]}), json!({})).await;
        assert_eq!(sqlstate(r), "22023", "{a}");
    }
    propose_full(&w.agent, &t, json!({"files": [good]}), json!({}))
        .await
        .unwrap();
}

// --- 8. Staged bytes are readable by the dispatcher alone ----------------------

#[tokio::test]
async fn test_no_agent_or_person_reads_staged_bytes() {
    let w = World::new("member").await;
    stage_file_on(&w.human, b"%PDF-1.7 private", "p.pdf", "application/pdf")
        .await
        .unwrap();
    for c in [&w.agent, &w.human] {
        let r = c
            .query("SELECT content FROM keyturn.staged_file", &[])
            .await;
        assert_eq!(sqlstate(r), "42501");
    }
}

#[tokio::test]
async fn test_staging_is_bounded_per_principal() {
    let w = World::new("member").await;
    for i in 0..20 {
        stage_file_on(
            &w.agent,
            format!("file {i}").as_bytes(),
            "f.pdf",
            "application/pdf",
        )
        .await
        .unwrap();
    }
    assert_eq!(
        sqlstate(stage_file_on(&w.agent, b"one more", "f.pdf", "application/pdf").await),
        "54000"
    );
    // Another principal of the tenant has a quota of its own.
    let (_, other) = w.other("member", "app_agent", "s-other").await;
    stage_file_on(&other, b"mine", "f.pdf", "application/pdf")
        .await
        .unwrap();
}

/// 100 MiB may wait per principal: four files of the most a file may hold
/// (25 MiB) fill it, and one byte more is refused.
#[tokio::test]
async fn test_staged_bytes_are_bounded_per_principal() {
    let w = World::new("member").await;
    let most = vec![b'x'; 25 * 1024 * 1024];
    for _ in 0..4 {
        stage_file_on(&w.agent, &most, "f.pdf", "application/pdf")
            .await
            .unwrap();
    }
    assert_eq!(
        sqlstate(stage_file_on(&w.agent, b"1", "f.pdf", "application/pdf").await),
        "54000"
    );
    let (_, other) = w.other("member", "app_agent", "s-other").await;
    stage_file_on(&other, &most, "f.pdf", "application/pdf")
        .await
        .unwrap();
}

#[tokio::test]
async fn test_staging_refuses_filenames_that_read_as_another() {
    let w = World::new("member").await;
    for name in [
        "invoice\u{202e}fdp.exe",
        "in\u{200b}voice.pdf",
        "a\u{2066}b.pdf",
        "x\u{feff}.pdf",
        "\u{e0041}.pdf",
        "a\u{00ad}b.pdf",
    ] {
        let r = stage_file_on(&w.agent, b"x", name, "application/pdf").await;
        assert_eq!(sqlstate(r), "22023", "{name:?}");
    }
}

// --- 10. Fenced numbers are bounded; more credential names ------------------------

#[tokio::test]
async fn test_a_fenced_number_is_bounded_like_a_string() {
    let w = World::new("member").await;
    let provider = format!("p{}", unique("fence").replace(['-', '_'], ""));
    w.admin
        .execute(
            "SELECT keyturn.register_projection($1, $2)",
            &[&provider, &json!({"fields": {"n": {"max_length": 10}}})],
        )
        .await
        .unwrap();
    let big: Value = serde_json::from_str(&"9".repeat(2010)).unwrap();
    let reference: String = w
        .agent
        .query_one(
            "SELECT reference FROM keyturn.fence($1, $2)",
            &[&provider, &json!({"n": big})],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!reference.contains(&"9".repeat(11)), "{reference}");
}

#[tokio::test]
async fn test_credential_names_cover_passcodes_pins_and_keys() {
    let w = World::new("member").await;
    let t = w
        .tool(
            "free",
            json!({"executor": "external", "provider": "webhook", "effect": "reversible",
                   "params_schema": {"type": "object", "additionalProperties": true}}),
        )
        .await;
    for key in [
        "passcode",
        "passphrase",
        "pin",
        "pin_code",
        "cardPin",
        "otp",
        "totp",
        "otp_code",
        "private_key",
        "privateKey",
        "mfa_code",
    ] {
        let r = propose_full(&w.agent, &t, json!({key: "4721"}), json!({})).await;
        assert_eq!(sqlstate(r), "22023", "{key}");
    }
    // Words that merely contain those letters stay allowed.
    for key in [
        "spinner",
        "option",
        "shipping",
        "opinion",
        "pinned_at",
        "keynote",
    ] {
        propose_full(&w.agent, &t, json!({key: "x"}), json!({}))
            .await
            .unwrap_or_else(|e| panic!("{key}: {}", message::<()>(Err(e))));
    }
}

// --- 9. No error carries a backtrace or a source path ----------------------------

/// The private cluster runs with RUST_BACKTRACE=1 in the postmaster's
/// environment (tests/harness.sh), as developer machines and some images
/// do. 0.2.0 sent every keyturn error's DETAIL with a Rust backtrace and the
/// build's source paths.
#[tokio::test]
async fn test_no_error_carries_a_backtrace_whatever_the_environment() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mut errors = Vec::new();
    // Raised from Rust (keyturn-core through the extension's error type),
    // from a Rust entry point's own refusal, and from plpgsql.
    errors.push(
        w.superuser
            .query_one("SELECT keyturn.canonical_json('1e400'::jsonb)", &[])
            .await
            .err(),
    );
    errors.push(
        w.human
            .query_one(
                "SELECT keyturn.delegate($1, '{\"params\": 1}', 1, '1 hour')",
                &[&t],
            )
            .await
            .err(),
    );
    errors.push(
        w.agent
            .query_one("SELECT * FROM keyturn.pending(10)", &[])
            .await
            .err(),
    );
    errors.push(
        propose_full(&w.agent, &t, json!({"channel": 1}), json!({}))
            .await
            .err(),
    );
    for e in errors {
        let e = e.expect("each call is refused");
        let db = e.as_db_error().expect("a database error");
        let all = format!(
            "{} | {} | {} | {}",
            db.message(),
            db.detail().unwrap_or(""),
            db.hint().unwrap_or(""),
            db.where_().unwrap_or("")
        );
        for leak in [
            "backtrace",
            ".rs:",
            "/src/",
            "rust_begin_unwind",
            "/root/",
            "/home/",
        ] {
            assert!(!all.contains(leak), "{leak:?} in {all}");
        }
        if let Some(file) = db.file() {
            assert!(!file.contains('/'), "a source path: {file}");
        }
    }
}

// --- Issue 35: a digest action keeps nothing that confirms a guess -------------

/// `{"to": "ceo@acme.example", "text": "PIN 4721"}` through a digest tool:
/// on 0.2.0 the stored params_hash, a plain SHA-256 of the canonical
/// params, gave the PIN back in at most 10,000 offline guesses, read by
/// another principal of the tenant under RLS and through preview. Now what
/// anyone reads is a MAC under a key no role can read: no guess checks out.
#[tokio::test]
async fn test_a_digest_actions_hash_confirms_no_guess() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"retain": "digest", "effect": "reversible",
            "params_schema": {"type": "object", "properties": {
                "to": {"type": "string"}, "text": {"type": "string"}, "amount": {"type": "number"}}}}))
        .await;
    let params = json!({"to": "ceo@acme.example", "text": "PIN 4721", "amount": 1.50});
    let p = w.propose(&t, params.clone()).await.unwrap();
    // The proposing call gets the plain hash (docs/sql-api.md, propose).
    assert_eq!(
        p.params_hash,
        keyturn_core::canonical::params_hash(&t, &params).unwrap()
    );
    // What others can read: the row under RLS, as another approver of the
    // tenant; preview, as the person with the token.
    let (_, other) = w.other("approver", "app_human", "s-other").await;
    let mut seen: Vec<String> = Vec::new();
    let stored: String = other
        .query_one(
            "SELECT params_hash FROM keyturn.action WHERE id = $1",
            &[&p.id],
        )
        .await
        .unwrap()
        .get(0);
    seen.push(stored);
    let preview: Value = w
        .human
        .query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    if let Some(h) = preview["params_hash"].as_str() {
        seen.push(h.to_owned());
    }
    let guesses: Vec<String> = (0..10_000)
        .map(|pin| {
            let guess =
                json!({"to": "ceo@acme.example", "text": format!("PIN {pin:04}"), "amount": 1.50});
            keyturn_core::canonical::params_hash(&t, &guess).unwrap()
        })
        .collect();
    for h in &seen {
        assert!(
            !guesses.contains(h),
            "a stored or shown hash confirms a guess of the PIN: {h}"
        );
    }
    // The person resubmits what they reviewed, spelled differently (1.5 for
    // 1.50, another key order): approved. Tampered params: rejected_tampered.
    let same: Value =
        serde_json::from_str(r#"{"text": "PIN 4721", "amount": 1.5, "to": "ceo@acme.example"}"#)
            .unwrap();
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, Some(same))
            .await
            .unwrap()
            .0,
        "queued"
    );
    let q = w.propose(&t, params.clone()).await.unwrap();
    let tampered = json!({"to": "ceo@acme.example", "text": "PIN 4722", "amount": 1.50});
    assert_eq!(
        approve_on(&w.human, q.id, &q.token, Some(tampered))
            .await
            .unwrap()
            .0,
        "rejected_tampered"
    );
}

/// The card cannot recompute a keyed digest, so it asks `preview` whether a
/// link's fields are the proposed ones: the same fields (spelled any way)
/// match; any others end the proposal `rejected_tampered` at once, as
/// approving with them would, so the token's holder gets one guess, not an
/// oracle to try PINs against.
#[tokio::test]
async fn test_preview_checks_a_digest_actions_fields_once() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"retain": "digest", "effect": "reversible",
            "params_schema": {"type": "object", "properties": {
                "to": {"type": "string"}, "text": {"type": "string"}}}}))
        .await;
    let params = json!({"to": "ceo@acme.example", "text": "PIN 4721"});
    let preview = |id: uuid::Uuid, token: String, params: Option<Value>| {
        let human = &w.human;
        async move {
            human
                .query_one(
                    "SELECT keyturn.preview($1, $2, $3)",
                    &[&id, &token, &params],
                )
                .await
                .unwrap()
                .get::<_, Value>(0)
        }
    };
    let p = w.propose(&t, params.clone()).await.unwrap();
    let plain = preview(p.id, p.token.clone(), None).await;
    assert!(plain.get("params_match").is_none(), "{plain}");
    let same = json!({"text": "PIN 4721", "to": "ceo@acme.example"});
    let checked = preview(p.id, p.token.clone(), Some(same.clone())).await;
    assert_eq!(checked["params_match"], json!(true), "{checked}");
    assert_eq!(checked["status"], "pending");
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, Some(same))
            .await
            .unwrap()
            .0,
        "queued"
    );

    let q = w.propose(&t, params.clone()).await.unwrap();
    let guess = json!({"to": "ceo@acme.example", "text": "PIN 0000"});
    let checked = preview(q.id, q.token.clone(), Some(guess)).await;
    assert_eq!(checked["params_match"], json!(false), "{checked}");
    assert_eq!(checked["status"], "rejected_tampered", "{checked}");
    // The right fields now: still false, and nothing to approve.
    let checked = preview(q.id, q.token.clone(), Some(params.clone())).await;
    assert_eq!(checked["status"], "rejected_tampered", "{checked}");
    assert_eq!(
        approve_on(&w.human, q.id, &q.token, Some(params))
            .await
            .unwrap()
            .0,
        "rejected_tampered"
    );
    // The lifecycle recorded why.
    let reason: Value = w
        .superuser
        .query_one(
            "SELECT detail FROM keyturn.event WHERE action_id = $1 AND to_status = 'rejected_tampered'",
            &[&q.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        reason["reason"], "previewed params hash mismatch",
        "{reason}"
    );
}

/// Red-team finding 2b: once a digest action was decided, preview's params
/// check cost nothing, so a token's holder could try every PIN. A decided
/// action's preview answers no params_match at all.
#[tokio::test]
async fn test_a_decided_digest_actions_preview_checks_no_guess() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"retain": "digest",
            "params_schema": {"type": "object", "properties": {
                "to": {"type": "string"}, "text": {"type": "string"}}}}))
        .await;
    let params = json!({"to": "ceo@acme.example", "text": "PIN 4721"});
    let p = w.propose(&t, params.clone()).await.unwrap();
    w.human
        .query_one("SELECT keyturn.reject($1, $2, 'no')", &[&p.id, &p.token])
        .await
        .unwrap();
    for guess in [
        params.clone(),
        json!({"to": "ceo@acme.example", "text": "PIN 0000"}),
    ] {
        let v: Value = w
            .human
            .query_one(
                "SELECT keyturn.preview($1, $2, $3)",
                &[&p.id, &p.token, &guess],
            )
            .await
            .unwrap()
            .get(0);
        assert!(v.get("params_match").is_none(), "{v}");
        assert_eq!(v["status"], "rejected");
    }
}

/// Eighth red-team pass (docs/security.md, row 92): PostgreSQL drops a
/// transaction's `ON COMMIT DROP` temporary tables (and empties its
/// `ON COMMIT DELETE ROWS` ones) after keyturn's last check at COMMIT. An
/// agent lengthened that part of its commit with thousands of them, and a
/// covered write committed about half a second after the kill switch had
/// returned; the tenant's chain was held as long. A transaction that changed
/// keyturn actions and touched temporary tables, in a session with more than
/// 64 temporary relations (tables and their indexes), is refused at COMMIT
/// (0A000), and nothing of it stays; a few temporary tables (a script
/// keeping its proposals in one) are fine.
#[tokio::test]
async fn test_a_commit_cannot_be_lengthened_with_temporary_tables() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let before = w.actions().await;
    // n temporary tables kt_<name>_1 … of these columns.
    let many = |name: &str, columns: &str, on_commit: &str, n: u32| {
        format!(
            "DO $$ BEGIN FOR i IN 1..{n} LOOP \
               EXECUTE format('CREATE TEMP TABLE kt_{name}_%s ({columns}) ON COMMIT {on_commit}', i); \
             END LOOP; END $$"
        )
    };

    // The agent: a proposal, and 65 temporary tables dropped at COMMIT.
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute(&many("scratch", "x int", "DROP", 65))
        .await
        .unwrap();
    propose_on(&tx, &t, json!({"channel": "ops", "text": "t1"}), json!({}))
        .await
        .unwrap();
    let refused = tx.commit().await;
    assert!(
        message(Err::<(), _>(refused.unwrap_err())).contains("temporary tables and indexes"),
        "the message names what to change"
    );

    // Fewer tables, each with indexes: relations are what PostgreSQL drops.
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute(&many(
        "indexed",
        "x int PRIMARY KEY, y int UNIQUE",
        "DROP",
        22,
    ))
    .await
    .unwrap();
    propose_on(&tx, &t, json!({"channel": "ops", "text": "t1b"}), json!({}))
        .await
        .unwrap();
    assert_eq!(sqlstate(tx.commit().await), "0A000");

    // Tables emptied at each COMMIT, made earlier in the session, then used.
    w.agent
        .batch_execute(&many("scratch", "x int", "DELETE ROWS", 65))
        .await
        .unwrap();
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute("INSERT INTO kt_scratch_1 VALUES (1)")
        .await
        .unwrap();
    propose_on(&tx, &t, json!({"channel": "ops", "text": "t2"}), json!({}))
        .await
        .unwrap();
    assert_eq!(sqlstate(tx.commit().await), "0A000");
    assert_eq!(
        w.actions().await,
        before,
        "nothing of a refused commit stays"
    );

    // The person's approval, in a transaction that touched them: refused too.
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "t3"}))
        .await
        .unwrap();
    let tx = w.human.transaction().await.unwrap();
    tx.batch_execute(&many("scratch", "x int", "DROP", 65))
        .await
        .unwrap();
    approve_on(&tx, p.id, &p.token, None).await.unwrap();
    assert_eq!(sqlstate(tx.commit().await), "0A000");
    assert_eq!(w.status(p.id).await, "pending");

    // A few temporary tables: a script keeps its proposal in one.
    let tx = w.human.transaction().await.unwrap();
    tx.batch_execute("CREATE TEMP TABLE kt_kept AS SELECT 1 AS x")
        .await
        .unwrap();
    approve_on(&tx, p.id, &p.token, None).await.unwrap();
    tx.commit()
        .await
        .expect("a session with a few temporary tables commits");
    assert_eq!(w.status(p.id).await, "queued");
}

/// A commit past its recheck is not something a kill switch returns before
/// (ninth red-team pass, docs/security.md row 95). PostgreSQL queues a
/// transaction's NOTIFYs after keyturn's commit callback, where its recheck
/// runs: a person who approved with a flood of notifications in the same
/// transaction made their commit last long past the recheck, and a kill
/// switch that returned in that time was followed by the approval's commit.
/// Now the kill switch waits for every commit that has read the tool
/// enabled; the one that has not read it yet waits for the switch and fails.
#[tokio::test]
async fn test_a_kill_switch_returns_only_after_commits_that_read_the_tool_enabled() {
    let w = World::new("member").await;
    let mut passed = 0;
    for attempt in 0..5 {
        let t = w.webhook_tool(json!({})).await;
        let p = w
            .propose(&t, json!({"channel": "ops", "text": format!("k{attempt}")}))
            .await
            .unwrap();
        let person = Conn::connect("app_human", w.identity()).await;
        let tx = person.transaction().await.unwrap();
        approve_on(&tx, p.id, &p.token, None).await.unwrap();
        let pid: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        // About 240 MB of notifications: PostgreSQL queues them after the
        // recheck, for a few hundred milliseconds.
        tx.batch_execute(
            "SELECT count(pg_notify('kt_flood', g::text || repeat('x', 4000))) \
               FROM generate_series(1, 60000) g",
        )
        .await
        .unwrap();
        let commit = tokio::spawn(async move { tx.commit().await });
        // Its COMMIT under way, past keyturn's callback (milliseconds) and
        // into the notifications (hundreds).
        loop {
            let committing: bool = w
                .superuser
                .query_one(
                    "SELECT coalesce(bool_or(query = 'COMMIT' AND state = 'active'), false) \
                       FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .unwrap()
                .get(0);
            if committing || commit.is_finished() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        w.admin
            .query_one("SELECT keyturn.set_tool_enabled($1, false)", &[&t])
            .await
            .unwrap();
        // What anyone sees once the switch has returned: the approval's
        // commit, if it is ever to commit, is in it (the client's own
        // answer may come later; the server's order is what counts).
        let seen = w.status(p.id).await;
        match commit.await.unwrap() {
            Ok(()) => {
                assert_ne!(
                    seen, "pending",
                    "an approval committed after the kill switch returned (attempt {attempt})"
                );
                passed += 1;
            }
            // Its recheck came after the switch: it read the tool disabled.
            Err(e) => assert_eq!(e.code().map(|c| c.code()), Some("40001")),
        }
    }
    assert!(
        passed > 0,
        "no attempt committed before the kill switch: the window was never exercised"
    );
}

/// A transaction made read only after it changed actions cannot write their
/// audit events at COMMIT: 25006 with keyturn's own words, not those of the
/// internal statement that failed (ninth red-team pass, F4), and nothing
/// of it stays.
#[tokio::test]
async fn test_a_transaction_made_read_only_after_a_change_is_refused_in_keyturns_words() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let before = w.actions().await;
    let tx = w.agent.transaction().await.unwrap();
    propose_on(&tx, &t, json!({"channel": "ops", "text": "ro"}), json!({}))
        .await
        .unwrap();
    tx.batch_execute("SET TRANSACTION READ ONLY").await.unwrap();
    let refused = tx.commit().await.unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("25006"));
    let text = message(Err::<(), _>(refused));
    assert!(text.contains("made read only"), "{text}");
    assert!(!text.contains("nextval"), "{text}");
    assert_eq!(w.actions().await, before, "nothing of it stays");
}

/// A reason the audit log cannot hold is refused when it is given (22023,
/// words about the reason), not at COMMIT with an internal error about
/// params (ninth red-team pass, F3). Control characters count as the
/// canonical form writes them (six bytes each).
#[tokio::test]
async fn test_a_reason_too_large_for_the_audit_log_is_refused_when_given() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    for reason in ["x".repeat(1_100_000), "\u{1}".repeat(200_000)] {
        let p = w
            .propose(&t, json!({"channel": "ops", "text": "r"}))
            .await
            .unwrap();
        let refused = w
            .human
            .query_one(
                "SELECT keyturn.reject($1, $2, $3)",
                &[&p.id, &p.token, &reason],
            )
            .await;
        let e = refused.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("22023"));
        let text = e
            .as_db_error()
            .map(|d| format!("{} {:?}", d.message(), d.hint()))
            .unwrap_or_default();
        assert!(text.contains("reason"), "{text}");
        assert!(!text.contains("params"), "{text}");
        assert_eq!(w.status(p.id).await, "pending", "nothing of it stays");
    }
    // A long reason that fits is kept.
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "r"}))
        .await
        .unwrap();
    let status: String = w
        .human
        .query_one(
            "SELECT keyturn.reject($1, $2, $3)",
            &[&p.id, &p.token, &"y".repeat(100_000)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "rejected");
}

/// Holds the action row of `p` with `FOR UPDATE` (as a superuser could)
/// until the returned client rolls back, and waits until an `approve` of it
/// waits for it, at its claim: since row 97 the one wait approve can meet.
async fn approve_waiting_for_the_action_row(
    w: &World,
    p: &Proposal,
    approver: Conn,
) -> (
    Client,
    tokio::task::JoinHandle<Result<(String, Option<Value>), Error>>,
) {
    let holder = connect("postgres").await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .query_one(
            "SELECT 1 FROM keyturn.action WHERE id = $1 FOR UPDATE",
            &[&p.id],
        )
        .await
        .unwrap();
    let (id, token) = (p.id, p.token.clone());
    let approving = tokio::spawn(async move { approve_on(&approver, id, &token, None).await });
    loop {
        let waiting = count(
            &w.superuser,
            "SELECT count(*) FROM pg_stat_activity \
              WHERE wait_event_type = 'Lock' AND query LIKE '%keyturn.approve(%'",
            &[],
        )
        .await;
        if waiting > 0 || approving.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(
        !approving.is_finished(),
        "approve did not wait for the action row"
    );
    (holder, approving)
}

/// approve's re-check after the claim reads the proposer's authorization
/// after the claim, never from before a wait for it: a revoke committed
/// while approve waits ends the proposal invalidated, recorded, as it would
/// have had approve come a moment later (tenth red-team pass, F1, where the
/// wait was for the tool row's lock: the merged read decided on its
/// pre-wait values, and only the commit's recheck stopped it, leaving the
/// proposal pending; row 97 took that lock away, and the claim's wait is
/// the one left).
#[tokio::test]
async fn test_a_revoke_committed_while_approve_waits_to_claim_invalidates() {
    let (w, t, _, human, p) = independent_proposal("s-approver", "wait").await;
    let (holder, approving) = approve_waiting_for_the_action_row(&w, &p, human).await;
    w.admin
        .query_one(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    holder.batch_execute("ROLLBACK").await.unwrap();
    let (status, result) = approving.await.unwrap().unwrap();
    assert_eq!(status, "invalidated", "{result:?}");
    assert_eq!(w.status(p.id).await, "invalidated");
}

/// The same for a grant that ends by its `valid_until` while approve waits
/// to claim: the time is read after the wait (tenth red-team pass, F1: the
/// approval committed after the grant had ended, which no recheck at commit
/// looks at).
#[tokio::test]
async fn test_a_grant_that_ends_while_approve_waits_to_claim_invalidates() {
    let (w, t, _, human, p) = independent_proposal("s-approver", "ends").await;
    tamper(
        &w.superuser,
        "UPDATE keyturn.tool_grant SET valid_until = clock_timestamp() + interval '300 milliseconds' \
          WHERE tenant = $1 AND principal = $2 AND tool = $3",
        &[&w.tenant, &w.principal, &t],
    )
    .await;
    let (holder, approving) = approve_waiting_for_the_action_row(&w, &p, human).await;
    while count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.tool_grant \
          WHERE tenant = $1 AND principal = $2 AND tool = $3 AND valid_until > clock_timestamp()",
        &[&w.tenant, &w.principal, &t],
    )
    .await
        > 0
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    let (status, result) = approving.await.unwrap().unwrap();
    assert_eq!(status, "invalidated", "{result:?}");
    let reason = result.unwrap()["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("no longer holds a grant"), "{reason}");
}

/// No lock on a tool's row stalls a decision (row 97): approve reads the
/// tool without one and answers while another transaction holds the row
/// with `FOR UPDATE` (0.3.0 before row 97 read it `FOR KEY SHARE` and
/// waited, as this test's guard would report). The kill switch still
/// binds: what the commit rechecks is the tool as committed then.
#[tokio::test]
async fn test_approve_does_not_wait_for_a_held_tool_row() {
    let (w, t, _, human, p) = independent_proposal("s-approver", "held").await;
    let holder = connect("postgres").await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .query_one(
            "SELECT 1 FROM keyturn.tool WHERE name = $1 FOR UPDATE",
            &[&t],
        )
        .await
        .unwrap();
    // A guard against a hang, not a measure of time: the old build waited
    // here until the holder let go.
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        approve_on(&human, p.id, &p.token, None),
    )
    .await
    .expect("approve waited for the tool row")
    .unwrap();
    assert_eq!(answered.0, "queued", "{:?}", answered.1);
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(w.status(p.id).await, "queued");
}

// --- Twelfth red-team pass: an open transaction holds no revocation ----------
//
// propose locked the proposer's grant (its uses and rate window), and a
// covered proposal locks the standing approval's row (its use), until the
// agent's transaction ends. An agent that left that transaction open made
// the person's revoke_delegation wait (keyturnd's /rpc answered 500 after
// its 10 s timeout, and the standing approval stayed live), and an admin's
// revoke_tool, grant_tool and remove_member hung as long. propose now locks
// the proposer's own row of the grant (keyturn.grant_use), which no admin
// call touches; revoke_delegation ends what it cannot lock through the epoch.

#[tokio::test]
async fn test_a_covered_proposal_left_open_cannot_hold_the_persons_revocation() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let d = w
        .delegate(
            &t,
            json!({"params": {"set.stage": {"eq": "won"}, "where.id": {"any": true}}}),
            50,
            "1 hour",
        )
        .await
        .unwrap();
    let open = w.agent.transaction().await.unwrap();
    let p = propose_full(
        &open,
        &t,
        json!({"where": {"id": deals[0]}, "set": {"stage": "won"}}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!((p.status.as_str(), p.delegation_id), ("succeeded", Some(d)));
    // The person revokes while the agent's transaction is still open: the
    // call returns (a statement_timeout stands for keyturnd's 10 s).
    let revoked = w.human.transaction().await.unwrap();
    revoked
        .batch_execute("SET LOCAL statement_timeout = '10s'")
        .await
        .unwrap();
    let r = revoked
        .query_one("SELECT keyturn.revoke_delegation($1)", &[&d])
        .await
        .expect("revoke_delegation returns while the agent holds the standing approval");
    assert!(r.get::<_, bool>(0));
    revoked.commit().await.unwrap();
    // The agent's covered write cannot commit after it.
    let (state, _) = failure(open.commit().await);
    assert_eq!(state, "40001");
    assert_eq!(w.stage_of(deals[0]).await, "lead", "nothing of it stays");
    // And the standing approval covers nothing any more.
    let later = propose_full(
        &w.agent,
        &t,
        json!({"where": {"id": deals[1]}, "set": {"stage": "won"}}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(
        (later.status.as_str(), later.delegation_id),
        ("pending", None)
    );
    let ended = ended_why(&w, d).await;
    assert!(ended.is_some(), "delegations() says it ended");
}

#[tokio::test]
async fn test_an_admin_changes_a_grant_an_open_proposal_uses_at_once() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    for (call, args) in [
        (
            "SELECT keyturn.grant_tool($1, $2, $3, '{\"max_targets\": 1}')",
            3,
        ),
        ("SELECT keyturn.revoke_tool($1, $2, $3)", 3),
        ("SELECT keyturn.remove_member($1, $2)", 2),
    ] {
        // A grant with a use limit, so that the proposal counts a use:
        // its row stays written by a transaction still open.
        w.grant_with(&w.principal, &t, None, None, Some(100))
            .await
            .unwrap();
        // A proposal made and left open: its transaction holds what
        // propose locked until it ends.
        let open = w.agent.transaction().await.unwrap();
        let p = propose_full(
            &open,
            &t,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
            json!({}),
        )
        .await
        .unwrap();
        let mut c = connect("app_admin").await;
        let admin = c.transaction().await.unwrap();
        admin
            .batch_execute("SET LOCAL statement_timeout = '10s'")
            .await
            .unwrap();
        // Then a second change of the grant, unchanged terms included:
        // none of them touches the proposer's row.
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = if args == 3 {
            vec![&w.tenant, &w.principal, &t]
        } else {
            vec![&w.tenant, &w.principal]
        };
        admin
            .query_one(call, &params)
            .await
            .unwrap_or_else(|e| panic!("{call} while a proposal is open: {e}"));
        for again in [
            "SELECT keyturn.grant_tool($1, $2, $3)",
            "SELECT keyturn.grant_tool($1, $2, $3)",
        ] {
            admin
                .query_one(again, &[&w.tenant, &w.principal, &t])
                .await
                .unwrap_or_else(|e| panic!("{again} after {call} while a proposal is open: {e}"));
        }
        admin.commit().await.unwrap();
        open.commit().await.unwrap();
        // What that proposal rested on changed: a person cannot approve it
        // (what was removed is given back, so that the person may try).
        if call.contains("remove_member") {
            w.admin
                .execute(
                    "SELECT keyturn.add_member($1, $2, 'member')",
                    &[&w.tenant, &w.principal],
                )
                .await
                .unwrap();
        }
        w.grant(&w.principal, &t).await;
        assert_eq!(
            w.approve(&p.proposal()).await.unwrap().0,
            "invalidated",
            "{call}"
        );
    }
}

/// A covered write whose transaction is still open when the person revokes
/// the evidence it cites, or cancels its conversation, does not commit
/// (twelfth red-team pass): both stops used to update only what was
/// committed, and the commit's recheck read the tool and the epoch only.
#[tokio::test]
async fn test_a_covered_write_left_open_does_not_outlive_a_revoked_citation_or_conversation() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    w.delegate(
        &t,
        json!({"params": {"set.stage": {"any": true}, "where.id": {"any": true}}}),
        50,
        "1 hour",
    )
    .await
    .unwrap();
    for (deal, stop) in [(deals[0], "evidence"), (deals[1], "conversation")] {
        let evidence: uuid::Uuid = w
            .human
            .query_one(
                "SELECT keyturn.record_evidence('document', 'contract.pdf', repeat('a', 64))",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let conversation = unique("conv");
        let open = w.agent.transaction().await.unwrap();
        let p = propose_full(
            &open,
            &t,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
            json!({"evidence": [evidence], "conversation_id": conversation}),
        )
        .await
        .unwrap();
        assert_eq!(p.status, "succeeded", "{stop}: covered");
        let sql = if stop == "evidence" {
            "SELECT keyturn.revoke_evidence($1::text::uuid)::text"
        } else {
            "SELECT keyturn.cancel_origin($1)::text"
        };
        let arg = if stop == "evidence" {
            evidence.to_string()
        } else {
            conversation.clone()
        };
        w.human.query_one(sql, &[&arg]).await.unwrap();
        let (state, message) = failure(open.commit().await);
        assert_eq!(state, "40001", "{stop}: {message}");
        assert_eq!(
            w.stage_of(deal).await,
            "lead",
            "{stop}: nothing of it stays"
        );
    }
}

/// Thirteenth red-team pass (docs/security.md row 105): a grant's
/// `valid_until` and a standing approval's end are terms of the decision as
/// much as a revocation is. A covered write left open in an agent's
/// transaction past either used to commit; it now fails at its commit as a
/// revoked grant's does.
#[tokio::test]
async fn test_a_covered_write_left_open_does_not_outlive_its_grant_or_standing_approval() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let scope = json!({"params": {"set.stage": {"any": true}, "where.id": {"any": true}}});
    for (deal, ends) in [(deals[0], "the grant"), (deals[1], "standing approval")] {
        let soon = std::time::SystemTime::now() + std::time::Duration::from_secs(2);
        let (until, valid_for) = if ends == "the grant" {
            (Some(soon), "1 hour")
        } else {
            (None, "2 seconds")
        };
        w.grant_with(&w.principal, &t, None, until, None)
            .await
            .unwrap();
        w.delegate(&t, scope.clone(), 50, valid_for).await.unwrap();
        let open = w.agent.transaction().await.unwrap();
        let p = propose_full(
            &open,
            &t,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
            json!({}),
        )
        .await
        .unwrap();
        assert_eq!(p.status, "succeeded", "{ends}: covered while it lasted");
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        let (state, message) = failure(open.commit().await);
        assert_eq!(state, "40001", "{ends}: {message}");
        assert!(
            message.starts_with(&format!("keyturn: {ends}")),
            "{ends}: says what ended: {message}"
        );
        assert!(
            message.contains("ended while this transaction was open"),
            "{message}"
        );
        assert_eq!(
            w.stage_of(deal).await,
            "lead",
            "{ends}: nothing of it stays"
        );
    }
    // A person's approval left open in the application's transaction past
    // the proposer's grant ends alike.
    let deal = w.deals(&w.principal, 1).await[0];
    let soon = std::time::SystemTime::now() + std::time::Duration::from_secs(2);
    w.grant_with(&w.principal, &t, None, Some(soon), None)
        .await
        .unwrap();
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    let open = w.human.transaction().await.unwrap();
    let (status, _) = approve_on(&open, p.id, &p.token, None).await.unwrap();
    assert_eq!(status, "succeeded", "approved while the grant lasted");
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (state, message) = failure(open.commit().await);
    assert_eq!(state, "40001", "approve: {message}");
    assert!(message.contains("valid until"), "approve: {message}");
    assert_eq!(
        w.stage_of(deal).await,
        "lead",
        "approve: nothing of it stays"
    );
}

/// Fourteenth red-team pass (docs/security.md row 108): three more terms an
/// approval rests on that end without moving a tool's version or an epoch,
/// each left open in a transaction past its end, used to commit: the
/// proposal's own expiry, the grant of the approver (and of each voter of a
/// quorum), and, for a task tool, the request's turn being the
/// conversation's latest. Each now fails at the commit (40001) and leaves
/// nothing behind.
#[tokio::test]
async fn test_an_approval_left_open_does_not_outlive_its_expiry_approvers_grant_or_turn() {
    let w = World::new("member").await;
    let form = |deal: i64| json!({"where": {"id": deal}, "set": {"stage": "won"}});
    let wait = || tokio::time::sleep(std::time::Duration::from_millis(2500));
    // (a) The proposal's expiry.
    let t = w.deal_tool(json!({"expires_in": "2 seconds"})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal)).await.unwrap();
    let open = w.human.transaction().await.unwrap();
    assert_eq!(
        approve_on(&open, p.id, &p.token, None).await.unwrap().0,
        "succeeded",
        "approved before it expired"
    );
    wait().await;
    let (state, message) = failure(open.commit().await);
    assert_eq!(state, "40001", "expiry: {message}");
    assert!(message.contains("expired"), "expiry: {message}");
    assert_eq!(w.stage_of(deal).await, "lead", "expiry: nothing stays");

    // (b) The approver's grant, and a voter's.
    for quorum in [1, 2] {
        let t = w
            .webhook_tool(json!({"approval": "independent", "quorum": quorum}))
            .await;
        let mut approvers = Vec::new();
        for i in 0..quorum {
            let (a, c) = w
                .other("approver", "app_human", &format!("q{quorum}-{i}"))
                .await;
            approvers.push((a, c));
        }
        let soon = std::time::SystemTime::now() + std::time::Duration::from_secs(2);
        // The first approver's grant ends soon: the only one, or the voter
        // who voted first.
        for (i, (a, _)) in approvers.iter().enumerate() {
            let until = (i == 0).then_some(soon);
            w.grant_with(a, &t, None, until, None).await.unwrap();
        }
        let p = w
            .propose(&t, json!({"channel": "ops", "text": "x"}))
            .await
            .unwrap();
        if quorum == 2 {
            assert_eq!(
                approve_on(&approvers[0].1, p.id, &p.token, None)
                    .await
                    .unwrap()
                    .0,
                "pending"
            );
        }
        let decider = &approvers[(quorum - 1) as usize].1;
        let open = decider.transaction().await.unwrap();
        assert_eq!(
            approve_on(&open, p.id, &p.token, None).await.unwrap().0,
            "queued",
            "quorum {quorum}: approved while the grant lasted"
        );
        wait().await;
        let (state, message) = failure(open.commit().await);
        assert_eq!(state, "40001", "quorum {quorum}: {message}");
        assert!(
            message.contains(&format!(
                "to {} {}",
                if quorum == 1 { "approver" } else { "voter" },
                approvers[0].0
            )),
            "quorum {quorum}: says whose grant ended: {message}"
        );
        assert_eq!(w.status(p.id).await, "pending", "quorum {quorum}");
    }

    // (c) A task request's turn: the person says something new while the
    // agent holds the admitted write open.
    let t = w.deal_tool(json!({"approval": "task"})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let conversation = unique("conv");
    assert!(
        record_request_on(&w.human, &conversation, "t1", "m1", "move it")
            .await
            .unwrap()
    );
    let open = w.agent.transaction().await.unwrap();
    let p = propose_full(
        &open,
        &t,
        form(deal),
        task_origin(&conversation, "t1", "m1"),
    )
    .await
    .unwrap();
    assert_eq!(p.status, "succeeded", "admitted by the latest turn");
    assert!(
        record_request_on(&w.human, &conversation, "t2", "m2", "no, stop")
            .await
            .unwrap()
    );
    let (state, message) = failure(open.commit().await);
    assert_eq!(state, "40001", "turn: {message}");
    assert!(message.contains("after t1"), "turn: {message}");
    assert_eq!(w.stage_of(deal).await, "lead", "turn: nothing stays");
}

/// Sixteenth red-team pass (docs/security.md row 114): the context keyturn
/// merges into event details (a quorum, a standing approval, a task request)
/// outlived the call that set it. A person who met a quorum and then
/// rejected another action in the same transaction chained `quorum` into the
/// rejection; an agent whose covered propose failed in a savepoint chained
/// the standing approval into a later, uncovered proposal.
#[tokio::test]
async fn test_an_events_context_is_its_own_calls_alone() {
    let w = World::new("member").await;
    let detail = |id: uuid::Uuid, to: &'static str| {
        let su = &w.superuser;
        async move {
            su.query_one(
                "SELECT detail FROM keyturn.event WHERE action_id = $1 AND to_status = $2::text::keyturn.status \
                 ORDER BY id DESC LIMIT 1",
                &[&id, &to],
            )
            .await
            .unwrap()
            .get::<_, Value>(0)
        }
    };
    // A quorum met, then a rejection, in one transaction.
    let t = w
        .webhook_tool(json!({"approval": "independent", "quorum": 2}))
        .await;
    let mut voters = Vec::new();
    for i in 0..2 {
        let (v, c) = w.other("approver", "app_human", &format!("ctx{i}")).await;
        w.grant(&v, &t).await;
        voters.push(c);
    }
    let a = w
        .propose(&t, json!({"channel": "ops", "text": "a"}))
        .await
        .unwrap();
    let c = w
        .propose(&t, json!({"channel": "ops", "text": "c"}))
        .await
        .unwrap();
    assert_eq!(
        approve_on(&voters[0], a.id, &a.token, None)
            .await
            .unwrap()
            .0,
        "pending"
    );
    let tx = voters[1].transaction().await.unwrap();
    assert_eq!(
        approve_on(&tx, a.id, &a.token, None).await.unwrap().0,
        "queued"
    );
    tx.query(
        "SELECT * FROM keyturn.reject($1, $2, 'too high')",
        &[&c.id, &c.token],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(detail(a.id, "queued").await["quorum"], json!(2));
    let rejected = detail(c.id, "rejected").await;
    assert!(rejected.get("quorum").is_none(), "{rejected}");

    // A covered propose that fails in a savepoint, then an uncovered one.
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 1).await;
    w.delegate(
        &t,
        json!({"params": {"set.stage": {"in": ["won"]}, "where.id": {"any": true}}}),
        50,
        "1 hour",
    )
    .await
    .unwrap();
    let holder = connect("postgres").await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM crm.deal WHERE id = {} FOR UPDATE",
            deals[0]
        ))
        .await
        .unwrap();
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL lock_timeout = '200ms'; SAVEPOINT covered")
        .await
        .unwrap();
    let covered = propose_full(
        &tx,
        &t,
        json!({"where": {"id": deals[0]}, "set": {"stage": "won"}}),
        json!({}),
    )
    .await;
    assert_eq!(
        sqlstate(covered),
        "55P03",
        "the covered write waited for the row"
    );
    // (The comment first: Tx refuses a statement that starts with ROLLBACK,
    // which would end the whole transaction; this one only ends a savepoint.)
    tx.batch_execute("/* the savepoint */ ROLLBACK TO SAVEPOINT covered")
        .await
        .unwrap();
    let plain = propose_full(
        &tx,
        &t,
        json!({"where": {"id": deals[0]}, "set": {"stage": "lost"}}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(plain.status, "pending", "not covered");
    tx.commit().await.unwrap();
    holder.batch_execute("ROLLBACK").await.unwrap();
    let made = detail(plain.id, "pending").await;
    assert!(
        made.get("delegation").is_none() && made.get("delegated_by").is_none(),
        "{made}"
    );
}

/// Sixteenth red-team pass (docs/security.md row 116): a bound on a length
/// of time compared a month as 30 days, where adding it counts the
/// calendar: a standing approval of '120 mons -3593 days' passed "at most 7
/// days" and lasted 60, a link code's ttl likewise. Every such bound holds
/// however the calendar adds the interval: no part below 0, a month counted
/// as 31 days, a year as 366; so a month or a year is still a good rate
/// window (a first form refused them).
#[tokio::test]
async fn test_a_bound_on_a_length_of_time_holds_on_the_calendar() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let scope = json!({"params": {"set.stage": {"any": true}, "where.id": {"any": true}}});
    for valid_for in ["120 mons -3593 days", "1 mon -23 days", "1 year -358 days"] {
        assert_eq!(
            sqlstate(w.delegate(&t, scope.clone(), 5, valid_for).await),
            "22023",
            "{valid_for}"
        );
    }
    w.delegate(&t, scope, 5, "7 days").await.unwrap();
    let p = w
        .propose(
            &t,
            json!({"where": {"id": w.deals(&w.principal, 1).await[0]}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    let r = w
        .human
        .query_one(
            "SELECT keyturn.link_code($1, '12 mons -359 days')",
            &[&vec![p.id]],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    let r = w
        .admin
        .query_one(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &unique("kt_test_months"),
                &json!({"kind": "read", "expires_in": "1 mon -23 days"}),
            ],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    // A rate window of a month or a year is within its 366 days; one that
    // could outlast them on the calendar is not, nor a part below 0.
    let rate = |per: &str| {
        let admin = &w.admin;
        let spec = json!({"kind": "read", "rate_limit": {"max": 10, "per": per}});
        async move {
            admin
                .query_one(
                    "SELECT keyturn.register_tool($1, $2)",
                    &[&unique("kt_test_rate"), &spec],
                )
                .await
                .map(|_| ())
        }
    };
    for per in ["1 mon", "1 year", "11 mons 20 days", "366 days"] {
        rate(per).await.unwrap_or_else(|e| panic!("{per}: {e}"));
    }
    for per in [
        "1 year 1 day",
        "12 mons 1 hour",
        "1 mon -1 day",
        "1 day -1 second",
        "367 days",
    ] {
        assert_eq!(sqlstate(rate(per).await), "22023", "{per}");
    }
    assert_eq!(
        sqlstate(
            w.delegate(
                &t,
                json!({"params": {"set.stage": {"any": true}, "where.id": {"any": true}}}),
                5,
                "1 mon"
            )
            .await
        ),
        "22023",
        "a month may outlast 7 days"
    );
}
