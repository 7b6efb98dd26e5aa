//! Priority for scarce grants: the writes that list a push waiting for a grant of its
//! template on the quota item (`waiting`), wake the best waiting one (due now, on the
//! due index), and drop a member whose push no longer waits
//! (`domain::dispatch::priority` decides; the claim commits the wait, see
//! `claim::priority`). [`Store::wake_waiting`] runs after a grant arrives (a report's
//! handler, a check-in's store operation) or is given back (a finalize or release that
//! restored it), and after a listed push ended at its claim.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::dispatch::priority::{MAX_WAITING, best, note_of};
use crate::domain::{OpenId, QuotaCounters, TemplateId};
use crate::store::dispatch::due::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, check, update};
use crate::store::items::expr::{Cmp, Cond, absent, all, compare, eq, size};
use crate::store::items::outbox::{still_waits, waits_for_grant};
use crate::store::items::quota::{OpenGrants, WAITING, WAKE_NEVER_MS, quota_change};
use crate::store::items::{due_as_seen, is_there, key, n, parse, rfc3339, s};
use crate::store::keys::{due_pk, outbox_sk, quota_sk, user_pk};
use crate::store::tx::{Beside, Outcome, Parts, TxOutcome};

/// A waiting push's outbox key, from its member.
fn outbox_of(member: &str) -> Result<String, StoreError> {
    note_of(member)
        .map(outbox_sk)
        .ok_or_else(|| StoreError::Corrupt(format!("bad waiting member {member:?}")))
}

/// The wake of a push that yielded to pushes due together: the template's wake entry
/// due `at`, in place of its `due_at` as the claim read it (`read`; absent: none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct YieldWake {
    pub(crate) at: DateTime<Utc>,
    pub(crate) read: Option<i64>,
}

