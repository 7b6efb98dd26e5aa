//! A copy of one's data (PIPL Art. 45): what an export page holds, and its cursor.
//! Pure.
//!
//! An export lists every item of the user's partition — grants, plans, check-ins,
//! notifications, pushes and sends, preferences, settings, the audit timeline — a
//! bounded page at a time, in the table's order. What only indexes the table (the
//! partition itself, the due, lease and pending index keys) is left out: it says
//! nothing about the user the item does not.

/// Items one page holds at most.
pub const EXPORT_PAGE: usize = 100;

/// The longest sort key a cursor may name (the table's keys are far shorter).
const MAX_SORT_KEY: usize = 512;

const CURSOR_PREFIX: &str = "x1.";

/// The cursor continuing after the item of sort key `sk`: the key's bytes in hex.
pub fn encode_cursor(sk: &str) -> String {
    format!("{CURSOR_PREFIX}{}", hex::encode(sk))
}

/// The sort key a cursor continues after, if it is well formed (the contract's
/// pattern: `x1.` and pairs of lowercase hex digits, at most 512 bytes). It holds no
/// user: pages always come from the caller's own partition, so a forged cursor only
/// positions the page in it (bytes that are not UTF-8 read as U+FFFD).
pub fn decode_cursor(cursor: &str) -> Option<String> {
    let encoded = cursor.strip_prefix(CURSOR_PREFIX)?;
    if encoded.is_empty() || encoded.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let bytes = hex::decode(encoded).ok()?;
    (bytes.len() <= MAX_SORT_KEY).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

/// Whether an item's attribute is only the table's plumbing: its partition key and the
/// keys of the indexes it sits on.
pub fn is_plumbing(attribute: &str) -> bool {
    attribute == "pk" || attribute.ends_with("_pk") || attribute == "pending_sk"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_anything_else_is_refused() {
        for sk in [
            "NOTE#1700000000000aaaaaaaaaaaa",
            "QUOTA#tmpl_water",
            "HIST#0001#ab",
        ] {
            assert_eq!(decode_cursor(&encode_cursor(sk)).as_deref(), Some(sk));
        }
        // Any well-formed cursor positions the page, whatever its bytes.
        assert_eq!(decode_cursor("x1.0a00ff").as_deref(), Some("\n\0\u{FFFD}"));
        let long = "A".repeat(MAX_SORT_KEY + 1);
        for bad in [
            "",
            "x1.",
            "x1.a",
            "x1.AB",
            "NOTE#1",
            "n1.1700000000000aaaaaaaaaaaa",
            "x1.!!!",
            &encode_cursor(&long),
        ] {
            assert_eq!(decode_cursor(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_index_keys_are_plumbing() {
        for name in [
            "pk",
            "due_pk",
            "lease_pk",
            "pending_pk",
            "pending_sk",
            "lane_pk",
        ] {
            assert!(is_plumbing(name), "{name}");
        }
        for name in [
            "sk",
            "state",
            "due_at",
            "title",
            "openid_tag",
            "template_id",
        ] {
            assert!(!is_plumbing(name), "{name}");
        }
    }
}
