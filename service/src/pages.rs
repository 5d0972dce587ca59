//! The approval card (`/card`, and the `<keyturn-card>` element at
//! `/card/keyturn-card.js`) and the operator console (`/console`): plain
//! HTML, CSS and JavaScript modules compiled into the binary, no build
//! step, nothing loaded from anywhere but this origin (docs/card.md). For
//! the card on a phone (docs/notifications.md): a web app manifest, a
//! service worker that shows Web Push notifications and opens their card
//! links, the hook that subscribes (`push.js`), and `/card/push-key`.
//!
//! The pages hold no secret and decide nothing: they call `/rpc` with the
//! person's JWT, which, like the action's token, travels only in the URL
//! fragment (never sent to a server) or the tab's session storage.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::OnceLock;

use crate::state::AppState;

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const MANIFEST: &str = "application/manifest+json";
const SVG: &str = "image/svg+xml";

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
    // The card on a phone (docs/notifications.md): installable, and
    // subscribed to Web Push with the person's consent.
    (
        "manifest.webmanifest",
        MANIFEST,
        include_str!("../web/manifest.webmanifest"),
    ),
    ("icon.svg", SVG, include_str!("../web/icon.svg")),
    (SERVICE_WORKER, JS, include_str!("../web/sw.js")),
    ("push.js", JS, include_str!("../web/push.js")),
];

/// The service worker: served under `/card/` but registered for the scope
/// `/card`, the card page itself, which `Service-Worker-Allowed` permits.
const SERVICE_WORKER: &str = "sw.js";

/// The module that tells the card which characters are invisible.
pub const INVISIBLE_JS: &str = "invisible.js";

/// `/card/invisible.js`: keyturn-core's definitions of what a reader cannot
/// see for what it is, as the ranges of regular-expression classes made by
/// walking every code point once: `INVISIBLE`, the characters that may
/// render as nothing ([`keyturn_core::text::is_invisible`], the one the
/// server applies to summaries, credentials and fences), and `SPACES`, what
/// draws as a space and is not U+0020
/// ([`keyturn_core::text::is_space_lookalike`], which the server shows as a
/// plain space). So the card marks exactly what the server calls so, and no
/// list is kept twice.
pub fn invisible_js() -> &'static str {
    static JS: OnceLock<String> = OnceLock::new();
    JS.get_or_init(|| {
        format!(
            "// Made by keyturnd from keyturn-core (keyturn_core::text): as RegExp classes,\n\
             // the characters that may render as nothing (is_invisible)...\n\
             export const INVISIBLE = \"{}\";\n\
             // ...and those that draw as a space and are not U+0020 (is_space_lookalike).\n\
             export const SPACES = \"{}\";\n",
            regexp_class(keyturn_core::text::is_invisible),
            regexp_class(keyturn_core::text::is_space_lookalike),
        )
    })
}

/// The code points `member` holds, as the body of a RegExp class (`u` flag),
/// escaped for a JavaScript string literal.
fn regexp_class(member: fn(char) -> bool) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for c in ('\0'..=char::MAX).filter(|&c| member(c)) {
        let cp = u32::from(c);
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == cp => *end = cp,
            _ => ranges.push((cp, cp)),
        }
    }
    ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                format!("\\\\u{{{a:X}}}")
            } else {
                format!("\\\\u{{{a:X}}}-\\\\u{{{b:X}}}")
            }
        })
        .collect()
}

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
        .route("/card/push-key", get(push_key))
        .route("/card/{asset}", get(asset))
}

/// `/card/push-key`: the VAPID public key a browser subscribes to Web Push
/// with (`applicationServerKey`), `{"public_key": "<base64url>"}`; 404 when
/// keyturnd sends no Web Push.
async fn push_key(State(state): State<AppState>) -> Response {
    match &state.vapid_public_key {
        Some(key) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            serde_json::json!({ "public_key": key }).to_string(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "Web Push is not configured\n").into_response(),
    }
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
    if name == INVISIBLE_JS {
        return (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(JS)),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            invisible_js(),
        )
            .into_response();
    }
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => {
            let mut response = (
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                ],
                *body,
            )
                .into_response();
            if name == SERVICE_WORKER {
                response
                    .headers_mut()
                    .insert("service-worker-allowed", HeaderValue::from_static("/card"));
            }
            response
        }
        None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::invisible_js;

    /// The ranges of the class `name` of `/card/invisible.js`, read back.
    fn ranges(name: &str) -> Vec<(u32, u32)> {
        let js = invisible_js();
        let class = js
            .split_once(&format!("export const {name} = \""))
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(class, _)| class)
            .expect("the export");
        let cp = |s: &str| {
            u32::from_str_radix(s.trim_start_matches("\\\\u{").trim_end_matches('}'), 16)
                .expect("hex")
        };
        class
            .split_inclusive('}')
            .fold(Vec::new(), |mut out: Vec<(u32, u32)>, piece| {
                match piece.strip_prefix('-') {
                    Some(end) => out.last_mut().expect("a start").1 = cp(end),
                    None => {
                        let c = cp(piece);
                        out.push((c, c));
                    }
                }
                out
            })
    }

    #[test]
    fn test_invisible_js_is_keyturn_core_code_point_by_code_point() {
        for (name, member) in [
            (
                "INVISIBLE",
                keyturn_core::text::is_invisible as fn(char) -> bool,
            ),
            ("SPACES", keyturn_core::text::is_space_lookalike),
        ] {
            let ranges = ranges(name);
            for c in '\0'..=char::MAX {
                let cp = u32::from(c);
                let listed = ranges.iter().any(|&(a, b)| (a..=b).contains(&cp));
                assert_eq!(listed, member(c), "{name}: U+{cp:04X}");
            }
        }
        assert!(invisible_js().contains("\\\\u{2800}"), "{}", invisible_js());
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
