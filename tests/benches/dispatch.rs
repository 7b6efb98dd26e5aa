//! The dispatch bench (not a test): `cargo bench -p onegrant-tests --bench dispatch`.
//!
//! On its own emulator, it reports, from one run:
//! 1. the emulator's raw rates: 2-item TransactWriteItems and single-item round trips,
//!    one at a time;
//! 2. due→sent latency p50/p99 for plans due at spread-out seconds within a minute,
//!    dispatched by one tick that claims ahead and waits until each is due, with the
//!    stand-in answering every send in 50 ms;
//! 3. dispatches per second when many plans are due at once, for one worker and for a
//!    tick fanned out to 4, with the efficiency (achieved ÷ raw round trips per second
//!    ÷ round trips per dispatch); then where WeChat's latency limits a worker (500 ms,
//!    4 sends in flight per invocation), for 1 worker and for 4;
//! 4. DynamoDB round trips per dispatch, by operation;
//! 5. per operation (report, check-in, claim, finalize, notify, idle tick): round
//!    trips, items read and estimated write units from the written items' sizes by
//!    DynamoDB's rules (see `TestApp::write_units`), and a reminder cycle's total.
//!
//! `BENCH_PLANS` sets how many plans each phase uses (default 120); `BENCH_PHASES=costs`
//! runs phase 5 alone, and `BENCH_ITEMS=1` lists each write with its item's size.

use std::collections::BTreeMap;
use std::time::Instant;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use chrono::Duration;
use futures::StreamExt;
use onegrant_tests::{ItemWrite, TestApp, User, spawn_app_isolated};
use serde_json::json;

/// [`due_users`], each one's water plan due now.
async fn due_now(app: &TestApp, prefix: &str, n: usize) {
    for user in &due_users(app, prefix, n).await {
        app.make_due(user, "water", onegrant::Clock::real_now())
            .await;
    }
}

/// What one operation cost.
#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    round_trips: usize,
    items_read: u64,
    /// Estimated read request units (`RoundTrips::take_read_units`).
    read_units: f64,
    write_units: usize,
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            round_trips: self.round_trips + o.round_trips,
            items_read: self.items_read + o.items_read,
            read_units: self.read_units + o.read_units,
            write_units: self.write_units + o.write_units,
        }
    }
}

/// Starts counting afresh.
fn reset(app: &TestApp) {
    app.round_trips.take();
    app.round_trips.take_items_read();
    app.round_trips.take_read_units();
    app.round_trips.take_writes();
}

/// What was sent since [`reset`]: round trips, items read and the writes, whose units
/// are estimated by [`units`].
fn taken(app: &TestApp) -> (usize, (u64, f64), Vec<ItemWrite>) {
    (
        app.round_trips.take().len(),
        (
            app.round_trips.take_items_read(),
            app.round_trips.take_read_units(),
        ),
        app.round_trips.take_writes(),
    )
}

async fn units(app: &TestApp, writes: &[ItemWrite]) -> usize {
    if std::env::var_os("BENCH_ITEMS").is_some() {
        for (w, bytes) in app.write_sizes(writes).await {
            let tx = if w.transactional { "tx" } else { "  " };
            println!("      {:<20} {tx} {bytes:>5} B  {}", w.operation, w.sk);
        }
    }
    app.write_units(writes).await
}

fn row(what: &str, c: Cost) {
    println!(
        "  {what:<28} {:>11} {:>10} {:>9.1} {:>11}",
        c.round_trips, c.items_read, c.read_units, c.write_units
    );
}

/// Users set up at once, at most: the emulator applies one request at a time, so a
/// thousand set-ups started together wait past the handler's budget on a slow machine
/// (and the bench measures dispatching, not the set-up).
const SETUP_IN_FLIGHT: usize = 32;

async fn due_users(app: &TestApp, prefix: &str, n: usize) -> Vec<User> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    futures::stream::iter(names.iter().map(|name| app.scheduled_user(name, 1)))
        .buffered(SETUP_IN_FLIGHT)
        .collect()
        .await
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

