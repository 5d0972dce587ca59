//! The fuzzer's connections, one per part, and calls made as someone:
//! identity asserted inside each call's transaction, from the `keyturn.*`
//! settings, from `request.jwt.claims`, or (to see it refused) for the
//! whole session.

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, NoTls, Row};

/// How a call asserts who it is.
#[derive(Debug, Clone, Default)]
pub struct Ident {
    /// keyturn.tenant, keyturn.principal, keyturn.session.
    pub gucs: Option<(String, String, String)>,
    /// request.jwt.claims, exactly this text.
    pub claims: Option<String>,
    /// Set for the session instead of the transaction (and reset after):
    /// keyturn must treat it as missing.
    pub session_level: bool,
}

impl Ident {
    pub fn gucs(tenant: &str, principal: &str, session: &str) -> Ident {
        Ident {
            gucs: Some((tenant.into(), principal.into(), session.into())),
            ..Ident::default()
        }
    }
}

pub struct Db {
    pub agent: Client,
    pub human: Client,
    pub admin: Client,
    pub dispatcher: Client,
    /// The superuser: setup, snapshots, and the oracles' own queries.
    pub su: Client,
}

async fn connect(login: &str) -> Result<Client, Error> {
    let url = format!(
        "host=127.0.0.1 port={} user={login} dbname={} application_name=keyturn-fuzz",
        keyturn_tests::port(),
        keyturn_tests::dbname()
    );
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    // A call that hangs is a finding, not a stuck run; the oracles read
    // text the way keyturn's statements do (sql/050_propose.sql pins these).
    client
        .batch_execute(
            "SET statement_timeout = '30s'; SET DateStyle = 'ISO, MDY'; SET TimeZone = 'UTC'",
        )
        .await?;
    Ok(client)
}

impl Db {
    pub async fn connect() -> Result<Db, Error> {
        Ok(Db {
            agent: connect("app_agent").await?,
            human: connect("app_human").await?,
            admin: connect("app_admin").await?,
            dispatcher: connect("app_dispatcher").await?,
            su: connect("postgres").await?,
        })
    }

    /// Whether any connection was lost (a backend crash takes them all).
    pub fn lost(&self) -> bool {
        [
            &self.agent,
            &self.human,
            &self.admin,
            &self.dispatcher,
            &self.su,
        ]
        .iter()
        .any(|c| c.is_closed())
    }
}

/// `sql` in a transaction of its own on `client`, as `who`.
pub async fn as_who(
    client: &Client,
    who: &Ident,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, Error> {
    let local = !who.session_level;
    client.batch_execute("BEGIN").await?;
    let r = async {
        if let Some((t, p, s)) = &who.gucs {
            client
                .execute(
                    "SELECT set_config('keyturn.tenant', $1, $4), set_config('keyturn.principal', $2, $4), \
                     set_config('keyturn.session', $3, $4)",
                    &[t, p, s, &local],
                )
                .await?;
        }
        if let Some(c) = &who.claims {
            client.execute("SELECT set_config('request.jwt.claims', $1, $2)", &[c, &local]).await?;
        }
        let rows = client.query(sql, params).await?;
        client.batch_execute("COMMIT").await?;
        Ok(rows)
    }
    .await;
    if r.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    if who.session_level {
        let _ = client
            .batch_execute("RESET keyturn.tenant; RESET keyturn.principal; RESET keyturn.session; RESET request.jwt.claims")
            .await;
    }
    r
}

/// What PostgreSQL's own jsonb input makes of `text`: its text form, or the
/// SQLSTATE it refuses the text with (before keyturn ever sees it).
pub async fn jsonb_text(su: &Client, text: &str) -> Result<String, String> {
    su.query_one("SELECT $1::text::jsonb::text", &[&text])
        .await
        .map(|r| r.get(0))
        .map_err(|e| keyturn_tests::tally::outcome(&e))
}
