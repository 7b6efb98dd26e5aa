//! Reminder plans and check-ins: the state machine and next-due rule end to end, and
//! idempotent check-ins that carry the next grant.

use chrono::{DateTime, Duration, Utc};
use futures::future::join_all;
use onegrant_tests::faults::Fault;
use onegrant_tests::{
    TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_plans_consistent, attr_n,
    attr_s, plan_state, quota, spawn_app, spawn_faulty_app,
};
use serde_json::{Value, json};

const PLAN: &str = "/v1/reminders/water";
const CHECKINS: &str = "/v1/reminders/water/checkins";

async fn grant(app: &TestApp, token: &str, request_id: &str) -> Value {
    let answer = app
        .post(
            "/v1/grants",
            Some(token),
            &json!({"request_id": request_id, "results": {WATER: "accept"}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

async fn put(app: &TestApp, token: &str, body: &Value) -> Value {
    let answer = app
        .call(
            "PUT",
            PLAN,
            Some(token),
            Some(body.to_string().into_bytes()),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

fn checkin(action_id: &str, count: u32, grant: Option<(&str, &str)>) -> Value {
    let mut body = json!({
        "action_id": action_id,
        "occurred_at": onegrant::Clock::real_now().to_rfc3339(),
        "current_count": count,
        "daily_goal": 8,
    });
    if let Some((request_id, status)) = grant {
        body["grant_request_id"] = json!(request_id);
        body["subscription_status"] = json!(status);
    }
    body
}

fn due(plan: &Value) -> DateTime<Utc> {
    plan["next_due_at"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("no next_due_at in {plan}"))
}

/// The plan item as stored.
async fn stored_plan(
    app: &TestApp,
) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    app.items()
        .await
        .into_iter()
        .find(|i| attr_s(i, "kind") == Some("plan"))
        .expect("a stored plan")
}

#[tokio::test]
async fn the_water_reminder_always_exists_and_starts_disabled_with_its_defaults() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let plan = app.get(PLAN, Some(&token)).await;
    assert_eq!(plan.status, 200);
    assert_eq!(plan.body["state"], "disabled");
    assert_eq!(plan.body["needs_grant"], true);
    assert_eq!(plan.body["next_due_at"], Value::Null);
    assert_eq!(plan.body["template_id"], WATER);
    assert_eq!(
        plan.body["settings"],
        json!({"interval_minutes": 120, "wake_time": "08:00", "sleep_time": "22:00", "timezone": "Asia/Shanghai", "daily_goal": 8})
    );
    assert_eq!(plan.body["today"]["count"], 0);
    let stored: Vec<_> = app
        .items()
        .await
        .into_iter()
        .filter(|i| !onegrant_tests::attr_s(i, "sk").is_some_and(|sk| sk.ends_with("#reads")))
        .collect();
    assert!(
        stored.is_empty(),
        "reading stores nothing but its read counter: {stored:?}"
    );
}

#[tokio::test]
async fn enabling_without_a_grant_pauses_and_a_grant_report_schedules_within_waking_hours() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let paused = put(&app, &token, &json!({"enabled": true})).await;
    assert_eq!(
        (paused["state"].as_str(), paused["pause_reason"].as_str()),
        (Some("paused"), Some("needs_grant"))
    );
    assert_eq!(paused["next_due_at"], Value::Null);
    assert_plans_consistent(&app).await;

    grant(&app, &token, "wr_1").await;
    let plan = app.get(PLAN, Some(&token)).await.body;
    assert_eq!(plan["state"], "scheduled", "{plan}");
    assert_eq!(plan["needs_grant"], false);
    let at = due(&plan);
    assert!(at > app.now(), "due in the future");
    assert!(at <= app.now() + Duration::hours(2) + Duration::hours(10) + Duration::minutes(1));
    assert!(
        plan["next_due_at"]
            .as_str()
            .is_some_and(|t| t.ends_with("+08:00")),
        "returned in the user's zone"
    );
    let schedule = app
        .deps
        .config
        .reminders
        .get("water")
        .expect("water")
        .defaults
        .schedule;
    assert!(schedule.is_awake(at), "due inside waking hours: {plan}");
    assert_plans_consistent(&app).await;
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn enabling_with_a_grant_schedules_and_settings_are_validated_and_kept() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    grant(&app, &token, "wr_1").await;
    let plan = put(
        &app,
        &token,
        &json!({"enabled": true, "interval_minutes": 60, "wake_time": "09:00", "sleep_time": "01:00", "timezone": "Europe/London", "daily_goal": 6}),
    )
    .await;
    assert_eq!(plan["state"], "scheduled");
    assert_eq!(plan["settings"]["sleep_time"], "01:00");
    assert_eq!(plan["settings"]["timezone"], "Europe/London");
    // Absent fields keep their value.
    let plan = put(&app, &token, &json!({"enabled": true, "daily_goal": 10})).await;
    assert_eq!(
        (
            plan["settings"]["interval_minutes"].as_u64(),
            plan["settings"]["daily_goal"].as_u64()
        ),
        (Some(60), Some(10))
    );
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_check_in_carrying_a_grant_resumes_a_waiting_plan_and_repeating_a_reported_grant_adds_none()
 {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    put(&app, &token, &json!({"enabled": true})).await;
    let answer = app
        .post(
            CHECKINS,
            Some(&token),
            &checkin("wc_1", 1, Some(("wr_1", "accept"))),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["state"], "scheduled");
    assert_eq!(answer.body["today"]["count"], 1);
    // The same grant reported again through POST /v1/grants is a replay.
    let report = grant(&app, &token, "wr_1").await;
    assert_eq!(quota(&report, WATER)["accepted"], 1);
    // And a check-in repeating it adds nothing either.
    let again = app
        .post(
            CHECKINS,
            Some(&token),
            &checkin("wc_2", 2, Some(("wr_1", "accept"))),
        )
        .await;
    assert_eq!(again.status, 200);
    let quotas = app.get("/v1/grants", Some(&token)).await;
    assert_eq!(quota(&quotas.body, WATER)["accepted"], 1);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_check_in_on_a_disabled_plan_is_recorded_and_the_plan_stays_off() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let answer = app
        .post(
            CHECKINS,
            Some(&token),
            &checkin("wc_1", 3, Some(("wr_1", "accept"))),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["state"], "disabled");
    assert_eq!(answer.body["today"]["count"], 3);
    assert_eq!(
        answer.body["needs_grant"], false,
        "the carried grant is kept"
    );
    let actions = app
        .items()
        .await
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("action"))
        .count();
    assert_eq!(actions, 1);
    assert_plans_consistent(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_check_ins_have_one_effect_and_fifty_identical_answers() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    put(&app, &token, &json!({"enabled": true})).await;
    let body = checkin("wc_same", 4, Some(("wr_same", "accept")));
    let answers = join_all((0..50).map(|_| app.post(CHECKINS, Some(&token), &body))).await;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body, answers[0].body, "identical answers");
    }
    let items = app.items().await;
    let count = |kind: &str| {
        items
            .iter()
            .filter(|i| attr_s(i, "kind") == Some(kind))
            .count()
    };
    assert_eq!((count("action"), count("grant")), (1, 1));
    let plan = stored_plan(&app).await;
    assert_eq!(attr_n(&plan, "version"), Some(2), "enable + one check-in");
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_distinct_check_ins_are_all_recorded_with_no_lost_version() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    put(&app, &token, &json!({"enabled": true})).await;
    let bodies: Vec<Value> = (0..50)
        .map(|i| checkin(&format!("wc_{i}"), i, Some((&format!("wr_{i}"), "accept"))))
        .collect();
    // As the client does: a 503 (contended past the write budget, on a loaded
    // machine) is sent again after a pause; a replay of one that landed is a replay.
    let answers = join_all(
        bodies
            .iter()
            .map(|b| app.call_retrying("POST", CHECKINS, Some(&token), Some(b))),
    )
    .await;
    assert!(
        answers.iter().all(|(a, _)| a.status == 200),
        "{:?}",
        answers.iter().map(|(a, _)| a.status).collect::<Vec<_>>()
    );
    let items = app.items().await;
    let actions = items
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("action"))
        .count();
    assert_eq!(actions, 50, "every check-in recorded");
    let plan = stored_plan(&app).await;
    assert_eq!(
        attr_n(&plan, "version"),
        Some(51),
        "one plan version per write"
    );
    assert_eq!(
        attr_n(&plan, "today_count"),
        Some(49),
        "the highest count of the day"
    );
    assert_eq!(attr_s(&plan, "state"), Some("scheduled"));
    let quotas = app.get("/v1/grants", Some(&token)).await;
    assert_eq!(quota(&quotas.body, WATER)["accepted"], 50);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn an_action_id_reused_with_a_different_payload_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    put(&app, &token, &json!({"enabled": true})).await;
    let first = checkin("wc_1", 2, Some(("wr_1", "accept")));
    let applied = app.post(CHECKINS, Some(&token), &first).await;
    assert_eq!(applied.status, 200);
    assert!(applied.headers.get("idempotent-replayed").is_none());
    let replay = app.post(CHECKINS, Some(&token), &first).await;
    assert_eq!(replay.status, 200);
    // Told apart, so a client does not take the plan as it was then for the plan now.
    assert_eq!(
        replay
            .headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(replay.body, applied.body, "the first application's answer");
    let before = app.items().await;
    let mut changed = first.clone();
    changed["current_count"] = json!(3);
    let refused = app.post(CHECKINS, Some(&token), &changed).await;
    assert_eq!(
        (refused.status, refused.body["error"]["code"].as_str()),
        (409, Some("idempotency_conflict"))
    );
    assert_eq!(
        before,
        app.items().await,
        "a refused check-in writes nothing"
    );
}

#[tokio::test]
async fn a_check_in_whose_grant_conflicts_is_recorded_without_the_grant_and_says_so() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    put(&app, &token, &json!({"enabled": true})).await;
    // The report said accept; the queued check-in carries the same request as reject.
    grant(&app, &token, "wr_1").await;
    let before = app.get("/v1/grants", Some(&token)).await;
    let body = checkin("wc_1", 3, Some(("wr_1", "reject")));
    let answer = app.post(CHECKINS, Some(&token), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["grant_conflict"], true, "{}", answer.body);
    assert_eq!(answer.body["today"]["count"], 3, "the drink is counted");
    assert_eq!(
        answer.body["state"], "scheduled",
        "the earlier accept stands"
    );
    let after = app.get("/v1/grants", Some(&token)).await;
    assert_eq!(
        quota(&before.body, WATER),
        quota(&after.body, WATER),
        "no grant added or refused"
    );
    let ledger = app
        .items()
        .await
        .into_iter()
        .filter(|i| attr_s(i, "kind") == Some("grant"))
        .collect::<Vec<_>>();
    assert_eq!(ledger.len(), 1);
    assert_eq!(attr_s(&ledger[0], "result"), Some("accept"));
    let replay = app.post(CHECKINS, Some(&token), &body).await;
    assert_eq!(
        (replay.status, &replay.body),
        (200, &answer.body),
        "the replay answers the same"
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_check_in_from_a_fast_clock_is_recorded_and_schedules_from_server_time() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    grant(&app, &token, "wr_0").await;
    put(&app, &token, &json!({"enabled": true})).await;
    for (i, ahead) in [Duration::minutes(10), Duration::days(3650)]
        .into_iter()
        .enumerate()
    {
        let count = 2 + i as u32;
        let request = format!("wr_{}", i + 1);
        let mut body = checkin(&format!("wc_{i}"), count, Some((&request, "accept")));
        let before = app.now();
        body["occurred_at"] = json!((before + ahead).to_rfc3339());
        let answer = app.post(CHECKINS, Some(&token), &body).await;
        assert_eq!(answer.status, 200, "{ahead}: {}", answer.body);
        assert_eq!(
            answer.body["today"]["count"], count,
            "{ahead}: counted today"
        );
        let due = answer.body["next_due_at"]
            .as_str()
            .and_then(|d| DateTime::parse_from_rfc3339(d).ok())
            .expect("scheduled")
            .with_timezone(&Utc);
        assert!(
            due < app.now() + chrono::Duration::days(2),
            "{ahead}: scheduled from server time, not from the phone's ({due})"
        );
        let replay = app.post(CHECKINS, Some(&token), &body).await;
        assert_eq!(
            replay.body, answer.body,
            "{ahead}: the replay answers the same"
        );
    }
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn disabling_invalidates_every_unconsumed_grant_and_leaves_the_due_index() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    for i in 0..3 {
        grant(&app, &token, &format!("wr_{i}")).await;
    }
    let on = put(&app, &token, &json!({"enabled": true})).await;
    assert_eq!(on["state"], "scheduled");
    assert_plans_consistent(&app).await;
    let off = put(&app, &token, &json!({"enabled": false})).await;
    assert_eq!(off["state"], "disabled");
    assert_eq!(off["needs_grant"], true);
    let items = app.items().await;
    let states: Vec<_> = items
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("grant"))
        .map(|i| attr_s(i, "state"))
        .collect();
    assert_eq!(states, vec![Some("invalid"); 3]);
    let counters = items
        .iter()
        .find(|i| attr_s(i, "kind") == Some("quota"))
        .expect("counters");
    assert_eq!(
        (attr_n(counters, "available"), attr_n(counters, "invalid")),
        (Some(0), Some(3))
    );
    assert_plans_consistent(&app).await;
    assert_ledger_agrees_with_counters(&app).await;
    // Enabling again needs a new grant.
    let again = put(&app, &token, &json!({"enabled": true})).await;
    assert_eq!(again["pause_reason"], "needs_grant");
}

#[tokio::test]
async fn a_reject_or_ban_pauses_the_plan_and_the_check_in_still_succeeds() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    grant(&app, &token, "wr_0").await;
    assert_eq!(
        put(&app, &token, &json!({"enabled": true})).await["state"],
        "scheduled"
    );
    let answer = app
        .post(
            CHECKINS,
            Some(&token),
            &checkin("wc_1", 1, Some(("wr_1", "reject"))),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        (
            answer.body["state"].as_str(),
            answer.body["pause_reason"].as_str()
        ),
        (Some("paused"), Some("rejected"))
    );
    // A grant resumes it; a ban in a grant report pauses it again.
    grant(&app, &token, "wr_2").await;
    assert_eq!(app.get(PLAN, Some(&token)).await.body["state"], "scheduled");
    let banned = app
        .post(
            "/v1/grants",
            Some(&token),
            &json!({"request_id": "wr_3", "results": {WATER: "ban"}}),
        )
        .await;
    assert_eq!(banned.status, 200);
    let plan = app.get(PLAN, Some(&token)).await.body;
    assert_eq!(
        (plan["state"].as_str(), plan["pause_reason"].as_str()),
        (Some("paused"), Some("banned"))
    );
    assert_plans_consistent(&app).await;
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_check_in_from_the_distant_past_is_recorded_but_never_schedules_into_the_past() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    grant(&app, &token, "wr_0").await;
    put(&app, &token, &json!({"enabled": true})).await;
    let mut old = checkin("wc_old", 1, None);
    old["occurred_at"] = json!((app.now() - Duration::days(20)).to_rfc3339());
    let answer = app.post(CHECKINS, Some(&token), &old).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(due(&answer.body) > app.now());
    assert_eq!(
        answer.body["today"]["count"], 0,
        "an old day's count is not today's"
    );
}

