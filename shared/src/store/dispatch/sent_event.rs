//! WeChat's `subscribe_msg_sent_event` settling a send whose outcome is unknown (the
//! rules: [`reconcile`](crate::domain::reconcile)).
//!
//! One event reads the template's quota item (its marks and reserved grants) and, when
//! it matches exactly one unknown send, that delivery and its claimed item; then one
//! transaction, conditional on the delivery still being `unknown`, writes the delivery
//! (`sent` with the event's msgid, or `failed`), the grant (`invalid → consumed` when
//! WeChat delivered it), the plan (`paused uncertain → awaiting_checkin`, as a late
//! answer moves it) or the push, and drops the mark. So the same event applied any
//! number of times, concurrently or not, settles once, and a definite delivery is never
//! touched. It never calls WeChat and never resends.
//!
//! While a send of the template is in flight (a grant `reserved`), the event may be
//! that send's, whose msgid is not recorded yet: it waits for the send's answer, a
//! second at most, and otherwise is kept pending until that send settles.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Utc};

use crate::domain::callback::SentItem;
use crate::domain::settle::DeliveryState;
use crate::domain::{GrantState, OpenId, TemplateId};
use crate::store::dispatch::finalize::SourceRef;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::parse;
use crate::store::items::quota::{OPEN_UNKNOWN, OpenGrants, PENDING_EVENTS};
use crate::store::keys::{SortKey, delivery_sk, quota_sk, sort_key, user_pk};
use crate::store::retry::{Attempt, retry_contended};
use crate::telemetry::error_chain;

use crate::domain::dispatch::delivery::{Guard, Marks, Writer};
use crate::store::dispatch::delivery::DeliveryItem;
use crate::store::dispatch::settle::{DeliveryWrite, GrantMove, SettleTx, Settled};

use crate::domain::reconcile::{
    CLOCK_SKEW, EventMatch, Mark, event_result, event_settlement, match_event, pending_event,
    pending_mark,
};

/// How often, and how many times, an event waits for a send in flight to be answered:
/// 1 s at most, so the callback answers well within WeChat's 5 s (after which it pushes
/// again); an event that outwaits it is kept pending, so waiting longer gains nothing.
const IN_FLIGHT_POLL: StdDuration = StdDuration::from_millis(250);
const IN_FLIGHT_POLLS: u32 = 4;

/// What a sent event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentEventOutcome {
    /// The event of a send already recorded `sent`: nothing to settle.
    Known,
    /// It settled this delivery, into this state.
    Settled {
        delivery_id: String,
        state: DeliveryState,
    },
    /// No send of the user and template is unknown within the event's window (or the
    /// one that was got settled meanwhile).
    Unmatched,
    /// Several unknown sends in its window: all left `unknown`.
    Ambiguous,
    /// A send of the template was still in flight after waiting: the event is kept
    /// pending on the quota item, matched again when that send settles `unknown`.
    InFlight,
}

impl Store {
    /// Applies one item of a sent event for `openid` created at `create_time` (epoch
    /// seconds) — see the module docs.
    pub async fn settle_sent_event(
        &self,
        openid: &OpenId,
        event: &SentItem,
        create_time: i64,
        now: DateTime<Utc>,
    ) -> Result<SentEventOutcome, StoreError> {
        let pk = user_pk(openid);
        let mut polls = 0;
        loop {
            let outcome = self.match_sent_event(&pk, event, create_time, now).await?;
            if outcome != SentEventOutcome::InFlight {
                return Ok(outcome);
            }
            if polls < IN_FLIGHT_POLLS {
                polls += 1;
                tokio::time::sleep(IN_FLIGHT_POLL).await;
                continue;
            }
            // Still in flight: kept, to be matched again when that send settles
            // `unknown` (a send that settles definitely makes it known, or stale).
            let quota_key = quota_sk(&event.template_id);
            let pending = pending_mark(create_time, event.msgid, event.error_code).encode();
            self.add_member(&pk, &quota_key, PENDING_EVENTS, pending.clone())
                .await?;
            // The send may have settled between the last look and the mark landing, its
            // settle finding nothing pending: one more look, now that the mark is there.
            let outcome = self.match_sent_event(&pk, event, create_time, now).await?;
            if outcome != SentEventOutcome::InFlight {
                self.delete_members(&pk, &quota_key, &[(PENDING_EVENTS, vec![pending])])
                    .await?;
                return Ok(outcome);
            }
            tracing::warn!(
                msgid = event.msgid,
                "a sent event arrived while a send of its template stayed in flight; kept pending"
            );
            return Ok(SentEventOutcome::InFlight);
        }
    }

