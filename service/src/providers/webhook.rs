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
//! **Attachments.** When the params name files (see
//! [`super::attachments`]), the body gains a last field, `attachments`: one
//! object per file, in the order the params list them, holding the approved
//! metadata and the bytes in standard base64 (with padding):
//!
//! ```json
//! "attachments":[{"file_id":"…","sha256":"…","filename":"…","content_type":"…","size":N,"content_base64":"…"}]
//! ```
//!
//! Both halves are immutable for the action (the metadata are approved
//! params, the bytes must hash to them), so the body stays byte-identical
//! across attempts, and the signatures cover the files. Without files the
//! field is absent and the body is exactly what it was before attachments.
//! The base64 is written straight into the body buffer, which is dropped
//! once the request is sent; it is never logged or stored.
//!
//! **Headers.** Signed twice: the [Standard Webhooks] way, which receivers
//! verify with that project's libraries, and keyturn's own older way, kept
//! for one more release.
//!
//! | header | value |
//! |---|---|
//! | `Content-Type` | `application/json` |
//! | `Idempotency-Key` | the action's idempotency key (never changes) |
//! | `webhook-id` | the same idempotency key |
//! | `webhook-timestamp` | Unix seconds when this attempt was sent |
//! | `webhook-signature` | `v1,<base64 HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")>` |
//! | `X-Keyturn-Signature` | deprecated: `sha256=<lowercase hex HMAC-SHA256(key = UTF-8 bytes of KEYTURN_WEBHOOK_SECRET, message = exact body bytes)>` |
//! | `X-Keyturn-Timestamp` | deprecated: the same seconds as `webhook-timestamp`, not signed |
//!
//! The Standard Webhooks key ([`webhook_key`]): a `KEYTURN_WEBHOOK_SECRET`
//! of the form `whsec_<base64>` (that project's secret format) signs with the
//! decoded bytes, and one that does not decode is refused at start; any
//! other secret signs with its UTF-8 bytes, and receivers give their library
//! `whsec_` + the base64 of those bytes. Only the timestamp headers and the
//! `webhook-signature` differ between attempts; a receiver refuses a
//! replay once its timestamp is outside the library's tolerance, and
//! deduplicates on the id within it.
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/
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

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde::{Serialize, Serializer};
use serde_json::json;
use sha2::Sha256;

use super::attachments::{self, Attachment};
use super::{clean_message_id, http_transport_failure, lapsed, BoxFuture, CallResult, Provider};
use crate::classify::{self, Outcome};
use crate::config::{webhook_key, Secret};
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<BodyAttachment<'a>>,
}

/// One element of `attachments`, fields in a fixed order.
#[derive(Serialize)]
struct BodyAttachment<'a> {
    file_id: &'a uuid::Uuid,
    sha256: &'a str,
    filename: &'a str,
    content_type: &'a str,
    size: u64,
    content_base64: Base64<'a>,
}

/// Bytes serialized as a standard base64 string, encoded straight into the
/// output: no second copy of a large file.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&base64::display::Base64Display::new(self.0, &STANDARD))
    }
}

/// The exact body bytes for a job and the files its params name (see the
/// module docs). Identical for every attempt of an action. `Err` (naming no
/// value) when `attachments` are not exactly the files the params name.
pub fn body(job: &LeasedJob, attachments: &[Attachment]) -> Result<Vec<u8>, &'static str> {
    let files = attachments::in_params_order(&job.params, attachments)?;
    let encoded: usize = files.iter().map(|a| a.bytes().len().div_ceil(3) * 4).sum();
    let mut out = Vec::with_capacity(encoded + 1024);
    let body = Body {
        action_id: &job.action_id,
        tenant: &job.tenant,
        tool: &job.tool,
        idempotency_key: &job.idempotency_key,
        params: &job.params,
        attachments: files
            .into_iter()
            .map(|a| {
                let m = a.meta();
                BodyAttachment {
                    file_id: &m.file_id,
                    sha256: &m.sha256,
                    filename: &m.filename,
                    content_type: &m.content_type,
                    size: m.size,
                    content_base64: Base64(a.bytes()),
                }
            })
            .collect(),
    };
    serde_json::to_writer(&mut out, &body).map_err(|_| "params could not be serialized")?;
    Ok(out)
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length; the error arm cannot happen.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Deprecated `X-Keyturn-Signature`: `sha256=<lowercase hex
/// HMAC-SHA256(secret, body)>`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", hex::encode(hmac_sha256(secret, &[body])))
}

