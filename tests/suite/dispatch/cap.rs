//! The daily cap (`PUSHES_PER_DAY`): per user and template, counted in the user's day,
//! reminders and pushes alike; past it a push waits for the next day (or goes
//! inbox-only, `capped`, if it expires first) and nothing is sent or spent.

use chrono::{DateTime, Duration, NaiveDate, Timelike, Utc};
use onegrant::domain::dispatch::claim::Unsent;
use onegrant::domain::reminders::schedule::Timezone;
use onegrant::store::dispatch::ClaimOutcome;
use onegrant_tests::{
    ORDER, TestApp, User, WATER, assert_ledger_agrees_with_counters, attr_n, attr_s, spawn_app_with,
};
use serde_json::{Value, json};

fn push(user: &User, key: &str, expires_at: Option<DateTime<Utc>>) -> Value {
    let mut event = json!({"idempotency_key": format!("{}-{key}", user.openid), "openid": user.openid,
           "type": "order", "title": "t",
           "wechat": {"template_id": ORDER,
                      "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}});
    if let Some(at) = expires_at {
        event["expires_at"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    event
}

/// A fixed-offset zone where it is now around noon, and the start of its next day: a
/// test's day that does not end while it runs.
fn noon_zone() -> (&'static str, DateTime<Utc>) {
    const ZONES: [&str; 27] = [
        "Etc/GMT+12",
        "Etc/GMT+11",
        "Etc/GMT+10",
        "Etc/GMT+9",
        "Etc/GMT+8",
        "Etc/GMT+7",
        "Etc/GMT+6",
        "Etc/GMT+5",
        "Etc/GMT+4",
        "Etc/GMT+3",
        "Etc/GMT+2",
        "Etc/GMT+1",
        "Etc/GMT",
        "Etc/GMT-1",
        "Etc/GMT-2",
        "Etc/GMT-3",
        "Etc/GMT-4",
        "Etc/GMT-5",
        "Etc/GMT-6",
        "Etc/GMT-7",
        "Etc/GMT-8",
        "Etc/GMT-9",
        "Etc/GMT-10",
        "Etc/GMT-11",
        "Etc/GMT-12",
        "Etc/GMT-13",
        "Etc/GMT-14",
    ];
    // Offset (hours east of UTC) 12 - hour: between -11 and +12.
    let now = onegrant::Clock::real_now();
    let offset = 12 - i64::from(now.hour());
    let name = ZONES[usize::try_from(offset + 12).expect("offset")];
    let tz = Timezone::parse(name).expect("zone").tz();
    let local = now.with_timezone(&tz);
    let next = local.date_naive().succ_opt().expect("a next day");
    let start = next
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_local_timezone(tz)
        .single()
        .expect("fixed offset")
        .with_timezone(&Utc);
    (name, start)
}

/// The quota item's count of sends on `day` (`sent_on_YYYYMMDD`).
async fn sent_on(app: &TestApp, user: &User, template: &str, day: NaiveDate) -> Option<i64> {
    let quota = app.item(user, &format!("QUOTA#{template}")).await?;
    attr_n(&quota, &format!("sent_on_{}", day.format("%Y%m%d")))
}

#[tokio::test]
async fn pushes_past_the_daily_cap_wait_for_the_users_next_day_and_spend_no_grant() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0"), ("PUSHES_PER_DAY", "2")]).await;
    let user = app.user("alice").await;
    for i in 0..6 {
        app.accept(&user, ORDER, &format!("wr_{i}")).await;
    }
    // The user's day is their quiet hours' zone: one where it is about noon, quiet
    // only in the first minute of the day.
    let (zone, next_day) = noon_zone();
    let prefs = json!({"quiet_hours": {"start": "00:00", "end": "00:01", "timezone": zone},
                       "muted_types": []});
    let saved = app
        .call(
            "PUT",
            "/v1/preferences",
            Some(&user.token),
            Some(prefs.to_string().into_bytes()),
        )
        .await;
    assert_eq!(saved.status, 200, "{}", saved.body);
    for i in 0..5 {
        app.notify(push(&user, &format!("p{i}"), None)).await;
    }
    // (One tick may leave some for the next on a loaded machine.)
    let (mut sent, mut waits) = (0, 0);
    for _ in 0..5 {
        let tick = app.tick(30).await;
        sent += tick.sent;
        waits += tick.cap_waits;
        assert_eq!(tick.capped, 0, "{tick:?}");
        if sent + waits == 5 {
            break;
        }
    }
    assert_eq!((sent, waits), (2, 3), "two sent, three wait");
    // Another that expires before the user's day ends: past the cap, inbox-only.
    app.notify(push(&user, "p5", Some(next_day - Duration::minutes(1))))
        .await;
    let last = app.tick(30).await;
    assert_eq!(
        (last.sent, last.capped, last.cap_waits),
        (0, 1, 0),
        "{last:?}"
    );
    let outbox = app.items_of(&user, "outbox").await;
    let states = |state: &str| {
        outbox
            .iter()
            .filter(|o| attr_s(o, "state") == Some(state))
            .collect::<Vec<_>>()
    };
    assert_eq!(states("sent").len(), 2);
    assert_eq!(states("capped").len(), 1);
    let waiting = states("pending");
    assert_eq!(waiting.len(), 3);
    for item in &waiting {
        assert_eq!(
            attr_n(item, "due_at"),
            Some(next_day.timestamp_millis()),
            "due again at the start of the user's next day"
        );
    }
    // The notifications say why.
    let notes = app.get("/v1/notifications", Some(&user.token)).await.body;
    let pushes: Vec<&Value> = notes["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| &n["push"])
        .collect();
    let count = |status: &str, reason: Value| {
        pushes
            .iter()
            .filter(|p| p["status"] == status && p["reason"] == reason)
            .count()
    };
    assert_eq!(count("pending", json!("capped")), 3, "{notes}");
    assert_eq!(count("capped", Value::Null), 1, "{notes}");
    assert_eq!(count("sent", Value::Null), 2, "{notes}");
    // Two grants spent, four left; two sends counted on the user's day.
    assert_eq!(app.deliveries().await.len(), 2);
    assert_eq!(app.available(&user, ORDER).await, 4);
    let today = (next_day - Duration::hours(12)).date_naive();
    assert_eq!(sent_on(&app, &user, ORDER, today).await, Some(2));
    // Another tick today sends nothing more.
    let again = app.tick(5).await;
    assert_eq!((again.sent, again.claimed), (0, 0), "{again:?}");
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_reminder_counts_against_the_cap_and_a_send_that_did_not_go_out_gives_its_count_back() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0"), ("PUSHES_PER_DAY", "1")]).await;
    // Reminders and pushes without quiet hours count in China's day: the test runs at
    // its midday, hours from its midnight whatever the hour here.
    app.move_to_china_midday();
    let user = app.scheduled_user("alice", 3).await;
    let shanghai = Timezone::SHANGHAI.tz();
    let today = app.now().with_timezone(&shanghai).date_naive();
    // A water push whose send WeChat refuses as busy: not sent, its grant and its count
    // given back.
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": -1, "times": 1})),
    )
    .await;
    let water = |key: &str| {
        json!({"idempotency_key": key, "openid": user.openid, "type": "water", "title": "t",
               "wechat": {"template_id": WATER,
                          "data": {"thing1": "喝水", "time2": "2026-12-02 10:00", "number3": "1"}}})
    };
    app.notify(water("busy")).await;
    let first = app.tick(30).await;
    assert_eq!((first.claimed, first.sent), (1, 0), "{first:?}");
    assert_eq!(sent_on(&app, &user, WATER, today).await, Some(0));
    assert_eq!(app.available(&user, WATER).await, 3, "the grant is back");
    // Its retry is due later; a new push takes the day's one send.
    app.notify(water("sent")).await;
    let second = app.tick(30).await;
    assert_eq!(second.sent, 1, "{second:?}");
    assert_eq!(sent_on(&app, &user, WATER, today).await, Some(1));
    // The reminder, due now, is past the cap: due again at the next day's first
    // waking moment (08:00 in Shanghai), its grant kept.
    app.make_due(&user, "water", app.now()).await;
    let third = app.tick(30).await;
    assert_eq!((third.sent, third.cap_waits), (0, 1), "{third:?}");
    let plan = app.item(&user, "PLAN#water").await.expect("plan");
    assert_eq!(attr_s(&plan, "state"), Some("scheduled"));
    let wake = today
        .succ_opt()
        .and_then(|d| d.and_hms_opt(8, 0, 0))
        .and_then(|t| t.and_local_timezone(shanghai).single())
        .expect("08:00")
        .with_timezone(&Utc);
    assert_eq!(attr_n(&plan, "due_at"), Some(wake.timestamp_millis()));
    assert_eq!(app.available(&user, WATER).await, 2);
    assert_eq!(app.deliveries().await.len(), 1, "one message went out");
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn racing_claims_never_pass_the_cap() {
    let app = spawn_app_with(&[("PUSHES_PER_DAY", "2")]).await;
    let store = &app.deps.store;
    let mut users = Vec::new();
    for u in 0..4 {
        let user = app.user(&format!("racer{u}")).await;
        for i in 0..5 {
            app.accept(&user, ORDER, &format!("wr_{u}_{i}")).await;
        }
        for i in 0..6 {
            app.notify(push(&user, &format!("r{u}-{i}"), None)).await;
        }
        users.push(user);
    }
    let shanghai = Timezone::SHANGHAI.tz();
    // Two rounds in the users' days: now, then (as the dispatcher would see it) just
    // after their next day starts, when the waiting pushes are due again.
    let now = app.now();
    let next_day = now
        .with_timezone(&shanghai)
        .date_naive()
        .succ_opt()
        .and_then(|d| d.and_hms_opt(0, 0, 1))
        .and_then(|t| t.and_local_timezone(shanghai).single())
        .expect("next day")
        .with_timezone(&Utc);
    for (round, at) in [now, next_day].into_iter().enumerate() {
        let span = store.shard_span(at).await.expect("registry");
        let due = store
            .due_items(at + Duration::seconds(5), &span)
            .await
            .expect("due");
        assert_eq!(due.len(), if round == 0 { 24 } else { 16 }, "round {round}");
        // Every due push claimed at once, by its own task.
        let claims = futures::future::join_all(due.iter().map(|item| async move {
            let lease = std::time::Duration::from_secs(30);
            store
                .claim(item, &format!("racer-{round}"), lease, at)
                .await
                .expect("claim")
        }))
        .await;
        let claimed: Vec<_> = claims
            .iter()
            .filter_map(|c| match c {
                ClaimOutcome::Claimed(claim) => Some(claim),
                _ => None,
            })
            .collect();
        let waits = claims
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    ClaimOutcome::Unsent {
                        why: Unsent::CapWait(_),
                        ..
                    }
                )
            })
            .count();
        assert_eq!(
            (claimed.len(), waits),
            (8, claims.len() - 8),
            "round {round}: two per user, the rest wait: {claims:?}"
        );
        let day = at.with_timezone(&shanghai).date_naive();
        for user in &users {
            let theirs = claimed
                .iter()
                .filter(|c| c.openid.as_str() == user.openid)
                .count();
            assert_eq!(theirs, 2, "round {round}");
            assert_eq!(sent_on(&app, user, ORDER, day).await, Some(2));
        }
        for claim in claimed {
            app.finalize_sent(claim, &format!("m-{}", claim.delivery_id))
                .await;
        }
    }
    for user in &users {
        assert_eq!(app.items_of(user, "delivery").await.len(), 4);
        assert_eq!(app.available(user, ORDER).await, 1);
        let pending = app
            .items_of(user, "outbox")
            .await
            .iter()
            .filter(|o| attr_s(o, "state") == Some("pending"))
            .count();
        assert_eq!(pending, 2, "two still waiting, for the day after");
    }
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_send_wechat_refused_gives_its_count_back_though_its_grant_stays_void() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0"), ("PUSHES_PER_DAY", "1")]).await;
    app.move_to_china_midday();
    let user = app.user("alice").await;
    app.accept(&user, ORDER, "wr_0").await;
    let today = app
        .now()
        .with_timezone(&Timezone::SHANGHAI.tz())
        .date_naive();
    // WeChat answers 43101 (the user no longer holds the subscription): the grant is
    // voided, and nothing went out, so the day's one send is not used up.
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": 43101, "times": 1})),
    )
    .await;
    app.notify(push(&user, "refused", None)).await;
    let first = app.tick(30).await;
    assert_eq!((first.claimed, first.sent), (1, 0), "{first:?}");
    assert_eq!(sent_on(&app, &user, ORDER, today).await, Some(0));
    assert_eq!(
        app.available(&user, ORDER).await,
        0,
        "43101 voids the grant"
    );
    // The user accepts again: today's send is still theirs.
    app.accept(&user, ORDER, "wr_1").await;
    app.notify(push(&user, "sent", None)).await;
    let second = app.tick(30).await;
    assert_eq!((second.sent, second.cap_waits), (1, 0), "{second:?}");
    assert_eq!(sent_on(&app, &user, ORDER, today).await, Some(1));
    assert_eq!(app.deliveries().await.len(), 1, "one message went out");
    assert_ledger_agrees_with_counters(&app).await;
}
