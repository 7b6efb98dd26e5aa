//! The user's standing choice: what `wx.getSetting({withSubscriptions: true})` says
//! (docs/design.md §3).
//!
//! `subscriptionsSetting` has the main switch and, for each template the user ticked
//! "always keep this choice" (总是保持以上选择) for, the choice kept. While the main switch
//! is off or a template's kept choice is `reject` or `ban`, asking is pointless: WeChat
//! answers without a popup (or fails, 20004). So plans of the template pause with a
//! reason that says so, and `needs_grant` stops asking until the setting changes. A kept
//! `accept` asks nothing of onegrant: each tap's silent accept is one grant, reported
//! like any other.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::Refusal;
use crate::domain::ids::TemplateId;
use crate::domain::template::Templates;

/// The most `item_settings` entries a setting may carry (the mini-program's templates,
/// onegrant's and others'; unconfigured ones are ignored).
pub const MAX_ITEM_SETTINGS: usize = 50;

/// A template's standing choice, as the user's settings keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// "Always keep" with accept: each tap buys one grant without a popup.
    Accept,
    /// "Always keep" with reject: WeChat answers `reject` without a popup.
    Reject,
    /// The template is banned for the user (`ban`).
    Ban,
    /// The main switch is off: no subscription can be asked for (20004).
    MainSwitchOff,
}

impl Standing {
    /// Every standing choice.
    pub const ALL: [Self; 4] = [Self::Accept, Self::Reject, Self::Ban, Self::MainSwitchOff];

    /// The name stored and shown (`standing` in a quota).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Reject => "reject",
            Self::Ban => "ban",
            Self::MainSwitchOff => "main_switch_off",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "accept" => Self::Accept,
            "reject" => Self::Reject,
            "ban" => Self::Ban,
            "main_switch_off" => Self::MainSwitchOff,
            _ => return None,
        })
    }

    /// The refusal it stands for, if any.
    pub fn refusal(self) -> Option<Refusal> {
        match self {
            Self::Accept => None,
            Self::Reject => Some(Refusal::AlwaysReject),
            Self::Ban => Some(Refusal::AlwaysBan),
            Self::MainSwitchOff => Some(Refusal::MainSwitchOff),
        }
    }

    /// Whether asking for the template is pointless while it stands.
    pub fn refuses(self) -> bool {
        self.refusal().is_some()
    }
}

/// One template's kept choice in `itemSettings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ItemSetting {
    Accept,
    Reject,
    Ban,
    /// WeChat filtered the template; no standing choice.
    Filter,
}

/// Why a reported setting is refused. Nothing of the request is stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{0}")]
    Shape(String),
    #[error(
        "subscriptions_setting.item_settings has {0} entries; at most {MAX_ITEM_SETTINGS} are allowed"
    )]
    TooManyItems(usize),
    #[error(
        "subscriptions_setting.item_settings.{template} is {value:?}, not one of accept, reject, ban, filter"
    )]
    InvalidItem { template: String, value: String },
    #[error("subscriptions_setting.read_at must be an RFC 3339 date-time")]
    ReadAt,
}

/// `subscriptionsSetting`, as the client reports it with a grant report or a check-in
/// (`subscriptions_setting: {main_switch, item_settings, read_at}`), reduced to
/// onegrant's configured templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionsSetting {
    main_switch: bool,
    items: BTreeMap<TemplateId, ItemSetting>,
    /// Every configured template, each of which the setting decides.
    templates: Vec<TemplateId>,
    /// When the client read it (`wx.getSetting`'s answer), if it said.
    read_at: Option<DateTime<Utc>>,
}

