//! A recorded WeChat event (the callback's record of one subscription event).

use serde::{Deserialize, Serialize};

use crate::domain::TemplateId;
use crate::domain::callback::{ChangeItem, Choice, PopupItem, PushEvent, PushMessage, SentItem};
use crate::store::keys::openid_of;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PushItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) event: String,
    pub(crate) create_time: i64,
    /// `template:choice` or `template:msgid:errcode` per item.
    pub(crate) items: Vec<String>,
    pub(crate) received_at: String,
    pub(crate) expires_at: i64,
    #[serde(default)]
    pub(crate) applied: bool,
    /// Until applied: on the lease index, due [`APPLY_GRACE`] after it was received, so
    /// an event every apply of which failed (WeChat gives up after three tries) is
    /// applied by the dispatcher's sweep. Removed when it is marked applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_until: Option<i64>,
}

impl PushItem {
    /// The event as recorded, to apply again (the items keep what applying needs).
    pub(crate) fn message(&self) -> Option<PushMessage> {
        let openid = openid_of(&self.pk)?;
        let choice = |c: &str| match c {
            "accept" => Some(Choice::Accept),
            "reject" => Some(Choice::Reject),
            _ => None,
        };
        let pairs = || {
            self.items.iter().map(|i| {
                let (template, rest) = i.split_once(':')?;
                Some((TemplateId::parse(template).ok()?, rest))
            })
        };
        let event = match self.event.as_str() {
            "popup" => PushEvent::Popup(
                pairs()
                    .map(|p| {
                        let (template_id, c) = p?;
                        Some(PopupItem {
                            template_id,
                            choice: choice(c)?,
                            scene: None,
                        })
                    })
                    .collect::<Option<_>>()?,
            ),
            "change" => PushEvent::Change(
                pairs()
                    .map(|p| {
                        let (template_id, c) = p?;
                        Some(ChangeItem {
                            template_id,
                            choice: choice(c)?,
                        })
                    })
                    .collect::<Option<_>>()?,
            ),
            "sent" => PushEvent::Sent(
                pairs()
                    .map(|p| {
                        let (template_id, rest) = p?;
                        let (msgid, errcode) = rest.split_once(':')?;
                        Some(SentItem {
                            template_id,
                            msgid: msgid.parse().ok()?,
                            error_code: errcode.parse().ok()?,
                            error_status: String::new(),
                        })
                    })
                    .collect::<Option<_>>()?,
            ),
            _ => return None,
        };
        Some(PushMessage {
            to_user: String::new(),
            openid,
            create_time: self.create_time,
            event,
        })
    }
}

/// The event's name and its items as stored.
pub(crate) fn describe(event: &PushEvent) -> Option<(&'static str, Vec<String>)> {
    let choice = |c: &Choice| match c {
        Choice::Accept => "accept",
        Choice::Reject => "reject",
    };
    match event {
        PushEvent::Popup(items) => Some((
            "popup",
            items
                .iter()
                .map(|i| format!("{}:{}", i.template_id, choice(&i.choice)))
                .collect(),
        )),
        PushEvent::Change(items) => Some((
            "change",
            items
                .iter()
                .map(|i| format!("{}:{}", i.template_id, choice(&i.choice)))
                .collect(),
        )),
        PushEvent::Sent(items) => Some((
            "sent",
            items
                .iter()
                .map(|i| format!("{}:{}:{}", i.template_id, i.msgid, i.error_code))
                .collect(),
        )),
        PushEvent::Erasure(_) | PushEvent::Other { .. } => None,
    }
}
