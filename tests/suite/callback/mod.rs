//! `/wechat/callback`: WeChat's message push, verified before anything is read.

mod closed;
mod sent_event;
mod wechat_ips;

use onegrant::secrets::Secret;
use onegrant::wechat::push::PushCrypto;
use onegrant_local::stack::LOCAL_APPID;
use onegrant_tests::wechat_push::*;
use onegrant_tests::{attr_s, spawn_app_with};
use serde_json::json;

#[tokio::test]
async fn the_url_is_verified_by_its_signature() {
    let app = safe_json_app().await;
    let c = crypto();
    let ts = now();
    let good = format!(
        "signature={}&timestamp={ts}&nonce=1514711492&echostr=4375120948345356249",
        c.signature(&ts, "1514711492")
    );
    assert_eq!(
        hit(&app, "GET", &good, None).await,
        (200, "4375120948345356249".into())
    );
    let forged = format!(
        "signature={}&timestamp={ts}&nonce=1514711493&echostr=1",
        c.signature(&ts, "1514711492")
    );
    assert_eq!(hit(&app, "GET", &forged, None).await.0, 401);
    let stale_ts = (app.now().timestamp() - 3600).to_string();
    let stale = format!(
        "signature={}&timestamp={stale_ts}&nonce=1&echostr=1",
        c.signature(&stale_ts, "1")
    );
    assert_eq!(hit(&app, "GET", &stale, None).await.0, 401);
    assert_eq!(hit(&app, "GET", "echostr=1", None).await.0, 401);
}

#[tokio::test]
async fn a_verified_push_is_recorded_once_whatever_the_retries_and_replays() {
    let app = safe_json_app().await;
    let c = crypto();
    let ts = now();
    let event = popup(OPENID, app.now().timestamp());
    let (query, body) = sealed(&c, &c, &event, &ts, "n1");
    assert_eq!(
        hit(&app, "POST", &query, Some(body.clone())).await,
        (200, "success".into())
    );
    assert_eq!(recorded(&app).await, 1);
    // The same request again (a replay), and WeChat's retry with a new nonce.
    assert_eq!(
        hit(&app, "POST", &query, Some(body)).await,
        (200, "success".into())
    );
    let (retry, retry_body) = sealed(&c, &c, &event, &ts, "n2");
    assert_eq!(
        hit(&app, "POST", &retry, Some(retry_body)).await,
        (200, "success".into())
    );
    let pushes = pushes(&app).await;
    assert_eq!(pushes.len(), 1, "one event, recorded once");
    assert_eq!(attr_s(&pushes[0], "event"), Some("popup"));
    assert_eq!(
        attr_s(&pushes[0], "pk"),
        Some(format!("USER#{OPENID}").as_str())
    );
}

