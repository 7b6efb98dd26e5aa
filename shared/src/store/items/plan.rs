//! The plan item (`PLAN#<kind>`) and the action record of a check-in: stored state
//! in and out, and the plan's conditional Put.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::consent::{PauseReason, Refusal};
use crate::domain::reminders::plan::{Plan, PlanStatus};
use crate::domain::reminders::schedule::{Schedule, TimeOfDay, Timezone};
use crate::domain::reminders::{ReminderKind, Settings};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{check, put, versioned};
use crate::store::items::{at_version, key, rfc3339, to_item};
use crate::store::keys::{due_pk, lease_pk, plan_sk};

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PlanItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) reminder: String,
    pub(crate) template_id: String,
    pub(crate) state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pause_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_due_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) due_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) due_at: Option<i64>,
    pub(crate) interval_minutes: u32,
    pub(crate) wake_time: String,
    pub(crate) sleep_time: String,
    pub(crate) timezone: String,
    pub(crate) daily_goal: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) today_date: Option<String>,
    #[serde(default)]
    pub(crate) today_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_checkin_at: Option<i64>,
    #[serde(default)]
    pub(crate) attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) delivery_id: Option<String>,
    /// While `sending`: on the lease index, so a sweep finds a plan its delivery left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_until: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending_refusal: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) checked_in_while_sending: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) accepted_while_sending: bool,
    /// The per-user check-in rate: the minute (epoch seconds / 60) and its count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checkin_minute: Option<i64>,
    #[serde(default)]
    pub(crate) checkin_minute_count: u32,
    pub(crate) version: u64,
    pub(crate) updated_at: String,
}

fn millis(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("bad instant {ms}")))
}

impl PlanItem {
    fn from_plan(plan: &Plan, pk: &str, shards: u32, version: u64, now: DateTime<Utc>) -> Self {
        let sk = plan_sk(&plan.kind);
        let schedule = &plan.settings.schedule;
        let due = plan.status.due().map(|d| d.timestamp_millis());
        let lease = match plan.status {
            PlanStatus::Sending => plan.lease_until.map(|t| t.timestamp_millis()),
            PlanStatus::Disabled
            | PlanStatus::Scheduled { .. }
            | PlanStatus::AwaitingCheckin
            | PlanStatus::Paused { .. } => None,
        };
        Self {
            pk: pk.to_string(),
            due_pk: due.map(|_| due_pk(pk, &sk, shards)),
            sk,
            kind: "plan".into(),
            reminder: plan.kind.to_string(),
            template_id: plan.template_id.to_string(),
            state: plan.status.name().into(),
            pause_reason: plan.status.pause_reason().map(|r| r.as_str().to_string()),
            next_due_at: due,
            due_at: due,
            interval_minutes: schedule.interval_minutes(),
            wake_time: schedule.wake_time().to_string(),
            sleep_time: schedule.sleep_time().to_string(),
            timezone: schedule.timezone().name().to_string(),
            daily_goal: plan.settings.daily_goal,
            today_date: plan.today.map(|(d, _)| d.format("%Y-%m-%d").to_string()),
            today_count: plan.today.map(|(_, c)| c).unwrap_or(0),
            last_checkin_at: plan.last_checkin_at.map(|t| t.timestamp_millis()),
            attempts: plan.attempts,
            delivery_id: match plan.status {
                PlanStatus::Sending => plan.delivery_id.clone(),
                PlanStatus::Paused {
                    reason: PauseReason::Uncertain,
                } => plan.delivery_id.clone(),
                PlanStatus::Disabled
                | PlanStatus::Scheduled { .. }
                | PlanStatus::AwaitingCheckin
                | PlanStatus::Paused { .. } => None,
            },
            lease_pk: lease
                .map(|_| lease_pk(plan.delivery_id.as_deref().unwrap_or_default(), shards)),
            lease_until: lease,
            // Kept while a send is in flight (applied when it ends) and while the plan
            // is off (applied when it is turned on).
            pending_refusal: match plan.status {
                PlanStatus::Sending | PlanStatus::Disabled => {
                    plan.pending_refusal.map(|r| r.as_str().to_string())
                }
                PlanStatus::Scheduled { .. }
                | PlanStatus::AwaitingCheckin
                | PlanStatus::Paused { .. } => None,
            },
            checked_in_while_sending: plan.status == PlanStatus::Sending
                && plan.checked_in_while_sending,
            accepted_while_sending: plan.status == PlanStatus::Sending
                && plan.accepted_while_sending,
            checkin_minute: plan.checkins_in_minute.map(|(m, _)| m),
            checkin_minute_count: plan.checkins_in_minute.map_or(0, |(_, c)| c),
            version,
            updated_at: rfc3339(now),
        }
    }

