//! Per-user limits counted by the minute (`REPORTS_PER_MINUTE`, `CHANGES_PER_MINUTE`):
//! the minute, a refusal's wait, and the places a standing choice takes. Whether a
//! write fits is one rule on the stored count (`store::items::rate::room_for`), checked
//! on the count as read and carried as the counted write's condition.

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
