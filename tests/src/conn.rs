//! Connections to the private cluster, and identity asserted the way a
//! pooled application must: inside each transaction ([`Conn`], [`Tx`]); the
//! [`Sql`] trait over a plain `Client`, a `Conn` and a `Tx`; the SQLSTATE and
//! message of a failed statement.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, NoTls, Row, ToStatement};

/// The private cluster's port; tests refuse to guess one.
pub fn port() -> u16 {
    std::env::var("KT_PGPORT")
        .expect("KT_PGPORT is not set: run the integration tests through tests/run-all")
        .parse()
        .expect("KT_PGPORT must be a port number")
}

/// The database under test: `keyturn`, or `KT_DBNAME` (the upgrade layer runs
/// this suite again on a database upgraded from the previous release).
pub fn dbname() -> String {
    std::env::var("KT_DBNAME").unwrap_or_else(|_| "keyturn".into())
}

/// A connection as `role` (trust authentication on the private cluster).
pub async fn connect(role: &str) -> Client {
    connect_to(role, &dbname()).await
}

/// A connection as `role` to database `db` of the private cluster.
pub async fn connect_to(role: &str, db: &str) -> Client {
    let url = format!("host=127.0.0.1 port={} user={role} dbname={db}", port());
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect as {role} to {db}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A name no other test uses: lowercase ASCII, valid as tool and tenant name.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// Who a [`Conn`] says its caller is. keyturn reads `request.jwt.claims` if
/// it is set to anything but '', else the `keyturn.*` GUCs; a Conn sets the
/// ones held here at the start of each transaction it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// keyturn.tenant, keyturn.principal, keyturn.session.
    pub gucs: Option<(String, String, String)>,
    /// request.jwt.claims, exactly this text.
    pub claims: Option<String>,
}

impl Identity {
    /// Nothing asserted.
    pub fn none() -> Identity {
        Identity::default()
    }

    pub fn gucs(tenant: &str, principal: &str, session: &str) -> Identity {
        Identity {
            gucs: Some((tenant.into(), principal.into(), session.into())),
            claims: None,
        }
    }

    pub fn claims(claims: &str) -> Identity {
        Identity::none().with_claims(claims)
    }

    /// This identity, and `request.jwt.claims` as well.
    pub fn with_claims(mut self, claims: &str) -> Identity {
        self.claims = Some(claims.into());
        self
    }
}

struct Link {
    client: Client,
    identity: Identity,
    /// A transaction is still open on the connection: a [`Tx`] was dropped,
    /// or a call cancelled, before it ended. The next call rolls it back.
    open: bool,
}

/// A connection that asserts an [`Identity`] transaction-locally. Each of
/// `query`, `query_one`, `query_opt`, `execute` and `batch_execute` runs its
/// statement in a transaction of its own: `BEGIN`, the identity with
/// `set_config(…, true)`, the statement, then `COMMIT`, or `ROLLBACK` when
/// the statement failed, whose error is returned unchanged. Calls on one
/// Conn are serialized, so tasks sharing it never interleave transactions.
/// It deliberately does not deref to `Client`: a statement on the bare
/// client would run without identity.
pub struct Conn {
    link: Arc<Mutex<Link>>,
}

impl Conn {
    pub fn new(client: Client, identity: Identity) -> Conn {
        Conn {
            link: Arc::new(Mutex::new(Link {
                client,
                identity,
                open: false,
            })),
        }
    }

    /// A connection as `login` (see [`connect`]) asserting `identity`.
    pub async fn connect(login: &str, identity: Identity) -> Conn {
        Conn::new(connect(login).await, identity)
    }

    /// What the transactions begun from now on assert. It waits for a
    /// transaction in progress, which keeps the identity it began with.
    pub async fn set_identity(&self, identity: Identity) {
        self.link.lock().await.identity = identity;
    }

    /// A transaction with the identity already set, for several statements
    /// in one transaction.
    pub async fn transaction(&self) -> Result<Tx, Error> {
        self.transaction_with("BEGIN").await
    }

    /// As [`Conn::transaction`], begun with `begin` (such as
    /// `BEGIN ISOLATION LEVEL REPEATABLE READ`).
    pub async fn transaction_with(&self, begin: &str) -> Result<Tx, Error> {
        Ok(Tx {
            link: Some(open(&self.link, begin).await?),
        })
    }

    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.query(statement, params).await;
        close(link, r).await
    }

    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.query_one(statement, params).await;
        close(link, r).await
    }

    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.query_opt(statement, params).await;
        close(link, r).await
    }

    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.execute(statement, params).await;
        close(link, r).await
    }

    pub async fn batch_execute(&self, query: &str) -> Result<(), Error> {
        refuse_transaction_control(query);
        let link = open(&self.link, "BEGIN").await?;
        let r = link.client.batch_execute(query).await;
        close(link, r).await
    }
}

