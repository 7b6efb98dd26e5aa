//! Cleaning text that reaches a user's screen: keyword values sent to WeChat and inbox
//! titles and bodies. Characters of the Unicode categories Cc (controls), Cf (format:
//! bidi overrides and isolates, zero-width spaces and joiners, the BOM, soft hyphen),
//! Zl and Zp (line and paragraph separators) are removed, so no publisher can reorder
//! what a user reads, hide text, or break a one-line field.

/// Whether `c` is of category Cf, Zl or Zp (Unicode 15.1's Cf list; Zl and Zp each have
/// one character). Cc is `char::is_control`.
fn is_format_or_separator(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// Whether `c` is removed by [`clean_line`].
pub fn is_unwanted(c: char) -> bool {
    c.is_control() || is_format_or_separator(c)
}

/// `text` without Cc, Cf, Zl and Zp characters: one line.
pub fn clean_line(text: &str) -> String {
    text.chars().filter(|&c| !is_unwanted(c)).collect()
}

/// `text` without Cc, Cf, Zl and Zp characters except `\n`: a body keeps its lines.
pub fn clean_lines(text: &str) -> String {
    text.chars()
        .filter(|&c| c == '\n' || !is_unwanted(c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_format_characters_and_separators_are_removed_and_text_is_kept() {
        let hostile = "pay\u{202E}gnp.exe\u{200B}\u{200D}\u{FEFF}\u{2028}\u{2029}\u{7}\u{2066}x\u{2069}\u{E0041}";
        assert_eq!(clean_line(hostile), "paygnp.exex");
        assert_eq!(clean_line("该喝水了 🥤 (2/8)"), "该喝水了 🥤 (2/8)");
        assert_eq!(
            clean_lines("line one\nline\u{2028}two\r\n"),
            "line one\nlinetwo\n"
        );
        assert_eq!(clean_line("a\nb\tc"), "abc");
    }
}
