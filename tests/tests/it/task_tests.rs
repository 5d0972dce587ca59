//! docs/sql-api.md, "Task-only effects": for a tool with approval task, the
//! person's recorded request in the chat is the approval. propose admits a
//! call only for the latest recorded turn of a live conversation of the same
//! principal and session, approves it at once, and never twice; before
//! execution everything is checked again.

use keyturn_tests::*;
use serde_json::{json, Value};

fn form(deal: i64, stage: &str) -> Value {
    json!({"where": {"id": deal}, "set": {"stage": stage}})
}

async fn sql_task_tool(w: &World) -> String {
    w.deal_tool(json!({"approval": "task"})).await
}

async fn external_task_tool(w: &World) -> String {
    w.webhook_tool(json!({"approval": "task", "effect": "reversible"}))
        .await
}

async fn record(w: &World, conversation: &str, turn: &str, message: &str) {
    assert!(
        record_request_on(&w.human, conversation, turn, message, "please do it")
            .await
            .unwrap()
    );
}

async fn task_actions(w: &World, message: &str) -> i64 {
    count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.action WHERE tenant = $1 AND origin ->> 'message_id' = $2",
        &[&w.tenant, &message],
    )
    .await
}

/// Each admission rule, broken alone: the same call with nothing changed
/// but that one thing is admitted at the end, so each refusal is that
/// rule's, and each refusal stores nothing.
#[tokio::test]
async fn test_admission_needs_the_recorded_message_of_this_principal_session_conversation_and_turn()
{
    let w = World::new("member").await;
    let t = sql_task_tool(&w).await;
    let deal = w.deals(&w.principal, 1).await[0];
    record(&w, "conv", "turn-1", "msg-1").await;
    let other_session = Conn::connect(
        "app_agent",
        Identity::gucs(&w.tenant, &w.principal, "another-session"),
    )
    .await;
    let (other, other_agent) = w.other("member", "app_agent", &w.session).await;
    w.grant(&other, &t).await;
    let no_source: Vec<(&str, &Conn, Value)> = vec![
        (
            "no recorded message",
            &w.agent,
            task_origin("conv", "turn-1", "msg-unrecorded"),
        ),
        (
            "another session",
            &other_session,
            task_origin("conv", "turn-1", "msg-1"),
        ),
        (
            "another principal",
            &other_agent,
            task_origin("conv", "turn-1", "msg-1"),
        ),
        (
            "another turn",
            &w.agent,
            task_origin("conv", "turn-2", "msg-1"),
        ),
        (
            "another conversation",
            &w.agent,
            task_origin("conv-2", "turn-1", "msg-1"),
        ),
        (
            "no message at all",
            &w.agent,
            json!({"conversation_id": "conv", "turn_id": "turn-1", "assistant_message_id": "a-1"}),
        ),
        ("no origin", &w.agent, json!({})),
    ];
    for (what, agent, origin) in no_source {
        let r = propose_full(agent, &t, form(deal, "won"), origin.clone()).await;
        let msg = message(propose_full(agent, &t, form(deal, "won"), origin).await);
        assert_eq!(sqlstate(r), "42501", "{what}");
        assert!(msg.contains("no human source"), "{what}: {msg}");
    }
    let mut no_reply = task_origin("conv", "turn-1", "msg-1");
    no_reply
        .as_object_mut()
        .unwrap()
        .remove("assistant_message_id");
    assert_eq!(
        sqlstate(propose_full(&w.agent, &t, form(deal, "won"), no_reply).await),
        "22023",
        "the reply that carries the call is named"
    );
    assert_eq!(task_actions(&w, "msg-1").await, 0);
    assert_eq!(w.writes(deal).await, 0);

    let p = propose_full(
        &w.agent,
        &t,
        form(deal, "won"),
        task_origin("conv", "turn-1", "msg-1"),
    )
    .await
    .unwrap();
    assert_eq!(p.status, "succeeded");
    assert!(p.token.is_some());
    assert_eq!(w.stage_of(deal).await, "won");
    assert_eq!(w.writes(deal).await, 1);
}

