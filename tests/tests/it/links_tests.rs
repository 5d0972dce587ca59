//! docs/http.md, "Card links": no URL carries a credential. A link holds a
//! one-time code, made by keyturn.link_code for a person who may decide
//! every action it names, redeemed once by keyturnd
//! (keyturn.redeem_link_code) for a short card session with fresh tokens;
//! keyturn.issue_token gives a person a fresh token from the queue.

use keyturn_tests::*;
use serde_json::{json, Value};

async fn issue(c: &Conn, id: uuid::Uuid) -> Result<String, tokio_postgres::Error> {
    c.query_one("SELECT keyturn.issue_token($1)", &[&id])
        .await
        .map(|r| r.get(0))
}

async fn link_code(c: &impl Sql, ids: &[uuid::Uuid]) -> Result<String, tokio_postgres::Error> {
    c.query_one("SELECT keyturn.link_code($1)", &[&ids.to_vec()])
        .await
        .map(|r| r.get(0))
}

/// (session bearer, tokens by action id, db_role, claims), or None.
async fn redeem(
    d: &tokio_postgres::Client,
    code: &str,
    ids: &[uuid::Uuid],
) -> Option<(String, Value, Option<String>, Value)> {
    d.query_opt(
        "SELECT session, tokens, db_role, claims FROM keyturn.redeem_link_code($1, $2)",
        &[&code, &ids.to_vec()],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// The card session `code` opens for action `id` (redeemed as keyturnd
/// does), as keyturnd runs its calls: its card role (app_human here, for a
/// code the dispatcher made as for one the person made), the session's
/// claims; the fresh token it gives for `id`, and the role redemption names
/// (None: keyturnd's card role).
async fn card_session(code: &str, id: uuid::Uuid) -> (Conn, String, Option<String>) {
    let d = connect("app_dispatcher").await;
    let (_, tokens, role, claims) = redeem(&d, code, &[id])
        .await
        .expect("the code opens a session");
    let card = Conn::connect("app_human", Identity::claims(&claims.to_string())).await;
    let token = tokens[id.to_string()].as_str().expect("a token").to_owned();
    (card, token, role)
}

#[tokio::test]
async fn test_issue_token_gives_a_fresh_token_and_ends_the_old_one() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "hi"}))
        .await
        .unwrap();
    let fresh = issue(&w.human, p.id).await.unwrap();
    assert_ne!(fresh, p.token);
    assert_eq!(
        sqlstate(approve_on(&w.human, p.id, &p.token, None).await),
        "55000",
        "the token propose gave no longer works"
    );
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(
        approve_on(&w.human, p.id, &fresh, None).await.unwrap().0,
        "queued"
    );
    // Decided: nothing left to issue a token for.
    assert_eq!(sqlstate(issue(&w.human, p.id).await), "55000");
}

#[tokio::test]
async fn test_issue_token_is_for_a_person_who_may_decide() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "ops", "text": "hi"}))
        .await
        .unwrap();
    // The agent holds no EXECUTE; another member sees nothing; an approver
    // of the tenant may not decide a self proposal; another session of the
    // same person neither.
    assert_eq!(sqlstate(issue(&w.agent, p.id).await), "42501");
    let (_, member) = w.other("member", "app_human", "s-m").await;
    assert_eq!(sqlstate(issue(&member, p.id).await), "42501");
    let (_, approver) = w.other("approver", "app_human", "s-a").await;
    assert_eq!(sqlstate(issue(&approver, p.id).await), "42501");
    let elsewhere = Conn::connect(
        "app_human",
        Identity::gucs(&w.tenant, &w.principal, "another-session"),
    )
    .await;
    assert_eq!(sqlstate(issue(&elsewhere, p.id).await), "42501");
    assert_eq!(
        sqlstate(issue(&w.human, uuid::Uuid::new_v4()).await),
        "42501",
        "an unknown action answers as an invisible one"
    );
    // The original token still works: nothing was changed.
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, None).await.unwrap().0,
        "queued"
    );
}

