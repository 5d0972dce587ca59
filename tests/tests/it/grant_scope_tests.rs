//! docs/sql-api.md, "Scoped grants and standing approvals": a grant's scope,
//! valid_until and max_uses bound what its principal may propose, and a
//! grant that ends invalidates what was proposed under it, as a revoke does.

use std::time::{Duration, SystemTime};

use keyturn_tests::*;
use serde_json::{json, Value};

/// An external tool with params of every kind a constraint applies to.
async fn any_tool(w: &World, extra: Value) -> String {
    let mut spec = json!({
        "executor": "external",
        "provider": "webhook",
        "effect": "reversible",
        "summary": "Notify {channel}",
        "params_schema": {
            "type": "object",
            "properties": {
                "channel": {"type": "string"},
                "text": {"type": "string"},
                "count": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "meta": {"type": "object", "properties": {"level": {"type": "number"}}}
            },
            "required": ["channel"]
        }
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    w.tool("scoped", spec).await
}

async fn actions_of(w: &World, tool: &str) -> i64 {
    count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.action WHERE tenant = $1 AND tool = $2",
        &[&w.tenant, &tool],
    )
    .await
}

/// The grant's (scope, valid_until is set, max_uses, uses), read as
/// superuser: the uses its proposer's row counted against this grant (none
/// before the pair's first proposal makes the row; a row that counted an
/// earlier grant of the pair counts none of this one's).
async fn grant_row(w: &World, tool: &str) -> (Option<Value>, bool, Option<i32>, i32) {
    let r = w
        .superuser
        .query_one(
            "SELECT g.scope, g.valid_until IS NOT NULL, g.max_uses, \
                    CASE WHEN u.granted_at = g.granted_at THEN u.uses ELSE 0 END \
               FROM keyturn.tool_grant g LEFT JOIN keyturn.grant_use u USING (tenant, principal, tool) \
              WHERE g.tenant = $1 AND g.principal = $2 AND g.tool = $3",
            &[&w.tenant, &w.principal, &tool],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// Every constraint kind, once inside and once outside: the call inside is a
/// proposal, the call outside is 42501 naming the path that failed, and
/// leaves no action behind.
#[tokio::test]
async fn test_each_constraint_allows_inside_and_refuses_outside_naming_the_path() {
    let w = World::new("member").await;
    let t = any_tool(&w, json!({})).await;
    let cases: Vec<(&str, Value, Value, Value, &str)> = vec![
        (
            "eq",
            json!({"channel": {"eq": "ops"}}),
            json!({"channel": "ops"}),
            json!({"channel": "sales"}),
            "params.channel",
        ),
        (
            "in, scalar",
            json!({"channel": {"in": ["ops", "dev"]}}),
            json!({"channel": "dev"}),
            json!({"channel": "sales"}),
            "params.channel",
        ),
        (
            "in, every element of an array",
            json!({"tags": {"in": ["a", "b"]}}),
            json!({"channel": "c", "tags": ["a", "b", "a"]}),
            json!({"channel": "c", "tags": ["a", "z"]}),
            "params.tags: element 1",
        ),
        (
            "min",
            json!({"count": {"min": 2}}),
            json!({"channel": "c", "count": 2}),
            json!({"channel": "c", "count": 1.5}),
            "params.count",
        ),
        (
            "max",
            json!({"count": {"max": 5}}),
            json!({"channel": "c", "count": 5}),
            json!({"channel": "c", "count": 6}),
            "params.count",
        ),
        (
            "max_length counts characters, not bytes",
            json!({"text": {"max_length": 3}}),
            json!({"channel": "c", "text": "äöü"}),
            json!({"channel": "c", "text": "abcd"}),
            "params.text",
        ),
        (
            "max_length of an array",
            json!({"tags": {"max_length": 2}}),
            json!({"channel": "c", "tags": ["a", "b"]}),
            json!({"channel": "c", "tags": ["a", "b", "c"]}),
            "params.tags",
        ),
        (
            "a dotted path",
            json!({"meta.level": {"eq": 1}}),
            json!({"channel": "c", "meta": {"level": 1}}),
            json!({"channel": "c", "meta": {"level": 2}}),
            "params.meta.level",
        ),
        (
            "a path absent from params",
            json!({"count": {"min": 0}}),
            json!({"channel": "c", "count": 0}),
            json!({"channel": "c"}),
            "params.count: is missing",
        ),
    ];
    for (what, scope, inside, outside, path) in cases {
        assert!(
            w.grant_with(&w.principal, &t, Some(json!({"params": scope})), None, None)
                .await
                .unwrap(),
            "{what}: a new scope is a change"
        );
        let before = actions_of(&w, &t).await;
        let refused = w.propose(&t, outside.clone()).await;
        let msg = message(w.propose(&t, outside).await);
        assert_eq!(sqlstate(refused), "42501", "{what}");
        assert!(
            msg.contains(path) && msg.contains("outside the scope"),
            "{what}: the message names {path}: {msg}"
        );
        assert_eq!(actions_of(&w, &t).await, before, "{what}: nothing stored");
        let p = propose_full(&w.agent, &t, inside, json!({}))
            .await
            .unwrap_or_else(|e| panic!("{what}: inside the scope: {e}"));
        assert_eq!(p.status, "pending", "{what}");
    }
}

/// For an sql tool the scope sees the form (`where.id`, `set.stage`) and
/// the number of rows it resolves to. A form value may be a number or a
/// string (the column's type reads both), which the scope tells apart.
#[tokio::test]
async fn test_sql_scope_checks_the_form_and_the_resolved_target_count() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 3).await;
    w.grant_with(
        &w.principal,
        &t,
        Some(json!({"params": {"where.id": {"in": [deals[0], deals[1]]}, "set.stage": {"in": ["won", "lost"]}},
                    "max_targets": 1})),
        None,
        None,
    )
    .await
    .unwrap();
    let form = |ids: Value, stage: &str| json!({"where": {"id": ids}, "set": {"stage": stage}});
    let outside = [
        (form(json!([deals[0], deals[2]]), "won"), "params.where.id"),
        (form(json!(deals[1]), "qualified"), "params.set.stage"),
        (form(json!([deals[0], deals[1]]), "won"), "max_targets"),
        (form(json!(deals[0].to_string()), "won"), "params.where.id"),
    ];
    for (params, path) in outside {
        let r = w.propose(&t, params.clone()).await;
        let msg = message(w.propose(&t, params).await);
        assert_eq!(sqlstate(r), "42501", "{path}");
        assert!(msg.contains(path), "names {path}: {msg}");
    }
    let p = w
        .propose(&t, form(json!([deals[1]]), "lost"))
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    assert_eq!(w.stage_of(deals[1]).await, "lost");
    for d in [deals[0], deals[2]] {
        assert_eq!(w.writes(d).await, 0);
    }

    // And the other way round: a string in the scope is not a number.
    w.grant_with(
        &w.principal,
        &t,
        Some(json!({"params": {"set.amount": {"in": ["100"]}}})),
        None,
        None,
    )
    .await
    .unwrap();
    let amount = |v: Value| json!({"where": {"id": deals[2]}, "set": {"amount": v}});
    let msg = message(w.propose(&t, amount(json!(100))).await);
    assert!(msg.contains("params.set.amount"), "{msg}");
    let p = w.propose(&t, amount(json!("100"))).await.unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    assert_eq!(w.writes(deals[2]).await, 1);
}

/// A malformed scope is 22023 and leaves the grant as it was.
#[tokio::test]
async fn test_malformed_scope_is_22023_and_changes_nothing() {
    let w = World::new("member").await;
    let t = any_tool(&w, json!({})).await;
    let scope = json!({"params": {"channel": {"eq": "ops"}}});
    w.grant_with(&w.principal, &t, Some(scope.clone()), None, None)
        .await
        .unwrap();
    let epoch = w.epoch(&w.principal).await;
    for bad in [
        json!([]),
        json!({"param": {}}),
        json!({"params": {"channel": {"equals": "ops"}}}),
        json!({"params": {"channel": {}}}),
        json!({"params": {"channel": {"in": []}}}),
        json!({"params": {"channel": {"min": "a"}}}),
        json!({"params": {"*": {"eq": 1}}}),
        json!({"params": {"a..b": {"eq": 1}}}),
        json!({"params": []}),
        json!({"max_targets": 0}),
        json!({"max_targets": "1"}),
    ] {
        assert_eq!(
            sqlstate(
                w.grant_with(&w.principal, &t, Some(bad.clone()), None, None)
                    .await
            ),
            "22023",
            "{bad}"
        );
    }
    assert_eq!(
        sqlstate(w.grant_with(&w.principal, &t, None, None, Some(0)).await),
        "22023",
        "max_uses 0"
    );
    assert_eq!(w.epoch(&w.principal).await, epoch);
    assert_eq!(grant_row(&w, &t).await.0, Some(scope));
}

#[tokio::test]
async fn test_grant_past_valid_until_refuses_propose() {
    let w = World::new("member").await;
    let t = any_tool(&w, json!({})).await;
    let until = SystemTime::now() + Duration::from_secs(3600);
    w.grant_with(&w.principal, &t, None, Some(until), None)
        .await
        .unwrap();
    w.propose(&t, json!({"channel": "c"})).await.unwrap();
    // Time passing is not a grant change: moved by hand, no epoch bump.
    tamper(
        &w.superuser,
        "UPDATE keyturn.tool_grant SET valid_until = clock_timestamp() - interval '1 second' \
          WHERE tenant = $1 AND tool = $2",
        &[&w.tenant, &t],
    )
    .await;
    let r = w.propose(&t, json!({"channel": "c"})).await;
    let msg = message(w.propose(&t, json!({"channel": "c"})).await);
    assert_eq!(sqlstate(r), "42501");
    assert!(msg.contains("ended at"), "{msg}");
    assert_eq!(actions_of(&w, &t).await, 1);
}

/// At approve: with an independent approver (whose own grant is fine) the
/// proposal is invalidated; a self approval is refused before the claim, as
/// after a revoke, since the approving principal's own grant has ended too.
#[tokio::test]
async fn test_grant_past_valid_until_at_approve_invalidates() {
    let w = World::new("member").await;
    let t = any_tool(&w, json!({"approval": "independent"})).await;
    let (approver, human2) = w.other("approver", "app_human", "s-approver").await;
    w.grant(&approver, &t).await;
    w.grant_with(
        &w.principal,
        &t,
        None,
        Some(SystemTime::now() + Duration::from_secs(3600)),
        None,
    )
    .await
    .unwrap();
    let p = w.propose(&t, json!({"channel": "c"})).await.unwrap();
    tamper(
        &w.superuser,
        "UPDATE keyturn.tool_grant SET valid_until = clock_timestamp() - interval '1 second' \
          WHERE tenant = $1 AND principal = $2 AND tool = $3",
        &[&w.tenant, &w.principal, &t],
    )
    .await;
    let (status, result) = approve_on(&human2, p.id, &p.token, None).await.unwrap();
    assert_eq!(status, "invalidated");
    let reason = result.unwrap()["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("no longer holds a grant"), "{reason}");

    let s = any_tool(&w, json!({})).await;
    w.grant_with(
        &w.principal,
        &s,
        None,
        Some(SystemTime::now() + Duration::from_secs(3600)),
        None,
    )
    .await
    .unwrap();
    let own = w.propose(&s, json!({"channel": "c"})).await.unwrap();
    tamper(
        &w.superuser,
        "UPDATE keyturn.tool_grant SET valid_until = clock_timestamp() - interval '1 second' \
          WHERE tenant = $1 AND principal = $2 AND tool = $3",
        &[&w.tenant, &w.principal, &s],
    )
    .await;
    assert_eq!(sqlstate(w.approve(&own).await), "42501");
    assert_eq!(w.status(own.id).await, "pending");
}

#[tokio::test]
async fn test_grant_past_valid_until_at_begin_dispatch_invalidates() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = any_tool(&w, json!({})).await;
    w.grant_with(
        &w.principal,
        &t,
        None,
        Some(SystemTime::now() + Duration::from_secs(3600)),
        None,
    )
    .await
    .unwrap();
    let p = w.propose(&t, json!({"channel": "c"})).await.unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &[p.id], "30 seconds").await.remove(0);
    tamper(
        &w.superuser,
        "UPDATE keyturn.tool_grant SET valid_until = clock_timestamp() - interval '1 second' \
          WHERE tenant = $1 AND tool = $2",
        &[&w.tenant, &t],
    )
    .await;
    assert!(!begin(&d, &l).await.unwrap(), "do not call the provider");
    assert_eq!(w.status(p.id).await, "invalidated");
    assert_eq!(attempts(&w, p.id).await, 0);
}

