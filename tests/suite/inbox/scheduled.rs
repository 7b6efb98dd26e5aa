//! Scheduled and expiring pushes: a notification with `send_at` ahead is neither
//! listed, counted nor sent before then, and appears and goes out at that instant
//! through the due index and the ordinary claim; a push not gone out by its
//! `expires_at` is never sent and spends no grant.

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Duration, Utc};
use onegrant_tests::inbox::{at, scheduled};
use onegrant_tests::{
    ORDER, TestApp, User, assert_ledger_agrees_with_counters, attr_s, spawn_app, spawn_app_with,
};
use serde_json::{Value, json};

async fn page(app: &TestApp, user: &User) -> Vec<Value> {
    let answer = app.get("/v1/notifications", Some(&user.token)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body["items"].as_array().cloned().unwrap_or_default()
}

async fn unread(app: &TestApp, user: &User) -> u64 {
    app.get("/v1/notifications/unread-count", Some(&user.token))
        .await
        .body["unread"]
        .as_u64()
        .expect("unread")
}

#[tokio::test]
async fn a_push_scheduled_ahead_is_not_listed_counted_or_sent_before_its_send_at_and_goes_out_then()
{
    let app = spawn_app().await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    let send_at = app.now() + Duration::seconds(20);
    let answer = app
        .notify(scheduled(&user, "appt-1", json!({"send_at": at(send_at)})))
        .await;
    assert_eq!(
        (answer["status"].as_str(), answer["push"].as_str()),
        (Some("created"), Some("pending")),
        "{answer}"
    );
    let given = DateTime::parse_from_rfc3339(answer["send_at"].as_str().expect("send_at"))
        .expect("an RFC 3339 send_at");
    assert_eq!(given.timestamp_millis(), send_at.timestamp_millis());
    // Kept aside, on the due index: no notification, marker, counter or outbox yet.
    let kept = app.items_of(&user, "scheduled").await;
    assert_eq!(kept.len(), 1);
    assert!(kept[0].contains_key("due_pk"), "on the due index");
    assert!(app.items_of(&user, "note").await.is_empty());
    assert!(app.items_of(&user, "unread").await.is_empty());
    assert!(app.items_of(&user, "outbox").await.is_empty());

    // The dispatcher (its lookahead covers the instant) waits for it; meanwhile the
    // inbox still shows nothing. The clock is held short of the instant while the test
    // looks, however slow the machine, then moved to it.
    app.clock.freeze_at(send_at - Duration::seconds(10));
    let watch = async {
        let seen = (page(&app, &user).await.len(), unread(&app, &user).await);
        let sent = app.deliveries().await.len();
        app.clock.set(send_at);
        app.clock.run();
        (seen, sent)
    };
    let (summary, (seen, sent_before)) = tokio::join!(app.tick(60), watch);
    assert_eq!((seen, sent_before), ((0, 0), 0), "nothing before send_at");
    assert_eq!(
        (summary.published, summary.sent, summary.expired),
        (1, 1, 0),
        "{summary:?}"
    );

    // Claimed at the instant, not before.
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(delivery.len(), 1);
    let claimed_at =
        DateTime::parse_from_rfc3339(attr_s(&delivery[0], "claimed_at").expect("claimed_at"))
            .expect("time")
            .with_timezone(&Utc);
    assert!(claimed_at >= send_at, "claimed {claimed_at}, due {send_at}");
    println!(
        "scheduled push claimed {} ms after its send_at",
        (claimed_at - send_at).num_milliseconds()
    );
    assert_eq!(app.deliveries().await.len(), 1);
    let items = page(&app, &user).await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["push"]["status"], "sent");
    let created =
        DateTime::parse_from_rfc3339(items[0]["created_at"].as_str().expect("created_at"))
            .expect("time");
    assert_eq!(
        created.timestamp_millis(),
        send_at.timestamp_millis(),
        "it appears at its send_at"
    );
    assert_eq!(unread(&app, &user).await, 1);
    assert!(app.items_of(&user, "scheduled").await.is_empty());
    // One grant, one send: none left.
    assert_eq!(app.available(&user, ORDER).await, 0);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_scheduled_notification_without_a_push_appears_at_its_send_at() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let send_at = app.now() + Duration::seconds(4);
    let answer = app
        .notify(
            json!({"idempotency_key": "note-1", "openid": user.openid, "type": "news",
                       "title": "明日课程", "send_at": at(send_at)}),
        )
        .await;
    assert_eq!(answer["status"], "created", "{answer}");
    assert_eq!(answer["push"], Value::Null);
    assert_eq!(
        (page(&app, &user).await.len(), unread(&app, &user).await),
        (0, 0)
    );
    let summary = app.tick(30).await;
    assert_eq!((summary.published, summary.claimed), (1, 0), "{summary:?}");
    let items = page(&app, &user).await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["push"], Value::Null);
    assert_eq!(unread(&app, &user).await, 1);
    // Marking it read works as for any other.
    let id = items[0]["id"].as_str().expect("id");
    let read = app
        .post(
            &format!("/v1/notifications/{id}/read"),
            Some(&user.token),
            &json!({}),
        )
        .await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(unread(&app, &user).await, 0);
}