#[tokio::test]
async fn test_a_link_code_is_redeemed_once_for_a_session_and_fresh_tokens() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let a = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let b = w
        .propose(&t, json!({"channel": "b", "text": "2"}))
        .await
        .unwrap();
    let code = link_code(&w.human, &[a.id, b.id]).await.unwrap();
    let d = connect("app_dispatcher").await;
    // Other action ids than the code's: nothing, and the code still works.
    assert!(redeem(&d, &code, &[a.id]).await.is_none());
    assert!(redeem(&d, "not-a-code", &[a.id, b.id]).await.is_none());
    let (session, tokens, role, claims) = redeem(&d, &code, &[b.id, a.id]).await.unwrap();
    assert!(session.starts_with("kts_"), "{session}");
    assert_eq!(role.as_deref(), Some("app_human"), "the caller's role");
    assert_eq!(
        claims,
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session,
               "keyturn_card_session": true}),
        "the person's claims, marked as a card session's"
    );
    // Used: a second redemption gives nothing.
    assert!(redeem(&d, &code, &[a.id, b.id]).await.is_none());
    // The session resolves while it lives; the fresh tokens approve, the
    // ones propose gave do not any more.
    let r = d
        .query_one(
            "SELECT db_role, claims, action_ids FROM keyturn.card_session($1)",
            &[&session],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, Vec<uuid::Uuid>>(2), vec![a.id, b.id]);
    assert!(d
        .query_opt("SELECT 1 FROM keyturn.card_session($1)", &[&"kts_nope"])
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        sqlstate(approve_on(&w.human, a.id, &a.token, None).await),
        "55000"
    );
    let ta = tokens[a.id.to_string()].as_str().unwrap().to_owned();
    assert_eq!(
        approve_on(&w.human, a.id, &ta, None).await.unwrap().0,
        "queued"
    );
    // Nothing of the code or the session is stored as itself.
    let stored = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.card_link WHERE position(convert_to($1, 'UTF8') in code_digest) > 0 \
           OR position(convert_to($2, 'UTF8') in coalesce(session_digest, '')) > 0",
        &[&code, &session],
    )
    .await;
    assert_eq!(stored, 0);
}

#[tokio::test]
async fn test_an_expired_link_code_redeems_nothing() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let code = link_code(&w.human, &[p.id]).await.unwrap();
    w.superuser
        .execute(
            "UPDATE keyturn.card_link SET expires_at = now() - interval '1 second' WHERE tenant = $1",
            &[&w.tenant],
        )
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    assert!(redeem(&d, &code, &[p.id]).await.is_none());
    // The proposal's own token is untouched.
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, None).await.unwrap().0,
        "queued"
    );
}

