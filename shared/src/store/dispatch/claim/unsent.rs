//! A claim's other ending: the due item not sent now (no grant, expired, muted,
//! cancelled, held in quiet hours, past the daily cap), written down with the
//! conditions that make that decision lose to a grant or a count arriving meanwhile.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};

use super::claimable::{ClaimOutcome, Claimable};
use crate::domain::dispatch::cap::day_of;
use crate::domain::dispatch::claim::Unsent;
use crate::domain::{OpenId, TemplateId};
use crate::store::dispatch::due::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::key;
use crate::store::items::outbox::push_moved;
use crate::store::items::quota::{has_grant, under_daily_cap, wake_checked, wake_now};
use crate::store::keys::quota_sk;
use crate::store::retry::Attempt;
use crate::store::tx::{Beside, Outcome, Parts};

impl Store {
    /// Leaves a due item unsent (`why`, as `domain::dispatch::claim::decide` decided),
    /// written down with the conditions that make that decision lose to what would
    /// change it meanwhile. A push listed as waiting for a grant passes the grant it
    /// may have been woken for on.
    pub(super) async fn leave_unsent(
        &self,
        item: &DueItem,
        openid: &OpenId,
        claimable: &Claimable,
        template: TemplateId,
        why: Unsent,
        now: DateTime<Utc>,
    ) -> Result<Attempt<ClaimOutcome>, StoreError> {
        if matches!(why, Unsent::WaitGrant { .. } | Unsent::NoGrant { .. }) {
            return self.not_granted(item, claimable, template, why, now).await;
        }
        let mut writes = self.unsent_writes(item, claimable, &why, now)?;
        let (_, open) = claimable.grants();
        match why {
            // Skipped only while the refusal still stands as read: a setting that
            // accepts again meanwhile makes the skip lose (read again).
            Unsent::TurnedOff => {
                writes.push(self.standing_check(&item.pk, &template, open.standing)?);
            }
            // Only while the day's count stands: one given back meanwhile makes the
            // wait lose.
            Unsent::CapWait(_) | Unsent::Capped => {
                let day = day_of(claimable.day_zone(), now);
                let cap = self.limits.pushes_per_day.unwrap_or(0);
                writes.push(self.still_capped(&item.pk, &template, day, cap)?);
            }
            _ => {}
        }
        // A push that waited for a grant and ends (or is put off) here may have been
        // woken for one: the next waiting push is woken instead (its own member, no
        // longer waiting, is dropped on the way) — by the wake entry this commit makes
        // due, and at once below.
        let listed = claimable.listed();
        if listed {
            self.pass_the_wake(&mut writes, &item.pk, &template, now)?;
        }
        // Else it moved meanwhile: read again.
        if !self.commit_unsent(writes).await? {
            return Ok(Attempt::Retry);
        }
        if listed {
            Box::pin(self.wake_waiting_logged(openid, &template, now)).await;
        }
        Ok(Attempt::Done(ClaimOutcome::Unsent { why, template }))
    }

    /// The writes of a due item not sent (`why`). A plan moves as
    /// [`Unsent::plan_after`] says; a push moves to the
    /// state `why` names, pending again when it is due again, its notification told
    /// (the notification stays whatever the reason).
    pub(super) fn unsent_writes(
        &self,
        item: &DueItem,
        claimable: &Claimable,
        why: &Unsent,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        match claimable {
            Claimable::Plan { plan, open, .. } => {
                let moved = why.plan_after(plan, open.standing)?;
                Ok(vec![self.plan_put(&moved, &item.pk, now)?])
            }
            Claimable::Outbox { outbox, .. } => {
                let send_by = outbox.send_by.and_then(DateTime::from_timestamp_millis);
                let mut moved = outbox.moved(
                    why.outbox_state(),
                    why.due_again(send_by),
                    self.shards,
                    now,
                    self.limits.retention.outbox,
                );
                moved.waiting_grant = why.waits_for_grant();
                push_moved(
                    &self.table,
                    &item.pk,
                    outbox,
                    &moved,
                    why.push_status(),
                    now,
                )
            }
        }
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
            Outcome::Cancelled(_) | Outcome::Contended | Outcome::Conflict => false,
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
        self.quota_check(pk, template, !has_grant())
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
        self.quota_check(pk, template, !under_daily_cap(day, cap))
    }
}
