//! End to end, notifications (docs/notifications.md): a person sets a
//! channel as the docs say, an action starts to wait for them, and the real
//! keyturnd sends the notification through the dispatcher protocol to a real
//! receiver on loopback, checked with libraries that are not keyturnd's: the
//! Standard Webhooks library and Slack's Block Kit rules for the webhook,
//! MIME parsing for the email (the fake SMTP server), `py_vapid` and
//! `http_ece` for Web Push. Each link carries a one-time code that works,
//! once. Then the protocol's promises: nothing for an action that stopped
//! waiting before its lease, each approver of a quorum tool once, one
//! reminder, and at most once under kill -9 and a database restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::e2e::{self, connect, Keyturnd, World};
use crate::support::fake_smtp::{self, Script};
use crate::support::python::{self, PyServer};
use crate::support::{random_duration, skipped};

const WITHIN: Duration = Duration::from_secs(30);

/// Where the links point (nothing opens them here).
const PUBLIC_URL: &str = "https://keyturn.example.com";

/// keyturnd's notification settings: links under [`PUBLIC_URL`]. The
/// receivers here are on this host, at URLs that name it (`127.0.0.1`),
/// which keyturnd reaches by default: nothing else is set.
fn notify_env() -> Vec<(&'static str, String)> {
    vec![("KEYTURN_PUBLIC_URL", PUBLIC_URL.into())]
}

/// A fresh Standard Webhooks secret.
fn whsec() -> String {
    format!(
        "whsec_{}",
        STANDARD.encode([Uuid::new_v4().into_bytes(), Uuid::new_v4().into_bytes()].concat())
    )
}

/// `keyturn.set_notify` for the world's person.
async fn set_notify(w: &World, channel: &str, target: &str, settings: Value) {
    w.as_identity(
        &w.human,
        "SELECT keyturn.set_notify($1, $2, $3)::text",
        &[&channel, &target, &settings],
    )
    .await
    .unwrap_or_else(|e| panic!("set_notify {channel}: {e}"));
}

/// Removes the world's channels: what it left queued is cancelled, never
/// sent, when it comes due.
async fn remove_channels(w: &World) {
    for channel in ["email", "webhook", "webpush"] {
        w.as_identity(&w.human, "SELECT keyturn.remove_notify($1)", &[&channel])
            .await
            .expect("remove_notify");
    }
}

/// Proposes as the agent: the action waits for a person. (id, token).
async fn propose(w: &World, tool: &str, params: Value) -> (Uuid, String) {
    let row = w
        .as_identity(
            &w.agent,
            "SELECT action_id, token FROM keyturn.propose($1, $2)",
            &[&tool, &params],
        )
        .await
        .unwrap_or_else(|e| panic!("propose {tool}: {e}"));
    (row.get(0), row.get(1))
}

