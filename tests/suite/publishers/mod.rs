//! Publishers anywhere (issue 44): the signed publisher API on the bus's code path, and
//! each publisher kept in its lane, over HTTP and on the bus alike. Invariants: I8
//! (isolation: a publisher sees and changes only its own notifications; identity only
//! from a verified signature), I2 (a push goes out once, spending one grant), I10 (each
//! publisher's calls bounded by the minute).

mod outcomes;

use onegrant_tests::{ORDER, SHOP, Signer, TestApp, User, order_detail, spawn_app_with};
use serde_json::{Value, json};

/// A second publisher beside the local stack's default one.
const NEWS: Signer = Signer {
    source: "com.example.news",
    key: "the-news-publisher-key",
    skew: 0,
};

const TWO_PUBLISHERS: &str = r#"[{"source": "com.example.shop", "key": "local-publisher-secret", "previous_key": "the-shop-key-before"},
  {"source": "com.example.news", "key": "the-news-publisher-key"}]"#;

fn order(user: &User, key: &str, extra: Value) -> Value {
    order_detail(&user.openid, key, extra)
}

async fn status(app: &TestApp, signer: Signer, user: &User, key: &str) -> onegrant_tests::Answer {
    app.publisher_call(
        "GET",
        &format!("/publisher/v1/notifications/{key}?openid={}", user.openid),
        None,
        Some(signer),
    )
    .await
}

async fn cancel(app: &TestApp, signer: Signer, user: &User, key: &str) -> onegrant_tests::Answer {
    app.publisher_call(
        "POST",
        "/publisher/v1/cancels",
        Some(&json!({"openid": user.openid, "idempotency_key": key})),
        Some(signer),
    )
    .await
}

#[tokio::test]
async fn a_signed_publish_is_created_once_sent_once_and_its_status_tells_each_step() {
    let app = spawn_app_with(&[("AUDIT_TRAIL", "false")]).await;
    // One minute throughout: a replay straddling a minute's end would count the
    // publisher's requests on a new minute's item (a fresh-clone CI saw it).
    app.freeze_at_a_minute_start();
    let user = app.user("signed").await;
    app.accept(&user, ORDER, "pub_1").await;
    let detail = order(&user, "order-1001:shipped", json!({}));

    let created = app.publish(&detail, SHOP).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["status"], "created");
    assert_eq!(created.body["push"], "pending");
    let note_id = created.body["note_id"].clone();
    let stored = app.items().await.len();

    // The same request again (a retry after a lost answer): the same notification.
    let again = app.publish(&detail, SHOP).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["status"], "duplicate");
    assert_eq!(again.body["note_id"], note_id);
    assert_eq!(
        again
            .headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(app.items().await.len(), stored, "a replay stores nothing");
    // The same key with another payload: refused, nothing changed.
    let changed = app
        .publish(
            &order(&user, "order-1001:shipped", json!({"title": "另一个"})),
            SHOP,
        )
        .await;
    assert_eq!(changed.status, 409, "{}", changed.body);
    assert_eq!(changed.body["error"]["code"], "idempotency_conflict");
    // A detail that does not validate: 422 with the rule, nothing stored.
    let invalid = app
        .publish(
            &json!({"idempotency_key": "k2", "openid": user.openid}),
            SHOP,
        )
        .await;
    assert_eq!(invalid.status, 422, "{}", invalid.body);
    assert_eq!(invalid.body["error"]["code"], "invalid_event");
    assert_eq!(app.items().await.len(), stored);

    let pending = status(&app, SHOP, &user, "order-1001:shipped").await;
    assert_eq!(pending.status, 200, "{}", pending.body);
    assert_eq!(pending.body["notification"]["id"], note_id);
    assert_eq!(pending.body["notification"]["push"]["status"], "pending");
    assert_eq!(pending.body["scheduled"], false);

    let summary = app.ticks_until(|s| s.sent == 1).await;
    assert_eq!(summary.sent, 1, "{summary:?}");
    let sent = status(&app, SHOP, &user, "order-1001:shipped").await;
    assert_eq!(
        sent.body["notification"]["push"]["status"], "sent",
        "{}",
        sent.body
    );
    let history: Vec<&str> = sent.body["history"]
        .as_array()
        .expect("a history")
        .iter()
        .filter_map(|m| m["status"].as_str())
        .collect();
    assert_eq!(history, ["pending", "sent"], "{}", sent.body);
    assert_eq!(app.deliveries().await.len(), 1, "sent once");
}