#[tokio::test]
async fn bad_pushes_are_refused_and_change_nothing() {
    let app = safe_json_app().await;
    let c = crypto();
    let ts = now();
    let event = popup(OPENID, app.now().timestamp());
    let other_key = PushCrypto::new(Secret::new(TOKEN), &"B".repeat(43), LOCAL_APPID).expect("key");
    let other_app = PushCrypto::new(Secret::new(TOKEN), &key(), "wx0000000000000000").expect("key");
    let other_token = PushCrypto::new(Secret::new("BBBBB"), &key(), LOCAL_APPID).expect("key");
    let stale_ts = (app.now().timestamp() - 3600).to_string();
    let future_ts = (app.now().timestamp() + 3600).to_string();
    let mut cases: Vec<(&str, String, String, u16)> = Vec::new();
    let (q, b) = sealed(&c, &other_token, &event, &ts, "a");
    cases.push(("wrong msg_signature", q, b, 401));
    let (q, b) = sealed(&other_key, &c, &event, &ts, "b");
    cases.push(("bad AES key", q, b, 401));
    let (q, b) = sealed(&other_app, &c, &event, &ts, "c");
    cases.push(("wrong appid", q, b, 401));
    let (q, b) = sealed(&c, &c, &event, &stale_ts, "d");
    cases.push(("stale timestamp", q, b, 401));
    let (q, b) = sealed(&c, &c, &event, &future_ts, "e");
    cases.push(("timestamp from the future", q, b, 401));
    let (q, _) = sealed(&c, &c, &event, &ts, "f");
    cases.push(("a plain body in safe mode", q, event.clone(), 401));
    let (q, _) = sealed(&c, &c, &event, &ts, "g");
    cases.push(("not JSON", q, "<xml>".into(), 401));
    let (q, _) = sealed(&c, &c, &event, &ts, "h");
    cases.push(("oversized", q, "x".repeat(70 * 1024), 413));
    let (q, b) = sealed(&c, &c, "{not json", &ts, "i");
    cases.push(("verified, unreadable inside", q, b, 200));
    let (q, b) = sealed(&c, &c, &popup("not an openid!", 1), &ts, "j");
    cases.push(("verified, a bad openid inside", q, b, 200));
    for (what, query, body, status) in cases {
        let (got, _) = hit(&app, "POST", &query, Some(body)).await;
        assert_eq!(got, status, "{what}");
        assert_eq!(recorded(&app).await, 0, "{what} stored nothing");
    }
    // Without the query's signatures at all.
    assert_eq!(
        hit(&app, "POST", "timestamp=1", Some("{}".into())).await.0,
        401
    );
}

#[tokio::test]
async fn plain_xml_pushes_are_checked_by_their_signature() {
    let app = plain_xml_app().await;
    let c = PushCrypto::signatures_only(Secret::new(TOKEN), LOCAL_APPID);
    let ts = now();
    let xml = format!(
        "<xml><ToUserName><![CDATA[gh_123456789abc]]></ToUserName><FromUserName><![CDATA[{OPENID}]]></FromUserName>\
         <CreateTime>{}</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[subscribe_msg_change_event]]></Event>\
         <SubscribeMsgChangeEvent><List><TemplateId><![CDATA[tmpl_water_reminder]]></TemplateId>\
         <SubscribeStatusString><![CDATA[reject]]></SubscribeStatusString></List></SubscribeMsgChangeEvent></xml>",
        app.now().timestamp()
    );
    let forged = format!("signature={}&timestamp={ts}&nonce=2", c.signature(&ts, "1"));
    assert_eq!(hit(&app, "POST", &forged, Some(xml.clone())).await.0, 401);
    assert_eq!(recorded(&app).await, 0);
    let good = format!("signature={}&timestamp={ts}&nonce=1", c.signature(&ts, "1"));
    assert_eq!(
        hit(&app, "POST", &good, Some(xml)).await,
        (200, "success".into())
    );
    let pushes = pushes(&app).await;
    assert_eq!(pushes.len(), 1);
    assert_eq!(attr_s(&pushes[0], "event"), Some("change"));
}

#[tokio::test]
async fn without_a_push_token_the_callback_is_not_there() {
    let app = onegrant_tests::spawn_app().await;
    // (404, as the deployed stack without the routes: no 5xx for anyone to cause.)
    for method in ["GET", "POST"] {
        let answer = hit(
            &app,
            method,
            "timestamp=1&nonce=1&echostr=1&signature=x",
            None,
        )
        .await;
        assert_eq!(answer.0, 404, "{method}: {answer:?}");
    }
}

