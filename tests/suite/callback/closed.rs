//! The callback closed to forgery and oracles: a push names its account
//! (`ToUserName`, checked in every mode against `WECHAT_ORIGINAL_ID`), plain mode's
//! unsigned bodies are refused unless a team opts into them, and URL verification
//! echoes only a plain `echostr` — never decrypting one, never spending a nonce.

use onegrant_tests::{TestApp, User, WATER, quota, spawn_app_with};
use serde_json::json;

use onegrant_tests::wechat_push::{
    TOKEN, change, crypto, hit, key, now, recorded, safe_json_app, sealed,
};

/// A stack taking plain-mode JSON pushes (the explicit insecure opt-in).
async fn plain_json_app() -> TestApp {
    spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_MODE", "plain"),
        ("WECHAT_PUSH_INSECURE_PLAIN", "true"),
        ("WECHAT_PUSH_FORMAT", "json"),
    ])
    .await
}

/// The user's water grants still available.
async fn available(app: &TestApp, user: &User) -> serde_json::Value {
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    quota(&grants.body, WATER)["available"].clone()
}

/// A change event (the user turned water off) addressed to `to_user`.
fn change_to(openid: &str, to_user: &str) -> String {
    json!({"ToUserName": to_user, "FromUserName": openid,
           "CreateTime": onegrant::Clock::real_now().timestamp().to_string(), "MsgType": "event",
           "Event": "subscribe_msg_change_event",
           "List": {"TemplateId": WATER, "SubscribeStatusString": "reject"}})
    .to_string()
}

#[tokio::test]
async fn the_verification_echoes_only_a_plain_echostr_and_spends_no_nonce_of_a_push() {
    let app = safe_json_app().await;
    let alice = app.user("alice").await;
    app.accept(&alice, WATER, "closed_1").await;
    let c = crypto();
    let ts = now();
    // A genuine push, captured in flight: its query and its ciphertext.
    let (query, body) = sealed(&c, &c, &change(&alice.openid, WATER), &ts, "n_oracle");
    let encrypt = serde_json::from_str::<serde_json::Value>(&body).expect("JSON")["Encrypt"]
        .as_str()
        .expect("Encrypt")
        .to_string();
    // Its ciphertext as echostr under its own signed query: refused, nothing decrypted.
    for echostr in [encrypt.as_str(), "abc+def", &"9".repeat(65)] {
        let forged = format!("{query}&echostr={}", urlencode(echostr));
        let (status, text) = hit(&app, "GET", &forged, None).await;
        assert_eq!(status, 401, "echostr {echostr:.20}…: {text}");
        assert!(!text.contains(&alice.openid), "{text}");
        assert!(!text.contains("subscribe_msg"), "{text}");
    }
    // A plain echostr under the same query is echoed (the signature covers it)…
    let plain = format!("{query}&echostr=4375120948345356249");
    assert_eq!(
        hit(&app, "GET", &plain, None).await,
        (200, "4375120948345356249".into())
    );
    // …and none of it spent the push's nonce: the genuine push still lands.
    assert_eq!(
        hit(&app, "POST", &query, Some(body)).await,
        (200, "success".into())
    );
    assert_eq!(recorded(&app).await, 1);
    assert_eq!(
        available(&app, &alice).await,
        json!(0),
        "the change applied"
    );
}

#[tokio::test]
async fn a_push_addressed_to_another_account_is_refused_in_every_mode() {
    let safe = safe_json_app().await;
    let key = key();
    let plain = plain_json_app().await;
    let compatible = spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &key),
        ("WECHAT_PUSH_MODE", "compatible"),
        ("WECHAT_PUSH_FORMAT", "json"),
    ])
    .await;
    for (mode, app) in [
        ("safe", &safe),
        ("plain", &plain),
        ("compatible", &compatible),
    ] {
        let alice = app.user("alice").await;
        app.accept(&alice, WATER, "closed_2").await;
        let event = change_to(&alice.openid, "gh_0ther0account");
        let (query, body) = signed(mode, event, "n_other");
        let answer = hit(app, "POST", &query, Some(body)).await;
        assert_eq!(answer.0, 401, "{mode}: {answer:?}");
        assert_eq!(recorded(app).await, 0, "{mode}: nothing recorded");
        assert_eq!(available(app, &alice).await, json!(1), "{mode}: grant kept");
        // The same event for this account, signed alike, is taken.
        let event = change_to(&alice.openid, "gh_123456789abc");
        let (query, body) = signed(mode, event, "n_ours");
        assert_eq!(
            hit(app, "POST", &query, Some(body)).await,
            (200, "success".into()),
            "{mode}"
        );
        assert_eq!(available(app, &alice).await, json!(0), "{mode}: applied");
    }
}

#[tokio::test]
async fn in_plain_mode_a_verification_query_cannot_be_replayed_as_a_push() {
    let app = plain_json_app().await;
    let alice = app.user("alice").await;
    app.accept(&alice, WATER, "closed_4").await;
    let (query, _) = signed("plain", String::new(), "n_verify");
    let verify = format!("{query}&echostr=4375120948345356249");
    assert_eq!(hit(&app, "GET", &verify, None).await.0, 200);
    let forged = change_to(&alice.openid, "gh_123456789abc");
    // Its nonce is spent: taken as a replay, acknowledged, nothing applied.
    let answer = hit(&app, "POST", &query, Some(forged)).await;
    assert_eq!(answer, (200, "success".into()));
    assert_eq!(recorded(&app).await, 0);
    assert_eq!(available(&app, &alice).await, json!(1), "the grant kept");
}

#[tokio::test]
async fn a_forged_change_under_a_captured_signed_query_is_refused_by_default() {
    // The default mode (safe): a signed query covers no plain body.
    let app = safe_json_app().await;
    let alice = app.user("alice").await;
    app.accept(&alice, WATER, "closed_3").await;
    let c = crypto();
    let ts = now();
    let captured = format!(
        "signature={}&timestamp={ts}&nonce=n_captured",
        c.signature(&ts, "n_captured")
    );
    let forged = change_to(&alice.openid, "gh_123456789abc");
    let answer = hit(&app, "POST", &captured, Some(forged)).await;
    assert_eq!(answer.0, 401, "{answer:?}");
    assert_eq!(recorded(&app).await, 0);
    assert_eq!(available(&app, &alice).await, json!(1), "the grant kept");
    let plan = app.get("/v1/reminders/water", Some(&alice.token)).await;
    assert_ne!(plan.body["pause_reason"], "rejected", "{}", plan.body);
}

/// `event` as WeChat pushes it in `mode`: sealed and signed by `msg_signature`, or in
/// plain mode as it is, under `signature`.
fn signed(mode: &str, event: String, nonce: &str) -> (String, String) {
    let (c, ts) = (crypto(), now());
    if mode == "plain" {
        let query = format!(
            "signature={}&timestamp={ts}&nonce={nonce}",
            c.signature(&ts, nonce)
        );
        (query, event)
    } else {
        sealed(&c, &c, &event, &ts, nonce)
    }
}

/// `value` percent-encoded for a query string.
fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
