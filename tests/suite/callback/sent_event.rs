//! WeChat's `subscribe_msg_sent_event` settling uncertain sends: the stand-in delivers,
//! drops the connection, and pushes its sent event to `/wechat/callback` over real
//! HTTP, sealed in safe mode, as WeChat does.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::join_all;
use onegrant_tests::{
    ORDER, TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_plans_consistent,
    attr_n, attr_s, spawn_faulty_pushing_app, spawn_pushing_app, spawn_pushing_app_with,
};
use serde_json::{Value, json};

/// The stand-in's pushes, once there are `n` (each answered by the callback).
async fn pushes(app: &TestApp, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let pushes = app.control("GET", "pushes", None).await["pushes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if pushes.len() >= n {
            return pushes;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the stand-in made fewer than {n} pushes");
}

async fn due_user(app: &TestApp, name: &str, grants: u32, fault: Option<Value>) -> User {
    let user = app.scheduled_user(name, grants).await;
    if let Some(mut fault) = fault {
        fault["openid"] = json!(user.openid);
        app.control("POST", "faults", Some(fault)).await;
    }
    app.make_due(&user, "water", app.now()).await;
    user
}

/// A due user whose reminder WeChat took, but whose connection dropped and whose sent
/// event was lost: one `unknown` send, its grant void, the plan paused.
async fn unknown_user(app: &TestApp, name: &str, grants: u32) -> User {
    let fault = json!({"drop_after_delivery": true, "no_push": true});
    let user = due_user(app, name, grants, Some(fault)).await;
    // (30 s: a tick needs about 15 s left to send one, and a loaded machine's sweep
    // and reads take some of the rest.)
    assert_eq!(app.tick(30).await.claimed, 1);
    let delivery = the_one(app.items_of(&user, "delivery").await);
    assert_eq!(attr_s(&delivery, "state"), Some("unknown"), "{delivery:?}");
    user
}

/// The user's one reminder, settled `sent` by WeChat's event (with `msgid`): the grant
/// consumed and counted so, the plan awaiting the check-in, no mark left open.
async fn assert_settled_sent(app: &TestApp, user: &User, msgid: &str) {
    let delivery = the_one(app.items_of(user, "delivery").await);
    assert_eq!(attr_s(&delivery, "state"), Some("sent"), "{delivery:?}");
    assert_eq!(attr_s(&delivery, "msgid"), Some(msgid), "{delivery:?}");
    assert!(delivery.contains_key("event_settled_at"), "{delivery:?}");
    assert_eq!(
        app.grant_state_of(user, &delivery).await.as_deref(),
        Some("consumed")
    );
    let quota = app
        .item(user, &format!("QUOTA#{WATER}"))
        .await
        .unwrap_or_default();
    assert_eq!(attr_n(&quota, "consumed"), Some(1), "{quota:?}");
    assert_eq!(attr_n(&quota, "invalid"), Some(0), "{quota:?}");
    assert_eq!(attr_n(&quota, "reserved"), Some(0), "{quota:?}");
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "awaiting_checkin", "{}", plan.body);
    assert!(marks(app, user, WATER, "open_unknown").await.is_empty());
}

/// WeChat's sent event for `user`'s send `msgid` of `template`, pushed by the stand-in
/// (as many copies as its push target says), each answered `success`.
async fn sent_event(
    app: &TestApp,
    user: &User,
    template: &str,
    msgid: impl serde::Serialize,
    error_code: i64,
) {
    app.push_event_answered(
        json!({"event": "sent", "openid": user.openid, "template_id": template,
                       "msgid": msgid, "error_code": error_code}),
    )
    .await;
}

fn the_one(items: Vec<HashMap<String, AttributeValue>>) -> HashMap<String, AttributeValue> {
    assert_eq!(items.len(), 1, "{items:?}");
    items.into_iter().next().unwrap_or_default()
}

