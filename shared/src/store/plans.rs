//! Reminder plans: settings, check-ins, the effects of grant reports, and the due index.
//!
//! A plan item (`PLAN#<kind>`) carries its state, version and settings; while
//! `scheduled` it also carries `due_pk`/`due_at`, which put it on the sparse due index,
//! and while `sending` its claim's `lease_pk`/`lease_until`, which put it on the lease
//! index (so a sweep finds a plan its settled delivery left behind). Every write is a
//! whole-item Put conditional on the version it was read at, so index entries are
//! added and removed in the same write that changes the state.
//!
//! A check-in is one read (plan, quota, action record, the carried grant's ledger item)
//! and one transaction: the action record (with the answer, kept 35 days), the plan,
//! and — when the check-in carries a new grant — the ledger item and counters, exactly
//! as a grant report writes them. Replays are answered from the action record.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, KeysAndAttributes, Put, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use super::grants::{
    GrantItem, INFLIGHT, OPEN_AVAILABLE, OPEN_RESERVED, OPEN_UNKNOWN, PENDING_EVENTS, SENT_MARKS,
    quota_update_item, rfc3339,
};
use super::item::{key, n, parse, s};
use super::keys::{
    GRANT_PREFIX, action_sk, due_pk, grant_sk, lease_pk, plan_sk, quota_sk, request_id_of_grant,
    user_pk,
};
use super::{
    Attempt, Limit, MAX_WRITE_ATTEMPTS, Store, StoreError, classify_sdk_error, corrupt,
    retry_contended,
};
use crate::domain::consent::{GrantOnHand, PauseReason, Refusal};
use crate::domain::plan::{Plan, PlanStatus};
use crate::domain::reconcile::Mark;
use crate::domain::reminder::{CheckIn, ReminderKind, ReminderKinds, Settings, SettingsUpdate};
use crate::domain::schedule::{Schedule, TimeOfDay, Timezone};
use crate::domain::{GrantState, OpenId, QuotaCounters, RequestId, SubscribeResult, TemplateId};

/// Most grants one transaction invalidates (100 items per transaction, less the plan,
/// the counters and the history entry).
const INVALIDATE_CHUNK: usize = 97;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PlanItem {
    pk: String,
    sk: String,
    kind: String,
    reminder: String,
    template_id: String,
    state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pause_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next_due_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due_at: Option<i64>,
    interval_minutes: u32,
    wake_time: String,
    sleep_time: String,
    timezone: String,
    daily_goal: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    today_date: Option<String>,
    #[serde(default)]
    today_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_checkin_at: Option<i64>,
    #[serde(default)]
    attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery_id: Option<String>,
    /// While `sending`: on the lease index, so a sweep finds a plan its delivery left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_until: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending_refusal: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    checked_in_while_sending: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    accepted_while_sending: bool,
    /// The per-user check-in rate: the minute (epoch seconds / 60) and its count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checkin_minute: Option<i64>,
    #[serde(default)]
    checkin_minute_count: u32,
    version: u64,
    updated_at: String,
}

fn refusal_name(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::Reject => "reject",
        Refusal::Ban => "ban",
    }
}

fn parse_refusal(name: &str) -> Option<Refusal> {
    match name {
        "reject" => Some(Refusal::Reject),
        "ban" => Some(Refusal::Ban),
        _ => None,
    }
}

fn millis(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("bad instant {ms}")))
}

impl PlanItem {
    fn from_plan(plan: &Plan, pk: &str, shards: u32, version: u64, now: DateTime<Utc>) -> Self {
        let sk = plan_sk(&plan.kind);
        let schedule = &plan.settings.schedule;
        let due = plan.status.due().map(|d| d.timestamp_millis());
        let lease = match plan.status {
            PlanStatus::Sending => plan.lease_until.map(|t| t.timestamp_millis()),
            PlanStatus::Disabled
            | PlanStatus::Scheduled { .. }
            | PlanStatus::AwaitingCheckin
            | PlanStatus::Paused { .. } => None,
        };
        Self {
            pk: pk.to_string(),
            due_pk: due.map(|_| due_pk(pk, &sk, shards)),
            sk,
            kind: "plan".into(),
            reminder: plan.kind.to_string(),
            template_id: plan.template_id.to_string(),
            state: plan.status.name().into(),
            pause_reason: plan.status.pause_reason().map(|r| r.as_str().to_string()),
            next_due_at: due,
            due_at: due,
            interval_minutes: schedule.interval_minutes(),
            wake_time: schedule.wake_time().to_string(),
            sleep_time: schedule.sleep_time().to_string(),
            timezone: schedule.timezone().name().to_string(),
            daily_goal: plan.settings.daily_goal,
            today_date: plan.today.map(|(d, _)| d.format("%Y-%m-%d").to_string()),
            today_count: plan.today.map(|(_, c)| c).unwrap_or(0),
            last_checkin_at: plan.last_checkin_at.map(|t| t.timestamp_millis()),
            attempts: plan.attempts,
            delivery_id: match plan.status {
                PlanStatus::Sending => plan.delivery_id.clone(),
                PlanStatus::Paused {
                    reason: PauseReason::Uncertain,
                } => plan.delivery_id.clone(),
                PlanStatus::Disabled
                | PlanStatus::Scheduled { .. }
                | PlanStatus::AwaitingCheckin
                | PlanStatus::Paused { .. } => None,
            },
            lease_pk: lease
                .map(|_| lease_pk(plan.delivery_id.as_deref().unwrap_or_default(), shards)),
            lease_until: lease,
            // Kept while a send is in flight (applied when it ends) and while the plan
            // is off (applied when it is turned on).
            pending_refusal: match plan.status {
                PlanStatus::Sending | PlanStatus::Disabled => {
                    plan.pending_refusal.map(|r| refusal_name(r).to_string())
                }
                PlanStatus::Scheduled { .. }
                | PlanStatus::AwaitingCheckin
                | PlanStatus::Paused { .. } => None,
            },
            checked_in_while_sending: plan.status == PlanStatus::Sending
                && plan.checked_in_while_sending,
            accepted_while_sending: plan.status == PlanStatus::Sending
                && plan.accepted_while_sending,
            checkin_minute: plan.checkins_in_minute.map(|(m, _)| m),
            checkin_minute_count: plan.checkins_in_minute.map_or(0, |(_, c)| c),
            version,
            updated_at: rfc3339(now),
        }
    }

