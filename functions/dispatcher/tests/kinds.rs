//! A reminder kind removed from a deployment's configuration (or missing after a
//! rollback), met by dispatcher processes of that deployment: its plans' due entries
//! moved out of the way, not read again every tick, and sent when the kind is back.

use std::process::Stdio;

use chrono::Duration;
use onegrant_tests::{
    WATER, assert_ledger_agrees_with_counters, assert_plans_consistent, attr_n, attr_s,
    spawn_app_with, summary_of,
};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_dispatch-once");

/// The reminder kinds of the local stack and one more, `stretch`, on the water template.
fn with_stretch() -> String {
    let mut kinds: Vec<Value> =
        serde_json::from_str(onegrant_local::stack::LOCAL_REMINDERS).expect("local reminders");
    let mut stretch = kinds[0].clone();
    stretch["kind"] = json!("stretch");
    kinds.push(stretch);
    serde_json::to_string(&kinds).expect("JSON")
}

/// A deployment whose reminders no longer name `stretch` (removed, or a rollback) meets
/// 60 stretch plans due ahead of a water plan in one shard: a dispatcher process moves
/// each stretch entry an hour ahead (the plan untouched), sends the water reminder in
/// the same tick, logs one line for the kind and counts `parked`; its next tick reads
/// none of them again. With the kind back, each stretch plan goes out once within the
/// hour. (Before, each tick re-read and logged every stretch entry, ahead of the rest.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_reminder_kinds_plans_are_moved_aside_not_reread_and_go_out_when_it_is_back() {
    let kinds = with_stretch();
    let app = spawn_app_with(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DUE_SHARDS", "1"),
        ("ONEGRANT_REMINDERS", &kinds),
    ])
    .await;
    let now = app.now();
    let mut stretchers = Vec::new();
    for i in 0..60 {
        let user = app.user(&format!("stretch{i}")).await;
        app.accept(&user, WATER, &format!("wr_s{i}")).await;
        let plan = app.enable(&user, "stretch").await;
        assert_eq!(plan.body["state"], "scheduled", "{}", plan.body);
        app.make_due(&user, "stretch", now - Duration::minutes(10))
            .await;
        stretchers.push(user);
    }
    // One more stretcher refuses the template (the main switch off) while stretch is
    // not configured: the deployment that took that setting paused only the plans of
    // its kinds, so this plan still reads scheduled. (Written as that deployment's
    // consent leaves the quota item: its standing choice, and no plan of stretch.)
    let refuser = app.user("refuser").await;
    app.accept(&refuser, WATER, "wr_refuser").await;
    app.enable(&refuser, "stretch").await;
    app.make_due(&refuser, "stretch", now - Duration::minutes(10))
        .await;
    let drinker = app.scheduled_user("drinker", 1).await;
    app.make_due(&drinker, "water", now).await;

    // The deployment without stretch (the local stack's reminders: water only).
    let without = [
        ("DISPATCH_ONCE_SECONDS", "60"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DUE_SHARDS", "1"),
        ("ONEGRANT_REMINDERS", onegrant_local::stack::LOCAL_REMINDERS),
    ];
    let run = |env: [(&'static str, &'static str); 4]| {
        let command = app.dispatcher_process(BIN, &env);
        async move {
            let mut command = command;
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
            let out = tokio::task::spawn_blocking(move || command.output())
                .await
                .expect("join")
                .expect("dispatch-once runs");
            assert!(out.status.success(), "{}", out.status);
            // (Its log lines go where Lambda's do, to stdout, before the summary.)
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            let logged = stdout + &String::from_utf8_lossy(&out.stderr);
            (
                summary_of(
                    logged
                        .lines()
                        .rfind(|l| l.starts_with('{') && l.contains("\"parked\""))
                        .unwrap_or_default(),
                ),
                logged,
            )
        }
    };
    app.record_standing(&refuser, WATER, "main_switch_off")
        .await;
    let (first, logged) = run(without).await;
    assert_eq!(
        (first["parked"].as_u64(), first["sent"].as_u64()),
        (Some(61), Some(1)),
        "{first}"
    );
    assert_eq!(
        logged.matches("moved an hour ahead").count(),
        1,
        "one line for the kind: {logged}"
    );
    assert!(logged.contains("stretch"), "{logged}");
    // Each stretch entry moved about an hour ahead; the plan's own instant kept.
    for user in &stretchers {
        let plan = app.item(user, "PLAN#stretch").await.expect("the plan");
        let (due_at, next) = (attr_n(&plan, "due_at"), attr_n(&plan, "next_due_at"));
        let next = next.expect("next_due_at");
        assert_eq!(next, (now - Duration::minutes(10)).timestamp_millis());
        let moved = due_at.expect("still on the due index") - next;
        assert!(
            moved >= Duration::minutes(60).num_milliseconds(),
            "moved {moved} ms ahead"
        );
        assert_eq!(attr_s(&plan, "state"), Some("scheduled"));
    }
    assert_eq!(app.deliveries().await.len(), 1, "only the water reminder");
    let (second, logged) = run(without).await;
    assert_eq!(
        (second["due"].as_u64(), second["parked"].as_u64()),
        (Some(0), Some(0)),
        "nothing read again: {second}"
    );
    assert!(!logged.contains("moved an hour ahead"), "{logged}");

    // The kind back (the app's own configuration), past the hour: each goes out once.
    app.move_to(app.now() + Duration::minutes(61));
    // (And on to midday in Shanghai, the kinds' zone: a claim given back unsent on a
    // loaded machine is due again at once, not at the next morning there.)
    app.move_to_china_midday();
    // (The drinker's next water reminder may come due within that hour too, at the
    // start of their waking hours: counted apart.)
    let back = app.ticks_until(|s| s.sent >= 60 && s.turned_off >= 1).await;
    assert_eq!((back.parked, back.turned_off), (0, 1), "{back:?}");
    // The refusal wins: the refuser's plan paused for it, nothing sent, the grant kept.
    let plan = app.item(&refuser, "PLAN#stretch").await.expect("the plan");
    assert_eq!(
        (attr_s(&plan, "state"), attr_s(&plan, "pause_reason")),
        (Some("paused"), Some("main_switch_off"))
    );
    let grants = app.items_of(&refuser, "grant").await;
    assert_eq!(attr_s(&grants[0], "state"), Some("available"));
    let deliveries = app.deliveries().await;
    let counts: Vec<usize> = stretchers
        .iter()
        .map(|user| {
            deliveries
                .iter()
                .filter(|d| d["openid"] == user.openid.as_str())
                .count()
        })
        .collect();
    assert!(
        counts.iter().all(|&c| c == 1),
        "each stretcher once: {counts:?}, {back:?}, {} deliveries",
        deliveries.len()
    );
    // The message names the plan's own instant, not the hour it was moved to (Shanghai,
    // UTC+8 all year, the kind's zone).
    let shanghai = chrono::FixedOffset::east_opt(8 * 3600).expect("UTC+8");
    let own = (now - Duration::minutes(10))
        .with_timezone(&shanghai)
        .format("%H:%M")
        .to_string();
    for d in deliveries
        .iter()
        .filter(|d| d["openid"] != drinker.openid.as_str())
    {
        let time = d["data"]["time2"]["value"].as_str().unwrap_or_default();
        assert!(time.ends_with(&own), "{time} names {own}");
    }
    assert!(
        !deliveries
            .iter()
            .any(|d| d["openid"] == refuser.openid.as_str()),
        "nothing to the refuser"
    );
    assert_eq!(back.sent as usize, deliveries.len() - 1, "{back:?}");
    assert_plans_consistent(&app).await;
    assert_ledger_agrees_with_counters(&app).await;
}
