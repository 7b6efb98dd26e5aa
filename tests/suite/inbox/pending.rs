//! The cap on a user's open pushes from one publisher (issue 41 §9, `PUSHES_PENDING_MAX`):
//! past it an event's push is recorded `rejected` (`too_many_pending`) and its
//! notification stored all the same; pushes that finished, whatever their number, are
//! not counted; a push replacing an open one of its `collapse_key` is taken; other users
//! and other publishers are unaffected (issue 44: publishers kept apart).

use chrono::Duration;
use onegrant_tests::{ORDER, TestApp, User, assert_ledger_agrees_with_counters, spawn_app_with};
use serde_json::{Value, json};

use onegrant_tests::inbox::{at, scheduled};

/// Each of `user`'s notifications, by its event's key (the body names it): the push's
/// status and reason.
async fn pushes(
    app: &TestApp,
    user: &User,
) -> std::collections::BTreeMap<String, (String, Option<String>)> {
    let answer = app
        .get("/v1/notifications?limit=100", Some(&user.token))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|n| {
            (
                n["body"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_start_matches("预约 ")
                    .to_string(),
                (
                    n["push"]["status"].as_str().unwrap_or_default().to_string(),
                    n["push"]["reason"].as_str().map(str::to_string),
                ),
            )
        })
        .collect()
}

fn refused(answer: &Value) -> bool {
    answer["status"] == "created"
        && answer["push"] == "rejected"
        && answer["reason"] == "too_many_pending"
}

