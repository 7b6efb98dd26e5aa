//! The plan state machine, table-first and by property.

use crate::domain::reminders::plan::*;
use proptest::prelude::*;

pub(super) fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap_or_default()
}

fn arb_event() -> impl Strategy<Value = PlanEvent> {
    let due = (0i64..2_000_000_000).prop_map(at);
    let reason = prop::sample::select(vec![
        PauseReason::NeedsGrant,
        PauseReason::Rejected,
        PauseReason::Banned,
        PauseReason::Uncertain,
        PauseReason::ConfigError,
        PauseReason::SendFailed,
        PauseReason::Refused,
        PauseReason::AlwaysRejected,
        PauseReason::AlwaysBanned,
        PauseReason::MainSwitchOff,
    ]);
    let grant = prop::sample::select(vec![GrantOnHand::None, GrantOnHand::Held, GrantOnHand::New]);
    prop_oneof![
        (any::<bool>(), due.clone()).prop_map(|(grant, due)| PlanEvent::Enable { grant, due }),
        due.clone().prop_map(|due| PlanEvent::Reschedule { due }),
        Just(PlanEvent::Disable),
        (grant, due.clone()).prop_map(|(grant, due)| PlanEvent::CheckIn { grant, due }),
        due.clone().prop_map(|due| PlanEvent::GrantAdded { due }),
        Just(PlanEvent::Refused(Refusal::Reject)),
        Just(PlanEvent::Refused(Refusal::Ban)),
        Just(PlanEvent::Refused(Refusal::AlwaysReject)),
        Just(PlanEvent::Refused(Refusal::AlwaysBan)),
        Just(PlanEvent::Refused(Refusal::MainSwitchOff)),
        Just(PlanEvent::StandingLifted),
        Just(PlanEvent::Claimed),
        Just(PlanEvent::GrantMissing),
        due.clone().prop_map(|due| PlanEvent::Capped { due }),
        Just(PlanEvent::Sent),
        due.prop_map(|due| PlanEvent::RetryLater { due }),
        reason.prop_map(PlanEvent::SendStopped),
    ]
}

proptest! {
    /// Whatever happens, the plan is in exactly one well-formed state: a schedule
    /// only with a grant event behind it, sending only after a claim, and an illegal
    /// event changes nothing.
    #[test]
    fn no_event_sequence_reaches_an_illegal_state(events in prop::collection::vec(arb_event(), 0..60)) {
        let mut status = PlanStatus::Disabled;
        for event in events {
            match status.apply(event) {
                Ok(next) => {
                    match (status, event, next) {
                        (_, PlanEvent::Disable, n) => prop_assert_eq!(n, PlanStatus::Disabled),
                        (PlanStatus::Disabled, e, n) if !matches!(e, PlanEvent::Enable { .. }) => {
                            prop_assert_eq!(n, PlanStatus::Disabled, "only enabling leaves disabled")
                        }
                        (_, PlanEvent::Enable { grant: false, .. } | PlanEvent::CheckIn { grant: GrantOnHand::None, .. }, PlanStatus::Scheduled { .. }) => {
                            prop_assert!(matches!(status, PlanStatus::Scheduled { .. }), "scheduled without a grant")
                        }
                        (PlanStatus::Paused { reason }, e, PlanStatus::Scheduled { .. }) if reason.holds_until_accept() => {
                            prop_assert!(
                                matches!(e, PlanEvent::GrantAdded { .. } | PlanEvent::CheckIn { grant: GrantOnHand::New, .. }),
                                "a refusal lifted by {:?}, not a new accept", e
                            )
                        }
                        (prev, _, PlanStatus::Sending) => prop_assert!(
                            matches!(prev, PlanStatus::Sending) || event == PlanEvent::Claimed,
                            "sending without a claim"
                        ),
                        _ => {}
                    }
                    if let PlanStatus::Scheduled { due } = next {
                        prop_assert_eq!(next.due(), Some(due));
                    }
                    prop_assert_eq!(next.pause_reason().is_some(), matches!(next, PlanStatus::Paused { .. }));
                    status = next;
                }
                Err(err) => prop_assert_eq!(err.from, status),
            }
        }
    }
}

