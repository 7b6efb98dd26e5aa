//! Grant reports and per-template quota counters.
//!
//! A report writes, in one transaction, one ledger item per template it names — keyed
//! (user, template, request_id) and conditional on not existing — and, per accepted
//! template, `ADD accepted 1, available 1` on that template's counters, whose item also
//! lists the request ids of the open grants ([`OPEN_AVAILABLE`], [`OPEN_RESERVED`]). So
//! a report is applied whole or not at all, and neither reading quotas nor claiming or
//! voiding grants ever reads the grant history.
//!
//! Idempotency is per (user, request_id, template), the same key a check-in's grant
//! uses: a template already recorded with the same result is a replay and answers from
//! the stored item (ALL_OLD on the failed condition, no extra read); with a different
//! result the whole report is refused. Templates not yet recorded are written by the
//! next attempt of the loop.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::item::{key, n, s};
use super::keys::{QUOTA_PREFIX, grant_sk, quota_sk, report_rate_sk, user_pk};
use super::{Limit, MAX_BUDGETED_ATTEMPTS, Store, StoreError, classify_sdk_error, corrupt};
use crate::domain::reminder::ReminderKinds;
use crate::domain::{
    GrantReport, GrantState, GrantStatus, OpenId, QuotaCounters, RequestId, SubscribeResult,
    TemplateId,
};

/// One template's entry in a grant report's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantEntry {
    pub template_id: TemplateId,
    pub request_id: RequestId,
    pub result: SubscribeResult,
    pub status: GrantStatus,
}

/// The outcome of recording a report: one entry per template, in template order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantsRecorded {
    pub grants: Vec<GrantEntry>,
    /// How many templates were newly written (0 for a pure replay).
    pub written: usize,
}

/// The ledger item: a grant when `result` accepts, a recorded refusal otherwise.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct GrantItem {
    pub(super) pk: String,
    pub(super) sk: String,
    kind: String,
    pub(super) template_id: TemplateId,
    pub(super) request_id: RequestId,
    pub(super) result: SubscribeResult,
    /// Present only on grants (accepted results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) state: Option<GrantState>,
    created_at: String,
    version: u64,
    /// Set once the item is final (a refusal at once, a grant when consumed or
    /// invalid): DynamoDB's TTL removes it after the grants retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
}

impl GrantItem {
    /// A new ledger item: `available` when the result grants; a refusal is final from
    /// the start and expires after `retention`.
    pub(super) fn new(
        pk: &str,
        template: &TemplateId,
        request_id: &RequestId,
        result: SubscribeResult,
        now: DateTime<Utc>,
        retention: chrono::Duration,
    ) -> Self {
        Self {
            pk: pk.to_string(),
            sk: grant_sk(template, request_id),
            kind: "grant".into(),
            template_id: template.clone(),
            request_id: request_id.clone(),
            result,
            state: result.grants().then_some(GrantState::Available),
            created_at: rfc3339(now),
            version: 0,
            expires_at: (!result.grants()).then(|| (now + retention).timestamp()),
        }
    }

