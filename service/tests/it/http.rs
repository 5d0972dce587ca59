//! The HTTP surface, driven through `app()` with `oneshot`: no server, no
//! database.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use keyturnd::{app, AppState};
use tower::ServiceExt;

async fn get(state: &AppState, path: &str) -> (StatusCode, String, Option<String>) {
    let response = app(state.clone())
        .oneshot(Request::get(path).body(Body::empty()).expect("request"))
        .await
        .expect("infallible router");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        String::from_utf8_lossy(&bytes).into_owned(),
        content_type,
    )
}

#[tokio::test]
async fn test_healthz_is_200_while_running() {
    let state = AppState::new();
    assert_eq!(get(&state, "/healthz").await.0, StatusCode::OK);
    state.health.set_shutting_down();
    assert_eq!(
        get(&state, "/healthz").await.0,
        StatusCode::OK,
        "alive while draining"
    );
}

#[tokio::test]
async fn test_readyz_follows_the_database_and_shutdown() {
    let state = AppState::new();
    let (status, body, _) = get(&state, "/readyz").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready before the database"
    );
    assert!(body.contains("database"));

    state.health.set_db_ready(true);
    assert_eq!(get(&state, "/readyz").await.0, StatusCode::OK);

    state.health.set_db_ready(false);
    assert_eq!(
        get(&state, "/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "lost connection"
    );

    state.health.set_db_ready(true);
    state.health.set_shutting_down();
    let (status, body, _) = get(&state, "/readyz").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "503 after SIGTERM even with a database"
    );
    assert!(body.contains("shutting down"));
}

#[tokio::test]
async fn test_readyz_reports_stalled_notifications_and_what_to_do() {
    let state = AppState::new();
    state.health.set_db_ready(true);
    state.health.set_notify_stalled(true);
    let (status, body, _) = get(&state, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("notifications stalled"), "{body}");
    assert!(body.contains("KEYTURN_LISTEN_DATABASE_URL"), "{body}");

    state.health.set_notify_stalled(false);
    assert_eq!(get(&state, "/readyz").await.0, StatusCode::OK, "recovered");

    state.health.set_notify_stalled(true);
    state.health.set_shutting_down();
    let (_, body, _) = get(&state, "/readyz").await;
    assert!(body.contains("shutting down"), "shutdown says so first");
}

#[tokio::test]
async fn test_metrics_text_names_every_metric() {
    let state = AppState::new();
    state.metrics.action("succeeded");
    state.metrics.dispatch_seconds.observe(0.02);
    state.metrics.lease_batch_size.observe(3.0);
    state.metrics.uncertain.set(2);
    let (status, body, content_type) = get(&state, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type
        .unwrap_or_default()
        .starts_with("application/openmetrics-text"));
    for name in [
        "keyturn_actions_total{outcome=\"succeeded\"} 1",
        "keyturn_actions_total{outcome=\"unknown\"} 0",
        "keyturn_dispatch_seconds_bucket",
        "keyturn_dispatch_seconds_count 1",
        "keyturn_lease_batch_size_sum 3",
        "keyturn_uncertain 2",
        "keyturn_sweep_total{kind=\"uncertain\"} 0",
        "keyturn_db_reconnects_total{conn=\"listen\"} 0",
        "keyturn_handbacks_total{reason=\"unknown_provider\"} 0",
        "keyturn_unrecorded_outcomes_total 0",
        "keyturn_notify_stalled 0",
        "keyturn_notify_heartbeats_total{result=\"missed\"} 0",
        "keyturn_notify_heartbeats_total{result=\"unsent\"} 0",
    ] {
        assert!(body.contains(name), "missing `{name}` in:\n{body}");
    }
    assert!(body.trim_end().ends_with("# EOF"));
}

#[tokio::test]
async fn test_unknown_route_is_404() {
    assert_eq!(
        get(&AppState::new(), "/actions").await.0,
        StatusCode::NOT_FOUND
    );
}

// ---------------------------------------------------------------------------
// /rpc and the pages, without a database: everything keyturnd refuses
// before it asks one, and the headers of every answer.
// ---------------------------------------------------------------------------

