//! The quota item (`QUOTA#<template>`): its counters, its lists of open grants and
//! of marks, and the writes that move them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem, Update};
use chrono::{DateTime, Utc};

use crate::domain::consent::standing::Standing;
use crate::domain::dispatch::cap::SentDays;
use crate::domain::grants::open::OpenGrantIds;
use crate::domain::grants::report::{CounterChange, TemplateWrite};
use crate::domain::reconcile::Mark;
use crate::domain::reminders::ReminderKind;
use crate::domain::{QuotaCounters, RequestId, TemplateId};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{Change, Changing, change, check, update};
use crate::store::items::expr::{Cmp, Cond, absent, compare, eq, is_in};
use crate::store::items::{is_there, key, n, parse, rfc3339, s, to_item};
use crate::store::keys::{QUOTA_PREFIX, quota_sk};

/// The quota item's set of the request ids of its `available` grants: a claim picks
/// one from it and invalidation reads it, so neither touches the grant history.
pub(crate) const OPEN_AVAILABLE: &str = "open_available";
/// The quota item's set of the request ids of its `reserved` grants.
pub(crate) const OPEN_RESERVED: &str = "open_reserved";
/// When the template's grants were last voided on purpose (a disable, a refusal,
/// 43101), epoch ms: a grant the sweep voided for a send claimed before that is never
/// given back by the send's late answer.
pub(crate) const VOIDED_AT: &str = "voided_at";
/// WeChat's time (`CreateTime`, epoch seconds) of the newest popup or change event
/// applied for the template: an event older than it changes nothing (WeChat's order,
/// not arrival order, decides).
pub(crate) const CHOICE_AT: &str = "choice_at";
/// The quota item's marks of sends whose outcome is unknown, for WeChat's sent event
/// to settle ([`Mark`](crate::domain::reconcile::Mark): claim time, delivery id).
pub(crate) const OPEN_UNKNOWN: &str = "open_unknown";
/// The quota item's marks of sends recorded `sent` whose sent event has not come yet
/// (record time, msgid), so that event is never taken for an unknown send's.
pub(crate) const SENT_MARKS: &str = "sent_marks";
/// The quota item's marks of sends in flight (claim time, delivery id): a sent event
/// arriving meanwhile may be theirs.
pub(crate) const INFLIGHT: &str = "inflight";
/// The quota item's sent events kept for when a send in flight settles (create time,
/// `<msgid>:<errcode>`).
pub(crate) const PENDING_EVENTS: &str = "pending_events";

/// The prefix of the quota item's daily counts of sends (`sent_on_20261202`), kept
/// while a daily cap is configured (`domain::dispatch::cap`).
const SENT_ON: &str = "sent_on_";

/// The quota item's attribute counting the sends of `day`.
pub(crate) fn sent_on(day: chrono::NaiveDate) -> String {
    format!("{SENT_ON}{}", day.format("%Y%m%d"))
}

/// The quota item's daily counts of sends.
fn sent_days(quota: &HashMap<String, AttributeValue>) -> SentDays {
    quota
        .iter()
        .filter_map(|(name, value)| {
            let day = name.strip_prefix(SENT_ON)?;
            let day = chrono::NaiveDate::parse_from_str(day, "%Y%m%d").ok()?;
            let count = value.as_n().ok()?.parse::<i64>().ok()?;
            Some((day, count))
        })
        .collect()
}

/// The template's standing choice in the user's settings, as last reported
/// (`domain::consent::standing::Standing`); absent while none is kept.
pub(crate) const STANDING: &str = "standing";

/// A change of the quota item of `template`: its identity set (so an update may create
/// it) and its time.
pub(crate) fn quota_change(template: &TemplateId, now: DateTime<Utc>) -> Change {
    change()
        .set("template_id", s(template.as_str()))
        .set("kind", s("quota"))
        .set("updated_at", s(rfc3339(now)))
}

/// The template's standing choice does not refuse it: none kept, or one that does not
/// ([`Standing::refuses`]).
pub(crate) fn unrefused() -> Cond {
    let refusing = Standing::ALL
        .into_iter()
        .filter(|s| s.refuses())
        .map(|s| AttributeValue::S(s.as_str().into()))
        .collect();
    absent(STANDING).or(!is_in(STANDING, refusing))
}

