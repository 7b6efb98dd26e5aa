//! The sweep: what a vanished or stalled dispatcher left behind (I4, I5).

use chrono::{DateTime, Utc};
use futures::StreamExt;

use crate::domain::reminders::plan::PlanStatus;
use crate::domain::{GrantState, TemplateId};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::query::{Range, partition};
use crate::store::items::{Item, n, parse, s};
use crate::store::keys::{SortKey, delivery_sk, lease_shard_pk, openid_of, sort_key};
use crate::telemetry::error_chain;

use crate::domain::dispatch::delivery::{Guard, Writer};
use crate::store::dispatch::delivery::{DeliveryItem, PlanRead};
use crate::store::dispatch::lease::Index;
use crate::store::dispatch::settle::{DeliveryWrite, GrantMove, SettleTx, Settled};

use crate::domain::dispatch::delivery::{AtLeaseEnd, PlanLearns};
use crate::domain::dispatch::sweep::{Disposition, StepEnd, disposition, quarantined_after};
use crate::domain::settle::{DeliveryState, OutboxState, OutcomeClass, settle};

/// At most this many lease-index entries per shard are handled in one sweep; the rest
/// wait for the next tick (a sweep's work is bounded whatever the backlog).
pub const SWEEP_BATCH_PER_SHARD: i32 = 25;

/// What a sweep step did with its entry.
pub(crate) enum Step {
    Acted,
    /// Settled by WeChat's answer that a finalize kept, or a 43101's voiding finished:
    /// the truth recorded, not `unknown`.
    Kept,
    /// Nothing to do (not stale, or already settled).
    Idle,
    /// The entry's own item cannot be read: why.
    Unreadable(String),
    /// Not to be handled now, through no fault of the item (a plan of a reminder kind
    /// missing from the configuration: removed, or a rollback): tried again after the
    /// entries behind it, never quarantined, so it is handled once the kind is back.
    Later(String),
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Deliveries past their lease settled `unknown`.
    pub recovered: u32,
    /// Deliveries past their lease settled by the answer their finalize kept, or whose
    /// 43101 voiding was finished.
    pub kept: u32,
    /// Plans left `sending` after their delivery settled, moved on.
    pub advanced: u32,
    /// Recorded WeChat events no try applied, applied.
    pub events_applied: u32,
    /// Entries (or whole shards) that could not be read or settled: logged, skipped.
    pub skipped: u32,
    /// Entries taken off the lease index for an operator (`quarantined_at`): unreadable,
    /// or failed `SWEEP_FAILURE_LIMIT` times.
    pub quarantined: u32,
}

/// The most lease-index queries a sweep has in flight: a share of the store's
/// [`INDEX_QUERIES_IN_FLIGHT`](crate::store::handle::INDEX_QUERIES_IN_FLIGHT), so that at the
/// default 16 shards it still reads them all in two rounds.
const SWEEP_QUERIES_IN_FLIGHT: usize = 8;

impl Store {
    /// The entries past their lease: one query page per shard of the lease index,
    /// never a scan, a few shards at a time; with the count of shards that could not
    /// be read (skipped this tick). [`Store::sweep`](crate::store::handle::Store::sweep) settles
    /// them.
    pub(crate) async fn past_their_lease(
        &self,
        shards: impl IntoIterator<Item = u32>,
        now: DateTime<Utc>,
    ) -> (Vec<Item>, u32) {
        let queries = shards.into_iter().map(|shard| async move {
            let _turn = self.index_turn().await;
            let out = partition("lease_pk", s(lease_shard_pk(shard)))
                .range("lease_until", Range::Below(n(now.timestamp_millis())))
                .on(self.index_query("lease"))
                .limit(SWEEP_BATCH_PER_SHARD)
                .send()
                .await?;
            Ok::<_, StoreError>(out.items.unwrap_or_default())
        });
        let mut skipped = 0;
        let mut stale: Vec<Item> = Vec::new();
        // A few at a time: the tick's due-index reads share the store's index queries
        // (see [`INDEX_QUERIES_IN_FLIGHT`](crate::store::handle::INDEX_QUERIES_IN_FLIGHT)),
        // and the sweep must not take every turn ahead of them.
        let answers: Vec<_> = futures::stream::iter(queries)
            .buffer_unordered(SWEEP_QUERIES_IN_FLIGHT)
            .collect()
            .await;
        for shard in answers {
            match shard {
                Ok(items) => stale.extend(items),
                Err(e) => {
                    tracing::error!(error = %error_chain(&e), "lease-index shard unreadable; skipped this tick");
                    skipped += 1;
                }
            }
        }
        (stale, skipped)
    }

