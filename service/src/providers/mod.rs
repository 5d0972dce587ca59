//! Provider adapters: the only code that talks to the outside world.
//!
//! An adapter receives one leased job after `begin_dispatch` committed, makes
//! exactly one attempt bounded by the time it is given, and returns a
//! [`CallResult`]: an [`Outcome`] classified by [`crate::classify`] and a
//! small receipt. Adapters never return errors and never retry on their own:
//! a retry is the database's decision, made on the recorded outcome.
//!
//! Receipts hold only what the database may keep about a call: status codes and a
//! provider message id, never bodies or param values.
//!
//! The trait is object-safe (it returns a boxed future) so that the set of
//! providers is a plain map from the tool's `provider` name, and tests can
//! plug in their own.
//!
//! Notifications ([`notify`]) are jobs of the same protocol with providers
//! of their own (`notify.email`, `notify.webhook`, `notify.webpush`): the
//! worker gives such an adapter the message the database wrote for it
//! ([`Provider::notify`]) instead of params and files.
//!
//! Attachments ([`attachments`]) reach an adapter already read from the
//! database and checked against their approved metadata; the worker refuses
//! a job that has any for an adapter that does not send them, so no file the
//! person approved is ever silently left out.
//!
//! **Never past the lease.** An adapter is given the instant its call must
//! have ended, which the worker keeps a margin inside the lease; it checks
//! that instant immediately before its first byte goes out (and before
//! SMTP's `DATA`), and past it sends nothing ([`lapsed`]). What remains is a
//! process paused between that check and the write (docs/operations.md).

pub mod attachments;
pub mod mcp;
pub mod notify;
pub mod smtp;
pub mod webhook;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;

use self::attachments::Attachment;
use crate::classify::Outcome;
use crate::config::{Checked, Config};
use crate::db::LeasedJob;
use crate::error::Error;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Longest provider message id kept in a receipt.
pub const MAX_MESSAGE_ID_CHARS: usize = 128;

/// What one attempt produced.
#[derive(Clone, Debug, PartialEq)]
pub struct CallResult {
    /// The classified outcome.
    pub outcome: Outcome,
    /// The receipt stored by `keyturn.complete`.
    pub receipt: serde_json::Value,
}

/// One way of carrying out an external action.
pub trait Provider: Send + Sync {
    /// The name tools use in their `provider` spec key.
    fn name(&self) -> &'static str;

    /// Whether this adapter sends attachments. The worker reads a job's
    /// files only for one that does, and refuses (`failed`, nothing sent) a
    /// job with files for one that does not.
    fn takes_attachments(&self) -> bool {
        false
    }

    /// Makes one attempt carrying `attachments` (exactly the files the job's
    /// params name, verified; none for an adapter that sends none), ended by
    /// `by`. `by` is also the last moment the first byte may leave: an
    /// adapter checks it immediately before it sends (and before SMTP's
    /// `DATA`), and once it has passed sends nothing and answers
    /// [`lapsed`]. A notification adapter carries no action: `failed`,
    /// nothing sent.
    fn call<'a>(
        &'a self,
        _job: &'a LeasedJob,
        _attachments: &'a [Attachment],
        _by: Instant,
    ) -> BoxFuture<'a, CallResult> {
        Box::pin(async {
            not_sent(
                Outcome::Failed,
                "this provider carries notifications, not actions",
            )
        })
    }

    /// What the database must compare right before this job's call, read
    /// by `by`: the `mcp` provider's upstream definition of the tool
    /// (`keyturn.check_upstream_tool`). `Ok(None)` (the default): nothing.
    /// `Err`: the outcome to record instead, nothing sent.
    fn live_definition<'a>(
        &'a self,
        _job: &'a LeasedJob,
        _by: Instant,
    ) -> BoxFuture<'a, Result<Option<serde_json::Value>, CallResult>> {
        Box::pin(async { Ok(None) })
    }

    /// Whether this adapter carries notifications (its name starts with
    /// [`notify::PREFIX`]): the worker then asks the database for the
    /// message and calls [`notify`](Self::notify) instead of
    /// [`call`](Self::call).
    fn notifies(&self) -> bool {
        false
    }

    /// Sends a notification's `message` in one attempt, under the same
    /// rules as [`call`](Self::call) (`by` both ends it and is the last
    /// moment its first byte may leave).
    fn notify<'a>(
        &'a self,
        _job: &'a LeasedJob,
        _message: &'a notify::Message,
        _by: Instant,
    ) -> BoxFuture<'a, CallResult> {
        Box::pin(async { not_sent(Outcome::Failed, "this provider sends no notification") })
    }
}

/// What the receipt of an attempt that sent nothing says, so that keyturnd
/// can tell the operator so when the database no longer takes `retry`
/// (see [`CallResult::not_sent`]).
pub const NOT_SENT: &str = "sent";

/// The result of an attempt that ended before anything reached the
/// provider.
pub(crate) fn not_sent(outcome: Outcome, why: &str) -> CallResult {
    CallResult {
        outcome,
        receipt: serde_json::json!({ "error": why, NOT_SENT: false }),
    }
}

/// The answer of an adapter whose `by` passed before its first byte: the
/// lease it holds has no margin left, so nothing is sent and `retry` is
/// recorded.
pub(crate) fn lapsed() -> CallResult {
    tracing::warn!("the lease had too little left when the call was to start (was keyturnd paused?); provider not called, recording retry");
    not_sent(
        Outcome::Retry { after: None },
        "the lease had lapsed before the call started; provider not called",
    )
}

