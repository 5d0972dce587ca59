//! keyturn-core: the pure, database-free logic of keyturn.
//!
//! Everything here is deterministic (except token and marker minting) and
//! unit-testable with plain `cargo test -p keyturn-core`. The pgrx extension
//! and keyturnd wrap these functions; they never re-implement them.
//!
//! * [`canonical`]: RFC 8785 canonical JSON and the params hash approvals bind to.
//! * [`audit`]: the hash of an event of the audit chain.
//! * [`token`]: one-time approval tokens, their digest and binding.
//! * [`schema`]: the params_schema subset and params validation.
//! * [`email`]: the bare addr-spec that `"format": "email"` and the SMTP
//!   adapter accept.
//! * [`credentials`]: finding and redacting credential material.
//! * [`template`]: the approval summary, rendered so that it cannot lie.
//! * [`fence`]: projecting and fencing connected-app data for a prompt.
//! * [`upstream`]: tools discovered on an upstream MCP server: read or write
//!   (fail closed), their params schema, the hash of their definition.
//! * [`notify`]: where a notification may go: each channel's target, and
//!   which network addresses keyturnd may connect to for one.
//! * [`text`]: the character classes the modules above share (invisible,
//!   bidi, controls, quotes), so each rule lives in one place.
//! * [`error`]: [`CoreError`], every variant SQLSTATE 22023.

pub mod approval;
pub mod audit;
pub mod canonical;
pub mod credentials;
pub mod email;
pub mod error;
pub mod fence;
pub mod notify;
pub mod schema;
pub mod scope; // which params a scoped grant or standing approval covers
pub mod template;
pub mod text;
pub mod token;
pub mod upstream;

pub use error::CoreError;
