//! keyturn over MCP, the database side (docs/sql-api.md, "Over MCP"): sql
//! read tools run as the agent under its RLS and answer only through fence;
//! what tools/list shows; the status an agent may read; tools discovered on
//! an upstream MCP server (disabled, classified fail-closed, hashed, a new
//! version when changed); the live definition checked right before an
//! upstream call (drift invalidates, nothing sent).

use keyturn_tests::*;
use serde_json::{json, Value};

async fn read(
    c: &impl Sql,
    tool: &str,
    args: Value,
) -> Result<(String, String), tokio_postgres::Error> {
    c.query_one(
        "SELECT guard, reference FROM keyturn.read($1, $2)",
        &[&tool, &args],
    )
    .await
    .map(|r| (r.get(0), r.get(1)))
}

/// The rows a fenced reference carries.
fn rows(reference: &str) -> Vec<Value> {
    let line = reference
        .split('\n')
        .nth(1)
        .expect("a fenced block has three lines");
    let v: Value = serde_json::from_str(line).expect("the middle line is JSON");
    v["rows"].as_array().cloned().unwrap_or_default()
}

/// An sql read tool over crm.deal and its projection, granted to the world's principal.
async fn deals_read_tool(w: &World, projection: Option<&str>) -> String {
    let proj = projection
        .map(str::to_owned)
        .unwrap_or_else(|| unique("p.deals"));
    let t = w
        .tool(
            "deals_read",
            json!({"kind": "read", "executor": "sql", "projection": proj,
                   "sql": {"table": "crm.deal", "key": "id", "select": ["id", "stage"],
                           "where": ["stage", "owner"], "max_rows": 2}}),
        )
        .await;
    if projection.is_none() {
        w.admin
            .execute(
                "SELECT keyturn.register_projection($1, $2)",
                &[&proj, &json!({"fields": {"rows[].id": {"max_length": 20}, "rows[].stage": {"max_length": 20}}})],
            )
            .await
            .expect("register_projection");
    }
    t
}

#[tokio::test]
async fn test_a_read_tool_reads_as_the_agent_under_rls_and_answers_fenced() {
    let w = World::new("member").await;
    let mine = w.deals(&w.principal, 3).await;
    let other = World::new("member").await;
    other.deals(&other.principal, 2).await;
    let t = deals_read_tool(&w, None).await;
    let (guard, reference) = read(&w.agent, &t, json!({"where": {"owner": w.principal}}))
        .await
        .unwrap();
    let got = rows(&reference);
    assert_eq!(got.len(), 2, "max_rows bounds the answer: {reference}");
    let mut sorted = mine.clone();
    sorted.sort_unstable();
    assert_eq!(got[0]["id"], json!(sorted[0]), "by key");
    let first = reference.lines().next().unwrap();
    assert!(guard.contains(first), "the guard names the block's markers");
    // Another tenant's rows are invisible, whatever the form says.
    let (_, reference) = read(&w.agent, &t, json!({"where": {"owner": other.principal}}))
        .await
        .unwrap();
    assert!(rows(&reference).is_empty(), "{reference}");
    // What was fenced is evidence the agent may cite.
    let n = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.evidence WHERE tenant = $1 AND kind = 'fence'",
        &[&w.tenant],
    )
    .await;
    assert_eq!(n, 2);
}

#[tokio::test]
async fn test_a_read_form_takes_only_its_columns_and_values_as_data() {
    let w = World::new("member").await;
    w.deals(&w.principal, 1).await;
    let t = deals_read_tool(&w, None).await;
    for bad in [
        json!({"where": {"name": "x"}}),
        json!({"where": {"stage": {"a": 1}}}),
        json!({"set": {"stage": "won"}}),
        json!({"where": {"stage": []}}),
        json!([1]),
    ] {
        assert_eq!(
            sqlstate(read(&w.agent, &t, bad.clone()).await),
            "22023",
            "{bad}"
        );
    }
    let (_, reference) = read(&w.agent, &t, json!({"where": {"stage": "x' OR true --"}}))
        .await
        .unwrap();
    assert!(rows(&reference).is_empty(), "a value is data: {reference}");
}