#[tokio::test]
async fn a_push_not_gone_out_by_its_expires_at_is_never_sent_and_spends_no_grant() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.hold_clock();
    let now = app.now();
    // Due now, expiring in 2 s — but no dispatcher runs until it has expired.
    let immediate = app
        .notify(scheduled(
            &user,
            "late-1",
            json!({"expires_at": at(now + Duration::seconds(2))}),
        ))
        .await;
    assert_eq!(immediate["push"], "pending", "{immediate}");
    // Scheduled, expiring before its send_at: expired from the start.
    let hopeless = app
        .notify(scheduled(
            &user,
            "late-2",
            json!({"send_at": at(now + Duration::seconds(3)), "expires_at": at(now + Duration::seconds(1))}),
        ))
        .await;
    assert_eq!(hopeless["push"], "expired", "{hopeless}");
    // Scheduled, expiring 1 s after its send_at — but the dispatcher comes later.
    app.notify(scheduled(
        &user,
        "late-3",
        json!({"send_at": at(now + Duration::seconds(3)), "expires_at": at(now + Duration::seconds(4))}),
    ))
    .await;
    app.let_clock_run();
    app.move_to(now + Duration::milliseconds(4500));
    let summary = app.tick(30).await;
    assert_eq!(
        (
            summary.published,
            summary.expired,
            summary.claimed,
            summary.sent
        ),
        (2, 2, 0, 0),
        "{summary:?}"
    );
    assert!(app.deliveries().await.is_empty(), "nothing sent");
    let items = page(&app, &user).await;
    assert_eq!(items.len(), 3, "every notification stays");
    assert!(
        items
            .iter()
            .all(|n| n["push"]["status"] == "expired" && n["push"]["reason"].is_null()),
        "{items:?}"
    );
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(
        outbox.len(),
        2,
        "expired at a claim or at publication: an outbox item each (none for the one expired at ingest)"
    );
    for push in &outbox {
        assert_eq!(attr_s(push, "state"), Some("expired"));
        assert!(!push.contains_key("due_pk"), "off the due index");
    }
    // Each expiry has its cause in the audit trail.
    let history = app.items_of(&user, "history").await;
    let expired_by_dispatcher = history
        .iter()
        .filter(|h| attr_s(h, "cause") == Some("dispatcher"))
        .filter(|h| format!("{h:?}").contains("expired"))
        .count();
    assert_eq!(expired_by_dispatcher, 2, "{history:?}");
    assert_eq!(
        app.available(&user, ORDER).await,
        1,
        "the grant is untouched"
    );
    assert!(
        app.items_of(&user, "grant")
            .await
            .iter()
            .all(|g| attr_s(g, "state") == Some("available"))
    );
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn bad_timings_are_refused_with_their_reason_and_store_nothing() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let now = app.now();
    let cases = [
        (
            json!({"send_at": at(now + Duration::days(31))}),
            "more than 30 days ahead",
        ),
        (
            json!({"send_at": "2026-12-24 09:00"}),
            "send_at must be an RFC 3339 time",
        ),
        (
            json!({"send_at": "2026-12-24T09:00:00"}),
            "send_at must be an RFC 3339 time",
        ),
        (
            json!({"send_at": 1_800_000_000}),
            "send_at must be an RFC 3339 time",
        ),
        (
            json!({"expires_at": "tonight"}),
            "expires_at must be an RFC 3339 time",
        ),
        (json!({"priority": "urgent"}), "priority must be"),
        (json!({"priority": true}), "priority must be"),
    ];
    for (i, (extra, reason)) in cases.iter().enumerate() {
        let answer = app
            .notify(scheduled(&user, &format!("bad-{i}"), extra.clone()))
            .await;
        assert_eq!(answer["status"], "invalid", "{extra}: {answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.contains(reason)),
            "{extra}: {answer}"
        );
    }
    let user_pk = format!("USER#{}", user.openid);
    let stored: Vec<_> = app
        .items()
        .await
        .into_iter()
        .filter(|i| attr_s(i, "pk").is_some_and(|pk| pk == user_pk || pk.starts_with("EVENT#")))
        .collect();
    assert!(stored.is_empty(), "nothing stored: {stored:?}");
}

