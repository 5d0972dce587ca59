//! `notify.email`: a notification as one email, through the smtp adapter's
//! server and transaction (`KEYTURN_SMTP_URL`, `KEYTURN_SMTP_FROM`; its
//! outcomes classified the same way).
//!
//! `multipart/alternative`: a plain-text part and an HTML part saying the
//! same, the card link the only link in either (the HTML escapes every
//! character of the database's text, so a summary can add no markup and no
//! link of its own). The subject is the title on one line: a line break in
//! a summary could otherwise start a header of its own. The recipient is
//! the channel's bare address, checked again; the Message-ID is
//! `<keyturn-notify-<id>@keyturn>`, the same on every attempt.

use std::sync::Arc;

use keyturn_core::email::is_bare_addr_spec;
use lettre::message::{Mailbox, MultiPart};
use lettre::{Address, Message as Mail};
use tokio::time::Instant;

use super::{link_note, one_line, Message, Notifier};
use crate::classify::Outcome;
use crate::db::LeasedJob;
use crate::providers::smtp::{message_id, subject, SmtpProvider};
use crate::providers::{not_sent, BoxFuture, CallResult};

/// The provider name.
pub const NAME: &str = "notify.email";

/// Longest subject, in characters.
const SUBJECT_MAX: usize = 200;

/// Sends notifications by email.
pub struct EmailNotifier {
    smtp: Arc<SmtpProvider>,
    public_url: url::Url,
}

impl EmailNotifier {
    /// Through `smtp`'s server, links under `public_url`.
    pub fn new(smtp: Arc<SmtpProvider>, public_url: url::Url) -> Self {
        EmailNotifier { smtp, public_url }
    }

    /// The email of a message: its envelope comes with it.
    pub fn build(&self, job: &LeasedJob, message: &Message) -> Result<Mail, &'static str> {
        let to = message
            .target
            .as_ref()
            .map(|t| t.expose())
            .filter(|t| is_bare_addr_spec(t))
            .ok_or("the channel's address is not a bare addr-spec")?;
        let to: Address = to.parse().map_err(|_| "the address does not parse")?;
        let link = message
            .link(&self.public_url)
            .ok_or("the message has no link")?;
        let note = link_note(message);
        let text = format!(
            "{}\n\n{}\n\nOpen the card: {}\n\n{}\n",
            message.title,
            message.body,
            link.expose(),
            note
        );
        let html = format!(
            "<!doctype html>\n<html><body>\n<p><strong>{}</strong></p>\n<p>{}</p>\n\
             <p><a href=\"{}\">Open the card</a></p>\n<p><small>{}</small></p>\n</body></html>\n",
            escape(&message.title),
            escape(&message.body).replace('\n', "<br>\n"),
            escape(link.expose()),
            escape(&note)
        );
        Mail::builder()
            .from(self.smtp.from_mailbox().clone())
            .to(Mailbox::new(None, to))
            .raw_header(subject(&one_line(&message.title, SUBJECT_MAX)))
            .message_id(Some(message_id(&job.idempotency_key)))
            .multipart(MultiPart::alternative_plain_html(text, html))
            .map_err(|_| "the message could not be built")
    }

    async fn deliver(&self, job: &LeasedJob, message: &Message, by: Instant) -> CallResult {
        let mail = match self.build(job, message) {
            Ok(mail) => mail,
            Err(why) => return not_sent(Outcome::Failed, why),
        };
        let id = message_id(&job.idempotency_key);
        self.smtp
            .send(mail.envelope(), &mail.formatted(), id, by)
            .await
    }
}

/// Text as HTML text: the five characters HTML gives meaning, escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

impl Notifier for EmailNotifier {
    fn name(&self) -> &'static str {
        NAME
    }

    fn send<'a>(
        &'a self,
        job: &'a LeasedJob,
        message: &'a Message,
        by: Instant,
    ) -> BoxFuture<'a, CallResult> {
        Box::pin(self.deliver(job, message, by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn notifier() -> EmailNotifier {
        let smtp = SmtpProvider::new(
            &Secret::from("smtp://127.0.0.1:2525".to_owned()),
            "keyturn <noreply@keyturn.example>",
        )
        .unwrap();
        EmailNotifier::new(
            Arc::new(smtp),
            url::Url::parse("https://keyturn.example.com").unwrap(),
        )
    }

    fn message() -> Message {
        let mut m = Message::example();
        m.channel = "email".into();
        m.target = Some(Secret::from("ann@acme.example".to_owned()));
        m
    }

    #[test]
    fn test_a_text_and_an_html_part_the_card_link_the_only_link() {
        let mail = notifier().build(&LeasedJob::example(), &message()).unwrap();
        let raw = String::from_utf8(mail.formatted()).unwrap();
        assert!(raw.contains("multipart/alternative"), "{raw}");
        assert!(raw.contains("text/plain") && raw.contains("text/html"));
        let parsed = mailparse::parse_mail(raw.as_bytes()).unwrap();
        let html = parsed.subparts[1].get_body().unwrap();
        assert_eq!(html.matches("<a ").count(), 1, "{html}");
        assert!(html.contains("href=\"https://keyturn.example.com/card#a=00000000-0000-0000-0000-000000000000&amp;c=code\""));
        // The summary's markup is text.
        assert!(html.contains("&lt;b&gt;more&lt;/b&gt;"), "{html}");
        assert!(!html.contains("<b>more"));
        let text = parsed.subparts[0].get_body().unwrap();
        assert!(text.contains("Open the card: https://keyturn.example.com/card#a="));
    }

    #[test]
    fn test_a_line_break_in_a_summary_adds_no_header() {
        let mut m = message();
        m.title = "Approval needed: hi\r\nBcc: eve@evil.example\r\nX-Evil: 1".into();
        let mail = notifier().build(&LeasedJob::example(), &m).unwrap();
        let raw = String::from_utf8(mail.formatted()).unwrap();
        let parsed = mailparse::parse_mail(raw.as_bytes()).unwrap();
        for h in &parsed.headers {
            let key = h.get_key().to_ascii_lowercase();
            assert!(key != "bcc" && key != "x-evil", "{raw}");
        }
        assert_eq!(mail.envelope().to().len(), 1);
        let subject = parsed
            .headers
            .iter()
            .find(|h| h.get_key().eq_ignore_ascii_case("subject"))
            .unwrap()
            .get_value();
        assert_eq!(
            subject,
            "Approval needed: hi Bcc: eve@evil.example X-Evil: 1"
        );
    }

    #[test]
    fn test_only_a_bare_address_receives() {
        let mut m = message();
        m.target = Some(Secret::from(
            "Ann <ann@acme.example>, eve@evil.example".to_owned(),
        ));
        assert!(notifier().build(&LeasedJob::example(), &m).is_err());
    }
}
