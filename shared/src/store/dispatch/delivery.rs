//! The delivery item as stored, and the reads and rules the settling steps share:
//! its plan as read, and whether a void may give a grant back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::dispatch::delivery::{Delivery, Guard};
use crate::domain::reminders::ReminderKind;
use crate::domain::reminders::plan::Plan;
use crate::domain::settle::{DeliveryState, KeptAnswer, OutcomeClass, SendResult};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::expr::{Cond, absent, all, eq, exists, is_in};
use crate::store::items::quota::OpenGrants;
use crate::store::items::{n, parse, s};
use crate::store::keys::plan_sk;

/// The stored delivery: one send attempt and everything known about it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DeliveryItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) delivery_id: String,
    pub(crate) state: DeliveryState,
    /// The sort key of what was claimed: `PLAN#<kind>` or `OUTBOX#<note id>`.
    pub(crate) source: String,
    pub(crate) template_id: String,
    pub(crate) grant_sk: String,
    pub(crate) claimer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_until: Option<i64>,
    pub(crate) due_at: i64,
    pub(crate) claimed_at: String,
    /// The claimed item's retryable failures in a row before this send.
    #[serde(default)]
    pub(crate) attempts: u32,
    /// The outcome class, once settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) errcode: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) msgid: Option<String>,
    /// When a sweep declared the send `unknown` (kept when a late answer settles it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) swept_at: Option<String>,
    /// What the sweep decided, in a few words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sweep_outcome: Option<String>,
    /// When WeChat's answer arrived after the sweep and settled the delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) answered_late_at: Option<String>,
    /// When the claim was given back unsent, for want of time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) released_at: Option<String>,
    /// WeChat's definite answer, kept by a finalize that could not commit in time: the
    /// sweep settles by it instead of `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kept_answer: Option<KeptAnswer>,
    /// Settled 43101 with the template's other grants not yet voided: the delivery
    /// stays on the lease index until they are, so a sweep finishes what a crash or a
    /// throttled database left.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) void_others: bool,
    /// Under a daily cap, the user's day the claim counted its send on: a grant given
    /// back unsent gives the count back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) counted_on: Option<chrono::NaiveDate>,
}

impl DeliveryItem {
    /// When it was claimed (`fallback` for an item whose time cannot be read).
    pub(crate) fn claimed_at(&self, fallback: DateTime<Utc>) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(&self.claimed_at)
            .map(|at| at.with_timezone(&Utc))
            .unwrap_or(fallback)
    }

    /// The delivery as the domain reads it (its rules: [`Delivery`]).
    pub(crate) fn delivery(&self) -> Delivery {
        Delivery {
            id: self.delivery_id.clone(),
            state: self.state,
            claimer: self.claimer.clone(),
            template_id: self.template_id.clone(),
            lease_until: self.lease_until,
            due_at: self.due_at,
            attempts: self.attempts,
            class: self.class.as_deref().and_then(OutcomeClass::parse),
            errcode: self.errcode,
            msgid: self.msgid.clone(),
            swept: self.swept_at.is_some(),
            answered_late: self.answered_late_at.is_some(),
            released: self.released_at.is_some(),
            kept_answer: self.kept_answer.clone(),
            void_others: self.void_others,
        }
    }
}

/// What `guard` admits, as a condition on the stored delivery: the one statement of
/// each guard's rule, which every settlement's delivery update (and a kept answer)
/// writes and the store can check on a delivery it read. Its test holds it to
/// [`Guard::admits`], the domain's reading of the same rule, on every shape of item.
pub(crate) fn admitted_by(guard: Guard<'_>) -> Cond {
    let live = || {
        is_in(
            "state",
            vec![
                s(DeliveryState::Claimed.as_str()),
                s(DeliveryState::Sending.as_str()),
            ],
        )
    };
    let unknown = || eq("state", s(DeliveryState::Unknown.as_str()));
    match guard {
        Guard::Claimer(claimer) => live().and(eq("claimer", s(claimer))),
        Guard::ExpiredLease(until) => live().and(eq("lease_until", n(until))),
        Guard::Swept(claimer) => all([
            unknown(),
            eq("claimer", s(claimer)),
            exists("swept_at"),
            absent("answered_late_at"),
        ]),
        Guard::Unknown => unknown(),
    }
}

