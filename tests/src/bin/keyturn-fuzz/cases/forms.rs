//! sql forms: propose a generated form (well-formed, hostile, or not a form
//! at all) for the fixture's wide tool, compare the targets keyturn stored
//! with the rows the oracle says the form names, show the card, approve,
//! replay, and check the table changed exactly as approved and nowhere else.

use std::collections::BTreeSet;

use keyturn_core::canonical::parse_bounded;
use proptest::prelude::*;
use serde_json::Value;

use super::Ctx;
use crate::generators::forms::{form, hostile_form, not_a_form, with_duplicate_key, SET, WHERE};
use crate::oracle::{check_write, expected_targets, snapshot};

pub async fn case(ctx: &mut Ctx<'_>) {
    let text = ctx.draw(prop_oneof![
        6 => form(WHERE, SET).prop_map(|f| f.to_string()),
        3 => hostile_form(WHERE, SET).prop_map(|f| f.to_string()),
        1 => not_a_form().prop_map(|f| f.to_string()),
        1 => with_duplicate_key(WHERE, SET),
    ]);
    let tool = ctx.fx.wide.clone();
    propose_and_approve(ctx, &tool, WHERE, SET, &text).await;
}

/// The whole path of one form (as JSON text) for an sql tool whose lists are
/// `where_cols` and `set_cols` (and whose max_targets is the fixture's). The
/// oracle reads the form as PostgreSQL's jsonb reads the text, as keyturn does.
pub async fn propose_and_approve(
    ctx: &mut Ctx<'_>,
    tool: &str,
    where_cols: &[&str],
    set_cols: &[&str],
    text: &str,
) {
    let db = ctx.db;
    let text = text.to_owned();
    ctx.input("form", &text);
    let Some(pg_text) = ctx.jsonb(&text).await else {
        return;
    };
    // What keyturn reads: PostgreSQL's jsonb text, parsed within keyturn's bounds.
    let expected = match parse_bounded(&pg_text) {
        Ok(seen) => expected_targets(&db.su, ctx.fx, tool, where_cols, set_cols, &seen).await,
        Err(e) => Err(e.to_string()),
    };
    let seen = parse_bounded(&pg_text).unwrap_or(Value::Null);
    let before = snapshot(&db.su, ctx.fx).await;
    let alice = ctx.alice();
    let sql = "SELECT action_id, token, status FROM keyturn.propose($1, $2::text::jsonb)";
    let r = ctx
        .call("propose sql", &db.agent, &alice, sql, &[&tool, &text])
        .await;
    let rows = match (r, &expected) {
        (Ok(rows), Ok(_)) => rows,
        (Ok(_), Err(why)) => {
            return ctx.finding(format!(
                "propose accepted a form the oracle refuses ({why})"
            ))
        }
        (Err(e), Ok(ids)) => {
            let code = e.code().map_or("none", |c| c.code()).to_owned();
            let msg = crate::judge::message::<()>(&Err(e));
            return ctx.finding(format!(
                "propose refused ({code} {msg}) a form naming rows {ids:?}"
            ));
        }
        (Err(e), Err(_)) => {
            if e.code().map(|c| c.code()) != Some("22023") {
                let msg = crate::judge::message::<()>(&Err(e));
                ctx.finding(format!(
                    "propose refused a bad form with something other than 22023: {msg}"
                ));
            }
            if let Some(f) =
                check_write(&db.su, ctx.fx, &before, "refused", &BTreeSet::new(), &seen).await
            {
                ctx.finding(format!("after a refused propose: {f}"));
            }
            return;
        }
    };
    let Some(row) = rows.first() else {
        return ctx.finding("propose returned no row".into());
    };
    let (id, token, status): (uuid::Uuid, Option<String>, String) =
        (row.get(0), row.get(1), row.get(2));
    let stored: BTreeSet<i64> = db
        .su
        .query(
            "SELECT key::bigint FROM keyturn.action_target WHERE action_id = $1",
            &[&id],
        )
        .await
        .expect("targets")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want: BTreeSet<i64> = expected.clone().unwrap_or_default().into_iter().collect();
    if stored != want {
        ctx.finding(format!(
            "propose stored targets {stored:?}, the form names {want:?}"
        ));
    }
    let (Some(token), "pending") = (token, status.as_str()) else {
        return; // a standing approval covered it (no such approval here), or a task
    };

    // The card's keys only: its before values are the table's, whatever they hold.
    let sql = "SELECT jsonb_path_query_array(keyturn.preview($1, $2), '$.targets[*].key')::text";
    if let Ok(rows) = ctx
        .call("preview", &db.human, &alice, sql, &[&id, &token])
        .await
    {
        let keys: Vec<String> = serde_json::from_str(rows[0].get::<_, &str>(0)).unwrap_or_default();
        let keys: BTreeSet<i64> = keys.iter().filter_map(|k| k.parse().ok()).collect();
        if keys != stored {
            ctx.finding(format!(
                "the card shows targets {keys:?}, the proposal holds {stored:?}"
            ));
        }
    }

    let sql = "SELECT status FROM keyturn.approve($1, $2)";
    let Ok(rows) = ctx
        .call("approve", &db.human, &alice, sql, &[&id, &token])
        .await
    else {
        return;
    };
    let status: String = rows[0].get(0);
    if !["succeeded", "conflict", "failed"].contains(&status.as_str()) {
        ctx.finding(format!("approve of a fresh sql proposal answered {status}"));
    }
    if let Some(f) = check_write(&db.su, ctx.fx, &before, &status, &stored, &seen).await {
        ctx.finding(format!("after approve: {f}"));
    }
    let after = snapshot(&db.su, ctx.fx).await;
    if let Ok(rows) = ctx
        .call("approve (replay)", &db.human, &alice, sql, &[&id, &token])
        .await
    {
        let again: String = rows[0].get(0);
        if again != status {
            ctx.finding(format!("a replay answered {again}, the approval {status}"));
        }
    }
    if let Some(f) = check_write(&db.su, ctx.fx, &after, "replay", &BTreeSet::new(), &seen).await {
        ctx.finding(format!("after a replay: {f}"));
    }
}
