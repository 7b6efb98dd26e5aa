//! Scarce grants and the daily cap across containers: dispatcher processes (each with
//! its own DynamoDB and WeChat clients) racing for one user's last grants and last
//! places under `PUSHES_PER_DAY`, round after round, the invariants read from the
//! stored items afterwards; a push replaced while a process's attempt of it is in
//! flight; and the refill notice when processes use up a user's grants together.

use std::collections::BTreeMap;

use onegrant_tests::{
    ORDER, TestApp, User, assert_ledger_agrees_with_counters, attr_n, order_numbers,
    spawn_app_with, summary_of, wait_for_exit,
};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_dispatch-once");
const CAP: usize = 5;
const PUSHES: usize = 12;
const PROCESSES: usize = 3;
const ROUNDS: usize = 5;

/// Each of `user`'s notifications as the inbox lists it: title → (push status, reason).
async fn pushes(app: &TestApp, user: &User) -> BTreeMap<String, (String, Option<String>)> {
    let page = app
        .get("/v1/notifications?limit=100", Some(&user.token))
        .await
        .body;
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| {
            (
                n["title"].as_str().unwrap_or_default().to_string(),
                (
                    n["push"]["status"].as_str().unwrap_or_default().to_string(),
                    n["push"]["reason"].as_str().map(str::to_string),
                ),
            )
        })
        .collect()
}

/// `n` dispatcher processes (`dispatch-once`, with `env`) run at once: how each ended,
/// and what it printed.
async fn containers(
    app: &TestApp,
    n: usize,
    env: &[(&str, &str)],
) -> Vec<(std::process::ExitStatus, String)> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            app.dispatcher_process(BIN, env)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("dispatch-once starts")
        })
        .collect();
    futures::future::join_all(children.into_iter().map(wait_for_exit)).await
}

