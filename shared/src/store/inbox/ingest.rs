//! Ingesting a notify event: one transaction of the event's idempotency record, the
//! notification, its unread marker, `unread + 1` and — with a valid push — its outbox
//! item (see the folder's docs).

use std::convert::Infallible;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::domain::inbox::schedule::is_expired;
use crate::domain::template::Priority;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{check, put};
use crate::store::items::outbox::is_note_update;
use crate::store::items::outcome::outcome_write;
use crate::store::items::{is_new, key, parse, rfc3339, s, to_item};
use crate::store::retry::{Attempt, retry_carrying};
use crate::store::tx::{Outcome, Parts};

use crate::store::keys::{event_key, legacy_event_sk, note_sk, user_pk};

use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::domain::inbox::{NotifyEvent, Push, PushReason, PushStatus, new_notification_id};

use crate::store::inbox::note::{CANCEL_DONE, CANCEL_FIRST, EventItem, Ingested, NoteItem};
use crate::store::inbox::publish::{PushPayload, ScheduledItem};
use crate::store::items::expr::eq;

/// How one ingest try ended.
enum Ingest<C> {
    Done(Ingested),
    /// The caller's condition check of this name failed: nothing was written.
    Refused(C),
    /// The record is a cancel's mark: ingest again replacing it, the push cancelled if
    /// the mark names this event's user.
    Marked {
        cancelled: bool,
    },
    /// The mark this try meant to replace is gone (expired): ingest as new.
    MarkGone,
}

/// How an ingest writes the event's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// A new record (none may exist).
    New,
    /// In place of a cancel's mark; `cancelled`: the push starts `cancelled`.
    ReplaceMark { cancelled: bool },
}

/// The Put replacing a cancel's mark with the event's record (conditional on the mark).
fn replace_cancel_mark(
    table: &str,
    record: crate::store::items::Item,
) -> Result<TransactWriteItem, StoreError> {
    put(table, record)
        .when(eq("cancel", s(CANCEL_FIRST)).and(eq("note_id", s(""))))
        .old_on_failure()
        .write()
}

/// The parts of an ingest's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part<C> {
    /// The event's record (or the cancel mark it replaces): there already, a
    /// duplicate, a conflict, or a mark.
    Record,
    /// The check that no legacy record of the event is there.
    Legacy,
    /// The notification, its push, their keys and counts.
    Write,
    /// An older notification's push status (gone by its retention: no matter).
    Note,
    /// That the user is not erased: a refusal that wins over a record from before.
    Alive,
    /// The caller's own check of this name (`Ingest::Refused`).
    Check(C),
}

impl Store {
    /// Ingests a notify event (see the module docs). One round trip; two when a cancel
    /// of it came first (its push is then `cancelled` from the start).
    ///
    /// An event with a push first counts the user's open pushes from its publisher
    /// (one query of at most `PUSHES_PENDING_MAX` index keys): past the cap its push is
    /// recorded `rejected` (`too_many_pending`) and its notification stored all the
    /// same.
    pub async fn ingest(
        &self,
        event: &NotifyEvent,
        now: DateTime<Utc>,
    ) -> Result<Ingested, StoreError> {
        let capped = match &event.push {
            Some(Push::Ready { .. }) => {
                let max = self.limits.pushes_pending_max;
                let open = self
                    .pending_pushes(&event.openid, &event.publisher, max)
                    .await?;
                let replaces = match &event.collapse_key {
                    Some(key) if open >= max => {
                        self.collapse_replaces(&user_pk(&event.openid), &event.publisher, key)
                            .await?
                    }
                    _ => false,
                };
                crate::domain::inbox::pending::refused(open, max, replaces)
            }
            _ => None,
        };
        let unchecked: &[(Infallible, TransactWriteItem)] = &[];
        match self.ingest_checked(event, capped, unchecked, now).await? {
            Ok(ingested) => Ok(ingested),
            Err(never) => match never {},
        }
    }

