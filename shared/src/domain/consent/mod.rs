//! Consent: a user's refusal of a template and what may lift it (docs/design.md §3).
//!
//! A refusal — `reject` or `ban` in a report or check-in, a popup event, or WeChat's
//! 43101 on a send — pauses the plans of the template's kinds and holds until a grant
//! the user accepts after it ([`GrantOnHand::New`]). Both the plan state machine and
//! the outcome table use these types; neither is imported by this module.

use serde::{Deserialize, Serialize};

pub mod standing;

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
    /// The user's settings keep `reject` for the template ("always keep"): asking is
    /// pointless until the setting changes.
    AlwaysRejected,
    /// The user's settings keep `ban` for the template.
    AlwaysBanned,
    /// The user's main switch of subscriptions is off.
    MainSwitchOff,
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
            Self::AlwaysRejected => "always_rejected",
            Self::AlwaysBanned => "always_banned",
            Self::MainSwitchOff => "main_switch_off",
        }
    }

    /// Whether the pause is a standing choice of the user's settings
    /// ([`standing::Standing`]): asking for a grant is pointless while it holds.
    pub fn is_standing(self) -> bool {
        match self {
            Self::AlwaysRejected | Self::AlwaysBanned | Self::MainSwitchOff => true,
            Self::NeedsGrant
            | Self::Rejected
            | Self::Banned
            | Self::Uncertain
            | Self::ConfigError
            | Self::SendFailed
            | Self::Refused => false,
        }
    }

    /// The pause once the standing choice behind it is gone from the user's settings:
    /// the refusal it was, which holds until a new accept.
    pub fn lifted(self) -> Self {
        match self {
            Self::AlwaysRejected | Self::MainSwitchOff => Self::Rejected,
            Self::AlwaysBanned => Self::Banned,
            other => other,
        }
    }

    /// Whether the pause is a refusal, which holds until the user accepts the template
    /// again: only a grant accepted after it resumes the plan — never a grant recorded
    /// before it, a plain check-in, a settings save or a replay. (A standing choice
    /// holds longer: only the setting changing lifts it, see [`Self::is_standing`].)
    pub fn holds_until_accept(self) -> bool {
        match self {
            Self::Rejected
            | Self::Banned
            | Self::Refused
            | Self::AlwaysRejected
            | Self::AlwaysBanned
            | Self::MainSwitchOff => true,
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
            "always_rejected" => Self::AlwaysRejected,
            "always_banned" => Self::AlwaysBanned,
            "main_switch_off" => Self::MainSwitchOff,
            _ => return None,
        })
    }
}

/// A user's refusal of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Reject,
    Ban,
    /// The settings keep `reject` ([`standing::Standing::Reject`]).
    AlwaysReject,
    /// The settings keep `ban`.
    AlwaysBan,
    /// The settings' main switch is off.
    MainSwitchOff,
}

impl Refusal {
    /// The refusal as a plan stores it while a send is in flight.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Ban => "ban",
            Self::AlwaysReject => "always_reject",
            Self::AlwaysBan => "always_ban",
            Self::MainSwitchOff => "main_switch_off",
        }
    }

    /// A refusal as a plan stores it, read back.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Reject,
            Self::Ban,
            Self::AlwaysReject,
            Self::AlwaysBan,
            Self::MainSwitchOff,
        ]
        .into_iter()
        .find(|refusal| refusal.as_str() == name)
    }

    /// The pause it makes.
    pub fn reason(self) -> PauseReason {
        match self {
            Self::Reject => PauseReason::Rejected,
            Self::Ban => PauseReason::Banned,
            Self::AlwaysReject => PauseReason::AlwaysRejected,
            Self::AlwaysBan => PauseReason::AlwaysBanned,
            Self::MainSwitchOff => PauseReason::MainSwitchOff,
        }
    }

    /// Whether it is a standing choice of the user's settings.
    pub fn is_standing(self) -> bool {
        self.reason().is_standing()
    }

    /// The standing refusal a pause for a standing choice stands for.
    pub fn standing_of(reason: PauseReason) -> Option<Self> {
        match reason {
            PauseReason::AlwaysRejected => Some(Self::AlwaysReject),
            PauseReason::AlwaysBanned => Some(Self::AlwaysBan),
            PauseReason::MainSwitchOff => Some(Self::MainSwitchOff),
            PauseReason::NeedsGrant
            | PauseReason::Rejected
            | PauseReason::Banned
            | PauseReason::Uncertain
            | PauseReason::ConfigError
            | PauseReason::SendFailed
            | PauseReason::Refused => None,
        }
    }

    /// The refusal once the standing choice behind it is gone (see
    /// [`PauseReason::lifted`]).
    pub fn lifted(self) -> Self {
        match self {
            Self::AlwaysReject | Self::MainSwitchOff => Self::Reject,
            Self::AlwaysBan => Self::Ban,
            Self::Reject | Self::Ban => self,
        }
    }

    /// The refusal kept when `self` is remembered and `next` arrives: a standing
    /// choice is not replaced by a one-time refusal (it says more: asking is pointless).
    pub fn then(self, next: Self) -> Self {
        if self.is_standing() && !next.is_standing() {
            self
        } else {
            next
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
