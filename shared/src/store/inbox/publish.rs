//! Publishing a notification: the writes that make it appear (the notification, its
//! unread marker, `unread + 1`) and make its push due — at ingest for one due now, and
//! at its `send_at` for a scheduled one, which waits until then as a `SCHEDULED#` item
//! on the due index (outside the notifications' prefix, so nothing lists or counts it).
//!
//! The dispatcher publishes a scheduled notification when its due entry comes up: one
//! transaction deletes the scheduled item (conditional on its due instant, so exactly
//! one dispatcher publishes it), writes what ingest would have written, and — when its
//! push may still go — the push's outbox item due at that same instant, which the
//! dispatcher then claims at once through the ordinary claim.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::inbox::PushStatus;
use crate::domain::inbox::cancel::PushFound;
use crate::domain::inbox::schedule::is_expired;
use crate::domain::settle::OutboxState;
use crate::domain::template::Priority;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::note::{NoteItem, UnreadItem};
use crate::store::items::change::delete;
use crate::store::items::expr::eq;
use crate::store::items::outbox::{OutboxItem, Publication};
use crate::store::items::{at_version, key, n, parse, rfc3339, to_item};
use crate::store::keys::{
    due_pk, lane_pk, note_sk, outbox_sk, pending_sk, scheduled_sk, unread_sk,
};
use crate::store::retry::{Attempt, retry_carrying};
use crate::store::tx::{Outcome, Parts, SentTx, TxOutcome};

/// What a notification's push sends, kept until it is due.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PushPayload {
    pub(crate) template_id: String,
    pub(crate) data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) page: Option<String>,
    /// The event's `expires_at`, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send_by: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) priority: Option<Priority>,
}

/// A notification waiting for its `send_at`, with its push (`SCHEDULED#<note id>`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ScheduledItem {
    pk: String,
    sk: String,
    kind: String,
    /// Its push's state for the audit trail: `scheduled` while it waits with it, else
    /// how it ended before the notification was published (`cancelled`, `replaced`);
    /// absent without a push (nothing to audit).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    state: String,
    /// The notification as it will be published.
    pub(super) note: NoteItem,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    push: Option<PushPayload>,
    due_pk: String,
    /// When it is published, epoch ms.
    due_at: i64,
    /// Moved by each write (a cancel, a replacement): publishing is conditional on it.
    #[serde(default = "first_version")]
    version: u64,
    /// The user's partition while it waits with its push: counted on the `pending`
    /// index with the user's open pushes (see `OutboxItem::pending_pk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending_sk: Option<String>,
    /// Its publisher's lane while it waits with its push (see `OutboxItem::lane_pk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lane_pk: Option<String>,
    /// Its notification's type and its push's last moment, beside the nested copies:
    /// the `pending` index projects them for a claim's look at pushes due together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    send_by: Option<i64>,
}

fn first_version() -> u64 {
    1
}

impl ScheduledItem {
    pub(crate) fn new(
        note: NoteItem,
        push: Option<PushPayload>,
        at: DateTime<Utc>,
        shards: u32,
    ) -> Self {
        let sk = scheduled_sk(&note.id);
        let state = match (&push, note.push_status.as_deref()) {
            (Some(_), _) => "scheduled",
            (None, Some(status)) => status,
            (None, None) => "",
        }
        .to_string();
        let pending_pk = push.is_some().then(|| note.pk.clone());
        let lane_pk = match (&push, &note.publisher) {
            (Some(_), Some(publisher)) => Some(lane_pk(publisher, &note.pk)),
            _ => None,
        };
        let (note_type, send_by) = match &push {
            Some(p) => (Some(note.note_type.clone()), p.send_by),
            None => (None, None),
        };
        let pending_sk = push
            .as_ref()
            .map(|p| pending_sk(&p.template_id, p.priority.unwrap_or_default(), &note.id));
        Self {
            due_pk: due_pk(&note.pk, &sk, shards),
            pk: note.pk.clone(),
            sk,
            kind: "scheduled".into(),
            state,
            note,
            push,
            due_at: at.timestamp_millis(),
            version: 1,
            pending_pk,
            pending_sk,
            lane_pk,
            note_type,
            send_by,
        }
    }

    /// Where its push stands: with it, ended already (its status), or none asked.
    pub(crate) fn push_found(&self) -> PushFound {
        if self.push.is_some() {
            return PushFound::Scheduled;
        }
        match self.note.push_status.as_deref().and_then(PushStatus::parse) {
            Some(status) => PushFound::ScheduledEnded(status),
            None => PushFound::None,
        }
    }

    /// This item with its push ended before it was due (`status`: cancelled or
    /// replaced), as written conditional on [`Self::version`].
    pub(crate) fn without_push(&self, status: PushStatus, now: DateTime<Utc>) -> Self {
        let mut next = self.clone();
        next.push = None;
        next.pending_pk = None;
        next.pending_sk = None;
        next.lane_pk = None;
        next.note_type = None;
        next.send_by = None;
        next.note.set_push(status, None, now);
        next.state = status.as_str().to_string();
        next.version = self.version + 1;
        next
    }

