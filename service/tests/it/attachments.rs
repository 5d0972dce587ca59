//! Attachments through the adapters, no database: the webhook body carries
//! them signed and byte-identical across attempts; the smtp message carries
//! them as MIME parts that decode to the very bytes (checked with a MIME
//! parser and SHA-256 against the loopback SMTP server of
//! `support/fake_smtp.rs`); and neither adapter sends anything when the
//! files are not exactly the approved ones, or (smtp) when an address is
//! more than a bare addr-spec.

use crate::support;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use keyturnd::classify::Outcome;
use keyturnd::config::Secret;
use keyturnd::providers::attachments::Attachment;
use keyturnd::providers::smtp::SmtpProvider;
use keyturnd::providers::webhook::{self, WebhookProvider};
use keyturnd::providers::Provider;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::e2e::{Receiver, Reply};
use crate::support::fake_smtp::{self, Script};
use crate::support::files::{self, Canary};

/// Bytes no text encoding would carry unchanged: NUL, CR, LF, CRLF, a
/// lone dot line, high bytes.
fn binary() -> Vec<u8> {
    let mut bytes = b"%PDF-1.7\r\n%\xe2\xe3\xcf\xd3\n.\r\n\0\0\x7f\xff".to_vec();
    bytes.extend((0..=255u8).cycle().take(5000));
    bytes
}

/// Two files and the params naming them.
fn two_files() -> (Value, Vec<Attachment>, Vec<Vec<u8>>) {
    let a = binary();
    let b = Canary::new().bytes;
    let ma = files::meta(Uuid::new_v4(), &a, "Q3 report.pdf", "application/pdf");
    let mb = files::meta(Uuid::new_v4(), &b, "notes.pdf", "application/pdf");
    let attachments = vec![files::attachment(&ma, &a), files::attachment(&mb, &b)];
    (
        json!({"text": "see attached", "files": [ma, mb]}),
        attachments,
        vec![a, b],
    )
}

// ---------------------------------------------------------------------------
// webhook
// ---------------------------------------------------------------------------

