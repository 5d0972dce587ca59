//! docs/sql-api.md: identity comes from request.jwt.claims, else the three GUCs,
//! never mixed; missing, empty or malformed identity is 42501. Each identity
//! here is asserted inside the transaction that uses it, as a pooled
//! application must (see `Conn`); the tests at the end check that identity
//! set for a whole session is refused.

use std::sync::Arc;
use std::time::Duration;

use keyturn_tests::*;
use serde_json::json;
use tokio_postgres::{Client, NoTls};

async fn identity(c: &impl Sql) -> (Option<String>, Option<String>, Option<String>) {
    let r = c
        .query_one("SELECT keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session()", &[])
        .await
        .expect("identity functions never raise");
    (r.get(0), r.get(1), r.get(2))
}

/// A world with an sql tool and one deal, so a valid proposal is possible.
async fn setup() -> (World, String, i64) {
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    (w, tool, deal)
}

fn form(deal: i64) -> serde_json::Value {
    json!({"where": {"id": deal}, "set": {"stage": "qualified"}})
}

#[tokio::test]
async fn test_claims_win_over_gucs() {
    let (w, tool, deal) = setup().await;
    // GUCs name a principal that does not exist; the claims name the real one.
    let claims =
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session}).to_string();
    w.agent
        .set_identity(Identity::gucs("nowhere", "nobody", "nosession").with_claims(&claims))
        .await;
    assert_eq!(
        identity(&w.agent).await,
        (
            Some(w.tenant.clone()),
            Some(w.principal.clone()),
            Some(w.session.clone())
        )
    );
    let p = w
        .propose(&tool, form(deal))
        .await
        .expect("claims identity proposes");
    assert!(w.approve(&p).await.is_ok());
    // Claims alone, as PostgREST sets them per request, are a whole identity.
    let claims_only = Conn::connect("app_agent", Identity::claims(&claims)).await;
    propose_on(&claims_only, &tool, form(deal), json!({}))
        .await
        .expect("claims without any GUC propose");
}

#[tokio::test]
async fn test_malformed_claims_are_missing_identity_even_with_gucs() {
    let (w, tool, deal) = setup().await;
    // The GUCs hold a complete, valid identity the whole time.
    let bad = [
        "{}".to_string(),
        "[]".into(),
        "\"a string\"".into(),
        "42".into(),
        "null".into(),
        "not json at all".into(),
        " ".into(),
        json!({"tenant_id": w.tenant, "sub": w.principal}).to_string(),
        json!({"tenant_id": w.tenant, "sub": 17, "session_id": w.session}).to_string(),
        json!({"tenant_id": [w.tenant], "sub": w.principal, "session_id": w.session}).to_string(),
        json!({"tenant_id": "", "sub": w.principal, "session_id": w.session}).to_string(),
    ];
    for claims in bad {
        w.agent
            .set_identity(w.identity().with_claims(&claims))
            .await;
        let (t, p, s) = identity(&w.agent).await;
        assert!(
            t.is_none() || p.is_none() || s.is_none(),
            "claims {claims} gave a full identity"
        );
        assert_eq!(
            sqlstate(w.propose(&tool, form(deal)).await),
            "42501",
            "claims {claims}"
        );
    }
    // Never mixed: with claims lacking the session, the session GUC is not used.
    w.agent
        .set_identity(
            w.identity()
                .with_claims(&json!({"tenant_id": w.tenant, "sub": w.principal}).to_string()),
        )
        .await;
    assert_eq!(
        identity(&w.agent).await,
        (Some(w.tenant.clone()), Some(w.principal.clone()), None)
    );
    assert_eq!(w.actions().await, 0);
}

#[tokio::test]
async fn test_empty_claims_fall_back_to_gucs() {
    let (w, tool, deal) = setup().await;
    w.agent.set_identity(w.identity().with_claims("")).await;
    assert_eq!(
        identity(&w.agent).await,
        (
            Some(w.tenant.clone()),
            Some(w.principal.clone()),
            Some(w.session.clone())
        )
    );
    w.propose(&tool, form(deal))
        .await
        .expect("'' claims fall back to the GUCs");
}

#[tokio::test]
async fn test_empty_guc_is_missing_not_wildcard() {
    let (w, tool, deal) = setup().await;
    for (t, p, s) in [
        ("", w.principal.as_str(), w.session.as_str()),
        (w.tenant.as_str(), "", w.session.as_str()),
        (w.tenant.as_str(), w.principal.as_str(), ""),
    ] {
        w.agent.set_identity(Identity::gucs(t, p, s)).await;
        let (gt, gp, gs) = identity(&w.agent).await;
        assert!(gt.is_none() || gp.is_none() || gs.is_none());
        assert_eq!(
            sqlstate(w.propose(&tool, form(deal)).await),
            "42501",
            "identity ({t:?}, {p:?}, {s:?})"
        );
    }
    // A connection that never set anything.
    let bare = connect("app_agent").await;
    assert_eq!(identity(&bare).await, (None, None, None));
    assert_eq!(
        sqlstate(propose_on(&bare, &tool, form(deal), json!({})).await),
        "42501"
    );
}

