//! The grant a claim reserves: picked from the quota item's list of open grants, or,
//! when the list falls short of the counters, from the ledger, whose read also
//! repairs the list.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::dispatch::cap::Counted;
use crate::domain::grants::open::{
    GrantPick, OpenGrantIds, PickFrom, SetFix, pick, pick_from_ledger,
};
use crate::domain::settle::DeliveryState;
use crate::domain::{GrantState, QuotaCounters, RequestId, TemplateId};
use crate::store::dispatch::delivery::DeliveryItem;
use crate::store::dispatch::due::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{Change, change, put, update};
use crate::store::items::expr::{Cmp, absent, all, contains, eq, size};
use crate::store::items::grant::grant_in;
use crate::store::items::quota::{
    INFLIGHT, OPEN_AVAILABLE, OPEN_RESERVED, OpenGrants, WAITING, has_grant, sent_on,
    under_daily_cap, unrefused,
};
use crate::store::items::{is_new, key, n, rfc3339, s, to_item};
use crate::store::keys::{delivery_sk, grant_sk, lease_pk, quota_sk};
use crate::store::open_grants::REPAIR_CHUNK;
use crate::store::tx::{TxOutcome, Write};

impl Store {
    /// The claim's shared writes: one grant `available → reserved` naming the delivery,
    /// the counters, and the delivery itself, `sending` on the lease index.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reservation(
        &self,
        item: &DueItem,
        template: &TemplateId,
        grant: &Reserve,
        delivery_id: &str,
        claimer: &str,
        attempts: u32,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Reservation, StoreError> {
        let delivery = DeliveryItem {
            pk: item.pk.clone(),
            sk: delivery_sk(delivery_id),
            kind: "delivery".into(),
            delivery_id: delivery_id.to_string(),
            state: DeliveryState::Sending,
            source: item.sk.clone(),
            template_id: template.to_string(),
            grant_sk: grant.sk.clone(),
            claimer: claimer.to_string(),
            lease_pk: Some(lease_pk(delivery_id, self.shards)),
            lease_until: Some(lease_until.timestamp_millis()),
            due_at: item.due_at.timestamp_millis(),
            claimed_at: rfc3339(now),
            attempts,
            class: None,
            outcome: None,
            errcode: None,
            msgid: None,
            swept_at: None,
            sweep_outcome: None,
            answered_late_at: None,
            released_at: None,
            kept_answer: None,
            void_others: false,
            counted_on: grant.counted.as_ref().map(|c| c.day),
        };
        let reserve = update(
            &self.table,
            key(&item.pk, &grant.sk),
            change()
                .set("state", s(GrantState::Reserved.as_str()))
                .set("delivery_id", s(delivery_id))
                .set("updated_at", s(rfc3339(now)))
                .plus("version", 1),
        )
        .when(grant_in(GrantState::Available))
        .part()?;
        // The grant moves from the quota item's available set to its reserved set.
        let id = || AttributeValue::Ss(vec![grant.request.to_string()]);
        // The send is in flight until it settles: a sent event meanwhile waits for it.
        let flight = crate::domain::reconcile::Mark::new(now, delivery_id).encode();
        let mut counters = change()
            .set("updated_at", s(rfc3339(now)))
            .add("available", n(-1))
            .add("reserved", n(1))
            .add(OPEN_RESERVED, id())
            .add(INFLIGHT, AttributeValue::Ss(vec![flight]))
            .delete(OPEN_AVAILABLE, id());
        // The grant is there (and listed, when found through the list). Under a daily
        // cap the send counts on the user's day, on the condition that the day's count
        // is still under the cap: racing claims never pass it.
        let mut rule = vec![has_grant()];
        if grant.listed {
            rule.push(contains(OPEN_AVAILABLE, s(grant.request.as_str())));
        }
        if let Some(counted) = &grant.counted {
            counters = counters.add(sent_on(counted.day), n(1));
            rule.push(under_daily_cap(counted.day, counted.cap));
            for day in &counted.stale {
                counters = counters.remove(sent_on(*day));
            }
        }
        // The counters as read, when the claim decided on them.
        if let Some(read) = grant.as_read {
            rule.push(eq("available", n(read.available)));
            // (An empty set is no attribute in DynamoDB.)
            rule.push(if read.waiting == 0 {
                absent(WAITING)
            } else {
                size(
                    WAITING,
                    Cmp::Eq,
                    i64::try_from(read.waiting).unwrap_or(i64::MAX),
                )
            });
        }
        if grant.unrefused {
            rule.push(unrefused());
        }
        let counters = update(
            &self.table,
            key(&item.pk, &quota_sk(template)),
            drop_marks(counters, &grant.stale),
        )
        .when(all(rule))
        .write()?;
        Ok(Reservation {
            grant: reserve,
            counters,
            delivery: put(&self.table, to_item("delivery", &delivery)?)
                .when(is_new())
                .write()?,
        })
    }

