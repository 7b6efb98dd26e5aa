//! The inbox's events and their pushes, table-first.

use super::*;
use serde_json::json;

use crate::clock::Clock;

fn templates() -> Templates {
    Templates::from_json(
        r#"[{"id":"T","title":"t","keywords":[{"key":"phrase1"},{"key":"thing2"}]}]"#,
    )
    .expect("templates")
}

#[test]
fn an_event_with_a_valid_push_is_ready_and_a_bad_push_is_rejected_but_kept() {
    let ok = json!({"idempotency_key": "order-1:shipped", "openid": "oA", "type": "order", "title": "已发货",
                    "body": "您的订单已发货", "wechat": {"template_id": "T", "data": {"phrase1": "已发货", "thing2": {"value": "顺丰"}}}});
    let e = NotifyEvent::from_json(&ok, "tests", &templates(), Clock::real_now()).expect("valid");
    assert!(matches!(e.push, Some(Push::Ready { .. })));
    let bad = json!({"idempotency_key": "k", "openid": "oA", "type": "order", "title": "x",
                     "wechat": {"template_id": "T", "data": {"phrase1": "shipped", "thing2": "x"}}});
    let e = NotifyEvent::from_json(&bad, "tests", &templates(), Clock::real_now())
        .expect("still a notification");
    assert!(matches!(e.push, Some(Push::Rejected { .. })));
    let unknown = json!({"idempotency_key": "k", "openid": "oA", "type": "order", "title": "x", "wechat": {"template_id": "nope", "data": {}}});
    assert!(matches!(
        NotifyEvent::from_json(&unknown, "tests", &templates(), Clock::real_now())
            .expect("kept")
            .push,
        Some(Push::Rejected { .. })
    ));
}

#[test]
fn an_event_naming_no_priority_takes_its_templates_and_keeps_its_fingerprint() {
    use crate::domain::template::Priority;
    let urgent = Templates::from_json(
        r#"[{"id":"T","title":"t","keywords":[{"key":"phrase1"},{"key":"thing2"}],"priority":"high"}]"#,
    )
    .expect("templates");
    let event = |priority: Option<&str>| {
        let mut e = json!({"idempotency_key": "k", "openid": "oA", "type": "order", "title": "x",
            "wechat": {"template_id": "T", "data": {"phrase1": "已发货", "thing2": "顺丰"}}});
        if let Some(p) = priority {
            e["priority"] = json!(p);
        }
        e
    };
    let now = Clock::real_now();
    let parse =
        |e: &Value, t: &Templates| NotifyEvent::from_json(e, "tests", t, now).expect("valid");
    let defaulted = parse(&event(None), &urgent);
    assert_eq!(defaulted.timing.priority, Priority::High);
    assert_eq!(
        parse(&event(Some("low")), &urgent).timing.priority,
        Priority::Low
    );
    assert_eq!(
        parse(&event(None), &templates()).timing.priority,
        Priority::Normal
    );
    assert_eq!(
        defaulted.fingerprint,
        parse(&event(None), &templates()).fingerprint,
        "configuration is not the event's payload"
    );
    assert!(
        Templates::from_json(
            r#"[{"id":"T","title":"t","keywords":[{"key":"thing1"}],"priority":"urgent"}]"#
        )
        .is_err()
    );
}

#[test]
fn events_without_their_essentials_are_refused() {
    for bad in [
        json!({}),
        json!({"idempotency_key": "k", "openid": "o#1", "type": "t", "title": "x"}),
        json!({"idempotency_key": "a#b", "openid": "oA", "type": "t", "title": "x"}),
        json!({"idempotency_key": "k", "openid": "oA", "type": "t", "title": ""}),
    ] {
        assert!(
            NotifyEvent::from_json(&bad, "tests", &templates(), Clock::real_now()).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn cursors_round_trip_and_forgeries_are_refused() {
    let id = new_notification_id(Clock::real_now());
    assert!(is_notification_id(&id));
    assert_eq!(decode_cursor(&encode_cursor(&id)), Some(id));
    for bad in [
        "",
        "bm90IGEgY3Vyc29y",
        "n1:USER#x",
        "n1.USER#x",
        "%%%",
        "n1.",
    ] {
        assert_eq!(decode_cursor(bad), None, "{bad}");
    }
}

#[test]
fn a_push_stored_takes_its_first_status_refusals_first() {
    let ready = Push::Ready {
        template_id: TemplateId::parse("T".to_string()).expect("template"),
        data: BTreeMap::new(),
        page: None,
    };
    let rejected = Push::Rejected {
        code: PushReason::DataInvalid,
        detail: String::new(),
    };
    let too_many = Some(PushReason::TooManyPending);
    // (push, cancelled first, expired, capped) → status, reason
    let rows = [
        (&ready, false, false, None, (PushStatus::Pending, None)),
        (&ready, true, true, too_many, (PushStatus::Cancelled, None)),
        (&ready, false, true, too_many, (PushStatus::Expired, None)),
        (
            &ready,
            false,
            false,
            too_many,
            (PushStatus::Rejected, too_many),
        ),
        (
            &rejected,
            true,
            true,
            too_many,
            (PushStatus::Rejected, Some(PushReason::DataInvalid)),
        ),
    ];
    for (push, cancelled, expired, capped, want) in rows {
        assert_eq!(
            push.first_status(cancelled, expired, capped),
            want,
            "{push:?} {cancelled} {expired} {capped:?}"
        );
    }
}
