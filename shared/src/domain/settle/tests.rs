//! Classifying WeChat's answers, and which failures keep a send's count.

use super::*;

#[test]
fn every_row_of_the_outcome_table_classifies() {
    let refused = |errcode| SendResult::Refused {
        errcode,
        errmsg: String::new(),
    };
    let rows = [
        (-1, OutcomeClass::Retryable),
        (45011, OutcomeClass::Retryable),
        (43108, OutcomeClass::Retryable),
        (45009, OutcomeClass::Retryable),
        (40001, OutcomeClass::Retryable),
        (47003, OutcomeClass::Config),
        (40037, OutcomeClass::Config),
        (41030, OutcomeClass::Config),
        (45168, OutcomeClass::Config),
        (43107, OutcomeClass::Config),
        (48001, OutcomeClass::Config),
        (99999, OutcomeClass::Config),
        (43101, OutcomeClass::Refused),
        (40003, OutcomeClass::User),
        (50002, OutcomeClass::User),
    ];
    for (errcode, class) in rows {
        assert_eq!(refused(errcode).class(), class, "errcode {errcode}");
    }
    assert_eq!(
        SendResult::Sent {
            msgid: Some("1".into())
        }
        .class(),
        OutcomeClass::Sent
    );
    assert_eq!(
        SendResult::NotSent {
            reason: "connect".into()
        }
        .class(),
        OutcomeClass::Retryable
    );
    assert_eq!(
        SendResult::Uncertain {
            reason: "timeout".into()
        }
        .class(),
        OutcomeClass::Unknown
    );
}

#[test]
fn only_a_send_that_may_have_gone_out_keeps_its_count_against_the_cap() {
    let policy = RetryPolicy {
        max_attempts: 3,
        retry_base: StdDuration::from_secs(60),
    };
    let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default();
    use DeliveryState::{Failed, Sent, Unknown};
    // (class, errcode, its delivery's state, whether the send still counts)
    let rows = [
        (OutcomeClass::Sent, None, Sent, true),
        (OutcomeClass::Unknown, None, Unknown, true),
        (OutcomeClass::Retryable, Some(-1), Failed, false),
        (OutcomeClass::Config, Some(47003), Failed, false),
        // Its grant is voided, yet nothing went out: the count is given back.
        (OutcomeClass::Refused, Some(43101), Failed, false),
        (OutcomeClass::User, Some(40003), Failed, false),
    ];
    for (class, errcode, state, counts) in rows {
        let settled = settle(class, errcode, 0, &policy, now);
        assert_eq!(settled.delivery, state, "{class:?}");
        assert_eq!(state.counts_against_cap(), counts, "{class:?}");
    }
    assert!(!release(0, now).delivery.counts_against_cap());
}
