//! The browser layer: the approval card and the operator console in a real
//! headless Chromium, as the person and the operator use them, against the
//! real keyturnd and the private cluster. Run with `KT_ONLY=browser
//! tests/run-all`; elsewhere each test says it skipped and why.

use std::time::{Duration, Instant};

use fantoccini::key::Key;
use fantoccini::{Client, Locator};
use serde_json::{json, Value};

use crate::e2e_rpc::assert_no_secret;
use crate::support::browser::{
    self, code_link, exists, js, link_params, screenshot, wait_js, wait_loaded, wait_status,
    PHONE_WIDTH,
};
use crate::support::e2e::{self, unique, Keyturnd, Receiver, Reply, World};
use crate::support::fake_smtp::{self, Script};
use crate::support::web::{self, post_rpc};

const WITHIN: Duration = Duration::from_secs(20);

async fn keyturnd(w: &World, mut env: Vec<(&'static str, String)>) -> Keyturnd {
    web::authenticator(&w.superuser).await;
    env.extend(web::rpc_env(w.port));
    Keyturnd::start(w.port, env).await
}

/// Opens `url` afresh: a link that differs from the page's only in its
/// fragment would otherwise reach the open card as a hashchange. A link
/// with a code is then opened as a person does, with a tap on Open: the
/// card spends a code on nothing else (docs/security.md, row 139).
async fn visit(c: &Client, url: &str) -> Result<(), fantoccini::error::CmdError> {
    load(c, url).await?;
    let coded = url
        .split_once('#')
        .is_some_and(|(_, fragment)| fragment.split('&').any(|p| p.starts_with("c=")));
    if coded {
        c.wait()
            .at_most(WITHIN)
            .for_element(Locator::Css("[data-kt=open]"))
            .await?
            .click()
            .await?;
    }
    Ok(())
}

/// [`visit`] without the person's tap: what a mail scanner or a chat
/// preview does with a link.
async fn load(c: &Client, url: &str) -> Result<(), fantoccini::error::CmdError> {
    c.goto("about:blank").await?;
    c.goto(url).await
}

async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .expect("text")
}

async fn approve_disabled(c: &Client) -> bool {
    js(
        c,
        "return document.querySelector('[data-kt=approve]').disabled",
        vec![],
    )
    .await
        == json!(true)
}

/// A link opened by something that runs the page and taps nothing (a mail
/// security scanner, a chat preview) spent its one-time code: the card
/// redeemed it on load, and the person's tap on the link then answered
/// "already used" (twenty-fourth red-team pass; docs/security.md, row 139).
/// The card now redeems only when Open is tapped.
#[tokio::test]
async fn test_loading_a_link_spends_nothing_until_the_person_taps_open() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let (tool, deals) = w.deal_tool(1).await;
    let p = w
        .propose(
            &tool,
            json!({"where": {"id": deals[0]}, "set": {"stage": "won"}}),
        )
        .await;
    let link = code_link(&w, &k.base, &[(&p, None)]).await;
    let scanner = browser::open(&webdriver, false).await;
    load(&scanner, &link)
        .await
        .expect("the scanner loads the link");
    scanner
        .wait()
        .at_most(WITHIN)
        .for_element(Locator::Css("[data-kt=open]"))
        .await
        .expect("the card offers Open");
    // Long enough for a redemption on load to have been answered.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let redeemed = w
        .superuser
        .query_one(
            "SELECT count(*) FROM keyturn.card_link WHERE $1 = ANY (action_ids) AND redeemed_at IS NOT NULL",
            &[&p.id],
        )
        .await
        .expect("card_link")
        .get::<_, i64>(0);
    assert_eq!(redeemed, 0, "loading the link spent its code");
    scanner.close().await.expect("close");

    let person = browser::open(&webdriver, false).await;
    visit(&person, &link)
        .await
        .expect("the person opens the link");
    wait_loaded(&person).await;
    assert_eq!(
        text(&person, "[data-kt=summary]").await,
        "Set stage won on 1 deal(s)"
    );
    person.close().await.expect("close");
}

