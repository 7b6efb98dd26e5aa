//! `POST /v1/grants` and `GET /v1/grants`: one accept buys one grant, exactly once.

use futures::future::join_all;
use onegrant_tests::attr_n;
use onegrant_tests::{ORDER, WATER, assert_ledger_agrees_with_counters, attr_s, quota, spawn_app};
use serde_json::{Value, json};

fn report(request_id: &str, results: Value) -> Value {
    json!({"request_id": request_id, "results": results})
}

#[tokio::test]
async fn an_accepted_template_adds_one_available_grant() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let answer = app
        .post(
            "/v1/grants",
            Some(&token),
            &report(
                "wr_1",
                json!({"errMsg": "requestSubscribeMessage:ok", WATER: "accept"}),
            ),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body["grants"],
        json!([{"template_id": WATER, "request_id": "wr_1", "result": "accept", "status": "available"}])
    );
    let water = quota(&answer.body, WATER);
    assert_eq!(
        (
            water["available"].as_u64(),
            water["accepted"].as_u64(),
            water["used"].as_u64()
        ),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(water["needs_grant"], false);
    assert_eq!(quota(&answer.body, ORDER)["needs_grant"], true);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_reports_make_exactly_one_grant_and_fifty_identical_answers() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let body = report("wr_same", json!({WATER: "accept", ORDER: "reject"}));
    let answers = join_all((0..50).map(|_| app.post("/v1/grants", Some(&token), &body))).await;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body, answers[0].body, "every answer is identical");
    }
    let items = app.items().await;
    let grants = items
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("grant") && attr_s(i, "template_id") == Some(WATER))
        .count();
    assert_eq!(grants, 1, "exactly one grant item");
    let water = quota(&answers[0].body, WATER);
    assert_eq!(
        (water["accepted"].as_u64(), water["available"].as_u64()),
        (Some(1), Some(1))
    );
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_reports_with_distinct_request_ids_add_twenty_grants() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let bodies: Vec<Value> = (0..20)
        .map(|i| report(&format!("wr_{i}"), json!({WATER: "accept"})))
        .collect();
    let answers = join_all(
        bodies
            .iter()
            .map(|b| app.post("/v1/grants", Some(&token), b)),
    )
    .await;
    assert!(answers.iter().all(|a| a.status == 200));
    let quotas = app.get("/v1/grants", Some(&token)).await;
    let water = quota(&quotas.body, WATER);
    assert_eq!(
        (water["accepted"].as_u64(), water["available"].as_u64()),
        (Some(20), Some(20))
    );
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_request_id_reused_with_a_different_result_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let first = app
        .post(
            "/v1/grants",
            Some(&token),
            &report("wr_1", json!({WATER: "accept"})),
        )
        .await;
    assert_eq!(first.status, 200);
    let before = app.items().await;
    for changed in [
        json!({WATER: "reject"}),
        json!({WATER: "reject", ORDER: "accept"}),
    ] {
        let answer = app
            .post("/v1/grants", Some(&token), &report("wr_1", changed.clone()))
            .await;
        assert_eq!(answer.status, 409, "{changed}: {}", answer.body);
        assert_eq!(answer.body["error"]["code"], "idempotency_conflict");
    }
    assert_eq!(before, app.items().await, "a refused report writes nothing");
}

#[tokio::test]
async fn a_replay_answers_from_the_ledger_and_a_new_template_under_the_same_request_id_is_added() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let first = app
        .post(
            "/v1/grants",
            Some(&token),
            &report("wr_1", json!({WATER: "accept"})),
        )
        .await;
    let replay = app
        .post(
            "/v1/grants",
            Some(&token),
            &report("wr_1", json!({WATER: "accept"})),
        )
        .await;
    assert_eq!(first.body, replay.body);
    // Idempotency is per (user, request_id, template): the grant a check-in carries for
    // one template may share a request_id with a report covering others.
    let extended = app
        .post(
            "/v1/grants",
            Some(&token),
            &report("wr_1", json!({WATER: "accept", ORDER: "accept"})),
        )
        .await;
    assert_eq!(extended.status, 200);
    assert_eq!(quota(&extended.body, WATER)["accepted"], 1);
    assert_eq!(quota(&extended.body, ORDER)["accepted"], 1);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn reject_ban_and_filter_are_recorded_without_granting() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let answer = app
        .post(
            "/v1/grants",
            Some(&token),
            &report("wr_r", json!({WATER: "reject", ORDER: "ban"})),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.body["grants"]
            .as_array()
            .is_some_and(|g| g.iter().all(|e| e["status"] == "not_granted"))
    );
    let filtered = app
        .post(
            "/v1/grants",
            Some(&token),
            &report("wr_f", json!({WATER: "filter"})),
        )
        .await;
    assert_eq!(filtered.body["grants"][0]["status"], "not_granted");
    let items = app.items().await;
    let refusals: Vec<_> = items
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("quota"))
        .map(|i| {
            (
                attr_s(i, "template_id"),
                attr_s(i, "last_refusal"),
                attr_n(i, "accepted"),
            )
        })
        .collect();
    assert!(refusals.contains(&(Some(WATER), Some("reject"), None)));
    assert!(refusals.contains(&(Some(ORDER), Some("ban"), None)));
    let ledger = items
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("grant"))
        .count();
    assert_eq!(ledger, 3, "every result is in the ledger");
    assert_eq!(quota(&filtered.body, WATER)["accepted"], 0);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn quotas_list_every_configured_template_even_before_any_grant() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let answer = app.get("/v1/grants", Some(&token)).await;
    assert_eq!(answer.status, 200);
    let ids: Vec<&str> = answer.body["quotas"]
        .as_array()
        .expect("quotas")
        .iter()
        .filter_map(|q| q["template_id"].as_str())
        .collect();
    assert_eq!(ids, vec!["tmpl_grants_used_up", ORDER, WATER]);
    assert_eq!(quota(&answer.body, WATER)["title"], "喝水提醒");
}

