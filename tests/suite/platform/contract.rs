//! The deployable contract stays true: api/openapi.yaml documents exactly the routes
//! template.yaml declares, every function has a sample event that runs through the
//! Invoke API, and error bodies never leak internals.

use std::collections::BTreeSet;

use onegrant_tests::{WATER, spawn_app};
use serde_json::{Value, json};

#[test]
fn the_openapi_document_covers_exactly_the_routes_template_yaml_declares() {
    let documented: BTreeSet<(String, String)> = onegrant_tests::openapi::document()["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .into_iter()
                .flat_map(|o| o.keys())
                .filter(|k| ["get", "put", "post", "delete", "patch"].contains(&k.as_str()))
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let declared: BTreeSet<(String, String)> = onegrant_local::template::routes()
        .expect("template parses")
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(documented, declared);
}

fn sample_event(name: &str) -> Value {
    let path = onegrant_local::emulator::repo_root()
        .join("events")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("sample event is JSON")
}

#[test]
fn every_function_has_sample_events_that_parse_as_its_event_type() {
    let functions = onegrant_local::template::functions().expect("template parses");
    // A sample is the function's whose binary is the longest prefix of its name
    // (`session-key-rotation-…` is not `session`'s).
    let owner = |name: &str| {
        functions
            .iter()
            .filter(|f| name.starts_with(&format!("{}-", f.binary)))
            .max_by_key(|f| f.binary.len())
            .map(|f| f.binary.clone())
    };
    for function in &functions {
        let dir = onegrant_local::emulator::repo_root().join("events");
        let samples: Vec<_> = std::fs::read_dir(&dir)
            .expect("events/")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| owner(n).as_deref() == Some(&function.binary) && n.ends_with(".json"))
            .collect();
        assert!(
            !samples.is_empty(),
            "{} has no sample event in events/",
            function.binary
        );
        for sample in samples {
            let event = sample_event(&sample).to_string();
            if function.http {
                lambda_http::request::from_str(&event)
                    .unwrap_or_else(|e| panic!("{sample} is not an API Gateway event: {e}"));
            }
        }
    }
}

async fn invoke(app: &onegrant_tests::TestApp, function: &str, event: &Value) -> Value {
    let response = app
        .http
        .post(format!(
            "{}/2015-03-31/functions/{function}/invocations",
            app.invoke_url
        ))
        .json(event)
        .send()
        .await
        .expect("invoke");
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.expect("invoke answers JSON")
}

