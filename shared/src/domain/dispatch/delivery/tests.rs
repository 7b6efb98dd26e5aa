//! The delivery's rules, table by table.

use super::*;

fn delivery(state: DeliveryState) -> Delivery {
    Delivery {
        id: "d1".into(),
        state,
        claimer: "c1".into(),
        template_id: "T".into(),
        lease_until: Some(1_000),
        due_at: 500,
        attempts: 0,
        class: None,
        errcode: None,
        msgid: None,
        swept: false,
        answered_late: false,
        released: false,
        kept_answer: None,
        void_others: false,
    }
}

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).expect("valid instant")
}

#[test]
fn a_refused_finalize_reads_the_delivery_as_it_found_it() {
    use DeliveryState::{Failed, Sent, Unknown};
    let swept = |late: bool| Delivery {
        swept: true,
        answered_late: late,
        ..delivery(Unknown)
    };
    let settled = |state| Delivery {
        state,
        ..delivery(state)
    };
    // (delivery found, claimer, settling to, what follows)
    let cases = [
        (swept(false), "c1", Sent, Moved::AnswerLate),
        (swept(false), "c1", Failed, Moved::AnswerLate),
        // An uncertain answer after the sweep adds nothing to its `unknown`.
        (swept(false), "c1", Unknown, Moved::Superseded),
        (swept(false), "c2", Sent, Moved::Superseded),
        // This claimer's settlement, landed before.
        (
            settled(Sent),
            "c1",
            Sent,
            Moved::AlreadySettled { late: false },
        ),
        (
            settled(Unknown),
            "c1",
            Unknown,
            Moved::AlreadySettled { late: false },
        ),
        (
            Delivery {
                state: Sent,
                ..swept(true)
            },
            "c1",
            Sent,
            Moved::AlreadySettled { late: true },
        ),
        // Settled otherwise (a sent event, another answer): not this one's.
        (settled(Failed), "c1", Sent, Moved::Superseded),
        (settled(Sent), "c2", Sent, Moved::Superseded),
    ];
    for (found, claimer, to, want) in cases {
        assert_eq!(
            found.on_finalize_refused(claimer, to),
            want,
            "{found:?} {to:?}"
        );
    }
}

#[test]
fn each_guard_admits_only_the_deliveries_its_writer_may_move() {
    use DeliveryState::{Failed, Sending, Unknown};
    let live = delivery(Sending);
    let swept = Delivery {
        swept: true,
        ..delivery(Unknown)
    };
    let answered = Delivery {
        answered_late: true,
        ..swept.clone()
    };
    // (guard, delivery, admitted)
    let cases = [
        (Guard::Claimer("c1"), &live, true),
        (Guard::Claimer("c2"), &live, false),
        (Guard::Claimer("c1"), &swept, false),
        (Guard::ExpiredLease(1_000), &live, true),
        (Guard::ExpiredLease(999), &live, false),
        (Guard::ExpiredLease(1_000), &swept, false),
        (Guard::Swept("c1"), &swept, true),
        (Guard::Swept("c2"), &swept, false),
        (Guard::Swept("c1"), &answered, false),
        (Guard::Swept("c1"), &delivery(Unknown), false),
        (Guard::Unknown, &delivery(Unknown), true),
        (Guard::Unknown, &answered, true),
        (Guard::Unknown, &delivery(Failed), false),
    ];
    for (guard, found, want) in cases {
        assert_eq!(guard.admits(found), want, "{guard:?} {found:?}");
    }
}

#[test]
fn the_sweep_settles_only_live_deliveries_past_their_lease() {
    let live = delivery(DeliveryState::Sending);
    assert_eq!(live.at_lease_end(at(1_000)), AtLeaseEnd::Idle);
    assert!(matches!(
        live.at_lease_end(at(1_001)),
        AtLeaseEnd::Settle {
            result: SendResult::Uncertain { .. },
            kept: false,
            lease_until: 1_000
        }
    ));
    let kept = Delivery {
        kept_answer: Some(KeptAnswer::Refused { errcode: 43101 }),
        ..live.clone()
    };
    assert!(matches!(
        kept.at_lease_end(at(1_001)),
        AtLeaseEnd::Settle {
            result: SendResult::Refused { errcode: 43101, .. },
            kept: true,
            lease_until: 1_000
        }
    ));
    let settled = delivery(DeliveryState::Failed);
    assert_eq!(settled.at_lease_end(at(1_001)), AtLeaseEnd::Idle);
    let voiding = Delivery {
        void_others: true,
        ..settled
    };
    assert_eq!(voiding.at_lease_end(at(1_001)), AtLeaseEnd::VoidOthers);
    let off_lease = Delivery {
        lease_until: None,
        ..live
    };
    assert_eq!(off_lease.at_lease_end(at(9_999)), AtLeaseEnd::Idle);
}