    /// [`Store::ingest`] in one transaction with the condition checks `checks`, each
    /// named: if one fails, nothing is written and its name is answered (unless the event's record
    /// is there: a duplicate or a conflict is answered first). Always only while the
    /// user is not erased (a tombstone written meanwhile makes it lose):
    /// `Ingested::Erased`, even over a record from before the erasure.
    pub(crate) async fn ingest_checked<C: Copy + PartialEq>(
        &self,
        event: &NotifyEvent,
        capped: Option<PushReason>,
        checks: &[(C, TransactWriteItem)],
        now: DateTime<Utc>,
    ) -> Result<Result<Ingested, C>, StoreError> {
        let mut record = Record::New;
        // At most: new, then replacing a mark, then new again if the mark expired.
        for _ in 0..3 {
            match self.ingest_as(event, capped, now, record, checks).await? {
                Ingest::Done(ingested) => return Ok(Ok(ingested)),
                Ingest::Refused(check) => return Ok(Err(check)),
                Ingest::Marked { cancelled } => record = Record::ReplaceMark { cancelled },
                Ingest::MarkGone => record = Record::New,
            }
        }
        Err(StoreError::Corrupt(
            "an event's record kept changing between a mark and none".into(),
        ))
    }

    /// One ingest, writing the event's record as `record` says, with the caller's
    /// condition `checks`; `capped`: why a push that would be pending is refused.
    async fn ingest_as<C: Copy + PartialEq>(
        &self,
        event: &NotifyEvent,
        capped: Option<PushReason>,
        now: DateTime<Utc>,
        record_as: Record,
        checks: &[(C, TransactWriteItem)],
    ) -> Result<Ingest<C>, StoreError> {
        let cancelled_first = record_as == (Record::ReplaceMark { cancelled: true });
        let pk = user_pk(&event.openid);
        let timing = &event.timing;
        // A scheduled notification's id (and so its place in the inbox) is the instant
        // it appears.
        let publish_at = timing.publish_at(now);
        let note_id = new_notification_id(publish_at);
        let send_by = Some(timing.send_by(publish_at).timestamp_millis());
        let expired = is_expired(send_by, publish_at);
        let first = (event.push.as_ref()).map(|p| p.first_status(cancelled_first, expired, capped));
        let push_status = first.map(|(status, _)| status);
        let push_reason = first
            .and_then(|(_, why)| why)
            .map(|why| why.as_str().to_string());
        let reason = &push_reason.clone();
        let (event_pk, event_sk) = event_key(&event.publisher, &event.idempotency_key);
        let record = EventItem {
            pk: event_pk,
            sk: event_sk,
            kind: "event".into(),
            fingerprint: event.fingerprint.clone(),
            note_id: note_id.clone(),
            expires_at: timing
                .record_until(
                    push_status == Some(PushStatus::Pending),
                    publish_at,
                    now,
                    self.limits.retention.events,
                )
                .timestamp(),
            cancel: cancelled_first.then(|| CANCEL_DONE.to_string()),
            openid: None,
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
            created_at: rfc3339(publish_at),
            push_status: None,
            push_reason: None,
            push_history: Vec::new(),
            publisher: Some(event.publisher.clone()),
            idempotency_key: Some(event.idempotency_key.clone()),
        };
        let mut note = note;
        let mut told = None;
        if let Some(status) = push_status {
            // Its first status when it is stored: pending from when it is due (a
            // scheduled one's later), an end (rejected, cancelled, expired) now.
            let at = if status == PushStatus::Pending {
                publish_at.max(now)
            } else {
                now
            };
            note.set_push(status, push_reason.clone(), at);
            // A push that ends as it is stored (rejected, cancelled first, expired) is
            // told at once.
            told = outcome_write(
                &self.table,
                &pk,
                &note_id,
                note.origin().as_ref(),
                (status, push_reason),
                now,
            )?;
        }
        let push = match (&event.push, push_status) {
            (
                Some(Push::Ready {
                    template_id,
                    data,
                    page,
                }),
                Some(PushStatus::Pending),
            ) => Some(PushPayload {
                template_id: template_id.to_string(),
                data: data.clone(),
                page: page.clone(),
                send_by,
                priority: (timing.priority != Priority::default()).then_some(timing.priority),
            }),
            _ => None,
        };
        // Records of events ingested before keys were scoped per publisher sit in the
        // user's partition (kept 35 days): an event redelivered across that change is
        // still a duplicate. Transitional: drop this check 35 days after deploying.
        let legacy = check(
            &self.table,
            key(&pk, &legacy_event_sk(&event.idempotency_key)),
            is_new(),
        )
        .old_on_failure()
        .write()?;
        let record = to_item("event", &record)?;
        let mut items = Parts::new()
            .with(
                Part::Record,
                match record_as {
                    Record::ReplaceMark { .. } => replace_cancel_mark(&self.table, record)?,
                    Record::New => self.put_new(record)?,
                },
            )
            .with(Part::Legacy, legacy);
        if timing.is_scheduled(now) {
            // Kept aside until `send_at`: the dispatcher publishes it then.
            let scheduled = ScheduledItem::new(note, push, publish_at, self.shards);
            items.add(
                Part::Write,
                self.put_new(to_item("scheduled", &scheduled)?)?,
            );
        } else {
            for write in self.published(note, push, publish_at, now)? {
                items.add(Part::Write, write);
            }
        }
        if let Some(told) = told {
            items.add(Part::Write, told);
        }
        let scheduled_for = timing.is_scheduled(now).then(|| rfc3339(publish_at));
        let (items, note_id, scheduled_for) = (&items, &note_id, &scheduled_for);
        let pk = &pk;
        // Set once a try found the older notification of its collapse key removed by its
        // retention: its push is still replaced, without the notification's status.
        let carried = retry_carrying(
            "ingest",
            self.limits.write_budget,
            false,
            |mut no_older_note: bool| async move {
                let decided = async {
                    let mut items = items.clone();
                    if let Some(key) = &event.collapse_key {
                        // Read on each try: a race lost to another event of the key is read
                        // again and its push replaced in turn.
                        let with_note = !no_older_note;
                        for write in self
                            .collapse_writes(pk, &event.publisher, key, note_id, with_note, now)
                            .await?
                        {
                            let role = if is_note_update(&write) {
                                Part::Note
                            } else {
                                Part::Write
                            };
                            items.add(role, write);
                        }
                    }
                    items.add(Part::Alive, self.not_erased_check(&event.openid)?);
                    for (name, check) in checks {
                        items.add(Part::Check(*name), check.clone());
                    }
                    match self.transact_parts(&items).await? {
                        Outcome::Committed => {
                            return Ok(Attempt::Done(Ingest::Done(Ingested::Created {
                                note_id: note_id.clone(),
                                push: push_status,
                                reason: reason.clone(),
                                send_at: scheduled_for.clone(),
                            })));
                        }
                        Outcome::Cancelled(failed) => {
                            // Erased: that wins over a record from before the erasure.
                            if failed.has(Part::Alive) {
                                return Ok(Attempt::Done(Ingest::Done(Ingested::Erased)));
                            }
                            // The event's record or a legacy one, whose fingerprint is the
                            // canonical text itself rather than its hash.
                            let found = [Part::Record, Part::Legacy]
                                .into_iter()
                                .find_map(|part| failed.old(part));
                            if let Some(old) = found {
                                let old: EventItem = parse("event", old.clone())?;
                                if old.is_cancel_mark() {
                                    // A mark for another user (a publisher's mistake) gives way
                                    // without cancelling this user's push.
                                    // (Its user's tag; a mark written before tags, the
                                    // openid itself.)
                                    let tag = self.subject(&event.openid);
                                    let cancelled = old.openid.as_deref().is_none_or(|o| {
                                        o == tag.as_str() || o == event.openid.as_str()
                                    });
                                    return Ok(Attempt::Done(Ingest::Marked { cancelled }));
                                }
                                let same = old.fingerprint == event.fingerprint
                                    || hex::encode(Sha256::digest(old.fingerprint.as_bytes()))
                                        == event.fingerprint;
                                return Ok(Attempt::Done(Ingest::Done(if same {
                                    Ingested::Duplicate {
                                        note_id: old.note_id,
                                    }
                                } else {
                                    Ingested::Conflict {
                                        note_id: old.note_id,
                                    }
                                })));
                            }
                            if let Some(check) = failed.roles().find_map(|part| match part {
                                Part::Check(name) => Some(name),
                                _ => None,
                            }) {
                                return Ok(Attempt::Done(Ingest::Refused(check)));
                            }
                            if failed.has(Part::Record)
                                && matches!(record_as, Record::ReplaceMark { .. })
                            {
                                // The mark expired meanwhile: an ordinary ingest.
                                return Ok(Attempt::Done(Ingest::MarkGone));
                            }
                            if failed.only(|part| part == Part::Note) {
                                no_older_note = true;
                            }
                        }
                        Outcome::Contended | Outcome::Conflict => {}
                    }
                    Ok(Attempt::Retry)
                }
                .await;
                (decided, no_older_note)
            },
        )
        .await;
        carried.0
    }
}
