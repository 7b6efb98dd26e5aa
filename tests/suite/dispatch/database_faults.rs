//! Real DynamoDB failure modes on every write path: throttles, transaction conflicts,
//! 500s and commits whose answer is lost, injected by the fault proxy between the
//! functions' SDK client and the emulator (`onegrant_tests::faults`).

use onegrant_tests::faults::{Fault, FaultProxy, ONCE};
use onegrant_tests::{
    TestApp, User, assert_ledger_agrees_with_counters, assert_no_plan_stuck_sending,
    assert_plans_consistent, attr_s, spawn_faulty_app,
};

/// (A 2.5 s WeChat call: a tick's first send needs 17.5 s of it, so the tests tick 30 s,
/// leaving a loaded machine time to read the due index first.)
const FAST: [(&str, &str); 2] = [
    ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
    ("WECHAT_TIMEOUT_MS", "1500"),
];

/// A query of the due index.
const DUE_QUERY: &str = "\"IndexName\":\"due\"";

/// The claim's transaction: the only one that reserves a grant.
const CLAIM: &str = onegrant_tests::faults::RESERVES_A_GRANT;

use super::due_user;

async fn invariants(app: &TestApp) {
    assert_ledger_agrees_with_counters(app).await;
    assert_plans_consistent(app).await;
    assert_no_plan_stuck_sending(app).await;
}

fn injected(proxy: &FaultProxy, fault: Fault) -> usize {
    proxy.injected().iter().filter(|(_, f)| *f == fault).count()
}

/// After a tick that met faults: its one reminder sent once (not unknown, not lost),
/// the plan awaiting its check-in, and the invariants whole.
async fn sent_once(app: &TestApp, user: &User, summary: &dispatcher::Summary, case: &str) {
    assert_eq!(
        (summary.sent, summary.unknown, summary.lost),
        (1, 0, 0),
        "{case}: {summary:?}"
    );
    assert_eq!(app.deliveries().await.len(), 1, "{case}");
    awaiting_checkin(app, user, case).await;
}

/// The user's water plan awaits its check-in, and the invariants hold.
async fn awaiting_checkin(app: &TestApp, user: &User, case: &str) {
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(
        plan.body["state"], "awaiting_checkin",
        "{case}: {}",
        plan.body
    );
    invariants(app).await;
}

#[tokio::test]
async fn a_claim_whose_answers_are_lost_past_the_sdks_retries_or_late_is_still_sent_once() {
    // Lost three times: the SDK's attempts run out and the store sends it again with
    // the same token. Late: the SDK's attempt times out (1 s) while it commits.
    for (fault, times) in [
        (Fault::CommitThenDrop, 3),
        (
            Fault::CommitThenDelay(std::time::Duration::from_millis(1500)),
            1,
        ),
    ] {
        let case = format!("{fault:?} × {times}");
        let (app, proxy) = spawn_faulty_app(&FAST).await;
        let user = due_user(&app, "lost-thrice", 1).await;
        proxy.inject("TransactWriteItems", Some(CLAIM), fault, times);
        let summary = app.tick(30).await;
        assert_eq!(injected(&proxy, fault), times as usize, "{case}");
        sent_once(&app, &user, &summary, &case).await;
    }
}

#[tokio::test]
async fn a_claim_whose_commit_answer_is_lost_and_whose_retries_are_throttled_is_still_sent_once() {
    // The first attempt commits unseen; the attempts after it meet a throttle, a
    // provisioned-throughput refusal or "in progress". None of those says whether the
    // first committed, so the transaction goes again with its token until DynamoDB
    // answers for it (the emulator: that commit's success) — and when the throttles
    // outlast the store's resends (12), the claim finds its own delivery instead of
    // reading its own claim back as someone else's.
    for (fault, times) in [
        (Fault::Throttle, 3),
        (Fault::ProvisionedThroughput, 3),
        (Fault::InProgress, 3),
        (Fault::Unavailable, 3),
        (Fault::InProgress, 8),
        (Fault::Throttle, 12),
    ] {
        let case = format!("{fault:?} × {times}");
        let (app, proxy) = spawn_faulty_app(&FAST).await;
        let user = due_user(&app, "lost-then-refused", 1).await;
        proxy.inject("TransactWriteItems", Some(CLAIM), Fault::CommitThenDrop, 1);
        proxy.inject("TransactWriteItems", Some(CLAIM), fault, times);
        let summary = app.tick(30).await;
        sent_once(&app, &user, &summary, &case).await;
        assert_eq!(injected(&proxy, Fault::CommitThenDrop), 1, "{case}");
        assert!(injected(&proxy, fault) >= 3, "{case}");
    }
}

#[tokio::test]
async fn a_claim_whose_commit_answer_is_lost_is_still_sent_once_on_time_not_unknown() {
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "dropped-claim", 1).await;
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::CommitThenDrop, 1);
    let summary = app.tick(30).await;
    assert_eq!(injected(&proxy, Fault::CommitThenDrop), 1);
    assert_eq!((summary.sent, summary.unknown), (1, 0), "{summary:?}");
    assert_eq!(app.deliveries().await.len(), 1);
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(delivery.len(), 1);
    assert_eq!(attr_s(&delivery[0], "state"), Some("sent"));
    awaiting_checkin(&app, &user, "").await;
}

