//! The one error type of keyturn-core.
//!
//! Every failure here is the caller's input being unacceptable (bad JSON, a number
//! that would hash ambiguously, a schema outside the supported subset, params that
//! fail it, a broken summary template, params a summary cannot show in full, a
//! malformed scope, a projection spec outside its rules), so the extension maps
//! all of them to SQLSTATE `22023` (invalid_parameter_value). The messages are
//! shown to agents and administrators verbatim: each says what was wrong and what
//! to send instead.

use std::fmt;

/// Why keyturn-core refused an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// The text is not a single well-formed JSON value (serde_json's message, with
    /// line and column, or a keyturn-specific reason such as a duplicate key).
    #[error("invalid JSON: {0}; send one well-formed JSON value (RFC 8259) without duplicate object keys")]
    InvalidJson(String),

    /// A number literal whose value a double cannot hold exactly; the literal is kept
    /// so the agent can find it.
    #[error(
        "number {0} cannot be represented exactly as an IEEE-754 double, so two different \
         values would share one hash; send it as a string"
    )]
    InexactNumber(String),

    /// A number literal outside the finite double range (e.g. `1e400`).
    #[error(
        "number {0} is outside the range of an IEEE-754 double and has no canonical form; \
         send it as a string"
    )]
    NonFiniteNumber(String),

    /// Arrays/objects nested deeper than the limit.
    #[error("JSON nesting is deeper than {limit} levels; flatten the params")]
    TooDeep { limit: usize },

    /// Input (or its canonical form) longer than the limit in bytes.
    #[error("JSON is larger than {limit} bytes; send smaller params or store the bulk elsewhere and pass a reference")]
    TooLarge { limit: usize },

    /// A params_schema outside the supported subset (message names keyword and path).
    #[error("invalid params_schema: {0}")]
    InvalidSchema(String),

    /// Params that fail the tool's params_schema, one entry per failure, each
    /// starting with the JSON pointer of the offending value.
    #[error("params do not match the tool's params_schema: {}; fix them and propose again", Joined(.0))]
    InvalidParams(Vec<String>),

    /// A summary template that does not parse.
    #[error("invalid summary template: {0}")]
    InvalidTemplate(String),

    /// A grant or standing-approval scope outside the scope language (message
    /// names the path or key and what to send instead).
    #[error("invalid scope: {0}")]
    InvalidScope(String),

    /// Params the approval summary cannot show in full (strict rendering), one
    /// entry per placeholder, each naming it.
    #[error(
        "the approval summary cannot show these params faithfully: {}; send shorter values \
         or fewer list elements",
        Joined(.0)
    )]
    UnfaithfulSummary(Vec<String>),

    /// A read-side projection spec outside its rules (message names the key
    /// or path).
    #[error("invalid projection spec: {0}")]
    InvalidProjection(String),

    /// A notification channel's target or settings outside their rules
    /// (crate::notify; the message says what to send instead).
    #[error("invalid notification target: {0}")]
    InvalidTarget(String),
}

impl CoreError {
    /// The SQLSTATE the extension raises for this error: always `22023`, because
    /// every variant describes an unacceptable parameter value.
    pub fn sqlstate(&self) -> &'static str {
        "22023"
    }
}

/// Displays a list of messages separated by "; " without allocating a joined copy.
struct Joined<'a>(&'a [String]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(item)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_inexact_number_message_names_literal_and_remedy() {
        let msg = CoreError::InexactNumber("9007199254740993".into()).to_string();
        assert_eq!(
            msg,
            "number 9007199254740993 cannot be represented exactly as an IEEE-754 double, \
             so two different values would share one hash; send it as a string"
        );
    }

    #[test]
    fn test_invalid_params_joins_every_failure() {
        let e = CoreError::InvalidParams(vec!["/to: bad".into(), "/subject: missing".into()]);
        assert_eq!(
            e.to_string(),
            "params do not match the tool's params_schema: /to: bad; /subject: missing; \
             fix them and propose again"
        );
    }

    #[test]
    fn test_limits_appear_in_messages() {
        assert!(CoreError::TooDeep { limit: 64 }
            .to_string()
            .contains("64 levels"));
        assert!(CoreError::TooLarge { limit: 1048576 }
            .to_string()
            .contains("1048576 bytes"));
    }

    #[test]
    fn test_every_variant_maps_to_22023() {
        let all = [
            CoreError::InvalidJson(String::new()),
            CoreError::InexactNumber(String::new()),
            CoreError::NonFiniteNumber(String::new()),
            CoreError::TooDeep { limit: 1 },
            CoreError::TooLarge { limit: 1 },
            CoreError::InvalidSchema(String::new()),
            CoreError::InvalidParams(Vec::new()),
            CoreError::InvalidTemplate(String::new()),
            CoreError::InvalidScope(String::new()),
            CoreError::UnfaithfulSummary(Vec::new()),
            CoreError::InvalidProjection(String::new()),
            CoreError::InvalidTarget(String::new()),
        ];
        for e in all {
            assert_eq!(e.sqlstate(), "22023", "{e:?}");
        }
    }
}