/// The template has a grant available. Its negation is "still no grant" (a missing
/// count is none).
pub(crate) fn has_grant() -> Cond {
    compare("available", Cmp::Gt, n(0))
}

/// The user's day `day` counts fewer sends than `cap`. Its negation is "still capped".
pub(crate) fn under_daily_cap(day: chrono::NaiveDate, cap: u32) -> Cond {
    let count = sent_on(day);
    absent(count.clone()).or(compare(count, Cmp::Lt, n(i64::from(cap))))
}

/// The count `name` is `value` (a zero count may be no attribute at all).
pub(crate) fn count_is(name: &str, value: u64) -> Cond {
    let is = eq(name, n(value));
    if value == 0 { absent(name).or(is) } else { is }
}

/// The template holds fewer open grants than `max` (`MAX_OPEN_GRANTS`): room for one
/// more.
pub(crate) fn room_for_a_grant(max: u32) -> Cond {
    absent("available").or(compare("available", Cmp::Lt, n(max)))
}

/// The template's grants were not voided on purpose since `claimed_ms` (epoch ms).
pub(crate) fn not_voided_since(claimed_ms: i64) -> Cond {
    absent(VOIDED_AT).or(compare(VOIDED_AT, Cmp::Lt, n(claimed_ms)))
}

/// The pushes of the template waiting for a grant (`domain::dispatch::priority`'s
/// members: `<rank>:<note id>`, best first when sorted).
pub(crate) const WAITING: &str = "waiting";

/// The quota item's wake entry on the due index (`due_pk`, `due_at`): on the index
/// while pushes wait for a grant of the template (a wait puts it there, never due —
/// [`WAKE_NEVER_MS`] — unless due already), and due at once by every write that gives
/// a grant (recorded, or given back by a settlement): so a grant beside waiting pushes
/// is a due item in the same commit, and the dispatcher wakes them
/// (`Store::wake_due`) even when the writer's own wake never ran (a crash, a replay,
/// the sweep). Off the index is harmless: `due_at` alone indexes nothing.
pub(crate) fn wake(now: DateTime<Utc>) -> Change {
    change().set("due_at", n(now.timestamp_millis()))
}

/// A wake entry's instant while nothing is to wake: past every horizon (2286).
pub(crate) const WAKE_NEVER_MS: i64 = 9_999_999_999_999;

/// The template's wake entry due now ([`wake`]), on the quota item as it is: for a
/// write that ends a push waiting for a grant, which may have been woken for one (a
/// cancel, a replacement), so the grant passes to the next waiting push.
pub(crate) fn wake_now(
    table: &str,
    pk: &str,
    template: &str,
    now: DateTime<Utc>,
) -> Result<TransactWriteItem, StoreError> {
    update(
        table,
        key(pk, &format!("{QUOTA_PREFIX}{template}")),
        wake(now),
    )
    .when(is_there())
    .write()
}

/// [`wake_now`] guarded by `check`'s condition instead (a check of the same quota
/// item, which one transaction cannot hold beside a write of it).
pub(crate) fn wake_checked(
    table: &str,
    check: &ConditionCheck,
    now: DateTime<Utc>,
) -> Result<TransactWriteItem, StoreError> {
    let mut update = Update::builder()
        .table_name(table)
        .set_key(Some(check.key().clone()))
        .condition_expression(check.condition_expression())
        .set_expression_attribute_names(check.expression_attribute_names().cloned())
        .changing(&wake(now));
    for (name, value) in check.expression_attribute_values().into_iter().flatten() {
        update = update.expression_attribute_values(name, value.clone());
    }
    Ok(TransactWriteItem::builder().update(update.build()?).build())
}

/// The quota item's marks of client-reported grants not yet confirmed.
pub(crate) const TAPS_REPORTED: &str = "taps_reported";

/// The quota item's marks of popup accepts not yet paired with a reported grant.
pub(crate) const TAPS_POPUP: &str = "taps_popup";

