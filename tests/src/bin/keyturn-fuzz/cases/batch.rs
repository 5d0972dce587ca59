//! The batched dispatcher calls under hostile batches: leased actions under
//! their leases, under wrong or NULL ones, unknown and NULL ids, the same
//! action twice, bad outcome words, negative and huge delays, any receipt.
//! Every element must be answered in input order as calls one after another
//! would answer it (the oracle below, the dispatcher's part of the state
//! machine), and the database must agree afterwards: each action's status and
//! attempts, its work-list row, one event per status change, and no delay
//! past a day.

use std::collections::HashMap;

use keyturn_core::canonical::parse_bounded;
use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use crate::db::Ident;
use crate::generators::json_any;

/// What the oracle knows of one leased action.
#[derive(Debug, Clone, PartialEq)]
struct Job {
    status: &'static str,
    lease: Option<Uuid>,
    attempts: i32,
    /// Status changes the batches made, each of which must be one event.
    changes: i64,
}

/// One element's expected answer: a status (or dispatch), or a refusal.
fn expect_begin(
    jobs: &mut HashMap<Uuid, Job>,
    id: Option<Uuid>,
    lease: Option<Uuid>,
) -> Result<(), &'static str> {
    let job = id.and_then(|id| jobs.get_mut(&id));
    match job {
        Some(j) if j.status == "leased" && lease.is_some() && j.lease == lease => {
            j.status = "executing";
            j.attempts += 1;
            j.changes += 1;
            Ok(())
        }
        _ => Err("55000"),
    }
}

fn expect_complete(
    jobs: &mut HashMap<Uuid, Job>,
    id: Option<Uuid>,
    lease: Option<Uuid>,
    outcome: Option<&str>,
    delay: Option<&str>,
    receipt: Option<&str>,
) -> Result<&'static str, &'static str> {
    let words = ["succeeded", "failed", "retry", "unknown"];
    // A receipt keyturn cannot store is the element's argument error too.
    let unreadable = receipt.is_some_and(|r| parse_bounded(r).is_err());
    if !outcome.is_some_and(|o| words.contains(&o))
        || delay.is_some_and(|d| d.starts_with('-'))
        || unreadable
    {
        return Err("22023");
    }
    let Some(j) = id.and_then(|id| jobs.get_mut(&id)) else {
        return Err("55000");
    };
    if lease.is_none() || j.lease != lease {
        return Err("55000");
    }
    let next = match (j.status, outcome.unwrap_or_default()) {
        ("leased", "retry") => "queued",
        ("executing", "succeeded") => "succeeded",
        ("executing", "failed") => "failed",
        ("executing", "unknown") => "uncertain",
        ("executing", "retry") if j.attempts < 3 => "queued",
        ("executing", "retry") => "failed",
        _ => return Err("55000"),
    };
    j.status = next;
    j.changes += 1;
    if next == "queued" {
        j.lease = None;
    }
    Ok(next)
}