/// (id, person, channel, kind, status) of each notification about `action`.
async fn notes(w: &World, action: Uuid) -> Vec<(Uuid, String, String, String, String)> {
    w.superuser
        .query(
            "SELECT id, principal, channel::text, kind::text, status::text FROM keyturn.notification \
              WHERE action_id = $1 ORDER BY principal, kind, channel",
            &[&action],
        )
        .await
        .expect("notifications")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// Waits until every notification about `action` has a status in `done`.
async fn wait_notes(w: &World, action: Uuid, done: &[&str]) {
    e2e::eventually(
        WITHIN,
        &format!("the notifications of {action}"),
        || async {
            let n = notes(w, action).await;
            (!n.is_empty() && n.iter().all(|x| done.contains(&x.4.as_str()))).then_some(())
        },
    )
    .await
}

/// Waits until every notice about `action` was sent (its reminder is due
/// later).
async fn wait_sent(w: &World, action: Uuid) {
    e2e::eventually(WITHIN, &format!("the notices of {action}"), || async {
        let n: Vec<_> = notes(w, action)
            .await
            .into_iter()
            .filter(|x| x.3 == "notice")
            .collect();
        (!n.is_empty() && n.iter().all(|x| x.4 == "succeeded")).then_some(())
    })
    .await
}

/// The code of a card link, and the action ids it names.
fn code_of(link: &str) -> (String, Vec<Uuid>) {
    let url = url::Url::parse(link).expect("a URL");
    assert_eq!(url.path(), "/card", "{link}");
    assert!(url.query().is_none(), "nothing in the query: {link}");
    let mut ids = Vec::new();
    let mut code = None;
    for pair in url.fragment().expect("a fragment").split('&') {
        match pair.split_once('=') {
            Some(("a", id)) => ids.push(id.parse().expect("an action id")),
            Some(("c", c)) => {
                code = Some(
                    percent_encoding::percent_decode_str(c)
                        .decode_utf8()
                        .expect("UTF-8")
                        .into_owned(),
                )
            }
            other => panic!("a fragment parameter of another kind: {other:?} in {link}"),
        }
    }
    (code.expect("a code"), ids)
}

/// Redeems a link's code once as keyturnd's `/card/session` does: its
/// card's role; a second redemption gets nothing.
async fn redeems_once(d: &Client, link: &str) -> Option<String> {
    let (code, ids) = code_of(link);
    let row = d
        .query_opt(
            "SELECT db_role FROM keyturn.redeem_link_code($1, $2)",
            &[&code, &ids],
        )
        .await
        .expect("redeem_link_code")?;
    let again = d
        .query_opt(
            "SELECT 1 FROM keyturn.redeem_link_code($1, $2)",
            &[&code, &ids],
        )
        .await
        .expect("redeem_link_code");
    assert!(again.is_none(), "a code works once");
    row.get(0)
}

/// What must never appear in a message or keyturnd's log.
fn assert_carries_no_credential(text: &str, token: &str, code: &str, what: &str) {
    assert!(!text.contains(token), "{what} holds the action's token");
    assert!(!text.contains("eyJ"), "{what} holds something JWT-shaped");
    if !code.is_empty() {
        assert!(!text.contains(code), "{what} holds the link code");
    }
}

#[tokio::test]
async fn test_a_webhook_notification_is_a_signed_slack_message_with_a_working_card_link() {
    let port = require_db!();
    let Some(python) = python::standard_webhooks(test_name!()) else {
        return;
    };
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let secret = whsec();
    let rx = PyServer::start(
        &python,
        &python::script("notify_receiver.py"),
        &[&secret, "webhook"],
    )
    .await;
    set_notify(&w, "webhook", &rx.url("/hook"), json!({"secret": secret})).await;
    let k = Keyturnd::start(port, notify_env()).await;
    let (id, token) = propose(&w, &tool, json!({"text": "ship <it> & *now*"})).await;
    wait_sent(&w, id).await;
    let log = k.stop().await;

    let events = rx.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(
        e["verified"], true,
        "the Standard Webhooks library verified it: {e}"
    );
    assert_eq!(
        e["slack"],
        json!([]),
        "a Slack message with one button: {e}"
    );
    let body: Value = serde_json::from_str(e["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["type"], "keyturn.notification");
    assert_eq!(body["data"]["kind"], "notice");
    assert_eq!(
        body["data"]["actions"][0]["summary"],
        "Notify: \"ship <it> & *now*\""
    );
    let link = body["data"]["link"].as_str().unwrap();
    assert!(
        link.starts_with(&format!("{PUBLIC_URL}/card#a={id}&c=")),
        "{link}"
    );
    assert_eq!(body["blocks"][1]["elements"][0]["url"], link);
    let notice = notes(&w, id)
        .await
        .into_iter()
        .find(|n| n.3 == "notice")
        .unwrap();
    assert_eq!(
        e["headers"]["webhook-id"],
        format!("keyturn-notify-{}", notice.0)
    );
    assert!(body.get("params").is_none());
    let (code, _) = code_of(link);
    assert_carries_no_credential(e["body"].as_str().unwrap(), &token, "", "the webhook");
    assert_carries_no_credential(&log, &token, &code, "keyturnd's log");
    let d = connect(port, "app_dispatcher").await;
    assert_eq!(redeems_once(&d, link).await.as_deref(), Some("app_human"));
    remove_channels(&w).await;
}

#[tokio::test]
async fn test_an_email_notification_has_a_text_and_an_html_part_and_one_link() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let (smtp, mail) = fake_smtp::start(Script::default()).await;
    set_notify(&w, "email", "ann@acme.example", json!({})).await;
    let mut env = notify_env();
    env.push(("KEYTURN_SMTP_URL", format!("smtp://{smtp}")));
    env.push((
        "KEYTURN_SMTP_FROM",
        "keyturn <noreply@keyturn.example>".into(),
    ));
    let k = Keyturnd::start(port, env).await;
    let (id, token) = propose(
        &w,
        &tool,
        json!({"text": "<a href=\"http://evil.example\">click</a>\r\nBcc: eve@evil.example"}),
    )
    .await;
    wait_sent(&w, id).await;
    let log = k.stop().await;

    let delivered = mail.delivered();
    assert_eq!(delivered.len(), 1);
    let m = &delivered[0];
    assert_eq!(m.rcpt_to, vec!["<ann@acme.example>".to_owned()]);
    let parsed = mailparse::parse_mail(m.data.as_bytes()).expect("MIME");
    assert_eq!(parsed.ctype.mimetype, "multipart/alternative");
    let text = parsed.subparts[0].get_body().unwrap();
    let html = parsed.subparts[1].get_body().unwrap();
    assert_eq!(parsed.subparts[0].ctype.mimetype, "text/plain");
    assert_eq!(parsed.subparts[1].ctype.mimetype, "text/html");
    // The card link is the one link; the summary's markup is text.
    assert_eq!(html.matches("<a ").count(), 1, "{html}");
    assert!(!html.contains("href=\"http://evil"), "{html}");
    let link = text
        .lines()
        .find_map(|l| l.strip_prefix("Open the card: "))
        .expect("the link line")
        .trim()
        .to_owned();
    assert!(
        link.starts_with(&format!("{PUBLIC_URL}/card#a={id}&c=")),
        "{link}"
    );
    assert!(html.contains(&link.replace('&', "&amp;")), "{html}");
    // A line break in the summary added no header.
    assert!(parsed
        .headers
        .iter()
        .all(|h| !h.get_key().eq_ignore_ascii_case("bcc")));
    let (code, _) = code_of(&link);
    assert_carries_no_credential(&m.data, &token, "", "the email");
    assert_carries_no_credential(&log, &token, &code, "keyturnd's log");
    let d = connect(port, "app_dispatcher").await;
    assert_eq!(redeems_once(&d, &link).await.as_deref(), Some("app_human"));
    remove_channels(&w).await;
}

#[tokio::test]
async fn test_a_web_push_notification_is_vapid_signed_and_decrypts_to_the_card_link() {
    let port = require_db!();
    let Some(python) = python::webpush(test_name!()) else {
        return;
    };
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let push = PyServer::start(
        &python,
        &python::script("notify_receiver.py"),
        &[&whsec(), "push"],
    )
    .await;
    let subscription = push.first["subscription"].to_string();
    set_notify(&w, "webpush", &subscription, json!({})).await;
    let (private, public) = keyturnd::config::VapidKey::generate();
    let mut env = notify_env();
    env.push(("KEYTURN_VAPID_PRIVATE_KEY", private.expose().to_owned()));
    env.push(("KEYTURN_VAPID_SUBJECT", "mailto:ops@keyturn.example".into()));
    let k = Keyturnd::start(port, env).await;

    // The card's side: the key to subscribe with, the worker, the manifest,
    // with the Content-Security-Policy of every page.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let key: Value = http
        .get(format!("{}/card/push-key", k.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(key["public_key"], public.as_str());
    for (path, content_type) in [
        ("/card/sw.js", "text/javascript; charset=utf-8"),
        ("/card/manifest.webmanifest", "application/manifest+json"),
        ("/card/push.js", "text/javascript; charset=utf-8"),
    ] {
        let r = http.get(format!("{}{path}", k.base)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], content_type, "{path}");
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self';"), "{path}: {csp}");
        if path == "/card/sw.js" {
            assert_eq!(r.headers()["service-worker-allowed"], "/card");
        }
    }

    let (id, token) = propose(&w, &tool, json!({"text": "push me"})).await;
    wait_sent(&w, id).await;
    let log = k.stop().await;

    let events = push.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["vapid"], true, "py_vapid verified the VAPID JWT: {e}");
    assert_eq!(e["error"], Value::Null, "{e}");
    assert_eq!(e["claims"]["sub"], "mailto:ops@keyturn.example");
    assert_eq!(
        e["claims"]["aud"],
        format!("http://127.0.0.1:{}", push.port())
    );
    let exp = e["claims"]["exp"].as_i64().unwrap();
    let now = chrono::Utc::now().timestamp();
    assert!(
        exp > now && exp <= now + 24 * 3600,
        "RFC 8292: at most a day ahead"
    );
    assert_eq!(e["headers"]["content-encoding"], "aes128gcm");
    assert_eq!(e["headers"]["urgency"], "high");
    let notice = notes(&w, id)
        .await
        .into_iter()
        .find(|n| n.3 == "notice")
        .unwrap();
    assert_eq!(e["headers"]["topic"], notice.0.simple().to_string());
    let ttl: i64 = e["headers"]["ttl"].as_str().unwrap().parse().unwrap();
    assert!(ttl > 0 && ttl <= 24 * 3600, "{ttl}");
    // What http_ece decrypted with the subscription's private key.
    let payload = &e["payload"];
    assert_eq!(payload["title"], "Approval needed: Notify: \"push me\"");
    let link = payload["url"].as_str().unwrap();
    assert!(
        link.starts_with(&format!("{PUBLIC_URL}/card#a={id}&c=")),
        "{link}"
    );
    let (code, _) = code_of(link);
    assert_carries_no_credential(&log, &token, &code, "keyturnd's log");
    let d = connect(port, "app_dispatcher").await;
    assert_eq!(redeems_once(&d, link).await.as_deref(), Some("app_human"));
    remove_channels(&w).await;
}

/// keyturnd with the fake SMTP server, and the server's log.
async fn with_email(port: u16) -> (Keyturnd, fake_smtp::Log) {
    let (smtp, mail) = fake_smtp::start(Script::default()).await;
    let mut env = notify_env();
    env.push(("KEYTURN_SMTP_URL", format!("smtp://{smtp}")));
    env.push((
        "KEYTURN_SMTP_FROM",
        "keyturn <noreply@keyturn.example>".into(),
    ));
    (Keyturnd::start(port, env).await, mail)
}

/// The actions each delivered email links to.
fn linked(mail: &fake_smtp::Log) -> Vec<(String, Vec<Uuid>)> {
    mail.delivered()
        .iter()
        .map(|m| {
            let parsed = mailparse::parse_mail(m.data.as_bytes()).expect("MIME");
            let text = parsed.subparts[0].get_body().unwrap();
            let link = text
                .lines()
                .find_map(|l| l.strip_prefix("Open the card: "))
                .expect("the link line")
                .trim()
                .to_owned();
            (m.rcpt_to.join(","), code_of(&link).1)
        })
        .collect()
}

#[tokio::test]
async fn test_nothing_is_sent_for_an_action_that_stopped_waiting_before_its_lease() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let short = w.webhook_tool(json!({"expires_in": "1 second"})).await;
    set_notify(&w, "email", "ann@acme.example", json!({})).await;
    // Decided, rejected, expired, cancelled (its session ended), all before
    // any keyturnd runs; and one still waiting.
    let (approved, t1) = propose(&w, &tool, json!({"text": "approved"})).await;
    w.as_identity(
        &w.human,
        "SELECT status FROM keyturn.approve($1, $2)",
        &[&approved, &t1],
    )
    .await
    .unwrap();
    let (rejected, t2) = propose(&w, &tool, json!({"text": "rejected"})).await;
    w.as_identity(
        &w.human,
        "SELECT keyturn.reject($1, $2, 'no')",
        &[&rejected, &t2],
    )
    .await
    .unwrap();
    let (expired, _) = propose(&w, &short, json!({"text": "expired"})).await;
    let (cancelled, _) = propose(&w, &tool, json!({"text": "cancelled"})).await;
    w.as_identity(
        &w.agent,
        "SELECT keyturn.end_session(keyturn.current_session())",
        &[],
    )
    .await
    .unwrap();
    e2e::eventually(WITHIN, "the short one's expiry", || async {
        w.superuser
            .query_one(
                "SELECT expires_at < clock_timestamp() FROM keyturn.action WHERE id = $1",
                &[&expired],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
            .then_some(())
    })
    .await;
    let mut w2 = World::new(port).await;
    w2.tenant = w.tenant.clone();
    w2.principal = w.principal.clone();
    let (waiting, _) = propose(&w2, &tool, json!({"text": "waiting"})).await;
    let (k, mail) = with_email(port).await;
    wait_sent(&w, waiting).await;
    for id in [approved, rejected, expired, cancelled] {
        wait_notes(&w, id, &["cancelled"]).await;
    }
    k.stop().await;
    let sent = linked(&mail);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].1, vec![waiting]);
    let attempts = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.attempt t JOIN keyturn.notification n ON n.id = t.action_id \
              WHERE n.action_id = ANY ($1)",
            &[&vec![approved, rejected, expired, cancelled]],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(attempts, 0, "nothing begun for them");
    remove_channels(&w).await;
}

