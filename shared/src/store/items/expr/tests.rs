use super::*;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn item(attrs: &[(&str, AttributeValue)]) -> Item {
    attrs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn conditions_hold_as_dynamodb_decides_them() {
    let it = item(&[
        ("state", s("sending")),
        ("available", n(2)),
        ("big", AttributeValue::N("10".into())),
        ("day", AttributeValue::N("9".into())),
        ("tags", AttributeValue::Ss(vec!["b".into(), "a".into()])),
        ("waiting", AttributeValue::Ss(vec!["x".into()])),
        ("list", AttributeValue::L(vec![n(1), s("two")])),
        ("flag", AttributeValue::Bool(true)),
    ]);
    let cases: Vec<(Cond, bool)> = vec![
        (exists("state"), true),
        (exists("nope"), false),
        (absent("nope"), true),
        (absent("state"), false),
        (eq("state", s("sending")), true),
        (eq("state", s("claimed")), false),
        // Another type never equals, and only `<>` holds for it.
        (eq("available", s("2")), false),
        (compare("available", Cmp::Ne, s("2")), true),
        (compare("available", Cmp::Lt, s("3")), false),
        // Numbers as numbers (9 < 10, where strings would order "10" first).
        (compare("day", Cmp::Lt, n(10)), true),
        (compare("big", Cmp::Gt, n(9)), true),
        (compare("available", Cmp::Le, n(2)), true),
        (compare("available", Cmp::Gt, n(2)), false),
        (
            compare("available", Cmp::Gt, AttributeValue::N("1.5".into())),
            true,
        ),
        // Strings byte by byte.
        (compare("state", Cmp::Gt, s("claimed")), true),
        // A missing attribute: every comparison false but `<>`.
        (eq("nope", n(0)), false),
        (compare("nope", Cmp::Le, n(0)), false),
        (compare("nope", Cmp::Ne, n(0)), true),
        (is_in("state", vec![s("claimed"), s("sending")]), true),
        (is_in("state", vec![s("claimed")]), false),
        (is_in("nope", vec![s("claimed")]), false),
        (contains("tags", s("a")), true),
        (contains("tags", s("c")), false),
        (contains("state", s("end")), true),
        (contains("list", s("two")), true),
        (contains("list", n(2)), false),
        (size("waiting", Cmp::Lt, 2), true),
        (size("tags", Cmp::Eq, 2), true),
        (size("state", Cmp::Eq, 7), true),
        (size("nope", Cmp::Eq, 0), false),
        // Sets equal in any order.
        (
            eq("tags", AttributeValue::Ss(vec!["a".into(), "b".into()])),
            true,
        ),
        (eq("flag", AttributeValue::Bool(true)), true),
        (compare("flag", Cmp::Gt, AttributeValue::Bool(false)), false),
        (exists("state").and(eq("available", n(2))), true),
        (exists("state").and(eq("available", n(3))), false),
        (
            absent("available").or(compare("available", Cmp::Le, n(0))),
            false,
        ),
        (absent("nope").or(eq("available", n(3))), true),
        (!exists("nope"), true),
        (!(!exists("nope")), false),
        (all([]), true),
        (any([]), false),
    ];
    for (cond, expected) in cases {
        assert_eq!(cond.holds(&it), expected, "{cond:?}");
    }
    // An item that does not exist is an empty one.
    assert!(absent("pk").holds(&Item::new()));
    assert!(!exists("pk").holds(&Item::new()));
}

#[test]
fn rendering_numbers_each_name_once_and_each_value_and_nests_in_parentheses() {
    let cond = is_in("state", vec![s("claimed"), s("sending")])
        .and(eq("claimer", s("c-1")))
        .and(absent("answered_late_at").or(compare("state", Cmp::Ne, s("unknown"))));
    let r = cond.render("g");
    assert_eq!(
        r.expression,
        "(#g0 IN (:g0, :g1)) AND (#g1 = :g2) AND ((attribute_not_exists(#g2)) OR (#g0 <> :g3))"
    );
    assert_eq!(r.names.len(), 3, "state named once: {:?}", r.names);
    assert_eq!(r.names["#g0"], "state");
    assert_eq!(r.names["#g2"], "answered_late_at");
    assert_eq!(r.values.len(), 4);
    assert_eq!(r.values[":g2"], s("c-1"));
    // Every placeholder rendered is bound, and only those (DynamoDB refuses unused
    // ones).
    for placeholder in r.names.keys().chain(r.values.keys()) {
        assert!(r.expression.contains(placeholder.as_str()), "{placeholder}");
    }
    let not = (!eq("a", n(1))).render("x");
    assert_eq!(not.expression, "NOT (#x0 = :x0)");
    let sized = size("waiting", Cmp::Lt, 5).render("w");
    assert_eq!(sized.expression, "size(#w0) < :w0");
    assert_eq!(sized.values[":w0"], n(5));
}

#[test]
fn and_and_or_flatten_and_double_negation_cancels() {
    let a = || exists("a");
    let b = || exists("b");
    let c = || exists("c");
    assert_eq!(a().and(b()).and(c()), Cond::And(vec![a(), b(), c()]));
    assert_eq!(a().or(b().or(c())), Cond::Or(vec![a(), b(), c()]));
    assert_eq!(!(!a()), a());
    assert_eq!(all([a()]), a());
}
