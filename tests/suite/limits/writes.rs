//! Per-user limits on every write route (`CHANGES_PER_MINUTE`, `REPORTS_PER_MINUTE`)
//! and on reads (`READS_PER_MINUTE`):
//! a request past the limit is refused with 429 and `Retry-After` before anything is
//! written, a request that changes nothing writes nothing, and one user's limit is not
//! another's. Writes are counted by the round-trip counter: every item a write request
//! names, whether it landed or not.

use futures::StreamExt;
use onegrant_tests::{Answer, ORDER, TestApp, User, WATER, assert_rate_limited, spawn_app_with};
use serde_json::{Value, json};

const LIMIT: usize = 10;

fn minute(app: &TestApp) -> i64 {
    app.now().timestamp().div_euclid(60)
}

async fn save(app: &TestApp, user: &User, body: &Value) -> Answer {
    app.call_retrying("PUT", "/v1/reminders/water", Some(&user.token), Some(body))
        .await
        .0
}

fn toggle(i: usize) -> Value {
    json!({"enabled": i.is_multiple_of(2)})
}

/// The history entries (audit trail) stored for `user`.
async fn history(app: &TestApp, user: &User) -> usize {
    app.items_of(user, "history").await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_settings_saves_in_a_minute_are_limited_and_refused_or_unchanged_ones_write_nothing()
 {
    let limit = LIMIT.to_string();
    let app = spawn_app_with(&[("CHANGES_PER_MINUTE", &limit)]).await;
    let alice = app.user("alice").await;
    let bob = app.user("bob").await;
    app.accept(&alice, WATER, "limits_grant").await;

    app.freeze_at_a_minute_start();
    let first = minute(&app);
    let entries_before = history(&app, &alice).await;
    app.round_trips.take_writes();
    // Turned on and off, one after another: each save changes the plan.
    let mut sent = 0;
    for i in 0..LIMIT {
        let answer = save(&app, &alice, &toggle(i)).await;
        assert_eq!(answer.status, 200, "save {i}: {}", answer.body);
        sent += 1;
    }
    let admitted_writes = app.round_trips.take_writes();
    assert!(
        !admitted_writes.is_empty(),
        "the admitted saves wrote their plans"
    );
    // The rest of the 500 at once, each a change of the plan as it stands (off).
    let on = json!({"enabled": true});
    let rest: Vec<Answer> = futures::stream::iter(sent..500)
        .map(|_| save(&app, &alice, &on))
        .buffer_unordered(16)
        .collect()
        .await;
    let refused_writes = app.round_trips.take_writes();
    // The clock is held in one minute: every save past the limit is refused.
    assert_eq!(minute(&app), first, "the test's minute is held");
    for answer in &rest {
        assert_rate_limited(answer, "a save past the limit");
    }
    assert!(
        refused_writes.is_empty(),
        "refused saves wrote {} items ({} write units): {:?}",
        refused_writes.len(),
        app.write_units(&refused_writes).await,
        refused_writes.iter().take(3).collect::<Vec<_>>()
    );
    // Saving what is stored changes nothing, writes nothing and is never refused:
    // the plan is off now (the last admitted save turned it off).
    assert!(
        LIMIT.is_multiple_of(2),
        "an even number of toggles ends off"
    );
    let plan = app.get("/v1/reminders/water", Some(&alice.token)).await;
    let enabled = plan.body["state"] != "disabled";
    assert!(!enabled, "{}", plan.body);
    app.round_trips.take_writes();
    for _ in 0..20 {
        let answer = save(&app, &alice, &json!({"enabled": enabled})).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["state"] != "disabled", enabled);
    }
    let unchanged = app.round_trips.take_writes();
    assert!(
        unchanged.is_empty(),
        "unchanged saves wrote {} items",
        unchanged.len()
    );
    // One history entry at most per admitted change (a change writes one; the
    // grant voided by the first turn-off rides in that save's entry).
    let entries = history(&app, &alice).await - entries_before;
    assert_eq!(entries, LIMIT, "one history entry per admitted save");
    // Another user's saves are their own.
    let other = save(&app, &bob, &json!({"enabled": true})).await;
    assert_eq!(other.status, 200, "{}", other.body);
}

