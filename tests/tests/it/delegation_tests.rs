//! docs/sql-api.md, "Scoped grants and standing approvals": a person's
//! standing approval approves what it covers inside propose, as that
//! person's database role, a counted number of times, until it is revoked,
//! runs out, ends, or the person's authorization changes.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};

fn form(deal: i64, stage: &str) -> Value {
    json!({"where": {"id": deal}, "set": {"stage": stage}})
}

/// Any of the deals, moved to won: the scope names both paths the form
/// carries, as a standing approval must (a path it left out would be
/// unbounded with nobody looking).
fn won_only() -> Value {
    json!({"params": {"set.stage": {"eq": "won"}, "where.id": {"any": true}}})
}

/// Every call of an sql stage tool: both paths named, both free.
fn any_stage() -> Value {
    json!({"params": {"set.stage": {"any": true}, "where.id": {"any": true}}})
}

async fn covered(w: &World, tool: &str, params: Value) -> Proposed {
    propose_full(&w.agent, tool, params, json!({}))
        .await
        .unwrap()
}

/// (max_uses, uses, revoked) of a standing approval, as `keyturn.delegations()`
/// shows it to its principal.
async fn listed(w: &World, id: uuid::Uuid) -> (i32, i32, bool) {
    listed_on(&w.human, id).await
}

async fn listed_on(c: &Conn, id: uuid::Uuid) -> (i32, i32, bool) {
    let r = c
        .query_one(
            "SELECT max_uses, uses, revoked FROM keyturn.delegations() WHERE delegation_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test]
async fn test_covered_proposal_succeeds_at_once_with_its_delegation() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let p = covered(&w, &t, form(deal, "won")).await;
    assert_eq!(p.status, "succeeded");
    assert_eq!(p.delegation_id, Some(d));
    assert_eq!(w.status(p.id).await, "succeeded");
    assert_eq!(w.stage_of(deal).await, "won");
    assert_eq!(w.writes(deal).await, 1);
    assert_eq!(w.usage_rows(p.id).await, 1);
    let r = w
        .superuser
        .query_one(
            "SELECT approved_by, approved_role, approved_via FROM keyturn.action WHERE id = $1",
            &[&p.id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), w.principal);
    assert_eq!(r.get::<_, String>(1), "app_human");
    assert_eq!(r.get::<_, String>(2), format!("delegation:{d}"));
    assert_eq!(listed(&w, d).await, (5, 1, false));
    // Its token was used by the standing approval: the person's approve is a replay.
    assert_eq!(w.approve(&p.proposal()).await.unwrap().0, "succeeded");
    assert_eq!(w.writes(deal).await, 1);
}

#[tokio::test]
async fn test_proposal_outside_the_delegation_scope_stays_pending() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let p = covered(&w, &t, form(deal, "lost")).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(listed(&w, d).await.1, 0, "no use spent");
    assert_eq!(w.approve(&p.proposal()).await.unwrap().0, "succeeded");
}

#[tokio::test]
async fn test_spent_uses_leave_the_next_proposal_pending() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 3).await;
    let d = w.delegate(&t, won_only(), 2, "1 hour").await.unwrap();
    for &deal in &deals[..2] {
        assert_eq!(covered(&w, &t, form(deal, "won")).await.status, "succeeded");
    }
    assert_eq!(listed(&w, d).await, (2, 2, false));
    let p = covered(&w, &t, form(deals[2], "won")).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    assert_eq!(w.writes(deals[2]).await, 0);
    assert_eq!(listed(&w, d).await, (2, 2, false));
}

async fn revoke(c: &Conn, id: uuid::Uuid) -> Result<bool, tokio_postgres::Error> {
    c.query_one("SELECT keyturn.revoke_delegation($1)", &[&id])
        .await
        .map(|r| r.get(0))
}

