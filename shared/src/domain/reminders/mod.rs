//! Reminder kinds (`water`, …) as configured, and the requests that change a plan:
//! settings (`PUT /v1/reminders/{kind}`) and check-ins (`POST …/checkins`).
//!
//! Parsing here turns a decoded JSON body into validated values, with one error
//! variant per client mistake; the HTTP layer maps each to its status in one place.

mod body;
pub mod check_in;
pub mod plan;
pub mod schedule;
pub mod settings;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::grants::SubscribeResult;
use crate::domain::ids::{IdError, RequestId, TemplateId};
use crate::domain::reminders::body::{str_field, u32_field};
use crate::domain::reminders::schedule::{
    MAX_INTERVAL_MINUTES, MIN_INTERVAL_MINUTES, Schedule, ScheduleError, TimeOfDay, Timezone,
};
use crate::domain::template::Templates;

/// Daily goals onegrant accepts.
pub const MAX_DAILY_GOAL: u32 = 100;
/// Counts onegrant accepts in a check-in.
pub const MAX_COUNT: u32 = 1000;
/// How far in the past a check-in may still move the schedule; older ones are
/// recorded but scheduled as if they happened now (never into the past).
pub const MAX_SCHEDULING_AGE: Duration = Duration::hours(24);

/// A reminder kind's name: 1–32 of `[a-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct KindName(String);

