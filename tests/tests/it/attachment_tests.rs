//! docs/sql-api.md, "Private attachments", the SQL side: files staged by a
//! principal, verified at propose, bound to one action, re-hashed at
//! begin_dispatch, read by the dispatcher only while executing, and gone in
//! the transaction that gives the action a final status. There is one copy
//! of the bytes, in keyturn.staged_file, and nowhere else.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

/// An external tool that takes PDFs of at most 1 KiB in params.files.
async fn files_tool(w: &World, extra: Value) -> String {
    let mut spec = json!({
        "executor": "external",
        "provider": "webhook",
        "effect": "reversible",
        "summary": "Send files to {channel}",
        "params_schema": {
            "type": "object",
            "properties": {
                "channel": {"type": "string"},
                "files": {"type": "array", "items": {"type": "object", "properties": {
                    "file_id": {"type": "string"}, "sha256": {"type": "string"},
                    "filename": {"type": "string"}, "content_type": {"type": "string"},
                    "size": {"type": "integer"}}}}
            },
            "required": ["channel", "files"]
        },
        "attachments_param": "files",
        "attachment_types": ["application/pdf"],
        "max_attachment_bytes": 1024
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        for (k, v) in e {
            if v.is_null() {
                s.remove(&k);
            } else {
                s.insert(k, v);
            }
        }
    }
    w.tool("files", spec).await
}

/// Bytes no other test stages: ASCII, so a copy would show in any text form.
fn private_bytes() -> Vec<u8> {
    format!("%PDF-1.7 keyturn-private {}", uuid::Uuid::new_v4()).into_bytes()
}

async fn stage(w: &World, content: &[u8]) -> StagedFile {
    stage_file_on(&w.agent, content, "report.pdf", "application/pdf")
        .await
        .unwrap()
}

fn with_files(files: &[Value]) -> Value {
    json!({"channel": "ops", "files": files})
}

async fn staged_rows(w: &World, id: uuid::Uuid) -> i64 {
    count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.staged_file WHERE id = $1",
        &[&id],
    )
    .await
}

