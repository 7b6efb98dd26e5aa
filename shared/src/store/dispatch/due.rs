//! The due index: what is due by a horizon, across every shard.

use chrono::{DateTime, Utc};

use super::super::item::{n, number, s, text};
use super::super::keys::{due_shard_pk, openid_of};
use super::super::{Store, StoreError, classify_sdk_error};
use super::{Index, ShardSpan};
use crate::domain::OpenId;
use crate::telemetry::error_chain;

/// A plan or push the due index says is due by the horizon (keys only: re-read on
/// claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueItem {
    pub(super) pk: String,
    pub(super) sk: String,
    pub due_at: DateTime<Utc>,
}

impl DueItem {
    /// The user it belongs to, if its partition names one.
    pub fn openid(&self) -> Option<OpenId> {
        openid_of(&self.pk)
    }
}

/// What a due-index query found.
#[derive(Debug, Clone, Default)]
pub struct DueScan {
    /// Earliest first.
    pub items: Vec<DueItem>,
    /// Index entries that could not be read (logged; left for an operator).
    pub unreadable: u32,
}

impl Store {
    /// The items due by `horizon`, across every partition of the due index that may
    /// hold items (`shards`), queried in parallel, earliest first. An unreadable entry is logged and counted, not fatal.
    pub async fn due_items(
        &self,
        horizon: DateTime<Utc>,
        shards: &ShardSpan,
    ) -> Result<DueScan, StoreError> {
        let queries = (0..shards.span).map(|shard| async move {
            let mut scan = DueScan::default();
            let mut pages = self
                .client
                .query()
                .table_name(&self.table)
                .index_name("due")
                .key_condition_expression("due_pk = :p AND due_at <= :h")
                .expression_attribute_values(":p", s(due_shard_pk(shard)))
                .expression_attribute_values(":h", n(horizon.timestamp_millis()))
                .into_paginator()
                .items()
                .send();
            while let Some(item) = pages.next().await {
                let item = item.map_err(|e| classify_sdk_error(e, |_| false))?;
                let due = number(&item, "due_at").and_then(DateTime::from_timestamp_millis);
                match (text(&item, "pk"), text(&item, "sk"), due) {
                    (Some(pk), Some(sk), Some(due_at)) => scan.items.push(DueItem {
                        pk: pk.to_string(),
                        sk: sk.to_string(),
                        due_at,
                    }),
                    _ => {
                        tracing::error!(shard, "unreadable due-index entry skipped");
                        scan.unreadable += 1;
                    }
                }
            }
            Ok::<_, StoreError>(scan)
        });
        let mut all = DueScan::default();
        for shard in futures::future::join_all(queries).await {
            match shard {
                Ok(shard) => {
                    all.items.extend(shard.items);
                    all.unreadable += shard.unreadable;
                }
                // One shard that cannot be read does not stop the others' items.
                Err(e) => {
                    tracing::error!(error = %error_chain(&e), "due-index shard unreadable; skipped this tick");
                    all.unreadable += 1;
                }
            }
        }
        all.items.sort_by_key(|i| i.due_at);
        Ok(all)
    }

    /// Takes a due item that cannot be claimed (it cannot be read) off the due index,
    /// so it is skipped once rather than every tick; the item stays for an operator.
    pub async fn quarantine_due(
        &self,
        item: &DueItem,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let seen = item.due_at.timestamp_millis();
        self.quarantine(&item.pk, &item.sk, Index::Due, seen, now)
            .await
    }
}
