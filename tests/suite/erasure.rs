//! Forgetting a user (`DELETE /v1/me`, WeChat's authorisation events): once the
//! erasure is done, no item in the whole table contains the openid, nothing of theirs
//! goes out, tokens from before it are refused, nothing sent for them is stored, and a
//! new sign-in starts an empty account.

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Duration;
use onegrant_tests::{ORDER, TestApp, User, WATER, attr_s, spawn_app};
use serde_json::{Value, json};

use onegrant_tests::inbox::{at, scheduled};
use onegrant_tests::wechat_push::{crypto, hit, now, sealed};

/// Whether any attribute of `value`, at any depth, contains `needle`.
fn contains(value: &AttributeValue, needle: &str) -> bool {
    match value {
        AttributeValue::S(s) | AttributeValue::N(s) => s.contains(needle),
        AttributeValue::Ss(list) | AttributeValue::Ns(list) => {
            list.iter().any(|s| s.contains(needle))
        }
        AttributeValue::L(list) => list.iter().any(|v| contains(v, needle)),
        AttributeValue::M(map) => map
            .iter()
            .any(|(k, v)| k.contains(needle) || contains(v, needle)),
        AttributeValue::B(bytes) => String::from_utf8_lossy(bytes.as_ref()).contains(needle),
        _ => false,
    }
}

/// Every item of the whole table that contains `openid` anywhere.
async fn naming(
    app: &TestApp,
    openid: &str,
) -> Vec<std::collections::HashMap<String, AttributeValue>> {
    app.items()
        .await
        .into_iter()
        .filter(|item| {
            item.iter()
                .any(|(k, v)| k.contains(openid) || contains(v, openid))
        })
        .collect()
}

async fn tombstones(app: &TestApp) -> Vec<std::collections::HashMap<String, AttributeValue>> {
    app.items()
        .await
        .into_iter()
        .filter(|i| attr_s(i, "kind") == Some("tombstone"))
        .collect()
}

/// A user with something of every kind: grants of two templates, an enabled plan, a
/// check-in, notifications (one with a push waiting, one scheduled ahead) and
/// preferences.
async fn busy_user(app: &TestApp, name: &str) -> User {
    let user = app.scheduled_user(name, 2).await;
    app.accept(&user, ORDER, &format!("wr_{name}_order")).await;
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": user.openid, "template_id": WATER, "count": 1})),
    )
    .await;
    let checkin = app
        .post(
            "/v1/reminders/water/checkins",
            Some(&user.token),
            &json!({"action_id": format!("wc_{name}"), "grant_request_id": format!("wr_{name}_c"),
                    "subscription_status": "accept", "occurred_at": app.now().to_rfc3339(),
                    "current_count": 1, "daily_goal": 8}),
        )
        .await;
    assert_eq!(checkin.status, 200, "{}", checkin.body);
    let now = app
        .notify(scheduled(&user, &format!("{name}-now"), json!({})))
        .await;
    assert_eq!(now["status"], "created", "{now}");
    let later = app.now() + Duration::hours(1);
    let ahead = app
        .notify(scheduled(
            &user,
            &format!("{name}-later"),
            json!({"send_at": at(later)}),
        ))
        .await;
    assert_eq!(ahead["status"], "created", "{ahead}");
    let prefs = app
        .call(
            "PUT",
            "/v1/preferences",
            Some(&user.token),
            Some(br#"{"quiet_hours": null, "muted_types": ["marketing"]}"#.to_vec()),
        )
        .await;
    assert_eq!(prefs.status, 200, "{}", prefs.body);
    assert!(!naming(app, &user.openid).await.is_empty());
    user
}

async fn erase(app: &TestApp, token: &str) -> Value {
    let answer = app.call("DELETE", "/v1/me", Some(token), None).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    answer.body
}

