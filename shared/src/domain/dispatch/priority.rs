//! Priority for scarce grants (docs/design.md §3, Push; docs/how-it-works.md).
//!
//! While a user holds fewer grants of a template than pushes of it wait, the `priority`
//! of each push decides, then the oldest first. A push that finds no grant at its claim
//! does not end `skipped`: it waits, listed on the template's quota item as a
//! [`member`] (`<rank>:<note id>`, which sorts best first: the rank, then the note id,
//! which starts with its creation instant). A push claimed while a better one waits
//! yields its turn: it waits too, and the best waiting one is woken (due now). A grant
//! arriving wakes as many of the best waiting as there are grants available. A waiting
//! push that reaches its `expires_at` ends `expired`, inbox-only.
//!
//! Members are removed when their push is claimed; one whose push ended otherwise
//! (expired, cancelled, replaced) is dropped when a wake finds its push no longer
//! waiting (or a full list is pruned), so a stale member delays a claim by one round
//! at most, never for good. A grant given back (a failed or released send) wakes the
//! waiting too.

use crate::domain::inbox::schedule::Priority;

/// The most pushes of one template that wait for a grant per user: the quota item
/// every claim reads lists them, so its size (and each claim's read) stays bounded. A
/// push that finds the list full is skipped, as before waiting existed.
pub const MAX_WAITING: usize = 50;

/// The quota item's member for the push of note `note_id` at `priority`.
pub fn member(priority: Priority, note_id: &str) -> String {
    let rank = match priority {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    };
    format!("{rank}:{note_id}")
}

/// What a push's claim does about the grants of its template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtGrant {
    /// Take one: no better push waits for the grants available.
    Take,
    /// Wait for a grant (listed as its member); wake `wake` (the best waiting push,
    /// which a grant available now is for), if any.
    Wait { wake: Option<String> },
    /// Not taking a grant, and the waiting list is full: skipped, as a push without a
    /// grant was before waiting existed (waking `wake`, as for a wait).
    Skip { wake: Option<String> },
}

/// Decides a push's claim: `own` its member, `available` the template's grants
/// available, `waiting` the members listed (its own among them if it waited before).
pub fn at_grant(own: &str, available: u64, waiting: &[String]) -> AtGrant {
    let better = waiting.iter().filter(|m| m.as_str() < own).count();
    if usize::try_from(available).unwrap_or(usize::MAX) > better {
        return AtGrant::Take;
    }
    // A grant is there but a better push waits for it: wake the best one.
    let wake = (available > 0)
        .then(|| best(waiting, 1).into_iter().next())
        .flatten();
    let listed = waiting.iter().any(|m| m == own);
    if !listed && waiting.len() >= MAX_WAITING {
        return AtGrant::Skip { wake };
    }
    AtGrant::Wait { wake }
}

/// The best `grants` waiting members (for a grant arriving to wake).
pub fn best(waiting: &[String], grants: u64) -> Vec<String> {
    let mut sorted: Vec<String> = waiting.to_vec();
    sorted.sort();
    sorted.truncate(usize::try_from(grants).unwrap_or(usize::MAX));
    sorted
}

/// The note id a member names, if it is one.
pub fn note_of(member: &str) -> Option<&str> {
    let (rank, note) = member.split_once(':')?;
    matches!(rank, "0" | "1" | "2").then_some(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(priority: Priority, created: u64) -> String {
        member(priority, &format!("{created:013}abcdefabcdef"))
    }

    #[test]
    fn members_sort_by_priority_then_oldest() {
        let mut all = vec![
            m(Priority::Low, 1),
            m(Priority::Normal, 3),
            m(Priority::High, 5),
            m(Priority::Normal, 2),
        ];
        all.sort();
        assert_eq!(
            all,
            vec![
                m(Priority::High, 5),
                m(Priority::Normal, 2),
                m(Priority::Normal, 3),
                m(Priority::Low, 1)
            ]
        );
        assert_eq!(note_of(&all[0]), Some("0000000000005abcdefabcdef"));
        assert_eq!(note_of("9:x"), None);
    }

    #[test]
    fn one_grant_and_three_waiting_goes_to_the_best_and_the_rest_wait() {
        let (low, high, normal) = (
            m(Priority::Low, 1),
            m(Priority::High, 2),
            m(Priority::Normal, 3),
        );
        let waiting = vec![low.clone(), high.clone(), normal.clone()];
        assert_eq!(at_grant(&high, 1, &waiting), AtGrant::Take);
        // The others yield, and wake the high one the grant is for.
        for other in [&low, &normal] {
            assert_eq!(
                at_grant(other, 1, &waiting),
                AtGrant::Wait {
                    wake: Some(high.clone())
                }
            );
        }
        // Two grants: high and normal take, low waits; none: all wait, none woken.
        assert_eq!(at_grant(&normal, 2, &waiting), AtGrant::Take);
        assert!(matches!(at_grant(&low, 2, &waiting), AtGrant::Wait { .. }));
        assert_eq!(
            at_grant(&high, 0, &waiting),
            AtGrant::Wait { wake: None },
            "no grant: it waits"
        );
        assert_eq!(best(&waiting, 2), vec![high, normal]);
    }

    #[test]
    fn a_push_not_listed_is_skipped_when_the_list_is_full() {
        let full: Vec<String> = (0..MAX_WAITING as u64)
            .map(|i| m(Priority::High, i))
            .collect();
        let late = m(Priority::Low, 999);
        assert_eq!(at_grant(&late, 0, &full), AtGrant::Skip { wake: None });
        assert_eq!(
            at_grant(&late, 1, &full),
            AtGrant::Skip {
                wake: Some(full[0].clone())
            },
            "the grant there is still goes to the best"
        );
        // One already listed waits on; a new push with no one better and a grant takes.
        assert_eq!(at_grant(&full[3], 0, &full), AtGrant::Wait { wake: None });
        assert_eq!(at_grant(&m(Priority::High, 0), 1, &[]), AtGrant::Take);
    }
}