impl KindName {
    pub fn parse(value: &str) -> Option<Self> {
        let ok = !value.is_empty()
            && value.len() <= 32
            && value
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        ok.then(|| Self(value.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for KindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A plan's user-settable settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub schedule: Schedule,
    pub daily_goal: u32,
}

/// A configured reminder kind: its template, default settings and message content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReminderKind {
    pub name: KindName,
    pub template_id: TemplateId,
    pub defaults: Settings,
    /// Keyword → value, with placeholders [`CONTENT_PLACEHOLDERS`] filled at send time.
    pub content: BTreeMap<String, String>,
}

/// Placeholders a kind's content may use: the due time (`HH:MM`) and date
/// (`YYYY年M月D日`) in the user's zone, today's count and the daily goal.
pub const CONTENT_PLACEHOLDERS: [&str; 4] = ["{due_time}", "{due_date}", "{count}", "{goal}"];

/// Values for a kind's content placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentValues {
    pub due_time: String,
    pub due_date: String,
    pub count: u32,
    pub goal: u32,
}

impl ReminderKind {
    /// The kind's content with its placeholders filled.
    pub fn render(&self, values: &ContentValues) -> BTreeMap<String, String> {
        self.content
            .iter()
            .map(|(k, v)| {
                let text = v
                    .replace("{due_time}", &values.due_time)
                    .replace("{due_date}", &values.due_date)
                    .replace("{count}", &values.count.to_string())
                    .replace("{goal}", &values.goal.to_string());
                (k.clone(), text)
            })
            .collect()
    }
}

/// Every configured kind; `water` always exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReminderKinds(BTreeMap<String, ReminderKind>);

/// Why the reminder configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ReminderConfigError {
    #[error("reminders are not valid JSON of the documented shape: {0}")]
    Json(#[from] serde_json::Error),
    #[error("reminder kind name {0:?} is invalid")]
    Name(String),
    #[error("reminder kind {kind}: template {template:?} is not configured")]
    Template { kind: String, template: String },
    #[error("reminder kind {kind}: {source}")]
    Settings { kind: String, source: SettingsError },
    #[error("reminder kind {0} is listed twice")]
    Duplicate(String),
    #[error("the water reminder must be configured (its template at least)")]
    NoWater,
    #[error("reminder kind {kind}: content must give exactly the template's keywords ({expected})")]
    Content { kind: String, expected: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKind {
    kind: String,
    template_id: String,
    #[serde(default = "default_interval")]
    interval_minutes: u32,
    #[serde(default = "default_wake")]
    wake_time: String,
    #[serde(default = "default_sleep")]
    sleep_time: String,
    #[serde(default = "default_timezone")]
    timezone: String,
    #[serde(default = "default_goal")]
    daily_goal: u32,
    content: BTreeMap<String, String>,
}

fn default_interval() -> u32 {
    120
}
fn default_wake() -> String {
    "08:00".into()
}
fn default_sleep() -> String {
    "22:00".into()
}
fn default_timezone() -> String {
    "Asia/Shanghai".into()
}
fn default_goal() -> u32 {
    8
}

impl ReminderKinds {
    /// Parses `ONEGRANT_REMINDERS`: `[{"kind", "template_id", "content",
    /// "interval_minutes", "wake_time", "sleep_time", "timezone", "daily_goal"}]`; the
    /// settings default to water's (120 min, 08:00–22:00, Asia/Shanghai, 8). `content`
    /// maps every keyword of the template to its text.
    pub fn from_json(json: &str, templates: &Templates) -> Result<Self, ReminderConfigError> {
        let raw: Vec<RawKind> = serde_json::from_str(json)?;
        let mut map = BTreeMap::new();
        for k in raw {
            let name = KindName::parse(&k.kind)
                .ok_or_else(|| ReminderConfigError::Name(k.kind.clone()))?;
            let template =
                templates
                    .get(&k.template_id)
                    .ok_or_else(|| ReminderConfigError::Template {
                        kind: k.kind.clone(),
                        template: k.template_id.clone(),
                    })?;
            let settings = |source| ReminderConfigError::Settings {
                kind: k.kind.clone(),
                source,
            };
            let schedule = Schedule::new(
                k.interval_minutes,
                TimeOfDay::parse(&k.wake_time, "wake_time")
                    .map_err(|e| settings(SettingsError::Schedule(e)))?,
                TimeOfDay::parse(&k.sleep_time, "sleep_time")
                    .map_err(|e| settings(SettingsError::Schedule(e)))?,
                Timezone::parse(&k.timezone).map_err(|e| settings(SettingsError::Schedule(e)))?,
            )
            .map_err(|e| settings(SettingsError::Schedule(e)))?;
            if !(1..=MAX_DAILY_GOAL).contains(&k.daily_goal) {
                return Err(settings(SettingsError::DailyGoal));
            }
            let expected: Vec<&str> = template.keywords.iter().map(|kw| kw.key.as_str()).collect();
            let given: Vec<&str> = k.content.keys().map(String::as_str).collect();
            let mut sorted = expected.clone();
            sorted.sort_unstable();
            if sorted != given {
                return Err(ReminderConfigError::Content {
                    kind: k.kind.clone(),
                    expected: expected.join(", "),
                });
            }
            let kind = ReminderKind {
                name: name.clone(),
                template_id: template.id.clone(),
                defaults: Settings {
                    schedule,
                    daily_goal: k.daily_goal,
                },
                content: k.content,
            };
            if map.insert(name.to_string(), kind).is_some() {
                return Err(ReminderConfigError::Duplicate(name.to_string()));
            }
        }
        if !map.contains_key("water") {
            return Err(ReminderConfigError::NoWater);
        }
        Ok(Self(map))
    }

    /// No kind at all: a store built without the configuration (an operator's tool)
    /// finds no plan's kind.
    pub fn none() -> Self {
        Self(BTreeMap::new())
    }

    pub fn get(&self, name: &str) -> Option<&ReminderKind> {
        self.0.get(name)
    }

    /// The kinds whose template is `template`.
    pub fn using_template<'a>(
        &'a self,
        template: &'a TemplateId,
    ) -> impl Iterator<Item = &'a ReminderKind> {
        self.0.values().filter(move |k| &k.template_id == template)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ReminderKind> {
        self.0.values()
    }
}

/// Why plan settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    Schedule(ScheduleError),
    #[error("daily_goal must be between 1 and {MAX_DAILY_GOAL}")]
    DailyGoal,
}

/// A validated `PUT /v1/reminders/{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingsUpdate {
    pub enabled: bool,
    pub settings: Settings,
}

