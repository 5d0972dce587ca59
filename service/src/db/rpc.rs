//! The SQL of `/rpc` ([`crate::rpc`]): the person's call in one transaction
//! as PostgREST runs it (the role, the verified claims, the call), the
//! routing questions asked on layout B, the catalog of exposed functions,
//! and the start-up checks of the RPC login. The statement of each call is
//! built by [`crate::rpc::catalog`] from that catalog; it runs here.

use serde_json::Value;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use super::{bounded, get, STATEMENT_TIMEOUT};
use crate::error::Error;

/// A quoted identifier.
pub fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Runs the rest of `tx` as `role`, each statement bounded by
/// [`STATEMENT_TIMEOUT`] on the server too.
pub async fn run_as(tx: &Transaction<'_>, role: &str) -> Result<(), Error> {
    bounded(tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}; SET LOCAL ROLE {}",
        STATEMENT_TIMEOUT.as_millis(),
        ident(role)
    )))
    .await
}

/// Asserts the verified `claims` for the rest of `tx`, as PostgREST does.
pub async fn assert_claims(tx: &Transaction<'_>, claims: &str) -> Result<(), Error> {
    bounded(tx.query_typed(
        "SELECT pg_catalog.set_config('request.jwt.claims', $1, true)",
        &[(&claims, Type::TEXT)],
    ))
    .await?;
    Ok(())
}

/// [`assert_claims`], and whether keyturn's tables are distributed by
/// tenant (`keyturn.dispatch_by_tenant()`), in one round trip.
pub async fn assert_claims_by_tenant(tx: &Transaction<'_>, claims: &str) -> Result<bool, Error> {
    let row = bounded(tx.query_typed_one(
        "SELECT pg_catalog.set_config('request.jwt.claims', $1, true) IS NOT NULL AS set, \
                keyturn.dispatch_by_tenant() AS by_tenant",
        &[(&claims, Type::TEXT)],
    ))
    .await?;
    get(&row, "by_tenant")
}

/// The tenant of the uncertain action the call's `action_id` names, as the
/// caller may see it in `keyturn.uncertain_actions()`.
pub async fn uncertain_action_tenant(
    tx: &Transaction<'_>,
    args: &Value,
) -> Result<Option<String>, Error> {
    let row = bounded(tx.query_typed_opt(
        "SELECT u.tenant FROM keyturn.uncertain_actions() u \
          WHERE u.action_id = ($1 ->> 'action_id')::uuid",
        &[(args, Type::JSONB)],
    ))
    .await?;
    row.map(|r| get(&r, "tenant")).transpose()
}

/// The tenant the asserted `claims` name; when they name one, the claims are
/// also asserted as a `SET LOCAL` that Citus propagates, so that the call it
/// runs on the tenant's worker resolves the same identity (docs/scale-out.md,
/// "Identity on the workers"); the statement is the database's, quoted there.
pub async fn callers_tenant(tx: &Transaction<'_>, claims: &str) -> Result<Option<String>, Error> {
    let row = bounded(tx.query_typed_one(
        "SELECT keyturn.current_tenant() AS tenant, \
                pg_catalog.format('SET LOCAL citus.propagate_set_commands = local; \
                                   SET LOCAL request.jwt.claims = %L', $1::pg_catalog.text) AS assert",
        &[(&claims, Type::TEXT)],
    ))
    .await?;
    let tenant: Option<String> = get(&row, "tenant")?;
    let assert: String = get(&row, "assert")?;
    if tenant.is_some() {
        bounded(tx.batch_execute(&assert)).await?;
    }
    Ok(tenant)
}

/// Runs a call's statement (built by the catalog: `$1` the arguments as
/// JSON, `$2` the tenant of a tenant-explicit form) and returns its one
/// JSON value.
pub async fn call(
    tx: &Transaction<'_>,
    sql: &str,
    args: &Value,
    tenant: Option<&str>,
) -> Result<Option<Value>, Error> {
    let row = match tenant {
        None => bounded(tx.query_typed_one(sql, &[(args, Type::JSONB)])).await?,
        Some(tenant) => {
            bounded(tx.query_typed_one(sql, &[(args, Type::JSONB), (&tenant, Type::TEXT)])).await?
        }
    };
    row.try_get(0).map_err(Error::Decode)
}

/// One function of the catalog, as `pg_proc` describes it.
#[derive(Clone, Debug)]
pub struct ProcRow {
    pub name: String,
    pub returns_set: bool,
    pub returns_void: bool,
    pub defaults: i32,
    pub arg_names: Option<Vec<String>>,
    pub arg_modes: Option<Vec<String>>,
    pub input_types: Vec<String>,
}

/// The `keyturn.<name>` functions of `names` the database has, in name
/// order (overloads by oid).
pub async fn functions(client: &Client, names: &[String]) -> Result<Vec<ProcRow>, Error> {
    let rows = bounded(client.query_typed(
        "SELECT p.proname::text AS name, p.proretset AS returns_set, \
                p.prorettype = 'pg_catalog.void'::pg_catalog.regtype AS returns_void, \
                p.pronargdefaults::int AS defaults, \
                p.proargnames AS arg_names, p.proargmodes::text[] AS arg_modes, \
                ARRAY(SELECT pg_catalog.format_type(t.oid, NULL) \
                        FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS t(oid, ord) \
                       ORDER BY t.ord) AS input_types \
           FROM pg_catalog.pg_proc p \
           JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'keyturn' AND p.proname = ANY ($1) AND p.prokind = 'f' \
          ORDER BY p.proname, p.oid",
        &[(&names, Type::TEXT_ARRAY)],
    ))
    .await?;
    rows.iter()
        .map(|row| {
            Ok(ProcRow {
                name: get(row, "name")?,
                returns_set: get(row, "returns_set")?,
                returns_void: get(row, "returns_void")?,
                defaults: get(row, "defaults")?,
                arg_names: get(row, "arg_names")?,
                arg_modes: get(row, "arg_modes")?,
                input_types: get(row, "input_types")?,
            })
        })
        .collect()
}

