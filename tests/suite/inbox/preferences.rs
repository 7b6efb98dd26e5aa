//! The user's push preferences: `GET`/`PUT /v1/preferences`, quiet hours that hold a
//! push until they end (unless it is `high`), and muted types that are never sent.

use chrono::{DateTime, Duration, Timelike, Utc};
use onegrant_tests::inbox::put_preferences as put;
use onegrant_tests::{
    ORDER, TestApp, User, assert_ledger_agrees_with_counters, attr_n, attr_s, spawn_app,
    spawn_app_with,
};
use serde_json::{Value, json};

fn push(user: &User, key: &str, kind: &str, priority: &str) -> Value {
    json!({"idempotency_key": key, "openid": user.openid, "type": kind, "title": "t",
           "priority": priority,
           "wechat": {"template_id": ORDER,
                      "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}})
}

/// The push status of `user`'s notification `key` (its order number), from the outbox.
async fn state_of(app: &TestApp, user: &User, key: &str) -> Option<String> {
    app.items_of(user, "outbox").await.iter().find_map(|o| {
        let k = o
            .get("data")
            .and_then(|d| d.as_m().ok())
            .and_then(|d| d.get("character_string1"))
            .and_then(|v| v.as_s().ok())?;
        (k == key).then(|| attr_s(o, "state").unwrap_or_default().to_string())
    })
}

#[tokio::test]
async fn preferences_are_saved_read_back_and_an_unchanged_save_writes_nothing() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let empty = app.get("/v1/preferences", Some(&user.token)).await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    assert_eq!(empty.body, json!({"quiet_hours": null, "muted_types": []}));
    let body = json!({"quiet_hours": {"start": "22:00", "end": "08:00", "timezone": "Asia/Shanghai"},
                      "muted_types": ["marketing", "digest", "marketing"]});
    let (status, saved) = put(&app, &user, &body).await;
    assert_eq!(status, 200, "{saved}");
    let expected = json!({"quiet_hours": {"start": "22:00", "end": "08:00", "timezone": "Asia/Shanghai"},
                          "muted_types": ["digest", "marketing"]});
    assert_eq!(saved, expected);
    assert_eq!(
        app.get("/v1/preferences", Some(&user.token)).await.body,
        expected
    );
    // The same again: nothing written.
    let (status, _) = put(&app, &user, &body).await;
    assert_eq!(status, 200);
    let item = app.item(&user, "PREFS").await.expect("stored");
    assert_eq!(
        attr_n(&item, "version"),
        Some(1),
        "an unchanged save writes nothing"
    );
    let (status, cleared) = put(
        &app,
        &user,
        &json!({"quiet_hours": null, "muted_types": []}),
    )
    .await;
    assert_eq!(
        (status, cleared),
        (200, json!({"quiet_hours": null, "muted_types": []}))
    );
    let other = app.user("bob").await;
    assert_eq!(
        app.get("/v1/preferences", Some(&other.token)).await.body,
        json!({"quiet_hours": null, "muted_types": []}),
        "one user's preferences are not another's"
    );
    assert_eq!(app.get("/v1/preferences", None).await.status, 401);
}

#[tokio::test]
async fn bad_preferences_are_refused_with_their_code_and_store_nothing() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let quiet =
        |start: &str, end: &str, tz: &str| json!({"start": start, "end": end, "timezone": tz});
    let cases = [
        ("not json", None, 400, "malformed_json"),
        ("[]", None, 400, "invalid_body"),
        ("", Some(json!({"muted_types": []})), 400, "invalid_body"),
        ("", Some(json!({"quiet_hours": null})), 400, "invalid_body"),
        (
            "",
            Some(json!({"quiet_hours": null, "muted_types": [], "extra": 1})),
            400,
            "invalid_body",
        ),
        (
            "",
            Some(json!({"quiet_hours": "22-08", "muted_types": []})),
            400,
            "invalid_body",
        ),
        (
            "",
            Some(
                json!({"quiet_hours": quiet("22:00", "08:00", "Mars/Olympus"), "muted_types": []}),
            ),
            422,
            "invalid_timezone",
        ),
        (
            "",
            Some(json!({"quiet_hours": quiet("24:00", "08:00", "UTC"), "muted_types": []})),
            422,
            "invalid_quiet_hours",
        ),
        (
            "",
            Some(json!({"quiet_hours": quiet("22:00", "8:00", "UTC"), "muted_types": []})),
            422,
            "invalid_quiet_hours",
        ),
        (
            "",
            Some(json!({"quiet_hours": null, "muted_types": ["has space"]})),
            422,
            "invalid_muted_types",
        ),
        (
            "",
            Some(json!({"quiet_hours": null, "muted_types": [""]})),
            422,
            "invalid_muted_types",
        ),
        (
            "",
            Some(
                json!({"quiet_hours": null, "muted_types": (0..21).map(|i| format!("t{i}")).collect::<Vec<_>>()}),
            ),
            422,
            "invalid_muted_types",
        ),
        // More than 20 entries as sent, even when their repeats leave two types (the
        // contract's maxItems; the fuzzer found such a body accepted).
        (
            "",
            Some(
                json!({"quiet_hours": null, "muted_types": (0..24).map(|i| if i % 8 == 1 { "00" } else { "0" }).collect::<Vec<_>>()}),
            ),
            422,
            "invalid_muted_types",
        ),
    ];
    for (raw, body, status, code) in &cases {
        let text = body
            .as_ref()
            .map_or_else(|| raw.to_string(), Value::to_string);
        let answer = app
            .call(
                "PUT",
                "/v1/preferences",
                Some(&user.token),
                Some(text.clone().into_bytes()),
            )
            .await;
        assert_eq!(answer.status, *status, "{text}: {}", answer.body);
        assert_eq!(
            answer.body["error"]["code"], *code,
            "{text}: {}",
            answer.body
        );
    }
    assert!(app.item(&user, "PREFS").await.is_none(), "nothing stored");
}

#[tokio::test]
async fn a_muted_type_is_never_sent_and_spends_no_grant() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    let (status, _) = put(
        &app,
        &user,
        &json!({"quiet_hours": null, "muted_types": ["marketing"]}),
    )
    .await;
    assert_eq!(status, 200);
    app.notify(push(&user, "sale", "marketing", "high")).await;
    app.notify(push(&user, "shipped", "order", "normal")).await;
    let summary = app.tick(30).await;
    assert_eq!((summary.muted, summary.sent), (1, 1), "{summary:?}");
    assert_eq!(
        state_of(&app, &user, "sale").await.as_deref(),
        Some("muted")
    );
    assert_eq!(
        state_of(&app, &user, "shipped").await.as_deref(),
        Some("sent")
    );
    let notes = app.get("/v1/notifications", Some(&user.token)).await.body;
    let muted: Vec<&Value> = notes["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|n| n["push"]["status"] == "muted")
        .collect();
    assert_eq!(
        muted.len(),
        1,
        "the notification stays, its push muted: {notes}"
    );
    assert_eq!(app.deliveries().await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn quiet_hours_hold_a_normal_push_until_they_end_while_a_high_one_goes_at_once() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.accept(&user, ORDER, "wr_2").await;
    // Quiet from a minute ago to the next whole minute at least 5 s away (in UTC), on a
    // clock held until the test moves it there: however slow the steps before, the
    // quiet hours do not end under them.
    let now = app.now();
    app.clock.freeze_at(now);
    let next_minute = (now + Duration::seconds(65 - i64::from(now.second())))
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .expect("a minute");
    let end = if next_minute - now < Duration::seconds(5) {
        next_minute + Duration::minutes(1)
    } else {
        next_minute
    };
    let hhmm = |t: DateTime<Utc>| t.format("%H:%M").to_string();
    let body = json!({"quiet_hours": {"start": hhmm(now - Duration::minutes(1)), "end": hhmm(end), "timezone": "UTC"},
                      "muted_types": []});
    let (status, saved) = put(&app, &user, &body).await;
    assert_eq!(status, 200, "{saved}");
    app.notify(push(&user, "quiet", "order", "normal")).await;
    app.notify(push(&user, "urgent", "order", "high")).await;
    let first = app.tick(30).await;
    assert_eq!((first.sent, first.held), (1, 1), "{first:?}");
    assert_eq!(
        state_of(&app, &user, "urgent").await.as_deref(),
        Some("sent")
    );
    assert_eq!(
        state_of(&app, &user, "quiet").await.as_deref(),
        Some("pending")
    );
    let outbox = app.items_of(&user, "outbox").await;
    let held = outbox
        .iter()
        .find(|o| attr_s(o, "state") == Some("pending"))
        .expect("the held push");
    assert_eq!(
        attr_n(held, "due_at"),
        Some(end.timestamp_millis()),
        "due again at the end"
    );
    // Another tick before the end does not send it.
    let early = app.tick(5).await;
    assert_eq!((early.sent, early.claimed), (0, 0), "{early:?}");
    app.move_to(end);
    let after = app.tick(30).await;
    assert_eq!(after.sent, 1, "{after:?}");
    assert_eq!(
        state_of(&app, &user, "quiet").await.as_deref(),
        Some("sent")
    );
    let claimed: Vec<DateTime<Utc>> = app
        .items_of(&user, "delivery")
        .await
        .iter()
        .filter_map(|d| attr_s(d, "claimed_at"))
        .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .collect();
    assert_eq!(claimed.len(), 2);
    assert!(
        claimed.iter().any(|t| *t >= end),
        "the held push went out at the end: {claimed:?}"
    );
    assert_eq!(app.deliveries().await.len(), 2);
    assert_ledger_agrees_with_counters(&app).await;
}
