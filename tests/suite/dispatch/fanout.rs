//! Paging the due backlog and fanning shards out to workers.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tick_reads_the_due_backlog_in_pages_and_only_as_far_as_its_budget_can_send() {
    let app = spawn_app_with(&[
        FAST[0],
        ("WECHAT_TIMEOUT_MS", "5000"),
        FAST[2],
        ("DUE_SHARDS", "1"),
    ])
    .await;
    // (A claim given back unsent is due again at once at midday in Shanghai, the
    // reminders' zone; at night there it would wait for the morning.)
    app.move_to_china_midday();
    due_users(&app, "u", 120).await;
    // WeChat answers in 2.5 s. A tick with 1.5 s more than one send needs from its
    // turn reads one page, starts what it can in that time, and leaves the rest
    // unread: no send ends before its time is up (2.5 s > 1.5 s), so no slot frees for
    // a next page. (With 0.5 s, a cold, loaded machine spent it all before any lane
    // read: a fresh-clone CI run saw 31.4 s left against 31.5 s needed.)
    app.control("POST", "latency", Some(json!({"ms": 2500})))
        .await;
    let wechat = &app.deps.wechat;
    let after_turn =
        wechat.call_timeout() + wechat.send_window() + std::time::Duration::from_secs(5);
    let deadline =
        tokio::time::Instant::now() + after_turn + std::time::Duration::from_millis(1500);
    app.round_trips.take_index_queries();
    let short = dispatcher::tick(&app.deps, deadline).await.expect("tick");
    let due_queries: Vec<String> = app
        .round_trips
        .take_index_queries()
        .into_iter()
        .filter(|q| q.starts_with("due"))
        .collect();
    assert!(
        (1..=50).contains(&short.due),
        "one page of 50 at most was read: {short:?}"
    );
    assert_eq!(short.claimed, short.sent, "{short:?}");
    // At most one due-index page per shard (the span is at least the default 16), and
    // no second page of shard 0 read. (The lease queries beside them, the sweep's, are
    // cut short by the tick's deadline on a loaded machine: not counted here.)
    // (A loaded machine may leave a lane no time to read at all: seen 8 of 16.)
    assert!(
        (1..=16).contains(&due_queries.len()) && due_queries.iter().all(|q| q == "due"),
        "first pages only, at most one per shard, no next page: {due_queries:?}"
    );
    assert_plans_consistent(&app).await;

    // Ticks with time go through the rest, page by page (on a loaded machine a tick
    // may leave some for the next).
    app.control("POST", "latency", Some(json!({"ms": 0}))).await;
    let first_rest = app.tick(60).await;
    // Every page — unless its budget ran out first (seen beside two CPU hogs: 45 s a
    // send), and then it defers what it read and could not send.
    assert!(
        first_rest.due >= 120 - short.sent || first_rest.deferred > 0,
        "a tick with time reads every page: {first_rest:?}"
    );
    assert!(first_rest.due > 50, "past its first page: {first_rest:?}");
    let mut rest = first_rest.sent;
    for _ in 0..5 {
        if short.sent + rest >= 120 {
            break;
        }
        rest += app.tick(60).await.sent;
    }
    assert_eq!(short.sent + rest, 120, "{short:?} {first_rest:?}");
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
    // ... which send everything, each reminder once, asynchronously: the test waits
    // for them to end. On a loaded machine a worker may leave an item for want of
    // time (deferred, or a claim given back unsent with its grant), due again at its
    // plan's next instant within the user's waking hours (hours away when the test
    // runs in the user's night); a next scheduled tick at that instant sends it, still
    // once. The clock is moved only once no worker is running (a claim's lease is on
    // the same clock).
    app.workers_done().await;
    let by_workers = app.deliveries().await.len();
    assert!(by_workers > 0, "the workers sent");
    for _ in 0..5 {
        if app.deliveries().await.len() >= 40 {
            break;
        }
        let next_due = app
            .items()
            .await
            .iter()
            .filter(|i| {
                attr_s(i, "kind") == Some("plan") && attr_s(i, "state") == Some("scheduled")
            })
            .filter_map(|i| attr_n(i, "due_at"))
            .min()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .expect("a plan not sent yet is scheduled");
        app.clock
            .set(next_due.max(app.clock.now()) + chrono::Duration::seconds(1));
        let next = app.tick(30).await;
        app.workers_done().await;
        eprintln!("the workers sent {by_workers}; a next tick at {next_due}: {next:?}");
    }
    let left: Vec<String> = app
        .items()
        .await
        .iter()
        .filter(|i| {
            attr_s(i, "kind") == Some("delivery") && attr_s(i, "state") != Some("sent")
                || attr_s(i, "kind") == Some("plan") && attr_s(i, "state") != Some("scheduled")
        })
        .map(|i| format!("{i:?}"))
        .collect();
    assert_eq!(
        app.deliveries().await.len(),
        40,
        "each sent, nothing twice; left: {left:#?}"
    );
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
    // (A claim given back unsent is due again at once at midday in Shanghai.)
    app.move_to_china_midday();
    for i in 0..12 {
        due_user(&app, &format!("f{i}"), 1).await;
    }
    let summary = app.tick(30).await;
    assert_eq!((summary.workers, summary.inline), (0, 4), "{summary:?}");
    // Every one sent once: by that tick, or (a loaded machine giving a claim back
    // unsent for want of time) by the next, which does its shards itself too.
    let mut sent = summary.sent;
    if sent < 12 {
        sent += app.ticks_until(|s| summary.sent + s.sent >= 12).await.sent;
    }
    assert_eq!(sent, 12, "{summary:?}");
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
    // (Had one fanned out instead, its workers would have run by now.)
    app.workers_done().await;
    assert!(app.deliveries().await.is_empty(), "no tick ran");
}
