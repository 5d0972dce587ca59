//! The people: approve (alone, and several on one card, sometimes two at
//! once on the same proposal), reject, revise, preview, and standing
//! approvals given and revoked. A proposal a transient failure left pending
//! goes back to the pool for another try.

use proptest::prelude::RngExt;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::link::Link;
use crate::mix::{statuses, transient, Client};
use crate::world::{Delegation, Proposal};

impl Client {
    pub(crate) async fn human(&mut self, link: &mut Link) {
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
    pub(crate) fn settle(&mut self, p: Proposal, r: Result<Vec<(Uuid, String)>, String>) {
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

    pub(crate) async fn approve_many(&mut self, link: &mut Link, card: Vec<Proposal>) {
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

    pub(crate) async fn revise(&mut self, link: &mut Link, p: Proposal) {
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

    pub(crate) async fn delegate(&mut self, link: &mut Link) {
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

    pub(crate) async fn revoke_delegation(&mut self, link: &mut Link) {
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
}
