//! Grant reports and per-template quota counters.
//!
//! A report writes, in one transaction, one ledger item per template it names — keyed
//! (user, template, request_id) and conditional on not existing — and, per accepted
//! template, `ADD accepted 1, available 1` on that template's counters, whose item also
//! lists the request ids of the open grants (`items::quota::OPEN_AVAILABLE`). So a report is
//! applied whole or not at all, and neither reading quotas nor claiming or voiding
//! grants ever reads the grant history.
//!
//! Load → decide → commit: [`ReportProgress`] (the domain) says what each template
//! writes and what a cancelled attempt's failed conditions mean (replay, conflict,
//! limit, race); this module builds the items, reads the failures (a replay's stored
//! item comes back as ALL_OLD, no extra read) and commits through the transaction
//! engine, under the store's one retry loop.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::domain::consent::standing::Standing;
use crate::domain::grants::report::GrantEntry;
use crate::domain::grants::report::{
    AfterCancel, GrantsRecorded, ReportFailure, ReportProgress, ReportRefused,
};
use crate::domain::{GrantReport, OpenId, QuotaCounters, TemplateId};
use crate::store::error::{Limit, StoreError, corrupt};
use crate::store::handle::Store;
use crate::store::items::grant::GrantItem;
use crate::store::items::query::{Range, partition};
use crate::store::items::rate::{Counter, rate_key};
use crate::store::items::{parse, rfc3339, s};
use crate::store::keys::{QUOTA_PREFIX, grant_sk, user_pk};
use crate::store::retry::{Attempt, retry_carrying};
use crate::store::tx::{Outcome, Parts};

#[derive(Debug, Deserialize)]
struct QuotaItem {
    template_id: TemplateId,
    #[serde(flatten)]
    counters: QuotaCounters,
    #[serde(default)]
    standing: Option<String>,
    /// Pushes waiting for a grant of the template (a string set).
    #[serde(default)]
    waiting: Vec<String>,
}

/// The error a refused report answers.
fn refused_error(refused: ReportRefused, report: &GrantReport, retry_after: u64) -> StoreError {
    match refused {
        ReportRefused::Conflict { template, recorded } => StoreError::IdempotencyConflict(format!(
            "request_id {} already recorded {} for template {template}",
            report.request_id,
            recorded.as_str()
        )),
        ReportRefused::Rate => StoreError::Limited(Limit::Rate { retry_after }),
        ReportRefused::OpenGrantCap => StoreError::Limited(Limit::OpenGrants),
    }
}

/// What of a report is recorded already, as [`Store::admit_report`] read it.
#[derive(Debug, Clone, Default)]
pub struct Admitted {
    recorded: Vec<GrantEntry>,
}

impl Admitted {
    /// Every template of `report` is recorded: a replay.
    pub fn is_replay(&self, report: &GrantReport) -> bool {
        self.recorded.len() == report.results.len()
    }

    /// `report`'s progress with what was found recorded taken as replays (the
    /// domain's rule: a template recorded with another result refuses the report).
    fn progress(&self, report: &GrantReport) -> Result<ReportProgress, StoreError> {
        let mut progress = ReportProgress::new(report);
        let replays = self
            .recorded
            .iter()
            .map(|entry| ReportFailure::Recorded {
                entry: entry.clone(),
                by_this_call: false,
            })
            .collect();
        // (Only recorded entries: no limit can refuse here, so no Retry-After.)
        progress
            .cancelled(replays)
            .map_err(|refused| refused_error(refused, report, 60))?;
        Ok(progress)
    }
}

/// A user's stored quotas: counters and standing choices, by template.
#[derive(Debug, Clone, Default)]
pub struct StoredQuotas {
    pub counters: BTreeMap<TemplateId, QuotaCounters>,
    pub standings: BTreeMap<TemplateId, Standing>,
    /// The templates some push waits for a grant of.
    pub waiting: std::collections::BTreeSet<TemplateId>,
}

/// The parts of a report's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Ledger,
    Counters,
    Plan,
    Rate,
}

