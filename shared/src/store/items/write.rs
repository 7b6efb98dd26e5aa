//! A transaction's write with what it declares it leaves on its item: a put, its whole
//! item; an update built from a [`Change`](crate::store::items::change::Change) by
//! [`WriteOf::part`](crate::store::items::change::WriteOf::part), the plain values
//! it sets. The audit trail's entry is built from these declarations, never by
//! reading an update expression back.

use aws_sdk_dynamodb::types::TransactWriteItem;

use super::expr::Item;

/// One write of a transaction and what it declares.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    item: TransactWriteItem,
    declares: Option<Item>,
}

impl Write {
    /// An update's write declaring the plain values `sets` it leaves on its item.
    pub(crate) fn declaring(item: TransactWriteItem, sets: Item) -> Self {
        Self {
            item,
            declares: Some(sets),
        }
    }

    /// The write as DynamoDB takes it.
    pub(crate) fn item(&self) -> &TransactWriteItem {
        &self.item
    }

    pub(crate) fn into_item(self) -> TransactWriteItem {
        self.item
    }

    /// The item's key (partition, sort), whatever kind of write it is.
    pub(crate) fn key(&self) -> Option<(&str, &str)> {
        let key = match (
            self.item.put(),
            self.item.update(),
            self.item.delete(),
            self.item.condition_check(),
        ) {
            (Some(put), ..) => put.item(),
            (_, Some(update), ..) => update.key(),
            (_, _, Some(delete), _) => delete.key(),
            (.., Some(check)) => check.key(),
            _ => return None,
        };
        let text = |name: &str| key.get(name).and_then(|v| v.as_s().ok());
        Some((text("pk")?, text("sk")?))
    }

    /// The attributes it declares it leaves (a put: its item; an update: the values
    /// its change sets), if any.
    pub(crate) fn declares(&self) -> Option<&Item> {
        self.declares.as_ref()
    }
}

impl From<TransactWriteItem> for Write {
    /// A put declares its item; another write declares nothing.
    fn from(item: TransactWriteItem) -> Self {
        let declares = item.put().map(|put| put.item().clone());
        Self { item, declares }
    }
}

/// The entity the audit trail follows at sort key `sk` (`grant`, `delivery`, `plan`, or
/// `push`: a notification's, in the outbox or waiting with its scheduled
/// notification), if any: an update of its `state` or `result` must declare it
/// ([`WriteOf::part`](super::change::WriteOf::part)).
pub(crate) fn audited(sk: &str) -> Option<&'static str> {
    use crate::store::keys::{
        DELIVERY_PREFIX, GRANT_PREFIX, OUTBOX_PREFIX, PLAN_PREFIX, SCHEDULED_PREFIX,
    };
    [
        (GRANT_PREFIX, "grant"),
        (DELIVERY_PREFIX, "delivery"),
        (PLAN_PREFIX, "plan"),
        (OUTBOX_PREFIX, "push"),
        (SCHEDULED_PREFIX, "push"),
    ]
    .into_iter()
    .find_map(|(prefix, entity)| sk.starts_with(prefix).then_some(entity))
}
