//! The refill notice: when a reminder spends the user's last grant of a template that
//! names a refill template, one notice goes out with the refill template's own grant —
//! once per depletion, never without a grant, recorded in the inbox.

use onegrant::domain::inbox::refill::{Depletion, NOTE_TYPE, notice};
use onegrant::domain::reminders::schedule::Timezone;
use onegrant::store::inbox::Refilled;
use onegrant_tests::inbox::put_preferences;
use onegrant_tests::{
    TestApp, User, WATER, assert_ledger_agrees_with_counters, attr_n, spawn_app_with,
};
use serde_json::{Value, json};

/// The local stack's refill template for water reminders.
const USED_UP: &str = "tmpl_grants_used_up";

/// The user's notifications of the refill type, from the API.
async fn refill_notes(app: &TestApp, user: &User) -> Vec<Value> {
    let notes = app.get("/v1/notifications", Some(&user.token)).await;
    assert_eq!(notes.status, 200, "{}", notes.body);
    notes.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|n| n["type"] == NOTE_TYPE)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_reminder_that_uses_up_the_grants_sends_the_refill_notice_once_and_only_with_its_grant() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    // One water grant, one refill grant, the plan on.
    let user = app.scheduled_user("alice", 1).await;
    app.accept(&user, USED_UP, "wr_refill_1").await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(
        plan.body["refill_template_id"], USED_UP,
        "the client learns the pairing"
    );
    app.make_due(&user, "water", app.now()).await;
    let first = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!((first.sent, first.refills), (1, 1), "{first:?}");
    assert_eq!(app.available(&user, WATER).await, 0);
    // The notice is in the inbox, its push pending with the refill template.
    let notes = refill_notes(&app, &user).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["push"]["status"], "pending");
    // The next tick sends it, with the refill grant.
    let second = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!((second.sent, second.refills), (1, 0), "{second:?}");
    let deliveries = app.deliveries().await;
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    assert_eq!(deliveries[1]["template_id"], USED_UP);
    assert_eq!(deliveries[1]["data"]["thing1"]["value"], "喝水提醒");
    assert_eq!(app.available(&user, USED_UP).await, 0, "its grant spent");
    assert_eq!(refill_notes(&app, &user).await[0]["push"]["status"], "sent");
    // The same depletion again (a finalize run twice): nothing new.
    let templates = &app.deps.config.templates;
    let (water, used_up) = (
        templates.get(WATER).expect("water"),
        templates.get(USED_UP).expect("used up"),
    );
    let accepted = app
        .item(&user, &format!("QUOTA#{WATER}"))
        .await
        .and_then(|q| attr_n(&q, "accepted"))
        .and_then(|n| u64::try_from(n).ok())
        .expect("the water quota's accepted count");
    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let depletion = Depletion {
        accepted,
        zone: Timezone::SHANGHAI,
    };
    let again = notice(water, used_up, openid, depletion, app.now()).expect("notice");
    let replay = Box::pin(app.deps.store.refill(
        &again,
        &water.id,
        &used_up.id,
        accepted,
        app.now(),
        app.now(),
    ))
    .await
    .expect("refill");
    assert_eq!(replay, Refilled::Already);
    assert_eq!(refill_notes(&app, &user).await.len(), 1);

    // A second depletion: the user checks in with one new water grant, and holds no
    // refill grant.
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": user.openid, "template_id": WATER, "count": 1})),
    )
    .await;
    let checked_in = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "wc_1", "occurred_at": app.now().to_rfc3339(),
                    "current_count": 1, "daily_goal": 8,
                    "grant_request_id": "wr_water_2", "subscription_status": "accept"}),
        )
        .await;
    assert_eq!(checked_in.status, 200, "{}", checked_in.body);
    assert_eq!(checked_in.body["state"], "scheduled", "{}", checked_in.body);
    assert_eq!(checked_in.body["refill_template_id"], USED_UP);
    app.make_due(&user, "water", app.now()).await;
    let third = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(
        (third.sent, third.refills, third.refills_without_grant),
        (1, 0, 1),
        "no refill notice without its grant, and the metric counts it: {third:?}"
    );
    assert_eq!(refill_notes(&app, &user).await.len(), 1);
    let quiet = app.tick(5).await;
    assert_eq!(quiet.sent, 0, "{quiet:?}");
    assert_eq!(app.deliveries().await.len(), 3);
    assert_ledger_agrees_with_counters(&app).await;
}

