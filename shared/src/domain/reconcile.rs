//! Reconciling WeChat's `subscribe_msg_sent_event` with sends whose outcome is unknown
//! (docs/design.md §5, I4).
//!
//! WeChat pushes one sent event per message it took, naming the user, the template and
//! the msgid (the same id its send answer carries). A send recorded `unknown` has no
//! msgid (its answer never arrived), so an event can only be matched to it by (user,
//! template, time). Two things make that safe:
//!
//! - **Known msgids are excluded.** Every send recorded `sent` leaves its msgid on the
//!   template's quota item ([`sent mark`](Mark)) for the whole window (a send recorded
//!   `sent` without a msgid leaves an anonymous mark), so the event of a definite send
//!   — and every retry of it — is recognised as that send's and never settles another.
//! - **Only an unambiguous match settles.** The event must fall in the window of
//!   exactly one unknown send of that user and template and of no anonymous sent one;
//!   otherwise nothing changes (the sends stay `unknown`, as they would without the
//!   event).
//! - **Sends in flight are waited for.** Every claim leaves an in-flight mark until its
//!   send settles. An event that arrives while a send of the template is in flight may
//!   be that send's (its msgid not recorded yet): it waits a little, and then is kept
//!   pending on the quota item, to be matched again when that send settles `unknown`.
//!
//! The marks are bounded: each goes when its send settles, and one older than
//! [`SENT_EVENT_WINDOW`] is dropped by the next claim or event that reads the quota
//! item.

use chrono::{DateTime, Duration, Utc};

use crate::domain::grants::GrantState;
use crate::domain::settle::{
    DeliveryState, OutcomeClass, RetryPolicy, SendResult, Settlement, settle,
};

/// How long after a send WeChat's sent event may arrive and still settle it. WeChat
/// pushes within seconds and retries an unanswered push three times, 5 s apart.
pub const SENT_EVENT_WINDOW: Duration = Duration::minutes(10);

/// How far WeChat's clock (the event's `CreateTime`) may be from ours.
pub const CLOCK_SKEW: Duration = Duration::seconds(60);

/// A set member on the quota item: `<epoch seconds>#<id>` — a send whose outcome is
/// unknown (the time it was claimed, its delivery id) or a send recorded `sent` (the
/// time it was recorded, its msgid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub at: i64,
    pub id: String,
}

impl Mark {
    pub fn new(at: DateTime<Utc>, id: impl Into<String>) -> Self {
        Self {
            at: at.timestamp(),
            id: id.into(),
        }
    }

    pub fn encode(&self) -> String {
        format!("{}#{}", self.at, self.id)
    }

    /// None for a member that is not a mark (it is then left alone).
    pub fn parse(member: &str) -> Option<Self> {
        let (at, id) = member.split_once('#')?;
        let at = at.parse().ok()?;
        (!id.is_empty()).then(|| Self {
            at,
            id: id.to_string(),
        })
    }

    /// Too old for any event to match it any more.
    pub fn is_stale(&self, now: DateTime<Utc>) -> bool {
        self.at < (now - SENT_EVENT_WINDOW - CLOCK_SKEW).timestamp()
    }

    /// Whether an event created at `create_time` may be this unknown send's.
    fn admits(&self, create_time: i64) -> bool {
        create_time >= self.at - CLOCK_SKEW.num_seconds()
            && create_time <= self.at + SENT_EVENT_WINDOW.num_seconds()
    }
}

/// The id of the sent mark of a send recorded `sent` without a msgid.
pub fn anonymous_sent_id(delivery_id: &str) -> String {
    format!("{ANONYMOUS}{delivery_id}")
}

const ANONYMOUS: &str = "nomsgid-";

/// A sent event kept pending on the quota item (a send of its template was in flight
/// when it came): its mark (create time, `<msgid>:<errcode>`).
pub fn pending_mark(create_time: i64, msgid: u64, error_code: i64) -> Mark {
    Mark {
        at: create_time,
        id: format!("{msgid}:{error_code}"),
    }
}

/// A pending event's (msgid, errcode), if the mark is one.
pub fn pending_event(mark: &Mark) -> Option<(u64, i64)> {
    let (msgid, code) = mark.id.split_once(':')?;
    Some((msgid.parse().ok()?, code.parse().ok()?))
}

/// What a sent event is, given the marks on its template's quota item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventMatch {
    /// The event of a send recorded `sent`: nothing to settle (its mark can go).
    Known(Mark),
    /// The one unknown send it can be.
    Unknown(Mark),
    /// No unknown send in its window.
    Unmatched,
    /// Several unknown sends in its window: which one WeChat took cannot be told.
    Ambiguous(usize),
}

