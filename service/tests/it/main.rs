//! keyturnd's integration tests: one test binary, one module per feature
//! (a binary per file would be a link step per file), fixtures in
//! [`support`].
//!
//! ```text
//! cargo test -p keyturnd --test it              everything; the database tests say they skipped
//! KT_ONLY=service tests/run-all                 everything against a private cluster
//! KT_PGPORT=<port> KT_PGDATA=<dir> KT_PGSOCK=<dir> cargo test -p keyturnd --test it e2e_
//!                                               the database tests against a cluster of your own
//! ```
//!
//! A test that cannot run here prints `SKIPPED <test>: <why>. <how to run it>`
//! and passes; none skips silently.

#[macro_use]
mod support;

mod attachments;
mod binary;
mod browser;
mod e2e_attachments;
mod e2e_audit;
mod e2e_card_session;
mod e2e_dispatch;
mod e2e_journal;
mod e2e_lease;
mod e2e_notify;
mod e2e_pg_restart;
mod e2e_pooler;
mod e2e_process;
mod e2e_rpc;
mod e2e_smtp;
mod e2e_soak;
mod e2e_standard_webhooks;
mod e2e_webhook;
mod http;
mod server;
mod smtp;
mod webhook;
