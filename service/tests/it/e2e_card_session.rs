//! End to end, card links: a link's one-time code redeemed at
//! `POST /card/session` for a card session that may preview and decide the
//! link's actions and nothing else. The code works once; a used, unknown or
//! expired code, or another list of actions, gets 401 and burns nothing; a
//! session's bearer is refused for other functions and other actions (403)
//! and after it ends (401); neither the code nor the session reaches the log.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::e2e_rpc::assert_no_secret;
use crate::support::e2e::{self, Keyturnd, World};
use crate::support::web::{self, post_json, post_rpc, Proposal};

async fn start(w: &World) -> Keyturnd {
    web::authenticator(&w.superuser).await;
    Keyturnd::start(w.port, web::rpc_env(w.port)).await
}

/// A one-time code for `ids`, made by this world's person (app_human).
async fn link_code(w: &World, ids: &[Uuid]) -> String {
    w.as_identity(
        &w.human,
        "SELECT keyturn.link_code($1::uuid[])",
        &[&ids.to_vec()],
    )
    .await
    .expect("link_code")
    .get(0)
}

async fn redeem(k: &Keyturnd, code: &str, ids: &[Uuid]) -> (u16, Value) {
    let (status, headers, body) = post_json(
        &format!("{}/card/session", k.base),
        None,
        &json!({"code": code, "action_ids": ids}),
    )
    .await;
    assert_eq!(headers["cache-control"], "no-store", "{body}");
    (status, body)
}

