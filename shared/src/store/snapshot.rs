//! Loading: a plan, its quota item and (for a check-in) its action record and
//! carried grant, in one strongly consistent round trip.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use chrono::{DateTime, Utc};

use crate::domain::QuotaCounters;
use crate::domain::inbox::preferences::Preferences;
use crate::domain::reminders::{CheckIn, ReminderKind};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::grant::GrantItem;
use crate::store::items::plan::{ActionItem, PlanItem};
use crate::store::items::preferences::{PREFS_SK, PreferencesItem};
use crate::store::items::quota::{OpenGrants, quota_of};
use crate::store::items::rate::rate_key;
use crate::store::items::{Item, key, parse};
use crate::store::keys::{action_sk, grant_sk, plan_sk, quota_sk};
use crate::store::retry::{Attempt, MAX_WRITE_ATTEMPTS, Tries, retry_carrying};

pub(crate) struct Read {
    pub(crate) plan: Option<PlanItem>,
    pub(crate) counters: QuotaCounters,
    /// The template's open grants, from the quota item's sets.
    pub(crate) open: OpenGrants,
    pub(crate) action: Option<ActionItem>,
    pub(crate) ledger: Option<GrantItem>,
    /// The user's preferences, when asked for ([`Store::read_with_preferences`]).
    pub(crate) preferences: Option<Preferences>,
    /// The user's write counters of the minute, when asked for
    /// ([`Store::read_counted`]); None too when none were made this minute.
    pub(crate) rate: Option<Item>,
}

/// The most keys one `BatchGetItem` may ask for.
const BATCH_GET_MAX: usize = 100;

impl Store {
    /// Reads the given items of one user, strongly consistent: one round trip per
    /// [`BATCH_GET_MAX`] keys.
    pub(crate) async fn read_items(
        &self,
        pk: &str,
        sks: &[String],
    ) -> Result<HashMap<String, HashMap<String, AttributeValue>>, StoreError> {
        let mut found = HashMap::new();
        for batch in sks.chunks(BATCH_GET_MAX) {
            found.extend(self.read_batch(pk, batch).await?);
        }
        Ok(found)
    }

    /// [`Store::read_items`] of at most [`BATCH_GET_MAX`] keys: one round trip, and
    /// more only for keys DynamoDB left unprocessed.
    async fn read_batch(
        &self,
        pk: &str,
        sks: &[String],
    ) -> Result<HashMap<String, HashMap<String, AttributeValue>>, StoreError> {
        let pending: Vec<HashMap<String, AttributeValue>> =
            sks.iter().map(|sk| key(pk, sk)).collect();
        // Keys left unread are not absent: a caller deciding on absence (a replay, a
        // plan never stored) must not see them so. Past the tries: Unavailable, try later.
        let tries = Tries::Times(MAX_WRITE_ATTEMPTS);
        let read = retry_carrying(
            "read",
            tries,
            (pending, HashMap::new()),
            |(pending, mut found)| async move {
                let decided = async {
                    let keys = KeysAndAttributes::builder()
                        .set_keys(Some(pending))
                        .consistent_read(true)
                        .build()?;
                    let out = self
                        .client
                        .batch_get_item()
                        .request_items(&self.table, keys)
                        .send()
                        .await?;
                    for item in out
                        .responses()
                        .and_then(|r| r.get(&self.table))
                        .into_iter()
                        .flatten()
                    {
                        if let Some(AttributeValue::S(sk)) = item.get("sk") {
                            found.insert(sk.clone(), item.clone());
                        }
                    }
                    Ok(out
                        .unprocessed_keys()
                        .and_then(|u| u.get(&self.table))
                        .map(|left| left.keys().to_vec())
                        .unwrap_or_default())
                }
                .await;
                match decided {
                    Ok(left) if left.is_empty() => (Ok(Attempt::Done(())), (left, found)),
                    Ok(left) => (Ok(Attempt::Retry), (left, found)),
                    Err(e) => (Err(e), (Vec::new(), found)),
                }
            },
        )
        .await;
        read.0?;
        Ok(read.1.1)
    }

    pub(crate) async fn read(
        &self,
        pk: &str,
        kind: &ReminderKind,
        action: Option<&CheckIn>,
    ) -> Result<Read, StoreError> {
        self.read_keys(pk, kind, action, false, None).await
    }

    /// [`Store::read`] with the user's write counters of `now`'s minute too, in the
    /// same round trip (a write that counts against `CHANGES_PER_MINUTE`).
    pub(crate) async fn read_counted(
        &self,
        pk: &str,
        kind: &ReminderKind,
        now: DateTime<Utc>,
    ) -> Result<Read, StoreError> {
        self.read_keys(pk, kind, None, false, Some(now)).await
    }

    /// [`Store::read`] with the user's preferences too, in the same round trip (a
    /// claim under the daily cap: they name the user's day).
    pub(crate) async fn read_with_preferences(
        &self,
        pk: &str,
        kind: &ReminderKind,
    ) -> Result<Read, StoreError> {
        self.read_keys(pk, kind, None, true, None).await
    }

    async fn read_keys(
        &self,
        pk: &str,
        kind: &ReminderKind,
        action: Option<&CheckIn>,
        preferences: bool,
        rate_at: Option<DateTime<Utc>>,
    ) -> Result<Read, StoreError> {
        let plan_key = plan_sk(&kind.name);
        let quota_key = quota_sk(&kind.template_id);
        let mut sks = vec![plan_key.clone(), quota_key.clone()];
        if preferences {
            sks.push(PREFS_SK.to_string());
        }
        let action_key = action.map(|c| action_sk(&c.action_id));
        let ledger_key = action
            .and_then(|c| c.grant.as_ref())
            .map(|(rid, _)| grant_sk(&kind.template_id, rid));
        sks.extend(action_key.iter().cloned());
        sks.extend(ledger_key.iter().cloned());
        let rate_key = rate_at.map(rate_key);
        sks.extend(rate_key.iter().cloned());
        let mut items = self.read_items(pk, &sks).await?;
        let (counters, open) = quota_of(items.remove(&quota_key).as_ref())?;
        let preferences = if preferences {
            Some(PreferencesItem::of(items.remove(PREFS_SK))?.0)
        } else {
            None
        };
        Ok(Read {
            rate: rate_key.and_then(|k| items.remove(&k)),
            preferences,
            open,
            plan: items
                .remove(&plan_key)
                .map(|i| parse("plan", i))
                .transpose()?,
            counters,
            action: action_key
                .and_then(|k| items.remove(&k))
                .map(|i| parse("action", i))
                .transpose()?,
            ledger: ledger_key
                .and_then(|k| items.remove(&k))
                .map(|i| parse("grant", i))
                .transpose()?,
        })
    }
}
