//! Files for the attachment tests: approved metadata, verified
//! [`Attachment`]s, bytes whose base64 is easy to search for, and MIME
//! messages read back the way a mail client reads them.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use keyturnd::providers::attachments::{self, Attachment};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Lowercase hex SHA-256, as `keyturn.stage_file` computes it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The params metadata of one file.
pub fn meta(file_id: Uuid, bytes: &[u8], filename: &str, content_type: &str) -> Value {
    json!({
        "file_id": file_id.to_string(),
        "sha256": sha256_hex(bytes),
        "filename": filename,
        "content_type": content_type,
        "size": bytes.len(),
    })
}

/// The verified attachment for `meta` (which must match `bytes`).
pub fn attachment(meta: &Value, bytes: &[u8]) -> Attachment {
    let meta = attachments::named_in(&json!({ "files": [meta] }))
        .expect("metadata reads")
        .remove(0);
    Attachment::verified(meta, bytes.to_vec()).expect("bytes match their metadata")
}

/// Bytes whose standard base64 is `canary` itself: a string that occurs
/// nowhere else, so any copy of the encoded file in a table or a log is
/// found by a plain substring search (also on one line of a MIME part,
/// whose lines are 76 characters: the canary's first 40 start the first).
pub struct Canary {
    pub bytes: Vec<u8>,
    pub base64: String,
}

impl Canary {
    pub fn new() -> Canary {
        let mut text = format!(
            "KeyturnCanary{}NeverLoggedNorStored",
            Uuid::new_v4().simple()
        );
        while text.len() % 4 != 0 {
            text.push('Q');
        }
        let bytes = STANDARD.decode(&text).expect("valid base64");
        assert_eq!(STANDARD.encode(&bytes), text, "decodes and encodes back");
        Canary {
            bytes,
            base64: text,
        }
    }

    /// What a leak would contain, shorter than one base64 line.
    pub fn needle(&self) -> &str {
        &self.base64[..40]
    }
}

/// One part of a parsed message.
#[derive(Debug)]
pub struct Part {
    pub content_type: String,
    pub disposition: mailparse::DispositionType,
    pub filename: Option<String>,
    pub body: Vec<u8>,
}

/// The leaf parts of a message as received, decoded (transfer encoding
/// undone), in order.
pub fn parts(data: &str) -> Vec<Part> {
    let parsed = mailparse::parse_mail(data.as_bytes()).expect("the message parses as MIME");
    let mut out = Vec::new();
    collect(&parsed, &mut out);
    out
}

fn collect(mail: &mailparse::ParsedMail<'_>, out: &mut Vec<Part>) {
    if !mail.subparts.is_empty() {
        for sub in &mail.subparts {
            collect(sub, out);
        }
        return;
    }
    let disposition = mail.get_content_disposition();
    out.push(Part {
        content_type: mail.ctype.mimetype.clone(),
        filename: disposition.params.get("filename").cloned(),
        disposition: disposition.disposition,
        body: mail.get_body_raw().expect("the part decodes"),
    });
}
