//! Why a due item is not sent now: the claim's one answer short of a send, knowing
//! what it leaves on the push (its outbox state, the notification's push status and
//! reason, when it is due again) and what it counts.

use chrono::{DateTime, Utc};

use crate::domain::consent::standing::Standing;
use crate::domain::inbox::{PushReason, PushStatus};
use crate::domain::reminders::plan::{IllegalTransition, Plan, PlanEvent};
use crate::domain::settle::OutboxState;

/// Why a due item is not sent now. Nothing is sent and no grant is spent, whatever the
/// reason; a push that stays `pending` is due again ([`Unsent::due_again`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsent {
    /// A push whose cancel came while an earlier attempt was in flight.
    Cancelled,
    /// A push replaced (a newer notification of its `collapse_key`) while an earlier
    /// attempt was in flight.
    Replaced,
    /// A push whose `expires_at` passed.
    Expired,
    /// The user's settings keep the template refused: a push is `skipped`
    /// (`turned_off`), a plan paused as the refusal pauses it. A refusal always wins.
    TurnedOff,
    /// A push of a type the user muted.
    Muted,
    /// A push in the user's quiet hours: due again at their end.
    Held(DateTime<Utc>),
    /// Past the user's daily cap: due again at the start of their next day (a plan at
    /// its first waking moment from then).
    CapWait(DateTime<Utc>),
    /// Past the user's daily cap, a push that expires before the next day: `capped`.
    Capped,
    /// A push waiting for a grant of its template, listed on the quota item: none is
    /// available, or better pushes wait for those there are (`wake`: the best of them,
    /// which a grant available now is for) or are due together with it (`yielded`).
    WaitGrant { wake: Option<String>, yielded: bool },
    /// No grant: a plan pauses `needs_grant`; a push finding the waiting list full is
    /// `skipped` (`no_grant`), waking `wake` as a wait would.
    NoGrant { wake: Option<String> },
}

/// The dispatcher's count (and metric) an [`Unsent`] ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tally {
    NoGrant,
    GrantWaits,
    Expired,
    Muted,
    TurnedOff,
    Held,
    CapWaits,
    Capped,
    Cancelled,
    Replaced,
}

impl Unsent {
    /// A plan not sent: refused by the user's settings (`standing`, a choice the plan
    /// missed: made while its kind was not configured), paused as that refusal pauses
    /// it; past the daily cap, due again at the next day's first waking moment; else
    /// paused `needs_grant`.
    pub fn plan_after(
        &self,
        plan: &Plan,
        standing: Option<Standing>,
    ) -> Result<Plan, IllegalTransition> {
        let mut moved = plan.clone();
        match self {
            Self::TurnedOff => moved.stand(standing)?,
            Self::CapWait(until) => {
                moved.status = plan.status.apply(PlanEvent::Capped {
                    due: plan.settings.schedule.first_awake_from(*until),
                })?;
            }
            _ => moved.status = plan.status.apply(PlanEvent::GrantMissing)?,
        }
        Ok(moved)
    }

    /// What a push that is not sent goes to.
    pub fn outbox_state(&self) -> OutboxState {
        match self {
            Self::Cancelled => OutboxState::Cancelled,
            Self::Replaced => OutboxState::Replaced,
            Self::Expired => OutboxState::Expired,
            // Skipped, its grants kept: a refusal of the template, not of them.
            Self::TurnedOff | Self::NoGrant { .. } => OutboxState::Skipped,
            Self::Muted => OutboxState::Muted,
            Self::Capped => OutboxState::Capped,
            Self::Held(_) | Self::CapWait(_) | Self::WaitGrant { .. } => OutboxState::Pending,
        }
    }

    /// What the push's notification says of it: its push status and why, or None
    /// where the notification stays as it is (held by quiet hours: still `pending`).
    pub fn push_status(&self) -> Option<(PushStatus, Option<PushReason>)> {
        Some(match self {
            Self::Cancelled => (PushStatus::Cancelled, None),
            Self::Replaced => (PushStatus::Replaced, None),
            Self::Expired => (PushStatus::Expired, None),
            Self::TurnedOff => (PushStatus::Skipped, Some(PushReason::TurnedOff)),
            Self::NoGrant { .. } => (PushStatus::Skipped, Some(PushReason::NoGrant)),
            Self::Muted => (PushStatus::Muted, None),
            Self::Capped => (PushStatus::Capped, None),
            Self::CapWait(_) => (PushStatus::Pending, Some(PushReason::Capped)),
            Self::WaitGrant { .. } => (PushStatus::Pending, Some(PushReason::NoGrant)),
            Self::Held(_) => return None,
        })
    }

    /// When a push left `pending` is due again (`send_by`: its `expires_at`, where one
    /// waiting for a grant is due to end `expired` unless a grant wakes it first); None
    /// for one that ends, or leaves the due index.
    pub fn due_again(&self, send_by: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
        match self {
            Self::Held(until) | Self::CapWait(until) => Some(*until),
            Self::WaitGrant { .. } => send_by,
            _ => None,
        }
    }

    /// Whether the push waits for a grant of its template (listed on its quota item).
    pub fn waits_for_grant(&self) -> bool {
        matches!(self, Self::WaitGrant { .. })
    }

