//! End to end, webhook adapter: real keyturnd binary, real database, real
//! HTTP receiver on loopback; actions created through the SQL API (admin
//! registers and grants, agent proposes, human approves). See
//! `support/e2e.rs` for why these tests run one at a time.

use crate::support;

use std::time::Duration;

use crate::support::e2e::{self, Keyturnd, Receiver, Reply, World};
use serde_json::json;

/// Long enough for several poll (200 ms) and sweep (1 s) cycles.
const SETTLE: Duration = Duration::from_secs(3);
const WITHIN: Duration = Duration::from_secs(20);

#[tokio::test]
async fn test_success_is_one_signed_request_one_usage_row_and_counted_in_metrics() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = Keyturnd::start(port, rx.env()).await;

    let a = w.queue(&tool, json!({"text": "hello"}), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    tokio::time::sleep(SETTLE).await;

    let reqs = rx.requests(a.id);
    assert_eq!(reqs.len(), 1, "exactly one request");
    let r = &reqs[0];
    assert!(
        r.signature_ok,
        "X-Keyturn-Signature is the HMAC of the body"
    );
    assert!(r.standard_ok, "webhook-signature verifies");
    assert_eq!(
        r.webhook_id.as_deref(),
        Some(a.idempotency_key.as_str()),
        "webhook-id is the idempotency key"
    );
    assert!(r.has_timestamp, "X-Keyturn-Timestamp is sent");
    assert_eq!(
        r.idempotency_key.as_deref(),
        Some(a.idempotency_key.as_str())
    );
    let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON body");
    assert_eq!(body["tool"], tool.as_str());
    assert_eq!(body["params"], json!({"text": "hello"}));
    assert_eq!(w.state(a.id).await, ("succeeded".into(), 1));
    assert_eq!(w.usage_rows(a.id).await, 1, "exactly one usage row");
    assert_eq!(w.attempts(a.id).await, vec![(1, Some("succeeded".into()))]);
    assert_eq!(w.receipt(a.id).await.expect("receipt")["status"], 200);

    let metrics = k.metrics().await;
    let succeeded: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyturn_actions_total{outcome=\"succeeded\"} "))
        .unwrap_or_else(|| panic!("no succeeded counter in:\n{metrics}"))
        .trim()
        .parse()
        .expect("a number");
    assert!(succeeded >= 1.0, "{metrics}");
    k.stop().await;
}

#[tokio::test]
async fn test_429_with_retry_after_is_retried_with_the_same_key_and_bytes() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(
        &w.tenant,
        vec![
            Reply::status(429).header("retry-after", "1"),
            Reply::status(200),
        ],
    )
    .await;
    let k = Keyturnd::start(port, rx.env()).await;

    let a = w.queue(&tool, json!({"text": "rate limited"}), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    tokio::time::sleep(SETTLE).await;

    let reqs = rx.requests(a.id);
    assert_eq!(reqs.len(), 2, "one refused attempt, one accepted");
    assert!(reqs.iter().all(|r| r.signature_ok && r.standard_ok));
    assert_eq!(
        reqs[0].idempotency_key.as_deref(),
        Some(a.idempotency_key.as_str())
    );
    assert_eq!(
        reqs[0].idempotency_key, reqs[1].idempotency_key,
        "same Idempotency-Key"
    );
    assert_eq!(reqs[0].body, reqs[1].body, "byte-identical body");
    assert_eq!(w.state(a.id).await, ("succeeded".into(), 2));
    assert_eq!(
        w.attempts(a.id).await,
        vec![(1, Some("retry".into())), (2, Some("succeeded".into()))]
    );
    assert_eq!(w.usage_rows(a.id).await, 1);
    k.stop().await;
}

