//! An erasure's tombstone (`ERASED#<tag>` / `ERASED`): the user's salted tag, never
//! the openid once done. While pending it holds the openid for its steps and sits on
//! the due index, so the dispatcher's ticks carry it on until done.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::OpenId;
use crate::domain::erasure::{ErasureCause, ErasureState, Pass, Tombstone};
use crate::store::error::StoreError;
use crate::store::items::change::{change, put, update};
use crate::store::items::expr::{absent, eq};
use crate::store::items::{Item, key, n, parse, s, to_item};
use crate::store::keys::due_pk;

/// The tombstone's sort key.
pub(crate) const TOMBSTONE_SK: &str = "ERASED";

/// The tombstone's partition for the tag `subject`.
pub(crate) fn tombstone_pk(subject: &str) -> String {
    format!("ERASED#{subject}")
}

/// The tombstone as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TombstoneItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    kind: String,
    /// When the erasure began (epoch ms).
    pub(crate) erased_at: i64,
    pub(crate) state: String,
    pub(crate) cause: String,
    #[serde(default)]
    pub(crate) reopened: bool,
    /// While pending: whose partition the steps delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) openid: Option<String>,
    /// While pending: the pass the next step runs (`due` or `rest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pass: Option<String>,
    /// Items deleted so far.
    #[serde(default)]
    pub(crate) deleted: u64,
    /// While pending: when the partition was first found empty (epoch ms), and has
    /// stayed so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) empty_since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) done_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due_at: Option<i64>,
    /// Kept for the longest replay window, then removed by the table's TTL.
    expires_at: i64,
}

impl TombstoneItem {
    /// A new erasure of `openid` (tagged `subject`), due at once.
    pub(crate) fn new(
        subject: &str,
        openid: &OpenId,
        cause: ErasureCause,
        now: DateTime<Utc>,
        keep: chrono::Duration,
        shards: u32,
    ) -> Self {
        let pk = tombstone_pk(subject);
        Self {
            due_pk: Some(due_pk(&pk, TOMBSTONE_SK, shards)),
            due_at: Some(now.timestamp_millis()),
            pk,
            sk: TOMBSTONE_SK.into(),
            kind: "tombstone".into(),
            erased_at: now.timestamp_millis(),
            state: ErasureState::Pending.as_str().into(),
            cause: cause.as_str().into(),
            reopened: false,
            openid: Some(openid.as_str().into()),
            pass: Some("due".into()),
            deleted: 0,
            empty_since: None,
            done_at: None,
            expires_at: (now + keep).timestamp(),
        }
    }

    pub(crate) fn read(item: Item) -> Result<Self, StoreError> {
        parse("tombstone", item)
    }

    /// The domain's view.
    pub(crate) fn tombstone(&self) -> Result<Tombstone, StoreError> {
        let bad = |what: &str| StoreError::Corrupt(format!("tombstone {}: {what}", self.pk));
        Ok(Tombstone {
            erased_at: DateTime::from_timestamp_millis(self.erased_at)
                .ok_or_else(|| bad("erased_at"))?,
            state: ErasureState::parse(&self.state).ok_or_else(|| bad("state"))?,
            reopened: self.reopened,
        })
    }

    pub(crate) fn pass(&self) -> Pass {
        match self.pass.as_deref() {
            Some("rest") => Pass::Rest,
            _ => Pass::Due,
        }
    }

    /// The Put of a new erasure: none there, or one done whose user came back.
    pub(crate) fn put(&self, table: &str) -> Result<TransactWriteItem, StoreError> {
        let reopened = eq("state", s(ErasureState::Done.as_str()))
            .and(eq("reopened", AttributeValue::Bool(true)));
        put(table, to_item("tombstone", self)?)
            .when(absent("pk").or(reopened))
            .write()
    }
}

use aws_sdk_dynamodb::types::AttributeValue;

/// A step's record on a pending tombstone begun at `erased_at`: the pass next, the
/// items deleted, when the next step is due, since when the partition is empty.
pub(crate) fn stepped(
    table: &str,
    pk: &str,
    erased_at: i64,
    pass: Pass,
    deleted: u64,
    due: DateTime<Utc>,
    empty_since: Option<DateTime<Utc>>,
) -> Result<TransactWriteItem, StoreError> {
    let step = change()
        .set(
            "pass",
            s(match pass {
                Pass::Due => "due",
                Pass::Rest => "rest",
            }),
        )
        .set("due_at", n(due.timestamp_millis()))
        .add("deleted", n(deleted));
    let step = match empty_since {
        Some(since) => step.set("empty_since", n(since.timestamp_millis())),
        None => step.remove("empty_since"),
    };
    update(table, key(pk, TOMBSTONE_SK), step)
        .when(pending_since(erased_at))
        .write()
}

/// The end of an erasure begun at `erased_at`: done, the openid and the due entry
/// gone from the tombstone.
pub(crate) fn finished(
    table: &str,
    pk: &str,
    erased_at: i64,
    deleted: u64,
    now: DateTime<Utc>,
) -> Result<TransactWriteItem, StoreError> {
    let done = change()
        .set("state", s(ErasureState::Done.as_str()))
        .set("done_at", n(now.timestamp_millis()))
        .add("deleted", n(deleted))
        .remove("openid")
        .remove("pass")
        .remove("due_pk")
        .remove("due_at")
        .remove("empty_since");
    update(table, key(pk, TOMBSTONE_SK), done)
        .when(pending_since(erased_at))
        .write()
}

/// The user came back after the erasure begun at `erased_at` was done.
pub(crate) fn reopened(
    table: &str,
    pk: &str,
    erased_at: i64,
) -> Result<TransactWriteItem, StoreError> {
    let back = change().set("reopened", AttributeValue::Bool(true));
    update(table, key(pk, TOMBSTONE_SK), back)
        .when(eq("erased_at", n(erased_at)).and(eq("state", s(ErasureState::Done.as_str()))))
        .write()
}

/// The tombstone is still the pending one begun at `erased_at`.
fn pending_since(erased_at: i64) -> crate::store::items::expr::Cond {
    eq("erased_at", n(erased_at)).and(eq("state", s(ErasureState::Pending.as_str())))
}

/// No tombstone, or one whose user came back: a condition for storing anything new
/// for the user (an event's ingest, WeChat's events).
pub(crate) fn not_erased() -> crate::store::items::expr::Cond {
    absent("pk").or(eq("reopened", AttributeValue::Bool(true)))
}

impl crate::store::handle::Store {
    /// Whether `openid` was erased and has not come back since: nothing of theirs may
    /// be told or answered (one strongly consistent read).
    pub(crate) async fn forgotten(&self, openid: &OpenId) -> Result<bool, StoreError> {
        let pk = tombstone_pk(&self.subject(openid));
        Ok(match self.get(&pk, TOMBSTONE_SK).await? {
            Some(item) => !TombstoneItem::read(item)?.tombstone()?.admits_data(),
            None => false,
        })
    }
}
