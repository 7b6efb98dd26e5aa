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
//! The write counters are each checked twice, by one rule ([`room_for`]): on the counter as read with the request's other items,
//! before any write, so a refused request costs that read and nothing else; and by
//! the counter's own `ADD 1`, conditional on being under the limit, in the request's
//! transaction, so only requests that land count and two racing for the last place
//! cannot both take it (the loser reads again and is refused then).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::rate::{minute_of, retry_after};
use crate::store::error::{Limit, StoreError};
use crate::store::handle::Store;
use crate::store::items::change::{change, update};
use crate::store::items::expr::{Cmp, Cond, absent, compare};
use crate::store::items::{Item, key, n, s};
use crate::store::keys::{publisher_pk, rate_sk, read_rate_sk, user_pk};

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

/// Room in the minute's count `attribute` for `more` writes under `max`: the one
/// statement of a rate limit, which each counted write carries as its condition and a
/// read ahead of the write checks on the minute's item as read (absent when nothing
/// was counted this minute). More than `max` at once never fits.
pub(crate) fn room_for(attribute: &str, max: u32, more: u64) -> Cond {
    let room = i64::from(max) - i64::try_from(more).unwrap_or(i64::MAX);
    let under = compare(attribute, Cmp::Le, n(room));
    if room < 0 {
        // A count is never negative: this never holds.
        under
    } else {
        absent(attribute).or(under)
    }
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
        let empty = Item::new();
        if room_for(counter.attribute(), self.rate_max(counter), n).holds(item.unwrap_or(&empty)) {
            Ok(())
        } else {
            Err(StoreError::Limited(Limit::Rate {
                retry_after: retry_after(now),
            }))
        }
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
        let counted = change()
            .set("kind", s("rate"))
            .set("expires_at", n((minute + 2) * 60))
            .add(counter.attribute(), n(count));
        update(&self.table, key(pk, &rate_sk(minute)), counted)
            .when(room_for(counter.attribute(), self.rate_max(counter), count))
            .write()
    }

    /// Counts one read call of `openid` in `now`'s minute, or refuses it past
    /// `READS_PER_MINUTE` (`Limited`, with the seconds until the next minute): one
    /// small conditional write, before the call reads anything.
    pub async fn count_read(&self, openid: &OpenId, now: DateTime<Utc>) -> Result<(), StoreError> {
        if self.limits.reads_per_minute == 0 {
            return Ok(());
        }
        let minute = minute_of(now);
        let item = key(&user_pk(openid), &read_rate_sk(minute));
        self.count_call(item, self.limits.reads_per_minute, now)
            .await
    }

    /// Counts one publisher API call of `source` in `now`'s minute, or refuses it past
    /// `PUBLISHER_REQUESTS_PER_MINUTE`, as [`Store::count_read`] does.
    pub async fn count_publisher_call(
        &self,
        source: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let minute = minute_of(now);
        let item = key(&publisher_pk(source), &rate_sk(minute));
        self.count_call(item, self.limits.publisher_requests_per_minute, now)
            .await
    }

    /// `ADD 1` on the `reads` count of the rate item `item`, under `max`.
    async fn count_call(
        &self,
        item: HashMap<String, AttributeValue>,
        max: u32,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let minute = minute_of(now);
        let counted = change()
            .set("kind", s("rate"))
            .set("expires_at", n((minute + 2) * 60))
            .add("reads", n(1));
        let counted = update(&self.table, item, counted)
            .when(room_for("reads", max, 1))
            .apply(&self.client)
            .await?;
        if counted {
            Ok(())
        } else {
            Err(StoreError::Limited(Limit::Rate {
                retry_after: retry_after(now),
            }))
        }
    }

    /// [`Store::rate_count`] of `count` grant reports at once, with the seconds until
    /// the next minute (the `Retry-After` should its condition fail).
    pub(crate) fn report_rate(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(count: Option<i64>) -> Item {
        count
            .map(|c| Item::from([("reports".to_string(), n(c))]))
            .unwrap_or_default()
    }

    #[test]
    fn room_in_the_minute_until_its_count_is_used_up_all_or_none() {
        for (count, max, more, fits) in [
            (None, 3, 1, true),
            (Some(0), 3, 1, true),
            (Some(2), 3, 1, true),
            (Some(3), 3, 1, false),
            (Some(9), 3, 1, false),
            (Some(1), 3, 2, true),
            (Some(2), 3, 2, false),
            (Some(3), 3, 0, true),
            // More than the limit at once never fits, counted or not.
            (None, 1, 2, false),
            (Some(0), 1, 2, false),
        ] {
            assert_eq!(
                room_for("reports", max, more).holds(&counted(count)),
                fits,
                "{count:?} of {max}, {more} more"
            );
        }
    }
}
