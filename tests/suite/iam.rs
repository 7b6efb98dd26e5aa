//! Least privilege, checked against what the code really does: every DynamoDB action a
//! function's requests need (a transaction's items counted one by one) is granted by
//! that function's policy in `template.yaml`. The emulator enforces no IAM, so without
//! this a new kind of write would pass every test and fail only once deployed.

use std::collections::BTreeSet;

use chrono::Utc;
use onegrant_local::template::dynamodb_actions;
use onegrant_tests::{ORDER, TestApp, WATER, spawn_app_with};
use serde_json::json;

fn granted(binary: &str) -> BTreeSet<String> {
    dynamodb_actions(binary).expect("template.yaml reads")
}

fn assert_granted(binary: &str, needed: &BTreeSet<String>) {
    let granted = granted(binary);
    let missing: Vec<&String> = needed.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "{binary} needs dynamodb:{missing:?} that template.yaml does not grant (granted {granted:?})"
    );
}

async fn post(app: &TestApp, path: &str, token: &str, body: serde_json::Value) {
    let answer = app.post(path, Some(token), &body).await;
    assert!(
        answer.status < 500,
        "{path}: {} {}",
        answer.status,
        answer.body
    );
}

async fn call(app: &TestApp, method: &str, path: &str, token: &str, body: Option<&str>) {
    let answer = app
        .call(
            method,
            path,
            Some(token),
            body.map(|b| b.as_bytes().to_vec()),
        )
        .await;
    assert!(
        answer.status < 500,
        "{path}: {} {}",
        answer.status,
        answer.body
    );
}

