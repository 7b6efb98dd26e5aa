//! When a notification appears and when its push may go: the `notify` event's
//! `send_at`, `expires_at` and `priority`.
//!
//! A notification whose `send_at` is ahead is kept aside (on the due index, with its
//! push) and **published** at that instant: only then is it listed, counted unread and
//! its push made due. A push not gone out by `expires_at` is never sent: it ends
//! `expired` and spends no grant. Pure: the caller passes `now`.

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;

use crate::domain::inbox::error::EventError;
use crate::domain::template::Priority;

/// How far ahead a notification may be scheduled.
pub const MAX_AHEAD: Duration = Duration::days(30);

/// The longest a push waits once its notification is published — for a grant, past a
/// daily cap, through quiet hours — before it ends `expired` (inbox-only): an
/// `expires_at` later than this counts as this. Bounded, so the event's record (which
/// cancels and replacements find it by) outlives every push: it is kept until a day
/// after the push's last moment ([`Timing::send_by`]) when that is later than the
/// replay window.
pub const MAX_WAIT: Duration = Duration::days(30);

/// A notify event's timing, validated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// `send_at` as the publisher gave it (None: now).
    pub send_at: Option<DateTime<Utc>>,
    /// `expires_at`: a push not gone out by then is never sent.
    pub expires_at: Option<DateTime<Utc>>,
    pub priority: Priority,
}

fn instant(
    object: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<DateTime<Utc>>, EventError> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() <= 64 => DateTime::parse_from_rfc3339(s)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|_| {
                EventError::Shape(format!(
                    "{name} must be an RFC 3339 time with an offset, e.g. 2026-12-01T09:00:00+08:00"
                ))
            }),
        Some(_) => Err(EventError::Shape(format!(
            "{name} must be an RFC 3339 time with an offset, e.g. 2026-12-01T09:00:00+08:00"
        ))),
    }
}

impl Timing {
    /// The timing fields of a `notify` event's `detail`, checked at `now`: `send_at`
    /// more than [`MAX_AHEAD`] ahead is refused (nothing is stored).
    pub fn from_json(
        object: &serde_json::Map<String, Value>,
        now: DateTime<Utc>,
    ) -> Result<Self, EventError> {
        let send_at = instant(object, "send_at")?;
        if send_at.is_some_and(|at| at - now > MAX_AHEAD) {
            return Err(EventError::Shape(format!(
                "send_at is more than {} days ahead",
                MAX_AHEAD.num_days()
            )));
        }
        let expires_at = instant(object, "expires_at")?;
        let priority = match object.get("priority") {
            None | Some(Value::Null) => Priority::default(),
            Some(Value::String(p)) => Priority::parse(p).ok_or_else(|| {
                EventError::Shape("priority must be \"high\", \"normal\" or \"low\"".into())
            })?,
            Some(_) => {
                return Err(EventError::Shape(
                    "priority must be \"high\", \"normal\" or \"low\"".into(),
                ));
            }
        };
        Ok(Self {
            send_at,
            expires_at,
            priority,
        })
    }

    /// When the notification appears and its push is first due: `send_at`, or `now`
    /// when it is absent or past.
    pub fn publish_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.send_at.map_or(now, |at| at.max(now))
    }

    /// The push's last moment, published at `publish_at`: its `expires_at`, and never
    /// later than [`MAX_WAIT`] after the publication.
    pub fn send_by(&self, publish_at: DateTime<Utc>) -> DateTime<Utc> {
        let ceiling = publish_at + MAX_WAIT;
        self.expires_at.map_or(ceiling, |at| at.min(ceiling))
    }

    /// How long the event's record is kept, published at `publish_at`: its replay
    /// `window` from now, and for an event whose push waits to be sent (`pending`)
    /// never less than a day past the push's last moment — a cancel or a replacement
    /// finds the push as long as it can wait.
    pub fn record_until(
        &self,
        pending: bool,
        publish_at: DateTime<Utc>,
        now: DateTime<Utc>,
        window: Duration,
    ) -> DateTime<Utc> {
        let replay = now + window;
        if pending {
            replay.max(self.send_by(publish_at) + Duration::days(1))
        } else {
            replay
        }
    }

    /// Whether the notification waits to be published (its `send_at` is ahead).
    pub fn is_scheduled(&self, now: DateTime<Utc>) -> bool {
        self.publish_at(now) > now
    }

    /// The canonical fields for the event's fingerprint: only those given, so an event
    /// without them has the fingerprint it had before they existed.
    pub fn canonical(&self) -> Vec<(&'static str, Value)> {
        let mut fields = Vec::new();
        if let Some(at) = self.send_at {
            fields.push(("send_at", Value::from(at.timestamp_millis())));
        }
        if let Some(at) = self.expires_at {
            fields.push(("expires_at", Value::from(at.timestamp_millis())));
        }
        if self.priority != Priority::default() {
            fields.push(("priority", Value::from(self.priority.as_str())));
        }
        fields
    }
}

