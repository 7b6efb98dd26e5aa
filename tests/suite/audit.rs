//! The audit trail: a user taken through report → reserve → send → `unknown` → settled
//! by WeChat's sent event → re-grant → disable. At every step the history (one entry per
//! transaction, written in it) tells each grant's, delivery's and plan's state as the
//! ledger, the counters and the plan hold it; no entry ever changes once written; and
//! the timeline `onegrant-audit` prints names every step in order with its cause.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use onegrant::domain::audit::{HistoryWindow, Line, timeline};
use onegrant::store::audit::{HistoryItem, UNATTRIBUTED};
use onegrant_tests::{TestApp, User, WATER, attr_n, attr_s, spawn_pushing_app};
use serde_json::json;

type Item = HashMap<String, AttributeValue>;

/// The user's whole history (the tests' histories are short).
async fn history(app: &TestApp, user: &User) -> Vec<HistoryItem> {
    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let window = HistoryWindow {
        since: None,
        limit: 10_000,
    };
    let read = app
        .deps
        .store
        .history(&openid, window)
        .await
        .expect("history");
    assert!(read.from_start && !read.more);
    read.entries
}

/// The history agrees with the items: each grant's, delivery's and plan's last entry is
/// its state now, the quota counts the grants whose last entry says available, and
/// every entry written before is still there, unchanged.
async fn assert_history_holds(app: &TestApp, user: &User, before: &mut Vec<Item>) {
    let entries = history(app, user).await;
    let lines = timeline(&entries, None, true);
    let mut last: HashMap<&str, &str> = HashMap::new();
    for line in &lines {
        last.insert(line.sk.as_str(), line.to.as_str());
        assert_ne!(line.cause, UNATTRIBUTED, "every change has a cause: {line}");
    }
    let mut available = 0;
    for kind in ["grant", "delivery", "plan"] {
        for item in app.items_of(user, kind).await {
            let sk = attr_s(&item, "sk").unwrap_or_default();
            let state = attr_s(&item, "state").or_else(|| attr_s(&item, "result"));
            assert_eq!(
                last.get(sk).copied(),
                state,
                "{sk}: history says {:?}",
                last.get(sk)
            );
            if kind == "grant" && state == Some("available") {
                available += 1;
            }
        }
    }
    let quota = app
        .item(user, &format!("QUOTA#{WATER}"))
        .await
        .expect("quota");
    assert_eq!(
        attr_n(&quota, "available"),
        Some(available),
        "counters agree with the history"
    );
    // Append-only: what was there is still there, byte for byte.
    let now = app.items_of(user, "history").await;
    for old in before.iter() {
        assert!(
            now.contains(old),
            "a history entry changed or vanished: {old:?}"
        );
    }
    *before = now;
}

/// `(entity, to, cause)` of each line, for the expected sequence.
fn steps(lines: &[Line]) -> Vec<(String, String, String)> {
    lines
        .iter()
        .map(|l| (l.entity.clone(), l.to.clone(), l.cause.clone()))
        .collect()
}

