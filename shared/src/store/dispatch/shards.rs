//! Changing `DUE_SHARDS` safely. Plans, pushes and leases written under one shard count
//! live on that count's partitions; a dispatcher with a smaller count would never query
//! the partitions above it, and the items there would never be sent or swept.
//!
//! So the table remembers the highest count in use (`META` / `SHARDS`): every tick
//! reads it (one item), raises it when this dispatcher's count is higher, and queries
//! the due and lease indexes over that whole span. A larger count needs nothing more
//! (its span covers the old partitions). After a decrease, once the partitions above
//! the new count are empty on both indexes — checked by a tick at least
//! [`DRAIN_GRACE`] after the change, so containers still on the old count have
//! finished — the remembered count comes down and the extra queries stop.

use chrono::{DateTime, Duration, Utc};
use futures::StreamExt;

use crate::store::items::change::{change, update};
use crate::store::items::query::partition;
use crate::store::items::{Item, is_new, key, n, number, s};
use crate::store::keys::{SHARDS_PK, SHARDS_SK, due_shard_pk, lease_shard_pk};

use crate::store::dispatch::lease::Index;
use crate::store::error::StoreError;
use crate::store::handle::{DEFAULT_SHARDS, INDEX_QUERIES_IN_FLIGHT, Store};
use crate::store::items::expr::{all, eq};

/// How long after a change of count the old partitions are first checked for empty.
pub const DRAIN_GRACE: Duration = Duration::minutes(15);

/// The most partitions `DUE_SHARDS` allows: the span assumed when the registry is
/// unreadable, so nothing is missed until it is repaired (and drained).
pub const MAX_SHARDS: u32 = 256;

/// The registry item as stored: (widest count, current count, since when).
type Registry = (u32, u32, DateTime<Utc>);

fn registry(item: &Item) -> Option<Registry> {
    Some((
        u32::try_from(number(item, "max_shards")?).ok()?,
        u32::try_from(number(item, "current")?).ok()?,
        DateTime::from_timestamp_millis(number(item, "current_since")?)?,
    ))
}

/// The shard registry as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpan {
    /// Partitions to query: every count still possibly holding items.
    pub span: u32,
    /// This store's own count.
    pub current: u32,
    /// Since when the registry has known `current`.
    since: DateTime<Utc>,
}

impl ShardSpan {
    /// Only `current`'s own partitions (when the registry cannot be read).
    pub fn only(current: u32, now: DateTime<Utc>) -> Self {
        Self {
            span: current,
            current,
            since: now,
        }
    }
}

impl Store {
    /// The partitions a tick must query (see the module docs), registering this
    /// store's count first if the table does not know it yet.
    pub async fn shard_span(&self, now: DateTime<Utc>) -> Result<ShardSpan, StoreError> {
        let got = self.get(SHARDS_PK, SHARDS_SK).await?;
        let stored = got.as_ref().map(registry);
        if let Some(Some((max, current, since))) = stored
            && current == self.shards
        {
            return Ok(ShardSpan {
                // Never past the most there can be, whatever the item says.
                span: max.max(current).min(MAX_SHARDS),
                current,
                since,
            });
        }
        let max = match stored {
            // First tick with a registry: the default count may have been in use
            // before (an upgrade that also lowers the count must not strand it).
            None => self.shards.max(DEFAULT_SHARDS),
            Some(Some((max, _, _))) => max.max(self.shards),
            Some(None) => {
                tracing::error!("shard registry unreadable: rewritten with the widest span");
                MAX_SHARDS.max(self.shards)
            }
        };
        let registered = change()
            .set("max_shards", n(max))
            .set("current", n(self.shards))
            .set("current_since", n(now.timestamp_millis()));
        let registered = update(&self.table, key(SHARDS_PK, SHARDS_SK), registered);
        let registered = match stored {
            None => registered.when(is_new()),
            Some(None) => registered,
            Some(Some((old_max, old_current, _))) => {
                registered.when(eq("max_shards", n(old_max)).and(eq("current", n(old_current))))
            }
        };
        // (Not applied: another dispatcher registered first, its view at least as wide.)
        if registered.apply(&self.client).await? {
            tracing::warn!(shards = self.shards, span = max, "shard count registered");
        }
        Ok(ShardSpan {
            span: max,
            current: self.shards,
            // As stored (milliseconds), so a later check compares equal.
            since: DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now),
        })
    }

    /// The partitions that may hold items, read only (for checks and tools that must not
    /// register a count).
    pub async fn known_shards(&self) -> Result<u32, StoreError> {
        let got = self.get(SHARDS_PK, SHARDS_SK).await?;
        Ok(match got.as_ref().map(registry) {
            None => self.shards,
            Some(Some((max, _, _))) => max.max(self.shards),
            Some(None) => MAX_SHARDS.max(self.shards),
        })
    }

    /// The count the deployed dispatcher registered, if the registry holds one: what
    /// an operator's tool writes due entries under (with its own default count, an
    /// entry could land on a partition the dispatcher drained and no longer reads).
    pub async fn deployed_shards(&self) -> Result<Option<u32>, StoreError> {
        let got = self.get(SHARDS_PK, SHARDS_SK).await?;
        Ok(got
            .as_ref()
            .and_then(registry)
            .map(|(_, current, _)| current))
    }

    /// After a decrease, lowers the remembered count once the partitions above this
    /// store's count are empty on both indexes (at least [`DRAIN_GRACE`] after the
    /// change). True if it did.
    pub async fn drain_shards(
        &self,
        span: &ShardSpan,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        if span.span <= span.current || now - span.since < DRAIN_GRACE {
            return Ok(false);
        }
        // The registry must still be as this tick read it: a count registered since
        // (a rollback, a dispatcher still on the old count) starts the grace again.
        let now_stored = self.get(SHARDS_PK, SHARDS_SK).await?;
        if now_stored.as_ref().and_then(registry) != Some((span.span, span.current, span.since)) {
            return Ok(false);
        }
        // A few at a time (see [`INDEX_QUERIES_IN_FLIGHT`]), stopping at the first
        // partition that still holds anything: the rest need not be read this tick.
        let checks = (span.current..span.span)
            .flat_map(|shard| [(Index::Due, shard), (Index::Lease, shard)]);
        let mut answers = futures::stream::iter(checks)
            .map(|(index, shard)| self.partition_empty(index, shard))
            .buffer_unordered(INDEX_QUERIES_IN_FLIGHT);
        while let Some(empty) = answers.next().await {
            if !empty? {
                return Ok(false);
            }
        }
        let as_read = all([
            eq("max_shards", n(span.span)),
            eq("current", n(span.current)),
            eq("current_since", n(span.since.timestamp_millis())),
        ]);
        let lowered = change().set("max_shards", n(span.current));
        let lowered = update(&self.table, key(SHARDS_PK, SHARDS_SK), lowered)
            .when(as_read)
            .apply(&self.client)
            .await?;
        if lowered {
            tracing::warn!(from = span.span, to = span.current, "old shards drained");
        }
        Ok(lowered)
    }

    /// Whether `shard`'s partition of `index` holds nothing (one item read at most).
    async fn partition_empty(&self, index: Index, shard: u32) -> Result<bool, StoreError> {
        let (name, key_name, pk) = match index {
            Index::Due => ("due", "due_pk", due_shard_pk(shard)),
            Index::Lease => ("lease", "lease_pk", lease_shard_pk(shard)),
        };
        let _turn = self.index_turn().await;
        partition(key_name, s(pk))
            .on(self.index_query(name))
            .limit(1)
            .send()
            .await
            .map(|out| out.count() == 0)
            .map_err(StoreError::from)
    }
}
