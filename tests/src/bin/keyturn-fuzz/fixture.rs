//! What the fuzzer works on, made once per run: a schema of its own with the
//! business table of generators::forms (its DDL written from
//! forms::COLUMNS), a write log filled by trigger, two tenants whose rows
//! share ids' neighbourhoods and owners (the fuzzer acts in `a`; `b`'s rows
//! must never change), some rows holding hostile data of their own (deeply
//! nested JSON, serde_json's reserved number key, odd text), and two tools granted to alice in `a`: `wide`, an
//! sql tool over every listed column, and `open`, an external tool whose
//! schema takes any object. Its policy reads the tenant setting the fuzzer
//! asserts rather than keyturn's functions, so that what it leaves behind
//! never stops a DROP EXTENSION (tests/dev-reinstall).

use serde_json::json;
use tokio_postgres::Client;

use crate::generators::forms::{COLUMNS, IDS, OWNERS, SET, STAGES, WHERE};

pub struct Fixture {
    /// The run's name: schema, tenant prefix, provider, tool prefix.
    pub run: String,
    /// The run's name again, for the spec generators, which keep it.
    pub provider: &'static str,
    pub table: String,
    pub writes: String,
    pub tenant: String,
    pub wide: String,
    pub open: String,
    pub max_targets: usize,
}

/// `name` quoted as an SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// How deep the deepest stored value of the `meta` column is: deeper than
/// serde_json reads by default, as an application may well store.
pub const DEEP_META: usize = 130;

impl Fixture {
    pub async fn create(su: &Client, admin: &Client, run: &str) -> Fixture {
        let schema = run.to_owned();
        let table = format!("{schema}.item");
        let writes = format!("{schema}.item_writes");
        let columns: Vec<String> = COLUMNS
            .iter()
            .map(|c| {
                let key = if c.name == "id" { " PRIMARY KEY" } else { "" };
                format!("{} {}{key}", ident(c.name), c.sql_type)
            })
            .collect();
        let ddl = format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {table} ({columns}, tenant text NOT NULL, revision int NOT NULL DEFAULT 1,
                 CONSTRAINT item_stage CHECK (stage IN ({stages})));
             ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
             ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
             CREATE POLICY item_tenant ON {table} USING (tenant = current_setting('keyturn.tenant', true))
                 WITH CHECK (tenant = current_setting('keyturn.tenant', true));
             CREATE FUNCTION {schema}.bump() RETURNS trigger LANGUAGE plpgsql
                 SET search_path = pg_catalog, pg_temp AS $$
                 BEGIN NEW.revision := OLD.revision + 1; RETURN NEW; END $$;
             CREATE TRIGGER item_revision BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {schema}.bump();
             CREATE TABLE {writes} (id bigint NOT NULL, by_role text NOT NULL);
             CREATE FUNCTION {schema}.log_write() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
                 SET search_path = pg_catalog, pg_temp AS $$
                 BEGIN INSERT INTO {writes} (id, by_role) VALUES (NEW.id, session_user); RETURN NULL; END $$;
             CREATE TRIGGER item_written AFTER UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {schema}.log_write();
             GRANT USAGE ON SCHEMA {schema} TO keyturn_agent, keyturn_approver;
             GRANT SELECT ON {table} TO keyturn_agent;
             GRANT SELECT, UPDATE ON {table} TO app_human;",
            columns = columns.join(", "),
            stages = STAGES.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ")
        );
        su.batch_execute(&ddl).await.expect("create the fuzz table");

        let tenant = format!("{run}_a");
        let other_tenant = format!("{run}_b");
        let deep = (0..DEEP_META).fold(json!(1), |v, _| json!([v]));
        for id in IDS {
            let t = if id <= 16 { &tenant } else { &other_tenant };
            let meta = match id % 8 {
                0 => deep.clone(),
                // serde_json's reserved key: an object it reads as a number.
                1 => json!({"$serde_json::private::Number": "x"}),
                2 => json!({"note": "\u{202E}evil\u{200B}", "n": 1e300}),
                _ => json!({}),
            };
            su.execute(
                &format!(
                    "INSERT INTO {table} (id, tenant, owner, stage, amount, qty, flag, due, meta, {odd})
                     VALUES ($1, $2, $3, 'lead', 0, $4, $5, '2024-01-01', $6::text::jsonb, $7)",
                    odd = ident("odd \"col\"")
                ),
                &[
                    &id,
                    t,
                    &OWNERS[(id as usize) % OWNERS.len()],
                    &((id % 5) as i32),
                    &(id % 2 == 0),
                    &meta.to_string(),
                    &(if id % 3 == 0 { "x'; --" } else { "x" }),
                ],
            )
            .await
            .expect("insert a fuzz row");
        }

        for t in [&tenant, &other_tenant] {
            for p in ["alice", "bob", "carol"] {
                admin
                    .execute("SELECT keyturn.add_member($1, $2, 'member')", &[t, &p])
                    .await
                    .expect("add_member");
            }
        }
        let max_targets = 10;
        let wide = format!("{run}.wide");
        let open = format!("{run}.open");
        let specs = [
            (
                &wide,
                json!({"executor": "sql", "effect": "reversible", "max_targets": max_targets,
                       "summary": "Set {set.stage} {set.meta} on {count} item(s) where {where.id}",
                       "sql": {"table": table, "key": "id", "version": "revision", "set": SET, "where": WHERE}}),
            ),
            (
                &open,
                json!({"executor": "external", "provider": run, "effect": "reversible",
                       "summary": "Send {text} to {to}",
                       "params_schema": {"type": "object", "additionalProperties": true}}),
            ),
        ];
        for (name, spec) in &specs {
            admin
                .execute("SELECT keyturn.register_tool($1, $2)", &[name, spec])
                .await
                .unwrap_or_else(|e| panic!("register_tool {name}: {e}"));
            admin
                .execute(
                    "SELECT keyturn.grant_tool($1, 'alice', $2)",
                    &[&tenant, name],
                )
                .await
                .expect("grant_tool");
        }
        let provider: &'static str = Box::leak(run.to_owned().into_boxed_str());
        Fixture {
            run: run.to_owned(),
            provider,
            table,
            writes,
            tenant,
            wide,
            open,
            max_targets,
        }
    }
}
