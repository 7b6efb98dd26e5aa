//! What a WeChat send's answer means for the delivery, the grant and the plan
//! (docs/design.md §5). Pure: the WeChat client classifies an answer ([`SendResult::class`]),
//! [`settle`] turns the class into what happens to the delivery, the grant and the
//! claimed item, and the store only writes that down. Below both the dispatch and what
//! it settles (the inbox's pushes, the plans, the reconcile of sent events).

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::consent::PauseReason;
use crate::domain::grants::GrantState;

mod states;

pub use states::{DeliveryState, OutboxState};

/// How a send ended, as far as onegrant can know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendResult {
    /// errcode 0: WeChat took the message. `msgid` is a u64 kept as a string.
    Sent { msgid: Option<String> },
    /// WeChat answered an errcode (after at most one token refetch and retry).
    Refused { errcode: i64, errmsg: String },
    /// No readable answer: timeout, reset, 5xx, unparseable. The message may have gone.
    Uncertain { reason: String },
    /// The request never left (no token, no connection): certainly not delivered.
    NotSent { reason: String },
    /// The message could not be built (a keyword value no truncation can make valid):
    /// never sent; needs the content or template configuration fixed.
    Invalid { reason: String },
}

/// WeChat's definite answer kept on its delivery when the settlement could not commit
/// in time, for the sweep to settle by instead of `unknown` (I4: the record never
/// contradicts WeChat). An uncertain answer has nothing to keep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum KeptAnswer {
    Sent {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        msgid: Option<String>,
    },
    /// (WeChat's errmsg is not kept: it carries a request id, and settling needs the
    /// errcode alone.)
    Refused {
        errcode: i64,
    },
    NotSent {
        reason: String,
    },
    Invalid {
        reason: String,
    },
}

impl KeptAnswer {
    /// What of `result` is worth keeping (nothing of an uncertain one).
    pub fn of(result: &SendResult) -> Option<Self> {
        let short = |text: &str| text.chars().take(200).collect::<String>();
        match result {
            SendResult::Sent { msgid } => Some(Self::Sent {
                msgid: msgid.clone(),
            }),
            SendResult::Refused { errcode, .. } => Some(Self::Refused { errcode: *errcode }),
            SendResult::NotSent { reason } => Some(Self::NotSent {
                reason: short(reason),
            }),
            SendResult::Invalid { reason } => Some(Self::Invalid {
                reason: short(reason),
            }),
            SendResult::Uncertain { .. } => None,
        }
    }

    /// The answer as a send result again.
    pub fn result(&self) -> SendResult {
        match self.clone() {
            Self::Sent { msgid } => SendResult::Sent { msgid },
            Self::Refused { errcode } => SendResult::Refused {
                errcode,
                errmsg: String::new(),
            },
            Self::NotSent { reason } => SendResult::NotSent { reason },
            Self::Invalid { reason } => SendResult::Invalid { reason },
        }
    }
}

/// The outcome classes of docs/design.md §5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// Delivered: delivery `sent`, grant `consumed`, plan awaits the check-in.
    Sent,
    /// Busy or throttled (-1, 45011, 43108, 45009, and token errors that persist): the
    /// grant is restored and the plan retried with backoff, paused after N attempts.
    Retryable,
    /// Template, page or content rejected (47003, 40037, 41030, 45168, 43107, 48001, and
    /// any errcode we do not know): grant restored, plan paused `config_error`, loudly.
    Config,
    /// 43101: the user has no quota WeChat recognises. This grant and every other
    /// available grant of the template become invalid; plan paused `refused` until the
    /// user accepts again.
    Refused,
    /// 40003, 50002: the openid is invalid or the user frozen. Grant invalid, plan paused.
    User,
    /// Outcome unknown: delivery `unknown`, grant invalid, plan paused `uncertain`,
    /// never resent automatically (I4).
    Unknown,
}

