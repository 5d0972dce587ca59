//! docs/security.md, "Attack record": each hole an adversary or a real
//! deployment found, reproduced. Each test here failed against 0.1.0 (see the
//! attack record for how that was checked) and holds now.

use std::time::Duration;

use keyturn_tests::*;
use serde_json::{json, Value};

/// A role of this test run, created by the superuser.
async fn role(su: &tokio_postgres::Client, prefix: &str, options: &str) -> String {
    let name = unique(prefix);
    su.batch_execute(&format!("CREATE ROLE {name} {options}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE ROLE {name} {options}: {e}"));
    name
}

/// A business table of this test run, under RLS by tenant, readable by the
/// agent and writable by the human, owned by the superuser.
async fn table(su: &tokio_postgres::Client, columns: &str) -> String {
    let name = format!("crm.{}", unique("t"));
    su.batch_execute(&format!(
        "CREATE TABLE {name} (tenant text NOT NULL, {columns});
         ALTER TABLE {name} ENABLE ROW LEVEL SECURITY;
         ALTER TABLE {name} FORCE ROW LEVEL SECURITY;
         CREATE POLICY by_tenant ON {name} USING (tenant = keyturn.current_tenant())
             WITH CHECK (tenant = keyturn.current_tenant());
         GRANT SELECT ON {name} TO app_agent;
         GRANT SELECT, UPDATE ON {name} TO app_human;"
    ))
    .await
    .unwrap_or_else(|e| panic!("CREATE TABLE {name}: {e}"));
    name
}

