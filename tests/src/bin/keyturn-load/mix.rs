//! What the clients do: agents propose and log out, people approve (one by
//! one and on one card), reject, revise and delegate, dispatchers lease,
//! begin and complete, an admin revokes and grants tools, a housekeeper
//! sweeps. Each client loops until the phase ends and returns its counts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keyturn_tests::tally::Tally;
use proptest::prelude::RngExt;
use proptest::test_runner::TestRng;
use serde_json::{json, Value};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::link::{Link, Who};
use crate::world::{Delegation, Proposal, World, STAGES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Agent,
    Human,
    Dispatcher,
    Admin,
    Housekeeper,
}

/// The roles of `n` clients: about 3/8 agents, 3/8 people, 1/6 dispatchers,
/// and at least one admin and one housekeeper.
pub fn roles(n: usize) -> Vec<Role> {
    let admins = (n / 16).max(1);
    let keepers = (n / 16).max(1);
    let dispatchers = (n / 6).max(1);
    let rest = n.saturating_sub(admins + keepers + dispatchers);
    let agents = rest / 2;
    let humans = rest - agents;
    [
        (Role::Agent, agents),
        (Role::Human, humans),
        (Role::Dispatcher, dispatchers),
        (Role::Admin, admins),
        (Role::Housekeeper, keepers),
    ]
    .into_iter()
    .flat_map(|(r, k)| std::iter::repeat_n(r, k))
    .collect()
}

pub struct Client {
    pub world: Arc<World>,
    pub rng: TestRng,
    pub tally: Tally,
    pub index: usize,
}

impl Client {
    pub async fn run(mut self, role: Role, stop: Arc<AtomicBool>) -> Tally {
        let login = match role {
            Role::Agent => "app_agent",
            Role::Human => "app_human",
            Role::Dispatcher | Role::Housekeeper => "app_dispatcher",
            Role::Admin => "app_admin",
        };
        let mut link = Link::new(login, &self.world.run.clone(), 40);
        let mut operator = Link::new("app_operator", &self.world.run.clone(), 40);
        let mut agent = Link::new("app_agent", &self.world.run.clone(), 40);
        while !stop.load(Ordering::Relaxed) {
            match role {
                Role::Agent => self.agent(&mut link).await,
                Role::Human => self.human(&mut link).await,
                Role::Dispatcher => self.dispatcher(&mut link).await,
                Role::Admin => self.admin(&mut link).await,
                Role::Housekeeper => self.housekeeper(&mut link, &mut operator, &mut agent).await,
            }
        }
        self.tally
    }

