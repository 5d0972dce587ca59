//! keyturnd's configuration: one struct, read from the environment.
//!
//! Precedence, highest first: command-line flag, environment variable, the
//! TOML file named by `KEYTURN_CONFIG`, built-in default. The TOML file uses
//! the field names below as keys (`listen = "127.0.0.1:8787"`,
//! `workers = 8`, …); an unknown key is an error, so a typo never silently
//! falls back to a default.
//!
//! Each setting is said once: its doc comment and its range are on its
//! field below; docs/keyturnd.md and docs/http.md carry the settings tables
//! for readers, and a test (`test_the_docs_tables_say_what_clap_does`)
//! checks every row against these fields (names, defaults, ranges).
//! [`Config::validate`] checks what no single field can (settings that
//! only make sense together) and returns the values it parsed on the way
//! ([`Checked`]), so nothing parses a setting twice.
//!
//! Secrets (`DATABASE_URL`, which may hold a password, the webhook secrets,
//! the SMTP URL, which may hold credentials, the JWT key, the RPC URL and
//! the VAPID key)
//! are [`Secret`]s: their `Debug` and `Display` print `[redacted]`, and
//! `--help` never shows their values.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use axum::http::HeaderValue;
use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use clap::{ArgAction, Parser, ValueEnum};

use crate::error::Error;

/// Time kept free at the end of every lease: a provider call must end this
/// long before the lease does, so that `complete` reaches the database before
/// the sweep can call the action `uncertain`.
pub const LEASE_SAFETY_MARGIN: Duration = Duration::from_secs(2);

/// What the lease round trip may take out of a lease before its jobs are
/// checked. The worker's deadline runs from before it asks for the lease, so
/// by the time a job is checked the pool, `BEGIN` and `keyturn.lease` have
/// already used some of it; a lease with no room for that would hand back
/// every job it got.
pub const LEASE_ROUND_TRIP_SLACK: Duration = Duration::from_secs(1);

/// Whether a leased job with `left` of its lease may be begun: a whole call
/// and the [`LEASE_SAFETY_MARGIN`] must fit.
pub fn enough_lease_left(left: Duration, call_timeout: Duration) -> bool {
    left >= call_timeout + LEASE_SAFETY_MARGIN
}

/// The shortest lease accepted: what [`enough_lease_left`] wants plus the
/// [`LEASE_ROUND_TRIP_SLACK`]. So every accepted configuration dispatches
/// whenever a lease round trip takes less than the slack; one that takes
/// longer is handed back with a growing delay, never in a loop.
pub fn min_lease(call_timeout: Duration) -> Duration {
    call_timeout + LEASE_SAFETY_MARGIN + LEASE_ROUND_TRIP_SLACK
}

/// The longest heartbeat period accepted: past an hour, a stall would go
/// unnoticed for longer than anyone would wait for a wake-up.
pub const MAX_HEARTBEAT_SECONDS: u64 = 3600;
/// Where the outcome journal lives unless `KEYTURN_JOURNAL_DIR` says
/// otherwise (systemd: `StateDirectory=keyturnd`).
pub const DEFAULT_JOURNAL_DIR: &str = "/var/lib/keyturnd/journal";

/// The prefix of a Standard Webhooks secret.
pub const STANDARD_SECRET_PREFIX: &str = "whsec_";

/// Standard Webhooks libraries decode secrets with or without padding.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The Standard Webhooks signing key of `KEYTURN_WEBHOOK_SECRET`: the
/// decoded rest of `whsec_<base64>`, otherwise the secret's UTF-8 bytes.
pub fn webhook_key(secret: &str) -> Result<Vec<u8>, Error> {
    let Some(encoded) = secret.strip_prefix(STANDARD_SECRET_PREFIX) else {
        return Ok(secret.as_bytes().to_vec());
    };
    match SECRET_BASE64.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(key),
        // The error text could quote the secret; say only what is wrong.
        _ => Err(Error::Config(
            "KEYTURN_WEBHOOK_SECRET starts with whsec_ but the rest is not a non-empty base64 \
             key (the Standard Webhooks secret format); fix it, or use a secret without the prefix"
                .into(),
        )),
    }
}

/// `KEYTURN_FRAME_ANCESTORS`' default: no other page may frame the card.
pub const DEFAULT_FRAME_ANCESTORS: &str = "'none'";

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

/// A Web Push VAPID key (RFC 8292): the base64url of a raw 32-byte P-256
/// private key, as `keyturnd vapid-keys` prints it, parsed by the `web-push`
/// crate that signs with it.
#[derive(Clone)]
pub struct VapidKey {
    builder: web_push::PartialVapidSignatureBuilder,
    public: String,
}

impl VapidKey {
    /// Parses `KEYTURN_VAPID_PRIVATE_KEY`; the error never quotes it.
    pub fn parse(private_key: &str) -> Result<Self, Error> {
        let builder = web_push::VapidSignatureBuilder::from_base64_no_sub(private_key.trim())
            .map_err(|_| {
                Error::Config(
                    "KEYTURN_VAPID_PRIVATE_KEY is not the base64url of a raw 32-byte P-256 private key                      (keyturnd vapid-keys makes one)"
                        .into(),
                )
            })?;
        let public = URL_SAFE_NO_PAD.encode(builder.get_public_key());
        Ok(VapidKey { builder, public })
    }

    /// A new key pair: (private key, public key), both base64url, the
    /// public key uncompressed (65 bytes), as browsers take it
    /// (`applicationServerKey`).
    pub fn generate() -> (Secret, String) {
        let private =
            URL_SAFE_NO_PAD.encode(jwt_simple::algorithms::ES256KeyPair::generate().to_bytes());
        // Read back by web-push, as KEYTURN_VAPID_PRIVATE_KEY will be.
        let public = match VapidKey::parse(&private) {
            Ok(key) => key.public,
            Err(_) => unreachable!("a key jwt-simple made is a P-256 private key"),
        };
        (Secret::from(private), public)
    }

    /// The public key, base64url: what a browser subscribes with.
    pub fn public_key(&self) -> &str {
        &self.public
    }

    /// A signature builder for one subscription.
    pub fn builder(&self) -> web_push::PartialVapidSignatureBuilder {
        self.builder.clone()
    }
}

