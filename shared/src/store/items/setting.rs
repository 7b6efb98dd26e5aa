//! The user's setting item (`SETTING`): when the newest standing choice applied was
//! read, so a setting read before it that arrives later changes nothing.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, SecondsFormat, Utc};

use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{check, put};
use crate::store::items::expr::{Cond, eq};
use crate::store::items::{Item, key, s, text};

/// Sort key of a user's setting item.
pub(crate) const SETTING_SK: &str = "SETTING";
/// When the setting that decided the user's standing choices was read (RFC 3339, to
/// the precision the client gave).
const READ_AT: &str = "read_at";

/// When the setting the item records was read; none stored: no setting decided yet.
pub(crate) fn decided_at(item: Option<&Item>) -> Result<Option<DateTime<Utc>>, StoreError> {
    let Some(item) = item else {
        return Ok(None);
    };
    text(item, READ_AT)
        .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
        .map(|at| Some(at.with_timezone(&Utc)))
        .ok_or_else(|| StoreError::Corrupt("a setting item without its read_at".into()))
}

impl Store {
    /// Records the setting read at `read_at` as the one deciding, conditional on the
    /// item still naming the one read before (`decided`, none: no item), so of two
    /// settings racing only one is taken as the newer.
    pub(crate) fn setting_put(
        &self,
        pk: &str,
        decided: Option<DateTime<Utc>>,
        read_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let mut item = key(pk, SETTING_SK);
        item.insert("kind".into(), s("setting"));
        item.insert(READ_AT.into(), s(stamp(read_at)));
        item.insert("updated_at".into(), s(super::rfc3339(now)));
        put(&self.table, item).when(still_decided(decided)).write()
    }
}

impl Store {
    /// A condition that the setting item still names the setting read before
    /// (`decided`, none: no item): for every transaction of a setting's changes but the
    /// last, which writes the item ([`Store::setting_put`]), so a setting that turned
    /// stale meanwhile writes none of them.
    pub(crate) fn setting_check(
        &self,
        pk: &str,
        decided: Option<DateTime<Utc>>,
    ) -> Result<TransactWriteItem, StoreError> {
        check(&self.table, key(pk, SETTING_SK), still_decided(decided)).write()
    }
}

/// The guard both writes state, once: the item still names the setting read before
/// (`decided`; none: no item).
fn still_decided(decided: Option<DateTime<Utc>>) -> Cond {
    match decided {
        None => super::is_new(),
        Some(decided) => eq(READ_AT, s(stamp(decided))),
    }
}

/// An instant as the item keeps it (every digit the client gave).
fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}