    async fn pause(&mut self, max_ms: u64) {
        let ms = self.rng.random_range(1..=max_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    async fn agent(&mut self, link: &mut Link) {
        let w = self.world.clone();
        let who = w.someone(&mut self.rng);
        let roll = self.rng.random_range(0..100);
        if roll < 5 {
            let _ = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "end_session",
                    Some(&who),
                    "SELECT keyturn.end_session()",
                    &[],
                )
                .await;
            return;
        }
        let (call, tool, params) = if roll < 60 {
            ("propose sql", w.stage.clone(), self.form(&who))
        } else if roll < 70 {
            ("propose sql (expiring)", w.brief.clone(), self.form(&who))
        } else {
            let n = self.rng.random_range(0..1_000_000);
            (
                "propose external",
                w.note.clone(),
                json!({"channel": "sales", "text": format!("note {n}")}),
            )
        };
        let sql = "SELECT action_id, token, status FROM keyturn.propose($1, $2)";
        if let Ok(rows) = link
            .call(
                &mut self.tally,
                &mut self.rng,
                call,
                Some(&who),
                sql,
                &[&tool, &params],
            )
            .await
        {
            for r in rows {
                let (id, token, status): (Uuid, Option<String>, String) =
                    (r.get(0), r.get(1), r.get(2));
                if status == "pending" {
                    if let Some(token) = token {
                        w.push(Proposal {
                            id,
                            token,
                            who: who.clone(),
                            tool: tool.clone(),
                        });
                    }
                } else {
                    // A standing approval covered it in the same call.
                    w.ack(id, &status);
                }
            }
        }
    }

    fn form(&mut self, who: &Who) -> Value {
        let ids = self.world.some_deals(&mut self.rng, &who.tenant);
        let stage = STAGES[self.rng.random_range(0..STAGES.len())];
        json!({"where": {"id": ids}, "set": {"stage": stage}})
    }

    async fn human(&mut self, link: &mut Link) {
        let w = self.world.clone();
        let roll = self.rng.random_range(0..100);
        if roll < 7 {
            return self.delegate(link).await;
        }
        if roll < 12 {
            return self.revoke_delegation(link).await;
        }
        let Some(p) = w.take(&mut self.rng) else {
            return self.pause(5).await;
        };
        if self.rng.random_range(0..100) < 20 {
            // Left in the pool too: another person may act on it at the same
            // time (two approvals racing, an approval racing a reject).
            w.push(p.clone());
        }
        let sql_approve = "SELECT action_id, status FROM keyturn.approve($1, $2)";
        let r = if roll < 60 {
            let r = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "approve",
                    Some(&p.who),
                    sql_approve,
                    &[&p.id, &p.token],
                )
                .await;
            r.map(|rows| statuses(&rows))
        } else if roll < 75 {
            let mut card = vec![p.clone()];
            card.extend(w.take_more_of(&p.who, self.rng.random_range(1..5)));
            return self.approve_many(link, card).await;
        } else if roll < 85 {
            let sql = "SELECT keyturn.reject($1, $2, 'not now')";
            let r = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "reject",
                    Some(&p.who),
                    sql,
                    &[&p.id, &p.token],
                )
                .await;
            r.map(|rows| {
                rows.iter()
                    .map(|row| (p.id, row.get::<_, String>(0)))
                    .collect()
            })
        } else if roll < 95 {
            return self.revise(link, p).await;
        } else {
            let sql = "SELECT keyturn.preview($1, $2) ->> 'status'";
            let r = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "preview",
                    Some(&p.who),
                    sql,
                    &[&p.id, &p.token],
                )
                .await;
            if r.is_ok() {
                w.push(p);
            }
            return;
        };
        self.settle(p, r);
    }

    /// After approve or reject: what committed is recorded; a proposal left
    /// pending by a transient failure goes back for another try.
    fn settle(&mut self, p: Proposal, r: Result<Vec<(Uuid, String)>, String>) {
        match r {
            Ok(outcomes) => {
                for (id, status) in outcomes {
                    if status == "pending" {
                        self.world.push(p.clone());
                    } else {
                        self.world.ack(id, &status);
                    }
                }
            }
            Err(o) if transient(&o) => self.world.push(p),
            Err(_) => {}
        }
    }

    async fn approve_many(&mut self, link: &mut Link, card: Vec<Proposal>) {
        let items: Vec<Value> = card
            .iter()
            .map(|p| json!({"action_id": p.id, "token": p.token}))
            .collect();
        let items = Value::Array(items);
        let who = card[0].who.clone();
        let sql = "SELECT action_id, status, result FROM keyturn.approve_many($1)";
        match link
            .call(
                &mut self.tally,
                &mut self.rng,
                "approve_many",
                Some(&who),
                sql,
                &[&items],
            )
            .await
        {
            Ok(rows) => {
                for r in rows {
                    let (id, status, result): (Uuid, String, Option<Value>) =
                        (r.get(0), r.get(1), r.get(2));
                    let p = card.iter().find(|p| p.id == id).cloned();
                    if status == "refused" {
                        let code = result
                            .as_ref()
                            .and_then(|v| v.get("sqlstate"))
                            .and_then(Value::as_str)
                            .unwrap_or("none")
                            .to_owned();
                        self.tally.add("approve_many item", &code);
                        if let (Some(p), true) = (p, transient(&code)) {
                            self.world.push(p);
                        }
                    } else {
                        self.tally.add("approve_many item", "ok");
                        match (status.as_str(), p) {
                            ("pending", Some(p)) => self.world.push(p),
                            (s, _) => self.world.ack(id, s),
                        }
                    }
                }
            }
            Err(o) if transient(&o) => {
                for p in card {
                    self.world.push(p);
                }
            }
            Err(_) => {}
        }
    }

    async fn revise(&mut self, link: &mut Link, p: Proposal) {
        let params = if p.tool == self.world.note {
            json!({"channel": "support", "text": "revised"})
        } else {
            self.form(&p.who)
        };
        let sql = "SELECT action_id, token FROM keyturn.revise($1, $2, $3)";
        match link
            .call(
                &mut self.tally,
                &mut self.rng,
                "revise",
                Some(&p.who),
                sql,
                &[&p.id, &p.token, &params],
            )
            .await
        {
            Ok(rows) => {
                for r in rows {
                    self.world.push(Proposal {
                        id: r.get(0),
                        token: r.get(1),
                        who: p.who.clone(),
                        tool: p.tool.clone(),
                    });
                }
                self.world.ack(p.id, "superseded");
            }
            Err(o) if transient(&o) => self.world.push(p),
            Err(_) => {}
        }
    }

    async fn delegate(&mut self, link: &mut Link) {
        let w = self.world.clone();
        let who = w.someone(&mut self.rng);
        let (tool, scope) = if self.rng.random_bool(0.5) {
            (
                w.stage.clone(),
                json!({"params": {"set.stage": {"in": ["won", "lost"]}}, "max_targets": 2}),
            )
        } else {
            (w.note.clone(), json!({}))
        };
        let uses: i32 = self.rng.random_range(1..4);
        let sql = "SELECT keyturn.delegate($1, $2, $3, interval '30 seconds')";
        if let Ok(rows) = link
            .call(
                &mut self.tally,
                &mut self.rng,
                "delegate",
                Some(&who),
                sql,
                &[&tool, &scope, &uses],
            )
            .await
        {
            for r in rows {
                w.delegations.lock().expect("delegations").push(Delegation {
                    id: r.get(0),
                    who: who.clone(),
                });
            }
        }
    }

    async fn revoke_delegation(&mut self, link: &mut Link) {
        let d = {
            let mut ds = self.world.delegations.lock().expect("delegations");
            if ds.is_empty() {
                None
            } else {
                let i = self.rng.random_range(0..ds.len());
                Some(ds.swap_remove(i))
            }
        };
        if let Some(d) = d {
            let sql = "SELECT keyturn.revoke_delegation($1)";
            let _ = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "revoke_delegation",
                    Some(&d.who),
                    sql,
                    &[&d.id],
                )
                .await;
        }
    }

    async fn dispatcher(&mut self, link: &mut Link) {
        let w = self.world.clone();
        let worker = format!("{}-w{}", w.run, self.index);
        let max: i32 = self.rng.random_range(1..8);
        let lease_for = ["1 second", "3 seconds", "30 seconds"][self.rng.random_range(0..3)];
        let providers = vec![w.run.clone()];
        let sql = "SELECT action_id, lease_id FROM keyturn.lease($1, $2, $3::text::interval, $4)";
        let jobs = match link
            .call(
                &mut self.tally,
                &mut self.rng,
                "lease",
                None,
                sql,
                &[&worker, &max, &lease_for, &providers],
            )
            .await
        {
            Ok(rows) => rows,
            Err(_) => return,
        };
        if jobs.is_empty() {
            return self.pause(10).await;
        }
        for job in jobs {
            let (id, lease): (Uuid, Uuid) = (job.get(0), job.get(1));
            let roll = self.rng.random_range(0..100);
            if roll < 5 {
                // Handed back before the call: no attempt counted.
                let sql = "SELECT keyturn.complete($1, $2, 'retry')";
                let _ = link
                    .call(
                        &mut self.tally,
                        &mut self.rng,
                        "complete (hand back)",
                        None,
                        sql,
                        &[&id, &lease],
                    )
                    .await;
                continue;
            }
            if roll < 10 {
                continue; // a worker that died holding the lease: the sweep requeues it
            }
            let sql = "SELECT keyturn.begin_dispatch($1, $2)";
            let begun = match link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "begin_dispatch",
                    None,
                    sql,
                    &[&id, &lease],
                )
                .await
            {
                Ok(rows) => rows.first().is_some_and(|r| r.get::<_, bool>(0)),
                Err(_) => false,
            };
            if !begun || self.rng.random_range(0..100) < 5 {
                continue; // invalidated, or a worker that died mid-call: the sweep makes it uncertain
            }
            let outcome = match self.rng.random_range(0..100) {
                0..70 => "succeeded",
                70..80 => "failed",
                80..90 => "retry",
                _ => "unknown",
            };
            let sql = "SELECT keyturn.complete($1, $2, $3, '{\"status\": 200}', interval '10 milliseconds')";
            if let Ok(rows) = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "complete",
                    None,
                    sql,
                    &[&id, &lease, &outcome],
                )
                .await
            {
                for r in rows {
                    w.ack(id, &r.get::<_, String>(0));
                }
            }
        }
    }

    async fn admin(&mut self, link: &mut Link) {
        let w = self.world.clone();
        let roll = self.rng.random_range(0..100);
        let restore = {
            let mut revoked = w.revoked.lock().expect("revoked");
            (roll < 50 && !revoked.is_empty()).then(|| {
                let i = self.rng.random_range(0..revoked.len());
                revoked.swap_remove(i)
            })
        };
        if let Some((t, p, tool)) = restore {
            let sql = "SELECT keyturn.grant_tool($1, $2, $3)";
            let _ = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "grant_tool",
                    None,
                    sql,
                    &[&t, &p, &tool],
                )
                .await;
        } else if roll < 80 {
            let who = w.someone(&mut self.rng);
            let tool = [&w.stage, &w.brief, &w.note][self.rng.random_range(0..3)].clone();
            let sql = "SELECT keyturn.revoke_tool($1, $2, $3)";
            let r = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "revoke_tool",
                    None,
                    sql,
                    &[&who.tenant, &who.principal, &tool],
                )
                .await;
            if matches!(r.as_deref().map(first_bool), Ok(Some(true))) {
                w.revoked
                    .lock()
                    .expect("revoked")
                    .push((who.tenant, who.principal, tool));
            }
        } else {
            let who = w.someone(&mut self.rng);
            let role = if self.rng.random_bool(0.5) {
                "member"
            } else {
                "approver"
            };
            let sql = "SELECT keyturn.add_member($1, $2, $3)";
            let _ = link
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "add_member",
                    None,
                    sql,
                    &[&who.tenant, &who.principal, &role],
                )
                .await;
        }
        self.pause(60).await;
    }

    async fn housekeeper(&mut self, dispatcher: &mut Link, operator: &mut Link, agent: &mut Link) {
        let roll = self.rng.random_range(0..100);
        let sql = "SELECT * FROM keyturn.sweep()";
        if roll < 50 {
            let _ = dispatcher
                .call(&mut self.tally, &mut self.rng, "sweep", None, sql, &[])
                .await;
        } else if roll < 70 {
            let _ = operator
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "sweep (operator)",
                    None,
                    sql,
                    &[],
                )
                .await;
        } else {
            let who = self.world.someone(&mut self.rng);
            let sql = "SELECT keyturn.end_session($1)";
            let session = who.session.clone();
            let _ = agent
                .call(
                    &mut self.tally,
                    &mut self.rng,
                    "end_session",
                    Some(&who),
                    sql,
                    &[&session],
                )
                .await;
        }
        self.pause(150).await;
    }
}

fn statuses(rows: &[Row]) -> Vec<(Uuid, String)> {
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

fn first_bool(rows: &[Row]) -> Option<bool> {
    rows.first().map(|r| r.get(0))
}

/// Failures after which the same call may be tried again: the proposal is
/// still pending.
pub fn transient(outcome: &str) -> bool {
    matches!(
        outcome,
        "57014" | "55P03" | "57P01" | "closed" | "40001" | "40P01" | crate::link::EXHAUSTED
    )
}
