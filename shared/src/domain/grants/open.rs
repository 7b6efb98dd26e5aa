//! A template's open grants: the quota item's lists of them, which grant a claim
//! reserves, and what repairs the lists when they fall short of the counters.
//!
//! The quota item lists the request ids of its `available` and `reserved` grants, so
//! a claim picks one and a disable voids them without reading the grant history. Grants
//! recorded before the lists existed are not in them: while the lists do not account
//! for the counters, the grant comes from the ledger, and the ledger's read repairs the
//! lists.

use std::collections::HashSet;

use crate::domain::grants::{GrantState, QuotaCounters};
use crate::domain::ids::RequestId;

/// Open grants by request id, as the quota item lists them or as the ledger holds
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenGrantIds {
    pub available: Vec<RequestId>,
    pub reserved: Vec<RequestId>,
}

impl OpenGrantIds {
    /// Whether these account for the counters.
    pub fn complete(&self, counters: &QuotaCounters) -> bool {
        self.available.len() as u64 == counters.available
            && self.reserved.len() as u64 == counters.reserved
    }

    /// Whether no id is in both lists (a grant has one state).
    pub fn disjoint(&self) -> bool {
        !self.available.iter().any(|id| self.reserved.contains(id))
    }

    /// Whether `request` is listed in `state`.
    pub fn lists(&self, request: &RequestId, state: GrantState) -> bool {
        match state {
            GrantState::Available => self.available.contains(request),
            GrantState::Reserved => self.reserved.contains(request),
            GrantState::Consumed | GrantState::Invalid => false,
        }
    }
}

/// The grant a claim reserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantPick {
    pub request: RequestId,
    /// Listed as available on the quota item (else found in the ledger only).
    pub listed: bool,
}

/// Where a claim's grant comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickFrom {
    /// None available: the claim finds no grant.
    Nothing,
    /// The first the quota item lists as available.
    List(GrantPick),
    /// The lists do not account for the counters (or the list was just found wrong):
    /// read the ledger's open grants and [`pick_from_ledger`].
    Ledger,
}

/// Where a claim's grant comes from, given the counters and the lists as read;
/// `ledger_only` when an earlier try found the listed grant not available after all.
pub fn pick(counters: &QuotaCounters, listed: &OpenGrantIds, ledger_only: bool) -> PickFrom {
    if counters.available == 0 {
        return PickFrom::Nothing;
    }
    match listed.available.first() {
        Some(request) if !ledger_only && listed.complete(counters) => PickFrom::List(GrantPick {
            request: request.clone(),
            listed: true,
        }),
        _ => PickFrom::Ledger,
    }
}

/// The ledger's read, decided: the grant to reserve (its first available), and the
/// fixes that bring the lists to the ledger's — none when the ledger does not account
/// for the counters either (a write between the reads, which changed the lists too).
pub fn pick_from_ledger(
    counters: &QuotaCounters,
    listed: &OpenGrantIds,
    ledger: &OpenGrantIds,
) -> (Option<GrantPick>, Option<Vec<SetFix>>) {
    let pick = ledger.available.first().map(|request| GrantPick {
        listed: listed.available.contains(request),
        request: request.clone(),
    });
    let fixes = ledger.complete(counters).then(|| set_fixes(listed, ledger));
    (pick, fixes)
}

/// One change to an open-grant list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetFix {
    /// The list's state (`available` or `reserved`).
    pub state: GrantState,
    pub request: RequestId,
    /// Added (the ledger has it in that state), else deleted (it has not).
    pub add: bool,
}

/// What it takes to make the lists `listed` the ledger's `held`.
pub fn set_fixes(listed: &OpenGrantIds, held: &OpenGrantIds) -> Vec<SetFix> {
    let mut fixes = Vec::new();
    for (state, listed, held) in [
        (GrantState::Available, &listed.available, &held.available),
        (GrantState::Reserved, &listed.reserved, &held.reserved),
    ] {
        let held_ids: HashSet<&RequestId> = held.iter().collect();
        let listed_ids: HashSet<&RequestId> = listed.iter().collect();
        fixes.extend(
            listed
                .iter()
                .filter(|id| !held_ids.contains(id))
                .map(|id| SetFix {
                    state,
                    request: id.clone(),
                    add: false,
                }),
        );
        fixes.extend(
            held.iter()
                .filter(|id| !listed_ids.contains(id))
                .map(|id| SetFix {
                    state,
                    request: id.clone(),
                    add: true,
                }),
        );
    }
    fixes
}

