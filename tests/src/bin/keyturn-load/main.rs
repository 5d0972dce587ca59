//! keyturn-load: keyturn under many clients at once, with faults, then the
//! invariants (docs/testing.md, "The load layer").
//!
//! Each phase (16 clients, then 64, by default) gets tenants of its own and
//! runs for a fixed time: agents propose, people approve, approve on one
//! card, reject, revise and delegate, dispatchers lease, begin and complete,
//! an admin revokes and grants tools, a housekeeper sweeps and ends
//! sessions, while statements are cancelled, backends terminated, short
//! lock and statement timeouts set and epochs bumped. Then it checks what
//! must hold (invariants.rs) and judges every call's outcome against the
//! SQLSTATEs docs/sql-api.md documents for it and the faults injected: an
//! internal error (XX000), any other code, or a deadlock still failing after
//! its retries fails the run.
//!
//!   KT_PGPORT       the private cluster (tests/run-all's, or your own)
//!   KT_LOAD_SECONDS seconds per phase (default 10)
//!   KT_LOAD_CLIENTS the phases' client counts (default "16 64")
//!   KT_LOAD_SEED    the seed of every client's choices (printed; the
//!                   interleaving is the machine's, so a rerun is similar,
//!                   not identical)

mod faults;
mod invariants;
mod judge;
mod link;
mod mix;
mod operations;
mod people;
mod world;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keyturn_tests::server_log;
use keyturn_tests::tally::Tally;
use keyturn_tests::{connect, unique};
use proptest::test_runner::{RngAlgorithm, TestRng};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not valid")),
        Err(_) => default,
    }
}

/// A generator for client `i` of a run seeded `seed`.
pub fn rng(seed: u64, i: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&i.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

#[tokio::main]
async fn main() -> ExitCode {
    let seconds: u64 = env_or("KT_LOAD_SECONDS", 10);
    let clients: String = env_or("KT_LOAD_CLIENTS", "16 64".to_owned());
    let seed: u64 = env_or(
        "KT_LOAD_SEED",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    println!(
        "keyturn-load: seed {seed} (KT_LOAD_SEED={seed}), {seconds} s per phase, clients {clients}"
    );
    let mut ok = true;
    for (phase, n) in clients.split_whitespace().enumerate() {
        let n: usize = n.parse().expect("KT_LOAD_CLIENTS lists client counts");
        ok &= run_phase(n, seconds, seed.wrapping_add(phase as u64 * 1_000_003)).await;
    }
    if ok {
        println!("keyturn-load: passed");
        ExitCode::SUCCESS
    } else {
        println!("keyturn-load: FAILED (seed {seed})");
        ExitCode::FAILURE
    }
}

async fn run_phase(n: usize, seconds: u64, seed: u64) -> bool {
    let run = unique("load");
    let world = Arc::new(world::World::new(&run).await);
    let log_mark = server_log::mark();
    let stop = Arc::new(AtomicBool::new(false));
    let roles = mix::roles(n);
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &roles {
        *counts.entry(format!("{r:?}")).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(r, k)| format!("{r}={k}")).collect();
    println!(
        "\nphase {run}: {n} clients ({}), {seconds} s",
        counts.join(" ")
    );

    let mut tasks = Vec::new();
    for (i, role) in roles.into_iter().enumerate() {
        let client = mix::Client {
            world: world.clone(),
            rng: rng(seed, i as u64),
            tally: Tally::default(),
            index: i,
        };
        tasks.push(tokio::spawn(client.run(role, stop.clone())));
    }
    let faults = tokio::spawn(faults::inject(
        world.clone(),
        rng(seed, u64::MAX),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);

    let mut calls = Tally::default();
    for t in tasks {
        calls.merge(&t.await.expect("a client panicked"));
    }
    let injected = faults.await.expect("the fault injector panicked");

    // One last sweep, with nothing running: what it leaves open must be due.
    let db = connect("postgres").await;
    let swept_at: SystemTime = db
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .expect("time")
        .get(0);
    let dispatcher = connect("app_dispatcher").await;
    dispatcher
        .execute("SELECT * FROM keyturn.sweep()", &[])
        .await
        .expect("final sweep");
    let checks = invariants::check(&world, &db, swept_at).await;

    println!(
        "calls by outcome (! marks an outcome the call does not document and no fault explains):"
    );
    print!("{}", calls.render(judge::allowed));
    println!("faults injected:");
    print!("{}", injected.render(|_, _| true));
    let refused = calls.refused(judge::allowed);
    let crashes = server_log::crashes_since(log_mark);
    let mut ok = refused.is_empty() && crashes.is_empty();
    println!("invariants:");
    for c in &checks {
        ok &= c.offending == 0;
        let verdict = if c.offending == 0 {
            "ok".to_owned()
        } else {
            format!("FAILED ({} rows)", c.offending)
        };
        println!("  {:<58} {verdict}  {}", c.name, c.note);
    }
    for (call, outcome, count) in &refused {
        println!("  FAILED: {call} ended {count} time(s) in {outcome}");
    }
    for line in &crashes {
        println!("  FAILED: the server log says: {line}");
    }
    println!("phase {run}: {}", if ok { "passed" } else { "FAILED" });
    ok
}
