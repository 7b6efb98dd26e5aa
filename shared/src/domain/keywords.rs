//! Template data before it is sent: every keyword of the template filled, each value
//! made to fit its type's rule (reference/wechat.md §2) — control characters stripped,
//! lengths counted in Unicode scalar values and truncated, or the value refused when
//! truncation cannot make it valid (a `number` with letters, a `phrase` with Latin).
//! Catching these here avoids a 47003 from WeChat, which would pause the plan.

use std::collections::BTreeMap;

use super::template::{KeywordType, TemplateDef};

/// Why template data cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeywordError {
    #[error("keyword {0} has no value")]
    Missing(String),
    #[error("keyword {key}: {value:?} cannot be made a valid {kind:?}")]
    Invalid {
        key: String,
        kind: KeywordType,
        value: String,
    },
}

fn is_cjk(c: char) -> bool {
    matches!(c, '\u{4E00}'..='\u{9FFF}' | '\u{3400}'..='\u{4DBF}' | '\u{F900}'..='\u{FAFF}')
}

fn truncate(value: &str, max: usize) -> String {
    value.chars().take(max).collect()
}

/// The value sent for one keyword, or why none can be.
pub fn fit(key: &str, kind: KeywordType, raw: &str) -> Result<String, KeywordError> {
    let cleaned: String = raw.chars().filter(|c| !c.is_control()).collect();
    let value = cleaned.trim();
    let invalid = || KeywordError::Invalid {
        key: key.to_string(),
        kind,
        value: value.to_string(),
    };
    if value.is_empty() {
        return Err(invalid());
    }
    let all = |f: fn(char) -> bool| value.chars().all(f);
    let fitted = match kind {
        KeywordType::Thing | KeywordType::ShortThing | KeywordType::Enum => truncate(value, 20),
        KeywordType::CharacterString => {
            if !all(|c| c.is_ascii_graphic()) {
                return Err(invalid());
            }
            truncate(value, 32)
        }
        KeywordType::Number => {
            let (int, frac) = value.split_once('.').unwrap_or((value, ""));
            if int.is_empty()
                || !int.bytes().all(|b| b.is_ascii_digit())
                || !frac.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(invalid());
            }
            if value.chars().count() > 32 {
                return Err(invalid());
            }
            value.to_string()
        }
        KeywordType::Letter => {
            if !all(|c| c.is_ascii_alphabetic()) {
                return Err(invalid());
            }
            truncate(value, 32)
        }
        KeywordType::Symbol => {
            if value.chars().any(|c| c.is_alphanumeric() || is_cjk(c)) {
                return Err(invalid());
            }
            truncate(value, 5)
        }
        KeywordType::Phrase => {
            if !all(is_cjk) {
                return Err(invalid());
            }
            truncate(value, 5)
        }
        KeywordType::Name => {
            if value.chars().any(is_cjk) {
                truncate(value, 10)
            } else {
                truncate(value, 20)
            }
        }
        KeywordType::PhoneNumber => {
            if !all(|c| c.is_ascii_digit() || "+-() ".contains(c)) || value.chars().count() > 17 {
                return Err(invalid());
            }
            value.to_string()
        }
        KeywordType::CarNumber => {
            if value.chars().count() > 8 {
                return Err(invalid());
            }
            value.to_string()
        }
        // Formats, not lengths: truncation would corrupt them. Sent as given (cleaned).
        KeywordType::Time | KeywordType::Date | KeywordType::Amount => value.to_string(),
    };
    Ok(fitted)
}

/// Every keyword of `template` filled from `values` and fitted to its type.
pub fn fit_all(
    template: &TemplateDef,
    values: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, KeywordError> {
    template
        .keywords
        .iter()
        .map(|k| {
            let raw = values
                .get(&k.key)
                .ok_or_else(|| KeywordError::Missing(k.key.clone()))?;
            Ok((k.key.clone(), fit(&k.key, k.kind, raw)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_are_cleaned_truncated_or_refused_by_type() {
        assert_eq!(
            fit("thing1", KeywordType::Thing, "该喝水了\n今天第四杯"),
            Ok("该喝水了今天第四杯".into())
        );
        assert_eq!(
            fit("thing1", KeywordType::Thing, &"水".repeat(30)).map(|v| v.chars().count()),
            Ok(20)
        );
        assert_eq!(
            fit("phrase2", KeywordType::Phrase, "配送中配送中"),
            Ok("配送中配送".into())
        );
        assert!(fit("phrase2", KeywordType::Phrase, "done").is_err());
        assert!(fit("number3", KeywordType::Number, "4 cups").is_err());
        assert_eq!(fit("number3", KeywordType::Number, "4"), Ok("4".into()));
        assert!(fit("character_string1", KeywordType::CharacterString, "订单1").is_err());
        assert!(fit("thing1", KeywordType::Thing, "\u{7}").is_err());
    }

    proptest! {
        #[test]
        fn fitted_things_are_never_over_twenty_scalars_or_carry_control_characters(raw in "\\PC{0,60}[\\n\\t]{0,3}\\PC{0,10}") {
            if let Ok(v) = fit("thing1", KeywordType::Thing, &raw) {
                prop_assert!(v.chars().count() <= 20);
                prop_assert!(!v.chars().any(char::is_control));
            }
        }
    }
}
