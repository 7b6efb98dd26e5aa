//! The next-due rule (docs/design.md §4): when the next reminder is due after a check-in.
//!
//! Pure: it takes the check-in instant and the settings and returns an instant (UTC).
//! Rules, in the user's zone: next = check-in + interval; before wake → that day's
//! wake; at or after sleep → the next day's wake; goal reached → the next waking day's
//! wake. Sleep may be after midnight (wake 09:00, sleep 01:00): the waking day then runs
//! past midnight. A wake time that does not exist on a spring-forward day moves to the
//! first valid instant after the gap; an ambiguous one (fall back) takes the earlier.

use std::str::FromStr;

use chrono::{DateTime, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// Reminder intervals onegrant accepts, in minutes.
pub const MIN_INTERVAL_MINUTES: u32 = 15;
pub const MAX_INTERVAL_MINUTES: u32 = 720;

/// Why schedule settings are invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("interval_minutes must be between {MIN_INTERVAL_MINUTES} and {MAX_INTERVAL_MINUTES}")]
    Interval,
    #[error("{0} must be a time of day as HH:MM")]
    Time(&'static str),
    #[error("wake_time and sleep_time must differ")]
    EmptyDay,
    #[error("timezone must be an IANA zone name such as Asia/Shanghai")]
    Timezone,
}

/// An IANA time zone, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timezone(Tz);

impl Timezone {
    /// China's zone, where WeChat's users are: the default wherever a user has named
    /// none.
    pub const SHANGHAI: Self = Self(Tz::Asia__Shanghai);

    pub fn parse(name: &str) -> Result<Self, ScheduleError> {
        Tz::from_str(name)
            .map(Self)
            .map_err(|_| ScheduleError::Timezone)
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// Every zone name [`Timezone::parse`] takes: the IANA database's, as compiled in
    /// (a deployment's served contract lists them).
    pub fn names() -> impl Iterator<Item = &'static str> {
        chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name())
    }

    pub fn tz(&self) -> Tz {
        self.0
    }
}

impl Serialize for Timezone {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Timezone {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// A time of day as `HH:MM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimeOfDay(NaiveTime);

impl TimeOfDay {
    pub fn parse(value: &str, field: &'static str) -> Result<Self, ScheduleError> {
        let bytes = value.as_bytes();
        if bytes.len() != 5 || bytes[2] != b':' {
            return Err(ScheduleError::Time(field));
        }
        NaiveTime::parse_from_str(value, "%H:%M")
            .map(Self)
            .map_err(|_| ScheduleError::Time(field))
    }

    pub fn time(&self) -> NaiveTime {
        self.0
    }
}

impl std::fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.format("%H:%M"))
    }
}

impl Serialize for TimeOfDay {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = String::deserialize(d)?;
        Self::parse(&value, "time").map_err(serde::de::Error::custom)
    }
}

/// The instant a wall-clock time happens in `zone`: the first valid instant after a
/// DST gap, the earlier of two in an overlap.
pub fn local_instant(zone: Timezone, local: NaiveDateTime) -> DateTime<Utc> {
    resolve(zone, local, |early, _| early)
}

/// The first instant after `after` at which the wall clock in `zone` reads `local`, or
/// failing that the last before: in an overlap (clocks falling back) the later of the
/// two once the earlier has passed, so an end read in the repeated hour's second pass
/// is the one still ahead; past a DST gap as [`local_instant`].
pub fn local_instant_after(
    zone: Timezone,
    local: NaiveDateTime,
    after: DateTime<Utc>,
) -> DateTime<Utc> {
    resolve(
        zone,
        local,
        |early, late| {
            if early > after { early } else { late }
        },
    )
}

fn resolve(
    zone: Timezone,
    local: NaiveDateTime,
    overlap: impl Fn(DateTime<Utc>, DateTime<Utc>) -> DateTime<Utc>,
) -> DateTime<Utc> {
    let tz = zone.tz();
    let mut probe = local;
    // Gaps are at most a few hours; walk forward a minute at a time.
    for _ in 0..(4 * 60) {
        match tz.from_local_datetime(&probe) {
            LocalResult::Single(t) => return t.with_timezone(&Utc),
            LocalResult::Ambiguous(early, late) => {
                return overlap(early.with_timezone(&Utc), late.with_timezone(&Utc));
            }
            LocalResult::None => probe += Duration::minutes(1),
        }
    }
    // Unreachable for real zones; fall back to reading the wall clock as UTC.
    Utc.from_utc_datetime(&local)
}

