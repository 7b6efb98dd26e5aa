//! Other containers and direct function calls: dispatcher processes, claims and
//! finalizes by hand, sweeps, invocations of the event functions.

use std::collections::BTreeSet;
use std::process::{Child, ExitStatus};

use onegrant_local::stack;
use serde_json::{Value, json};

use crate::support::app::{ORDER, TestApp};
use crate::support::users::User;

/// Waits for a dispatcher process to exit, on a blocking thread (the runtime keeps
/// serving the stand-in): its status and what it printed.
pub async fn wait_for_exit(child: Child) -> (ExitStatus, String) {
    tokio::task::spawn_blocking(move || {
        let out = child.wait_with_output().expect("wait for the dispatcher");
        (out.status, String::from_utf8_lossy(&out.stdout).to_string())
    })
    .await
    .expect("join")
}

/// The summary `dispatch-once` prints last (after its metrics' EMF lines).
pub fn summary_of(stdout: &str) -> Value {
    let last = stdout.trim().lines().last().unwrap_or_default();
    serde_json::from_str(last).expect("summary JSON")
}

/// The distinct order numbers the stand-in delivered (the pushes' keys).
pub fn order_numbers(deliveries: &[Value]) -> BTreeSet<String> {
    deliveries
        .iter()
        .filter(|d| d["template_id"] == ORDER)
        .filter_map(|d| d["data"]["character_string1"]["value"].as_str())
        .map(str::to_string)
        .collect()
}