/// An sql read tool reads a table under the agent's row-level security: a
/// view selects with its owner's rights, past it (a materialized view has
/// none), and so does an agent role that owns the table; each is refused
/// when the tool is registered. A view was registered and then never read
/// (`55000` at every call; thirtieth red-team pass).
#[tokio::test]
async fn test_an_sql_read_tool_reads_a_table_under_the_agents_rls() {
    let w = World::new("member").await;
    let (view, owned) = (unique("deal_view"), unique("agent_owned"));
    // A table an agent role owns: its owner reads past row-level security
    // that is not forced, and may turn it off (thirty-first red-team pass).
    w.superuser
        .batch_execute(&format!(
            "CREATE VIEW crm.{view} AS SELECT id, tenant, stage FROM crm.deal; \
             CREATE MATERIALIZED VIEW crm.{view}_m AS SELECT id, tenant, stage FROM crm.deal; \
             CREATE TABLE crm.{owned} (id int PRIMARY KEY, tenant text); \
             ALTER TABLE crm.{owned} ENABLE ROW LEVEL SECURITY; \
             ALTER TABLE crm.{owned} OWNER TO app_agent"
        ))
        .await
        .unwrap();
    for (table, says) in [
        (view.clone(), "is not an existing table"),
        (format!("{view}_m"), "is not an existing table"),
        (owned.clone(), "past its row-level security"),
    ] {
        let r = w
            .admin
            .execute(
                "SELECT keyturn.register_tool($1, $2)",
                &[
                    &unique("read"),
                    &json!({"kind": "read", "executor": "sql", "projection": "p.x",
                            "sql": {"table": format!("crm.{table}"), "key": "id", "select": ["id", "tenant"]}}),
                ],
            )
            .await;
        let (state, message) = failure(r);
        assert_eq!(state, "22023", "{table}: {message}");
        assert!(message.contains(says), "{table}: {message}");
    }
    // Nothing of app_agent's outlives the test.
    w.superuser
        .batch_execute(&format!("DROP TABLE crm.{owned}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn test_a_read_without_a_registered_projection_reads_nothing() {
    let w = World::new("member").await;
    let t = deals_read_tool(&w, Some("p.never_registered")).await;
    assert_eq!(sqlstate(read(&w.agent, &t, json!({})).await), "22023");
    // A read tool with an executor needs a projection at all.
    let r = w
        .admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &unique("noproj"),
                &json!({"kind": "read", "executor": "sql",
                "sql": {"table": "crm.deal", "key": "id", "select": ["id"]}}),
            ],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
    // A projection names a read tool's output only.
    let r = w
        .admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &unique("wproj"),
                &json!({"executor": "external", "provider": "webhook", "projection": "x"}),
            ],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
}

#[tokio::test]
async fn test_reads_need_the_grant_and_a_read_tool() {
    let w = World::new("member").await;
    let t = deals_read_tool(&w, None).await;
    let (_, other) = w.other("member", "app_agent", "s-other").await;
    assert_eq!(sqlstate(read(&other, &t, json!({})).await), "42501");
    let write = w.deal_tool(json!({})).await;
    assert_eq!(sqlstate(read(&w.agent, &write, json!({})).await), "42704");
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&t])
        .await
        .unwrap();
    assert_eq!(sqlstate(read(&w.agent, &t, json!({})).await), "42704");
    let none = Conn::connect("app_agent", Identity::none()).await;
    assert_eq!(sqlstate(read(&none, &t, json!({})).await), "42501");
}

/// Sets the world principal's grant of `tool` to these terms.
async fn grant_with(
    w: &World,
    tool: &str,
    scope: Option<Value>,
    max_uses: Option<i32>,
) -> Result<u64, tokio_postgres::Error> {
    w.admin
        .execute(
            "SELECT keyturn.grant_tool($1, $2, $3, $4, NULL, $5)",
            &[&w.tenant, &w.principal, &tool, &scope, &max_uses],
        )
        .await
}

/// Enables a discovered upstream read tool and registers its projection
/// (named like the tool), as an admin does after reviewing it.
async fn enable_read(w: &World, tool: &str) {
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, true)", &[&tool])
        .await
        .unwrap();
    w.admin
        .execute(
            "SELECT keyturn.register_projection($1, $2)",
            &[&tool, &json!({"fields": {"text": {"max_length": 200}}})],
        )
        .await
        .unwrap();
}

