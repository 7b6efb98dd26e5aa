//! The dispatch bench (not a test): `cargo bench -p onegrant-tests --bench dispatch`.
//!
//! On its own emulator, it reports, from one run:
//! 1. the emulator's raw transaction rate (2-item TransactWriteItems, one at a time);
//! 2. due→sent latency p50/p99 for plans due at spread-out seconds within a minute,
//!    dispatched by one tick that claims ahead and waits until each is due;
//! 3. dispatches per second when many plans are due at once, next to (1);
//! 4. DynamoDB round trips per dispatch, by operation.
//!
//! `BENCH_PLANS` sets how many plans each phase uses (default 120).

use std::collections::BTreeMap;
use std::time::Instant;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use chrono::{Duration, Utc};
use futures::future::join_all;
use onegrant_tests::{TestApp, User, spawn_app_isolated};

async fn due_users(app: &TestApp, prefix: &str, n: usize) -> Vec<User> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    join_all(names.iter().map(|name| app.scheduled_user(name, 1))).await
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn per_dispatch(ops: &[String], dispatches: u32) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops {
        *counts.entry(op.as_str()).or_default() += 1;
    }
    let total = ops.len() as f64 / f64::from(dispatches.max(1));
    let parts: Vec<String> = counts
        .iter()
        .map(|(op, n)| format!("{op} {:.2}", *n as f64 / f64::from(dispatches.max(1))))
        .collect();
    format!("{total:.2} ({})", parts.join(", "))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let plans: usize = std::env::var("BENCH_PLANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let app =
        spawn_app_isolated(&[("DISPATCH_LOOKAHEAD_SECONDS", "75"), ("DUE_SHARDS", "16")]).await;

    // 1. The emulator's raw transaction rate.
    let raw_n = 300;
    let started = Instant::now();
    for i in 0..raw_n {
        let update = Update::builder()
            .table_name(&app.table.name)
            .key("pk", AttributeValue::S("BENCH".into()))
            .key("sk", AttributeValue::S("counter".into()))
            .update_expression("ADD n :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .expect("update");
        let put = Put::builder()
            .table_name(&app.table.name)
            .item("pk", AttributeValue::S("BENCH".into()))
            .item("sk", AttributeValue::S(format!("item{i}")))
            .build()
            .expect("put");
        app.table
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            .send()
            .await
            .expect("transaction");
    }
    let raw_tps = f64::from(raw_n) / started.elapsed().as_secs_f64();

    // 2. Latency: plans due at spread-out instants over one minute, one tick.
    let spread = due_users(&app, "spread", plans).await;
    let t0 = Utc::now() + Duration::seconds(5);
    for (i, user) in spread.iter().enumerate() {
        let offset_ms = (i as i64 * 60_000) / plans as i64;
        app.make_due(user, "water", t0 + Duration::milliseconds(offset_ms))
            .await;
    }
    app.round_trips.take();
    let summary = app.tick(100).await;
    let spread_ops = app.round_trips.take();
    let mut latencies = summary.latencies_ms.clone();
    latencies.sort_unstable();

    // 3. Throughput: plans all due now.
    let burst = due_users(&app, "burst", plans).await;
    for user in &burst {
        app.make_due(user, "water", Utc::now()).await;
    }
    app.round_trips.take();
    let started = Instant::now();
    let burst_summary = app.tick(100).await;
    let elapsed = started.elapsed().as_secs_f64();
    let burst_ops = app.round_trips.take();
    let dps = f64::from(burst_summary.sent) / elapsed;

    println!("onegrant dispatch bench ({plans} plans per phase, moto on this machine)");
    println!(
        "  emulator raw transactions:   {raw_tps:.0} tx/s (2-item TransactWriteItems, sequential)"
    );
    println!(
        "  due→sent latency (spread):    p50 {} ms, p99 {} ms, max {} ms over {} sends ({} deferred)",
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(0),
        summary.sent,
        summary.deferred
    );
    println!(
        "  dispatches per second (burst): {dps:.1}/s = {:.2}× the raw transaction rate ({} sent in {elapsed:.1} s)",
        dps / raw_tps,
        burst_summary.sent
    );
    println!(
        "  round trips per dispatch:     {} [spread tick, incl. sweep and index queries]",
        per_dispatch(&spread_ops, summary.sent)
    );
    println!(
        "                                {} [burst tick]",
        per_dispatch(&burst_ops, burst_summary.sent)
    );
}
