//! External params: a tool registered with a generated params schema gets
//! params the generator made to fit it (propose must take them) or not
//! (propose must refuse them, 22023); the fixture's open tool gets any JSON,
//! hostile numbers and keys included, and hostile origins. What is accepted
//! is approved, leased and dispatched, and the lease must hand out exactly
//! the params proposed.

use keyturn_core::canonical::{params_hash, parse_bounded};
use keyturn_core::credentials::find_credential;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::Ctx;
use crate::db::Ident;
use crate::generators::schemas::schema_and_params;
use crate::generators::text::hostile_text;
use crate::generators::{deep, hostile_key, hostile_number, json_any, params};

pub async fn case(ctx: &mut Ctx<'_>) {
    if ctx.roll(50) {
        with_schema(ctx).await;
    } else {
        open(ctx).await;
    }
    ctx.drain().await;
}

async fn with_schema(ctx: &mut Ctx<'_>) {
    let db = ctx.db;
    let (schema, p, verdict) = ctx.draw(schema_and_params());
    let tool = format!("{}.p{}", ctx.fx.run, ctx.case);
    let spec = json!({"executor": "external", "provider": ctx.fx.run, "effect": "reversible", "params_schema": schema});
    ctx.input("spec", &spec.to_string());
    let none = Ident::default();
    let sql = "SELECT keyturn.register_tool($1, $2)";
    if ctx
        .call("register_tool", &db.admin, &none, sql, &[&tool, &spec])
        .await
        .is_err()
    {
        return ctx.finding("register_tool refused a schema inside the subset".into());
    }
    let tenant = ctx.fx.tenant.clone();
    let sql = "SELECT keyturn.grant_tool($1, 'alice', $2)";
    let _ = ctx
        .call("grant_tool", &db.admin, &none, sql, &[&tenant, &tool])
        .await;
    let (status, code, msg) = propose(ctx, &tool, &p, &json!({})).await;
    // Params that hold credential material, or numbers keyturn cannot hash
    // exactly, are refused whatever the schema says.
    let clean = find_credential(&p).is_none() && params_hash(&tool, &p).is_ok();
    match (verdict, code.as_str()) {
        (Some(true), "ok") | (Some(false), "22023") | (None, _) => {}
        (Some(true), "22023") if !clean => {}
        (Some(true), _) => ctx.finding(format!(
            "propose refused params that fit the schema: {code} {msg}"
        )),
        (Some(false), _) => ctx.finding(format!("propose took params the schema forbids ({code})")),
    }
    if let Some((id, token)) = status {
        approve_external(ctx, id, &token).await;
    }
}

async fn open(ctx: &mut Ctx<'_>) {
    let p = ctx.draw(prop_oneof![
        3 => params(),
        2 => json_any().prop_map(|v| json!({"to": "x", "value": v})),
        1 => deep().prop_map(|v| json!({"deep": v})),
        1 => hostile_number().prop_map(|n| json!({"n": n})),
        1 => (hostile_key(), hostile_text()).prop_map(|(k, t)| json!({k: t})),
    ]);
    let origin = ctx.draw(prop_oneof![
        3 => Just(json!({})),
        1 => hostile_text().prop_map(|t| json!({"conversation_id": t, "turn_id": "t1"})),
        1 => (hostile_key(), json_any()).prop_map(|(k, v)| json!({k: v})),
        1 => (0usize..3, 95usize..105).prop_map(|(kind, n)| match kind {
            0 => json!({"evidence": vec!["e"; n]}),
            1 => json!({"message_id": "m".repeat(n * 2)}),
            _ => json!({"evidence": [1, null, ""]}),
        }),
    ]);
    let tool = ctx.fx.open.clone();
    let (status, code, _) = propose(ctx, &tool, &p, &origin).await;
    if let (Some((id, token)), "ok") = (status, code.as_str()) {
        approve_external(ctx, id, &token).await;
    }
}

/// propose as alice: the new pending action (id, token) if any, the
/// outcome's code and message.
async fn propose(
    ctx: &mut Ctx<'_>,
    tool: &str,
    p: &Value,
    origin: &Value,
) -> (Option<(uuid::Uuid, String)>, String, String) {
    let db = ctx.db;
    let text = p.to_string();
    let origin_text = origin.to_string();
    ctx.input("params", &text);
    ctx.input("origin", &origin_text);
    let Some(pg) = ctx.jsonb(&text).await else {
        return (None, "jsonb".into(), String::new());
    };
    if ctx.jsonb(&origin_text).await.is_none() {
        return (None, "jsonb".into(), String::new());
    }
    let alice = ctx.alice();
    let sql = "SELECT action_id, token, status FROM keyturn.propose($1, $2::text::jsonb, $3::text::jsonb)";
    let r = ctx
        .call(
            "propose external",
            &db.agent,
            &alice,
            sql,
            &[&tool, &text, &origin_text],
        )
        .await;
    let code = crate::judge::code(&r);
    let msg = crate::judge::message(&r);
    if let Ok(rows) = &r {
        let stored: Option<Value> = db
            .su
            .query_one(
                "SELECT params FROM keyturn.action WHERE id = $1",
                &[&rows[0].get::<_, uuid::Uuid>(0)],
            )
            .await
            .ok()
            .and_then(|r| r.get(0));
        if stored.is_some() && stored != parse_bounded(&pg).ok() {
            ctx.finding("the stored params differ from what PostgreSQL read".into());
        }
        let (id, token, status): (uuid::Uuid, Option<String>, String) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
        if status == "pending" {
            return (token.map(|t| (id, t)), code, msg);
        }
    }
    (None, code, msg)
}

async fn approve_external(ctx: &mut Ctx<'_>, id: uuid::Uuid, token: &str) {
    let db = ctx.db;
    let alice = ctx.alice();
    let sql = "SELECT status FROM keyturn.approve($1, $2)";
    if let Ok(rows) = ctx
        .call("approve", &db.human, &alice, sql, &[&id, &token])
        .await
    {
        let status: String = rows[0].get(0);
        if status != "queued" {
            ctx.finding(format!(
                "approve of a fresh external proposal answered {status}"
            ));
        }
    }
}