/// A send result in a few words, for the delivery and the notification. Never
/// WeChat's errmsg (it carries a request id) nor an HTTP client's error text.
pub(crate) fn describe(result: &SendResult) -> String {
    match result {
        SendResult::Sent { .. } => "sent".to_string(),
        SendResult::Refused { errcode, .. } => format!("errcode {errcode}"),
        SendResult::Uncertain { reason } => format!("uncertain: {reason}"),
        SendResult::NotSent { reason } => format!("not sent: {reason}"),
        SendResult::Invalid { reason } => format!("invalid content: {reason}"),
    }
}

/// A plan as the dispatcher reads it.
// (A read's transient result, moved once: its size does not matter.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum PlanRead {
    /// The plan, its template's counters and open grants, and the user's preferences
    /// when asked for.
    Found(
        Box<Plan>,
        crate::domain::QuotaCounters,
        OpenGrants,
        Option<Box<crate::domain::inbox::preferences::Preferences>>,
    ),
    Missing,
    /// The plan item itself cannot be read: why.
    Unreadable(String),
}

impl Store {
    /// The user's plan of `kind` and its template's counters (one read; with the
    /// user's preferences when `preferences`), telling a plan item that is itself
    /// unreadable apart from a failure of anything else.
    pub(crate) async fn read_plan(
        &self,
        pk: &str,
        kind: &ReminderKind,
        preferences: bool,
    ) -> Result<PlanRead, StoreError> {
        let read = if preferences {
            self.read_with_preferences(pk, kind).await
        } else {
            self.read(pk, kind, None).await
        };
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                // Is it the plan item, or a neighbour in the read (or the database)?
                let Some(item) = self.get(pk, &plan_sk(&kind.name)).await? else {
                    return Err(e);
                };
                return match parse::<crate::store::items::plan::PlanItem>("plan", item)
                    .and_then(|plan| plan.into_plan(kind))
                {
                    Ok(_) => Err(e),
                    Err(why) => Ok(PlanRead::Unreadable(why.to_string())),
                };
            }
        };
        let Some(item) = read.plan else {
            return Ok(PlanRead::Missing);
        };
        Ok(match item.into_plan(kind) {
            Ok(plan) => PlanRead::Found(
                Box::new(plan),
                read.counters,
                read.open,
                read.preferences.map(Box::new),
            ),
            Err(why) => PlanRead::Unreadable(why.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::items::Item;

    /// Every shape of stored delivery the guards tell apart: the condition each guard
    /// writes holds exactly where the domain's reading of it admits.
    #[test]
    fn each_guards_condition_holds_where_the_domain_admits_it() {
        use DeliveryState::*;
        let mut checked = 0;
        for state in [Claimed, Sending, Sent, Failed, Unknown] {
            for claimer in ["c1", "c2"] {
                for lease in [None, Some(5), Some(6)] {
                    for swept in [false, true] {
                        for late in [false, true] {
                            let mut item: Item = [
                                ("pk", s("USER#o")),
                                ("sk", s("DELIVERY#d")),
                                ("kind", s("delivery")),
                                ("delivery_id", s("d")),
                                ("state", s(state.as_str())),
                                ("source", s("PLAN#water")),
                                ("template_id", s("t")),
                                ("grant_sk", s("GRANT#t#1")),
                                ("claimer", s(claimer)),
                                ("due_at", n(1)),
                                ("claimed_at", s("2026-12-06T00:00:00.000Z")),
                            ]
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect();
                            if let Some(until) = lease {
                                item.insert("lease_until".into(), n(until));
                            }
                            if swept {
                                item.insert("swept_at".into(), s("x"));
                            }
                            if late {
                                item.insert("answered_late_at".into(), s("x"));
                            }
                            let delivery = parse::<DeliveryItem>("delivery", item.clone())
                                .expect("a delivery")
                                .delivery();
                            for guard in [
                                Guard::Claimer("c1"),
                                Guard::ExpiredLease(5),
                                Guard::Swept("c1"),
                                Guard::Unknown,
                            ] {
                                assert_eq!(
                                    admitted_by(guard).holds(&item),
                                    guard.admits(&delivery),
                                    "{guard:?} on {item:?}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 5 * 2 * 3 * 2 * 2 * 4);
    }
}