/// What the database says of one role of `KEYTURN_JWT_ROLES` and the RPC
/// login.
#[derive(Clone, Debug)]
pub struct RoleCheck {
    /// The role.
    pub name: String,
    /// It exists.
    pub present: bool,
    /// It is a member of `keyturn_agent`.
    pub agent: bool,
    /// The login is a member of it.
    pub can_set: bool,
    /// The login inherits `keyturn_agent`'s privileges.
    pub login_inherits_agent: bool,
    /// The login.
    pub login: String,
}

/// [`RoleCheck`] of each of `roles`, in order.
pub async fn role_checks(client: &Client, roles: &[String]) -> Result<Vec<RoleCheck>, Error> {
    let rows = bounded(client.query_typed(
        "SELECT w.name, r.oid IS NOT NULL AS present, \
                coalesce(pg_catalog.pg_has_role(r.oid, 'keyturn_agent', 'MEMBER'), false) AS agent, \
                coalesce(pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER'), false) AS can_set, \
                pg_catalog.pg_has_role(session_user, 'keyturn_agent', 'USAGE') AS login_inherits_agent, \
                session_user::text AS login \
           FROM unnest($1::text[]) WITH ORDINALITY AS w(name, ord) \
           LEFT JOIN pg_catalog.pg_roles r ON r.rolname = w.name ORDER BY w.ord",
        &[(&roles, Type::TEXT_ARRAY)],
    ))
    .await?;
    rows.iter()
        .map(|row| {
            Ok(RoleCheck {
                name: get(row, "name")?,
                present: get(row, "present")?,
                agent: get(row, "agent")?,
                can_set: get(row, "can_set")?,
                login_inherits_agent: get(row, "login_inherits_agent")?,
                login: get(row, "login")?,
            })
        })
        .collect()
}

/// Those of `roles` that are the human side alone: members of
/// `keyturn_approver` and of neither `keyturn_operator` nor `keyturn_admin`,
/// in order.
pub async fn human_roles(client: &Client, roles: &[String]) -> Result<Vec<String>, Error> {
    let rows = bounded(client.query_typed(
        "SELECT w.name FROM unnest($1::text[]) WITH ORDINALITY AS w(name, ord) \
           JOIN pg_catalog.pg_roles r ON r.rolname = w.name \
          WHERE pg_catalog.pg_has_role(r.oid, 'keyturn_approver', 'MEMBER') \
            AND NOT pg_catalog.pg_has_role(r.oid, 'keyturn_operator', 'MEMBER') \
            AND NOT pg_catalog.pg_has_role(r.oid, 'keyturn_admin', 'MEMBER') \
          ORDER BY w.ord",
        &[(&roles, Type::TEXT_ARRAY)],
    ))
    .await?;
    rows.iter().map(|row| get(row, "name")).collect()
}

/// `SET ROLE role` tried in a transaction rolled back at once: the proof
/// that the login can.
pub async fn try_set_role(client: &Client, role: &str) -> Result<(), Error> {
    let tried =
        bounded(client.batch_execute(&format!("BEGIN; SET LOCAL ROLE {}; ROLLBACK", ident(role))))
            .await;
    if tried.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    tried
}

/// What `keyturn.redeem_link_code` answers for a code: the card session's
/// bearer, its end, a fresh token per action, the role its calls run as
/// (`None`: keyturnd's card role). `None` for a code that does not redeem.
pub struct Redeemed {
    pub session: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    pub tokens: Value,
    pub db_role: Option<String>,
}

/// Redeems a link code, once; on the dispatcher's connection (the function
/// is the dispatcher's).
pub async fn redeem_link_code(
    client: &tokio_postgres::Transaction<'_>,
    code: &str,
    action_ids: &[uuid::Uuid],
) -> Result<Option<Redeemed>, Error> {
    let row = bounded(client.query_typed_opt(
        "SELECT session, expires_at, tokens, db_role FROM keyturn.redeem_link_code($1, $2)",
        &[(&code, Type::TEXT), (&action_ids, Type::UUID_ARRAY)],
    ))
    .await?;
    row.map(|r| {
        Ok(Redeemed {
            session: get(&r, "session")?,
            expires_at: get(&r, "expires_at")?,
            tokens: get(&r, "tokens")?,
            db_role: get(&r, "db_role")?,
        })
    })
    .transpose()
}

/// A live card session: the role its calls run as (`None`: keyturnd's card
/// role), the claims that assert its person, and its actions.
pub struct CardSession {
    pub db_role: Option<String>,
    pub claims: Value,
    pub action_ids: Vec<uuid::Uuid>,
}

/// The card session a bearer names, while it lives; `None` otherwise.
pub async fn card_session(client: &Client, bearer: &str) -> Result<Option<CardSession>, Error> {
    let row = bounded(client.query_typed_opt(
        "SELECT db_role, claims, action_ids FROM keyturn.card_session($1)",
        &[(&bearer, Type::TEXT)],
    ))
    .await?;
    row.map(|r| {
        Ok(CardSession {
            db_role: get(&r, "db_role")?,
            claims: get(&r, "claims")?,
            action_ids: get(&r, "action_ids")?,
        })
    })
    .transpose()
}