impl OutcomeClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Retryable => "retryable",
            Self::Config => "config",
            Self::Refused => "refused",
            Self::User => "user",
            Self::Unknown => "unknown",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "sent" => Self::Sent,
            "retryable" => Self::Retryable,
            "config" => Self::Config,
            "refused" => Self::Refused,
            "user" => Self::User,
            "unknown" => Self::Unknown,
            _ => return None,
        })
    }
}

/// Concurrent sends to one openid: WeChat refused this one because another was in
/// flight. Not the message's fault, so it never spends an attempt.
pub const CONCURRENT_SEND_ERRCODE: i64 = 43108;

/// Token errcodes: refetch the token (normal mode) and retry once.
pub const TOKEN_ERRCODES: [i64; 3] = [40001, 40014, 42001];

impl SendResult {
    pub fn class(&self) -> OutcomeClass {
        match self {
            Self::Sent { .. } => OutcomeClass::Sent,
            Self::Uncertain { .. } => OutcomeClass::Unknown,
            Self::NotSent { .. } => OutcomeClass::Retryable,
            Self::Invalid { .. } => OutcomeClass::Config,
            Self::Refused { errcode, .. } => match errcode {
                -1 | 45011 | 43108 | 45009 | 40001 | 40014 | 42001 => OutcomeClass::Retryable,
                43101 => OutcomeClass::Refused,
                40003 | 50002 => OutcomeClass::User,
                47003 | 40037 | 41030 | 45168 | 43107 | 48001 => OutcomeClass::Config,
                _ => OutcomeClass::Config,
            },
        }
    }

    /// The errcode to record, if WeChat answered one.
    pub fn errcode(&self) -> Option<i64> {
        match self {
            Self::Sent { .. } => Some(0),
            Self::Refused { errcode, .. } => Some(*errcode),
            Self::Uncertain { .. } | Self::NotSent { .. } | Self::Invalid { .. } => None,
        }
    }
}

/// How failed sends are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts (retryable failures in a row) after which the item stops.
    pub max_attempts: u32,
    /// The first retry's delay; doubled per attempt, at most [`MAX_RETRY_DELAY`].
    pub retry_base: StdDuration,
}

/// The longest wait between two attempts.
pub const MAX_RETRY_DELAY: Duration = Duration::hours(6);

impl Default for RetryPolicy {
    /// `DISPATCH_MAX_ATTEMPTS` and `DISPATCH_RETRY_BASE_SECONDS` unset: 5 attempts, a
    /// minute first.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            retry_base: StdDuration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry `attempt` (1-based): the base, doubled per attempt.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = Duration::from_std(self.retry_base).unwrap_or(Duration::minutes(1));
        (base * 2i32.saturating_pow(attempt.saturating_sub(1).min(10))).min(MAX_RETRY_DELAY)
    }
}

/// What happens next to the claimed item (plan or push) after a settled send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowUp {
    /// WeChat took the message: the plan awaits the check-in, the push is done.
    Delivered,
    /// A definite non-send worth retrying: due again at (the first waking instant
    /// from) this instant.
    RetryAt(DateTime<Utc>),
    /// Stop: the plan pauses with this reason; the push ends `failed` (or `unknown`).
    Stop(PauseReason),
}

/// What a send's outcome does to the delivery, its grant and the claimed item: one row
/// of docs/design.md §5, with the attempt count and retry time filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    pub class: OutcomeClass,
    pub delivery: DeliveryState,
    /// Where the reserved grant goes: consumed, back to available, or invalid.
    pub grant: GrantState,
    /// 43101: every other available grant of the template is void too.
    pub invalidate_others: bool,
    /// Retryable failures in a row after this one.
    pub attempts: u32,
    pub follow_up: FollowUp,
}