/// Matches an event (`msgid`, `create_time`) against the marks of sends recorded
/// `sent` and of sends whose outcome is unknown.
pub fn match_event(msgid: &str, create_time: i64, sent: &[Mark], unknown: &[Mark]) -> EventMatch {
    if let Some(known) = sent.iter().find(|m| m.id == msgid) {
        return EventMatch::Known(known.clone());
    }
    // A send recorded `sent` without its msgid may be this event's too.
    let anonymous = sent
        .iter()
        .filter(|m| m.id.starts_with(ANONYMOUS) && m.admits(create_time))
        .count();
    let candidates: Vec<&Mark> = unknown.iter().filter(|m| m.admits(create_time)).collect();
    match (candidates.as_slice(), anonymous) {
        ([], 0) => EventMatch::Unmatched,
        ([one], 0) => EventMatch::Unknown((*one).clone()),
        (many, anonymous) => EventMatch::Ambiguous(many.len() + anonymous),
    }
}

/// What a sent event does to the unknown send it matched. `error_code` 0: WeChat took
/// and delivered the message — `sent`, grant consumed, the plan awaits its check-in.
/// Otherwise WeChat took it but failed to deliver it (an asynchronous system failure,
/// the only failure these events report): `failed` with the errcode, the item retried
/// as a retryable failure is (it was certainly not delivered, so a resend breaks no
/// promise), and the grant stays void — WeChat may well have spent the quota.
pub fn event_settlement(
    error_code: i64,
    attempts: u32,
    policy: &RetryPolicy,
    now: DateTime<Utc>,
) -> Settlement {
    if error_code == 0 {
        return settle(OutcomeClass::Sent, Some(0), attempts, policy, now);
    }
    Settlement {
        delivery: DeliveryState::Failed,
        grant: GrantState::Invalid,
        ..settle(
            OutcomeClass::Retryable,
            Some(error_code),
            attempts,
            policy,
            now,
        )
    }
}

/// What a sent event of `error_code` says WeChat did with message `msgid`, as a send
/// result, and the delivery's outcome in a few words.
pub fn event_result(error_code: i64, msgid: &str) -> (SendResult, String) {
    if error_code == 0 {
        let sent = SendResult::Sent {
            msgid: Some(msgid.to_string()),
        };
        return (sent, "sent (WeChat's sent event)".to_string());
    }
    let refused = SendResult::Refused {
        errcode: error_code,
        errmsg: String::new(),
    };
    let outcome = format!("not delivered (WeChat's sent event: errcode {error_code})");
    (refused, outcome)
}

/// How far apart a popup accept (WeChat's `CreateTime`) and the client's report of the
/// same tap (our clock when it landed) may be. Both follow the tap within seconds; the
/// client's report may wait for the network.
pub const TAP_WINDOW: Duration = Duration::minutes(10);

/// Taps seen from both sides: which client-reported grants (marks: report time,
/// request id) the popup accepts (marks: create time, `popup`) confirm. Earliest
/// first, each popup confirming at most one grant and each grant confirmed at most
/// once, only within [`TAP_WINDOW`] of each other. A popup accept never creates a
/// grant: a tap the client never reported stays unpaired until its mark goes stale.
pub fn pair_taps(reported: &[Mark], popups: &[Mark]) -> Vec<(Mark, Mark)> {
    let mut reported: Vec<&Mark> = reported.iter().collect();
    let mut popups: Vec<&Mark> = popups.iter().collect();
    reported.sort_by_key(|m| (m.at, m.id.clone()));
    popups.sort_by_key(|m| (m.at, m.id.clone()));
    let window = TAP_WINDOW.num_seconds();
    let mut used = vec![false; popups.len()];
    let mut pairs = Vec::new();
    for grant in reported {
        let found = popups
            .iter()
            .enumerate()
            .find(|(i, p)| !used[*i] && (p.at - grant.at).abs() <= window);
        if let Some((i, popup)) = found {
            used[i] = true;
            pairs.push((grant.clone(), (*popup).clone()));
        }
    }
    pairs
}

/// The mark of a popup accept created at `create_time` (one per user, template and
/// second: WeChat's retries of the event are the same event).
pub fn popup_mark(create_time: i64) -> Mark {
    Mark {
        at: create_time,
        id: "popup".into(),
    }
}

