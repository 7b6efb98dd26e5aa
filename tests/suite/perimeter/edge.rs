//! The edge protection's origin check: with an origin secret configured, a request that
//! did not come through the stack's CloudFront distribution (and so around its
//! per-client limits) is refused before any handler runs — 403, nothing read or
//! written — and one that carries the secret is served as before.

use onegrant_tests::{TestApp, spawn_app_with};
use serde_json::{Value, json};

const ORIGIN: &str = "edge-origin-secret-0123456789abcdef0123456789";

/// `method path` with `origin` in the origin header (if given), a bearer `token` and a
/// JSON body: the status and the body.
async fn send(
    app: &TestApp,
    (method, path): (&str, &str),
    origin: Option<&str>,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = app.http.request(method, format!("{}{path}", app.base_url));
    if let Some(origin) = origin {
        request = request.header(onegrant::http::ORIGIN_HEADER, origin);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let answer = request.send().await.expect("request reaches the API");
    let status = answer.status().as_u16();
    let body = answer.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn with_edge_protection_a_request_around_cloudfront_is_refused_before_any_handler() {
    let app = spawn_app_with(&[("ORIGIN_SECRET", ORIGIN)]).await;
    // A login through the edge: the origin header is all that differs.
    let (code, _) = app.login_code("edge").await;
    let (status, login) = send(
        &app,
        ("POST", "/v1/session"),
        Some(ORIGIN),
        None,
        Some(&json!({"code": code})),
    )
    .await;
    assert_eq!(status, 200, "{login}");
    let token = login["token"].as_str().expect("token").to_string();
    app.round_trips.take();
    let before = app.items().await.len();

    let (other_code, _) = app.login_code("edge-other").await;
    let routes: [(&str, &str, Option<Value>); 7] = [
        ("POST", "/v1/session", Some(json!({"code": other_code}))),
        ("GET", "/v1/grants", None),
        (
            "POST",
            "/v1/grants",
            Some(json!({"request_id": "edge-1", "results": {"tmpl_water_reminder": "accept"}})),
        ),
        ("GET", "/v1/reminders/water", None),
        (
            "PUT",
            "/v1/reminders/water",
            Some(json!({"enabled": false})),
        ),
        ("POST", "/v1/notifications/read-all", Some(json!({}))),
        (
            "PUT",
            "/v1/preferences",
            Some(json!({"muted_types": ["marketing"]})),
        ),
    ];
    // Missing, wrong, a prefix, the secret with more after it, empty.
    let prefix = &ORIGIN[..ORIGIN.len() - 1];
    let longer = format!("{ORIGIN}x");
    let wrong: [Option<&str>; 5] = [None, Some("guess"), Some(prefix), Some(&longer), Some("")];
    for (method, path, body) in &routes {
        for origin in wrong {
            let (status, answer) =
                send(&app, (method, path), origin, Some(&token), body.as_ref()).await;
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (403, Some("forbidden")),
                "{method} {path} with {origin:?}: {answer}"
            );
            let text = answer.to_string();
            assert!(
                !text.contains(ORIGIN) && !text.contains("cloudfront"),
                "{text}"
            );
        }
    }
    // Refused before the handler: not one read or write, nothing stored.
    let touched = app.round_trips.take();
    assert!(
        touched.is_empty(),
        "refused requests touched the table: {touched:?}"
    );
    assert_eq!(app.items().await.len(), before);

    // Through the edge, the same requests are served.
    let (status, plan) = send(
        &app,
        ("GET", "/v1/reminders/water"),
        Some(ORIGIN),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 200, "{plan}");
    let (status, saved) = send(
        &app,
        ("PUT", "/v1/preferences"),
        Some(ORIGIN),
        Some(&token),
        Some(&json!({"quiet_hours": null, "muted_types": ["marketing"]})),
    )
    .await;
    assert_eq!(status, 200, "{saved}");
}

/// A login and a grants read that did not come through the edge (no origin header,
/// then `header`): both served.
async fn served_around_the_edge(app: &TestApp, user: &str, header: &str) {
    let (code, _) = app.login_code(user).await;
    let (status, login) = send(
        app,
        ("POST", "/v1/session"),
        None,
        None,
        Some(&json!({"code": code})),
    )
    .await;
    assert_eq!(status, 200, "{login}");
    let token = login["token"].as_str().expect("token");
    let (status, grants) = send(app, ("GET", "/v1/grants"), Some(header), Some(token), None).await;
    assert_eq!(status, 200, "{grants}");
}

#[tokio::test]
async fn without_edge_protection_the_api_is_served_directly() {
    // An origin header means nothing then.
    served_around_the_edge(&spawn_app_with(&[]).await, "direct", "anything").await;
}

#[tokio::test]
async fn while_counting_a_request_around_the_edge_is_served() {
    // The first deploy of the edge (`EdgeOriginCheck=count`): clients and WeChat still
    // on the old address keep working while they move (counted, RequestsAroundEdge).
    let app = spawn_app_with(&[("ORIGIN_SECRET", ORIGIN), ("ORIGIN_CHECK", "count")]).await;
    served_around_the_edge(&app, "moving", "wrong").await;
}
