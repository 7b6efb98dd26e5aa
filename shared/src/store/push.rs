//! WeChat's message pushes, recorded once.
//!
//! A verified push is written in one transaction: its nonce (so the same request again
//! is refused as a replay; kept past the timestamp window) and the event, keyed by
//! (user, event, WeChat's create time, items), so WeChat's retries of one event —
//! up to three, when an answer takes over 5 s — change nothing. What each event does
//! to deliveries, grants and plans is applied on top of this record.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::grants::rfc3339;
use super::item::to_item;
use super::item::{key as key_of, text};
use super::keys::{quota_sk, user_pk};
use super::plans::{TxOutcome, condition_failed};
use super::{Attempt, Store, StoreError, classify_sdk_error, retry_contended};
use crate::domain::plan::Refusal;
use crate::domain::push_event::{Choice, PushEvent, PushMessage};
use crate::domain::reminder::ReminderKinds;
use crate::domain::{OpenId, TemplateId};

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
}

/// Where a recorded push is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushKey {
    pk: String,
    sk: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct NonceItem {
    pk: String,
    sk: String,
    kind: String,
    expires_at: i64,
    /// The event the request carried, so WeChat retrying with the same nonce is told
    /// from a replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event_sk: Option<String>,
}

fn nonce_item(
    timestamp: &str,
    nonce: &str,
    event: Option<&PushKey>,
    now: DateTime<Utc>,
) -> NonceItem {
    NonceItem {
        pk: format!("PUSHNONCE#{timestamp}#{nonce}"),
        sk: "NONCE".into(),
        kind: "nonce".into(),
        expires_at: (now + NONCE_MEMORY).timestamp(),
        event_pk: event.map(|k| k.pk.clone()),
        event_sk: event.map(|k| k.sk.clone()),
    }
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
    #[serde(default)]
    applied: bool,
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
    /// Remembers a verified request's nonce (URL verifications, pushes that are not
    /// subscription events); false if it was seen before (a replay).
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
            Ok(match self.transact(vec![put.clone()]).await? {
                TxOutcome::Committed => Attempt::Done(true),
                TxOutcome::Cancelled(reasons) if condition_failed(&reasons, 0) => {
                    Attempt::Done(false)
                }
                TxOutcome::Cancelled(_) | TxOutcome::Contended => Attempt::Retry,
            })
        })
        .await
    }

    /// Records a verified push (see the module docs); `timestamp` and `nonce` are the
    /// request's. Pushes that are not subscription events only have their nonce kept.
    /// A popup's accepts of `taps` (the configured templates among them) leave their
    /// marks for confirming grants ([`taps`](super::taps)) in the same transaction, so
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
            sk: format!("PUSH#{event}#{}#{}", message.create_time, items.join(",")),
            kind: "push".into(),
            event: event.into(),
            create_time: message.create_time,
            items,
            received_at: rfc3339(now),
            expires_at: (now + self.limits.retention.events).timestamp(),
            applied: false,
        };
        let key = PushKey {
            pk: record.pk.clone(),
            sk: record.sk.clone(),
        };
        let nonce = nonce_item(timestamp, nonce, Some(&key), now);
        let mut writes = vec![
            self.put_new(to_item("nonce", &nonce)?)?,
            self.put_new(to_item("push", &record)?)?,
        ];
        for template in taps {
            writes.push(self.popup_tap(&record.pk, template, message.create_time, now)?);
        }
        let (writes, key) = (&writes, &key);
        retry_contended("push record", self.limits.write_budget, || async move {
            Ok(match self.transact(writes.clone()).await? {
                TxOutcome::Committed => Attempt::Done(PushRecorded::Recorded(key.clone())),
                TxOutcome::Cancelled(reasons) => {
                    let same_event = reasons
                        .first()
                        .and_then(|(_, old)| old.as_ref())
                        .is_some_and(|old| {
                            text(old, "event_pk") == Some(key.pk.as_str())
                                && text(old, "event_sk") == Some(key.sk.as_str())
                        });
                    if condition_failed(&reasons, 0) && !same_event {
                        // Another request's nonce: a replay.
                        Attempt::Done(PushRecorded::Replayed)
                    } else if condition_failed(&reasons, 0) || condition_failed(&reasons, 1) {
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
                TxOutcome::Contended => Attempt::Retry,
            })
        })
        .await
    }

    async fn is_applied(&self, key: &PushKey) -> Result<bool, StoreError> {
        let got = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key_of(&key.pk, &key.sk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify_sdk_error(e, |_| false))?;
        Ok(got
            .item()
            .and_then(|i| i.get("applied"))
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false))
    }

    /// Marks a recorded push applied, so a retry of it does nothing.
    pub async fn push_applied(&self, key: &PushKey) -> Result<(), StoreError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_of(&key.pk, &key.sk)))
            .update_expression("SET applied = :true")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(
                ":true",
                aws_sdk_dynamodb::types::AttributeValue::Bool(true),
            )
            .send()
            .await
            .map_err(|e| classify_sdk_error(e, |_| false))?;
        Ok(())
    }

    /// Puts WeChat's choice for `template`, made at `create_time` (a popup or change
    /// event's item), in WeChat's order: recorded on the template's quota item unless
    /// one made later was applied already. False when it is out of order — a retried
    /// reject arriving after the user's later accept — and then it changes nothing.
    /// The same time again is in order (a retry of the event itself, or a reject and
    /// an accept in one second, where the refusal wins).
    pub async fn order_choice(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        create_time: i64,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_of(&user_pk(openid), &quota_sk(template))))
            // Names the quota item it may create, so it reads as one.
            .update_expression("SET template_id = :t, kind = :kind, #at = :c, updated_at = :now")
            .condition_expression("attribute_not_exists(#at) OR #at <= :c")
            .expression_attribute_names("#at", super::grants::CHOICE_AT)
            .expression_attribute_values(":t", AttributeValue::S(template.to_string()))
            .expression_attribute_values(":kind", AttributeValue::S("quota".into()))
            .expression_attribute_values(":c", AttributeValue::N(create_time.to_string()))
            .expression_attribute_values(":now", AttributeValue::S(rfc3339(now)))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(classify_sdk_error(e, |_| false)),
        }
    }

    /// The user refused `template`: the plans of the kinds that use it pause, as a
    /// refusal in a grant report does; with `void_grants` (turned off in WeChat's
    /// settings, where sends now fail with 43101) its available grants become invalid
    /// too — those reserved by a send in flight included (it consumes one if WeChat took
    /// the message, and never restores it). Idempotent.
    pub async fn refuse_template(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        kinds: &ReminderKinds,
        void_grants: bool,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let pk = &user_pk(openid);
        if void_grants {
            self.void_available(pk, template, now).await?;
        }
        for kind in kinds.using_template(template) {
            self.refuse_plan(openid, kind, Refusal::Reject, now).await?;
        }
        Ok(())
    }

    async fn void_available(
        &self,
        pk: &str,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        retry_contended("refusal", self.limits.write_budget, || async move {
            Ok(
                // Reserved ones too, as a disable does: a send in flight then spends
                // it if WeChat took the message, and can never give it back.
                if self
                    .invalidate_grants(pk, template, None, true, None, now)
                    .await?
                {
                    Attempt::Done(())
                } else {
                    Attempt::Retry
                },
            )
        })
        .await
    }
}
