//! docs/sql-api.md, "Evidence": evidence is recorded by the trusted side (a
//! person's record_evidence, or fence recording what it fenced), a proposal
//! cites it by id, and an agent cannot cite what nobody recorded, what
//! another principal recorded, or what was revoked.

use keyturn_tests::*;
use serde_json::{json, Value};

fn hex64(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

async fn record(
    c: &Conn,
    kind: &str,
    r: &str,
    sha: &str,
) -> Result<uuid::Uuid, tokio_postgres::Error> {
    // By name, as the documented signature spells them (a pgrx-generated
    // signature once named the second argument "r#ref").
    c.query_one(
        "SELECT keyturn.record_evidence(kind => $1, ref => $2, sha256 => $3)",
        &[&kind, &r, &sha],
    )
    .await
    .map(|r| r.get(0))
}

fn citing(ids: &[String]) -> Value {
    json!({"evidence": ids})
}

#[tokio::test]
async fn test_fence_records_what_it_fenced_and_a_proposal_cites_it() {
    let w = World::new("member").await;
    let provider = format!("crm{}", unique("ev").replace(['-', '_'], ""));
    w.admin
        .execute(
            "SELECT keyturn.register_projection($1, $2)",
            &[&provider, &json!({"fields": {"name": {"max_length": 40}}})],
        )
        .await
        .unwrap();
    let r = w
        .agent
        .query_one(
            "SELECT reference, evidence_id FROM keyturn.fence($1, $2)",
            &[
                &provider,
                &json!({"name": "Northwind", "secret": "dropped"}),
            ],
        )
        .await
        .unwrap();
    let (reference, evidence): (String, uuid::Uuid) = (r.get(0), r.get(1));
    // What was recorded: the provider and version, and the hash of the JSON
    // line the model reads.
    let line = reference.lines().nth(1).unwrap();
    let row = w
        .superuser
        .query_one(
            "SELECT kind, ref, sha256, principal FROM keyturn.evidence WHERE id = $1",
            &[&evidence],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "fence");
    assert_eq!(row.get::<_, String>(1), format!("{provider}@1"));
    use sha2::Digest;
    assert_eq!(
        row.get::<_, String>(2),
        hex::encode(sha2::Sha256::digest(line.as_bytes()))
    );
    assert_eq!(row.get::<_, String>(3), w.principal);
    // Cited: the card (preview) shows it.
    let t = w.webhook_tool(json!({})).await;
    let p = propose_on(
        &w.agent,
        &t,
        json!({"channel": "c", "text": "per the CRM"}),
        citing(&[evidence.to_string()]),
    )
    .await
    .unwrap();
    let preview: Value = w
        .human
        .query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(preview["evidence"][0]["evidence_id"], json!(evidence));
    assert_eq!(preview["evidence"][0]["kind"], json!("fence"));
    assert_eq!(preview["evidence"][0]["revoked"], json!(false));
    // Red-team pass of 0.3.0: the agent chose what it fenced, and the card
    // showed it like evidence a person recorded. It now says who called.
    assert_eq!(preview["evidence"][0]["recorded_role"], json!("app_agent"));
    assert_eq!(preview["evidence"][0]["by_agent"], json!(true));
    let seen = record(&w.human, "email", "msg-1@mail.example", &hex64('c'))
        .await
        .unwrap();
    let q = propose_on(
        &w.agent,
        &t,
        json!({"channel": "c", "text": "per the mail"}),
        citing(&[seen.to_string()]),
    )
    .await
    .unwrap();
    let preview: Value = w
        .human
        .query_one("SELECT keyturn.preview($1, $2)", &[&q.id, &q.token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(preview["evidence"][0]["recorded_role"], json!("app_human"));
    assert_eq!(preview["evidence"][0]["by_agent"], json!(false));
}

#[tokio::test]
async fn test_a_proposal_cites_only_live_evidence_of_its_own_principal() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mine = record(&w.human, "document", "s3://docs/q3.pdf", &hex64('a'))
        .await
        .unwrap();
    let (_, other_human) = w.other("member", "app_human", "s-other").await;
    let theirs = record(&other_human, "document", "s3://docs/x.pdf", &hex64('b'))
        .await
        .unwrap();
    let elsewhere = World::new("member").await;
    let foreign = record(&elsewhere.human, "document", "s3://docs/y.pdf", &hex64('c'))
        .await
        .unwrap();
    let params = json!({"channel": "c", "text": "t"});
    for (what, id) in [
        ("unknown", uuid::Uuid::new_v4().to_string()),
        ("another principal's", theirs.to_string()),
        ("another tenant's", foreign.to_string()),
        ("not an id", "not-an-id".to_owned()),
    ] {
        let r = propose_on(
            &w.agent,
            &t,
            params.clone(),
            citing(&[mine.to_string(), id]),
        )
        .await;
        assert_eq!(sqlstate(r), "22023", "{what}");
    }
    propose_on(&w.agent, &t, params.clone(), citing(&[mine.to_string()]))
        .await
        .unwrap();
    // An agent records no evidence itself.
    assert_eq!(
        sqlstate(record(&w.agent, "document", "x", &hex64('d')).await),
        "42501"
    );
    // Shapes.
    for (kind, r, sha) in [
        ("Bad Kind", "x", hex64('a')),
        ("doc", "", hex64('a')),
        ("doc", "a\nb", hex64('a')),
        ("doc", "x", hex64('A')),
        ("doc", "x", "abc".to_owned()),
    ] {
        assert_eq!(
            sqlstate(record(&w.human, kind, r, &sha).await),
            "22023",
            "{kind} {r:?} {sha}"
        );
    }
}

#[tokio::test]
async fn test_revoked_evidence_invalidates_what_cites_it_and_can_be_cited_no_more() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let e = record(&w.human, "message", "slack://C1/p123", &hex64('e'))
        .await
        .unwrap();
    let params = json!({"channel": "c", "text": "t"});
    let citing_it = propose_on(&w.agent, &t, params.clone(), citing(&[e.to_string()]))
        .await
        .unwrap();
    let not_citing = propose_on(&w.agent, &t, params.clone(), json!({}))
        .await
        .unwrap();
    // Another principal cannot revoke it.
    let (_, other) = w.other("approver", "app_human", "s-x").await;
    assert!(!other
        .query_one("SELECT keyturn.revoke_evidence($1)", &[&e])
        .await
        .unwrap()
        .get::<_, bool>(0));
    assert!(w
        .human
        .query_one("SELECT keyturn.revoke_evidence($1)", &[&e])
        .await
        .unwrap()
        .get::<_, bool>(0));
    assert_eq!(w.status(citing_it.id).await, "invalidated");
    assert_eq!(w.status(not_citing.id).await, "pending");
    assert_eq!(
        sqlstate(propose_on(&w.agent, &t, params, citing(&[e.to_string()])).await),
        "22023"
    );
}

/// Red-team finding 4: evidence cited in another spelling of its id (upper
/// case) survived revoke_evidence, which matched the text. An id is cited
/// as keyturn returned it (lower-case, hyphenated) or not at all (22023).
#[tokio::test]
async fn test_evidence_is_cited_only_by_the_id_keyturn_returned() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let e = record(&w.human, "email", "msg-upper", &hex64('c'))
        .await
        .unwrap();
    let params = json!({"channel": "c", "text": "t"});
    for spelling in [
        e.to_string().to_uppercase(),
        e.simple().to_string(),
        format!("{{{e}}}"),
    ] {
        assert_eq!(
            sqlstate(
                propose_on(
                    &w.agent,
                    &t,
                    params.clone(),
                    citing(std::slice::from_ref(&spelling))
                )
                .await
            ),
            "22023",
            "{spelling}"
        );
    }
}