    pub(super) fn into_plan(self, kind: &ReminderKind) -> Result<Plan, StoreError> {
        let bad = |what: &str| StoreError::Corrupt(format!("plan {}: {what}", self.sk));
        let status = match self.state.as_str() {
            "disabled" => PlanStatus::Disabled,
            "scheduled" => PlanStatus::Scheduled {
                due: millis(
                    self.next_due_at
                        .ok_or_else(|| bad("scheduled without next_due_at"))?,
                )?,
            },
            "sending" => PlanStatus::Sending,
            "awaiting_checkin" => PlanStatus::AwaitingCheckin,
            "paused" => PlanStatus::Paused {
                reason: self
                    .pause_reason
                    .as_deref()
                    .and_then(PauseReason::parse)
                    .ok_or_else(|| bad("paused without a known reason"))?,
            },
            other => return Err(bad(&format!("unknown state {other:?}"))),
        };
        let schedule = Schedule::new(
            self.interval_minutes,
            TimeOfDay::parse(&self.wake_time, "wake_time").map_err(|_| bad("wake_time"))?,
            TimeOfDay::parse(&self.sleep_time, "sleep_time").map_err(|_| bad("sleep_time"))?,
            Timezone::parse(&self.timezone).map_err(|_| bad("timezone"))?,
        )
        .map_err(|_| bad("schedule"))?;
        let today = match self.today_date {
            None => None,
            Some(d) => Some((
                NaiveDate::parse_from_str(&d, "%Y-%m-%d").map_err(|_| bad("today_date"))?,
                self.today_count,
            )),
        };
        Ok(Plan {
            kind: kind.name.clone(),
            template_id: kind.template_id.clone(),
            status,
            settings: Settings {
                schedule,
                daily_goal: self.daily_goal,
            },
            today,
            last_checkin_at: self.last_checkin_at.map(millis).transpose()?,
            attempts: self.attempts,
            delivery_id: self.delivery_id,
            lease_until: self.lease_until.map(millis).transpose()?,
            pending_refusal: match self.pending_refusal.as_deref() {
                None => None,
                Some(name) => Some(parse_refusal(name).ok_or_else(|| bad("pending_refusal"))?),
            },
            checked_in_while_sending: self.checked_in_while_sending,
            accepted_while_sending: self.accepted_while_sending,
            checkins_in_minute: self.checkin_minute.map(|m| (m, self.checkin_minute_count)),
            version: self.version,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct ActionItem {
    pk: String,
    sk: String,
    kind: String,
    reminder: String,
    fingerprint: String,
    response: String,
    created_at: String,
    expires_at: i64,
}

/// A plan and its template's available grants, as read together.
#[derive(Debug, Clone)]
pub struct PlanSnapshot {
    pub plan: Plan,
    pub counters: QuotaCounters,
}

/// The outcome of a check-in.
#[derive(Debug, Clone)]
pub enum CheckInOutcome {
    /// Newly applied; the answer (also stored for replays).
    Applied(serde_json::Value),
    /// The action was applied before; the first answer.
    Replayed(serde_json::Value),
}

pub(super) struct Read {
    pub(super) plan: Option<PlanItem>,
    pub(super) counters: QuotaCounters,
    /// The template's open grants, from the quota item's sets.
    pub(super) open: OpenGrants,
    action: Option<ActionItem>,
    ledger: Option<GrantItem>,
}

impl Store {
    /// Reads the given items of one user in one strongly consistent round trip.
    pub(super) async fn read_items(
        &self,
        pk: &str,
        sks: &[String],
    ) -> Result<HashMap<String, HashMap<String, AttributeValue>>, StoreError> {
        let mut found = HashMap::new();
        let mut pending: Vec<HashMap<String, AttributeValue>> =
            sks.iter().map(|sk| key(pk, sk)).collect();
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let keys = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(true)
                .build()
                .map_err(|e| StoreError::Sdk(Box::new(e)))?;
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, keys)
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            for item in out
                .responses()
                .and_then(|r| r.get(&self.table))
                .into_iter()
                .flatten()
            {
                if let Some(AttributeValue::S(sk)) = item.get("sk") {
                    found.insert(sk.clone(), item.clone());
                }
            }
            if let Some(left) = out.unprocessed_keys().and_then(|u| u.get(&self.table)) {
                pending = left.keys().to_vec();
                super::contended_pause("read", attempt).await;
            }
        }
        Ok(found)
    }

    pub(super) async fn read(
        &self,
        pk: &str,
        kind: &ReminderKind,
        action: Option<&CheckIn>,
    ) -> Result<Read, StoreError> {
        let plan_key = plan_sk(&kind.name);
        let quota_key = quota_sk(&kind.template_id);
        let mut sks = vec![plan_key.clone(), quota_key.clone()];
        let action_key = action.map(|c| action_sk(&c.action_id));
        let ledger_key = action
            .and_then(|c| c.grant.as_ref())
            .map(|(rid, _)| grant_sk(&kind.template_id, rid));
        sks.extend(action_key.iter().cloned());
        sks.extend(ledger_key.iter().cloned());
        let mut items = self.read_items(pk, &sks).await?;
        let (counters, open) = match items.remove(&quota_key) {
            Some(item) => (
                parse("quota", item.clone()).map(|q: QuotaItemCounters| q.counters)?,
                OpenGrants::of(&item),
            ),
            None => (QuotaCounters::default(), OpenGrants::default()),
        };
        Ok(Read {
            open,
            plan: items
                .remove(&plan_key)
                .map(|i| parse("plan", i))
                .transpose()?,
            counters,
            action: action_key
                .and_then(|k| items.remove(&k))
                .map(|i| parse("action", i))
                .transpose()?,
            ledger: ledger_key
                .and_then(|k| items.remove(&k))
                .map(|i| parse("grant", i))
                .transpose()?,
        })
    }

    /// A user's plan for `kind` (the defaults, disabled, if never stored) and the
    /// counters of its template: one round trip.
    pub async fn plan(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
    ) -> Result<PlanSnapshot, StoreError> {
        let read = self.read(&user_pk(openid), kind, None).await?;
        let plan = match read.plan {
            Some(item) => item.into_plan(kind)?,
            None => Plan::new(kind),
        };
        Ok(PlanSnapshot {
            plan,
            counters: read.counters,
        })
    }

    pub(super) fn plan_put(
        &self,
        plan: &Plan,
        pk: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let item = PlanItem::from_plan(plan, pk, self.shards, plan.version + 1, now);
        let item = serde_dynamo::to_item(&item).map_err(|e| corrupt("plan", e))?;
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let put = if plan.version == 0 {
            put.condition_expression("attribute_not_exists(pk)")
        } else {
            put.condition_expression("version = :v")
                .expression_attribute_values(":v", AttributeValue::N(plan.version.to_string()))
        };
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(|e| StoreError::Sdk(Box::new(e)))?)
            .build())
    }

