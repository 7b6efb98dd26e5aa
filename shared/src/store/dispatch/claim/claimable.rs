//! A due item as read for its claim: a plan or a push, with the quota item's counters
//! and open grants (and the user's preferences) it is decided on.

use crate::domain::dispatch::claim::Unsent;
use crate::store::dispatch::claimed::{Claim, ClaimSource};
use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};

use crate::domain::dispatch::cap::day_zone;
use crate::domain::dispatch::claim::{ClaimFacts, PushFacts};
use crate::domain::dispatch::priority::member;
use crate::domain::inbox::cancel::Requested;
use crate::domain::inbox::preferences::Preferences;
use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::reminders::schedule::Timezone;
use crate::domain::{QuotaCounters, TemplateId};
use crate::store::error::StoreError;
use crate::store::items::outbox::OutboxItem;
use crate::store::items::quota::OpenGrants;

/// A due entry's item, as found.
pub(super) enum Found {
    Due(Box<Claimable>),
    /// Moved on (claimed, changed, gone): nothing to do.
    Gone,
    Unreadable(String),
    /// A plan of a reminder kind this deployment does not configure: its name.
    NoKind(String),
}

/// A due item as read for its claim.
pub(super) enum Claimable {
    Plan {
        kind: ReminderKind,
        plan: Plan,
        counters: QuotaCounters,
        open: OpenGrants,
        /// The user's preferences, read under a daily cap (they name the user's day).
        prefs: Option<Preferences>,
    },
    Outbox {
        outbox: OutboxItem,
        counters: QuotaCounters,
        open: OpenGrants,
        prefs: Preferences,
        /// A cancel or a replacement came while an earlier attempt was in flight.
        requested: Option<Requested>,
        /// A push not yet written: the writes that publish its notification, to commit
        /// with the claim.
        publication: Option<Vec<TransactWriteItem>>,
        /// Its counters were read ahead of the instant (`Store::read_ahead`).
        ahead: bool,
    },
}

impl Claimable {
    pub(super) fn template(&self) -> Result<TemplateId, StoreError> {
        match self {
            Self::Plan { kind, .. } => Ok(kind.template_id.clone()),
            Self::Outbox { outbox, .. } => TemplateId::parse(outbox.template_id.clone())
                .map_err(|_| StoreError::Corrupt(format!("outbox {}: template id", outbox.sk))),
        }
    }

    /// The zone of the user's day, for the daily cap.
    pub(super) fn day_zone(&self) -> Timezone {
        match self {
            Self::Plan { prefs, .. } => day_zone(
                prefs
                    .as_ref()
                    .and_then(|p| p.quiet_hours.map(|q| q.timezone)),
            ),
            Self::Outbox { prefs, .. } => day_zone(prefs.quiet_hours.map(|q| q.timezone)),
        }
    }

    /// Whether it is a push listed on its template's waiting list as read.
    pub(super) fn listed(&self) -> bool {
        let (_, open) = self.grants();
        self.waiting_member()
            .is_some_and(|own| open.waiting.contains(&own))
    }

    /// A push's member of its template's waiting list (a plan has none: it pauses
    /// `needs_grant` instead).
    pub(super) fn waiting_member(&self) -> Option<String> {
        match self {
            Self::Plan { .. } => None,
            Self::Outbox { outbox, .. } => {
                Some(member(outbox.priority.unwrap_or_default(), &outbox.note_id))
            }
        }
    }

    /// What its claim is decided on, under a daily cap of `per_day`, at `now`.
    pub(super) fn facts(&self, per_day: Option<u32>, now: DateTime<Utc>) -> ClaimFacts<'_> {
        let (counters, open) = self.grants();
        let push = match self {
            Self::Plan { .. } => None,
            Self::Outbox {
                outbox,
                prefs,
                requested,
                ..
            } => Some(PushFacts {
                requested: *requested,
                send_by: outbox.send_by,
                note_type: outbox.note_type.as_deref(),
                priority: outbox.priority.unwrap_or_default(),
                note_id: &outbox.note_id,
                prefs,
            }),
        };
        ClaimFacts {
            push,
            standing: open.standing,
            per_day,
            sent: &open.sent_days,
            zone: self.day_zone(),
            available: counters.available,
            waiting: &open.waiting,
            now,
        }
    }

    /// The template's counters and open grants, as read with the item.
    pub(super) fn grants(&self) -> (&QuotaCounters, &OpenGrants) {
        match self {
            Self::Plan { counters, open, .. } | Self::Outbox { counters, open, .. } => {
                (counters, open)
            }
        }
    }
}

/// How a claim attempt ended.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claim>),
    /// Someone else claimed it first, or it changed since the index was read.
    Lost,
    /// Not sent now, and why (`domain::dispatch::claim::decide`), written down:
    /// nothing sent or spent. Of `template`'s grants.
    Unsent {
        why: Unsent,
        template: TemplateId,
    },
    /// A publication (`Store::claim_published`) whose scheduled notification changed
    /// since it was read, or whose push is not to go now (muted, held, no grant):
    /// nothing was written; publish it the ordinary way (`Store::publish`), then
    /// claim its push.
    Republish,
    /// The item itself cannot be read: it can never be claimed as it is. Say why.
    Unreadable(String),
    /// A plan of a reminder kind this deployment does not configure (removed, or a
    /// rollback), named: its entry is moved out of the way
    /// ([`Store::park_due`](crate::store::handle::Store::park_due)), for when the kind is back.
    NoKind(String),
}

/// A claimed item's write, what the dispatcher keeps of it, its attempts so far and,
/// for a push not yet written, its publication's writes.
pub(super) type Sourced = (
    TransactWriteItem,
    ClaimSource,
    u32,
    Option<Vec<TransactWriteItem>>,
);
