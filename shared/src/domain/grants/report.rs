//! A grant report, decided: what recording each template's result writes, and what a
//! cancelled transaction's failed conditions mean for the report (replay, conflict,
//! limit, or a race to run again). The store loads and commits; this decides.
//!
//! Idempotency is per (user, request_id, template): a template already recorded with
//! the same result is a replay and answers as first recorded; with a different result
//! the whole report is refused. Templates not yet recorded go round again.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::domain::grants::{GrantReport, GrantState, GrantStatus, SubscribeResult};
use crate::domain::ids::{RequestId, TemplateId};

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

/// What recording one result does to the template's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterChange {
    /// `accepted + 1, available + 1`, only while fewer than the cap are available.
    Grant,
    /// The refusal remembered (`last_refusal`), no count.
    Refusal,
    /// Nothing (a `filter`: WeChat never showed the popup).
    None,
}

impl CounterChange {
    pub fn of(result: SubscribeResult) -> Self {
        if result.grants() {
            Self::Grant
        } else if result.refuses() {
            Self::Refusal
        } else {
            Self::None
        }
    }
}

/// One template's write in a report's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateWrite {
    pub template: TemplateId,
    pub result: SubscribeResult,
    /// The new ledger item's state: `available` for a grant, none for a refusal.
    pub state: Option<GrantState>,
    pub counters: CounterChange,
}

impl TemplateWrite {
    /// What recording `result` for `template` writes.
    pub fn of(template: &TemplateId, result: SubscribeResult) -> Self {
        Self {
            template: template.clone(),
            result,
            state: result.grants().then_some(GrantState::Available),
            counters: CounterChange::of(result),
        }
    }
}

/// Why one item of a report's transaction failed its condition, as the store read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportFailure {
    /// The user's report counter of this minute is at the limit.
    Rate,
    /// The template's counters are at the open-grant cap.
    OpenGrantCap,
    /// A plan moved since it was read.
    PlanMoved,
    /// The template is already recorded for this request id.
    Recorded {
        entry: GrantEntry,
        /// Whether it was written at this call's own instant: an earlier attempt of
        /// this call committed with its answer lost.
        by_this_call: bool,
    },
}

/// Why a report is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportRefused {
    /// The request id already recorded another result for the template.
    Conflict {
        template: TemplateId,
        recorded: SubscribeResult,
    },
    /// Over the minute's report limit.
    Rate,
    /// Over the template's open-grant cap.
    OpenGrantCap,
}

/// What the store does after a cancelled transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCancel {
    /// Replays were taken off: run the rest at once (nothing lost a race).
    Continue,
    /// Lost a race (a plan moved, another transaction): read again and retry.
    Retry,
}

/// A report on its way to the ledger: what is still to write and what is answered.
#[derive(Debug, Clone)]
pub struct ReportProgress {
    request_id: RequestId,
    pending: BTreeMap<TemplateId, SubscribeResult>,
    entries: BTreeMap<TemplateId, GrantEntry>,
    written: usize,
}

impl ReportProgress {
    pub fn new(report: &GrantReport) -> Self {
        Self {
            request_id: report.request_id.clone(),
            pending: report.results.clone(),
            entries: BTreeMap::new(),
            written: 0,
        }
    }

    /// The results not yet recorded, by template.
    pub fn pending(&self) -> &BTreeMap<TemplateId, SubscribeResult> {
        &self.pending
    }

    pub fn is_done(&self) -> bool {
        self.pending.is_empty()
    }

    /// The writes of the next attempt: one per template still to record.
    pub fn writes(&self) -> Vec<TemplateWrite> {
        self.pending
            .iter()
            .map(|(template, result)| TemplateWrite::of(template, *result))
            .collect()
    }

    /// The attempt committed: every pending template is recorded now.
    pub fn committed(&mut self) {
        for (template, result) in std::mem::take(&mut self.pending) {
            self.written += 1;
            self.entries.insert(
                template.clone(),
                GrantEntry {
                    template_id: template,
                    request_id: self.request_id.clone(),
                    result,
                    status: result.grants().then_some(GrantState::Available).into(),
                },
            );
        }
    }

    /// The attempt was cancelled with these failed conditions: replays answer as first
    /// recorded and leave the pending set; a recorded result that differs refuses the
    /// report; with no replay, a limit refuses it (the minute's rate before the cap);
    /// otherwise the attempt lost a race.
    pub fn cancelled(
        &mut self,
        failures: Vec<ReportFailure>,
    ) -> Result<AfterCancel, ReportRefused> {
        let mut replays = 0;
        let mut limit = None;
        for failure in failures {
            match failure {
                ReportFailure::Rate => limit = Some(ReportRefused::Rate),
                ReportFailure::OpenGrantCap => {
                    limit = limit.or(Some(ReportRefused::OpenGrantCap));
                }
                ReportFailure::PlanMoved => {}
                ReportFailure::Recorded {
                    entry,
                    by_this_call,
                } => {
                    let template = entry.template_id.clone();
                    if self.pending.get(&template) != Some(&entry.result) {
                        return Err(ReportRefused::Conflict {
                            template,
                            recorded: entry.result,
                        });
                    }
                    self.pending.remove(&template);
                    if by_this_call {
                        self.written += 1;
                    }
                    self.entries.insert(template, entry);
                    replays += 1;
                }
            }
        }
        match limit {
            _ if replays > 0 => Ok(AfterCancel::Continue),
            Some(refused) => Err(refused),
            None => Ok(AfterCancel::Retry),
        }
    }

