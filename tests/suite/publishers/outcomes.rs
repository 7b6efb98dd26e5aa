//! Every outcome told back (issue 44): each end of a publisher's push is an outcome
//! written in the same transaction as the status change and posted, signed, to the
//! publisher's webhook until it answers 2xx — at least once, with one `outcome_id` per
//! end across redeliveries. Invariants: I2 (a push told `sent` went out once), I7
//! (record first: the outcome rides on the change itself), I10 (bounded ticks).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use onegrant_tests::{
    ORDER, Receiver, SHOP, TestApp, User, order_detail, spawn_app_with, spawn_pushing_app_with,
};
use serde_json::{Value, json};

fn publishers(receiver: &Receiver) -> String {
    json!([{"source": SHOP.source, "key": SHOP.key, "webhook": receiver.url}]).to_string()
}

fn order(user: &User, key: &str, extra: Value) -> Value {
    order_detail(&user.openid, key, extra)
}

async fn outcome_items(app: &TestApp, user: &User) -> usize {
    app.items_of(user, "outcome").await.len()
}

/// The outcomes the receiver took (answered 200), by idempotency key and status.
fn taken(receiver: &Receiver) -> BTreeMap<(String, String), Vec<Value>> {
    let mut by: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
    for post in receiver
        .received()
        .into_iter()
        .filter(|p| p.answered == 200)
    {
        let key = (
            post.outcome["idempotency_key"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            post.outcome["status"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        by.entry(key).or_default().push(post.outcome);
    }
    by
}

#[tokio::test]
async fn each_push_end_is_told_once_signed_to_its_publishers_webhook() {
    let receiver = Receiver::spawn().await;
    let config = publishers(&receiver);
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config), ("AUDIT_TRAIL", "false")]).await;
    let user = app.user("told").await;
    app.accept(&user, ORDER, "told_1").await;

    // Sent (the one grant).
    assert_eq!(
        app.publish(&order(&user, "o-sent", json!({})), SHOP)
            .await
            .status,
        201
    );
    assert_eq!(app.ticks_until(|s| s.sent == 1).await.sent, 1);
    // Cancelled before it was due.
    let later = (app.now() + chrono::Duration::hours(1)).to_rfc3339();
    assert_eq!(
        app.publish(
            &order(&user, "o-cancelled", json!({"send_at": later})),
            SHOP
        )
        .await
        .status,
        201
    );
    let cancel = app
        .publisher_call(
            "POST",
            "/publisher/v1/cancels",
            Some(&json!({"openid": user.openid, "idempotency_key": "o-cancelled"})),
            Some(SHOP),
        )
        .await;
    assert_eq!(cancel.body["status"], "cancelled", "{}", cancel.body);
    // Rejected as it came (an unknown template).
    let rejected = app
        .publish(
            &order(
                &user,
                "o-rejected",
                json!({"wechat": {"template_id": "tmpl_nope", "data": {}}}),
            ),
            SHOP,
        )
        .await;
    assert_eq!(rejected.body["push"], "rejected", "{}", rejected.body);
    // Expired waiting for a grant (the one was spent).
    let soon = (app.now() + chrono::Duration::minutes(10)).to_rfc3339();
    app.publish(
        &order(&user, "o-expired", json!({"expires_at": soon})),
        SHOP,
    )
    .await;
    app.ticks_until(|_| true).await;
    app.advance(Duration::from_secs(11 * 60));
    assert_eq!(app.ticks_until(|s| s.expired == 1).await.expired, 1);

    // Each end waits in the table, written with its change, until it is delivered.
    assert_eq!(outcome_items(&app, &user).await, 4);
    let summary = app.deliver_outcomes().await;
    assert_eq!((summary.delivered, summary.retried), (4, 0), "{summary:?}");
    let taken = taken(&receiver);
    let ends: BTreeSet<(String, String)> = taken.keys().cloned().collect();
    let want: BTreeSet<(String, String)> = [
        ("o-sent", "sent"),
        ("o-cancelled", "cancelled"),
        ("o-rejected", "rejected"),
        ("o-expired", "expired"),
    ]
    .into_iter()
    .map(|(k, s)| (k.to_string(), s.to_string()))
    .collect();
    assert_eq!(ends, want);
    for post in receiver.received() {
        assert_eq!(
            post.uri.to_string(),
            "/hooks/%E8%AE%A2%E5%8D%95%201?shop=1",
            "its path travels encoded"
        );
        assert!(post.signed_with(SHOP.key), "{:?}", post.headers);
        let outcome = &post.outcome;
        assert_eq!(outcome["source"], SHOP.source);
        assert_eq!(outcome["openid"], user.openid.as_str());
        assert_eq!(
            outcome["outcome_id"],
            format!(
                "{}.{}",
                outcome["note_id"].as_str().unwrap_or(""),
                outcome["status"].as_str().unwrap_or("")
            ),
        );
        assert!(
            outcome["at"].is_string() && outcome.get("reason").is_some(),
            "{outcome}"
        );
    }
    assert_eq!(
        taken[&("o-rejected".to_string(), "rejected".to_string())][0]["reason"],
        "template_not_configured"
    );
    assert_eq!(
        outcome_items(&app, &user).await,
        0,
        "delivered ones are gone"
    );
    // Nothing is told twice once taken.
    assert_eq!(app.deliver_outcomes().await.delivered, 0);
    assert_eq!(receiver.received().len(), 4);
}