impl fmt::Debug for VapidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VapidKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// The Content-Security-Policy of every answer, with `frame_ancestors` (a
/// `KEYTURN_FRAME_ANCESTORS` value: `'none'`, `'self'`, or
/// space-separated sources such as `https://app.example.com`).
///
/// Only `'self'` may load anything: no inline script or style, no other
/// origin, no plugin, no `<base>`, no form posted anywhere. The sources
/// are checked character by character so a setting can never add a
/// directive of its own.
pub fn csp_header(frame_ancestors: &str) -> Result<HeaderValue, Error> {
    let sources: Vec<&str> = frame_ancestors.split_ascii_whitespace().collect();
    let keyword = |s: &str| matches!(s, "'self'" | "'none'");
    let source = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~:/*".contains(c))
    };
    let ok = !sources.is_empty()
        && sources.iter().all(|s| keyword(s) || source(s))
        && (!sources.contains(&"'none'") || sources.len() == 1);
    if !ok {
        return Err(Error::Config(format!(
            "KEYTURN_FRAME_ANCESTORS={frame_ancestors:?} must be 'none', 'self', or space-separated \
             sources such as https://app.example.com"
        )));
    }
    let policy = format!(
        "default-src 'self'; base-uri 'none'; form-action 'none'; object-src 'none'; frame-ancestors {}",
        sources.join(" ")
    );
    HeaderValue::from_str(&policy)
        .map_err(|e| Error::Config(format!("KEYTURN_FRAME_ANCESTORS: {e}")))
}

/// A string that must never reach a log line or a `Debug` dump.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself. Call it only where the value is consumed (a
    /// connection, an HMAC key), never to print it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Every setting keyturnd reads. See the module docs for the table.
#[derive(Clone, Debug, Parser)]
pub struct Config {
    /// PostgreSQL connection string (URL or key=value).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Secret,

    /// Connection string of the LISTEN connection alone (default: DATABASE_URL);
    /// a direct one when DATABASE_URL goes through a transaction-mode pooler.
    #[arg(long, env = "KEYTURN_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<Secret>,

    /// Address of the health, readiness and metrics endpoints.
    #[arg(long, env = "KEYTURN_LISTEN", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,

    /// Endpoint of the `webhook` provider; unset disables it.
    #[arg(long, env = "KEYTURN_WEBHOOK_URL")]
    pub webhook_url: Option<url::Url>,

    /// Webhook signing secret: `whsec_<base64>` (Standard Webhooks) or any text.
    #[arg(long, env = "KEYTURN_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<Secret>,

    /// SMTP server of the `smtp` provider; unset disables it.
    #[arg(long, env = "KEYTURN_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<Secret>,

    /// Sender mailbox of the `smtp` provider, e.g. `keyturn <noreply@example.com>`;
    /// unset: [`Config::smtp_sender`]'s default.
    #[arg(long, env = "KEYTURN_SMTP_FROM")]
    pub smtp_from: Option<String>,

    /// Lease length asked of `keyturn.lease`, in seconds; at least the call
    /// timeout + 3 s ([`min_lease`]), which [`Config::validate`] checks.
    #[arg(long, env = "KEYTURN_LEASE_SECONDS", default_value_t = 30)]
    pub lease_seconds: u64,

    /// Period of `keyturn.sweep()`, in seconds.
    #[arg(long, env = "KEYTURN_SWEEP_SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_seconds: u64,

    /// Provider calls in flight at most; the lease step's `u32` and `i32`
    /// counts rely on the bound. It bounds throughput: with calls of L
    /// seconds, at most `workers` ÷ L actions a second; and a lease step's
    /// price is mostly fixed, so the jobs a step carries (at most the free
    /// workers) set what an action costs the database (docs/benchmarks.md):
    /// a provider that takes 64 requests at once drains several times as
    /// fast at 64. The default, 8, is what keyturn promises.
    #[arg(long, env = "KEYTURN_WORKERS", default_value_t = 8,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub workers: usize,

    /// Size of the dispatcher's connection pool: lease steps, completions,
    /// the sweep, the heartbeat, the card sessions `/rpc` redeems, and the
    /// reads a call makes before it starts (a notification's message,
    /// attachments, an upstream tool's definition). No connection is held
    /// across a provider call, so it need not grow with the workers.
    #[arg(long, env = "KEYTURN_DB_CONNECTIONS", default_value_t = 16,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=1024))]
    pub db_connections: usize,

    /// Lease poll period in milliseconds: at least one poll a second, since
    /// retries and lapsed leases send no notification.
    #[arg(long, env = "KEYTURN_POLL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub poll_ms: u64,

    /// Milliseconds a wake-up waits for calls to end before leasing, while
    /// more than half the workers are busy (0 = never); it delays leasing,
    /// so it stays short.
    #[arg(long, env = "KEYTURN_LEASE_LINGER_MS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(0..=100))]
    pub lease_linger_ms: u64,

    /// Lease steps in flight at most. A step is four round trips (BEGIN,
    /// lease, begin, COMMIT); with one at a time, the slots that free while
    /// it runs wait for it to end; a second step leases them meanwhile (the
    /// drain 1.1–1.2× as fast at 64 workers, docs/benchmarks.md). 1 is 0.2.0's
    /// one step at a time.
    #[arg(long, env = "KEYTURN_LEASE_STEPS", default_value_t = 2,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=8))]
    pub lease_steps: usize,

    /// Upper bound of one provider call (a webhook request or an SMTP
    /// transaction), in seconds.
    #[arg(long, env = "KEYTURN_HTTP_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_timeout_seconds: u64,

    /// Seconds SIGTERM waits for calls in flight before exiting.
    #[arg(long, env = "KEYTURN_SHUTDOWN_SECONDS", default_value_t = 30)]
    pub shutdown_seconds: u64,

    /// `LISTEN keyturn_dispatch` for prompt wake-ups; false polls only.
    #[arg(long, env = "KEYTURN_LISTEN_NOTIFY", default_value_t = true, action = ArgAction::Set)]
    pub listen_notify: bool,

    /// Seconds between heartbeat NOTIFYs through the pool, each expected on the
    /// LISTEN connection before the next; 0 turns stall detection off; past
    /// an hour a stall would go unnoticed for too long.
    #[arg(long, env = "KEYTURN_NOTIFY_HEARTBEAT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=MAX_HEARTBEAT_SECONDS))]
    pub notify_heartbeat_seconds: u64,

    /// Name passed to `keyturn.lease` (default `keyturnd-<host>-<pid>`).
    #[arg(long, env = "KEYTURN_WORKER_NAME")]
    pub worker_name: Option<String>,

    /// Directory of the outcome journal (one keyturnd per directory).
    #[arg(long, env = "KEYTURN_JOURNAL_DIR", default_value = DEFAULT_JOURNAL_DIR)]
    pub journal_dir: PathBuf,

    /// Journal observed outcomes until the database has them; false opts out.
    #[arg(long, env = "KEYTURN_JOURNAL", default_value_t = true, action = ArgAction::Set)]
    pub journal: bool,

    /// Log format.
    #[arg(long, env = "KEYTURN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// HS256 key of the people's JWTs; turns `/rpc` on.
    #[arg(long, env = "KEYTURN_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<Secret>,

    /// JWKS file with the RS256 / ES256 keys of the people's JWTs; turns `/rpc` on.
    #[arg(long, env = "KEYTURN_JWT_JWKS")]
    pub jwt_jwks: Option<PathBuf>,

    /// The `aud` every JWT must carry; unset = not checked.
    #[arg(long, env = "KEYTURN_JWT_AUD")]
    pub jwt_aud: Option<String>,

    /// Database roles a JWT's `role` claim may select, comma-separated.
    #[arg(long, env = "KEYTURN_JWT_ROLES", value_delimiter = ',')]
    pub jwt_roles: Vec<String>,

    /// Connection string of `/rpc`: a NOINHERIT login that may SET ROLE to the JWT roles.
    #[arg(long, env = "KEYTURN_RPC_DATABASE_URL", hide_env_values = true)]
    pub rpc_database_url: Option<Secret>,

    /// The database role a card session's calls run as when its link code
    /// was made by the dispatcher (a notification); one of KEYTURN_JWT_ROLES.
    #[arg(long, env = "KEYTURN_CARD_ROLE")]
    pub card_role: Option<String>,

    /// Size of the `/rpc` connection pool.
    #[arg(long, env = "KEYTURN_RPC_CONNECTIONS", default_value_t = 8,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub rpc_connections: usize,

    /// Seconds a client has to send a whole request head (an idle keep-alive
    /// connection: its next one) before keyturnd closes the connection.
    #[arg(long, env = "KEYTURN_SERVER_HEADER_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=300))]
    pub server_header_seconds: u64,

    /// Seconds one HTTP request may take, its body included, before it is
    /// answered 408.
    #[arg(long, env = "KEYTURN_SERVER_REQUEST_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub server_request_seconds: u64,

    /// HTTP connections open at most; past it a new one is closed at once.
    #[arg(long, env = "KEYTURN_SERVER_CONNECTIONS", default_value_t = 256,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65536))]
    pub server_connections: usize,

    /// `frame-ancestors` sources of the pages (e.g. `https://app.example.com`).
    #[arg(long, env = "KEYTURN_FRAME_ANCESTORS", default_value = DEFAULT_FRAME_ANCESTORS)]
    pub frame_ancestors: String,

    /// Database roles an agent JWT's `role` claim may select on `/mcp`,
    /// comma-separated; turns `/mcp` on.
    #[arg(long, env = "KEYTURN_MCP_ROLES", value_delimiter = ',')]
    pub mcp_roles: Vec<String>,

    /// Connection string of `/mcp`: a NOINHERIT login that may SET ROLE to the MCP roles.
    #[arg(long, env = "KEYTURN_MCP_DATABASE_URL", hide_env_values = true)]
    pub mcp_database_url: Option<Secret>,

    /// Size of the `/mcp` connection pool.
    #[arg(long, env = "KEYTURN_MCP_CONNECTIONS", default_value_t = 8,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub mcp_connections: usize,

    /// Base URL of every link keyturnd builds, e.g. `https://keyturn.example.com`.
    #[arg(long, env = "KEYTURN_PUBLIC_URL")]
    pub public_url: Option<url::Url>,

    /// Standard Webhooks secret (`whsec_…`) of notification webhooks whose
    /// channel has none of its own.
    #[arg(long, env = "KEYTURN_NOTIFY_WEBHOOK_SECRET", hide_env_values = true)]
    pub notify_webhook_secret: Option<Secret>,

    /// Web Push VAPID private key: base64url of a raw 32-byte P-256 key
    /// (`keyturnd vapid-keys`); turns the webpush channel on.
    #[arg(long, env = "KEYTURN_VAPID_PRIVATE_KEY", hide_env_values = true)]
    pub vapid_private_key: Option<Secret>,

    /// The VAPID `sub`, a `mailto:` or `https:` contact for push services
    /// (default: KEYTURN_PUBLIC_URL).
    #[arg(long, env = "KEYTURN_VAPID_SUBJECT")]
    pub vapid_subject: Option<String>,

    /// Networks besides public addresses a notification may connect to,
    /// comma-separated CIDRs (e.g. `127.0.0.0/8`).
    #[arg(long, env = "KEYTURN_NOTIFY_ALLOW_NETWORKS", value_delimiter = ',')]
    pub notify_allow_networks: Vec<ipnet::IpNet>,

    /// Whether a webhook URL or push endpoint that names loopback
    /// (`127.0.0.1`, `[::1]`, `localhost`, as `set_notify` takes plain http
    /// to) is delivered to this host; false refuses them (production).
    #[arg(long, env = "KEYTURN_NOTIFY_LOOPBACK", default_value_t = true, action = ArgAction::Set)]
    pub notify_loopback: bool,

    /// Sessions `/mcp` holds at most (legacy MCP revisions open one per
    /// client); past it a new one is refused (503) until one ends.
    #[arg(long, env = "KEYTURN_MCP_MAX_SESSIONS", default_value_t = 1000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub mcp_max_sessions: usize,

    /// Whether `/mcp` hands a write's card link to the client by URL
    /// elicitation; false leaves proposals in the person's queue and
    /// notifications (for MCP clients not trusted with a link).
    #[arg(long, env = "KEYTURN_MCP_ELICITATION", default_value_t = true, action = ArgAction::Set)]
    pub mcp_elicitation: bool,

    /// Seconds between discoveries of the upstream MCP servers' tools.
    #[arg(long, env = "KEYTURN_MCP_REFRESH_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub mcp_refresh_seconds: u64,

    /// The upstream MCP servers: `[[mcp_upstream]]` tables of the TOML file
    /// ([`read_upstreams`]), never a flag or a variable.
    #[arg(skip)]
    pub mcp_upstreams: Vec<Upstream>,
}

/// One `[[mcp_upstream]]` of the TOML file, its header values resolved.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Its name: the prefix of its tools in keyturn (`<name>.<tool>`).
    pub name: String,
    /// Its Streamable HTTP endpoint.
    pub url: url::Url,
    /// HTTP headers sent to it (credentials: configuration only, never
    /// logged, never a param, never in a receipt).
    pub headers: Vec<(String, Secret)>,
    /// Whether its `readOnlyHint: true` makes a tool a read tool.
    pub trust_annotations: bool,
}

/// An `[[mcp_upstream]]` as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamToml {
    name: String,
    url: String,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    trust_annotations: bool,
}

/// The TOML file's key for the upstream MCP servers.
const UPSTREAM_KEY: &str = "mcp_upstream";

/// The `[[mcp_upstream]]` tables of the TOML file at `path`; a header value
/// `env:NAME` is read from the environment (unset: an error naming the
/// variable, never its value).
pub fn read_upstreams(path: &Path) -> Result<Vec<Upstream>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e| Error::Config(format!("{} is not valid TOML: {e}", path.display())))?;
    let Some(raw) = table.remove(UPSTREAM_KEY) else {
        return Ok(Vec::new());
    };
    let raw: Vec<UpstreamToml> = raw.try_into().map_err(|e| {
        Error::Config(format!(
            "{}: [[{UPSTREAM_KEY}]] takes name, url, headers and trust_annotations: {e}",
            path.display()
        ))
    })?;
    let mut out = Vec::with_capacity(raw.len());
    for u in raw {
        let bad = |why: String| Error::Config(format!("[[{UPSTREAM_KEY}]] {:?}: {why}", u.name));
        // The database's rule for an upstream's name (keyturn._name_ok, one
        // part), said here too so that a bad file fails at start rather than
        // at every discovery.
        if !u.name.starts_with(|c: char| c.is_ascii_alphabetic())
            || !u
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            || u.name.len() > 30
        {
            return Err(bad(
                "name must be 1 to 30 ASCII letters, digits, underscores and hyphens, starting with a letter".into(),
            ));
        }
        // Apart in case only, their tools would be a case apart (which the
        // database refuses).
        if out
            .iter()
            .any(|o: &Upstream| o.name.eq_ignore_ascii_case(&u.name))
        {
            return Err(bad("two upstreams have this name (in some case)".into()));
        }
        let url = url::Url::parse(&u.url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| bad("url must be an http:// or https:// URL".into()))?;
        let mut headers = Vec::with_capacity(u.headers.len());
        for (name, value) in &u.headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(bad(format!(
                    "header name {name:?} is not an HTTP header name"
                )));
            }
            let value = match value.strip_prefix("env:") {
                Some(var) => std::env::var(var)
                    .map_err(|_| bad(format!("header {name} names env:{var}, which is not set")))?,
                None => value.clone(),
            };
            if HeaderValue::from_str(&value).is_err() {
                // Never the value: it is a credential.
                return Err(bad(format!(
                    "header {name}'s value is not a valid HTTP header value"
                )));
            }
            headers.push((name.clone(), Secret(value)));
        }
        out.push(Upstream {
            name: u.name,
            url,
            headers,
            trust_annotations: u.trust_annotations,
        });
    }
    Ok(out)
}

/// Whether this process can create `dir` and write in it.
fn writable(dir: &Path) -> bool {
    let probe = dir.join(".keyturnd-probe");
    let ok = std::fs::create_dir_all(dir).is_ok() && std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

impl Config {
    /// Where the outcome journal lives: `KEYTURN_JOURNAL_DIR`; left at its
    /// default (/var/lib/keyturnd/journal) by a user who may not create it,
    /// the user's state directory (`$XDG_STATE_HOME`, else
    /// `~/.local/state`)/keyturnd/journal instead, with a warning, so that a
    /// keyturnd started by hand with only the documented settings runs.
    pub fn journal_path(&self) -> PathBuf {
        if self.journal_dir != Path::new(DEFAULT_JOURNAL_DIR) || writable(&self.journal_dir) {
            return self.journal_dir.clone();
        }
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|s| !s.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/state"))
            });
        match state {
            Some(state) => {
                let dir = state.join("keyturnd/journal");
                tracing::warn!(
                    default = DEFAULT_JOURNAL_DIR,
                    dir = %dir.display(),
                    "the default journal directory cannot be created by this user: journaling in the user's state directory; set KEYTURN_JOURNAL_DIR"
                );
                dir
            }
            None => self.journal_dir.clone(),
        }
    }

    /// The `smtp` provider's sender: `KEYTURN_SMTP_FROM`, else
    /// `keyturn@<KEYTURN_PUBLIC_URL's host>` (or `keyturn@localhost`), so
    /// that `KEYTURN_SMTP_URL` alone starts the adapter; `None` without it.
    pub fn smtp_sender(&self) -> Option<String> {
        self.smtp_url.as_ref()?;
        Some(self.smtp_from.clone().unwrap_or_else(|| {
            let host = self
                .public_url
                .as_ref()
                .and_then(|u| u.host_str().map(str::to_owned))
                .filter(|h| !h.is_empty() && !h.starts_with('['))
                .unwrap_or_else(|| "localhost".to_owned());
            format!("keyturn@{host}")
        }))
    }

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

    /// The VAPID `sub`: `KEYTURN_VAPID_SUBJECT`, else `KEYTURN_PUBLIC_URL`.
    pub fn vapid_subject(&self) -> String {
        self.vapid_subject.clone().unwrap_or_else(|| {
            self.public_url
                .as_ref()
                .map(|u| u.origin().ascii_serialization())
                .unwrap_or_default()
        })
    }

    /// Whether `/rpc` is on: a JWT key is configured.
    pub fn rpc_enabled(&self) -> bool {
        self.jwt_secret.is_some() || self.jwt_jwks.is_some()
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

    /// Whether `/mcp` is on: MCP roles are configured (an empty
    /// `KEYTURN_MCP_ROLES` is none). Off, the rest of the MCP settings are
    /// ignored: keyturnd says so at start ([`Config::mcp_ignored`]).
    pub fn mcp_enabled(&self) -> bool {
        self.mcp_roles.iter().any(|r| !r.trim().is_empty())
    }

    /// With `/mcp` off, the MCP settings that were given anyway, to warn of.
    pub fn mcp_ignored(&self) -> Option<&'static str> {
        (!self.mcp_enabled() && self.mcp_database_url.is_some()).then_some(
            "/mcp is off: KEYTURN_MCP_DATABASE_URL is set without KEYTURN_MCP_ROLES, and is ignored; set KEYTURN_MCP_ROLES to serve MCP",
        )
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

    /// The lease asked of `keyturn.lease`.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    /// The upper bound of one provider call.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_secs(self.http_timeout_seconds)
    }

    /// The connection string of the `LISTEN` connection.
    pub fn listen_url(&self) -> Secret {
        self.listen_database_url
            .clone()
            .unwrap_or_else(|| self.database_url.clone())
    }

    /// The heartbeat period, `None` when stall detection is off (or there
    /// is no `LISTEN` to check).
    pub fn notify_heartbeat(&self) -> Option<Duration> {
        (self.listen_notify && self.notify_heartbeat_seconds > 0)
            .then(|| Duration::from_secs(self.notify_heartbeat_seconds))
    }

    /// The worker name passed to `keyturn.lease`.
    pub fn worker_name(&self) -> String {
        match &self.worker_name {
            Some(name) if !name.is_empty() => name.clone(),
            _ => {
                // /proc is Linux-only; elsewhere the pid alone still tells
                // two processes apart in the audit trail.
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_default();
                if host.is_empty() {
                    format!("keyturnd-{}", std::process::id())
                } else {
                    format!("keyturnd-{host}-{}", std::process::id())
                }
            }
        }
    }
}

/// Parses `P` (the `Config` itself or a CLI that flattens it) from `args`
/// and the environment, using the TOML file at `file` (if any) as defaults.
///
/// Clap errors (including `--help`) come back as `Err(clap::Error)` so the
/// caller can `exit()` with clap's formatting; file errors as
/// [`Error::Config`].
pub fn parse_with_file<P: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    file: Option<&Path>,
) -> Result<Result<P, clap::Error>, Error> {
    let cmd = command_with_file_defaults(P::command(), file)?;
    let matches = match cmd.try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => return Ok(Err(e)),
    };
    Ok(P::from_arg_matches(&matches))
}

/// Applies the TOML file at `file` (if any) to `cmd` as defaults.
fn command_with_file_defaults(
    mut cmd: clap::Command,
    file: Option<&Path>,
) -> Result<clap::Command, Error> {
    if let Some(path) = file {
        for (key, value) in read_toml_defaults(path)? {
            if !cmd.get_arguments().any(|a| a.get_id() == key.as_str()) {
                return Err(Error::Config(format!(
                    "{}: unknown key `{key}` (keys are the long option names with `_`, e.g. `lease_seconds`)",
                    path.display()
                )));
            }
            // A default from the file must satisfy `required`, and it stays
            // below the environment and the command line in clap's order.
            cmd = cmd.mut_arg(key.as_str(), |a| a.default_value(value).required(false));
        }
    }
    Ok(cmd)
}

/// Reads the TOML file into `(key, value-as-text)` pairs. Only flat scalar
/// values are accepted: each one becomes the default of the option of the
/// same name.
fn read_toml_defaults(path: &Path) -> Result<Vec<(String, String)>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| Error::Config(format!("{} is not valid TOML: {e}", path.display())))?;
    let mut out = Vec::with_capacity(table.len());
    for (key, value) in table {
        if key == UPSTREAM_KEY {
            // Tables, read by read_upstreams.
            continue;
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            _ => {
                return Err(Error::Config(format!(
                    "{}: `{key}` must be a string, number or boolean",
                    path.display()
                )))
            }
        };
        out.push((key, text));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};
    use std::io::Write;

    fn parse(args: &[&str], file: Option<&Path>) -> Result<Config, String> {
        let mut all = vec!["keyturnd"];
        all.extend_from_slice(args);
        // The test process may run with DATABASE_URL & co. set (CI does):
        // strip every `env` so only the arguments and the file count.
        let mut cmd = Config::command();
        let ids: Vec<String> = cmd
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect();
        for id in ids {
            cmd = cmd.mut_arg(id, |a| a.env(None));
        }
        let cmd = command_with_file_defaults(cmd, file).map_err(|e| e.to_string())?;
        let matches = cmd.try_get_matches_from(all).map_err(|e| e.to_string())?;
        Config::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    fn toml_file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(text.as_bytes()).expect("write temp file");
        f
    }

    #[test]
    fn test_standard_key_of_each_secret_form() {
        assert_eq!(
            webhook_key("s3cret-🔑").expect("any text"),
            "s3cret-🔑".as_bytes(),
            "no prefix: the UTF-8 bytes"
        );
        let padded = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(b"0123456789")
        );
        let unpadded = padded.trim_end_matches('=').to_owned();
        assert_ne!(padded, unpadded);
        for s in [padded, unpadded] {
            assert_eq!(webhook_key(&s).expect("decodes"), b"0123456789");
        }
        for rest in ["", "not base64!", "@@@@"] {
            let err = webhook_key(&format!("whsec_{rest}"))
                .expect_err("refused")
                .to_string();
            assert!(err.contains("KEYTURN_WEBHOOK_SECRET"), "{err}");
            assert!(rest.is_empty() || !err.contains(rest), "quoted: {err}");
        }
    }

    #[test]
    fn test_frame_ancestors_accepts_sources_and_refuses_directives() {
        for ok in [
            "'none'",
            "'self'",
            "https://app.example.com 'self'",
            "https://*.example.com:8443",
        ] {
            let csp = csp_header(ok).expect(ok);
            assert!(csp.to_str().unwrap().starts_with("default-src 'self';"));
            assert!(csp
                .to_str()
                .unwrap()
                .ends_with(&format!("frame-ancestors {ok}")));
        }
        for bad in [
            "",
            "https://a; script-src *",
            "'none' 'self'",
            "'unsafe-inline'",
            "a,b",
            "x\u{0}y",
        ] {
            assert!(csp_header(bad).is_err(), "{bad:?}");
        }
        let folded = csp_header("https://a.example\r\nhttps://b.example").expect("valid");
        assert!(folded
            .to_str()
            .unwrap()
            .ends_with("frame-ancestors https://a.example https://b.example"));
    }

    /// One settings row of a docs table: its names, its default cell and
    /// its meaning cell.
    struct DocRow {
        file: &'static str,
        names: Vec<String>,
        default: String,
        meaning: String,
    }

    fn doc_rows() -> Vec<DocRow> {
        let mut rows = Vec::new();
        for file in ["keyturnd.md", "http.md"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs")
                .join(file);
            let text = std::fs::read_to_string(&path).expect("the docs are beside the crate");
            for line in text.lines() {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                // `| name | default | meaning |` splits into 5 cells.
                if cells.len() < 5 {
                    continue;
                }
                let names: Vec<String> = cells[1]
                    .split(", ")
                    .map(|n| n.trim_matches('`').to_owned())
                    .collect();
                let is_setting = |n: &String| {
                    (n.starts_with("KEYTURN_") || n == "DATABASE_URL")
                        && n.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                };
                if names.iter().all(is_setting) {
                    rows.push(DocRow {
                        file,
                        names,
                        default: cells[2].trim_matches('`').to_owned(),
                        meaning: cells[3].to_owned(),
                    });
                }
            }
        }
        rows
    }

    /// The range a docs row states: `(lo–hi` or `(at least lo`.
    fn stated_range(meaning: &str) -> Option<(u64, Option<u64>)> {
        let number = |s: &str| -> Option<u64> {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        for (i, _) in meaning.match_indices('(') {
            let rest = &meaning[i + 1..];
            if let Some(at_least) = rest.strip_prefix("at least ") {
                if let Some(lo) = number(at_least) {
                    return Some((lo, None));
                }
            }
            if let Some(lo) = number(rest) {
                let after = &rest[lo.to_string().len()..];
                if let Some(hi) = after.strip_prefix('–').and_then(number) {
                    return Some((lo, Some(hi)));
                }
            }
        }
        None
    }

    /// Whether clap takes `value` for the option of `id`.
    fn takes(id: &str, value: &str) -> bool {
        let flag = format!("--{}", id.replace('_', "-"));
        let mut args = vec!["--database-url", "postgres://x"];
        if id != "database_url" {
            args.extend_from_slice(&[flag.as_str(), value]);
        }
        parse(&args, None).is_ok()
    }

    #[test]
    fn test_the_docs_tables_say_what_clap_does() {
        let rows = doc_rows();
        let cmd = Config::command();
        let mut documented: Vec<String> = Vec::new();
        for arg in cmd.get_arguments() {
            let Some(env) = arg.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            let found: Vec<&DocRow> = rows
                .iter()
                .filter(|r| r.names.iter().any(|n| n == env))
                .collect();
            assert_eq!(
                found.len(),
                1,
                "{env} must have exactly one row in docs/keyturnd.md or docs/http.md"
            );
            let row = found[0];
            documented.push(env.to_owned());
            let id = arg.get_id().as_str();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            match defaults.as_slice() {
                [default] => assert_eq!(
                    &row.default, default,
                    "{env}'s default in docs/{}",
                    row.file
                ),
                _ if arg.is_required_set() => assert!(
                    row.default.starts_with("required"),
                    "{env} is required; docs/{} says {:?}",
                    row.file,
                    row.default
                ),
                _ => assert!(
                    row.default.parse::<f64>().is_err() && row.default != "true",
                    "{env} has no default in clap; docs/{} gives one",
                    row.file
                ),
            }
            // A number setting: its stated range is exactly what clap takes.
            let numeric = defaults.len() == 1 && defaults[0].parse::<u64>().is_ok();
            if !numeric {
                continue;
            }
            match stated_range(&row.meaning) {
                Some((lo, hi)) => {
                    assert!(takes(id, &lo.to_string()), "{env} takes {lo}");
                    if lo > 0 {
                        assert!(!takes(id, &(lo - 1).to_string()), "{env} refuses {}", lo - 1);
                    }
                    match hi {
                        Some(hi) => {
                            assert!(takes(id, &hi.to_string()), "{env} takes {hi}");
                            assert!(!takes(id, &(hi + 1).to_string()), "{env} refuses {}", hi + 1);
                        }
                        None => assert!(takes(id, "1000000"), "{env} has no upper bound"),
                    }
                }
                None => assert!(
                    takes(id, "0") && takes(id, "1000000"),
                    "{env} has a range in clap that docs/{} does not state as (lo–hi) or (at least lo)",
                    row.file
                ),
            }
        }
        for row in &rows {
            for name in &row.names {
                assert!(
                    documented.contains(name) || name == "KEYTURN_CONFIG",
                    "docs/{} documents {name}, which keyturnd does not read",
                    row.file
                );
            }
        }
    }

    #[test]
    fn test_defaults_match_the_contract() {
        let c = parse(&["--database-url", "postgres://x"], None).expect("parses");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8787");
        assert_eq!(c.lease_seconds, 30);
        assert_eq!(c.sweep_seconds, 5);
        assert_eq!(c.workers, 8);
        assert_eq!(c.db_connections, 16);
        assert_eq!(c.poll_ms, 1000);
        assert_eq!(c.lease_linger_ms, 2);
        assert_eq!(c.lease_steps, 2);
        assert_eq!(c.mcp_refresh_seconds, 300);
        assert!(c.listen_notify);
        assert!(!c.rpc_enabled(), "/rpc is off by default");
        assert_eq!(c.frame_ancestors, "'none'");
        assert_eq!(
            c.listen_url().expose(),
            "postgres://x",
            "LISTEN on the pool's URL"
        );
        assert_eq!(c.notify_heartbeat(), Some(Duration::from_secs(10)));
        c.validate().expect("defaults are valid");
    }

    #[test]
    fn test_listen_url_and_heartbeat_follow_their_settings() {
        let c = parse(
            &[
                "--database-url",
                "postgres://pooler:6432/db",
                "--listen-database-url",
                "postgres://direct:5432/db",
                "--notify-heartbeat-seconds",
                "0",
            ],
            None,
        )
        .expect("parses");
        c.validate().expect("valid");
        assert_eq!(c.listen_url().expose(), "postgres://direct:5432/db");
        assert_eq!(c.notify_heartbeat(), None, "0 turns the heartbeat off");
        let c = parse(
            &["--database-url", "postgres://x", "--listen-notify", "false"],
            None,
        )
        .expect("parses");
        assert_eq!(c.notify_heartbeat(), None, "no LISTEN, nothing to check");
    }

    #[test]
    fn test_jwt_roles_are_a_comma_separated_list() {
        let c = parse(
            &[
                "--database-url",
                "postgres://x",
                "--jwt-secret",
                "0123456789abcdef0123456789abcdef",
                "--rpc-database-url",
                "postgres://auth@h/db",
                "--jwt-roles",
                "web_human,web_operator",
            ],
            None,
        )
        .expect("parses");
        assert_eq!(c.jwt_roles, ["web_human", "web_operator"]);
        assert!(c.rpc_enabled());
        c.validate().expect("valid");
        let dump = format!("{c:?}");
        assert!(!dump.contains("0123456789abcdef") && !dump.contains("auth@h"));
    }

    #[test]
    fn test_file_fills_in_and_the_command_line_overrides_it() {
        let f =
            toml_file("database_url = \"postgres://file\"\nworkers = 3\nlisten_notify = false\n");
        let c = parse(&[], Some(f.path())).expect("file supplies database_url");
        assert_eq!(c.database_url.expose(), "postgres://file");
        assert_eq!(c.workers, 3);
        assert!(!c.listen_notify);
        let c = parse(&["--workers", "5"], Some(f.path())).expect("parses");
        assert_eq!(
            c.workers, 5,
            "the command line (like the environment) beats the file"
        );
    }

    #[test]
    fn test_upstreams_are_read_from_the_file_with_env_headers() {
        std::env::set_var("KT_CONFIG_TEST_UPSTREAM_TOKEN", "Bearer s3cr3t-upstream");
        let f = toml_file(
            "database_url = \"postgres://x\"\n\
             [[mcp_upstream]]\nname = \"github\"\nurl = \"https://mcp.example.com/mcp\"\n\
             headers = { Authorization = \"env:KT_CONFIG_TEST_UPSTREAM_TOKEN\", X-Team = \"core\" }\n\
             trust_annotations = true\n\
             [[mcp_upstream]]\nname = \"Slack-eu\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
        );
        let c = parse(&[], Some(f.path())).expect("the tables do not disturb the settings");
        assert_eq!(c.database_url.expose(), "postgres://x");
        let ups = read_upstreams(f.path()).expect("reads");
        assert_eq!(ups.len(), 2);
        assert_eq!(ups[0].name, "github");
        assert_eq!(ups[1].name, "Slack-eu");
        assert!(ups[0].trust_annotations && !ups[1].trust_annotations);
        assert_eq!(ups[0].headers[0].0, "Authorization");
        assert_eq!(ups[0].headers[0].1.expose(), "Bearer s3cr3t-upstream");
        assert!(
            !format!("{ups:?}").contains("s3cr3t"),
            "headers are secrets"
        );
        for (bad, needle) in [
            ("name = \"Git Hub\"\nurl = \"https://a/\"", "name must be"),
            ("name = \"1up\"\nurl = \"https://a/\"", "name must be"),
            ("name = \"a.b\"\nurl = \"https://a/\"", "name must be"),
            ("name = \"-a\"\nurl = \"https://a/\"", "name must be"),
            ("name = \"a23456789012345678901234567890x\"\nurl = \"https://a/\"", "name must be"),
            (
                "name = \"a\"\nurl = \"https://a/\"\n[[mcp_upstream]]\nname = \"A\"\nurl = \"https://b/\"",
                "two upstreams",
            ),
            ("name = \"a\"\nurl = \"ftp://a/\"", "url must be"),
            ("name = \"a\"\nurl = \"https://a/\"\nheaders = { A = \"env:KT_CONFIG_TEST_UNSET_VAR\" }", "KT_CONFIG_TEST_UNSET_VAR"),
            ("name = \"a\"\nurl = \"https://a/\"\ntrust = true", "takes name"),
        ] {
            let f = toml_file(&format!("[[mcp_upstream]]\n{bad}\n"));
            let err = read_upstreams(f.path()).expect_err(bad).to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn test_mcp_needs_a_jwt_key_and_a_login_of_its_own() {
        let key = [
            "--jwt-secret",
            "0123456789abcdef0123456789abcdef",
            "--rpc-database-url",
            "postgres://rpc@h/db",
            "--jwt-roles",
            "web_human",
        ];
        let with = |extra: &[&str]| {
            let mut args = vec!["--database-url", "postgres://disp@h/db"];
            args.extend_from_slice(extra);
            parse(&args, None)
                .expect("parses")
                .validate()
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(with(&["--mcp-roles", "agent_mcp"])
            .unwrap_err()
            .contains("JWT key"));
        let mut a = key.to_vec();
        a.extend_from_slice(&["--mcp-roles", "agent_mcp"]);
        assert!(with(&a)
            .unwrap_err()
            .contains("KEYTURN_MCP_DATABASE_URL is required"));
        let mut b = a.clone();
        b.extend_from_slice(&["--mcp-database-url", "postgres://rpc@h/db"]);
        assert!(with(&b).unwrap_err().contains("login of its own"));
        let mut c = a.clone();
        c.extend_from_slice(&["--mcp-database-url", "postgres://mcp@h/db"]);
        with(&c).expect("valid");
        // Off unless KEYTURN_MCP_ROLES names a role: the login alone, or
        // an empty list, leaves /mcp off (with a warning), not keyturnd.
        with(&["--mcp-database-url", "postgres://mcp@h/db"]).expect("off, not refused");
        with(&[
            "--mcp-roles",
            "",
            "--mcp-database-url",
            "postgres://mcp@h/db",
        ])
        .expect("an empty list is none");
        let off = parse(
            &[
                "--database-url",
                "postgres://disp@h/db",
                "--mcp-database-url",
                "postgres://mcp@h/db",
            ],
            None,
        )
        .expect("parses");
        assert!(!off.mcp_enabled());
        assert!(off.mcp_ignored().is_some());
        let mut d = key.to_vec();
        d.extend_from_slice(&[
            "--mcp-roles",
            "agent_mcp,",
            "--mcp-database-url",
            "postgres://mcp@h/db",
        ]);
        assert!(with(&d).unwrap_err().contains("none empty"));
    }

    #[test]
    fn test_unknown_file_key_is_refused() {
        let f = toml_file("database_url = \"x\"\nworkerz = 3\n");
        let err = parse(&[], Some(f.path())).expect_err("typo must not pass");
        assert!(err.contains("workerz"), "{err}");
    }

    #[test]
    fn test_secrets_never_show_in_debug() {
        let c = parse(
            &[
                "--database-url",
                "postgres://u:hunter2@h/db",
                "--webhook-url",
                "http://127.0.0.1:1/",
                "--webhook-secret",
                "s3cr3t-value",
                "--smtp-url",
                "smtp://user:pw-xyz@127.0.0.1:2525",
                "--smtp-from",
                "k@example.com",
                "--listen-database-url",
                "postgres://u:listen-pw@h/db",
            ],
            None,
        )
        .expect("parses");
        let dump = format!("{c:?}");
        for needle in ["hunter2", "s3cr3t-value", "pw-xyz", "listen-pw"] {
            assert!(!dump.contains(needle), "{needle} leaked: {dump}");
        }
        assert!(dump.contains("[redacted]"));
    }

    /// Conformance: `KEYTURN_SMTP_URL` alone starts the smtp adapter (it
    /// refused to start without `KEYTURN_SMTP_FROM`).
    #[test]
    fn test_the_smtp_url_alone_has_a_default_sender() {
        let url = [
            "--database-url",
            "postgres://x",
            "--smtp-url",
            "smtp://127.0.0.1:25",
        ];
        let c = parse(&url, None).expect("parses");
        assert_eq!(c.smtp_sender().as_deref(), Some("keyturn@localhost"));
        let c = parse(
            &[
                &url[..],
                &["--public-url", "https://approve.acme.example/k"],
            ]
            .concat(),
            None,
        )
        .expect("parses");
        assert_eq!(
            c.smtp_sender().as_deref(),
            Some("keyturn@approve.acme.example")
        );
        let c = parse(
            &[&url[..], &["--smtp-from", "ops <ops@acme.example>"]].concat(),
            None,
        )
        .expect("parses");
        assert_eq!(c.smtp_sender().as_deref(), Some("ops <ops@acme.example>"));
        let c = parse(&["--database-url", "postgres://x"], None).expect("parses");
        assert_eq!(c.smtp_sender(), None, "no adapter, no sender");
    }

    #[test]
    fn test_the_journal_is_on_by_default_and_off_only_when_asked() {
        let c = parse(&["--database-url", "postgres://x"], None).expect("parses");
        assert!(c.journal);
        assert_eq!(c.journal_dir, PathBuf::from(DEFAULT_JOURNAL_DIR));
        let c = parse(
            &[
                "--database-url",
                "postgres://x",
                "--journal",
                "false",
                "--journal-dir",
                "/srv/kt",
            ],
            None,
        )
        .expect("parses");
        assert!(!c.journal);
        assert_eq!(c.journal_dir, PathBuf::from("/srv/kt"));
    }

    #[test]
    fn test_the_shortest_accepted_lease_is_timeout_plus_3_s() {
        for (lease, timeout, ok) in [("6", "3", true), ("5", "3", false), ("13", "10", true)] {
            let c = parse(
                &[
                    "--database-url",
                    "postgres://x",
                    "--lease-seconds",
                    lease,
                    "--http-timeout-seconds",
                    timeout,
                ],
                None,
            )
            .expect("parses");
            assert_eq!(c.validate().is_ok(), ok, "lease {lease}, timeout {timeout}");
        }
    }

    #[test]
    fn test_ranges_are_refused_as_they_are_read() {
        let cases: &[(&str, &str, bool)] = &[
            ("--lease-linger-ms", "0", true),
            ("--lease-linger-ms", "100", true),
            ("--lease-linger-ms", "101", false),
            ("--poll-ms", "1001", false),
            ("--poll-ms", "0", false),
            ("--workers", "0", false),
            ("--workers", "1024", true),
            ("--workers", "1025", false),
            ("--notify-heartbeat-seconds", "3601", false),
            ("--rpc-connections", "0", false),
            ("--db-connections", "1", false),
            ("--db-connections", "2", true),
            ("--lease-steps", "0", false),
            ("--lease-steps", "1", true),
            ("--lease-steps", "8", true),
            ("--lease-steps", "9", false),
        ];
        for (flag, value, ok) in cases {
            let parsed = parse(&["--database-url", "postgres://x", flag, value], None);
            assert_eq!(parsed.is_ok(), *ok, "{flag} {value}: {parsed:?}");
            if let Err(e) = parsed {
                assert!(e.contains(flag), "{e}");
            }
        }
    }

    /// Eighth red-team pass (docs/security.md row 93): with one key for
    /// effects and notifications, a person aimed a notification at the
    /// effects receiver and it verified there. The same key in both settings,
    /// written either way, is refused; different keys start.
    #[test]
    fn test_notifications_and_effects_are_signed_with_different_keys() {
        let key = format!("whsec_{}", SECRET_BASE64.encode([7u8; 32]));
        let other = format!("whsec_{}", SECRET_BASE64.encode([8u8; 32]));
        let raw = String::from_utf8(vec![7u8; 32]).unwrap();
        let with = |effects: &str, notify: &str| {
            parse(
                &[
                    "--database-url",
                    "postgres://x",
                    "--webhook-url",
                    "http://127.0.0.1:1/",
                    "--webhook-secret",
                    effects,
                    "--notify-webhook-secret",
                    notify,
                    "--public-url",
                    "http://127.0.0.1:2/",
                ],
                None,
            )
            .unwrap()
            .validate()
        };
        for effects in [&key, &raw] {
            let refused = with(effects, &key).expect_err("one key for both is refused");
            assert!(
                refused
                    .to_string()
                    .contains("must differ from KEYTURN_WEBHOOK_SECRET"),
                "{refused}"
            );
        }
        with(&key, &other).expect("different keys start");
    }

    #[test]
    fn test_validate_refuses_inconsistent_settings() {
        let base = ["--database-url", "postgres://x"];
        let cases: &[(&[&str], &str)] = &[
            (&["--lease-seconds", "11"], "KEYTURN_LEASE_SECONDS"),
            (&["--lease-seconds", "12"], "KEYTURN_LEASE_SECONDS"),
            (
                &["--lease-seconds", "5", "--http-timeout-seconds", "3"],
                "KEYTURN_LEASE_SECONDS",
            ),
            (
                &["--webhook-url", "http://127.0.0.1:1/"],
                "KEYTURN_WEBHOOK_SECRET",
            ),
            (
                &["--listen-database-url", "host=h port=notaport"],
                "KEYTURN_LISTEN_DATABASE_URL",
            ),
            (
                &["--jwt-secret", "0123456789abcdef0123456789abcdef"],
                "KEYTURN_RPC_DATABASE_URL",
            ),
            (
                &[
                    "--jwt-secret",
                    "short",
                    "--rpc-database-url",
                    "postgres://a",
                    "--jwt-roles",
                    "web_human",
                ],
                "at least 32 bytes",
            ),
            (
                &[
                    "--jwt-secret",
                    "0123456789abcdef0123456789abcdef",
                    "--rpc-database-url",
                    "postgres://a",
                ],
                "KEYTURN_JWT_ROLES",
            ),
            (
                &[
                    "--jwt-secret",
                    "0123456789abcdef0123456789abcdef",
                    "--jwt-jwks",
                    "/x.json",
                    "--rpc-database-url",
                    "postgres://a",
                    "--jwt-roles",
                    "web_human",
                ],
                "not both",
            ),
            (&["--rpc-database-url", "postgres://a"], "only take effect"),
            (
                &["--frame-ancestors", "https://a.example; script-src *"],
                "KEYTURN_FRAME_ANCESTORS",
            ),
            (
                &[
                    "--webhook-url",
                    "http://127.0.0.1:1/",
                    "--webhook-secret",
                    "whsec_***",
                ],
                "whsec_",
            ),
        ];
        for (extra, needle) in cases {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            let c = parse(&args, None).expect("parses");
            let err = c.validate().expect_err("must be refused").to_string();
            assert!(err.contains(needle), "{extra:?}: {err}");
        }
    }
}
