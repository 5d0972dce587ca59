//! End to end, private attachments: a file staged by the agent
//! (`keyturn.stage_file`, identity transaction-local), named in the params
//! of a tool with `attachments_param`, approved, and sent by the real
//! keyturnd binary — to the webhook receiver as base64 in the signed body,
//! to the loopback SMTP server as a MIME part — arrives byte for byte. After
//! success the bytes are gone from `keyturn.staged_file`, no keyturn table
//! and no line of keyturnd's log holds the file's base64 (the file is made
//! so that its base64 is a unique string), the log names no filename, and
//! the receipt stays small. Also: `keyturn.file_content` as keyturnd sees
//! it, and a look-alike list the tool does not declare.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use keyturnd::db;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::e2e::{self, Keyturnd, Receiver, Reply, World};
use crate::support::fake_smtp::{self, Script};
use crate::support::files::{self, Canary};

const WITHIN: Duration = Duration::from_secs(20);

/// `files` as the tool declares it: the five metadata properties.
fn files_schema() -> Value {
    json!({
        "type": "array",
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {
                "file_id": {"type": "string", "maxLength": 36},
                "sha256": {"type": "string", "maxLength": 64},
                "filename": {"type": "string", "maxLength": 255},
                "content_type": {"type": "string", "maxLength": 100},
                "size": {"type": "integer"}
            },
            "required": ["file_id", "sha256", "filename", "content_type", "size"]
        }
    })
}

/// An external tool of `provider` taking `properties` and `files`.
async fn files_tool(w: &World, provider: &str, mut properties: Value, required: Value) -> String {
    properties["files"] = files_schema();
    w.tool(
        "e2e_files",
        json!({
            "executor": "external",
            "provider": provider,
            "summary": "Send the files",
            "attachments_param": "files",
            "attachment_types": ["application/pdf"],
            "params_schema": {"type": "object", "properties": properties, "required": required}
        }),
    )
    .await
}

/// Stages `bytes` as the agent; returns the params metadata of the file.
async fn stage(w: &World, bytes: &[u8], filename: &str) -> Value {
    let content_type = "application/pdf";
    let row = w
        .as_identity(
            &w.agent,
            "SELECT file_id, sha256, size FROM keyturn.stage_file($1, $2, $3)",
            &[&bytes, &filename, &content_type],
        )
        .await
        .expect("stage_file");
    let file_id: Uuid = row.get(0);
    let sha256: String = row.get(1);
    let size: i64 = row.get(2);
    assert_eq!(sha256, files::sha256_hex(bytes));
    json!({"file_id": file_id, "sha256": sha256, "filename": filename,
           "content_type": content_type, "size": size})
}

/// A filename worth keeping out of logs.
fn private_filename() -> String {
    format!("h7-private-{}.pdf", Uuid::new_v4().simple())
}

/// After a successful send: nothing of the file is left anywhere it should
/// not be.
async fn assert_left_no_trace(w: &World, log: &str, canary: &Canary, meta: &Value) {
    let file_id: Uuid = meta["file_id"].as_str().expect("id").parse().expect("uuid");
    assert_eq!(
        w.count(
            "SELECT count(*) FROM keyturn.staged_file WHERE id = $1",
            file_id
        )
        .await,
        0,
        "the bytes are deleted with the final status"
    );
    assert_eq!(
        w.tables_containing(canary.needle()).await,
        vec![],
        "no keyturn table holds the file's base64"
    );
    assert_eq!(
        w.tables_containing(&hex::encode(&canary.bytes[..24])).await,
        vec![],
        "nor its bytes (bytea shows as hex)"
    );
    assert!(!log.contains(canary.needle()), "base64 in keyturnd's log");
    let filename = meta["filename"].as_str().expect("filename");
    assert!(!log.contains(filename), "a filename in keyturnd's log");
    let size = meta["size"].as_i64().expect("size");
    assert!(
        log.contains("attachments=1") && log.contains(&format!("attachment_bytes={size}")),
        "count and size are logged:\n{log}"
    );
}

