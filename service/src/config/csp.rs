//! The Content-Security-Policy keyturnd's pages are served with.

use axum::http::HeaderValue;

use crate::error::Error;

/// `KEYTURN_FRAME_ANCESTORS`' default: no other page may frame the card.
pub const DEFAULT_FRAME_ANCESTORS: &str = "'none'";

/// The Content-Security-Policy of every answer, with `frame_ancestors` (a
/// `KEYTURN_FRAME_ANCESTORS` value: `'none'`, `'self'`, or
/// space-separated sources such as `https://app.example.com`).
///
/// Only `'self'` may load anything: no inline script or style, no other
/// origin, no plugin, no `<base>`, no form posted anywhere. The sources
/// are checked character by character so a setting can never add a
/// directive of its own.
pub fn csp_header(frame_ancestors: &str) -> Result<HeaderValue, Error> {
    let sources: Vec<&str> = frame_ancestors.split_ascii_whitespace().collect();
    let keyword = |s: &str| matches!(s, "'self'" | "'none'");
    let source = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~:/*".contains(c))
    };
    let ok = !sources.is_empty()
        && sources.iter().all(|s| keyword(s) || source(s))
        && (!sources.contains(&"'none'") || sources.len() == 1);
    if !ok {
        return Err(Error::Config(format!(
            "KEYTURN_FRAME_ANCESTORS={frame_ancestors:?} must be 'none', 'self', or space-separated \
             sources such as https://app.example.com"
        )));
    }
    let policy = format!(
        "default-src 'self'; base-uri 'none'; form-action 'none'; object-src 'none'; frame-ancestors {}",
        sources.join(" ")
    );
    HeaderValue::from_str(&policy)
        .map_err(|e| Error::Config(format!("KEYTURN_FRAME_ANCESTORS: {e}")))
}
