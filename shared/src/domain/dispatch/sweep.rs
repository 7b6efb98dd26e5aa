//! The sweep's rule for an entry it could not settle: tried again after the entries
//! behind it, and taken off the lease index for an operator once it can never be
//! settled as it is.

/// How a sweep step on one lease-index entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEnd {
    /// Settled, moved on, or nothing to do.
    Done,
    /// Not to be handled now through no fault of the item (a plan of a reminder kind
    /// missing from the configuration): tried again later, never quarantined.
    Later,
    /// The entry's own item cannot be read: it never will be as it is.
    Unreadable,
    /// The database busy or away: tried again next tick, as it is.
    Unavailable,
    /// Any other failure: it will not fix itself.
    Failed,
}

/// What the sweep does with the entry next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Nothing: it stays where it is (done, or tried again next tick).
    Leave,
    /// Its lease moved past the entries behind it, so it cannot hold up its shard's
    /// page; `counted` adds one to its failures.
    Defer { counted: bool },
    /// Off the lease index, kept and marked for an operator.
    Quarantine,
}

/// Failures after which an entry is quarantined.
pub const SWEEP_FAILURE_LIMIT: u32 = 3;

/// What to do with an entry whose step ended as `end`.
pub fn disposition(end: StepEnd) -> Disposition {
    match end {
        StepEnd::Done | StepEnd::Unavailable => Disposition::Leave,
        StepEnd::Later => Disposition::Defer { counted: false },
        StepEnd::Failed => Disposition::Defer { counted: true },
        StepEnd::Unreadable => Disposition::Quarantine,
    }
}

/// After a counted deferral: whether the entry, now at `failures`, is quarantined.
pub fn quarantined_after(failures: u32) -> bool {
    failures >= SWEEP_FAILURE_LIMIT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreadable_or_repeatedly_failing_entry_is_quarantined() {
        let cases = [
            (StepEnd::Done, Disposition::Leave),
            (StepEnd::Unavailable, Disposition::Leave),
            (StepEnd::Later, Disposition::Defer { counted: false }),
            (StepEnd::Failed, Disposition::Defer { counted: true }),
            (StepEnd::Unreadable, Disposition::Quarantine),
        ];
        for (end, expected) in cases {
            assert_eq!(disposition(end), expected, "{end:?}");
        }
        let quarantined: Vec<u32> = (0..6).filter(|f| quarantined_after(*f)).collect();
        assert_eq!(quarantined, vec![3, 4, 5]);
    }
}
