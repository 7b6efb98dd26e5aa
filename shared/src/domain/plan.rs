//! The reminder plan state machine (DESIGN.md §3).
//!
//! A plan is in exactly one [`PlanStatus`]; the data a state needs travels inside it
//! (a scheduled plan always has its due instant, a paused one its reason), so an
//! inconsistent plan cannot be built. [`PlanStatus::apply`] is the only way to move,
//! and its match lists every (state, event) pair — no wildcard arms — so adding a state
//! or an event does not compile until every transition is decided.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use super::grant::SubscribeResult;
use super::ids::TemplateId;
use super::outcome::{FollowUp, Settlement};
use super::reminder::{KindName, ReminderKind, Settings};

/// Why a plan is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseReason {
    /// No grant is available for the kind's template.
    NeedsGrant,
    /// The user rejected the template.
    Rejected,
    /// The user banned the template (or WeChat banned it for the user).
    Banned,
    /// A send's outcome is unknown; never resent automatically (I4).
    Uncertain,
    /// WeChat refused the template or content (47003, 40037, …): needs an operator.
    ConfigError,
    /// A send failed for good (user frozen, openid invalid, retries exhausted).
    SendFailed,
    /// WeChat refused a send as not subscribed (43101): the user's refusal, as WeChat
    /// holds it.
    Refused,
}

impl PauseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NeedsGrant => "needs_grant",
            Self::Rejected => "rejected",
            Self::Banned => "banned",
            Self::Uncertain => "uncertain",
            Self::ConfigError => "config_error",
            Self::SendFailed => "send_failed",
            Self::Refused => "refused",
        }
    }

    /// Whether the pause is a refusal, which holds until the user accepts the template
    /// again: only a grant accepted after it resumes the plan — never a grant recorded
    /// before it, a plain check-in, a settings save or a replay.
    pub fn holds_until_accept(self) -> bool {
        match self {
            Self::Rejected | Self::Banned | Self::Refused => true,
            Self::NeedsGrant | Self::Uncertain | Self::ConfigError | Self::SendFailed => false,
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "needs_grant" => Self::NeedsGrant,
            "rejected" => Self::Rejected,
            "banned" => Self::Banned,
            "uncertain" => Self::Uncertain,
            "config_error" => Self::ConfigError,
            "send_failed" => Self::SendFailed,
            "refused" => Self::Refused,
            _ => return None,
        })
    }
}

/// A user's refusal of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Reject,
    Ban,
}

impl Refusal {
    /// The refusal a subscription result makes, if any.
    pub fn of(result: SubscribeResult) -> Option<Self> {
        match result {
            SubscribeResult::Reject => Some(Self::Reject),
            SubscribeResult::Ban => Some(Self::Ban),
            SubscribeResult::Accept
            | SubscribeResult::AcceptWithAudio
            | SubscribeResult::AcceptWithAlert
            | SubscribeResult::Filter => None,
        }
    }
}

/// The grants an event that may schedule a plan finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantOnHand {
    /// None available.
    None,
    /// Available, every one recorded before the event.
    Held,
    /// The event itself brings a grant the user just accepted (the first application
    /// of a report or of a check-in that carries one): the only kind that lifts a
    /// refusal.
    New,
}

impl GrantOnHand {
    /// From whether the event brings a new accept and whether any grant is available.
    pub fn of(new_accept: bool, available: bool) -> Self {
        match (new_accept, available) {
            (true, _) => Self::New,
            (false, true) => Self::Held,
            (false, false) => Self::None,
        }
    }

    pub fn any(self) -> bool {
        match self {
            Self::None => false,
            Self::Held | Self::New => true,
        }
    }
}

/// Where a plan is, with the data that state needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanStatus {
    /// Off. No reminders; unconsumed grants of the template were invalidated.
    Disabled,
    /// Holding a grant, due at `due` (and on the due index).
    Scheduled { due: DateTime<Utc> },
    /// Claimed by a dispatcher; the send is in flight.
    Sending,
    /// Sent; waiting for the user to check in (and bring the next grant).
    AwaitingCheckin,
    /// Stopped until something changes (see the reason).
    Paused { reason: PauseReason },
}

/// Something that happens to a plan. Events that may schedule carry the due instant
/// their caller computed with the next-due rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanEvent {
    /// The user turns the plan on (or saves its settings while on); `grant` says
    /// whether a grant is available. Never lifts a refusal.
    Enable { grant: bool, due: DateTime<Utc> },
    /// Settings changed while enabled.
    Reschedule { due: DateTime<Utc> },
    /// The user turns the plan off.
    Disable,
    /// The user checked in; `grant` says which grants are there afterwards.
    CheckIn {
        grant: GrantOnHand,
        due: DateTime<Utc>,
    },
    /// A grant report's first application brought a new grant for the kind's template.
    GrantAdded { due: DateTime<Utc> },
    /// The user rejected or banned the template.
    Refused(Refusal),
    /// A dispatcher claimed the due plan.
    Claimed,
    /// The dispatcher found no grant to reserve.
    GrantMissing,
    /// WeChat accepted the message.
    Sent,
    /// A definite, retryable failure: grant restored, try again at `due`.
    RetryLater { due: DateTime<Utc> },
    /// A failure that stops the plan (refused, uncertain, permanent).
    SendStopped(PauseReason),
}

