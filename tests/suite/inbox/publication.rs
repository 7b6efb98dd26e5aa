//! A scheduled push published and claimed in one transaction (`Store::publication`,
//! `Store::claim_published`): it costs its dispatch what an immediate push costs, a
//! notification that changed between the read and the claim writes nothing and is
//! settled the ordinary way, and racing dispatchers send each push once.

use chrono::{DateTime, Duration, Utc};
use onegrant::store::dispatch::{ClaimOutcome, DueItem, ReadAhead};
use onegrant_tests::{
    ORDER, TestApp, User, assert_ledger_agrees_with_counters, attr_n, spawn_app_with,
};
use serde_json::json;

use onegrant_tests::inbox::{at, scheduled};

/// Round trips other than the due index's queries (their number depends on the shards
/// looked at, alike for both), sorted, and the write units.
async fn dispatch_cost(app: &TestApp) -> (Vec<String>, usize) {
    let mut ops: Vec<String> = app
        .round_trips
        .take()
        .into_iter()
        .filter(|op| !op.starts_with("Query"))
        .collect();
    ops.sort();
    let writes = app.round_trips.take_writes();
    (ops, app.write_units(&writes).await)
}

#[tokio::test]
async fn a_scheduled_push_is_published_and_claimed_in_one_transaction_at_an_immediate_pushs_round_trips()
 {
    let app = spawn_app_with(&[
        ("AUDIT_TRAIL", "false"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
    ])
    .await;
    let user = app.user("costs").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.accept(&user, ORDER, "wr_2").await;

    // A first tick registers the shards: its housekeeping is not the dispatch's.
    app.tick(30).await;
    let answer = app.notify(scheduled(&user, "now", json!({}))).await;
    assert_eq!(answer["push"], "pending", "{answer}");
    app.round_trips.take();
    app.round_trips.take_writes();
    let summary = app.tick(30).await;
    assert_eq!((summary.sent, summary.published), (1, 0), "{summary:?}");
    let (immediate, immediate_wru) = dispatch_cost(&app).await;

    app.hold_clock();
    let send_at = app.now() + Duration::seconds(2);
    app.notify(scheduled(&user, "later", json!({"send_at": at(send_at)})))
        .await;
    app.let_clock_run();
    app.move_to(send_at + Duration::milliseconds(100));
    app.round_trips.take();
    app.round_trips.take_writes();
    let summary = app.tick(30).await;
    assert_eq!((summary.sent, summary.published), (1, 1), "{summary:?}");
    let (published, published_wru) = dispatch_cost(&app).await;
    println!(
        "dispatch of an immediate push: {immediate:?}, {immediate_wru} WRU; of a scheduled one: {published:?}, {published_wru} WRU"
    );
    // One read of the item (the outbox item / the scheduled item), one of the counters
    // and preferences, the claim (with the publication) and the finalize.
    assert_eq!(published, immediate);
    assert_eq!(
        published
            .iter()
            .filter(|op| *op == "TransactWriteItems")
            .count(),
        2,
        "{published:?}"
    );
    // Its outbox item is written once, claimed, instead of pending then claimed.
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(outbox.len(), 2);
    assert!(app.items_of(&user, "scheduled").await.is_empty());
    assert_eq!(app.deliveries().await.len(), 2);
    assert_ledger_agrees_with_counters(&app).await;
}

/// The scheduled notification `key` of `user` (sent at `send_at`), read for its claim
/// as a dispatcher reads it while it waits: its due entry, its push's and the
/// publication with its push's context read ahead.
async fn read_publication(
    app: &TestApp,
    user: &User,
    send_at: DateTime<Utc>,
) -> (DueItem, DueItem, ReadAhead) {
    let store = &app.deps.store;
    let span = store.shard_span(app.now()).await.expect("shards");
    let entry = store
        .due_items(send_at + Duration::seconds(1), &span)
        .await
        .expect("due items")
        .into_iter()
        .find(|d| d.is_scheduled_note() && d.key().0 == format!("USER#{}", user.openid))
        .expect("its due entry");
    let (pk, sk) = entry.key();
    let publication = store
        .publication(pk, sk, entry.due_at, app.now())
        .await
        .expect("read")
        .expect("a push to publish and claim");
    let push = entry.published_push().expect("its push's due entry");
    (entry, push, store.read_ahead(publication).await)
}

#[tokio::test]
async fn a_notification_changed_between_its_read_and_its_claim_writes_nothing_and_is_settled_the_ordinary_way()
 {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "60")]).await;
    // What happens between the dispatcher's read (the scheduled item, then the
    // counters and preferences: `read_ahead`) and its claim — a mute saved there is
    // caught by the claim's check of the preferences' version; what the ordinary way
    // then makes of the push: (published, sent, cancelled, muted, waiting for a
    // grant), and whether the user's grant is left.
    type Counts = (u32, u32, u32, u32, u32);
    let cases: Vec<(&str, bool, Counts, bool)> = vec![
        ("cancelled", true, (1, 0, 0, 0, 0), true),
        ("muted", true, (1, 0, 0, 1, 0), true),
        ("replaced", true, (2, 1, 0, 0, 0), false),
        ("published by another", true, (0, 1, 0, 0, 0), false),
        ("no grant", false, (1, 0, 0, 0, 1), false),
    ];
    for (i, (case, grant, expect, grant_left)) in cases.into_iter().enumerate() {
        let user = app.user(&format!("user{i}")).await;
        if grant {
            app.accept(&user, ORDER, &format!("wr_{i}")).await;
        }
        let send_at = app.now() + Duration::seconds(3);
        let key = format!("appt-{i}");
        let answer = app
            .notify(scheduled(
                &user,
                &key,
                json!({"send_at": at(send_at), "collapse_key": "appt"}),
            ))
            .await;
        assert_eq!(answer["push"], "pending", "{case}: {answer}");
        let (entry, push, publication) = read_publication(&app, &user, send_at).await;
        match case {
            "cancelled" => {
                let answer = app.cancel(&user, &key).await;
                assert_eq!(answer["status"], "cancelled", "{case}: {answer}");
            }
            "muted" => {
                let answer = app
                    .call(
                        "PUT",
                        "/v1/preferences",
                        Some(&user.token),
                        Some(
                            json!({"quiet_hours": null, "muted_types": ["order"]})
                                .to_string()
                                .into_bytes(),
                        ),
                    )
                    .await;
                assert_eq!(answer.status, 200, "{case}: {}", answer.body);
            }
            "replaced" => {
                app.notify(scheduled(
                    &user,
                    &format!("appt-{i}-2"),
                    json!({"send_at": at(send_at), "collapse_key": "appt"}),
                ))
                .await;
            }
            "published by another" => {
                let (pk, sk) = entry.key();
                let published = app
                    .deps
                    .store
                    .publish(pk, sk, entry.due_at, app.now())
                    .await
                    .expect("publish");
                assert_eq!(
                    published,
                    onegrant::store::inbox::Published::Done {
                        push: true,
                        expired: false
                    },
                    "{case}"
                );
            }
            _ => {}
        }
        let notes_before = app.items_of(&user, "note").await.len();
        let outbox_before = app.items_of(&user, "outbox").await.len();
        let outcome = app
            .deps
            .store
            .claim_published(
                &push,
                &publication,
                "test",
                std::time::Duration::from_secs(60),
                app.now(),
            )
            .await
            .expect("claim");
        assert!(
            matches!(outcome, ClaimOutcome::Republish),
            "{case}: {outcome:?}"
        );
        // Nothing written: no notification, outbox item or delivery more than before.
        assert_eq!(
            app.items_of(&user, "note").await.len(),
            notes_before,
            "{case}"
        );
        assert_eq!(
            app.items_of(&user, "outbox").await.len(),
            outbox_before,
            "{case}"
        );
        assert!(app.items_of(&user, "delivery").await.is_empty(), "{case}");

        let summary = app.tick(30).await;
        assert_eq!(
            (
                summary.published,
                summary.sent,
                summary.cancelled,
                summary.muted,
                summary.grant_waits
            ),
            expect,
            "{case}: {summary:?}"
        );
        let deliveries = app.items_of(&user, "delivery").await.len();
        assert_eq!(deliveries, expect.1 as usize, "{case}: at most one send");
        let available = app
            .item(&user, &format!("QUOTA#{ORDER}"))
            .await
            .and_then(|q| attr_n(&q, "available"))
            .unwrap_or(0);
        assert_eq!(available, i64::from(grant_left), "{case}: the grant");
        assert_ledger_agrees_with_counters(&app).await;
    }
}

