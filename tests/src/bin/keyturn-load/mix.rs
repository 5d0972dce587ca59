//! The clients: their roles, their loop, and what agents and the
//! housekeeper do (propose and log out; sweep, as dispatcher and operator,
//! and end sessions). People are in people.rs, the dispatcher and the admin
//! in operations.rs. Each client loops until the phase ends and returns its
//! counts.

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
use crate::world::{Proposal, World, STAGES};

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

    pub(crate) async fn pause(&mut self, max_ms: u64) {
        let ms = self.rng.random_range(1..=max_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    pub(crate) async fn agent(&mut self, link: &mut Link) {
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

    pub(crate) fn form(&mut self, who: &Who) -> Value {
        let ids = self.world.some_deals(&mut self.rng, &who.tenant);
        let stage = STAGES[self.rng.random_range(0..STAGES.len())];
        json!({"where": {"id": ids}, "set": {"stage": stage}})
    }

    pub(crate) async fn housekeeper(
        &mut self,
        dispatcher: &mut Link,
        operator: &mut Link,
        agent: &mut Link,
    ) {
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

pub fn statuses(rows: &[Row]) -> Vec<(Uuid, String)> {
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

pub fn first_bool(rows: &[Row]) -> Option<bool> {
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
