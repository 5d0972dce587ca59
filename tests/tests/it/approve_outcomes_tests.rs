//! docs/sql-api.md: what approve answers after the claim — expired,
//! rejected_tampered, conflict, failed, queued — and digest retention.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};

fn form(deal: i64, stage: &str) -> Value {
    json!({"where": {"id": deal}, "set": {"stage": stage}})
}

#[tokio::test]
async fn test_expired_is_returned_not_raised() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({"expires_in": "1 second"})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "won")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (status, _) = w
        .approve(&p)
        .await
        .expect("expiry is an answer, not an error");
    assert_eq!(status, "expired");
    assert_eq!(w.status(p.id).await, "expired");
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(
        w.approve(&p).await.unwrap().0,
        "expired",
        "replay answers the stored status"
    );
}

#[tokio::test]
async fn test_tampered_params_with_same_hash_are_caught() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "won")).await.unwrap();
    let n = tamper(&w.superuser, "UPDATE keyturn.action SET params = jsonb_set(params, '{set,stage}', '\"lost\"') WHERE id = $1", &[&p.id]).await;
    assert_eq!(n, 1);
    assert_eq!(w.approve(&p).await.unwrap().0, "rejected_tampered");
    assert_eq!(w.stage_of(deal).await, "lead");
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(w.usage_rows(p.id).await, 0);
}

#[tokio::test]
async fn test_tampered_params_and_hash_together_are_caught() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let p = w.propose(&t, form(deals[0], "won")).await.unwrap();
    // Point the proposal at another row and another value, hash recomputed to match.
    let forged = json!({"where": {"id": deals[1]}, "set": {"stage": "lost"}});
    tamper(
        &w.superuser,
        "UPDATE keyturn.action SET params = $2, params_hash = keyturn.params_hash(tool, $2) WHERE id = $1",
        &[&p.id, &forged],
    )
    .await;
    assert_eq!(w.approve(&p).await.unwrap().0, "rejected_tampered");
    for d in &deals {
        assert_eq!(w.stage_of(*d).await, "lead");
        assert_eq!(w.writes(*d).await, 0);
    }
}

/// Eighth conformance audit: the origin is bound like the params. A table
/// writer without the token moved a proposal to another conversation (out of
/// one its owner had cancelled, say), changing the origin and its column
/// together, or the column alone, and approve answered `succeeded`; each
/// now answers `rejected_tampered` and nothing is written.
#[tokio::test]
async fn test_a_changed_origin_is_caught() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 3).await;
    let origin = json!({"conversation_id": "c-1", "turn_id": "t-1"});
    for (i, change) in [
        "UPDATE keyturn.action SET origin = '{\"conversation_id\": \"c-2\", \"turn_id\": \"t-1\"}', \
           conversation_id = 'c-2' WHERE id = $1",
        "UPDATE keyturn.action SET conversation_id = 'c-2' WHERE id = $1",
        "UPDATE keyturn.action SET origin = origin || '{\"message_id\": \"m-9\"}' WHERE id = $1",
    ]
    .iter()
    .enumerate()
    {
        let p = propose_on(&w.agent, &t, form(deals[i], "won"), origin.clone())
            .await
            .unwrap();
        assert_eq!(tamper(&w.superuser, change, &[&p.id]).await, 1);
        assert_eq!(w.approve(&p).await.unwrap().0, "rejected_tampered", "{change}");
        assert_eq!(w.writes(deals[i]).await, 0);
    }
    // Untouched, the same origin approves.
    let p = propose_on(&w.agent, &t, form(deals[0], "won"), origin)
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
}

#[tokio::test]
async fn test_extended_expiry_is_caught() {
    // A sweep in between would record the expiry before the tamper.
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.deal_tool(json!({"expires_in": "1 second"})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "won")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    tamper(
        &w.superuser,
        "UPDATE keyturn.action SET expires_at = expires_at + interval '1 day' WHERE id = $1",
        &[&p.id],
    )
    .await;
    assert_eq!(w.approve(&p).await.unwrap().0, "rejected_tampered");
    assert_eq!(w.writes(deal).await, 0);
}

