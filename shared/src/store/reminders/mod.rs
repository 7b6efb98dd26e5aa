//! Reminder plans: settings, check-ins, the effects of grant reports, and the due index.
//!
//! A plan item (`PLAN#<kind>`) carries its state, version and settings; while
//! `scheduled` it also carries `due_pk`/`due_at`, which put it on the sparse due index,
//! and while `sending` its claim's `lease_pk`/`lease_until`, which put it on the lease
//! index (so a sweep finds a plan its settled delivery left behind). Every write is a
//! whole-item Put conditional on the version it was read at, so index entries are
//! added and removed in the same write that changes the state.
//!
//! A check-in is one read (plan, quota, action record, the carried grant's ledger item)
//! and one transaction: the action record (with the answer, kept 35 days), the plan,
//! and — when the check-in carries a new grant — the ledger item and counters, exactly
//! as a grant report writes them. Replays are answered from the action record.

mod check_in;
mod settings;

use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::{OpenId, QuotaCounters};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::plan::PlanItem;
use crate::store::keys::user_pk;

/// A plan and its template's available grants, as read together.
#[derive(Debug, Clone)]
pub struct PlanSnapshot {
    pub plan: Plan,
    pub counters: QuotaCounters,
}

/// The outcome of a check-in.
#[derive(Debug, Clone)]
pub enum CheckInOutcome {
    /// Newly applied; the answer (also stored for replays).
    Applied(serde_json::Value),
    /// The action was applied before; the first answer.
    Replayed(serde_json::Value),
}

impl Store {
    /// A user's plan for `kind` (the defaults, disabled, if never stored) and the
    /// counters of its template: one round trip.
    pub async fn plan(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
    ) -> Result<PlanSnapshot, StoreError> {
        let read = self.read(&user_pk(openid), kind, None).await?;
        let plan = PlanItem::or_new(read.plan, kind)?;
        Ok(PlanSnapshot {
            plan,
            counters: read.counters,
        })
    }
}