#[tokio::test]
async fn reading_notifications_costs_one_read_when_nothing_changes_and_is_limited_when_it_does() {
    let limit = LIMIT.to_string();
    let app = spawn_app_with(&[("CHANGES_PER_MINUTE", &limit)]).await;
    let alice = app.user("alice").await;
    for i in 0..(LIMIT + 3) {
        let detail = json!({"idempotency_key": format!("n{i}"), "openid": alice.openid,
                            "type": "order", "title": "订单已发货", "body": "已发货"});
        app.notify(detail).await;
    }
    let listed = app
        .get("/v1/notifications?limit=100", Some(&alice.token))
        .await;
    let ids: Vec<String> = listed.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| n["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), LIMIT + 3);

    // A notification that does not exist: one read, no write.
    let missing = "1700000000000aaaaaaaaaaaa";
    app.round_trips.take();
    app.round_trips.take_writes();
    let answer = app
        .post(
            &format!("/v1/notifications/{missing}/read"),
            Some(&alice.token),
            &json!({}),
        )
        .await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    // (The caller admitted: no erasure.)
    assert_eq!(
        app.round_trips.take(),
        vec!["GetItem".to_string(), "BatchGetItem".to_string()]
    );
    assert!(app.round_trips.take_writes().is_empty());

    app.freeze_at_a_minute_start();
    let first = minute(&app);
    // The first LIMIT reads change something and are admitted…
    for id in ids.iter().take(LIMIT) {
        let path = format!("/v1/notifications/{id}/read");
        let answer = app.post(&path, Some(&alice.token), &json!({})).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["read"], true);
    }
    app.round_trips.take_writes();
    // …reading one of them again changes nothing: one read, no write, never refused…
    let again = app
        .post(
            &format!("/v1/notifications/{}/read", ids[0]),
            Some(&alice.token),
            &json!({}),
        )
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["read"], true);
    assert!(app.round_trips.take_writes().is_empty());
    assert_eq!(minute(&app), first, "the test's minute is held");
    // …and the next unread one, past the limit, is refused with nothing written,
    // as is a read-all.
    let path = format!("/v1/notifications/{}/read", ids[LIMIT]);
    let refused = app.post(&path, Some(&alice.token), &json!({})).await;
    assert_rate_limited(&refused, "a read past the limit");
    let all = app.read_all(&alice).await;
    assert_rate_limited(&all, "a read-all past the limit");
    assert!(app.round_trips.take_writes().is_empty());
    let unread = app
        .get("/v1/notifications/unread-count", Some(&alice.token))
        .await;
    assert_eq!(unread.body["unread"], 3, "{}", unread.body);
    // A read-all with nothing unread, later, writes nothing either.
    let bob = app.user("bob").await;
    let nothing = app.read_all(&bob).await;
    assert_eq!(nothing.status, 200, "{}", nothing.body);
    assert_eq!(nothing.body["updated"], 0);
    assert!(app.round_trips.take_changes().is_empty());
}

