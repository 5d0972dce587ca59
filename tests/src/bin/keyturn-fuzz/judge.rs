//! What the fuzzer accepts as an answer. keyturn refuses what it must with
//! its documented SQLSTATEs (docs/sql-api.md, "SQLSTATEs"): 22023, 42501,
//! 42704, 55000, 54000. Input that PostgreSQL's own jsonb parser refuses
//! never reaches keyturn and is counted under `jsonb input`. Anything else,
//! an internal error (XX000) or a lost connection first of all, is a finding,
//! unless it is a known bug (KNOWN) that an ignored test reproduces.

use keyturn_tests::tally::{outcome, Tally};
use tokio_postgres::Error;

pub const KEYTURN: &[&str] = &["22023", "42501", "42704", "55000", "54000"];

/// Bugs the fuzzer found that are not fixed yet, each with the ignored test
/// that reproduces it: (call, SQLSTATE, a piece of the message, the test).
/// A match is counted as `<code> (known bug)` and printed, not a finding;
/// KT_FUZZ_STRICT=1 makes it one again.
/// (Empty now: the preview bug, XX000 for a business jsonb serde_json could
/// not read, was fixed with fuzz_findings_tests::test_preview_shows_any_business_jsonb.)
pub const KNOWN: &[(&str, &str, &str, &str)] = &[];

/// The ignored test of a known bug this outcome is, if any.
pub fn known(call: &str, code: &str, message: &str) -> Option<&'static str> {
    if std::env::var_os("KT_FUZZ_STRICT").is_some() {
        return None;
    }
    KNOWN
        .iter()
        .find(|(c, o, m, _)| *c == call && *o == code && message.contains(m))
        .map(|(_, _, _, test)| *test)
}

pub fn allowed(call: &str, outcome: &str) -> bool {
    outcome == "ok"
        || KEYTURN.contains(&outcome)
        || outcome.ends_with(KNOWN_BUG)
        // What PostgreSQL's jsonb input refuses: bad syntax, \u0000, numbers
        // numeric cannot hold, nesting past its stack.
        || (call == "jsonb input" && ["22P02", "22P05", "22003", "54001"].contains(&outcome))
}

/// Counts a call's outcome; an outcome the judge refuses becomes a finding.
pub fn judge<T>(tally: &mut Tally, findings: &mut Vec<String>, call: &str, r: &Result<T, Error>) {
    let o = code(r);
    let msg = message(r);
    if let Some(test) = known(call, &o, &msg) {
        tally.add(call, &format!("{o}{KNOWN_BUG}"));
        println!("known bug ({test}, ignored): {call} ended in {o}: {msg}");
        return;
    }
    tally.add(call, &o);
    if !allowed(call, &o) {
        findings.push(format!("{call} ended in {o}: {msg}"));
    }
}

const KNOWN_BUG: &str = " (known bug)";

/// The SQLSTATE of an error, or "ok".
pub fn code<T>(r: &Result<T, Error>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => outcome(e),
    }
}

/// The message of an error, or "".
pub fn message<T>(r: &Result<T, Error>) -> String {
    match r {
        Ok(_) => String::new(),
        Err(e) => e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
    }
}