/// An event that cannot happen in a state (a bug or a stale caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{event:?} cannot happen to a plan that is {from:?}")]
pub struct IllegalTransition {
    pub from: PlanStatus,
    pub event: PlanEvent,
}

impl PlanStatus {
    /// The API name of the state.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Scheduled { .. } => "scheduled",
            Self::Sending => "sending",
            Self::AwaitingCheckin => "awaiting_checkin",
            Self::Paused { .. } => "paused",
        }
    }

    pub fn due(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::Scheduled { due } => Some(*due),
            Self::Disabled | Self::Sending | Self::AwaitingCheckin | Self::Paused { .. } => None,
        }
    }

    pub fn pause_reason(&self) -> Option<PauseReason> {
        match self {
            Self::Paused { reason } => Some(*reason),
            Self::Disabled | Self::Scheduled { .. } | Self::Sending | Self::AwaitingCheckin => None,
        }
    }

    pub fn is_enabled(&self) -> bool {
        !matches!(self, Self::Disabled)
    }

    /// The state after `event`, or why it cannot happen.
    pub fn apply(self, event: PlanEvent) -> Result<PlanStatus, IllegalTransition> {
        use PlanStatus::{AwaitingCheckin, Disabled, Paused, Scheduled, Sending};
        let illegal = Err(IllegalTransition { from: self, event });
        let scheduled_or_waiting = |grant: bool, due| {
            if grant {
                Scheduled { due }
            } else {
                Paused {
                    reason: PauseReason::NeedsGrant,
                }
            }
        };
        match event {
            PlanEvent::Enable { grant, due } => match self {
                Disabled => Ok(scheduled_or_waiting(grant, due)),
                // Already on: enabling again keeps the state, re-timing a schedule (or
                // pausing it when its grant is gone: a schedule needs a grant)…
                Scheduled { .. } => Ok(scheduled_or_waiting(grant, due)),
                Sending | AwaitingCheckin => Ok(self),
                // …and lets a paused plan resume if a grant is there — unless the user
                // refused: a settings save is not an accept.
                Paused { reason } if reason.holds_until_accept() => Ok(self),
                Paused { .. } if grant => Ok(Scheduled { due }),
                Paused { .. } => Ok(self),
            },
            PlanEvent::Reschedule { due } => match self {
                Scheduled { .. } => Ok(Scheduled { due }),
                Disabled | Sending | AwaitingCheckin | Paused { .. } => Ok(self),
            },
            PlanEvent::Disable => match self {
                Disabled | Scheduled { .. } | Sending | AwaitingCheckin | Paused { .. } => {
                    Ok(Disabled)
                }
            },
            PlanEvent::CheckIn { grant, due } => match self {
                // Recorded, but a disabled plan stays off and an in-flight send is left alone.
                Disabled | Sending => Ok(self),
                Scheduled { .. } | AwaitingCheckin => Ok(scheduled_or_waiting(grant.any(), due)),
                // A refusal holds until the user accepts again: a check-in resumes it
                // only with the new accept it carries.
                Paused { reason } if reason.holds_until_accept() => match grant {
                    GrantOnHand::New => Ok(Scheduled { due }),
                    GrantOnHand::Held | GrantOnHand::None => Ok(self),
                },
                Paused { .. } if grant.any() => Ok(Scheduled { due }),
                // A failure stays visible until a grant arrives.
                Paused { .. } => Ok(self),
            },
            PlanEvent::GrantAdded { due } => match self {
                // A new accept: it lifts a refusal too.
                Paused { .. } => Ok(Scheduled { due }),
                // A sent reminder waits for the check-in (§3): only a check-in brings
                // the next one, whatever grants arrive meanwhile.
                Disabled | Scheduled { .. } | Sending | AwaitingCheckin => Ok(self),
            },
            PlanEvent::Refused(refusal) => {
                let reason = match refusal {
                    Refusal::Reject => PauseReason::Rejected,
                    Refusal::Ban => PauseReason::Banned,
                };
                match self {
                    Scheduled { .. } | AwaitingCheckin | Paused { .. } => Ok(Paused { reason }),
                    // Off stays off; an in-flight send finalizes by its own outcome, then
                    // the refusal applies (see `Plan::refuse`).
                    Disabled | Sending => Ok(self),
                }
            }
            PlanEvent::Claimed => match self {
                Scheduled { .. } => Ok(Sending),
                Disabled | Sending | AwaitingCheckin | Paused { .. } => illegal,
            },
            PlanEvent::GrantMissing => match self {
                Scheduled { .. } => Ok(Paused {
                    reason: PauseReason::NeedsGrant,
                }),
                Disabled | Sending | AwaitingCheckin | Paused { .. } => illegal,
            },
            PlanEvent::Sent => match self {
                Sending => Ok(AwaitingCheckin),
                Disabled | Scheduled { .. } | AwaitingCheckin | Paused { .. } => illegal,
            },
            PlanEvent::RetryLater { due } => match self {
                Sending => Ok(Scheduled { due }),
                Disabled | Scheduled { .. } | AwaitingCheckin | Paused { .. } => illegal,
            },
            PlanEvent::SendStopped(reason) => match self {
                Sending => Ok(Paused { reason }),
                Disabled | Scheduled { .. } | AwaitingCheckin | Paused { .. } => illegal,
            },
        }
    }
}

