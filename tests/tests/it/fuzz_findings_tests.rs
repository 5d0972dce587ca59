//! What the SQL fuzzer (tests/src/bin/keyturn-fuzz, the fuzz layer) found,
//! each as a test of its own that reproduces it without the fuzzer. A bug
//! not fixed yet is `#[ignore = "bug: …"]` here, and the fuzzer counts the
//! same failure as a known bug (its judge.rs, KNOWN) instead of a finding.

use keyturn_tests::*;
use serde_json::{json, Value};

/// `levels` arrays around 1.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |v, _| json!([v]))
}

/// The approval card reads the current values of the columns a form sets.
/// An application's jsonb column may hold a document nested deeper than
/// serde_json's default limit of 128 levels; the card must then show it,
/// or refuse with a deliberate SQLSTATE that says why, never fail with an
/// internal error.
///
/// Fails on the code it was written against: preview ends in XX000 "a text
/// version of jsonb must be a valid json: Error("recursion limit
/// exceeded"…)", because keyturn._exec_as and keyturn.preview read jsonb
/// through pgrx's JsonB, which parses with serde_json's limit and panics.
#[tokio::test]
#[ignore = "bug: preview of a row whose jsonb column is nested deeper than 128 levels fails with XX000 (pgrx JsonB in _exec_as and preview)"]
async fn test_preview_of_a_deeply_nested_business_value() {
    let w = World::new("member").await;
    let schema = unique("deepjson");
    let table = format!("{schema}.doc");
    w.superuser
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             GRANT USAGE ON SCHEMA {schema} TO keyturn_agent, keyturn_approver;
             CREATE TABLE {table} (id bigint PRIMARY KEY, tenant text NOT NULL, meta jsonb NOT NULL);
             ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
             ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
             CREATE POLICY doc_tenant ON {table}
                 USING (tenant = current_setting('keyturn.tenant', true))
                 WITH CHECK (tenant = current_setting('keyturn.tenant', true));
             GRANT SELECT ON {table} TO keyturn_agent;
             GRANT SELECT, UPDATE ON {table} TO app_human;"
        ))
        .await
        .expect("create the table");
    let deep = nested(130);
    w.superuser
        .execute(
            &format!("INSERT INTO {table} (id, tenant, meta) VALUES (1, $1, $2::text::jsonb)"),
            &[&w.tenant, &deep.to_string()],
        )
        .await
        .expect("a row an application wrote");
    let t = w
        .tool(
            "doc_meta",
            json!({"executor": "sql", "effect": "reversible",
                   "sql": {"table": table, "key": "id", "set": ["meta"], "where": ["id"]}}),
        )
        .await;
    let p = w
        .propose(
            &t,
            json!({"where": {"id": 1}, "set": {"meta": {"flat": true}}}),
        )
        .await
        .expect("propose");

    let card = w
        .human
        .query_one("SELECT keyturn.preview($1, $2)", &[&p.id, &p.token])
        .await;
    match card {
        Ok(row) => {
            let card: Value = row.get(0);
            assert_eq!(card["targets"][0]["key"], json!("1"), "{card}");
            assert_eq!(
                card["targets"][0]["after"],
                json!({"meta": {"flat": true}}),
                "{card}"
            );
        }
        Err(e) => {
            let code = e.code().map(|c| c.code().to_owned());
            let msg = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned());
            assert_ne!(
                code.as_deref(),
                Some("XX000"),
                "preview failed with an internal error: {msg}"
            );
            assert_eq!(
                code.as_deref(),
                Some("22023"),
                "preview refused with an undocumented SQLSTATE: {msg}"
            );
        }
    }
    // Whatever the card does, approving writes the form and nothing else.
    assert_eq!(w.approve(&p).await.expect("approve").0, "succeeded");
    let meta: Value = w
        .superuser
        .query_one(&format!("SELECT meta FROM {table} WHERE id = 1"), &[])
        .await
        .expect("the row")
        .get(0);
    assert_eq!(meta, json!({"flat": true}));
}

/// spec.sql.table is the admin's text: one that does not even parse as a
/// table name is invalid input like any other, 22023 with the key named, not
/// whatever the name parser raises.
///
/// Fails on the code it was written against: `..`, `""` and the like end in
/// 42602 (invalid name syntax), `a.b.c.d` in 42601 and `db.s.t` in 0A000,
/// raised by to_regclass in keyturn._spec_sql.
#[tokio::test]
async fn test_register_tool_refuses_a_table_name_that_does_not_parse_with_22023() {
    let admin = connect("app_admin").await;
    for table in [
        "..",
        "",
        "\"",
        "crm.\"deal",
        "a.b.c.d",
        "nodb.public.t",
        "crm.deal; DROP TABLE crm.deal",
    ] {
        let name = unique("unparsable");
        let spec = json!({"executor": "sql",
                          "sql": {"table": table, "key": "id", "set": ["stage"], "where": ["id"]}});
        let e = admin
            .execute("SELECT keyturn.register_tool($1, $2)", &[&name, &spec])
            .await
            .expect_err("a table name that does not parse is refused");
        let code = e.code().map(|c| c.code().to_owned());
        let msg = message::<()>(Err(e));
        assert_eq!(code.as_deref(), Some("22023"), "table {table:?}: {msg}");
        assert!(msg.contains("spec.sql.table"), "table {table:?}: {msg}");
    }
}