/// A request admits effects only while its turn is the conversation's latest
/// recorded turn; another conversation's turns do not count.
#[tokio::test]
async fn test_stale_turn_is_55000() {
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    record(&w, "conv", "turn-2", "msg-2").await;
    record(&w, "conv-elsewhere", "turn-9", "msg-9").await;
    let params = json!({"channel": "c", "text": "t"});
    let r = propose_full(
        &w.agent,
        &t,
        params.clone(),
        task_origin("conv", "turn-1", "msg-1"),
    )
    .await;
    let msg = message(
        propose_full(
            &w.agent,
            &t,
            params.clone(),
            task_origin("conv", "turn-1", "msg-1"),
        )
        .await,
    );
    assert_eq!(sqlstate(r), "55000");
    assert!(msg.contains("no longer the latest"), "{msg}");
    assert_eq!(task_actions(&w, "msg-1").await, 0);
    let p = propose_full(&w.agent, &t, params, task_origin("conv", "turn-2", "msg-2"))
        .await
        .unwrap();
    assert_eq!(p.status, "queued");
}

/// A conversation that ended, archived or cancelled, by the agent's side or
/// the person's, admits nothing more.
#[tokio::test]
async fn test_ended_conversation_admits_nothing_55000() {
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    let params = json!({"channel": "c", "text": "t"});
    for (conv, how, by_agent) in [
        ("conv-a", "archive_conversation", true),
        ("conv-b", "archive_conversation", false),
        ("conv-c", "cancel_origin", true),
    ] {
        let msg_id = format!("{conv}-msg");
        record(&w, conv, "turn-1", &msg_id).await;
        let origin = task_origin(conv, "turn-1", &msg_id);
        let ender = if by_agent { &w.agent } else { &w.human };
        let n: i32 = ender
            .query_one(&format!("SELECT keyturn.{how}($1)"), &[&conv])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{how}: nothing was open");
        let r = propose_full(&w.agent, &t, params.clone(), origin.clone()).await;
        assert_eq!(sqlstate(r), "55000", "{how}");
        assert_eq!(task_actions(&w, &msg_id).await, 0, "{how}");
    }
    // The live conversation next to them still admits.
    record(&w, "conv-d", "turn-1", "conv-d-msg").await;
    let p = propose_full(
        &w.agent,
        &t,
        params,
        task_origin("conv-d", "turn-1", "conv-d-msg"),
    )
    .await
    .unwrap();
    assert_eq!(p.status, "queued");
}

#[tokio::test]
async fn test_agent_cannot_record_a_request() {
    let w = World::new("member").await;
    assert_eq!(
        sqlstate(record_request_on(&w.agent, "conv", "turn-1", "msg-1", "hi").await),
        "42501"
    );
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.request WHERE tenant = $1",
            &[&w.tenant]
        )
        .await,
        0
    );
}

/// A message is recorded once: the same values again are a replay (false),
/// other values under its id are 22023 and change nothing.
#[tokio::test]
async fn test_record_request_replay_is_false_and_conflicting_values_are_22023() {
    let w = World::new("member").await;
    assert!(
        record_request_on(&w.human, "conv", "turn-1", "msg-1", "hello")
            .await
            .unwrap()
    );
    assert!(
        !record_request_on(&w.human, "conv", "turn-1", "msg-1", "hello")
            .await
            .unwrap()
    );
    let elsewhere = Conn::connect(
        "app_human",
        Identity::gucs(&w.tenant, &w.principal, "another-session"),
    )
    .await;
    for (what, c, conv, turn, text) in [
        ("another text", &w.human, "conv", "turn-1", "goodbye"),
        (
            "another conversation",
            &w.human,
            "conv-2",
            "turn-1",
            "hello",
        ),
        ("another turn", &w.human, "conv", "turn-2", "hello"),
        ("another session", &elsewhere, "conv", "turn-1", "hello"),
    ] {
        assert_eq!(
            sqlstate(record_request_on(c, conv, turn, "msg-1", text).await),
            "22023",
            "{what}"
        );
    }
    for (what, hash) in [
        ("uppercase", "A".repeat(64)),
        ("short", "a".repeat(63)),
        ("not hex", "g".repeat(64)),
    ] {
        assert_eq!(
            sqlstate(
                w.human
                    .query_one(
                        "SELECT keyturn.record_request('conv', 'turn-3', 'msg-3', $1)",
                        &[&hash]
                    )
                    .await
            ),
            "22023",
            "{what}"
        );
    }
    assert_eq!(
        sqlstate(record_request_on(&w.human, "", "turn-1", "msg-4", "x").await),
        "22023"
    );
    let rows = w
        .superuser
        .query(
            "SELECT conversation_id, turn_id, session, text_sha256 = encode(sha256('hello'), 'hex') \
               FROM keyturn.request WHERE tenant = $1",
            &[&w.tenant],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), "conv");
    assert_eq!(rows[0].get::<_, String>(1), "turn-1");
    assert_eq!(rows[0].get::<_, String>(2), w.session);
    assert!(rows[0].get::<_, bool>(3));
}