// Red-team pass of 0.3.0: a grant's scope was accepted on a read tool and
// then ignored, so "only alice's deals" read everyone's the agent's role
// could see (and an upstream read, which has no row-level security, any
// channel keyturnd's credential could).
#[tokio::test]
async fn test_a_read_tool_grant_s_scope_bounds_what_the_agent_may_read() {
    let w = World::new("member").await;
    w.deals(&w.principal, 3).await;
    let t = deals_read_tool(&w, None).await;
    grant_with(
        &w,
        &t,
        Some(json!({"params": {"where.owner": {"eq": w.principal}}})),
        None,
    )
    .await
    .unwrap();
    let (_, reference) = read(&w.agent, &t, json!({"where": {"owner": w.principal}}))
        .await
        .unwrap();
    assert_eq!(rows(&reference).len(), 2, "inside the scope: {reference}");
    for outside in [
        json!({"where": {"owner": "someone-else"}}),
        json!({}),
        json!({"where": {"stage": "lead"}}),
    ] {
        let (state, msg) = failure(read(&w.agent, &t, outside.clone()).await);
        assert_eq!(state, "42501", "{outside}");
        assert!(msg.contains("where.owner"), "{outside}: {msg}");
    }
    // max_targets bounds the rows one read may answer with: more matching
    // rows is refused, not cut.
    grant_with(
        &w,
        &t,
        Some(json!({"params": {"where.owner": {"eq": w.principal}}, "max_targets": 1})),
        None,
    )
    .await
    .unwrap();
    let (state, msg) = failure(read(&w.agent, &t, json!({"where": {"owner": w.principal}})).await);
    assert_eq!(state, "42501");
    assert!(msg.contains("max_targets"), "{msg}");
    let (_, reference) = read(
        &w.agent,
        &t,
        json!({"where": {"owner": w.principal, "stage": "no-such-stage"}}),
    )
    .await
    .unwrap();
    assert!(rows(&reference).is_empty());
    // A read is not counted, so a grant cannot limit its uses.
    assert_eq!(sqlstate(grant_with(&w, &t, None, Some(3)).await), "22023");
}

#[tokio::test]
async fn test_an_upstream_read_grant_s_scope_bounds_its_arguments() {
    let w = World::new("member").await;
    let d = connect("app_dispatcher").await;
    let up = upstream_name("r");
    let def = json!({"name": "history", "description": "The last messages of a channel.",
                     "inputSchema": {"type": "object", "required": ["channel"],
                                     "properties": {"channel": {"type": "string"}}},
                     "annotations": {"readOnlyHint": true}});
    discover(&d, &up, &def, true).await.unwrap();
    let tool = format!("{up}.history");
    enable_read(&w, &tool).await;
    grant_with(
        &w,
        &tool,
        Some(json!({"params": {"channel": {"eq": "sales"}}})),
        None,
    )
    .await
    .unwrap();
    let call = "SELECT upstream_tool FROM keyturn.upstream_read($1, $2)";
    let r = w
        .agent
        .query_one(call, &[&tool, &json!({"channel": "sales"})])
        .await;
    assert_eq!(r.unwrap().get::<_, String>(0), "history");
    let (state, msg) = failure(
        w.agent
            .query_one(call, &[&tool, &json!({"channel": "another-tenants-board"})])
            .await,
    );
    assert_eq!(state, "42501");
    assert!(msg.contains("channel"), "{msg}");
    // No count of targets or of uses can be kept for an upstream read.
    assert_eq!(
        sqlstate(grant_with(&w, &tool, Some(json!({"max_targets": 1})), None).await),
        "22023"
    );
    assert_eq!(
        sqlstate(grant_with(&w, &tool, None, Some(5)).await),
        "22023"
    );

    // A grant made with max_uses while the tool was a write tool, which a
    // new definition then makes a read: the read fails closed.
    let flips = json!({"name": "flips", "inputSchema": {"type": "object", "properties": {"channel": {"type": "string"}}},
                       "annotations": {"readOnlyHint": false}});
    discover(&d, &up, &flips, true).await.unwrap();
    let flips_tool = format!("{up}.flips");
    grant_with(&w, &flips_tool, None, Some(5)).await.unwrap();
    let mut now_read = flips.clone();
    now_read["annotations"] = json!({"readOnlyHint": true});
    discover(&d, &up, &now_read, true).await.unwrap();
    enable_read(&w, &flips_tool).await;
    let (state, msg) = failure(
        w.agent
            .query_one(call, &[&flips_tool, &json!({"channel": "x"})])
            .await,
    );
    assert_eq!(state, "42501");
    assert!(msg.contains("max_uses"), "{msg}");
}

