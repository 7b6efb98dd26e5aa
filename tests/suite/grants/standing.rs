//! The user's standing choice (`wx.getSetting({withSubscriptions: true})`'s
//! `subscriptionsSetting`), reported with a grant report or a check-in: a kept reject,
//! a ban or the main switch off pauses the template's plans with a reason that says so
//! and stops `needs_grant` asking; once the setting no longer keeps it, the plan waits
//! for the next grant; replays change nothing — through the HTTP API.

use futures::future::join_all;
use onegrant_tests::{
    ORDER, TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_plans_consistent,
    attr_s, plan_state, quota, spawn_app,
};
use serde_json::{Value, json};

const CHECKINS: &str = "/v1/reminders/water/checkins";

/// `POST /v1/grants` with `results` and `setting` (`subscriptions_setting`); the answer.
async fn report(
    app: &TestApp,
    user: &User,
    request_id: &str,
    results: Value,
    setting: Value,
) -> Value {
    let answer = app
        .post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": request_id, "results": results, "subscriptions_setting": setting}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

fn check_in_body(action_id: &str, setting: Value) -> Value {
    json!({
        "action_id": action_id,
        "occurred_at": onegrant::Clock::real_now().to_rfc3339(),
        "current_count": 1,
        "daily_goal": 8,
        "subscriptions_setting": setting,
    })
}

/// The plan as `GET /v1/reminders/water` shows it: (state, pause reason, needs_grant).
async fn plan(app: &TestApp, user: &User) -> (String, Option<String>, bool) {
    app.plan_state(user, "water").await
}

fn view(plan: &Value) -> (String, Option<String>, bool) {
    plan_state(plan)
}

fn paused(reason: &str, asks: bool) -> (String, Option<String>, bool) {
    ("paused".to_string(), Some(reason.to_string()), asks)
}

/// The water quota as `GET /v1/grants` shows it: (standing, needs_grant, available).
async fn water_quota(app: &TestApp, user: &User) -> (Option<String>, bool, u64) {
    let answer = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let water = quota(&answer.body, WATER);
    (
        water["standing"].as_str().map(str::to_string),
        water["needs_grant"].as_bool().unwrap_or(true),
        water["available"].as_u64().unwrap_or(0),
    )
}

/// The stored items, but for the audit trail's (which a replay adds nothing to either).
async fn state(
    app: &TestApp,
) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    let mut items = app.items().await;
    items.sort_by_key(|i| format!("{:?}{:?}", attr_s(i, "pk"), attr_s(i, "sk")));
    items
}