/// One request starts at most ten effects; a replay of one of them is still
/// answered.
#[tokio::test]
async fn test_eleventh_effect_of_one_request_is_54000() {
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let origin = task_origin("conv", "turn-1", "msg-1");
    let mut ids = Vec::new();
    for i in 0..10 {
        let p = propose_full(
            &w.agent,
            &t,
            json!({"channel": "c", "text": format!("t{i}")}),
            origin.clone(),
        )
        .await
        .unwrap();
        assert_eq!(p.status, "queued", "effect {i}");
        ids.push(p.id);
    }
    assert_eq!(
        sqlstate(
            propose_full(
                &w.agent,
                &t,
                json!({"channel": "c", "text": "t10"}),
                origin.clone()
            )
            .await
        ),
        "54000"
    );
    assert_eq!(task_actions(&w, "msg-1").await, 10);
    let replay = propose_full(&w.agent, &t, json!({"channel": "c", "text": "t3"}), origin)
        .await
        .unwrap();
    assert_eq!((replay.id, replay.token), (ids[3], None));
}

/// The same request for the same call is the same action: token NULL the
/// second time, one write, one action. Another call is another action.
#[tokio::test]
async fn test_same_request_and_call_is_the_same_action() {
    let w = World::new("member").await;
    let t = sql_task_tool(&w).await;
    let deals = w.deals(&w.principal, 2).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let origin = task_origin("conv", "turn-1", "msg-1");
    let first = propose_full(&w.agent, &t, form(deals[0], "won"), origin.clone())
        .await
        .unwrap();
    assert_eq!(first.status, "succeeded");
    assert!(first.token.is_some());
    let again = propose_full(&w.agent, &t, form(deals[0], "won"), origin.clone())
        .await
        .unwrap();
    assert_eq!(again.id, first.id);
    assert_eq!(again.token, None);
    assert_eq!(again.status, "succeeded");
    assert_eq!(again.params_hash, first.params_hash);
    assert_eq!(w.writes(deals[0]).await, 1);
    assert_eq!(task_actions(&w, "msg-1").await, 1);
    let other = propose_full(&w.agent, &t, form(deals[1], "won"), origin)
        .await
        .unwrap();
    assert_ne!(other.id, first.id);
    assert_eq!(task_actions(&w, "msg-1").await, 2);
    // Never by a token: the request was the approval.
    assert_eq!(sqlstate(w.approve(&first.proposal()).await), "42501");
}

/// Identical admissions at once: one action, every other call its replay.
#[tokio::test]
async fn test_concurrent_identical_admissions_are_one_action() {
    let w = World::new("member").await;
    let t = sql_task_tool(&w).await;
    let deal = w.deals(&w.principal, 1).await[0];
    record(&w, "conv", "turn-1", "msg-1").await;
    let mut agents = Vec::new();
    for _ in 0..5 {
        agents.push(Conn::connect("app_agent", w.identity()).await);
    }
    let runs = agents.iter().map(|a| {
        let t = t.clone();
        async move {
            propose_full(
                a,
                &t,
                form(deal, "won"),
                task_origin("conv", "turn-1", "msg-1"),
            )
            .await
            .unwrap()
        }
    });
    let results = futures_util::future::join_all(runs).await;
    assert!(results.iter().all(|p| p.id == results[0].id), "{results:?}");
    assert_eq!(results.iter().filter(|p| p.token.is_some()).count(), 1);
    assert_eq!(task_actions(&w, "msg-1").await, 1);
    assert_eq!(w.writes(deal).await, 1);
}

