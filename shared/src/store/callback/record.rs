//! WeChat's message pushes, recorded once.
//!
//! A verified push is written in one transaction: its nonce (so the same request again
//! is refused as a replay; kept past the timestamp window) and the event, keyed by
//! (user, event, WeChat's create time, items), so WeChat's retries of one event —
//! up to three, when an answer takes over 5 s — change nothing. What each event does
//! to deliveries, grants and plans is applied on top of this record.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::TemplateId;
use crate::domain::callback::PushMessage;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::event::{PushItem, describe};
use crate::store::items::{is_there, rfc3339, text, to_item};
use crate::store::keys::{lease_pk, user_pk};
use crate::store::retry::{Attempt, retry_contended};
use crate::store::tx::{Outcome, Parts};

use crate::store::items::change::{change, update};
use crate::store::items::key as key_of;

/// How long a nonce is remembered: past the timestamp window on either side.
pub const NONCE_MEMORY: Duration = Duration::minutes(15);

/// How recording a push ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushRecorded {
    /// New: recorded, to be applied (then [`Store::push_applied`]).
    Recorded(PushKey),
    /// The same event again (WeChat retrying): applied already, or not yet (the first
    /// attempt stopped in between) and so to be applied now.
    Duplicate { key: PushKey, applied: bool },
    /// The same request (timestamp and nonce) again: nothing to do.
    Replayed,
    /// Not a subscription event: nothing to record or apply.
    Ignored,
    /// An event of a user who was erased: nothing recorded or applied.
    Erased,
}

/// Where a recorded push is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushKey {
    pub(crate) pk: String,
    pub(crate) sk: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct NonceItem {
    pk: String,
    sk: String,
    kind: String,
    expires_at: i64,
    /// The event the request carried, so WeChat retrying with the same nonce is told
    /// from a replay: its key's salted tag (the key names the user, and a nonce lives
    /// outside the user's partition, where an erasure does not look).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event: Option<String>,
}

fn nonce_item(
    timestamp: &str,
    nonce: &str,
    event: Option<String>,
    now: DateTime<Utc>,
) -> NonceItem {
    NonceItem {
        pk: format!("PUSHNONCE#{timestamp}#{nonce}"),
        sk: "NONCE".into(),
        kind: "nonce".into(),
        expires_at: (now + NONCE_MEMORY).timestamp(),
        event,
    }
}

/// How long after an event is received the sweep applies it if nothing has: past
/// WeChat's own retries (three, 5 s apart), so it does not race them.
pub const APPLY_GRACE: Duration = Duration::seconds(60);

/// The parts of recording a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// The request's nonce: there already, a replay (or WeChat's retry of this event,
    /// when it names it).
    Nonce,
    /// The event's own record: there already, this event again.
    Push,
    /// A popup accept's mark for pairing.
    Tap,
    /// The user is not erased.
    Alive,
}

impl Store {
    /// Remembers a verified request's nonce (a plain-mode URL verification, pushes that
    /// are not subscription events); false if it was seen before (a replay).
    pub async fn record_nonce(
        &self,
        timestamp: &str,
        nonce: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let item = to_item("nonce", &nonce_item(timestamp, nonce, None, now))?;
        let put = self.put_new(item)?;
        let put = &put;
        retry_contended("nonce", self.limits.write_budget, || async move {
            let nonce = Parts::new().with(Record::Nonce, put.clone());
            Ok(match self.transact_parts(&nonce).await? {
                Outcome::Committed => Attempt::Done(true),
                Outcome::Cancelled(failed) if failed.has(Record::Nonce) => Attempt::Done(false),
                Outcome::Cancelled(_) | Outcome::Contended | Outcome::Conflict => Attempt::Retry,
            })
        })
        .await
    }