impl TestApp {
    /// A dispatcher process (`bin`: the `dispatch-once` binary, which only the
    /// dispatcher's own tests can name) on this app's table and stand-in, with clients
    /// of its own — another container. `env` adds or overrides variables.
    pub fn dispatcher_process(&self, bin: &str, env: &[(&str, &str)]) -> std::process::Command {
        let mut command = std::process::Command::new(bin);
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TABLE_NAME", &self.table.name)
            .env("AWS_ENDPOINT_URL_DYNAMODB", self.table.endpoint())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "local")
            .env("AWS_SECRET_ACCESS_KEY", "local")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("WECHAT_API_BASE", &self.standin_url)
            .env("WECHAT_APPID", stack::LOCAL_APPID)
            .env("WECHAT_SECRET", stack::LOCAL_SECRET)
            .env("SESSION_SECRET", stack::LOCAL_SESSION_SECRET)
            .env("ONEGRANT_TEMPLATES", stack::LOCAL_TEMPLATES)
            .env("ONEGRANT_REMINDERS", stack::LOCAL_REMINDERS)
            .env("DUE_SHARDS", self.deps.config.due_shards.to_string())
            .env("RUST_LOG", "error");
        for (k, v) in env {
            command.env(k, v);
        }
        command
    }

    /// `user` holding `n` accepted grants of `template` (at the stand-in too).
    pub async fn accept_n(&self, user: &User, template: &str, n: usize) {
        for i in 0..n {
            self.accept(user, template, &format!("g_{template}_{i}"))
                .await;
        }
    }

    /// A notification for `user` that asks for a WeChat push of the order template;
    /// `key` is its idempotency key (and the order number the message carries).
    pub async fn push(&self, user: &User, key: &str) -> Value {
        let answer = self
            .notify(json!({"idempotency_key": key, "openid": user.openid, "type": "order",
                           "title": "订单已发货", "body": format!("订单 {key} 已发出"),
                           "wechat": {"template_id": ORDER,
                                      "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}}))
            .await;
        assert_eq!(answer["push"], "pending", "push queued: {answer}");
        answer
    }

    /// Claims the one item due (by `now` + 5 s) through the store, as a dispatcher
    /// would (a 10 s lease), and returns the claim.
    pub async fn claim_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> onegrant::store::dispatch::Claim {
        let store = &self.deps.store;
        let span = store.shard_span(now).await.expect("registry");
        let due = store
            .due_items(now + chrono::Duration::seconds(5), &span)
            .await
            .expect("due");
        assert_eq!(due.len(), 1, "{due:?}");
        match store
            .claim(
                &due[0],
                "this-dispatcher",
                std::time::Duration::from_secs(10),
                now,
            )
            .await
            .expect("claim")
        {
            onegrant::store::dispatch::ClaimOutcome::Claimed(claim) => *claim,
            other => panic!("not claimed: {other:?}"),
        }
    }

    /// [`TestApp::claim_due`], then the dispatcher stalls past its lease and the sweep
    /// declares the send `unknown`: the claim, for its late answer.
    pub async fn claim_and_sweep(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> onegrant::store::dispatch::Claim {
        let claim = self.claim_due(now).await;
        let swept = self.sweep_at(now + chrono::Duration::seconds(60)).await;
        assert_eq!(swept.recovered, 1, "{swept:?}");
        claim
    }

    /// Finalizes `claim` through the store with WeChat's answer `result`.
    pub async fn finalize_as(
        &self,
        claim: &onegrant::store::dispatch::Claim,
        result: onegrant::domain::settle::SendResult,
    ) -> onegrant::store::dispatch::Finalized {
        self.deps
            .store
            .finalize(claim, &result, onegrant::Clock::real_now())
            .await
            .expect("finalized")
    }

    /// [`TestApp::finalize_as`] WeChat having taken the message with `msgid`.
    pub async fn finalize_sent(
        &self,
        claim: &onegrant::store::dispatch::Claim,
        msgid: &str,
    ) -> onegrant::store::dispatch::Finalized {
        let msgid = Some(msgid.to_string());
        self.finalize_as(claim, onegrant::domain::settle::SendResult::Sent { msgid })
            .await
    }

    /// Claims `item` as a dispatcher that then vanishes (a 10 s lease, no send, no
    /// finalize), as of `now`.
    pub async fn claim_and_vanish(
        &self,
        item: &onegrant::store::dispatch::DueItem,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let claimed = self
            .deps
            .store
            .claim(item, "vanished", std::time::Duration::from_secs(10), now)
            .await
            .expect("claim");
        assert!(
            matches!(claimed, onegrant::store::dispatch::ClaimOutcome::Claimed(_)),
            "{claimed:?}"
        );
    }

    /// Runs one sweep as if at `at`.
    pub async fn sweep_at(
        &self,
        at: chrono::DateTime<chrono::Utc>,
    ) -> onegrant::store::dispatch::SweepSummary {
        self.try_sweep_at(at).await.expect("the shard registry")
    }

    /// One sweep as if at `at`, or the error reading the shard registry that ends a
    /// sweep invocation before it starts (a sweep beside a faulty database).
    pub async fn try_sweep_at(
        &self,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<onegrant::store::dispatch::SweepSummary, onegrant::store::StoreError> {
        // Read only: a check must not register a shard count.
        let known = self.deps.store.known_shards().await?;
        Ok(self
            .deps
            .store
            .sweep(&self.deps.config.templates, 0..known, at)
            .await)
    }

    /// Invokes a function through the local Lambda Invoke API and returns its answer.
    pub async fn invoke(&self, function: &str, payload: &Value) -> Value {
        let response = self
            .http
            .post(format!(
                "{}/2015-03-31/functions/{function}/invocations",
                self.invoke_url
            ))
            .json(payload)
            .send()
            .await
            .expect("invoke");
        assert_eq!(response.status().as_u16(), 200, "invoke {function}");
        response.json().await.expect("invoke answers JSON")
    }

    /// Publishes a notification event (the EventBridge envelope around `detail`).
    pub async fn notify(&self, detail: Value) -> Value {
        self.notify_as("tests", "onegrant.notification", detail)
            .await
    }

    /// Cancels the push of `user`'s notification `key` (an `onegrant.cancel` event from
    /// the tests' publisher); the function's answer.
    pub async fn cancel(&self, user: &User, key: &str) -> Value {
        self.notify_as(
            "tests",
            "onegrant.cancel",
            json!({"idempotency_key": key, "openid": user.openid}),
        )
        .await
    }

    /// Delivers one event as the bus would, from `source` with `detail_type`.
    pub async fn notify_as(&self, source: &str, detail_type: &str, detail: Value) -> Value {
        self.invoke(
            "NotifyFunction",
            &json!({"version": "0", "id": "e", "detail-type": detail_type, "source": source,
                    "account": "1", "time": "2026-11-30T06:00:00Z", "region": "us-east-1", "resources": [],
                    "detail": detail}),
        )
        .await
    }
}