#[tokio::test]
async fn a_users_timeline_tells_every_step_with_its_cause_and_always_matches_the_ledger() {
    let app = spawn_pushing_app(1).await;
    let mut seen = Vec::new();
    let user = app.user("alice").await;

    app.accept(&user, WATER, "wr_first").await;
    assert_history_holds(&app, &user, &mut seen).await;
    let plan = app.enable(&user, "water").await;
    assert_eq!(plan.body["state"], "scheduled");
    assert_history_holds(&app, &user, &mut seen).await;

    // Sent, the connection dropped: unknown; then WeChat's sent event settles it.
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "drop_after_delivery": true})),
    )
    .await;
    app.make_due(&user, "water", app.now()).await;
    // (30 s: a pushing app's first send needs 17.5 s of the tick; 20 left a loaded
    // machine 2.5 s to read the due index, and once it did not.)
    let ticked = app.tick(30).await;
    assert_eq!(ticked.claimed, 1, "{ticked:?}");
    let mut settled = false;
    for _ in 0..100 {
        let delivery = app.items_of(&user, "delivery").await;
        if delivery.first().and_then(|d| attr_s(d, "state")) == Some("sent") {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(settled, "WeChat's sent event settled the unknown send");
    assert_history_holds(&app, &user, &mut seen).await;

    app.accept(&user, WATER, "wr_second").await;
    assert_history_holds(&app, &user, &mut seen).await;
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);
    assert_history_holds(&app, &user, &mut seen).await;

    let entries = history(&app, &user).await;
    let lines = timeline(&entries, Some(WATER), true);
    let printed: Vec<String> = lines.iter().map(ToString::to_string).collect();
    let delivery = app.items_of(&user, "delivery").await;
    let msgid = delivery
        .first()
        .and_then(|d| attr_s(d, "msgid"))
        .expect("msgid")
        .to_string();
    let grant1 = format!("GRANT#{WATER}#wr_first");
    let grant2 = format!("GRANT#{WATER}#wr_second");
    let expected: Vec<(&str, &str, &str, &str)> = vec![
        // (entity key prefix, to, cause prefix, why)
        (
            grant1.as_str(),
            "available",
            "report wr_first",
            "the tap's grant",
        ),
        ("PLAN#water", "scheduled", "settings", "turned on"),
        (
            grant1.as_str(),
            "reserved",
            "dispatcher",
            "reserved by the claim",
        ),
        ("DELIVERY#", "sending", "dispatcher", "the send"),
        ("PLAN#water", "sending", "dispatcher", "the plan sending"),
        ("DELIVERY#", "unknown", "dispatcher", "the answer lost"),
        (
            grant1.as_str(),
            "invalid",
            "dispatcher",
            "voided while unknown",
        ),
        (
            "DELIVERY#",
            "sent",
            "WeChat sent event",
            "settled by the event",
        ),
        (
            grant1.as_str(),
            "consumed",
            "WeChat sent event",
            "spent after all",
        ),
        (
            "PLAN#water",
            "awaiting_checkin",
            "WeChat sent event",
            "the plan moves on",
        ),
        (
            grant2.as_str(),
            "available",
            "report wr_second",
            "re-granted",
        ),
        (
            grant2.as_str(),
            "invalid",
            "settings",
            "voided by the disable",
        ),
        ("PLAN#water", "disabled", "settings", "turned off"),
    ];
    // In this order, where the changes of one transaction (one time, one cause) may come
    // in any order among themselves; other lines may come between.
    let group_start = |i: usize| {
        let mut start = i;
        while start > 0
            && lines[start - 1].at == lines[i].at
            && lines[start - 1].cause == lines[i].cause
        {
            start -= 1;
        }
        start
    };
    let mut used = vec![false; lines.len()];
    let mut floor = 0;
    for (sk, to, cause, why) in &expected {
        let found = (floor..lines.len()).find(|&i| {
            !used[i]
                && lines[i].sk.starts_with(sk)
                && lines[i].to == *to
                && lines[i].cause.starts_with(cause)
        });
        let Some(i) = found else {
            panic!(
                "no {why} ({sk} → {to} by {cause}) from line {floor} in:\n{}",
                printed.join("\n")
            );
        };
        used[i] = true;
        floor = group_start(i);
    }
    // From → to comes from the entity's own previous entry.
    let voided = lines
        .iter()
        .find(|l| l.sk == grant1 && l.to == "invalid")
        .expect("the voided grant");
    assert_eq!(voided.from.as_deref(), Some("reserved"));
    let event = lines
        .iter()
        .find(|l| l.sk.starts_with("DELIVERY#") && l.to == "sent")
        .expect("the settled send");
    assert_eq!(
        (event.from.as_deref(), event.msgid.as_deref()),
        (Some("unknown"), Some(msgid.as_str()))
    );
    assert!(
        printed
            .iter()
            .any(|l| l.contains(&format!("msgid {msgid}"))),
        "{printed:?}"
    );
    assert!(steps(&lines).len() >= expected.len());
}

