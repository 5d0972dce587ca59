//! docs/sql-api.md: lapsed leases, sweep, reconcile,
//! receipts, and digest payloads after a final status.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};
use tokio_postgres::Client;

async fn queued_in(w: &World, t: &str, params: Value) -> uuid::Uuid {
    let p = w.propose(t, params.clone()).await.unwrap();
    let retain: String = w
        .superuser
        .query_one("SELECT retain FROM keyturn.action WHERE id = $1", &[&p.id])
        .await
        .unwrap()
        .get(0);
    let resubmit = (retain == "digest").then_some(params);
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, resubmit)
            .await
            .unwrap()
            .0,
        "queued"
    );
    p.id
}

async fn sweep(c: &Client) -> (i32, i32, i32) {
    let r = c
        .query_one(
            "SELECT expired, requeued, uncertain FROM keyturn.sweep()",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

async fn reconcile(
    c: &Client,
    id: uuid::Uuid,
    outcome: &str,
) -> Result<String, tokio_postgres::Error> {
    c.query_one(
        "SELECT keyturn.reconcile($1, $2, 'checked the provider')",
        &[&id, &outcome],
    )
    .await
    .map(|r| r.get(0))
}

#[tokio::test]
async fn test_sweep_expires_requeues_and_makes_uncertain() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let short = w.webhook_tool(json!({"expires_in": "1 second"})).await;
    let t = w.webhook_tool(json!({})).await;
    let stale = w
        .propose(&short, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let a = queued_in(&w, &t, json!({"channel": "c", "text": "a"})).await;
    let b = queued_in(&w, &t, json!({"channel": "c", "text": "b"})).await;
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &[a, b], "1 second").await;
    let (la, lb) = (
        leases.iter().find(|l| l.action_id == a).unwrap().clone(),
        leases.iter().find(|l| l.action_id == b).unwrap().clone(),
    );
    assert!(begin(&d, &lb).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        sqlstate(begin(&d, &la).await),
        "55000",
        "a lapsed lease cannot begin"
    );
    let (expired, requeued, uncertain) = sweep(&d).await;
    assert!(
        expired >= 1 && requeued >= 1 && uncertain >= 1,
        "{expired} {requeued} {uncertain}"
    );
    assert_eq!(w.status(stale.id).await, "expired");
    assert_eq!(w.status(a).await, "queued");
    assert_eq!(w.status(b).await, "uncertain");
    // The operator may sweep too; a second sweep finds nothing of ours.
    let op = connect("app_operator").await;
    sweep(&op).await;
    assert_eq!(w.status(a).await, "queued");
    // Once uncertain, the dispatcher's late outcome is refused and nothing changes.
    assert_eq!(
        sqlstate(complete(&d, &lb, "succeeded", json!({}), None).await),
        "55000"
    );
    assert_eq!(w.status(b).await, "uncertain");
    assert_eq!(w.usage_rows(b).await, 0);
    // The requeued one is leased again with the next attempt number... still attempt 1: never begun.
    let again = lease_mine(&d, &[a, b], "30 seconds").await;
    assert_eq!(again.len(), 1, "uncertain is never retried automatically");
    assert_eq!(again[0].action_id, a);
    assert_eq!(again[0].attempt, 1);
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_complete_is_accepted_past_lease_expiry_while_executing() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let id = queued_in(&w, &t, json!({"channel": "c", "text": "t"})).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &[id], "1 second").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        complete(&d, &l, "succeeded", json!({"status": 200}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_eq!(w.usage_rows(id).await, 1);
}

#[tokio::test]
async fn test_reconcile_only_from_uncertain_keeps_attempts() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let ok = queued_in(&w, &t, json!({"channel": "c", "text": "1"})).await;
    let bad = queued_in(&w, &t, json!({"channel": "c", "text": "2"})).await;
    let d = connect("app_dispatcher").await;
    let op = connect("app_operator").await;
    assert_eq!(
        sqlstate(reconcile(&op, ok, "succeeded").await),
        "55000",
        "queued is not uncertain"
    );
    let leases = lease_mine(&d, &[ok, bad], "30 seconds").await;
    assert_eq!(leases.len(), 2, "both actions leased: {leases:?}");
    for l in &leases {
        assert!(begin(&d, l).await.unwrap());
        assert_eq!(
            complete(
                &d,
                l,
                "unknown",
                json!({"error": "timeout after send"}),
                None
            )
            .await
            .unwrap(),
            "uncertain"
        );
    }
    let listed: Vec<uuid::Uuid> = op
        .query("SELECT action_id FROM keyturn.uncertain_actions()", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        listed.contains(&ok) && listed.contains(&bad),
        "both listed; statuses now: {} / {}",
        w.status(ok).await,
        w.status(bad).await
    );
    let row = op.query_one("SELECT tenant, tool, attempts, dispatched_at IS NOT NULL FROM keyturn.uncertain_actions() WHERE action_id = $1", &[&ok]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), w.tenant);
    assert_eq!(row.get::<_, String>(1), t);
    assert_eq!(row.get::<_, i32>(2), 1);
    assert!(row.get::<_, bool>(3));
    assert_eq!(sqlstate(reconcile(&op, ok, "retry").await), "22023");
    assert_eq!(sqlstate(reconcile(&op, ok, "uncertain").await), "22023");
    assert_eq!(
        sqlstate(reconcile(&d, ok, "succeeded").await),
        "42501",
        "the dispatcher cannot reconcile"
    );
    assert_eq!(reconcile(&op, ok, "succeeded").await.unwrap(), "succeeded");
    assert_eq!(reconcile(&op, bad, "failed").await.unwrap(), "failed");
    assert_eq!(w.usage_rows(ok).await, 1);
    assert_eq!(w.usage_rows(bad).await, 0);
    assert_eq!(
        sqlstate(reconcile(&op, ok, "failed").await),
        "55000",
        "only once, only from uncertain"
    );
    assert_eq!(w.status(ok).await, "succeeded");
    for id in [ok, bad] {
        let n = count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.attempt WHERE action_id = $1 AND outcome = 'unknown'",
            &[&id],
        )
        .await;
        assert_eq!(n, 1, "the attempt history stays");
    }
    let listed: Vec<uuid::Uuid> = op
        .query("SELECT action_id FROM keyturn.uncertain_actions()", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!listed.contains(&ok) && !listed.contains(&bad));
    let last: String = w
        .superuser
        .query_one(
            "SELECT db_role FROM keyturn.event WHERE action_id = $1 ORDER BY id DESC LIMIT 1",
            &[&ok],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(last, "app_operator");
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_receipts_are_stored_redacted() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let id = queued_in(&w, &t, json!({"channel": "c", "text": "t"})).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &[id], "30 seconds").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    let receipt = json!({
        "status": 200, "message_id": "msg-123",
        "authorization": "hunter2-secret-value",
        "headers": {"Set-Cookie": "x", "api_key": "k-1234567890"},
        "echo": "Bearer abcdefghijklmnop1234",
        "password": "pw-zzz"
    });
    assert_eq!(
        complete(&d, &l, "succeeded", receipt, None).await.unwrap(),
        "succeeded"
    );
    for sql in [
        "SELECT receipt::text FROM keyturn.action WHERE id = $1",
        "SELECT receipt::text FROM keyturn.attempt WHERE action_id = $1",
    ] {
        let stored: String = w.superuser.query_one(sql, &[&id]).await.unwrap().get(0);
        for secret in [
            "hunter2-secret-value",
            "k-1234567890",
            "abcdefghijklmnop1234",
            "pw-zzz",
        ] {
            assert!(
                !stored.contains(secret),
                "{sql}: {secret} stored in {stored}"
            );
        }
        assert!(
            stored.contains("msg-123") && stored.contains("200"),
            "useful fields kept: {stored}"
        );
    }
}