#[tokio::test]
async fn a_change_event_pauses_the_plans_voids_the_grants_and_nothing_is_sent() {
    let app = spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &key()),
        ("WECHAT_PUSH_FORMAT", "json"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
    ])
    .await;
    let user = app.scheduled_user("alice", 2).await;
    // Both due now: the next tick would send alice's reminder but for the event, and
    // sends bob's (who sent no event), so the tick below can tell.
    let bob = app.scheduled_user("bob", 1).await;
    app.make_due(&user, "water", app.now()).await;
    app.make_due(&bob, "water", app.now()).await;
    let c = crypto();
    let ts = now();
    let event = change(&user.openid, onegrant_tests::WATER);
    let (query, body) = sealed(&c, &c, &event, &ts, "c1");
    assert_eq!(
        hit(&app, "POST", &query, Some(body)).await,
        (200, "success".into())
    );
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "paused", "{}", plan.body);
    assert_eq!(plan.body["pause_reason"], "rejected", "{}", plan.body);
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    let quota = onegrant_tests::quota(&grants.body, onegrant_tests::WATER);
    assert_eq!(
        (
            quota["accepted"].clone(),
            quota["available"].clone(),
            quota["used"].clone()
        ),
        (json!(2), json!(0), json!(0)),
        "{quota}"
    );
    app.assert_grants_void(&user, 2).await;
    // WeChat's retry of the same event (a new nonce) applies nothing more.
    let (retry, retry_body) = sealed(&c, &c, &event, &ts, "c2");
    assert_eq!(hit(&app, "POST", &retry, Some(retry_body)).await.0, 200);
    assert_eq!(pushes(&app).await.len(), 1);
    assert_eq!(
        pushes(&app).await[0]
            .get("applied")
            .and_then(|v| v.as_bool().ok()),
        Some(&true)
    );
    // Nothing is attempted for alice afterwards; bob's reminder goes.
    let summary = app.tick(30).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    let deliveries = app.deliveries().await;
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0]["openid"], json!(bob.openid));
    onegrant_tests::assert_ledger_agrees_with_counters(&app).await;
    onegrant_tests::assert_plans_consistent(&app).await;
}

#[tokio::test]
async fn a_signed_push_query_is_good_once_and_compatible_mode_needs_the_ciphertext() {
    let app = encrypted_app("compatible", "json").await;
    let c = crypto();
    let ts = now();
    let verify = format!(
        "signature={}&timestamp={ts}&nonce=v1&echostr=hello",
        c.signature(&ts, "v1")
    );
    // A verification writes nothing (an echo tells nothing the caller did not send),
    // so it can be repeated, and it spends no nonce a push signed alike would need.
    let before = app.items().await.len();
    assert_eq!(hit(&app, "GET", &verify, None).await.0, 200);
    assert_eq!(hit(&app, "GET", &verify, None).await.0, 200);
    assert_eq!(app.items().await.len(), before, "nothing stored");
    // A plain body under a fresh, valid `signature` is still refused: that signature
    // covers no body, so compatible mode holds every push to msg_signature.
    let signed = format!(
        "signature={}&timestamp={ts}&nonce=v2",
        c.signature(&ts, "v2")
    );
    let forged = change(OPENID, onegrant_tests::WATER);
    assert_eq!(hit(&app, "POST", &signed, Some(forged)).await.0, 401);
    assert_eq!(recorded(&app).await, 0);
}