    /// After a send of `template` settled `unknown`: the sent events kept pending for
    /// it, matched again (no waiting). Failures are logged: the events stay pending.
    pub async fn settle_pending_events(
        &self,
        openid: &OpenId,
        template: &TemplateId,
        now: DateTime<Utc>,
    ) {
        let pk = user_pk(openid);
        let quota_key = quota_sk(template);
        let pending = match self.get(&pk, &quota_key).await {
            Ok(Some(quota)) => OpenGrants::live(&OpenGrants::of(&quota).pending_marks, now),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "pending sent events not read");
                return;
            }
        };
        for mark in pending {
            let Some((msgid, error_code)) = pending_event(&mark) else {
                continue;
            };
            let event = SentItem {
                template_id: template.clone(),
                msgid,
                error_code,
                error_status: String::new(),
            };
            // Settled by WeChat's event, whoever runs the match.
            let outcome = crate::store::audit::attributed(
                "WeChat sent event (kept pending)",
                self.match_sent_event(&pk, &event, mark.at, now),
            )
            .await;
            match outcome {
                // Another send of the template is still in flight: it stays pending.
                Ok(SentEventOutcome::InFlight) => {}
                Ok(outcome) => {
                    tracing::info!(?outcome, "a pending sent event applied");
                    if let Err(e) = self
                        .delete_members(&pk, &quota_key, &[(PENDING_EVENTS, vec![mark.encode()])])
                        .await
                    {
                        tracing::warn!(error = %error_chain(&e), "a pending sent event not cleared");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "a pending sent event not applied");
                }
            }
        }
    }

    /// One look at the quota item: what the event is, and settling it if it is the
    /// one unknown send it can be. `InFlight` while a send of the template is.
    async fn match_sent_event(
        &self,
        pk: &str,
        event: &SentItem,
        create_time: i64,
        now: DateTime<Utc>,
    ) -> Result<SentEventOutcome, StoreError> {
        let quota_key = quota_sk(&event.template_id);
        let msgid = event.msgid.to_string();
        let open = self
            .get(pk, &quota_key)
            .await?
            .map(|quota| OpenGrants::of(&quota))
            .unwrap_or_default();
        let matched = match_event(
            &msgid,
            create_time,
            &OpenGrants::live(&open.sent_marks, now),
            &OpenGrants::live(&open.unknown_marks, now),
        );
        // Its send is recorded: the mark stays for the window (WeChat may deliver this
        // event again).
        if let EventMatch::Known(_) = matched {
            return Ok(SentEventOutcome::Known);
        }
        // Only a send claimed before the event (give or take the clock skew) can be its.
        let blocking = OpenGrants::live(&open.inflight_marks, now)
            .iter()
            .any(|m| m.at <= create_time + CLOCK_SKEW.num_seconds());
        if blocking {
            return Ok(SentEventOutcome::InFlight);
        }
        self.delete_members(pk, &quota_key, &open.stale_marks(now))
            .await?;
        match matched {
            EventMatch::Known(_) | EventMatch::Unmatched => Ok(SentEventOutcome::Unmatched),
            EventMatch::Ambiguous(n) => {
                tracing::warn!(
                    candidates = n,
                    "a sent event fits several unknown sends; all left unknown"
                );
                Ok(SentEventOutcome::Ambiguous)
            }
            EventMatch::Unknown(mark) => self.settle_by_event(pk, &mark, event, &msgid, now).await,
        }
    }

    /// Settles the unknown delivery `mark` names by the event.
    #[allow(clippy::too_many_arguments)]
    async fn settle_by_event(
        &self,
        pk: &str,
        mark: &Mark,
        event: &SentItem,
        msgid: &str,
        now: DateTime<Utc>,
    ) -> Result<SentEventOutcome, StoreError> {
        let kinds = &*self.kinds;
        let policy = &self.policy;
        let quota_key = quota_sk(&event.template_id);
        let delivery = match self.get(pk, &delivery_sk(&mark.id)).await? {
            Some(item) => Some(parse::<DeliveryItem>("delivery", item)?),
            None => None,
        };
        let Some(delivery) =
            delivery.filter(|d| d.delivery().awaits_sent_event(event.template_id.as_str()))
        else {
            // Settled meanwhile (a late answer) or gone: the mark is all that is left.
            self.delete_members(pk, &quota_key, &[(OPEN_UNKNOWN, vec![mark.encode()])])
                .await?;
            return Ok(SentEventOutcome::Unmatched);
        };
        let settlement = event_settlement(event.error_code, delivery.attempts, policy, now);
        let (result, outcome) = event_result(event.error_code, msgid);
        let source = match sort_key(&delivery.source) {
            SortKey::Plan(kind) => kinds.get(kind).map(SourceRef::Plan),
            SortKey::Outbox(_) => Some(SourceRef::Outbox(&delivery.source)),
            SortKey::Scheduled(_) | SortKey::Delivery(_) | SortKey::Event | SortKey::Other => None,
        };
        let (settlement, result, delivery, outcome) = (&settlement, &result, &delivery, &outcome);
        retry_contended("sent event", self.limits.write_budget, || async move {
            let writes = match source {
                Some(source) => {
                    self.late_source(
                        pk,
                        &delivery.delivery_id,
                        delivery.claimed_at(now),
                        source,
                        settlement,
                        result,
                        now,
                    )
                    .await?
                    .0
                }
                None => Vec::new(),
            };
            let tx = SettleTx {
                pk,
                delivery_id: &delivery.delivery_id,
                claimed_at: delivery.claimed_at(now),
                guard: Guard::Unknown,
                write: DeliveryWrite {
                    state: settlement.delivery,
                    class: settlement.class,
                    outcome: outcome.clone(),
                    errcode: result.errcode(),
                    msgid: Some(msgid.to_string()),
                    by: Writer::Event,
                    // (A sent event's failure is never 43101's voiding: it tells of one
                    // message, not of the user's subscription.)
                    void_others: false,
                },
                template: &event.template_id,
                // Its msgid stays known for the window, as any send's recorded `sent`
                // does, so a copy of this event is known as its own.
                marks: Marks {
                    close_unknown: Some(mark.encode()),
                    sent: Some(Mark::new(now, msgid).encode()),
                    ..Marks::default()
                },
                // WeChat took it: the grant void for want of an answer was spent.
                grant: (settlement.grant == GrantState::Consumed).then_some(GrantMove {
                    sk: &delivery.grant_sk,
                    from: GrantState::Invalid,
                    to: GrantState::Consumed,
                }),
                counted_on: delivery.counted_on,
                retry_whole: true,
                source: writes,
            };
            Ok(match self.write_settlement(tx, now).await? {
                Settled::Landed { .. } => {
                    tracing::info!(
                        delivery_id = %delivery.delivery_id,
                        state = settlement.delivery.as_str(),
                        "an unknown send settled by WeChat's sent event"
                    );
                    Attempt::Done(SentEventOutcome::Settled {
                        delivery_id: delivery.delivery_id.clone(),
                        state: settlement.delivery,
                    })
                }
                Settled::SourceMoved => Attempt::Retry,
                // Another copy of the event (or a late answer) got there first.
                Settled::DeliveryMoved(_) => Attempt::Done(SentEventOutcome::Unmatched),
            })
        })
        .await
    }
}