#[tokio::test]
async fn test_each_approver_of_a_quorum_tool_is_notified_once() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w
        .webhook_tool(json!({"approval": "independent", "quorum": 2}))
        .await;
    let mut approvers = Vec::new();
    for i in 0..3 {
        let mut a = World::new(port).await;
        a.tenant = w.tenant.clone();
        w.admin
            .execute(
                "SELECT keyturn.add_member($1, $2, 'approver')",
                &[&a.tenant, &a.principal],
            )
            .await
            .unwrap();
        w.admin
            .execute(
                "SELECT keyturn.grant_tool($1, $2, $3)",
                &[&a.tenant, &a.principal, &tool],
            )
            .await
            .unwrap();
        set_notify(&a, "email", &format!("approver{i}@acme.example"), json!({})).await;
        approvers.push(a);
    }
    set_notify(&w, "email", "proposer@acme.example", json!({})).await;
    let (k, mail) = with_email(port).await;
    let (id, _) = propose(&w, &tool, json!({"text": "pay"})).await;
    e2e::eventually(WITHIN, "three notices", || async {
        (mail.delivered().len() >= 3).then_some(())
    })
    .await;
    wait_sent(&w, id).await;
    k.stop().await;
    let mut to: Vec<String> = linked(&mail)
        .into_iter()
        .map(|(to, ids)| {
            assert_eq!(ids, vec![id]);
            to
        })
        .collect();
    to.sort();
    assert_eq!(
        to,
        vec![
            "<approver0@acme.example>",
            "<approver1@acme.example>",
            "<approver2@acme.example>"
        ]
    );
    for a in &approvers {
        remove_channels(a).await;
    }
    remove_channels(&w).await;
}