/// Under REPEATABLE READ, an admission whose snapshot predates the first
/// admission of the same call must not become a second action: it is
/// refused to serialize, or answered as the replay. (An sql tool's second
/// write would be refused by the updated row anyway; an external call has
/// no row to stop it.)
#[tokio::test]
async fn test_repeatable_read_admission_never_duplicates_an_action() {
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let params = json!({"channel": "c", "text": "once"});
    let late = Conn::connect("app_agent", w.identity()).await;
    let tx = late
        .transaction_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    tx.query_one("SELECT count(*) FROM keyturn.action", &[])
        .await
        .unwrap(); // snapshot taken: nothing admitted yet
    let first = propose_full(
        &w.agent,
        &t,
        params.clone(),
        task_origin("conv", "turn-1", "msg-1"),
    )
    .await
    .unwrap();
    assert_eq!(first.status, "queued");
    match propose_full(&tx, &t, params, task_origin("conv", "turn-1", "msg-1")).await {
        Ok(p) => assert_eq!(
            p.id, first.id,
            "a second action for the same request and call"
        ),
        Err(e) => assert_eq!(e.code().map(|c| c.code()), Some("40001"), "{e}"),
    }
    let _ = tx.commit().await;
    assert_eq!(task_actions(&w, "msg-1").await, 1);
}

/// The same for the bound of ten: a snapshot from before the tenth
/// admission does not make room for an eleventh.
#[tokio::test]
async fn test_repeatable_read_admission_never_passes_the_bound() {
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let origin = task_origin("conv", "turn-1", "msg-1");
    for i in 0..9 {
        propose_full(
            &w.agent,
            &t,
            json!({"channel": "c", "text": format!("t{i}")}),
            origin.clone(),
        )
        .await
        .unwrap();
    }
    let late = Conn::connect("app_agent", w.identity()).await;
    let tx = late
        .transaction_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    tx.query_one("SELECT count(*) FROM keyturn.action", &[])
        .await
        .unwrap(); // snapshot taken: nine admitted
    propose_full(
        &w.agent,
        &t,
        json!({"channel": "c", "text": "t9"}),
        origin.clone(),
    )
    .await
    .unwrap();
    let r = propose_full(&tx, &t, json!({"channel": "c", "text": "t10"}), origin).await;
    let code = sqlstate(r);
    assert!(code == "54000" || code == "40001", "{code}");
    let _ = tx.rollback().await;
    assert_eq!(task_actions(&w, "msg-1").await, 10);
}