#[tokio::test]
async fn an_unknown_send_later_settled_sent_is_told_twice_under_two_ids() {
    let receiver = Receiver::spawn().await;
    let config = publishers(&receiver);
    let app = spawn_pushing_app_with(1, &[("ONEGRANT_PUBLISHERS", &config)]).await;
    let user = app.user("unknown").await;
    app.accept(&user, ORDER, "unknown_1").await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "drop_after_delivery": true})),
    )
    .await;
    app.publish(&order(&user, "o-unknown", json!({})), SHOP)
        .await;
    assert_eq!(app.tick(30).await.unknown, 1);
    // WeChat's sent event (the stand-in pushes it right after delivering) settles it.
    let target = format!(
        "/publisher/v1/notifications/o-unknown?openid={}",
        user.openid
    );
    let mut status = Value::Null;
    for _ in 0..100 {
        status = app
            .publisher_call("GET", &target, None, Some(SHOP))
            .await
            .body;
        if status["notification"]["push"]["status"] == "sent" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status["notification"]["push"]["status"], "sent", "{status}");
    assert_eq!(app.deliver_outcomes().await.delivered, 2);
    let posts = receiver.received();
    let statuses: Vec<&str> = posts
        .iter()
        .filter_map(|p| p.outcome["status"].as_str())
        .collect();
    assert_eq!(statuses, ["unknown", "sent"], "oldest first");
    assert_ne!(
        posts[0].outcome["outcome_id"],
        posts[1].outcome["outcome_id"]
    );
    assert_eq!(posts[0].outcome["note_id"], posts[1].outcome["note_id"]);
}

