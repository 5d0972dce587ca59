//! Identity through a transaction-mode pooler: it counts only when it is
//! transaction-local, and a server connection PgBouncer hands from one
//! client to the next never carries one person's identity to another.
//! PgBouncer here runs no reset query between clients, so whatever a client
//! leaves on a server connection does reach the next one.
//!
//! Every statement here is unnamed (`query_typed`): a named prepared
//! statement outlives its transaction on the server connection it was made
//! on (tokio-postgres closes it only when the last `Row` read through it is
//! dropped), and PgBouncer 1.18 in transaction mode may give that connection
//! to another client, which then finds the name taken.

use keyturn_tests::*;
use serde_json::{json, Value};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::support::{autocommit, backend_pid, login_in, pooled};

fn form(deal: i64) -> Value {
    json!({"where": {"id": deal}, "set": {"stage": "negotiation"}})
}

fn set_local(w: &World) -> String {
    // unique() names are [a-z0-9_]: safe to inline.
    format!(
        "SET LOCAL keyturn.tenant = '{}'; SET LOCAL keyturn.principal = '{}'; SET LOCAL keyturn.session = '{}'",
        w.tenant, w.principal, w.session
    )
}

async fn identity_now(c: &Client) -> (Option<String>, Option<String>, Option<String>) {
    let rows = autocommit(
        c,
        "SELECT keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session()",
        &[],
    )
    .await
    .expect("identity functions never raise");
    (rows[0].get(0), rows[0].get(1), rows[0].get(2))
}

/// `current_setting(name, true)`, outside any transaction.
async fn setting(c: &Client, name: &str) -> Option<String> {
    autocommit(
        c,
        "SELECT current_setting($1, true)",
        &[(&name, Type::TEXT)],
    )
    .await
    .expect("current_setting")[0]
        .get(0)
}

/// `BEGIN`, `prelude` (the identity, as the client asserts it), one
/// statement, then `COMMIT`, or `ROLLBACK` when the statement failed.
async fn in_tx(
    c: &Client,
    prelude: &str,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    c.batch_execute(&format!("BEGIN; {prelude}")).await?;
    let r = c.query_typed(sql, params).await;
    c.batch_execute(if r.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .await?;
    r
}

fn claims_prelude(claims: &str) -> String {
    // JSON of unique() names holds no quote to escape.
    format!("SELECT set_config('request.jwt.claims', '{claims}', true)")
}

/// `propose` of a webhook tool in a transaction asserting `prelude`.
async fn propose_with(c: &Client, prelude: &str, tool: &str) -> Result<(), tokio_postgres::Error> {
    in_tx(
        c,
        prelude,
        "SELECT action_id FROM keyturn.propose($1, $2)",
        &[
            (&tool, Type::TEXT),
            (&json!({"channel": "c", "text": "hi"}), Type::JSONB),
        ],
    )
    .await
    .map(|_| ())
}

/// `propose` in a transaction of its own that asserts nothing.
async fn bare_propose(c: &Client, tool: &str) -> Result<(), tokio_postgres::Error> {
    propose_with(c, "", tool).await
}

fn detail(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .and_then(|d| d.detail())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn test_propose_and_approve_with_set_local_identity() {
    let port = require_bouncer!();
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let agent = pooled(port, "app_agent", "keyturn").await;
    let human = pooled(port, "app_human", "keyturn").await;

    let rows = in_tx(
        &agent,
        &set_local(&w),
        "SELECT action_id, token, status FROM keyturn.propose($1, $2)",
        &[(&tool, Type::TEXT), (&form(deal), Type::JSONB)],
    )
    .await
    .expect("propose through PgBouncer with SET LOCAL identity");
    let (id, token, status): (uuid::Uuid, String, String) =
        (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    assert_eq!(status, "pending");

    let rows = in_tx(
        &human,
        &set_local(&w),
        "SELECT status FROM keyturn.approve($1, $2)",
        &[(&id, Type::UUID), (&token, Type::TEXT)],
    )
    .await
    .expect("approve through PgBouncer with SET LOCAL identity");
    assert_eq!(rows[0].get::<_, String>(0), "succeeded");
    assert_eq!(w.stage_of(deal).await, "negotiation");
    assert_eq!(w.writes(deal).await, 1, "one business write");

    // The identity ended with each transaction.
    for c in [&agent, &human] {
        assert_eq!(identity_now(c).await, (None, None, None));
    }
}

#[tokio::test]
async fn test_propose_and_approve_with_transaction_local_claims() {
    let port = require_bouncer!();
    let w = World::new("member").await;
    let tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let claims =
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session}).to_string();
    let agent = pooled(port, "app_agent", "keyturn").await;
    let human = pooled(port, "app_human", "keyturn").await;
    let rows = in_tx(
        &agent,
        &claims_prelude(&claims),
        "SELECT action_id, token FROM keyturn.propose($1, $2)",
        &[(&tool, Type::TEXT), (&form(deal), Type::JSONB)],
    )
    .await
    .expect("propose with transaction-local claims");
    let (id, token): (uuid::Uuid, String) = (rows[0].get(0), rows[0].get(1));
    let rows = in_tx(
        &human,
        &claims_prelude(&claims),
        "SELECT status FROM keyturn.approve($1, $2)",
        &[(&id, Type::UUID), (&token, Type::TEXT)],
    )
    .await
    .expect("approve with transaction-local claims");
    assert_eq!(rows[0].get::<_, String>(0), "succeeded");
    assert_eq!(w.stage_of(deal).await, "negotiation");
    let agent_again = pooled(port, "app_agent", "keyturn").await;
    assert_eq!(
        setting(&agent_again, "request.jwt.claims")
            .await
            .unwrap_or_default(),
        "",
        "no claims left on any pooled connection"
    );
}

#[tokio::test]
async fn test_session_level_identity_is_refused_through_the_pooler() {
    let port = require_bouncer!();
    let w = World::new("member").await;
    let tool = w.webhook_tool(json!({})).await;

    // Roles of their own: the session state these clients leave stays on
    // their own pools.
    let login = login_in(&w.superuser, "session_agent", "keyturn_agent").await;
    let c = pooled(port, &login, "keyturn").await;
    // Session-level on purpose: the refusal is what this test checks.
    c.batch_execute(&format!(
        "SET keyturn.tenant = '{}'; SET keyturn.principal = '{}'; SET keyturn.session = '{}'",
        w.tenant, w.principal, w.session
    ))
    .await
    .expect("a session-level SET is accepted by PostgreSQL");
    let e = bare_propose(&c, &tool)
        .await
        .expect_err("session-level identity is no identity");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    assert!(
        detail(&e).contains("for the whole session"),
        "the detail says why: {e:?}"
    );

    let login = login_in(&w.superuser, "session_claims", "keyturn_agent").await;
    let c = pooled(port, &login, "keyturn").await;
    let claims =
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session}).to_string();
    autocommit(
        &c,
        "SELECT set_config('request.jwt.claims', $1, false)",
        &[(&claims, Type::TEXT)],
    )
    .await
    .expect("set_config(..., false)");
    let e = bare_propose(&c, &tool)
        .await
        .expect_err("session-level claims are no identity");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    assert!(
        detail(&e).contains("request.jwt.claims is set for the whole session"),
        "{e:?}"
    );
}