/// A tap mark too old to pair with anything that may still arrive.
pub fn tap_is_stale(mark: &Mark, now: DateTime<Utc>) -> bool {
    mark.at < (now - TAP_WINDOW - CLOCK_SKEW).timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::settle::FollowUp;

    fn mark(at: i64, id: &str) -> Mark {
        Mark {
            at,
            id: id.to_string(),
        }
    }

    #[test]
    fn marks_round_trip_and_odd_members_are_not_marks() {
        let m = mark(1_700_000_000, "abc");
        assert_eq!(Mark::parse(&m.encode()), Some(m));
        for odd in ["", "#abc", "x#abc", "1700000000#", "abc"] {
            assert_eq!(Mark::parse(odd), None, "{odd}");
        }
        // A msgid is digits; a delivery id hex: both survive.
        assert_eq!(
            Mark::parse("5#18446744073709551615"),
            Some(mark(5, "18446744073709551615"))
        );
    }

    #[test]
    fn a_known_msgid_is_never_matched_to_an_unknown_send() {
        let sent = [mark(100, "42")];
        let unknown = [mark(95, "d1")];
        assert_eq!(
            match_event("42", 101, &sent, &unknown),
            EventMatch::Known(mark(100, "42"))
        );
        assert_eq!(
            match_event("43", 101, &sent, &unknown),
            EventMatch::Unknown(mark(95, "d1"))
        );
    }

    #[test]
    fn the_window_bounds_a_match_on_both_sides() {
        let at = 1_000_000;
        let unknown = [mark(at, "d1")];
        let window = SENT_EVENT_WINDOW.num_seconds();
        let skew = CLOCK_SKEW.num_seconds();
        let cases = [
            (at, true),
            (at + window, true),
            (at + window + 1, false),
            (at - skew, true),
            (at - skew - 1, false),
        ];
        for (create_time, matches) in cases {
            let got = match_event("1", create_time, &[], &unknown);
            assert_eq!(
                got == EventMatch::Unknown(mark(at, "d1")),
                matches,
                "{create_time}: {got:?}"
            );
        }
    }

    #[test]
    fn a_send_recorded_sent_without_its_msgid_makes_an_event_ambiguous() {
        let unknown = [mark(100, "d1")];
        let sent = [mark(105, &anonymous_sent_id("d2"))];
        assert_eq!(
            match_event("9", 110, &sent, &unknown),
            EventMatch::Ambiguous(2)
        );
        let pending = pending_mark(7, 18_446_744_073_709_551_615, -1);
        assert_eq!(
            pending_event(&Mark::parse(&pending.encode()).unwrap_or(pending.clone())),
            Some((18_446_744_073_709_551_615, -1))
        );
    }

    #[test]
    fn two_candidates_settle_neither() {
        let unknown = [mark(100, "d1"), mark(130, "d2"), mark(5_000, "d3")];
        assert_eq!(
            match_event("1", 140, &[], &unknown),
            EventMatch::Ambiguous(2)
        );
        assert_eq!(
            match_event("1", 100_000, &[], &unknown),
            EventMatch::Unmatched
        );
    }

    #[test]
    fn staleness_follows_the_window() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap_or_default();
        let edge = (now - SENT_EVENT_WINDOW - CLOCK_SKEW).timestamp();
        assert!(!mark(edge, "a").is_stale(now));
        assert!(mark(edge - 1, "a").is_stale(now));
    }

    #[test]
    fn taps_pair_earliest_first_one_to_one_within_the_window() {
        let window = TAP_WINDOW.num_seconds();
        let reported = [
            mark(100, "r1"),
            mark(160, "r2"),
            mark(100 + 3 * window, "r3"),
        ];
        let popups = [popup_mark(105), popup_mark(101 + window)];
        let pairs = pair_taps(&reported, &popups);
        assert_eq!(
            pairs,
            vec![
                (mark(100, "r1"), popup_mark(105)),
                (mark(160, "r2"), popup_mark(101 + window)),
            ]
        );
        // Either order in time; never two grants for one popup, nor the reverse.
        assert_eq!(pair_taps(&[mark(200, "r")], &[popup_mark(190)]).len(), 1);
        assert_eq!(
            pair_taps(&[mark(200, "a"), mark(201, "b")], &[popup_mark(200)]).len(),
            1
        );
        assert_eq!(
            pair_taps(&[mark(200, "a")], &[popup_mark(200), popup_mark(201)]).len(),
            1
        );
        assert!(pair_taps(&[mark(0, "a")], &[popup_mark(window + 1)]).is_empty());
        assert!(pair_taps(&[], &[popup_mark(1)]).is_empty());
    }

    #[test]
    fn an_event_settles_sent_or_failed_never_restoring_the_grant() {
        let policy = RetryPolicy {
            max_attempts: 5,
            retry_base: std::time::Duration::from_secs(60),
        };
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("an instant");
        let sent = event_settlement(0, 2, &policy, now);
        assert_eq!(sent.delivery, DeliveryState::Sent);
        assert_eq!(sent.grant, GrantState::Consumed);
        assert_eq!(sent.follow_up, FollowUp::Delivered);
        let failed = event_settlement(-1, 2, &policy, now);
        assert_eq!(failed.delivery, DeliveryState::Failed);
        assert_eq!(failed.grant, GrantState::Invalid);
        assert_eq!(failed.attempts, 3);
        assert!(matches!(failed.follow_up, FollowUp::RetryAt(_)));
        let last = event_settlement(-1, 4, &policy, now);
        assert!(matches!(last.follow_up, FollowUp::Stop(_)));
    }

    #[test]
    fn a_sent_event_reads_as_the_send_result_it_reports() {
        let (sent, outcome) = event_result(0, "77");
        assert_eq!(
            sent,
            SendResult::Sent {
                msgid: Some("77".into())
            }
        );
        assert_eq!(outcome, "sent (WeChat's sent event)");
        let (failed, outcome) = event_result(-1, "78");
        assert_eq!(failed.errcode(), Some(-1));
        assert_eq!(failed.class(), OutcomeClass::Retryable);
        assert_eq!(outcome, "not delivered (WeChat's sent event: errcode -1)");
    }
}
