//! Shared test helpers.
#![allow(dead_code)]

pub mod e2e;
pub mod fake_smtp;

use keyturnd::db::LeasedJob;
use uuid::Uuid;

/// A leased job as `keyturn.lease` would return it.
pub fn job(provider: &str, params: serde_json::Value) -> LeasedJob {
    LeasedJob {
        action_id: Uuid::new_v4(),
        lease_id: Uuid::new_v4(),
        tenant: "acme".into(),
        tool: "notify".into(),
        provider: provider.into(),
        params,
        idempotency_key: format!("ik-{}", Uuid::new_v4().simple()),
        attempt: 1,
    }
}

/// A loopback port with nothing listening on it (bound, then released).
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    port
}