pub async fn case(ctx: &mut Ctx<'_>) {
    let db = ctx.db;
    let alice = ctx.alice();
    let none = Ident::default();
    let tool = ctx.fx.open.clone();
    let mut mine = Vec::new();
    for _ in 0..ctx.draw(1usize..5) {
        let sql = "SELECT action_id, token FROM keyturn.propose($1, '{\"n\": 1}')";
        let Ok(rows) = ctx
            .call("propose external", &db.agent, &alice, sql, &[&tool])
            .await
        else {
            return;
        };
        let (id, token): (Uuid, String) = (rows[0].get(0), rows[0].get(1));
        mine.push(id);
        let sql = "SELECT status FROM keyturn.approve($1, $2)";
        let _ = ctx
            .call("approve", &db.human, &alice, sql, &[&id, &token])
            .await;
    }
    let provider = vec![ctx.fx.run.clone()];
    let sql = "SELECT action_id, lease_id, attempt FROM keyturn.lease('fuzz-batch', 100, '30 seconds', $1)";
    let Ok(rows) = ctx
        .call("lease", &db.dispatcher, &none, sql, &[&provider])
        .await
    else {
        return;
    };
    let mut jobs: HashMap<Uuid, Job> = HashMap::new();
    let mut leased: Vec<(Uuid, Uuid)> = Vec::new();
    for r in rows {
        let (id, lease, attempt): (Uuid, Uuid, i32) = (r.get(0), r.get(1), r.get(2));
        if !mine.contains(&id) {
            // Another case's job, approved under what that case left (an
            // epoch since bumped would invalidate it): handed back untouched.
            let sql = "SELECT keyturn.complete($1, $2, 'retry')";
            let _ = ctx
                .call("complete", &db.dispatcher, &none, sql, &[&id, &lease])
                .await;
            continue;
        }
        jobs.insert(
            id,
            Job {
                status: "leased",
                lease: Some(lease),
                attempts: attempt - 1,
                changes: 0,
            },
        );
        leased.push((id, lease));
    }
    if leased.is_empty() {
        return;
    }

    // begin_dispatch_many over a hostile batch.
    let mut elements: Vec<(Option<Uuid>, Option<Uuid>)> = Vec::new();
    for _ in 0..ctx.draw(1usize..10) {
        let (id, lease) = leased[ctx.draw(0..leased.len())];
        let e = match ctx.draw(0u8..10) {
            0..=4 => (Some(id), Some(lease)),
            5 => (Some(id), Some(Uuid::new_v4())),
            6 => (Some(id), None),
            7 => (Some(Uuid::new_v4()), Some(lease)),
            8 => (None, Some(lease)),
            _ => elements.last().copied().unwrap_or((Some(id), Some(lease))),
        };
        elements.push(e);
    }
    let ids: Vec<Option<Uuid>> = elements.iter().map(|e| e.0).collect();
    let leases: Vec<Option<Uuid>> = elements.iter().map(|e| e.1).collect();
    ctx.input("begin batch", &format!("{elements:?}"));
    let sql = "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)";
    // Equal arrays under 1000 elements: no error is the whole batch's.
    let rows = match ctx
        .call(
            "begin_dispatch_many",
            &db.dispatcher,
            &none,
            sql,
            &[&ids, &leases],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) => return ctx.finding(format!("begin_dispatch_many failed the whole batch: {e}")),
    };
    if rows.len() != elements.len() {
        return ctx.finding(format!(
            "begin_dispatch_many answered {} rows for {} elements",
            rows.len(),
            elements.len()
        ));
    }
    for (i, (r, &(id, lease))) in rows.iter().zip(&elements).enumerate() {
        let (got_id, dispatch, error): (Option<Uuid>, bool, Option<String>) =
            (r.get(0), r.get(1), r.get(2));
        let want = expect_begin(&mut jobs, id, lease);
        let agrees = got_id == id
            && match (&want, dispatch, error.as_deref()) {
                (Ok(()), true, None) => true,
                (Err(code), false, Some(e)) => e.starts_with(code),
                _ => false,
            };
        if !agrees {
            ctx.finding(format!(
                "begin_dispatch_many element {i} ({id:?}, {lease:?}): got ({got_id:?}, {dispatch}, {error:?}), one call after another gives {want:?}"
            ));
        }
    }

    // complete_many over another.
    let mut items = Vec::new();
    for _ in 0..ctx.draw(1usize..10) {
        let (id, lease) = leased[ctx.draw(0..leased.len())];
        let (id, lease) = match ctx.draw(0u8..10) {
            0..=6 => (Some(id), Some(lease)),
            7 => (Some(id), Some(Uuid::new_v4())),
            8 => (Some(Uuid::new_v4()), Some(lease)),
            _ => (None, None),
        };
        let outcome = ctx.draw(prop::sample::select(vec![
            Some("succeeded"),
            Some("failed"),
            Some("retry"),
            Some("retry"),
            Some("unknown"),
            Some("finished"),
            Some(""),
            None,
        ]));
        let delay = ctx.draw(prop::sample::select(vec![
            None,
            None,
            Some("0"),
            Some("3 seconds"),
            Some("-1 second"),
            Some("1 year"),
            Some("1000 years"),
        ]));
        let receipt = if ctx.roll(30) {
            let text = ctx.draw(json_any()).to_string();
            ctx.jsonb(&text).await.map(|_| text)
        } else {
            Some(json!({"status": 200}).to_string())
        };
        items.push((id, lease, outcome, receipt, delay));
    }
    ctx.input("complete batch", &format!("{items:?}"));
    let ids: Vec<Option<Uuid>> = items.iter().map(|i| i.0).collect();
    let leases: Vec<Option<Uuid>> = items.iter().map(|i| i.1).collect();
    let outcomes: Vec<Option<&str>> = items.iter().map(|i| i.2).collect();
    let receipts: Vec<Option<String>> = items.iter().map(|i| i.3.clone()).collect();
    let delays: Vec<Option<&str>> = items.iter().map(|i| i.4).collect();
    let sql = "SELECT action_id, status, error FROM keyturn.complete_many($1, $2, $3, $4::text[]::jsonb[], $5::text[]::interval[])";
    let rows = match ctx
        .call(
            "complete_many",
            &db.dispatcher,
            &none,
            sql,
            &[&ids, &leases, &outcomes, &receipts, &delays],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) => return ctx.finding(format!("complete_many failed the whole batch: {e}")),
    };
    if rows.len() != items.len() {
        return ctx.finding(format!(
            "complete_many answered {} rows for {} elements",
            rows.len(),
            items.len()
        ));
    }
    for (i, (r, item)) in rows.iter().zip(&items).enumerate() {
        let (got_id, status, error): (Option<Uuid>, Option<String>, Option<String>) =
            (r.get(0), r.get(1), r.get(2));
        let want = expect_complete(&mut jobs, item.0, item.1, item.2, item.4, item.3.as_deref());
        let agrees = got_id == item.0
            && match (&want, status.as_deref(), error.as_deref()) {
                (Ok(s), Some(got), None) => got == *s,
                (Err(code), None, Some(e)) => e.starts_with(code),
                _ => false,
            };
        if !agrees {
            ctx.finding(format!(
                "complete_many element {i}: got ({got_id:?}, {status:?}, {error:?}), one call after another gives {want:?}"
            ));
        }
    }

    // The database agrees with the oracle.
    for (id, job) in &jobs {
        let sql = "SELECT a.status::text, a.attempts, o.status::text, \
                          (SELECT count(*) FROM keyturn.event e WHERE e.action_id = a.id AND e.from_status IN ('executing', 'leased') \
                              AND e.at >= (SELECT max(l.at) FROM keyturn.event l WHERE l.action_id = a.id AND l.to_status = 'leased')), \
                          coalesce(a.next_attempt_at <= clock_timestamp() + interval '1 day', true) \
                     FROM keyturn.action a LEFT JOIN keyturn.open_action o ON o.action_id = a.id WHERE a.id = $1";
        let Ok(r) = db.su.query_one(sql, &[id]).await else {
            ctx.finding(format!("action {id} could not be read back"));
            continue;
        };
        let (status, attempts, open, since_lease, capped): (
            String,
            i32,
            Option<String>,
            i64,
            bool,
        ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let is_final = ["succeeded", "failed"].contains(&job.status);
        if status != job.status || attempts != job.attempts {
            ctx.finding(format!(
                "action {id} is {status} after {attempts} attempts; the oracle says {job:?}"
            ));
        }
        // The work list lists an executing action as leased.
        let listed = if job.status == "executing" {
            "leased"
        } else {
            job.status
        };
        if open.as_deref() != (!is_final).then_some(listed) {
            ctx.finding(format!(
                "action {id} is {status} with work-list row {open:?}"
            ));
        }
        if since_lease != job.changes {
            ctx.finding(format!(
                "action {id}: {since_lease} events since its lease for {} status changes",
                job.changes
            ));
        }
        if !capped {
            ctx.finding(format!("action {id} is due more than a day from now"));
        }
    }
    // Hand back what is still leased, so later cases' drains find it due.
    for (id, job) in &jobs {
        if let (Some(lease), "leased") = (job.lease, job.status) {
            let sql = "SELECT keyturn.complete($1, $2, 'retry')";
            let _ = ctx
                .call("complete", &db.dispatcher, &none, sql, &[id, &lease])
                .await;
        }
    }
}