#[tokio::test]
async fn a_request_not_signed_by_its_publisher_is_refused_before_anything_is_read() {
    let app = spawn_app_with(&[("ONEGRANT_PUBLISHERS", TWO_PUBLISHERS)]).await;
    // Held: a timestamp 300 or 301 s off stays so when the request arrives (on the
    // live clock a second could pass in between and move the edge cases across it).
    app.freeze_at_a_minute_start();
    let user = app.user("unsigned").await;
    let detail = order(&user, "k-1", json!({}));
    let stored = app.items().await.len();
    let cases: [(&str, Option<Signer>); 6] = [
        ("no signature", None),
        (
            "a wrong key",
            Some(SHOP.with_key("not-the-shops-key-at-all")),
        ),
        (
            "another publisher's key",
            Some(SHOP.with_key("the-news-publisher-key")),
        ),
        ("a timestamp 301 s old", Some(SHOP.off_by(-301))),
        ("a timestamp 301 s ahead", Some(SHOP.off_by(301))),
        (
            "an unknown publisher",
            Some(Signer {
                source: "com.example.evil",
                ..SHOP
            }),
        ),
    ];
    for (what, signer) in cases {
        app.round_trips.take();
        for (method, target, body) in [
            (
                "POST",
                "/publisher/v1/notifications".to_string(),
                Some(&detail),
            ),
            ("POST", "/publisher/v1/cancels".to_string(), Some(&detail)),
            (
                "GET",
                format!("/publisher/v1/notifications/k-1?openid={}", user.openid),
                None,
            ),
        ] {
            let answer = app.publisher_call(method, &target, body, signer).await;
            assert_eq!(
                answer.status, 401,
                "{what}, {method} {target}: {}",
                answer.body
            );
            assert_eq!(answer.body["error"]["code"], "unsigned", "{what}");
        }
        assert_eq!(
            app.round_trips.take(),
            Vec::<String>::new(),
            "{what}: nothing read"
        );
        assert_eq!(app.items().await.len(), stored, "{what}: nothing stored");
    }
    // A body changed after signing: the signature covers the raw bytes.
    let timestamp = app.now().timestamp();
    let signed = SHOP.sign(timestamp, "POST", "/publisher/v1/notifications", b"{}");
    let tampered = app
        .http
        .post(format!("{}/publisher/v1/notifications", app.base_url))
        .header("x-onegrant-publisher", SHOP.source)
        .header("x-onegrant-timestamp", timestamp.to_string())
        .header("x-onegrant-signature", signed)
        .body(serde_json::to_vec(&detail).expect("JSON"))
        .send()
        .await
        .expect("reaches the API");
    assert_eq!(tampered.status().as_u16(), 401);
    assert_eq!(app.items().await.len(), stored);
    // Both keys of a publisher in rotation are good; 300 s of skew either way too.
    for signer in [
        SHOP.with_key("the-shop-key-before"),
        SHOP.off_by(-300),
        SHOP.off_by(300),
    ] {
        let answer = status(&app, signer, &user, "k-1").await;
        assert_eq!(answer.status, 404, "{signer:?}: signed, and nothing there");
    }
}

#[tokio::test]
async fn a_publisher_cannot_read_cancel_or_replace_another_publishers_notification() {
    let app = spawn_app_with(&[
        ("ONEGRANT_PUBLISHERS", TWO_PUBLISHERS),
        ("AUDIT_TRAIL", "false"),
    ])
    .await;
    let user = app.user("lanes").await;
    app.accept(&user, ORDER, "lane_1").await;
    app.accept(&user, ORDER, "lane_2").await;
    // News sends first, with a collapse key the shop will use too.
    let news = app
        .publish(
            &order(&user, "order-7:shipped", json!({"collapse_key": "order-7"})),
            NEWS,
        )
        .await;
    assert_eq!(news.status, 201, "{}", news.body);

    // The shop cannot read it, nor cancel it: its cancel marks the shop's own key.
    assert_eq!(
        status(&app, SHOP, &user, "order-7:shipped").await.status,
        404
    );
    let early = cancel(&app, SHOP, &user, "order-7:shipped").await;
    assert_eq!(early.body["status"], "early", "{}", early.body);
    let still = status(&app, NEWS, &user, "order-7:shipped").await;
    assert_eq!(
        still.body["notification"]["push"]["status"], "pending",
        "{}",
        still.body
    );
    // The shop's own event of that key and collapse key: its own (cancelled by its own
    // early cancel), and news's push is not replaced.
    let shop = app
        .publish(
            &order(&user, "order-7:shipped", json!({"collapse_key": "order-7"})),
            SHOP,
        )
        .await;
    assert_eq!(shop.status, 201, "{}", shop.body);
    assert_eq!(shop.body["push"], "cancelled", "{}", shop.body);
    let still = status(&app, NEWS, &user, "order-7:shipped").await;
    assert_eq!(
        still.body["notification"]["push"]["status"], "pending",
        "{}",
        still.body
    );

    // News cancels its own over HTTP: never sent, no grant spent.
    let cancelled = cancel(&app, NEWS, &user, "order-7:shipped").await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["status"], "cancelled", "{}", cancelled.body);
    app.ticks_until(|_| false).await;
    assert!(app.deliveries().await.is_empty(), "nothing sent");
    let after = status(&app, NEWS, &user, "order-7:shipped").await;
    assert_eq!(after.body["notification"]["push"]["status"], "cancelled");
    // Another user's openid with the key: nothing.
    let other = app.user("other").await;
    assert_eq!(
        status(&app, NEWS, &other, "order-7:shipped").await.status,
        404
    );
}

