//! The user's report counter of the minute (`RATE#<minute>`): `REPORTS_PER_MINUTE`
//! bounds the grant reports — and the standing choices that change something — a
//! client can make onegrant store.

use aws_sdk_dynamodb::types::{TransactWriteItem, Update};
use chrono::{DateTime, Utc};

use crate::store::items::{key, n, s};
use crate::store::keys::report_rate_sk;
use crate::store::{Store, StoreError};

impl Store {
    /// `ADD 1` on the user's report counter of this minute, conditional on it being
    /// under the limit (part of the report's transaction, so only reports that land
    /// count), and the seconds until the next minute.
    pub(crate) fn report_rate(
        &self,
        pk: &str,
        now: DateTime<Utc>,
    ) -> Result<(TransactWriteItem, u64), StoreError> {
        let minute = now.timestamp().div_euclid(60);
        let next = (minute + 1) * 60;
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &report_rate_sk(minute))))
            .update_expression("SET kind = :kind, expires_at = :expires ADD #n :one")
            .condition_expression("attribute_not_exists(#n) OR #n < :max")
            .expression_attribute_names("#n", "reports")
            .expression_attribute_values(":kind", s("rate"))
            .expression_attribute_values(":expires", n(next + 60))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":max", n(self.limits.reports_per_minute))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        let retry_after = u64::try_from(next - now.timestamp()).unwrap_or(60).max(1);
        Ok((
            TransactWriteItem::builder().update(update).build(),
            retry_after,
        ))
    }
}
