//! docs/sql-api.md: lease, begin_dispatch, complete — called in SQL
//! as app_dispatcher, no keyturnd needed. lease() works across tenants, so
//! every test here holds DISPATCH_LOCK.

use keyturn_tests::*;
use serde_json::json;

#[tokio::test]
async fn test_lease_takes_due_queued_rows_once() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, t, ids) = queued(2).await;
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    assert_eq!(leases.len(), 2);
    for l in &leases {
        assert_eq!(l.tenant, w.tenant);
        assert_eq!(l.tool, t);
        assert_eq!(l.provider.as_deref(), Some("webhook"));
        assert_eq!(l.attempt, 1);
        assert_eq!(l.params.as_ref().unwrap()["channel"], "c");
        assert!(!l.idempotency_key.is_empty());
        assert_eq!(w.status(l.action_id).await, "leased");
    }
    assert_ne!(leases[0].idempotency_key, leases[1].idempotency_key);
    assert!(
        lease_mine(&d, &ids, "30 seconds").await.is_empty(),
        "never leased twice"
    );
    // Pending (unapproved) actions are never leased.
    let p = w
        .propose(&t, json!({"channel": "c", "text": "x"}))
        .await
        .unwrap();
    assert!(lease_mine(&d, &[p.id], "30 seconds").await.is_empty());
}