/// When and how often a plan reminds: validated on construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    interval_minutes: u32,
    wake_time: TimeOfDay,
    sleep_time: TimeOfDay,
    timezone: Timezone,
}

impl Schedule {
    pub fn new(
        interval_minutes: u32,
        wake_time: TimeOfDay,
        sleep_time: TimeOfDay,
        timezone: Timezone,
    ) -> Result<Self, ScheduleError> {
        if !(MIN_INTERVAL_MINUTES..=MAX_INTERVAL_MINUTES).contains(&interval_minutes) {
            return Err(ScheduleError::Interval);
        }
        if wake_time == sleep_time {
            return Err(ScheduleError::EmptyDay);
        }
        Ok(Self {
            interval_minutes,
            wake_time,
            sleep_time,
            timezone,
        })
    }

    pub fn interval_minutes(&self) -> u32 {
        self.interval_minutes
    }
    pub fn wake_time(&self) -> TimeOfDay {
        self.wake_time
    }
    pub fn sleep_time(&self) -> TimeOfDay {
        self.sleep_time
    }
    pub fn timezone(&self) -> Timezone {
        self.timezone
    }

    fn crosses_midnight(&self) -> bool {
        self.sleep_time <= self.wake_time
    }

    fn instant(&self, local: NaiveDateTime) -> DateTime<Utc> {
        local_instant(self.timezone, local)
    }

    /// The wake instant of waking day `day`.
    fn wake_of(&self, day: NaiveDate) -> DateTime<Utc> {
        self.instant(day.and_time(self.wake_time.time()))
    }

    /// The end (sleep instant) of waking day `day`.
    fn sleep_of(&self, day: NaiveDate) -> DateTime<Utc> {
        let date = if self.crosses_midnight() {
            day.succ_opt().unwrap_or(day)
        } else {
            day
        };
        self.instant(date.and_time(self.sleep_time.time()))
    }

    /// The local calendar date whose counts an instant belongs to: after midnight but
    /// before sleep, a late-sleeping user is still on the previous day.
    pub fn waking_day(&self, at: DateTime<Utc>) -> NaiveDate {
        let local = at.with_timezone(&self.timezone.tz()).naive_local();
        if self.crosses_midnight() && local.time() < self.sleep_time.time() {
            local.date().pred_opt().unwrap_or(local.date())
        } else {
            local.date()
        }
    }

    /// Whether `at` falls within waking hours.
    pub fn is_awake(&self, at: DateTime<Utc>) -> bool {
        let day = self.waking_day(at);
        self.wake_of(day) <= at && at < self.sleep_of(day)
    }

    /// The first instant at or after `at` within waking hours.
    pub fn first_awake_from(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let day = self.waking_day(at);
        for d in [
            Some(day),
            day.succ_opt(),
            day.succ_opt().and_then(|d| d.succ_opt()),
        ]
        .into_iter()
        .flatten()
        {
            let (wake, sleep) = (self.wake_of(d), self.sleep_of(d));
            // A waking window wholly inside a DST gap (say 02:00–02:01 on the night
            // the clocks skip 02:00–03:00) does not happen that day: both ends fall
            // on the gap's end, and the day is skipped.
            if at < sleep && wake < sleep {
                return at.max(wake);
            }
        }
        at
    }

    /// docs/design.md §4: the next reminder after a check-in at `checkin`.
    pub fn next_due(&self, checkin: DateTime<Utc>, goal_reached: bool) -> DateTime<Utc> {
        if goal_reached {
            let today = self.waking_day(checkin);
            let next = today.succ_opt().unwrap_or(today);
            return self.first_awake_from(self.wake_of(next));
        }
        let candidate = checkin + Duration::minutes(i64::from(self.interval_minutes));
        self.first_awake_from(candidate)
    }

    /// The next due instant for a check-in at `checkin` as seen at `now`: the rule's
    /// answer when it is still ahead, otherwise the rule applied from `now` (a late or
    /// replayed check-in never schedules into the past; a goal reached on an earlier
    /// day no longer counts).
    pub fn next_due_from(
        &self,
        checkin: DateTime<Utc>,
        goal_reached: bool,
        now: DateTime<Utc>,
    ) -> DateTime<Utc> {
        let due = self.next_due(checkin, goal_reached);
        if due > now {
            return due;
        }
        let goal_today = goal_reached && self.waking_day(checkin) == self.waking_day(now);
        self.next_due(now, goal_today)
    }

