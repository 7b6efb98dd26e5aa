//! A user's open pushes, counted at ingest against `PUSHES_PENDING_MAX`
//! ([`crate::domain::inbox::pending`]). Every open push — an outbox item `pending` or
//! `sending`, a scheduled notification with its push — carries `pending_pk` (the
//! user's partition), set and removed with the state it follows in the same write, so
//! the `pending` index (keys only) holds exactly the user's open pushes and the count
//! cannot drift. A count reads at most the cap's number of index entries, whatever the
//! user's history; finished pushes are not on the index at all.

use aws_sdk_dynamodb::types::Select;

use crate::domain::OpenId;
use crate::store::items::s;
use crate::store::keys::user_pk;
use crate::store::{Store, StoreError, classify_sdk_error};

impl Store {
    /// How many open pushes `openid` has, counted up to `up_to` (the index is
    /// eventually consistent: a push written a moment ago may not be counted yet).
    pub(crate) async fn pending_pushes(
        &self,
        openid: &OpenId,
        up_to: u32,
    ) -> Result<u32, StoreError> {
        let mut counted = 0u32;
        let mut from = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name("pending")
                .key_condition_expression("pending_pk = :p")
                .expression_attribute_values(":p", s(user_pk(openid)))
                .select(Select::Count)
                .limit(i32::try_from(up_to.saturating_sub(counted).max(1)).unwrap_or(i32::MAX))
                .set_exclusive_start_key(from)
                .send()
                .await
                .map_err(|e| classify_sdk_error(e, |_| false))?;
            counted = counted.saturating_add(u32::try_from(out.count()).unwrap_or(0));
            from = out.last_evaluated_key().cloned();
            if from.is_none() || counted >= up_to {
                return Ok(counted);
            }
        }
    }
}
