//! `collapse_key`: a newer notification of a user with the same key (from the same
//! publisher) replaces the older one's push while that has not gone out. The user's
//! `COLLAPSE#<publisher>#<key>` item names the newest notification of the key; ingest
//! reads it and the push it names, and writes — in the ingest's own transaction, each
//! conditional on what was read — the item naming the new notification and, when the
//! older push still waits ([`replace`]), that push `replaced`; when an attempt of it
//! is in flight, the replacement recorded on the older notification, so that the
//! push, if it comes due again, ends `replaced` at its next claim instead of going
//! out and spending a second grant. Two events of one key
//! at once: one write of the item fails, that ingest reads again and replaces the
//! other's push. A bounded number of reads and writes, whatever the history.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::inbox::PushStatus;
use crate::domain::inbox::cancel::{ReplaceDecision, replace};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::cancel::Found;
use crate::store::items::change::{put, versioned};
use crate::store::items::outbox::{REPLACE_REQUESTED, note_request};
use crate::store::items::{parse, to_item};
use crate::store::keys::collapse_sk;

/// The newest notification of one collapse key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CollapseItem {
    pk: String,
    sk: String,
    kind: String,
    note_id: String,
    version: u64,
    /// Kept while an older push could still be waiting (refreshed on each write).
    expires_at: i64,
}

impl Store {
    /// Whether a new notification of `key` would replace a push still open (waiting,
    /// or with an attempt in flight): at the cap on open pushes it is taken, since the
    /// count does not grow. Two reads at most.
    pub(super) async fn collapse_replaces(
        &self,
        pk: &str,
        publisher: &str,
        key: &str,
    ) -> Result<bool, StoreError> {
        let Some(item) = self.get(pk, &collapse_sk(publisher, key)).await? else {
            return Ok(false);
        };
        let older = parse::<CollapseItem>("collapse", item)?;
        let found = self.push_of(pk, &older.note_id).await?;
        Ok(replace(found.as_domain()) != ReplaceDecision::Leave)
    }

    /// The writes, for an ingest's transaction, that make `note_id` the newest of
    /// `key` and replace the older push if it still waits.
    pub(super) async fn collapse_writes(
        &self,
        pk: &str,
        publisher: &str,
        key: &str,
        note_id: &str,
        with_note: bool,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let sk = collapse_sk(publisher, key);
        let older = match self.get(pk, &sk).await? {
            Some(item) => Some(parse::<CollapseItem>("collapse", item)?),
            None => None,
        };
        let next = CollapseItem {
            pk: pk.to_string(),
            sk,
            kind: "collapse".into(),
            note_id: note_id.to_string(),
            version: older.as_ref().map_or(1, |o| o.version + 1),
            expires_at: (now
                + self.limits.retention.events
                + crate::domain::inbox::schedule::MAX_AHEAD)
                .timestamp(),
        };
        let put = put(&self.table, to_item("collapse", &next)?)
            .when(versioned(older.as_ref().map_or(0, |o| o.version)))
            .write()?;
        let mut writes = vec![put];
        if let Some(older) = older {
            let found = self.push_of(pk, &older.note_id).await?;
            match (replace(found.as_domain()), &found) {
                (ReplaceDecision::Replace, _) => writes.extend(self.end_push(
                    pk,
                    &older.note_id,
                    &found,
                    PushStatus::Replaced,
                    with_note,
                    now,
                )?),
                // In flight: recorded for its next claim (the notification removed by
                // its retention, nowhere to record it: that attempt decides).
                (ReplaceDecision::Request, Found::Outbox(outbox)) if with_note => {
                    writes.extend(note_request(&self.table, outbox, REPLACE_REQUESTED, now)?);
                }
                (ReplaceDecision::Request | ReplaceDecision::Leave, _) => {}
            }
        }
        Ok(writes)
    }
}
