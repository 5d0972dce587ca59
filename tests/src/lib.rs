//! Shared fixtures for keyturn's integration tests.
//!
//! The tests run against the private cluster that `tests/run-all` starts (see
//! `tests/harness.sh`), reached through `KT_PGPORT`. Each test makes its own
//! tenant and tool names, so tests run in parallel without seeing each other.
//! Login roles come from `tests/fixtures/crm.sql`: app_agent (keyturn_agent),
//! app_human (keyturn_approver), app_admin, app_dispatcher, app_operator.
//!
//! Identity is asserted the way a pooled application must: inside each
//! transaction, with `set_config(…, true)`, never for the whole session (a
//! session value travels with a pooled connection to its next client). A
//! [`Conn`] does that for every statement it runs; the admin, superuser and
//! dispatcher connections carry no identity and are plain `Client`s.
//!
//! | module | what it holds |
//! |---|---|
//! | [`conn`] | connections, [`Conn`] and [`Tx`] (identity per transaction), the [`Sql`] trait, SQLSTATE and message of an error |
//! | [`world`] | [`World`], a tenant to test in, and the calls made through it |
//! | [`dispatch`] | the dispatcher's side: `LISTEN`, leases, begin, complete, attempts |
//! | [`checks`] | the superuser's checks and tampering |
//! | [`skips`] | telling `tests/run-all` that a check could not run |
//! | [`tally`], [`server_log`] | what the load and fuzz binaries share: counts of calls by outcome, and the server log's word on crashes |
//!
//! Every public name is re-exported here, so tests `use keyturn_tests::…`
//! whatever module holds it.

pub use tokio_postgres::error::SqlState;

pub mod checks;
pub mod conn;
pub mod dispatch;
pub mod server_log;
pub mod skips;
pub mod tally;
pub mod world;

pub use checks::*;
pub use conn::*;
pub use dispatch::*;
pub use skips::*;
pub use world::*;