/// Every row of every keyturn table whose text holds `needle`, as superuser.
async fn leaks(su: &Client, needle: &str) -> Vec<String> {
    let tables: Vec<String> = su
        .query("SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'keyturn' AND c.relkind = 'r'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut found = Vec::new();
    for t in tables {
        let n = count(
            su,
            &format!("SELECT count(*) FROM keyturn.{t} x WHERE strpos(to_jsonb(x)::text, $1) > 0"),
            &[&needle],
        )
        .await;
        if n > 0 {
            found.push(format!("{t}: {n}"));
        }
    }
    found
}

#[tokio::test]
async fn test_digest_payload_is_gone_after_a_final_status() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"retain": "digest"})).await;
    let marker = unique("digestvalue");
    let marker2 = unique("digestvalue");
    let a = queued_in(&w, &t, json!({"channel": "c", "text": marker})).await;
    let b = queued_in(&w, &t, json!({"channel": "c", "text": marker2})).await;
    assert_eq!(
        leaks(&w.superuser, &marker).await,
        vec!["staged_payload: 1".to_string()],
        "staged while queued"
    );
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &[a, b], "30 seconds").await;
    let la = leases.iter().find(|l| l.action_id == a).unwrap();
    assert_eq!(
        la.params.as_ref().unwrap()["text"],
        marker.as_str(),
        "lease hands the staged payload over"
    );
    for l in &leases {
        assert!(begin(&d, l).await.unwrap());
    }
    // Kept while executing or uncertain, so a retry sends the same payload.
    let lb = leases.iter().find(|l| l.action_id == b).unwrap();
    assert_eq!(
        complete(&d, lb, "unknown", json!({}), None).await.unwrap(),
        "uncertain"
    );
    assert_eq!(
        leaks(&w.superuser, &marker2).await,
        vec!["staged_payload: 1".to_string()]
    );
    assert_eq!(
        complete(&d, la, "succeeded", json!({"status": 202}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert!(
        leaks(&w.superuser, &marker).await.is_empty(),
        "after succeeded: {:?}",
        leaks(&w.superuser, &marker).await
    );
    let op = connect("app_operator").await;
    reconcile(&op, b, "failed").await.unwrap();
    assert!(
        leaks(&w.superuser, &marker2).await.is_empty(),
        "after reconcile: {:?}",
        leaks(&w.superuser, &marker2).await
    );
    // A digest action cancelled while queued leaves nothing either.
    let marker3 = unique("digestvalue");
    let c = queued_in(&w, &t, json!({"channel": "c", "text": marker3})).await;
    w.human
        .query_one("SELECT keyturn.end_session()", &[])
        .await
        .unwrap();
    assert_eq!(w.status(c).await, "cancelled");
    assert!(leaks(&w.superuser, &marker3).await.is_empty());
}

#[tokio::test]
async fn test_digest_payload_same_on_retry_and_gone_when_invalidated() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"retain": "digest"})).await;
    let marker = unique("digestretry");
    let id = queued_in(&w, &t, json!({"channel": "c", "text": marker})).await;
    let d = connect("app_dispatcher").await;
    let l1 = lease_mine(&d, &[id], "30 seconds").await.remove(0);
    assert!(begin(&d, &l1).await.unwrap());
    d.query_one(
        "SELECT keyturn.complete($1, $2, 'retry', '{}', interval '0 seconds')",
        &[&id, &l1.lease_id],
    )
    .await
    .unwrap();
    let l2 = lease_mine(&d, &[id], "30 seconds").await.remove(0);
    assert_eq!(
        l2.params, l1.params,
        "the same staged payload on every attempt"
    );
    // Revoked before the second dispatch: invalidated, and the payload is deleted.
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    assert!(!begin(&d, &l2).await.unwrap());
    assert_eq!(w.status(id).await, "invalidated");
    assert!(
        leaks(&w.superuser, &marker).await.is_empty(),
        "{:?}",
        leaks(&w.superuser, &marker).await
    );
    assert_work_list_in_step(&w.superuser).await;
}

