//! `POST /rpc/<function>`: the human's and the operator's keyturn calls over
//! HTTP, run the way PostgREST runs RPC, so a client written for PostgREST
//! (schema `keyturn` exposed) works unchanged against keyturnd.
//!
//! Each request is one transaction on the RPC pool (`KEYTURN_RPC_DATABASE_URL`,
//! a NOINHERIT login, never the dispatcher's):
//!
//! ```sql
//! BEGIN;
//! SET LOCAL statement_timeout = …; SET LOCAL ROLE "<role claim>";
//! SELECT set_config('request.jwt.claims', '<the verified claims>', true);
//! SELECT … FROM keyturn.<function>(<arg> => …);   -- see [`catalog`]
//! COMMIT;
//! ```
//!
//! The caller is a person's JWT, or a card session: the short bearer a
//! link's one-time code was redeemed for ([`card`]), which may only preview
//! and decide the link's actions.
//!
//! keyturnd decides nothing here: it verifies the JWT (see [`crate::jwt`]),
//! keeps to the function and role allowlists, and the database applies every
//! rule to the identity the claims assert. Database errors answer with their
//! SQLSTATE, message, detail and hint ([`crate::error`]); a server-side
//! failure is logged with every string of the request blanked out, so a
//! token or a JWT never reaches the log.

pub mod card;
pub mod catalog;

use deadpool_postgres::Pool;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db;
use crate::error::Error;
use crate::jwt::{Verified, Verifier};
use crate::metrics::Metrics;
use catalog::{Catalog, TenantOf};

/// Everything `/rpc` needs.
pub struct Rpc {
    verifier: Verifier,
    catalog: Catalog,
    pool: Pool,
    /// Card sessions (see [`card`]): redeemed and resolved on the
    /// dispatcher's connection, whose functions they are.
    cards: Option<card::Cards>,
}

impl std::fmt::Debug for Rpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rpc")
            .field("verifier", &self.verifier)
            .field("functions", &self.catalog.names())
            .finish()
    }
}

impl Rpc {
    /// Assembles `/rpc` from its parts (tests build one with a catalog of
    /// their own and a pool that is never used).
    pub fn new(verifier: Verifier, catalog: Catalog, pool: Pool) -> Rpc {
        Rpc {
            verifier,
            catalog,
            pool,
            cards: None,
        }
    }

    /// With card sessions, redeemed and resolved on `dispatcher`, their
    /// calls run as the role the link's code names or else `card_role`.
    pub fn with_cards(mut self, dispatcher: Pool, card_role: Option<String>) -> Rpc {
        self.cards = Some(card::Cards::new(dispatcher, card_role));
        self
    }

    /// `POST /card/session`: a link's one-time code, redeemed for a card
    /// session (see [`card`]).
    pub async fn redeem(&self, body: &[u8]) -> Result<Value, Error> {
        let cards = self.cards.as_ref().ok_or(Error::NotReady)?;
        cards.redeem(body, |role| self.verifier.allows(role)).await
    }

    /// `/rpc` as configured, once the database has answered the start-up
    /// checks ([`check_roles`]) and the catalog is read. `Ok(None)`: `/rpc`
    /// is off (no JWT key), or shutdown came first. A failed check is an
    /// error: keyturnd does not start.
    pub async fn start(
        config: &Config,
        metrics: std::sync::Arc<Metrics>,
        dispatcher: Pool,
        shutdown: &CancellationToken,
    ) -> Result<Option<Rpc>, Error> {
        let Some(verifier) = Verifier::from_config(config)? else {
            return Ok(None);
        };
        let url = config.rpc_database_url.as_ref().ok_or_else(|| {
            Error::Config("KEYTURN_RPC_DATABASE_URL is required with a JWT key".into())
        })?;
        let pool = db::pool_named(url.expose(), config.rpc_connections, metrics, "rpc")?;
        let roles: Vec<String> = verifier.roles().map(str::to_owned).collect();
        let answered = db::until_answered(
            shutdown,
            "RPC database unavailable; waiting for it before serving /rpc",
            || async {
                let client = pool.get().await?;
                check_roles(&client, &roles).await?;
                let human = db::rpc::human_roles(&client, &roles).await?;
                Ok((Catalog::load(&client).await?, human))
            },
        )
        .await?;
        let Some((catalog, human)) = answered else {
            return Ok(None);
        };
        tracing::info!(functions = ?catalog.names(), roles = ?roles, "serving /rpc");
        let card_role = card_role(config.card_role.clone(), &human);
        Ok(Some(
            Rpc::new(verifier, catalog, pool).with_cards(dispatcher, card_role),
        ))
    }

