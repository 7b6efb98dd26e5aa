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
use crate::store::items::{key, n, parse, rfc3339, s};
use crate::store::keys::{openid_of, outcome_due_pk, outcome_shard_pk};

impl Store {
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
        let turn = self.index_turn().await;
        let out = self
            .due_query(outcome_shard_pk(publisher, shard), now, limit)
            .send()
            .await?;
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
            if item.due_at.is_none_or(|at| at > now.timestamp_millis()) {
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
    /// publisher's own queue if `own_queue` (its webhook failed).
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
        let progress = match to {
            Move::Keep => progress,
            Move::Retry(Some(at)) | Move::Defer(at) if own_queue => {
                progress.set("due_at", n(at.timestamp_millis())).set(
                    "due_pk",
                    s(outcome_due_pk(Some(&item.publisher), &item.pk, &item.sk)),
                )
            }
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
