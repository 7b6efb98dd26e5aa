//! Deliveries: the dispatcher's writes, split by step (docs/design.md §2 I1, I4–I6, §5).
//!
//! - [`due`]: the due index, every shard queried in parallel.
//! - [`claim`]: one transaction takes a due plan or push (`scheduled`/`pending` →
//!   `sending`, off the due index, onto the lease index), reserves one grant naming
//!   the delivery, moves the counters and writes the delivery `sending` with a lease
//!   covering the send and the finalize. The dispatcher claims only once the user's
//!   per-openid turn and an access token are in hand, so a delivery is `sending` only
//!   while its POST can actually be in flight.
//! - [`finalize`]: one transaction, conditional on the delivery still being this
//!   claimer's, writes what [`settle`](crate::domain::dispatch::settle) decided for the
//!   delivery, the grant (fenced: only the delivery that reserved it moves it) and the
//!   claimed item. If the item moved on meanwhile (a check-in, a refusal), the item is
//!   re-read and advanced on its own; should that second write be lost (a crash), the
//!   plan is still on the lease index and the next sweep advances it. If a sweep got
//!   there first, a definite answer still wins: see [`finalize`] ("late answers"). A
//!   claim with no time left to send is released the same way, unsent.
//! - [`sweep`]: deliveries and plans past their lease. A live delivery becomes
//!   `unknown` (grant void, plan paused `uncertain`; never resent, I4); a plan still
//!   `sending` whose delivery is already terminal is advanced by that delivery's
//!   outcome (I5). A delivery whose finalize kept WeChat's answer is settled by it
//!   instead ([`kept`]). One page per shard per tick; an entry that cannot be read is
//!   logged, counted and taken off the index (quarantined); one whose handling fails
//!   is moved behind the others and quarantined at its third failure, so no entry
//!   holds up its shard.
//! - [`kept`]: what a finalize leaves for the sweep when it cannot finish: WeChat's
//!   answer kept on the delivery, and a 43101's voiding still to do.
//! - [`sent_event`]: WeChat's sent event settling the one `unknown` send it can be
//!   (marks on the quota item: unknown sends, and sent msgids whose event is due).
//! - [`priority`]: pushes waiting for a grant of their template, best first, and
//!   the wake a grant brings.
//! - [`shards`]: which partitions to query when `DUE_SHARDS` has changed.
//! - this module: the types shared by the steps and the one settle transaction.

pub mod claim;
mod delivery;
pub mod due;
pub mod finalize;
pub mod kept;
mod lease;
mod priority;
mod reserve;
pub mod sent_event;
mod settle;
pub mod shards;
pub mod sweep;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use delivery::{DeliveryItem, PlanRead, describe};
use lease::Index;
pub use lease::{SWEEP_FAILURE_LIMIT, SWEEP_RETRY_AFTER};
use settle::{DeliveryWrite, GrantMove, SettleTx, Settled};

use crate::domain::dispatch::delivery::{Guard, Marks, Writer};

use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::{OpenId, TemplateId};
use crate::store::items::grant::grant_state_name;
use crate::store::items::outbox::OutboxItem;

pub use claim::{ClaimOutcome, ReadAhead};
pub use due::{DueCursor, DueItem, DuePage};
pub use finalize::Finalized;
pub use sent_event::SentEventOutcome;
pub use shards::ShardSpan;
pub use sweep::SweepSummary;

/// What a dispatcher holds between claim and finalize.
#[derive(Debug, Clone)]
pub struct Claim {
    pub delivery_id: String,
    pub claimer: String,
    pub openid: OpenId,
    pub template_id: TemplateId,
    pub due_at: DateTime<Utc>,
    /// The claim's lease: the delivery is this claimer's until then.
    pub lease_until: DateTime<Utc>,
    /// When it was claimed (the delivery's `claimed_at`).
    claimed_at: DateTime<Utc>,
    pub source: ClaimSource,
    grant_sk: String,
    /// Under a daily cap, the user's day the send counted on.
    counted_on: Option<chrono::NaiveDate>,
}

impl Claim {
    /// When it was claimed.
    pub fn claimed_at(&self) -> DateTime<Utc> {
        self.claimed_at
    }
}

/// What was claimed: a reminder plan or a notification's push.
#[derive(Debug, Clone)]
pub enum ClaimSource {
    /// The kind and the plan as the claim wrote it (`sending`, at its new version).
    Plan {
        kind: ReminderKind,
        plan: Plan,
    },
    Outbox(OutboxClaim),
}

/// A claimed push: the message to send (data already fitted at ingest).
#[derive(Debug, Clone)]
pub struct OutboxClaim {
    pub note_id: String,
    pub data: BTreeMap<String, String>,
    pub page: Option<String>,
    item: OutboxItem,
}
