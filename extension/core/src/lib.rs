//! keyturn-core: the pure, database-free logic of keyturn.
//!
//! Everything here is deterministic (except token minting) and unit-testable with
//! plain `cargo test -p keyturn-core`. The pgrx extension wraps these functions; it
//! never re-implements them.

pub mod canonical;
pub mod credentials;
pub mod email;
pub mod error;
pub mod fence;
pub mod schema;
pub mod template;
pub mod text;
pub mod token;

pub use error::CoreError;
