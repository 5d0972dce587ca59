//! The dispatcher (lease, begin, complete, and the workers that die holding a
//! lease or mid-call) and the admin (tools revoked and granted again,
//! members' roles changed).

use proptest::prelude::RngExt;
use uuid::Uuid;

use crate::link::Link;
use crate::mix::{first_bool, Client};

impl Client {
    pub(crate) async fn dispatcher(&mut self, link: &mut Link) {
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

    pub(crate) async fn admin(&mut self, link: &mut Link) {
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
}
