//! The `smtp` adapter: one SMTP transaction per attempt, via `lettre`.
//!
//! **Params** (checked again here; the tool's schema checked them at
//! propose time):
//!
//! ```json
//! {"to": "a@example.com" | ["a@…", …], "subject": "…", "body": "…",
//!  "cc"?: "…" | […], "bcc"?: "…" | […], "reply_to"?: "…",
//!  "<attachments_param>"?: [{"file_id", "sha256", "filename", "content_type", "size"}, …]}
//! ```
//!
//! Any other key makes the attempt `failed` before connecting: silently
//! dropping a field the approver saw would send a different email than the
//! one approved. So does an address that is not a bare addr-spec
//! ([`keyturn_core::email::is_bare_addr_spec`], the rule `format: email`
//! applied at propose time): no display name, quoted local part, comment or
//! IP literal ever reaches the server, so the address the person read is
//! the one mail goes to. `bcc` recipients are in the envelope only, never in
//! a header.
//!
//! **Attachments.** The files the params name (see
//! [`super::attachments`]; the key is recognized by shape) are sent as
//! `multipart/mixed`: the text body as its first part, exactly as without
//! files, then one base64 part per file, in the params' order, with
//! `Content-Disposition: attachment` and the approved filename and content
//! type. The files must be exactly those the params name, with bytes that
//! match their approved size and SHA-256, or the attempt is `failed` before
//! connecting. The message is built in memory and dropped after the call.
//!
//! **Message-ID.** `<{idempotency_key}@keyturn>`, identical on every attempt,
//! so a receiving system can deduplicate. A key that is not a valid RFC 5322
//! dot-atom is hex-encoded (`<x{hex}@keyturn>`), still stable per action.
//!
//! **Why the low-level connection API.** `lettre`'s `AsyncSmtpTransport`
//! reports an error without saying how far the transaction got, and the
//! outcome depends on exactly that (see the SMTP table in
//! [`crate::classify`]). So each stage — connect (TCP/TLS/greeting/EHLO/
//! STARTTLS/AUTH), envelope (`MAIL`, `RCPT`, `DATA`), message (content and
//! the final reply) — runs on its own, under the one call deadline, with
//! `lettre` still speaking the protocol.
//!
//! **URL.** As `lettre`'s `from_url`: `smtp://host[:25]` plain,
//! `smtp://host[:587]?tls=required` (STARTTLS or fail),
//! `?tls=opportunistic` (STARTTLS when offered), `smtps://host[:465]`
//! (implicit TLS); `user:pass@` (percent-encoded) for AUTH PLAIN/LOGIN; a
//! path segment names the EHLO domain.
//!
//! **Receipt.** `{"smtp_code": <final reply code or null>,
//! "provider_message_id": <Message-ID>}`, plus `"stage"` on failure.

use std::borrow::Cow;
use std::time::Duration;

use keyturn_core::email::is_bare_addr_spec;
use lettre::address::Envelope;
use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Attachment as MimeAttachment, Body, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::Address;
use lettre::Message;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::attachments::{self, Attachment};
use super::{lapsed, BoxFuture, CallResult, Provider};
use crate::classify::{self, Outcome, SmtpFailure, SmtpStage};
use crate::config::Secret;
use crate::db::LeasedJob;
use crate::error::Error;

/// The provider name tools use.
pub const NAME: &str = "smtp";

/// Longest TCP connect: a server slower than this is unreachable (`retry`).
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a polite `QUIT` may take once the outcome is known.
const QUIT_TIMEOUT: Duration = Duration::from_secs(1);

/// The keys an email action may carry, besides its attachment list.
const KNOWN_KEYS: [&str; 6] = ["to", "subject", "body", "cc", "bcc", "reply_to"];

#[derive(Clone, Debug, PartialEq, Eq)]
enum Security {
    Plain,
    StartTls { required: bool },
    Implicit,
}

/// Where and how to connect.
#[derive(Clone)]
struct Endpoint {
    host: String,
    port: u16,
    security: Security,
    tls: Option<TlsParameters>,
    credentials: Option<Credentials>,
    hello: ClientId,
}

