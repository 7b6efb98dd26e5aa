//! The plan's states and the only way to move between them ([`PlanStatus::apply`]).

use chrono::{DateTime, Utc};

use crate::domain::consent::{GrantOnHand, PauseReason, Refusal};

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
    /// The user rejected or banned the template, once or as a standing choice.
    Refused(Refusal),
    /// The user's settings no longer keep the standing choice a plan paused for.
    StandingLifted,
    /// A dispatcher claimed the due plan.
    Claimed,
    /// The dispatcher found no grant to reserve.
    GrantMissing,
    /// The dispatcher found the user's daily cap reached: due again at `due`, on their
    /// next day.
    Capped { due: DateTime<Utc> },
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
                // A standing choice holds until the setting changes, whatever comes.
                Paused { reason } if reason.is_standing() => Ok(self),
                Paused { reason } if reason.holds_until_accept() => match grant {
                    GrantOnHand::New => Ok(Scheduled { due }),
                    GrantOnHand::Held | GrantOnHand::None => Ok(self),
                },
                Paused { .. } if grant.any() => Ok(Scheduled { due }),
                // A failure stays visible until a grant arrives.
                Paused { .. } => Ok(self),
            },
            PlanEvent::GrantAdded { due } => match self {
                // A standing choice holds until the setting changes (an accept cannot
                // come while it stands: one that does came with a setting not read).
                Paused { reason } if reason.is_standing() => Ok(self),
                // A new accept: it lifts a refusal too.
                Paused { .. } => Ok(Scheduled { due }),
                // A sent reminder waits for the check-in (§3): only a check-in brings
                // the next one, whatever grants arrive meanwhile.
                Disabled | Scheduled { .. } | Sending | AwaitingCheckin => Ok(self),
            },
            PlanEvent::Refused(refusal) => {
                let reason = refusal.reason();
                match self {
                    // A standing choice is not replaced by a one-time refusal: it says
                    // more (asking is pointless until the setting changes).
                    Paused { reason: current }
                        if current.is_standing() && !reason.is_standing() =>
                    {
                        Ok(self)
                    }
                    Scheduled { .. } | AwaitingCheckin | Paused { .. } => Ok(Paused { reason }),
                    // Off stays off; an in-flight send finalizes by its own outcome, then
                    // the refusal applies (see `Plan::refuse`).
                    Disabled | Sending => Ok(self),
                }
            }
            PlanEvent::StandingLifted => match self {
                // The refusal it was holds until a new accept.
                Paused { reason } => Ok(Paused {
                    reason: reason.lifted(),
                }),
                Disabled | Scheduled { .. } | Sending | AwaitingCheckin => Ok(self),
            },
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
            PlanEvent::Capped { due } => match self {
                Scheduled { .. } => Ok(Scheduled { due }),
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