#[tokio::test]
async fn a_user_who_asks_is_forgotten_and_nothing_of_theirs_comes_back() {
    let app = spawn_app().await;
    app.move_to_china_midday();
    let alice = busy_user(&app, "alice").await;
    let bob = busy_user(&app, "bob").await;
    let bobs_items = naming(&app, &bob.openid).await.len();

    // Begun: the first step at once; done only once the partition has stayed empty
    // past any write admitted before it (two minutes).
    assert_eq!(
        erase(&app, &alice.token).await,
        json!({"erasure": "pending"})
    );
    // Asked again with the same token: the same erasure.
    assert_eq!(
        erase(&app, &alice.token).await,
        json!({"erasure": "pending"})
    );
    assert_eq!(tombstones(&app).await.len(), 1);

    // From now on her old token opens nothing, and changes nothing.
    for path in [
        "/v1/notifications",
        "/v1/grants",
        "/v1/preferences",
        "/v1/reminders/water",
    ] {
        assert_eq!(
            app.get(path, Some(&alice.token)).await.status,
            401,
            "{path}"
        );
    }
    let replay = app
        .post(
            "/v1/grants",
            Some(&alice.token),
            &json!({"request_id": "wr_alice_order", "results": {ORDER: "accept"}}),
        )
        .await;
    assert_eq!(replay.status, 401, "{}", replay.body);
    // A publisher's event for her stores nothing; nor one it sent before, sent again
    // (its record, outside her partition, must not answer `duplicate`).
    let event = app
        .notify(scheduled(&alice, "alice-after", json!({})))
        .await;
    assert_eq!(event, json!({"status": "erased"}));
    let again = app.notify(scheduled(&alice, "alice-now", json!({}))).await;
    assert_eq!(again, json!({"status": "erased"}));

    // The dispatcher carries it on to the end; her scheduled push never goes out.
    app.tick(30).await;
    assert!(tombstones(&app).await[0].contains_key("empty_since"));
    app.advance(std::time::Duration::from_secs(121));
    let ticks = app.ticks_until(|s| s.erasures_done >= 1).await;
    assert_eq!(ticks.erasures_done, 1, "{ticks:?}");
    assert_eq!(erase(&app, &alice.token).await, json!({"erasure": "done"}));
    let left = naming(&app, &alice.openid).await;
    assert!(left.is_empty(), "items still naming her: {left:?}");
    let tombstone = tombstones(&app).await;
    assert_eq!(attr_s(&tombstone[0], "state"), Some("done"));
    assert_eq!(attr_s(&tombstone[0], "cause"), Some("request"));
    // (His push went out meanwhile: a delivery more.)
    assert!(
        naming(&app, &bob.openid).await.len() >= bobs_items,
        "bob untouched"
    );
    assert!(app.item(&bob, "PLAN#water").await.is_some());
    app.advance(std::time::Duration::from_secs(2 * 3600));
    app.ticks_until(|_| false).await;
    let to_her = app
        .deliveries()
        .await
        .into_iter()
        .filter(|d| d.to_string().contains(&alice.openid))
        .count();
    assert_eq!(to_her, 0, "nothing reached WeChat for her");
    assert!(naming(&app, &alice.openid).await.is_empty());

    // Signed in again: an empty account, and her data is stored again.
    let again = app.user("alice").await;
    assert_eq!(again.openid, alice.openid);
    let notes = app.get("/v1/notifications", Some(&again.token)).await;
    assert_eq!(notes.status, 200, "{}", notes.body);
    assert_eq!(notes.body["items"], json!([]));
    let grants = app.get("/v1/grants", Some(&again.token)).await;
    assert_eq!(grants.status, 200, "{}", grants.body);
    assert!(
        !grants.body.to_string().contains("\"accepted\":1"),
        "no grant of before: {}",
        grants.body
    );
    assert_eq!(
        app.get("/v1/notifications", Some(&alice.token))
            .await
            .status,
        401
    );
    let event = app.notify(scheduled(&alice, "alice-back", json!({}))).await;
    assert_eq!(event["status"], "created", "{event}");
}

