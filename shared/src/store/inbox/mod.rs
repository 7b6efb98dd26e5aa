//! The inbox: notifications, the unread counter, and the outbox items of their pushes.
//!
//! Ingesting an event is one transaction: the event's idempotency record, the
//! notification, its unread marker, `unread + 1`, and — when a push is asked for and
//! valid — an outbox item due now (on the due index). Marking read flips `read`, deletes
//! the marker and decrements the counter in one transaction conditional on the
//! notification being unread, so the counter is always the number of unread
//! notifications and of markers: it never drifts or goes negative.
//!
//! - [`list`]: pages (bounded reads per call, whatever the filter) and the counter.
//! - [`read`]: marking one or all read, in bounded steps.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::inbox::schedule::{Priority, is_expired};
use crate::domain::text::{clean_line, clean_lines};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{check, put};
use crate::store::items::outbox::is_note_update;
use crate::store::items::outcome::{Origin, outcome_write};
use crate::store::items::query::{Range, partition};
use crate::store::items::{key, parse, rfc3339, s, to_item};
use crate::store::retry::{Attempt, retry_carrying};
use crate::store::tx::{Outcome, Parts};

use crate::store::keys::{event_key, legacy_event_sk, note_sk, user_pk};

use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::domain::inbox::{
    NotificationView, NotifyEvent, Push, PushMoment, PushReason, PushStatus, PushView,
    new_notification_id,
};
use crate::store::items::is_new;

mod cancel;
mod collapse;
mod list;
mod pending;
mod preferences;
mod publish;
mod read;
mod refill;
mod status;

pub use cancel::Cancelled;
pub use list::LIST_BUDGET;
pub use publish::Published;
pub use read::ReadAll;
pub use refill::Refilled;
pub use status::NotificationStatus;

use crate::store::items::expr::{Cond, eq};
use publish::{PushPayload, ScheduledItem};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NoteItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
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
    /// Each status its push reached and when, oldest first (notifications stored before
    /// this was kept have none, or only the later ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) push_history: Vec<PushMoment>,
    /// Its publisher and idempotency key: whom its push's outcomes are told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) publisher: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) idempotency_key: Option<String>,
}

impl NoteItem {
    /// Whom its push's outcomes are told.
    pub(crate) fn origin(&self) -> Option<Origin> {
        Origin::of(&self.publisher, &self.idempotency_key)
    }

    /// Its push's status set to `status` (and `reason`) at `at`, kept in its history.
    pub(crate) fn set_push(
        &mut self,
        status: PushStatus,
        reason: Option<String>,
        at: DateTime<Utc>,
    ) {
        self.push_status = Some(status.as_str().to_string());
        self.push_reason = reason;
        self.push_history.push(PushMoment::new(status, at));
    }

    fn view(&self) -> NotificationView {
        NotificationView {
            id: self.id.clone(),
            kind: self.note_type.clone(),
            // Cleaned again on the way out: notes stored before ingest cleaned them.
            title: clean_line(&self.title),
            body: clean_lines(&self.body),
            page: self.page.clone(),
            read: self.read,
            created_at: self.created_at.clone(),
            push: self
                .push_status
                .as_deref()
                .and_then(PushStatus::parse)
                .map(|status| PushView {
                    status,
                    reason: self.push_reason.as_deref().and_then(PushReason::parse),
                }),
        }
    }
}

/// The marker of an unread notification, with what the filters look at.
#[derive(Debug, Serialize, Deserialize)]
struct UnreadItem {
    pk: String,
    sk: String,
    kind: String,
    note_type: String,
}

/// The idempotency record of an event from a publisher (`EVENT#<publisher>#<key>`);
/// also where a cancel of it is recorded, or marked when it comes first.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EventItem {
    pk: String,
    sk: String,
    kind: String,
    fingerprint: String,
    note_id: String,
    expires_at: i64,
    /// A cancel of its push: [`CANCEL_FIRST`] (it came before the event: the record is
    /// only this mark), [`CANCEL_DONE`] or [`CANCEL_TOO_LATE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cancel: Option<String>,
    /// A cancel's mark only: the salted tag of the user the cancel named (kept outside
    /// the user's partition, it never names them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    openid: Option<String>,
}

/// A cancel came before its event: the record is only this mark.
pub(crate) const CANCEL_FIRST: &str = "first";
/// The event's push was cancelled.
pub(crate) const CANCEL_DONE: &str = "done";
/// A cancel came after the push had gone out (or ended otherwise).
pub(crate) const CANCEL_TOO_LATE: &str = "too_late";
/// A cancel came while an attempt was in flight: recorded for the push's next claim.
pub(crate) const CANCEL_REQUESTED_MARK: &str = "requested";

impl EventItem {
    fn is_cancel_mark(&self) -> bool {
        self.cancel.as_deref() == Some(CANCEL_FIRST) && self.note_id.is_empty()
    }
}

