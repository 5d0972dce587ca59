//! End to end, `/rpc`: the real keyturnd with a JWT key, on the NOINHERIT
//! authenticator login, against the real database. Named arguments with
//! defaults, set-returning and scalar answers, the database's refusals as
//! HTTP statuses with PostgREST's error shape, the role allowlist checked
//! at start, and no token or JWT in keyturnd's log.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::e2e::{self, Keyturnd, World};
use crate::support::web::{self, post_rpc};

async fn start(w: &World) -> Keyturnd {
    web::authenticator(&w.superuser).await;
    Keyturnd::start(w.port, web::rpc_env(w.port)).await
}

#[tokio::test]
async fn test_rpc_runs_a_persons_calls_with_named_arguments() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let k = start(&w).await;
    let jwt = w.human_jwt();
    let p = w.propose(&tool, json!({"text": "hello over http"})).await;
    let id = p.id.to_string();

    // preview returns jsonb: the answer is the value itself.
    let (status, headers, card) = post_rpc(
        &k.base,
        "preview",
        Some(&jwt),
        &json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(status, 200, "{card}");
    assert!(
        card["summary"]
            .as_str()
            .unwrap_or("")
            .contains("hello over http"),
        "{card}"
    );
    assert_eq!(card["status"], "pending");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(headers["x-content-type-options"], "nosniff");

    // action_status returns a table: an array of row objects.
    let (status, _, rows) = post_rpc(
        &k.base,
        "action_status",
        Some(&jwt),
        &json!({"action_id": id}),
    )
    .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["status"], "pending");

    // approve without params: the SQL default (NULL) applies.
    let (status, _, rows) = post_rpc(
        &k.base,
        "approve",
        Some(&jwt),
        &json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(
        rows,
        json!([{"action_id": id, "status": "queued", "result": null}])
    );
    // A replay answers the stored outcome.
    let (_, _, again) = post_rpc(
        &k.base,
        "approve",
        Some(&jwt),
        &json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(again[0]["status"], "queued");

    // A jsonb argument takes the JSON value: the params resubmitted match.
    let r = w.propose(&tool, json!({"text": "resubmitted"})).await;
    let (status, _, rows) = post_rpc(
        &k.base,
        "approve",
        Some(&jwt),
        &json!({"action_id": r.id.to_string(), "token": r.token, "params": {"text": "resubmitted"}}),
    )
    .await;
    assert_eq!(
        (status, rows[0]["status"].as_str()),
        (200, Some("queued")),
        "{rows}"
    );
    // JSON null is SQL NULL (the default), not the JSON value null.
    let s = w.propose(&tool, json!({"text": "null params"})).await;
    let (_, _, rows) = post_rpc(
        &k.base,
        "approve",
        Some(&jwt),
        &json!({"action_id": s.id.to_string(), "token": s.token, "params": null}),
    )
    .await;
    assert_eq!(rows[0]["status"], "queued", "{rows}");

    // reject returns text: a JSON string.
    let q = w.propose(&tool, json!({"text": "no thanks"})).await;
    let (status, _, answer) = post_rpc(
        &k.base,
        "reject",
        Some(&jwt),
        &json!({"action_id": q.id.to_string(), "token": q.token, "reason": "not today"}),
    )
    .await;
    assert_eq!((status, answer), (200, json!("rejected")));
    assert_eq!(w.status(q.id).await, "rejected");

    // The audit shows the approval as the JWT's role, for the JWT's principal.
    let (_, _, events) = post_rpc(&k.base, "audit", Some(&jwt), &json!({"action_id": id})).await;
    let queued = events
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["to_status"] == "queued")
        .cloned()
        .expect("a queued event");
    assert_eq!(queued["db_role"], "app_human");
    assert_eq!(queued["principal"], Value::String(w.principal.clone()));

    let log = k.stop().await;
    assert!(log.contains("serving /rpc"), "{log}");
    assert_no_secret(&log, &[&jwt, &p.token, &q.token]);
}

