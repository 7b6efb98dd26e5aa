//! A user's activity (`ACTIVE`, in their partition): the UTC day of their last
//! signed-in request, and on the due index the instant they count as inactive
//! (`INACTIVE_USER_DAYS`), when the dispatcher begins their erasure.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, NaiveDate, Utc};

use crate::store::error::StoreError;
use crate::store::items::change::{change, update};
use crate::store::items::expr::{Cmp, absent, compare, eq};
use crate::store::items::{key, n, s};
use crate::store::keys::due_pk;

/// The activity item's sort key.
pub(crate) const ACTIVITY_SK: &str = "ACTIVE";

/// The write moving `pk`'s activity to `today`, inactive from `due`: only over an older
/// day (a request racing another the same day writes once).
pub(crate) fn touched(
    table: &str,
    pk: &str,
    today: NaiveDate,
    due: DateTime<Utc>,
    shards: u32,
) -> Result<TransactWriteItem, StoreError> {
    let day = s(today.format("%Y-%m-%d").to_string());
    let moved = change()
        .set("kind", s("activity"))
        .set("day", day.clone())
        .set("due_pk", s(due_pk(pk, ACTIVITY_SK, shards)))
        .set("due_at", n(due.timestamp_millis()));
    update(table, key(pk, ACTIVITY_SK), moved)
        .when(absent("day").or(compare("day", Cmp::Lt, day)))
        .write()
}

/// The activity's due entry moved to `due` (on this count of `shards`), while it is
/// the one seen (`due_ms`): the days set were raised or set to 0 since it was written.
pub(crate) fn later_due(
    table: &str,
    pk: &str,
    due_ms: i64,
    due: DateTime<Utc>,
    shards: u32,
) -> Result<TransactWriteItem, StoreError> {
    let moved = change()
        .set("due_pk", s(due_pk(pk, ACTIVITY_SK, shards)))
        .set("due_at", n(due.timestamp_millis()));
    update(table, key(pk, ACTIVITY_SK), moved)
        .when(eq("due_at", n(due_ms)))
        .write()
}

/// The activity's due entry taken off the index, while it is the one seen (`due_ms`):
/// its erasure has begun.
pub(crate) fn off_due(table: &str, pk: &str, due_ms: i64) -> Result<TransactWriteItem, StoreError> {
    let off = change().remove("due_pk").remove("due_at");
    update(table, key(pk, ACTIVITY_SK), off)
        .when(eq("due_at", n(due_ms)))
        .write()
}
