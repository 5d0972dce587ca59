//! The faults the load injects from outside the clients: statements
//! cancelled (pg_cancel_backend) and backends terminated
//! (pg_terminate_backend) in the middle of whatever they run, and epoch
//! bumps (a grant's terms changed and changed back) under the proposals in
//! flight. The short lock and statement timeouts are set by the clients
//! themselves (link.rs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keyturn_tests::connect;
use keyturn_tests::tally::{outcome, Tally};
use proptest::prelude::RngExt;
use proptest::test_runner::TestRng;

use crate::world::World;

/// Runs until `stop`; returns what it did, as `cancel`, `terminate` and
/// `epoch bump` rows (`ok` when it hit a backend, `missed` when the
/// statement had finished already).
pub async fn inject(world: Arc<World>, mut rng: TestRng, stop: Arc<AtomicBool>) -> Tally {
    let mut tally = Tally::default();
    let superuser = connect("postgres").await;
    let admin = connect("app_admin").await;
    let mut bump = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
        if rng.random_range(0..100) < 15 {
            bump += 1;
            let who = world.someone(&mut rng);
            let tool = [&world.stage, &world.brief, &world.note][rng.random_range(0..3)];
            // A real change of a grant's terms bumps the principal's epoch
            // (and restores a grant the admin client revoked): proposals in
            // flight are invalidated when approved or dispatched, the next
            // ones go on.
            let sql = if bump.is_multiple_of(2) {
                "SELECT keyturn.grant_tool($1, $2, $3)"
            } else {
                "SELECT keyturn.grant_tool($1, $2, $3, NULL, now() + interval '1 day')"
            };
            let r = admin.query(sql, &[&who.tenant, &who.principal, tool]).await;
            tally.add(
                "epoch bump",
                &r.map_or_else(|e| outcome(&e), |_| "ok".into()),
            );
            continue;
        }
        let terminate = rng.random_range(0..100) < 25;
        let (call, f) = if terminate {
            ("terminate", "pg_terminate_backend")
        } else {
            ("cancel", "pg_cancel_backend")
        };
        let sql = format!(
            "SELECT {f}(pid) FROM (SELECT pid FROM pg_stat_activity \
              WHERE application_name = $1 AND state = 'active' AND pid <> pg_backend_pid() \
              ORDER BY random() LIMIT 1) a"
        );
        match superuser.query(&sql, &[&world.run]).await {
            Ok(rows) if rows.first().is_some_and(|r| r.get::<_, bool>(0)) => tally.add(call, "ok"),
            Ok(_) => tally.add(call, "missed"),
            Err(e) => tally.add(call, &outcome(&e)),
        }
    }
    tally
}
