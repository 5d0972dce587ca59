//! A small webhook receiver for demos and benchmarks of keyturnd.
//!
//! ```text
//! cargo run -p keyturnd --example receiver -- \
//!     --listen 127.0.0.1:9000 --secret S [--status 200] [--delay-ms N]
//! ```
//!
//! Point keyturnd at it with `KEYTURN_WEBHOOK_URL=http://127.0.0.1:9000/`
//! and `KEYTURN_WEBHOOK_SECRET=S`.
//!
//! | route | answer |
//! |---|---|
//! | `POST` any path | verifies `webhook-signature` the [Standard Webhooks] way (`v1,<base64 HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")>`, the key being the decoded rest of a `whsec_<base64>` secret, else the secret's UTF-8 bytes; the timestamp within 5 minutes); a bad or missing signature is counted and answered 401; otherwise, after `--delay-ms`, the configured `--status` with an empty body |
//! | `GET /stats` | `{"total": n, "bad_signatures": n, "legacy_mismatches": n, "per_key": {"<Idempotency-Key>": n, …}, "duplicates": n, "attachments": n, "attachment_bytes": n, "bad_attachments": n, "notifications": n}` |
//!
//! The deprecated `X-Keyturn-Signature` (`sha256=<hex HMAC-SHA256(secret,
//! body)>`) is checked too when present; one that does not verify on an
//! otherwise well-signed request counts as a `legacy_mismatch`.
//!
//! `duplicates` is the number of well-signed requests beyond the first for
//! their `Idempotency-Key`: after a benchmark it says how many retries the
//! receiver saw (each of them allowed by keyturn's rules only when the
//! provider had refused the earlier attempt, e.g. `--status 429`).
//!
//! `attachments` counts the files of well-signed requests (the body's
//! `attachments` array) and `attachment_bytes` their decoded size; a file
//! whose `content_base64` does not decode to bytes of its `size` and
//! `sha256` is a `bad_attachment`. Each request with files prints one line
//! with the count and total size.
//!
//! The receiver never logs bodies, headers or filenames: it is a counter,
//! not a sink. One exception, for the demo: a well-signed notification
//! (`"type": "keyturn.notification"`, docs/notifications.md) prints one
//! line with its kind and the card link it carried, and counts in
//! `notifications`.
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use clap::Parser;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// How far a `webhook-timestamp` may be from now, as the Standard Webhooks
/// libraries allow.
const TOLERANCE_SECONDS: u64 = 5 * 60;

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "A webhook receiver that verifies keyturnd's signatures and counts requests")]
struct Args {
    /// Address to listen on (loopback unless you mean otherwise).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// The shared secret (KEYTURN_WEBHOOK_SECRET of the keyturnd under test).
    #[arg(long)]
    secret: String,
    /// Status code answered to every well-signed request.
    #[arg(long, default_value_t = 200)]
    status: u16,
    /// Milliseconds to wait before answering.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

#[derive(Default)]
struct Counts {
    total: u64,
    bad_signatures: u64,
    legacy_mismatches: u64,
    per_key: BTreeMap<String, u64>,
    attachments: u64,
    attachment_bytes: u64,
    bad_attachments: u64,
    notifications: u64,
}

#[derive(Clone)]
struct Shared {
    secret: Arc<Vec<u8>>,
    standard_key: Arc<Vec<u8>>,
    status: StatusCode,
    delay: Duration,
    counts: Arc<Mutex<Counts>>,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// True when `webhook-signature` holds a `v1` HMAC of
/// `<webhook-id>.<webhook-timestamp>.<body>` and the timestamp is recent.
fn standard_ok(key: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
    let (Some(id), Some(ts), Some(signatures)) = (
        header(headers, "webhook-id"),
        header(headers, "webhook-timestamp"),
        header(headers, "webhook-signature"),
    ) else {
        return false;
    };
    let Ok(sent_at) = ts.parse::<u64>() else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now.abs_diff(sent_at) > TOLERANCE_SECONDS {
        return false;
    }
    // Several space-separated signatures are allowed (key rotation).
    signatures.split(' ').any(|entry| {
        let Some(Ok(sig)) = entry.strip_prefix("v1,").map(|b| STANDARD.decode(b)) else {
            return false;
        };
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return false;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.verify_slice(&sig).is_ok() // constant time
    })
}

/// `Some(true)` when the deprecated `X-Keyturn-Signature` is the HMAC of
/// exactly these body bytes, `None` when it is absent.
fn legacy_ok(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Option<bool> {
    let given = header(headers, "x-keyturn-signature")?;
    let Some(Ok(sig)) = given.strip_prefix("sha256=").map(hex::decode) else {
        return Some(false);
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return Some(false);
    };
    mac.update(body);
    Some(mac.verify_slice(&sig).is_ok())
}

/// (files, decoded bytes, files that do not match their metadata) of a body.
fn attachment_counts(body: &[u8]) -> (u64, u64, u64) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (0, 0, 0);
    };
    let Some(items) = value.get("attachments").and_then(|v| v.as_array()) else {
        return (0, 0, 0);
    };
    let (mut bytes, mut bad) = (0u64, 0u64);
    for item in items {
        let decoded = item
            .get("content_base64")
            .and_then(|v| v.as_str())
            .and_then(|b| STANDARD.decode(b).ok());
        let Some(decoded) = decoded else {
            bad += 1;
            continue;
        };
        let len = decoded.len() as u64;
        bytes += len;
        let matches = item.get("size").and_then(|v| v.as_u64()) == Some(len)
            && item.get("sha256").and_then(|v| v.as_str())
                == Some(hex::encode(Sha256::digest(&decoded)).as_str());
        if !matches {
            bad += 1;
        }
    }
    (items.len() as u64, bytes, bad)
}

async fn receive(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let ok = standard_ok(&s.standard_key, &headers, &body);
    let legacy = legacy_ok(&s.secret, &headers, &body);
    let (files, file_bytes, bad_files) = if ok {
        attachment_counts(&body)
    } else {
        (0, 0, 0)
    };
    {
        let mut c = s.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total += 1;
        if !ok {
            c.bad_signatures += 1;
        } else {
            if legacy == Some(false) {
                c.legacy_mismatches += 1;
            }
            let key = header(&headers, "idempotency-key").unwrap_or("").to_owned();
            *c.per_key.entry(key).or_default() += 1;
            c.attachments += files;
            c.attachment_bytes += file_bytes;
            c.bad_attachments += bad_files;
        }
    }
    if files > 0 {
        eprintln!("request with {files} attachment(s), {file_bytes} bytes, {bad_files} not matching their metadata");
    }
    if let Some((kind, link)) = ok.then(|| notification(&body)).flatten() {
        s.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notifications += 1;
        eprintln!("notification ({kind}), card link: {link}");
    }
    if !ok {
        return StatusCode::UNAUTHORIZED;
    }
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    s.status
}

/// (kind, card link) of a keyturn notification's body.
fn notification(body: &[u8]) -> Option<(String, String)> {
    let value = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    if value.get("type")?.as_str()? != "keyturn.notification" {
        return None;
    }
    let data = value.get("data")?;
    Some((
        data.get("kind")?.as_str()?.to_owned(),
        data.get("link")?.as_str()?.to_owned(),
    ))
}

async fn stats(State(s): State<Shared>) -> impl IntoResponse {
    let c = s.counts.lock().unwrap_or_else(|e| e.into_inner());
    let duplicates: u64 = c.per_key.values().map(|n| n.saturating_sub(1)).sum();
    let body = serde_json::json!({
        "total": c.total,
        "bad_signatures": c.bad_signatures,
        "legacy_mismatches": c.legacy_mismatches,
        "per_key": c.per_key,
        "duplicates": duplicates,
        "attachments": c.attachments,
        "attachment_bytes": c.attachment_bytes,
        "bad_attachments": c.bad_attachments,
        "notifications": c.notifications,
    });
    ([("content-type", "application/json")], body.to_string())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let status = StatusCode::from_u16(args.status)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // keyturnd's own rule for the key, so both ends read a secret alike.
    let standard_key = keyturnd::config::webhook_key(&args.secret)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let shared = Shared {
        secret: Arc::new(args.secret.into_bytes()),
        standard_key: Arc::new(standard_key),
        status,
        delay: Duration::from_millis(args.delay_ms),
        counts: Arc::default(),
    };
    let app = Router::new()
        .route("/stats", get(stats))
        .fallback(receive)
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "receiver listening on http://{} (status {}, delay {} ms); GET /stats for counts",
        listener.local_addr()?,
        args.status,
        args.delay_ms
    );
    axum::serve(listener, app).await
}
