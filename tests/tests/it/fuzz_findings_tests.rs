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
