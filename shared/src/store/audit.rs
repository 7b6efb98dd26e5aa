//! The audit trail: every transaction that changes a grant, a delivery, a plan or a
//! notification's push also
//! writes one history entry in the user's partition, in the same transaction, naming
//! what caused it and what each item became. Entries are append-only (written once,
//! conditional on not existing, never updated) and expire after the grants retention.
//!
//! What caused a change is the task's *cause* ([`attributed`]): a report's `request_id`,
//! a check-in's `action_id`, the dispatcher, the sweep, a WeChat push event, a settings
//! change. The changes themselves are what the transaction's own writes declare they
//! leave (`changes_of`: a put its item, an update built by `WriteOf::part` the
//! values its change sets), so no write path can change a grant, delivery or plan
//! without a trace. `from` states are not stored: each entry is the entity's next state, so the
//! timeline's previous entry for the same entity is where it came from
//! (`onegrant-audit` prints `from → to`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::audit::{Change, Entry, HistoryWindow};
use crate::store::error::StoreError;
use crate::store::items::change::put;
use crate::store::items::query::{Range, partition};
use crate::store::items::write::{Write, audited};
use crate::store::items::{is_new, parse, s, to_item};
use crate::store::keys::template_of_grant;

tokio::task_local! {
    static CAUSE: String;
}

/// Runs `work` with `cause` as what its writes are attributed to.
pub async fn attributed<F: std::future::Future>(cause: impl Into<String>, work: F) -> F::Output {
    CAUSE.scope(cause.into(), work).await
}

/// What the running task's writes are attributed to.
pub fn cause() -> String {
    CAUSE
        .try_with(Clone::clone)
        .unwrap_or_else(|_| UNATTRIBUTED.to_string())
}

/// The cause of a write made outside any [`attributed`] scope (a bug the tests look for).
pub const UNATTRIBUTED: &str = "unattributed";

/// The sort key prefix of history entries.
pub const HISTORY_PREFIX: &str = "HIST#";

/// One history entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryItem {
    pub pk: String,
    pub sk: String,
    pub kind: String,
    pub at: String,
    pub cause: String,
    pub changes: Vec<Change>,
    pub expires_at: i64,
}

impl Entry for HistoryItem {
    fn at(&self) -> &str {
        &self.at
    }

    fn cause(&self) -> &str {
        &self.cause
    }

    fn changes(&self) -> &[Change] {
        &self.changes
    }
}

fn text(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        Some(AttributeValue::N(n)) => Some(n.clone()),
        _ => None,
    }
}

/// The grants, deliveries and plans `writes` leave changed, as they declare it (a put:
/// its item; an update: the values its change sets), and the partition they are in (a
/// history entry goes to the user's partition).
pub(crate) fn changes_of(writes: &[Write]) -> (Option<String>, Vec<Change>) {
    let mut pk = None;
    let mut changes = Vec::new();
    for write in writes {
        let (Some(attributes), Some((key_pk, sk))) = (write.declares(), write.key()) else {
            continue;
        };
        if write.item().put().is_some() {
            let Some(kind) = text(attributes, "kind") else {
                continue;
            };
            if !["grant", "delivery", "plan", "outbox", "scheduled"].contains(&kind.as_str()) {
                continue;
            }
        }
        let Some(entity) = audited(sk) else {
            continue;
        };
        // A change is a new state; an update that leaves the state alone (a count, a
        // mark) is not one.
        let Some(to) = text(attributes, "state").or_else(|| text(attributes, "result")) else {
            continue;
        };
        pk.get_or_insert_with(|| key_pk.to_string());
        changes.push(Change {
            entity: entity.to_string(),
            sk: sk.to_string(),
            to,
            template_id: text(attributes, "template_id"),
            msgid: text(attributes, "msgid"),
            errcode: text(attributes, "errcode").and_then(|e| e.parse().ok()),
            reason: text(attributes, "class").or_else(|| text(attributes, "pause_reason")),
        });
    }
    (pk, changes)
}

/// The history entry for a transaction of `items`, if it changes anything: appended to
/// it, so it commits with the changes or not at all.
pub(crate) fn entry_for(
    writes: &[Write],
    table: &str,
    now: DateTime<Utc>,
    retention: chrono::Duration,
) -> Result<Option<TransactWriteItem>, StoreError> {
    let (Some(pk), changes) = changes_of(writes) else {
        return Ok(None);
    };
    if changes.is_empty() {
        return Ok(None);
    }
    entry(pk, changes, table, now, retention).map(Some)
}

/// A history entry of `changes` in partition `pk`, attributed to the running task's
/// cause (for a change the transaction's writes do not show, e.g. a quarantine).
pub fn entry(
    pk: String,
    changes: Vec<Change>,
    table: &str,
    now: DateTime<Utc>,
    retention: chrono::Duration,
) -> Result<TransactWriteItem, StoreError> {
    let random = uuid::Uuid::new_v4().simple().to_string();
    let entry = HistoryItem {
        pk,
        sk: format!(
            "{HISTORY_PREFIX}{:013}#{}",
            now.timestamp_millis().max(0),
            &random[..8]
        ),
        kind: "history".into(),
        at: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        cause: cause(),
        changes,
        expires_at: (now + retention).timestamp(),
    };
    let item = to_item("history", &entry)?;
    put(table, item).when(is_new()).write()
}

