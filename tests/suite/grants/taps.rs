//! A tap seen from both sides: the client's grant report and WeChat's popup event
//! (pushed by the stand-in to `/wechat/callback`, sealed in safe mode) confirm one
//! grant, in either order and concurrently; a popup accept is never a grant itself.

use chrono::Duration;
use futures::future::join_all;
use onegrant_tests::{
    TestApp, User, WATER, assert_ledger_agrees_with_counters, attr_n, attr_s, quota,
    spawn_pushing_app,
};
use serde_json::{Value, json};

/// The user's grant report of one tap accepting the water template.
async fn report(app: &TestApp, user: &User, request_id: &str) -> Value {
    let answer = app
        .post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": request_id, "results": {WATER: "accept"}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// WeChat's popup event of one tap accepting the water template, created `ago` back.
async fn popup(app: &TestApp, user: &User, ago: Duration) -> Value {
    app.push_event_answered(
        json!({"event": "popup", "openid": user.openid, "template_id": WATER,
                       "status": "accept",
                       "create_time": (app.now() - ago).timestamp()}),
    )
    .await
}

/// The user's water quota as `GET /v1/grants` shows it.
async fn water(app: &TestApp, user: &User) -> Value {
    let answer = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    quota(&answer.body, WATER).clone()
}

/// Each of the user's grants: (request id, whether it is confirmed).
async fn grants(app: &TestApp, user: &User) -> Vec<(String, bool)> {
    let mut grants: Vec<(String, bool)> = app
        .items_of(user, "grant")
        .await
        .iter()
        .map(|g| {
            (
                attr_s(g, "request_id").unwrap_or_default().to_string(),
                g.contains_key("confirmed_at"),
            )
        })
        .collect();
    grants.sort();
    grants
}

/// No tap marks left over on the user's water quota item.
async fn no_marks_left(app: &TestApp, user: &User) {
    let quota = app
        .item(user, &format!("QUOTA#{WATER}"))
        .await
        .unwrap_or_default();
    for name in ["taps_reported", "taps_popup"] {
        let left = quota.get(name).and_then(|v| v.as_ss().ok());
        assert!(left.is_none_or(|l| l.is_empty()), "{name}: {left:?}");
    }
}

#[tokio::test]
async fn a_report_and_the_popup_event_of_one_tap_make_one_confirmed_grant_in_either_order() {
    let app = spawn_pushing_app(1).await;
    let first = app.user("report-first").await;
    report(&app, &first, "tap_a").await;
    assert_eq!(water(&app, &first).await["confirmed"], 0);
    popup(&app, &first, Duration::zero()).await;

    let second = app.user("popup-first").await;
    popup(&app, &second, Duration::zero()).await;
    // A popup accept alone is no grant.
    let alone = water(&app, &second).await;
    assert_eq!(
        (&alone["accepted"], &alone["available"]),
        (&json!(0), &json!(0))
    );
    assert!(grants(&app, &second).await.is_empty());
    report(&app, &second, "tap_b").await;

    for (user, request) in [(&first, "tap_a"), (&second, "tap_b")] {
        let shown = water(&app, user).await;
        assert_eq!(
            (&shown["accepted"], &shown["available"], &shown["confirmed"]),
            (&json!(1), &json!(1), &json!(1)),
            "{shown}"
        );
        assert_eq!(grants(&app, user).await, vec![(request.to_string(), true)]);
        no_marks_left(&app, user).await;
    }
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn reports_and_popup_events_at_once_confirm_each_tap_once_round_after_round() {
    // WeChat delivers each popup event three times at once, as its retries may.
    let app = spawn_pushing_app(3).await;
    let rounds = 6;
    let names: Vec<String> = (0..rounds).map(|i| format!("both{i}")).collect();
    let users = join_all(names.iter().map(|name| app.user(name))).await;
    for (round, user) in users.iter().enumerate() {
        let request = format!("tap_{round}");
        // The client's report (and its retry) and WeChat's event race.
        let (a, b, _) = tokio::join!(
            report(&app, user, &request),
            report(&app, user, &request),
            popup(&app, user, Duration::zero()),
        );
        assert_eq!(a["grants"], b["grants"], "a replay answers the same");
    }
    for (round, user) in users.iter().enumerate() {
        let shown = water(&app, user).await;
        assert_eq!(
            (&shown["accepted"], &shown["confirmed"]),
            (&json!(1), &json!(1)),
            "round {round}: {shown}"
        );
        assert_eq!(
            grants(&app, user).await,
            vec![(format!("tap_{round}"), true)]
        );
        let recorded = app
            .items_of(user, "push")
            .await
            .into_iter()
            .filter(|p| attr_s(p, "event") == Some("popup"))
            .count();
        assert_eq!(recorded, 1, "round {round}: one event, however delivered");
        no_marks_left(&app, user).await;
    }
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn one_popup_confirms_one_of_two_taps_and_a_stale_one_confirms_none() {
    let app = spawn_pushing_app(1).await;
    let user = app.user("two-taps").await;
    report(&app, &user, "tap_1").await;
    report(&app, &user, "tap_2").await;
    popup(&app, &user, Duration::zero()).await;
    let shown = water(&app, &user).await;
    assert_eq!(
        (&shown["accepted"], &shown["confirmed"]),
        (&json!(2), &json!(1)),
        "{shown}"
    );
    let confirmed = grants(&app, &user).await;
    assert_eq!(
        confirmed,
        vec![("tap_1".to_string(), true), ("tap_2".to_string(), false)]
    );

    // A popup from half an hour ago is not this tap's.
    let late = app.user("stale-popup").await;
    popup(&app, &late, Duration::minutes(30)).await;
    report(&app, &late, "tap_late").await;
    let shown = water(&app, &late).await;
    assert_eq!(
        (&shown["accepted"], &shown["confirmed"]),
        (&json!(1), &json!(0)),
        "{shown}"
    );
    // The stale popup's mark is gone (dropped by the first pairing read after it).
    let quota_item = app
        .item(&late, &format!("QUOTA#{WATER}"))
        .await
        .unwrap_or_default();
    assert!(
        quota_item
            .get("taps_popup")
            .and_then(|v| v.as_ss().ok())
            .is_none_or(|l| l.is_empty()),
        "{quota_item:?}"
    );
    assert_eq!(attr_n(&quota_item, "confirmed"), None);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_check_ins_grant_is_confirmed_like_a_reported_one() {
    let app = spawn_pushing_app(1).await;
    // A plan waiting for its first grant; the tap comes with a check-in.
    let user = app.user("checker").await;
    let plan = app.enable(&user, "water").await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    popup(&app, &user, Duration::zero()).await;
    let answer = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "ck_1", "grant_request_id": "tap_ck", "subscription_status": "accept",
                    "occurred_at": app.now().to_rfc3339(), "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        grants(&app, &user).await,
        vec![("tap_ck".to_string(), true)]
    );
    assert_eq!(water(&app, &user).await["confirmed"], 1);
    no_marks_left(&app, &user).await;
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn pairing_costs_a_report_one_read_per_accepted_template_and_a_pair_one_transaction() {
    let app = spawn_pushing_app(1).await;
    let user = app.user("cost").await;
    // A history of taps the popup events confirmed: nothing of it is read again.
    for i in 0..10 {
        report(&app, &user, &format!("tap_{i}")).await;
        popup(&app, &user, Duration::seconds(20 - i)).await;
    }
    assert_eq!(water(&app, &user).await["confirmed"], 10);
    app.round_trips.take();
    report(&app, &user, "tap_next").await;
    assert_eq!(
        app.round_trips.take(),
        vec![
            "GetItem",
            "BatchGetItem",
            "BatchGetItem",
            "TransactWriteItems",
            "GetItem",
            "Query"
        ],
        "the caller admitted (no erasure), its admission read (ledger and the minute's \
         counters), its plan read, the report, the pairing read, the answer's quotas"
    );
    popup(&app, &user, Duration::zero()).await;
    let ops = app.round_trips.take();
    assert_eq!(
        ops.iter().filter(|o| *o == "TransactWriteItems").count(),
        2,
        "the event's record, then the pair: {ops:?}"
    );
    assert_eq!(
        ops.iter().filter(|o| o.starts_with("Query")).count(),
        0,
        "{ops:?}"
    );
    assert_eq!(water(&app, &user).await["confirmed"], 11);
    no_marks_left(&app, &user).await;
}
