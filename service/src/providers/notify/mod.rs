//! Notifications (docs/notifications.md): keyturn's own effects, leased,
//! begun, journaled and recorded exactly like an external action's call
//! (`keyturn.lease` hands them out with the provider `notify.<channel>`),
//! and sent by the adapters here once `begin_dispatch` has committed.
//!
//! What a notification says is the database's: after the begin, the worker
//! asks `keyturn.notification_message` for its title, body and actions, and
//! a fresh one-time link code ([`Message`]); an adapter only renders that
//! for its channel and adds the card link, `KEYTURN_PUBLIC_URL/card#a=…&c=…`
//! ([`card_link`]).
//!
//! | provider | channel | sends |
//! |---|---|---|
//! | `notify.email` | email | through the smtp adapter's server: a text and an HTML part, the card link the only link ([`email`]) |
//! | `notify.webhook` | webhook | a Standard Webhooks POST whose body is also a Slack incoming-webhook message ([`webhook`]) |
//! | `notify.webpush` | webpush | RFC 8030 push, RFC 8291 aes128gcm, RFC 8292 VAPID ([`webpush`]) |
//!
//! **Never a credential in a message.** The link carries the action ids and
//! a one-time code, redeemed once for a short card session; no params, no
//! token, no JWT. The code is a [`Secret`]: it never reaches a log line,
//! and nothing here logs a message's text or its target.
//!
//! **Where it may go** ([`net`]): a webhook URL and a push endpoint are the
//! person's to set, so keyturnd resolves them itself, connects only to the
//! addresses it checked, and refuses any but public ones, loopback where
//! the URL names it (unless `KEYTURN_NOTIFY_LOOPBACK=false`), and those of
//! `KEYTURN_NOTIFY_ALLOW_NETWORKS`.

pub mod email;
pub mod net;
pub mod webhook;
pub mod webpush;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use uuid::Uuid;

use super::{BoxFuture, CallResult, Provider};
use crate::config::Secret;
use crate::db::LeasedJob;

/// A notification adapter: its provider name, and one attempt at sending a
/// message under the rules of [`Provider::call`]. Every notifier is a
/// [`Provider`] that [`notifies`](Provider::notifies).
pub trait Notifier: Send + Sync {
    /// `notify.<channel>`.
    fn name(&self) -> &'static str;

    /// Sends `message` once, ended by `by`.
    fn send<'a>(
        &'a self,
        job: &'a LeasedJob,
        message: &'a Message,
        by: Instant,
    ) -> BoxFuture<'a, CallResult>;
}

impl<N: Notifier> Provider for N {
    fn name(&self) -> &'static str {
        Notifier::name(self)
    }

    fn notifies(&self) -> bool {
        true
    }

    fn notify<'a>(
        &'a self,
        job: &'a LeasedJob,
        message: &'a Message,
        by: Instant,
    ) -> BoxFuture<'a, CallResult> {
        self.send(job, message, by)
    }
}

/// What every notification provider's name starts with; the rest is the
/// channel (`keyturn._notify_provider`).
pub const PREFIX: &str = "notify.";

/// One action a notification is about, as the database wrote it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Item {
    /// The action.
    pub action_id: Uuid,
    /// Its server-written summary (for a digest-retained action, the tool's
    /// name), at most 300 characters.
    pub summary: String,
    /// The tool.
    pub tool: String,
    /// What the tool does to the world: reversible, compensatable,
    /// irreversible.
    pub effect: String,
    /// When the action expires, ISO 8601 UTC.
    pub expires_at: String,
}

/// One row of `keyturn.notification_message`: what to send now.
#[derive(Clone)]
pub struct Message {
    /// False when nothing is to be sent after all ([`Message::reason`] says why).
    pub send: bool,
    /// Why nothing is to be sent.
    pub reason: Option<String>,
    /// email, webhook or webpush.
    pub channel: String,
    /// The address, URL or subscription JSON it goes to. Never logged.
    pub target: Option<Secret>,
    /// A webhook channel's own Standard Webhooks secret.
    pub secret: Option<Secret>,
    /// notice, reminder or digest.
    pub kind: String,
    /// One line, plain text.
    pub title: String,
    /// Plain text, the actions one paragraph each.
    pub body: String,
    /// The actions, for renderers that lay them out.
    pub actions: Vec<Item>,
    /// What the card link opens.
    pub link_action_ids: Vec<Uuid>,
    /// The one-time link code.
    pub code: Option<Secret>,
    /// When the code expires.
    pub code_expires_at: Option<DateTime<Utc>>,
    /// How many actions wait for the person (a digest may count more than
    /// it links).
    pub waiting: i32,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The text is the person's business and the code a credential:
        // only what says which notification this is.
        f.debug_struct("Message")
            .field("send", &self.send)
            .field("channel", &self.channel)
            .field("kind", &self.kind)
            .field("link_action_ids", &self.link_action_ids)
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}

