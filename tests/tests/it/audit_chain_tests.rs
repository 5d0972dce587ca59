//! docs/audit.md: each tenant's events form a hash chain. Any change,
//! deletion, reordering or insertion of an event, by any role and with
//! triggers off, makes keyturn.verify_audit false at the first event that no
//! longer verifies; an independent recomputation (RFC 8785 + SHA-256, here
//! in the test) agrees with the database's hashes.

use keyturn_tests::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// (ok, events, first_bad) of a tenant's chain, as the operator reads it.
async fn verify(tenant: &str) -> (bool, i64, Option<i64>) {
    let op = connect("app_operator").await;
    let r = op
        .query_one(
            "SELECT ok, events, first_bad FROM keyturn.verify_audit($1)",
            &[&tenant],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

async fn export(tenant: &str) -> Vec<Value> {
    let op = connect("app_operator").await;
    op.query("SELECT e FROM keyturn.audit_export($1) e", &[&tenant])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A tenant with a few events: proposals approved, rejected, revised.
async fn busy() -> World {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    for i in 0..3 {
        let p = w
            .propose(&t, json!({"channel": "c", "text": format!("n{i}")}))
            .await
            .unwrap();
        if i == 1 {
            w.human
                .query_one("SELECT keyturn.reject($1, $2, 'no')", &[&p.id, &p.token])
                .await
                .unwrap();
        } else {
            w.approve(&p).await.unwrap();
        }
    }
    w
}

/// The hash of one exported event, computed here from the RFC 8785 form.
fn hash_of(event: &Value) -> String {
    let mut e = event.clone();
    e.as_object_mut().unwrap().remove("hash");
    let canonical = keyturn_core::canonical::canonicalize_value(&e).unwrap();
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

#[tokio::test]
async fn test_a_tenants_events_form_a_chain_an_outsider_can_recompute() {
    let w = busy().await;
    let (ok, n, bad) = verify(&w.tenant).await;
    assert!(ok && bad.is_none(), "{ok} {n} {bad:?}");
    let events = export(&w.tenant).await;
    assert_eq!(events.len() as i64, n);
    assert_eq!(n, 6, "three proposals, two approvals, a rejection");
    let mut prev = "0".repeat(64);
    for e in &events {
        assert_eq!(e["prev_hash"], json!(prev), "{e}");
        assert_eq!(e["hash"], json!(hash_of(e)), "{e}");
        // Times as to_jsonb prints them in UTC.
        assert!(e["at"].as_str().unwrap().ends_with("+00:00"), "{e}");
        prev = e["hash"].as_str().unwrap().to_owned();
    }
    let op = connect("app_operator").await;
    let head = op
        .query_one(
            "SELECT events, hash FROM keyturn.audit_head($1)",
            &[&w.tenant],
        )
        .await
        .unwrap();
    assert_eq!((head.get::<_, i64>(0), head.get::<_, String>(1)), (n, prev));
    // A tenant with no events: an empty chain, which verifies.
    assert_eq!(verify("no-such-tenant").await, (true, 0, None));
}

#[tokio::test]
async fn test_the_writers_time_zone_changes_no_hash() {
    // Events hashed at commit print their time in UTC whatever the
    // writers' sessions say (keyturn never sets the session's TimeZone).
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    w.agent
        .batch_execute("SET TimeZone = 'America/St_Johns'")
        .await
        .unwrap();
    w.human
        .batch_execute("SET TimeZone = 'Asia/Kathmandu'")
        .await
        .unwrap();
    let p = w
        .propose(&t, json!({"channel": "c", "text": "tz"}))
        .await
        .unwrap();
    w.approve(&p).await.unwrap();
    let zone: String = w
        .human
        .query_one("SELECT current_setting('TimeZone')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        zone, "Asia/Kathmandu",
        "the session's own setting is left be"
    );
    let (ok, n, bad) = verify(&w.tenant).await;
    assert!(ok && bad.is_none() && n == 2, "{ok} {n} {bad:?}");
    for e in &export(&w.tenant).await {
        assert_eq!(e["hash"], json!(hash_of(e)), "{e}");
        assert!(e["at"].as_str().unwrap().ends_with("+00:00"), "{e}");
    }
}

async fn event_ids(w: &World) -> Vec<i64> {
    w.superuser
        .query(
            "SELECT id FROM keyturn.event WHERE tenant = $1 ORDER BY id",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn test_a_changed_event_is_found() {
    let (w, other) = (busy().await, busy().await);
    let ids = event_ids(&w).await;
    tamper(
        &w.superuser,
        "UPDATE keyturn.event SET detail = detail || '{\"reason\": \"forged\"}' WHERE id = $1",
        &[&ids[3]],
    )
    .await;
    assert_eq!(verify(&w.tenant).await, (false, 3, Some(ids[3])));
    assert!(
        verify(&other.tenant).await.0,
        "another tenant's chain still verifies"
    );
}

#[tokio::test]
async fn test_each_column_of_an_event_is_covered() {
    for (column, value) in [
        ("db_role", "'app_admin'"),
        ("principal", "'mallory'"),
        ("to_status", "'rejected'"),
        ("at", "at + interval '1 second'"),
        ("action_principal", "'mallory'"),
    ] {
        let w = busy().await;
        let ids = event_ids(&w).await;
        tamper(
            &w.superuser,
            &format!("UPDATE keyturn.event SET {column} = {value} WHERE id = $1"),
            &[&ids[1]],
        )
        .await;
        assert_eq!(verify(&w.tenant).await.2, Some(ids[1]), "{column}");
    }
}

#[tokio::test]
async fn test_a_deleted_event_is_found_at_the_event_after_the_gap() {
    let w = busy().await;
    let ids = event_ids(&w).await;
    tamper(
        &w.superuser,
        "DELETE FROM keyturn.event WHERE id = $1",
        &[&ids[2]],
    )
    .await;
    assert_eq!(verify(&w.tenant).await, (false, 2, Some(ids[3])));
    // A deleted tail has no event after it: the head says the chain is short.
    let w = busy().await;
    let ids = event_ids(&w).await;
    tamper(
        &w.superuser,
        "DELETE FROM keyturn.event WHERE id = $1",
        &[ids.last().unwrap()],
    )
    .await;
    let (ok, n, bad) = verify(&w.tenant).await;
    assert_eq!((ok, n as usize, bad), (false, ids.len() - 1, None));
}

#[tokio::test]
async fn test_an_inserted_event_is_found() {
    // In the middle: it breaks the link of the event after it.
    let w = busy().await;
    let ids = event_ids(&w).await;
    let forged: i64 = w
        .superuser
        .query_one("SELECT nextval('keyturn.event_id_seq')", &[])
        .await
        .unwrap()
        .get(0);
    tamper(
        &w.superuser,
        "INSERT INTO keyturn.event (id, action_id, tenant, action_principal, at, db_role, principal, \
                                    from_status, to_status, detail, prev_hash, hash) OVERRIDING SYSTEM VALUE \
         SELECT $1, action_id, tenant, action_principal, at, db_role, principal, 'pending', 'succeeded', '{}', \
                hash, repeat('f', 64) \
           FROM keyturn.event WHERE id = $2",
        &[&forged, ids.last().unwrap()],
    )
    .await;
    assert_eq!(verify(&w.tenant).await.2, Some(forged));
    // At the end, linked and hashed as keyturn would: the head does not name it.
    let w = busy().await;
    let ids = event_ids(&w).await;
    let forged: i64 = w
        .superuser
        .query_one("SELECT nextval('keyturn.event_id_seq')", &[])
        .await
        .unwrap()
        .get(0);
    tamper(
        &w.superuser,
        "INSERT INTO keyturn.event (id, action_id, tenant, action_principal, at, db_role, principal, \
                                    from_status, to_status, detail, prev_hash, hash) OVERRIDING SYSTEM VALUE \
         SELECT $1, action_id, tenant, action_principal, at, db_role, principal, 'pending', 'succeeded', '{}', \
                hash, keyturn._event_hash(jsonb_build_object('id', $1::bigint, 'action_id', action_id, \
                    'tenant', tenant, 'action_principal', action_principal, 'at', at, 'db_role', db_role, \
                    'principal', principal, 'from_status', 'pending', 'to_status', 'succeeded', \
                    'detail', '{}'::jsonb, 'prev_hash', hash)) \
           FROM keyturn.event WHERE id = $2",
        &[&forged, ids.last().unwrap()],
    )
    .await;
    assert_eq!(
        verify(&w.tenant).await,
        (false, ids.len() as i64, Some(forged))
    );
}

#[tokio::test]
async fn test_two_swapped_events_are_found() {
    let w = busy().await;
    let ids = event_ids(&w).await;
    // Swap the contents of two events, their ids and links left in place.
    tamper(
        &w.superuser,
        "UPDATE keyturn.event e SET from_status = o.from_status, to_status = o.to_status, detail = o.detail, \
                                    at = o.at, action_id = o.action_id \
           FROM keyturn.event o \
          WHERE (e.id, o.id) IN (($1, $2), ($2, $1))",
        &[&ids[1], &ids[4]],
    )
    .await;
    assert_eq!(verify(&w.tenant).await.2, Some(ids[1]));
}

/// 16 clients proposing at once in one tenant: one unbroken chain, every
/// event in it once.
#[tokio::test]
async fn test_concurrent_writers_of_one_tenant_make_one_chain() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let mut agents = Vec::new();
    for i in 0..16 {
        agents.push(
            Conn::connect(
                "app_agent",
                Identity::gucs(&w.tenant, &w.principal, &format!("s{i}")),
            )
            .await,
        );
    }
    let runs = agents.iter().enumerate().map(|(i, a)| {
        let t = t.clone();
        async move {
            for j in 0..5 {
                propose_on(
                    a,
                    &t,
                    json!({"channel": "c", "text": format!("{i}-{j}")}),
                    json!({}),
                )
                .await
                .unwrap();
            }
        }
    });
    futures_util::future::join_all(runs).await;
    assert_eq!(verify(&w.tenant).await, (true, 80, None));
}

/// One commit with many events of two tenants, more than one statement's
/// worth each (a batch call of the dispatcher commits one event per action,
/// and the commit writes a tenant's events in statements of several rows):
/// each tenant's chain unbroken, in the order the events happened, every
/// hash the one an outsider recomputes, whatever form the detail's numbers
/// and strings were given in.
#[tokio::test]
async fn test_one_commit_of_many_events_chains_each_tenant_in_order() {
    async fn an_action(w: &World) -> uuid::Uuid {
        w.superuser
            .query_one(
                "SELECT action_id FROM keyturn.event WHERE tenant = $1 LIMIT 1",
                &[&w.tenant],
            )
            .await
            .unwrap()
            .get(0)
    }
    let a = busy().await;
    let b = busy().await;
    let (id_a, id_b) = (an_action(&a).await, an_action(&b).await);
    // 40 events of a and 17 of b, interleaved, in one transaction.
    a.superuser
        .batch_execute(&format!(
            "BEGIN;
             SELECT keyturn._append_event(
                        CASE WHEN g % 3 = 0 AND g <= 51 THEN '{id_b}'::uuid ELSE '{id_a}'::uuid END,
                        CASE WHEN g % 3 = 0 AND g <= 51 THEN '{tb}' ELSE '{ta}' END,
                        'p', 'r', NULL, NULL, 'pending',
                        ('{{\"n\": ' || g || ', \"x\": 1.50, \"e\": 1E2, \"z\": -0, \"big\": 123456789012, '
                         || '\"s\": \"\\u00fc\\u2028<\\/>\", \"deep\": {{\"b\": [1, 2.0], \"a\": null}}}}')::jsonb)
               FROM generate_series(1, 57) g;
             COMMIT;",
            ta = a.tenant,
            tb = b.tenant,
        ))
        .await
        .unwrap();
    for (w, added) in [(&a, 40), (&b, 17)] {
        let (ok, n, bad) = verify(&w.tenant).await;
        assert!(ok && bad.is_none() && n == 6 + added, "{ok} {n} {bad:?}");
        let events = export(&w.tenant).await;
        let mut prev = "0".repeat(64);
        let mut last_id = 0;
        let mut order = Vec::new();
        for e in &events {
            assert_eq!(e["prev_hash"], json!(prev), "{e}");
            assert_eq!(e["hash"], json!(hash_of(e)), "{e}");
            assert!(e["id"].as_i64().unwrap() > last_id, "{e}");
            last_id = e["id"].as_i64().unwrap();
            prev = e["hash"].as_str().unwrap().to_owned();
            if let Some(n) = e["detail"]["n"].as_i64() {
                order.push(n);
                assert_eq!(e["detail"]["s"], json!("\u{fc}\u{2028}</>"), "{e}");
                assert_eq!(e["detail"]["e"].to_string(), "100", "{e}");
            }
        }
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "the events in the order they happened");
        assert_eq!(order.len(), added as usize);
    }
}

/// A REPEATABLE READ transaction whose snapshot predates other commits of
/// its tenant chains to them at its commit, instead of failing.
#[tokio::test]
async fn test_a_repeatable_read_writer_chains_to_what_committed_after_its_snapshot() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let tx = w
        .agent
        .transaction_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    tx.query_one("SELECT 1", &[]).await.unwrap();
    let other = Conn::connect("app_agent", w.identity()).await;
    propose_on(
        &other,
        &t,
        json!({"channel": "c", "text": "first"}),
        json!({}),
    )
    .await
    .unwrap();
    tx.query_one(
        "SELECT action_id FROM keyturn.propose($1, $2)",
        &[&t, &json!({"channel": "c", "text": "second"})],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(verify(&w.tenant).await, (true, 2, None));
}

#[tokio::test]
async fn test_only_operators_and_admins_read_the_chain() {
    let w = busy().await;
    for role in ["app_agent", "app_human", "app_dispatcher"] {
        let c = connect(role).await;
        for sql in [
            "SELECT * FROM keyturn.verify_audit($1)",
            "SELECT * FROM keyturn.audit_export($1)",
            "SELECT * FROM keyturn.audit_head($1)",
        ] {
            assert_eq!(
                sqlstate(c.query(sql, &[&w.tenant]).await),
                "42501",
                "{role}: {sql}"
            );
        }
    }
    let admin = connect("app_admin").await;
    admin
        .query_one("SELECT ok FROM keyturn.verify_audit($1)", &[&w.tenant])
        .await
        .unwrap();
}

/// Events made in a subtransaction that was released belong to its parent:
/// a later sibling savepoint rolled back at the same depth must not take
/// them along (plpgsql's exception blocks make such savepoints inside
/// keyturn's own calls). The same for the decisions noted for the commit's
/// recheck.
#[tokio::test]
async fn test_events_of_a_released_savepoint_survive_a_sibling_rollback() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let tx = w.agent.transaction().await.unwrap();
    tx.batch_execute("SAVEPOINT a").await.unwrap();
    let id: uuid::Uuid = tx
        .query_one(
            "SELECT action_id FROM keyturn.propose($1, $2)",
            &[&t, &json!({"channel": "c", "text": "kept"})],
        )
        .await
        .unwrap()
        .get(0);
    tx.batch_execute("RELEASE a; SAVEPOINT b; ROLLBACK TO b")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(w.event_rows(id).await, 1, "the creation event");
    let (ok, _, _) = verify(&w.tenant).await;
    assert!(ok);
}

/// Red-team finding 9: `since` chose events by when they were made, while
/// the chain runs in commit order, so an export since a time could skip an
/// event of a transaction that was open across it. An export since a time
/// is the chain's contiguous tail from the first event made at or after it.
#[tokio::test]
async fn test_an_export_since_a_time_is_a_contiguous_tail_of_the_chain() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let slow = w.agent.transaction().await.unwrap();
    slow.query_one(
        "SELECT action_id FROM keyturn.propose($1, $2)",
        &[
            &t,
            &json!({"channel": "c", "text": "made first, committed last"}),
        ],
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (other, other_agent) = w.other("member", "app_agent", "s-tail").await;
    w.grant(&other, &t).await;
    propose_on(
        &other_agent,
        &t,
        json!({"channel": "c", "text": "made second"}),
        json!({}),
    )
    .await
    .unwrap();
    slow.commit().await.unwrap();
    let since: String = w
        .superuser
        .query_one(
            "SELECT max(at)::text FROM keyturn.event WHERE tenant = $1",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .get(0);
    let op = connect("app_operator").await;
    let lines: Vec<Value> = op
        .query(
            "SELECT e FROM keyturn.audit_export($1, $2::text::timestamptz) e",
            &[&w.tenant, &since],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let all = export(&w.tenant).await;
    let tail = &all[all.len() - lines.len()..];
    assert_eq!(lines, tail, "a tail of the chain, in its order");
    assert!(
        lines.len() >= 2,
        "the late-committed event is in it: {lines:?}"
    );
}

/// Red-team finding (2026-12-05): keyturn's commit wrote the chain as the
/// extension owner under the caller's search_path, so a temporary type
/// named like one of its statements' types (any role may create one) or an
/// operator in a schema the caller puts first replaced it: the caller's code
/// ran as the owner, and an event was stored other than hashed. Whatever the
/// caller's session holds, the commit's statements mean what keyturn wrote.
#[tokio::test]
async fn test_a_callers_types_and_operators_never_reach_the_commit() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    // An operator schema the caller may use (a role with CREATE somewhere).
    let ops = unique("kt_ops");
    w.superuser
        .batch_execute(&format!(
            "CREATE SCHEMA {ops};
             CREATE FUNCTION {ops}.cat(a pg_catalog.text, b pg_catalog.text) RETURNS pg_catalog.text
               LANGUAGE plpgsql AS $f$BEGIN RAISE EXCEPTION 'operator ran as %', current_user; END$f$;
             CREATE OPERATOR {ops}.|| (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text, FUNCTION = {ops}.cat);
             GRANT USAGE ON SCHEMA {ops} TO PUBLIC;"
        ))
        .await
        .unwrap();
    let attacks = [
        // A temporary type whose check runs the caller's function.
        "CREATE FUNCTION pg_temp.kt_hijack(v pg_catalog.uuid) RETURNS boolean LANGUAGE plpgsql AS \
           $f$BEGIN RAISE EXCEPTION 'type check ran as %', current_user; END$f$; \
         CREATE DOMAIN pg_temp.uuid AS pg_catalog.uuid CHECK (pg_temp.kt_hijack(VALUE))"
            .to_owned(),
        // A temporary type that stores the time in the session's zone.
        "CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamp; SET TimeZone = 'America/New_York'"
            .to_owned(),
        format!("SET search_path = {ops}, pg_catalog"),
    ];
    for attack in attacks {
        // A fresh connection each time: the commit's plans are made once
        // per backend, at its first commit with events.
        let agent = connect("app_agent").await;
        agent.batch_execute(&attack).await.unwrap();
        let committed = agent
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_catalog.set_config('keyturn.tenant', '{}', true),
                        pg_catalog.set_config('keyturn.principal', '{}', true),
                        pg_catalog.set_config('keyturn.session', '{}', true);
                 SELECT action_id::pg_catalog.text FROM keyturn.propose('{t}',
                        '{{\"channel\": \"c\", \"text\": \"x\"}}'::pg_catalog.jsonb);
                 COMMIT;",
                w.tenant, w.principal, w.session
            ))
            .await;
        assert!(committed.is_ok(), "{attack}: {committed:?}");
    }
    let (ok, n, bad) = verify(&w.tenant).await;
    w.superuser
        .batch_execute(&format!("DROP SCHEMA {ops} CASCADE"))
        .await
        .unwrap();
    assert!(ok && bad.is_none() && n == 3, "{ok} {n} {bad:?}");
}

/// Red-team finding (2026-12-05): an event whose canonical form fits the
/// bound the commit checks, but whose stored row prints longer (the hash,
/// and the spaces jsonb puts between members), committed, and from then on
/// verify_audit raised for the tenant. What the commit admits, the check
/// reads. (The bound is checked when the event is made, with the longest id
/// an event can have: a reason a few hundred bytes under 1 MiB.)
#[tokio::test]
async fn test_an_event_as_large_as_the_commit_admits_still_verifies() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "big"}))
        .await
        .unwrap();
    w.human
        .query_one(
            "SELECT keyturn.reject($1, $2, pg_catalog.repeat('x', 1048000))",
            &[&p.id, &p.token],
        )
        .await
        .unwrap();
    assert_eq!(verify(&w.tenant).await, (true, 2, None));
    let events = export(&w.tenant).await;
    assert_eq!(events[1]["hash"], json!(hash_of(&events[1])));
}

