//! Counts of calls by outcome, for the load and fuzz binaries: every call
//! ends `ok`, in an SQLSTATE, or `closed` (the connection went away), and the
//! binaries print the table and judge each row.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tokio_postgres::Error;

/// What a call ended in: its SQLSTATE, `closed` for a lost connection, or
/// `client` for an error that is neither (a type the client could not read).
pub fn outcome(e: &Error) -> String {
    match e.code() {
        Some(code) => code.code().to_owned(),
        None if e.is_closed() || e.to_string().contains("closed") => "closed".to_owned(),
        None => "client".to_owned(),
    }
}

/// Calls by (call, outcome).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    counts: BTreeMap<(String, String), u64>,
}

impl Tally {
    pub fn add(&mut self, call: &str, outcome: &str) {
        *self
            .counts
            .entry((call.to_owned(), outcome.to_owned()))
            .or_default() += 1;
    }

    pub fn merge(&mut self, other: &Tally) {
        for ((call, outcome), n) in &other.counts {
            *self
                .counts
                .entry((call.clone(), outcome.clone()))
                .or_default() += n;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.counts
            .iter()
            .map(|((c, o), n)| (c.as_str(), o.as_str(), *n))
    }

    pub fn total(&self, outcome: &str) -> u64 {
        self.iter()
            .filter(|(_, o, _)| *o == outcome)
            .map(|(_, _, n)| n)
            .sum()
    }

    /// The table, one line per call: `call  ok=N 55000=N …`, each outcome
    /// `judge` refuses marked `!`, then the totals per outcome.
    pub fn render(&self, judge: impl Fn(&str, &str) -> bool) -> String {
        let mut out = String::new();
        let mut by_call: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
        let mut by_outcome: BTreeMap<&str, u64> = BTreeMap::new();
        for (call, outcome, n) in self.iter() {
            by_call.entry(call).or_default().push((outcome, n));
            *by_outcome.entry(outcome).or_default() += n;
        }
        let width = by_call.keys().map(|c| c.len()).max().unwrap_or(0);
        for (call, outcomes) in &by_call {
            let cells: Vec<String> = outcomes
                .iter()
                .map(|(o, n)| format!("{o}={n}{}", if judge(call, o) { "" } else { "!" }))
                .collect();
            let _ = writeln!(out, "  {call:<width$}  {}", cells.join(" "));
        }
        let totals: Vec<String> = by_outcome.iter().map(|(o, n)| format!("{o}={n}")).collect();
        let _ = writeln!(out, "  {:<width$}  {}", "(all)", totals.join(" "));
        out
    }

    /// Rows `judge` refuses, as (call, outcome, count).
    pub fn refused(&self, judge: impl Fn(&str, &str) -> bool) -> Vec<(String, String, u64)> {
        self.iter()
            .filter(|(c, o, _)| !judge(c, o))
            .map(|(c, o, n)| (c.to_owned(), o.to_owned(), n))
            .collect()
    }
}
