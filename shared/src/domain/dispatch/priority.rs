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
//! Pushes due together count too: a `normal` or `low` push about to take a grant reads
//! the user's open pushes of its template of a better class due within [`YIELD_WAIT`]
//! (not yet listed: the `pending` index) and yields to them as to waiting ones
//! ([`at_grant_due`]): it waits, listed, with the template's wake entry due at the
//! end of [`YIELD_WAIT`], so if those do not take the grants after all, a wake gives
//! them to the best waiting push then. A `high` push never looks: no class is better.
//!
//! Members are removed when their push is claimed; one whose push ended otherwise
//! (expired, cancelled, replaced) is dropped when a wake finds its push no longer
//! waiting (or a full list is pruned), so a stale member delays a claim by one round
//! at most, never for good. A grant given back (a failed or released send) wakes the
//! waiting too.

use chrono::{DateTime, Utc};

use crate::domain::inbox::preferences::{Gate, Preferences, gate};
use crate::domain::template::Priority;

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

/// How far ahead a push's claim looks for better pushes of its template due together,
/// and when the wake entry of one that yielded to them is due (a dispatcher's tick and
/// its lookahead).
pub const YIELD_WAIT: chrono::Duration = chrono::Duration::seconds(60);

/// When the wake entry of a push that yielded comes due: once the pushes due together
/// have had their chance at the grants ([`YIELD_WAIT`] from `now`) — unless the entry
/// is on the index (`listed`) and due sooner already (`due_at`, ms: a grant given
/// beside waiting pushes), when it stays as it is (None).
pub fn yield_wake_at(
    now: DateTime<Utc>,
    listed: bool,
    due_at: Option<i64>,
) -> Option<DateTime<Utc>> {
    let at = now + YIELD_WAIT;
    let sooner = listed && due_at.is_some_and(|due| due <= at.timestamp_millis());
    (!sooner).then_some(at)
}

/// What a push's claim does about the grants of its template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtGrant {
    /// Take one: no better push waits for the grants available.
    Take,
    /// Wait for a grant (listed as its member): better pushes of the template are due
    /// together for the grants there are. The template's wake entry comes due at the
    /// end of [`YIELD_WAIT`], in case they do not take them.
    Yield,
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

/// One of the user's open pushes of a better class due together with a claimed one, as
/// the `pending` index shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTogether {
    pub member: String,
    /// Its notification's type (absent on items stored before it was kept).
    pub note_type: Option<String>,
    /// Its last moment (`expires_at`).
    pub send_by: Option<DateTime<Utc>>,
}

/// The members of `due` that will contend for the grants when their turn comes: not of
/// a type the user muted, not held by quiet hours, not past their `expires_at`. The
/// others would never take a grant now, so nothing yields to them.
pub fn contenders(due: &[DueTogether], prefs: &Preferences, now: DateTime<Utc>) -> Vec<String> {
    due.iter()
        .filter(|d| d.send_by.is_none_or(|by| by > now))
        .filter(|d| {
            let priority = match d.member.split_once(':').map(|(rank, _)| rank) {
                Some("0") => Priority::High,
                Some("1") => Priority::Normal,
                _ => Priority::Low,
            };
            gate(prefs, d.note_type.as_deref(), priority, now) == Gate::Go
        })
        .map(|d| d.member.clone())
        .collect()
}

/// Whether `own`'s class can be beaten by another (a `high` push never yields to
/// pushes due together: among pushes of one class, the first claimed goes first).
pub fn may_yield(own: &str) -> bool {
    !own.starts_with("0:")
}