#[tokio::test]
async fn test_connect_refused_is_retried_never_uncertain_then_delivered_once() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;

    // First keyturnd: the webhook URL points at a closed port.
    let mut env = rx.env();
    env[0].1 = format!("http://127.0.0.1:{}/hook", support::closed_port());
    let k1 = Keyturnd::start(port, env).await;
    let a = w.queue(&tool, json!({"text": "nobody home"}), false).await;
    e2e::eventually(WITHIN, "a refused attempt recorded as retry", || async {
        let rows = w.attempts(a.id).await;
        (rows.first().map(|r| r.1.as_deref()) == Some(Some("retry"))).then_some(())
    })
    .await;
    let (status, attempts) = w.state(a.id).await;
    assert!(
        matches!(status.as_str(), "queued" | "leased" | "executing"),
        "requeued for another attempt, not {status}"
    );
    assert!(attempts >= 1, "the refused attempt counts");
    let log = k1.stop().await;
    assert!(
        log.contains("kind=\"connect\""),
        "classified as a connect failure:\n{log}"
    );
    let (status, _) = w.state(a.id).await;
    assert_eq!(status, "queued", "handed back or requeued, never uncertain");
    assert_eq!(w.events_to(a.id, "uncertain").await, 0);

    // Second keyturnd reaches the receiver: delivered once, after the backoff.
    let k2 = Keyturnd::start(port, rx.env()).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(rx.requests(a.id).len(), 1);
    let (_, attempts) = w.state(a.id).await;
    let rows = w.attempts(a.id).await;
    assert_eq!(
        rows.len() as i32,
        attempts,
        "one attempt row per counted attempt"
    );
    assert_eq!(rows.last().expect("rows").1.as_deref(), Some("succeeded"));
    assert!(
        rows[..rows.len() - 1]
            .iter()
            .all(|r| r.1.as_deref() == Some("retry")),
        "{rows:?}"
    );
    assert_eq!(w.usage_rows(a.id).await, 1);
    k2.stop().await;
}

#[tokio::test]
async fn test_400_is_failed_and_not_retried() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(400)]).await;
    let k = Keyturnd::start(port, rx.env()).await;

    let a = w.queue(&tool, json!({"text": "bad request"}), false).await;
    w.wait_status(a.id, "failed", WITHIN).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(rx.requests(a.id).len(), 1);
    assert_eq!(w.state(a.id).await, ("failed".into(), 1));
    assert_eq!(w.usage_rows(a.id).await, 0, "no usage for a failure");
    k.stop().await;
}

#[tokio::test]
async fn test_500_is_uncertain_and_never_resent() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(500)]).await;
    let k = Keyturnd::start(port, rx.env()).await;

    let a = w.queue(&tool, json!({"text": "server error"}), false).await;
    w.wait_status(a.id, "uncertain", WITHIN).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        rx.requests(a.id).len(),
        1,
        "an uncertain action is never re-sent"
    );
    assert_eq!(w.state(a.id).await, ("uncertain".into(), 1));
    assert_eq!(w.attempts(a.id).await, vec![(1, Some("unknown".into()))]);
    assert_eq!(w.usage_rows(a.id).await, 0);
    k.stop().await;
}

#[tokio::test]
async fn test_timeout_is_uncertain_and_never_resent() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    // KEYTURN_HTTP_TIMEOUT_SECONDS=1; the receiver takes 2.5 s.
    let rx = Receiver::start(
        &w.tenant,
        vec![Reply::status(200).delay(Duration::from_millis(2500))],
    )
    .await;
    let k = Keyturnd::start(port, rx.env()).await;

    let a = w.queue(&tool, json!({"text": "slow"}), false).await;
    w.wait_status(a.id, "uncertain", WITHIN).await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        rx.requests(a.id).len(),
        1,
        "a timed-out call is never re-sent"
    );
    assert_eq!(w.state(a.id).await, ("uncertain".into(), 1));
    assert_eq!(
        w.attempts(a.id).await,
        vec![(1, Some("unknown".into()))],
        "recorded by keyturnd as unknown, not left to the sweep"
    );
    assert_eq!(w.receipt(a.id).await.expect("receipt")["error"], "timeout");
    k.stop().await;
}

