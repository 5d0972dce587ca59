//! Fixtures of the HTTP approval tests: the NOINHERIT authenticator login
//! `/rpc` runs on, JWTs for the people of a [`World`], keyturnd with `/rpc`
//! on, proposals, and a plain HTTP client for `/rpc`.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

use super::e2e::{self, World};

/// The HS256 key of every test JWT.
pub const JWT_SECRET: &str = "keyturn-test-jwt-secret-0123456789abcdef";

/// The login `/rpc` connects as. The fixture (`tests/fixtures/crm.sql`) has
/// none, so the tests create it: NOINHERIT (it never holds the privileges
/// of the roles it switches to) and a member of the two roles the tests'
/// JWTs select.
pub const AUTHENTICATOR: &str = "app_authenticator";

/// Creates [`AUTHENTICATOR`] if it is missing. Every test that starts
/// keyturnd with `/rpc` calls it; the e2e tests run one at a time.
pub async fn authenticator(superuser: &Client) {
    superuser
        .batch_execute(
            "DO $$ BEGIN \
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app_authenticator') THEN \
                 CREATE ROLE app_authenticator LOGIN NOINHERIT; \
               END IF; \
             END $$; \
             GRANT app_human, app_operator TO app_authenticator",
        )
        .await
        .expect("create the authenticator login");
}

/// keyturnd settings for `/rpc` on the private cluster at `port`.
pub fn rpc_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("KEYTURN_JWT_SECRET", JWT_SECRET.into()),
        ("KEYTURN_RPC_DATABASE_URL", e2e::url(port, AUTHENTICATOR)),
        ("KEYTURN_JWT_ROLES", "app_human,app_operator".into()),
        ("RUST_LOG", "info,keyturnd=debug".into()),
    ]
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// An HS256 JWT with `claims`.
pub fn jwt(claims: Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()).expect("key"),
    )
    .expect("encode JWT")
}

/// A proposal: its id and one-time token.
#[derive(Clone, Debug)]
pub struct Proposal {
    pub id: Uuid,
    pub token: String,
}

impl World {
    /// The JWT of this world's person, as the application would mint it:
    /// role app_human, the principal, tenant and session of the proposals.
    pub fn human_jwt(&self) -> String {
        self.jwt_as("app_human", now() + 900)
    }

    /// This world's identity under `role`, expiring at `exp`.
    pub fn jwt_as(&self, role: &str, exp: i64) -> String {
        jwt(json!({
            "role": role,
            "sub": self.principal,
            "tenant_id": self.tenant,
            "session_id": self.session,
            "exp": exp,
        }))
    }

    /// Proposes `params` for `tool` as the agent.
    pub async fn propose(&self, tool: &str, params: Value) -> Proposal {
        let row = self
            .as_identity(
                &self.agent,
                "SELECT action_id, token FROM keyturn.propose($1, $2)",
                &[&tool, &params],
            )
            .await
            .unwrap_or_else(|e| panic!("propose {tool}: {e}"));
        Proposal {
            id: row.get(0),
            token: row.get(1),
        }
    }

    /// An sql tool setting `crm.deal.stage`, granted to this world's
    /// principal, and `n` deals of this tenant owned by the principal
    /// (their ids, from a range no other test uses).
    pub async fn deal_tool(&self, n: usize) -> (String, Vec<i64>) {
        let tool = self
            .tool(
                "deal_stage",
                json!({
                    "executor": "sql",
                    "effect": "reversible",
                    "summary": "Set stage {set.stage} on {count} deal(s)",
                    "sql": {"table": "crm.deal", "key": "id", "version": "revision",
                            "set": ["stage"], "where": ["id", "owner"]}
                }),
            )
            .await;
        let base = (Uuid::new_v4().as_u128() % 1_000_000_000_000) as i64 * 100;
        let ids: Vec<i64> = (0..n as i64).map(|i| base + i).collect();
        for id in &ids {
            self.superuser
                .execute(
                    "INSERT INTO crm.deal (id, tenant, owner, name, stage) VALUES ($1, $2, $3, $4, 'qualified')",
                    &[id, &self.tenant, &self.principal, &format!("Deal {id}")],
                )
                .await
                .expect("insert deal");
        }
        (tool, ids)
    }

    /// Business writes to deal `id` so far.
    pub async fn deal_writes(&self, id: i64) -> i64 {
        self.superuser
            .query_one(
                "SELECT count(*) FROM crm.deal_writes WHERE deal_id = $1",
                &[&id],
            )
            .await
            .expect("deal_writes")
            .get(0)
    }

    /// The stage of deal `id`.
    pub async fn deal_stage(&self, id: i64) -> String {
        self.superuser
            .query_one("SELECT stage FROM crm.deal WHERE id = $1", &[&id])
            .await
            .expect("deal")
            .get(0)
    }
}

/// `POST <base>/rpc/<function>` with `jwt` (if any) and the JSON `body`:
/// the status, the headers and the JSON answer.
pub async fn post_rpc(
    base: &str,
    function: &str,
    jwt: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    post_json(&format!("{base}/rpc/{function}"), jwt, body).await
}

/// `POST url` with the bearer (if any) and the JSON `body`: the status,
/// the headers and the JSON answer (a JSON string if it is not JSON).
pub async fn post_json(
    url: &str,
    bearer: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    let response = request.send().await.expect("POST");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, value)
}
