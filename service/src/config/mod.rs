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
//!
//! Beside the struct, one file each: the start-up checks (`validate`), the
//! TOML file (`file`) and its upstream MCP servers (`upstreams`), the lease
//! bounds every call fits in (`lease`), the signing keys (`keys`), the
//! Content-Security-Policy (`csp`) and [`Secret`] (`secret`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

mod csp;
mod file;
mod keys;
mod lease;
mod secret;
mod upstreams;
mod validate;

pub use csp::{csp_header, DEFAULT_FRAME_ANCESTORS};
pub use file::parse_with_file;
pub use keys::{webhook_key, VapidKey, STANDARD_SECRET_PREFIX};
pub use lease::{enough_lease_left, min_lease, LEASE_ROUND_TRIP_SLACK, LEASE_SAFETY_MARGIN};
pub use secret::Secret;
pub use upstreams::{read_upstreams, Upstream};
pub use validate::Checked;

/// The longest heartbeat period accepted: past an hour, a stall would go
/// unnoticed for longer than anyone would wait for a wake-up.
pub const MAX_HEARTBEAT_SECONDS: u64 = 3600;
/// Where the outcome journal lives unless `KEYTURN_JOURNAL_DIR` says
/// otherwise (systemd: `StateDirectory=keyturnd`).
pub const DEFAULT_JOURNAL_DIR: &str = "/var/lib/keyturnd/journal";

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

#[cfg(test)]
mod tests;
