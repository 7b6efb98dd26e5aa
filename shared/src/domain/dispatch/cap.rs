//! The daily cap (`PUSHES_PER_DAY`): how many messages of one template one user may be
//! sent in one of their days, counting reminders and pushes alike.
//!
//! A claim counts its send on the user's day (in the quota item, under the cap as a
//! condition, so racing claims never pass it); a send given back unsent (its grant
//! restored) gives its count back. A push past the cap waits for the user's next day,
//! or, if it would expire first, goes inbox-only (`capped`) at once; a reminder past it
//! is due again at the first waking moment of the next day. Nothing is sent and no
//! grant is spent either way. Pure.

use std::collections::BTreeMap;

use chrono::{DateTime, Days, NaiveDate, Utc};

use crate::domain::reminders::schedule::{Timezone, local_instant};

/// The sends counted per day, as the quota item holds them (a count may be negative
/// for a day whose count a later claim dropped before a give-back landed).
pub type SentDays = BTreeMap<NaiveDate, i64>;

/// What the cap says about a send about to be claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtCap {
    /// Under the cap (or no cap): the claim counts itself on `day` and drops the
    /// counts of days before `day - 1` (`stale`), which nothing reads again.
    Go(Option<Counted>),
    /// At the cap: due again at `until`, the start of the user's next day.
    Wait(DateTime<Utc>),
    /// At the cap, and the push expires before the next day: inbox-only.
    Capped,
}

/// A claim's count: the day it counts on, the cap it must stay under, and the days
/// whose counts it drops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub day: NaiveDate,
    pub cap: u32,
    pub stale: Vec<NaiveDate>,
}

/// The zone of a user's day, the same for their reminders and pushes: their quiet
/// hours' (`preferences`), else China's, where WeChat's users are.
pub fn day_zone(quiet_hours: Option<Timezone>) -> Timezone {
    quiet_hours.unwrap_or(Timezone::SHANGHAI)
}

/// The user's day at `now` in `zone`.
pub fn day_of(zone: Timezone, now: DateTime<Utc>) -> NaiveDate {
    now.with_timezone(&zone.tz()).date_naive()
}

/// The start (local midnight, or the first instant after it on a day whose midnight
/// does not exist) of the day after `now`'s in `zone`.
pub fn next_day_start(zone: Timezone, now: DateTime<Utc>) -> DateTime<Utc> {
    let next = day_of(zone, now)
        .checked_add_days(Days::new(1))
        .unwrap_or(NaiveDate::MAX);
    local_instant(zone, next.and_time(chrono::NaiveTime::MIN))
}

/// Whether a send may be claimed now under a cap of `per_day` (None: no cap), given
/// the counts `sent` and, for a push, the instant it expires (`send_by`).
pub fn at_cap(
    per_day: Option<u32>,
    sent: &SentDays,
    zone: Timezone,
    send_by: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> AtCap {
    let Some(cap) = per_day else {
        return AtCap::Go(None);
    };
    let day = day_of(zone, now);
    let count = sent.get(&day).copied().unwrap_or(0);
    if count < i64::from(cap) {
        let keep_from = day.pred_opt().unwrap_or(day);
        let stale = sent.keys().filter(|d| **d < keep_from).copied().collect();
        return AtCap::Go(Some(Counted { day, cap, stale }));
    }
    let until = next_day_start(zone, now);
    match send_by {
        Some(by) if by <= until => AtCap::Capped,
        _ => AtCap::Wait(until),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::at;

    fn date(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("date")
    }

    fn zone(name: &str) -> Timezone {
        Timezone::parse(name).expect("zone")
    }

    #[test]
    fn no_cap_counts_nothing() {
        let sent = SentDays::from([(date("2026-12-02"), 99)]);
        assert_eq!(
            at_cap(None, &sent, zone("UTC"), None, at("2026-12-02T10:00:00Z")),
            AtCap::Go(None)
        );
    }

    #[test]
    fn the_users_day_decides_what_is_counted_and_when_a_wait_ends() {
        let shanghai = zone("Asia/Shanghai");
        // 17:00 UTC is already 01:00 on the 3rd in Shanghai.
        let now = at("2026-12-02T17:00:00Z");
        let sent = SentDays::from([(date("2026-12-02"), 2), (date("2026-12-03"), 1)]);
        assert_eq!(
            at_cap(Some(2), &sent, shanghai, None, now),
            AtCap::Go(Some(Counted {
                day: date("2026-12-03"),
                cap: 2,
                stale: vec![],
            }))
        );
        let full = SentDays::from([(date("2026-12-03"), 2)]);
        // Due again at Shanghai's midnight of the 4th: 16:00 UTC on the 3rd.
        assert_eq!(
            at_cap(Some(2), &full, shanghai, None, now),
            AtCap::Wait(at("2026-12-03T16:00:00Z"))
        );
        assert_eq!(next_day_start(zone("UTC"), now), at("2026-12-03T00:00:00Z"));
    }

    #[test]
    fn at_the_cap_a_push_that_expires_first_goes_inbox_only() {
        let utc = zone("UTC");
        let now = at("2026-12-02T10:00:00Z");
        let sent = SentDays::from([(date("2026-12-02"), 3)]);
        let cases = [
            (None, AtCap::Wait(at("2026-12-03T00:00:00Z"))),
            (Some(at("2026-12-02T23:59:59Z")), AtCap::Capped),
            (Some(at("2026-12-03T00:00:00Z")), AtCap::Capped),
            (
                Some(at("2026-12-03T00:00:01Z")),
                AtCap::Wait(at("2026-12-03T00:00:00Z")),
            ),
        ];
        for (send_by, expected) in cases {
            assert_eq!(
                at_cap(Some(3), &sent, utc, send_by, now),
                expected,
                "{send_by:?}"
            );
        }
        // Over the cap (a count given back late, or the cap lowered) is at it too.
        let over = SentDays::from([(date("2026-12-02"), 5)]);
        assert_eq!(
            at_cap(Some(3), &over, utc, None, now),
            AtCap::Wait(at("2026-12-03T00:00:00Z"))
        );
    }

    #[test]
    fn a_claim_drops_the_counts_of_days_before_yesterday() {
        let sent = SentDays::from([
            (date("2026-11-28"), 1),
            (date("2026-11-30"), -1),
            (date("2026-12-01"), 2),
            (date("2026-12-02"), 1),
        ]);
        let AtCap::Go(Some(counted)) = at_cap(
            Some(2),
            &sent,
            zone("UTC"),
            None,
            at("2026-12-02T10:00:00Z"),
        ) else {
            panic!("under the cap");
        };
        // Yesterday's stays: a user in another zone may still be on it.
        assert_eq!(counted.stale, vec![date("2026-11-28"), date("2026-11-30")]);
    }

    #[test]
    fn a_day_whose_midnight_does_not_exist_starts_at_its_first_instant() {
        // Santiago skips 00:00–01:00 on its daylight-saving day (2026-09-06).
        let santiago = zone("America/Santiago");
        let start = next_day_start(santiago, at("2026-09-05T15:00:00Z"));
        assert_eq!(day_of(santiago, start), date("2026-09-06"));
        assert!(start > at("2026-09-05T15:00:00Z"));
    }
}
