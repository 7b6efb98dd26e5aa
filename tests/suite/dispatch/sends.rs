//! Sends: once, on time, with their content; retries, tokens, racing dispatchers.

use super::*;

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
                    "occurred_at": app.now().to_rfc3339(), "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(answer.body["state"], "scheduled", "{}", answer.body);
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
    app.make_due(&user, "water", app.now()).await;
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
    let checkin = json!({"action_id": "ck_resume", "occurred_at": app.now().to_rfc3339(),
                         "current_count": 1, "daily_goal": 8});
    let resumed = app
        .post("/v1/reminders/water/checkins", Some(&user.token), &checkin)
        .await;
    assert_eq!(resumed.body["state"], "scheduled", "{}", resumed.body);
    let plan = app.item(&user, "PLAN#water").await;
    assert_eq!(plan.as_ref().and_then(|p| attr_n(p, "attempts")), Some(0));
    app.make_due(&user, "water", app.now()).await;
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
    // A claim given back unsent (a loaded machine) is due again at once at midday in
    // Shanghai, the reminders' zone; at night there it would wait for the morning, and
    // the catch-up ticks below would never send it.
    app.move_to_china_midday();
    let names: Vec<String> = (0..PLANS).map(|i| format!("r{i}")).collect();
    // Set up eight at a time (the race is the dispatchers', not the set-up's: 200 at
    // once queue behind each other past the handlers' budget on a loaded machine).
    let users: Vec<User> = futures::stream::iter(&names)
        .map(|name| due_user(&app, name, 1))
        .buffered(8)
        .collect()
        .await;
    for round in 0..ROUNDS {
        if round > 0 {
            // Each user checks in with the next grant; the plan is due again.
            futures::stream::iter(users.iter().enumerate().map(|(i, user)| {
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
                                    "subscription_status": "accept", "occurred_at": app.now().to_rfc3339(),
                                    "current_count": round, "daily_goal": 8}),
                        )
                        .await;
                    assert_eq!(answer.body["state"], "scheduled", "{}", answer.body);
                    app.make_due(user, "water", app.now() + Duration::milliseconds((i % 20) as i64 * 100)).await;
                }
            }))
            .buffer_unordered(16)
            .collect::<Vec<()>>()
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
    // WeChat holds its answer (not a latency the machine's speed could outrun); the
    // user checks in (with the next grant) meanwhile, and then WeChat answers.
    app.hold_sends(&user.openid, true).await;
    let tick = app.tick(120);
    let check_in = async {
        // Wait until the send is really in flight.
        app.until_sending(&user, "water").await;
        app.control(
            "POST",
            "quota",
            Some(json!({"openid": user.openid, "template_id": WATER, "count": 1})),
        )
        .await;
        let answer = app.post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": "wc_mid", "grant_request_id": "wr_mid", "subscription_status": "accept",
                    "occurred_at": app.now().to_rfc3339(), "current_count": 2, "daily_goal": 8}),
        )
        .await;
        app.hold_sends(&user.openid, false).await;
        answer
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
    // (A claim given back unsent is due again at once at midday in Shanghai, the
    // reminders' zone; at night there it would wait for the morning.)
    app.move_to_china_midday();
    let names: Vec<String> = (0..PLANS).map(|i| format!("t{i}")).collect();
    // Set up eight at a time (the race is the dispatchers', not the set-up's: 200 at
    // once queue behind each other past the handlers' budget on a loaded machine).
    let users: Vec<User> = futures::stream::iter(&names)
        .map(|name| due_user(&app, name, 1))
        .buffered(8)
        .collect()
        .await;
    // stable_token hangs far past the client's timeout.
    app.control("POST", "token-fault", Some(json!({"hang_ms": 60_000})))
        .await;
    let budget = std::time::Duration::from_secs(40);
    // The failure's memory (TOKEN_FAILURE_MEMORY) runs on the app's clock: held for
    // this tick, so however slowly the 40 claims reach the token, they meet it.
    app.clock.freeze_at(app.now());
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

    // WeChat recovers: the next ticks (past the failure's memory) send every one. (On a
    // loaded machine one tick may give a claim back unsent for want of time: the next
    // takes it.)
    app.control("POST", "token-fault", Some(json!({}))).await;
    app.advance(onegrant::wechat::TOKEN_FAILURE_MEMORY);
    app.clock.run();
    let summary = app.ticks_until(|s| s.sent as usize >= PLANS).await;
    assert_eq!(summary.sent as usize, PLANS, "{summary:?}");
    assert_ledger_agrees_with_counters(&app).await;
}
