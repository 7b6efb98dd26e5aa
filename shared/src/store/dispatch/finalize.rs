//! Finalizing a send: the outcome table written down, and late answers.
//!
//! **Late answers.** A sweep declares a delivery `unknown` when its lease ends with no
//! answer recorded (the dispatcher vanished or stalled). If that dispatcher then comes
//! back with WeChat's definite answer, the answer wins (I4): the delivery takes the
//! answer's state, `msgid` and errcode and keeps `swept_at`/`sweep_outcome` beside
//! `answered_late_at`; a grant of a message WeChat took goes `invalid → consumed`, one
//! of a message it certainly did not take goes back to `available` (only if the sweep,
//! not the user, voided it); a plan still paused `uncertain` for that delivery moves on
//! as if the answer had come in time, and a push still `unknown` likewise. Counters
//! move with the grant in the same transaction, so I2 holds throughout. A late answer
//! that is itself uncertain changes nothing.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};

use crate::domain::GrantState;
use crate::domain::inbox::{PushReason, PushStatus};
use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::PlanStatus;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::outbox::{OutboxItem, push_moved};
use crate::store::items::parse;
use crate::store::keys::user_pk;
use crate::store::retry::{Attempt, retry_contended};
use crate::telemetry::error_chain;

use crate::domain::dispatch::delivery::{Guard, Writer};
use crate::store::dispatch::claimed::{Claim, ClaimSource};
use crate::store::dispatch::delivery::describe;
use crate::store::dispatch::settle::{DeliveryWrite, GrantMove, SettleTx, Settled};

use crate::domain::dispatch::delivery::Moved;
use crate::domain::settle::{OutboxState, SendResult, Settlement, release, settle};

/// How a finalize ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finalized {
    pub settlement: Settlement,
    /// The grant went back to `available`.
    pub restored: bool,
    /// A sweep had settled the delivery first and nothing more was written (the
    /// answer was itself uncertain, or someone else answered it).
    pub superseded: bool,
    /// A sweep had declared the send `unknown`; this definite answer settled it.
    pub late: bool,
}

impl Finalized {
    /// This settlement landed (`restored`: its grant went back to `available`).
    fn landed(settlement: Settlement, restored: bool, late: bool) -> Self {
        Self {
            settlement,
            restored,
            superseded: false,
            late,
        }
    }

    /// Nothing more written: a sweep or another answer had settled the delivery.
    fn superseded(settlement: Settlement) -> Self {
        Self {
            superseded: true,
            ..Self::landed(settlement, false, false)
        }
    }
}

/// The item a delivery was claimed for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SourceRef<'a> {
    Plan(&'a ReminderKind),
    /// The outbox item's sort key.
    Outbox(&'a str),
}

impl Claim {
    fn source_ref(&self) -> SourceRef<'_> {
        match &self.source {
            ClaimSource::Plan { kind, .. } => SourceRef::Plan(kind),
            ClaimSource::Outbox(outbox) => SourceRef::Outbox(&outbox.item.sk),
        }
    }

    /// The claimed item's retryable failures in a row before this send.
    fn attempts(&self) -> u32 {
        match &self.source {
            ClaimSource::Plan { plan, .. } => plan.attempts,
            ClaimSource::Outbox(outbox) => outbox.item.attempts,
        }
    }
}

impl Store {
    /// Finalizes a delivery by its send result (see the module docs of
    /// [`dispatch`](super)).
    pub async fn finalize(
        &self,
        claim: &Claim,
        result: &SendResult,
        now: DateTime<Utc>,
    ) -> Result<Finalized, StoreError> {
        let policy = &self.policy;
        let settlement = settle(
            result.class(),
            result.errcode(),
            claim.attempts(),
            policy,
            now,
        );
        let finalized = self
            .finalize_with(claim, settlement, result, false, now)
            .await?;
        self.after_restore(claim, &finalized, now).await;
        Ok(finalized)
    }

    /// A grant given back wakes the best push waiting for one of its template (at
    /// once; the wake entry the settlement made due is the backstop).
    async fn after_restore(&self, claim: &Claim, finalized: &Finalized, now: DateTime<Utc>) {
        if finalized.restored {
            crate::failpoint::hit("before_wake");
            Box::pin(self.wake_waiting_logged(&claim.openid, &claim.template_id, now)).await;
        }
    }

