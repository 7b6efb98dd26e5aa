//! The metrics a tick writes, read the way CloudWatch reads them: the EMF lines a
//! `dispatch-once` process (the Lambda's code, in a process of its own) prints on
//! stdout, each count checked against what the WeChat stand-in recorded.

use std::collections::BTreeMap;
use std::process::Stdio;

use onegrant::metrics::{ALL, NAMESPACE, name};
use onegrant_tests::{ORDER, TestApp, User, spawn_app_with};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_dispatch-once");

async fn due_user(app: &TestApp, name: &str, grants: u32) -> User {
    let user = app.scheduled_user(name, grants).await;
    app.make_due(&user, "water", onegrant::Clock::real_now())
        .await;
    user
}

/// Sums every EMF document's values by (metric, its labels other than `Function`), and
/// collects distributions; checks each document's shape on the way.
fn scrape(stdout: &str) -> (BTreeMap<String, f64>, BTreeMap<String, Vec<f64>>) {
    let mut counts = BTreeMap::new();
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let doc: Value = serde_json::from_str(line).expect("a JSON line");
        let Some(aws) = doc.get("_aws") else { continue };
        let directive = &aws["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert!(aws["Timestamp"].as_u64().is_some(), "EMF needs a timestamp");
        assert_eq!(doc["Function"], "dispatcher");
        let dimensions: Vec<&str> = directive["Dimensions"][0]
            .as_array()
            .expect("one dimension set")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            dimensions.iter().all(|d| doc.get(*d).is_some()),
            "every dimension has a value"
        );
        let labels: Vec<String> = dimensions
            .iter()
            .filter(|d| **d != "Function")
            .map(|d| format!("{d}={}", doc[*d].as_str().unwrap_or_default()))
            .collect();
        for metric in directive["Metrics"].as_array().expect("metrics") {
            let metric_name = metric["Name"].as_str().expect("name");
            assert!(
                ALL.contains(&metric_name),
                "{metric_name} is a declared metric"
            );
            let key = if labels.is_empty() {
                metric_name.to_string()
            } else {
                format!("{metric_name}{{{}}}", labels.join(","))
            };
            match &doc[metric_name] {
                Value::Array(values) => samples
                    .entry(key)
                    .or_default()
                    .extend(values.iter().filter_map(Value::as_f64)),
                value => *counts.entry(key).or_default() += value.as_f64().expect("a number"),
            }
        }
    }
    (counts, samples)
}

#[tokio::test]
async fn a_ticks_emf_lines_count_what_the_stand_in_saw_sent_failed_unknown_and_skipped() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let sent = [
        due_user(&app, "ann", 1).await,
        due_user(&app, "bob", 1).await,
    ];
    let refused = due_user(&app, "cai", 1).await;
    let lost = due_user(&app, "dan", 1).await;
    // A push for a template the user never granted: due now, nothing to spend.
    let without = app.user("eve").await;
    let push = app
        .notify(json!({"idempotency_key": "order-1:shipped", "openid": without.openid,
                       "type": "order", "title": "订单已发货",
                       "wechat": {"template_id": ORDER, "data": {
                           "character_string1": "ORDER-1", "phrase2": "已发货", "thing3": "顺丰"}}}))
        .await;
    assert_eq!(push["push"], "pending", "{push}");
    for (user, fault) in [
        (&refused, json!({"errcode": 47003})),
        (&lost, json!({"drop_after_delivery": true})),
    ] {
        let mut fault = fault;
        fault["openid"] = json!(user.openid);
        app.control("POST", "faults", Some(fault)).await;
    }

    let child = app
        .dispatcher_process(
            BIN,
            &[
                ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
                ("DISPATCH_ONCE_SECONDS", "30"),
                ("WECHAT_TIMEOUT_MS", "1000"),
            ],
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("dispatch-once starts");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().expect("waits"))
        .await
        .expect("join");
    assert!(output.status.success(), "dispatch-once exits 0");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let (counts, samples) = scrape(&stdout);

    // What the stand-in saw: a message for each sent user and for the one whose answer
    // was dropped; nothing for the refused one or the one without a grant.
    let deliveries = app.deliveries().await;
    let to = |user: &User| {
        deliveries
            .iter()
            .filter(|d| d["openid"] == user.openid.as_str())
            .count()
    };
    let delivered_ok: usize = sent.iter().map(to).sum();
    assert_eq!(
        (delivered_ok, to(&lost), to(&refused), to(&without)),
        (2, 1, 0, 0)
    );

    let count = |key: &str| counts.get(key).copied().unwrap_or(0.0);
    assert_eq!(count(name::SENT), delivered_ok as f64, "{counts:?}");
    assert_eq!(count(name::UNKNOWN), to(&lost) as f64, "{counts:?}");
    assert_eq!(count(name::FAILED), 1.0, "{counts:?}");
    assert_eq!(
        count(&format!("{}{{Class=config}}", name::FAILED_BY_CLASS)),
        1.0,
        "{counts:?}"
    );
    assert_eq!(count(name::CONFIG_ERRORS), 1.0, "{counts:?}");
    // The push without a grant waits for one (no plan went without).
    assert_eq!(count(name::GRANT_WAITS), 1.0, "{counts:?}");
    assert_eq!(count(name::NO_GRANT), 0.0, "{counts:?}");
    assert_eq!(count(name::CLAIMED), 4.0, "{counts:?}");
    assert_eq!(count(name::DUE), 5.0, "{counts:?}");
    assert_eq!(count(name::TICKS), 1.0, "{counts:?}");
    assert_eq!(
        count(&format!("{}{{Outcome=ok}}", name::TOKEN_FETCHES)),
        1.0,
        "{counts:?}"
    );
    let lag = samples.get(name::SEND_LAG).cloned().unwrap_or_default();
    assert_eq!(
        lag.len(),
        4,
        "one due→answer sample per claimed send: {samples:?}"
    );
    assert!(lag.iter().all(|ms| *ms >= 0.0));

    // The summary line agrees with the metrics.
    let summary: Value = stdout
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v.get("sent").is_some())
        })
        .expect("the summary line");
    assert_eq!(summary["sent"], json!(2));
    assert_eq!(summary["unknown"], json!(1));
}