/// max_uses counts proposals: the (n+1)th is 42501; a refused proposal
/// uses nothing; a new grant call with other terms starts the count again.
#[tokio::test]
async fn test_max_uses_spent_refuses_the_next_proposal() {
    let w = World::new("member").await;
    let t = any_tool(&w, json!({})).await;
    w.grant_with(
        &w.principal,
        &t,
        Some(json!({"params": {"channel": {"eq": "ops"}}})),
        None,
        Some(2),
    )
    .await
    .unwrap();
    assert_eq!(
        sqlstate(w.propose(&t, json!({"channel": "sales"})).await),
        "42501"
    );
    assert_eq!(grant_row(&w, &t).await.3, 0, "a refused call uses nothing");
    for _ in 0..2 {
        w.propose(&t, json!({"channel": "ops"})).await.unwrap();
    }
    assert_eq!(grant_row(&w, &t).await.3, 2);
    let r = w.propose(&t, json!({"channel": "ops"})).await;
    let msg = message(w.propose(&t, json!({"channel": "ops"})).await);
    assert_eq!(sqlstate(r), "42501");
    assert!(msg.contains("all used"), "{msg}");
    assert_eq!(actions_of(&w, &t).await, 2);

    assert!(w
        .grant_with(
            &w.principal,
            &t,
            Some(json!({"params": {"channel": {"eq": "ops"}}})),
            None,
            Some(3)
        )
        .await
        .unwrap());
    assert_eq!(grant_row(&w, &t).await.3, 0);
    w.propose(&t, json!({"channel": "ops"})).await.unwrap();
    assert_eq!(grant_row(&w, &t).await.3, 1);

    // A grant restored without its proposer's row (keyturn.grant_use): the
    // next proposal makes it and counts from there.
    w.superuser
        .execute(
            "DELETE FROM keyturn.grant_use WHERE tenant = $1 AND principal = $2 AND tool = $3",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    w.propose(&t, json!({"channel": "ops"})).await.unwrap();
    assert_eq!(grant_row(&w, &t).await.3, 1);
}

/// The three-argument call is a grant with no scope and no limit, also over
/// a grant that had them.
#[tokio::test]
async fn test_three_argument_grant_has_no_scope_and_no_limit() {
    let w = World::new("member").await;
    let t = any_tool(&w, json!({})).await; // granted with three arguments
    assert_eq!(grant_row(&w, &t).await, (None, false, None, 0));
    for i in 0..5 {
        w.propose(&t, json!({"channel": format!("c{i}"), "count": i}))
            .await
            .unwrap();
    }
    w.grant_with(
        &w.principal,
        &t,
        Some(json!({"params": {"channel": {"eq": "ops"}}})),
        Some(SystemTime::now() + Duration::from_secs(60)),
        Some(1),
    )
    .await
    .unwrap();
    let epoch = w.epoch(&w.principal).await;
    let widened: bool = w
        .admin
        .query_one(
            "SELECT keyturn.grant_tool($1, $2, $3)",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap()
        .get(0);
    assert!(widened);
    assert_eq!(w.epoch(&w.principal).await, epoch + 1);
    assert_eq!(grant_row(&w, &t).await, (None, false, None, 0));
    for _ in 0..3 {
        w.propose(&t, json!({"channel": "anything"})).await.unwrap();
    }
}

/// Calling grant_tool again with the same terms (written differently) changes
/// nothing: false, the epoch and the use count stay, a pending proposal
/// still runs.
#[tokio::test]
async fn test_unchanged_grant_call_changes_nothing() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let until = SystemTime::now() + Duration::from_secs(3600);
    w.grant_with(
        &w.principal,
        &t,
        Some(json!({"params": {"set.stage": {"in": ["won", "lost"]}}, "max_targets": 1})),
        Some(until),
        Some(5),
    )
    .await
    .unwrap();
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    let epoch = w.epoch(&w.principal).await;
    let again = w
        .grant_with(
            &w.principal,
            &t,
            Some(json!({"max_targets": 1.0, "params": {"set.stage": {"in": ["won", "lost"]}}})),
            Some(until),
            Some(5),
        )
        .await
        .unwrap();
    assert!(!again, "the same terms are no change");
    assert_eq!(w.epoch(&w.principal).await, epoch);
    assert_eq!(grant_row(&w, &t).await.3, 1, "the count is kept");
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    assert_eq!(w.stage_of(deal).await, "won");
}

/// A grant's scope, valid_until and max_uses.
type Terms = (Option<Value>, Option<SystemTime>, Option<i32>);

/// Any real change of the terms bumps the epoch, so what was proposed under
/// the old terms is invalidated at approve.
#[tokio::test]
async fn test_changed_terms_bump_the_epoch_and_invalidate_pending_proposals() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deals = w.deals(&w.principal, 3).await;
    let scope = json!({"params": {"set.stage": {"eq": "won"}}});
    let until = SystemTime::now() + Duration::from_secs(3600);
    w.grant_with(&w.principal, &t, Some(scope.clone()), Some(until), Some(10))
        .await
        .unwrap();
    let wider = || Some(json!({"params": {"set.stage": {"in": ["won", "lost"]}}}));
    let later = until + Duration::from_secs(60);
    let changes: Vec<(&str, Terms)> = vec![
        ("scope", (wider(), Some(until), Some(10))),
        ("valid_until", (wider(), Some(later), Some(10))),
        ("max_uses", (wider(), Some(later), Some(11))),
    ];
    for ((what, (scope, until, max_uses)), deal) in changes.into_iter().zip(deals) {
        let p = w
            .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
            .await
            .unwrap();
        let epoch = w.epoch(&w.principal).await;
        assert!(
            w.grant_with(&w.principal, &t, scope, until, max_uses)
                .await
                .unwrap(),
            "{what}"
        );
        assert_eq!(w.epoch(&w.principal).await, epoch + 1, "{what}");
        let (status, result) = w.approve(&p).await.unwrap();
        assert_eq!(status, "invalidated", "{what}");
        assert!(
            result.unwrap()["reason"]
                .as_str()
                .unwrap()
                .contains("authorization"),
            "{what}"
        );
        assert_eq!(w.writes(deal).await, 0, "{what}");
    }
}