/// [`at_grant`] with the better pushes due together: `due`, the members of the user's
/// open pushes of the template of a better class due within [`YIELD_WAIT`] (read from
/// the `pending` index, some perhaps listed too). A push that would take a grant yields
/// when those and the better waiting ones are as many as the grants available — unless
/// the waiting list has no room for it, when it takes (as before pushes due together
/// counted).
pub fn at_grant_due(own: &str, available: u64, waiting: &[String], due: &[String]) -> AtGrant {
    let at = at_grant(own, available, waiting);
    if at != AtGrant::Take {
        return at;
    }
    let better: std::collections::BTreeSet<&str> = waiting
        .iter()
        .chain(due)
        .map(String::as_str)
        .filter(|m| *m < own)
        .collect();
    let listed = waiting.iter().any(|m| m == own);
    let room = listed || waiting.len() < MAX_WAITING;
    if room && usize::try_from(available).unwrap_or(usize::MAX) <= better.len() {
        AtGrant::Yield
    } else {
        AtGrant::Take
    }
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

    #[test]
    fn a_yielded_pushs_wake_comes_after_the_wait_unless_listed_sooner() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).expect("instant");
        let after = now + YIELD_WAIT;
        let ms = |at: DateTime<Utc>| Some(at.timestamp_millis());
        assert_eq!(yield_wake_at(now, false, None), Some(after));
        // Not on the index: whatever it held, the wait's end.
        assert_eq!(yield_wake_at(now, false, ms(now)), Some(after));
        // On the index and due sooner (or just then): left as it is.
        assert_eq!(yield_wake_at(now, true, ms(now)), None);
        assert_eq!(yield_wake_at(now, true, ms(after)), None);
        // On the index but later (a wake of never, or a retry's): brought forward.
        assert_eq!(
            yield_wake_at(now, true, ms(after + chrono::Duration::seconds(1))),
            Some(after)
        );
    }

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
    fn pushes_due_together_go_by_class_whichever_is_claimed_first() {
        let (low, normal, high) = (
            m(Priority::Low, 1),
            m(Priority::Normal, 2),
            m(Priority::High, 3),
        );
        // One grant, all three due, none waiting: low and normal yield, high takes.
        let due_for = |own: &String| -> Vec<String> {
            [&low, &normal, &high]
                .into_iter()
                .filter(|m| *m < own)
                .cloned()
                .collect()
        };
        assert_eq!(at_grant_due(&low, 1, &[], &due_for(&low)), AtGrant::Yield);
        assert_eq!(
            at_grant_due(&normal, 1, &[], &due_for(&normal)),
            AtGrant::Yield
        );
        assert!(!may_yield(&high));
        assert_eq!(at_grant_due(&high, 1, &[], &[]), AtGrant::Take);
        // Two grants: normal takes (only high is better), low yields.
        assert_eq!(
            at_grant_due(&normal, 2, &[], &due_for(&normal)),
            AtGrant::Take
        );
        assert_eq!(at_grant_due(&low, 2, &[], &due_for(&low)), AtGrant::Yield);
        // A better push both listed and due counts once.
        assert_eq!(
            at_grant_due(&low, 2, std::slice::from_ref(&normal), &due_for(&low)),
            AtGrant::Yield
        );
        assert_eq!(
            at_grant_due(&low, 3, std::slice::from_ref(&normal), &due_for(&low)),
            AtGrant::Take,
            "three grants for three pushes"
        );
        // No grant: it waits as before (nothing to yield).
        assert_eq!(
            at_grant_due(&low, 0, &[], &due_for(&low)),
            AtGrant::Wait { wake: None }
        );
        // A full list leaves no room to yield into: it takes.
        let full: Vec<String> = (0..MAX_WAITING as u64)
            .map(|i| m(Priority::Low, 100 + i))
            .collect();
        assert_eq!(
            at_grant_due(
                &m(Priority::Low, 0),
                1,
                &full,
                std::slice::from_ref(&normal)
            ),
            AtGrant::Take
        );
    }

    #[test]
    fn only_pushes_that_would_take_a_grant_now_contend() {
        let now = crate::domain::at("2026-12-06T12:00:00Z");
        let prefs = Preferences::from_json(&serde_json::json!({
            "quiet_hours": {"start": "11:00", "end": "13:00", "timezone": "UTC"},
            "muted_types": ["promo"]
        }))
        .expect("prefs");
        let due = |priority, created, kind: &str, send_by: Option<&str>| DueTogether {
            member: m(priority, created),
            note_type: Some(kind.to_string()),
            send_by: send_by.map(crate::domain::at),
        };
        let all = [
            due(Priority::High, 1, "order", None),
            due(Priority::High, 2, "promo", None),
            due(Priority::High, 3, "order", Some("2026-12-06T11:59:00Z")),
            due(Priority::Normal, 4, "order", None),
            due(Priority::High, 5, "order", Some("2026-12-06T12:30:00Z")),
        ];
        // Muted, expired, and a normal one in quiet hours do not contend.
        assert_eq!(
            contenders(&all, &prefs, now),
            vec![m(Priority::High, 1), m(Priority::High, 5)]
        );
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
