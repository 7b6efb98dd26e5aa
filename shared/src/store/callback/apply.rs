//! WeChat's events applied: what a recorded popup, change or sent event does to
//! grants, plans and deliveries, in WeChat's order (`CreateTime`), by the callback or,
//! when every try of it failed, by the dispatcher's sweep. Recording an event once is
//! [`record`](super::record)'s.

use chrono::{DateTime, Utc};

use crate::domain::callback::{Choice, PushEvent, PushMessage};
use crate::domain::consent::Refusal;
use crate::domain::template::Templates;
use crate::domain::{OpenId, TemplateId};
use crate::store::callback::record::PushKey;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::update;
use crate::store::items::event::PushItem;
use crate::store::items::{n, rfc3339, s};
use crate::store::keys::{quota_sk, user_pk};

use crate::store::items::expr::{Cmp, absent, compare};
use crate::store::items::key as key_of;
use crate::store::items::quota::{CHOICE_AT, quota_change};

impl Store {
    /// The configured templates a popup event accepts (none unless grants are
    /// confirmed by popup events: `PUSH_EVENTS`).
    pub fn popup_accepts<'a>(
        &self,
        message: &'a PushMessage,
        templates: &Templates,
    ) -> Vec<&'a TemplateId> {
        if !self.limits.push_events {
            return Vec::new();
        }
        message.event.popup_accepts(|t| templates.contains(t))
    }

    /// What a recorded event does, each step idempotent (a retry of the event, or the
    /// sweep, may run it again): a refusal pauses the template's plans (and, made in
    /// WeChat's settings, voids its available grants); a sent event settles the one
    /// unknown send it can be (`dispatch::sent_event`); a popup accept confirms the
    /// grant the client reported for the same tap (`taps`), never granting one itself.
    /// Choices apply in WeChat's order ([`Store::order_choice`]).
    pub async fn apply_push(
        &self,
        message: &PushMessage,
        templates: &Templates,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (choices, void_grants) = message.event.choices();
        let mut refused = Vec::new();
        for (template, choice) in choices {
            if !templates.contains(template) {
                continue;
            }
            // (A time ahead of ours counts as now: one far in the future must not make
            // every later refusal look out of order.)
            let made = message.create_time.min(now.timestamp());
            if !self
                .order_choice(
                    &message.openid,
                    template,
                    made,
                    choice == Choice::Reject,
                    now,
                )
                .await?
            {
                tracing::warn!(
                    template = %template,
                    create_time = message.create_time,
                    "a choice older than one already applied: changes nothing"
                );
                continue;
            }
            if choice == Choice::Reject {
                refused.push(template);
            }
        }
        if let PushEvent::Sent(items) = &message.event {
            for item in items {
                if !templates.contains(&item.template_id) {
                    continue;
                }
                let outcome = self
                    .settle_sent_event(&message.openid, item, message.create_time, now)
                    .await?;
                tracing::info!(?outcome, "sent event applied");
            }
        }
        for template in self.popup_accepts(message, templates) {
            let confirmed = self.pair_taps(&message.openid, template, now).await?;
            tracing::info!(confirmed, "popup accept applied");
        }
        for template in refused {
            self.refuse_template(
                &message.openid,
                template,
                void_grants,
                message.create_time,
                now,
            )
            .await?;
        }
        Ok(())
    }

    /// A recorded event past [`APPLY_GRACE`] on the lease index: applied now if no try
    /// of WeChat's did, then marked applied (which takes it off the index). False if
    /// there was nothing to do.
    pub(crate) async fn apply_recorded(
        &self,
        pk: &str,
        sk: &str,
        templates: &Templates,
        now: DateTime<Utc>,
    ) -> Result<Result<bool, String>, StoreError> {
        let Some(item) = self.get(pk, sk).await? else {
            return Ok(Ok(false));
        };
        let record: PushItem = match crate::store::items::parse("push", item) {
            Ok(record) => record,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let key = PushKey {
            pk: record.pk.clone(),
            sk: record.sk.clone(),
        };
        if record.applied {
            // Applied, but its mark lost the index entry's removal: mark it again.
            self.push_applied(&key).await?;
            return Ok(Ok(false));
        }
        let Some(message) = record.message() else {
            return Ok(Err(format!(
                "{sk}: a recorded event that does not read back"
            )));
        };
        crate::store::audit::attributed(
            "WeChat event, applied by the sweep",
            self.apply_push(&message, templates, now),
        )
        .await?;
        self.push_applied(&key).await?;
        tracing::warn!(sk = %sk, "a recorded event no try applied: applied by the sweep");
        Ok(Ok(true))
    }

    /// Puts WeChat's choice for `template`, made at `create_time` (a popup or change
    /// event's item), in WeChat's order: recorded on the template's quota item unless
    /// one made later was applied already. False when it is out of order — a retried
    /// reject arriving after the user's later accept — and then it changes nothing.
    /// The same time again is in order (a retry of the event itself, or a reject and
    /// an accept in one second, where the refusal wins). A reject (`refused`) is
    /// remembered as the template's last refusal (`last_refusal_at`), as a report's is:
    /// a refill notice for a send claimed before it is not sent.
    pub async fn order_choice(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        create_time: i64,
        refused: bool,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::types::AttributeValue;
        // Names the quota item it may create, so it reads as one.
        let choice = quota_change(template, now).set(CHOICE_AT, n(create_time));
        let choice = if refused {
            choice
                .set("last_refusal", s("reject"))
                .set("last_refusal_at", s(rfc3339(now)))
        } else {
            choice
        };
        let not_newer = absent(CHOICE_AT).or(compare(
            CHOICE_AT,
            Cmp::Le,
            AttributeValue::N(create_time.to_string()),
        ));
        update(
            &self.table,
            key_of(&user_pk(openid), &quota_sk(template)),
            choice,
        )
        .when(not_newer)
        .apply(&self.client)
        .await
    }

    /// The user refused `template`: the plans of the kinds that use it pause, as a
    /// refusal in a grant report does; with `void_grants` (turned off in WeChat's
    /// settings, where sends now fail with 43101) its available grants become invalid
    /// too — those reserved by a send in flight included (it consumes one if WeChat took
    /// the message, and never restores it). Idempotent.
    pub async fn refuse_template(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        void_grants: bool,
        create_time: i64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let kinds = &*self.kinds;
        let pk = &user_pk(openid);
        if void_grants {
            // Only grants recorded before WeChat's time of the refusal (to the end of
            // its second: a tie goes to the refusal): one the user gave after it, which
            // a late or repeated event must not take away, stays.
            let made = DateTime::from_timestamp(create_time.saturating_add(1), 0).unwrap_or(now);
            // Reserved ones too, as a disable does: a send in flight then spends it if
            // WeChat took the message, and can never give it back.
            self.void_recorded_before("refusal", pk, template, true, made.min(now), now)
                .await?;
        }
        for kind in kinds.using_template(template) {
            self.refuse_plan(openid, kind, Refusal::Reject, now).await?;
        }
        Ok(())
    }
}
