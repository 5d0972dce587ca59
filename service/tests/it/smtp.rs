//! The `smtp` adapter against a real SMTP conversation on loopback (the
//! test-only fake server in `support/fake_smtp.rs`).

use crate::support;

use std::time::Duration;

use crate::support::fake_smtp::{self, Script};
use keyturnd::classify::Outcome;
use keyturnd::config::Secret;
use keyturnd::providers::smtp::SmtpProvider;
use keyturnd::providers::{CallResult, Provider};
use serde_json::json;

fn provider(port: u16) -> SmtpProvider {
    SmtpProvider::new(
        &Secret::from(format!("smtp://127.0.0.1:{port}")),
        "keyturn <noreply@keyturn.test>",
    )
    .expect("provider")
}

fn email() -> serde_json::Value {
    json!({
        "to": ["alice@example.com", "bob@example.com"],
        "cc": "carol@example.com",
        "reply_to": "ops@example.com",
        "subject": "Quarterly numbers",
        "body": "Hello,\r\n.leading dot line\r\nBye"
    })
}

async fn send(
    script: Script,
    timeout: Duration,
) -> (CallResult, keyturnd::db::LeasedJob, fake_smtp::Log) {
    let (addr, log) = fake_smtp::start(script).await;
    let job = support::job("smtp", email());
    let result = provider(addr.port())
        .call(&job, &[], tokio::time::Instant::now() + timeout)
        .await;
    (result, job, log)
}

#[tokio::test]
async fn test_message_id_carries_the_idempotency_key() {
    let (result, job, log) = send(Script::default(), Duration::from_secs(5)).await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{:?}", result.receipt);
    let message_id = format!("<{}@keyturn>", job.idempotency_key);
    assert_eq!(
        result.receipt,
        json!({"smtp_code": 250, "provider_message_id": message_id})
    );
    let delivered = log.delivered();
    assert_eq!(delivered.len(), 1);
    let d = &delivered[0];
    assert!(
        d.data
            .lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("Message-ID: {message_id}"))),
        "Message-ID header missing in:\n{}",
        d.data
    );
    assert_eq!(d.mail_from, "<noreply@keyturn.test>");
    assert_eq!(
        d.rcpt_to,
        vec![
            "<alice@example.com>",
            "<bob@example.com>",
            "<carol@example.com>"
        ]
    );
    assert!(d.data.contains("Subject: Quarterly numbers"));
    assert!(
        d.data.contains("..leading dot line"),
        "dot-stuffed on the wire"
    );
}

#[tokio::test]
async fn test_every_attempt_uses_the_same_message_id() {
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let p = provider(addr.port());
    let mut job = support::job("smtp", email());
    p.call(
        &job,
        &[],
        tokio::time::Instant::now() + Duration::from_secs(5),
    )
    .await;
    job.attempt = 2;
    p.call(
        &job,
        &[],
        tokio::time::Instant::now() + Duration::from_secs(5),
    )
    .await;
    let ids: Vec<String> = log
        .delivered()
        .iter()
        .map(|d| {
            d.data
                .lines()
                .find(|l| l.to_ascii_lowercase().starts_with("message-id:"))
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1]);
}

#[tokio::test]
async fn test_permanent_rcpt_rejection_is_failed() {
    let script = Script {
        rcpt: "550 5.1.1 no such user",
        ..Script::default()
    };
    let (result, _, log) = send(script, Duration::from_secs(5)).await;
    assert_eq!(result.outcome, Outcome::Failed);
    assert_eq!(result.receipt["smtp_code"], json!(550));
    assert_eq!(result.receipt["stage"], json!("envelope"));
    assert!(log.delivered().is_empty());
}

#[tokio::test]
async fn test_transient_reply_before_data_is_retry() {
    let script = Script {
        mail: "451 4.3.0 try again later",
        ..Script::default()
    };
    let (result, _, _) = send(script, Duration::from_secs(5)).await;
    assert_eq!(result.outcome, Outcome::Retry { after: None });
    assert_eq!(result.receipt["smtp_code"], json!(451));
}

#[tokio::test]
async fn test_transient_greeting_is_retry() {
    let script = Script {
        greeting: "421 4.3.2 busy",
        ..Script::default()
    };
    let (result, _, _) = send(script, Duration::from_secs(5)).await;
    assert_eq!(result.outcome, Outcome::Retry { after: None });
    assert_eq!(result.receipt["stage"], json!("connect"));
}

#[tokio::test]
async fn test_permanent_rejection_after_data_is_failed() {
    let script = Script {
        end_of_data: Some("554 5.7.1 rejected as spam"),
        ..Script::default()
    };
    let (result, _, _) = send(script, Duration::from_secs(5)).await;
    assert_eq!(result.outcome, Outcome::Failed);
    assert_eq!(result.receipt["smtp_code"], json!(554));
}

#[tokio::test]
async fn test_transient_reply_after_data_is_unknown() {
    let script = Script {
        end_of_data: Some("451 4.3.0 local error"),
        ..Script::default()
    };
    let (result, _, _) = send(script, Duration::from_secs(5)).await;
    assert_eq!(result.outcome, Outcome::Unknown);
    assert_eq!(result.receipt["stage"], json!("message"));
}

#[tokio::test]
async fn test_no_reply_after_data_is_unknown() {
    let script = Script {
        end_of_data: None,
        ..Script::default()
    };
    let started = std::time::Instant::now();
    let (result, _, log) = send(script, Duration::from_secs(1)).await;
    assert_eq!(result.outcome, Outcome::Unknown);
    assert_eq!(result.receipt["stage"], json!("message"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the call timeout"
    );
    assert_eq!(log.delivered().len(), 1, "the server did get the message");
}

#[tokio::test]
async fn test_connect_refused_is_retry() {
    let job = support::job("smtp", email());
    let result = provider(support::closed_port())
        .call(
            &job,
            &[],
            tokio::time::Instant::now() + Duration::from_secs(2),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Retry { after: None });
    assert_eq!(result.receipt["stage"], json!("connect"));
}

#[tokio::test]
async fn test_bad_params_fail_without_connecting() {
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let job = support::job(
        "smtp",
        json!({"to": "a@example.com", "subject": "s", "body": "b", "attachments": ["x"]}),
    );
    let result = provider(addr.port())
        .call(
            &job,
            &[],
            tokio::time::Instant::now() + Duration::from_secs(2),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Failed);
    assert_eq!(log.connections(), 0, "nothing was sent");
    assert!(
        !result.receipt.to_string().contains("a@example.com"),
        "no param values in receipts"
    );
}

#[tokio::test]
async fn test_a_call_whose_time_has_passed_sends_nothing() {
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let job = support::job("smtp", email());
    let result = provider(addr.port())
        .call(&job, &[], tokio::time::Instant::now())
        .await;
    assert_eq!(result.outcome, Outcome::Retry { after: None });
    assert!(result.not_sent(), "{}", result.receipt);
    assert_eq!(log.connections(), 0, "not even a connection");
    assert!(log.delivered().is_empty());
}
