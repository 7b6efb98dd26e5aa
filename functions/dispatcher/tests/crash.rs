//! Crash injection: a dispatcher process killed (SIGKILL) after the claim, after the
//! send before the finalize, and during the finalize. After the lease, one sweep leaves
//! every delivery terminal (`unknown` where the outcome is uncertain), its plan paused,
//! its grant invalid — and nothing is ever resent. And one killed in the middle of a
//! user's erasure: the next tick carries it on to the end.

use std::os::unix::process::ExitStatusExt;

use onegrant_tests::{
    User, assert_ledger_agrees_with_counters, assert_plans_consistent, attr_s, spawn_app_with,
};

const LEASE_SECONDS: &str = "10";
/// Past any lease a claim in these tests can have (the configured one, or the send's
/// window and the finalize when longer).
const AFTER_EVERY_LEASE: chrono::Duration = chrono::Duration::seconds(120);

/// The kill points, with the finalize one at several delays: killed at once the
/// finalize has not landed, killed late it has.
const POINTS: [&str; 7] = [
    "after_claim",
    "after_send",
    "during_finalize:0",
    "during_finalize:2",
    "during_finalize:8",
    "during_finalize:30",
    "during_finalize:300",
];

/// One tick of a dispatcher process (`dispatch-once`) with the failpoint `point`: how
/// the process ended.
fn run_until_killed(app: &onegrant_tests::TestApp, point: &str) -> std::process::ExitStatus {
    app.dispatcher_process(
        env!("CARGO_BIN_EXE_dispatch-once"),
        &[
            ("DISPATCH_LEASE_SECONDS", LEASE_SECONDS),
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
            ("DISPATCH_ONCE_SECONDS", "30"),
            ("ONEGRANT_FAILPOINT", point),
        ],
    )
    .status()
    .expect("dispatch-once runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_killed_at_each_step_leaves_every_delivery_terminal_after_one_sweep() {
    let (mut finalize_landed, mut finalize_lost) = (0usize, 0usize);
    for point in POINTS {
        let app = spawn_app_with(&[
            ("DISPATCH_LEASE_SECONDS", LEASE_SECONDS),
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ])
        .await;
        let mut users: Vec<User> = Vec::new();
        for i in 0..4 {
            let user = app.scheduled_user(&format!("u{i}"), 1).await;
            app.make_due(&user, "water", onegrant::Clock::real_now())
                .await;
            users.push(user);
        }

        let status = run_until_killed(&app, point);
        assert_eq!(
            status.signal(),
            Some(9),
            "{point}: the dispatcher was killed, not finished ({status})"
        );
        // A request the process sent just before it died still lands (as on DynamoDB):
        // what the crash left is counted once the emulator has answered everything.
        app.emulator_quiet().await;

        let sent_before = app.deliveries().await.len();
        match point {
            // Every task that claims reaches this point before it sends.
            "after_claim" => assert_eq!(sent_before, 0, "{point}: nothing was sent"),
            _ => assert!(
                sent_before >= 1,
                "{point}: WeChat delivered before the crash"
            ),
        }
        let stored = |state: &'static str| {
            let app = &app;
            async move {
                app.items()
                    .await
                    .into_iter()
                    .filter(|i| {
                        attr_s(i, "kind") == Some("delivery") && attr_s(i, "state") == Some(state)
                    })
                    .count()
            }
        };
        let in_flight = stored("claimed").await + stored("sending").await;
        let settled = stored("sent").await;
        if point.starts_with("during_finalize") {
            finalize_landed += settled;
            finalize_lost += in_flight;
            eprintln!("{point}: {settled} finalize(s) landed before the kill, {in_flight} did not");
        } else {
            assert!(in_flight >= 1, "{point}: the crash left a claim behind");
        }

        // Before the lease expires the sweep leaves the claims alone…
        assert_eq!(app.sweep_at(onegrant::Clock::real_now()).await.recovered, 0);
        // …after it, one sweep settles every one of them.
        let swept = app
            .sweep_at(onegrant::Clock::real_now() + AFTER_EVERY_LEASE)
            .await;
        assert_eq!(
            (swept.recovered as usize, swept.skipped),
            (in_flight, 0),
            "{point}: every stale claim recovered"
        );
        assert_eq!(
            stored("claimed").await + stored("sending").await,
            0,
            "{point}: all terminal"
        );

        for delivery in app
            .items()
            .await
            .into_iter()
            .filter(|i| attr_s(i, "kind") == Some("delivery"))
        {
            let state = attr_s(&delivery, "state").unwrap_or_default();
            assert!(
                !delivery.contains_key("lease_pk"),
                "{point}: off the lease index"
            );
            let pk = attr_s(&delivery, "pk").unwrap_or_default();
            let user = users
                .iter()
                .find(|u| pk == format!("USER#{}", u.openid))
                .expect("a user");
            let grant = app
                .item(user, attr_s(&delivery, "grant_sk").unwrap_or_default())
                .await;
            let plan = app.item(user, "PLAN#water").await;
            let grant_state = grant.as_ref().and_then(|g| attr_s(g, "state"));
            let plan_state = plan.as_ref().and_then(|p| attr_s(p, "state"));
            match state {
                "unknown" => {
                    assert_eq!(
                        grant_state,
                        Some("invalid"),
                        "{point}: an unknown send's grant"
                    );
                    assert_eq!(
                        plan_state,
                        Some("paused"),
                        "{point}: an unknown send's plan"
                    );
                    assert_eq!(
                        plan.as_ref().and_then(|p| attr_s(p, "pause_reason")),
                        Some("uncertain")
                    );
                }
                // A finalize that landed before the kill.
                "sent" => {
                    assert_eq!(grant_state, Some("consumed"));
                    assert_eq!(plan_state, Some("awaiting_checkin"));
                }
                other => panic!("{point}: delivery left {other}"),
            }
        }
        assert_ledger_agrees_with_counters(&app).await;
        assert_plans_consistent(&app).await;

        // Nothing is resent: plans whose send was in flight are paused, not due. A later
        // tick sends only the plans the killed process never reached, once each.
        app.tick(30).await;
        let deliveries = app.deliveries().await;
        assert!(deliveries.len() >= sent_before);
        for user in &users {
            let received = deliveries
                .iter()
                .filter(|d| d["openid"] == user.openid.as_str())
                .count();
            assert!(
                received <= 1,
                "{point}: {} received {received} messages",
                user.openid
            );
        }
        assert_ledger_agrees_with_counters(&app).await;
    }
    eprintln!(
        "during the finalize: {finalize_landed} finalize(s) landed before the kill, {finalize_lost} did not"
    );
    assert!(
        finalize_landed > 0 && finalize_lost > 0,
        "a kill during the finalize lands it in some runs and not in others \
         ({finalize_landed} landed, {finalize_lost} lost)"
    );
}

