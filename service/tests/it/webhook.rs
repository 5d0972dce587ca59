//! The `webhook` adapter against a real HTTP receiver on loopback that
//! checks the signature and records every request.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use keyturnd::classify::Outcome;
use keyturnd::config::Secret;
use keyturnd::providers::webhook::WebhookProvider;
use keyturnd::providers::{CallResult, Provider};
use serde_json::json;
use sha2::Sha256;

const SECRET: &str = "whsec-test-🔑";

#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
    signature_ok: bool,
}

#[derive(Clone, Default)]
struct Receiver {
    log: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn requests(&self) -> Vec<Received> {
        self.log.lock().expect("log").clone()
    }
}

/// Verifies the signature the way a receiver would: HMAC-SHA256 keyed by
/// the secret's UTF-8 bytes over the raw body, constant-time compare.
fn signature_ok(headers: &HeaderMap, body: &[u8]) -> bool {
    let Some(given) = headers
        .get("x-keyturn-signature")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
    else {
        return false;
    };
    let Ok(given) = hex::decode(given) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

async fn handler(
    State(rx): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    rx.log.lock().expect("log").push(Received {
        path: path.clone(),
        signature_ok: signature_ok(&headers, &body),
        headers,
        body,
    });
    match path.as_str() {
        "/ok" => (StatusCode::OK, [("x-request-id", "req-42")], "ok").into_response(),
        "/okjson" => (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            r#"{"id":"msg_7","echo":"not stored"}"#,
        )
            .into_response(),
        "/bad" => (StatusCode::BAD_REQUEST, "no").into_response(),
        "/err" => (StatusCode::INTERNAL_SERVER_ERROR, "oops").into_response(),
        "/limited" => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "7")]).into_response(),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            (StatusCode::OK, "late").into_response()
        }
        "/redirect" => (StatusCode::FOUND, [("location", "/ok")]).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn receiver() -> (SocketAddr, Receiver) {
    let rx = Receiver::default();
    let app = axum::Router::new().fallback(handler).with_state(rx.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, rx)
}

fn provider(url: String) -> WebhookProvider {
    WebhookProvider::with_key(
        url.parse().expect("url"),
        Secret::from(SECRET.to_owned()),
        SECRET.as_bytes().to_vec(),
        Duration::from_millis(500),
    )
    .expect("client")
}

async fn call(addr: SocketAddr, path: &str) -> (CallResult, keyturnd::db::LeasedJob) {
    let job = support::job("webhook", json!({"to": "a@example.com", "amount": "10.00"}));
    let result = provider(format!("http://{addr}{path}"))
        .call(
            &job,
            &[],
            tokio::time::Instant::now() + Duration::from_secs(1),
        )
        .await;
    (result, job)
}

#[tokio::test]
async fn test_one_signed_request_with_the_contract_headers() {
    let (addr, rx) = receiver().await;
    let (result, job) = call(addr, "/ok").await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    let requests = rx.requests();
    assert_eq!(requests.len(), 1, "exactly one request per attempt");
    let r = &requests[0];
    assert!(r.signature_ok, "HMAC over the exact body verifies");
    let header = |name: &str| {
        r.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("idempotency-key"), job.idempotency_key);
    assert_eq!(header("content-type"), "application/json");
    assert!(header("x-keyturn-timestamp")
        .parse::<u64>()
        .is_ok_and(|t| t > 1_600_000_000));
    let sig = header("x-keyturn-signature");
    assert!(
        sig.starts_with("sha256=")
            && sig[7..]
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    // Standard Webhooks: a secret without `whsec_` signs with its UTF-8 bytes.
    assert_eq!(header("webhook-id"), job.idempotency_key);
    assert_eq!(header("webhook-timestamp"), header("x-keyturn-timestamp"));
    let signed = format!("{}.{}.", header("webhook-id"), header("webhook-timestamp"));
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(signed.as_bytes());
    mac.update(&r.body);
    let want = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    assert_eq!(header("webhook-signature"), want);
    let body: serde_json::Value = serde_json::from_slice(&r.body).expect("json body");
    assert_eq!(body["action_id"], json!(job.action_id.to_string()));
    assert_eq!(body["tool"], json!("notify"));
    assert_eq!(body["params"], job.params);
    assert!(body.get("attempt").is_none());
}

#[tokio::test]
async fn test_body_is_byte_identical_across_attempts() {
    let (addr, rx) = receiver().await;
    let p = provider(format!("http://{addr}/ok"));
    let mut job = support::job(
        "webhook",
        json!({"b": [1, 2.5, "x"], "a": {"z": null, "y": true}}),
    );
    p.call(
        &job,
        &[],
        tokio::time::Instant::now() + Duration::from_secs(1),
    )
    .await;
    job.attempt = 2;
    job.lease_id = uuid::Uuid::new_v4();
    p.call(
        &job,
        &[],
        tokio::time::Instant::now() + Duration::from_secs(1),
    )
    .await;
    let requests = rx.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].body, requests[1].body,
        "same bytes on every attempt"
    );
    assert_eq!(
        requests[0].headers.get("x-keyturn-signature"),
        requests[1].headers.get("x-keyturn-signature")
    );
    assert_eq!(
        requests[0].headers.get("idempotency-key"),
        requests[1].headers.get("idempotency-key")
    );
    assert_eq!(
        requests[0].headers.get("webhook-id"),
        requests[1].headers.get("webhook-id")
    );
    assert!(requests.iter().all(|r| r.signature_ok));
}

