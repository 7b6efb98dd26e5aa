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
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::reminders::ReminderKinds;
use crate::store::items::grant::GrantItem;
use crate::store::items::quota::quota_update_item;
use crate::store::items::{key, n, rfc3339, s};
use crate::store::keys::{QUOTA_PREFIX, report_rate_sk, user_pk};
use crate::store::tx::{is_condition_failed, transact_unavailable};
use crate::store::{Limit, MAX_BUDGETED_ATTEMPTS, Store, StoreError, classify_sdk_error, corrupt};

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

#[derive(Debug, Deserialize)]
struct QuotaItem {
    template_id: TemplateId,
    #[serde(flatten)]
    counters: QuotaCounters,
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
                items = crate::store::audit::with_history(
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
                .client_request_token(crate::store::request_token())
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
                            crate::store::contended_pause("grant report", attempt).await;
                            continue;
                        }
                        return Err(error);
                    };
                    let mut replays = 0;
                    let mut limited = None;
                    for (index, reason) in cancelled.cancellation_reasons().iter().enumerate() {
                        if !reason.code().is_some_and(is_condition_failed) {
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
                        None => crate::store::contended_pause("grant report", attempt).await,
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
}
