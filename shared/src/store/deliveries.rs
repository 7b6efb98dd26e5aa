//! Deliveries: claiming a due plan, recording the send, finalizing by its outcome, and
//! recovering claims whose dispatcher vanished (DESIGN.md §2 I1, I4–I6, §5).
//!
//! - **Claim** (one transaction): plan `scheduled → sending` on its version, off the due
//!   index; one grant `available → reserved` naming the delivery; counters
//!   `available −1, reserved +1`; the delivery written `claimed` with a lease (and so on
//!   the lease index).
//! - **Send** happens outside any transaction (I6), after the delivery is marked
//!   `sending`.
//! - **Finalize** (one transaction, conditional on the delivery still being this
//!   claimer's): delivery terminal, grant consumed / restored / invalid — restored only
//!   by the delivery that reserved it, and only once — counters moved, plan advanced.
//!   If the user disabled the plan meanwhile (grant already invalid, plan changed),
//!   the parts that no longer apply are dropped and the rest still lands: a finalize
//!   always completes.
//! - **Sweep**: deliveries still `claimed`/`sending` past their lease become `unknown`,
//!   their grant invalid, their plan paused `uncertain`. Never resent (I4).

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::grants::{GrantItem, rfc3339};
use super::inbox::{OutboxItem, note_push_update, versioned_put};
use super::keys::{delivery_sk, lease_pk, quota_sk, user_pk};
use super::plans::{TxOutcome, key, parse, s};
use super::{MAX_WRITE_ATTEMPTS, Store, StoreError, backoff, classify_sdk_error, corrupt};
use crate::config::DispatchConfig;
use crate::domain::inbox::PushStatus;
use crate::domain::outcome::{OutcomeClass, SendResult};
use crate::domain::plan::{PauseReason, Plan, PlanEvent, PlanStatus};
use crate::domain::reminder::{ReminderKind, ReminderKinds};
use crate::domain::{GrantState, OpenId, TemplateId};

/// A plan the due index says is due by the horizon (keys only; re-read on claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueItem {
    pub pk: String,
    pub sk: String,
    pub due_at: DateTime<Utc>,
}

/// What a dispatcher holds between claim and finalize.
#[derive(Debug, Clone)]
pub struct Claim {
    pub delivery_id: String,
    pub claimer: String,
    pub openid: OpenId,
    pub template_id: TemplateId,
    pub grant_sk: String,
    pub due_at: DateTime<Utc>,
    pub source: ClaimSource,
}

/// What was claimed: a reminder plan or a notification's push.
#[derive(Debug, Clone)]
pub enum ClaimSource {
    /// The kind and the plan as the claim wrote it (`sending`, at its new version).
    Plan {
        kind: ReminderKind,
        plan: Plan,
    },
    Outbox(OutboxClaim),
}

/// A claimed push: the message to send (data already fitted at ingest).
#[derive(Debug, Clone)]
pub struct OutboxClaim {
    pub note_id: String,
    pub data: BTreeMap<String, String>,
    pub page: Option<String>,
    item: OutboxItem,
}

/// How a claim attempt ended.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claim>),
    /// Someone else claimed it first, or the plan changed since the index was read.
    Lost,
    /// No grant to reserve: the plan was paused `needs_grant`.
    NoGrant,
}

/// How a finalize ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finalized {
    pub class: OutcomeClass,
    /// The grant went back to `available`.
    pub restored: bool,
    /// The delivery was already terminal (a sweep recovered it first).
    pub superseded: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct DeliveryItem {
    pk: String,
    sk: String,
    kind: String,
    delivery_id: String,
    state: String,
    /// The sort key of what was claimed: `PLAN#<kind>` or `OUTBOX#<note id>`.
    source: String,
    template_id: String,
    grant_sk: String,
    claimer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_until: Option<i64>,
    due_at: i64,
    claimed_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    errcode: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    msgid: Option<String>,
}

/// What every claim step needs.
struct ClaimContext<'a> {
    item: &'a DueItem,
    openid: OpenId,
    claimer: &'a str,
    shards: u32,
    lease: std::time::Duration,
    now: DateTime<Utc>,
}