/// `PUSHES_PENDING_MAX=3`: a user with 12 pushes already sent (a long history, none
/// counted) and three open — one due now, one scheduled an hour ahead, one due now with
/// a `collapse_key` — has a fourth refused with a clear answer, its notification
/// listed; an event with no push, a push replacing the open one of its key, and another
/// user's push are all taken; once pushes finish (sent, cancelled), new ones are taken
/// again, up to the cap.
#[tokio::test]
async fn a_users_open_pushes_are_capped_at_ingest_and_the_notification_is_still_stored() {
    let app = spawn_app_with(&[
        ("PUSHES_PENDING_MAX", "3"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
    ])
    .await;
    let user = app.user("busy").await;
    // A long history: 12 pushes sent, each finished.
    for i in 0..12 {
        app.accept(&user, ORDER, &format!("old_{i}")).await;
        let answer = app
            .notify(scheduled(&user, &format!("old-{i}"), json!({})))
            .await;
        assert_eq!(answer["push"], "pending", "{answer}");
        if i % 3 == 2 {
            let summary = app.ticks_until(|s| s.sent >= 3).await;
            assert_eq!(summary.sent, 3, "{summary:?}");
        }
    }
    app.accept(&user, ORDER, "g_now").await;
    let later = app.now() + Duration::hours(1);
    for (key, extra) in [
        ("now", json!({})),
        ("later", json!({"send_at": at(later)})),
        ("keyed", json!({"collapse_key": "order-9"})),
    ] {
        let answer = app.notify(scheduled(&user, key, extra)).await;
        assert_eq!(answer["push"], "pending", "{key}: {answer}");
        assert!(answer.get("reason").is_none(), "{answer}");
    }

    // At the cap: refused with a clear answer, the notification stored.
    let answer = app.notify(scheduled(&user, "over", json!({}))).await;
    assert!(refused(&answer), "{answer}");
    let listed = pushes(&app, &user).await;
    assert_eq!(
        listed["over"],
        ("rejected".to_string(), Some("too_many_pending".to_string()))
    );
    assert!(
        app.item(
            &user,
            &format!("OUTBOX#{}", answer["note_id"].as_str().unwrap_or_default())
        )
        .await
        .is_none(),
        "no outbox item for a refused push"
    );
    // A push that would not be pending anyway (expired on arrival) is recorded as
    // such, not refused.
    let gone = app
        .notify(scheduled(
            &user,
            "gone",
            json!({"expires_at": at(app.now() - Duration::minutes(1))}),
        ))
        .await;
    assert_eq!(
        (gone["push"].as_str(), gone.get("reason")),
        (Some("expired"), None),
        "{gone}"
    );
    // The same event again: a duplicate, nothing changed.
    let again = app.notify(scheduled(&user, "over", json!({}))).await;
    assert_eq!(again["status"], "duplicate", "{again}");
    // No push asked: nothing to cap.
    let plain = app
        .notify(
            json!({"idempotency_key": "plain", "openid": user.openid, "type": "order",
                       "title": "t", "body": "预约 plain"}),
        )
        .await;
    assert_eq!(
        (plain["status"].as_str(), plain["push"].as_str()),
        (Some("created"), None),
        "{plain}"
    );
    // Replacing the open push of its key: the count does not grow, so it is taken.
    let replacing = app
        .notify(scheduled(
            &user,
            "keyed-2",
            json!({"collapse_key": "order-9"}),
        ))
        .await;
    assert_eq!(replacing["push"], "pending", "{replacing}");
    assert_eq!(pushes(&app, &user).await["keyed"].0, "replaced");
    // Another user is not affected.
    let other = app.user("calm").await;
    let theirs = app.notify(scheduled(&other, "theirs", json!({}))).await;
    assert_eq!(theirs["push"], "pending", "{theirs}");

    // One sent (the user's one grant), one cancelled: two places free, then full again.
    let summary = app.ticks_until(|s| s.sent + s.grant_waits >= 2).await;
    assert!(summary.sent >= 1, "{summary:?}");
    let cancelled = app.cancel(&user, "later").await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let listed = pushes(&app, &user).await;
    let open = listed
        .values()
        .filter(|(status, _)| status == "pending")
        .count();
    assert_eq!(open, 1, "one push waits for a grant: {listed:?}");
    for key in ["next-1", "next-2"] {
        let answer = app.notify(scheduled(&user, key, json!({}))).await;
        assert_eq!(answer["push"], "pending", "{key}: {answer}");
    }
    let answer = app.notify(scheduled(&user, "next-3", json!({}))).await;
    assert!(refused(&answer), "{answer}");
    assert_ledger_agrees_with_counters(&app).await;
}

/// One publisher at the cap for a user (`PUSHES_PENDING_MAX=2`) refuses only its own
/// next push: another publisher's pushes to the same user are taken up to their own
/// cap, and then refused in turn; the first publisher's refusal stays its own. Before,
/// the cap counted every publisher's pushes together, so one publisher could fill it
/// and have every other publisher's pushes to that user rejected.
#[tokio::test]
async fn one_publisher_at_the_cap_refuses_no_other_publishers_push() {
    let app = spawn_app_with(&[
        ("PUSHES_PENDING_MAX", "2"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
    ])
    .await;
    let user = app.user("shared").await;
    let shop = "com.example.shop";
    let as_shop = |key: &str| {
        app.notify_as(
            shop,
            "onegrant.notification",
            scheduled(&user, key, json!({})),
        )
    };
    // The tests' publisher fills its share: one due now, one scheduled.
    let later = app.now() + Duration::hours(1);
    for (key, extra) in [("a-1", json!({})), ("a-2", json!({"send_at": at(later)}))] {
        let answer = app.notify(scheduled(&user, key, extra)).await;
        assert_eq!(answer["push"], "pending", "{key}: {answer}");
    }
    let answer = app.notify(scheduled(&user, "a-3", json!({}))).await;
    assert!(refused(&answer), "{answer}");
    // The shop's pushes to the same user are its own: taken up to its cap.
    for key in ["b-1", "b-2"] {
        let answer = as_shop(key).await;
        assert_eq!(
            (answer["status"].as_str(), answer["push"].as_str()),
            (Some("created"), Some("pending")),
            "{key}: {answer}"
        );
    }
    let answer = as_shop("b-3").await;
    assert!(refused(&answer), "{answer}");
    // And still refused for the first publisher: its share did not grow.
    let answer = app.notify(scheduled(&user, "a-4", json!({}))).await;
    assert!(refused(&answer), "{answer}");
    let listed = pushes(&app, &user).await;
    let open: Vec<&str> = listed
        .iter()
        .filter(|(_, (status, _))| status == "pending")
        .map(|(key, _)| key.as_str())
        .collect();
    // (a-2 is listed once it is published, an hour on.)
    assert_eq!(open, ["a-1", "b-1", "b-2"], "{listed:?}");
    // A push that ends frees its publisher's share only.
    let cancelled = app.cancel(&user, "a-2").await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let answer = as_shop("b-4").await;
    assert!(refused(&answer), "{answer}");
    let answer = app.notify(scheduled(&user, "a-5", json!({}))).await;
    assert_eq!(answer["push"], "pending", "{answer}");
}

/// While the `pending` and `lane` indexes are not there (DynamoDB builds each after the
/// deploy that adds it, and refuses queries of it meanwhile), the cap admits and a
/// claim yields to no push, as before the indexes existed — neither fails: every ingest
/// and tick goes on (before, each query's refusal failed the ingest and the claim).
#[tokio::test]
async fn without_the_pending_index_the_cap_admits_and_a_claim_yields_to_none() {
    use aws_sdk_dynamodb::types::{DeleteGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate};
    let app = spawn_app_with(&[
        ("PUSHES_PENDING_MAX", "1"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "0"),
    ])
    .await;
    for index in ["pending", "lane"] {
        let drop_index = DeleteGlobalSecondaryIndexAction::builder()
            .index_name(index)
            .build()
            .expect("an index name");
        app.table
            .client
            .update_table()
            .table_name(&app.table.name)
            .global_secondary_index_updates(
                GlobalSecondaryIndexUpdate::builder()
                    .delete(drop_index)
                    .build(),
            )
            .send()
            .await
            .expect("the index is dropped");
    }
    let user = app.user("early").await;
    app.accept(&user, ORDER, "g_one").await;
    // Past the cap of one, and a low push that would yield to the normal one due with
    // it: nothing is read off the index, so neither is refused nor waits.
    for (key, extra) in [("first", json!({"priority": "low"})), ("second", json!({}))] {
        let answer = app.notify(scheduled(&user, key, extra)).await;
        assert_eq!(
            (answer["status"].as_str(), answer["push"].as_str()),
            (Some("created"), Some("pending")),
            "{key}: {answer}"
        );
    }
    let summary = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!(summary.sent, 1, "the one grant is spent: {summary:?}");
    let listed = pushes(&app, &user).await;
    let sent = listed
        .values()
        .filter(|(status, _)| status == "sent")
        .count();
    let open = listed
        .values()
        .filter(|(status, _)| status == "pending")
        .count();
    assert_eq!((sent, open), (1, 1), "{listed:?}");
    assert_ledger_agrees_with_counters(&app).await;
}
