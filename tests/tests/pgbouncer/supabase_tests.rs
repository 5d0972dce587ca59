//! Supabase and PostgREST (docs/supabase.md), through PgBouncer.
//!
//! A database of its own, `keyturn_supabase`, set up as the recipe says:
//! the claim paths of a Supabase token set by a superuser with `ALTER
//! DATABASE … SET` (tenant in `app_metadata.tenant_id`, a number; principal
//! and session where the access-token hook puts them), and the
//! `keyturn_api` wrapper schema of `contrib/postgrest-api.sql`. Each test
//! makes its own PostgREST roles: a NOINHERIT authenticator that may switch
//! to an agent role and a person's role.
//!
//! PostgREST is not packaged for Debian 12, so [`rpc`] issues what PostgREST
//! issues for `POST /rpc/<function>`: a transaction that sets the role and
//! the verified claims with `set_config(…, true)`, then calls the function
//! with named arguments taken from the JSON body.

use keyturn_tests::*;
use serde_json::{json, Value};
use tokio::sync::OnceCell;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

use crate::support::{autocommit, pooled};

const DB: &str = "keyturn_supabase";

/// The calls `contrib/postgrest-api.sql` wraps; nothing else may be there.
const API_CALLS: &[&str] = &[
    "action_status",
    "add_member",
    "approve",
    "approve_many",
    "archive_conversation",
    "audit",
    "cancel_origin",
    "current_principal",
    "current_session",
    "current_tenant",
    "delegate",
    "delegations",
    "end_session",
    "fence",
    "grant_tool",
    "pending",
    // preview(action_id, token) and preview(action_id, token, params):
    // PostgREST picks the overload by the keys sent.
    "preview",
    "preview",
    "propose",
    "record_request",
    "reject",
    "remove_member",
    "revise",
    "revoke_delegation",
    "revoke_tool",
    "stage_file",
];

async fn direct(role: &str, db: &str) -> Client {
    let url = format!("host=127.0.0.1 port={} user={role} dbname={db}", port());
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect as {role} to {db}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Role and privilege DDL, one test at a time: two concurrent GRANTs on one
/// object (schema crm, crm.deal) fail with "tuple concurrently updated".
async fn ddl(su: &Client, sql: &str) {
    su.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('keyturn pgbouncer tests ddl')); {sql}; COMMIT"
    ))
    .await
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn repo_file(path: &str) -> String {
    let full = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {full}: {e}"))
}

static SETUP: OnceCell<()> = OnceCell::const_new();

