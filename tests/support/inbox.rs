//! Notifications as a test publishes and reads them: a scheduled push's detail, the
//! preferences route, each push's status as the inbox shows it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use crate::support::app::{ORDER, TestApp};
use crate::support::users::User;

/// An instant as the API takes it (RFC 3339, milliseconds).
pub fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A `notify` detail asking for a push of the order template, with `extra` fields
/// (`send_at`, `expires_at`, `priority`) merged in.
pub fn scheduled(user: &User, key: &str, extra: Value) -> Value {
    let mut detail = json!({"idempotency_key": key, "openid": user.openid, "type": "order",
        "title": "预约提醒", "body": format!("预约 {key}"),
        "wechat": {"template_id": ORDER,
                   "data": {"character_string1": key, "phrase2": "已预约", "thing3": "门店"}}});
    for (k, v) in extra.as_object().expect("object") {
        detail[k] = v.clone();
    }
    detail
}

/// `PUT /v1/preferences` with `body`: the status and the answer.
pub async fn put_preferences(app: &TestApp, user: &User, body: &Value) -> (u16, Value) {
    let answer = app
        .call(
            "PUT",
            "/v1/preferences",
            Some(&user.token),
            Some(body.to_string().into_bytes()),
        )
        .await;
    (answer.status, answer.body)
}

/// Each notification's push as the inbox shows it, by idempotency key (the order
/// number): (status, reason).
pub async fn push_statuses(app: &TestApp, user: &User) -> Vec<(String, String, Option<String>)> {
    let page = app.get("/v1/notifications", Some(&user.token)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let mut all: Vec<_> = page.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| {
            let key = n["body"]
                .as_str()
                .unwrap_or_default()
                .split(' ')
                .nth(1)
                .unwrap_or_default();
            (
                key.to_string(),
                n["push"]["status"].as_str().unwrap_or_default().to_string(),
                n["push"]["reason"].as_str().map(str::to_string),
            )
        })
        .collect();
    all.sort();
    all
}

/// A push waiting for a grant, as [`push_statuses`] shows it.
pub fn waiting(key: &str) -> (String, String, Option<String>) {
    (key.to_string(), "pending".into(), Some("no_grant".into()))
}

/// A push sent, as [`push_statuses`] shows it.
pub fn sent(key: &str) -> (String, String, Option<String>) {
    (key.to_string(), "sent".into(), None)
}
