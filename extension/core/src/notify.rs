//! Where a notification may go (`keyturn.set_notify`, docs/notifications.md):
//! the one rule for each channel's target, which the extension applies when a
//! person sets it and keyturnd applies again, with the addresses a name
//! resolves to, right before it connects.
//!
//! * `email`: a bare addr-spec ([`crate::email`]), the same shape the SMTP
//!   adapter sends to.
//! * `webhook`: an `https` URL, or `http` to a loopback address (a receiver on
//!   the same host, for development), at most [`MAX_URL`] bytes, without
//!   userinfo (a password in a URL lands in logs and history) and without a
//!   fragment. A host written as an IP address must be public or loopback:
//!   a private, link-local or otherwise reserved address is refused at once
//!   (`https://169.254.169.254/…` is the cloud's metadata service, not a
//!   person's chat). A name is checked by keyturnd when it is resolved, every
//!   time ([`reach`]).
//! * `webpush`: a `PushSubscription`'s JSON as a browser gives it, at most
//!   [`MAX_SUBSCRIPTION`] bytes: an `endpoint` held to the webhook rule, and
//!   `keys.p256dh` (an uncompressed P-256 point, 65 bytes) and `keys.auth`
//!   (16 bytes) in base64url, RFC 8291 §3. Kept normalized, with nothing else
//!   (`expirationTime` is dropped: the push service says when it has gone, with
//!   a 404 or 410).
//!
//! A webhook's own secret is a Standard Webhooks `whsec_` secret of 24 to 64
//! bytes ([`check_webhook_secret`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use serde_json::{json, Value};

use crate::email::is_bare_addr_spec;
use crate::CoreError;

/// Longest webhook URL or push endpoint, in bytes.
pub const MAX_URL: usize = 2048;
/// Longest subscription JSON, in bytes: a browser's is a few hundred.
pub const MAX_SUBSCRIPTION: usize = 4096;

/// What kind of network a resolved address is on, for deciding whether a
/// notification may be sent there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// A globally routable unicast address.
    Public,
    /// This host (`127.0.0.0/8`, `::1`).
    Loopback,
    /// Anything else: private (RFC 1918, ULA), shared (CGNAT), link-local
    /// (the cloud metadata service), multicast, documentation, reserved,
    /// unspecified.
    Internal,
}

/// Classifies an address. An IPv4 address inside IPv6 (mapped, or NAT64's
/// well-known prefix) is classified as the IPv4 address it carries.
pub fn reach(ip: IpAddr) -> Reach {
    match ip {
        IpAddr::V4(v4) => reach_v4(v4),
        IpAddr::V6(v6) => reach_v6(v6),
    }
}

fn reach_v4(ip: Ipv4Addr) -> Reach {
    let [a, b, c, _] = ip.octets();
    if a == 127 {
        return Reach::Loopback;
    }
    let internal = a == 0                              // "this network"
        || a == 10                                     // RFC 1918
        || (a == 100 && (64..128).contains(&b))        // shared address space (CGNAT)
        || (a == 169 && b == 254)                      // link-local: cloud metadata
        || (a == 172 && (16..32).contains(&b))         // RFC 1918
        || (a == 192 && b == 0 && c == 0)              // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)              // TEST-NET-1
        || (a == 192 && b == 88 && c == 99)            // 6to4 relay anycast
        || (a == 192 && b == 168)                      // RFC 1918
        || (a == 198 && (b == 18 || b == 19))          // benchmarking
        || (a == 198 && b == 51 && c == 100)           // TEST-NET-2
        || (a == 203 && b == 0 && c == 113)            // TEST-NET-3
        || a >= 224; // multicast, reserved, broadcast
    if internal {
        Reach::Internal
    } else {
        Reach::Public
    }
}

fn reach_v6(ip: Ipv6Addr) -> Reach {
    if ip == Ipv6Addr::LOCALHOST {
        return Reach::Loopback;
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return reach_v4(v4);
    }
    let s = ip.segments();
    // 64:ff9b::/96, NAT64: the IPv4 address it translates to.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return reach_v4(Ipv4Addr::new(a, b, c, d));
    }
    // Only global unicast (2000::/3) can be public; within it, the
    // documentation, ORCHID and other special-purpose blocks are not.
    let global = (s[0] & 0xe000) == 0x2000
        && !(s[0] == 0x2001 && s[1] == 0x0db8)       // documentation
        && !(s[0] == 0x2001 && s[1] < 0x0200)        // IETF protocol assignments (Teredo, ORCHID, …)
        && s[0] != 0x2002; // 6to4: an IPv4 address of any kind behind it
    if global {
        Reach::Public
    } else {
        Reach::Internal
    }
}

