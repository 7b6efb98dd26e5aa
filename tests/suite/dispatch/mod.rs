//! The dispatcher: at most once, on time, one grant per send, finalize always.

mod cap;
mod database_faults;
mod priority;
mod priority_together;
mod refill;
mod sweep;

mod fanout;
mod grant_lists;
mod in_flight;
mod late_answers;
mod outcomes;
mod sends;
mod shards;

use std::collections::HashMap;

use chrono::Duration;
use futures::StreamExt;
use futures::future::join_all;
use onegrant_tests::{
    ORDER, TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_no_plan_stuck_sending,
    assert_plans_consistent, attr_n, attr_s, spawn_app_isolated, spawn_app_with,
};
use serde_json::{Value, json};

const FAST: [(&str, &str); 3] = [
    ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
    // Generous for a loopback stand-in under a loaded CI machine; the timeout row hangs
    // well past it.
    ("WECHAT_TIMEOUT_MS", "1500"),
    ("WECHAT_CONNECT_TIMEOUT_MS", "300"),
];

/// A user with `grants` accepted water grants (held at the stand-in too) and the water
/// plan enabled, due now.
async fn due_user(app: &TestApp, name: &str, grants: u32) -> User {
    let user = app.scheduled_user(name, grants).await;
    app.make_due(&user, "water", app.now()).await;
    user
}

/// `n` users named `prefix0`… each due now with one grant, set up 8 at a time.
async fn due_users(app: &TestApp, prefix: &str, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(8, |name| async move {
            due_user(app, name, 1).await;
        })
        .await;
}

fn state(item: &Option<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>) -> Option<&str> {
    item.as_ref().and_then(|i| attr_s(i, "state"))
}

/// Up to three more ticks (of `seconds` each) until `summaries` have sent `want`: on a
/// loaded machine a dispatcher may give a claim back unsent for want of time (its
/// grant restored, the item due again), and a later tick sends it, still once.
async fn catch_up(
    app: &TestApp,
    summaries: &mut Vec<dispatcher::Summary>,
    want: usize,
    seconds: u64,
) {
    for _ in 0..3 {
        let sent: u32 = summaries.iter().map(|s| s.sent).sum();
        if sent as usize >= want {
            break;
        }
        summaries.push(app.tick(seconds).await);
    }
}