/// Every form a copy of the bytes could take in a table: the text itself,
/// hex (bytea's output, and a careless encode), base64 and base64url.
fn needles(content: &[u8]) -> Vec<String> {
    const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in content.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            b64.push(STD[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    let url: String = b64
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    vec![
        String::from_utf8(content.to_vec()).unwrap(),
        hex::encode(content),
        b64,
        url,
    ]
}

/// The keyturn tables whose text holds a copy of `content`, in any of its
/// forms, with the form found.
async fn copies(superuser: &Client, tenant: &str, content: &[u8]) -> Vec<(String, String)> {
    let tables: Vec<String> = superuser
        .query(
            "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables \
              WHERE schemaname IN ('keyturn', 'keyturn_secret') ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.len() > 15, "{tables:?}");
    let mut found = Vec::new();
    for t in &tables {
        // Other tests stage files of many MiB; their rows are not this
        // tenant's and cannot hold this tenant's bytes.
        let only_tenant = if t == "keyturn.staged_file" {
            "AND x.tenant = $2"
        } else {
            "AND $2::text IS NOT NULL"
        };
        for n in needles(content) {
            let hits = count(
                superuser,
                &format!("SELECT count(*) FROM {t} x WHERE strpos(x::text, $1) > 0 {only_tenant}"),
                &[&n, &tenant],
            )
            .await;
            if hits > 0 {
                found.push((t.clone(), n));
            }
        }
    }
    found
}

/// While staged, the scan finds the bytes in staged_file (so it can find
/// them) and nowhere else.
async fn assert_only_staged(w: &World, content: &[u8]) {
    let found = copies(&w.superuser, &w.tenant, content).await;
    assert!(!found.is_empty(), "the scan finds staged bytes");
    assert!(
        found.iter().all(|(t, _)| t == "keyturn.staged_file"),
        "a copy outside keyturn.staged_file: {found:?}"
    );
}

async fn assert_gone(w: &World, f: &StagedFile, content: &[u8], why: &str) {
    assert_eq!(
        staged_rows(w, f.id).await,
        0,
        "{why}: the bytes are deleted"
    );
    let found = copies(&w.superuser, &w.tenant, content).await;
    assert!(found.is_empty(), "{why}: a copy is left: {found:?}");
}

async fn file_content(
    d: &Client,
    l: &Lease,
    file: uuid::Uuid,
) -> Result<Vec<u8>, tokio_postgres::Error> {
    d.query_one(
        "SELECT keyturn.file_content($1, $2, $3)",
        &[&l.action_id, &l.lease_id, &file],
    )
    .await
    .map(|r| r.get(0))
}

#[tokio::test]
async fn test_stage_file_returns_the_hash_and_size_and_belongs_to_its_principal() {
    let w = World::new("member").await;
    let content = private_bytes();
    let f = stage(&w, &content).await;
    assert_eq!(f.sha256, hex::encode(Sha256::digest(&content)));
    assert_eq!(f.size, content.len() as i64);
    let r = w
        .superuser
        .query_one(
            "SELECT tenant, principal, filename, content_type, content, action_id IS NULL \
               FROM keyturn.staged_file WHERE id = $1",
            &[&f.id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), w.tenant);
    assert_eq!(r.get::<_, String>(1), w.principal);
    assert_eq!(r.get::<_, String>(2), "report.pdf");
    assert_eq!(r.get::<_, String>(3), "application/pdf");
    assert_eq!(r.get::<_, Vec<u8>>(4), content);
    assert!(r.get::<_, bool>(5));
    // The person's side stages too; the dispatcher and a caller without
    // identity do not.
    stage_file_on(&w.human, b"x", "note.pdf", "application/pdf")
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    assert_eq!(
        sqlstate(stage_file_on(&d, b"x", "note.pdf", "application/pdf").await),
        "42501"
    );
    let bare = connect("app_agent").await;
    assert_eq!(
        sqlstate(stage_file_on(&bare, b"x", "note.pdf", "application/pdf").await),
        "42501"
    );
}

#[tokio::test]
async fn test_stage_file_refuses_bad_names_types_and_sizes() {
    let w = World::new("member").await;
    let long_ok = format!("{}a", "é".repeat(127)); // 255 bytes
    let long_bad = "é".repeat(128); // 128 characters, 256 bytes
    stage_file_on(&w.agent, b"x", &long_ok, "application/pdf")
        .await
        .unwrap();
    for name in [
        "a/b.pdf",
        "a\\b.pdf",
        "a\u{1}b.pdf",
        "a\nb.pdf",
        "a\u{7f}b.pdf",
        "",
        ".",
        "..",
        long_bad.as_str(),
    ] {
        assert_eq!(
            sqlstate(stage_file_on(&w.agent, b"x", name, "application/pdf").await),
            "22023",
            "filename {name:?}"
        );
    }
    for ctype in [
        "",
        "pdf",
        "Application/PDF",
        "application/",
        "/pdf",
        "text/plain; charset=utf-8",
        "application/pdf ",
        "application/pdf\n",
    ] {
        assert_eq!(
            sqlstate(stage_file_on(&w.agent, b"x", "a.pdf", ctype).await),
            "22023",
            "content type {ctype:?}"
        );
    }
    assert_eq!(
        sqlstate(stage_file_on(&w.agent, b"", "a.pdf", "application/pdf").await),
        "22023",
        "empty"
    );
    // The bound is 25 MiB: built in the server, not sent twice over the wire.
    let big = |n: i32| {
        let agent = &w.agent;
        async move {
            agent
                .query_one(
                    "SELECT size FROM keyturn.stage_file(convert_to(repeat('a', $1), 'UTF8'), \
                     'big.pdf', 'application/pdf')",
                    &[&n],
                )
                .await
                .map(|r| r.get::<_, i64>(0))
        }
    };
    assert_eq!(sqlstate(big(25 * 1024 * 1024 + 1).await), "22023");
    assert_eq!(big(25 * 1024 * 1024).await.unwrap(), 25 * 1024 * 1024);
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.staged_file WHERE tenant = $1",
            &[&w.tenant]
        )
        .await,
        2
    );
    forget_files(&w).await;
}

/// Deletes the tenant's staged files, so the MiBs a test staged do not weigh
/// on every later scan of the table.
async fn forget_files(w: &World) {
    w.superuser
        .execute(
            "DELETE FROM keyturn.staged_file WHERE tenant = $1",
            &[&w.tenant],
        )
        .await
        .unwrap();
}

/// propose checks every attachment against the file staged under its id:
/// owner, binding, metadata, type, size. Each wrong element alone is
/// refused; the right one is then accepted and bound.
#[tokio::test]
async fn test_propose_verifies_each_attachment() {
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let f = stage(&w, &private_bytes()).await;
    let good = f.attachment();
    let with = |key: &str, v: Value| {
        let mut a = good.clone();
        a[key] = v;
        a
    };
    let text = stage_file_on(&w.agent, b"plain", "a.txt", "text/plain")
        .await
        .unwrap();
    let large = stage(&w, &[b'x'; 1025]).await;
    let (_, other_agent) = w.other("member", "app_agent", "s-other").await;
    let theirs = stage_file_on(&other_agent, b"theirs", "t.pdf", "application/pdf")
        .await
        .unwrap();
    let elsewhere = World::new("member").await;
    let foreign = stage(&elsewhere, b"foreign").await;
    let mut missing_key = good.clone();
    missing_key.as_object_mut().unwrap().remove("size");
    let mut extra_key = good.clone();
    extra_key["url"] = json!("https://example.com/report.pdf");
    let wrong: Vec<(&str, Vec<Value>)> = vec![
        (
            "another file's hash",
            vec![with("sha256", json!(text.sha256))],
        ),
        ("another size", vec![with("size", json!(f.size + 1))]),
        (
            "another filename",
            vec![with("filename", json!("other.pdf"))],
        ),
        (
            "another content type",
            vec![with("content_type", json!("image/png"))],
        ),
        ("a type the tool does not take", vec![text.attachment()]),
        ("larger than the tool takes", vec![large.attachment()]),
        ("another principal's file", vec![theirs.attachment()]),
        ("another tenant's file", vec![foreign.attachment()]),
        (
            "an unknown file",
            vec![with("file_id", json!(uuid::Uuid::new_v4()))],
        ),
        (
            "a file id that is no uuid",
            vec![with("file_id", json!("report"))],
        ),
        ("a missing key", vec![missing_key]),
        ("a key more", vec![extra_key]),
        ("the same file twice", vec![good.clone(), good.clone()]),
    ];
    for (what, files) in wrong {
        assert_eq!(
            sqlstate(w.propose(&t, with_files(&files)).await),
            "22023",
            "{what}"
        );
    }
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.staged_file WHERE tenant = $1 AND action_id IS NOT NULL",
            &[&w.tenant]
        )
        .await,
        0,
        "nothing bound by a refused proposal"
    );
    let p = w
        .propose(&t, with_files(std::slice::from_ref(&good)))
        .await
        .unwrap();
    let bound: Option<uuid::Uuid> = w
        .superuser
        .query_one(
            "SELECT action_id FROM keyturn.staged_file WHERE id = $1",
            &[&f.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound, Some(p.id));
    // One action per staged file.
    let again = w.propose(&t, with_files(&[good])).await;
    let msg = message(w.propose(&t, with_files(&[f.attachment()])).await);
    assert_eq!(sqlstate(again), "55000");
    assert!(msg.contains("already belongs to action"), "{msg}");
}

