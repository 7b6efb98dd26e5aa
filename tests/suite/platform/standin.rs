//! The WeChat stand-in follows the real API contract (reference/wechat.md); later
//! features are tested against it, so its own behaviour is pinned here.

use onegrant_local::stack::{LOCAL_APPID, LOCAL_SECRET};
use onegrant_tests::{TestApp, WATER, spawn_app};
use serde_json::{Value, json};

async fn stable_token(app: &TestApp, force: bool) -> Value {
    app.http
        .post(format!("{}/cgi-bin/stable_token", app.standin_url))
        .json(&json!({"grant_type": "client_credential", "appid": LOCAL_APPID, "secret": LOCAL_SECRET, "force_refresh": force}))
        .send()
        .await
        .expect("stable_token")
        .json()
        .await
        .expect("JSON")
}

async fn token(app: &TestApp) -> String {
    stable_token(app, false).await["access_token"]
        .as_str()
        .expect("access_token")
        .to_string()
}

/// Sends and returns the raw body text (msgid precision matters).
async fn send_raw(app: &TestApp, token: Option<&str>, body: &Value) -> String {
    let mut url = format!("{}/cgi-bin/message/subscribe/send", app.standin_url);
    if let Some(t) = token {
        url.push_str(&format!("?access_token={t}"));
    }
    app.http
        .post(url)
        .json(body)
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("text")
}

async fn send(app: &TestApp, token: Option<&str>, body: &Value) -> Value {
    serde_json::from_str(&send_raw(app, token, body).await).expect("JSON answer")
}

fn water_message(openid: &str) -> Value {
    json!({
        "touser": openid,
        "template_id": WATER,
        "page": "pages/water/index?from=reminder",
        "miniprogram_state": "developer",
        "lang": "zh_CN",
        "data": {
            "thing1": {"value": "该喝水了"},
            "time2": {"value": "2026年11月30日 14:00"},
            "number3": {"value": "4"}
        }
    })
}

#[tokio::test]
async fn stable_token_returns_the_same_token_until_forced_and_counts_forcing() {
    let app = spawn_app().await;
    let a = stable_token(&app, false).await;
    let b = stable_token(&app, false).await;
    assert_eq!(a["access_token"], b["access_token"]);
    assert!(b["expires_in"].as_u64().is_some_and(|s| s > 300));
    let forced = stable_token(&app, true).await;
    assert_ne!(forced["access_token"], a["access_token"]);
    let old = a["access_token"].as_str().expect("token");
    let (_, openid) = app.login_code("alice").await;
    assert_eq!(
        send(&app, Some(old), &water_message(&openid)).await["errcode"],
        40001
    );
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(
        (
            counters["stable_token_calls"].as_u64(),
            counters["force_refresh_calls"].as_u64()
        ),
        (Some(3), Some(1))
    );
}

#[tokio::test]
async fn the_plain_token_endpoint_issues_a_new_token_per_call() {
    let app = spawn_app().await;
    let get = || async {
        app.http
            .get(format!(
                "{}/cgi-bin/token?grant_type=client_credential&appid={LOCAL_APPID}&secret={LOCAL_SECRET}",
                app.standin_url
            ))
            .send()
            .await
            .expect("token")
            .json::<Value>()
            .await
            .expect("JSON")
    };
    let (a, b) = (get().await, get().await);
    assert_ne!(a["access_token"], b["access_token"]);
    let wrong = app
        .http
        .get(format!(
            "{}/cgi-bin/token?grant_type=client_credential&appid={LOCAL_APPID}&secret=nope",
            app.standin_url
        ))
        .send()
        .await
        .expect("token")
        .json::<Value>()
        .await
        .expect("JSON");
    assert_eq!(wrong["errcode"], 40125);
}

