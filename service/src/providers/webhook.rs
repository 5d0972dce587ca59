//! The `webhook` adapter: one signed HTTP POST per attempt.
//!
//! **Body.** A JSON object built only from fields fixed at propose time, so
//! every attempt of one action sends the same bytes:
//!
//! ```json
//! {"action_id":"…","tenant":"…","tool":"…","idempotency_key":"…","params":{…}}
//! ```
//!
//! (`attempt` is deliberately absent: it changes between attempts.) The body
//! is serialized once per attempt and those exact bytes are both signed and
//! sent; `params` arrive from `jsonb`, whose key order is canonical, and
//! `serde_json` writes fields in declaration order, so the bytes do not
//! depend on the attempt.
//!
//! **Headers.**
//!
//! | header | value |
//! |---|---|
//! | `Content-Type` | `application/json` |
//! | `Idempotency-Key` | the action's idempotency key (never changes) |
//! | `X-Keyturn-Signature` | `sha256=<lowercase hex HMAC-SHA256(key = UTF-8 bytes of KEYTURN_WEBHOOK_SECRET, message = exact body bytes)>` |
//! | `X-Keyturn-Timestamp` | Unix seconds when this attempt was sent |
//!
//! The timestamp is informational and *not* covered by the signature (the
//! contract fixes the signature to the body bytes alone). A receiver that
//! wants replay protection deduplicates on `Idempotency-Key`, which is
//! exactly what it must do anyway.
//!
//! **Transport.** rustls, HTTP/1.1, no redirects followed (a 3xx is
//! `unknown`), no proxy (a proxy would turn "connection refused" — a safe
//! `retry` — into a 502 from the proxy, i.e. `unknown`). The connect timeout
//! is shorter than the call timeout so that a slow connect is reported as a
//! connect failure, never as a timeout after sending.
//!
//! **Receipt.** `{"status": <code>, "provider_message_id": <X-Message-Id or
//! X-Request-Id header, else the `id` field of a 2xx JSON body, else null>}`;
//! on a transport failure `{"error": "connect" | "timeout" | "transport"}`.
//! Bodies are read only to find that id (at most 64 KiB) and never stored.

use std::time::{Duration, Instant, SystemTime};

use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde::Serialize;
use serde_json::json;
use sha2::Sha256;

use super::{clean_message_id, BoxFuture, CallResult, Provider};
use crate::classify::{self, Outcome};
use crate::config::Secret;
use crate::db::LeasedJob;
use crate::error::Error;

/// The provider name tools use.
pub const NAME: &str = "webhook";

/// Longest connect phase: a provider that takes longer to accept a
/// connection is treated as unreachable (a safe `retry`).
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Most of a response body read while looking for an `id`.
const MAX_ID_BODY_BYTES: usize = 64 * 1024;

/// Response headers that carry a provider's own id for the request.
const ID_HEADERS: [&str; 2] = ["x-message-id", "x-request-id"];

/// The body, fields in a fixed order.
#[derive(Serialize)]
struct Body<'a> {
    action_id: &'a uuid::Uuid,
    tenant: &'a str,
    tool: &'a str,
    idempotency_key: &'a str,
    params: &'a serde_json::Value,
}

/// The exact body bytes for a job. Identical for every attempt of an action.
pub fn body(job: &LeasedJob) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&Body {
        action_id: &job.action_id,
        tenant: &job.tenant,
        tool: &job.tool,
        idempotency_key: &job.idempotency_key,
        params: &job.params,
    })
}

/// `sha256=<lowercase hex HMAC-SHA256(secret, body)>`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// POSTs each job to one configured URL.
pub struct WebhookProvider {
    client: reqwest::Client,
    url: url::Url,
    secret: Secret,
}

impl WebhookProvider {
    /// Builds the adapter. The connect timeout is fixed per client; the total
    /// timeout is set per call from the lease left.
    pub fn new(url: url::Url, secret: Secret) -> Result<Self, Error> {
        Self::with_connect_timeout(url, secret, MAX_CONNECT_TIMEOUT)
    }

