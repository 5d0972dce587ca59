//! `notify.webhook`: a notification as one signed POST to the person's
//! webhook URL, a body that is two things at once:
//!
//! * a [Standard Webhooks] event: `type` (`keyturn.notification`),
//!   `timestamp` and `data` (the notification's id and kind, the actions,
//!   the card link), signed with the `webhook-id`, `webhook-timestamp` and
//!   `webhook-signature` headers, so a receiver verifies it with that
//!   project's libraries;
//! * a Slack incoming-webhook message: `text` (the fallback a notification
//!   shows, mrkdwn to Slack, so `&`, `<` and `>` are escaped: no mention or
//!   link of a summary's own) and `blocks`: a section with the message in
//!   `plain_text` (never read as markup) and an actions block whose one
//!   button, "Open the card", is the card link. Slack ignores the fields it does not know, so a person
//!   pastes a Slack (or a Teams or other workflow) webhook URL as it is.
//!
//! The key: the channel's own `whsec_` secret, else
//! `KEYTURN_NOTIFY_WEBHOOK_SECRET`; with neither, nothing is sent (`failed`).
//! The id is the notification's idempotency key, the same on every
//! attempt. The request goes through [`super::net`].
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::net::Networks;
use super::{cut, link_note, Message, Notifier};
use crate::classify::Outcome;
use crate::config::webhook_key;
use crate::db::LeasedJob;
use crate::providers::webhook::standard_signature;
use crate::providers::{not_sent, BoxFuture, CallResult};

/// The provider name.
pub const NAME: &str = "notify.webhook";

/// The `type` of every notification event.
pub const EVENT_TYPE: &str = "keyturn.notification";

/// Slack's limit on a section's text.
const SECTION_MAX: usize = 3000;

/// Sends notifications to webhook URLs.
pub struct WebhookNotifier {
    public_url: url::Url,
    /// The key of `KEYTURN_NOTIFY_WEBHOOK_SECRET`, for channels without one.
    default_key: Option<Vec<u8>>,
    networks: Networks,
}

impl WebhookNotifier {
    /// Links under `public_url`, signed with the channel's secret or
    /// `default_key`, sent only where `networks` admits.
    pub fn new(public_url: url::Url, default_key: Option<Vec<u8>>, networks: Networks) -> Self {
        WebhookNotifier {
            public_url,
            default_key,
            networks,
        }
    }

