//! The dispatcher: at most once, on time, one grant per send, finalize always.

use std::collections::HashMap;

use chrono::{Duration, Utc};
use futures::StreamExt;
use futures::future::join_all;
use onegrant_tests::{
    ORDER, TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_no_plan_stuck_sending,
    assert_plans_consistent, attr_n, attr_s, spawn_app_isolated, spawn_app_with,
};
use serde_json::{Value, json};

const FAST: [(&str, &str); 3] = [
    ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
    // Generous for a loopback stand-in under a loaded CI machine; the timeout row hangs
    // well past it.
    ("WECHAT_TIMEOUT_MS", "1500"),
    ("WECHAT_CONNECT_TIMEOUT_MS", "300"),
];

/// A user with `grants` accepted water grants (held at the stand-in too) and the water
/// plan enabled, due now.
async fn due_user(app: &TestApp, name: &str, grants: u32) -> User {
    let user = app.scheduled_user(name, grants).await;
    app.make_due(&user, "water", Utc::now()).await;
    user
}

/// `n` users named `prefix0`… each due now with one grant, set up 8 at a time.
async fn due_users(app: &TestApp, prefix: &str, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(8, |name| async move {
            due_user(app, name, 1).await;
        })
        .await;
}

fn state(item: &Option<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>) -> Option<&str> {
    item.as_ref().and_then(|i| attr_s(i, "state"))
}

#[tokio::test]
async fn a_due_reminder_is_sent_once_with_its_content_and_the_plan_awaits_the_check_in() {
    let app = spawn_app_with(&FAST).await;
    let user = due_user(&app, "alice", 1).await;
    let summary = app.tick(30).await;
    assert_eq!((summary.claimed, summary.sent), (1, 1), "{summary:?}");
    let deliveries = app.deliveries().await;
    assert_eq!(deliveries.len(), 1);
    let d = &deliveries[0];
    assert_eq!(d["openid"], user.openid.as_str());
    assert_eq!(d["template_id"], WATER);
    assert_eq!(d["page"], "pages/water/index");
    assert_eq!(d["miniprogram_state"], "developer");
    assert!(
        d["data"]["thing1"]["value"]
            .as_str()
            .is_some_and(|v| v.contains("8")),
        "{d}"
    );
    assert!(
        d["data"]["time2"]["value"]
            .as_str()
            .is_some_and(|v| v.contains('年')),
        "{d}"
    );

    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(state(&plan), Some("awaiting_checkin"));
    let stored = app.items_of(&user, "delivery").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(attr_s(&stored[0], "state"), Some("sent"));
    let msgid = attr_s(&stored[0], "msgid").expect("msgid stored");
    assert_eq!(
        Some(msgid.parse::<u64>().expect("a u64")),
        d["msgid"].as_u64(),
        "msgid kept exactly, as a string"
    );
    assert!(!stored[0].contains_key("lease_pk"), "off the lease index");
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(attr_s(&grants[0], "state"), Some("consumed"));

    // Nothing is sent twice: the next ticks find nothing due.
    assert_eq!(app.tick(30).await.claimed, 0);
    assert_eq!(app.deliveries().await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;

    // The loop comes back round: a check-in with the next grant schedules again.
    let answer = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "wc_1", "grant_request_id": "wr_next", "subscription_status": "accept",
                    "occurred_at": Utc::now().to_rfc3339(), "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(answer.body["state"], "scheduled", "{}", answer.body);
}

struct Row {
    name: &'static str,
    fault: Value,
    delivery: &'static str,
    grant: &'static str,
    plan: &'static str,
    pause_reason: Option<&'static str>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_row_of_the_outcome_table_lands_in_its_states() {
    let app = spawn_app_with(&FAST).await;
    let row = |name, fault: Value, delivery, grant, plan, pause_reason| Row {
        name,
        fault,
        delivery,
        grant,
        plan,
        pause_reason,
    };
    let rows = vec![
        row(
            "errcode 0",
            json!(null),
            "sent",
            "consumed",
            "awaiting_checkin",
            None,
        ),
        row(
            "40001 then ok",
            json!({"errcode": 40001}),
            "sent",
            "consumed",
            "awaiting_checkin",
            None,
        ),
        row(
            "-1",
            json!({"errcode": -1}),
            "failed",
            "available",
            "scheduled",
            None,
        ),
        row(
            "45011",
            json!({"errcode": 45011}),
            "failed",
            "available",
            "scheduled",
            None,
        ),
        // Another container's send to the same user: retried within the send's
        // window, so a passing 43108 still sends…
        row(
            "43108 once",
            json!({"errcode": 43108}),
            "sent",
            "consumed",
            "awaiting_checkin",
            None,
        ),
        // …and one that persists fails without spending an attempt.
        row(
            "43108 persisting",
            json!({"errcode": 43108, "times": 0}),
            "failed",
            "available",
            "scheduled",
            None,
        ),
        row(
            "45009",
            json!({"errcode": 45009}),
            "failed",
            "available",
            "scheduled",
            None,
        ),
        row(
            "47003",
            json!({"errcode": 47003}),
            "failed",
            "available",
            "paused",
            Some("config_error"),
        ),
        row(
            "40037",
            json!({"errcode": 40037}),
            "failed",
            "available",
            "paused",
            Some("config_error"),
        ),
        row(
            "41030",
            json!({"errcode": 41030}),
            "failed",
            "available",
            "paused",
            Some("config_error"),
        ),
        row(
            "45168",
            json!({"errcode": 45168}),
            "failed",
            "available",
            "paused",
            Some("config_error"),
        ),
        row(
            "43107",
            json!({"errcode": 43107}),
            "failed",
            "available",
            "paused",
            Some("config_error"),
        ),
        row(
            "48001",
            json!({"errcode": 48001}),
            "failed",
            "available",
            "paused",
            Some("config_error"),
        ),
        row(
            "43101",
            json!({"errcode": 43101}),
            "failed",
            "invalid",
            "paused",
            Some("refused"),
        ),
        row(
            "40003",
            json!({"errcode": 40003}),
            "failed",
            "invalid",
            "paused",
            Some("send_failed"),
        ),
        row(
            "50002",
            json!({"errcode": 50002}),
            "failed",
            "invalid",
            "paused",
            Some("send_failed"),
        ),
        row(
            "timeout",
            json!({"hang_ms": 4000}),
            "unknown",
            "invalid",
            "paused",
            Some("uncertain"),
        ),
        row(
            "reset after delivery",
            json!({"drop_after_delivery": true}),
            "unknown",
            "invalid",
            "paused",
            Some("uncertain"),
        ),
        row(
            "HTTP 502",
            json!({"http_status": 502}),
            "unknown",
            "invalid",
            "paused",
            Some("uncertain"),
        ),
        row(
            "unparseable",
            json!({"garbage": true}),
            "unknown",
            "invalid",
            "paused",
            Some("uncertain"),
        ),
        row(
            "200 without errcode",
            json!({"no_errcode": true}),
            "unknown",
            "invalid",
            "paused",
            Some("uncertain"),
        ),
    ];
    let mut users = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        // Two grants each: 43101 must invalidate the other one too.
        let user = due_user(&app, &format!("u{i}"), 2).await;
        if !r.fault.is_null() {
            let mut fault = r.fault.clone();
            fault["openid"] = json!(user.openid);
            app.control("POST", "faults", Some(fault)).await;
        }
        users.push(user);
    }
    let summary = app.tick(30).await;
    assert_eq!(summary.claimed as usize, rows.len(), "{summary:?}");
    for (r, user) in rows.iter().zip(&users) {
        let deliveries = app.items_of(user, "delivery").await;
        assert_eq!(deliveries.len(), 1, "{}: one delivery", r.name);
        assert_eq!(
            attr_s(&deliveries[0], "state"),
            Some(r.delivery),
            "{}: delivery",
            r.name
        );
        let grant_sk = attr_s(&deliveries[0], "grant_sk").expect("grant_sk");
        let grant = app.item(user, grant_sk).await;
        assert_eq!(
            state(&grant),
            Some(r.grant),
            "{}: the reserved grant",
            r.name
        );
        let plan = app.item(user, "PLAN#water").await;
        assert_eq!(state(&plan), Some(r.plan), "{}: plan", r.name);
        assert_eq!(
            plan.as_ref().and_then(|p| attr_s(p, "pause_reason")),
            r.pause_reason,
            "{}: pause reason",
            r.name
        );
        let other = app
            .items_of(user, "grant")
            .await
            .into_iter()
            .find(|g| attr_s(g, "sk") != Some(grant_sk))
            .expect("the second grant");
        let expected_other = if r.name == "43101" {
            "invalid"
        } else {
            "available"
        };
        assert_eq!(
            attr_s(&other, "state"),
            Some(expected_other),
            "{}: the other grant",
            r.name
        );
        if r.plan == "scheduled" {
            let due = plan
                .as_ref()
                .and_then(|p| attr_n(p, "next_due_at"))
                .expect("due");
            assert!(
                due > Utc::now().timestamp_millis(),
                "{}: retried later",
                r.name
            );
            let spent = if r.name.starts_with("43108") { 0 } else { 1 };
            assert_eq!(
                plan.as_ref()
                    .and_then(|p| attr_n(p, "attempts"))
                    .unwrap_or(0),
                spent,
                "{}: attempts",
                r.name
            );
        }
    }
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(counters["force_refresh_calls"], 0, "never force_refresh");
}