impl Endpoint {
    fn parse(raw: &str) -> Result<Self, Error> {
        let bad = |why: String| Error::Config(format!("KEYTURN_SMTP_URL: {why}"));
        let url = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
        let host = url
            .host_str()
            .ok_or_else(|| bad("no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls_param = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        let (security, default_port) = match (url.scheme(), tls_param.as_deref()) {
            ("smtp", None) => (Security::Plain, 25),
            ("smtp", Some("required")) => (Security::StartTls { required: true }, 587),
            ("smtp", Some("opportunistic")) => (Security::StartTls { required: false }, 587),
            ("smtps", None) => (Security::Implicit, 465),
            (scheme, tls) => {
                return Err(bad(format!(
                    "unsupported scheme `{scheme}` with tls={tls:?} (use smtp://, smtp://…?tls=required|opportunistic, or smtps://)"
                )))
            }
        };
        let tls = match security {
            Security::Plain => None,
            _ => Some(TlsParameters::new(host.clone()).map_err(|e| bad(e.to_string()))?),
        };
        let decode = |s: &str| -> Result<String, Error> {
            percent_decode(s)
                .ok_or_else(|| bad("credentials are not valid percent-encoded UTF-8".into()))
        };
        let credentials = match url.password() {
            Some(password) => Some(Credentials::new(decode(url.username())?, decode(password)?)),
            None => None,
        };
        let hello = match url.path().trim_matches('/') {
            "" => ClientId::default(),
            name => ClientId::Domain(name.to_owned()),
        };
        Ok(Endpoint {
            host,
            port: url.port().unwrap_or(default_port),
            security,
            tls,
            credentials,
            hello,
        })
    }
}

/// URL userinfo stays percent-encoded in `url::Url`; decode it as lettre does.
fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(Cow::into_owned)
}

/// The parsed params of one email action.
#[derive(Debug, PartialEq)]
pub struct Email {
    /// `To:` recipients.
    pub to: Vec<String>,
    /// `Cc:` recipients.
    pub cc: Vec<String>,
    /// Envelope-only recipients.
    pub bcc: Vec<String>,
    /// `Reply-To:`.
    pub reply_to: Option<String>,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub body: String,
}

impl Email {
    /// Reads the params, refusing anything this adapter would not send
    /// faithfully. `files_key` is the key that lists the attachments being
    /// sent, if any; an empty list names nothing, so it may stand under any
    /// key (the database lists no files, so no key, for it). Error messages
    /// name keys, never values.
    pub fn from_params(params: &Value, files_key: Option<&str>) -> Result<Self, &'static str> {
        let obj = params.as_object().ok_or("params must be an object")?;
        if obj.iter().any(|(k, v)| {
            !KNOWN_KEYS.contains(&k.as_str())
                && Some(k.as_str()) != files_key
                && v.as_array().is_none_or(|a| !a.is_empty())
        }) {
            return Err("params has a key the smtp adapter does not send");
        }
        let bare = |s: &str| -> Result<String, &'static str> {
            if is_bare_addr_spec(s) {
                Ok(s.to_owned())
            } else {
                Err("an address is not a bare addr-spec (no display name, quoting, comment or IP literal)")
            }
        };
        let addresses = |key: &str| -> Result<Vec<String>, &'static str> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::String(s)) => Ok(vec![bare(s)?]),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| v.as_str().ok_or("addresses must be strings").and_then(bare))
                    .collect(),
                Some(_) => Err("addresses must be a string or an array of strings"),
            }
        };
        let text = |key: &str| -> Result<String, &'static str> {
            obj.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or("params.subject and params.body must be strings")
        };
        let to = addresses("to")?;
        if to.is_empty() {
            return Err("params.to is missing or empty");
        }
        let reply_to = match obj.get("reply_to") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(bare(s)?),
            Some(_) => return Err("params.reply_to must be a string"),
        };
        Ok(Email {
            to,
            cc: addresses("cc")?,
            bcc: addresses("bcc")?,
            reply_to,
            subject: text("subject")?,
            body: text("body")?,
        })
    }
}