impl SubscriptionsSetting {
    /// The setting a request body carries (`subscriptions_setting`), if any. Entries
    /// of templates onegrant does not know are checked, then ignored.
    pub fn from_body(body: &Value, templates: &Templates) -> Result<Option<Self>, SettingError> {
        let shape = |m: &str| SettingError::Shape(format!("subscriptions_setting{m}"));
        let object = match body.get("subscriptions_setting") {
            None => return Ok(None),
            Some(Value::Object(object)) => object,
            Some(_) => return Err(shape(" must be an object")),
        };
        let main_switch = match object.get("main_switch") {
            Some(Value::Bool(on)) => *on,
            Some(_) => return Err(shape(".main_switch must be true or false")),
            None => return Err(shape(".main_switch is required")),
        };
        let raw = match object.get("item_settings") {
            None => serde_json::Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => return Err(shape(".item_settings must be an object")),
        };
        if raw.len() > MAX_ITEM_SETTINGS {
            return Err(SettingError::TooManyItems(raw.len()));
        }
        let read_at = match object.get("read_at") {
            None => None,
            Some(Value::String(s)) if s.len() <= 64 => Some(
                DateTime::parse_from_rfc3339(s)
                    .map_err(|_| SettingError::ReadAt)?
                    .with_timezone(&Utc),
            ),
            Some(_) => return Err(SettingError::ReadAt),
        };
        let mut items = BTreeMap::new();
        for (template, value) in &raw {
            let invalid = || SettingError::InvalidItem {
                template: template.chars().take(128).collect(),
                value: value.to_string().chars().take(64).collect(),
            };
            let item = match value.as_str().ok_or_else(invalid)? {
                "accept" => ItemSetting::Accept,
                "reject" => ItemSetting::Reject,
                "ban" => ItemSetting::Ban,
                "filter" => ItemSetting::Filter,
                _ => return Err(invalid()),
            };
            if let Some(def) = templates.get(template) {
                items.insert(def.id.clone(), item);
            }
        }
        Ok(Some(Self {
            main_switch,
            items,
            templates: templates.iter().map(|t| t.id.clone()).collect(),
            read_at,
        }))
    }

