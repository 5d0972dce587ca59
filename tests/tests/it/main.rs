//! keyturn's integration tests, over real connections to the private cluster
//! `tests/run-all` starts. One binary rather than one per file: every test
//! binary is a link step of its own over tokio, tokio-postgres and the
//! fixtures, fifteen of them on a two-core machine. Test names keep their file as module
//! (`approve_tests::test_…`), so the README's index of fail-closed cases
//! still names them.
//!
//! All modules share one process, so the tests run concurrently across files
//! too: anything that acts on every tenant at once (lease, sweep) is
//! serialized with `DISPATCH_LOCK`, see there.

mod approve_outcomes_tests;
mod approve_tests;
mod attachment_tests;
mod audit_chain_tests;
mod audit_tests;
mod ceremony_tests;
mod console_tests;
mod delegation_tests;
mod dispatch_batch_tests;
mod dispatch_for_tests;
mod dispatch_tests;
mod evidence_tests;
mod fuzz_findings_tests;
mod grant_scope_tests;
mod hardening_tests;
mod identity_tests;
mod installation_tests;
mod links_tests;
mod mcp_tests;
mod membership_tests;
mod notify_tests;
mod preview_session_tests;
mod privileges_tests;
mod propose_input_tests;
mod propose_tests;
mod recovery_tests;
mod rls_tests;
mod security_tests;
mod separation_tests;
mod task_tests;
mod tools_tests;