/// A user's plan for one reminder kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub kind: KindName,
    pub template_id: TemplateId,
    pub status: PlanStatus,
    pub settings: Settings,
    /// The waking day the last counted check-in belongs to, and its count.
    pub today: Option<(NaiveDate, u32)>,
    pub last_checkin_at: Option<DateTime<Utc>>,
    /// Retryable send failures since the last successful send.
    pub attempts: u32,
    /// While `sending`: the delivery that claimed the plan. While paused `uncertain`:
    /// the delivery whose outcome is unknown (a late answer may still settle it).
    pub delivery_id: Option<String>,
    /// While `sending`: when the claim's lease ends (the plan is on the lease index
    /// until then, so a sweep finds it even if its delivery settled without it).
    pub lease_until: Option<DateTime<Utc>>,
    /// A refusal that arrived while the send was in flight: applied when it ends.
    pub pending_refusal: Option<Refusal>,
    /// The user checked in while the send was in flight: a sent reminder then
    /// schedules the next one at once (if a grant is there) instead of waiting.
    pub checked_in_while_sending: bool,
    /// The user accepted the template anew while the send was in flight (a report, or a
    /// check-in carrying the accept): when the send ends in WeChat's refusal (43101),
    /// that accept came after it, and the plan goes on with the grant it brought.
    pub accepted_while_sending: bool,
    /// Check-ins recorded in one minute, for the per-user rate limit: (the minute, as
    /// seconds since the epoch / 60, and how many).
    pub checkins_in_minute: Option<(i64, u32)>,
    /// The stored version this plan was read at; 0 when not stored yet.
    pub version: u64,
}

impl Plan {
    /// Counts a new check-in at `now` against `per_minute`; `Err` with the seconds until
    /// the next minute when this minute's are used up (the check-in is then refused and
    /// nothing is written).
    pub fn admit_checkin(&mut self, now: DateTime<Utc>, per_minute: u32) -> Result<(), u64> {
        let minute = now.timestamp().div_euclid(60);
        let count = match self.checkins_in_minute {
            Some((m, c)) if m == minute => c,
            _ => 0,
        };
        if count >= per_minute {
            let next = (minute + 1) * 60;
            return Err(u64::try_from(next - now.timestamp()).unwrap_or(60).max(1));
        }
        self.checkins_in_minute = Some((minute, count + 1));
        Ok(())
    }

    /// The plan a user has before ever touching the kind: off, with the kind's defaults.
    pub fn new(kind: &ReminderKind) -> Self {
        Self {
            kind: kind.name.clone(),
            template_id: kind.template_id.clone(),
            status: PlanStatus::Disabled,
            settings: kind.defaults,
            today: None,
            last_checkin_at: None,
            attempts: 0,
            delivery_id: None,
            lease_until: None,
            pending_refusal: None,
            checked_in_while_sending: false,
            accepted_while_sending: false,
            checkins_in_minute: None,
            version: 0,
        }
    }

    /// The next due instant counting from `anchor` (a check-in, or now): the next-due
    /// rule with the goal judged on `anchor`'s waking day (DESIGN.md §4).
    pub fn next_due(
        &self,
        anchor: DateTime<Utc>,
        daily_goal: u32,
        now: DateTime<Utc>,
    ) -> DateTime<Utc> {
        let schedule = self.settings.schedule;
        let reached = self.count_on(schedule.waking_day(anchor)) >= daily_goal;
        schedule.next_due_from(anchor, reached, now)
    }

    /// The user rejected or banned the template: the plan pauses — or, while a send is
    /// in flight, pauses as soon as that send ends; while it is off, it is remembered,
    /// so turning it on again finds it paused (until a new accept lifts it).
    pub fn refuse(&mut self, refusal: Refusal) -> Result<(), IllegalTransition> {
        match self.status {
            PlanStatus::Sending | PlanStatus::Disabled => self.pending_refusal = Some(refusal),
            PlanStatus::Scheduled { .. }
            | PlanStatus::AwaitingCheckin
            | PlanStatus::Paused { .. } => {
                self.status = self.status.apply(PlanEvent::Refused(refusal))?;
            }
        }
        Ok(())
    }

    /// The user turns the plan on, or saves its settings while it is on; `grant` says
    /// whether a grant is available. Never lifts a refusal, whatever grants are held.
    pub fn enable(&mut self, grant: bool, due: DateTime<Utc>) -> Result<(), IllegalTransition> {
        let before = self.status;
        self.status = before.apply(PlanEvent::Enable { grant, due })?;
        if before == PlanStatus::Disabled
            && let Some(refusal) = self.pending_refusal.take()
        {
            self.status = self.status.apply(PlanEvent::Refused(refusal))?;
        }
        self.resumed_from(before);
        Ok(())
    }

