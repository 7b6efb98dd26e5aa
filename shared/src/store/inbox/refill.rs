//! Publishing a refill notice ([`crate::domain::inbox::refill`]): the notice's ingest
//! — once per depletion, by its idempotency key — in one transaction with two checks,
//! that the stopped template is still used up and that the user holds a grant of the
//! refill template.

use chrono::{DateTime, Utc};

use crate::domain::dispatch::cap::day_zone;
use crate::domain::inbox::NotifyEvent;
use crate::domain::inbox::refill::{Depletion, depletion};
use crate::domain::reminders::plan::PlanStatus;
use crate::domain::{OpenId, QuotaCounters, TemplateId};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::note::Ingested;
use crate::store::items::expr::{Cmp, absent, all, compare, eq};
use crate::store::items::outbox::still_waits;
use crate::store::items::plan::PlanItem;
use crate::store::items::preferences::{PREFS_SK, PreferencesItem};
use crate::store::items::quota::{OpenGrants, has_grant, not_voided_since, unrefused};
use crate::store::items::{n, parse, rfc3339, s};
use crate::store::keys::{outbox_sk, plan_sk, quota_sk, user_pk};
use crate::telemetry::error_chain;

/// How publishing a refill notice ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refilled {
    /// Published: the notification, its push pending with the refill template.
    Published { note_id: String },
    /// This depletion's notice was published before: nothing changed.
    Already,
    /// The user holds no grant of the refill template: nothing written.
    NoRefillGrant,
    /// The template is not used up any more (a grant arrived, a send is in flight), or
    /// since the send was claimed the user refused it or turned its plan off (its grants
    /// voided on purpose): nothing written. A refusal wins over the notice.
    NotUsedUp,
}

/// The refill notice's own checks in its ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The stopped template still used up, and not refused.
    UsedUp,
    /// A grant of the refill template held, and not refused.
    RefillGrant,
}

impl Store {
    /// The depletion a send of `template` finds at its finalize, if any
    /// ([`depletion`]): the quota item read (strongly), and only when it shows the
    /// grants used up, whether the template still has messages to send — `plan_sent`
    /// (the send was a reminder, its plan on), a plan of a kind using it that is on, or
    /// a push on the waiting list still waiting (members whose push ended otherwise do
    /// not count) — and the zone of the user's day (their preferences, read with the
    /// quota item: a reminder's send, which spends a user's only grant as often as
    /// not, finds its depletion in that one round trip). One read, and for a push one
    /// more of at most the plans and the listed pushes at a depletion.
    pub async fn depletion(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        plan_sent: bool,
    ) -> Result<Option<Depletion>, StoreError> {
        let pk = user_pk(openid);
        let quota_key = quota_sk(template);
        let mut first = self
            .read_items(&pk, &[quota_key.clone(), PREFS_SK.to_string()])
            .await?;
        let Some(quota) = first.remove(&quota_key) else {
            return Ok(None);
        };
        let waiting = OpenGrants::of(&quota).waiting;
        let counters = parse::<QuotaCounters>("quota", quota)?;
        if depletion(&counters, true).is_none() {
            return Ok(None);
        }
        // Preferences that cannot be read cost the notice only its zone: China's.
        let quiet_hours = match PreferencesItem::of(first.remove(PREFS_SK)) {
            Ok((prefs, _)) => prefs.quiet_hours,
            Err(e) => {
                tracing::error!(error = %error_chain(&e), "refill notice: the preferences could not be read; China's time");
                None
            }
        };
        let zone = day_zone(quiet_hours.map(|q| q.timezone));
        if plan_sent {
            return Ok(depletion(&counters, true).map(|accepted| Depletion { accepted, zone }));
        }
        let kinds: Vec<_> = self.kinds.using_template(template).collect();
        let mut sks: Vec<String> = kinds.iter().map(|k| plan_sk(&k.name)).collect();
        sks.extend(
            waiting
                .iter()
                .filter_map(|m| crate::domain::dispatch::priority::note_of(m).map(outbox_sk)),
        );
        let found = self.read_items(&pk, &sks).await?;
        let mut more = false;
        for kind in kinds {
            if let Some(item) = found.get(&plan_sk(&kind.name)) {
                let plan = parse::<PlanItem>("plan", item.clone())?.into_plan(kind)?;
                more |= !matches!(plan.status, PlanStatus::Disabled);
            }
        }
        more |= found.iter().any(|(sk, item)| {
            sk.starts_with(crate::store::keys::OUTBOX_PREFIX) && still_waits(item)
        });
        Ok(depletion(&counters, more).map(|accepted| Depletion { accepted, zone }))
    }

    /// Publishes `notice` (a refill notice for the user's grants of `stopped`, used up
    /// at `accepted` grants accepted by a send claimed at `claimed_at`, sent with
    /// `refill`'s grant) if `stopped` is still used up at that depletion — none
    /// available, none reserved, no grant accepted since, no refusal recorded and no
    /// grant voided on purpose since the claim — and the user holds a grant of
    /// `refill`; one transaction either way.
    pub async fn refill(
        &self,
        notice: &NotifyEvent,
        stopped: &TemplateId,
        refill: &TemplateId,
        accepted: u64,
        claimed_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Refilled, StoreError> {
        let pk = user_pk(&notice.openid);
        // Neither template refused by the user's settings: a tap cannot bring the
        // stopped one back, and the notice's own push would not go out.
        let last_refusal = "last_refusal_at";
        let used_up = all([
            compare("available", Cmp::Le, n(0)),
            compare("reserved", Cmp::Le, n(0)),
            eq("accepted", n(accepted)),
            not_voided_since(claimed_at.timestamp_millis()),
            absent(last_refusal).or(compare(last_refusal, Cmp::Lt, s(rfc3339(claimed_at)))),
            unrefused(),
        ]);
        let used_up = self.quota_check(&pk, stopped, used_up)?;
        let held = self.quota_check(&pk, refill, has_grant().and(unrefused()))?;
        // (Nothing for a user being erased: the ingest's own check.)
        let checks = [(Held::UsedUp, used_up), (Held::RefillGrant, held)];
        Ok(
            match Box::pin(self.ingest_checked(notice, None, &checks, now)).await? {
                Ok(Ingested::Created { note_id, .. }) => Refilled::Published { note_id },
                Ok(Ingested::Duplicate { .. } | Ingested::Conflict { .. } | Ingested::Erased) => {
                    Refilled::Already
                }
                Err(Held::UsedUp) => Refilled::NotUsedUp,
                Err(Held::RefillGrant) => Refilled::NoRefillGrant,
            },
        )
    }
}
