//! A user's activity (`ACTIVE`, in their partition): the UTC day of their last
//! signed-in request, and on the due index the instant they count as inactive
//! (`INACTIVE_USER_DAYS`), when the dispatcher begins their erasure.

use aws_sdk_dynamodb::types::Update;
use chrono::{DateTime, NaiveDate, Utc};

use crate::store::StoreError;
use crate::store::items::expr::{Cmp, Guarded, absent, compare, eq};
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
) -> Result<Update, StoreError> {
    let day = s(today.format("%Y-%m-%d").to_string());
    Update::builder()
        .table_name(table)
        .set_key(Some(key(pk, ACTIVITY_SK)))
        .update_expression("SET kind = :kind, #day = :today, due_pk = :due_pk, due_at = :due")
        .guarded(&absent("day").or(compare("day", Cmp::Lt, day.clone())), "g")
        .expression_attribute_names("#day", "day")
        .expression_attribute_values(":kind", s("activity"))
        .expression_attribute_values(":today", day)
        .expression_attribute_values(":due_pk", s(due_pk(pk, ACTIVITY_SK, shards)))
        .expression_attribute_values(":due", n(due.timestamp_millis()))
        .build()
        .map_err(|e| StoreError::Sdk(Box::new(e)))
}

/// The activity's due entry taken off the index, while it is the one seen (`due_ms`):
/// its erasure has begun.
pub(crate) fn off_due(table: &str, pk: &str, due_ms: i64) -> Result<Update, StoreError> {
    Update::builder()
        .table_name(table)
        .set_key(Some(key(pk, ACTIVITY_SK)))
        .update_expression("REMOVE due_pk, due_at")
        .guarded(&eq("due_at", n(due_ms)), "g")
        .build()
        .map_err(|e| StoreError::Sdk(Box::new(e)))
}
