//! Marking notifications read: one, or all in bounded steps.
//!
//! Each flip is conditional on the notification being unread and travels with the
//! deletion of its unread marker and the counter's decrement in one transaction, so
//! the counter always equals the markers left. A read notification expires after the
//! read-notes retention.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::inbox::NotificationView;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::note::NoteItem;
use crate::store::items::change::{change, delete, update};
use crate::store::items::expr::eq;
use crate::store::items::rate::{Counter, rate_key};
use crate::store::items::{Item, is_there, key, n, parse, rfc3339, s, text};
use crate::store::keys::{INBOX_SK, UNREADS, note_id_of, note_sk, unread_sk, user_pk};
use crate::store::retry::{Attempt, retry_contended};
use crate::store::tx::{Outcome, Parts, TxOutcome};

/// Most notifications one read-all step flips: two items each (the note and its
/// marker) plus the unread counter and the first step's count of the minute, within
/// a transaction's 100.
const READ_ALL_STEP: usize = 49;
/// Most steps one read-all call takes (≈ 1,000 notifications); past them the answer
/// says more are left and the next call goes on.
const READ_ALL_STEPS: usize = 21;

/// What a read-all call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAll {
    /// Notifications this call flipped.
    pub updated: u64,
    /// Unread notifications are left (the call stopped at its step limit).
    pub more: bool,
}

/// The parts of marking notifications read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// The note `i` (of the step's ids) flipped read, on it being unread: failed, it
    /// was read (or removed) meanwhile — its old image says which.
    Flip(usize),
    /// A note's unread marker deleted.
    Marker,
    /// The unread count.
    Unread,
    /// The minute's count of changes.
    Rate,
}

