//! A claim's read: the item behind a due entry, with its template's counters and
//! open grants (and, for a push, the user's preferences), in as few round trips as
//! the item allows.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::claimable::{Claimable, Found};
use crate::domain::QuotaCounters;
use crate::domain::TemplateId;
use crate::domain::dispatch::claim::push_is_due_at;
use crate::domain::inbox::cancel::Requested;
use crate::domain::inbox::preferences::Preferences;
use crate::store::dispatch::delivery::PlanRead;
use crate::store::dispatch::due::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::outbox::{CANCEL_REQUESTED, OutboxItem, Publication, REPLACE_REQUESTED};
use crate::store::items::parse;
use crate::store::items::preferences::{PREFS_SK, PreferencesItem};
use crate::store::items::quota::{OpenGrants, quota_of};
use crate::store::keys::{SortKey, note_sk, quota_sk, sort_key};

impl Store {
    /// The item behind a due entry, if it is still due at that instant.
    pub(super) async fn claimable(&self, item: &DueItem) -> Result<Found, StoreError> {
        let named = sort_key(&item.sk);
        if let Some(kind) = self.plan_kind(&item.sk) {
            // Under a daily cap the user's preferences name their day.
            let capped = self.limits.pushes_per_day.is_some();
            let (plan, counters, open, prefs) = match self.read_plan(&item.pk, kind, capped).await?
            {
                PlanRead::Found(plan, counters, open, prefs) => (*plan, counters, open, prefs),
                PlanRead::Missing => return Ok(Found::Gone),
                PlanRead::Unreadable(why) => return Ok(Found::Unreadable(why)),
            };
            if !plan.is_due_by(item.due_at) {
                return Ok(Found::Gone);
            }
            return Ok(Found::Due(Box::new(Claimable::Plan {
                kind: kind.clone(),
                plan,
                counters,
                open,
                prefs: prefs.map(|p| *p),
            })));
        }
        if let SortKey::Outbox(_) = named {
            let Some(got) = self.get(&item.pk, &item.sk).await? else {
                return Ok(Found::Gone);
            };
            let outbox: OutboxItem = match parse("outbox", got) {
                Ok(outbox) => outbox,
                Err(e) => return Ok(Found::Unreadable(e.to_string())),
            };
            if !push_is_due_at(outbox.state, outbox.due_at, item.due_at) {
                return Ok(Found::Gone);
            }
            let Ok(template) = TemplateId::parse(outbox.template_id.clone()) else {
                return Ok(Found::Unreadable("a push with a bad template id".into()));
            };
            // The template's counters, the user's preferences and the notification (a
            // cancel recorded on it), in one round trip.
            let note_key = note_sk(&outbox.note_id);
            let (counters, open, prefs, _, note) = self
                .push_context(&item.pk, &template, Some(&note_key))
                .await?;
            let requested = note.and_then(|note| {
                if note.contains_key(CANCEL_REQUESTED) {
                    Some(Requested::Cancel)
                } else if note.contains_key(REPLACE_REQUESTED) {
                    Some(Requested::Replace)
                } else {
                    None
                }
            });
            return Ok(Found::Due(Box::new(Claimable::Outbox {
                outbox,
                counters,
                open,
                prefs,
                requested,
                publication: None,
                ahead: false,
            })));
        }
        // A kind missing from the configuration (removed, or a rollback) is not a bad
        // item: it stays, moved out of the way, for when the kind is back.
        match named {
            SortKey::Plan(kind) => Ok(Found::NoKind(kind.to_string())),
            _ => Ok(Found::Gone),
        }
    }