#[tokio::test]
async fn wechat_saying_the_user_closed_their_account_forgets_them() {
    // (On the real clock: WeChat's timestamps are checked against it.)
    let app = onegrant_tests::wechat_push::safe_json_app().await;
    let user = busy_user(&app, "carol").await;
    let c = crypto();
    let event = json!({"ToUserName": "gh_123456789abc", "FromUserName": "o_wechat_platform",
        "CreateTime": now(), "MsgType": "event", "Event": "user_authorization_cancellation",
        " OpenID": user.openid, "AppID": onegrant_local::stack::LOCAL_APPID, "RevokeInfo": "1"})
    .to_string();
    let ts = now();
    let (query, body) = sealed(&c, &c, &event, &ts, "e1");
    assert_eq!(
        hit(&app, "POST", &query, Some(body)).await,
        (200, "success".into())
    );
    // WeChat's retry (a new nonce) begins nothing more.
    let (retry, retry_body) = sealed(&c, &c, &event, &ts, "e2");
    assert_eq!(hit(&app, "POST", &retry, Some(retry_body)).await.0, 200);
    let tombstone = tombstones(&app).await;
    assert_eq!(tombstone.len(), 1);
    assert_eq!(attr_s(&tombstone[0], "cause"), Some("account_closed"));
    assert_eq!(
        app.get("/v1/notifications", Some(&user.token)).await.status,
        401
    );

    // The first tick deletes everything — her push, due now, is claimed by no lane: a
    // claim loses to the erasure begun — and it is done once it stayed empty for two
    // minutes.
    let first = app.tick(30).await;
    let to_her = app
        .deliveries()
        .await
        .into_iter()
        .filter(|d| d.to_string().contains(&user.openid))
        .count();
    assert_eq!(to_her, 0, "nothing sent once the erasure began: {first:?}");
    assert_eq!(
        (first.erasure_steps, first.erasures_done),
        (1, 0),
        "{first:?}"
    );
    app.advance(std::time::Duration::from_secs(121));
    let ticks = app.ticks_until(|s| s.erasures_done >= 1).await;
    assert_eq!(ticks.erasures_done, 1, "{ticks:?}");
    let left = naming(&app, &user.openid).await;
    assert!(left.is_empty(), "items still naming her: {left:?}");
    // Her later events are not recorded.
    let popup = json!({"ToUserName": "gh_123456789abc", "FromUserName": user.openid,
        "CreateTime": now(), "MsgType": "event", "Event": "subscribe_msg_popup_event",
        "List": [{"TemplateId": WATER, "SubscribeStatusString": "accept", "PopupScene": "0"}]})
    .to_string();
    let (query, body) = sealed(&c, &c, &popup, &now(), "e3");
    assert_eq!(hit(&app, "POST", &query, Some(body)).await.0, 200);
    assert!(naming(&app, &user.openid).await.is_empty());

    // She comes back; her old token (still within its lifetime) cannot begin another
    // erasure of the new account.
    let again = app.user("carol").await;
    assert_eq!(
        app.get("/v1/notifications", Some(&again.token))
            .await
            .status,
        200
    );
    assert_eq!(erase(&app, &user.token).await, json!({"erasure": "done"}));
    let tombstone = tombstones(&app).await;
    assert_eq!(attr_s(&tombstone[0], "state"), Some("done"));
    assert_eq!(
        tombstone[0].get("reopened"),
        Some(&AttributeValue::Bool(true))
    );
    assert_eq!(
        app.get("/v1/notifications", Some(&again.token))
            .await
            .status,
        200
    );

    // Her tombstone's state, as stored.
    let state = || async {
        let tombstone = tombstones(&app).await;
        attr_s(&tombstone[0], "state").map(str::to_string)
    };
    // The push that forgot her, replayed with its spent nonce, begins nothing.
    let (query, body) = sealed(&c, &c, &event, &ts, "e1");
    assert_eq!(hit(&app, "POST", &query, Some(body)).await.0, 200);
    assert_eq!(state().await.as_deref(), Some("done"));
    // She closes her account again. WeChat's first attempt spent its nonce and then
    // failed (no answer); its retry, with that nonce, forgets her again.
    let closed = json!({"ToUserName": "gh_123456789abc", "FromUserName": "o_wechat_platform",
        "CreateTime": app.now().timestamp(), "MsgType": "event",
        "Event": "user_authorization_cancellation", " OpenID": user.openid,
        "AppID": onegrant_local::stack::LOCAL_APPID, "RevokeInfo": "1"})
    .to_string();
    let ts = now();
    let spent = app.deps.store.record_nonce(&ts, "e5", app.now()).await;
    assert!(spent.expect("nonce recorded"), "its first attempt");
    let (retry, retry_body) = sealed(&c, &c, &closed, &ts, "e5");
    assert_eq!(hit(&app, "POST", &retry, Some(retry_body)).await.0, 200);
    assert_eq!(state().await.as_deref(), Some("pending"));
    assert_eq!(
        app.get("/v1/notifications", Some(&again.token))
            .await
            .status,
        401
    );
}

#[tokio::test]
async fn an_erasure_without_a_token_or_with_a_bad_one_changes_nothing() {
    let app = spawn_app().await;
    let user = app.user("dave").await;
    let before = app.items().await.len();
    for token in [None, Some("not-a-token"), Some("Bearer x.y.z")] {
        let answer = app.call("DELETE", "/v1/me", token, None).await;
        assert_eq!(answer.status, 401, "{token:?}: {}", answer.body);
    }
    assert_eq!(app.items().await.len(), before, "nothing stored");
    assert!(tombstones(&app).await.is_empty());
    assert_eq!(
        app.get("/v1/notifications", Some(&user.token)).await.status,
        200
    );
}