    /// Runs `function` for the request with `authorization` and `body`.
    pub async fn call(
        &self,
        function: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<Value, Error> {
        // Who calls comes first, as it always did: a request with no valid
        // credential learns nothing about its body.
        match (card::bearer_of(authorization), &self.cards) {
            (Some(bearer), Some(cards)) => {
                self.as_card(cards, bearer, function, body, card::CARD_FUNCTIONS)
                    .await
            }
            _ => {
                let verified = self.verifier.verify(authorization)?;
                self.run(function, verified, parse_body(body)?).await
            }
        }
    }

    /// `POST /card/token`: a fresh token for one of a card session's
    /// actions (`{"action_id": …}`), as `issue_token` gives it; a card
    /// session's bearer only.
    pub async fn card_token(
        &self,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<Value, Error> {
        let cards = self.cards.as_ref().ok_or(Error::NotReady)?;
        let bearer = card::bearer_of(authorization).ok_or(Error::Unauthorized(
            "POST /card/token takes a card session's bearer (Authorization: Bearer kts_…)",
        ))?;
        self.as_card(
            cards,
            bearer,
            card::TOKEN_FUNCTIONS[0],
            body,
            card::TOKEN_FUNCTIONS,
        )
        .await
    }

    /// Runs `function` as the person a card session's `bearer` stands for,
    /// when it is one of `functions` and names one of the session's actions.
    async fn as_card(
        &self,
        cards: &card::Cards,
        bearer: &str,
        function: &str,
        body: &[u8],
        functions: &[&str],
    ) -> Result<Value, Error> {
        let args = parse_body(body)?;
        let verified = cards
            .caller(
                bearer,
                function,
                &args,
                |role| self.verifier.allows(role),
                functions,
            )
            .await?;
        self.run(function, verified, args).await
    }

    /// Runs `function` with `args` as `verified`.
    async fn run(
        &self,
        function: &str,
        verified: Verified,
        args: Map<String, Value>,
    ) -> Result<Value, Error> {
        let (_, sql) = self.catalog.statement(function, &args)?;
        let sql_by_tenant = self.catalog.statement_by_tenant(function, &args)?;
        let args = Value::Object(args);
        let result = async {
            let mut client = self.pool.get().await?;
            let tx = db::transaction(&mut client).await?;
            db::rpc::run_as(&tx, &verified.role).await?;
            let value = match &sql_by_tenant {
                None => {
                    db::rpc::assert_claims(&tx, &verified.claims).await?;
                    db::rpc::call(&tx, &sql, &args, None).await?
                }
                Some((tenant_of, sql_by_tenant)) => {
                    match tenant_by(&tx, *tenant_of, &verified.claims, &args).await? {
                        None => db::rpc::call(&tx, &sql, &args, None).await?,
                        Some(tenant) => {
                            db::rpc::call(&tx, sql_by_tenant, &args, Some(&tenant)).await?
                        }
                    }
                }
            };
            db::commit(tx).await?;
            Ok::<_, Error>(value.unwrap_or(Value::Null))
        }
        .await;
        if let Err(e) = &result {
            log_failure(function, e, &args);
        }
        result
    }
}

/// Asserts `claims` in the request's transaction for a call that has a
/// tenant-explicit form, and asks the database which form to run: the
/// tenant ([`TenantOf`]) where keyturn's tables are distributed by tenant;
/// `None` for the plain call, on one node, or when the database names no
/// tenant (claims without one, an action that is not uncertain): the plain
/// call then refuses it itself, and a NULL tenant never reaches Citus's
/// routing.
async fn tenant_by(
    tx: &tokio_postgres::Transaction<'_>,
    tenant_of: TenantOf,
    claims: &str,
    args: &Value,
) -> Result<Option<String>, Error> {
    if !db::rpc::assert_claims_by_tenant(tx, claims).await? {
        return Ok(None);
    }
    match tenant_of {
        TenantOf::Caller => db::rpc::callers_tenant(tx, claims).await,
        TenantOf::UncertainAction => db::rpc::uncertain_action_tenant(tx, args).await,
    }
}

/// The request body as an object of named arguments; empty = none.
fn parse_body(body: &[u8]) -> Result<Map<String, Value>, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    if let Some(why) = crate::body::read_apart(body) {
        return Err(Error::BadBody(why.into()));
    }
    match serde_json::from_slice::<Value>(body) {
        // PostgreSQL's error for a NUL in jsonb quotes the values into its
        // log (docs/security.md, row 85): refused before it gets there.
        Ok(v) if keyturn_core::text::holds_nul(&v) => Err(Error::BadBody(
            "the body holds the NUL character (U+0000), which keyturn cannot store; remove it"
                .into(),
        )),
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::BadBody(
            "the body must be a JSON object of named arguments".into(),
        )),
        Err(e) => Err(Error::BadBody(format!("the body is not JSON: {e}"))),
    }
}

