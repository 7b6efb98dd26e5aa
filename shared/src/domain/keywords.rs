//! Template data before it is sent: every keyword of the template filled, each value
//! made to fit its type's rule (reference/wechat.md §2) — cleaned of Cc, Cf, Zl and Zp
//! characters ([`crate::domain::text`]), lengths counted in Unicode scalar values and truncated,
//! or the value refused when truncation cannot make it valid (a `number` with letters, a
//! `phrase` with Latin, a `time` that is not a time, an `enum` value outside the
//! template's list). Catching these here avoids a 47003 from WeChat, which would pause
//! the plan.

use std::collections::BTreeMap;

use crate::domain::template::{KeywordType, TemplateDef};
use crate::domain::text::clean_line;

/// Why template data cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeywordError {
    #[error("keyword {0} has no value")]
    Missing(String),
    // The value itself stays out of the message: it may be a name, a phone number or a
    // plate, and the message is logged.
    #[error("keyword {key}: a value of {} characters cannot be made a valid {kind:?}", value.chars().count())]
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
    let cleaned = clean_line(raw);
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
                || (value.contains('.') && frac.is_empty())
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
            if !is_car_number(value) {
                return Err(invalid());
            }
            value.to_string()
        }
        // Formats, not lengths: truncation would corrupt them, so a value is sent as given
        // (cleaned) or refused.
        KeywordType::Time => {
            if !is_range(value, is_time) {
                return Err(invalid());
            }
            value.to_string()
        }
        KeywordType::Date => {
            if !is_range(value, is_date) {
                return Err(invalid());
            }
            value.to_string()
        }
        KeywordType::Amount => {
            if !is_amount(value) {
                return Err(invalid());
            }
            value.to_string()
        }
    };
    Ok(fitted)
}

/// `1`–`max` ASCII digits whose value is at most `most`.
fn digits(s: &str, max: usize, most: u32) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u32>().is_ok_and(|n| n <= most)
}

/// A 24-hour clock: `15:01` or `15:01:30`.
fn is_clock(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    match parts.as_slice() {
        [h, m] => digits(h, 2, 23) && m.len() == 2 && digits(m, 2, 59),
        [h, m, sec] => {
            digits(h, 2, 23)
                && m.len() == 2
                && digits(m, 2, 59)
                && sec.len() == 2
                && digits(sec, 2, 59)
        }
        _ => false,
    }
}

/// A date as WeChat's rules list them: `y年m月d日`, `y年m月`, `m月d日`, or the same joined
/// by `-`, `/` or `.` (`2018-01-01`, `2018/01/01`, `2018.01.01`, `2018-01`, `01-01`).
fn is_day(s: &str) -> bool {
    let year = |y: &str| y.len() == 4 && digits(y, 4, 9999);
    let month = |m: &str| digits(m, 2, 12) && m.bytes().any(|b| b != b'0');
    let day = |d: &str| digits(d, 2, 31) && d.bytes().any(|b| b != b'0');
    if let Some((y, rest)) = s.split_once('年') {
        return year(y)
            && match rest.split_once('月') {
                Some((m, "")) => month(m),
                Some((m, d)) => month(m) && d.strip_suffix('日').is_some_and(day),
                None => false,
            };
    }
    if let Some((m, d)) = s.split_once('月') {
        return month(m) && d.strip_suffix('日').is_some_and(day);
    }
    ['-', '/', '.'].iter().any(|&sep| {
        let parts: Vec<&str> = s.split(sep).collect();
        match parts.as_slice() {
            [y, m, d] => year(y) && month(m) && day(d),
            [y, m] if y.len() == 4 => year(y) && month(m),
            [m, d] => month(m) && day(d),
            _ => false,
        }
    })
}

/// `time`: a clock, optionally after a day and a space.
fn is_time(s: &str) -> bool {
    is_clock(s)
        || s.rsplit_once(' ')
            .is_some_and(|(d, c)| is_day(d.trim_end()) && is_clock(c))
}

/// `date`: a day, optionally followed by a space and a clock.
fn is_date(s: &str) -> bool {
    is_day(s)
        || s.rsplit_once(' ')
            .is_some_and(|(d, c)| is_day(d.trim_end()) && is_clock(c))
}

/// `one` or `one~other`, where the second part may also be a bare clock
/// (`2019年10月1日 15:01~16:00`).
fn is_range(value: &str, one: fn(&str) -> bool) -> bool {
    match value.split_once('~') {
        None => one(value),
        Some((from, to)) => {
            let (from, to) = (from.trim(), to.trim());
            one(from) && (one(to) || is_clock(to))
        }
    }
}