#[tokio::test]
async fn test_a_links_code_is_a_card_session_for_its_actions_once() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let k = start(&w).await;
    let p: Proposal = w.propose(&tool, json!({"text": "by link"})).await;
    let q: Proposal = w.propose(&tool, json!({"text": "not in the link"})).await;
    let code = link_code(&w, &[p.id]).await;

    // Other actions than the code's: 401, and the code still works.
    let (status, body) = redeem(&k, &code, &[p.id, q.id]).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = redeem(&k, "kt_not-a-code-anyone-made", &[p.id]).await;
    assert_eq!(status, 401, "{body}");

    let (status, session) = redeem(&k, &code, &[p.id]).await;
    assert_eq!(status, 200, "{session}");
    let bearer = session["session"].as_str().expect("session").to_string();
    assert!(bearer.starts_with("kts_"), "{session}");
    let token = session["tokens"][p.id.to_string()]
        .as_str()
        .expect("a token for the link's action")
        .to_string();
    assert_ne!(token, p.token, "a fresh token, not the proposal's");
    assert_eq!(session["tokens"].as_object().map(|o| o.len()), Some(1));

    // The code worked once.
    let (status, body) = redeem(&k, &code, &[p.id]).await;
    assert_eq!(status, 401, "{body}");

    // The session previews and approves its action…
    let id = p.id.to_string();
    let (status, _, card) = post_rpc(
        &k.base,
        "preview",
        Some(&bearer),
        &json!({"action_id": id, "token": token}),
    )
    .await;
    assert_eq!(status, 200, "{card}");
    assert!(card["summary"].as_str().unwrap_or("").contains("by link"));

    // …but nothing else: another function, another action.
    let (status, _, body) = post_rpc(
        &k.base,
        "action_status",
        Some(&bearer),
        &json!({"action_id": id}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = post_rpc(
        &k.base,
        "approve",
        Some(&bearer),
        &json!({"action_id": q.id.to_string(), "token": q.token}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(w.status(q.id).await, "pending");
    let (status, _, body) = post_rpc(&k.base, "approve", Some(&bearer), &json!({})).await;
    assert_eq!(status, 403, "{body}");

    let (status, _, rows) = post_rpc(
        &k.base,
        "approve",
        Some(&bearer),
        &json!({"action_id": id, "token": token}),
    )
    .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows[0]["status"], "queued", "{rows}");
    // As the person the code was made for.
    let approver: String = w
        .superuser
        .query_one(
            "SELECT approved_by FROM keyturn.action WHERE id = $1",
            &[&p.id],
        )
        .await
        .expect("approved_by")
        .get(0);
    assert_eq!(approver, w.principal);

    // A session that has ended: 401.
    w.superuser
        .execute(
            "UPDATE keyturn.card_link SET session_expires_at = now() - interval '1 second' \
              WHERE $1 = ANY (action_ids)",
            &[&p.id],
        )
        .await
        .expect("end the session");
    let (status, _, body) = post_rpc(
        &k.base,
        "preview",
        Some(&bearer),
        &json!({"action_id": id, "token": token}),
    )
    .await;
    assert_eq!(status, 401, "{body}");

    // An expired code: 401.
    let r: Proposal = w.propose(&tool, json!({"text": "late"})).await;
    let late = link_code(&w, &[r.id]).await;
    w.superuser
        .execute(
            "UPDATE keyturn.card_link SET expires_at = now() - interval '1 second' \
              WHERE $1 = ANY (action_ids)",
            &[&r.id],
        )
        .await
        .expect("expire the code");
    let (status, body) = redeem(&k, &late, &[r.id]).await;
    assert_eq!(status, 401, "{body}");

    // A body that is not a code: 400, saying what it must be.
    let (status, _, body) = post_json(
        &format!("{}/card/session", k.base),
        None,
        &json!({"code": 1}),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    assert_no_secret(&k.log(), &[&code, &late, &bearer, &token, &p.token]);
}

#[tokio::test]
async fn test_a_code_refused_for_its_role_is_not_used_up() {
    // Red-team pass: the code was redeemed (and so used up) before keyturnd
    // checked the role its session would run as; a refusal there (no
    // KEYTURN_CARD_ROLE, a role outside KEYTURN_JWT_ROLES) left the person
    // with a dead link.
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    web::authenticator(&w.superuser).await;
    let env = web::rpc_env(w.port)
        .into_iter()
        .map(|(k, v)| match k {
            "KEYTURN_JWT_ROLES" => (k, "app_operator".to_string()),
            _ => (k, v),
        })
        .collect();
    let k = Keyturnd::start(w.port, env).await;
    let p: Proposal = w.propose(&tool, json!({"text": "role refused"})).await;
    let code = link_code(&w, &[p.id]).await;
    let (status, body) = redeem(&k, &code, &[p.id]).await;
    assert_eq!(status, 403, "{body}");
    // The code is as it was: it redeems, once.
    let d = e2e::connect(port, "app_dispatcher").await;
    let redeem_sql = "SELECT db_role FROM keyturn.redeem_link_code($1, $2)";
    let ids = vec![p.id];
    let row = d
        .query_opt(redeem_sql, &[&code, &ids])
        .await
        .expect("redeem");
    assert!(row.is_some(), "the refused redemption used the code up");
    k.stop().await;
}

#[tokio::test]
async fn test_a_code_made_for_one_person_decides_nothing_another_may_not() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let k = start(&w).await;
    let p: Proposal = w.propose(&tool, json!({"text": "decided elsewhere"})).await;
    let code = link_code(&w, &[p.id]).await;
    // Decided before the link is opened: the session has no token for it.
    w.as_identity(
        &w.human,
        "SELECT keyturn.reject($1, $2, 'no')",
        &[&p.id, &p.token],
    )
    .await
    .expect("reject");
    let (status, session) = redeem(&k, &code, &[p.id]).await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["tokens"], json!({}), "{session}");
}

/// Red-team pass of 0.3.0 (docs/security.md, row 75): a link travels
/// through mail servers, a team's chat channel and push services, so its
/// holder may not be its person. A card session revised a self action to
/// params of its own choosing, then approved the revision in the same
/// session (the session went on with the revisions "the person" made), and
/// the revision's notification would have been a second link. A card
/// session may still revise its actions, but the revision is not the
/// session's, and no notification (no new link) is made for it: the person
/// decides it where they are signed in.
#[tokio::test]
async fn test_a_card_session_cannot_approve_a_revision_it_wrote() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let k = start(&w).await;
    w.as_identity(
        &w.human,
        "SELECT keyturn.set_notify('email', 'person@acme.example')::text",
        &[],
    )
    .await
    .expect("set_notify");
    let p: Proposal = w.propose(&tool, json!({"text": "draft"})).await;
    let code = link_code(&w, &[p.id]).await;
    let (status, session) = redeem(&k, &code, &[p.id]).await;
    assert_eq!(status, 200, "{session}");
    let bearer = session["session"].as_str().unwrap().to_string();
    let token = session["tokens"][p.id.to_string()].as_str().unwrap();

    let (status, _, rows) = post_rpc(
        &k.base,
        "revise",
        Some(&bearer),
        &json!({"action_id": p.id, "token": token, "params": {"text": "the link holder's own"}}),
    )
    .await;
    assert_eq!(status, 200, "a card session may revise its actions: {rows}");
    let revised: Uuid = rows[0]["action_id"].as_str().unwrap().parse().unwrap();
    let revised_token = rows[0]["token"].as_str().unwrap().to_string();
    for function in ["preview", "approve"] {
        let (status, _, body) = post_rpc(
            &k.base,
            function,
            Some(&bearer),
            &json!({"action_id": revised, "token": revised_token}),
        )
        .await;
        assert_eq!(
            status, 403,
            "{function} of the revision the session wrote: {body}"
        );
    }
    let status: String = w
        .superuser
        .query_one(
            "SELECT status::text FROM keyturn.action WHERE id = $1",
            &[&revised],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "pending");
    let notified: i64 = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.notification WHERE action_id = $1",
            &[&revised],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        notified, 0,
        "a notification would be a link to the revision"
    );

    // Where the person is signed in, the card says who may have written it.
    let card: serde_json::Value = w
        .as_identity(
            &w.human,
            "SELECT keyturn.preview($1, keyturn.issue_token($1))",
            &[&revised],
        )
        .await
        .expect("preview where signed in")
        .get(0);
    assert_eq!(card["revised_via"], "card_session", "{card}");

    // And the revision is theirs to approve.
    let approved: String = w
        .as_identity(
            &w.human,
            "SELECT status FROM keyturn.approve($1, keyturn.issue_token($1))",
            &[&revised],
        )
        .await
        .expect("approve where signed in")
        .get(0);
    assert_eq!(approved, "queued");

    // A revision made where the person is signed in is notified as before.
    let q: Proposal = w.propose(&tool, json!({"text": "draft two"})).await;
    let signed_in: Uuid = w
        .as_identity(
            &w.human,
            "SELECT action_id FROM keyturn.revise($1, $2, '{\"text\": \"edited\"}')",
            &[&q.id, &q.token],
        )
        .await
        .expect("revise where signed in")
        .get(0);
    let notified: i64 = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.notification WHERE action_id = $1",
            &[&signed_in],
        )
        .await
        .unwrap()
        .get(0);
    assert!(notified > 0, "a signed-in revision is notified");
    let card: serde_json::Value = w
        .as_identity(
            &w.human,
            "SELECT keyturn.preview($1, keyturn.issue_token($1))",
            &[&signed_in],
        )
        .await
        .expect("preview")
        .get(0);
    assert!(card.get("revised_via").is_none(), "{card}");
    // Its notifications are not for the next test's mail sink.
    w.as_identity(&w.human, "SELECT keyturn.remove_notify('email')", &[])
        .await
        .expect("remove_notify");

    // Nor is any other action.
    let q: Proposal = w.propose(&tool, json!({"text": "other"})).await;
    let (status, _, body) = post_rpc(
        &k.base,
        "preview",
        Some(&bearer),
        &json!({"action_id": q.id, "token": q.token}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
}

/// Red-team pass of 0.3.0: each card opened for an action takes a fresh
/// token, so a card opened earlier (another approver's, for a quorum, or
/// the same person's other device) held a dead token and could not vote:
/// its code was spent and its session could call nothing that makes a new
/// one. A session may now take a fresh token for its own actions, and no
/// other's, at POST /card/token (its /rpc is for preview, approve, reject
/// and revise alone).
#[tokio::test]
async fn test_a_card_whose_token_another_card_replaced_takes_a_fresh_one() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let k = start(&w).await;
    let p: Proposal = w.propose(&tool, json!({"text": "two cards"})).await;
    let q: Proposal = w.propose(&tool, json!({"text": "not this card's"})).await;
    let first_code = link_code(&w, &[p.id]).await;
    let second_code = link_code(&w, &[p.id]).await;
    let (_, first) = redeem(&k, &first_code, &[p.id]).await;
    let (_, second) = redeem(&k, &second_code, &[p.id]).await;
    let bearer = first["session"].as_str().expect("session").to_string();
    let stale = first["tokens"][p.id.to_string()]
        .as_str()
        .unwrap()
        .to_string();
    assert!(second["tokens"][p.id.to_string()].is_string(), "{second}");

    // The first card's token died when the second card opened.
    let (status, _, body) = post_rpc(
        &k.base,
        "approve",
        Some(&bearer),
        &json!({"action_id": p.id, "token": stale}),
    )
    .await;
    assert_eq!(body["code"], "55000", "{status} {body}");

    // Its session takes a fresh one at POST /card/token, for its own
    // action only; /rpc stays the session's four calls.
    let token_url = format!("{}/card/token", k.base);
    let (status, _, body) = post_json(&token_url, Some(&bearer), &json!({"action_id": q.id})).await;
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = post_rpc(
        &k.base,
        "issue_token",
        Some(&bearer),
        &json!({"action_id": p.id}),
    )
    .await;
    assert_eq!(status, 403, "not on /rpc: {body}");
    let jwt = w.human_jwt();
    let (status, _, body) = post_json(&token_url, Some(&jwt), &json!({"action_id": p.id})).await;
    assert_eq!(status, 401, "a card session's bearer only: {body}");
    let (status, headers, fresh) =
        post_json(&token_url, Some(&bearer), &json!({"action_id": p.id})).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(headers["cache-control"], "no-store");
    let fresh = fresh.as_str().expect("a token").to_string();
    assert_ne!(fresh, stale);
    let (status, _, rows) = post_rpc(
        &k.base,
        "approve",
        Some(&bearer),
        &json!({"action_id": p.id, "token": fresh}),
    )
    .await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows[0]["status"], "queued", "{rows}");
    assert_eq!(w.status(q.id).await, "pending");
}
