//! The plan and the user's standing choice (`subscriptions_setting`).

use super::{at, sending_plan};
use crate::domain::reminders::plan::*;

fn paused(reason: PauseReason) -> PlanStatus {
    PlanStatus::Paused { reason }
}

/// A standing reject in the user's settings pauses the plan without asking (asking
/// is pointless); once the setting no longer keeps it, the plan waits for a new accept
/// as after any refusal, and asks for it; the next grant resumes it.
#[test]
fn a_standing_choice_pauses_without_asking_and_its_lifting_waits_for_a_new_accept() {
    use crate::domain::consent::standing::Standing;
    for (standing, reason, lifted) in [
        (
            Standing::Reject,
            PauseReason::AlwaysRejected,
            PauseReason::Rejected,
        ),
        (
            Standing::Ban,
            PauseReason::AlwaysBanned,
            PauseReason::Banned,
        ),
        (
            Standing::MainSwitchOff,
            PauseReason::MainSwitchOff,
            PauseReason::Rejected,
        ),
    ] {
        let mut plan = sending_plan();
        plan.status = PlanStatus::Scheduled { due: at(10) };
        plan.stand(Some(standing)).expect("legal");
        assert_eq!(plan.status, paused(reason));
        assert!(
            !plan.view(0, at(5)).needs_grant,
            "{standing:?} asks nothing"
        );
        assert_eq!(plan.view(0, at(5)).pause_reason, Some(reason.as_str()));
        // A one-time refusal does not hide the standing one; the same setting again
        // changes nothing.
        plan.refuse(Refusal::Reject).expect("legal");
        plan.stand(Some(standing)).expect("legal");
        assert_eq!(plan.status, paused(reason));
        // Grants held from before, a check-in with one, a settings save, even a new
        // accept (one cannot come while the setting stands: it came with a setting
        // not read) do not lift it; nor does turning the plan off and on.
        plan.check_in(GrantOnHand::Held, at(20)).expect("legal");
        plan.enable(true, at(20)).expect("legal");
        plan.check_in(GrantOnHand::New, at(20)).expect("legal");
        plan.accepted(at(20)).expect("legal");
        assert_eq!(plan.status, paused(reason));
        plan.disable().expect("legal");
        assert!(
            !plan.view(0, at(5)).needs_grant,
            "off, it still asks nothing"
        );
        plan.enable(true, at(20)).expect("legal");
        assert_eq!(plan.status, paused(reason), "off and on again");
        // The setting changes (to accept, or no kept choice): the refusal it was.
        for after in [Some(Standing::Accept), None] {
            let mut lifted_plan = plan.clone();
            lifted_plan.stand(after).expect("legal");
            assert_eq!(lifted_plan.status, paused(lifted));
            assert!(
                lifted_plan.view(3, at(5)).needs_grant,
                "asks for a new accept"
            );
            lifted_plan.accepted(at(30)).expect("legal");
            assert_eq!(lifted_plan.status, PlanStatus::Scheduled { due: at(30) });
        }
    }
}

/// Lifting touches only pauses for a standing choice; a standing choice that arrives
/// while the plan is off or sending applies when it is turned on or the send ends.
#[test]
fn a_standing_choice_is_remembered_while_off_or_sending_and_lifting_leaves_the_rest() {
    use crate::domain::consent::standing::Standing;
    for status in [
        PlanStatus::Scheduled { due: at(10) },
        PlanStatus::AwaitingCheckin,
        paused(PauseReason::Rejected),
        paused(PauseReason::NeedsGrant),
        PlanStatus::Disabled,
    ] {
        let mut plan = sending_plan();
        plan.status = status;
        plan.stand(Some(Standing::Accept)).expect("legal");
        plan.stand(None).expect("legal");
        assert_eq!(plan.status, status, "nothing to lift");
    }
    let mut off = sending_plan();
    off.status = PlanStatus::Disabled;
    off.stand(Some(Standing::MainSwitchOff)).expect("legal");
    off.refuse(Refusal::Reject).expect("legal");
    assert!(!off.view(0, at(5)).needs_grant);
    off.enable(true, at(9)).expect("legal");
    assert_eq!(off.status, paused(PauseReason::MainSwitchOff));

    let mut sending = sending_plan();
    sending.stand(Some(Standing::Reject)).expect("legal");
    assert_eq!(sending.status, PlanStatus::Sending);
    sending
        .finish_send(FollowUp::Delivered, 0, false, at(50))
        .expect("legal");
    assert_eq!(sending.status, paused(PauseReason::AlwaysRejected));

    let mut lifted_while_sending = sending_plan();
    lifted_while_sending
        .stand(Some(Standing::Ban))
        .expect("legal");
    lifted_while_sending.stand(None).expect("legal");
    lifted_while_sending
        .finish_send(FollowUp::Delivered, 0, false, at(50))
        .expect("legal");
    assert_eq!(lifted_while_sending.status, paused(PauseReason::Banned));
}
