//! Listing the inbox and reading its counter.
//!
//! Every call reads a bounded number of items ([`LIST_BUDGET`]), whatever the filter
//! and the history: `read=false` walks the unread markers (only what is unread), the
//! other filters walk the notifications. A filtered walk that spends its budget before
//! filling the page answers what it found and a cursor to where it stopped, so a page is
//! never empty without a cursor while older matches exist.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::domain::OpenId;
use crate::domain::inbox::{NotificationView, encode_cursor};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::note::{ListFilter, NoteItem, Page};
use crate::store::items::expr::{all, eq};
use crate::store::items::{Item, key, number, parse, s, text};
use crate::store::keys::{INBOX_SK, NOTES, UNREADS, note_id_of, note_sk, unread_sk, user_pk};

/// Most items one listing call reads (notifications or unread markers), filtered or
/// not: at most ~90 read units even with every notification at its largest (~7 KB),
/// a few for ordinary ones. A `limit` above it gets a page of this many and a cursor.
pub const LIST_BUDGET: usize = 50;

/// What a bounded walk found, and where the next call resumes (a sort key).
struct Walk {
    found: Vec<Item>,
    resume: Option<String>,
}

impl Store {
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
        let kind = filter.kind.as_deref();
        let (items, resume) = if filter.read == Some(false) {
            let walk = self
                .walk_back(&pk, UNREADS, after.map(unread_sk), limit, None, kind)
                .await?;
            let ids: Vec<String> = walk
                .found
                .iter()
                .filter_map(|m| text(m, "sk").and_then(note_id_of).map(str::to_string))
                .collect();
            let notes = self.notes_by_id(&pk, &ids).await?;
            // A marker read meanwhile may point at a note that is read by now.
            let unread = notes.into_iter().filter(|n| !n.read).collect();
            (unread, walk.resume)
        } else {
            let walk = self
                .walk_back(&pk, NOTES, after.map(note_sk), limit, filter.read, kind)
                .await?;
            // An item that is not a whole note (nothing this code writes) is left out
            // and logged, so one bad item never breaks a user's inbox.
            let notes = walk
                .found
                .into_iter()
                .filter_map(|i| match parse::<NoteItem>("note", i) {
                    Ok(note) => Some(note.view()),
                    Err(e) => {
                        tracing::error!(error = %crate::telemetry::error_chain(&e), "unreadable notification left out of a page");
                        None
                    }
                })
                .collect();
            (notes, walk.resume)
        };
        let next_cursor = resume.as_deref().and_then(note_id_of).map(encode_cursor);
        Ok(Page { items, next_cursor })
    }

    /// Walks `pk`'s items under `prefix`, newest first, strictly after `after` (a sort
    /// key), collecting up to `want` items whose `read` and `note_type` match, and
    /// reading at most [`LIST_BUDGET`] items.
    async fn walk_back(
        &self,
        pk: &str,
        prefix: &str,
        after: Option<String>,
        want: usize,
        read: Option<bool>,
        kind: Option<&str>,
    ) -> Result<Walk, StoreError> {
        let mut found: Vec<Item> = Vec::new();
        let mut examined = 0usize;
        let mut start = after.map(|sk| key(pk, &sk));
        loop {
            let mut conditions = Vec::new();
            if let Some(read) = read {
                conditions.push(eq("read", AttributeValue::Bool(read)));
            }
            if let Some(kind) = kind {
                conditions.push(eq("note_type", s(kind)));
            }
            // Unfiltered, a page's worth is enough; filtered, whatever the budget allows.
            let room = LIST_BUDGET.saturating_sub(examined);
            let (page, filter) = if conditions.is_empty() {
                (room.min(want - found.len()), None)
            } else {
                (room, Some(all(conditions)))
            };
            let out = self
                .newest_first(pk, prefix, filter)
                .limit(i32::try_from(page.max(1)).unwrap_or(1))
                .set_exclusive_start_key(start.take())
                .send()
                .await?;
            let scanned = usize::try_from(out.scanned_count()).unwrap_or(0);
            examined += scanned.max(out.items().len());
            let mut left_over = false;
            for item in out.items() {
                if found.len() == want {
                    left_over = true;
                    break;
                }
                found.push(item.clone());
            }
            let last_found = found.last().and_then(|i| text(i, "sk")).map(str::to_string);
            match out.last_evaluated_key() {
                _ if left_over => return Ok(Walk::resume(found, last_found)),
                None => return Ok(Walk::resume(found, None)),
                Some(_) if found.len() == want => return Ok(Walk::resume(found, last_found)),
                Some(last) if examined >= LIST_BUDGET => {
                    let at = text(last, "sk").map(str::to_string);
                    return Ok(Walk::resume(found, at));
                }
                Some(last) => start = Some(last.clone()),
            }
        }
    }

    /// The notifications `ids` names, in that order (strongly consistent; missing ones
    /// left out).
    async fn notes_by_id(
        &self,
        pk: &str,
        ids: &[String],
    ) -> Result<Vec<NotificationView>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sks: Vec<String> = ids.iter().map(|id| note_sk(id)).collect();
        let mut got: Vec<NoteItem> = Vec::with_capacity(ids.len());
        for item in self.read_items(pk, &sks).await?.into_values() {
            match parse::<NoteItem>("note", item) {
                Ok(note) => got.push(note),
                Err(e) => {
                    tracing::error!(error = %crate::telemetry::error_chain(&e), "unreadable notification left out of a page");
                }
            }
        }
        let mut views = Vec::with_capacity(got.len());
        for id in ids {
            if let Some(note) = got.iter().find(|n| &n.id == id) {
                views.push(note.view());
            }
        }
        Ok(views)
    }

    /// The unread counter (one strongly consistent read; never a count query).
    pub async fn unread(&self, openid: &OpenId) -> Result<u64, StoreError> {
        let counter = self.get(&user_pk(openid), INBOX_SK).await?;
        Ok(counter
            .as_ref()
            .and_then(|i| number(i, "unread"))
            .map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }
}

impl Walk {
    fn resume(found: Vec<Item>, resume: Option<String>) -> Self {
        Self { found, resume }
    }
}