    pub(crate) fn version(&self) -> u64 {
        self.version
    }
}

/// How publishing a scheduled notification ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// Listed and counted unread from now; `push`: its push is due now, to be claimed;
    /// `expired`: its push's `expires_at` had passed, so it is recorded `expired`.
    Done { push: bool, expired: bool },
    /// Already published (or changed) by someone else: nothing to do.
    Gone,
    /// The item cannot be read as it is: why.
    Unreadable(String),
}

impl Store {
    /// The writes that publish `note` at `at` (its `created_at`): the notification, its
    /// unread marker, `unread + 1` and, with `push`, the push's outbox item due at
    /// `at` (on the due index).
    pub(crate) fn published(
        &self,
        note: NoteItem,
        push: Option<PushPayload>,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let marker = UnreadItem {
            pk: note.pk.clone(),
            sk: unread_sk(&note.id),
            kind: "unread".into(),
            note_type: note.note_type.clone(),
        };
        let mut items = vec![
            self.put_new(to_item("note", &note)?)?,
            self.put_new(to_item("unread", &marker)?)?,
            self.unread_change(&note.pk, 1)?,
        ];
        if let Some(push) = push {
            let outbox = self.outbox_of(&note, push, at, now);
            items.push(self.put_new(to_item("outbox", &outbox)?)?);
        }
        Ok(items)
    }