#[tokio::test]
async fn test_webhook_carries_the_file_signed_and_leaves_no_copy() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = files_tool(
        &w,
        "webhook",
        json!({"text": {"type": "string", "maxLength": 200}}),
        json!(["text", "files"]),
    )
    .await;
    let canary = Canary::new();
    let meta = stage(&w, &canary.bytes, &private_filename()).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = Keyturnd::start(port, rx.env()).await;

    let params = json!({"text": "the signed contract", "files": [meta]});
    let a = w.queue(&tool, params.clone(), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    let log = k.stop().await;

    let reqs = rx.requests(a.id);
    assert_eq!(reqs.len(), 1, "one request");
    assert!(
        reqs[0].signature_ok && reqs[0].standard_ok,
        "both signatures"
    );
    let body: Value = serde_json::from_slice(&reqs[0].body).expect("json");
    assert_eq!(body["params"], params);
    let sent = &body["attachments"][0];
    assert_eq!(sent["content_base64"], json!(canary.base64));
    let decoded = STANDARD
        .decode(sent["content_base64"].as_str().expect("string"))
        .expect("base64");
    assert_eq!(decoded, canary.bytes, "bytes intact");
    assert_eq!(json!(files::sha256_hex(&decoded)), meta["sha256"]);
    for key in ["file_id", "sha256", "filename", "content_type", "size"] {
        assert_eq!(sent[key], meta[key], "{key} next to the bytes");
    }

    assert_eq!(w.state(a.id).await, ("succeeded".into(), 1));
    let receipt = w.receipt(a.id).await.expect("receipt");
    assert!(receipt.to_string().len() < 200, "small: {receipt}");
    assert_left_no_trace(&w, &log, &canary, &meta).await;
}

#[tokio::test]
async fn test_smtp_carries_the_file_as_a_mime_part_and_leaves_no_copy() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = files_tool(
        &w,
        "smtp",
        json!({
            "to": {"type": "string", "format": "email"},
            "subject": {"type": "string", "maxLength": 200},
            "body": {"type": "string", "maxLength": 5000}
        }),
        json!(["to", "subject", "body"]),
    )
    .await;
    let canary = Canary::new();
    let meta = stage(&w, &canary.bytes, &private_filename()).await;
    let (addr, smtp) = fake_smtp::start(Script::default()).await;
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

    let subject = format!("Contract {}", Uuid::new_v4().simple());
    let a = w
        .queue(
            &tool,
            json!({"to": "alice@example.com", "subject": subject,
                   "body": "The contract is attached.\n", "files": [meta]}),
            false,
        )
        .await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    let log = k.stop().await;

    let mine: Vec<_> = smtp
        .delivered()
        .into_iter()
        .filter(|d| d.data.contains(&subject))
        .collect();
    assert_eq!(mine.len(), 1, "delivered once");
    let parts = files::parts(&mine[0].data);
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert!(String::from_utf8_lossy(&parts[0].body).contains("The contract is attached."));
    let part = &parts[1];
    assert_eq!(part.disposition, mailparse::DispositionType::Attachment);
    assert_eq!(part.content_type, "application/pdf");
    assert_eq!(part.filename.as_deref(), meta["filename"].as_str());
    assert_eq!(part.body, canary.bytes, "MIME part intact");
    assert_eq!(json!(files::sha256_hex(&part.body)), meta["sha256"]);

    let message_id = format!("<{}@keyturn>", a.idempotency_key);
    assert_eq!(
        w.receipt(a.id).await.expect("receipt"),
        json!({"smtp_code": 250, "provider_message_id": message_id}),
        "the receipt is what it is without files"
    );
    assert_left_no_trace(&w, &log, &canary, &meta).await;
}

/// `keyturn.file_content` as keyturnd calls it, with a provider of the
/// test's own so no running keyturnd leases the action: refused (`55000`)
/// before `begin_dispatch`, under another lease, and after the final
/// status; a file the action does not hold is told apart as missing.
#[tokio::test]
async fn test_file_content_only_while_executing_under_the_lease() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    file_content_under_the_lease(port, false).await;
}

/// The same through the tenant-explicit calls keyturnd makes where keyturn's
/// tables are distributed by tenant (`lease_for`, `attachments_for`, …).
#[tokio::test]
async fn test_file_content_only_while_executing_under_the_lease_by_tenant() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    file_content_under_the_lease(port, true).await;
}