#[tokio::test]
async fn every_dynamodb_action_a_function_uses_is_granted_by_its_policy() {
    let key = "A".repeat(43);
    let app = spawn_app_with(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
        ("WECHAT_PUSH_TOKEN", "AAAAA"),
        ("WECHAT_PUSH_AES_KEY", &key),
        ("WECHAT_PUSH_FORMAT", "json"),
    ])
    .await;
    let actions = || app.round_trips.take_actions();

    // session: no table at all.
    actions();
    let alice = app.user("alice").await;
    let needed = actions();
    assert!(needed.is_empty(), "session touched the table: {needed:?}");
    assert_granted("session", &needed);

    // reminders: enable, read, check in with a grant, and later disable.
    app.accept(&alice, WATER, "wr_1").await;
    actions();
    call(
        &app,
        "PUT",
        "/v1/reminders/water",
        &alice.token,
        Some(r#"{"enabled": true}"#),
    )
    .await;
    call(&app, "GET", "/v1/reminders/water", &alice.token, None).await;
    let checkin = json!({"action_id": "wc_1", "occurred_at": Utc::now().to_rfc3339(),
                         "current_count": 1, "daily_goal": 8,
                         "grant_request_id": "wr_2", "subscription_status": "accept"});
    post(
        &app,
        "/v1/reminders/water/checkins",
        &alice.token,
        checkin.clone(),
    )
    .await;
    post(&app, "/v1/reminders/water/checkins", &alice.token, checkin).await;
    let reminders = actions();

    // grants: accept, a refusal that pauses the plan, a replay, the quotas.
    let report = json!({"request_id": "wr_3", "results": {WATER: "accept", ORDER: "accept"}});
    post(&app, "/v1/grants", &alice.token, report.clone()).await;
    post(&app, "/v1/grants", &alice.token, report).await;
    post(
        &app,
        "/v1/grants",
        &alice.token,
        json!({"request_id": "wr_4", "results": {WATER: "reject"}}),
    )
    .await;
    post(
        &app,
        "/v1/grants",
        &alice.token,
        json!({"request_id": "wr_5", "results": {WATER: "accept"}}),
    )
    .await;
    call(&app, "GET", "/v1/grants", &alice.token, None).await;
    let grants = actions();
    assert_granted("grants", &grants);

    // notify: an event with a push.
    app.push(&alice, "order-1").await;
    app.notify(
        json!({"idempotency_key": "k2", "openid": alice.openid, "type": "system",
                      "title": "t", "body": "b"}),
    )
    .await;
    let notify = actions();
    assert_granted("notify", &notify);

    // dispatcher: the push sent, then a push refused with 43101 (its other grants
    // voided), then an idle tick.
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": alice.openid, "template_id": ORDER, "count": 1})),
    )
    .await;
    app.tick(30).await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": alice.openid, "errcode": 43101})),
    )
    .await;
    app.push(&alice, "order-2").await;
    app.tick(30).await;
    app.tick(30).await;
    let dispatcher = actions();
    assert_granted("dispatcher", &dispatcher);

    // inbox: every listing, the counter, one read, all read.
    for path in [
        "/v1/notifications",
        "/v1/notifications?read=false",
        "/v1/notifications?read=true&type=order",
        "/v1/notifications/unread-count",
    ] {
        call(&app, "GET", path, &alice.token, None).await;
    }
    let notes = app.items_of(&alice, "note").await;
    let id = notes
        .first()
        .and_then(|n| onegrant_tests::attr_s(n, "id"))
        .expect("a note")
        .to_string();
    call(
        &app,
        "POST",
        &format!("/v1/notifications/{id}/read"),
        &alice.token,
        None,
    )
    .await;
    call(
        &app,
        "POST",
        "/v1/notifications/read-all",
        &alice.token,
        None,
    )
    .await;
    let inbox = actions();
    assert_granted("inbox", &inbox);

    // wechat-callback: the user turns the template off in WeChat's settings.
    let crypto = onegrant::wechat::push::PushCrypto::new(
        onegrant::config::Secret::new("AAAAA"),
        &key,
        onegrant_local::stack::LOCAL_APPID,
    )
    .expect("key");
    // And a sent event, which reads the template's marks and may settle a send.
    let events = [
        (
            "n1",
            "subscribe_msg_change_event",
            json!({"TemplateId": WATER, "SubscribeStatusString": "reject"}),
        ),
        (
            "n2",
            "subscribe_msg_sent_event",
            json!({"TemplateId": WATER, "MsgID": "1700827132819554304", "ErrorCode": "0",
                   "ErrorStatus": "success"}),
        ),
    ];
    for (nonce, name, list) in events {
        let ts = Utc::now().timestamp().to_string();
        let event = json!({"ToUserName": "gh_1", "FromUserName": alice.openid,
                           "CreateTime": ts.clone(), "MsgType": "event", "Event": name,
                           "List": list});
        let encrypt = crypto.encrypt(&event.to_string(), &[3; 16]);
        let answer = app
            .http
            .post(format!(
                "{}/wechat/callback?timestamp={ts}&nonce={nonce}&msg_signature={}",
                app.base_url,
                crypto.msg_signature(&ts, nonce, &encrypt)
            ))
            .body(json!({"ToUserName": "gh_1", "Encrypt": encrypt}).to_string())
            .send()
            .await
            .expect("callback answers");
        assert_eq!(answer.status().as_u16(), 200, "{name}");
    }
    let callback = actions();
    assert_granted("wechat-callback", &callback);

    // Disabling voids the open grants (reminders again).
    call(
        &app,
        "PUT",
        "/v1/reminders/water",
        &alice.token,
        Some(r#"{"enabled": false}"#),
    )
    .await;
    let mut all_reminders = reminders;
    all_reminders.extend(actions());
    assert_granted("reminders", &all_reminders);

    // The flows really exercised the writes the policies must cover.
    for (what, needed, action) in [
        ("inbox", &inbox, "DeleteItem"),
        ("inbox", &inbox, "BatchGetItem"),
        ("grants", &grants, "UpdateItem"),
        ("dispatcher", &dispatcher, "PutItem"),
        ("notify", &notify, "PutItem"),
        ("wechat-callback", &callback, "UpdateItem"),
        ("wechat-callback", &callback, "GetItem"),
    ] {
        assert!(
            needed.contains(action),
            "{what} should need {action}: {needed:?}"
        );
    }
}
