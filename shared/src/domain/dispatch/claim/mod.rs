//! Claiming a due entry: what it comes to ([`decide`]: sent, or [`Unsent`] and why),
//! whether the push behind it is still the one the entry names, and what a cancelled
//! claim's failed conditions mean. (A plan's own rule is
//! [`Plan::is_due_at`](crate::domain::reminders::plan::Plan::is_due_at).)

use chrono::{DateTime, Duration, Utc};

use crate::domain::settle::OutboxState;

mod decide;
mod unsent;

pub use decide::{ClaimDecision, ClaimFacts, Decide, PushFacts, Yielding, decide};
pub use unsent::{Tally, Unsent};

/// How far a due entry of a reminder kind this deployment does not configure (removed,
/// or a rollback) is moved ahead when a tick meets it: out of the head of its shard,
/// where it would be read (and skipped) every tick before anything due behind it. The
/// plan itself is untouched; when its kind is back, it goes out at most this late.
pub const NO_KIND_PARKING: Duration = Duration::hours(1);

/// Where a due entry of a kind not configured goes when met at `now`.
pub fn parked_until(now: DateTime<Utc>) -> DateTime<Utc> {
    now + NO_KIND_PARKING
}

/// Whether a push read for a due-index entry at `due` is still the one the entry names:
/// pending, and due at that very instant (`due_at`, epoch ms, as stored).
pub fn push_is_due_at(state: OutboxState, due_at: Option<i64>, due: DateTime<Utc>) -> bool {
    state == OutboxState::Pending && due_at == Some(due.timestamp_millis())
}

/// Which of a claim transaction's conditions failed. The transaction writes, in this
/// order, the claimed item (plan or push), the grant, the template's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimConditions {
    /// The plan or push is no longer as read.
    pub source: bool,
    /// The picked grant is no longer available.
    pub grant: bool,
    /// The counters changed since read.
    pub counters: bool,
}

/// What a cancelled claim means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefused {
    /// The item moved on (another dispatcher claimed it, or the user acted): not ours.
    Lost,
    /// The quota item listed the grant as available and it is not, while the counters
    /// agreed: the list is wrong for it, so the next tries pick from the ledger.
    ListWrong,
    /// The grant was taken or the counters changed meanwhile: read and pick again.
    PickAgain,
}

/// What the failed `conditions` of a claim of a grant that was `listed` (picked from
/// the quota item's list rather than the ledger) mean.
pub fn on_cancelled(conditions: ClaimConditions, listed: bool) -> ClaimRefused {
    if conditions.source {
        ClaimRefused::Lost
    } else if listed && conditions.grant && !conditions.counters {
        ClaimRefused::ListWrong
    } else {
        ClaimRefused::PickAgain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_of_a_kind_not_configured_is_moved_an_hour_ahead() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).expect("now");
        assert_eq!(parked_until(now) - now, Duration::hours(1));
    }

    #[test]
    fn a_push_is_due_only_pending_at_the_entrys_instant() {
        let due = DateTime::from_timestamp_millis(1_800_000_000_123).expect("instant");
        let ms = due.timestamp_millis();
        let cases = [
            (OutboxState::Pending, Some(ms), true),
            (OutboxState::Pending, Some(ms + 1), false),
            (OutboxState::Pending, None, false),
            (OutboxState::Sending, Some(ms), false),
            (OutboxState::Sent, Some(ms), false),
            (OutboxState::Skipped, Some(ms), false),
            (OutboxState::Failed, Some(ms), false),
            (OutboxState::Unknown, Some(ms), false),
        ];
        for (state, due_at, expected) in cases {
            assert_eq!(
                push_is_due_at(state, due_at, due),
                expected,
                "{state:?} {due_at:?}"
            );
        }
    }

    #[test]
    fn a_cancelled_claim_is_lost_only_when_its_item_moved() {
        let c = |source, grant, counters| ClaimConditions {
            source,
            grant,
            counters,
        };
        let cases = [
            // The item moved: lost, whatever else failed.
            (c(true, false, false), true, ClaimRefused::Lost),
            (c(true, true, true), false, ClaimRefused::Lost),
            // A listed grant refused while the counters agreed: the list is wrong.
            (c(false, true, false), true, ClaimRefused::ListWrong),
            // From the ledger, or the counters moved too: a race, pick again.
            (c(false, true, false), false, ClaimRefused::PickAgain),
            (c(false, true, true), true, ClaimRefused::PickAgain),
            (c(false, false, true), true, ClaimRefused::PickAgain),
            (c(false, false, false), true, ClaimRefused::PickAgain),
        ];
        for (conditions, listed, expected) in cases {
            assert_eq!(
                on_cancelled(conditions, listed),
                expected,
                "{conditions:?} listed={listed}"
            );
        }
    }
}