#[tokio::test]
async fn test_resubmitted_params_must_match() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "won")).await.unwrap();
    let r = approve_on(&w.human, p.id, &p.token, Some(form(deal, "lost")))
        .await
        .unwrap();
    assert_eq!(r.0, "rejected_tampered");
    assert_eq!(w.writes(deal).await, 0);
    // The same params resubmitted (keys in another order) pass.
    let p2 = w.propose(&t, form(deal, "won")).await.unwrap();
    let same = json!({"set": {"stage": "won"}, "where": {"id": deal}});
    assert_eq!(
        approve_on(&w.human, p2.id, &p2.token, Some(same))
            .await
            .unwrap()
            .0,
        "succeeded"
    );
}

#[tokio::test]
async fn test_changed_target_is_a_conflict() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 2).await;
    let p = w
        .propose(&t, json!({"where": {"id": deals}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    w.superuser
        .execute(
            "UPDATE crm.deal SET name = name || ' (edited)' WHERE id = $1",
            &[&deals[1]],
        )
        .await
        .unwrap();
    let writes_before = w.writes(deals[0]).await + w.writes(deals[1]).await;
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "conflict");
    let result = result.unwrap();
    assert_eq!(result["expected"], 2);
    assert_eq!(result["matched"], 1);
    assert_eq!(
        w.stage_of(deals[0]).await,
        "lead",
        "the whole write is rolled back"
    );
    assert_eq!(w.stage_of(deals[1]).await, "lead");
    assert_eq!(
        w.writes(deals[0]).await + w.writes(deals[1]).await,
        writes_before
    );
    assert_eq!(w.usage_rows(p.id).await, 0);
}

#[tokio::test]
async fn test_target_no_longer_matching_where_is_a_conflict() {
    let w = World::new("member").await;
    let t = w
        .deal_tool(
            json!({"sql": {"table": "crm.deal", "key": "id", "version": "revision",
                                       "set": ["stage"], "where": ["id", "owner"]}}),
        )
        .await;
    let deal = w.deals("alice", 1).await[0];
    let p = w
        .propose(
            &t,
            json!({"where": {"owner": "alice"}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    // Owner changes but the version column does not: the where must still be rechecked.
    w.superuser
        .execute("UPDATE crm.deal SET owner = 'bob' WHERE id = $1", &[&deal])
        .await
        .unwrap();
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "conflict");
    assert_eq!(result.unwrap()["matched"], 0);
    assert_eq!(w.stage_of(deal).await, "lead");
}

#[tokio::test]
async fn test_postcondition_failure_rolls_back() {
    let w = World::new("member").await;
    let t = w.contact_tool().await;
    let c = w.contact("old@example.com").await;
    let p = w
        .propose(&t, json!({"where": {"id": c}, "set": {"email": "X@Y.COM"}}))
        .await
        .unwrap();
    let (status, _) = w.approve(&p).await.unwrap();
    assert_eq!(status, "failed");
    let email: String = w
        .superuser
        .query_one("SELECT email FROM crm.contact WHERE id = $1", &[&c])
        .await
        .unwrap()
        .get(0);
    assert_eq!(email, "old@example.com", "rolled back");
    assert_eq!(w.usage_rows(p.id).await, 0);
}

#[tokio::test]
async fn test_business_error_is_failed_with_sqlstate() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "bogus")).await.unwrap();
    let (status, result) = w.approve(&p).await.expect("a business error is an answer");
    assert_eq!(status, "failed");
    assert_eq!(result.unwrap()["sqlstate"], "23514");
    assert_eq!(w.stage_of(deal).await, "lead");
    assert_eq!(w.writes(deal).await, 0);
    assert_eq!(w.status(p.id).await, "failed");
    // An unparsable value for the column type is a business error too.
    let p = w
        .propose(
            &t,
            json!({"where": {"id": deal}, "set": {"amount": "lots"}}),
        )
        .await
        .unwrap();
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "failed");
    assert_eq!(result.unwrap()["sqlstate"], "22P02");
}

#[tokio::test]
async fn test_bypassrls_approver_is_refused_for_sql_tools() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "won")).await.unwrap();
    let bypass = Conn::connect("app_bypass", w.identity()).await;
    assert_eq!(
        sqlstate(approve_on(&bypass, p.id, &p.token, None).await),
        "42501"
    );
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(w.writes(deal).await, 0);
}

