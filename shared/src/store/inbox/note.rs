//! The inbox's items as stored (a notification, its unread marker, an event's record)
//! and the shapes every inbox step shares: an ingest's answer, a page, a listing's
//! filter, and the newest-first query of a user's items.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::text::{clean_line, clean_lines};
use crate::store::handle::Store;
use crate::store::items::outcome::Origin;
use crate::store::items::query::{Range, partition};
use crate::store::items::s;

use crate::domain::inbox::{NotificationView, PushMoment, PushReason, PushStatus, PushView};

use crate::store::items::expr::Cond;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NoteItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) id: String,
    pub(crate) note_type: String,
    pub(crate) title: String,
    pub(crate) body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) page: Option<String>,
    pub(crate) read: bool,
    pub(crate) created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) push_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) push_reason: Option<String>,
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

    pub(crate) fn view(&self) -> NotificationView {
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
pub(crate) struct UnreadItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) note_type: String,
}

/// The idempotency record of an event from a publisher (`EVENT#<publisher>#<key>`);
/// also where a cancel of it is recorded, or marked when it comes first.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EventItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) fingerprint: String,
    pub(crate) note_id: String,
    pub(crate) expires_at: i64,
    /// A cancel of its push: [`CANCEL_FIRST`] (it came before the event: the record is
    /// only this mark), [`CANCEL_DONE`] or [`CANCEL_TOO_LATE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cancel: Option<String>,
    /// A cancel's mark only: the salted tag of the user the cancel named (kept outside
    /// the user's partition, it never names them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) openid: Option<String>,
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
    pub(crate) fn is_cancel_mark(&self) -> bool {
        self.cancel.as_deref() == Some(CANCEL_FIRST) && self.note_id.is_empty()
    }
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
    pub(crate) fn newest_first(
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
        keys.on(self.table_query()).scan_index_forward(false)
    }
}