    /// The user turns the plan off: every unconsumed grant of its template is voided
    /// with it, so a refusal before it needs no remembering (any grant after it is a
    /// new accept).
    pub fn disable(&mut self) -> Result<(), IllegalTransition> {
        self.status = self.status.apply(PlanEvent::Disable)?;
        self.pending_refusal = None;
        Ok(())
    }

    /// The first application of a report that brings a grant the user just accepted:
    /// a paused plan resumes (a refusal included), and a refusal waiting for a send to
    /// end, or for the plan to be turned on, is lifted — the accept came after it.
    pub fn accepted(&mut self, due: DateTime<Utc>) -> Result<(), IllegalTransition> {
        self.pending_refusal = None;
        if self.status == PlanStatus::Sending {
            self.accepted_while_sending = true;
        }
        let before = self.status;
        self.status = before.apply(PlanEvent::GrantAdded { due })?;
        self.resumed_from(before);
        Ok(())
    }

    /// The first application of a report's `result` for the plan's template: an accept
    /// resumes it (due by the next-due rule from the last check-in, or now), a
    /// refusal pauses it, a filter changes nothing. Replays never come here (I3).
    pub fn reported(
        &mut self,
        result: SubscribeResult,
        now: DateTime<Utc>,
    ) -> Result<(), IllegalTransition> {
        if result.grants() {
            let anchor = self.last_checkin_at.unwrap_or(now);
            return self.accepted(self.next_due(anchor, self.settings.daily_goal, now));
        }
        match Refusal::of(result) {
            Some(refusal) => self.refuse(refusal),
            None => Ok(()),
        }
    }

    /// The user checked in, with `grant` on hand afterwards (see [`GrantOnHand`]); while
    /// a send is in flight it counts when the send ends.
    pub fn check_in(
        &mut self,
        grant: GrantOnHand,
        due: DateTime<Utc>,
    ) -> Result<(), IllegalTransition> {
        if grant == GrantOnHand::New {
            self.pending_refusal = None;
        }
        if self.status == PlanStatus::Sending {
            self.checked_in_while_sending = true;
            self.accepted_while_sending |= grant == GrantOnHand::New;
        }
        let before = self.status;
        self.status = before.apply(PlanEvent::CheckIn { grant, due })?;
        self.resumed_from(before);
        Ok(())
    }

    /// Whether the user has to accept the template again before the plan can send: no
    /// grant is available, or a refusal holds.
    pub fn needs_grant(&self, available_grants: u64) -> bool {
        let refused = match self.status {
            PlanStatus::Paused { reason } => reason.holds_until_accept(),
            PlanStatus::Disabled => self.pending_refusal.is_some(),
            PlanStatus::Scheduled { .. } | PlanStatus::Sending | PlanStatus::AwaitingCheckin => {
                false
            }
        };
        available_grants == 0 || refused
    }

    /// After a user's check-in or enable moved the plan from `before`: one that resumes
    /// a plan paused because its sends kept failing starts the count of failures afresh
    /// (else the first failure after it would pause it again).
    pub fn resumed_from(&mut self, before: PlanStatus) {
        let was_failing = before
            == PlanStatus::Paused {
                reason: PauseReason::SendFailed,
            };
        if was_failing && matches!(self.status, PlanStatus::Scheduled { .. }) {
            self.attempts = 0;
        }
    }

    /// Leaves `sending` once the send is settled: by the settlement's follow-up, then a
    /// check-in that arrived meanwhile (applied as if it came just after: with a grant
    /// `grant_available` it schedules the next reminder), then a refusal that arrived
    /// meanwhile.
    pub fn finish_send(
        &mut self,
        follow_up: FollowUp,
        attempts: u32,
        grant_available: bool,
        now: DateTime<Utc>,
    ) -> Result<(), IllegalTransition> {
        let schedule = self.settings.schedule;
        let event = match follow_up {
            FollowUp::Delivered => PlanEvent::Sent,
            // Never in the past (a released claim's own due instant may be), and
            // never in sleeping hours.
            FollowUp::RetryAt(at) => PlanEvent::RetryLater {
                due: schedule.first_awake_from(at.max(now)),
            },
            FollowUp::Stop(reason) => PlanEvent::SendStopped(reason),
        };
        let mut status = self.status.apply(event)?;
        // A new accept made during the send came after WeChat's answer to it: a plan
        // the send paused (43101's refusal included) goes on with its grant.
        if self.accepted_while_sending && grant_available {
            let anchor = self.last_checkin_at.unwrap_or(now);
            status = status.apply(PlanEvent::GrantAdded {
                due: self.next_due(anchor, self.settings.daily_goal, now),
            })?;
        }
        let after_send = status;
        let checked_in = self.checked_in_while_sending && self.last_checkin_at.is_some();
        if checked_in && let Some(at) = self.last_checkin_at {
            // Counted as a grant held: a refusal the send ends in (43101) holds until
            // the user's next accept.
            status = status.apply(PlanEvent::CheckIn {
                grant: GrantOnHand::of(false, grant_available),
                due: self.next_due(at, self.settings.daily_goal, now),
            })?;
        }
        if let Some(refusal) = self.pending_refusal.take() {
            status = status.apply(PlanEvent::Refused(refusal))?;
        }
        self.status = status;
        self.attempts = attempts;
        if checked_in {
            // The check-in made during the send resumes a plan its failures paused.
            self.resumed_from(after_send);
        }
        self.checked_in_while_sending = false;
        self.accepted_while_sending = false;
        self.lease_until = None;
        if !self.is_uncertain_about(self.delivery_id.as_deref().unwrap_or_default()) {
            self.delivery_id = None;
        }
        Ok(())
    }