/// A code lives its ttl (15 minutes unless the caller says), and never past
/// the earliest expiry of the actions it names.
#[tokio::test]
async fn test_a_link_code_lives_its_ttl_and_never_past_its_actions() {
    let w = World::new("member").await;
    let long = w.webhook_tool(json!({"expires_in": "1 hour"})).await;
    let short = w.webhook_tool(json!({"expires_in": "90 seconds"})).await;
    let a = w
        .propose(&long, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let b = w
        .propose(&long, json!({"channel": "a", "text": "2"}))
        .await
        .unwrap();
    let soon = w
        .propose(&short, json!({"channel": "a", "text": "3"}))
        .await
        .unwrap();
    // The code's life as the database keeps it, and the earliest expiry of
    // the actions it names.
    let life = |code: String, ids: Vec<uuid::Uuid>| {
        let su = &w.superuser;
        async move {
            let r = su
                .query_one(
                    "SELECT date_trunc('second', l.expires_at - l.created_at)::text, \
                            l.expires_at = (SELECT min(x.expires_at) FROM keyturn.action x WHERE x.id = ANY ($2)) \
                       FROM keyturn.card_link l WHERE l.code_digest = keyturn._token_digest($1)",
                    &[&code, &ids],
                )
                .await
                .unwrap();
            (r.get::<_, String>(0), r.get::<_, bool>(1))
        }
    };
    let code = link_code(&w.human, &[a.id]).await.unwrap();
    assert_eq!(life(code, vec![a.id]).await, ("00:15:00".into(), false));
    let code: String = w
        .human
        .query_one(
            "SELECT keyturn.link_code($1, '2 minutes')",
            &[&vec![a.id, b.id]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        life(code, vec![a.id, b.id]).await,
        ("00:02:00".into(), false)
    );
    // An action that expires sooner ends the code with it, whatever the ttl.
    let code = link_code(&w.human, &[a.id, soon.id]).await.unwrap();
    let (left, at_expiry) = life(code, vec![a.id, soon.id]).await;
    assert!(at_expiry, "{left}");
    assert!(left.as_str() < "00:01:31", "{left}");
}

#[tokio::test]
async fn test_a_link_code_is_for_a_person_who_may_decide_every_action() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mine = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let (other, other_agent) = w.other("member", "app_agent", "s-o").await;
    w.grant(&other, &t).await;
    let theirs = propose_on(
        &other_agent,
        &t,
        json!({"channel": "b", "text": "2"}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(sqlstate(link_code(&w.agent, &[mine.id]).await), "42501");
    assert_eq!(
        sqlstate(link_code(&w.human, &[mine.id, theirs.id]).await),
        "42501"
    );
    for bad in [vec![], vec![mine.id, mine.id]] {
        assert_eq!(sqlstate(link_code(&w.human, &bad).await), "22023");
    }
    assert_eq!(
        sqlstate(
            w.human
                .query_one("SELECT keyturn.link_code($1, '2 days')", &[&vec![mine.id]])
                .await
        ),
        "22023"
    );
    // An independent tool: an approver who did not write it may; the
    // proposer may not.
    let ind = w.webhook_tool(json!({"approval": "independent"})).await;
    let (approver, approver_c) = w.other("approver", "app_human", "s-appr").await;
    w.grant(&approver, &ind).await;
    let q = w
        .propose(&ind, json!({"channel": "c", "text": "3"}))
        .await
        .unwrap();
    assert_eq!(sqlstate(link_code(&w.human, &[q.id]).await), "42501");
    link_code(&approver_c, &[q.id]).await.unwrap();
}

/// The dispatcher makes codes for notifications, asserting the person it
/// writes to; their sessions run as keyturnd's card role (db_role NULL).
#[tokio::test]
async fn test_the_dispatcher_makes_a_code_for_the_person_it_writes_to() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let disp = Conn::connect("app_dispatcher", w.identity()).await;
    let code = link_code(&disp, &[p.id]).await.unwrap();
    let d = connect("app_dispatcher").await;
    let (_, tokens, role, _) = redeem(&d, &code, &[p.id]).await.unwrap();
    assert_eq!(role, None);
    assert!(tokens[p.id.to_string()].is_string());
}

/// By default the dispatcher makes a code for any person who may decide
/// every action it names, as the human side does for itself: an eligible
/// approver of an independent action, several actions at once, more than
/// once. Anyone who may not decide them: 42501.
#[tokio::test]
async fn test_the_dispatcher_makes_a_code_for_any_person_who_may_decide() {
    let w = World::new("member").await;
    let ind = w.webhook_tool(json!({"approval": "independent"})).await;
    let (approver, _) = w.other("approver", "app_human", "s-appr").await;
    w.grant(&approver, &ind).await;
    let mut ids = Vec::new();
    for text in ["1", "2"] {
        let p = w
            .propose(&ind, json!({"channel": "c", "text": text}))
            .await
            .unwrap();
        ids.push(p.id);
    }
    let as_approver = Conn::connect(
        "app_dispatcher",
        Identity::gucs(&w.tenant, &approver, "s-appr"),
    )
    .await;
    let code = link_code(&as_approver, &ids).await.unwrap();
    link_code(&as_approver, &ids[..1]).await.unwrap();
    let d = connect("app_dispatcher").await;
    let (_, tokens, role, claims) = redeem(&d, &code, &ids).await.unwrap();
    assert_eq!(role, None, "keyturnd's card role");
    assert_eq!(claims["sub"], json!(approver), "{claims}");
    assert!(
        ids.iter().all(|id| tokens[id.to_string()].is_string()),
        "{tokens}"
    );
    // The proposer may not decide an independent action, nor may someone
    // outside the tenant: the dispatcher makes them no code.
    let disp = Conn::connect("app_dispatcher", w.identity()).await;
    assert_eq!(sqlstate(link_code(&disp, &ids).await), "42501");
    let stranger = Conn::connect(
        "app_dispatcher",
        Identity::gucs(&w.tenant, &unique("nobody"), "s-x"),
    )
    .await;
    assert_eq!(sqlstate(link_code(&stranger, &ids).await), "42501");
}

/// A dispatcher login with `keyturn.strict_dispatcher_links` on, as its
/// role's setting (superuser-only).
async fn strict_dispatcher(w: &World) -> String {
    let role = unique("strict_dispatcher");
    w.superuser
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN IN ROLE keyturn_dispatcher; \
             ALTER ROLE {role} SET keyturn.strict_dispatcher_links = on"
        ))
        .await
        .expect("create a strict dispatcher login");
    role
}