    /// 1 if a sweep step acted on its entry. An error is logged and counted (the entry
    /// is tried again next tick); an entry that itself cannot be read is taken off the
    /// lease index (kept, marked `quarantined_at`, for an operator), so it cannot hold
    /// up the shard's page tick after tick.
    pub(crate) async fn tally(
        &self,
        step: Result<Step, StoreError>,
        (pk, sk, seen): (&str, &str, i64),
        now: DateTime<Utc>,
        summary: &mut SweepSummary,
    ) -> u32 {
        let end = match &step {
            Ok(Step::Acted | Step::Kept) => return 1,
            Ok(Step::Idle) => StepEnd::Done,
            Ok(Step::Later(why)) => {
                tracing::warn!(sk = %sk, why = %why, "stale entry left for later");
                StepEnd::Later
            }
            Ok(Step::Unreadable(why)) => {
                tracing::error!(sk = %sk, why = %why, "unreadable stale entry");
                StepEnd::Unreadable
            }
            // The database busy or away: tried again next tick, as it is.
            Err(e @ StoreError::Unavailable(_)) => {
                tracing::warn!(error = %error_chain(e), sk = %sk, "stale entry not handled for now");
                StepEnd::Unavailable
            }
            Err(e) => {
                tracing::error!(error = %error_chain(e), sk = %sk, "stale entry failed; tried again later");
                StepEnd::Failed
            }
        };
        if end != StepEnd::Done {
            summary.skipped += 1;
        }
        match disposition(end) {
            Disposition::Leave => {}
            Disposition::Quarantine => {
                self.quarantine_logged(pk, sk, seen, now, summary).await;
            }
            Disposition::Defer { counted } => {
                match self.defer_lease(pk, sk, seen, counted, now).await {
                    Ok(Some((failures, later))) if counted && quarantined_after(failures) => {
                        self.quarantine_logged(pk, sk, later, now, summary).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(error = %error_chain(&e), sk = %sk, "stale entry not deferred");
                    }
                }
            }
        }
        0
    }

    /// Takes a lease-index entry off the index for an operator (see `quarantine`),
    /// counted; a failure is logged (the entry is tried again next tick).
    async fn quarantine_logged(
        &self,
        pk: &str,
        sk: &str,
        seen: i64,
        now: DateTime<Utc>,
        summary: &mut SweepSummary,
    ) {
        match self.quarantine(pk, sk, Index::Lease, seen, now).await {
            Ok(()) => summary.quarantined += 1,
            Err(e) => {
                tracing::error!(error = %error_chain(&e), sk = %sk, "stale entry not quarantined");
            }
        }
    }