#[tokio::test]
async fn test_card_shows_the_change_approves_once_and_says_when_the_record_changed() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let (tool, deals) = w.deal_tool(3).await;
    let propose = |deal: i64, stage: &'static str| {
        let w = &w;
        let tool = tool.clone();
        async move {
            w.propose(
                &tool,
                json!({"where": {"id": deal}, "set": {"stage": stage}}),
            )
            .await
        }
    };
    let p = propose(deals[0], "won").await;

    let c = browser::open(&webdriver, false).await;
    visit(&c, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open the card");
    wait_loaded(&c).await;
    assert_eq!(
        text(&c, "[data-kt=summary]").await,
        "Set stage won on 1 deal(s)"
    );
    assert!(text(&c, "[data-kt=effect]").await.contains("Reversible"));
    assert_eq!(text(&c, "[data-kt=blast]").await, "Affects 1 record");
    let target = text(&c, &format!("[data-kt=target][data-key=\"{}\"]", deals[0])).await;
    assert!(
        target.contains("qualified") && target.contains("won"),
        "{target}"
    );
    assert!(text(&c, "[data-kt=expires]")
        .await
        .starts_with("Expires in"));
    // The spent code left the address bar; the card session is this tab's.
    let url = c.current_url().await.expect("url");
    assert!(!url.as_str().contains("c="), "{url}");
    assert!(url.as_str().contains(&p.id.to_string()), "{url}");
    assert!(url.query().is_none(), "nothing in a query string: {url}");
    let kept = js(
        &c,
        "return JSON.parse(sessionStorage.getItem('keyturn.card'))",
        vec![],
    )
    .await;
    assert!(
        kept["session"].as_str().unwrap_or("").starts_with("kts_"),
        "{kept}"
    );
    assert_eq!(
        js(&c, "return sessionStorage.getItem('keyturn.jwt')", vec![]).await,
        Value::Null
    );
    screenshot(&c, "card-desktop").await;

    // A double tap: the second click meets a disabled button.
    let disabled_after_first = js(
        &c,
        "const b = document.querySelector('[data-kt=approve]'); b.click(); b.click(); return b.disabled;",
        vec![],
    )
    .await;
    assert_eq!(disabled_after_first, json!(true));
    let said = wait_status(&c, &p.id.to_string(), "succeeded").await;
    assert!(said.starts_with("Done"), "{said}");
    assert!(approve_disabled(&c).await);
    assert_eq!(w.deal_writes(deals[0]).await, 1, "the row changed once");
    assert_eq!(w.deal_stage(deals[0]).await, "won");
    assert_eq!(w.events_to(p.id, "succeeded").await, 1);
    assert_eq!(w.usage_rows(p.id).await, 1);
    // Reloaded (the card session from this tab's storage), it shows the outcome.
    c.refresh().await.expect("reload");
    wait_loaded(&c).await;
    wait_status(&c, &p.id.to_string(), "succeeded").await;
    assert!(approve_disabled(&c).await);
    assert_eq!(w.deal_writes(deals[0]).await, 1);

    // Someone edits the deal between the proposal and the approval.
    let stale = propose(deals[1], "lost").await;
    w.superuser
        .execute(
            "UPDATE crm.deal SET name = name || ' (edited)' WHERE id = $1",
            &[&deals[1]],
        )
        .await
        .expect("edit the deal");
    visit(&c, &code_link(&w, &k.base, &[(&stale, None)]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    c.find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    let said = wait_status(&c, &stale.id.to_string(), "conflict").await;
    assert_eq!(said, "The record changed since the proposal; ask again.");
    assert_eq!(w.deal_stage(deals[1]).await, "qualified");
    c.close().await.expect("close");

    // On a phone, by keyboard: Tab to Approve (its focus visible), Enter.
    let phone = propose(deals[2], "negotiation").await;
    let c = browser::open(&webdriver, true).await;
    visit(&c, &code_link(&w, &k.base, &[(&phone, None)]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    let layout = js(
        &c,
        "const b = document.querySelector('[data-kt=approve]').getBoundingClientRect(); \
         return {width: window.innerWidth, scroll: document.documentElement.scrollWidth, right: b.right};",
        vec![],
    )
    .await;
    assert_eq!(layout["width"], json!(PHONE_WIDTH), "{layout}");
    assert!(
        layout["scroll"].as_f64() <= Some(PHONE_WIDTH as f64),
        "no sideways scrolling: {layout}"
    );
    assert!(
        layout["right"].as_f64() <= Some(PHONE_WIDTH as f64),
        "{layout}"
    );
    screenshot(&c, "card-mobile").await;
    let body = c.find(Locator::Css("body")).await.expect("body");
    let mut focused = Value::Null;
    for _ in 0..20 {
        body.send_keys(&Key::Tab).await.expect("tab");
        focused = js(
            &c,
            "const a = document.activeElement; return {kt: a.dataset.kt || null, outline: getComputedStyle(a).outlineStyle, label: a.textContent};",
            vec![],
        )
        .await;
        if focused["kt"] == "approve" {
            break;
        }
    }
    assert_eq!(focused["kt"], "approve", "Approve is reachable by Tab");
    assert_ne!(focused["outline"], "none", "focus is visible: {focused}");
    c.active_element()
        .await
        .expect("focused")
        .send_keys(&Key::Enter)
        .await
        .expect("enter");
    wait_status(&c, &phone.id.to_string(), "succeeded").await;
    assert_eq!(w.deal_stage(deals[2]).await, "negotiation");
    c.close().await.expect("close");

    let log = k.stop().await;
    assert_no_secret(&log, &[&p.token, &stale.token, &phone.token]);
}

#[tokio::test]
async fn test_card_refuses_expired_proposals_used_codes_and_credentials_in_the_url() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let tool = w.webhook_tool(json!({})).await;
    let jwt = w.human_jwt();

    // Opened in time, it counts down and then offers nothing. The link lives
    // no longer than the action, so on a machine slow enough that the card
    // opened only after the action expired, it tries again with a longer
    // life: what is tested is the countdown, not the machine's speed.
    let c = browser::open(&webdriver, false).await;
    let mut life = 3;
    let late = loop {
        let quick = w
            .webhook_tool(json!({"expires_in": format!("{life} seconds")}))
            .await;
        let opened = Instant::now();
        let late = w.propose(&quick, json!({"text": "too late"})).await;
        let link = code_link(&w, &k.base, &[(&late, None)]).await;
        visit(&c, &link).await.expect("open");
        wait_loaded(&c).await;
        if exists(&c, "[data-kt=summary]").await {
            break late;
        }
        assert!(
            opened.elapsed() >= Duration::from_secs(life) && life < 12,
            "the card refused a link opened in time"
        );
        life *= 2;
    };
    let said = wait_js(
        &c,
        "the card to say expired",
        "const e = document.querySelector('[data-kt=expires][data-expired]'); \
         const s = document.querySelector('[data-kt=status][data-status=expired]'); \
         return (e && e.textContent) || (s && s.textContent);",
        vec![],
    )
    .await;
    assert!(said.as_str().unwrap_or("").starts_with("Expired"), "{said}");
    assert!(approve_disabled(&c).await);
    // Forced through anyway with the card's own token, the database says
    // the same.
    let token = js(
        &c,
        "return JSON.parse(sessionStorage.getItem('keyturn.card')).tokens[arguments[0]]",
        vec![json!(late.id.to_string())],
    )
    .await;
    let (_, _, rows) = post_rpc(
        &k.base,
        "approve",
        Some(&jwt),
        &json!({"action_id": late.id.to_string(), "token": token}),
    )
    .await;
    assert_eq!(rows[0]["status"], "expired", "{rows}");

    // A code that is used, or that nobody made: the card says the link does
    // not work and shows nothing of the action.
    let p = w.propose(&tool, json!({"text": "secret plans"})).await;
    let link = code_link(&w, &k.base, &[(&p, None)]).await;
    let code = url::form_urlencoded::parse(link.split_once('#').unwrap().1.as_bytes())
        .find(|(k, _)| k == "c")
        .map(|(_, v)| v.into_owned())
        .expect("the link's code");
    let (status, _, _) = web::post_json(
        &format!("{}/card/session", k.base),
        None,
        &json!({"code": code, "action_ids": [p.id]}),
    )
    .await;
    assert_eq!(status, 200, "someone else opened the link first");
    let forged = browser::link_with_code(&k.base, &[(&p, None)], "kt_made-up");
    for (what, url) in [("used", link.as_str()), ("forged", forged.as_str())] {
        visit(&c, url).await.expect("open");
        wait_loaded(&c).await;
        let error = text(&c, "[data-kt=error]:not([hidden])").await;
        assert!(
            error.contains("already used or has expired"),
            "{what}: {error}"
        );
        assert!(!exists(&c, "[data-kt=summary]").await, "{what}");
        assert!(!exists(&c, "[data-kt=approve]").await, "{what}");
    }
    c.close().await.expect("close");

    // A link with a token and the person's own JWT in the fragment, in a
    // tab where nobody signed in: the card never reads the JWT, and a token
    // is nothing without one; it stores nothing, shows nothing, and takes
    // both out of the address bar.
    let c = browser::open(&webdriver, false).await;
    visit(
        &c,
        &format!("{}/card#a={}&t={}&j={jwt}", k.base, p.id, p.token),
    )
    .await
    .expect("open");
    wait_loaded(&c).await;
    let error = text(&c, "[data-kt=error]:not([hidden])").await;
    assert!(error.contains("holds no code"), "{error}");
    assert!(!exists(&c, "[data-kt=summary]").await);
    let page = js(&c, "return document.body.innerText", vec![]).await;
    assert!(
        !page.as_str().unwrap_or("").contains("secret plans"),
        "{page}"
    );
    assert_eq!(
        js(&c, "return sessionStorage.length", vec![]).await,
        json!(0)
    );
    assert_eq!(
        js(&c, "return location.hash", vec![]).await,
        json!(format!("#a={}", p.id))
    );
    c.close().await.expect("close");
    assert_eq!(w.status(p.id).await, "pending");

    let log = k.stop().await;
    assert_no_secret(&log, &[&jwt, &p.token, &late.token]);
}

/// A link opened, approved, the browser closed: its history database (what
/// sync and the address bar's suggestions draw on) holds the link, and
/// nothing in it works any more: each code is spent, and no session, token
/// or JWT was ever in a URL.
#[tokio::test]
async fn test_the_browsers_history_holds_nothing_that_works() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = keyturnd(&w, rx.env()).await;
    let tool = w.webhook_tool(json!({})).await;
    let p = w
        .propose(&tool, json!({"text": "from a notification"}))
        .await;
    let link = code_link(&w, &k.base, &[(&p, None)]).await;

    let (c, profile) = browser::open_profile(&webdriver, true).await;
    visit(&c, &link).await.expect("open");
    wait_loaded(&c).await;
    // A card session (whoever holds the link) never subscribes a device.
    assert!(
        !shown(&c, "push-box").await,
        "no Web Push in a card session"
    );
    let (bearer, token) = approve_in_the_card(&c, p.id).await;
    c.close().await.expect("quit the browser");

    history_holds_nothing_that_works(&profile, &k.base, &[&bearer, &token, &p.token]).await;
    assert_eq!(rx.requests(p.id).len(), 1);
    let log = k.stop().await;
    assert_no_secret(&log, &[&bearer, &token, &p.token]);
}

/// Issue 31's phone: a person who set an email channel gets the
/// notification keyturnd sends when an action starts to wait; its link opens
/// the card once in Chromium, approves, and leaves nothing that works in
/// the profile's history. The card links the web app manifest, the service
/// worker registers under `/card`, and both answer under the pages' one
/// Content-Security-Policy; with a VAPID key the person's queue offers
/// "Notify me on this device" (headless Chromium reaches no push service,
/// so the subscription itself is e2e_notify's, against a local endpoint).
#[tokio::test]
async fn test_a_notifications_link_opens_the_card_once_on_a_phone() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let (smtp, mail) = fake_smtp::start(Script::default()).await;
    let (vapid, _) = keyturnd::config::VapidKey::generate();
    let mut env = rx.env();
    env.extend([
        // Where links point; the test opens them at keyturnd's address.
        (
            "KEYTURN_PUBLIC_URL",
            "https://keyturn.example.com".to_owned(),
        ),
        ("KEYTURN_SMTP_URL", format!("smtp://{smtp}")),
        (
            "KEYTURN_SMTP_FROM",
            "keyturn <noreply@keyturn.example>".into(),
        ),
        ("KEYTURN_VAPID_PRIVATE_KEY", vapid.expose().to_owned()),
    ]);
    let k = keyturnd(&w, env).await;
    let tool = w.webhook_tool(json!({})).await;
    w.as_identity(
        &w.human,
        "SELECT keyturn.set_notify('email', 'person@acme.example')::text",
        &[],
    )
    .await
    .expect("set_notify");
    let p = w.propose(&tool, json!({"text": "from an email"})).await;
    let link = e2e::eventually(WITHIN, "the notification email", || async {
        mail.delivered().iter().find_map(|m| {
            let parsed = mailparse::parse_mail(m.data.as_bytes()).ok()?;
            let text = parsed.subparts.first()?.get_body().ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("Open the card: "))
                .map(|l| l.trim().to_owned())
        })
    })
    .await;
    let link = link.replace("https://keyturn.example.com", &k.base);
    assert!(link.contains(&p.id.to_string()), "{link}");

    let (c, profile) = browser::open_profile(&webdriver, true).await;
    visit(&c, &link).await.expect("open");
    wait_loaded(&c).await;
    // The phone's pieces, same origin, under one policy.
    let phone = c
        .execute_async(
            "const done = arguments[arguments.length - 1]; (async () => { \
               const manifest = document.querySelector('link[rel=manifest]').href; \
               const csp = async (u) => (await fetch(u, {cache: 'no-store'})).headers.get('content-security-policy'); \
               const m = await fetch(manifest); \
               const reg = await navigator.serviceWorker.register('/card/sw.js', {scope: '/card'}); \
               return {manifest: new URL(manifest).pathname, manifest_ok: m.ok, name: (await m.json()).name, \
                       scope: new URL(reg.scope).pathname, \
                       csp: [await csp('/card'), await csp(manifest), await csp('/card/sw.js')]}; \
             })().then(done, (e) => done({error: String(e)}));",
            vec![],
        )
        .await
        .expect("the phone's pieces");
    assert_eq!(phone["manifest"], "/card/manifest.webmanifest", "{phone}");
    assert_eq!(phone["manifest_ok"], true, "{phone}");
    assert!(
        phone["name"].as_str().is_some_and(|n| !n.is_empty()),
        "{phone}"
    );
    assert_eq!(phone["scope"], "/card", "{phone}");
    let csp = phone["csp"].as_array().expect("three policies");
    assert!(
        csp[0]
            .as_str()
            .is_some_and(|p| p.contains("default-src 'self'")),
        "{phone}"
    );
    assert!(csp.iter().all(|p| p == &csp[0]), "one policy: {phone}");

    let (bearer, token) = approve_in_the_card(&c, p.id).await;
    c.close().await.expect("quit the browser");
    history_holds_nothing_that_works(&profile, &k.base, &[&bearer, &token, &p.token]).await;
    assert_eq!(rx.requests(p.id).len(), 1, "approved once, sent once");

    // The person's queue offers this device Web Push (a VAPID key is set).
    let person = w.human_jwt();
    let c = browser::open(&webdriver, true).await;
    console_sign_in(&c, &k.base, &person).await;
    assert!(shown(&c, "push-box").await, "Notify me on this device");
    press_notify_me(&c).await;
    let log = k.stop().await;
    assert_no_secret(&log, &[&bearer, &token, &p.token, &person]);
}

