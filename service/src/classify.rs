//! Outcome classification: what one provider call tells us, as the word
//! `keyturn.complete` records (README, section Outcome classification).
//!
//! The rule behind every row: `retry` only when the provider *certainly* did
//! nothing and said so, or never heard from us; `failed` only when it
//! certainly did nothing and never will; `succeeded` only when it said so;
//! everything else is `unknown`, which the database turns into `uncertain`
//! for a human. An honest `uncertain` costs an operator a minute; a wrong
//! `retry` can cost a duplicate email.
//!
//! ## HTTP (`webhook`)
//!
//! | what happened | outcome | retry_after |
//! |---|---|---|
//! | failure before the first request byte was written: DNS, connect refused or timed out, TLS handshake (`reqwest::Error::is_connect`), or a request that could not even be built (`is_builder`) | `retry` | NULL (database backoff) |
//! | 2xx | `succeeded` | — |
//! | 429 or 503 with `Retry-After: <delta-seconds>` | `retry` | that many seconds |
//! | 429 or 503 with `Retry-After: <HTTP-date>` | `retry` | date − now (0 if past) |
//! | 429 or 503 without a usable `Retry-After`, with `x-rate-limit-reset: n`, n ≤ 10⁹ | `retry` | n seconds |
//! | 429 or 503 without a usable `Retry-After`, with `x-rate-limit-reset: t`, t > 10⁹ (Unix time) | `retry` | t − now (0 if past) |
//! | 429 or 503 with neither | `retry` | NULL (database backoff) |
//! | any other 4xx | `failed` | — |
//! | 5xx other than 503 | `unknown` | — |
//! | 1xx, 3xx (redirects are never followed), any other code | `unknown` | — |
//! | timeout after the connection was made, reset, or any other error once sending began | `unknown` | — |
//!
//! `Retry-After` wins over `x-rate-limit-reset` whenever it parses. Delays
//! are capped at [`MAX_RETRY_DELAY`]; a larger one is taken as the cap.
//!
//! ## SMTP (`smtp`)
//!
//! Stages: *connect* = TCP, TLS, greeting, EHLO, STARTTLS, AUTH; *envelope* =
//! `MAIL FROM`, `RCPT TO`, `DATA` (the command, not the content); *message* =
//! from the first byte of content through the reply to the final `.`.
//!
//! | stage | what happened | outcome |
//! |---|---|---|
//! | any | permanent 5xx reply | `failed` |
//! | connect, envelope | transient 4xx reply | `retry` |
//! | connect, envelope | network error or timeout | `retry` |
//! | message | 4xx reply, network error or timeout | `unknown` |
//! | any | we refused before sending (bad params, server lacks SMTPUTF8) | `failed` |
//! | message | 2xx reply to the final `.` | `succeeded` |
//!
//! A timeout in the envelope stage is `retry`, not `unknown`: a server cannot
//! deliver a message whose content it never received, and nothing of the
//! content leaves before the message stage.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

/// Longest delay passed on from a provider: a week, the longest a tool's
/// approval may live. Anything beyond is more likely a misread header than a
/// plan.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// `x-rate-limit-reset` values above this are Unix times, below are seconds.
const UNIX_TIME_THRESHOLD: u64 = 1_000_000_000;

/// What one provider call tells `keyturn.complete`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The provider did it.
    Succeeded,
    /// The provider certainly did nothing and will not on a retry.
    Failed,
    /// The provider certainly did nothing yet; try again after `after`
    /// (`None`: let the database apply its backoff).
    Retry {
        /// The provider's requested delay, if it gave one.
        after: Option<Duration>,
    },
    /// We cannot know whether it happened.
    Unknown,
}

impl Outcome {
    /// The outcome word of `keyturn.complete`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Retry { .. } => "retry",
            Outcome::Unknown => "unknown",
        }
    }

    /// The `retry_after` argument of `keyturn.complete`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Retry { after } => *after,
            _ => None,
        }
    }
}

/// Classifies an HTTP response by its status code and headers.
pub fn http_response(status: u16, headers: &HeaderMap, now: SystemTime) -> Outcome {
    match status {
        200..=299 => Outcome::Succeeded,
        429 | 503 => Outcome::Retry {
            after: retry_delay(headers, now),
        },
        400..=499 => Outcome::Failed,
        _ => Outcome::Unknown,
    }
}

/// Classifies a reqwest failure (no response was received).
///
/// `is_connect()` is reqwest's only signal that the failure happened while
/// connecting (DNS, TCP, TLS), i.e. before a request byte was written; a
/// request that failed to build never left either. Everything else — a
/// timeout after connecting, a reset, a body error — may have reached the
/// provider.
pub fn http_transport_error(err: &reqwest::Error) -> Outcome {
    if err.is_connect() || err.is_builder() {
        Outcome::Retry { after: None }
    } else {
        Outcome::Unknown
    }
}