    /// A live delivery past its lease: settled by the answer its finalize kept, if it
    /// kept one; else `unknown`, its grant void, its plan paused `uncertain` (or its
    /// push `unknown`). A settled 43101 whose voiding is not done: that finished.
    pub(crate) async fn sweep_delivery(
        &self,
        pk: &str,
        sk: &str,
        now: DateTime<Utc>,
    ) -> Result<Step, StoreError> {
        let policy = &self.policy;
        let Some(item) = self.get(pk, sk).await? else {
            return Ok(Step::Idle);
        };
        let delivery: DeliveryItem = match parse("delivery", item) {
            Ok(delivery) => delivery,
            Err(e) => return Ok(Step::Unreadable(e.to_string())),
        };
        let view = delivery.delivery();
        if !view.past_lease(now) {
            return Ok(Step::Idle);
        }
        let Ok(template) = TemplateId::parse(delivery.template_id.clone()) else {
            return Ok(Step::Unreadable("a delivery with a bad template id".into()));
        };
        let (result, kept, until) = match view.at_lease_end(now) {
            AtLeaseEnd::Idle => return Ok(Step::Idle),
            // Settled 43101 with the other grants not yet void: finished here (only
            // with the claim's own time: one read as now would void later grants).
            AtLeaseEnd::VoidOthers => {
                let Ok(claimed_at) = DateTime::parse_from_rfc3339(&delivery.claimed_at) else {
                    return Ok(Step::Unreadable(
                        "a refused delivery without its claim time".into(),
                    ));
                };
                self.void_others(
                    pk,
                    &delivery.delivery_id,
                    &template,
                    claimed_at.with_timezone(&Utc),
                    now,
                )
                .await?;
                tracing::warn!(delivery_id = %delivery.delivery_id, "a 43101's voiding finished by the sweep");
                return Ok(Step::Kept);
            }
            // WeChat's answer, if the finalize kept it; else the outcome is unknown.
            AtLeaseEnd::Settle {
                result,
                kept,
                lease_until,
            } => (result, kept, lease_until),
        };
        let settlement = settle(
            result.class(),
            result.errcode(),
            delivery.attempts,
            policy,
            now,
        );
        let claimed = sort_key(&delivery.source);
        let kind = self.plan_kind(&delivery.source);
        let mut source = Vec::new();
        if let Some(kind) = kind {
            // A plan that cannot be read does not stop the delivery and its grant from
            // settling; the plan's own lease entry reports it.
            match self
                .plan_after_send(pk, kind, &delivery.delivery_id, &settlement, now)
                .await
            {
                Ok(write) => source.extend(write),
                Err(e @ StoreError::Corrupt(_)) => {
                    tracing::error!(error = %error_chain(&e), "stale delivery's plan unreadable")
                }
                // Not read for now (a throttle, an outage): settled without it, the plan
                // would be left to its own lease entry; the next tick tries it whole.
                Err(e) => return Err(e),
            }
        } else if let SortKey::Outbox(_) = claimed {
            let outbox = match self.current_outbox(pk, &delivery.source).await {
                Ok(outbox) => outbox,
                // An unreadable push: the delivery and its grant settle all the same.
                Err(e @ StoreError::Corrupt(_)) => {
                    tracing::error!(error = %error_chain(&e), "stale delivery's push unreadable");
                    None
                }
                // Not read for now: settled without it, the push would stay `sending`
                // with nothing to move it on (a push has no lease of its own); the
                // next tick tries it whole.
                Err(e) => return Err(e),
            };
            if let Some(outbox) = outbox
                && outbox.state == OutboxState::Sending
                && outbox.delivery_id.as_deref() == Some(delivery.delivery_id.as_str())
            {
                source = self.outbox_writes(
                    pk,
                    &outbox,
                    &delivery.delivery_id,
                    &settlement,
                    &result,
                    now,
                )?;
            }
        } else {
            tracing::error!(source = %delivery.source, "stale delivery of no configured kind");
        }
        let write = if kept {
            crate::store::dispatch::finalize::delivery_write(&settlement, &result, Writer::Kept)
        } else {
            DeliveryWrite {
                state: DeliveryState::Unknown,
                class: OutcomeClass::Unknown,
                outcome: format!("lease expired in state {}", delivery.state.as_str()),
                errcode: None,
                msgid: None,
                by: Writer::Sweep,
                void_others: false,
            }
        };
        let tx = SettleTx {
            pk,
            delivery_id: &delivery.delivery_id,
            claimed_at: delivery.claimed_at(now),
            guard: Guard::ExpiredLease(until),
            marks: write.marks(&delivery.delivery_id, delivery.claimed_at(now), now),
            template: &template,
            write,
            grant: Some(GrantMove {
                sk: &delivery.grant_sk,
                from: GrantState::Reserved,
                to: settlement.grant,
            }),
            counted_on: delivery.counted_on,
            retry_whole: false,
            source,
        };
        match self.write_settlement(tx, now).await? {
            Settled::Landed { source, .. } => {
                // 43101 voids the template's other grants first, so a plan moved on
                // below sees the grants that are really left (as a finalize does).
                if settlement.invalidate_others {
                    self.void_others(
                        pk,
                        &delivery.delivery_id,
                        &template,
                        delivery.claimed_at(now),
                        now,
                    )
                    .await?;
                }
                if !source && let Some(kind) = kind {
                    self.advance_plan(pk, kind, &delivery.delivery_id, &settlement, now)
                        .await?;
                }
                if kept {
                    tracing::warn!(delivery_id = %delivery.delivery_id, outcome = settlement.class.as_str(), "stale claim settled by the answer its finalize kept");
                } else {
                    tracing::warn!(delivery_id = %delivery.delivery_id, "stale claim recovered as unknown");
                }
                // A sent event that came while this send was in flight may be its own.
                if let Some(openid) = openid_of(pk) {
                    self.settle_pending_events(&openid, &template, now).await;
                }
                Ok(if kept { Step::Kept } else { Step::Acted })
            }
            Settled::DeliveryMoved(_) | Settled::SourceMoved => Ok(Step::Idle),
        }
    }

