//! The check-in decision (pure): what one new check-in does to its plan, its template's
//! counters and the grant it carries, given what the store read. The store loads the
//! plan, the counters and the carried grant's ledger entry, calls [`decide`], and
//! commits the decision in one transaction (`store::reminders::check_in`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::consent::GrantOnHand;
use crate::domain::grants::{QuotaCounters, SubscribeResult};
use crate::domain::ids::RequestId;
use crate::domain::reminders::CheckIn;
use crate::domain::reminders::plan::{IllegalTransition, Plan, PlanView};

/// The guards a check-in meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckInLimits {
    /// Most available grants of one template (`MAX_OPEN_GRANTS`).
    pub max_open_grants: u32,
    /// Most new check-ins of one kind per user and minute (`CHECKINS_PER_MINUTE`).
    pub checkins_per_minute: u32,
}

/// What becomes of the grant a check-in carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarriedGrant {
    /// None carried, or the same result is recorded already (a replay of its report):
    /// nothing to write.
    Nothing,
    /// Recorded before with another result: the grant part is refused, the check-in
    /// itself stands (a fact the user made, I7); the answer says `grant_conflict`.
    Conflict,
    /// A new grant past the open-grant cap: left out; the answer says `grant_limit`.
    OverLimit,
    /// New: recorded in the ledger (and counted, if it grants) with the check-in.
    Record(RequestId, SubscribeResult),
}

/// Why a new check-in is refused before anything is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CheckInRefused {
    /// Past this minute's limit: retry after this many seconds.
    #[error("too many check-ins this minute; retry after {0} s")]
    Rate(u64),
    /// The stored plan cannot take the check-in (a bug or corrupt data).
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// What a check-in changes, for the store to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckInDecision {
    /// The plan as it is to be written.
    pub plan: Plan,
    /// The template's counters after the carried grant.
    pub counters: QuotaCounters,
    pub grant: CarriedGrant,
}

/// The check-in's answer: the plan as written, and what became of a carried grant that
/// was not recorded.
#[derive(Debug, Clone, Serialize)]
pub struct CheckInAnswer {
    #[serde(flatten)]
    pub plan: PlanView,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub grant_conflict: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub grant_limit: bool,
}

/// Decides a new check-in (a replay is answered from its record before this). `ledger`
/// is the result recorded for the carried grant's request id, if any.
pub fn decide(
    mut plan: Plan,
    mut counters: QuotaCounters,
    ledger: Option<SubscribeResult>,
    checkin: &CheckIn,
    limits: CheckInLimits,
    now: DateTime<Utc>,
) -> Result<CheckInDecision, CheckInRefused> {
    let grant = match &checkin.grant {
        None => CarriedGrant::Nothing,
        Some((request_id, result)) => match ledger {
            Some(old) if old == *result => CarriedGrant::Nothing,
            Some(_) => CarriedGrant::Conflict,
            None if result.grants() && counters.available >= u64::from(limits.max_open_grants) => {
                CarriedGrant::OverLimit
            }
            None => CarriedGrant::Record(request_id.clone(), *result),
        },
    };
    let recorded = match &grant {
        CarriedGrant::Record(_, result) => Some(*result),
        CarriedGrant::Nothing | CarriedGrant::Conflict | CarriedGrant::OverLimit => None,
    };
    let new_grant = recorded.is_some_and(|r| r.grants());
    if new_grant {
        counters.accepted += 1;
        counters.available += 1;
    }
    // A new check-in past this minute's limit is refused before anything is written.
    plan.admit_checkin(now, limits.checkins_per_minute)
        .map_err(CheckInRefused::Rate)?;
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
    // The send in flight decides; the check-in counts when it ends. Only a grant this
    // check-in newly records lifts a refusal, and only a refusal it newly records
    // pauses: one the ledger holds already took effect when it was first recorded (a
    // replay changes nothing, I3).
    plan.check_in(GrantOnHand::of(new_grant, counters.available > 0), due)?;
    if let Some(refusal) = recorded.and_then(SubscribeResult::refusal) {
        plan.refuse(refusal)?;
    }
    plan.last_checkin_at = Some(anchor.max(plan.last_checkin_at.unwrap_or(anchor)));
    Ok(CheckInDecision {
        plan,
        counters,
        grant,
    })
}

impl CheckInDecision {
    /// The answer, as of the plan once written (its next version).
    pub fn answer(&self, now: DateTime<Utc>) -> CheckInAnswer {
        CheckInAnswer {
            plan: self
                .plan
                .clone()
                .written()
                .view(self.counters.available, now),
            grant_conflict: self.grant == CarriedGrant::Conflict,
            grant_limit: self.grant == CarriedGrant::OverLimit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::consent::PauseReason;
    use crate::domain::reminders::plan::PlanStatus;

    const LIMITS: CheckInLimits = CheckInLimits {
        max_open_grants: 3,
        checkins_per_minute: 60,
    };

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_780_000_000, 0).unwrap_or_default()
    }