    /// Whether the plan is paused `uncertain` because of `delivery_id`'s send.
    pub fn is_uncertain_about(&self, delivery_id: &str) -> bool {
        self.status
            == (PlanStatus::Paused {
                reason: PauseReason::Uncertain,
            })
            && self.delivery_id.as_deref() == Some(delivery_id)
    }

    /// A definite answer for `delivery_id` (claimed at `claimed_at`) arrived after the
    /// plan paused `uncertain` for it: the plan moves on as if the answer had come in
    /// time (the truth wins, I4) — and a check-in made since the claim counts, as one
    /// made during the send would. False, and nothing changes, if the plan has moved on
    /// since.
    pub fn settle_late(
        &mut self,
        delivery_id: &str,
        settlement: &Settlement,
        grant_available: bool,
        claimed_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool, IllegalTransition> {
        if !self.is_uncertain_about(delivery_id) {
            return Ok(false);
        }
        self.checked_in_while_sending = self.last_checkin_at.is_some_and(|at| at >= claimed_at);
        self.status = PlanStatus::Sending;
        // A retry needs a grant: with none left (the send's own stays void), the plan
        // waits for one rather than being scheduled to find none.
        let follow_up = match settlement.follow_up {
            FollowUp::RetryAt(_) if !grant_available => FollowUp::Stop(PauseReason::NeedsGrant),
            other => other,
        };
        self.finish_send(follow_up, settlement.attempts, grant_available, now)?;
        Ok(true)
    }

    /// Today's count as of `now` (zero once the waking day has turned).
    pub fn count_on(&self, day: NaiveDate) -> u32 {
        match self.today {
            Some((d, count)) if d == day => count,
            Some(_) | None => 0,
        }
    }

    /// Records a check-in's count for its waking day: a newer day replaces the count,
    /// the same day keeps the highest (an older, replayed action never lowers it), an
    /// older day changes nothing.
    pub fn record_count(&mut self, day: NaiveDate, count: u32) {
        self.today = match self.today {
            Some((d, c)) if d == day => Some((d, c.max(count))),
            Some((d, c)) if d > day => Some((d, c)),
            Some(_) | None => Some((day, count)),
        };
    }

    /// The API view of the plan at `now`, given the template's available grants.
    pub fn view(&self, available_grants: u64, now: DateTime<Utc>) -> PlanView {
        let schedule = &self.settings.schedule;
        let today = schedule.waking_day(now);
        PlanView {
            kind: self.kind.to_string(),
            state: self.status.name(),
            needs_grant: self.needs_grant(available_grants),
            next_due_at: self.status.due().map(|due| schedule.local_rfc3339(due)),
            pause_reason: self.status.pause_reason().map(PauseReason::as_str),
            template_id: self.template_id.to_string(),
            settings: SettingsView {
                interval_minutes: schedule.interval_minutes(),
                wake_time: schedule.wake_time().to_string(),
                sleep_time: schedule.sleep_time().to_string(),
                timezone: schedule.timezone().name().to_string(),
                daily_goal: self.settings.daily_goal,
            },
            today: TodayView {
                date: today.format("%Y-%m-%d").to_string(),
                count: self.count_on(today),
            },
        }
    }
}

/// `<plan>` of API.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanView {
    pub kind: String,
    pub state: &'static str,
    pub needs_grant: bool,
    pub next_due_at: Option<String>,
    pub pause_reason: Option<&'static str>,
    pub template_id: String,
    pub settings: SettingsView,
    pub today: TodayView,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingsView {
    pub interval_minutes: u32,
    pub wake_time: String,
    pub sleep_time: String,
    pub timezone: String,
    pub daily_goal: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TodayView {
    pub date: String,
    pub count: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap_or_default()
    }

    fn arb_event() -> impl Strategy<Value = PlanEvent> {
        let due = (0i64..2_000_000_000).prop_map(at);
        let reason = prop::sample::select(vec![
            PauseReason::NeedsGrant,
            PauseReason::Rejected,
            PauseReason::Banned,
            PauseReason::Uncertain,
            PauseReason::ConfigError,
            PauseReason::SendFailed,
            PauseReason::Refused,
        ]);
        let grant =
            prop::sample::select(vec![GrantOnHand::None, GrantOnHand::Held, GrantOnHand::New]);
        prop_oneof![
            (any::<bool>(), due.clone()).prop_map(|(grant, due)| PlanEvent::Enable { grant, due }),
            due.clone().prop_map(|due| PlanEvent::Reschedule { due }),
            Just(PlanEvent::Disable),
            (grant, due.clone()).prop_map(|(grant, due)| PlanEvent::CheckIn { grant, due }),
            due.clone().prop_map(|due| PlanEvent::GrantAdded { due }),
            Just(PlanEvent::Refused(Refusal::Reject)),
            Just(PlanEvent::Refused(Refusal::Ban)),
            Just(PlanEvent::Claimed),
            Just(PlanEvent::GrantMissing),
            Just(PlanEvent::Sent),
            due.prop_map(|due| PlanEvent::RetryLater { due }),
            reason.prop_map(PlanEvent::SendStopped),
        ]
    }

    proptest! {
        /// Whatever happens, the plan is in exactly one well-formed state: a schedule
        /// only with a grant event behind it, sending only after a claim, and an illegal
        /// event changes nothing.
        #[test]
        fn no_event_sequence_reaches_an_illegal_state(events in prop::collection::vec(arb_event(), 0..60)) {
            let mut status = PlanStatus::Disabled;
            for event in events {
                match status.apply(event) {
                    Ok(next) => {
                        match (status, event, next) {
                            (_, PlanEvent::Disable, n) => prop_assert_eq!(n, PlanStatus::Disabled),
                            (PlanStatus::Disabled, e, n) if !matches!(e, PlanEvent::Enable { .. }) => {
                                prop_assert_eq!(n, PlanStatus::Disabled, "only enabling leaves disabled")
                            }
                            (_, PlanEvent::Enable { grant: false, .. } | PlanEvent::CheckIn { grant: GrantOnHand::None, .. }, PlanStatus::Scheduled { .. }) => {
                                prop_assert!(matches!(status, PlanStatus::Scheduled { .. }), "scheduled without a grant")
                            }
                            (PlanStatus::Paused { reason }, e, PlanStatus::Scheduled { .. }) if reason.holds_until_accept() => {
                                prop_assert!(
                                    matches!(e, PlanEvent::GrantAdded { .. } | PlanEvent::CheckIn { grant: GrantOnHand::New, .. }),
                                    "a refusal lifted by {:?}, not a new accept", e
                                )
                            }
                            (prev, _, PlanStatus::Sending) => prop_assert!(
                                matches!(prev, PlanStatus::Sending) || event == PlanEvent::Claimed,
                                "sending without a claim"
                            ),
                            _ => {}
                        }
                        if let PlanStatus::Scheduled { due } = next {
                            prop_assert_eq!(next.due(), Some(due));
                        }
                        prop_assert_eq!(next.pause_reason().is_some(), matches!(next, PlanStatus::Paused { .. }));
                        status = next;
                    }
                    Err(err) => prop_assert_eq!(err.from, status),
                }
            }
        }
    }

    #[test]
    fn the_seed_loop_runs_enable_claim_send_checkin() {
        let due = at(1000);
        let s = PlanStatus::Disabled
            .apply(PlanEvent::Enable { grant: true, due })
            .and_then(|s| s.apply(PlanEvent::Claimed))
            .and_then(|s| s.apply(PlanEvent::Sent))
            .expect("legal");
        assert_eq!(s, PlanStatus::AwaitingCheckin);
        let next = at(2000);
        assert_eq!(
            s.apply(PlanEvent::CheckIn {
                grant: GrantOnHand::Held,
                due: next
            }),
            Ok(PlanStatus::Scheduled { due: next })
        );
        assert_eq!(
            s.apply(PlanEvent::CheckIn {
                grant: GrantOnHand::None,
                due: next
            }),
            Ok(PlanStatus::Paused {
                reason: PauseReason::NeedsGrant
            })
        );
    }

    #[test]
    fn dispatcher_events_outside_their_states_are_refused() {
        for event in [
            PlanEvent::Sent,
            PlanEvent::RetryLater { due: at(1) },
            PlanEvent::SendStopped(PauseReason::Uncertain),
        ] {
            assert!(PlanStatus::Scheduled { due: at(1) }.apply(event).is_err());
            assert!(PlanStatus::Disabled.apply(event).is_err());
        }
        assert!(
            PlanStatus::AwaitingCheckin
                .apply(PlanEvent::Claimed)
                .is_err()
        );
    }

    fn sending_plan() -> Plan {
        use crate::domain::schedule::{Schedule, TimeOfDay, Timezone};
        let schedule = Schedule::new(
            120,
            TimeOfDay::parse("00:00", "wake_time").expect("wake"),
            TimeOfDay::parse("23:59", "sleep_time").expect("sleep"),
            Timezone::parse("UTC").expect("zone"),
        )
        .expect("schedule");
        let kind = ReminderKind {
            name: KindName::parse("water").expect("kind"),
            template_id: TemplateId::parse("tmpl_water").expect("template"),
            defaults: Settings {
                schedule,
                daily_goal: 8,
            },
            content: Default::default(),
        };
        let mut plan = Plan::new(&kind);
        plan.status = PlanStatus::Sending;
        plan.delivery_id = Some("d1".into());
        plan.lease_until = Some(at(100));
        plan
    }

    #[test]
    fn a_user_resuming_a_plan_paused_for_failed_sends_starts_the_count_afresh() {
        let failing = PlanStatus::Paused {
            reason: PauseReason::SendFailed,
        };
        let resume = |before: PlanStatus, event: PlanEvent| {
            let mut plan = sending_plan();
            plan.status = before;
            plan.attempts = 3;
            plan.status = before.apply(event).expect("legal");
            plan.resumed_from(before);
            (plan.status, plan.attempts)
        };
        let check_in = PlanEvent::CheckIn {
            grant: GrantOnHand::Held,
            due: at(9),
        };
        assert_eq!(
            resume(failing, check_in),
            (PlanStatus::Scheduled { due: at(9) }, 0)
        );
        let enable = PlanEvent::Enable {
            grant: true,
            due: at(9),
        };
        assert_eq!(
            resume(failing, enable),
            (PlanStatus::Scheduled { due: at(9) }, 0)
        );
        // Without a grant it stays paused, and the count stands; other pauses keep it.
        let no_grant = PlanEvent::CheckIn {
            grant: GrantOnHand::None,
            due: at(9),
        };
        assert_eq!(resume(failing, no_grant).1, 3);
        let uncertain = PlanStatus::Paused {
            reason: PauseReason::Uncertain,
        };
        assert_eq!(resume(uncertain, check_in).1, 3);
        // A check-in made during the send that used up the attempts resumes it too.
        let mut plan = sending_plan();
        plan.checked_in_while_sending = true;
        plan.last_checkin_at = Some(at(50));
        plan.finish_send(FollowUp::Stop(PauseReason::SendFailed), 3, true, at(60))
            .expect("legal");
        assert!(
            matches!(plan.status, PlanStatus::Scheduled { .. }),
            "{:?}",
            plan.status
        );
        assert_eq!(plan.attempts, 0);
    }

    #[test]
    fn enabling_a_scheduled_plan_whose_grant_is_gone_pauses_it_for_a_grant() {
        let s = PlanStatus::Scheduled { due: at(5) }.apply(PlanEvent::Enable {
            grant: false,
            due: at(9),
        });
        assert_eq!(
            s,
            Ok(PlanStatus::Paused {
                reason: PauseReason::NeedsGrant
            })
        );
    }

    #[test]
    fn only_a_check_in_schedules_a_plan_that_was_sent() {
        assert_eq!(
            PlanStatus::AwaitingCheckin.apply(PlanEvent::GrantAdded { due: at(9) }),
            Ok(PlanStatus::AwaitingCheckin)
        );
        let mut plan = sending_plan();
        plan.finish_send(FollowUp::Delivered, 0, true, at(50))
            .expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::AwaitingCheckin,
            "no check-in, no schedule"
        );
        assert_eq!(
            (plan.delivery_id.as_deref(), plan.lease_until),
            (None, None)
        );

        let mut plan = sending_plan();
        plan.checked_in_while_sending = true;
        plan.last_checkin_at = Some(at(40));
        plan.finish_send(FollowUp::Delivered, 0, true, at(50))
            .expect("legal");
        assert!(
            matches!(plan.status, PlanStatus::Scheduled { .. }),
            "{:?}",
            plan.status
        );

        // A send that ends paused still counts the check-in that brought a grant.
        let mut paused = sending_plan();
        paused.checked_in_while_sending = true;
        paused.last_checkin_at = Some(at(40));
        paused
            .finish_send(FollowUp::Stop(PauseReason::Uncertain), 0, true, at(50))
            .expect("legal");
        assert!(matches!(paused.status, PlanStatus::Scheduled { .. }));
        assert_eq!(paused.delivery_id, None, "the plan moved on from that send");
        assert!(!plan.checked_in_while_sending);
    }

