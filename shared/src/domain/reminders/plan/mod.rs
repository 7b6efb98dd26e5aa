//! The reminder plan state machine (docs/design.md §3).
//!
//! A plan is in exactly one [`PlanStatus`]; the data a state needs travels inside it
//! (a scheduled plan always has its due instant, a paused one its reason), so an
//! inconsistent plan cannot be built. [`PlanStatus::apply`] is the only way to move,
//! and its match lists every (state, event) pair — no wildcard arms — so adding a state
//! or an event does not compile until every transition is decided.

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;

use crate::domain::consent::standing::Standing;
use crate::domain::consent::{GrantOnHand, PauseReason, Refusal};
use crate::domain::grants::SubscribeResult;
use crate::domain::ids::TemplateId;
use crate::domain::reminders::{KindName, ReminderKind, Settings};
use crate::domain::settle::{FollowUp, Settlement};

mod status;

pub use status::{IllegalTransition, PlanEvent, PlanStatus};

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
    /// rule with the goal judged on `anchor`'s waking day (docs/design.md §4).
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

    /// Whether a due-index entry at `due` still names this plan: it is scheduled at
    /// that very instant (claimed, moved or paused since, the entry is stale).
    pub fn is_due_at(&self, due: DateTime<Utc>) -> bool {
        self.status == PlanStatus::Scheduled { due }
    }

    /// Whether the plan is due by a due-index entry at `entry`: scheduled at that
    /// instant, or earlier — an entry moved ahead while its kind was not configured
    /// (the dispatcher's parking) brings the plan whose instant passed meanwhile.
    /// (Every write of the plan writes its entry at its own instant, so no other entry
    /// is later than its plan.)
    pub fn is_due_by(&self, entry: DateTime<Utc>) -> bool {
        matches!(self.status, PlanStatus::Scheduled { due } if due <= entry)
    }

    /// The instant a scheduled plan is due at (its own, whatever entry brought it).
    pub fn scheduled_at(&self) -> Option<DateTime<Utc>> {
        match self.status {
            PlanStatus::Scheduled { due } => Some(due),
            _ => None,
        }
    }

    /// The dispatcher claims the plan for delivery `delivery_id`, leased until
    /// `lease_until`: `sending`, the flags of the send before cleared.
    pub fn claimed(
        &self,
        delivery_id: &str,
        lease_until: DateTime<Utc>,
    ) -> Result<Self, IllegalTransition> {
        Ok(Self {
            status: self.status.apply(PlanEvent::Claimed)?,
            delivery_id: Some(delivery_id.to_string()),
            lease_until: Some(lease_until),
            pending_refusal: None,
            checked_in_while_sending: false,
            accepted_while_sending: false,
            ..self.clone()
        })
    }

    /// The plan as stored once its write (conditional on this version) commits.
    pub fn written(self) -> Self {
        Self {
            version: self.version + 1,
            ..self
        }
    }

    /// The user rejected or banned the template: the plan pauses — or, while a send is
    /// in flight, pauses as soon as that send ends; while it is off, it is remembered,
    /// so turning it on again finds it paused (until a new accept lifts it).
    pub fn refuse(&mut self, refusal: Refusal) -> Result<(), IllegalTransition> {
        match self.status {
            PlanStatus::Sending | PlanStatus::Disabled => {
                self.pending_refusal = Some(match self.pending_refusal {
                    Some(remembered) => remembered.then(refusal),
                    None => refusal,
                });
            }
            PlanStatus::Scheduled { .. }
            | PlanStatus::AwaitingCheckin
            | PlanStatus::Paused { .. } => {
                self.status = self.status.apply(PlanEvent::Refused(refusal))?;
            }
        }
        Ok(())
    }

    /// The template's standing choice in the user's settings, as a report or check-in
    /// carried it (`None`: no choice kept): a refusing one pauses the plan as a refusal
    /// does (remembered while off or sending); otherwise a pause for a standing choice
    /// becomes the refusal it was, which holds until a new accept.
    pub fn stand(&mut self, standing: Option<Standing>) -> Result<(), IllegalTransition> {
        match standing.and_then(Standing::refusal) {
            Some(refusal) => self.refuse(refusal),
            None => {
                self.status = self.status.apply(PlanEvent::StandingLifted)?;
                self.pending_refusal = self.pending_refusal.map(Refusal::lifted);
                Ok(())
            }
        }
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
    /// new accept) — but for a standing choice of the user's settings, which is kept.
    pub fn disable(&mut self) -> Result<(), IllegalTransition> {
        // A standing choice is about the user's settings, not grants: it is kept, so
        // turning the plan on again finds it paused until the setting changes.
        let standing = match self.status {
            PlanStatus::Paused { reason } => Refusal::standing_of(reason),
            _ => None,
        }
        .or(self.pending_refusal.filter(|r| r.is_standing()));
        self.status = self.status.apply(PlanEvent::Disable)?;
        self.pending_refusal = standing;
        Ok(())
    }

    /// The first application of a report that brings a grant the user just accepted:
    /// a paused plan resumes (a refusal included), and a refusal waiting for a send to
    /// end, or for the plan to be turned on, is lifted — the accept came after it. A
    /// standing choice holds (only the setting changing lifts it).
    pub fn accepted(&mut self, due: DateTime<Utc>) -> Result<(), IllegalTransition> {
        self.pending_refusal = self.pending_refusal.filter(|r| r.is_standing());
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
        match result.refusal() {
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
            self.pending_refusal = self.pending_refusal.filter(|r| r.is_standing());
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
    /// grant is available, or a refusal holds — but never while a standing choice of
    /// the user's settings refuses it (asking is pointless until the setting changes).
    pub fn needs_grant(&self, available_grants: u64) -> bool {
        let (refused, standing) = match self.status {
            PlanStatus::Paused { reason } => (reason.holds_until_accept(), reason.is_standing()),
            PlanStatus::Disabled => (
                self.pending_refusal.is_some(),
                self.pending_refusal.is_some_and(Refusal::is_standing),
            ),
            PlanStatus::Scheduled { .. } | PlanStatus::Sending | PlanStatus::AwaitingCheckin => {
                (false, false)
            }
        };
        !standing && (available_grants == 0 || refused)
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
mod tests;