/// The notice tells when the messages stopped in the user's own zone: their day's
/// (their quiet hours'), as the daily cap counts it, not China's.
#[tokio::test]
async fn the_refill_notice_tells_its_time_in_the_users_own_zone() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.scheduled_user("nell", 1).await;
    app.accept(&user, USED_UP, "wr_refill_1").await;
    // Quiet hours in London from six to seven hours on by its clock (wall-clock
    // arithmetic: always an hour, never now, across a change of its clocks).
    let london = Timezone::parse("Europe/London").expect("zone");
    let there = |at: chrono::DateTime<chrono::Utc>| at.with_timezone(&london.tz());
    let quiet = |hours| {
        (there(app.now()).time() + chrono::Duration::hours(hours))
            .format("%H:%M")
            .to_string()
    };
    let body = json!({"quiet_hours": {"start": quiet(6), "end": quiet(7),
                                      "timezone": "Europe/London"}, "muted_types": []});
    let (status, answer) = put_preferences(&app, &user, &body).await;
    assert_eq!(status, 200, "{answer}");
    app.make_due(&user, "water", app.now()).await;
    let first = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!((first.sent, first.refills), (1, 1), "{first:?}");
    let notes = refill_notes(&app, &user).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    let created =
        chrono::DateTime::parse_from_rfc3339(notes[0]["created_at"].as_str().expect("created_at"))
            .expect("an instant")
            .with_timezone(&chrono::Utc);
    let told = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(told.sent, 1, "{told:?}");
    let deliveries = app.deliveries().await;
    let notice = deliveries
        .iter()
        .find(|d| d["template_id"] == USED_UP)
        .expect("the notice was sent");
    let china = created.with_timezone(&Timezone::SHANGHAI.tz());
    assert_eq!(
        notice["data"]["time2"]["value"],
        there(created).format("%Y-%m-%d %H:%M").to_string(),
        "London's time, not China's ({})",
        china.format("%Y-%m-%d %H:%M")
    );
}