/// Without max_attachment_bytes a tool takes files of up to 10 MiB.
#[tokio::test]
async fn test_default_attachment_bound_is_ten_mib() {
    let w = World::new("member").await;
    let t = files_tool(&w, json!({"max_attachment_bytes": null})).await;
    let bound: i64 = w
        .superuser
        .query_one(
            "SELECT max_attachment_bytes FROM keyturn.tool_version WHERE tool = $1",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound, 10 * 1024 * 1024);
    let big = |n: i32| {
        let agent = &w.agent;
        async move {
            let r = agent
                .query_one(
                    "SELECT file_id, sha256, size FROM keyturn.stage_file(convert_to(repeat('a', $1), 'UTF8'), \
                     'big.pdf', 'application/pdf')",
                    &[&n],
                )
                .await
                .unwrap();
            StagedFile {
                id: r.get(0),
                sha256: r.get(1),
                size: r.get(2),
                filename: "big.pdf".into(),
                content_type: "application/pdf".into(),
            }
        }
    };
    let over = big(10 * 1024 * 1024 + 1).await;
    assert_eq!(
        sqlstate(w.propose(&t, with_files(&[over.attachment()])).await),
        "22023"
    );
    let at = big(10 * 1024 * 1024).await;
    let p = w.propose(&t, with_files(&[at.attachment()])).await.unwrap();
    let status: String = w
        .human
        .query_one("SELECT keyturn.reject($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "rejected");
    forget_files(&w).await;
}

/// Kept while the action is open, gone in the transaction of its final
/// status, whichever it is: a dispatch that succeeded, a rejection, an
/// expiry found by the sweep, a provider failure, a cancellation.
#[tokio::test]
async fn test_bytes_are_deleted_with_every_final_status() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let d = connect("app_dispatcher").await;

    let content = private_bytes();
    let f = stage(&w, &content).await;
    let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
    assert_only_staged(&w, &content).await;
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    assert_eq!(staged_rows(&w, f.id).await, 1, "kept while queued");
    let l = lease_mine(&d, &[p.id], "30 seconds").await.remove(0);
    assert_eq!(staged_rows(&w, f.id).await, 1, "kept while leased");
    assert!(begin(&d, &l).await.unwrap());
    assert_eq!(file_content(&d, &l, f.id).await.unwrap(), content);
    assert_eq!(
        complete(&d, &l, "succeeded", json!({"status": 200}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    assert_gone(&w, &f, &content, "succeeded").await;

    let content = private_bytes();
    let f = stage(&w, &content).await;
    let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
    let status: String = w
        .human
        .query_one("SELECT keyturn.reject($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "rejected");
    assert_gone(&w, &f, &content, "rejected").await;

    let content = private_bytes();
    let f = stage(&w, &content).await;
    let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    let l = lease_mine(&d, &[p.id], "30 seconds").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    assert_eq!(
        complete(&d, &l, "failed", json!({"status": 400}), None)
            .await
            .unwrap(),
        "failed"
    );
    assert_gone(&w, &f, &content, "failed").await;

    let content = private_bytes();
    let f = stage(&w, &content).await;
    let p = propose_on(
        &w.agent,
        &t,
        with_files(&[f.attachment()]),
        json!({"conversation_id": "conv"}),
    )
    .await
    .unwrap();
    w.agent
        .query_one("SELECT keyturn.cancel_origin('conv')", &[])
        .await
        .unwrap();
    assert_eq!(w.status(p.id).await, "cancelled");
    assert_gone(&w, &f, &content, "cancelled").await;

    let brief = files_tool(&w, json!({"expires_in": "1 second"})).await;
    let content = private_bytes();
    let f = stage(&w, &content).await;
    let p = w
        .propose(&brief, with_files(&[f.attachment()]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(staged_rows(&w, f.id).await, 1, "kept while pending");
    d.query_one("SELECT * FROM keyturn.sweep()", &[])
        .await
        .unwrap();
    assert_eq!(w.status(p.id).await, "expired");
    assert_gone(&w, &f, &content, "expired").await;
    assert_work_list_in_step(&w.superuser).await;
}

/// An uncertain outcome keeps the bytes (an operator may need to know what
/// was sent, and nothing is final); reconciling it, either way, deletes them.
/// The dispatcher cannot read them while the action is not executing.
#[tokio::test]
async fn test_bytes_are_kept_while_uncertain_and_deleted_when_reconciled() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let d = connect("app_dispatcher").await;
    let op = connect("app_operator").await;
    for outcome in ["succeeded", "failed"] {
        let content = private_bytes();
        let f = stage(&w, &content).await;
        let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
        assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        let l = lease_mine(&d, &[p.id], "30 seconds").await.remove(0);
        assert!(begin(&d, &l).await.unwrap());
        assert_eq!(
            complete(&d, &l, "unknown", json!({}), None).await.unwrap(),
            "uncertain"
        );
        assert_eq!(staged_rows(&w, f.id).await, 1, "kept while uncertain");
        assert_only_staged(&w, &content).await;
        assert_eq!(sqlstate(file_content(&d, &l, f.id).await), "55000");
        let r: String = op
            .query_one(
                "SELECT keyturn.reconcile($1, $2, 'checked with the provider')",
                &[&p.id, &outcome],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(r, outcome);
        assert_gone(&w, &f, &content, outcome).await;
    }
}

/// begin_dispatch hashes the stored bytes again: bytes changed (or removed)
/// in storage since the approval are never sent.
#[tokio::test]
async fn test_bytes_changed_in_storage_invalidate_at_begin_dispatch() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let d = connect("app_dispatcher").await;
    let changed = stage(&w, &private_bytes()).await;
    let removed = stage(&w, &private_bytes()).await;
    let intact = stage(&w, &private_bytes()).await;
    let mut ids = Vec::new();
    for f in [&changed, &removed, &intact] {
        let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
        assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        ids.push(p.id);
    }
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    let lease_of = |id| leases.iter().find(|l| l.action_id == id).unwrap();
    let n = tamper(
        &w.superuser,
        "UPDATE keyturn.staged_file SET content = convert_to('%PDF-1.7 something else', 'UTF8') WHERE id = $1",
        &[&changed.id],
    )
    .await;
    assert_eq!(n, 1);
    tamper(
        &w.superuser,
        "DELETE FROM keyturn.staged_file WHERE id = $1",
        &[&removed.id],
    )
    .await;
    for (id, f) in [(ids[0], &changed), (ids[1], &removed)] {
        assert!(!begin(&d, lease_of(id)).await.unwrap(), "never sent");
        assert_eq!(w.status(id).await, "invalidated");
        let reason: Value = w
            .superuser
            .query_one("SELECT result FROM keyturn.action WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert!(
            reason["reason"]
                .as_str()
                .unwrap()
                .contains(&f.id.to_string()),
            "{reason}"
        );
        assert_eq!(staged_rows(&w, f.id).await, 0);
        assert_eq!(attempts(&w, id).await, 0);
    }
    assert!(begin(&d, lease_of(ids[2])).await.unwrap());
    complete(&d, lease_of(ids[2]), "succeeded", json!({}), None)
        .await
        .unwrap();
}

/// Attachment metadata the database cannot read back (a `size` that is no
/// integer: propose refuses it now, an older keyturn or an edit around the
/// checks could leave it) is a deterministic failure: begin_dispatch ends
/// the action failed with the reason, nothing is dispatched, and the batch
/// it came in goes on for the others (it used to fail whole, at every
/// lease, for everyone in it).
#[tokio::test]
async fn test_unreadable_metadata_fails_at_begin_dispatch_and_spares_the_batch() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let d = connect("app_dispatcher").await;
    let bad = stage(&w, &private_bytes()).await;
    let good = stage(&w, &private_bytes()).await;
    let mut ids = Vec::new();
    for f in [&bad, &good] {
        let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
        assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        ids.push(p.id);
    }
    let n = tamper(
        &w.superuser,
        "UPDATE keyturn.action SET params = jsonb_set(params, '{files,0,size}', '1.5') WHERE id = $1",
        &[&ids[0]],
    )
    .await;
    assert_eq!(n, 1);
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    assert_eq!(leases.len(), 2);
    let lease_ids: Vec<uuid::Uuid> = ids
        .iter()
        .map(|id| leases.iter().find(|l| l.action_id == *id).unwrap().lease_id)
        .collect();
    let rows = d
        .query(
            "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)",
            &[&ids, &lease_ids],
        )
        .await
        .expect("the batch is not failed by one action");
    let dispatch = |id: uuid::Uuid| {
        rows.iter()
            .find(|r| r.get::<_, uuid::Uuid>(0) == id)
            .map(|r| r.get::<_, bool>(1))
            .unwrap()
    };
    assert!(!dispatch(ids[0]), "never dispatched");
    assert!(dispatch(ids[1]), "the other goes on");
    assert_eq!(w.status(ids[0]).await, "failed");
    let result: Value = w
        .superuser
        .query_one(
            "SELECT result FROM keyturn.action WHERE id = $1",
            &[&ids[0]],
        )
        .await
        .unwrap()
        .get(0);
    let reason = result["reason"].as_str().unwrap_or("");
    assert!(reason.contains("metadata cannot be read"), "{result}");
    assert!(!reason.contains("1.5"), "no value in the reason: {result}");
    assert_eq!(attempts(&w, ids[0]).await, 0);
    assert_eq!(
        staged_rows(&w, bad.id).await,
        0,
        "its bytes go with the final status"
    );
    let l = leases.iter().find(|l| l.action_id == ids[1]).unwrap();
    complete(&d, l, "succeeded", json!({}), None).await.unwrap();
}

/// file_content: the dispatcher only, for a file of this action, only while
/// it executes under this lease.
#[tokio::test]
async fn test_file_content_only_while_executing_under_the_lease() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let d = connect("app_dispatcher").await;
    let content = private_bytes();
    let f = stage(&w, &content).await;
    let unbound = stage(&w, &private_bytes()).await;
    let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    let l = lease_mine(&d, &[p.id], "30 seconds").await.remove(0);
    assert_eq!(
        sqlstate(file_content(&d, &l, f.id).await),
        "55000",
        "leased"
    );
    assert!(begin(&d, &l).await.unwrap());
    let wrong = Lease {
        lease_id: uuid::Uuid::new_v4(),
        ..l.clone()
    };
    assert_eq!(
        sqlstate(file_content(&d, &wrong, f.id).await),
        "55000",
        "another lease"
    );
    assert_eq!(
        sqlstate(file_content(&d, &l, unbound.id).await),
        "55000",
        "not this action's file"
    );
    for who in [&w.agent, &w.human] {
        assert_eq!(
            sqlstate(
                who.query_one(
                    "SELECT keyturn.file_content($1, $2, $3)",
                    &[&l.action_id, &l.lease_id, &f.id],
                )
                .await
            ),
            "42501"
        );
    }
    assert_eq!(file_content(&d, &l, f.id).await.unwrap(), content);
    complete(&d, &l, "succeeded", json!({}), None)
        .await
        .unwrap();
    assert_eq!(sqlstate(file_content(&d, &l, f.id).await), "55000", "final");
}

/// The sweep deletes files that no proposal bound, a day after staging;
/// fresh ones and bound ones stay.
#[tokio::test]
async fn test_sweep_deletes_unbound_files_a_day_old() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let stale = stage(&w, &private_bytes()).await;
    let fresh = stage(&w, &private_bytes()).await;
    let bound = stage(&w, &private_bytes()).await;
    let p = w
        .propose(&t, with_files(&[bound.attachment()]))
        .await
        .unwrap();
    tamper(
        &w.superuser,
        "UPDATE keyturn.staged_file SET staged_at = staged_at - interval '25 hours' WHERE id = ANY ($1)",
        &[&vec![stale.id, bound.id]],
    )
    .await;
    let edge = stage(&w, &private_bytes()).await;
    tamper(
        &w.superuser,
        "UPDATE keyturn.staged_file SET staged_at = clock_timestamp() - interval '23 hours' WHERE id = $1",
        &[&edge.id],
    )
    .await;
    let d = connect("app_dispatcher").await;
    let files: i32 = d
        .query_one("SELECT files FROM keyturn.sweep()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(files >= 1, "{files}");
    assert_eq!(staged_rows(&w, stale.id).await, 0);
    for f in [&fresh, &bound, &edge] {
        assert_eq!(staged_rows(&w, f.id).await, 1);
    }
    assert_eq!(w.status(p.id).await, "pending");
}

/// Asking again for the same task call with an attachment is the replay of
/// the admitted action, whose files it already holds.
#[tokio::test]
async fn test_task_replay_with_an_attachment_returns_the_admitted_action() {
    let w = World::new("member").await;
    let t = files_tool(&w, json!({"approval": "task"})).await;
    let f = stage(&w, &private_bytes()).await;
    assert!(
        record_request_on(&w.human, "conv", "turn-1", "msg-1", "send the report")
            .await
            .unwrap()
    );
    let origin = task_origin("conv", "turn-1", "msg-1");
    let first = propose_full(&w.agent, &t, with_files(&[f.attachment()]), origin.clone())
        .await
        .unwrap();
    assert_eq!(first.status, "queued");
    let again = propose_full(&w.agent, &t, with_files(&[f.attachment()]), origin)
        .await
        .expect("the replay of an admitted call");
    assert_eq!((again.id, again.token), (first.id, None));
}

/// Edit before approve keeps the attachment: the revision takes the file
/// over from the proposal it supersedes.
#[tokio::test]
async fn test_revision_keeps_the_attachments() {
    let w = World::new("member").await;
    let t = files_tool(&w, json!({})).await;
    let content = private_bytes();
    let f = stage(&w, &content).await;
    let p = w.propose(&t, with_files(&[f.attachment()])).await.unwrap();
    let revised = w
        .human
        .query_one(
            "SELECT action_id FROM keyturn.revise($1, $2, $3)",
            &[
                &p.id,
                &p.token,
                &json!({"channel": "sales", "files": [f.attachment()]}),
            ],
        )
        .await
        .expect("revise a proposal with an attachment");
    let id: uuid::Uuid = revised.get(0);
    assert_eq!(w.status(p.id).await, "superseded");
    let bound: Option<uuid::Uuid> = w
        .superuser
        .query_one(
            "SELECT action_id FROM keyturn.staged_file WHERE id = $1",
            &[&f.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound, Some(id));
}
