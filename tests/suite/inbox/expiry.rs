//! Expiry: finished items carry `expires_at` and go after their retention (DynamoDB's
//! TTL, done here by `TestApp::ttl_pass`); open items never expire, and every counter
//! and invariant holds after the pass as before it.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Duration;
use onegrant_tests::{
    ORDER, TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_plans_consistent,
    attr_n, attr_s, spawn_app,
};
use serde_json::{Value, json};

type Item = HashMap<String, AttributeValue>;

/// Whether `item` is finished by its kind's own rules (what must carry `expires_at`).
fn finished(item: &Item) -> bool {
    let state = attr_s(item, "state");
    match attr_s(item, "kind") {
        Some("grant") => !matches!(state, Some("available" | "reserved")),
        Some("delivery") => !matches!(state, Some("claimed" | "sending")),
        Some("outbox") => !matches!(state, Some("pending" | "sending")),
        Some("note") => item.get("read").and_then(|v| v.as_bool().ok()) == Some(&true),
        Some("action" | "event" | "rate" | "history") => true,
        // An outcome still to be told is open; one given up is kept, then expires.
        Some("outcome") => item.contains_key("dead_at"),
        _ => false,
    }
}

async fn quotas(app: &TestApp, user: &User) -> Value {
    let answer = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body["quotas"].clone()
}

/// A user with every kind of finished item: consumed, invalid and refused grants, sent
/// deliveries, a sent push, a check-in, an ingested event, a read note, and open ones
/// beside them (an available grant, a scheduled plan, an unread note).
async fn history(app: &TestApp, name: &str) -> User {
    let user = app.scheduled_user(name, 3).await;
    let refused = app
        .post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": format!("wr_{name}_no"), "results": {ORDER: "reject"}}),
        )
        .await;
    assert_eq!(refused.status, 200, "{}", refused.body);
    app.accept(&user, ORDER, &format!("wr_{name}_order")).await;
    app.make_due(&user, "water", app.now()).await;
    let summary = app.tick(30).await;
    assert_eq!(summary.sent, 1, "{summary:?}");
    let checkin = json!({"action_id": format!("wc_{name}_1"), "occurred_at": app.now().to_rfc3339(),
                         "current_count": 1, "daily_goal": 8,
                         "grant_request_id": format!("wr_{name}_ci"), "subscription_status": "accept"});
    let answer = app
        .post("/v1/reminders/water/checkins", Some(&user.token), &checkin)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": user.openid, "template_id": WATER, "count": 1})),
    )
    .await;
    app.push(&user, &format!("push-{name}")).await;
    let summary = app.tick(30).await;
    assert_eq!(summary.sent, 1, "the push: {summary:?}");
    let note = app.items_of(&user, "note").await;
    let id = note
        .first()
        .and_then(|n| attr_s(n, "id"))
        .expect("the push's note");
    let read = app
        .call(
            "POST",
            &format!("/v1/notifications/{id}/read"),
            Some(&user.token),
            None,
        )
        .await;
    assert_eq!(read.status, 200);
    app.notify(
        json!({"idempotency_key": format!("unread-{name}"), "openid": user.openid,
                      "type": "system", "title": "t", "body": "b"}),
    )
    .await;
    user
}