/// The parts of a settle transaction that still apply.
struct Settle<'a> {
    pk: &'a str,
    delivery_id: &'a str,
    /// The delivery's condition: its claimer, or (for the sweep) its expired lease.
    owner: Owner<'a>,
    state: &'static str,
    outcome: String,
    errcode: Option<i64>,
    msgid: Option<String>,
    grant_sk: &'a str,
    template: &'a crate::domain::TemplateId,
    grant_to: GrantState,
    /// The claimed item's own writes (plan, or outbox and notification), conditional
    /// on it being as the claim left it; dropped together if it moved on.
    source: Vec<TransactWriteItem>,
}

enum Owner<'a> {
    Claimer(&'a str),
    ExpiredLease(i64),
}

/// Outcome of the settle transaction: which parts landed.
struct Settled {
    delivery: bool,
    grant: bool,
    /// The claimed item's own writes landed (false if it had moved on).
    source: bool,
}

/// The delay before retry `attempt` (1-based): the base, doubled per attempt, ≤ 6 h.
fn retry_delay(dispatch: &DispatchConfig, attempt: u32) -> Duration {
    let base = Duration::from_std(dispatch.retry_base).unwrap_or(Duration::minutes(1));
    (base * 2i32.saturating_pow(attempt.saturating_sub(1).min(10))).min(Duration::hours(6))
}