#[tokio::test]
async fn a_retry_after_a_stop_between_recording_and_applying_applies_it_and_a_popup_reject_keeps_the_grants()
 {
    let app = safe_json_app().await;
    let user = app.scheduled_user("alice", 2).await;
    let c = crypto();
    let ts = now();
    // The first attempt recorded the change event and stopped before applying it.
    let event = change(&user.openid, onegrant_tests::WATER);
    let message =
        onegrant::domain::callback::parse(&event, onegrant::domain::callback::Format::Json)
            .expect("event");
    app.deps
        .store
        .record_push(&ts, "r1", &message, &[], app.now())
        .await
        .expect("recorded");
    // WeChat retries the same request: applied now, once.
    let (query, body) = sealed(&c, &c, &event, &ts, "r1");
    assert_eq!(hit(&app, "POST", &query, Some(body)).await.0, 200);
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(plan.body["state"], "paused");
    assert_eq!(
        pushes(&app).await[0]
            .get("applied")
            .and_then(|v| v.as_bool().ok()),
        Some(&true)
    );

    // Bob rejects in the popup: his plan pauses, his earlier grants stay.
    let bob = app.scheduled_user("bob", 2).await;
    let reject = json!({"ToUserName": "gh_123456789abc", "FromUserName": bob.openid, "CreateTime": app.now().timestamp(),
                        "MsgType": "event", "Event": "subscribe_msg_popup_event",
                        "List": {"TemplateId": onegrant_tests::WATER, "SubscribeStatusString": "reject", "PopupScene": "0"}})
    .to_string();
    let (query, body) = sealed(&c, &c, &reject, &ts, "p1");
    assert_eq!(hit(&app, "POST", &query, Some(body)).await.0, 200);
    let plan = app.get("/v1/reminders/water", Some(&bob.token)).await;
    assert_eq!(plan.body["state"], "paused", "{}", plan.body);
    let grants = app.get("/v1/grants", Some(&bob.token)).await;
    assert_eq!(
        onegrant_tests::quota(&grants.body, onegrant_tests::WATER)["available"],
        2
    );
    onegrant_tests::assert_ledger_agrees_with_counters(&app).await;
    onegrant_tests::assert_plans_consistent(&app).await;
}

/// `plain` (whole 16-byte blocks) sealed with the 43×'A' key, with no padding added:
/// for envelopes whose padding is wrong on purpose.
fn seal_raw(mut plain: Vec<u8>) -> String {
    use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::NoPadding};
    use base64::Engine;
    let key = [0u8; 32]; // 43×'A' decodes to zero bytes
    let length = plain.len();
    let sealed = cbc::Encryptor::<aes::Aes256>::new(&key.into(), key[..16].into())
        .encrypt_padded_mut::<NoPadding>(&mut plain, length)
        .expect("whole blocks")
        .to_vec();
    base64::engine::general_purpose::STANDARD.encode(sealed)
}

