//! The inbox: notifications, the unread counter, and the outbox items of their pushes.
//!
//! Ingesting an event is one transaction: the event's idempotency record, the
//! notification, `unread + 1`, and — when a push is asked for and valid — an outbox item
//! due now (on the due index). Marking read flips `read` and decrements the counter in
//! one transaction conditional on the notification being unread, so the counter is
//! always the number of unread notifications: it never drifts or goes negative.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::grants::rfc3339;
use super::item::{key, parse, s};
use super::keys::{INBOX_SK, NOTES, due_pk, event_sk, note_sk, outbox_sk, user_pk};
use super::plans::TxOutcome;
use super::{
    Attempt, MAX_WRITE_ATTEMPTS, Store, StoreError, backoff, classify_sdk_error, corrupt,
    retry_contended,
};
use crate::domain::OpenId;
use crate::domain::inbox::{
    NotificationView, NotifyEvent, Push, PushStatus, PushView, new_notification_id,
};
use crate::domain::outcome::OutboxState;

/// How long an event's idempotency record is kept (replays within it are no-ops).
pub const EVENT_RETENTION: Duration = Duration::days(35);
/// Most notifications one read-all transaction flips (plus the counter).
const READ_ALL_CHUNK: usize = 98;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct NoteItem {
    pub(super) pk: String,
    pub(super) sk: String,
    kind: String,
    id: String,
    note_type: String,
    title: String,
    body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    page: Option<String>,
    read: bool,
    created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    push_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    push_reason: Option<String>,
}

impl NoteItem {
    fn view(&self) -> NotificationView {
        NotificationView {
            id: self.id.clone(),
            kind: self.note_type.clone(),
            title: self.title.clone(),
            body: self.body.clone(),
            page: self.page.clone(),
            read: self.read,
            created_at: self.created_at.clone(),
            push: self
                .push_status
                .as_deref()
                .and_then(PushStatus::parse)
                .map(|status| PushView {
                    status,
                    reason: self.push_reason.clone(),
                }),
        }
    }
}

/// The outbox item of a push: what to send, and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct OutboxItem {
    pub(super) pk: String,
    pub(super) sk: String,
    pub(super) kind: String,
    pub(super) note_id: String,
    pub(super) template_id: String,
    pub(super) data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) page: Option<String>,
    pub(super) state: OutboxState,
    #[serde(default)]
    pub(super) attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) due_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) due_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) delivery_id: Option<String>,
    pub(super) version: u64,
    pub(super) updated_at: String,
}

impl OutboxItem {
    /// This item, pending again at `due` (on the due index) or in a final `state`.
    pub(super) fn moved(
        &self,
        state: OutboxState,
        due: Option<DateTime<Utc>>,
        shards: u32,
        now: DateTime<Utc>,
    ) -> Self {
        let mut next = self.clone();
        next.state = state;
        next.due_at = due.map(|d| d.timestamp_millis());
        next.due_pk = due.map(|_| due_pk(&self.pk, &self.sk, shards));
        next.delivery_id = None;
        next.version = self.version + 1;
        next.updated_at = rfc3339(now);
        next
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct EventItem {
    pk: String,
    sk: String,
    kind: String,
    fingerprint: String,
    note_id: String,
    expires_at: i64,
}

/// How ingesting an event ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Ingested {
    Created {
        note_id: String,
        push: Option<PushStatus>,
    },
    /// The same event again: nothing changed.
    Duplicate { note_id: String },
    /// The same idempotency key with a different payload: nothing changed.
    Conflict { note_id: String },
}

/// One page of the inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Page {
    pub items: Vec<NotificationView>,
    pub next_cursor: Option<String>,
}

/// Filters for listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub read: Option<bool>,
    pub kind: Option<String>,
}

/// The conditional Put of a whole item, versioned.
pub(super) fn versioned_put(
    table: &str,
    item: HashMap<String, AttributeValue>,
    version: u64,
) -> Result<TransactWriteItem, StoreError> {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("version = :v")
        .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
        .build()
        .map_err(|e| StoreError::Sdk(Box::new(e)))?;
    Ok(TransactWriteItem::builder().put(put).build())
}

/// Sets a notification's push status (part of a transaction).
pub(super) fn note_push_update(
    table: &str,
    pk: &str,
    note_id: &str,
    status: PushStatus,
    reason: Option<&str>,
) -> Result<TransactWriteItem, StoreError> {
    let update = Update::builder()
        .table_name(table)
        .set_key(Some(key(pk, &note_sk(note_id))))
        .update_expression("SET push_status = :s, push_reason = :r")
        .expression_attribute_values(":s", s(status.as_str()))
        .expression_attribute_values(
            ":r",
            reason.map_or(AttributeValue::Null(true), |r| {
                s(r.chars().take(300).collect::<String>())
            }),
        )
        .build()
        .map_err(|e| StoreError::Sdk(Box::new(e)))?;
    Ok(TransactWriteItem::builder().update(update).build())
}