#[tokio::test]
async fn a_claim_that_commits_after_its_delivery_was_looked_for_is_sent_not_left_to_the_sweep() {
    // The claim's first attempt is held on its way (the client's attempt times out) and
    // the resends meet "in progress" until the store stops asking; the delivery it
    // looks for then is not there, and the held attempt commits just after that look.
    // The plan then reads as claimed by another: it is this call's own claim, with the
    // grant it reserved, and goes out once — not `lost` now and `unknown` (its grant
    // void, nothing sent) when the sweep finds it.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "late-commit", 1).await;
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::HoldThenCommit, 1);
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::InProgress, 9);
    proxy.inject("GetItem", Some("DELIVERY#"), Fault::ReleaseHeld, 1);
    let summary = app.tick(30).await;
    assert_eq!(injected(&proxy, Fault::HoldThenCommit), 1);
    assert_eq!(injected(&proxy, Fault::ReleaseHeld), 1);
    // The held attempt did commit late, and its delivery is the one sent.
    let released = proxy.released();
    assert_eq!(released.len(), 1);
    let (status, body) = &released[0];
    assert_eq!(*status, 200, "the held claim applied: {body}");
    sent_once(&app, &user, &summary, "late commit").await;
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(delivery.len(), 1);
    assert_eq!(attr_s(&delivery[0], "state"), Some("sent"));
    let sk = attr_s(&delivery[0], "sk").expect("sk");
    assert!(body.contains(sk), "the delivery sent is the late claim's");
}

#[tokio::test]
async fn a_due_page_unreadable_past_the_sdks_retries_is_read_again_in_the_same_tick() {
    // The due-index query of the only shard throttled on all three of the SDK's
    // attempts: the lane reads the same page again (nothing of it was handed out) and
    // the reminder goes out in this tick, not a minute later. Throttled on every read
    // the lane makes, the shard is skipped for the next tick, as before.
    let (app, proxy) = spawn_faulty_app(&[FAST[0], FAST[1], ("DUE_SHARDS", "1")]).await;
    let user = due_user(&app, "due-throttled", 1).await;
    proxy.inject("Query", Some(DUE_QUERY), Fault::Throttle, 3);
    // (A tick's budget well past what the reads need: a tick ends as soon as its lanes
    // are done, and a lane stops reading, uncounted, once too little budget is left for
    // a send — seen on a loaded CI machine with 20 s, every shard still re-reading.)
    let summary = app.tick(60).await;
    assert_eq!(injected(&proxy, Fault::Throttle), 3);
    assert_eq!(summary.skipped, 0, "{summary:?}");
    sent_once(&app, &user, &summary, "read again").await;

    let other = due_user(&app, "due-unreadable", 1).await;
    proxy.inject("Query", Some(DUE_QUERY), Fault::Throttle, 0);
    let skipped = app.tick(60).await;
    proxy.clear();
    // (Every shard the registry spans is skipped: the store's default count too.)
    assert!(skipped.skipped >= 1 && skipped.sent == 0, "{skipped:?}");
    // At least one read per lane try, each of the SDK's attempts throttled.
    assert!(
        injected(&proxy, Fault::Throttle) >= 3 + 3 * 3,
        "{:?}",
        proxy.injected()
    );
    let next = app.tick(30).await;
    assert_eq!((next.sent, next.unknown, next.lost), (1, 0, 0), "{next:?}");
    assert_eq!(app.deliveries().await.len(), 2, "each sent once");
    awaiting_checkin(&app, &other, "next tick").await;
}

#[tokio::test]
async fn a_claim_whose_answer_is_lost_and_whose_delivery_cannot_be_looked_for_is_still_sent() {
    // Committed with its answer lost, the resends answered "in progress" until the store
    // stops asking, and the look for its delivery throttled on every SDK attempt: the
    // look is not an answer, the plan then reads as claimed, and the claim looks again
    // (one BatchGetItem) and finds its own delivery — sent once, not left `unknown`.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "lost-unlooked", 1).await;
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::CommitThenDrop, 1);
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::InProgress, 9);
    proxy.inject("GetItem", Some("DELIVERY#"), Fault::Throttle, 3);
    let summary = app.tick(30).await;
    assert_eq!(injected(&proxy, Fault::CommitThenDrop), 1);
    assert_eq!(injected(&proxy, Fault::Throttle), 3, "the look failed");
    sent_once(&app, &user, &summary, "look failed").await;
}

#[tokio::test]
async fn a_lost_claim_whose_last_look_fails_too_is_looked_for_again_and_sent() {
    // As above, and the call's last look (one BatchGetItem) throttled on every SDK
    // attempt as well — seen beside two CPU hogs, where the sweep then voided the
    // grant of a message that never went out. The claim looks again after a pause.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "lost-unlooked-twice", 1).await;
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::CommitThenDrop, 1);
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::InProgress, 9);
    proxy.inject("GetItem", Some("DELIVERY#"), Fault::Throttle, 3);
    proxy.inject("BatchGetItem", Some("DELIVERY#"), Fault::Throttle, 3);
    let summary = app.tick(30).await;
    assert_eq!(injected(&proxy, Fault::CommitThenDrop), 1);
    assert_eq!(injected(&proxy, Fault::Throttle), 6, "both looks failed");
    sent_once(&app, &user, &summary, "last look failed").await;
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(delivery.len(), 1);
    assert_eq!(attr_s(&delivery[0], "state"), Some("sent"));
}

