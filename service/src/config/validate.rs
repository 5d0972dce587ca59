//! What clap cannot check: settings that only make sense together.

use std::str::FromStr;

use axum::http::HeaderValue;

use super::{
    csp_header, min_lease, webhook_key, Config, VapidKey, LEASE_ROUND_TRIP_SLACK,
    LEASE_SAFETY_MARGIN,
};
use crate::error::Error;

/// What [`Config::validate`] parsed on its way, so nothing parses a setting
/// twice.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The Content-Security-Policy of every answer ([`csp_header`]).
    pub csp: HeaderValue,
    /// The Standard Webhooks key ([`webhook_key`]), with the webhook adapter on.
    pub webhook_key: Option<Vec<u8>>,
    /// The key of `KEYTURN_NOTIFY_WEBHOOK_SECRET`, for notification
    /// webhooks whose channel has no secret of its own.
    pub notify_webhook_key: Option<Vec<u8>>,
    /// The VAPID key of `KEYTURN_VAPID_PRIVATE_KEY`, with Web Push on.
    pub vapid: Option<VapidKey>,
}

impl Config {
    /// Checks what clap cannot (settings that only make sense together) and
    /// returns what it parsed. Called once at start-up so a bad deployment
    /// fails loudly instead of dispatching with surprising bounds.
    pub fn validate(&self) -> Result<Checked, Error> {
        let bad = |msg: String| Err(Error::Config(msg));
        if self.lease() < min_lease(self.call_timeout()) {
            return bad(format!(
                "KEYTURN_LEASE_SECONDS={} must be at least KEYTURN_HTTP_TIMEOUT_SECONDS={} plus {} s: \
                 every provider call has to end {} s before its lease does, and the lease round trip \
                 may take {} s of it; raise KEYTURN_LEASE_SECONDS or lower KEYTURN_HTTP_TIMEOUT_SECONDS \
                 (keyturnd fits its own database waits inside the lease)",
                self.lease_seconds,
                self.http_timeout_seconds,
                (LEASE_SAFETY_MARGIN + LEASE_ROUND_TRIP_SLACK).as_secs(),
                LEASE_SAFETY_MARGIN.as_secs(),
                LEASE_ROUND_TRIP_SLACK.as_secs(),
            ));
        }
        if let Some(url) = &self.listen_database_url {
            if let Err(e) = tokio_postgres::Config::from_str(url.expose()) {
                return bad(format!("KEYTURN_LISTEN_DATABASE_URL does not parse: {e}"));
            }
        }
        let mut webhook = None;
        match (&self.webhook_url, &self.webhook_secret) {
            (Some(url), Some(secret)) => {
                if !matches!(url.scheme(), "http" | "https") {
                    return bad("KEYTURN_WEBHOOK_URL must be an http:// or https:// URL".into());
                }
                if secret.expose().is_empty() {
                    return bad("KEYTURN_WEBHOOK_SECRET must not be empty".into());
                }
                webhook = Some(webhook_key(secret.expose())?);
            }
            (Some(_), None) => {
                return bad(
                    "KEYTURN_WEBHOOK_URL is set but KEYTURN_WEBHOOK_SECRET is not: \
                     every webhook body is signed"
                        .into(),
                )
            }
            (None, Some(_)) => {
                return bad("KEYTURN_WEBHOOK_SECRET is set but KEYTURN_WEBHOOK_URL is not".into())
            }
            (None, None) => {}
        }
        // The base of every link keyturnd builds, notifications' and /mcp's.
        if let Some(public) = &self.public_url {
            if !matches!(public.scheme(), "http" | "https") {
                return bad("KEYTURN_PUBLIC_URL must be an http:// or https:// URL".into());
            }
        }
        self.validate_rpc()?;
        self.validate_mcp()?;
        let (notify_webhook_key, vapid) = self.validate_notify()?;
        // A person chooses where their notifications go, and may aim them at
        // the effects receiver: under one key, a notification would carry a
        // signature that receiver accepts (eighth red-team pass, docs/security.md row 93).
        if webhook.is_some() && webhook == notify_webhook_key {
            return bad(
                "KEYTURN_NOTIFY_WEBHOOK_SECRET must differ from KEYTURN_WEBHOOK_SECRET: a person \
                 chooses where notifications go, and one aimed at the effects receiver would carry \
                 a signature it accepts"
                    .into(),
            );
        }
        Ok(Checked {
            csp: csp_header(&self.frame_ancestors)?,
            webhook_key: webhook,
            notify_webhook_key,
            vapid,
        })
    }

