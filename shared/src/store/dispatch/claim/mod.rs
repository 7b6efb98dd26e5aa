//! Claiming a due item: a plan or a push, behind one [`Claimable`]: read it
//! ([`read`]), decide (the domain's gates and the grant to reserve), commit.

mod claimable;
mod priority;
mod read;
mod source;
mod unsent;

pub use read::ReadAhead;

use claimable::{Claimable, Found};

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Duration, Utc};

use crate::domain::TemplateId;
use crate::domain::consent::standing::Standing;
use crate::domain::dispatch::cap::{AtCap, at_cap, day_of};
use crate::domain::dispatch::claim::{ClaimConditions, ClaimRefused, on_cancelled};
use crate::domain::dispatch::priority::{AtGrant, at_grant, at_grant_due, contenders, may_yield};
use crate::domain::inbox::cancel::{AtClaim, at_claim};
use crate::domain::inbox::preferences::gate;
use crate::store::dispatch::reserve::AsRead;
use crate::store::dispatch::{Claim, ClaimSource, DueItem};
use crate::store::items::quota::{INFLIGHT, WAITING};
use crate::store::keys::delivery_sk;
use crate::store::tx::{TxOutcome, is_condition_failed};
use crate::store::{Attempt, Store, StoreError, retry_carrying};

/// How many times a call that gives up looks for the deliveries of its attempts whose
/// answers were lost, and the first pause between looks (doubling: 0.6 s in all). A
/// claim found late with too little of its lease left is released unsent, as any.
const UNANSWERED_LOOKS: u32 = 3;
const UNANSWERED_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// How a claim attempt ended.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claim>),
    /// Someone else claimed it first, or it changed since the index was read.
    Lost,
    /// No grant to reserve: the plan was paused `needs_grant` / the push skipped (its
    /// template's waiting list full).
    NoGrant,
    /// A push that waits for a grant of its template (named; none available, or a
    /// better push waits for those there are): `pending`, listed on the quota item,
    /// woken by a grant.
    WaitGrant(TemplateId),
    /// A push whose `expires_at` passed: recorded `expired`, nothing sent or spent.
    Expired,
    /// A push of a type the user muted: recorded `muted`, nothing sent or spent.
    Muted,
    /// A push of a template the user's settings keep refused: recorded `skipped`
    /// (`turned_off`), nothing sent or spent.
    TurnedOff,
    /// A push cancelled while an earlier attempt was in flight, now due again:
    /// recorded `cancelled`, nothing sent or spent.
    Cancelled,
    /// A push replaced (a newer notification of its `collapse_key`) while an earlier
    /// attempt was in flight, now due again: recorded `replaced`, nothing sent or spent.
    Replaced,
    /// A push in the user's quiet hours: due again at their end.
    Held(DateTime<Utc>),
    /// Past the user's daily cap: due again at the start of their next day (a plan at
    /// its first waking moment), or, None, a push that would expire first, recorded
    /// `capped`. Nothing sent or spent.
    Capped(Option<DateTime<Utc>>),
    /// A publication (`Store::claim_published`) whose scheduled notification changed
    /// since it was read, or whose push is not to go now (muted, held, no grant):
    /// nothing was written; publish it the ordinary way (`Store::publish`), then
    /// claim its push.
    Republish,
    /// The item itself cannot be read: it can never be claimed as it is. Say why.
    Unreadable(String),
    /// A plan of a reminder kind this deployment does not configure (removed, or a
    /// rollback), named: its entry is moved out of the way
    /// ([`Store::park_due`](crate::store::Store::park_due)), for when the kind is back.
    NoKind(String),
}

/// Why a due item is not sent (now).
#[derive(Debug, Clone, Copy)]
enum Unsent {
    NoGrant,
    /// A push waits for a grant (due only at its `expires_at`, until a grant wakes it).
    WaitGrant,
    Expired,
    /// Its notification type is muted.
    Muted,
    /// The user's settings keep its template refused.
    TurnedOff,
    /// A cancel came while an earlier attempt was in flight.
    Cancelled,
    /// A newer notification of its `collapse_key` came while an earlier attempt was in
    /// flight.
    Replaced,
    /// Quiet hours: due again at their end.
    Held(DateTime<Utc>),
    /// The daily cap reached: due again at the start of the user's next day.
    Capped(DateTime<Utc>),
    /// The daily cap reached by a push that expires before the next day.
    CappedOut,
}

