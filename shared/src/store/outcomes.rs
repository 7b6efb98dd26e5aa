//! Delivering outcomes (`items::outcome`): the due ones of a shard read whole, each
//! deleted once delivered, moved later after a failed try, or given up (off the due
//! index, kept for the operator until its TTL). Each write is conditional on the
//! attempts read (a write that lost to another is dropped); the template runs one
//! tick at a time, and racing deliverers are not tested.

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};

use crate::store::items::change::{change, delete, update};
use crate::store::items::expr::eq;
use crate::store::items::outcome::KEEP_DEAD;
pub use crate::store::items::outcome::OutcomeItem;

/// Which of an outcome's two ways it has taken: the stack's bus, its publisher's
/// webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Legs {
    pub bus: bool,
    pub hook: bool,
}

/// Where an outcome not delivered goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Stays due as it is (only its legs taken recorded).
    Keep,
    /// A leg failed: due again at the instant, or given up (`None`).
    Retry(Option<DateTime<Utc>>),
    /// Not tried (its publisher's webhook failed on another first): due at the
    /// instant that one is tried again, out of the way of other publishers'.
    Defer(DateTime<Utc>),
}

use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::query::partition;
use crate::store::items::{key, n, parse, rfc3339, s};
use crate::store::keys::{
    OUTCOME_QUEUES_SK, SHARDS_PK, openid_of, outcome_due_pk, outcome_shard_pk,
};

/// The registry's string set of publishers with an own queue.
const QUEUED: &str = "sources";

impl Store {
    /// The publishers whose outcomes have an own queue: every one whose webhook ever
    /// failed (registered before the first outcome moves there), so that the queue is
    /// read even once the publisher lost its webhook or left the configuration.
    pub async fn outcome_queues(&self) -> Result<Vec<String>, StoreError> {
        let got = self.get(SHARDS_PK, OUTCOME_QUEUES_SK).await?;
        Ok(match got.as_ref().and_then(|item| item.get(QUEUED)) {
            Some(AttributeValue::Ss(sources)) => sources.clone(),
            _ => Vec::new(),
        })
    }

    /// `source` registered as having an own queue (before anything moves there).
    pub async fn register_outcome_queue(&self, source: &str) -> Result<(), StoreError> {
        self.outcome_queues_change(source, true).await
    }

    /// `source` added to (or taken from) the registry's set.
    async fn outcome_queues_change(&self, source: &str, add: bool) -> Result<(), StoreError> {
        let one = AttributeValue::Ss(vec![source.to_string()]);
        let change = if add {
            change().add(QUEUED, one)
        } else {
            change().delete(QUEUED, one)
        };
        update(&self.table, key(SHARDS_PK, OUTCOME_QUEUES_SK), change)
            .apply(&self.client)
            .await?;
        Ok(())
    }

    /// `source`'s own queue forgotten if it holds nothing, due or not (one item read
    /// at most per shard), for a publisher no longer configured with a webhook (so
    /// nothing can move there any more). True if it was.
    pub async fn unregister_outcome_queue(&self, source: &str) -> Result<bool, StoreError> {
        for shard in 0..crate::domain::outcome::SHARDS {
            let _turn = self.index_turn().await;
            let held = partition("due_pk", s(outcome_shard_pk(Some(source), shard)))
                .on(self.index_query("due"))
                .limit(1)
                .send()
                .await?
                .count();
            if held > 0 {
                return Ok(false);
            }
        }
        self.outcome_queues_change(source, false).await?;
        Ok(true)
    }

    /// Up to `limit` outcomes of shard `shard` of the shared queue (`None`) or of
    /// `publisher`'s own due by `now`, oldest first: one index query and two reads per
    /// outcome (it, and its user's tombstone).
    pub async fn due_outcomes(
        &self,
        publisher: Option<&str>,
        shard: u32,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<OutcomeItem>, StoreError> {
        let queue = outcome_shard_pk(publisher, shard);
        let turn = self.index_turn().await;
        let out = self.due_query(queue.clone(), now, limit).send().await?;
        drop(turn);
        let mut due = Vec::new();
        for entry in out.items() {
            let (Some(AttributeValue::S(pk)), Some(AttributeValue::S(sk))) =
                (entry.get("pk"), entry.get("sk"))
            else {
                continue;
            };
            // Delivered (deleted) or moved since the index was read: skipped.
            let Some(item) = self.get(pk, sk).await? else {
                continue;
            };
            let item: OutcomeItem = parse("outcome", item)?;
            // (Moved to another queue since the index was read: read there.)
            if item.due_at.is_none_or(|at| at > now.timestamp_millis())
                || item.due_pk.as_deref() != Some(queue.as_str())
            {
                continue;
            }
            // Nothing erased is told: an outcome of a user whose erasure began (a send
            // settled while it waited for it) goes, untold.
            if let Some(openid) = openid_of(pk)
                && self.forgotten(&openid).await?
            {
                self.outcome_delivered(&item).await?;
                continue;
            }
            due.push(item);
        }
        Ok(due)
    }

    /// `item` was delivered: deleted, unless another deliverer moved it meanwhile.
    pub async fn outcome_delivered(&self, item: &OutcomeItem) -> Result<(), StoreError> {
        // Conditional on the attempts read: when it fails, another deliverer moved the
        // outcome first, and that is its answer.
        delete(&self.table, key(&item.pk, &item.sk))
            .when(eq("attempts", n(item.attempts)))
            .apply(&self.client)
            .await?;
        Ok(())
    }

    /// `item`'s delivery is not done at `now`: the legs `done` taken (kept, so a later
    /// try does not repeat them), and the item moved as `to` says — into its
    /// publisher's own queue if `own_queue` (its webhook failed or ran out of time;
    /// the publisher registered first, [`Store::register_outcome_queue`]).
    pub async fn outcome_progress(
        &self,
        item: &OutcomeItem,
        done: Legs,
        to: Move,
        own_queue: bool,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let attempts = match to {
            Move::Retry(_) => item.attempts + 1,
            Move::Keep | Move::Defer(_) => item.attempts,
        };
        let progress = change()
            .set("attempts", n(attempts))
            .set("bus_done", AttributeValue::Bool(done.bus))
            .set("hook_done", AttributeValue::Bool(done.hook));
        let own = || s(outcome_due_pk(Some(&item.publisher), &item.pk, &item.sk));
        let progress = match to {
            Move::Keep if own_queue => progress.set("due_pk", own()),
            Move::Keep => progress,
            Move::Retry(Some(at)) | Move::Defer(at) if own_queue => progress
                .set("due_at", n(at.timestamp_millis()))
                .set("due_pk", own()),
            Move::Retry(Some(at)) | Move::Defer(at) => {
                progress.set("due_at", n(at.timestamp_millis()))
            }
            Move::Retry(None) => progress
                .set("dead_at", s(rfc3339(now)))
                .set("expires_at", n((now + KEEP_DEAD).timestamp()))
                .remove("due_pk")
                .remove("due_at"),
        };
        // (Moved meanwhile by another deliverer: its answer, as for a delivery.)
        update(&self.table, key(&item.pk, &item.sk), progress)
            .when(eq("attempts", n(item.attempts)))
            .apply(&self.client)
            .await?;
        Ok(())
    }
}