/// What check_deployment reports, as (severity, object, problem).
async fn deployment_problems(admin: &tokio_postgres::Client) -> Vec<(String, String, String)> {
    admin
        .query(
            "SELECT severity, object, problem FROM keyturn.check_deployment()",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Whether `problems` hold one of `severity` about `object` that says `needle`.
fn reported(
    problems: &[(String, String, String)],
    severity: &str,
    object: &str,
    needle: &str,
) -> bool {
    problems
        .iter()
        .any(|(s, o, p)| s == severity && o.contains(object) && p.contains(needle))
}

/// The message of register_tool's refusal (22023) of `spec`.
async fn refused_registration(w: &World, spec: &Value) -> String {
    let name = unique("refused");
    let (state, message) = failure(
        w.admin
            .execute("SELECT keyturn.register_tool($1, $2)", &[&name, spec])
            .await,
    );
    assert_eq!(state, "22023", "{spec}: {message}");
    message
}

/// A BEFORE UPDATE trigger that moves `t`'s `revision` on every write: a
/// version column a tool may name.
async fn bump_revision(su: &tokio_postgres::Client, t: &str) {
    let bump = unique("bump");
    su.batch_execute(&format!(
        "CREATE FUNCTION crm.{bump}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN NEW.revision := OLD.revision + 1; RETURN NEW; END $$;
         CREATE TRIGGER {bump} BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION crm.{bump}();"
    ))
    .await
    .unwrap_or_else(|e| panic!("the revision trigger on {t}: {e}"));
}

fn recipients_tool(extra: Value) -> Value {
    let mut spec = json!({
        "executor": "external", "provider": "webhook",
        "summary": "Send email to {to} about \"{subject}\"",
        "targets_param": "to", "max_targets": 100,
        "params_schema": {"type": "object", "required": ["to", "subject"], "properties": {
            "to": {"type": "array", "items": {"type": "string", "format": "email"}},
            "subject": {"type": "string"}}}
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    spec
}

// --- Approve exactly what you see -------------------------------------------

#[tokio::test]
async fn test_a_display_name_never_passes_for_an_address() {
    let w = World::new("member").await;
    let t = w.tool("mail", recipients_tool(json!({}))).await;
    let padded = format!(
        "\"ann@acme.com{}\" <attacker@evil.example>",
        " ".repeat(200)
    );
    for to in [
        padded.as_str(),
        "Ann <ann@acme.com>",
        "\"ann\"@acme.com",
        "ann@[192.168.0.1]",
        "ann@acme.com ",
    ] {
        assert_eq!(
            sqlstate(w.propose(&t, json!({"to": [to], "subject": "hi"})).await),
            "22023",
            "{to:?} is not a bare address"
        );
    }
    w.propose(&t, json!({"to": ["ann@acme.com"], "subject": "hi"}))
        .await
        .expect("a bare address is fine");
}

#[tokio::test]
async fn test_an_smtp_tool_must_check_its_recipients_as_addresses() {
    let w = World::new("member").await;
    let spec = json!({"executor": "external", "provider": "smtp",
        "params_schema": {"type": "object", "properties": {
            "to": {"type": "string"}, "subject": {"type": "string"}}}});
    let r = w
        .admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[&unique("smtp_loose"), &spec],
        )
        .await;
    assert_eq!(sqlstate(r), "22023", "to without format: email is refused");
}

/// Red-team pass of 0.3.0: an smtp tool whose schema admits undeclared
/// keys took `cc` and `bcc` from the agent, unchecked as addresses, absent
/// from the summary and uncounted by max_targets, and the adapter mailed
/// them. Every recipient key the adapter reads must be one the schema
/// declares (and so checks as an address).
#[tokio::test]
async fn test_an_smtp_tool_sends_to_no_recipient_its_schema_does_not_declare() {
    let w = World::new("member").await;
    let t = w
        .tool(
            "mail_open",
            json!({"executor": "external", "provider": "smtp",
                "summary": "Mail {to}: {subject}", "targets_param": "to", "max_targets": 1,
                "params_schema": {"type": "object", "additionalProperties": true,
                    "required": ["to", "subject", "body"], "properties": {
                    "to": {"type": "string", "format": "email"},
                    "cc": {"type": "array", "items": {"type": "string", "format": "email"}},
                    "subject": {"type": "string"}, "body": {"type": "string"}}}}),
        )
        .await;
    for key in ["bcc", "reply_to"] {
        let mut params = json!({"to": "bob@acme.example", "subject": "hi", "body": "b"});
        params[key] = json!(if key == "bcc" {
            json!(["eve@evil.example"])
        } else {
            json!("eve@evil.example")
        });
        let refused = w.propose(&t, params.clone()).await;
        let message = message(refused);
        assert_eq!(
            sqlstate(w.propose(&t, params).await),
            "22023",
            "{key}: {message}"
        );
        assert!(
            message.contains(key) && message.contains("does not declare"),
            "the refusal names the undeclared recipient key {key}: {message}"
        );
    }
    // A declared recipient key, checked as an address, is fine.
    let p = w
        .propose(
            &t,
            json!({"to": "bob@acme.example", "cc": ["carol@acme.example"], "subject": "hi", "body": "b"}),
        )
        .await
        .expect("cc is declared as addresses");
    // Approve asks again: a proposal the rule did not see (made before it,
    // or under a schema changed since) is invalidated, never mailed.
    w.superuser
        .execute(
            "UPDATE keyturn.tool_version SET params_schema = params_schema #- '{properties,cc}' WHERE tool = $1",
            &[&t],
        )
        .await
        .unwrap();
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "invalidated");
    let reason = result.unwrap()["reason"].to_string();
    assert!(reason.contains("params.cc is a recipient"), "{reason}");
    // A webhook tool's keys are its own: the rule is the smtp adapter's.
    let hook = w
        .tool(
            "hook_open",
            json!({"executor": "external", "provider": "webhook",
                "params_schema": {"type": "object", "additionalProperties": true,
                    "properties": {"to": {"type": "string"}}}}),
        )
        .await;
    w.propose(&hook, json!({"to": "x", "bcc": "y"}))
        .await
        .expect("a webhook tool may carry any key its schema admits");
}

#[tokio::test]
async fn test_the_card_never_hides_a_recipient() {
    let w = World::new("member").await;
    let t = w.tool("mail", recipients_tool(json!({}))).await;
    let to: Vec<String> = (0..40).map(|i| format!("person{i:02}@acme.com")).collect();
    let p = w
        .propose(&t, json!({"to": to, "subject": "q3"}))
        .await
        .unwrap();
    // Every element shown is whole, and the rest are counted, never cut off.
    let shown: Vec<&String> = to
        .iter()
        .filter(|a| p.summary.contains(a.as_str()))
        .collect();
    let rest = to.len() - shown.len();
    assert!(rest > 0, "forty addresses do not all fit: {}", p.summary);
    assert!(
        p.summary.contains(&format!("and {rest} more")),
        "the hidden ones are counted: {}",
        p.summary
    );
    assert!(!p.summary.contains('…'), "no element is cut: {}", p.summary);
}

#[tokio::test]
async fn test_invisible_characters_never_reach_the_summary() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let sneaky = "pay\u{200B}roll\u{00AD} \u{2060}\u{FEFF}run\u{3164}\u{E0041}\u{E0042} now";
    let p = w
        .propose(&t, json!({"channel": "ops", "text": sneaky}))
        .await
        .unwrap();
    for c in [
        '\u{200B}',
        '\u{00AD}',
        '\u{2060}',
        '\u{FEFF}',
        '\u{3164}',
        '\u{E0041}',
    ] {
        assert!(
            !p.summary.contains(c),
            "{c:?} reached the card: {:?}",
            p.summary
        );
    }
    assert!(p.summary.contains("payroll run now"), "{:?}", p.summary);
}

#[tokio::test]
async fn test_what_is_written_follows_from_what_was_hashed() {
    let w = World::new("member").await;
    let t = w
        .tool(
            "rename",
            json!({"executor": "sql", "summary": "Rename {count} deal(s)",
                   "sql": {"table": "crm.deal", "key": "id", "set": ["name"], "where": ["id"]}}),
        )
        .await;
    let deals = w.deals(&w.principal, 2).await;
    let one = w
        .propose(&t, json!({"where": {"id": deals[0]}, "set": {"name": 1}}))
        .await
        .unwrap();
    let one_point_zero = w
        .propose(
            &t,
            json!({"where": {"id": deals[1]}, "set": {"name": 1.00}}),
        )
        .await
        .unwrap();
    assert_eq!(w.approve(&one).await.unwrap().0, "succeeded");
    assert_eq!(w.approve(&one_point_zero).await.unwrap().0, "succeeded");
    for d in deals {
        let name: String = w
            .superuser
            .query_one("SELECT name FROM crm.deal WHERE id = $1", &[&d])
            .await
            .unwrap()
            .get(0);
        assert_eq!(name, "1", "1 and 1.00 hash alike, so they write alike");
    }
}

#[tokio::test]
async fn test_a_timestamp_version_means_the_same_in_every_time_zone() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(
        su,
        "id bigint PRIMARY KEY, state text NOT NULL, changed_at timestamptz NOT NULL DEFAULT now()",
    )
    .await;
    su.batch_execute(&format!(
        "CREATE FUNCTION {t}_touch() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN NEW.changed_at := clock_timestamp(); RETURN NEW; END $$;
         CREATE TRIGGER touch BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_touch();
         INSERT INTO {t} (tenant, id, state) VALUES ('{}', 1, 'open');",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "close",
            json!({"executor": "sql", "sql": {"table": t, "key": "id", "version": "changed_at",
                                              "set": ["state"], "where": ["id"]}}),
        )
        .await;
    // Proposed in UTC, approved in Berlin: the same instant, another text.
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'SQL, DMY'")
        .await
        .unwrap();
    let p = propose_on(
        &tx,
        &tool,
        json!({"where": {"id": 1}, "set": {"state": "closed"}}),
        json!({}),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let tx = w.human.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL TimeZone = 'Europe/Berlin'; SET LOCAL DateStyle = 'German'")
        .await
        .unwrap();
    let (status, _) = approve_on(&tx, p.id, &p.token, None).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(status, "succeeded", "not a false conflict");
}

#[tokio::test]
async fn test_a_date_key_names_the_same_row_in_every_date_style() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "day date PRIMARY KEY, note text NOT NULL").await;
    su.batch_execute(&format!(
        "INSERT INTO {t} VALUES ('{0}', '2026-02-01', 'first of February'), ('{0}', '2026-01-02', 'second of January')",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "annotate",
            json!({"executor": "sql", "sql": {"table": t, "key": "day", "set": ["note"], "where": ["day"]}}),
        )
        .await;
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL DateStyle = 'SQL, DMY'")
        .await
        .unwrap();
    let p = propose_on(
        &tx,
        &tool,
        json!({"where": {"day": "2026-02-01"}, "set": {"note": "changed"}}),
        json!({}),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let tx = w.human.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL DateStyle = 'SQL, MDY'")
        .await
        .unwrap();
    assert_eq!(
        approve_on(&tx, p.id, &p.token, None).await.unwrap().0,
        "succeeded"
    );
    tx.commit().await.unwrap();
    let rows = su
        .query(
            &format!("SELECT day::text, note FROM {t} ORDER BY day"),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        got,
        vec![
            ("2026-01-02".to_string(), "second of January".to_string()),
            ("2026-02-01".to_string(), "changed".to_string())
        ],
        "the row the agent named changed, and no other"
    );
}

/// A sized column (`varchar(5)`, `char(3)`, `bit(4)`, `numeric(12,2)`,
/// `timestamp(0)`) never stores another value than the one the person
/// approved: an explicit cast to the sized type cut or rounded the value
/// silently, and the postcondition, cast the same way, agreed (twenty-first
/// red-team pass, docs/security.md row 126). A value that does not fit is
/// refused at propose; one that fits is written as approved.
#[tokio::test]
async fn test_a_sized_column_stores_the_approved_value_or_nothing() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(
        su,
        "id bigint PRIMARY KEY, role varchar(5) NOT NULL DEFAULT 'user', code char(3), \
         flags bit(4), amount numeric(12,2), due timestamp(0)",
    )
    .await;
    su.batch_execute(&format!(
        "INSERT INTO {t} VALUES ('{}', 1, 'user', 'abc', '0000', 1, '2026-01-01')",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "sized",
            json!({"executor": "sql", "summary": "Set {set} on {count} row(s)",
                   "sql": {"table": t, "key": "id", "set": ["role", "code", "flags", "amount", "due"], "where": ["id"]}}),
        )
        .await;
    let row = format!("SELECT role || ' ' || code || '|' || flags || ' ' || amount || ' ' || due FROM {t} WHERE id = 1");
    let before: String = su.query_one(&row, &[]).await.unwrap().get(0);
    for (column, value) in [
        ("role", json!("admin_readonly")),
        ("code", json!("EURx")),
        ("flags", json!("11110000")),
        ("flags", json!("1")),
        ("amount", json!(0.004)),
        ("due", json!("2026-03-31 23:59:59.6")),
    ] {
        let params = json!({"where": {"id": 1}, "set": {column: value}});
        let (state, message) = failure(propose_on(&w.agent, &tool, params, json!({})).await);
        assert_eq!(state, "22023", "{column} = {value}: {message}");
        assert!(
            message.contains(&format!("params.set.{column}")) && message.contains("does not fit"),
            "the refusal names what does not fit: {message}"
        );
    }
    assert_eq!(
        su.query_one(&row, &[]).await.unwrap().get::<_, String>(0),
        before
    );

    // What fits is written as approved, in the column's own form.
    let p = propose_on(
        &w.agent,
        &tool,
        json!({"where": {"id": 1}, "set": {"role": "admin", "code": "EU", "flags": "1010",
                                             "amount": 5, "due": "2026-03-31 23:59:59"}}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, None).await.unwrap().0,
        "succeeded"
    );
    assert_eq!(
        su.query_one(&row, &[]).await.unwrap().get::<_, String>(0),
        "admin EU|1010 5.00 2026-03-31 23:59:59"
    );
    // Only a form with a value for a sized column pays for the check.
    let check: Option<Vec<String>> = su
        .query_one(
            "SELECT keyturn._form_fit($1, $2)",
            &[
                &json!({"id": "bigint", "stage": "text", "note": "character varying", "at": "timestamp with time zone"}),
                &json!({"where": {"id": [1, 2]}, "set": {"stage": "won", "note": "x", "at": "2026-01-01"}}),
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(check, None);
}

/// What keyturn cannot write exactly, it does not gate: a composite type
/// whose fields have sizes (`(0.004,refund)` stored as `(0.00,refund)`),
/// `"char"` and `name` (cut without a size), `money` (rounded, and read by
/// `lc_monetary`), a range; and the values of types it gates that would be
/// rounded without a size (a fraction of a second past microseconds, a
/// `real` or `double precision` that is no such number, an `interval year`
/// given months) are refused at propose (twenty-second red-team pass,
/// docs/security.md row 126).
#[tokio::test]
async fn test_a_type_keyturn_cannot_write_exactly_is_refused() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let line = format!("crm.{}", unique("line"));
    su.batch_execute(&format!(
        "CREATE TYPE {line} AS (amount numeric(12,2), memo text)"
    ))
    .await
    .unwrap();
    // Not a type that is only named citext (twenty-third pass).
    let citext = unique("ci");
    su.batch_execute(&format!(
        "CREATE SCHEMA {citext}; CREATE TYPE {citext}.citext AS (amount numeric(12,2), memo text)"
    ))
    .await
    .unwrap();
    for column in [
        line.clone(),
        format!("{line}[]"),
        "\"char\"".into(),
        "name".into(),
        "money".into(),
        "tsrange".into(),
        "jsonb[]".into(),
        format!("{citext}.citext"),
    ] {
        let t = table(su, &format!("id bigint PRIMARY KEY, v {column}")).await;
        let spec = json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["v"], "where": ["id"]}});
        let message = refused_registration(&w, &spec).await;
        assert!(message.contains("spec.sql.set"), "{column}: {message}");
    }

    let t = table(
        su,
        "id bigint PRIMARY KEY, at timestamp, at_tz timestamptz, t time, r real, d double precision, \
         y interval year, i interval, dd date, fee numeric(5,2)",
    )
    .await;
    su.batch_execute(&format!(
        "INSERT INTO {t} (tenant, id, fee) VALUES ('{}', 1, 9.99)",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "timely",
            json!({"executor": "sql", "sql": {"table": t, "key": "id",
                   "set": ["at", "at_tz", "t", "r", "d", "y", "i", "dd"], "where": ["id", "fee"]}}),
        )
        .await;
    for (column, value) in [
        ("at", json!("2026-12-31 23:59:59.9999995")),
        ("at_tz", json!("2026-12-31 23:59:59.99999951+00")),
        ("t", json!("23:59:59.9999999")),
        ("i", json!("1.0000001 seconds")),
        ("r", json!("16777217")),
        ("d", json!("9007199254740993")),
        ("y", json!("11 mons -330 days")),
        // Read when the write runs, not when the person looked.
        ("at", json!("now")),
        ("at_tz", json!("Tomorrow 10:00")),
        ("t", json!("now")),
        ("dd", json!("today")),
        ("dd", json!("yesterday")),
        // Read otherwise than a person reads it (twenty-third pass).
        ("r", json!("016777217")),
        ("d", json!("0x1.000001p24")),
        ("i", json!("0.4 microseconds")),
        ("at_tz", json!("2026-06-01 12:00 GMT+03:00")),
        ("at", json!("2026-06-01 09:00 America/Los_Angeles")),
        ("at", json!("2026-06-01 09:00+02")),
        ("t", json!("09:00 PST")),
    ] {
        let params = json!({"where": {"id": 1}, "set": {column: value}});
        let (state, message) = failure(propose_on(&w.agent, &tool, params, json!({})).await);
        assert_eq!(state, "22023", "{column} = {value}: {message}");
    }
    // One value a cast cannot read does not hide another that does not fit.
    let params = json!({"where": {"id": 1, "fee": [9.99, "1e10"]}, "set": {"y": "1 year 11 mons -330 days"}});
    let (state, message) = failure(propose_on(&w.agent, &tool, params, json!({})).await);
    assert_eq!(state, "22023", "{message}");
    // What they hold exactly passes, and is written as approved.
    let p = propose_on(
        &w.agent,
        &tool,
        json!({"where": {"id": 1}, "set": {"at": "2026-12-31 23:59:59.999999", "t": "12:00:00.5",
                                             "r": 0.5, "d": "0.1", "y": "2 years", "i": "00:00:01.5",
                                             "at_tz": "2026-06-01T09:00:00Z"}}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, None).await.unwrap().0,
        "succeeded"
    );
    let row: String = su
        .query_one(
            &format!("SELECT concat_ws(' ', at, t, r, d, y, i, at_tz) FROM {t}"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        row,
        "2026-12-31 23:59:59.999999 12:00:00.5 0.5 0.1 2 years 00:00:01.5 2026-06-01 09:00:00+00"
    );
}

/// A JSON column is one in any spelling: a domain over jsonb took a string
/// as text, which the column then parsed (an escaped key repeated: the card
/// showed "user", the table "admin"); a plain json column's postcondition
/// had no `=` and every approval failed; a column whose type changed after
/// registration is reported, and its write checked (twenty-third red-team
/// pass, docs/security.md rows 126 and 134).
#[tokio::test]
async fn test_a_json_column_in_any_spelling_stores_the_value_shown() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let prefs = format!("crm.{}", unique("prefs"));
    su.batch_execute(&format!("CREATE DOMAIN {prefs} AS jsonb"))
        .await
        .unwrap();
    let t = table(
        su,
        &format!("id bigint PRIMARY KEY, p {prefs}, j json, term interval, revision int NOT NULL DEFAULT 1"),
    )
    .await;
    su.batch_execute(&format!(
        "INSERT INTO {t} (tenant, id) VALUES ('{}', 1)",
        w.tenant
    ))
    .await
    .unwrap();
    bump_revision(su, &t).await;
    let tool = w
        .tool(
            "prefs",
            json!({"executor": "sql", "sql": {"table": t, "key": "id", "version": "revision",
                   "set": ["p", "j", "term"], "where": ["id"]}}),
        )
        .await;
    let shown = r#"{"role": "user", "r\u006fle": "admin"}"#;
    let p = propose_on(
        &w.agent,
        &tool,
        json!({"where": {"id": 1}, "set": {"p": shown, "j": {"b": 1, "a": [1, 2]}}}),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(
        approve_on(&w.human, p.id, &p.token, None).await.unwrap().0,
        "succeeded"
    );
    let (p_kind, p_text, j): (String, String, String) = {
        let r = su
            .query_one(
                &format!("SELECT jsonb_typeof(p), p #>> '{{}}', j::text FROM {t}"),
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        (p_kind.as_str(), p_text.as_str()),
        ("string", shown),
        "stored as the string shown"
    );
    assert_eq!(j, r#"{"a": [1, 2], "b": 1}"#);

    // The interval column becomes `interval year` after registration:
    // reported, and a value it would cut is not written.
    let cut = propose_on(
        &w.agent,
        &tool,
        json!({"where": {"id": 1}, "set": {"term": "1 year 11 mons -330 days"}}),
        json!({}),
    )
    .await
    .unwrap();
    su.batch_execute(&format!(
        "ALTER TABLE {t} ALTER COLUMN term TYPE interval year"
    ))
    .await
    .unwrap();
    let reported = w
        .admin
        .query(
            "SELECT object, problem FROM keyturn.check_deployment() WHERE severity = 'error'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .any(|r| {
            r.get::<_, String>(0) == format!("tool {tool}")
                && r.get::<_, String>(1).contains("term")
        });
    assert!(
        reported,
        "check_deployment names the column whose type changed"
    );
    assert_eq!(
        approve_on(&w.human, cut.id, &cut.token, None)
            .await
            .unwrap()
            .0,
        "failed"
    );
    let term: Option<String> = su
        .query_one(&format!("SELECT term::text FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(term, None, "nothing was written");
}

/// A filter on a sized column names the rows whose value is the one given,
/// never those it would be cut to: `login = 'admin.old-test-account'` on a
/// `varchar(5)` column matched the account `admin` (row 126).
#[tokio::test]
async fn test_a_filter_on_a_sized_column_never_matches_a_cut_value() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(
        su,
        "id bigint PRIMARY KEY, login varchar(5) NOT NULL, active boolean NOT NULL",
    )
    .await;
    su.batch_execute(&format!(
        "INSERT INTO {t} VALUES ('{0}', 1, 'admin', true), ('{0}', 2, 'intrn', true)",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "disable",
            json!({"executor": "sql", "summary": "Set active={set.active} for {where.login}",
                   "sql": {"table": t, "key": "id", "set": ["active"], "where": ["login"]}}),
        )
        .await;
    for login in [
        json!("admin.old-test-account"),
        json!(["admin.old-test-account", "intrn-x"]),
    ] {
        let params = json!({"where": {"login": login}, "set": {"active": false}});
        assert_eq!(
            sqlstate(propose_on(&w.agent, &tool, params, json!({})).await),
            "22023",
            "{login}"
        );
    }
    let active = count(su, &format!("SELECT count(*) FROM {t} WHERE active"), &[]).await;
    assert_eq!(active, 2, "no account was disabled");
}

/// What changed after the proposal is caught at the write: a column made
/// narrower after a value was proposed for it stores nothing, and the action
/// ends failed (row 126; the proposal's tool version still names the
/// column's old type).
#[tokio::test]
async fn test_a_column_narrowed_after_the_proposal_stores_nothing() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "id bigint PRIMARY KEY, amount numeric NOT NULL, role text NOT NULL, revision int NOT NULL DEFAULT 1").await;
    su.batch_execute(&format!(
        "INSERT INTO {t} VALUES ('{}', 1, 1, 'user')",
        w.tenant
    ))
    .await
    .unwrap();
    bump_revision(su, &t).await;
    let tool = w
        .tool(
            "narrowed",
            json!({"executor": "sql", "summary": "Set {set} on {count} row(s)",
                   "sql": {"table": t, "key": "id", "version": "revision", "set": ["amount", "role"], "where": ["id"]}}),
        )
        .await;
    let rounded = propose_on(
        &w.agent,
        &tool,
        json!({"where": {"id": 1}, "set": {"amount": 0.004}}),
        json!({}),
    )
    .await
    .unwrap();
    let cut = propose_on(
        &w.agent,
        &tool,
        json!({"where": {"id": 1}, "set": {"role": "admin_readonly"}}),
        json!({}),
    )
    .await
    .unwrap();
    su.batch_execute(&format!(
        "ALTER TABLE {t} ALTER COLUMN amount TYPE numeric(12,2), ALTER COLUMN role TYPE varchar(5)"
    ))
    .await
    .unwrap();
    for p in [rounded, cut] {
        let (status, result) = approve_on(&w.human, p.id, &p.token, None).await.unwrap();
        assert_eq!(status, "failed", "{result:?}");
    }
    let row: String = su
        .query_one(
            &format!("SELECT amount || ' ' || role || ' ' || revision FROM {t}"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(row, "1.00 user 1", "nothing was written");
}

/// An sql tool's key names one row: with a key that is not unique
/// (`owner`), a row that took a target's key and version after the
/// proposal was written by the approval, and the target the card showed was
/// not (twenty-first red-team pass, docs/security.md row 127). register_tool
/// refuses such a key; check_deployment reports a key whose unique index was
/// dropped since.
#[tokio::test]
async fn test_a_key_that_can_name_two_rows_is_refused() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(
        su,
        "id bigint PRIMARY KEY, owner text NOT NULL, stage text NOT NULL",
    )
    .await;
    let spec = |key: &str| {
        json!({"executor": "sql", "summary": "Set stage {set.stage} for {where.owner}",
               "sql": {"table": t, "key": key, "set": ["stage"], "where": ["owner"]}})
    };
    let message = refused_registration(&w, &spec("owner")).await;
    assert!(message.contains("spec.sql.key"), "{message}");
    // Nor with another column, under another collation, NULL, or with a
    // child table the write reaches (twenty-second pass, row 127).
    let refused = |t: String| {
        let spec = json!({"executor": "sql", "sql": {"table": t, "key": "k", "set": ["v"], "where": ["k"]}});
        let w = &w;
        async move {
            refused_registration(w, &spec).await;
        }
    };
    refused(table(su, "k text NOT NULL, j int NOT NULL, v text, UNIQUE (k, j)").await).await;
    refused(table(su, "k text UNIQUE, v text").await).await;
    // An index whose equality is not the key's (twenty-third pass).
    let keytype = format!("crm.{}", unique("kt"));
    su.batch_execute(&format!("CREATE TYPE {keytype} AS (n numeric)"))
        .await
        .unwrap();
    let image = table(su, &format!("k {keytype} NOT NULL, v text")).await;
    su.batch_execute(&format!(
        "CREATE UNIQUE INDEX ON {image} (k record_image_ops)"
    ))
    .await
    .unwrap();
    refused(image).await;
    let nd = unique("nd");
    su.batch_execute(&format!(
        "CREATE COLLATION {nd} (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
    ))
    .await
    .unwrap();
    let folded = table(su, &format!("k text COLLATE {nd} NOT NULL, v text")).await;
    su.batch_execute(&format!(
        "CREATE UNIQUE INDEX ON {folded} ((k) COLLATE \"C\")"
    ))
    .await
    .unwrap();
    refused(folded.clone()).await;
    su.batch_execute(&format!(
        "CREATE UNIQUE INDEX ON {folded} (k COLLATE \"C\")"
    ))
    .await
    .unwrap();
    refused(folded).await;
    let parent = table(su, "k text PRIMARY KEY, v text").await;
    su.batch_execute(&format!(
        "CREATE TABLE {parent}_child () INHERITS ({parent})"
    ))
    .await
    .unwrap();
    refused(parent).await;

    // Unique by itself, it names one row.
    su.batch_execute(&format!("CREATE UNIQUE INDEX ON {t} (owner)"))
        .await
        .unwrap();
    let tool = w.tool("by_owner", spec("owner")).await;
    let index: String = su
        .query_one(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::text::regclass AND NOT indisprimary",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    su.batch_execute(&format!("DROP INDEX {index}"))
        .await
        .unwrap();
    let problems = deployment_problems(&w.admin).await;
    assert!(
        reported(&problems, "error", &format!("tool {tool}"), "owner"),
        "check_deployment names the tool whose key lost its unique index"
    );
}

/// What an approval writes does not depend on the approver's session: the
/// time zone abbreviations (`IST` is India's or Israel's or Ireland's) and
/// `array_nulls` changed a value as it was read (twenty-second red-team
/// pass, docs/security.md row 132).
#[tokio::test]
async fn test_an_approvers_settings_never_change_the_value_written() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "id bigint PRIMARY KEY, at timestamptz, tags text[]").await;
    su.batch_execute(&format!(
        "INSERT INTO {t} VALUES ('{}', 1, NULL, NULL)",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "meet",
            json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["at", "tags"], "where": ["id"]}}),
        )
        .await;
    let mut written = Vec::new();
    for settings in [
        "",
        "SET LOCAL timezone_abbreviations = 'India'; SET LOCAL array_nulls = off",
    ] {
        let p = propose_on(
            &w.agent,
            &tool,
            json!({"where": {"id": 1}, "set": {"at": "2026-06-01 12:00:00+00", "tags": "{admin,NULL}"}}),
            json!({}),
        )
        .await
        .unwrap();
        let tx = w.human.transaction().await.unwrap();
        tx.batch_execute(settings).await.unwrap();
        assert_eq!(
            approve_on(&tx, p.id, &p.token, None).await.unwrap().0,
            "succeeded"
        );
        tx.commit().await.unwrap();
        let row: String = su
            .query_one(
                &format!("SELECT (at AT TIME ZONE 'UTC')::text || ' ' || (tags[2] IS NULL)::text FROM {t}"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        written.push(row);
    }
    assert_eq!(
        written[0], written[1],
        "the approver's settings changed the value written"
    );
    // An abbreviation, whose meaning is a setting's, is no value to approve:
    // refused at propose (twenty-third pass).
    let ist = json!({"where": {"id": 1}, "set": {"at": "2026-06-01 12:00 IST"}});
    assert_eq!(
        sqlstate(propose_on(&w.agent, &tool, ist, json!({})).await),
        "22023"
    );
}

/// A filter value its column cannot read is refused without quoting it:
/// PostgreSQL writes every error message to its log, and an agent's value of
/// a megabyte of terminal escapes went there whole (twenty-second red-team
/// pass, docs/security.md row 133).
#[tokio::test]
async fn test_a_value_that_is_no_date_is_refused_without_being_quoted() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "day date PRIMARY KEY, note text NOT NULL").await;
    let tool = w
        .tool(
            "note",
            json!({"executor": "sql", "sql": {"table": t, "key": "day", "set": ["note"], "where": ["day"]}}),
        )
        .await;
    let value = format!("no date \u{1b}]0;forged\u{7} {}", "x".repeat(10_000));
    let (state, message) = failure(
        propose_on(
            &w.agent,
            &tool,
            json!({"where": {"day": value}, "set": {"note": "n"}}),
            json!({}),
        )
        .await,
    );
    assert_eq!(state, "22023", "{message}");
    assert!(
        !message.contains("forged") && message.len() < 500,
        "the refusal quotes the value: {}",
        &message[..message.len().min(300)]
    );
}

/// Row 133's class, every other route the thirtieth red-team pass looked for:
/// a refusal that names an agent's string (a tool, an origin key or value,
/// an evidence id, a params key, a file's type) names it cleaned and
/// clipped, so the server log gets neither its terminal escapes, nor a line
/// it forges, nor its megabyte (docs/security.md row 141).
#[tokio::test]
async fn test_an_agents_strings_reach_no_refusal_whole() {
    let w = World::new("member").await;
    let forged = "\u{1b}[2J\n2026-12-07 00:00:00 UTC [1] LOG:  forged";
    let long = format!("{forged}{}", "x".repeat(100_000));
    let short = format!("{forged}{}", "x".repeat(100));
    let deal = w.deal_tool(json!({})).await;
    let form = json!({"where": {"id": 1}, "set": {"stage": "won"}});
    let schema_tool = w.webhook_tool(json!({"effect": "reversible"})).await;
    let task = w
        .webhook_tool(json!({"approval": "task", "effect": "reversible"}))
        .await;
    let task_origin = json!({"conversation_id": short, "turn_id": short, "message_id": short,
                             "assistant_message_id": "m-2"});
    let mut refusals: Vec<(&str, Result<(), tokio_postgres::Error>)> = vec![
        (
            "is unknown or disabled",
            propose_on(&w.agent, &long, form.clone(), json!({}))
                .await
                .map(drop),
        ),
        (
            "unknown origin key",
            propose_on(&w.agent, &deal, form.clone(), json!({ long.clone(): "v" }))
                .await
                .map(drop),
        ),
        (
            "origin.evidence names",
            propose_on(&w.agent, &deal, form.clone(), json!({"evidence": [short]}))
                .await
                .map(drop),
        ),
        (
            "do not match the schema",
            propose_on(
                &w.agent,
                &schema_tool,
                json!({ long.clone(): 1 }),
                json!({}),
            )
            .await
            .map(drop),
        ),
        (
            "credential material",
            propose_on(
                &w.agent,
                &schema_tool,
                json!({ format!("Authorization: Bearer {long}"): 1 }),
                json!({}),
            )
            .await
            .map(drop),
        ),
        (
            "no human source",
            propose_on(&w.agent, &task, json!({}), task_origin)
                .await
                .map(drop),
        ),
    ];
    let staged = w
        .agent
        .query_one(
            "SELECT keyturn.stage_file('\\x01'::bytea, 'a.pdf', $1)::text",
            &[&long],
        )
        .await
        .map(drop);
    let tool_read = w
        .agent
        .query_one("SELECT keyturn.read($1, '{}')::text", &[&long])
        .await
        .map(drop);
    // The thirty-first pass's routes: a form's key, a number's literal, an
    // upstream's schema keyword, an operator's status.
    refusals.push((
        "may not filter on",
        propose_on(
            &w.agent,
            &deal,
            json!({"where": { long.clone(): 1 }, "set": {"stage": "won"}}),
            json!({}),
        )
        .await
        .map(drop),
    ));
    let digits = format!("1{}1", "0".repeat(100_000));
    refusals.push((
        "IEEE-754 double",
        propose_on(
            &w.agent,
            &schema_tool,
            serde_json::from_str(&format!(
                r#"{{"channel": "c", "text": "t", "n": {digits}}}"#
            ))
            .unwrap(),
            json!({}),
        )
        .await
        .map(drop),
    ));
    let definition = json!({"name": "t", "inputSchema": {"type": "object", "properties": {"a": { long.clone(): 1 }}}});
    refusals.push((
        "unsupported",
        connect("app_dispatcher")
            .await
            .query_one(
                "SELECT keyturn.register_discovered_tool('u31', $1, false)",
                &[&definition],
            )
            .await
            .map(drop),
    ));
    refusals.push((
        "is not a status",
        connect("app_operator")
            .await
            .query("SELECT * FROM keyturn.find_actions($1)", &[&long])
            .await
            .map(drop),
    ));
    refusals.push(("content_type must be", staged));
    refusals.push(("no enabled read tool", tool_read));
    let whole: Vec<String> = refusals
        .into_iter()
        .filter_map(|(says, r)| {
            let (state, message) = failure(r);
            // The refusal meant, not another check's before it.
            assert!(
                message.contains(says),
                "{says:?} not reached: {state} {message:.300}"
            );
            let clean = !message.chars().any(char::is_control) && message.chars().count() < 1_000;
            (!clean).then(|| {
                format!(
                    "{says:?} ({state}): {:?}",
                    message.chars().take(120).collect::<String>()
                )
            })
        })
        .collect();
    assert!(
        whole.is_empty(),
        "refusals quote an agent's string whole:\n{}",
        whole.join("\n")
    );
}

// --- Only a person approves --------------------------------------------------

#[tokio::test]
async fn test_a_login_that_inherits_both_sides_cannot_approve() {
    let w = World::new("member").await;
    // Not app_human: a login that inherited its UPDATE on crm.deal would be an
    // agent that may write the table, and register_tool (rightly) refuses
    // gated tables an agent may write while this role exists.
    let both = role(
        &w.superuser,
        "kt_both",
        "LOGIN IN ROLE app_agent, keyturn_approver",
    )
    .await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let c = Conn::connect(&both, w.identity()).await;
    let p = propose_on(
        &c,
        &t,
        json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        json!({}),
    )
    .await
    .expect("it may propose: it is an agent");
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL ROLE keyturn_approver")
        .await
        .unwrap();
    let r = approve_on(&tx, p.id, &p.token, None).await;
    assert_eq!(
        sqlstate(r),
        "42501",
        "SET ROLE into the approver side does not make it a person"
    );
    drop(tx);
    for call in [
        format!("SELECT keyturn.preview('{}', '{}')", p.id, p.token),
        format!("SELECT keyturn.reject('{}', '{}')", p.id, p.token),
        format!(
            "SELECT * FROM keyturn.revise('{}', '{}', '{{}}')",
            p.id, p.token
        ),
        format!("SELECT keyturn.delegate('{t}', '{{}}', 1, '1 hour')"),
        "SELECT * FROM keyturn.pending()".to_string(),
    ] {
        let tx = c.transaction().await.unwrap();
        tx.batch_execute("SET LOCAL ROLE keyturn_approver")
            .await
            .unwrap();
        assert_eq!(sqlstate(tx.query(&call, &[]).await), "42501", "{call}");
    }
    assert_eq!(w.status(p.id).await, "pending");
    assert_eq!(w.writes(deal).await, 0);
    w.superuser
        .batch_execute(&format!("DROP ROLE {both}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn test_a_noinherit_authenticator_switching_roles_may_approve() {
    // The PostgREST pattern done right: one NOINHERIT login, the role per request.
    let w = World::new("member").await;
    let auth = role(
        &w.superuser,
        "kt_auth",
        "LOGIN NOINHERIT IN ROLE app_agent, app_human",
    )
    .await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let c = Conn::connect(&auth, w.identity()).await;
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL ROLE app_agent").await.unwrap();
    let p = propose_on(
        &tx,
        &t,
        json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        json!({}),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL ROLE app_human").await.unwrap();
    assert_eq!(
        approve_on(&tx, p.id, &p.token, None).await.unwrap().0,
        "succeeded"
    );
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn test_code_inside_the_approved_write_cannot_approve_anything() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "id bigint PRIMARY KEY, state text NOT NULL").await;
    let stash = format!("{t}_stash");
    // The trigger's author reached it through the table; what it does: approve
    // a proposal the person never saw, with its stolen token.
    su.batch_execute(&format!(
        "CREATE TABLE {stash} (action_id uuid, token text);
         GRANT SELECT ON {stash} TO app_human;
         CREATE FUNCTION {t}_sneak() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE s record;
         BEGIN
             FOR s IN SELECT * FROM {stash} LOOP
                 PERFORM * FROM keyturn.approve(s.action_id, s.token);
             END LOOP;
             RETURN NEW;
         END $$;
         CREATE TRIGGER sneak BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_sneak();
         INSERT INTO {t} VALUES ('{0}', 1, 'open');",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool("touch", json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["state"], "where": ["id"]}}))
        .await;
    let victim_tool = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let victim = w
        .propose(
            &victim_tool,
            json!({"where": {"id": deal}, "set": {"stage": "lost"}}),
        )
        .await
        .unwrap();
    su.execute(
        &format!("INSERT INTO {stash} VALUES ($1, $2)"),
        &[&victim.id, &victim.token],
    )
    .await
    .unwrap();
    let shown = w
        .propose(&tool, json!({"where": {"id": 1}, "set": {"state": "seen"}}))
        .await
        .unwrap();
    let (status, result) = w.approve(&shown).await.unwrap();
    assert_eq!(
        status, "failed",
        "the write whose trigger reached keyturn fails"
    );
    assert_eq!(result.unwrap()["sqlstate"], "42501");
    assert_eq!(
        w.status(victim.id).await,
        "pending",
        "the proposal nobody saw stays pending"
    );
    assert_eq!(w.stage_of(deal).await, "lead");
}

#[tokio::test]
async fn test_a_business_statement_is_security_restricted() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "id bigint PRIMARY KEY, state text NOT NULL").await;
    su.batch_execute(&format!(
        // A temporary table outlives the approve on the pooled connection
        // and shadows the application's unqualified names there.
        "CREATE FUNCTION {t}_escalate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN CREATE TEMP TABLE IF NOT EXISTS deal (id int); RETURN NEW; END $$;
         CREATE TRIGGER escalate BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_escalate();
         INSERT INTO {t} VALUES ('{0}', 1, 'open');",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool("touch", json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["state"], "where": ["id"]}}))
        .await;
    let p = w
        .propose(&tool, json!({"where": {"id": 1}, "set": {"state": "seen"}}))
        .await
        .unwrap();
    let (status, result) = w.approve(&p).await.unwrap();
    assert_eq!(status, "failed", "{result:?}");
    let state: String = su
        .query_one(&format!("SELECT state FROM {t} WHERE id = 1"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "open");
}

#[tokio::test]
async fn test_register_tool_refuses_a_table_agents_can_change() {
    let w = World::new("member").await;
    let su = &w.superuser;
    for grant in [
        "GRANT UPDATE ON {t} TO app_agent",
        "GRANT TRIGGER ON {t} TO app_agent",
        "GRANT UPDATE (state) ON {t} TO app_agent",
        "GRANT INSERT ON {t} TO PUBLIC",
        "ALTER TABLE {t} OWNER TO app_agent",
    ] {
        let t = table(su, "id bigint PRIMARY KEY, state text NOT NULL").await;
        su.batch_execute(&grant.replace("{t}", &t)).await.unwrap();
        let spec = json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["state"], "where": ["id"]}});
        let r = w
            .admin
            .execute(
                "SELECT keyturn.register_tool($1, $2)",
                &[&unique("gated"), &spec],
            )
            .await;
        assert_eq!(sqlstate(r), "22023", "{grant}");
    }
}

#[tokio::test]
async fn test_check_deployment_reports_what_a_live_database_gets_wrong() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let t = table(su, "id bigint PRIMARY KEY, state text NOT NULL").await;
    w.tool("gated", json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["state"], "where": ["id"]}}))
        .await;
    let both = role(
        su,
        "kt_both",
        "LOGIN IN ROLE keyturn_agent, keyturn_approver",
    )
    .await;
    su.batch_execute(&format!("GRANT TRIGGER ON {t} TO app_agent"))
        .await
        .unwrap();
    let problems = deployment_problems(&w.admin).await;
    let found = |object: &str, needle: &str| reported(&problems, "error", object, needle);
    assert!(found(&t, "may create triggers"), "the TRIGGER grant on {t}");
    assert!(found(&both, "inherits both"), "the login {both}");
    su.batch_execute(&format!(
        "REVOKE TRIGGER ON {t} FROM app_agent; DROP ROLE {both}"
    ))
    .await
    .unwrap();
    let agent = Conn::connect("app_agent", w.identity()).await;
    assert_eq!(
        sqlstate(
            agent
                .query("SELECT * FROM keyturn.check_deployment()", &[])
                .await
        ),
        "42501",
        "not for agents"
    );
}

