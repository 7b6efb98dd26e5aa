//! The open grants of a template, as its quota item lists them: voiding them (a
//! disable, a refusal, 43101) and repairing the lists against the ledger.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::grants::open::{OpenGrantIds, SetFix, unlist_refused};
use crate::domain::{GrantState, QuotaCounters, TemplateId};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, check, update};
use crate::store::items::expr::{all, is_in};
use crate::store::items::grant::{GrantItem, grant_in};
use crate::store::items::query::{Range, partition};
use crate::store::items::quota::{OPEN_AVAILABLE, OPEN_RESERVED, OpenGrants, count_is};
use crate::store::items::{is_new, key, n, parse, rfc3339, s};
use crate::store::keys::{GRANT_PREFIX, grant_sk, quota_sk, request_id_of_grant};
use crate::store::retry::{Attempt, retry_contended};
use crate::store::tx::{Outcome, Parts, TxOutcome};

/// Most grants one transaction invalidates (100 items per transaction, less the plan
/// and its count of the minute, the counters and the history entry).
const INVALIDATE_CHUNK: usize = 96;

/// The most grants one repair transaction checks: with the quota item's update, a
/// transaction's 100 items.
pub(crate) const REPAIR_CHUNK: usize = 99;

/// The parts of a void's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Void {
    /// The grant `i` of the chunk voided, on its state as listed.
    Grant(usize),
    /// The caller's first writes, or the quota counters.
    Other,
}

impl Store {
    /// `pk`'s grants of `template` in one of `states` (one or two), read strongly
    /// consistent, page by page.
    pub(crate) async fn grants_in(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        states: &[GrantState],
    ) -> Result<Vec<GrantItem>, StoreError> {
        let first = states
            .first()
            .copied()
            .unwrap_or(GrantState::Available)
            .as_str();
        let second = states
            .get(1)
            .copied()
            .map(GrantState::as_str)
            .unwrap_or(first);
        let mut pages = partition("pk", s(pk))
            .range("sk", Range::Prefix(format!("{GRANT_PREFIX}{template}#")))
            .filter(is_in("state", vec![s(first), s(second)]))
            .on(self.table_query())
            .into_paginator()
            .items()
            .send();
        let mut grants = Vec::new();
        while let Some(item) = pages.next().await {
            grants.push(parse("grant", item?)?);
        }
        Ok(grants)
    }

    /// Voids the template's grants recorded before `recorded_before` (reserved ones
    /// too with `include_reserved`), read again until a void lands whole: `what` names
    /// the cause in the retry's log.
    pub(crate) async fn void_recorded_before(
        &self,
        what: &'static str,
        pk: &str,
        template: &TemplateId,
        include_reserved: bool,
        recorded_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        retry_contended(what, self.limits.write_budget, || async move {
            let before = Some(recorded_before);
            let done = self
                .invalidate_grants(pk, template, Vec::new(), include_reserved, before, now)
                .await?;
            Ok(if done {
                Attempt::Done(())
            } else {
                Attempt::Retry
            })
        })
        .await
    }