#[tokio::test]
async fn a_retryable_failure_pauses_the_plan_after_the_attempt_limit() {
    let app = spawn_app_with(&[("DISPATCH_MAX_ATTEMPTS", "2"), FAST[0], FAST[1], FAST[2]]).await;
    let user = due_user(&app, "alice", 1).await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": -1, "times": 0})),
    )
    .await;
    app.tick(30).await;
    assert_eq!(
        state(&app.item(&user, "PLAN#water").await),
        Some("scheduled")
    );
    app.make_due(&user, "water", Utc::now()).await;
    app.tick(30).await;
    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(
        (
            state(&plan),
            plan.as_ref().and_then(|p| attr_s(p, "pause_reason"))
        ),
        (Some("paused"), Some("send_failed"))
    );
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(
        attr_s(&grants[0], "state"),
        Some("available"),
        "the grant is restored for later"
    );
    assert_ledger_agrees_with_counters(&app).await;
    // The user checks in: the plan resumes with a fresh count, so one more failure
    // retries it instead of pausing it again at once.
    let checkin = json!({"action_id": "ck_resume", "occurred_at": Utc::now().to_rfc3339(),
                         "current_count": 1, "daily_goal": 8});
    let resumed = app
        .post("/v1/reminders/water/checkins", Some(&user.token), &checkin)
        .await;
    assert_eq!(resumed.body["state"], "scheduled", "{}", resumed.body);
    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(plan.as_ref().and_then(|p| attr_n(p, "attempts")), Some(0));
    app.make_due(&user, "water", Utc::now()).await;
    app.tick(30).await;
    assert_eq!(
        state(&app.item(&user, "PLAN#water").await),
        Some("scheduled"),
        "retried, not paused"
    );
}

#[tokio::test]
async fn an_access_token_expired_mid_run_is_refetched_once_and_the_send_retried_once() {
    let app = spawn_app_with(&FAST).await;
    due_user(&app, "alice", 1).await;
    assert_eq!(
        app.tick(30).await.sent,
        1,
        "the first send fetches and caches a token"
    );
    app.control("POST", "tokens/expire", None).await;
    due_user(&app, "bob", 1).await;
    let summary = app.tick(30).await;
    assert_eq!(summary.sent, 1, "{summary:?}");
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(
        counters["stable_token_calls"], 2,
        "one fetch, one refetch: {counters}"
    );
    assert_eq!(counters["force_refresh_calls"], 0);
    assert_eq!(counters["send_errcodes"]["42001"], 1, "one refused send");
    assert_eq!(counters["send_errcodes"]["0"], 2);
    assert_eq!(counters["token_calls"], 0, "never the plain token endpoint");
}

