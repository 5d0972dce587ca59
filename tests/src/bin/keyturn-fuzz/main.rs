//! keyturn-fuzz: SQL-level fuzzing of keyturn on a live cluster
//! (docs/testing.md, "The fuzz layer").
//!
//! Cases of six kinds (sql forms, external params and origins, tool specs,
//! scopes, identity claims and settings, hostile dispatcher batches) draw their inputs from
//! keyturn-core's proptest generators (extension/core/tests/generators/,
//! included below), valid and hostile, and send them through the SQL API as
//! the roles that would. A finding fails the run: an answer outside
//! keyturn's documented SQLSTATEs (an internal error, XX000, first of all),
//! a lost connection or a crash in the server log, a write the approved form
//! does not account for, or an oracle's disagreement (cases/).
//!
//!   KT_PGPORT        the private cluster (tests/run-all's, or your own)
//!   KT_FUZZ_SECONDS  the time budget (default 30)
//!   KT_FUZZ_SEED     the run's seed (printed; every case's inputs follow
//!                    from it and the case number)
//!   KT_FUZZ_CASE     run only this case of the seed, to reproduce a finding

#[path = "../../../../extension/core/tests/generators/mod.rs"]
mod generators;

mod cases;
mod db;
mod fixture;
mod judge;
mod oracle;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use keyturn_tests::server_log;
use keyturn_tests::tally::Tally;
use keyturn_tests::unique;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not valid")),
        Err(_) => default,
    }
}

/// The runner of case `case`: its inputs depend on the seed and the case
/// number alone.
fn runner(seed: u64, case: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&case.to_le_bytes());
    TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

const SHOWN_FINDINGS: usize = 60;

static CURRENT_CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[tokio::main]
async fn main() -> ExitCode {
    let seconds: u64 = env_or("KT_FUZZ_SECONDS", 30);
    let seed: u64 = env_or(
        "KT_FUZZ_SEED",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    let only: Option<u64> = std::env::var("KT_FUZZ_CASE")
        .ok()
        .map(|c| c.parse().expect("KT_FUZZ_CASE is a case number"));
    println!("keyturn-fuzz: seed {seed} (KT_FUZZ_SEED={seed}), {seconds} s");

    let mut db = db::Db::connect().await.expect("connect to the cluster");
    let run = unique("fuzz");
    let fx = fixture::Fixture::create(&db.su, &db.admin, &run).await;
    let log_mark = server_log::mark();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tally = Tally::default();
    let mut failing: Vec<(u64, cases::Kind, Vec<String>, Vec<String>)> = Vec::new();
    let mut by_kind: std::collections::BTreeMap<String, u64> = Default::default();
    // A panic in the fuzzer itself (a generator, a client) names the case.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let case = CURRENT_CASE.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("keyturn-fuzz panicked in case {case}; reproduce with KT_FUZZ_SEED={seed} KT_FUZZ_CASE={case}");
        default_hook(info);
    }));
    let mut case = only.unwrap_or(0);
    loop {
        CURRENT_CASE.store(case, std::sync::atomic::Ordering::Relaxed);
        let mut r = runner(seed, case);
        let kind = cases::pick(&mut r);
        *by_kind.entry(format!("{kind:?}")).or_default() += 1;
        let mut ctx = cases::Ctx {
            db: &db,
            fx: &fx,
            runner: r,
            tally: &mut tally,
            findings: Vec::new(),
            inputs: Vec::new(),
            case,
        };
        cases::run(kind, &mut ctx).await;
        let (mut findings, inputs) = (ctx.findings, ctx.inputs);
        if db.lost() {
            findings.push("a connection was lost (a backend crash takes them all)".into());
            db = reconnect().await;
        }
        if !findings.is_empty() {
            failing.push((case, kind, findings, inputs));
        }
        case += 1;
        if only.is_some() || Instant::now() >= deadline {
            break;
        }
    }
    let crashes = server_log::crashes_since(log_mark);

    let cases_run = by_kind.values().sum::<u64>();
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!("{cases_run} cases ({}), fixture {run}", kinds.join(" "));
    println!("calls by outcome (! marks a finding):");
    print!("{}", tally.render(judge::allowed));
    for (case, kind, findings, inputs) in failing.iter().take(SHOWN_FINDINGS) {
        println!("FINDING in case {case} ({kind:?}); reproduce with KT_FUZZ_SEED={seed} KT_FUZZ_CASE={case}");
        for f in findings {
            println!("  {f}");
        }
        for i in inputs {
            println!("    {i}");
        }
    }
    if failing.len() > SHOWN_FINDINGS {
        println!(
            "… and {} more failing cases",
            failing.len() - SHOWN_FINDINGS
        );
    }
    for line in &crashes {
        println!("FINDING: the server log says: {line}");
    }
    if failing.is_empty() && crashes.is_empty() {
        // Its grants to app_human would keep tests/dev-reinstall from
        // dropping the role; a failing run keeps it for a look.
        let _ = db
            .su
            .batch_execute(&format!("DROP SCHEMA {run} CASCADE"))
            .await;
        println!("keyturn-fuzz: passed");
        ExitCode::SUCCESS
    } else {
        println!(
            "keyturn-fuzz: FAILED, {} failing cases (seed {seed})",
            failing.len()
        );
        ExitCode::FAILURE
    }
}

/// After a crash the server restarts its backends; wait for it.
async fn reconnect() -> db::Db {
    for _ in 0..60 {
        if let Ok(db) = db::Db::connect().await {
            return db;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the cluster did not come back within 30 s");
}