#[tokio::test]
async fn the_invoke_api_runs_the_sample_events_through_the_functions() {
    let app = spawn_app().await;
    let (code, _) = app.login_code("alice").await;
    let mut event = sample_event("session-create.json");
    event["body"] = json!(json!({"code": code}).to_string());
    let answer = invoke(&app, "SessionFunction", &event).await;
    assert_eq!(answer["statusCode"], 200, "{answer}");
    let body: Value = serde_json::from_str(answer["body"].as_str().expect("body")).expect("JSON");
    let token = body["token"].as_str().expect("token");

    let mut event = sample_event("grants-report.json");
    event["headers"]["authorization"] = json!(format!("Bearer {token}"));
    let answer = invoke(&app, "grants", &event).await;
    assert_eq!(answer["statusCode"], 200, "{answer}");
    let body: Value = serde_json::from_str(answer["body"].as_str().expect("body")).expect("JSON");
    onegrant_tests::openapi::assert_conforms("POST", "/v1/grants", 200, &body);
    assert_eq!(onegrant_tests::quota(&body, WATER)["accepted"], 1);

    // The sample notification, from the publisher docs/deployment.md's example allows.
    let answer = invoke(
        &app,
        "NotifyFunction",
        &sample_event("notify-order-shipped.json"),
    )
    .await;
    assert_eq!(answer["status"], "created", "{answer}");

    // A scheduled push (its instant moved an hour ahead of now), then its cancel.
    let mut event = sample_event("notify-appointment-scheduled.json");
    let soon = app.now() + chrono::Duration::hours(1);
    event["detail"]["send_at"] = json!(soon.to_rfc3339());
    event["detail"]["expires_at"] = json!((soon + chrono::Duration::minutes(30)).to_rfc3339());
    let answer = invoke(&app, "NotifyFunction", &event).await;
    assert_eq!(
        (answer["status"].as_str(), answer["push"].as_str()),
        (Some("created"), Some("pending")),
        "{answer}"
    );
    let answer = invoke(&app, "NotifyFunction", &sample_event("notify-cancel.json")).await;
    assert_eq!(answer["status"], "cancelled", "{answer}");

    // The publisher API's samples, signed now by the local publisher: the bus's sample
    // notification again (the same publisher and key: the same notification), its
    // status, its cancel.
    for (sample, statuses, path) in [
        (
            "publisher-publish.json",
            [200, 201],
            "/publisher/v1/notifications",
        ),
        (
            "publisher-status.json",
            [200, 200],
            "/publisher/v1/notifications/{idempotency_key}",
        ),
        ("publisher-cancel.json", [200, 200], "/publisher/v1/cancels"),
    ] {
        let mut event = sample_event(sample);
        let method = event["requestContext"]["http"]["method"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let mut target = event["rawPath"].as_str().unwrap_or("").to_string();
        if let Some(query) = event["rawQueryString"].as_str().filter(|q| !q.is_empty()) {
            target = format!("{target}?{query}");
        }
        let body = event["body"].as_str().unwrap_or("").to_string();
        let timestamp = app.now().timestamp();
        event["headers"]["x-onegrant-timestamp"] = json!(timestamp.to_string());
        event["headers"]["x-onegrant-signature"] =
            json!(onegrant_tests::SHOP.sign(timestamp, &method, &target, body.as_bytes()));
        let answer = invoke(&app, "PublisherFunction", &event).await;
        let status = answer["statusCode"].as_u64().unwrap_or(0) as u16;
        assert!(statuses.contains(&status), "{sample}: {answer}");
        let body: Value =
            serde_json::from_str(answer["body"].as_str().expect("body")).expect("JSON");
        onegrant_tests::openapi::assert_conforms(&method, path, status, &body);
    }

    // The outcomes function's tick: the cancel's outcome (the local publisher has no
    // webhook: nobody to post to, removed).
    let answer = invoke(
        &app,
        "OutcomesFunction",
        &sample_event("outcomes-schedule.json"),
    )
    .await;
    assert!(answer["unaddressed"].as_u64() >= Some(1), "{answer}");

    // WeChat's door kept: the stand-in's list read and kept in the table (no edge).
    let answer = invoke(
        &app,
        "WechatIpsFunction",
        &sample_event("wechat-ips-schedule.json"),
    )
    .await;
    assert_eq!(answer, json!({"entries": 2, "ip_set": "none"}));

    // The user's preferences, saved and read back.
    for (sample, expected) in [
        ("inbox-preferences-put.json", "PUT"),
        ("inbox-preferences-get.json", "GET"),
    ] {
        let mut event = sample_event(sample);
        event["headers"]["authorization"] = json!(format!("Bearer {token}"));
        let answer = invoke(&app, "InboxFunction", &event).await;
        assert_eq!(answer["statusCode"], 200, "{sample}: {answer}");
        let body: Value =
            serde_json::from_str(answer["body"].as_str().expect("body")).expect("JSON");
        onegrant_tests::openapi::assert_conforms(expected, "/v1/preferences", 200, &body);
        assert_eq!(body["muted_types"], json!(["marketing"]), "{sample}");
    }

    let mut event = sample_event("grants-list.json");
    event["headers"]["authorization"] = json!(format!("Bearer {token}"));
    let answer = invoke(&app, "GrantsFunction", &event).await;
    assert_eq!(answer["statusCode"], 200, "{answer}");

    // A copy of the user's data, then the user forgotten (last: the token then opens
    // nothing).
    for (sample, status, path) in [
        ("inbox-export.json", 200, "/v1/me/export"),
        ("inbox-erase.json", 202, "/v1/me"),
    ] {
        let mut event = sample_event(sample);
        event["headers"]["authorization"] = json!(format!("Bearer {token}"));
        let answer = invoke(&app, "InboxFunction", &event).await;
        assert_eq!(answer["statusCode"], status, "{sample}: {answer}");
        let body: Value =
            serde_json::from_str(answer["body"].as_str().expect("body")).expect("JSON");
        let method = event["requestContext"]["http"]["method"]
            .as_str()
            .unwrap_or("");
        onegrant_tests::openapi::assert_conforms(method, path, status, &body);
    }

    let missing = app
        .http
        .post(format!(
            "{}/2015-03-31/functions/nope/invocations",
            app.invoke_url
        ))
        .json(&json!({}))
        .send()
        .await
        .expect("invoke");
    assert_eq!(missing.status().as_u16(), 404);
}

#[tokio::test]
async fn routes_template_yaml_does_not_declare_answer_api_gateways_404() {
    let app = spawn_app().await;
    for (method, path) in [
        ("GET", "/v1/session"),
        ("DELETE", "/v1/grants"),
        ("GET", "/v2/grants"),
        ("GET", "/"),
    ] {
        let response = app
            .http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                format!("{}{path}", app.base_url),
            )
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), 404, "{method} {path}");
    }
}

#[tokio::test]
async fn an_unavailable_table_answers_500_without_internal_details() {
    let app = onegrant_tests::spawn_app_with(&[("TABLE_NAME", "no-such-table")]).await;
    let token = app.login("alice").await;
    let answer = app.get("/v1/grants", Some(&token)).await;
    assert_eq!(answer.status, 500);
    let text = answer.body.to_string();
    for leak in ["no-such-table", "ResourceNotFound", "dynamodb", "arn:"] {
        assert!(!text.contains(leak), "body leaks {leak}: {text}");
    }
}

#[test]
fn every_push_reason_code_is_in_the_contract_and_no_other() {
    let schema: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(onegrant_local::emulator::repo_root().join("api/openapi.yaml"))
            .expect("api/openapi.yaml"),
    )
    .expect("YAML");
    let reason = &schema["components"]["schemas"]["Notification"]["properties"]["push"]["oneOf"][1]
        ["properties"]["reason"]["oneOf"][1]["enum"];
    let mut listed: Vec<&str> = reason
        .as_sequence()
        .expect("the push.reason codes")
        .iter()
        .filter_map(serde_yaml_ng::Value::as_str)
        .collect();
    let mut codes: Vec<&str> = onegrant::domain::inbox::PushReason::ALL
        .iter()
        .map(|r| r.as_str())
        .collect();
    listed.sort_unstable();
    codes.sort_unstable();
    assert_eq!(listed, codes);
}
