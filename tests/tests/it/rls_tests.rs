//! docs/sql-api.md: FORCEd RLS on every keyturn table with
//! tenant rows; no role sees another tenant's rows; no identity, no rows.

use keyturn_tests::*;
use serde_json::json;

const TENANT_TABLES: &[&str] = &[
    "member",
    "tool_grant",
    "grant_use",
    "auth_epoch",
    "cancelled_origin",
    "action",
    "open_action",
    "action_target",
    "staged_payload",
    "request",
    "vote",
    "delegation",
    "staged_file",
    "stager",
    "card_link",
    "audit_chain",
    "evidence",
    "notify_channel",
    "notification",
    "attempt",
    "event",
    "usage",
];

/// Tenant B with a row in every tenant table.
async fn populated() -> World {
    let b = World::new("admin").await;
    let sql = b.deal_tool(json!({})).await;
    let deal = b.deals(&b.principal, 1).await[0];
    let p = b
        .propose(
            &sql,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    assert_eq!(b.approve(&p).await.unwrap().0, "succeeded"); // usage
    let digest = b.webhook_tool(json!({"retain": "digest"})).await;
    let params = json!({"channel": "c", "text": "t"});
    let _g = DISPATCH_LOCK.lock().await;
    let d = b.propose(&digest, params.clone()).await.unwrap();
    assert_eq!(
        approve_on(&b.human, d.id, &d.token, Some(params))
            .await
            .unwrap()
            .0,
        "queued"
    ); // staged_payload
    b.agent
        .query_one("SELECT keyturn.cancel_origin('conv-b')", &[])
        .await
        .unwrap();
    let disp = connect("app_dispatcher").await;
    let l = lease_mine(&disp, &[d.id], "30 seconds").await;
    disp.query_one(
        "SELECT keyturn.begin_dispatch($1, $2)",
        &[&d.id, &l[0].lease_id],
    )
    .await
    .unwrap(); // attempt
    disp.query_one(
        "SELECT keyturn.complete($1, $2, 'retry', '{}', interval '1 day')",
        &[&d.id, &l[0].lease_id],
    )
    .await
    .unwrap();
    assert!(
        record_request_on(&b.human, "conv-b", "turn-1", "msg-b", "please")
            .await
            .unwrap()
    ); // request
    let quorum = b
        .webhook_tool(json!({"approval": "independent", "quorum": 2}))
        .await;
    let (voter, voter_human) = b.other("approver", "app_human", "s-voter").await;
    b.grant(&voter, &quorum).await;
    voter_human
        .query_one("SELECT keyturn.set_notify('email', 'voter@b.example')", &[])
        .await
        .unwrap(); // notify_channel; the quorum proposal below: notification
    let q = b
        .propose(&quorum, json!({"channel": "c", "text": "vote"}))
        .await
        .unwrap();
    assert_eq!(
        approve_on(&voter_human, q.id, &q.token, None)
            .await
            .unwrap()
            .0,
        "pending"
    ); // vote: one of two
    b.delegate(&sql, json!({}), 1, "1 hour").await.unwrap(); // delegation
    stage_file_on(&b.agent, b"tenant b", "b.pdf", "application/pdf")
        .await
        .unwrap(); // staged_file, stager
    voter_human
        .query_one("SELECT keyturn.link_code($1)", &[&vec![q.id]])
        .await
        .unwrap(); // card_link
    b.human
        .query_one(
            "SELECT keyturn.record_evidence('document', 'b.pdf', repeat('a', 64))",
            &[],
        )
        .await
        .unwrap(); // evidence
    for t in TENANT_TABLES {
        let n = count(
            &b.superuser,
            &format!("SELECT count(*) FROM keyturn.{t} WHERE tenant = $1"),
            &[&b.tenant],
        )
        .await;
        assert!(n > 0, "fixture: tenant B has no row in keyturn.{t}");
    }
    b
}

#[tokio::test]
async fn test_rls_is_enabled_and_forced_on_every_tenant_table() {
    let su = connect("postgres").await;
    for t in TENANT_TABLES {
        let row = su
            .query_one("SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = ('keyturn.' || $1)::regclass", &[t])
            .await
            .unwrap();
        assert!(
            row.get::<_, bool>(0) && row.get::<_, bool>(1),
            "keyturn.{t}: RLS must be ENABLEd and FORCEd"
        );
    }
    // Every keyturn table with a tenant column is in the list.
    let n = count(
        &su,
        "SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'keyturn' AND c.relkind = 'r' AND a.attname = 'tenant' AND NOT (c.relname = ANY ($1))",
        &[&TENANT_TABLES.to_vec()],
    )
    .await;
    assert_eq!(
        n, 0,
        "a keyturn table with a tenant column is missing from the RLS list"
    );
}

#[tokio::test]
async fn test_no_role_sees_another_tenants_rows() {
    let b = populated().await;
    // An admin of tenant A sees its whole tenant.
    let a = World::new("admin").await;
    // The dispatcher, operator and admin roles may set any identity they
    // like, so they read keyturn's tables only through its functions.
    for role in ["app_admin", "app_dispatcher", "app_operator"] {
        let c = Conn::connect(role, a.identity()).await;
        for t in TENANT_TABLES {
            assert_eq!(
                sqlstate(
                    c.query(&format!("SELECT count(*) FROM keyturn.{t}"), &[])
                        .await
                ),
                "42501",
                "{role} may not SELECT keyturn.{t}"
            );
        }
    }
    for role in ["app_agent", "app_human", "app_bypass"] {
        let c = Conn::connect(role, a.identity()).await;
        for t in TENANT_TABLES {
            let n = count(
                &c,
                &format!("SELECT count(*) FROM keyturn.{t} WHERE tenant = $1"),
                &[&b.tenant],
            )
            .await;
            let any_other = count(
                &c,
                &format!("SELECT count(*) FROM keyturn.{t} WHERE tenant <> $1"),
                &[&a.tenant],
            )
            .await;
            if role == "app_bypass" {
                // BYPASSRLS is the DBA's choice; keyturn only refuses it for sql tools.
                continue;
            }
            assert_eq!(
                n, 0,
                "{role} with tenant A identity sees tenant B rows in keyturn.{t}"
            );
            assert_eq!(any_other, 0, "{role} sees foreign rows in keyturn.{t}");
        }
        // And with no identity at all: no tenant rows.
        if role != "app_bypass" {
            let bare = connect(role).await;
            for t in TENANT_TABLES {
                let n = count(&bare, &format!("SELECT count(*) FROM keyturn.{t}"), &[]).await;
                assert_eq!(n, 0, "{role} without identity sees rows in keyturn.{t}");
            }
        }
    }
    // Tenant B's own admin does see them (the fixture is real).
    let n = count(
        &b.human,
        "SELECT count(*) FROM keyturn.action WHERE tenant = $1",
        &[&b.tenant],
    )
    .await;
    assert_eq!(n, 3);
}

#[tokio::test]
async fn test_member_sees_only_own_rows_within_tenant() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mine = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let (other, agent2) = w.other("member", "app_agent", "s2").await;
    w.grant(&other, &t).await;
    let theirs = propose_on(&agent2, &t, json!({"channel": "c", "text": "t"}), json!({}))
        .await
        .unwrap();
    let seen: Vec<uuid::Uuid> = w
        .agent
        .query("SELECT id FROM keyturn.action", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seen, vec![mine.id]);
    let events = count(
        &w.agent,
        "SELECT count(*) FROM keyturn.event WHERE action_id = $1",
        &[&theirs.id],
    )
    .await;
    assert_eq!(events, 0);
    let (_a, approver) = w.other("approver", "app_human", "s3").await;
    assert_eq!(
        count(&approver, "SELECT count(*) FROM keyturn.action", &[]).await,
        2
    );
}