/// How one ingest try ended.
enum Ingest {
    Done(Ingested),
    /// One of the caller's condition checks failed (its index among them): nothing
    /// was written.
    Refused(usize),
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
enum Part {
    /// The event's record (or the cancel mark it replaces): there already, a
    /// duplicate, a conflict, or a mark.
    Record,
    /// The check that no legacy record of the event is there.
    Legacy,
    /// The notification, its push, their keys and counts.
    Write,
    /// An older notification's push status (gone by its retention: no matter).
    Note,
    /// The caller's own check `i` (`Ingest::Refused(i)`).
    Check(usize),
}

/// How ingesting an event ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Ingested {
    Created {
        note_id: String,
        push: Option<PushStatus>,
        /// Why the push is not (yet) sent, as the notification shows it
        /// (`too_many_pending`, `keyword_invalid`, …); absent when it is pending.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// When a scheduled notification appears (and its push is due); absent: now.
        #[serde(skip_serializing_if = "Option::is_none")]
        send_at: Option<String>,
    },
    /// The same event again: nothing changed.
    Duplicate { note_id: String },
    /// The same idempotency key with a different payload: nothing changed.
    Conflict { note_id: String },
    /// The user was erased (`domain::erasure`): nothing stored.
    Erased,
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

impl Store {
    /// A strongly consistent query of `pk`'s items under `prefix`, newest first (the
    /// shape of every inbox listing), keeping those `filter` holds for.
    fn newest_first(
        &self,
        pk: &str,
        prefix: &str,
        filter: Option<Cond>,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        let keys = partition("pk", s(pk)).range("sk", Range::Prefix(prefix.into()));
        let keys = match filter {
            Some(filter) => keys.filter(filter),
            None => keys,
        };
        keys.on(self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true))
            .scan_index_forward(false)
    }

    /// Ingests a notify event (see the module docs). One round trip; two when a cancel
    /// of it came first (its push is then `cancelled` from the start).
    ///
    /// An event with a push first counts the user's open pushes (one query of at most
    /// `PUSHES_PENDING_MAX` index keys): past the cap its push is recorded `rejected`
    /// (`too_many_pending`) and its notification stored all the same.
    pub async fn ingest(
        &self,
        event: &NotifyEvent,
        now: DateTime<Utc>,
    ) -> Result<Ingested, StoreError> {
        let capped = match &event.push {
            Some(Push::Ready { .. }) => {
                let max = self.limits.pushes_pending_max;
                let open = self.pending_pushes(&event.openid, max).await?;
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
        // Only while the user is not erased: a tombstone written meanwhile makes the
        // ingest lose.
        let alive = self.not_erased_check(&event.openid)?;
        match self.ingest_checked(event, capped, &[alive], now).await? {
            Ok(ingested) => Ok(ingested),
            Err(_) => Ok(Ingested::Erased),
        }
    }

    /// [`Store::ingest`] in one transaction with the condition checks `checks`: if one
    /// fails, nothing is written and its index is answered.
    async fn ingest_checked(
        &self,
        event: &NotifyEvent,
        capped: Option<PushReason>,
        checks: &[TransactWriteItem],
        now: DateTime<Utc>,
    ) -> Result<Result<Ingested, usize>, StoreError> {
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
    async fn ingest_as(
        &self,
        event: &NotifyEvent,
        capped: Option<PushReason>,
        now: DateTime<Utc>,
        record_as: Record,
        checks: &[TransactWriteItem],
    ) -> Result<Ingest, StoreError> {
        let cancelled_first = record_as == (Record::ReplaceMark { cancelled: true });
        let pk = user_pk(&event.openid);
        let timing = &event.timing;
        // A scheduled notification's id (and so its place in the inbox) is the instant
        // it appears.
        let publish_at = timing.publish_at(now);
        let note_id = new_notification_id(publish_at);
        let send_by = Some(timing.send_by(publish_at).timestamp_millis());
        let (push_status, push_reason) = match &event.push {
            None => (None, None),
            Some(Push::Ready { .. }) if cancelled_first => (Some(PushStatus::Cancelled), None),
            Some(Push::Ready { .. }) if is_expired(send_by, publish_at) => {
                (Some(PushStatus::Expired), None)
            }
            Some(Push::Ready { .. }) => match capped {
                Some(code) => (Some(PushStatus::Rejected), Some(code.as_str().to_string())),
                None => (Some(PushStatus::Pending), None),
            },
            Some(Push::Rejected { code, .. }) => {
                (Some(PushStatus::Rejected), Some(code.as_str().to_string()))
            }
        };
        let reason = &push_reason.clone();
        let (event_pk, event_sk) = event_key(&event.publisher, &event.idempotency_key);
        let record = EventItem {
            pk: event_pk,
            sk: event_sk,
            kind: "event".into(),
            fingerprint: event.fingerprint.clone(),
            note_id: note_id.clone(),
            // The replay window, and for an event with a push to send never less than
            // a day past its last moment: a cancel or a replacement finds the push as
            // long as it can wait.
            expires_at: match push_status {
                Some(PushStatus::Pending) => (now + self.limits.retention.events)
                    .max(timing.send_by(publish_at) + chrono::Duration::days(1)),
                _ => now + self.limits.retention.events,
            }
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
                    for (i, check) in checks.iter().enumerate() {
                        items.add(Part::Check(i), check.clone());
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
                                Part::Check(i) => Some(i),
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