#[tokio::test]
async fn preferences_saves_are_limited_and_unchanged_ones_write_nothing() {
    let app = spawn_app_with(&[("CHANGES_PER_MINUTE", "3")]).await;
    let alice = app.user("alice").await;
    let put = |body: Value| {
        let app = &app;
        let token = alice.token.clone();
        async move {
            app.call_retrying("PUT", "/v1/preferences", Some(&token), Some(&body))
                .await
                .0
        }
    };
    app.freeze_at_a_minute_start();
    let first = minute(&app);
    app.round_trips.take_writes();
    for muted in ["a", "b", "c"] {
        let answer = put(json!({"quiet_hours": null, "muted_types": [muted]})).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert_eq!(
        app.round_trips.take_writes().len(),
        6,
        "three saves of two items each"
    );
    let same = put(json!({"quiet_hours": null, "muted_types": ["c"]})).await;
    assert_eq!(same.status, 200, "{}", same.body);
    assert_eq!(minute(&app), first, "the test's minute is held");
    let refused = put(json!({"quiet_hours": null, "muted_types": ["d"]})).await;
    assert_rate_limited(&refused, "a preferences save past the limit");
    let stored = app.get("/v1/preferences", Some(&alice.token)).await;
    assert_eq!(stored.body["muted_types"], json!(["c"]));
    assert!(app.round_trips.take_changes().is_empty());
}

#[tokio::test]
async fn a_report_past_the_limit_is_refused_before_any_transaction() {
    let app = spawn_app_with(&[("REPORTS_PER_MINUTE", "3")]).await;
    let alice = app.user("alice").await;
    app.freeze_at_a_minute_start();
    let first = minute(&app);
    for i in 0..3 {
        let report = json!({"request_id": format!("limit_{i}"), "results": {WATER: "accept"}});
        let answer = app.post("/v1/grants", Some(&alice.token), &report).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    app.round_trips.take();
    app.round_trips.take_writes();
    let report = json!({"request_id": "limit_3", "results": {WATER: "accept"}});
    let refused = app.post("/v1/grants", Some(&alice.token), &report).await;
    assert_eq!(minute(&app), first, "the test's minute is held");
    assert_rate_limited(&refused, "a report past the limit");
    let ops = app.round_trips.take();
    assert_eq!(
        ops,
        vec!["GetItem".to_string(), "BatchGetItem".to_string()],
        "the caller admitted, one read, no transaction"
    );
    assert!(app.round_trips.take_writes().is_empty());
    // A replay of an admitted report is never limited, and writes nothing.
    let replay = json!({"request_id": "limit_0", "results": {WATER: "accept"}});
    let answer = app.post("/v1/grants", Some(&alice.token), &replay).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// The user's standing choice for the water template, as the quotas show it.
async fn standing(app: &TestApp, user: &User) -> Value {
    let quotas = app.get("/v1/grants", Some(&user.token)).await;
    onegrant_tests::quota(&quotas.body, WATER)["standing"].clone()
}

#[tokio::test]
async fn a_report_refused_by_its_limit_or_a_conflict_leaves_its_standing_choice_unwritten() {
    let app = spawn_app_with(&[("REPORTS_PER_MINUTE", "3")]).await;
    let alice = app.user("alice").await;
    let reject = json!({"main_switch": true, "item_settings": {WATER: "reject"}});
    app.freeze_at_a_minute_start();
    let first = minute(&app);
    // A partly conflicting replay (the same request id: one template recorded with
    // another result, one new) carrying a setting that would change something: 409,
    // and the setting is not applied.
    let accepted = json!({"request_id": "wl_1", "results": {WATER: "accept"}});
    let answer = app.post("/v1/grants", Some(&alice.token), &accepted).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let conflicting = json!({"request_id": "wl_1", "results": {WATER: "reject", ORDER: "accept"},
                             "subscriptions_setting": reject});
    let answer = app
        .post("/v1/grants", Some(&alice.token), &conflicting)
        .await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert_eq!(standing(&app, &alice).await, Value::Null);
    // Two more reports fill the minute; a report carrying a setting is then refused
    // whole, its setting unwritten.
    accepted_reports(&app, &alice, &["wl_2", "wl_3"]).await;
    app.round_trips.take_writes();
    let carrying = json!({"request_id": "wl_4", "results": {WATER: "accept"},
                          "subscriptions_setting": reject});
    let answer = app.post("/v1/grants", Some(&alice.token), &carrying).await;
    assert_eq!(minute(&app), first, "the test's minute is held");
    assert_rate_limited(&answer, "a report carrying a setting past the limit");
    assert!(app.round_trips.take_writes().is_empty(), "nothing written");
    assert_eq!(standing(&app, &alice).await, Value::Null);
    // In the next minute the same report and its setting take one place together:
    // the setting rides on the report's own.
    app.advance(std::time::Duration::from_secs(60));
    let answer = app.post("/v1/grants", Some(&alice.token), &carrying).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(standing(&app, &alice).await, "reject");
    accepted_reports(&app, &alice, &["wl_5", "wl_6"]).await;
    let plain = json!({"request_id": "wl_7", "results": {WATER: "accept"}});
    let answer = app.post("/v1/grants", Some(&alice.token), &plain).await;
    assert_rate_limited(&answer, "the minute's three places taken by three reports");
}

/// Reports of a water grant, one per request id, each recorded.
async fn accepted_reports(app: &TestApp, user: &User, ids: &[&str]) {
    for id in ids {
        let body = json!({"request_id": id, "results": {WATER: "accept"}});
        let answer = app.post("/v1/grants", Some(&user.token), &body).await;
        assert_eq!(answer.status, 200, "{id}: {}", answer.body);
    }
}

/// Read calls are limited per user and minute too (issue 41 §11, `READS_PER_MINUTE`):
/// with a limit of 6, six reads across the read routes are answered, the seventh of
/// each route is 429 `rate_limited` with `Retry-After` and reads nothing; another user
/// is unaffected; the next minute reads again.
#[tokio::test]
async fn read_calls_are_limited_per_user_and_minute_and_a_refused_one_reads_nothing() {
    let app = spawn_app_with(&[("READS_PER_MINUTE", "6")]).await;
    let alice = app.user("alice").await;
    let bob = app.user("bob").await;
    let routes = [
        "/v1/notifications",
        "/v1/notifications?type=order&read=true",
        "/v1/notifications/unread-count",
        "/v1/preferences",
        "/v1/grants",
        "/v1/reminders/water",
    ];
    app.freeze_at_a_minute_start();
    for path in routes {
        let answer = app.get(path, Some(&alice.token)).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    }
    for path in routes {
        app.round_trips.take_items_read();
        let refused = app.get(path, Some(&alice.token)).await;
        assert_rate_limited(&refused, path);
        assert_eq!(
            app.round_trips.take_items_read(),
            0,
            "{path}: a refused read reads nothing"
        );
    }
    let theirs = app
        .get("/v1/notifications/unread-count", Some(&bob.token))
        .await;
    assert_eq!(theirs.status, 200, "another user's reads are their own");
    app.advance(std::time::Duration::from_secs(60));
    let next = app
        .get("/v1/notifications/unread-count", Some(&alice.token))
        .await;
    assert_eq!(next.status, 200, "the next minute: {}", next.body);
}