#[test]
fn the_seed_loop_runs_enable_claim_send_checkin() {
    let due = at(1000);
    let s = PlanStatus::Disabled
        .apply(PlanEvent::Enable { grant: true, due })
        .and_then(|s| s.apply(PlanEvent::Claimed))
        .and_then(|s| s.apply(PlanEvent::Sent))
        .expect("legal");
    assert_eq!(s, PlanStatus::AwaitingCheckin);
    let next = at(2000);
    assert_eq!(
        s.apply(PlanEvent::CheckIn {
            grant: GrantOnHand::Held,
            due: next
        }),
        Ok(PlanStatus::Scheduled { due: next })
    );
    assert_eq!(
        s.apply(PlanEvent::CheckIn {
            grant: GrantOnHand::None,
            due: next
        }),
        Ok(PlanStatus::Paused {
            reason: PauseReason::NeedsGrant
        })
    );
}

#[test]
fn dispatcher_events_outside_their_states_are_refused() {
    for event in [
        PlanEvent::Sent,
        PlanEvent::RetryLater { due: at(1) },
        PlanEvent::SendStopped(PauseReason::Uncertain),
    ] {
        assert!(PlanStatus::Scheduled { due: at(1) }.apply(event).is_err());
        assert!(PlanStatus::Disabled.apply(event).is_err());
    }
    assert!(
        PlanStatus::AwaitingCheckin
            .apply(PlanEvent::Claimed)
            .is_err()
    );
}

pub(super) fn sending_plan() -> Plan {
    let kind = crate::domain::reminders::test_kind();
    let mut plan = Plan::new(&kind);
    plan.status = PlanStatus::Sending;
    plan.delivery_id = Some("d1".into());
    plan.lease_until = Some(at(100));
    plan
}

#[test]
fn a_user_resuming_a_plan_paused_for_failed_sends_starts_the_count_afresh() {
    let failing = PlanStatus::Paused {
        reason: PauseReason::SendFailed,
    };
    let resume = |before: PlanStatus, event: PlanEvent| {
        let mut plan = sending_plan();
        plan.status = before;
        plan.attempts = 3;
        plan.status = before.apply(event).expect("legal");
        plan.resumed_from(before);
        (plan.status, plan.attempts)
    };
    let check_in = PlanEvent::CheckIn {
        grant: GrantOnHand::Held,
        due: at(9),
    };
    assert_eq!(
        resume(failing, check_in),
        (PlanStatus::Scheduled { due: at(9) }, 0)
    );
    let enable = PlanEvent::Enable {
        grant: true,
        due: at(9),
    };
    assert_eq!(
        resume(failing, enable),
        (PlanStatus::Scheduled { due: at(9) }, 0)
    );
    // Without a grant it stays paused, and the count stands; other pauses keep it.
    let no_grant = PlanEvent::CheckIn {
        grant: GrantOnHand::None,
        due: at(9),
    };
    assert_eq!(resume(failing, no_grant).1, 3);
    let uncertain = PlanStatus::Paused {
        reason: PauseReason::Uncertain,
    };
    assert_eq!(resume(uncertain, check_in).1, 3);
    // A check-in made during the send that used up the attempts resumes it too.
    let mut plan = sending_plan();
    plan.checked_in_while_sending = true;
    plan.last_checkin_at = Some(at(50));
    plan.finish_send(FollowUp::Stop(PauseReason::SendFailed), 3, true, at(60))
        .expect("legal");
    assert!(
        matches!(plan.status, PlanStatus::Scheduled { .. }),
        "{:?}",
        plan.status
    );
    assert_eq!(plan.attempts, 0);
}

#[test]
fn enabling_a_scheduled_plan_whose_grant_is_gone_pauses_it_for_a_grant() {
    let s = PlanStatus::Scheduled { due: at(5) }.apply(PlanEvent::Enable {
        grant: false,
        due: at(9),
    });
    assert_eq!(
        s,
        Ok(PlanStatus::Paused {
            reason: PauseReason::NeedsGrant
        })
    );
}

#[test]
fn only_a_check_in_schedules_a_plan_that_was_sent() {
    assert_eq!(
        PlanStatus::AwaitingCheckin.apply(PlanEvent::GrantAdded { due: at(9) }),
        Ok(PlanStatus::AwaitingCheckin)
    );
    let mut plan = sending_plan();
    plan.finish_send(FollowUp::Delivered, 0, true, at(50))
        .expect("legal");
    assert_eq!(
        plan.status,
        PlanStatus::AwaitingCheckin,
        "no check-in, no schedule"
    );
    assert_eq!(
        (plan.delivery_id.as_deref(), plan.lease_until),
        (None, None)
    );

    let mut plan = sending_plan();
    plan.checked_in_while_sending = true;
    plan.last_checkin_at = Some(at(40));
    plan.finish_send(FollowUp::Delivered, 0, true, at(50))
        .expect("legal");
    assert!(
        matches!(plan.status, PlanStatus::Scheduled { .. }),
        "{:?}",
        plan.status
    );

    // A send that ends paused still counts the check-in that brought a grant.
    let mut paused = sending_plan();
    paused.checked_in_while_sending = true;
    paused.last_checkin_at = Some(at(40));
    paused
        .finish_send(FollowUp::Stop(PauseReason::Uncertain), 0, true, at(50))
        .expect("legal");
    assert!(matches!(paused.status, PlanStatus::Scheduled { .. }));
    assert_eq!(paused.delivery_id, None, "the plan moved on from that send");
    assert!(!plan.checked_in_while_sending);
}