impl Store {
    /// Records a grant report for `openid` (see the module docs for the protocol).
    /// `admitted`: what [`Store::admit_report`] found recorded, answered as such and
    /// not written again (None: nothing was read; the transaction finds replays).
    pub async fn record_grants(
        &self,
        openid: &OpenId,
        report: &GrantReport,
        admitted: Option<&Admitted>,
        now: DateTime<Utc>,
    ) -> Result<GrantsRecorded, StoreError> {
        let pk = user_pk(openid);
        let progress = match admitted {
            Some(admitted) => admitted.progress(report)?,
            None => ReportProgress::new(report),
        };
        if report.results.is_empty() {
            // Nothing to record: no transaction, so no report counted either.
            return Ok(progress.recorded());
        }
        if progress.is_done() {
            // A replay, answered from the admission read: no transaction. Its pairing
            // with popup events is still tried (the first try may have been cut off
            // after the commit), as pairing is idempotent.
            self.pair_report_taps(openid, report, now).await;
            return Ok(progress.recorded());
        }
        let pk = &pk;
        let (landed, progress) = retry_carrying(
            "grant report",
            self.limits.write_budget,
            progress,
            |mut progress| async move {
                let decided = async {
                    // Replays taken off an attempt let the rest run at once (Again): at most one
                    // round per template.
                    let (writes, pending) = (progress.writes(), progress.pending().clone());
                    let mut parts = Parts::new();
                    for write in &writes {
                        // (A report's handler reads the waiting pushes after it lands.)
                        let (ledger, counters) =
                            self.recorded_answer(pk, write, &report.request_id, now, false)?;
                        parts.add(Part::Ledger, ledger);
                        if let Some(update) = counters {
                            parts.add(Part::Counters, update);
                        }
                    }
                    // The plans of the kinds that use a template recorded now move in the
                    // same transaction, conditional on the version read: only a report's
                    // first application moves a plan, never a replay (I3).
                    for plan in self.report_plans(pk, &pending, now).await? {
                        parts.add(Part::Plan, plan);
                    }
                    // Last, so a replay's ledger conditions are the ones an emulator reports.
                    let (rate, retry_after) = self.report_rate(pk, 1, now)?;
                    parts.add(Part::Rate, rate);
                    let failed = match self.transact_parts(&parts).await? {
                        Outcome::Committed => {
                            progress.committed();
                            return Ok(Attempt::Done(()));
                        }
                        Outcome::Contended | Outcome::Conflict => return Ok(Attempt::Retry),
                        Outcome::Cancelled(failed) => failed,
                    };
                    // The audit trail's entry has no condition a report can fail: one that
                    // did is not a race to retry.
                    if failed.audit() {
                        return Err(StoreError::Corrupt(
                            "a grant report's transaction failed a condition it did not set".into(),
                        ));
                    }
                    let mut failures = Vec::new();
                    for (part, old) in failed.iter() {
                        failures.push(match part {
                            Part::Rate => ReportFailure::Rate,
                            Part::Counters => ReportFailure::OpenGrantCap,
                            Part::Plan => ReportFailure::PlanMoved,
                            Part::Ledger => {
                                let old: GrantItem =
                                    serde_dynamo::from_item(old.cloned().ok_or_else(|| {
                                        StoreError::Corrupt(
                                            "condition failure without the old item".into(),
                                        )
                                    })?)
                                    .map_err(|e| corrupt("grant", e))?;
                                ReportFailure::Recorded {
                                    // Written at this call's own instant: an earlier attempt
                                    // of this call committed with its answer lost.
                                    by_this_call: old.created_at == rfc3339(now),
                                    entry: old.entry(),
                                }
                            }
                        });
                    }
                    let after = progress
                        .cancelled(failures)
                        .map_err(|refused| refused_error(refused, report, retry_after))?;
                    Ok(match after {
                        AfterCancel::Continue if progress.is_done() => Attempt::Done(()),
                        AfterCancel::Continue => Attempt::Again,
                        AfterCancel::Retry => Attempt::Retry,
                    })
                }
                .await;
                (decided, progress)
            },
        )
        .await;
        landed?;
        self.pair_report_taps(openid, report, now).await;
        Ok(progress.recorded())
    }

    /// The report landed; confirming its grants by popup events already recorded is
    /// extra (a failure is logged; the popup's own pairing still comes).
    async fn pair_report_taps(&self, openid: &OpenId, report: &GrantReport, now: DateTime<Utc>) {
        for (template, result) in &report.results {
            if result.grants() && self.limits.push_events {
                self.pair_taps_logged(openid, template, now).await;
            }
        }
    }

    /// Reads what of `report` is recorded already, with the user's counters of the
    /// minute, in one strongly consistent round trip; a report not wholly recorded is
    /// refused here, before anything is written, once the minute's
    /// `REPORTS_PER_MINUTE` are used up (a replay never is). [`Store::record_grants`]
    /// then writes only what is not recorded: a replay writes nothing. A standing
    /// choice the report carries is applied only when it is not a replay
    /// ([`Store::stand`]).
    pub async fn admit_report(
        &self,
        openid: &OpenId,
        report: &GrantReport,
        now: DateTime<Utc>,
    ) -> Result<Admitted, StoreError> {
        let mut sks: Vec<String> = report
            .results
            .keys()
            .map(|t| grant_sk(t, &report.request_id))
            .collect();
        let rate = rate_key(now);
        sks.push(rate.clone());
        let mut found = self.read_items(&user_pk(openid), &sks).await?;
        let admitted = Admitted {
            recorded: sks
                .iter()
                .filter(|sk| **sk != rate)
                .filter_map(|sk| found.remove(sk))
                .map(|item| {
                    serde_dynamo::from_item::<_, GrantItem>(item)
                        .map(|g| g.entry())
                        .map_err(|e| corrupt("grant", e))
                })
                .collect::<Result<_, _>>()?,
        };
        // A template recorded with another result refuses the whole report, before
        // anything of it (its standing choice included) is written.
        admitted.progress(report)?;
        if !admitted.is_replay(report) {
            self.rate_admits(Counter::Reports, found.get(&rate), now)?;
        }
        Ok(admitted)
    }

    /// The stored quota counters and standing choices of `openid`, by template (one
    /// strongly consistent query).
    pub async fn quota_counters(&self, openid: &OpenId) -> Result<StoredQuotas, StoreError> {
        let mut stored = StoredQuotas::default();
        let mut pages = partition("pk", s(user_pk(openid)))
            .range("sk", Range::Prefix(QUOTA_PREFIX.into()))
            .on(self.table_query())
            .into_paginator()
            .items()
            .send();
        while let Some(item) = pages.next().await {
            let item = item?;
            let quota: QuotaItem = parse("quota", item)?;
            if let Some(name) = &quota.standing {
                let standing = Standing::parse(name)
                    .ok_or_else(|| StoreError::Corrupt(format!("bad standing {name:?}")))?;
                stored.standings.insert(quota.template_id.clone(), standing);
            }
            if !quota.waiting.is_empty() {
                stored.waiting.insert(quota.template_id.clone());
            }
            stored.counters.insert(quota.template_id, quota.counters);
        }
        Ok(stored)
    }
}
