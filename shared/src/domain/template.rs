//! Subscription-message templates as configured: id, title, keywords and page.
//!
//! A keyword's type is fixed by the prefix of its key (`thing1` is a `thing`), exactly as
//! WeChat derives it; reference/wechat.md §2 lists the types and their value rules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::ids::TemplateId;

/// How much a push matters when it competes (quiet hours, scarce grants): a
/// template's own by default, a publisher's choice per push.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    pub const ALL: [Self; 3] = [Self::High, Self::Normal, Self::Low];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == value)
    }
}

/// The value type of a template keyword, named by the key's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeywordType {
    Thing,
    ShortThing,
    Number,
    Letter,
    Symbol,
    CharacterString,
    Time,
    Date,
    Amount,
    PhoneNumber,
    CarNumber,
    Name,
    Phrase,
    Enum,
}

impl KeywordType {
    /// Longest prefixes first, so `short_thing` is not read as `thing`.
    const PREFIXES: [(&'static str, KeywordType); 14] = [
        ("character_string", KeywordType::CharacterString),
        ("phone_number", KeywordType::PhoneNumber),
        ("short_thing", KeywordType::ShortThing),
        ("car_number", KeywordType::CarNumber),
        ("amount", KeywordType::Amount),
        ("letter", KeywordType::Letter),
        ("number", KeywordType::Number),
        ("phrase", KeywordType::Phrase),
        ("symbol", KeywordType::Symbol),
        ("thing", KeywordType::Thing),
        ("date", KeywordType::Date),
        ("enum", KeywordType::Enum),
        ("name", KeywordType::Name),
        ("time", KeywordType::Time),
    ];

    /// Whether a refill notice (`domain::inbox::refill`) can fill a keyword of
    /// this type: with the stopped template's title (`thing`, `short_thing`) or the
    /// depletion's time (`time`, `date`).
    pub fn fills_refill(self) -> bool {
        matches!(
            self,
            KeywordType::Thing | KeywordType::ShortThing | KeywordType::Time | KeywordType::Date
        )
    }

    /// The type of a keyword key such as `thing1` or `character_string13`: a known
    /// prefix followed by one or more digits.
    pub fn of_key(key: &str) -> Option<KeywordType> {
        Self::PREFIXES.iter().find_map(|(prefix, kind)| {
            let rest = key.strip_prefix(prefix)?;
            (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())).then_some(*kind)
        })
    }
}

/// One keyword of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Keyword {
    /// The key sent in `data`, e.g. `thing1`.
    pub key: String,
    /// A human name for documentation and logs, e.g. "提醒内容".
    pub name: String,
    pub kind: KeywordType,
    /// For an `enum` keyword, the template's enum list (`keywordEnumValueList` of
    /// `gettemplate`): a value outside it is refused before sending. Empty: any value of
    /// at most 20 characters.
    pub values: Vec<String>,
}

/// A configured template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateDef {
    pub id: TemplateId,
    pub title: String,
    pub keywords: Vec<Keyword>,
    /// The mini-program page the message opens, e.g. `pages/water/index`.
    pub page: Option<String>,
    /// The template of the notice sent once when a user's grants of this one run out
    /// (`domain::inbox::refill`); the client asks for both in one tap.
    pub refill_template: Option<TemplateId>,
    /// The `priority` of its pushes whose event names none (`normal` when unset):
    /// when grants are scarce it decides which waiting push goes first.
    pub priority: Option<Priority>,
}

/// The configured templates, looked up by id, listed in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Templates(BTreeMap<TemplateId, TemplateDef>);