#[tokio::test]
async fn test_begin_dispatch_moves_to_executing_and_counts_the_attempt() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    let wrong = Lease {
        lease_id: uuid::Uuid::new_v4(),
        ..l.clone()
    };
    assert_eq!(sqlstate(begin(&d, &wrong).await), "55000");
    assert_eq!(w.status(l.action_id).await, "leased");
    assert!(begin(&d, &l).await.unwrap());
    assert_eq!(w.status(l.action_id).await, "executing");
    assert_eq!(attempts(&w, l.action_id).await, 1);
    assert_eq!(attempt_rows(&w, l.action_id).await, 1);
    assert_eq!(
        sqlstate(begin(&d, &l).await),
        "55000",
        "not leased any more"
    );
    assert_eq!(
        complete(&d, &l, "succeeded", json!({"status": 200}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_eq!(w.usage_rows(l.action_id).await, 1);
    assert_eq!(
        sqlstate(complete(&d, &l, "succeeded", json!({}), None).await),
        "55000",
        "complete once"
    );
    assert_eq!(w.usage_rows(l.action_id).await, 1);
    // The human's replay answers the final status.
    let status: String = w
        .superuser
        .query_one(
            "SELECT status::text FROM keyturn.action WHERE id = $1",
            &[&l.action_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "succeeded");
}

#[tokio::test]
async fn test_begin_dispatch_after_revoke_or_disable_invalidates() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, t, ids) = queued(2).await;
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    w.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    assert!(
        !begin(&d, &leases[0]).await.unwrap(),
        "revoked: do not call the provider"
    );
    assert_eq!(w.status(leases[0].action_id).await, "invalidated");
    assert_eq!(attempts(&w, leases[0].action_id).await, 0);

    let (w2, t2, ids2) = queued(1).await;
    let l2 = lease_mine(&d, &ids2, "30 seconds").await.remove(0);
    w2.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&t2])
        .await
        .unwrap();
    assert!(!begin(&d, &l2).await.unwrap());
    assert_eq!(w2.status(l2.action_id).await, "invalidated");
    // A queued action is also invalidated by the epoch (second lease of the first world).
    assert!(!begin(&d, &leases[1]).await.unwrap());
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_complete_outcomes() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(3).await;
    let d = connect("app_dispatcher").await;
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    for l in &leases {
        assert!(begin(&d, l).await.unwrap());
    }
    assert_eq!(
        sqlstate(complete(&d, &leases[0], "done", json!({}), None).await),
        "22023"
    );
    assert_eq!(
        sqlstate(complete(&d, &leases[0], "", json!({}), None).await),
        "22023"
    );
    assert_eq!(w.status(leases[0].action_id).await, "executing");
    assert_eq!(
        complete(&d, &leases[0], "failed", json!({"status": 400}), None)
            .await
            .unwrap(),
        "failed"
    );
    assert_eq!(
        complete(&d, &leases[1], "unknown", json!({}), None)
            .await
            .unwrap(),
        "uncertain"
    );
    assert_eq!(
        complete(&d, &leases[2], "succeeded", json!({}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_eq!(w.status(leases[0].action_id).await, "failed");
    assert_eq!(w.status(leases[1].action_id).await, "uncertain");
    assert_eq!(w.usage_rows(leases[0].action_id).await, 0);
    assert_eq!(w.usage_rows(leases[1].action_id).await, 0);
    assert_eq!(w.usage_rows(leases[2].action_id).await, 1);
    // uncertain is never retried automatically.
    assert!(lease_mine(&d, &ids, "30 seconds").await.is_empty());
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_retry_requeues_with_same_idempotency_key_and_third_fails() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let id = ids[0];
    let d = connect("app_dispatcher").await;
    let l1 = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    assert!(begin(&d, &l1).await.unwrap());
    assert_eq!(
        complete(&d, &l1, "retry", json!({"status": 429}), Some("1 hour"))
            .await
            .unwrap(),
        "queued"
    );
    let secs: f64 = w
        .superuser
        .query_one("SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM keyturn.action WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert!(
        (3500.0..=3700.0).contains(&secs),
        "next attempt due in about an hour, not {secs}s"
    );
    assert!(
        lease_mine(&d, &ids, "30 seconds").await.is_empty(),
        "not due yet"
    );
    // Make it due (a lifecycle column, not a proposal column).
    w.superuser
        .execute(
            "UPDATE keyturn.action SET next_attempt_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let l2 = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    assert_eq!(l2.attempt, 2);
    assert_eq!(
        l2.idempotency_key, l1.idempotency_key,
        "the idempotency key never changes"
    );
    assert!(begin(&d, &l2).await.unwrap());
    assert_eq!(
        complete(&d, &l2, "retry", json!({}), Some("0 seconds"))
            .await
            .unwrap(),
        "queued"
    );
    let l3 = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    assert_eq!(l3.attempt, 3);
    assert_eq!(l3.idempotency_key, l1.idempotency_key);
    assert!(begin(&d, &l3).await.unwrap());
    assert_eq!(
        complete(&d, &l3, "retry", json!({}), Some("0 seconds"))
            .await
            .unwrap(),
        "failed",
        "third attempt's retry fails"
    );
    assert_eq!(w.status(id).await, "failed");
    assert_eq!(attempts(&w, id).await, 3);
    assert_eq!(attempt_rows(&w, id).await, 3);
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_retry_before_dispatch_hands_back_without_counting() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    assert_eq!(
        sqlstate(complete(&d, &l, "succeeded", json!({}), None).await),
        "55000",
        "never dispatched"
    );
    assert_eq!(
        complete(&d, &l, "retry", json!({}), None).await.unwrap(),
        "queued"
    );
    assert_eq!(attempts(&w, l.action_id).await, 0);
    assert_eq!(attempt_rows(&w, l.action_id).await, 0);
    let again = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    assert_eq!(again.attempt, 1);
    assert_eq!(again.idempotency_key, l.idempotency_key);
    assert_eq!(
        sqlstate(begin(&d, &l).await),
        "55000",
        "the old lease is void"
    );
    assert!(begin(&d, &again).await.unwrap());
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_end_session_cancels_leased_actions_and_voids_the_lease() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    let n: i32 = w
        .human
        .query_one("SELECT keyturn.end_session()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(w.status(l.action_id).await, "cancelled");
    assert_eq!(sqlstate(begin(&d, &l).await), "55000");
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_complete_needs_the_current_lease_and_backs_off_without_delay() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    let wrong = Lease {
        lease_id: uuid::Uuid::new_v4(),
        ..l.clone()
    };
    assert_eq!(
        sqlstate(complete(&d, &wrong, "succeeded", json!({}), None).await),
        "55000"
    );
    assert_eq!(w.status(l.action_id).await, "executing");
    // retry with no delay: due after a backoff of at least one second.
    assert_eq!(
        complete(&d, &l, "retry", json!({}), None).await.unwrap(),
        "queued"
    );
    let secs: f64 = w
        .superuser
        .query_one("SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 FROM keyturn.action WHERE id = $1", &[&l.action_id])
        .await
        .unwrap()
        .get(0);
    assert!(secs > 0.5, "backoff of at least 1 s, got {secs}");
    assert!(
        lease_mine(&d, &ids, "30 seconds").await.is_empty(),
        "not due during the backoff"
    );
    assert_eq!(
        sqlstate(complete(&d, &l, "succeeded", json!({}), None).await),
        "55000",
        "lease given up on retry"
    );
}

#[tokio::test]
async fn test_concurrent_leases_never_share_a_job() {
    let _g = DISPATCH_LOCK.lock().await;
    let (_w, _t, ids) = queued(6).await;
    let mut handles = Vec::new();
    for _ in 0..3 {
        let ids = ids.clone();
        handles.push(tokio::spawn(async move {
            let d = connect("app_dispatcher").await;
            lease_mine(&d, &ids, "30 seconds")
                .await
                .into_iter()
                .map(|l| l.action_id)
                .collect::<Vec<_>>()
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let mut uniq = all.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), all.len(), "a job was leased twice: {all:?}");
    assert_eq!(uniq.len(), 6);
}

#[tokio::test]
async fn test_begin_keeps_the_lease_expiry_and_end_session_spares_executing() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &ids, "30 seconds").await.remove(0);
    let q = "SELECT lease_expires_at::text FROM keyturn.action WHERE id = $1";
    let before: String = w
        .superuser
        .query_one(q, &[&l.action_id])
        .await
        .unwrap()
        .get(0);
    assert!(begin(&d, &l).await.unwrap());
    let after: String = w
        .superuser
        .query_one(q, &[&l.action_id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "begin_dispatch must not extend the lease");
    let n: i32 = w
        .human
        .query_one("SELECT keyturn.end_session()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "an executing call is not cancelled by logout");
    assert_eq!(w.status(l.action_id).await, "executing");
    let unknown = Lease {
        action_id: uuid::Uuid::new_v4(),
        ..l.clone()
    };
    assert_eq!(sqlstate(begin(&d, &unknown).await), "55000");
    assert_eq!(
        sqlstate(complete(&d, &unknown, "succeeded", json!({}), None).await),
        "55000"
    );
    assert_eq!(
        complete(&d, &l, "succeeded", json!({}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_work_list_in_step(&w.superuser).await;
}

#[tokio::test]
async fn test_a_lapsed_lease_cannot_be_handed_back_the_sweep_requeues_it() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &ids, "1 second").await.remove(0);
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    assert_eq!(
        sqlstate(complete(&d, &l, "retry", json!({}), None).await),
        "55000",
        "a lapsed lease is not ours to hand back"
    );
    assert_eq!(
        w.status(l.action_id).await,
        "leased",
        "the failed call changed nothing"
    );
    d.execute("SELECT keyturn.sweep()", &[]).await.unwrap();
    assert_eq!(w.status(l.action_id).await, "queued");
    assert_eq!(attempts(&w, l.action_id).await, 0, "no attempt was made");
    assert_work_list_in_step(&w.superuser).await;
}