/// Revoked by its principal, or by an admin of the tenant; another approver
/// may see it but not end it, a member does not even see it.
#[tokio::test]
async fn test_revoked_delegation_covers_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let (_, approver) = w.other("approver", "app_human", "s-approver").await;
    assert_eq!(sqlstate(revoke(&approver, d).await), "42501");
    let (_, member) = w.other("member", "app_human", "s-member").await;
    assert!(!revoke(&member, d).await.unwrap(), "invisible to a member");
    assert!(!listed(&w, d).await.2);
    assert!(revoke(&w.human, d).await.unwrap());
    assert!(!revoke(&w.human, d).await.unwrap(), "revoked once");
    assert!(listed(&w, d).await.2);
    let p = covered(&w, &t, form(deals[0], "won")).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));

    let d2 = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let (_, admin) = w.other("admin", "app_human", "s-admin").await;
    assert!(
        revoke(&admin, d2).await.unwrap(),
        "a tenant admin may end it"
    );
    let p = covered(&w, &t, form(deals[1], "won")).await;
    assert_eq!(p.status, "pending");
    assert_eq!(w.writes(deals[1]).await, 0);
}

#[tokio::test]
async fn test_expired_delegation_covers_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w.delegate(&t, won_only(), 5, "1 second").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let p = covered(&w, &t, form(deal, "won")).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    assert_eq!(listed(&w, d).await.1, 0);
}

/// The delegator's authorization changing ends it (a grant of another tool
/// is enough); a grant call that changes nothing does not.
#[tokio::test]
async fn test_epoch_change_ends_the_delegation() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let same: bool = w
        .admin
        .query_one(
            "SELECT keyturn.grant_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!same);
    assert_eq!(
        covered(&w, &t, form(deals[0], "won")).await.status,
        "succeeded"
    );
    w.webhook_tool(json!({})).await; // granted: a new epoch
    let p = covered(&w, &t, form(deals[1], "won")).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("pending", None));
    assert_eq!(listed(&w, d).await, (5, 1, false));
}

#[tokio::test]
async fn test_delegation_covers_only_its_own_principal() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let (other, other_agent) = w.other("member", "app_agent", "s-other").await;
    w.grant(&other, &t).await;
    let other_human =
        Conn::connect("app_human", Identity::gucs(&w.tenant, &other, "s-other")).await;
    delegate_on(&other_human, &t, won_only(), 5, "1 hour")
        .await
        .unwrap();
    let p = covered(&w, &t, form(deal, "won")).await;
    assert_eq!(p.status, "pending");
    let theirs = propose_full(&other_agent, &t, form(deal, "won"), json!({}))
        .await
        .unwrap();
    assert_eq!(theirs.status, "succeeded");
}

/// Tools whose approval is more than one person's look, or the chat request,
/// or whose effect cannot be undone (unless the tool says so), take no
/// standing approval.
#[tokio::test]
async fn test_tools_that_need_a_closer_look_are_not_delegable() {
    let w = World::new("approver").await;
    let external = json!({"executor": "external", "provider": "webhook", "effect": "reversible",
        "params_schema": {"type": "object", "properties": {"channel": {"type": "string"}}}});
    let with = |extra: Value| {
        let mut s = external.clone();
        if let (Value::Object(s), Value::Object(e)) = (&mut s, extra) {
            s.extend(e);
        }
        s
    };
    for (what, spec) in [
        ("independent", with(json!({"approval": "independent"}))),
        (
            "quorum 2",
            with(json!({"approval": "independent", "quorum": 2})),
        ),
        ("task", with(json!({"approval": "task"}))),
        ("irreversible", with(json!({"effect": "irreversible"}))),
        (
            "irreversible, delegable false",
            with(json!({"effect": "irreversible", "delegable": false})),
        ),
    ] {
        let t = w.tool("nodeleg", spec).await;
        let r = w.delegate(&t, json!({}), 1, "1 hour").await;
        let msg = message(w.delegate(&t, json!({}), 1, "1 hour").await);
        assert_eq!(sqlstate(r), "22023", "{what}");
        assert!(
            msg.contains("cannot be approved by a standing approval"),
            "{what}: {msg}"
        );
    }
    let t = w
        .tool(
            "deleg",
            with(json!({"effect": "irreversible", "delegable": true})),
        )
        .await;
    let d = w
        .delegate(
            &t,
            json!({"params": {"channel": {"any": true}}}),
            1,
            "1 hour",
        )
        .await
        .unwrap();
    let p = covered(&w, &t, json!({"channel": "c"})).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("queued", Some(d)));
}