#[tokio::test]
async fn finished_items_expire_after_their_retention_and_every_counter_still_holds() {
    let app = spawn_app().await;
    let alice = history(&app, "alice").await;
    // Bob disables his plan: his grants become invalid.
    let bob = app.scheduled_user("bob", 2).await;
    let off = app.disable(&bob, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);

    let before = app.items().await;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for item in &before {
        if finished(item) {
            assert!(
                attr_n(item, "expires_at").is_some(),
                "a finished item carries expires_at: {item:?}"
            );
            *kinds
                .entry(attr_s(item, "kind").unwrap_or_default().to_string())
                .or_default() += 1;
        } else {
            assert_eq!(
                attr_n(item, "expires_at"),
                None,
                "an open item never expires: {item:?}"
            );
        }
    }
    for kind in ["grant", "delivery", "outbox", "note", "action", "event"] {
        assert!(
            kinds.contains_key(kind),
            "the history has a finished {kind}: {kinds:?}"
        );
    }
    let (alice_quotas, bob_quotas) = (quotas(&app, &alice).await, quotas(&app, &bob).await);
    let alice_unread = app
        .get("/v1/notifications/unread-count", Some(&alice.token))
        .await;

    // A day later only the per-minute counters have gone (the reads just made counted
    // too); all of it after the longest retention.
    kinds.remove("rate").expect("report counters");
    let rates = app
        .items()
        .await
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("rate"))
        .count();
    assert_eq!(app.ttl_pass(app.now() + Duration::days(1)).await, rates);
    let removed = app.ttl_pass(app.now() + Duration::days(401)).await;
    assert_eq!(removed, kinds.values().sum::<usize>());
    let after = app.items().await;
    assert!(
        after.iter().all(|i| !finished(i)),
        "only open items are left"
    );

    assert_eq!(
        quotas(&app, &alice).await,
        alice_quotas,
        "quotas keep the totals"
    );
    assert_eq!(quotas(&app, &bob).await, bob_quotas);
    let unread = app
        .get("/v1/notifications/unread-count", Some(&alice.token))
        .await;
    assert_eq!(unread.body, alice_unread.body);
    assert_eq!(app.items_of(&alice, "unread").await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;

    // Life goes on: Alice's next reminder spends her next grant.
    let plan = app.get("/v1/reminders/water", Some(&alice.token)).await;
    assert_eq!(plan.body["state"], "scheduled", "{}", plan.body);
    app.make_due(&alice, "water", app.now()).await;
    assert_eq!(app.tick(30).await.sent, 1);
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn retention_is_per_kind_from_config() {
    let app = onegrant_tests::spawn_app_with(&[
        ("RETENTION_READ_NOTES_DAYS", "7"),
        ("RETENTION_DELIVERIES_DAYS", "10"),
    ])
    .await;
    let user = history(&app, "carol").await;
    assert!(
        app.ttl_pass(app.now() + Duration::hours(1)).await > 0,
        "report counters"
    );
    assert!(app.items_of(&user, "rate").await.is_empty());
    // Day 8: only the read note has gone.
    let removed = app.ttl_pass(app.now() + Duration::days(8)).await;
    assert_eq!(removed, 1);
    assert!(
        app.items_of(&user, "note")
            .await
            .iter()
            .all(|n| { n.get("read").and_then(|v| v.as_bool().ok()) == Some(&false) })
    );
    // Day 11: the deliveries too, nothing else.
    let deliveries = app.items_of(&user, "delivery").await.len();
    assert_eq!(deliveries, 2);
    assert_eq!(
        app.ttl_pass(app.now() + Duration::days(11)).await,
        deliveries
    );
    assert!(app.items_of(&user, "delivery").await.is_empty());
    assert!(!app.items_of(&user, "outbox").await.is_empty());
    assert_ledger_agrees_with_counters(&app).await;
}

/// Every kind's retention is its own setting: with six different ones, each pass of
/// DynamoDB's TTL a day past one of them removes exactly the finished items of that
/// kind (the audit trail's entries go with the grants), and the counters still hold.
#[tokio::test]
async fn each_kind_goes_after_its_own_retention_and_no_other() {
    let app = onegrant_tests::spawn_app_with(&[
        ("RETENTION_READ_NOTES_DAYS", "7"),
        ("RETENTION_DELIVERIES_DAYS", "10"),
        ("RETENTION_OUTBOX_DAYS", "13"),
        ("RETENTION_ACTIONS_DAYS", "16"),
        // Longer than the others: an event's record with a push outlives the push's
        // last moment (a day past 30 days after its publication).
        ("RETENTION_EVENTS_DAYS", "32"),
        ("RETENTION_GRANTS_DAYS", "22"),
    ])
    .await;
    let user = history(&app, "dave").await;
    let quotas_before = quotas(&app, &user).await;
    let finished_of = |items: &[Item], kinds: &[&str]| {
        items
            .iter()
            .filter(|i| finished(i) && kinds.contains(&attr_s(i, "kind").unwrap_or_default()))
            .count()
    };
    assert!(app.ttl_pass(app.now() + Duration::hours(1)).await > 0);
    assert!(
        app.items_of(&user, "rate").await.is_empty(),
        "report counters"
    );
    for (day, kinds) in [
        (8, &["note"][..]),
        (11, &["delivery"]),
        (14, &["outbox"]),
        (17, &["action"]),
        (23, &["grant", "history"]),
        (33, &["event"]),
    ] {
        let before = app.items().await;
        let due = finished_of(&before, kinds);
        assert!(due > 0, "day {day}: the history has finished {kinds:?}");
        // A day short of it, nothing of these goes.
        assert_eq!(
            app.ttl_pass(app.now() + Duration::days(day - 2)).await,
            0,
            "day {}: nothing is due yet",
            day - 2
        );
        assert_eq!(
            app.ttl_pass(app.now() + Duration::days(day)).await,
            due,
            "day {day}: exactly the finished {kinds:?}"
        );
        assert_eq!(finished_of(&app.items().await, kinds), 0, "day {day}");
    }
    assert!(
        app.items().await.iter().all(|i| !finished(i)),
        "only open items are left"
    );
    assert_eq!(
        quotas(&app, &user).await,
        quotas_before,
        "quotas keep the totals"
    );
    assert_ledger_agrees_with_counters(&app).await;
    assert_plans_consistent(&app).await;
}