#[tokio::test]
async fn a_long_history_is_erased_in_bounded_steps_across_ticks() {
    const ITEMS: usize = 1_234;
    const STEP: u64 = 500;
    let app = spawn_app().await;
    let user = app.user("hana").await;
    // A long inbox, written straight to the table.
    app.put_notes(&user, ITEMS).await;
    assert_eq!(naming(&app, &user.openid).await.len(), ITEMS);
    app.round_trips.take_items_read();

    // The request's own step: at most a step's items read and deleted.
    assert_eq!(
        erase(&app, &user.token).await,
        json!({"erasure": "pending"})
    );
    let read = app.round_trips.take_items_read();
    assert!(read <= STEP + 5, "the first step read {read} items");
    // (The pending tombstone names the user too, for its steps, until it is done.)
    let pk = format!("USER#{}", user.openid);
    let left = naming(&app, &user.openid)
        .await
        .iter()
        .filter(|i| attr_s(i, "pk") == Some(pk.as_str()))
        .count();
    assert_eq!(left as u64, ITEMS as u64 - STEP, "one step's worth deleted");

    // The rest, bounded steps, however long the history; then one that finds the
    // partition stayed empty.
    app.round_trips.take_items_read();
    let mut steps = 0;
    let mut done = 0;
    for round in 0..12 {
        if round > 0 && steps > 0 && done == 0 {
            app.advance(std::time::Duration::from_secs(121));
        }
        let tick = app.tick(30).await;
        let read = app.round_trips.take_items_read();
        let bound = u64::from(tick.erasure_steps) * (STEP + 5) + 20;
        assert!(
            read <= bound,
            "a tick of {} steps read {read} items",
            tick.erasure_steps
        );
        steps += tick.erasure_steps;
        done += tick.erasures_done;
        if done == 1 {
            break;
        }
    }
    assert_eq!(done, 1);
    assert_eq!(
        steps, 3,
        "two steps that delete 734 items, one that finds it stayed empty"
    );
    assert!(naming(&app, &user.openid).await.is_empty());
    let tombstone = tombstones(&app).await;
    assert_eq!(attr_s(&tombstone[0], "state"), Some("done"));
    assert_eq!(
        onegrant_tests::attr_n(&tombstone[0], "deleted"),
        Some(ITEMS as i64),
        "every item counted"
    );
}

#[tokio::test]
async fn a_user_gets_a_copy_of_their_data_a_bounded_page_at_a_time() {
    let app = spawn_app().await;
    app.move_to_china_midday();
    let user = busy_user(&app, "ivy").await;
    let pk = format!("USER#{}", user.openid);
    app.put_notes(&user, 230).await;
    let stored: std::collections::BTreeSet<String> = app
        .items()
        .await
        .iter()
        .filter(|i| attr_s(i, "pk") == Some(pk.as_str()))
        .filter_map(|i| attr_s(i, "sk").map(str::to_string))
        .collect();

    let mut copy: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/v1/me/export".to_string(),
            Some(c) => format!("/v1/me/export?cursor={c}"),
        };
        app.round_trips.take_items_read();
        let answer = app.get(&path, Some(&user.token)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let read = app.round_trips.take_items_read();
        let items = answer.body["items"].as_array().cloned().unwrap_or_default();
        assert!(
            items.len() <= 100 && read <= 101,
            "a page of {} read {read}",
            items.len()
        );
        copy.extend(items);
        pages += 1;
        match answer.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
        assert!(pages < 10, "the export ends");
    }
    assert!(pages >= 3, "{pages} pages");
    let exported: std::collections::BTreeSet<String> = copy
        .iter()
        .filter_map(|i| i["sk"].as_str().map(str::to_string))
        .collect();
    assert!(
        stored.is_subset(&exported),
        "every item of hers is in the copy"
    );
    let kinds: std::collections::BTreeSet<&str> =
        copy.iter().filter_map(|i| i["kind"].as_str()).collect();
    for kind in [
        "quota",
        "grant",
        "plan",
        "action",
        "note",
        "outbox",
        "scheduled",
        "preferences",
        "history",
    ] {
        assert!(kinds.contains(kind), "{kind} in {kinds:?}");
    }
    for item in &copy {
        for plumbing in [
            "pk",
            "due_pk",
            "lease_pk",
            "pending_pk",
            "pending_sk",
            "lane_pk",
        ] {
            assert!(item.get(plumbing).is_none(), "{plumbing} in {item}");
        }
    }

    // Bad cursors: refused, nothing read or counted.
    for bad in [
        "abc",
        "x1.!!",
        "n1.1700000000000aaaaaaaaaaaa",
        "x1.",
        "x1.a",
    ] {
        app.round_trips.take();
        let answer = app
            .get(&format!("/v1/me/export?cursor={bad}"), Some(&user.token))
            .await;
        assert_eq!(
            (answer.status, answer.body["error"]["code"].as_str()),
            (400, Some("invalid_query")),
            "{bad}: {}",
            answer.body
        );
        assert_eq!(app.round_trips.take(), Vec::<String>::new(), "{bad}");
    }
    assert_eq!(app.get("/v1/me/export", None).await.status, 401);
}

