//! The inbox and outbox: notifications are business facts, pushes are best effort with
//! a grant spent at most once, and nobody sees anyone else's inbox.

mod expiry;
mod hostile_events;
mod pending;
mod preferences;
mod publication;
mod scheduled;

use std::collections::BTreeSet;

use futures::StreamExt;
use futures::future::join_all;
use onegrant_tests::{
    ORDER, TestApp, User, assert_ledger_agrees_with_counters, attr_s, spawn_app, spawn_app_with,
};
use serde_json::{Value, json};

fn event(user: &User, key: &str, push: bool) -> Value {
    let mut detail = json!({"idempotency_key": key, "openid": user.openid, "type": "order",
                            "title": "订单已发货", "body": format!("订单 {key} 已发货"), "page": "pages/order/detail?id=1"});
    if push {
        detail["wechat"] = json!({"template_id": ORDER,
            "data": {"character_string1": "ORDER-1001", "phrase2": "已发货", "thing3": "顺丰速运"},
            "page": "pages/order/detail?id=1001"});
    }
    detail
}

async fn list(app: &TestApp, user: &User, query: &str) -> Value {
    let answer = app
        .get(&format!("/v1/notifications{query}"), Some(&user.token))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

async fn unread(app: &TestApp, user: &User) -> u64 {
    app.get("/v1/notifications/unread-count", Some(&user.token))
        .await
        .body["unread"]
        .as_u64()
        .expect("unread")
}

#[tokio::test]
async fn an_event_becomes_a_notification_counted_unread_with_its_push_pending() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let answer = app.notify(event(&user, "order-1:shipped", true)).await;
    assert_eq!(
        (answer["status"].as_str(), answer["push"].as_str()),
        (Some("created"), Some("pending")),
        "{answer}"
    );
    let page = list(&app, &user, "").await;
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["title"], "订单已发货");
    assert_eq!(items[0]["read"], false);
    assert_eq!(items[0]["push"]["status"], "pending");
    assert_eq!(page["next_cursor"], Value::Null);
    assert_eq!(unread(&app, &user).await, 1);
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(outbox.len(), 1);
    assert!(
        outbox[0].contains_key("due_pk"),
        "the push is on the due index"
    );
}

#[tokio::test]
async fn a_push_with_an_unknown_template_or_bad_data_is_rejected_but_the_notification_stays() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let mut unknown = event(&user, "k1", true);
    unknown["wechat"]["template_id"] = json!("tmpl_nope");
    let mut bad = event(&user, "k2", true);
    bad["wechat"]["data"]["phrase2"] = json!("shipped");
    for e in [unknown, bad] {
        let answer = app.notify(e).await;
        assert_eq!(answer["push"], "rejected", "{answer}");
    }
    let page = list(&app, &user, "").await;
    let reasons: Vec<&Value> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            assert_eq!(item["push"]["status"], "rejected");
            &item["push"]["reason"]
        })
        .collect();
    // Newest first; a stable code each, never the validation's own words.
    assert_eq!(
        reasons,
        [&json!("keyword_invalid"), &json!("template_not_configured")]
    );
    assert!(app.items_of(&user, "outbox").await.is_empty());
    assert_eq!(unread(&app, &user).await, 2);
}