#[tokio::test]
async fn test_mcp_tools_lists_what_the_principal_may_call_with_exact_annotations() {
    let w = World::new("member").await;
    let sql_write = w.deal_tool(json!({})).await;
    let hook = w.webhook_tool(json!({"effect": "irreversible"})).await;
    let r = deals_read_tool(&w, None).await;
    // A read tool for the agent's own queries (no executor): listed, as
    // every enabled tool the principal holds a grant for is, and a call of
    // it reads nothing.
    let own = w.tool("own_reads", json!({"kind": "read"})).await;
    let disabled = w.webhook_tool(json!({})).await;
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, false)", &[&disabled])
        .await
        .unwrap();
    let rows = w
        .agent
        .query(
            "SELECT name, kind, input_schema, annotations FROM keyturn.mcp_tools()",
            &[],
        )
        .await
        .unwrap();
    let got: std::collections::BTreeMap<String, (String, Value, Value)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(
        got[&own],
        (
            "read".to_owned(),
            json!({"type": "object"}),
            json!({"readOnlyHint": true, "openWorldHint": false})
        )
    );
    let e = read(&w.agent, &own, json!({})).await;
    assert!(format!("{e:?}").contains("no executor"), "{e:?}");
    assert_eq!(sqlstate(e), "22023");
    assert_eq!(
        got[&sql_write].2,
        json!({"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false})
    );
    assert_eq!(
        got[&hook].2,
        json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": true})
    );
    assert_eq!(
        got[&r].2,
        json!({"readOnlyHint": true, "openWorldHint": false})
    );
    let form = &got[&sql_write].1;
    assert_eq!(form["required"], json!(["where", "set"]));
    assert_eq!(
        form["properties"]["set"]["properties"],
        json!({"stage": {"type": "string"}, "amount": {"type": "number"}})
    );
    assert_eq!(got[&hook].1["required"], json!(["channel", "text"]));
}

#[tokio::test]
async fn test_mcp_action_status_shows_only_the_callers_own_actions() {
    let w = World::new("approver").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "x"}))
        .await
        .unwrap();
    let (other_principal, other) = w.other("approver", "app_agent", "s-2").await;
    w.grant(&other_principal, &t).await;
    let q = propose_on(&other, &t, json!({"channel": "c", "text": "y"}), json!({}))
        .await
        .unwrap();
    let status = |id: uuid::Uuid| {
        let agent = &w.agent;
        async move {
            agent
                .query_opt(
                    "SELECT status, result FROM keyturn.mcp_action_status($1)",
                    &[&id],
                )
                .await
                .unwrap()
                .map(|r| (r.get::<_, String>(0), r.get::<_, Option<Value>>(1)))
        }
    };
    assert_eq!(status(p.id).await, Some(("pending".into(), None)));
    // An approver of the tenant sees the other's action in action_status;
    // its agent does not, here.
    assert_eq!(status(q.id).await, None);
    assert_eq!(status(uuid::Uuid::new_v4()).await, None);
    w.human
        .execute("SELECT keyturn.reject($1, $2)", &[&p.id, &p.token])
        .await
        .unwrap();
    let (s, result) = status(p.id).await.unwrap();
    assert_eq!(s, "rejected");
    assert!(result.is_some(), "a final status has its result");
}