/// `PUSHES` pushes of the order template to `user`, titled and numbered `<prefix>-<i>`.
async fn queue(app: &TestApp, user: &User, prefix: &str) -> Vec<String> {
    let keys: Vec<String> = (0..PUSHES).map(|i| format!("{prefix}-{i}")).collect();
    for key in &keys {
        app.notify(
            json!({"idempotency_key": key, "openid": user.openid, "type": "order",
            "title": key, "wechat": {"template_id": ORDER,
            "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}}),
        )
        .await;
    }
    keys
}

/// The quota item's sends counted on any day, and its members waiting for a grant.
async fn counted_and_waiting(app: &TestApp, user: &User) -> (i64, usize, i64) {
    let quota = app
        .item(user, &format!("QUOTA#{ORDER}"))
        .await
        .expect("quota");
    let counted = quota
        .iter()
        .filter(|(name, _)| name.starts_with("sent_on_"))
        .filter_map(|(_, v)| v.as_n().ok().and_then(|n| n.parse::<i64>().ok()))
        .sum();
    let waiting = quota
        .get("waiting")
        .and_then(|v| v.as_ss().ok())
        .map_or(0, Vec::len);
    (counted, waiting, attr_n(&quota, "available").unwrap_or(0))
}

/// Per round, two users each with `PUSHES` pushes due now: one whose cap binds (8
/// grants, `CAP` places), one whose grants bind (3 grants). `PROCESSES` dispatchers race
/// for them with WeChat answering in 200 ms. Afterwards: exactly min(grants, cap) sent
/// for each, each once; the rest pending — `capped` for the first (due on their next
/// day, the grants kept), `no_grant` and each on the waiting list for the second; the
/// day's count equal to the sends, the grants spent equal to the sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dispatcher_processes_racing_for_a_users_cap_and_last_grants_send_exactly_what_each_allows()
{
    let cap = CAP.to_string();
    let app = spawn_app_with(&[
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("PUSHES_PER_DAY", &cap),
    ])
    .await;
    app.control("POST", "latency", Some(json!({"ms": 200})))
        .await;
    let env = [
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DISPATCH_ONCE_SECONDS", "60"),
        ("PUSHES_PER_DAY", cap.as_str()),
    ];
    let mut concurrent_sends = 0;
    for round in 0..ROUNDS {
        let capped = app.user(&format!("capped-{round}")).await;
        app.accept_n(&capped, ORDER, 8).await;
        let scarce = app.user(&format!("scarce-{round}")).await;
        app.accept_n(&scarce, ORDER, 3).await;
        let capped_keys = queue(&app, &capped, &format!("c{round}")).await;
        let scarce_keys = queue(&app, &scarce, &format!("s{round}")).await;

        let outs = containers(&app, PROCESSES, &env).await;
        let summaries: Vec<Value> = outs
            .iter()
            .map(|(status, out)| {
                assert!(status.success(), "{status}");
                summary_of(out)
            })
            .collect();
        concurrent_sends += summaries
            .iter()
            .filter(|s| s["sent"].as_u64().unwrap_or(0) > 0)
            .count();
        // An item every racing process skipped (its claim contended past the write
        // budget, as on a loaded machine) is the next tick's: one more container takes
        // it, as the next minute's would. The invariants below hold either way.
        let skipped = |summaries: &[Value]| {
            summaries
                .iter()
                .map(|s| s["skipped"].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        let mut left = skipped(&summaries);
        for _ in 0..3 {
            if left == 0 {
                break;
            }
            let settled: Vec<Value> = containers(&app, 1, &env)
                .await
                .iter()
                .map(|(status, out)| {
                    assert!(status.success(), "{status}");
                    summary_of(out)
                })
                .collect();
            left = skipped(&settled);
        }

        let delivered = order_numbers(&app.deliveries().await);
        for (user, keys, grants, why) in [
            (&capped, &capped_keys, 8, "capped"),
            (&scarce, &scarce_keys, 3, "no_grant"),
        ] {
            let allowed = CAP.min(grants);
            let sent: Vec<&String> = keys.iter().filter(|k| delivered.contains(*k)).collect();
            assert_eq!(sent.len(), allowed, "{why}: {sent:?} {summaries:?}");
            let listed = pushes(&app, user).await;
            for key in keys {
                let (status, reason) = &listed[key];
                if delivered.contains(key) {
                    assert_eq!(status, "sent", "{key}");
                } else {
                    assert_eq!(
                        (status.as_str(), reason.as_deref()),
                        ("pending", Some(why)),
                        "{key}: {summaries:?}"
                    );
                }
            }
            let (counted, waiting, available) = counted_and_waiting(&app, user).await;
            assert_eq!(
                counted, allowed as i64,
                "{why}: the day counts each send once"
            );
            assert_eq!(
                available,
                (grants - allowed) as i64,
                "{why}: grants spent by sends only"
            );
            let expected_waiting = if why == "no_grant" {
                PUSHES - allowed
            } else {
                0
            };
            assert_eq!(waiting, expected_waiting, "{why}: the waiting list");
        }
    }
    let deliveries = app.deliveries().await;
    assert_eq!(
        deliveries.len(),
        order_numbers(&deliveries).len(),
        "no push delivered twice"
    );
    assert_eq!(deliveries.len(), ROUNDS * (CAP + 3));
    eprintln!("processes that sent, over {ROUNDS} rounds of {PROCESSES}: {concurrent_sends}");
    assert!(
        concurrent_sends > ROUNDS,
        "more than one process sent in some round: they raced"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// A push replaced while a dispatcher process's attempt of it is in flight (WeChat
/// answering 45011 after 1.5 s, under the suite's 2 s client timeout): round after round, with two
/// processes racing and a third for the retry, the older push ends `replaced` and
/// spends nothing; only the newer goes out, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_replaced_during_a_processs_attempt_never_goes_out_when_that_attempt_fails() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let env = [
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DISPATCH_ONCE_SECONDS", "60"),
        ("DISPATCH_RETRY_BASE_SECONDS", "1"),
    ];
    let notify = |user: &User, key: &str| {
        json!({"idempotency_key": key, "openid": user.openid, "type": "order",
        "title": key, "collapse_key": "order-7", "wechat": {"template_id": ORDER,
        "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}})
    };
    const ROUNDS: usize = 3;
    for round in 0..ROUNDS {
        let user = app.user(&format!("replaced-{round}")).await;
        app.accept_n(&user, ORDER, 2).await;
        let (older, newer) = (format!("older-{round}"), format!("newer-{round}"));
        app.notify(notify(&user, &older)).await;
        app.control(
            "POST",
            "faults",
            Some(json!({"openid": user.openid, "errcode": 45011, "times": 1})),
        )
        .await;
        app.control("POST", "latency", Some(json!({"ms": 1500})))
            .await;
        let racing: Vec<_> = (0..2)
            .map(|_| {
                app.dispatcher_process(BIN, &env)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("dispatch-once starts")
            })
            .collect();
        app.until_in_flight(&user, &older).await;
        let answer = app.notify(notify(&user, &newer)).await;
        assert_eq!(answer["status"], "created", "{answer}");
        for (status, _) in futures::future::join_all(racing.into_iter().map(wait_for_exit)).await {
            assert!(status.success(), "{status}");
        }
        app.control("POST", "latency", Some(json!({"ms": 0}))).await;
        // The retry (due a second after the 45011, on the processes' real clock) by
        // another container, if the racing ones ended before it was due.
        if app.outbox_states(&user).await[&older] == "pending" {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            let retry = app
                .dispatcher_process(BIN, &env)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("dispatch-once starts");
            let (status, _) = wait_for_exit(retry).await;
            assert!(status.success(), "{status}");
        }
        let states = app.outbox_states(&user).await;
        assert_eq!(
            (states[&older].as_str(), states[&newer].as_str()),
            ("replaced", "sent"),
            "round {round}"
        );
        let (_, _, available) = counted_and_waiting(&app, &user).await;
        assert_eq!(
            available, 1,
            "round {round}: the replaced push spent nothing"
        );
    }
    let deliveries = app.deliveries().await;
    let delivered = order_numbers(&deliveries);
    assert_eq!(deliveries.len(), ROUNDS, "one delivery a round");
    assert!(
        (0..ROUNDS).all(|r| delivered.contains(&format!("newer-{r}"))),
        "{delivered:?}"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// The refill notice in a burst across containers (issue 41 §5): per round, two users
/// each holding three water grants and one refill grant, with six water pushes due at
/// once; three dispatcher processes race for them, WeChat answering in 300 ms, so sends
/// of one user finish in any order and in different processes. Afterwards: three sent
/// for each, three waiting, and exactly one refill notice per user — published by
/// whichever process saw the grants used up with pushes waiting, never twice, and sent
/// once with the refill grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dispatcher_processes_using_up_a_users_grants_together_tell_them_once() {
    const WATER: &str = onegrant_tests::WATER;
    const USED_UP: &str = "tmpl_grants_used_up";
    const ROUNDS: usize = 3;
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let env = [
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DISPATCH_ONCE_SECONDS", "60"),
    ];
    let water = |user: &User, key: &str| {
        json!({"idempotency_key": key, "openid": user.openid, "type": "water", "title": key,
               "wechat": {"template_id": WATER,
                          "data": {"thing1": "喝水", "time2": "2026-12-06 10:00", "number3": "1"}}})
    };
    let mut users = Vec::new();
    let mut published = 0;
    for round in 0..ROUNDS {
        let mut these = Vec::new();
        for name in ["a", "b"] {
            let user = app.user(&format!("burst-{round}-{name}")).await;
            app.accept_n(&user, WATER, 3).await;
            app.accept(&user, USED_UP, &format!("wr_refill_{round}_{name}"))
                .await;
            for i in 0..6 {
                app.notify(water(&user, &format!("w{round}{name}-{i}")))
                    .await;
            }
            these.push(user);
        }
        app.control("POST", "latency", Some(json!({"ms": 300})))
            .await;
        let racing = containers(&app, PROCESSES, &env).await;
        app.control("POST", "latency", Some(json!({"ms": 0}))).await;
        // A notice published after the others had read their pages goes out with
        // the next container.
        for (status, out) in racing.iter().chain(&containers(&app, 1, &env).await) {
            assert!(status.success(), "{status}");
            published += summary_of(out)["refills"].as_u64().unwrap_or(0);
        }
        users.extend(these);
    }
    let deliveries = app.deliveries().await;
    for user in &users {
        let mine: Vec<&Value> = deliveries
            .iter()
            .filter(|d| d["openid"] == user.openid.as_str())
            .collect();
        let notices = mine.iter().filter(|d| d["template_id"] == USED_UP).count();
        let waters = mine.iter().filter(|d| d["template_id"] == WATER).count();
        assert_eq!((waters, notices), (3, 1), "{}: {mine:?}", user.openid);
        let listed = pushes(&app, user).await;
        let notes = listed.keys().filter(|t| t.contains("已用完")).count();
        assert_eq!(notes, 1, "one notice in the inbox: {listed:?}");
        let waiting = listed
            .values()
            .filter(|(status, reason)| status == "pending" && reason.as_deref() == Some("no_grant"))
            .count();
        assert_eq!(waiting, 3, "{listed:?}");
    }
    assert_eq!(
        published,
        2 * ROUNDS as u64,
        "each process counts what it published"
    );
    assert_ledger_agrees_with_counters(&app).await;
}

/// One user's burst never delays another user (issue 41 §9): user A holds 20 grants
/// and has 100 pushes due at once, user B one grant and one push due just after them,
/// all on one shard, WeChat answering in 500 ms, two dispatcher processes. A's pushes
/// go out one at a time per process (a user's turn); B's is out among the first
/// messages, not after A's: the items waiting for A's turn hold none of the shard's
/// slots, so the lane reads on to B's. Afterwards A has exactly 20 sends, B one, none
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_users_burst_never_delays_another_users_message() {
    const A_PUSHES: usize = 100;
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0"), ("DUE_SHARDS", "1")]).await;
    let env = [
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ("DISPATCH_ONCE_SECONDS", "60"),
    ];
    let order = |user: &User, key: &str| {
        json!({"idempotency_key": key, "openid": user.openid, "type": "order",
        "title": key, "wechat": {"template_id": ORDER,
        "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}})
    };
    let a = app.user("burst-a").await;
    app.accept_n(&a, ORDER, 20).await;
    let b = app.user("burst-b").await;
    app.accept(&b, ORDER, "g_b").await;
    for i in 0..A_PUSHES {
        app.notify(order(&a, &format!("a-{i}"))).await;
    }
    app.notify(order(&b, "b-0")).await;
    app.control("POST", "latency", Some(json!({"ms": 500})))
        .await;
    let outs = containers(&app, 2, &env).await;
    for (status, _) in &outs {
        assert!(status.success(), "{status}");
    }
    let summaries: Vec<Value> = outs.iter().map(|(_, out)| summary_of(out)).collect();
    let deliveries = app.deliveries().await;
    let order_of: Vec<&str> = deliveries
        .iter()
        .filter_map(|d| d["data"]["character_string1"]["value"].as_str())
        .collect();
    let b_at = order_of.iter().position(|k| *k == "b-0");
    assert!(
        b_at.is_some_and(|at| at < 3),
        "B's message among the first three out, not after A's: {b_at:?} of {order_of:?} {summaries:?}"
    );
    let to_a = order_of.iter().filter(|k| k.starts_with("a-")).count();
    assert_eq!(to_a, 20, "A's grants spent, each once: {order_of:?}");
    assert_eq!(
        deliveries.len(),
        order_numbers(&deliveries).len(),
        "no push delivered twice"
    );
    assert_ledger_agrees_with_counters(&app).await;
}