/// The `Subject` header of `text`. lettre leaves an ASCII word as it is, so
/// a subject holding an RFC 2047 encoded word (`=?utf-8?b?…?=`) would be
/// decoded by the recipient's mail client into text the person who approved
/// it never saw: such a subject is encoded whole, and the client decodes it
/// back to exactly `text` (seventh red-team pass, docs/security.md row 91).
pub fn subject(text: &str) -> lettre::message::header::HeaderValue {
    use lettre::message::header::{HeaderName, HeaderValue};
    let name = HeaderName::new_from_ascii_str("Subject");
    if !text.contains("=?") {
        return HeaderValue::new(name, text.to_owned());
    }
    let mut encoded = String::new();
    {
        let mut w = email_encoding::headers::writer::EmailWriter::new(
            &mut encoded,
            "Subject: ".len(),
            0,
            false,
        );
        // Writing to a String does not fail.
        let _ = email_encoding::headers::rfc2047::encode(text, &mut w);
    }
    // Only ASCII, folded by the encoder: what lettre's own values are.
    HeaderValue::dangerous_new_pre_encoded(name, text.to_owned(), encoded)
}

/// `<{key}@keyturn>`, or `<x{hex(key)}@keyturn>` when the key is not a
/// valid dot-atom.
pub fn message_id(idempotency_key: &str) -> String {
    let atext = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c);
    let dot_atom = !idempotency_key.is_empty()
        && idempotency_key
            .split('.')
            .all(|part| !part.is_empty() && part.chars().all(atext));
    if dot_atom {
        format!("<{idempotency_key}@keyturn>")
    } else {
        format!("<x{}@keyturn>", hex::encode(idempotency_key.as_bytes()))
    }
}

/// Sends each job as one email through one configured server.
pub struct SmtpProvider {
    endpoint: Endpoint,
    from: Mailbox,
}

/// A failed stage, ready to classify.
struct StageError {
    stage: SmtpStage,
    failure: SmtpFailure,
}

impl SmtpProvider {
    /// Builds the adapter from `KEYTURN_SMTP_URL` and `KEYTURN_SMTP_FROM`.
    pub fn new(url: &Secret, from: &str) -> Result<Self, Error> {
        let endpoint = Endpoint::parse(url.expose())?;
        let from = from
            .parse::<Mailbox>()
            .map_err(|e| Error::Config(format!("KEYTURN_SMTP_FROM is not a mailbox: {e}")))?;
        Ok(SmtpProvider { endpoint, from })
    }

