//! Users: logging in, reporting grants, scheduling plans and making them due.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Value, json};

use crate::support::app::{Answer, TestApp, WATER};
use crate::support::invariants::attr_s;

/// Checks that `answer` is a per-user limit's refusal: 429 `rate_limited` with a
/// `Retry-After` of one to sixty seconds.
pub fn assert_rate_limited(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 429, "{what}: {}", answer.body);
    assert_eq!(answer.body["error"]["code"], "rate_limited", "{what}");
    let retry: u64 = answer
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry), "{what}: Retry-After {retry}");
}

/// A user with a session, known to the stand-in.
#[derive(Debug, Clone)]
pub struct User {
    pub openid: String,
    pub token: String,
}

/// A plan answer's (state, pause reason, needs_grant).
pub fn plan_state(plan: &Value) -> (String, Option<String>, bool) {
    (
        plan["state"].as_str().unwrap_or_default().to_string(),
        plan["pause_reason"].as_str().map(str::to_string),
        plan["needs_grant"].as_bool().unwrap_or(false),
    )
}

impl TestApp {
    /// `GET /v1/reminders/{kind}` for `user`: the plan's (state, pause reason,
    /// needs_grant).
    pub async fn plan_state(&self, user: &User, kind: &str) -> (String, Option<String>, bool) {
        let answer = self
            .get(&format!("/v1/reminders/{kind}"), Some(&user.token))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        plan_state(&answer.body)
    }

    /// Logs a user in and returns their session and openid.
    pub async fn user(&self, name: &str) -> User {
        let (code, openid) = self.login_code(name).await;
        let answer = self.post("/v1/session", None, &json!({"code": code})).await;
        assert_eq!(answer.status, 200, "login: {}", answer.body);
        User {
            openid,
            token: answer.body["token"].as_str().expect("token").to_string(),
        }
    }

    /// One tap that accepts `template`: the grant reported to onegrant and the quota
    /// WeChat (the stand-in) then really holds.
    pub async fn accept(&self, user: &User, template: &str, request_id: &str) {
        let answer = self
            .post(
                "/v1/grants",
                Some(&user.token),
                &json!({"request_id": request_id, "results": {template: "accept"}}),
            )
            .await;
        assert_eq!(answer.status, 200, "grant: {}", answer.body);
        self.control(
            "POST",
            "quota",
            Some(json!({"openid": user.openid, "template_id": template, "count": 1})),
        )
        .await;
    }

    /// A user holding `grants` accepted water grants (at the stand-in too) with the
    /// water plan enabled — scheduled, not yet due (see [`TestApp::make_due`]).
    pub async fn scheduled_user(&self, name: &str, grants: u32) -> User {
        let user = self.user(name).await;
        for i in 0..grants {
            self.accept(&user, WATER, &format!("wr_{name}_{i}")).await;
        }
        let plan = self.enable(&user, "water").await;
        assert_eq!(plan.body["state"], "scheduled", "{}", plan.body);
        user
    }