/// The red-team pass: with the dispatcher's login alone (DATABASE_URL), an
/// attacker asserted an approver's identity, made a code for that approver
/// (keyturnd's POST /card/session redeems it for a card session) and so
/// approved an independent action, or met a quorum with two invented
/// approvers. With `keyturn.strict_dispatcher_links` on, a code the
/// dispatcher makes is for keyturnd's MCP elicitation only: the proposer,
/// in the session it proposed in, once per action, while the proposal is
/// fresh.
#[tokio::test]
async fn test_a_strict_dispatcher_cannot_make_a_code_for_someone_else() {
    let w = World::new("member").await;
    let strict = strict_dispatcher(&w).await;
    let ind = w.webhook_tool(json!({"approval": "independent"})).await;
    let (approver, _) = w.other("approver", "app_human", "s-appr").await;
    w.grant(&approver, &ind).await;
    let q = w
        .propose(&ind, json!({"channel": "c", "text": "3"}))
        .await
        .unwrap();
    let as_approver = Conn::connect(&strict, Identity::gucs(&w.tenant, &approver, "s-appr")).await;
    assert_eq!(
        sqlstate(link_code(&as_approver, &[q.id]).await),
        "42501",
        "the dispatcher asserting an approver made a code that approves"
    );
    // The proposer's own, in another session: refused too.
    let elsewhere = Conn::connect(
        &strict,
        Identity::gucs(&w.tenant, &w.principal, "another-session"),
    )
    .await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    assert_eq!(sqlstate(link_code(&elsewhere, &[p.id]).await), "42501");
    // The proposer in its session: one code, and no second one.
    let disp = Conn::connect(&strict, w.identity()).await;
    link_code(&disp, &[p.id]).await.unwrap();
    assert_eq!(
        sqlstate(link_code(&disp, &[p.id]).await),
        "42501",
        "a second dispatcher code for the same action"
    );
    // A proposal that is no longer fresh: refused.
    let old = w
        .propose(&t, json!({"channel": "b", "text": "2"}))
        .await
        .unwrap();
    w.superuser
        .batch_execute(&format!(
            "ALTER TABLE keyturn.action DISABLE TRIGGER USER; \
             UPDATE keyturn.action SET created_at = created_at - interval '10 minutes' WHERE id = '{}'; \
             ALTER TABLE keyturn.action ENABLE TRIGGER USER",
            old.id
        ))
        .await
        .unwrap();
    assert_eq!(sqlstate(link_code(&disp, &[old.id]).await), "42501");
    // The human side is not limited so: the person may ask for more.
    link_code(&w.human, &[p.id]).await.unwrap();
    link_code(&w.human, &[p.id]).await.unwrap();
}

/// The red-team pass: under REPEATABLE READ a strict dispatcher transaction
/// whose snapshot predated keyturnd's own code made a second one (the check
/// read its snapshot). The one code per action is a unique index now.
#[tokio::test]
async fn test_the_dispatchers_one_code_per_action_holds_under_repeatable_read() {
    let w = World::new("member").await;
    let strict = strict_dispatcher(&w).await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let rr = connect(&strict).await;
    rr.batch_execute(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; \
         SET LOCAL keyturn.tenant = '{}'; SET LOCAL keyturn.principal = '{}'; SET LOCAL keyturn.session = '{}'; \
         SELECT 1",
        w.tenant, w.principal, w.session
    ))
    .await
    .unwrap();
    let disp = Conn::connect(&strict, w.identity()).await;
    link_code(&disp, &[p.id]).await.unwrap();
    let second = rr
        .query_one("SELECT keyturn.link_code($1)", &[&vec![p.id]])
        .await;
    rr.batch_execute("ROLLBACK").await.ok();
    assert!(
        second.is_err(),
        "a second dispatcher code under REPEATABLE READ"
    );
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.card_link WHERE tenant = $1 AND db_role IS NULL",
            &[&w.tenant]
        )
        .await,
        1
    );
}