#[test]
fn a_refusal_during_a_send_pauses_the_plan_when_the_send_ends() {
    let mut plan = sending_plan();
    plan.refuse(Refusal::Reject).expect("legal");
    assert_eq!(plan.status, PlanStatus::Sending, "the send is left alone");
    plan.finish_send(FollowUp::RetryAt(at(60)), 1, true, at(50))
        .expect("legal");
    assert_eq!(
        plan.status,
        PlanStatus::Paused {
            reason: PauseReason::Rejected
        }
    );
    assert_eq!(plan.pending_refusal, None);
}

#[test]
fn a_late_answer_moves_a_plan_paused_uncertain_by_its_own_delivery_only() {
    let policy = crate::domain::settle::RetryPolicy {
        max_attempts: 3,
        retry_base: std::time::Duration::from_secs(60),
    };
    let sent = crate::domain::settle::settle(
        crate::domain::settle::OutcomeClass::Sent,
        Some(0),
        0,
        &policy,
        at(50),
    );
    let swept = crate::domain::settle::settle(
        crate::domain::settle::OutcomeClass::Unknown,
        None,
        0,
        &policy,
        at(50),
    );
    let mut plan = sending_plan();
    plan.finish_send(swept.follow_up, 0, false, at(50))
        .expect("legal");
    assert!(
        plan.is_uncertain_about("d1"),
        "the sweep keeps the delivery id"
    );
    let mut other = plan.clone();
    assert_eq!(
        other.settle_late("d2", &sent, false, at(0), at(60)),
        Ok(false)
    );
    assert_eq!(other, plan);
    assert_eq!(
        plan.settle_late("d1", &sent, false, at(0), at(60)),
        Ok(true)
    );
    assert_eq!(plan.status, PlanStatus::AwaitingCheckin);
    assert_eq!(plan.delivery_id, None);
}

#[test]
fn refusals_pause_with_their_reason_and_a_grant_resumes() {
    let s = PlanStatus::Scheduled { due: at(5) }.apply(PlanEvent::Refused(Refusal::Ban));
    assert_eq!(
        s,
        Ok(PlanStatus::Paused {
            reason: PauseReason::Banned
        })
    );
    let resumed = s.and_then(|s| s.apply(PlanEvent::GrantAdded { due: at(9) }));
    assert_eq!(resumed, Ok(PlanStatus::Scheduled { due: at(9) }));
}

/// A refusal (reject, ban, WeChat's 43101) holds until the user accepts again:
/// grants held from before it, a check-in without a new accept and a settings save
/// leave the plan paused, and its view asks for a grant.
#[test]
fn a_refusal_holds_until_a_new_accept() {
    for reason in [
        PauseReason::Rejected,
        PauseReason::Banned,
        PauseReason::Refused,
    ] {
        let mut plan = sending_plan();
        plan.status = PlanStatus::Paused { reason };
        plan.delivery_id = None;
        plan.lease_until = None;
        plan.enable(true, at(9)).expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::Paused { reason },
            "a settings save"
        );
        plan.check_in(GrantOnHand::Held, at(9)).expect("legal");
        assert_eq!(
            plan.status,
            PlanStatus::Paused { reason },
            "a plain check-in"
        );
        assert!(
            plan.view(2, at(5)).needs_grant,
            "asks though grants are held"
        );
        plan.check_in(GrantOnHand::New, at(9)).expect("legal");
        assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
        assert!(!plan.view(2, at(5)).needs_grant);

        let mut reported = sending_plan();
        reported.status = PlanStatus::Paused { reason };
        reported.accepted(at(7)).expect("legal");
        assert_eq!(reported.status, PlanStatus::Scheduled { due: at(7) });
    }
    // Other pauses resume with a grant held, as before.
    let mut plan = sending_plan();
    plan.status = PlanStatus::Paused {
        reason: PauseReason::Uncertain,
    };
    plan.check_in(GrantOnHand::Held, at(9)).expect("legal");
    assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
}

