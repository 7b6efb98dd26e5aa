//! `POST /v1/reminders/{kind}/checkins`.

use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::consent::{GrantOnHand, Refusal};
use crate::domain::reminders::plan::{Plan, PlanStatus};
use crate::domain::reminders::{CheckIn, ReminderKind};
use crate::store::items::grant::GrantItem;
use crate::store::items::plan::ActionItem;
use crate::store::items::quota::quota_update_item;
use crate::store::items::rfc3339;
use crate::store::keys::{action_sk, user_pk};
use crate::store::reminders::CheckInOutcome;
use crate::store::tx::{TxOutcome, condition_failed};
use crate::store::{Attempt, Limit, Store, StoreError, corrupt, retry_contended};

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