#[tokio::test]
async fn the_same_scheduled_event_again_is_a_duplicate_and_another_send_at_under_its_key_a_conflict()
 {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let send_at = at(app.now() + Duration::hours(1));
    let detail = scheduled(
        &user,
        "dup-1",
        json!({"send_at": send_at, "priority": "high"}),
    );
    let first = app.notify(detail.clone()).await;
    let again = app.notify(detail).await;
    assert_eq!(first["status"], "created", "{first}");
    assert_eq!(
        (again["status"].as_str(), again["note_id"].as_str()),
        (Some("duplicate"), first["note_id"].as_str()),
        "{again}"
    );
    let moved = app
        .notify(scheduled(
            &user,
            "dup-1",
            json!({"send_at": at(app.now() + Duration::hours(2)), "priority": "high"}),
        ))
        .await;
    assert_eq!(moved["status"], "conflict", "{moved}");
    let kept = app.items_of(&user, "scheduled").await;
    assert_eq!(kept.len(), 1);
    // An hour ahead: a tick now leaves it alone.
    let summary = app.tick(5).await;
    assert_eq!((summary.published, summary.due), (0, 0), "{summary:?}");
    assert_eq!(page(&app, &user).await.len(), 0);
}

#[tokio::test]
async fn a_cancelled_push_is_never_sent_and_spends_no_grant_whether_scheduled_or_due_now() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.hold_clock();
    let soon = at(app.now() + Duration::seconds(2));
    app.notify(scheduled(&user, "later", json!({"send_at": soon})))
        .await;
    app.let_clock_run();
    app.notify(scheduled(&user, "now", json!({}))).await;
    for key in ["later", "now"] {
        let answer = app.cancel(&user, key).await;
        assert_eq!(answer["status"], "cancelled", "{key}: {answer}");
        let again = app.cancel(&user, key).await;
        assert_eq!(again["status"], "already", "{key}: {again}");
    }
    app.advance(std::time::Duration::from_millis(2500));
    let summary = app.tick(30).await;
    assert_eq!((summary.published, summary.claimed), (1, 0), "{summary:?}");
    assert!(app.deliveries().await.is_empty(), "nothing sent");
    let items = page(&app, &user).await;
    assert_eq!(items.len(), 2, "both notifications stay");
    assert!(
        items.iter().all(|n| n["push"]["status"] == "cancelled"),
        "{items:?}"
    );
    assert_eq!(
        app.available(&user, ORDER).await,
        1,
        "the grant is untouched"
    );
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(outbox.len(), 1);
    assert_eq!(attr_s(&outbox[0], "state"), Some("cancelled"));
    // Both cancels have their cause in the audit trail.
    let history = app.items_of(&user, "history").await;
    for key in ["later", "now"] {
        let cause = format!("cancel tests:{key}");
        assert!(
            history
                .iter()
                .any(|h| attr_s(h, "cause") == Some(cause.as_str())
                    && format!("{h:?}").contains("cancelled")),
            "{cause}: {history:?}"
        );
    }
    assert!(!outbox[0].contains_key("due_pk"), "off the due index");
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_cancel_before_its_notification_still_cancels_it_and_one_after_the_send_is_too_late() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    // EventBridge does not order events: the cancel comes first.
    let early = app.cancel(&user, "first").await;
    assert_eq!(early["status"], "early", "{early}");
    assert_eq!(app.cancel(&user, "first").await["status"], "early");
    let late_event = app.notify(scheduled(&user, "first", json!({}))).await;
    assert_eq!(
        (late_event["status"].as_str(), late_event["push"].as_str()),
        (Some("created"), Some("cancelled")),
        "{late_event}"
    );
    // The same event again is a duplicate of what was stored, not a new push.
    let again = app.notify(scheduled(&user, "first", json!({}))).await;
    assert_eq!(again["status"], "duplicate", "{again}");
    assert!(
        app.items_of(&user, "outbox").await.is_empty(),
        "no push to send"
    );
    // A push that went out: the cancel is too late and changes nothing.
    app.notify(scheduled(&user, "sent", json!({}))).await;
    let summary = app.tick(30).await;
    assert_eq!(summary.sent, 1, "{summary:?}");
    let too_late = app.cancel(&user, "sent").await;
    assert_eq!(
        (too_late["status"].as_str(), too_late["push"].as_str()),
        (Some("too_late"), Some("sent")),
        "{too_late}"
    );
    let items = page(&app, &user).await;
    let statuses: Vec<&str> = items
        .iter()
        .filter_map(|n| n["push"]["status"].as_str())
        .collect();
    assert_eq!(statuses.len(), 2);
    assert!(
        statuses.contains(&"sent") && statuses.contains(&"cancelled"),
        "{statuses:?}"
    );
    let record = app
        .items()
        .await
        .into_iter()
        .find(|i| attr_s(i, "pk") == Some("EVENT#tests#sent"))
        .expect("the event's record");
    assert_eq!(
        attr_s(&record, "cancel"),
        Some("too_late"),
        "recorded as too late"
    );
    assert_eq!(app.deliveries().await.len(), 1);
    assert_eq!(app.available(&user, ORDER).await, 0, "one grant, one send");
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn cancels_without_their_essentials_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    app.notify(scheduled(&user, "k", json!({}))).await;
    let cases = [
        (
            json!({"openid": user.openid}),
            "idempotency_key is required",
        ),
        (json!({"idempotency_key": "k"}), "openid is required"),
        (
            json!({"idempotency_key": "k#1", "openid": user.openid}),
            "may not contain '#'",
        ),
        (
            json!({"idempotency_key": "k", "openid": 1}),
            "openid must be a string",
        ),
        (json!("k"), "detail must be a JSON object"),
    ];
    for (detail, reason) in &cases {
        let answer = app
            .notify_as("tests", "onegrant.cancel", detail.clone())
            .await;
        assert_eq!(answer["status"], "invalid", "{detail}: {answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.contains(reason)),
            "{detail}: {answer}"
        );
    }
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(attr_s(&outbox[0], "state"), Some("pending"), "still due");
    assert_eq!(
        app.items()
            .await
            .iter()
            .filter(|i| attr_s(i, "pk").is_some_and(|pk| pk.starts_with("EVENT#")))
            .count(),
        1,
        "no record, no mark"
    );
}

