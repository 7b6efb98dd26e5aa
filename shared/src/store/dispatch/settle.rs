//! One settlement transaction: the delivery, its grant, the quota item's lists and
//! marks, the plan or outbox, each guarded by what the settler read.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::dispatch::delivery::{GrantSeen, Guard, Marks, Writer, regrant};
use crate::domain::settle::{DeliveryState, OutcomeClass};
use crate::domain::{GrantState, TemplateId};
use crate::store::dispatch::delivery::{DeliveryItem, admitted_by};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, update};
use crate::store::items::grant::held_by;
use crate::store::items::{Item, key, n, parse, rfc3339, s, text};
use crate::store::keys::{delivery_sk, lease_pk, quota_sk, request_id_of_grant};
use crate::store::retry::{Attempt, MAX_WRITE_ATTEMPTS, Tries, retry_carrying};
use crate::store::tx::{Outcome, Parts, Write};

use crate::store::items::quota::{
    INFLIGHT, OPEN_AVAILABLE, OPEN_RESERVED, OPEN_UNKNOWN, SENT_MARKS, not_voided_since, sent_on,
    wake,
};

/// A grant move in a settle: `from → to`, fenced on the delivery that reserved it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrantMove<'a> {
    pub(crate) sk: &'a str,
    pub(crate) from: GrantState,
    pub(crate) to: GrantState,
}

impl GrantMove<'_> {
    /// A void undone: a grant the sweep voided goes back to `available`.
    fn undoes_void(&self) -> bool {
        self.from == GrantState::Invalid && self.to == GrantState::Available
    }
}

/// What a settle writes to the delivery.
pub(crate) struct DeliveryWrite {
    pub(crate) state: DeliveryState,
    pub(crate) class: OutcomeClass,
    pub(crate) outcome: String,
    pub(crate) errcode: Option<i64>,
    pub(crate) msgid: Option<String>,
    /// Whether this write comes from the sweep (or is a late answer after one).
    pub(crate) by: Writer,
    /// 43101: the template's other grants are still to be voided (see
    /// [`DeliveryItem::void_others`]).
    pub(crate) void_others: bool,
}

impl DeliveryWrite {
    /// The quota-item marks this write changes ([`Marks::of`]).
    pub(crate) fn marks(
        &self,
        delivery_id: &str,
        claimed_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Marks {
        Marks::of(
            self.state,
            self.msgid.as_deref(),
            self.by,
            delivery_id,
            claimed_at,
            now,
        )
    }
}

/// One settle transaction: the delivery, its grant, and the claimed item's writes.
pub(crate) struct SettleTx<'a> {
    pub(crate) pk: &'a str,
    pub(crate) delivery_id: &'a str,
    /// When the send was claimed: a grant voided since (a disable, a refusal, 43101)
    /// is never given back by it.
    pub(crate) claimed_at: DateTime<Utc>,
    pub(crate) guard: Guard<'a>,
    pub(crate) write: DeliveryWrite,
    /// The template whose quota item holds the grant's counters and the marks.
    pub(crate) template: &'a TemplateId,
    pub(crate) marks: Marks,
    pub(crate) grant: Option<GrantMove<'a>>,
    /// Under a daily cap, the day the claim counted its send on: given back when the
    /// delivery ends failed ([`DeliveryState::counts_against_cap`]).
    pub(crate) counted_on: Option<chrono::NaiveDate>,
    /// If the claimed item moved on, give up (the caller reads it again) instead of
    /// landing the rest without it.
    pub(crate) retry_whole: bool,
    /// The claimed item's writes (conditional on it being as expected); dropped
    /// together if it moved on.
    pub(crate) source: Vec<TransactWriteItem>,
}

/// Which parts of a settle landed.
#[derive(Debug)]
pub(crate) enum Settled {
    /// The delivery moved; the grant and the claimed item's writes too, if true.
    Landed { grant: bool, source: bool },
    /// The delivery was not in the guarded state: as it is now (ALL_OLD), if it exists.
    DeliveryMoved(Option<Box<DeliveryItem>>),
    /// With `retry_whole`: the claimed item moved on; nothing was written.
    SourceMoved,
}

/// The parts of a settlement's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    /// The delivery, on its guard: failed, it moved (its old image says how).
    Delivery,
    /// The grant's move, fenced on the delivery.
    Grant,
    /// The quota counters and marks (a void undone: on no void since the claim).
    Quota,
    /// The claimed item's write `i` (the plan or push, a notification's status).
    Source(usize),
}