/// Why the template configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TemplateConfigError {
    #[error("templates are not valid JSON of the documented shape: {0}")]
    Json(#[from] serde_json::Error),
    #[error("template id {0:?} is invalid")]
    Id(String),
    #[error("template {0} is listed twice")]
    Duplicate(TemplateId),
    #[error("template {template}: keyword key {key:?} has no known type prefix")]
    KeywordKey { template: TemplateId, key: String },
    #[error("template {0} has no keywords")]
    NoKeywords(TemplateId),
    #[error("template {template}: keyword {key} lists values but is not an enum")]
    Values { template: TemplateId, key: String },
    #[error("template {template}: refill_template {why}")]
    Refill { template: TemplateId, why: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    id: String,
    title: String,
    keywords: Vec<RawKeyword>,
    #[serde(default)]
    page: Option<String>,
    #[serde(default)]
    refill_template: Option<String>,
    #[serde(default)]
    priority: Option<Priority>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyword {
    key: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    values: Vec<String>,
}

impl Templates {
    /// Parses the `ONEGRANT_TEMPLATES` JSON: an array of
    /// `{"id", "title", "keywords": [{"key", "name", "values"}], "page",
    /// "refill_template", "priority"}` (`values`: an `enum` keyword's list;
    /// `refill_template`: another configured template, itself naming none, whose keywords
    /// a refill notice can fill; `priority`: `high`, `normal` or `low`, its pushes'
    /// default).
    pub fn from_json(json: &str) -> Result<Self, TemplateConfigError> {
        let raw: Vec<RawTemplate> = serde_json::from_str(json)?;
        let mut map = BTreeMap::new();
        for t in raw {
            let id = TemplateId::parse(t.id.clone()).map_err(|_| TemplateConfigError::Id(t.id))?;
            if t.keywords.is_empty() {
                return Err(TemplateConfigError::NoKeywords(id));
            }
            let keywords = t
                .keywords
                .into_iter()
                .map(|k| match KeywordType::of_key(&k.key) {
                    Some(kind) if kind != KeywordType::Enum && !k.values.is_empty() => {
                        Err(TemplateConfigError::Values {
                            template: id.clone(),
                            key: k.key,
                        })
                    }
                    Some(kind) => Ok(Keyword {
                        key: k.key,
                        name: k.name,
                        kind,
                        values: k.values,
                    }),
                    None => Err(TemplateConfigError::KeywordKey {
                        template: id.clone(),
                        key: k.key,
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let refill_template = t
                .refill_template
                .map(|r| {
                    TemplateId::parse(r).map_err(|_| TemplateConfigError::Refill {
                        template: id.clone(),
                        why: "is not a valid template id".into(),
                    })
                })
                .transpose()?;
            let def = TemplateDef {
                id: id.clone(),
                title: t.title,
                keywords,
                page: t.page,
                refill_template,
                priority: t.priority,
            };
            if map.insert(id.clone(), def).is_some() {
                return Err(TemplateConfigError::Duplicate(id));
            }
        }
        for def in map.values() {
            let Some(refill) = &def.refill_template else {
                continue;
            };
            let why = match map.get(refill) {
                _ if refill == &def.id => Some("names the template itself"),
                None => Some("is not a configured template"),
                Some(r) if r.refill_template.is_some() => {
                    Some("names a refill template of its own")
                }
                Some(r) if !r.keywords.iter().all(|k| k.kind.fills_refill()) => Some(
                    "has keywords a refill notice cannot fill (only thing, short_thing, time, date)",
                ),
                Some(_) => None,
            };
            if let Some(why) = why {
                return Err(TemplateConfigError::Refill {
                    template: def.id.clone(),
                    why: why.into(),
                });
            }
        }
        Ok(Self(map))
    }

    pub fn get(&self, id: &str) -> Option<&TemplateDef> {
        self.0.get(id)
    }

    pub fn contains(&self, id: &TemplateId) -> bool {
        self.0.contains_key(id)
    }

    /// Every template, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &TemplateDef> {
        self.0.values()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Two templates, `A` and `B`, each with one `thing1` keyword: the domain's tests share
/// them.
#[cfg(test)]
pub(crate) fn test_templates() -> Templates {
    Templates::from_json(
        r#"[{"id":"A","title":"a","keywords":[{"key":"thing1"}]},
            {"id":"B","title":"b","keywords":[{"key":"thing1"}]}]"#,
    )
    .expect("valid templates")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_types_come_from_key_prefixes() {
        assert_eq!(KeywordType::of_key("thing1"), Some(KeywordType::Thing));
        assert_eq!(
            KeywordType::of_key("short_thing2"),
            Some(KeywordType::ShortThing)
        );
        assert_eq!(
            KeywordType::of_key("character_string13"),
            Some(KeywordType::CharacterString)
        );
        assert_eq!(KeywordType::of_key("time14"), Some(KeywordType::Time));
        assert_eq!(KeywordType::of_key("thing"), None);
        assert_eq!(KeywordType::of_key("Thing1"), None);
        assert_eq!(KeywordType::of_key("thing1a"), None);
        assert_eq!(KeywordType::of_key("colour1"), None);
    }

    #[test]
    fn templates_parse_and_reject_unknown_keyword_types() {
        let ok = r#"[{"id":"T1","title":"喝水提醒","keywords":[{"key":"thing1","name":"内容"},{"key":"time2"}],"page":"pages/water/index"}]"#;
        let t = Templates::from_json(ok).expect("valid config");
        assert_eq!(t.len(), 1);
        assert_eq!(t.get("T1").map(|d| d.keywords.len()), Some(2));

        let bad = r#"[{"id":"T1","title":"x","keywords":[{"key":"colour1"}]}]"#;
        assert!(matches!(
            Templates::from_json(bad),
            Err(TemplateConfigError::KeywordKey { .. })
        ));
        let dup = r#"[{"id":"T1","title":"x","keywords":[{"key":"thing1"}]},{"id":"T1","title":"y","keywords":[{"key":"thing1"}]}]"#;
        assert!(matches!(
            Templates::from_json(dup),
            Err(TemplateConfigError::Duplicate(_))
        ));
    }

    #[test]
    fn a_refill_template_must_be_another_configured_one_a_notice_can_fill() {
        let with = |refill: &str, other: &str| {
            format!(
                r#"[{{"id":"T1","title":"x","keywords":[{{"key":"thing1"}}],"refill_template":{refill}}},{other}]"#
            )
        };
        let used_up = r#"{"id":"T2","title":"y","keywords":[{"key":"thing1"},{"key":"time2"}]}"#;
        let ok = Templates::from_json(&with(r#""T2""#, used_up)).expect("valid");
        assert_eq!(
            ok.get("T1")
                .and_then(|t| t.refill_template.as_ref())
                .map(|t| t.as_str()),
            Some("T2")
        );
        let bad = [
            with(r#""T1""#, used_up),
            with(r#""T9""#, used_up),
            with(r#""bad id!""#, used_up),
            with(
                r#""T2""#,
                r#"{"id":"T2","title":"y","keywords":[{"key":"thing1"},{"key":"number2"}]}"#,
            ),
            with(
                r#""T2""#,
                r#"{"id":"T2","title":"y","keywords":[{"key":"thing1"}],"refill_template":"T1"}"#,
            ),
        ];
        for json in bad {
            assert!(
                matches!(
                    Templates::from_json(&json),
                    Err(TemplateConfigError::Refill { .. })
                ),
                "{json}"
            );
        }
    }

    #[test]
    fn duplicates_are_refused() {
        let dup = r#"[{"id":"T1","title":"x","keywords":[{"key":"thing1"}]},{"id":"T1","title":"y","keywords":[{"key":"thing1"}]}]"#;
        assert!(matches!(
            Templates::from_json(dup),
            Err(TemplateConfigError::Duplicate(_))
        ));
    }
}