    /// The stored plan of `kind` (`item`), or, never stored, its defaults (disabled).
    pub(crate) fn or_new(item: Option<Self>, kind: &ReminderKind) -> Result<Plan, StoreError> {
        match item {
            Some(item) => item.into_plan(kind),
            None => Ok(Plan::new(kind)),
        }
    }

    pub(crate) fn into_plan(self, kind: &ReminderKind) -> Result<Plan, StoreError> {
        let bad = |what: &str| StoreError::Corrupt(format!("plan {}: {what}", self.sk));
        let status = match self.state.as_str() {
            "disabled" => PlanStatus::Disabled,
            "scheduled" => PlanStatus::Scheduled {
                due: millis(
                    self.next_due_at
                        .ok_or_else(|| bad("scheduled without next_due_at"))?,
                )?,
            },
            "sending" => PlanStatus::Sending,
            "awaiting_checkin" => PlanStatus::AwaitingCheckin,
            "paused" => PlanStatus::Paused {
                reason: self
                    .pause_reason
                    .as_deref()
                    .and_then(PauseReason::parse)
                    .ok_or_else(|| bad("paused without a known reason"))?,
            },
            other => return Err(bad(&format!("unknown state {other:?}"))),
        };
        let schedule = Schedule::new(
            self.interval_minutes,
            TimeOfDay::parse(&self.wake_time, "wake_time").map_err(|_| bad("wake_time"))?,
            TimeOfDay::parse(&self.sleep_time, "sleep_time").map_err(|_| bad("sleep_time"))?,
            Timezone::parse(&self.timezone).map_err(|_| bad("timezone"))?,
        )
        .map_err(|_| bad("schedule"))?;
        let today = match self.today_date {
            None => None,
            Some(d) => Some((
                NaiveDate::parse_from_str(&d, "%Y-%m-%d").map_err(|_| bad("today_date"))?,
                self.today_count,
            )),
        };
        Ok(Plan {
            kind: kind.name.clone(),
            template_id: kind.template_id.clone(),
            status,
            settings: Settings {
                schedule,
                daily_goal: self.daily_goal,
            },
            today,
            last_checkin_at: self.last_checkin_at.map(millis).transpose()?,
            attempts: self.attempts,
            delivery_id: self.delivery_id,
            lease_until: self.lease_until.map(millis).transpose()?,
            pending_refusal: match self.pending_refusal.as_deref() {
                None => None,
                Some(name) => Some(Refusal::parse(name).ok_or_else(|| bad("pending_refusal"))?),
            },
            checked_in_while_sending: self.checked_in_while_sending,
            accepted_while_sending: self.accepted_while_sending,
            checkins_in_minute: self.checkin_minute.map(|m| (m, self.checkin_minute_count)),
            version: self.version,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ActionItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) reminder: String,
    pub(crate) fingerprint: String,
    pub(crate) response: String,
    pub(crate) created_at: String,
    pub(crate) expires_at: i64,
}

impl Store {
    pub(crate) fn plan_put(
        &self,
        plan: &Plan,
        pk: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let item = PlanItem::from_plan(plan, pk, self.shards, plan.version + 1, now);
        let item = to_item("plan", &item)?;
        put(&self.table, item)
            .when(versioned(plan.version))
            .old_on_failure()
            .write()
    }

    /// The write of a plan moved from `before` to `plan`: put if it changed; else, if
    /// it is stored, a check that it is still at its version (a write racing this one
    /// is then ordered by the plan's version, not by chance); None for a plan never
    /// stored that stays so.
    pub(crate) fn plan_write(
        &self,
        pk: &str,
        before: &Plan,
        plan: &Plan,
        now: DateTime<Utc>,
    ) -> Result<Option<TransactWriteItem>, StoreError> {
        Ok(if plan != before {
            Some(self.plan_put(plan, pk, now)?)
        } else if plan.version > 0 {
            Some(self.plan_unchanged(pk, plan)?)
        } else {
            None
        })
    }

    /// A transaction item that only checks `plan` is still at the version it was read.
    pub(crate) fn plan_unchanged(
        &self,
        pk: &str,
        plan: &Plan,
    ) -> Result<TransactWriteItem, StoreError> {
        check(
            &self.table,
            key(pk, &plan_sk(&plan.kind)),
            at_version(plan.version),
        )
        .write()
    }
}