/// A DBA's AFTER trigger on keyturn.event (to ship the audit elsewhere, say)
/// fires for the events written at commit, as for any insert. It failed every
/// such commit with XX000 "AfterTriggerSaveEvent() called outside of query":
/// the chain's write ran with triggers' queueing off.
#[tokio::test]
async fn test_an_after_trigger_on_the_events_fires_at_commit() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let name = format!("kt_test_ship_{}", unique("s").replace('-', "_"));
    w.superuser
        .batch_execute(&format!(
            "CREATE TABLE public.{name} (id bigint, to_status text); \
             CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $f$ \
             BEGIN INSERT INTO public.{name} VALUES (NEW.id, NEW.to_status); RETURN NULL; END $f$; \
             CREATE TRIGGER {name} AFTER INSERT ON keyturn.event FOR EACH ROW \
             WHEN (NEW.tenant = '{tenant}') EXECUTE FUNCTION public.{name}();",
            tenant = w.tenant
        ))
        .await
        .unwrap();
    let proposed = w
        .propose(&t, json!({"channel": "ops", "text": "shipped"}))
        .await;
    let shipped = w
        .superuser
        .query(&format!("SELECT to_status FROM public.{name}"), &[])
        .await;
    w.superuser
        .batch_execute(&format!(
            "DROP TRIGGER {name} ON keyturn.event; DROP FUNCTION public.{name}(); DROP TABLE public.{name};"
        ))
        .await
        .unwrap();
    proposed.expect("the proposal commits");
    let shipped: Vec<String> = shipped.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(shipped, vec!["pending".to_string()]);
    let ids = event_ids(&w).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
}