/// What the emulator has spent so far (`GET /_onegrant/busy` on `scripts/moto_serial.py`):
/// its CPU seconds, and per operation the requests and their seconds under its lock.
#[derive(Debug, Default, Clone)]
struct Busy {
    cpu: f64,
    operations: BTreeMap<String, (u64, f64)>,
}

impl Busy {
    async fn of(app: &TestApp) -> Busy {
        let url = format!("{}/_onegrant/busy", app.table.endpoint());
        let body: serde_json::Value = reqwest::get(&url)
            .await
            .expect("busy")
            .json()
            .await
            .expect("busy json");
        let operations = body["operations"]
            .as_object()
            .map(|ops| {
                ops.iter()
                    .map(|(op, v)| {
                        let n = v["requests"].as_u64().unwrap_or(0);
                        let t = v["seconds"].as_f64().unwrap_or(0.0);
                        (op.clone(), (n, t))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Busy {
            cpu: body["cpu_seconds"].as_f64().unwrap_or(0.0),
            operations,
        }
    }

    /// What was spent between `before` and `self`.
    fn since(&self, before: &Busy) -> Busy {
        let operations = self
            .operations
            .iter()
            .map(|(op, (n, t))| {
                let (n0, t0) = before.operations.get(op).copied().unwrap_or((0, 0.0));
                (op.clone(), (n - n0, t - t0))
            })
            .filter(|(_, (n, _))| *n > 0)
            .collect();
        Busy {
            cpu: self.cpu - before.cpu,
            operations,
        }
    }

    fn requests(&self) -> u64 {
        self.operations.values().map(|(n, _)| n).sum()
    }

    fn locked(&self) -> f64 {
        self.operations.values().map(|(_, t)| t).sum()
    }

    /// Milliseconds under the lock per request, by operation.
    fn per_request(&self) -> String {
        let parts: Vec<String> = self
            .operations
            .iter()
            .map(|(op, (n, t))| format!("{op} {:.1}", t * 1000.0 / *n as f64))
            .collect();
        parts.join(", ")
    }
}

/// The emulator's rate of 2-item transactions, `n` one at a time, on `app`'s table as
/// it is (moto's transactions slow down as the table grows).
async fn raw_transactions(app: &TestApp, n: u32, tag: &str) -> f64 {
    let started = Instant::now();
    for i in 0..n {
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
            .item("sk", AttributeValue::S(format!("{tag}{i}")))
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
    f64::from(n) / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let plans: usize = std::env::var("BENCH_PLANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    if std::env::var("BENCH_PHASES").as_deref() == Ok("costs") {
        all_costs().await;
        return;
    }
    let app =
        spawn_app_isolated(&[("DISPATCH_LOOKAHEAD_SECONDS", "75"), ("DUE_SHARDS", "16")]).await;

    // 1. The emulator's raw transaction rate.
    let raw_n = 300;
    let raw_tps = raw_transactions(&app, raw_n, "before").await;
    // The emulator's raw round trips: single-item reads and writes, one at a time.
    let started = Instant::now();
    for i in 0..raw_n {
        let key = AttributeValue::S(format!("raw{i}"));
        app.table
            .client
            .put_item()
            .table_name(&app.table.name)
            .item("pk", AttributeValue::S("BENCH".into()))
            .item("sk", key.clone())
            .send()
            .await
            .expect("put");
        app.table
            .client
            .get_item()
            .table_name(&app.table.name)
            .key("pk", AttributeValue::S("BENCH".into()))
            .key("sk", key)
            .consistent_read(true)
            .send()
            .await
            .expect("get");
    }
    let raw_rps = f64::from(raw_n * 2) / started.elapsed().as_secs_f64();

    // WeChat answers every send in 50 ms from here on.
    app.control("POST", "latency", Some(json!({"ms": 50})))
        .await;

    // 2. Latency: plans due at spread-out instants over one minute, one tick.
    let spread = due_users(&app, "spread", plans).await;
    let t0 = onegrant::Clock::real_now() + Duration::seconds(5);
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

    // 3. Throughput: plans all due now, one worker.
    due_now(&app, "burst", plans).await;
    app.round_trips.take();
    let busy_before = Busy::of(&app).await;
    let started = Instant::now();
    let burst_summary = app.tick(100).await;
    let elapsed = started.elapsed().as_secs_f64();
    let burst_busy = Busy::of(&app).await.since(&busy_before);
    let burst_ops = app.round_trips.take();
    let dps = f64::from(burst_summary.sent) / elapsed;
    let per = burst_ops.len() as f64 / f64::from(burst_summary.sent.max(1));
    let efficiency = dps / (raw_rps / per);
    // The same raw transactions on the table as the burst left it.
    let raw_tps_after = raw_transactions(&app, raw_n, "after").await;

    // 3c. The emulator's own rate for dispatches: one at a time (concurrency 1), WeChat
    // answering at once, on an emulator of its own. What the burst achieves against
    // this is the pipeline's efficiency with the emulator's real cost per dispatch.
    let seq = spawn_app_isolated(&[("DISPATCH_CONCURRENCY", "1"), ("DUE_SHARDS", "16")]).await;
    let seq_n = plans.min(200);
    due_now(&seq, "seq", seq_n).await;
    let started = Instant::now();
    let seq_summary = seq.tick(100).await;
    let seq_dps = f64::from(seq_summary.sent) / started.elapsed().as_secs_f64();
    drop(seq);

    // 3b. The same with the tick fanned out to 4 workers (the local Invoke API), on
    // an emulator of its own measured the same way.
    let fan = spawn_app_isolated(&[("DISPATCH_WORKERS", "4"), ("DUE_SHARDS", "16")]).await;
    fan.control("POST", "latency", Some(json!({"ms": 50})))
        .await;
    due_now(&fan, "fan", plans).await;
    fan.round_trips.take();
    let fan_before = Busy::of(&fan).await;
    let started = Instant::now();
    let coordinator = fan.tick(100).await;
    // A worker has one invocation's time (55 s here): what it does not reach, the next
    // tick's do — here at once (a backlog past one invocation looked like a stall).
    let (mut fan_ticks, mut first_tick_sent, mut fan_sent) = (1, None, 0);
    while fan_sent < plans && started.elapsed().as_secs() < 300 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        fan_sent = fan.deliveries().await.len();
        let wait = std::time::Duration::from_millis(1);
        let idle = tokio::time::timeout(wait, fan.invocations.idle()).await;
        if idle.is_ok() && fan_sent < plans {
            first_tick_sent.get_or_insert(fan_sent);
            fan.tick(100).await;
            fan_ticks += 1;
        }
    }
    let first_tick_sent = first_tick_sent.unwrap_or(fan_sent);
    let fan_elapsed = started.elapsed().as_secs_f64();
    let fan_busy = Busy::of(&fan).await.since(&fan_before);
    let fan_ops = fan.round_trips.take();
    let fan_dps = fan_sent as f64 / fan_elapsed;
    let fan_per = fan_ops.len() as f64 / (fan_sent.max(1) as f64);

    // 3d. Where the send's latency limits a worker, not the database: WeChat answering
    // in 500 ms and 4 sends in flight per invocation, one worker against a tick fanned
    // out to 4, each on an emulator of its own.
    let slow_n = plans.min(80);
    let mut slow = Vec::new();
    for workers in ["1", "4"] {
        let app = spawn_app_isolated(&[
            ("DISPATCH_WORKERS", workers),
            ("DISPATCH_CONCURRENCY", "4"),
            ("DUE_SHARDS", "16"),
        ])
        .await;
        app.control("POST", "latency", Some(json!({"ms": 500})))
            .await;
        let users = due_users(&app, "slow", slow_n).await;
        for user in &users {
            app.make_due(user, "water", onegrant::Clock::real_now())
                .await;
        }
        let started = Instant::now();
        app.tick(100).await;
        let mut sent = 0;
        while sent < slow_n && started.elapsed().as_secs() < 300 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            sent = app.deliveries().await.len();
        }
        slow.push(sent as f64 / started.elapsed().as_secs_f64());
    }

    println!(
        "onegrant dispatch bench ({plans} plans per phase, moto on this machine, WeChat answering in 50 ms)"
    );
    println!(
        "  emulator raw rates:           {raw_tps:.0} tx/s (2-item TransactWriteItems), {raw_rps:.0} round trips/s (PutItem + GetItem), sequential"
    );
    println!(
        "  raw transactions, table full: {raw_tps_after:.0} tx/s after the phases below wrote their {} users",
        plans * 2
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
        "  dispatches per second, 1 worker:  {dps:.1}/s ({} sent in {elapsed:.1} s, {per:.2} round trips each) → efficiency {efficiency:.2} of raw round trips ÷ round trips per dispatch",
        burst_summary.sent
    );
    println!(
        "  dispatches per second, 4 workers: {fan_dps:.1}/s ({fan_sent} sent in {fan_elapsed:.1} s by {} workers, {fan_per:.2} round trips each; {fan_ticks} tick(s), the first sent {first_tick_sent}) → efficiency {:.2}",
        coordinator.workers,
        fan_dps / (raw_rps / fan_per)
    );
    println!(
        "  dispatches per second, one at a time, WeChat instant: {seq_dps:.1}/s ({} sent) → the burst achieves {:.2} of it",
        seq_summary.sent,
        dps / seq_dps
    );
    println!(
        "  WeChat answering in 500 ms, 4 sends in flight per invocation ({slow_n} plans): 1 worker {:.1}/s ({:.0} a minute), 4 workers {:.1}/s ({:.0} a minute) → ×{:.1}",
        slow[0],
        slow[0] * 60.0,
        slow[1],
        slow[1] * 60.0,
        slow[1] / slow[0].max(1e-9)
    );
    // The efficiency with the raw rate of the very round trips each run made:
    // the emulator's CPU seconds for them. Equal to the share of the run's wall time
    // the emulator was busy: 1.0 is a pipeline that never leaves it waiting.
    for (what, busy, dispatches, wall) in [
        (
            "1 worker ",
            &burst_busy,
            f64::from(burst_summary.sent),
            elapsed,
        ),
        ("4 workers", &fan_busy, fan_sent as f64, fan_elapsed),
    ] {
        let raw = busy.requests() as f64 / busy.cpu.max(1e-9);
        let per = busy.requests() as f64 / dispatches.max(1.0);
        println!(
            "  emulator's own cost, {what}: {raw:.0} of these round trips/s on its CPU ({:.1} ms each; under its lock: {}) → efficiency {:.2} = dispatches/s ÷ (that ÷ {per:.2} per dispatch); busy {:.2} of the wall time on CPU, {:.2} under the lock",
            1000.0 / raw.max(1e-9),
            busy.per_request(),
            (dispatches / wall) / (raw / per.max(1e-9)),
            busy.cpu / wall,
            busy.locked() / wall,
        );
    }
    println!(
        "  round trips per dispatch:     {} [spread tick, incl. sweep and index queries]",
        per_dispatch(&spread_ops, summary.sent)
    );
    println!(
        "                                {} [burst tick]",
        per_dispatch(&burst_ops, burst_summary.sent)
    );

    all_costs().await;
}

/// Phase 5: with the audit trail's history entries and without; with the message push
/// configured (`PUSH_EVENTS`, as a deployment with a push token runs); and for a user
/// holding `MAX_OPEN_GRANTS` open grants, whose quota item lists them all.
async fn all_costs() {
    costs("true", "false", 0).await;
    costs("false", "false", 0).await;
    costs("true", "true", 0).await;
    costs("false", "false", 99).await;
}

/// The cost of each operation for one user, one at a time, on an app whose
/// `AUDIT_TRAIL` is `audit` and `PUSH_EVENTS` is `push_events`, the user holding `open`
/// more grants of the template than the operations use.
async fn costs(audit: &'static str, push_events: &'static str, open: usize) {
    let cost_app = spawn_app_isolated(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
        ("AUDIT_TRAIL", audit),
        ("PUSH_EVENTS", push_events),
        ("REPORTS_PER_MINUTE", "600"),
    ])
    .await;
    let app = &cost_app;
    app.tick(30).await; // registers the shard count
    let user = app.user("cost").await;
    for i in 0..open {
        // Request ids as a client makes them: a UUID each.
        let request = format!("{}-{i}", uuid::Uuid::new_v4());
        app.accept(&user, onegrant_tests::WATER, &request).await;
    }
    reset(app);
    app.accept(&user, onegrant_tests::WATER, "wr_cost_1").await;
    let (rt, read, writes) = taken(app);
    let report = Cost {
        round_trips: rt,
        items_read: read.0,
        read_units: read.1,
        write_units: units(app, &writes).await,
    };
    assert_eq!(app.enable(&user, "water").await.status, 200);
    reset(app);
    let idle_summary = app.tick(30).await;
    assert_eq!(idle_summary.due, 0);
    let (rt, read, writes) = taken(app);
    let idle = Cost {
        round_trips: rt,
        items_read: read.0,
        read_units: read.1,
        write_units: units(app, &writes).await,
    };
    app.make_due(&user, "water", onegrant::Clock::real_now())
        .await;
    reset(app);
    assert_eq!(app.tick(30).await.sent, 1);
    let (rt, read, writes) = taken(app);
    // The tick's own share (registry, index queries) is the idle tick's; of the rest,
    // the first transaction is the claim, the second the finalize.
    let mut transactions: Vec<u64> = writes
        .iter()
        .filter(|w| w.operation == "TransactWriteItems")
        .map(|w| w.request)
        .collect();
    transactions.dedup();
    let of = |request: u64| -> Vec<ItemWrite> {
        writes
            .iter()
            .filter(|w| w.request == request)
            .cloned()
            .collect()
    };
    let claim_writes = transactions.first().map(|r| of(*r)).unwrap_or_default();
    let finalize_writes = transactions.get(1).map(|r| of(*r)).unwrap_or_default();
    let dispatch = Cost {
        round_trips: rt.saturating_sub(idle.round_trips),
        items_read: read.0.saturating_sub(idle.items_read),
        read_units: read.1 - idle.read_units,
        write_units: units(app, &writes).await,
    };
    let requests = |w: &[ItemWrite]| {
        w.iter()
            .map(|w| w.request)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let claim = Cost {
        round_trips: requests(&claim_writes),
        items_read: 0,
        read_units: 0.0,
        write_units: units(app, &claim_writes).await,
    };
    let finalize = Cost {
        round_trips: requests(&finalize_writes),
        items_read: 0,
        read_units: 0.0,
        write_units: units(app, &finalize_writes).await,
    };
    let checkin = json!({"action_id": "wc_cost_1", "occurred_at": onegrant::Clock::real_now().to_rfc3339(),
                         "current_count": 1, "daily_goal": 8,
                         "grant_request_id": "wr_cost_2", "subscription_status": "accept"});
    reset(app);
    let answer = app
        .post("/v1/reminders/water/checkins", Some(&user.token), &checkin)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let (rt, read, writes) = taken(app);
    let check_in = Cost {
        round_trips: rt,
        items_read: read.0,
        read_units: read.1,
        write_units: units(app, &writes).await,
    };
    reset(app);
    app.push(&user, "cost-push").await;
    let (rt, read, writes) = taken(app);
    let notify = Cost {
        round_trips: rt,
        items_read: read.0,
        read_units: read.1,
        write_units: units(app, &writes).await,
    };
    let cycle = check_in + dispatch;
    println!(
        "  per operation (one user{}), AUDIT_TRAIL={audit}, PUSH_EVENTS={push_events}:  round trips  items read  est. RRU  est. WRU",
        if open > 0 {
            format!(" holding {} open grants", open + 1)
        } else {
            String::new()
        }
    );
    row("grant report (1 template)", report);
    row("check-in carrying a grant", check_in);
    row("dispatch (claim → finalize)", dispatch);
    row("  its claim transaction", claim);
    row("  its finalize transaction", finalize);
    row("notify with a push", notify);
    row("idle tick (16 shards)", idle);
    row("reminder cycle", cycle);
    let per_million = |units: f64, price: f64| units * price;
    println!(
        "  a million reminder cycles: {:.0} M WRU = ${:.2}, {:.1} M RRU = ${:.2} (on-demand, $0.625 per M WRU, $0.125 per M RRU)",
        cycle.write_units as f64,
        per_million(cycle.write_units as f64, 0.625),
        cycle.read_units,
        per_million(cycle.read_units, 0.125),
    );
}