/// The entity an item's sort key names, for a change recorded by hand.
pub fn entity_name(sk: &str) -> &'static str {
    audited(sk).unwrap_or("push")
}

/// `writes` as DynamoDB takes them, with the history entry they call for appended (a
/// full transaction is refused: DynamoDB takes at most 100 items).
pub(crate) fn with_history(
    writes: &[Write],
    table: &str,
    now: DateTime<Utc>,
    retention: chrono::Duration,
) -> Result<Vec<TransactWriteItem>, StoreError> {
    let mut items: Vec<TransactWriteItem> = writes.iter().map(|w| w.item().clone()).collect();
    if let Some(entry) = entry_for(writes, table, now, retention)? {
        // Every transaction leaves room for it (a change without a trace is a bug).
        if items.len() >= 100 {
            return Err(StoreError::Corrupt(
                "a transaction of 100 items has no room for its history entry".into(),
            ));
        }
        items.push(entry);
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::items::change::{change, update};
    use crate::store::items::key;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.into())
    }

    #[test]
    fn changes_are_what_puts_and_updates_declare_and_counts_are_not_changes() {
        let grant_move = update(
            "t",
            key("USER#o1", "GRANT#T1#wr_1"),
            change()
                .set("state", s("consumed"))
                .set("updated_at", s("2026-12-01T00:00:00Z"))
                .plus("version", 1),
        )
        .part()
        .expect("update");
        let counter = update(
            "t",
            key("USER#o1", "QUOTA#T1"),
            change().add("available", AttributeValue::N("-1".into())),
        )
        .part()
        .expect("update");
        let mut delivery = key("USER#o1", "DELIVERY#d1");
        for (name, value) in [
            ("kind", "delivery"),
            ("state", "sent"),
            ("template_id", "T1"),
            ("msgid", "123456789"),
            ("class", "sent"),
        ] {
            delivery.insert(name.into(), s(value));
        }
        let delivery = put("t", delivery).part().expect("put");
        let writes = vec![grant_move, counter, delivery];
        let (pk, changes) = changes_of(&writes);
        assert_eq!(pk.as_deref(), Some("USER#o1"));
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert_eq!(
            (changes[0].entity.as_str(), changes[0].to.as_str()),
            ("grant", "consumed")
        );
        assert_eq!(changes[1].msgid.as_deref(), Some("123456789"));
        assert_eq!(changes[1].reason.as_deref(), Some("sent"));
        assert!(
            changes_of(&writes[1..2]).1.is_empty(),
            "a count alone changes nothing"
        );
    }
}

/// A window of a user's history, oldest first.
#[derive(Debug, Clone, Default)]
pub struct HistoryRead {
    pub entries: Vec<HistoryItem>,
    /// The entries begin with the user's first (for `domain::audit::timeline`).
    pub from_start: bool,
    /// Entries past the limit were left unread.
    pub more: bool,
}

/// The sort key of the first history entry at or after `at`.
fn history_from(at: DateTime<Utc>) -> String {
    format!("{HISTORY_PREFIX}{:013}", at.timestamp_millis().max(0))
}

impl crate::store::handle::Store {
    /// `openid`'s history entries in `window`, oldest first: an operator's read of at
    /// most `window.limit` + 1 items (the one more says whether any are left),
    /// whatever the length of the user's history.
    pub async fn history(
        &self,
        openid: &crate::domain::OpenId,
        window: HistoryWindow,
    ) -> Result<HistoryRead, StoreError> {
        let limit = window.limit.clamp(1, 10_000);
        let from = window
            .since
            .map_or_else(|| HISTORY_PREFIX.into(), history_from);
        let mut entries: Vec<HistoryItem> = Vec::new();
        let mut more = false;
        let mut start = None;
        loop {
            // One more than the window, to know whether any are left.
            let wanted = limit + 1 - entries.len();
            // (Up to past every entry's millisecond stamp: digits and `#` sort below `~`.)
            let range = Range::Between(s(from.clone()), s(format!("{HISTORY_PREFIX}~")));
            let page = partition("pk", s(super::keys::user_pk(openid)))
                .range("sk", range)
                .on(self.table_query())
                .scan_index_forward(window.since.is_some())
                .limit(i32::try_from(wanted).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start.take())
                .send()
                .await?;
            for item in page.items().iter().cloned() {
                if entries.len() == limit {
                    more = true;
                    break;
                }
                let mut entry: HistoryItem = parse("history", item)?;
                // An entry written before changes named their grant's template.
                for change in &mut entry.changes {
                    if change.template_id.is_none() {
                        change.template_id = template_of_grant(&change.sk);
                    }
                }
                entries.push(entry);
            }
            match page.last_evaluated_key {
                Some(key) if !more && entries.len() < limit + 1 => start = Some(key),
                _ => break,
            }
        }
        if window.since.is_none() {
            entries.reverse();
        }
        Ok(HistoryRead {
            entries,
            from_start: window.since.is_none() && !more,
            more,
        })
    }
}
