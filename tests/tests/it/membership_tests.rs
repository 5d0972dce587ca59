//! docs/sql-api.md: membership, tool grants and the authorization epoch.

use keyturn_tests::*;
use serde_json::json;

fn form(deal: i64) -> serde_json::Value {
    json!({"where": {"id": deal}, "set": {"stage": "qualified"}})
}

async fn epoch(w: &World, principal: &str) -> i64 {
    count(
        &w.superuser,
        "SELECT coalesce((SELECT epoch FROM keyturn.auth_epoch WHERE tenant = $1 AND principal = $2), 0)",
        &[&w.tenant, &principal],
    )
    .await
}

/// An admin call's boolean answer: did it change anything?
async fn admin_says(
    w: &World,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> bool {
    w.admin.query_one(sql, params).await.unwrap().get(0)
}

#[tokio::test]
async fn test_add_member_validates_role() {
    let w = World::new("member").await;
    for bad in ["owner", "", "Admin", "approver "] {
        let r = w
            .admin
            .execute(
                "SELECT keyturn.add_member($1, $2, $3)",
                &[&w.tenant, &"someone", &bad],
            )
            .await;
        assert_eq!(sqlstate(r), "22023", "role {bad:?}");
    }
    let r = w
        .admin
        .execute(
            "SELECT keyturn.add_member($1, $2, NULL)",
            &[&w.tenant, &"someone"],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    for good in ["member", "approver", "admin"] {
        let p = unique("p");
        w.admin
            .execute(
                "SELECT keyturn.add_member($1, $2, $3)",
                &[&w.tenant, &p, &good],
            )
            .await
            .expect(good);
    }
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.member WHERE tenant = $1 AND principal = 'someone'",
            &[&w.tenant]
        )
        .await,
        0
    );
}

#[tokio::test]
async fn test_remove_member_drops_grants_and_access() {
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    w.propose(&tool, form(deal))
        .await
        .expect("member with grant proposes");
    w.admin
        .execute(
            "SELECT keyturn.remove_member($1, $2)",
            &[&w.tenant, &w.principal],
        )
        .await
        .unwrap();
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.tool_grant WHERE tenant = $1 AND principal = $2",
            &[&w.tenant, &w.principal]
        )
        .await,
        0,
        "remove_member must drop the principal's grants"
    );
    assert_eq!(sqlstate(w.propose(&tool, form(deal)).await), "42501");
    // Re-adding the member does not bring the grant back.
    w.admin
        .execute(
            "SELECT keyturn.add_member($1, $2, 'member')",
            &[&w.tenant, &w.principal],
        )
        .await
        .unwrap();
    assert_eq!(sqlstate(w.propose(&tool, form(deal)).await), "42501");
}

#[tokio::test]
async fn test_grant_and_revoke_unknown_tool_is_42704() {
    let w = World::new("member").await;
    let ghost = unique("ghost");
    let r = w
        .admin
        .execute(
            "SELECT keyturn.grant_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &ghost],
        )
        .await;
    assert_eq!(sqlstate(r), "42704");
    let r = w
        .admin
        .execute(
            "SELECT keyturn.revoke_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &ghost],
        )
        .await;
    assert_eq!(sqlstate(r), "42704");
}

#[tokio::test]
async fn test_real_grant_bumps_epoch_once() {
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let e0 = epoch(&w, &w.principal).await;
    let name = unique("another");
    w.admin
        .execute(
            "SELECT keyturn.register_tool($1, '{\"kind\":\"read\"}')",
            &[&name],
        )
        .await
        .unwrap();
    w.grant(&w.principal, &name).await;
    assert_eq!(
        epoch(&w, &w.principal).await,
        e0 + 1,
        "a real grant bumps the epoch once"
    );
    w.grant(&w.principal, &tool).await; // already held
    assert_eq!(
        epoch(&w, &w.principal).await,
        e0 + 1,
        "a repeated grant does not bump it"
    );
}