#[tokio::test]
async fn a_publication_whose_answer_is_lost_is_counted_once_by_the_dispatcher_that_made_it() {
    // A scheduled notification (no push) published at its instant, the transaction
    // committed with its answer lost and the resends answered "in progress" until the
    // store stops asking: the next read finds it gone, and the resend of the lost
    // attempt, with its token, says it was this call's — published and counted once.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = app.user("lost-publication").await;
    app.hold_clock();
    let send_at = app.now() + chrono::Duration::seconds(2);
    let mut detail = onegrant_tests::inbox::scheduled(
        &user,
        "lost-publication",
        serde_json::json!({"send_at": onegrant_tests::inbox::at(send_at)}),
    );
    detail.as_object_mut().expect("object").remove("wechat");
    let answer = app.notify(detail).await;
    app.let_clock_run();
    assert_eq!(answer["status"], "created", "{answer}");
    proxy.inject(
        "TransactWriteItems",
        Some("SCHEDULED#"),
        Fault::CommitThenDrop,
        1,
    );
    proxy.inject(
        "TransactWriteItems",
        Some("SCHEDULED#"),
        Fault::InProgress,
        9,
    );
    let summary = app.tick(30).await;
    proxy.clear();
    assert_eq!(injected(&proxy, Fault::CommitThenDrop), 1);
    assert_eq!(summary.published, 1, "{summary:?}");
    assert_eq!(app.items_of(&user, "note").await.len(), 1);
    assert!(app.items_of(&user, "scheduled").await.is_empty());
    let unread = app
        .get("/v1/notifications/unread-count", Some(&user.token))
        .await;
    assert_eq!(unread.body["unread"], 1, "{}", unread.body);
}

/// A write path under test: what it does, and how to check it did it exactly once.
#[derive(Debug, Clone, Copy)]
enum Path {
    GrantReport,
    CheckIn,
    Settings,
    Disable,
    NotifyIngest,
    Read,
    ReadAll,
}

const PATHS: [Path; 7] = [
    Path::GrantReport,
    Path::CheckIn,
    Path::Settings,
    Path::Disable,
    Path::NotifyIngest,
    Path::Read,
    Path::ReadAll,
];

/// A user with a scheduled water plan (one grant) and two unread notifications.
async fn setup(app: &TestApp) -> (User, Vec<String>) {
    let user = app.scheduled_user("faulty", 1).await;
    let mut ids = Vec::new();
    for i in 0..2 {
        let answer = app
            .notify(
                serde_json::json!({"idempotency_key": format!("n-{i}"), "openid": user.openid,
                                       "type": "order", "title": "t", "body": "b"}),
            )
            .await;
        ids.push(answer["note_id"].as_str().unwrap_or_default().to_string());
    }
    (user, ids)
}