/// A settings body, every field it gives checked on its own: what can be refused
/// before anything is read. [`SettingsPatch::apply`] completes it with the current
/// settings (absent fields keep their value) and checks the whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingsPatch {
    enabled: bool,
    interval_minutes: Option<u32>,
    wake_time: Option<TimeOfDay>,
    sleep_time: Option<TimeOfDay>,
    timezone: Option<Timezone>,
    daily_goal: Option<u32>,
}

impl SettingsPatch {
    pub fn from_json(body: &Value) -> Result<Self, SettingsError> {
        let object = body
            .as_object()
            .ok_or_else(|| SettingsError::Shape("the body must be a JSON object".into()))?;
        let enabled = match object.get("enabled") {
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(SettingsError::Shape("enabled must be true or false".into())),
            None => return Err(SettingsError::Shape("enabled is required".into())),
        };
        let interval = u32_field(object, "interval_minutes").map_err(SettingsError::Shape)?;
        let wake = str_field(object, "wake_time").map_err(SettingsError::Shape)?;
        let sleep = str_field(object, "sleep_time").map_err(SettingsError::Shape)?;
        let zone = str_field(object, "timezone").map_err(SettingsError::Shape)?;
        let goal = u32_field(object, "daily_goal").map_err(SettingsError::Shape)?;
        let interval_minutes = interval
            .map(|i| {
                u32::try_from(i)
                    .ok()
                    .filter(|i| (MIN_INTERVAL_MINUTES..=MAX_INTERVAL_MINUTES).contains(i))
                    .ok_or(SettingsError::Schedule(ScheduleError::Interval))
            })
            .transpose()?;
        let time = |value: Option<&str>, name| {
            value
                .map(|v| TimeOfDay::parse(v, name).map_err(SettingsError::Schedule))
                .transpose()
        };
        let wake_time = time(wake, "wake_time")?;
        let sleep_time = time(sleep, "sleep_time")?;
        let timezone = zone
            .map(|z| Timezone::parse(z).map_err(SettingsError::Schedule))
            .transpose()?;
        if wake_time.is_some() && wake_time == sleep_time {
            return Err(SettingsError::Schedule(ScheduleError::EmptyDay));
        }
        let daily_goal = goal
            .map(|g| {
                u32::try_from(g)
                    .ok()
                    .filter(|g| (1..=MAX_DAILY_GOAL).contains(g))
                    .ok_or(SettingsError::DailyGoal)
            })
            .transpose()?;
        Ok(Self {
            enabled,
            interval_minutes,
            wake_time,
            sleep_time,
            timezone,
            daily_goal,
        })
    }

    /// The update this patch makes to `current`.
    pub fn apply(&self, current: &Settings) -> Result<SettingsUpdate, SettingsError> {
        let s = &current.schedule;
        let schedule = Schedule::new(
            self.interval_minutes.unwrap_or(s.interval_minutes()),
            self.wake_time.unwrap_or(s.wake_time()),
            self.sleep_time.unwrap_or(s.sleep_time()),
            self.timezone.unwrap_or(s.timezone()),
        )
        .map_err(SettingsError::Schedule)?;
        Ok(SettingsUpdate {
            enabled: self.enabled,
            settings: Settings {
                schedule,
                daily_goal: self.daily_goal.unwrap_or(current.daily_goal),
            },
        })
    }
}

impl SettingsUpdate {
    /// Validates a body against the current settings: absent fields keep their value.
    pub fn from_json(body: &Value, current: &Settings) -> Result<Self, SettingsError> {
        SettingsPatch::from_json(body)?.apply(current)
    }
}