/// Thirty-second red-team pass (docs/security.md, row 143): what lets an
/// agent past a table's row-level security or into an approved write is
/// refused or reported wherever it stands: a partition the agent owns
/// (refused for a write tool over its parent), a read tool's table handed
/// to an agent after registration (it reads nothing, and check_deployment
/// says why in words for a read), a read tool's table without row-level
/// security (a warning), an agent role with CREATEROLE (an error).
#[tokio::test]
async fn test_what_gets_an_agent_past_row_level_security_is_refused_or_reported() {
    let w = World::new("member").await;
    let su = &w.superuser;
    // A write tool over a table one of whose partitions an agent owns.
    let parted = format!("crm.{}", unique("parted"));
    su.batch_execute(&format!(
        "CREATE TABLE {parted} (tenant text NOT NULL, id bigint PRIMARY KEY, state text) PARTITION BY RANGE (id);
         CREATE TABLE {parted}_a PARTITION OF {parted} FOR VALUES FROM (0) TO (1000);
         ALTER TABLE {parted}_a OWNER TO app_agent;"
    ))
    .await
    .unwrap();
    let r = w
        .admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[
                &unique("parted"),
                &json!({"executor": "sql",
                "sql": {"table": parted, "key": "id", "set": ["state"], "where": ["id"]}}),
            ],
        )
        .await;
    let (state, message) = failure(r);
    assert_eq!(state, "22023", "{message}");
    assert!(message.contains(&format!("{parted}_a")), "{message}");

    // A read tool's table, handed to an agent role after registration.
    let t = table(su, "id bigint PRIMARY KEY").await;
    su.batch_execute(&format!("INSERT INTO {t} VALUES ('{}', 1)", w.tenant))
        .await
        .unwrap();
    let projection = unique("p.handed");
    let tool = w
        .tool(
            "handed",
            json!({"kind": "read", "executor": "sql", "projection": projection,
                   "sql": {"table": t, "key": "id", "select": ["id"]}}),
        )
        .await;
    w.admin
        .execute(
            "SELECT keyturn.register_projection($1, $2)",
            &[
                &projection,
                &json!({"fields": {"rows[].id": {"max_length": 20}}}),
            ],
        )
        .await
        .unwrap();
    let read = "SELECT reference FROM keyturn.read($1)";
    w.agent
        .query_one(read, &[&tool])
        .await
        .expect("read under its row-level security");
    su.batch_execute(&format!(
        "ALTER TABLE {t} OWNER TO app_agent; ALTER TABLE {t} DISABLE ROW LEVEL SECURITY"
    ))
    .await
    .unwrap();
    assert_eq!(sqlstate(w.agent.query_one(read, &[&tool]).await), "55000");
    let cr = role(su, "kt_createrole", "CREATEROLE IN ROLE keyturn_agent").await;
    let problems = deployment_problems(&w.admin).await;
    su.batch_execute(&format!(
        "ALTER TABLE {t} OWNER TO postgres; ALTER TABLE {t} ENABLE ROW LEVEL SECURITY; \
         DROP ROLE {cr}; DROP TABLE {parted}"
    ))
    .await
    .unwrap();
    let found =
        |severity: &str, object: &str, needle: &str| reported(&problems, severity, object, needle);
    assert!(
        found("error", &t, "reads it past its row-level security"),
        "{t} owned"
    );
    assert!(
        found("warning", &t, "row-level security is off"),
        "{t} without RLS"
    );
    assert!(found("error", &cr, "CREATEROLE"), "{cr}");
    assert!(
        !found("error", &t, "inside an approved write"),
        "a read tool's table is reported in words for a read"
    );
}