/// A claimed item's write, what the dispatcher keeps of it, its attempts so far and,
/// for a push not yet written, its publication's writes.
type Sourced = (
    TransactWriteItem,
    ClaimSource,
    u32,
    Option<Vec<TransactWriteItem>>,
);

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
        let carried = retry_carrying("claim", self.limits.write_budget, (false, Vec::new()), |(mut ledger_only, mut unanswered): (bool, Vec<Claim>)| async move {
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
                    Found::Unreadable(why) => return Ok(Attempt::Done(ClaimOutcome::Unreadable(why))),
                    Found::NoKind(kind) => return Ok(Attempt::Done(ClaimOutcome::NoKind(kind))),
                };
                if let Claimable::Outbox {
                    outbox,
                    open,
                    prefs,
                    requested,
                    publication,
                    ..
                } = &claimable
                {
                    // Cancelled, replaced, expired, turned off, muted or in quiet hours: not
                    // sent now.
                    let priority = outbox.priority.unwrap_or_default();
                    let gate = gate(prefs, outbox.note_type.as_deref(), priority, now);
                    let at = at_claim(*requested, outbox.send_by, open.standing, gate, now);
                    let why = match at {
                        AtClaim::Go => None,
                        AtClaim::Cancelled => Some(Unsent::Cancelled),
                        AtClaim::Replaced => Some(Unsent::Replaced),
                        AtClaim::Expired => Some(Unsent::Expired),
                        AtClaim::TurnedOff => Some(Unsent::TurnedOff),
                        AtClaim::Muted => Some(Unsent::Muted),
                        AtClaim::Held(until) => Some(Unsent::Held(until)),
                    };
                    if why.is_some() && publication.is_some() {
                        return Ok(Attempt::Done(ClaimOutcome::Republish));
                    }
                    if let Some(why) = why {
                        let mut writes = self.unsent_writes(item, &claimable, why, now)?;
                        // Skipped only while the refusal still stands as read: a setting
                        // that accepts again meanwhile makes the skip lose (read again).
                        if matches!(why, Unsent::TurnedOff) {
                            writes.push(self.standing_check(&item.pk, &claimable.template()?, open.standing)?);
                        }
                        // A push that waited for a grant and ends (or is put off) here may
                        // have been woken for one: the next waiting push is woken instead
                        // (its own member, no longer waiting, is dropped on the way) — by
                        // the wake entry this commit makes due, and at once below.
                        let listed = claimable.listed();
                        if listed {
                            self.pass_the_wake(&mut writes, &item.pk, &claimable.template()?, now)?;
                        }
                        // Else it moved meanwhile: read again.
                        let committed = self.commit_unsent(writes).await?;
                        if committed && listed {
                            Box::pin(self.wake_waiting_logged(openid, &claimable.template()?, now))
                                .await;
                        }
                        return Ok(if committed {
                            Attempt::Done(match why {
                                Unsent::Held(until) => ClaimOutcome::Held(until),
                                Unsent::Muted => ClaimOutcome::Muted,
                                Unsent::TurnedOff => ClaimOutcome::TurnedOff,
                                Unsent::Cancelled => ClaimOutcome::Cancelled,
                                Unsent::Replaced => ClaimOutcome::Replaced,
                                Unsent::Expired | Unsent::NoGrant | Unsent::WaitGrant => {
                                    ClaimOutcome::Expired
                                }
                                Unsent::Capped(until) => ClaimOutcome::Capped(Some(until)),
                                Unsent::CappedOut => ClaimOutcome::Capped(None),
                            })
                        } else {
                            Attempt::Retry
                        });
                    }
                }
                // A plan whose template the user's settings refuse (a choice made while its
                // kind was not configured) is paused for it, while the refusal stands.
                if let Claimable::Plan { open, .. } = &claimable
                    && open.standing.is_some_and(Standing::refuses)
                {
                    let mut writes = self.unsent_writes(item, &claimable, Unsent::TurnedOff, now)?;
                    writes.push(self.standing_check(&item.pk, &claimable.template()?, open.standing)?);
                    return Ok(if self.commit_unsent(writes).await? {
                        Attempt::Done(ClaimOutcome::TurnedOff)
                    } else {
                        Attempt::Retry
                    });
                }
                let template = claimable.template()?;
                let (counters, open) = claimable.grants();
                // Past the user's daily cap: not now (before the grant: none is spent).
                let cap = self.limits.pushes_per_day;
                let counted = match at_cap(
                    cap,
                    &open.sent_days,
                    claimable.day_zone(),
                    claimable.send_by(),
                    now,
                ) {
                    AtCap::Go(counted) => counted,
                    _ if publication.is_some() => return Ok(Attempt::Done(ClaimOutcome::Republish)),
                    capped => {
                        let (why, until) = match capped {
                            AtCap::Wait(until) => (Unsent::Capped(until), Some(until)),
                            AtCap::Go(_) | AtCap::Capped => (Unsent::CappedOut, None),
                        };
                        let mut writes = self.unsent_writes(item, &claimable, why, now)?;
                        let day = day_of(claimable.day_zone(), now);
                        writes.push(self.still_capped(&item.pk, &template, day, cap.unwrap_or(0))?);
                        // A push woken for a grant passes it on, as one ending unsent does.
                        let listed = claimable.listed();
                        if listed {
                            self.pass_the_wake(&mut writes, &item.pk, &template, now)?;
                        }
                        // Else a count was given back (or the item moved): read again.
                        let committed = self.commit_unsent(writes).await?;
                        if committed && listed {
                            Box::pin(self.wake_waiting_logged(openid, &template, now)).await;
                        }
                        return Ok(if committed {
                            Attempt::Done(ClaimOutcome::Capped(until))
                        } else {
                            Attempt::Retry
                        });
                    }
                };
                // A push yields to a better one waiting for the grants there are, or due
                // together with it (read only when it would take one, and only for a
                // class that can be beaten).
                let own = claimable.waiting_member();
                let at = match &own {
                    Some(own) => match at_grant(own, counters.available, &open.waiting) {
                        AtGrant::Take if may_yield(own) => {
                            let due = self.due_better(&item.pk, &template, own, now).await?;
                            let due = match claimable.push_prefs() {
                                Some(prefs) => contenders(&due, prefs, now),
                                None => Vec::new(),
                            };
                            at_grant_due(own, counters.available, &open.waiting, &due)
                        }
                        at => at,
                    },
                    None => AtGrant::Take,
                };
                let grant = match at {
                    AtGrant::Take => {
                        self.pick_grant(
                            &item.pk,
                            &template,
                            counters,
                            open,
                            ledger_only,
                        )
                        .await?
                    }
                    AtGrant::Wait { .. } | AtGrant::Skip { .. } | AtGrant::Yield => None,
                };
                let Some(mut grant) = grant else {
                    if publication.is_some() {
                        return Ok(Attempt::Done(ClaimOutcome::Republish));
                    }
                    // Boxed: a claim's future stays small on a dispatcher's stack.
                    return Box::pin(self.not_granted(
                        item,
                        &claimable,
                        &template,
                        at,
                        own.as_deref(),
                        now,
                    ))
                    .await;
                };
                // (Not the in-flight set: the reservation adds to it, and one update cannot
                // both add to and delete from an attribute. Events prune it.)
                grant.stale = open
                    .stale_marks(now)
                    .into_iter()
                    .filter(|(name, _)| *name != INFLIGHT)
                    .collect();
                // Listed as waiting: it leaves the list with its claim.
                if let Some(own) = own.filter(|own| open.waiting.contains(own)) {
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
                let mut writes = vec![source_write];
                writes.extend(self.reservation(
                    item,
                    &template,
                    &grant,
                    &delivery_id,
                    claimer,
                    attempts,
                    lease_until,
                    now,
                )?);
                // The publication's writes last, its scheduled item's delete first of them.
                let published_at = writes.len();
                let publishing = publishing.is_some_and(|more| {
                    writes.extend(more);
                    true
                });
                let written = writes.len();
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
                match self.transact(writes).await? {
                    TxOutcome::Committed => {
                        return Ok(Attempt::Done(ClaimOutcome::Claimed(Box::new(claim))));
                    }
                    TxOutcome::Cancelled(reasons) => {
                        let failed = |i: usize| {
                            reasons
                                .get(i)
                                .is_some_and(|(code, _)| is_condition_failed(code))
                        };
                        // The notification changed (cancelled, replaced, published by
                        // another), its push exists already, or a publication write failed:
                        // the ordinary way sorts it.
                        if publishing && (failed(0) || (published_at..written).any(failed)) {
                            return Ok(Attempt::Done(ClaimOutcome::Republish));
                        }
                        let conditions = ClaimConditions {
                            source: failed(0),
                            grant: failed(1),
                            // (No answer for the counters: not known to agree.)
                            counters: reasons
                                .get(2)
                                .is_none_or(|(code, _)| is_condition_failed(code)),
                        };
                        match on_cancelled(conditions, grant.listed) {
                            ClaimRefused::Lost => return Ok(Attempt::Done(ClaimOutcome::Lost)),
                            ClaimRefused::ListWrong => {
                                tracing::error!(
                                    "a grant listed as available is not; claiming from the ledger"
                                );
                                ledger_only = true;
                            }
                            ClaimRefused::PickAgain => {}
                        }
                    }
                    TxOutcome::Contended => {
                        // It may have committed with its answer lost past every resend:
                        // its delivery, named by this attempt alone, exists only if so.
                        // (Read again instead, the plan would look claimed by another.) A
                        // look that fails is not an answer: it is looked for again below.
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
                        unanswered.push(claim);
                    }
                }
                Ok(Attempt::Retry)
            }
            .await;
            (decided, (ledger_only, unanswered))
        })
        .await;
        let (outcome, (_, unanswered)) = carried;
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