#[tokio::test]
async fn test_one_reminder_before_the_action_expires() {
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({"expires_in": "40 seconds"})).await;
    set_notify(
        &w,
        "email",
        "ann@acme.example",
        json!({"remind_before": "38 seconds"}),
    )
    .await;
    let (k, mail) = with_email(port).await;
    let (id, _) = propose(&w, &tool, json!({"text": "remind me"})).await;
    // Both come due within seconds; when neither is queued any more,
    // nothing else is left to send.
    wait_notes(&w, id, &["succeeded"]).await;
    k.stop().await;
    let kinds: Vec<String> = notes(&w, id).await.into_iter().map(|n| n.3).collect();
    assert_eq!(kinds, vec!["notice", "reminder"]);
    let subjects: Vec<String> = mail
        .delivered()
        .iter()
        .map(|m| {
            mailparse::parse_mail(m.data.as_bytes())
                .unwrap()
                .headers
                .iter()
                .find(|h| h.get_key().eq_ignore_ascii_case("subject"))
                .unwrap()
                .get_value()
        })
        .collect();
    assert_eq!(subjects.len(), 2, "{subjects:?}");
    assert!(subjects[0].starts_with("Approval needed"), "{subjects:?}");
    assert!(subjects[1].starts_with("Reminder"), "{subjects:?}");
    remove_channels(&w).await;
}

