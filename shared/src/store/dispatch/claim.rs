//! Claiming a due item: a plan or a push, behind one [`Claimable`].

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Put, TransactWriteItem, Update};
use chrono::{DateTime, Duration, Utc};

use crate::domain::inbox::{PushReason, PushStatus};
use crate::domain::outcome::{DeliveryState, OutboxState};
use crate::domain::plan::{Plan, PlanEvent, PlanStatus};
use crate::domain::reminder::{ReminderKind, ReminderKinds};
use crate::domain::{GrantState, QuotaCounters, RequestId, TemplateId};
use crate::store::items::grant::GrantItem;
use crate::store::items::outbox::{OutboxItem, note_push_update, versioned_put};
use crate::store::items::quota::{INFLIGHT, OPEN_AVAILABLE, OPEN_RESERVED, OpenGrants};
use crate::store::items::{key, n, parse, rfc3339, s, to_item};
use crate::store::keys::{SortKey, delivery_sk, grant_sk, lease_pk, quota_sk, sort_key};
use crate::store::open_grants::{REPAIR_CHUNK, SetFix};
use crate::store::tx::{TxOutcome, is_condition_failed};
use crate::store::{Attempt, Store, StoreError, classify_sdk_error, retry_contended};

use crate::store::dispatch::{
    Claim, ClaimSource, DeliveryItem, DueItem, OutboxClaim, PlanRead, grant_state_name,
};

/// How a claim attempt ended.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claim>),
    /// Someone else claimed it first, or it changed since the index was read.
    Lost,
    /// No grant to reserve: the plan was paused `needs_grant` / the push skipped.
    NoGrant,
    /// The item itself cannot be read (or belongs to no configured kind): it can never
    /// be claimed as it is. Say why.
    Unreadable(String),
}

/// A due entry's item, as found.
enum Found {
    Due(Box<Claimable>),
    /// Moved on (claimed, changed, gone): nothing to do.
    Gone,
    Unreadable(String),
}

/// The grant a claim reserves.
struct Reserve {
    sk: String,
    request: RequestId,
    /// Listed in the quota item's set of available grants (else an older grant).
    listed: bool,
    /// Marks on the quota item that no event can match any more, by attribute: the
    /// reservation drops them, as it writes the quota item anyway.
    stale: Vec<(&'static str, Vec<String>)>,
}

/// A template's open grants as its ledger has them: (sort key, request id) each.
#[derive(Default)]
struct LedgerOpen {
    available: Vec<(String, RequestId)>,
    reserved: Vec<(String, RequestId)>,
}

/// A due item as read for its claim.
enum Claimable {
    Plan {
        kind: ReminderKind,
        plan: Plan,
        counters: QuotaCounters,
        open: OpenGrants,
    },
    Outbox {
        outbox: OutboxItem,
        counters: QuotaCounters,
        open: OpenGrants,
    },
}

impl Claimable {
    fn template(&self) -> Result<TemplateId, StoreError> {
        match self {
            Self::Plan { kind, .. } => Ok(kind.template_id.clone()),
            Self::Outbox { outbox, .. } => TemplateId::parse(outbox.template_id.clone())
                .map_err(|_| StoreError::Corrupt(format!("outbox {}: template id", outbox.sk))),
        }
    }