    async fn deliver(&self, job: &LeasedJob, message: &Message, by: Instant) -> CallResult {
        let (Some(target), Some(link)) = (&message.target, message.link(&self.public_url)) else {
            return not_sent(Outcome::Failed, "the message has no target or link");
        };
        let Ok(url) = url::Url::parse(target.expose()) else {
            return not_sent(Outcome::Failed, "the target is not a URL");
        };
        let key = match &message.secret {
            Some(own) => webhook_key(own.expose()).ok(),
            None => self.default_key.clone(),
        };
        let Some(key) = key else {
            tracing::error!("a webhook notification has no secret to sign with (the channel's own, or KEYTURN_NOTIFY_WEBHOOK_SECRET); failed, nothing sent");
            return not_sent(
                Outcome::Failed,
                "no secret to sign with: set the channel's secret or KEYTURN_NOTIFY_WEBHOOK_SECRET",
            );
        };
        let now = SystemTime::now();
        let timestamp = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let body = body(job, message, link.expose(), DateTime::<Utc>::from(now)).to_string();
        let signature = standard_signature(&key, &job.idempotency_key, timestamp, body.as_bytes());
        let mut headers = HeaderMap::new();
        let (Ok(id), Ok(signature)) = (
            HeaderValue::from_str(&job.idempotency_key),
            HeaderValue::from_str(&signature),
        ) else {
            return not_sent(Outcome::Failed, "the idempotency key is not a header value");
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("idempotency-key", id.clone());
        headers.insert("webhook-id", id);
        headers.insert("webhook-timestamp", HeaderValue::from(timestamp));
        headers.insert("webhook-signature", signature);
        self.networks
            .post(&url, headers, body.into_bytes(), by)
            .await
    }
}

/// The body: a Standard Webhooks event and a Slack message in one object.
pub fn body(job: &LeasedJob, message: &Message, link: &str, now: DateTime<Utc>) -> Value {
    let text = cut(
        &format!("{}\n\n{}", message.title, message.body),
        SECTION_MAX,
    );
    json!({
        "type": EVENT_TYPE,
        "timestamp": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "data": {
            "notification_id": job.action_id,
            "kind": message.kind,
            "waiting": message.waiting,
            "actions": message.actions,
            "link": link,
            "link_expires_at": message.code_expires_at,
            // The message as plain text, for a receiver that is not Slack:
            // `text` is escaped for Slack's mrkdwn only, and a workflow that
            // renders Markdown (Teams) would read `[x](url)` in it as a link.
            "text": text,
        },
        "text": slack_text(&cut(&message.title, SECTION_MAX)),
        "blocks": [
            {"type": "section", "text": {"type": "plain_text", "text": text, "emoji": false}},
            {"type": "actions", "elements": [{
                "type": "button",
                "action_id": "open_card",
                "style": "primary",
                "text": {"type": "plain_text", "text": "Open the card"},
                "url": link,
            }]},
            {"type": "context", "elements": [{"type": "plain_text", "text": link_note(message)}]},
        ],
        "unfurl_links": false,
        "unfurl_media": false,
    })
}

/// Text for a field Slack reads as mrkdwn (the fallback `text`): its three
/// control characters escaped as Slack asks, so nothing in a summary is a
/// mention (`<!channel>`), a link (`<url|text>`) or a user reference.
fn slack_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Notifier for WebhookNotifier {
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

    #[test]
    fn test_slack_control_sequences_in_a_summary_stay_text() {
        // An agent's param in a summary: Slack reads the fallback `text` as
        // mrkdwn, where <!channel> notifies everyone in the channel and
        // <http://…|…> is a link of the agent's own.
        let mut m = Message::example();
        m.title = "Approval needed: <!channel> see <https://evil.example|the card> & pay".into();
        let b = body(
            &LeasedJob::example(),
            &m,
            "https://k.example/card#a=x&c=y",
            Utc::now(),
        );
        let text = b["text"].as_str().unwrap();
        assert!(!text.contains('<') && !text.contains('>'), "{text}");
        assert!(text.contains("&lt;!channel&gt;"), "{text}");
        assert!(text.contains("&amp; pay"), "{text}");
    }

    #[test]
    fn test_the_body_is_a_slack_message_with_one_button_to_the_card() {
        let job = LeasedJob::example();
        let b = body(
            &job,
            &Message::example(),
            "https://k.example/card#a=x&c=y",
            Utc::now(),
        );
        assert_eq!(b["type"], EVENT_TYPE);
        assert!(b["text"].is_string());
        let blocks = b["blocks"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "section");
        // plain_text: Slack reads nothing in a summary as markup.
        assert_eq!(blocks[0]["text"]["type"], "plain_text");
        assert!(blocks[0]["text"]["text"]
            .as_str()
            .unwrap()
            .contains("<@U123>"));
        let buttons = blocks[1]["elements"].as_array().unwrap();
        assert_eq!(buttons.len(), 1);
        assert_eq!(buttons[0]["url"], "https://k.example/card#a=x&c=y");
        assert_eq!(b["data"]["link"], "https://k.example/card#a=x&c=y");
        // The same message, plain, for a receiver that is not Slack.
        assert_eq!(b["data"]["text"], blocks[0]["text"]["text"]);
        // The link appears as the button and in data, nowhere else.
        let text = b.to_string();
        assert_eq!(text.matches("https://k.example/card").count(), 2);
    }
}
