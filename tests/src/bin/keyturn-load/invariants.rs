//! What must hold after a phase, read as the superuser over the phase's own
//! tenants once the clients and the faults have stopped and one more sweep
//! has run. Each check counts its offending rows; any row fails the phase.

use std::collections::HashMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::world::World;

/// One check: its name, how many rows offend it, and an example or a count
/// worth printing.
pub struct Check {
    pub name: &'static str,
    pub offending: i64,
    pub note: String,
}

const OPEN: &str = "('pending', 'queued', 'leased', 'executing', 'uncertain')";

async fn count(db: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
    db.query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

pub async fn check(world: &World, db: &Client, swept_at: std::time::SystemTime) -> Vec<Check> {
    let t = &world.tenants;
    let mut out = Vec::new();

    // Every action is terminal (final, or uncertain for an operator) or
    // still due: pending before its expiry, queued, or leased or executing
    // under a lease the sweep that just ran found live.
    let sql = format!(
        "SELECT count(*) FROM keyturn.action a WHERE a.tenant = ANY($1) AND NOT (
             a.status::text NOT IN {OPEN} OR a.status = 'uncertain'
             OR (a.status = 'pending' AND a.expires_at >= $2)
             OR (a.status = 'queued' AND a.approved_at IS NOT NULL)
             OR (a.status IN ('leased', 'executing') AND a.lease_expires_at >= $2))"
    );
    let statuses: Vec<String> = db
        .query(
            "SELECT status || '=' || count(*) FROM keyturn.action WHERE tenant = ANY($1) GROUP BY status ORDER BY status",
            &[t],
        )
        .await
        .expect("statuses")
        .iter()
        .map(|r| r.get(0))
        .collect();
    out.push(Check {
        name: "every action terminal or still due",
        offending: count(db, &sql, &[t, &swept_at]).await,
        note: statuses.join(" "),
    });

    // The work list holds exactly the open actions, each with its status
    // (an executing action's row says leased: begin does not move it).
    let sql = format!(
        "SELECT count(*) FROM keyturn.action a FULL JOIN keyturn.open_action o ON o.action_id = a.id
          WHERE (a.tenant = ANY($1) OR o.tenant = ANY($1))
            AND (a.id IS NULL
                 OR (a.status::text IN {OPEN}
                     AND o.status IS DISTINCT FROM CASE a.status WHEN 'executing' THEN 'leased' ELSE a.status END)
                 OR (a.status::text NOT IN {OPEN} AND o.action_id IS NOT NULL))"
    );
    out.push(Check {
        name: "work list in step with the actions",
        offending: count(db, &sql, &[t]).await,
        note: String::new(),
    });

    // Claimed once: at most one event leaves pending, every approval binding
    // verifies, and nothing left pending as approved without one.
    let sql = "SELECT count(*) FROM keyturn.action a WHERE a.tenant = ANY($1) AND (
                   (SELECT count(*) FROM keyturn.event e WHERE e.action_id = a.id
                     AND e.from_status = 'pending' AND e.to_status <> 'pending') > 1
                   OR (a.approved_at IS NOT NULL AND NOT keyturn._approval_valid(a.id, a.params_hash,
                          a.approved_by, a.approved_role, a.approved_at, a.approved_via, a.approval_mac))
                   OR (a.approved_at IS NULL AND EXISTS (SELECT 1 FROM keyturn.event e WHERE e.action_id = a.id
                          AND e.from_status = 'pending' AND e.to_status IN ('queued', 'succeeded', 'conflict', 'failed'))))";
    let approved = count(
        db,
        "SELECT count(*) FROM keyturn.action WHERE tenant = ANY($1) AND approved_at IS NOT NULL",
        &[t],
    )
    .await;
    out.push(Check {
        name: "each proposal claimed once, by a valid approval binding",
        offending: count(db, sql, &[t]).await,
        note: format!("{approved} approvals"),
    });

    // One business write per target of each succeeded sql action, and none
    // otherwise: crm.deal_writes (the fixture's trigger) and the deal's own
    // revision counter (bumped by every update) both say so.
    let sql = "WITH d AS (SELECT id, revision FROM crm.deal WHERE tenant = ANY($1)),
                    w AS (SELECT deal_id, count(*) AS n FROM crm.deal_writes WHERE deal_id IN (SELECT id FROM d) GROUP BY 1),
                    s AS (SELECT t.key::bigint AS deal_id, count(*) AS n FROM keyturn.action a
                            JOIN keyturn.action_target t ON t.action_id = a.id
                           WHERE a.tenant = ANY($1) AND a.executor = 'sql' AND a.status = 'succeeded' GROUP BY 1)
               SELECT count(*) FROM d LEFT JOIN w ON w.deal_id = d.id LEFT JOIN s ON s.deal_id = d.id
                WHERE coalesce(w.n, 0) <> coalesce(s.n, 0) OR d.revision - 1 <> coalesce(w.n, 0)";
    let writes = count(
        db,
        "SELECT count(*) FROM crm.deal_writes WHERE deal_id IN (SELECT id FROM crm.deal WHERE tenant = ANY($1))",
        &[t],
    )
    .await;
    out.push(Check {
        name: "one business write per target of each succeeded sql action",
        offending: count(db, sql, &[t]).await,
        note: format!("{writes} writes"),
    });

    // One usage row per succeeded action, none for any other.
    let sql = "SELECT count(*) FROM keyturn.action a LEFT JOIN keyturn.usage u ON u.action_id = a.id
                WHERE a.tenant = ANY($1) AND ((a.status = 'succeeded') <> (u.action_id IS NOT NULL))";
    let usage = count(
        db,
        "SELECT count(*) FROM keyturn.usage WHERE tenant = ANY($1)",
        &[t],
    )
    .await;
    out.push(Check {
        name: "one usage row per succeeded action",
        offending: count(db, sql, &[t]).await,
        note: format!("{usage} usage rows"),
    });

    // One event per status change: each action's events form a chain from
    // its creation to its status, none made outside keyturn's functions,
    // and (no quorum tools here) none from a status to itself.
    let sql = "WITH e AS (SELECT e.action_id, e.from_status, e.to_status, e.detail,
                                 lag(e.to_status) OVER w AS prev, row_number() OVER w AS n,
                                 count(*) OVER (PARTITION BY e.action_id) AS total
                            FROM keyturn.event e WHERE e.tenant = ANY($1)
                          WINDOW w AS (PARTITION BY e.action_id ORDER BY e.id))
               SELECT (SELECT count(*) FROM e JOIN keyturn.action a ON a.id = e.action_id
                        WHERE (e.n = 1 AND e.from_status IS NOT NULL)
                           OR (e.n > 1 AND e.from_status IS DISTINCT FROM e.prev)
                           OR (e.n = e.total AND e.to_status <> a.status)
                           OR e.from_status = e.to_status
                           OR e.detail ? 'direct_write')
                    + (SELECT count(*) FROM keyturn.action a WHERE a.tenant = ANY($1)
                        AND NOT EXISTS (SELECT 1 FROM keyturn.event x WHERE x.action_id = a.id))";
    let events = count(
        db,
        "SELECT count(*) FROM keyturn.event WHERE tenant = ANY($1)",
        &[t],
    )
    .await;
    out.push(Check {
        name: "one event per status change",
        offending: count(db, sql, &[t]).await,
        note: format!("{events} events"),
    });

    // Attempts: one row per attempt counted, open only while executing.
    let sql = "SELECT count(*) FROM keyturn.action a WHERE a.tenant = ANY($1) AND a.executor = 'external' AND (
                   a.attempts <> (SELECT count(*) FROM keyturn.attempt x WHERE x.action_id = a.id)
                   OR (a.status <> 'executing' AND EXISTS (SELECT 1 FROM keyturn.attempt x
                          WHERE x.action_id = a.id AND x.finished_at IS NULL)))";
    out.push(Check {
        name: "one attempt row per attempt, closed unless executing",
        offending: count(db, sql, &[t]).await,
        note: String::new(),
    });

    // The audit's hash chain: every tenant's verifies, every event in it.
    let sql = "SELECT count(*) FROM unnest($1::text[]) t, keyturn.verify_audit(t) v WHERE NOT v.ok";
    out.push(Check {
        name: "every tenant's audit chain verifies",
        offending: count(db, sql, &[t]).await,
        note: String::new(),
    });

    out.push(acked(world, db).await);
    out
}

/// What a committed call answered is what the database holds.
async fn acked(world: &World, db: &Client) -> Check {
    let acked: HashMap<Uuid, String> = world.acked.lock().expect("acked").clone();
    let ids: Vec<Uuid> = acked.keys().copied().collect();
    let rows = db
        .query(
            "SELECT id, status::text FROM keyturn.action WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .expect("acked statuses");
    let mut offending = 0;
    let mut example = String::new();
    for r in &rows {
        let (id, status): (Uuid, String) = (r.get(0), r.get(1));
        if acked[&id] != status {
            offending += 1;
            example = format!("e.g. {id}: answered {}, holds {status}", acked[&id]);
        }
    }
    offending += (acked.len() - rows.len()) as i64;
    Check {
        name: "every committed answer holds",
        offending,
        note: format!("{} answers {example}", acked.len()),
    }
}
