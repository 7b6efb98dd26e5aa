//! The outcome table's settlements: delivery, grant, follow-up, and what they read as.

use super::*;

fn policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        retry_base: StdDuration::from_secs(60),
    }
}

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default()
}

#[test]
fn each_class_settles_delivery_grant_and_follow_up_by_the_table() {
    use FollowUp::{Delivered, RetryAt, Stop};
    let p = policy();
    let rows = [
        (
            OutcomeClass::Sent,
            DeliveryState::Sent,
            GrantState::Consumed,
            Delivered,
            false,
        ),
        (
            OutcomeClass::Retryable,
            DeliveryState::Failed,
            GrantState::Available,
            RetryAt(now() + Duration::minutes(1)),
            false,
        ),
        (
            OutcomeClass::Config,
            DeliveryState::Failed,
            GrantState::Available,
            Stop(PauseReason::ConfigError),
            false,
        ),
        (
            OutcomeClass::Refused,
            DeliveryState::Failed,
            GrantState::Invalid,
            Stop(PauseReason::Refused),
            true,
        ),
        (
            OutcomeClass::User,
            DeliveryState::Failed,
            GrantState::Invalid,
            Stop(PauseReason::SendFailed),
            false,
        ),
        (
            OutcomeClass::Unknown,
            DeliveryState::Unknown,
            GrantState::Invalid,
            Stop(PauseReason::Uncertain),
            false,
        ),
    ];
    for (class, delivery, grant, follow_up, others) in rows {
        let s = settle(class, None, 0, &p, now());
        assert_eq!(
            (s.delivery, s.grant, s.follow_up, s.invalidate_others),
            (delivery, grant, follow_up, others),
            "{class:?}"
        );
    }
}

#[test]
fn retries_back_off_doubling_and_stop_at_the_attempt_limit() {
    let p = policy();
    let second = settle(OutcomeClass::Retryable, Some(-1), 1, &p, now());
    assert_eq!(second.attempts, 2);
    assert_eq!(
        second.follow_up,
        FollowUp::RetryAt(now() + Duration::minutes(2))
    );
    let last = settle(OutcomeClass::Retryable, Some(-1), 2, &p, now());
    assert_eq!(last.follow_up, FollowUp::Stop(PauseReason::SendFailed));
    assert_eq!(
        last.grant,
        GrantState::Available,
        "the grant is kept for later"
    );
    let capped = RetryPolicy {
        max_attempts: 20,
        ..p
    };
    assert_eq!(
        settle(OutcomeClass::Retryable, None, 15, &capped, now()).follow_up,
        FollowUp::RetryAt(now() + MAX_RETRY_DELAY)
    );
}

#[test]
fn a_concurrent_send_refusal_never_spends_an_attempt() {
    let p = policy();
    let s = settle(
        OutcomeClass::Retryable,
        Some(CONCURRENT_SEND_ERRCODE),
        2,
        &p,
        now(),
    );
    assert_eq!(s.attempts, 2);
    assert!(matches!(s.follow_up, FollowUp::RetryAt(_)), "{s:?}");
}

#[test]
fn pushes_end_in_the_state_their_follow_up_names() {
    let p = policy();
    let state = |class| settle(class, None, 0, &p, now()).outbox_state();
    assert_eq!(state(OutcomeClass::Sent), OutboxState::Sent);
    assert_eq!(state(OutcomeClass::Retryable), OutboxState::Pending);
    assert_eq!(state(OutcomeClass::Config), OutboxState::Failed);
    assert_eq!(state(OutcomeClass::Unknown), OutboxState::Unknown);
}

#[test]
fn a_released_claim_is_due_again_at_its_own_instant_without_spending_an_attempt() {
    let s = release(2, now());
    assert_eq!(
        (s.grant, s.attempts, s.follow_up),
        (GrantState::Available, 2, FollowUp::RetryAt(now()))
    );
    assert_eq!(s.outbox_state(), OutboxState::Pending);
}

#[test]
fn class_names_round_trip() {
    for class in [
        OutcomeClass::Sent,
        OutcomeClass::Retryable,
        OutcomeClass::Config,
        OutcomeClass::Refused,
        OutcomeClass::User,
        OutcomeClass::Unknown,
    ] {
        assert_eq!(OutcomeClass::parse(class.as_str()), Some(class));
    }
}

#[test]
fn after_a_sweep_a_grant_is_spent_if_wechat_took_it_and_back_only_when_nothing_voided_it() {
    let p = policy();
    let late = |class, may_restore| settle(class, None, 0, &p, now()).after_sweep(may_restore);
    // WeChat took it: spent, whatever voided it meanwhile.
    assert_eq!(late(OutcomeClass::Sent, true), Some(GrantState::Consumed));
    assert_eq!(late(OutcomeClass::Sent, false), Some(GrantState::Consumed));
    // Certainly not sent: back to available, unless voided on purpose since.
    assert_eq!(
        late(OutcomeClass::Retryable, true),
        Some(GrantState::Available)
    );
    assert_eq!(late(OutcomeClass::Retryable, false), None);
    assert_eq!(
        late(OutcomeClass::Config, true),
        Some(GrantState::Available)
    );
    assert_eq!(
        release(0, now()).after_sweep(true),
        Some(GrantState::Available)
    );
    assert_eq!(release(0, now()).after_sweep(false), None);
    // Refused by the user (43101 and the like) or still unknown: it stays void.
    assert_eq!(late(OutcomeClass::Refused, true), None);
    assert_eq!(late(OutcomeClass::Unknown, true), None);
}

#[test]
fn only_a_retry_has_a_retry_instant() {
    let p = policy();
    let at = |class| settle(class, None, 0, &p, now()).retry_at();
    assert!(at(OutcomeClass::Retryable).is_some_and(|t| t > now()));
    assert_eq!(at(OutcomeClass::Sent), None);
    assert_eq!(at(OutcomeClass::Unknown), None);
    assert_eq!(release(0, now()).retry_at(), Some(now()));
}