/// Thirty-third red-team pass (docs/security.md, row 143): an agent that
/// owns a gated table's schema dropped the table and put its own in its
/// place, whose trigger ran inside the approved write as the approver; and
/// a trigger on a partition, calling an agent's function, went unreported.
/// Such a schema is refused at registration, a table owned by an agent's
/// role serves no proposal, and check_deployment looks at partitions.
#[tokio::test]
async fn test_a_gated_table_an_agent_could_replace_or_hook_is_refused_or_reported() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let schema = unique("agentapp");
    su.batch_execute(&format!(
        "CREATE SCHEMA {schema} AUTHORIZATION app_agent;
         CREATE TABLE {schema}.ticket (id bigint PRIMARY KEY, state text);"
    ))
    .await
    .unwrap();
    let message = refused_registration(
        &w,
        &json!({"executor": "sql", "sql": {"table": format!("{schema}.ticket"), "key": "id",
                                           "set": ["state"], "where": ["id"]}}),
    )
    .await;
    su.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
    assert!(message.contains("owns the schema"), "{message}");

    // A registered table handed to an agent's role (as one it put in the
    // registered table's place would be) serves no proposal.
    let t = table(su, "id bigint PRIMARY KEY, state text NOT NULL").await;
    su.batch_execute(&format!(
        "INSERT INTO {t} VALUES ('{}', 1, 'open')",
        w.tenant
    ))
    .await
    .unwrap();
    let tool = w
        .tool(
            "handed_write",
            json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["state"], "where": ["id"]}}),
        )
        .await;
    let form = json!({"where": {"id": 1}, "set": {"state": "closed"}});
    propose_on(&w.agent, &tool, form.clone(), json!({}))
        .await
        .expect("a table of a role that is no agent's");
    su.batch_execute(&format!("ALTER TABLE {t} OWNER TO app_agent"))
        .await
        .unwrap();
    let (state, message) = failure(propose_on(&w.agent, &tool, form, json!({})).await);
    su.batch_execute(&format!("ALTER TABLE {t} OWNER TO postgres"))
        .await
        .unwrap();
    assert_eq!(state, "55000", "{message}");
    assert!(message.contains("owned by an agent"), "{message}");

    // A trigger on a partition of a gated table calling an agent's function.
    let parted = format!("crm.{}", unique("hooked"));
    su.batch_execute(&format!(
        "CREATE TABLE {parted} (tenant text NOT NULL, id bigint PRIMARY KEY, state text) PARTITION BY RANGE (id);
         CREATE TABLE {parted}_a PARTITION OF {parted} FOR VALUES FROM (0) TO (1000);"
    ))
    .await
    .unwrap();
    w.tool(
        "hooked",
        json!({"executor": "sql", "sql": {"table": parted, "key": "id", "set": ["state"], "where": ["id"]}}),
    )
    .await;
    // Added after registration, which refuses them (thirty-fourth pass).
    su.batch_execute(&format!(
        "CREATE FUNCTION {parted}_f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
         ALTER FUNCTION {parted}_f() OWNER TO app_agent;
         CREATE TRIGGER hook BEFORE UPDATE ON {parted}_a FOR EACH ROW EXECUTE FUNCTION {parted}_f();
         CREATE FUNCTION {parted}_p(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         ALTER FUNCTION {parted}_p(bigint) OWNER TO app_agent;
         ALTER TABLE {parted} ENABLE ROW LEVEL SECURITY;
         CREATE POLICY hook ON {parted} AS RESTRICTIVE USING ({parted}_p(id));"
    ))
    .await
    .unwrap();
    let problems = deployment_problems(&w.admin).await;
    // Nothing of app_agent's outlives the test: the suite drops the role.
    su.batch_execute(&format!(
        "DROP TABLE {parted}; DROP FUNCTION {parted}_f(); DROP FUNCTION {parted}_p(bigint)"
    ))
    .await
    .unwrap();
    assert!(
        reported(
            &problems,
            "error",
            &format!("{parted}_f"),
            "owned by agent role"
        ),
        "the trigger on {parted}_a: {problems:?}"
    );
    assert!(
        reported(&problems, "error", &format!("{parted}_p"), "policy hook"),
        "the policy on {parted}: {problems:?}"
    );
}

