//! Connections through PgBouncer, and the skip rule.
#![allow(dead_code)]

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};

/// The path of the test function it is used in, `module::test_name`.
macro_rules! test_name {
    () => {{
        fn here() {}
        let name = std::any::type_name_of_val(&here);
        let name = name.strip_suffix("::here").unwrap_or(name);
        let name = name.strip_suffix("::{{closure}}").unwrap_or(name);
        name.strip_prefix("pgbouncer::").unwrap_or(name)
    }};
}

/// PgBouncer's port. Without one the test says that it skipped, why and how
/// to run it, and returns.
macro_rules! require_bouncer {
    () => {
        match $crate::support::bouncer_port() {
            Some(port) => port,
            None => {
                $crate::support::skipped(test_name!());
                return;
            }
        }
    };
}

pub fn bouncer_port() -> Option<u16> {
    std::env::var("KT_PGBOUNCER_PORT")
        .ok()
        .map(|p| p.parse().expect("KT_PGBOUNCER_PORT must be a port number"))
}

/// Written to the process's stderr itself: the harness shows captured
/// output only for failing tests.
pub fn skipped(test: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: KT_PGBOUNCER_PORT is not set, and this test needs PgBouncer in \
         front of the private cluster. Run it with `KT_ONLY=pgbouncer tests/run-all`. ***\n"
    );
    keyturn_tests::note_skip(test, "KT_PGBOUNCER_PORT is not set");
}

/// A client connection to PgBouncer as `role`, for database `db`
/// (`keyturn`, `keyturn_one` for one shared server connection, or any other).
pub async fn pooled(port: u16, role: &str, db: &str) -> Client {
    let url = format!("host=127.0.0.1 port={port} user={role} dbname={db}");
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect through PgBouncer as {role} to {db}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// One statement outside any transaction, in a single round trip with no
/// named prepared statement: PgBouncer may run each statement a client sends
/// outside a transaction on a different server connection, so a statement
/// prepared on one would be missing on the next.
pub async fn autocommit(
    client: &Client,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    client.query_typed(sql, params).await
}

/// The server process behind the client's statement.
pub async fn backend_pid(client: &Client) -> i32 {
    autocommit(client, "SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")[0]
        .get(0)
}

/// A LOGIN role of its own (a `keyturn_tests::unique` name, which the
/// harness drops after the layer) in `group`: PgBouncer pools server
/// connections per (database, role), so a test that leaves session state on
/// one leaves it to itself alone.
pub async fn login_in(superuser: &Client, prefix: &str, group: &str) -> String {
    let role = keyturn_tests::unique(prefix);
    superuser
        .batch_execute(&format!("CREATE ROLE {role} LOGIN IN ROLE {group}"))
        .await
        .unwrap_or_else(|e| panic!("create role {role}: {e}"));
    role
}
