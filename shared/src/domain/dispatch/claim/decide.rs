//! The claim's gate order in one place: what a due plan or push read for its claim
//! comes to — sent (with the grant it takes and the day it counts on) or [`Unsent`]
//! and why. Pure: the store reads the facts, [`decide`] decides, the store commits.
//!
//! The order: for a push, a cancel (then a replacement) recorded while an earlier
//! attempt was in flight, its `expires_at`, a refusal in the user's settings, a mute,
//! quiet hours (a `high` push passes them); for a plan, a refusal. Then the daily cap
//! (before the grant: none is spent), then the grant — where a push yields to better
//! pushes waiting for the grants there are, or due together with it.

use chrono::{DateTime, Utc};

use super::unsent::Unsent;
use crate::domain::consent::standing::Standing;
use crate::domain::dispatch::cap::{AtCap, Counted, SentDays, at_cap};
use crate::domain::dispatch::priority::{
    AtGrant, DueTogether, at_grant, at_grant_due, contenders, may_yield, member,
};
use crate::domain::inbox::cancel::Requested;
use crate::domain::inbox::preferences::{Gate, Preferences, gate};
use crate::domain::inbox::schedule::is_expired;
use crate::domain::reminders::schedule::Timezone;
use crate::domain::template::Priority;

/// What a claim is decided on, as read.
#[derive(Debug, Clone)]
pub struct ClaimFacts<'a> {
    /// A push's own facts; None for a plan.
    pub push: Option<PushFacts<'a>>,
    /// The standing choice the user's settings hold for the template.
    pub standing: Option<Standing>,
    /// The daily cap (`PUSHES_PER_DAY`; None: none).
    pub per_day: Option<u32>,
    /// The sends counted per day on the template's quota item.
    pub sent: &'a SentDays,
    /// The zone of the user's day.
    pub zone: Timezone,
    /// The template's grants available.
    pub available: u64,
    /// The members of the pushes listed as waiting for the template's grants.
    pub waiting: &'a [String],
    pub now: DateTime<Utc>,
}

/// A push's facts for its claim.
#[derive(Debug, Clone)]
pub struct PushFacts<'a> {
    /// A cancel or a replacement recorded while an earlier attempt was in flight.
    pub requested: Option<Requested>,
    /// Its `expires_at`, epoch ms as stored.
    pub send_by: Option<i64>,
    /// Its notification's type (None: stored before types were kept, never muted).
    pub note_type: Option<&'a str>,
    pub priority: Priority,
    pub note_id: &'a str,
    pub prefs: &'a Preferences,
}

impl PushFacts<'_> {
    /// Its member of the template's waiting list.
    pub fn member(&self) -> String {
        member(self.priority, self.note_id)
    }
}

/// What a claim does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Claim it with a grant of the template, counting the send as `counted` says
    /// (None: no cap). A claim that then finds no grant to pick ends
    /// [`Unsent::none_picked`].
    Take(Option<Counted>),
    /// Not now, and why.
    Unsent(Unsent),
}

/// The first look at a claim: decided, or a push that would take a grant and may yet
/// yield to better pushes due together with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decide {
    Now(ClaimDecision),
    /// Read the user's pushes of the template of a better class than `own` due within
    /// [`YIELD_WAIT`](crate::domain::dispatch::priority::YIELD_WAIT) (the `pending`
    /// index), and decide with them ([`Yielding::decide`]).
    ReadDueTogether(Yielding),
}

/// A push that takes a grant unless better pushes due together are as many as the
/// grants there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Yielding {
    /// Its member of the template's waiting list.
    pub own: String,
    counted: Option<Counted>,
}

impl Yielding {
    /// The decision, with `due` the better pushes due together as read.
    pub fn decide(self, facts: &ClaimFacts, due: &[DueTogether]) -> ClaimDecision {
        let due = match &facts.push {
            Some(push) => contenders(due, push.prefs, facts.now),
            None => Vec::new(),
        };
        let at = at_grant_due(&self.own, facts.available, facts.waiting, &due);
        by_grant(at, self.counted)
    }
}

impl Unsent {
    /// The claim of a push (`push`) or plan that would take a grant and found none
    /// to pick (the counters showed one the lists and the ledger did not): a push
    /// waits for one, a plan pauses `needs_grant`.
    pub fn none_picked(push: bool) -> Self {
        if push {
            Self::WaitGrant {
                wake: None,
                yielded: false,
            }
        } else {
            Self::NoGrant { wake: None }
        }
    }
}

/// Decides a claim (see the module docs).
pub fn decide(facts: &ClaimFacts) -> Decide {
    let now = facts.now;
    let unsent = |why| Decide::Now(ClaimDecision::Unsent(why));
    match &facts.push {
        Some(push) => {
            let gate = gate(push.prefs, push.note_type, push.priority, now);
            if let Some(why) = at_claim(push.requested, push.send_by, facts.standing, gate, now) {
                return unsent(why);
            }
        }
        // A plan whose template the user's settings refuse (a choice made while its
        // kind was not configured) is paused for it, while the refusal stands.
        None if facts.standing.is_some_and(Standing::refuses) => {
            return unsent(Unsent::TurnedOff);
        }
        None => {}
    }
    let send_by = facts
        .push
        .as_ref()
        .and_then(|push| push.send_by)
        .and_then(DateTime::from_timestamp_millis);
    let counted = match at_cap(facts.per_day, facts.sent, facts.zone, send_by, now) {
        AtCap::Go(counted) => counted,
        AtCap::Wait(until) => return unsent(Unsent::CapWait(until)),
        AtCap::Capped => return unsent(Unsent::Capped),
    };
    // A plan takes a grant if there is one (it pauses otherwise); a push takes one
    // unless a better push waits for the grants there are, or is due together with it
    // (read only when it would take one, and only for a class that can be beaten).
    let Some(push) = &facts.push else {
        return Decide::Now(ClaimDecision::Take(counted));
    };
    let own = push.member();
    match at_grant(&own, facts.available, facts.waiting) {
        AtGrant::Take if may_yield(&own) => Decide::ReadDueTogether(Yielding { own, counted }),
        at => Decide::Now(by_grant(at, counted)),
    }
}

/// What stops a push at its claim, in this order: a cancel (then a replacement)
/// recorded while an earlier attempt was in flight, its `expires_at` (epoch ms), the
/// standing choice of the user's settings for its template (a refusal always wins,
/// even over `high`), the user's preferences (`gate`). None: nothing does.
pub fn at_claim(
    requested: Option<Requested>,
    expires_at: Option<i64>,
    standing: Option<Standing>,
    gate: Gate,
    now: DateTime<Utc>,
) -> Option<Unsent> {
    Some(match requested {
        Some(Requested::Cancel) => Unsent::Cancelled,
        Some(Requested::Replace) => Unsent::Replaced,
        None if is_expired(expires_at, now) => Unsent::Expired,
        None if standing.is_some_and(Standing::refuses) => Unsent::TurnedOff,
        None => match gate {
            Gate::Go => return None,
            Gate::Muted => Unsent::Muted,
            Gate::Hold(until) => Unsent::Held(until),
        },
    })
}

/// The decision the grants make.
fn by_grant(at: AtGrant, counted: Option<Counted>) -> ClaimDecision {
    ClaimDecision::Unsent(match at {
        AtGrant::Take => return ClaimDecision::Take(counted),
        AtGrant::Yield => Unsent::WaitGrant {
            wake: None,
            yielded: true,
        },
        AtGrant::Wait { wake } => Unsent::WaitGrant {
            wake,
            yielded: false,
        },
        AtGrant::Skip { wake } => Unsent::NoGrant { wake },
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