    /// Gives a claim back unsent, for want of time: the grant restored, the item due
    /// again at its own due instant, no attempt spent (never left for the sweep).
    pub async fn release(
        &self,
        claim: &Claim,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<Finalized, StoreError> {
        let settlement = release(claim.attempts(), claim.due_at);
        let result = SendResult::NotSent {
            reason: format!("released unsent: {reason}"),
        };
        let finalized = self
            .finalize_with(claim, settlement, &result, true, now)
            .await?;
        self.after_restore(claim, &finalized, now).await;
        Ok(finalized)
    }

    async fn finalize_with(
        &self,
        claim: &Claim,
        settlement: Settlement,
        result: &SendResult,
        released: bool,
        now: DateTime<Utc>,
    ) -> Result<Finalized, StoreError> {
        let pk = user_pk(&claim.openid);
        let source = match &claim.source {
            ClaimSource::Plan { plan, .. } => {
                let mut plan = plan.clone();
                plan.finish_send(settlement.follow_up, settlement.attempts, false, now)?;
                // plan_put writes `version + 1` on the condition `version`: the claimed one.
                vec![self.plan_put(&plan, &pk, now)?]
            }
            ClaimSource::Outbox(outbox) => self.outbox_writes(
                &pk,
                &outbox.item,
                &claim.delivery_id,
                &settlement,
                result,
                now,
            )?,
        };
        let write = delivery_write(&settlement, result, Writer::answering(released, false));
        let tx = SettleTx {
            pk: &pk,
            delivery_id: &claim.delivery_id,
            claimed_at: claim.claimed_at,
            guard: Guard::Claimer(&claim.claimer),
            marks: write.marks(&claim.delivery_id, claim.claimed_at, now),
            template: &claim.template_id,
            write,
            grant: Some(GrantMove {
                sk: &claim.grant_sk,
                from: GrantState::Reserved,
                to: settlement.grant,
            }),
            counted_on: claim.counted_on,
            retry_whole: false,
            source,
        };
        match self.write_settlement(tx, now).await? {
            Settled::Landed { grant, source } => {
                // 43101 voids the template's other grants first, so a plan moved on
                // below sees the grants that are really left.
                self.after_settle(&pk, claim, &settlement, now).await?;
                if !source && let ClaimSource::Plan { kind, .. } = &claim.source {
                    crate::failpoint::hit("after_settle");
                    // The plan changed while the message was in flight (a check-in, a
                    // refusal, new settings): it must still leave `sending`.
                    self.advance_plan(&pk, kind, &claim.delivery_id, &settlement, now)
                        .await?;
                }
                Ok(Finalized::landed(
                    settlement,
                    grant && settlement.grant == GrantState::Available,
                    false,
                ))
            }
            Settled::DeliveryMoved(Some(now_item)) => {
                match now_item
                    .delivery()
                    .on_finalize_refused(&claim.claimer, settlement.delivery)
                {
                    Moved::AnswerLate => {
                        self.answer_late(&pk, claim, settlement, result, released, now)
                            .await
                    }
                    // This very settlement, landed before: what follows it runs again
                    // (each step is idempotent), instead of taking it for someone
                    // else's.
                    Moved::AlreadySettled { late } => {
                        self.after_settle(&pk, claim, &settlement, now).await?;
                        // (A late answer moves the plan in its own settlement.)
                        if !late && let ClaimSource::Plan { kind, .. } = &claim.source {
                            self.advance_plan(&pk, kind, &claim.delivery_id, &settlement, now)
                                .await?;
                        }
                        // (Whether the first try's grant move landed is not known here.)
                        Ok(Finalized::landed(settlement, false, late))
                    }
                    Moved::Superseded => Ok(Finalized::superseded(settlement)),
                }
            }
            Settled::DeliveryMoved(None) | Settled::SourceMoved => {
                Ok(Finalized::superseded(settlement))
            }
        }
    }

    /// A definite answer after a sweep (see the module docs): one transaction with the
    /// delivery, the grant and the claimed item, tried again from a fresh read if the
    /// item changes meanwhile.
    async fn answer_late(
        &self,
        pk: &str,
        claim: &Claim,
        settlement: Settlement,
        result: &SendResult,
        released: bool,
        now: DateTime<Utc>,
    ) -> Result<Finalized, StoreError> {
        tracing::warn!(
            delivery_id = %claim.delivery_id,
            outcome = settlement.class.as_str(),
            "WeChat answered after the sweep declared the send unknown: the answer wins"
        );
        let settlement = &settlement;
        retry_contended("late answer", self.limits.write_budget, || async move {
            let (source, may_restore) =
                match self
                    .late_source(
                        pk,
                        &claim.delivery_id,
                        claim.claimed_at,
                        claim.source_ref(),
                        settlement,
                        result,
                        now,
                    )
                    .await
                {
                    Ok(found) => found,
                    // Unreadable as stored: the answer is recorded all the same; the
                    // grant stays void (the plan may have been disabled) and the plan
                    // is left as it is.
                    Err(e @ StoreError::Corrupt(_)) => {
                        tracing::error!(error = %error_chain(&e), "late answer: the claimed item could not be read");
                        (Vec::new(), false)
                    }
                    // Not read for now (a throttle, an outage): recorded without it, the
                    // plan would stay paused `uncertain` for good; read it again.
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), "late answer: the claimed item not read yet");
                        return Ok(Attempt::Retry);
                    }
                };
            let write = delivery_write(
                settlement,
                result,
                Writer::answering(released, true),
            );
            let tx = SettleTx {
                pk,
                delivery_id: &claim.delivery_id,
                claimed_at: claim.claimed_at,
                guard: Guard::Swept(&claim.claimer),
                marks: write.marks(&claim.delivery_id, claim.claimed_at, now),
                template: &claim.template_id,
                write,
                grant: settlement.after_sweep(may_restore).map(|to| GrantMove {
                    sk: &claim.grant_sk,
                    from: GrantState::Invalid,
                    to,
                }),
                counted_on: claim.counted_on,
                retry_whole: true,
                source,
            };
            match self.write_settlement(tx, now).await? {
                Settled::Landed { grant, .. } => {
                    self.after_settle(pk, claim, settlement, now).await?;
                    Ok(Attempt::Done(Finalized::landed(
                        *settlement,
                        grant && settlement.grant == GrantState::Available,
                        true,
                    )))
                }
                Settled::SourceMoved => Ok(Attempt::Retry),
                Settled::DeliveryMoved(_) => Ok(Attempt::Done(Finalized::superseded(*settlement))),
            }
        })
        .await
    }

    /// For a late answer (or WeChat's sent event) on an `unknown` delivery: the
    /// claimed item's writes (or a check that it has not changed), and whether its
    /// grant may go back to `available` — not if the user disabled the plan, whose
    /// disable voided it for good.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn late_source(
        &self,
        pk: &str,
        delivery_id: &str,
        claimed_at: DateTime<Utc>,
        source: SourceRef<'_>,
        settlement: &Settlement,
        result: &SendResult,
        now: DateTime<Utc>,
    ) -> Result<(Vec<TransactWriteItem>, bool), StoreError> {
        match source {
            SourceRef::Plan(kind) => {
                let read = self.read(pk, kind, None).await?;
                let Some(item) = read.plan else {
                    return Ok((Vec::new(), true));
                };
                let mut plan = item.into_plan(kind)?;
                if plan.status == PlanStatus::Disabled {
                    return Ok((vec![self.plan_unchanged(pk, &plan)?], false));
                }
                let available =
                    read.counters.available > 0 || settlement.grant == GrantState::Available;
                let moved =
                    plan.settle_late(delivery_id, settlement, available, claimed_at, now)?;
                let write = if moved {
                    self.plan_put(&plan, pk, now)?
                } else {
                    // Not waiting on this delivery any more, but still the plan read
                    // here: a disable landing meanwhile makes the answer read again.
                    self.plan_unchanged(pk, &plan)?
                };
                Ok((vec![write], true))
            }
            SourceRef::Outbox(sk) => {
                let writes = match self.current_outbox(pk, sk).await? {
                    Some(current)
                        if current.state == OutboxState::Unknown
                            && current.delivery_id.as_deref() == Some(delivery_id) =>
                    {
                        self.outbox_writes(pk, &current, delivery_id, settlement, result, now)?
                    }
                    Some(_) | None => Vec::new(),
                };
                Ok((writes, true))
            }
        }
    }

    /// 43101: WeChat holds no quota for this user and template, so none of the grants
    /// we held when the send was claimed is real any more (one reported since is).
    async fn after_settle(
        &self,
        pk: &str,
        claim: &Claim,
        settlement: &Settlement,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if !settlement.invalidate_others {
            return Ok(());
        }
        self.void_others(
            pk,
            &claim.delivery_id,
            &claim.template_id,
            claim.claimed_at,
            now,
        )
        .await
    }

    /// A push's writes for a settlement: the outbox item (conditional on its version)
    /// and the notification's push status.
    pub(crate) fn outbox_writes(
        &self,
        pk: &str,
        outbox: &OutboxItem,
        delivery_id: &str,
        settlement: &Settlement,
        result: &SendResult,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let state = settlement.outbox_state();
        let due = settlement.retry_at();
        let mut next = outbox.moved(state, due, self.shards, now, self.limits.retention.outbox);
        next.attempts = settlement.attempts;
        if state == OutboxState::Unknown {
            // Kept so that a late answer or WeChat's push event can still settle it.
            next.delivery_id = Some(delivery_id.to_string());
        }
        let push = PushStatus::of_outbox(state);
        let reason = PushReason::of_send(result);
        push_moved(&self.table, pk, outbox, &next, Some((push, reason)), now)
    }

    pub(crate) async fn current_outbox(
        &self,
        pk: &str,
        sk: &str,
    ) -> Result<Option<OutboxItem>, StoreError> {
        self.get(pk, sk)
            .await?
            .map(|item| parse("outbox", item))
            .transpose()
    }

    /// Moves a plan out of `sending` for `delivery_id` by `settlement`, re-reading it
    /// for each attempt. Nothing happens (false) if the plan has moved on (disabled, or
    /// another delivery's).
    pub(crate) async fn advance_plan(
        &self,
        pk: &str,
        kind: &ReminderKind,
        delivery_id: &str,
        settlement: &Settlement,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        retry_contended(
            "plan update after a send",
            self.limits.write_budget,
            || async move {
                let Some(put) = self
                    .plan_after_send(pk, kind, delivery_id, settlement, now)
                    .await?
                else {
                    return Ok(Attempt::Done(false));
                };
                self.commit_or_retry(vec![put], true).await
            },
        )
        .await
    }

    /// The plan's write once the send of `delivery_id` settled, if the plan is still
    /// `sending` for it.
    pub(crate) async fn plan_after_send(
        &self,
        pk: &str,
        kind: &ReminderKind,
        delivery_id: &str,
        settlement: &Settlement,
        now: DateTime<Utc>,
    ) -> Result<Option<TransactWriteItem>, StoreError> {
        let read = self.read(pk, kind, None).await?;
        let Some(item) = read.plan else {
            return Ok(None);
        };
        let mut plan = item.into_plan(kind)?;
        if plan.status != PlanStatus::Sending || plan.delivery_id.as_deref() != Some(delivery_id) {
            return Ok(None);
        }
        // A check-in made during the send counts, with the grants there are now.
        let available = read.counters.available > 0;
        plan.finish_send(settlement.follow_up, settlement.attempts, available, now)?;
        Ok(Some(self.plan_put(&plan, pk, now)?))
    }
}

/// What a settlement writes to the delivery.
pub(super) fn delivery_write(
    settlement: &Settlement,
    result: &SendResult,
    by: Writer,
) -> DeliveryWrite {
    let msgid = match result {
        SendResult::Sent { msgid } => msgid.clone(),
        SendResult::Refused { .. }
        | SendResult::Uncertain { .. }
        | SendResult::NotSent { .. }
        | SendResult::Invalid { .. } => None,
    };
    DeliveryWrite {
        state: settlement.delivery,
        class: settlement.class,
        outcome: describe(result),
        errcode: result.errcode(),
        msgid,
        by,
        void_others: settlement.invalidate_others,
    }
}
