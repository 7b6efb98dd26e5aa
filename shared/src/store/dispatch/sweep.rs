//! The sweep: what a vanished or stalled dispatcher left behind (I4, I5).

use chrono::{DateTime, Utc};

use super::super::item::{Item, key, n, parse, s, text};
use super::super::keys::{delivery_sk, lease_shard_pk};
use super::super::{Store, StoreError, classify_sdk_error};
use super::{DeliveryItem, DeliveryWrite, GrantMove, Guard, Index, SettleTx, Settled, Writer};
use crate::domain::outcome::{DeliveryState, OutboxState, OutcomeClass, RetryPolicy, settle};
use crate::domain::plan::PlanStatus;
use crate::domain::reminder::{ReminderKind, ReminderKinds};
use crate::domain::{GrantState, TemplateId};
use crate::telemetry::error_chain;

/// At most this many lease-index entries per shard are handled in one sweep; the rest
/// wait for the next tick (a sweep's work is bounded whatever the backlog).
pub const SWEEP_BATCH_PER_SHARD: i32 = 25;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Deliveries past their lease settled `unknown`.
    pub recovered: u32,
    /// Plans left `sending` after their delivery settled, moved on.
    pub advanced: u32,
    /// Entries (or whole shards) that could not be read or settled: logged, skipped.
    pub skipped: u32,
}