#[test]
fn a_stranded_plan_waits_for_a_live_delivery_and_otherwise_settles_as_its_finalize_would() {
    let policy = RetryPolicy::default();
    let now = at(2_000);
    assert_eq!(PlanLearns::Wait.settlement(3, &policy, now), None);
    // Given back unsent: due again at its own instant, its attempts unchanged.
    assert_eq!(
        PlanLearns::Released { due_at: 500 }.settlement(3, &policy, now),
        Some(release(3, at(500)))
    );
    let released = PlanLearns::Released { due_at: 500 }
        .settlement(3, &policy, now)
        .expect("settled");
    assert_eq!(
        (released.attempts, released.grant),
        (3, GrantState::Available)
    );
    // Settled, or missing (unknown): the outcome table's settlement of that class.
    for (learns, class, errcode) in [
        (
            PlanLearns::Settled {
                class: OutcomeClass::Sent,
                errcode: None,
            },
            OutcomeClass::Sent,
            None,
        ),
        (
            PlanLearns::Settled {
                class: OutcomeClass::Retryable,
                errcode: Some(-1),
            },
            OutcomeClass::Retryable,
            Some(-1),
        ),
        (PlanLearns::MISSING, OutcomeClass::Unknown, None),
    ] {
        assert_eq!(
            learns.settlement(1, &policy, now),
            Some(settle(class, errcode, 1, &policy, now)),
            "{learns:?}"
        );
    }
}

#[test]
fn a_stranded_plan_learns_its_deliverys_outcome() {
    assert_eq!(
        delivery(DeliveryState::Sending).for_stranded_plan(),
        PlanLearns::Wait
    );
    let released = Delivery {
        released: true,
        ..delivery(DeliveryState::Failed)
    };
    assert_eq!(
        released.for_stranded_plan(),
        PlanLearns::Released { due_at: 500 }
    );
    let refused = Delivery {
        errcode: Some(43101),
        ..delivery(DeliveryState::Failed)
    };
    assert_eq!(
        refused.for_stranded_plan(),
        PlanLearns::Settled {
            class: SendResult::Refused {
                errcode: 43101,
                errmsg: String::new()
            }
            .class(),
            errcode: Some(43101)
        }
    );
    assert_eq!(
        delivery(DeliveryState::Sent).settled_class(),
        Some(OutcomeClass::Sent)
    );
    assert_eq!(
        delivery(DeliveryState::Failed).settled_class(),
        Some(OutcomeClass::Retryable)
    );
}

#[test]
fn only_an_unknown_send_without_msgid_awaits_its_sent_event() {
    assert!(delivery(DeliveryState::Unknown).awaits_sent_event("T"));
    assert!(!delivery(DeliveryState::Unknown).awaits_sent_event("U"));
    assert!(!delivery(DeliveryState::Sent).awaits_sent_event("T"));
    let answered = Delivery {
        msgid: Some("1".into()),
        ..delivery(DeliveryState::Unknown)
    };
    assert!(!answered.awaits_sent_event("T"));
}

#[test]
fn a_settlement_changes_the_marks_its_writer_owns() {
    let claimed = at(1_000);
    let now = at(2_000);
    let mark = Mark::new(claimed, "d1").encode();
    let finalize_unknown = Marks::of(
        DeliveryState::Unknown,
        None,
        Writer::Sweep,
        "d1",
        claimed,
        now,
    );
    assert_eq!(
        finalize_unknown.open_unknown.as_deref(),
        Some(mark.as_str())
    );
    assert_eq!(
        finalize_unknown.close_inflight.as_deref(),
        Some(mark.as_str())
    );
    assert_eq!(
        (finalize_unknown.close_unknown, finalize_unknown.sent),
        (None, None)
    );
    let late = Marks::of(
        DeliveryState::Sent,
        Some("77"),
        Writer::LateAnswer,
        "d1",
        claimed,
        now,
    );
    assert_eq!(late.close_unknown.as_deref(), Some(mark.as_str()));
    assert_eq!(late.sent, Some(Mark::new(now, "77").encode()));
    assert_eq!((late.open_unknown, late.close_inflight), (None, None));
    let anonymous = Marks::of(
        DeliveryState::Sent,
        None,
        Writer::Finalize,
        "d1",
        claimed,
        now,
    );
    assert_eq!(
        anonymous.sent,
        Some(Mark::new(now, anonymous_sent_id("d1")).encode())
    );
    assert!(!anonymous.is_empty());
}

#[test]
fn a_refused_grant_move_is_retried_only_from_a_void_of_this_delivery() {
    let seen = |state, by: &str, sweep| GrantSeen {
        state: Some(state),
        delivery_id: Some(by.to_string()),
        voided_by_sweep: sweep,
    };
    use GrantState::{Available, Consumed, Invalid, Reserved};
    // (wanted, grant as seen, move from)
    let cases = [
        (Consumed, seen(Invalid, "d1", false), Some(Invalid)),
        (Consumed, seen(Invalid, "d1", true), Some(Invalid)),
        (Available, seen(Invalid, "d1", true), Some(Invalid)),
        // Voided on purpose (a disable): stays void.
        (Available, seen(Invalid, "d1", false), None),
        (Invalid, seen(Invalid, "d1", true), None),
        // Not this delivery's any more, or not void.
        (Consumed, seen(Invalid, "d2", true), None),
        (Consumed, seen(Available, "d1", false), None),
        (Consumed, seen(Reserved, "d1", false), None),
    ];
    for (to, grant, want) in cases {
        assert_eq!(regrant(to, "d1", &grant), want, "{to:?} {grant:?}");
    }
}

#[test]
fn the_dispatchers_own_writer_names_a_release_and_a_late_answer() {
    assert_eq!(Writer::answering(false, false), Writer::Finalize);
    assert_eq!(Writer::answering(false, true), Writer::LateAnswer);
    assert_eq!(
        Writer::answering(true, false),
        Writer::Release { late: false }
    );
    assert_eq!(
        Writer::answering(true, true),
        Writer::Release { late: true }
    );
    assert!(Writer::answering(true, true).settles_unknown());
    assert!(!Writer::answering(true, false).settles_unknown());
}