pub(crate) mod rpc {
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use jsonwebtoken::jwk::{Jwk, JwkSet};
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    use keyturnd::jwt::Verifier;
    use keyturnd::rpc::catalog::{Arg, Catalog, Function, Returns};
    use keyturnd::rpc::Rpc;
    use keyturnd::{app, AppState};
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use crate::support::web::now;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn arg(name: &str, ty: &str, has_default: bool) -> Arg {
        Arg {
            name: name.into(),
            ty: ty.into(),
            has_default,
        }
    }

    /// The catalog of a database with preview and approve.
    fn catalog() -> Catalog {
        Catalog::from_functions([
            Function {
                name: "preview".into(),
                args: vec![arg("action_id", "uuid", false), arg("token", "text", false)],
                returns: Returns::Scalar,
            },
            Function {
                name: "approve".into(),
                args: vec![
                    arg("action_id", "uuid", false),
                    arg("token", "text", false),
                    arg("params", "jsonb", true),
                ],
                returns: Returns::Set,
            },
        ])
    }

    /// An app whose `/rpc` pool points at a closed port: a call that passes
    /// every check keyturnd makes itself answers 503.
    fn state(verifier: Verifier) -> AppState {
        let metrics = Arc::new(keyturnd::metrics::Metrics::new());
        let url = format!(
            "postgres://nobody@127.0.0.1:{}/none",
            crate::support::closed_port()
        );
        let pool = keyturnd::db::pool(&url, 1, metrics).expect("pool");
        AppState::new().with_rpc(Rpc::new(verifier, catalog(), pool))
    }

    fn hs256(aud: Option<&str>) -> AppState {
        state(
            Verifier::hs256(SECRET, aud.map(str::to_owned), ["web_human".to_owned()]).expect("key"),
        )
    }

