//! What tests check behind keyturn's back as the superuser: the work list
//! in step with the actions, and tampering with a table as an attacker who
//! can write it would.

use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

/// keyturn.open_action (the work list lease, sweep, end_session and
/// cancel_origin search) holds exactly the actions that are not final, with
/// their current status and times; an executing action is listed as leased
/// (begin does not move the row) and the dispatch time is the action's once
/// it is uncertain. One snapshot sees both tables as one transaction left
/// them, so this holds at any moment, concurrent tests or not.
pub async fn assert_work_list_in_step(superuser: &Client) {
    let rows = superuser
        .query(
            "SELECT coalesce(a.id, o.action_id)::text, a.status::text, o.status::text \
               FROM (SELECT * FROM keyturn.action WHERE NOT keyturn._is_final(status)) a \
               FULL JOIN keyturn.open_action o ON o.action_id = a.id \
              WHERE a.id IS NULL OR o.action_id IS NULL \
                 OR (a.tenant, a.principal, a.session, a.conversation_id, \
                     CASE a.status WHEN 'executing' THEN 'leased' ELSE a.status END, a.expires_at, \
                     a.next_attempt_at, a.lease_expires_at) \
                    IS DISTINCT FROM \
                    (o.tenant, o.principal, o.session, o.conversation_id, o.status, o.expires_at, \
                     o.next_attempt_at, o.lease_expires_at) \
                 OR (a.status = 'uncertain' AND a.dispatched_at IS DISTINCT FROM o.dispatched_at)",
            &[],
        )
        .await
        .unwrap();
    let out_of_step: Vec<(String, Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        out_of_step.is_empty(),
        "open_action out of step with action (id, action status, work-list status): {out_of_step:?}"
    );
}

/// Runs `sql` as the superuser with every trigger off for that statement only
/// (session_replication_role = replica, transaction-local): how an attacker who
/// can write the table would tamper with it. Other sessions keep their guards.
pub async fn tamper(superuser: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> u64 {
    superuser
        .batch_execute("BEGIN; SET LOCAL session_replication_role = replica")
        .await
        .expect("begin tamper");
    let n = superuser
        .execute(sql, params)
        .await
        .unwrap_or_else(|e| panic!("tamper {sql}: {e}"));
    superuser
        .batch_execute("COMMIT")
        .await
        .expect("commit tamper");
    n
}
