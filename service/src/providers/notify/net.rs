//! Where a notification may connect. A webhook URL and a push endpoint are
//! set by a person (`keyturn.set_notify`), so each is a request keyturnd
//! makes on someone's say-so, from inside the deployment's network: pointed
//! at `169.254.169.254` or a service on the host, it would be a server-side
//! request forgery. The database refuses a private address written as an
//! IP; names are checked here, when they are resolved, every time.
//!
//! Each send resolves the host itself, checks every address it gets
//! ([`keyturn_core::notify::reach`]): public ones are taken; loopback ones
//! when the URL itself names loopback (`127.0.0.1`, `[::1]`, `localhost`:
//! the plain-http receiver on the same host that `set_notify` takes, for
//! development and tests) unless `KEYTURN_NOTIFY_LOOPBACK=false`; any other
//! only inside a network of `KEYTURN_NOTIFY_ALLOW_NETWORKS` (none by
//! default). So a public-looking name that resolves to this host (DNS
//! rebinding) is refused, and keyturnd connects only to the addresses it
//! checked (reqwest's per-client resolve override), so a name that resolves
//! elsewhere a moment later changes nothing. No redirect is followed and no
//! proxy used, as for the webhook adapter. Refused: `failed`, nothing sent;
//! a name that does not resolve: `retry`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use keyturn_core::notify::{names_loopback, reach, Reach};
use reqwest::header::HeaderMap;
use serde_json::json;
use tokio::time::Instant;

use crate::classify::{self, Outcome};
use crate::providers::{http_transport_failure, lapsed, not_sent, CallResult};

/// Longest connect phase (as the webhook adapter's).
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The networks a notification may reach besides public addresses.
#[derive(Clone, Debug, Default)]
pub struct Networks {
    allowed: Vec<IpNet>,
    /// Whether a URL that names loopback may reach it.
    loopback: bool,
}

impl Networks {
    /// Public addresses, those inside `allowed`, and loopback for a URL
    /// that names it when `loopback` is true.
    pub fn new(allowed: Vec<IpNet>, loopback: bool) -> Self {
        Networks { allowed, loopback }
    }

    /// Whether a notification to `url` may connect to `ip`, one of the
    /// addresses its host resolved to.
    pub fn admits(&self, url: &url::Url, ip: IpAddr) -> bool {
        let ip = match ip {
            // An IPv4 address inside IPv6 is the IPv4 address.
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match reach(ip) {
            Reach::Public => true,
            Reach::Loopback if self.loopback && names_loopback(url) => true,
            _ => self.allowed.iter().any(|net| net.contains(&ip)),
        }
    }

    /// The addresses `url` may be reached at, all checked; `Err` is the
    /// outcome to record instead of sending.
    async fn resolve(&self, url: &url::Url, by: Instant) -> Result<Vec<SocketAddr>, CallResult> {
        let port = url
            .port_or_known_default()
            .ok_or_else(|| not_sent(Outcome::Failed, "the target URL has no port"))?;
        let addrs: Vec<SocketAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![SocketAddr::new(ip.into(), port)],
            Some(url::Host::Ipv6(ip)) => vec![SocketAddr::new(ip.into(), port)],
            Some(url::Host::Domain(name)) => {
                let looked_up =
                    tokio::time::timeout_at(by, tokio::net::lookup_host((name, port))).await;
                match looked_up {
                    Ok(Ok(found)) => found.collect(),
                    _ => {
                        tracing::warn!(
                            "a notification target's name did not resolve; recording retry"
                        );
                        return Err(not_sent(
                            Outcome::Retry { after: None },
                            "the target's name did not resolve",
                        ));
                    }
                }
            }
            None => return Err(not_sent(Outcome::Failed, "the target URL has no host")),
        };
        if addrs.is_empty() || addrs.iter().any(|a| !self.admits(url, a.ip())) {
            tracing::error!(
                "a notification target resolves to an address that is not public, not loopback its URL names, and not in KEYTURN_NOTIFY_ALLOW_NETWORKS; failed, nothing sent"
            );
            return Err(not_sent(
                Outcome::Failed,
                "the target resolves to an address notifications may not reach (not public, not loopback named by the URL, not in KEYTURN_NOTIFY_ALLOW_NETWORKS)",
            ));
        }
        Ok(addrs)
    }