/// Thirty-fourth red-team pass (docs/security.md, row 143): an agent's own
/// object used by a gated table ran the agent's code inside the approved
/// write: a domain of a column (its constraint added later), a view a policy
/// reads, a function behind an operator; and a partition attached after the
/// tool's registration. Each is refused at registration or reported, and a
/// partition an agent owns serves no proposal.
#[tokio::test]
async fn test_an_agents_object_a_gated_table_uses_is_refused_or_reported() {
    let w = World::new("member").await;
    let su = &w.superuser;
    let domain = format!("crm.{}", unique("agent_text"));
    let view = format!("crm.{}", unique("agent_view"));
    let t = table(su, "id bigint PRIMARY KEY, state text NOT NULL").await;
    su.batch_execute(&format!(
        "CREATE DOMAIN {domain} AS text; ALTER DOMAIN {domain} OWNER TO app_agent;
         CREATE VIEW {view} AS SELECT 1 AS one; ALTER VIEW {view} OWNER TO app_agent;
         CREATE TABLE {t}_d (id bigint PRIMARY KEY, state {domain});"
    ))
    .await
    .unwrap();
    let message = refused_registration(
        &w,
        &json!({"executor": "sql", "sql": {"table": format!("{t}_d"), "key": "id",
                                           "set": ["state"], "where": ["id"]}}),
    )
    .await;
    assert!(message.contains(&domain), "{message}");
    // Used after registration: reported.
    let tool = w
        .tool(
            "uses",
            json!({"executor": "sql", "sql": {"table": t, "key": "id", "set": ["state"], "where": ["id"]}}),
        )
        .await;
    su.batch_execute(&format!(
        "CREATE POLICY peek ON {t} AS RESTRICTIVE USING (EXISTS (SELECT 1 FROM {view}))"
    ))
    .await
    .unwrap();
    let problems = deployment_problems(&w.admin).await;
    su.batch_execute(&format!("DROP POLICY peek ON {t}"))
        .await
        .unwrap();
    assert!(
        reported(&problems, "error", &view, "policy peek"),
        "the view a policy reads: {problems:?}"
    );

    // A partition an agent owns, attached after registration.
    let parted = format!("crm.{}", unique("attached"));
    su.batch_execute(&format!(
        "CREATE TABLE {parted} (tenant text NOT NULL, id bigint PRIMARY KEY, state text) PARTITION BY RANGE (id);
         ALTER TABLE {parted} ENABLE ROW LEVEL SECURITY;
         CREATE POLICY by_tenant ON {parted} USING (tenant = keyturn.current_tenant());
         GRANT SELECT ON {parted} TO app_agent; GRANT SELECT, UPDATE ON {parted} TO app_human;"
    ))
    .await
    .unwrap();
    let parted_tool = w
        .tool(
            "attached",
            json!({"executor": "sql", "sql": {"table": parted, "key": "id", "set": ["state"], "where": ["id"]}}),
        )
        .await;
    su.batch_execute(&format!(
        "CREATE TABLE {parted}_a (tenant text NOT NULL, id bigint PRIMARY KEY, state text);
         ALTER TABLE {parted}_a OWNER TO app_agent;
         ALTER TABLE {parted} ATTACH PARTITION {parted}_a FOR VALUES FROM (0) TO (1000);
         INSERT INTO {parted} VALUES ('{}', 1, 'open');",
        w.tenant
    ))
    .await
    .unwrap();
    let r = propose_on(
        &w.agent,
        &parted_tool,
        json!({"where": {"id": 1}, "set": {"state": "closed"}}),
        json!({}),
    )
    .await;
    // Nothing of app_agent's outlives the test: the suite drops the role.
    su.batch_execute(&format!(
        "DROP TABLE {parted}; DROP TABLE {t}_d; DROP VIEW {view}; DROP DOMAIN {domain}"
    ))
    .await
    .unwrap();
    let (state, message) = failure(r);
    assert_eq!(state, "55000", "{message}");
    assert!(message.contains(&format!("{parted}_a")), "{message}");
    drop(tool);
}

