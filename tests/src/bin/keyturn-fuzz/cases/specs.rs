//! Tool specs: register a generated name and spec (well-formed external or
//! sql specs, or hostile ones). A name outside the rule must be refused; a
//! well-formed spec under a valid name must be taken; whatever is taken is
//! stored normalized, and registering the stored spec again stores the same.
//! Then a proposal for it, approved when it can be, the table checked.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::Value;

use super::Ctx;
use crate::db::Ident;
use crate::generators::forms::{form, SET, WHERE};
use crate::generators::schemas::fitting;
use crate::generators::specs::{external_spec, hostile_spec, hostile_tool_name, sql_spec};
use crate::oracle::{check_write, snapshot};

/// The tool name rule (docs/sql-api.md, "Tools"): dot-separated parts of
/// ASCII letters, digits, `_` and `-`, each starting with a letter, at most
/// 63 characters. (A valid name may still be refused as a case twin of a
/// registered one.)
fn valid_name(name: &str) -> bool {
    name.len() <= 63
        && name.split('.').all(|part| {
            let mut cs = part.chars();
            cs.next().is_some_and(|c| c.is_ascii_alphabetic())
                && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

pub async fn case(ctx: &mut Ctx<'_>) {
    let db = ctx.db;
    let provider: &'static str = ctx.fx.provider;
    let table = ctx.fx.table.clone();
    let own = format!("{}.s{}", ctx.fx.run, ctx.case);
    let name = ctx.draw(prop_oneof![9 => Just(own.clone()), 1 => hostile_tool_name()]);
    let (spec, well_formed) = ctx.draw(prop_oneof![
        2 => external_spec(provider).prop_map(|s| (s, true)),
        2 => sql_spec(table.clone()).prop_map(|s| (s, true)),
        3 => hostile_spec(provider, table).prop_map(|s| (s, false)),
    ]);
    let text = spec.to_string();
    ctx.input("name", &name);
    ctx.input("spec", &text);
    let Some(_) = ctx.jsonb(&text).await else {
        return;
    };
    let none = Ident::default();
    let sql = "SELECT keyturn.register_tool($1, $2::text::jsonb)";
    let r = ctx
        .call("register_tool", &db.admin, &none, sql, &[&name, &text])
        .await;
    let code = crate::judge::code(&r);
    if r.is_ok() && !valid_name(&name) {
        return ctx.finding(format!("register_tool took the name {name:?}"));
    }
    if r.is_err() && well_formed && name == own {
        let msg = crate::judge::message(&r);
        return ctx.finding(format!(
            "register_tool refused a well-formed spec: {code} {msg}"
        ));
    }
    if r.is_err() {
        return;
    }

    let stored = stored_spec(ctx, &name).await;
    let again = format!("{name}_again");
    if valid_name(&again) {
        let sql = "SELECT keyturn.register_tool($1, $2)";
        match ctx
            .call(
                "register_tool (stored spec)",
                &db.admin,
                &none,
                sql,
                &[&again, &stored],
            )
            .await
        {
            Ok(_) => {
                if stored_spec(ctx, &again).await != stored {
                    ctx.finding("registering the stored spec again stored another".into());
                }
            }
            Err(_) => ctx.finding("register_tool refused the spec it stored".into()),
        }
    }

    let tenant = ctx.fx.tenant.clone();
    let _ = ctx
        .call(
            "grant_tool",
            &db.admin,
            &none,
            "SELECT keyturn.grant_tool($1, 'alice', $2)",
            &[&tenant, &name],
        )
        .await;
    let p = if stored["executor"] == "sql" {
        ctx.draw(form(WHERE, SET))
    } else {
        ctx.draw(fitting(&stored["params_schema"]))
    };
    propose_and_approve(ctx, &name, &stored, &p).await;
    ctx.drain().await;
}

async fn stored_spec(ctx: &mut Ctx<'_>, name: &str) -> Value {
    ctx.db
        .su
        .query_one("SELECT v.spec FROM keyturn.tool t JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version WHERE t.name = $1", &[&name])
        .await
        .map(|r| r.get(0))
        .unwrap_or(Value::Null)
}

/// Any answer but an internal one; for an sql tool, an approval changes the
/// table exactly as the form says.
async fn propose_and_approve(ctx: &mut Ctx<'_>, tool: &str, spec: &Value, p: &Value) {
    let db = ctx.db;
    let text = p.to_string();
    ctx.input("params", &text);
    let Some(_) = ctx.jsonb(&text).await else {
        return;
    };
    let alice = ctx.alice();
    let before = snapshot(&db.su, ctx.fx).await;
    let sql = "SELECT action_id, token, status FROM keyturn.propose($1, $2::text::jsonb)";
    let Ok(rows) = ctx
        .call(
            "propose (registered)",
            &db.agent,
            &alice,
            sql,
            &[&tool, &text],
        )
        .await
    else {
        return;
    };
    let (id, token, status): (uuid::Uuid, Option<String>, String) =
        (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    let (Some(token), "pending") = (token, status.as_str()) else {
        return;
    };
    let sql = "SELECT status FROM keyturn.approve($1, $2)";
    let Ok(rows) = ctx
        .call(
            "approve (registered)",
            &db.human,
            &alice,
            sql,
            &[&id, &token],
        )
        .await
    else {
        return;
    };
    let status: String = rows[0].get(0);
    if spec["executor"] == "sql" {
        let targets: BTreeSet<i64> = db
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
        if let Some(f) = check_write(&db.su, ctx.fx, &before, &status, &targets, p).await {
            ctx.finding(format!("after approving {tool}: {f}"));
        }
    }
}