    /// POSTs `body` with `headers` to `url`, connecting only to addresses
    /// it checked, within `by`; the outcome classified as the webhook
    /// adapter's (crate::classify), the receipt the status code.
    pub async fn post(
        &self,
        url: &url::Url,
        headers: HeaderMap,
        body: Vec<u8>,
        by: Instant,
    ) -> CallResult {
        let addrs = match self.resolve(url, by).await {
            Ok(addrs) => addrs,
            Err(result) => return result,
        };
        let left = by.saturating_duration_since(Instant::now());
        let mut client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout((left / 2).min(MAX_CONNECT_TIMEOUT))
            .user_agent(concat!("keyturnd/", env!("CARGO_PKG_VERSION")));
        if let Some(url::Host::Domain(name)) = url.host() {
            client = client.resolve_to_addrs(name, &addrs);
        }
        let client = match client.build() {
            Ok(c) => c,
            Err(_) => return not_sent(Outcome::Failed, "no HTTP client could be built"),
        };
        // The last check before the first byte, as every adapter makes it.
        let Some(timeout) = by
            .checked_duration_since(Instant::now())
            .filter(|t| !t.is_zero())
        else {
            return lapsed();
        };
        let sent = client
            .post(url.clone())
            .timeout(timeout)
            .headers(headers)
            .body(body)
            .send()
            .await;
        match sent {
            Err(err) => http_transport_failure(err, "notification"),
            Ok(response) => {
                let status = response.status().as_u16();
                let outcome =
                    classify::http_response(status, response.headers(), SystemTime::now());
                tracing::info!(status, outcome = outcome.word(), "notification answered");
                CallResult {
                    outcome,
                    receipt: json!({ "status": status }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_only_public_addresses_unless_allowed() {
        let url = |u: &str| url::Url::parse(u).unwrap();
        let named = url("https://hooks.example/x");
        let none = Networks::default();
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "::1",
            "::ffff:10.0.0.1",
            "fd00::1",
        ] {
            assert!(!none.admits(&named, ip.parse().unwrap()), "{ip}");
        }
        assert!(none.admits(&named, "8.8.8.8".parse().unwrap()));
        let loopback = Networks::new(vec!["127.0.0.0/8".parse().unwrap()], false);
        assert!(loopback.admits(&named, "127.0.0.1".parse().unwrap()));
        assert!(loopback.admits(&named, "::ffff:127.0.0.1".parse().unwrap()));
        assert!(!loopback.admits(&named, "::1".parse().unwrap()));
        assert!(!loopback.admits(&named, "10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn test_loopback_only_where_the_url_names_it() {
        let url = |u: &str| url::Url::parse(u).unwrap();
        let on = Networks::new(vec![], true);
        let here = "127.0.0.1".parse().unwrap();
        for named in [
            "http://127.0.0.1:9/hook",
            "http://127.3.4.5/hook",
            "http://[::1]:9/hook",
            "http://LOCALHOST:9/hook",
        ] {
            assert!(on.admits(&url(named), here), "{named}");
            assert!(on.admits(&url(named), "::1".parse().unwrap()), "{named}");
            // Loopback, and nothing else, for such a URL.
            assert!(
                !on.admits(&url(named), "10.0.0.1".parse().unwrap()),
                "{named}"
            );
        }
        // A name that is not localhost resolving to this host: rebinding.
        assert!(!on.admits(&url("https://rebind.example/hook"), here));
        assert!(!on.admits(&url("https://localhost.example/hook"), here));
        // Switched off, a URL naming loopback is refused too.
        let off = Networks::new(vec![], false);
        assert!(!off.admits(&url("http://127.0.0.1:9/hook"), here));
        assert!(!off.admits(&url("http://localhost:9/hook"), here));
    }

    #[tokio::test]
    async fn test_a_loopback_target_is_refused_before_any_byte_when_switched_off() {
        // KEYTURN_NOTIFY_LOOPBACK=false: nothing is sent to a receiver on
        // this host, and the attempt is failed, not retried.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = url::Url::parse(&format!("http://localhost:{port}/hook")).unwrap();
        let result = Networks::new(vec![], false)
            .post(
                &url,
                HeaderMap::new(),
                b"{}".to_vec(),
                Instant::now() + Duration::from_secs(5),
            )
            .await;
        assert_eq!(result.outcome, Outcome::Failed);
        assert!(result.not_sent(), "{}", result.receipt);
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "no connection was made");
    }
}