#[tokio::test]
async fn test_2xx_is_succeeded_with_a_message_id_and_no_body() {
    let (addr, _rx) = receiver().await;
    let (result, _) = call(addr, "/ok").await;
    assert_eq!(
        result.receipt,
        json!({"status": 200, "provider_message_id": "req-42"})
    );
    let (result, _) = call(addr, "/okjson").await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert_eq!(
        result.receipt,
        json!({"status": 201, "provider_message_id": "msg_7"})
    );
    assert!(
        !result.receipt.to_string().contains("not stored"),
        "bodies are never kept"
    );
}

#[tokio::test]
async fn test_400_is_failed() {
    let (addr, _rx) = receiver().await;
    let (result, _) = call(addr, "/bad").await;
    assert_eq!(result.outcome, Outcome::Failed);
    assert_eq!(result.receipt["status"], json!(400));
}

#[tokio::test]
async fn test_500_is_unknown() {
    let (addr, _rx) = receiver().await;
    let (result, _) = call(addr, "/err").await;
    assert_eq!(result.outcome, Outcome::Unknown);
    assert_eq!(result.receipt["status"], json!(500));
}

#[tokio::test]
async fn test_429_with_retry_after_is_retry_with_the_delay() {
    let (addr, _rx) = receiver().await;
    let (result, _) = call(addr, "/limited").await;
    assert_eq!(
        result.outcome,
        Outcome::Retry {
            after: Some(Duration::from_secs(7))
        }
    );
}

#[tokio::test]
async fn test_connect_refused_is_retry() {
    let port = support::closed_port();
    let job = support::job("webhook", json!({}));
    let result = provider(format!("http://127.0.0.1:{port}/ok"))
        .call(
            &job,
            &[],
            tokio::time::Instant::now() + Duration::from_secs(1),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Retry { after: None });
    assert_eq!(result.receipt, json!({"error": "connect"}));
}

#[tokio::test]
async fn test_response_slower_than_the_timeout_is_unknown() {
    let (addr, rx) = receiver().await;
    let started = std::time::Instant::now();
    let (result, _) = call(addr, "/slow").await;
    assert_eq!(result.outcome, Outcome::Unknown, "{:?}", result.receipt);
    assert_eq!(result.receipt, json!({"error": "timeout"}));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the call timeout"
    );
    assert_eq!(rx.requests().len(), 1, "the request did reach the provider");
}

#[tokio::test]
async fn test_302_is_not_followed_and_is_unknown() {
    let (addr, rx) = receiver().await;
    let (result, _) = call(addr, "/redirect").await;
    assert_eq!(result.outcome, Outcome::Unknown);
    assert_eq!(result.receipt["status"], json!(302));
    let paths: Vec<String> = rx.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        vec!["/redirect"],
        "the redirect target was never requested"
    );
}

#[tokio::test]
async fn test_a_call_whose_time_has_passed_sends_nothing() {
    let (addr, rx) = receiver().await;
    let job = support::job("webhook", json!({"to": "a@example.com"}));
    let result = provider(format!("http://{addr}/ok"))
        .call(&job, &[], tokio::time::Instant::now())
        .await;
    assert_eq!(result.outcome, Outcome::Retry { after: None });
    assert!(result.not_sent(), "{}", result.receipt);
    assert_eq!(
        rx.requests().len(),
        0,
        "no request once the lease has no margin"
    );
}