    /// When the setting was read, as it decides which of two settings is newer: the
    /// client's `read_at`, never later than `now` (a clock ahead of the server's cannot
    /// put a setting above the ones read after it); a setting that does not say is
    /// taken as read when it arrives.
    pub fn read_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.read_at.map_or(now, |at| at.min(now))
    }

    /// Whether this setting, read at [`Self::read_at`], is newer than the one that
    /// decided the user's standing choices (read at `decided`, if any setting did): a
    /// setting read earlier than one already applied, arriving late, changes nothing
    /// (two read at the same instant apply in the order they arrive, as two that do not
    /// say when they were read and arrive in one instant do).
    pub fn supersedes(&self, decided: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        decided.is_none_or(|decided| self.read_at(now) >= decided)
    }

    /// Every configured template with its standing choice under this setting.
    pub fn standings(&self) -> impl Iterator<Item = (&TemplateId, Option<Standing>)> {
        self.templates.iter().map(|t| (t, self.standing(t)))
    }

    /// The template's standing choice under this setting: the main switch off stands
    /// for every template; otherwise the kept choice, if any (`filter` keeps none).
    pub fn standing(&self, template: &TemplateId) -> Option<Standing> {
        if !self.main_switch {
            return Some(Standing::MainSwitchOff);
        }
        match self.items.get(template)? {
            ItemSetting::Accept => Some(Standing::Accept),
            ItemSetting::Reject => Some(Standing::Reject),
            ItemSetting::Ban => Some(Standing::Ban),
            ItemSetting::Filter => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn templates() -> Templates {
        crate::domain::template::test_templates()
    }

    fn id(s: &str) -> TemplateId {
        TemplateId::parse(s).expect("valid id")
    }

    #[test]
    fn each_item_setting_gives_its_standing_and_the_main_switch_overrides_them() {
        let body = json!({"subscriptions_setting": {"main_switch": true,
            "item_settings": {"A": "reject", "B": "accept", "other": "ban"}}});
        let setting = SubscriptionsSetting::from_body(&body, &templates())
            .expect("valid")
            .expect("present");
        assert_eq!(setting.standing(&id("A")), Some(Standing::Reject));
        assert_eq!(setting.standing(&id("B")), Some(Standing::Accept));
        let ban = json!({"subscriptions_setting": {"main_switch": true, "item_settings": {"A": "ban", "B": "filter"}}});
        let setting = SubscriptionsSetting::from_body(&ban, &templates())
            .expect("valid")
            .expect("present");
        assert_eq!(setting.standing(&id("A")), Some(Standing::Ban));
        assert_eq!(setting.standing(&id("B")), None);
        let off = json!({"subscriptions_setting": {"main_switch": false, "item_settings": {"A": "accept"}}});
        let setting = SubscriptionsSetting::from_body(&off, &templates())
            .expect("valid")
            .expect("present");
        assert_eq!(setting.standing(&id("A")), Some(Standing::MainSwitchOff));
        assert_eq!(setting.standing(&id("B")), Some(Standing::MainSwitchOff));
        let none = json!({"subscriptions_setting": {"main_switch": true}});
        let setting = SubscriptionsSetting::from_body(&none, &templates())
            .expect("valid")
            .expect("present");
        assert_eq!(setting.standing(&id("A")), None);
    }

    #[test]
    fn a_body_without_a_setting_has_none() {
        assert_eq!(
            SubscriptionsSetting::from_body(&json!({}), &templates()),
            Ok(None)
        );
    }

    #[test]
    fn bad_settings_are_refused_each_with_its_error() {
        let many: serde_json::Map<String, Value> = (0..=MAX_ITEM_SETTINGS)
            .map(|i| (format!("t{i}"), json!("accept")))
            .collect();
        let cases = [
            (json!({"subscriptions_setting": "on"}), "must be an object"),
            (json!({"subscriptions_setting": null}), "must be an object"),
            (
                json!({"subscriptions_setting": {"main_switch": false, "item_settings": null}}),
                "item_settings must be an object",
            ),
            (
                json!({"subscriptions_setting": {}}),
                "main_switch is required",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": "true"}}),
                "main_switch must be true or false",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "item_settings": ["A"]}}),
                "item_settings must be an object",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "item_settings": {"A": "always"}}}),
                "item_settings.A is \"\\\"always\\\"\"",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "item_settings": {"x": 1}}}),
                "item_settings.x is \"1\"",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "item_settings": many}}),
                "at most 50",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "read_at": "yesterday"}}),
                "read_at must be an RFC 3339 date-time",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "read_at": 1764990000000_i64}}),
                "read_at must be an RFC 3339 date-time",
            ),
            (
                json!({"subscriptions_setting": {"main_switch": true, "read_at": "2026-12-06T05:00:00"}}),
                "read_at must be an RFC 3339 date-time",
            ),
        ];
        for (body, expected) in cases {
            let err = SubscriptionsSetting::from_body(&body, &templates())
                .expect_err("refused")
                .to_string();
            assert!(err.contains(expected), "{body}: {err}");
        }
    }

    #[test]
    fn a_setting_supersedes_only_what_was_decided_by_one_read_before_it() {
        let now = crate::domain::at("2026-12-06T05:00:00Z");
        let read = |at: Option<&str>| {
            let mut setting = json!({"main_switch": true});
            if let Some(at) = at {
                setting["read_at"] = json!(at);
            }
            SubscriptionsSetting::from_body(
                &json!({ "subscriptions_setting": setting }),
                &templates(),
            )
            .expect("valid")
            .expect("present")
        };
        let earlier = read(Some("2026-12-06T04:59:00Z"));
        let decided = Some(crate::domain::at("2026-12-06T04:59:30Z"));
        assert!(!earlier.supersedes(decided, now), "read before: stale");
        assert!(earlier.supersedes(None, now), "nothing decided yet");
        assert!(
            read(Some("2026-12-06T04:59:30Z")).supersedes(decided, now),
            "the same instant: in arrival order"
        );
        assert!(!read(Some("2026-12-06T04:59:29.999Z")).supersedes(decided, now));
        assert!(read(Some("2026-12-06T04:59:31+00:00")).supersedes(decided, now));
        // A clock ahead counts as now; no `read_at` is read on arrival.
        let ahead = read(Some("2026-12-07T05:00:00Z"));
        assert_eq!(ahead.read_at(now), now);
        assert_eq!(read(None).read_at(now), now);
        assert!(!ahead.supersedes(Some(now + chrono::Duration::milliseconds(1)), now));
        // Offsets are instants: 13:00+08:00 is 05:00Z.
        assert_eq!(
            read(Some("2026-12-06T12:59:00+08:00")).read_at(now),
            crate::domain::at("2026-12-06T04:59:00Z")
        );
    }

    #[test]
    fn only_refusing_standings_stand_for_a_refusal() {
        assert_eq!(Standing::Accept.refusal(), None);
        assert_eq!(Standing::Reject.refusal(), Some(Refusal::AlwaysReject));
        assert_eq!(Standing::Ban.refusal(), Some(Refusal::AlwaysBan));
        assert_eq!(
            Standing::MainSwitchOff.refusal(),
            Some(Refusal::MainSwitchOff)
        );
        for s in Standing::ALL {
            assert_eq!(Standing::parse(s.as_str()), Some(s));
            // (A new variant fails to compile here until it has an arm; give it its
            // place in ALL too, or `not_refused` conditions will miss it.)
            let index = match s {
                Standing::Accept => 0,
                Standing::Reject => 1,
                Standing::Ban => 2,
                Standing::MainSwitchOff => 3,
            };
            assert_eq!(Standing::ALL[index], s);
        }
    }
}