fn invalid(message: impl Into<String>) -> CoreError {
    CoreError::InvalidTarget(message.into())
}

/// Checks a webhook URL or push endpoint (the module's rule) and returns it
/// as the URL parser writes it.
pub fn check_url(text: &str) -> Result<url::Url, CoreError> {
    if text.len() > MAX_URL {
        return Err(invalid(format!(
            "a URL is at most {MAX_URL} bytes, not {}",
            text.len()
        )));
    }
    let url = url::Url::parse(text)
        .map_err(|e| invalid(format!("not a URL ({e}); send an https:// URL")))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "a URL with a user name or password is refused: credentials in a URL end up in logs; use the channel's secret instead",
        ));
    }
    if url.fragment().is_some() {
        return Err(invalid("a URL with a fragment (#…) is refused"));
    }
    if url.host().is_none() {
        return Err(invalid("the URL names no host"));
    }
    let literal = literal_reach(&url);
    match url.scheme() {
        "https" => {}
        "http" if names_loopback(&url) => {}
        "http" => {
            return Err(invalid(
                "plain http is taken only to a loopback address (127.0.0.1, [::1], localhost); send an https:// URL",
            ))
        }
        other => {
            return Err(invalid(format!(
                "scheme {other} is not taken; send an https:// URL"
            )))
        }
    }
    if literal == Some(Reach::Internal) {
        return Err(invalid(
            "the URL's host is a private, link-local or reserved address; a notification goes to a public address, or to loopback",
        ));
    }
    Ok(url)
}

/// The reach of the URL's host when it is written as an IP address; `None`
/// for a name (checked when it is resolved) or no host.
fn literal_reach(url: &url::Url) -> Option<Reach> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(reach(IpAddr::V4(v4))),
        url::Host::Ipv6(v6) => Some(reach(IpAddr::V6(v6))),
        url::Host::Domain(_) => None,
    }
}

/// Whether the URL itself names this host: a loopback address written out,
/// or the name `localhost` (RFC 6761: always this host). Plain http is taken
/// only to such a URL, and keyturnd reaches loopback only for one.
pub fn names_loopback(url: &url::Url) -> bool {
    literal_reach(url) == Some(Reach::Loopback)
        || matches!(url.host(), Some(url::Host::Domain(d)) if d.eq_ignore_ascii_case("localhost"))
}

/// Checks a `PushSubscription`'s JSON and returns its normalized form:
/// `{"endpoint", "keys": {"auth", "p256dh"}}`.
pub fn check_subscription(text: &str) -> Result<String, CoreError> {
    if text.len() > MAX_SUBSCRIPTION {
        return Err(invalid(format!(
            "a push subscription is at most {MAX_SUBSCRIPTION} bytes of JSON, not {}",
            text.len()
        )));
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        invalid(format!(
            "a push subscription is the JSON of a browser's PushSubscription ({e})"
        ))
    })?;
    let Value::Object(map) = &value else {
        return Err(invalid("a push subscription is a JSON object"));
    };
    if let Some(key) = map
        .keys()
        .find(|k| !["endpoint", "keys", "expirationTime"].contains(&k.as_str()))
    {
        return Err(invalid(format!(
            "a push subscription has endpoint, keys and expirationTime, not {key}"
        )));
    }
    let endpoint = map
        .get("endpoint")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a push subscription needs its endpoint (a string)"))?;
    let endpoint = check_url(endpoint)?;
    let keys = map
        .get("keys")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("a push subscription needs its keys (p256dh and auth)"))?;
    if let Some(key) = keys
        .keys()
        .find(|k| !["p256dh", "auth"].contains(&k.as_str()))
    {
        return Err(invalid(format!(
            "a push subscription's keys are p256dh and auth, not {key}"
        )));
    }
    let p256dh = base64url_key(keys.get("p256dh"), "p256dh", 65)?;
    if !p256dh.1.starts_with(&[0x04]) {
        return Err(invalid(
            "keys.p256dh is not an uncompressed P-256 point (65 bytes starting 0x04)",
        ));
    }
    let auth = base64url_key(keys.get("auth"), "auth", 16)?;
    Ok(json!({
        "endpoint": endpoint.as_str(),
        "keys": {"p256dh": p256dh.0, "auth": auth.0},
    })
    .to_string())
}

