//! End to end, Standard Webhooks: keyturnd's webhooks verified by the
//! published Python library (`standardwebhooks` from PyPI), which
//! `tests/run-all` installs into a venv in its scratch directory and names in
//! `KT_STANDARDWEBHOOKS_PYTHON`. Without it the tests say they skipped and
//! why (`KT_STANDARDWEBHOOKS_UNAVAILABLE`).

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::e2e::{self, Keyturnd, World};
use crate::support::python::{self, PyServer};

const WITHIN: Duration = Duration::from_secs(20);

/// The receiver script, run by the venv's Python.
struct PyReceiver(PyServer);

impl PyReceiver {
    async fn start(python: &str, secret: &str) -> PyReceiver {
        PyReceiver(
            PyServer::start(
                python,
                &python::script("standard_webhooks_receiver.py"),
                &[secret],
            )
            .await,
        )
    }

    fn url(&self, path: &str) -> String {
        self.0.url(path)
    }

    /// Requests whose body names `id`.
    fn requests(&self, id: Uuid) -> Vec<Value> {
        let id = id.to_string();
        self.0
            .events()
            .into_iter()
            .filter(|r| {
                r["body"]
                    .as_str()
                    .and_then(|b| serde_json::from_str::<Value>(b).ok())
                    .is_some_and(|b| b["action_id"] == id.as_str())
            })
            .collect()
    }

    fn count(&self) -> usize {
        self.0.events().len()
    }

    fn last(&self) -> Value {
        self.0.events().pop().expect("a request")
    }
}

/// keyturnd with `keyturnd_secret` delivers one action to a receiver that
/// verifies with the library given `library_secret`; then the same request,
/// replayed as if ten minutes later, is refused by the library.
async fn verified_by_the_library(
    port: u16,
    python: &str,
    keyturnd_secret: &str,
    library_secret: &str,
) {
    let _serial = e2e::serial().await;
    let w = World::new(port).await;
    let tool = w.webhook_tool(json!({})).await;
    let rx = PyReceiver::start(python, library_secret).await;
    let k = Keyturnd::start(
        port,
        vec![
            ("KEYTURN_WEBHOOK_URL", rx.url("/")),
            ("KEYTURN_WEBHOOK_SECRET", keyturnd_secret.to_owned()),
        ],
    )
    .await;
    let a = w.queue(&tool, json!({"text": "verify me ✓"}), false).await;
    w.wait_status(a.id, "succeeded", WITHIN).await;
    k.stop().await;

    let reqs = rx.requests(a.id);
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = &reqs[0];
    assert_eq!(r["verified"], true, "the library verified it: {r}");
    assert_eq!(r["headers"]["webhook-id"], a.idempotency_key.as_str());

    // The same bytes and headers again.
    let replay = |path: &str| {
        let mut req = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client")
            .post(rx.url(path))
            .body(r["body"].as_str().expect("body").to_owned());
        for h in [
            "content-type",
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
        ] {
            req = req.header(h, r["headers"][h].as_str().expect("header"));
        }
        req.send()
    };
    let before = rx.count();
    let late = replay("/later?seconds=600").await.expect("replay");
    assert_eq!(late.status(), 401, "a replay ten minutes later is refused");
    e2e::eventually(WITHIN, "the replay's record", || async {
        (rx.count() > before).then_some(())
    })
    .await;
    let refused = rx.last();
    assert_eq!(refused["verified"], false);
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("too old")),
        "refused for its timestamp: {refused}"
    );
    let now = replay("/").await.expect("replay");
    assert_eq!(
        now.status(),
        200,
        "within the tolerance the same request verifies"
    );
}

/// A `whsec_` secret is one the library takes as it is.
#[tokio::test]
async fn test_whsec_secret_verifies_with_the_standard_webhooks_library() {
    let port = require_db!();
    let Some(python) = python::standard_webhooks(test_name!()) else {
        return;
    };
    let secret = format!("whsec_{}", STANDARD.encode(Uuid::new_v4().into_bytes()));
    verified_by_the_library(port, &python, &secret, &secret).await;
}

/// Any other secret signs with its UTF-8 bytes: the library is given
/// `whsec_` + their base64.
#[tokio::test]
async fn test_plain_secret_verifies_as_whsec_of_its_bytes() {
    let port = require_db!();
    let Some(python) = python::standard_webhooks(test_name!()) else {
        return;
    };
    let secret = format!("plain-🔑-{}", Uuid::new_v4().simple());
    let for_library = format!("whsec_{}", STANDARD.encode(secret.as_bytes()));
    verified_by_the_library(port, &python, &secret, &for_library).await;
}