/// Fifth red-team pass (docs/security.md, row 86): statement logging that
/// writes bound parameters puts one-time tokens, link codes and card
/// sessions in the server log; check_deployment says so, and what to set.
#[tokio::test]
async fn test_check_deployment_warns_of_a_log_that_keeps_bound_parameters() {
    let su = connect("postgres").await;
    let warned = |rows: &[tokio_postgres::Row], setting: &str| {
        rows.iter().any(|r| {
            r.get::<_, String>(0) == "warning"
                && r.get::<_, String>(1) == format!("setting {setting}")
                && r.get::<_, String>(2)
                    .contains("log_parameter_max_length = 0")
        })
    };
    let check = "SELECT severity, object, problem FROM keyturn.check_deployment()";
    assert!(!warned(
        &su.query(check, &[]).await.unwrap(),
        "log_statement"
    ));
    su.batch_execute("SET log_statement = 'all'").await.unwrap();
    assert!(warned(
        &su.query(check, &[]).await.unwrap(),
        "log_statement"
    ));
    su.batch_execute("SET log_statement = 'none'; SET log_min_duration_statement = 0")
        .await
        .unwrap();
    assert!(warned(
        &su.query(check, &[]).await.unwrap(),
        "log_min_duration_statement"
    ));
    su.batch_execute("SET log_parameter_max_length = 0")
        .await
        .unwrap();
    let rows = su.query(check, &[]).await.unwrap();
    assert!(
        !warned(&rows, "log_min_duration_statement"),
        "parameters are not logged"
    );
    su.batch_execute("SET log_parameter_max_length_on_error = 64")
        .await
        .unwrap();
    let rows = su.query(check, &[]).await.unwrap();
    assert!(rows
        .iter()
        .any(|r| r.get::<_, String>(1) == "setting log_parameter_max_length_on_error"));
    su.batch_execute("RESET ALL").await.unwrap();
}