/// A refusal while the plan is off is remembered: turning it on with grants from
/// before finds it paused; a new accept in between lifts it; a disable forgets it.
#[test]
fn a_refusal_while_off_holds_when_the_plan_is_turned_on() {
    let off = || {
        let mut plan = sending_plan();
        plan.status = PlanStatus::Disabled;
        plan.delivery_id = None;
        plan.lease_until = None;
        plan.refuse(Refusal::Reject).expect("legal");
        assert_eq!(plan.status, PlanStatus::Disabled);
        assert!(plan.view(1, at(5)).needs_grant);
        plan
    };
    let mut plan = off();
    plan.enable(true, at(9)).expect("legal");
    assert_eq!(
        plan.status,
        PlanStatus::Paused {
            reason: PauseReason::Rejected
        }
    );
    let mut plan = off();
    plan.accepted(at(8)).expect("legal");
    plan.enable(true, at(9)).expect("legal");
    assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
    let mut plan = off();
    plan.disable().expect("legal");
    plan.enable(true, at(9)).expect("legal");
    assert_eq!(plan.status, PlanStatus::Scheduled { due: at(9) });
}

/// WeChat's 43101 answers a send claimed before the user's new accept: the plan
/// goes on with that accept's grant, as the grant itself is spared.
#[test]
fn a_new_accept_during_a_send_refused_43101_resumes_the_plan() {
    let mut plan = sending_plan();
    plan.accepted(at(70)).expect("legal");
    assert_eq!(plan.status, PlanStatus::Sending, "the send is left alone");
    plan.finish_send(FollowUp::Stop(PauseReason::Refused), 0, true, at(50))
        .expect("legal");
    assert!(
        matches!(plan.status, PlanStatus::Scheduled { .. }),
        "{:?}",
        plan.status
    );
    assert!(!plan.accepted_while_sending);
    // Without the accept (a grant merely held), the refusal holds.
    let mut plan = sending_plan();
    plan.finish_send(FollowUp::Stop(PauseReason::Refused), 0, true, at(50))
        .expect("legal");
    assert_eq!(
        plan.status,
        PlanStatus::Paused {
            reason: PauseReason::Refused
        }
    );
}

/// A refusal and a new accept during one send: the later one wins when it ends.
#[test]
fn during_a_send_the_later_of_a_refusal_and_a_new_accept_wins() {
    let mut plan = sending_plan();
    plan.refuse(Refusal::Reject).expect("legal");
    plan.last_checkin_at = Some(at(40));
    plan.check_in(GrantOnHand::New, at(90)).expect("legal");
    plan.finish_send(FollowUp::Delivered, 0, true, at(50))
        .expect("legal");
    assert!(
        matches!(plan.status, PlanStatus::Scheduled { .. }),
        "{:?}",
        plan.status
    );

    let mut plan = sending_plan();
    plan.last_checkin_at = Some(at(40));
    plan.check_in(GrantOnHand::New, at(90)).expect("legal");
    plan.refuse(Refusal::Ban).expect("legal");
    plan.finish_send(FollowUp::Delivered, 0, true, at(50))
        .expect("legal");
    assert_eq!(
        plan.status,
        PlanStatus::Paused {
            reason: PauseReason::Banned
        }
    );
}

#[test]
fn a_capped_plan_is_due_again_later_and_only_a_scheduled_one_is_capped() {
    let (now, later) = (at(1_000), at(90_000));
    assert_eq!(
        PlanStatus::Scheduled { due: now }.apply(PlanEvent::Capped { due: later }),
        Ok(PlanStatus::Scheduled { due: later })
    );
    for from in [
        PlanStatus::Disabled,
        PlanStatus::Sending,
        PlanStatus::AwaitingCheckin,
        PlanStatus::Paused {
            reason: PauseReason::NeedsGrant,
        },
    ] {
        assert!(
            from.apply(PlanEvent::Capped { due: later }).is_err(),
            "{from:?}"
        );
    }
}

#[test]
fn a_plan_is_due_by_its_own_entry_or_one_moved_ahead_never_an_earlier_one() {
    let mut plan = Plan::new(&crate::domain::reminders::test_kind());
    plan.status = PlanStatus::Scheduled { due: at(1_000) };
    assert!(plan.is_due_by(at(1_000)) && plan.is_due_by(at(4_600)));
    assert!(!plan.is_due_at(at(4_600)) && !plan.is_due_by(at(999)));
    plan.status = PlanStatus::Sending;
    assert!(!plan.is_due_by(at(4_600)));
}

mod standing;