    #[test]
    fn a_refusal_during_a_send_pauses_the_plan_when_the_send_ends() {
        let mut plan = sending_plan();
        plan.refuse(Refusal::Reject).expect("legal");
        assert_eq!(plan.status, PlanStatus::Sending, "the send is left alone");
        plan.finish_send(FollowUp::RetryAt(at(60)), 1, true, at(50))
            .expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::Paused {
                reason: PauseReason::Rejected
            }
        );
        assert_eq!(plan.pending_refusal, None);
    }

    #[test]
    fn a_late_answer_moves_a_plan_paused_uncertain_by_its_own_delivery_only() {
        let policy = crate::domain::outcome::RetryPolicy {
            max_attempts: 3,
            retry_base: std::time::Duration::from_secs(60),
        };
        let sent = crate::domain::outcome::settle(
            crate::domain::outcome::OutcomeClass::Sent,
            Some(0),
            0,
            &policy,
            at(50),
        );
        let swept = crate::domain::outcome::settle(
            crate::domain::outcome::OutcomeClass::Unknown,
            None,
            0,
            &policy,
            at(50),
        );
        let mut plan = sending_plan();
        plan.finish_send(swept.follow_up, 0, false, at(50))
            .expect("legal");
        assert!(
            plan.is_uncertain_about("d1"),
            "the sweep keeps the delivery id"
        );
        let mut other = plan.clone();
        assert_eq!(
            other.settle_late("d2", &sent, false, at(0), at(60)),
            Ok(false)
        );
        assert_eq!(other, plan);
        assert_eq!(
            plan.settle_late("d1", &sent, false, at(0), at(60)),
            Ok(true)
        );
        assert_eq!(plan.status, PlanStatus::AwaitingCheckin);
        assert_eq!(plan.delivery_id, None);
    }

    #[test]
    fn refusals_pause_with_their_reason_and_a_grant_resumes() {
        let s = PlanStatus::Scheduled { due: at(5) }.apply(PlanEvent::Refused(Refusal::Ban));
        assert_eq!(
            s,
            Ok(PlanStatus::Paused {
                reason: PauseReason::Banned
            })
        );
        let resumed = s.and_then(|s| s.apply(PlanEvent::GrantAdded { due: at(9) }));
        assert_eq!(resumed, Ok(PlanStatus::Scheduled { due: at(9) }));
    }

    /// A refusal (reject, ban, WeChat's 43101) holds until the user accepts again:
    /// grants held from before it, a check-in without a new accept and a settings save
    /// leave the plan paused, and its view asks for a grant.
    #[test]
    fn a_refusal_holds_until_a_new_accept() {
        for reason in [
            PauseReason::Rejected,
            PauseReason::Banned,
            PauseReason::Refused,
        ] {
            let mut plan = sending_plan();
            plan.status = PlanStatus::Paused { reason };
            plan.delivery_id = None;
            plan.lease_until = None;
            plan.enable(true, at(9)).expect("legal");
            assert_eq!(
                plan.status,
                PlanStatus::Paused { reason },
                "a settings save"
            );
            plan.check_in(GrantOnHand::Held, at(9)).expect("legal");
            assert_eq!(
                plan.status,
                PlanStatus::Paused { reason },
                "a plain check-in"
            );
            assert!(
                plan.view(2, at(5)).needs_grant,
                "asks though grants are held"
            );
            plan.check_in(GrantOnHand::New, at(9)).expect("legal");
            assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
            assert!(!plan.view(2, at(5)).needs_grant);

            let mut reported = sending_plan();
            reported.status = PlanStatus::Paused { reason };
            reported.accepted(at(7)).expect("legal");
            assert_eq!(reported.status, PlanStatus::Scheduled { due: at(7) });
        }
        // Other pauses resume with a grant held, as before.
        let mut plan = sending_plan();
        plan.status = PlanStatus::Paused {
            reason: PauseReason::Uncertain,
        };
        plan.check_in(GrantOnHand::Held, at(9)).expect("legal");
        assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
    }

    /// A refusal while the plan is off is remembered: turning it on with grants from
    /// before finds it paused; a new accept in between lifts it; a disable forgets it.
    #[test]
    fn a_refusal_while_off_holds_when_the_plan_is_turned_on() {
        let off = || {
            let mut plan = sending_plan();
            plan.status = PlanStatus::Disabled;
            plan.delivery_id = None;
            plan.lease_until = None;
            plan.refuse(Refusal::Reject).expect("legal");
            assert_eq!(plan.status, PlanStatus::Disabled);
            assert!(plan.view(1, at(5)).needs_grant);
            plan
        };
        let mut plan = off();
        plan.enable(true, at(9)).expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::Paused {
                reason: PauseReason::Rejected
            }
        );
        let mut plan = off();
        plan.accepted(at(8)).expect("legal");
        plan.enable(true, at(9)).expect("legal");
        assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
        let mut plan = off();
        plan.disable().expect("legal");
        plan.enable(true, at(9)).expect("legal");
        assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
    }

    /// WeChat's 43101 answers a send claimed before the user's new accept: the plan
    /// goes on with that accept's grant, as the grant itself is spared.
    #[test]
    fn a_new_accept_during_a_send_refused_43101_resumes_the_plan() {
        let mut plan = sending_plan();
        plan.accepted(at(70)).expect("legal");
        assert_eq!(plan.status, PlanStatus::Sending, "the send is left alone");
        plan.finish_send(FollowUp::Stop(PauseReason::Refused), 0, true, at(50))
            .expect("legal");
        assert!(
            matches!(plan.status, PlanStatus::Scheduled { .. }),
            "{:?}",
            plan.status
        );
        assert!(!plan.accepted_while_sending);
        // Without the accept (a grant merely held), the refusal holds.
        let mut plan = sending_plan();
        plan.finish_send(FollowUp::Stop(PauseReason::Refused), 0, true, at(50))
            .expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::Paused {
                reason: PauseReason::Refused
            }
        );
    }

    /// A refusal and a new accept during one send: the later one wins when it ends.
    #[test]
    fn during_a_send_the_later_of_a_refusal_and_a_new_accept_wins() {
        let mut plan = sending_plan();
        plan.refuse(Refusal::Reject).expect("legal");
        plan.last_checkin_at = Some(at(40));
        plan.check_in(GrantOnHand::New, at(90)).expect("legal");
        plan.finish_send(FollowUp::Delivered, 0, true, at(50))
            .expect("legal");
        assert!(
            matches!(plan.status, PlanStatus::Scheduled { .. }),
            "{:?}",
            plan.status
        );

        let mut plan = sending_plan();
        plan.last_checkin_at = Some(at(40));
        plan.check_in(GrantOnHand::New, at(90)).expect("legal");
        plan.refuse(Refusal::Ban).expect("legal");
        plan.finish_send(FollowUp::Delivered, 0, true, at(50))
            .expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::Paused {
                reason: PauseReason::Banned
            }
        );
    }
}