#[tokio::test]
async fn test_mcp_resume_is_only_the_same_call_by_the_same_principal() {
    let w = World::new("approver").await;
    for retain in ["full", "digest"] {
        let t = w.webhook_tool(json!({"retain": retain})).await;
        let params = json!({"channel": "c", "text": "resume me"});
        let p = w.propose(&t, params.clone()).await.unwrap();
        let resume = |id: uuid::Uuid, tool: String, params: Value| {
            let agent = &w.agent;
            async move {
                agent
                    .query_opt(
                        "SELECT status, result, summary FROM keyturn.mcp_resume($1, $2, $3)",
                        &[&id, &tool, &params],
                    )
                    .await
                    .unwrap()
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            r.get::<_, Option<Value>>(1),
                            r.get::<_, Option<String>>(2),
                        )
                    })
            }
        };
        // The same call: the proposal, with its summary (a digest action
        // keeps none: its tool is named).
        let summary = if retain == "full" {
            "Notify c: \"resume me\"".to_owned()
        } else {
            t.clone()
        };
        assert_eq!(
            resume(p.id, t.clone(), params.clone()).await,
            Some(("pending".into(), None, Some(summary.clone()))),
            "{retain}"
        );
        // Other params: no row. Except for a digest action, which is never
        // matched by params: an answer that depended on them would confirm
        // guesses of what only its MAC keeps (twelfth red-team pass).
        let other = json!({"channel": "c", "text": "something else"});
        let answer = resume(p.id, t.clone(), other).await;
        if retain == "full" {
            assert_eq!(answer, None);
        } else {
            assert_eq!(answer, Some(("pending".into(), None, Some(summary))));
            // In another session of the same principal, not even the
            // right guess gets an answer.
            let elsewhere = Conn::connect(
                "app_agent",
                Identity::gucs(&w.tenant, &w.principal, "guessing-session"),
            )
            .await;
            for guess in [
                params.clone(),
                json!({"channel": "c", "text": "resume you"}),
            ] {
                let row = elsewhere
                    .query_opt(
                        "SELECT status FROM keyturn.mcp_resume($1, $2, $3)",
                        &[&p.id, &t, &guess],
                    )
                    .await
                    .unwrap();
                assert!(
                    row.is_none(),
                    "{guess}: a digest action answered another session"
                );
            }
        }
        assert_eq!(
            resume(p.id, "mcp_other".into(), params.clone()).await,
            None,
            "{retain}"
        );
        assert_eq!(
            resume(uuid::Uuid::new_v4(), t.clone(), params.clone()).await,
            None
        );
        // Another principal of the tenant, with the same call: no row.
        let (other_principal, other) = w.other("approver", "app_agent", "s-2").await;
        w.grant(&other_principal, &t).await;
        let theirs = other
            .query_opt(
                "SELECT status FROM keyturn.mcp_resume($1, $2, $3)",
                &[&p.id, &t, &params],
            )
            .await
            .unwrap();
        assert!(theirs.is_none(), "{retain}: another principal resumed it");
        // Its task: the agent's own, with a summary even for a digest
        // action (there only the tool is named); nobody else's.
        let task_sql = "SELECT status, summary, same_session FROM keyturn.mcp_task($1)";
        let mine = w.agent.query_one(task_sql, &[&p.id]).await.unwrap();
        let summary: String = mine.get(1);
        assert_eq!(mine.get::<_, String>(0), "pending");
        assert!(mine.get::<_, bool>(2), "{retain}: the proposing session");
        // The same principal in another session (as the database reads the
        // session, whatever claim path carries it): its task, but not the
        // session a card link may be shown to.
        let elsewhere = Conn::connect(
            "app_agent",
            Identity::gucs(&w.tenant, &w.principal, "another-session"),
        )
        .await;
        let there = elsewhere.query_one(task_sql, &[&p.id]).await.unwrap();
        assert!(!there.get::<_, bool>(2), "{retain}: another session");
        let expected = if retain == "full" {
            "Notify c: \"resume me\""
        } else {
            t.as_str()
        };
        assert_eq!(summary, expected, "{retain}");
        let theirs = other.query_opt(task_sql, &[&p.id]).await.unwrap();
        assert!(
            theirs.is_none(),
            "{retain}: another principal read its task"
        );
    }
}

async fn discover(
    d: &tokio_postgres::Client,
    upstream: &str,
    def: &Value,
    trust: bool,
) -> Result<i32, tokio_postgres::Error> {
    d.query_one(
        "SELECT keyturn.register_discovered_tool($1, $2, $3)",
        &[&upstream, def, &trust],
    )
    .await
    .map(|r| r.get(0))
}