/// A claim decided on counters read ahead goes on only while they are as read: a
/// better push listed as waiting for the template's grant in between makes it read
/// again, where the waiting push comes first — nothing written, the grant kept for it.
/// (Decided on the counters read ahead, a `low` push took the grant past it.)
#[tokio::test]
async fn a_push_listed_waiting_after_the_read_ahead_is_not_passed_over() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "60")]).await;
    let user = app.user("waits").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.hold_clock();
    let send_at = app.now() + Duration::seconds(3);
    let answer = app
        .notify(scheduled(
            &user,
            "low",
            json!({"send_at": at(send_at), "priority": "low"}),
        ))
        .await;
    app.let_clock_run();
    assert_eq!(answer["push"], "pending", "{answer}");
    let (_, push, ahead) = read_publication(&app, &user, send_at).await;
    // A `high` push listed as waiting for the order template's grant, as its claim
    // lists it when it finds none available (the grant reserved meanwhile by another
    // send, then given back).
    app.table
        .client
        .update_item()
        .table_name(&app.table.name)
        .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
        .key("sk", AttributeValue::S(format!("QUOTA#{ORDER}")))
        .update_expression("ADD waiting :w")
        .expression_attribute_values(
            ":w",
            AttributeValue::Ss(vec!["0:1000000000000abcdefabcdef".into()]),
        )
        .send()
        .await
        .expect("listed");
    let outcome = app
        .deps
        .store
        .claim_published(
            &push,
            &ahead,
            "test",
            std::time::Duration::from_secs(60),
            app.now(),
        )
        .await
        .expect("claim");
    assert!(matches!(outcome, ClaimOutcome::Republish), "{outcome:?}");
    assert!(app.items_of(&user, "delivery").await.is_empty());
    let available = app
        .item(&user, &format!("QUOTA#{ORDER}"))
        .await
        .and_then(|q| attr_n(&q, "available"));
    assert_eq!(available, Some(1), "the grant kept for the better push");
}