/// Two clients of one role on `keyturn_one`, which has a single server
/// connection per role: every statement of both runs on the same backend.
#[tokio::test]
async fn test_a_pooled_server_connection_never_hands_identity_to_the_next_client() {
    let port = require_bouncer!();
    let w = World::new("member").await;
    let tool = w.webhook_tool(json!({})).await;
    let login = login_in(&w.superuser, "shared_agent", "keyturn_agent").await;
    let a = pooled(port, &login, "keyturn_one").await;
    let b = pooled(port, &login, "keyturn_one").await;
    assert_eq!(
        backend_pid(&a).await,
        backend_pid(&b).await,
        "both clients are served by one server connection"
    );

    // A asserts identity for its transaction; B, next on that connection,
    // finds none.
    let rows = in_tx(&a, &set_local(&w), "SELECT keyturn.current_tenant()", &[])
        .await
        .expect("identity");
    assert_eq!(rows[0].get::<_, Option<String>>(0), Some(w.tenant.clone()));
    propose_with(&a, &set_local(&w), &tool)
        .await
        .expect("A proposes");
    assert_eq!(identity_now(&b).await, (None, None, None));
    assert_eq!(setting(&b, "keyturn.tenant").await.unwrap_or_default(), "");
    let e = bare_propose(&b, &tool)
        .await
        .expect_err("B has no identity");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");

    // The same with claims, as PostgREST sets them.
    let claims =
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session}).to_string();
    let rows = in_tx(
        &a,
        &claims_prelude(&claims),
        "SELECT keyturn.current_principal()",
        &[],
    )
    .await
    .expect("identity");
    assert_eq!(
        rows[0].get::<_, Option<String>>(0),
        Some(w.principal.clone())
    );
    assert_eq!(identity_now(&b).await, (None, None, None));
    assert_eq!(
        setting(&b, "request.jwt.claims").await.unwrap_or_default(),
        ""
    );

    // A sets identity for the whole session (on purpose: the refusal is
    // what this test checks), and PgBouncer does hand the values to B ...
    a.batch_execute(&format!(
        "SET keyturn.tenant = '{}'; SET keyturn.principal = '{}'; SET keyturn.session = '{}'",
        w.tenant, w.principal, w.session
    ))
    .await
    .expect("session-level SET");
    assert_eq!(setting(&b, "keyturn.tenant").await, Some(w.tenant.clone()));
    // ... but keyturn never counts them as identity, for B nor for A.
    assert_eq!(identity_now(&b).await, (None, None, None));
    for c in [&b, &a] {
        let e = bare_propose(c, &tool)
            .await
            .expect_err("leaked session identity is refused");
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
        assert!(detail(&e).contains("for the whole session"), "{e:?}");
    }
    // Fail closed: while the connection carries session-level identity,
    // even B's own transaction-local identity is refused, because the
    // leaked values would outlive its transaction. That is why the pooler
    // should reset server connections (docs/operations.md).
    let refused = propose_with(&b, &set_local(&w), &tool)
        .await
        .expect_err("refused while the connection carries session identity");
    assert_eq!(
        refused.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{refused}"
    );
    // A reset (what server_reset_query = DISCARD ALL does) clears it.
    b.batch_execute("RESET ALL").await.expect("reset");
    propose_with(&b, &set_local(&w), &tool)
        .await
        .expect("after the reset, transaction-local identity works again");
}