    /// Records a verified push (see the module docs); `timestamp` and `nonce` are the
    /// request's. Pushes that are not subscription events only have their nonce kept.
    /// A popup's accepts of `taps` (the configured templates among them) leave their
    /// marks for confirming grants (`store::taps`) in the same transaction, so
    /// once however often WeChat retries.
    pub async fn record_push(
        &self,
        timestamp: &str,
        nonce: &str,
        message: &PushMessage,
        taps: &[&TemplateId],
        now: DateTime<Utc>,
    ) -> Result<PushRecorded, StoreError> {
        let Some((event, items)) = describe(&message.event) else {
            return Ok(if self.record_nonce(timestamp, nonce, now).await? {
                PushRecorded::Ignored
            } else {
                PushRecorded::Replayed
            });
        };
        let record = PushItem {
            pk: user_pk(&message.openid),
            // The items too: two sends of one template in the same second are two
            // events (their msgids differ), a retry of one is the same.
            sk: format!(
                "{}{event}#{}#{}",
                crate::store::keys::EVENT_PREFIX,
                message.create_time,
                items.join(",")
            ),
            kind: "push".into(),
            event: event.into(),
            create_time: message.create_time,
            items,
            received_at: rfc3339(now),
            expires_at: (now + self.limits.retention.events).timestamp(),
            applied: false,
            lease_pk: None,
            lease_until: Some((now + APPLY_GRACE).timestamp_millis()),
        };
        let record = PushItem {
            // Spread by user and event, so a burst of one template's events is not one
            // index partition.
            lease_pk: Some(lease_pk(
                &format!("{}{}", record.pk, record.sk),
                self.shards,
            )),
            ..record
        };
        let key = PushKey {
            pk: record.pk.clone(),
            sk: record.sk.clone(),
        };
        let event_tag = self.tag(&format!("{}\n{}", key.pk, key.sk));
        let nonce = nonce_item(timestamp, nonce, Some(event_tag.clone()), now);
        let mut writes = Parts::new()
            .with(Record::Alive, self.not_erased_check(&message.openid)?)
            .with(Record::Nonce, self.put_new(to_item("nonce", &nonce)?)?)
            .with(Record::Push, self.put_new(to_item("push", &record)?)?);
        for template in taps {
            writes.add(
                Record::Tap,
                self.popup_tap(&record.pk, template, message.create_time, now)?,
            );
        }
        let (writes, key, event_tag) = (&writes, &key, &event_tag);
        retry_contended("push record", self.limits.write_budget, || async move {
            Ok(match self.transact_parts(writes).await? {
                Outcome::Committed => Attempt::Done(PushRecorded::Recorded(key.clone())),
                Outcome::Cancelled(failed) if failed.has(Record::Alive) => {
                    Attempt::Done(PushRecorded::Erased)
                }
                Outcome::Cancelled(failed) => {
                    // (A nonce written before tags named the event's key itself.)
                    let same_event = failed.old(Record::Nonce).is_some_and(|old| {
                        text(old, "event") == Some(event_tag.as_str())
                            || (text(old, "event_pk") == Some(key.pk.as_str())
                                && text(old, "event_sk") == Some(key.sk.as_str()))
                    });
                    if failed.has(Record::Nonce) && !same_event {
                        // Another request's nonce: a replay.
                        Attempt::Done(PushRecorded::Replayed)
                    } else if failed.has(Record::Nonce) || failed.has(Record::Push) {
                        // This event again (WeChat retrying, with the same nonce or a
                        // new one): applied yet?
                        Attempt::Done(PushRecorded::Duplicate {
                            key: key.clone(),
                            applied: self.is_applied(key).await?,
                        })
                    } else {
                        Attempt::Retry
                    }
                }
                Outcome::Contended | Outcome::Conflict => Attempt::Retry,
            })
        })
        .await
    }

    async fn is_applied(&self, key: &PushKey) -> Result<bool, StoreError> {
        let got = self.get(&key.pk, &key.sk).await?;
        Ok(got
            .as_ref()
            .and_then(|i| i.get("applied"))
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false))
    }

    /// Marks a recorded push applied, so a retry of it does nothing.
    pub async fn push_applied(&self, key: &PushKey) -> Result<(), StoreError> {
        let applied = change()
            .set(
                "applied",
                aws_sdk_dynamodb::types::AttributeValue::Bool(true),
            )
            .remove("lease_pk")
            .remove("lease_until");
        let applied = update(&self.table, key_of(&key.pk, &key.sk), applied)
            .when(is_there())
            .apply(&self.client)
            .await?;
        if applied {
            Ok(())
        } else {
            // (An internal error, as before: a record is never deleted before it applies.)
            Err(StoreError::Corrupt(
                "a recorded push gone before it applied".into(),
            ))
        }
    }
}