/// Takes the connection, ends what a dropped [`Tx`] left open, and begins a
/// transaction asserting the connection's identity.
async fn open(link: &Arc<Mutex<Link>>, begin: &str) -> Result<OwnedMutexGuard<Link>, Error> {
    let mut link = link.clone().lock_owned().await;
    if link.open {
        link.client.batch_execute("ROLLBACK").await?;
        link.open = false;
    }
    link.client.batch_execute(begin).await?;
    link.open = true;
    if let Some((tenant, principal, session)) = &link.identity.gucs {
        link.client
            .execute(
                "SELECT set_config('keyturn.tenant', $1, true), set_config('keyturn.principal', $2, true), \
                 set_config('keyturn.session', $3, true)",
                &[tenant, principal, session],
            )
            .await?;
    }
    if let Some(claims) = &link.identity.claims {
        link.client
            .execute(
                "SELECT set_config('request.jwt.claims', $1, true)",
                &[claims],
            )
            .await?;
    }
    Ok(link)
}

/// Ends a one-statement transaction: its result if it committed, else the
/// statement's own error (a failed ROLLBACK hides nothing).
async fn close<R>(mut link: OwnedMutexGuard<Link>, r: Result<R, Error>) -> Result<R, Error> {
    let ended = link
        .client
        .batch_execute(if r.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .await;
    link.open = false;
    let v = r?;
    ended.map(|()| v)
}

/// A hand-written BEGIN or COMMIT inside a Conn's transaction would end it
/// early, and what follows would run without the identity.
fn refuse_transaction_control(query: &str) {
    let first = query
        .split(|c: char| c.is_whitespace() || c == ';')
        .find(|w| !w.is_empty())
        .unwrap_or("")
        .to_ascii_uppercase();
    assert!(
        !["BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"].contains(&first.as_str()),
        "{query:?}: use Conn::transaction for a transaction of several statements"
    );
}

/// A transaction of a [`Conn`], its identity set locally. Dropped without
/// `commit` or `rollback`, it is rolled back, as a tokio_postgres
/// transaction is; the Conn stays taken until then.
pub struct Tx {
    link: Option<OwnedMutexGuard<Link>>,
}

impl Tx {
    fn client(&self) -> &Client {
        &self
            .link
            .as_ref()
            .expect("the transaction is live until it ends")
            .client
    }

    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().query(statement, params).await
    }

    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().query_one(statement, params).await
    }

    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().query_opt(statement, params).await
    }

    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        self.client().execute(statement, params).await
    }

    pub async fn batch_execute(&self, query: &str) -> Result<(), Error> {
        refuse_transaction_control(query);
        self.client().batch_execute(query).await
    }

    pub async fn commit(mut self) -> Result<(), Error> {
        self.end("COMMIT").await
    }

    pub async fn rollback(mut self) -> Result<(), Error> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, how: &str) -> Result<(), Error> {
        let mut link = self.link.take().expect("a transaction ends once");
        let r = link.client.batch_execute(how).await;
        link.open = false;
        r
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // The rollback holds the connection, so the Conn's next call waits
        // for it; without a runtime, that next call rolls back instead.
        if let Some(mut link) = self.link.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if link.client.batch_execute("ROLLBACK").await.is_ok() {
                        link.open = false;
                    }
                });
            }
        }
    }
}

/// What the shared helpers need of a connection, so they take a `Client`
/// (no identity), a [`Conn`] or a [`Tx`] alike.
pub trait Sql: Sync {
    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send;
}

/// `Sql` for each connection type, by its own inherent `query` and
/// `query_one`.
macro_rules! impl_sql {
    ($($ty:ty),*) => {$(
        impl Sql for $ty {
            fn query(
                &self,
                sql: &str,
                params: &[&(dyn ToSql + Sync)],
            ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send {
                <$ty>::query(self, sql, params)
            }

            fn query_one(
                &self,
                sql: &str,
                params: &[&(dyn ToSql + Sync)],
            ) -> impl Future<Output = Result<Row, Error>> + Send {
                <$ty>::query_one(self, sql, params)
            }
        }
    )*};
}

impl_sql!(Client, Conn, Tx);

/// The SQLSTATE of a failed statement, for assertions.
pub fn sqlstate<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .code()
            .map(|c| c.code().to_string())
            .unwrap_or_else(|| panic!("not a database error: {e}")),
    }
}

/// The SQLSTATE and the message of a failed statement, for assertions on both.
pub fn failure<T: std::fmt::Debug>(result: Result<T, Error>) -> (String, String) {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            let db = e
                .as_db_error()
                .unwrap_or_else(|| panic!("not a database error: {e}"));
            (db.code().code().to_owned(), db.message().to_owned())
        }
    }
}

/// The message of a failed statement.
pub fn message<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string()),
    }
}