/// A commit that wrote events lets its tenant's chain go at its commit
/// record (docs/audit.md, "When a commit is durable"), yet its COMMIT returns
/// only once its WAL is flushed, as `synchronous_commit = on` asks. The
/// insert position read inside the transaction is before its commit record,
/// so the flush must be past it when COMMIT has returned. (The test cluster
/// runs with `synchronous_commit = off`; the transaction asks for `on`.)
#[tokio::test]
async fn test_a_commit_that_wrote_events_returns_only_once_flushed() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    for i in 0..20 {
        let tx = w.agent.transaction().await.unwrap();
        tx.batch_execute("SET LOCAL synchronous_commit = on")
            .await
            .unwrap();
        propose_on(
            &tx,
            &t,
            json!({"channel": "c", "text": format!("d{i}")}),
            json!({}),
        )
        .await
        .unwrap();
        let written: String = tx
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .unwrap()
            .get(0);
        tx.commit().await.unwrap();
        let flushed: bool = w
            .superuser
            .query_one(
                "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn",
                &[&written],
            )
            .await
            .unwrap()
            .get(0);
        assert!(flushed, "commit {i} returned before its WAL was flushed");
    }
    assert_eq!(verify(&w.tenant).await, (true, 20, None));
}

/// The commit runs as an asynchronous one only inside PostgreSQL's commit:
/// the session's own `synchronous_commit`, set for the whole session, is as
/// it was after a commit that wrote events, and the next such commit waits
/// for its flush again.
#[tokio::test]
async fn test_the_sessions_synchronous_commit_is_its_own_after_the_commit() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let agent = Conn::connect("app_agent", Identity::gucs(&w.tenant, &w.principal, "s1")).await;
    agent
        .batch_execute("SET synchronous_commit = remote_apply")
        .await
        .unwrap();
    for i in 0..3 {
        propose_on(
            &agent,
            &t,
            json!({"channel": "c", "text": format!("r{i}")}),
            json!({}),
        )
        .await
        .unwrap();
        let now: String = agent
            .query_one("SHOW synchronous_commit", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(now, "remote_apply", "after commit {i}");
    }
    assert_eq!(verify(&w.tenant).await, (true, 3, None));
}