    /// The answer, once [`is_done`](Self::is_done).
    pub fn recorded(self) -> GrantsRecorded {
        GrantsRecorded {
            grants: self.entries.into_values().collect(),
            written: self.written,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: &str) -> TemplateId {
        TemplateId::parse(id).expect("valid template id")
    }

    fn report(results: &[(&str, SubscribeResult)]) -> GrantReport {
        GrantReport {
            request_id: RequestId::parse("r1").expect("valid request id"),
            results: results.iter().map(|(id, r)| (t(id), *r)).collect(),
        }
    }

    fn recorded(id: &str, result: SubscribeResult, by_this_call: bool) -> ReportFailure {
        ReportFailure::Recorded {
            entry: GrantEntry {
                template_id: t(id),
                request_id: RequestId::parse("r1").expect("valid request id"),
                result,
                status: GrantStatus::Consumed,
            },
            by_this_call,
        }
    }

    use SubscribeResult::{Accept, Filter, Reject};

    #[test]
    fn each_result_writes_its_ledger_state_and_counter_change() {
        let progress = ReportProgress::new(&report(&[("A", Accept), ("B", Reject), ("C", Filter)]));
        let writes: Vec<_> = progress
            .writes()
            .into_iter()
            .map(|w| (w.template.to_string(), w.state, w.counters))
            .collect();
        assert_eq!(
            writes,
            vec![
                (
                    "A".into(),
                    Some(GrantState::Available),
                    CounterChange::Grant
                ),
                ("B".into(), None, CounterChange::Refusal),
                ("C".into(), None, CounterChange::None),
            ]
        );
    }

    #[test]
    fn a_commit_records_every_pending_template_as_written() {
        let mut progress = ReportProgress::new(&report(&[("A", Accept), ("B", Reject)]));
        progress.committed();
        assert!(progress.is_done());
        let answer = progress.recorded();
        assert_eq!(answer.written, 2);
        let statuses: Vec<_> = answer.grants.iter().map(|g| g.status).collect();
        assert_eq!(
            statuses,
            vec![GrantStatus::Available, GrantStatus::NotGranted]
        );
    }

    /// Failures, what follows, templates left, written.
    type Case = (
        Vec<ReportFailure>,
        Result<AfterCancel, ReportRefused>,
        usize,
        usize,
    );

    #[test]
    fn a_cancelled_attempt_is_decided_by_its_failures() {
        use ReportFailure::{OpenGrantCap, PlanMoved, Rate};
        let cases: Vec<Case> = vec![
            (vec![], Ok(AfterCancel::Retry), 2, 0),
            (vec![PlanMoved], Ok(AfterCancel::Retry), 2, 0),
            (vec![Rate], Err(ReportRefused::Rate), 2, 0),
            (vec![OpenGrantCap], Err(ReportRefused::OpenGrantCap), 2, 0),
            // The minute's rate wins over the cap, whichever comes first.
            (vec![Rate, OpenGrantCap], Err(ReportRefused::Rate), 2, 0),
            (vec![OpenGrantCap, Rate], Err(ReportRefused::Rate), 2, 0),
            // A replay is answered as recorded; the rest runs again at once, limits
            // included (they refuse it on the next attempt if they still hold).
            (
                vec![recorded("A", Accept, false)],
                Ok(AfterCancel::Continue),
                1,
                0,
            ),
            (
                vec![recorded("A", Accept, false), Rate],
                Ok(AfterCancel::Continue),
                1,
                0,
            ),
            // Written by an earlier attempt of this call whose answer was lost.
            (
                vec![recorded("A", Accept, true)],
                Ok(AfterCancel::Continue),
                1,
                1,
            ),
            (
                vec![recorded("A", Accept, false), recorded("B", Reject, false)],
                Ok(AfterCancel::Continue),
                0,
                0,
            ),
            // Another result recorded under the same request id refuses the report.
            (
                vec![recorded("B", Accept, false)],
                Err(ReportRefused::Conflict {
                    template: t("B"),
                    recorded: Accept,
                }),
                2,
                0,
            ),
        ];
        for (failures, want, left, written) in cases {
            let mut progress = ReportProgress::new(&report(&[("A", Accept), ("B", Reject)]));
            let shown = format!("{failures:?}");
            assert_eq!(progress.cancelled(failures), want, "{shown}");
            assert_eq!(progress.pending().len(), left, "{shown}");
            assert_eq!(progress.clone().recorded().written, written, "{shown}");
        }
    }
}