#[tokio::test]
async fn test_delegate_checks_its_arguments_and_the_grant() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    for (what, scope, max_uses, valid_for) in [
        ("max_uses 0", json!({}), 0, "1 hour"),
        ("max_uses 1001", json!({}), 1001, "1 hour"),
        ("valid_for 0", json!({}), 1, "0 seconds"),
        ("valid_for negative", json!({}), 1, "-1 hour"),
        ("valid_for over 7 days", json!({}), 1, "7 days 1 second"),
        (
            "malformed scope",
            json!({"params": {"set.stage": {}}}),
            1,
            "1 hour",
        ),
        ("unknown scope key", json!({"uses": 1}), 1, "1 hour"),
    ] {
        assert_eq!(
            sqlstate(w.delegate(&t, scope, max_uses, valid_for).await),
            "22023",
            "{what}"
        );
    }
    assert_eq!(
        sqlstate(
            w.human
                .query_one(
                    "SELECT keyturn.delegate($1, NULL, 1, interval '1 hour')",
                    &[&t]
                )
                .await
        ),
        "22023",
        "a scope is required"
    );
    w.delegate(&t, json!({}), 1000, "7 days").await.unwrap();

    let ungranted = w.webhook_tool(json!({"effect": "reversible"})).await;
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &ungranted],
        )
        .await
        .unwrap();
    assert_eq!(
        sqlstate(w.delegate(&ungranted, json!({}), 1, "1 hour").await),
        "42501",
        "only what its principal may itself propose"
    );
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.delegation WHERE tenant = $1",
            &[&w.tenant]
        )
        .await,
        1
    );
}

/// A standing approval is an approval: an agent can neither make, end nor
/// list one.
#[tokio::test]
async fn test_agent_cannot_delegate() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    assert_eq!(
        sqlstate(delegate_on(&w.agent, &t, json!({}), 1, "1 hour").await),
        "42501"
    );
    let d = w.delegate(&t, json!({}), 1, "1 hour").await.unwrap();
    assert_eq!(
        sqlstate(
            w.agent
                .query_one("SELECT keyturn.revoke_delegation($1)", &[&d])
                .await
        ),
        "42501"
    );
    assert_eq!(
        sqlstate(
            w.agent
                .query("SELECT * FROM keyturn.delegations()", &[])
                .await
        ),
        "42501"
    );
    assert_eq!(listed(&w, d).await, (1, 0, false));
}

/// The agent resolves the targets under its own RLS; the covered write runs
/// as the role that made the standing approval, under that role's RLS. A row
/// only the agent can see is therefore never written: the write finds no
/// row, the outcome is a conflict, and the use is spent all the same.
#[tokio::test]
async fn test_covered_write_runs_as_the_delegating_role_under_its_rls() {
    let w = World::new("member").await;
    let login = approver_login(&w.superuser).await;
    let table = w.role_table(&[&login]).await;
    let t = w.role_table_tool(&table, json!({})).await;
    let seen = w.role_table_row(&table, false).await;
    let hidden = w.role_table_row(&table, true).await;
    let person = Conn::connect(&login, w.identity()).await;
    let d = delegate_on(&person, &t, any_stage(), 5, "1 hour")
        .await
        .unwrap();

    let p = covered(&w, &t, form(seen, "won")).await;
    assert_eq!(p.status, "succeeded");
    assert_eq!(
        w.role_table_state(&table, seen).await,
        ("won".to_owned(), Some(login.clone()))
    );

    let p = covered(&w, &t, form(hidden, "won")).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("conflict", Some(d)));
    assert_eq!(
        w.role_table_state(&table, hidden).await,
        ("lead".to_owned(), None)
    );
    assert_eq!(listed_on(&person, d).await.1, 2, "the conflict spent a use");
}