#[tokio::test]
async fn test_a_table_write_cannot_give_an_approval_only_status() {
    let w = World::new("member").await;
    let writer = role(&w.superuser, "kt_writer", "LOGIN BYPASSRLS").await;
    w.superuser
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA keyturn TO {writer}; GRANT SELECT, UPDATE ON keyturn.action TO {writer}"
        ))
        .await
        .unwrap();
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    let c = connect(&writer).await;
    // 0.1.0 took the audit's actor from these settings.
    c.batch_execute("SET keyturn.actor_role = 'app_human'; SET keyturn.actor_principal = 'alice'")
        .await
        .unwrap();
    for to in ["queued", "succeeded", "failed"] {
        let r = c
            .execute(
                "UPDATE keyturn.action SET status = $2::text::keyturn.status WHERE id = $1",
                &[&p.id, &to],
            )
            .await;
        assert_eq!(sqlstate(r), "42501", "pending -> {to} by a table write");
    }
    assert_eq!(w.status(p.id).await, "pending");
    // A change the graph allows is logged as what it is: this role, directly.
    c.execute(
        "UPDATE keyturn.action SET status = 'rejected' WHERE id = $1",
        &[&p.id],
    )
    .await
    .unwrap();
    let e = w
        .superuser
        .query_one(
            "SELECT db_role, principal, detail FROM keyturn.event WHERE action_id = $1 AND to_status = 'rejected'",
            &[&p.id],
        )
        .await
        .unwrap();
    assert_eq!(e.get::<_, String>(0), writer);
    assert_eq!(e.get::<_, Option<String>>(1), None);
    assert_eq!(e.get::<_, Value>(2)["direct_write"], true);
}