#[tokio::test]
async fn no_refill_notice_while_grants_remain_or_for_a_template_naming_none() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    // Two water grants: the reminder leaves one, so nothing is used up.
    let user = app.scheduled_user("bob", 2).await;
    app.accept(&user, USED_UP, "wr_refill_b").await;
    app.make_due(&user, "water", app.now()).await;
    let tick = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(
        (tick.sent, tick.refills, tick.refills_without_grant),
        (1, 0, 0)
    );
    assert!(refill_notes(&app, &user).await.is_empty());
    assert_eq!(
        app.available(&user, USED_UP).await,
        1,
        "the refill grant kept"
    );
    // An order push that spends the last order grant: its template names no refill.
    let other = app.user("carol").await;
    app.accept(&other, onegrant_tests::ORDER, "wr_order_1")
        .await;
    app.notify(json!({"idempotency_key": "o-1", "openid": other.openid, "type": "order", "title": "t",
                      "wechat": {"template_id": onegrant_tests::ORDER,
                                 "data": {"character_string1": "o-1", "phrase2": "已发货", "thing3": "顺丰速运"}}}))
        .await;
    let pushed = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(
        (pushed.sent, pushed.refills, pushed.refills_without_grant),
        (1, 0, 0)
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// A refusal made while the last reminder is in flight wins over the refill notice,
/// whether the user reports it (a grant report's reject) or WeChat pushes it (a reject
/// in its popup): no notice, the refill grant kept.
#[tokio::test]
async fn a_refusal_during_the_last_send_wins_over_the_refill_notice() {
    for popup in [false, true] {
        let app =
            onegrant_tests::spawn_pushing_app_with(1, &[("WECHAT_TIMEOUT_MS", "10000")]).await;
        let user = app.scheduled_user("dora", 1).await;
        app.accept(&user, USED_UP, "wr_refill_d").await;
        app.make_due(&user, "water", app.now()).await;
        // WeChat holds the send until the user has refused the template meanwhile.
        app.hold_sends(&user.openid, true).await;
        let tick = app.tick(120);
        let refuse = async {
            app.until_sending(&user, "water").await;
            if popup {
                app.push_event_answered(json!({"event": "popup", "openid": user.openid,
                                               "template_id": WATER, "status": "reject",
                                               "create_time": app.now().timestamp()}))
                    .await;
            } else {
                let refused = app
                    .post(
                        "/v1/grants",
                        Some(&user.token),
                        &json!({"request_id": "wr_reject_d", "results": {WATER: "reject"}}),
                    )
                    .await;
                assert_eq!(refused.status, 200, "{}", refused.body);
            }
            app.hold_sends(&user.openid, false).await;
        };
        let (summary, ()) = tokio::join!(tick, refuse);
        assert_eq!(
            (summary.sent, summary.refills, summary.refills_without_grant),
            (1, 0, 0),
            "popup {popup}: the reminder went out; the refusal made during it wins: {summary:?}"
        );
        assert!(refill_notes(&app, &user).await.is_empty());
        assert_eq!(
            app.available(&user, USED_UP).await,
            1,
            "the refill grant kept"
        );
        assert_ledger_agrees_with_counters(&app).await;
    }
}

#[tokio::test]
async fn no_event_on_the_bus_may_publish_as_onegrant_itself() {
    let app = spawn_app_with(&[]).await;
    let user = app.user("mallory").await;
    for detail_type in ["onegrant.notification", "onegrant.cancel"] {
        let answer = app
            .notify_as(
                onegrant::domain::inbox::refill::PUBLISHER,
                detail_type,
                json!({"idempotency_key": "refill:tmpl_water_reminder:wr_guess", "openid": user.openid,
                       "type": "order", "title": "t"}),
            )
            .await;
        assert_eq!(
            (answer["status"].as_str(), answer["reason"].as_str()),
            (Some("refused"), Some("source")),
            "{detail_type}: {answer}"
        );
    }
    assert!(
        app.items_of(&user, "note").await.is_empty(),
        "nothing stored"
    );
    assert!(app.items().await.iter().all(|i| {
        i.get("kind")
            .and_then(|k| k.as_s().ok())
            .map(String::as_str)
            != Some("event")
    }));
}

/// A push that spends the user's last grant while nothing else of its template waits
/// tells nothing; pushes that then wait for a grant are messages stopped, and the wait
/// finds the depletion: one notice for the two, sent with the refill grant. A grant
/// spent with a push still waiting is a new depletion, and with no refill grant left it
/// is counted, not told.
#[tokio::test]
async fn a_push_that_uses_up_the_grants_while_others_wait_sends_the_refill_notice() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("pia").await;
    app.accept(&user, USED_UP, "wr_refill").await;
    let water = |key: &str, priority: &str| {
        json!({"idempotency_key": key, "openid": user.openid, "type": "water", "title": "t",
               "priority": priority,
               "wechat": {"template_id": WATER,
                          "data": {"thing1": "喝水", "time2": "2026-12-02 10:00", "number3": "1"}}})
    };
    // Alone: it takes the last grant, nothing waits, no notice.
    app.accept(&user, WATER, "wr_alone").await;
    app.notify(water("alone", "normal")).await;
    let alone = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!((alone.sent, alone.refills), (1, 0), "{alone:?}");
    assert!(refill_notes(&app, &user).await.is_empty());
    // Two wait: the grants are used up with messages stopped, one notice.
    app.notify(water("later", "low")).await;
    app.notify(water("first", "high")).await;
    let waits = app.ticks_until(|s| s.grant_waits >= 2).await;
    assert_eq!((waits.grant_waits, waits.refills), (2, 1), "{waits:?}");
    assert_eq!(refill_notes(&app, &user).await.len(), 1);
    let told = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(
        told.sent, 1,
        "the notice goes out with the refill grant: {told:?}"
    );
    // One grant: the high one spends it while the low one waits; no refill grant left.
    app.accept(&user, WATER, "wr_one").await;
    let spent = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(
        (spent.sent, spent.refills, spent.refills_without_grant),
        (1, 0, 1),
        "{spent:?}"
    );
    let deliveries = app.deliveries().await;
    assert_eq!(
        deliveries
            .iter()
            .filter(|d| d["template_id"] == USED_UP)
            .count(),
        1,
        "{deliveries:?}"
    );
    assert_eq!(refill_notes(&app, &user).await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
}

/// A refill template the user's settings keep refused cannot tell them anything (its
/// push would be skipped): no notice is published, counted as a depletion without a
/// usable refill grant, and the refill grant is kept.
#[tokio::test]
async fn no_refill_notice_when_the_users_settings_refuse_the_refill_template() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.scheduled_user("erin", 1).await;
    app.accept(&user, USED_UP, "wr_refill_e").await;
    let kept_no = app
        .post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": "wr_kept_no_e", "results": {onegrant_tests::ORDER: "reject"},
                    "subscriptions_setting": {"main_switch": true, "item_settings": {USED_UP: "reject"}}}),
        )
        .await;
    assert_eq!(kept_no.status, 200, "{}", kept_no.body);
    app.make_due(&user, "water", app.now()).await;
    let tick = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(
        (tick.sent, tick.refills, tick.refills_without_grant),
        (1, 0, 1),
        "{tick:?}"
    );
    assert!(refill_notes(&app, &user).await.is_empty());
    assert_eq!(
        app.available(&user, USED_UP).await,
        1,
        "the refill grant kept"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// A water push of `user` keyed and titled `key`.
fn water_push(user: &User, key: &str) -> Value {
    json!({"idempotency_key": key, "openid": user.openid, "type": "water", "title": key,
           "wechat": {"template_id": WATER,
                      "data": {"thing1": "喝水", "time2": "2026-12-02 10:00", "number3": "1"}}})
}

/// The refill notice in a burst (issue 41 §5): three grants and five pushes due at
/// once, WeChat answering late, so the three sends are in flight together and no claim
/// sees itself taking the last grant with none other out. The last one out finds the
/// grants used up while two pushes wait: one notice, sent with the refill grant.
#[tokio::test]
async fn pushes_that_use_up_the_grants_together_send_the_refill_notice_once() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("burst").await;
    app.accept(&user, USED_UP, "wr_refill").await;
    app.accept_n(&user, WATER, 3).await;
    for i in 0..5 {
        app.notify(water_push(&user, &format!("burst-{i}"))).await;
    }
    app.control("POST", "latency", Some(json!({"ms": 400})))
        .await;
    let spent = app.ticks_until(|s| s.sent >= 3).await;
    app.control("POST", "latency", Some(json!({"ms": 0}))).await;
    assert_eq!((spent.sent, spent.refills), (3, 1), "{spent:?}");
    assert_eq!(refill_notes(&app, &user).await.len(), 1);
    let told = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(told.sent, 1, "{told:?}");
    let deliveries = app.deliveries().await;
    let notices = deliveries
        .iter()
        .filter(|d| d["template_id"] == USED_UP)
        .count();
    assert_eq!((deliveries.len(), notices), (4, 1), "{deliveries:?}");
    assert_eq!(app.available(&user, USED_UP).await, 0);
    // Finding the same depletion again publishes nothing.
    let found = app
        .deps
        .store
        .depletion(
            &onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid"),
            &onegrant::domain::TemplateId::parse(WATER).expect("template"),
            false,
        )
        .await
        .expect("depletion");
    assert_eq!(
        found.map(|d| d.accepted),
        Some(3),
        "used up at three accepted, two waiting"
    );
    assert_eq!(refill_notes(&app, &user).await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
}

/// Members of the waiting list whose push no longer waits (cancelled while waiting)
/// are not messages still to send: spending the last grant then tells nothing. (A push
/// waiting for the user's first grant of a template tells nothing either: nothing was
/// used up.)
#[tokio::test]
async fn pushes_that_no_longer_wait_are_not_counted_as_waiting_for_the_notice() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("stale").await;
    app.accept(&user, USED_UP, "wr_refill").await;
    let mut low = water_push(&user, "cancelled");
    low["priority"] = json!("low");
    app.notify(low).await;
    app.notify(water_push(&user, "goes")).await;
    let waits = app.ticks_until(|s| s.grant_waits >= 2).await;
    assert_eq!((waits.grant_waits, waits.refills), (2, 0), "{waits:?}");
    let cancelled = app.cancel(&user, "cancelled").await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // One grant wakes the better one, which spends it; the low one's member is stale.
    app.accept(&user, WATER, "wr_water").await;
    let spent = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!((spent.sent, spent.refills), (1, 0), "{spent:?}");
    let members = app
        .item(&user, &format!("QUOTA#{WATER}"))
        .await
        .and_then(|q| q.get("waiting").and_then(|w| w.as_ss().ok()).cloned())
        .unwrap_or_default();
    assert_eq!(
        members.len(),
        1,
        "the stale member still listed: {members:?}"
    );
    assert!(refill_notes(&app, &user).await.is_empty());
    assert_ledger_agrees_with_counters(&app).await;
}