/// Runs `path` once; its HTTP status (or the ingest's answer's status as 200/500), body
/// and `Retry-After` seconds. (`at`: the check-in's time, the same for a replay.)
async fn act(
    app: &TestApp,
    user: &User,
    ids: &[String],
    path: Path,
    at: &str,
) -> (u16, serde_json::Value, Option<u64>) {
    use serde_json::json;
    let answer = match path {
        Path::GrantReport => {
            app.post(
                "/v1/grants",
                Some(&user.token),
                &json!({"request_id": "wr_fault", "results": {"tmpl_water_reminder": "accept"}}),
            )
            .await
        }
        Path::CheckIn => {
            app.post(
                "/v1/reminders/water/checkins",
                Some(&user.token),
                &json!({"action_id": "ck_fault", "grant_request_id": "wr_ck", "subscription_status": "accept",
                        "occurred_at": at, "current_count": 1, "daily_goal": 8}),
            )
            .await
        }
        Path::Settings => {
            app.call(
                "PUT",
                "/v1/reminders/water",
                Some(&user.token),
                Some(br#"{"enabled": true, "interval_minutes": 90}"#.to_vec()),
            )
            .await
        }
        Path::Disable => {
            app.disable(user, "water").await
        }
        Path::NotifyIngest => {
            let answer = app
                .notify(json!({"idempotency_key": "n-fault", "openid": user.openid,
                               "type": "order", "title": "t", "body": "b"}))
                .await;
            // Created, or (a replay) found: either way the note's id.
            let status = if answer["note_id"].is_string() { 200 } else { 500 };
            return (status, answer, None);
        }
        Path::Read => {
            app.call(
                "POST",
                &format!("/v1/notifications/{}/read", ids[0]),
                Some(&user.token),
                None,
            )
            .await
        }
        Path::ReadAll => app.read_all(user).await,
    };
    let retry_after = answer
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (answer.status, answer.body, retry_after)
}

/// What `path` must have left, exactly once.
async fn check(app: &TestApp, user: &User, path: Path, case: &str) {
    let grants = app.items_of(user, "grant").await;
    let notes = app.items_of(user, "note").await;
    let unread = app
        .get("/v1/notifications/unread-count", Some(&user.token))
        .await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    match path {
        Path::GrantReport => assert_eq!(grants.len(), 2, "{case}"),
        Path::CheckIn => {
            assert_eq!(grants.len(), 2, "{case}");
            assert_eq!(app.items_of(user, "action").await.len(), 1, "{case}");
            assert_eq!(plan.body["today"]["count"], 1, "{case}: {}", plan.body);
        }
        Path::Settings => {
            assert_eq!(plan.body["settings"]["interval_minutes"], 90, "{case}")
        }
        Path::Disable => {
            assert_eq!(plan.body["state"], "disabled", "{case}");
            assert!(
                grants.iter().all(|g| attr_s(g, "state") == Some("invalid")),
                "{case}: {grants:?}"
            );
        }
        Path::NotifyIngest => assert_eq!(notes.len(), 3, "{case}"),
        Path::Read => assert_eq!(unread.body["unread"], 1, "{case}: {}", unread.body),
        Path::ReadAll => assert_eq!(unread.body["unread"], 0, "{case}: {}", unread.body),
    }
    invariants(app).await;
}

#[tokio::test]
async fn every_api_write_path_meeting_each_fault_once_ends_as_without_it() {
    for path in PATHS {
        for fault in ONCE {
            let case = format!("{path:?} × {fault:?}");
            let (app, proxy) = spawn_faulty_app(&FAST).await;
            let (user, ids) = setup(&app).await;
            // The path's first transaction meets the fault (nothing else runs now).
            proxy.inject("TransactWriteItems", None, fault, 1);
            let at = app.now().to_rfc3339();
            let (status, body, _) = act(&app, &user, &ids, path, &at).await;
            assert_eq!(status, 200, "{case}: {body}");
            assert_eq!(injected(&proxy, fault), 1, "{case}: the fault was met");
            proxy.clear();
            check(&app, &user, path, &case).await;
            // And the same request again is a replay, not a second write.
            let (again, body, _) = act(&app, &user, &ids, path, &at).await;
            assert_eq!(again, 200, "{case}: replay {body}");
            check(&app, &user, path, &format!("{case}, replayed")).await;
        }
    }
}

#[tokio::test]
async fn an_api_write_path_the_database_keeps_refusing_answers_503_and_changes_nothing() {
    // (Each gives up after the store's write budget, 4 s.)
    for path in PATHS {
        let (app, proxy) = spawn_faulty_app(&FAST).await;
        let (user, ids) = setup(&app).await;
        let before = app.items().await;
        proxy.inject("TransactWriteItems", None, Fault::Throttle, 0);
        proxy.inject("UpdateItem", None, Fault::Throttle, 0);
        proxy.inject("PutItem", None, Fault::Throttle, 0);
        let (status, body, retry_after) =
            act(&app, &user, &ids, path, &app.now().to_rfc3339()).await;
        proxy.clear();
        if matches!(path, Path::NotifyIngest) {
            assert_eq!(
                status, 500,
                "{path:?}: the event is failed for EventBridge to retry: {body}"
            );
        } else {
            assert_eq!(status, 503, "{path:?}: {body}");
            assert_eq!(body["error"]["code"], "unavailable", "{path:?}: {body}");
            assert!(
                retry_after.is_some_and(|s| s >= 1),
                "{path:?}: Retry-After {retry_after:?}"
            );
        }
        let after = app.items().await;
        assert_eq!(before, after, "{path:?}: nothing partial");
    }
}

/// Every operation the API and the callback send to DynamoDB.
const EVERY_OPERATION: [&str; 7] = [
    "GetItem",
    "BatchGetItem",
    "Query",
    "TransactWriteItems",
    "UpdateItem",
    "PutItem",
    "DeleteItem",
];

/// When DynamoDB keeps answering throttles, or keeps answering 500s, past the SDK's
/// retries — reads as well as writes — every route answers 503 with `Retry-After`,
/// never `500 internal`, and nothing is stored.
#[tokio::test]
async fn every_route_meeting_throttles_or_500s_on_reads_and_writes_answers_503_and_stores_nothing()
{
    for fault in [Fault::Throttle, Fault::ServerError] {
        let (app, proxy) = onegrant_tests::spawn_faulty_pushing_app(1).await;
        let (user, ids) = setup(&app).await;
        let before = app.items().await;
        for operation in EVERY_OPERATION {
            proxy.inject(operation, None, fault, 0);
        }
        let mut answers = Vec::new();
        for path in PATHS {
            if matches!(path, Path::NotifyIngest) {
                // Not an HTTP route: a failed event is for EventBridge to retry.
                continue;
            }
            let (status, body, retry_after) =
                act(&app, &user, &ids, path, &app.now().to_rfc3339()).await;
            answers.push((format!("{path:?}"), status, body, retry_after));
        }
        for route in [
            "/v1/grants",
            "/v1/reminders/water",
            "/v1/notifications",
            "/v1/notifications/unread-count",
        ] {
            let answer = app.get(route, Some(&user.token)).await;
            let retry_after = answer
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            answers.push((route.to_string(), answer.status, answer.body, retry_after));
        }
        for (route, status, body, retry_after) in &answers {
            assert_eq!(*status, 503, "{fault:?} {route}: {body}");
            assert_eq!(body["error"]["code"], "unavailable", "{fault:?} {route}");
            assert!(
                retry_after.is_some_and(|s| s >= 1),
                "{fault:?} {route}: Retry-After {retry_after:?}"
            );
        }
        // WeChat's push: answered 503 too, so WeChat retries it.
        let pushed = app
            .push_event(serde_json::json!({"event": "popup", "openid": user.openid,
                "template_id": "tmpl_water_reminder", "status": "reject",
                "create_time": app.now().timestamp()}))
            .await;
        assert_eq!(
            pushed["answers"],
            serde_json::json!([503]),
            "{fault:?}: {pushed}"
        );
        assert!(
            injected(&proxy, fault) >= answers.len(),
            "{fault:?}: the fault was met"
        );
        proxy.clear();
        assert_eq!(before, app.items().await, "{fault:?}: nothing partial");
    }
}

#[tokio::test]
async fn the_dispatchers_claim_and_finalize_meeting_each_fault_once_send_once_on_time() {
    // The claim's transaction reserves a grant; the finalize's records `finished_at`.
    for (step, pattern) in [("claim", CLAIM), ("finalize", "finished_at")] {
        for fault in ONCE {
            let case = format!("{step} × {fault:?}");
            let (app, proxy) = spawn_faulty_app(&FAST).await;
            let user = due_user(&app, "dispatched", 1).await;
            proxy.inject("TransactWriteItems", Some(pattern), fault, 1);
            let mut summary = app.tick(30).await;
            // On a loaded machine a tick may skip a shard the emulator did not answer in
            // time (nothing claimed, nothing written): the next tick takes it.
            for _ in 0..4 {
                if summary.claimed > 0 || injected(&proxy, fault) > 0 {
                    break;
                }
                summary = app.tick(30).await;
            }
            assert_eq!(injected(&proxy, fault), 1, "{case}: the fault was met");
            sent_once(&app, &user, &summary, &case).await;
            // Nothing left for a later tick to send again.
            assert_eq!(app.tick(10).await.claimed, 0, "{case}");
            assert_eq!(app.deliveries().await.len(), 1, "{case}");
            invariants(&app).await;
        }
    }
}

#[tokio::test]
async fn the_sweep_meeting_each_fault_once_still_recovers_a_vanished_claim_once() {
    for fault in ONCE {
        let case = format!("sweep × {fault:?}");
        let (app, proxy) = spawn_faulty_app(&FAST).await;
        let user = due_user(&app, "vanished", 1).await;
        let now = app.now();
        let span = app.deps.store.shard_span(now).await.expect("registry");
        let due = app
            .deps
            .store
            .due_items(now + chrono::Duration::seconds(5), &span)
            .await
            .expect("due");
        app.claim_and_vanish(&due[0], now).await;
        proxy.inject("TransactWriteItems", Some("swept_at"), fault, 1);
        let later = now + chrono::Duration::seconds(60);
        let mut recovered = app.sweep_at(later).await.recovered;
        if recovered == 0 {
            // A fault the sweep does not retry within its tick waits for the next one.
            recovered = app.sweep_at(later).await.recovered;
        }
        assert_eq!(recovered, 1, "{case}");
        assert_eq!(injected(&proxy, fault), 1, "{case}: the fault was met");
        assert_eq!(app.sweep_at(later).await.recovered, 0, "{case}: once");
        let delivery = app.items_of(&user, "delivery").await;
        assert_eq!(attr_s(&delivery[0], "state"), Some("unknown"), "{case}");
        // The vanished dispatcher never sent, and nothing sends it now (I4).
        assert_eq!(app.deliveries().await.len(), 0, "{case}");
        assert_eq!(app.tick(10).await.claimed, 0, "{case}");
        assert_eq!(app.deliveries().await.len(), 0, "{case}");
        let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
        assert_eq!(
            plan.body["pause_reason"], "uncertain",
            "{case}: {}",
            plan.body
        );
        invariants(&app).await;
    }
}

#[tokio::test]
async fn a_tick_whose_every_third_transaction_loses_its_answer_sends_each_due_plan_once() {
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let mut users = Vec::new();
    for i in 0..10 {
        users.push(due_user(&app, &format!("every{i}"), 1).await);
    }
    proxy.inject_every("TransactWriteItems", None, Fault::CommitThenDrop, 0, 3);
    let mut sent = 0;
    for _ in 0..3 {
        let summary = app.tick(30).await;
        assert_eq!(summary.unknown, 0, "{summary:?}");
        sent += summary.sent;
    }
    proxy.clear();
    // Ten claims and ten finalizes (plus the SDK's resends): a third of them lost.
    let lost = injected(&proxy, Fault::CommitThenDrop);
    assert!(lost >= 6, "{lost} answers lost");
    assert_eq!(sent, 10);
    assert_eq!(app.deliveries().await.len(), 10, "one message per due plan");
    for user in &users {
        let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
        assert_eq!(plan.body["state"], "awaiting_checkin", "{}", plan.body);
    }
    invariants(&app).await;
}

#[tokio::test]
async fn paths_of_many_transactions_whose_every_other_answer_is_lost_end_as_without_it() {
    // read-all over 120 unread notes (49 per transaction) and a disable voiding 100
    // grants (96 per transaction): every second transaction commits unseen, so the
    // later steps of each path meet the fault too, not only the first.
    let overrides = [
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
        ("REPORTS_PER_MINUTE", "600"),
    ];
    let (app, proxy) = spawn_faulty_app(&overrides).await;
    let user = app.scheduled_user("many", 100).await;
    for i in 0..120 {
        app.notify(serde_json::json!({"idempotency_key": format!("many-{i}"),
                                      "openid": user.openid, "type": "order",
                                      "title": "t", "body": "b"}))
            .await;
    }
    proxy.inject_every("TransactWriteItems", None, Fault::CommitThenDrop, 0, 2);
    let read_all = app.read_all(&user).await;
    assert_eq!(read_all.status, 200, "{}", read_all.body);
    assert_eq!(read_all.body["more"], false, "{}", read_all.body);
    let disabled = app.disable(&user, "water").await;
    assert_eq!(disabled.status, 200, "{}", disabled.body);
    let lost = injected(&proxy, Fault::CommitThenDrop);
    proxy.clear();
    assert!(lost >= 3, "answers lost: {lost}");

    let unread = app
        .get("/v1/notifications/unread-count", Some(&user.token))
        .await;
    assert_eq!(unread.body["unread"], 0, "{}", unread.body);
    let notes = app.items_of(&user, "note").await;
    assert_eq!(notes.len(), 120);
    assert!(
        notes.iter().all(|n| n.get("read_at").is_some()),
        "every note read"
    );
    app.assert_grants_void(&user, 100).await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "disabled", "{}", plan.body);
    invariants(&app).await;
}

