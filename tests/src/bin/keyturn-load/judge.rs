//! Which outcomes a call may end in under load.
//!
//! A call may end in the SQLSTATEs docs/sql-api.md documents for it, or in
//! what the faults explain: 57014 (a cancel or a statement timeout), 55P03
//! (a lock timeout), 57P01 and a closed connection (a terminated backend),
//! 40001 and 40P01 (retried by link.rs; only running out of retries is a
//! failure). Anything else, XX000 first of all, fails the run.

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