#[tokio::test]
async fn a_plan_without_a_grant_is_paused_instead_of_sent() {
    let app = spawn_app_with(&FAST).await;
    let user = due_user(&app, "alice", 1).await;
    // The grant vanished under the schedule (e.g. spent by another template's push).
    app.quota_update(&user, WATER)
        .update_expression("SET available = :z, invalid = :one")
        .expression_attribute_values(":z", aws_sdk_dynamodb::types::AttributeValue::N("0".into()))
        .expression_attribute_values(
            ":one",
            aws_sdk_dynamodb::types::AttributeValue::N("1".into()),
        )
        .send()
        .await
        .expect("counters");
    let summary = app.tick(30).await;
    assert_eq!((summary.no_grant, summary.claimed), (1, 0));
    assert!(app.deliveries().await.is_empty());
    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(
        plan.as_ref().and_then(|p| attr_s(p, "pause_reason")),
        Some("needs_grant")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_racing_dispatchers_send_each_due_plan_exactly_once_over_rounds() {
    const PLANS: usize = 200;
    const ROUNDS: usize = 3;
    let app = spawn_app_isolated(&[
        FAST[0],
        ("WECHAT_TIMEOUT_MS", "5000"),
        FAST[2],
        ("DUE_SHARDS", "4"),
    ])
    .await;
    let names: Vec<String> = (0..PLANS).map(|i| format!("r{i}")).collect();
    let users: Vec<User> = join_all(names.iter().map(|name| due_user(&app, name, 1))).await;
    for round in 0..ROUNDS {
        if round > 0 {
            // Each user checks in with the next grant; the plan is due again.
            join_all(users.iter().enumerate().map(|(i, user)| {
                let app = &app;
                async move {
                    let request_id = format!("wr_r{i}_round{round}");
                    app.control("POST", "quota", Some(json!({"openid": user.openid, "template_id": WATER, "count": 1})))
                        .await;
                    let answer = app
                        .post(
                            "/v1/reminders/water/checkins",
                            Some(&user.token),
                            &json!({"action_id": format!("wc_{round}"), "grant_request_id": request_id,
                                    "subscription_status": "accept", "occurred_at": Utc::now().to_rfc3339(),
                                    "current_count": round, "daily_goal": 8}),
                        )
                        .await;
                    assert_eq!(answer.body["state"], "scheduled", "{}", answer.body);
                    app.make_due(user, "water", Utc::now() + Duration::milliseconds((i % 20) as i64 * 100)).await;
                }
            }))
            .await;
        }
        let started = std::time::Instant::now();
        app.round_trips.take();
        let summaries = join_all((0..8).map(|_| app.tick(120))).await;
        let mut ops: std::collections::BTreeMap<String, usize> = Default::default();
        for op in app.round_trips.take() {
            *ops.entry(op).or_default() += 1;
        }
        eprintln!(
            "round {round}: 8 dispatchers took {:?}, DynamoDB requests {ops:?}",
            started.elapsed()
        );
        let mut summaries = summaries;
        catch_up(&app, &mut summaries, PLANS, 120).await;
        let claimed: u32 = summaries.iter().map(|s| s.claimed).sum();
        let released: u32 = summaries.iter().map(|s| s.released).sum();
        let sent: u32 = summaries.iter().map(|s| s.sent).sum();
        eprintln!("round {round}: {released} claims given back unsent and sent by a later tick");
        assert_eq!(
            ((claimed - released) as usize, sent as usize),
            (PLANS, PLANS),
            "round {round}: {summaries:?}"
        );
        let deliveries = app.deliveries().await;
        let mut per_user: HashMap<String, usize> = HashMap::new();
        for d in &deliveries {
            *per_user
                .entry(d["openid"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
        assert_eq!(
            per_user.len(),
            PLANS,
            "round {round}: every due plan delivered"
        );
        assert!(
            per_user.values().all(|n| *n == round + 1),
            "round {round}: exactly once each"
        );
        let counters = app.control("GET", "counters", None).await;
        assert_eq!(
            counters["send_errcodes"].get("43101"),
            None,
            "never a send without real quota"
        );
        assert_eq!(
            counters["stable_token_calls"], 1,
            "one token for every concurrent send: the refresh is single-flight and cached"
        );
        assert_ledger_agrees_with_counters(&app).await;
        assert_plans_consistent(&app).await;
    }
}

#[tokio::test]
async fn a_tick_without_time_for_a_send_and_a_finalize_claims_nothing() {
    let app = spawn_app_with(&FAST).await;
    let user = due_user(&app, "alice", 1).await;
    // 1 s of budget cannot cover the WeChat timeouts plus a finalize: the tick does
    // not even read the due index.
    let summary = app.tick(1).await;
    assert_eq!((summary.due, summary.claimed), (0, 0), "{summary:?}");
    assert_eq!(
        state(&app.item(&user, "PLAN#water").await),
        Some("scheduled"),
        "left for the next tick"
    );
    assert_plans_consistent(&app).await;
    assert_eq!(app.tick(30).await.sent, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_check_in_while_the_reminder_is_in_flight_never_leaves_the_plan_sending() {
    let app = spawn_app_with(&[FAST[0], ("WECHAT_TIMEOUT_MS", "10000"), FAST[2]]).await;
    let user = due_user(&app, "alice", 1).await;
    // WeChat takes 3 s to answer; the user checks in (with the next grant) meanwhile.
    app.control("POST", "latency", Some(json!({"ms": 3000})))
        .await;
    let tick = app.tick(120);
    let check_in = async {
        // Wait until the send is really in flight.
        for _ in 0..250 {
            let plan = app.item(&user, "PLAN#water").await;
            if state(&plan) == Some("sending") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        app.control(
            "POST",
            "quota",
            Some(json!({"openid": user.openid, "template_id": WATER, "count": 1})),
        )
        .await;
        app.post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "wc_mid", "grant_request_id": "wr_mid", "subscription_status": "accept",
                    "occurred_at": Utc::now().to_rfc3339(), "current_count": 2, "daily_goal": 8}),
        )
        .await
    };
    let (summary, answer) = tokio::join!(tick, check_in);
    assert_eq!(summary.sent, 1, "{summary:?}");
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.body["state"], "sending",
        "the check-in saw the send in flight"
    );
    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(
        state(&plan),
        Some("scheduled"),
        "the grant it brought schedules the next reminder"
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_that_cannot_be_fetched_claims_nothing_and_the_tick_ends_within_its_budget() {
    const PLANS: usize = 40;
    let app = spawn_app_with(&FAST).await;
    let names: Vec<String> = (0..PLANS).map(|i| format!("t{i}")).collect();
    let users: Vec<User> = join_all(names.iter().map(|name| due_user(&app, name, 1))).await;
    // stable_token hangs far past the client's timeout.
    app.control("POST", "token-fault", Some(json!({"hang_ms": 60_000})))
        .await;
    let budget = std::time::Duration::from_secs(40);
    let started = std::time::Instant::now();
    let summary = app.tick(budget.as_secs()).await;
    let took = started.elapsed();
    assert!(
        took < budget,
        "the tick returned within its budget ({took:?})"
    );
    assert_eq!(
        (summary.claimed, summary.unknown, summary.no_token),
        (0, 0, PLANS as u32),
        "{summary:?}"
    );
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(
        counters["stable_token_calls"], 1,
        "the failure is remembered: the 39 others do not wait out the timeout again"
    );
    assert_eq!(counters["send_calls"], 0);
    for user in &users {
        let grants = app.items_of(user, "grant").await;
        assert_eq!(
            attr_s(&grants[0], "state"),
            Some("available"),
            "never reserved"
        );
        assert_eq!(
            state(&app.item(user, "PLAN#water").await),
            Some("scheduled")
        );
    }
    assert!(
        app.items()
            .await
            .iter()
            .all(|i| attr_s(i, "kind") != Some("delivery"))
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;

    // WeChat recovers: the next tick (past the failure's memory) sends every one.
    app.control("POST", "token-fault", Some(json!({}))).await;
    tokio::time::sleep(onegrant::wechat::TOKEN_FAILURE_MEMORY).await;
    let summary = app.tick(60).await;
    assert_eq!(summary.sent as usize, PLANS, "{summary:?}");
    assert_ledger_agrees_with_counters(&app).await;
}

/// Writes a raw item (a corrupt one, as a bug or a manual edit could leave).
async fn put_raw(app: &TestApp, item: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>) {
    app.table
        .client
        .put_item()
        .table_name(&app.table.name)
        .set_item(Some(
            item.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ))
        .send()
        .await
        .expect("raw put");
}

/// A delivery `sk` left `sending` with a lease that ended at `lease_until` (epoch ms),
/// missing every other field: unreadable.
async fn put_corrupt_stale_delivery(app: &TestApp, sk: &str, lease_until: &str) {
    use aws_sdk_dynamodb::types::AttributeValue::{N, S};
    put_raw(
        app,
        vec![
            ("pk", S("USER#oGhost".into())),
            ("sk", S(sk.into())),
            ("kind", S("delivery".into())),
            ("state", S("sending".into())),
            ("lease_pk", S("LEASE#0".into())),
            ("lease_until", N(lease_until.into())),
        ],
    )
    .await;
}

#[tokio::test]
async fn one_corrupt_due_entry_or_stale_delivery_is_skipped_and_counted_and_the_rest_is_sent() {
    use aws_sdk_dynamodb::types::AttributeValue::{N, S};
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2], ("DUE_SHARDS", "1")]).await;
    let names: Vec<String> = (0..3).map(|i| format!("c{i}")).collect();
    let users: Vec<User> = join_all(names.iter().map(|name| due_user(&app, name, 1))).await;
    let past = (Utc::now() - Duration::minutes(5))
        .timestamp_millis()
        .to_string();
    // A due entry outside any user partition, and a plan that cannot be read.
    put_raw(
        &app,
        vec![
            ("pk", S("JUNK".into())),
            ("sk", S("PLAN#water".into())),
            ("due_pk", S("DUE#0".into())),
            ("due_at", N(past.clone())),
        ],
    )
    .await;
    put_raw(
        &app,
        vec![
            ("pk", S("USER#oGhost".into())),
            ("sk", S("PLAN#water".into())),
            ("kind", S("plan".into())),
            ("state", S("scheduled".into())),
            ("due_pk", S("DUE#0".into())),
            ("due_at", N(past.clone())),
        ],
    )
    .await;
    // A stale delivery that cannot be read.
    put_corrupt_stale_delivery(&app, "DELIVERY#bad", &past).await;
    let summary = app.tick(30).await;
    assert_eq!(
        summary.sent, 3,
        "every readable due item is sent: {summary:?}"
    );
    assert_eq!(
        summary.skipped, 3,
        "three bad items, each counted: {summary:?}"
    );
    for user in &users {
        assert_eq!(
            state(&app.item(user, "PLAN#water").await),
            Some("awaiting_checkin")
        );
    }
    // Each bad item was taken off its index (kept for an operator): the next tick
    // does not trip over them again.
    let quarantined = app
        .items()
        .await
        .into_iter()
        .filter(|i| i.contains_key("quarantined_at"))
        .count();
    assert_eq!(quarantined, 3);
    // And the audit trail says where each stopped.
    let recorded = app
        .items()
        .await
        .into_iter()
        .filter(|i| attr_s(i, "kind") == Some("history"))
        .filter(|i| format!("{:?}", i.get("changes")).contains("quarantined"))
        .count();
    assert_eq!(recorded, 3, "one history entry per quarantined item");
    let again = app.tick(30).await;
    assert_eq!((again.due, again.skipped), (0, 0), "{again:?}");
}

#[tokio::test]
async fn a_sweep_does_a_bounded_amount_of_work_per_tick() {
    let app = spawn_app_with(&[("DUE_SHARDS", "1")]).await;
    let past = (Utc::now() - Duration::minutes(5))
        .timestamp_millis()
        .to_string();
    let backlog = onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize + 15;
    for i in 0..backlog {
        put_corrupt_stale_delivery(&app, &format!("DELIVERY#bad{i}"), &past).await;
    }
    app.round_trips.take();
    let swept = app.sweep_at(Utc::now()).await;
    assert_eq!(
        swept.skipped as usize,
        onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize,
        "one page of the lease index, however long the backlog"
    );
    let ops = app.round_trips.take();
    assert_eq!(
        ops.iter().filter(|o| *o == "Query@index").count(),
        1,
        "{ops:?}"
    );
    assert_eq!(
        ops.iter().filter(|o| *o == "GetItem").count(),
        1 + onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize,
        "the shard registry, then one read per entry"
    );
    // The unreadable ones left the lease index: the next sweep reaches the rest.
    let next = app.sweep_at(Utc::now()).await;
    assert_eq!(
        next.skipped as usize,
        backlog - onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize
    );
}

#[tokio::test]
async fn enabling_a_scheduled_plan_whose_grant_a_push_spent_answers_200_paused_for_a_grant() {
    let app = spawn_app_with(&FAST).await;
    let user = app.scheduled_user("alice", 1).await;
    // A push of the same template spends the only grant while the plan waits.
    let answer = app
        .notify(json!({"idempotency_key": "k1", "openid": user.openid, "type": "water",
                       "title": "喝水", "body": "喝水提醒",
                       "wechat": {"template_id": WATER,
                                  "data": {"thing1": "喝水", "time2": "2026年11月30日 15:00", "number3": "1"}}}))
        .await;
    assert_eq!(answer["push"], "pending", "{answer}");
    let summary = app.tick(30).await;
    assert_eq!(summary.sent, 1, "{summary:?}");
    assert_eq!(
        state(&app.item(&user, "PLAN#water").await),
        Some("scheduled")
    );

    app.round_trips.take();
    let plan = app.enable(&user, "water").await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert_eq!(
        (
            plan.body["state"].as_str(),
            plan.body["pause_reason"].as_str(),
            plan.body["needs_grant"].as_bool()
        ),
        (Some("paused"), Some("needs_grant"), Some(true)),
        "{}",
        plan.body
    );
    let ops = app.round_trips.take();
    assert_eq!(
        ops.iter().filter(|o| *o == "TransactWriteItems").count(),
        1,
        "one write, no retries: {ops:?}"
    );
    assert_plans_consistent(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reject_while_the_reminder_is_in_flight_pauses_the_plan_once_the_send_ends() {
    let app = spawn_app_with(&[FAST[0], ("WECHAT_TIMEOUT_MS", "10000"), FAST[2]]).await;
    let user = due_user(&app, "alice", 1).await;
    app.control("POST", "latency", Some(json!({"ms": 2000})))
        .await;
    let tick = app.tick(120);
    let reject = async {
        for _ in 0..250 {
            if state(&app.item(&user, "PLAN#water").await) == Some("sending") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        app.post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": "rq_no", "results": {WATER: "reject"}}),
        )
        .await
    };
    let (summary, answer) = tokio::join!(tick, reject);
    assert_eq!((summary.sent, answer.status), (1, 200), "{summary:?}");
    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(
        (
            state(&plan),
            plan.as_ref().and_then(|p| attr_s(p, "pause_reason"))
        ),
        (Some("paused"), Some("rejected")),
        "the message went, then the refusal stands"
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disabling_a_plan_while_its_reminder_is_in_flight_never_gives_the_grant_back() {
    // WeChat takes the message in one case and answers -1 (not sent) in the other.
    for fault in [json!(null), json!({"errcode": -1})] {
        let app = spawn_app_with(&[FAST[0], ("WECHAT_TIMEOUT_MS", "10000"), FAST[2]]).await;
        let user = due_user(&app, "alice", 1).await;
        if !fault.is_null() {
            let mut fault = fault.clone();
            fault["openid"] = json!(user.openid);
            app.control("POST", "faults", Some(fault)).await;
        }
        app.control("POST", "latency", Some(json!({"ms": 2000})))
            .await;
        let tick = app.tick(120);
        let disable = async {
            for _ in 0..250 {
                if state(&app.item(&user, "PLAN#water").await) == Some("sending") {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            app.disable(&user, "water").await
        };
        let (summary, off) = tokio::join!(tick, disable);
        assert_eq!(off.status, 200, "{fault}: {}", off.body);
        assert_eq!(off.body["state"], "disabled");
        assert_eq!(summary.claimed, 1, "{fault}: {summary:?}");
        let delivery = app.items_of(&user, "delivery").await.remove(0);
        let expected = if fault.is_null() {
            "consumed"
        } else {
            "invalid"
        };
        assert_eq!(
            app.grant_state_of(&user, &delivery).await.as_deref(),
            Some(expected),
            "{fault}: the send's finalize and the disable both landed"
        );
        assert_eq!(
            state(&app.item(&user, "PLAN#water").await),
            Some("disabled")
        );
        assert_ledger_agrees_with_counters(&app).await;
        assert_plans_consistent(&app).await;
    }
}

#[tokio::test]
async fn a_token_error_that_persists_after_the_one_refetch_fails_the_send_and_restores_the_grant() {
    let app = spawn_app_with(&FAST).await;
    due_user(&app, "warm", 1).await;
    assert_eq!(app.tick(30).await.sent, 1, "a token is fetched and cached");
    let user = due_user(&app, "alice", 1).await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": 40001, "times": 2})),
    )
    .await;
    let summary = app.tick(30).await;
    assert_eq!((summary.failed, summary.restored), (1, 1), "{summary:?}");
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(counters["send_errcodes"]["40001"], 2, "{counters}");
    assert_eq!(
        counters["stable_token_calls"], 2,
        "the first fetch and one refetch: {counters}"
    );
    assert_eq!(counters["force_refresh_calls"], 0);
    let plan = app.item(&user, "PLAN#water").await.expect("plan");
    assert_eq!(attr_s(&plan, "state"), Some("scheduled"));
    assert_eq!(attr_n(&plan, "attempts"), Some(1));
    assert!(attr_n(&plan, "next_due_at").unwrap_or(0) > Utc::now().timestamp_millis());
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(attr_s(&grants[0], "state"), Some("available"));
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_written_under_16_shards_are_sent_and_swept_after_a_change_to_4_and_to_32() {
    for to in [4u32, 32] {
        let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2], ("DUE_SHARDS", "16")]).await;
        // The deployed dispatcher has been ticking under 16 shards.
        app.tick(30).await;
        let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
        join_all(names.iter().map(|name| due_user(&app, name, 1))).await;
        // One of its runs claimed two of them and vanished.
        let now = Utc::now();
        let store = &app.deps.store;
        let old = store.shard_span(now).await.expect("registry");
        let due = store
            .due_items(now + Duration::seconds(5), &old)
            .await
            .expect("due");
        assert_eq!(due.len(), 12);
        for item in due.iter().take(2) {
            app.claim_and_vanish(item, now).await;
        }

        // Redeployed with another shard count: same table, same WeChat.
        let mut config = (*app.deps.config).clone();
        config.due_shards = to;
        let deps = onegrant_local::stack::deps(config, app.table.client.clone()).expect("deps");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let summary = dispatcher::tick(&deps, deadline).await.expect("tick");
        assert_eq!(
            summary.sent, 10,
            "{to}: every item written under 16 shards is found: {summary:?}"
        );
        let span = deps.store.shard_span(Utc::now()).await.expect("registry");
        assert_eq!(span.span, 16.max(to), "{to}: {span:?}");
        let swept = deps
            .store
            .sweep(
                &deps.config.templates,
                &deps.config.reminders,
                &deps.config.dispatch.retry_policy(),
                0..span.span,
                Utc::now() + Duration::seconds(300),
            )
            .await;
        assert_eq!(
            swept.recovered, 2,
            "{to}: the old shards' leases are swept: {swept:?}"
        );
        // Once the old partitions are empty (and the change has settled), the
        // extra queries stop.
        let later =
            Utc::now() + onegrant::store::dispatch::shards::DRAIN_GRACE + Duration::minutes(1);
        let drained = deps.store.drain_shards(&span, later).await.expect("drain");
        assert_eq!(drained, to < 16, "{to}");
        let after = deps.store.shard_span(later).await.expect("registry");
        assert_eq!(after.span, to, "{to}: {after:?}");
        assert_eq!(app.deliveries().await.len(), 10);
        assert_ledger_agrees_with_counters(&app).await;
    }
}

#[tokio::test]
async fn the_shard_registry_assumes_the_default_when_new_and_everything_when_unreadable() {
    use aws_sdk_dynamodb::types::AttributeValue::S;
    let app = spawn_app_with(&[("DUE_SHARDS", "4")]).await;
    let store = &app.deps.store;
    let now = Utc::now();
    // An upgrade that also lowered the count: the default's partitions stay covered.
    let first = store.shard_span(now).await.expect("registry");
    assert_eq!((first.span, first.current), (16, 4));
    // A registry item no one can read is rewritten to cover every partition.
    put_raw(
        &app,
        vec![
            ("pk", S("META".into())),
            ("sk", S("SHARDS".into())),
            ("max_shards", S("many".into())),
        ],
    )
    .await;
    assert_eq!(store.known_shards().await.expect("read"), 256);
    let widest = store.shard_span(now).await.expect("registry");
    assert_eq!(widest.span, 256);
    // A dispatcher still on another count registering between a tick's read and its
    // drain stops that drain; the next tick's drain, after the grace, goes through.
    let mut config = (*app.deps.config).clone();
    config.due_shards = 16;
    let other = onegrant_local::stack::deps(config, app.table.client.clone()).expect("deps");
    other.store.shard_span(now).await.expect("registry");
    let later = now + onegrant::store::dispatch::shards::DRAIN_GRACE + Duration::minutes(1);
    assert!(!store.drain_shards(&widest, later).await.expect("drain"));
    let again = store.shard_span(now).await.expect("registry");
    // However wide the span, a tick keeps a bounded number of queries in flight (all
    // 512 at once was a burst past what one container or the emulator should take),
    // yet still more than one.
    let bound = onegrant::store::INDEX_QUERIES_IN_FLIGHT as u64;
    app.round_trips.take();
    app.round_trips.take_most_in_flight();
    let summary = app.tick(30).await;
    let queries = app.round_trips.take();
    let most = app.round_trips.take_most_in_flight();
    assert_eq!(
        queries.iter().filter(|op| *op == "Query@index").count(),
        2 * 256,
        "{summary:?}"
    );
    assert!(most > 1 && most <= bound, "{most} in flight");
    // A drain stops at the first partition still holding something (a plan due in a
    // year on the first partition it checks), short of all 504 checks.
    let far = (now + Duration::days(365)).timestamp_millis().to_string();
    put_raw(
        &app,
        vec![
            ("pk", S("USER#far".into())),
            ("sk", S("PLAN#far".into())),
            ("due_pk", S(onegrant::store::keys::due_shard_pk(4))),
            ("due_at", aws_sdk_dynamodb::types::AttributeValue::N(far)),
        ],
    )
    .await;
    assert!(!store.drain_shards(&again, later).await.expect("drain"));
    let checks = app.round_trips.take();
    let checked = checks.iter().filter(|op| *op == "Query@index").count();
    // (Not all 504: the checks are answered in no set order, so how many start before
    // the first partition's answer comes back is not pinned further.)
    assert!(checked < 2 * 252, "{checked} partitions checked");
    app.table
        .client
        .delete_item()
        .table_name(&app.table.name)
        .key("pk", S("USER#far".into()))
        .key("sk", S("PLAN#far".into()))
        .send()
        .await
        .expect("deleted");
    app.round_trips.take_most_in_flight();
    assert!(store.drain_shards(&again, later).await.expect("drain"));
    let most = app.round_trips.take_most_in_flight();
    assert!(most > 1 && most <= bound, "{most} in flight");
    assert_eq!(store.known_shards().await.expect("read"), 4);
}

/// Up to three more ticks (of `seconds` each) until `summaries` have sent `want`: on a
/// loaded machine a dispatcher may give a claim back unsent for want of time (its
/// grant restored, the item due again), and a later tick sends it, still once.
async fn catch_up(
    app: &TestApp,
    summaries: &mut Vec<dispatcher::Summary>,
    want: usize,
    seconds: u64,
) {
    for _ in 0..3 {
        let sent: u32 = summaries.iter().map(|s| s.sent).sum();
        if sent as usize >= want {
            break;
        }
        summaries.push(app.tick(seconds).await);
    }
}

/// The request ids `user`'s counter item of `template` lists as available, and the item.
async fn open_available(
    app: &TestApp,
    user: &User,
    template: &str,
) -> (
    Vec<String>,
    HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
) {
    let quota = app
        .item(user, &format!("QUOTA#{template}"))
        .await
        .expect("quota");
    let listed = quota
        .get("open_available")
        .and_then(|v| v.as_ss().ok())
        .cloned()
        .unwrap_or_default();
    (listed, quota)
}

/// The states of `user`'s grants, in key order.
async fn grant_states(app: &TestApp, user: &User) -> Vec<String> {
    app.items_of(user, "grant")
        .await
        .iter()
        .filter_map(|g| attr_s(g, "state").map(str::to_string))
        .collect()
}

/// A fresh app whose user alice holds grants `wr_0` and `wr_1` of `template`.
async fn alice_with_two_grants(template: &str) -> (TestApp, User) {
    let app = spawn_app_with(&FAST).await;
    let user = app.user("alice").await;
    app.accept(&user, template, "wr_0").await;
    app.accept(&user, template, "wr_1").await;
    (app, user)
}

/// Per operation, how many requests a step sent.
fn tally(ops: Vec<String>) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for op in ops {
        *counts.entry(op).or_default() += 1;
    }
    counts
}

/// `n` past results of `template` in `user`'s ledger, as years of taps leave them
/// (refusals: they carry no grant state, so the counters need not change).
async fn history(app: &TestApp, user: &User, template: &str, n: usize) {
    let ids: Vec<String> = (0..n).map(|i| format!("old_{i}")).collect();
    app.write_ledger(user, template, &ids, None).await;
}

/// WeChat's 43101 voids the grants the user held when the refused send was claimed,
/// not one the user gave while it was in flight: the refusal says nothing of it, and
/// the plan goes on with that grant.
#[tokio::test]
async fn a_43101_spares_a_grant_the_user_gave_while_the_refused_send_was_in_flight() {
    let app = spawn_app_with(&[FAST[0], ("WECHAT_TIMEOUT_MS", "3000"), FAST[2]]).await;
    let user = app.scheduled_user("alice", 2).await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": 43101})),
    )
    .await;
    app.control("POST", "latency", Some(json!({"ms": 1200})))
        .await;
    app.make_due(&user, "water", Utc::now()).await;
    let meanwhile = async {
        app.until_sending(&user, "water").await;
        app.accept(&user, WATER, "wr_meanwhile").await;
        // Still in flight: the refusal's voiding comes after this grant.
        let plan = app.item(&user, "PLAN#water").await.expect("plan");
        assert_eq!(attr_s(&plan, "state"), Some("sending"), "given in flight");
    };
    let (summary, ()) = tokio::join!(app.tick(60), meanwhile);
    assert_eq!(summary.failed, 1, "{summary:?}");
    let states: std::collections::BTreeMap<String, String> = app
        .items_of(&user, "grant")
        .await
        .iter()
        .map(|g| {
            (
                attr_s(g, "request_id").unwrap_or_default().to_string(),
                attr_s(g, "state").unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("wr_alice_0".to_string(), "invalid".to_string()),
            ("wr_alice_1".to_string(), "invalid".to_string()),
            ("wr_meanwhile".to_string(), "available".to_string()),
        ]
        .into(),
        "the two held at the claim are void, the one given since is not"
    );
    // The accept given in flight came after WeChat's answer to the claimed send: the
    // plan goes on with its grant (the refusal holds only against grants from before).
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(
        (
            plan.body["state"].as_str(),
            plan.body["needs_grant"].as_bool()
        ),
        (Some("scheduled"), Some(false)),
        "{}",
        plan.body
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_claim_a_disable_and_a_43101_cost_the_same_with_a_thousand_past_grants_as_with_none() {
    let app = spawn_app_with(&FAST).await;
    let fresh = app.scheduled_user("fresh", 3).await;
    let veteran = app.scheduled_user("veteran", 3).await;
    history(&app, &veteran, WATER, 1000).await;
    // The first tick registers the shard count: not part of what is compared.
    app.tick(30).await;
    let mut costs = Vec::new();
    for user in [&fresh, &veteran] {
        // A reminder.
        app.make_due(user, "water", Utc::now()).await;
        app.round_trips.take();
        app.round_trips.take_items_read();
        assert_eq!(app.tick(30).await.sent, 1);
        let dispatch = (
            tally(app.round_trips.take()),
            app.round_trips.take_items_read(),
        );
        // A push of the same template that meets 43101: the other grants are voided.
        app.control(
            "POST",
            "faults",
            Some(json!({"openid": user.openid, "errcode": 43101})),
        )
        .await;
        app.notify(json!({"idempotency_key": format!("k-{}", user.openid), "openid": user.openid,
                          "type": "water", "title": "喝水", "body": "喝水提醒",
                          "wechat": {"template_id": WATER,
                                     "data": {"thing1": "喝水", "time2": "2026年11月30日 15:00", "number3": "1"}}}))
            .await;
        app.round_trips.take();
        app.round_trips.take_items_read();
        assert_eq!(app.tick(30).await.failed, 1);
        let refused = (
            tally(app.round_trips.take()),
            app.round_trips.take_items_read(),
        );
        // Disabling the plan.
        let off = app.disable(user, "water").await;
        assert_eq!(off.status, 200);
        let disable = (
            tally(app.round_trips.take()),
            app.round_trips.take_items_read(),
        );
        // A dispatch is its read, the claim and the finalize; the rest of the tick is
        // its own (the shard registry, the index queries).
        let beyond_the_tick: std::collections::BTreeMap<&str, usize> = dispatch
            .0
            .iter()
            .filter(|(op, _)| op.as_str() != "Query@index")
            .map(|(op, n)| (op.as_str(), *n))
            .collect();
        assert_eq!(
            beyond_the_tick,
            [
                ("BatchGetItem", 1),
                ("GetItem", 1),
                ("TransactWriteItems", 2)
            ]
            .into(),
            "a dispatch is 3 round trips, plus the tick's registry read and index queries"
        );
        for (what, (ops, _)) in [
            ("dispatch", &dispatch),
            ("43101", &refused),
            ("disable", &disable),
        ] {
            assert!(
                !ops.contains_key("Query") && !ops.contains_key("Scan"),
                "{what} reads no partition of the user's history: {ops:?}"
            );
        }
        costs.push((dispatch, refused, disable));
    }
    assert_eq!(
        costs[0], costs[1],
        "the same requests and items read with 0 and 1,000 past grants"
    );
    eprintln!(
        "(requests, items read) with 0 and with 1,000 past grants: {:?}",
        costs[0]
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn grants_recorded_before_the_quota_item_listed_them_are_still_claimed_and_voided() {
    let app = spawn_app_with(&FAST).await;
    let user = due_user(&app, "alice", 3).await;
    // As an older version left them: counters, but no open-grant sets.
    app.quota_update(&user, WATER)
        .update_expression("REMOVE open_available, open_reserved")
        .send()
        .await
        .expect("sets removed");
    assert_eq!(app.tick(30).await.sent, 1, "claimed from the ledger");
    assert_ledger_agrees_with_counters(&app).await;
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200);
    let states = grant_states(&app, &user).await;
    assert_eq!(
        states.iter().filter(|s| *s == "invalid").count(),
        2,
        "the two unlisted grants left are voided: {states:?}"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// A list that names a grant not open, while its size still matches the counters (so
/// it is trusted), must not stall a disable: the grant that refuses its void leaves
/// the list, and the retry voids through the ledger.
#[tokio::test]
async fn a_disable_trusting_a_list_with_a_wrong_member_still_voids_every_grant() {
    use aws_sdk_dynamodb::types::AttributeValue::Ss;
    let (app, user) = alice_with_two_grants(WATER).await;
    assert_eq!(app.enable(&user, "water").await.status, 200);
    // wr_1 replaced on the list by a grant that does not exist.
    app.quota_update(&user, WATER)
        .update_expression("SET open_available = :listed")
        .expression_attribute_values(":listed", Ss(vec!["wr_0".into(), "ghost".into()]))
        .send()
        .await
        .expect("listed wrongly");
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);
    let states = grant_states(&app, &user).await;
    assert_eq!(states, ["invalid", "invalid"], "both voided");
    let (listed, _) = open_available(&app, &user, WATER).await;
    assert!(listed.is_empty(), "{listed:?}");
    assert_ledger_agrees_with_counters(&app).await;
}

/// An id in both open-grant lists (their sizes still matching the counters) is not
/// trusted: voiding it twice in one transaction would be refused every time. A disable
/// reads the ledger instead, voids each open grant once, and the id leaves both lists.
#[tokio::test]
async fn a_disable_with_an_id_in_both_lists_voids_through_the_ledger() {
    use aws_sdk_dynamodb::types::AttributeValue::Ss;
    let app = spawn_app_with(&FAST).await;
    let user = due_user(&app, "alice", 3).await;
    app.claim_due(Utc::now()).await; // one grant reserved, its send in flight
    let available: Vec<String> = app
        .items_of(&user, "grant")
        .await
        .iter()
        .filter(|g| attr_s(g, "state") == Some("available"))
        .filter_map(|g| attr_s(g, "request_id").map(str::to_string))
        .collect();
    assert_eq!(available.len(), 2);
    // The reserved list names an available grant instead of the reserved one.
    app.quota_update(&user, WATER)
        .update_expression("SET open_reserved = :wrong")
        .expression_attribute_values(":wrong", Ss(vec![available[0].clone()]))
        .send()
        .await
        .expect("listed wrongly");
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);
    let states = grant_states(&app, &user).await;
    assert_eq!(states, ["invalid"; 3], "each voided once");
    let (listed, quota) = open_available(&app, &user, WATER).await;
    assert!(
        listed.is_empty() && !quota.contains_key("open_reserved"),
        "{quota:?}"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// Two disables at once: one voids, the other finds its void refused by grants that
/// moved meanwhile (and off the list with them) — both answer 200, each grant is voided
/// once, and the lists stay true.
#[tokio::test]
async fn two_disables_at_once_both_answer_and_void_each_grant_once() {
    let app = spawn_app_with(&FAST).await;
    for round in 0..5 {
        let user = app.scheduled_user(&format!("u{round}"), 3).await;
        let (a, b) = tokio::join!(app.disable(&user, "water"), app.disable(&user, "water"));
        assert_eq!((a.status, b.status), (200, 200), "{} / {}", a.body, b.body);
        let states = grant_states(&app, &user).await;
        assert_eq!(states, ["invalid"; 3], "round {round}");
        assert_ledger_agrees_with_counters(&app).await;
    }
}

/// The ledger fallback reads a user's whole history of the template: it must happen
/// once. The claim that falls back rebuilds the quota item's sets from the ledger, and
/// the next claim reads no history.
#[tokio::test]
async fn a_claim_that_finds_the_sets_incomplete_rebuilds_them_and_the_next_reads_no_history() {
    let app = spawn_app_with(&FAST).await;
    let user = app.user("alice").await;
    for i in 0..3 {
        app.accept(&user, ORDER, &format!("wr_{i}")).await;
    }
    history(&app, &user, ORDER, 1000).await;
    // As an older version left them: counters, but no open-grant sets.
    app.quota_update(&user, ORDER)
        .update_expression("REMOVE open_available, open_reserved")
        .send()
        .await
        .expect("sets removed");
    let listed =
        |quota: std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
            quota
                .get("open_available")
                .and_then(|v| v.as_ss().ok())
                .cloned()
                .unwrap_or_default()
        };
    app.tick(30).await; // registers the shard count
    let mut reads = Vec::new();
    for key in ["order-1", "order-2"] {
        app.push(&user, key).await;
        app.round_trips.take();
        app.round_trips.take_items_read();
        assert_eq!(app.tick(30).await.sent, 1, "{key}");
        reads.push((
            tally(app.round_trips.take()),
            app.round_trips.take_items_read(),
        ));
        assert_ledger_agrees_with_counters(&app).await;
    }
    assert!(
        reads[0].0.contains_key("Query") && reads[0].1 >= 1000,
        "the first claim reads the ledger: {:?}",
        reads[0]
    );
    assert!(
        !reads[1].0.contains_key("Query") && reads[1].1 < 20,
        "the second claims from the rebuilt sets: {:?}",
        reads[1]
    );
    let quota = app
        .item(&user, &format!("QUOTA#{ORDER}"))
        .await
        .expect("quota");
    assert_eq!(listed(quota).len(), 1, "one grant left, listed");
}

/// A quota item past a transaction's size to repair at once — 150 open grants an older
/// version left unlisted, 40 of them listed, and one listed grant that does not exist —
/// is repaired by the first claim that falls back, in transactions of at most 99
/// grants each, and the next claim reads no history.
#[tokio::test]
async fn sets_too_large_for_one_transaction_are_repaired_in_chunks_by_one_claim() {
    use aws_sdk_dynamodb::types::AttributeValue::Ss;
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2], ("MAX_OPEN_GRANTS", "200")]).await;
    let user = app.user("alice").await;
    let ids = app.legacy_grants(&user, ORDER, 150).await;
    let mut listed: Vec<String> = ids[..40].to_vec();
    listed.push("ghost".into());
    // The ghost wrongly in the reserved set too: two deletions for one grant item.
    app.quota_update(&user, ORDER)
        .update_expression("SET open_available = :listed, open_reserved = :ghost")
        .expression_attribute_values(":listed", Ss(listed))
        .expression_attribute_values(":ghost", Ss(vec!["ghost".into()]))
        .send()
        .await
        .expect("partly listed");
    app.tick(30).await; // registers the shard count
    let mut runs = Vec::new();
    for key in ["order-1", "order-2"] {
        app.push(&user, key).await;
        app.round_trips.take();
        app.round_trips.take_items_read();
        let summary = app.tick(30).await;
        assert_eq!(summary.sent, 1, "{key}: {summary:?}");
        runs.push((
            tally(app.round_trips.take()),
            app.round_trips.take_items_read(),
        ));
        assert_ledger_agrees_with_counters(&app).await;
    }
    let (first, read) = &runs[0];
    assert!(
        first.contains_key("Query") && *read >= 150,
        "the first claim reads the ledger: {runs:?}"
    );
    // The claim and the finalize, and the repair: the ghost's two deletions (one per
    // set, in transactions of their own), then the 110 unlisted grants as 99 + 11.
    assert_eq!(first.get("TransactWriteItems"), Some(&6), "{runs:?}");
    let (second, read) = &runs[1];
    assert!(
        !second.contains_key("Query") && *read < 20,
        "the second claims from the repaired sets: {runs:?}"
    );
    let (listed, quota) = open_available(&app, &user, ORDER).await;
    assert_eq!(
        listed.len(),
        148,
        "every grant left is listed, the ghost is not"
    );
    assert!(!listed.contains(&"ghost".to_string()));
    assert!(!quota.contains_key("open_reserved"), "{quota:?}");
}

/// Repairs racing claims from other containers (each with its own WeChat client, so
/// claims for one user overlap) and new reports: whatever the interleaving, every push
/// is sent once, and the sets only ever name grants truly in their state.
#[tokio::test]
async fn repairs_racing_claims_and_reports_keep_the_sets_true() {
    const PUSHES: usize = 4;
    const ROUNDS: usize = 3;
    let app = spawn_app_with(&[
        FAST[0],
        FAST[1],
        FAST[2],
        ("MAX_OPEN_GRANTS", "300"),
        ("REPORTS_PER_MINUTE", "100"),
        // A push WeChat turned away as busy goes again within the catch-up ticks.
        ("DISPATCH_RETRY_BASE_SECONDS", "1"),
    ])
    .await;
    let user = app.user("alice").await;
    app.legacy_grants(&user, ORDER, 150).await;
    app.tick(30).await; // registers the shard count
    let containers: Vec<_> = (0..3)
        .map(|_| {
            onegrant_local::stack::deps((*app.deps.config).clone(), app.table.client.clone())
                .expect("deps")
        })
        .collect();
    for round in 0..ROUNDS {
        // Unlisted again each round, so each round's claims repair.
        app.quota_update(&user, ORDER)
            .update_expression("REMOVE open_available, open_reserved")
            .send()
            .await
            .expect("sets removed");
        for i in 0..PUSHES {
            app.push(&user, &format!("r{round}_{i}")).await;
        }
        // Staggered, so that one container's repair overlaps another's claim.
        let ticks = join_all(
            std::iter::once(&app.deps)
                .chain(containers.iter())
                .enumerate()
                .map(|(i, deps)| async move {
                    tokio::time::sleep(std::time::Duration::from_millis(40 * i as u64)).await;
                    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
                    dispatcher::tick(deps, deadline).await.expect("tick")
                }),
        );
        let reports = join_all((0..3).map(|i| {
            let (app, user) = (&app, &user);
            async move {
                app.accept(user, ORDER, &format!("wr_{round}_{i}")).await;
            }
        }));
        let (mut summaries, _) = tokio::join!(ticks, reports);
        catch_up(&app, &mut summaries, PUSHES, 60).await;
        let sent: u32 = summaries.iter().map(|s| s.sent).sum();
        assert_eq!(sent as usize, PUSHES, "round {round}: {summaries:?}");
        assert_ledger_agrees_with_counters(&app).await;
        // A repair the race cut short is finished by the next claim: after one alone,
        // the sets account for the counters (so, checked above, are the ledger's).
        app.push(&user, &format!("r{round}_solo")).await;
        assert_eq!(app.tick(60).await.sent, 1, "round {round}: the solo push");
        let (listed, quota) = open_available(&app, &user, ORDER).await;
        assert_eq!(
            Some(listed.len() as i64),
            attr_n(&quota, "available"),
            "round {round}: the sets are complete"
        );
        assert_ledger_agrees_with_counters(&app).await;
    }
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for d in app.deliveries().await {
        let key = d["data"]["character_string1"]["value"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        *per_key.entry(key).or_default() += 1;
    }
    assert_eq!(per_key.len(), (PUSHES + 1) * ROUNDS, "{per_key:?}");
    assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
}

#[tokio::test]
async fn a_listed_grant_found_through_the_ledger_leaves_the_list_when_claimed() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (app, user) = alice_with_two_grants(ORDER).await;
    // wr_1 as an older version left it: not listed. The list no longer accounts for
    // every grant, so claims go through the ledger — whose first grant, wr_0, is listed.
    app.quota_update(&user, ORDER)
        .update_expression("DELETE open_available :x")
        .expression_attribute_values(":x", AttributeValue::Ss(vec!["wr_1".into()]))
        .send()
        .await
        .expect("unlisted");
    for (i, key) in ["order-1", "order-2"].into_iter().enumerate() {
        app.push(&user, key).await;
        let summary = app.tick(30).await;
        assert_eq!(summary.sent, 1, "push {i}: {summary:?}");
        let quota = app
            .item(&user, &format!("QUOTA#{ORDER}"))
            .await
            .expect("quota");
        let listed: Vec<String> = quota
            .get("open_available")
            .and_then(|v| v.as_ss().ok())
            .cloned()
            .unwrap_or_default();
        assert!(
            !listed.contains(&"wr_0".to_string()),
            "push {i}: {listed:?}"
        );
        assert_ledger_agrees_with_counters(&app).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tick_reads_the_due_backlog_in_pages_and_only_as_far_as_its_budget_can_send() {
    let app = spawn_app_with(&[
        FAST[0],
        ("WECHAT_TIMEOUT_MS", "5000"),
        FAST[2],
        ("DUE_SHARDS", "1"),
    ])
    .await;
    due_users(&app, "u", 120).await;
    // WeChat answers in 2.5 s. A tick with a second more than one send needs from
    // its turn reads one page, starts what it can in that second, and leaves the rest
    // unread: no send ends before its time is up, so no slot frees for a next page.
    app.control("POST", "latency", Some(json!({"ms": 2500})))
        .await;
    let wechat = &app.deps.wechat;
    let after_turn =
        wechat.call_timeout() + wechat.send_window() + std::time::Duration::from_secs(5);
    let deadline = tokio::time::Instant::now() + after_turn + std::time::Duration::from_millis(500);
    app.round_trips.take();
    let short = dispatcher::tick(&app.deps, deadline).await.expect("tick");
    let index_queries = app
        .round_trips
        .take()
        .iter()
        .filter(|op| *op == "Query@index")
        .count();
    assert!(
        (1..=50).contains(&short.due),
        "one page of 50 at most was read: {short:?}"
    );
    assert_eq!(short.claimed, short.sent, "{short:?}");
    // One due-index page per shard and one lease query per shard (the span is at
    // least the default 16): no second page of shard 0 was read.
    assert_eq!(index_queries, 32, "index queries");
    assert_plans_consistent(&app).await;

    // A tick with time goes through the rest, page by page.
    app.control("POST", "latency", Some(json!({"ms": 0}))).await;
    let rest = app.tick(60).await;
    assert_eq!(short.sent + rest.sent, 120, "{short:?} {rest:?}");
    assert!(rest.due >= 120 - short.sent, "{rest:?}");
    let sent = app.deliveries().await;
    assert_eq!(sent.len(), 120, "each sent once");
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tick_fans_its_shards_out_to_workers_through_the_invoke_api() {
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2], ("DISPATCH_WORKERS", "4")]).await;
    due_users(&app, "w", 40).await;
    // The scheduled tick only hands the 16 shards to 4 workers (asynchronous
    // invocations of the dispatcher through the local Invoke API) ...
    let coordinator = app.tick(30).await;
    assert_eq!(
        (coordinator.workers, coordinator.inline, coordinator.due),
        (4, 0, 0),
        "{coordinator:?}"
    );
    // ... which send everything, each reminder once.
    let mut sent = 0;
    for _ in 0..300 {
        sent = app.deliveries().await.len();
        if sent >= 40 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(sent, 40);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(app.deliveries().await.len(), 40, "nothing twice");
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
    assert_no_plan_stuck_sending(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tick_whose_workers_cannot_be_invoked_does_their_shards_itself() {
    let app = spawn_app_with(&[
        FAST[0],
        FAST[1],
        FAST[2],
        ("DISPATCH_WORKERS", "4"),
        // Nothing listens there: every invocation fails.
        ("AWS_ENDPOINT_URL_LAMBDA", "http://127.0.0.1:9"),
    ])
    .await;
    for i in 0..12 {
        due_user(&app, &format!("f{i}"), 1).await;
    }
    let summary = app.tick(30).await;
    assert_eq!((summary.workers, summary.inline), (0, 4), "{summary:?}");
    assert_eq!(summary.sent, 12, "{summary:?}");
    assert_eq!(app.deliveries().await.len(), 12);
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_worker_event_naming_no_usable_shards_fails_and_never_runs_a_tick() {
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2], ("DISPATCH_WORKERS", "4")]).await;
    due_user(&app, "alice", 1).await;
    for payload in [
        json!({"onegrant_dispatch_shards": "all"}),
        json!({"onegrant_dispatch_shards": {"from": 0, "to": 100000}}),
    ] {
        let answer = app.invoke("dispatcher", &payload).await;
        assert_eq!(answer["errorType"], "FunctionError", "{answer}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(app.deliveries().await.is_empty(), "no tick ran");
}

/// A user's push (one grant of the order template) claimed by a dispatcher that then
/// stalled past its lease, and swept `unknown`: the user and the claim.
async fn swept_push(app: &TestApp, name: &str) -> (User, onegrant::store::dispatch::Claim) {
    let user = app.user(name).await;
    app.accept(&user, ORDER, &format!("wr_{name}")).await;
    app.push(&user, name).await;
    let now = Utc::now();
    let claim = app.claim_and_sweep(now).await;
    (user, claim)
}

/// A late answer for a push whose notification its retention removed meanwhile (read,
/// then expired) settles the push, and never recreates the notification as a stub
/// holding only a push status.
#[tokio::test]
async fn a_late_answer_never_recreates_a_notification_its_retention_removed() {
    let app = spawn_app_with(&[
        FAST[0],
        FAST[1],
        FAST[2],
        ("RETENTION_READ_NOTES_DAYS", "7"),
        ("RETENTION_OUTBOX_DAYS", "30"),
        ("RETENTION_DELIVERIES_DAYS", "30"),
    ])
    .await;
    let user = app.user("expired-note").await;
    app.accept(&user, ORDER, "wr_expired").await;
    let pushed = app.push(&user, "expired-note").await;
    let note_id = pushed["note_id"].as_str().expect("note id").to_string();
    let claim = app.claim_and_sweep(Utc::now()).await;
    let read = app
        .call(
            "POST",
            &format!("/v1/notifications/{note_id}/read"),
            Some(&user.token),
            None,
        )
        .await;
    assert_eq!(read.status, 200, "{}", read.body);
    // A read note is kept 7 days; the push and its delivery 30.
    assert!(app.ttl_pass(Utc::now() + Duration::days(8)).await >= 1);
    // Any item under the note's key, whatever it holds (a stub has no `kind`).
    let notes = || async {
        let pk = format!("USER#{}", user.openid);
        app.items()
            .await
            .into_iter()
            .filter(|i| {
                attr_s(i, "pk") == Some(pk.as_str())
                    && attr_s(i, "sk").is_some_and(|sk| sk.starts_with("NOTE#"))
            })
            .count()
    };
    assert_eq!(notes().await, 0, "the note expired");

    let finalized = app
        .finalize_as(
            &claim,
            onegrant::domain::outcome::SendResult::Sent {
                msgid: Some("3141592653589793238".into()),
            },
        )
        .await;
    assert!(finalized.late && !finalized.superseded, "{finalized:?}");
    assert_eq!(notes().await, 0, "no stub");
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(attr_s(&outbox[0], "state"), Some("sent"), "{outbox:?}");
    assert_ledger_agrees_with_counters(&app).await;
}

/// WeChat's -1: busy, not sent.
fn busy() -> onegrant::domain::outcome::SendResult {
    onegrant::domain::outcome::SendResult::Refused {
        errcode: -1,
        errmsg: "system error".into(),
    }
}

#[tokio::test]
async fn a_late_failure_never_gives_back_a_grant_of_a_template_refused_since_the_claim() {
    // A push is claimed and its dispatcher stalls; the sweep voids its grant (the send
    // may have gone). The user then turns the template off in WeChat's settings. The
    // stalled dispatcher's answer arrives at last: -1, not sent. Only a sweep's guess is
    // undone by such an answer, never a refusal made since the claim: the grant stays
    // void and nothing is sent with it.
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2]]).await;
    let (user, claim) = swept_push(&app, "refused-meanwhile").await;
    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let order = onegrant::domain::TemplateId::parse(ORDER.to_string()).expect("template");
    app.deps
        .store
        .refuse_template(
            &openid,
            &order,
            &app.deps.config.reminders,
            true,
            Utc::now().timestamp(),
            Utc::now(),
        )
        .await
        .expect("refused");
    let late = app.finalize_as(&claim, busy()).await;
    assert!(late.late && !late.restored, "{late:?}");
    app.assert_grants_void(&user, 1).await;
    // Nothing left to send the push with when it comes due again.
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(onegrant_tests::quota(&grants.body, ORDER)["available"], 0);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_late_failure_gives_back_a_grant_the_sweep_voided_when_nothing_refused_it() {
    // The control: the same late -1 with no refusal since the claim restores the grant
    // (it was only the sweep's guess), for the push's next try.
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2]]).await;
    let (user, claim) = swept_push(&app, "nothing-meanwhile").await;
    let late = app.finalize_as(&claim, busy()).await;
    assert!(late.late && late.restored, "{late:?}");
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(onegrant_tests::quota(&grants.body, ORDER)["available"], 1);
    assert_ledger_agrees_with_counters(&app).await;
}
