//! The README's first command, end to end: `onegrant-local` starts everything, serves a
//! session and a grant report over HTTP, takes the stand-in's sealed pushes at its
//! callback, and SIGTERM stops everything it started — the emulator process included.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

fn alive(pid: u32) -> bool {
    // A zombie has exited; only a running process counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

/// POSTs `body` and reads the JSON answer.
async fn post_json(
    http: &reqwest::Client,
    url: String,
    body: serde_json::Value,
) -> serde_json::Value {
    http.post(url)
        .json(&body)
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON")
}

#[tokio::test]
async fn the_local_stack_serves_the_api_and_stops_everything_on_sigterm() {
    // reqwest is built without a default TLS provider; onegrant installs ring.
    onegrant::aws::install_crypto_provider();
    let common::Started {
        mut child,
        api,
        invoke,
        standin,
        printed,
    } = common::start_local(&[]);
    let summary = printed.join("\n");
    for expected in [
        format!("http://127.0.0.1:{api}"),
        format!("http://127.0.0.1:{invoke}/2015-03-31/functions"),
        format!("http://127.0.0.1:{standin}"),
        "POST   /v1/grants".to_string(),
    ] {
        assert!(
            summary.contains(&expected),
            "summary lacks {expected}:\n{summary}"
        );
    }
    let emulator_pid: u32 = summary
        .split("emulator pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.trim().parse().ok())
        .expect("the summary names the emulator's pid");
    assert!(alive(emulator_pid));

    let http = reqwest::Client::new();
    let code = post_json(
        &http,
        format!("http://127.0.0.1:{standin}/control/login-codes"),
        serde_json::json!({"user": "alice"}),
    )
    .await;
    let session: serde_json::Value = http
        .post(format!("http://127.0.0.1:{api}/v1/session"))
        .json(&serde_json::json!({"code": code["code"]}))
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("JSON");
    let token = session["token"].as_str().expect("a session token");
    let report = http
        .post(format!("http://127.0.0.1:{api}/v1/grants"))
        .bearer_auth(token)
        .json(&serde_json::json!({"request_id": "wr_1", "results": {"tmpl_water_reminder": "accept"}}))
        .send()
        .await
        .expect("grants");
    assert_eq!(report.status().as_u16(), 200);

    // The stand-in pushes to this stack's callback, sealed in safe mode: the user turns
    // the template off in WeChat's settings, and the grant is void.
    let openid = code["openid"].as_str().expect("openid");
    let pushed = post_json(
        &http,
        format!("http://127.0.0.1:{standin}/control/push-events"),
        serde_json::json!({"event": "change", "openid": openid,
                           "template_id": "tmpl_water_reminder"}),
    )
    .await;
    assert_eq!(pushed["answers"], serde_json::json!([200]), "{pushed}");
    let quotas: serde_json::Value = http
        .get(format!("http://127.0.0.1:{api}/v1/grants"))
        .bearer_auth(token)
        .send()
        .await
        .expect("quotas")
        .json()
        .await
        .expect("JSON");
    let water = quotas["quotas"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["template_id"] == "tmpl_water_reminder"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(water["accepted"], 1, "{quotas}");
    assert_eq!(water["available"], 0, "{quotas}");

    // The audit command, as an operator runs it against this stack's table: the grant's
    // whole life, oldest first, each step with its cause.
    let dynamodb = summary
        .lines()
        .find(|l| l.trim_start().starts_with("DynamoDB"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("the summary names the DynamoDB endpoint");
    let audit = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_onegrant-audit"))
            .args(args)
            .env("TABLE_NAME", "onegrant-local")
            .env("AWS_ENDPOINT_URL_DYNAMODB", dynamodb)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "local")
            .env("AWS_SECRET_ACCESS_KEY", "local")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .output()
            .expect("onegrant-audit runs")
    };
    let audit_all = audit(&[openid, "--template", "tmpl_water_reminder"]);
    assert!(
        audit_all.status.success(),
        "{}",
        String::from_utf8_lossy(&audit_all.stderr)
    );
    let timeline = String::from_utf8_lossy(&audit_all.stdout).to_string();
    let lines: Vec<&str> = timeline.lines().collect();
    assert_eq!(lines.len(), 3, "{timeline}");
    assert!(
        lines[0].contains("report wr_1") && lines[0].contains("(new) → available"),
        "{timeline}"
    );
    assert!(
        lines[1].contains("WeChat change event") && lines[1].contains("available → invalid"),
        "{timeline}"
    );
    // The refusal is kept for when the reminder is turned on: its plan, off.
    assert!(
        lines[2].contains("WeChat change event") && lines[2].contains("(new) → disabled"),
        "{timeline}"
    );
    let none = audit(&[openid, "--since", "2999-01-01"]);
    assert!(
        String::from_utf8_lossy(&none.stdout).contains("no history"),
        "nothing after --since"
    );

    // SIGTERM, as `kill` or a terminal closing sends it.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "onegrant-local did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(emulator_pid) {
        assert!(Instant::now() < deadline, "the emulator outlived the stack");
        std::thread::sleep(Duration::from_millis(50));
    }
}
