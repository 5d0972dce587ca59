//! The approval card (`/card`, and the `<keyturn-card>` element at
//! `/card/keyturn-card.js`) and the operator console (`/console`): plain
//! HTML, CSS and JavaScript modules compiled into the binary, no build
//! step, nothing loaded from anywhere but this origin (docs/card.md).
//!
//! The pages hold no secret and decide nothing: they call `/rpc` with the
//! person's JWT, which, like the action's token, travels only in the URL
//! fragment (never sent to a server) or the tab's session storage.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::Error;
use crate::http::AppState;

/// `KEYTURN_FRAME_ANCESTORS`' default: no other page may frame the card.
pub const DEFAULT_FRAME_ANCESTORS: &str = "'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The files under `/card/`, by name.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "keyturn-card.js",
        JS,
        include_str!("../web/keyturn-card.js"),
    ),
    ("console.js", JS, include_str!("../web/console.js")),
    ("rpc.js", JS, include_str!("../web/rpc.js")),
    ("jcs.js", JS, include_str!("../web/jcs.js")),
    ("show.js", JS, include_str!("../web/show.js")),
    ("keyturn.css", CSS, include_str!("../web/keyturn.css")),
];

/// The pages' routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/card",
            get(|| async { page(include_str!("../web/card.html")) }),
        )
        .route(
            "/console",
            get(|| async { page(include_str!("../web/console.html")) }),
        )
        .route("/card/{asset}", get(asset))
}

fn page(html: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(HTML)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        html,
    )
        .into_response()
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    }
}

/// The Content-Security-Policy of every answer, with `frame_ancestors` (a
/// `KEYTURN_FRAME_ANCESTORS` value: `'none'`, `'self'`, or
/// space-separated sources such as `https://app.example.com`).
///
/// Only `'self'` may load anything: no inline script or style, no other
/// origin, no plugin, no `<base>`, no form posted anywhere. The sources
/// are checked character by character so a setting can never add a
/// directive of its own.
pub fn frame_ancestors_header(frame_ancestors: &str) -> Result<HeaderValue, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_frame_ancestors_accepts_sources_and_refuses_directives() {
        for ok in [
            "'none'",
            "'self'",
            "https://app.example.com 'self'",
            "https://*.example.com:8443",
        ] {
            let csp = frame_ancestors_header(ok).expect(ok);
            assert!(csp.to_str().unwrap().starts_with("default-src 'self';"));
            assert!(csp
                .to_str()
                .unwrap()
                .ends_with(&format!("frame-ancestors {ok}")));
        }
        for bad in [
            "",
            "https://a; script-src *",
            "'none' 'self'",
            "'unsafe-inline'",
            "a,b",
            "x\u{0}y",
        ] {
            assert!(frame_ancestors_header(bad).is_err(), "{bad:?}");
        }
        let folded =
            frame_ancestors_header("https://a.example\r\nhttps://b.example").expect("valid");
        assert!(folded
            .to_str()
            .unwrap()
            .ends_with("frame-ancestors https://a.example https://b.example"));
    }

    #[test]
    fn test_pages_load_only_same_origin_modules() {
        for html in [
            include_str!("../web/card.html"),
            include_str!("../web/console.html"),
        ] {
            assert!(!html.contains("<script>"), "no inline script");
            assert!(!html.contains("style="), "no inline style");
            assert!(
                !html.contains("http://") && !html.contains("https://"),
                "nothing from elsewhere"
            );
        }
    }
}