#[tokio::test]
async fn disabling_a_plan_with_a_hundred_open_grants_leaves_a_trace_of_every_one() {
    let app = onegrant_tests::spawn_app_with(&[("REPORTS_PER_MINUTE", "600")]).await;
    let user = app.scheduled_user("many", 99).await;
    let off = app.disable(&user, "water").await;
    assert_eq!(off.status, 200, "{}", off.body);
    let lines = timeline(&history(&app, &user).await, Some(WATER), true);
    let voided = lines
        .iter()
        .filter(|l| l.entity == "grant" && l.to == "invalid" && l.cause == "settings")
        .count();
    assert_eq!(
        voided, 99,
        "every grant the disable voided is in the history"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.sk == "PLAN#water" && l.to == "disabled")
    );
    let mut seen = Vec::new();
    assert_history_holds(&app, &user, &mut seen).await;
}

#[tokio::test]
async fn an_operators_read_of_a_long_history_is_bounded_by_its_window() {
    let app = onegrant_tests::spawn_app().await;
    let user = app.user("long").await;
    let pk = format!("USER#{}", user.openid);
    // 250 entries a second apart (as 250 changes would leave them), written directly.
    let t0 = app.now() - chrono::Duration::days(30);
    let entries: Vec<HistoryItem> = (0..250)
        .map(|i| {
            let at = t0 + chrono::Duration::seconds(i);
            HistoryItem {
                pk: pk.clone(),
                sk: format!("HIST#{:013}#{i:08x}", at.timestamp_millis()),
                kind: "history".into(),
                at: at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                cause: format!("report r{i}"),
                changes: vec![onegrant::domain::audit::Change {
                    entity: "grant".into(),
                    sk: format!("GRANT#{WATER}#r{}", i / 2),
                    to: if i % 2 == 0 { "available" } else { "consumed" }.into(),
                    template_id: Some(WATER.into()),
                    msgid: None,
                    errcode: None,
                    reason: None,
                }],
                expires_at: (app.now() + chrono::Duration::days(1)).timestamp(),
            }
        })
        .collect();
    for chunk in entries.chunks(25) {
        let writes = chunk
            .iter()
            .map(|e| {
                aws_sdk_dynamodb::types::WriteRequest::builder()
                    .put_request(
                        aws_sdk_dynamodb::types::PutRequest::builder()
                            .set_item(Some(serde_dynamo::to_item(e).expect("item")))
                            .build()
                            .expect("put"),
                    )
                    .build()
            })
            .collect();
        app.table
            .client
            .batch_write_item()
            .request_items(&app.table.name, writes)
            .send()
            .await
            .expect("history written");
    }
    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let (app, openid) = (&app, &openid);
    let read = |since, limit| async move {
        app.round_trips.take_items_read();
        let read = app
            .deps
            .store
            .history(openid, HistoryWindow { since, limit })
            .await
            .expect("history");
        (read, app.round_trips.take_items_read())
    };
    // The newest 50: 51 items read (one more says more are left), not 250.
    let (newest, items) = read(None, 50).await;
    assert_eq!(newest.entries.len(), 50);
    assert!(newest.more && !newest.from_start);
    assert_eq!(newest.entries[49].cause, "report r249", "the newest last");
    assert_eq!(newest.entries[0].cause, "report r200");
    assert!(items <= 51, "{items} items read for 50 entries");
    // From an instant on, in the key condition: nothing earlier is read.
    let (recent, items) = read(Some(t0 + chrono::Duration::seconds(200)), 1000).await;
    assert_eq!(recent.entries.len(), 50);
    assert!(!recent.more);
    assert!(items <= 50, "{items} items read for the 50 entries since");
    let (window, items) = read(Some(t0 + chrono::Duration::seconds(100)), 20).await;
    assert_eq!(window.entries.len(), 20);
    assert_eq!(window.entries[0].cause, "report r100");
    assert!(window.more);
    assert!(items <= 21, "{items} items read for 20 entries");
    // A state left before the window is not taken for a new one.
    let lines = timeline(&window.entries, Some(WATER), window.from_start);
    assert_eq!(
        lines[0].from.as_deref(),
        Some(onegrant::domain::audit::EARLIER)
    );
    assert_eq!(lines[1].from.as_deref(), Some("available"), "{}", lines[1]);
    // The whole of it, when asked: from the first entry, every state known.
    let (all, _) = read(None, 10_000).await;
    assert_eq!(all.entries.len(), 250);
    assert!(all.from_start && !all.more);
    assert_eq!(timeline(&all.entries, None, true)[0].from, None);
}
