//! docs/sql-api.md: credential material, inexact numbers, and the params hash.

use keyturn_tests::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// An external tool whose schema accepts any params, so only keyturn's own
/// checks can refuse them.
async fn open_tool(w: &World) -> String {
    w.webhook_tool(json!({"summary": "open", "params_schema": {"type": "object", "additionalProperties": true}})).await
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";

#[tokio::test]
async fn test_credential_material_is_refused() {
    let w = World::new("member").await;
    let t = open_tool(&w).await;
    let bad: Vec<Value> = vec![
        json!({"password": "hunter2"}),
        json!({"note": {"deep": [{"secret": "x"}]}}),
        json!({"headers": {"Authorization": "x"}}),
        json!({"api_key": "abc"}),
        json!({"token": "abc"}),
        json!({"a": [[{"API_KEY": 1}]]}),
        json!({"note": "Bearer abcdef0123456789abcdef"}),
        json!({"list": ["ok", format!("{JWT}")]}),
        json!({"pem": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"}),
        json!({"pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----"}),
    ];
    for p in bad {
        assert_eq!(sqlstate(w.propose(&t, p.clone()).await), "22023", "{p}");
    }
    assert_eq!(w.actions().await, 0);
    // Benign look-alikes in the same shapes pass.
    for p in [
        json!({"note": {"deep": [{"topic": "x"}]}}),
        json!({"note": "bearer of good news"}),
        json!({"list": ["a.b.c"]}),
    ] {
        w.propose(&t, p.clone())
            .await
            .unwrap_or_else(|e| panic!("{p}: {e}"));
    }
}

#[tokio::test]
async fn test_inexact_numbers_are_refused_exact_ones_accepted() {
    let w = World::new("member").await;
    let t = open_tool(&w).await;
    for n in [
        "9007199254740993",
        "1152921504606846976",
        "333333333.33333329",
        "1e400",
        "-9007199254740993",
    ] {
        let text = format!("{{\"n\": {n}}}");
        let r = w
            .agent
            .query(
                "SELECT * FROM keyturn.propose($1, $2::text::jsonb)",
                &[&t, &text],
            )
            .await;
        assert_eq!(sqlstate(r), "22023", "{n}");
        let r = w
            .agent
            .query(
                "SELECT keyturn.params_hash($1, $2::text::jsonb)",
                &[&t, &text],
            )
            .await;
        assert_eq!(sqlstate(r), "22023", "params_hash of {n}");
    }
    for (n, canon) in [
        ("0.1", "0.1"),
        ("4.50", "4.5"),
        ("1E30", "1e+30"),
        ("9007199254740992", "9007199254740992"),
        ("-0", "0"),
        ("1e-7", "1e-7"),
    ] {
        let text = format!("{{\"n\": {n}}}");
        let row = w
            .agent
            .query_one(
                "SELECT params_hash FROM keyturn.propose($1, $2::text::jsonb)",
                &[&t, &text],
            )
            .await
            .unwrap_or_else(|e| panic!("{n}: {e}"));
        let got: String = row.get(0);
        let want = sha256_hex(&format!(
            "{{\"params\":{{\"n\":{canon}}},\"tool\":\"{t}\"}}"
        ));
        assert_eq!(got, want, "hash of {n} must hash the JCS form {canon}");
    }
}

#[tokio::test]
async fn test_params_hash_is_sha256_of_jcs() {
    let w = World::new("member").await;
    let t = open_tool(&w).await;
    // Keys sort by UTF-16 code units: U+1F600 (D83D DE00) before U+E000, the
    // opposite of UTF-8/code-point order; nested keys sort too; no whitespace.
    let params = json!({"z": 1, "b": {"y": true, "a": null}, "\u{e000}": "e", "\u{1f600}": "smile", "s": "q\"\\\n\u{1}é"});
    let canonical_params = "{\"b\":{\"a\":null,\"y\":true},\"s\":\"q\\\"\\\\\\n\\u0001é\",\"z\":1,\"\u{1f600}\":\"smile\",\"\u{e000}\":\"e\"}";
    let got: String = w
        .agent
        .query_one("SELECT keyturn.canonical_json($1)", &[&params])
        .await
        .unwrap()
        .get(0);
    assert_eq!(got, canonical_params);
    let whole = format!("{{\"params\":{canonical_params},\"tool\":\"{t}\"}}");
    let want = sha256_hex(&whole);
    let p = w.propose(&t, params.clone()).await.unwrap();
    assert_eq!(p.params_hash, want, "propose's params_hash");
    let h: String = w
        .agent
        .query_one("SELECT keyturn.params_hash($1, $2)", &[&t, &params])
        .await
        .unwrap()
        .get(0);
    assert_eq!(h, want, "keyturn.params_hash");
    let stored: String = w
        .superuser
        .query_one(
            "SELECT params_hash FROM keyturn.action WHERE id = $1",
            &[&p.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, want);
    // The tool name is part of the hash.
    let other: String = w
        .agent
        .query_one("SELECT keyturn.params_hash('other_tool', $1)", &[&params])
        .await
        .unwrap()
        .get(0);
    assert_ne!(other, want);
}

#[tokio::test]
async fn test_token_is_random_urlsafe_and_only_a_verifier_is_stored() {
    let w = World::new("member").await;
    let t = open_tool(&w).await;
    let a = w.propose(&t, json!({"x": 1})).await.unwrap();
    let b = w.propose(&t, json!({"x": 1})).await.unwrap();
    assert_ne!(a.token, b.token);
    assert_eq!(a.params_hash, b.params_hash);
    assert!(a.token.len() >= 43, "32 random bytes in URL-safe text");
    assert!(
        a.token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{}",
        a.token
    );
    // Nothing in the action row holds the token text.
    let hits = count(
        &w.superuser,
        "SELECT count(*) FROM keyturn.action a WHERE a.id = $1 AND strpos(to_jsonb(a)::text, $2) > 0",
        &[&a.id, &a.token],
    )
    .await;
    assert_eq!(hits, 0, "the token itself is never stored");
}

/// An sql tool's form: each shape it may not have, refused at propose with
/// 22023 and a message naming the first problem (docs/sql-api.md), keys
/// taken in jsonb's order (shorter first); nothing is proposed.
#[tokio::test]
async fn test_an_sql_forms_problems_are_named() {
    let w = World::new("member").await;
    let t = w.deal_tool(json!({})).await;
    let cases: Vec<(Value, String)> = vec![
        (
            json!({"where": {"id": 1}}),
            format!(
                r#"params of sql tool {t} must be exactly {{"where": {{...}}, "set": {{...}}}}"#
            ),
        ),
        (
            json!({"where": {"id": 1}, "set": {"stage": "won"}, "x": 1}),
            format!(
                r#"params of sql tool {t} must be exactly {{"where": {{...}}, "set": {{...}}}}"#
            ),
        ),
        (
            json!({"where": {}, "set": {"stage": "won"}}),
            "params.where and params.set must be non-empty objects".into(),
        ),
        (
            json!({"where": {"id": 1}, "set": []}),
            "params.where and params.set must be non-empty objects".into(),
        ),
        (
            json!({"where": {"zzzzz": 1, "Name": 1}, "set": {"stage": "won"}}),
            format!("tool {t} may not filter on 'Name' (filterable columns: id, owner)"),
        ),
        (
            json!({"where": {"id": null}, "set": {"stage": "won"}}),
            "params.where.id must be a string, number, boolean or a list of them".into(),
        ),
        (
            json!({"where": {"id": [1, [2]]}, "set": {"stage": "won"}}),
            "params.where.id must list 1 to 1000 strings, numbers or booleans".into(),
        ),
        (
            json!({"where": {"id": (1..=1001).collect::<Vec<_>>()}, "set": {"stage": "won"}}),
            "params.where.id must list 1 to 1000 strings, numbers or booleans".into(),
        ),
        (
            json!({"where": {"id": 1}, "set": {"name": "x", "stage": "won"}}),
            format!("tool {t} may not set 'name' (settable columns: stage, amount)"),
        ),
        (
            json!({"where": {"id": 1}, "set": {"stage": {"a": 1}}}),
            "params.set.stage must be a scalar for a text column".into(),
        ),
    ];
    for (params, want) in cases {
        let got = message(w.propose(&t, params.clone()).await);
        assert_eq!(got, format!("keyturn: {want}"), "{params}");
    }
    assert_eq!(w.actions().await, 0);
}