#[tokio::test]
async fn a_report_whose_commit_answer_is_lost_past_the_sdks_retries_counts_as_written_once() {
    // The SDK's three attempts all lose their answers; the first committed. The store's
    // next attempt (a new token) finds the grant already there — written by this very
    // call, so it counts as written (the `GrantsReported` metric), and a later replay
    // of the same report does not.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = app.user("lost-report").await;
    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let templates = app.deps.config.templates.clone();
    let report = onegrant::domain::grants::GrantReport::from_json(
        &serde_json::json!({"request_id": "wr_lost", "results": {"tmpl_water_reminder": "accept"}}),
        &templates,
    )
    .expect("a valid report");
    proxy.inject(
        "TransactWriteItems",
        Some("wr_lost"),
        Fault::CommitThenDrop,
        3,
    );
    let store = &app.deps.store;
    let first = store
        .record_grants(&openid, &report, None, app.now())
        .await
        .expect("recorded");
    assert_eq!(injected(&proxy, Fault::CommitThenDrop), 3);
    assert_eq!(first.written, 1, "{first:?}");
    let again = store
        .record_grants(&openid, &report, None, app.now())
        .await
        .expect("replayed");
    assert_eq!(again.written, 0, "{again:?}");
    assert_eq!(app.items_of(&user, "grant").await.len(), 1);
    invariants(&app).await;
}