/// A send result in a few words, for the delivery and the notification.
fn describe(result: &SendResult) -> String {
    match result {
        SendResult::Sent { .. } => "sent".to_string(),
        SendResult::Refused { errcode, errmsg } => format!("errcode {errcode}: {errmsg}"),
        SendResult::Uncertain { reason } => format!("uncertain: {reason}"),
        SendResult::NotSent { reason } => format!("not sent: {reason}"),
        SendResult::Invalid { reason } => format!("invalid content: {reason}"),
    }
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

impl Store {
    /// The plans due by `horizon`, across every shard of the due index, queried in
    /// parallel, earliest first.
    pub async fn due_items(
        &self,
        shards: u32,
        horizon: DateTime<Utc>,
    ) -> Result<Vec<DueItem>, StoreError> {
        let queries = (0..shards).map(|shard| async move {
            let mut found = Vec::new();
            let mut pages = self
                .client
                .query()
                .table_name(&self.table)
                .index_name("due")
                .key_condition_expression("due_pk = :p AND due_at <= :h")
                .expression_attribute_values(":p", s(format!("DUE#{shard}")))
                .expression_attribute_values(":h", n(horizon.timestamp_millis()))
                .into_paginator()
                .items()
                .send();
            while let Some(item) = pages.next().await {
                let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
                let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
                let due = item
                    .get("due_at")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|v| v.parse::<i64>().ok())
                    .and_then(DateTime::from_timestamp_millis);
                if let (Some(pk), Some(sk), Some(due_at)) = (text("pk"), text("sk"), due) {
                    found.push(DueItem { pk, sk, due_at });
                }
            }
            Ok::<_, StoreError>(found)
        });
        let mut all = Vec::new();
        for shard in futures::future::join_all(queries).await {
            all.extend(shard?);
        }
        all.sort_by_key(|i| i.due_at);
        Ok(all)
    }

    /// Claims a due item — a plan or an outbox item (see the module docs). `claimer`
    /// names this dispatcher run.
    pub async fn claim(
        &self,
        item: &DueItem,
        kinds: &ReminderKinds,
        claimer: &str,
        shards: u32,
        lease: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<ClaimOutcome, StoreError> {
        let Some(openid) = item
            .pk
            .strip_prefix("USER#")
            .and_then(|o| OpenId::parse(o).ok())
        else {
            tracing::error!(sk = %item.sk, "due item outside a user partition");
            return Ok(ClaimOutcome::Lost);
        };
        let ctx = ClaimContext {
            item,
            openid,
            claimer,
            shards,
            lease,
            now,
        };
        if let Some(kind) = item.sk.strip_prefix("PLAN#").and_then(|k| kinds.get(k)) {
            return self.claim_plan(&ctx, kind).await;
        }
        if item.sk.starts_with("OUTBOX#") {
            return self.claim_outbox(&ctx).await;
        }
        tracing::error!(sk = %item.sk, "due item of no configured kind");
        Ok(ClaimOutcome::Lost)
    }

    /// The claim's shared writes: one grant `available → reserved` naming the delivery,
    /// the counters, and the delivery itself (on the lease index).
    fn reservation(
        &self,
        ctx: &ClaimContext<'_>,
        template: &TemplateId,
        grant_sk: &str,
        delivery_id: &str,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let now = ctx.now;
        let lease_until = now + Duration::from_std(ctx.lease).unwrap_or(Duration::seconds(60));
        let delivery = DeliveryItem {
            pk: ctx.item.pk.clone(),
            sk: delivery_sk(delivery_id),
            kind: "delivery".into(),
            delivery_id: delivery_id.to_string(),
            state: "claimed".into(),
            source: ctx.item.sk.clone(),
            template_id: template.to_string(),
            grant_sk: grant_sk.to_string(),
            claimer: ctx.claimer.to_string(),
            lease_pk: Some(lease_pk(delivery_id, ctx.shards)),
            lease_until: Some(lease_until.timestamp_millis()),
            due_at: ctx.item.due_at.timestamp_millis(),
            claimed_at: rfc3339(now),
            outcome: None,
            errcode: None,
            msgid: None,
        };
        let reserve = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(&ctx.item.pk, grant_sk)))
            .update_expression(
                "SET #s = :reserved, delivery_id = :d, updated_at = :now, version = version + :one",
            )
            .condition_expression("#s = :available")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":reserved", s("reserved"))
            .expression_attribute_values(":available", s("available"))
            .expression_attribute_values(":d", s(delivery_id))
            .expression_attribute_values(":now", s(rfc3339(now)))
            .expression_attribute_values(":one", n(1))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        let counters = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(&ctx.item.pk, &quota_sk(template))))
            .update_expression("SET updated_at = :now ADD available :minus, reserved :one")
            .condition_expression("available > :zero")
            .expression_attribute_values(":now", s(rfc3339(now)))
            .expression_attribute_values(":minus", n(-1))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":zero", n(0))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        let delivery_put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(
                serde_dynamo::to_item(&delivery).map_err(|e| corrupt("delivery", e))?,
            ))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(vec![
            TransactWriteItem::builder().update(reserve).build(),
            TransactWriteItem::builder().update(counters).build(),
            TransactWriteItem::builder().put(delivery_put).build(),
        ])
    }

    async fn claim_plan(
        &self,
        ctx: &ClaimContext<'_>,
        kind: &ReminderKind,
    ) -> Result<ClaimOutcome, StoreError> {
        let item = ctx.item;
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            let read = self.read(&item.pk, kind, None).await?;
            let Some(plan) = read.plan else {
                return Ok(ClaimOutcome::Lost);
            };
            let plan = plan.into_plan(kind)?;
            if plan.status != (PlanStatus::Scheduled { due: item.due_at }) {
                return Ok(ClaimOutcome::Lost);
            }
            let grant = if read.counters.available > 0 {
                self.first_available_grant(&item.pk, &kind.template_id)
                    .await?
            } else {
                None
            };
            let Some(grant) = grant else {
                let mut paused = plan.clone();
                paused.status = plan
                    .status
                    .apply(PlanEvent::GrantMissing)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let put = self.plan_put(&paused, &item.pk, ctx.shards, ctx.now)?;
                return match self.transact(vec![put]).await? {
                    TxOutcome::Committed => Ok(ClaimOutcome::NoGrant),
                    TxOutcome::Cancelled(_) | TxOutcome::Contended => Ok(ClaimOutcome::Lost),
                };
            };
            let delivery_id = uuid::Uuid::new_v4().simple().to_string();
            let mut claimed = plan.clone();
            claimed.status = plan
                .status
                .apply(PlanEvent::Claimed)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            claimed.delivery_id = Some(delivery_id.clone());
            let mut items = vec![self.plan_put(&claimed, &item.pk, ctx.shards, ctx.now)?];
            items.extend(self.reservation(ctx, &kind.template_id, &grant.sk, &delivery_id)?);
            match self.transact(items).await? {
                TxOutcome::Committed => {
                    claimed.version += 1;
                    return Ok(ClaimOutcome::Claimed(Box::new(Claim {
                        delivery_id,
                        claimer: ctx.claimer.to_string(),
                        openid: ctx.openid.clone(),
                        template_id: kind.template_id.clone(),
                        grant_sk: grant.sk,
                        due_at: item.due_at,
                        source: ClaimSource::Plan {
                            kind: kind.clone(),
                            plan: claimed,
                        },
                    })));
                }
                TxOutcome::Cancelled(reasons) => {
                    if reasons
                        .first()
                        .is_some_and(|(code, _)| code == "ConditionalCheckFailed")
                    {
                        // The plan moved on: another dispatcher claimed it, or the user acted.
                        return Ok(ClaimOutcome::Lost);
                    }
                    // The grant was taken (or counters changed): pick again.
                }
                TxOutcome::Contended => {}
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
        Ok(ClaimOutcome::Lost)
    }

    async fn claim_outbox(&self, ctx: &ClaimContext<'_>) -> Result<ClaimOutcome, StoreError> {
        let item = ctx.item;
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            let got = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key(&item.pk, &item.sk)))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            let Some(got) = got.item else {
                return Ok(ClaimOutcome::Lost);
            };
            let outbox: OutboxItem = parse("outbox", got)?;
            if outbox.state != "pending" || outbox.due_at != Some(item.due_at.timestamp_millis()) {
                return Ok(ClaimOutcome::Lost);
            }
            let template = TemplateId::parse(outbox.template_id.clone())
                .map_err(|_| StoreError::Corrupt(format!("outbox {}: template id", outbox.sk)))?;
            let Some(grant) = self.first_available_grant(&item.pk, &template).await? else {
                // No grant for the template: the push is skipped, the notification stays.
                let skipped = outbox.moved("skipped", None, ctx.shards, ctx.now);
                let items = vec![
                    versioned_put(
                        &self.table,
                        serde_dynamo::to_item(&skipped).map_err(|e| corrupt("outbox", e))?,
                        outbox.version,
                    )?,
                    note_push_update(
                        &self.table,
                        &item.pk,
                        &outbox.note_id,
                        PushStatus::Skipped,
                        Some("no grant for the template"),
                    )?,
                ];
                return match self.transact(items).await? {
                    TxOutcome::Committed => Ok(ClaimOutcome::NoGrant),
                    TxOutcome::Cancelled(_) | TxOutcome::Contended => Ok(ClaimOutcome::Lost),
                };
            };
            let delivery_id = uuid::Uuid::new_v4().simple().to_string();
            let mut sending = outbox.moved("sending", None, ctx.shards, ctx.now);
            sending.delivery_id = Some(delivery_id.clone());
            let mut items = vec![versioned_put(
                &self.table,
                serde_dynamo::to_item(&sending).map_err(|e| corrupt("outbox", e))?,
                outbox.version,
            )?];
            items.extend(self.reservation(ctx, &template, &grant.sk, &delivery_id)?);
            match self.transact(items).await? {
                TxOutcome::Committed => {
                    return Ok(ClaimOutcome::Claimed(Box::new(Claim {
                        delivery_id,
                        claimer: ctx.claimer.to_string(),
                        openid: ctx.openid.clone(),
                        template_id: template,
                        grant_sk: grant.sk,
                        due_at: item.due_at,
                        source: ClaimSource::Outbox(OutboxClaim {
                            note_id: sending.note_id.clone(),
                            data: sending.data.clone(),
                            page: sending.page.clone(),
                            item: sending,
                        }),
                    })));
                }
                TxOutcome::Cancelled(reasons) => {
                    if reasons
                        .first()
                        .is_some_and(|(code, _)| code == "ConditionalCheckFailed")
                    {
                        return Ok(ClaimOutcome::Lost);
                    }
                }
                TxOutcome::Contended => {}
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
        Ok(ClaimOutcome::Lost)
    }

    async fn first_available_grant(
        &self,
        pk: &str,
        template: &TemplateId,
    ) -> Result<Option<GrantItem>, StoreError> {
        let mut pages = self
            .grants_query(pk, template, &["available"])
            .into_paginator()
            .items()
            .send();
        if let Some(item) = pages.next().await {
            let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
            return Ok(Some(parse("grant", item)?));
        }
        Ok(None)
    }

    /// Marks a claimed delivery `sending`, just before the WeChat call. False if the
    /// claim was lost (its lease expired and a sweep recovered it): do not send.
    pub async fn mark_sending(&self, claim: &Claim) -> Result<bool, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(
                &user_pk(&claim.openid),
                &delivery_sk(&claim.delivery_id),
            )))
            .update_expression("SET #s = :sending")
            .condition_expression("#s = :claimed AND claimer = :c")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":sending", s("sending"))
            .expression_attribute_values(":claimed", s("claimed"))
            .expression_attribute_values(":c", s(&claim.claimer))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) => {
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception())
                {
                    Ok(false)
                } else {
                    Err(classify_sdk_error(e, |_| false))
                }
            }
        }
    }

    /// Finalizes a delivery by its send result (see the module docs).
    pub async fn finalize(
        &self,
        claim: &Claim,
        result: &SendResult,
        dispatch: &DispatchConfig,
        shards: u32,
        now: DateTime<Utc>,
    ) -> Result<Finalized, StoreError> {
        let class = result.class();
        let (state, grant_to) = match class {
            OutcomeClass::Sent => ("sent", GrantState::Consumed),
            OutcomeClass::Retryable | OutcomeClass::Config => ("failed", GrantState::Available),
            OutcomeClass::Refused | OutcomeClass::User => ("failed", GrantState::Invalid),
            OutcomeClass::Unknown => ("unknown", GrantState::Invalid),
        };
        let pk = user_pk(&claim.openid);
        let mut plan_event = None;
        let source = match &claim.source {
            ClaimSource::Plan { plan: claimed, .. } => {
                let schedule = claimed.settings.schedule;
                let mut plan = claimed.clone();
                let event = match class {
                    OutcomeClass::Sent => {
                        plan.attempts = 0;
                        PlanEvent::Sent
                    }
                    OutcomeClass::Retryable => {
                        plan.attempts += 1;
                        if plan.attempts >= dispatch.max_attempts {
                            PlanEvent::SendStopped(PauseReason::SendFailed)
                        } else {
                            PlanEvent::RetryLater {
                                due: schedule
                                    .first_awake_from(now + retry_delay(dispatch, plan.attempts)),
                            }
                        }
                    }
                    OutcomeClass::Config => PlanEvent::SendStopped(PauseReason::ConfigError),
                    OutcomeClass::Refused => PlanEvent::SendStopped(PauseReason::NeedsGrant),
                    OutcomeClass::User => PlanEvent::SendStopped(PauseReason::SendFailed),
                    OutcomeClass::Unknown => PlanEvent::SendStopped(PauseReason::Uncertain),
                };
                plan_event = Some((event, plan.attempts));
                plan.status = plan
                    .status
                    .apply(event)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                plan.delivery_id = None;
                // plan_put writes `version + 1` on the condition `version`: the claimed one.
                plan.version = claimed.version;
                vec![self.plan_put(&plan, &pk, shards, now)?]
            }
            ClaimSource::Outbox(outbox) => {
                let attempts = outbox.item.attempts + 1;
                let (state, due, push) = match class {
                    OutcomeClass::Sent => ("sent", None, PushStatus::Sent),
                    OutcomeClass::Retryable if attempts < dispatch.max_attempts => (
                        "pending",
                        Some(now + retry_delay(dispatch, attempts)),
                        PushStatus::Pending,
                    ),
                    OutcomeClass::Retryable
                    | OutcomeClass::Config
                    | OutcomeClass::Refused
                    | OutcomeClass::User => ("failed", None, PushStatus::Failed),
                    OutcomeClass::Unknown => ("unknown", None, PushStatus::Unknown),
                };
                let mut next = outbox.item.moved(state, due, shards, now);
                next.attempts = if class == OutcomeClass::Retryable {
                    attempts
                } else {
                    outbox.item.attempts
                };
                let reason = (push != PushStatus::Sent).then(|| describe(result));
                vec![
                    versioned_put(
                        &self.table,
                        serde_dynamo::to_item(&next).map_err(|e| corrupt("outbox", e))?,
                        outbox.item.version,
                    )?,
                    note_push_update(&self.table, &pk, &outbox.note_id, push, reason.as_deref())?,
                ]
            }
        };
        let msgid = match result {
            SendResult::Sent { msgid } => msgid.clone(),
            SendResult::Refused { .. }
            | SendResult::Uncertain { .. }
            | SendResult::NotSent { .. }
            | SendResult::Invalid { .. } => None,
        };
        let settled = self
            .settle(
                Settle {
                    pk: &pk,
                    delivery_id: &claim.delivery_id,
                    owner: Owner::Claimer(&claim.claimer),
                    state,
                    outcome: describe(result),
                    errcode: result.errcode(),
                    msgid,
                    grant_sk: &claim.grant_sk,
                    template: &claim.template_id,
                    grant_to,
                    source,
                },
                now,
            )
            .await?;
        if let (ClaimSource::Plan { kind, .. }, Some((event, attempts))) =
            (&claim.source, plan_event)
            && settled.delivery
            && !settled.source
        {
            // The plan changed while the message was in flight (a check-in, new
            // settings): it must still leave `sending`.
            self.advance_plan(&pk, kind, &claim.delivery_id, event, attempts, shards, now)
                .await?;
        }
        if settled.delivery && class == OutcomeClass::Refused {
            // 43101: WeChat holds no quota for this user and template, so none of the
            // grants we hold is real any more.
            for attempt in 1..=MAX_WRITE_ATTEMPTS {
                if self
                    .invalidate_grants(&pk, &claim.template_id, None, false, now)
                    .await?
                {
                    break;
                }
                tokio::time::sleep(backoff(attempt)).await;
            }
        }
        Ok(Finalized {
            class,
            restored: settled.grant && grant_to == GrantState::Available,
            superseded: !settled.delivery,
        })
    }

    /// Moves a plan that is still `sending` for `delivery_id` by `event`, re-reading it
    /// for each attempt. A check-in that arrived while the message was in flight and
    /// brought a grant schedules the plan right away instead of waiting for another.
    #[allow(clippy::too_many_arguments)]
    async fn advance_plan(
        &self,
        pk: &str,
        kind: &ReminderKind,
        delivery_id: &str,
        event: PlanEvent,
        attempts: u32,
        shards: u32,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            let read = self.read(pk, kind, None).await?;
            let Some(item) = read.plan else { return Ok(()) };
            let mut plan = item.into_plan(kind)?;
            if plan.status != PlanStatus::Sending
                || plan.delivery_id.as_deref() != Some(delivery_id)
            {
                return Ok(());
            }
            let mut status = plan
                .status
                .apply(event)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if status == PlanStatus::AwaitingCheckin
                && let Some(checked_in) = plan.last_checkin_at
                && read.counters.available > 0
            {
                let schedule = plan.settings.schedule;
                let goal =
                    plan.count_on(schedule.waking_day(checked_in)) >= plan.settings.daily_goal;
                status = status
                    .apply(PlanEvent::CheckIn {
                        grant: true,
                        due: schedule.next_due_from(checked_in, goal, now),
                    })
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            }
            plan.status = status;
            plan.attempts = attempts;
            plan.delivery_id = None;
            if let TxOutcome::Committed = self
                .transact(vec![self.plan_put(&plan, pk, shards, now)?])
                .await?
            {
                return Ok(());
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
        Err(StoreError::Unavailable(
            "plan update after a send contended past the retry limit".into(),
        ))
    }

    /// The settle transaction shared by finalize and the sweep.
    async fn settle(&self, job: Settle<'_>, now: DateTime<Utc>) -> Result<Settled, StoreError> {
        let mut include_grant = true;
        let mut source = job.source;
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            let mut delivery = Update::builder()
                .table_name(&self.table)
                .set_key(Some(key(job.pk, &delivery_sk(job.delivery_id))))
                .expression_attribute_names("#s", "state")
                .expression_attribute_values(":final", s(job.state))
                .expression_attribute_values(
                    ":outcome",
                    s(job.outcome.chars().take(300).collect::<String>()),
                )
                .expression_attribute_values(":now", s(rfc3339(now)))
                .expression_attribute_values(":claimed", s("claimed"))
                .expression_attribute_values(":sending", s("sending"))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            delivery = match job.owner {
                Owner::Claimer(claimer) => delivery
                    .condition_expression("#s IN (:claimed, :sending) AND claimer = :c")
                    .expression_attribute_values(":c", s(claimer)),
                Owner::ExpiredLease(until) => delivery
                    .condition_expression("#s IN (:claimed, :sending) AND lease_until = :l")
                    .expression_attribute_values(":l", n(until)),
            };
            let mut extra = Vec::new();
            if let Some(code) = job.errcode {
                extra.push(("errcode", n(code)));
            }
            if let Some(msgid) = &job.msgid {
                extra.push(("msgid", s(msgid)));
            }
            let mut expression =
                "SET #s = :final, outcome = :outcome, finished_at = :now".to_string();
            for (name, value) in extra {
                expression.push_str(&format!(", {name} = :{name}"));
                delivery = delivery.expression_attribute_values(format!(":{name}"), value);
            }
            expression.push_str(" REMOVE lease_pk, lease_until");
            let delivery = delivery
                .update_expression(expression)
                .build()
                .map_err(|e| StoreError::Sdk(Box::new(e)))?;
            let mut items = vec![TransactWriteItem::builder().update(delivery).build()];
            let grant_index = include_grant.then_some(items.len());
            if include_grant {
                let (to, counter) = match job.grant_to {
                    GrantState::Consumed => ("consumed", "consumed"),
                    GrantState::Available => ("available", "available"),
                    GrantState::Invalid | GrantState::Reserved => ("invalid", "invalid"),
                };
                let expression = if job.grant_to == GrantState::Available {
                    // A restore: the grant is free again, for any later claim.
                    "SET #s = :to, updated_at = :now, version = version + :one REMOVE delivery_id"
                } else {
                    "SET #s = :to, updated_at = :now, version = version + :one"
                };
                let grant = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(job.pk, job.grant_sk)))
                    .update_expression(expression)
                    // Fenced: only the delivery that reserved the grant moves it, once.
                    .condition_expression("#s = :reserved AND delivery_id = :d")
                    .expression_attribute_names("#s", "state")
                    .expression_attribute_values(":to", s(to))
                    .expression_attribute_values(":reserved", s("reserved"))
                    .expression_attribute_values(":d", s(job.delivery_id))
                    .expression_attribute_values(":now", s(rfc3339(now)))
                    .expression_attribute_values(":one", n(1))
                    .build()
                    .map_err(|e| StoreError::Sdk(Box::new(e)))?;
                let counters = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(job.pk, &quota_sk(job.template))))
                    // Counter names go through placeholders: CONSUMED is a reserved word.
                    .update_expression("SET updated_at = :now ADD reserved :minus, #counter :one")
                    .expression_attribute_names("#counter", counter)
                    .expression_attribute_values(":now", s(rfc3339(now)))
                    .expression_attribute_values(":minus", n(-1))
                    .expression_attribute_values(":one", n(1))
                    .build()
                    .map_err(|e| StoreError::Sdk(Box::new(e)))?;
                items.push(TransactWriteItem::builder().update(grant).build());
                items.push(TransactWriteItem::builder().update(counters).build());
            }
            let source_range = items.len()..items.len() + source.len();
            items.extend(source.iter().cloned());
            match self.transact(items).await? {
                TxOutcome::Committed => {
                    return Ok(Settled {
                        delivery: true,
                        grant: include_grant,
                        source: !source.is_empty(),
                    });
                }
                TxOutcome::Cancelled(reasons) => {
                    let failed = |i: Option<usize>| {
                        i.and_then(|i| reasons.get(i))
                            .is_some_and(|(code, _)| code == "ConditionalCheckFailed")
                    };
                    if failed(Some(0)) {
                        // Already terminal: someone settled it first. Nothing more to do.
                        return Ok(Settled {
                            delivery: false,
                            grant: false,
                            source: false,
                        });
                    }
                    if failed(grant_index) {
                        // The grant is no longer this delivery's (the plan was disabled).
                        include_grant = false;
                    }
                    let source_failed = source_range.clone().any(|i| failed(Some(i)));
                    if source_failed {
                        // The plan or outbox item moved on (the user acted): that stands.
                        source.clear();
                    }
                    if !failed(grant_index) && !source_failed {
                        tokio::time::sleep(backoff(attempt)).await;
                    }
                }
                TxOutcome::Contended => tokio::time::sleep(backoff(attempt)).await,
            }
        }
        Err(StoreError::Unavailable(
            "finalize contended past the retry limit".into(),
        ))
    }

    /// Recovers deliveries left `claimed`/`sending` past their lease: `unknown`, grant
    /// invalid, plan paused `uncertain` (I4, I5). A query of the lease index, never a
    /// scan. Returns how many were recovered.
    pub async fn sweep(
        &self,
        kinds: &ReminderKinds,
        shards: u32,
        now: DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        let queries = (0..shards).map(|shard| async move {
            let mut keys = Vec::new();
            let mut pages = self
                .client
                .query()
                .table_name(&self.table)
                .index_name("lease")
                .key_condition_expression("lease_pk = :p AND lease_until < :now")
                .expression_attribute_values(":p", s(format!("LEASE#{shard}")))
                .expression_attribute_values(":now", n(now.timestamp_millis()))
                .into_paginator()
                .items()
                .send();
            while let Some(item) = pages.next().await {
                let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
                let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
                if let (Some(pk), Some(sk)) = (text("pk"), text("sk")) {
                    keys.push((pk, sk));
                }
            }
            Ok::<_, StoreError>(keys)
        });
        let mut stale = Vec::new();
        for shard in futures::future::join_all(queries).await {
            stale.extend(shard?);
        }
        let mut recovered = 0;
        for (pk, sk) in stale {
            let got = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key(&pk, &sk)))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            let Some(item) = got.item else { continue };
            let delivery: DeliveryItem = parse("delivery", item.clone())?;
            let Some(until) = delivery.lease_until else {
                continue;
            };
            if until >= now.timestamp_millis()
                || !matches!(delivery.state.as_str(), "claimed" | "sending")
            {
                continue;
            }
            let Ok(template) = TemplateId::parse(delivery.template_id.clone()) else {
                tracing::error!(delivery_id = %delivery.delivery_id, "stale delivery with a bad template id");
                continue;
            };
            let source = self
                .stale_source_writes(&pk, &delivery, kinds, shards, now)
                .await?;
            let settled = self
                .settle(
                    Settle {
                        pk: &pk,
                        delivery_id: &delivery.delivery_id,
                        owner: Owner::ExpiredLease(until),
                        state: "unknown",
                        outcome: format!("lease expired in state {}", delivery.state),
                        errcode: None,
                        msgid: None,
                        grant_sk: &delivery.grant_sk,
                        template: &template,
                        grant_to: GrantState::Invalid,
                        source,
                    },
                    now,
                )
                .await?;
            if settled.delivery {
                recovered += 1;
                tracing::warn!(delivery_id = %delivery.delivery_id, "stale claim recovered as unknown");
            }
        }
        Ok(recovered)
    }

    /// What a sweep writes to the item a stale delivery claimed, if it is still that
    /// delivery's: the plan paused `uncertain`, or the outbox and notification `unknown`.
    async fn stale_source_writes(
        &self,
        pk: &str,
        delivery: &DeliveryItem,
        kinds: &ReminderKinds,
        shards: u32,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        if let Some(kind) = delivery
            .source
            .strip_prefix("PLAN#")
            .and_then(|k| kinds.get(k))
        {
            let read = self.read(pk, kind, None).await?;
            let Some(item) = read.plan else {
                return Ok(Vec::new());
            };
            let mut plan = item.into_plan(kind)?;
            if plan.status != PlanStatus::Sending
                || plan.delivery_id.as_deref() != Some(delivery.delivery_id.as_str())
            {
                return Ok(Vec::new());
            }
            plan.status = plan
                .status
                .apply(PlanEvent::SendStopped(PauseReason::Uncertain))
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            plan.delivery_id = None;
            return Ok(vec![self.plan_put(&plan, pk, shards, now)?]);
        }
        if delivery.source.starts_with("OUTBOX#") {
            let got = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key(pk, &delivery.source)))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            let Some(item) = got.item else {
                return Ok(Vec::new());
            };
            let outbox: OutboxItem = parse("outbox", item)?;
            if outbox.state != "sending"
                || outbox.delivery_id.as_deref() != Some(delivery.delivery_id.as_str())
            {
                return Ok(Vec::new());
            }
            let unknown = outbox.moved("unknown", None, shards, now);
            return Ok(vec![
                versioned_put(
                    &self.table,
                    serde_dynamo::to_item(&unknown).map_err(|e| corrupt("outbox", e))?,
                    outbox.version,
                )?,
                note_push_update(
                    &self.table,
                    pk,
                    &outbox.note_id,
                    PushStatus::Unknown,
                    Some("the dispatcher stopped mid-send"),
                )?,
            ]);
        }
        tracing::error!(source = %delivery.source, "stale delivery of no configured kind");
        Ok(Vec::new())
    }
}