impl CallResult {
    /// Whether keyturnd knows that nothing of this attempt reached the
    /// provider (its receipt says `"sent": false`).
    pub fn not_sent(&self) -> bool {
        receipt_says_not_sent(&self.receipt)
    }
}

/// Whether a receipt says that nothing reached the provider; also read from
/// the outcomes the journal replays.
pub fn receipt_says_not_sent(receipt: &serde_json::Value) -> bool {
    receipt.get(NOT_SENT) == Some(&serde_json::Value::Bool(false))
}

/// The configured providers, by name.
#[derive(Clone, Default)]
pub struct Providers {
    by_name: HashMap<&'static str, Arc<dyn Provider>>,
}

impl Providers {
    /// Builds every provider the configuration enables, with what
    /// [`Config::validate`] made of it.
    pub fn from_config(config: &Config, checked: &Checked) -> Result<Self, Error> {
        let mut providers = Providers::default();
        if let (Some(url), Some(secret), Some(key)) = (
            &config.webhook_url,
            &config.webhook_secret,
            &checked.webhook_key,
        ) {
            // Half the call bound (at most 5 s): a connect that is slow to
            // fail is reported as a connect failure (a safe `retry`), never
            // as a timeout once sending may have begun (`unknown`).
            providers.insert(Arc::new(webhook::WebhookProvider::with_key(
                url.clone(),
                secret.clone(),
                key.clone(),
                config.call_timeout() / 2,
            )?));
        }
        let mut smtp = None;
        if let (Some(url), Some(from)) = (&config.smtp_url, config.smtp_sender()) {
            if config.smtp_from.is_none() {
                tracing::warn!(sender = %from, "KEYTURN_SMTP_FROM is not set: mail is sent from the default sender; set it to a mailbox your server accepts");
            }
            let provider = Arc::new(smtp::SmtpProvider::new(url, &from)?);
            providers.insert(provider.clone());
            smtp = Some(provider);
        }
        // Notifications need a base for their card links: without
        // KEYTURN_PUBLIC_URL none is leased, and each is cancelled once its
        // action stops waiting.
        if let Some(public) = &config.public_url {
            if config.notify_loopback {
                tracing::info!("notifications to a URL that names loopback (127.0.0.1, [::1], localhost) are delivered to this host; KEYTURN_NOTIFY_LOOPBACK=false refuses them");
            }
            let networks = notify::net::Networks::new(
                config.notify_allow_networks.clone(),
                config.notify_loopback,
            );
            providers.insert(Arc::new(notify::webhook::WebhookNotifier::new(
                public.clone(),
                checked.notify_webhook_key.clone(),
                networks.clone(),
            )));
            if let Some(smtp) = smtp {
                providers.insert(Arc::new(notify::email::EmailNotifier::new(
                    smtp,
                    public.clone(),
                )));
            }
            if let Some(vapid) = &checked.vapid {
                providers.insert(Arc::new(notify::webpush::WebPushNotifier::new(
                    public.clone(),
                    vapid.clone(),
                    config.vapid_subject(),
                    networks,
                )));
            }
        }
        Ok(providers)
    }

    /// Adds (or replaces) a provider.
    pub fn insert(&mut self, provider: Arc<dyn Provider>) {
        self.by_name.insert(provider.name(), provider);
    }

    /// The provider of that name, if configured.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.by_name.get(name).cloned()
    }

    /// The configured names, sorted (for the start-up log line).
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.by_name.keys().copied().collect();
        names.sort_unstable();
        names
    }
}

/// The outcome of an HTTP request that failed in transport (the webhook
/// adapter's and the notifications'): classified (crate::classify), logged
/// without the URL (it may carry a token, or be a capability, as a Slack
/// workflow URL's path is), the receipt naming the kind of failure only.
pub(crate) fn http_transport_failure(err: reqwest::Error, what: &'static str) -> CallResult {
    let outcome = crate::classify::http_transport_error(&err);
    let kind = if err.is_connect() {
        "connect"
    } else if err.is_timeout() {
        "timeout"
    } else {
        "transport"
    };
    tracing::warn!(error = %err.without_url(), kind, outcome = outcome.word(), "{what} request failed");
    CallResult {
        outcome,
        receipt: serde_json::json!({ "error": kind }),
    }
}

/// Keeps a provider-supplied id printable and short, so a hostile or broken
/// provider cannot stuff the receipt.
///
/// An id holding anything but printable ASCII without spaces is dropped, not
/// cleaned: squeezing `Bearer abc…` into `Bearerabc…` would hide a credential
/// from the database's receipt redaction, which recognizes the spaced form.
pub(crate) fn clean_message_id(raw: &str) -> Option<String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() || !trimmed.chars().all(|c| c.is_ascii_graphic()) {
        return None;
    }
    Some(trimmed.chars().take(MAX_MESSAGE_ID_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_message_id_is_cleaned_and_truncated() {
        assert_eq!(clean_message_id("  abc-1 "), Some("abc-1".into()));
        assert_eq!(
            clean_message_id("a\nb\u{7f}c"),
            None,
            "never glued together"
        );
        assert_eq!(clean_message_id("Bearer abcdefgh12345678"), None);
        assert_eq!(clean_message_id("   "), None);
        let long = "x".repeat(500);
        assert_eq!(
            clean_message_id(&long).map(|s| s.len()),
            Some(MAX_MESSAGE_ID_CHARS)
        );
    }
}