#[tokio::test]
async fn pushes_of_every_shape_are_read_alike_and_bad_envelopes_change_nothing() {
    // Safe mode, XML: WeChat's popup event with one `List` and with two, each read
    // and recorded; an envelope that verifies but hides unreadable XML is answered
    // `success` (WeChat would only retry it) and recorded nowhere; one whose padding
    // or framing is wrong, or whose outer XML is broken, is refused.
    let app = encrypted_app("safe", "xml").await;
    let c = crypto();
    let ts = now();
    let list = |template: &str, status: &str| {
        format!(
            "<List><TemplateId><![CDATA[{template}]]></TemplateId><SubscribeStatusString><![CDATA[{status}]]></SubscribeStatusString><PopupScene>2</PopupScene></List>"
        )
    };
    let popup_xml = |openid: &str, lists: &str| {
        format!(
            "<xml><ToUserName><![CDATA[gh_123456789abc]]></ToUserName><FromUserName><![CDATA[{openid}]]></FromUserName>\
             <CreateTime>{}</CreateTime><MsgType><![CDATA[event]]></MsgType>\
             <Event><![CDATA[subscribe_msg_popup_event]]></Event>\
             <SubscribeMsgPopupEvent>{lists}</SubscribeMsgPopupEvent></xml>",
            app.now().timestamp()
        )
    };
    let one = popup_xml(OPENID, &list("tmpl_water_reminder", "accept"));
    let two = popup_xml(
        "otFpruAK8D-E6EfStSYonYSBZ8_5",
        &(list("tmpl_water_reminder", "accept") + &list("tmpl_order_status", "reject")),
    );
    let mut expected = 0;
    for (what, plain, nonce) in [("one List", &one, "x1"), ("two Lists", &two, "x2")] {
        let (query, body) = sealed_xml(&c, &c.encrypt(plain, &[7; 16]), &ts, nonce);
        assert_eq!(
            hit(&app, "POST", &query, Some(body)).await,
            (200, "success".into()),
            "{what}"
        );
        expected += 1;
        let pushes = pushes(&app).await;
        assert_eq!(pushes.len(), expected, "{what}");
    }
    // One item read from the single List, two from the pair.
    let mut sizes: Vec<usize> = pushes(&app)
        .await
        .iter()
        .map(|p| {
            p.get("items")
                .and_then(|v| v.as_l().ok())
                .map_or(0, Vec::len)
        })
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 2]);

    // A frame around `inner` (grown by trailing spaces, still the same XML) that ends
    // in `pad_len` bytes of `pad` on a 32-byte boundary: nothing but the message between
    // the length and the appid, so only the padding check can refuse a bad pad.
    let frame = |inner: &[u8], pad: u8, pad_len: usize| {
        let mut message = inner.to_vec();
        while !(16 + 4 + message.len() + LOCAL_APPID.len() + pad_len).is_multiple_of(32) {
            message.push(b' ');
        }
        let mut p = vec![b'r'; 16];
        p.extend_from_slice(&u32::try_from(message.len()).unwrap_or(0).to_be_bytes());
        p.extend_from_slice(&message);
        p.extend_from_slice(LOCAL_APPID.as_bytes());
        p.extend(std::iter::repeat_n(pad, pad_len));
        p
    };
    // The control: the same frame, rightly padded, opens and is recorded.
    let control = popup_xml(
        "otFpruAK8D-E6EfStSYonYSBZ8_6",
        &list("tmpl_water_reminder", "accept"),
    );
    let (query, body) = sealed_xml(&c, &seal_raw(frame(control.as_bytes(), 8, 8)), &ts, "x3");
    assert_eq!(hit(&app, "POST", &query, Some(body)).await.0, 200);
    expected += 1;
    assert_eq!(pushes(&app).await.len(), expected, "the control");

    let inner = one.as_bytes();
    let cases: Vec<(&str, String, String, u16)> = vec![
        {
            let (q, b) = sealed_xml(&c, &seal_raw(frame(inner, 0, 1)), &ts, "b1");
            ("padding byte 0", q, b, 401)
        },
        {
            let (q, b) = sealed_xml(&c, &seal_raw(frame(inner, 33, 1)), &ts, "b2");
            ("padding byte 33", q, b, 401)
        },
        {
            let mut p = frame(inner, 4, 4);
            let n = p.len();
            p[n - 2] = 3;
            let (q, b) = sealed_xml(&c, &seal_raw(p), &ts, "b3");
            ("padding bytes that disagree", q, b, 401)
        },
        {
            let (q, b) = sealed_xml(&c, &c.encrypt("<xml><unclosed>", &[7; 16]), &ts, "b4");
            ("verified, malformed XML inside", q, b, 200)
        },
        {
            let (q, _) = sealed_xml(&c, &c.encrypt(&one, &[7; 16]), &ts, "b5");
            ("malformed outer XML", q, "<xml><Encrypt>".into(), 401)
        },
        {
            let (q, _) = sealed_xml(&c, &c.encrypt(&one, &[7; 16]), &ts, "b6");
            (
                "JSON to an XML callback",
                q,
                "{\"Encrypt\": \"x\"}".into(),
                401,
            )
        },
    ];
    for (what, query, body, status) in cases {
        assert_eq!(
            hit(&app, "POST", &query, Some(body)).await.0,
            status,
            "{what}"
        );
        assert_eq!(
            pushes(&app).await.len(),
            expected,
            "{what}: nothing recorded"
        );
    }
}