    /// `at` as RFC 3339 in the user's zone (what the API returns).
    pub fn local_rfc3339(&self, at: DateTime<Utc>) -> String {
        at.with_timezone(&self.timezone.tz())
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn schedule(interval: u32, wake: &str, sleep: &str, tz: &str) -> Schedule {
        Schedule::new(
            interval,
            TimeOfDay::parse(wake, "wake_time").expect("wake"),
            TimeOfDay::parse(sleep, "sleep_time").expect("sleep"),
            Timezone::parse(tz).expect("tz"),
        )
        .expect("valid schedule")
    }

    fn local(s: &Schedule, text: &str) -> DateTime<Utc> {
        let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M").expect("datetime");
        s.instant(naive)
    }

    #[test]
    fn a_waking_window_wholly_inside_a_dst_gap_skips_its_day() {
        // New York skips 02:00–03:00 on 2020-03-08: a 02:00–02:01 day does not happen.
        let s = schedule(15, "02:00", "02:01", "America/New_York");
        let checkin = local(&s, "2020-03-07 01:50");
        for goal in [false, true] {
            let due = s.next_due(checkin, goal);
            assert_eq!(
                s.local_rfc3339(due),
                "2020-03-09T02:00:00-04:00",
                "goal {goal}"
            );
            assert!(s.is_awake(due));
        }
    }

    #[test]
    fn the_next_due_time_follows_the_table() {
        let shanghai = schedule(120, "08:00", "22:00", "Asia/Shanghai");
        let late = schedule(120, "09:00", "01:00", "Asia/Shanghai");
        let ny = schedule(120, "02:30", "22:00", "America/New_York");
        let ny_day = schedule(60, "08:00", "22:00", "America/New_York");
        let ny_night = schedule(60, "00:00", "23:00", "America/New_York");
        // (schedule, check-in local, goal reached, expected local)
        let cases: Vec<(&Schedule, &str, bool, &str)> = vec![
            // The seed article's three examples.
            (&shanghai, "2026-07-27 10:00", false, "2026-07-27 12:00"),
            (&shanghai, "2026-07-27 21:10", false, "2026-07-28 08:00"),
            (&shanghai, "2026-07-27 16:00", true, "2026-07-28 08:00"),
            // Before wake → that day's wake; exactly at sleep → next day's wake.
            (&shanghai, "2026-07-27 05:00", false, "2026-07-27 08:00"),
            (&shanghai, "2026-07-27 20:00", false, "2026-07-28 08:00"),
            (&shanghai, "2026-07-27 19:59", false, "2026-07-27 21:59"),
            // Sleep after midnight: 23:30 + 2 h = 01:30 ≥ 01:00 → 09:00 the same calendar day.
            (&late, "2026-07-27 22:00", false, "2026-07-28 00:00"),
            (&late, "2026-07-27 23:30", false, "2026-07-28 09:00"),
            // 00:30 belongs to the previous waking day; goal reached → that day's next wake.
            (&late, "2026-07-28 00:30", true, "2026-07-28 09:00"),
            (&late, "2026-07-27 10:00", true, "2026-07-28 09:00"),
            // Spring forward (2026-03-08, 02:00 → 03:00): a 02:30 wake moves to 03:00.
            (&ny, "2026-03-07 21:00", false, "2026-03-08 03:00"),
            // Intervals are elapsed time: 60 min after 01:30 EST is 03:30 EDT.
            (&ny_night, "2026-03-08 01:30", false, "2026-03-08 03:30"),
            (&ny_day, "2026-03-08 09:30", false, "2026-03-08 10:30"),
            // Fall back (2026-11-01, 02:00 → 01:00): 1 h after 00:30 is the first 01:30.
            (&ny_night, "2026-11-01 00:30", false, "2026-11-01 01:30"),
        ];
        for (s, checkin, goal, expected) in cases {
            let got = s.next_due(local(s, checkin), goal);
            assert_eq!(
                got,
                local(s, expected),
                "{checkin} goal={goal}: got {}",
                s.local_rfc3339(got)
            );
        }
    }

    #[test]
    fn a_late_check_in_never_schedules_into_the_past() {
        let s = schedule(120, "08:00", "22:00", "Asia/Shanghai");
        let now = local(&s, "2026-07-27 15:00");
        // Synced 5 h late: 10:00 + 2 h is past, so the rule runs from now.
        assert_eq!(
            s.next_due_from(local(&s, "2026-07-27 10:00"), false, now),
            local(&s, "2026-07-27 17:00")
        );
        // Still ahead: kept.
        assert_eq!(
            s.next_due_from(local(&s, "2026-07-27 14:00"), false, now),
            local(&s, "2026-07-27 16:00")
        );
        // Yesterday's reached goal does not skip today.
        assert_eq!(
            s.next_due_from(local(&s, "2026-07-26 16:00"), true, now),
            local(&s, "2026-07-27 17:00")
        );
        // Today's reached goal still waits for tomorrow.
        assert_eq!(
            s.next_due_from(local(&s, "2026-07-27 09:00"), true, now),
            local(&s, "2026-07-28 08:00")
        );
    }

    #[test]
    fn times_are_returned_with_the_users_offset() {
        let s = schedule(120, "08:00", "22:00", "Asia/Shanghai");
        let due = s.next_due(local(&s, "2026-07-27 10:00"), false);
        assert_eq!(s.local_rfc3339(due), "2026-07-27T12:00:00+08:00");
    }

    #[test]
    fn bad_settings_are_refused() {
        assert_eq!(
            TimeOfDay::parse("8:00", "wake_time"),
            Err(ScheduleError::Time("wake_time"))
        );
        assert_eq!(
            TimeOfDay::parse("24:00", "wake_time"),
            Err(ScheduleError::Time("wake_time"))
        );
        assert_eq!(
            TimeOfDay::parse("08:00:00", "wake_time"),
            Err(ScheduleError::Time("wake_time"))
        );
        assert_eq!(
            Timezone::parse("Mars/Olympus"),
            Err(ScheduleError::Timezone)
        );
        let t = |v| TimeOfDay::parse(v, "t").expect("time");
        let tz = Timezone::parse("UTC").expect("tz");
        assert_eq!(
            Schedule::new(14, t("08:00"), t("22:00"), tz),
            Err(ScheduleError::Interval)
        );
        assert_eq!(
            Schedule::new(721, t("08:00"), t("22:00"), tz),
            Err(ScheduleError::Interval)
        );
        assert_eq!(
            Schedule::new(60, t("08:00"), t("08:00"), tz),
            Err(ScheduleError::EmptyDay)
        );
    }

    fn arb_schedule() -> impl Strategy<Value = Schedule> {
        let zones = prop::sample::select(vec![
            "Asia/Shanghai",
            "America/New_York",
            "Europe/London",
            "Australia/Lord_Howe",
            "Pacific/Chatham",
            "UTC",
        ]);
        (
            MIN_INTERVAL_MINUTES..=MAX_INTERVAL_MINUTES,
            0u32..1440,
            0u32..1440,
            zones,
        )
            .prop_filter("wake and sleep differ", |(_, w, s, _)| w != s)
            .prop_map(|(interval, w, s, zone)| {
                let t = |m: u32| {
                    TimeOfDay(NaiveTime::from_hms_opt(m / 60, m % 60, 0).unwrap_or_default())
                };
                Schedule::new(interval, t(w), t(s), Timezone::parse(zone).expect("zone"))
                    .expect("valid")
            })
    }

    proptest! {
        #[test]
        fn the_next_due_instant_is_after_the_checkin_awake_and_within_an_interval_and_a_night(
            s in arb_schedule(),
            // 2020..2030, so DST transitions are covered.
            secs in 1_577_836_800i64..1_893_456_000i64,
            goal in any::<bool>(),
        ) {
            let checkin = DateTime::from_timestamp(secs, 0).expect("instant");
            let due = s.next_due(checkin, goal);
            prop_assert!(due > checkin, "due {due} not after {checkin}");
            prop_assert!(s.is_awake(due), "due {} is outside waking hours", s.local_rfc3339(due));
            let wake = i64::from(s.wake_time.time().signed_duration_since(NaiveTime::MIN).num_minutes() as i32);
            let sleep = i64::from(s.sleep_time.time().signed_duration_since(NaiveTime::MIN).num_minutes() as i32);
            let night = Duration::minutes((wake - sleep).rem_euclid(1440));
            // A DST change can lengthen one night by an hour (Lord Howe: half an hour),
            // and a waking window wholly inside a DST gap skips its day.
            let mut skipped = 0;
            let mut day = s.waking_day(checkin);
            while day < s.waking_day(due) {
                if s.wake_of(day) >= s.sleep_of(day) {
                    skipped += 1;
                }
                day = day.succ_opt().expect("a next day");
            }
            let bound = if goal {
                Duration::hours(48) + Duration::hours(1)
            } else {
                Duration::minutes(i64::from(s.interval_minutes)) + night + Duration::hours(1)
            } + Duration::hours(24 * skipped);
            prop_assert!(due - checkin <= bound, "due {} is {} after the check-in", s.local_rfc3339(due), due - checkin);
        }
    }
}