#[tokio::test]
async fn a_check_in_costs_one_read_and_one_transaction() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    put(&app, &token, &json!({"enabled": true})).await;
    let body = checkin("wc_rt", 1, Some(("wr_rt", "accept")));
    app.round_trips.take();
    assert_eq!(app.post(CHECKINS, Some(&token), &body).await.status, 200);
    assert_eq!(
        app.round_trips.take(),
        // The caller admitted (no erasure), then the check-in's own read and write.
        vec!["GetItem", "BatchGetItem", "TransactWriteItems"]
    );
    assert_eq!(app.post(CHECKINS, Some(&token), &body).await.status, 200);
    assert_eq!(
        app.round_trips.take(),
        vec!["GetItem", "BatchGetItem"],
        "a replay is one read past the admission"
    );
    assert_eq!(app.get(PLAN, Some(&token)).await.status, 200);
    // The caller admitted, the read counted (READS_PER_MINUTE), then one batch.
    assert_eq!(
        app.round_trips.take(),
        vec!["GetItem", "UpdateItem", "BatchGetItem"]
    );
}

#[tokio::test]
async fn a_user_who_turns_a_reminder_off_before_any_grant_still_reads_their_quotas() {
    // A disable stamps the template's counters item (so a late answer never gives back
    // a grant voided on purpose); for a user who never reported the template that item
    // is created by the stamp, and must read as any other quota.
    let app = spawn_app().await;
    let user = app.user("never-granted").await;
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(grants.status, 200, "{}", grants.body);
    assert_eq!(
        quota(&grants.body, WATER)["available"],
        0,
        "{}",
        grants.body
    );
    grant(&app, &user.token, "wr_after_off").await;
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(
        quota(&grants.body, WATER)["available"],
        1,
        "{}",
        grants.body
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// An app behind the fault proxy and a user whose water plan holds 150 grants (more
/// than one transaction voids). Its write budget is the suite's, not the deployed 4 s:
/// a transaction of 96 grants costs the emulator about a second of CPU on a loaded
/// machine, past the proxy's 1-second attempt timeout, so the turn-off's resends (each
/// answered by its token) can outlast 4 s there. These tests are about what the retry
/// decides, not about the budget (limits.rs tests that).
async fn with_many_grants() -> (TestApp, onegrant_tests::faults::FaultProxy, User) {
    let (app, proxy) = spawn_faulty_app(&[
        ("REPORTS_PER_MINUTE", "600"),
        ("MAX_OPEN_GRANTS", "200"),
        ("WRITE_BUDGET_MS", "20000"),
        ("HANDLER_BUDGET_MS", "30000"),
    ])
    .await;
    let user = app.scheduled_user("many", 150).await;
    (app, proxy, user)
}

/// The version of `user`'s water plan as stored.
async fn plan_version(app: &TestApp, user: &User) -> i64 {
    app.item(user, "PLAN#water")
        .await
        .as_ref()
        .and_then(|p| attr_n(p, "version"))
        .expect("plan version")
}

/// A turn-off voids its grants 96 to a transaction, the plan and the minute's count in
/// the first. One of 150 grants whose second transaction meets a conflict is retried:
/// the retry finds the plan already off and voids the rest without writing or counting
/// it again.
#[tokio::test]
async fn a_turn_off_of_many_grants_refused_midway_is_counted_and_written_once() {
    let (app, proxy, user) = with_many_grants().await;
    let before = plan_version(&app, &user).await;
    app.freeze_at_a_minute_start();
    let at = app.now().timestamp().div_euclid(60);
    let changes = |rate: Option<std::collections::HashMap<_, _>>| {
        rate.as_ref()
            .and_then(|r| attr_n(r, "changes"))
            .unwrap_or(0)
    };
    let counted = changes(app.item(&user, &format!("RATE#{at}")).await);
    // The second transaction that voids grants is refused (a conflict), once.
    proxy.inject_every("TransactWriteItems", Some("GRANT#"), Fault::Conflict, 1, 2);
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);
    assert_eq!(
        proxy
            .injected()
            .iter()
            .filter(|(_, f)| *f == Fault::Conflict)
            .count(),
        1,
        "the conflict met the turn-off"
    );
    assert_eq!(
        plan_version(&app, &user).await,
        before + 1,
        "the plan was written once"
    );
    if app.now().timestamp().div_euclid(60) == at {
        let rate = changes(app.item(&user, &format!("RATE#{at}")).await);
        assert_eq!(rate, counted + 1, "the turn-off counted once");
    }
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(grants.len(), 150);
    let open: Vec<_> = grants
        .iter()
        .filter(|g| attr_s(g, "state") != Some("invalid"))
        .collect();
    assert!(open.is_empty(), "{} grants left open", open.len());
    assert_ledger_agrees_with_counters(&app).await;
}

/// A turn-off stopped midway (its second transaction refused by a conflict) and an
/// enable sent once the turn-off's first transaction landed, landing while the
/// turn-off's retry reads again: the enable, the later save, stands. The retry neither
/// turns the plan off a second time nor voids grants under the plan turned on: the plan
/// is written twice (the turn-off's, the enable's), never a third time. (Before, the
/// retry decided the turn-off again on the plan found on, and undid the enable.)
#[tokio::test]
async fn an_enable_landing_while_a_turn_off_is_retried_stands() {
    let (app, proxy, user) = with_many_grants().await;
    let before = plan_version(&app, &user).await;
    // The second transaction voiding grants is refused, once; the retry's read (the
    // quota item's fourth: the handler's, the decision's, the voids', the retry's) is
    // applied at once and answered late, so the enable lands between it and the write
    // it decides.
    proxy.inject_every("TransactWriteItems", Some("GRANT#"), Fault::Conflict, 1, 2);
    let late = Fault::CommitThenDelay(std::time::Duration::from_millis(1500));
    proxy.inject_every("BatchGetItem", Some("QUOTA#"), late, 1, 4);
    let (off, on) = tokio::join!(app.disable(&user, "water"), async {
        while !proxy.injected().iter().any(|(_, f)| *f == late) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        app.enable(&user, "water").await
    });
    assert_eq!(off.status, 200, "{}", off.body);
    assert_eq!(on.status, 200, "{}", on.body);
    assert_ne!(plan_state(&on.body).0, "disabled", "{}", on.body);
    let (state, _, _) = app.plan_state(&user, "water").await;
    assert_ne!(state, "disabled", "the enable stands");
    assert_eq!(
        plan_version(&app, &user).await,
        before + 2,
        "written by the turn-off and the enable, and not again"
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

/// Turns `user`'s water plan off while `late` (a transaction through the proxy, its
/// body naming `marker`) is held, then applied right after the turn-off's read of the
/// quota item for its open grants has been served: the turn-off's first transaction
/// is refused (its counters moved), and its retry leaves no grant open.
async fn turn_off_while_held(
    app: &TestApp,
    proxy: &onegrant_tests::faults::FaultProxy,
    user: &User,
    late: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
    marker: &str,
) {
    proxy.inject("TransactWriteItems", Some(marker), Fault::HoldThenCommit, 1);
    let through_proxy = onegrant::aws::local_dynamodb_client(&proxy.url);
    let held = tokio::spawn(async move {
        let _ = through_proxy
            .transact_write_items()
            .set_transact_items(Some(late))
            .send()
            .await;
    });
    proxy.until_held().await;
    // The turn-off reads the plan and quota (the handler's read of the current
    // settings), again with the minute's counters (the decision's), then the quota item
    // alone for its open grants: the held write lands as that third read is answered.
    proxy.inject_every("BatchGetItem", Some("QUOTA#"), Fault::ReleaseHeld, 1, 3);
    // (Passed through, to count the transactions that write the plan.)
    proxy.inject(
        "TransactWriteItems",
        Some("PLAN#water"),
        Fault::CommitThenDelay(std::time::Duration::ZERO),
        0,
    );
    let off = app.disable(user, "water").await;
    held.abort();
    assert_eq!(off.status, 200, "{}", off.body);
    // Counted by token: a transaction sent again after an unknown outcome (a slow
    // answer on a loaded machine) is the same transaction.
    let plan_writes = proxy.transactions_with(Fault::CommitThenDelay(std::time::Duration::ZERO));
    assert_eq!(
        plan_writes, 2,
        "the first transaction refused, then the retry's"
    );
    let released = proxy.released();
    assert!(
        released
            .iter()
            .any(|(status, body)| *status == 200 && body.contains(marker)),
        "the held write landed after the turn-off's read: {released:?}"
    );
    let open: Vec<_> = app
        .items_of(user, "grant")
        .await
        .iter()
        .filter(|g| attr_s(g, "state") != Some("invalid"))
        .filter_map(|g| attr_s(g, "sk").map(str::to_string))
        .collect();
    assert!(
        open.is_empty(),
        "left open beside the plan turned off: {open:?}"
    );
    assert_ledger_agrees_with_counters(app).await;
}

/// An update of `user`'s water quota item: `expression` with its values.
fn quota_update(
    app: &TestApp,
    user: &User,
    expression: &str,
    values: &[(&str, aws_sdk_dynamodb::types::AttributeValue)],
) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
    let mut update = Update::builder()
        .table_name(&app.table.name)
        .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
        .key("sk", AttributeValue::S(format!("QUOTA#{WATER}")))
        .update_expression(expression);
    for (name, value) in values {
        update = update.expression_attribute_values(*name, value.clone());
    }
    TransactWriteItem::builder()
        .update(update.build().expect("update"))
        .build()
}

/// A grant that lands after a turn-off has read the open grants and before its first
/// transaction is ordered before the turn-off: that transaction is conditional on the
/// counters as read, so it is refused and the retry voids the late grant too.
#[tokio::test]
async fn a_grant_landing_between_a_turn_offs_read_and_its_write_is_voided_with_the_rest() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    let (app, proxy) = spawn_faulty_app(&[]).await;
    let user = app.scheduled_user("late", 2).await;
    // As a report writes it: the ledger item, the counters and the list.
    let mut late = app
        .item(&user, &format!("GRANT#{WATER}#wr_late_0"))
        .await
        .expect("a grant");
    late.insert(
        "sk".into(),
        AttributeValue::S(format!("GRANT#{WATER}#wr_late_x")),
    );
    late.insert("request_id".into(), AttributeValue::S("wr_late_x".into()));
    let put = Put::builder()
        .table_name(&app.table.name)
        .set_item(Some(late))
        .build()
        .expect("put");
    let one = AttributeValue::N("1".into());
    let id = AttributeValue::Ss(vec!["wr_late_x".into()]);
    let counters = quota_update(
        &app,
        &user,
        "ADD accepted :one, available :one, open_available :id",
        &[(":one", one), (":id", id)],
    );
    let late = vec![TransactWriteItem::builder().put(put).build(), counters];
    turn_off_while_held(&app, &proxy, &user, late, "wr_late_x").await;
}

/// A grant given back between a turn-off's read and its write (as a late answer
/// restores a grant the sweep voided: `available` up, `accepted` unchanged) is voided
/// by the retry too: the first transaction is conditional on every counter as read.
#[tokio::test]
async fn a_grant_given_back_between_a_turn_offs_read_and_its_write_is_voided_with_the_rest() {
    use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
    let (app, proxy) = spawn_faulty_app(&[]).await;
    let user = app.scheduled_user("back", 2).await;
    let grant_key = |state: &str| {
        Update::builder()
            .table_name(&app.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(format!("GRANT#{WATER}#wr_back_1")))
            .update_expression("SET #s = :s")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":s", AttributeValue::S(state.into()))
            .build()
            .expect("update")
    };
    let (one, minus) = (
        AttributeValue::N("1".into()),
        AttributeValue::N("-1".into()),
    );
    let id = AttributeValue::Ss(vec!["wr_back_1".into()]);
    // Voided first (directly, not through the proxy), as the sweep voids a grant.
    app.table
        .client
        .transact_write_items()
        .transact_items(
            TransactWriteItem::builder()
                .update(grant_key("invalid"))
                .build(),
        )
        .transact_items(quota_update(
            &app,
            &user,
            "ADD available :minus, invalid :one DELETE open_available :id",
            &[
                (":one", one.clone()),
                (":minus", minus.clone()),
                (":id", id.clone()),
            ],
        ))
        .send()
        .await
        .expect("voided");
    // Given back while the turn-off runs.
    let back = vec![
        TransactWriteItem::builder()
            .update(grant_key("available"))
            .build(),
        quota_update(
            &app,
            &user,
            "ADD available :one, invalid :minus, open_available :id",
            &[(":one", one), (":minus", minus), (":id", id)],
        ),
    ];
    turn_off_while_held(&app, &proxy, &user, back, "wr_back_1").await;
}
