//! Events a hostile or careless publisher could put on the bus: each is refused, or
//! stored cleaned with its push rejected by a stable code, and nothing over a cap is
//! ever stored.

use onegrant::domain::inbox::{MAX_BODY_CHARS, MAX_TITLE_CHARS};
use onegrant::domain::text::is_unwanted;
use onegrant_tests::{LogCapture, User, attr_s, spawn_app};
use serde_json::{Value, json};

const ORDER: &str = "tmpl_order_status";
const WATER: &str = "tmpl_water_reminder";

fn detail(user: &User, key: &str) -> Value {
    json!({"idempotency_key": key, "openid": user.openid, "type": "order",
           "title": "订单已发货", "body": "您的订单已发货"})
}

fn with_push(mut d: Value, template: &str, data: Value) -> Value {
    d["wechat"] = json!({"template_id": template, "data": data});
    d
}

fn order_data() -> Value {
    json!({"character_string1": "ORDER-1", "phrase2": "已发货", "thing3": "顺丰"})
}

/// (case, source, detail-type, detail, expected answer status, expected push reason)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Value,
    &'static str,
    Option<&'static str>,
);

#[tokio::test]
async fn hostile_events_are_refused_or_stored_cleaned_and_nothing_over_a_cap_is_stored() {
    let app = spawn_app().await;
    let alice = app.user("alice").await;
    let bob = app.user("bob").await;
    let long = |n: usize| "长".repeat(n);

    let mut cases: Vec<Case> = vec![
        (
            "foreign source",
            "evil.corp",
            "onegrant.notification",
            detail(&alice, "k1"),
            "refused",
            None,
        ),
        (
            "foreign detail-type",
            "tests",
            "other.thing",
            detail(&alice, "k2"),
            "refused",
            None,
        ),
        (
            "source with '#'",
            "tests#x",
            "onegrant.notification",
            detail(&alice, "k3"),
            "refused",
            None,
        ),
    ];
    let mut oversized = detail(&alice, "k4");
    oversized["padding"] = json!("x".repeat(20 * 1024));
    cases.push((
        "oversized detail",
        "tests",
        "onegrant.notification",
        oversized,
        "invalid",
        None,
    ));
    for (field, value) in [
        ("title", json!(long(MAX_TITLE_CHARS + 1))),
        ("body", json!(long(MAX_BODY_CHARS + 1))),
        ("page", json!("p".repeat(257))),
        ("idempotency_key", json!("k".repeat(129))),
        ("type", json!("t".repeat(33))),
        ("title", json!("\u{200B}\u{202E}\u{2028}")),
        ("title", json!(42)),
    ] {
        let mut d = detail(&alice, "k5");
        d[field] = value;
        cases.push((
            "field over its cap or empty",
            "tests",
            "onegrant.notification",
            d,
            "invalid",
            None,
        ));
    }
    let mut long_page = with_push(detail(&alice, "p1"), ORDER, order_data());
    long_page["wechat"]["page"] = json!("pages/x?".to_string() + &"a".repeat(300));
    cases.push((
        "wechat.page over its cap",
        "tests",
        "onegrant.notification",
        long_page,
        "created",
        Some("page_invalid"),
    ));
    let mut long_value = order_data();
    long_value["thing3"] = json!(long(201));
    cases.push((
        "keyword value over its cap",
        "tests",
        "onegrant.notification",
        with_push(detail(&alice, "p2"), ORDER, long_value),
        "created",
        Some("keyword_invalid"),
    ));
    for (i, time) in ["明天下午", "25:61", "2026-13-01 08:00", "08:00~"]
        .into_iter()
        .enumerate()
    {
        cases.push((
            "bad time format",
            "tests",
            "onegrant.notification",
            with_push(
                detail(&alice, &format!("t{i}")),
                WATER,
                json!({"thing1": "喝水", "time2": time, "number3": "1"}),
            ),
            "created",
            Some("keyword_invalid"),
        ));
    }
    let many: serde_json::Map<String, Value> =
        (0..21).map(|i| (format!("thing{i}"), json!("x"))).collect();
    cases.push((
        "too many keywords",
        "tests",
        "onegrant.notification",
        with_push(detail(&alice, "p3"), ORDER, Value::Object(many)),
        "created",
        Some("data_invalid"),
    ));

    let (logs, _guard) = LogCapture::start("info");
    for (case, source, detail_type, d, status, reason) in &cases {
        let logged = logs.text().len();
        let answer = app.notify_as(source, detail_type, d.clone()).await;
        assert_eq!(answer["status"], *status, "{case}: {answer}");
        // Each refusal and each rejected push is logged with its reason.
        let new_lines = logs.text()[logged..].to_string();
        let why = match *status {
            "refused" => "refused",
            "invalid" => "notify event refused",
            _ => "push rejected before sending",
        };
        assert!(
            new_lines.contains(why) && new_lines.contains("\"reason\""),
            "{case}: logged {new_lines}"
        );
        if let Some(reason) = reason {
            assert_eq!(answer["push"], "rejected", "{case}: {answer}");
            let notes = app.items_of(&alice, "note").await;
            let newest = notes
                .iter()
                .max_by_key(|n| attr_s(n, "sk").map(str::to_string))
                .expect("the notification is stored");
            assert_eq!(attr_s(newest, "push_reason"), Some(*reason), "{case}");
        }
    }
    let stored = |case: &str| {
        cases
            .iter()
            .filter(|c| c.4 == "created" && c.0 != case)
            .count()
    };
    assert_eq!(
        app.items_of(&alice, "note").await.len(),
        stored(""),
        "refused events store nothing"
    );
    assert!(
        app.items_of(&alice, "outbox").await.is_empty(),
        "no rejected push is queued"
    );

    // Hidden and reordering characters are removed from what a user reads.
    let mut sneaky = detail(&alice, "clean");
    sneaky["title"] = json!("退款\u{202E}成功\u{200B}\u{FEFF}");
    sneaky["body"] = json!("第一行\u{2028}仍是\u{2066}第一行\n第二行\u{7}");
    sneaky = with_push(
        sneaky,
        ORDER,
        json!({"character_string1": "ORDER-1", "phrase2": "已\u{200D}发货", "thing3": "顺\u{202E}丰"}),
    );
    let answer = app.notify(sneaky).await;
    assert_eq!(answer["status"], "created", "{answer}");
    assert_eq!(answer["push"], "pending", "{answer}");
    let notes = app.items_of(&alice, "note").await;
    let note = notes
        .iter()
        .find(|n| attr_s(n, "title") == Some("退款成功"))
        .expect("the cleaned title is stored");
    assert_eq!(attr_s(note, "body"), Some("第一行仍是第一行\n第二行"));
    let outbox = app.items_of(&alice, "outbox").await;
    let data = format!("{:?}", outbox[0].get("data"));
    assert!(data.contains("已发货") && data.contains("顺丰"), "{data}");

    // The same key from the same publisher for another user is a conflict, not a
    // second event; from another publisher it is another event.
    let first = app.notify(detail(&alice, "shared-key")).await;
    assert_eq!(first["status"], "created");
    let again = app.notify(detail(&bob, "shared-key")).await;
    assert_eq!(again["status"], "conflict", "{again}");
    assert!(
        app.items_of(&bob, "note").await.is_empty(),
        "nothing stored for bob"
    );
    let other = app
        .notify_as(
            "com.example.shop",
            "onegrant.notification",
            detail(&bob, "shared-key"),
        )
        .await;
    assert_eq!(other["status"], "created", "{other}");

    // Nothing over a cap, and nothing invisible, in any stored item.
    for item in app.items().await {
        for (name, max) in [
            ("title", MAX_TITLE_CHARS),
            ("body", MAX_BODY_CHARS),
            ("page", 256),
        ] {
            if let Some(text) = attr_s(&item, name) {
                assert!(text.chars().count() <= max, "{name} over its cap");
                assert!(
                    !text.chars().any(|c| c != '\n' && is_unwanted(c)),
                    "{name} carries an invisible character: {text:?}"
                );
            }
        }
        if attr_s(&item, "kind") == Some("event") {
            let fingerprint = attr_s(&item, "fingerprint").unwrap_or_default();
            assert!(
                fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()),
                "the fingerprint is a hash, not the payload"
            );
        }
    }
}

