//! Private attachments: which params name files, and the bytes of those
//! files once the database has handed them over.
//!
//! A tool's params may carry, in the key its spec names `attachments_param`,
//! an array of `{"file_id", "sha256", "filename", "content_type", "size"}`.
//! Only that metadata is in the params (and so in the approved hash); the
//! bytes stay in the database until the worker reads them with
//! `keyturn.file_content(action_id, lease_id, file_id)`, after
//! `begin_dispatch` committed (which re-hashed them) and before the provider
//! call, and they live only in memory for that one call.
//!
//! **Which key.** `keyturn.lease` does not say which param is the tool's
//! `attachments_param`, and the dispatcher may not read the tool, so the
//! key is recognized by shape ([`is_attachment_list`]): every top-level
//! params value that is an array whose every element is an object with
//! exactly those five keys and a UUID string `file_id`. The rule can only
//! err towards reading *more* files than the tool declares, never fewer, and
//! the database answers only for files bound to this very action (the ones
//! in its `attachments_param`, checked at propose): a look-alike list in
//! another param makes the attempt `failed` before anything is sent, it
//! never sends a file the approved metadata does not name, and it never
//! drops one it does. An empty array names no file and carries nothing an
//! adapter could leave out, so it counts as a (vacuous) list too.
//!
//! **Bytes.** An [`Attachment`] exists only with bytes whose length and
//! SHA-256 equal its metadata ([`Attachment::verified`]), so an adapter can
//! never send bytes other than the approved ones. Its `Debug` shows the file
//! id and size only: filenames may be private, and the bytes (or their
//! base64) must never reach a log line.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The keys of one attachment's metadata, exactly.
pub const META_KEYS: [&str; 5] = ["file_id", "sha256", "filename", "content_type", "size"];

/// One attachment's metadata as the approved params state it. Serialized in
/// this field order, which is part of the webhook body's byte stability.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct AttachmentMeta {
    /// The staged file.
    pub file_id: Uuid,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
    /// The name the file is sent under.
    pub filename: String,
    /// `type/subtype`.
    pub content_type: String,
    /// Length in bytes.
    pub size: u64,
}

impl fmt::Debug for AttachmentMeta {
    // The filename may be private, like any param value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachmentMeta")
            .field("file_id", &self.file_id)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl AttachmentMeta {
    /// Reads one element of an attachment list. The database checked these
    /// metadata against the staged file at propose time, so a value of
    /// another type here is a contract mismatch, refused rather than guessed.
    fn from_object(obj: &Map<String, Value>) -> Result<Self, &'static str> {
        const BAD: &str = "attachment metadata must be strings, with a whole non-negative size";
        let text = |key: &str| obj.get(key).and_then(Value::as_str).ok_or(BAD);
        let file_id = text("file_id")?
            .parse::<Uuid>()
            .map_err(|_| "attachment file_id must be a UUID")?;
        let size = obj.get("size").and_then(whole_number).ok_or(BAD)?;
        Ok(AttachmentMeta {
            file_id,
            sha256: text("sha256")?.to_owned(),
            filename: text("filename")?.to_owned(),
            content_type: text("content_type")?.to_owned(),
            size,
        })
    }
}

/// `12` and `12.0` alike: jsonb keeps the scale a client wrote.
fn whole_number(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    // 2^53: past it an f64 no longer holds every whole number exactly.
    (f.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&f)).then_some(f as u64)
}

/// Whether `value` has the shape of an attachment list (see the module docs).
pub fn is_attachment_list(value: &Value) -> bool {
    let Some(items) = value.as_array() else {
        return false;
    };
    items.iter().all(|item| {
        item.as_object().is_some_and(|obj| {
            obj.len() == META_KEYS.len()
                && META_KEYS.iter().all(|k| obj.contains_key(*k))
                && obj
                    .get("file_id")
                    .and_then(Value::as_str)
                    .is_some_and(|id| id.parse::<Uuid>().is_ok())
        })
    })
}