#[tokio::test]
async fn test_noop_admin_calls_keep_epoch_and_proposal() {
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let ungranted = unique("ungranted");
    w.admin
        .execute(
            "SELECT keyturn.register_tool($1, '{\"kind\":\"read\"}')",
            &[&ungranted],
        )
        .await
        .unwrap();
    let p = w.propose(&tool, form(deal)).await.unwrap();
    let e = epoch(&w, &w.principal).await;
    let changed: bool = admin_says(
        &w,
        "SELECT keyturn.add_member($1, $2, 'member')",
        &[&w.tenant, &w.principal],
    )
    .await;
    assert!(!changed, "same role again reports no change");
    let changed: bool = admin_says(
        &w,
        "SELECT keyturn.grant_tool($1, $2, $3)",
        &[&w.tenant, &w.principal, &tool],
    )
    .await;
    assert!(!changed, "a repeated grant reports no change");
    let changed: bool = admin_says(
        &w,
        "SELECT keyturn.revoke_tool($1, $2, $3)",
        &[&w.tenant, &w.principal, &ungranted],
    )
    .await;
    assert!(
        !changed,
        "revoking what was never granted reports no change"
    );
    w.admin
        .execute(
            "SELECT keyturn.remove_member($1, $2)",
            &[&w.tenant, &unique("absent")],
        )
        .await
        .unwrap();
    assert_eq!(
        epoch(&w, &w.principal).await,
        e,
        "no-op calls must not bump the epoch"
    );
    let (status, _) = w.approve(&p).await.unwrap();
    assert_eq!(
        status, "succeeded",
        "no-op admin calls must not invalidate a pending proposal"
    );
}

#[tokio::test]
async fn test_real_changes_invalidate_pending_proposals() {
    // Each real change of (tenant, principal) invalidates that principal's proposal.
    for change in ["grant_other", "revoke", "role", "remove_readd"] {
        let w = World::new("member").await;
        let tool = w.deal_tool(json!({})).await;
        let deal = w.deals(&w.principal, 1).await[0];
        let p = w.propose(&tool, form(deal)).await.unwrap();
        match change {
            "grant_other" => {
                let name = unique("extra");
                w.admin
                    .execute(
                        "SELECT keyturn.register_tool($1, '{\"kind\":\"read\"}')",
                        &[&name],
                    )
                    .await
                    .unwrap();
                w.grant(&w.principal, &name).await;
            }
            "revoke" => {
                w.admin
                    .execute(
                        "SELECT keyturn.revoke_tool($1, $2, $3)",
                        &[&w.tenant, &w.principal, &tool],
                    )
                    .await
                    .unwrap();
                w.grant(&w.principal, &tool).await;
            }
            "role" => {
                w.admin
                    .execute(
                        "SELECT keyturn.add_member($1, $2, 'approver')",
                        &[&w.tenant, &w.principal],
                    )
                    .await
                    .unwrap();
            }
            _ => {
                w.admin
                    .execute(
                        "SELECT keyturn.remove_member($1, $2)",
                        &[&w.tenant, &w.principal],
                    )
                    .await
                    .unwrap();
                w.admin
                    .execute(
                        "SELECT keyturn.add_member($1, $2, 'member')",
                        &[&w.tenant, &w.principal],
                    )
                    .await
                    .unwrap();
                w.grant(&w.principal, &tool).await;
            }
        }
        let (status, _) = w.approve(&p).await.unwrap();
        assert_eq!(status, "invalidated", "after change {change}");
        assert_eq!(w.stage_of(deal).await, "lead", "after change {change}");
        assert_eq!(w.writes(deal).await, 0);
    }
}

#[tokio::test]
async fn test_other_principals_change_does_not_invalidate() {
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&tool, form(deal)).await.unwrap();
    let (other, _c) = w.other("member", "app_agent", "s2").await;
    w.grant(&other, &tool).await;
    w.admin
        .execute("SELECT keyturn.remove_member($1, $2)", &[&w.tenant, &other])
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
}

/// propose and the approver's reads take the membership in one statement
/// with what else they need; finding no row there, they ask
/// `keyturn._membership_missing`, which raises 42501 for a caller who is not
/// a member (or has no full identity) and 40001 for one who is one now: the
/// membership came in between the two reads (READ COMMITTED), and the call is
/// to be retried, never carried on without it. The race itself has no lock
/// wait to hold it open, so the helper's two answers are tested here.
#[tokio::test]
async fn test_membership_missing_says_retry_only_when_a_membership_is_there() {
    let w = World::new("member").await;
    let call = "SELECT keyturn._membership_missing($1, $2, $3)";
    let session = Some("s1");
    let none: Option<&str> = None;
    let member = w
        .superuser
        .execute(call, &[&w.tenant, &w.principal, &session])
        .await;
    assert_eq!(sqlstate(member), "40001");
    let stranger = w
        .superuser
        .execute(call, &[&w.tenant, &"nobody-here", &session])
        .await;
    assert_eq!(sqlstate(stranger), "42501");
    let no_session = w
        .superuser
        .execute(call, &[&w.tenant, &w.principal, &none])
        .await;
    assert_eq!(sqlstate(no_session), "42501");
}