#[tokio::test]
async fn an_event_recorded_before_keys_were_scoped_per_publisher_is_still_a_duplicate() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let app = spawn_app().await;
    let alice = app.user("alice").await;
    let d = detail(&alice, "order-9:shipped");
    // The record an earlier version kept: in the user's partition, its fingerprint the
    // canonical text of the event itself.
    let canonical = json!({"openid": alice.openid, "type": "order", "title": "订单已发货",
                           "body": "您的订单已发货", "page": null, "wechat": null})
    .to_string();
    let item = [
        ("pk", format!("USER#{}", alice.openid)),
        ("sk", "EVENT#order-9:shipped".to_string()),
        ("kind", "event".to_string()),
        ("fingerprint", canonical),
        ("note_id", "1764547200000abcdefabcdef".to_string()),
    ];
    let mut put = app.table.client.put_item().table_name(&app.table.name);
    for (name, value) in item {
        put = put.item(name, AttributeValue::S(value));
    }
    put = put.item("expires_at", AttributeValue::N("4102444800".into()));
    put.send().await.expect("put");

    let again = app.notify(d.clone()).await;
    assert_eq!(again["status"], "duplicate", "{again}");
    assert!(
        app.items_of(&alice, "note").await.is_empty(),
        "no second notification"
    );
    let mut changed = d;
    changed["title"] = json!("订单已签收");
    let conflict = app.notify(changed).await;
    assert_eq!(conflict["status"], "conflict", "{conflict}");
    assert!(app.items_of(&alice, "note").await.is_empty());
}
