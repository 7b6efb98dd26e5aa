//! The user's preferences for pushes: quiet hours and muted notification types, and
//! what they mean for a push at the moment it would be claimed ([`gate`]).
//!
//! A push that falls in quiet hours is held until they end in the user's zone
//! (daylight saving included), unless its priority is `high`; a push whose
//! notification type is muted is never sent (`muted`, no grant spent). Pure.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::reminders::schedule::{ScheduleError, TimeOfDay, Timezone, local_instant_after};
use crate::domain::template::Priority;

/// Most notification types a user may mute.
pub const MAX_MUTED_TYPES: usize = 20;

/// A daily window in which pushes wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuietHours {
    pub start: TimeOfDay,
    pub end: TimeOfDay,
    pub timezone: Timezone,
}

/// A user's preferences (the default: none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preferences {
    pub quiet_hours: Option<QuietHours>,
    /// Sorted, without repeats.
    pub muted_types: Vec<String>,
}

/// Why a preferences body is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreferencesError {
    #[error("{0}")]
    Shape(String),
    #[error("quiet_hours: {0}")]
    QuietHours(ScheduleError),
    #[error(
        "muted_types: at most {MAX_MUTED_TYPES} types, each 1 to 32 of letters, digits and '_', '.', '-'"
    )]
    MutedTypes,
}

/// Whether `kind` has the shape of a notification type (as `notify` accepts it).
fn is_type(kind: &str) -> bool {
    (1..=32).contains(&kind.len())
        && kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl Preferences {
    /// A `PUT /v1/preferences` body: both fields required (`quiet_hours` may be
    /// null), nothing else.
    pub fn from_json(body: &Value) -> Result<Self, PreferencesError> {
        let object = body
            .as_object()
            .ok_or_else(|| PreferencesError::Shape("the body must be a JSON object".into()))?;
        if let Some(other) = object
            .keys()
            .find(|k| !matches!(k.as_str(), "quiet_hours" | "muted_types"))
        {
            return Err(PreferencesError::Shape(format!("unknown field {other}")));
        }
        let quiet_hours = match object.get("quiet_hours") {
            None => {
                return Err(PreferencesError::Shape(
                    "quiet_hours is required (null for none)".into(),
                ));
            }
            Some(Value::Null) => None,
            Some(Value::Object(q)) => {
                let text = |name: &'static str| -> Result<&str, PreferencesError> {
                    q.get(name).and_then(Value::as_str).ok_or_else(|| {
                        PreferencesError::Shape(format!("quiet_hours.{name} must be a string"))
                    })
                };
                if let Some(other) = q
                    .keys()
                    .find(|k| !matches!(k.as_str(), "start" | "end" | "timezone"))
                {
                    return Err(PreferencesError::Shape(format!(
                        "unknown field quiet_hours.{other}"
                    )));
                }
                let start = TimeOfDay::parse(text("start")?, "start")
                    .map_err(PreferencesError::QuietHours)?;
                let end =
                    TimeOfDay::parse(text("end")?, "end").map_err(PreferencesError::QuietHours)?;
                let timezone =
                    Timezone::parse(text("timezone")?).map_err(PreferencesError::QuietHours)?;
                // An empty window (start equal to end) is no quiet hours: saved as none.
                (start != end).then_some(QuietHours {
                    start,
                    end,
                    timezone,
                })
            }
            Some(_) => {
                return Err(PreferencesError::Shape(
                    "quiet_hours must be an object or null".into(),
                ));
            }
        };
        let muted_types = match object.get("muted_types") {
            // At most 20 entries as sent, repeats counted (the contract's `maxItems`),
            // then kept sorted and without repeats.
            Some(Value::Array(types)) if types.len() > MAX_MUTED_TYPES => {
                return Err(PreferencesError::MutedTypes);
            }
            Some(Value::Array(types)) => {
                let mut kinds = Vec::with_capacity(types.len());
                for t in types {
                    match t.as_str() {
                        Some(kind) if is_type(kind) => kinds.push(kind.to_string()),
                        _ => return Err(PreferencesError::MutedTypes),
                    }
                }
                kinds.sort();
                kinds.dedup();
                kinds
            }
            None => return Err(PreferencesError::Shape("muted_types is required".into())),
            Some(_) => {
                return Err(PreferencesError::Shape(
                    "muted_types must be an array of types".into(),
                ));
            }
        };
        Ok(Self {
            quiet_hours,
            muted_types,
        })
    }

    pub fn is_muted(&self, kind: &str) -> bool {
        self.muted_types
            .binary_search_by(|m| m.as_str().cmp(kind))
            .is_ok()
    }
}