impl Store {
    pub(crate) fn delivery_update(
        &self,
        tx: &SettleTx<'_>,
        now: DateTime<Utc>,
    ) -> Result<Write, StoreError> {
        let w = &tx.write;
        let outcome = s(w.outcome.chars().take(300).collect::<String>());
        let stamp = s(rfc3339(now));
        let mut delivery = change()
            .set("state", s(w.state.as_str()))
            .set("class", s(w.class.as_str()))
            .set("outcome", outcome.clone())
            .set("finished_at", stamp.clone())
            .set(
                "expires_at",
                n((now + self.limits.retention.deliveries).timestamp()),
            );
        if let Some(code) = w.errcode {
            delivery = delivery.set("errcode", n(code));
        }
        if let Some(msgid) = &w.msgid {
            delivery = delivery.set("msgid", s(msgid));
        }
        delivery = match w.by {
            Writer::Finalize => delivery,
            Writer::Kept => delivery.set("kept_settled_at", stamp),
            Writer::Sweep => delivery
                .set("swept_at", stamp)
                .set("sweep_outcome", outcome),
            Writer::LateAnswer => delivery.set("answered_late_at", stamp),
            Writer::Event => delivery.set("event_settled_at", stamp),
            Writer::Release { late: false } => delivery.set("released_at", stamp),
            Writer::Release { late: true } => delivery
                .set("released_at", stamp.clone())
                .set("answered_late_at", stamp),
        };
        delivery = if w.void_others {
            // Stays on (or, after a sweep took it off, goes back onto) the lease index
            // until the other grants are void, so a sweep finishes that if need be.
            delivery
                .set("void_others", AttributeValue::Bool(true))
                .set("lease_pk", s(lease_pk(tx.delivery_id, self.shards)))
                .set_if_absent("lease_until", n(now.timestamp_millis()))
        } else {
            delivery.remove("lease_pk").remove("lease_until")
        };
        update(
            &self.table,
            key(tx.pk, &delivery_sk(tx.delivery_id)),
            delivery,
        )
        .when(admitted_by(tx.guard))
        .old_on_failure()
        .part()
    }

    /// The grant's move, fenced on the delivery that reserved it.
    pub(crate) fn grant_move(
        &self,
        pk: &str,
        delivery_id: &str,
        grant: GrantMove<'_>,
        by: Writer,
        now: DateTime<Utc>,
    ) -> Result<Write, StoreError> {
        let moved = change()
            .set("state", s(grant.to.as_str()))
            .set("updated_at", s(rfc3339(now)))
            .plus("version", 1);
        let expires = || n((now + self.limits.retention.grants).timestamp());
        let moved = match grant.to {
            // A restore: free again for any later claim.
            GrantState::Available => moved
                .remove("delivery_id")
                .remove("void_reason")
                .remove("expires_at"),
            GrantState::Consumed => moved.set("expires_at", expires()),
            GrantState::Invalid => {
                let why = if by == Writer::Sweep {
                    SWEEP_VOID
                } else {
                    "send"
                };
                moved
                    .set("void_reason", s(why))
                    .set("expires_at", expires())
            }
            GrantState::Reserved => moved,
        };
        update(&self.table, key(pk, grant.sk), moved)
            // Fenced: only the delivery that reserved the grant moves it; undoing a
            // void, only the sweep's guess, never the user's disable.
            .when(held_by(
                grant.from,
                delivery_id,
                grant.undoes_void().then_some(SWEEP_VOID),
            ))
            .old_on_failure()
            .part()
    }

    /// The quota item's part of a settle: the counters and open-grant sets following
    /// the grant (out of `reserved`, into `available` on a restore), the day's count
    /// given back (`uncount`), and the marks. None if none changes.
    fn quota_update(
        &self,
        tx: &SettleTx<'_>,
        grant: Option<GrantMove<'_>>,
        now: DateTime<Utc>,
    ) -> Result<Option<TransactWriteItem>, StoreError> {
        let (pk, template, marks) = (tx.pk, tx.template, &tx.marks);
        let uncount = tx
            .counted_on
            .filter(|_| !tx.write.state.counts_against_cap());
        if grant.is_none() && uncount.is_none() && marks.is_empty() {
            return Ok(None);
        }
        let mut counters = change().set("updated_at", s(rfc3339(now)));
        if let Some(day) = uncount {
            counters = counters.add(sent_on(day), n(-1));
        }
        let mut guard = None;
        if let Some(grant) = grant {
            let request = request_id_of_grant(grant.sk)
                .ok_or_else(|| StoreError::Corrupt(format!("grant key {}", grant.sk)))?;
            let id = || AttributeValue::Ss(vec![request.to_string()]);
            counters = counters
                .add(grant.from.as_str(), n(-1))
                .add(grant.to.as_str(), n(1));
            if grant.from == GrantState::Reserved {
                counters = counters.delete(OPEN_RESERVED, id());
            }
            if grant.to == GrantState::Available {
                counters = counters.add(OPEN_AVAILABLE, id());
            }
            if grant.undoes_void() {
                // A void grant comes back only if nothing voided the template's grants
                // on purpose since the send was claimed.
                guard = Some(not_voided_since(tx.claimed_at.timestamp_millis()));
            }
            // A grant given back: the wake entry due at once (waiting pushes are woken
            // by the dispatcher even if this writer never wakes them).
            if grant.to == GrantState::Available && grant.from != GrantState::Available {
                counters = counters.and(wake(now));
            }
        }
        let one = |member: &String| AttributeValue::Ss(vec![member.clone()]);
        if let Some(mark) = &marks.open_unknown {
            counters = counters.add(OPEN_UNKNOWN, one(mark));
        }
        if let Some(mark) = &marks.close_unknown {
            counters = counters.delete(OPEN_UNKNOWN, one(mark));
        }
        if let Some(mark) = &marks.sent {
            counters = counters.add(SENT_MARKS, one(mark));
        }
        if let Some(mark) = &marks.close_inflight {
            counters = counters.delete(INFLIGHT, one(mark));
        }
        let write = update(&self.table, key(pk, &quota_sk(template)), counters);
        Ok(Some(match guard {
            Some(guard) => write.when(guard).write()?,
            None => write.write()?,
        }))
    }

