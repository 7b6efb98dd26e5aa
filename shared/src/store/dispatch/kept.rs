//! What a finalize leaves for the sweep when it cannot finish in its invocation, so
//! WeChat's answer is never lost (I4): the answer kept on the delivery
//! ([`KeptAnswer`]) when the settlement cannot commit, and a 43101's voiding of the
//! template's other grants, marked on the settled delivery until it is done.

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};

use crate::domain::dispatch::delivery::Guard;
use crate::domain::settle::{KeptAnswer, SendResult};
use crate::store::dispatch::claimed::Claim;
use crate::store::dispatch::delivery::admitted_by;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, update};
use crate::store::items::expr::eq;
use crate::store::items::{key, n};
use crate::store::keys::{delivery_sk, user_pk};

impl Store {
    /// Voids the grants of `template` recorded before `claimed_at` (43101's reach),
    /// then takes the delivery that was refused off the lease index: until then its
    /// `void_others` mark keeps it there, so a sweep finishes this if it fails here.
    pub(crate) async fn void_others(
        &self,
        pk: &str,
        delivery_id: &str,
        template: &crate::domain::TemplateId,
        claimed_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.void_recorded_before("grant invalidation", pk, template, false, claimed_at, now)
            .await?;
        let cleared = change()
            .remove("void_others")
            .remove("lease_pk")
            .remove("lease_until");
        // (Its condition failing means cleared already: a retry of this, or the sweep.)
        update(&self.table, key(pk, &delivery_sk(delivery_id)), cleared)
            .when(eq("void_others", AttributeValue::Bool(true)))
            .apply(&self.client)
            .await?;
        Ok(())
    }

    /// Keeps WeChat's definite answer on the delivery when its settlement could not
    /// commit while the invocation had time: one conditional single-item write, cheaper
    /// and likelier to land than the transaction. The sweep then settles the delivery
    /// by it once its lease ends, not `unknown` (I4). False if there is nothing to keep
    /// (an uncertain answer) or the delivery is no longer this claim's live one.
    pub async fn keep_answer(
        &self,
        claim: &Claim,
        result: &SendResult,
    ) -> Result<bool, StoreError> {
        let Some(kept) = KeptAnswer::of(result) else {
            return Ok(false);
        };
        let kept = serde_dynamo::to_attribute_value(&kept)
            .map_err(|e| StoreError::Corrupt(format!("kept answer: {e}")))?;
        let pk = user_pk(&claim.openid);
        // The lease moves (to now: past, so the next sweep settles by the answer): a
        // sweep that read the delivery before this write fails its guard on the lease
        // it saw, instead of settling `unknown` over the kept answer.
        let keep = change()
            .set("kept_answer", kept)
            .set("lease_until", n(self.clock.now().timestamp_millis()));
        update(
            &self.table,
            key(&pk, &delivery_sk(&claim.delivery_id)),
            keep,
        )
        .when(admitted_by(Guard::Claimer(&claim.claimer)))
        .apply(&self.client)
        .await
    }
}
