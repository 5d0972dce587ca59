//! End to end, smtp adapter: an email tool approved through the SQL API is
//! delivered by the real keyturnd binary to an SMTP server on loopback (the
//! test-only server of `support/fake_smtp.rs`), once, with a Message-ID
//! carrying the action's idempotency key.

use std::time::Duration;

use crate::support::e2e::{self, Keyturnd, World};
use crate::support::fake_smtp::{self, Script};
use serde_json::json;

#[tokio::test]
async fn test_email_is_delivered_once_with_the_idempotency_key_as_message_id() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.smtp_tool("e2e_email").await;
    let (addr, smtp) = fake_smtp::start(Script::default()).await;
    // SMTP only: this keyturnd leases no webhook action.
    let k = Keyturnd::start(
        port,
        vec![
            (
                "KEYTURN_SMTP_URL",
                format!("smtp://127.0.0.1:{}", addr.port()),
            ),
            ("KEYTURN_SMTP_FROM", "keyturn <noreply@keyturn.test>".into()),
        ],
    )
    .await;

    let subject = format!("Renewal {}", uuid::Uuid::new_v4().simple());
    let a = w
        .queue(
            &tool,
            json!({"to": "alice@example.com", "subject": subject, "body": "Your renewal is due.\n"}),
            false,
        )
        .await;
    w.wait_status(a.id, "succeeded", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let message_id = format!("<{}@keyturn>", a.idempotency_key);
    let mine: Vec<_> = smtp
        .delivered()
        .into_iter()
        .filter(|d| d.data.contains(&subject))
        .collect();
    assert_eq!(mine.len(), 1, "delivered exactly once");
    let d = &mine[0];
    assert_eq!(d.rcpt_to, vec!["<alice@example.com>"]);
    assert_eq!(d.mail_from, "<noreply@keyturn.test>");
    assert!(
        d.data
            .lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("Message-ID: {message_id}"))),
        "Message-ID carries the idempotency key:\n{}",
        d.data
    );
    assert_eq!(w.state(a.id).await, ("succeeded".into(), 1));
    assert_eq!(w.usage_rows(a.id).await, 1);
    let receipt = w.receipt(a.id).await.expect("receipt");
    assert_eq!(
        receipt,
        json!({"smtp_code": 250, "provider_message_id": message_id})
    );
    k.stop().await;
}