/// The role a standing approval writes as must still exist.
#[tokio::test]
async fn test_delegation_of_a_dropped_role_covers_nothing() {
    let w = World::new("member").await;
    let login = approver_login(&w.superuser).await;
    let table = w.role_table(&[&login]).await;
    let t = w.role_table_tool(&table, json!({})).await;
    let rows = [
        w.role_table_row(&table, false).await,
        w.role_table_row(&table, false).await,
    ];
    let person = Conn::connect(&login, w.identity()).await;
    delegate_on(&person, &t, won_only(), 5, "1 hour")
        .await
        .unwrap();
    assert_eq!(
        covered(&w, &t, form(rows[0], "won")).await.status,
        "succeeded"
    );
    drop(person);
    w.superuser
        .batch_execute(&format!(
            "REVOKE ALL ON {table} FROM {login}; DROP ROLE {login}"
        ))
        .await
        .unwrap();
    assert_eq!(
        covered(&w, &t, form(rows[1], "won")).await.status,
        "pending"
    );
    assert_eq!(w.role_table_state(&table, rows[1]).await.0, "lead");
}

#[tokio::test]
async fn test_audit_names_the_delegation_and_the_delegating_principal() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let p = covered(&w, &t, form(deal, "won")).await;
    let rows = w
        .human
        .query(
            "SELECT from_status, to_status, detail FROM keyturn.audit($1)",
            &[&p.id],
        )
        .await
        .unwrap();
    let events: Vec<(Option<String>, String, Value)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    let (from, to, detail) = &events[1];
    assert_eq!(
        (from.as_deref(), to.as_str()),
        (Some("pending"), "succeeded")
    );
    assert_eq!(detail["delegation"], json!(d.to_string()), "{detail}");
    assert_eq!(detail["delegated_by"], json!(w.principal), "{detail}");
}

/// One transaction, two proposals: the first covered, the second not. The
/// second's events must not claim the first one's standing approval.
#[tokio::test]
async fn test_delegation_context_ends_with_its_proposal() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let tx = w.agent.transaction().await.unwrap();
    let first = propose_full(&tx, &t, form(deals[0], "won"), json!({}))
        .await
        .unwrap();
    let second = propose_full(&tx, &t, form(deals[1], "lost"), json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (first.status.as_str(), second.status.as_str()),
        ("succeeded", "pending")
    );
    let detail: Value = w
        .superuser
        .query_one(
            "SELECT detail FROM keyturn.event WHERE action_id = $1",
            &[&second.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        detail.get("delegation").is_none() && detail.get("delegated_by").is_none(),
        "an uncovered proposal's event names a standing approval: {detail}"
    );
}

/// A covered external proposal is queued with a valid approval binding, so
/// the dispatcher leases and dispatches it.
#[tokio::test]
async fn test_covered_external_proposal_is_queued_and_dispatched() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"effect": "reversible"})).await;
    let d = w
        .delegate(
            &t,
            json!({"params": {"channel": {"eq": "ops"}, "text": {"any": true}}}),
            1,
            "1 hour",
        )
        .await
        .unwrap();
    let p = covered(&w, &t, json!({"channel": "ops", "text": "hi"})).await;
    assert_eq!((p.status.as_str(), p.delegation_id), ("queued", Some(d)));
    let disp = connect("app_dispatcher").await;
    let l = lease_mine(&disp, &[p.id], "30 seconds").await.remove(0);
    assert_eq!(l.params, Some(json!({"channel": "ops", "text": "hi"})));
    assert!(
        begin(&disp, &l).await.unwrap(),
        "the approval binding holds"
    );
    assert_eq!(
        complete(&disp, &l, "succeeded", json!({}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_eq!(w.usage_rows(p.id).await, 1);
}

/// No concurrency approves more than max_uses: eight proposals at once, each
/// on a connection of its own, against three uses.
#[tokio::test]
async fn test_concurrent_covered_proposals_never_exceed_max_uses() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 8).await;
    let d = w.delegate(&t, won_only(), 3, "1 hour").await.unwrap();
    let mut agents = Vec::new();
    for i in 0..8 {
        agents.push(
            Conn::connect(
                "app_agent",
                Identity::gucs(&w.tenant, &w.principal, &format!("s{i}")),
            )
            .await,
        );
    }
    let runs = agents.iter().zip(&deals).map(|(a, &deal)| {
        let t = t.clone();
        async move {
            propose_full(a, &t, form(deal, "won"), json!({}))
                .await
                .unwrap()
        }
    });
    let results = futures_util::future::join_all(runs).await;
    let approved: Vec<&Proposed> = results.iter().filter(|p| p.status == "succeeded").collect();
    assert_eq!(approved.len(), 3, "{results:?}");
    assert!(approved.iter().all(|p| p.delegation_id == Some(d)));
    assert_eq!(
        results.iter().filter(|p| p.status == "pending").count(),
        5,
        "{results:?}"
    );
    let written: i64 = count(
        &w.superuser,
        "SELECT count(*) FROM crm.deal_writes WHERE deal_id = ANY ($1)",
        &[&deals],
    )
    .await;
    assert_eq!(written, 3);
    assert_eq!(listed(&w, d).await, (3, 3, false));
}

