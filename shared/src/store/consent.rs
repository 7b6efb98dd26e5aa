//! Plans moved by a user's choice: a grant report's first application, a refusal
//! WeChat told of, and the standing choices of the user's settings.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::consent::Refusal;
use crate::domain::consent::standing::{Standing, SubscriptionsSetting};
use crate::domain::rate::setting_places;
use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::{OpenId, SubscribeResult, TemplateId};
use crate::store::error::{Limit, StoreError};
use crate::store::handle::Store;
use crate::store::items::parse;
use crate::store::items::plan::PlanItem;
use crate::store::items::quota::STANDING;
use crate::store::items::rate::{Counter, rate_key};
use crate::store::items::setting::{SETTING_SK, decided_at};
use crate::store::keys::{plan_sk, quota_sk, user_pk};
use crate::store::retry::{Attempt, retry_contended};
use crate::store::tx::{Outcome, Parts};

impl Store {
    /// The plan writes a report's first application makes: for each template it
    /// records, the plans of the kinds that use it, moved by the domain's
    /// [`Plan::reported`] (an unchanged one checked at its version). A plan never
    /// stored is written only to remember a refusal. One read of the plans (none when
    /// no kind uses the templates).
    pub(crate) async fn report_plans(
        &self,
        pk: &str,
        pending: &BTreeMap<TemplateId, SubscribeResult>,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let kinds = &*self.kinds;
        let touched: Vec<(&ReminderKind, SubscribeResult)> = pending
            .iter()
            .filter(|(_, result)| result.grants() || result.refuses())
            .flat_map(|(template, result)| {
                kinds
                    .using_template(template)
                    .map(move |kind| (kind, *result))
            })
            .collect();
        if touched.is_empty() {
            return Ok(Vec::new());
        }
        let sks: Vec<String> = touched.iter().map(|(k, _)| plan_sk(&k.name)).collect();
        let mut stored = self.read_items(pk, &sks).await?;
        let mut writes = Vec::new();
        for (kind, result) in touched {
            // A plan never stored still keeps a refusal (it is written, off, with the
            // refusal remembered, conditional on not existing): turning it on later
            // finds it paused, whatever grants were given before.
            let mut plan = match stored.remove(&plan_sk(&kind.name)) {
                Some(item) => parse::<PlanItem>("plan", item)?.into_plan(kind)?,
                None if result.refuses() => Plan::new(kind),
                None => continue,
            };
            let before = plan.clone();
            plan.reported(result, now)?;
            writes.extend(self.plan_write(pk, &before, &plan, now)?);
        }
        Ok(writes)
    }

    /// WeChat told of a refusal of the kind's template (a popup reject, a change
    /// event): the plan pauses, as a refusal in a grant report does (a plan never
    /// stored is written off, the refusal remembered). Applied once per event (the
    /// event's record says so), and a refusal applied twice changes nothing.
    pub async fn refuse_plan(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        refusal: Refusal,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let pk = &user_pk(openid);
        retry_contended("plan refusal", self.limits.write_budget, || async move {
            let read = self.read(pk, kind, None).await?;
            // A plan never stored is written, off, with the refusal remembered.
            let mut plan = PlanItem::or_new(read.plan, kind)?;
            let before = plan.clone();
            plan.refuse(refusal)?;
            if plan == before {
                return Ok(Attempt::Done(()));
            }
            self.commit_or_retry(vec![self.plan_put(&plan, pk, now)?], ())
                .await
        })
        .await
    }
}

