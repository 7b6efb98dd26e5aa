//! Confirming client-reported grants with WeChat's popup events (the rules:
//! [`pair_taps`](crate::domain::reconcile::pair_taps)).
//!
//! Each side leaves a mark on the template's quota item in the same transaction that
//! records it, so exactly once: a grant report (or a check-in's grant) its request id
//! and time in `taps_reported`, a recorded popup accept its create time in
//! `taps_popup`. After its own write, each side pairs what the quota item holds: one
//! transaction per pair sets the grant's `confirmed_at`, adds 1 to `confirmed` and
//! removes both marks, conditional on both marks still being there. Whichever side
//! lands second reads both marks (a strongly consistent read after its own write), so
//! a tap seen from both sides is confirmed once, in either order and concurrently; a
//! popup accept never becomes a grant. Marks too old to pair are dropped by the read.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};

use crate::domain::reconcile::{Mark, pair_taps, tap_is_stale};
use crate::domain::{OpenId, RequestId, TemplateId};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::change::{change, update};
use crate::store::items::expr::{absent, contains};
use crate::store::items::quota::{TAPS_POPUP, TAPS_REPORTED, quota_change};
use crate::store::items::{is_there, key, n, rfc3339, s};
use crate::store::keys::{grant_sk, quota_sk, user_pk};
use crate::store::retry::{Attempt, retry_contended};
use crate::store::tx::{Outcome, Parts};

/// The set members of `name` on an item, as marks (members that are not marks are
/// left out).
fn marks(item: &crate::store::items::Item, name: &str) -> Vec<Mark> {
    item.get(name)
        .and_then(|v| v.as_ss().ok())
        .map(|members| members.iter().filter_map(|m| Mark::parse(m)).collect())
        .unwrap_or_default()
}

/// The parts of a pairing's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pair {
    /// The grant confirmed: gone or confirmed already, its mark has nothing to pair.
    Grant,
    /// Both marks taken off the quota item.
    Marks,
}

impl Store {
    /// The write that leaves a popup accept's mark on the quota item of `template`
    /// (creating the item if the user has reported nothing yet).
    pub(crate) fn popup_tap(
        &self,
        pk: &str,
        template: &TemplateId,
        create_time: i64,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let mark = crate::domain::reconcile::popup_mark(create_time).encode();
        let tapped = quota_change(template, now).add(TAPS_POPUP, AttributeValue::Ss(vec![mark]));
        update(&self.table, key(pk, &quota_sk(template)), tapped).write()
    }

    /// Confirms the user's reported grants of `template` that popup accepts match (see
    /// the module docs); how many it confirmed.
    pub async fn pair_taps(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        let pk = &user_pk(openid);
        let quota_key = &quota_sk(template);
        retry_contended("tap pairing", self.limits.write_budget, || async move {
            let Some(quota) = self.get(pk, quota_key).await? else {
                return Ok(Attempt::Done(0));
            };
            let (reported, popups) = (marks(&quota, TAPS_REPORTED), marks(&quota, TAPS_POPUP));
            let stale = |m: &Vec<Mark>| -> Vec<String> {
                m.iter()
                    .filter(|m| tap_is_stale(m, now))
                    .map(Mark::encode)
                    .collect()
            };
            self.drop_taps(pk, quota_key, stale(&reported), stale(&popups))
                .await?;
            let live = |m: Vec<Mark>| -> Vec<Mark> {
                m.into_iter().filter(|m| !tap_is_stale(m, now)).collect()
            };
            let (reported, popups) = (live(reported), live(popups));
            let mut confirmed = 0;
            for (grant, popup) in pair_taps(&reported, &popups) {
                let Ok(request) = RequestId::parse(grant.id.clone()) else {
                    self.drop_taps(pk, quota_key, vec![grant.encode()], Vec::new())
                        .await?;
                    continue;
                };
                let writes = Parts::new()
                    .with(
                        Pair::Grant,
                        self.confirm_grant(pk, template, &request, now)?,
                    )
                    .with(
                        Pair::Marks,
                        self.take_tap_pair(pk, quota_key, &grant, &popup, now)?,
                    );
                match self.transact_parts(&writes).await? {
                    Outcome::Committed => confirmed += 1,
                    Outcome::Cancelled(failed) => {
                        if failed.has(Pair::Grant) {
                            // No such grant to confirm (or confirmed already): its mark
                            // has nothing to pair.
                            self.drop_taps(pk, quota_key, vec![grant.encode()], Vec::new())
                                .await?;
                        }
                        // Paired by the other side meanwhile: read again.
                        return Ok(Attempt::Retry);
                    }
                    Outcome::Contended | Outcome::Conflict => return Ok(Attempt::Retry),
                }
            }
            Ok(Attempt::Done(confirmed))
        })
        .await
    }

    /// [`Store::pair_taps`] after a write that already landed: a failure is logged,
    /// not returned.
    pub(crate) async fn pair_taps_logged(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) {
        if let Err(e) = self.pair_taps(openid, template, now).await {
            tracing::warn!(error = %crate::telemetry::error_chain(&e), "grant confirmation by popup events deferred");
        }
    }

    fn confirm_grant(
        &self,
        pk: &str,
        template: &TemplateId,
        request: &RequestId,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        update(
            &self.table,
            key(pk, &grant_sk(template, request)),
            change().set("confirmed_at", s(rfc3339(now))),
        )
        .when(is_there().and(absent("confirmed_at")))
        .write()
    }

    fn take_tap_pair(
        &self,
        pk: &str,
        quota_key: &str,
        grant: &Mark,
        popup: &Mark,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let taken = change()
            .set("updated_at", s(rfc3339(now)))
            .add("confirmed", n(1))
            .delete(TAPS_REPORTED, AttributeValue::Ss(vec![grant.encode()]))
            .delete(TAPS_POPUP, AttributeValue::Ss(vec![popup.encode()]));
        update(&self.table, key(pk, quota_key), taken)
            .when(
                contains(TAPS_REPORTED, s(grant.encode()))
                    .and(contains(TAPS_POPUP, s(popup.encode()))),
            )
            .write()
    }

    async fn drop_taps(
        &self,
        pk: &str,
        quota_key: &str,
        reported: Vec<String>,
        popups: Vec<String>,
    ) -> Result<(), StoreError> {
        self.delete_members(
            pk,
            quota_key,
            &[(TAPS_REPORTED, reported), (TAPS_POPUP, popups)],
        )
        .await
    }
}
