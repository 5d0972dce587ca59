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
//! **Which key.** The database says: `keyturn.attachments(action_id,
//! lease_id)` lists the files of an action from its approved params, each
//! with the key its tool's spec names `attachments_param`, in list order.
//! keyturnd never decides which params are files. It only skips that round
//! trip for a job whose params hold no list shaped like one
//! ([`may_name_files`]): `propose` accepts an attachment list only in that
//! exact shape, so such a job has no files. A look-alike list under another
//! key is just a param, sent as the approver saw it.
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

/// Whether `value` has the shape of an attachment list: an array whose
/// every element is an object with exactly [`META_KEYS`] and a UUID string
/// `file_id`. An empty array has it too.
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

/// Whether the params might name files: some top-level value is a
/// non-empty attachment list. When not, the job has none and keyturnd does
/// not ask the database.
pub fn may_name_files(params: &Value) -> bool {
    params.as_object().is_some_and(|obj| {
        obj.values()
            .any(|v| v.as_array().is_some_and(|a| !a.is_empty()) && is_attachment_list(v))
    })
}

/// The metadata listed under `key`, in list order. `Err` when that is not
/// an attachment list, an element does not read as metadata, or a file is
/// named twice; the message names no value.
pub fn listed_under(params: &Value, key: &str) -> Result<Vec<AttachmentMeta>, &'static str> {
    let list = params.get(key).unwrap_or(&Value::Null);
    if !is_attachment_list(list) {
        return Err("the attachments param is not a list of attachment metadata");
    }
    let mut metas: Vec<AttachmentMeta> = Vec::new();
    for item in list.as_array().into_iter().flatten() {
        let meta = item
            .as_object()
            .ok_or("attachment metadata must be objects")
            .and_then(AttachmentMeta::from_object)?;
        if metas.iter().any(|m| m.file_id == meta.file_id) {
            return Err("params name one attachment twice");
        }
        metas.push(meta);
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

/// One file to send: the params key that lists it, its approved metadata
/// and bytes known to match it.
#[derive(Clone, PartialEq, Eq)]
pub struct Attachment {
    param: String,
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
    pub fn verified(param: String, meta: AttachmentMeta, bytes: Vec<u8>) -> Result<Self, Mismatch> {
        let same_size = u64::try_from(bytes.len()).is_ok_and(|n| n == meta.size);
        let digest = hex::encode(Sha256::digest(&bytes));
        if !same_size || !digest.eq_ignore_ascii_case(&meta.sha256) {
            return Err(Mismatch {
                file_id: meta.file_id,
            });
        }
        Ok(Attachment { param, meta, bytes })
    }

    /// The params key whose list names this file.
    pub fn param(&self) -> &str {
        &self.param
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

/// The attachments to send with `params`, in the order their list names
/// them: exactly the files that list names, each once. No attachments is
/// no files (the database listed none). `Err` (naming no value) when the
/// files do not share one key or are not exactly that key's list, so an
/// adapter neither drops an approved file nor sends one nobody approved.
pub fn in_params_order<'a>(
    params: &Value,
    attachments: &'a [Attachment],
) -> Result<Vec<&'a Attachment>, &'static str> {
    const NOT_THESE: &str = "the attachments given are not the ones the params name";
    let Some(first) = attachments.first() else {
        return Ok(Vec::new());
    };
    if attachments.iter().any(|a| a.param != first.param) {
        return Err(NOT_THESE);
    }
    let metas = listed_under(params, &first.param)?;
    if metas.len() != attachments.len() {
        return Err(NOT_THESE);
    }
    metas
        .iter()
        .map(|m| attachments.iter().find(|a| a.meta == *m).ok_or(NOT_THESE))
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
    fn test_only_a_non_empty_list_may_name_files() {
        let id = Uuid::new_v4();
        let one = json!([meta_json(id, b"x", "a.pdf")]);
        assert!(may_name_files(&json!({"to": "x", "files": one})));
        for none in [
            json!({"files": []}),
            json!({"tags": ["a"], "to": "x"}),
            json!({"files": [{"file_id": id.to_string()}]}),
            json!(["not", "an", "object"]),
        ] {
            assert!(!may_name_files(&none), "{none}");
        }
    }

    #[test]
    fn test_listed_under_reads_one_key_in_order() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let params = json!({
            "files": [meta_json(a, b"one", "1.pdf"), meta_json(b, b"two", "2.pdf")],
            "to": "x@example.com",
        });
        let ids: Vec<Uuid> = listed_under(&params, "files")
            .expect("reads")
            .iter()
            .map(|m| m.file_id)
            .collect();
        assert_eq!(ids, vec![a, b], "list order");
        assert!(listed_under(&params, "to").is_err(), "not a list");
        assert!(listed_under(&params, "absent").is_err());

        let mut scaled = meta_json(a, b"one", "1.pdf");
        scaled["size"] = json!(3.0);
        assert_eq!(
            listed_under(&json!({"f": [scaled]}), "f").expect("3.0")[0].size,
            3
        );
        let mut bad = meta_json(a, b"one", "1.pdf");
        bad["filename"] = json!(1);
        assert!(
            listed_under(&json!({"f": [bad]}), "f").is_err(),
            "refused, not skipped"
        );
        let twice = json!({"f": [meta_json(a, b"1", "x"), meta_json(a, b"1", "x")]});
        assert!(listed_under(&twice, "f").is_err());
    }

    #[test]
    fn test_only_matching_bytes_make_an_attachment() {
        let id = Uuid::new_v4();
        let params = json!({"files": [meta_json(id, b"%PDF-1.7", "a.pdf")]});
        let meta = listed_under(&params, "files").expect("reads").remove(0);
        let files = || "files".to_owned();
        assert_eq!(
            Attachment::verified(files(), meta.clone(), b"%PDF-1.8".to_vec()),
            Err(Mismatch { file_id: id })
        );
        assert!(Attachment::verified(files(), meta.clone(), b"%PDF-1.7 ".to_vec()).is_err());
        let ok = Attachment::verified(files(), meta, b"%PDF-1.7".to_vec()).expect("matches");
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
            in_params_order(&json!({"files": [meta_json(id, b"%PDF-1.7", "a.pdf"), meta_json(Uuid::new_v4(), b"2", "b.pdf")]}), std::slice::from_ref(&ok)).is_err(),
            "an approved file missing"
        );
        assert!(
            in_params_order(&json!({"files": []}), &[ok]).is_err(),
            "a file nobody approved"
        );
    }
}
