//! One settlement transaction: the delivery, its grant, the quota item's lists and
//! marks, the plan or outbox, each guarded by what the settler read.

use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use chrono::{DateTime, Utc};

use crate::domain::dispatch::delivery::{GrantSeen, Guard, Marks, Writer, regrant};
use crate::domain::dispatch::{DeliveryState, OutcomeClass};
use crate::domain::{GrantState, TemplateId};
use crate::store::dispatch::delivery::{DeliveryItem, admitted_by};
use crate::store::items::expr::Guarded;
use crate::store::items::grant::{grant_state_name, grant_state_of};
use crate::store::items::{Item, key, n, parse, rfc3339, s, text};
use crate::store::keys::{delivery_sk, lease_pk, quota_sk, request_id_of_grant};
use crate::store::tx::{Outcome, Parts};
use crate::store::{Attempt, MAX_WRITE_ATTEMPTS, Store, StoreError, Tries, retry_carrying};

use crate::store::items::grant::held_by;
use crate::store::items::quota::{
    INFLIGHT, OPEN_AVAILABLE, OPEN_RESERVED, OPEN_UNKNOWN, SENT_MARKS, WAKE_SET, not_voided_since,
    sent_on,
};

/// A grant move in a settle: `from → to`, fenced on the delivery that reserved it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrantMove<'a> {
    pub(crate) sk: &'a str,
    pub(crate) from: GrantState,
    pub(crate) to: GrantState,
    /// Under a daily cap, the day the claim counted its send on: a grant given back
    /// unsent (`reserved → available`) gives that count back too.
    pub(crate) uncount: Option<chrono::NaiveDate>,
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
    ) -> Result<TransactWriteItem, StoreError> {
        let w = &tx.write;
        let mut set = vec![
            "#s = :final",
            // CLASS is a reserved word: the name goes through a placeholder.
            "#class = :class",
            "outcome = :outcome",
            "finished_at = :now",
            "expires_at = :expires",
        ];
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(tx.pk, &delivery_sk(tx.delivery_id))))
            .expression_attribute_names("#s", "state")
            .expression_attribute_names("#class", "class")
            .expression_attribute_values(":final", s(w.state.as_str()))
            .expression_attribute_values(":class", s(w.class.as_str()))
            .expression_attribute_values(
                ":outcome",
                s(w.outcome.chars().take(300).collect::<String>()),
            )
            .expression_attribute_values(":now", s(rfc3339(now)))
            .expression_attribute_values(
                ":expires",
                n((now + self.limits.retention.deliveries).timestamp()),
            )
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(code) = w.errcode {
            set.push("errcode = :errcode");
            update = update.expression_attribute_values(":errcode", n(code));
        }
        if let Some(msgid) = &w.msgid {
            set.push("msgid = :msgid");
            update = update.expression_attribute_values(":msgid", s(msgid));
        }
        match w.by {
            Writer::Finalize => {}
            Writer::Kept => set.push("kept_settled_at = :now"),
            Writer::Sweep => {
                set.push("swept_at = :now");
                set.push("sweep_outcome = :outcome");
            }
            Writer::LateAnswer => set.push("answered_late_at = :now"),
            Writer::Event => set.push("event_settled_at = :now"),
            Writer::Release { late } => {
                set.push("released_at = :now");
                if late {
                    set.push("answered_late_at = :now");
                }
            }
        }
        update = update.guarded(&admitted_by(tx.guard), "g");
        let expression = if w.void_others {
            // Stays on (or, after a sweep took it off, goes back onto) the lease index
            // until the other grants are void, so a sweep finishes that if need be.
            set.push("void_others = :void");
            set.push("lease_pk = :lease_pk");
            set.push("lease_until = if_not_exists(lease_until, :lease_now)");
            update = update
                .expression_attribute_values(":void", AttributeValue::Bool(true))
                .expression_attribute_values(":lease_pk", s(lease_pk(tx.delivery_id, self.shards)))
                .expression_attribute_values(":lease_now", n(now.timestamp_millis()));
            format!("SET {}", set.join(", "))
        } else {
            format!("SET {} REMOVE lease_pk, lease_until", set.join(", "))
        };
        let update = update
            .update_expression(expression)
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// The grant's move, fenced on the delivery that reserved it.
    pub(crate) fn grant_move(
        &self,
        pk: &str,
        delivery_id: &str,
        grant: GrantMove<'_>,
        by: Writer,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let mut expression =
            "SET #s = :to, updated_at = :now, version = version + :one".to_string();
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, grant.sk)))
            // Fenced: only the delivery that reserved the grant moves it; undoing a
            // void, only the sweep's guess, never the user's disable.
            .guarded(
                &held_by(
                    grant.from,
                    delivery_id,
                    (grant.from == GrantState::Invalid && grant.to == GrantState::Available)
                        .then_some(SWEEP_VOID),
                ),
                "g",
            )
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":to", s(grant_state_name(grant.to)))
            .expression_attribute_values(":now", s(rfc3339(now)))
            .expression_attribute_values(":one", n(1))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let expires = || n((now + self.limits.retention.grants).timestamp());
        match grant.to {
            // A restore: free again for any later claim.
            GrantState::Available => {
                expression.push_str(" REMOVE delivery_id, void_reason, expires_at");
            }
            GrantState::Consumed => {
                expression.push_str(", expires_at = :expires");
                update = update.expression_attribute_values(":expires", expires());
            }
            GrantState::Invalid => {
                expression.push_str(", void_reason = :why, expires_at = :expires");
                update = update.expression_attribute_values(":expires", expires());
                let why = if by == Writer::Sweep {
                    SWEEP_VOID
                } else {
                    "send"
                };
                update = update.expression_attribute_values(":why", s(why));
            }
            GrantState::Reserved => {}
        }
        let update = update
            .update_expression(expression)
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// The quota item's part of a settle: the counters and open-grant sets following
    /// the grant (out of `reserved`, into `available` on a restore), and the marks.
    /// None if neither changes.
    pub(crate) fn quota_update(
        &self,
        pk: &str,
        template: &TemplateId,
        grant: Option<GrantMove<'_>>,
        marks: &Marks,
        claimed_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Option<TransactWriteItem>, StoreError> {
        if grant.is_none() && marks.is_empty() {
            return Ok(None);
        }
        let (mut adds, mut deletes) = (Vec::new(), Vec::new());
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &quota_sk(template))))
            .expression_attribute_values(":now", s(rfc3339(now)));
        if let Some(grant) = grant {
            let request = request_id_of_grant(grant.sk)
                .ok_or_else(|| StoreError::Corrupt(format!("grant key {}", grant.sk)))?;
            // Counter names go through placeholders: CONSUMED is a reserved word.
            adds.extend(["#from :minus", "#to :one"]);
            update = update
                .expression_attribute_names("#from", grant_state_name(grant.from))
                .expression_attribute_names("#to", grant_state_name(grant.to))
                .expression_attribute_values(":minus", n(-1))
                .expression_attribute_values(":one", n(1));
            if grant.from == GrantState::Reserved {
                deletes.push("#open_reserved :id");
                update = update.expression_attribute_names("#open_reserved", OPEN_RESERVED);
            }
            if grant.to == GrantState::Available {
                adds.push("#open_available :id");
                update = update.expression_attribute_names("#open_available", OPEN_AVAILABLE);
            }
            // (`invalid → available`: a late answer that the message did not go out.)
            if let Some(day) = grant.uncount
                && grant.to == GrantState::Available
                && grant.from != GrantState::Available
            {
                adds.push("#counted :minus");
                update = update.expression_attribute_names("#counted", sent_on(day));
            }
            if grant.from == GrantState::Reserved || grant.to == GrantState::Available {
                // Bound only when a set clause uses it: DynamoDB refuses unused values.
                update = update.expression_attribute_values(
                    ":id",
                    AttributeValue::Ss(vec![request.to_string()]),
                );
            }
            if grant.from == GrantState::Invalid && grant.to == GrantState::Available {
                // A void grant comes back only if nothing voided the template's grants
                // on purpose since the send was claimed.
                update = update.guarded(&not_voided_since(claimed_at.timestamp_millis()), "g");
            }
        }
        let one = |member: &String| AttributeValue::Ss(vec![member.clone()]);
        if let Some(mark) = &marks.open_unknown {
            adds.push("#open_unknown :open_unknown");
            update = update.expression_attribute_values(":open_unknown", one(mark));
        }
        if let Some(mark) = &marks.close_unknown {
            deletes.push("#open_unknown :close_unknown");
            update = update.expression_attribute_values(":close_unknown", one(mark));
        }
        if marks.open_unknown.is_some() || marks.close_unknown.is_some() {
            update = update.expression_attribute_names("#open_unknown", OPEN_UNKNOWN);
        }
        if let Some(mark) = &marks.sent {
            adds.push("#sent_marks :sent");
            update = update
                .expression_attribute_names("#sent_marks", SENT_MARKS)
                .expression_attribute_values(":sent", one(mark));
        }
        if let Some(mark) = &marks.close_inflight {
            deletes.push("#inflight :inflight");
            update = update
                .expression_attribute_names("#inflight", INFLIGHT)
                .expression_attribute_values(":inflight", one(mark));
        }
        let mut expression = "SET updated_at = :now".to_string();
        // A grant given back: the wake entry due at once (waiting pushes are woken
        // by the dispatcher even if this writer never wakes them).
        if grant.is_some_and(|g| g.to == GrantState::Available && g.from != GrantState::Available) {
            expression.push_str(&format!(", {WAKE_SET}"));
            update = update.expression_attribute_values(":wake_now", n(now.timestamp_millis()));
        }
        if !adds.is_empty() {
            expression.push_str(&format!(" ADD {}", adds.join(", ")));
        }
        if !deletes.is_empty() {
            expression.push_str(&format!(" DELETE {}", deletes.join(", ")));
        }
        let update = update
            .update_expression(expression)
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(Some(TransactWriteItem::builder().update(update).build()))
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
                if let Some(quota) =
                    self.quota_update(tx.pk, tx.template, grant, &tx.marks, tx.claimed_at, now)?
                {
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
                if grant
                    .is_some_and(|g| g.from == GrantState::Invalid && g.to == GrantState::Available)
                    && failed.has(Settle::Quota)
                {
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
        state: text(&now, "state").and_then(grant_state_of),
        delivery_id: text(&now, "delivery_id").map(str::to_string),
        voided_by_sweep: text(&now, "void_reason") == Some(SWEEP_VOID),
    };
    regrant(wanted.to, delivery_id, &seen).map(|from| GrantMove { from, ..wanted })
}