    /// Runs a settle transaction (see the module docs), dropping the parts that no
    /// longer apply: a grant that is not this delivery's to move any more, a claimed
    /// item that moved on. A grant already voided for this delivery is still moved to
    /// `consumed` when WeChat took the message (the truth wins), and back to
    /// `available` only if the sweep voided it.
    pub(crate) async fn write_settlement(
        &self,
        tx: SettleTx<'_>,
        now: DateTime<Utc>,
    ) -> Result<Settled, StoreError> {
        let tries = Tries::Times(MAX_WRITE_ATTEMPTS);
        let carried = retry_carrying("settle", tries, tx, |mut tx| async move {
            let decided = async {
                let mut items =
                    Parts::new().with(Settle::Delivery, self.delivery_update(&tx, now)?);
                let grant = tx.grant.filter(|g| g.from != g.to);
                if let Some(grant) = grant {
                    items.add(
                        Settle::Grant,
                        self.grant_move(tx.pk, tx.delivery_id, grant, tx.write.by, now)?,
                    );
                }
                if let Some(quota) = self.quota_update(&tx, grant, now)? {
                    items.add(Settle::Quota, quota);
                }
                for (i, write) in tx.source.iter().enumerate() {
                    items.add(Settle::Source(i), write.clone());
                }
                let with_grant = tx.grant.is_some_and(|g| g.from != g.to);
                let failed = match self.transact_parts(&items).await? {
                    Outcome::Committed => {
                        return Ok(Attempt::Done(Settled::Landed {
                            grant: with_grant,
                            source: !tx.source.is_empty(),
                        }));
                    }
                    Outcome::Contended | Outcome::Conflict => return Ok(Attempt::Retry),
                    Outcome::Cancelled(failed) => failed,
                };
                if failed.has(Settle::Delivery) {
                    let now_item = match failed.old(Settle::Delivery).cloned() {
                        Some(item) => Some(Box::new(parse::<DeliveryItem>("delivery", item)?)),
                        None => None,
                    };
                    return Ok(Attempt::Done(Settled::DeliveryMoved(now_item)));
                }
                let mut changed = false;
                if grant.is_some_and(|g| g.undoes_void()) && failed.has(Settle::Quota) {
                    // The template's grants were voided after this send was claimed (a
                    // disable, a refusal): the grant stays void; the rest still lands.
                    tx.grant = None;
                    changed = true;
                }
                if with_grant && failed.has(Settle::Grant) {
                    tx.grant = tx.grant.and_then(|g| {
                        grant_retry(g, tx.delivery_id, failed.old(Settle::Grant).cloned())
                    });
                    changed = true;
                }
                let source_failed: Vec<usize> = failed
                    .roles()
                    .filter_map(|part| match part {
                        Settle::Source(i) => Some(i),
                        _ => None,
                    })
                    .collect();
                if !source_failed.is_empty() {
                    let only_notes = source_failed.iter().all(|&i| {
                        tx.source
                            .get(i)
                            .is_some_and(crate::store::items::outbox::is_note_update)
                    });
                    if only_notes {
                        // Only notifications their retention removed: their status is not
                        // written (never recreated as a stub); the rest lands.
                        let mut index = 0;
                        tx.source.retain(|_| {
                            let keep = !source_failed.contains(&index);
                            index += 1;
                            keep
                        });
                    } else if tx.retry_whole {
                        return Ok(Attempt::Done(Settled::SourceMoved));
                    } else {
                        // The plan or push moved on (the user acted): that stands.
                        tx.source.clear();
                    }
                    changed = true;
                }
                // A narrowed write is tried again at once; else it lost a race.
                Ok(if changed {
                    Attempt::Again
                } else {
                    Attempt::Retry
                })
            }
            .await;
            (decided, tx)
        })
        .await;
        carried.0
    }
}

/// `void_reason` of a grant the sweep voided (its send's outcome unknown).
pub(crate) const SWEEP_VOID: &str = "sweep";

/// The grant move to try again after the grant's condition failed, given the grant as
/// it is now (ALL_OLD): none if it is no longer this delivery's to move ([`regrant`]).
pub(crate) fn grant_retry<'a>(
    wanted: GrantMove<'a>,
    delivery_id: &str,
    now: Option<Item>,
) -> Option<GrantMove<'a>> {
    let now = now?;
    let seen = GrantSeen {
        state: text(&now, "state").and_then(GrantState::parse),
        delivery_id: text(&now, "delivery_id").map(str::to_string),
        voided_by_sweep: text(&now, "void_reason") == Some(SWEEP_VOID),
    };
    regrant(wanted.to, delivery_id, &seen).map(|from| GrantMove { from, ..wanted })
}
