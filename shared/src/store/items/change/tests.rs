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

#[test]
fn an_audited_items_state_moves_only_as_a_declared_part_in_every_build() {
    let grant = || crate::store::items::key("USER#o1", "GRANT#T1#wr_1");
    let moves = || change().set("state", s("consumed")).plus("version", 1);
    assert!(
        matches!(
            update("t", grant(), moves()).write(),
            Err(StoreError::Corrupt(_))
        ),
        "undeclared, it would leave no trace in the audit"
    );
    assert!(update("t", grant(), moves()).part().is_ok());
    // A count, or an item the audit does not follow, needs no declaration.
    assert!(
        update("t", grant(), change().plus("version", 1))
            .write()
            .is_ok()
    );
    let quota = crate::store::items::key("USER#o1", "QUOTA#T1");
    assert!(
        update("t", quota, change().set("state", s("x")))
            .write()
            .is_ok()
    );
}

#[tokio::test]
async fn a_write_sent_alone_refuses_what_it_cannot_answer_before_it_sends() {
    // No endpoint: a request that reached the network would fail differently.
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .build();
    let client = Client::from_conf(config);
    let grant = || crate::store::items::key("USER#o1", "GRANT#T1#wr_1");
    let quota = || crate::store::items::key("USER#o1", "QUOTA#T1");
    let refused = [
        update("t", grant(), change().set("state", s("consumed")))
            .apply(&client)
            .await,
        update("t", quota(), change().plus("version", 1))
            .old_on_failure()
            .apply(&client)
            .await,
        put("t", quota())
            .apply_new(&client)
            .await
            .map(|item| item.is_some()),
    ];
    for (i, answer) in refused.into_iter().enumerate() {
        match answer {
            Err(StoreError::Corrupt(why)) => assert!(!why.is_empty()),
            other => panic!("case {i}: {other:?}"),
        }
    }
}