#[tokio::test]
async fn test_webhook_body_with_attachments_is_identical_across_attempts_and_signed() {
    let (params, attachments, bytes) = two_files();
    let mut job = support::job("webhook", params.clone());
    let built = webhook::body(&job, &attachments).expect("body");
    assert_eq!(built, webhook::body(&job, &attachments).expect("body"));

    let rx = Receiver::start(&job.tenant, vec![Reply::status(200)]).await;
    let p = WebhookProvider::new(
        rx.url().parse().expect("url"),
        Secret::from(rx.secret.clone()),
    )
    .expect("provider");
    let first = p
        .call(
            &job,
            &attachments,
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert_eq!(first.outcome, Outcome::Succeeded, "{:?}", first.receipt);
    // The bytes must not depend on the attempt, the lease, nor the order
    // the worker happened to read the files in.
    job.attempt = 2;
    job.lease_id = Uuid::new_v4();
    let reversed: Vec<Attachment> = attachments.iter().rev().cloned().collect();
    let second = p
        .call(
            &job,
            &reversed,
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert_eq!(second.outcome, Outcome::Succeeded);

    let requests = rx.requests(job.action_id);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body, "byte-identical");
    assert_eq!(
        requests[0].body, built,
        "what body() builds is what is sent"
    );
    for r in &requests {
        assert!(r.signature_ok, "X-Keyturn-Signature covers the files");
        assert!(r.standard_ok, "webhook-signature covers the files");
    }

    let body: Value = serde_json::from_slice(&requests[0].body).expect("json");
    assert_eq!(
        body["params"], params,
        "metadata stay in params as approved"
    );
    let sent = body["attachments"].as_array().expect("attachments");
    assert_eq!(sent.len(), 2);
    // serde_json's Value sorts keys; the order is checked on the raw bytes.
    let raw = String::from_utf8(requests[0].body.clone()).expect("utf-8");
    let start = raw.find(r#","attachments":[{"#).expect("attachments last");
    let element = &raw[start..];
    let element = &element[..element.find('}').expect("end of the first element")];
    let positions: Vec<usize> = [
        "file_id",
        "sha256",
        "filename",
        "content_type",
        "size",
        "content_base64",
    ]
    .iter()
    .map(|k| element.find(&format!("\"{k}\":")).expect("every field"))
    .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "fixed field order: {positions:?}"
    );
    for (i, item) in sent.iter().enumerate() {
        let mut meta = item.clone();
        let encoded = meta
            .as_object_mut()
            .expect("object")
            .remove("content_base64")
            .expect("content_base64");
        assert_eq!(
            meta, params["files"][i],
            "the approved metadata, as approved"
        );
        let decoded = STANDARD
            .decode(encoded.as_str().expect("string"))
            .expect("standard base64");
        assert_eq!(decoded, bytes[i], "bytes intact");
        assert_eq!(files::sha256_hex(&decoded), meta["sha256"]);
    }
    for result in [&first, &second] {
        assert!(result.receipt.to_string().len() < 200, "{}", result.receipt);
    }
}

#[tokio::test]
async fn test_webhook_sends_nothing_when_the_files_are_not_the_approved_ones() {
    let (params, attachments, _) = two_files();
    let job = support::job("webhook", params);
    let rx = Receiver::start(&job.tenant, vec![Reply::status(200)]).await;
    let p = WebhookProvider::new(
        rx.url().parse().expect("url"),
        Secret::from(rx.secret.clone()),
    )
    .expect("provider");
    let stray = files::attachment(
        &files::meta(Uuid::new_v4(), b"x", "x.pdf", "application/pdf"),
        b"x",
    );
    // (No files at all is the database saying the list is a plain param;
    // the worker decides that, see e2e_attachments.)
    for given in [
        attachments[..1].to_vec(),
        vec![attachments[0].clone(), stray.clone()],
        vec![attachments[0].clone(), attachments[1].clone(), stray],
    ] {
        let result = p
            .call(
                &job,
                &given,
                tokio::time::Instant::now() + Duration::from_secs(2),
            )
            .await;
        assert_eq!(result.outcome, Outcome::Failed, "{} given", given.len());
    }
    assert!(rx.all().is_empty(), "nothing was sent");
}

// ---------------------------------------------------------------------------
// smtp
// ---------------------------------------------------------------------------

fn smtp(port: u16) -> SmtpProvider {
    SmtpProvider::new(
        &Secret::from(format!("smtp://127.0.0.1:{port}")),
        "keyturn <noreply@keyturn.test>",
    )
    .expect("provider")
}

fn email_with(files: Value) -> Value {
    json!({
        "to": "alice@example.com",
        "bcc": ["audit@example.com"],
        "subject": "Q3",
        "body": "Hello,\r\n.leading dot line\r\nthe report is attached.\r\n",
        "files": files,
    })
}

#[tokio::test]
async fn test_smtp_attachments_arrive_as_mime_parts_byte_for_byte() {
    let (params, attachments, bytes) = two_files();
    let job = support::job("smtp", email_with(params["files"].clone()));
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let result = smtp(addr.port())
        .call(
            &job,
            &attachments,
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{:?}", result.receipt);
    let message_id = format!("<{}@keyturn>", job.idempotency_key);
    assert_eq!(
        result.receipt,
        json!({"smtp_code": 250, "provider_message_id": message_id}),
        "the receipt is what it was without files"
    );

    let delivered = log.delivered();
    assert_eq!(delivered.len(), 1);
    let d = &delivered[0];
    assert_eq!(
        d.rcpt_to,
        vec!["<alice@example.com>", "<audit@example.com>"],
        "bcc in the envelope"
    );
    assert!(
        !d.data.to_ascii_lowercase().contains("audit@example.com"),
        "and in no header:\n{}",
        d.data
    );
    assert!(d
        .data
        .lines()
        .any(|l| l.eq_ignore_ascii_case(&format!("Message-ID: {message_id}"))));

    let parts = files::parts(&d.data);
    assert_eq!(parts.len(), 3, "{parts:?}");
    assert_eq!(parts[0].content_type, "text/plain");
    assert_eq!(parts[0].disposition, mailparse::DispositionType::Inline);
    let text = String::from_utf8(parts[0].body.clone()).expect("utf-8");
    assert!(text.contains("the report is attached."), "{text}");
    for (i, part) in parts[1..].iter().enumerate() {
        let meta = &params["files"][i];
        assert_eq!(part.disposition, mailparse::DispositionType::Attachment);
        assert_eq!(part.content_type, "application/pdf");
        assert_eq!(part.filename.as_deref(), meta["filename"].as_str());
        assert_eq!(
            files::sha256_hex(&part.body),
            meta["sha256"],
            "the decoded part hashes to the approved SHA-256"
        );
        assert_eq!(part.body, bytes[i]);
    }
}

#[tokio::test]
async fn test_smtp_without_files_is_the_plain_message_it_was() {
    let job = support::job(
        "smtp",
        json!({"to": "alice@example.com", "subject": "s", "body": "b", "files": []}),
    );
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let result = smtp(addr.port())
        .call(
            &job,
            &[],
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded, "{:?}", result.receipt);
    let data = &log.delivered()[0].data;
    assert!(!data.contains("multipart"), "{data}");
    assert_eq!(files::parts(data).len(), 1);
}

#[tokio::test]
async fn test_smtp_sends_nothing_when_the_files_are_not_the_approved_ones() {
    let (params, attachments, _) = two_files();
    let job = support::job("smtp", email_with(params["files"].clone()));
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let p = smtp(addr.port());
    for given in [vec![], attachments[..1].to_vec()] {
        let result = p
            .call(
                &job,
                &given,
                tokio::time::Instant::now() + Duration::from_secs(2),
            )
            .await;
        assert_eq!(result.outcome, Outcome::Failed);
        assert_eq!(result.receipt["stage"], json!("params"));
    }
    assert_eq!(
        p.call(
            &job,
            &[],
            tokio::time::Instant::now() + Duration::from_secs(2)
        )
        .await
        .outcome,
        Outcome::Failed
    );
    assert_eq!(log.connections(), 0, "nothing was sent");
}

#[test]
fn test_bytes_that_differ_from_their_metadata_never_become_an_attachment() {
    let bytes = binary();
    let meta = files::meta(Uuid::new_v4(), &bytes, "a.pdf", "application/pdf");
    let parsed =
        keyturnd::providers::attachments::listed_under(&json!({ "files": [meta] }), "files")
            .expect("reads")
            .remove(0);
    let mut changed = bytes.clone();
    changed[100] ^= 1;
    assert!(
        Attachment::verified("files".into(), parsed.clone(), changed).is_err(),
        "SHA-256"
    );
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(
        Attachment::verified("files".into(), parsed.clone(), longer).is_err(),
        "size"
    );
    assert!(Attachment::verified("files".into(), parsed, bytes).is_ok());
}

#[tokio::test]
async fn test_smtp_refuses_anything_but_a_bare_addr_spec_before_connecting() {
    let (addr, log) = fake_smtp::start(Script::default()).await;
    let p = smtp(addr.port());
    let refused = [
        "\"Ann\" <ann@example.com>",
        "Ann <ann@example.com>",
        "<ann@example.com>",
        "\"ann smith\"@example.com",
        "\"ann\"@example.com",
        "ann@[192.0.2.1]",
        "ann@[IPv6:2001:db8::1]",
        "ann@example.com (Ann)",
        "ann@example.com, eve@example.net",
        "ann@localhost",
    ];
    for bad in refused {
        for key in ["to", "cc", "bcc", "reply_to"] {
            let mut params = json!({"to": "ok@example.com", "subject": "s", "body": "b"});
            params[key] = json!(bad);
            let result = p
                .call(
                    &support::job("smtp", params),
                    &[],
                    tokio::time::Instant::now() + Duration::from_secs(2),
                )
                .await;
            assert_eq!(result.outcome, Outcome::Failed, "{key}: {bad}");
            assert_eq!(result.receipt["stage"], json!("params"));
            assert!(
                !result.receipt.to_string().contains("example"),
                "no address in the receipt: {}",
                result.receipt
            );
        }
    }
    assert_eq!(log.connections(), 0, "nothing was sent");
}