    /// A plan still `sending` past its lease. If its delivery is terminal (settled, but
    /// the plan's own write was lost to a crash or a race), the plan moves on by that
    /// delivery's outcome. True if this sweep moved it.
    pub(crate) async fn sweep_plan(
        &self,
        pk: &str,
        sk: &str,
        now: DateTime<Utc>,
    ) -> Result<Step, StoreError> {
        let Some(kind) = self.plan_kind(sk) else {
            // A configuration change, not a bad item: kept, behind the others, to be
            // swept once the kind is configured again.
            return Ok(Step::Later(format!("{sk}: no configured kind")));
        };
        let plan = match self.read_plan(pk, kind, false).await? {
            PlanRead::Found(plan, ..) => *plan,
            PlanRead::Missing => return Ok(Step::Idle),
            PlanRead::Unreadable(why) => return Ok(Step::Unreadable(why)),
        };
        let expired = plan.lease_until.is_some_and(|until| until < now);
        if plan.status != PlanStatus::Sending || !expired {
            return Ok(Step::Idle);
        }
        let Some(delivery_id) = plan.delivery_id.clone() else {
            return Ok(Step::Unreadable("a sending plan without a delivery".into()));
        };
        // A delivery that cannot be read counts as missing: its own entry reports it.
        let delivery = self
            .get(pk, &delivery_sk(&delivery_id))
            .await?
            .and_then(|item| parse::<DeliveryItem>("delivery", item).ok());
        let learns = delivery.map_or(PlanLearns::MISSING, |d| d.delivery().for_stranded_plan());
        // A live delivery's own lease-index entry settles it (and this plan with it);
        // meanwhile this entry waits behind the others rather than hold up the shard.
        let Some(settlement) = learns.settlement(plan.attempts, &self.policy, now) else {
            return Ok(Step::Later(format!("{sk}: its delivery is still live")));
        };
        let moved = self
            .advance_plan(pk, kind, &delivery_id, &settlement, now)
            .await?;
        if moved {
            tracing::warn!(delivery_id = %delivery_id, "plan left sending moved on by its delivery's outcome");
        }
        Ok(if moved { Step::Acted } else { Step::Idle })
    }
}