/// A revision is the person looking at the proposal: it is never approved by
/// a standing approval, even inside its scope.
#[tokio::test]
async fn test_revision_is_never_covered() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    let p = covered(&w, &t, form(deal, "lost")).await;
    assert_eq!(p.status, "pending");
    let revised = w
        .human
        .query_one(
            "SELECT action_id FROM keyturn.revise($1, $2, $3)",
            &[&p.id, &p.token, &form(deal, "won")],
        )
        .await
        .unwrap();
    let id: uuid::Uuid = revised.get(0);
    assert_eq!(w.status(id).await, "pending");
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(listed(&w, d).await.1, 0);
}

#[tokio::test]
async fn test_cancelled_origin_is_refused_before_any_use_is_spent() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let d = w.delegate(&t, won_only(), 5, "1 hour").await.unwrap();
    w.agent
        .query_one("SELECT keyturn.cancel_origin('conv-gone')", &[])
        .await
        .unwrap();
    assert_eq!(
        sqlstate(
            propose_full(
                &w.agent,
                &t,
                form(deal, "won"),
                json!({"conversation_id": "conv-gone"})
            )
            .await
        ),
        "55000"
    );
    assert_eq!(listed(&w, d).await.1, 0);
    assert_eq!(w.writes(deal).await, 0);
}

/// A REPEATABLE READ proposal whose snapshot still shows a use left, after
/// another proposal spent it: refused to serialize, or pending, never a
/// second approval.
#[tokio::test]
async fn test_repeatable_read_proposal_never_spends_a_spent_use() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let d = w.delegate(&t, won_only(), 1, "1 hour").await.unwrap();
    let late = Conn::connect("app_agent", w.identity()).await;
    let tx = late
        .transaction_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    tx.query_one("SELECT count(*) FROM keyturn.delegation", &[])
        .await
        .unwrap(); // snapshot taken: one use left
    assert_eq!(
        covered(&w, &t, form(deals[0], "won")).await.status,
        "succeeded"
    );
    match propose_full(&tx, &t, form(deals[1], "won"), json!({})).await {
        Ok(p) => assert_eq!(p.status, "pending"),
        Err(e) => assert_eq!(e.code().map(|c| c.code()), Some("40001"), "{e}"),
    }
    let _ = tx.commit().await;
    assert_eq!(w.writes(deals[1]).await, 0);
    assert_eq!(listed(&w, d).await.1, 1);
}

/// The covered writes of an sql tool would run as the delegating role: one
/// that bypasses row-level security may not make a standing approval for it.
#[tokio::test]
async fn test_rls_bypassing_role_cannot_delegate_an_sql_tool() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let bypass = Conn::connect("app_bypass", w.identity()).await;
    assert_eq!(
        sqlstate(delegate_on(&bypass, &t, json!({}), 1, "1 hour").await),
        "42501"
    );
    let hook = w.webhook_tool(json!({"effect": "reversible"})).await;
    delegate_on(&bypass, &hook, json!({}), 1, "1 hour")
        .await
        .expect("an external tool's call is not a write under RLS");
}