    /// The template's counters and open grants, as read with the item.
    fn grants(&self) -> (&QuotaCounters, &OpenGrants) {
        match self {
            Self::Plan { counters, open, .. } | Self::Outbox { counters, open, .. } => {
                (counters, open)
            }
        }
    }
}

impl Store {
    /// Claims a due item (see the module docs): `claimer` names this dispatcher run,
    /// `lease` how long the delivery is its own — long enough for the send and the
    /// finalize.
    pub async fn claim(
        &self,
        item: &DueItem,
        kinds: &ReminderKinds,
        claimer: &str,
        lease: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<ClaimOutcome, StoreError> {
        let Some(openid) = item.openid() else {
            return Ok(ClaimOutcome::Unreadable(
                "due item outside a user partition".into(),
            ));
        };
        // Contended past the retry limit, the item is left for the next tick (the
        // dispatcher logs and counts it).
        let openid = &openid;
        // Set when the quota item listed a grant that was not available after all: the
        // next tries pick from the ledger.
        let ledger_only = &std::sync::atomic::AtomicBool::new(false);
        retry_contended("claim", self.limits.write_budget, || async move {
            let claimable = match self.claimable(item, kinds).await? {
                Found::Due(claimable) => *claimable,
                Found::Gone => return Ok(Attempt::Done(ClaimOutcome::Lost)),
                Found::Unreadable(why) => return Ok(Attempt::Done(ClaimOutcome::Unreadable(why))),
            };
            let template = claimable.template()?;
            let (counters, open) = claimable.grants();
            let grant = self
                .pick_grant(
                    &item.pk,
                    &template,
                    counters,
                    open,
                    ledger_only.load(std::sync::atomic::Ordering::Relaxed),
                )
                .await?;
            let Some(mut grant) = grant else {
                let mut writes = self.no_grant_writes(item, &claimable, now)?;
                writes.push(self.still_no_grant(&item.pk, &template)?);
                return Ok(match self.transact(writes.clone()).await? {
                    TxOutcome::Committed => Attempt::Done(ClaimOutcome::NoGrant),
                    TxOutcome::Cancelled(reasons) => {
                        // Only the notification gone (its retention removed it): the
                        // push is skipped without it, never recreating it.
                        let failed: Vec<usize> = reasons
                            .iter()
                            .enumerate()
                            .filter(|(_, (code, _))| is_condition_failed(code))
                            .map(|(i, _)| i)
                            .collect();
                        let only_note = !failed.is_empty()
                            && failed.iter().all(|&i| {
                                writes
                                    .get(i)
                                    .is_some_and(crate::store::items::outbox::is_note_update)
                            });
                        if only_note {
                            writes.retain(|w| !crate::store::items::outbox::is_note_update(w));
                            if matches!(self.transact(writes).await?, TxOutcome::Committed) {
                                return Ok(Attempt::Done(ClaimOutcome::NoGrant));
                            }
                        }
                        // A grant arrived (or the item moved): read again.
                        Attempt::Retry
                    }
                    TxOutcome::Contended => Attempt::Retry,
                });
            };
            // (Not the in-flight set: the reservation adds to it, and one update cannot
            // both add to and delete from an attribute. Events prune it.)
            grant.stale = open
                .stale_marks(now)
                .into_iter()
                .filter(|(name, _)| *name != INFLIGHT)
                .collect();
            let delivery_id = uuid::Uuid::new_v4().simple().to_string();
            // The lease runs from this attempt, not from the first: a claim that had to
            // retry under contention still gets its whole send window.
            let lease_until =
                Utc::now().max(now) + Duration::from_std(lease).unwrap_or(Duration::seconds(60));
            let (source_write, source, attempts) =
                self.claimed_source(item, claimable, &delivery_id, lease_until, now)?;
            let mut writes = vec![source_write];
            writes.extend(self.reservation(
                item,
                &template,
                &grant,
                &delivery_id,
                claimer,
                attempts,
                lease_until,
                now,
            )?);
            let claim = Claim {
                delivery_id,
                claimer: claimer.to_string(),
                openid: openid.clone(),
                template_id: template,
                due_at: item.due_at,
                lease_until,
                claimed_at: now,
                source,
                grant_sk: grant.sk.clone(),
            };
            match self.transact(writes).await? {
                TxOutcome::Committed => {
                    return Ok(Attempt::Done(ClaimOutcome::Claimed(Box::new(claim))));
                }
                TxOutcome::Cancelled(reasons)
                    if reasons
                        .first()
                        .is_some_and(|(code, _)| is_condition_failed(code)) =>
                {
                    // The item moved on: another dispatcher claimed it, or the user acted.
                    return Ok(Attempt::Done(ClaimOutcome::Lost));
                }
                // The grant was taken (or the counters changed): pick again.
                TxOutcome::Cancelled(reasons) => {
                    let grant_refused = reasons
                        .get(1)
                        .is_some_and(|(code, _)| is_condition_failed(code));
                    let counters_agreed = reasons
                        .get(2)
                        .is_some_and(|(code, _)| !is_condition_failed(code));
                    if grant.listed && grant_refused && counters_agreed {
                        // Listed as available but not: the list is wrong for this one.
                        tracing::error!(
                            "a grant listed as available is not; claiming from the ledger"
                        );
                        ledger_only.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                TxOutcome::Contended => {
                    // It may have committed with its answer lost past every resend:
                    // its delivery, named by this attempt alone, exists only if so.
                    // (Read again instead, the plan would look claimed by another.)
                    if self
                        .get(&item.pk, &delivery_sk(&claim.delivery_id))
                        .await?
                        .is_some()
                    {
                        tracing::warn!("a claim whose answer was lost had committed");
                        return Ok(Attempt::Done(ClaimOutcome::Claimed(Box::new(claim))));
                    }
                }
            }
            Ok(Attempt::Retry)
        })
        .await
    }

    /// The item behind a due entry, if it is still due at that instant.
    async fn claimable(&self, item: &DueItem, kinds: &ReminderKinds) -> Result<Found, StoreError> {
        let named = sort_key(&item.sk);
        if let Some(kind) = match named {
            SortKey::Plan(kind) => kinds.get(kind),
            SortKey::Outbox(_) | SortKey::Delivery(_) | SortKey::Event | SortKey::Other => None,
        } {
            let (plan, counters, open) = match self.read_plan(&item.pk, kind).await? {
                PlanRead::Found(plan, counters, open) => (*plan, counters, open),
                PlanRead::Missing => return Ok(Found::Gone),
                PlanRead::Unreadable(why) => return Ok(Found::Unreadable(why)),
            };
            if plan.status != (PlanStatus::Scheduled { due: item.due_at }) {
                return Ok(Found::Gone);
            }
            return Ok(Found::Due(Box::new(Claimable::Plan {
                kind: kind.clone(),
                plan,
                counters,
                open,
            })));
        }
        if let SortKey::Outbox(_) = named {
            let Some(got) = self.get(&item.pk, &item.sk).await? else {
                return Ok(Found::Gone);
            };
            let outbox: OutboxItem = match parse("outbox", got) {
                Ok(outbox) => outbox,
                Err(e) => return Ok(Found::Unreadable(e.to_string())),
            };
            if outbox.state != OutboxState::Pending
                || outbox.due_at != Some(item.due_at.timestamp_millis())
            {
                return Ok(Found::Gone);
            }
            let Ok(template) = TemplateId::parse(outbox.template_id.clone()) else {
                return Ok(Found::Unreadable("a push with a bad template id".into()));
            };
            let (counters, open) = match self.get(&item.pk, &quota_sk(&template)).await? {
                Some(quota) => (
                    parse::<QuotaCounters>("quota", quota.clone())?,
                    OpenGrants::of(&quota),
                ),
                None => (QuotaCounters::default(), OpenGrants::default()),
            };
            return Ok(Found::Due(Box::new(Claimable::Outbox {
                outbox,
                counters,
                open,
            })));
        }
        // A kind missing from the configuration (removed, or a rollback) is not a bad
        // item: it stays due, logged, for when the kind is back.
        tracing::error!(sk = %item.sk, "due item of no configured kind left on the index");
        Ok(Found::Gone)
    }

    /// No grant when it came due: the plan pauses `needs_grant`; the push is skipped
    /// (the notification stays).
    fn no_grant_writes(
        &self,
        item: &DueItem,
        claimable: &Claimable,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        match claimable {
            Claimable::Plan { plan, .. } => {
                let mut paused = plan.clone();
                paused.status = plan
                    .status
                    .apply(PlanEvent::GrantMissing)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(vec![self.plan_put(&paused, &item.pk, now)?])
            }
            Claimable::Outbox { outbox, .. } => {
                let skipped = outbox.moved(
                    OutboxState::Skipped,
                    None,
                    self.shards,
                    now,
                    self.limits.retention.outbox,
                );
                Ok(vec![
                    versioned_put(&self.table, to_item("outbox", &skipped)?, outbox.version)?,
                    note_push_update(
                        &self.table,
                        &item.pk,
                        &outbox.note_id,
                        PushStatus::Skipped,
                        Some(PushReason::NoGrant),
                    )?,
                ])
            }
        }
    }

    /// A condition that the template still has no available grant: a grant report
    /// landing between the read and the write makes the pause (or skip) lose, and the
    /// item is claimed with that grant on the next try.
    fn still_no_grant(
        &self,
        pk: &str,
        template: &TemplateId,
    ) -> Result<TransactWriteItem, StoreError> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &quota_sk(template))))
            .condition_expression("attribute_not_exists(available) OR available <= :zero")
            .expression_attribute_values(":zero", n(0))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }

