//! The claimed item's write: a plan `sending` on the lease index, or a push's outbox
//! item `sending` (written already claimed when its publication goes with the claim).

use chrono::{DateTime, Utc};

use super::claimable::{Claimable, Sourced};
use crate::domain::settle::OutboxState;
use crate::store::dispatch::claimed::{ClaimSource, OutboxClaim};
use crate::store::dispatch::due::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::outbox::versioned_put;
use crate::store::items::to_item;

impl Store {
    /// The claimed item's write (`sending`, naming the delivery, on the lease index for
    /// a plan), what the dispatcher keeps of it, its attempts so far and, for a push
    /// not yet written, its publication's writes.
    pub(super) fn claimed_source(
        &self,
        item: &DueItem,
        claimable: Claimable,
        delivery_id: &str,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Sourced, StoreError> {
        match claimable {
            Claimable::Plan { kind, plan, .. } => {
                let claimed = plan.claimed(delivery_id, lease_until)?;
                let write = self.plan_put(&claimed, &item.pk, now)?;
                let claimed = claimed.written();
                let attempts = claimed.attempts;
                Ok((
                    write,
                    ClaimSource::Plan {
                        kind,
                        plan: claimed,
                    },
                    attempts,
                    None,
                ))
            }
            Claimable::Outbox {
                outbox,
                publication,
                ..
            } => {
                let mut sending = outbox.moved(
                    OutboxState::Sending,
                    None,
                    self.shards,
                    now,
                    self.limits.retention.outbox,
                );
                sending.delivery_id = Some(delivery_id.to_string());
                let write = match publication {
                    // Not written yet: it is written claimed.
                    Some(_) => self.put_new(to_item("outbox", &sending)?)?,
                    None => {
                        versioned_put(&self.table, to_item("outbox", &sending)?, outbox.version)?
                    }
                };
                let attempts = sending.attempts;
                Ok((
                    write,
                    ClaimSource::Outbox(OutboxClaim {
                        note_id: sending.note_id.clone(),
                        data: sending.data.clone(),
                        page: sending.page.clone(),
                        item: sending,
                    }),
                    attempts,
                    publication,
                ))
            }
        }
    }
}
