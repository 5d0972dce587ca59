//! docs/sql-api.md: register_tool, set_tool_enabled, classify.

use keyturn_tests::*;
use serde_json::{json, Value};

async fn register(w: &World, name: &str, spec: Value) -> Result<i32, tokio_postgres::Error> {
    w.admin
        .query_one("SELECT keyturn.register_tool($1, $2)", &[&name, &spec])
        .await
        .map(|r| r.get(0))
}

fn deal_sql() -> Value {
    json!({"table": "crm.deal", "key": "id", "version": "xmin", "set": ["stage"], "where": ["id"]})
}

async fn classify(w: &World, name: Option<&str>) -> String {
    w.agent
        .query_one("SELECT keyturn.classify($1)", &[&name])
        .await
        .expect("classify never errors")
        .get(0)
}

#[tokio::test]
async fn test_register_rejects_bad_specs() {
    let w = World::new("admin").await;
    let bad: Vec<(&str, Value)> = vec![
        (
            "unknown key",
            json!({"executor": "sql", "sql": deal_sql(), "confirm": true}),
        ),
        ("not an object", json!([1])),
        ("write without executor", json!({"kind": "write"})),
        ("unknown executor", json!({"executor": "shell"})),
        (
            "unknown kind",
            json!({"kind": "maybe", "executor": "sql", "sql": deal_sql()}),
        ),
        (
            "expires_in over 7 days",
            json!({"executor": "sql", "sql": deal_sql(), "expires_in": "7 days 1 second"}),
        ),
        (
            "expires_in not interval",
            json!({"executor": "sql", "sql": deal_sql(), "expires_in": "soon"}),
        ),
        (
            "expires_in zero",
            json!({"executor": "sql", "sql": deal_sql(), "expires_in": "0 seconds"}),
        ),
        (
            "digest on sql",
            json!({"executor": "sql", "sql": deal_sql(), "retain": "digest"}),
        ),
        (
            "bad retain",
            json!({"executor": "sql", "sql": deal_sql(), "retain": "some"}),
        ),
        (
            "bad effect",
            json!({"executor": "sql", "sql": deal_sql(), "effect": "undoable"}),
        ),
        (
            "bad approval",
            json!({"executor": "sql", "sql": deal_sql(), "approval": "nobody"}),
        ),
        (
            "max_targets zero",
            json!({"executor": "sql", "sql": deal_sql(), "max_targets": 0}),
        ),
        (
            "max_targets fraction",
            json!({"executor": "sql", "sql": deal_sql(), "max_targets": 1.5}),
        ),
        (
            "sql table missing",
            json!({"executor": "sql", "sql": {"key": "id", "set": ["stage"], "where": ["id"]}}),
        ),
        (
            "sql table unknown",
            json!({"executor": "sql", "sql": {"table": "crm.nope", "key": "id", "set": ["stage"], "where": ["id"]}}),
        ),
        (
            "sql column unknown",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "set": ["stagee"], "where": ["id"]}}),
        ),
        (
            "sql where column unknown",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id; drop"]}}),
        ),
        (
            "sql set includes key",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "set": ["id", "stage"], "where": ["id"]}}),
        ),
        (
            "sql set includes version",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "version": "revision", "set": ["revision"], "where": ["id"]}}),
        ),
        (
            "sql system column",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "set": ["xmin"], "where": ["id"]}}),
        ),
        (
            "sql no where",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "set": ["stage"]}}),
        ),
        (
            "sql unknown sql key",
            json!({"executor": "sql", "sql": {"table": "crm.deal", "key": "id", "set": ["stage"], "where": ["id"], "raw": "x"}}),
        ),
        (
            "sql on external",
            json!({"executor": "external", "provider": "webhook", "sql": deal_sql()}),
        ),
        (
            "provider on sql",
            json!({"executor": "sql", "sql": deal_sql(), "provider": "webhook"}),
        ),
        ("external without provider", json!({"executor": "external"})),
        (
            "schema keyword unknown",
            json!({"executor": "external", "provider": "webhook", "params_schema": {"type": "object", "patternProperties": {}}}),
        ),
        (
            "targets_param not a property",
            json!({"executor": "external", "provider": "webhook", "targets_param": "to"}),
        ),
        (
            "rate_limit shape",
            json!({"executor": "sql", "sql": deal_sql(), "rate_limit": {"max": 2}}),
        ),
        (
            "rate_limit extra",
            json!({"executor": "sql", "sql": deal_sql(), "rate_limit": {"max": 2, "per": "1 hour", "burst": 3}}),
        ),
        (
            "params_schema on sql",
            json!({"executor": "sql", "sql": deal_sql(), "params_schema": {"type": "object"}}),
        ),
        (
            "targets_param on sql",
            json!({"executor": "sql", "sql": deal_sql(), "targets_param": "id"}),
        ),
        (
            "expires_in a number",
            json!({"executor": "sql", "sql": deal_sql(), "expires_in": 900}),
        ),
        (
            "expires_in 8 days",
            json!({"executor": "sql", "sql": deal_sql(), "expires_in": "1 week 1 day"}),
        ),
        (
            "summary placeholder",
            json!({"executor": "sql", "sql": deal_sql(), "summary": "Set {set.stage"}),
        ),
    ];
    for (why, spec) in bad {
        let name = unique("bad");
        assert_eq!(sqlstate(register(&w, &name, spec).await), "22023", "{why}");
        assert_eq!(
            classify(&w, Some(&name)).await,
            "unsupported",
            "{why}: nothing registered"
        );
    }
}