    /// Waits (up to 30 s, on a loaded machine) until `user`'s plan of `kind` is `sending`: a
    /// send in flight. Fails if it never is (the test's premise did not hold).
    pub async fn until_sending(&self, user: &User, kind: &str) {
        for _ in 0..1500 {
            let plan = self.item(user, &format!("PLAN#{kind}")).await;
            if plan.as_ref().and_then(|p| attr_s(p, "state")) == Some("sending") {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("{}'s {kind} plan never went sending", user.openid);
    }

    /// Asserts that `user` has `n` grant ledger items, every one `invalid`.
    pub async fn assert_grants_void(&self, user: &User, n: usize) {
        let grants = self.items_of(user, "grant").await;
        assert_eq!(grants.len(), n, "{grants:?}");
        assert!(
            grants.iter().all(|g| attr_s(g, "state") == Some("invalid")),
            "every grant void: {grants:?}"
        );
    }

    /// `POST /v1/notifications/read-all` for `user` (one bounded step).
    pub async fn read_all(&self, user: &User) -> Answer {
        self.call(
            "POST",
            "/v1/notifications/read-all",
            Some(&user.token),
            None,
        )
        .await
    }

    /// `PUT /v1/reminders/{kind}` turning the user's plan off (its grants void).
    pub async fn disable(&self, user: &User, kind: &str) -> Answer {
        self.call(
            "PUT",
            &format!("/v1/reminders/{kind}"),
            Some(&user.token),
            Some(br#"{"enabled": false}"#.to_vec()),
        )
        .await
    }

    /// `PUT /v1/reminders/{kind}` turning the user's plan on with its settings as they are.
    pub async fn enable(&self, user: &User, kind: &str) -> Answer {
        self.call(
            "PUT",
            &format!("/v1/reminders/{kind}"),
            Some(&user.token),
            Some(br#"{"enabled": true}"#.to_vec()),
        )
        .await
    }

    /// An update of `user`'s item `sk`, written straight to the table (a test's setup).
    pub fn update_of(
        &self,
        user: &User,
        sk: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.table
            .client
            .update_item()
            .table_name(&self.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(sk.to_string()))
    }

    /// Records `standing` (`reject`, `ban`, `main_switch_off`) as `user`'s standing
    /// choice for `template` on the quota item alone, as the consent of a deployment
    /// that did not configure some of the user's reminder kinds leaves it (their plans
    /// not paused).
    pub async fn record_standing(&self, user: &User, template: &str, standing: &str) {
        self.update_of(user, &format!("QUOTA#{template}"))
            .update_expression("SET standing = :s")
            .expression_attribute_values(":s", AttributeValue::S(standing.to_string()))
            .send()
            .await
            .expect("the standing choice recorded");
    }

    /// Moves a scheduled plan's due instant (time passing, without waiting for it).
    pub async fn make_due(&self, user: &User, kind: &str, at: chrono::DateTime<chrono::Utc>) {
        let ms = AttributeValue::N(at.timestamp_millis().to_string());
        self.update_of(user, &format!("PLAN#{kind}"))
            .update_expression("SET next_due_at = :t, due_at = :t")
            .condition_expression("#s = :scheduled")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":t", ms)
            .expression_attribute_values(":scheduled", AttributeValue::S("scheduled".into()))
            .send()
            .await
            .expect("the plan is scheduled");
    }

    /// `user`'s available grants of `template`, as its quota item counts them (0 when
    /// there is none).
    pub async fn available(&self, user: &User, template: &str) -> i64 {
        self.item(user, &format!("QUOTA#{template}"))
            .await
            .and_then(|q| crate::support::invariants::attr_n(&q, "available"))
            .unwrap_or(0)
    }

    /// The stored item `sk` of `user`.
    pub async fn item(&self, user: &User, sk: &str) -> Option<HashMap<String, AttributeValue>> {
        self.table
            .client
            .get_item()
            .table_name(&self.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(sk.to_string()))
            .consistent_read(true)
            .send()
            .await
            .expect("get item")
            .item
    }

    /// `n` available grants of `template` as an older version left them: ledger items
    /// and counters, but no open-grant sets. WeChat holds them too. Their request ids.
    pub async fn legacy_grants(&self, user: &User, template: &str, n: usize) -> Vec<String> {
        let ids: Vec<String> = (0..n).map(|i| format!("legacy_{i:03}")).collect();
        self.write_ledger(user, template, &ids, Some("available"))
            .await;
        self.quota_update(user, template)
            .update_expression(
                "SET template_id = :t, kind = :k, accepted = :n, available = :n \
                 REMOVE open_available, open_reserved",
            )
            .expression_attribute_values(":t", AttributeValue::S(template.into()))
            .expression_attribute_values(":k", AttributeValue::S("quota".into()))
            .expression_attribute_values(":n", AttributeValue::N(n.to_string()))
            .send()
            .await
            .expect("counters written");
        self.control(
            "POST",
            "quota",
            Some(json!({"openid": user.openid, "template_id": template, "count": n})),
        )
        .await;
        ids
    }

    /// Ledger items of `template` written straight to the table, counters untouched:
    /// grants in `state`, or refusals (no state) when `None`.
    pub async fn write_ledger(
        &self,
        user: &User,
        template: &str,
        ids: &[String],
        state: Option<&str>,
    ) {
        use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
        for chunk in ids.chunks(25) {
            let writes = chunk
                .iter()
                .map(|id| {
                    let mut item: HashMap<String, AttributeValue> = [
                        ("pk", format!("USER#{}", user.openid)),
                        ("sk", format!("GRANT#{template}#{id}")),
                        ("kind", "grant".to_string()),
                        ("template_id", template.to_string()),
                        ("request_id", id.clone()),
                        (
                            "result",
                            if state.is_some() { "accept" } else { "reject" }.to_string(),
                        ),
                        ("created_at", "2025-11-30T00:00:00Z".to_string()),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), AttributeValue::S(v)))
                    .collect();
                    item.insert("version".into(), AttributeValue::N("1".into()));
                    if let Some(state) = state {
                        item.insert("state".into(), AttributeValue::S(state.into()));
                    }
                    WriteRequest::builder()
                        .put_request(
                            PutRequest::builder()
                                .set_item(Some(item))
                                .build()
                                .expect("put"),
                        )
                        .build()
                })
                .collect();
            self.table
                .client
                .batch_write_item()
                .request_items(&self.table.name, writes)
                .send()
                .await
                .expect("ledger written");
        }
    }

    /// An update of `user`'s counter item of `template` (to set up states a test needs).
    pub fn quota_update(
        &self,
        user: &User,
        template: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.table
            .client
            .update_item()
            .table_name(&self.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(format!("QUOTA#{template}")))
    }

    /// The state of the grant a stored delivery of `user` reserved.
    pub async fn grant_state_of(
        &self,
        user: &User,
        delivery: &HashMap<String, AttributeValue>,
    ) -> Option<String> {
        let grant = self
            .item(user, attr_s(delivery, "grant_sk").unwrap_or_default())
            .await?;
        attr_s(&grant, "state").map(str::to_string)
    }
    /// `n` notifications of `user`'s, bare (a sort key, a kind, a title), written
    /// straight to the table: a long history.
    pub async fn put_notes(&self, user: &User, n: usize) {
        let pk = format!("USER#{}", user.openid);
        let notes = (0..n)
            .map(|i| {
                HashMap::from([
                    ("pk".to_string(), AttributeValue::S(pk.clone())),
                    ("sk".to_string(), AttributeValue::S(format!("NOTE#{i:06}"))),
                    ("kind".to_string(), AttributeValue::S("note".into())),
                    ("title".to_string(), AttributeValue::S("喝水".into())),
                ])
            })
            .collect();
        self.put_items(notes).await;
    }

    /// Writes `items` straight to the table (25 to a batch): a long history set up
    /// without the API.
    pub async fn put_items(&self, items: Vec<HashMap<String, AttributeValue>>) {
        use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
        let requests: Vec<WriteRequest> = items
            .into_iter()
            .map(|item| {
                let put = PutRequest::builder().set_item(Some(item)).build();
                WriteRequest::builder()
                    .put_request(put.expect("a put of an item"))
                    .build()
            })
            .collect();
        for chunk in requests.chunks(25) {
            self.table
                .client
                .batch_write_item()
                .request_items(&self.table.name, chunk.to_vec())
                .send()
                .await
                .expect("batch write");
        }
    }

    /// Every stored item of `user` whose kind attribute is `kind`.
    pub async fn items_of(&self, user: &User, kind: &str) -> Vec<HashMap<String, AttributeValue>> {
        let pk = format!("USER#{}", user.openid);
        self.items()
            .await
            .into_iter()
            .filter(|i| attr_s(i, "pk") == Some(pk.as_str()) && attr_s(i, "kind") == Some(kind))
            .collect()
    }

    /// `user`'s pushes by order number (`character_string1`): their outbox state (the
    /// inbox's push status never says `sending`; the outbox does).
    pub async fn outbox_states(&self, user: &User) -> std::collections::BTreeMap<String, String> {
        self.items_of(user, "outbox")
            .await
            .iter()
            .filter_map(|o| {
                let key = o
                    .get("data")
                    .and_then(|d| d.as_m().ok())
                    .and_then(|d| d.get("character_string1"))
                    .and_then(|v| v.as_s().ok())?;
                Some((key.clone(), attr_s(o, "state")?.to_string()))
            })
            .collect()
    }

    /// Waits until `user`'s push `key` (its order number) is in flight: a test acting
    /// during a send (a late stand-in) polls the stored state, in real time.
    pub async fn until_in_flight(&self, user: &User, key: &str) {
        for _ in 0..1000 {
            if self.outbox_states(user).await.get(key).map(String::as_str) == Some("sending") {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the push {key} never went in flight");
    }

    /// Holds (`true`) or releases the stand-in's sends to `openid`: a held send has
    /// been received and stays in flight until released, however long the test's own
    /// steps take (rather than a latency the machine's speed could outrun).
    pub async fn hold_sends(&self, openid: &str, held: bool) {
        self.control(
            "POST",
            "hold",
            Some(serde_json::json!({"openid": openid, "held": held})),
        )
        .await;
    }

    /// Has the stand-in push one event now (see its control API); the callback's
    /// answers.
    pub async fn push_event(&self, event: Value) -> Value {
        self.control("POST", "push-events", Some(event)).await
    }

    /// Has the stand-in push `event` until every copy of it is answered 200, as WeChat
    /// retries (the same event, its `CreateTime` the same: stamped now if `event` has
    /// none): the last answers. A copy the loaded emulator could not take within
    /// WeChat's window is answered 503 and pushed again (a 503 sooner is a failure and
    /// fails the test); anything else fails, and so do
    /// ten pushes in a row never all answered. (WeChat retries three times; ten here,
    /// where a loaded machine may miss the window with every copy of a push.)
    pub async fn push_event_answered(&self, mut event: Value) -> Value {
        if event.get("create_time").is_none() {
            event["create_time"] = serde_json::json!(self.now().timestamp());
        }
        for _ in 0..10 {
            let pushed = std::time::Instant::now();
            let answer = self.push_event(event.clone()).await;
            let answers = answer["answers"].as_array().cloned().unwrap_or_default();
            if !answers.is_empty() && answers.iter().all(|a| a == 200) {
                return answer;
            }
            assert!(
                !answers.is_empty() && answers.iter().all(|a| a == 200 || a == 503),
                "only the window's 503 may stand in for a 200: {answer}"
            );
            // A 503 before the window ended is a failure answered, not the window.
            assert!(
                pushed.elapsed() >= wechat_callback::WECHAT_PUSH_WINDOW,
                "a 503 inside WeChat's window, after {:?}: {answer}",
                pushed.elapsed()
            );
        }
        panic!("WeChat's retries of {event} were never all answered 200");
    }

    /// The stand-in's deliveries.
    pub async fn deliveries(&self) -> Vec<Value> {
        self.control("GET", "deliveries", None).await["deliveries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Runs ticks (up to twelve, 30 s of budget each) until `done` holds for their
    /// counts together: a loaded emulator may make a tick skip a shard, or give back a
    /// claim unsent for want of time (`released`), which the next takes. (Five were
    /// seen to fall one send short on a loaded CI machine; a tick with nothing left due
    /// ends at once, so the extra ones cost nothing when the work is done.)
    pub async fn ticks_until(
        &self,
        done: impl Fn(&dispatcher::Summary) -> bool,
    ) -> dispatcher::Summary {
        let mut all = dispatcher::Summary::default();
        for _ in 0..12 {
            all.absorb(self.tick(30).await);
            if done(&all) {
                break;
            }
        }
        all
    }

    /// Runs one dispatcher tick with `seconds` of budget.
    pub async fn tick(&self, seconds: u64) -> dispatcher::Summary {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
        dispatcher::tick(&self.deps, deadline).await.expect("tick")
    }
}