#[tokio::test]
async fn user_b_sees_none_of_user_as_grants_or_quotas() {
    let app = spawn_app().await;
    let alice = app.login("alice").await;
    let bob = app.login("bob").await;
    for i in 0..3 {
        app.post(
            "/v1/grants",
            Some(&alice),
            &report(&format!("wr_{i}"), json!({WATER: "accept"})),
        )
        .await;
    }
    let bobs = app.get("/v1/grants", Some(&bob)).await;
    assert_eq!(quota(&bobs.body, WATER)["accepted"], 0);
    // Bob reusing Alice's request_id is Bob's own first report, not a conflict.
    let own = app
        .post(
            "/v1/grants",
            Some(&bob),
            &report("wr_0", json!({WATER: "reject"})),
        )
        .await;
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(quota(&own.body, WATER)["accepted"], 0);
    let alices = app.get("/v1/grants", Some(&alice)).await;
    assert_eq!(quota(&alices.body, WATER)["accepted"], 3);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_grant_report_costs_three_round_trips_a_replay_two_and_one_more_read_per_reminder_template()
 {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    let order = report("wr_o", json!({ORDER: "accept", "errMsg": "ok"}));
    app.round_trips.take();
    assert_eq!(
        app.post("/v1/grants", Some(&token), &order).await.status,
        200
    );
    assert_eq!(
        app.round_trips.take(),
        vec!["GetItem", "BatchGetItem", "TransactWriteItems", "Query"],
        "first report: the caller admitted (no erasure), its ledger items and the minute's counters read (none there), \
         written, and the quotas answered"
    );
    assert_eq!(
        app.post("/v1/grants", Some(&token), &order).await.status,
        200
    );
    assert_eq!(
        app.round_trips.take(),
        vec!["GetItem", "BatchGetItem", "Query"],
        "a replay is answered from the ledger items read first: no transaction"
    );
    // The water template backs a reminder kind: its plan is read too and moves in the
    // report's own transaction (written only when the grant changes its state); a
    // replay reads neither it nor anything else past the ledger.
    let water = report("wr_w", json!({WATER: "accept"}));
    assert_eq!(
        app.post("/v1/grants", Some(&token), &water).await.status,
        200
    );
    assert_eq!(
        app.round_trips.take(),
        vec![
            "GetItem",
            "BatchGetItem",
            "BatchGetItem",
            "TransactWriteItems",
            "Query"
        ]
    );
    app.round_trips.take_writes();
    assert_eq!(
        app.post("/v1/grants", Some(&token), &water).await.status,
        200
    );
    assert_eq!(
        app.round_trips.take(),
        vec!["GetItem", "BatchGetItem", "Query"]
    );
    assert!(
        app.round_trips.take_writes().is_empty(),
        "a replay writes nothing"
    );
    assert_eq!(app.get("/v1/grants", Some(&token)).await.status, 200);
    assert_eq!(
        app.round_trips.take(),
        // The caller admitted, the read counted (READS_PER_MINUTE), then one query.
        vec!["GetItem", "UpdateItem", "Query"],
        "quotas never scan grants"
    );
}

#[tokio::test]
async fn reports_past_the_per_minute_rate_answer_429_store_nothing_and_replays_still_answer() {
    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "3")]).await;
    let alice = app.user("alice").await;
    let bob = app.user("bob").await;
    app.freeze_at_a_minute_start();
    let mut statuses = Vec::new();
    for i in 0..5 {
        let answer = app
            .post(
                "/v1/grants",
                Some(&alice.token),
                &report(&format!("wr_{i}"), json!({WATER: "accept"})),
            )
            .await;
        if answer.status == 429 {
            assert_eq!(answer.body["error"]["code"], "rate_limited");
            let retry: u64 = answer
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("a Retry-After in seconds");
            assert!((1..=60).contains(&retry), "{retry}");
        }
        statuses.push(answer.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // A replay is never limited, and another user has a rate of their own.
    let replay = app
        .post(
            "/v1/grants",
            Some(&alice.token),
            &report("wr_0", json!({WATER: "accept"})),
        )
        .await;
    assert_eq!(replay.status, 200, "{}", replay.body);
    assert_eq!(replay.body["grants"][0]["status"], "available");
    let other = app
        .post(
            "/v1/grants",
            Some(&bob.token),
            &report("wr_0", json!({WATER: "accept"})),
        )
        .await;
    assert_eq!(other.status, 200);

    let grants = app.items_of(&alice, "grant").await;
    assert_eq!(grants.len(), 3, "the limited reports stored nothing");
    assert_eq!(quota(&replay.body, WATER)["available"], 3);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unused_grants_are_capped_per_template_even_when_reports_race() {
    let app = onegrant_tests::spawn_app_with(&[("MAX_OPEN_GRANTS", "3")]).await;
    let alice = app.user("alice").await;
    let answers = join_all((0..10).map(|i| {
        let (app, alice) = (&app, &alice);
        async move {
            app.post(
                "/v1/grants",
                Some(&alice.token),
                &report(
                    &format!("wr_{i}"),
                    json!({WATER: "accept", ORDER: "accept"}),
                ),
            )
            .await
        }
    }))
    .await;
    let ok = answers.iter().filter(|a| a.status == 200).count();
    assert_eq!(ok, 3, "exactly the cap lands");
    for refused in answers.iter().filter(|a| a.status != 200) {
        assert_eq!(refused.status, 422, "{}", refused.body);
        assert_eq!(refused.body["error"]["code"], "grant_limit");
    }
    assert_eq!(
        app.items_of(&alice, "grant").await.len(),
        6,
        "3 reports × 2 templates"
    );

    // A check-in carrying a fourth grant is recorded; its grant is left out.
    let enabled = app.enable(&alice, "water").await;
    assert_eq!(enabled.body["state"], "scheduled");
    let checkin = json!({"action_id": "wc_1", "occurred_at": app.now().to_rfc3339(),
                         "current_count": 1, "daily_goal": 8,
                         "grant_request_id": "wr_ci", "subscription_status": "accept"});
    let answer = app
        .post("/v1/reminders/water/checkins", Some(&alice.token), &checkin)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["grant_limit"], true);
    assert_eq!(
        app.items_of(&alice, "action").await.len(),
        1,
        "the check-in is recorded"
    );
    assert!(
        app.item(&alice, &format!("GRANT#{WATER}#wr_ci"))
            .await
            .is_none()
    );
    let replay = app
        .post("/v1/reminders/water/checkins", Some(&alice.token), &checkin)
        .await;
    assert_eq!(replay.body, answer.body, "a replay answers the same");

    // Spending one makes room for one.
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": alice.openid, "template_id": WATER, "count": 3})),
    )
    .await;
    app.make_due(&alice, "water", app.now()).await;
    assert_eq!(app.tick(30).await.sent, 1);
    let more = app
        .post(
            "/v1/grants",
            Some(&alice.token),
            &report("wr_more", json!({WATER: "accept"})),
        )
        .await;
    assert_eq!(more.status, 200, "{}", more.body);
    let again = app
        .post(
            "/v1/grants",
            Some(&alice.token),
            &report("wr_again", json!({WATER: "accept"})),
        )
        .await;
    assert_eq!(again.status, 422);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_report_with_no_template_writes_nothing_and_counts_no_report() {
    // HTTP refuses it (`no_templates`); the store, called directly, records nothing —
    // not even the minute's report count.
    let app = spawn_app().await;
    let alice = app.user("alice").await;
    let openid = onegrant::domain::OpenId::parse(alice.openid.clone()).expect("openid");
    let report = onegrant::domain::GrantReport {
        request_id: onegrant::domain::RequestId::parse("wr_empty").expect("request id"),
        results: Default::default(),
    };
    let now = app.now();
    let recorded = app
        .deps
        .store
        .record_grants(&openid, &report, None, now)
        .await
        .expect("recorded");
    assert_eq!((recorded.grants.len(), recorded.written), (0, 0));
    let minute = now.timestamp().div_euclid(60);
    assert!(
        app.item(&alice, &onegrant::store::keys::rate_sk(minute))
            .await
            .is_none(),
        "no report counted"
    );
    assert!(app.items_of(&alice, "grant").await.is_empty());
}
