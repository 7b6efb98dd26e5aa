//! Claiming a due item: a plan or a push, behind one `Claimable`. The store reads it
//! (`read`), the domain decides (`domain::dispatch::claim::decide`: the gates in
//! their order, the cap, the grant), the store commits: a claim taking a grant
//! (`take`) or the item left unsent and why (`unsent`, `priority`).

mod claimable;
mod priority;
mod read;
mod source;
mod take;
mod unsent;

pub use read::ReadAhead;

pub use claimable::ClaimOutcome;
use claimable::Found;
use take::{Carried, Taking};

use chrono::{DateTime, Utc};

use crate::domain::dispatch::claim::{ClaimDecision, Decide, Unsent, decide};
use crate::store::dispatch::due::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::keys::delivery_sk;
use crate::store::retry::{Attempt, retry_carrying};

/// How many times a call that gives up looks for the deliveries of its attempts whose
/// answers were lost, and the first pause between looks (doubling: 0.6 s in all). A
/// claim found late with too little of its lease left is released unsent, as any.
const UNANSWERED_LOOKS: u32 = 3;
const UNANSWERED_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

impl Store {
    /// Claims a due item (see the module docs): `claimer` names this dispatcher run,
    /// `lease` how long the delivery is its own — long enough for the send and the
    /// finalize.
    pub async fn claim(
        &self,
        item: &DueItem,
        claimer: &str,
        lease: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_from(item, None, claimer, lease, now).await
    }

    /// Publishes a scheduled notification and claims its push in one transaction:
    /// `item` is the push's due entry (`DueItem::published_push`), `publication` what
    /// `Store::publication` read, with what `Store::read_ahead` read for its claim. A
    /// push not to go now, or a notification changed
    /// since it was read, writes nothing ([`ClaimOutcome::Republish`]).
    pub async fn claim_published(
        &self,
        item: &DueItem,
        publication: &ReadAhead,
        claimer: &str,
        lease: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_from(item, Some(publication), claimer, lease, now)
            .await
    }

    async fn claim_from(
        &self,
        item: &DueItem,
        publication: Option<&ReadAhead>,
        claimer: &str,
        lease: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<ClaimOutcome, StoreError> {
        let Some(openid) = item.openid() else {
            return Ok(ClaimOutcome::Unreadable(
                "due item outside a user partition".into(),
            ));
        };
        // Contended past the retry limit, the item is left for the next tick (the
        // dispatcher logs and counts it).
        let openid = &openid;
        // Carried from try to try: whether the quota item listed a grant that was not
        // available after all (the next tries pick from the ledger), and the attempts
        // whose answer was lost past every resend and whose delivery was not there yet
        // (one may still commit while later attempts read and decide).
        let carried = retry_carrying(
            "claim",
            self.limits.write_budget,
            Carried::default(),
            |mut carried: Carried| async move {
                let decided = async {
                    let found = match publication {
                        Some(publication) => self.publishable(item, publication).await?,
                        None => self.claimable(item).await?,
                    };
                    let claimable = match found {
                        Found::Due(claimable) => *claimable,
                        Found::Gone => return Ok(Attempt::Done(ClaimOutcome::Lost)),
                        // (A publication's push is not written yet: the ordinary way writes it,
                        // then finds it unreadable and takes it off the due index.)
                        Found::Unreadable(_) if publication.is_some() => {
                            return Ok(Attempt::Done(ClaimOutcome::Republish));
                        }
                        Found::Unreadable(why) => {
                            return Ok(Attempt::Done(ClaimOutcome::Unreadable(why)));
                        }
                        Found::NoKind(kind) => {
                            return Ok(Attempt::Done(ClaimOutcome::NoKind(kind)));
                        }
                    };
                    let template = claimable.template()?;
                    // The store reads, the domain decides (reading the better pushes due
                    // together only when the decision asks for them).
                    let facts = claimable.facts(self.limits.pushes_per_day, now);
                    let decision = match decide(&facts) {
                        Decide::Now(decision) => decision,
                        Decide::ReadDueTogether(yielding) => {
                            let due = self
                                .due_better(&item.pk, &template, &yielding.own, now)
                                .await?;
                            yielding.decide(&facts, &due)
                        }
                    };
                    let why = match decision {
                        ClaimDecision::Take(counted) => {
                            let (counters, open) = claimable.grants();
                            match self
                                .pick_grant(
                                    &item.pk,
                                    &template,
                                    counters,
                                    open,
                                    carried.ledger_only,
                                )
                                .await?
                            {
                                Some(grant) => {
                                    let taking = Taking {
                                        item,
                                        openid,
                                        claimer,
                                        lease,
                                        now,
                                        grant,
                                        counted,
                                    };
                                    // Boxed: a claim's future stays small on a dispatcher's stack.
                                    return Box::pin(self.take(
                                        taking,
                                        claimable,
                                        template,
                                        &mut carried,
                                    ))
                                    .await;
                                }
                                None => Unsent::none_picked(claimable.waiting_member().is_some()),
                            }
                        }
                        ClaimDecision::Unsent(why) => why,
                    };
                    if publication.is_some() {
                        return Ok(Attempt::Done(ClaimOutcome::Republish));
                    }
                    Box::pin(self.leave_unsent(item, openid, &claimable, template, why, now)).await
                }
                .await;
                (decided, carried)
            },
        )
        .await;
        let (outcome, Carried { unanswered, .. }) = carried;
        if matches!(outcome, Ok(ClaimOutcome::Claimed(_))) {
            return outcome;
        }
        // An unanswered attempt that committed after its delivery was looked for made
        // the item look claimed by another (or moved), or kept the later attempts from
        // committing: it is this call's own claim, with the grant it reserved, and must
        // be sent, not left for the sweep to settle as unknown. Its delivery, named by
        // that attempt alone, exists only if it committed. (One committing after this
        // last look still ends with the sweep: docs/design.md, I4.) One round trip for
        // all of them; failing, the outcome stands.
        if unanswered.is_empty() {
            return outcome;
        }
        let keys: Vec<String> = unanswered
            .iter()
            .map(|claim| delivery_sk(&claim.delivery_id))
            .collect();
        // A look that fails is not an answer either: an overloaded table that lost the
        // claim's answer often fails the next read too (seen beside two CPU hogs: both
        // failed, the claim committed, and the sweep voided a grant for a message that
        // never went out). Looked for again, with pauses, before the sweep is left it.
        let mut looks = 0;
        let found = loop {
            looks += 1;
            match self.read_items(&item.pk, &keys).await {
                Ok(found) => break Some(found),
                Err(e) if looks < UNANSWERED_LOOKS => {
                    tracing::warn!(
                        error = %crate::telemetry::error_chain(&e),
                        looks,
                        "claims whose answers were lost could not be looked for; looking again"
                    );
                    tokio::time::sleep(UNANSWERED_PAUSE * 2u32.pow(looks - 1)).await;
                }
                Err(e) => {
                    tracing::error!(
                        error = %crate::telemetry::error_chain(&e),
                        "claims whose answers were lost could not be looked for; the sweep settles any that committed"
                    );
                    break None;
                }
            }
        };
        if let Some(found) = found
            && let Some(claim) = unanswered
                .into_iter()
                .find(|claim| found.contains_key(&delivery_sk(&claim.delivery_id)))
        {
            tracing::warn!("a claim whose answer was lost committed late");
            return Ok(ClaimOutcome::Claimed(Box::new(claim)));
        }
        outcome
    }
}