    /// The notification settings: the default webhook key and the VAPID
    /// key, parsed.
    fn validate_notify(&self) -> Result<(Option<Vec<u8>>, Option<VapidKey>), Error> {
        let bad = |msg: String| Err(Error::Config(msg));
        let webhook = match &self.notify_webhook_secret {
            Some(secret) => {
                if keyturn_core::notify::check_webhook_secret(secret.expose()).is_err() {
                    // The message could quote the secret; say only what is wrong.
                    return bad(
                        "KEYTURN_NOTIFY_WEBHOOK_SECRET must be whsec_ and the base64 of 24 to 64 bytes \
                         (the Standard Webhooks secret format)"
                            .into(),
                    );
                }
                Some(webhook_key(secret.expose())?)
            }
            None => None,
        };
        let vapid = match &self.vapid_private_key {
            Some(key) => Some(VapidKey::parse(key.expose())?),
            None => None,
        };
        if let Some(subject) = &self.vapid_subject {
            if !(subject.starts_with("mailto:") || subject.starts_with("https://")) {
                return bad(format!(
                    "KEYTURN_VAPID_SUBJECT={subject:?} must be a mailto: or https: URI (RFC 8292)"
                ));
            }
        }
        if (webhook.is_some() || vapid.is_some()) && self.public_url.is_none() {
            return bad(
                "KEYTURN_NOTIFY_WEBHOOK_SECRET and KEYTURN_VAPID_PRIVATE_KEY need KEYTURN_PUBLIC_URL: \
                 every notification carries a card link"
                    .into(),
            );
        }
        Ok((webhook, vapid))
    }

    fn validate_rpc(&self) -> Result<(), Error> {
        let bad = |msg: &str| Err(Error::Config(msg.to_owned()));
        if !self.rpc_enabled() {
            if self.rpc_database_url.is_some()
                || !self.jwt_roles.is_empty()
                || self.jwt_aud.is_some()
                || self.card_role.is_some()
            {
                return bad(
                    "KEYTURN_RPC_DATABASE_URL, KEYTURN_JWT_ROLES, KEYTURN_JWT_AUD and KEYTURN_CARD_ROLE \
                     only take effect with KEYTURN_JWT_SECRET or KEYTURN_JWT_JWKS: set one, or remove them",
                );
            }
            return Ok(());
        }
        if self.jwt_secret.is_some() && self.jwt_jwks.is_some() {
            return bad("set KEYTURN_JWT_SECRET or KEYTURN_JWT_JWKS, not both");
        }
        if self
            .jwt_secret
            .as_ref()
            .is_some_and(|s| s.expose().len() < 32)
        {
            // RFC 7518 3.2: an HS256 key is at least as long as the hash.
            return bad("KEYTURN_JWT_SECRET must be at least 32 bytes");
        }
        if self.rpc_database_url.is_none() {
            return bad(
                "KEYTURN_RPC_DATABASE_URL is required with a JWT key: a NOINHERIT login that is a \
                 member of the KEYTURN_JWT_ROLES roles (the dispatcher's login may not approve)",
            );
        }
        if self.jwt_roles.is_empty() || self.jwt_roles.iter().any(|r| r.trim().is_empty()) {
            return bad(
                "KEYTURN_JWT_ROLES must name the database roles a JWT's role claim may select, \
                 comma-separated, none empty",
            );
        }
        if self.jwt_aud.as_deref() == Some("") {
            return bad("KEYTURN_JWT_AUD must not be empty; unset it to accept any audience");
        }
        if let Some(role) = &self.card_role {
            if !self.jwt_roles.iter().any(|r| r == role) {
                return bad(
                    "KEYTURN_CARD_ROLE must be one of KEYTURN_JWT_ROLES: the role the card sessions of \
                     notification links run as, which keyturnd checks at start like the others",
                );
            }
        }
        Ok(())
    }

    fn validate_mcp(&self) -> Result<(), Error> {
        let bad = |msg: &str| Err(Error::Config(msg.to_owned()));
        if !self.mcp_enabled() {
            return Ok(());
        }
        if !self.rpc_enabled() {
            return bad(
                "KEYTURN_MCP_ROLES needs a JWT key (KEYTURN_JWT_SECRET or KEYTURN_JWT_JWKS): agents' JWTs are verified with the people's keys, and the card the person approves on is served with /rpc",
            );
        }
        if self.mcp_roles.iter().any(|r| r.trim().is_empty()) {
            return bad("KEYTURN_MCP_ROLES must name database roles, comma-separated, none empty");
        }
        let Some(url) = &self.mcp_database_url else {
            return bad(
                "KEYTURN_MCP_DATABASE_URL is required with KEYTURN_MCP_ROLES: a NOINHERIT login that is a member of each MCP role, neither the dispatcher's nor /rpc's",
            );
        };
        if url == &self.database_url || Some(url) == self.rpc_database_url.as_ref() {
            return bad("KEYTURN_MCP_DATABASE_URL must be a login of its own, not DATABASE_URL's or KEYTURN_RPC_DATABASE_URL's");
        }
        Ok(())
    }
}
