//! The fields of a reminder request's JSON body, read one by one (so each refusal
//! names its field): null is absent, and a whole number is an integer however it is
//! written.

use serde_json::Value;

fn field<'a>(object: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).filter(|v| !v.is_null())
}

pub(super) fn u32_field(
    object: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<i64>, String> {
    match field(object, name) {
        None => Ok(None),
        Some(v) => whole_number(v)
            .map(Some)
            .ok_or_else(|| format!("{name} must be an integer")),
    }
}

/// A JSON number without a fraction: `8`, and `8.0` or `8e0` too, which JSON (and the
/// contract's `integer`) calls the same number (a client's encoder may write either).
fn whole_number(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        let f = v.as_f64()?;
        // (Within ±2^53, where every whole f64 is exact and fits an i64.)
        (f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0).then_some(f as i64)
    })
}

pub(super) fn str_field<'a>(
    object: &'a serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, String> {
    match field(object, name) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| format!("{name} must be a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_whole_number_written_with_a_fraction_or_an_exponent_is_that_integer() {
        let base = json!({"action_id":"wc_1","occurred_at":"2026-07-27T12:05:00Z","current_count":4.0,"daily_goal":8e0});
        let c = crate::domain::reminders::CheckIn::from_json(&base).expect("valid");
        assert_eq!((c.current_count, c.daily_goal), (4, 8));
        for (value, taken) in [
            (json!(4), Some(4)),
            (json!(4.0), Some(4)),
            (json!(-0.0), Some(0)),
            (json!(4.5), None),
            (json!(1e300), None),
            (json!("4"), None),
        ] {
            assert_eq!(whole_number(&value), taken, "{value}");
        }
    }
}
