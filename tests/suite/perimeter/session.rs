//! `POST /v1/session`: WeChat vouches for a login code, onegrant issues the token.

use onegrant_tests::{spawn_app, spawn_app_with};
use serde_json::json;

#[tokio::test]
async fn a_login_code_buys_a_token_that_carries_the_users_openid() {
    let app = spawn_app().await;
    let (code, openid) = app.login_code("alice").await;
    let answer = app.post("/v1/session", None, &json!({"code": code})).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["token_type"], "Bearer");
    assert_eq!(answer.body["expires_in"], 7200);
    let token = answer.body["token"].as_str().expect("token");
    let verified = app
        .deps
        .sessions
        .verify(token)
        .await
        .expect("the token verifies");
    assert_eq!(verified.as_str(), openid);
}

#[tokio::test]
async fn every_code_of_one_user_leads_to_the_same_account() {
    let app = spawn_app().await;
    let first = app.login("alice").await;
    let second = app.login("alice").await;
    let other = app.login("bob").await;
    let id = async |t: &str| {
        app.deps
            .sessions
            .verify(t)
            .await
            .expect("valid")
            .to_string()
    };
    assert_eq!(id(&first).await, id(&second).await);
    assert_ne!(id(&first).await, id(&other).await);
}

#[tokio::test]
async fn a_code_is_single_use_and_an_unknown_code_is_refused() {
    let app = spawn_app().await;
    let (code, _) = app.login_code("alice").await;
    assert_eq!(
        app.post("/v1/session", None, &json!({"code": code}))
            .await
            .status,
        200
    );
    let reused = app.post("/v1/session", None, &json!({"code": code})).await;
    assert_eq!(
        (reused.status, reused.body["error"]["code"].as_str()),
        (401, Some("invalid_code"))
    );
    let unknown = app
        .post("/v1/session", None, &json!({"code": "never-issued"}))
        .await;
    assert_eq!(
        (unknown.status, unknown.body["error"]["code"].as_str()),
        (401, Some("invalid_code"))
    );
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(counters["jscode2session_calls"], 3);
}

#[tokio::test]
async fn wechat_busy_or_slow_answers_503_with_retry_after() {
    let app = spawn_app_with(&[("WECHAT_TIMEOUT_MS", "300")]).await;
    for fault in [json!({"errcode": -1}), json!({"hang_ms": 1500})] {
        app.control("POST", "login-fault", Some(fault.clone()))
            .await;
        let (code, _) = app.login_code("alice").await;
        let answer = app.post("/v1/session", None, &json!({"code": code})).await;
        assert_eq!(answer.status, 503, "{fault}: {}", answer.body);
        assert_eq!(answer.body["error"]["code"], "unavailable");
        assert!(
            answer.headers.get("retry-after").is_some(),
            "{fault}: Retry-After"
        );
    }
}

#[tokio::test]
async fn wechat_unreachable_answers_503() {
    // A port that was just free: nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let app = spawn_app_with(&[("WECHAT_API_BASE", closed.as_str())]).await;
    let answer = app.post("/v1/session", None, &json!({"code": "any"})).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
}