#[tokio::test]
async fn a_user_who_stops_using_the_mini_program_is_forgotten_after_the_configured_days() {
    let app = onegrant_tests::spawn_app_with(&[("INACTIVE_USER_DAYS", "30")]).await;
    app.move_to_china_midday();
    let una = busy_user(&app, "una").await;
    let bob = busy_user(&app, "bob").await;
    let activity = app
        .item(&una, "ACTIVE")
        .await
        .expect("her activity is kept");
    assert!(
        activity.contains_key("due_pk"),
        "on the due index: {activity:?}"
    );
    // Twenty-nine days on, bob uses the mini-program; she does not. A day later nothing
    // is due yet: thirty whole days have not passed for her.
    app.advance(std::time::Duration::from_secs(29 * 86_400));
    let seen = app.get("/v1/notifications", Some(&bob.token)).await;
    assert_eq!(
        seen.status, 401,
        "his two-hour token has expired: {}",
        seen.body
    );
    let bob = app.user("bob").await;
    assert_eq!(
        app.get("/v1/notifications", Some(&bob.token)).await.status,
        200
    );
    app.ticks_until(|_| false).await;
    assert!(tombstones(&app).await.is_empty(), "nobody forgotten yet");

    // Past thirty whole days for her: her erasure begins, caused `inactive`.
    app.advance(std::time::Duration::from_secs(2 * 86_400));
    app.ticks_until(|s| s.erasure_steps >= 1).await;
    let tombstone = tombstones(&app).await;
    assert_eq!(tombstone.len(), 1, "only her: {tombstone:?}");
    assert_eq!(attr_s(&tombstone[0], "cause"), Some("inactive"));
    app.tick(30).await;
    app.advance(std::time::Duration::from_secs(121));
    let done = app.ticks_until(|s| s.erasures_done >= 1).await;
    assert_eq!(done.erasures_done, 1, "{done:?}");
    let left = naming(&app, &una.openid).await;
    assert!(left.is_empty(), "items still naming her: {left:?}");
    assert!(app.item(&bob, "ACTIVE").await.is_some(), "bob's data stays");
    assert!(app.item(&bob, "PREFS").await.is_some());
}

/// WeChat's revoke event as XML, for `openid`.
fn revoke_xml(openid: &str, at: i64) -> String {
    format!(
        "<xml><ToUserName><![CDATA[gh_123456789abc]]></ToUserName>\
         <FromUserName><![CDATA[o_wechat_platform]]></FromUserName>\
         <CreateTime>{at}</CreateTime><MsgType><![CDATA[event]]></MsgType>\
         <Event><![CDATA[user_authorization_revoke]]></Event>\
         <OpenID><![CDATA[{openid}]]></OpenID><AppID><![CDATA[wx0000]]></AppID>\
         <RevokeInfo><![CDATA[1]]></RevokeInfo></xml>"
    )
}

