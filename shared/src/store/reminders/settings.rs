//! `PUT /v1/reminders/{kind}`: settings, enable and disable.

use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::reminders::{ReminderKind, SettingsUpdate, settings};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::rate::Counter;
use crate::store::keys::user_pk;
use crate::store::reminders::PlanSnapshot;
use crate::store::retry::{Attempt, retry_carrying};
use crate::store::tx::TxOutcome;

impl Store {
    /// `PUT /v1/reminders/{kind}`: applies new settings and enables or disables the plan.
    /// Disabling invalidates every unconsumed grant of the kind's template. A save tried
    /// again after its write that finds the plan changed since by another
    /// (`settings::overtaken`) ends with the plan as stored: the later save stands.
    pub async fn save_settings(
        &self,
        openid: &OpenId,
        kind: &ReminderKind,
        update: &SettingsUpdate,
        now: DateTime<Utc>,
    ) -> Result<PlanSnapshot, StoreError> {
        let pk = &user_pk(openid);
        // The plan's version once this save's write lands, or the version its voids
        // were checked at (0: none tried yet).
        let carried = retry_carrying(
            "plan settings",
            self.limits.write_budget,
            0,
            |mut tried: u64| async move {
                let decided = async {
                    let read = self.read_counted(pk, kind, now).await?;
                    let stored = match read.plan {
                        Some(item) => Some(item.into_plan(kind)?),
                        None => None,
                    };
                    let written = Some(tried).filter(|v| *v > 0);
                    if settings::overtaken(stored.as_ref(), written)
                        && let Some(plan) = stored
                    {
                        // Another save landed after this one's write: it stands.
                        return Ok(Attempt::Done(PlanSnapshot {
                            plan,
                            counters: read.counters,
                        }));
                    }
                    let decision = settings::decide(stored, kind, read.counters, update, now)?;
                    if !decision.changes {
                        // Nothing to write: not even the audit trail's entry, nor a count.
                        return Ok(Attempt::Done(PlanSnapshot {
                            plan: decision.plan,
                            counters: decision.counters,
                        }));
                    }
                    // A turn-off that only voids grants left open (the plan already off as
                    // stored) writes and counts nothing more than the grants: checked at the
                    // plan's version instead.
                    if !decision.writes_plan {
                        debug_assert!(
                            decision.voids_grants,
                            "only a turn-off leaves the plan as stored"
                        );
                        // Not counted nor refused by the minute's changes: it may be the retry
                        // of a turn-off that took the minute's last place, and it writes only
                        // grants an earlier turn-off left open or grants given since (those
                        // limited by REPORTS_PER_MINUTE).
                        let check = self.plan_unchanged(pk, &decision.plan)?;
                        // (Acting on the plan at its version as read: a plan found past it later
                        // was changed by another save, which stands.)
                        tried = decision.plan.version;
                        let committed = self
                            .invalidate_grants(pk, &kind.template_id, vec![check], true, None, now)
                            .await?;
                        return Ok(if committed {
                            Attempt::Done(PlanSnapshot {
                                plan: decision.plan,
                                counters: decision.counters,
                            })
                        } else {
                            Attempt::Retry
                        });
                    }
                    // Past the minute's changes: refused on the read, before any write.
                    self.rate_admits(Counter::Changes, read.rate.as_ref(), now)?;
                    let put = self.plan_put(&decision.plan, pk, now)?;
                    tried = decision.plan.version + 1;
                    let rate = self.rate_count(Counter::Changes, pk, now)?;
                    // (A transaction refused by the counter's condition alone is retried: the
                    // next read finds the minute used up and refuses.)
                    let committed = if decision.voids_grants {
                        self.invalidate_grants(
                            pk,
                            &kind.template_id,
                            vec![put, rate],
                            true,
                            None,
                            now,
                        )
                        .await?
                    } else {
                        let mut items = vec![put, rate];
                        if decision.checks_grant {
                            items.push(self.grant_check(pk, kind)?);
                        }
                        matches!(self.transact(items).await?, TxOutcome::Committed)
                    };
                    if !committed {
                        return Ok(Attempt::Retry);
                    }
                    Ok(Attempt::Done(PlanSnapshot {
                        plan: decision.plan.written(),
                        counters: decision.counters,
                    }))
                }
                .await;
                (decided, tried)
            },
        )
        .await;
        carried.0
    }
}
