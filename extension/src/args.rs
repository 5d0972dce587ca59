//! Arguments checked before anything is read: a name that must not be blank
//! (`_require_text`), lease's (`_check_lease_args`), a batch's arrays
//! (`_batch_check_arrays`), and the rounds a batch that names an action twice
//! runs in (`_batch_rounds`).
//!
//! In Rust because every lease, begin and complete asks them, from plpgsql:
//! as plpgsql functions each call started an interpreter of its own, 10 to
//! 13 µs apiece (tests/bench/BENCHMARKS.md), where these take one or two.

use std::collections::HashMap;
use std::ffi::CStr;

use pgrx::datum::Interval;
use pgrx::prelude::*;

use crate::error::KeyturnError;

/// The most elements a batch (`begin_dispatch_many`, `complete_many`) and a
/// lease take.
const BATCH_MAX: i32 = 1000;

const SECOND_US: i128 = 1_000_000;
const HOUR_US: i128 = 3_600 * SECOND_US;

fn invalid(message: String, hint: &'static str) -> ! {
    KeyturnError::InvalidArgument { message, hint }.raise()
}

/// `value`, which names `what`; raises 22023 when it is NULL or blank (only
/// spaces, as `btrim` trims).
pub fn require_text<'a>(what: &str, value: Option<&'a str>) -> &'a str {
    match value {
        Some(v) if !v.trim_matches(' ').is_empty() => v,
        _ => invalid(
            format!("{what} must be a non-empty string"),
            "Pass a name with at least one character other than a space.",
        ),
    }
}

/// [`require_text`] for keyturn's functions written in SQL: one rule, one
/// place.
#[pg_extern(name = "_require_text", immutable, parallel_safe)]
fn require_text_sql(p_value: Option<&str>, p_what: &str) -> String {
    require_text(p_what, p_value).to_owned()
}

/// lease's and lease_for's arguments (22023 for each that is out of range).
#[pg_extern(name = "_check_lease_args", immutable, parallel_safe)]
fn check_lease_args(
    p_worker: Option<&str>,
    p_max_jobs: Option<i32>,
    p_lease_for: Option<Interval>,
) {
    require_text("worker", p_worker);
    match p_max_jobs {
        Some(n) if (1..=BATCH_MAX).contains(&n) => {}
        n => invalid(
            format!("max_jobs must be from 1 to {BATCH_MAX}, not {}", shown(n)),
            "Ask for at most as many jobs as the worker has free slots.",
        ),
    }
    match p_lease_for {
        // Compared as PostgreSQL compares intervals: a month is 30 days.
        Some(d) if (SECOND_US..=HOUR_US).contains(&d.as_micros()) => {}
        d => invalid(
            format!(
                "lease_for must be from 1 second to 1 hour, not {}",
                d.map_or_else(|| "NULL".to_owned(), interval_text)
            ),
            "A lease should outlast one provider call with its timeout, and no more.",
        ),
    }
}

/// A batch's two array lengths, equal and at most 1000 (22023 otherwise);
/// returns the length.
#[pg_extern(name = "_batch_check_arrays", immutable, parallel_safe)]
fn batch_check_arrays(p_n1: Option<i32>, p_n2: Option<i32>, p_what: &str) -> i32 {
    let n = match (p_n1, p_n2) {
        (Some(n1), Some(n2)) if n1 == n2 => n1,
        _ => invalid(
            format!("{p_what} must be arrays of equal length"),
            "Pass one element of each array per action, none of them NULL.",
        ),
    };
    if n > BATCH_MAX {
        invalid(
            format!("at most {BATCH_MAX} elements per batch, not {n}"),
            "Split the batch: each call takes at most 1000 actions.",
        );
    }
    n
}

/// Each element's round: 1 for an action's first occurrence in the batch, 2
/// for its second, and so on (NULL ids count as one action). NULL when every
/// action occurs once, the common case: one round, the batch as it is.
#[pg_extern(name = "_batch_rounds", immutable, strict, parallel_safe)]
fn batch_rounds(p_ids: Vec<Option<pgrx::Uuid>>) -> Option<Vec<i32>> {
    let mut seen: HashMap<Option<[u8; 16]>, i32> = HashMap::with_capacity(p_ids.len());
    let rounds: Vec<i32> = p_ids
        .iter()
        .map(|id| {
            let round = seen.entry(id.map(|u| *u.as_bytes())).or_insert(0);
            *round += 1;
            *round
        })
        .collect();
    (seen.len() < rounds.len()).then_some(rounds)
}

fn shown(n: Option<i32>) -> String {
    n.map_or_else(|| "NULL".to_owned(), |n| n.to_string())
}

/// An interval as PostgreSQL prints it (the session's IntervalStyle), as the
/// messages of the calls written in SQL do.
fn interval_text(d: Interval) -> String {
    // SAFETY: interval_out takes one interval datum and returns a palloc'd
    // C string, which is copied before the memory context can go away.
    unsafe {
        let out = pgrx::direct_function_call::<&CStr>(pg_sys::interval_out, &[d.into_datum()]);
        out.map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    }
}