    /// A push to publish and claim at once: its template's counters and the user's
    /// preferences, in one round trip (its notification is not written yet, so no
    /// cancel or replacement can be recorded on it: a cancel changes the scheduled item instead).
    pub(super) async fn publishable(
        &self,
        item: &DueItem,
        ahead: &ReadAhead,
    ) -> Result<Found, StoreError> {
        let publication = &ahead.publication;
        let outbox = &publication.outbox;
        if outbox.pk != item.pk || outbox.sk != item.sk {
            return Ok(Found::Unreadable("a publication of another push".into()));
        }
        let Ok(template) = TemplateId::parse(outbox.template_id.clone()) else {
            return Ok(Found::Unreadable("a push with a bad template id".into()));
        };
        // What was read ahead serves the first attempt; any other reads again.
        let context = ahead.take(self.clock.now());
        let read_ahead = context.is_some();
        let (counters, open, prefs, version) = match context {
            Some(context) => context,
            None => {
                let (counters, open, prefs, version, _) =
                    self.push_context(&item.pk, &template, None).await?;
                (counters, open, prefs, version)
            }
        };
        // Conditional on the preferences as read (a mute or quiet hours saved since
        // make the claim publish the ordinary way and read them again); the counters
        // are conditions of the claim itself.
        let mut writes = publication.writes.clone();
        writes.push(self.prefs_unchanged(&item.pk, version)?);
        Ok(Found::Due(Box::new(Claimable::Outbox {
            outbox: outbox.clone(),
            counters,
            open,
            prefs,
            requested: None,
            publication: Some(writes),
            ahead: read_ahead,
        })))
    }

    /// Reads ahead of its instant what the claim of `publication`'s push decides on
    /// (its template's counters and open grants, the user's preferences), so that at
    /// the instant the claim is one transaction: a push goes out as soon after its
    /// `send_at` as a plan after its due instant, or sooner. A read that fails is
    /// logged and left to the claim.
    pub async fn read_ahead(&self, publication: Publication) -> ReadAhead {
        let outbox = &publication.outbox;
        let context = match TemplateId::parse(outbox.template_id.clone()) {
            Ok(template) => match self.push_context(&outbox.pk, &template, None).await {
                Ok((counters, open, prefs, version, _)) => Some((counters, open, prefs, version)),
                Err(e) => {
                    tracing::warn!(
                        error = %crate::telemetry::error_chain(&e),
                        "a push's context could not be read ahead; read at its claim"
                    );
                    None
                }
            },
            Err(_) => None,
        };
        ReadAhead {
            publication,
            context: std::sync::Mutex::new(context),
            read_at: self.clock.now(),
        }
    }

    /// A push's template counters and open grants, the user's preferences and, when
    /// asked, its notification: one round trip.
    async fn push_context(
        &self,
        pk: &str,
        template: &TemplateId,
        note_key: Option<&str>,
    ) -> Result<PushContext, StoreError> {
        let quota_key = quota_sk(template);
        let mut keys = vec![quota_key.clone(), PREFS_SK.to_string()];
        keys.extend(note_key.map(str::to_string));
        let mut read = self.read_items(pk, &keys).await?;
        let (counters, open) = quota_of(read.remove(&quota_key).as_ref())?;
        let (prefs, version) = PreferencesItem::of(read.remove(PREFS_SK))?;
        let note = note_key.and_then(|k| read.remove(k));
        Ok((counters, open, prefs, version, note))
    }
}

/// A push's template counters, open grants, the user's preferences (and their
/// version) and its notification (when read).
type PushContext = (
    QuotaCounters,
    OpenGrants,
    Preferences,
    u64,
    Option<HashMap<String, AttributeValue>>,
);

/// A push's template counters, open grants, and the user's preferences with their
/// version, as read ahead.
type Context = (QuotaCounters, OpenGrants, Preferences, u64);

/// A scheduled notification's publication with what its push's claim decides on,
/// read ahead of its instant ([`Store::read_ahead`]); claimed by
/// [`Store::claim_published`].
pub struct ReadAhead {
    pub(crate) publication: Publication,
    /// Taken by the claim's first attempt.
    context: std::sync::Mutex<Option<Context>>,
    read_at: chrono::DateTime<chrono::Utc>,
}

/// How old a read ahead may be when its claim decides on it: older (a process that
/// stalled, a read that came late), the claim reads again.
const READ_AHEAD_FOR: std::time::Duration = std::time::Duration::from_secs(3);

impl ReadAhead {
    /// What was read ahead, once, while it is recent at `now`.
    fn take(&self, now: chrono::DateTime<chrono::Utc>) -> Option<Context> {
        let context = self
            .context
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let age = (now - self.read_at).to_std().unwrap_or_default();
        context.filter(|_| age <= READ_AHEAD_FOR)
    }
}
