//! keyturn through PgBouncer in transaction mode: the pgbouncer layer
//! (`KT_ONLY=pgbouncer tests/run-all`), against the PgBouncer that
//! `tests/harness.sh` (`kt_pgbouncer_start`) puts in front of the private
//! cluster. Setup (tenants, tools, grants, rows) goes straight to the cluster,
//! as an admin's tooling would; the calls under test go through the pooler.
//!
//! Without `KT_PGBOUNCER_PORT` every test prints `SKIPPED <test>: <why>` and
//! passes; none skips silently.
//!
//! PostgREST is not packaged for Debian 12, so `supabase_tests` issues the
//! statements PostgREST issues for an RPC call (the role and the verified
//! claims set transaction-locally, then the function called with named
//! arguments from the JSON body), through PgBouncer.

#[macro_use]
mod support;

mod pooled_identity_tests;
mod supabase_tests;