/// A webhook receiver that counts requests by `webhook-id` and answers 200
/// after a random pause (a notification in flight when keyturnd dies).
#[derive(Clone, Default)]
struct Hooks {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Hooks {
    async fn start(&self) -> String {
        async fn receive(State(h): State<Hooks>, headers: HeaderMap, _body: Bytes) -> &'static str {
            let id = headers
                .get("webhook-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            h.seen.lock().unwrap().push(id);
            tokio::time::sleep(random_duration(Duration::from_millis(300))).await;
            "ok"
        }
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}/hook")
    }

    fn count(&self, id: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| *s == id)
            .count()
    }
}

#[tokio::test]
async fn test_at_most_once_under_kill_9_and_a_postgres_restart() {
    let port = require_db!();
    if std::env::var("KT_PGDATA").is_err() {
        skipped(
            test_name!(),
            "KT_PGDATA is not set: this test restarts the cluster",
        );
        return;
    }
    let _serial = e2e::serial().await;
    let mut w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let hooks = Hooks::default();
    let url = hooks.start().await;
    // No reminder (7 days before a 15-minute expiry is past), and no
    // hourly cap in the way.
    set_notify(
        &w,
        "webhook",
        &url,
        json!({"secret": whsec(), "remind_before": "7 days", "max_per_hour": 1000}),
    )
    .await;
    let mut ids = Vec::new();
    let cycles = 6;
    for cycle in 0..cycles {
        for i in 0..4 {
            ids.push(
                propose(&w, &tool, json!({"text": format!("{cycle}.{i}")}))
                    .await
                    .0,
            );
        }
        let mut k = Keyturnd::spawn(port, notify_env());
        tokio::time::sleep(random_duration(Duration::from_millis(600))).await;
        if cycle == cycles / 2 {
            // The database goes away under a keyturnd that may be sending.
            e2e::restart_postgres("fast");
            w.reconnect().await;
        }
        k.kill9().await;
    }
    // The last keyturnd settles everything: lapsed leases swept, in-flight
    // ones uncertain, the rest sent.
    let k = Keyturnd::start(port, notify_env()).await;
    for id in &ids {
        wait_notes(&w, *id, &["succeeded", "failed", "uncertain"]).await;
    }
    k.stop().await;
    let (mut sent, mut uncertain) = (0, 0);
    for id in &ids {
        for (nid, _, _, kind, status) in notes(&w, *id).await {
            assert_eq!(kind, "notice");
            let requests = hooks.count(&format!("keyturn-notify-{nid}"));
            assert!(requests <= 1, "{nid} ({status}) sent {requests} times");
            match status.as_str() {
                "succeeded" => {
                    assert_eq!(requests, 1, "{nid} succeeded without a request");
                    sent += 1;
                }
                "uncertain" => uncertain += 1,
                other => panic!("{nid} is {other}"),
            }
        }
    }
    eprintln!(
        "notifications: {} sent once, {uncertain} uncertain (in flight at a kill), none twice",
        sent
    );
    let op = connect(port, "app_operator").await;
    for row in op
        .query("SELECT action_id FROM keyturn.uncertain_actions() WHERE tool = 'keyturn.notify.webhook'", &[])
        .await
        .unwrap()
    {
        let nid: Uuid = row.get(0);
        if w.superuser
            .query_opt("SELECT 1 FROM keyturn.notification WHERE id = $1 AND tenant = $2", &[&nid, &w.tenant])
            .await
            .unwrap()
            .is_some()
        {
            op.execute("SELECT keyturn.reconcile($1, 'failed', 'test: settled')", &[&nid])
                .await
                .unwrap();
        }
    }
    remove_channels(&w).await;
}