/// The counter change a ledger item brings ([`CounterChange`], decided by the domain):
/// `ADD accepted 1, available 1` for a grant (and its request id to the open-grant
/// set, see [`OPEN_AVAILABLE`]) while fewer than `cap` are available, the refusal
/// recorded for reject/ban, nothing for filter.
///
/// With `none_waiting` (a check-in that read no push waiting for a grant of the
/// template), a grant also requires that none began waiting since: else the check-in
/// reads again, and wakes it once its grant lands.
pub(crate) fn quota_update_item(
    table: &str,
    pk: &str,
    write: &TemplateWrite,
    request_id: &RequestId,
    now: DateTime<Utc>,
    limits: &crate::config::Limits,
    none_waiting: bool,
) -> Result<Option<TransactWriteItem>, StoreError> {
    let (template, result) = (&write.template, write.result);
    if write.counters == CounterChange::None {
        return Ok(None);
    }
    let named = quota_change(template, now);
    let key = key(pk, &quota_sk(template));
    let write = if write.counters == CounterChange::Grant {
        let mut grant = named
            .and(wake(now))
            .add("accepted", n(1))
            .add("available", n(1))
            .add(
                OPEN_AVAILABLE,
                AttributeValue::Ss(vec![request_id.to_string()]),
            );
        if limits.push_events {
            // The tap's mark, for a popup accept of it to confirm (store::taps).
            let tap = crate::domain::reconcile::Mark::new(now, request_id.as_str()).encode();
            grant = grant.add(TAPS_REPORTED, AttributeValue::Ss(vec![tap]));
        }
        let mut rule = room_for_a_grant(limits.max_open_grants);
        if none_waiting {
            rule = rule.and(absent(WAITING));
        }
        update(table, key, grant).when(rule).write()?
    } else {
        let refusal = named
            .set("last_refusal", s(result.as_str()))
            .set("last_refusal_at", s(rfc3339(now)));
        update(table, key, refusal).write()?
    };
    Ok(Some(write))
}

/// A template's open grants as its quota item lists them (request ids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OpenGrants {
    /// The request ids of the open grants, by state.
    pub(crate) ids: OpenGrantIds,
    /// The marks of sends recorded `sent` (set members as stored).
    pub(crate) sent_marks: Vec<String>,
    /// The marks of sends whose outcome is unknown (set members as stored).
    pub(crate) unknown_marks: Vec<String>,
    /// The marks of sends in flight.
    pub(crate) inflight_marks: Vec<String>,
    /// Sent events kept pending.
    pub(crate) pending_marks: Vec<String>,
    /// The sends counted per day, for the daily cap.
    pub(crate) sent_days: SentDays,
    /// The pushes waiting for a grant (members as stored).
    pub(crate) waiting: Vec<String>,
    /// The standing choice of the user's settings for the template (absent, or not
    /// one this version knows: none).
    pub(crate) standing: Option<Standing>,
    /// The wake entry's `due_at` as read (epoch ms; absent: none), and whether it is
    /// on the due index (`due_pk` set: pushes wait). Off the index, `due_at` is only
    /// the last grant's instant and wakes nothing.
    pub(crate) wake_at: Option<i64>,
    pub(crate) wake_listed: bool,
}