/// The members of a string-set attribute of the user's quota item of `template`.
async fn marks(app: &TestApp, user: &User, template: &str, name: &str) -> Vec<String> {
    app.item(user, &format!("QUOTA#{template}"))
        .await
        .and_then(|q| q.get(name).and_then(|v| v.as_ss().ok()).cloned())
        .unwrap_or_default()
}

/// The stand-in's msgid for the delivery to `user`.
async fn delivered_msgids(app: &TestApp, user: &User) -> Vec<String> {
    app.deliveries()
        .await
        .iter()
        .filter(|d| d["openid"] == json!(user.openid))
        .map(|d| d["msgid"].as_u64().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn a_dropped_send_is_settled_sent_by_the_standins_sent_event() {
    let app = spawn_pushing_app(1).await;
    let user = due_user(
        &app,
        "dropped",
        2,
        Some(json!({"drop_after_delivery": true})),
    )
    .await;
    let summary = app.tick(30).await;
    // The dispatcher never heard WeChat's answer: it recorded the send `unknown`.
    assert_eq!((summary.claimed, summary.unknown), (1, 1), "{summary:?}");

    let pushed = pushes(&app, 1).await;
    assert_eq!(pushed[0]["event"], "sent", "{pushed:?}");
    assert_eq!(pushed[0]["answers"], json!([200]), "{pushed:?}");
    let msgids = delivered_msgids(&app, &user).await;
    assert_eq!(msgids.len(), 1);

    assert_settled_sent(&app, &user, &msgids[0]).await;
    let delivery = the_one(app.items_of(&user, "delivery").await);
    assert_eq!(
        attr_s(&delivery, "outcome"),
        Some("sent (WeChat's sent event)"),
        "{delivery:?}"
    );
    // Its msgid stays known for the window: WeChat may deliver the event again.
    assert_eq!(marks(&app, &user, WATER, "sent_marks").await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
    // Nothing resent.
    assert_eq!(app.tick(10).await.claimed, 0);
    assert_eq!(app.deliveries().await.len(), 1);
}

/// Every copy of `pushed` answered 200 — or, where the loaded emulator could not take
/// a copy within WeChat's window, answered 503 and pushed again, as WeChat retries,
/// until all its copies are answered 200: how many pushes that took. (WeChat retries
/// three times; up to ten here, where a loaded machine may miss the window with every
/// copy of a round. Contention that never let a copy through would still fail.)
async fn acknowledged(app: &TestApp, pushed: &Value) -> usize {
    let all_ok = |answers: &Value| {
        answers
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|s| s == 200))
    };
    if all_ok(&pushed["answers"]) {
        return 0;
    }
    let answers = pushed["answers"].as_array().cloned().unwrap_or_default();
    assert!(
        answers.iter().all(|a| a == 200 || a == 503),
        "only the window's 503 may stand in for a 200: {pushed}"
    );
    // WeChat's retry: the same event, its CreateTime the same.
    let retry_of = json!({"event": "sent", "openid": pushed["openid"],
                          "template_id": pushed["template_id"], "msgid": pushed["msgid"],
                          "error_code": pushed["error_code"],
                          "create_time": pushed["create_time"]});
    for retry in 1..=10 {
        if all_ok(&app.push_event(retry_of.clone()).await["answers"]) {
            return retry;
        }
    }
    panic!("WeChat's retries of {pushed} were never all answered 200");
}

#[tokio::test]
async fn the_same_sent_event_ten_times_at_once_settles_once_round_after_round() {
    let app = spawn_pushing_app(10).await;
    let rounds = 4;
    let mut users = Vec::new();
    // Pushes made so far (a retried copy's push counts).
    let mut seen = 0;
    for round in 0..rounds {
        let user = due_user(
            &app,
            &format!("r{round}"),
            1,
            Some(json!({"drop_after_delivery": true})),
        )
        .await;
        assert_eq!(app.tick(30).await.claimed, 1);
        let pushed = pushes(&app, seen + 1).await;
        seen += 1 + acknowledged(&app, &pushed[seen]).await;
        users.push(user);
    }
    for user in &users {
        let msgid = delivered_msgids(&app, user).await;
        assert_eq!(msgid.len(), 1);
        assert_settled_sent(&app, user, &msgid[0]).await;
        // Each copy was recorded as the same event once.
        let recorded: Vec<_> = app
            .items_of(user, "push")
            .await
            .into_iter()
            .filter(|p| attr_s(p, "event") == Some("sent"))
            .collect();
        assert_eq!(recorded.len(), 1, "{recorded:?}");
    }
    assert_eq!(app.deliveries().await.len(), rounds);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_definite_sends_event_never_settles_another_unknown_send_however_often_it_comes() {
    // Every event is delivered four times at once, as WeChat's retries may overlap.
    let app = spawn_pushing_app(4).await;
    // First send: delivered, connection dropped, and WeChat's event lost: `unknown`.
    let user = unknown_user(&app, "known", 3).await;
    let first = the_one(app.items_of(&user, "delivery").await);
    assert_eq!(attr_s(&first, "state"), Some("unknown"));
    assert_eq!(marks(&app, &user, WATER, "open_unknown").await.len(), 1);

    // The user checks in; the next reminder of the same template goes out normally
    // within the event window, and its own event arrives.
    let answer = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "kc_1", "occurred_at": app.now().to_rfc3339(),
                    "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["state"], "scheduled", "{}", answer.body);
    app.make_due(&user, "water", app.now()).await;
    assert_eq!(app.tick(30).await.claimed, 1);
    let pushed = pushes(&app, 1).await;
    assert_eq!(pushed[0]["answers"].as_array().map(Vec::len), Some(4));
    acknowledged(&app, &pushed[0]).await;
    // And once more, a minute later.
    sent_event(&app, &user, WATER, &pushed[0]["msgid"], 0).await;

    // That event was the second send's: the first stays unknown, its grant void.
    let first_now = app
        .item(&user, attr_s(&first, "sk").unwrap_or_default())
        .await
        .unwrap_or_default();
    assert_eq!(
        attr_s(&first_now, "state"),
        Some("unknown"),
        "{first_now:?}"
    );
    assert_eq!(
        app.grant_state_of(&user, &first_now).await.as_deref(),
        Some("invalid")
    );
    let sent: Vec<_> = app
        .items_of(&user, "delivery")
        .await
        .into_iter()
        .filter(|d| attr_s(d, "state") == Some("sent"))
        .collect();
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].contains_key("event_settled_at"), "{:?}", sent[0]);
    // The sent send's mark stays known for the window; the unknown one's is open.
    assert_eq!(marks(&app, &user, WATER, "sent_marks").await.len(), 1);
    assert_eq!(marks(&app, &user, WATER, "open_unknown").await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

/// Two pushes of the order template to `user`, both delivered with the connection
/// dropped and their events lost: two `unknown` sends of one template.
async fn two_unknown_pushes(app: &TestApp, name: &str) -> User {
    let user = app.user(name).await;
    for i in 0..2 {
        app.accept(&user, ORDER, &format!("or_{name}_{i}")).await;
    }
    app.control(
        "POST",
        "faults",
        Some(
            json!({"openid": user.openid, "drop_after_delivery": true, "no_push": true,
                    "times": 0}),
        ),
    )
    .await;
    app.push(&user, &format!("{name}-1")).await;
    app.push(&user, &format!("{name}-2")).await;
    let mut claimed = 0;
    for _ in 0..3 {
        claimed += app.tick(30).await.claimed;
    }
    assert_eq!(claimed, 2);
    let states: Vec<_> = app
        .items_of(&user, "delivery")
        .await
        .iter()
        .map(|d| attr_s(d, "state").unwrap_or_default().to_string())
        .collect();
    assert_eq!(states, ["unknown", "unknown"]);
    user
}

#[tokio::test]
async fn an_event_that_fits_two_unknown_sends_settles_neither_and_one_that_fits_one_settles_it() {
    let app = spawn_pushing_app(1).await;
    let user = two_unknown_pushes(&app, "twice").await;
    let msgids = delivered_msgids(&app, &user).await;
    assert_eq!(msgids.len(), 2);
    sent_event(
        &app,
        &user,
        ORDER,
        msgids[0].parse::<u64>().unwrap_or_default(),
        0,
    )
    .await;
    let states: Vec<_> = app
        .items_of(&user, "delivery")
        .await
        .iter()
        .map(|d| attr_s(d, "state").unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        states,
        ["unknown", "unknown"],
        "which one is not known: neither"
    );
    assert_eq!(marks(&app, &user, ORDER, "open_unknown").await.len(), 2);

    // A push with one unknown send: its event settles it, and the notification shows it.
    let single = app.user("once").await;
    app.accept(&single, ORDER, "or_once").await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": single.openid, "drop_after_delivery": true, "no_push": true})),
    )
    .await;
    app.push(&single, "once-1").await;
    assert_eq!(app.tick(30).await.claimed, 1);
    let msgid = delivered_msgids(&app, &single).await;
    sent_event(
        &app,
        &single,
        ORDER,
        msgid[0].parse::<u64>().unwrap_or_default(),
        0,
    )
    .await;
    let delivery = the_one(app.items_of(&single, "delivery").await);
    assert_eq!(attr_s(&delivery, "state"), Some("sent"), "{delivery:?}");
    let outbox = the_one(app.items_of(&single, "outbox").await);
    assert_eq!(attr_s(&outbox, "state"), Some("sent"), "{outbox:?}");
    let inbox = app.get("/v1/notifications", Some(&single.token)).await;
    assert_eq!(
        inbox.body["items"][0]["push"]["status"], "sent",
        "{}",
        inbox.body
    );
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_failure_event_settles_failed_keeps_the_grant_void_and_retries_the_plan() {
    let app = spawn_pushing_app(1).await;
    let user = unknown_user(&app, "failed", 2).await;
    sent_event(&app, &user, WATER, 4_611_686_018_427_387_904u64, -1).await;
    let delivery = the_one(app.items_of(&user, "delivery").await);
    assert_eq!(attr_s(&delivery, "state"), Some("failed"), "{delivery:?}");
    assert_eq!(attr_n(&delivery, "errcode"), Some(-1));
    assert_eq!(
        app.grant_state_of(&user, &delivery).await.as_deref(),
        Some("invalid")
    );
    // Certainly not delivered: the plan is retried with the grant it has left.
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "scheduled", "{}", plan.body);

    // With no grant left, it waits for one instead.
    let last = unknown_user(&app, "failed-last", 1).await;
    sent_event(&app, &last, WATER, 4_611_686_018_427_387_905u64, -1).await;
    let plan = app.get("/v1/reminders/water", Some(&last.token)).await;
    assert_eq!(
        (&plan.body["state"], &plan.body["pause_reason"]),
        (&json!("paused"), &json!("needs_grant")),
        "{}",
        plan.body
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_check_in_made_while_the_send_was_uncertain_counts_when_the_event_settles_it() {
    let app = spawn_pushing_app(1).await;
    let user = unknown_user(&app, "checked", 1).await;
    // The user drinks while the reminder's fate is unknown; no grant left to schedule.
    let answer = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "uc_1", "occurred_at": app.now().to_rfc3339(),
                    "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["pause_reason"], "uncertain", "{}", answer.body);
    let msgid = delivered_msgids(&app, &user).await;
    sent_event(
        &app,
        &user,
        WATER,
        msgid[0].parse::<u64>().unwrap_or_default(),
        0,
    )
    .await;
    // Sent, and the check-in already made: the plan waits for a grant, not for a
    // check-in — so the next grant schedules it.
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(
        (&plan.body["state"], &plan.body["pause_reason"]),
        (&json!("paused"), &json!("needs_grant")),
        "{}",
        plan.body
    );
    app.accept(&user, WATER, "wr_after").await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "scheduled", "{}", plan.body);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn an_event_that_comes_while_its_send_is_still_in_flight_settles_it_once_it_is_unknown() {
    // WeChat delivers and pushes its event at once, but its answer never comes in
    // time: the event arrives while the send is in flight, outwaits its 3 s, and is
    // kept; the send's timeout (5 s) records it `unknown`, and the kept event settles it.
    let app = spawn_pushing_app_with(1, &[("WECHAT_TIMEOUT_MS", "5000")]).await;
    let user = due_user(
        &app,
        "slow",
        1,
        Some(json!({"hang_after_delivery_ms": 7000})),
    )
    .await;
    let summary = app.tick(60).await;
    assert_eq!(summary.unknown, 1, "{summary:?}");
    let pushed = pushes(&app, 1).await;
    assert_eq!(pushed[0]["answers"], json!([200]), "{pushed:?}");
    let msgid = delivered_msgids(&app, &user).await;
    assert_settled_sent(&app, &user, &msgid[0]).await;
    let quota = app
        .item(&user, &format!("QUOTA#{WATER}"))
        .await
        .unwrap_or_default();
    for name in ["inflight", "pending_events", "open_unknown"] {
        let left = quota.get(name).and_then(|v| v.as_ss().ok());
        assert!(left.is_none_or(|l| l.is_empty()), "{name}: {left:?}");
    }
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn events_for_other_users_templates_or_times_change_nothing() {
    let app = spawn_pushing_app(1).await;
    let user = unknown_user(&app, "other", 1).await;
    let stranger = app.user("stranger").await;
    let before = app.items().await.len();
    let events = [
        json!({"event": "sent", "openid": stranger.openid, "template_id": WATER, "msgid": 5u64}),
        json!({"event": "sent", "openid": user.openid, "template_id": ORDER, "msgid": 6u64}),
        json!({"event": "sent", "openid": user.openid, "template_id": "tmpl_not_configured", "msgid": 7u64}),
    ];
    let answers = join_all(events.into_iter().map(|e| app.push_event(e))).await;
    for answer in answers {
        assert_eq!(answer["answers"], json!([200]), "{answer}");
    }
    let delivery = the_one(app.items_of(&user, "delivery").await);
    assert_eq!(attr_s(&delivery, "state"), Some("unknown"), "{delivery:?}");
    // Only the events and their nonces were recorded.
    let added = app.items().await.len() - before;
    assert_eq!(added, 6, "three events, three nonces");
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_send_swept_unknown_after_its_dispatcher_vanished_is_settled_by_the_event() {
    let app = spawn_pushing_app(1).await;
    let user = due_user(&app, "vanished", 2, None).await;
    // A dispatcher claims, sends (WeChat takes it: msgid below) and vanishes.
    let now = app.now();
    let store = &app.deps.store;
    let span = store.shard_span(now).await.expect("registry");
    let due = store
        .due_items(now + chrono::Duration::seconds(5), &span)
        .await
        .expect("due");
    assert_eq!(due.len(), 1);
    app.claim_and_vanish(&due[0], now).await;
    let swept = app.sweep_at(now + chrono::Duration::seconds(30)).await;
    assert_eq!(swept.recovered, 1, "{swept:?}");
    let delivery = the_one(app.items_of(&user, "delivery").await);
    assert_eq!(attr_s(&delivery, "state"), Some("unknown"));
    assert_eq!(marks(&app, &user, WATER, "open_unknown").await.len(), 1);

    sent_event(&app, &user, WATER, 3_395_159_288_267_931_652u64, 0).await;
    assert_settled_sent(&app, &user, "3395159288267931652").await;
    let delivery = the_one(app.items_of(&user, "delivery").await);
    assert!(
        delivery.contains_key("swept_at"),
        "the sweep's record is kept"
    );
    assert!(marks(&app, &user, WATER, "open_unknown").await.is_empty());
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn marks_no_event_can_match_any_more_are_dropped_by_the_next_claim() {
    let app = spawn_pushing_app(1).await;
    // No events: the new send's own mark stays for the check below.
    app.control("DELETE", "push-target", None).await;
    let user = due_user(&app, "stale", 2, None).await;
    let fresh = format!("{}#777", app.now().timestamp());
    app.quota_update(&user, WATER)
        .update_expression("ADD sent_marks :s, open_unknown :u, inflight :f, pending_events :p")
        .expression_attribute_values(":f", AttributeValue::Ss(vec!["1000#gone".into()]))
        .expression_attribute_values(":p", AttributeValue::Ss(vec!["1000#5:0".into()]))
        .expression_attribute_values(
            ":s",
            AttributeValue::Ss(vec!["1000#111".into(), fresh.clone()]),
        )
        .expression_attribute_values(":u", AttributeValue::Ss(vec!["1000#dead".into()]))
        .send()
        .await
        .expect("marks set up");
    assert_eq!(app.tick(30).await.sent, 1);
    let sent = marks(&app, &user, WATER, "sent_marks").await;
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent.contains(&fresh), "a fresh mark stays: {sent:?}");
    assert!(!sent.contains(&"1000#111".to_string()), "{sent:?}");
    for name in ["open_unknown", "pending_events"] {
        assert!(marks(&app, &user, WATER, name).await.is_empty(), "{name}");
    }
    // The in-flight set is pruned by the next event instead (a claim adds to it).
    assert_eq!(marks(&app, &user, WATER, "inflight").await, ["1000#gone"]);
    let target = onegrant_local::stack::standin_push(&app.deps.config, &app.base_url);
    app.control("POST", "push-target", Some(json!(target)))
        .await;
    sent_event(&app, &user, WATER, 1u64, 0).await;
    assert!(marks(&app, &user, WATER, "inflight").await.is_empty());
}

#[tokio::test]
async fn an_event_held_back_by_another_send_in_flight_settles_its_own_send_when_that_one_ends() {
    let app = spawn_pushing_app_with(1, &[("WECHAT_TIMEOUT_MS", "5000")]).await;
    // Send A: delivered, answer lost, WeChat's event not yet come: `unknown`.
    let fault = json!({"drop_after_delivery": true, "no_push": true});
    let user = due_user(&app, "held", 2, Some(fault)).await;
    assert_eq!(app.tick(60).await.unknown, 1);
    let a_msgid = delivered_msgids(&app, &user).await[0].clone();
    // The user checks in; send B of the same template is slow to answer.
    let answer = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "hc_1", "occurred_at": app.now().to_rfc3339(),
                    "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(answer.body["state"], "scheduled", "{}", answer.body);
    app.make_due(&user, "water", app.now()).await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "hang_after_delivery_ms": 4000, "no_push": true})),
    )
    .await;
    // A's event arrives while B is in flight: held back (B's own, for all it knows).
    let during = async {
        while app.deliveries().await.len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        app.push_event(
            json!({"event": "sent", "openid": user.openid, "template_id": WATER,
                              "msgid": a_msgid.parse::<u64>().unwrap_or_default()}),
        )
        .await
    };
    let (summary, answer) = tokio::join!(app.tick(60), during);
    assert_eq!(answer["answers"], json!([200]), "{answer}");
    assert_eq!(summary.sent, 1, "{summary:?}");
    // B settled `sent`; the held event then found A.
    let states: std::collections::BTreeMap<String, String> = app
        .items_of(&user, "delivery")
        .await
        .iter()
        .map(|d| {
            (
                attr_s(d, "msgid").unwrap_or("-").to_string(),
                attr_s(d, "state").unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states.get(&a_msgid).map(String::as_str),
        Some("sent"),
        "{states:?}"
    );
    assert!(states.values().all(|s| s == "sent"), "{states:?}");
    assert!(marks(&app, &user, WATER, "pending_events").await.is_empty());
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_sent_event_whose_writes_meet_a_database_fault_settles_its_send_once() {
    use onegrant_tests::faults::ONCE;
    // Where: the settlement's transaction, the callback's first request (its nonce), or
    // its first single-item update (the event marked applied).
    for (operation, pattern) in [
        ("TransactWriteItems", Some("event_settled_at")),
        ("*", None),
        ("UpdateItem", None),
    ] {
        for fault in ONCE {
            let case = format!("{operation} {pattern:?} × {fault:?}");
            let (app, proxy) = spawn_faulty_pushing_app(1).await;
            let user = unknown_user(&app, "faulty-event", 1).await;
            proxy.inject(operation, pattern, fault, 1);
            let event = json!({"event": "sent", "openid": user.openid, "template_id": WATER,
                               "msgid": 4_200_000_000_000_000_001u64, "error_code": 0});
            // WeChat pushes again when the answer is not `success` (up to 3 times).
            let mut answered = Vec::new();
            for _ in 0..3 {
                let answer = app.push_event(event.clone()).await;
                answered.push(answer["answers"].clone());
                if answer["answers"] == json!([200]) {
                    break;
                }
            }
            assert_eq!(
                proxy.injected().iter().filter(|(_, f)| *f == fault).count(),
                1,
                "{case}: the fault was met"
            );
            proxy.clear();
            assert_eq!(answered.last(), Some(&json!([200])), "{case}: {answered:?}");
            assert_settled_sent(&app, &user, "4200000000000000001").await;
            // Once: the same event again changes nothing.
            let settled = the_one(app.items_of(&user, "delivery").await);
            let answer = app.push_event(event).await;
            assert_eq!(answer["answers"], json!([200]), "{case}: {answer}");
            assert_eq!(
                the_one(app.items_of(&user, "delivery").await),
                settled,
                "{case}"
            );
            assert_settled_sent(&app, &user, "4200000000000000001").await;
            assert_ledger_agrees_with_counters(&app).await;
            assert_plans_consistent(&app).await;
            assert_eq!(app.deliveries().await.len(), 1, "{case}: nothing resent");
        }
    }
}

#[tokio::test]
async fn a_dropped_send_is_settled_by_the_event_in_every_push_mode_and_format() {
    // WeChat's push as configured in the console: plain, compatible or safe mode, JSON
    // or XML. The stand-in pushes each as WeChat does; the callback reads each alike.
    for (mode, format) in [
        ("plain", "json"),
        ("plain", "xml"),
        ("compatible", "json"),
        ("compatible", "xml"),
        ("safe", "xml"),
    ] {
        let case = format!("{mode} {format}");
        // (Plain mode only as the explicit insecure opt-in.)
        let app = spawn_pushing_app_with(
            1,
            &[
                ("WECHAT_PUSH_MODE", mode),
                ("WECHAT_PUSH_FORMAT", format),
                ("WECHAT_PUSH_INSECURE_PLAIN", "true"),
            ],
        )
        .await;
        let user = due_user(
            &app,
            "any-mode",
            1,
            Some(json!({"drop_after_delivery": true})),
        )
        .await;
        let summary = app.tick(30).await;
        assert_eq!(
            (summary.claimed, summary.unknown),
            (1, 1),
            "{case}: {summary:?}"
        );
        let pushed = pushes(&app, 1).await;
        assert_eq!(pushed[0]["answers"], json!([200]), "{case}: {pushed:?}");
        let msgids = delivered_msgids(&app, &user).await;
        assert_eq!(msgids.len(), 1, "{case}");
        assert_settled_sent(&app, &user, &msgids[0]).await;
        assert_ledger_agrees_with_counters(&app).await;
        assert_plans_consistent(&app).await;
    }
}