#[tokio::test]
async fn test_a_queued_row_no_approval_produced_is_never_dispatched() {
    let _g = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    // With the triggers off (a tampered dump restored in replica mode), both
    // the row and the work list say queued.
    tamper(
        &w.superuser,
        "UPDATE keyturn.action SET status = 'queued', next_attempt_at = now() WHERE id = $1",
        &[&p.id],
    )
    .await;
    tamper(
        &w.superuser,
        "UPDATE keyturn.open_action SET status = 'queued', next_attempt_at = now() WHERE action_id = $1",
        &[&p.id],
    )
    .await;
    let d = connect("app_dispatcher").await;
    let leased = d
        .query("SELECT action_id FROM keyturn.lease('w', 1000)", &[])
        .await
        .unwrap();
    assert!(
        leased.iter().all(|r| r.get::<_, uuid::Uuid>(0) != p.id),
        "never leased"
    );
    assert_eq!(w.status(p.id).await, "invalidated");
}

// --- Tenants stay apart ------------------------------------------------------

/// Membership and grants are authorized by the `keyturn_admin` role alone:
/// a principal whose membership role is `admin`, asserting its identity on
/// the human connection, manages nothing, in its own tenant or another
/// (until 0.3.0 it managed its own tenant).
#[tokio::test]
async fn test_membership_and_grants_are_the_admin_roles_alone() {
    let a = World::new("admin").await;
    let b = World::new("member").await;
    let t = a.webhook_tool(json!({})).await;
    let newcomer = unique("user");
    let calls = [
        "SELECT keyturn.add_member($1, $2, 'member')::text".to_owned(),
        format!("SELECT keyturn.grant_tool($1, $2, '{t}')::text"),
        format!("SELECT keyturn.revoke_tool($1, $2, '{t}')::text"),
        "SELECT keyturn.remove_member($1, $2)::text".to_owned(),
    ];
    for (w, tenant) in [(&a, &a.tenant), (&a, &b.tenant), (&b, &b.tenant)] {
        for sql in &calls {
            let r = w.human.query_one(sql, &[tenant, &newcomer]).await;
            assert_eq!(sqlstate(r), "42501", "{sql} in {tenant} as a person");
        }
    }
    // The platform's role manages every tenant.
    for sql in &calls {
        let changed: String = a
            .admin
            .query_one(sql, &[&a.tenant, &newcomer])
            .await
            .unwrap()
            .get(0);
        assert_eq!(changed, "true", "{sql} as keyturn_admin");
    }
}

#[tokio::test]
async fn test_an_identity_that_prints_as_another_is_missing() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    for sub in [
        format!("{}\u{0000}x", w.principal),
        format!("{}\u{200B}", w.principal),
        format!(" {}", w.principal),
        format!("{}\u{202E}", w.principal),
        // Conformance pass of 0.3.0: forms Unicode normalizes to another
        // name (a decomposed accent, a fullwidth letter) looked the same.
        format!("{}e\u{0301}", w.principal),
        format!("\u{FF41}{}", w.principal),
        // Twelfth red-team pass: a blank that draws as a space and is
        // neither whitespace nor invisible.
        format!("{}\u{2800}", w.principal),
    ] {
        let claims =
            json!({"tenant_id": w.tenant, "sub": sub, "session_id": w.session}).to_string();
        let c = Conn::connect("app_agent", Identity::claims(&claims)).await;
        let read: Option<String> = c
            .query_one("SELECT keyturn.current_principal()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            read, None,
            "{sub:?} is no principal at all, not one that prints as another"
        );
        assert_eq!(
            sqlstate(propose_on(&c, &t, json!({"channel": "c", "text": "t"}), json!({})).await),
            "42501",
            "{sub:?}"
        );
    }
}

/// Conformance pass of 0.3.0: add_member recorded principals that print
/// as another (a decomposed accent beside the composed one, a fullwidth
/// letter): such a member could act under a name that reads as someone
/// else's. Now 22023, and the normalized name is taken.
#[tokio::test]
async fn test_add_member_refuses_a_name_that_prints_as_another() {
    let w = World::new("member").await;
    for name in ["ane\u{0301}", "\u{FF41}nn", "ann\u{200B}", "ann\u{2800}"] {
        assert_eq!(
            sqlstate(
                w.admin
                    .query_one(
                        "SELECT keyturn.add_member($1, $2, 'member')",
                        &[&w.tenant, &name]
                    )
                    .await
            ),
            "22023",
            "{name:?}"
        );
    }
    let taken: bool = w
        .admin
        .query_one(
            "SELECT keyturn.add_member($1, 'an\u{00e9}', 'member')",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .get(0);
    assert!(taken, "the composed form is a name like any other");
}

// --- Nothing is lost, nothing runs twice, no one is blocked -------------------

#[tokio::test]
async fn test_a_lock_timeout_leaves_the_proposal_pending() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let deal = w.deals(&w.principal, 1).await[0];
    let p = w
        .propose(&t, json!({"where": {"id": deal}, "set": {"stage": "won"}}))
        .await
        .unwrap();
    let holder = connect("postgres").await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM crm.deal WHERE id = {deal} FOR UPDATE"
        ))
        .await
        .unwrap();
    let tx = w.human.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL lock_timeout = '200ms'")
        .await
        .unwrap();
    let r = approve_on(&tx, p.id, &p.token, None).await;
    assert_eq!(sqlstate(r), "55P03", "raised, not persisted");
    drop(tx);
    let tx = w.human.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL statement_timeout = '200ms'")
        .await
        .unwrap();
    assert_eq!(
        sqlstate(approve_on(&tx, p.id, &p.token, None).await),
        "57014"
    );
    drop(tx);
    assert_eq!(
        w.status(p.id).await,
        "pending",
        "the approval is not used up"
    );
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        w.approve(&p).await.unwrap().0,
        "succeeded",
        "and works once the lock is gone"
    );
}

#[tokio::test]
async fn test_an_advisory_lock_cannot_stall_a_tenants_proposals() {
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"rate_limit": {"max": 100, "per": "1 hour"}}))
        .await;
    // 0.1.0 serialized rate-limited proposals on this guessable advisory key.
    let staller = connect("app_agent").await;
    staller
        .query_one(
            "SELECT pg_advisory_lock(hashtextextended('keyturn.rate/' || $1 || '/' || $2 || '/' || $3, 0))",
            &[&w.tenant, &w.principal, &t],
        )
        .await
        .unwrap();
    let proposed = tokio::time::timeout(
        Duration::from_secs(10),
        w.propose(&t, json!({"channel": "c", "text": "t"})),
    )
    .await
    .expect("not stalled by a lock anyone can take");
    proposed.unwrap();
}

#[tokio::test]
async fn test_credentials_hidden_in_text_are_refused() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    for text in [
        "Authorization: Bearer abcdef1234567890xyz",
        "token:\tBearer\tabcdef1234567890xyz",
        "db is postgres://admin:hunter2secret@db.internal/app",
        "use password=correct-horse-battery-staple",
        "ghp_\u{200B}aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
    ] {
        assert_eq!(
            sqlstate(w.propose(&t, json!({"channel": "c", "text": text})).await),
            "22023",
            "{text:?}"
        );
    }
    let r = w
        .propose(
            &t,
            json!({"channel": "c", "text": "t", "ｐａｓｓｗｏｒｄ": "x"}),
        )
        .await;
    assert_eq!(sqlstate(r), "22023", "a fullwidth key");
}

#[tokio::test]
async fn test_a_version_column_nothing_maintains_is_refused() {
    let w = World::new("member").await;
    let t = table(
        &w.superuser,
        "id bigint PRIMARY KEY, state text NOT NULL, rev int NOT NULL DEFAULT 1",
    )
    .await;
    let spec = json!({"executor": "sql", "sql": {"table": t, "key": "id", "version": "rev",
                                                "set": ["state"], "where": ["id"]}});
    let r = w
        .admin
        .execute(
            "SELECT keyturn.register_tool($1, $2)",
            &[&unique("unversioned"), &spec],
        )
        .await;
    assert_eq!(sqlstate(r), "22023");
}