#[tokio::test]
async fn a_sweep_that_cannot_read_a_vanished_pushs_item_leaves_it_whole_for_the_next_tick() {
    // A dispatcher claimed a push and vanished. The sweep's read of the push item meets
    // throttles past the SDK's retries: settling the delivery and its grant without the
    // push would leave the push `sending` for good (it has no lease of its own), so the
    // entry waits for the next tick, which settles all three.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = app.user("push-vanished").await;
    app.accept(&user, onegrant_tests::ORDER, "wr_push_vanished")
        .await;
    app.push(&user, "vanished-push").await;
    let now = app.now();
    let span = app.deps.store.shard_span(now).await.expect("registry");
    let due = app
        .deps
        .store
        .due_items(now + chrono::Duration::seconds(5), &span)
        .await
        .expect("due");
    assert_eq!(due.len(), 1);
    app.claim_and_vanish(&due[0], now).await;
    proxy.inject("GetItem", Some("OUTBOX#"), Fault::Throttle, 3);
    let later = now + chrono::Duration::seconds(60);
    let first = app.sweep_at(later).await;
    assert_eq!(injected(&proxy, Fault::Throttle), 3);
    assert_eq!((first.recovered, first.skipped), (0, 1), "{first:?}");
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(attr_s(&delivery[0], "state"), Some("sending"), "left whole");
    assert_eq!(app.sweep_at(later).await.recovered, 1);
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(attr_s(&delivery[0], "state"), Some("unknown"));
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(attr_s(&outbox[0], "state"), Some("unknown"), "{outbox:?}");
    assert_eq!(app.deliveries().await.len(), 0, "never sent");
    invariants(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finalize_failing_after_its_settlement_is_tried_again_and_finishes_what_follows() {
    // WeChat answers 43101 (the user refused the template): the settlement lands, then
    // the invalidation of the template's other grants cannot read the counters for now
    // (throttled past the SDK's retries) and the finalize fails. The dispatcher tries
    // it again; the second try finds its own settlement landed and runs the
    // invalidation, instead of taking it for someone else's and skipping it.
    // (A client timeout far past the test's own steps: the send is held in flight by the
    // stand-in until the fault is set, not by a latency the machine's speed could
    // outrun.)
    let (app, proxy) = spawn_faulty_app(&[FAST[0], ("WECHAT_TIMEOUT_MS", "10000")]).await;
    let user = due_user(&app, "refused-then-unread", 2).await;
    app.control(
        "POST",
        "faults",
        Some(serde_json::json!({"openid": user.openid, "errcode": 43101})),
    )
    .await;
    app.hold_sends(&user.openid, true).await;
    let tick = app.tick(120);
    let inject = async {
        // Once the claim has read the counters: during the send.
        app.until_sending(&user, "water").await;
        proxy.inject("BatchGetItem", Some("QUOTA#"), Fault::Throttle, 3);
        app.hold_sends(&user.openid, false).await;
    };
    let (summary, ()) = tokio::join!(tick, inject);
    assert_eq!(injected(&proxy, Fault::Throttle), 3);
    assert_eq!((summary.claimed, summary.failed), (1, 1), "{summary:?}");
    // 43101 voids every grant of the template.
    app.assert_grants_void(&user, 2).await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "paused", "{}", plan.body);
    invariants(&app).await;
}

#[tokio::test]
async fn a_finalize_tried_again_after_it_landed_finishes_as_its_own_not_as_superseded() {
    let (app, _proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "twice-finalized", 2).await;
    let now = app.now();
    let claim = app.claim_due(now).await;
    let first = app.finalize_sent(&claim, "4200000000000000002").await;
    assert!(!first.superseded);
    let items = app.items().await;
    let again = app.finalize_sent(&claim, "4200000000000000002").await;
    assert!(!again.superseded, "its own settlement: {again:?}");
    assert_eq!(app.items().await, items, "nothing changed the second time");
    awaiting_checkin(&app, &user, "").await;
}

#[tokio::test]
async fn a_late_answer_whose_plan_cannot_be_read_for_now_reads_it_again() {
    // Swept `unknown` (the dispatcher stalled past its lease), then WeChat's `sent`
    // arrives; the first read of the plan is throttled past the SDK's retries. The
    // answer must still move the plan on, not leave it paused `uncertain` for good.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "late-unread", 1).await;
    let now = app.now();
    let claim = app.claim_and_sweep(now).await;
    proxy.inject("BatchGetItem", Some("PLAN#water"), Fault::Throttle, 3);
    let finalized = app.finalize_sent(&claim, "4200000000000000003").await;
    assert_eq!(injected(&proxy, Fault::Throttle), 3);
    assert!(finalized.late, "{finalized:?}");
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(attr_s(&delivery[0], "state"), Some("sent"));
    awaiting_checkin(&app, &user, "").await;
}

#[tokio::test]
async fn a_late_answer_failing_after_its_settlement_is_finished_by_the_next_try() {
    // Swept `unknown`, then WeChat's late answer: 43101. Its settlement lands; the
    // invalidation of the template's other grants meets throttles past the write
    // budget and the finalize fails. The next try finds its own late settlement landed
    // and runs the invalidation, instead of taking it for someone else's.
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "late-refused", 2).await;
    let now = app.now();
    let claim = app.claim_and_sweep(now).await;
    let refused = || onegrant::domain::settle::SendResult::Refused {
        errcode: 43101,
        errmsg: "user refuse to accept the msg".into(),
    };
    // The invalidation's transaction is the one that stamps `voided_at`.
    proxy.inject("TransactWriteItems", Some("voided_at"), Fault::Throttle, 0);
    let first = app.deps.store.finalize(&claim, &refused(), app.now()).await;
    assert!(first.is_err(), "{first:?}");
    proxy.clear();
    let again = app.finalize_as(&claim, refused()).await;
    assert!(again.late && !again.superseded, "{again:?}");
    app.assert_grants_void(&user, 2).await;
    invariants(&app).await;
}