/// Approves the open card's action and waits for it to succeed; the card
/// session's bearer and the action's fresh token, as the tab keeps them.
async fn approve_in_the_card(c: &Client, id: uuid::Uuid) -> (String, String) {
    c.find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(c, &id.to_string(), "succeeded").await;
    let session = js(
        c,
        "return JSON.parse(sessionStorage.getItem('keyturn.card'))",
        vec![],
    )
    .await;
    let bearer = session["session"].as_str().expect("a session").to_owned();
    let token = session["tokens"][id.to_string()]
        .as_str()
        .expect("a token")
        .to_owned();
    (bearer, token)
}

/// The browser's History database, read after it quit: it holds the card's
/// link, and no URL in it holds one of `secrets`, a JWT parameter, or a
/// code keyturnd still redeems.
async fn history_holds_nothing_that_works(profile: &std::path::Path, base: &str, secrets: &[&str]) {
    let urls = browser::history_urls(profile).await;
    let cards: Vec<&String> = urls.iter().filter(|u| u.contains("/card#")).collect();
    assert!(
        !cards.is_empty(),
        "the history holds the card's link: {urls:?}"
    );
    for url in &urls {
        for secret in secrets {
            assert!(!url.contains(secret), "a credential in history: {url}");
        }
        assert!(!url.contains("j="), "{url}");
        let fragment = url.split_once('#').map(|(_, f)| f).unwrap_or("");
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(fragment.as_bytes())
            .into_owned()
            .collect();
        let ids: Vec<&str> = pairs
            .iter()
            .filter(|(k, _)| k == "a")
            .map(|(_, v)| v.as_str())
            .collect();
        for (_, code) in pairs.iter().filter(|(k, _)| k == "c") {
            let (status, _, body) = web::post_json(
                &format!("{base}/card/session"),
                None,
                &json!({"code": code, "action_ids": ids}),
            )
            .await;
            assert_eq!(
                status, 401,
                "a code in history still opens a session: {url} {body}"
            );
        }
    }
}

/// Red-team pass of 0.3.0: a card opened after another for the same action
/// (a quorum's second approver, or the person's other device) took a fresh
/// token and left the first card's dead. The first card's Approve now takes
/// a fresh token for its person and approves.
#[tokio::test]
async fn test_a_card_opened_before_another_for_its_action_still_approves() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let tool = w.webhook_tool(json!({})).await;
    let p: web::Proposal = w.propose(&tool, json!({"text": "two cards"})).await;
    let first = browser::open(&webdriver, false).await;
    visit(&first, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open the first card");
    wait_loaded(&first).await;
    let second = browser::open(&webdriver, false).await;
    visit(&second, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open the second card");
    wait_loaded(&second).await;
    first
        .find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(&first, &p.id.to_string(), "queued").await;
    assert_eq!(w.status(p.id).await, "queued");

    // A later load of the first card (a reload, or any page navigating its
    // tab) resumes its kept session, whose token the second card ended: it
    // takes no fresh one by itself (twentieth red-team pass, docs/security.md
    // row 125), so the second card's still works, until the person asks.
    let q: web::Proposal = w.propose(&tool, json!({"text": "a later load"})).await;
    visit(&first, &code_link(&w, &k.base, &[(&q, None)]).await)
        .await
        .expect("open the first card");
    wait_loaded(&first).await;
    visit(&second, &code_link(&w, &k.base, &[(&q, None)]).await)
        .await
        .expect("open the second card");
    wait_loaded(&second).await;
    first.refresh().await.expect("reload");
    wait_js(
        &first,
        "the first card to offer to open the action",
        "return !!document.querySelector('[data-kt=open-signed-in]')",
        vec![],
    )
    .await;
    second
        .find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(&second, &q.id.to_string(), "queued").await;
    // Asked now, the first card finds nothing left to decide.
    first
        .find(Locator::Css("[data-kt=open-signed-in]"))
        .await
        .expect("review")
        .click()
        .await
        .expect("click");
    let said = wait_js(
        &first,
        "the first card to say why",
        "const e = document.querySelector('[data-kt=item] [data-kt=error]'); return e && e.textContent",
        vec![],
    )
    .await;
    assert!(
        said.as_str()
            .unwrap_or("")
            .contains("nothing left to decide"),
        "{said}"
    );
    second.close().await.expect("close");
    first.close().await.expect("close");
    k.stop().await;
}

/// The card shows what a proposal cites as keyturn recorded it: kind,
/// reference (as text) and hash, whether an agent's own call recorded it;
/// a revoked one is marked.
#[tokio::test]
async fn test_card_shows_the_cited_evidence() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let tool = w.webhook_tool(json!({})).await;
    let sha = "ab".repeat(32);
    let record = |r: &'static str| {
        let (w, sha) = (&w, sha.clone());
        async move {
            let id: uuid::Uuid = w
                .as_identity(
                    &w.human,
                    "SELECT keyturn.record_evidence('email', $1, $2)",
                    &[&r, &sha],
                )
                .await
                .expect("record_evidence")
                .get(0);
            id
        }
    };
    let kept = record("<b>msg-1</b>@mail.example").await;
    // What the agent fenced itself: the card says whose call recorded it.
    let provider = format!("crm{}", unique("ev").replace(['-', '_'], ""));
    w.admin
        .execute(
            "SELECT keyturn.register_projection($1, $2)",
            &[&provider, &json!({"fields": {"name": {"max_length": 40}}})],
        )
        .await
        .expect("register_projection");
    let fenced: uuid::Uuid = w
        .as_identity(
            &w.agent,
            "SELECT evidence_id FROM keyturn.fence($1, $2)",
            &[&provider, &json!({"name": "made up"})],
        )
        .await
        .expect("fence")
        .get(0);
    let p = {
        let origin = json!({"evidence": [kept.to_string(), fenced.to_string()]});
        let row = w
            .as_identity(
                &w.agent,
                "SELECT action_id, token FROM keyturn.propose($1, $2, $3)",
                &[&tool, &json!({"text": "as the mail says"}), &origin],
            )
            .await
            .expect("propose");
        web::Proposal {
            id: row.get(0),
            token: row.get(1),
        }
    };
    let c = browser::open(&webdriver, false).await;
    visit(&c, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    let item = text(
        &c,
        &format!("[data-kt=evidence-item][data-evidence-id=\"{kept}\"]"),
    )
    .await;
    assert!(
        item.contains("email")
            && item.contains("<b>msg-1</b>@mail.example")
            && item.contains("abababab"),
        "{item}"
    );
    assert!(
        !item.contains("agent's own call"),
        "a person recorded it: {item}"
    );
    let by_agent = text(
        &c,
        &format!("[data-kt=evidence-item][data-evidence-id=\"{fenced}\"]"),
    )
    .await;
    assert!(
        by_agent.contains("fence") && by_agent.contains("recorded at the agent's own call"),
        "{by_agent}"
    );
    assert_eq!(
        js(
            &c,
            "return document.querySelectorAll('.kt-evidence b').length",
            vec![]
        )
        .await,
        json!(0)
    );
    c.close().await.expect("close");
    k.stop().await;
}