    /// The envelope, the message bytes and the Message-ID of a job, or why
    /// it must not be sent (naming no value).
    fn build(
        &self,
        job: &LeasedJob,
        attachments: &[Attachment],
    ) -> Result<(Envelope, Vec<u8>, String), &'static str> {
        let email = Email::from_params(&job.params, attachments.first().map(Attachment::param))?;
        let files = attachments::in_params_order(&job.params, attachments)?;
        // Already a bare addr-spec: parsed as an address, never as a
        // mailbox that could carry a display name.
        let parse = |s: &String| {
            s.parse::<Address>()
                .map(|a| Mailbox::new(None, a))
                .map_err(|_| "an address does not parse")
        };
        let id = message_id(&job.idempotency_key);
        let mut builder = Message::builder()
            .from(self.from.clone())
            .raw_header(subject(&email.subject))
            .message_id(Some(id.clone()));
        for to in &email.to {
            builder = builder.to(parse(to)?);
        }
        for cc in &email.cc {
            builder = builder.cc(parse(cc)?);
        }
        for bcc in &email.bcc {
            builder = builder.bcc(parse(bcc)?);
        }
        if let Some(reply_to) = &email.reply_to {
            builder = builder.reply_to(parse(reply_to)?);
        }
        let built = if files.is_empty() {
            builder.header(ContentType::TEXT_PLAIN).body(email.body)
        } else {
            let text = SinglePart::builder()
                .header(ContentType::TEXT_PLAIN)
                .body(email.body);
            let mut mixed = MultiPart::mixed().singlepart(text);
            for file in files {
                let meta = file.meta();
                let content_type = ContentType::parse(&meta.content_type)
                    .map_err(|_| "an attachment's content type does not parse")?;
                // Base64 whatever the bytes: the other encodings may rewrite
                // line endings, and a file must arrive byte for byte.
                let body =
                    Body::new_with_encoding(file.bytes().to_vec(), ContentTransferEncoding::Base64)
                        .map_err(|_| "an attachment could not be encoded")?;
                mixed = mixed.singlepart(
                    MimeAttachment::new(meta.filename.clone()).body(body, content_type),
                );
            }
            builder.multipart(mixed)
        };
        let message = built.map_err(|_| "the message could not be built")?;
        Ok((message.envelope().clone(), message.formatted(), id))
    }

    async fn attempt(
        &self,
        job: &LeasedJob,
        attachments: &[Attachment],
        deadline: Instant,
    ) -> CallResult {
        // Before the connection: past `deadline` the lease has no margin
        // left (checked again before DATA).
        if Instant::now() >= deadline {
            return lapsed();
        }
        let (envelope, bytes, id) = match self.build(job, attachments) {
            Ok(built) => built,
            Err(why) => {
                return CallResult {
                    outcome: Outcome::Failed,
                    receipt: json!({ "error": why, "stage": "params" }),
                }
            }
        };
        self.send(&envelope, &bytes, id, deadline).await
    }

    /// The sender mailbox (`KEYTURN_SMTP_FROM`).
    pub fn from_mailbox(&self) -> &Mailbox {
        &self.from
    }

    /// Sends a built message in one transaction, classified stage by stage
    /// (the module's docs): the part of an attempt after its message is
    /// built, which the notification adapter shares (`notify.email`).
    pub async fn send(
        &self,
        envelope: &Envelope,
        bytes: &[u8],
        id: String,
        deadline: Instant,
    ) -> CallResult {
        if Instant::now() >= deadline {
            return lapsed();
        }
        match self.transaction(envelope, bytes, deadline).await {
            Err(StageError {
                failure: SmtpFailure::Lapsed,
                ..
            }) => lapsed(),
            Ok(code) => {
                tracing::info!(smtp_code = code, "smtp accepted the message");
                CallResult {
                    outcome: Outcome::Succeeded,
                    receipt: json!({ "smtp_code": code, "provider_message_id": id }),
                }
            }
            Err(StageError { stage, failure }) => {
                let outcome = classify::smtp_failure(stage, failure);
                let code = match failure {
                    SmtpFailure::Reply(code) => Some(code),
                    _ => None,
                };
                let stage_word = match stage {
                    SmtpStage::Connect => "connect",
                    SmtpStage::Envelope => "envelope",
                    SmtpStage::Message => "message",
                };
                tracing::warn!(
                    stage = stage_word,
                    ?failure,
                    outcome = outcome.word(),
                    "smtp transaction failed"
                );
                CallResult {
                    outcome,
                    receipt: json!({ "smtp_code": code, "provider_message_id": id, "stage": stage_word }),
                }
            }
        }
    }

    /// Runs the transaction stage by stage; returns the final reply code.
    async fn transaction(
        &self,
        envelope: &Envelope,
        bytes: &[u8],
        deadline: Instant,
    ) -> Result<u16, StageError> {
        use SmtpStage::*;
        let ep = &self.endpoint;
        let connect_timeout =
            MAX_CONNECT_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
        let implicit_tls = match ep.security {
            Security::Implicit => ep.tls.clone(),
            _ => None,
        };
        let mut conn = within(
            Connect,
            deadline,
            AsyncSmtpConnection::connect_tokio1(
                (ep.host.as_str(), ep.port),
                Some(connect_timeout),
                &ep.hello,
                implicit_tls,
                None,
            ),
        )
        .await?;

        if let (Security::StartTls { required }, Some(tls)) = (&ep.security, &ep.tls) {
            if conn.can_starttls() {
                within(Connect, deadline, conn.starttls(tls.clone(), &ep.hello)).await?;
            } else if *required {
                return Err(refused(Connect));
            }
        }
        if let Some(credentials) = &ep.credentials {
            within(
                Connect,
                deadline,
                conn.auth(DEFAULT_MECHANISMS, credentials),
            )
            .await?;
        }

        let mut mail_params = Vec::new();
        let non_ascii_address = envelope
            .to()
            .iter()
            .chain(envelope.from())
            .any(|a| !AsRef::<str>::as_ref(a).is_ascii());
        if non_ascii_address {
            if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
                return Err(refused(Envelope));
            }
            mail_params.push(MailParameter::SmtpUtfEight);
        }
        if !bytes.is_ascii() {
            if !conn.server_info().supports_feature(Extension::EightBitMime) {
                return Err(refused(Envelope));
            }
            mail_params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        within(
            Envelope,
            deadline,
            conn.command(Mail::new(envelope.from().cloned(), mail_params)),
        )
        .await?;
        for rcpt in envelope.to() {
            within(
                Envelope,
                deadline,
                conn.command(Rcpt::new(rcpt.clone(), Vec::new())),
            )
            .await?;
        }
        // The last check before the message may reach the server: a
        // transaction abandoned here sent nothing of it.
        if Instant::now() >= deadline {
            let _ = tokio::time::timeout(QUIT_TIMEOUT, conn.quit()).await;
            return Err(StageError {
                stage: Envelope,
                failure: SmtpFailure::Lapsed,
            });
        }
        within(Envelope, deadline, conn.command(Data)).await?;

        // From here the server may have the message: failures are unknown.
        let reply = within(Message, deadline, conn.message(bytes)).await?;
        let code = u16::from(reply.code());
        // The outcome is known; QUIT is courtesy and may fail harmlessly.
        let _ = tokio::time::timeout(QUIT_TIMEOUT, conn.quit()).await;
        Ok(code)
    }
}