    /// A transaction item that only checks `plan` is still at the version it was read.
    pub(super) fn plan_unchanged(
        &self,
        pk: &str,
        plan: &Plan,
    ) -> Result<TransactWriteItem, StoreError> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &plan_sk(&plan.kind))))
            .condition_expression("version = :v")
            .expression_attribute_values(":v", AttributeValue::N(plan.version.to_string()))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }

    fn grant_check(&self, pk: &str, kind: &ReminderKind) -> Result<TransactWriteItem, StoreError> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &quota_sk(&kind.template_id))))
            .condition_expression("available > :zero")
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }

    /// Sends a transaction and sorts the answer: committed; cancelled, with each item's
    /// reason and ALL_OLD item (the caller decides: replay, conflict or retry); or
    /// contended (throttled, in conflict with another transaction — retry). `Err` only
    /// for failures a retry will not fix.
    pub(super) async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
    ) -> Result<TxOutcome, StoreError> {
        // One token for every attempt below: a retry after a commit whose answer was
        // lost gets that answer instead of failing its own conditions (and a caller
        // reading again would take its own write for someone else's).
        let items = if self.limits.audit {
            super::history::with_history(
                items,
                &self.table,
                Utc::now(),
                self.limits.retention.grants,
            )?
        } else {
            items
        };
        let token = super::request_token();
        let started = tokio::time::Instant::now();
        // Set once an attempt may have committed unseen: from then on an answer that
        // only says "not this attempt" (a throttle, the token in progress) proves
        // nothing, and only DynamoDB's answer for the token ends the call.
        let mut ambiguous = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The SDK's own retries are off here: this loop sees every attempt, so it
            // knows whether one may have committed.
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .client_request_token(&token)
                .customize()
                .config_override(
                    aws_sdk_dynamodb::config::Builder::new()
                        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled()),
                )
                .send()
                .await;
            let again = match &sent {
                Err(err) if may_have_committed(err) => {
                    ambiguous = true;
                    true
                }
                Err(err) => did_not_run(err),
                Ok(_) => false,
            };
            // After an attempt that may have committed, keep asking (longer, and with
            // longer pauses: that attempt may still be running, and "in progress" until
            // it ends) until DynamoDB answers for the token or the budget is spent.
            let limit = if ambiguous {
                AMBIGUOUS_ATTEMPTS
            } else {
                TRANSACT_ATTEMPTS
            };
            if again && attempt < limit && started.elapsed() < self.limits.write_budget {
                let pause = if ambiguous {
                    tracing::warn!(
                        attempt,
                        "a transaction's outcome is unknown; sent again with its token"
                    );
                    AMBIGUOUS_PAUSE * 2u32.pow(attempt.min(4))
                } else {
                    super::backoff(attempt + 1)
                };
                tokio::time::sleep(pause).await;
                continue;
            }
            return self.sort_transaction(sent);
        }
    }

    fn sort_transaction(
        &self,
        sent: Result<
            aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput,
            aws_sdk_dynamodb::error::SdkError<
                TransactWriteItemsError,
                aws_smithy_runtime_api::http::Response,
            >,
        >,
    ) -> Result<TxOutcome, StoreError> {
        match sent {
            Ok(_) => Ok(TxOutcome::Committed),
            Err(err) => {
                if let aws_sdk_dynamodb::error::SdkError::ServiceError(ref service) = err
                    && let TransactWriteItemsError::TransactionCanceledException(cancelled) =
                        service.err()
                {
                    let reasons = cancelled
                        .cancellation_reasons()
                        .iter()
                        .map(|r| (r.code().unwrap_or("None").to_string(), r.item().cloned()))
                        .collect();
                    return Ok(TxOutcome::Cancelled(reasons));
                }
                if may_have_committed(&err) || did_not_run(&err) {
                    return Ok(TxOutcome::Contended);
                }
                match classify_sdk_error(err, super::grants::transact_unavailable) {
                    StoreError::Unavailable(_) => Ok(TxOutcome::Contended),
                    other => Err(other),
                }
            }
        }
    }

    /// A strongly consistent query of `pk`'s grants of `template` in one of `states`
    /// (one or two state names).
    pub(super) fn grants_query(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        states: &[&str],
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        let first = states.first().copied().unwrap_or("available");
        let second = states.get(1).copied().unwrap_or(first);
        self.client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .filter_expression("#s IN (:first, :second)")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":prefix", s(format!("{GRANT_PREFIX}{template}#")))
            .expression_attribute_values(":first", s(first))
            .expression_attribute_values(":second", s(second))
    }

    /// Invalidates every available or reserved grant of the kind's template, in
    /// transactions of at most [`INVALIDATE_CHUNK`] grants, the first also writing
    /// `first` (the plan). With `reported_before`, only grants recorded before that
    /// instant: WeChat's 43101 answered a send claimed then, and says nothing of a
    /// grant the user gave while it was in flight. Returns false if anything changed
    /// underneath (retry).
    pub(super) async fn invalidate_grants(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        first: Option<TransactWriteItem>,
        include_reserved: bool,
        reported_before: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut open: Vec<(String, GrantState)> = Vec::new();
        // "Open" grants: available, and reserved too when a plan is disabled. The quota
        // item lists them; only grants recorded before it did need the ledger query.
        let quota_key = quota_sk(template);
        let listed = match self
            .read_items(pk, std::slice::from_ref(&quota_key))
            .await?
            .remove(&quota_key)
        {
            Some(quota) => {
                let counters = parse::<QuotaItemCounters>("quota", quota.clone())?.counters;
                // (An id in both sets is wrong, and would be voided twice in one
                // transaction, which DynamoDB refuses: the ledger instead.)
                Some(OpenGrants::of(&quota))
                    .filter(|sets| sets.complete(&counters) && sets.disjoint())
            }
            None => Some(OpenGrants::default()),
        };
        let trusted = listed.is_some();
        if let Some(sets) = listed {
            open.extend(
                sets.available
                    .iter()
                    .map(|id| (grant_sk(template, id), GrantState::Available)),
            );
            if include_reserved {
                open.extend(
                    sets.reserved
                        .iter()
                        .map(|id| (grant_sk(template, id), GrantState::Reserved)),
                );
            }
        } else {
            let states: &[&str] = if include_reserved {
                &["available", "reserved"]
            } else {
                &["available"]
            };
            let mut pages = self
                .grants_query(pk, template, states)
                .into_paginator()
                .items()
                .send();
            while let Some(item) = pages.next().await {
                let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
                let grant: GrantItem =
                    serde_dynamo::from_item(item).map_err(|e| corrupt("grant", e))?;
                if let Some(state) = grant.state {
                    open.push((grant.sk, state));
                }
            }
        }
        if let Some(bound) = reported_before {
            open = self.recorded_before(pk, open, bound).await?;
        }
        let mut first = first;
        // The first transaction stamps the quota item `voided_at`, even with nothing to
        // void: a send in flight whose grant the sweep already voided must not get it
        // back by a late answer (see `VOIDED_AT`).
        let mut stamp = true;
        let chunks: Vec<_> = open.chunks(INVALIDATE_CHUNK).map(<[_]>::to_vec).collect();
        for chunk in chunks.into_iter().chain(std::iter::once(Vec::new())) {
            let mut items = Vec::with_capacity(chunk.len() + 2);
            // Which grant (and the state it was listed in) each item moves.
            let mut moves: Vec<Option<(String, GrantState)>> = Vec::with_capacity(chunk.len() + 2);
            if let Some(plan) = first.take() {
                items.push(plan);
                moves.push(None);
            } else if chunk.is_empty() && !stamp {
                break;
            }
            let (mut available, mut reserved) = (0i64, 0i64);
            let (mut available_ids, mut reserved_ids) = (Vec::new(), Vec::new());
            for (sk, state) in &chunk {
                let id = request_id_of_grant(sk).map(|r| r.to_string());
                let from = match state {
                    GrantState::Available => {
                        available += 1;
                        available_ids.extend(id);
                        "available"
                    }
                    GrantState::Reserved => {
                        reserved += 1;
                        reserved_ids.extend(id);
                        "reserved"
                    }
                    GrantState::Consumed | GrantState::Invalid => continue,
                };
                let update = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(pk, sk)))
                    .update_expression(
                        "SET #s = :invalid, updated_at = :now, version = version + :one, \
                         expires_at = :expires",
                    )
                    .condition_expression("#s = :from")
                    .expression_attribute_names("#s", "state")
                    .expression_attribute_values(":invalid", s("invalid"))
                    .expression_attribute_values(
                        ":expires",
                        n((now + self.limits.retention.grants).timestamp()),
                    )
                    .expression_attribute_values(":from", s(from))
                    .expression_attribute_values(":now", s(rfc3339(now)))
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .build()
                    .map_err(|e| StoreError::Sdk(Box::new(e)))?;
                items.push(TransactWriteItem::builder().update(update).build());
                moves.push(Some((sk.clone(), *state)));
            }
            if available + reserved > 0 || stamp {
                // The voided grants leave the quota item's open-grant sets too.
                let mut expression =
                    "SET updated_at = :now ADD available :a, reserved :r, invalid :n".to_string();
                let mut update = Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(key(pk, &quota_sk(template))));
                if std::mem::take(&mut stamp) {
                    // (Named like every quota item, should this one create it: a user
                    // who never reported the template still reads as a quota.)
                    expression = expression.replacen(
                        "SET updated_at = :now",
                        "SET updated_at = :now, #voided = :voided, template_id = :t, kind = :kind",
                        1,
                    );
                    update = update
                        .expression_attribute_names("#voided", super::grants::VOIDED_AT)
                        .expression_attribute_values(":voided", n(now.timestamp_millis()))
                        .expression_attribute_values(":t", s(template.as_str()))
                        .expression_attribute_values(":kind", s("quota"));
                }
                // Off both sets: a voided grant is in neither state, and an id wrongly
                // in the other set (which made the sets untrusted) goes with it.
                let gone: Vec<String> = available_ids.into_iter().chain(reserved_ids).collect();
                if !gone.is_empty() {
                    expression.push_str(" DELETE #oa :gone, #or :gone");
                    update = update
                        .expression_attribute_names("#oa", OPEN_AVAILABLE)
                        .expression_attribute_names("#or", OPEN_RESERVED)
                        .expression_attribute_values(":gone", AttributeValue::Ss(gone));
                }
                let update = update
                    .update_expression(expression)
                    .expression_attribute_values(":now", s(rfc3339(now)))
                    .expression_attribute_values(":a", AttributeValue::N((-available).to_string()))
                    .expression_attribute_values(":r", AttributeValue::N((-reserved).to_string()))
                    .expression_attribute_values(
                        ":n",
                        AttributeValue::N((available + reserved).to_string()),
                    )
                    .build()
                    .map_err(|e| StoreError::Sdk(Box::new(e)))?;
                items.push(TransactWriteItem::builder().update(update).build());
            }
            match self.transact(items).await? {
                TxOutcome::Committed => {}
                TxOutcome::Cancelled(reasons) => {
                    if trusted {
                        let refused: Vec<(String, GrantState)> = reasons
                            .iter()
                            .zip(&moves)
                            .filter_map(|((code, _), moved)| {
                                moved.clone().filter(|_| code == "ConditionalCheckFailed")
                            })
                            .collect();
                        self.unlist_if_not(pk, template, refused).await;
                    }
                    return Ok(false);
                }
                TxOutcome::Contended => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Grants the quota item listed (each in its state) that were not in it when
    /// voided. Usually a write meanwhile moved them, and took them off the list too;
    /// but a member wrongly listed would refuse every retry of a void that trusts the
    /// list. So those still listed (one read of the quota item) leave it, in one
    /// transaction with a check on each that its grant is still not in that state, so
    /// a true member never does. The list then falls short of the counters and the
    /// retry goes to the ledger. Failures are logged; the retry goes on.
    async fn unlist_if_not(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        refused: Vec<(String, GrantState)>,
    ) {
        if refused.is_empty() {
            return;
        }
        let quota_key = quota_sk(template);
        let listed = match self.read_items(pk, std::slice::from_ref(&quota_key)).await {
            Ok(mut items) => items
                .remove(&quota_key)
                .map(|quota| OpenGrants::of(&quota))
                .unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "the open-grant list was not checked this time");
                return;
            }
        };
        let fixes: Vec<super::dispatch::claim::SetFix> = refused
            .into_iter()
            .filter_map(|(sk, state)| {
                let request = request_id_of_grant(&sk)?;
                let still = match state {
                    GrantState::Available => listed.available.contains(&request),
                    GrantState::Reserved => listed.reserved.contains(&request),
                    GrantState::Consumed | GrantState::Invalid => false,
                };
                still.then_some(super::dispatch::claim::SetFix {
                    state,
                    request,
                    add: false,
                })
            })
            .collect();
        if fixes.is_empty() {
            // The ordinary case: a write meanwhile moved them, and the list with them.
            return;
        }
        let outcome = match self.set_fix_writes(pk, template, &fixes) {
            Ok(writes) => self.transact(writes).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(TxOutcome::Committed) => tracing::error!(
                grants = fixes.len(),
                "grants listed as open were not; taken off the list"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %crate::telemetry::error_chain(&e),
                "wrongly listed grants were not taken off the list this time"
            ),
        }
    }

    /// Of `grants`, those whose ledger item was recorded before `bound` (one read per
    /// 100; a grant whose item is gone or unreadable stays in, as it would without
    /// the bound).
    async fn recorded_before(
        &self,
        pk: &str,
        grants: Vec<(String, GrantState)>,
        bound: DateTime<Utc>,
    ) -> Result<Vec<(String, GrantState)>, StoreError> {
        let mut items = HashMap::new();
        let sks: Vec<String> = grants.iter().map(|(sk, _)| sk.clone()).collect();
        for chunk in sks.chunks(100) {
            items.extend(self.read_items(pk, chunk).await?);
        }
        Ok(grants
            .into_iter()
            .filter(|(sk, _)| {
                let recorded = items
                    .get(sk)
                    .and_then(|item| item.get("created_at"))
                    .and_then(|v| v.as_s().ok())
                    .and_then(|at| DateTime::parse_from_rfc3339(at).ok());
                recorded.is_none_or(|at| at < bound)
            })
            .collect())
    }

    /// `PUT /v1/reminders/{kind}`: applies new settings and enables or disables the plan.
    /// Disabling invalidates every unconsumed grant of the kind's template.
    pub async fn save_settings(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        update: &SettingsUpdate,
        now: DateTime<Utc>,
    ) -> Result<PlanSnapshot, StoreError> {
        let pk = &user_pk(openid);
        retry_contended("plan settings", self.limits.write_budget, || async move {
            let read = self.read(pk, kind, None).await?;
            let mut plan = match read.plan {
                Some(item) => item.into_plan(kind)?,
                None => Plan::new(kind),
            };
            let mut counters = read.counters;
            plan.settings = update.settings;
            let moved = if update.enabled {
                let anchor = plan.last_checkin_at.unwrap_or(now);
                let due = plan.next_due(anchor, plan.settings.daily_goal, now);
                plan.enable(counters.available > 0, due)
            } else {
                plan.disable()
            };
            moved.map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let put = self.plan_put(&plan, pk, now)?;
            let committed = if update.enabled {
                let mut items = vec![put];
                if matches!(plan.status, PlanStatus::Scheduled { .. }) {
                    items.push(self.grant_check(pk, kind)?);
                }
                matches!(self.transact(items).await?, TxOutcome::Committed)
            } else {
                let done = self
                    .invalidate_grants(pk, &kind.template_id, Some(put), true, None, now)
                    .await?;
                if done {
                    counters.invalid += counters.available + counters.reserved;
                    counters.available = 0;
                    counters.reserved = 0;
                }
                done
            };
            if !committed {
                return Ok(Attempt::Retry);
            }
            plan.version += 1;
            Ok(Attempt::Done(PlanSnapshot { plan, counters }))
        })
        .await
    }

    /// `POST /v1/reminders/{kind}/checkins` (see the module docs).
    pub async fn check_in(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        checkin: &CheckIn,
        now: DateTime<Utc>,
    ) -> Result<CheckInOutcome, StoreError> {
        let pk = &user_pk(openid);
        let fingerprint = &checkin.fingerprint(&kind.name);
        let outcome = retry_contended("check-in", self.limits.write_budget, || async move {
            let read = self.read(pk, kind, Some(checkin)).await?;
            if let Some(action) = read.action {
                return replay(action, fingerprint).map(Attempt::Done);
            }
            // The grant the check-in carries: new, a replay of an earlier report, or a
            // conflict with one — which refuses the grant part alone: the check-in itself
            // is a fact the user made and is recorded all the same (I7).
            // A new grant past the open-grant cap is refused the same way.
            let mut write_ledger = None;
            let mut grant_conflict = false;
            let mut grant_limit = false;
            if let Some((request_id, result)) = &checkin.grant {
                match &read.ledger {
                    Some(old) if old.result == *result => {}
                    Some(_) => grant_conflict = true,
                    None if result.grants()
                        && read.counters.available >= u64::from(self.limits.max_open_grants) =>
                    {
                        grant_limit = true;
                    }
                    None => write_ledger = Some((request_id.clone(), *result)),
                }
            }
            let new_grant = write_ledger.as_ref().is_some_and(|(_, r)| r.grants());
            let mut counters = read.counters;
            if new_grant {
                counters.accepted += 1;
                counters.available += 1;
            }

            let mut plan = match read.plan {
                Some(item) => item.into_plan(kind)?,
                None => Plan::new(kind),
            };
            // A new check-in (a replay answered above) past this minute's limit is
            // refused before anything is written.
            plan.admit_checkin(now, self.limits.checkins_per_minute)
                .map_err(|retry_after| StoreError::Limited(Limit::Rate { retry_after }))?;
            let schedule = plan.settings.schedule;
            // A phone clock running fast counts the check-in now (I9).
            let day = schedule.waking_day(checkin.counted_at(now));
            plan.record_count(day, checkin.current_count);
            let anchor = plan
                .last_checkin_at
                .map_or(checkin.scheduling_instant(now), |last| {
                    last.max(checkin.scheduling_instant(now))
                });
            let due = plan.next_due(anchor, checkin.daily_goal, now);
            // The send in flight decides; the check-in counts when it ends. Only a
            // grant this check-in newly records lifts a refusal, and only a refusal it
            // newly records pauses: one the ledger holds already took effect when it
            // was first recorded (a replay changes nothing, I3).
            plan.check_in(GrantOnHand::of(new_grant, counters.available > 0), due)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if let Some(refusal) = write_ledger.as_ref().and_then(|(_, r)| Refusal::of(*r)) {
                plan.refuse(refusal)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            }
            plan.last_checkin_at = Some(anchor.max(plan.last_checkin_at.unwrap_or(anchor)));

            let mut answered = plan.clone();
            answered.version += 1;
            let mut response = serde_json::to_value(answered.view(counters.available, now))
                .map_err(|e| corrupt("plan view", e))?;
            if let Some(object) = response.as_object_mut() {
                if grant_conflict {
                    object.insert("grant_conflict".into(), serde_json::Value::Bool(true));
                }
                if grant_limit {
                    object.insert("grant_limit".into(), serde_json::Value::Bool(true));
                }
            }
            let action = ActionItem {
                pk: pk.to_string(),
                sk: action_sk(&checkin.action_id),
                kind: "action".into(),
                reminder: kind.name.to_string(),
                fingerprint: fingerprint.to_string(),
                response: response.to_string(),
                created_at: rfc3339(now),
                expires_at: (now + self.limits.retention.actions).timestamp(),
            };
            let mut items = vec![
                self.put_new(serde_dynamo::to_item(&action).map_err(|e| corrupt("action", e))?)?,
                self.plan_put(&plan, pk, now)?,
            ];
            if let Some((request_id, result)) = &write_ledger {
                let item = GrantItem::new(
                    pk,
                    &kind.template_id,
                    request_id,
                    *result,
                    now,
                    self.limits.retention.grants,
                );
                items.push(
                    self.put_new(serde_dynamo::to_item(&item).map_err(|e| corrupt("grant", e))?)?,
                );
                if let Some(update) = quota_update_item(
                    &self.table,
                    pk,
                    &kind.template_id,
                    request_id,
                    *result,
                    now,
                    &self.limits,
                )? {
                    items.push(update);
                }
            } else if matches!(plan.status, PlanStatus::Scheduled { .. }) {
                items.push(self.grant_check(pk, kind)?);
            }
            match self.transact(items).await? {
                TxOutcome::Committed => {
                    return Ok(Attempt::Done(CheckInOutcome::Applied(response)));
                }
                TxOutcome::Cancelled(reasons) => {
                    if condition_failed(&reasons, 0) {
                        let old = reasons
                            .first()
                            .and_then(|(_, item)| item.clone())
                            .ok_or_else(|| {
                                StoreError::Corrupt("action conflict without the old item".into())
                            })?;
                        let old: ActionItem =
                            serde_dynamo::from_item(old).map_err(|e| corrupt("action", e))?;
                        return replay(old, fingerprint).map(Attempt::Done);
                    }
                    // A report of the same grant landed meanwhile: the next read sees
                    // it (a replay, or a conflict refused on its own).
                }
                TxOutcome::Contended => {}
            }
            Ok(Attempt::Retry)
        })
        .await?;
        // A grant the check-in carried: confirmed by a popup event already recorded?
        if self.limits.push_events
            && matches!(outcome, CheckInOutcome::Applied(_))
            && checkin
                .grant
                .as_ref()
                .is_some_and(|(_, result)| result.grants())
        {
            self.pair_taps_logged(openid, &kind.template_id, now).await;
        }
        Ok(outcome)
    }

    /// The plan writes a report's first application makes: for each template it
    /// records, the plans of the kinds that use it, moved by the domain's
    /// [`Plan::reported`] (an unchanged one checked at its version). A plan never
    /// stored is written only to remember a refusal. One read of the plans (none when
    /// no kind uses the templates).
    pub(super) async fn report_plans(
        &self,
        pk: &str,
        pending: &BTreeMap<TemplateId, SubscribeResult>,
        kinds: &ReminderKinds,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let touched: Vec<(&ReminderKind, SubscribeResult)> = pending
            .iter()
            .filter(|(_, result)| result.grants() || result.refuses())
            .flat_map(|(template, result)| {
                kinds
                    .using_template(template)
                    .map(move |kind| (kind, *result))
            })
            .collect();
        if touched.is_empty() {
            return Ok(Vec::new());
        }
        let sks: Vec<String> = touched.iter().map(|(k, _)| plan_sk(&k.name)).collect();
        let mut stored = self.read_items(pk, &sks).await?;
        let mut writes = Vec::new();
        for (kind, result) in touched {
            // A plan never stored still keeps a refusal (it is written, off, with the
            // refusal remembered, conditional on not existing): turning it on later
            // finds it paused, whatever grants were given before.
            let mut plan = match stored.remove(&plan_sk(&kind.name)) {
                Some(item) => parse::<PlanItem>("plan", item)?.into_plan(kind)?,
                None if result.refuses() => Plan::new(kind),
                None => continue,
            };
            let before = plan.clone();
            plan.reported(result, now)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            writes.push(if plan != before {
                self.plan_put(&plan, pk, now)?
            } else if plan.version > 0 {
                // Unchanged, but read: a report racing this one is ordered by the
                // plan's version, not by chance.
                self.plan_unchanged(pk, &plan)?
            } else {
                continue;
            });
        }
        Ok(writes)
    }

    /// WeChat told of a refusal of the kind's template (a popup reject, a change
    /// event): the plan pauses, as a refusal in a grant report does (a plan never
    /// stored is written off, the refusal remembered). Applied once per event (the
    /// event's record says so), and a refusal applied twice changes nothing.
    pub async fn refuse_plan(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        refusal: Refusal,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let pk = &user_pk(openid);
        retry_contended("plan refusal", self.limits.write_budget, || async move {
            let read = self.read(pk, kind, None).await?;
            // A plan never stored is written, off, with the refusal remembered.
            let mut plan = match read.plan {
                Some(item) => item.into_plan(kind)?,
                None => Plan::new(kind),
            };
            let before = plan.clone();
            plan.refuse(refusal)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if plan == before {
                return Ok(Attempt::Done(()));
            }
            Ok(
                match self.transact(vec![self.plan_put(&plan, pk, now)?]).await? {
                    TxOutcome::Committed => Attempt::Done(()),
                    TxOutcome::Cancelled(_) | TxOutcome::Contended => Attempt::Retry,
                },
            )
        })
        .await
    }
}

