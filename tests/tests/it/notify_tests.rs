//! docs/notifications.md: a person's channels (set_notify), the
//! notifications keyturn records when an action starts to wait for them,
//! and how the dispatcher's own calls carry them (lease, begin_dispatch,
//! complete, sweep, reconcile), with the same at-most-once rules as an
//! external action.
//!
//! Every test that leases holds DISPATCH_LOCK from before it proposes, and
//! leases with the notification providers only, so it sees notifications
//! alone; it removes its channels at the end, so what it leaves queued is
//! cancelled, never sent, when it comes due.

use keyturn_tests::*;
use serde_json::{json, Value};
use uuid::Uuid;

const NOTIFY: &str = "ARRAY['notify.email', 'notify.webhook', 'notify.webpush']";

async fn set_notify(
    c: &impl Sql,
    channel: &str,
    target: &str,
    settings: Value,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&channel, &target, &settings];
    c.query("SELECT keyturn.set_notify($1, $2, $3)", &params)
        .await
}

/// A subscription's JSON as a browser gives it (the keys are well-formed
/// bytes; nothing here encrypts to them).
fn subscription(endpoint: &str) -> String {
    json!({"endpoint": endpoint, "expirationTime": null,
           "keys": {"p256dh": format!("BA{}", "A".repeat(85)), "auth": "AAAAAAAAAAAAAAAAAAAAAA"}})
    .to_string()
}

/// A tenant whose member has `channel` set to `target`, and a webhook tool
/// granted to them.
async fn notified(channel: &str, target: &str, settings: Value) -> (World, String) {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    set_notify(&w.human, channel, target, settings)
        .await
        .unwrap();
    (w, t)
}

/// One notification row, as the superuser reads it.
#[derive(Debug, Clone)]
struct Note {
    id: Uuid,
    principal: String,
    channel: String,
    kind: String,
    status: String,
    action_id: Option<Uuid>,
}

async fn notes(w: &World) -> Vec<Note> {
    w.superuser
        .query(
            "SELECT id, principal, channel::text, kind::text, status::text, action_id FROM keyturn.notification \
              WHERE tenant = $1 ORDER BY created_at, id",
            &[&w.tenant],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Note {
            id: r.get(0),
            principal: r.get(1),
            channel: r.get(2),
            kind: r.get(3),
            status: r.get(4),
            action_id: r.get(5),
        })
        .collect()
}