#[tokio::test]
async fn test_a_sequence_behind_the_chain_is_moved_past_it() {
    // A restore, or a tenant's shard moved back from Citus, can leave the id
    // sequence below a tenant's last event: the commit moves it past the
    // chain, so the tenant's ids still follow its chain.
    let w = busy().await;
    let ids = event_ids(&w).await;
    let (first, last) = (ids[0], *ids.last().unwrap());
    w.superuser
        .execute("SELECT setval('keyturn.event_id_seq', $1)", &[&first])
        .await
        .unwrap();
    let t = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "after"}))
        .await
        .unwrap();
    w.approve(&p).await.unwrap();
    let after = event_ids(&w).await;
    assert!(after.len() > ids.len());
    assert!(
        after[ids.len()..].iter().all(|&id| id > last),
        "ids {after:?} do not follow the chain's last id {last}"
    );
    assert_eq!(verify(&w.tenant).await, (true, after.len() as i64, None));
}

/// The events commit to what was approved and how it ended, not only to the
/// status changes: an action's params and hash, who approved it, its result
/// and its receipt, rewritten with triggers off under a chain that still
/// verifies, make verify_audit false at the event that committed to them
/// (twenty-fifth red-team pass; docs/security.md, row 135). Before, each
/// rewrite verified.
#[tokio::test]
async fn test_rewriting_what_was_approved_or_how_it_ended_is_found() {
    let w = World::new("member").await;
    let deal = w.deals(&w.principal, 1).await[0];
    let sql_tool = w.deal_tool(json!({})).await;
    let written = w
        .propose(
            &sql_tool,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    assert_eq!(w.approve(&written).await.unwrap().0, "succeeded");
    let hook = w.webhook_tool(json!({})).await;
    let sent = w
        .propose(&hook, json!({"channel": "c", "text": "t"}))
        .await
        .unwrap();
    assert_eq!(w.approve(&sent).await.unwrap().0, "queued");
    let d = connect("app_dispatcher").await;
    let l = lease_mine(&d, &[sent.id], "30 seconds").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    let status = complete(&d, &l, "succeeded", json!({"message_id": "m-1"}), None)
        .await
        .unwrap();
    assert_eq!(status, "succeeded");
    assert!(verify(&w.tenant).await.0, "the honest chain verifies");
    // Keyed: whoever reads the chain cannot test a guess of the params
    // against it, as a plain hash would let them.
    let exported = serde_json::to_string(&export(&w.tenant).await).unwrap();
    assert!(
        !exported.contains(&written.params_hash) && !exported.contains(&sent.params_hash),
        "the chain holds no plain params hash"
    );

    // The event that committed to the rewritten column, for each rewrite.
    let committed = |id: uuid::Uuid, key: &'static str| {
        let su = &w.superuser;
        async move {
            let r = su
                .query_one(
                    "SELECT min(id) FROM keyturn.event WHERE action_id = $1 AND detail ? $2",
                    &[&id, &key],
                )
                .await
                .unwrap();
            r.get::<_, Option<i64>>(0).expect("an event commits to it")
        }
    };
    let lost = json!({"where": {"id": deal}, "set": {"stage": "lost"}});
    let rewrites: [(&str, uuid::Uuid, &str, &str); 5] = [
        (
            "the params and their hash",
            written.id,
            "params_mac",
            "UPDATE keyturn.action SET params = $2, params_hash = keyturn.params_hash(tool, $2) WHERE id = $1",
        ),
        (
            "the params alone",
            written.id,
            "params_mac",
            "UPDATE keyturn.action SET params = $2 WHERE id = $1 AND $2::jsonb IS NOT NULL",
        ),
        (
            "who approved",
            written.id,
            "approval_mac",
            "UPDATE keyturn.action SET approved_by = 'mallory' WHERE id = $1 AND $2::jsonb IS NOT NULL",
        ),
        (
            "the result",
            written.id,
            "result_mac",
            "UPDATE keyturn.action SET result = '{\"rows\": 0}' WHERE id = $1 AND $2::jsonb IS NOT NULL",
        ),
        (
            "the receipt",
            sent.id,
            "receipt_mac",
            "UPDATE keyturn.action SET receipt = '{\"message_id\": \"m-2\"}' WHERE id = $1 AND $2::jsonb IS NOT NULL",
        ),
    ];
    for (what, id, key, sql) in rewrites {
        let before: (Value, String, Option<String>, Option<Value>, Option<Value>) = {
            let r = w
                .superuser
                .query_one(
                    "SELECT params, params_hash, approved_by, result, receipt FROM keyturn.action WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
        };
        assert_eq!(tamper(&w.superuser, sql, &[&id, &lost]).await, 1, "{what}");
        let at = committed(id, key).await;
        assert_eq!(
            verify(&w.tenant).await,
            (false, event_ids(&w).await.len() as i64, Some(at)),
            "{what} rewritten is found at the event that committed to it"
        );
        tamper(
            &w.superuser,
            "UPDATE keyturn.action SET params = $2, params_hash = $3, approved_by = $4, result = $5, receipt = $6 \
              WHERE id = $1",
            &[&id, &before.0, &before.1, &before.2, &before.3, &before.4],
        )
        .await;
        assert!(verify(&w.tenant).await.0, "{what} put back verifies");
    }
}

/// How an action ended is committed to even where the row holds nothing: a
/// rejected action rewritten as approved, sent and succeeded (status,
/// approver, receipt), or a receipt given to an sql tool's action, verified
/// before, since only facts present when the event was written were
/// committed to (twenty-sixth red-team pass; docs/security.md, row 135).
#[tokio::test]
async fn test_an_action_rewritten_to_another_ending_is_found() {
    let w = World::new("member").await;
    let hook = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&hook, json!({"channel": "c", "text": "no"}))
        .await
        .unwrap();
    w.human
        .query_one("SELECT keyturn.reject($1, $2, 'no')", &[&p.id, &p.token])
        .await
        .unwrap();
    let deal = w.deals(&w.principal, 1).await[0];
    let sql_tool = w.deal_tool(json!({})).await;
    let q = w
        .propose(
            &sql_tool,
            json!({"where": {"id": deal}, "set": {"stage": "won"}}),
        )
        .await
        .unwrap();
    assert_eq!(w.approve(&q).await.unwrap().0, "succeeded");
    assert!(verify(&w.tenant).await.0, "the honest chain verifies");
    let ended = |id: uuid::Uuid| {
        let su = &w.superuser;
        async move {
            su.query_one(
                "SELECT max(id) FROM keyturn.event WHERE action_id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get::<_, Option<i64>>(0)
            .unwrap()
        }
    };
    let events = event_ids(&w).await.len() as i64;
    let rewrites: [(&str, uuid::Uuid, &str, &str); 3] = [
        (
            "rejected rewritten as approved and sent",
            p.id,
            "UPDATE keyturn.action SET status = 'succeeded', approved_by = 'mallory', approved_role = 'app_human', \
                    approved_at = now(), approved_via = 'approve', receipt = '{\"status\": 200}' WHERE id = $1",
            "UPDATE keyturn.action SET status = 'rejected', approved_by = NULL, approved_role = NULL, \
                    approved_at = NULL, approved_via = NULL, receipt = NULL WHERE id = $1",
        ),
        (
            "the status alone",
            p.id,
            "UPDATE keyturn.action SET status = 'expired' WHERE id = $1",
            "UPDATE keyturn.action SET status = 'rejected' WHERE id = $1",
        ),
        (
            "a receipt where there was none",
            q.id,
            "UPDATE keyturn.action SET receipt = '{\"status\": 200}' WHERE id = $1",
            "UPDATE keyturn.action SET receipt = NULL WHERE id = $1",
        ),
    ];
    for (what, id, rewrite, back) in rewrites {
        assert_eq!(tamper(&w.superuser, rewrite, &[&id]).await, 1, "{what}");
        assert_eq!(
            verify(&w.tenant).await,
            (false, events, Some(ended(id).await)),
            "{what} is found at the event that ended the action"
        );
        tamper(&w.superuser, back, &[&id]).await;
        assert!(verify(&w.tenant).await.0, "{what} put back verifies");
    }
}
