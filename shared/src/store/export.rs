//! A copy of one's data (`domain::export`): one bounded page of the user's partition,
//! each item as JSON, without the table's plumbing.

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use crate::domain::OpenId;
use crate::domain::export::{EXPORT_PAGE, is_plumbing};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::query::partition;
use crate::store::items::{key, text};
use crate::store::keys::user_pk;

/// One page of an export: its items, and the sort key the next continues after.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportPage {
    pub items: Vec<Value>,
    pub next: Option<String>,
}

impl Store {
    /// The items of `openid`'s partition after the sort key `after` (from the start
    /// without), at most `EXPORT_PAGE`: one strongly consistent query.
    pub async fn export_page(
        &self,
        openid: &OpenId,
        after: Option<&str>,
    ) -> Result<ExportPage, StoreError> {
        let pk = user_pk(openid);
        let out = partition("pk", AttributeValue::S(pk.clone()))
            .on(self.table_query())
            .limit(i32::try_from(EXPORT_PAGE).unwrap_or(100))
            .set_exclusive_start_key(after.map(|sk| key(&pk, sk)))
            .send()
            .await?;
        let mut items = Vec::new();
        for item in out.items() {
            let kept: std::collections::HashMap<String, AttributeValue> = item
                .iter()
                .filter(|(name, _)| !is_plumbing(name))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            let value: Value = serde_dynamo::from_item(kept)
                .map_err(|e| StoreError::Corrupt(format!("an item to export: {e}")))?;
            items.push(value);
        }
        let next = out
            .last_evaluated_key()
            .and_then(|last| text(last, "sk"))
            .map(str::to_string);
        Ok(ExportPage { items, next })
    }
}