async fn note_status(w: &World, id: Uuid) -> String {
    w.superuser
        .query_one(
            "SELECT status::text FROM keyturn.notification WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

/// Leases the due notifications (only notifications: the providers are
/// theirs) and returns this tenant's; another tenant's are handed back for a
/// day.
async fn lease_notes(d: &tokio_postgres::Client, tenant: &str, lease_for: &str) -> Vec<Lease> {
    let rows = d
        .query(
            &format!(
                "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                   FROM keyturn.lease('itest-notify', 100, $1::text::interval, {NOTIFY})"
            ),
            &[&lease_for],
        )
        .await
        .expect("lease");
    let mut mine = Vec::new();
    for r in rows {
        let l = Lease::from_row(&r);
        if l.tenant == tenant {
            mine.push(l);
        } else {
            complete(d, &l, "retry", json!({}), Some("1 day"))
                .await
                .expect("hand back");
        }
    }
    mine
}

/// The message of an executing notification.
async fn message_of(d: &tokio_postgres::Client, l: &Lease) -> tokio_postgres::Row {
    d.query_one(
        "SELECT send, reason, channel, target, secret, kind, title, body, actions, link_action_ids, code, \
                code_expires_at, waiting \
           FROM keyturn.notification_message($1, $2)",
        &[&l.action_id, &l.lease_id],
    )
    .await
    .expect("notification_message")
}

/// Removes a person's channels, so that what they left queued is cancelled
/// when it comes due.
async fn remove_channels(c: &impl Sql) {
    for channel in ["email", "webhook", "webpush"] {
        c.query("SELECT keyturn.remove_notify($1)", &[&channel])
            .await
            .expect("remove_notify");
    }
}

#[tokio::test]
async fn test_set_notify_takes_each_channels_target_and_nothing_else() {
    let w = World::new("member").await;
    let ok = [
        ("email", "ann@acme.example".to_owned(), json!({})),
        (
            "webhook",
            "https://hooks.slack.com/services/T0/B0/x".to_owned(),
            json!({"remind_before": "10 minutes"}),
        ),
        (
            "webhook",
            "http://127.0.0.1:9000/hook".to_owned(),
            json!({"max_per_hour": 5}),
        ),
        (
            "webpush",
            subscription("https://push.example/dev1"),
            json!({}),
        ),
    ];
    for (channel, target, settings) in &ok {
        set_notify(&w.human, channel, target, settings.clone())
            .await
            .unwrap_or_else(|e| panic!("{channel} {target}: {e}"));
    }
    let secret = format!("whsec_{}", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let bad = [
        ("sms", "+15550100".to_owned(), json!({})),
        ("email", "Ann <ann@acme.example>".to_owned(), json!({})),
        (
            "email",
            "ann@acme.example\r\nBcc: eve@evil.example".to_owned(),
            json!({}),
        ),
        ("webhook", "http://hooks.example/x".to_owned(), json!({})),
        (
            "webhook",
            "https://169.254.169.254/latest/meta-data/".to_owned(),
            json!({}),
        ),
        ("webhook", "https://10.1.2.3/".to_owned(), json!({})),
        (
            "webhook",
            "https://user:pw@hooks.example/".to_owned(),
            json!({}),
        ),
        ("webhook", "file:///etc/passwd".to_owned(), json!({})),
        (
            "webhook",
            "https://hooks.example/x".to_owned(),
            json!({"secret": "not-whsec"}),
        ),
        (
            "email",
            "ann@acme.example".to_owned(),
            json!({"secret": secret}),
        ),
        (
            "email",
            "ann@acme.example".to_owned(),
            json!({"unknown": 1}),
        ),
        (
            "email",
            "ann@acme.example".to_owned(),
            json!({"remind_before": "0 seconds"}),
        ),
        (
            "email",
            "ann@acme.example".to_owned(),
            json!({"remind_before": "not an interval"}),
        ),
        (
            "email",
            "ann@acme.example".to_owned(),
            json!({"max_per_hour": 0}),
        ),
        (
            "email",
            "ann@acme.example".to_owned(),
            json!({"max_per_hour": 2.5}),
        ),
        ("email", "ann@acme.example".to_owned(), json!([])),
        (
            "webpush",
            subscription("http://push.example/dev1"),
            json!({}),
        ),
        (
            "webpush",
            "{\"endpoint\": \"https://push.example/x\"}".to_owned(),
            json!({}),
        ),
        (
            "webpush",
            format!(
                "{{\"endpoint\": \"https://push.example/{}\", \"keys\": {{}}}}",
                "a".repeat(8000)
            ),
            json!({}),
        ),
    ];
    for (channel, target, settings) in &bad {
        assert_eq!(
            sqlstate(set_notify(&w.human, channel, target, settings.clone()).await),
            "22023",
            "{channel} {target:.80} {settings}"
        );
    }
    // A secret of its own: taken, and never shown back.
    set_notify(
        &w.human,
        "webhook",
        "https://hooks.example/y",
        json!({"secret": secret}),
    )
    .await
    .unwrap();
    let rows = w
        .human
        .query(
            "SELECT channel, target, own_secret, db_role FROM keyturn.notify_channels()",
            &[],
        )
        .await
        .unwrap();
    // The cap bounds a runaway agent, not a busy person: 100 an hour
    // unless the person sets it lower.
    let caps: Vec<i32> = w
        .human
        .query("SELECT max_per_hour FROM keyturn.notify_channels()", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(caps, vec![100, 100, 100]);
    let listed: Vec<(String, String, bool, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        listed,
        vec![
            (
                "email".into(),
                "ann@acme.example".into(),
                false,
                "app_human".into()
            ),
            (
                "webhook".into(),
                "https://hooks.example/…".into(),
                true,
                "app_human".into()
            ),
            (
                "webpush".into(),
                "https://push.example/…".into(),
                false,
                "app_human".into()
            ),
        ]
    );
    let all: String = w
        .human
        .query_one(
            "SELECT coalesce(string_agg(x::text, ' '), '') FROM keyturn.notify_channels() x",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !all.contains("MfKQ9r8"),
        "the secret is never listed: {all}"
    );
    // Nobody reads the table directly, the person included.
    assert_eq!(
        count(&w.human, "SELECT count(*) FROM keyturn.notify_channel", &[]).await,
        0
    );
    // An agent sets none.
    assert_eq!(
        sqlstate(set_notify(&w.agent, "email", "eve@evil.example", json!({})).await),
        "42501"
    );
    let removed: bool = w
        .human
        .query_one("SELECT keyturn.remove_notify('webpush')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(removed);
    let again: bool = w
        .human
        .query_one("SELECT keyturn.remove_notify('webpush')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!again);
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_a_self_proposal_records_one_notice_and_one_reminder_per_channel() {
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    // Nobody in the tenant has a channel: nothing is recorded.
    let quiet = w
        .propose(&t, json!({"channel": "c", "text": "0"}))
        .await
        .unwrap();
    assert!(notes(&w).await.is_empty());
    set_notify(&w.human, "email", "ann@acme.example", json!({}))
        .await
        .unwrap();
    set_notify(
        &w.human,
        "webhook",
        "http://127.0.0.1:9/h",
        json!({"remind_before": "8 days"}),
    )
    .await
    .expect_err("remind_before is at most 7 days");
    set_notify(
        &w.human,
        "webhook",
        "http://127.0.0.1:9/h",
        json!({"remind_before": "7 days"}),
    )
    .await
    .unwrap();
    let p = w
        .propose(&t, json!({"channel": "c", "text": "1"}))
        .await
        .unwrap();
    let got: Vec<(String, String, String)> = notes(&w)
        .await
        .into_iter()
        .map(|n| {
            assert_eq!(n.action_id, Some(p.id));
            assert_eq!(n.principal, w.principal);
            assert_eq!(n.status, "queued");
            (n.channel, n.kind, n.status)
        })
        .collect();
    // The tool's proposals live 15 minutes (its default): a reminder 5
    // minutes before on email, none on the webhook (7 days before is past).
    let mut kinds: Vec<(String, String)> = got.into_iter().map(|(c, k, _)| (c, k)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            ("email".into(), "notice".into()),
            ("email".into(), "reminder".into()),
            ("webhook".into(), "notice".into()),
        ]
    );
    let reminder_due: bool = w
        .superuser
        .query_one(
            "SELECT n.next_attempt_at = a.expires_at - interval '5 minutes' FROM keyturn.notification n \
               JOIN keyturn.action a ON a.id = n.action_id WHERE n.action_id = $1 AND n.kind = 'reminder'",
            &[&p.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(reminder_due);
    // Another member of the tenant with a channel: a self action is not theirs.
    let (_, other) = w.other("approver", "app_human", "s-o").await;
    set_notify(&other, "email", "bo@acme.example", json!({}))
        .await
        .unwrap();
    let q = w
        .propose(&t, json!({"channel": "c", "text": "2"}))
        .await
        .unwrap();
    let for_q: Vec<Note> = notes(&w)
        .await
        .into_iter()
        .filter(|n| n.action_id == Some(q.id))
        .collect();
    assert!(
        for_q.iter().all(|n| n.principal == w.principal),
        "{for_q:?}"
    );
    assert_eq!(for_q.len(), 3);
    assert!(notes(&w)
        .await
        .iter()
        .all(|n| n.action_id != Some(quiet.id)));
    remove_channels(&w.human).await;
    remove_channels(&other).await;
}

#[tokio::test]
async fn test_independent_and_quorum_tools_notify_each_eligible_approver_once() {
    let w = World::new("member").await;
    let solo = w.webhook_tool(json!({"approval": "independent"})).await;
    let quorum = w
        .webhook_tool(json!({"approval": "independent", "quorum": 2}))
        .await;
    let mut approvers = Vec::new();
    for i in 0..3 {
        let (who, c) = w.other("approver", "app_human", &format!("s-{i}")).await;
        w.grant(&who, &solo).await;
        w.grant(&who, &quorum).await;
        set_notify(
            &c,
            "email",
            &format!("a{i}@acme.example"),
            json!({"remind_before": "1 minute"}),
        )
        .await
        .unwrap();
        approvers.push((who, c));
    }
    // Not notified: an approver without the tool's grant, a member, the
    // proposer itself (with channels of its own).
    let (_, ungranted) = w.other("approver", "app_human", "s-u").await;
    set_notify(&ungranted, "email", "u@acme.example", json!({}))
        .await
        .unwrap();
    let (_, member) = w.other("member", "app_human", "s-m").await;
    set_notify(&member, "email", "m@acme.example", json!({}))
        .await
        .unwrap();
    set_notify(&w.human, "email", "p@acme.example", json!({}))
        .await
        .unwrap();
    for tool in [&solo, &quorum] {
        let p = w
            .propose(tool, json!({"channel": "c", "text": "pay"}))
            .await
            .unwrap();
        let mut got: Vec<(String, String)> = notes(&w)
            .await
            .into_iter()
            .filter(|n| n.action_id == Some(p.id))
            .map(|n| (n.principal, n.kind))
            .collect();
        got.sort();
        let mut want: Vec<(String, String)> = approvers
            .iter()
            .flat_map(|(who, _)| {
                [
                    (who.clone(), "notice".to_owned()),
                    (who.clone(), "reminder".to_owned()),
                ]
            })
            .collect();
        want.sort();
        assert_eq!(got, want, "{tool}");
    }
    // The same again records nothing more: one row per (action, person,
    // channel, kind).
    let any = notes(&w).await[0].action_id.unwrap();
    let again: i32 = w
        .superuser
        .query_one(
            "SELECT keyturn._record_notifications($1, $2)",
            &[&any, &w.tenant],
        )
        .await
        .unwrap()
        .get(0);
    let rows = notes(&w)
        .await
        .iter()
        .filter(|n| n.action_id == Some(any))
        .count();
    assert_eq!(rows, 6, "recorded {again} again, none new");
    for (_, c) in &approvers {
        remove_channels(c).await;
    }
    for c in [&ungranted, &member, &w.human] {
        remove_channels(c).await;
    }
}

#[tokio::test]
async fn test_nothing_is_sent_for_an_action_decided_expired_or_cancelled_before_its_lease() {
    let _lock = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    let short = w.webhook_tool(json!({"expires_in": "1 second"})).await;
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/h", json!({}))
        .await
        .unwrap();
    let approved = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let rejected = w
        .propose(&t, json!({"channel": "c", "text": "r"}))
        .await
        .unwrap();
    let expired = w
        .propose(&short, json!({"channel": "c", "text": "e"}))
        .await
        .unwrap();
    let waiting = w
        .propose(&t, json!({"channel": "c", "text": "w"}))
        .await
        .unwrap();
    assert_eq!(w.approve(&approved).await.unwrap().0, "queued");
    w.human
        .execute(
            "SELECT keyturn.reject($1, $2, 'no')",
            &[&rejected.id, &rejected.token],
        )
        .await
        .unwrap();
    // Ended sessions cancel their pending actions: a session of its own.
    let other_session = Conn::connect(
        "app_agent",
        Identity::gucs(&w.tenant, &w.principal, "ending"),
    )
    .await;
    let cancelled = propose_on(
        &other_session,
        &t,
        json!({"channel": "c", "text": "x"}),
        json!({}),
    )
    .await
    .unwrap();
    other_session
        .execute("SELECT keyturn.end_session('ending')", &[])
        .await
        .unwrap();
    // The short one expires: wait for its expiry to pass, not for a time.
    loop {
        let past: bool = w
            .superuser
            .query_one(
                "SELECT expires_at < clock_timestamp() FROM keyturn.action WHERE id = $1",
                &[&expired.id],
            )
            .await
            .unwrap()
            .get(0);
        if past {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let d = connect("app_dispatcher").await;
    let leased = lease_notes(&d, &w.tenant, "30 seconds").await;
    let ids: Vec<Uuid> = leased
        .iter()
        .map(|l| {
            l.params.as_ref().unwrap()["action_id"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, vec![waiting.id], "only the action still waiting");
    assert_eq!(leased[0].provider.as_deref(), Some("notify.webhook"));
    assert_eq!(leased[0].tool, "keyturn.notify");
    for n in notes(&w).await.iter().filter(|n| n.kind == "notice") {
        let want = if n.action_id == Some(waiting.id) {
            "leased"
        } else {
            "cancelled"
        };
        assert_eq!(n.status, want, "{n:?}");
    }
    for id in [approved.id, rejected.id, expired.id, cancelled.id] {
        assert_eq!(
            count(
                &w.superuser,
                "SELECT count(*) FROM keyturn.attempt WHERE action_id IN (SELECT n.id FROM keyturn.notification n WHERE n.action_id = $1)",
                &[&id],
            )
            .await,
            0,
            "nothing begun for {id}"
        );
    }
    complete(&d, &leased[0], "retry", json!({}), None)
        .await
        .unwrap();
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_an_action_decided_between_lease_and_begin_is_not_begun() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("email", "ann@acme.example", json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let leased = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(leased.len(), 1);
    assert_eq!(w.approve(&p).await.unwrap().0, "queued");
    assert!(!begin(&d, &leased[0]).await.unwrap(), "not begun");
    let n = &notes(&w).await[0];
    assert_eq!(n.status, "cancelled");
    // Nothing to complete: it was never begun.
    assert_eq!(
        sqlstate(complete(&d, &leased[0], "succeeded", json!({}), None).await),
        "55000"
    );
    // And its message is never made.
    assert_eq!(
        sqlstate(
            d.query_one(
                "SELECT * FROM keyturn.notification_message($1, $2)",
                &[&leased[0].action_id, &leased[0].lease_id]
            )
            .await
        ),
        "55000"
    );
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_the_message_carries_a_fresh_one_time_link_and_never_params() {
    let _lock = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    // A digest-retained tool keeps no summary: the message says only the
    // tool's name, never the params.
    let t = w
        .webhook_tool(json!({"retain": "digest", "effect": "irreversible"}))
        .await;
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/h", json!({}))
        .await
        .unwrap();
    let p = w
        .propose(&t, json!({"channel": "c", "text": "PIN qz4721vk"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let leased = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(leased.len(), 1);
    let l = &leased[0];
    assert_eq!(l.idempotency_key, format!("keyturn-notify-{}", l.action_id));
    assert!(!l.params.as_ref().unwrap().to_string().contains("qz4721vk"));
    // Before begin, no message.
    assert_eq!(
        sqlstate(
            d.query_one(
                "SELECT * FROM keyturn.notification_message($1, $2)",
                &[&l.action_id, &l.lease_id]
            )
            .await
        ),
        "55000"
    );
    assert!(begin(&d, l).await.unwrap());
    let m = message_of(&d, l).await;
    assert!(m.get::<_, bool>("send"));
    assert_eq!(m.get::<_, String>("channel"), "webhook");
    assert_eq!(m.get::<_, String>("target"), "http://127.0.0.1:9/h");
    assert_eq!(m.get::<_, Option<String>>("secret"), None);
    assert_eq!(m.get::<_, String>("kind"), "notice");
    let title: String = m.get("title");
    let body: String = m.get("body");
    let actions: Value = m.get("actions");
    assert_eq!(title, format!("Approval needed: {t}"));
    assert!(body.contains("Effect: irreversible"), "{body}");
    for text in [&title, &body, &actions.to_string()] {
        assert!(!text.contains("qz4721vk"), "never a param: {text}");
        assert!(!text.contains(&p.token), "never a token");
    }
    assert_eq!(actions[0]["action_id"], json!(p.id));
    assert_eq!(m.get::<_, Vec<Uuid>>("link_action_ids"), vec![p.id]);
    let code: String = m.get("code");
    // One message, one code, per attempt: the dispatcher's login cannot
    // keep a spare code while it delivers another (red-team pass).
    assert_eq!(
        sqlstate(
            d.query_one(
                "SELECT * FROM keyturn.notification_message($1, $2)",
                &[&l.action_id, &l.lease_id]
            )
            .await
        ),
        "55000",
        "a second code for the same attempt"
    );
    // The code is a card link's: redeemed once, as the role the person set
    // the channel as, for the person in the action's session.
    let r = d
        .query_one(
            "SELECT db_role, claims FROM keyturn.redeem_link_code($1, $2)",
            &[&code, &vec![p.id]],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, Option<String>>(0).as_deref(), Some("app_human"));
    assert_eq!(
        r.get::<_, Value>(1),
        json!({"tenant_id": w.tenant, "sub": w.principal, "session_id": w.session,
               "keyturn_card_session": true})
    );
    assert!(d
        .query_opt(
            "SELECT 1 FROM keyturn.redeem_link_code($1, $2)",
            &[&code, &vec![p.id]]
        )
        .await
        .unwrap()
        .is_none());
    // Only its digest is kept.
    assert_eq!(
        count(
            &w.superuser,
            "SELECT count(*) FROM keyturn.card_link WHERE code_digest = sha256(convert_to($1, 'UTF8'))",
            &[&code],
        )
        .await,
        1
    );
    assert_eq!(
        complete(&d, l, "succeeded", json!({"status": 200}), None)
            .await
            .unwrap(),
        "succeeded"
    );
    // Sent: an event in the tenant's chain, under the notification's own
    // id, so that the action's audit stays its status changes and votes.
    let detail: Value = w
        .superuser
        .query_one(
            "SELECT detail FROM keyturn.event \
              WHERE (detail -> 'notification' ->> 'action_id')::uuid = $1 AND action_id <> $1",
            &[&p.id],
        )
        .await
        .unwrap()
        .get(0);
    let on_the_action: i64 = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.audit($1) WHERE detail ? 'notification'",
            &[&p.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_the_action, 0, "not in the action's own audit");
    assert_eq!(detail["notification"]["status"], "succeeded");
    assert_eq!(detail["notification"]["to"], json!(w.principal));
    let ok: bool = w
        .superuser
        .query_one("SELECT ok FROM keyturn.verify_audit($1)", &[&w.tenant])
        .await
        .unwrap()
        .get(0);
    assert!(ok);
    // The operator sees it among the action's notifications.
    let op = connect("app_operator").await;
    let rows = op
        .query(
            "SELECT kind, status FROM keyturn.notifications($1)",
            &[&p.id],
        )
        .await
        .unwrap();
    let seen: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(
        seen.contains(&("notice".into(), "succeeded".into())),
        "{seen:?}"
    );
    // A person, an agent: no message, no operator view.
    assert_eq!(
        sqlstate(
            w.human
                .query_one(
                    "SELECT * FROM keyturn.notification_message($1, $2)",
                    &[&l.action_id, &l.lease_id]
                )
                .await
        ),
        "42501"
    );
    assert_eq!(
        sqlstate(
            w.agent
                .query("SELECT * FROM keyturn.notifications($1)", &[&p.id])
                .await
        ),
        "42501"
    );
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_a_lapsed_notification_is_uncertain_for_the_operator_and_never_sent_again() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("email", "ann@acme.example", json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let l = lease_notes(&d, &w.tenant, "1 second").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    // The dispatcher dies mid-send: the lease lapses, the sweep finds it.
    loop {
        d.execute("SELECT keyturn.sweep()", &[]).await.unwrap();
        if note_status(&w, l.action_id).await == "uncertain" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Never leased again; its outcome is refused; the operator's queue has it.
    assert!(lease_notes(&d, &w.tenant, "30 seconds").await.is_empty());
    assert_eq!(
        sqlstate(complete(&d, &l, "succeeded", json!({}), None).await),
        "55000"
    );
    let op = connect("app_operator").await;
    let row = op
        .query_one(
            "SELECT tool, attempts, safe_to_decide_after IS NOT NULL, not_sent_by_dispatcher \
               FROM keyturn.uncertain_actions() WHERE action_id = $1",
            &[&l.action_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "keyturn.notify.email");
    assert_eq!(row.get::<_, i32>(1), 1);
    assert!(row.get::<_, bool>(2));
    assert!(!row.get::<_, bool>(3));
    // keyturnd's account that it sent nothing is kept, once.
    for _ in 0..2 {
        let taken: bool = d
            .query_one(
                "SELECT keyturn.record_not_sent($1, $2, '{\"sent\": false}')",
                &[&l.action_id, &l.lease_id],
            )
            .await
            .unwrap()
            .get(0);
        assert!(taken);
    }
    assert!(op
        .query_one(
            "SELECT not_sent_by_dispatcher FROM keyturn.uncertain_actions() WHERE action_id = $1",
            &[&l.action_id]
        )
        .await
        .unwrap()
        .get::<_, bool>(0));
    let attempts = op
        .query("SELECT outcome FROM keyturn.attempts($1)", &[&l.action_id])
        .await
        .unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        attempts[0].get::<_, Option<String>>(0).as_deref(),
        Some("lapsed")
    );
    assert_eq!(
        op.query_one(
            "SELECT keyturn.reconcile($1, 'failed', 'mail log: never left')",
            &[&l.action_id]
        )
        .await
        .unwrap()
        .get::<_, String>(0),
        "failed"
    );
    assert_eq!(note_status(&w, l.action_id).await, "failed");
    assert_eq!(
        sqlstate(
            op.query_one(
                "SELECT keyturn.reconcile($1, 'failed', 'again')",
                &[&l.action_id]
            )
            .await
        ),
        "55000"
    );
    // The action's timeline: uncertain, the account, the reconciliation.
    let events: Vec<String> = w
        .superuser
        .query(
            "SELECT coalesce(detail -> 'notification' ->> 'status', '') FROM keyturn.event \
              WHERE (detail -> 'notification' ->> 'action_id')::uuid = $1 ORDER BY id",
            &[&p.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(events, vec!["uncertain", "uncertain", "failed"]);
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_complete_gives_a_notification_an_actions_outcomes() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("webhook", "http://127.0.0.1:9/h", json!({})).await;
    set_notify(&w.human, "email", "ann@acme.example", json!({}))
        .await
        .unwrap();
    let _p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    // A person has one notification in flight at a time (row 136).
    let first = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(first.len(), 1, "one of the person's two in flight");
    // A hand-back from leased: requeued, no attempt counted.
    assert_eq!(
        complete(&d, &first[0], "retry", json!({}), None)
            .await
            .unwrap(),
        "queued"
    );
    let second = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(
        second.len(),
        1,
        "the other channel's, once the first went back"
    );
    assert_ne!(second[0].action_id, first[0].action_id);
    let leased = [first[0].clone(), second[0].clone()];
    // Begun, then retry: queued again after the backoff, the attempt closed.
    assert!(begin(&d, &leased[1]).await.unwrap());
    assert_eq!(
        sqlstate(complete(&d, &leased[1], "maybe", json!({}), None).await),
        "22023"
    );
    assert_eq!(
        complete(&d, &leased[1], "retry", json!({"status": 503}), None)
            .await
            .unwrap(),
        "queued"
    );
    let due_later: bool = w
        .superuser
        .query_one(
            "SELECT next_attempt_at > clock_timestamp() FROM keyturn.notification WHERE id = $1",
            &[&leased[1].action_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(due_later);
    // The hand-back is due at once; leased again, then unknown: uncertain.
    let again = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].action_id, leased[0].action_id);
    assert_eq!(again[0].attempt, 1);
    // The batch calls take notifications as they take actions.
    let b = d
        .query(
            "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)",
            &[
                &vec![again[0].action_id, Uuid::new_v4()],
                &vec![again[0].lease_id, Uuid::new_v4()],
            ],
        )
        .await
        .unwrap();
    assert!(b[0].get::<_, bool>(1));
    assert!(b[1]
        .get::<_, Option<String>>(2)
        .unwrap()
        .starts_with("55000"));
    let c = d
        .query(
            "SELECT action_id, status, error FROM keyturn.complete_many($1, $2, ARRAY['unknown'], \
                    ARRAY['{\"error\": \"timeout after sending\"}']::jsonb[], ARRAY[NULL]::interval[])",
            &[&vec![again[0].action_id], &vec![again[0].lease_id]],
        )
        .await
        .unwrap();
    assert_eq!(
        c[0].get::<_, Option<String>>(1).as_deref(),
        Some("uncertain")
    );
    assert_eq!(note_status(&w, again[0].action_id).await, "uncertain");
    remove_channels(&w.human).await;
    connect("app_operator")
        .await
        .execute(
            "SELECT keyturn.reconcile($1, 'succeeded', 'seen in the mail log')",
            &[&again[0].action_id],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn test_a_batch_of_actions_and_notifications_is_answered_in_its_order() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t, ids) = queued(2).await;
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/h", json!({}))
        .await
        .unwrap();
    let _p = w
        .propose(&t, json!({"channel": "c", "text": "n"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    // Notifications first: lease_mine would hand this one back for a day.
    let notes = lease_notes(&d, &w.tenant, "30 seconds").await;
    let mut jobs = lease_mine(&d, &ids, "30 seconds").await;
    assert_eq!((jobs.len(), notes.len()), (2, 1));
    jobs.insert(1, notes[0].clone());
    let rows = d
        .query(
            "SELECT action_id, dispatch, error FROM keyturn.begin_dispatch_many($1, $2)",
            &[
                &jobs.iter().map(|j| j.action_id).collect::<Vec<_>>(),
                &jobs.iter().map(|j| j.lease_id).collect::<Vec<_>>(),
            ],
        )
        .await
        .unwrap();
    let answered: Vec<(Uuid, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        answered,
        jobs.iter().map(|j| (j.action_id, true)).collect::<Vec<_>>()
    );
    let rows = d
        .query(
            "SELECT action_id, status, error FROM keyturn.complete_many($1, $2, \
                    ARRAY['succeeded', 'failed', 'succeeded'], ARRAY['{}', '{}', '{}']::jsonb[], \
                    ARRAY[NULL, NULL, NULL]::interval[])",
            &[
                &jobs.iter().map(|j| j.action_id).collect::<Vec<_>>(),
                &jobs.iter().map(|j| j.lease_id).collect::<Vec<_>>(),
            ],
        )
        .await
        .unwrap();
    let answered: Vec<(Uuid, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        answered,
        vec![
            (jobs[0].action_id, Some("succeeded".into())),
            (jobs[1].action_id, Some("failed".into())),
            (jobs[2].action_id, Some("succeeded".into())),
        ]
    );
    assert_eq!(w.status(jobs[0].action_id).await, "succeeded");
    assert_eq!(note_status(&w, jobs[1].action_id).await, "failed");
    // A notification's success meters nothing.
    assert_eq!(w.usage_rows(jobs[1].action_id).await, 0);
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_the_hourly_cap_holds_the_rest_for_one_digest() {
    let _lock = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({})).await;
    set_notify(
        &w.human,
        "email",
        "ann@acme.example",
        json!({"max_per_hour": 1}),
    )
    .await
    .unwrap();
    let mut ps = Vec::new();
    for i in 0..3 {
        ps.push(
            w.propose(&t, json!({"channel": "c", "text": format!("{i}")}))
                .await
                .unwrap(),
        );
    }
    let d = connect("app_dispatcher").await;
    let leased = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(leased.len(), 1, "one within the cap");
    assert!(begin(&d, &leased[0]).await.unwrap());
    complete(&d, &leased[0], "succeeded", json!({}), None)
        .await
        .unwrap();
    let all = notes(&w).await;
    let digests: Vec<&Note> = all.iter().filter(|n| n.kind == "digest").collect();
    assert_eq!(digests.len(), 1, "{all:?}");
    let held: Vec<&Note> = all.iter().filter(|n| n.status == "superseded").collect();
    assert_eq!(held.len(), 2);
    // The digest is due when the hour of the first one sent is over.
    let hour: bool = w
        .superuser
        .query_one(
            "SELECT d.next_attempt_at BETWEEN clock_timestamp() + interval '55 minutes' \
                                          AND s.dispatched_at + interval '1 hour' \
               FROM keyturn.notification d, keyturn.notification s WHERE d.id = $1 AND s.id = $2",
            &[&digests[0].id, &leased[0].action_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(hour);
    assert!(lease_notes(&d, &w.tenant, "30 seconds").await.is_empty());
    // An hour later (moved here by the superuser): the one digest, for the
    // two still waiting, one of which was approved meanwhile.
    assert_eq!(w.approve(&ps[1]).await.unwrap().0, "queued");
    w.superuser
        .execute(
            "UPDATE keyturn.notification SET next_attempt_at = clock_timestamp() WHERE id = $1",
            &[&digests[0].id],
        )
        .await
        .unwrap();
    let l = lease_notes(&d, &w.tenant, "30 seconds").await.remove(0);
    assert_eq!(l.action_id, digests[0].id);
    assert!(begin(&d, &l).await.unwrap());
    let m = message_of(&d, &l).await;
    assert_eq!(m.get::<_, String>("kind"), "digest");
    assert_eq!(m.get::<_, i32>("waiting"), 1);
    assert_eq!(m.get::<_, String>("title"), "1 action waits for you");
    // ps[0]'s notice went within the cap; ps[1]'s and ps[2]'s were held,
    // and ps[1] was approved since.
    assert_eq!(m.get::<_, Vec<Uuid>>("link_action_ids"), vec![ps[2].id]);
    complete(&d, &l, "succeeded", json!({}), None)
        .await
        .unwrap();
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_one_reminder_when_remind_before_of_the_expiry_is_left() {
    let _lock = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w.webhook_tool(json!({"expires_in": "1 minute"})).await;
    set_notify(
        &w.human,
        "email",
        "ann@acme.example",
        json!({"remind_before": "59 seconds"}),
    )
    .await
    .unwrap();
    let p = w
        .propose(&t, json!({"channel": "c", "text": "r"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let first = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].params.as_ref().unwrap()["kind"], "notice");
    assert!(begin(&d, &first[0]).await.unwrap());
    complete(&d, &first[0], "succeeded", json!({}), None)
        .await
        .unwrap();
    // Wait for the reminder to come due (a second after the notice).
    let reminder = loop {
        let got = lease_notes(&d, &w.tenant, "30 seconds").await;
        if let Some(l) = got.into_iter().next() {
            break l;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(reminder.params.as_ref().unwrap()["kind"], "reminder");
    assert!(begin(&d, &reminder).await.unwrap());
    let title: String = message_of(&d, &reminder).await.get("title");
    assert!(title.starts_with("Reminder"), "{title}");
    complete(&d, &reminder, "succeeded", json!({}), None)
        .await
        .unwrap();
    let kinds: Vec<(String, String)> = notes(&w)
        .await
        .into_iter()
        .filter(|n| n.action_id == Some(p.id))
        .map(|n| (n.kind, n.status))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("notice".into(), "succeeded".into()),
            ("reminder".into(), "succeeded".into())
        ]
    );
    remove_channels(&w.human).await;
}

#[tokio::test]
async fn test_a_removed_channel_sends_nothing_more() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("email", "ann@acme.example", json!({})).await;
    let _p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    remove_channels(&w.human).await;
    let d = connect("app_dispatcher").await;
    assert!(lease_notes(&d, &w.tenant, "30 seconds").await.is_empty());
    let n = notes(&w)
        .await
        .into_iter()
        .find(|n| n.kind == "notice")
        .unwrap();
    assert_eq!(n.status, "cancelled");
}

/// A retried notification's new message replaces the link of the attempt
/// before, which no longer opens anything: at most one live code per
/// notification.
#[tokio::test]
async fn test_a_retried_notifications_new_link_ends_the_unused_one() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("webhook", "http://127.0.0.1:9/h", json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let first = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(first.len(), 1);
    assert!(begin(&d, &first[0]).await.unwrap());
    let code1: String = message_of(&d, &first[0]).await.get("code");
    assert_eq!(
        complete(&d, &first[0], "retry", json!({}), Some("0 seconds"))
            .await
            .unwrap(),
        "queued"
    );
    let second = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(second.len(), 1);
    assert!(begin(&d, &second[0]).await.unwrap());
    let code2: String = message_of(&d, &second[0]).await.get("code");
    assert_ne!(code1, code2);
    let redeem = "SELECT 1 FROM keyturn.redeem_link_code($1, $2)";
    assert!(
        d.query_opt(redeem, &[&code1, &vec![p.id]])
            .await
            .unwrap()
            .is_none(),
        "the first attempt's code still opens a card"
    );
    assert!(d
        .query_opt(redeem, &[&code2, &vec![p.id]])
        .await
        .unwrap()
        .is_some());
    complete(&d, &second[0], "succeeded", json!({}), None)
        .await
        .unwrap();
    remove_channels(&w.human).await;
}

/// A removed member's channels go with them: re-added (a shared principal
/// id, an id handed on), nothing reaches the old targets.
#[tokio::test]
async fn test_remove_member_removes_the_members_channels() {
    let (w, t) = notified("email", "ann@acme.example", json!({})).await;
    let channels =
        "SELECT count(*) FROM keyturn.notify_channel WHERE tenant = $1 AND principal = $2";
    assert_eq!(
        count(&w.superuser, channels, &[&w.tenant, &w.principal]).await,
        1
    );
    w.admin
        .execute(
            "SELECT keyturn.remove_member($1, $2)",
            &[&w.tenant, &w.principal],
        )
        .await
        .unwrap();
    assert_eq!(
        count(&w.superuser, channels, &[&w.tenant, &w.principal]).await,
        0,
        "the removed member's channel stayed"
    );
    w.admin
        .execute(
            "SELECT keyturn.add_member($1, $2, 'member')",
            &[&w.tenant, &w.principal],
        )
        .await
        .unwrap();
    w.grant(&w.principal, &t).await;
    w.propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    assert!(
        notes(&w).await.is_empty(),
        "a notification to the old target"
    );
}

/// A notice carries the whole summary (a value at its end included); only a
/// digest's lines are cut, the card showing all.
#[tokio::test]
async fn test_a_notice_carries_the_whole_summary() {
    let _lock = DISPATCH_LOCK.lock().await;
    let w = World::new("member").await;
    let t = w
        .webhook_tool(json!({"summary": "Post to {channel}: {text}"}))
        .await;
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/h", json!({}))
        .await
        .unwrap();
    w.propose(
        &t,
        json!({"channel": "y".repeat(170), "text": format!("{} AMOUNT-9999999", "x".repeat(170))}),
    )
    .await
    .unwrap();
    let d = connect("app_dispatcher").await;
    let leased = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert_eq!(leased.len(), 1);
    assert!(begin(&d, &leased[0]).await.unwrap());
    let m = message_of(&d, &leased[0]).await;
    let body: String = m.get("body");
    assert!(body.contains("AMOUNT-9999999"), "{body}");
    complete(&d, &leased[0], "succeeded", json!({}), None)
        .await
        .unwrap();
    remove_channels(&w.human).await;
}

/// A person's notification endpoint that never answers holds a dispatcher
/// slot for a whole call timeout. Notifications are leased first, so one
/// tenant's person (and their agent, proposing in a burst) had every slot
/// of the dispatcher all tenants share: another tenant's notifications and
/// approved effects waited (twenty-fourth red-team pass; docs/security.md,
/// row 136); and then one member's, the whole tenant's share, so that their
/// colleagues' waited (twenty-sixth pass). A person has at most one
/// notification in flight, a tenant two, and a lease gives notifications at
/// most half its jobs: the colleague's notice, the other tenant's notice
/// and its effect are leased beside them.
#[tokio::test]
async fn test_one_tenants_notifications_never_take_every_slot() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (flood, t) = notified(
        "webhook",
        "http://127.0.0.1:9/stalls",
        json!({"max_per_hour": 1000}),
    )
    .await;
    for i in 0..6 {
        flood
            .propose(&t, json!({"channel": "c", "text": format!("burst {i}")}))
            .await
            .unwrap();
    }
    let reviewed = flood.webhook_tool(json!({"approval": "independent"})).await;
    let (colleague, colleague_conn) = flood.other("approver", "app_human", "s-colleague").await;
    flood.grant(&colleague, &reviewed).await;
    set_notify(&colleague_conn, "email", "col@flood.example", json!({}))
        .await
        .unwrap();
    flood
        .propose(
            &reviewed,
            json!({"channel": "c", "text": "for the colleague"}),
        )
        .await
        .unwrap();
    let (other, other_tool) = notified("email", "bo@other.example", json!({})).await;
    other
        .propose(&other_tool, json!({"channel": "c", "text": "mine"}))
        .await
        .unwrap();
    let effect = other
        .propose(&other_tool, json!({"channel": "c", "text": "approved"}))
        .await
        .unwrap();
    assert_eq!(other.approve(&effect).await.unwrap().0, "queued");

    let d = connect("app_dispatcher").await;
    // The cluster is shared: lease until nothing is due, handing every
    // other test's job back for a day, and keep ours in flight.
    let ours = [flood.tenant.as_str(), other.tenant.as_str()];
    let mut leases: Vec<Lease> = Vec::new();
    for step in 0.. {
        let rows = d
            .query(
                "SELECT action_id, lease_id, tenant, tool, provider, params, idempotency_key, attempt \
                   FROM keyturn.lease('itest-fair', 8, interval '30 seconds')",
                &[],
            )
            .await
            .expect("lease");
        if rows.is_empty() {
            break;
        }
        assert!(step < 1000, "the lease never ran dry");
        let notes = rows
            .iter()
            .filter(|r| r.get::<_, String>("tool") == "keyturn.notify")
            .count();
        assert!(
            notes <= 4,
            "step {step}: {notes} of 8 jobs were notifications"
        );
        for l in rows.iter().map(Lease::from_row) {
            if ours.contains(&l.tenant.as_str()) {
                leases.push(l);
            } else if let Err(e) = complete(&d, &l, "retry", json!({}), Some("1 day")).await {
                assert_eq!(
                    e.code(),
                    Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
                    "{e}"
                );
            }
        }
    }
    let of = |tenant: &str, notes: bool| {
        leases
            .iter()
            .filter(|l| l.tenant == tenant && (l.tool == "keyturn.notify") == notes)
            .count()
    };
    let flood_notes = notes(&flood).await;
    let flood_people: Vec<String> = leases
        .iter()
        .filter(|l| l.tenant == flood.tenant && l.tool == "keyturn.notify")
        .map(|l| {
            let id: Uuid = l.params.as_ref().unwrap()["notification"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            flood_notes
                .iter()
                .find(|n| n.id == id)
                .map(|n| n.principal.clone())
                .unwrap_or_default()
        })
        .collect();
    let held_by = |who: &str| flood_people.iter().filter(|p| p.as_str() == who).count();
    assert_eq!(
        held_by(&flood.principal),
        1,
        "one of the flooding person's notifications in flight: {flood_people:?}"
    );
    assert_eq!(
        held_by(&colleague),
        1,
        "the colleague's notice is leased beside it: {flood_people:?}"
    );
    assert_eq!(
        of(&flood.tenant, true),
        2,
        "two of the flooding tenant's notifications in flight"
    );
    assert_eq!(
        of(&other.tenant, true),
        1,
        "the other tenant's notice is leased"
    );
    assert_eq!(
        of(&other.tenant, false),
        1,
        "the other tenant's effect is leased"
    );
    for l in &leases {
        complete(&d, l, "retry", json!({}), Some("1 day"))
            .await
            .expect("hand back");
    }
    remove_channels(&flood.human).await;
    remove_channels(&colleague_conn).await;
    remove_channels(&other.human).await;
}

/// The code of the message a lease of `w`'s one due notification carries,
/// sent (completed `succeeded`).
async fn delivered_code(w: &World, d: &tokio_postgres::Client) -> String {
    let l = lease_notes(d, &w.tenant, "30 seconds").await.remove(0);
    assert!(begin(d, &l).await.unwrap());
    let code: String = message_of(d, &l).await.get("code");
    complete(d, &l, "succeeded", json!({}), None).await.unwrap();
    code
}

/// Links already delivered to a channel ended with the channel: a person
/// who removed a chat webhook that had leaked, or pointed it elsewhere,
/// still had its messages' codes open a card of their pending actions for
/// as long as those waited (twenty-fourth red-team pass; docs/security.md,
/// row 138). Removing a channel, or giving it another target, ends the
/// codes its notifications carried and the card sessions they opened;
/// `revoke_links` ends all of the person's.
#[tokio::test]
async fn test_a_removed_or_moved_channels_links_open_nothing() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("webhook", "http://127.0.0.1:9/leaked", json!({})).await;
    let d = connect("app_dispatcher").await;
    let redeem = "SELECT session FROM keyturn.redeem_link_code($1, $2)";
    let opens = |code: String, id: Uuid| {
        let d = &d;
        async move {
            d.query_opt(redeem, &[&code, &vec![id]])
                .await
                .unwrap()
                .map(|r| r.get::<_, String>(0))
        }
    };

    // Removed: the unopened code and an opened card session both end.
    let p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let opened = delivered_code(&w, &d).await;
    let session = opens(opened, p.id)
        .await
        .expect("the delivered code opens a card");
    let q = w
        .propose(&t, json!({"channel": "c", "text": "b"}))
        .await
        .unwrap();
    let unopened = delivered_code(&w, &d).await;
    assert!(w
        .human
        .query_one("SELECT keyturn.remove_notify('webhook')", &[])
        .await
        .unwrap()
        .get::<_, bool>(0));
    assert!(
        opens(unopened, q.id).await.is_none(),
        "a removed channel's code still opens a card"
    );
    let live = count(
        &d,
        "SELECT count(*) FROM keyturn.card_session($1)",
        &[&session],
    )
    .await;
    assert_eq!(live, 0, "a removed channel's card session still acts");

    // Moved to another target: the old target's code ends; the same target
    // set again (another setting) keeps it.
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/first", json!({}))
        .await
        .unwrap();
    let r = w
        .propose(&t, json!({"channel": "c", "text": "c"}))
        .await
        .unwrap();
    let kept = delivered_code(&w, &d).await;
    set_notify(
        &w.human,
        "webhook",
        "http://127.0.0.1:9/first",
        json!({"max_per_hour": 50}),
    )
    .await
    .unwrap();
    assert!(
        opens(kept, r.id).await.is_some(),
        "the same target kept its code"
    );
    let s = w
        .propose(&t, json!({"channel": "c", "text": "d"}))
        .await
        .unwrap();
    let moved = delivered_code(&w, &d).await;
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/second", json!({}))
        .await
        .unwrap();
    assert!(
        opens(moved, s.id).await.is_none(),
        "the old target's code still opens a card"
    );

    // A retried notification carried a code each attempt: the card session
    // the first attempt's opened ends with the channel too (twenty-sixth
    // pass: only the last attempt's code was ended).
    set_notify(&w.human, "webhook", "http://127.0.0.1:9/retried", json!({}))
        .await
        .unwrap();
    let u = w
        .propose(&t, json!({"channel": "c", "text": "e"}))
        .await
        .unwrap();
    let first = lease_notes(&d, &w.tenant, "30 seconds").await.remove(0);
    assert!(begin(&d, &first).await.unwrap());
    let first_code: String = message_of(&d, &first).await.get("code");
    let first_session = opens(first_code, u.id)
        .await
        .expect("the first attempt's code opens a card");
    complete(&d, &first, "retry", json!({}), Some("0 seconds"))
        .await
        .unwrap();
    let _second_code = delivered_code(&w, &d).await;
    w.human
        .query_one("SELECT keyturn.remove_notify('webhook')", &[])
        .await
        .unwrap();
    let live = count(
        &d,
        "SELECT count(*) FROM keyturn.card_session($1)",
        &[&first_session],
    )
    .await;
    assert_eq!(
        live, 0,
        "the first attempt's card session still acts after the channel went"
    );

    // revoke_links: every code and card session of the person.
    let mine: String = w
        .human
        .query_one(
            "SELECT keyturn.link_code(ARRAY[$1]::uuid[], interval '1 hour')",
            &[&s.id],
        )
        .await
        .unwrap()
        .get(0);
    let n: i32 = w
        .human
        .query_one("SELECT keyturn.revoke_links()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(n >= 1, "revoke_links ended {n}");
    assert!(
        opens(mine, s.id).await.is_none(),
        "a revoked code still opens a card"
    );
    assert_eq!(
        sqlstate(
            w.agent
                .query_one("SELECT keyturn.revoke_links()", &[])
                .await
        ),
        "42501",
        "an agent revokes nothing"
    );
    remove_channels(&w.human).await;
}

/// A channel moved while its message was being made: `set_notify` read no
/// code yet (the message's transaction had not committed) and ended
/// nothing, and the code then sent to the old target opened a card
/// (twenty-seventh red-team pass; docs/security.md, row 138). The message
/// holds the channel's row shared until it commits: the move waits for it,
/// and ends its code.
#[tokio::test]
async fn test_a_channel_moved_while_its_message_is_made_ends_that_code() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("webhook", "http://127.0.0.1:9/leaking", json!({})).await;
    let p = w
        .propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    let l = lease_notes(&d, &w.tenant, "30 seconds").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    let making = connect("app_dispatcher").await;
    making.batch_execute("BEGIN").await.unwrap();
    let code: String = making
        .query_one(
            "SELECT code FROM keyturn.notification_message($1, $2)",
            &[&l.action_id, &l.lease_id],
        )
        .await
        .unwrap()
        .get(0);
    let human = Conn::connect("app_human", w.identity()).await;
    let moving = tokio::spawn(async move {
        set_notify(&human, "webhook", "http://127.0.0.1:9/new", json!({}))
            .await
            .map(|_| ())
    });
    while count(
        &w.superuser,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%set_notify(%'",
        &[],
    )
    .await
        == 0
        && !moving.is_finished()
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    making.batch_execute("COMMIT").await.unwrap();
    moving.await.unwrap().unwrap();
    let opened = d
        .query_opt(
            "SELECT session FROM keyturn.redeem_link_code($1, $2)",
            &[&code, &vec![p.id]],
        )
        .await
        .unwrap();
    assert!(
        opened.is_none(),
        "the code made while the channel moved still opens a card"
    );
    complete(&d, &l, "succeeded", json!({}), None)
        .await
        .unwrap();
    remove_channels(&w.human).await;
}

/// A person's transaction left open after `set_notify` held the channel's
/// row, and the lease waited for it: every tenant's dispatch stalled, and
/// keyturnd's connections with it (twenty-eighth red-team pass;
/// docs/security.md, row 140). The lease leaves that person's notification
/// queued and leases the rest; the message is not read while the channel
/// is being changed (55P03: keyturnd records a retry).
#[tokio::test]
async fn test_a_persons_open_channel_change_holds_no_lease() {
    let _lock = DISPATCH_LOCK.lock().await;
    let (w, t) = notified("webhook", "http://127.0.0.1:9/h", json!({})).await;
    w.propose(&t, json!({"channel": "c", "text": "a"}))
        .await
        .unwrap();
    let d = connect("app_dispatcher").await;
    d.batch_execute("SET statement_timeout = '5s'")
        .await
        .unwrap();
    let changing = w.human.transaction().await.unwrap();
    changing
        .query(
            "SELECT keyturn.set_notify('webhook', 'http://127.0.0.1:9/h2', '{}')",
            &[],
        )
        .await
        .unwrap();
    let leased = lease_notes(&d, &w.tenant, "30 seconds").await;
    assert!(
        leased.is_empty(),
        "leased while its person changes the channel: {leased:?}"
    );
    // Due a little later: a burst of such rows does not fill every lease's
    // first rows (twenty-ninth pass).
    let later = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.notification WHERE tenant = $1 AND status = 'queued' \
           AND kind = 'notice' AND next_attempt_at > clock_timestamp() + interval '2 seconds'",
        &[&w.tenant],
    )
    .await;
    assert_eq!(later, 1, "the skipped notice is due later");
    changing.commit().await.unwrap();
    w.superuser
        .execute(
            "UPDATE keyturn.notification SET next_attempt_at = clock_timestamp() \
              WHERE tenant = $1 AND kind = 'notice'",
            &[&w.tenant],
        )
        .await
        .unwrap();
    let l = lease_notes(&d, &w.tenant, "30 seconds").await.remove(0);
    assert!(begin(&d, &l).await.unwrap());
    // The message, while the person changes the channel again.
    let again = w.human.transaction().await.unwrap();
    again
        .query("SELECT keyturn.remove_notify('webhook')", &[])
        .await
        .unwrap();
    assert_eq!(
        sqlstate(
            d.query_one(
                "SELECT code FROM keyturn.notification_message($1, $2)",
                &[&l.action_id, &l.lease_id],
            )
            .await
        ),
        "55P03",
        "the message waited for the person's transaction"
    );
    again.rollback().await.unwrap();
    complete(&d, &l, "retry", json!({}), None).await.unwrap();
    remove_channels(&w.human).await;
}