impl Store {
    /// The user's standing choices, as a report or check-in carried them
    /// ([`SubscriptionsSetting`]): each configured template's quota item keeps its
    /// standing choice (`standing`, written only when it changes), and the plans of the
    /// kinds that use it move by [`Plan::stand`] (a plan never stored is written, off,
    /// only to remember a refusing one). One read of the quota and plan items, then one
    /// transaction for every template whose items change (split only past 98 items),
    /// conditional on everything as read (each standing choice and every plan's
    /// version), so a choice is applied to every template or none, and two settings
    /// racing leave the quotas and their plans agreeing; a race reads again. A setting
    /// that changes anything counts against the user's `REPORTS_PER_MINUTE` as one
    /// report, however many templates it changes ([`setting_places`]; none on a grant
    /// report, whose own place covers it), so settings cannot be written faster than
    /// reports and no setting needs more places than the limit has: its place and
    /// `reserve` more (the request's own counted write, after it) must fit in the
    /// minute as read, or nothing is written (`Limited`, and a retry in a later minute
    /// fits).
    ///
    /// Settings apply in the order they were read, not as they arrive
    /// ([`SubscriptionsSetting::supersedes`]): the user's `SETTING` item keeps when the
    /// newest one applied was read, and a setting read before it changes nothing
    /// ([`Stood::Stale`]); a newer one is recorded there (with its changes, in their
    /// last transaction, conditional on the item as read), also when it changes nothing
    /// else — one small write — so a stale one arriving after it is known stale. The
    /// caller applies a request's setting only on its first application: a replay
    /// changes nothing.
    pub async fn stand(
        &self,
        openid: &OpenId,
        setting: &SubscriptionsSetting,
        reserve: u64,
        now: DateTime<Utc>,
    ) -> Result<Stood, StoreError> {
        let pk = &user_pk(openid);
        retry_contended("standing choice", self.limits.write_budget, || async move {
            let mut sks: Vec<String> = setting.standings().map(|(t, _)| quota_sk(t)).collect();
            sks.extend(self.kinds.iter().map(|k| plan_sk(&k.name)));
            let rate = rate_key(now);
            sks.push(rate.clone());
            sks.push(SETTING_SK.to_string());
            let mut stored = self.read_items(pk, &sks).await?;
            let decided = decided_at(stored.get(SETTING_SK))?;
            if !setting.supersedes(decided, now) {
                tracing::info!(
                    openid = %crate::telemetry::openid_hash(openid.as_str()),
                    read_at = %setting.read_at(now),
                    "a setting read before the one applied changes nothing"
                );
                return Ok(Attempt::Done(Stood::Stale));
            }
            let mark = self.setting_put(pk, decided, setting.read_at(now), now)?;
            let mut changes = Vec::new();
            for (template, standing) in setting.standings() {
                let kept = match stored.get(&quota_sk(template)) {
                    Some(item) => stored_standing(item)?,
                    None => None,
                };
                let mut changed = kept != standing;
                let mut plans = Vec::new();
                for kind in self.kinds.using_template(template) {
                    let stored_plan = stored.remove(&plan_sk(&kind.name));
                    let stored_plan = stored_plan.map(|i| parse::<PlanItem>("plan", i));
                    let mut plan = PlanItem::or_new(stored_plan.transpose()?, kind)?;
                    let before = plan.clone();
                    plan.stand(standing)?;
                    changed |= plan != before;
                    plans.extend(self.plan_write(pk, &before, &plan, now)?);
                }
                if !changed {
                    continue;
                }
                let mut writes = vec![if kept != standing {
                    self.standing_put(pk, template, kept, standing, now)?
                } else {
                    self.standing_check(pk, template, kept)?
                }];
                writes.extend(plans);
                changes.push(writes);
            }
            // The setting's place (one, whatever it changes) and the `reserve` places
            // the request's own write needs after it fit in the minute — or nothing
            // is written.
            let n = setting_places(changes.len(), reserve);
            self.rate_admits_n(
                Counter::Reports,
                stored.get(&rate),
                n.saturating_add(reserve),
                now,
            )?;
            // Every template's change in one transaction with the minute's count of
            // them, so a choice (the main switch off above all) holds for every
            // template or for none; split only where the configuration names more
            // templates and plans than one transaction holds, the whole count then
            // riding in the first (a later one is never refused by the minute).
            // Nothing else changes: the mark alone (the request itself is counted).
            if changes.is_empty() {
                return self.commit_or_retry(vec![mark], Stood::Applied).await;
            }
            let (rate, retry_after) = self.report_rate(pk, n, now)?;
            let mut rate = Some(rate);
            let mut batches = batched(changes);
            // The mark rides with the last batch: a retry after an earlier one
            // committed still finds the setting newer, and applies the rest; every
            // earlier one is conditional on the mark as read, so a setting that turned
            // stale meanwhile writes nothing more.
            let last = batches.len().saturating_sub(1);
            for (i, batch) in batches.iter_mut().enumerate() {
                batch.push(if i == last {
                    mark.clone()
                } else {
                    self.setting_check(pk, decided)?
                });
            }
            for batch in batches {
                let mut writes = Parts::new();
                for write in batch {
                    writes.add(Setting::Change, write);
                }
                if let Some(rate) = rate.take() {
                    writes.add(Setting::Rate, rate);
                }
                match self.transact_parts(&writes).await? {
                    Outcome::Committed => {}
                    Outcome::Cancelled(failed) if failed.has(Setting::Rate) => {
                        return Err(StoreError::Limited(Limit::Rate { retry_after }));
                    }
                    // Something moved since the read: read again (templates done
                    // already change nothing the next time).
                    Outcome::Cancelled(_) | Outcome::Contended | Outcome::Conflict => {
                        return Ok(Attempt::Retry);
                    }
                }
            }
            Ok(Attempt::Done(Stood::Applied))
        })
        .await
    }
}

/// The parts of a standing choice's transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    /// A template's standing change, a plan it moves, or the setting's mark.
    Change,
    /// The minute's count of reports (with the first transaction).
    Rate,
}

/// What became of a standing choice ([`Store::stand`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stood {
    /// It was the newest read: the user's standing choices are the setting's.
    Applied,
    /// A setting read after it was applied already: it changed nothing.
    Stale,
}

/// Items one transaction holds (100), less the minute's count, the setting's mark and
/// the audit trail's history entry that go with them.
const TRANSACTION_ROOM: usize = 97;

/// Each template's writes packed into as few transactions as hold them (a template's
/// writes never split).
fn batched(changes: Vec<Vec<TransactWriteItem>>) -> Vec<Vec<TransactWriteItem>> {
    let mut batches: Vec<Vec<TransactWriteItem>> = Vec::new();
    for writes in changes {
        match batches.last_mut() {
            Some(batch) if batch.len() + writes.len() <= TRANSACTION_ROOM => batch.extend(writes),
            _ => batches.push(writes),
        }
    }
    batches
}

/// The standing choice a quota item keeps, if any.
fn stored_standing(item: &HashMap<String, AttributeValue>) -> Result<Option<Standing>, StoreError> {
    match item.get(STANDING) {
        None => Ok(None),
        Some(value) => value
            .as_s()
            .ok()
            .and_then(|s| Standing::parse(s))
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt(format!("bad standing {value:?}"))),
    }
}