    fn entry(&self) -> GrantEntry {
        GrantEntry {
            template_id: self.template_id.clone(),
            request_id: self.request_id.clone(),
            result: self.result,
            status: self.state.into(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct QuotaItem {
    template_id: TemplateId,
    #[serde(flatten)]
    counters: QuotaCounters,
}

pub(super) fn rfc3339(now: DateTime<Utc>) -> String {
    now.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Store {
    /// Records a grant report for `openid` (see the module docs for the protocol).
    pub async fn record_grants(
        &self,
        openid: &OpenId,
        report: &GrantReport,
        kinds: &ReminderKinds,
        now: DateTime<Utc>,
    ) -> Result<GrantsRecorded, StoreError> {
        let pk = user_pk(openid);
        let mut pending: BTreeMap<TemplateId, SubscribeResult> = report.results.clone();
        let mut entries: BTreeMap<TemplateId, GrantEntry> = BTreeMap::new();
        let mut written = 0;
        let mut attempt = 0;
        let started = tokio::time::Instant::now();
        while !pending.is_empty() {
            attempt += 1;
            if attempt > MAX_BUDGETED_ATTEMPTS || started.elapsed() > self.limits.write_budget {
                return Err(StoreError::Unavailable(
                    "grant report contended past the retry limit".into(),
                ));
            }
            let mut items = Vec::with_capacity(pending.len() * 2 + 1);
            // Which template each transaction index's ledger Put belongs to.
            let mut ledger_index: HashMap<usize, TemplateId> = HashMap::new();
            // Where the counter updates are (their condition is the open-grant cap).
            let mut quota_index: Vec<usize> = Vec::new();
            for (template, result) in &pending {
                let item = GrantItem::new(
                    &pk,
                    template,
                    &report.request_id,
                    *result,
                    now,
                    self.limits.retention.grants,
                );
                ledger_index.insert(items.len(), template.clone());
                items.push(
                    self.put_new(serde_dynamo::to_item(&item).map_err(|e| corrupt("grant", e))?)?,
                );
                if let Some(update) = quota_update_item(
                    &self.table,
                    &pk,
                    template,
                    &report.request_id,
                    *result,
                    now,
                    &self.limits,
                )? {
                    quota_index.push(items.len());
                    items.push(update);
                }
            }
            // The plans of the kinds that use a template recorded now move in the same
            // transaction, conditional on the version read: only a report's first
            // application moves a plan, never a replay (I3).
            let plan_writes = self.report_plans(&pk, &pending, kinds, now).await?;
            let plan_index = items.len()..items.len() + plan_writes.len();
            items.extend(plan_writes);
            // Last, so a replay's ledger conditions are the ones an emulator reports.
            let rate_index = items.len();
            let (rate, retry_after) = self.report_rate(&pk, now)?;
            items.push(rate);
            if self.limits.audit {
                items = super::history::with_history(
                    items,
                    &self.table,
                    now,
                    self.limits.retention.grants,
                )?;
            }
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .client_request_token(super::request_token())
                .send()
                .await;
            match sent {
                Ok(_) => {
                    for (template, result) in std::mem::take(&mut pending) {
                        written += 1;
                        entries.insert(
                            template.clone(),
                            GrantEntry {
                                template_id: template,
                                request_id: report.request_id.clone(),
                                result,
                                status: result.grants().then_some(GrantState::Available).into(),
                            },
                        );
                    }
                }
                Err(err) => {
                    let service = match err {
                        aws_sdk_dynamodb::error::SdkError::ServiceError(ref s) => Some(s.err()),
                        _ => None,
                    };
                    let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
                        service
                    else {
                        let error = classify_sdk_error(err, transact_unavailable);
                        if matches!(error, StoreError::Unavailable(_)) {
                            super::contended_pause("grant report", attempt).await;
                            continue;
                        }
                        return Err(error);
                    };
                    let mut replays = 0;
                    let mut limited = None;
                    for (index, reason) in cancelled.cancellation_reasons().iter().enumerate() {
                        if reason.code() != Some("ConditionalCheckFailed") {
                            continue;
                        }
                        if index == rate_index {
                            limited = Some(Limit::Rate { retry_after });
                            continue;
                        }
                        if quota_index.contains(&index) {
                            limited = limited.or(Some(Limit::OpenGrants));
                            continue;
                        }
                        if plan_index.contains(&index) {
                            // A plan moved since it was read: read it again.
                            continue;
                        }
                        let Some(template) = ledger_index.get(&index) else {
                            return Err(StoreError::Corrupt(format!(
                                "unexpected condition failure at transaction index {index}"
                            )));
                        };
                        let old = reason.item().ok_or_else(|| {
                            StoreError::Corrupt("condition failure without the old item".into())
                        })?;
                        let old: GrantItem = serde_dynamo::from_item(old.clone())
                            .map_err(|e| corrupt("grant", e))?;
                        if Some(&old.result) != pending.get(template) {
                            return Err(StoreError::IdempotencyConflict(format!(
                                "request_id {} already recorded {} for template {template}",
                                report.request_id,
                                old.result.as_str()
                            )));
                        }
                        pending.remove(template);
                        // Written at this call's own instant: an earlier attempt of this
                        // call committed with its answer lost, so it was written now.
                        if old.created_at == rfc3339(now) {
                            written += 1;
                        }
                        entries.insert(template.clone(), old.entry());
                        replays += 1;
                    }
                    match limited {
                        // Replays answer as first recorded; the rest goes round again.
                        _ if replays > 0 => {}
                        Some(limit) => return Err(StoreError::Limited(limit)),
                        // Cancelled by a conflicting transaction or a throttle: back off.
                        None => super::contended_pause("grant report", attempt).await,
                    }
                }
            }
        }
        // The report landed; confirming its grants by popup events already recorded
        // is extra (a failure is logged; the popup's own pairing still comes).
        for (template, result) in &report.results {
            if result.grants() && self.limits.push_events {
                self.pair_taps_logged(openid, template, now).await;
            }
        }
        Ok(GrantsRecorded {
            grants: entries.into_values().collect(),
            written,
        })
    }

    /// The stored quota counters of `openid`, by template (one strongly consistent query).
    pub async fn quota_counters(
        &self,
        openid: &OpenId,
    ) -> Result<BTreeMap<TemplateId, QuotaCounters>, StoreError> {
        let mut counters = BTreeMap::new();
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", AttributeValue::S(user_pk(openid)))
            .expression_attribute_values(":prefix", AttributeValue::S(QUOTA_PREFIX.into()))
            .into_paginator()
            .items()
            .send();
        while let Some(item) = pages.next().await {
            let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
            let quota: QuotaItem =
                serde_dynamo::from_item(item).map_err(|e| corrupt("quota", e))?;
            counters.insert(quota.template_id, quota.counters);
        }
        Ok(counters)
    }

    /// `ADD 1` on the user's report counter of this minute, conditional on it being
    /// under the limit (part of the report's transaction, so only reports that land
    /// count), and the seconds until the next minute.
    fn report_rate(
        &self,
        pk: &str,
        now: DateTime<Utc>,
    ) -> Result<(TransactWriteItem, u64), StoreError> {
        let minute = now.timestamp().div_euclid(60);
        let next = (minute + 1) * 60;
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &report_rate_sk(minute))))
            .update_expression("SET kind = :kind, expires_at = :expires ADD #n :one")
            .condition_expression("attribute_not_exists(#n) OR #n < :max")
            .expression_attribute_names("#n", "reports")
            .expression_attribute_values(":kind", s("rate"))
            .expression_attribute_values(":expires", n(next + 60))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":max", n(self.limits.reports_per_minute))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        let retry_after = u64::try_from(next - now.timestamp()).unwrap_or(60).max(1);
        Ok((
            TransactWriteItem::builder().update(update).build(),
            retry_after,
        ))
    }

    pub(super) fn put_new(
        &self,
        item: HashMap<String, AttributeValue>,
    ) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

/// The counter change a ledger item brings: `ADD accepted 1, available 1` for a grant
/// (and its request id to the open-grant set, see [`OPEN_AVAILABLE`]) while fewer
/// than `cap` are available, the refusal recorded for reject/ban, nothing for filter.
pub(super) fn quota_update_item(
    table: &str,
    pk: &str,
    template: &TemplateId,
    request_id: &RequestId,
    result: SubscribeResult,
    now: DateTime<Utc>,
    limits: &crate::config::Limits,
) -> Result<Option<TransactWriteItem>, StoreError> {
    if !(result.grants() || result.refuses()) {
        return Ok(None);
    }
    let update = Update::builder()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.to_string()))
        .key("sk", AttributeValue::S(quota_sk(template)))
        .expression_attribute_values(":t", AttributeValue::S(template.to_string()))
        .expression_attribute_values(":now", AttributeValue::S(rfc3339(now)))
        .expression_attribute_values(":kind", AttributeValue::S("quota".into()));
    let update = if result.grants() {
        let update = if limits.push_events {
            // The tap's mark, for a popup accept of it to confirm (store::taps).
            let tap = crate::domain::reconcile::Mark::new(now, request_id.as_str()).encode();
            update
                .update_expression(
                    "SET template_id = :t, kind = :kind, updated_at = :now \
                     ADD accepted :one, available :one, #open :id, #taps :tap",
                )
                .expression_attribute_names("#taps", super::taps::TAPS_REPORTED)
                .expression_attribute_values(":tap", AttributeValue::Ss(vec![tap]))
        } else {
            update.update_expression(
                "SET template_id = :t, kind = :kind, updated_at = :now \
                 ADD accepted :one, available :one, #open :id",
            )
        };
        update
            .condition_expression("attribute_not_exists(available) OR available < :cap")
            .expression_attribute_names("#open", OPEN_AVAILABLE)
            .expression_attribute_values(
                ":cap",
                AttributeValue::N(limits.max_open_grants.to_string()),
            )
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":id", AttributeValue::Ss(vec![request_id.to_string()]))
    } else {
        update
            .update_expression(
                "SET template_id = :t, kind = :kind, updated_at = :now, last_refusal = :r, last_refusal_at = :now",
            )
            .expression_attribute_values(":r", AttributeValue::S(result.as_str().into()))
    };
    let update = update.build().map_err(|e| StoreError::Sdk(Box::new(e)))?;
    Ok(Some(TransactWriteItem::builder().update(update).build()))
}