/// The write of an sql task tool runs as the role that recorded the
/// request, under that role's RLS: a row only the agent sees is not written.
#[tokio::test]
async fn test_sql_task_write_runs_as_the_recording_role() {
    let w = World::new("member").await;
    let login = approver_login(&w.superuser).await;
    let table = w.role_table(&[&login]).await;
    let t = w.role_table_tool(&table, json!({"approval": "task"})).await;
    let seen = w.role_table_row(&table, false).await;
    let hidden = w.role_table_row(&table, true).await;
    let person = Conn::connect(&login, w.identity()).await;
    assert!(
        record_request_on(&person, "conv", "turn-1", "msg-1", "move them")
            .await
            .unwrap()
    );
    let origin = task_origin("conv", "turn-1", "msg-1");
    let p = propose_full(&w.agent, &t, form(seen, "won"), origin.clone())
        .await
        .unwrap();
    assert_eq!(p.status, "succeeded");
    assert_eq!(
        w.role_table_state(&table, seen).await,
        ("won".to_owned(), Some(login.clone()))
    );
    let approved: (String, String) = {
        let r = w
            .superuser
            .query_one(
                "SELECT approved_role, approved_via FROM keyturn.action WHERE id = $1",
                &[&p.id],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(approved, (login.clone(), "task:msg-1".to_owned()));
    let p = propose_full(&w.agent, &t, form(hidden, "won"), origin)
        .await
        .unwrap();
    assert_eq!(p.status, "conflict");
    assert_eq!(
        w.role_table_state(&table, hidden).await,
        ("lead".to_owned(), None)
    );
}

/// Before the provider is called, grants and origin are checked again.
#[tokio::test]
async fn test_task_action_is_invalidated_at_begin_dispatch() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let origin = task_origin("conv", "turn-1", "msg-1");
    let revoked = propose_full(
        &w.agent,
        &t,
        json!({"channel": "c", "text": "a"}),
        origin.clone(),
    )
    .await
    .unwrap();
    let archived = propose_full(&w.agent, &t, json!({"channel": "c", "text": "b"}), origin)
        .await
        .unwrap();
    assert_eq!(
        (revoked.status.as_str(), archived.status.as_str()),
        ("queued", "queued")
    );
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &[revoked.id, archived.id], "30 seconds").await;
    let lease_of = |id| leases.iter().find(|l| l.action_id == id).unwrap();

    // An archive that raced the admission: the conversation ended, its
    // action still leased (as archive_conversation would have missed it).
    tamper(
        &w.superuser,
        "INSERT INTO keyturn.cancelled_origin (tenant, principal, conversation_id, how) \
         VALUES ($1, $2, 'conv', 'archived')",
        &[&w.tenant, &w.principal],
    )
    .await;
    assert!(!begin(&d, lease_of(archived.id)).await.unwrap());
    assert_eq!(w.status(archived.id).await, "invalidated");
    tamper(
        &w.superuser,
        "DELETE FROM keyturn.cancelled_origin WHERE tenant = $1",
        &[&w.tenant],
    )
    .await;

    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    assert!(!begin(&d, lease_of(revoked.id)).await.unwrap());
    let result: Value = w
        .superuser
        .query_one(
            "SELECT result FROM keyturn.action WHERE id = $1",
            &[&revoked.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(w.status(revoked.id).await, "invalidated");
    assert!(
        result["reason"].as_str().unwrap().contains("authorization"),
        "{result}"
    );
    assert_eq!(attempts(&w, revoked.id).await, 0);
    assert_eq!(attempts(&w, archived.id).await, 0);
}

/// Archiving ends the conversation like cancel_origin: what is pending,
/// queued or leased is cancelled; a call already executing finishes.
#[tokio::test]
async fn test_archive_cancels_pending_queued_and_leased_but_not_executing() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let task = external_task_tool(&w).await;
    let plain = w.webhook_tool(json!({})).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let origin = task_origin("conv", "turn-1", "msg-1");
    let params = |text: &str| json!({"channel": "c", "text": text});
    let executing = propose_full(&w.agent, &task, params("executing"), origin.clone())
        .await
        .unwrap();
    let leased = propose_full(&w.agent, &task, params("leased"), origin.clone())
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &[executing.id, leased.id], "5 minutes").await;
    let running = leases.iter().find(|l| l.action_id == executing.id).unwrap();
    assert!(begin(&d, running).await.unwrap());
    let queued = propose_full(&w.agent, &task, params("queued"), origin.clone())
        .await
        .unwrap();
    let pending = propose_full(
        &w.agent,
        &plain,
        params("pending"),
        json!({"conversation_id": "conv"}),
    )
    .await
    .unwrap();
    let elsewhere = propose_full(
        &w.agent,
        &plain,
        params("other conversation"),
        json!({"conversation_id": "conv-2"}),
    )
    .await
    .unwrap();
    assert_eq!(w.status(leased.id).await, "leased");
    assert_eq!(queued.status, "queued");
    assert_eq!(pending.status, "pending");

    let n: i32 = w
        .agent
        .query_one("SELECT keyturn.archive_conversation('conv')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3);
    for p in [&pending, &queued, &leased] {
        assert_eq!(w.status(p.id).await, "cancelled");
    }
    assert_eq!(w.status(executing.id).await, "executing");
    assert_eq!(w.status(elsewhere.id).await, "pending");
    assert_eq!(
        complete(&d, running, "succeeded", json!({}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_eq!(
        sqlstate(propose_full(&w.agent, &task, params("after"), origin).await),
        "55000"
    );
    assert_work_list_in_step(&w.superuser).await;
}

/// A request recorded by a role that bypasses row-level security never
/// writes through an sql task tool: the write would not be bound by RLS.
#[tokio::test]
async fn test_request_recorded_by_an_rls_bypassing_role_never_writes() {
    let w = World::new("member").await;
    let t = sql_task_tool(&w).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let bypass = Conn::connect("app_bypass", w.identity()).await;
    assert!(
        record_request_on(&bypass, "conv", "turn-1", "msg-1", "do it")
            .await
            .unwrap()
    );
    let r = propose_full(
        &w.agent,
        &t,
        form(deal, "won"),
        task_origin("conv", "turn-1", "msg-1"),
    )
    .await;
    match r {
        Ok(p) => assert_eq!(p.status, "failed", "{p:?}"),
        Err(e) => assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{e}"),
    }
    assert_eq!(w.stage_of(deal).await, "lead");
    assert_eq!(w.writes(deal).await, 0);
}

/// One transaction, a task admission and then an ordinary proposal: the
/// ordinary one's event must not claim the request as its approval.
#[tokio::test]
async fn test_request_context_ends_with_its_admission() {
    let w = World::new("member").await;
    let task = external_task_tool(&w).await;
    let plain = w.webhook_tool(json!({})).await;
    record(&w, "conv", "turn-1", "msg-1").await;
    let tx = w.agent.transaction().await.unwrap();
    let admitted = propose_full(
        &tx,
        &task,
        json!({"channel": "c", "text": "t"}),
        task_origin("conv", "turn-1", "msg-1"),
    )
    .await
    .unwrap();
    let ordinary = propose_full(&tx, &plain, json!({"channel": "c", "text": "t"}), json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (admitted.status.as_str(), ordinary.status.as_str()),
        ("queued", "pending")
    );
    let detail: Value = w
        .superuser
        .query_one(
            "SELECT detail FROM keyturn.event WHERE action_id = $1",
            &[&ordinary.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        detail.get("request").is_none(),
        "an ordinary proposal's event names a request: {detail}"
    );
}

/// A replay creates nothing, so it spends none of the grant's uses and is
/// answered even when they are all spent.
#[tokio::test]
async fn test_replay_is_answered_when_the_grant_uses_are_spent() {
    let w = World::new("member").await;
    let t = external_task_tool(&w).await;
    w.grant_with(&w.principal, &t, None, None, Some(1))
        .await
        .unwrap();
    record(&w, "conv", "turn-1", "msg-1").await;
    let origin = task_origin("conv", "turn-1", "msg-1");
    let params = json!({"channel": "c", "text": "t"});
    let first = propose_full(&w.agent, &t, params.clone(), origin.clone())
        .await
        .unwrap();
    let again = propose_full(&w.agent, &t, params, origin)
        .await
        .expect("the replay of an admitted call");
    assert_eq!((again.id, again.token), (first.id, None));
}

/// Fifteenth red-team pass (docs/security.md, row 111): a proposal of a
/// `self` tool that became a task tool while it was pending was revised
/// (in a card session, or by another approver), and the revision, proposed
/// at the tool's new version, was admitted at once by the person's request:
/// params nobody approved ran. A revision is never admitted by a request.
#[tokio::test]
async fn test_a_revision_is_never_admitted_by_a_request() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let conversation = unique("conv");
    record(&w, &conversation, "t-1", "m-1").await;
    let p = propose_full(
        &w.agent,
        &t,
        form(deal, "won"),
        task_origin(&conversation, "t-1", "m-1"),
    )
    .await
    .unwrap();
    assert_eq!(p.status, "pending", "a self tool waits for the person");
    w.admin
        .query_one(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &t,
                &json!({"executor": "sql", "approval": "task",
                        "sql": {"table": "crm.deal", "key": "id", "version": "xmin",
                                "set": ["stage"], "where": ["id"]}}),
            ],
        )
        .await
        .unwrap();
    let r = w
        .human
        .query_one(
            "SELECT action_id FROM keyturn.revise($1, $2, $3)",
            &[&p.id, &p.token.clone().unwrap(), &form(deal, "lost")],
        )
        .await;
    assert_eq!(sqlstate(r), "42501");
    assert_eq!(w.stage_of(deal).await, "lead", "nothing ran");
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.action WHERE revised_from = $1",
            &[&p.id]
        )
        .await,
        0
    );
}
