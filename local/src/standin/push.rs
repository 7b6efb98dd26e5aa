//! The stand-in's message push: events POSTed to a callback URL as WeChat's message
//! push makes them (reference/wechat.md §4): signed with the token, and with an
//! EncodingAESKey sealed in safe mode (`Encrypt` only, `msg_signature`); JSON or XML.
//!
//! WeChat pushes `subscribe_msg_sent_event` once it has delivered a message, whatever
//! became of the send's own answer; the stand-in does the same after every delivery
//! (a dropped connection included), and popup and change events on request.

use std::time::Duration;

use onegrant::secrets::Secret;
use onegrant::wechat::push::PushCrypto;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Where and how the stand-in pushes (the mini-program's 消息推送配置).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct PushTarget {
    /// The callback URL (onegrant's `/wechat/callback`).
    pub url: String,
    pub token: String,
    /// The EncodingAESKey: pushes are sealed (safe mode). None: plain mode.
    #[serde(default)]
    pub aes_key: Option<String>,
    /// `compatible` (兼容模式): a sealed push also carries the event in the clear, next
    /// to `Encrypt`. Otherwise (default) safe with a key, plain without.
    #[serde(default)]
    pub mode: Option<String>,
    /// `json` (default) or `xml`.
    #[serde(default)]
    pub format: Option<String>,
    /// How long after a delivery its sent event is pushed (default 50 ms).
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Each push is POSTed this many times at once, as WeChat's retries of one event
    /// may overlap (default 1).
    #[serde(default)]
    pub copies: Option<u32>,
    /// The mini-program's original id (`gh_…`).
    #[serde(default)]
    pub to_user: Option<String>,
}

/// One event to push.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PushEventSpec {
    Sent {
        openid: String,
        template_id: String,
        msgid: u64,
        #[serde(default)]
        error_code: i64,
    },
    Popup {
        openid: String,
        template_id: String,
        /// `accept` or `reject`.
        status: String,
    },
    Change {
        openid: String,
        template_id: String,
    },
}

impl PushEventSpec {
    fn openid(&self) -> &str {
        match self {
            Self::Sent { openid, .. }
            | Self::Popup { openid, .. }
            | Self::Change { openid, .. } => openid,
        }
    }
}

/// A push made, and how the callback answered each copy (HTTP status; 0: no answer).
#[derive(Debug, Clone, Serialize)]
pub struct PushRecord {
    #[serde(flatten)]
    pub spec: PushEventSpec,
    /// Its `CreateTime` (epoch seconds), which WeChat's retries of it carry too.
    pub create_time: i64,
    pub answers: Vec<u16>,
}

/// The event as WeChat writes it: JSON with every value a string and `List` an object
/// (an array for popups), or XML with the event's own wrapper.
fn event_body(spec: &PushEventSpec, xml: bool, to_user: &str, create_time: i64) -> String {
    let (event, item) = match spec {
        PushEventSpec::Sent {
            template_id,
            msgid,
            error_code,
            ..
        } => (
            "subscribe_msg_sent_event",
            vec![
                ("TemplateId", template_id.clone(), true),
                ("MsgID", msgid.to_string(), false),
                ("ErrorCode", error_code.to_string(), false),
                (
                    "ErrorStatus",
                    if *error_code == 0 {
                        "success".to_string()
                    } else {
                        "fail".to_string()
                    },
                    true,
                ),
            ],
        ),
        PushEventSpec::Popup {
            template_id,
            status,
            ..
        } => (
            "subscribe_msg_popup_event",
            vec![
                ("TemplateId", template_id.clone(), true),
                ("SubscribeStatusString", status.clone(), true),
                ("PopupScene", "0".to_string(), false),
            ],
        ),
        PushEventSpec::Change { template_id, .. } => (
            "subscribe_msg_change_event",
            vec![
                ("TemplateId", template_id.clone(), true),
                ("SubscribeStatusString", "reject".to_string(), true),
            ],
        ),
    };
    let openid = spec.openid();
    if !xml {
        let list: serde_json::Map<String, serde_json::Value> = item
            .into_iter()
            .map(|(name, value, _)| (name.to_string(), json!(value)))
            .collect();
        let list = if matches!(spec, PushEventSpec::Popup { .. }) {
            json!([list])
        } else {
            json!(list)
        };
        return json!({"ToUserName": to_user, "FromUserName": openid,
                      "CreateTime": create_time.to_string(), "MsgType": "event",
                      "Event": event, "List": list})
        .to_string();
    }
    let wrapper = match spec {
        PushEventSpec::Sent { .. } => "SubscribeMsgSentEvent",
        PushEventSpec::Popup { .. } => "SubscribeMsgPopupEvent",
        PushEventSpec::Change { .. } => "SubscribeMsgChangeEvent",
    };
    let fields: String = item
        .into_iter()
        .map(|(name, value, text)| {
            if text {
                format!("<{name}><![CDATA[{value}]]></{name}>")
            } else {
                format!("<{name}>{value}</{name}>")
            }
        })
        .collect();
    format!(
        "<xml><ToUserName><![CDATA[{to_user}]]></ToUserName><FromUserName><![CDATA[{openid}]]></FromUserName>\
         <CreateTime>{create_time}</CreateTime><MsgType><![CDATA[event]]></MsgType>\
         <Event><![CDATA[{event}]]></Event><{wrapper}><List>{fields}</List></{wrapper}></xml>"
    )
}

/// A fresh nonce, as WeChat's are: digits.
fn nonce() -> String {
    let bytes = uuid::Uuid::new_v4();
    let n = u64::from_le_bytes(bytes.as_bytes()[..8].try_into().unwrap_or([3; 8]));
    (n % 10_000_000_000).to_string()
}