#[tokio::test]
async fn test_register_name_must_be_plain_ascii() {
    let w = World::new("admin").await;
    let too_long = "a".repeat(64);
    for name in [
        "s\u{0435}nd_email",
        "send email",
        "",
        "x;drop",
        "é",
        "-send",
        "1send",
        "_send",
        "send.",
        ".send",
        "send..email",
        "send.-email",
        "send/email",
        too_long.as_str(),
    ] {
        assert_eq!(
            sqlstate(register(&w, name, json!({"kind": "read"})).await),
            "22023",
            "{name:?}"
        );
    }
    // The look-alike of a real tool is unknown to propose.
    let real = w.webhook_tool(json!({})).await;
    let fake = real.replacen('o', "\u{043e}", 1); // Cyrillic о
    assert_ne!(fake, real);
    let r = w.propose(&fake, json!({"channel": "c", "text": "t"})).await;
    assert_eq!(sqlstate(r), "42704");
}

/// MCP servers name their tools in either case and with hyphens
/// (`getTinyImage`, `get-weather`); keyturn keeps such names as they are
/// spelled, and refuses one that differs from a registered tool's only in
/// case, which a person reading a card takes for the same tool.
#[tokio::test]
async fn test_names_take_either_case_and_hyphens_but_never_only_a_case_apart() {
    let w = World::new("admin").await;
    let ns = unique("kt_test_case").replace('-', "_");
    let spec = json!({"executor": "external", "provider": "webhook"});
    let name = format!("{ns}.getTiny-Image");
    assert_eq!(register(&w, &name, spec.clone()).await.unwrap(), 1);
    assert_eq!(register(&w, &name, spec.clone()).await.unwrap(), 2);
    let max = format!("{ns}.{}", "X".repeat(63 - ns.len() - 1));
    assert_eq!(register(&w, &max, spec.clone()).await.unwrap(), 1);
    for twin in [
        name.to_lowercase(),
        name.to_uppercase(),
        format!("{ns}.GetTiny-Image"),
    ] {
        let e = register(&w, &twin, spec.clone()).await.unwrap_err();
        let e = e.as_db_error().expect("a database error");
        assert_eq!(e.code().code(), "22023", "{twin}");
        let msg = e.message().to_owned();
        assert!(msg.contains("only in case") && msg.contains(&name), "{msg}");
    }
    // Such a tool is proposed and approved as any other, under its own name.
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, true)", &[&name])
        .await
        .unwrap();
    w.grant(&w.principal, &name).await;
    let p = w.propose(&name, json!({})).await.unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    let tool: String = w
        .superuser
        .query_one("SELECT tool FROM keyturn.action WHERE id = $1", &[&p.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tool, name);
    // Only the exact spelling names it.
    let r = w.propose(&name.to_lowercase(), json!({})).await;
    assert_eq!(sqlstate(r), "42704");
    // Projections alike (fourteenth red-team pass, docs/security.md row 109).
    let projection = json!({"fields": {"n": {"max_length": 10}}});
    let provider = format!("{ns}.Proj");
    w.admin
        .query_one(
            "SELECT keyturn.register_projection($1, $2)",
            &[&provider, &projection],
        )
        .await
        .unwrap();
    let twin = w
        .admin
        .query_one(
            "SELECT keyturn.register_projection($1, $2)",
            &[&provider.to_lowercase(), &projection],
        )
        .await;
    assert_eq!(sqlstate(twin), "22023");
    // Folded as ASCII whatever the database's collation: under a Turkish
    // one lower('Index') is 'ındex', and 'Index' and 'index' were two names.
    for index in ["tool_name_folded", "projection_name_folded"] {
        let def: String = w
            .superuser
            .query_one(
                "SELECT pg_get_indexdef(format('keyturn.%I', $1::text)::regclass)",
                &[&index],
            )
            .await
            .unwrap()
            .get(0);
        assert!(def.contains("COLLATE \"C\""), "{def}");
    }
}