#[tokio::test]
async fn wechat_saying_the_user_withdrew_forgets_them_in_xml_and_never_on_a_plain_push() {
    use onegrant::secrets::Secret;
    use onegrant::wechat::push::PushCrypto;
    use onegrant_tests::wechat_push::{TOKEN, encrypted_app, plain_xml_app, sealed_xml};
    // Safe mode, XML: the erasure begins, caused `authorization_revoked`.
    let safe = encrypted_app("safe", "xml").await;
    let user = safe.user("vera").await;
    let c = crypto();
    let ts = now();
    let sealed = c.encrypt(&revoke_xml(&user.openid, safe.now().timestamp()), &[5; 16]);
    let (query, body) = sealed_xml(&c, &sealed, &ts, "r1");
    assert_eq!(
        hit(&safe, "POST", &query, Some(body)).await,
        (200, "success".into())
    );
    let tombstone = tombstones(&safe).await;
    assert_eq!(
        attr_s(&tombstone[0], "cause"),
        Some("authorization_revoked")
    );
    assert_eq!(
        safe.get("/v1/notifications", Some(&user.token))
            .await
            .status,
        401
    );

    // Plain mode: its signature covers no body, so anyone holding one signed query could
    // forge the event; acknowledged, never acted on.
    let plain = plain_xml_app().await;
    let user = plain.user("walt").await;
    let signer =
        PushCrypto::signatures_only(Secret::new(TOKEN), onegrant_local::stack::LOCAL_APPID);
    let query = format!(
        "signature={}&timestamp={ts}&nonce=p1",
        signer.signature(&ts, "p1")
    );
    let body = revoke_xml(&user.openid, plain.now().timestamp());
    assert_eq!(
        hit(&plain, "POST", &query, Some(body)).await,
        (200, "success".into())
    );
    assert!(tombstones(&plain).await.is_empty(), "nothing begun");
    assert_eq!(
        plain
            .get("/v1/notifications", Some(&user.token))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_change_of_the_inactive_days_holds_for_users_already_on_the_index() {
    use onegrant::domain::erasure::{activity_day, inactive_from};
    let app = onegrant_tests::spawn_app_with(&[("INACTIVE_USER_DAYS", "30")]).await;
    app.move_to_china_midday();
    let days = |n: u64| std::time::Duration::from_secs(n * 86_400);
    // The stack redeployed with another INACTIVE_USER_DAYS: same table, same clock.
    let redeployed = |inactive_user_days: u32| {
        let mut config = (*app.deps.config).clone();
        config.limits.inactive_user_days = inactive_user_days;
        onegrant_local::stack::deps_on(config, app.table.client.clone(), app.clock.clone())
            .expect("deps")
    };
    let tick = |deps: onegrant::Deps| async move {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        dispatcher::tick(&deps, deadline).await.expect("tick")
    };
    let active = async |app: &TestApp, name: &str| {
        let user = app.user(name).await;
        let seen = app.get("/v1/notifications", Some(&user.token)).await;
        assert_eq!(seen.status, 200, "{}", seen.body);
        user
    };
    let una = active(&app, "una").await;
    let her_day = activity_day(app.now());
    // Raised to 60 days: 31 days on, she is not forgotten; due again at the new day.
    app.advance(days(31));
    tick(redeployed(60)).await;
    assert!(tombstones(&app).await.is_empty(), "nobody forgotten");
    let entry = app.item(&una, "ACTIVE").await.expect("her activity");
    let later = inactive_from(her_day, 60).expect("60 days");
    assert_eq!(
        onegrant_tests::attr_n(&entry, "due_at"),
        Some(later.timestamp_millis())
    );
    // Meanwhile vic uses the mini-program (written under 30 days).
    let vic = active(&app, "vic").await;
    // Past her 60 days: under 60 she is forgotten; vic, inside his 30, is not.
    app.advance(days(30));
    tick(redeployed(60)).await;
    let tombstone = tombstones(&app).await;
    assert_eq!(tombstone.len(), 1, "only her: {tombstone:?}");
    assert_eq!(attr_s(&tombstone[0], "cause"), Some("inactive"));
    // Turned off (0: never): past his 30 days, vic is not forgotten; his entry is
    // looked at again in 30 days.
    app.advance(days(1));
    let before = app.now();
    tick(redeployed(0)).await;
    let after = app.now();
    assert_eq!(tombstones(&app).await.len(), 1, "vic is kept");
    let entry = app.item(&vic, "ACTIVE").await.expect("his activity");
    let recheck = onegrant::domain::erasure::INACTIVE_RECHECK;
    let due = onegrant_tests::attr_n(&entry, "due_at").unwrap_or_default();
    assert!(
        ((before + recheck).timestamp_millis()..=(after + recheck).timestamp_millis())
            .contains(&due),
        "{entry:?}"
    );
    // Turned on again (30): then, long past his 30 days, he is forgotten.
    app.advance(days(30));
    tick(redeployed(30)).await;
    assert_eq!(tombstones(&app).await.len(), 2, "vic forgotten too");
}
