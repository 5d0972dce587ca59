//! keyturnd — keyturn's thin dispatch service.
//!
//! The database (`pg_keyturn`) owns every rule; keyturnd only carries out
//! provider calls for rows the database has already moved forward, and
//! records what it observed (README, section keyturnd).
//!
//! | module | what it holds |
//! |---|---|
//! | [`config`] | every setting, from flags, the environment and a TOML file; the start-up checks |
//! | [`compat`] | the `pg_keyturn` version this build serves against |
//! | [`db`] | the SQL keyturnd runs, one function per keyturn call, and the pool |
//! | [`worker`] | the dispatch loop: lease → begin → call → completion, the `LISTEN` connection, the sweeper |
//! | [`providers`] | the adapters: [`providers::webhook`], [`providers::smtp`] |
//! | [`classify`] | provider results → `succeeded` / `failed` / `retry` / `unknown` |
//! | [`http`] | `/healthz`, `/readyz`, `/metrics` |
//! | [`metrics`] | the Prometheus registry |
//! | [`journal`] | the outcome journal: observed outcomes on disk until the database has them |
//! | [`operator`] | `keyturnd uncertain` and `keyturnd reconcile` |
//! | [`shutdown`] | SIGTERM / SIGINT → drain |
//! | [`error`] | the one error type |

pub mod classify;
pub mod compat;
pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod journal;
pub mod metrics;
pub mod operator;
pub mod providers;
pub mod shutdown;
pub mod worker;

pub use error::Error;
pub use http::{app, AppState};