    /// The outbox item of `note`'s push, `pending` and due at `at`.
    fn outbox_of(
        &self,
        note: &NoteItem,
        push: PushPayload,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> OutboxItem {
        let sk = outbox_sk(&note.id);
        OutboxItem {
            due_pk: Some(due_pk(&note.pk, &sk, self.shards)),
            due_at: Some(at.timestamp_millis()),
            pk: note.pk.clone(),
            sk,
            kind: "outbox".into(),
            note_id: note.id.clone(),
            template_id: push.template_id,
            data: push.data,
            page: push.page,
            state: OutboxState::Pending,
            attempts: 0,
            delivery_id: None,
            version: 1,
            updated_at: rfc3339(now),
            expires_at: None,
            send_by: push.send_by,
            priority: push.priority,
            note_type: Some(note.note_type.clone()),
            waiting_grant: false,
            pending_pk: Some(note.pk.clone()),
            pending_sk: None,
            lane_pk: None,
            publisher: note.publisher.clone(),
            idempotency_key: note.idempotency_key.clone(),
        }
        .with_pending_sk()
    }

    /// Publishes the scheduled notification `sk` of `pk` whose due entry is at `due`
    /// (see the module docs). A push whose `expires_at` has passed is recorded
    /// `expired` instead of made due.
    pub async fn publish(
        &self,
        pk: &str,
        sk: &str,
        due: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Published, StoreError> {
        // Attempts that may have committed unseen, with what each published: a call
        // that then finds the notification gone asks DynamoDB, by each one's token,
        // whether it was one of them (a publication otherwise counted by no one: seen
        // under load, 10 of 12 counted).
        let carried = retry_carrying(
            "publish",
            self.limits.write_budget,
            Vec::new(),
            |mut unanswered: Vec<(SentTx, Published)>| async move {
                let decided = async {
                    let (scheduled, writes, push, expired) =
                        match self.to_publish(pk, sk, due, now).await? {
                            ToPublish::Ready {
                                scheduled,
                                writes,
                                push,
                                expired,
                            } => (scheduled, writes, push, expired),
                            ToPublish::Done(published) => return Ok(Attempt::Done(published)),
                        };
                    let mut parts = Parts::new().with(Part::Scheduled, *scheduled);
                    for write in writes {
                        parts.add(Part::Publication, write);
                    }
                    let has_push = push.is_some();
                    if let Some(outbox) = push {
                        parts.add(
                            Part::Publication,
                            self.put_new(to_item("outbox", &outbox)?)?,
                        );
                    }
                    let done = Published::Done {
                        push: has_push,
                        expired,
                    };
                    let (outcome, sent) = self.transact_parts_kept(&parts).await?;
                    Ok(match outcome {
                        Outcome::Committed => Attempt::Done(done),
                        // Published by another, or its push cancelled or replaced meanwhile:
                        // read it again.
                        Outcome::Cancelled(failed) if failed.has(Part::Scheduled) => Attempt::Retry,
                        // A notification already where this one goes: published by a try whose
                        // answer was lost (the scheduled item's delete went with it).
                        Outcome::Cancelled(_) => Attempt::Done(Published::Gone),
                        // A conflict: nothing was decided, try again.
                        Outcome::Conflict => Attempt::Retry,
                        Outcome::Contended => {
                            unanswered.push((sent, done));
                            Attempt::Retry
                        }
                    })
                }
                .await;
                (decided, unanswered)
            },
        )
        .await;
        let (outcome, unanswered) = carried;
        let outcome = outcome?;
        if !matches!(outcome, Published::Gone) {
            return Ok(outcome);
        }
        for (sent, published) in unanswered {
            // Committed: that attempt's (DynamoDB's answer for its token). Cancelled:
            // its conditions no longer hold, so another's work.
            match self.resend(&sent).await {
                Ok(TxOutcome::Committed) => return Ok(published),
                Ok(TxOutcome::Cancelled(_)) => {}
                Ok(TxOutcome::Contended) => tracing::warn!(
                    "a publication whose answer was lost could not be asked about; not counted"
                ),
                Err(e) => tracing::warn!(
                    error = %crate::telemetry::error_chain(&e),
                    "a publication whose answer was lost could not be asked about; not counted"
                ),
            }
        }
        Ok(outcome)
    }

    /// The scheduled notification `sk` of `pk`, ready to publish with its push and
    /// claim it in one transaction (`Store::claim_published`): `None` when it has no
    /// push to claim now (none asked, ended, or expired) or is not there as due —
    /// [`Store::publish`] then does what is right.
    pub async fn publication(
        &self,
        pk: &str,
        sk: &str,
        due: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Option<Publication>, StoreError> {
        Ok(match self.to_publish(pk, sk, due, now).await? {
            ToPublish::Ready {
                scheduled,
                writes,
                push: Some(outbox),
                expired: false,
            } => Some(Publication {
                writes: std::iter::once(*scheduled).chain(writes).collect(),
                outbox: *outbox,
            }),
            ToPublish::Ready { .. } | ToPublish::Done(_) => None,
        })
    }

    /// Reads the scheduled notification and decides what publishing it writes: the
    /// scheduled item's conditional delete (a failed condition there means it changed:
    /// read it again), the publication, and the push's outbox item (pending), not
    /// among the writes.
    async fn to_publish(
        &self,
        pk: &str,
        sk: &str,
        due: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<ToPublish, StoreError> {
        let Some(item) = self.get(pk, sk).await? else {
            return Ok(ToPublish::Done(Published::Gone));
        };
        let scheduled: ScheduledItem = match parse("scheduled", item) {
            Ok(scheduled) => scheduled,
            Err(e) => return Ok(ToPublish::Done(Published::Unreadable(e.to_string()))),
        };
        if scheduled.due_at != due.timestamp_millis()
            || scheduled.note.pk != pk
            || note_sk(&scheduled.note.id) != scheduled.note.sk
        {
            return Ok(ToPublish::Done(Published::Gone));
        }
        let mut note = scheduled.note.clone();
        let mut push = scheduled.push.clone();
        let expired = push.as_ref().is_some_and(|p| is_expired(p.send_by, now));
        // Expired before it was published: its outbox item is written `expired`
        // (final), as a claim past `expires_at` leaves it.
        let mut ended = None;
        if expired {
            ended = push.take();
            note.set_push(PushStatus::Expired, None, now);
        }
        let as_read = eq("due_at", n(scheduled.due_at)).and(at_version(scheduled.version));
        let scheduled = Box::new(delete(&self.table, key(pk, sk)).when(as_read).write()?);
        let mut writes = Vec::new();
        let outbox = push.map(|payload| Box::new(self.outbox_of(&note, payload, due, now)));
        if let Some(payload) = ended {
            let outbox = self.outbox_of(&note, payload, due, now).moved(
                OutboxState::Expired,
                None,
                self.shards,
                now,
                self.limits.retention.outbox,
            );
            writes.extend(crate::store::items::outcome::outcome_write(
                &self.table,
                pk,
                &note.id,
                note.origin().as_ref(),
                (PushStatus::Expired, None),
                now,
            )?);
            writes.extend(self.published(note, None, due, now)?);
            writes.push(self.put_new(to_item("outbox", &outbox)?)?);
        } else {
            writes.extend(self.published(note, None, due, now)?);
        }
        Ok(ToPublish::Ready {
            scheduled,
            writes,
            push: outbox,
            expired,
        })
    }
}

/// The parts of a publication's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The scheduled item's delete, at the version and instant read.
    Scheduled,
    /// The notification, its list entries and its push.
    Publication,
}

/// What publishing a scheduled notification writes, as read.
enum ToPublish {
    Ready {
        /// The scheduled item's conditional delete (failed: it changed; read again).
        scheduled: Box<TransactWriteItem>,
        /// The publication's writes.
        writes: Vec<TransactWriteItem>,
        /// Its push's outbox item, pending, due at `send_at`.
        push: Option<Box<OutboxItem>>,
        expired: bool,
    },
    Done(Published),
}
