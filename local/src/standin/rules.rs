//! The keyword value rules the stand-in enforces, as WeChat states them
//! (reference/wechat.md §2). Written independently of any client-side validation in
//! `onegrant`, so a client bug shows up as a 47003 here instead of agreeing with itself.

/// CJK ideographs (the unified block and extension A, plus compatibility ideographs).
fn is_cjk(c: char) -> bool {
    matches!(c, '\u{4E00}'..='\u{9FFF}' | '\u{3400}'..='\u{4DBF}' | '\u{F900}'..='\u{FAFF}')
}

fn is_symbol(c: char) -> bool {
    !c.is_alphanumeric() && !c.is_control() && !c.is_whitespace() && !is_cjk(c)
}

fn is_time(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    let in_range = |p: &str, max: u32| p.len() == 2 && p.parse::<u32>().is_ok_and(|v| v <= max);
    match parts.as_slice() {
        [h, m] => in_range(h, 23) && in_range(m, 59),
        [h, m, sec] => in_range(h, 23) && in_range(m, 59) && in_range(sec, 59),
        _ => false,
    }
}

fn is_date(s: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit());
    // 2019年10月1日, 2019年10月, 10月1日
    if s.contains('年') || s.contains('月') {
        let rest = s.trim_end_matches('日');
        let pieces: Vec<&str> = rest.split(['年', '月']).filter(|p| !p.is_empty()).collect();
        return (1..=3).contains(&pieces.len()) && pieces.iter().all(|p| digits(p));
    }
    // 2018-01-01, 2018/01/01, 2018.01.01, 2018-01, 01-01
    for sep in ['-', '/', '.'] {
        let pieces: Vec<&str> = s.split(sep).collect();
        if (2..=3).contains(&pieces.len()) && pieces.iter().all(|p| digits(p)) {
            return true;
        }
    }
    false
}

/// A date optionally followed by a time, or (for `time`) a bare time.
fn is_moment(s: &str, bare_time_ok: bool) -> bool {
    let s = s.trim();
    if bare_time_ok && is_time(s) {
        return true;
    }
    match s.split_once(' ') {
        Some((date, time)) => is_date(date.trim()) && is_time(time.trim()),
        None => !bare_time_ok && is_date(s),
    }
}

fn is_amount(s: &str) -> bool {
    let s = s.strip_suffix('元').unwrap_or(s);
    let s = s.strip_prefix(['￥', '¥', '$', '€', '£']).unwrap_or(s);
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    !int.is_empty()
        && int.len() <= 10
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
        && (frac.is_empty() != s.contains('.'))
}

/// Whether one keyword value passes its type's rule (WeChat's 47003 names only the
/// field, so a yes/no is all the stand-in needs).
pub fn is_valid(prefix: &str, value: &str) -> bool {
    let n = value.chars().count();
    if n == 0 || value.chars().any(char::is_control) {
        return false;
    }
    match prefix {
        "thing" | "short_thing" => n <= 20,
        "number" => {
            let (int, frac) = value.split_once('.').unwrap_or((value, ""));
            n <= 32
                && !int.is_empty()
                && int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
        }
        "letter" => n <= 32 && value.chars().all(|c| c.is_ascii_alphabetic()),
        "symbol" => n <= 5 && value.chars().all(is_symbol),
        "character_string" => n <= 32 && value.chars().all(|c| c.is_ascii_graphic()),
        "time" => value.split('~').all(|p| is_moment(p, true)),
        "date" => value.split('~').all(|p| is_moment(p, false)),
        "amount" => is_amount(value),
        "phone_number" => {
            n <= 17
                && value
                    .chars()
                    .all(|c| c.is_ascii_digit() || "+-() ".contains(c))
        }
        "car_number" => {
            let chars: Vec<char> = value.chars().collect();
            n <= 8
                && chars.iter().enumerate().all(|(i, c)| {
                    c.is_ascii_alphanumeric() || (is_cjk(*c) && (i == 0 || i == chars.len() - 1))
                })
        }
        "name" => {
            if value.chars().any(is_cjk) {
                n <= 10
            } else {
                n <= 20
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphabetic() || is_symbol(c) || c == ' ')
            }
        }
        "phrase" => n <= 5 && value.chars().all(is_cjk),
        "enum" => n <= 20,
        _ => false,
    }
}

/// The type prefix of a keyword key (`thing1` → `thing`), if it has one.
pub fn prefix_of(key: &str) -> Option<&str> {
    let prefix = key.trim_end_matches(|c: char| c.is_ascii_digit());
    (prefix.len() < key.len() && !prefix.is_empty()).then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_wechats_published_examples() {
        let good = [
            ("thing", "喝水时间到了"),
            ("time", "15:01"),
            ("time", "2019年10月1日 15:01"),
            ("time", "15:01~16:00"),
            ("date", "2019年10月1日"),
            ("date", "2018-01-01"),
            ("date", "2019年10月1日 15:01"),
            ("amount", "￥100.50"),
            ("amount", "100元"),
            ("phone_number", "+86-0766-66888866"),
            ("car_number", "粤A8Z888挂"),
            ("phrase", "配送中"),
            ("number", "3"),
            ("character_string", "ORDER-2026-0001"),
            ("name", "张三"),
        ];
        for (prefix, value) in good {
            assert!(is_valid(prefix, value), "{prefix} {value}");
        }
        let bad = [
            ("thing", "一二三四五六七八九十一二三四五六七八九十一"),
            ("thing", "line\nbreak"),
            ("phrase", "配送中了吗啊"),
            ("phrase", "ok"),
            ("number", "12a"),
            ("time", "25:00"),
            ("character_string", "订单"),
            ("letter", "abc1"),
            ("thing", ""),
            ("colour", "red"),
        ];
        for (prefix, value) in bad {
            assert!(!is_valid(prefix, value), "{prefix} {value:?}");
        }
    }
}