#[tokio::test]
async fn with_the_webhook_down_for_two_minutes_every_outcome_arrives_after_it_is_back() {
    let receiver = Receiver::spawn().await;
    let config = publishers(&receiver);
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config)]).await;
    let user = app.user("down").await;
    receiver.set_down(true);
    // Three ends at once: pushes rejected as they come.
    for i in 0..3 {
        let detail = order(
            &user,
            &format!("o-{i}"),
            json!({"wechat": {"template_id": "tmpl_nope", "data": {}}}),
        );
        assert_eq!(app.publish(&detail, SHOP).await.status, 201);
    }
    // Two minutes of ticks against a webhook answering 503: one try per tick (the rest
    // wait), each failed one later and later.
    for _ in 0..4 {
        let summary = app.deliver_outcomes().await;
        assert_eq!(summary.delivered, 0, "{summary:?}");
        app.advance(Duration::from_secs(30));
    }
    assert!(receiver.received().iter().all(|p| p.answered == 503));
    assert!(!receiver.received().is_empty(), "tried while down");
    receiver.set_down(false);
    for _ in 0..40 {
        if taken(&receiver).len() == 3 {
            break;
        }
        app.deliver_outcomes().await;
        app.advance(Duration::from_secs(30));
    }
    let taken = taken(&receiver);
    assert_eq!(taken.len(), 3, "every outcome arrived: {taken:?}");
    // A redelivery carries the id of its first try.
    let mut ids: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for post in receiver.received() {
        ids.entry(
            post.outcome["idempotency_key"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
        .or_default()
        .insert(
            post.outcome["outcome_id"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    assert!(ids.values().all(|set| set.len() == 1), "{ids:?}");
    assert_eq!(outcome_items(&app, &user).await, 0);
}

#[tokio::test]
async fn an_outcome_no_webhook_takes_for_a_day_is_given_up_and_kept() {
    let receiver = Receiver::spawn().await;
    let config = publishers(&receiver);
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config)]).await;
    let user = app.user("dead").await;
    receiver.set_down(true);
    let detail = order(
        &user,
        "o-dead",
        json!({"wechat": {"template_id": "tmpl_nope", "data": {}}}),
    );
    app.publish(&detail, SHOP).await;
    let mut dead = 0;
    let mut tries = 0;
    for _ in 0..80 {
        let summary = app.deliver_outcomes().await;
        tries += summary.retried + summary.dead;
        dead += summary.dead;
        if dead > 0 {
            break;
        }
        app.advance(Duration::from_secs(31 * 60));
    }
    assert_eq!(dead, 1, "given up");
    assert!(tries >= 40, "tried for a day first: {tries}");
    let kept = app.items_of(&user, "outcome").await;
    assert_eq!(kept.len(), 1);
    assert!(
        kept[0].contains_key("dead_at") && !kept[0].contains_key("due_pk"),
        "{kept:?}"
    );
    // Off the index: nothing more is tried.
    app.advance(Duration::from_secs(3600));
    let before = receiver.received().len();
    app.deliver_outcomes().await;
    assert_eq!(receiver.received().len(), before);
}

/// moto's EventBridge and SQS (`onegrant_tests::emulator_call`).
async fn aws(service: &str, target: &str, version: &str, body: Value) -> Value {
    onegrant_tests::emulator_call(service, target, version, body).await
}

/// A bus whose rule sends every outcome to a queue (what a publisher on AWS
/// subscribes): the bus's name and the queue's URL.
async fn bus_to_queue(name: &str) -> (String, String) {
    aws(
        "events",
        "AWSEvents.CreateEventBus",
        "1.1",
        json!({"Name": name}),
    )
    .await;
    let queue = aws(
        "sqs",
        "AmazonSQS.CreateQueue",
        "1.0",
        json!({"QueueName": name}),
    )
    .await;
    let url = queue["QueueUrl"].as_str().expect("a queue url").to_string();
    let attributes = aws(
        "sqs",
        "AmazonSQS.GetQueueAttributes",
        "1.0",
        json!({"QueueUrl": url, "AttributeNames": ["QueueArn"]}),
    )
    .await;
    let arn = attributes["Attributes"]["QueueArn"]
        .as_str()
        .expect("an arn");
    let pattern = json!({"source": ["onegrant"], "detail-type": ["onegrant.push.outcome"]});
    aws(
        "events",
        "AWSEvents.PutRule",
        "1.1",
        json!({"Name": name, "EventBusName": name, "EventPattern": pattern.to_string()}),
    )
    .await;
    aws(
        "events",
        "AWSEvents.PutTargets",
        "1.1",
        json!({"Rule": name, "EventBusName": name, "Targets": [{"Id": "queue", "Arn": arn}]}),
    )
    .await;
    (name.to_string(), url)
}

/// The events the queue holds: each one's `detail`.
async fn queued(url: &str) -> Vec<Value> {
    let answer = aws(
        "sqs",
        "AmazonSQS.ReceiveMessage",
        "1.0",
        json!({"QueueUrl": url, "MaxNumberOfMessages": 10}),
    )
    .await;
    answer["Messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| serde_json::from_str::<Value>(m["Body"].as_str()?).ok())
        .inspect(|event| {
            assert_eq!(event["source"], "onegrant", "{event}");
            assert_eq!(event["detail-type"], "onegrant.push.outcome", "{event}");
        })
        .map(|event| event["detail"].clone())
        .collect()
}

#[tokio::test]
async fn each_outcome_is_also_put_on_the_stacks_bus_whichever_way_its_push_came() {
    let name = format!("outcomes-{}", uuid::Uuid::new_v4().simple());
    let (bus, queue) = bus_to_queue(&name).await;
    let app = spawn_app_with(&[
        ("OUTCOME_BUS", &bus),
        (
            "AWS_ENDPOINT_URL_EVENTS",
            onegrant_tests::emulator_endpoint(),
        ),
    ])
    .await;
    let user = app.user("bus").await;
    let nope = json!({"wechat": {"template_id": "tmpl_nope", "data": {}}});
    // One over HTTP, one from the bus (the same publisher, no webhook).
    app.publish(&order(&user, "o-http", nope.clone()), SHOP)
        .await;
    let event = json!({"detail-type": "onegrant.notification", "source": SHOP.source,
                       "account": "1", "detail": order(&user, "o-bus", nope)});
    assert_eq!(
        app.invoke("NotifyFunction", &event).await["push"],
        "rejected"
    );
    let summary = app.deliver_outcomes().await;
    assert_eq!(
        (summary.unaddressed, summary.retried),
        (2, 0),
        "{summary:?}"
    );
    let mut told: Vec<(String, String)> = queued(&queue)
        .await
        .iter()
        .map(|d| {
            assert_eq!(d["source"], SHOP.source);
            assert_eq!(d["openid"], user.openid.as_str());
            (
                d["idempotency_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                d["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    told.sort();
    assert_eq!(
        told,
        [
            ("o-bus".to_string(), "rejected".to_string()),
            ("o-http".to_string(), "rejected".to_string())
        ]
    );
    assert_eq!(outcome_items(&app, &user).await, 0);
}

#[tokio::test]
async fn a_leg_taken_is_not_repeated_while_the_other_is_tried_again() {
    let receiver = Receiver::spawn().await;
    let config = publishers(&receiver);
    // A bus nothing answers for: every put fails.
    let app = spawn_app_with(&[
        ("ONEGRANT_PUBLISHERS", &config),
        ("OUTCOME_BUS", "no-such-bus"),
        ("AWS_ENDPOINT_URL_EVENTS", "http://127.0.0.1:9"),
    ])
    .await;
    let user = app.user("legs").await;
    let nope = json!({"wechat": {"template_id": "tmpl_nope", "data": {}}});
    app.publish(&order(&user, "o-legs", nope), SHOP).await;
    for _ in 0..3 {
        let summary = app.deliver_outcomes().await;
        assert_eq!((summary.delivered, summary.retried), (0, 1), "{summary:?}");
        app.advance(Duration::from_secs(30 * 60));
    }
    assert_eq!(
        receiver.received().len(),
        1,
        "the webhook took it once, and only once"
    );
    let kept = app.items_of(&user, "outcome").await;
    assert_eq!(kept.len(), 1);
    assert_eq!(onegrant_tests::attr_n(&kept[0], "attempts"), Some(3));
    assert!(kept[0].contains_key("hook_done"), "{kept:?}");
}

#[tokio::test]
async fn a_slow_webhook_delays_neither_another_publisher_nor_a_send() {
    let slow = Receiver::spawn().await;
    let fast = Receiver::spawn().await;
    slow.set_delay(Duration::from_secs(8));
    let config = json!([
        {"source": SHOP.source, "key": SHOP.key, "webhook": slow.url},
        {"source": "com.example.news", "key": "the-news-publisher-key", "webhook": fast.url}
    ])
    .to_string();
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config)]).await;
    let user = app.user("slow").await;
    app.accept(&user, ORDER, "slow_1").await;
    let news = onegrant_tests::Signer {
        source: "com.example.news",
        key: "the-news-publisher-key",
        skew: 0,
    };
    let nope = json!({"wechat": {"template_id": "tmpl_nope", "data": {}}});
    app.publish(&order(&user, "o-slow", nope.clone()), SHOP)
        .await;
    app.publish(&order(&user, "o-fast", nope), news).await;
    app.publish(&order(&user, "o-send", json!({})), news).await;
    // The outcomes' tick and the dispatcher's side by side: the send is not held up by
    // the shop's webhook answering in 8 s (past the 5 s a post may take).
    let (told, sent) = tokio::join!(app.deliver_outcomes(), async {
        app.ticks_until(|s| s.sent == 1).await
    });
    assert_eq!(sent.sent, 1, "{sent:?}");
    assert_eq!((told.delivered, told.retried), (1, 1), "{told:?}");
    let fast_took: Vec<Value> = fast.received().into_iter().map(|p| p.outcome).collect();
    assert_eq!(fast_took.len(), 1);
    assert_eq!(fast_took[0]["idempotency_key"], "o-fast");
    // The slow one is tried again later, with the same id.
    slow.set_delay(Duration::ZERO);
    app.advance(Duration::from_secs(60));
    let again = app.deliver_outcomes().await;
    assert!(again.delivered >= 1, "{again:?}");
    assert!(taken(&slow).contains_key(&("o-slow".to_string(), "rejected".to_string())));
}

#[tokio::test]
async fn nothing_of_an_erased_user_is_told_or_answered() {
    let receiver = Receiver::spawn().await;
    let config = publishers(&receiver);
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config)]).await;
    let user = app.user("erased").await;
    let nope = json!({"wechat": {"template_id": "tmpl_nope", "data": {}}});
    app.publish(&order(&user, "o-erased", nope), SHOP).await;
    assert_eq!(outcome_items(&app, &user).await, 1, "an outcome waits");
    let target = format!(
        "/publisher/v1/notifications/o-erased?openid={}",
        user.openid
    );
    assert_eq!(
        app.publisher_call("GET", &target, None, Some(SHOP))
            .await
            .status,
        200
    );
    // WeChat says the user closed their account: the erasure begins (its tombstone),
    // and before its first step a tick of the outcomes comes.
    let openid = onegrant::domain::OpenId::parse(user.openid.as_str()).expect("an openid");
    app.deps
        .store
        .start_erasure(
            &openid,
            onegrant::domain::erasure::ErasureCause::AccountClosed,
            app.now(),
        )
        .await
        .expect("the erasure begins");
    assert_eq!(outcome_items(&app, &user).await, 1, "not deleted yet");
    let summary = app.deliver_outcomes().await;
    assert_eq!(summary.delivered + summary.retried, 0, "{summary:?}");
    assert!(receiver.received().is_empty(), "nothing told");
    assert_eq!(outcome_items(&app, &user).await, 0, "nor kept");
    assert_eq!(
        app.publisher_call("GET", &target, None, Some(SHOP))
            .await
            .status,
        404,
        "nothing answered"
    );
}