impl Store {
    /// Marks one notification read (idempotent). `None` if the caller has no such
    /// notification. The note is read first (with the user's counters of the
    /// minute): one that is not there, or is read already, costs that read and no
    /// write; one that is unread is flipped, counted against `CHANGES_PER_MINUTE`.
    pub async fn mark_read(
        &self,
        openid: &OpenId,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<NotificationView>, StoreError> {
        let pk = &user_pk(openid);
        retry_contended("mark read", self.limits.write_budget, || async move {
            let (note, rate) = (note_sk(id), rate_key(now));
            let mut read = self.read_items(pk, &[note.clone(), rate.clone()]).await?;
            let Some(stored) = read.remove(&note) else {
                return Ok(Attempt::Done(None));
            };
            let stored = parse::<NoteItem>("note", stored)?;
            if stored.read {
                return Ok(Attempt::Done(Some(stored.view())));
            }
            // Past the minute's changes: refused on the read, before any write.
            self.rate_admits(Counter::Changes, read.get(&rate), now)?;
            let items = Parts::new()
                .with(Read::Flip(0), self.flip(pk, id, now)?)
                .with(Read::Marker, self.unmark(pk, id)?)
                .with(Read::Unread, self.unread_change(pk, -1)?)
                .with(Read::Rate, self.rate_count(Counter::Changes, pk, now)?);
            match self.transact_parts(&items).await? {
                Outcome::Committed => {
                    let mut view = stored.view();
                    view.read = true;
                    return Ok(Attempt::Done(Some(view)));
                }
                Outcome::Cancelled(failed) if failed.has(Read::Flip(0)) => {
                    // Read (or removed) since this call's read.
                    return failed
                        .old(Read::Flip(0))
                        .cloned()
                        .map(|i| parse::<NoteItem>("note", i).map(|n| n.view()))
                        .transpose()
                        .map(Attempt::Done);
                }
                // The count's condition alone: the next read refuses.
                Outcome::Cancelled(_) | Outcome::Contended | Outcome::Conflict => {}
            }
            Ok(Attempt::Retry)
        })
        .await
    }

    /// Marks unread notifications read, newest first, `READ_ALL_STEP` per
    /// transaction and at most `READ_ALL_STEPS` steps per call; a call that flips
    /// any counts once against `CHANGES_PER_MINUTE`. Each step reads only
    /// unread markers; a step that loses a race to a concurrent read looks again.
    pub async fn read_all(
        &self,
        openid: &OpenId,
        now: DateTime<Utc>,
    ) -> Result<ReadAll, StoreError> {
        let pk = &user_pk(openid);
        let mut updated = 0u64;
        for step in 0..READ_ALL_STEPS {
            let flipped = retry_contended("read all", self.limits.write_budget, || async move {
                let ids = self.unread_ids(pk, READ_ALL_STEP).await?;
                if ids.is_empty() {
                    return Ok(Attempt::Done(0));
                }
                let mut items = Parts::new();
                if step == 0 {
                    // The call counts once against the minute's changes, with its
                    // first step, and is refused before it when they are used up.
                    let rate = rate_key(now);
                    let read = self.read_items(pk, std::slice::from_ref(&rate)).await?;
                    self.rate_admits(Counter::Changes, read.get(&rate), now)?;
                    items.add(Read::Rate, self.rate_count(Counter::Changes, pk, now)?);
                }
                for (i, id) in ids.iter().enumerate() {
                    items.add(Read::Flip(i), self.flip(pk, id, now)?);
                    items.add(Read::Marker, self.unmark(pk, id)?);
                }
                let count = i64::try_from(ids.len()).unwrap_or(0);
                items.add(Read::Unread, self.unread_change(pk, -count)?);
                Ok(match self.transact_parts(&items).await? {
                    Outcome::Committed => Attempt::Done(ids.len() as u64),
                    Outcome::Cancelled(failed) => {
                        // Some were read meanwhile (their markers are gone, or going
                        // with the read): look again. A marker whose note is missing,
                        // read or unreadable would fail every step: take it out, with
                        // its count.
                        for (i, id) in ids.iter().enumerate() {
                            if failed.has(Read::Flip(i))
                                && failed.old(Read::Flip(i)).is_none_or(|n| {
                                    n.get("read").and_then(|v| v.as_bool().ok()) != Some(&false)
                                })
                            {
                                self.drop_stray_marker(pk, id).await?;
                            }
                        }
                        Attempt::Retry
                    }
                    Outcome::Contended | Outcome::Conflict => Attempt::Retry,
                })
            })
            .await?;
            if flipped == 0 {
                return Ok(ReadAll {
                    updated,
                    more: false,
                });
            }
            updated += flipped;
        }
        let more = !self.unread_ids(pk, 1).await?.is_empty();
        Ok(ReadAll { updated, more })
    }

    /// Deletes the marker of a note that is not unread, with its count, if the marker
    /// is still there (a concurrent read deletes its own; then this changes nothing).
    async fn drop_stray_marker(&self, pk: &str, id: &str) -> Result<(), StoreError> {
        let items = vec![
            delete(&self.table, key(pk, &unread_sk(id)))
                .when(is_there())
                .write()?,
            self.unread_change(pk, -1)?,
        ];
        match self.transact(items).await? {
            TxOutcome::Committed => {
                tracing::warn!("an unread marker without an unread note was removed");
            }
            TxOutcome::Cancelled(_) | TxOutcome::Contended => {}
        }
        Ok(())
    }

    /// Up to `limit` ids of unread notifications, newest first (markers only).
    async fn unread_ids(&self, pk: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let out = self
            .newest_first(pk, UNREADS, None)
            .projection_expression("sk")
            .limit(i32::try_from(limit).unwrap_or(1))
            .send()
            .await?;
        Ok(out
            .items()
            .iter()
            .filter_map(|i: &Item| text(i, "sk").and_then(note_id_of).map(str::to_string))
            .collect())
    }

    /// Flips note `id` to read, conditional on it existing unread; the item comes back
    /// when the condition fails (to answer a replay without another read).
    fn flip(
        &self,
        pk: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let flipped = change()
            .set("read", AttributeValue::Bool(true))
            .set("read_at", s(rfc3339(now)))
            .set(
                "expires_at",
                n((now + self.limits.retention.read_notes).timestamp()),
            );
        update(&self.table, key(pk, &note_sk(id)), flipped)
            .when(is_there().and(eq("read", AttributeValue::Bool(false))))
            .old_on_failure()
            .write()
    }

    /// Deletes note `id`'s unread marker (the flip's condition guards the pair).
    fn unmark(&self, pk: &str, id: &str) -> Result<TransactWriteItem, StoreError> {
        delete(&self.table, key(pk, &unread_sk(id))).write()
    }

    /// `ADD unread by` on the counter (part of a transaction).
    pub(crate) fn unread_change(&self, pk: &str, by: i64) -> Result<TransactWriteItem, StoreError> {
        let counted = change().set("kind", s("inbox")).add("unread", n(by));
        update(&self.table, key(pk, INBOX_SK), counted).write()
    }
}
