//! Item helpers: attribute values in and out, keys, and typed items from raw maps.
//! Every store module builds and reads items through these, so the mapping lives in
//! one place (serde_dynamo for whole items, these for expressions and projections).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{StoreError, corrupt};

/// A raw DynamoDB item.
pub(super) type Item = HashMap<String, AttributeValue>;

/// A string attribute value.
pub(super) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// A number attribute value.
pub(super) fn n(value: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The primary key of an item.
pub(super) fn key(pk: &str, sk: &str) -> Item {
    HashMap::from([("pk".to_string(), s(pk)), ("sk".to_string(), s(sk))])
}

/// A typed item from a raw one; `what` names it in the error.
pub(super) fn parse<T: serde::de::DeserializeOwned>(
    what: &str,
    item: Item,
) -> Result<T, StoreError> {
    serde_dynamo::from_item(item).map_err(|e| corrupt(what, e))
}

/// A raw item from a typed one.
pub(super) fn to_item<T: serde::Serialize>(what: &str, value: &T) -> Result<Item, StoreError> {
    serde_dynamo::to_item(value).map_err(|e| corrupt(what, e))
}

/// The string attribute `name`, if present and a string.
pub(super) fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// The number attribute `name`, if present and an integer.
pub(super) fn number(item: &Item, name: &str) -> Option<i64> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}