#[tokio::test]
async fn test_a_target_that_resolves_to_an_internal_address_is_never_reached() {
    // A person's webhook pointed at a service on keyturnd's own host (the
    // database accepts http to loopback, for development), where the
    // deployment refuses loopback (KEYTURN_NOTIFY_LOOPBACK=false) and
    // allows no network: keyturnd resolves the name, refuses the address
    // and connects nowhere. (A name other than localhost that resolves to
    // loopback is refused by default: net.rs's unit tests.)
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let internal = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!(
        "http://localhost:{}/admin",
        internal.local_addr().unwrap().port()
    );
    set_notify(&w, "webhook", &target, json!({"secret": whsec()})).await;
    let k = Keyturnd::start(
        port,
        vec![
            ("KEYTURN_PUBLIC_URL", PUBLIC_URL.into()),
            ("KEYTURN_NOTIFY_LOOPBACK", "false".into()),
        ],
    )
    .await;
    let (id, _) = propose(&w, &tool, json!({"text": "reach inside"})).await;
    e2e::eventually(WITHIN, "the notice to fail", || async {
        notes(&w, id)
            .await
            .iter()
            .any(|n| n.3 == "notice" && n.4 == "failed")
            .then_some(())
    })
    .await;
    k.stop().await;
    let receipt: Value = w
        .superuser
        .query_one(
            "SELECT receipt FROM keyturn.notification WHERE action_id = $1 AND kind = 'notice'",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(receipt["sent"], false, "{receipt}");
    // Every connection made would be queued here by now: there is none.
    let accepted = tokio::time::timeout(Duration::from_millis(100), internal.accept()).await;
    assert!(
        accepted.is_err(),
        "keyturnd connected to the internal address"
    );
    remove_channels(&w).await;
}