async fn file_content_under_the_lease(port: u16, by_tenant: bool) {
    let w = World::new(port).await;
    let provider = e2e::unique("files");
    let tool = files_tool(&w, &provider, json!({}), json!(["files"])).await;
    let canary = Canary::new();
    let meta = stage(&w, &canary.bytes, &private_filename()).await;
    let file_id: Uuid = meta["file_id"].as_str().expect("id").parse().expect("uuid");
    let a = w.queue(&tool, json!({"files": [meta]}), false).await;

    let d = e2e::connect(port, "app_dispatcher").await;
    let route = by_tenant.then_some(w.tenant.as_str());
    let jobs = db::lease(
        &d,
        route,
        "e2e-files",
        1,
        Duration::from_secs(30),
        &[&provider],
    )
    .await
    .expect("lease");
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(
        (job.action_id, job.tenant.as_str()),
        (a.id, w.tenant.as_str())
    );
    let refused = |e: &keyturnd::Error| e.is_object_not_in_state() && !db::is_missing_file(e);

    // Which files: the database says, leased or executing, under this lease.
    let listed = db::attachments(&d, route, a.id, job.lease_id)
        .await
        .expect("leased");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].param.as_str(),
            listed[0].file_id,
            json!(listed[0].sha256)
        ),
        ("files", file_id, meta["sha256"].clone())
    );
    let e = db::attachments(&d, route, a.id, Uuid::new_v4())
        .await
        .expect_err("another lease");
    assert!(refused(&e), "{e}");

    let e = db::file_content(&d, route, a.id, job.lease_id, file_id)
        .await
        .expect_err("leased, not executing");
    assert!(refused(&e), "{e}");
    let begun = db::begin_dispatch_many(&d, route, &[(a.id, job.lease_id)])
        .await
        .expect("begin");
    assert!(begun[0].dispatch, "{begun:?}");

    let bytes = db::file_content(&d, route, a.id, job.lease_id, file_id)
        .await
        .expect("executing under this lease");
    assert_eq!(bytes, canary.bytes);
    let e = db::file_content(&d, route, a.id, Uuid::new_v4(), file_id)
        .await
        .expect_err("another lease");
    assert!(refused(&e), "{e}");
    let e = db::file_content(&d, route, a.id, job.lease_id, Uuid::new_v4())
        .await
        .expect_err("not this action's file");
    assert!(db::is_missing_file(&e), "{e}");

    let status = db::complete(&d, route, a.id, job.lease_id, "succeeded", &json!({}), None)
        .await
        .expect("complete");
    assert_eq!(status, "succeeded");
    let e = db::file_content(&d, route, a.id, job.lease_id, file_id)
        .await
        .expect_err("final");
    assert!(refused(&e), "{e}");
    let e = db::attachments(&d, route, a.id, job.lease_id)
        .await
        .expect_err("final");
    assert!(refused(&e), "{e}");
    assert_eq!(
        w.count(
            "SELECT count(*) FROM keyturn.staged_file WHERE id = $1",
            file_id
        )
        .await,
        0
    );
}

/// The database, not the params' shape, says which params are files: a
/// tool that declares no attachments but takes a list shaped like one sends
/// it as the plain param the approver saw, and keyturnd reads no file.
#[tokio::test]
async fn test_a_look_alike_list_the_tool_does_not_declare_is_a_plain_param() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w
        .tool(
            "e2e_lookalike",
            json!({
                "executor": "external",
                "provider": "webhook",
                "summary": "Send the files",
                "params_schema": {"type": "object", "properties": {"docs": files_schema()},
                                  "required": ["docs"]}
            }),
        )
        .await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = Keyturnd::start(port, rx.env()).await;
    let fake = files::meta(Uuid::new_v4(), b"never staged", "x.pdf", "application/pdf");
    let a = w.queue(&tool, json!({"docs": [fake.clone()]}), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    k.stop().await;
    let sent = rx.requests(a.id);
    assert_eq!(sent.len(), 1, "sent once");
    let body: Value = serde_json::from_slice(&sent[0].body).expect("json body");
    assert_eq!(
        body["params"]["docs"],
        json!([fake]),
        "the param as approved"
    );
    assert!(body.get("attachments").is_none(), "no file read: {body}");
}

/// Metadata the database cannot read back (a `size` that is no integer,
/// left by an older keyturn or written around its checks) is a deterministic
/// failure: the action ends `failed` on its first attempt with the reason,
/// nothing is sent, and it is never retried or left `uncertain`.
#[tokio::test]
async fn test_unreadable_attachment_metadata_fails_at_once_and_sends_nothing() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = files_tool(
        &w,
        "webhook",
        json!({"text": {"type": "string", "maxLength": 200}}),
        json!(["text", "files"]),
    )
    .await;
    let meta = stage(&w, b"%PDF-1.4 minimal", "contract.pdf").await;
    let a = w
        .queue(
            &tool,
            json!({"text": "bad metadata", "files": [meta]}),
            false,
        )
        .await;
    // Around every check: the stored params, as a restore of an edited dump
    // or a bug would leave them.
    w.superuser
        .batch_execute(&format!(
            "SET session_replication_role = replica; \
             UPDATE keyturn.action SET params = jsonb_set(params, '{{files,0,size}}', '\"1.5e3\"') \
              WHERE id = '{}'; \
             RESET session_replication_role",
            a.id
        ))
        .await
        .expect("corrupt the metadata");
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = Keyturnd::start(port, rx.env()).await;
    w.wait_status(a.id, "failed", WITHIN).await;
    let log = k.stop().await;
    assert_eq!(rx.requests(a.id).len(), 0, "nothing sent");
    assert_eq!(
        w.state(a.id).await,
        ("failed".into(), 0),
        "ended at begin_dispatch: no attempt"
    );
    let result: Value = w
        .superuser
        .query_one("SELECT result FROM keyturn.action WHERE id = $1", &[&a.id])
        .await
        .expect("result")
        .get(0);
    assert!(
        result["reason"]
            .as_str()
            .unwrap_or("")
            .contains("metadata cannot be read"),
        "{result}\n{log}"
    );
}
