//! Logs at the most verbose level a deployment can ask for: everything a request passes
//! through (the HTTP server and client, the AWS SDK, onegrant) logs under
//! `RUST_LOG=trace` through onegrant's own filter, and nothing written carries the
//! bearer token, the login code or an `Authorization` header.

use onegrant_tests::{LogCapture, spawn_app};
use serde_json::json;

#[tokio::test]
async fn a_request_at_trace_level_logs_no_authorization_header_token_or_login_code() {
    let (captured, _guard) = LogCapture::start("trace");

    let app = spawn_app().await;
    let (code, _) = app.login_code("alice").await;
    let login = app.post("/v1/session", None, &json!({"code": code})).await;
    assert_eq!(login.status, 200, "{}", login.body);
    let token = login.body["token"].as_str().expect("token").to_string();
    let report = app
        .post(
            "/v1/grants",
            Some(&token),
            &json!({"request_id": "r1", "results": {onegrant_tests::WATER: "accept"}}),
        )
        .await;
    assert_eq!(report.status, 200, "{}", report.body);
    let refused = app.get("/v1/grants", Some("forged.token.value")).await;
    assert_eq!(refused.status, 401);

    let logs = captured.text();
    assert!(
        logs.contains("session issued") && logs.contains("session token refused"),
        "the requests were logged: {logs}"
    );
    for secret in [token.as_str(), code.as_str(), "forged.token.value"] {
        assert!(!logs.contains(secret), "a credential reached the logs");
    }
    let lowered = logs.to_lowercase();
    assert!(
        !lowered.contains("authorization"),
        "an Authorization header was logged"
    );
    assert!(
        !lowered.contains("bearer "),
        "a bearer credential was logged"
    );
    // Dependencies logged nothing below info although trace was asked for.
    for line in logs.lines() {
        let level = line.split("\"level\":\"").nth(1).unwrap_or_default();
        let target = line.split("\"target\":\"").nth(1).unwrap_or_default();
        if level.starts_with("DEBUG") || level.starts_with("TRACE") {
            assert!(
                ["onegrant", "grants", "session", "onegrant_local"]
                    .iter()
                    .any(|own| target.starts_with(own)),
                "a dependency logged below info: {line}"
            );
        }
    }
}

/// A tick given less time than one send needs (the WeChat call's timeout and the send
/// window) reads no page of the due index; it says so instead of doing nothing
/// silently.
#[tokio::test]
async fn a_tick_with_no_time_to_send_one_message_says_so() {
    let (captured, _guard) = LogCapture::start("warn");
    let app = spawn_app().await;
    let summary = app.tick(1).await;
    assert_eq!(summary.due, 0, "{summary:?}");
    let logs = captured.text();
    assert!(
        logs.contains("no time to send one message"),
        "the short tick was logged: {logs}"
    );
}