impl Store {
    /// Settles what is past its lease (see the module docs of [`dispatch`](super)):
    /// one query page per shard of the lease index, never a scan.
    pub async fn sweep(
        &self,
        kinds: &ReminderKinds,
        policy: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> SweepSummary {
        let queries = (0..self.shards).map(|shard| async move {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name("lease")
                .key_condition_expression("lease_pk = :p AND lease_until < :now")
                .expression_attribute_values(":p", s(lease_shard_pk(shard)))
                .expression_attribute_values(":now", n(now.timestamp_millis()))
                .limit(SWEEP_BATCH_PER_SHARD)
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            Ok::<_, StoreError>(out.items.unwrap_or_default())
        });
        let mut summary = SweepSummary::default();
        let mut stale: Vec<Item> = Vec::new();
        for shard in futures::future::join_all(queries).await {
            match shard {
                Ok(items) => stale.extend(items),
                Err(e) => {
                    tracing::error!(error = %error_chain(&e), "lease-index shard unreadable; skipped this tick");
                    summary.skipped += 1;
                }
            }
        }
        let keys = |prefix: &str| -> Vec<(String, String)> {
            stale
                .iter()
                .filter_map(|i| Some((text(i, "pk")?.to_string(), text(i, "sk")?.to_string())))
                .filter(|(_, sk)| sk.starts_with(prefix))
                .collect()
        };
        // Deliveries first: settling one usually moves its plan in the same write.
        for (pk, sk) in keys("DELIVERY#") {
            let settled = self.sweep_delivery(&pk, &sk, kinds, policy, now).await;
            summary.recovered += self.tally(settled, &pk, &sk, now, &mut summary).await;
        }
        for (pk, sk) in keys("PLAN#") {
            let moved = self.sweep_plan(&pk, &sk, kinds, policy, now).await;
            summary.advanced += self.tally(moved, &pk, &sk, now, &mut summary).await;
        }
        let unknown_entries = stale.len() - keys("DELIVERY#").len() - keys("PLAN#").len();
        if unknown_entries > 0 {
            tracing::error!(unknown_entries, "lease-index entries of no known kind");
        }
        for (pk, sk) in keys("") {
            if !sk.starts_with("DELIVERY#") && !sk.starts_with("PLAN#") {
                let unknown = Err(StoreError::Corrupt(format!(
                    "{sk}: no kind of lease holder"
                )));
                self.tally(unknown, &pk, &sk, now, &mut summary).await;
            }
        }
        summary
    }

    /// 1 if a sweep step acted on its entry. An error is logged and counted; an entry
    /// that cannot be read or settled at all is taken off the lease index (kept, and
    /// marked `quarantined_at`, for an operator), so it cannot hold up the shard's
    /// page tick after tick.
    async fn tally(
        &self,
        step: Result<bool, StoreError>,
        pk: &str,
        sk: &str,
        now: DateTime<Utc>,
        summary: &mut SweepSummary,
    ) -> u32 {
        let error = match step {
            Ok(acted) => return u32::from(acted),
            Err(e) => e,
        };
        summary.skipped += 1;
        tracing::error!(error = %error_chain(&error), sk = %sk, "stale entry skipped");
        if let StoreError::Corrupt(_) = error
            && let Err(e) = self.quarantine(pk, sk, Index::Lease, now).await
        {
            tracing::error!(error = %error_chain(&e), sk = %sk, "stale entry not quarantined");
        }
        0
    }

    pub(super) async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        Ok(self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pk, sk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify_sdk_error(e, |_| false))?
            .item)
    }

    /// A live delivery past its lease: `unknown`, its grant void, its plan paused
    /// `uncertain` (or its push `unknown`). True if this sweep settled it.
    async fn sweep_delivery(
        &self,
        pk: &str,
        sk: &str,
        kinds: &ReminderKinds,
        policy: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let Some(item) = self.get(pk, sk).await? else {
            return Ok(false);
        };
        let delivery: DeliveryItem = parse("delivery", item)?;
        let Some(until) = delivery.lease_until else {
            return Ok(false);
        };
        if until >= now.timestamp_millis() || !delivery.state.is_live() {
            return Ok(false);
        }
        let template = TemplateId::parse(delivery.template_id.clone()).map_err(|_| {
            StoreError::Corrupt(format!("delivery {}: template id", delivery.delivery_id))
        })?;
        let settlement = settle(OutcomeClass::Unknown, None, delivery.attempts, policy, now);
        let kind = delivery
            .source
            .strip_prefix("PLAN#")
            .and_then(|k| kinds.get(k));
        let mut source = Vec::new();
        if let Some(kind) = kind {
            // A plan that cannot be read does not stop the delivery and its grant from
            // settling; the plan's own lease entry reports it.
            match self
                .stale_plan_write(pk, kind, &delivery.delivery_id, &settlement, now)
                .await
            {
                Ok(write) => source.extend(write),
                Err(e) => {
                    tracing::error!(error = %error_chain(&e), "stale delivery's plan unreadable")
                }
            }
        } else if delivery.source.starts_with("OUTBOX#") {
            if let Some(outbox) = self.current_outbox(pk, &delivery.source).await?
                && outbox.state == OutboxState::Sending
                && outbox.delivery_id.as_deref() == Some(delivery.delivery_id.as_str())
            {
                let result = crate::domain::outcome::SendResult::Uncertain {
                    reason: "the dispatcher stopped mid-send".into(),
                };
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
        let tx = SettleTx {
            pk,
            delivery_id: &delivery.delivery_id,
            guard: Guard::ExpiredLease(until),
            write: DeliveryWrite {
                state: DeliveryState::Unknown,
                class: OutcomeClass::Unknown,
                outcome: format!("lease expired in state {}", delivery.state.as_str()),
                errcode: None,
                msgid: None,
                by: Writer::Sweep,
            },
            grant: Some(GrantMove {
                sk: &delivery.grant_sk,
                template: &template,
                from: GrantState::Reserved,
                to: GrantState::Invalid,
            }),
            grant_with_source: false,
            source,
        };
        match self.write_settlement(tx, now).await? {
            Settled::Landed { source, .. } => {
                if !source && let Some(kind) = kind {
                    self.advance_plan(pk, kind, &delivery.delivery_id, &settlement, false, now)
                        .await?;
                }
                tracing::warn!(delivery_id = %delivery.delivery_id, "stale claim recovered as unknown");
                Ok(true)
            }
            Settled::DeliveryMoved(_) => Ok(false),
        }
    }

    /// The plan's write for a swept delivery, if the plan is still `sending` for it.
    async fn stale_plan_write(
        &self,
        pk: &str,
        kind: &ReminderKind,
        delivery_id: &str,
        settlement: &crate::domain::outcome::Settlement,
        now: DateTime<Utc>,
    ) -> Result<Option<aws_sdk_dynamodb::types::TransactWriteItem>, StoreError> {
        let read = self.read(pk, kind, None).await?;
        let Some(item) = read.plan else {
            return Ok(None);
        };
        let mut plan = item.into_plan(kind)?;
        if plan.status != PlanStatus::Sending || plan.delivery_id.as_deref() != Some(delivery_id) {
            return Ok(None);
        }
        plan.finish_send(settlement.follow_up, settlement.attempts, false, now)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(Some(self.plan_put(&plan, pk, now)?))
    }

    /// A plan still `sending` past its lease. If its delivery is terminal (settled, but
    /// the plan's own write was lost to a crash or a race), the plan moves on by that
    /// delivery's outcome. True if this sweep moved it.
    async fn sweep_plan(
        &self,
        pk: &str,
        sk: &str,
        kinds: &ReminderKinds,
        policy: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let kind: &ReminderKind = sk
            .strip_prefix("PLAN#")
            .and_then(|k| kinds.get(k))
            .ok_or_else(|| StoreError::Corrupt(format!("plan {sk}: no configured kind")))?;
        let read = self.read(pk, kind, None).await?;
        let Some(item) = read.plan else {
            return Ok(false);
        };
        let plan = item.into_plan(kind)?;
        let expired = plan.lease_until.is_some_and(|until| until < now);
        if plan.status != PlanStatus::Sending || !expired {
            return Ok(false);
        }
        let delivery_id = plan
            .delivery_id
            .clone()
            .ok_or_else(|| StoreError::Corrupt(format!("plan {sk}: sending without a delivery")))?;
        let delivery = match self.get(pk, &delivery_sk(&delivery_id)).await? {
            Some(item) => Some(parse::<DeliveryItem>("delivery", item)?),
            None => None,
        };
        let settlement = match &delivery {
            // Its own lease-index entry settles it (and this plan with it).
            Some(d) if d.state.is_live() => return Ok(false),
            Some(d) => settle(
                d.settled_class().unwrap_or(OutcomeClass::Unknown),
                d.errcode,
                plan.attempts,
                policy,
                now,
            ),
            None => settle(OutcomeClass::Unknown, None, plan.attempts, policy, now),
        };
        let moved = self
            .advance_plan(pk, kind, &delivery_id, &settlement, false, now)
            .await?;
        if moved {
            tracing::warn!(delivery_id = %delivery_id, "plan left sending moved on by its delivery's outcome");
        }
        Ok(moved)
    }
}