/// Makes `keyturn_supabase` once per run (again from scratch each run).
async fn setup() {
    SETUP
        .get_or_init(|| async {
            let su = connect("postgres").await;
            // One statement each: neither may run in a transaction block,
            // which a multi-statement query string is.
            su.batch_execute("SET client_min_messages = warning")
                .await
                .expect("quiet");
            for sql in [
                format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"),
                format!("CREATE DATABASE {DB}"),
            ] {
                su.batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            let db = direct("postgres", DB).await;
            db.batch_execute("CREATE EXTENSION pg_keyturn")
                .await
                .expect("create extension");
            let fixture = repo_file("tests/fixtures/crm.sql");
            let schema = &fixture[fixture
                .find("CREATE SCHEMA crm;")
                .expect("the fixture makes schema crm")..];
            db.batch_execute(schema).await.expect("the CRM schema");
            db.batch_execute(&repo_file("contrib/postgrest-api.sql"))
                .await
                .expect("contrib/postgrest-api.sql");
            db.batch_execute(&format!(
                "ALTER DATABASE {DB} SET keyturn.claim_tenant = 'app_metadata.tenant_id';
                 ALTER DATABASE {DB} SET keyturn.claim_principal = 'app_metadata.keyturn_principal';
                 ALTER DATABASE {DB} SET keyturn.claim_session = 'app_metadata.keyturn_session';
                 ALTER DATABASE {DB} SET keyturn.claim_numbers = on;"
            ))
            .await
            .expect("claim paths for the database");
        })
        .await;
}

/// The PostgREST roles of one test, and a person with a grant for an sql
/// tool and a deal.
struct Site {
    authenticator: String,
    agent_role: String,
    person_role: String,
    anon_role: String,
    tenant: i64,
    user: String,
    session: String,
    tool: String,
    deal: i64,
    /// Direct, as the superuser, in keyturn_supabase.
    su: Client,
}

impl Site {
    async fn new() -> Site {
        setup().await;
        let su = direct("postgres", DB).await;
        let authenticator = unique("sb_authenticator");
        let agent_role = unique("sb_agent");
        let person_role = unique("sb_person");
        let anon_role = unique("sb_anon");
        ddl(&su, &format!(
            "CREATE ROLE {anon_role} NOLOGIN;
             CREATE ROLE {agent_role} NOLOGIN IN ROLE keyturn_agent;
             CREATE ROLE {person_role} NOLOGIN IN ROLE keyturn_approver;
             CREATE ROLE {authenticator} LOGIN NOINHERIT IN ROLE {anon_role}, {agent_role}, {person_role};
             GRANT USAGE ON SCHEMA crm TO {agent_role}, {person_role};
             GRANT SELECT ON crm.deal TO {agent_role};
             GRANT SELECT, UPDATE ON crm.deal TO {person_role};"
        )).await;
        let tenant = random_id();
        let user = uuid::Uuid::new_v4().to_string();
        let session = uuid::Uuid::new_v4().to_string();
        let tool = unique("sb_deal_stage");
        let admin = direct("app_admin", DB).await;
        admin
            .query_typed(
                "SELECT keyturn.add_member($1, $2, 'member')",
                &[(&tenant.to_string(), Type::TEXT), (&user, Type::TEXT)],
            )
            .await
            .expect("add_member");
        let spec = json!({
            "executor": "sql", "effect": "reversible",
            "summary": "Set stage {set.stage} on {count} deal(s)",
            "sql": {"table": "crm.deal", "key": "id", "version": "xmin",
                    "set": ["stage"], "where": ["id", "owner"]}});
        admin
            .query_typed(
                "SELECT keyturn.register_tool($1, $2)",
                &[(&tool, Type::TEXT), (&spec, Type::JSONB)],
            )
            .await
            .expect("register_tool");
        admin
            .query_typed(
                "SELECT keyturn.grant_tool($1, $2, $3)",
                &[
                    (&tenant.to_string(), Type::TEXT),
                    (&user, Type::TEXT),
                    (&tool, Type::TEXT),
                ],
            )
            .await
            .expect("grant_tool");
        let deal = random_id();
        su.query_typed(
            "INSERT INTO crm.deal (id, tenant, owner, name, stage) VALUES ($1, $2, $3, 'Northwind', 'qualified')",
            &[(&deal, Type::INT8), (&tenant.to_string(), Type::TEXT), (&user, Type::TEXT)],
        )
        .await
        .expect("a deal");
        Site {
            authenticator,
            agent_role,
            person_role,
            anon_role,
            tenant,
            user,
            session,
            tool,
            deal,
            su,
        }
    }

    /// The claims of a Supabase access token for this person, as the
    /// recipe's hook leaves them: `role` chooses the PostgREST role, the
    /// tenant is a number, the keyturn principal and session are in
    /// `app_metadata`.
    fn claims(&self, role: &str, tenant: i64) -> Value {
        json!({
            "aud": "authenticated",
            "exp": 4_102_444_800_i64,
            "iat": 1_700_000_000_i64,
            "iss": "http://127.0.0.1:54321/auth/v1",
            "sub": self.user,
            "email": "alice@example.com",
            "phone": "",
            "role": role,
            "aal": "aal1",
            "amr": [{"method": "password", "timestamp": 1_700_000_000_i64}],
            "session_id": self.session,
            "is_anonymous": false,
            "app_metadata": {
                "provider": "email",
                "providers": ["email"],
                "tenant_id": tenant,
                "keyturn_principal": self.user,
                "keyturn_session": self.session
            },
            "user_metadata": {"tenant_id": "someone-elses", "full_name": "Alice"}
        })
    }

    async fn pooled(&self) -> Client {
        pooled(
            crate::support::bouncer_port().expect("checked by the test"),
            &self.authenticator,
            DB,
        )
        .await
    }

    async fn stage(&self) -> String {
        self.su
            .query_typed(
                "SELECT stage FROM crm.deal WHERE id = $1",
                &[(&self.deal, Type::INT8)],
            )
            .await
            .expect("stage")[0]
            .get(0)
    }
}

/// A function as PostgREST's schema cache knows it: its arguments (name and
/// SQL type) and whether it returns a scalar (the body is then the value
/// itself) or rows (a JSON array of objects).
struct Call {
    name: &'static str,
    args: &'static [(&'static str, &'static str)],
    scalar: bool,
}

const PROPOSE: Call = Call {
    name: "propose",
    args: &[("tool", "text"), ("params", "jsonb")],
    scalar: false,
};
const APPROVE: Call = Call {
    name: "approve",
    args: &[("action_id", "uuid"), ("token", "text")],
    scalar: false,
};
const PREVIEW: Call = Call {
    name: "preview",
    args: &[("action_id", "uuid"), ("token", "text")],
    scalar: true,
};

/// `POST /rpc/<function>` with `body`, as PostgREST runs it for a request
/// whose verified JWT is `claims` (a `None` claims is an anonymous request
/// as `role`). Returns the response body.
async fn rpc(
    c: &Client,
    role: &str,
    claims: Option<&Value>,
    call: &Call,
    body: &Value,
) -> Result<Value, tokio_postgres::Error> {
    c.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
        .await?;
    let called = async {
        let claims = claims.map(Value::to_string).unwrap_or_default();
        let path = format!("/rpc/{}", call.name);
        c.query_typed(
            "SELECT set_config('search_path', 'keyturn_api', true), set_config('role', $1, true), \
                    set_config('request.jwt.claims', $2, true), set_config('request.method', 'POST', true), \
                    set_config('request.path', $3, true)",
            &[(&role, Type::TEXT), (&claims, Type::TEXT), (&path, Type::TEXT)],
        )
        .await?;
        let list = |f: &dyn Fn(&str, &str) -> String| {
            call.args
                .iter()
                .map(|(n, t)| f(n, t))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let columns = list(&|n, _| format!("\"{n}\""));
        let types = list(&|n, t| format!("\"{n}\" {t}"));
        let named = list(&|n, _| format!("\"{n}\" := pgrst_body.\"{n}\""));
        let function = format!("\"keyturn_api\".\"{}\"({named})", call.name);
        let (lateral, output) = if call.scalar {
            (
                format!("LATERAL (SELECT {function} pgrst_scalar) pgrst_call"),
                "coalesce((json_agg(_postgrest_t.pgrst_scalar) -> 0)::text, 'null')",
            )
        } else {
            (
                format!("LATERAL {function} pgrst_call"),
                "coalesce(json_agg(_postgrest_t), '[]')::text",
            )
        };
        let sql = format!(
            "WITH pgrst_source AS (SELECT pgrst_call.* FROM (SELECT $1::json AS json_data) pgrst_payload, \
             LATERAL (SELECT {columns} FROM json_to_record(pgrst_payload.json_data) AS _({types}) LIMIT 1) pgrst_body, \
             {lateral}) \
             SELECT {output} FROM (SELECT * FROM pgrst_source) _postgrest_t"
        );
        let rows = c
            .query_typed(&sql, &[(&body.to_string(), Type::TEXT)])
            .await?;
        let text: String = rows[0].get(0);
        Ok(serde_json::from_str::<Value>(&text).expect("PostgREST's body is JSON"))
    }
    .await;
    c.batch_execute(if called.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .await?;
    called
}

fn code(r: Result<Value, tokio_postgres::Error>) -> String {
    sqlstate(r)
}

fn detail(r: Result<Value, tokio_postgres::Error>) -> String {
    let e = r.expect_err("expected an error");
    e.as_db_error()
        .map(|d| format!("{} | {}", d.message(), d.detail().unwrap_or_default()))
        .unwrap_or_else(|| e.to_string())
}

/// Proposes as the agent's role over RPC; returns (action_id, token).
async fn propose_as_agent(s: &Site, c: &Client) -> (String, String) {
    let body = rpc(
        c,
        &s.agent_role,
        Some(&s.claims(&s.agent_role, s.tenant)),
        &PROPOSE,
        &json!({"tool": s.tool, "params": {"where": {"id": s.deal}, "set": {"stage": "negotiation"}}}),
    )
    .await
    .expect("propose over RPC");
    let row = &body[0];
    assert_eq!(row["status"], "pending", "{body}");
    (
        row["action_id"].as_str().expect("action_id").to_owned(),
        row["token"].as_str().expect("token").to_owned(),
    )
}

#[tokio::test]
async fn test_supabase_claims_propose_and_approve_over_rpc() {
    require_bouncer!();
    let s = Site::new().await;
    let c = s.pooled().await;
    let (action_id, token) = propose_as_agent(&s, &c).await;

    let person = s.claims(&s.person_role, s.tenant);
    let card = rpc(
        &c,
        &s.person_role,
        Some(&person),
        &PREVIEW,
        &json!({"action_id": action_id, "token": token}),
    )
    .await
    .expect("preview over RPC");
    assert_eq!(card["targets"][0]["key"], s.deal.to_string(), "{card}");
    let body = rpc(
        &c,
        &s.person_role,
        Some(&person),
        &APPROVE,
        &json!({"action_id": action_id, "token": token}),
    )
    .await
    .expect("approve over RPC");
    assert_eq!(body[0]["status"], "succeeded", "{body}");
    assert_eq!(s.stage().await, "negotiation");
    // The audit names the person's role, the one PostgREST switched to.
    let roles: Vec<String> = s
        .su
        .query_typed(
            "SELECT DISTINCT db_role FROM keyturn.event WHERE action_id = $1::uuid AND to_status = 'succeeded'",
            &[(&action_id, Type::TEXT)],
        )
        .await
        .expect("events")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(roles, vec![s.person_role.clone()]);
}

#[tokio::test]
async fn test_every_rule_holds_through_the_api_schema() {
    require_bouncer!();
    let s = Site::new().await;
    let c = s.pooled().await;
    let (action_id, token) = propose_as_agent(&s, &c).await;
    let ids = json!({"action_id": action_id, "token": token});
    let person = s.claims(&s.person_role, s.tenant);

    // Separation of duties: the agent's role may not call approve at all,
    // and a role that could (one in both group roles) is refused by keyturn.
    let r = rpc(
        &c,
        &s.agent_role,
        Some(&s.claims(&s.agent_role, s.tenant)),
        &APPROVE,
        &ids,
    )
    .await;
    assert!(
        detail(r).contains("permission denied for function approve"),
        "the agent's role has no EXECUTE on the wrapper"
    );
    let dual = unique("sb_dual");
    ddl(
        &s.su,
        &format!(
        "CREATE ROLE {dual} NOLOGIN IN ROLE keyturn_agent, keyturn_approver; GRANT {dual} TO {}",
        s.authenticator
    ),
    )
    .await;
    let r = rpc(&c, &dual, Some(&person), &APPROVE, &ids).await;
    assert!(
        detail(r).contains("is a member of keyturn_agent"),
        "keyturn's own separation of duties, through the wrapper"
    );
    // Each role executes exactly its own calls: a person does not propose,
    // an anonymous request calls nothing.
    let propose_body =
        json!({"tool": s.tool, "params": {"where": {"id": s.deal}, "set": {"stage": "won"}}});
    let r = rpc(&c, &s.person_role, Some(&person), &PROPOSE, &propose_body).await;
    assert!(
        detail(r).contains("permission denied for function propose"),
        "the person's role may not propose"
    );
    let r = rpc(&c, &s.anon_role, None, &APPROVE, &ids).await;
    assert_eq!(code(r), "42501", "anonymous");
    // Identity: none, or another tenant's, is refused.
    let r = rpc(&c, &s.person_role, None, &APPROVE, &ids).await;
    assert!(detail(r).contains("missing identity"), "no claims");
    let other_tenant = random_id();
    direct("app_admin", DB)
        .await
        .query_typed(
            "SELECT keyturn.add_member($1, $2, 'member')",
            &[
                (&other_tenant.to_string(), Type::TEXT),
                (&s.user, Type::TEXT),
            ],
        )
        .await
        .expect("member of a second tenant");
    let r = rpc(
        &c,
        &s.person_role,
        Some(&s.claims(&s.person_role, other_tenant)),
        &APPROVE,
        &ids,
    )
    .await;
    assert_eq!(code(r), "55000", "another tenant's action is invisible");
    // A login that inherits both sides is refused even through a wrapper.
    // (Its approver role has no grant on crm.deal: a login that inherits an
    // agent role and may write a gated table would stop every test's
    // register_tool, rightly.)
    let both = unique("sb_both");
    let approver = unique("sb_approver");
    ddl(
        &s.su,
        &format!(
            "CREATE ROLE {approver} NOLOGIN IN ROLE keyturn_approver;
         CREATE ROLE {both} LOGIN INHERIT IN ROLE {}, {approver}",
            s.agent_role
        ),
    )
    .await;
    let inherits = pooled(crate::support::bouncer_port().expect("port"), &both, DB).await;
    let r = rpc(&inherits, &approver, Some(&person), &APPROVE, &ids).await;
    assert_eq!(code(r), "42501", "inherits keyturn_agent");
    assert_eq!(s.stage().await, "qualified", "nothing ran");

    // And the person still approves it: the refusals used nothing up.
    let body = rpc(&c, &s.person_role, Some(&person), &APPROVE, &ids)
        .await
        .expect("approve");
    assert_eq!(body[0]["status"], "succeeded", "{body}");

    // The schema holds invoker wrappers of exactly the public calls, no
    // tables, and each wrapper is executable by exactly the roles of the
    // function it wraps.
    let rows = s
        .su
        .query_typed(
            "SELECT p.proname::text, p.prosecdef,
                    (SELECT array_agg(coalesce(a.grantee::regrole::text, 'PUBLIC') ORDER BY 1) FROM aclexplode(p.proacl) a
                      WHERE a.grantee <> p.proowner) AS api_grants,
                    (SELECT array_agg(coalesce(a.grantee::regrole::text, 'PUBLIC') ORDER BY 1)
                       FROM pg_proc k, aclexplode(k.proacl) a
                      WHERE k.pronamespace = 'keyturn'::regnamespace AND k.proname = p.proname
                        AND pg_get_function_identity_arguments(k.oid) = pg_get_function_identity_arguments(p.oid)
                        AND a.grantee <> k.proowner) AS keyturn_grants
               FROM pg_proc p WHERE p.pronamespace = 'keyturn_api'::regnamespace ORDER BY 1",
            &[],
        )
        .await
        .expect("keyturn_api functions");
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(names, API_CALLS);
    for r in &rows {
        let name: String = r.get(0);
        assert!(!r.get::<_, bool>(1), "{name} must be SECURITY INVOKER");
        let api: Option<Vec<String>> = r.get(2);
        let keyturn: Option<Vec<String>> = r.get(3);
        assert_eq!(api, keyturn, "{name}: the grants of keyturn.{name}");
    }
    let tables: i64 =
        s.su.query_typed(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'keyturn_api'::regnamespace",
            &[],
        )
        .await
        .expect("relations")[0]
            .get(0);
    assert_eq!(tables, 0, "no tables, views or sequences");
}

#[tokio::test]
async fn test_session_level_claims_are_refused_over_rpc() {
    let port = require_bouncer!();
    let s = Site::new().await;
    let c = pooled(port, &s.authenticator, DB).await;
    let claims = s.claims(&s.agent_role, s.tenant).to_string();
    autocommit(
        &c,
        "SELECT set_config('request.jwt.claims', $1, false)",
        &[(&claims, Type::TEXT)],
    )
    .await
    .expect("session-level claims");
    // The request sets its role but leaves the claims as the connection has them.
    c.batch_execute("BEGIN").await.expect("begin");
    c.query_typed(
        "SELECT set_config('role', $1, true)",
        &[(&s.agent_role, Type::TEXT)],
    )
    .await
    .expect("role");
    let r = c
        .query_typed(
            "SELECT action_id FROM keyturn_api.propose($1, $2)",
            &[
                (&s.tool, Type::TEXT),
                (
                    &json!({"where": {"id": s.deal}, "set": {"stage": "won"}}),
                    Type::JSONB,
                ),
            ],
        )
        .await;
    c.batch_execute("ROLLBACK").await.expect("rollback");
    let e = r.expect_err("session-level claims are no identity");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    assert!(
        e.as_db_error()
            .and_then(|d| d.detail())
            .unwrap_or_default()
            .contains("request.jwt.claims is set for the whole session"),
        "{e:?}"
    );
}

#[tokio::test]
async fn test_claim_paths_are_per_database_and_only_a_superuser_sets_them() {
    let port = require_bouncer!();
    let s = Site::new().await;
    let claims = s.claims(&s.agent_role, s.tenant).to_string();
    let identity_sql =
        "SELECT keyturn.current_tenant(), keyturn.current_principal(), keyturn.current_session()";
    async fn identity_under(
        c: &Client,
        claims: &str,
        sql: &str,
    ) -> (Option<String>, Option<String>, Option<String>) {
        c.batch_execute("BEGIN").await.expect("begin");
        c.query_typed(
            "SELECT set_config('request.jwt.claims', $1, true)",
            &[(&claims, Type::TEXT)],
        )
        .await
        .expect("claims");
        let rows = c.query_typed(sql, &[]).await.expect("identity");
        c.batch_execute("COMMIT").await.expect("commit");
        (rows[0].get(0), rows[0].get(1), rows[0].get(2))
    }
    // The database's paths: the tenant is the number's text.
    let here = pooled(port, "app_agent", DB).await;
    assert_eq!(
        identity_under(&here, &claims, identity_sql).await,
        (
            Some(s.tenant.to_string()),
            Some(s.user.clone()),
            Some(s.session.clone())
        )
    );
    // A string tenant reads the same.
    let mut as_text = s.claims(&s.agent_role, s.tenant);
    as_text["app_metadata"]["tenant_id"] = json!(s.tenant.to_string());
    assert_eq!(
        identity_under(&here, &as_text.to_string(), identity_sql)
            .await
            .0,
        Some(s.tenant.to_string())
    );
    // Database keyturn keeps the defaults (tenant_id, sub, session_id).
    let elsewhere = pooled(port, "app_agent", "keyturn").await;
    assert_eq!(
        identity_under(&elsewhere, &claims, identity_sql).await,
        (None, Some(s.user.clone()), Some(s.session.clone()))
    );

    // Without keyturn.claim_numbers a numeric tenant is missing identity,
    // and the detail says how to accept it.
    let strict = unique("sb_strict");
    ddl(
        &s.su,
        &format!(
            "CREATE ROLE {strict} LOGIN IN ROLE keyturn_agent; \
         ALTER ROLE {strict} IN DATABASE {DB} SET keyturn.claim_numbers = off"
        ),
    )
    .await;
    let strict_conn = pooled(port, &strict, DB).await;
    assert_eq!(
        identity_under(&strict_conn, &claims, identity_sql).await.0,
        None
    );
    strict_conn.batch_execute("BEGIN").await.expect("begin");
    strict_conn
        .query_typed(
            "SELECT set_config('request.jwt.claims', $1, true)",
            &[(&claims, Type::TEXT)],
        )
        .await
        .expect("claims");
    let r = strict_conn
        .query_typed(
            "SELECT action_id FROM keyturn.propose($1, $2)",
            &[(&s.tool, Type::TEXT), (&json!({}), Type::JSONB)],
        )
        .await;
    strict_conn
        .batch_execute("ROLLBACK")
        .await
        .expect("rollback");
    let e = r.expect_err("a number without claim_numbers");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    let d = e.as_db_error().and_then(|d| d.detail()).unwrap_or_default();
    assert!(
        d.contains("app_metadata.tenant_id") && d.contains("keyturn.claim_numbers = on"),
        "{d}"
    );

    // A caller cannot point a path elsewhere (user_metadata is editable by
    // the user in Supabase). In a backend that has not loaded keyturn yet
    // PostgreSQL accepts the SET as a placeholder, and discards it when
    // keyturn defines the setting as superuser-only.
    let fresh = direct("app_agent", DB).await;
    fresh
        .batch_execute("SET keyturn.claim_tenant = 'user_metadata.tenant_id'")
        .await
        .expect("a placeholder before keyturn is loaded");
    assert_eq!(
        identity_under(&fresh, &claims, identity_sql).await.0,
        Some(s.tenant.to_string()),
        "the database's path, never the caller's"
    );
    let e = fresh
        .batch_execute("SET keyturn.claim_tenant = 'user_metadata.tenant_id'")
        .await
        .expect_err("once keyturn is loaded, the setting is superuser-only");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
}

#[tokio::test]
async fn test_check_deployment_reports_the_authenticator_only() {
    require_bouncer!();
    let s = Site::new().await;
    let rows =
        s.su.query_typed(
            "SELECT severity, object, problem FROM keyturn.check_deployment() \
              WHERE object IN ($1, $2, $3, $4) OR problem LIKE '%keyturn_api%'",
            &[
                (&s.authenticator, Type::TEXT),
                (&s.agent_role, Type::TEXT),
                (&s.person_role, Type::TEXT),
                (&s.anon_role, Type::TEXT),
            ],
        )
        .await
        .expect("check_deployment");
    let found: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        found,
        vec![("warning".to_owned(), s.authenticator.clone())],
        "{:?}",
        rows.iter()
            .map(|r| r.get::<_, String>(2))
            .collect::<Vec<_>>()
    );
    let problem: String = rows[0].get(2);
    assert!(problem.contains("SET ROLE"), "{problem}");
}
