//! `POST /v1/reminders/{kind}/checkins`.

use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::grants::report::TemplateWrite;
use crate::domain::reminders::check_in::{CarriedGrant, CheckInLimits, CheckInRefused, decide};
use crate::domain::reminders::plan::PlanStatus;
use crate::domain::reminders::{CheckIn, ReminderKind};
use crate::store::error::{Limit, StoreError, corrupt};
use crate::store::handle::Store;
use crate::store::items::plan::{ActionItem, PlanItem};
use crate::store::items::{parse, rfc3339, to_item};
use crate::store::keys::{action_sk, plan_sk, user_pk};
use crate::store::reminders::CheckInOutcome;
use crate::store::retry::{Attempt, retry_contended};
use crate::store::tx::{Outcome, Parts};

/// The parts of a check-in's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The action item: there already, the check-in is a replay.
    Action,
    Plan,
    /// The grant it carries, recorded.
    Grant,
    /// The quota counters the grant moves, or the check that a grant is there.
    Counters,
}

impl Store {
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
        // With the answer, whether pushes of the template wait for a grant, as the last
        // try read: a grant the check-in carries is written only while that still
        // holds, and then wakes them.
        let (outcome, waiting) =
            retry_contended("check-in", self.limits.write_budget, || async move {
                let read = self.read(pk, kind, Some(checkin)).await?;
                let none_waiting = read.open.waiting.is_empty();
                let done = |outcome| Attempt::Done((outcome, !none_waiting));
                if let Some(action) = read.action {
                    return replay(action, fingerprint).map(done);
                }
                let plan = PlanItem::or_new(read.plan, kind)?;
                let limits = CheckInLimits {
                    max_open_grants: self.limits.max_open_grants,
                    checkins_per_minute: self.limits.checkins_per_minute,
                };
                let ledger = read.ledger.as_ref().map(|old| old.result);
                let decision = decide(plan, read.counters, ledger, checkin, limits, now).map_err(
                    |refused| match refused {
                        CheckInRefused::Rate(retry_after) => {
                            StoreError::Limited(Limit::Rate { retry_after })
                        }
                        CheckInRefused::Illegal(e) => StoreError::Corrupt(e.to_string()),
                    },
                )?;
                let response = serde_json::to_value(decision.answer(now))
                    .map_err(|e| corrupt("plan view", e))?;
                let plan = &decision.plan;
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
                let mut items = Parts::new()
                    .with(Part::Action, self.put_new(to_item("action", &action)?)?)
                    .with(Part::Plan, self.plan_put(plan, pk, now)?);
                if let CarriedGrant::Record(request_id, result) = &decision.grant {
                    let write = TemplateWrite::of(&kind.template_id, *result);
                    let (ledger, counters) =
                        self.recorded_answer(pk, &write, request_id, now, none_waiting)?;
                    items.add(Part::Grant, ledger);
                    if let Some(update) = counters {
                        items.add(Part::Counters, update);
                    }
                } else if matches!(plan.status, PlanStatus::Scheduled { .. }) {
                    items.add(Part::Counters, self.grant_check(pk, kind)?);
                }
                match self.transact_parts(&items).await? {
                    Outcome::Committed => {
                        return Ok(done(CheckInOutcome::Applied(response)));
                    }
                    Outcome::Cancelled(failed) => {
                        if failed.has(Part::Action) {
                            let old = failed.old(Part::Action).cloned().ok_or_else(|| {
                                StoreError::Corrupt("action conflict without the old item".into())
                            })?;
                            let old: ActionItem = parse("action", old)?;
                            return replay(old, fingerprint).map(done);
                        }
                        // A report of the same grant landed meanwhile: the next read sees
                        // it (a replay, or a conflict refused on its own).
                    }
                    Outcome::Contended | Outcome::Conflict => {}
                }
                Ok(Attempt::Retry)
            })
            .await?;
        let carried = checkin
            .grant
            .as_ref()
            .is_some_and(|(_, result)| result.grants());
        let granted = matches!(outcome, CheckInOutcome::Applied(_)) && carried;
        // A grant the check-in carried: confirmed by a popup event already recorded?
        if self.limits.push_events && granted {
            self.pair_taps_logged(openid, &kind.template_id, now).await;
        }
        // …and for the best push of the template waiting for one, at once. A replay
        // wakes none and stays one read: its first application's commit made the
        // template's wake entry due, so a wake cut short then is done by the next tick.
        if granted && waiting {
            Box::pin(self.wake_waiting_logged(openid, &kind.template_id, now)).await;
        }
        Ok(outcome)
    }
}

impl Store {
    /// Whether the check-in is recorded already (a replay): a standing choice it
    /// carries is applied only when it is not ([`Store::stand`]) — and only when the
    /// check-in itself is admitted (`CHECKINS_PER_MINUTE`, on its plan as read), so a
    /// check-in refused by its limit writes nothing, its setting included.
    pub async fn admit_check_in(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        checkin: &CheckIn,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let (action, plan) = (action_sk(&checkin.action_id), plan_sk(&kind.name));
        let mut found = self
            .read_items(&user_pk(openid), &[action.clone(), plan.clone()])
            .await?;
        if found.contains_key(&action) {
            return Ok(true);
        }
        if let Some(item) = found.remove(&plan) {
            let mut plan = parse::<PlanItem>("plan", item)?.into_plan(kind)?;
            plan.admit_checkin(now, self.limits.checkins_per_minute)
                .map_err(|retry_after| StoreError::Limited(Limit::Rate { retry_after }))?;
        }
        Ok(false)
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