/// WeChat answered `ok`, and then every transaction recording it is refused while the
/// invocation lasts (no sent event configured to settle it later): the finalize keeps the answer
/// on the delivery, and the sweep settles it `sent` with its msgid and the grant
/// consumed — never `unknown`.
#[tokio::test]
async fn a_sent_message_whose_settlement_never_lands_is_settled_sent_by_the_sweep() {
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = app.scheduled_user("kept", 1).await;
    app.make_due(&user, "water", app.now()).await;
    // Every transaction that would record the send (its grant `consumed`) is refused;
    // the claim before it is not.
    proxy.inject("TransactWriteItems", Some("consumed"), Fault::Throttle, 0);
    let summary = app.tick(30).await;
    proxy.clear();
    assert_eq!(summary.sent, 0, "the finalize never landed: {summary:?}");
    assert_eq!(app.deliveries().await.len(), 1, "WeChat took it");
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(
        attr_s(&delivery[0], "state"),
        Some("sending"),
        "{delivery:?}"
    );
    assert!(delivery[0].contains_key("kept_answer"), "{delivery:?}");

    let swept = app
        .sweep_at(app.now() + chrono::Duration::minutes(10))
        .await;
    assert_eq!((swept.kept, swept.recovered), (1, 0), "{swept:?}");
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(attr_s(&delivery[0], "state"), Some("sent"), "{delivery:?}");
    assert!(attr_s(&delivery[0], "msgid").is_some(), "{delivery:?}");
    let grants = app.items_of(&user, "grant").await;
    assert_eq!(attr_s(&grants[0], "state"), Some("consumed"), "{grants:?}");
    awaiting_checkin(&app, &user, "kept").await;
}

/// A send answered 43101 for a user holding 3 grants, with the voiding of the other
/// two refused for as long as the invocation lasts: the settled delivery stays on the
/// lease index, and the sweep finishes the voiding — `available: 0`.
#[tokio::test]
async fn a_43101_whose_voiding_never_lands_in_the_invocation_is_finished_by_the_sweep() {
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = app.scheduled_user("refused-void", 3).await;
    app.control(
        "POST",
        "faults",
        Some(serde_json::json!({"openid": user.openid, "errcode": 43101})),
    )
    .await;
    // The voiding's transactions are the ones that stamp `voided_at`.
    proxy.inject("TransactWriteItems", Some("voided_at"), Fault::Throttle, 0);
    app.make_due(&user, "water", app.now()).await;
    app.tick(30).await;
    proxy.clear();
    let available = |answer: serde_json::Value| {
        onegrant_tests::quota(&answer, "tmpl_water_reminder")["available"].clone()
    };
    let before = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(available(before.body), 2, "not voided in the invocation");

    let swept = app
        .sweep_at(app.now() + chrono::Duration::minutes(10))
        .await;
    assert_eq!(swept.kept, 1, "{swept:?}");
    let after = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(available(after.body), 0);
    app.assert_grants_void(&user, 3).await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["pause_reason"], "refused", "{}", plan.body);
    let again = app
        .sweep_at(app.now() + chrono::Duration::minutes(11))
        .await;
    assert_eq!(again.kept, 0, "off the lease index: {again:?}");
    invariants(&app).await;
}

