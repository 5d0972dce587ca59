//! `notify.webpush`: a notification as one Web Push message (RFC 8030) to
//! the subscription the person's browser gave (`keyturn.set_notify('webpush',
//! <PushSubscription JSON>)`), built with the `web-push` crate: the payload
//! encrypted to the subscription's keys (RFC 8291, `aes128gcm`), the request
//! authorized with keyturnd's VAPID key (RFC 8292, `KEYTURN_VAPID_PRIVATE_KEY`;
//! `sub` is `KEYTURN_VAPID_SUBJECT`, else `KEYTURN_PUBLIC_URL`), and sent
//! through [`super::net`] like a webhook.
//!
//! The payload is JSON the card's service worker (`/card/sw.js`) shows:
//! `{"title", "body", "url", "tag"}`, `url` the card link, `tag` the
//! notification's id. Only the browser can read it: the push service sees
//! an encrypted record. Headers: `TTL` until the link code expires (at most
//! a day), `Urgency: high`, and `Topic` the notification's id, so a push
//! service still holding an earlier attempt of it replaces it rather than
//! delivering both. A 404 or 410 (the subscription is gone) is `failed`.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::json;
use tokio::time::Instant;
use web_push::{ContentEncoding, SubscriptionInfo, Urgency, WebPushMessageBuilder};

use super::net::Networks;
use super::{cut, one_line, Message, Notifier};
use crate::classify::Outcome;
use crate::config::VapidKey;
use crate::db::LeasedJob;
use crate::providers::{not_sent, BoxFuture, CallResult};

/// The provider name.
pub const NAME: &str = "notify.webpush";

/// The longest a push service keeps an undelivered message: the link is
/// worth no more than a day anyway.
const MAX_TTL_SECONDS: i64 = 24 * 3600;

/// Sends notifications by Web Push.
pub struct WebPushNotifier {
    public_url: url::Url,
    vapid: VapidKey,
    subject: String,
    networks: Networks,
}

impl WebPushNotifier {
    /// Links under `public_url`, signed with `vapid` naming `subject`
    /// (`mailto:` or `https:`), sent only where `networks` admits.
    pub fn new(public_url: url::Url, vapid: VapidKey, subject: String, networks: Networks) -> Self {
        WebPushNotifier {
            public_url,
            vapid,
            subject,
            networks,
        }
    }

    /// The push request's endpoint, headers and encrypted body.
    pub fn build(
        &self,
        job: &LeasedJob,
        message: &Message,
    ) -> Result<(url::Url, HeaderMap, Vec<u8>), &'static str> {
        let target = message.target.as_ref().ok_or("the message has no target")?;
        let subscription: SubscriptionInfo =
            serde_json::from_str(target.expose()).map_err(|_| "the subscription does not parse")?;
        let endpoint =
            url::Url::parse(&subscription.endpoint).map_err(|_| "the endpoint is not a URL")?;
        let link = message
            .link(&self.public_url)
            .ok_or("the message has no link")?;
        let payload = json!({
            "title": one_line(&message.title, 120),
            "body": cut(&message.body, 1500),
            "url": link.expose(),
            "tag": job.action_id,
        })
        .to_string();
        let mut vapid = self.vapid.builder().add_sub_info(&subscription);
        vapid.add_claim("sub", self.subject.as_str());
        // RFC 8292 §2: the audience is the push resource's origin, its port
        // included (web-push's default leaves a port out).
        let audience = endpoint.origin().ascii_serialization();
        vapid.add_claim("aud", audience.as_str());
        let signature = vapid
            .build()
            .map_err(|_| "the VAPID signature could not be made")?;
        let ttl = message
            .code_expires_at
            .map(|t| (t - chrono::Utc::now()).num_seconds())
            .unwrap_or(MAX_TTL_SECONDS)
            .clamp(0, MAX_TTL_SECONDS);
        let mut builder = WebPushMessageBuilder::new(&subscription);
        builder.set_payload(ContentEncoding::Aes128Gcm, payload.as_bytes());
        builder.set_vapid_signature(signature);
        builder.set_ttl(u32::try_from(ttl).unwrap_or(0));
        builder.set_urgency(Urgency::High);
        builder.set_topic(job.action_id.simple().to_string());
        let built = builder
            .build()
            .map_err(|_| "the payload could not be encrypted to the subscription's keys")?;
        let request = web_push::request_builder::build_request::<Vec<u8>>(built);
        let mut headers = HeaderMap::new();
        for (name, value) in request.headers() {
            // reqwest writes the length of the body it sends.
            if name.as_str().eq_ignore_ascii_case("content-length") {
                continue;
            }
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_str().as_bytes()),
                HeaderValue::from_bytes(value.as_bytes()),
            ) else {
                return Err("a push header is not valid");
            };
            headers.append(name, value);
        }
        Ok((endpoint, headers, request.into_body()))
    }

    async fn deliver(&self, job: &LeasedJob, message: &Message, by: Instant) -> CallResult {
        match self.build(job, message) {
            Ok((endpoint, headers, body)) => self.networks.post(&endpoint, headers, body, by).await,
            Err(why) => {
                tracing::error!(
                    why,
                    "a web push notification could not be built; failed, nothing sent"
                );
                not_sent(Outcome::Failed, why)
            }
        }
    }
}

impl Notifier for WebPushNotifier {
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
