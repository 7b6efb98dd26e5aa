//! The user's preferences item (`PREFS`): quiet hours and muted types, versioned.

use serde::{Deserialize, Serialize};

use crate::domain::inbox::preferences::Preferences;
use crate::store::StoreError;
use crate::store::items::{Item, parse};

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