#[tokio::test]
async fn test_set_local_identity_lasts_one_transaction() {
    let (w, tool, deal) = setup().await;
    let claims =
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session}).to_string();
    // Each way to assert identity for one transaction, written by hand on a
    // connection that asserts none of its own.
    let ways = [
        format!(
            "SET LOCAL keyturn.tenant = '{}'; SET LOCAL keyturn.principal = '{}'; SET LOCAL keyturn.session = '{}'",
            w.tenant, w.principal, w.session
        ),
        format!(
            "SELECT set_config('keyturn.tenant', '{}', true), set_config('keyturn.principal', '{}', true), \
             set_config('keyturn.session', '{}', true)",
            w.tenant, w.principal, w.session
        ),
        format!("SELECT set_config('request.jwt.claims', '{claims}', true)"),
    ];
    let c = Conn::connect("app_agent", Identity::none()).await;
    for way in ways {
        let tx = c.transaction().await.unwrap();
        tx.batch_execute(&way).await.unwrap();
        propose_on(&tx, &tool, form(deal), json!({}))
            .await
            .unwrap_or_else(|e| panic!("{way}: {e}"));
        tx.commit().await.unwrap();
        assert_eq!(
            identity(&c).await,
            (None, None, None),
            "{way}: identity must not outlive its transaction"
        );
        assert_eq!(
            sqlstate(propose_on(&c, &tool, form(deal), json!({})).await),
            "42501",
            "{way}"
        );
    }
}

