//! WeChat's message push as a test sends it: apps configured for each mode, pushes
//! sealed and signed as WeChat does, raw requests to `/wechat/callback`, and what it
//! recorded.

use onegrant::secrets::Secret;
use onegrant::wechat::push::PushCrypto;
use onegrant_local::stack::LOCAL_APPID;
use serde_json::json;

use crate::support::app::{TestApp, spawn_app_with};
use crate::support::invariants::attr_s;

pub const TOKEN: &str = "AAAAA";

pub const OPENID: &str = "otFpruAK8D-E6EfStSYonYSBZ8_4";

pub fn key() -> String {
    "A".repeat(43)
}

pub fn crypto() -> PushCrypto {
    PushCrypto::new(Secret::new(TOKEN), &key(), LOCAL_APPID).expect("key")
}

pub async fn safe_json_app() -> TestApp {
    encrypted_app("safe", "json").await
}

/// An app whose message push is configured with its EncodingAESKey, in `mode` (safe or
/// compatible) and `format` (json or xml).
pub async fn encrypted_app(mode: &str, format: &str) -> TestApp {
    spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &key()),
        ("WECHAT_PUSH_MODE", mode),
        ("WECHAT_PUSH_FORMAT", format),
    ])
    .await
}

/// An app whose message push is plain-mode XML (the explicit insecure opt-in).
pub async fn plain_xml_app() -> TestApp {
    spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_MODE", "plain"),
        ("WECHAT_PUSH_INSECURE_PLAIN", "true"),
        ("WECHAT_PUSH_FORMAT", "xml"),
    ])
    .await
}

/// A raw request to the callback: status and text body.
pub async fn hit(app: &TestApp, method: &str, query: &str, body: Option<String>) -> (u16, String) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = app
        .http
        .request(method, format!("{}/wechat/callback?{query}", app.base_url));
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.expect("the API answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

pub fn now() -> String {
    onegrant::Clock::real_now().timestamp().to_string()
}

pub fn popup(openid: &str, create_time: i64) -> String {
    json!({"ToUserName": "gh_123456789abc", "FromUserName": openid, "CreateTime": create_time.to_string(),
           "MsgType": "event", "Event": "subscribe_msg_popup_event",
           "List": [{"TemplateId": "tmpl_water_reminder", "SubscribeStatusString": "accept", "PopupScene": "0"}]})
    .to_string()
}

/// A safe-mode push of `plain`, sealed by `sealer`, signed by `token`.
pub fn sealed(
    sealer: &PushCrypto,
    signer: &PushCrypto,
    plain: &str,
    ts: &str,
    nonce: &str,
) -> (String, String) {
    let encrypt = sealer.encrypt(plain, &[9; 16]);
    let signature = signer.msg_signature(ts, nonce, &encrypt);
    let query = format!(
        "signature={}&timestamp={ts}&nonce={nonce}&openid={OPENID}&encrypt_type=aes&msg_signature={signature}",
        signer.signature(ts, nonce)
    );
    (
        query,
        json!({"ToUserName": "gh_123456789abc", "Encrypt": encrypt}).to_string(),
    )
}

/// The recorded push events.
pub async fn pushes(
    app: &TestApp,
) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    app.items()
        .await
        .into_iter()
        .filter(|i| attr_s(i, "kind") == Some("push"))
        .collect()
}

/// The events recorded (a verified request also leaves its nonce).
pub async fn recorded(app: &TestApp) -> usize {
    pushes(app).await.len()
}

/// A safe-mode JSON change event (the user turned `template` off in WeChat's settings).
pub fn change(openid: &str, template: &str) -> String {
    json!({"ToUserName": "gh_123456789abc", "FromUserName": openid, "CreateTime": onegrant::Clock::real_now().timestamp().to_string(),
           "MsgType": "event", "Event": "subscribe_msg_change_event",
           "List": {"TemplateId": template, "SubscribeStatusString": "reject"}})
    .to_string()
}

/// A safe-mode XML push whose `Encrypt` is `encrypt`, signed by `signer`.
pub fn sealed_xml(signer: &PushCrypto, encrypt: &str, ts: &str, nonce: &str) -> (String, String) {
    let signature = signer.msg_signature(ts, nonce, encrypt);
    (
        format!(
            "signature={}&timestamp={ts}&nonce={nonce}&openid={OPENID}&encrypt_type=aes&msg_signature={signature}",
            signer.signature(ts, nonce)
        ),
        format!(
            "<xml><ToUserName><![CDATA[gh_123456789abc]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
        ),
    )
}