/// The provider's requested delay: `Retry-After` if it parses, else
/// `x-rate-limit-reset`, else none.
pub fn retry_delay(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    text("retry-after")
        .and_then(|v| parse_retry_after(v, now))
        .or_else(|| text("x-rate-limit-reset").and_then(|v| parse_rate_limit_reset(v, now)))
        .map(|d| d.min(MAX_RETRY_DELAY))
}

/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `x-rate-limit-reset`: delta-seconds, or a Unix time when above 10⁹.
pub fn parse_rate_limit_reset(value: &str, now: SystemTime) -> Option<Duration> {
    let n = value.trim().parse::<u64>().ok()?;
    if n > UNIX_TIME_THRESHOLD {
        let at = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(n))?;
        Some(at.duration_since(now).unwrap_or(Duration::ZERO))
    } else {
        Some(Duration::from_secs(n))
    }
}

/// How far an SMTP transaction got when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmtpStage {
    /// TCP, TLS, greeting, EHLO, STARTTLS, AUTH.
    Connect,
    /// `MAIL FROM`, `RCPT TO`, the `DATA` command.
    Envelope,
    /// Message content and the reply to its final `.`.
    Message,
}

/// How an SMTP transaction failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmtpFailure {
    /// The server replied with this code (4xx or 5xx).
    Reply(u16),
    /// The connection broke or could not be made.
    Network,
    /// The stage ran out of time.
    Timeout,
    /// We refused before sending anything (params, server capabilities).
    Refused,
    /// We stopped before `DATA`: the call's time (a margin inside the
    /// lease) had passed, so nothing of the message may be sent.
    Lapsed,
}