/// A dispatcher killed between a settlement that gave a grant back and its wake of the
/// push waiting for it (issue 41 §6): round after round, two pushes wait for a grant,
/// one grant wakes the better, WeChat refuses it for good (47003, the grant given back)
/// and the process dies before waking the other. The grant's wake entry is due in the
/// settlement's own commit: the next container wakes the other push and sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_killed_before_waking_a_push_beside_a_grant_given_back_leaves_it_due() {
    use onegrant_tests::ORDER;
    use serde_json::json;
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let env = |failpoint: &'static str| {
        let mut env = vec![
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
            ("DISPATCH_ONCE_SECONDS", "30"),
        ];
        if !failpoint.is_empty() {
            env.push(("ONEGRANT_FAILPOINT", failpoint));
        }
        env
    };
    let push = |user: &User, key: &str, priority: &str| {
        json!({"idempotency_key": key, "openid": user.openid, "type": "order",
               "title": key, "priority": priority, "wechat": {"template_id": ORDER,
               "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}})
    };
    for round in 0..3 {
        let user = app.user(&format!("woken-{round}")).await;
        let (refused, asleep) = (format!("refused-{round}"), format!("asleep-{round}"));
        app.notify(push(&user, &refused, "high")).await;
        app.notify(push(&user, &asleep, "normal")).await;
        let waits = app.ticks_until(|s| s.grant_waits >= 2).await;
        assert_eq!(waits.grant_waits, 2, "{waits:?}");
        // One grant: its report wakes the better push; WeChat refuses it for good.
        app.accept(&user, ORDER, &format!("wr_{round}")).await;
        app.control(
            "POST",
            "faults",
            Some(json!({"openid": user.openid, "errcode": 47003, "times": 1})),
        )
        .await;
        let status = app
            .dispatcher_process(env!("CARGO_BIN_EXE_dispatch-once"), &env("before_wake"))
            .status()
            .expect("dispatch-once runs");
        assert_eq!(
            status.signal(),
            Some(9),
            "killed before the wake ({status})"
        );
        app.emulator_quiet().await;
        let states = app.outbox_states(&user).await;
        assert_eq!(
            (states[&refused].as_str(), states[&asleep].as_str()),
            ("failed", "pending"),
            "round {round}"
        );
        // The next container (or the one after: a woken push is due from the wake on)
        // sends it with the grant given back.
        for _ in 0..3 {
            if app.outbox_states(&user).await[&asleep] == "sent" {
                break;
            }
            let status = app
                .dispatcher_process(env!("CARGO_BIN_EXE_dispatch-once"), &env(""))
                .stdout(std::process::Stdio::null())
                .status()
                .expect("dispatch-once runs");
            assert!(status.success(), "{status}");
        }
        assert_eq!(
            app.outbox_states(&user).await[&asleep],
            "sent",
            "round {round}: the push beside the grant given back went out"
        );
    }
    let deliveries = app.deliveries().await;
    assert_eq!(deliveries.len(), 3, "one delivery a round: {deliveries:?}");
    assert_ledger_agrees_with_counters(&app).await;
}

/// A dispatcher process killed in the middle of an erasure's step (after its first
/// batch of deletes, before the step is recorded): the erasure stays pending and due,
/// and the next ticks finish it — no item naming the user is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_killed_in_the_middle_of_an_erasure_leaves_it_for_the_next_tick() {
    use onegrant::domain::OpenId;
    use onegrant::domain::erasure::ErasureCause;
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("zoe").await;
    let pk = format!("USER#{}", user.openid);
    app.put_notes(&user, 300).await;
    let openid = OpenId::parse(user.openid.clone()).expect("openid");
    app.deps
        .store
        .start_erasure(&openid, ErasureCause::Operator, app.now())
        .await
        .expect("begun");
    let left = || async {
        app.items()
            .await
            .iter()
            .filter(|i| attr_s(i, "pk") == Some(pk.as_str()))
            .count()
    };
    let status = app
        .dispatcher_process(
            env!("CARGO_BIN_EXE_dispatch-once"),
            &[
                ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
                ("DISPATCH_ONCE_SECONDS", "30"),
                ("ONEGRANT_FAILPOINT", "erase_batch"),
            ],
        )
        .status()
        .expect("dispatch-once runs");
    assert_eq!(status.signal(), Some(9), "killed mid-step ({status})");
    app.emulator_quiet().await;
    assert_eq!(left().await, 300 - 25, "one batch deleted before the kill");
    let tombstone = app
        .items()
        .await
        .into_iter()
        .find(|i| attr_s(i, "kind") == Some("tombstone"))
        .expect("the tombstone");
    assert_eq!(attr_s(&tombstone, "state"), Some("pending"));

    // Another container's ticks carry it on; done once the partition stayed empty.
    let first = app.tick(30).await;
    assert!(first.erasure_steps >= 1, "{first:?}");
    assert_eq!(left().await, 0);
    app.advance(std::time::Duration::from_secs(121));
    let done = app.ticks_until(|s| s.erasures_done >= 1).await;
    assert_eq!(done.erasures_done, 1, "{done:?}");
    let naming = app
        .items()
        .await
        .into_iter()
        .filter(|i| format!("{i:?}").contains(&user.openid))
        .count();
    assert_eq!(naming, 0, "no item names her");
}

/// What became of a publisher's push is told even when the dispatcher dies around its
/// finalize: the outcome rides in the status change's own transaction, so whichever
/// status the push ends with (the finalize landed: `sent`; it did not, and the sweep
/// settled it: `unknown`), exactly that outcome reaches the publisher's webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_killed_around_a_pushs_finalize_loses_none_of_its_outcome() {
    use onegrant_tests::{ORDER, Receiver, SHOP, order_detail};
    for point in ["during_finalize:0", "during_finalize:300"] {
        let receiver = Receiver::spawn().await;
        let publishers = serde_json::json!([
            {"source": SHOP.source, "key": SHOP.key, "webhook": receiver.url}
        ])
        .to_string();
        let app = spawn_app_with(&[
            ("DISPATCH_LEASE_SECONDS", LEASE_SECONDS),
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
            ("ONEGRANT_PUBLISHERS", &publishers),
        ])
        .await;
        let user = app.user("told").await;
        app.accept(&user, ORDER, "told_1").await;
        let detail = order_detail(&user.openid, "o-crash", serde_json::json!({}));
        assert_eq!(app.publish(&detail, SHOP).await.status, 201);

        let status = run_until_killed(&app, point);
        assert_eq!(status.signal(), Some(9), "{point}: killed ({status})");
        app.emulator_quiet().await;
        // What the crash left unsettled, the sweep settles after the lease (and its
        // outcome is due from then).
        let after = onegrant::Clock::real_now() + AFTER_EVERY_LEASE;
        app.sweep_at(after).await;
        app.move_to(after);
        let ended = app
            .items_of(&user, "note")
            .await
            .first()
            .and_then(|n| attr_s(n, "push_status").map(str::to_string))
            .unwrap_or_default();
        assert!(
            ended == "sent" || ended == "unknown",
            "{point}: the push ended {ended}"
        );
        let told = app.deliver_outcomes().await;
        let statuses: Vec<String> = receiver
            .received()
            .iter()
            .filter_map(|p| p.outcome["status"].as_str().map(str::to_string))
            .collect();
        assert_eq!(statuses, std::slice::from_ref(&ended), "{point}: {told:?}");
        eprintln!("{point}: the push ended {ended}, and that was told");
    }
}