    fn token(claims: Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET).expect("key"),
        )
        .expect("encode")
    }

    fn human(exp_in: i64) -> String {
        token(
            json!({"role": "web_human", "sub": "alice", "tenant_id": "acme", "exp": now() + exp_in}),
        )
    }

    struct Answer {
        status: StatusCode,
        headers: axum::http::HeaderMap,
        body: Value,
    }

    async fn post(
        state: &AppState,
        function: &str,
        jwt: Option<&str>,
        body: impl Into<Body>,
    ) -> Answer {
        let mut request =
            Request::post(format!("/rpc/{function}")).header("content-type", "application/json");
        if let Some(jwt) = jwt {
            request = request.header("authorization", format!("Bearer {jwt}"));
        }
        let response = app(state.clone())
            .oneshot(request.body(body.into()).expect("request"))
            .await
            .expect("infallible router");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        Answer {
            status,
            headers,
            body,
        }
    }

    fn preview_body() -> String {
        json!({"action_id": "00000000-0000-0000-0000-000000000001", "token": "t"}).to_string()
    }

    /// PostgREST's error shape: exactly code, message, details, hint.
    fn assert_shape(a: &Answer, code: &str) {
        let keys: Vec<&String> = a
            .body
            .as_object()
            .expect("an error object")
            .keys()
            .collect();
        assert_eq!(keys, ["code", "details", "hint", "message"], "{}", a.body);
        assert_eq!(a.body["code"], code, "{}", a.body);
        assert_eq!(a.headers["cache-control"], "no-store");
    }

    #[tokio::test]
    async fn test_missing_malformed_and_unsigned_jwts_are_401() {
        let s = hs256(None);
        let a = post(&s, "preview", None, preview_body()).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert_eq!(a.headers["www-authenticate"], "Bearer");
        assert_shape(&a, "PGRST301");
        for bad in ["not-a-jwt", "a.b.c"] {
            assert_eq!(
                post(&s, "preview", Some(bad), preview_body()).await.status,
                StatusCode::UNAUTHORIZED
            );
        }
        use base64::Engine;
        let b64 =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let claims = json!({"role": "web_human", "exp": now() + 60});
        let none = format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "JWT"})),
            b64(&claims)
        );
        let a = post(&s, "preview", Some(&none), preview_body()).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "alg none: {}", a.body);
        // A JWT signed with another key.
        let forged = encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"not the configured secret, 32+ bytes").expect("key"),
        )
        .expect("encode");
        assert_eq!(
            post(&s, "preview", Some(&forged), preview_body())
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
    }

    #[tokio::test]
    async fn test_expiry_has_60_seconds_of_leeway() {
        let s = hs256(None);
        // Past the checks keyturnd makes itself, a call meets the (closed) database: 503.
        let within = post(&s, "preview", Some(&human(-30)), preview_body()).await;
        assert_eq!(
            within.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            within.body
        );
        assert_shape(&within, "PGRST000");
        let past = post(&s, "preview", Some(&human(-90)), preview_body()).await;
        assert_eq!(past.status, StatusCode::UNAUTHORIZED);
        assert!(
            past.body["message"]
                .as_str()
                .unwrap_or("")
                .contains("expired"),
            "{}",
            past.body
        );
        let future_nbf = token(json!({"role": "web_human", "exp": now() + 600, "nbf": now() + 90}));
        assert_eq!(
            post(&s, "preview", Some(&future_nbf), preview_body())
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
        // No exp: checked when present, as PostgREST checks it, so this one
        // passes keyturnd's checks and meets the (closed) database.
        let no_exp = token(json!({"role": "web_human"}));
        assert_eq!(
            post(&s, "preview", Some(&no_exp), preview_body())
                .await
                .status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn test_audience_when_configured() {
        let s = hs256(Some("keyturn"));
        let wrong = token(json!({"role": "web_human", "aud": "another-app", "exp": now() + 60}));
        assert_eq!(
            post(&s, "preview", Some(&wrong), preview_body())
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
        let missing = human(60);
        assert_eq!(
            post(&s, "preview", Some(&missing), preview_body())
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
        let right = token(json!({"role": "web_human", "aud": "keyturn", "exp": now() + 60}));
        assert_eq!(
            post(&s, "preview", Some(&right), preview_body())
                .await
                .status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn test_role_outside_the_allowlist_is_403() {
        let s = hs256(None);
        for claims in [
            json!({"role": "app_agent", "exp": now() + 60}),
            json!({"role": "postgres", "exp": now() + 60}),
            json!({"exp": now() + 60}),
            json!({"role": ["web_human"], "exp": now() + 60}),
        ] {
            let a = post(&s, "preview", Some(&token(claims.clone())), preview_body()).await;
            assert_eq!(a.status, StatusCode::FORBIDDEN, "{claims}");
            assert_shape(&a, "PGRST300");
        }
    }

    #[tokio::test]
    async fn test_only_the_allowlisted_functions_with_their_arguments_exist() {
        let s = hs256(None);
        let jwt = human(60);
        for function in [
            "propose",
            "lease",
            "complete",
            "register_tool",
            "Preview",
            "preview;drop",
        ] {
            let a = post(&s, function, Some(&jwt), "{}").await;
            assert_eq!(a.status, StatusCode::NOT_FOUND, "{function}");
            assert_shape(&a, "PGRST202");
        }
        let a = post(
            &s,
            "preview",
            Some(&jwt),
            json!({"action_id": "x", "token": "t", "tokenn": 1}).to_string(),
        )
        .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND);
        assert_shape(&a, "PGRST202");
        assert!(
            a.body["hint"]
                .as_str()
                .unwrap_or("")
                .contains("action_id uuid, token text"),
            "{}",
            a.body
        );
        let a = post(
            &s,
            "approve",
            Some(&jwt),
            json!({"action_id": "x"}).to_string(),
        )
        .await;
        assert_eq!(
            a.status,
            StatusCode::NOT_FOUND,
            "a required argument missing"
        );
        // Optional params may be left out: the call gets as far as the database.
        let a = post(&s, "approve", Some(&jwt), preview_body()).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        // GET is not RPC here: tokens never travel in a query string.
        let response = app(s.clone())
            .oneshot(
                Request::get("/rpc/preview?action_id=x&token=t")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("router");
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn test_bodies_must_be_json_objects_under_the_limit() {
        let s = hs256(None);
        let jwt = human(60);
        for bad in ["[1]", "\"x\"", "{", "not json"] {
            let a = post(&s, "preview", Some(&jwt), bad).await;
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}");
            assert_shape(&a, "PGRST102");
        }
        let big =
            json!({"action_id": "x", "token": "y".repeat(keyturnd::http::BODY_LIMIT)}).to_string();
        let a = post(&s, "preview", Some(&jwt), big).await;
        assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_shape(&a, "PGRST413");
    }

    #[tokio::test]
    async fn test_rpc_is_absent_without_a_jwt_key() {
        let a = post(&AppState::new(), "preview", None, preview_body()).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND);
    }

    /// A JWKS verifier trusting `keys`, and its app.
    fn jwks(keys: Vec<Jwk>) -> AppState {
        let set = serde_json::to_string(&JwkSet { keys }).expect("jwks json");
        state(Verifier::jwks(&set, None, ["web_human".to_owned()]).expect("jwks"))
    }

    fn signed(alg: Algorithm, kid: Option<&str>, key: &EncodingKey) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        encode(
            &header,
            &json!({"role": "web_human", "exp": now() + 60}),
            key,
        )
        .expect("sign")
    }

    pub(crate) fn with_kid(mut jwk: Jwk, kid: &str) -> Jwk {
        jwk.common.key_id = Some(kid.to_owned());
        jwk
    }

    #[tokio::test]
    async fn test_jwks_rs256_and_es256_keys_verify_and_others_do_not() {
        use p256::pkcs8::EncodePrivateKey;
        use rsa::pkcs1::EncodeRsaPrivateKey;
        use rsa::Generate;

        let rsa_key = rsa::PrivateKey::generate();
        let rsa_enc = EncodingKey::from_rsa_der(rsa_key.to_pkcs1_der().expect("pkcs1").as_bytes());
        let ec_key = p256::SecretKey::generate();
        let ec_enc = EncodingKey::from_ec_der(ec_key.to_pkcs8_der().expect("pkcs8").as_bytes());
        let rsa_jwk = with_kid(
            Jwk::from_encoding_key(&rsa_enc, Algorithm::RS256).expect("jwk"),
            "r1",
        );
        let ec_jwk = with_kid(
            Jwk::from_encoding_key(&ec_enc, Algorithm::ES256).expect("jwk"),
            "e1",
        );
        let s = jwks(vec![rsa_jwk.clone(), ec_jwk.clone()]);

        for (what, jwt) in [
            (
                "RS256 by kid",
                signed(Algorithm::RS256, Some("r1"), &rsa_enc),
            ),
            (
                "ES256 by kid",
                signed(Algorithm::ES256, Some("e1"), &ec_enc),
            ),
            (
                "RS256 without kid",
                signed(Algorithm::RS256, None, &rsa_enc),
            ),
        ] {
            let a = post(&s, "preview", Some(&jwt), preview_body()).await;
            assert_eq!(
                a.status,
                StatusCode::SERVICE_UNAVAILABLE,
                "{what}: {}",
                a.body
            );
        }
        // Signed by a key the set does not hold.
        let stranger = p256::SecretKey::generate();
        let stranger = EncodingKey::from_ec_der(stranger.to_pkcs8_der().expect("pkcs8").as_bytes());
        let a = post(
            &s,
            "preview",
            Some(&signed(Algorithm::ES256, Some("e1"), &stranger)),
            preview_body(),
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
        // The right key under the wrong kid.
        let a = post(
            &s,
            "preview",
            Some(&signed(Algorithm::RS256, Some("e1"), &rsa_enc)),
            preview_body(),
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
        // HS256 keyed with the RSA public key's text (algorithm confusion).
        let n = match &rsa_jwk.algorithm {
            jsonwebtoken::jwk::AlgorithmParameters::RSA(p) => p.n.clone(),
            _ => unreachable!(),
        };
        let confused = signed(
            Algorithm::HS256,
            Some("r1"),
            &EncodingKey::from_secret(n.as_bytes()).expect("key"),
        );
        let a = post(&s, "preview", Some(&confused), preview_body()).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);

        // A set of only encryption keys, or of unsupported keys, is refused at start.
        let mut enc = rsa_jwk.clone();
        enc.common.public_key_use = Some(jsonwebtoken::jwk::PublicKeyUse::Encryption);
        let set = serde_json::to_string(&JwkSet { keys: vec![enc] }).expect("json");
        assert!(Verifier::jwks(&set, None, ["web_human".to_owned()]).is_err());
        assert!(Verifier::jwks("{\"keys\": 1}", None, ["web_human".to_owned()]).is_err());
    }

    /// The JWK of a freshly generated RSA key of `bits`, labelled RS256.
    pub(crate) fn rsa_jwk(bits: usize, kid: &str) -> Jwk {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        let key = rsa::PrivateKey::new(&mut getrandom::SysRng, bits).expect("generate");
        let enc = EncodingKey::from_rsa_der(key.to_pkcs1_der().expect("pkcs1").as_bytes());
        with_kid(
            Jwk::from_encoding_key(&enc, Algorithm::RS256).expect("jwk"),
            kid,
        )
    }

    /// Issue 35 item 3: a key that could never verify a token, or should not,
    /// stops keyturnd at start, and the message names its `kid`.
    #[test]
    fn test_jwks_refuses_weak_and_mismatched_keys_naming_the_kid() {
        use p256::pkcs8::EncodePrivateKey;
        use rsa::Generate;
        let refused = |keys: Vec<Value>, kid: &str, why: &str| {
            let set = json!({ "keys": keys }).to_string();
            let err =
                Verifier::jwks(&set, None, ["web_human".to_owned()]).expect_err("refused at start");
            assert!(err.contains(kid) && err.contains(why), "{kid}: {err}");
        };
        let good = serde_json::to_value(rsa_jwk(2048, "good")).expect("json");
        let weak = serde_json::to_value(rsa_jwk(1024, "weak")).expect("json");
        refused(vec![good.clone(), weak], "weak", "2048");
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("random");
        use base64::Engine;
        let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
        refused(
            vec![json!({"kty": "oct", "k": k, "alg": "RS256", "kid": "octo"})],
            "octo",
            "RS256",
        );
        let ec = p256::SecretKey::generate();
        let ec = EncodingKey::from_ec_der(ec.to_pkcs8_der().expect("pkcs8").as_bytes());
        let mut ec_as_rs = serde_json::to_value(with_kid(
            Jwk::from_encoding_key(&ec, Algorithm::ES256).expect("jwk"),
            "ec-as-rs",
        ))
        .expect("json");
        ec_as_rs["alg"] = json!("RS256");
        refused(vec![ec_as_rs], "ec-as-rs", "RS256");
        let mut rs_as_es = good.clone();
        rs_as_es["alg"] = json!("ES256");
        rs_as_es["kid"] = json!("rs-as-es");
        refused(vec![rs_as_es], "rs-as-es", "ES256");
        let set = json!({ "keys": [good] }).to_string();
        Verifier::jwks(&set, None, ["web_human".to_owned()]).expect("a 2048-bit RS256 key");
    }

    async fn get(state: &AppState, path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
        let response = app(state.clone())
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("router");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (
            status,
            headers,
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    }

    #[tokio::test]
    async fn test_pages_and_every_answer_carry_the_security_headers() {
        let s = AppState::new();
        for (path, content_type) in [
            ("/card", "text/html"),
            ("/console", "text/html"),
            ("/card/keyturn-card.js", "text/javascript"),
            ("/card/jcs.js", "text/javascript"),
            ("/card/keyturn.css", "text/css"),
            ("/healthz", "text/plain"),
        ] {
            let (status, headers, _) = get(&s, path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert!(
                headers["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with(content_type),
                "{path}"
            );
            assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
            assert_eq!(headers["referrer-policy"], "no-referrer", "{path}");
            let csp = headers["content-security-policy"].to_str().unwrap();
            assert!(csp.starts_with("default-src 'self';"), "{path}: {csp}");
            assert!(csp.ends_with("frame-ancestors 'none'"), "{path}: {csp}");
        }
        assert_eq!(
            get(&s, "/card/../Cargo.toml").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(get(&s, "/card/nope.js").await.0, StatusCode::NOT_FOUND);
        let framed = AppState::new()
            .with_csp(keyturnd::config::csp_header("https://app.example.com").expect("valid"));
        let (_, headers, html) = get(&framed, "/card").await;
        assert!(headers["content-security-policy"]
            .to_str()
            .unwrap()
            .ends_with("frame-ancestors https://app.example.com"));
        assert!(html.contains("<keyturn-card>"));
        assert!(keyturnd::config::csp_header("*; script-src 'unsafe-inline'").is_err());
    }
}