async fn tool_row(w: &World, name: &str) -> (bool, i32, String, Option<String>, Option<String>) {
    let r = w
        .superuser
        .query_one(
            "SELECT t.enabled, t.version, v.kind::text, v.upstream_schema_sha256, v.projection \
               FROM keyturn.tool t JOIN keyturn.tool_version v ON v.tool = t.name AND v.version = t.version \
              WHERE t.name = $1",
            &[&name],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

/// A fresh upstream name: lowercase letters and digits only.
fn upstream_name(prefix: &str) -> String {
    let id: String = unique("x")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    format!("{prefix}{}", id.to_lowercase())
}

fn definition(name: &str, annotations: Value) -> Value {
    json!({"name": name, "description": "Post a message",
           "inputSchema": {"type": "object", "title": "x",
                           "properties": {"channel": {"type": "string", "default": "general"}},
                           "required": ["channel"]},
           "annotations": annotations})
}

/// An upstream that lists new names, or new definitions, at every discovery
/// cannot grow the catalog every tenant reads without bound: 1,000 tools an
/// upstream, the rest refused (54000) while a known one still changes, and
/// 2,000 versions an hour (thirtieth and thirty-first red-team passes,
/// docs/security.md row 142).
#[tokio::test]
async fn test_an_upstream_registers_at_most_a_thousand_tools() {
    let d = connect("app_dispatcher").await;
    let up = upstream_name("f");
    let n: i64 = d
        .query_one(
            "SELECT count(keyturn.register_discovered_tool($1, \
                    jsonb_build_object('name', 't' || g, 'inputSchema', '{\"type\": \"object\"}'::jsonb), false)) \
               FROM generate_series(1, 1000) g",
            &[&up],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1000);
    let one_more = discover(&d, &up, &definition("t1001", json!({})), false).await;
    assert_eq!(sqlstate(one_more), "54000");
    let changed =
        json!({"name": "t1", "description": "changed", "inputSchema": {"type": "object"}});
    assert_eq!(discover(&d, &up, &changed, false).await.unwrap(), 2);
    // Definitions changed at every discovery: 2,000 versions an hour, then
    // a known tool stays at its version (thirty-first pass).
    let n: i64 = d
        .query_one(
            "SELECT count(keyturn.register_discovered_tool($1, \
                    jsonb_build_object('name', 't' || g, 'description', 'churn', \
                                       'inputSchema', '{\"type\": \"object\"}'::jsonb), false)) \
               FROM generate_series(2, 1000) g",
            &[&up],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 999);
    let again = json!({"name": "t1", "description": "churned", "inputSchema": {"type": "object"}});
    assert_eq!(sqlstate(discover(&d, &up, &again, false).await), "54000");
    // And as many bytes: a definition of more than 64 KiB is not registered
    // (thirty-second pass).
    let big = json!({"name": "big", "description": "x".repeat(70_000), "inputSchema": {"type": "object"}});
    assert_eq!(
        sqlstate(discover(&d, &upstream_name("h"), &big, false).await),
        "54000"
    );
    // 16 MiB of versions an hour, as stored: each version keeps its spec
    // besides its params schema and description (thirty-third pass: the
    // bound counted half of what was stored).
    let bulky = upstream_name("j");
    let mut registered = 0;
    let refused = loop {
        let r = d
            .query_one(
                "SELECT keyturn.register_discovered_tool($1, jsonb_build_object('name', 't' || $2::int, \
                        'inputSchema', jsonb_build_object('type', 'object', 'properties', \
                            (SELECT jsonb_object_agg(encode(sha256((random()::text || i)::bytea), 'hex'), \
                                                     '{\"type\": \"string\"}'::jsonb) \
                               FROM generate_series(1, 600) i))), false)",
                &[&bulky, &registered],
            )
            .await;
        match r {
            Ok(_) if registered < 900 => registered += 1,
            other => break other,
        }
    };
    assert_eq!(sqlstate(refused), "54000", "after {registered} versions");
    let stored: i64 = connect("postgres")
        .await
        .query_one(
            "SELECT sum(pg_column_size(spec) + pg_column_size(params_schema) \
                        + coalesce(pg_column_size(description), 0))::bigint \
               FROM keyturn.tool_version WHERE upstream = $1",
            &[&bulky],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        stored <= 16 * 1024 * 1024 + 256 * 1024,
        "{stored} bytes stored in {registered} versions"
    );
    // Another upstream has its own thousand.
    let other = upstream_name("g");
    assert_eq!(
        discover(&d, &other, &definition("t1", json!({})), false)
            .await
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn test_discovered_tools_are_disabled_and_read_only_on_an_explicit_trusted_true() {
    let w = World::new("member").await;
    let d = connect("app_dispatcher").await;
    let up = upstream_name("u");
    for (tool, annotations, trust, kind) in [
        ("reads", json!({"readOnlyHint": true}), true, "read"),
        ("untrusted", json!({"readOnlyHint": true}), false, "write"),
        ("stringy", json!({"readOnlyHint": "true"}), true, "write"),
        ("missing", json!({}), true, "write"),
        ("nullish", Value::Null, true, "write"),
    ] {
        let v = discover(&d, &up, &definition(tool, annotations), trust)
            .await
            .unwrap();
        assert_eq!(v, 1);
        let (enabled, _, got, sha, projection) = tool_row(&w, &format!("{up}.{tool}")).await;
        assert!(!enabled, "{tool}: registered disabled");
        assert_eq!(got, kind, "{tool}");
        assert_eq!(sha.map(|s| s.len()), Some(64));
        assert_eq!(projection.is_some(), kind == "read", "{tool}");
    }
    // The hash is of the RFC 8785 form of the whole definition.
    let def = definition("reads", json!({"readOnlyHint": true}));
    let expected: String = w
        .superuser
        .query_one(
            "SELECT encode(sha256(convert_to(keyturn.canonical_json($1), 'UTF8')), 'hex')",
            &[&def],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tool_row(&w, &format!("{up}.reads")).await.3.unwrap(),
        expected
    );
    // Unchanged: nothing changes, enabled stays enabled.
    w.admin
        .execute(
            "SELECT keyturn.set_tool_enabled($1, true)",
            &[&format!("{up}.reads")],
        )
        .await
        .unwrap();
    assert_eq!(discover(&d, &up, &def, true).await.unwrap(), 1);
    assert!(tool_row(&w, &format!("{up}.reads")).await.0);
    // A read changed (a description): a new version, disabled again (it
    // runs without anyone's approval).
    let mut changed = def.clone();
    changed["description"] = json!("Post a message, and more");
    assert_eq!(discover(&d, &up, &changed, true).await.unwrap(), 2);
    let (enabled, version, ..) = tool_row(&w, &format!("{up}.reads")).await;
    assert!(!enabled && version == 2);
    // A write changed: a new version that keeps its enabled flag, as
    // register_tool keeps it (each call still waits for a person)...
    let write = definition("writes", json!({"readOnlyHint": false}));
    assert_eq!(discover(&d, &up, &write, true).await.unwrap(), 1);
    let writes = format!("{up}.writes");
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, true)", &[&writes])
        .await
        .unwrap();
    let mut changed = write.clone();
    changed["description"] = json!("Post a message, now to two channels");
    assert_eq!(discover(&d, &up, &changed, true).await.unwrap(), 2);
    let (enabled, version, kind, ..) = tool_row(&w, &writes).await;
    assert!(enabled && version == 2 && kind == "write");
    // ...and one that flips to read-only is disabled until reviewed.
    let flipped = definition("writes", json!({"readOnlyHint": true}));
    assert_eq!(discover(&d, &up, &flipped, true).await.unwrap(), 3);
    let (enabled, version, kind, ..) = tool_row(&w, &writes).await;
    assert!(!enabled && version == 3 && kind == "read");
    // A schema keyturn cannot check, a name that makes no tool name, an
    // agent, a tool that was never discovered there.
    let anyof = json!({"name": "anyof", "inputSchema": {"type": "object", "properties":
        {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}});
    assert_eq!(sqlstate(discover(&d, &up, &anyof, true).await), "22023");
    for bad in ["bad name", "2fa", "-x", "x/y", "caf\u{e9}"] {
        assert_eq!(
            sqlstate(discover(&d, &up, &json!({"name": bad}), true).await),
            "22023",
            "{bad}"
        );
    }
    for bad_up in ["Bad Up", "a.b", "-up", ""] {
        assert_eq!(
            sqlstate(discover(&d, bad_up, &json!({"name": "x"}), true).await),
            "22023",
            "{bad_up}"
        );
    }
    // Names as MCP servers spell them: either case, hyphens, on an upstream
    // whose name has a hyphen too.
    let hyphened = format!("{up}-b");
    for name in ["getTinyImage", "get-weather", "files.read"] {
        assert_eq!(
            discover(&d, &hyphened, &json!({"name": name}), true)
                .await
                .unwrap(),
            1,
            "{name}"
        );
        let (enabled, version, kind, ..) = tool_row(&w, &format!("{hyphened}.{name}")).await;
        assert!(!enabled && version == 1 && kind == "write", "{name}");
    }
    // ...but never one a case apart from a tool it already has.
    assert_eq!(
        sqlstate(discover(&d, &hyphened, &json!({"name": "GetTinyImage"}), true).await),
        "22023"
    );
    let r = w
        .agent
        .query_one(
            "SELECT keyturn.register_discovered_tool($1, $2, true)",
            &[&up, &def],
        )
        .await;
    assert_eq!(sqlstate(r), "42501");
    let hand = format!("{up}.by_hand");
    w.admin
        .execute(
            "SELECT keyturn.register_tool($1, '{\"executor\": \"external\", \"provider\": \"webhook\"}')",
            &[&hand],
        )
        .await
        .unwrap();
    assert_eq!(
        sqlstate(discover(&d, &up, &json!({"name": "by_hand"}), true).await),
        "42501"
    );
}

#[tokio::test]
async fn test_a_changed_upstream_definition_invalidates_the_call_before_anything_is_sent() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let d = connect("app_dispatcher").await;
    let up = upstream_name("v");
    let def = definition("post", json!({}));
    discover(&d, &up, &def, false).await.unwrap();
    let tool = format!("{up}.post");
    w.admin
        .execute("SELECT keyturn.set_tool_enabled($1, true)", &[&tool])
        .await
        .unwrap();
    w.grant(&w.principal, &tool).await;
    let mut ids = Vec::new();
    for text in ["same", "drifted"] {
        let p = w.propose(&tool, json!({"channel": text})).await.unwrap();
        assert_eq!(w.approve(&p).await.unwrap().0, "queued");
        ids.push(p.id);
    }
    let leases = lease_mine(&d, &ids, "30 seconds").await;
    assert_eq!(leases.len(), 2);
    let check = |l: &Lease, def: Value| {
        let d = &d;
        let (id, lease) = (l.action_id, l.lease_id);
        async move {
            d.query_one(
                "SELECT keyturn.check_upstream_tool($1, $2, $3)",
                &[&id, &lease, &def],
            )
            .await
            .map(|r| r.get::<_, bool>(0))
        }
    };
    // Only while executing under the lease.
    assert_eq!(sqlstate(check(&leases[0], def.clone()).await), "55000");
    for l in &leases {
        assert!(begin(&d, l).await.unwrap());
    }
    assert!(
        check(&leases[0], def.clone()).await.unwrap(),
        "the same definition"
    );
    assert_eq!(w.status(leases[0].action_id).await, "executing");
    complete(&d, &leases[0], "succeeded", json!({}), None)
        .await
        .unwrap();
    let mut drifted = def.clone();
    drifted["inputSchema"]["properties"]["channel"]["default"] = json!("random");
    assert!(
        !check(&leases[1], drifted).await.unwrap(),
        "a changed definition"
    );
    assert_eq!(w.status(leases[1].action_id).await, "invalidated");
    let receipt: Value = w
        .superuser
        .query_one(
            "SELECT receipt FROM keyturn.action WHERE id = $1",
            &[&leases[1].action_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(receipt["sent"], json!(false));
    // Decided: nothing more may be recorded for it.
    assert_eq!(
        sqlstate(complete(&d, &leases[1], "succeeded", json!({}), None).await),
        "55000"
    );
    // Agents and people cannot report drift.
    let r = w
        .agent
        .query_one(
            "SELECT keyturn.check_upstream_tool($1, $2, $3)",
            &[&leases[1].action_id, &leases[1].lease_id, &def],
        )
        .await;
    assert_eq!(sqlstate(r), "42501");
}
