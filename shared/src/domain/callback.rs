//! WeChat's subscription-message push events, read from XML or JSON (pure).
//!
//! The two formats differ (reference/wechat.md §4a): XML wraps the items as
//! `<SubscribeMsgPopupEvent><List>…</List><List>…</List></…>`, JSON puts `List` at the
//! top level as one object or an array; JSON gives numbers as strings, XML as text. Both
//! are read into one shape first (top-level fields, then the list's items, every value
//! a string), then into [`PushMessage`]. XML is read without any DTD: a document that
//! declares one is refused, so no entity can expand.

use std::collections::BTreeMap;

use quick_xml::events::Event;

use crate::domain::erasure::ErasureCause;
use crate::domain::ids::{OpenId, TemplateId};

/// How a push's body is written (the push configuration's data format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Xml,
    Json,
}

/// Why a push body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushParseError {
    #[error("the body is not well-formed {0}")]
    Malformed(&'static str),
    #[error("the push is missing or has a bad {0}")]
    Field(&'static str),
}

/// One push: who it is about and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushMessage {
    /// The mini-program's original id (`gh_…`).
    pub to_user: String,
    /// The user (`FromUserName`).
    pub openid: OpenId,
    /// WeChat's time of the event, epoch seconds.
    pub create_time: i64,
    pub event: PushEvent,
}