#[tokio::test]
async fn a_newer_notification_with_the_same_collapse_key_replaces_a_push_that_has_not_gone_out() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.accept(&user, ORDER, "wr_2").await;
    let key = json!({"collapse_key": "order-7"});
    app.notify(scheduled(&user, "shipped", key.clone())).await;
    app.notify(scheduled(&user, "out-for-delivery", key.clone()))
        .await;
    let summary = app.tick(30).await;
    assert_eq!((summary.sent, summary.claimed), (1, 1), "{summary:?}");
    // Gone out already: a newer one does not touch it.
    app.notify(scheduled(&user, "delivered", key.clone())).await;
    let summary = app.tick(30).await;
    assert_eq!(summary.sent, 1, "{summary:?}");
    let states = app.outbox_states(&user).await;
    assert_eq!(
        states,
        [
            ("shipped", "replaced"),
            ("out-for-delivery", "sent"),
            ("delivered", "sent")
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let items = page(&app, &user).await;
    assert_eq!(items.len(), 3, "every notification stays in the inbox");
    assert_eq!(
        items
            .iter()
            .filter(|n| n["push"]["status"] == "replaced")
            .count(),
        1
    );
    assert_eq!(app.deliveries().await.len(), 2);
    assert_eq!(
        app.available(&user, ORDER).await,
        0,
        "two grants, two sends"
    );
    // Another publisher's key of the same name is another key.
    app.accept(&user, ORDER, "wr_3").await;
    app.notify_as(
        "com.example.shop",
        "onegrant.notification",
        scheduled(&user, "theirs", key.clone()),
    )
    .await;
    app.notify(scheduled(&user, "ours", key)).await;
    let states = app.outbox_states(&user).await;
    assert_eq!(
        (states["theirs"].as_str(), states["ours"].as_str()),
        ("pending", "pending")
    );
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_scheduled_push_is_replaced_before_its_send_at_and_ten_at_once_leave_exactly_one() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    let later = at(app.now() + Duration::hours(1));
    app.notify(scheduled(
        &user,
        "tomorrow",
        json!({"collapse_key": "k", "send_at": later}),
    ))
    .await;
    app.notify(scheduled(&user, "today", json!({"collapse_key": "k"})))
        .await;
    let kept = app.items_of(&user, "scheduled").await;
    assert_eq!(kept.len(), 1);
    assert!(!kept[0].contains_key("push"), "its push is gone: {kept:?}");
    // Ten events of one key at once: one push waits, nine are replaced.
    let events: Vec<Value> = (0..10)
        .map(|i| {
            scheduled(
                &user,
                &format!("burst-{i}"),
                json!({"collapse_key": "burst"}),
            )
        })
        .collect();
    let answers = futures::future::join_all(events.into_iter().map(|e| app.notify(e))).await;
    assert!(
        answers.iter().all(|a| a["status"] == "created"),
        "{answers:?}"
    );
    let states = app.outbox_states(&user).await;
    let burst: Vec<&String> = states
        .iter()
        .filter(|(k, _)| k.starts_with("burst-"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(burst.len(), 10);
    assert_eq!(
        burst.iter().filter(|s| s.as_str() == "pending").count(),
        1,
        "{states:?}"
    );
    assert_eq!(
        burst.iter().filter(|s| s.as_str() == "replaced").count(),
        9,
        "{states:?}"
    );
    let summary = app.tick(30).await;
    // "today" and the last of the burst are due; one grant: one sent, one waits for
    // another.
    assert_eq!((summary.sent, summary.grant_waits), (1, 1), "{summary:?}");
    assert_eq!(app.deliveries().await.len(), 1);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn bad_collapse_keys_are_refused_and_store_nothing() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    for (i, bad) in [
        json!(""),
        json!("a#b"),
        json!("k".repeat(129)),
        json!(7),
        json!("tab\tkey"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = app
            .notify(scheduled(
                &user,
                &format!("bad-{i}"),
                json!({"collapse_key": bad}),
            ))
            .await;
        assert_eq!(answer["status"], "invalid", "{bad}: {answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.contains("collapse_key")),
            "{bad}: {answer}"
        );
    }
    assert!(app.items_of(&user, "note").await.is_empty());
    assert!(app.items_of(&user, "collapse").await.is_empty());
}

#[tokio::test]
async fn a_user_with_1000_scheduled_pushes_costs_an_idle_tick_nothing_and_a_cancel_a_bounded_few_items()
 {
    let app = spawn_app().await;
    let user = app.user("planner").await;
    // The first tick registers the shard count: not part of what is compared.
    app.tick(5).await;
    app.round_trips.take();
    app.round_trips.take_items_read();
    let idle = app.tick(5).await;
    let before = (
        app.round_trips.take().len(),
        app.round_trips.take_items_read(),
    );
    assert_eq!(idle.due, 0, "{idle:?}");
    let start = app.now() + Duration::hours(1);
    // Three through notify; a thousand more like them written straight to the table
    // (25 to a request, so this test does not hold the shared emulator for long).
    for i in 0..3 {
        let send_at = at(start + Duration::seconds(i));
        let answer = app
            .notify(scheduled(
                &user,
                &format!("many-{i}"),
                json!({"send_at": send_at}),
            ))
            .await;
        assert_eq!(answer["status"], "created", "{answer}");
    }
    let model = app.items_of(&user, "scheduled").await.remove(0);
    let copies: Vec<_> = (0..1000)
        .map(|i| {
            let mut item = model.clone();
            let id = format!("{:013}{:012x}", start.timestamp_millis() + 10_000 + i, i);
            item.insert("sk".into(), AttributeValue::S(format!("SCHEDULED#{id}")));
            item.insert(
                "due_at".into(),
                AttributeValue::N((start.timestamp_millis() + 10_000 + i).to_string()),
            );
            item
        })
        .collect();
    app.put_items(copies).await;
    assert_eq!(app.items_of(&user, "scheduled").await.len(), 1003);
    app.round_trips.take();
    app.round_trips.take_items_read();
    let tick = app.tick(5).await;
    let after = (
        app.round_trips.take().len(),
        app.round_trips.take_items_read(),
    );
    assert_eq!((tick.due, tick.published), (0, 0), "{tick:?}");
    assert_eq!(
        after, before,
        "an idle tick's requests and items read, with and without them"
    );
    // A cancel of one of them: its event's record and its scheduled item.
    app.round_trips.take_writes();
    let cancelled = app.cancel(&user, "many-1").await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let requests = app.round_trips.take();
    let read = app.round_trips.take_items_read();
    let written = app.round_trips.take_writes();
    assert!(read <= 3, "a cancel read {read} items: {requests:?}");
    // The scheduled item, the event's record, the history entry and the outcome
    // (`cancelled`, told to its publisher).
    assert_eq!(written.len(), 4, "a cancel wrote {} items", written.len());
    // The inbox shows none of them yet.
    assert_eq!(page(&app, &user).await.len(), 0);
    assert_eq!(unread(&app, &user).await, 0);
}

/// Round trips and write units (DynamoDB's rules) of what ran since the last take.
async fn cost(app: &TestApp) -> (usize, usize) {
    let trips = app.round_trips.take().len();
    let writes = app.round_trips.take_writes();
    (trips, app.write_units(&writes).await)
}

#[tokio::test]
async fn a_scheduled_push_costs_its_publication_more_than_an_immediate_one() {
    let app = spawn_app_with(&[("AUDIT_TRAIL", "false")]).await;
    let user = app.user("costs").await;
    app.round_trips.take();
    app.round_trips.take_writes();
    app.notify(scheduled(&user, "now", json!({}))).await;
    let immediate = cost(&app).await;
    app.hold_clock();
    let send_at = app.now() + Duration::seconds(1);
    let answer = app
        .notify(scheduled(&user, "later", json!({"send_at": at(send_at)})))
        .await;
    app.let_clock_run();
    let ingest = cost(&app).await;
    let note_id = answer["note_id"].as_str().expect("note id");
    let published = app
        .deps
        .store
        .publish(
            &format!("USER#{}", user.openid),
            &format!("SCHEDULED#{note_id}"),
            DateTime::parse_from_rfc3339(answer["send_at"].as_str().expect("send_at"))
                .expect("time")
                .with_timezone(&Utc),
            app.now(),
        )
        .await
        .expect("published");
    assert_eq!(
        published,
        onegrant::store::inbox::Published::Done {
            push: true,
            expired: false
        }
    );
    let publish = cost(&app).await;
    println!(
        "immediate push ingest: {} round trips, {} WRU; scheduled: ingest {} / {}, publication {} / {}",
        immediate.0, immediate.1, ingest.0, ingest.1, publish.0, publish.1
    );
    // Both end as the same notification, marker, counter and outbox item: the
    // scheduled one adds its own item's put and delete (2 transactional writes) and
    // the publication's read and transaction.
    assert_eq!(
        (ingest.0 + publish.0, ingest.1 + publish.1),
        (immediate.0 + 2, immediate.1 + 4),
        "immediate {immediate:?}, ingest {ingest:?}, publication {publish:?}"
    );
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(outbox.len(), 2, "both pushes wait in the outbox alike");
}

/// Deletes `user`'s item `sk` straight from the table (as DynamoDB's TTL would).
async fn remove(app: &TestApp, user: &User, sk: &str) {
    app.table
        .client
        .delete_item()
        .table_name(&app.table.name)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("USER#{}", user.openid)),
        )
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::S(sk.to_string()),
        )
        .send()
        .await
        .expect("delete");
}

#[tokio::test]
async fn a_cancel_during_an_attempt_that_then_fails_cancels_the_retry_and_one_that_succeeds_is_too_late_after()
 {
    // (A client timeout far past the test's own steps: the send is held in flight by
    // the stand-in until the cancel has landed, not by a latency the machine's speed
    // could outrun; ticks of 120 s, room for a 10 s send's window.)
    let app = spawn_app_with(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DISPATCH_RETRY_BASE_SECONDS", "1"),
        ("WECHAT_TIMEOUT_MS", "10000"),
    ])
    .await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.accept(&user, ORDER, "wr_2").await;
    for (key, fails) in [("flaky", true), ("fine", false)] {
        app.notify(scheduled(&user, key, json!({}))).await;
        if fails {
            app.control(
                "POST",
                "faults",
                Some(json!({"openid": user.openid, "errcode": 45011, "times": 1})),
            )
            .await;
        }
        // WeChat holds the send: the cancel lands while the attempt is in flight.
        app.hold_sends(&user.openid, true).await;
        let cancel_in_flight = async {
            app.until_in_flight(&user, key).await;
            let answer = app.cancel(&user, key).await;
            app.hold_sends(&user.openid, false).await;
            answer
        };
        let (summary, answer) = tokio::join!(app.tick(120), cancel_in_flight);
        assert_eq!(
            (answer["status"].as_str(), answer["push"].as_str()),
            (Some("requested"), Some("pending")),
            "{key}: {answer}"
        );
        if fails {
            assert_eq!((summary.failed, summary.restored), (1, 1), "{summary:?}");
            app.advance(std::time::Duration::from_millis(1100));
            let retry = app.tick(120).await;
            assert_eq!(
                (retry.cancelled, retry.claimed, retry.sent),
                (1, 0, 0),
                "{retry:?}"
            );
            assert_eq!(app.outbox_states(&user).await[key], "cancelled");
        } else {
            assert_eq!(summary.sent, 1, "{summary:?}");
            assert_eq!(app.outbox_states(&user).await[key], "sent");
            let after = app.cancel(&user, key).await;
            assert_eq!(after["status"], "too_late", "{after}");
        }
    }
    assert_eq!(
        app.deliveries().await.len(),
        1,
        "only the attempt that went out"
    );
    assert_eq!(
        app.available(&user, ORDER).await,
        1,
        "the cancelled push spent nothing"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// A newer notification of the same `collapse_key` arriving while the older push's
/// attempt is in flight: that attempt is not stopped, but the replacement is recorded
/// on the older notification; when the attempt ends retryable (45011, -1), the retry's
/// claim ends the older push `replaced`, nothing sent and its grant kept, and only the
/// newer one goes out (code that left an in-flight push alone sent both, two grants).
#[tokio::test]
async fn a_push_replaced_while_its_attempt_is_in_flight_is_not_sent_when_that_attempt_fails() {
    for errcode in [45011, -1] {
        // (A client timeout far past the test's own steps: the send is held in flight
        // by the stand-in until the newer one is in, not by a latency the machine's
        // speed could outrun; ticks of 120 s, room for a 10 s send's window.)
        let app = spawn_app_with(&[
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
            ("DISPATCH_RETRY_BASE_SECONDS", "1"),
            ("WECHAT_TIMEOUT_MS", "10000"),
        ])
        .await;
        let user = app.user("alice").await;
        app.accept(&user, ORDER, "wr_1").await;
        app.accept(&user, ORDER, "wr_2").await;
        let key = json!({"collapse_key": "order-7"});
        app.notify(scheduled(&user, "shipped", key.clone())).await;
        app.control(
            "POST",
            "faults",
            Some(json!({"openid": user.openid, "errcode": errcode, "times": 1})),
        )
        .await;
        // WeChat holds the send: the newer one comes meanwhile.
        app.hold_sends(&user.openid, true).await;
        let replace_in_flight = async {
            app.until_in_flight(&user, "shipped").await;
            let answer = app.notify(scheduled(&user, "delivered", key.clone())).await;
            app.hold_sends(&user.openid, false).await;
            answer
        };
        let (first, answer) = tokio::join!(app.tick(120), replace_in_flight);
        assert_eq!(answer["status"], "created", "{errcode}: {answer}");
        assert_eq!(first.failed, 1, "{errcode}: {first:?}");
        // The retry is due a second later; the newer push goes out as it comes.
        app.advance(std::time::Duration::from_millis(1100));
        let retry = app.tick(120).await;
        assert_eq!(
            first.replaced + retry.replaced,
            1,
            "{errcode}: {first:?} {retry:?}"
        );
        assert_eq!(first.sent + retry.sent, 1, "{errcode}: {first:?} {retry:?}");
        let states = app.outbox_states(&user).await;
        assert_eq!(
            (states["shipped"].as_str(), states["delivered"].as_str()),
            ("replaced", "sent"),
            "{errcode}"
        );
        let sent: Vec<Value> = app.deliveries().await;
        let numbers: Vec<&str> = sent
            .iter()
            .filter_map(|d| d["data"]["character_string1"]["value"].as_str())
            .collect();
        assert_eq!(numbers, ["delivered"], "{errcode}: only the newer went out");
        let items = page(&app, &user).await;
        let status = |title_key: &str| {
            items
                .iter()
                .find(|n| n["body"].as_str() == Some(&format!("预约 {title_key}")))
                .map(|n| n["push"]["status"].clone())
        };
        assert_eq!(status("shipped"), Some(json!("replaced")), "{errcode}");
        assert_eq!(status("delivered"), Some(json!("sent")), "{errcode}");
        assert_eq!(
            app.available(&user, ORDER).await,
            1,
            "{errcode}: one grant kept"
        );
        // Nothing comes due again.
        app.advance(std::time::Duration::from_secs(120));
        let later = app.tick(120).await;
        assert_eq!((later.claimed, later.sent), (0, 0), "{errcode}: {later:?}");
        assert_ledger_agrees_with_counters(&app).await;
    }
}

#[tokio::test]
async fn an_older_notification_removed_by_retention_never_blocks_a_replacement_or_a_cancel() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    let key = json!({"collapse_key": "thread"});
    let older = app.notify(scheduled(&user, "older", key.clone())).await;
    remove(
        &app,
        &user,
        &format!("NOTE#{}", older["note_id"].as_str().expect("id")),
    )
    .await;
    let newer = app.notify(scheduled(&user, "newer", key)).await;
    assert_eq!(newer["status"], "created", "{newer}");
    assert_eq!(app.outbox_states(&user).await["older"], "replaced");
    let lone = app.notify(scheduled(&user, "lone", json!({}))).await;
    remove(
        &app,
        &user,
        &format!("NOTE#{}", lone["note_id"].as_str().expect("id")),
    )
    .await;
    let cancelled = app.cancel(&user, "lone").await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(app.outbox_states(&user).await["lone"], "cancelled");
    assert!(
        app.items_of(&user, "note")
            .await
            .iter()
            .all(|n| attr_s(n, "id") != lone["note_id"].as_str())
    );
}

#[tokio::test]
async fn a_cancel_mark_for_another_user_does_not_cancel_and_a_repeat_cancel_of_an_arrived_cancelled_push_is_already()
 {
    let app = spawn_app().await;
    let alice = app.user("alice").await;
    let bob = app.user("bob").await;
    assert_eq!(app.cancel(&bob, "shared-key").await["status"], "early");
    let stored = app.notify(scheduled(&alice, "shared-key", json!({}))).await;
    assert_eq!(
        stored["push"], "pending",
        "a mark naming bob leaves alice's push: {stored}"
    );
    assert_eq!(app.cancel(&alice, "first").await["status"], "early");
    let arrived = app.notify(scheduled(&alice, "first", json!({}))).await;
    assert_eq!(arrived["push"], "cancelled", "{arrived}");
    let again = app.cancel(&alice, "first").await;
    assert_eq!(again["status"], "already", "{again}");
}