#[tokio::test]
async fn racing_dispatchers_publish_and_send_each_scheduled_push_once() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "60")]).await;
    let mut users = Vec::new();
    for round in 0..3 {
        // Held while the round is set up (30-odd requests): every notification is
        // stored scheduled, 3 s before its instant, however slow the machine.
        app.hold_clock();
        let send_at = app.now() + Duration::seconds(3);
        let mut these = Vec::new();
        for i in 0..6 {
            let user = app.user(&format!("r{round}u{i}")).await;
            app.accept(&user, ORDER, &format!("wr_{round}_{i}")).await;
            // Every other user has one grant for two pushes: the second is skipped.
            if i % 2 == 0 {
                app.accept(&user, ORDER, &format!("wr_{round}_{i}_b")).await;
            }
            for key in ["a", "b"] {
                let answer = app
                    .notify(scheduled(
                        &user,
                        &format!("{key}-{round}-{i}"),
                        json!({"send_at": at(send_at)}),
                    ))
                    .await;
                assert_eq!(answer["push"], "pending", "{answer}");
            }
            these.push((user, if i % 2 == 0 { 2 } else { 1 }));
        }
        let mut scheduled_first = 0;
        for (user, _) in &these {
            scheduled_first += app.items_of(user, "scheduled").await.len();
        }
        assert_eq!(scheduled_first, 12, "round {round}: all stored scheduled");
        app.let_clock_run();
        // Three dispatchers at once, each reading ahead and claiming at the instant;
        // again while anything is left (a loaded machine may leave a tick too little
        // time, and it defers what it cannot finish to the next).
        // Done when nothing of the round is left to publish or due (read from the
        // table, as the checks below are).
        let (mut published, mut sent, mut ticks) = (0, 0, Vec::new());
        for _ in 0..6 {
            let (a, b, c) = tokio::join!(app.tick(30), app.tick(30), app.tick(30));
            published += a.published + b.published + c.published;
            sent += a.sent + b.sent + c.sent;
            let left = a.deferred + b.deferred + c.deferred;
            ticks.push((a, b, c));
            let mut scheduled_left = 0;
            for (user, _) in &these {
                scheduled_left += app.items_of(user, "scheduled").await.len();
            }
            if scheduled_left == 0 && sent == 9 && left == 0 {
                break;
            }
        }
        // Each publication counted once, by the dispatcher that made it (it once came
        // out 10 or 11 of 12 under load: set up on the live clock, the round's last
        // notifications arrived after their instant and were published at ingest).
        assert_eq!(published, 12, "round {round}: {ticks:?}");
        assert_eq!(sent, 9, "round {round}: {ticks:?}");
        users.extend(these);
    }
    for (user, grants) in &users {
        let deliveries = app.items_of(user, "delivery").await;
        assert_eq!(
            deliveries.len(),
            *grants,
            "one send per grant, never two per push"
        );
        assert_eq!(app.items_of(user, "note").await.len(), 2);
        assert_eq!(app.items_of(user, "outbox").await.len(), 2);
        assert!(app.items_of(user, "scheduled").await.is_empty());
        let available = app
            .item(user, &format!("QUOTA#{ORDER}"))
            .await
            .and_then(|q| attr_n(&q, "available"))
            .unwrap_or(0);
        assert_eq!(available, 0, "grants minus pushes sent");
    }
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn scheduled_notifications_are_listed_at_their_instant_while_their_pushes_wait_for_the_users_turn()
 {
    let app = spawn_app_with(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "60"),
        ("WECHAT_TIMEOUT_MS", "6000"),
    ])
    .await;
    // WeChat answers each send in 4 s, and one user's sends go one at a time.
    app.control("POST", "latency", Some(json!({"ms": 4000})))
        .await;
    let user = app.user("alice").await;
    for i in 0..3 {
        app.accept(&user, ORDER, &format!("wr_{i}")).await;
    }
    app.hold_clock();
    let send_at = app.now() + Duration::seconds(6);
    for i in 0..3 {
        let answer = app
            .notify(scheduled(
                &user,
                &format!("turn-{i}"),
                json!({"send_at": at(send_at)}),
            ))
            .await;
        assert_eq!(answer["push"], "pending", "{answer}");
    }
    app.let_clock_run();
    // When all three are listed and counted, looked for from the instant on.
    let watch = async {
        app.move_to(send_at);
        loop {
            let listed = app.get("/v1/notifications", Some(&user.token)).await.body["items"]
                .as_array()
                .map_or(0, Vec::len);
            let unread = app
                .get("/v1/notifications/unread-count", Some(&user.token))
                .await
                .body["unread"]
                .as_u64();
            if (listed, unread) == (3, Some(3)) || app.now() > send_at + Duration::seconds(40) {
                return ((listed, unread), app.now());
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    // Ticks until all three are sent (under a loaded emulator a tick may find its
    // queries too slow and leave the items to the next).
    let dispatch = async {
        let (mut published, mut sent) = (0, 0);
        while sent < 3 && app.now() < send_at + Duration::seconds(60) {
            let summary = app.tick(120).await;
            published += summary.published;
            sent += summary.sent;
        }
        (published, sent)
    };
    app.round_trips.take_writes();
    let ((published, sent), (seen, _)) = tokio::join!(dispatch, watch);
    assert_eq!(seen, (3, Some(3)), "all three listed and counted");
    assert_eq!((published, sent), (3, 3));
    // Listed before the second push was even claimed: not one send at a time. Told by
    // the order the dispatcher sent its writes in (the emulator answers one request at
    // a time), not by when a poll on a loaded machine happened to look: each note's
    // first write is its publication, each delivery's first its claim.
    let writes = app.round_trips.take_writes();
    let pk = format!("USER#{}", user.openid);
    let first_of = |prefix: &str| {
        let mut first: std::collections::BTreeMap<String, u64> = Default::default();
        for w in writes
            .iter()
            .filter(|w| w.pk == pk && w.sk.starts_with(prefix))
        {
            first.entry(w.sk.clone()).or_insert(w.request);
        }
        let mut requests: Vec<u64> = first.into_values().collect();
        requests.sort();
        requests
    };
    let listed = first_of("NOTE#");
    let claimed = first_of("DELIVERY#");
    assert_eq!((listed.len(), claimed.len()), (3, 3), "{writes:?}");
    assert!(
        listed[2] < claimed[1],
        "the notes published by requests {listed:?}, the pushes claimed by {claimed:?}"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// A scheduled notification without a push, its publication meeting each fault once:
/// listed and counted after the one tick, once (a conflict or a throttle is contention
/// and tried again, not taken for "published already"), and nothing left to publish.
#[tokio::test]
async fn a_publication_meeting_each_fault_once_is_listed_after_its_tick_once() {
    use onegrant_tests::faults::ONCE;
    for fault in ONCE {
        let case = format!("publish × {fault:?}");
        // (A WeChat timeout that leaves a 20 s tick time to read its due index.)
        let (app, proxy) = onegrant_tests::spawn_faulty_app(&[
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
            ("WECHAT_TIMEOUT_MS", "1500"),
        ])
        .await;
        let user = app.user("published").await;
        app.hold_clock();
        let send_at = app.now() + Duration::seconds(2);
        let mut detail = scheduled(&user, "note", json!({"send_at": at(send_at)}));
        detail.as_object_mut().map(|d| d.remove("wechat"));
        let answer = app.notify(detail).await;
        app.let_clock_run();
        assert_eq!(answer["status"], "created", "{case}: {answer}");
        app.move_to(send_at + Duration::milliseconds(100));
        // The publication is the one transaction that deletes the scheduled item.
        proxy.inject("TransactWriteItems", Some("SCHEDULED#"), fault, 1);
        let mut summary = app.tick(20).await;
        // On a loaded machine a tick may skip a shard the emulator did not answer in
        // time (nothing written): the next tick takes it.
        for _ in 0..4 {
            if proxy.injected().iter().any(|(_, f)| *f == fault) {
                break;
            }
            summary = app.tick(20).await;
        }
        let met = proxy.injected().iter().filter(|(_, f)| *f == fault).count();
        assert_eq!(met, 1, "{case}: the fault was met: {summary:?}");
        // Listed and counted now, not at a later tick.
        let unread = app
            .get("/v1/notifications/unread-count", Some(&user.token))
            .await;
        assert_eq!(unread.body["unread"], 1, "{case}: {summary:?}");
        let page = app.get("/v1/notifications", Some(&user.token)).await;
        assert_eq!(
            page.body["items"].as_array().map(Vec::len),
            Some(1),
            "{case}: {}",
            page.body
        );
        // (Its answer lost, the publication is still counted by the dispatcher that
        // made it: the resend of its transaction, with its token, says so.)
        assert_eq!(
            (summary.published, summary.lost),
            (1, 0),
            "{case}: {summary:?}"
        );
        assert!(app.items_of(&user, "scheduled").await.is_empty(), "{case}");
        assert_eq!(app.items_of(&user, "note").await.len(), 1, "{case}");
        let again = app.tick(10).await;
        assert_eq!((again.published, again.lost), (0, 0), "{case}: {again:?}");
    }
}
