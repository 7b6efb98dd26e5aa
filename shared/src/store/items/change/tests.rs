use super::*;
use crate::store::items::{n, s};

fn ss(members: &[&str]) -> AttributeValue {
    AttributeValue::Ss(members.iter().map(|m| m.to_string()).collect())
}

fn item<const N: usize>(attrs: [(&str, AttributeValue); N]) -> Item {
    attrs.map(|(k, v)| (k.to_string(), v)).into_iter().collect()
}

#[test]
fn a_change_renders_every_clause_with_numbered_placeholders() {
    let rendered = change()
        .set("state", s("sent"))
        .plus("version", 1)
        .set_if_absent("due_at", n(7))
        .append("history", vec![s("x")])
        .add("available", n(-1))
        .delete("open", ss(&["a"]))
        .remove("lease_pk")
        .render("u");
    assert_eq!(
        rendered.expression,
        "SET #u0 = :u0, #u1 = #u1 + :u1, #u2 = if_not_exists(#u2, :u2), \
         #u3 = list_append(if_not_exists(#u3, :u3), :u4) \
         ADD #u4 :u5 DELETE #u5 :u6 REMOVE #u6"
    );
    let names: Vec<(&str, &str)> = {
        let mut v: Vec<_> = rendered
            .names
            .iter()
            .map(|(p, a)| (p.as_str(), a.as_str()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names,
        [
            ("#u0", "state"),
            ("#u1", "version"),
            ("#u2", "due_at"),
            ("#u3", "history"),
            ("#u4", "available"),
            ("#u5", "open"),
            ("#u6", "lease_pk"),
        ]
    );
    assert_eq!(rendered.values.len(), 7);
    assert_eq!(rendered.values[":u3"], AttributeValue::L(Vec::new()));
    assert_eq!(rendered.values[":u4"], AttributeValue::L(vec![s("x")]));
    // Every placeholder rendered is used (DynamoDB refuses an unused one).
    for placeholder in rendered.names.keys().chain(rendered.values.keys()) {
        assert!(
            rendered.expression.contains(placeholder.as_str()),
            "{placeholder}"
        );
    }
}

#[test]
fn an_attribute_changed_twice_is_found() {
    assert_eq!(
        change().set("state", s("y")).remove("state").overlap(),
        Some("state")
    );
    assert_eq!(
        change().add("a", n(1)).delete("a", ss(&["x"])).overlap(),
        Some("a")
    );
    assert_eq!(change().set("a", n(1)).add("b", n(1)).overlap(), None);
    assert!(change().set("a", n(1)).touches("a"));
    assert!(!change().set("a", n(1)).touches("b"));
}

#[test]
fn the_values_a_change_declares_are_its_plain_sets() {
    let declared = change()
        .set("state", s("sent"))
        .set("msgid", s("m1"))
        .plus("version", 1)
        .set_if_absent("due_at", n(1))
        .add("available", n(-1))
        .values_set();
    assert_eq!(declared, item([("state", s("sent")), ("msgid", s("m1"))]));
    assert!(change().is_empty());
    assert!(!change().remove("a").is_empty());
    assert_eq!(
        change().set("a", n(1)).and(change().add("b", n(1))),
        change().set("a", n(1)).add("b", n(1))
    );
}