#[tokio::test]
async fn test_credentials_in_a_response_reach_neither_tables_nor_log() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let leaked = format!("tok{}", uuid::Uuid::new_v4().simple());
    let rx = Receiver::start(
        &w.tenant,
        vec![Reply::status(200)
            .header("authorization", format!("Bearer {leaked}"))
            .header("set-cookie", format!("session={leaked}"))
            // A hostile provider putting a credential where an id belongs.
            .header("x-request-id", format!("Bearer {leaked}"))
            .header("content-type", "application/json")
            .body(json!({"id": "msg-42", "token": leaked, "access_token": format!("Bearer {leaked}")}).to_string())],
    )
    .await;
    let k = Keyturnd::start(port, rx.env()).await;

    let a = w
        .queue(&tool, json!({"text": "receipt hygiene"}), false)
        .await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    let log = k.stop().await;

    assert_eq!(rx.requests(a.id).len(), 1);
    let receipt = w.receipt(a.id).await.expect("receipt");
    assert_eq!(receipt["status"], 200);
    assert_eq!(
        receipt["provider_message_id"], "msg-42",
        "a credential-shaped header id is dropped, the body's id kept"
    );
    let hits = w.tables_containing(&leaked).await;
    assert!(
        hits.is_empty(),
        "the provider's credential was stored in {hits:?}"
    );
    let journal = std::fs::read(e2e::journal_dir().join("journal")).expect("the journal");
    let journal = String::from_utf8_lossy(&journal);
    assert!(
        journal.contains("msg-42"),
        "the receipt was journaled as recorded"
    );
    assert!(
        !journal.contains(&leaked),
        "the provider's credential reached the journal"
    );
    assert!(
        !log.contains(&leaked),
        "the provider's credential reached the log:\n{log}"
    );
    assert!(
        !log.contains(&rx.secret),
        "the webhook secret reached the log:\n{log}"
    );
}

#[tokio::test]
async fn test_unknown_provider_stays_queued_and_is_never_leased() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let pigeon = w
        .tool(
            "e2e_pigeon",
            json!({"executor": "external", "provider": "carrier_pigeon",
                   "params_schema": {"type": "object", "properties": {"text": {"type": "string"}},
                                     "required": ["text"]}}),
        )
        .await;
    let hook = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = Keyturnd::start(port, rx.env()).await;

    let p = w.queue(&pigeon, json!({"text": "coo"}), false).await;
    // A webhook action queued after it is delivered: keyturnd is working.
    let h = w
        .queue(&hook, json!({"text": "after the pigeon"}), false)
        .await;
    w.wait_status(h.id, "succeeded", WITHIN).await;
    tokio::time::sleep(SETTLE).await;

    assert_eq!(
        w.state(p.id).await,
        ("queued".into(), 0),
        "fail closed: stays queued"
    );
    assert_eq!(w.events_to(p.id, "leased").await, 0, "never leased");
    assert!(w.attempts(p.id).await.is_empty(), "never dispatched");
    assert!(rx.requests(p.id).is_empty());
    let log = k.stop().await;
    assert!(
        !log.contains(&p.id.to_string()),
        "keyturnd never touched it:\n{log}"
    );
    assert!(
        !log.contains("unknown_provider") && !log.contains("no provider of this name"),
        "{log}"
    );
}

#[tokio::test]
async fn test_notification_wakes_the_dispatcher() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let mut env = rx.env();
    env.push(("KEYTURN_POLL_MS", "1000".into()));
    env.push(("RUST_LOG", "info,keyturnd::worker=debug".into()));
    let k = Keyturnd::start(port, env).await;

    let a = w.queue(&tool, json!({"text": "ding"}), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    // A notification that names nothing wakes it all the same: the payload
    // is never read.
    w.superuser
        .batch_execute("NOTIFY keyturn_dispatch")
        .await
        .expect("NOTIFY");
    e2e::eventually(WITHIN, "a wake-up by an empty notification", || async {
        k.log()
            .lines()
            .any(|l| l.contains("woken by notification") && l.contains("payload_bytes=0"))
            .then_some(())
    })
    .await;
    let log = k.stop().await;
    assert!(
        log.contains("woken by notification"),
        "keyturnd woke on NOTIFY keyturn_dispatch:\n{log}"
    );
}

#[tokio::test]
async fn test_digest_tool_leaves_no_param_value_in_any_table() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w
        .webhook_tool(json!({"retain": "digest", "summary": "Notify (digest)"}))
        .await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = Keyturnd::start(port, rx.env()).await;

    let secret_text = format!("zebra-quartz-{}", uuid::Uuid::new_v4().simple());
    let a = w.queue(&tool, json!({"text": secret_text}), true).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;

    let reqs = rx.requests(a.id);
    assert_eq!(reqs.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&reqs[0].body).expect("JSON");
    assert_eq!(
        body["params"]["text"],
        secret_text.as_str(),
        "the provider got the approved params"
    );
    let hits = w.tables_containing(&secret_text).await;
    assert!(
        hits.is_empty(),
        "a digest param value is still stored in {hits:?}"
    );
    assert_eq!(w.usage_rows(a.id).await, 1);
    k.stop().await;
}