    /// A grant to reserve, as [`pick`] decides: one the quota item lists as
    /// available — or, when its lists do not account for every available grant
    /// (grants recorded before the lists existed), the first from the ledger, whose
    /// read also repairs the lists ([`pick_from_ledger`]). Either way a claim reads a
    /// bounded number of items once the ledger's old grants are settled.
    pub(crate) async fn pick_grant(
        &self,
        pk: &str,
        template: &TemplateId,
        counters: &QuotaCounters,
        open: &OpenGrants,
        ledger_only: bool,
    ) -> Result<Option<Reserve>, StoreError> {
        let reserve = |pick: GrantPick| Reserve {
            sk: grant_sk(template, &pick.request),
            request: pick.request,
            listed: pick.listed,
            stale: Default::default(),
            counted: None,
            unrefused: false,
            as_read: None,
        };
        match pick(counters, &open.ids, ledger_only) {
            PickFrom::Nothing => return Ok(None),
            PickFrom::List(grant) => return Ok(Some(reserve(grant))),
            PickFrom::Ledger => {}
        }
        // Read the open grants from the ledger (once: the repair below makes the next
        // claims read the lists again).
        let open_states = [GrantState::Available, GrantState::Reserved];
        let mut ledger = OpenGrantIds::default();
        for grant in self.grants_in(pk, template, &open_states).await? {
            match grant.state {
                Some(GrantState::Available) => ledger.available.push(grant.request_id),
                Some(GrantState::Reserved) => ledger.reserved.push(grant.request_id),
                _ => {}
            }
        }
        let (grant, fixes) = pick_from_ledger(counters, &open.ids, &ledger);
        match fixes {
            Some(fixes) => self.repair_open_sets(pk, template, fixes).await,
            // A write between the reads (it will have changed the lists too), or a
            // ledger that disagrees with its counters: no repair this time.
            None => tracing::warn!(
                available = ledger.available.len(),
                reserved = ledger.reserved.len(),
                "the ledger's open grants and the counters differ; the sets are not repaired"
            ),
        }
        Ok(grant.map(reserve))
    }

    /// Brings the quota item's open-grant sets to the ledger's, as read: a member the
    /// ledger does not have in that state is deleted, one it has is added, each in the
    /// same transaction as a check that its grant is (or, for a deletion, is not) in
    /// that state. Every write that moves a grant moves its request id between the
    /// sets too, so a member checked in stays right whatever comes after, and sets
    /// that account for the counters are then the ledger's; no check of the counters is
    /// needed, so the work goes in transactions of up to [`REPAIR_CHUNK`] grants,
    /// however many the user holds. (Wrong members left by data from before that held
    /// are what the deletions are for; those a claim meets are cleaned up here.) A
    /// transaction that does not commit (a grant moved since the read) ends the
    /// repair; the next fallback goes on. Failures are logged: the claim goes on
    /// without.
    pub(crate) async fn repair_open_sets(
        &self,
        pk: &str,
        template: &TemplateId,
        fixes: Vec<SetFix>,
    ) {
        // A container frozen here holds a ledger read that others may outdate.
        crate::failpoint::hit("before_repair");
        let total = fixes.len();
        if total == 0 {
            return;
        }
        // One set and one direction per transaction: one update cannot both add to and
        // delete from an attribute, and an id wrongly in both sets must not be checked
        // twice in one transaction (DynamoDB refuses two actions on one item).
        let mut groups: BTreeMap<(bool, &'static str), Vec<SetFix>> = BTreeMap::new();
        for fix in fixes {
            groups
                .entry((fix.add, fix.state.as_str()))
                .or_default()
                .push(fix);
        }
        for chunk in groups.values().flat_map(|group| group.chunks(REPAIR_CHUNK)) {
            let outcome = match self.set_fix_writes(pk, template, chunk) {
                Ok(writes) => self.transact(writes).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(TxOutcome::Committed) => {}
                Ok(TxOutcome::Cancelled(_)) => {
                    tracing::warn!(
                        "a grant moved while its set was repaired; the next claim goes on"
                    );
                    return;
                }
                Ok(TxOutcome::Contended) => {
                    tracing::warn!(
                        "the open-grant sets' repair was contended; the next claim goes on"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(
                        error = %crate::telemetry::error_chain(&e),
                        "the open-grant sets were not repaired this time"
                    );
                    return;
                }
            }
        }
        tracing::warn!(
            fixes = total,
            "the quota item's open-grant sets were repaired from the ledger"
        );
    }
}

/// The grant a claim reserves.
/// A claim's writes beside its claimed item: the grant reserved, the template's
/// counters (and the day's count), the delivery created.
pub(crate) struct Reservation {
    pub(crate) grant: Write,
    pub(crate) counters: TransactWriteItem,
    pub(crate) delivery: TransactWriteItem,
}

pub(crate) struct Reserve {
    pub(crate) sk: String,
    pub(crate) request: RequestId,
    /// Listed in the quota item's set of available grants (else an older grant).
    pub(crate) listed: bool,
    /// Marks on the quota item that no event can match any more, by attribute: the
    /// reservation drops them, as it writes the quota item anyway.
    pub(crate) stale: Vec<(&'static str, Vec<String>)>,
    /// Under a daily cap: the day the send counts on (under the cap, as a condition)
    /// and the old days' counts to drop.
    pub(crate) counted: Option<Counted>,
    /// A push's claim: on the condition that the user's settings do not keep the
    /// template refused (a standing choice landing after the claim's read wins).
    pub(crate) unrefused: bool,
    /// A claim decided on counters read well before it (read ahead of the instant): on
    /// the condition that the grants available and the number of pushes waiting are
    /// still as read, since who takes the grant, whether it is the last and whether
    /// others wait were decided on them.
    pub(crate) as_read: Option<AsRead>,
}

/// The counters a claim read ahead decided on ([`Reserve::as_read`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AsRead {
    pub(crate) available: u64,
    pub(crate) waiting: usize,
}

/// Adds to a quota update the removal of stale marks, by attribute: of those the
/// update does not change already (DynamoDB refuses two clauses on one attribute; a
/// later write drops them).
pub(crate) fn drop_marks(change: Change, stale: &[(&'static str, Vec<String>)]) -> Change {
    let mut change = change;
    for (name, members) in stale {
        if members.is_empty() || change.touches(name) {
            continue;
        }
        change = change.delete(*name, AttributeValue::Ss(members.clone()));
    }
    change
}
