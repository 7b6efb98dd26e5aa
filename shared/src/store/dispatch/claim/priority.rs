//! A claim that takes no grant: a plan pauses `needs_grant`; a push waits for a grant
//! of its template — listed on the quota item, and, when a grant is there but a better
//! push waits for it, waking that one (`domain::dispatch::priority`) — or, with the
//! waiting list full even once pruned of pushes that no longer wait, is skipped.

use chrono::{DateTime, Utc};

use super::claimable::{ClaimOutcome, Claimable};
use crate::domain::TemplateId;
use crate::domain::dispatch::claim::Unsent;
use crate::domain::dispatch::priority::yield_wake_at;
use crate::store::dispatch::due::DueItem;
use crate::store::dispatch::priority::YieldWake;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::retry::Attempt;
use crate::store::tx::{Beside, Outcome, Parts};

impl Store {
    /// Commits a claim that takes no grant (`why`: waiting for one, or none).
    pub(super) async fn not_granted(
        &self,
        item: &DueItem,
        claimable: &Claimable,
        template: TemplateId,
        why: Unsent,
        now: DateTime<Utc>,
    ) -> Result<Attempt<ClaimOutcome>, StoreError> {
        let (counters, open) = claimable.grants();
        let available = counters.available;
        let template = &template;
        let Some(own) = claimable.waiting_member() else {
            // A plan pauses `needs_grant`, losing to a grant arriving meanwhile.
            let mut writes = self.unsent_writes(item, claimable, &why, now)?;
            writes.push(self.still_no_grant(&item.pk, template)?);
            return Ok(if self.commit_unsent(writes).await? {
                Attempt::Done(ClaimOutcome::Unsent {
                    why,
                    template: template.clone(),
                })
            } else {
                Attempt::Retry
            });
        };
        let own = own.as_str();
        let skip = !why.waits_for_grant();
        let yielded = matches!(why, Unsent::WaitGrant { yielded: true, .. });
        let wake = why.wakes().map(str::to_string);
        // A full list may hold pushes that no longer wait: pruned, the push decides
        // again.
        if skip
            && self
                .prune_waiting(&item.pk, template, &open.waiting)
                .await?
                > 0
        {
            return Ok(Attempt::Retry);
        }
        let listed = open.waiting.iter().any(|m| m == own);
        let mut writes = self.unsent_writes(item, claimable, &why, now)?;
        if skip {
            // Skipped (the list full): losing to a grant arriving meanwhile.
            if wake.is_none() {
                writes.push(self.still_no_grant(&item.pk, template)?);
            }
        } else {
            // Yielding to pushes due together: the wake entry comes due when they
            // have had their chance at the grants (if not sooner already).
            let yield_wake = yielded
                .then(|| yield_wake_at(now, open.wake_listed, open.wake_at))
                .flatten()
                .map(|at| YieldWake {
                    at,
                    read: open.wake_at,
                });
            writes.push(
                self.waiting_add(&item.pk, template, own, available, listed, yield_wake, now)?,
            );
        }
        let mut writes = Parts::notes_apart(writes);
        if let Some(wake) = &wake {
            writes.add(Beside::Wake, self.wake_write(&item.pk, wake, now)?);
        }
        let done = ClaimOutcome::Unsent {
            why,
            template: template.clone(),
        };
        match self.transact_parts(&writes).await? {
            Outcome::Committed => return Ok(Attempt::Done(done)),
            Outcome::Cancelled(failed) => {
                if let Some(stale) = wake.as_deref().filter(|_| failed.has(Beside::Wake)) {
                    // That push no longer waits: off the list, and decide again.
                    self.drop_waiting(&item.pk, template, stale).await?;
                } else if failed.only(|part| part == Beside::Note) {
                    // The notification is gone (its retention): the rest lands alone.
                    writes.retain(|part| part != Beside::Note);
                    if matches!(self.transact_parts(&writes).await?, Outcome::Committed) {
                        return Ok(Attempt::Done(done));
                    }
                }
            }
            Outcome::Contended | Outcome::Conflict => {}
        }
        // A grant arrived or was taken, the list changed, or the item moved: read again.
        Ok(Attempt::Retry)
    }
}