/// Every later due-index page answered late while sends are in flight: the lane drives
/// those sends while it waits for the page, every one is sent, none `unknown`, and a
/// sweep running meanwhile (another container's tick) finds nothing to recover. (That
/// the old lane, which awaited the page alone, fails this could not be shown here: the
/// SDK's attempt timeout caps a delay below any lease, and the emulator's one-at-a-time
/// lock blurs which request waited on which; see the session note.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_in_flight_are_driven_while_a_slow_due_query_is_awaited() {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    // A lease well past what a loaded machine adds to a send (seen: 15 s from claim to
    // finalize beside two CPU hogs, past the 12 s default here), so a sweep finding a
    // claim to recover would mean a send left undriven, not a slow machine.
    let (app, proxy) = spawn_faulty_app(&[
        FAST[0],
        FAST[1],
        ("DUE_SHARDS", "1"),
        ("DISPATCH_LEASE_SECONDS", "60"),
        // Eight sends at once, enough to have some in flight at the second page,
        // without flooding the one-at-a-time emulator (32 at once, a loaded run's
        // writes timed out, leaving what the design gives the sweep).
        ("DISPATCH_CONCURRENCY", "8"),
    ])
    .await;
    let names: Vec<String> = (0..56).map(|i| format!("slow{i}")).collect();
    let users: Vec<User> = futures::stream::iter(names.iter())
        // (Two grants each: no send takes a last grant, so no refill notice is tried.)
        .map(|name| app.scheduled_user(name, 2))
        .buffered(4)
        .collect()
        .await;
    let now = app.now();
    for user in &users {
        app.make_due(user, "water", now).await;
    }
    // WeChat a little slow, so sends are in flight when the lane asks for its second
    // page (a page is 50 items); each due query's answer held back for less than the
    // client's attempt timeout.
    app.control("POST", "latency", Some(serde_json::json!({"ms": 300})))
        .await;
    let late = Fault::CommitThenDelay(std::time::Duration::from_millis(500));
    // (Only the pages after the first: the lane's first page has nothing in flight.)
    // Held back once: on a loaded machine the held answer can outlast the client's
    // attempt timeout, and then the SDK's retry, answered at once, reads the page
    // (held back every time, the page would fail and the shard wait for the next tick).
    proxy.inject("Query", Some("ExclusiveStartKey"), late, 1);
    let done = AtomicBool::new(false);
    let ticking = async {
        let summary = app.tick(60).await;
        done.store(true, Ordering::SeqCst);
        summary
    };
    let sweeping = async {
        let mut recovered = 0;
        while !done.load(Ordering::SeqCst) {
            // (A sweep whose registry read times out beside the held-back pages ends
            // there, as its invocation would: the next one runs.)
            recovered += app.try_sweep_at(app.now()).await.map_or(0, |s| s.recovered);
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        recovered
    };
    let (summary, recovered) = tokio::join!(ticking, sweeping);
    proxy.clear();
    assert!(injected(&proxy, late) >= 1, "a second page was awaited");
    assert_eq!(recovered, 0, "nothing for a sweep to recover: {summary:?}");
    assert_eq!(summary.unknown, 0, "{summary:?}");
    assert!(summary.sent > 0, "{summary:?}");
    // What a loaded machine left is settled by more ticks and, past the lease, sweeps:
    // an item whose claim timed out unclaimed is sent by a next tick; a claim that
    // committed with its answer lost and every look for it failing (the emulator
    // flooded: seen in a full run) is the sweep's, as if its dispatcher had died before
    // sending (design I4); a send whose finalize timed out is settled by its answer.
    // Read from the stored deliveries and the stand-in, not from the ticks' counts (a
    // send whose finalize failed is counted `skipped` by its tick, yet went out).
    let settled = |states: &[String]| {
        !states.is_empty() && states.iter().all(|s| s == "sent" || s == "unknown")
    };
    // Each user's deliveries' states, from one read of the table.
    let delivery_states = || async {
        let mut by_user = std::collections::HashMap::<String, Vec<String>>::new();
        for item in app.items().await {
            if attr_s(&item, "kind") == Some("delivery")
                && let (Some(pk), Some(state)) = (attr_s(&item, "pk"), attr_s(&item, "state"))
            {
                by_user
                    .entry(pk.to_string())
                    .or_default()
                    .push(state.to_string());
            }
        }
        by_user
    };
    let states_of = |by_user: &std::collections::HashMap<String, Vec<String>>, user: &User| {
        by_user
            .get(&format!("USER#{}", user.openid))
            .cloned()
            .unwrap_or_default()
    };
    for round in 0..8 {
        let by_user = delivery_states().await;
        if users.iter().all(|u| settled(&states_of(&by_user, u))) {
            break;
        }
        if round > 0 {
            app.move_to(app.now() + chrono::Duration::seconds(61));
            let _ = app.try_sweep_at(app.now()).await;
        }
        let next = Box::pin(app.tick(60)).await;
        assert_eq!(next.unknown, 0, "{next:?}");
    }
    let deliveries = app.deliveries().await;
    let by_user = delivery_states().await;
    for user in &users {
        let states = states_of(&by_user, user);
        assert!(settled(&states), "{}: {states:?}", user.openid);
        let to_them = deliveries
            .iter()
            .filter(|d| d["openid"] == user.openid.as_str())
            .count();
        assert!(to_them <= 1, "{}: sent {to_them} times", user.openid);
        if to_them == 0 {
            assert!(
                !states.iter().any(|s| s == "sent"),
                "{}: recorded sent, never sent",
                user.openid
            );
        }
    }
    invariants(&app).await;
}
