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