/// The quota item's set of the request ids of its `available` grants: a claim picks
/// one from it and invalidation reads it, so neither touches the grant history.
pub(super) const OPEN_AVAILABLE: &str = "open_available";
/// The quota item's set of the request ids of its `reserved` grants.
pub(super) const OPEN_RESERVED: &str = "open_reserved";
/// When the template's grants were last voided on purpose (a disable, a refusal,
/// 43101), epoch ms: a grant the sweep voided for a send claimed before that is never
/// given back by the send's late answer.
pub(super) const VOIDED_AT: &str = "voided_at";
/// WeChat's time (`CreateTime`, epoch seconds) of the newest popup or change event
/// applied for the template: an event older than it changes nothing (WeChat's order,
/// not arrival order, decides).
pub(super) const CHOICE_AT: &str = "choice_at";
/// The quota item's marks of sends whose outcome is unknown, for WeChat's sent event
/// to settle ([`Mark`](crate::domain::reconcile::Mark): claim time, delivery id).
pub(super) const OPEN_UNKNOWN: &str = "open_unknown";
/// The quota item's marks of sends recorded `sent` whose sent event has not come yet
/// (record time, msgid), so that event is never taken for an unknown send's.
pub(super) const SENT_MARKS: &str = "sent_marks";
/// The quota item's marks of sends in flight (claim time, delivery id): a sent event
/// arriving meanwhile may be theirs.
pub(super) const INFLIGHT: &str = "inflight";
/// The quota item's sent events kept for when a send in flight settles (create time,
/// `<msgid>:<errcode>`).
pub(super) const PENDING_EVENTS: &str = "pending_events";

/// Transaction errors that mean "try again later".
pub(super) fn transact_unavailable(err: &TransactWriteItemsError) -> bool {
    matches!(
        err,
        TransactWriteItemsError::TransactionInProgressException(_)
            | TransactWriteItemsError::ProvisionedThroughputExceededException(_)
            | TransactWriteItemsError::RequestLimitExceeded(_)
            | TransactWriteItemsError::ThrottlingException(_)
            | TransactWriteItemsError::InternalServerError(_)
    )
}