#[tokio::test]
async fn a_dead_webhooks_backlog_holds_up_no_other_publisher_and_is_given_up_after_its_day() {
    let dead = Receiver::spawn().await;
    let live = Receiver::spawn().await;
    dead.set_down(true);
    let config = json!([
        {"source": SHOP.source, "key": SHOP.key, "webhook": dead.url},
        {"source": "com.example.news", "key": "the-news-publisher-key", "webhook": live.url}
    ])
    .to_string();
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config), ("AUDIT_TRAIL", "false")]).await;
    let user = app.user("backlog").await;
    let news = onegrant_tests::Signer {
        source: "com.example.news",
        key: "the-news-publisher-key",
        skew: 0,
    };
    let nope = json!({"wechat": {"template_id": "tmpl_nope", "data": {}}});
    let told_news =
        |key: &str| taken(&live).contains_key(&(key.to_string(), "rejected".to_string()));
    // More of the shop's outcomes than one tick reads of a queue (four shards of 50),
    // all older than the news' first one.
    let backlog = 4 * outcomes::PER_SHARD + 40;
    for i in 0..backlog {
        app.publish(&order(&user, &format!("o-{i}"), nope.clone()), SHOP)
            .await;
    }
    app.advance(Duration::from_secs(1));
    app.publish(&order(&user, "n-1", nope.clone()), news).await;
    // The shop's outcomes read once leave the shared queue for its own: the news' is
    // told by the second tick, each tick posting to the failing webhook once. (By the
    // first, when the news' outcome hashed to a shard holding fewer than a page of the
    // shop's: two ticks all the same, the second reading the rest of the backlog.)
    let mut ticks = 0;
    while (!told_news("n-1") || ticks < 2) && ticks < 5 {
        if ticks > 0 {
            app.advance(Duration::from_secs(60));
        }
        app.deliver_outcomes().await;
        ticks += 1;
        assert_eq!(
            dead.received().len(),
            ticks,
            "one post a tick to a failing webhook"
        );
    }
    assert!(told_news("n-1") && ticks <= 2, "in {ticks} ticks");
    let own = format!("OUTCOME#{}#", SHOP.source);
    let in_own_queue = app
        .items_of(&user, "outcome")
        .await
        .iter()
        .filter(|o| onegrant_tests::attr_s(o, "due_pk").is_some_and(|p| p.starts_with(&own)))
        .count();
    assert_eq!(in_own_queue, backlog);
    // From then on the news' outcomes are told in the tick after they are written,
    // though the shop's, due again before them, are older.
    for round in 2..5 {
        let key = format!("n-{round}");
        app.advance(Duration::from_secs(60));
        app.publish(&order(&user, &key, nope.clone()), news).await;
        let tick = app.deliver_outcomes().await;
        assert_eq!(tick.delivered, 1, "{key}: {tick:?}");
        assert!(told_news(&key), "{key}");
    }
    // A day on, the shop's webhook still down: every outcome of its a tick reads is
    // given up in that tick (not one a tick), kept for the operator.
    app.advance(Duration::from_secs(86_400));
    let mut given_up = 0;
    let mut ticks = 0;
    while given_up < backlog && ticks < 10 {
        let tick = app.deliver_outcomes().await;
        assert_eq!((tick.delivered, tick.retried), (0, 0), "{tick:?}");
        given_up += usize::try_from(tick.dead).expect("count");
        ticks += 1;
    }
    assert_eq!(given_up, backlog, "in {ticks} ticks");
    assert!(ticks <= 3, "{ticks} ticks for {backlog} outcomes");
    let kept = app.items_of(&user, "outcome").await;
    assert_eq!(kept.len(), backlog);
    assert!(kept.iter().all(|o| o.contains_key("dead_at")), "{kept:?}");
}