/// A base64url key of `len` bytes (padding tolerated): its unpadded text
/// and bytes.
fn base64url_key(
    value: Option<&Value>,
    name: &str,
    len: usize,
) -> Result<(String, Vec<u8>), CoreError> {
    let text = value
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("keys.{name} must be a base64url string")))?;
    let unpadded = text.trim_end_matches('=');
    let bytes = URL_SAFE_NO_PAD
        .decode(unpadded)
        .map_err(|_| invalid(format!("keys.{name} is not base64url")))?;
    if bytes.len() != len {
        return Err(invalid(format!(
            "keys.{name} must hold {len} bytes, not {}",
            bytes.len()
        )));
    }
    Ok((unpadded.to_owned(), bytes))
}

/// Checks a channel's target and returns it as keyturn stores it. Which
/// channels there are is the database's `keyturn.channel` type; this is the
/// rule for each.
pub fn normalize_target(channel: &str, target: &str) -> Result<String, CoreError> {
    match channel {
        "email" if is_bare_addr_spec(target) => Ok(target.to_owned()),
        "email" => Err(invalid(
            "an email target is a bare address (name@example.com): no display name, comment, quotes or IP literal",
        )),
        "webhook" => check_url(target).map(|u| u.to_string()),
        "webpush" => check_subscription(target),
        other => Err(invalid(format!("no target rule for channel {other:?}"))),
    }
}

/// What a person is shown of a stored target: the whole address for email,
/// the scheme and host of a URL. A webhook URL's path is often its secret
/// (Slack's and Teams' workflow URLs are), and a push endpoint's path names
/// the device.
pub fn target_hint(channel: &str, target: &str) -> String {
    let url = match channel {
        "email" => return target.to_owned(),
        "webpush" => serde_json::from_str::<Value>(target)
            .ok()
            .and_then(|v| v.get("endpoint").and_then(Value::as_str).map(str::to_owned)),
        _ => Some(target.to_owned()),
    };
    url.and_then(|u| url::Url::parse(&u).ok())
        .map(|u| format!("{}/…", u.origin().ascii_serialization()))
        .unwrap_or_default()
}

