//! The sweep: what a vanished or stalled dispatcher, or a WeChat push no try applied,
//! left past its lease (I4, I5). It sits above the features whose leftovers it
//! settles — deliveries and plans (`dispatch`), recorded events (`callback`) — so
//! neither calls the other through it: `callback` settles sent events with
//! `dispatch`, and `dispatch` never calls `callback`.

use chrono::{DateTime, Utc};

use crate::domain::template::Templates;
use crate::store::dispatch::SweepSummary;
use crate::store::dispatch::sweep::Step;
use crate::store::handle::Store;
use crate::store::items::{number, text};
use crate::store::keys::{SortKey, sort_key};

impl Store {
    /// Settles what is past its lease (see the module docs of
    /// [`dispatch`](crate::store::dispatch)): one query page per shard of the lease
    /// index, never a scan.
    pub async fn sweep(
        &self,
        templates: &Templates,
        shards: impl IntoIterator<Item = u32>,
        now: DateTime<Utc>,
    ) -> SweepSummary {
        let (stale, skipped) = self.past_their_lease(shards, now).await;
        let mut summary = SweepSummary {
            skipped,
            ..SweepSummary::default()
        };
        // (pk, sk, lease as seen) of the deliveries, the plans, and anything else.
        let (mut deliveries, mut plans, mut events, mut others) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for item in &stale {
            let (Some(pk), Some(sk), Some(seen)) = (
                text(item, "pk"),
                text(item, "sk"),
                number(item, "lease_until"),
            ) else {
                continue;
            };
            let entry = (pk.to_string(), sk.to_string(), seen);
            match sort_key(sk) {
                SortKey::Delivery(_) => deliveries.push(entry),
                SortKey::Plan(_) => plans.push(entry),
                SortKey::Event => events.push(entry),
                SortKey::Outbox(_) | SortKey::Scheduled(_) | SortKey::Other => others.push(entry),
            }
        }
        // Deliveries first: settling one usually moves its plan in the same write.
        for (pk, sk, seen) in deliveries {
            let settled = self.sweep_delivery(&pk, &sk, now).await;
            let kept = matches!(settled, Ok(Step::Kept));
            let acted = self
                .tally(settled, (&pk, &sk, seen), now, &mut summary)
                .await;
            if kept {
                summary.kept += acted;
            } else {
                summary.recovered += acted;
            }
        }
        for (pk, sk, seen) in plans {
            let moved = self.sweep_plan(&pk, &sk, now).await;
            summary.advanced += self.tally(moved, (&pk, &sk, seen), now, &mut summary).await;
        }
        for (pk, sk, seen) in events {
            let applied = self
                .apply_recorded(&pk, &sk, templates, now)
                .await
                .map(|found| match found {
                    Ok(true) => Step::Acted,
                    Ok(false) => Step::Idle,
                    Err(why) => Step::Unreadable(why),
                });
            summary.events_applied += self
                .tally(applied, (&pk, &sk, seen), now, &mut summary)
                .await;
        }
        for (pk, sk, seen) in others {
            let unknown = Ok(Step::Unreadable(format!("{sk}: no kind of lease holder")));
            self.tally(unknown, (&pk, &sk, seen), now, &mut summary)
                .await;
        }
        summary
    }
}