#[tokio::test]
async fn test_versions_increment_and_keep_grants_and_enabled() {
    let w = World::new("member").await;
    let name = w.deal_tool(json!({})).await; // version 1, granted
    let deal = w.deals(&w.principal, 1).await[0];
    let spec = json!({"executor": "sql", "sql": deal_sql()});
    assert_eq!(register(&w, &name, spec.clone()).await.unwrap(), 2);
    assert_eq!(register(&w, &name, spec.clone()).await.unwrap(), 3);
    // The grant carried over: propose works without a new grant.
    let p = w
        .propose(
            &name,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        )
        .await
        .expect("grant carried over");
    assert_eq!(w.approve(&p).await.unwrap().0, "succeeded");
    // The enabled flag carries over too.
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&name])
        .await
        .unwrap();
    assert_eq!(register(&w, &name, spec).await.unwrap(), 4);
    assert_eq!(
        classify(&w, Some(&name)).await,
        "unsupported",
        "re-registering must not re-enable"
    );
    let r = w
        .propose(
            &name,
            json!({"where": {"id": deal}, "set": {"stage": "lost"}}),
        )
        .await;
    assert_eq!(sqlstate(r), "42704");
}

#[tokio::test]
async fn test_reregister_invalidates_older_proposals() {
    let w = World::new("member").await;
    let name = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w
        .propose(
            &name,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    register(&w, &name, json!({"executor": "sql", "sql": deal_sql()}))
        .await
        .unwrap();
    assert_eq!(w.approve(&p).await.unwrap().0, "invalidated");
    assert_eq!(w.stage_of(deal).await, "lead");
    assert_eq!(w.writes(deal).await, 0);
}

#[tokio::test]
async fn test_disable_refuses_proposals_and_invalidates_pending() {
    let w = World::new("member").await;
    let name = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let form = json!({"where": {"id": deal}, "set": {"stage": "won"}});
    let p = w.propose(&name, form.clone()).await.unwrap();
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&name])
        .await
        .unwrap();
    assert_eq!(sqlstate(w.propose(&name, form.clone()).await), "42704");
    assert_eq!(w.approve(&p).await.unwrap().0, "invalidated");
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, true)", &[&name])
        .await
        .unwrap();
    let p2 = w
        .propose(&name, form)
        .await
        .expect("re-enabled tool takes proposals");
    assert_eq!(w.approve(&p2).await.unwrap().0, "succeeded");
    let r = w
        .admin
        .execute(
            "SELECT keyturn.set_tool_enabled($1, true)",
            &[&unique("ghost")],
        )
        .await;
    assert_eq!(sqlstate(r), "42704");
}

#[tokio::test]
async fn test_classify_read_write_unsupported() {
    let w = World::new("member").await;
    let read = w.tool("lookup", json!({"kind": "read"})).await;
    let write = w.deal_tool(json!({})).await;
    let implicit = w
        .tool("implicit", json!({"executor": "sql", "sql": deal_sql()}))
        .await;
    assert_eq!(classify(&w, Some(&read)).await, "read");
    assert_eq!(classify(&w, Some(&write)).await, "write");
    assert_eq!(
        classify(&w, Some(&implicit)).await,
        "write",
        "only an explicit kind=read is read-only"
    );
    assert_eq!(classify(&w, Some(&unique("ghost"))).await, "unsupported");
    assert_eq!(classify(&w, None).await, "unsupported");
    assert_eq!(classify(&w, Some("")).await, "unsupported");
    assert_eq!(
        classify(&w, Some("x'); DROP TABLE crm.deal; --")).await,
        "unsupported"
    );
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&read])
        .await
        .unwrap();
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&write])
        .await
        .unwrap();
    assert_eq!(classify(&w, Some(&read)).await, "unsupported");
    assert_eq!(classify(&w, Some(&write)).await, "unsupported");
}

#[tokio::test]
async fn test_register_requires_admin_role() {
    for role in ["app_agent", "app_human", "app_dispatcher", "app_operator"] {
        let c = connect(role).await;
        let r = c
            .query(
                "SELECT keyturn.register_tool($1, '{\"kind\":\"read\"}')",
                &[&unique("x")],
            )
            .await;
        assert_eq!(sqlstate(r), "42501", "{role}");
    }
}

#[tokio::test]
async fn test_expires_in_boundaries_and_default() {
    let w = World::new("member").await;
    for ok in ["7 days", "168 hours", "1 second"] {
        let name = unique("exp");
        register(
            &w,
            &name,
            json!({"executor": "sql", "sql": deal_sql(), "expires_in": ok}),
        )
        .await
        .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    // Default 15 minutes, measured on a real proposal.
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let row = w
        .agent
        .query_one(
            "SELECT extract(epoch FROM expires_at - now())::float8 FROM keyturn.propose($1, $2)",
            &[&t, &json!({"where": {"id": deal}, "set": {"stage": "won"}})],
        )
        .await
        .unwrap();
    let secs: f64 = row.get(0);
    assert!(
        (880.0..=905.0).contains(&secs),
        "default expiry is 15 minutes, got {secs}s"
    );
}