#[tokio::test]
async fn each_publishers_calls_are_limited_by_the_minute_apart_from_the_others() {
    let app = spawn_app_with(&[
        ("ONEGRANT_PUBLISHERS", TWO_PUBLISHERS),
        ("PUBLISHER_REQUESTS_PER_MINUTE", "3"),
    ])
    .await;
    app.freeze_at_a_minute_start();
    let user = app.user("limited").await;
    for _ in 0..3 {
        assert_eq!(status(&app, SHOP, &user, "k").await.status, 404);
    }
    let limited = status(&app, SHOP, &user, "k").await;
    assert_eq!(limited.status, 429, "{}", limited.body);
    assert!(limited.headers.contains_key("retry-after"));
    let stored = app.items().await.len();
    let refused = app.publish(&order(&user, "k", json!({})), SHOP).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        app.items().await.len(),
        stored,
        "nothing stored past the limit"
    );
    assert_eq!(
        status(&app, NEWS, &user, "k").await.status,
        404,
        "news has its own"
    );
    app.advance(std::time::Duration::from_secs(60));
    assert_eq!(
        status(&app, SHOP, &user, "k").await.status,
        404,
        "a new minute"
    );
}

/// The bus's envelope of `detail` from `source`, put by `account`.
fn event(source: &str, account: &str, detail: Value) -> Value {
    json!({"version": "0", "id": "e", "detail-type": "onegrant.notification", "source": source,
           "account": account, "time": "2026-11-30T06:00:00Z", "region": "us-east-1",
           "resources": [], "detail": detail})
}

#[tokio::test]
async fn a_bus_event_whose_account_is_not_paired_with_its_source_is_refused_and_stores_nothing() {
    let app = spawn_app_with(&[
        (
            "PUBLISHER_LANES",
            "com.example.shop=111111111111;222222222222",
        ),
        ("STACK_ACCOUNT", "999999999999"),
    ])
    .await;
    let user = app.user("bus").await;
    let stored = app.items().await.len();
    for (source, account) in [
        ("com.example.shop", "333333333333"),
        ("com.example.shop", "999999999999"),
        ("tests", "111111111111"),
        ("tests", ""),
    ] {
        let answer = app
            .invoke(
                "NotifyFunction",
                &event(source, account, order(&user, "b-1", json!({}))),
            )
            .await;
        assert_eq!(
            answer["status"], "refused",
            "{source} from {account:?}: {answer}"
        );
        assert_eq!(answer["reason"], "lane");
        assert_eq!(app.items().await.len(), stored, "{source} from {account:?}");
    }
    for (i, (source, account)) in [
        ("com.example.shop", "111111111111"),
        ("com.example.shop", "222222222222"),
        ("tests", "999999999999"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = app
            .invoke(
                "NotifyFunction",
                &event(source, account, order(&user, &format!("b-{i}"), json!({}))),
            )
            .await;
        assert_eq!(
            answer["status"], "created",
            "{source} from {account}: {answer}"
        );
    }
}

/// `text` percent-encoded as a client's strictest encoder does (every byte but
/// RFC 3986's unreserved characters).
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn a_key_of_any_characters_is_read_back_through_its_percent_encoded_path() {
    let app = spawn_app_with(&[]).await;
    let user = app.user("keys").await;
    for key in ["订单 1001:已发货", "a+b@c,d=e;f$g", "order-1001:shipped"] {
        let created = app.publish(&order(&user, key, json!({})), SHOP).await;
        assert_eq!(created.status, 201, "{key}: {}", created.body);
        let target = format!(
            "/publisher/v1/notifications/{}?openid={}",
            encoded(key),
            user.openid
        );
        let found = app.publisher_call("GET", &target, None, Some(SHOP)).await;
        assert_eq!(found.status, 200, "{key}: {}", found.body);
        assert_eq!(found.body["idempotency_key"], key);
        assert_eq!(found.body["notification"]["id"], created.body["note_id"]);
    }
}