#[tokio::test]
async fn malformed_events_are_refused_and_store_nothing() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let mut no_key = event(&user, "k", false);
    no_key.as_object_mut().map(|o| o.remove("idempotency_key"));
    let mut bad_openid = event(&user, "k", false);
    bad_openid["openid"] = json!("o#1");
    let mut long_title = event(&user, "k", false);
    long_title["title"] = json!("长".repeat(101));
    for detail in [no_key, bad_openid, long_title, json!("not an object")] {
        app.round_trips.take();
        let answer = app.notify(detail.clone()).await;
        assert_eq!(answer["status"], "invalid", "{detail}: {answer}");
        // Refused on the event alone: the database is never asked.
        assert_eq!(app.round_trips.take(), Vec::<String>::new(), "{detail}");
    }
    let no_detail = app
        .invoke(
            "NotifyFunction",
            &json!({"detail-type": "onegrant.notification", "source": "tests"}),
        )
        .await;
    assert_eq!(no_detail["status"], "invalid");
    let other_type = app
        .invoke(
            "NotifyFunction",
            &json!({"detail-type": "x", "source": "tests"}),
        )
        .await;
    assert_eq!(other_type["status"], "refused");
    assert!(app.items().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_event_twenty_times_at_once_makes_one_notification_and_at_most_one_push() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    let detail = event(&user, "order-7:shipped", true);
    let answers = join_all((0..20).map(|_| app.notify(detail.clone()))).await;
    let created = answers.iter().filter(|a| a["status"] == "created").count();
    let duplicates = answers
        .iter()
        .filter(|a| a["status"] == "duplicate")
        .count();
    assert_eq!((created, duplicates), (1, 19), "{answers:?}");
    assert_eq!(app.items_of(&user, "note").await.len(), 1);
    assert_eq!(unread(&app, &user).await, 1);
    // The same key with another payload changes nothing.
    let mut changed = detail.clone();
    changed["title"] = json!("改了");
    assert_eq!(app.notify(changed).await["status"], "conflict");
    assert_eq!(app.items_of(&user, "note").await.len(), 1);
    // At most one push, even over several ticks.
    for _ in 0..3 {
        app.tick(30).await;
    }
    assert_eq!(app.deliveries().await.len(), 1);
    let page = list(&app, &user, "").await;
    assert_eq!(page["items"][0]["push"]["status"], "sent");
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn user_b_cannot_list_count_read_or_mark_user_as_notifications_even_with_forged_cursors() {
    let app = spawn_app().await;
    let alice = app.user("alice").await;
    let bob = app.user("bob").await;
    for i in 0..3 {
        app.notify(event(&alice, &format!("a{i}"), false)).await;
    }
    app.notify(event(&bob, "b0", false)).await;
    let alices = list(&app, &alice, "").await;
    let alice_ids: Vec<String> = alices["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|n| n["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(alice_ids.len(), 3);

    let bobs = list(&app, &bob, "").await;
    assert_eq!(bobs["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(unread(&app, &bob).await, 1);
    // Alice's ids as Bob's cursor: positions in Bob's own inbox, never Alice's items.
    for id in &alice_ids {
        let forged = onegrant::domain::inbox::encode_cursor(id);
        let page = list(&app, &bob, &format!("?cursor={forged}")).await;
        for item in page["items"].as_array().expect("items") {
            assert!(!alice_ids.contains(&item["id"].as_str().unwrap_or_default().to_string()));
        }
        let read = app
            .call(
                "POST",
                &format!("/v1/notifications/{id}/read"),
                Some(&bob.token),
                None,
            )
            .await;
        assert_eq!(
            (read.status, read.body["error"]["code"].as_str()),
            (404, Some("not_found"))
        );
    }
    for garbage in ["abc", "bjE6VVNFUiNvMQ", "%00"] {
        let answer = app
            .get(
                &format!("/v1/notifications?cursor={garbage}"),
                Some(&bob.token),
            )
            .await;
        assert_eq!(
            (answer.status, answer.body["error"]["code"].as_str()),
            (400, Some("invalid_query")),
            "{garbage}"
        );
    }
    assert_eq!(
        app.call("POST", "/v1/notifications/read-all", Some(&bob.token), None)
            .await
            .body["updated"],
        1
    );
    assert_eq!(
        unread(&app, &alice).await,
        3,
        "Bob's read-all touched only Bob's inbox"
    );
    let again = list(&app, &alice, "?read=false").await;
    assert_eq!(again["items"].as_array().map(Vec::len), Some(3));
}

#[tokio::test]
async fn paging_250_notifications_while_new_ones_arrive_has_no_duplicates_and_no_gaps() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    for i in 0..250 {
        app.notify(event(&user, &format!("old{i}"), false)).await;
    }
    let existing: BTreeSet<String> = app
        .items_of(&user, "note")
        .await
        .iter()
        .filter_map(|n| attr_s(n, "id").map(str::to_string))
        .collect();
    assert_eq!(existing.len(), 250);
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let query = match &cursor {
            Some(c) => format!("?limit=20&cursor={c}"),
            None => "?limit=20".to_string(),
        };
        let page = list(&app, &user, &query).await;
        let items = page["items"].as_array().expect("items");
        assert!(items.len() <= 20);
        let ids: Vec<String> = items
            .iter()
            .filter_map(|n| n["id"].as_str().map(str::to_string))
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(ids, sorted, "newest first");
        seen.extend(ids);
        pages += 1;
        // New notifications arrive between pages.
        for j in 0..2 {
            app.notify(event(&user, &format!("new{pages}-{j}"), false))
                .await;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 30, "paging ends");
    }
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    assert!(
        existing.is_subset(&unique),
        "no gaps: every notification that existed was paged"
    );
    assert_eq!(
        unique, existing,
        "later arrivals are newer than the first page"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_unread_counter_equals_the_unread_items_after_500_concurrent_mixed_operations() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    for i in 0..40 {
        app.notify(event(&user, &format!("seed{i}"), false)).await;
    }
    let ids: Vec<String> = app
        .items_of(&user, "note")
        .await
        .iter()
        .filter_map(|n| attr_s(n, "id").map(str::to_string))
        .collect();
    // A fixed pseudo-random mix: 60% read one (often the same one), 30% new, 10% read-all.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let ops: Vec<(u64, u64)> = (0..500).map(|_| (next() % 10, next())).collect();
    // 500 writes to one user's counter at once can outlast a write's time budget on a slow
    // machine: the API then answers 503 with `Retry-After`, and the client retries, as the
    // contract asks. Each retry is counted; the invariant is checked after all have answered.
    let retried = std::sync::atomic::AtomicUsize::new(0);
    let until_answered = |method: &'static str, path: String, token: String| {
        let (app, retried) = (&app, &retried);
        async move {
            for _ in 0..10 {
                let answer = app.call(method, &path, Some(&token), None).await;
                if answer.status != 503 {
                    return answer;
                }
                assert_eq!(answer.body["error"]["code"], "unavailable");
                assert!(
                    answer.headers.contains_key("retry-after"),
                    "503 without Retry-After"
                );
                retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            panic!("{method} {path} answered 503 ten times");
        }
    };
    let runs = ops.iter().enumerate().map(|(i, (kind, pick))| {
        let (app, user, ids, until_answered) = (&app, &user, &ids, &until_answered);
        async move {
            match kind {
                0..=5 => {
                    let id = &ids[(*pick as usize) % ids.len()];
                    let answer = until_answered(
                        "POST",
                        format!("/v1/notifications/{id}/read"),
                        user.token.clone(),
                    )
                    .await;
                    assert_eq!(answer.status, 200, "{}", answer.body);
                    assert_eq!(answer.body["read"], true);
                }
                6..=8 => {
                    let answer = app.notify(event(user, &format!("mix{i}"), false)).await;
                    assert_eq!(answer["status"], "created");
                }
                _ => {
                    let answer = until_answered(
                        "POST",
                        "/v1/notifications/read-all".to_string(),
                        user.token.clone(),
                    )
                    .await;
                    assert_eq!(answer.status, 200, "{}", answer.body);
                }
            }
        }
    });
    join_all(runs).await;
    eprintln!(
        "500 mixed operations: {} answers were 503 and retried by the client",
        retried.load(std::sync::atomic::Ordering::Relaxed)
    );
    let notes = app.items_of(&user, "note").await;
    let unread_items = notes
        .iter()
        .filter(|n| n.get("read").and_then(|v| v.as_bool().ok()) == Some(&false))
        .count();
    assert_eq!(
        unread(&app, &user).await as usize,
        unread_items,
        "counter equals unread items"
    );
    assert_eq!(
        app.items_of(&user, "unread").await.len(),
        unread_items,
        "one marker per unread item"
    );
    let counted = list(&app, &user, "?read=false&limit=100").await;
    assert!(counted["items"].as_array().map_or(0, Vec::len) <= unread_items);
}

#[tokio::test]
async fn reading_twice_decrements_once_and_the_counter_never_goes_negative() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    app.notify(event(&user, "k1", false)).await;
    let id = list(&app, &user, "").await["items"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    for _ in 0..3 {
        let answer = app
            .call(
                "POST",
                &format!("/v1/notifications/{id}/read"),
                Some(&user.token),
                None,
            )
            .await;
        assert_eq!(
            (answer.status, answer.body["read"].as_bool()),
            (200, Some(true))
        );
    }
    assert_eq!(unread(&app, &user).await, 0);
    assert_eq!(
        app.call(
            "POST",
            "/v1/notifications/read-all",
            Some(&user.token),
            None
        )
        .await
        .body["updated"],
        0
    );
    assert_eq!(unread(&app, &user).await, 0);
    let filtered = list(&app, &user, "?read=true&type=order").await;
    assert_eq!(filtered["items"].as_array().map(Vec::len), Some(1));
    let other_type = list(&app, &user, "?type=promo").await;
    assert_eq!(other_type["items"].as_array().map(Vec::len), Some(0));
    for bad in ["?limit=0", "?limit=101", "?limit=x", "?read=maybe"] {
        let answer = app
            .get(&format!("/v1/notifications{bad}"), Some(&user.token))
            .await;
        assert_eq!(answer.status, 400, "{bad}");
    }
}

#[tokio::test]
async fn a_push_that_fails_retryably_then_succeeds_sends_once_and_consumes_one_grant() {
    let app = spawn_app_with(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DISPATCH_RETRY_BASE_SECONDS", "1"),
    ])
    .await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": 45011, "times": 1})),
    )
    .await;
    app.notify(event(&user, "k1", true)).await;
    let first = app.tick(30).await;
    assert_eq!((first.failed, first.restored), (1, 1), "{first:?}");
    assert_eq!(
        list(&app, &user, "").await["items"][0]["push"]["status"],
        "pending"
    );
    app.advance(std::time::Duration::from_millis(1100));
    let second = app.tick(30).await;
    assert_eq!(second.sent, 1, "{second:?}");
    assert_eq!(app.deliveries().await.len(), 1, "one message delivered");
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(
        grants
            .iter()
            .filter(|g| attr_s(g, "state") == Some("consumed"))
            .count(),
        1
    );
    assert_eq!(
        list(&app, &user, "").await["items"][0]["push"]["status"],
        "sent"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_push_answered_43101_invalidates_the_grants_of_the_template() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_1").await;
    app.accept(&user, ORDER, "wr_2").await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": 43101})),
    )
    .await;
    app.notify(event(&user, "k1", true)).await;
    app.tick(30).await;
    let grants = app.items_of(&user, "grant").await;
    assert!(
        grants.iter().all(|g| attr_s(g, "state") == Some("invalid")),
        "both grants invalid"
    );
    assert_eq!(
        list(&app, &user, "").await["items"][0]["push"]["status"],
        "failed"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// Sends `events` through the notify function, 8 at a time.
async fn notify_all(app: &TestApp, events: Vec<Value>) {
    futures::stream::iter(events)
        .for_each_concurrent(8, |e| async move {
            assert_eq!(app.notify(e).await["status"], "created");
        })
        .await;
}

/// `n` notifications for `user`, keys `prefix0`…, without pushes.
async fn notify_n(app: &TestApp, user: &User, prefix: &str, n: usize) {
    notify_all(
        app,
        (0..n)
            .map(|i| event(user, &format!("{prefix}{i}"), false))
            .collect(),
    )
    .await;
}

/// Follows `query`'s cursors until a page holds an item; returns the pages it took,
/// the item, and the most items one call read.
async fn first_match(app: &TestApp, user: &User, query: &str) -> (usize, Value, u64) {
    let mut cursor: Option<String> = None;
    let mut most_read = 0;
    for pages in 1..=12 {
        let q = match &cursor {
            Some(c) => format!("{query}&cursor={c}"),
            None => query.to_string(),
        };
        app.round_trips.take_items_read();
        let page = list(app, user, &q).await;
        most_read = most_read.max(app.round_trips.take_items_read());
        if let Some(found) = page["items"].as_array().and_then(|i| i.first()) {
            return (pages, found.clone(), most_read);
        }
        cursor = Some(
            page["next_cursor"]
                .as_str()
                .expect("an empty page while a match exists carries a cursor")
                .to_string(),
        );
    }
    panic!("no match within 12 pages of {query}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_unread_notification_behind_500_read_ones_is_found_reading_a_bounded_number_of_items() {
    // (Marking 499 read one by one is far past a user's CHANGES_PER_MINUTE.)
    let app = spawn_app_with(&[("CHANGES_PER_MINUTE", "600")]).await;
    let user = app.user("alice").await;
    let mut first = event(&user, "oldest", false);
    first["type"] = json!("system");
    app.notify(first).await;
    notify_n(&app, &user, "read", 500).await;
    let oldest = app.items_of(&user, "note").await;
    let target = oldest
        .iter()
        .find(|n| attr_s(n, "note_type") == Some("system"))
        .and_then(|n| attr_s(n, "id"))
        .expect("the oldest note")
        .to_string();
    let others: Vec<String> = oldest
        .iter()
        .filter_map(|n| attr_s(n, "id"))
        .filter(|id| *id != target)
        .map(str::to_string)
        .collect();
    futures::stream::iter(others)
        .for_each_concurrent(8, |id| {
            let (app, user) = (&app, &user);
            async move {
                let path = format!("/v1/notifications/{id}/read");
                let answer = app.call("POST", &path, Some(&user.token), None).await;
                assert_eq!(answer.status, 200, "{}", answer.body);
            }
        })
        .await;
    assert_eq!(unread(&app, &user).await, 1);

    // read=false walks only what is unread: the first page has it.
    let (pages, found, most_read) = first_match(&app, &user, "?read=false&limit=20").await;
    assert_eq!(found["id"], target.as_str());
    assert_eq!(pages, 1, "read=false finds it on the first page");
    assert!(most_read <= 2, "a marker and its note, read {most_read}");

    // A type filter walks the notifications, at most LIST_BUDGET per call, each empty
    // page carrying a cursor: 501 notes take 11 calls of 50.
    let (pages, found, most_read) = first_match(&app, &user, "?type=system&limit=20").await;
    assert_eq!(found["id"], target.as_str());
    assert!(pages <= 11, "found within 11 pages, took {pages}");
    let budget = onegrant::store::inbox::LIST_BUDGET as u64;
    assert!(
        most_read <= budget,
        "a call reads at most {budget}, read {most_read}"
    );

    // The same with nothing behind it reads the same for read=false.
    let bob = app.user("bob").await;
    app.notify(event(&bob, "only", false)).await;
    let (_, _, bob_read) = first_match(&app, &bob, "?read=false&limit=20").await;
    assert_eq!(bob_read, 2, "bounded whatever the history");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_all_over_1100_unread_resumes_and_with_new_ones_arriving_keeps_the_counter_exact() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    // More than one call flips (21 steps of 49): the first call must stop and say so.
    notify_n(&app, &user, "n", 1100).await;
    assert_eq!(unread(&app, &user).await, 1100);

    let reader = async {
        let mut calls = 0;
        let mut updated = 0;
        // A call cut short by its budget on a loaded machine answers 503 (the contract:
        // sent again later); the steps it did are not in any answer.
        let mut cut_short = false;
        loop {
            calls += 1;
            let answer = app.read_all(&user).await;
            if answer.status == 503 {
                assert_eq!(
                    answer.body["error"]["code"], "unavailable",
                    "{}",
                    answer.body
                );
                cut_short = true;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                assert!(calls < 10, "read-all ends");
                continue;
            }
            assert_eq!(answer.status, 200, "{}", answer.body);
            let flipped = answer.body["updated"].as_u64().expect("updated");
            assert!(flipped <= 21 * 49, "one call is bounded: {flipped}");
            if calls == 1 {
                assert_eq!(answer.body["more"], true, "1,100 unread take two calls");
            }
            updated += flipped;
            if answer.body["more"] == false {
                return (calls, updated, cut_short);
            }
            assert!(calls < 10, "read-all ends");
        }
    };
    let arrivals = notify_all(
        &app,
        (0..60)
            .map(|i| event(&user, &format!("late{i}"), false))
            .collect(),
    );
    let ((calls, updated, cut_short), ()) = tokio::join!(reader, arrivals);
    assert!(calls >= 2, "resumed: {calls} calls");
    if !cut_short {
        assert!(updated >= 1100, "every earlier one was read: {updated}");
    }

    let unread_notes = |notes: &[std::collections::HashMap<String, _>]| {
        notes
            .iter()
            .filter(|n| {
                n.get("read")
                    .and_then(|v: &aws_sdk_dynamodb::types::AttributeValue| v.as_bool().ok())
                    == Some(&false)
            })
            .count()
    };
    let notes = app.items_of(&user, "note").await;
    assert_eq!(notes.len(), 1160);
    let left = unread_notes(&notes);
    assert_eq!(unread(&app, &user).await as usize, left, "counter exact");
    assert_eq!(
        app.items_of(&user, "unread").await.len(),
        left,
        "markers exact"
    );
    if !cut_short {
        assert_eq!(
            updated as usize + left,
            1160,
            "every note read once or left"
        );
    }

    let answer = app
        .call(
            "POST",
            "/v1/notifications/read-all",
            Some(&user.token),
            None,
        )
        .await;
    assert_eq!(answer.body["updated"].as_u64(), Some(left as u64));
    assert_eq!(answer.body["more"], false);
    assert_eq!(unread(&app, &user).await, 0);
    let notes = app.items_of(&user, "note").await;
    assert_eq!(unread_notes(&notes), 0);
    assert!(app.items_of(&user, "unread").await.is_empty());
    assert!(
        notes
            .iter()
            .all(|n| onegrant_tests::attr_n(n, "expires_at").is_some()),
        "a read note expires"
    );
}

#[tokio::test]
async fn a_stray_marker_or_a_broken_note_never_blocks_the_inbox() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    notify_n(&app, &user, "n", 5).await;
    let notes = app.items_of(&user, "note").await;
    let ids: Vec<String> = notes
        .iter()
        .filter_map(|n| attr_s(n, "id").map(str::to_string))
        .collect();
    let pk = aws_sdk_dynamodb::types::AttributeValue::S(format!("USER#{}", user.openid));
    let sk = |id: &str| aws_sdk_dynamodb::types::AttributeValue::S(format!("NOTE#{id}"));
    // One note gone behind its marker (as an old bug or a hand edit could leave it),
    // another cut down to a stub with a push status only.
    app.table
        .client
        .delete_item()
        .table_name(&app.table.name)
        .key("pk", pk.clone())
        .key("sk", sk(&ids[0]))
        .send()
        .await
        .expect("delete");
    app.table
        .client
        .put_item()
        .table_name(&app.table.name)
        .item("pk", pk.clone())
        .item("sk", sk(&ids[1]))
        .item(
            "push_status",
            aws_sdk_dynamodb::types::AttributeValue::S("sent".into()),
        )
        .send()
        .await
        .expect("put");

    let page = list(&app, &user, "?limit=20").await;
    assert_eq!(
        page["items"].as_array().map(Vec::len),
        Some(3),
        "the whole notes are listed, the stub left out: {page}"
    );
    let unread_page = list(&app, &user, "?read=false&limit=20").await;
    assert_eq!(unread_page["items"].as_array().map(Vec::len), Some(3));

    let answer = app
        .call(
            "POST",
            "/v1/notifications/read-all",
            Some(&user.token),
            None,
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["more"], false);
    assert_eq!(
        unread(&app, &user).await,
        0,
        "the strays' counts went with them"
    );
    assert!(app.items_of(&user, "unread").await.is_empty());
}

/// One list call reads at most `LIST_BUDGET` items whatever its `limit` (issue 41 §11):
/// 120 notifications at their largest (a 100-character title, a 2,000-character body),
/// listed 100 at a time, come in pages of at most 50 with a cursor, each call reading at
/// most 50 items and about 90 read units, and every notification is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_list_call_reads_at_most_its_budget_whatever_the_limit_and_the_sizes() {
    let app = spawn_app().await;
    let user = app.user("alice").await;
    let budget = onegrant::store::inbox::LIST_BUDGET;
    notify_all(
        &app,
        (0..120)
            .map(|i| {
                json!({"idempotency_key": format!("big{i}"), "openid": user.openid, "type": "order",
                       "title": format!("{i:03}{}", "订".repeat(97)), "body": "货".repeat(2000)})
            })
            .collect(),
    )
    .await;
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = String::new();
    let mut calls = 0;
    loop {
        app.round_trips.take_items_read();
        app.round_trips.take_read_units();
        let page = list(&app, &user, &format!("?limit=100&cursor={cursor}")).await;
        calls += 1;
        let items = page["items"].as_array().expect("items");
        let read = app.round_trips.take_items_read();
        let units = app.round_trips.take_read_units();
        assert!(items.len() <= budget, "a page of {}", items.len());
        assert!(read <= budget as u64, "a call read {read} items");
        assert!(units <= 100.0, "a call read {units} units");
        for item in items {
            assert!(
                seen.insert(item["id"].as_str().expect("id").to_string()),
                "listed once"
            );
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
        assert!(calls < 10, "pages end");
    }
    assert_eq!(seen.len(), 120);
    assert_eq!(calls, 3, "120 in pages of 50");
}
