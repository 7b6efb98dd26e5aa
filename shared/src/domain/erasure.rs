//! Forgetting a user: what an erasure deletes, in which order, what it waits for, and
//! what its tombstone refuses afterwards. Pure.
//!
//! An erasure starts with its tombstone — keyed by the openid's tag, salted per
//! deployment ([`subject`]), never the openid itself once done — and from then on
//! refuses what would store anything for the user: a session token issued before it,
//! a publisher's event, WeChat's events. Its steps then delete the user's partition in
//! bounded pages: first what the dispatcher could still act on (plans, scheduled and
//! waiting pushes, recorded WeChat events: the items on the due and lease indexes), so
//! nothing more is claimed; then, once no send is in flight (a send in flight settles
//! first, never resent), everything else. A user who signs in after it is done starts
//! an empty account, and their data is stored again.

use chrono::{DateTime, Duration, Utc};
use hmac::{Hmac, KeyInit, Mac};
use sha2_jwt::Sha256;

use crate::domain::ids::OpenId;

/// Why an erasure was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErasureCause {
    /// The user asked (`DELETE /v1/me`).
    Request,
    /// An operator, for a request received another way.
    Operator,
    /// WeChat's `user_authorization_revoke`: the user withdrew the mini-program's
    /// authorisation.
    Revoked,
    /// WeChat's `user_authorization_cancellation`: the user closed their account.
    AccountClosed,
    /// No use for `INACTIVE_USER_DAYS`.
    Inactive,
}

impl ErasureCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Operator => "operator",
            Self::Revoked => "authorization_revoked",
            Self::AccountClosed => "account_closed",
            Self::Inactive => "inactive",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [
            Self::Request,
            Self::Operator,
            Self::Revoked,
            Self::AccountClosed,
            Self::Inactive,
        ]
        .into_iter()
        .find(|cause| cause.as_str() == value)
    }
}

/// The tag of `openid` under this deployment's `salt`: HMAC-SHA256, hex. The same
/// openid has another tag in another deployment, and a tag cannot be turned back into
/// an openid without the salt.
pub fn subject(salt: &str, openid: &OpenId) -> String {
    tag(salt, openid.as_str())
}

/// The salted tag of any `text` naming a user (an event's key), for an item kept
/// outside the user's partition that must be matched but never name them.
pub fn tag(salt: &str, text: &str) -> String {
    // (HMAC takes a key of any length.)
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(salt.as_bytes()) else {
        return String::new();
    };
    mac.update(text.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// How far an erasure has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErasureState {
    /// Started: its steps run until the partition is empty.
    Pending,
    /// Every item of the user's is gone.
    Done,
}

impl ErasureState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "pending" => Some(Self::Pending),
            "done" => Some(Self::Done),
            _ => None,
        }
    }
}

/// An erasure's tombstone, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    pub erased_at: DateTime<Utc>,
    pub state: ErasureState,
    /// The user signed in again after it was done, and used the new session: their
    /// data is stored again.
    pub reopened: bool,
}

impl Tombstone {
    /// Whether a session token issued at `issued_at` (epoch seconds, as its `iat`)
    /// stands: only one issued after the erasure began (a token of the same second is
    /// refused: it may be older), and only once it is done (nothing is stored for the
    /// user while it runs).
    pub fn admits_token(&self, issued_at: i64) -> bool {
        self.state == ErasureState::Done && issued_at > self.erased_at.timestamp()
    }

    /// Whether a request with a token issued at `issued_at` reopens the account: the
    /// erasure done, the token newer than it.
    pub fn reopened_by(&self, issued_at: i64) -> bool {
        self.state == ErasureState::Done && !self.reopened && self.admits_token(issued_at)
    }

    /// Whether anything may be stored for the user (a publisher's event, WeChat's):
    /// only once they came back.
    pub fn admits_data(&self) -> bool {
        self.reopened
    }

    /// Whether WeChat's push asking that the user be forgotten, created at
    /// `create_time` (epoch seconds) and with its nonce spent (a retry of an attempt
    /// that failed after recording it, or a replay), begins an erasure over this one:
    /// only once the user came back, and only a push newer than this erasure (the push
    /// that began it, replayed, never begins another).
    pub fn erased_again_by(&self, create_time: i64) -> bool {
        self.reopened && create_time > self.erased_at.timestamp()
    }
}

/// The two passes of an erasure over the user's partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// What the dispatcher could act on: plans, scheduled and open pushes, recorded
    /// WeChat events (the items on the due and lease indexes).
    Due,
    /// Everything.
    Rest,
}

