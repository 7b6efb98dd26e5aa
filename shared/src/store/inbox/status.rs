//! What became of one publisher's notification, for that publisher: the notification
//! as the user sees it, and each status its push reached and when. Three or four
//! strongly consistent reads: the user's tombstone (an erased user's is none), the event's record (scoped to the publisher, so another
//! publisher's key names nothing), then the notification in the user's partition, or
//! the scheduled item that holds it until it appears.

use serde::Serialize;

use crate::domain::OpenId;
use crate::domain::inbox::NotificationView;
use crate::domain::inbox::PushMoment;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::note::{EventItem, NoteItem};
use crate::store::inbox::publish::ScheduledItem;
use crate::store::items::parse;
use crate::store::keys::{event_key, note_sk, scheduled_sk, user_pk};

/// One notification of a publisher's, as the publisher API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotificationStatus {
    pub idempotency_key: String,
    pub openid: String,
    pub notification: NotificationView,
    /// Kept aside until it appears (its `created_at`, when its push is due too).
    pub scheduled: bool,
    /// Each status its push reached, oldest first.
    pub history: Vec<PushMoment>,
}

impl Store {
    /// The notification `publisher` sent `openid` under `key`; `None` when there is
    /// none (another publisher's key, another user, a cancel that came first, or one
    /// its retention or an erasure removed).
    pub async fn notification_status(
        &self,
        publisher: &str,
        key: &str,
        openid: &OpenId,
    ) -> Result<Option<NotificationStatus>, StoreError> {
        // An erased user's notifications are nobody's business, whatever is left of
        // them while the erasure runs.
        if self.forgotten(openid).await? {
            return Ok(None);
        }
        let (event_pk, event_sk) = event_key(publisher, key);
        let Some(record) = self.get(&event_pk, &event_sk).await? else {
            return Ok(None);
        };
        let record: EventItem = parse("event", record)?;
        if record.is_cancel_mark() {
            return Ok(None);
        }
        let pk = user_pk(openid);
        let (note, scheduled) = match self.get(&pk, &note_sk(&record.note_id)).await? {
            Some(note) => (parse::<NoteItem>("note", note)?, false),
            None => match self.get(&pk, &scheduled_sk(&record.note_id)).await? {
                Some(item) => (parse::<ScheduledItem>("scheduled", item)?.note, true),
                None => return Ok(None),
            },
        };
        Ok(Some(NotificationStatus {
            idempotency_key: key.to_string(),
            openid: openid.as_str().to_string(),
            notification: note.view(),
            scheduled,
            history: note.push_history,
        }))
    }
}
