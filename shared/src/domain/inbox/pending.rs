//! The cap on a user's open pushes from one publisher (`PUSHES_PENDING_MAX`, each
//! publisher's lane apart): pending, waiting for a grant, scheduled or in flight.
//! Decided at ingest, before anything is written: past the cap the event's notification
//! is stored all the same (record first) and its push recorded `rejected` with
//! `too_many_pending`. A push that replaces one of the user's open pushes (the same
//! `collapse_key`) is taken at the cap: the count does not grow.

use crate::domain::inbox::PushReason;

/// Why an event's push, were it to be `pending`, is refused instead (`None`: taken).
/// `open` is the user's open pushes from the event's publisher as counted (up to
/// `max`). A push that is not to be pending anyway (cancelled first, expired) is
/// recorded as such, not refused.
pub fn refused(open: u32, max: u32, replaces_open: bool) -> Option<PushReason> {
    (open >= max && !replaces_open).then_some(PushReason::TooManyPending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_refuses_from_the_maximum_on_unless_an_open_push_is_replaced() {
        for (open, max, replaces, taken) in [
            (0, 1, false, true),
            (2, 3, false, true),
            (3, 3, false, false),
            (4, 3, false, false),
            (3, 3, true, true),
            (0, 1, true, true),
        ] {
            let decided = refused(open, max, replaces);
            assert_eq!(decided.is_none(), taken, "{open}/{max} {replaces}");
            if let Some(code) = decided {
                assert_eq!(code.as_str(), "too_many_pending");
            }
        }
    }
}
