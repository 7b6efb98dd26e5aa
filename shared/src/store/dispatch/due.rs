//! The due index: what is due by a horizon, across every shard.

use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::store::dispatch::lease::Index;
use crate::store::dispatch::shards::ShardSpan;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, update};
use crate::store::items::{due_as_seen, key, n, number, text};
use crate::store::keys::{SortKey, due_shard_pk, openid_of, outbox_sk, sort_key};
use crate::store::tx::TxOutcome;

/// A plan or push the due index says is due by the horizon (keys only: re-read on
/// claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub due_at: DateTime<Utc>,
}

impl DueItem {
    /// The user it belongs to, if its partition names one.
    pub fn openid(&self) -> Option<OpenId> {
        openid_of(&self.pk)
    }

    /// Its item's key (partition, sort).
    pub fn key(&self) -> (&str, &str) {
        (&self.pk, &self.sk)
    }

    /// Whether it is a scheduled notification, to publish (`Store::publish`) rather
    /// than claim.
    pub fn is_scheduled_note(&self) -> bool {
        matches!(sort_key(&self.sk), SortKey::Scheduled(_))
    }

    /// Whether it is a pending erasure's tombstone, for [`Store::erase_due`] (no user
    /// partition, no claim).
    pub fn is_erasure(&self) -> bool {
        self.sk == crate::store::items::tombstone::TOMBSTONE_SK && self.pk.starts_with("ERASED#")
    }

    /// Whether it is a user's activity come due (no request for
    /// `INACTIVE_USER_DAYS`), for [`Store::inactive_due`].
    pub fn is_inactivity(&self) -> bool {
        self.sk == crate::store::items::activity::ACTIVITY_SK && self.pk.starts_with("USER#")
    }

    /// Whether it is a template's wake entry (a grant given while pushes of it wait),
    /// for [`Store::wake_due`] rather than a claim.
    pub fn is_wake(&self) -> bool {
        self.sk.starts_with(crate::store::keys::QUOTA_PREFIX)
    }

    /// The due entry of a published notification's push: due at the same instant.
    pub fn published_push(&self) -> Option<DueItem> {
        match sort_key(&self.sk) {
            SortKey::Scheduled(note_id) => Some(DueItem {
                pk: self.pk.clone(),
                sk: outbox_sk(note_id),
                due_at: self.due_at,
            }),
            _ => None,
        }
    }
}

/// One page of one shard of the due index.
#[derive(Debug, Clone, Default)]
pub struct DuePage {
    /// Earliest first.
    pub items: Vec<DueItem>,
    /// Index entries that could not be read (logged; left for an operator).
    pub unreadable: u32,
    /// Where the next page starts; `None` when the shard has nothing more due.
    pub next: Option<DueCursor>,
}

/// A position in one shard of the due index (opaque).
#[derive(Debug, Clone)]
pub struct DueCursor(crate::store::items::Item);

impl Store {
    /// Up to `limit` items of due-index partition `shard` due by `horizon`, earliest
    /// first, from `from` (the previous page's `next`). One query; an unreadable entry
    /// is logged and counted, not fatal.
    pub async fn due_page(
        &self,
        horizon: DateTime<Utc>,
        shard: u32,
        from: Option<DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        let turn = self.index_turn().await;
        let out = self
            .due_query(due_shard_pk(shard), horizon, limit)
            .set_exclusive_start_key(from.map(|c| c.0))
            .send()
            .await?;
        drop(turn);
        let mut page = DuePage {
            next: out.last_evaluated_key().cloned().map(DueCursor),
            ..DuePage::default()
        };
        for item in out.items() {
            let due = number(item, "due_at").and_then(DateTime::from_timestamp_millis);
            match (text(item, "pk"), text(item, "sk"), due) {
                (Some(pk), Some(sk), Some(due_at)) => page.items.push(DueItem {
                    pk: pk.to_string(),
                    sk: sk.to_string(),
                    due_at,
                }),
                _ => {
                    tracing::error!(shard, "unreadable due-index entry skipped");
                    page.unreadable += 1;
                }
            }
        }
        Ok(page)
    }

    /// Every item of the shards in `span` due by `horizon`, earliest first, read page
    /// by page (for checks and tools; the dispatcher pages shard by shard within its
    /// budget instead).
    pub async fn due_items(
        &self,
        horizon: DateTime<Utc>,
        span: &ShardSpan,
    ) -> Result<Vec<DueItem>, StoreError> {
        let mut all = Vec::new();
        for shard in 0..span.span {
            let mut from = None;
            loop {
                let page = self.due_page(horizon, shard, from, 100).await?;
                all.extend(page.items);
                match page.next {
                    Some(next) => from = Some(next),
                    None => break,
                }
            }
        }
        all.sort_by_key(|i| i.due_at);
        Ok(all)
    }

    /// Moves the due entry of a plan whose reminder kind this deployment does not
    /// configure to `until` ([`parked_until`](crate::domain::dispatch::claim::parked_until)),
    /// if it is still where it was read: no longer at the head of its shard, read and
    /// skipped every tick, it comes due again then — and is moved again while the kind
    /// is missing, or claimed by the plan's own rule once it is back. Only the entry
    /// moves (not the plan, nor its version): any write of the plan puts it back at the
    /// plan's own instant.
    pub async fn park_due(&self, item: &DueItem, until: DateTime<Utc>) -> Result<(), StoreError> {
        let parked = update(
            &self.table,
            key(&item.pk, &item.sk),
            change().set("due_at", n(until.timestamp_millis())),
        )
        .when(due_as_seen(item.due_at.timestamp_millis()))
        .write()?;
        match self.transact(vec![parked]).await? {
            // Moved on since it was read (claimed, rewritten, parked by another): fine.
            TxOutcome::Committed | TxOutcome::Cancelled(_) => Ok(()),
            TxOutcome::Contended => Err(StoreError::Unavailable("park contended".into())),
        }
    }

    /// Takes a due item that cannot be claimed (it cannot be read) off the due index,
    /// so it is skipped once rather than every tick; the item stays for an operator.
    pub async fn quarantine_due(
        &self,
        item: &DueItem,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let seen = item.due_at.timestamp_millis();
        self.quarantine(&item.pk, &item.sk, Index::Due, seen, now)
            .await
    }
}