    /// As [`new`](Self::new), with an explicit connect timeout (it must stay
    /// below every call timeout).
    pub fn with_connect_timeout(
        url: url::Url,
        secret: Secret,
        connect_timeout: Duration,
    ) -> Result<Self, Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(connect_timeout.min(MAX_CONNECT_TIMEOUT))
            .user_agent(concat!("keyturnd/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(WebhookProvider {
            client,
            url,
            secret,
        })
    }

    async fn attempt(&self, job: &LeasedJob, timeout: Duration) -> CallResult {
        let refused = |why: &str| CallResult {
            outcome: Outcome::Failed,
            receipt: json!({ "error": why }),
        };
        let body = match body(job) {
            Ok(b) => b,
            Err(_) => return refused("params could not be serialized"),
        };
        let key = match HeaderValue::from_str(&job.idempotency_key) {
            Ok(v) => v,
            Err(_) => return refused("idempotency key is not a valid header value"),
        };
        let sig = signature(self.secret.expose().as_bytes(), &body);
        let sig = match HeaderValue::from_str(&sig) {
            Ok(v) => v,
            Err(_) => return refused("signature is not a valid header value"),
        };
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let deadline = Instant::now() + timeout;

        let sent = self
            .client
            .post(self.url.clone())
            .timeout(timeout)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("idempotency-key", key)
            .header("x-keyturn-timestamp", timestamp)
            .header("x-keyturn-signature", sig)
            .body(body)
            .send()
            .await;

        match sent {
            Err(err) => {
                let outcome = classify::http_transport_error(&err);
                let kind = if err.is_connect() {
                    "connect"
                } else if err.is_timeout() {
                    "timeout"
                } else {
                    "transport"
                };
                // without_url(): the URL may carry a token in its query.
                tracing::warn!(error = %err.without_url(), kind, outcome = outcome.word(), "webhook request failed");
                CallResult {
                    outcome,
                    receipt: json!({ "error": kind }),
                }
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let outcome =
                    classify::http_response(status, response.headers(), SystemTime::now());
                let mut message_id = header_message_id(response.headers());
                if message_id.is_none() && outcome == Outcome::Succeeded {
                    message_id = body_message_id(response, deadline).await;
                }
                tracing::info!(status, outcome = outcome.word(), "webhook answered");
                CallResult {
                    outcome,
                    receipt: json!({ "status": status, "provider_message_id": message_id }),
                }
            }
        }
    }
}

impl Provider for WebhookProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn call<'a>(&'a self, job: &'a LeasedJob, timeout: Duration) -> BoxFuture<'a, CallResult> {
        Box::pin(self.attempt(job, timeout))
    }
}

fn header_message_id(headers: &HeaderMap) -> Option<String> {
    ID_HEADERS
        .iter()
        .filter_map(|h| headers.get(*h))
        .filter_map(|v| v.to_str().ok())
        .find_map(clean_message_id)
}

/// The `id` of a JSON response body, read within the deadline and the size
/// cap. Any trouble reading it just means no id: the outcome is already
/// decided by the status.
async fn body_message_id(mut response: reqwest::Response, deadline: Instant) -> Option<String> {
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
    if !is_json {
        return None;
    }
    let mut buf = Vec::new();
    loop {
        let chunk = tokio::time::timeout_at(deadline.into(), response.chunk())
            .await
            .ok()?
            .ok()?;
        match chunk {
            Some(bytes) if buf.len() + bytes.len() <= MAX_ID_BODY_BYTES => {
                buf.extend_from_slice(&bytes)
            }
            Some(_) => return None,
            None => break,
        }
    }
    let value: serde_json::Value = serde_json::from_slice(&buf).ok()?;
    match value.get("id")? {
        serde_json::Value::String(s) => clean_message_id(s),
        serde_json::Value::Number(n) => clean_message_id(&n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_signature_matches_a_known_vector() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn test_body_has_fixed_fields_and_no_attempt() {
        let mut job = LeasedJob::example();
        let first = body(&job).expect("serializes");
        job.attempt += 1;
        job.lease_id = uuid::Uuid::new_v4();
        assert_eq!(
            first,
            body(&job).expect("serializes"),
            "attempt and lease do not show"
        );
        let v: serde_json::Value = serde_json::from_slice(&first).expect("json");
        for key in ["action_id", "tenant", "tool", "idempotency_key", "params"] {
            assert!(v.get(key).is_some(), "{key} missing");
        }
        assert!(v.get("attempt").is_none());
    }
}