fn replay(action: ActionItem, fingerprint: &str) -> Result<CheckInOutcome, StoreError> {
    if action.fingerprint != fingerprint {
        return Err(StoreError::IdempotencyConflict(
            "action_id was used before with a different check-in".into(),
        ));
    }
    let response =
        serde_json::from_str(&action.response).map_err(|e| corrupt("action response", e))?;
    Ok(CheckInOutcome::Replayed(response))
}

/// Whether item `i` of a cancelled transaction failed its condition.
pub(super) fn condition_failed(
    reasons: &[(String, Option<HashMap<String, AttributeValue>>)],
    i: usize,
) -> bool {
    reasons
        .get(i)
        .is_some_and(|(code, _)| code == "ConditionalCheckFailed")
}

pub(super) enum TxOutcome {
    Committed,
    /// Cancelled, with each item's (reason code, ALL_OLD item).
    Cancelled(Vec<(String, Option<HashMap<String, AttributeValue>>)>),
    /// Throttled or in conflict with another transaction.
    Contended,
}

/// How many times one transaction is sent (with one token) before the caller is told
/// it was contended: it reads afresh and decides again, within its write budget.
const TRANSACT_ATTEMPTS: u32 = 5;

/// The same once an attempt may have committed unseen (still within the write budget),
/// with pauses doubling from 50 ms to 400 ms (about 2.7 s in all): the attempt whose
/// answer was lost may still be running, and its token "in progress" until it ends.
const AMBIGUOUS_ATTEMPTS: u32 = 10;
const AMBIGUOUS_PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// Whether a failed transaction may have committed: no answer (a timeout, a dropped
/// connection, an unreadable answer) or a server error (500, and the 502/503/504s
/// DynamoDB's front end may answer unmodelled). Sending it again with the same token is
/// right: DynamoDB answers a committed token with that commit's success (for 10
/// minutes), and runs one that never committed.
fn may_have_committed(
    err: &aws_sdk_dynamodb::error::SdkError<
        TransactWriteItemsError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> bool {
    use aws_sdk_dynamodb::error::SdkError;
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            matches!(
                service.err(),
                TransactWriteItemsError::InternalServerError(_)
            ) || service.raw().status().is_server_error()
        }
        _ => false,
    }
}

