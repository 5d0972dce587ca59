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

use crate::state::AppState;

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

#[cfg(test)]
mod tests {
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