/// Whether `id` has the shape of a mini-program's original id: `gh_` and up to 32
/// letters or digits (WeChat's own have 12).
pub fn is_original_id(id: &str) -> bool {
    id.strip_prefix("gh_").is_some_and(|rest| {
        (1..=32).contains(&rest.len()) && rest.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// Whether `echostr` is one WeChat's URL verification sends: 1 to 64 letters or digits.
/// Anything else (a push's `Encrypt`, say) is refused unread.
pub fn is_plain_echostr(echostr: &str) -> bool {
    (1..=64).contains(&echostr.len()) && echostr.chars().all(|c| c.is_ascii_alphanumeric())
}

/// A user's choice in the popup or the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Accept,
    Reject,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// `subscribe_msg_popup_event`: the user acted on the popup.
    Popup(Vec<PopupItem>),
    /// `subscribe_msg_change_event`: the user turned templates off (only rejections
    /// are pushed).
    Change(Vec<ChangeItem>),
    /// `subscribe_msg_sent_event`: the final result of a send.
    Sent(Vec<SentItem>),
    /// `user_authorization_revoke` (the user withdrew the mini-program's
    /// authorisation) or `user_authorization_cancellation` (the user closed their
    /// WeChat account): WeChat asks that the user's data be deleted. The message's
    /// `openid` is the user's (the event's `OpenID`; its `FromUserName` is WeChat's).
    Erasure(ErasureCause),
    /// Anything else (other events, messages): acknowledged, not acted on.
    Other { msg_type: String, event: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopupItem {
    pub template_id: TemplateId,
    pub choice: Choice,
    pub scene: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeItem {
    pub template_id: TemplateId,
    pub choice: Choice,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentItem {
    pub template_id: TemplateId,
    /// The send's msgid (above 2^53: kept as u64).
    pub msgid: u64,
    /// 0 when WeChat delivered it.
    pub error_code: i64,
    pub error_status: String,
}

/// A body read into one shape: top-level fields and the list's items.
#[derive(Debug, Default, PartialEq, Eq)]
struct Flat {
    fields: BTreeMap<String, String>,
    items: Vec<BTreeMap<String, String>>,
}

/// The `Encrypt` field of a safe- or compatible-mode body, if it has one.
pub fn encrypted_field(body: &str, format: Format) -> Result<Option<String>, PushParseError> {
    Ok(flatten(body, format)?.fields.remove("Encrypt"))
}

/// Reads a (plain or decrypted) push.
pub fn parse(body: &str, format: Format) -> Result<PushMessage, PushParseError> {
    let flat = flatten(body, format)?;
    let field = |name: &'static str| {
        flat.fields
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .ok_or(PushParseError::Field(name))
    };
    let msg_type = field("MsgType")?.to_string();
    let event_name = flat.fields.get("Event").map(|e| e.trim().to_string());
    let erasure = match (msg_type.as_str(), event_name.as_deref()) {
        ("event", Some("user_authorization_revoke")) => Some(ErasureCause::Revoked),
        ("event", Some("user_authorization_cancellation")) => Some(ErasureCause::AccountClosed),
        _ => None,
    };
    let openid = match erasure {
        // The user is the event's `OpenID` (a key WeChat's own JSON sample writes with a
        // space before it).
        Some(_) => {
            let named = flat
                .fields
                .iter()
                .find(|(name, _)| name.trim() == "OpenID")
                .map(|(_, v)| v.trim().to_string())
                .ok_or(PushParseError::Field("OpenID"))?;
            OpenId::parse(named).map_err(|_| PushParseError::Field("OpenID"))?
        }
        None => OpenId::parse(field("FromUserName")?)
            .map_err(|_| PushParseError::Field("FromUserName"))?,
    };
    let create_time = field("CreateTime")?
        .parse::<i64>()
        .map_err(|_| PushParseError::Field("CreateTime"))?;
    let template = |item: &BTreeMap<String, String>| {
        item.get("TemplateId")
            .and_then(|t| TemplateId::parse(t.trim()).ok())
            .ok_or(PushParseError::Field("TemplateId"))
    };
    let choice =
        |item: &BTreeMap<String, String>| match item.get("SubscribeStatusString").map(|s| s.trim())
        {
            Some("accept") => Ok(Choice::Accept),
            Some("reject") => Ok(Choice::Reject),
            _ => Err(PushParseError::Field("SubscribeStatusString")),
        };
    let event = match (msg_type.as_str(), event_name.as_deref()) {
        ("event", Some("subscribe_msg_popup_event")) => PushEvent::Popup(
            flat.items
                .iter()
                .map(|i| {
                    Ok(PopupItem {
                        template_id: template(i)?,
                        choice: choice(i)?,
                        scene: i.get("PopupScene").and_then(|s| s.trim().parse().ok()),
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        ("event", Some("subscribe_msg_change_event")) => PushEvent::Change(
            flat.items
                .iter()
                .map(|i| {
                    Ok(ChangeItem {
                        template_id: template(i)?,
                        choice: choice(i)?,
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        ("event", Some("subscribe_msg_sent_event")) => PushEvent::Sent(
            flat.items
                .iter()
                .map(|i| {
                    Ok(SentItem {
                        template_id: template(i)?,
                        msgid: i
                            .get("MsgID")
                            .and_then(|m| m.trim().parse().ok())
                            .ok_or(PushParseError::Field("MsgID"))?,
                        error_code: i
                            .get("ErrorCode")
                            .and_then(|c| c.trim().parse().ok())
                            .ok_or(PushParseError::Field("ErrorCode"))?,
                        error_status: i.get("ErrorStatus").cloned().unwrap_or_default(),
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        _ => match erasure {
            Some(cause) => PushEvent::Erasure(cause),
            None => PushEvent::Other {
                msg_type,
                event: event_name.unwrap_or_default(),
            },
        },
    };
    if matches!(&event, PushEvent::Popup(v) if v.is_empty())
        || matches!(&event, PushEvent::Change(v) if v.is_empty())
        || matches!(&event, PushEvent::Sent(v) if v.is_empty())
    {
        return Err(PushParseError::Field("List"));
    }
    Ok(PushMessage {
        to_user: flat.fields.get("ToUserName").cloned().unwrap_or_default(),
        openid,
        create_time,
        event,
    })
}

/// The account a verified push body is addressed to (its `ToUserName`), read before
/// anything else of it; `None` when the body cannot be read that far.
pub fn addressee(body: &str, format: Format) -> Option<String> {
    flatten(body, format)
        .ok()
        .and_then(|flat| flat.fields.get("ToUserName").cloned())
}

fn flatten(body: &str, format: Format) -> Result<Flat, PushParseError> {
    match format {
        Format::Json => flatten_json(body),
        Format::Xml => flatten_xml(body),
    }
}

/// A JSON scalar as text (numbers exactly as written).
fn scalar(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn flatten_json(body: &str) -> Result<Flat, PushParseError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|_| PushParseError::Malformed("JSON"))?;
    let object = value.as_object().ok_or(PushParseError::Malformed("JSON"))?;
    let mut flat = Flat::default();
    let mut list = None;
    for (key, value) in object {
        if key == "List" {
            list = Some(value);
        } else if let Some(text) = scalar(value) {
            flat.fields.insert(key.clone(), text);
        } else if let Some(inner) = value.get("List") {
            // Lenient: a wrapper object as in the XML.
            list = list.or(Some(inner));
        }
    }
    let items: Vec<&serde_json::Value> = match list {
        None => Vec::new(),
        Some(serde_json::Value::Array(items)) => items.iter().collect(),
        Some(item @ serde_json::Value::Object(_)) => vec![item],
        Some(_) => return Err(PushParseError::Field("List")),
    };
    for item in items {
        let object = item.as_object().ok_or(PushParseError::Field("List"))?;
        flat.items.push(
            object
                .iter()
                .filter_map(|(k, v)| scalar(v).map(|v| (k.clone(), v)))
                .collect(),
        );
    }
    Ok(flat)
}

fn flatten_xml(body: &str) -> Result<Flat, PushParseError> {
    let malformed = |_| PushParseError::Malformed("XML");
    let mut reader = quick_xml::Reader::from_str(body);
    let mut flat = Flat::default();
    // Open elements, outermost first; the item being read while inside a `List`.
    let mut path: Vec<String> = Vec::new();
    let mut item: Option<BTreeMap<String, String>> = None;
    let mut text = String::new();
    let mut seen_root = false;
    loop {
        match reader.read_event().map_err(malformed)? {
            Event::Start(start) => {
                let name = String::from_utf8_lossy(start.local_name().as_ref()).to_string();
                if path.is_empty() {
                    if seen_root || name != "xml" {
                        return Err(PushParseError::Malformed("XML"));
                    }
                    seen_root = true;
                }
                if name == "List" && !path.is_empty() {
                    item = Some(BTreeMap::new());
                }
                path.push(name);
                text.clear();
            }
            Event::End(_) => {
                let name = path.pop().ok_or(PushParseError::Malformed("XML"))?;
                if name == "List" {
                    if let Some(done) = item.take() {
                        flat.items.push(done);
                    }
                } else if let Some(open) = item.as_mut() {
                    open.insert(name, std::mem::take(&mut text));
                } else if path.len() == 1 {
                    flat.fields.insert(name, std::mem::take(&mut text));
                }
                text.clear();
            }
            Event::Empty(start) => {
                let name = String::from_utf8_lossy(start.local_name().as_ref()).to_string();
                match item.as_mut() {
                    Some(open) => {
                        open.insert(name, String::new());
                    }
                    None if path.len() == 1 => {
                        flat.fields.insert(name, String::new());
                    }
                    None => {}
                }
            }
            Event::Text(t) => {
                let raw = t.decode().map_err(|_| PushParseError::Malformed("XML"))?;
                text.push_str(&raw);
            }
            Event::CData(c) => {
                let raw = c.decode().map_err(|_| PushParseError::Malformed("XML"))?;
                text.push_str(&raw);
            }
            Event::GeneralRef(r) => {
                let name = r.decode().map_err(|_| PushParseError::Malformed("XML"))?;
                let reference = format!("&{name};");
                let resolved = quick_xml::escape::unescape(&reference)
                    .map_err(|_| PushParseError::Malformed("XML"))?;
                text.push_str(&resolved);
            }
            Event::DocType(_) => return Err(PushParseError::Malformed("XML")),
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => break,
        }
    }
    if !seen_root || !path.is_empty() {
        return Err(PushParseError::Malformed("XML"));
    }
    Ok(flat)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENID: &str = "otFpruAK8D-E6EfStSYonYSBZ8_4";

    fn template(id: &str) -> TemplateId {
        TemplateId::parse(id).expect("template")
    }

    #[test]
    fn popup_events_read_alike_from_xml_and_json_with_list_as_object_or_array() {
        let xml = format!(
            "<xml><ToUserName><![CDATA[gh_123456789abc]]></ToUserName><FromUserName><![CDATA[{OPENID}]]></FromUserName>\
             <CreateTime>1610969440</CreateTime><MsgType><![CDATA[event]]></MsgType>\
             <Event><![CDATA[subscribe_msg_popup_event]]></Event><SubscribeMsgPopupEvent>\
             <List><TemplateId><![CDATA[tmpl_a]]></TemplateId><SubscribeStatusString><![CDATA[accept]]></SubscribeStatusString><PopupScene>2</PopupScene></List>\
             <List><TemplateId><![CDATA[tmpl_b]]></TemplateId><SubscribeStatusString><![CDATA[reject]]></SubscribeStatusString><PopupScene>2</PopupScene></List>\
             </SubscribeMsgPopupEvent></xml>"
        );
        let json_array = format!(
            r#"{{"ToUserName":"gh_123456789abc","FromUserName":"{OPENID}","CreateTime":"1610969440","MsgType":"event",
                "Event":"subscribe_msg_popup_event",
                "List":[{{"TemplateId":"tmpl_a","SubscribeStatusString":"accept","PopupScene":"2"}},
                        {{"TemplateId":"tmpl_b","SubscribeStatusString":"reject","PopupScene":2}}]}}"#
        );
        let want = PushMessage {
            to_user: "gh_123456789abc".into(),
            openid: OpenId::parse(OPENID).expect("openid"),
            create_time: 1_610_969_440,
            event: PushEvent::Popup(vec![
                PopupItem {
                    template_id: template("tmpl_a"),
                    choice: Choice::Accept,
                    scene: Some(2),
                },
                PopupItem {
                    template_id: template("tmpl_b"),
                    choice: Choice::Reject,
                    scene: Some(2),
                },
            ]),
        };
        assert_eq!(parse(&xml, Format::Xml), Ok(want.clone()));
        assert_eq!(parse(&json_array, Format::Json), Ok(want));

        let json_object = format!(
            r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":1620973045,"MsgType":"event",
                "Event":"subscribe_msg_popup_event",
                "List":{{"TemplateId":"tmpl_a","SubscribeStatusString":"accept","PopupScene":"0"}}}}"#
        );
        let read = parse(&json_object, Format::Json).expect("object list");
        assert_eq!(read.create_time, 1_620_973_045);
        assert_eq!(
            read.event,
            PushEvent::Popup(vec![PopupItem {
                template_id: template("tmpl_a"),
                choice: Choice::Accept,
                scene: Some(0),
            }])
        );
    }

    #[test]
    fn sent_and_change_events_keep_msgids_above_2_53_exactly() {
        let xml = format!(
            "<xml><ToUserName>gh_1</ToUserName><FromUserName>{OPENID}</FromUserName><CreateTime>1700827132</CreateTime>\
             <MsgType>event</MsgType><Event>subscribe_msg_sent_event</Event><SubscribeMsgSentEvent><List>\
             <TemplateId><![CDATA[tmpl_a]]></TemplateId><MsgID>1700827132819554304</MsgID><ErrorCode>0</ErrorCode>\
             <ErrorStatus><![CDATA[success]]></ErrorStatus></List></SubscribeMsgSentEvent></xml>"
        );
        let json = format!(
            r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1700827132","MsgType":"event",
                "Event":"subscribe_msg_sent_event",
                "List":{{"TemplateId":"tmpl_a","MsgID":1864323726461255680,"ErrorCode":"0","ErrorStatus":"success"}}}}"#
        );
        let msgid = |body: &str, format| match parse(body, format).map(|m| m.event) {
            Ok(PushEvent::Sent(items)) => items.first().map(|i| (i.msgid, i.error_code)),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            msgid(&xml, Format::Xml),
            Some((1_700_827_132_819_554_304, 0))
        );
        assert_eq!(
            msgid(&json, Format::Json),
            Some((1_864_323_726_461_255_680, 0))
        );

        let change = format!(
            r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1","MsgType":"event",
                "Event":"subscribe_msg_change_event",
                "List":{{"TemplateId":"tmpl_a","SubscribeStatusString":"reject"}}}}"#
        );
        assert_eq!(
            parse(&change, Format::Json).map(|m| m.event),
            Ok(PushEvent::Change(vec![ChangeItem {
                template_id: template("tmpl_a"),
                choice: Choice::Reject,
            }]))
        );
    }

    #[test]
    fn the_encrypted_field_is_found_in_either_format() {
        let xml = "<xml><ToUserName><![CDATA[gh_1]]></ToUserName><Encrypt><![CDATA[abc+/=]]></Encrypt></xml>";
        assert_eq!(
            encrypted_field(xml, Format::Xml),
            Ok(Some("abc+/=".to_string()))
        );
        let json = r#"{"ToUserName":"gh_1","Encrypt":"abc+/="}"#;
        assert_eq!(
            encrypted_field(json, Format::Json),
            Ok(Some("abc+/=".to_string()))
        );
        assert_eq!(
            encrypted_field(r#"{"ToUserName":"gh_1"}"#, Format::Json),
            Ok(None)
        );
    }

    #[test]
    fn bad_bodies_are_refused_with_their_reason() {
        let ok_fields = format!(
            r#""ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1","MsgType":"event""#
        );
        let cases: Vec<(String, Format, PushParseError)> = vec![
            ("".into(), Format::Json, PushParseError::Malformed("JSON")),
            (
                "[1,2]".into(),
                Format::Json,
                PushParseError::Malformed("JSON"),
            ),
            ("{".into(), Format::Json, PushParseError::Malformed("JSON")),
            (
                "<xml><a>1</b></xml>".into(),
                Format::Xml,
                PushParseError::Malformed("XML"),
            ),
            (
                "<xml><a>1</a>".into(),
                Format::Xml,
                PushParseError::Malformed("XML"),
            ),
            (
                "<root/>".into(),
                Format::Xml,
                PushParseError::Malformed("XML"),
            ),
            (
                "<other><a>1</a></other>".into(),
                Format::Xml,
                PushParseError::Malformed("XML"),
            ),
            (
                "<!DOCTYPE xml [<!ENTITY x \"boom\">]><xml><a>&x;</a></xml>".into(),
                Format::Xml,
                PushParseError::Malformed("XML"),
            ),
            (
                r#"{"ToUserName":"gh_1","CreateTime":"1","MsgType":"event"}"#.into(),
                Format::Json,
                PushParseError::Field("FromUserName"),
            ),
            (
                format!(
                    r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"soon","MsgType":"event"}}"#
                ),
                Format::Json,
                PushParseError::Field("CreateTime"),
            ),
            (
                format!(r#"{{{ok_fields},"Event":"subscribe_msg_popup_event"}}"#),
                Format::Json,
                PushParseError::Field("List"),
            ),
            (
                format!(
                    r#"{{{ok_fields},"Event":"subscribe_msg_popup_event","List":{{"TemplateId":"tmpl_a","SubscribeStatusString":"maybe"}}}}"#
                ),
                Format::Json,
                PushParseError::Field("SubscribeStatusString"),
            ),
            (
                format!(
                    r#"{{{ok_fields},"Event":"subscribe_msg_sent_event","List":{{"TemplateId":"tmpl_a","MsgID":"-1","ErrorCode":"0"}}}}"#
                ),
                Format::Json,
                PushParseError::Field("MsgID"),
            ),
            (
                format!(r#"{{{ok_fields},"Event":"subscribe_msg_change_event","List":"tmpl_a"}}"#),
                Format::Json,
                PushParseError::Field("List"),
            ),
        ];
        for (body, format, want) in cases {
            assert_eq!(parse(&body, format), Err(want), "{body}");
        }
    }

    #[test]
    fn other_pushes_are_read_as_other() {
        let json = format!(
            r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1","MsgType":"text","Content":"hi &amp; bye"}}"#
        );
        assert_eq!(
            parse(&json, Format::Json).map(|m| m.event),
            Ok(PushEvent::Other {
                msg_type: "text".into(),
                event: String::new()
            })
        );
        let xml = format!(
            "<xml><ToUserName>gh_1</ToUserName><FromUserName>{OPENID}</FromUserName><CreateTime>1</CreateTime>\
             <MsgType>event</MsgType><Event>debug_demo</Event><debug_str>a &amp; b</debug_str></xml>"
        );
        assert_eq!(
            parse(&xml, Format::Xml).map(|m| m.event),
            Ok(PushEvent::Other {
                msg_type: "event".into(),
                event: "debug_demo".into()
            })
        );
    }
}
