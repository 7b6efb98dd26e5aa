//! The lease index's entries the sweep cannot handle: deferred behind the others,
//! then quarantined for an operator.

use chrono::{DateTime, Utc};

use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, update};
use crate::store::items::expr::eq;
use crate::store::items::{due_as_seen, key, lease_as_seen, n, rfc3339, s, text};
use crate::store::keys::{DELIVERY_PREFIX, OUTBOX_PREFIX};
use crate::store::tx::TxOutcome;
use crate::telemetry::error_chain;

/// The sparse indexes an item can be taken off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Index {
    Due,
    Lease,
}

impl Store {
    /// Takes an item that cannot be read or acted on off `index` (it stays in the
    /// table, marked `quarantined_at`, for an operator to look at), so one bad item
    /// is skipped once, not every tick.
    pub(crate) async fn quarantine(
        &self,
        pk: &str,
        sk: &str,
        index: Index,
        seen: i64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // Only the entry as it was seen: one the item got since is left alone.
        let (off, condition) = match index {
            // (Off the pending index too: an item for an operator is no open push
            // counted against its user's cap.)
            Index::Due => (
                change()
                    .remove("due_pk")
                    .remove("due_at")
                    .remove("pending_pk")
                    .remove("pending_sk")
                    .remove("lane_pk"),
                due_as_seen(seen),
            ),
            Index::Lease => (
                change().remove("lease_pk").remove("lease_until"),
                lease_as_seen(seen),
            ),
        };
        let off = update(
            &self.table,
            key(pk, sk),
            off.set("quarantined_at", s(rfc3339(now))),
        )
        .when(condition)
        .write()?;
        let mut items = vec![off];
        // It stops there for good (until an operator acts): the audit trail says so.
        if self.limits.audit {
            let change = crate::domain::audit::Change {
                entity: crate::store::audit::entity_name(sk).to_string(),
                sk: sk.to_string(),
                to: "quarantined".into(),
                template_id: None,
                msgid: None,
                errcode: None,
                reason: Some(format!("{index:?} index")),
            };
            items.push(crate::store::audit::entry(
                pk.to_string(),
                vec![change],
                &self.table,
                now,
                self.limits.retention.grants,
            )?);
        }
        match self.transact(items).await? {
            TxOutcome::Committed => {
                tracing::error!(sk = %sk, ?index, "unreadable item taken off the index (quarantined_at)");
                if index == Index::Lease && sk.starts_with(DELIVERY_PREFIX) {
                    self.unlist_quarantined_push(pk, sk).await;
                }
                Ok(())
            }
            // It moved on since it was seen: nothing to do.
            TxOutcome::Cancelled(_) => Ok(()),
            TxOutcome::Contended => Err(StoreError::Unavailable("quarantine contended".into())),
        }
    }
}

impl Store {
    /// A delivery quarantined leaves its push `sending` (it may have gone out): the push
    /// leaves its user's `pending` index and its publisher's lane too, as an item for an
    /// operator is no open push counted against a cap. Apart from the quarantine, which
    /// must land whatever the push holds; a failure is logged (the runbook's step).
    async fn unlist_quarantined_push(&self, pk: &str, sk: &str) {
        let source = match self.get(pk, sk).await {
            Ok(item) => item.and_then(|i| text(&i, "source").map(str::to_string)),
            Err(e) => {
                tracing::error!(error = %error_chain(&e), sk = %sk, "a quarantined delivery's push is still counted open");
                return;
            }
        };
        let Some(outbox) = source.filter(|s| s.starts_with(OUTBOX_PREFIX)) else {
            return;
        };
        let off = change()
            .remove("pending_pk")
            .remove("pending_sk")
            .remove("lane_pk");
        let off = update(&self.table, key(pk, &outbox), off).when(eq("state", s("sending")));
        if let Err(e) = off.apply(&self.client).await {
            tracing::error!(error = %error_chain(&e), sk = %outbox, "a quarantined delivery's push is still counted open");
        }
    }
}

/// How long a lease-index entry whose handling failed waits before the sweep tries it
/// again: it sorts behind the entries that came due meanwhile, so a run of failing
/// entries at the head of a shard never holds up the recovery of the rest.
pub const SWEEP_RETRY_AFTER: chrono::Duration = chrono::Duration::minutes(2);

/// How many times a sweep may fail on an entry for a reason a retry will not fix (not
/// a throttle or an outage, which are tried again as they are) before the entry is
/// quarantined: the domain's rule
/// ([`domain::dispatch::sweep`](crate::domain::dispatch::sweep)).
pub use crate::domain::dispatch::sweep::SWEEP_FAILURE_LIMIT;

impl Store {
    /// Moves a lease-index entry whose handling failed behind the others (its
    /// `lease_until` to [`SWEEP_RETRY_AFTER`] from now), counting the failure when
    /// `counts`; the failures so far and the new `lease_until`, or None if the entry
    /// changed since it was seen (nothing to do).
    pub(crate) async fn defer_lease(
        &self,
        pk: &str,
        sk: &str,
        seen: i64,
        counts: bool,
        now: DateTime<Utc>,
    ) -> Result<Option<(u32, i64)>, StoreError> {
        let later = (now + SWEEP_RETRY_AFTER).timestamp_millis();
        let moved = if counts {
            change()
                .set("lease_until", n(later))
                .add("sweep_failures", n(1))
        } else {
            change().set("lease_until", n(later))
        };
        let moved = update(&self.table, key(pk, sk), moved)
            .when(lease_as_seen(seen))
            .apply_new(&self.client)
            .await?;
        Ok(moved.map(|item| {
            let failures = item
                .get("sweep_failures")
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (failures, later)
        }))
    }
}
