//! Plans moved by a user's choice: a grant report's first application, and a
//! refusal WeChat told of.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};

use crate::domain::consent::Refusal;
use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::{OpenId, SubscribeResult, TemplateId};
use crate::store::items::parse;
use crate::store::items::plan::PlanItem;
use crate::store::keys::{plan_sk, user_pk};
use crate::store::tx::TxOutcome;
use crate::store::{Attempt, Store, StoreError, retry_contended};

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
            plan.reported(result, now)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            writes.push(if plan != before {
                self.plan_put(&plan, pk, now)?
            } else if plan.version > 0 {
                // Unchanged, but read: a report racing this one is ordered by the
                // plan's version, not by chance.
                self.plan_unchanged(pk, &plan)?
            } else {
                continue;
            });
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
            let mut plan = match read.plan {
                Some(item) => item.into_plan(kind)?,
                None => Plan::new(kind),
            };
            let before = plan.clone();
            plan.refuse(refusal)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if plan == before {
                return Ok(Attempt::Done(()));
            }
            Ok(
                match self.transact(vec![self.plan_put(&plan, pk, now)?]).await? {
                    TxOutcome::Committed => Attempt::Done(()),
                    TxOutcome::Cancelled(_) | TxOutcome::Contended => Attempt::Retry,
                },
            )
        })
        .await
    }
}