/// Logs a failed call for the operator. The caller's refusals (4xx) are
/// routine and logged at debug; anything else at warn, with the server's
/// words. Every string value of the request is blanked out of them first:
/// a token in the wrong argument would otherwise come back in a message
/// such as "invalid input syntax for type uuid: …".
fn log_failure(function: &str, e: &Error, args: &Value) {
    let secrets = strings(args);
    let clean = |s: &str| {
        let mut out = s.to_owned();
        for secret in &secrets {
            out = out.replace(secret.as_str(), "[redacted]");
        }
        out
    };
    match e.db_error() {
        Some(db) if crate::error::sqlstate_status(db.code().code()).is_some() => {
            tracing::debug!(function, sqlstate = db.code().code(), "rpc call refused");
        }
        Some(db) => tracing::warn!(
            function,
            sqlstate = db.code().code(),
            message = %clean(db.message()),
            detail = %clean(db.detail().unwrap_or("")),
            hint = %clean(db.hint().unwrap_or("")),
            "rpc call failed"
        ),
        None => tracing::warn!(function, error = %clean(&e.to_string()), "rpc call failed"),
    }
}

fn strings(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.len() >= 4 => out.push(s.clone()),
            Value::Array(a) => stack.extend(a),
            Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    // Longest first, so a string inside another is not blanked by halves.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// The role the card sessions of keyturnd's own links (an MCP
/// elicitation's) run as: `KEYTURN_CARD_ROLE`, else the one role of
/// `KEYTURN_JWT_ROLES` that is the human side alone (`human`), which is the
/// role a person's JWT selects; with several, none (a link then answers 401
/// saying to set it).
fn card_role(configured: Option<String>, human: &[String]) -> Option<String> {
    if configured.is_some() {
        return configured;
    }
    match human {
        [one] => {
            tracing::info!(role = %one, "card sessions of keyturnd's own links run as the one human-side role of KEYTURN_JWT_ROLES (KEYTURN_CARD_ROLE overrides)");
            Some(one.clone())
        }
        [] => None,
        several => {
            tracing::warn!(roles = ?several, "KEYTURN_JWT_ROLES has several human-side roles: set KEYTURN_CARD_ROLE to the one the card sessions of keyturnd's own links (MCP elicitations) run as");
            None
        }
    }
}

/// The start-up checks of the RPC login against `roles` (the
/// `KEYTURN_JWT_ROLES`): each exists, none is a member of `keyturn_agent`
/// (a JWT must never select a role that proposes), the login does not
/// inherit `keyturn_agent` (the database would refuse every approval made
/// through it), and the login can `SET ROLE` to each, which is tried.
pub async fn check_roles(client: &tokio_postgres::Client, roles: &[String]) -> Result<(), Error> {
    let refuse = |why: String| Err(Error::Config(why));
    for c in db::rpc::role_checks(client, roles).await? {
        let (name, login) = (&c.name, &c.login);
        if c.login_inherits_agent {
            return refuse(format!(
                "KEYTURN_RPC_DATABASE_URL logs in as {login}, which has keyturn_agent's privileges: \
                 the database refuses every approval through it. Use a NOINHERIT login (as PostgREST's authenticator)"
            ));
        }
        if !c.present {
            return refuse(format!("KEYTURN_JWT_ROLES: role {name} does not exist"));
        }
        if c.agent {
            return refuse(format!(
                "KEYTURN_JWT_ROLES: role {name} is a member of keyturn_agent; a JWT must never select \
                 a role that proposes (separation of duties)"
            ));
        }
        if !c.can_set {
            return refuse(format!(
                "KEYTURN_JWT_ROLES: the RPC login {login} is not a member of role {name}, so it cannot SET ROLE to it: \
                 GRANT {name} TO {login}"
            ));
        }
    }
    for role in roles {
        // Membership said yes; SET ROLE itself is the proof.
        if let Err(e) = db::rpc::try_set_role(client, role).await {
            if e.is_transient() {
                return Err(e);
            }
            return refuse(format!(
                "KEYTURN_JWT_ROLES: the RPC login cannot SET ROLE {role}: {e}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn test_the_card_role_is_the_configured_one_else_the_one_human_role() {
        let roles = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            card_role(Some("app_card".into()), &roles(&["app_human"])).as_deref(),
            Some("app_card")
        );
        assert_eq!(
            card_role(None, &roles(&["app_human"])).as_deref(),
            Some("app_human")
        );
        assert_eq!(card_role(None, &roles(&[])), None);
        assert_eq!(card_role(None, &roles(&["a", "b"])), None);
    }

    #[test]
    fn test_body_is_an_object_or_empty() {
        assert!(parse_body(b"").expect("empty").is_empty());
        assert!(parse_body(b" \n").expect("blank").is_empty());
        assert_eq!(parse_body(br#"{"a": 1}"#).expect("object")["a"], 1);
        assert!(matches!(parse_body(b"[1]"), Err(Error::BadBody(_))));
        assert!(matches!(parse_body(b"{"), Err(Error::BadBody(_))));
    }

    #[test]
    fn test_every_request_string_is_collected_longest_first() {
        let s =
            strings(&json!({"token": "abcdefgh", "items": [{"token": "abcd"}], "n": 5, "x": "ab"}));
        assert_eq!(s, ["abcdefgh", "abcd"]);
    }
}