impl QuietHours {
    /// If `at` falls in these quiet hours, when they end (in the user's zone, daylight
    /// saving included).
    pub fn end_after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = at.with_timezone(&self.timezone.tz()).naive_local();
        let (start, end, time) = (self.start.time(), self.end.time(), local.time());
        let day = local.date();
        // The end still ahead of `at`: in the hour clocks fall back and repeat, the
        // second pass's end when `at` is in that pass (the first pass's has gone by).
        let end_on = |d: chrono::NaiveDate| local_instant_after(self.timezone, d.and_time(end), at);
        let until = if start < end {
            (start <= time && time < end).then(|| end_on(day))
        } else if time >= start {
            // Across midnight, in its first part: it ends tomorrow.
            Some(end_on(day + Duration::days(1)))
        } else {
            (time < end).then(|| end_on(day))
        };
        // (A window's end inside a DST gap resolves past the gap: still after `at`.)
        until.filter(|u| *u > at)
    }
}

/// What a user's preferences say of a push at the moment it would be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Go,
    /// Its notification type is muted: never sent, no grant spent.
    Muted,
    /// Quiet hours: due again at their end.
    Hold(DateTime<Utc>),
}

/// The gate for a push of a notification of type `kind` (None: stored before types
/// were kept with pushes, never muted) at `priority`, at `now`.
pub fn gate(
    prefs: &Preferences,
    kind: Option<&str>,
    priority: Priority,
    now: DateTime<Utc>,
) -> Gate {
    if kind.is_some_and(|k| prefs.is_muted(k)) {
        return Gate::Muted;
    }
    if priority == Priority::High {
        return Gate::Go;
    }
    match prefs.quiet_hours.and_then(|q| q.end_after(now)) {
        Some(until) => Gate::Hold(until),
        None => Gate::Go,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prefs(body: Value) -> Preferences {
        Preferences::from_json(&body).expect("valid")
    }

    use crate::domain::at as utc;

    #[test]
    fn bad_preferences_are_refused_with_their_reason() {
        let ok_quiet = json!({"start": "22:00", "end": "08:00", "timezone": "Asia/Shanghai"});
        let cases = [
            (json!([]), "the body must be a JSON object"),
            (json!({"muted_types": []}), "quiet_hours is required"),
            (json!({"quiet_hours": null}), "muted_types is required"),
            (
                json!({"quiet_hours": null, "muted_types": [], "x": 1}),
                "unknown field x",
            ),
            (
                json!({"quiet_hours": 5, "muted_types": []}),
                "quiet_hours must be an object",
            ),
            (
                json!({"quiet_hours": {"start": "22:00", "end": "08:00"}, "muted_types": []}),
                "quiet_hours.timezone must be a string",
            ),
            (
                json!({"quiet_hours": {"start": "25:00", "end": "08:00", "timezone": "UTC"}, "muted_types": []}),
                "start must be a time of day",
            ),
            (
                json!({"quiet_hours": {"start": "22:00", "end": "8:00", "timezone": "UTC"}, "muted_types": []}),
                "end must be a time of day",
            ),
            (
                json!({"quiet_hours": {"start": "22:00", "end": "08:00", "timezone": "Mars/Base"}, "muted_types": []}),
                "IANA zone",
            ),
            (
                json!({"quiet_hours": {"start": "22:00", "end": "08:00", "timezone": "UTC", "y": 1}, "muted_types": []}),
                "unknown field quiet_hours.y",
            ),
            (
                json!({"quiet_hours": ok_quiet, "muted_types": "marketing"}),
                "muted_types must be an array",
            ),
            (
                json!({"quiet_hours": null, "muted_types": [""]}),
                "muted_types: at most",
            ),
            (
                json!({"quiet_hours": null, "muted_types": ["a b"]}),
                "muted_types: at most",
            ),
            (
                json!({"quiet_hours": null, "muted_types": [7]}),
                "muted_types: at most",
            ),
            (
                json!({"quiet_hours": null, "muted_types": (0..21).map(|i| format!("t{i}")).collect::<Vec<_>>()}),
                "muted_types: at most",
            ),
            // 21 entries as sent, two types once their repeats are gone: refused all
            // the same, as the contract's maxItems says (the fuzzer found it accepted).
            (
                json!({"quiet_hours": null, "muted_types": (0..21).map(|i| format!("t{}", i % 2)).collect::<Vec<_>>()}),
                "muted_types: at most",
            ),
        ];
        for (body, reason) in cases {
            let error = Preferences::from_json(&body).expect_err(&body.to_string());
            assert!(error.to_string().contains(reason), "{body}: {error}");
        }
        let p = prefs(json!({"quiet_hours": null, "muted_types": ["b", "a", "b"]}));
        assert_eq!(p.muted_types, vec!["a", "b"], "sorted, no repeats");
        let empty = prefs(
            json!({"quiet_hours": {"start": "22:00", "end": "22:00", "timezone": "UTC"}, "muted_types": []}),
        );
        assert_eq!(empty.quiet_hours, None, "an empty window is no quiet hours");
    }

    #[test]
    fn quiet_hours_hold_a_push_until_their_end_in_the_users_zone() {
        let p = prefs(
            json!({"quiet_hours": {"start": "22:00", "end": "08:00", "timezone": "Asia/Shanghai"},
                             "muted_types": ["marketing"]}),
        );
        let cases = [
            // 23:30 Shanghai: held until 08:00 the next morning.
            ("2026-12-01T15:30:00Z", Some("2026-12-02T00:00:00Z")),
            // 03:00 Shanghai: until 08:00 the same morning.
            ("2026-12-01T19:00:00Z", Some("2026-12-02T00:00:00Z")),
            // 08:00 sharp and 21:59: not quiet.
            ("2026-12-02T00:00:00Z", None),
            ("2026-12-01T13:59:00Z", None),
            // 22:00 sharp: quiet.
            ("2026-12-01T14:00:00Z", Some("2026-12-02T00:00:00Z")),
        ];
        for (now, until) in cases {
            let expected = until.map_or(Gate::Go, |u| Gate::Hold(utc(u)));
            assert_eq!(
                gate(&p, Some("order"), Priority::Normal, utc(now)),
                expected,
                "{now}"
            );
            assert_eq!(
                gate(&p, Some("order"), Priority::Low, utc(now)),
                expected,
                "{now}"
            );
            assert_eq!(
                gate(&p, Some("order"), Priority::High, utc(now)),
                Gate::Go,
                "{now}"
            );
            assert_eq!(
                gate(&p, Some("marketing"), Priority::High, utc(now)),
                Gate::Muted
            );
            assert_eq!(
                gate(&p, None, Priority::Normal, utc(now)),
                expected,
                "no type: never muted"
            );
        }
    }

    #[test]
    fn quiet_hours_follow_daylight_saving() {
        // New York, 2026-03-08: clocks skip 02:00-03:00; quiet 01:00-02:30 ends at 03:00.
        let p = prefs(
            json!({"quiet_hours": {"start": "01:00", "end": "02:30", "timezone": "America/New_York"},
                             "muted_types": []}),
        );
        assert_eq!(
            gate(&p, Some("t"), Priority::Normal, utc("2026-03-08T06:30:00Z")),
            Gate::Hold(utc("2026-03-08T07:00:00Z")),
            "01:30 EST is held until 03:00 EDT"
        );
        // Quiet 22:00-07:00 across the fall-back night (2026-11-01): 07:00 EST.
        let p = prefs(
            json!({"quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "America/New_York"},
                             "muted_types": []}),
        );
        assert_eq!(
            gate(&p, Some("t"), Priority::Normal, utc("2026-11-01T03:00:00Z")),
            Gate::Hold(utc("2026-11-01T12:00:00Z")),
            "23:00 EDT is held until 07:00 EST"
        );
        // Quiet 22:00-01:30 across the fall-back night: 01:00-02:00 happens twice
        // (EDT 05:00-06:00Z, then EST 06:00-07:00Z), and so does 01:30. Held in both
        // passes until the end the wall clock reaches next; out of them, sent.
        let p = prefs(
            json!({"quiet_hours": {"start": "22:00", "end": "01:30", "timezone": "America/New_York"},
                             "muted_types": []}),
        );
        for (at, expected, why) in [
            (
                "2026-11-01T05:10:00Z",
                Gate::Hold(utc("2026-11-01T05:30:00Z")),
                "01:10 EDT",
            ),
            ("2026-11-01T05:45:00Z", Gate::Go, "01:45 EDT"),
            (
                "2026-11-01T06:10:00Z",
                Gate::Hold(utc("2026-11-01T06:30:00Z")),
                "01:10 EST, again",
            ),
            (
                "2026-11-01T06:29:59Z",
                Gate::Hold(utc("2026-11-01T06:30:00Z")),
                "01:29:59 EST",
            ),
            ("2026-11-01T06:30:00Z", Gate::Go, "01:30 EST"),
            ("2026-11-01T06:40:00Z", Gate::Go, "01:40 EST"),
        ] {
            assert_eq!(
                gate(&p, Some("t"), Priority::Normal, utc(at)),
                expected,
                "{why}"
            );
        }
        // Berlin, 2026-10-25: 02:00-03:00 twice (CEST 00:00-01:00Z, CET 01:00-02:00Z).
        let p = prefs(
            json!({"quiet_hours": {"start": "23:00", "end": "02:30", "timezone": "Europe/Berlin"},
                             "muted_types": []}),
        );
        assert_eq!(
            gate(&p, Some("t"), Priority::Normal, utc("2026-10-25T01:10:00Z")),
            Gate::Hold(utc("2026-10-25T01:30:00Z")),
            "02:10 CET, the second pass"
        );
        assert_eq!(
            gate(&p, Some("t"), Priority::Normal, utc("2026-10-25T00:10:00Z")),
            Gate::Hold(utc("2026-10-25T00:30:00Z")),
            "02:10 CEST, the first pass"
        );
        assert_eq!(Preferences::default().quiet_hours, None);
        assert_eq!(
            gate(
                &Preferences::default(),
                Some("t"),
                Priority::Low,
                utc("2026-11-01T03:00:00Z")
            ),
            Gate::Go
        );
    }
}
