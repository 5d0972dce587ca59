//! keyturn.begin_dispatch_many and keyturn.complete_many (sql/061): per
//! element exactly begin_dispatch / complete; one bad element never fails
//! the batch and changes nothing for itself. lease() works across tenants,
//! so every test here holds DISPATCH_LOCK.

use keyturn_tests::*;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

type BeginRow = (Uuid, bool, Option<String>);

async fn begin_many(
    d: &Client,
    pairs: &[(Uuid, Uuid)],
) -> Result<Vec<BeginRow>, tokio_postgres::Error> {
    let ids: Vec<Uuid> = pairs.iter().map(|p| p.0).collect();
    let leases: Vec<Uuid> = pairs.iter().map(|p| p.1).collect();
    let rows = d
        .query(
            "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)",
            &[&ids, &leases],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

type CompleteRow = (Uuid, Option<String>, Option<String>);

struct Done<'a> {
    id: Uuid,
    lease: Uuid,
    outcome: &'a str,
    receipt: Value,
    retry: Option<&'a str>,
}

async fn complete_many(
    d: &Client,
    items: &[Done<'_>],
) -> Result<Vec<CompleteRow>, tokio_postgres::Error> {
    let ids: Vec<Uuid> = items.iter().map(|i| i.id).collect();
    let leases: Vec<Uuid> = items.iter().map(|i| i.lease).collect();
    let outcomes: Vec<&str> = items.iter().map(|i| i.outcome).collect();
    let receipts: Vec<Value> = items.iter().map(|i| i.receipt.clone()).collect();
    let retry: Vec<Option<&str>> = items.iter().map(|i| i.retry).collect();
    let rows = d
        .query(
            "SELECT action_id, status, error FROM keyturn.complete_many($1, $2, $3, $4, $5::text[]::interval[])",
            &[&ids, &leases, &outcomes, &receipts, &retry],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

fn starts(e: &Option<String>, code: &str) -> bool {
    e.as_deref().is_some_and(|e| e.starts_with(code))
}

/// `n` queued jobs of one world and one of another, all leased for 30 s, the
/// other world's grant then revoked (so begin invalidates its job).
async fn leased_with_one_revoked(
    d: &Client,
    n: usize,
) -> (World, Vec<Uuid>, World, Uuid, Vec<Lease>) {
    let (w, _t, ids) = queued(n).await;
    let (wi, ti, inv_ids) = queued(1).await;
    let mut all = ids.clone();
    all.extend(&inv_ids);
    let leases = lease_mine(d, &all, "30 seconds").await;
    wi.admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&wi.tenant, &wi.principal, &ti],
        )
        .await
        .unwrap();
    (w, ids, wi, inv_ids[0], leases)
}

#[tokio::test]
async fn test_begin_dispatch_many_mixed_batch() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    // A lease that lapses first.
    let (wl, _tl, lapsed_ids) = queued(1).await;
    let lapsed = lease_mine(&d, &lapsed_ids, "1 second").await.remove(0);
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;

    let (w, ids, wi, inv_id, leases) = leased_with_one_revoked(&d, 3).await;
    let inv_ids = [inv_id];
    let lease_of = |id: Uuid| leases.iter().find(|l| l.action_id == id).unwrap().clone();
    let good = lease_of(ids[0]);
    let good2 = lease_of(ids[1]);
    let wrong = lease_of(ids[2]);
    let inv = lease_of(inv_ids[0]);
    let unknown = Uuid::new_v4();

    let rows = begin_many(
        &d,
        &[
            (good.action_id, good.lease_id),
            (wrong.action_id, Uuid::new_v4()),
            (lapsed.action_id, lapsed.lease_id),
            (inv.action_id, inv.lease_id),
            (unknown, Uuid::new_v4()),
            (good2.action_id, good2.lease_id),
            (good.action_id, good.lease_id), // a duplicate sees the first's effect
        ],
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), 7, "one row per element, in input order");
    assert_eq!(rows[0], (good.action_id, true, None));
    assert_eq!(rows[1].0, wrong.action_id);
    assert!(!rows[1].1 && starts(&rows[1].2, "55000"), "{rows:?}");
    assert!(!rows[2].1 && starts(&rows[2].2, "55000"), "{rows:?}");
    assert!(rows[2].2.as_deref().unwrap().contains("lapsed"));
    assert_eq!(
        rows[3],
        (inv.action_id, false, None),
        "invalidated: no error"
    );
    assert!(!rows[4].1 && starts(&rows[4].2, "55000"));
    assert_eq!(rows[5], (good2.action_id, true, None));
    assert!(
        !rows[6].1 && starts(&rows[6].2, "55000"),
        "already executing"
    );

    // Committed: the good ones are executing with one attempt each.
    for l in [&good, &good2] {
        assert_eq!(w.status(l.action_id).await, "executing");
        assert_eq!(attempts(&w, l.action_id).await, 1);
        assert_eq!(attempt_rows(&w, l.action_id).await, 1);
    }
    // Refused ones changed nothing.
    assert_eq!(w.status(wrong.action_id).await, "leased");
    assert_eq!(attempts(&w, wrong.action_id).await, 0);
    assert_eq!(wl.status(lapsed.action_id).await, "leased");
    assert_eq!(attempts(&wl, lapsed.action_id).await, 0);
    assert_eq!(wi.status(inv.action_id).await, "invalidated");
    assert_eq!(attempts(&wi, inv.action_id).await, 0);
    // The events carry the dispatcher role and the attempt detail, as the single call's.
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.event WHERE action_id = $1 AND to_status = 'executing' \
             AND db_role = 'app_dispatcher' AND (detail->>'attempt')::int = 1",
            &[&good.action_id]
        )
        .await,
        1
    );
    // The still-valid lease on `wrong` works with the right id afterwards.
    let rows = begin_many(&d, &[(wrong.action_id, wrong.lease_id)])
        .await
        .unwrap();
    assert_eq!(rows, vec![(wrong.action_id, true, None)]);
    d.execute("SELECT keyturn.sweep()", &[]).await.unwrap();
    assert_eq!(wl.status(lapsed.action_id).await, "queued");
}