#[tokio::test]
async fn outcomes_in_a_publishers_own_queue_are_still_told_once_its_webhook_is_removed() {
    let dead = Receiver::spawn().await;
    dead.set_down(true);
    let config = publishers(&dead);
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", &config), ("AUDIT_TRAIL", "false")]).await;
    let user = app.user("unhooked").await;
    let nope = json!({"wechat": {"template_id": "tmpl_nope", "data": {}}});
    for i in 0..3 {
        app.publish(&order(&user, &format!("o-{i}"), nope.clone()), SHOP)
            .await;
    }
    let first = app.deliver_outcomes().await;
    assert_eq!((first.retried, first.delivered), (1, 0), "{first:?}");
    let own = format!("OUTCOME#{}#", SHOP.source);
    let in_own_queue = |items: &[std::collections::HashMap<String, _>]| {
        items
            .iter()
            .filter(|o| onegrant_tests::attr_s(o, "due_pk").is_some_and(|p| p.starts_with(&own)))
            .count()
    };
    assert_eq!(in_own_queue(&app.items_of(&user, "outcome").await), 3);
    // The operator drops the shop's webhook, keeping the publisher: redeployed.
    let mut config = (*app.deps.config).clone();
    config.publishers = onegrant::domain::publisher::Publishers::parse(
        &json!([{"source": SHOP.source, "key": SHOP.key}]).to_string(),
    )
    .expect("publishers");
    let deps = onegrant_local::stack::deps_on(config, app.table.client.clone(), app.clock.clone())
        .expect("deps");
    let tick = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        outcomes::tick(&deps, deadline).await.expect("tick")
    };
    app.advance(Duration::from_secs(60));
    // Its own queue is still read: the three go on the bus only (none configured
    // here: nothing to put), and are gone.
    let told = tick().await;
    assert_eq!(told.unaddressed, 3, "{told:?}");
    assert_eq!(outcome_items(&app, &user).await, 0);
    // Empty now, and nothing can move there again: no longer read.
    tick().await;
    let registry: Vec<_> = app
        .items()
        .await
        .into_iter()
        .filter(|i| onegrant_tests::attr_s(i, "sk") == Some("OUTCOME_QUEUES"))
        .collect();
    assert_eq!(registry.len(), 1, "{registry:?}");
    assert!(!registry[0].contains_key("sources"), "{registry:?}");
}
