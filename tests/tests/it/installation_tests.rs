//! What a backend keeps per installation of pg_keyturn (its owner, the
//! approval key: crate `pg_keyturn`, privilege::installation) is read again
//! once the extension is dropped and created again, in a database of the
//! test's own.

use keyturn_tests::*;
use tokio_postgres::Client;

/// The MAC of a fixed hash under the database's approval key, as `session`
/// computes it: twice, because a key is kept only once read back in a
/// transaction after the one that made it.
async fn mac(session: &Client) -> String {
    let mut last = String::new();
    for _ in 0..2 {
        last = session
            .query_one("SELECT keyturn._digest_mac('0011')", &[])
            .await
            .expect("_digest_mac")
            .get(0);
    }
    last
}

#[tokio::test]
async fn test_a_backend_reads_the_key_and_owner_of_a_new_installation() {
    let db = unique("kt_install");
    let admin = connect("postgres").await;
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create database");
    let first_owner = unique("kt_owner");
    let second_owner = unique("kt_owner");
    let su = connect_to("postgres", &db).await;
    // The schema outlives the extension (CREATE EXTENSION made it, but it is
    // no member): what marks an installation is its tables.
    su.batch_execute(&format!(
        "CREATE ROLE {first_owner} SUPERUSER; CREATE ROLE {second_owner} SUPERUSER;
         SET ROLE {first_owner}; CREATE EXTENSION pg_keyturn; RESET ROLE;"
    ))
    .await
    .expect("the first installation");

    // A backend that used the first installation, kept open across the second.
    let session = connect_to("postgres", &db).await;
    let first = mac(&session).await;
    assert_eq!(
        first,
        mac(&connect_to("postgres", &db).await).await,
        "one key per installation"
    );

    su.batch_execute(&format!(
        "DROP EXTENSION pg_keyturn CASCADE; ALTER SCHEMA keyturn OWNER TO {second_owner};
         DROP ROLE {first_owner};
         SET ROLE {second_owner}; CREATE EXTENSION pg_keyturn; RESET ROLE;"
    ))
    .await
    .expect("the second installation");
    let fresh = mac(&connect_to("postgres", &db).await).await;
    assert_ne!(first, fresh, "a new installation makes a new key");
    assert_eq!(
        mac(&session).await,
        fresh,
        "the backend that used the first installation signs with the second's key"
    );
    // The first owner is gone: a backend that still switched to it for
    // keyturn's own writes would have them refused. An event is written at
    // COMMIT into the tenant's chain, as the owner.
    session
        .batch_execute(
            "BEGIN;
             SELECT keyturn._append_event('00000000-0000-7000-8000-000000000001', 't', 'p',
                                          'postgres', NULL, NULL, 'pending', '{}');
             COMMIT;",
        )
        .await
        .expect("an event written as the second installation's owner");
    let events = count(
        &session,
        "SELECT count(*) FROM keyturn.event WHERE tenant = 't'",
        &[],
    )
    .await;
    assert_eq!(events, 1);

    drop(session);
    drop(su);
    for sql in [
        format!("DROP DATABASE {db} WITH (FORCE)"),
        format!("DROP ROLE {second_owner}"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}