#[tokio::test]
async fn test_external_approve_queues_and_notifies() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "hi"}))
        .await
        .unwrap();
    let (_listener, mut rx) = listen("keyturn_dispatch").await;
    let (status, _) = w.approve(&p).await.unwrap();
    assert_eq!(status, "queued");
    // Any role may LISTEN on the channel, so the wake-up names nothing: no
    // action id, no tenant.
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a NOTIFY on keyturn_dispatch")
        .expect("listener alive");
    assert_eq!(got.channel(), "keyturn_dispatch");
    assert_eq!(got.payload(), "", "the payload names no action");
    assert_eq!(w.usage_rows(p.id).await, 0, "queued is not succeeded");
}

#[tokio::test]
async fn test_digest_retention() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"retain": "digest"})).await;
    let params = json!({"text": "quarterly numbers zx81", "channel": "board"});
    let p = w.propose(&t, params.clone()).await.unwrap();
    assert_eq!(
        p.summary, "Notify board: \"quarterly numbers zx81\"",
        "rendered summary is returned"
    );
    let row = w
        .superuser
        .query_one(
            "SELECT params, summary, param_keys FROM keyturn.action WHERE id = $1",
            &[&p.id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<Value>>(0), None);
    assert_eq!(row.get::<_, Option<String>>(1), None);
    assert_eq!(
        row.get::<_, Vec<String>>(2),
        vec!["channel".to_string(), "text".to_string()]
    );
    let shown: String = w
        .agent
        .query_one("SELECT summary FROM keyturn.action_status($1)", &[&p.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        shown, t,
        "action_status shows the tool name for digest actions"
    );
    // Without params: 22023, nothing changes.
    assert_eq!(sqlstate(w.approve(&p).await), "22023");
    assert_eq!(w.status(p.id).await, "pending");
    // With the same params: queued, payload staged.
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, Some(params.clone()))
            .await
            .unwrap()
            .0,
        "queued"
    );
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.staged_payload WHERE action_id = $1",
            &[&p.id]
        )
        .await,
        1
    );
    // With different params: rejected_tampered, nothing staged.
    let p2 = w.propose(&t, params.clone()).await.unwrap();
    let other = json!({"text": "quarterly numbers zx82", "channel": "board"});
    assert_eq!(
        approve_on(&w.human, p2.id, &p2.token, Some(other))
            .await
            .unwrap()
            .0,
        "rejected_tampered"
    );
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.staged_payload WHERE action_id = $1",
            &[&p2.id]
        )
        .await,
        0
    );
    // No value of a rejected digest action is anywhere in its rows.
    let leaks = count(
        &w.superuser,
        "SELECT (SELECT count(*) FROM keyturn.action a WHERE a.id = $1 AND strpos(to_jsonb(a)::text, 'zx8') > 0) \
              + (SELECT count(*) FROM keyturn.event e WHERE e.action_id = $1 AND strpos(to_jsonb(e)::text, 'zx8') > 0)",
        &[&p2.id],
    )
    .await;
    assert_eq!(leaks, 0);
}

#[tokio::test]
async fn test_schema_revalidation_failure_is_invalidated() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "a long enough text"}))
        .await
        .unwrap();
    // The stored schema is narrowed behind keyturn's back (tool versions have no guard).
    w.superuser
        .execute("UPDATE keyturn.tool_version SET params_schema = jsonb_set(params_schema, '{properties,text,maxLength}', '3') WHERE tool = $1", &[&t])
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "invalidated");
    assert_eq!(w.status(p.id).await, "invalidated");
}

#[tokio::test]
async fn test_digest_action_invalidated_by_revalidation_keeps_no_param_value() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"retain": "digest"})).await;
    let marker = unique("revalidated");
    let params = json!({"channel": "ops", "text": marker});
    let p = w.propose(&t, params.clone()).await.unwrap();
    w.superuser
        .execute("UPDATE keyturn.tool_version SET params_schema = jsonb_set(params_schema, '{properties,text,maxLength}', '3') WHERE tool = $1", &[&t])
        .await
        .unwrap();
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, Some(params))
            .await
            .unwrap()
            .0,
        "invalidated"
    );
    // Digest retention: after a final status no param value is readable from any keyturn table.
    let hits = count(
        &w.superuser,
        "SELECT (SELECT count(*) FROM keyturn.action a WHERE a.id = $1 AND strpos(to_jsonb(a)::text, $2) > 0) \
              + (SELECT count(*) FROM keyturn.event e WHERE e.action_id = $1 AND strpos(to_jsonb(e)::text, $2) > 0) \
              + (SELECT count(*) FROM keyturn.staged_payload s WHERE s.action_id = $1)",
        &[&p.id, &marker],
    )
    .await;
    assert_eq!(
        hits, 0,
        "the revalidation error message must not carry param values into the action row"
    );
}