/// The sort-key prefixes of the items [`Pass::Due`] deletes first.
/// (Outcomes waiting to be told are among them: nothing of an erased user's is told.)
pub const DUE_PREFIXES: [&str; 5] = ["PLAN#", "SCHEDULED#", "OUTBOX#", "PUSH#", "OUTCOME#"];

/// How long an erasure waits for a send in flight to settle (a lease, the sweep's
/// settling of one whose dispatcher died, with room) before deleting regardless.
pub const FLIGHT_WAIT: Duration = Duration::minutes(15);

/// What an erasure step does with one item of the user's partition (`state`: its
/// stored `state`, if any), `started`: when the erasure began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    Delete,
    /// A plan or push whose send is in flight: kept until it settles.
    InFlight,
}

pub fn disposition(state: Option<&str>, started: DateTime<Utc>, now: DateTime<Utc>) -> Disposition {
    if state == Some("sending") && now - started < FLIGHT_WAIT {
        Disposition::InFlight
    } else {
        Disposition::Delete
    }
}

/// What one step found, and what comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Every item is gone.
    Done,
    /// More to delete: the next step at once (the next tick).
    More,
    /// Sends in flight: the next step once they have had time to settle.
    Waiting(DateTime<Utc>),
}

/// How long an erasure may run before it counts as stalled (a user with 100,000 items
/// takes about 200 steps, a tick each at most: minutes, not an hour).
pub const STALL_AFTER: Duration = Duration::hours(1);

/// Whether an erasure begun at `started` and still pending at `now` is stalled.
pub fn stalled(started: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now - started >= STALL_AFTER
}

/// How long the partition must stay empty before an erasure is done: past the longest
/// any writer admitted before it (an API request, a dispatcher's sweep or settlement
/// that read an item the erasure then deleted) can still land a write — the functions'
/// timeouts are at most 90 s. A write that lands meanwhile is found by the last look
/// and deleted, and the wait begins again.
pub const QUIET: Duration = Duration::minutes(2);

/// What follows a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Done,
    /// Another step at `due`; `empty_since`: when the partition was first found empty
    /// (and has stayed so).
    Step {
        due: DateTime<Utc>,
        empty_since: Option<DateTime<Utc>>,
    },
}

/// What follows a step that ended in `progress`, having deleted `deleted` items, on an
/// erasure whose partition was found empty at `empty_since`.
pub fn next(
    progress: Progress,
    deleted: u64,
    empty_since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Next {
    let quiet_from = |since: DateTime<Utc>| Next::Step {
        due: since + QUIET,
        empty_since: Some(since),
    };
    match progress {
        Progress::More => Next::Step {
            due: now,
            empty_since: None,
        },
        Progress::Waiting(until) => Next::Step {
            due: until,
            empty_since: None,
        },
        // Emptied by this step: quiet from now.
        Progress::Done if deleted > 0 => quiet_from(now),
        Progress::Done => match empty_since {
            Some(since) if now >= since + QUIET => Next::Done,
            Some(since) => quiet_from(since),
            None => quiet_from(now),
        },
    }
}

/// A user's activity is kept by the UTC day of their last signed-in request: the day
/// of `now`.
pub fn activity_day(now: DateTime<Utc>) -> chrono::NaiveDate {
    now.date_naive()
}

/// When a user last active on `day` counts as inactive under `days` days (the start of
/// the day `days` whole days after it), or None when inactivity never erases.
pub fn inactive_from(day: chrono::NaiveDate, days: u32) -> Option<DateTime<Utc>> {
    if days == 0 {
        return None;
    }
    let start = day.checked_add_days(chrono::Days::new(u64::from(days) + 1))?;
    Some(start.and_time(chrono::NaiveTime::MIN).and_utc())
}

/// What becomes of a user's activity entry come due on the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InactiveDue {
    /// Inactive for the days set now: their erasure begins.
    Erase,
    /// Not yet under the days set now (the setting was raised since the entry was
    /// written), or inactivity no longer erases (`INACTIVE_USER_DAYS` set to 0 since:
    /// looked at again [`INACTIVE_RECHECK`] on, should it be set again): due then.
    Later(DateTime<Utc>),
    /// The day kept is unreadable: off the index, nobody erased (their next request
    /// writes it again).
    Off,
}

/// How long an activity come due while inactivity does not erase waits before it is
/// judged again.
pub const INACTIVE_RECHECK: Duration = Duration::days(30);