#[tokio::test]
async fn test_non_member_principal_is_refused_on_every_identity_call() {
    let (w, tool, deal) = setup().await;
    let p = w.propose(&tool, form(deal)).await.unwrap();
    let stranger = unique("stranger");
    let agent = Conn::connect(
        "app_agent",
        Identity::gucs(&w.tenant, &stranger, &w.session),
    )
    .await;
    let human = Conn::connect(
        "app_human",
        Identity::gucs(&w.tenant, &stranger, &w.session),
    )
    .await;
    w.grant(&stranger, &tool).await; // a grant without membership is worth nothing
    assert_eq!(
        sqlstate(propose_on(&agent, &tool, form(deal), json!({})).await),
        "42501"
    );
    assert_eq!(
        sqlstate(agent.query("SELECT keyturn.cancel_origin('c1')", &[]).await),
        "42501"
    );
    assert_eq!(
        sqlstate(agent.query("SELECT keyturn.end_session()", &[]).await),
        "42501"
    );
    assert_eq!(
        sqlstate(
            agent
                .query("SELECT * FROM keyturn.action_status($1)", &[&p.id])
                .await
        ),
        "42501"
    );
    assert_eq!(
        sqlstate(approve_on(&human, p.id, &p.token, None).await),
        "42501"
    );
    assert_eq!(
        sqlstate(
            human
                .query("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
                .await
        ),
        "42501"
    );
    assert_eq!(
        sqlstate(
            human
                .query("SELECT keyturn.reject($1, $2)", &[&p.id, &p.token])
                .await
        ),
        "42501"
    );
    assert_eq!(w.status(p.id).await, "pending");
    // A member of another tenant is a non-member here.
    let other = World::new("approver").await;
    human
        .set_identity(Identity::gucs(&w.tenant, &other.principal, &w.session))
        .await;
    assert_eq!(
        sqlstate(approve_on(&human, p.id, &p.token, None).await),
        "42501"
    );
    assert_eq!(w.status(p.id).await, "pending");
}

/// The fixture every test relies on: what a Conn asserts lives only in the
/// transaction it runs, a Tx holds the connection until it ends (dropped, it
/// is rolled back), and calls sharing one Conn wait for each other.
#[tokio::test]
async fn test_conn_asserts_identity_per_transaction_and_serializes_calls() {
    let (w, _tool, _deal) = setup().await;
    let conn = Arc::new(Conn::connect("app_agent", w.identity()).await);
    assert_eq!(identity(&*conn).await.0.as_deref(), Some(w.tenant.as_str()));
    conn.set_identity(Identity::none()).await;
    assert_eq!(
        identity(&*conn).await,
        (None, None, None),
        "nothing the earlier transactions asserted is left on the connection"
    );

    let tx = conn.transaction().await.unwrap();
    let in_tx: i64 = tx
        .query_one("SELECT txid_current()", &[])
        .await
        .unwrap()
        .get(0);
    let waiting = {
        let conn = conn.clone();
        tokio::spawn(async move {
            conn.query_one("SELECT txid_current()", &[])
                .await
                .map(|r| r.get::<_, i64>(0))
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a call ran on the connection while another task's transaction was open"
    );
    tx.commit().await.unwrap();
    let after = waiting.await.unwrap().unwrap();
    assert_ne!(
        after, in_tx,
        "the waiting call ran in a transaction of its own"
    );

    let tx = conn.transaction().await.unwrap();
    tx.query_one(
        "SELECT set_config('application_name', 'set-in-a-dropped-tx', false)",
        &[],
    )
    .await
    .unwrap();
    drop(tx);
    let name: String = conn
        .query_one("SELECT current_setting('application_name')", &[])
        .await
        .unwrap()
        .get(0);
    assert_ne!(name, "set-in-a-dropped-tx", "a dropped Tx is rolled back");
}

// Identity set for the whole session is refused: a session value stays on a
// pooled connection and reaches the next client's requests. Only identity
// local to the caller's transaction counts; that it ends with its
// transaction is checked by test_set_local_identity_lasts_one_transaction.

/// Sets the GUC identity for the rest of the session: what keyturn is to refuse.
async fn set_for_the_session(c: &Client, identity: &Identity) {
    let (tenant, principal, session) = identity.gucs.as_ref().expect("a GUC identity");
    c.execute(
        "SELECT set_config('keyturn.tenant', $1, false), set_config('keyturn.principal', $2, false), \
         set_config('keyturn.session', $3, false)",
        &[tenant, principal, session],
    )
    .await
    .expect("set identity for the session");
}

#[tokio::test]

async fn test_session_set_config_identity_is_refused() {
    let (w, tool, deal) = setup().await;
    let agent = connect("app_agent").await;
    set_for_the_session(&agent, &w.identity()).await;
    assert_eq!(
        sqlstate(propose_on(&agent, &tool, form(deal), json!({})).await),
        "42501",
        "propose under session identity"
    );
    let p = w.propose(&tool, form(deal)).await.unwrap();
    let human = connect("app_human").await;
    set_for_the_session(&human, &w.identity()).await;
    assert_eq!(
        sqlstate(approve_on(&human, p.id, &p.token, None).await),
        "42501",
        "approve under session identity"
    );
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(w.actions().await, 1);
}

#[tokio::test]

async fn test_session_set_leaks_past_a_correct_set_local() {
    let (w, tool, deal) = setup().await;
    // A previous client of the pooled connection left its identity on it.
    let previous = World::new("member").await;
    let c = connect("app_agent").await;
    c.batch_execute(&format!(
        "SET keyturn.tenant = '{}'; SET keyturn.principal = '{}'; SET keyturn.session = '{}'",
        previous.tenant, previous.principal, previous.session
    ))
    .await
    .unwrap();
    // This client asserts its own identity correctly, in its transaction.
    let c = Conn::new(c, Identity::none());
    let tx = c.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "SET LOCAL keyturn.tenant = '{}'; SET LOCAL keyturn.principal = '{}'; SET LOCAL keyturn.session = '{}'",
        w.tenant, w.principal, w.session
    ))
    .await
    .unwrap();
    assert_eq!(
        sqlstate(propose_on(&tx, &tool, form(deal), json!({})).await),
        "42501",
        "a session value under the local one is a leak"
    );
    tx.rollback().await.unwrap();
    assert_eq!(w.actions().await, 0);
}

#[tokio::test]

async fn test_pgoptions_identity_is_refused() {
    let (w, tool, deal) = setup().await;
    // What PGOPTIONS="-c keyturn.tenant=…" does: identity in the startup packet.
    let with_options = || async {
        let url = format!(
            "host=127.0.0.1 port={} user=app_agent dbname={} \
             options='-c keyturn.tenant={} -c keyturn.principal={} -c keyturn.session={}'",
            port(),
            dbname(),
            w.tenant,
            w.principal,
            w.session
        );
        let (client, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("connect with options");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    };
    let c = with_options().await;
    let set: Option<String> = c
        .query_one("SELECT current_setting('keyturn.tenant', true)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        set.as_deref(),
        Some(w.tenant.as_str()),
        "fixture: the startup options set the GUC"
    );
    assert_eq!(
        identity(&c).await.0,
        None,
        "and keyturn reads it as missing"
    );
    assert_eq!(
        sqlstate(propose_on(&c, &tool, form(deal), json!({})).await),
        "42501",
        "identity from the startup options alone"
    );
    let c = Conn::new(with_options().await, w.identity());
    assert_eq!(
        sqlstate(propose_on(&c, &tool, form(deal), json!({})).await),
        "42501",
        "identity from the startup options under a correct local one"
    );
    assert_eq!(w.actions().await, 0);
}

#[tokio::test]

async fn test_session_claims_are_refused_under_correct_local_gucs() {
    let (w, tool, deal) = setup().await;
    let claims =
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session}).to_string();
    let c = connect("app_agent").await;
    c.execute(
        "SELECT set_config('request.jwt.claims', $1, false)",
        &[&claims],
    )
    .await
    .unwrap();
    // Today the session claims win over the local GUCs and name the same
    // identity; once session values are refused they make the call fail.
    let c = Conn::new(c, w.identity());
    assert_eq!(
        sqlstate(propose_on(&c, &tool, form(deal), json!({})).await),
        "42501"
    );
    assert_eq!(w.actions().await, 0);
}