/// Whether a push whose `expires_at` is `expires_at` (epoch ms, as stored) may no
/// longer go out at `now`.
pub fn is_expired(expires_at: Option<i64>, now: DateTime<Utc>) -> bool {
    expires_at.is_some_and(|at| at <= now.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_outlives_its_pending_push_by_a_day_and_its_replay_window_always() {
        let window = Duration::days(35);
        let timing = |expires_at| Timing {
            send_at: None,
            expires_at,
            priority: Priority::default(),
        };
        // No push waiting: the replay window.
        assert_eq!(
            timing(None).record_until(false, now(), now(), window),
            now() + window
        );
        // A push that may wait longer than the window: a day past its last moment.
        let last = now() + MAX_WAIT;
        assert_eq!(
            timing(None).record_until(true, now(), now(), window),
            (now() + window).max(last + Duration::days(1))
        );
        // One that expires soon: never less than the replay window.
        let soon = timing(Some(now() + Duration::hours(1)));
        assert_eq!(
            soon.record_until(true, now(), now(), window),
            now() + window
        );
        let short = Duration::hours(1);
        assert_eq!(
            soon.record_until(true, now(), now(), short),
            now() + Duration::hours(1) + Duration::days(1)
        );
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    fn timing(detail: Value) -> Result<Timing, EventError> {
        Timing::from_json(detail.as_object().expect("object"), now())
    }

    #[test]
    fn a_push_waits_at_most_max_wait_after_its_publication() {
        let now = crate::domain::at("2026-12-06T00:00:00Z");
        let of = |detail: serde_json::Value| {
            Timing::from_json(detail.as_object().expect("object"), now).expect("timing")
        };
        assert_eq!(of(json!({})).send_by(now), now + MAX_WAIT);
        let soon = crate::domain::at("2026-12-07T00:00:00Z");
        assert_eq!(
            of(json!({"expires_at": "2026-12-07T00:00:00Z"})).send_by(now),
            soon
        );
        assert_eq!(
            of(json!({"expires_at": "2027-06-01T00:00:00Z"})).send_by(now),
            now + MAX_WAIT,
            "a later expires_at counts as the ceiling"
        );
        let later = now + Duration::days(20);
        assert_eq!(of(json!({})).send_by(later), later + MAX_WAIT);
    }

    #[test]
    fn bad_timings_are_refused_with_their_reason() {
        let cases = [
            (
                json!({"send_at": "tomorrow"}),
                "send_at must be an RFC 3339",
            ),
            (
                json!({"send_at": "2026-12-02T09:00:00"}),
                "send_at must be an RFC 3339",
            ),
            (
                json!({"send_at": 1_800_000_000}),
                "send_at must be an RFC 3339",
            ),
            (
                json!({"send_at": "2027-01-01T12:00:01Z"}),
                "more than 30 days ahead",
            ),
            (
                json!({"expires_at": "soon"}),
                "expires_at must be an RFC 3339",
            ),
            (json!({"priority": "urgent"}), "priority must be"),
            (json!({"priority": 1}), "priority must be"),
            (
                json!({"send_at": "x".repeat(100)}),
                "send_at must be an RFC 3339",
            ),
        ];
        for (detail, reason) in cases {
            let error = timing(detail.clone()).expect_err(&detail.to_string());
            assert!(error.to_string().contains(reason), "{detail}: {error}");
        }
    }

    #[test]
    fn send_at_absent_or_past_is_now_and_ahead_is_kept_to_the_millisecond() {
        let t = timing(json!({})).expect("valid");
        assert_eq!((t.publish_at(now()), t.is_scheduled(now())), (now(), false));
        assert_eq!(t.priority, Priority::Normal);
        assert!(
            t.canonical().is_empty(),
            "no timing, no change to the fingerprint"
        );
        let past = timing(json!({"send_at": "2026-12-01T19:59:00+08:00"})).expect("valid");
        assert_eq!(
            (past.publish_at(now()), past.is_scheduled(now())),
            (now(), false)
        );
        let ahead = timing(json!({"send_at": "2026-12-01T20:00:20.250+08:00", "priority": "high"}))
            .expect("valid");
        assert_eq!(
            ahead.publish_at(now()),
            now() + Duration::milliseconds(20_250)
        );
        assert!(ahead.is_scheduled(now()));
        assert_eq!(ahead.priority, Priority::High);
        let at_limit =
            timing(json!({"send_at": "2026-12-31T12:00:00Z"})).expect("30 days is allowed");
        assert!(at_limit.is_scheduled(now()));
    }

    #[test]
    fn a_push_expires_at_its_instant() {
        let at = now().timestamp_millis();
        assert!(!is_expired(None, now()));
        assert!(!is_expired(Some(at + 1), now()));
        assert!(is_expired(Some(at), now()));
        assert!(is_expired(Some(at - 1), now()));
    }
}