/// The params keys that hold attachment lists, in key order.
pub fn attachment_keys(params: &Value) -> Vec<&str> {
    params
        .as_object()
        .map(|obj| {
            obj.iter()
                .filter(|(_, v)| is_attachment_list(v))
                .map(|(k, _)| k.as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// Every attachment the params name, in key order and then list order (a
/// fixed order: params come from jsonb, whose key order is canonical).
/// `Err` when an element does not read as metadata, or a file is named
/// twice; the message names no value.
pub fn named_in(params: &Value) -> Result<Vec<AttachmentMeta>, &'static str> {
    let mut metas: Vec<AttachmentMeta> = Vec::new();
    let Some(obj) = params.as_object() else {
        return Ok(metas);
    };
    for value in obj.values().filter(|v| is_attachment_list(v)) {
        for item in value.as_array().into_iter().flatten() {
            let meta = item
                .as_object()
                .ok_or("attachment metadata must be objects")
                .and_then(AttachmentMeta::from_object)?;
            if metas.iter().any(|m| m.file_id == meta.file_id) {
                return Err("params name one attachment twice");
            }
            metas.push(meta);
        }
    }
    Ok(metas)
}

/// The bytes of one file did not match the metadata the person approved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the bytes of attachment {file_id} do not match its approved metadata (size or SHA-256)")]
pub struct Mismatch {
    /// The file.
    pub file_id: Uuid,
}

/// One file to send: approved metadata and bytes known to match it.
#[derive(Clone, PartialEq, Eq)]
pub struct Attachment {
    meta: AttachmentMeta,
    bytes: Vec<u8>,
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("file_id", &self.meta.file_id)
            .field("size", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

impl Attachment {
    /// Pairs metadata with bytes, refusing bytes whose length or SHA-256
    /// differs from it. The database re-hashed them at `begin_dispatch`
    /// already; this keeps an adapter from ever sending other bytes, should
    /// storage or the connection have changed them since.
    pub fn verified(meta: AttachmentMeta, bytes: Vec<u8>) -> Result<Self, Mismatch> {
        let same_size = u64::try_from(bytes.len()).is_ok_and(|n| n == meta.size);
        let digest = hex::encode(Sha256::digest(&bytes));
        if !same_size || !digest.eq_ignore_ascii_case(&meta.sha256) {
            return Err(Mismatch {
                file_id: meta.file_id,
            });
        }
        Ok(Attachment { meta, bytes })
    }

    /// The approved metadata.
    pub fn meta(&self) -> &AttachmentMeta {
        &self.meta
    }

    /// The bytes. Never log them, nor anything derived from them.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The attachments to send with `params`, in [`named_in`] order: exactly
/// the files the params name, each once. `Err` (naming no value) when the
/// two sets differ, so an adapter neither drops an approved file nor sends
/// one nobody approved.
pub fn in_params_order<'a>(
    params: &Value,
    attachments: &'a [Attachment],
) -> Result<Vec<&'a Attachment>, &'static str> {
    let metas = named_in(params)?;
    if metas.len() != attachments.len() {
        return Err("the attachments given are not the ones the params name");
    }
    metas
        .iter()
        .map(|m| {
            attachments
                .iter()
                .find(|a| a.meta == *m)
                .ok_or("the attachments given are not the ones the params name")
        })
        .collect()
}

/// Count and total bytes, the only facts about attachments that are logged.
pub fn totals(attachments: &[Attachment]) -> (usize, u64) {
    let bytes = attachments.iter().map(|a| a.meta.size).sum();
    (attachments.len(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta_json(id: Uuid, bytes: &[u8], filename: &str) -> Value {
        json!({
            "file_id": id.to_string(),
            "sha256": hex::encode(Sha256::digest(bytes)),
            "filename": filename,
            "content_type": "application/pdf",
            "size": bytes.len(),
        })
    }

    #[test]
    fn test_lists_are_recognized_by_exact_shape() {
        let id = Uuid::new_v4();
        let good = meta_json(id, b"x", "a.pdf");
        assert!(is_attachment_list(&json!([good])));
        assert!(is_attachment_list(&json!([])), "vacuously");
        let mut extra = good.clone();
        extra["note"] = json!("n");
        let mut missing = good.clone();
        missing.as_object_mut().expect("object").remove("size");
        let mut not_uuid = good.clone();
        not_uuid["file_id"] = json!("file-1");
        for not in [
            json!(good),
            json!([extra]),
            json!([missing]),
            json!([not_uuid]),
            json!([good, "x"]),
            json!("a.pdf"),
        ] {
            assert!(!is_attachment_list(&not), "{not}");
        }
    }

    #[test]
    fn test_named_in_reads_every_list_in_order() {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let params = json!({
            "files": [meta_json(a, b"one", "1.pdf"), meta_json(b, b"two", "2.pdf")],
            "also": [meta_json(c, b"three", "3.pdf")],
            "to": "x@example.com",
            "tags": ["a"],
        });
        let ids: Vec<Uuid> = named_in(&params)
            .expect("reads")
            .iter()
            .map(|m| m.file_id)
            .collect();
        assert_eq!(ids, vec![c, a, b], "key order (jsonb's), then list order");
        assert_eq!(attachment_keys(&params), vec!["also", "files"]);

        let mut scaled = meta_json(a, b"one", "1.pdf");
        scaled["size"] = json!(3.0);
        assert_eq!(named_in(&json!({"f": [scaled]})).expect("3.0")[0].size, 3);
        let mut bad = meta_json(a, b"one", "1.pdf");
        bad["filename"] = json!(1);
        assert!(
            named_in(&json!({"f": [bad]})).is_err(),
            "refused, not skipped"
        );
        let twice = json!({"f": [meta_json(a, b"1", "x"), meta_json(a, b"1", "x")]});
        assert!(named_in(&twice).is_err());
    }

    #[test]
    fn test_only_matching_bytes_make_an_attachment() {
        let id = Uuid::new_v4();
        let params = json!({"files": [meta_json(id, b"%PDF-1.7", "a.pdf")]});
        let meta = named_in(&params).expect("reads").remove(0);
        assert_eq!(
            Attachment::verified(meta.clone(), b"%PDF-1.8".to_vec()),
            Err(Mismatch { file_id: id })
        );
        assert!(Attachment::verified(meta.clone(), b"%PDF-1.7 ".to_vec()).is_err());
        let ok = Attachment::verified(meta, b"%PDF-1.7".to_vec()).expect("matches");
        let shown = format!("{ok:?} {:?}", ok.meta());
        assert!(
            !shown.contains("a.pdf") && !shown.contains("PDF"),
            "{shown}"
        );
        assert_eq!(totals(std::slice::from_ref(&ok)), (1, 8));

        assert_eq!(
            in_params_order(&params, std::slice::from_ref(&ok))
                .expect("same set")
                .len(),
            1
        );
        assert!(
            in_params_order(&params, &[]).is_err(),
            "an approved file missing"
        );
        assert!(
            in_params_order(&json!({"files": []}), &[ok]).is_err(),
            "a file nobody approved"
        );
    }
}