    /// The claimed item's write (`sending`, naming the delivery, on the lease index for
    /// a plan), what the dispatcher keeps of it, and its attempts so far.
    fn claimed_source(
        &self,
        item: &DueItem,
        claimable: Claimable,
        delivery_id: &str,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(TransactWriteItem, ClaimSource, u32), StoreError> {
        match claimable {
            Claimable::Plan { kind, plan, .. } => {
                let mut claimed = plan.clone();
                claimed.status = plan
                    .status
                    .apply(PlanEvent::Claimed)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                claimed.delivery_id = Some(delivery_id.to_string());
                claimed.lease_until = Some(lease_until);
                claimed.pending_refusal = None;
                claimed.checked_in_while_sending = false;
                claimed.accepted_while_sending = false;
                let write = self.plan_put(&claimed, &item.pk, now)?;
                claimed.version += 1;
                let attempts = claimed.attempts;
                Ok((
                    write,
                    ClaimSource::Plan {
                        kind,
                        plan: claimed,
                    },
                    attempts,
                ))
            }
            Claimable::Outbox { outbox, .. } => {
                let mut sending = outbox.moved(
                    OutboxState::Sending,
                    None,
                    self.shards,
                    now,
                    self.limits.retention.outbox,
                );
                sending.delivery_id = Some(delivery_id.to_string());
                let write =
                    versioned_put(&self.table, to_item("outbox", &sending)?, outbox.version)?;
                let attempts = sending.attempts;
                Ok((
                    write,
                    ClaimSource::Outbox(OutboxClaim {
                        note_id: sending.note_id.clone(),
                        data: sending.data.clone(),
                        page: sending.page.clone(),
                        item: sending,
                    }),
                    attempts,
                ))
            }
        }
    }

    /// The claim's shared writes: one grant `available → reserved` naming the delivery,
    /// the counters, and the delivery itself, `sending` on the lease index.
    #[allow(clippy::too_many_arguments)]
    fn reservation(
        &self,
        item: &DueItem,
        template: &TemplateId,
        grant: &Reserve,
        delivery_id: &str,
        claimer: &str,
        attempts: u32,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
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
        };
        let reserve = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(&item.pk, &grant.sk)))
            .update_expression(
                "SET #s = :reserved, delivery_id = :d, updated_at = :now, version = version + :one",
            )
            .condition_expression("#s = :available")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":reserved", s("reserved"))
            .expression_attribute_values(":available", s("available"))
            .expression_attribute_values(":d", s(delivery_id))
            .expression_attribute_values(":now", s(rfc3339(now)))
            .expression_attribute_values(":one", n(1))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        // The grant moves from the quota item's available set to its reserved set.
        let mut counters = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(&item.pk, &quota_sk(template))))
            .expression_attribute_names("#reserved", OPEN_RESERVED)
            .expression_attribute_values(
                ":id",
                AttributeValue::Ss(vec![grant.request.to_string()]),
            );
        // The send is in flight until it settles: a sent event meanwhile waits for it.
        let flight = crate::domain::reconcile::Mark::new(now, delivery_id).encode();
        counters = counters
            .expression_attribute_names("#inflight", INFLIGHT)
            .expression_attribute_values(":flight", AttributeValue::Ss(vec![flight]));
        counters = if grant.listed {
            counters
                .update_expression(
                    "SET updated_at = :now ADD available :minus, reserved :one, #reserved :id, \
                     #inflight :flight DELETE #available :id",
                )
                .condition_expression("available > :zero AND contains(#available, :idv)")
                .expression_attribute_names("#available", OPEN_AVAILABLE)
                .expression_attribute_values(":idv", s(grant.request.as_str()))
        } else {
            // Found through the ledger: out of the available set too, should it be there
            // (deleting an absent member changes nothing).
            counters
                .update_expression(
                    "SET updated_at = :now ADD available :minus, reserved :one, #reserved :id, \
                     #inflight :flight DELETE #available :id",
                )
                .condition_expression("available > :zero")
                .expression_attribute_names("#available", OPEN_AVAILABLE)
        };
        let counters = drop_marks(counters, &grant.stale)
            .expression_attribute_values(":now", s(rfc3339(now)))
            .expression_attribute_values(":minus", n(-1))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":zero", n(0))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        let delivery_put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(to_item("delivery", &delivery)?))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(vec![
            TransactWriteItem::builder().update(reserve).build(),
            TransactWriteItem::builder().update(counters).build(),
            TransactWriteItem::builder().put(delivery_put).build(),
        ])
    }

    /// A grant to reserve: one the quota item lists as available — or, when its sets
    /// do not account for every available grant (grants recorded before the sets
    /// existed), the first from the ledger. Either way a claim reads a bounded number
    /// of items once the ledger's old grants are settled.
    async fn pick_grant(
        &self,
        pk: &str,
        template: &TemplateId,
        counters: &QuotaCounters,
        open: &OpenGrants,
        ledger_only: bool,
    ) -> Result<Option<Reserve>, StoreError> {
        if counters.available == 0 {
            return Ok(None);
        }
        if !ledger_only
            && open.complete(counters)
            && let Some(request) = open.available.first()
        {
            return Ok(Some(Reserve {
                sk: grant_sk(template, request),
                request: request.clone(),
                listed: true,
                stale: Default::default(),
            }));
        }
        // The sets do not account for the counters: read the open grants from the
        // ledger (once: the repair below makes the next claims read the sets again).
        let mut pages = self
            .grants_query(pk, template, &["available", "reserved"])
            .into_paginator()
            .items()
            .send();
        let mut ledger = LedgerOpen::default();
        while let Some(item) = pages.next().await {
            let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
            let grant: GrantItem = parse("grant", item)?;
            match grant.state {
                Some(GrantState::Available) => {
                    ledger.available.push((grant.sk, grant.request_id));
                }
                Some(GrantState::Reserved) => ledger.reserved.push((grant.sk, grant.request_id)),
                _ => {}
            }
        }
        if ledger.available.len() as u64 == counters.available
            && ledger.reserved.len() as u64 == counters.reserved
        {
            self.repair_open_sets(pk, template, open, &ledger).await;
        } else {
            // A write between the reads (it will have changed the sets too), or a ledger
            // that disagrees with its counters: no repair this time.
            tracing::warn!(
                available = ledger.available.len(),
                reserved = ledger.reserved.len(),
                "the ledger's open grants and the counters differ; the sets are not repaired"
            );
        }
        Ok(ledger
            .available
            .into_iter()
            .next()
            .map(|(sk, request)| Reserve {
                listed: open.available.contains(&request),
                sk,
                request,
                stale: Default::default(),
            }))
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
    async fn repair_open_sets(
        &self,
        pk: &str,
        template: &TemplateId,
        open: &OpenGrants,
        ledger: &LedgerOpen,
    ) {
        // A container frozen here holds a ledger read that others may outdate.
        crate::failpoint::hit("before_repair");
        let fixes = set_fixes(open, ledger);
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
                .entry((fix.add, grant_state_name(fix.state)))
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

/// What it takes to make the sets `open` lists the ledger's `ledger`.
fn set_fixes(open: &OpenGrants, ledger: &LedgerOpen) -> Vec<SetFix> {
    let mut fixes = Vec::new();
    for (state, listed, held) in [
        (GrantState::Available, &open.available, &ledger.available),
        (GrantState::Reserved, &open.reserved, &ledger.reserved),
    ] {
        let held_ids: std::collections::HashSet<&RequestId> =
            held.iter().map(|(_, id)| id).collect();
        let listed_ids: std::collections::HashSet<&RequestId> = listed.iter().collect();
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
                .filter(|(_, id)| !listed_ids.contains(id))
                .map(|(_, id)| SetFix {
                    state,
                    request: id.clone(),
                    add: true,
                }),
        );
    }
    fixes
}

/// Adds to a quota update (whose expression ends in a `DELETE` clause) the removal of
/// stale marks, by attribute.
fn drop_marks(update: UpdateBuilder, stale: &[(&'static str, Vec<String>)]) -> UpdateBuilder {
    let mut update = update;
    let mut clauses = String::new();
    for (i, (name, members)) in stale.iter().enumerate() {
        if members.is_empty() {
            continue;
        }
        clauses.push_str(&format!(", #stale{i} :stale{i}"));
        update = update
            .expression_attribute_names(format!("#stale{i}"), *name)
            .expression_attribute_values(format!(":stale{i}"), AttributeValue::Ss(members.clone()));
    }
    if clauses.is_empty() {
        return update;
    }
    let expression = update.get_update_expression().clone().unwrap_or_default() + &clauses;
    update.update_expression(expression)
}
