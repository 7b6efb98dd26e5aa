//! Crash injection: a dispatcher process killed (SIGKILL) after the claim, after the
//! send before the finalize, and during the finalize. After the lease, one sweep leaves
//! every delivery terminal (`unknown` where the outcome is uncertain), its plan paused,
//! its grant invalid — and nothing is ever resent.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use chrono::Utc;
use onegrant_local::stack::{
    LOCAL_APPID, LOCAL_REMINDERS, LOCAL_SECRET, LOCAL_SESSION_SECRET, LOCAL_TEMPLATES,
};
use onegrant_tests::{
    User, assert_ledger_agrees_with_counters, assert_plans_consistent, attr_s, emulator_endpoint,
    spawn_app_with,
};

const LEASE_SECONDS: i64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_killed_at_each_step_leaves_every_delivery_terminal_after_one_sweep() {
    for point in ["after_claim", "after_send", "during_finalize"] {
        let lease = LEASE_SECONDS.to_string();
        let app = spawn_app_with(&[
            ("DISPATCH_LEASE_SECONDS", &lease),
            ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
        ])
        .await;
        let mut users: Vec<User> = Vec::new();
        for i in 0..4 {
            let user = app.scheduled_user(&format!("{point}-{i}"), 1).await;
            app.make_due(&user, "water", Utc::now()).await;
            users.push(user);
        }

        let status = Command::new(env!("CARGO_BIN_EXE_dispatch-once"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TABLE_NAME", &app.table.name)
            .env("AWS_ENDPOINT_URL_DYNAMODB", emulator_endpoint())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "local")
            .env("AWS_SECRET_ACCESS_KEY", "local")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("WECHAT_API_BASE", &app.standin_url)
            .env("WECHAT_APPID", LOCAL_APPID)
            .env("WECHAT_SECRET", LOCAL_SECRET)
            .env("SESSION_SECRET", LOCAL_SESSION_SECRET)
            .env("ONEGRANT_TEMPLATES", LOCAL_TEMPLATES)
            .env("ONEGRANT_REMINDERS", LOCAL_REMINDERS)
            .env("DISPATCH_LEASE_SECONDS", &lease)
            .env("DISPATCH_LOOKAHEAD_SECONDS", "0")
            .env("DISPATCH_ONCE_SECONDS", "30")
            .env("ONEGRANT_FAILPOINT", point)
            .env("RUST_LOG", "error")
            .status()
            .expect("dispatch-once runs");
        assert_eq!(
            status.signal(),
            Some(9),
            "{point}: the dispatcher was killed, not finished ({status})"
        );

        let sent_before = app.deliveries().await.len();
        match point {
            // Every task that claims reaches this point before it sends.
            "after_claim" => assert_eq!(sent_before, 0, "{point}: nothing was sent"),
            _ => assert!(
                sent_before >= 1,
                "{point}: WeChat delivered before the crash"
            ),
        }
        let stored = |state: &'static str| {
            let app = &app;
            async move {
                app.items()
                    .await
                    .into_iter()
                    .filter(|i| {
                        attr_s(i, "kind") == Some("delivery") && attr_s(i, "state") == Some(state)
                    })
                    .count()
            }
        };
        let in_flight = stored("claimed").await + stored("sending").await;
        assert!(in_flight >= 1, "{point}: the crash left a claim behind");

        // Before the lease expires the sweep leaves the claims alone…
        assert_eq!(
            app.deps
                .store
                .sweep(
                    &app.deps.config.reminders,
                    app.deps.config.due_shards,
                    Utc::now()
                )
                .await
                .expect("sweep"),
            0
        );
        // …after it, one sweep settles every one of them.
        let later = Utc::now() + chrono::Duration::seconds(LEASE_SECONDS + 1);
        let recovered = app
            .deps
            .store
            .sweep(
                &app.deps.config.reminders,
                app.deps.config.due_shards,
                later,
            )
            .await
            .expect("sweep");
        assert_eq!(
            recovered as usize, in_flight,
            "{point}: every stale claim recovered"
        );
        assert_eq!(
            stored("claimed").await + stored("sending").await,
            0,
            "{point}: all terminal"
        );

        for delivery in app
            .items()
            .await
            .into_iter()
            .filter(|i| attr_s(i, "kind") == Some("delivery"))
        {
            let state = attr_s(&delivery, "state").unwrap_or_default();
            assert!(
                !delivery.contains_key("lease_pk"),
                "{point}: off the lease index"
            );
            let pk = attr_s(&delivery, "pk").unwrap_or_default();
            let user = users
                .iter()
                .find(|u| pk == format!("USER#{}", u.openid))
                .expect("a user");
            let grant = app
                .item(user, attr_s(&delivery, "grant_sk").unwrap_or_default())
                .await;
            let plan = app.item(user, "PLAN#water").await;
            let grant_state = grant.as_ref().and_then(|g| attr_s(g, "state"));
            let plan_state = plan.as_ref().and_then(|p| attr_s(p, "state"));
            match state {
                "unknown" => {
                    assert_eq!(
                        grant_state,
                        Some("invalid"),
                        "{point}: an unknown send's grant"
                    );
                    assert_eq!(
                        plan_state,
                        Some("paused"),
                        "{point}: an unknown send's plan"
                    );
                    assert_eq!(
                        plan.as_ref().and_then(|p| attr_s(p, "pause_reason")),
                        Some("uncertain")
                    );
                }
                // A finalize that landed before the kill.
                "sent" => {
                    assert_eq!(grant_state, Some("consumed"));
                    assert_eq!(plan_state, Some("awaiting_checkin"));
                }
                other => panic!("{point}: delivery left {other}"),
            }
        }
        assert_ledger_agrees_with_counters(&app).await;
        assert_plans_consistent(&app).await;

        // Nothing is resent: plans whose send was in flight are paused, not due. A later
        // tick sends only the plans the killed process never reached, once each.
        app.tick(10).await;
        let deliveries = app.deliveries().await;
        assert!(deliveries.len() >= sent_before);
        for user in &users {
            let received = deliveries
                .iter()
                .filter(|d| d["openid"] == user.openid.as_str())
                .count();
            assert!(
                received <= 1,
                "{point}: {} received {received} messages",
                user.openid
            );
        }
        assert_ledger_agrees_with_counters(&app).await;
    }
}