#[tokio::test]
async fn a_send_with_quota_delivers_once_and_answers_a_msgid_above_two_to_the_53() {
    let app = spawn_app().await;
    let token = token(&app).await;
    let (_, openid) = app.login_code("alice").await;
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": openid, "template_id": WATER, "count": 1})),
    )
    .await;
    let raw = send_raw(&app, Some(&token), &water_message(&openid)).await;
    let answer: Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(answer["errcode"], 0, "{raw}");
    let msgid = answer["msgid"]
        .as_u64()
        .expect("msgid is a JSON number that fits u64");
    assert!(msgid > 1 << 53, "msgid {msgid} is above 2^53");
    assert!(
        raw.contains(&format!("\"msgid\":{msgid}")),
        "msgid is a bare number: {raw}"
    );
    let again = send(&app, Some(&token), &water_message(&openid)).await;
    assert_eq!(again["errcode"], 43101, "no real quota left");
    let deliveries = app.control("GET", "deliveries", None).await;
    assert_eq!(deliveries["deliveries"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        deliveries["deliveries"][0]["miniprogram_state"],
        "developer"
    );
}

#[tokio::test]
async fn sends_are_checked_like_wechat_does() {
    let app = spawn_app().await;
    let token = token(&app).await;
    let (_, openid) = app.login_code("alice").await;
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": openid, "template_id": WATER, "count": 5})),
    )
    .await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut m = water_message(&openid);
        f(&mut m);
        m
    };
    // (case, access token, message, expected errcode, field the errmsg names)
    type Case<'a> = (&'a str, Option<&'a str>, Value, i64, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("no token", None, water_message(&openid), 41001, None),
        (
            "a bogus token",
            Some("bogus"),
            water_message(&openid),
            40001,
            None,
        ),
        (
            "an unknown template",
            Some(&token),
            with(&|m| m["template_id"] = json!("tmpl_nope")),
            40037,
            None,
        ),
        (
            "an unknown openid",
            Some(&token),
            with(&|m| m["touser"] = json!("o_unknown")),
            40003,
            None,
        ),
        (
            "a page not in the app",
            Some(&token),
            with(&|m| m["page"] = json!("pages/nope")),
            41030,
            None,
        ),
        (
            "a missing keyword",
            Some(&token),
            with(&|m| {
                m["data"].as_object_mut().map(|d| d.remove("time2"));
            }),
            47003,
            Some("data.time2.value"),
        ),
        (
            "a thing over 20 characters",
            Some(&token),
            with(&|m| {
                m["data"]["thing1"]["value"] = json!("一二三四五六七八九十一二三四五六七八九十一")
            }),
            47003,
            Some("data.thing1.value"),
        ),
        (
            "a number with letters",
            Some(&token),
            with(&|m| m["data"]["number3"]["value"] = json!("4 cups")),
            47003,
            Some("data.number3.value"),
        ),
        (
            "a control character",
            Some(&token),
            with(&|m| m["data"]["thing1"]["value"] = json!("喝水\n")),
            47003,
            Some("data.thing1.value"),
        ),
    ];
    for (name, t, body, errcode, field) in cases {
        let answer = send(&app, t, &body).await;
        assert_eq!(answer["errcode"], errcode, "{name}: {answer}");
        if let Some(field) = field {
            assert!(
                answer["errmsg"].as_str().is_some_and(|m| m.contains(field)),
                "{name}: {answer}"
            );
        }
    }
    let quota = app
        .control(
            "GET",
            &format!("quota?openid={openid}&template_id={WATER}"),
            None,
        )
        .await;
    assert_eq!(quota["quota"], 5, "refused sends spend no quota");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sends_to_one_openid_get_43108() {
    let app = spawn_app().await;
    let token = token(&app).await;
    let (_, openid) = app.login_code("alice").await;
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": openid, "template_id": WATER, "count": 10})),
    )
    .await;
    // The first send is held in flight until the other three have been answered (not a
    // latency the machine's speed could outrun).
    app.hold_sends(&openid, true).await;
    let message = water_message(&openid);
    let mut sends: futures::stream::FuturesUnordered<_> =
        (0..4).map(|_| send(&app, Some(&token), &message)).collect();
    let mut answers = Vec::new();
    while answers.len() < 3 {
        answers.push(futures::StreamExt::next(&mut sends).await.expect("a send"));
    }
    app.hold_sends(&openid, false).await;
    answers.push(
        futures::StreamExt::next(&mut sends)
            .await
            .expect("the held send"),
    );
    let ok = answers.iter().filter(|a| a["errcode"] == 0).count();
    let busy = answers.iter().filter(|a| a["errcode"] == 43108).count();
    assert_eq!((ok, busy), (1, 3), "{answers:?}");
}

