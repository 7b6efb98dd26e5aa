//! The scheduled-push bench (not a test): `cargo bench -p onegrant-tests --bench
//! scheduled` (`BENCH_PUSHES` sets how many; default 120, the figure is 1,000).
//!
//! From one run, each half on an emulator of its own with WeChat answering in 50 ms and
//! one tick that claims ahead (lookahead 75 s), started 5 s before the first instant:
//! 1. N reminder plans due at spread-out instants over one minute: due→sent p50/p99;
//! 2. N pushes scheduled (`send_at`) at the same spread-out instants over one minute,
//!    each published at its instant and then claimed and sent: due→sent p50/p99;
//!
//! and the ratio of the two p99s. Latency is from the due instant to WeChat's answer.

use chrono::{Duration, SecondsFormat, Utc};
use futures::StreamExt;
use onegrant_tests::{ORDER, TestApp, spawn_app_isolated};
use serde_json::json;

/// Set-ups in flight at once (the emulator applies one request at a time).
const SETUP_IN_FLIGHT: usize = 32;

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn app() -> TestApp {
    let app =
        spawn_app_isolated(&[("DISPATCH_LOOKAHEAD_SECONDS", "75"), ("DUE_SHARDS", "16")]).await;
    app.control("POST", "latency", Some(json!({"ms": 50})))
        .await;
    app
}

/// How long before the first instant each half's tick starts: the same for both, and
/// short enough that the tick's lookahead (75 s) covers the whole minute.
const TICK_LEAD: Duration = Duration::seconds(5);

/// Waits until `TICK_LEAD` before `t0`, so that one tick sees every item of the minute.
async fn start_tick_at(t0: chrono::DateTime<Utc>, what: &str) {
    let lead = (t0 - onegrant::Clock::real_now()).num_milliseconds();
    assert!(
        lead > TICK_LEAD.num_milliseconds(),
        "the {what} were stored too late ({lead} ms before the first instant); raise the lead"
    );
    eprintln!("{what} stored {lead} ms before the first is due");
    tokio::time::sleep(
        (t0 - TICK_LEAD - onegrant::Clock::real_now())
            .to_std()
            .unwrap_or_default(),
    )
    .await;
}

/// The sorted due→sent latencies of one tick.
fn outcome(summary: &dispatcher::Summary) -> Vec<i64> {
    let mut latencies = summary.latencies_ms.clone();
    latencies.sort_unstable();
    latencies
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("BENCH_PUSHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);

    // 1. Plans.
    let plans = app().await;
    let users: Vec<_> = futures::stream::iter((0..n).map(|i| {
        let plans = &plans;
        async move { plans.scheduled_user(&format!("plan{i}"), 1).await }
    }))
    .buffered(SETUP_IN_FLIGHT)
    .collect()
    .await;
    // The instants are set once every user exists, a little ahead of the stores.
    let t0 = onegrant::Clock::real_now() + Duration::seconds(10 + (n as i64) / 50);
    futures::stream::iter(users.iter().enumerate())
        .for_each_concurrent(8, |(i, user)| {
            let plans = &plans;
            async move {
                let offset = Duration::milliseconds((i as i64 * 60_000) / n as i64);
                plans.make_due(user, "water", t0 + offset).await;
            }
        })
        .await;
    start_tick_at(t0, "plans").await;
    let plan_summary = plans.tick(100).await;
    let plan_latencies = outcome(&plan_summary);
    drop(plans);

    // 2. Scheduled pushes.
    let pushes = app().await;
    let users: Vec<_> = futures::stream::iter((0..n).map(|i| {
        let pushes = &pushes;
        async move {
            let user = pushes.user(&format!("push{i}")).await;
            pushes.accept(&user, ORDER, &format!("wr_{i}")).await;
            user
        }
    }))
    .buffered(SETUP_IN_FLIGHT)
    .collect()
    .await;
    // The instants are set once every user exists, a little ahead of the stores.
    let t0 = onegrant::Clock::real_now() + Duration::seconds(10 + (n as i64) / 50);
    futures::stream::iter(users.iter().enumerate())
        .for_each_concurrent(8, |(i, user)| {
            let pushes = &pushes;
            async move {
                let offset = Duration::milliseconds((i as i64 * 60_000) / n as i64);
                let send_at = (t0 + offset).to_rfc3339_opts(SecondsFormat::Millis, true);
                let answer = pushes
                    .notify(json!({"idempotency_key": format!("appt-{i}"), "openid": user.openid,
                        "type": "order", "title": "预约提醒", "send_at": send_at,
                        "wechat": {"template_id": ORDER,
                                   "data": {"character_string1": format!("A{i}"), "phrase2": "已预约", "thing3": "门店"}}}))
                    .await;
                assert_eq!(answer["push"], "pending", "{answer}");
            }
        })
        .await;
    start_tick_at(t0, "pushes").await;
    let push_summary = pushes.tick(100).await;
    let push_latencies = outcome(&push_summary);

    println!(
        "onegrant scheduled-push bench ({n} per half, moto on this machine, WeChat answering in 50 ms)"
    );
    println!("  {:<44} {:>6} {:>9} {:>9}", "", "sent", "p50 ms", "p99 ms");
    println!(
        "  {:<44} {:>6} {:>9} {:>9}",
        "plans due over one minute",
        plan_summary.sent,
        percentile(&plan_latencies, 50.0),
        percentile(&plan_latencies, 99.0)
    );
    println!(
        "  {:<44} {:>6} {:>9} {:>9}",
        "pushes scheduled over one minute (published)",
        push_summary.sent,
        percentile(&push_latencies, 50.0),
        percentile(&push_latencies, 99.0)
    );
    println!(
        "  of {n} each; published {}, deferred {} (plans {}); p99 pushes ÷ p99 plans: {:.2}",
        push_summary.published,
        push_summary.deferred,
        plan_summary.deferred,
        percentile(&push_latencies, 99.0) as f64 / percentile(&plan_latencies, 99.0).max(1) as f64
    );
}