/// keyturnd's account that an attempt sent nothing, for an action the sweep
/// made uncertain before keyturnd could record `retry`: kept on the attempt
/// (once), shown in uncertain_actions(), deciding nothing.
#[tokio::test]
async fn test_the_dispatchers_account_of_an_attempt_it_never_sent() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let id = queued_in(&w, &t, json!({"channel": "c", "text": "never sent"})).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &[id], "1 second").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    let account = json!({"sent": false, "error": "the lease had lapsed before the call started", "password": "x"});
    let record = |lease: uuid::Uuid| {
        let (d, account) = (&d, account.clone());
        async move {
            d.query_one(
                "SELECT keyturn.record_not_sent($1, $2, $3)",
                &[&id, &lease, &account],
            )
            .await
            .map(|r| r.get::<_, bool>(0))
        }
    };
    assert!(
        !record(l.lease_id).await.unwrap(),
        "not uncertain yet: not taken"
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    sweep(&d).await;
    assert_eq!(w.status(id).await, "uncertain");
    assert!(
        !record(uuid::Uuid::new_v4()).await.unwrap(),
        "another lease: not taken"
    );
    assert!(record(l.lease_id).await.unwrap());
    assert!(record(l.lease_id).await.unwrap(), "the same account again");
    let events = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.event WHERE action_id = $1 AND detail ? 'dispatcher_account'",
        &[&id],
    )
    .await;
    assert_eq!(events, 1, "one event, however often it is said");
    assert_eq!(w.status(id).await, "uncertain", "it decides nothing");
    let stored: Value = w
        .superuser
        .query_one(
            "SELECT dispatcher_receipt FROM keyturn.attempt WHERE action_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored["password"], json!("[redacted]"));
    let op = connect("app_operator").await;
    let r = op
        .query_one(
            "SELECT not_sent_by_dispatcher, safe_to_decide_after >= dispatched_at \
               FROM keyturn.uncertain_actions() WHERE action_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert!(r.get::<_, bool>(0));
    assert!(r.get::<_, bool>(1));
    for role in ["app_human", "app_agent", "app_operator"] {
        let c = connect(role).await;
        let r = c
            .query_one(
                "SELECT keyturn.record_not_sent($1, $2, '{}')",
                &[&id, &l.lease_id],
            )
            .await;
        assert_eq!(sqlstate(r), "42501", "{role}");
    }
    assert_eq!(
        sqlstate(
            d.query_one(
                "SELECT keyturn.record_not_sent($1, $2, '[]')",
                &[&id, &l.lease_id]
            )
            .await
        ),
        "22023"
    );
}

/// keyturnd records its account on a pooled connection whose first keyturn
/// call it may be, with the extended protocol's unnamed statement, outside
/// any transaction block: the event is written at that implicit commit,
/// after the statement's portal has closed. (0.3.0's first audit chain
/// failed exactly there, "cannot execute SQL without an outer snapshot or
/// portal", and keyturnd's account was lost.)
#[tokio::test]
async fn test_the_dispatchers_account_is_recorded_by_a_fresh_connection() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let id = queued_in(&w, &t, json!({"channel": "c", "text": "fresh"})).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &[id], "1 second").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    sweep(&d).await;
    assert_eq!(w.status(id).await, "uncertain");
    for first in [
        "SELECT 1",
        "SELECT count(*) FROM keyturn.uncertain_actions()",
    ] {
        let fresh = connect("app_dispatcher").await;
        let _ = fresh.simple_query(first).await;
        let taken = fresh
            .query_typed_one(
                "SELECT keyturn.record_not_sent($1, $2, $3) AS taken",
                &[
                    (&id, tokio_postgres::types::Type::UUID),
                    (&l.lease_id, tokio_postgres::types::Type::UUID),
                    (&json!({"sent": false}), tokio_postgres::types::Type::JSONB),
                ],
            )
            .await
            .map(|r| r.get::<_, bool>(0));
        assert!(taken.unwrap(), "after {first}");
    }
}