#[tokio::test]
async fn injected_faults_answer_errcodes_expire_tokens_and_drop_connections() {
    let app = spawn_app().await;
    let token = token(&app).await;
    let (_, openid) = app.login_code("alice").await;
    app.control(
        "POST",
        "quota",
        Some(json!({"openid": openid, "template_id": WATER, "count": 3})),
    )
    .await;

    app.control(
        "POST",
        "faults",
        Some(json!({"openid": openid, "errcode": 45011, "times": 1})),
    )
    .await;
    assert_eq!(
        send(&app, Some(&token), &water_message(&openid)).await["errcode"],
        45011
    );
    assert_eq!(
        send(&app, Some(&token), &water_message(&openid)).await["errcode"],
        0,
        "the fault applied once"
    );

    app.control(
        "POST",
        "faults",
        Some(json!({"openid": openid, "drop_after_delivery": true})),
    )
    .await;
    let dropped = app
        .http
        .post(format!(
            "{}/cgi-bin/message/subscribe/send?access_token={token}",
            app.standin_url
        ))
        .json(&water_message(&openid))
        .send()
        .await;
    let failed = match dropped {
        Err(_) => true,
        Ok(response) => response.bytes().await.is_err(),
    };
    assert!(failed, "the connection drops before an answer");
    let deliveries = app.control("GET", "deliveries", None).await;
    assert_eq!(
        deliveries["deliveries"].as_array().map(Vec::len),
        Some(2),
        "delivered despite the drop"
    );

    app.control("POST", "tokens/expire", None).await;
    assert_eq!(
        send(&app, Some(&token), &water_message(&openid)).await["errcode"],
        42001
    );
    let counters = app.control("GET", "counters", None).await;
    assert_eq!(counters["send_errcodes"]["45011"], 1);
    assert_eq!(counters["send_errcodes"]["42001"], 1);
    assert_eq!(counters["send_errcodes"]["0"], 2);
}

/// A popup accept pushed through the stand-in buys its tap's one message, once: a copy
/// pushed again with its `CreateTime`, as WeChat retries, is the same tap; another tap
/// (another time, or none given: now) buys another.
#[tokio::test]
async fn a_popup_accept_pushed_again_with_its_create_time_buys_one_message() {
    let app = onegrant_tests::spawn_pushing_app(1).await;
    let user = app.user("tess").await;
    let quota = || async {
        let path = format!("quota?openid={}&template_id={WATER}", user.openid);
        app.control("GET", &path, None).await["quota"].clone()
    };
    let tap = |create_time: Option<i64>| {
        let mut event = json!({"event": "popup", "openid": user.openid,
                               "template_id": WATER, "status": "accept"});
        if let Some(at) = create_time {
            event["create_time"] = json!(at);
        }
        event
    };
    let made = app.now().timestamp();
    app.push_event(tap(Some(made))).await;
    assert_eq!(quota().await, 1);
    app.push_event(tap(Some(made))).await;
    assert_eq!(quota().await, 1, "a copy of the same tap");
    app.push_event(tap(Some(made + 1))).await;
    assert_eq!(quota().await, 2, "a tap a second later");
    app.push_event(tap(None)).await;
    assert_eq!(quota().await, 3, "a tap now");
}