/// Fourteenth red-team pass (docs/security.md, row 106): with its login
/// alone, the dispatcher made a code for a fresh self proposal, revised it
/// in the card session the code opened (params of its own), made a second
/// code for the revision and approved it there: it wrote what it decided,
/// in either mode. The dispatcher makes no code for a revision written in a
/// card session, and with the strict setting none for any revision; the
/// person decides the revision where they are signed in.
#[tokio::test]
async fn test_the_dispatcher_makes_no_code_for_a_revision_written_in_a_card_session() {
    let w = World::new("member").await;
    let strict = strict_dispatcher(&w).await;
    let t = w.webhook_tool(json!({})).await;
    for login in ["app_dispatcher", strict.as_str()] {
        let p = w
            .propose(&t, json!({"channel": "ops", "text": "the agent's"}))
            .await
            .unwrap();
        let disp = Conn::connect(login, w.identity()).await;
        let code = link_code(&disp, &[p.id]).await.unwrap();
        let (card, token, role) = card_session(&code, p.id).await;
        assert_eq!(role, None, "keyturnd's card role");
        let r = card
            .query_one(
                "SELECT action_id FROM keyturn.revise($1, $2, $3)",
                &[
                    &p.id,
                    &token,
                    &json!({"channel": "ops", "text": "the dispatcher's"}),
                ],
            )
            .await
            .unwrap();
        let revised: uuid::Uuid = r.get(0);
        let (state, msg) = failure(link_code(&disp, &[revised]).await);
        assert_eq!(state, "42501", "{login}: {msg}");
        assert_eq!(w.status(revised).await, "pending");
        // The person, where signed in, decides it.
        link_code(&w.human, &[revised]).await.unwrap();
        let fresh = issue(&w.human, revised).await.unwrap();
        assert_eq!(
            approve_on(&w.human, revised, &fresh, None).await.unwrap().0,
            "queued"
        );
    }
    // A revision the person wrote where signed in: the dispatcher may make
    // a code for it by default (it may decide as the person), never with
    // the strict setting (a revision is no fresh proposal of the agent's).
    let mut revisions = Vec::new();
    for _ in 0..2 {
        let p = w
            .propose(&t, json!({"channel": "ops", "text": "draft"}))
            .await
            .unwrap();
        let r = w
            .human
            .query_one(
                "SELECT action_id FROM keyturn.revise($1, $2, $3)",
                &[
                    &p.id,
                    &p.token,
                    &json!({"channel": "ops", "text": "the person's"}),
                ],
            )
            .await
            .unwrap();
        revisions.push(r.get::<_, uuid::Uuid>(0));
    }
    let disp = Conn::connect("app_dispatcher", w.identity()).await;
    link_code(&disp, &revisions[..1]).await.unwrap();
    let strict_disp = Conn::connect(&strict, w.identity()).await;
    assert_eq!(
        sqlstate(link_code(&strict_disp, &revisions[1..]).await),
        "42501"
    );
}

/// Sixteenth red-team pass (docs/security.md row 115): a decision made in a
/// card session was chained exactly as the person's own, so the audit could
/// not tell a link's holder (the dispatcher's login, someone who read the
/// mail) from the person. Every event a card session makes says
/// `via: card_session`.
/// Eighteenth red-team pass (docs/security.md, row 122): an agent that
/// asserted a card session's claims itself chained `via: card_session` on
/// its proposal. An agent opens no card session: its events never say so.
#[tokio::test]
async fn test_an_agent_cannot_chain_a_card_session() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let claims: Value = w
        .superuser
        .query_one(
            "SELECT keyturn._card_claims($1, $2, $3)",
            &[&w.tenant, &w.principal, &w.session],
        )
        .await
        .unwrap()
        .get(0);
    let agent = Conn::connect("app_agent", Identity::claims(&claims.to_string())).await;
    let id = propose_on(&agent, &t, json!({"channel": "a", "text": "1"}), json!({}))
        .await
        .unwrap()
        .id;
    let detail: Option<Value> = w
        .superuser
        .query_one(
            "SELECT detail FROM keyturn.event WHERE action_id = $1 AND to_status = 'pending'",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        detail.as_ref().and_then(|d| d.get("via")).is_none(),
        "{detail:?}"
    );
}

#[tokio::test]
async fn test_a_decision_in_a_card_session_says_so_in_the_chain() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "a", "text": "1"}))
        .await
        .unwrap();
    let q = w
        .propose(&t, json!({"channel": "b", "text": "2"}))
        .await
        .unwrap();
    let code = link_code(&w.human, &[p.id]).await.unwrap();
    let (card, token, _) = card_session(&code, p.id).await;
    assert_eq!(
        approve_on(&card, p.id, &token, None).await.unwrap().0,
        "queued"
    );
    assert_eq!(
        approve_on(&w.human, q.id, &q.token, None).await.unwrap().0,
        "queued"
    );
    let via = |id: uuid::Uuid| {
        let su = &w.superuser;
        async move {
            su.query_one(
                "SELECT detail ->> 'via' FROM keyturn.event WHERE action_id = $1 AND to_status = 'queued'",
                &[&id],
            )
            .await
            .unwrap()
            .get::<_, Option<String>>(0)
        }
    };
    assert_eq!(via(p.id).await.as_deref(), Some("card_session"));
    assert_eq!(via(q.id).await, None, "the person's own approval");
}