#[tokio::test]
async fn test_begin_dispatch_many_near_expiry_still_answers() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    let (w, _t, ids) = queued(1).await;
    // Less than the slack left: run in a subtransaction, same answer.
    let l = lease_mine(&d, &ids, "1 second").await.remove(0);
    let rows = begin_many(&d, &[(l.action_id, l.lease_id)]).await.unwrap();
    assert_eq!(rows, vec![(l.action_id, true, None)]);
    assert_eq!(w.status(l.action_id).await, "executing");
}

#[tokio::test]
async fn test_batch_arrays_must_match() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    let r = d
        .query(
            "SELECT * FROM keyturn.begin_dispatch_many($1, $2)",
            &[&vec![Uuid::new_v4()], &Vec::<Uuid>::new()],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    let r = d
        .query(
            "SELECT * FROM keyturn.complete_many(ARRAY[gen_random_uuid()], ARRAY[gen_random_uuid()], \
             ARRAY['succeeded'], ARRAY[]::jsonb[], ARRAY[NULL]::interval[])",
            &[],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    let r = d
        .query("SELECT * FROM keyturn.begin_dispatch_many('{}', '{}')", &[])
        .await
        .unwrap();
    assert!(r.is_empty());
    // Dispatcher-only.
    let a = connect("app_agent").await;
    let r = a
        .query("SELECT * FROM keyturn.begin_dispatch_many('{}', '{}')", &[])
        .await;
    assert_eq!(sqlstate(r), "42501");
    let r = a
        .query(
            "SELECT * FROM keyturn.complete_many('{}', '{}', '{}', '{}', '{}')",
            &[],
        )
        .await;
    assert_eq!(sqlstate(r), "42501");
}

#[tokio::test]
async fn test_complete_many_each_outcome_and_bad_elements() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    let (w, _t, ids) = queued(9).await;
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    let l = |i: usize| {
        leases
            .iter()
            .find(|l| l.action_id == ids[i])
            .unwrap()
            .clone()
    };
    // 0..=5 and 8 dispatched; 6 and 7 stay leased (hand-back cases).
    let pairs: Vec<(Uuid, Uuid)> = [0, 1, 2, 3, 4, 5, 8]
        .iter()
        .map(|&i| (l(i).action_id, l(i).lease_id))
        .collect();
    assert!(begin_many(&d, &pairs).await.unwrap().iter().all(|r| r.1));
    // 8 is swept to uncertain by hand (as a lapsed lease would be).
    w.superuser
        .execute(
            "UPDATE keyturn.action SET status = 'uncertain' WHERE id = $1",
            &[&ids[8]],
        )
        .await
        .unwrap();

    let done =
        |i: usize, outcome: &'static str, receipt: Value, retry: Option<&'static str>| Done {
            id: l(i).action_id,
            lease: l(i).lease_id,
            outcome,
            receipt,
            retry,
        };
    let items = vec![
        done(
            0,
            "succeeded",
            json!({"status": 200, "authorization": "Bearer x"}),
            None,
        ),
        done(1, "failed", json!({"status": 400}), None),
        done(2, "retry", json!({"status": 429}), Some("10 seconds")),
        done(3, "unknown", json!({}), None),
        Done {
            lease: Uuid::new_v4(),
            ..done(4, "succeeded", json!({}), None)
        },
        done(5, "finished", json!({}), None),
        done(6, "retry", json!({}), None),
        done(7, "succeeded", json!({}), None),
        done(8, "succeeded", json!({}), None),
        done(5, "succeeded", json!({}), Some("-1 seconds")),
    ];
    let rows = complete_many(&d, &items).await.unwrap();
    assert_eq!(rows.len(), items.len());
    for (r, i) in rows.iter().zip(&items) {
        assert_eq!(r.0, i.id, "input order");
    }
    assert_eq!(rows[0].1.as_deref(), Some("succeeded"));
    assert_eq!(rows[1].1.as_deref(), Some("failed"));
    assert_eq!(rows[2].1.as_deref(), Some("queued"));
    assert_eq!(rows[3].1.as_deref(), Some("uncertain"));
    assert!(
        rows[4].1.is_none() && starts(&rows[4].2, "55000"),
        "{rows:?}"
    );
    assert!(
        rows[5].1.is_none() && starts(&rows[5].2, "22023"),
        "{rows:?}"
    );
    assert_eq!(rows[6].1.as_deref(), Some("queued"), "handed back");
    assert!(
        rows[7].1.is_none() && starts(&rows[7].2, "55000"),
        "never dispatched"
    );
    assert!(
        rows[8].1.is_none() && starts(&rows[8].2, "55000"),
        "already uncertain"
    );
    assert!(
        rows[9].1.is_none() && starts(&rows[9].2, "22023"),
        "negative delay"
    );
    for (i, r) in rows[..4].iter().enumerate() {
        assert!(r.2.is_none(), "{i}: {r:?}");
    }

    assert_eq!(w.status(ids[0]).await, "succeeded");
    assert_eq!(w.usage_rows(ids[0]).await, 1);
    let receipt: Value = w
        .superuser
        .query_one(
            "SELECT receipt FROM keyturn.action WHERE id = $1",
            &[&ids[0]],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(
        receipt["authorization"], "Bearer x",
        "redacted as by complete"
    );
    assert_eq!(w.status(ids[1]).await, "failed");
    assert_eq!(w.status(ids[2]).await, "queued");
    let due_in: f64 = w
        .superuser
        .query_one(
            "SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 FROM keyturn.action WHERE id = $1",
            &[&ids[2]],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        due_in > 8.0 && due_in <= 10.0,
        "retry_after honoured: {due_in}"
    );
    assert_eq!(w.status(ids[3]).await, "uncertain");
    // Bad elements changed nothing.
    assert_eq!(w.status(ids[4]).await, "executing");
    assert_eq!(w.status(ids[5]).await, "executing");
    assert_eq!(w.status(ids[6]).await, "queued");
    assert_eq!(attempts(&w, ids[6]).await, 0, "hand-back counts no attempt");
    assert_eq!(w.status(ids[7]).await, "leased");
    assert_eq!(w.status(ids[8]).await, "uncertain");
    assert_eq!(w.usage_rows(ids[8]).await, 0);
    // Attempt rows closed as complete closes them.
    let outcome: Option<String> = w
        .superuser
        .query_one(
            "SELECT outcome::text FROM keyturn.attempt WHERE action_id = $1 AND attempt = 1",
            &[&ids[1]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome.as_deref(), Some("failed"));
    // The refused ones still complete with the right lease afterwards.
    let rows = complete_many(
        &d,
        &[
            done(4, "succeeded", json!({}), None),
            done(5, "failed", json!({}), None),
        ],
    )
    .await
    .unwrap();
    assert_eq!(rows[0].1.as_deref(), Some("succeeded"));
    assert_eq!(rows[1].1.as_deref(), Some("failed"));
}

/// The detail of `id`'s one event to status `to`.
async fn detail(c: &Client, id: Uuid, to: &str) -> Value {
    c.query_one(
        "SELECT detail FROM keyturn.event WHERE action_id = $1 AND to_status = $2::text::keyturn.status",
        &[&id, &to],
    )
    .await
    .unwrap()
    .get(0)
}

/// The details of `id`'s events from status `from` to `to`.
async fn details_between(c: &Client, id: Uuid, from: &str, to: &str) -> Vec<Value> {
    c.query(
        "SELECT detail FROM keyturn.event WHERE action_id = $1 \
         AND from_status = $2::text::keyturn.status AND to_status = $3::text::keyturn.status",
        &[&id, &from, &to],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// One statement changes the whole batch, and each element's event still
/// carries its own detail: its attempt and worker at begin, the reason it was
/// invalidated, its outcome (and retry delay) at complete, a hand-back.
#[tokio::test]
async fn test_batch_events_carry_each_elements_own_detail() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    let (w, ids, wi, inv_id, leases) = leased_with_one_revoked(&d, 4).await;
    let inv_ids = [inv_id];
    let l = |id: Uuid| leases.iter().find(|l| l.action_id == id).unwrap().clone();
    let pairs: Vec<(Uuid, Uuid)> = [ids[0], ids[1], ids[2], inv_ids[0]]
        .iter()
        .map(|&id| (id, l(id).lease_id))
        .collect();
    let rows = begin_many(&d, &pairs).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        [true, true, true, false]
    );
    for &id in &ids[..3] {
        let got = detail(&w.superuser, id, "executing").await;
        assert_eq!(got["attempt"], 1, "{got}");
        assert_eq!(got["worker"], "itest-worker", "{got}");
    }
    let got = detail(&wi.superuser, inv_ids[0], "invalidated").await;
    assert!(
        got["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{got}"
    );

    let done = |id: Uuid, outcome, retry| Done {
        id,
        lease: l(id).lease_id,
        outcome,
        receipt: json!({}),
        retry,
    };
    let rows = complete_many(
        &d,
        &[
            done(ids[0], "succeeded", None),
            done(ids[1], "retry", Some("7 seconds")),
            done(ids[2], "unknown", None),
            done(ids[3], "retry", None),
        ],
    )
    .await
    .unwrap();
    let statuses: Vec<_> = rows.iter().map(|r| r.1.as_deref()).collect();
    assert_eq!(
        statuses,
        [
            Some("succeeded"),
            Some("queued"),
            Some("uncertain"),
            Some("queued")
        ]
    );
    // A final event also commits to the result and the receipt
    // (audit_chain_tests), which this test does not look at.
    let mut ended = detail(&w.superuser, ids[0], "succeeded").await;
    for key in ["approval_mac", "result_mac", "receipt_mac"] {
        let hash = ended.as_object_mut().unwrap().remove(key);
        assert_eq!(
            hash.and_then(|h| h.as_str().map(str::len)),
            Some(64),
            "{key}"
        );
    }
    assert_eq!(ended, json!({"outcome": "succeeded", "attempt": 1}));
    let retried = details_between(&w.superuser, ids[1], "executing", "queued").await;
    assert_eq!(
        retried,
        [json!({"outcome": "retry", "attempt": 1, "retry_in": "00:00:07"})]
    );
    assert_eq!(
        detail(&w.superuser, ids[2], "uncertain").await,
        json!({"outcome": "unknown", "attempt": 1})
    );
    let back = details_between(&w.superuser, ids[3], "leased", "queued").await;
    assert_eq!(back, [json!({"handed_back": true})]);
}

/// retry_after is capped at a day on every path, a hand-back before any
/// provider call included (which once took it as it came: a year parked the
/// approved action for a year), in the single call and in the batch.
#[tokio::test]
async fn test_a_hand_back_is_capped_at_a_day_too() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    let (w, _t, ids) = queued(2).await;
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    let l = |id: Uuid| leases.iter().find(|l| l.action_id == id).unwrap().clone();
    let single: String = d
        .query_one(
            "SELECT keyturn.complete($1, $2, 'retry', '{}', '1 year')",
            &[&ids[0], &l(ids[0]).lease_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(single, "queued");
    let rows = complete_many(
        &d,
        &[Done {
            id: ids[1],
            lease: l(ids[1]).lease_id,
            outcome: "retry",
            receipt: json!({}),
            retry: Some("1 year"),
        }],
    )
    .await
    .unwrap();
    assert_eq!(rows[0].1.as_deref(), Some("queued"));
    for &id in &ids {
        let due_in: f64 = w
            .superuser
            .query_one(
                "SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 FROM keyturn.action WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            due_in > 86_000.0 && due_in <= 86_400.0,
            "due in {due_in} s, not at most a day"
        );
        assert_eq!(attempts(&w, id).await, 0, "a hand-back counts no attempt");
    }
}

/// A receipt keyturn cannot read (nested past its limit of 64 levels) is that
/// element's problem, as the single call's 22023 is, and never the batch's:
/// the other elements complete (it once failed the whole call).
#[tokio::test]
async fn test_an_unreadable_receipt_fails_its_element_not_the_batch() {
    let _g = DISPATCH_LOCK.lock().await;
    let d = connect("app_dispatcher").await;
    let (w, _t, ids) = queued(2).await;
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    let l = |id: Uuid| leases.iter().find(|l| l.action_id == id).unwrap().clone();
    let pairs: Vec<(Uuid, Uuid)> = ids.iter().map(|&id| (id, l(id).lease_id)).collect();
    assert!(begin_many(&d, &pairs).await.unwrap().iter().all(|r| r.1));
    let mut deep = json!({"status": 200});
    for _ in 0..70 {
        deep = json!({ "a": deep });
    }
    let single = d
        .query(
            "SELECT keyturn.complete($1, $2, 'succeeded', $3)",
            &[&ids[0], &l(ids[0]).lease_id, &deep],
        )
        .await;
    assert_eq!(sqlstate(single), "22023", "the single call refuses it");
    let rows = complete_many(
        &d,
        &[
            Done {
                id: ids[0],
                lease: l(ids[0]).lease_id,
                outcome: "succeeded",
                receipt: deep,
                retry: None,
            },
            Done {
                id: ids[1],
                lease: l(ids[1]).lease_id,
                outcome: "succeeded",
                receipt: json!({"status": 200}),
                retry: None,
            },
        ],
    )
    .await
    .expect("one element's receipt never fails the batch");
    assert!(
        rows[0].1.is_none() && starts(&rows[0].2, "22023"),
        "{rows:?}"
    );
    assert_eq!(rows[1].1.as_deref(), Some("succeeded"), "{rows:?}");
    assert_eq!(
        w.status(ids[0]).await,
        "executing",
        "nothing changed for it"
    );
    assert_eq!(w.status(ids[1]).await, "succeeded");
}