/// A call that gives new terms starts the use count at zero, also in the
/// transaction of the earlier grant and its proposals (whose `now()` stands
/// still: an earlier 0.3.0 build named the terms by it, and kept counting).
/// Admin and agent in one transaction, as a SQL test suite runs them.
#[tokio::test]
async fn test_new_terms_count_from_zero_within_one_transaction() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let su = connect("postgres").await;
    let grant = |terms: &str| {
        format!(
            "RESET ROLE; SET LOCAL ROLE app_admin; \
             SELECT keyturn.grant_tool('{}', '{}', '{t}', {terms}); \
             RESET ROLE; SET LOCAL ROLE app_agent; \
             SELECT set_config('keyturn.tenant', '{}', true), set_config('keyturn.principal', '{}', true), \
                    set_config('keyturn.session', '{}', true);",
            w.tenant, w.principal, w.tenant, w.principal, w.session
        )
    };
    let propose = "SELECT status FROM keyturn.propose($1, $2)";
    su.batch_execute("BEGIN").await.unwrap();
    su.batch_execute(&grant("NULL, NULL, 1")).await.unwrap();
    su.query_one(propose, &[&t, &json!({"channel": "a", "text": "1"})])
        .await
        .unwrap();
    su.batch_execute("SAVEPOINT used").await.unwrap();
    let spent = su
        .query_one(propose, &[&t, &json!({"channel": "a", "text": "2"})])
        .await;
    assert_eq!(sqlstate(spent), "42501");
    su.batch_execute("ROLLBACK TO SAVEPOINT used")
        .await
        .unwrap();
    su.batch_execute(&grant("NULL, now() + interval '1 day', 1"))
        .await
        .unwrap();
    su.query_one(propose, &[&t, &json!({"channel": "a", "text": "3"})])
        .await
        .expect("new terms count from zero");
    su.batch_execute("ROLLBACK").await.unwrap();
}