#[tokio::test]
async fn test_card_shows_markup_and_invisible_characters_as_text() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let tool = w.webhook_tool(json!({})).await;
    let hostile = "<img src=x onerror=\"window.__kt_xss=1;alert(1)\"><script>window.__kt_xss=2</script>pay\u{200B}pal \u{202E}cod.exe";
    let p = w.propose(&tool, json!({"text": hostile})).await;

    let c = browser::open(&webdriver, false).await;
    visit(&c, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    let seen = js(
        &c,
        "return { xss: window.__kt_xss === undefined ? null : window.__kt_xss, \
                  imgs: document.querySelectorAll('img').length, \
                  inline: [...document.scripts].filter(s => !s.src).length, \
                  param: document.querySelector('[data-kt=param][data-key=text]').textContent, \
                  summary: document.querySelector('[data-kt=summary]').textContent };",
        vec![],
    )
    .await;
    assert_eq!(seen["xss"], Value::Null, "nothing ran: {seen}");
    assert_eq!(seen["imgs"], 0, "no injected node: {seen}");
    assert_eq!(seen["inline"], 0, "{seen}");
    let param = seen["param"].as_str().unwrap_or("");
    assert!(
        param.starts_with("<img src=x onerror=") && param.contains("<script>"),
        "{param}"
    );
    assert!(
        param.contains("pay⟨U+200B⟩pal ⟨U+202E⟩cod.exe"),
        "invisible characters shown: {param}"
    );
    // The server may escape the summary's characters itself; either way none
    // is shown raw.
    let summary = seen["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("<script>")
            && !summary.contains('\u{200B}')
            && !summary.contains('\u{202E}'),
        "{summary}"
    );
    assert!(c.get_alert_text().await.is_err(), "no alert opened");
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&p.token]);
}

/// Red-team pass of 0.3.0: the card showed the text "null" and the JSON
/// value null alike (and "12" and 12, "false" and false), where a schema
/// lets both through (a mixed enum, a json column): the person could not
/// see which would be written. A value that is not text is labelled, in a
/// style (CSS generated content) no text inside a value can take.
#[tokio::test]
async fn test_card_tells_text_from_other_values_that_print_alike() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let tool = w
        .webhook_tool(json!({"params_schema": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 50},
                "a": {"enum": [null, "null", 12, "12", false, "false"]},
                "b": {"enum": [null, "null", 12, "12", false, "false"]},
                "c": {"enum": [null, "null", 12, "12", false, "false"]},
                "d": {"enum": [null, "null", 12, "12", false, "false"]},
                "e": {"type": "string"},
                "f": {"type": "string"}
            },
            "required": ["text"]
        }}))
        .await;
    let p = w
        .propose(
            &tool,
            json!({"text": "mixed", "a": null, "b": "null", "c": 12, "d": "12", "e": "", "f": "ok "}),
        )
        .await;

    let c = browser::open(&webdriver, false).await;
    visit(&c, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    let shown = js(
        &c,
        "const out = {}; \
         for (const k of ['a', 'b', 'c', 'd', 'e', 'f']) { \
           const dd = document.querySelector(`[data-kt=param][data-key=${k}]`); \
           out[k] = [dd.textContent, getComputedStyle(dd, '::after').content]; \
         } return out;",
        vec![],
    )
    .await;
    assert_eq!(shown["a"][0], shown["b"][0], "the same characters: {shown}");
    assert_eq!(shown["c"][0], shown["d"][0], "the same characters: {shown}");
    assert_eq!(shown["a"][1], json!("\"null: no value\""), "{shown}");
    assert_eq!(shown["c"][1], json!("\"number\""), "{shown}");
    assert_eq!(shown["e"][1], json!("\"empty text\""), "{shown}");
    assert_eq!(shown["f"][1], json!("\"spaces at an end\""), "{shown}");
    for text in ["b", "d"] {
        assert_eq!(shown[text][1], json!("none"), "text has no label: {shown}");
    }
    c.close().await.expect("close");
    k.stop().await;
}