    /// Invalidates every available or reserved grant of the kind's template, in
    /// transactions of at most [`INVALIDATE_CHUNK`] grants, the first also writing
    /// `first` (the plan, and its count of the minute: at most two items), so a refusal
    /// by the minute's limit or the plan's version writes nothing, and the plan is off
    /// before any grant is voided (no reminder is claimed meanwhile). A void stopped
    /// after its first transaction leaves the plan off beside grants still open: the
    /// retry (or the user's next turn-off) finds the plan unchanged and voids them
    /// without writing or counting it again (`SettingsDecision::writes_plan`). With
    /// `reported_before`, only grants recorded before that instant: WeChat's 43101 answered a send claimed then, and says nothing of a
    /// grant the user gave while it was in flight. Returns false if anything changed
    /// underneath (retry).
    pub(crate) async fn invalidate_grants(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        first: Vec<TransactWriteItem>,
        include_reserved: bool,
        reported_before: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut open: Vec<(String, GrantState)> = Vec::new();
        // "Open" grants: available, and reserved too when a plan is disabled. The quota
        // item lists them; only grants recorded before it did need the ledger query.
        let quota_key = quota_sk(template);
        // The counters as read: with `first` (a disable), the first transaction lands
        // only while they are unchanged — a grant that arrived since (or one a late
        // answer gave back) is ordered before the disable and is voided by its retry.
        let mut read_counters = QuotaCounters::default();
        let listed = match self
            .read_items(pk, std::slice::from_ref(&quota_key))
            .await?
            .remove(&quota_key)
        {
            Some(quota) => {
                let counters = parse::<QuotaCounters>("quota", quota.clone())?;
                read_counters = counters;
                // (An id in both sets is wrong, and would be voided twice in one
                // transaction, which DynamoDB refuses: the ledger instead.)
                Some(OpenGrants::of(&quota).ids)
                    .filter(|sets| sets.complete(&counters) && sets.disjoint())
            }
            None => Some(OpenGrantIds::default()),
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
            let states: &[GrantState] = if include_reserved {
                &[GrantState::Available, GrantState::Reserved]
            } else {
                &[GrantState::Available]
            };
            for grant in self.grants_in(pk, template, states).await? {
                if let Some(state) = grant.state {
                    open.push((grant.sk, state));
                }
            }
        }
        if let Some(bound) = reported_before {
            open = self.recorded_before(pk, open, bound).await?;
        }
        // A disable (it writes the plan) with no bound: see `accepted`.
        let guarded = !first.is_empty() && reported_before.is_none();
        let mut first = first;
        // The first transaction stamps the quota item `voided_at`, even with nothing to
        // void: a send in flight whose grant the sweep already voided must not get it
        // back by a late answer (see `VOIDED_AT`).
        let mut stamp = true;
        let chunks: Vec<_> = open.chunks(INVALIDATE_CHUNK).map(<[_]>::to_vec).collect();
        for chunk in chunks.into_iter().chain(std::iter::once(Vec::new())) {
            let mut items = Parts::new();
            if !first.is_empty() {
                for item in std::mem::take(&mut first) {
                    items.add(Void::Other, item);
                }
            } else if chunk.is_empty() && !stamp {
                break;
            }
            let (mut available, mut reserved) = (0i64, 0i64);
            let (mut available_ids, mut reserved_ids) = (Vec::new(), Vec::new());
            for (i, (sk, state)) in chunk.iter().enumerate() {
                let id = request_id_of_grant(sk).map(|r| r.to_string());
                match state {
                    GrantState::Available => {
                        available += 1;
                        available_ids.extend(id);
                    }
                    GrantState::Reserved => {
                        reserved += 1;
                        reserved_ids.extend(id);
                    }
                    GrantState::Consumed | GrantState::Invalid => continue,
                }
                let voided = change()
                    .set("state", s(GrantState::Invalid.as_str()))
                    .set("updated_at", s(rfc3339(now)))
                    .plus("version", 1)
                    .set(
                        "expires_at",
                        n((now + self.limits.retention.grants).timestamp()),
                    );
                let voided = update(&self.table, key(pk, sk), voided)
                    .when(grant_in(*state))
                    .part()?;
                items.add(Void::Grant(i), voided);
            }
            if available + reserved > 0 || stamp {
                // The voided grants leave the quota item's open-grant sets too.
                let mut counters = change().set("updated_at", s(rfc3339(now)));
                let mut guard = None;
                if stamp && guarded {
                    let c = &read_counters;
                    guard = Some(all([
                        count_is("accepted", c.accepted),
                        count_is("available", c.available),
                        count_is("reserved", c.reserved),
                    ]));
                }
                if std::mem::take(&mut stamp) {
                    // (Named like every quota item, should this one create it: a user
                    // who never reported the template still reads as a quota.)
                    counters = counters
                        .set(
                            crate::store::items::quota::VOIDED_AT,
                            n(now.timestamp_millis()),
                        )
                        .set("template_id", s(template.as_str()))
                        .set("kind", s("quota"));
                }
                counters = counters
                    .add("available", n(-available))
                    .add("reserved", n(-reserved))
                    .add("invalid", n(available + reserved));
                // Off both sets: a voided grant is in neither state, and an id wrongly
                // in the other set (which made the sets untrusted) goes with it.
                let gone: Vec<String> = available_ids.into_iter().chain(reserved_ids).collect();
                if !gone.is_empty() {
                    counters = counters
                        .delete(OPEN_AVAILABLE, AttributeValue::Ss(gone.clone()))
                        .delete(OPEN_RESERVED, AttributeValue::Ss(gone));
                }
                let counters = update(&self.table, key(pk, &quota_sk(template)), counters);
                let counters = match guard {
                    Some(guard) => counters.when(guard),
                    None => counters,
                };
                items.add(Void::Other, counters.write()?);
            }
            match self.transact_parts(&items).await? {
                Outcome::Committed => {}
                Outcome::Cancelled(failed) => {
                    if trusted {
                        // The grants (each in the state it was listed in) whose void
                        // failed.
                        let refused: Vec<(String, GrantState)> = failed
                            .roles()
                            .filter_map(|part| match part {
                                Void::Grant(i) => chunk.get(i).cloned(),
                                Void::Other => None,
                            })
                            .collect();
                        self.unlist_if_not(pk, template, refused).await;
                    }
                    return Ok(false);
                }
                Outcome::Contended | Outcome::Conflict => return Ok(false),
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
    pub(crate) async fn unlist_if_not(
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
                .map(|quota| OpenGrants::of(&quota).ids)
                .unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "the open-grant list was not checked this time");
                return;
            }
        };
        let fixes = unlist_refused(
            &listed,
            refused
                .into_iter()
                .filter_map(|(sk, state)| Some((request_id_of_grant(&sk)?, state))),
        );
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
    pub(crate) async fn recorded_before(
        &self,
        pk: &str,
        grants: Vec<(String, GrantState)>,
        bound: DateTime<Utc>,
    ) -> Result<Vec<(String, GrantState)>, StoreError> {
        let sks: Vec<String> = grants.iter().map(|(sk, _)| sk.clone()).collect();
        let items = self.read_items(pk, &sks).await?;
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

    /// One repair transaction: a check per grant, and the quota item's set update.
    pub(in crate::store) fn set_fix_writes(
        &self,
        pk: &str,
        template: &TemplateId,
        fixes: &[SetFix],
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let mut writes = Vec::with_capacity(fixes.len() + 1);
        let add = fixes.first().is_some_and(|fix| fix.add);
        let mut sets = change();
        for (name, state) in [
            (OPEN_AVAILABLE, GrantState::Available),
            (OPEN_RESERVED, GrantState::Reserved),
        ] {
            let members: Vec<String> = fixes
                .iter()
                .filter(|fix| fix.state == state)
                .map(|fix| fix.request.to_string())
                .collect();
            if members.is_empty() {
                continue;
            }
            sets = if add {
                sets.add(name, AttributeValue::Ss(members))
            } else {
                sets.delete(name, AttributeValue::Ss(members))
            };
        }
        for fix in fixes {
            let held = if fix.add {
                grant_in(fix.state)
            } else {
                is_new().or(!grant_in(fix.state))
            };
            writes.push(
                check(
                    &self.table,
                    key(pk, &grant_sk(template, &fix.request)),
                    held,
                )
                .write()?,
            );
        }
        writes.push(update(&self.table, key(pk, &quota_sk(template)), sets).write()?);
        Ok(writes)
    }
}
