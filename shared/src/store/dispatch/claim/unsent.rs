//! A claim's other ending: the due item not sent now (no grant, expired, muted,
//! cancelled, held in quiet hours, past the daily cap), written down with the
//! conditions that make that decision lose to a grant or a count arriving meanwhile.

use aws_sdk_dynamodb::types::{ConditionCheck, TransactWriteItem};
use chrono::{DateTime, Utc};

use super::{Claimable, Unsent};
use crate::domain::TemplateId;
use crate::domain::dispatch::OutboxState;
use crate::domain::inbox::{PushReason, PushStatus};
use crate::domain::reminders::plan::PlanEvent;
use crate::store::dispatch::DueItem;
use crate::store::items::expr::Guarded;
use crate::store::items::outbox::{OutboxItem, note_push_update, versioned_put};
use crate::store::items::quota::{has_grant, under_daily_cap, wake_checked, wake_now};
use crate::store::items::{key, to_item};
use crate::store::keys::quota_sk;
use crate::store::tx::{Beside, Outcome, Parts};
use crate::store::{Store, StoreError};

impl Store {
    /// The writes of a due item not sent (`why`): no grant when it came due (the plan
    /// pauses `needs_grant`; the push is skipped); past the daily cap (due again on the
    /// user's next day, or a push that expires first ends `capped`); a push only: its
    /// `expires_at` passed, its template refused by the user's settings, muted,
    /// cancelled, replaced, held in quiet hours. The notification
    /// stays whatever the reason.
    pub(super) fn unsent_writes(
        &self,
        item: &DueItem,
        claimable: &Claimable,
        why: Unsent,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        match claimable {
            // Refused by the user's settings (a standing choice the plan missed: made
            // while its kind was not configured): paused as that refusal pauses it.
            Claimable::Plan { plan, open, .. } if matches!(why, Unsent::TurnedOff) => {
                let mut moved = plan.clone();
                moved
                    .stand(open.standing)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(vec![self.plan_put(&moved, &item.pk, now)?])
            }
            Claimable::Plan { plan, .. } => {
                let event = match why {
                    // Due again at the next day's first waking moment.
                    Unsent::Capped(until) => PlanEvent::Capped {
                        due: plan.settings.schedule.first_awake_from(until),
                    },
                    Unsent::NoGrant
                    | Unsent::WaitGrant
                    | Unsent::Expired
                    | Unsent::Muted
                    | Unsent::TurnedOff
                    | Unsent::Cancelled
                    | Unsent::Replaced
                    | Unsent::Held(_)
                    | Unsent::CappedOut => PlanEvent::GrantMissing,
                };
                let mut moved = plan.clone();
                moved.status = plan
                    .status
                    .apply(event)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(vec![self.plan_put(&moved, &item.pk, now)?])
            }
            Claimable::Outbox { outbox, .. } => {
                let (state, status, reason) = match why {
                    Unsent::NoGrant => (
                        OutboxState::Skipped,
                        PushStatus::Skipped,
                        Some(PushReason::NoGrant),
                    ),
                    Unsent::Expired => (OutboxState::Expired, PushStatus::Expired, None),
                    Unsent::Muted => (OutboxState::Muted, PushStatus::Muted, None),
                    // Skipped, its grants kept: a refusal of the template, not of them.
                    Unsent::TurnedOff => (
                        OutboxState::Skipped,
                        PushStatus::Skipped,
                        Some(PushReason::TurnedOff),
                    ),
                    Unsent::CappedOut => (OutboxState::Capped, PushStatus::Capped, None),
                    // Still pending, due again on the user's next day; the
                    // notification says why it waits.
                    Unsent::Capped(until) => {
                        let writes =
                            self.pending_again(item, outbox, Some(until), PushReason::Capped, now)?;
                        return Ok(writes);
                    }
                    Unsent::Cancelled => (OutboxState::Cancelled, PushStatus::Cancelled, None),
                    Unsent::Replaced => (OutboxState::Replaced, PushStatus::Replaced, None),
                    // Still pending, for a grant: due only at its `expires_at` (to end
                    // `expired`, inbox-only) until a grant wakes it.
                    Unsent::WaitGrant => {
                        let due = outbox.send_by.and_then(DateTime::from_timestamp_millis);
                        let writes =
                            self.pending_again(item, outbox, due, PushReason::NoGrant, now)?;
                        return Ok(writes);
                    }
                    Unsent::Held(until) => {
                        // Still pending, due again when the quiet hours end; the
                        // notification's push status stays `pending`.
                        let held = outbox.moved(
                            OutboxState::Pending,
                            Some(until),
                            self.shards,
                            now,
                            self.limits.retention.outbox,
                        );
                        return Ok(vec![versioned_put(
                            &self.table,
                            to_item("outbox", &held)?,
                            outbox.version,
                        )?]);
                    }
                };
                let moved =
                    outbox.moved(state, None, self.shards, now, self.limits.retention.outbox);
                Ok(vec![
                    versioned_put(&self.table, to_item("outbox", &moved)?, outbox.version)?,
                    note_push_update(&self.table, &item.pk, &outbox.note_id, status, reason)?,
                ])
            }
        }
    }

