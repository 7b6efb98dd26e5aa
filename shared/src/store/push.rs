//! WeChat's message pushes, recorded once.
//!
//! A verified push is written in one transaction: its nonce (so the same request again
//! is refused as a replay; kept past the timestamp window) and the event, keyed by
//! (user, event, WeChat's create time, templates), so WeChat's retries of one event —
//! up to three, when an answer takes over 5 s — change nothing. What each event does
//! to deliveries, grants and plans is applied on top of this record.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::grants::rfc3339;
use super::item::to_item;
use super::keys::user_pk;
use super::plans::{TxOutcome, condition_failed};
use super::{Attempt, Store, StoreError, retry_contended};
use crate::domain::push_event::{Choice, PushEvent, PushMessage};

/// How long a nonce is remembered: past the timestamp window on either side.
pub const NONCE_MEMORY: Duration = Duration::minutes(15);

/// How recording a push ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushRecorded {
    /// New: recorded.
    Recorded,
    /// The same event again (WeChat retrying): nothing changed.
    Duplicate,
    /// The same request (timestamp and nonce) again: nothing changed.
    Replayed,
}

#[derive(Debug, Serialize, Deserialize)]
struct NonceItem {
    pk: String,
    sk: String,
    kind: String,
    expires_at: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct PushItem {
    pk: String,
    sk: String,
    kind: String,
    event: String,
    create_time: i64,
    /// `template:choice` or `template:msgid:errcode` per item.
    items: Vec<String>,
    received_at: String,
    expires_at: i64,
}

/// The event's name and its items as stored.
fn describe(event: &PushEvent) -> Option<(&'static str, Vec<String>)> {
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
        PushEvent::Other { .. } => None,
    }
}

impl Store {
    /// Records a verified push (see the module docs); `timestamp` and `nonce` are the
    /// request's. Pushes that are not subscription events are only acknowledged.
    pub async fn record_push(
        &self,
        timestamp: &str,
        nonce: &str,
        message: &PushMessage,
        now: DateTime<Utc>,
    ) -> Result<PushRecorded, StoreError> {
        let Some((event, items)) = describe(&message.event) else {
            return Ok(PushRecorded::Recorded);
        };
        let nonce = NonceItem {
            pk: format!("PUSHNONCE#{timestamp}#{nonce}"),
            sk: "NONCE".into(),
            kind: "nonce".into(),
            expires_at: (now + NONCE_MEMORY).timestamp(),
        };
        let templates: Vec<&str> = items.iter().filter_map(|i| i.split(':').next()).collect();
        let record = PushItem {
            pk: user_pk(&message.openid),
            sk: format!(
                "PUSH#{event}#{}#{}",
                message.create_time,
                templates.join(",")
            ),
            kind: "push".into(),
            event: event.into(),
            create_time: message.create_time,
            items,
            received_at: rfc3339(now),
            expires_at: (now + self.limits.retention.events).timestamp(),
        };
        let writes = vec![
            self.put_new(to_item("nonce", &nonce)?)?,
            self.put_new(to_item("push", &record)?)?,
        ];
        let writes = &writes;
        retry_contended("push record", || async move {
            Ok(match self.transact(writes.clone()).await? {
                TxOutcome::Committed => Attempt::Done(PushRecorded::Recorded),
                TxOutcome::Cancelled(reasons) => {
                    if condition_failed(&reasons, 0) {
                        Attempt::Done(PushRecorded::Replayed)
                    } else if condition_failed(&reasons, 1) {
                        Attempt::Done(PushRecorded::Duplicate)
                    } else {
                        Attempt::Retry
                    }
                }
                TxOutcome::Contended => Attempt::Retry,
            })
        })
        .await
    }
}
