//! What users do while their reminder is in flight: enable, reject, disable.

use super::*;

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
    assert!(attr_n(&plan, "next_due_at").unwrap_or(0) > app.now().timestamp_millis());
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(attr_s(&grants[0], "state"), Some("available"));
    assert_ledger_agrees_with_counters(&app).await;
}
