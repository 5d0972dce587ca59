//! The work list (keyturn.open_action) follows the action rows it lists:
//! a statement that moves many rows, of several tenants, has its rows' moves
//! written at its end, one statement per tenant (extension/src/lifecycle.rs,
//! `_action_lifecycle_flush`); a statement an error ended moves nothing,
//! then or later.

use keyturn_tests::*;
use serde_json::json;
use uuid::Uuid;

type Listed = (Uuid, String, Option<String>, Option<String>, Option<String>);

/// Each action's (id, status, next attempt, lease expiry, dispatch time),
/// from the action row and from its work-list row.
async fn both(w: &World, ids: &[Uuid]) -> (Vec<Listed>, Vec<Listed>) {
    let read = |table: &str, id: &str| {
        format!(
            "SELECT {id}, status::text, next_attempt_at::text, lease_expires_at::text, dispatched_at::text \
               FROM keyturn.{table} WHERE {id} = ANY ($1) ORDER BY {id}"
        )
    };
    let rows = |rs: Vec<tokio_postgres::Row>| {
        rs.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect::<Vec<Listed>>()
    };
    let ids = ids.to_vec();
    (
        rows(
            w.superuser
                .query(&read("action", "id"), &[&ids])
                .await
                .unwrap(),
        ),
        rows(
            w.superuser
                .query(&read("open_action", "action_id"), &[&ids])
                .await
                .unwrap(),
        ),
    )
}

async fn proposals(w: &World, n: usize) -> Vec<Uuid> {
    let t = w.webhook_tool(json!({})).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let p = w
            .propose(&t, json!({"channel": "c", "text": format!("n{i}")}))
            .await
            .unwrap();
        ids.push(p.id);
    }
    ids
}

#[tokio::test]
async fn test_one_statement_moving_many_rows_of_two_tenants_leaves_each_listed_as_it_is() {
    // More rows of one tenant than one statement of the flush writes (64).
    let a = World::new("member").await;
    let b = World::new("member").await;
    let mut ids = proposals(&a, 70).await;
    ids.extend(proposals(&b, 3).await);
    // A direct write, as a DBA's: each row its own next attempt.
    a.superuser
        .execute(
            "UPDATE keyturn.action x SET next_attempt_at = timestamptz '2030-01-01 00:00:00+00' \
                                                          + (x.created_at - timestamptz '2026-01-01 00:00:00+00') \
              WHERE x.id = ANY ($1)",
            &[&ids],
        )
        .await
        .unwrap();
    let (rows, listed) = both(&a, &ids).await;
    assert_eq!(rows.len(), 73);
    assert!(rows.iter().all(|r| r.2.is_some()), "{rows:?}");
    assert_eq!(rows, listed, "the work list says what the rows say");
}

#[tokio::test]
async fn test_a_statement_an_error_ended_moves_no_work_list_row_later() {
    let w = World::new("member").await;
    let ids = proposals(&w, 2).await;
    let (before, _) = both(&w, &ids).await;
    // One transaction: a trigger of the test's (rolled back at the end)
    // fails the statement at its second row, after keyturn's row trigger
    // ran for the first; a later statement moving another row must not
    // carry the first statement's moves along.
    let other = proposals(&w, 1).await;
    let tx = format!(
        "BEGIN;
         CREATE FUNCTION public.kt_test_fail_second() RETURNS trigger LANGUAGE plpgsql AS
           $f$BEGIN IF NEW.id = '{second}' THEN RAISE EXCEPTION 'the second row fails'; END IF; RETURN NULL; END$f$;
         CREATE TRIGGER zz_kt_test_fail AFTER UPDATE ON keyturn.action
           FOR EACH ROW EXECUTE FUNCTION public.kt_test_fail_second();
         SAVEPOINT s;",
        second = ids[1]
    );
    w.superuser.batch_execute(&tx).await.unwrap();
    let failed = w
        .superuser
        .execute(
            "UPDATE keyturn.action SET next_attempt_at = timestamptz '2031-01-01 00:00:00+00' WHERE id = ANY ($1)",
            &[&ids],
        )
        .await;
    assert!(failed.is_err(), "the test's trigger failed the statement");
    w.superuser
        .batch_execute("ROLLBACK TO SAVEPOINT s")
        .await
        .unwrap();
    w.superuser
        .execute(
            "UPDATE keyturn.action SET next_attempt_at = timestamptz '2032-01-01 00:00:00+00' WHERE id = ANY ($1)",
            &[&other],
        )
        .await
        .unwrap();
    let listed: Vec<Option<String>> = w
        .superuser
        .query(
            "SELECT next_attempt_at::text FROM keyturn.open_action WHERE action_id = ANY ($1) ORDER BY action_id",
            &[&ids],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let other_listed: Option<String> = w
        .superuser
        .query_one(
            "SELECT next_attempt_at::text FROM keyturn.open_action WHERE action_id = $1",
            &[&other[0]],
        )
        .await
        .unwrap()
        .get(0);
    w.superuser.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        listed,
        before.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
        "the failed statement's moves are gone"
    );
    assert!(
        other_listed.is_some_and(|t| t.starts_with("2032-01-01")),
        "the later statement's own move is written"
    );
}

/// Where no statement trigger will write the moves (a database still at
/// 0.2.0 running this library, or the trigger disabled), each row's move is
/// written at once, as before.
#[tokio::test]
async fn test_without_the_statement_trigger_each_move_is_written_at_once() {
    let w = World::new("member").await;
    let ids = proposals(&w, 2).await;
    w.superuser
        .batch_execute("BEGIN; ALTER TABLE keyturn.action DISABLE TRIGGER action_lifecycle_moves")
        .await
        .unwrap();
    w.superuser
        .execute(
            "UPDATE keyturn.action SET next_attempt_at = timestamptz '2033-01-01 00:00:00+00' WHERE id = ANY ($1)",
            &[&ids],
        )
        .await
        .unwrap();
    let (rows, listed) = both(&w, &ids).await;
    w.superuser.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        rows.iter()
            .all(|r| r.2.as_deref() == Some("2033-01-01 00:00:00+00")),
        "{rows:?}"
    );
    assert_eq!(rows, listed);
}