/// Red-team pass of 0.3.0: a digest tool's refused proposal quoted the
/// value in its error, and PostgreSQL writes every error to the server log.
/// The refusal names the path and the rule, never the value; a tool that
/// keeps its params still quotes it, which helps its author.
#[tokio::test]
async fn test_a_digest_tools_refusals_name_no_value() {
    let w = World::new("member").await;
    let marker = unique("secretvalue");
    let schema = json!({"type": "object", "required": ["channel", "text"], "properties": {
        "channel": {"type": "string", "enum": ["ops", "sales"]},
        "text": {"type": "string", "maxLength": 500}}});
    let digest = w
        .webhook_tool(json!({"retain": "digest", "params_schema": schema.clone()}))
        .await;
    let full = w.webhook_tool(json!({"params_schema": schema})).await;
    let refused = message(
        w.propose(&digest, json!({"channel": marker, "text": "hi"}))
            .await,
    );
    assert!(
        !refused.contains(&marker),
        "no value in the refusal: {refused}"
    );
    assert!(
        refused.contains("/channel") && refused.contains("enum"),
        "the path and the rule are named: {refused}"
    );
    let quoted = message(
        w.propose(&full, json!({"channel": marker, "text": "hi"}))
            .await,
    );
    assert!(
        quoted.contains(&marker),
        "a full tool's refusal quotes the value: {quoted}"
    );
    // A grant's scope quotes values in its refusal too.
    w.grant_with(
        &w.principal,
        &digest,
        Some(json!({"params": {"text": {"in": ["allowed"]}}})),
        None,
        None,
    )
    .await
    .unwrap();
    let scoped = w
        .propose(&digest, json!({"channel": "ops", "text": marker}))
        .await;
    let out_of_scope = message(scoped);
    assert!(out_of_scope.contains("scope"), "{out_of_scope}");
    assert!(
        !out_of_scope.contains(&marker),
        "no value in the scope refusal: {out_of_scope}"
    );
}

#[tokio::test]
async fn test_approver_without_table_privilege_fails_the_write_as_itself() {
    // The business UPDATE runs as the approving role: a role without UPDATE on
    // crm.deal cannot write through keyturn's owner.
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w.propose(&t, form(deal, "won")).await.unwrap();
    let login = unique("weak_human");
    w.superuser.batch_execute(&format!("CREATE ROLE {login} LOGIN IN ROLE keyturn_approver; GRANT USAGE ON SCHEMA crm TO {login}")).await.unwrap();
    let c = Conn::connect(&login, w.identity()).await;
    let (status, result) = approve_on(&c, p.id, &p.token, None).await.unwrap();
    assert_eq!(status, "failed");
    assert_eq!(result.unwrap()["sqlstate"], "42501");
    assert_eq!(w.stage_of(deal).await, "lead");
    assert_eq!(w.writes(deal).await, 0);
}

#[tokio::test]
async fn test_preview_of_digest_action_has_no_params() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"retain": "digest"})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "private words"}))
        .await
        .unwrap();
    let card: Value = w
        .human
        .query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    assert!(card.get("params").is_none() || card["params"].is_null());
    assert_eq!(card["summary"], t.as_str());
    assert!(!card.to_string().contains("private words"));
}

/// After the claim, in the documented order: the token's binding, then the
/// invalidations, then the hash. A digest action of a changed tool approved
/// with other fields is `invalidated`, not `rejected_tampered` (an earlier
/// 0.3.0 build checked the resubmitted fields first).
#[tokio::test]
async fn test_a_changed_tool_invalidates_before_a_digests_fields_are_checked() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"approval": "independent", "retain": "digest"}))
        .await;
    let (approver, human) = w.other("approver", "app_human", "s-order").await;
    w.grant(&approver, &t).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "the proposed words"}))
        .await
        .unwrap();
    assert!(
        tamper(
            &w.superuser,
            "UPDATE keyturn.tool SET version = version + 1 WHERE name = $1",
            &[&t],
        )
        .await
            >= 1
    );
    let other = json!({"channel": "ops", "text": "other words"});
    let (status, result) = approve_on(&human, p.id, &p.token, Some(other))
        .await
        .unwrap();
    assert_eq!(status, "invalidated", "{result:?}");
    assert_eq!(
        result.unwrap()["reason"],
        json!(format!("tool {t} changed from version 1 to 2"))
    );
}