    /// The waiting push a grant there is now is for, to wake with this decision.
    pub fn wakes(&self) -> Option<&str> {
        match self {
            Self::WaitGrant { wake, .. } | Self::NoGrant { wake } => wake.as_deref(),
            _ => None,
        }
    }

    /// The count it ends in.
    pub fn tally(&self) -> Tally {
        match self {
            Self::Cancelled => Tally::Cancelled,
            Self::Replaced => Tally::Replaced,
            Self::Expired => Tally::Expired,
            Self::TurnedOff => Tally::TurnedOff,
            Self::Muted => Tally::Muted,
            Self::Held(_) => Tally::Held,
            Self::CapWait(_) => Tally::CapWaits,
            Self::Capped => Tally::Capped,
            Self::WaitGrant { .. } => Tally::GrantWaits,
            Self::NoGrant { .. } => Tally::NoGrant,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::at;

    #[test]
    fn a_plan_left_unsent_pauses_for_a_grant_waits_out_the_cap_or_stands_refused() {
        use crate::domain::consent::PauseReason;
        use crate::domain::reminders::plan::PlanStatus;
        let due = at("2026-12-03T10:00:00Z");
        let mut plan = Plan::new(&crate::domain::reminders::test_kind());
        plan.status = PlanStatus::Scheduled { due };
        let after = |why: Unsent, standing| why.plan_after(&plan, standing).expect("legal");
        let no_grant = after(Unsent::NoGrant { wake: None }, None);
        assert_eq!(
            no_grant.status,
            PlanStatus::Paused {
                reason: PauseReason::NeedsGrant
            }
        );
        // Past the cap: due at the first waking moment from the next day's start (the
        // test kind is awake from 00:00 UTC).
        let next_day = at("2026-12-04T00:00:00Z");
        assert_eq!(
            after(Unsent::CapWait(next_day), None).status,
            PlanStatus::Scheduled { due: next_day }
        );
        // Refused by a standing choice the plan missed: paused as that refusal pauses it.
        let refused = after(Unsent::TurnedOff, Some(Standing::Reject));
        assert_eq!(
            refused.status,
            PlanStatus::Paused {
                reason: PauseReason::AlwaysRejected
            }
        );
        // The plan it was given is left as it was.
        assert_eq!(plan.status, PlanStatus::Scheduled { due });
    }

    #[test]
    fn each_reason_knows_its_state_status_due_instant_and_count() {
        let until = at("2026-12-03T16:00:00Z");
        let send_by = Some(at("2026-12-04T00:00:00Z"));
        let wait = Unsent::WaitGrant {
            wake: Some("0:n1".into()),
            yielded: false,
        };
        use OutboxState as O;
        use PushReason as R;
        use PushStatus as P;
        type Status = Option<(P, Option<R>)>;
        let cases: [(Unsent, O, Status, Option<_>, Tally); 10] = [
            (
                Unsent::Cancelled,
                O::Cancelled,
                Some((P::Cancelled, None)),
                None,
                Tally::Cancelled,
            ),
            (
                Unsent::Replaced,
                O::Replaced,
                Some((P::Replaced, None)),
                None,
                Tally::Replaced,
            ),
            (
                Unsent::Expired,
                O::Expired,
                Some((P::Expired, None)),
                None,
                Tally::Expired,
            ),
            (
                Unsent::TurnedOff,
                O::Skipped,
                Some((P::Skipped, Some(R::TurnedOff))),
                None,
                Tally::TurnedOff,
            ),
            (
                Unsent::Muted,
                O::Muted,
                Some((P::Muted, None)),
                None,
                Tally::Muted,
            ),
            (
                Unsent::Held(until),
                O::Pending,
                None,
                Some(until),
                Tally::Held,
            ),
            (
                Unsent::CapWait(until),
                O::Pending,
                Some((P::Pending, Some(R::Capped))),
                Some(until),
                Tally::CapWaits,
            ),
            (
                Unsent::Capped,
                O::Capped,
                Some((P::Capped, None)),
                None,
                Tally::Capped,
            ),
            (
                wait.clone(),
                O::Pending,
                Some((P::Pending, Some(R::NoGrant))),
                send_by,
                Tally::GrantWaits,
            ),
            (
                Unsent::NoGrant { wake: None },
                O::Skipped,
                Some((P::Skipped, Some(R::NoGrant))),
                None,
                Tally::NoGrant,
            ),
        ];
        for (why, state, status, due, tally) in cases {
            assert_eq!(why.outbox_state(), state, "{why:?}");
            assert_eq!(why.push_status(), status, "{why:?}");
            assert_eq!(why.due_again(send_by), due, "{why:?}");
            assert_eq!(why.tally(), tally, "{why:?}");
            // Only a push left pending is due again, and only one waiting is listed.
            assert_eq!(
                due.is_some(),
                state == O::Pending && why.due_again(None).is_some() || why.waits_for_grant(),
                "{why:?}"
            );
            assert_eq!(why.waits_for_grant(), tally == Tally::GrantWaits, "{why:?}");
        }
        assert_eq!(wait.wakes(), Some("0:n1"));
        assert_eq!(Unsent::Expired.wakes(), None);
    }
}
