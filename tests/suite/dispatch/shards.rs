//! The lease index and the shards: corrupt entries, bounded sweeps, a change of `DUE_SHARDS`.

use super::*;

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
    let past = (app.now() - Duration::minutes(5))
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
    // A push that cannot be read, counted on its user's pending index.
    put_raw(
        &app,
        vec![
            ("pk", S("USER#oGhost".into())),
            ("sk", S("OUTBOX#bad".into())),
            ("kind", S("outbox".into())),
            ("state", S("pending".into())),
            ("due_pk", S("DUE#0".into())),
            ("due_at", N(past.clone())),
            ("pending_pk", S("USER#oGhost".into())),
            ("pending_sk", S("order#1:bad".into())),
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
        summary.skipped, 4,
        "four bad items, each counted: {summary:?}"
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
        .collect::<Vec<_>>();
    assert_eq!(quarantined.len(), 4, "{quarantined:?}");
    // The push for an operator is no open push counted against its user's cap: it
    // left the pending index with the due one.
    assert!(
        quarantined
            .iter()
            .all(|i| !i.contains_key("pending_pk") && !i.contains_key("due_pk")),
        "{quarantined:?}"
    );
    // And the audit trail says where each stopped.
    let recorded = app
        .items()
        .await
        .into_iter()
        .filter(|i| attr_s(i, "kind") == Some("history"))
        .filter(|i| format!("{:?}", i.get("changes")).contains("quarantined"))
        .count();
    assert_eq!(recorded, 4, "one history entry per quarantined item");
    let again = app.tick(30).await;
    assert_eq!((again.due, again.skipped), (0, 0), "{again:?}");
}

#[tokio::test]
async fn a_sweep_does_a_bounded_amount_of_work_per_tick() {
    let app = spawn_app_with(&[("DUE_SHARDS", "1")]).await;
    let past = (app.now() - Duration::minutes(5))
        .timestamp_millis()
        .to_string();
    let backlog = onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize + 15;
    for i in 0..backlog {
        put_corrupt_stale_delivery(&app, &format!("DELIVERY#bad{i}"), &past).await;
    }
    app.round_trips.take();
    let swept = app.sweep_at(app.now()).await;
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
    // The shard registry, then one read per entry, and for each delivery quarantined
    // (every one here: none reads) one more, of the push it was for, which leaves its
    // publisher's lane: at most two per entry, however long the backlog.
    assert_eq!(
        ops.iter().filter(|o| *o == "GetItem").count(),
        1 + 2 * onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize,
        "the shard registry, then one read per entry and one per quarantined delivery"
    );
    // The unreadable ones left the lease index: the next sweep reaches the rest.
    let next = app.sweep_at(app.now()).await;
    assert_eq!(
        next.skipped as usize,
        backlog - onegrant::store::dispatch::sweep::SWEEP_BATCH_PER_SHARD as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_written_under_16_shards_are_sent_and_swept_after_a_change_to_4_and_to_32() {
    for to in [4u32, 32] {
        let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2], ("DUE_SHARDS", "16")]).await;
        // (A claim given back unsent on a loaded machine is due again at once at midday
        // in Shanghai, the reminders' zone; at night there it would wait for the
        // morning.)
        app.move_to_china_midday();
        // The deployed dispatcher has been ticking under 16 shards.
        app.tick(30).await;
        let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
        join_all(names.iter().map(|name| due_user(&app, name, 1))).await;
        // One of its runs claimed two of them and vanished.
        let now = app.now();
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
        let deps =
            onegrant_local::stack::deps_on(config, app.table.client.clone(), app.clock.clone())
                .expect("deps");
        // Every item written under 16 shards is found and sent once: by the first tick,
        // or (a loaded machine giving a claim back unsent for want of time) a next one.
        let mut ticks = Vec::new();
        while ticks
            .iter()
            .map(|s: &dispatcher::Summary| s.sent)
            .sum::<u32>()
            < 10
            && ticks.len() < 4
        {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            ticks.push(dispatcher::tick(&deps, deadline).await.expect("tick"));
        }
        let sent: u32 = ticks.iter().map(|s| s.sent).sum();
        assert_eq!(
            sent, 10,
            "{to}: every item written under 16 shards is found: {ticks:?}"
        );
        let span = deps.store.shard_span(app.now()).await.expect("registry");
        assert_eq!(span.span, 16.max(to), "{to}: {span:?}");
        let swept = deps
            .store
            .sweep(
                &deps.config.templates,
                0..span.span,
                app.now() + Duration::seconds(300),
            )
            .await;
        assert_eq!(
            swept.recovered, 2,
            "{to}: the old shards' leases are swept: {swept:?}"
        );
        // Once the old partitions are empty (and the change has settled), the
        // extra queries stop.
        let later =
            app.now() + onegrant::store::dispatch::shards::DRAIN_GRACE + Duration::minutes(1);
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
    let now = app.now();
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
