//! Real DynamoDB failure modes on every write path: throttles, transaction conflicts,
//! 500s and commits whose answer is lost, injected by the fault proxy between the
//! functions' SDK client and the emulator (`onegrant_tests::faults`).

use chrono::Utc;
use onegrant_tests::faults::{Fault, FaultProxy};
use onegrant_tests::{
    TestApp, User, assert_ledger_agrees_with_counters, assert_no_plan_stuck_sending,
    assert_plans_consistent, attr_s, spawn_faulty_app,
};

const FAST: [(&str, &str); 2] = [
    ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
    ("WECHAT_TIMEOUT_MS", "1500"),
];

/// The claim's transaction: the only one that reserves a grant.
const CLAIM: &str = ":reserved";

async fn due_user(app: &TestApp, name: &str, grants: u32) -> User {
    let user = app.scheduled_user(name, grants).await;
    app.make_due(&user, "water", Utc::now()).await;
    user
}

async fn invariants(app: &TestApp) {
    assert_ledger_agrees_with_counters(app).await;
    assert_plans_consistent(app).await;
    assert_no_plan_stuck_sending(app).await;
}

fn injected(proxy: &FaultProxy, fault: Fault) -> usize {
    proxy.injected().iter().filter(|(_, f)| *f == fault).count()
}

#[tokio::test]
async fn a_claim_whose_commit_answer_is_lost_is_still_sent_once_on_time_not_unknown() {
    let (app, proxy) = spawn_faulty_app(&FAST).await;
    let user = due_user(&app, "dropped-claim", 1).await;
    proxy.inject("TransactWriteItems", Some(CLAIM), Fault::CommitThenDrop, 1);
    let summary = app.tick(20).await;
    assert_eq!(injected(&proxy, Fault::CommitThenDrop), 1);
    assert_eq!((summary.sent, summary.unknown), (1, 0), "{summary:?}");
    assert_eq!(app.deliveries().await.len(), 1);
    let delivery = app.items_of(&user, "delivery").await;
    assert_eq!(delivery.len(), 1);
    assert_eq!(attr_s(&delivery[0], "state"), Some("sent"));
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "awaiting_checkin", "{}", plan.body);
    invariants(&app).await;
}