#[tokio::test]
async fn test_the_databases_refusals_answer_postgrests_shape() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let k = start(&w).await;
    let jwt = w.human_jwt();
    let p = w.propose(&tool, json!({"text": "refusals"})).await;
    let id = p.id.to_string();
    let call = |f: &'static str, jwt: String, body: Value| {
        let base = k.base.clone();
        async move {
            let (status, _, body) = post_rpc(&base, f, Some(&jwt), &body).await;
            (status, body)
        }
    };

    // 55000, a wrong token: 409, and the proposal is not used up.
    let (status, body) = call(
        "approve",
        jwt.clone(),
        json!({"action_id": id, "token": "wrong"}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "55000");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("wrong token"),
        "{body}"
    );
    assert!(
        body.get("details").is_some() && body.get("hint").is_some(),
        "PostgREST's four keys: {body}"
    );
    assert_eq!(w.status(p.id).await, "pending");

    // A NUL character (U+0000) anywhere in the body: 400 before the
    // database sees it, whose jsonb error would quote the values into its
    // log (docs/security.md, row 85). The proposal is untouched.
    let (status, body) = call(
        "approve",
        jwt.clone(),
        json!({"action_id": id, "token": p.token, "params": {"text": "pin\u{0}"}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("PGRST102")),
        "{body}"
    );
    assert_eq!(w.status(p.id).await, "pending");

    // 22P02, not a uuid: 400.
    let (status, body) = call(
        "preview",
        jwt.clone(),
        json!({"action_id": "not-a-uuid", "token": "x"}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("22P02")),
        "{body}"
    );
    // A value no uuid, interval or status could be: 400 before the
    // database, whose refusal quoted it whole into its log (thirty-first
    // red-team pass, docs/security.md row 141); neither answer nor log
    // carries it.
    let forged = format!("\u{1b}[2J\n2026-12-07 LOG:  forged{}", "x".repeat(100_000));
    let operator = web::jwt(json!({"role": "app_operator", "sub": "op", "exp": web::now() + 60}));
    for (f, jwt, body, code) in [
        (
            "preview",
            &jwt,
            json!({"action_id": forged, "token": "x"}),
            "22P02",
        ),
        // An object or an array is cast as its JSON text (thirty-second pass).
        (
            "preview",
            &jwt,
            json!({"action_id": {"x": forged}, "token": "x"}),
            "22P02",
        ),
        (
            "preview",
            &jwt,
            json!({"action_id": [forged], "token": "x"}),
            "22P02",
        ),
        (
            "link_code",
            &jwt,
            json!({"action_ids": [{"x": forged}]}),
            "22P02",
        ),
        (
            "delegate",
            &jwt,
            json!({"tool": tool, "scope": {}, "max_uses": 1, "valid_for": forged}),
            "22P02",
        ),
        // A text argument: the database's refusal names it, as one short line.
        (
            "find_actions",
            &operator,
            json!({"status": forged}),
            "22023",
        ),
    ] {
        let (status, answer) = call(f, jwt.clone(), body).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some(code)),
            "{f}: {answer:.300}"
        );
        let message = answer["message"].as_str().unwrap_or("");
        assert!(
            !message.chars().any(char::is_control) && message.len() < 300,
            "{f}: {message:.300}"
        );
    }

    // 42501, no identity in the claims: 403.
    let anonymous = web::jwt(json!({"role": "app_human", "exp": web::now() + 60}));
    let (status, body) = call(
        "preview",
        anonymous,
        json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("42501")),
        "{body}"
    );

    // Another tenant's person does not see the action: 409, nothing shown.
    let other = World::new(port).await;
    let (status, body) = call(
        "preview",
        other.human_jwt(),
        json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.get("summary").is_none());

    // 42501 by role: a person may not reconcile.
    let (status, body) = call(
        "reconcile",
        jwt.clone(),
        json!({"action_id": id, "outcome": "succeeded", "note": "x"}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("42501")),
        "{body}"
    );

    // Not exposed, or not taking these arguments: 404 PGRST202, never run.
    for (f, body) in [
        (
            "propose",
            json!({"tool": tool, "params": {"text": "sneaky"}}),
        ),
        ("lease", json!({"worker": "w"})),
        (
            "preview",
            json!({"action_id": id, "token": p.token, "extra": 1}),
        ),
        ("approve", json!({"token": p.token})),
    ] {
        let (status, answer) = call(f, jwt.clone(), body).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (404, Some("PGRST202")),
            "{f}: {answer}"
        );
    }
    let proposals: i64 = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.action WHERE tenant = $1",
            &[&w.tenant],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(proposals, 1, "propose over /rpc never ran");

    // The JWT's role decides the database role: an agent's is refused
    // before the database is asked, an expired one likewise.
    let (status, body) = call(
        "preview",
        w.jwt_as("app_agent", web::now() + 60),
        json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = call(
        "preview",
        w.jwt_as("app_human", web::now() - 120),
        json!({"action_id": id, "token": p.token}),
    )
    .await;
    assert_eq!(status, 401);

    // The operator's calls, as the operator role.
    let operator = web::jwt(json!({"role": "app_operator", "sub": "op", "exp": web::now() + 60}));
    let (status, body) = call("uncertain_actions", operator, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.is_array());

    // Too large a body: 413 before anything else.
    let big = json!({"action_id": id, "token": "x".repeat(2 << 20)});
    let (status, _) = call("preview", jwt.clone(), big).await;
    assert_eq!(status, 413);

    let log = k.stop().await;
    assert_no_secret(&log, &[&jwt, &p.token]);
}

#[tokio::test]
async fn test_keyturnd_refuses_roles_that_propose_or_that_it_cannot_become() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    web::authenticator(&w.superuser).await;
    for (roles, url_role, needle) in [
        (
            "app_human,app_agent",
            web::AUTHENTICATOR,
            "is a member of keyturn_agent",
        ),
        ("app_human,app_admin", web::AUTHENTICATOR, "cannot SET ROLE"),
        (
            "app_human,no_such_role",
            web::AUTHENTICATOR,
            "does not exist",
        ),
        ("app_human", "app_agent", "keyturn_agent's privileges"),
    ] {
        let mut env = web::rpc_env(port);
        env.push(("KEYTURN_JWT_ROLES", roles.into()));
        env.push(("KEYTURN_RPC_DATABASE_URL", e2e::url(port, url_role)));
        let mut k = Keyturnd::spawn(port, env);
        let status = k.wait_exit(Duration::from_secs(20)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = k.log();
        assert!(
            !status.success(),
            "{roles} as {url_role} must not start:\n{log}"
        );
        assert!(
            log.contains(needle),
            "{roles} as {url_role}: expected `{needle}` in:\n{log}"
        );
    }
}

/// No token or JWT ever reaches keyturnd's log, and no request carried a
/// query string.
pub fn assert_no_secret(log: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!secret.is_empty());
        assert!(
            !log.contains(secret),
            "a token or JWT leaked into keyturnd's log:\n{log}"
        );
    }
    assert!(
        !log.contains("has_query=true"),
        "a request carried a query string:\n{log}"
    );
    assert!(
        log.contains("path=\"/rpc/") || log.contains("path=/rpc/"),
        "the request log ran at debug:\n{log}"
    );
}