/// Whether DynamoDB says it did not run this attempt: a throttle, or another attempt
/// with the same token still in progress. Worth sending again as it is (a cancellation
/// is definite and goes back to the caller: a committed token is never cancelled).
fn did_not_run(
    err: &aws_sdk_dynamodb::error::SdkError<
        TransactWriteItemsError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> bool {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    match err {
        aws_sdk_dynamodb::error::SdkError::ServiceError(service) => {
            super::grants::transact_unavailable(service.err())
                // Throttles the model does not name, as the SDK's own retries know them.
                || matches!(
                    service.err().code(),
                    Some("LimitExceededException" | "RequestLimitExceeded" | "ThrottlingException" | "Throttling" | "TooManyRequestsException")
                )
        }
        _ => false,
    }
}

/// A template's open grants as its quota item lists them (request ids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct OpenGrants {
    pub(super) available: Vec<RequestId>,
    pub(super) reserved: Vec<RequestId>,
    /// The marks of sends recorded `sent` (set members as stored).
    pub(super) sent_marks: Vec<String>,
    /// The marks of sends whose outcome is unknown (set members as stored).
    pub(super) unknown_marks: Vec<String>,
    /// The marks of sends in flight.
    pub(super) inflight_marks: Vec<String>,
    /// Sent events kept pending.
    pub(super) pending_marks: Vec<String>,
}