fn refused(stage: SmtpStage) -> StageError {
    StageError {
        stage,
        failure: SmtpFailure::Refused,
    }
}

/// Runs one stage under the call deadline and names its failure.
async fn within<T>(
    stage: SmtpStage,
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, StageError> {
    let failure = match tokio::time::timeout_at(deadline, fut).await {
        Ok(Ok(value)) => return Ok(value),
        Err(_elapsed) => SmtpFailure::Timeout,
        Ok(Err(e)) => match e.status() {
            Some(code) => SmtpFailure::Reply(u16::from(code)),
            None if e.is_timeout() => SmtpFailure::Timeout,
            // A client-side refusal (no common AUTH mechanism, STARTTLS not
            // offered) happens before anything of the message was sent.
            None if e.is_client() => SmtpFailure::Refused,
            None => SmtpFailure::Network,
        },
    };
    Err(StageError { stage, failure })
}

impl Provider for SmtpProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn takes_attachments(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        job: &'a LeasedJob,
        attachments: &'a [Attachment],
        by: Instant,
    ) -> BoxFuture<'a, CallResult> {
        Box::pin(self.attempt(job, attachments, by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Subject:` header of a message with `text` as its subject, as a
    /// mail client decodes it: each RFC 2047 `=?utf-8?b?…?=` word decoded,
    /// the others kept, unfolded.
    fn subject_as_read(text: &str) -> (String, String) {
        use base64::Engine;
        let message = Message::builder()
            .from("k@example.com".parse().unwrap())
            .to("a@example.com".parse().unwrap())
            .raw_header(subject(text))
            .body(String::from("b"))
            .unwrap();
        let raw = String::from_utf8(message.formatted()).unwrap();
        let header = raw
            .split("\r\n")
            .skip_while(|l| !l.starts_with("Subject: "))
            .take_while(|l| l.starts_with("Subject: ") || l.starts_with(' '))
            .map(|l| l.trim_start_matches("Subject: ").trim_start())
            .collect::<Vec<_>>()
            .join(" ");
        let mut bytes = Vec::new();
        for word in header.split(' ') {
            match word
                .strip_prefix("=?utf-8?b?")
                .and_then(|w| w.strip_suffix("?="))
            {
                Some(b64) => bytes.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .unwrap(),
                ),
                None => {
                    if !bytes.is_empty() {
                        bytes.push(b' ');
                    }
                    bytes.extend(word.as_bytes());
                }
            }
        }
        (header, String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn test_a_subject_that_reads_as_an_encoded_word_reads_as_written() {
        // Seventh red-team pass (docs/security.md, row 91): lettre left the
        // ASCII word as it was, and the recipient's client decoded it into
        // "— URGENT: new bank details, pay to IBAN GB00 EVIL 0000 0000".
        let forged = "Your renewal quote =?utf-8?b?4oCUIFVSR0VOVDogbmV3IGJhbmsgZGV0YWlscw==?=";
        let (header, read) = subject_as_read(forged);
        assert_eq!(read, forged, "{header}");
        assert!(header.starts_with("=?utf-8?b?"), "{header}");
        // A plain subject stays as lettre writes it.
        let (header, read) = subject_as_read("Q3 numbers");
        assert_eq!(
            (header.as_str(), read.as_str()),
            ("Q3 numbers", "Q3 numbers")
        );
    }

    #[test]
    fn test_url_forms() {
        let ep = Endpoint::parse("smtp://127.0.0.1:2525").expect("plain");
        assert_eq!(
            (ep.host.as_str(), ep.port, &ep.security),
            ("127.0.0.1", 2525, &Security::Plain)
        );
        assert!(ep.credentials.is_none());
        let ep = Endpoint::parse("smtp://mail.example.com?tls=required").expect("starttls");
        assert_eq!(
            (ep.port, &ep.security),
            (587, &Security::StartTls { required: true })
        );
        let ep =
            Endpoint::parse("smtp://u%40x:p%2Fw@mail.example.com?tls=opportunistic").expect("auth");
        assert_eq!(ep.security, Security::StartTls { required: false });
        assert!(ep.credentials.is_some());
        let ep = Endpoint::parse("smtps://mail.example.com").expect("implicit");
        assert_eq!((ep.port, &ep.security), (465, &Security::Implicit));
        assert!(Endpoint::parse("http://mail.example.com").is_err());
        assert!(Endpoint::parse("smtp://mail.example.com?tls=maybe").is_err());
    }

    #[test]
    fn test_percent_decode() {
        assert_eq!(percent_decode("u%40x").as_deref(), Some("u@x"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("p%2Fw").as_deref(), Some("p/w"));
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn test_params_shapes() {
        let e = Email::from_params(&json!({"to": "a@b.c", "subject": "s", "body": "b"}), None)
            .expect("single");
        assert_eq!(e.to, vec!["a@b.c"]);
        let e = Email::from_params(&json!({"to": ["a@b.c", "d@e.f"], "cc": "g@h.i", "bcc": ["x@y.z"], "reply_to": "r@s.t", "subject": "s", "body": "b"}), None)
            .expect("full");
        assert_eq!(
            (e.to.len(), e.cc.len(), e.bcc.len(), e.reply_to.as_deref()),
            (2, 1, 1, Some("r@s.t"))
        );
        let with_files = json!({"to": "a@b.c", "subject": "s", "body": "b", "files": [{
            "file_id": "0190d6a8-0000-7000-8000-000000000001", "sha256": "00", "filename": "a.pdf",
            "content_type": "application/pdf", "size": 1}]});
        assert!(
            Email::from_params(&with_files, Some("files")).is_ok(),
            "an attachment list"
        );
        for bad in [
            json!({"subject": "s", "body": "b"}),
            json!({"to": [], "subject": "s", "body": "b"}),
            json!({"to": "a@b.c", "body": "b"}),
            json!({"to": "a@b.c", "subject": "s", "body": "b", "note": "x"}),
            json!({"to": "a@b.c", "subject": "s", "body": "b", "files": [{"file_id": "1"}]}),
            json!({"to": "a@b.c", "subject": "s", "body": "b", "other": [{"file_id": "1"}]}),
            json!({"to": [1], "subject": "s", "body": "b"}),
            json!("a string"),
        ] {
            assert!(Email::from_params(&bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn test_only_bare_addresses_are_sent() {
        for addr in [
            "\"Ann\" <ann@acme.com>",
            "Ann <ann@acme.com>",
            "\"ann smith\"@acme.com",
            "ann@[192.0.2.1]",
            "ann@acme.com (Ann)",
            "ann@localhost",
        ] {
            for key in ["to", "cc", "bcc", "reply_to"] {
                let mut params = json!({"to": "ok@example.com", "subject": "s", "body": "b"});
                params[key] = json!(addr);
                assert!(Email::from_params(&params, None).is_err(), "{key}: {addr}");
                if key != "reply_to" {
                    params[key] = json!(["ok2@example.com", addr]);
                    assert!(
                        Email::from_params(&params, None).is_err(),
                        "{key}: [{addr}]"
                    );
                }
            }
        }
    }

    #[test]
    fn test_message_id_carries_the_key() {
        assert_eq!(message_id("ik_0123-abc"), "<ik_0123-abc@keyturn>");
        assert_eq!(message_id("a.b"), "<a.b@keyturn>");
        assert_eq!(message_id("a b"), "<x612062@keyturn>");
        assert_eq!(
            message_id("a..b"),
            format!("<x{}@keyturn>", hex::encode("a..b"))
        );
    }
}
