//! Item helpers: attribute values in and out, keys, and typed items from raw maps.
//! Every store module builds and reads items through these, so the mapping lives in
//! one place (serde_dynamo for whole items, these for expressions and projections).

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::store::error::{StoreError, corrupt};
use crate::store::handle::Store;
use crate::store::keys::{SortKey, sort_key};

use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

pub(crate) mod activity;
pub(crate) mod change;
pub(crate) mod event;
pub(crate) mod expr;
pub(crate) mod grant;
pub(crate) mod outbox;
pub mod outcome;
pub(crate) mod plan;
pub(crate) mod preferences;
pub(crate) mod query;
pub(crate) mod quota;
pub(crate) mod rate;
pub(crate) mod setting;
pub(crate) mod tombstone;
pub mod wechat_ips;
pub(crate) mod write;

pub(crate) use expr::{Item, at_version, due_as_seen, is_new, is_there, lease_as_seen, n, s};

/// The primary key of an item.
pub(crate) fn key(pk: &str, sk: &str) -> Item {
    HashMap::from([("pk".to_string(), s(pk)), ("sk".to_string(), s(sk))])
}

/// A typed item from a raw one; `what` names it in the error.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    what: &str,
    item: Item,
) -> Result<T, StoreError> {
    serde_dynamo::from_item(item).map_err(|e| corrupt(what, e))
}

/// A raw item from a typed one.
pub(crate) fn to_item<T: serde::Serialize>(what: &str, value: &T) -> Result<Item, StoreError> {
    serde_dynamo::to_item(value).map_err(|e| corrupt(what, e))
}

/// The string attribute `name`, if present and a string.
pub(crate) fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// The number attribute `name`, if present and an integer.
pub(crate) fn number(item: &Item, name: &str) -> Option<i64> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

pub(crate) fn rfc3339(now: DateTime<Utc>) -> String {
    now.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Store {
    pub(crate) fn put_new(
        &self,
        item: HashMap<String, AttributeValue>,
    ) -> Result<TransactWriteItem, StoreError> {
        change::put(&self.table, item)
            .when(is_new())
            .old_on_failure()
            .write()
    }
}

impl Store {
    /// A query of the due index's partition `due_pk` for what is due by `horizon`,
    /// oldest first, at most `limit` entries (run within an [`Store::index_turn`]).
    pub(crate) fn due_query(
        &self,
        due_pk: String,
        horizon: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> QueryFluentBuilder {
        query::partition("due_pk", s(due_pk))
            .range("due_at", query::Range::UpTo(n(horizon.timestamp_millis())))
            .on(self.index_query("due"))
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
    }

    /// A strongly consistent query of the table, for a key condition to go `on`.
    pub(crate) fn table_query(&self) -> QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.table)
            .consistent_read(true)
    }

    /// A query of the index `name` (eventually consistent, as every GSI read is).
    pub(crate) fn index_query(&self, name: &str) -> QueryFluentBuilder {
        self.client.query().table_name(&self.table).index_name(name)
    }

    /// The configured reminder kind a plan's sort key names (`None`: not a plan's, or
    /// a kind no longer configured).
    pub(crate) fn plan_kind(&self, sk: &str) -> Option<&crate::domain::reminders::ReminderKind> {
        match sort_key(sk) {
            SortKey::Plan(kind) => self.kinds.get(kind),
            SortKey::Outbox(_)
            | SortKey::Scheduled(_)
            | SortKey::Delivery(_)
            | SortKey::Event
            | SortKey::Other => None,
        }
    }

    /// One item, strongly consistent.
    pub(crate) async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, StoreError> {
        Ok(self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pk, sk)))
            .consistent_read(true)
            .send()
            .await?
            .item)
    }

    /// Adds `member` to the string set `name` of an existing item.
    pub(crate) async fn add_member(
        &self,
        pk: &str,
        sk: &str,
        name: &str,
        member: String,
    ) -> Result<(), StoreError> {
        let added = change::change().add(
            name,
            aws_sdk_dynamodb::types::AttributeValue::Ss(vec![member]),
        );
        // (Nothing to do if the item is gone.)
        change::update(&self.table, key(pk, sk), added)
            .when(is_there())
            .apply(&self.client)
            .await?;
        Ok(())
    }

    /// Removes members from string sets of an existing item (`(attribute, members)`;
    /// nothing if there are none, nor if the item is gone).
    pub(crate) async fn delete_members(
        &self,
        pk: &str,
        sk: &str,
        sets: &[(&str, Vec<String>)],
    ) -> Result<(), StoreError> {
        let mut gone = change::change();
        for (name, members) in sets {
            if !members.is_empty() {
                gone = gone.delete(
                    *name,
                    aws_sdk_dynamodb::types::AttributeValue::Ss(members.clone()),
                );
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        change::update(&self.table, key(pk, sk), gone)
            .when(is_there())
            .apply(&self.client)
            .await?;
        Ok(())
    }
}
