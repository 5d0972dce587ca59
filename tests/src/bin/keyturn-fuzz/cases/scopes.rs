//! Scopes: a generated scope (well-formed or hostile, as text, duplicate keys
//! and all) on a grant of the open tool, or on a standing approval of it.
//! keyturn must take exactly the scopes keyturn-core's check_scope takes,
//! store the normalized form, and then allow or cover exactly the params
//! core's scope_violation says the scope allows: the SQL path and the core
//! must agree.

use keyturn_core::canonical::parse_bounded;
use keyturn_core::scope::{check_scope, scope_violation, Reach};
use proptest::prelude::*;
use serde_json::Value;

use super::Ctx;
use crate::db::Ident;
use crate::generators::{hostile_scope_text, params, scope};

pub async fn case(ctx: &mut Ctx<'_>) {
    let text =
        ctx.draw(prop_oneof![2 => scope().prop_map(|s| s.to_string()), 3 => hostile_scope_text()]);
    ctx.input("scope", &text);
    let Some(pg) = ctx.jsonb(&text).await else {
        return;
    };
    let core = parse_bounded(&pg).and_then(|v| check_scope(&v));
    let p = ctx.draw(params());
    let p_text = p.to_string();
    ctx.input("params", &p_text);
    let Some(p_pg) = ctx.jsonb(&p_text).await else {
        return;
    };
    if ctx.roll(50) {
        on_grant(ctx, &text, core.ok(), &p_text, &p_pg).await;
    } else {
        on_delegation(ctx, &text, core.ok(), &p_text, &p_pg).await;
    }
    ctx.drain().await;
}

async fn on_grant(ctx: &mut Ctx<'_>, text: &str, core: Option<Value>, p_text: &str, p_pg: &str) {
    let db = ctx.db;
    let none = Ident::default();
    let (tenant, tool) = (ctx.fx.tenant.clone(), ctx.fx.open.clone());
    let sql = "SELECT keyturn.grant_tool($1, 'alice', $2, $3::text::jsonb)";
    let r = ctx
        .call(
            "grant_tool (scope)",
            &db.admin,
            &none,
            sql,
            &[&tenant, &tool, &text],
        )
        .await;
    match (&r, &core) {
        (Ok(_), None) => return ctx.finding("grant_tool took a scope check_scope refuses".into()),
        (Err(_), Some(_)) => {
            let msg = crate::judge::message(&r);
            return ctx.finding(format!(
                "grant_tool refused a scope check_scope takes: {msg}"
            ));
        }
        (Err(_), None) => return,
        (Ok(_), Some(_)) => {}
    }
    let stored: Option<String> = db
        .su
        .query_one(
            "SELECT scope::text FROM keyturn.tool_grant WHERE tenant = $1 AND principal = 'alice' AND tool = $2",
            &[&tenant, &tool],
        )
        .await
        .ok()
        .and_then(|r| r.get(0));
    let normalized = core.expect("matched above");
    let stored = match stored {
        Some(s) => s,
        // An empty scope allows everything: a grant without one.
        None if normalized == serde_json::json!({}) => "{}".to_owned(),
        None => return ctx.finding("the scoped grant stored no scope".into()),
    };
    // PostgreSQL prints the stored numbers its own way (1e300 in full), so
    // the stored scope is compared by what keyturn reads it as.
    let reread = parse_bounded(&stored).and_then(|v| check_scope(&v));
    if reread.as_ref().ok() != Some(&normalized) {
        ctx.finding(format!(
            "the grant stored {stored}, which reads as {reread:?}, not {normalized}"
        ));
    }
    let want = scope_violation(&stored, p_pg, Some(1), Reach::Bounds)
        .ok()
        .flatten();
    let alice = ctx.alice();
    let sql = "SELECT action_id FROM keyturn.propose($1, $2::text::jsonb)";
    let r = ctx
        .call(
            "propose (scoped grant)",
            &db.agent,
            &alice,
            sql,
            &[&tool, &p_text],
        )
        .await;
    match (crate::judge::code(&r).as_str(), &want) {
        ("ok", None) | ("42501", Some(_)) | ("22023", _) => {}
        ("ok", Some(v)) => ctx.finding(format!(
            "propose went through a scope core says it violates: {v}"
        )),
        (code, None) => {
            let msg = crate::judge::message(&r);
            ctx.finding(format!(
                "propose refused ({code} {msg}) params core says the scope allows"
            ));
        }
        (code, Some(_)) => ctx.finding(format!(
            "propose outside the scope ended in {code}, not 42501"
        )),
    }
    // The next cases find the grant as the fixture made it.
    let _ = ctx
        .call(
            "grant_tool",
            &db.admin,
            &none,
            "SELECT keyturn.grant_tool($1, 'alice', $2)",
            &[&tenant, &tool],
        )
        .await;
}

async fn on_delegation(
    ctx: &mut Ctx<'_>,
    text: &str,
    core: Option<Value>,
    p_text: &str,
    p_pg: &str,
) {
    let db = ctx.db;
    let alice = ctx.alice();
    let tool = ctx.fx.open.clone();
    let sql = "SELECT keyturn.delegate($1, $2::text::jsonb, 1, interval '1 minute')";
    let r = ctx
        .call("delegate", &db.human, &alice, sql, &[&tool, &text])
        .await;
    let id: uuid::Uuid = match (r, &core) {
        (Ok(rows), Some(_)) => rows[0].get(0),
        (Ok(_), None) => return ctx.finding("delegate took a scope check_scope refuses".into()),
        (Err(e), Some(_)) => {
            let msg = crate::judge::message::<()>(&Err(e));
            return ctx.finding(format!("delegate refused a scope check_scope takes: {msg}"));
        }
        (Err(_), None) => return,
    };
    let stored: String = db
        .su
        .query_one(
            "SELECT scope::text FROM keyturn.delegation WHERE id = $1",
            &[&id],
        )
        .await
        .expect("the delegation")
        .get(0);
    let covers = scope_violation(&stored, p_pg, Some(1), Reach::Covers)
        .ok()
        .flatten()
        .is_none();
    let sql = "SELECT status, delegation_id FROM keyturn.propose($1, $2::text::jsonb)";
    let r = ctx
        .call(
            "propose (delegation)",
            &db.agent,
            &alice,
            sql,
            &[&tool, &p_text],
        )
        .await;
    if let Ok(rows) = &r {
        let (status, by): (String, Option<uuid::Uuid>) = (rows[0].get(0), rows[0].get(1));
        match (covers, by == Some(id)) {
            (true, false) => ctx.finding(format!(
                "a standing approval whose scope core says covers the call left it {status}"
            )),
            (false, true) => ctx.finding(format!(
                "a standing approval covered a call outside its scope ({status})"
            )),
            _ => {}
        }
    }
    let sql = "SELECT keyturn.revoke_delegation($1)";
    let _ = ctx
        .call("revoke_delegation", &db.human, &alice, sql, &[&id])
        .await;
}