impl OpenGrants {
    pub(crate) fn of(quota: &HashMap<String, AttributeValue>) -> Self {
        let set = |name: &str| -> Vec<RequestId> {
            quota
                .get(name)
                .and_then(|v| v.as_ss().ok())
                .map(|ids| {
                    ids.iter()
                        .filter_map(|id| RequestId::parse(id.clone()).ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let members = |name: &str| -> Vec<String> {
            quota
                .get(name)
                .and_then(|v| v.as_ss().ok())
                .cloned()
                .unwrap_or_default()
        };
        Self {
            ids: OpenGrantIds {
                available: set(OPEN_AVAILABLE),
                reserved: set(OPEN_RESERVED),
            },
            sent_marks: members(SENT_MARKS),
            unknown_marks: members(OPEN_UNKNOWN),
            inflight_marks: members(INFLIGHT),
            pending_marks: members(PENDING_EVENTS),
            sent_days: sent_days(quota),
            waiting: members(WAITING),
            standing: quota
                .get(STANDING)
                .and_then(|v| v.as_s().ok())
                .and_then(|v| Standing::parse(v)),
            wake_at: quota
                .get("due_at")
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse().ok()),
            wake_listed: quota.contains_key("due_pk"),
        }
    }

    /// The marks no event can match any more, by attribute, for a write that touches
    /// the quota item anyway to drop.
    pub(crate) fn stale_marks(&self, now: DateTime<Utc>) -> Vec<(&'static str, Vec<String>)> {
        let stale = |members: &[String]| -> Vec<String> {
            members
                .iter()
                .filter(|m| Mark::parse(m).is_some_and(|mark| mark.is_stale(now)))
                .cloned()
                .collect()
        };
        vec![
            (SENT_MARKS, stale(&self.sent_marks)),
            (OPEN_UNKNOWN, stale(&self.unknown_marks)),
            (INFLIGHT, stale(&self.inflight_marks)),
            (PENDING_EVENTS, stale(&self.pending_marks)),
        ]
    }

    /// Live (not stale) marks of `members`.
    pub(crate) fn live(members: &[String], now: DateTime<Utc>) -> Vec<Mark> {
        members
            .iter()
            .filter_map(|m| Mark::parse(m))
            .filter(|m| !m.is_stale(now))
            .collect()
    }
}

/// The standing choice is still `kept` (none: still none).
fn standing_is(kept: Option<Standing>) -> Cond {
    match kept {
        Some(kept) => eq(STANDING, AttributeValue::S(kept.as_str().into())),
        None => absent(STANDING),
    }
}

/// A quota item's counters and open-grant lists (zero and empty when there is none).
pub(crate) fn quota_of(
    item: Option<&HashMap<String, AttributeValue>>,
) -> Result<(QuotaCounters, OpenGrants), StoreError> {
    match item {
        Some(item) => Ok((parse("quota", item.clone())?, OpenGrants::of(item))),
        None => Ok((QuotaCounters::default(), OpenGrants::default())),
    }
}

impl Store {
    /// The writes that record one template's answer, in a report or a check-in: its
    /// ledger entry (new) and, if they move, the template's counters
    /// ([`quota_update_item`], with `none_waiting`).
    pub(crate) fn recorded_answer(
        &self,
        pk: &str,
        write: &TemplateWrite,
        request_id: &RequestId,
        now: DateTime<Utc>,
        none_waiting: bool,
    ) -> Result<(TransactWriteItem, Option<TransactWriteItem>), StoreError> {
        let item = crate::store::items::grant::GrantItem::new(
            pk,
            &write.template,
            request_id,
            write.result,
            now,
            self.limits.retention.grants,
        );
        let ledger = self.put_new(to_item("grant", &item)?)?;
        let counters = quota_update_item(
            &self.table,
            pk,
            write,
            request_id,
            now,
            &self.limits,
            none_waiting,
        )?;
        Ok((ledger, counters))
    }

    /// Writes the template's standing choice (`None` removes it), conditional on the
    /// one read (`kept`), so two settings racing are ordered by the item.
    pub(crate) fn standing_put(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        kept: Option<Standing>,
        standing: Option<Standing>,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let named = quota_change(template, now);
        let named = match standing {
            Some(standing) => named.set(STANDING, s(standing.as_str())),
            None => named.remove(STANDING),
        };
        update(&self.table, key(pk, &quota_sk(template)), named)
            .when(standing_is(kept))
            .write()
    }

    /// A condition that the template's standing choice is still `kept`: a plan moved
    /// by it is written only while it stands.
    pub(crate) fn standing_check(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        kept: Option<Standing>,
    ) -> Result<TransactWriteItem, StoreError> {
        self.quota_check(pk, template, standing_is(kept))
    }

    pub(crate) fn grant_check(
        &self,
        pk: &str,
        kind: &ReminderKind,
    ) -> Result<TransactWriteItem, StoreError> {
        self.quota_check(pk, &kind.template_id, has_grant())
    }

    /// A check of `condition` on the user's quota item of `template`.
    pub(crate) fn quota_check(
        &self,
        pk: &str,
        template: &crate::domain::TemplateId,
        condition: Cond,
    ) -> Result<TransactWriteItem, StoreError> {
        check(&self.table, key(pk, &quota_sk(template)), condition).write()
    }
}