/// What approve checks again of a claimed proposal (keyturn._invalid_reason):
/// each check that fails ends it `invalidated` with its own reason, in these
/// words. The changes are made behind the API's back (tamper: no trigger
/// runs, no epoch moves), so each reaches its own check and no earlier one;
/// the tool needs an independent approver, so that the proposer's membership
/// and grant can go while the approver's stay.
#[tokio::test]
async fn test_each_recheck_invalidates_with_its_own_reason() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"approval": "independent"})).await;
    let (approver, human) = w.other("approver", "app_human", "s-recheck").await;
    w.grant(&approver, &t).await;
    let who = w.principal.clone();
    let epoch = w.epoch(&who).await;
    let evidence: uuid::Uuid = w
        .human
        .query_one(
            "SELECT keyturn.record_evidence(kind => 'email', ref => 'msg-recheck', sha256 => $1)",
            &[&"a".repeat(64)],
        )
        .await
        .unwrap()
        .get(0);
    // Each change names the tool ($1) and the proposal ($2).
    let proposer = "(SELECT principal FROM keyturn.action WHERE id = $2)";
    let cases: [(&str, Value, String, String); 7] = [
        (
            "disabled",
            json!({}),
            "UPDATE keyturn.tool SET enabled = false WHERE name = $1 AND $2::uuid IS NOT NULL".into(),
            format!("tool {t} is disabled"),
        ),
        (
            "new version",
            json!({}),
            "UPDATE keyturn.tool SET version = version + 1 WHERE name = $1 AND $2::uuid IS NOT NULL".into(),
            format!("tool {t} changed from version 1 to 2"),
        ),
        (
            "epoch",
            json!({}),
            "UPDATE keyturn.action SET epoch = epoch + 5 WHERE id = $2 AND $1 <> ''".into(),
            format!("the authorization of principal {who} changed (epoch {}, now {epoch})", epoch + 5),
        ),
        (
            "member",
            json!({}),
            format!("DELETE FROM keyturn.member WHERE principal = {proposer} AND $1 <> ''"),
            format!("principal {who} is no longer a member of tenant {}", w.tenant),
        ),
        (
            "grant",
            json!({}),
            format!("DELETE FROM keyturn.tool_grant WHERE tool = $1 AND principal = {proposer}"),
            format!("principal {who} no longer holds a grant for tool {t}"),
        ),
        (
            "conversation",
            json!({"conversation_id": "c-recheck", "turn_id": "t-1"}),
            "INSERT INTO keyturn.cancelled_origin (tenant, principal, conversation_id, how) \
             SELECT tenant, principal, 'c-recheck', 'archived' FROM keyturn.action WHERE id = $2 AND $1 <> ''"
                .into(),
            "conversation c-recheck was archived".into(),
        ),
        (
            "evidence",
            json!({"evidence": [evidence.to_string()]}),
            format!("UPDATE keyturn.evidence SET revoked_at = now() WHERE principal = {proposer} AND $1 <> ''"),
            format!("the evidence it cites ({evidence}) was revoked"),
        ),
    ];
    let put_back = [
        "UPDATE keyturn.tool SET enabled = true, version = 1 WHERE name = $1 AND $2::uuid IS NOT NULL".to_owned(),
        "INSERT INTO keyturn.member (tenant, principal, role) \
         SELECT tenant, principal, 'member' FROM keyturn.action WHERE id = $2 AND $1 <> '' \
         ON CONFLICT DO NOTHING"
            .to_owned(),
    ];
    for (case, origin, change, reason) in cases {
        let p = propose_on(
            &w.agent,
            &t,
            json!({"channel": "ops", "text": case}),
            origin,
        )
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(
            tamper(&w.superuser, &change, &[&t, &p.id]).await >= 1,
            "{case}"
        );
        let (status, result) = approve_on(&human, p.id, &p.token, None).await.unwrap();
        assert_eq!(status, "invalidated", "{case}");
        assert_eq!(result.unwrap()["reason"], json!(reason), "{case}");
        for sql in &put_back {
            tamper(&w.superuser, sql, &[&t, &p.id]).await;
        }
        w.grant(&who, &t).await;
    }
    // Everything put back, the same tool approves.
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "after"}))
        .await
        .unwrap();
    assert_eq!(
        approve_on(&human, p.id, &p.token, None).await.unwrap().0,
        "queued"
    );
}
