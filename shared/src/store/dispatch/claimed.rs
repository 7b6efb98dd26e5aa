//! What a dispatcher holds between claim and finalize: the claimed plan or push and
//! the delivery its send settles.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::{OpenId, TemplateId};
use crate::store::items::outbox::OutboxItem;

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
    pub(in crate::store::dispatch) claimed_at: DateTime<Utc>,
    pub source: ClaimSource,
    pub(in crate::store::dispatch) grant_sk: String,
    /// Under a daily cap, the user's day the send counted on.
    pub(in crate::store::dispatch) counted_on: Option<chrono::NaiveDate>,
}

impl Claim {
    /// When it was claimed.
    pub fn claimed_at(&self) -> DateTime<Utc> {
        self.claimed_at
    }
}

/// What was claimed: a reminder plan or a notification's push.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per claim, moved rarely: a push's outbox item is most of it, and a box \
              would only add an allocation to every claim"
)]
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
    pub(in crate::store::dispatch) item: OutboxItem,
}