/// The outcome table (docs/design.md §5) as a function: a send of `class` (WeChat's
/// `errcode`, if it answered one) on an item that had failed `attempts` times in a row.
pub fn settle(
    class: OutcomeClass,
    errcode: Option<i64>,
    attempts: u32,
    policy: &RetryPolicy,
    now: DateTime<Utc>,
) -> Settlement {
    let row = |delivery, grant, attempts, follow_up| Settlement {
        class,
        delivery,
        grant,
        invalidate_others: class == OutcomeClass::Refused,
        attempts,
        follow_up,
    };
    match class {
        OutcomeClass::Sent => row(
            DeliveryState::Sent,
            GrantState::Consumed,
            0,
            FollowUp::Delivered,
        ),
        OutcomeClass::Retryable => {
            // A concurrent send to the same user is contention, not a failure.
            let spent = u32::from(errcode != Some(CONCURRENT_SEND_ERRCODE));
            let attempts = attempts.saturating_add(spent);
            let follow_up = if attempts >= policy.max_attempts {
                FollowUp::Stop(PauseReason::SendFailed)
            } else {
                FollowUp::RetryAt(now + policy.delay(attempts.max(1)))
            };
            row(
                DeliveryState::Failed,
                GrantState::Available,
                attempts,
                follow_up,
            )
        }
        OutcomeClass::Config => row(
            DeliveryState::Failed,
            GrantState::Available,
            attempts,
            FollowUp::Stop(PauseReason::ConfigError),
        ),
        OutcomeClass::Refused => row(
            DeliveryState::Failed,
            GrantState::Invalid,
            attempts,
            FollowUp::Stop(PauseReason::Refused),
        ),
        OutcomeClass::User => row(
            DeliveryState::Failed,
            GrantState::Invalid,
            attempts,
            FollowUp::Stop(PauseReason::SendFailed),
        ),
        OutcomeClass::Unknown => row(
            DeliveryState::Unknown,
            GrantState::Invalid,
            attempts,
            FollowUp::Stop(PauseReason::Uncertain),
        ),
    }
}

/// A claim given back unsent, for want of time (the invocation's budget, or a process
/// that stalled after claiming): the grant is restored and the item is due again at
/// `due`, its own due instant. Not the message's fault, so no attempt is spent.
pub fn release(attempts: u32, due: DateTime<Utc>) -> Settlement {
    Settlement {
        class: OutcomeClass::Retryable,
        delivery: DeliveryState::Failed,
        grant: GrantState::Available,
        invalidate_others: false,
        attempts,
        follow_up: FollowUp::RetryAt(due),
    }
}

impl Settlement {
    /// Where a grant the sweep voided goes when this settlement comes after the sweep
    /// (a late answer): spent if WeChat took the message; back to `available` if it
    /// certainly did not and `may_restore` (nothing voided it on purpose since, as a
    /// disable does); else it stays void (None).
    pub fn after_sweep(&self, may_restore: bool) -> Option<GrantState> {
        match self.grant {
            GrantState::Consumed => Some(GrantState::Consumed),
            GrantState::Available if may_restore => Some(GrantState::Available),
            GrantState::Available | GrantState::Invalid | GrantState::Reserved => None,
        }
    }

    /// When the item is due again, if it is retried.
    pub fn retry_at(&self) -> Option<DateTime<Utc>> {
        match self.follow_up {
            FollowUp::RetryAt(at) => Some(at),
            FollowUp::Delivered | FollowUp::Stop(_) => None,
        }
    }

    /// The push's state after this settlement.
    pub fn outbox_state(&self) -> OutboxState {
        match self.follow_up {
            FollowUp::Delivered => OutboxState::Sent,
            FollowUp::RetryAt(_) => OutboxState::Pending,
            FollowUp::Stop(PauseReason::Uncertain) => OutboxState::Unknown,
            FollowUp::Stop(
                PauseReason::NeedsGrant
                | PauseReason::Rejected
                | PauseReason::Banned
                | PauseReason::ConfigError
                | PauseReason::SendFailed
                | PauseReason::Refused
                | PauseReason::AlwaysRejected
                | PauseReason::AlwaysBanned
                | PauseReason::MainSwitchOff,
            ) => OutboxState::Failed,
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod settle_tests;