/// Why a check-in is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckInError {
    #[error("{0}")]
    Shape(String),
    #[error("action_id: {0}")]
    ActionId(IdError),
    #[error("grant_request_id: {0}")]
    GrantRequestId(IdError),
    #[error("grant_request_id and subscription_status go together")]
    GrantPair,
    #[error(
        "subscription_status {0:?} is not one of accept, acceptWithAudio, acceptWithAlert, reject, ban, filter"
    )]
    Status(String),
    #[error("occurred_at must be an RFC 3339 time with an offset")]
    OccurredAt,
    #[error("current_count must be between 0 and {MAX_COUNT}")]
    Count,
    #[error("daily_goal must be between 1 and {MAX_DAILY_GOAL}")]
    DailyGoal,
}

/// A validated check-in: the mini-program's pending action, exactly as queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckIn {
    pub action_id: RequestId,
    /// The grant this check-in carries: (request_id, result).
    pub grant: Option<(RequestId, SubscribeResult)>,
    pub occurred_at: DateTime<Utc>,
    pub current_count: u32,
    pub daily_goal: u32,
}

impl CheckIn {
    /// Validates a body. Any parseable `occurred_at` is accepted, in the future too: a
    /// phone whose clock runs fast still made the check-in (I7); see
    /// [`Self::counted_at`] and [`Self::scheduling_instant`] for how it is bounded (I9).
    pub fn from_json(body: &Value) -> Result<Self, CheckInError> {
        let object = body
            .as_object()
            .ok_or_else(|| CheckInError::Shape("the body must be a JSON object".into()))?;
        let required_str = |name: &str| -> Result<&str, CheckInError> {
            str_field(object, name)
                .map_err(CheckInError::Shape)?
                .ok_or_else(|| CheckInError::Shape(format!("{name} is required")))
        };
        let required_int = |name: &str| -> Result<i64, CheckInError> {
            u32_field(object, name)
                .map_err(CheckInError::Shape)?
                .ok_or_else(|| CheckInError::Shape(format!("{name} is required")))
        };
        let action_id =
            RequestId::parse(required_str("action_id")?).map_err(CheckInError::ActionId)?;
        let occurred = required_str("occurred_at")?;
        let count = required_int("current_count")?;
        let goal = required_int("daily_goal")?;
        let grant_request = str_field(object, "grant_request_id").map_err(CheckInError::Shape)?;
        let status = str_field(object, "subscription_status").map_err(CheckInError::Shape)?;

        let occurred_at = DateTime::parse_from_rfc3339(occurred)
            .map_err(|_| CheckInError::OccurredAt)?
            .with_timezone(&Utc);
        let current_count = u32::try_from(count)
            .ok()
            .filter(|c| *c <= MAX_COUNT)
            .ok_or(CheckInError::Count)?;
        let daily_goal = u32::try_from(goal)
            .ok()
            .filter(|g| (1..=MAX_DAILY_GOAL).contains(g))
            .ok_or(CheckInError::DailyGoal)?;
        let grant = match (grant_request, status) {
            (None, None) => None,
            (Some(r), Some(s)) => Some((
                RequestId::parse(r).map_err(CheckInError::GrantRequestId)?,
                SubscribeResult::parse(s).ok_or_else(|| CheckInError::Status(s.to_string()))?,
            )),
            _ => return Err(CheckInError::GrantPair),
        };
        Ok(Self {
            action_id,
            grant,
            occurred_at,
            current_count,
            daily_goal,
        })
    }

    /// The instant the check-in counts at: `occurred_at`, clamped to `now` when the
    /// client's clock is ahead. Its waking day is the day the count belongs to.
    pub fn counted_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.occurred_at.min(now)
    }

    /// The instant scheduling starts from: `occurred_at`, but never older than
    /// [`MAX_SCHEDULING_AGE`] and never later than `now` (an action from the distant
    /// past is recorded but never schedules into the past).
    pub fn scheduling_instant(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.occurred_at.clamp(now - MAX_SCHEDULING_AGE, now)
    }

    /// A canonical text of everything the client sent, for "same key, same payload".
    pub fn fingerprint(&self, kind: &KindName) -> String {
        serde_json::json!({
            "kind": kind.as_str(),
            "action_id": self.action_id.as_str(),
            "grant": self.grant.as_ref().map(|(r, s)| [r.as_str(), s.as_str()]),
            "occurred_at_ms": self.occurred_at.timestamp_millis(),
            "current_count": self.current_count,
            "daily_goal": self.daily_goal,
        })
        .to_string()
    }
}