/// The query and body of one push request of `plain`.
fn request(target: &PushTarget, appid: &str, plain: &str, xml: bool, now: i64) -> (String, String) {
    let ts = now.to_string();
    let nonce = nonce();
    let token = Secret::new(target.token.clone());
    let sealed = target
        .aes_key
        .as_deref()
        .and_then(|key| PushCrypto::new(token.clone(), key, appid).ok());
    let signer = PushCrypto::signatures_only(token, appid);
    let signature = signer.signature(&ts, &nonce);
    let Some(crypto) = sealed else {
        let query = format!("signature={signature}&timestamp={ts}&nonce={nonce}");
        return (query, plain.to_string());
    };
    let random: [u8; 16] = *uuid::Uuid::new_v4().as_bytes();
    let encrypt = crypto.encrypt(plain, &random);
    let msg_signature = crypto.msg_signature(&ts, &nonce, &encrypt);
    let query = format!(
        "signature={signature}&timestamp={ts}&nonce={nonce}&encrypt_type=aes&msg_signature={msg_signature}"
    );
    let to_user = target.to_user.as_deref().unwrap_or(DEFAULT_TO_USER);
    let compatible = target.mode.as_deref() == Some("compatible");
    let body = match (xml, compatible) {
        (true, false) => format!(
            "<xml><ToUserName><![CDATA[{to_user}]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
        ),
        (false, false) => json!({"ToUserName": to_user, "Encrypt": encrypt}).to_string(),
        // Compatible mode: the clear event with its sealed copy beside it.
        (true, true) => plain.replacen(
            "<xml>",
            &format!("<xml><Encrypt><![CDATA[{encrypt}]]></Encrypt>"),
            1,
        ),
        (false, true) => {
            let mut clear: serde_json::Value =
                serde_json::from_str(plain).unwrap_or_else(|_| json!({}));
            if let Some(object) = clear.as_object_mut() {
                object.insert("Encrypt".into(), json!(encrypt));
            }
            clear.to_string()
        }
    };
    (query, body)
}

/// The stand-in mini-program's original id.
pub const DEFAULT_TO_USER: &str = "gh_0negrant0local";

/// Pushes one event created at `create_time` (epoch seconds) to the target (its copies
/// at once), signed at `now` (epoch seconds): each copy's answer.
pub async fn push(
    client: &reqwest::Client,
    target: &PushTarget,
    appid: &str,
    spec: &PushEventSpec,
    create_time: i64,
    now: i64,
) -> Vec<u16> {
    let xml = target.format.as_deref() == Some("xml");
    let to_user = target.to_user.as_deref().unwrap_or(DEFAULT_TO_USER);
    let plain = event_body(spec, xml, to_user, create_time);
    let copies = target.copies.unwrap_or(1).clamp(1, 50);
    let sends = (0..copies).map(|_| {
        let (query, body) = request(target, appid, &plain, xml, now);
        let url = format!(
            "{}{}{query}",
            target.url,
            if target.url.contains('?') { "&" } else { "?" }
        );
        async move {
            match client
                .post(url)
                .body(body)
                .timeout(Duration::from_secs(5))
                .send()
                .await
            {
                Ok(response) => response.status().as_u16(),
                Err(e) => {
                    tracing::warn!(error = %e, "stand-in push got no answer");
                    0
                }
            }
        }
    });
    futures::future::join_all(sends).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use onegrant::domain::callback::{self, Format, PushEvent};

    fn target(aes_key: Option<String>) -> PushTarget {
        PushTarget {
            url: "http://127.0.0.1:1/wechat/callback".into(),
            token: "tok".into(),
            aes_key,
            mode: None,
            format: None,
            delay_ms: None,
            copies: None,
            to_user: None,
        }
    }

    #[test]
    fn sent_events_read_back_as_onegrant_parses_them_in_both_formats() {
        let spec = PushEventSpec::Sent {
            openid: "o123".into(),
            template_id: "tmpl_water_reminder".into(),
            msgid: 1_700_827_132_819_554_304,
            error_code: 0,
        };
        for (xml, format) in [(false, Format::Json), (true, Format::Xml)] {
            let body = event_body(&spec, xml, DEFAULT_TO_USER, 1_700_000_000);
            let message = callback::parse(&body, format).expect("parses");
            assert_eq!(message.openid.as_str(), "o123");
            assert_eq!(message.create_time, 1_700_000_000);
            let PushEvent::Sent(items) = message.event else {
                panic!("a sent event, got {:?}", message.event);
            };
            assert_eq!(items.len(), 1);
            assert_eq!(items[0].msgid, 1_700_827_132_819_554_304);
            assert_eq!(items[0].error_code, 0);
        }
    }

    #[test]
    fn a_sealed_push_opens_with_the_same_key_and_verifies() {
        let key = "A".repeat(43);
        let t = target(Some(key.clone()));
        let (query, body) = request(&t, "wxapp", "{\"a\":1}", false, 1_800_000_000);
        let params: std::collections::HashMap<String, String> =
            form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect();
        let crypto = PushCrypto::new(Secret::new("tok"), &key, "wxapp").expect("key");
        let encrypt = callback::encrypted_field(&body, Format::Json)
            .expect("reads")
            .expect("has Encrypt");
        assert!(crypto.verify_msg_signature(
            &params["timestamp"],
            &params["nonce"],
            &encrypt,
            &params["msg_signature"]
        ));
        assert_eq!(crypto.decrypt(&encrypt).expect("opens"), "{\"a\":1}");
        let (plain_query, plain_body) = request(&target(None), "wxapp", "{}", false, 1_800_000_000);
        assert_eq!(plain_body, "{}");
        assert!(plain_query.starts_with("signature="));
    }
}
