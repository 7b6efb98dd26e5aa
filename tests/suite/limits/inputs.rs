//! Bad input, one table per route: each case gets its documented status and error code,
//! and nothing is stored.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use onegrant_local::stack::LOCAL_SESSION_SECRET;
use onegrant_tests::{ORDER, WATER, spawn_app};
use serde_json::json;

fn sign(secret: &str, sub: &str, exp_offset_seconds: i64) -> String {
    sign_at(secret, sub, -60, exp_offset_seconds)
}

/// A token claiming to be issued `iat_offset` and to expire `exp_offset` seconds from now.
fn sign_at(secret: &str, sub: &str, iat_offset: i64, exp_offset: i64) -> String {
    let now = onegrant::Clock::real_now().timestamp();
    let claims =
        json!({"sub": sub, "iat": now + iat_offset, "exp": now + exp_offset, "iss": "onegrant"});
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("key");
    onegrant::session::jwt_crypto::install();
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).expect("sign")
}

enum Auth {
    Valid,
    None,
    Raw(String),
}

#[tokio::test]
async fn bad_grant_reports_and_tokens_are_refused_with_their_own_error_and_store_nothing() {
    let app = spawn_app().await;
    let (_, openid) = app.login_code("alice").await;
    let valid = app.login("alice").await;
    let big = format!(
        r#"{{"request_id":"wr_big","results":{{"{WATER}":"accept"}},"pad":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    let six = json!({"request_id": "wr_6", "results": {"a": "accept", "b": "accept", "c": "accept", "d": "accept", "e": "accept", "f": "accept"}});
    let forged = sign(&"f".repeat(48), &openid, 3600);
    let expired = sign(LOCAL_SESSION_SECRET, &openid, -3600);
    // Signed with the deployment's own key (a leaked one): a lifetime the deployment
    // never issues (two hours here), and an issue time in the future.
    let lasting = sign(LOCAL_SESSION_SECRET, &openid, 10 * 365 * 24 * 3600);
    let future = sign_at(LOCAL_SESSION_SECRET, &openid, 3600, 4200);
    let none_alg = {
        // An unsigned token ("alg": "none") naming a victim.
        use base64::Engine;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.",
            e.encode(br#"{"alg":"none","typ":"JWT"}"#),
            e.encode(json!({"sub": openid, "exp": 4102444800i64, "iss": "onegrant"}).to_string())
        )
    };
    let ok_body = json!({"request_id": "wr_ok", "results": {WATER: "accept"}}).to_string();

    let cases: Vec<(&str, Auth, String, u16, &str)> = vec![
        (
            "malformed JSON",
            Auth::Valid,
            r#"{"request_id": "wr_1", "results": {"#.into(),
            400,
            "malformed_json",
        ),
        (
            "empty body",
            Auth::Valid,
            String::new(),
            400,
            "malformed_json",
        ),
        (
            "not an object",
            Auth::Valid,
            "[]".into(),
            400,
            "invalid_body",
        ),
        (
            "missing request_id",
            Auth::Valid,
            json!({"results": {WATER: "accept"}}).to_string(),
            400,
            "invalid_body",
        ),
        (
            "missing results",
            Auth::Valid,
            json!({"request_id": "wr_1"}).to_string(),
            400,
            "invalid_body",
        ),
        (
            "request_id of the wrong type",
            Auth::Valid,
            json!({"request_id": 7, "results": {WATER: "accept"}}).to_string(),
            400,
            "invalid_body",
        ),
        (
            "results of the wrong type",
            Auth::Valid,
            json!({"request_id": "wr_1", "results": [WATER]}).to_string(),
            400,
            "invalid_body",
        ),
        (
            "a result of the wrong type",
            Auth::Valid,
            json!({"request_id": "wr_1", "results": {WATER: true}}).to_string(),
            400,
            "invalid_body",
        ),
        (
            "six templates in one report",
            Auth::Valid,
            six.to_string(),
            422,
            "too_many_templates",
        ),
        (
            "no templates",
            Auth::Valid,
            json!({"request_id": "wr_1", "results": {"errMsg": "requestSubscribeMessage:ok"}})
                .to_string(),
            422,
            "no_templates",
        ),
        (
            "an unknown template",
            Auth::Valid,
            json!({"request_id": "wr_1", "results": {"tmpl_nope": "accept"}}).to_string(),
            422,
            "unknown_template",
        ),
        (
            "an unknown template beside a known one",
            Auth::Valid,
            json!({"request_id": "wr_1", "results": {WATER: "accept", "tmpl_nope": "accept"}})
                .to_string(),
            422,
            "unknown_template",
        ),
        (
            "an unknown result",
            Auth::Valid,
            json!({"request_id": "wr_1", "results": {WATER: "maybe"}}).to_string(),
            422,
            "invalid_result",
        ),
        (
            "request_id with a space",
            Auth::Valid,
            json!({"request_id": "wr 1", "results": {WATER: "accept"}}).to_string(),
            422,
            "invalid_request_id",
        ),
        (
            "request_id with '#'",
            Auth::Valid,
            json!({"request_id": "wr#1", "results": {WATER: "accept"}}).to_string(),
            422,
            "invalid_request_id",
        ),
        (
            "request_id with CJK",
            Auth::Valid,
            json!({"request_id": "请求", "results": {WATER: "accept"}}).to_string(),
            422,
            "invalid_request_id",
        ),
        (
            "empty request_id",
            Auth::Valid,
            json!({"request_id": "", "results": {WATER: "accept"}}).to_string(),
            422,
            "invalid_request_id",
        ),
        (
            "request_id of 65 characters",
            Auth::Valid,
            json!({"request_id": "r".repeat(65), "results": {WATER: "accept"}}).to_string(),
            422,
            "invalid_request_id",
        ),
        (
            "a body over 64 KiB",
            Auth::Valid,
            big,
            413,
            "payload_too_large",
        ),
        ("no token", Auth::None, ok_body.clone(), 401, "unauthorized"),
        (
            "a malformed token",
            Auth::Raw("Bearer not-a-jwt".into()),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "a token under another scheme",
            Auth::Raw(format!("Basic {valid}")),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "a bare token without a scheme",
            Auth::Raw(valid.clone()),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "a forged token",
            Auth::Raw(format!("Bearer {forged}")),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "an expired token",
            Auth::Raw(format!("Bearer {expired}")),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "a token lasting ten years",
            Auth::Raw(format!("Bearer {lasting}")),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "a token issued in an hour",
            Auth::Raw(format!("Bearer {future}")),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
        (
            "an unsigned token",
            Auth::Raw(format!("Bearer {none_alg}")),
            ok_body.clone(),
            401,
            "unauthorized",
        ),
    ];
    for (name, auth, body, status, code) in cases {
        app.round_trips.take();
        let mut request = app
            .http
            .post(format!("{}/v1/grants", app.base_url))
            .header("content-type", "application/json")
            .body(body);
        request = match &auth {
            Auth::Valid => request.bearer_auth(&valid),
            Auth::None => request,
            Auth::Raw(header) => request.header("authorization", header),
        };
        let response = request.send().await.expect("request");
        let got_status = response.status().as_u16();
        let got: serde_json::Value = response.json().await.expect("JSON error body");
        onegrant_tests::openapi::assert_conforms("POST", "/v1/grants", got_status, &got);
        assert_eq!(
            (got_status, got["error"]["code"].as_str()),
            (status, Some(code)),
            "{name}: {got}"
        );
        assert_eq!(app.round_trips.take(), Vec::<String>::new(), "{name}");
    }
    for (name, header) in [
        ("no token", None),
        ("an expired token", Some(format!("Bearer {expired}"))),
    ] {
        let mut request = app.http.get(format!("{}/v1/grants", app.base_url));
        if let Some(h) = header {
            request = request.header("authorization", h);
        }
        let response = request.send().await.expect("request");
        assert_eq!(response.status().as_u16(), 401, "GET with {name}");
    }
    assert!(
        app.items().await.is_empty(),
        "nothing is stored by refused requests"
    );
    // The same user can still report once the input is right.
    let fine = app
        .post(
            "/v1/grants",
            Some(&valid),
            &json!({"request_id": "wr_ok", "results": {ORDER: "accept"}}),
        )
        .await;
    assert_eq!(fine.status, 200);
}

#[tokio::test]
async fn bad_login_requests_are_refused_with_their_own_error() {
    let app = spawn_app().await;
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("malformed JSON", "{".into(), 400, "malformed_json"),
        ("missing code", "{}".into(), 400, "invalid_body"),
        (
            "code of the wrong type",
            json!({"code": 12}).to_string(),
            400,
            "invalid_body",
        ),
        (
            "empty code",
            json!({"code": ""}).to_string(),
            422,
            "invalid_code_format",
        ),
        (
            "code with control characters",
            json!({"code": "a\nb"}).to_string(),
            422,
            "invalid_code_format",
        ),
        (
            "code too long",
            json!({"code": "c".repeat(300)}).to_string(),
            422,
            "invalid_code_format",
        ),
        (
            "a body over 64 KiB",
            json!({"code": "c".repeat(70 * 1024)}).to_string(),
            413,
            "payload_too_large",
        ),
    ];
    for (name, body, status, code) in cases {
        let answer = app
            .call("POST", "/v1/session", None, Some(body.into_bytes()))
            .await;
        assert_eq!(
            (answer.status, answer.body["error"]["code"].as_str()),
            (status, Some(code)),
            "{name}"
        );
    }
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(
        counters["jscode2session_calls"], 0,
        "bad input never reaches WeChat"
    );
    assert!(app.items().await.is_empty());
}

#[tokio::test]
async fn bad_plan_settings_and_check_ins_are_refused_with_their_own_error_and_store_nothing() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let now = app.now();
    let ok_checkin = json!({"action_id": "wc_1", "occurred_at": now.to_rfc3339(), "current_count": 1, "daily_goal": 8});
    let checkin_with = |k: &str, v: serde_json::Value| {
        let mut b = ok_checkin.clone();
        b[k] = v;
        b.to_string()
    };
    let put = |v: serde_json::Value| v.to_string();
    let cases: Vec<(&str, &str, &str, String, u16, &str)> = vec![
        (
            "unknown kind (GET)",
            "GET",
            "/v1/reminders/tea",
            String::new(),
            404,
            "not_found",
        ),
        (
            "unknown kind (PUT)",
            "PUT",
            "/v1/reminders/tea",
            put(json!({"enabled": true})),
            404,
            "not_found",
        ),
        (
            "unknown kind (check-in)",
            "POST",
            "/v1/reminders/tea/checkins",
            ok_checkin.to_string(),
            404,
            "not_found",
        ),
        (
            "malformed settings",
            "PUT",
            "/v1/reminders/water",
            "{\"enabled\": tru".into(),
            400,
            "malformed_json",
        ),
        (
            "missing enabled",
            "PUT",
            "/v1/reminders/water",
            put(json!({"interval_minutes": 60})),
            400,
            "invalid_body",
        ),
        (
            "enabled not a boolean",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": "yes"})),
            400,
            "invalid_body",
        ),
        (
            "interval as text",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "interval_minutes": "60"})),
            400,
            "invalid_body",
        ),
        (
            "invalid zone",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "timezone": "Asia/Atlantis"})),
            422,
            "invalid_timezone",
        ),
        (
            "interval too short",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "interval_minutes": 5})),
            422,
            "invalid_interval",
        ),
        (
            "interval too long",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "interval_minutes": 721})),
            422,
            "invalid_interval",
        ),
        (
            "negative interval",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "interval_minutes": -120})),
            422,
            "invalid_interval",
        ),
        (
            "malformed wake time",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "wake_time": "8am"})),
            422,
            "invalid_time",
        ),
        (
            "wake time 24:00",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "wake_time": "24:00"})),
            422,
            "invalid_time",
        ),
        (
            "sleep equals wake",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "wake_time": "08:00", "sleep_time": "08:00"})),
            422,
            "invalid_waking_hours",
        ),
        (
            "goal 0 in settings",
            "PUT",
            "/v1/reminders/water",
            put(json!({"enabled": true, "daily_goal": 0})),
            422,
            "invalid_daily_goal",
        ),
        (
            "malformed check-in",
            "POST",
            "/v1/reminders/water/checkins",
            "{".into(),
            400,
            "malformed_json",
        ),
        (
            "missing action_id",
            "POST",
            "/v1/reminders/water/checkins",
            json!({"occurred_at": now.to_rfc3339(), "current_count": 1, "daily_goal": 8})
                .to_string(),
            400,
            "invalid_body",
        ),
        (
            "bad action_id",
            "POST",
            "/v1/reminders/water/checkins",
            checkin_with("action_id", json!("wc 1")),
            422,
            "invalid_action_id",
        ),
        (
            "malformed occurred_at",
            "POST",
            "/v1/reminders/water/checkins",
            checkin_with("occurred_at", json!("2026-07-27 12:05")),
            422,
            "invalid_occurred_at",
        ),
        (
            "negative count",
            "POST",
            "/v1/reminders/water/checkins",
            checkin_with("current_count", json!(-1)),
            422,
            "invalid_count",
        ),
        (
            "fractional count",
            "POST",
            "/v1/reminders/water/checkins",
            checkin_with("current_count", json!(1.5)),
            400,
            "invalid_body",
        ),
        (
            "goal 0",
            "POST",
            "/v1/reminders/water/checkins",
            checkin_with("daily_goal", json!(0)),
            422,
            "invalid_daily_goal",
        ),
        (
            "grant id without status",
            "POST",
            "/v1/reminders/water/checkins",
            checkin_with("grant_request_id", json!("wr_1")),
            422,
            "invalid_grant",
        ),
        (
            "unknown subscription status",
            "POST",
            "/v1/reminders/water/checkins",
            {
                let mut b = ok_checkin.clone();
                b["grant_request_id"] = json!("wr_1");
                b["subscription_status"] = json!("maybe");
                b.to_string()
            },
            422,
            "invalid_result",
        ),
    ];
    for (name, method, path, body, status, code) in cases {
        let body = (!body.is_empty()).then(|| body.into_bytes());
        app.round_trips.take();
        let answer = app.call(method, path, Some(&token), body).await;
        assert_eq!(
            (answer.status, answer.body["error"]["code"].as_str()),
            (status, Some(code)),
            "{name}: {}",
            answer.body
        );
        // Refused on the body alone: the database is never asked.
        assert_eq!(app.round_trips.take(), Vec::<String>::new(), "{name}");
    }
    let unauthenticated = app.call("GET", "/v1/reminders/water", None, None).await;
    assert_eq!(unauthenticated.status, 401);
    assert!(
        app.items().await.is_empty(),
        "nothing is stored by refused requests"
    );

    // Edge inputs a real phone sends are facts to record, not errors (I7, I9).
    let recorded = [
        (
            "occurred_at 10 minutes ahead (a fast clock)",
            now + chrono::Duration::minutes(10),
        ),
        ("occurred_at 3 days ahead", now + chrono::Duration::days(3)),
        (
            "occurred_at 10 years ahead",
            now + chrono::Duration::days(3650),
        ),
        (
            "occurred_at 30 days ago (a long offline queue)",
            now - chrono::Duration::days(30),
        ),
    ];
    for (i, (name, at)) in recorded.into_iter().enumerate() {
        let mut body = ok_checkin.clone();
        body["action_id"] = json!(format!("wc_rec{i}"));
        body["occurred_at"] = json!(at.to_rfc3339());
        let answer = app
            .post("/v1/reminders/water/checkins", Some(&token), &body)
            .await;
        assert_eq!(answer.status, 200, "{name}: {}", answer.body);
    }
    let actions = app
        .items()
        .await
        .into_iter()
        .filter(|i| onegrant_tests::attr_s(i, "kind") == Some("action"))
        .count();
    assert_eq!(actions, 4, "each recorded");
}