/// Red-team finding 5: under REPEATABLE READ a proposal was admitted citing
/// evidence revoked after the agent's snapshot; and whatever propose
/// admitted, approve and begin_dispatch check the evidence again: a
/// proposal whose evidence is revoked never runs.
#[tokio::test]
async fn test_revoked_evidence_is_caught_on_committed_data_and_again_at_approve() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let params = json!({"channel": "c", "text": "t"});
    let e = record(&w.human, "email", "msg-rr", &hex64('d'))
        .await
        .unwrap();
    let tx = w
        .agent
        .transaction_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    tx.query_one("SELECT count(*) FROM keyturn.action", &[])
        .await
        .unwrap();
    w.human
        .query_one("SELECT keyturn.revoke_evidence($1)", &[&e])
        .await
        .unwrap();
    let r = tx
        .query_one(
            "SELECT action_id FROM keyturn.propose($1, $2, $3)",
            &[&t, &params, &citing(&[e.to_string()])],
        )
        .await;
    let state = sqlstate(r);
    assert!(state == "40001" || state == "22023", "{state}");
    let _ = tx.rollback().await;

    // Revoked behind propose's back (no invalidation ran): approve refuses.
    let e2 = record(&w.human, "email", "msg-late", &hex64('e'))
        .await
        .unwrap();
    let p = propose_on(&w.agent, &t, params.clone(), citing(&[e2.to_string()]))
        .await
        .unwrap();
    tamper(
        &w.superuser,
        "UPDATE keyturn.evidence SET revoked_at = now() WHERE id = $1",
        &[&e2],
    )
    .await;
    assert_eq!(w.approve(&p).await.unwrap().0, "invalidated");
}