/// The water kind the domain's tests share: every two hours, awake all day, in UTC.
#[cfg(test)]
pub(crate) fn test_kind() -> ReminderKind {
    let schedule = Schedule::new(
        120,
        TimeOfDay::parse("00:00", "wake_time").expect("wake"),
        TimeOfDay::parse("23:59", "sleep_time").expect("sleep"),
        Timezone::parse("UTC").expect("zone"),
    )
    .expect("schedule");
    ReminderKind {
        name: KindName::parse("water").expect("kind"),
        template_id: TemplateId::parse("tmpl_water").expect("template"),
        defaults: Settings {
            schedule,
            daily_goal: 8,
        },
        content: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-07-27T12:10:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
    }

    #[test]
    fn the_seed_articles_pending_action_parses() {
        let body = json!({"action_id":"wc_m1","grant_request_id":"wr_m1","subscription_status":"accept","occurred_at":"2026-07-27T12:05:00.000Z","current_count":4,"daily_goal":8});
        let c = CheckIn::from_json(&body).expect("valid");
        assert_eq!(c.current_count, 4);
        assert_eq!(
            c.grant.as_ref().map(|(r, s)| (r.as_str(), *s)),
            Some(("wr_m1", SubscribeResult::Accept))
        );
    }

    #[test]
    fn bad_check_ins_get_their_own_error() {
        let base = json!({"action_id":"wc_1","occurred_at":"2026-07-27T12:05:00+08:00","current_count":1,"daily_goal":8});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        let cases = [
            (with("action_id", json!("bad id")), "ActionId"),
            (with("occurred_at", json!("yesterday")), "OccurredAt"),
            (with("occurred_at", json!("2026-07-27 12:05")), "OccurredAt"),
            (with("current_count", json!(-1)), "Count"),
            (with("current_count", json!(1.5)), "Shape"),
            (with("daily_goal", json!(0)), "DailyGoal"),
            (with("grant_request_id", json!("wr_1")), "GrantPair"),
            (with("subscription_status", json!("accept")), "GrantPair"),
            (json!({"action_id":"wc_1"}), "Shape"),
        ];
        for (body, want) in cases {
            let err = CheckIn::from_json(&body).expect_err("refused");
            assert!(format!("{err:?}").starts_with(want), "{body}: {err:?}");
        }
    }

    #[test]
    fn scheduling_never_starts_in_the_future_or_the_distant_past() {
        let old = json!({"action_id":"wc_1","occurred_at":"2026-07-01T12:00:00Z","current_count":1,"daily_goal":8});
        let c = CheckIn::from_json(&old).expect("recorded");
        assert_eq!(c.scheduling_instant(now()), now() - MAX_SCHEDULING_AGE);
        for ahead in ["2026-07-27T12:20:00Z", "2036-07-27T12:00:00Z"] {
            let body =
                json!({"action_id":"wc_2","occurred_at":ahead,"current_count":1,"daily_goal":8});
            let c = CheckIn::from_json(&body).expect("a fast clock is recorded");
            assert_eq!(c.scheduling_instant(now()), now(), "{ahead}");
            assert_eq!(c.counted_at(now()), now(), "{ahead}: counts now");
        }
        let past = json!({"action_id":"wc_3","occurred_at":"2026-07-27T11:00:00Z","current_count":1,"daily_goal":8});
        let c = CheckIn::from_json(&past).expect("recorded");
        assert!(
            c.counted_at(now()) < now(),
            "a past check-in counts when it happened"
        );
    }
}