#[tokio::test]
async fn test_digest_card_approves_only_the_proposed_fields() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = keyturnd(&w, rx.env()).await;
    let tool = w.webhook_tool(json!({"retain": "digest"})).await;

    let params = json!({"text": "Grüße 😂 דּ — 1e30 and 4.50"});
    let p = w.propose(&tool, params.clone()).await;
    let link_p = link_params(&params);
    let c = browser::open(&webdriver, false).await;
    visit(&c, &code_link(&w, &k.base, &[(&p, Some(&link_p))]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    assert_eq!(
        js(
            &c,
            "return document.querySelector('[data-kt=hash]').dataset.match",
            vec![]
        )
        .await,
        "true"
    );
    assert_eq!(
        text(&c, "[data-kt=param][data-key=text]").await,
        "Grüße 😂 דּ — 1e30 and 4.50"
    );
    // The values left the address bar for this tab's storage; a reload
    // still has them.
    let url = c.current_url().await.expect("url");
    assert!(!url.as_str().contains("p="), "{url}");
    c.refresh().await.expect("reload");
    wait_loaded(&c).await;
    assert_eq!(
        text(&c, "[data-kt=param][data-key=text]").await,
        "Grüße 😂 דּ — 1e30 and 4.50"
    );
    assert!(
        !approve_disabled(&c).await,
        "matching fields may be approved"
    );
    // A later page in this tab loads the card on the action with other
    // fields and no code (nineteenth red-team pass, docs/security.md row
    // 123): the kept session goes on, the fields its code's link brought
    // win, and nothing is checked before the person approves.
    load_again(
        &c,
        &format!(
            "{}/card#a={}&p={}",
            k.base,
            p.id,
            link_params(&json!({"text": "other words"}))
        ),
    )
    .await;
    assert_eq!(
        text(&c, "[data-kt=param][data-key=text]").await,
        "Grüße 😂 דּ — 1e30 and 4.50"
    );
    assert_eq!(
        w.status(p.id).await,
        "pending",
        "nothing was checked on load"
    );
    assert!(!approve_disabled(&c).await);
    // Nor does a fragment with other fields and a code that opens nothing
    // replace them (twentieth red-team pass, row 125).
    visit(
        &c,
        &format!(
            "{}/card#a={}&p={}&c=kt_made-up",
            k.base,
            p.id,
            link_params(&json!({"text": "other words"}))
        ),
    )
    .await
    .expect("open");
    wait_js(
        &c,
        "the card to refuse the code",
        "const e = document.querySelector('[data-kt=error]:not([hidden])'); return e && e.textContent",
        vec![],
    )
    .await;
    load_again(&c, &format!("{}/card#a={}", k.base, p.id)).await;
    assert_eq!(
        text(&c, "[data-kt=param][data-key=text]").await,
        "Grüße 😂 דּ — 1e30 and 4.50"
    );
    c.find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(&c, &p.id.to_string(), "succeeded").await;
    assert_eq!(rx.requests(p.id).len(), 1);

    // One field changed in the link: refused in the card, and by the database.
    let q = w.propose(&tool, json!({"text": "pay 10 EUR"})).await;
    let changed = json!({"text": "pay 10000 EUR"});
    visit(
        &c,
        &code_link(&w, &k.base, &[(&q, Some(&link_params(&changed)))]).await,
    )
    .await
    .expect("open");
    wait_loaded(&c).await;
    assert_eq!(
        js(
            &c,
            "return document.querySelector('[data-kt=hash]').dataset.match",
            vec![]
        )
        .await,
        "false"
    );
    assert!(text(&c, "[data-kt=hash]")
        .await
        .contains("not the ones proposed"));
    assert!(approve_disabled(&c).await);
    // Fields that are not the proposed ones ended the proposal: the link's
    // holder had one guess, as approving with them would have been.
    let said = wait_status(&c, &q.id.to_string(), "rejected_tampered").await;
    assert!(said.contains("does not match what was proposed"), "{said}");
    assert_eq!(w.status(q.id).await, "rejected_tampered");
    c.refresh().await.expect("reload");
    wait_loaded(&c).await;
    wait_status(&c, &q.id.to_string(), "rejected_tampered").await;
    assert!(approve_disabled(&c).await);
    assert!(rx.requests(q.id).is_empty());
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&p.token, &q.token]);
}

#[tokio::test]
async fn test_batch_card_approves_all_and_shows_each_outcome() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = keyturnd(&w, rx.env()).await;
    let tool = w.webhook_tool(json!({})).await;
    let other_tool = w.webhook_tool(json!({})).await;
    let a = w.propose(&tool, json!({"text": "first"})).await;
    let b = w.propose(&tool, json!({"text": "second"})).await;
    let refused = w.propose(&other_tool, json!({"text": "third"})).await;

    let c = browser::open(&webdriver, false).await;
    visit(
        &c,
        &code_link(&w, &k.base, &[(&a, None), (&b, None), (&refused, None)]).await,
    )
    .await
    .expect("open");
    wait_loaded(&c).await;
    let summaries = c
        .find_all(Locator::Css("[data-kt=summary]"))
        .await
        .expect("summaries");
    assert_eq!(summaries.len(), 3, "each call visible");
    // After the card was shown the third one's grant disappears (removed
    // directly, without the epoch bump revoke_tool makes, which would
    // invalidate the other two as well): approve refuses it before the claim.
    w.superuser
        .execute(
            "DELETE FROM keyturn.tool_grant WHERE tenant = $1 AND principal = $2 AND tool = $3",
            &[&w.tenant, &w.principal, &other_tool],
        )
        .await
        .expect("remove the grant");
    assert_eq!(text(&c, "[data-kt=approve-all]").await, "Approve all 3");
    c.find(Locator::Css("[data-kt=approve-all]"))
        .await
        .expect("approve all")
        .click()
        .await
        .expect("click");
    wait_status(&c, &a.id.to_string(), "succeeded").await;
    wait_status(&c, &b.id.to_string(), "succeeded").await;
    let said = wait_status(&c, &refused.id.to_string(), "refused").await;
    assert!(said.contains("Refused"), "{said}");
    assert!(text(&c, "[data-kt=batch-status]")
        .await
        .contains("2 actions approved, 1 refused"));
    assert_eq!(
        w.status(refused.id).await,
        "pending",
        "a refusal changes nothing"
    );
    assert_eq!(rx.requests(a.id).len(), 1);
    assert_eq!(rx.requests(b.id).len(), 1);
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&a.token, &b.token, &refused.token]);
}

/// Signs in to the console with `jwt` through its form, as a person would
/// paste it: never through the address.
async fn console_sign_in(c: &Client, base: &str, jwt: &str) {
    visit(c, &format!("{base}/console"))
        .await
        .expect("open the console");
    wait_console(c).await;
    c.find(Locator::Css("[data-kt=jwt]"))
        .await
        .expect("the sign-in form")
        .send_keys(jwt)
        .await
        .expect("type");
    c.find(Locator::Css("[data-kt=signin] button[type=submit]"))
        .await
        .expect("sign in")
        .click()
        .await
        .expect("click");
    tokio::time::sleep(Duration::from_millis(300)).await;
    wait_console(c).await;
    let url = c.current_url().await.expect("url");
    assert!(!url.as_str().contains(jwt), "{url}");
}

async fn wait_console(c: &Client) {
    wait_js(
        c,
        "the console to load",
        "return document.body.dataset.loaded",
        vec![],
    )
    .await;
}

/// The HTTP status of a person's `preview` of action `id` with `token`:
/// 200 while the token is the action's, 409 once another replaced it.
async fn preview_status(base: &str, jwt: &str, id: uuid::Uuid, token: &str) -> u16 {
    post_rpc(
        base,
        "preview",
        Some(jwt),
        &json!({"action_id": id, "token": token}),
    )
    .await
    .0
}

/// Opens `url` in the card's tab and waits for the card it loads (a
/// fragment's change reloads the page), not the one before.
async fn load_again(c: &Client, url: &str) {
    js(c, "window.ktBefore = true", vec![]).await;
    visit(c, url).await.expect("open");
    wait_js(
        c,
        "the card to load again",
        "const card = document.querySelector('keyturn-card'); \
         return !window.ktBefore && !!card && card.dataset.loaded === 'true'",
        vec![],
    )
    .await;
}

/// Presses "Notify me on this device" and waits for what came of it
/// (headless Chromium reaches no push service: that it says something).
async fn press_notify_me(c: &Client) {
    c.find(Locator::Css("[data-kt=push-subscribe]"))
        .await
        .expect("the button")
        .click()
        .await
        .expect("click");
    let said = wait_js(
        c,
        "what came of the subscription",
        "return document.querySelector('[data-kt=push-status]').textContent;",
        vec![],
    )
    .await;
    assert!(!said.as_str().unwrap_or("").is_empty(), "{said}");
}

async fn shown(c: &Client, section: &str) -> bool {
    js(
        c,
        "const s = document.querySelector(`[data-kt=\"${arguments[0]}\"]`); return !!s && !s.hidden;",
        vec![json!(section)],
    )
    .await
        == json!(true)
}

