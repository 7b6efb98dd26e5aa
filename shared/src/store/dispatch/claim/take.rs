//! A claim that takes a grant: the claimed item, the grant's reservation, the
//! delivery, the day's count (and a publication's writes) in one transaction, and what
//! its cancellation means for the next try.

use chrono::{DateTime, Duration, Utc};

use super::claimable::{ClaimOutcome, Claimable};
use crate::domain::dispatch::cap::Counted;
use crate::domain::dispatch::claim::{ClaimConditions, ClaimRefused, on_cancelled};
use crate::domain::{OpenId, TemplateId};
use crate::store::dispatch::claimed::Claim;
use crate::store::dispatch::due::DueItem;
use crate::store::dispatch::reserve::{AsRead, Reserve};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::quota::{INFLIGHT, WAITING};
use crate::store::keys::delivery_sk;
use crate::store::retry::Attempt;
use crate::store::tx::{Outcome, Parts};

/// What one try of a claim learns for the next: whether the quota item listed a grant
/// that was not available after all (the next tries pick from the ledger), and the
/// attempts whose answer was lost past every resend and whose delivery was not there
/// yet (one may still commit while later attempts read and decide).
#[derive(Default)]
pub(super) struct Carried {
    pub(super) ledger_only: bool,
    pub(super) unanswered: Vec<Claim>,
}

/// A claim taking `grant`, as decided at `now`: for `claimer`, leased for `lease`,
/// counting its send as `counted` says.
pub(super) struct Taking<'a> {
    pub(super) item: &'a DueItem,
    pub(super) openid: &'a OpenId,
    pub(super) claimer: &'a str,
    pub(super) lease: std::time::Duration,
    pub(super) now: DateTime<Utc>,
    pub(super) grant: Reserve,
    pub(super) counted: Option<Counted>,
}

/// The parts of a claim's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The claimed plan or push, as read.
    Source,
    /// The grant reserved: still available.
    Grant,
    /// The template's counters: as read, the grant there, the day under its cap.
    Counters,
    Delivery,
    /// A scheduled notification's publication, committed with its push's claim.
    Publication,
    /// The user is not being erased: an erasure begun before the claim commits makes
    /// it lose, so nothing of theirs is sent once it has begun.
    Alive,
}

impl Store {
    /// Commits a claim of `claimable` taking a grant of `template` (with its
    /// publication's writes, for a push not yet written).
    pub(super) async fn take(
        &self,
        taking: Taking<'_>,
        claimable: Claimable,
        template: TemplateId,
        carried: &mut Carried,
    ) -> Result<Attempt<ClaimOutcome>, StoreError> {
        let Taking {
            item,
            openid,
            claimer,
            lease,
            now,
            mut grant,
            counted,
        } = taking;
        let (counters, open) = claimable.grants();
        // (Not the in-flight set: the reservation adds to it, and one update cannot
        // both add to and delete from an attribute. Events prune it.)
        grant.stale = open
            .stale_marks(now)
            .into_iter()
            .filter(|(name, _)| *name != INFLIGHT)
            .collect();
        // Listed as waiting: it leaves the list with its claim.
        if let Some(own) = claimable
            .waiting_member()
            .filter(|own| open.waiting.contains(own))
        {
            grant.stale.push((WAITING, vec![own]));
        }
        grant.counted = counted;
        // A push is claimed only while the user's settings do not refuse its template.
        grant.unrefused = matches!(claimable, Claimable::Outbox { .. });
        // Decided on counters read ahead: only while they are as read.
        if let Claimable::Outbox { ahead: true, .. } = claimable {
            grant.as_read = Some(AsRead {
                available: counters.available,
                waiting: open.waiting.len(),
            });
        }
        let delivery_id = uuid::Uuid::new_v4().simple().to_string();
        // The lease runs from this attempt, not from the first: a claim that had to
        // retry under contention still gets its whole send window.
        let lease_until =
            self.clock.now().max(now) + Duration::from_std(lease).unwrap_or(Duration::seconds(60));
        // A plan's own instant, not its entry's (one moved ahead while its kind was
        // missing): the message says it, and a released claim is due at it again.
        let due_at = match &claimable {
            Claimable::Plan { plan, .. } => plan.scheduled_at().unwrap_or(item.due_at),
            Claimable::Outbox { .. } => item.due_at,
        };
        let (source_write, source, attempts, publishing) =
            self.claimed_source(item, claimable, &delivery_id, lease_until, now)?;
        let reservation = self.reservation(
            item,
            &template,
            &grant,
            &delivery_id,
            claimer,
            attempts,
            lease_until,
            now,
        )?;
        let mut parts = Parts::new()
            .with(Part::Source, source_write)
            .with(Part::Grant, reservation.grant)
            .with(Part::Counters, reservation.counters)
            .with(Part::Delivery, reservation.delivery)
            .with(Part::Alive, self.not_erased_check(openid)?);
        // The publication's writes, its scheduled item's delete first of them.
        let publishing = publishing.is_some_and(|writes| {
            for write in writes {
                parts.add(Part::Publication, write);
            }
            true
        });
        let claim = Claim {
            delivery_id,
            claimer: claimer.to_string(),
            openid: openid.clone(),
            template_id: template,
            due_at,
            lease_until,
            claimed_at: now,
            source,
            grant_sk: grant.sk.clone(),
            counted_on: grant.counted.as_ref().map(|c| c.day),
        };
        match self.transact_parts(&parts).await? {
            Outcome::Committed => {
                return Ok(Attempt::Done(ClaimOutcome::Claimed(Box::new(claim))));
            }
            // The user is being erased: nothing is sent, the erasure deletes the item.
            Outcome::Cancelled(failed) if failed.has(Part::Alive) => {
                tracing::info!("a claim lost to the user's erasure");
                return Ok(Attempt::Done(ClaimOutcome::Lost));
            }
            Outcome::Cancelled(failed) => {
                // The notification changed (cancelled, replaced, published by another),
                // its push exists already, or a publication write failed: the ordinary
                // way sorts it.
                if publishing && (failed.has(Part::Source) || failed.has(Part::Publication)) {
                    return Ok(Attempt::Done(ClaimOutcome::Republish));
                }
                let conditions = ClaimConditions {
                    source: failed.has(Part::Source),
                    grant: failed.has(Part::Grant),
                    counters: failed.has(Part::Counters),
                };
                match on_cancelled(conditions, grant.listed) {
                    ClaimRefused::Lost => return Ok(Attempt::Done(ClaimOutcome::Lost)),
                    ClaimRefused::ListWrong => {
                        tracing::error!(
                            "a grant listed as available is not; claiming from the ledger"
                        );
                        carried.ledger_only = true;
                    }
                    ClaimRefused::PickAgain => {}
                }
            }
            // Another transaction's: read and pick again.
            Outcome::Conflict => {}
            Outcome::Contended => {
                // It may have committed with its answer lost past every resend: its
                // delivery, named by this attempt alone, exists only if so. (Read again
                // instead, the plan would look claimed by another.) A look that fails is
                // not an answer: it is looked for again before the claim ends.
                match self.get(&item.pk, &delivery_sk(&claim.delivery_id)).await {
                    Ok(Some(_)) => {
                        tracing::warn!("a claim whose answer was lost had committed");
                        return Ok(Attempt::Done(ClaimOutcome::Claimed(Box::new(claim))));
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(
                        error = %crate::telemetry::error_chain(&e),
                        "a claim's delivery could not be looked for; looked for again before the claim ends"
                    ),
                }
                carried.unanswered.push(claim);
            }
        }
        Ok(Attempt::Retry)
    }
}
