//! The dispatcher's and the operator's calls with the tenant named
//! (sql/062_dispatch_for.sql, docs/sql-api.md "Dispatching tenant by
//! tenant"): on one node each is its plain call limited to the tenant it
//! names; an element of another tenant is refused and left as it was. The
//! plain lease and sweep of other tests span tenants, so every test here
//! holds DISPATCH_LOCK.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

async fn lease_for(d: &Client, tenant: &str, lease_for: &str) -> Vec<Lease> {
    d.query(
        "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
           FROM keyturn.lease_for($1, 'itest-for', 1000, $2::text::interval)",
        &[&tenant, &lease_for],
    )
    .await
    .expect("lease_for")
    .iter()
    .map(Lease::from_row)
    .collect()
}

type Answer = (Uuid, Option<String>, Option<String>);

async fn begin_many_for(
    d: &Client,
    tenant: &str,
    leases: &[&Lease],
) -> Vec<(Uuid, bool, Option<String>)> {
    let ids: Vec<Uuid> = leases.iter().map(|l| l.action_id).collect();
    let lids: Vec<Uuid> = leases.iter().map(|l| l.lease_id).collect();
    d.query(
        "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many_for($1, $2, $3)",
        &[&tenant, &ids, &lids],
    )
    .await
    .expect("begin_dispatch_many_for")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

async fn complete_many_for(
    d: &Client,
    tenant: &str,
    leases: &[&Lease],
    outcome: &str,
) -> Vec<Answer> {
    let ids: Vec<Uuid> = leases.iter().map(|l| l.action_id).collect();
    let lids: Vec<Uuid> = leases.iter().map(|l| l.lease_id).collect();
    let outcomes: Vec<&str> = leases.iter().map(|_| outcome).collect();
    let receipts: Vec<Value> = leases.iter().map(|_| json!({"status": 200})).collect();
    let retry: Vec<Option<&str>> = leases.iter().map(|_| None).collect();
    d.query(
        "SELECT action_id, status, error \
           FROM keyturn.complete_many_for($1, $2, $3, $4, $5, $6::text[]::interval[])",
        &[&tenant, &ids, &lids, &outcomes, &receipts, &retry],
    )
    .await
    .expect("complete_many_for")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

async fn events(w: &World, id: Uuid) -> String {
    w.superuser
        .query_one(
            "SELECT string_agg(to_status::text || ':' || db_role, ' ' ORDER BY id) \
               FROM keyturn.event WHERE action_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn test_the_for_calls_carry_a_job_through_in_the_tenant_named_only() {
    let _g = DISPATCH_LOCK.lock().await;
    let (a, _ta, a_ids) = queued(2).await;
    let (b, _tb, b_ids) = queued(1).await;
    let d = connect("app_dispatcher").await;

    let leased = lease_for(&d, &a.tenant, "30 seconds").await;
    let mut got: Vec<Uuid> = leased.iter().map(|l| l.action_id).collect();
    got.sort();
    let mut want = a_ids.clone();
    want.sort();
    assert_eq!(
        got, want,
        "lease_for leases the tenant's due jobs, all of them"
    );
    assert!(leased
        .iter()
        .all(|l| l.tenant == a.tenant && l.attempt == 1));
    assert_eq!(
        b.status(b_ids[0]).await,
        "queued",
        "another tenant's job stays queued"
    );
    assert!(
        lease_for(&d, &a.tenant, "30 seconds").await.is_empty(),
        "never leased twice"
    );

    // A lease of the other tenant, named in this tenant's batch: refused as
    // an unknown action, and left leased.
    let b_lease = lease_for(&d, &b.tenant, "30 seconds").await.remove(0);
    let answers = begin_many_for(&d, &a.tenant, &[&leased[0], &b_lease, &leased[1]]).await;
    assert_eq!((answers[0].0, answers[0].1), (leased[0].action_id, true));
    assert_eq!(answers[1].0, b_lease.action_id);
    assert!(!answers[1].1);
    assert!(
        answers[1]
            .2
            .as_deref()
            .is_some_and(|e| e.starts_with("55000 ") && e.contains("unknown")),
        "{:?}",
        answers[1].2
    );
    assert_eq!((answers[2].0, answers[2].1), (leased[1].action_id, true));
    assert_eq!(b.status(b_lease.action_id).await, "leased");
    assert_eq!(attempt_rows(&b, b_lease.action_id).await, 0);

    let answers = complete_many_for(&d, &a.tenant, &[&leased[0], &b_lease], "succeeded").await;
    assert_eq!(answers[0].1.as_deref(), Some("succeeded"));
    assert!(answers[1].1.is_none());
    assert!(answers[1]
        .2
        .as_deref()
        .is_some_and(|e| e.starts_with("55000 ")));
    assert_eq!(b.status(b_lease.action_id).await, "leased");

    let status: String = d
        .query_one(
            "SELECT keyturn.complete_for($1, $2, $3, 'failed', '{\"status\": 500}')",
            &[&a.tenant, &leased[1].action_id, &leased[1].lease_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "failed");
    // The single calls, in the other tenant: its job goes through as well.
    let begun: bool = d
        .query_one(
            "SELECT keyturn.begin_dispatch_for($1, $2, $3)",
            &[&b.tenant, &b_lease.action_id, &b_lease.lease_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(begun);
    let wrong_tenant = d
        .query_one(
            "SELECT keyturn.complete_for($1, $2, $3, 'succeeded')",
            &[&a.tenant, &b_lease.action_id, &b_lease.lease_id],
        )
        .await;
    assert_eq!(
        sqlstate(wrong_tenant),
        "55000",
        "completed in another tenant's name"
    );
    assert_eq!(b.status(b_lease.action_id).await, "executing");

    assert_eq!(
        events(&a, leased[0].action_id).await,
        "pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher succeeded:app_dispatcher"
    );
    assert_eq!(a.usage_rows(leased[0].action_id).await, 1);
    assert_eq!(a.status(leased[1].action_id).await, "failed");
    assert_work_list_in_step(&a.superuser).await;
}

#[tokio::test]
async fn test_the_for_calls_refuse_a_missing_tenant_before_anything() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let op = connect("app_operator").await;
    let none: Option<&str> = None;
    let id = ids[0];
    let lease = Uuid::new_v4();
    for tenant in [none, Some(""), Some("  ")] {
        let calls: [(&Client, &str); 6] = [
            (&d, "SELECT count(*) FROM keyturn.lease_for($1, 'w', 8)"),
            (&d, "SELECT count(*) FROM keyturn.sweep_for($1)"),
            (&d, "SELECT count(*) FROM keyturn.attachments_for($1, gen_random_uuid(), gen_random_uuid())"),
            (&d, "SELECT count(*) FROM keyturn.begin_dispatch_many_for($1, '{}', '{}')"),
            (&op, "SELECT keyturn.reconcile_for($1, gen_random_uuid(), 'failed', 'n') IS NULL"),
            (&op, "SELECT count(*) FROM keyturn.sweep_for($1)"),
        ];
        for (client, sql) in calls {
            let refused = client.query_one(sql, &[&tenant]).await;
            assert_eq!(sqlstate(refused), "22023", "{sql} with tenant {tenant:?}");
        }
        let refused = d
            .query_one(
                "SELECT keyturn.begin_dispatch_for($1, $2, $3)",
                &[&tenant, &id, &lease],
            )
            .await;
        assert_eq!(sqlstate(refused), "22023");
        let refused = d
            .query_one(
                "SELECT keyturn.complete_for($1, $2, $3, 'succeeded')",
                &[&tenant, &id, &lease],
            )
            .await;
        assert!(message(refused).contains("needs the tenant"));
    }
    assert_eq!(w.status(id).await, "queued", "nothing leased");
}

#[tokio::test]
async fn test_tenants_due_and_sweep_for_one_tenant() {
    let _g = DISPATCH_LOCK.lock().await;
    let (a, _ta, a_ids) = queued(2).await;
    let b = World::new("member").await;
    let short = b.webhook_tool(json!({"expires_in": "1 second"})).await;
    let stale = b
        .propose(&short, json!({"channel": "c", "text": "s"}))
        .await
        .unwrap();
    let a_short = a.webhook_tool(json!({"expires_in": "1 second"})).await;
    let a_stale = a
        .propose(&a_short, json!({"channel": "c", "text": "s"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;

    let due = |providers: Option<Vec<&'static str>>| {
        let d = &d;
        async move {
            d.query(
                "SELECT tenant, to_lease, to_sweep FROM keyturn.tenants_due($1, 10000)",
                &[&providers],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, i64>(1),
                    r.get::<_, i64>(2),
                )
            })
            .collect::<Vec<_>>()
        }
    };
    let rows = due(None).await;
    assert!(rows.contains(&(a.tenant.clone(), 2, 0)), "{rows:?}");
    assert!(
        !rows.iter().any(|r| r.0 == b.tenant),
        "nothing of b's is due yet: {rows:?}"
    );
    let rows = due(Some(vec!["smtp"])).await;
    assert!(
        !rows.iter().any(|r| r.0 == a.tenant && r.1 > 0),
        "no smtp tool is due: {rows:?}"
    );
    let refused = d
        .query("SELECT * FROM keyturn.tenants_due(NULL, 0)", &[])
        .await;
    assert_eq!(sqlstate(refused), "22023");

    tokio::time::sleep(Duration::from_millis(1300)).await;
    let rows = due(None).await;
    assert!(rows.contains(&(a.tenant.clone(), 2, 1)), "{rows:?}");
    assert!(rows.contains(&(b.tenant.clone(), 0, 1)), "{rows:?}");

    let swept = d
        .query_one(
            "SELECT expired, requeued, uncertain, files FROM keyturn.sweep_for($1)",
            &[&b.tenant],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            swept.get::<_, i32>(0),
            swept.get::<_, i32>(1),
            swept.get::<_, i32>(2)
        ),
        (1, 0, 0)
    );
    assert_eq!(b.status(stale.id).await, "expired");
    assert_eq!(
        a.status(a_stale.id).await,
        "pending",
        "sweep_for(b) leaves a's proposal"
    );
    assert_eq!(a.status(a_ids[0]).await, "queued");
    assert_eq!(
        events(&b, stale.id).await,
        "pending:app_agent expired:app_dispatcher"
    );
    let rows = due(None).await;
    assert!(!rows.iter().any(|r| r.0 == b.tenant), "{rows:?}");
}

#[tokio::test]
async fn test_a_lapsed_execution_is_reconciled_in_its_tenant() {
    let _g = DISPATCH_LOCK.lock().await;
    let (w, _t, ids) = queued(1).await;
    let d = connect("app_dispatcher").await;
    let op = connect("app_operator").await;
    let l = lease_for(&d, &w.tenant, "1 second").await.remove(0);
    assert!(begin_many_for(&d, &w.tenant, &[&l]).await[0].1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let swept: i32 = d
        .query_one("SELECT uncertain FROM keyturn.sweep_for($1)", &[&w.tenant])
        .await
        .unwrap()
        .get(0);
    assert_eq!(swept, 1);
    assert_eq!(w.status(ids[0]).await, "uncertain");

    let other = unique("other_tenant");
    let refused = op
        .query_one(
            "SELECT keyturn.reconcile_for($1, $2, 'succeeded', 'checked')",
            &[&other, &ids[0]],
        )
        .await;
    assert_eq!(sqlstate(refused), "55000", "not an action of that tenant");
    assert_eq!(w.status(ids[0]).await, "uncertain");
    let refused = d
        .query_one(
            "SELECT keyturn.reconcile_for($1, $2, 'succeeded', 'checked')",
            &[&w.tenant, &ids[0]],
        )
        .await;
    assert_eq!(
        sqlstate(refused),
        "42501",
        "the dispatcher does not reconcile"
    );
    let status: String = op
        .query_one(
            "SELECT keyturn.reconcile_for($1, $2, 'succeeded', 'checked the provider')",
            &[&w.tenant, &ids[0]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "succeeded");
    assert_eq!(
        events(&w, ids[0]).await,
        "pending:app_agent queued:app_human leased:app_dispatcher executing:app_dispatcher uncertain:app_dispatcher succeeded:app_operator"
    );
    let refused = op
        .query_one(
            "SELECT keyturn.reconcile_for($1, $2, 'maybe', 'n')",
            &[&w.tenant, &ids[0]],
        )
        .await;
    assert_eq!(sqlstate(refused), "22023");
}

#[tokio::test]
async fn test_dispatch_by_tenant_is_false_without_citus() {
    let d = connect("app_dispatcher").await;
    let by_tenant: bool = d
        .query_one("SELECT keyturn.dispatch_by_tenant()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!by_tenant);
    let nodes = d
        .query("SELECT * FROM keyturn.dispatch_nodes()", &[])
        .await
        .unwrap();
    assert!(nodes.is_empty());
    let su = connect("postgres").await;
    let refused = su
        .query(
            "SELECT * FROM keyturn.citus_distribute('keyturn.action')",
            &[],
        )
        .await;
    assert_eq!(sqlstate(refused), "55000", "no Citus here");
    let refused = d
        .query(
            "SELECT * FROM keyturn.citus_distribute('keyturn.action')",
            &[],
        )
        .await;
    assert_eq!(sqlstate(refused), "42501", "the superuser's alone");
}

/// A NULL tenant is refused when the call is planned, by pg_keyturn's
/// planner hook (extension/src/route_guard.rs), before Citus could route
/// it: Citus hashes the tenant to pick a worker and crashes on a NULL
/// (tests/citus/b_null_tenant.sql). EXPLAIN plans without running, so here
/// only the hook can refuse.
#[tokio::test]
async fn test_a_null_tenant_is_refused_when_the_call_is_planned() {
    let d = connect("app_dispatcher").await;
    // pg_keyturn is loaded in a backend by its first call of a keyturn
    // function written in Rust; the hook guards it from then on.
    d.query_one("SELECT keyturn.current_tenant()", &[])
        .await
        .unwrap();
    for sql in [
        "EXPLAIN SELECT * FROM keyturn.lease_for(NULL, 'w', 8)",
        "EXPLAIN SELECT * FROM keyturn.lease_for(worker => 'w', in_tenant => NULL)",
        "EXPLAIN SELECT keyturn.sweep_for(NULL)",
        "EXPLAIN SELECT keyturn.begin_dispatch_for(NULL::text, gen_random_uuid(), gen_random_uuid())",
        // What the planner folds to NULL is what Citus would hash.
        "EXPLAIN SELECT * FROM keyturn.lease_for(NULLIF('acme', 'acme'), 'w', 8)",
        "EXPLAIN SELECT * FROM keyturn.lease_for(lower(NULL), 'w', 8)",
    ] {
        let refused = d.query(sql, &[]).await;
        assert_eq!(sqlstate(refused), "22023", "{sql}");
    }
    // Bound to NULL, as a driver sends it.
    let none: Option<&str> = None;
    let refused = d
        .query(
            "EXPLAIN SELECT * FROM keyturn.lease_for($1, 'w', 8)",
            &[&none],
        )
        .await;
    assert!(message(refused).contains("lease_for needs the tenant it acts in"));
    let refused = d
        .query(
            "EXPLAIN SELECT * FROM keyturn.lease_for(lower($1::text), 'w', 8)",
            &[&none],
        )
        .await;
    assert_eq!(
        sqlstate(refused),
        "22023",
        "an expression of a parameter bound to NULL"
    );
    // The hook looks at the tenant of keyturn's _for calls only.
    for sql in [
        "EXPLAIN SELECT * FROM keyturn.lease_for('acme', 'w', 8)",
        "EXPLAIN SELECT * FROM keyturn.lease_for('acme', NULL, 8)",
        "EXPLAIN SELECT * FROM keyturn.tenants_due(NULL)",
        "EXPLAIN SELECT * FROM keyturn.lease_for(lower('ACME'), 'w', 8)",
        "EXPLAIN SELECT pg_catalog.lower(NULL)",
    ] {
        d.query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}