#[tokio::test]
async fn test_console_reconciles_an_uncertain_action_and_shows_its_timeline() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(500)]).await;
    let k = keyturnd(&w, rx.env()).await;
    let tool = w.webhook_tool(json!({})).await;
    // The person is reached by email: the notice is on the timeline
    // (never sent: this keyturnd has no public URL).
    w.as_identity(
        &w.human,
        "SELECT keyturn.set_notify('email', 'person@acme.example')::text",
        &[],
    )
    .await
    .expect("set_notify");
    let q = w
        .queue(&tool, json!({"text": "did it arrive?"}), false)
        .await;
    w.wait_status(q.id, "uncertain", WITHIN).await;
    let id = q.id.to_string();
    let operator =
        web::jwt(json!({"role": "app_operator", "sub": "ops-1", "exp": web::now() + 600}));

    let c = browser::open(&webdriver, false).await;
    console_sign_in(&c, &k.base, &operator).await;
    let row = format!("[data-kt=uncertain-row][data-action-id=\"{id}\"]");
    wait_js(
        &c,
        "the uncertain row",
        "return document.querySelector(arguments[0])",
        vec![json!(row)],
    )
    .await;
    assert_eq!(
        js(&c, "return sessionStorage.getItem('keyturn.jwt')", vec![]).await,
        json!(operator),
        "kept for this tab"
    );
    // The operator's sections: no queue of their own, no kill switch.
    assert!(!shown(&c, "mine-section").await, "an operator has no queue");
    for section in [
        "uncertain-section",
        "actions-section",
        "tools-section",
        "standing-section",
    ] {
        assert!(shown(&c, section).await, "{section}");
    }
    assert!(
        !exists(&c, "[data-kt=kill-switch]").await,
        "only an admin may"
    );
    let state = text(
        &c,
        &format!("[data-kt=tool-row][data-tool=\"{tool}\"] [data-kt=tool-state]"),
    )
    .await;
    assert_eq!(state, "enabled");

    // Counts by status, a filter, the action's timeline.
    let uncertain = js(
        &c,
        "return document.querySelector('[data-kt=count][data-status=uncertain]').dataset.count",
        vec![],
    )
    .await;
    assert!(
        uncertain
            .as_str()
            .unwrap_or("0")
            .parse::<i64>()
            .unwrap_or(0)
            >= 1,
        "{uncertain}"
    );
    c.find(Locator::Css("[data-kt=filter-tenant]"))
        .await
        .expect("tenant filter")
        .send_keys(&w.tenant)
        .await
        .expect("type");
    c.find(Locator::Css("[data-kt=count][data-status=uncertain]"))
        .await
        .expect("count")
        .click()
        .await
        .expect("filter by status");
    let listed = wait_js(
        &c,
        "the uncertain action in the list",
        "const rows = [...document.querySelectorAll('[data-kt=action-row]')]; \
         return rows.length && rows.every(r => r.dataset.status === 'uncertain') && rows.map(r => r.dataset.actionId);",
        vec![],
    )
    .await;
    assert_eq!(listed, json!([id]), "one tenant, one status");
    c.find(Locator::Css("[data-kt=action-row] [data-kt=action-open]"))
        .await
        .expect("open the action")
        .click()
        .await
        .expect("click");
    wait_js(
        &c,
        "the timeline with events, the attempt and the notices",
        "return document.querySelectorAll('[data-kt=audit-row]').length >= 3 && \
                document.querySelectorAll('[data-kt=timeline-attempt]').length === 1 && \
                document.querySelectorAll('[data-kt=timeline-notification]').length >= 1;",
        vec![],
    )
    .await;
    let notice = text(&c, "[data-kt=timeline-notification]").await;
    assert!(
        notice.contains("notice by email") && notice.contains(&w.principal),
        "{notice}"
    );
    js(
        &c,
        "document.querySelector('[data-kt=actions-section]').scrollIntoView();",
        vec![],
    )
    .await;
    screenshot(&c, "console-actions").await;

    let button = c
        .find(Locator::Css(&format!("{row} [data-kt=reconcile]")))
        .await
        .expect("reconcile");
    assert_eq!(
        button.prop("disabled").await.expect("prop").as_deref(),
        Some("true"),
        "a note is required"
    );
    c.find(Locator::Css(&format!("{row} [data-kt=note]")))
        .await
        .expect("note")
        .send_keys("receiver log shows the delivery at 10:02")
        .await
        .expect("type");
    wait_js(
        &c,
        "the metrics",
        "return document.querySelectorAll('[data-kt=metric]').length",
        vec![],
    )
    .await;
    js(
        &c,
        "document.activeElement.blur(); window.scrollTo(0, 0);",
        vec![],
    )
    .await;
    screenshot(&c, "console").await;
    button.click().await.expect("reconcile");
    wait_js(
        &c,
        "the timeline to show the reconciliation",
        "return [...document.querySelectorAll('[data-kt=audit-row]')].some(r => \
           r.textContent.includes('uncertain → succeeded') && r.textContent.includes('receiver log shows'))",
        vec![],
    )
    .await;
    assert_eq!(w.status(q.id).await, "succeeded");
    assert_eq!(w.usage_rows(q.id).await, 1);

    // Signing out forgets the JWT.
    c.find(Locator::Css("[data-kt=sign-out]"))
        .await
        .expect("sign out")
        .click()
        .await
        .expect("click");
    tokio::time::sleep(Duration::from_millis(300)).await;
    wait_console(&c).await;
    assert!(shown(&c, "signin-section").await);
    assert_eq!(
        js(&c, "return sessionStorage.length", vec![]).await,
        json!(0)
    );
    c.close().await.expect("close");

    // An agent's JWT: refused, nothing shown. An expired one: sign in again.
    for (who, bad) in [
        ("agent", w.jwt_as("app_agent", web::now() + 600)),
        (
            "expired",
            web::jwt(json!({"role": "app_operator", "sub": "ops-1", "exp": web::now() - 300})),
        ),
    ] {
        let c = browser::open(&webdriver, false).await;
        console_sign_in(&c, &k.base, &bad).await;
        assert!(!exists(&c, "[data-kt=uncertain-row]").await, "{who}");
        assert!(!exists(&c, "[data-kt=action-row]").await, "{who}");
        assert!(
            js(
                &c,
                "return !document.querySelector('[data-kt=error]').hidden",
                vec![]
            )
            .await
                == json!(true),
            "{who}"
        );
        if who == "expired" {
            assert!(shown(&c, "signin-section").await, "{who}");
            assert_eq!(
                js(&c, "return sessionStorage.getItem('keyturn.jwt')", vec![]).await,
                Value::Null,
                "a refused JWT is forgotten"
            );
        }
        c.close().await.expect("close");
    }
    let log = k.stop().await;
    assert_no_secret(&log, &[&operator]);
}

/// A person approves from their queue in the console, without the link:
/// issue_token gives the card a fresh token, and the link's stops working.
#[tokio::test]
async fn test_console_approves_from_the_queue_without_the_link() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = keyturnd(&w, rx.env()).await;
    let tool = w.webhook_tool(json!({})).await;
    let p = w.propose(&tool, json!({"text": "from the queue"})).await;
    let jwt = w.human_jwt();

    let c = browser::open(&webdriver, true).await;
    console_sign_in(&c, &k.base, &jwt).await;
    assert!(shown(&c, "mine-section").await);
    assert!(
        !shown(&c, "push-box").await,
        "no VAPID key: no Web Push offered"
    );
    for section in [
        "uncertain-section",
        "actions-section",
        "tools-section",
        "standing-section",
    ] {
        assert!(!shown(&c, section).await, "a person does not see {section}");
    }
    let row = format!("[data-kt=pending-row][data-action-id=\"{}\"]", p.id);
    c.find(Locator::Css(&format!("{row} [data-kt=review]")))
        .await
        .expect("review")
        .click()
        .await
        .expect("click");
    wait_loaded(&c).await;
    assert!(text(&c, "[data-kt=summary]")
        .await
        .contains("from the queue"));
    screenshot(&c, "console-queue-mobile").await;
    // The proposal's own token (the link's) no longer works.
    assert_eq!(
        preview_status(&k.base, &jwt, p.id, &p.token).await,
        409,
        "the link's token was replaced"
    );
    c.find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(&c, &p.id.to_string(), "succeeded").await;
    assert_eq!(rx.requests(p.id).len(), 1);
    c.find(Locator::Css("[data-kt=back]"))
        .await
        .expect("back")
        .click()
        .await
        .expect("click");
    wait_js(
        &c,
        "the queue to be empty",
        "return !document.querySelector('[data-kt=mine-empty]').hidden",
        vec![],
    )
    .await;
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&jwt, &p.token]);
}

