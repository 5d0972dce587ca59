//! What one phase of the load works on: tenants of its own (so the checks
//! see only its rows), their members and deals in the CRM fixture's
//! crm.deal (whose trigger logs every business write in crm.deal_writes),
//! three tools, and what the clients hand each other: proposals with their
//! tokens (only propose returns one), standing approvals, revoked grants,
//! and every outcome a committed call reported.

use std::collections::HashMap;
use std::sync::Mutex;

use keyturn_tests::{connect, random_id};
use proptest::prelude::RngExt;
use proptest::test_runner::TestRng;
use serde_json::json;
use uuid::Uuid;

use crate::link::Who;

pub const TENANTS: usize = 4;
pub const PRINCIPALS: usize = 6;
pub const SESSIONS: usize = 3;
pub const DEALS_PER_TENANT: usize = 24;
pub const STAGES: &[&str] = &["lead", "qualified", "negotiation", "won", "lost"];

/// A pending proposal, as the agent's propose returned it.
#[derive(Debug, Clone)]
pub struct Proposal {
    pub id: Uuid,
    pub token: String,
    pub who: Who,
    pub tool: String,
}

#[derive(Debug, Clone)]
pub struct Delegation {
    pub id: Uuid,
    pub who: Who,
}

pub struct World {
    /// Unique to the phase: the tenants' prefix, the connections'
    /// application_name (what the fault injector aims at) and the external
    /// tool's provider (so only this phase's dispatchers lease its jobs).
    pub run: String,
    pub tenants: Vec<String>,
    pub principals: Vec<String>,
    /// Tools: an sql tool, an sql tool whose proposals expire in two seconds
    /// (the sweep expires them), and an external tool.
    pub stage: String,
    pub brief: String,
    pub note: String,
    pub deals: HashMap<String, Vec<i64>>,
    pub pool: Mutex<Vec<Proposal>>,
    pub delegations: Mutex<Vec<Delegation>>,
    /// Grants an admin client revoked, to grant again.
    pub revoked: Mutex<Vec<(String, String, String)>>,
    /// action → the status a committed call answered with, when final.
    pub acked: Mutex<HashMap<Uuid, String>>,
}

impl World {
    pub async fn new(run: &str) -> World {
        let admin = connect("app_admin").await;
        let superuser = connect("postgres").await;
        let tenants: Vec<String> = (0..TENANTS).map(|i| format!("{run}_t{i}")).collect();
        let principals: Vec<String> = (0..PRINCIPALS).map(|i| format!("p{i}")).collect();
        let stage = format!("{run}.stage");
        let brief = format!("{run}.brief");
        let note = format!("{run}.note");
        let sql_tool = |version: &str, extra: serde_json::Value| {
            let mut spec = json!({
                "executor": "sql", "effect": "reversible",
                "summary": "Set stage {set.stage} on {count} deal(s)",
                "sql": {"table": "crm.deal", "key": "id", "version": version, "set": ["stage"], "where": ["id"]}
            });
            if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                s.extend(e.clone());
            }
            spec
        };
        let specs = [
            (&stage, sql_tool("xmin", json!({}))),
            (
                &brief,
                sql_tool("revision", json!({"expires_in": "2 seconds"})),
            ),
            (
                &note,
                json!({
                    "executor": "external", "provider": run, "effect": "reversible",
                    "summary": "Post to {channel}: {text}",
                    "params_schema": {"type": "object", "required": ["channel", "text"], "properties": {
                        "channel": {"type": "string", "enum": ["sales", "support"]},
                        "text": {"type": "string", "maxLength": 200}}}
                }),
            ),
        ];
        for (name, spec) in &specs {
            admin
                .execute("SELECT keyturn.register_tool($1, $2)", &[name, spec])
                .await
                .unwrap_or_else(|e| panic!("register_tool {name}: {e}"));
        }
        let mut deals = HashMap::new();
        for t in &tenants {
            for p in &principals {
                admin
                    .execute("SELECT keyturn.add_member($1, $2, 'member')", &[t, p])
                    .await
                    .expect("add_member");
                for tool in [&stage, &brief, &note] {
                    admin
                        .execute("SELECT keyturn.grant_tool($1, $2, $3)", &[t, p, tool])
                        .await
                        .expect("grant_tool");
                }
            }
            let mut ids = Vec::new();
            for i in 0..DEALS_PER_TENANT {
                let id = random_id();
                superuser
                    .execute(
                        "INSERT INTO crm.deal (id, tenant, owner, name) VALUES ($1, $2, $3, $4)",
                        &[
                            &id,
                            t,
                            &principals[i % PRINCIPALS],
                            &format!("load deal {i}"),
                        ],
                    )
                    .await
                    .expect("insert deal");
                ids.push(id);
            }
            deals.insert(t.clone(), ids);
        }
        World {
            run: run.to_owned(),
            tenants,
            principals,
            stage,
            brief,
            note,
            deals,
            pool: Mutex::new(Vec::new()),
            delegations: Mutex::new(Vec::new()),
            revoked: Mutex::new(Vec::new()),
            acked: Mutex::new(HashMap::new()),
        }
    }

    /// Someone of the phase: a tenant, a principal, one of its sessions.
    pub fn someone(&self, rng: &mut TestRng) -> Who {
        Who {
            tenant: self.tenants[rng.random_range(0..TENANTS)].clone(),
            principal: self.principals[rng.random_range(0..PRINCIPALS)].clone(),
            session: format!("s{}", rng.random_range(0..SESSIONS)),
        }
    }

    /// One to three deals of the tenant.
    pub fn some_deals(&self, rng: &mut TestRng, tenant: &str) -> Vec<i64> {
        let ids = &self.deals[tenant];
        let n = rng.random_range(1..=3);
        (0..n)
            .map(|_| ids[rng.random_range(0..ids.len())])
            .collect()
    }

    pub fn push(&self, p: Proposal) {
        self.pool.lock().expect("pool").push(p);
    }

    /// A random pending proposal, taken out of the pool.
    pub fn take(&self, rng: &mut TestRng) -> Option<Proposal> {
        let mut pool = self.pool.lock().expect("pool");
        if pool.is_empty() {
            return None;
        }
        let i = rng.random_range(0..pool.len());
        Some(pool.swap_remove(i))
    }

    /// Up to `n` more proposals of `who`, taken out of the pool.
    pub fn take_more_of(&self, who: &Who, n: usize) -> Vec<Proposal> {
        let mut pool = self.pool.lock().expect("pool");
        let mut out = Vec::new();
        let mut i = 0;
        while i < pool.len() && out.len() < n {
            if &pool[i].who == who {
                out.push(pool.swap_remove(i));
            } else {
                i += 1;
            }
        }
        out
    }

    /// Records the final status a committed call answered for an action. A
    /// second answer that differs is kept beside it, for the checks to report.
    pub fn ack(&self, id: Uuid, status: &str) {
        if !is_final(status) && status != "uncertain" {
            return;
        }
        let mut acked = self.acked.lock().expect("acked");
        let entry = acked.entry(id).or_insert_with(|| status.to_owned());
        if entry != status && !entry.contains(&format!("|{status}")) {
            entry.push('|');
            entry.push_str(status);
        }
    }
}

/// Statuses no transition leaves (docs/concepts.md, "The state machine").
pub fn is_final(status: &str) -> bool {
    !matches!(
        status,
        "pending" | "queued" | "leased" | "executing" | "uncertain"
    )
}
