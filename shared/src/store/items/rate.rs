//! The user's write counters of the minute (`RATE#<minute>`): `reports` bounds the
//! grant reports — and the standing choices that change something — a client can make
//! onegrant store (`REPORTS_PER_MINUTE`); `changes` bounds the other writes a user
//! makes (`CHANGES_PER_MINUTE`: plan settings, preferences, marking notifications
//! read).
//!
//! A third counter, `reads` on its own item (`RATE#<minute>#reads`), bounds the read
//! calls (`READS_PER_MINUTE`): one conditional `ADD 1` before the call reads anything,
//! refused past the limit with nothing read.
//!
//! The write counters are each checked twice: on the counter as read with the request's other items,
//! before any write, so a refused request costs that read and nothing else; and by
//! the counter's own `ADD 1`, conditional on being under the limit, in the request's
//! transaction, so only requests that land count and two racing for the last place
//! cannot both take it (the loser reads again and is refused then).

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::rate::{admit_n, minute_of, retry_after};
use crate::store::items::{Item, key, n, s};
use crate::store::keys::{rate_sk, read_rate_sk, user_pk};
use crate::store::{Limit, Store, StoreError, classify_sdk_error};

/// Which of the minute's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Reports,
    Changes,
}

impl Counter {
    fn attribute(self) -> &'static str {
        match self {
            Self::Reports => "reports",
            Self::Changes => "changes",
        }
    }
}

/// The key of the counters of `now`'s minute, to read with a request's other items.
pub(crate) fn rate_key(now: DateTime<Utc>) -> String {
    rate_sk(minute_of(now))
}

impl Store {
    fn rate_max(&self, counter: Counter) -> u32 {
        match counter {
            Counter::Reports => self.limits.reports_per_minute,
            Counter::Changes => self.limits.changes_per_minute,
        }
    }

    /// Whether one more write counted by `counter` is admitted, by the minute's
    /// counters as read (`item`: absent when none were made this minute).
    pub(crate) fn rate_admits(
        &self,
        counter: Counter,
        item: Option<&Item>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.rate_admits_n(counter, item, 1, now)
    }

    /// Whether `n` more writes counted by `counter` fit in the minute, all of them.
    pub(crate) fn rate_admits_n(
        &self,
        counter: Counter,
        item: Option<&Item>,
        n: u64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let count = item
            .and_then(|i| i.get(counter.attribute()))
            .and_then(|v| match v {
                AttributeValue::N(n) => n.parse::<u64>().ok(),
                _ => None,
            })
            .unwrap_or(0);
        admit_n(count, n, self.rate_max(counter), now)
            .map_err(|retry_after| StoreError::Limited(Limit::Rate { retry_after }))
    }

    /// `ADD 1` on the user's `counter` of this minute, conditional on it being under
    /// the limit (part of the write's transaction, so only writes that land count).
    pub(crate) fn rate_count(
        &self,
        counter: Counter,
        pk: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        self.rate_count_n(counter, pk, 1, now)
    }

    /// `ADD count` on the user's `counter` of this minute, conditional on all of them
    /// fitting under the limit.
    fn rate_count_n(
        &self,
        counter: Counter,
        pk: &str,
        count: u64,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let minute = minute_of(now);
        // (More than the limit never fits: `rate_admits_n` refuses it on the read.)
        let room = u64::from(self.rate_max(counter)).saturating_sub(count);
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(pk, &rate_sk(minute))))
            .update_expression("SET kind = :kind, expires_at = :expires ADD #n :count")
            .condition_expression("attribute_not_exists(#n) OR #n <= :room")
            .expression_attribute_names("#n", counter.attribute())
            .expression_attribute_values(":kind", s("rate"))
            .expression_attribute_values(":expires", n((minute + 2) * 60))
            .expression_attribute_values(":count", n(count))
            .expression_attribute_values(":room", n(room))
            .build()
            .map_err(|e| StoreError::Sdk(Box::new(e)))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Counts one read call of `openid` in `now`'s minute, or refuses it past
    /// `READS_PER_MINUTE` (`Limited`, with the seconds until the next minute): one
    /// small conditional write, before the call reads anything.
    pub async fn count_read(&self, openid: &OpenId, now: DateTime<Utc>) -> Result<(), StoreError> {
        if self.limits.reads_per_minute == 0 {
            return Ok(());
        }
        let minute = minute_of(now);
        let counted = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(&user_pk(openid), &read_rate_sk(minute))))
            // READS is a reserved word: the name goes through a placeholder.
            .update_expression("SET kind = :kind, expires_at = :expires ADD #n :one")
            .condition_expression("attribute_not_exists(#n) OR #n < :max")
            .expression_attribute_names("#n", "reads")
            .expression_attribute_values(":kind", s("rate"))
            .expression_attribute_values(":expires", n((minute + 2) * 60))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":max", n(self.limits.reads_per_minute))
            .send()
            .await;
        match counted {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Err(StoreError::Limited(Limit::Rate {
                    retry_after: retry_after(now),
                }))
            }
            Err(e) => Err(classify_sdk_error(e, |_| false)),
        }
    }

    /// [`Store::rate_count`] of a grant report, with the seconds until the next
    /// minute (the `Retry-After` should its condition fail).
    pub(crate) fn report_rate(
        &self,
        pk: &str,
        now: DateTime<Utc>,
    ) -> Result<(TransactWriteItem, u64), StoreError> {
        self.report_rate_n(pk, 1, now)
    }

    /// [`Store::report_rate`] of `count` reports at once.
    pub(crate) fn report_rate_n(
        &self,
        pk: &str,
        count: u64,
        now: DateTime<Utc>,
    ) -> Result<(TransactWriteItem, u64), StoreError> {
        Ok((
            self.rate_count_n(Counter::Reports, pk, count, now)?,
            retry_after(now),
        ))
    }
}