/// A person signed in in this tab (their JWT in sessionStorage, as the
/// console keeps it) opens `/card#a=<id>&t=<token>`, or `/card#a=<id>`
/// alone, and decides there: the token is their action's, or a fresh one
/// the card takes for them. The address bar keeps only the action id. With
/// a VAPID key, the card offers this device Web Push, with the person's JWT.
#[tokio::test]
async fn test_a_signed_in_tab_opens_the_card_from_a_token_link_or_the_action_alone() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let (vapid, _) = keyturnd::config::VapidKey::generate();
    let mut env = rx.env();
    env.extend([
        ("KEYTURN_VAPID_PRIVATE_KEY", vapid.expose().to_owned()),
        // Where notifications' links would point; none is sent here.
        (
            "KEYTURN_PUBLIC_URL",
            "https://keyturn.example.com".to_owned(),
        ),
    ]);
    let k = keyturnd(&w, env).await;
    let tool = w.webhook_tool(json!({})).await;
    let with_token = w.propose(&tool, json!({"text": "with its token"})).await;
    let alone = w.propose(&tool, json!({"text": "by its id alone"})).await;
    let jwt = w.human_jwt();

    let c = browser::open(&webdriver, false).await;
    visit(&c, &format!("{}/card", k.base)).await.expect("open");
    js(
        &c,
        "sessionStorage.setItem('keyturn.jwt', arguments[0])",
        vec![json!(jwt)],
    )
    .await;
    // A token in the fragment that is not the action's: the card takes no
    // fresh one by itself (nineteenth red-team pass, row 123).
    visit(
        &c,
        &format!("{}/card#a={}&t=not-its-token", k.base, alone.id),
    )
    .await
    .expect("open");
    wait_js(
        &c,
        "the card to offer to open the action",
        "return !!document.querySelector('[data-kt=open-signed-in]')",
        vec![],
    )
    .await;
    assert_eq!(
        preview_status(&k.base, &jwt, alone.id, &alone.token).await,
        200,
        "the proposal's token still works"
    );
    for (p, fragment, words) in [
        (
            &with_token,
            format!("a={}&t={}", with_token.id, with_token.token),
            "with its token",
        ),
        (&alone, format!("a={}", alone.id), "by its id alone"),
    ] {
        visit(&c, &format!("{}/card#{fragment}", k.base))
            .await
            .expect("open");
        if p.id == alone.id {
            // Any page can open this tab's card on a fragment of its
            // choosing: without a token, nothing is called until the person
            // asks (eighteenth red-team pass, docs/security.md row 121).
            wait_js(
                &c,
                "the card to offer to open the action",
                "return !!document.querySelector('[data-kt=open-signed-in]')",
                vec![],
            )
            .await;
            assert!(!exists(&c, "[data-kt=summary]").await);
            assert_eq!(
                preview_status(&k.base, &jwt, alone.id, &alone.token).await,
                200,
                "the proposal's token still works"
            );
            c.find(Locator::Css("[data-kt=open-signed-in]"))
                .await
                .expect("review")
                .click()
                .await
                .expect("click");
        }
        wait_js(
            &c,
            "the card to show the action",
            "const s = document.querySelector('[data-kt=summary]'); return s && s.textContent",
            vec![],
        )
        .await;
        assert!(
            text(&c, "[data-kt=summary]").await.contains(words),
            "{words}"
        );
        assert_eq!(
            js(&c, "return location.hash", vec![]).await,
            json!(format!("#a={}", p.id)),
            "{words}"
        );
        wait_js(
            &c,
            "the card to offer Web Push",
            "const b = document.querySelector('[data-kt=push-box]'); return !!b && !b.hidden && !!b.querySelector('[data-kt=push-subscribe]');",
            vec![],
        )
        .await;
        c.find(Locator::Css("[data-kt=approve]"))
            .await
            .expect("approve")
            .click()
            .await
            .expect("click");
        wait_status(&c, &p.id.to_string(), "succeeded").await;
        assert_eq!(rx.requests(p.id).len(), 1, "{words}");
    }
    press_notify_me(&c).await;

    // A digest action's fields in the fragment are not checked on load (a
    // guess ends the proposal, in the person's name): the approval checks
    // them. Fields that are not the proposed ones end nothing until then.
    let digest = w.webhook_tool(json!({"retain": "digest"})).await;
    let params = json!({"text": "the proposed words"});
    let d = w.propose(&digest, params.clone()).await;
    for fields in [json!({"text": "other words"}), params] {
        visit(
            &c,
            &format!(
                "{}/card#a={}&t={}&p={}",
                k.base,
                d.id,
                d.token,
                link_params(&fields)
            ),
        )
        .await
        .expect("open");
        wait_js(
            &c,
            "the card to show the digest action",
            "const h = document.querySelector('[data-kt=hash]'); return h && h.dataset.match === 'null'",
            vec![],
        )
        .await;
        assert_eq!(
            w.status(d.id).await,
            "pending",
            "nothing was checked on load"
        );
    }
    c.find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(&c, &d.id.to_string(), "succeeded").await;
    assert_eq!(rx.requests(d.id).len(), 1);
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&jwt, &with_token.token, &alone.token, &d.token]);
}

/// The platform admin throws the kill switch from the console: the tool is
/// disabled in the database, and enabled again.
#[tokio::test]
async fn test_console_kill_switch_for_the_platform_admin() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    web::authenticator(&w.superuser).await;
    // A role of the platform admin's for /rpc of its own (app_admin stays
    // one the authenticator cannot become, which e2e_rpc relies on).
    w.superuser
        .batch_execute(
            "DO $$ BEGIN \
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app_console_admin') THEN \
                 CREATE ROLE app_console_admin NOLOGIN IN ROLE keyturn_admin; \
               END IF; \
             END $$; \
             GRANT app_console_admin TO app_authenticator",
        )
        .await
        .expect("the admin role for /rpc");
    let mut env = web::rpc_env(w.port);
    env.push((
        "KEYTURN_JWT_ROLES",
        "app_human,app_operator,app_console_admin".into(),
    ));
    let k = Keyturnd::start(w.port, env).await;
    let tool = w.webhook_tool(json!({})).await;
    let admin =
        web::jwt(json!({"role": "app_console_admin", "sub": "platform", "exp": web::now() + 600}));

    let c = browser::open(&webdriver, false).await;
    console_sign_in(&c, &k.base, &admin).await;
    let switch = format!("[data-kt=tool-row][data-tool=\"{tool}\"] [data-kt=kill-switch]");
    assert_eq!(text(&c, &switch).await, "Disable");
    js(&c, "window.confirm = () => true;", vec![]).await;
    c.find(Locator::Css(&switch))
        .await
        .expect("switch")
        .click()
        .await
        .expect("click");
    wait_js(
        &c,
        "the tool to show disabled",
        "const r = document.querySelector(`[data-kt=tool-row][data-tool=\"${arguments[0]}\"]`); return r && r.dataset.enabled === 'false';",
        vec![json!(tool)],
    )
    .await;
    let enabled: bool = w
        .superuser
        .query_one("SELECT enabled FROM keyturn.tool WHERE name = $1", &[&tool])
        .await
        .expect("tool")
        .get(0);
    assert!(!enabled, "the database's tool is disabled");
    c.find(Locator::Css(&switch))
        .await
        .expect("switch")
        .click()
        .await
        .expect("click");
    wait_js(
        &c,
        "the tool to show enabled",
        "const r = document.querySelector(`[data-kt=tool-row][data-tool=\"${arguments[0]}\"]`); return r && r.dataset.enabled === 'true';",
        vec![json!(tool)],
    )
    .await;
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&admin]);
}