/// `webhook-signature`: `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`.
pub fn standard_signature(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let mac = hmac_sha256(
        key,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    format!("v1,{}", STANDARD.encode(mac))
}

/// POSTs each job to one configured URL.
pub struct WebhookProvider {
    client: reqwest::Client,
    url: url::Url,
    secret: Secret,
    /// The Standard Webhooks key ([`webhook_key`]) of `secret`. Never printed.
    standard_key: Vec<u8>,
}

impl WebhookProvider {
    /// Builds the adapter. The connect timeout is fixed per client; the total
    /// timeout is set per call from the lease left.
    /// Refuses a `whsec_` secret that does not decode.
    pub fn new(url: url::Url, secret: Secret) -> Result<Self, Error> {
        let key = webhook_key(secret.expose())?;
        Self::with_key(url, secret, key, MAX_CONNECT_TIMEOUT)
    }

    /// As [`new`](Self::new), with the key [`Config::validate`](crate::config::Config::validate)
    /// already decoded and an explicit connect timeout (it must stay below
    /// every call timeout).
    pub fn with_key(
        url: url::Url,
        secret: Secret,
        standard_key: Vec<u8>,
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
            standard_key,
        })
    }

    async fn attempt(
        &self,
        job: &LeasedJob,
        attachments: &[Attachment],
        deadline: Instant,
    ) -> CallResult {
        let refused = |why: &str| CallResult {
            outcome: Outcome::Failed,
            receipt: json!({ "error": why }),
        };
        let body = match body(job, attachments) {
            Ok(b) => b,
            Err(why) => return refused(why),
        };
        let key = match HeaderValue::from_str(&job.idempotency_key) {
            Ok(v) => v,
            Err(_) => return refused("idempotency key is not a valid header value"),
        };
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let legacy = signature(self.secret.expose().as_bytes(), &body);
        let standard =
            standard_signature(&self.standard_key, &job.idempotency_key, timestamp, &body);
        // Hex and base64 are always valid header values.
        let (Ok(legacy), Ok(standard)) = (
            HeaderValue::from_str(&legacy),
            HeaderValue::from_str(&standard),
        ) else {
            return refused("signature is not a valid header value");
        };
        // The last check before the first byte: past `deadline` the lease
        // has no margin left, and nothing may reach the provider.
        let Some(timeout) = deadline
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
        else {
            return lapsed();
        };
        let sent = self
            .client
            .post(self.url.clone())
            .timeout(timeout)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("idempotency-key", key.clone())
            .header("webhook-id", key)
            .header("webhook-timestamp", timestamp)
            .header("webhook-signature", standard)
            .header("x-keyturn-timestamp", timestamp)
            .header("x-keyturn-signature", legacy)
            .body(body)
            .send()
            .await;

        match sent {
            Err(err) => http_transport_failure(err, "webhook"),
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

    fn takes_attachments(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        job: &'a LeasedJob,
        attachments: &'a [Attachment],
        by: tokio::time::Instant,
    ) -> BoxFuture<'a, CallResult> {
        Box::pin(self.attempt(job, attachments, by.into_std()))
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
    fn test_standard_signature_matches_the_published_example() {
        // The example of the Standard Webhooks libraries' own tests.
        let key = webhook_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("decodes");
        assert_eq!(
            standard_signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn test_body_has_fixed_fields_and_no_attempt() {
        let mut job = LeasedJob::example();
        let first = body(&job, &[]).expect("serializes");
        job.attempt += 1;
        job.lease_id = uuid::Uuid::new_v4();
        assert_eq!(
            first,
            body(&job, &[]).expect("serializes"),
            "attempt and lease do not show"
        );
        let v: serde_json::Value = serde_json::from_slice(&first).expect("json");
        for key in ["action_id", "tenant", "tool", "idempotency_key", "params"] {
            assert!(v.get(key).is_some(), "{key} missing");
        }
        assert!(v.get("attempt").is_none());
        assert!(v.get("attachments").is_none(), "absent without files");
    }

    #[test]
    fn test_body_refuses_files_the_params_do_not_name_and_missing_ones() {
        use sha2::Digest;
        let bytes = b"%PDF-1.7 tiny".to_vec();
        let id = uuid::Uuid::new_v4();
        let meta = json!({"file_id": id, "sha256": hex::encode(Sha256::digest(&bytes)),
                          "filename": "a.pdf", "content_type": "application/pdf", "size": bytes.len()});
        let mut job = LeasedJob::example();
        job.params = json!({"files": [meta]});
        let meta = attachments::listed_under(&job.params, "files")
            .expect("named")
            .remove(0);
        let file = Attachment::verified("files".into(), meta, bytes.clone()).expect("matches");
        assert!(
            body(&job, &[]).is_ok(),
            "no files listed: the list is a param like any other"
        );
        let v: serde_json::Value =
            serde_json::from_slice(&body(&job, std::slice::from_ref(&file)).expect("body"))
                .expect("json");
        assert_eq!(
            v["attachments"][0]["content_base64"],
            json!(STANDARD.encode(&bytes))
        );
        job.params = json!({"files": []});
        assert!(body(&job, &[file]).is_err(), "nor one nobody approved sent");
    }
}
