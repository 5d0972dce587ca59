//! The browser of the browser layer: a real headless Chromium driven over
//! WebDriver (`fantoccini`) through the chromedriver `tests/harness.sh`
//! starts (`KT_WEBDRIVER_URL`). Without one a test prints that it skipped,
//! and why, and passes; none passes silently.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::{json, Value};

use super::e2e::World;
use super::web::Proposal;

/// The chromedriver URL, or why there is none.
pub fn webdriver_url() -> Result<String, String> {
    match std::env::var("KT_WEBDRIVER_URL") {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => Err(std::env::var("KT_BROWSER_UNAVAILABLE").unwrap_or_else(|_| {
            "KT_WEBDRIVER_URL is not set (no chromedriver was started for this run)".into()
        })),
    }
}

/// The chromedriver URL; without one the test says it skipped and returns.
macro_rules! require_browser {
    () => {
        match $crate::support::browser::webdriver_url() {
            Ok(url) => url,
            Err(why) => {
                $crate::support::browser::skipped(test_name!(), &why);
                return;
            }
        }
    };
}

/// Says loudly that a browser test did not run, and how to run it.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {why}. Run it with `KT_ONLY=browser tests/run-all` (installs \
         Debian's chromium and chromium-driver and starts chromedriver). ***\n"
    );
    super::note_skip(test, why);
}

/// The width of the phone the mobile card is shown on.
pub const PHONE_WIDTH: u32 = 360;

/// A fresh browser session: a desktop window, or a 360 px phone.
pub async fn open(webdriver: &str, phone: bool) -> Client {
    open_profile(webdriver, phone).await.0
}

/// [`open`], and the profile directory the browser keeps its history in.
pub async fn open_profile(webdriver: &str, phone: bool) -> (Client, PathBuf) {
    let profile = tempfile::tempdir().expect("profile dir").keep();
    let mut options = json!({
        "args": [
            "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
            "--window-size=1280,1000", "--lang=en-US", "--no-first-run", "--no-default-browser-check",
            // Nothing but loopback: no update, sync, safe-browsing or DNS prefetch traffic.
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", "--disable-domain-reliability",
            "--disable-client-side-phishing-detection", "--no-pings", "--dns-prefetch-disable",
            format!("--user-data-dir={}", profile.display()),
        ],
    });
    if let Ok(binary) = std::env::var("KT_CHROMIUM") {
        options["binary"] = json!(binary);
    }
    if phone {
        options["mobileEmulation"] = json!({
            "deviceMetrics": {"width": PHONE_WIDTH, "height": 1100, "pixelRatio": 1.0, "touch": true, "mobile": true}
        });
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), options);
    caps.insert("unhandledPromptBehavior".into(), json!("ignore"));
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(webdriver)
        .await
        .unwrap_or_else(|e| panic!("start a Chromium session at {webdriver}: {e}"));
    (client, profile)
}

/// Every URL the browser's history database (`<profile>/Default/History`,
/// SQLite) holds, read with Python's sqlite3 once the browser has quit:
/// what a person's history, its sync and its address-bar suggestions keep.
pub async fn history_urls(profile: &std::path::Path) -> Vec<String> {
    let db = profile.join("Default").join("History");
    for _ in 0..100 {
        if db.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(db.exists(), "no history database at {}", db.display());
    // A copy: Chromium may still hold its lock for a moment after quitting.
    let copy = profile.join("History.copy");
    std::fs::copy(&db, &copy).expect("copy History");
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             for (u,) in c.execute('SELECT url FROM urls UNION SELECT term FROM keyword_search_terms'): print(u)",
        ])
        .arg(&copy)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "read History: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `<base>/card#a=…[&p=…]…&c=<code>`, the link a person gets: the one-time
/// code comes from `keyturn.link_code`, made as this world's person.
pub async fn code_link(w: &World, base: &str, items: &[(&Proposal, Option<&str>)]) -> String {
    let ids: Vec<uuid::Uuid> = items.iter().map(|(p, _)| p.id).collect();
    let code: String = w
        .as_identity(&w.human, "SELECT keyturn.link_code($1::uuid[])", &[&ids])
        .await
        .expect("link_code")
        .get(0);
    link_with_code(base, items, &code)
}

/// `<base>/card#a=…[&p=…]…&c=<code>` for a code made already.
pub fn link_with_code(base: &str, items: &[(&Proposal, Option<&str>)], code: &str) -> String {
    let enc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let mut parts = Vec::new();
    for (p, params) in items {
        parts.push(format!("a={}", p.id));
        if let Some(params) = params {
            parts.push(format!("p={}", enc(params)));
        }
    }
    parts.push(format!("c={}", enc(code)));
    format!("{base}/card#{}", parts.join("&"))
}

/// The `p` of a link: base64url of the params' JSON.
pub fn link_params(params: &Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    URL_SAFE_NO_PAD.encode(params.to_string())
}

/// Runs `script` (a function body; `arguments` are `args`) in the page.
pub async fn js(c: &Client, script: &str, args: Vec<Value>) -> Value {
    c.execute(script, args)
        .await
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

/// Polls `script` until it returns something truthy (which it returns).
pub async fn wait_js(c: &Client, what: &str, script: &str, args: Vec<Value>) -> Value {
    let start = Instant::now();
    loop {
        let v = js(c, script, args.clone()).await;
        let truthy =
            !matches!(&v, Value::Null | Value::Bool(false)) && v != json!("") && v != json!(0);
        if truthy {
            return v;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let page = js(
                c,
                "return document.body ? document.body.innerText : ''",
                vec![],
            )
            .await;
            panic!("timed out waiting for {what}; the page says:\n{page}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the item of action `id` shows status `status`.
pub async fn wait_status(c: &Client, id: &str, status: &str) -> String {
    let v = wait_js(
        c,
        &format!("{id} to show {status}"),
        "const s = document.querySelector(`[data-kt=item][data-action-id=\"${arguments[0]}\"] [data-kt=status]`); \
         return s && s.dataset.status === arguments[1] ? s.textContent : null;",
        vec![json!(id), json!(status)],
    )
    .await;
    v.as_str().unwrap_or_default().to_owned()
}

/// Waits until the card finished loading (every item shown or refused).
pub async fn wait_loaded(c: &Client) {
    wait_js(
        c,
        "the card to load",
        "const card = document.querySelector('keyturn-card'); \
         return card && card.dataset.loaded === 'true' && \
           !document.querySelector('.kt-loading') && \
           [...document.querySelectorAll('[data-kt=item]')].every(i => \
              i.querySelector('[data-kt=error]:not([hidden])') || \
              !i.querySelector('[data-kt=hash]') || i.querySelector('[data-kt=hash]').dataset.match);",
        vec![],
    )
    .await;
}

/// Whether `css` matches anything.
pub async fn exists(c: &Client, css: &str) -> bool {
    !c.find_all(Locator::Css(css))
        .await
        .expect("find")
        .is_empty()
}

/// Saves a PNG of the page as `<name>.png` in `KT_SCREENSHOT_DIR` (set it
/// to docs/img to refresh the documentation's pictures), else in the run's
/// scratch directory or the system's temporary one.
pub async fn screenshot(c: &Client, name: &str) -> PathBuf {
    let dir = std::env::var_os("KT_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("KT_SCRATCH").map(|d| PathBuf::from(d).join("screenshots")))
        .unwrap_or_else(|| std::env::temp_dir().join("keyturn-screenshots"));
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let path = dir.join(format!("{name}.png"));
    std::fs::write(&path, png).expect("write screenshot");
    path
}