/// The entry of a user last active on `day` (as kept), come due at `now`, judged under
/// the days set now, not those set when it was written. (Lowered since, an entry is
/// judged at its old instant at the latest, or at the user's next request.)
pub fn inactive_due(day: Option<chrono::NaiveDate>, days: u32, now: DateTime<Utc>) -> InactiveDue {
    let Some(day) = day else {
        return InactiveDue::Off;
    };
    match inactive_from(day, days) {
        None => InactiveDue::Later(now + INACTIVE_RECHECK),
        Some(due) if due > now => InactiveDue::Later(due),
        Some(_) => InactiveDue::Erase,
    }
}

/// Whether a request on `today` moves the user's activity on (at most once a day: a
/// write a day per active user).
pub fn moves_activity(kept: Option<chrono::NaiveDate>, today: chrono::NaiveDate) -> bool {
    kept.is_none_or(|day| day < today)
}

/// How long a step waits for sends in flight before looking again.
pub const FLIGHT_LOOK: Duration = Duration::seconds(60);

/// Where an erasure stands after a step of `pass` deleted what it could: `in_flight`
/// items kept, `more` whether the partition (or the pass's part of it) may hold more.
pub fn progress(pass: Pass, in_flight: usize, more: bool, now: DateTime<Utc>) -> (Pass, Progress) {
    match (pass, in_flight, more) {
        (_, 0, true) => (pass, Progress::More),
        (Pass::Due, 0, false) => (Pass::Rest, Progress::More),
        (Pass::Rest, 0, false) => (Pass::Rest, Progress::Done),
        // Deleting around them: what is left after them comes first.
        (_, _, true) => (pass, Progress::More),
        (_, _, false) => (Pass::Due, Progress::Waiting(now + FLIGHT_LOOK)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::at;

    fn openid(s: &str) -> OpenId {
        OpenId::parse(s.to_string()).expect("openid")
    }

    #[test]
    fn a_tag_is_the_same_for_one_deployment_and_another_elsewhere() {
        let user = openid("oUser123456789");
        let tag = subject("salt-a", &user);
        assert_eq!(tag.len(), 64);
        assert_eq!(tag, subject("salt-a", &user));
        assert_ne!(tag, subject("salt-b", &user));
        assert_ne!(tag, subject("salt-a", &openid("oOther12345678")));
        assert!(!tag.contains("oUser"));
    }

    #[test]
    fn a_tombstone_refuses_older_tokens_and_all_data_until_the_user_comes_back() {
        let erased_at = at("2026-12-06T10:00:00Z");
        let pending = Tombstone {
            erased_at,
            state: ErasureState::Pending,
            reopened: false,
        };
        let secs = erased_at.timestamp();
        assert!(!pending.admits_token(secs - 1));
        assert!(!pending.admits_token(secs + 1), "nothing while it runs");
        assert!(!pending.reopened_by(secs + 1), "not before it is done");
        assert!(!pending.admits_data());
        let done = Tombstone {
            state: ErasureState::Done,
            ..pending.clone()
        };
        assert!(done.admits_token(secs + 1));
        assert!(!done.admits_token(secs), "the same second may be older");
        assert!(done.reopened_by(secs + 1));
        assert!(!done.reopened_by(secs));
        assert!(!done.admits_data());
        let back = Tombstone {
            reopened: true,
            ..done
        };
        assert!(back.admits_data());
        assert!(!back.reopened_by(secs + 1), "reopened once");
        assert!(!back.admits_token(secs), "an old token stays refused");
        assert!(back.erased_again_by(secs + 1), "a newer push, retried");
        assert!(
            !back.erased_again_by(secs),
            "the push that began it, replayed"
        );
        assert!(!done.erased_again_by(secs + 1), "not while they are away");
        assert!(!pending.erased_again_by(secs + 1));
    }

    #[test]
    fn sends_in_flight_are_kept_until_they_settle_or_the_wait_ends() {
        let started = at("2026-12-06T10:00:00Z");
        let soon = started + Duration::minutes(1);
        let late = started + FLIGHT_WAIT;
        assert_eq!(
            disposition(Some("sending"), started, soon),
            Disposition::InFlight
        );
        assert_eq!(
            disposition(Some("sending"), started, late),
            Disposition::Delete
        );
        for state in [None, Some("pending"), Some("sent"), Some("scheduled")] {
            assert_eq!(
                disposition(state, started, soon),
                Disposition::Delete,
                "{state:?}"
            );
        }
    }

    #[test]
    fn the_due_pass_comes_first_and_in_flight_sends_are_waited_for() {
        let now = at("2026-12-06T10:00:00Z");
        let cases = [
            (Pass::Due, 0, true, (Pass::Due, Progress::More)),
            (Pass::Due, 0, false, (Pass::Rest, Progress::More)),
            (Pass::Due, 1, true, (Pass::Due, Progress::More)),
            (
                Pass::Due,
                1,
                false,
                (Pass::Due, Progress::Waiting(now + FLIGHT_LOOK)),
            ),
            (Pass::Rest, 0, true, (Pass::Rest, Progress::More)),
            (Pass::Rest, 0, false, (Pass::Rest, Progress::Done)),
            // A send claimed meanwhile (an item the due pass missed): back to it.
            (
                Pass::Rest,
                2,
                false,
                (Pass::Due, Progress::Waiting(now + FLIGHT_LOOK)),
            ),
        ];
        for (pass, in_flight, more, expected) in cases {
            assert_eq!(
                progress(pass, in_flight, more, now),
                expected,
                "{pass:?} {in_flight} {more}"
            );
        }
    }

    #[test]
    fn it_is_done_only_once_the_partition_stayed_empty_for_the_quiet_time() {
        let now = at("2026-12-06T10:00:00Z");
        let step = |due, empty_since| Next::Step { due, empty_since };
        let cases = [
            (Progress::More, 500, None, step(now, None)),
            (Progress::More, 3, Some(now), step(now, None)),
            (
                Progress::Waiting(now + FLIGHT_LOOK),
                0,
                Some(now),
                step(now + FLIGHT_LOOK, None),
            ),
            // Emptied now: not done before the quiet time.
            (Progress::Done, 7, None, step(now + QUIET, Some(now))),
            (Progress::Done, 0, None, step(now + QUIET, Some(now))),
            // Something written meanwhile was deleted: quiet again from now.
            (
                Progress::Done,
                1,
                Some(now - QUIET),
                step(now + QUIET, Some(now)),
            ),
            (
                Progress::Done,
                0,
                Some(now - Duration::seconds(30)),
                step(
                    now + Duration::seconds(90),
                    Some(now - Duration::seconds(30)),
                ),
            ),
            (Progress::Done, 0, Some(now - QUIET), Next::Done),
        ];
        for (progress, deleted, empty_since, expected) in cases {
            assert_eq!(
                next(progress, deleted, empty_since, now),
                expected,
                "{progress:?} {deleted} {empty_since:?}"
            );
        }
    }

    #[test]
    fn inactivity_counts_whole_days_and_is_written_once_a_day() {
        let day = chrono::NaiveDate::from_ymd_opt(2026, 12, 6).expect("day");
        assert_eq!(inactive_from(day, 0), None, "0: never");
        assert_eq!(inactive_from(day, 30), Some(at("2027-01-06T00:00:00Z")));
        assert_eq!(activity_day(at("2026-12-06T23:59:59Z")), day);
        assert!(moves_activity(None, day));
        assert!(moves_activity(day.pred_opt(), day));
        assert!(!moves_activity(Some(day), day));
    }

    #[test]
    fn an_activity_come_due_is_judged_under_the_days_set_now() {
        let day = chrono::NaiveDate::from_ymd_opt(2026, 12, 6).expect("day");
        let now = at("2027-01-06T00:00:00Z");
        let rows = [
            // Written under 30, still 30: thirty whole days have passed.
            (Some(day), 30, InactiveDue::Erase),
            // Lowered to 10: long past.
            (Some(day), 10, InactiveDue::Erase),
            // Raised to 60: due again at the new instant.
            (
                Some(day),
                60,
                InactiveDue::Later(at("2027-02-05T00:00:00Z")),
            ),
            // The entry came up a little early (the dispatcher's look ahead).
            (
                Some(day),
                31,
                InactiveDue::Later(at("2027-01-07T00:00:00Z")),
            ),
            // Turned off since: nobody is erased; looked at again in 30 days.
            (Some(day), 0, InactiveDue::Later(now + INACTIVE_RECHECK)),
            (None, 30, InactiveDue::Off),
        ];
        for (day, days, expected) in rows {
            assert_eq!(inactive_due(day, days, now), expected, "{day:?} {days}");
        }
    }

    #[test]
    fn an_erasure_pending_for_an_hour_is_stalled() {
        let started = at("2026-12-06T10:00:00Z");
        assert!(!stalled(started, started + Duration::minutes(59)));
        assert!(stalled(started, started + STALL_AFTER));
    }

    #[test]
    fn causes_and_states_read_back() {
        for cause in [
            ErasureCause::Request,
            ErasureCause::Operator,
            ErasureCause::Revoked,
            ErasureCause::AccountClosed,
            ErasureCause::Inactive,
        ] {
            assert_eq!(ErasureCause::parse(cause.as_str()), Some(cause));
        }
        assert_eq!(ErasureCause::parse("other"), None);
        for state in [ErasureState::Pending, ErasureState::Done] {
            assert_eq!(ErasureState::parse(state.as_str()), Some(state));
        }
    }
}
