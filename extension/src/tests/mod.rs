//! `#[pg_test]`s: single-transaction behaviour inside a real backend.
//! One file per feature; tests are named after the behaviour they pin down.

mod args_tests;
mod canonical_tests;
mod gate_tests;
mod identity_tests;
