//! Priority among pushes due together (issue 41 §15): a `normal` or `low` push about to
//! take one of the user's grants yields to better pushes of its template due within a
//! minute (read from the `pending` index), whichever is claimed first; one that yielded
//! is sent when the better ones do not take the grants after all (the template's wake
//! entry, due a minute later), and waits on when they did.

use std::time::Duration;

use onegrant_tests::{ORDER, User, assert_ledger_agrees_with_counters, spawn_app_with};
use serde_json::{Value, json};

use onegrant_tests::inbox::at;
use onegrant_tests::inbox::put_preferences as put;
use onegrant_tests::inbox::{push_statuses as pushes, sent, waiting};

/// An order notification of `kind` for `user` whose push has `priority`, with `extra`
/// fields merged in (its idempotency key the user's and `key`).
fn event(user: &User, key: &str, priority: &str, kind: &str, extra: Value) -> Value {
    let mut detail = json!({"idempotency_key": format!("{}-{key}", user.openid), "openid": user.openid, "type": kind,
        "title": "订单已发货", "body": format!("订单 {key} 已发货"), "priority": priority,
        "wechat": {"template_id": ORDER,
            "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}});
    for (k, v) in extra.as_object().expect("object") {
        detail[k] = v.clone();
    }
    detail
}

/// The case, in every order of publication: a user holding one grant has a
/// low, a normal and a high push due when the tick runs → the high one is sent, the
/// others wait (and a minute later, the wake finding no grant, still wait). With two
/// grants, the high and the normal one are sent.
#[tokio::test]
async fn pushes_due_together_go_by_priority_whichever_is_claimed_first() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let orders = [
        ["low", "normal", "high"],
        ["high", "normal", "low"],
        ["normal", "low", "high"],
    ];
    for (round, order) in orders.iter().enumerate() {
        for grants in [1usize, 2] {
            let user = app.user(&format!("u{round}-{grants}")).await;
            for g in 0..grants {
                app.accept(&user, ORDER, &format!("g_{round}_{grants}_{g}"))
                    .await;
            }
            for priority in order {
                let answer = app
                    .notify(event(&user, priority, priority, "order", json!({})))
                    .await;
                assert_eq!(answer["push"], "pending", "{answer}");
            }
            let summary = app.ticks_until(|s| s.sent as usize >= grants).await;
            assert_eq!(summary.sent as usize, grants, "{order:?}: {summary:?}");
            let expected = if grants == 1 {
                vec![sent("high"), waiting("low"), waiting("normal")]
            } else {
                vec![sent("high"), waiting("low"), sent("normal")]
            };
            assert_eq!(
                pushes(&app, &user).await,
                expected,
                "{order:?}, {grants} grants"
            );
            // A minute on, the wake entry finds no grant: nothing more goes out.
            app.advance(Duration::from_secs(61));
            let later = app.tick(30).await;
            assert_eq!(later.sent, 0, "{order:?}: {later:?}");
            assert_eq!(pushes(&app, &user).await, expected, "{order:?}: {later:?}");
        }
    }
    assert_eq!(app.deliveries().await.len(), 3 * 3, "one send per grant");
    assert_ledger_agrees_with_counters(&app).await;
}

/// A low push due now yields its grant to a high one scheduled 30 s later (due
/// together, within the minute); the high one is then cancelled before its instant, so
/// it never takes the grant; a minute after the yield the template's wake entry gives
/// the grant to the low one, which is sent. A better push of a muted type is never
/// yielded to (it would never take the grant): the low push goes at once.
#[tokio::test]
async fn a_push_that_yielded_is_sent_when_the_better_one_does_not_take_the_grant() {
    let app = spawn_app_with(&[("DISPATCH_LOOKAHEAD_SECONDS", "0")]).await;
    let user = app.user("carol").await;
    app.accept(&user, ORDER, "g_carol").await;
    let soon = app.now() + chrono::Duration::seconds(30);
    app.notify(event(
        &user,
        "urgent",
        "high",
        "order",
        json!({"send_at": at(soon)}),
    ))
    .await;
    app.notify(event(&user, "later", "low", "order", json!({})))
        .await;

    let first = app.tick(30).await;
    assert_eq!(
        (first.sent, first.grant_waits),
        (0, 1),
        "the low one yields: {first:?}"
    );
    let cancelled = app.cancel(&user, &format!("{}-urgent", user.openid)).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    app.move_to(soon + chrono::Duration::seconds(1));
    let second = app.tick(30).await;
    assert_eq!(second.sent, 0, "the wake is not due yet: {second:?}");
    let ended = ("urgent".to_string(), "cancelled".to_string(), None);
    assert_eq!(
        pushes(&app, &user).await,
        vec![waiting("later"), ended.clone()]
    );
    // The yield's wake entry comes due a minute after it.
    app.advance(Duration::from_secs(61));
    let third = app.ticks_until(|s| s.sent >= 1).await;
    assert_eq!((third.sent, third.woken), (1, 1), "{third:?}");
    assert_eq!(pushes(&app, &user).await, vec![sent("later"), ended]);

    // A muted better push is no reason to wait.
    let (status, body) = put(
        &app,
        &user,
        &json!({"quiet_hours": null, "muted_types": ["alert"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    app.accept(&user, ORDER, "g_carol_2").await;
    app.notify(event(
        &user,
        "muted",
        "high",
        "alert",
        json!({"send_at": at(app.now() + chrono::Duration::seconds(30))}),
    ))
    .await;
    app.notify(event(&user, "next", "low", "order", json!({})))
        .await;
    let fourth = app.tick(30).await;
    assert_eq!((fourth.sent, fourth.grant_waits), (1, 0), "{fourth:?}");
    assert_eq!(app.deliveries().await.len(), 2);
    assert_ledger_agrees_with_counters(&app).await;
}
