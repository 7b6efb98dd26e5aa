//! Least privilege, checked against what the code really does: every DynamoDB action a
//! function's requests need (a transaction's items counted one by one, a query of an
//! index as `Query@<index>`, granted only on that index's ARN) is granted by that
//! function's policy in `template.yaml`, and nothing more is granted (but for the one
//! rare path named in `RARE_PATHS`). The emulator enforces no IAM, so without
//! this a new kind of write would pass every test and fail only once deployed.

use std::collections::BTreeSet;

use onegrant_local::template::dynamodb_actions;
use onegrant_tests::{ORDER, SHOP, TestApp, WATER, spawn_app_with};
use serde_json::json;

/// Actions a function's code uses only on a path the flows below do not reach, each
/// with where: granted, and exempt from "granted but unused". Nothing else is.
const RARE_PATHS: [(&str, &str, &str); 1] = [(
    "wechat-callback",
    "ConditionCheckItem",
    "repairing an open-grant list a void found wrong (open_grants::unlist_if_not), \
     and waking a waiting push when a sent event gives a grant back (dispatch::priority)",
)];

fn granted(binary: &str) -> BTreeSet<String> {
    dynamodb_actions(binary).expect("template.yaml reads")
}

/// `binary`'s policy grants what its requests needed, and nothing they did not: an
/// action granted and never used is a privilege an attacker holding the function's
/// role could use and the code never does.
fn assert_granted(binary: &str, needed: &BTreeSet<String>) {
    let granted = granted(binary);
    let missing: Vec<&String> = needed.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "{binary} needs dynamodb:{missing:?} that template.yaml does not grant (granted {granted:?})"
    );
    let unused: Vec<&String> = granted
        .difference(needed)
        .filter(|action| {
            !RARE_PATHS
                .iter()
                .any(|(b, a, _)| *b == binary && a == action)
        })
        .collect();
    assert!(
        unused.is_empty(),
        "{binary} is granted dynamodb:{unused:?} that none of its requests used (used {needed:?})"
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
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &key),
        ("WECHAT_PUSH_FORMAT", "json"),
        // The shop's webhook: nothing listens there (its posts fail).
        (
            "ONEGRANT_PUBLISHERS",
            r#"[{"source": "com.example.shop", "key": "local-publisher-secret",
                 "webhook": "http://127.0.0.1:9/hooks"}]"#,
        ),
    ])
    .await;
    let actions = || app.round_trips.take_actions();

    // session: no table at all.
    actions();
    let alice = app.user("alice").await;
    // Two users who will be forgotten: yan by asking (inbox), zed by WeChat's word
    // (wechat-callback, then the dispatcher's steps).
    let yan = app.user("yan").await;
    let zed = app.user("zed").await;
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
    let checkin = json!({"action_id": "wc_1", "occurred_at": app.now().to_rfc3339(),
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

    // notify: an event with a push, a cancel of another push, a cancel before its
    // event, and a push scheduled ahead.
    app.push(&alice, "order-1").await;
    app.notify(
        json!({"idempotency_key": "k2", "openid": alice.openid, "type": "system",
                      "title": "t", "body": "b"}),
    )
    .await;
    app.push(&alice, "cancel-me").await;
    app.cancel(&alice, "cancel-me").await;
    app.cancel(&alice, "cancel-first").await;
    let late = app
        .notify(json!({"idempotency_key": "cancel-first", "openid": alice.openid, "type": "order",
                       "title": "t", "wechat": {"template_id": ORDER,
                       "data": {"character_string1": "order-3", "phrase2": "已发货", "thing3": "顺丰速运"}}}))
        .await;
    assert_eq!(late["push"], "cancelled", "{late}");
    app.notify(
        json!({"idempotency_key": "k4", "openid": alice.openid, "type": "system", "title": "t",
               "send_at": (app.now() + chrono::Duration::hours(1)).to_rfc3339()}),
    )
    .await;
    for (key, user) in [("k5", &yan), ("k6", &zed)] {
        let created = app
            .notify(
                json!({"idempotency_key": key, "openid": user.openid, "type": "system",
                           "title": "t", "body": "b"}),
            )
            .await;
        assert_eq!(created["status"], "created", "{created}");
    }
    let notify = actions();
    assert_granted("notify", &notify);

    // publisher: a publish whose push ends as it comes (an outcome), one waiting
    // (counted on the lane index), a status and a cancel, each call counted.
    let rejected = json!({"idempotency_key": "p1", "openid": alice.openid, "type": "order",
        "title": "t", "wechat": {"template_id": "tmpl_nope", "data": {}}});
    assert_eq!(app.publish(&rejected, SHOP).await.status, 201);
    let waiting = json!({"idempotency_key": "p2", "openid": alice.openid, "type": "order",
        "title": "t", "wechat": {"template_id": ORDER,
        "data": {"character_string1": "p2", "phrase2": "已发货", "thing3": "顺丰速运"}}});
    assert_eq!(app.publish(&waiting, SHOP).await.status, 201);
    let status = format!("/publisher/v1/notifications/p1?openid={}", alice.openid);
    assert_eq!(
        app.publisher_call("GET", &status, None, Some(SHOP))
            .await
            .status,
        200
    );
    let cancel = json!({"openid": alice.openid, "idempotency_key": "p2"});
    let cancelled = app
        .publisher_call("POST", "/publisher/v1/cancels", Some(&cancel), Some(SHOP))
        .await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    let publisher = actions();
    assert_granted("publisher", &publisher);

    // outcomes: the tests' publisher has no webhook (its outcomes removed), the shop's
    // is down (its first tried again later).
    let summary = app.deliver_outcomes().await;
    assert!(
        summary.unaddressed > 0 && summary.retried == 1,
        "{summary:?}"
    );
    let outcomes = actions();
    assert_granted("outcomes", &outcomes);

    // wechat-ips: WeChat's list read and kept (one item).
    wechat_ips::refresh(&app.deps).await.expect("kept");
    let door = actions();
    assert_granted("wechat-ips", &door);

    // WeChat says zed closed their account: the erasure begun, its steps the
    // dispatcher's (below).
    let crypto = onegrant::wechat::push::PushCrypto::new(
        onegrant::secrets::Secret::new("AAAAA"),
        &key,
        onegrant_local::stack::LOCAL_APPID,
    )
    .expect("key");
    let ts = app.now().timestamp().to_string();
    let closed = json!({"ToUserName": "gh_123456789abc", "FromUserName": "o_wechat",
                        "CreateTime": ts.clone(), "MsgType": "event",
                        "Event": "user_authorization_cancellation", "OpenID": zed.openid});
    let encrypt = crypto.encrypt(&closed.to_string(), &[4; 16]);
    let answer = app
        .http
        .post(format!(
            "{}/wechat/callback?timestamp={ts}&nonce=z0&msg_signature={}",
            app.base_url,
            crypto.msg_signature(&ts, "z0", &encrypt)
        ))
        .body(json!({"ToUserName": "gh_123456789abc", "Encrypt": encrypt}).to_string())
        .send()
        .await
        .expect("callback answers");
    assert_eq!(answer.status().as_u16(), 200, "account closed");
    let callback_erasure = actions();

    // dispatcher: the push sent, then a push refused with 43101 (its other grants
    // voided), an idle tick, and a scheduled notification published.
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
    let mut dispatcher = actions();
    // (The push is notify's: its requests are held to notify's policy, not counted as
    // the dispatcher's.)
    app.push(&alice, "order-2").await;
    let pushed = actions();
    assert!(
        pushed.is_subset(&granted("notify")),
        "notify needs {pushed:?}"
    );
    app.tick(30).await;
    app.tick(30).await;
    // The notification scheduled an hour ahead, published at its instant (its
    // scheduled item deleted in the publication's transaction).
    app.advance(std::time::Duration::from_secs(3600));
    app.tick(30).await;
    assert_eq!(
        app.items_of(&alice, "scheduled").await.len(),
        0,
        "the scheduled notification was published"
    );
    assert!(
        app.items()
            .await
            .iter()
            .all(|i| onegrant_tests::attr_s(i, "pk") != Some(&format!("USER#{}", zed.openid))),
        "zed's erasure was stepped by the dispatcher"
    );
    dispatcher.extend(actions());
    assert_granted("dispatcher", &dispatcher);

    // inbox: every listing, the counter, one read, all read, the preferences.
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
    call(&app, "DELETE", "/v1/me", &yan.token, None).await;
    call(&app, "GET", "/v1/preferences", &alice.token, None).await;
    call(
        &app,
        "PUT",
        "/v1/preferences",
        &alice.token,
        Some(r#"{"quiet_hours": null, "muted_types": ["marketing"]}"#),
    )
    .await;
    let inbox = actions();
    assert_granted("inbox", &inbox);

    // wechat-callback: the user turns the template off in WeChat's settings.
    // Grants recorded before the open-grant lists, voided by a change event through
    // the ledger (a Query). And a sent event, which reads the template's marks and may
    // settle a send.
    app.legacy_grants(&alice, ORDER, 2).await;
    let events = [
        (
            "n0",
            "subscribe_msg_change_event",
            json!({"TemplateId": ORDER, "SubscribeStatusString": "reject"}),
        ),
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
        let ts = app.now().timestamp().to_string();
        let event = json!({"ToUserName": "gh_123456789abc", "FromUserName": alice.openid,
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
            .body(json!({"ToUserName": "gh_123456789abc", "Encrypt": encrypt}).to_string())
            .send()
            .await
            .expect("callback answers");
        assert_eq!(answer.status().as_u16(), 200, "{name}");
    }
    let mut callback = actions();
    callback.extend(callback_erasure);
    assert_granted("wechat-callback", &callback);

    // Disabling voids the open grants (reminders again), those recorded before the
    // open-grant lists through the ledger (a Query).
    app.legacy_grants(&alice, WATER, 2).await;
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
        ("notify", &notify, "GetItem"),
        ("publisher", &publisher, "Query@lane"),
        ("outcomes", &outcomes, "UpdateItem"),
        ("outcomes", &outcomes, "DeleteItem"),
        ("wechat-ips", &door, "PutItem"),
        ("wechat-callback", &callback, "UpdateItem"),
        ("wechat-callback", &callback, "GetItem"),
    ] {
        assert!(
            needed.contains(action),
            "{what} should need {action}: {needed:?}"
        );
    }
}

/// The secrets each function uses (the ARN variables it is given), as its `main`
/// declares them (`Need`s): the session key where tokens are issued or checked, the
/// AppSecret where WeChat is called, the push secrets in the callback.
/// (Every HTTP function reads the edge protection's origin secret when it is on.)
const SECRETS_USED: [(&str, &[&str]); 11] = [
    (
        "publisher",
        &["ONEGRANT_PUBLISHERS_ARN", "ORIGIN_SECRET_ARN"],
    ),
    ("outcomes", &["ONEGRANT_PUBLISHERS_ARN"]),
    ("wechat-ips", &["WECHAT_SECRET_ARN"]),
    ("session-key-rotation", &["SESSION_SECRET_ARN"]),
    (
        "session",
        &[
            "SESSION_SECRET_ARN",
            "WECHAT_SECRET_ARN",
            "ORIGIN_SECRET_ARN",
        ],
    ),
    ("grants", &["SESSION_SECRET_ARN", "ORIGIN_SECRET_ARN"]),
    ("reminders", &["SESSION_SECRET_ARN", "ORIGIN_SECRET_ARN"]),
    ("inbox", &["SESSION_SECRET_ARN", "ORIGIN_SECRET_ARN"]),
    ("dispatcher", &["WECHAT_SECRET_ARN"]),
    ("notify", &[]),
    (
        "wechat-callback",
        &[
            "WECHAT_PUSH_TOKEN_ARN",
            "WECHAT_PUSH_AES_KEY_ARN",
            "ORIGIN_SECRET_ARN",
        ],
    ),
];

/// What a function may do to its secrets besides reading them: the rotation function
/// stages and promotes the session key's versions.
const SECRET_ACTIONS: [(&str, &[&str]); 1] = [(
    "session-key-rotation",
    &[
        "secretsmanager:GetSecretValue",
        "secretsmanager:DescribeSecret",
        "secretsmanager:PutSecretValue",
        "secretsmanager:UpdateSecretVersionStage",
    ],
)];

/// The secret values a function could be given directly; none may be in an environment.
const SECRET_VALUES: [&str; 7] = [
    "ONEGRANT_PUBLISHERS",
    "SESSION_SECRET",
    "ORIGIN_SECRET",
    "SESSION_SECRET_PREVIOUS",
    "WECHAT_SECRET",
    "WECHAT_PUSH_TOKEN",
    "WECHAT_PUSH_AES_KEY",
];

/// `value` with `!If [condition, then, else]` resolved to its branches (both, minus
/// `AWS::NoValue`), as a deployment with either condition could have them.
fn branches(value: &serde_yaml_ng::Value) -> Vec<&serde_yaml_ng::Value> {
    use serde_yaml_ng::Value;
    match value {
        Value::Tagged(tagged) if tagged.tag == "If" => tagged
            .value
            .as_sequence()
            .map(|s| s.iter().skip(1).flat_map(branches).collect())
            .unwrap_or_default(),
        Value::Tagged(tagged)
            if tagged.tag == "Ref" && tagged.value.as_str() == Some("AWS::NoValue") =>
        {
            Vec::new()
        }
        other => vec![other],
    }
}

/// A reference as text, e.g. `Ref SessionSecret`, to compare environments and policies.
fn reference(value: &serde_yaml_ng::Value) -> String {
    match value {
        serde_yaml_ng::Value::Tagged(tagged) => {
            format!("{} {}", tagged.tag, reference(&tagged.value))
        }
        serde_yaml_ng::Value::String(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

#[test]
fn no_function_has_a_secret_in_its_environment_and_each_may_read_only_the_secrets_it_uses() {
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(onegrant_local::template::TEMPLATE_YAML).expect("template parses");
    let globals = doc["Globals"]["Function"]["Environment"]["Variables"]
        .as_mapping()
        .cloned()
        .unwrap_or_default();
    let parameters = doc["Parameters"].as_mapping().cloned().unwrap_or_default();
    let functions: Vec<(&str, &serde_yaml_ng::Value)> = doc["Resources"]
        .as_mapping()
        .expect("resources")
        .values()
        .filter(|r| r["Type"].as_str() == Some("AWS::Serverless::Function"))
        .map(|r| {
            let binary = r["Metadata"]["BuildProperties"]["Binary"]
                .as_str()
                .expect("binary");
            (binary, r)
        })
        .collect();
    assert_eq!(
        functions.len(),
        SECRETS_USED.len(),
        "every function is listed"
    );
    for (binary, resource) in functions {
        let own = resource["Properties"]["Environment"]["Variables"]
            .as_mapping()
            .cloned()
            .unwrap_or_default();
        let environment: Vec<(String, &serde_yaml_ng::Value)> = globals
            .iter()
            .chain(own.iter())
            .map(|(k, v)| (k.as_str().unwrap_or_default().to_string(), v))
            .collect();
        for (name, value) in &environment {
            assert!(
                !SECRET_VALUES.contains(&name.as_str()),
                "{binary} has the secret {name} in its environment"
            );
            // Nor a NoEcho parameter under another name.
            if let Some(parameter) = reference(value).strip_prefix("Ref ") {
                assert!(
                    parameters
                        .get(parameter)
                        .is_none_or(|p| p["NoEcho"].as_bool() != Some(true)),
                    "{binary}'s {name} carries the NoEcho parameter {parameter}"
                );
            }
        }
        let used = SECRETS_USED
            .iter()
            .find(|(b, _)| *b == binary)
            .map(|(_, used)| *used)
            .unwrap_or_else(|| panic!("{binary} is not in SECRETS_USED"));
        let given: BTreeSet<&str> = environment
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| name.ends_with("_ARN"))
            .collect();
        assert_eq!(
            given,
            used.iter().copied().collect(),
            "{binary}'s secret ARNs"
        );
        // (A conditional value counts by its branches; an empty one gives nothing.)
        let wanted: BTreeSet<String> = environment
            .iter()
            .filter(|(name, _)| used.contains(&name.as_str()))
            .flat_map(|(_, value)| branches(value))
            .filter(|value| value.as_str() != Some(""))
            .map(reference)
            .collect();

        // Every statement that names a secretsmanager action grants GetSecretValue (or
        // what SECRET_ACTIONS names), and only on the secrets this function is given.
        let mut readable = BTreeSet::new();
        let policies = resource["Properties"]["Policies"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        for policy in policies.iter().flat_map(branches) {
            let statements = policy["Statement"]
                .as_sequence()
                .cloned()
                .unwrap_or_default();
            for statement in &statements {
                let actions: Vec<String> = match &statement["Action"] {
                    serde_yaml_ng::Value::Sequence(list) => list
                        .iter()
                        .filter_map(|a| a.as_str().map(str::to_string))
                        .collect(),
                    one => one.as_str().map(str::to_string).into_iter().collect(),
                };
                let secret_actions: Vec<&String> = actions
                    .iter()
                    .filter(|a| a.starts_with("secretsmanager:"))
                    .collect();
                if secret_actions.is_empty() {
                    continue;
                }
                let allowed: &[&str] = SECRET_ACTIONS
                    .iter()
                    .find(|(b, _)| *b == binary)
                    .map_or(&["secretsmanager:GetSecretValue"], |(_, actions)| *actions);
                assert_eq!(
                    secret_actions,
                    allowed
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .iter()
                        .collect::<Vec<_>>(),
                    "{binary} may only read secrets, or do what SECRET_ACTIONS says"
                );
                let resources: Vec<&serde_yaml_ng::Value> = match &statement["Resource"] {
                    serde_yaml_ng::Value::Sequence(list) => {
                        list.iter().flat_map(branches).collect()
                    }
                    one => branches(one),
                };
                for r in resources {
                    readable.insert(reference(r));
                }
            }
        }
        assert_eq!(
            readable, wanted,
            "{binary} may read exactly the secrets it is given"
        );
        assert!(
            !readable.iter().any(|r| r.contains('*')),
            "{binary}: no wildcard"
        );
    }
}