#[tokio::test]
async fn test_rfc8785_in_the_browser_matches_the_vectors_and_the_database() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let k = keyturnd(&w, vec![]).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../extension/core/tests/data/rfc8785");
    let mut names: Vec<String> = std::fs::read_dir(dir.join("input"))
        .expect("vectors")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 6, "{names:?}");
    let inputs: Vec<Value> = names
        .iter()
        .map(|n| json!(std::fs::read_to_string(dir.join("input").join(n)).expect("input")))
        .collect();

    let c = browser::open(&webdriver, false).await;
    c.goto(&format!("{}/card", k.base)).await.expect("open");
    let got = c
        .execute_async(
            "const [inputs, done] = arguments; \
             import('/card/jcs.js').then(m => done(inputs.map(i => m.canonicalize(JSON.parse(i)))), e => done(String(e)));",
            vec![json!(inputs)],
        )
        .await
        .expect("canonicalize in the browser");
    for (i, name) in names.iter().enumerate() {
        let want = std::fs::read_to_string(dir.join("output").join(name)).expect("output");
        // values.json too: JavaScript's doubles are the RFC's own model. (The
        // database refuses that vector's inexact number at propose, so no
        // card ever meets it.)
        assert_eq!(got[i], json!(want), "{name}");
    }

    // The card's params hash is the database's, for awkward params.
    let cases = [
        ("notify", json!({"text": "a"})),
        (
            "t.x",
            json!({"b": [1e30, 4.5, 0.002, -0.0, 1e-7], "a": {"€": "😂", "\u{fb33}": "\u{7}\u{1f}"}}),
        ),
        (
            "deal_stage",
            json!({"where": {"id": 12}, "set": {"stage": "won"}, "\u{1f602}": true}),
        ),
    ];
    for (tool, params) in cases {
        let browser_hash = c
            .execute_async(
                "const [tool, params, done] = arguments; \
                 import('/card/jcs.js').then(m => m.paramsHash(tool, params)).then(done, e => done(String(e)));",
                vec![json!(tool), params.clone()],
            )
            .await
            .expect("hash in the browser");
        let db_hash: String = w
            .superuser
            .query_one("SELECT keyturn.params_hash($1, $2)", &[&tool, &params])
            .await
            .expect("params_hash")
            .get(0);
        assert_eq!(browser_hash, json!(db_hash), "{tool} {params}");
    }
    c.close().await.expect("close");
    k.stop().await;
}

/// Edits a field of the card's (only) item and saves it as a revision.
async fn revise_in_the_card(c: &Client, text: &str) {
    c.find(Locator::Css("[data-kt=edit]"))
        .await
        .expect("edit")
        .click()
        .await
        .expect("click");
    assert!(approve_disabled(c).await, "no approving while editing");
    let field = c
        .find(Locator::Css("[data-kt=field][data-key=text]"))
        .await
        .expect("field");
    field.clear().await.expect("clear");
    field.send_keys(text).await.expect("type");
    c.find(Locator::Css("[data-kt=revise]"))
        .await
        .expect("save")
        .click()
        .await
        .expect("click");
}

/// A card opened from a link revises, but does not go on to approve what
/// it wrote (docs/security.md, row 75): it says the revision is decided
/// where the person is signed in. There (the console's queue), the card
/// revises again and goes on with the new proposal, shown as such.
#[tokio::test]
async fn test_card_revises_a_proposal_and_shows_the_new_one_as_such() {
    let webdriver = require_browser!();
    let port = require_db!();
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let rx = Receiver::start(&w.tenant, vec![Reply::status(200)]).await;
    let k = keyturnd(&w, rx.env()).await;
    let tool = w.webhook_tool(json!({})).await;
    let p = w.propose(&tool, json!({"text": "meet at 10"})).await;

    let c = browser::open(&webdriver, false).await;
    visit(&c, &code_link(&w, &k.base, &[(&p, None)]).await)
        .await
        .expect("open");
    wait_loaded(&c).await;
    revise_in_the_card(&c, "meet at 11").await;
    let said = wait_js(
        &c,
        "the revision's note",
        "const b = document.querySelector('[data-kt=revised-elsewhere]'); return b && b.textContent;",
        vec![],
    )
    .await;
    let said = said.as_str().unwrap_or("").to_owned();
    assert!(said.contains("where you are signed in"), "{said}");
    assert_eq!(w.status(p.id).await, "superseded");
    let revision: uuid::Uuid = w
        .superuser
        .query_one(
            "SELECT id FROM keyturn.action WHERE revised_from = $1",
            &[&p.id],
        )
        .await
        .expect("the revision")
        .get(0);
    assert!(said.contains(&revision.to_string()), "{said}");
    assert_eq!(w.status(revision).await, "pending");
    assert!(
        c.find(Locator::Css("[data-kt=approve]")).await.is_err(),
        "the link's card offers no approval of the revision"
    );
    // The new token stayed in memory: not in the address bar, not in storage.
    let url = c.current_url().await.expect("url");
    assert!(
        url.as_str().contains(&p.id.to_string()) && !url.as_str().contains("c="),
        "the link is the old one, its code spent: {url}"
    );
    assert_eq!(
        js(&c, "return sessionStorage.length", vec![]).await,
        json!(1),
        "only the card session is stored"
    );
    let kept = js(&c, "return sessionStorage.getItem('keyturn.card')", vec![]).await;
    assert!(
        !kept.as_str().unwrap_or("").contains(&revision.to_string()),
        "{kept}"
    );

    // Signed in, in the console: the revision is in the queue.
    console_sign_in(&c, &k.base, &w.human_jwt()).await;
    let row = format!("[data-kt=pending-row][data-action-id=\"{revision}\"]");
    c.find(Locator::Css(&format!("{row} [data-kt=review]")))
        .await
        .expect("review")
        .click()
        .await
        .expect("click");
    wait_loaded(&c).await;
    let warned = text(&c, "[data-kt=revised-by-link]").await;
    assert!(warned.contains("opened from a link"), "{warned}");
    revise_in_the_card(&c, "meet at 12").await;
    let banner = wait_js(
        &c,
        "the revised proposal",
        "const b = document.querySelector('[data-kt=revised]'); return b && b.textContent;",
        vec![],
    )
    .await;
    assert!(
        banner
            .as_str()
            .unwrap_or("")
            .contains(&revision.to_string()),
        "{banner}"
    );
    let summary = text(&c, "[data-kt=summary]").await;
    assert!(summary.contains("meet at 12"), "{summary}");
    assert_eq!(w.status(revision).await, "superseded");
    let new_id = js(
        &c,
        "return document.querySelector('[data-kt=item]').dataset.actionId",
        vec![],
    )
    .await;
    let new_id = new_id.as_str().expect("new id").to_owned();
    assert_ne!(new_id, revision.to_string());
    c.find(Locator::Css("[data-kt=approve]"))
        .await
        .expect("approve")
        .click()
        .await
        .expect("click");
    wait_status(&c, &new_id, "succeeded").await;
    c.close().await.expect("close");
    let log = k.stop().await;
    assert_no_secret(&log, &[&p.token]);
}

/// Every character keyturn-core calls invisible or a space look-alike (the
/// server's one definition, `keyturn_core::text::is_invisible` and
/// `is_space_lookalike`), code point by code point across the whole Unicode
/// range, is marked ⟨U+XXXX⟩ by the card's own `visible()`, as Chromium runs
/// it. Issue 28 item 13: the card kept a list of its own that missed U+17B4,
/// U+17B5 and U+E0100–E01EF; the twelfth red-team pass: U+2800 was unmarked.
#[tokio::test]
async fn test_the_card_marks_every_character_the_server_calls_invisible() {
    let webdriver = require_browser!();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, keyturnd::app(keyturnd::AppState::new())).await;
    });
    let invisible: Vec<u32> = ('\0'..=char::MAX)
        .filter(|&c| {
            keyturn_core::text::is_invisible(c) || keyturn_core::text::is_space_lookalike(c)
        })
        .map(u32::from)
        .collect();
    assert!(invisible.len() > 4000, "the whole range was walked");
    assert!(invisible.contains(&0x2800), "the blanks are among them");
    let c = browser::open(&webdriver, false).await;
    c.goto(&format!("{base}/card")).await.expect("open /card");
    let unmarked = c
        .execute_async(
            "const [cps, done] = arguments; \
             import('/card/show.js').then(m => done(cps.filter(cp => \
               m.visible(String.fromCodePoint(cp)) !== \
               `⟨U+${cp.toString(16).toUpperCase().padStart(4, '0')}⟩`)), \
               e => done(['import failed: ' + e]));",
            vec![json!(invisible)],
        )
        .await
        .expect("script");
    c.close().await.expect("close");
    let unmarked: Vec<Value> = serde_json::from_value(unmarked).expect("a list");
    let shown: Vec<String> = unmarked
        .iter()
        .map(|v| match v.as_u64() {
            Some(cp) => format!("U+{cp:04X}"),
            None => v.to_string(),
        })
        .collect();
    assert!(
        shown.is_empty(),
        "{} invisible characters the card shows unmarked: {:?}",
        shown.len(),
        shown
    );
}
