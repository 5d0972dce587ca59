//! keyturnd — keyturn's thin dispatch service.
//!
//! The database (`pg_keyturn`) owns every rule; keyturnd only carries out
//! provider calls for rows the database has already moved forward, and
//! records what it observed. See docs/keyturnd.md.
//!
//! Table of contents:

pub mod classify;
pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod metrics;
pub mod operator;
pub mod providers;
pub mod shutdown;
pub mod worker;

pub use error::Error;
pub use http::{app, AppState};
