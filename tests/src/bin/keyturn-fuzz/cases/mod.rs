//! One fuzz case: inputs drawn from keyturn-core's generators with the
//! case's own seeded runner, sent to the live cluster, the answers judged
//! (judge.rs) and checked against the case kind's oracle. A case returns
//! its findings; none is a pass.

mod batch;
mod claims;
mod forms;
mod params;
mod scopes;
mod specs;

use keyturn_tests::tally::Tally;
use proptest::prelude::RngExt;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row};

use crate::db::{as_who, jsonb_text, Db, Ident};
use crate::fixture::Fixture;
use crate::judge::judge;

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Form,
    Params,
    Spec,
    Scope,
    Claims,
    Batch,
}

pub struct Ctx<'a> {
    pub db: &'a Db,
    pub fx: &'a Fixture,
    pub runner: TestRunner,
    pub tally: &'a mut Tally,
    pub findings: Vec<String>,
    /// What the case sent, for the report.
    pub inputs: Vec<String>,
    /// Makes names unique within the run (tools, conversations).
    pub case: u64,
}

impl Ctx<'_> {
    pub fn draw<S: Strategy>(&mut self, s: S) -> S::Value {
        s.new_tree(&mut self.runner)
            .unwrap_or_else(|e| panic!("a generator gave up: {e}"))
            .current()
    }

    pub fn roll(&mut self, percent: u32) -> bool {
        self.runner.rng().random_range(0..100) < percent
    }

    pub fn input(&mut self, what: &str, value: &str) {
        let shown: String = value.chars().take(600).collect();
        let more = if shown.len() < value.len() { "…" } else { "" };
        self.inputs.push(format!("{what}: {shown:?}{more}"));
    }

    pub fn finding(&mut self, f: String) {
        self.findings.push(f);
    }

    /// alice in the fixture's tenant, session s1: who the cases act as.
    pub fn alice(&self) -> Ident {
        Ident::gucs(&self.fx.tenant, "alice", "s1")
    }

    /// A call as `who` on `client`, judged under `call`.
    pub async fn call(
        &mut self,
        call: &str,
        client: &tokio_postgres::Client,
        who: &Ident,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let r = as_who(client, who, sql, params).await;
        judge(self.tally, &mut self.findings, call, &r);
        r
    }

    /// The jsonb text PostgreSQL makes of `text`, or None (counted under
    /// `jsonb input`) when its own parser refuses it.
    pub async fn jsonb(&mut self, text: &str) -> Option<String> {
        match jsonb_text(&self.db.su, text).await {
            Ok(t) => {
                self.tally.add("jsonb input", "ok");
                Some(t)
            }
            Err(code) => {
                self.tally.add("jsonb input", &code);
                if !crate::judge::allowed("jsonb input", &code) {
                    self.finding(format!("PostgreSQL's jsonb input ended in {code}"));
                }
                None
            }
        }
    }

    /// Leases every due job of the fixture's provider and completes it
    /// `succeeded`, checking each leased job's params are what was proposed.
    pub async fn drain(&mut self) {
        let db = self.db;
        let none = Ident::default();
        let provider = vec![self.fx.run.clone()];
        let sql =
            "SELECT action_id, lease_id, params FROM keyturn.lease('fuzz', 100, '30 seconds', $1)";
        let Ok(rows) = self
            .call("lease", &db.dispatcher, &none, sql, &[&provider])
            .await
        else {
            return;
        };
        for r in rows {
            let (id, lease, leased): (uuid::Uuid, uuid::Uuid, Option<serde_json::Value>) =
                (r.get(0), r.get(1), r.get(2));
            let proposed: Option<serde_json::Value> = db
                .su
                .query_one("SELECT params FROM keyturn.action WHERE id = $1", &[&id])
                .await
                .ok()
                .and_then(|r| r.get(0));
            if proposed.is_some() && proposed != leased {
                self.finding(format!(
                    "lease of {id} hands out other params than were proposed"
                ));
            }
            let sql = "SELECT keyturn.begin_dispatch($1, $2)";
            let begun = self
                .call("begin_dispatch", &db.dispatcher, &none, sql, &[&id, &lease])
                .await;
            if begun.is_ok_and(|rows| rows.first().is_some_and(|r| r.get::<_, bool>(0))) {
                let sql = "SELECT keyturn.complete($1, $2, 'succeeded')";
                let _ = self
                    .call("complete", &db.dispatcher, &none, sql, &[&id, &lease])
                    .await;
            }
        }
    }
}

pub fn pick(runner: &mut TestRunner) -> Kind {
    match runner.rng().random_range(0..100) {
        0..32 => Kind::Form,
        32..50 => Kind::Params,
        50..64 => Kind::Spec,
        64..78 => Kind::Scope,
        78..92 => Kind::Claims,
        _ => Kind::Batch,
    }
}

pub async fn run(kind: Kind, ctx: &mut Ctx<'_>) {
    match kind {
        Kind::Form => forms::case(ctx).await,
        Kind::Params => params::case(ctx).await,
        Kind::Spec => specs::case(ctx).await,
        Kind::Scope => scopes::case(ctx).await,
        Kind::Claims => claims::case(ctx).await,
        Kind::Batch => batch::case(ctx).await,
    }
}