impl Store {
    /// Ingests a notify event (see the module docs). One round trip.
    pub async fn ingest(
        &self,
        event: &NotifyEvent,
        now: DateTime<Utc>,
    ) -> Result<Ingested, StoreError> {
        let pk = user_pk(&event.openid);
        let note_id = new_notification_id(now);
        let (push_status, push_reason) = match &event.push {
            None => (None, None),
            Some(Push::Ready { .. }) => (Some(PushStatus::Pending), None),
            Some(Push::Rejected { reason }) => (Some(PushStatus::Rejected), Some(reason.clone())),
        };
        let record = EventItem {
            pk: pk.clone(),
            sk: event_sk(&event.idempotency_key),
            kind: "event".into(),
            fingerprint: event.fingerprint.clone(),
            note_id: note_id.clone(),
            expires_at: (now + EVENT_RETENTION).timestamp(),
        };
        let note = NoteItem {
            pk: pk.clone(),
            sk: note_sk(&note_id),
            kind: "note".into(),
            id: note_id.clone(),
            note_type: event.kind.clone(),
            title: event.title.clone(),
            body: event.body.clone(),
            page: event.page.clone(),
            read: false,
            created_at: rfc3339(now),
            push_status: push_status.map(|p| p.as_str().to_string()),
            push_reason,
        };
        let counter = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(&pk, INBOX_SK)))
            .update_expression("SET kind = :kind ADD unread :one")
            .expression_attribute_values(":kind", s("inbox"))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        let mut items = vec![
            self.put_new(serde_dynamo::to_item(&record).map_err(|e| corrupt("event", e))?)?,
            self.put_new(serde_dynamo::to_item(&note).map_err(|e| corrupt("note", e))?)?,
            TransactWriteItem::builder().update(counter).build(),
        ];
        if let Some(Push::Ready {
            template_id,
            data,
            page,
        }) = &event.push
        {
            let sk = outbox_sk(&note_id);
            let outbox = OutboxItem {
                due_pk: Some(due_pk(&pk, &sk, self.shards)),
                due_at: Some(now.timestamp_millis()),
                pk: pk.clone(),
                sk,
                kind: "outbox".into(),
                note_id: note_id.clone(),
                template_id: template_id.to_string(),
                data: data.clone(),
                page: page.clone(),
                state: OutboxState::Pending,
                attempts: 0,
                delivery_id: None,
                version: 1,
                updated_at: rfc3339(now),
            };
            items.push(
                self.put_new(serde_dynamo::to_item(&outbox).map_err(|e| corrupt("outbox", e))?)?,
            );
        }
        let (items, note_id) = (&items, &note_id);
        retry_contended("ingest", || async move {
            match self.transact(items.clone()).await? {
                TxOutcome::Committed => {
                    return Ok(Attempt::Done(Ingested::Created {
                        note_id: note_id.clone(),
                        push: push_status,
                    }));
                }
                TxOutcome::Cancelled(reasons) => {
                    if let Some((code, Some(old))) = reasons.first()
                        && code == "ConditionalCheckFailed"
                    {
                        let old: EventItem = parse("event", old.clone())?;
                        return Ok(Attempt::Done(if old.fingerprint == event.fingerprint {
                            Ingested::Duplicate {
                                note_id: old.note_id,
                            }
                        } else {
                            Ingested::Conflict {
                                note_id: old.note_id,
                            }
                        }));
                    }
                }
                TxOutcome::Contended => {}
            }
            Ok(Attempt::Retry)
        })
        .await
    }

    /// A page of `openid`'s notifications, newest first, after `after` (a notification
    /// id from a cursor). Pages come from the caller's partition only.
    pub async fn notifications(
        &self,
        openid: &OpenId,
        limit: usize,
        after: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Page, StoreError> {
        let pk = user_pk(openid);
        let mut items: Vec<NotificationView> = Vec::new();
        let mut start = after.map(|id| key(&pk, &note_sk(id)));
        let mut more = false;
        for _ in 0..20 {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .scan_index_forward(false)
                .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                .expression_attribute_values(":pk", s(&pk))
                .expression_attribute_values(":prefix", s(NOTES))
                .limit(i32::try_from(limit).unwrap_or(100))
                .set_exclusive_start_key(start.take());
            let mut conditions = Vec::new();
            if let Some(read) = filter.read {
                conditions.push("#read = :read");
                query = query
                    .expression_attribute_names("#read", "read")
                    .expression_attribute_values(":read", AttributeValue::Bool(read));
            }
            if let Some(kind) = &filter.kind {
                conditions.push("note_type = :type");
                query = query.expression_attribute_values(":type", s(kind));
            }
            if !conditions.is_empty() {
                query = query.filter_expression(conditions.join(" AND "));
            }
            let out = query
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            for item in out.items() {
                if items.len() == limit {
                    more = true;
                    break;
                }
                let note: NoteItem = parse("note", item.clone())?;
                items.push(note.view());
            }
            match out.last_evaluated_key() {
                Some(last) if items.len() < limit => start = Some(last.clone()),
                Some(_) => {
                    more = true;
                    break;
                }
                None => break,
            }
        }
        let next_cursor = (more && !items.is_empty())
            .then(|| {
                items
                    .last()
                    .map(|n| crate::domain::inbox::encode_cursor(&n.id))
            })
            .flatten();
        Ok(Page { items, next_cursor })
    }

    /// The unread counter (one strongly consistent read; never a count query).
    pub async fn unread(&self, openid: &OpenId) -> Result<u64, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(&user_pk(openid), INBOX_SK)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify_sdk_error(e, |_| false))?;
        Ok(out
            .item()
            .and_then(|i| i.get("unread"))
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<i64>().ok())
            .map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    /// Marks one notification read (idempotent). `None` if the caller has no such
    /// notification.
    pub async fn mark_read(
        &self,
        openid: &OpenId,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<NotificationView>, StoreError> {
        let pk = &user_pk(openid);
        retry_contended("mark read", || async move {
            let flip = Update::builder()
                .table_name(&self.table)
                .set_key(Some(key(pk, &note_sk(id))))
                .update_expression("SET #read = :true, read_at = :now")
                .condition_expression("attribute_exists(pk) AND #read = :false")
                .expression_attribute_names("#read", "read")
                .expression_attribute_values(":true", AttributeValue::Bool(true))
                .expression_attribute_values(":false", AttributeValue::Bool(false))
                .expression_attribute_values(":now", s(rfc3339(now)))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build()
                .map_err(|e| StoreError::Sdk(Box::new(e)))?;
            let counter = self.unread_change(pk, -1)?;
            match self
                .transact(vec![
                    TransactWriteItem::builder().update(flip).build(),
                    counter,
                ])
                .await?
            {
                TxOutcome::Committed => {
                    let got = self
                        .client
                        .get_item()
                        .table_name(&self.table)
                        .set_key(Some(key(pk, &note_sk(id))))
                        .consistent_read(true)
                        .send()
                        .await
                        .map_err(|e| classify_sdk_error(e, |_| false))?;
                    return got
                        .item
                        .map(|i| parse::<NoteItem>("note", i).map(|n| n.view()))
                        .transpose()
                        .map(Attempt::Done);
                }
                TxOutcome::Cancelled(reasons) => match reasons.first() {
                    Some((code, old)) if code == "ConditionalCheckFailed" => {
                        // Absent: not the caller's. Present: already read.
                        return old
                            .clone()
                            .map(|i| parse::<NoteItem>("note", i).map(|n| n.view()))
                            .transpose()
                            .map(Attempt::Done);
                    }
                    _ => {}
                },
                TxOutcome::Contended => {}
            }
            Ok(Attempt::Retry)
        })
        .await
    }

    fn unread_change(&self, pk: &str, by: i64) -> Result<TransactWriteItem, StoreError> {
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, INBOX_SK)))
            .update_expression("SET kind = :kind ADD unread :by")
            .expression_attribute_values(":kind", s("inbox"))
            .expression_attribute_values(":by", AttributeValue::N(by.to_string()))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Marks every unread notification read; returns how many it flipped.
    pub async fn read_all(&self, openid: &OpenId, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let pk = user_pk(openid);
        let mut updated = 0u64;
        let mut attempt = 0;
        loop {
            let mut unread = Vec::new();
            let mut pages = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                .filter_expression("#read = :false")
                .expression_attribute_names("#read", "read")
                .expression_attribute_values(":pk", s(&pk))
                .expression_attribute_values(":prefix", s(NOTES))
                .expression_attribute_values(":false", AttributeValue::Bool(false))
                .projection_expression("sk")
                .into_paginator()
                .items()
                .send();
            while let Some(item) = pages.next().await {
                let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
                if let Some(sk) = item.get("sk").and_then(|v| v.as_s().ok()) {
                    unread.push(sk.clone());
                }
                if unread.len() == READ_ALL_CHUNK {
                    break;
                }
            }
            if unread.is_empty() {
                return Ok(updated);
            }
            let mut items = Vec::with_capacity(unread.len() + 1);
            for sk in &unread {
                let flip = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(&pk, sk)))
                    .update_expression("SET #read = :true, read_at = :now")
                    .condition_expression("#read = :false")
                    .expression_attribute_names("#read", "read")
                    .expression_attribute_values(":true", AttributeValue::Bool(true))
                    .expression_attribute_values(":false", AttributeValue::Bool(false))
                    .expression_attribute_values(":now", s(rfc3339(now)))
                    .build()
                    .map_err(|e| StoreError::Sdk(Box::new(e)))?;
                items.push(TransactWriteItem::builder().update(flip).build());
            }
            items.push(self.unread_change(&pk, -i64::try_from(unread.len()).unwrap_or(0))?);
            match self.transact(items).await? {
                TxOutcome::Committed => updated += unread.len() as u64,
                TxOutcome::Cancelled(_) | TxOutcome::Contended => {
                    // Some were read meanwhile: look again.
                    attempt += 1;
                    if attempt > MAX_WRITE_ATTEMPTS {
                        return Err(StoreError::Unavailable(
                            "read-all contended past the retry limit".into(),
                        ));
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
    }
}
