//! Shared test fixtures: leased jobs, free ports, the skip rule, and (in
//! [`e2e`]) the database, the keyturnd process and the receivers.
#![allow(dead_code)]

#[macro_use]
pub mod browser;
pub mod e2e;
pub mod fake_smtp;
pub mod files;
pub mod pg_proxy;
pub mod python;
pub mod web;

use keyturnd::db::LeasedJob;
use uuid::Uuid;

/// The path of the test function it is used in, `module::test_name`.
macro_rules! test_name {
    () => {{
        fn here() {}
        let name = std::any::type_name_of_val(&here);
        let name = name.strip_suffix("::here").unwrap_or(name);
        let name = name.strip_suffix("::{{closure}}").unwrap_or(name);
        name.strip_prefix("it::").unwrap_or(name)
    }};
}

/// The private cluster's port. Without one (`KT_PGPORT` unset) the test
/// prints that it skipped and how to run it, and returns.
macro_rules! require_db {
    () => {
        match $crate::support::e2e::pg_port() {
            Some(port) => port,
            None => {
                $crate::support::skipped(
                    test_name!(),
                    "KT_PGPORT is not set, and this test needs the private PostgreSQL cluster",
                );
                return;
            }
        }
    };
}

/// Says loudly that `test` did not run, why, and how to run it. Written to
/// the process's stderr itself, not through `eprintln!`, which the test
/// harness captures and shows only for failing tests.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {why}. Run it with `KT_ONLY=service tests/run-all`, or against a \
         cluster of your own with `KT_PGPORT=<port> KT_PGDATA=<dir> KT_PGSOCK=<dir> \
         cargo test -p keyturnd --test it {test}`. ***\n"
    );
    note_skip(test, why);
}

// keyturn-tests' own file, compiled here too: one definition of the
// protocol with tests/run-all (KT_SKIPS) for both test crates.
#[path = "../../../../tests/src/skips.rs"]
mod skips;
pub use skips::note_skip;

/// A leased job as `keyturn.lease` would return it.
pub fn job(provider: &str, params: serde_json::Value) -> LeasedJob {
    LeasedJob {
        action_id: Uuid::new_v4(),
        lease_id: Uuid::new_v4(),
        tenant: "acme".into(),
        tool: "notify".into(),
        provider: provider.into(),
        params,
        idempotency_key: format!("ik-{}", Uuid::new_v4().simple()),
        attempt: 1,
    }
}

/// A loopback port with nothing listening on it (bound, then released).
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    port
}

/// A uniformly random number below `n` (`n` > 0), from a v4 UUID's random
/// bits: enough for picking delays and moments, with no extra dependency.
pub fn random_below(n: u64) -> u64 {
    (Uuid::new_v4().as_u128() % u128::from(n.max(1))) as u64
}

/// A random duration from zero to `max`, in whole milliseconds.
pub fn random_duration(max: std::time::Duration) -> std::time::Duration {
    let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    std::time::Duration::from_millis(random_below(ms.saturating_add(1)))
}