    /// A push still pending, due again at `due` (or off the due index), its
    /// notification saying why it waits (`reason`); waiting for a grant when `reason`
    /// says so (`OutboxItem::waiting_grant`).
    fn pending_again(
        &self,
        item: &DueItem,
        outbox: &OutboxItem,
        due: Option<DateTime<Utc>>,
        reason: PushReason,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let mut waiting = outbox.moved(
            OutboxState::Pending,
            due,
            self.shards,
            now,
            self.limits.retention.outbox,
        );
        waiting.waiting_grant = reason == PushReason::NoGrant;
        Ok(vec![
            versioned_put(&self.table, to_item("outbox", &waiting)?, outbox.version)?,
            note_push_update(
                &self.table,
                &item.pk,
                &outbox.note_id,
                PushStatus::Pending,
                Some(reason),
            )?,
        ])
    }

    /// Commits an unsent item's writes; false if it moved (read it again). Only the
    /// notification gone (its retention removed it): the rest lands without it, never
    /// recreating it.
    pub(super) async fn commit_unsent(
        &self,
        writes: Vec<TransactWriteItem>,
    ) -> Result<bool, StoreError> {
        let mut parts = Parts::notes_apart(writes);
        Ok(match self.transact_parts(&parts).await? {
            Outcome::Committed => true,
            Outcome::Cancelled(failed) if failed.only(|part| part == Beside::Note) => {
                parts.retain(|part| part != Beside::Note);
                matches!(self.transact_parts(&parts).await?, Outcome::Committed)
            }
            Outcome::Cancelled(_) | Outcome::Contended => false,
        })
    }

    /// For a push listed as waiting that ends (or is put off) unsent at its claim: the
    /// template's wake entry due now in the same commit (`WAKE_SET`), so a grant it may
    /// have been woken for passes to the next waiting push even if this dispatcher
    /// dies before waking it. A condition `writes` already put on the quota item is
    /// kept (an item is written once per transaction): the check becomes the update.
    pub(super) fn pass_the_wake(
        &self,
        writes: &mut Vec<TransactWriteItem>,
        pk: &str,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let quota = key(pk, &quota_sk(template));
        let checked = writes
            .iter()
            .position(|w| w.condition_check().is_some_and(|c| c.key() == &quota));
        let Some(write) = checked.map(|at| writes.remove(at)) else {
            writes.push(wake_now(&self.table, pk, template.as_str(), now)?);
            return Ok(());
        };
        let Some(check) = write.condition_check() else {
            return Err(StoreError::Corrupt("a quota check that is not one".into()));
        };
        writes.push(wake_checked(&self.table, check, now)?);
        Ok(())
    }

    /// A condition that the template still has no available grant: a grant report
    /// landing between the read and the write makes the pause (or skip) lose, and the
    /// item is claimed with that grant on the next try.
    pub(super) fn still_no_grant(
        &self,
        pk: &str,
        template: &TemplateId,
    ) -> Result<TransactWriteItem, StoreError> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &quota_sk(template))))
            .guarded(&!has_grant(), "g")
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }

    /// A condition that the user's day `day` still counts `cap` sends or more: a count
    /// given back between the read and the write makes the wait lose, and the item is
    /// claimed on the next try.
    pub(super) fn still_capped(
        &self,
        pk: &str,
        template: &TemplateId,
        day: chrono::NaiveDate,
        cap: u32,
    ) -> Result<TransactWriteItem, StoreError> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &quota_sk(template))))
            .guarded(&!under_daily_cap(day, cap), "g")
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().condition_check(check).build())
    }
}