/// `amount`: at most one currency symbol, 1–10 digits, up to two decimals, `元`
/// optionally at the end (`￥100`, `¥100.50`, `100元`).
fn is_amount(value: &str) -> bool {
    let value = value.strip_suffix('元').unwrap_or(value);
    let value = value
        .strip_prefix(['￥', '¥', '$', '€', '£'])
        .unwrap_or(value);
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    (1..=10).contains(&int.len())
        && int.bytes().all(|b| b.is_ascii_digit())
        && (!value.contains('.') || (1..=2).contains(&frac.len()))
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// `car_number`: at most 8 characters; the first and the last may be CJK (the province
/// and a suffix such as 挂), the rest ASCII letters or digits (`粤A8Z888挂`).
fn is_car_number(value: &str) -> bool {
    let chars: Vec<char> = value.chars().collect();
    let plate = |c: &char| c.is_ascii_alphanumeric();
    let end = |c: &char| plate(c) || is_cjk(*c);
    match chars.as_slice() {
        [] => false,
        [only] => end(only),
        [first, middle @ .., last] => {
            chars.len() <= 8 && end(first) && end(last) && middle.iter().all(plate)
        }
    }
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
            let value = fit(&k.key, k.kind, raw)?;
            if !k.values.is_empty() && !k.values.contains(&value) {
                return Err(KeywordError::Invalid {
                    key: k.key.clone(),
                    kind: k.kind,
                    value,
                });
            }
            Ok((k.key.clone(), value))
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
        assert!(fit("number3", KeywordType::Number, "4.").is_err());
        assert!(fit("character_string1", KeywordType::CharacterString, "订单1").is_err());
        assert!(fit("thing1", KeywordType::Thing, "\u{7}").is_err());
        assert_eq!(
            fit("thing1", KeywordType::Thing, "喝\u{202E}水\u{200B}\u{2028}"),
            Ok("喝水".into())
        );
    }

    #[test]
    fn times_dates_amounts_and_plates_are_checked_for_their_format() {
        let ok = |kind, v: &str| fit("k1", kind, v).is_ok();
        for v in [
            "15:01",
            "9:05",
            "15:01:30",
            "2019年10月1日 15:01",
            "2019-10-01 15:01",
            "15:01~16:00",
            "2019年10月1日 15:01~16:00",
        ] {
            assert!(ok(KeywordType::Time, v), "time {v}");
        }
        for v in [
            "25:00",
            "15:1",
            "3 pm",
            "15:01~",
            "2019年13月1日 15:01",
            "tomorrow 15:01",
            "",
        ] {
            assert!(!ok(KeywordType::Time, v), "time {v}");
        }
        for v in [
            "2019年10月1日",
            "2019年10月",
            "10月1日",
            "2019-10-01",
            "2019/10/1",
            "2018.01.01",
            "2018-01",
            "01-01",
            "2019年10月1日 15:01",
            "2019年10月1日~2019年10月7日",
        ] {
            assert!(ok(KeywordType::Date, v), "date {v}");
        }
        for v in [
            "2019-13-01",
            "19-10-01",
            "下周一",
            "2019-10-01T15:01",
            "2019-00-01",
            "2019-10-00",
            "10月",
            "2019年13月",
        ] {
            assert!(!ok(KeywordType::Date, v), "date {v}");
        }
        for v in ["￥100", "¥100.50", "100元", "$3.5", "1234567890"] {
            assert!(ok(KeywordType::Amount, v), "amount {v}");
        }
        for v in [
            "￥",
            "100.123",
            "12345678901",
            "￥￥100",
            "ten",
            "1,000",
            "100.",
        ] {
            assert!(!ok(KeywordType::Amount, v), "amount {v}");
        }
        for v in ["粤A8Z888挂", "京A12345", "AB1234"] {
            assert!(ok(KeywordType::CarNumber, v), "plate {v}");
        }
        for v in ["粤A8Z8888挂", "京A-12345", "京京A1234"] {
            assert!(!ok(KeywordType::CarNumber, v), "plate {v}");
        }
    }

    #[test]
    fn an_enum_value_must_be_in_the_templates_list_when_it_has_one() {
        let templates = super::super::template::Templates::from_json(
            r#"[{"id":"T1","title":"t","keywords":[{"key":"enum1","values":["已发货","已签收"]},{"key":"thing2"}]},
                {"id":"T2","title":"t","keywords":[{"key":"enum1"}]}]"#,
        )
        .expect("config");
        let values = |e: &str| {
            BTreeMap::from([
                ("enum1".to_string(), e.to_string()),
                ("thing2".to_string(), "x".to_string()),
            ])
        };
        let t1 = templates.get("T1").expect("T1");
        assert!(fit_all(t1, &values("已发货")).is_ok());
        assert!(matches!(
            fit_all(t1, &values("已取消")),
            Err(KeywordError::Invalid { .. })
        ));
        let t2 = templates.get("T2").expect("T2");
        assert!(fit_all(t2, &values("已取消")).is_ok());
        assert!(
            super::super::template::Templates::from_json(
                r#"[{"id":"T1","title":"t","keywords":[{"key":"thing1","values":["a"]}]}]"#
            )
            .is_err(),
            "values on a keyword that is not an enum"
        );
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