/// Grants a write found not in the state it expected: those the lists still show in
/// that state are deleted from them.
pub fn unlist_refused(
    listed: &OpenGrantIds,
    refused: impl IntoIterator<Item = (RequestId, GrantState)>,
) -> Vec<SetFix> {
    refused
        .into_iter()
        .filter(|(request, state)| listed.lists(request, *state))
        .map(|(request, state)| SetFix {
            state,
            request,
            add: false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<RequestId> {
        list.iter()
            .map(|id| RequestId::parse(*id).expect("valid request id"))
            .collect()
    }

    fn open(available: &[&str], reserved: &[&str]) -> OpenGrantIds {
        OpenGrantIds {
            available: ids(available),
            reserved: ids(reserved),
        }
    }

    fn counters(available: u64, reserved: u64) -> QuotaCounters {
        QuotaCounters {
            accepted: available + reserved,
            available,
            reserved,
            ..QuotaCounters::default()
        }
    }

    fn listed(id: &str) -> PickFrom {
        PickFrom::List(GrantPick {
            request: ids(&[id])[0].clone(),
            listed: true,
        })
    }

    #[test]
    fn a_claim_picks_from_the_list_only_while_it_accounts_for_the_counters() {
        // (counters, list, ledger only, where from)
        let cases = [
            (counters(0, 0), open(&[], &[]), false, PickFrom::Nothing),
            (
                counters(0, 1),
                open(&["a"], &["b"]),
                false,
                PickFrom::Nothing,
            ),
            (counters(2, 0), open(&["a", "b"], &[]), false, listed("a")),
            (counters(1, 1), open(&["a"], &["b"]), false, listed("a")),
            // Grants from before the lists: the ledger.
            (counters(2, 0), open(&["a"], &[]), false, PickFrom::Ledger),
            (counters(1, 1), open(&["a"], &[]), false, PickFrom::Ledger),
            // The listed grant was not available after all.
            (
                counters(2, 0),
                open(&["a", "b"], &[]),
                true,
                PickFrom::Ledger,
            ),
        ];
        for (counters, list, ledger_only, want) in cases {
            assert_eq!(
                pick(&counters, &list, ledger_only),
                want,
                "{counters:?} {list:?}"
            );
        }
    }

    #[test]
    fn the_ledger_gives_the_grant_and_repairs_the_lists_only_when_it_agrees() {
        let (grant, fixes) = pick_from_ledger(
            &counters(2, 1),
            &open(&["x", "b"], &[]),
            &open(&["b", "c"], &["d"]),
        );
        assert_eq!(
            grant,
            Some(GrantPick {
                request: ids(&["b"])[0].clone(),
                listed: true
            })
        );
        let fixes: Vec<_> = fixes
            .expect("the ledger agrees with the counters")
            .into_iter()
            .map(|f| (f.state, f.request.to_string(), f.add))
            .collect();
        assert_eq!(
            fixes,
            vec![
                (GrantState::Available, "x".to_string(), false),
                (GrantState::Available, "c".to_string(), true),
                (GrantState::Reserved, "d".to_string(), true),
            ]
        );
        // A ledger that does not account for the counters repairs nothing.
        let (grant, fixes) = pick_from_ledger(&counters(3, 0), &open(&[], &[]), &open(&["c"], &[]));
        assert_eq!(grant.map(|g| g.listed), Some(false));
        assert_eq!(fixes, None);
        // No grant in the ledger after all.
        let (grant, _) = pick_from_ledger(&counters(1, 0), &open(&[], &[]), &open(&[], &[]));
        assert_eq!(grant, None);
    }

    #[test]
    fn refused_grants_leave_only_the_lists_that_still_show_them() {
        let list = open(&["a"], &["b"]);
        let fixes = unlist_refused(
            &list,
            [
                (ids(&["a"])[0].clone(), GrantState::Available),
                (ids(&["b"])[0].clone(), GrantState::Available),
                (ids(&["b"])[0].clone(), GrantState::Reserved),
                (ids(&["c"])[0].clone(), GrantState::Consumed),
            ],
        );
        let got: Vec<_> = fixes
            .into_iter()
            .map(|f| (f.request.to_string(), f.state, f.add))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), GrantState::Available, false),
                ("b".to_string(), GrantState::Reserved, false),
            ]
        );
    }

    #[test]
    fn lists_are_complete_and_disjoint_or_not() {
        assert!(open(&["a"], &["b"]).complete(&counters(1, 1)));
        assert!(!open(&["a"], &[]).complete(&counters(1, 1)));
        assert!(open(&["a"], &["b"]).disjoint());
        assert!(!open(&["a"], &["a"]).disjoint());
    }
}