impl Store {
    /// Lists `member` on the template's quota item as waiting for a grant, on the
    /// condition that the grants available are still `available` (a grant arriving or
    /// taken between the read and the write makes the wait lose: the claim reads
    /// again) and, for a member not `listed` yet, that the list has room.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn waiting_add(
        &self,
        pk: &str,
        template: &TemplateId,
        member: &str,
        available: u64,
        listed: bool,
        wake: Option<YieldWake>,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let grants = eq("available", n(available));
        let mut rule = vec![if available == 0 {
            absent("available").or(grants)
        } else {
            grants
        }];
        if !listed {
            rule.push(absent(WAITING).or(size(
                WAITING,
                Cmp::Lt,
                i64::try_from(MAX_WAITING).unwrap_or(i64::MAX),
            )));
        }
        // A yield's wake replaces the entry's instant only as read (never a wake made
        // due meanwhile: the claim reads again).
        match wake.map(|w| w.read) {
            Some(Some(read)) => rule.push(eq("due_at", n(read))),
            Some(None) => rule.push(absent("due_at")),
            None => {}
        }
        // On the due index while pushes wait (never due unless a grant made it so:
        // `quota::wake`), so a grant given later is a due item in its own commit.
        // (`wake`: due then, for a push that yielded to pushes due together.)
        let entry = quota_change(template, now)
            .set("due_pk", s(due_pk(pk, &quota_sk(template), self.shards)));
        let entry = match wake {
            Some(wake) => entry.set("due_at", n(wake.at.timestamp_millis())),
            None => entry.set_if_absent("due_at", n(WAKE_NEVER_MS)),
        };
        let listed = entry.add(WAITING, AttributeValue::Ss(vec![member.to_string()]));
        update(&self.table, key(pk, &quota_sk(template)), listed)
            .when(all(rule))
            .write()
    }

    /// Wakes the waiting push `member` names: due now (back on the due index), on the
    /// condition that it still waits for a grant. It stays listed until its claim.
    pub(crate) fn wake_write(
        &self,
        pk: &str,
        member: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        self.wake_update(pk, member, None, now)
    }

    /// [`Store::wake_write`] only while the push is not due yet (a push woken already
    /// is left as it is: re-timed, a claim of it under way would lose), the item as it
    /// was returned when not.
    fn wake_fresh(
        &self,
        pk: &str,
        member: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let not_due = absent("due_at").or(compare("due_at", Cmp::Gt, n(now.timestamp_millis())));
        self.wake_update(pk, member, Some(not_due), now)
    }

    fn wake_update(
        &self,
        pk: &str,
        member: &str,
        unless: Option<Cond>,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let sk = outbox_of(member)?;
        let due = change()
            .set("due_pk", s(due_pk(pk, &sk, self.shards)))
            .set("due_at", n(now.timestamp_millis()))
            .set("updated_at", s(rfc3339(now)))
            .add("version", n(1));
        update(&self.table, key(pk, &sk), due)
            .when(all([Some(waits_for_grant()), unless].into_iter().flatten()))
            .old_on_failure()
            .write()
    }

    /// Drops `member` from the template's waiting list, on the condition that its push
    /// no longer waits (gone, or not pending for a grant): a push that began waiting
    /// again meanwhile keeps its place. Whether it was dropped.
    pub(crate) async fn drop_waiting(
        &self,
        pk: &str,
        template: &TemplateId,
        member: &str,
    ) -> Result<bool, StoreError> {
        let gone = absent("pk").or(!waits_for_grant());
        let dropped = change().delete(WAITING, AttributeValue::Ss(vec![member.to_string()]));
        let writes = vec![
            check(&self.table, key(pk, &outbox_of(member)?), gone).write()?,
            update(&self.table, key(pk, &quota_sk(template)), dropped)
                .when(is_there())
                .write()?,
        ];
        Ok(matches!(self.transact(writes).await?, TxOutcome::Committed))
    }

    /// Drops the members of a full waiting list whose push no longer waits (one read
    /// of the listed pushes, at most [`MAX_WAITING`]): how many were dropped.
    pub(crate) async fn prune_waiting(
        &self,
        pk: &str,
        template: &TemplateId,
        waiting: &[String],
    ) -> Result<usize, StoreError> {
        let keys: Vec<(String, &String)> = waiting
            .iter()
            .filter_map(|m| outbox_of(m).ok().map(|sk| (sk, m)))
            .collect();
        let sks: Vec<String> = keys.iter().map(|(sk, _)| sk.clone()).collect();
        let found = self.read_items(pk, &sks).await?;
        let mut dropped = 0;
        for (sk, member) in keys {
            if !found.get(&sk).is_some_and(still_waits)
                && self.drop_waiting(pk, template, member).await?
            {
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// [`Store::wake_waiting`] with its failure logged: the grant is recorded whatever
    /// happens here, and the next grant, claim or expiry of the template moves the
    /// waiting pushes on.
    pub async fn wake_waiting_logged(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) {
        match self.wake_waiting(openid, template, now).await {
            Ok(0) => {}
            Ok(woken) => {
                tracing::info!(woken, template = %template, "pushes waiting for a grant woken")
            }
            Err(e) => tracing::warn!(
                error = %crate::telemetry::error_chain(&e),
                "waking pushes waiting for a grant deferred"
            ),
        }
    }

    /// Wakes as many of the best pushes waiting for a grant of `template` as grants
    /// are available, in one pass over the list (one read of the quota item): a member
    /// whose push no longer waits is dropped and the next one woken in its place.
    /// Idempotent (waking a woken push again only re-times it to now), so a replay may
    /// run it again. How many were woken.
    pub async fn wake_waiting(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        Ok(self.wake_best(&user_pk(openid), template, now).await?.woken)
    }

    /// A template's wake entry come due (`QUOTA#<template>` on the due index: a grant
    /// was given while pushes waited): wakes the best of them as [`Store::wake_waiting`]
    /// does, then puts the entry back to never due — or, the list empty, off the index
    /// — on the condition that it is still as read: a grant given meanwhile left it due,
    /// for the next tick. How many were woken.
    pub async fn wake_due(&self, item: &DueItem, now: DateTime<Utc>) -> Result<usize, StoreError> {
        let template = item
            .sk
            .strip_prefix(crate::store::keys::QUOTA_PREFIX)
            .and_then(|t| TemplateId::parse(t).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("a wake entry of {:?}", item.sk)))?;
        let Woken {
            woken,
            left,
            unresolved,
        } = self.wake_best(&item.pk, &template, now).await?;
        // A wake that met contention neither woke its push nor found it gone: the
        // entry stays due, for the next tick to try again.
        if unresolved > 0 {
            return Ok(woken);
        }
        let never = change().set("due_at", n(WAKE_NEVER_MS));
        let seen = due_as_seen(item.due_at.timestamp_millis());
        let (never, guard) = if left == 0 {
            (never.remove("due_pk"), seen.and(absent(WAITING)))
        } else {
            (never, seen)
        };
        let put_back = update(&self.table, key(&item.pk, &item.sk), never)
            .when(guard)
            .write()?;
        // Cancelled: a grant came (due again) or a push began waiting: as it is.
        self.transact(vec![put_back]).await?;
        Ok(woken)
    }

    /// [`Store::wake_waiting`] on partition `pk` (see [`Woken`]).
    async fn wake_best(
        &self,
        pk: &str,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) -> Result<Woken, StoreError> {
        let Some(quota) = self.get(pk, &quota_sk(template)).await? else {
            return Ok(Woken::default());
        };
        let waiting = OpenGrants::of(&quota).waiting;
        let available = parse::<QuotaCounters>("quota", quota)?.available;
        if waiting.is_empty() || available == 0 {
            return Ok(Woken {
                left: waiting.len(),
                ..Woken::default()
            });
        }
        let mut left = waiting.len();
        let mut woken = 0;
        let mut unresolved = 0;
        for member in best(&waiting, MAX_WAITING as u64) {
            if woken >= available {
                break;
            }
            let wake = Parts::new().with(Beside::Wake, self.wake_fresh(pk, &member, now)?);
            match self.transact_parts(&wake).await? {
                Outcome::Committed => woken += 1,
                // Woken already (due, still waiting): on its way, a grant's worth.
                Outcome::Cancelled(failed) if failed.old(Beside::Wake).is_some_and(still_waits) => {
                    woken += 1;
                }
                // Its push no longer waits: off the list, the next one in its place.
                Outcome::Cancelled(failed) if failed.has(Beside::Wake) => {
                    if self.drop_waiting(pk, template, &member).await? {
                        left = left.saturating_sub(1);
                    }
                }
                // Contention says nothing of the push: it stays on the list.
                Outcome::Cancelled(_) | Outcome::Contended | Outcome::Conflict => unresolved += 1,
            }
        }
        Ok(Woken {
            woken: usize::try_from(woken).unwrap_or(usize::MAX),
            left,
            unresolved,
        })
    }
}

/// What one pass of waking found.
#[derive(Debug, Default)]
struct Woken {
    /// Pushes woken (or found woken already).
    woken: usize,
    /// Members the list held once woken and pruned as it went.
    left: usize,
    /// Wakes that met contention: neither woken nor found gone.
    unresolved: usize,
}