/// Classifies a failed SMTP transaction.
pub fn smtp_failure(stage: SmtpStage, failure: SmtpFailure) -> Outcome {
    match (stage, failure) {
        (_, SmtpFailure::Reply(code)) if (500..600).contains(&code) => Outcome::Failed,
        (_, SmtpFailure::Refused) => Outcome::Failed,
        (_, SmtpFailure::Lapsed) => Outcome::Retry { after: None },
        (SmtpStage::Message, _) => Outcome::Unknown,
        (SmtpStage::Connect | SmtpStage::Envelope, SmtpFailure::Reply(code))
            if (400..500).contains(&code) =>
        {
            Outcome::Retry { after: None }
        }
        (SmtpStage::Connect | SmtpStage::Envelope, SmtpFailure::Network | SmtpFailure::Timeout) => {
            Outcome::Retry { after: None }
        }
        // A reply code outside 4xx/5xx reported as a failure: we do not
        // know what the server meant.
        (SmtpStage::Connect | SmtpStage::Envelope, SmtpFailure::Reply(_)) => Outcome::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    /// A fixed "now": 2023-11-14T22:13:20Z.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("valid header"));
        }
        h
    }

    fn retry(secs: u64) -> Outcome {
        Outcome::Retry {
            after: Some(Duration::from_secs(secs)),
        }
    }

    const NO_DELAY: Outcome = Outcome::Retry { after: None };

    #[test]
    fn test_http_status_rows() {
        let rows: &[(u16, Outcome)] = &[
            (100, Outcome::Unknown),
            (101, Outcome::Unknown),
            (200, Outcome::Succeeded),
            (201, Outcome::Succeeded),
            (202, Outcome::Succeeded),
            (204, Outcome::Succeeded),
            (299, Outcome::Succeeded),
            (301, Outcome::Unknown),
            (302, Outcome::Unknown),
            (304, Outcome::Unknown),
            (307, Outcome::Unknown),
            (400, Outcome::Failed),
            (401, Outcome::Failed),
            (403, Outcome::Failed),
            (404, Outcome::Failed),
            (409, Outcome::Failed),
            (422, Outcome::Failed),
            (429, NO_DELAY),
            (499, Outcome::Failed),
            (500, Outcome::Unknown),
            (502, Outcome::Unknown),
            (503, NO_DELAY),
            (504, Outcome::Unknown),
            (599, Outcome::Unknown),
            (600, Outcome::Unknown),
            (999, Outcome::Unknown),
        ];
        for (status, want) in rows {
            assert_eq!(
                http_response(*status, &HeaderMap::new(), now()),
                *want,
                "status {status}"
            );
        }
    }

    #[test]
    fn test_retry_after_delta_seconds() {
        for status in [429, 503] {
            let h = headers(&[("retry-after", "120")]);
            assert_eq!(http_response(status, &h, now()), retry(120));
        }
        assert_eq!(
            http_response(429, &headers(&[("retry-after", " 0 ")]), now()),
            retry(0)
        );
    }

    #[test]
    fn test_retry_after_http_date() {
        // now + 90 s, and a date already past.
        let h = headers(&[("retry-after", "Tue, 14 Nov 2023 22:14:50 GMT")]);
        assert_eq!(http_response(429, &h, now()), retry(90));
        let h = headers(&[("retry-after", "Tue, 14 Nov 2023 22:00:00 GMT")]);
        assert_eq!(http_response(503, &h, now()), retry(0));
    }

    #[test]
    fn test_rate_limit_reset_delta_and_unix_time() {
        let h = headers(&[("x-rate-limit-reset", "45")]);
        assert_eq!(http_response(429, &h, now()), retry(45));
        let h = headers(&[("x-rate-limit-reset", "1700000300")]);
        assert_eq!(http_response(429, &h, now()), retry(300));
        let h = headers(&[("x-rate-limit-reset", "1699999000")]);
        assert_eq!(http_response(429, &h, now()), retry(0), "past reset");
        // Exactly 10^9 is not "above": delta-seconds (and capped).
        let h = headers(&[("x-rate-limit-reset", "1000000000")]);
        assert_eq!(
            http_response(429, &h, now()),
            Outcome::Retry {
                after: Some(MAX_RETRY_DELAY)
            }
        );
    }

    #[test]
    fn test_retry_after_wins_over_rate_limit_reset() {
        let h = headers(&[("retry-after", "7"), ("x-rate-limit-reset", "45")]);
        assert_eq!(http_response(429, &h, now()), retry(7));
        let h = headers(&[
            ("retry-after", "Tue, 14 Nov 2023 22:13:30 GMT"),
            ("x-rate-limit-reset", "1700000300"),
        ]);
        assert_eq!(http_response(503, &h, now()), retry(10));
    }

    #[test]
    fn test_unusable_retry_after_falls_back() {
        let h = headers(&[("retry-after", "soon"), ("x-rate-limit-reset", "45")]);
        assert_eq!(http_response(429, &h, now()), retry(45));
        let h = headers(&[("retry-after", "-5")]);
        assert_eq!(http_response(429, &h, now()), NO_DELAY);
        let h = headers(&[("x-rate-limit-reset", "1.5")]);
        assert_eq!(http_response(429, &h, now()), NO_DELAY);
    }

    #[test]
    fn test_delay_is_capped() {
        let h = headers(&[("retry-after", "99999999")]);
        assert_eq!(
            http_response(429, &h, now()),
            Outcome::Retry {
                after: Some(MAX_RETRY_DELAY)
            }
        );
    }

    #[test]
    fn test_headers_ignored_outside_429_and_503() {
        let h = headers(&[("retry-after", "5")]);
        assert_eq!(http_response(500, &h, now()), Outcome::Unknown);
        assert_eq!(http_response(400, &h, now()), Outcome::Failed);
        assert_eq!(http_response(200, &h, now()), Outcome::Succeeded);
    }

    #[test]
    fn test_builder_error_is_retry() {
        // A request that cannot be built never leaves.
        let err = reqwest::Client::new()
            .get("http://127.0.0.1:9/")
            .header("bad header name", "v")
            .build()
            .expect_err("invalid header name");
        assert!(err.is_builder());
        assert_eq!(http_transport_error(&err), NO_DELAY);
    }

    #[test]
    fn test_smtp_rows() {
        use SmtpFailure::*;
        use SmtpStage::*;
        let rows: &[(SmtpStage, SmtpFailure, Outcome)] = &[
            (Connect, Reply(554), Outcome::Failed),
            (Connect, Reply(535), Outcome::Failed),
            (Connect, Reply(421), NO_DELAY),
            (Connect, Network, NO_DELAY),
            (Connect, Timeout, NO_DELAY),
            (Connect, Refused, Outcome::Failed),
            (Envelope, Reply(550), Outcome::Failed),
            (Envelope, Reply(451), NO_DELAY),
            (Envelope, Network, NO_DELAY),
            (Envelope, Timeout, NO_DELAY),
            (Envelope, Refused, Outcome::Failed),
            (Message, Reply(554), Outcome::Failed),
            (Message, Reply(451), Outcome::Unknown),
            (Message, Network, Outcome::Unknown),
            (Message, Timeout, Outcome::Unknown),
            (Envelope, Reply(250), Outcome::Unknown),
        ];
        for (stage, failure, want) in rows {
            assert_eq!(
                smtp_failure(*stage, *failure),
                *want,
                "{stage:?} {failure:?}"
            );
        }
    }

    #[test]
    fn test_outcome_words() {
        assert_eq!(Outcome::Succeeded.word(), "succeeded");
        assert_eq!(Outcome::Failed.word(), "failed");
        assert_eq!(NO_DELAY.word(), "retry");
        assert_eq!(Outcome::Unknown.word(), "unknown");
        assert_eq!(retry(3).retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(Outcome::Unknown.retry_after(), None);
    }
}