impl OpenGrants {
    pub(super) fn of(quota: &HashMap<String, AttributeValue>) -> Self {
        let set = |name: &str| -> Vec<RequestId> {
            quota
                .get(name)
                .and_then(|v| v.as_ss().ok())
                .map(|ids| {
                    ids.iter()
                        .filter_map(|id| RequestId::parse(id.clone()).ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let members = |name: &str| -> Vec<String> {
            quota
                .get(name)
                .and_then(|v| v.as_ss().ok())
                .cloned()
                .unwrap_or_default()
        };
        Self {
            available: set(OPEN_AVAILABLE),
            reserved: set(OPEN_RESERVED),
            sent_marks: members(SENT_MARKS),
            unknown_marks: members(OPEN_UNKNOWN),
            inflight_marks: members(INFLIGHT),
            pending_marks: members(PENDING_EVENTS),
        }
    }

    /// The marks no event can match any more, by attribute, for a write that touches
    /// the quota item anyway to drop.
    pub(super) fn stale_marks(&self, now: DateTime<Utc>) -> Vec<(&'static str, Vec<String>)> {
        let stale = |members: &[String]| -> Vec<String> {
            members
                .iter()
                .filter(|m| Mark::parse(m).is_some_and(|mark| mark.is_stale(now)))
                .cloned()
                .collect()
        };
        vec![
            (SENT_MARKS, stale(&self.sent_marks)),
            (OPEN_UNKNOWN, stale(&self.unknown_marks)),
            (INFLIGHT, stale(&self.inflight_marks)),
            (PENDING_EVENTS, stale(&self.pending_marks)),
        ]
    }

    /// Live (not stale) marks of `members`.
    pub(super) fn live(members: &[String], now: DateTime<Utc>) -> Vec<Mark> {
        members
            .iter()
            .filter_map(|m| Mark::parse(m))
            .filter(|m| !m.is_stale(now))
            .collect()
    }

    /// Whether the sets account for the counters. Grants recorded before the sets
    /// existed are not in them: then the caller falls back to the ledger query.
    pub(super) fn complete(&self, counters: &QuotaCounters) -> bool {
        self.available.len() as u64 == counters.available
            && self.reserved.len() as u64 == counters.reserved
    }

    /// Whether no id is in both sets (a grant has one state).
    pub(super) fn disjoint(&self) -> bool {
        !self.available.iter().any(|id| self.reserved.contains(id))
    }
}

#[derive(Deserialize)]
struct QuotaItemCounters {
    #[serde(flatten)]
    counters: QuotaCounters,
}
