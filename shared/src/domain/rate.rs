//! Per-user limits counted by the minute (`REPORTS_PER_MINUTE`, `CHANGES_PER_MINUTE`):
//! whether one more write is admitted, decided on the count as read, so a refused
//! request writes nothing. (The write itself is conditional on the count too, so two
//! racing requests cannot both take the last place.)

use chrono::{DateTime, Utc};

/// The minute `now` falls in, in minutes since the epoch.
pub fn minute_of(now: DateTime<Utc>) -> i64 {
    now.timestamp().div_euclid(60)
}

/// Seconds from `now` until the next minute begins (at least 1): a refused request's
/// `Retry-After`.
pub fn retry_after(now: DateTime<Utc>) -> u64 {
    let next = (minute_of(now) + 1) * 60;
    u64::try_from(next - now.timestamp()).unwrap_or(60).max(1)
}

/// One more write, when `count` were made in `now`'s minute and `max` may be:
/// `Err` with the seconds until the next minute once they are used up.
pub fn admit(count: u64, max: u32, now: DateTime<Utc>) -> Result<(), u64> {
    admit_n(count, 1, max, now)
}

/// `n` more writes (a request that writes several counted items): all fit, or none.
pub fn admit_n(count: u64, n: u64, max: u32, now: DateTime<Utc>) -> Result<(), u64> {
    if count.saturating_add(n) <= u64::from(max) {
        Ok(())
    } else {
        Err(retry_after(now))
    }
}

/// The places a standing choice (`subscriptions_setting`) takes of the user's reports in
/// the minute, when it changes `changed` templates and rides on a request that takes
/// `reserve` places of its own: one, however many templates it changes, or none when
/// the request's own place covers it. So whatever a setting carries, the request needs
/// at most one place more than it would alone, and a retry in a later minute always
/// fits (a request refused for ever would keep its check-in or grant unrecorded, I7).
pub fn setting_places(changed: usize, reserve: u64) -> u64 {
    if changed == 0 || reserve > 0 { 0 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::at;

    #[test]
    fn admits_until_the_minutes_count_is_used_up() {
        let now = at("2026-12-02T10:00:15Z");
        assert_eq!(admit(0, 3, now), Ok(()));
        assert_eq!(admit(2, 3, now), Ok(()));
        assert_eq!(admit(3, 3, now), Err(45));
        assert_eq!(admit(9, 3, now), Err(45));
        assert_eq!(admit_n(1, 2, 3, now), Ok(()));
        assert_eq!(admit_n(2, 2, 3, now), Err(45), "all fit, or none");
        assert_eq!(admit_n(3, 0, 3, now), Ok(()), "nothing to count");
    }

    #[test]
    fn a_setting_takes_one_place_whatever_it_changes_or_rides_on_its_requests() {
        assert_eq!(setting_places(0, 0), 0, "nothing changed");
        assert_eq!(setting_places(1, 0), 1);
        assert_eq!(
            setting_places(3, 0),
            1,
            "the main switch off, three templates"
        );
        assert_eq!(setting_places(300, 0), 1);
        assert_eq!(setting_places(3, 1), 0, "on a grant report's own place");
        // A request never needs more than the smallest limit (1) allows.
        for changed in [0, 1, 3, 300] {
            for reserve in [0, 1] {
                assert!(setting_places(changed, reserve) + reserve <= 1);
            }
        }
    }

    #[test]
    fn retry_after_is_the_rest_of_the_minute_and_never_zero() {
        assert_eq!(retry_after(at("2026-12-02T10:00:00Z")), 60);
        assert_eq!(retry_after(at("2026-12-02T10:00:59Z")), 1);
        assert_eq!(minute_of(at("1970-01-01T00:01:00Z")), 1);
    }
}
