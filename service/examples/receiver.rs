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
//! | `POST` any path | verifies `X-Keyturn-Signature` (`sha256=<hex HMAC-SHA256(secret, body)>`); a bad or missing signature is counted and answered 401; otherwise, after `--delay-ms`, the configured `--status` with an empty body |
//! | `GET /stats` | `{"total": n, "bad_signatures": n, "per_key": {"<Idempotency-Key>": n, …}, "duplicates": n}` |
//!
//! `duplicates` is the number of well-signed requests beyond the first for
//! their `Idempotency-Key`: after a benchmark it says how many retries the
//! receiver saw (each of them allowed by keyturn's rules only when the
//! provider had refused the earlier attempt, e.g. `--status 429`).
//!
//! The receiver never logs bodies or headers: it is a counter, not a sink.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use clap::Parser;
use hmac::{Hmac, Mac};
use sha2::Sha256;

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
    per_key: BTreeMap<String, u64>,
}

#[derive(Clone)]
struct Shared {
    secret: Arc<Vec<u8>>,
    status: StatusCode,
    delay: Duration,
    counts: Arc<Mutex<Counts>>,
}

/// True when `X-Keyturn-Signature` is the HMAC of exactly these body bytes.
fn signature_ok(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
    let Some(hex_sig) = headers
        .get("x-keyturn-signature")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
    else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&sig).is_ok() // constant time
}

async fn receive(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let ok = signature_ok(&s.secret, &headers, &body);
    {
        let mut c = s.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total += 1;
        if !ok {
            c.bad_signatures += 1;
        } else {
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            *c.per_key.entry(key).or_default() += 1;
        }
    }
    if !ok {
        return StatusCode::UNAUTHORIZED;
    }
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    s.status
}

async fn stats(State(s): State<Shared>) -> impl IntoResponse {
    let c = s.counts.lock().unwrap_or_else(|e| e.into_inner());
    let duplicates: u64 = c.per_key.values().map(|n| n.saturating_sub(1)).sum();
    let body = serde_json::json!({
        "total": c.total,
        "bad_signatures": c.bad_signatures,
        "per_key": c.per_key,
        "duplicates": duplicates,
    });
    ([("content-type", "application/json")], body.to_string())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let status = StatusCode::from_u16(args.status)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let shared = Shared {
        secret: Arc::new(args.secret.into_bytes()),
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