/// Checks a webhook channel's own secret: `whsec_` and the standard base64
/// of 24 to 64 bytes, the Standard Webhooks format.
pub fn check_webhook_secret(secret: &str) -> Result<(), CoreError> {
    let bytes = secret
        .strip_prefix("whsec_")
        .and_then(|b| STANDARD.decode(b).ok())
        .ok_or_else(|| {
            invalid("a webhook secret is whsec_ followed by standard base64 (the Standard Webhooks format)")
        })?;
    if !(24..=64).contains(&bytes.len()) {
        return Err(invalid(format!(
            "a webhook secret holds 24 to 64 bytes, not {}",
            bytes.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(endpoint: &str) -> String {
        json!({
            "endpoint": endpoint,
            "expirationTime": null,
            "keys": {
                "p256dh": URL_SAFE_NO_PAD.encode([4u8; 65]),
                "auth": URL_SAFE_NO_PAD.encode([7u8; 16]),
            }
        })
        .to_string()
    }

    #[test]
    fn test_addresses_are_classified() {
        let cases = [
            ("8.8.8.8", Reach::Public),
            ("127.0.0.1", Reach::Loopback),
            ("127.9.9.9", Reach::Loopback),
            ("10.1.2.3", Reach::Internal),
            ("172.16.0.1", Reach::Internal),
            ("172.32.0.1", Reach::Public),
            ("192.168.1.1", Reach::Internal),
            ("169.254.169.254", Reach::Internal),
            ("100.64.0.1", Reach::Internal),
            ("0.0.0.0", Reach::Internal),
            ("255.255.255.255", Reach::Internal),
            ("224.0.0.1", Reach::Internal),
            ("::1", Reach::Loopback),
            ("::", Reach::Internal),
            ("fe80::1", Reach::Internal),
            ("fd00::1", Reach::Internal),
            ("ff02::1", Reach::Internal),
            ("2001:db8::1", Reach::Internal),
            ("2606:4700:4700::1111", Reach::Public),
            ("::ffff:10.0.0.1", Reach::Internal),
            ("::ffff:127.0.0.1", Reach::Loopback),
            ("::ffff:8.8.8.8", Reach::Public),
            ("64:ff9b::a9fe:a9fe", Reach::Internal),
            ("2002:a9fe:a9fe::1", Reach::Internal),
        ];
        for (ip, want) in cases {
            assert_eq!(reach(ip.parse().unwrap()), want, "{ip}");
        }
    }

    #[test]
    fn test_webhook_urls() {
        for ok in [
            "https://hooks.slack.com/services/T0/B0/abc",
            "http://127.0.0.1:9000/hook",
            "http://[::1]:9000/",
            "http://localhost:8080/x",
            "https://127.0.0.1/x",
            "https://8.8.8.8/x",
        ] {
            assert!(normalize_target("webhook", ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://example.com/hook",
            "https://169.254.169.254/latest/meta-data",
            "https://10.0.0.5/",
            "https://[fd00::1]/",
            "https://[::ffff:192.168.0.1]/",
            "https://user:pw@example.com/",
            "https://example.com/#frag",
            "ftp://example.com/",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "not a url",
            "https://",
        ] {
            assert!(
                matches!(
                    normalize_target("webhook", bad),
                    Err(CoreError::InvalidTarget(_))
                ),
                "{bad}"
            );
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL));
        assert!(normalize_target("webhook", &long).is_err());
    }

    #[test]
    fn test_emails_are_bare() {
        assert_eq!(
            normalize_target("email", "ann@acme.example").unwrap(),
            "ann@acme.example"
        );
        for bad in [
            "Ann <ann@acme.example>",
            "ann@acme.example\r\nBcc: eve@evil.example",
            "ann@[10.0.0.1]",
            "",
        ] {
            assert!(normalize_target("email", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn test_subscriptions_are_checked_and_normalized() {
        let got = normalize_target("webpush", &sub("https://push.example/abc")).unwrap();
        let v: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(v["endpoint"], "https://push.example/abc");
        assert!(v.get("expirationTime").is_none());
        assert_eq!(v["keys"]["auth"], URL_SAFE_NO_PAD.encode([7u8; 16]));

        assert!(normalize_target("webpush", &sub("http://push.example/abc")).is_err());
        assert!(normalize_target("webpush", &sub("https://10.0.0.1/abc")).is_err());
        let mut v: Value = serde_json::from_str(&sub("https://push.example/a")).unwrap();
        v["keys"]["p256dh"] = json!(URL_SAFE_NO_PAD.encode([4u8; 64]));
        assert!(normalize_target("webpush", &v.to_string()).is_err());
        v["keys"]["p256dh"] = json!(URL_SAFE_NO_PAD.encode([2u8; 65]));
        assert!(normalize_target("webpush", &v.to_string()).is_err());
        let mut v: Value = serde_json::from_str(&sub("https://push.example/a")).unwrap();
        v["extra"] = json!("x".repeat(10));
        assert!(normalize_target("webpush", &v.to_string()).is_err());
        let mut v: Value = serde_json::from_str(&sub("https://push.example/a")).unwrap();
        v["keys"]["auth"] = json!("x".repeat(MAX_SUBSCRIPTION));
        assert!(matches!(
            normalize_target("webpush", &v.to_string()),
            Err(CoreError::InvalidTarget(m)) if m.contains("at most")
        ));
        assert!(normalize_target("webpush", "[]").is_err());
        assert!(normalize_target("webpush", "{").is_err());
    }

    #[test]
    fn test_hints_hide_paths() {
        assert_eq!(
            target_hint("webhook", "https://hooks.slack.com/services/T0/B0/secret"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            target_hint("webpush", &sub("https://fcm.googleapis.com/fcm/send/dev")),
            "https://fcm.googleapis.com/…"
        );
        assert_eq!(target_hint("email", "a@b.example"), "a@b.example");
    }

    #[test]
    fn test_webhook_secrets() {
        let ok = format!("whsec_{}", STANDARD.encode([1u8; 32]));
        assert!(check_webhook_secret(&ok).is_ok());
        for bad in [
            "secret".to_owned(),
            "whsec_***".to_owned(),
            format!("whsec_{}", STANDARD.encode([1u8; 8])),
            format!("whsec_{}", STANDARD.encode([1u8; 65])),
        ] {
            assert!(check_webhook_secret(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn test_unknown_channel() {
        assert!(normalize_target("sms", "+15550100").is_err());
    }
}