/// The case: a report carrying a kept reject pauses the plan `always_rejected`
/// and stops asking (grants held from before or not); one whose setting keeps accept
/// afterwards leaves it waiting for a new accept, which the next report brings. Every
/// replay of the reports, in any order, changes nothing.
#[tokio::test]
async fn a_standing_reject_pauses_without_asking_and_accept_lets_the_next_grant_resume() {
    let app = spawn_app().await;
    let user = app.scheduled_user("alice", 2).await;
    let reject =
        json!({"main_switch": true, "item_settings": {WATER: "reject", "not_ours": "accept"}});
    let kept_no = || {
        let body = json!({WATER: "reject"});
        report(&app, &user, "wr_kept_no", body, reject.clone())
    };
    let answer = kept_no().await;
    assert_eq!(quota(&answer, WATER)["standing"], "reject", "{answer}");
    assert_eq!(plan(&app, &user).await, paused("always_rejected", false));
    assert_eq!(
        water_quota(&app, &user).await,
        (Some("reject".into()), false, 2)
    );
    assert!(
        quota(&answer, ORDER).get("standing").is_none(),
        "no choice kept for it"
    );
    // Time passing sends nothing: the plan is on no due index.
    assert_eq!(app.tick(3).await.claimed, 0);

    // The user changes the setting to "always accept"; this tap was for another
    // template: the water plan now asks for a new accept.
    let accept = json!({"main_switch": true, "item_settings": {WATER: "accept"}});
    report(
        &app,
        &user,
        "wr_order",
        json!({ORDER: "accept"}),
        accept.clone(),
    )
    .await;
    assert_eq!(plan(&app, &user).await, paused("rejected", true));
    assert_eq!(
        water_quota(&app, &user).await,
        (Some("accept".into()), false, 2)
    );
    let before = state(&app).await;
    // The first report replayed: answered as before, nothing moves.
    let again = kept_no().await;
    assert_eq!(again["grants"], answer["grants"]);
    assert_eq!(state(&app).await, before, "a replay changes nothing");
    assert_eq!(plan(&app, &user).await, paused("rejected", true));

    // The next tap's silent accept is one grant, like any other: the plan resumes.
    report(
        &app,
        &user,
        "wr_silent_yes",
        json!({WATER: "accept"}),
        accept.clone(),
    )
    .await;
    assert_eq!(plan(&app, &user).await.0, "scheduled");
    assert_eq!(
        water_quota(&app, &user).await,
        (Some("accept".into()), false, 3)
    );
    let before = state(&app).await;
    for (id, results, setting) in [
        ("wr_kept_no", json!({WATER: "reject"}), reject),
        ("wr_order", json!({ORDER: "accept"}), accept.clone()),
        ("wr_silent_yes", json!({WATER: "accept"}), accept),
    ] {
        report(&app, &user, id, results, setting).await;
    }
    assert_eq!(state(&app).await, before, "replays change nothing");
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

/// A check-in carries the setting too: the main switch off pauses the plan
/// `main_switch_off` and every template's quota stops asking; the check-in's own
/// answer shows it. Turning the plan off and on keeps the pause (it is about the
/// settings, not grants), and a check-in carrying a new accept does not lift it; the
/// switch back on does. A replay of the first check-in afterwards changes nothing.
#[tokio::test]
async fn the_main_switch_off_through_a_check_in_pauses_every_template_until_it_is_on() {
    let app = spawn_app().await;
    let user = app.scheduled_user("bob", 1).await;
    let off = json!({"main_switch": false, "item_settings": {WATER: "accept"}});
    let body = check_in_body("wc_off", off);
    let answered = app.post(CHECKINS, Some(&user.token), &body).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(view(&answered.body), paused("main_switch_off", false));
    let quotas = app.get("/v1/grants", Some(&user.token)).await;
    for template in [WATER, ORDER] {
        let q = quota(&quotas.body, template);
        assert_eq!(
            (q["standing"].as_str(), q["needs_grant"].as_bool()),
            (Some("main_switch_off"), Some(false)),
            "{q}"
        );
    }
    // Off and on again: the pause holds (a settings save is not an accept).
    assert_eq!(app.disable(&user, "water").await.status, 200);
    let on = app.enable(&user, "water").await;
    assert_eq!(
        view(&on.body),
        paused("main_switch_off", false),
        "{}",
        on.body
    );
    // A check-in carrying an accept (whose setting was not read) does not lift it.
    let mut accept = check_in_body("wc_accept", Value::Null);
    accept
        .as_object_mut()
        .map(|o| o.remove("subscriptions_setting"));
    accept["grant_request_id"] = json!("wr_unread_setting");
    accept["subscription_status"] = json!("accept");
    let answered = app.post(CHECKINS, Some(&user.token), &accept).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(view(&answered.body), paused("main_switch_off", false));

    let on_again = check_in_body("wc_on", json!({"main_switch": true}));
    let answered = app.post(CHECKINS, Some(&user.token), &on_again).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    // The refusal it was: with the grant the accept brought, a new accept resumes it.
    assert_eq!(view(&answered.body), paused("rejected", true));
    assert_eq!(water_quota(&app, &user).await.0, None, "no choice kept now");
    let before = state(&app).await;
    let replay = app.post(CHECKINS, Some(&user.token), &body).await;
    assert_eq!(replay.status, 200, "{}", replay.body);
    assert_eq!(state(&app).await, before, "the replay changes nothing");
    assert_eq!(water_quota(&app, &user).await.0, None);
    assert_plans_consistent(&app).await;
}

/// The main switch off holds for every template or for none: its changes are one
/// transaction. One the database keeps refusing (every transaction writing one
/// template's quota item, whichever template it is) leaves no template's choice and no
/// plan changed — not the main switch off on one template and not on the other — and
/// the client's retry of the same report, the database well again, applies it to all.
#[tokio::test]
async fn the_main_switch_off_applies_to_every_template_or_to_none() {
    use onegrant_tests::faults::Fault;
    let (app, proxy) = onegrant_tests::spawn_faulty_app(&[]).await;
    let off = json!({"main_switch": false, "item_settings": {}});
    for (i, refused) in [WATER, ORDER].into_iter().enumerate() {
        let user = app.scheduled_user(&format!("user{i}"), 1).await;
        let before = state(&app).await;
        let pattern = format!("QUOTA#{refused}");
        proxy.inject("TransactWriteItems", Some(&pattern), Fault::ServerError, 0);
        let body = json!({"request_id": format!("wr_off_{i}"), "results": {WATER: "reject"},
                          "subscriptions_setting": off});
        let answer = app.post("/v1/grants", Some(&user.token), &body).await;
        assert!(
            answer.status >= 500,
            "{refused}: {} {}",
            answer.status,
            answer.body
        );
        assert!(
            !proxy.injected().is_empty(),
            "{refused}: the refusal was applied"
        );
        assert_eq!(state(&app).await, before, "{refused}: nothing written");

        proxy.clear();
        let answer = app.post("/v1/grants", Some(&user.token), &body).await;
        assert_eq!(answer.status, 200, "{refused}: {}", answer.body);
        for template in [WATER, ORDER] {
            assert_eq!(
                quota(&answer.body, template)["standing"],
                "main_switch_off",
                "{refused}: {template}: {}",
                answer.body
            );
        }
        assert_eq!(plan(&app, &user).await, paused("main_switch_off", false));
    }
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

/// Bad settings are refused with their own error and nothing is stored, on both routes.
#[tokio::test]
async fn bad_settings_are_refused_and_store_nothing() {
    let app = spawn_app().await;
    let user = app.scheduled_user("carol", 1).await;
    let cases = [
        (json!("on"), 400, "invalid_body"),
        (Value::Null, 400, "invalid_body"),
        (
            json!({"main_switch": false, "item_settings": null}),
            400,
            "invalid_body",
        ),
        (json!({}), 400, "invalid_body"),
        (json!({"main_switch": 1}), 400, "invalid_body"),
        (
            json!({"main_switch": true, "item_settings": [WATER]}),
            400,
            "invalid_body",
        ),
        (
            json!({"main_switch": true, "item_settings": {WATER: "always"}}),
            422,
            "invalid_subscriptions_setting",
        ),
        (
            json!({"main_switch": true, "item_settings": {WATER: true}}),
            422,
            "invalid_subscriptions_setting",
        ),
        (
            json!({"main_switch": false, "read_at": "an hour ago"}),
            422,
            "invalid_subscriptions_setting",
        ),
        (
            json!({"main_switch": false, "read_at": 1_796_000_000_000_u64}),
            422,
            "invalid_subscriptions_setting",
        ),
        (
            json!({"main_switch": false, "read_at": "2026-12-06T05:00:00"}),
            422,
            "invalid_subscriptions_setting",
        ),
    ];
    let before = state(&app).await;
    for (i, (setting, status, code)) in cases.into_iter().enumerate() {
        let grants = app
            .post(
                "/v1/grants",
                Some(&user.token),
                &json!({"request_id": format!("wr_bad_{i}"), "results": {WATER: "reject"}, "subscriptions_setting": setting}),
            )
            .await;
        let checkin = app
            .post(
                CHECKINS,
                Some(&user.token),
                &check_in_body(&format!("wc_bad_{i}"), setting.clone()),
            )
            .await;
        for answer in [grants, checkin] {
            assert_eq!(answer.status, status, "{setting}: {}", answer.body);
            assert_eq!(
                answer.body["error"]["code"], code,
                "{setting}: {}",
                answer.body
            );
        }
    }
    assert_eq!(state(&app).await, before, "nothing stored");
    assert_eq!(plan(&app, &user).await.0, "scheduled");
}

/// Reports racing with opposite settings: whichever lands last decides, and the quota's
/// standing and the plan always agree, checked from the stored items.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_settings_leave_the_quota_and_the_plan_agreeing() {
    // (Each report and each setting that changes something counts on the minute's rate.)
    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "600")]).await;
    let user = app.scheduled_user("dan", 1).await;
    for round in 0..3 {
        let reports = (0..8).map(|i| {
            let item = if i % 2 == 0 { "reject" } else { "accept" };
            let body = json!({"request_id": format!("wr_race_{round}_{i}"), "results": {WATER: "filter"},
                "subscriptions_setting": {"main_switch": true, "item_settings": {WATER: item}}});
            let (app, token) = (&app, user.token.clone());
            async move { app.post("/v1/grants", Some(&token), &body).await }
        });
        for answer in join_all(reports).await {
            assert_eq!(answer.status, 200, "{}", answer.body);
        }
        let items = app.items().await;
        let standing = items
            .iter()
            .find(|i| attr_s(i, "kind") == Some("quota") && attr_s(i, "template_id") == Some(WATER))
            .and_then(|q| attr_s(q, "standing"));
        let stored_plan = items
            .iter()
            .find(|i| attr_s(i, "kind") == Some("plan"))
            .expect("the plan");
        let reason = attr_s(stored_plan, "pause_reason");
        match standing {
            Some("reject") => assert_eq!(reason, Some("always_rejected"), "round {round}"),
            Some("accept") => assert_ne!(reason, Some("always_rejected"), "round {round}"),
            other => panic!("round {round}: standing {other:?}"),
        }
        assert_plans_consistent(&app).await;
    }
}

