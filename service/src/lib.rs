//! keyturnd — keyturn's thin dispatch service.
//!
//! The database (`pg_keyturn`) owns every rule; keyturnd only carries out
//! provider calls for rows the database has already moved forward, and
//! records what it observed (README, section keyturnd).
//!
//! | module | what it holds |
//! |---|---|
//! | [`config`] | every setting, from flags, the environment and a TOML file, each said once on its field; the start-up checks, which return what they parsed; depends only on [`error`] |
//! | [`compat`] | the `pg_keyturn` version this build serves against |
//! | [`db`] | every statement keyturnd runs, one function per keyturn call ([`db::rpc`]: `/rpc`'s), and the pool |
//! | [`worker`] | the dispatch loop: lease → begin → call → completion, the `LISTEN` connection and its heartbeat, the sweeper |
//! | [`providers`] | the adapters: [`providers::webhook`], [`providers::smtp`], [`providers::mcp`], and the notification channels [`providers::notify`] (email, webhook, Web Push) |
//! | [`classify`] | provider results → `succeeded` / `failed` / `retry` / `unknown` |
//! | [`http`] | the router: `/healthz`, `/readyz`, `/metrics`, `/rpc`, the pages; the security headers |
//! | [`server`] | the HTTP server: header-read and request timeouts, a connection cap, a shutdown with a deadline |
//! | [`state`] | what the routes read ([`AppState`]) and the readiness inputs ([`state::Health`]) |
//! | [`jwt`] | verifying the people's JWTs (HS256, or RS256 / ES256 from a JWKS) |
//! | [`mcp`] | `/mcp`: keyturn over the Model Context Protocol (rmcp's Streamable HTTP server), and the upstream MCP servers |
//! | [`body`] | a request body's JSON, read as the database reads it: a repeated or reserved key refused |
//! | [`rpc`] | `POST /rpc/<function>`: a person's keyturn call, run the way PostgREST runs it; the start-up checks of its login and roles |
//! | [`pages`] | the approval card and the operator console, compiled in (`service/web/`), with the card's web app manifest, service worker and Web Push hook |
//! | [`metrics`] | the Prometheus registry |
//! | [`journal`] | the outcome journal: observed outcomes on disk until the database has them |
//! | [`operator`] | `keyturnd uncertain` and `keyturnd reconcile` |
//! | [`audit`] | `keyturnd audit-verify`: an audit export checked offline |
//! | [`shutdown`] | SIGTERM / SIGINT → drain |
//! | [`log`] | the log's writer: one line per event, whatever it quotes |
//! | [`error`] | the one error type, and its HTTP answer |

pub mod audit;
pub mod body;
pub mod classify;
pub mod compat;
pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod journal;
pub mod jwt;
pub mod log;
pub mod mcp;
pub mod metrics;
pub mod operator;
pub mod pages;
pub mod providers;
pub mod rpc;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod worker;

pub use error::Error;
pub use http::app;
pub use state::AppState;
