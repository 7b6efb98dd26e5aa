//! Reading and saving the user's preferences (`GET`/`PUT /v1/preferences`). A save
//! that changes nothing writes nothing; a change is one conditional write on the
//! version read, so two saves at once never lose one silently (the later one is
//! applied on top of a fresh read). A change counts against the user's
//! `CHANGES_PER_MINUTE`, checked on the read before any write.

use chrono::{DateTime, Utc};

use crate::domain::OpenId;
use crate::domain::inbox::preferences::Preferences;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::outbox::versioned_put;
use crate::store::items::preferences::{PREFS_SK, PreferencesItem};
use crate::store::items::rate::{Counter, rate_key};
use crate::store::items::{rfc3339, to_item};
use crate::store::keys::user_pk;
use crate::store::retry::{Attempt, retry_contended};

impl Store {
    /// The user's preferences (the defaults when none were saved). One read.
    pub async fn preferences(&self, openid: &OpenId) -> Result<Preferences, StoreError> {
        let item = self.get(&user_pk(openid), PREFS_SK).await?;
        Ok(PreferencesItem::of(item)?.0)
    }

    /// Saves `wanted` as the user's preferences; what is stored afterwards.
    pub async fn save_preferences(
        &self,
        openid: &OpenId,
        wanted: &Preferences,
        now: DateTime<Utc>,
    ) -> Result<Preferences, StoreError> {
        let pk = &user_pk(openid);
        retry_contended("preferences", self.limits.write_budget, || async move {
            let rate = rate_key(now);
            let mut read = self
                .read_items(pk, &[PREFS_SK.to_string(), rate.clone()])
                .await?;
            let (current, version) = PreferencesItem::of(read.remove(PREFS_SK))?;
            if current == *wanted {
                return Ok(Attempt::Done(current));
            }
            // Past the minute's changes: refused on the read, before any write.
            self.rate_admits(Counter::Changes, read.get(&rate), now)?;
            let item = PreferencesItem {
                pk: pk.clone(),
                sk: PREFS_SK.into(),
                kind: "preferences".into(),
                preferences: wanted.clone(),
                version: version + 1,
                updated_at: rfc3339(now),
            };
            let item = to_item("preferences", &item)?;
            let write = if version == 0 {
                self.put_new(item)?
            } else {
                versioned_put(&self.table, item, version)?
            };
            // (Refused by the count's condition alone, the next read refuses.)
            let count = self.rate_count(Counter::Changes, pk, now)?;
            self.commit_or_retry(vec![write, count], wanted.clone())
                .await
        })
        .await
    }
}
