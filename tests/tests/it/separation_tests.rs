//! docs/sql-api.md: approve, preview and reject refuse any
//! caller whose current_user or outer (SET ROLE) role is in keyturn_agent.

use keyturn_tests::*;
use serde_json::json;

async fn external_proposal(w: &World) -> Proposal {
    let t = w.webhook_tool(json!({})).await;
    w.propose(&t, json!({"channel": "ops", "text": "hi"}))
        .await
        .unwrap()
}

/// The three human calls, each must be 42501 and change nothing.
async fn assert_refused(c: &Conn, w: &World, p: &Proposal, who: &str) {
    assert_eq!(
        sqlstate(approve_on(c, p.id, &p.token, None).await),
        "42501",
        "{who}: approve"
    );
    assert_eq!(
        sqlstate(
            c.query("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
                .await
        ),
        "42501",
        "{who}: preview"
    );
    assert_eq!(
        sqlstate(
            c.query("SELECT keyturn.reject($1, $2)", &[&p.id, &p.token])
                .await
        ),
        "42501",
        "{who}: reject"
    );
    assert_eq!(w.status(p.id).await, "pending", "{who}");
    assert_eq!(w.event_rows(p.id).await, 1, "{who}");
}

#[tokio::test]
async fn test_role_in_both_agent_and_approver_is_refused() {
    let w = World::new("member").await;
    let p = external_proposal(&w).await;
    let both = unique("both");
    w.superuser
        .batch_execute(&format!(
            "CREATE ROLE {both} LOGIN IN ROLE keyturn_agent, keyturn_approver"
        ))
        .await
        .unwrap();
    let c = Conn::connect(&both, w.identity()).await;
    assert_refused(&c, &w, &p, "agent+approver role").await;
    // The proposal was fine all along: a pure approver approves it.
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
}

#[tokio::test]
async fn test_superuser_is_refused() {
    let w = World::new("member").await;
    let p = external_proposal(&w).await;
    let su = Conn::connect("postgres", w.identity()).await;
    assert_refused(&su, &w, &p, "superuser").await;
}

#[tokio::test]
async fn test_set_role_to_an_agent_member_is_refused() {
    let w = World::new("member").await;
    let p = external_proposal(&w).await;
    let login = unique("human");
    let agentish = unique("agentish");
    w.superuser
        .batch_execute(&format!(
            "CREATE ROLE {agentish} NOLOGIN IN ROLE keyturn_agent, keyturn_approver; \
             CREATE ROLE {login} LOGIN IN ROLE keyturn_approver; GRANT {agentish} TO {login}"
        ))
        .await
        .unwrap();
    let c = Conn::connect(&login, w.identity()).await;
    c.batch_execute(&format!("SET ROLE {agentish}"))
        .await
        .unwrap();
    assert_refused(&c, &w, &p, "SET ROLE agent member").await;
}

#[tokio::test]
async fn test_security_definer_wrappers_do_not_hide_the_agent() {
    let w = World::new("member").await;
    let p = external_proposal(&w).await;
    // The wrappers live in schema crm, which tests/dev-reinstall drops with
    // CASCADE, so a failed run never leaves objects that block DROP ROLE.
    let schema = "crm";
    let prefix = unique("sod");
    let agent_owner = unique("agent_owner");
    let human_owner = unique("human_owner");
    w.superuser
        .batch_execute(&format!(
            "CREATE ROLE {agent_owner} NOLOGIN IN ROLE keyturn_agent, keyturn_approver; \
             CREATE ROLE {human_owner} NOLOGIN IN ROLE keyturn_approver; \
             CREATE FUNCTION crm.{prefix}_by_agent(id uuid, tok text) RETURNS text LANGUAGE sql SECURITY DEFINER \
               SET search_path = pg_catalog AS $$ SELECT status FROM keyturn.approve(id, tok) $$; \
             ALTER FUNCTION crm.{prefix}_by_agent(uuid, text) OWNER TO {agent_owner}; \
             CREATE FUNCTION crm.{prefix}_by_human(id uuid, tok text) RETURNS text LANGUAGE sql SECURITY DEFINER \
               SET search_path = pg_catalog AS $$ SELECT status FROM keyturn.approve(id, tok) $$; \
             ALTER FUNCTION crm.{prefix}_by_human(uuid, text) OWNER TO {human_owner}; \
             GRANT EXECUTE ON FUNCTION crm.{prefix}_by_agent(uuid, text), crm.{prefix}_by_human(uuid, text) TO app_human, app_agent;"
        ))
        .await
        .unwrap();
    // A wrapper owned by an agent member, called by the human: current_user is the agent.
    let r = w
        .human
        .query_one(
            &format!("SELECT {schema}.{prefix}_by_agent($1, $2)"),
            &[&p.id, &p.token],
        )
        .await;
    assert_eq!(sqlstate(r), "42501", "wrapper owned by an agent member");
    // A wrapper owned by a pure approver, called by the agent: the outer role is the agent.
    let r = w
        .agent
        .query_one(
            &format!("SELECT {schema}.{prefix}_by_human($1, $2)"),
            &[&p.id, &p.token],
        )
        .await;
    assert_eq!(sqlstate(r), "42501", "agent calling an approver's wrapper");
    assert_eq!(w.status(p.id).await, "pending");
    // Control: the approver's wrapper called by the human works.
    let ok: String = w
        .human
        .query_one(
            &format!("SELECT {schema}.{prefix}_by_human($1, $2)"),
            &[&p.id, &p.token],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ok, "queued");
    w.superuser
        .batch_execute(&format!(
            "DROP FUNCTION crm.{prefix}_by_agent(uuid, text), crm.{prefix}_by_human(uuid, text); DROP ROLE {agent_owner}, {human_owner}"
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn test_agent_cannot_reach_approve_at_all() {
    let w = World::new("member").await;
    let p = external_proposal(&w).await;
    assert_refused(&w.agent, &w, &p, "app_agent").await;
}

#[tokio::test]
async fn test_the_role_in_effect_decides_not_the_login_role() {
    // Separation of duties checks current_user and the role in effect after SET ROLE,
    // not the login role: a PostgREST authenticator logs in once and SETs ROLE
    // to the agent's or the human's role per request, so it is a member of
    // both. Refusing on the login role would refuse every approval made
    // through it. The deployment rule that follows (README, Roles): never give
    // the agent process a login that can SET ROLE into an approver role.
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let login = unique("authenticator");
    let agent = unique("agent_role");
    let human = unique("human_role");
    w.superuser
        .batch_execute(&format!(
            "CREATE ROLE {agent} NOLOGIN IN ROLE keyturn_agent; \
             CREATE ROLE {human} NOLOGIN IN ROLE keyturn_approver; \
             CREATE ROLE {login} LOGIN NOINHERIT; GRANT {agent}, {human} TO {login}"
        ))
        .await
        .unwrap();
    let c = Conn::connect(&login, w.identity()).await;
    c.batch_execute(&format!("SET ROLE {agent}")).await.unwrap();
    let p = propose_on(&c, &t, json!({"channel": "ops", "text": "hi"}), json!({}))
        .await
        .unwrap();
    // As the agent role, the same connection is refused ...
    assert_refused(&c, &w, &p, "authenticator while SET ROLE to the agent role").await;
    // ... as the human role, the request is the human's.
    c.batch_execute(&format!("SET ROLE {human}")).await.unwrap();
    let (status, _) = approve_on(&c, p.id, &p.token, None)
        .await
        .expect("approve as the human role");
    assert_eq!(status, "queued");
}