/// Settings that change something count against the user's reports of the minute
/// (`REPORTS_PER_MINUTE`): past it, a check-in carrying yet another change is refused
/// 429 and stores nothing; one carrying the setting as it stands writes nothing and
/// is not refused.
#[tokio::test]
async fn changing_settings_are_rate_limited_like_reports() {
    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "3")]).await;
    // The setup's grant report counts one: two changes make three.
    app.freeze_at_a_minute_start();
    let user = app.scheduled_user("erin", 1).await;
    let setting = |item: &str| json!({"main_switch": true, "item_settings": {WATER: item}});
    for (i, item) in ["reject", "accept"].into_iter().enumerate() {
        let answer = app
            .post(
                CHECKINS,
                Some(&user.token),
                &check_in_body(&format!("wc_rate_{i}"), setting(item)),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let before = state(&app).await;
    let third = app
        .post(
            CHECKINS,
            Some(&user.token),
            &check_in_body("wc_rate_2", setting("reject")),
        )
        .await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(third.body["error"]["code"], "rate_limited");
    assert_eq!(state(&app).await, before, "nothing stored");
    let same = app
        .post(
            CHECKINS,
            Some(&user.token),
            &check_in_body("wc_rate_3", setting("accept")),
        )
        .await;
    assert_eq!(same.status, 200, "the setting as it stands: {}", same.body);
}

/// The recipe: with `REPORTS_PER_MINUTE=2` and three templates configured, a
/// check-in carrying the main switch off changes three templates. It takes one place of
/// the minute, not three: it is recorded at once, and when the minute is full, its
/// retry in the next minute is (before, it was refused 429 on every retry, its check-in
/// never recorded). A grant report carrying it rides on the report's own place, even at
/// a limit of one.
#[tokio::test]
async fn a_setting_changing_more_templates_than_the_limit_is_recorded_and_never_refused_for_ever() {
    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "2")]).await;
    let user = app.scheduled_user("fay", 1).await;
    let off = json!({"main_switch": false});
    app.freeze_at_a_minute_start();
    let answer = app
        .post(
            CHECKINS,
            Some(&user.token),
            &check_in_body("wc_off_1", off.clone()),
        )
        .await;
    assert_eq!(answer.status, 200, "at once: {}", answer.body);
    assert_eq!(view(&answer.body), paused("main_switch_off", false));
    assert_eq!(
        water_quota(&app, &user).await.0.as_deref(),
        Some("main_switch_off")
    );
    assert_eq!(plan(&app, &user).await, paused("main_switch_off", false));
    // The minute's second place taken by a report, a check-in turning the switch on
    // again is refused, and recorded in the next minute.
    let fill = app
        .post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": "wr_fill", "results": {ORDER: "accept"}}),
        )
        .await;
    assert_eq!(fill.status, 200, "{}", fill.body);
    let on = json!({"main_switch": true});
    let body = check_in_body("wc_on", on);
    let refused = app.post(CHECKINS, Some(&user.token), &body).await;
    onegrant_tests::assert_rate_limited(&refused, "the minute's places are taken");
    app.advance(std::time::Duration::from_secs(61));
    let retried = app.post(CHECKINS, Some(&user.token), &body).await;
    assert_eq!(retried.status, 200, "its retry: {}", retried.body);
    assert_eq!(water_quota(&app, &user).await.0, None);
    for template in [WATER, ORDER] {
        let answer = app.get("/v1/grants", Some(&user.token)).await;
        assert!(
            quota(&answer.body, template)["standing"].is_null(),
            "{template}"
        );
    }

    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "1")]).await;
    let user = app.user("gus").await;
    app.freeze_at_a_minute_start();
    let body = report(&app, &user, "wr_off", json!({WATER: "accept"}), off).await;
    assert_eq!(quota(&body, ORDER)["standing"], "main_switch_off", "{body}");
    assert_eq!(
        water_quota(&app, &user).await.0.as_deref(),
        Some("main_switch_off")
    );
}

