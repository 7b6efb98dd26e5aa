//! The user's preferences item (`PREFS`): quiet hours and muted types, versioned.

use aws_sdk_dynamodb::types::TransactWriteItem;
use serde::{Deserialize, Serialize};

use crate::domain::inbox::preferences::Preferences;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{check, versioned};
use crate::store::items::{Item, key, parse};

/// Sort key of a user's preferences.
pub(crate) const PREFS_SK: &str = "PREFS";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PreferencesItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    #[serde(flatten)]
    pub(crate) preferences: Preferences,
    pub(crate) version: u64,
    pub(crate) updated_at: String,
}

impl PreferencesItem {
    /// The preferences an item holds (none stored: the defaults, version 0).
    pub(crate) fn of(item: Option<Item>) -> Result<(Preferences, u64), StoreError> {
        match item {
            None => Ok((Preferences::default(), 0)),
            Some(item) => {
                let stored: Self = parse("preferences", item)?;
                Ok((stored.preferences, stored.version))
            }
        }
    }
}

impl Store {
    /// A transaction item that only checks the user's preferences are still at
    /// `version` as read (0: none saved).
    pub(crate) fn prefs_unchanged(
        &self,
        pk: &str,
        version: u64,
    ) -> Result<TransactWriteItem, StoreError> {
        check(&self.table, key(pk, PREFS_SK), versioned(version)).write()
    }
}