impl Message {
    /// A message for tests: one action whose summary holds markup of
    /// Slack's and HTML's.
    #[cfg(test)]
    pub fn example() -> Message {
        Message {
            send: true,
            reason: None,
            channel: "webhook".into(),
            target: Some(Secret::from("http://127.0.0.1:9/h".to_owned())),
            secret: None,
            kind: "notice".into(),
            title: "Approval needed: Pay <@U123> 10 & <b>more</b>".into(),
            body: "Pay <@U123> 10 & <b>more</b>\nTool: pay · Effect: irreversible · Expires: 2026-12-05 00:48 UTC".into(),
            actions: vec![Item {
                action_id: Uuid::nil(),
                summary: "Pay <@U123> 10 & <b>more</b>".into(),
                tool: "pay".into(),
                effect: "irreversible".into(),
                expires_at: "2026-12-05T00:48:00.000000Z".into(),
            }],
            link_action_ids: vec![Uuid::nil()],
            code: Some(Secret::from("code".to_owned())),
            code_expires_at: None,
            waiting: 1,
        }
    }

    /// The card link of this message under `base`, or `None` when it has no
    /// code (nothing to send).
    pub fn link(&self, base: &url::Url) -> Option<Secret> {
        let code = self.code.as_ref()?;
        Some(Secret::from(
            card_link(base, &self.link_action_ids, code.expose()).to_string(),
        ))
    }
}

/// `<base>/card#a=<id>[&a=<id>…]&c=<code>`: everything in the fragment,
/// which no browser sends to a server. The code is percent-encoded beyond
/// RFC 3986's unreserved characters (a link code is base64url), so no code
/// can add a parameter of its own.
pub fn card_link(base: &url::Url, ids: &[Uuid], code: &str) -> url::Url {
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    let mut url = base.clone();
    url.set_path(&format!("{}/card", base.path().trim_end_matches('/')));
    url.set_query(None);
    let mut fragment: Vec<String> = ids.iter().map(|id| format!("a={id}")).collect();
    fragment.push(format!(
        "c={}",
        percent_encoding::utf8_percent_encode(code, ESCAPED)
    ));
    url.set_fragment(Some(&fragment.join("&")));
    url
}

/// Text that goes into a single-line field (a subject, a push title):
/// control characters (line breaks above all: a header must stay one
/// header) become spaces, runs of white space one, and at most `max`
/// characters are kept, the cut marked with an ellipsis.
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let words: Vec<&str> = flat.split_whitespace().collect();
    cut(&words.join(" "), max)
}

/// At most `max` characters of `text`, the cut marked with an ellipsis.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The line a message ends with, saying what the link is and is not.
pub fn link_note(message: &Message) -> String {
    let until = message
        .code_expires_at
        .map(|t| t.format(" and expires at %Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default();
    format!(
        "The link opens the card once{until}; it signs nothing in for you, and you decide on the card."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_card_link_carries_only_the_actions_and_the_code() {
        let base = url::Url::parse("https://keyturn.example.com/base/?x=1").unwrap();
        let a = Uuid::nil();
        let b = Uuid::from_u128(1);
        let link = card_link(&base, &[a, b], "abc-_1&a=x#y");
        assert_eq!(
            link.as_str(),
            "https://keyturn.example.com/base/card#a=00000000-0000-0000-0000-000000000000\
             &a=00000000-0000-0000-0000-000000000001&c=abc-_1%26a%3Dx%23y"
        );
        let root = url::Url::parse("http://127.0.0.1:8787").unwrap();
        assert_eq!(
            card_link(&root, &[a], "c0de").as_str(),
            "http://127.0.0.1:8787/card#a=00000000-0000-0000-0000-000000000000&c=c0de"
        );
    }

    #[test]
    fn test_one_line_keeps_a_header_one_line() {
        assert_eq!(
            one_line("Approve\r\nBcc: eve@evil.example\tnow", 100),
            "Approve Bcc: eve@evil.example now"
        );
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(cut("é".repeat(5).as_str(), 5), "ééééé");
    }

    #[test]
    fn test_a_message_never_prints_its_text_or_code() {
        let m = Message {
            send: true,
            reason: None,
            channel: "email".into(),
            target: Some(Secret::from("ann@acme.example".to_owned())),
            secret: None,
            kind: "notice".into(),
            title: "Approval needed: wire $10,000".into(),
            body: "wire $10,000".into(),
            actions: Vec::new(),
            link_action_ids: vec![Uuid::nil()],
            code: Some(Secret::from("the-one-time-code".to_owned())),
            code_expires_at: None,
            waiting: 1,
        };
        let dump = format!("{m:?}");
        for needle in ["the-one-time-code", "ann@acme", "10,000"] {
            assert!(!dump.contains(needle), "{needle} in {dump}");
        }
    }
}
