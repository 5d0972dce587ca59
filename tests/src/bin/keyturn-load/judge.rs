//! Which outcomes a call may end in under load, and whether the server
//! survived it.
//!
//! A call may end in the SQLSTATEs docs/sql-api.md documents for it, or in
//! what the faults explain: 57014 (a cancel or a statement timeout), 55P03
//! (a lock timeout), 57P01 and a closed connection (a terminated backend),
//! 40001 and 40P01 (retried by link.rs; only running out of retries is a
//! failure). Anything else, XX000 first of all, fails the run.

use std::io::{Read, Seek, SeekFrom};

const INJECTED: &[&str] = &["57014", "55P03", "57P01", "closed", "40001", "40P01"];

fn documented(call: &str) -> &'static [&'static str] {
    match call {
        c if c.starts_with("propose") => &["42501", "42704", "22023", "55000", "54000"],
        "approve" | "approve_many item" => &["42501", "55000", "22023", "40001"],
        "approve_many" => &["42501", "22023"],
        "reject" | "preview" => &["42501", "55000"],
        "revise" => &["42501", "55000", "22023", "42704", "54000"],
        "delegate" => &["42501", "42704", "22023"],
        "revoke_delegation" | "end_session" => &["42501"],
        "grant_tool" | "revoke_tool" | "add_member" => &["42501", "42704", "22023"],
        "begin_dispatch" | "complete" | "complete (hand back)" => &["55000"],
        _ => &[],
    }
}

pub fn allowed(call: &str, outcome: &str) -> bool {
    outcome == "ok" || INJECTED.contains(&outcome) || documented(call).contains(&outcome)
}

/// Where the server log ends now (KT_PGLOG, which the harness exports).
pub fn log_mark() -> Option<u64> {
    let path = std::env::var("KT_PGLOG").ok()?;
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// Lines the server logged since `mark` that say a backend crashed or the
/// server panicked. Without KT_PGLOG it says it skipped the check.
pub fn crashes_since(mark: Option<u64>) -> Vec<String> {
    let (Some(mark), Ok(path)) = (mark, std::env::var("KT_PGLOG")) else {
        println!("SKIPPED the server log check: KT_PGLOG does not name a readable server log");
        return Vec::new();
    };
    let mut bytes = Vec::new();
    let read = std::fs::File::open(&path).and_then(|mut f| {
        f.seek(SeekFrom::Start(mark))?;
        f.read_to_end(&mut bytes)
    });
    if let Err(e) = read {
        println!("SKIPPED the server log check: {path}: {e}");
        return Vec::new();
    }
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| {
            l.contains("was terminated by signal")
                || l.contains("PANIC:")
                || (l.contains("server process") && l.contains("exited with exit code"))
        })
        .map(str::to_owned)
        .collect()
}