    fn awaiting() -> Plan {
        let kind = crate::domain::reminders::test_kind();
        let mut plan = Plan::new(&kind);
        plan.status = PlanStatus::AwaitingCheckin;
        plan.version = 3;
        plan
    }

    fn checkin(grant: Option<SubscribeResult>) -> CheckIn {
        CheckIn {
            action_id: RequestId::parse("wc_1").expect("id"),
            grant: grant.map(|r| (RequestId::parse("wr_1").expect("id"), r)),
            occurred_at: now(),
            current_count: 2,
            daily_goal: 8,
        }
    }

    fn held(available: u64) -> QuotaCounters {
        QuotaCounters {
            accepted: available,
            available,
            ..QuotaCounters::default()
        }
    }

    #[test]
    fn a_new_accept_is_recorded_counted_and_schedules_the_plan() {
        let d = decide(
            awaiting(),
            held(0),
            None,
            &checkin(Some(SubscribeResult::Accept)),
            LIMITS,
            now(),
        )
        .expect("decided");
        assert!(matches!(
            d.grant,
            CarriedGrant::Record(_, SubscribeResult::Accept)
        ));
        assert_eq!((d.counters.accepted, d.counters.available), (1, 1));
        assert!(matches!(d.plan.status, PlanStatus::Scheduled { .. }));
        assert_eq!(d.plan.today.map(|(_, count)| count), Some(2));
        let answer = d.answer(now());
        assert!(!answer.grant_conflict && !answer.grant_limit);
    }

    #[test]
    fn without_a_grant_the_plan_waits_for_one_and_nothing_is_counted() {
        let d = decide(awaiting(), held(0), None, &checkin(None), LIMITS, now()).expect("decided");
        assert_eq!(d.grant, CarriedGrant::Nothing);
        assert_eq!(d.counters, held(0));
        assert_eq!(
            d.plan.status,
            PlanStatus::Paused {
                reason: PauseReason::NeedsGrant
            }
        );
    }

    #[test]
    fn a_grant_recorded_before_is_a_replay_and_one_recorded_otherwise_a_conflict() {
        let replay = decide(
            awaiting(),
            held(1),
            Some(SubscribeResult::Accept),
            &checkin(Some(SubscribeResult::Accept)),
            LIMITS,
            now(),
        )
        .expect("decided");
        assert_eq!(replay.grant, CarriedGrant::Nothing);
        assert_eq!(
            replay.counters,
            held(1),
            "counted once, when first recorded"
        );
        let conflict = decide(
            awaiting(),
            held(1),
            Some(SubscribeResult::Reject),
            &checkin(Some(SubscribeResult::Accept)),
            LIMITS,
            now(),
        )
        .expect("decided");
        assert_eq!(conflict.grant, CarriedGrant::Conflict);
        assert_eq!(conflict.counters, held(1));
        assert!(conflict.answer(now()).grant_conflict);
        // The check-in itself stands (I7): counted and scheduled with the grant held.
        assert!(matches!(conflict.plan.status, PlanStatus::Scheduled { .. }));
    }

    #[test]
    fn a_new_grant_past_the_cap_is_left_out_and_said_so() {
        let d = decide(
            awaiting(),
            held(3),
            None,
            &checkin(Some(SubscribeResult::Accept)),
            LIMITS,
            now(),
        )
        .expect("decided");
        assert_eq!(d.grant, CarriedGrant::OverLimit);
        assert_eq!(d.counters, held(3));
        assert!(d.answer(now()).grant_limit);
    }

    #[test]
    fn a_new_reject_is_recorded_and_pauses_the_plan_even_with_grants_held() {
        let d = decide(
            awaiting(),
            held(2),
            None,
            &checkin(Some(SubscribeResult::Reject)),
            LIMITS,
            now(),
        )
        .expect("decided");
        assert!(matches!(
            d.grant,
            CarriedGrant::Record(_, SubscribeResult::Reject)
        ));
        assert_eq!(d.counters, held(2));
        assert_eq!(
            d.plan.status,
            PlanStatus::Paused {
                reason: PauseReason::Rejected
            }
        );
    }

    #[test]
    fn a_check_in_past_the_minutes_limit_is_refused_with_its_wait() {
        let limits = CheckInLimits {
            checkins_per_minute: 1,
            ..LIMITS
        };
        let first =
            decide(awaiting(), held(1), None, &checkin(None), limits, now()).expect("first");
        let second = decide(first.plan, held(1), None, &checkin(None), limits, now());
        assert!(
            matches!(second, Err(CheckInRefused::Rate(wait)) if wait >= 1),
            "{second:?}"
        );
    }

    #[test]
    fn the_answer_is_the_plan_as_written() {
        let d = decide(awaiting(), held(1), None, &checkin(None), LIMITS, now()).expect("decided");
        let answer = serde_json::to_value(d.answer(now())).expect("json");
        assert_eq!(answer["state"], "scheduled");
        assert!(answer.get("grant_conflict").is_none());
        assert!(answer.get("grant_limit").is_none());
    }
}