#[tokio::test]
async fn json_pushes_read_list_as_object_or_array_and_numbers_as_strings_or_numbers() {
    let app = safe_json_app().await;
    let c = crypto();
    let ts = now();
    let item = json!({"TemplateId": "tmpl_water_reminder", "SubscribeStatusString": "accept", "PopupScene": "0"});
    let at = app.now().timestamp();
    let shapes = [
        (
            "List as an object, CreateTime a string",
            json!(item),
            json!(at.to_string()),
        ),
        (
            "List as an array, CreateTime a string",
            json!([item]),
            json!(at.to_string()),
        ),
        (
            "List as an object, CreateTime a number",
            json!(item),
            json!(at),
        ),
        (
            "List as an array of two, CreateTime a number",
            json!([item, {"TemplateId": "tmpl_order_status", "SubscribeStatusString": "reject", "PopupScene": 0}]),
            json!(at),
        ),
    ];
    for (i, (what, list, create_time)) in shapes.into_iter().enumerate() {
        let openid = format!("otFpruAK8D-E6EfStSYonYSBZ8_{i}");
        let event = json!({"ToUserName": "gh_123456789abc", "FromUserName": openid,
                           "CreateTime": create_time, "MsgType": "event",
                           "Event": "subscribe_msg_popup_event", "List": list})
        .to_string();
        let (query, body) = sealed(&c, &c, &event, &ts, &format!("s{i}"));
        assert_eq!(
            hit(&app, "POST", &query, Some(body)).await,
            (200, "success".into()),
            "{what}"
        );
        let recorded = pushes(&app).await;
        assert_eq!(recorded.len(), i + 1, "{what}: recorded");
        let mine = recorded
            .iter()
            .find(|p| attr_s(p, "pk") == Some(format!("USER#{openid}").as_str()))
            .unwrap_or_else(|| panic!("{what}: {recorded:?}"));
        assert_eq!(
            onegrant_tests::attr_n(mine, "create_time"),
            Some(at),
            "{what}"
        );
        let expected_items = if what.contains("two") { 2 } else { 1 };
        assert_eq!(
            mine.get("items")
                .and_then(|v| v.as_l().ok())
                .map_or(0, Vec::len),
            expected_items,
            "{what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_event_during_a_send_that_fails_keeps_the_grant_void() {
    // The user turns the template off in WeChat's settings while a reminder is in
    // flight; WeChat then answers -1 (not sent). The grant the send reserved must not
    // come back: every grant of a refused template is void, in flight or not.
    let app = spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &key()),
        ("WECHAT_PUSH_FORMAT", "json"),
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
        ("WECHAT_TIMEOUT_MS", "10000"),
    ])
    .await;
    let user = app.scheduled_user("alice", 2).await;
    app.make_due(&user, "water", app.now()).await;
    app.control(
        "POST",
        "faults",
        Some(json!({"openid": user.openid, "errcode": -1})),
    )
    .await;
    // WeChat holds the send until the change event is in (not a latency the machine's
    // speed could outrun).
    app.hold_sends(&user.openid, true).await;
    let tick = app.tick(120);
    let refuse = async {
        app.until_sending(&user, "water").await;
        let c = crypto();
        let (query, body) = sealed(
            &c,
            &c,
            &change(&user.openid, onegrant_tests::WATER),
            &now(),
            "cf",
        );
        let answered = hit(&app, "POST", &query, Some(body)).await;
        app.hold_sends(&user.openid, false).await;
        answered
    };
    let (summary, answered) = tokio::join!(tick, refuse);
    assert_eq!(answered, (200, "success".into()));
    assert_eq!((summary.claimed, summary.failed), (1, 1), "{summary:?}");
    // No grant of a refused template comes back.
    app.assert_grants_void(&user, 2).await;
    let plan = app.get("/v1/reminders/water", Some(&user.token)).await;
    assert_eq!(
        (
            plan.body["state"].clone(),
            plan.body["pause_reason"].clone()
        ),
        (json!("paused"), json!("rejected")),
        "{}",
        plan.body
    );
    onegrant_tests::assert_ledger_agrees_with_counters(&app).await;
    onegrant_tests::assert_plans_consistent(&app).await;
}
