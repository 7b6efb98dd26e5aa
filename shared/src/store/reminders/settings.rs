//! `PUT /v1/reminders/{kind}`: settings, enable and disable.

use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::reminders::plan::{Plan, PlanStatus};
use crate::domain::reminders::{ReminderKind, SettingsUpdate};
use crate::store::keys::user_pk;
use crate::store::reminders::PlanSnapshot;
use crate::store::tx::TxOutcome;
use crate::store::{Attempt, Store, StoreError, retry_contended};

impl Store {
    /// `PUT /v1/reminders/{kind}`: applies new settings and enables or disables the plan.
    /// Disabling invalidates every unconsumed grant of the kind's template.
    pub async fn save_settings(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        update: &SettingsUpdate,
        now: DateTime<Utc>,
    ) -> Result<PlanSnapshot, StoreError> {
        let pk = &user_pk(openid);
        retry_contended("plan settings", self.limits.write_budget, || async move {
            let read = self.read(pk, kind, None).await?;
            let mut plan = match read.plan {
                Some(item) => item.into_plan(kind)?,
                None => Plan::new(kind),
            };
            let mut counters = read.counters;
            plan.settings = update.settings;
            let moved = if update.enabled {
                let anchor = plan.last_checkin_at.unwrap_or(now);
                let due = plan.next_due(anchor, plan.settings.daily_goal, now);
                plan.enable(counters.available > 0, due)
            } else {
                plan.disable()
            };
            moved.map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let put = self.plan_put(&plan, pk, now)?;
            let committed = if update.enabled {
                let mut items = vec![put];
                if matches!(plan.status, PlanStatus::Scheduled { .. }) {
                    items.push(self.grant_check(pk, kind)?);
                }
                matches!(self.transact(items).await?, TxOutcome::Committed)
            } else {
                let done = self
                    .invalidate_grants(pk, &kind.template_id, Some(put), true, None, now)
                    .await?;
                if done {
                    counters.invalid += counters.available + counters.reserved;
                    counters.available = 0;
                    counters.reserved = 0;
                }
                done
            };
            if !committed {
                return Ok(Attempt::Retry);
            }
            plan.version += 1;
            Ok(Attempt::Done(PlanSnapshot { plan, counters }))
        })
        .await
    }
}