/// A push of `ORDER` to `user`, titled and numbered `key`, at `priority`.
fn order_push(user: &User, key: &str, priority: &str) -> Value {
    json!({"idempotency_key": key, "openid": user.openid, "type": "order", "title": key,
           "priority": priority,
           "wechat": {"template_id": ORDER,
                      "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}})
}

/// The push of `user`'s notification titled `key` as the inbox shows it: (status, reason).
async fn push_of(app: &TestApp, user: &User, key: &str) -> (String, Option<String>) {
    let page = app.get("/v1/notifications", Some(&user.token)).await.body;
    let note = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|n| n["title"] == key)
        .unwrap_or_else(|| panic!("no notification {key}: {page}"))
        .clone();
    (
        note["push"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        note["push"]["reason"].as_str().map(str::to_string),
    )
}

/// The ORDER grants `user` holds, as `GET /v1/grants` shows them.
async fn order_available(app: &TestApp, user: &User) -> u64 {
    let answer = app.get("/v1/grants", Some(&user.token)).await;
    quota(&answer.body, ORDER)["available"]
        .as_u64()
        .unwrap_or(0)
}

/// A refusal always wins over a push: while the user's settings keep its template
/// refused (a kept reject, the main switch off) a push is not sent — not even a `high`
/// one — and ends `skipped` with reason `turned_off`, the grants held untouched and the
/// notification in the inbox; once the setting accepts again, the next push goes out
/// on the grant that was kept.
#[tokio::test]
async fn a_push_of_a_template_the_users_settings_refuse_is_never_sent_and_spends_no_grant() {
    let app = onegrant_tests::spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    let reject = json!({"main_switch": true, "item_settings": {ORDER: "reject"}});
    // Two grants given earlier (WeChat holds them too); then the user keeps "reject"
    // for the template.
    app.accept(&user, ORDER, "wr_1").await;
    app.accept(&user, ORDER, "wr_2").await;
    report(&app, &user, "wr_kept_no", json!({ORDER: "reject"}), reject).await;
    assert_eq!(order_available(&app, &user).await, 2);
    app.notify(order_push(&user, "urgent", "high")).await;
    app.notify(order_push(&user, "normal", "normal")).await;
    let summary = app.tick(30).await;
    assert_eq!(
        (summary.turned_off, summary.sent, summary.claimed),
        (2, 0, 0),
        "{summary:?}"
    );
    for key in ["urgent", "normal"] {
        assert_eq!(
            push_of(&app, &user, key).await,
            ("skipped".to_string(), Some("turned_off".to_string())),
            "{key}"
        );
    }
    assert!(app.deliveries().await.is_empty(), "nothing sent");
    assert_eq!(order_available(&app, &user).await, 2, "no grant spent");
    // Nothing left due: the next tick claims nothing.
    assert_eq!(app.tick(3).await.due, 0);

    // The main switch off refuses every template, this one too.
    let off = json!({"main_switch": false, "item_settings": {ORDER: "accept"}});
    report(&app, &user, "wr_off", json!({WATER: "reject"}), off).await;
    let grants = app.get("/v1/grants", Some(&user.token)).await.body;
    assert_eq!(
        quota(&grants, ORDER)["standing"],
        "main_switch_off",
        "{grants}"
    );
    app.notify(order_push(&user, "switched_off", "high")).await;
    let summary = app.tick(30).await;
    assert_eq!((summary.turned_off, summary.sent), (1, 0), "{summary:?}");
    assert_eq!(order_available(&app, &user).await, 2);

    // The setting accepts again: the grant kept is the next push's.
    let on = json!({"main_switch": true, "item_settings": {ORDER: "accept"}});
    report(&app, &user, "wr_on", json!({WATER: "reject"}), on).await;
    app.notify(order_push(&user, "after", "normal")).await;
    let summary = app.tick(30).await;
    assert_eq!((summary.turned_off, summary.sent), (0, 1), "{summary:?}");
    assert_eq!(push_of(&app, &user, "after").await.0, "sent");
    assert_eq!(app.deliveries().await.len(), 1);
    assert_eq!(order_available(&app, &user).await, 1);
    assert_ledger_agrees_with_counters(&app).await;
}

/// A standing refusal that lands after a push's claim has read the quota item and
/// before its transaction: the claim's write to the quota item is conditional on no
/// refusal standing, so the claim reads again and the push is skipped, not sent. Made
/// deterministic by the fault proxy: the refusal's write is held, then applied right
/// after the claim's read has been served and before its answer goes back.
#[tokio::test]
async fn a_refusal_landing_between_a_claims_read_and_its_write_wins() {
    use onegrant_tests::faults::Fault;
    let (app, proxy) =
        onegrant_tests::spawn_faulty_app(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.notify(order_push(&user, "raced", "high")).await;

    // The refusal, as a write through the proxy, held there.
    proxy.inject("UpdateItem", Some("\"standing\""), Fault::HoldThenCommit, 1);
    proxy.inject("BatchGetItem", Some("PREFS"), Fault::ReleaseHeld, 1);
    let through_proxy = onegrant::aws::local_dynamodb_client(&proxy.url);
    let (table, pk) = (app.table.name.clone(), format!("USER#{}", user.openid));
    let refusal = tokio::spawn(async move {
        let _ = through_proxy
            .update_item()
            .table_name(table)
            .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(pk))
            .key(
                "sk",
                aws_sdk_dynamodb::types::AttributeValue::S(format!("QUOTA#{ORDER}")),
            )
            .update_expression("SET #standing = :reject")
            .expression_attribute_names("#standing", "standing")
            .expression_attribute_values(
                ":reject",
                aws_sdk_dynamodb::types::AttributeValue::S("reject".into()),
            )
            .send()
            .await;
    });
    proxy.until_held().await;
    // (Passed through, to count the claims' transactions: only they reserve a grant.)
    let pass = Fault::CommitThenDelay(std::time::Duration::ZERO);
    proxy.inject(
        "TransactWriteItems",
        Some(onegrant_tests::faults::RESERVES_A_GRANT),
        pass,
        0,
    );
    let summary = app.tick(30).await;
    refusal.abort();
    let claims = proxy.injected().iter().filter(|(_, f)| *f == pass).count();
    assert_eq!(
        claims, 1,
        "the claim's transaction was tried once, and refused"
    );
    let released = proxy.released();
    assert!(
        released
            .iter()
            .any(|(status, body)| *status == 200 && body.contains("standing")),
        "the refusal landed after the claim's read: {released:?}"
    );
    assert_eq!((summary.turned_off, summary.sent), (1, 0), "{summary:?}");
    assert_eq!(
        push_of(&app, &user, "raced").await,
        ("skipped".to_string(), Some("turned_off".to_string()))
    );
    assert!(app.deliveries().await.is_empty(), "nothing sent");
    assert_eq!(order_available(&app, &user).await, 1, "no grant spent");
    assert_ledger_agrees_with_counters(&app).await;
}

/// `subscriptions_setting` as read `seconds_ago` by the client: the main switch and
/// ORDER's kept choice (`None`: none kept).
fn read_ago(app: &TestApp, seconds_ago: i64, main_switch: bool, order: Option<&str>) -> Value {
    let read_at = app.now() - chrono::Duration::seconds(seconds_ago);
    let items = order.map_or_else(|| json!({}), |o| json!({ORDER: o}));
    json!({"main_switch": main_switch, "item_settings": items,
           "read_at": read_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)})
}

/// The ORDER quota's standing choice, as `GET /v1/grants` shows it.
async fn order_standing(app: &TestApp, user: &User) -> Option<String> {
    let answer = app.get("/v1/grants", Some(&user.token)).await;
    quota(&answer.body, ORDER)["standing"]
        .as_str()
        .map(str::to_string)
}

/// The newest standing choice wins (issue 41 §7): settings apply in the order the
/// client read them (`read_at`), not as they arrive. A setting read before the one
/// applied — from a second device, or a queue held offline — changes nothing, so a push
/// the newer setting allows is sent, not skipped `turned_off`; one read after it
/// applies; and a newer setting that changes nothing still makes an older one arriving
/// after it stale.
#[tokio::test]
async fn a_setting_read_before_the_one_applied_arrives_late_and_changes_nothing() {
    let app = onegrant_tests::spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    // Held: each setting's `read_at` is so many seconds before one instant, whatever
    // the requests between them take (on the live clock, a report slower than 2 s made
    // the setting read "3 s ago" newer than the one read "1 s ago").
    app.freeze_at_a_minute_start();
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_order").await;
    let on = read_ago(&app, 10, true, Some("accept"));
    report(&app, &user, "wr_newer", json!({WATER: "accept"}), on).await;
    assert_eq!(order_standing(&app, &user).await.as_deref(), Some("accept"));
    // Read a minute earlier with the main switch off; arrives now.
    let stale = read_ago(&app, 60, false, None);
    report(&app, &user, "wr_stale", json!({WATER: "accept"}), stale).await;
    assert_eq!(
        order_standing(&app, &user).await.as_deref(),
        Some("accept"),
        "the stale setting changed the standing choice"
    );
    app.notify(order_push(&user, "shipped", "normal")).await;
    let summary = app.tick(30).await;
    assert_eq!((summary.sent, summary.turned_off), (1, 0), "{summary:?}");
    assert_eq!(push_of(&app, &user, "shipped").await.0, "sent");

    // Read after the applied one: it applies.
    let off = read_ago(&app, 5, false, None);
    report(&app, &user, "wr_off", json!({WATER: "accept"}), off).await;
    assert_eq!(
        order_standing(&app, &user).await.as_deref(),
        Some("main_switch_off")
    );
    // Newer again, the same choice (nothing else changes), then one read between the
    // two arrives: still off.
    let again = read_ago(&app, 1, false, None);
    report(&app, &user, "wr_off_again", json!({WATER: "accept"}), again).await;
    let between = read_ago(&app, 3, true, Some("accept"));
    report(&app, &user, "wr_between", json!({WATER: "accept"}), between).await;
    assert_eq!(
        order_standing(&app, &user).await.as_deref(),
        Some("main_switch_off"),
        "a setting read before the newest one applied changed it"
    );
    app.notify(order_push(&user, "held", "high")).await;
    let summary = app.tick(30).await;
    assert_eq!((summary.sent, summary.turned_off), (0, 1), "{summary:?}");
    // A setting that does not say when it was read is taken as read on arrival.
    let unsaid = json!({"main_switch": true, "item_settings": {ORDER: "accept"}});
    report(&app, &user, "wr_unsaid", json!({WATER: "accept"}), unsaid).await;
    assert_eq!(order_standing(&app, &user).await.as_deref(), Some("accept"));
    assert_ledger_agrees_with_counters(&app).await;
}

/// Settings racing from many requests at once, each read at its own instant and sent
/// in shuffled order, leave the standing choice of the one read last, round after
/// round.
#[tokio::test]
async fn of_settings_racing_the_one_read_last_decides() {
    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "600")]).await;
    let user = app.user("alice").await;
    const RACERS: i64 = 6;
    const CHOICES: [&str; 3] = ["accept", "reject", "ban"];
    for round in 0..5_i64 {
        // Racer i read its setting (RACERS - i) seconds ago; the choice alternates and
        // the order they are sent in is turned each round.
        let reports = (0..RACERS).map(|i| {
            let i = (i + round) % RACERS;
            let choice = CHOICES[usize::try_from((i + round) % 3).unwrap_or(0)];
            let setting = read_ago(&app, RACERS - i, true, Some(choice));
            let (app, user) = (&app, &user);
            async move {
                let request_id = format!("wr_{round}_{i}");
                let answer = app
                    .post(
                        "/v1/grants",
                        Some(&user.token),
                        &json!({"request_id": request_id, "results": {WATER: "accept"},
                                "subscriptions_setting": setting}),
                    )
                    .await;
                assert_eq!(answer.status, 200, "{}", answer.body);
            }
        });
        join_all(reports).await;
        let last = CHOICES[usize::try_from((RACERS - 1 + round) % 3).unwrap_or(0)];
        assert_eq!(
            order_standing(&app, &user).await.as_deref(),
            Some(last),
            "round {round}"
        );
        // The next round's settings are all read after this one's.
        app.advance(std::time::Duration::from_secs(60));
    }
    assert_plans_consistent(&app).await;
}
