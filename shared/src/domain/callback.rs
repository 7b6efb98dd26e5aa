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

impl PushEvent {
    /// The templates and choices a popup or change event carries, and whether its
    /// refusals void the template's grants: a change does (turned off in WeChat's
    /// settings, sends now fail with 43101); a popup reject is one tap's answer, as a
    /// reject in a grant report (the plans pause, earlier grants stay).
    pub fn choices(&self) -> (Vec<(&TemplateId, Choice)>, bool) {
        match self {
            Self::Change(items) => (
                items.iter().map(|i| (&i.template_id, i.choice)).collect(),
                true,
            ),
            Self::Popup(items) => (
                items.iter().map(|i| (&i.template_id, i.choice)).collect(),
                false,
            ),
            Self::Sent(_) | Self::Erasure(_) | Self::Other { .. } => (Vec::new(), false),
        }
    }

    /// The templates among `configured` a popup event accepts.
    pub fn popup_accepts(&self, configured: impl Fn(&TemplateId) -> bool) -> Vec<&TemplateId> {
        match self {
            Self::Popup(items) => items
                .iter()
                .filter(|i| i.choice == Choice::Accept && configured(&i.template_id))
                .map(|i| &i.template_id)
                .collect(),
            Self::Change(_) | Self::Sent(_) | Self::Erasure(_) | Self::Other { .. } => Vec::new(),
        }
    }
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
#[path = "callback_tests.rs"]
mod tests;
