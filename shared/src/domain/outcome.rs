//! What became of a publisher's push, told back to the publisher: one outcome per end
//! of a push (`sent`, `failed`, `expired`, `cancelled`, `replaced`, `muted`, `skipped`,
//! `capped`, `rejected`, `unknown`, and a later settlement of an `unknown`), written in
//! the same transaction as the status change and delivered at least once, retried with
//! backoff for a day. Pure: which statuses are ends, an outcome's id and body, when a
//! failed delivery is tried again and when it is given up.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use super::inbox::PushStatus;

/// How long a delivery is retried before it is dead-lettered.
pub const GIVE_UP_AFTER: Duration = Duration::hours(24);

/// The first retry's wait; each later one doubles it, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::seconds(30);
pub const MAX_BACKOFF: Duration = Duration::minutes(30);

/// The partitions of the due index each publisher's outcomes wait on
/// (`OUTCOME#<publisher>#<n>`).
pub const SHARDS: u32 = 4;

/// Whether a push reaching `status` has an outcome to tell: every status but
/// `pending` (a push still on its way).
pub fn is_told(status: PushStatus) -> bool {
    status != PushStatus::Pending
}

/// An outcome's id: stable across redeliveries, one per (notification, status) — a
/// push reaches each status at most once.
pub fn outcome_id(note_id: &str, status: PushStatus) -> String {
    format!("{note_id}.{}", status.as_str())
}

/// An outcome as its publisher receives it (the webhook's body, the bus event's detail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub outcome_id: String,
    pub source: String,
    pub idempotency_key: String,
    pub openid: String,
    pub note_id: String,
    pub status: String,
    pub reason: Option<String>,
    /// When the push reached the status (RFC 3339, UTC).
    pub at: String,
}

/// Whether an outcome first due at `first_at` is past its day of tries at `now`: given
/// up at its next failure, or when its publisher's webhook fails on another first (so
/// a dead webhook's backlog is given up within the tick that reads it, not one a tick).
pub fn given_up(first_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now - first_at >= GIVE_UP_AFTER
}

/// When a delivery that failed for the `attempts`-th time is tried again, or `None`
/// when the outcome, first due at `first_at`, is given up (dead-lettered) at `now`.
pub fn retry_at(
    attempts: u32,
    first_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    if given_up(first_at, now) {
        return None;
    }
    let doublings = attempts.saturating_sub(1).min(16);
    let wait = (FIRST_BACKOFF * 2_i32.pow(doublings)).min(MAX_BACKOFF);
    Some(now + wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::at;

    #[test]
    fn every_status_but_pending_is_told() {
        assert!(!is_told(PushStatus::Pending));
        for status in [
            PushStatus::Sent,
            PushStatus::Failed,
            PushStatus::Unknown,
            PushStatus::Expired,
            PushStatus::Cancelled,
            PushStatus::Replaced,
            PushStatus::Muted,
            PushStatus::Skipped,
            PushStatus::Capped,
            PushStatus::Rejected,
        ] {
            assert!(is_told(status), "{status:?}");
        }
        assert_eq!(outcome_id("n1", PushStatus::Sent), "n1.sent");
        assert_ne!(
            outcome_id("n1", PushStatus::Unknown),
            outcome_id("n1", PushStatus::Sent),
            "an unknown and its settlement are two outcomes"
        );
    }

    #[test]
    fn a_failed_delivery_backs_off_doubling_and_is_given_up_after_a_day() {
        let first = at("2026-12-07T00:00:00Z");
        let waits: Vec<i64> = (1..=9)
            .map(|n| (retry_at(n, first, first).expect("within the day") - first).num_seconds())
            .collect();
        assert_eq!(waits, [30, 60, 120, 240, 480, 960, 1800, 1800, 1800]);
        let nearly = first + GIVE_UP_AFTER - Duration::seconds(1);
        assert!(
            retry_at(40, first, nearly).is_some(),
            "tried for at least a day"
        );
        assert_eq!(retry_at(40, first, first + GIVE_UP_AFTER), None);
        assert!(given_up(first, first + GIVE_UP_AFTER));
        assert!(!given_up(
            first,
            first + GIVE_UP_AFTER - Duration::seconds(1)
        ));
        // Enough tries in a day: 7 doubling, then every 30 minutes.
        let mut now = first;
        let mut tries = 0;
        while let Some(next) = retry_at(tries + 1, first, now) {
            tries += 1;
            now = next;
        }
        assert!((50..60).contains(&tries), "{tries}");
    }
}
