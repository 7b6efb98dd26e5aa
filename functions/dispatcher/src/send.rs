//! One due item: its turn, a token, the claim, the send, the finalize, and the answer
//! kept when the finalize cannot commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use onegrant::Deps;
use onegrant::domain::OpenId;
use onegrant::domain::dispatch::claim::Tally;
use onegrant::domain::keywords::fit_all;
use onegrant::domain::reminders::ContentValues;
use onegrant::domain::settle::{OutcomeClass, SendResult};
use onegrant::store::StoreError;
use onegrant::store::dispatch::{Claim, ClaimOutcome, ClaimSource, DueItem, Finalized};
use onegrant::store::inbox::Published;
use onegrant::telemetry::{error_chain, openid_hash};
use onegrant::wechat::Message;
use tokio::sync::Semaphore;

use crate::budget::{Budget, FINALIZE_MARGIN, FINALIZE_RETRY_ROOM, FINALIZE_TRIES};
use crate::refill::Refill;

/// How long before its instant a scheduled notification is read for its claim.
const READ_AHEAD: Duration = Duration::from_secs(1);

pub(crate) enum Dispatched {
    Done {
        finalized: Finalized,
        latency_ms: i64,
        /// What the send left for a refill notice.
        refill: Refill,
    },
    Released(Finalized),
    Unreadable,
    /// A plan of a reminder kind not configured, its entry moved out of the way.
    Parked(String),
    Lost,
    /// Not sent now (`domain::dispatch::claim::Unsent`): what it counts, and what a
    /// push left waiting for a grant left for a refill notice.
    Unsent {
        tally: Tally,
        refill: Refill,
    },
    /// A template's wake entry: this many waiting pushes woken.
    Woken(u32),
    /// A step of a user's erasure: whether it finished it, or found it stalled.
    Erasure {
        done: bool,
        stalled: bool,
    },
    /// A scheduled notification published, with no push to send.
    Published,
    Deferred,
    NoToken,
}

pub(crate) async fn dispatch_one(
    deps: &Deps,
    item: &DueItem,
    claimer: &str,
    budget: Budget,
    permits: &Semaphore,
    published: &AtomicBool,
) -> Result<Dispatched, StoreError> {
    let config = &deps.config;
    // A user's erasure carried on (no send, no turn).
    if item.is_erasure() {
        let erasure = deps.store.erase_due(item, deps.clock.now()).await?;
        return Ok(Dispatched::Erasure {
            done: erasure.state == onegrant::domain::erasure::ErasureState::Done,
            stalled: erasure.stalled,
        });
    }
    // A user inactive for INACTIVE_USER_DAYS: their erasure begun.
    if item.is_inactivity() {
        let erasure = deps.store.inactive_due(item, deps.clock.now()).await?;
        if erasure.begun {
            tracing::info!("an inactive user's erasure began");
        }
        return Ok(Dispatched::Erasure {
            done: false,
            stalled: false,
        });
    }
    let Some(openid) = item.openid() else {
        tracing::error!("due item outside any user partition taken off the due index");
        deps.store.quarantine_due(item, deps.clock.now()).await?;
        return Ok(Dispatched::Unreadable);
    };
    // A grant given while pushes of its template wait: wake them (no send, no turn).
    if item.is_wake() {
        let woken = deps.store.wake_due(item, deps.clock.now()).await?;
        return Ok(Dispatched::Woken(u32::try_from(woken).unwrap_or(u32::MAX)));
    }
    let wait = (item.due_at - deps.clock.now())
        .to_std()
        .unwrap_or_default();
    if wait + budget.after_turn > budget.left() {
        return Ok(Dispatched::Deferred);
    }
    // A scheduled notification with a push is read shortly before its instant (each
    // when its own instant nears, so a page of them is not read in one burst), with
    // what its push's claim decides on, and at its instant published and its push
    // claimed in one transaction, as quickly after it is due as a plan; any other (no
    // push, expired, changed, muted, held, no grant) is published first and its push,
    // if any, then claimed like any other.
    let mut publication = if item.is_scheduled_note() {
        let read_at = item.due_at - chrono::Duration::from_std(READ_AHEAD).unwrap_or_default();
        deps.clock.sleep_until(read_at).await;
        let (pk, sk) = item.key();
        match deps
            .store
            .publication(pk, sk, item.due_at, deps.clock.now())
            .await?
        {
            Some(publication) => Some(deps.store.read_ahead(publication).await),
            None => None,
        }
    } else {
        None
    };
    // (Until the instant itself: the read above took some of the wait.)
    deps.clock.sleep_until(item.due_at).await;
    let entry = item;
    let published_push;
    let item = match entry.published_push() {
        Some(push) => {
            if publication.is_none()
                && let Err(done) = Box::pin(publish(deps, entry, published)).await?
            {
                return Ok(done);
            }
            published_push = push;
            &published_push
        }
        None => entry,
    };
    // A push claimed with its publication needs the user's turn, a permit and the
    // token at once; whatever keeps it waiting, its notification is listed at its
    // instant: published the ordinary way first, its push then waiting in the outbox.
    let at_once = match publication {
        Some(_) => ready_at_once(deps, &openid, permits, &budget),
        None => None,
    };
    let (turn, _permit, token) = match at_once {
        Some(ready) => ready,
        None => {
            if publication.take().is_some()
                && let Err(done) = Box::pin(publish(deps, entry, published)).await?
            {
                return Ok(done);
            }
            match Box::pin(ready(deps, &openid, permits, &budget)).await {
                Ok(ready) => ready,
                Err(unclaimed) => return Ok(unclaimed),
            }
        }
    };
    // The lease covers the send's window and the finalize, and never less than the
    // configured lease.
    let lease = config.dispatch.lease.max(budget.after_claim);
    let mut outcome = match &publication {
        Some(publication) => {
            deps.store
                .claim_published(item, publication, claimer, lease, deps.clock.now())
                .await?
        }
        None => {
            deps.store
                .claim(item, claimer, lease, deps.clock.now())
                .await?
        }
    };
    if publication.is_some() {
        match outcome {
            // Nothing written: publish it the ordinary way, then claim its push.
            ClaimOutcome::Republish => match Box::pin(publish(deps, entry, published)).await? {
                Ok(_) => {
                    outcome = deps
                        .store
                        .claim(item, claimer, lease, deps.clock.now())
                        .await?
                }
                Err(done) => return Ok(done),
            },
            ClaimOutcome::Claimed(_) => published.store(true, Ordering::Relaxed),
            _ => {}
        }
    }
    let claim = match outcome {
        ClaimOutcome::Claimed(claim) => claim,
        ClaimOutcome::Lost => return Ok(Dispatched::Lost),
        ClaimOutcome::Unsent { why, template } => {
            // A message stopped for want of a grant: the refill notice, if the grants
            // are used up (with the send that used them, whichever sees it first).
            let refill = if why.waits_for_grant() {
                let room = budget.left().saturating_sub(FINALIZE_MARGIN);
                let now = deps.clock.now();
                Box::pin(crate::refill::tell(
                    deps, &openid, &template, false, now, room,
                ))
                .await
            } else {
                Refill::Nothing
            };
            let tally = why.tally();
            return Ok(Dispatched::Unsent { tally, refill });
        }
        // (Only from a publication, handled above.)
        ClaimOutcome::Republish => return Ok(Dispatched::Lost),
        ClaimOutcome::NoKind(kind) => {
            let until = onegrant::domain::dispatch::claim::parked_until(deps.clock.now());
            deps.store.park_due(item, until).await?;
            return Ok(Dispatched::Parked(kind));
        }
        ClaimOutcome::Unreadable(why) => {
            // It can never be claimed as it is: off the due index, for an operator.
            tracing::error!(why = %why, "unreadable due item taken off the due index");
            deps.store.quarantine_due(item, deps.clock.now()).await?;
            return Ok(Dispatched::Unreadable);
        }
    };
    // From here on every line about this item names its delivery (on the span).
    tracing::Span::current().record("delivery_id", claim.delivery_id.as_str());
    onegrant::failpoint::hit("after_claim");
    // The send must end inside the lease and the invocation, before the finalize's
    // margin: measured now, on the wall clock for the lease, so a process that stalled
    // after claiming gives the claim back instead of sending late.
    let lease_left = (claim.lease_until - deps.clock.now())
        .to_std()
        .unwrap_or_default()
        .saturating_sub(FINALIZE_MARGIN);
    let time_left = lease_left
        .min(budget.left().saturating_sub(FINALIZE_MARGIN))
        .min(deps.wechat.send_window());
    if time_left < deps.wechat.call_timeout() {
        drop(turn);
        // Tried again like a finalize: a release that never lands is swept as
        // `unknown`, a send that never happened.
        let finalized = retried(&budget, "release", || {
            deps.store
                .release(&claim, "no time left to send", deps.clock.now())
        })
        .await?;
        // No longer in flight: an event it held back may settle another send.
        settle_pending(deps, &claim).await;
        return Ok(Dispatched::Released(finalized));
    }
    let send_by = std::time::Instant::now() + time_left;
    let result = match message(deps, &claim) {
        Ok(message) => {
            deps.wechat
                .send_in_turn(&turn, &token, &message, send_by)
                .await
        }
        Err(invalid) => invalid,
    };
    drop(turn);
    let latency_ms = (deps.clock.now() - claim.due_at).num_milliseconds();
    onegrant::failpoint::hit("after_send");
    if let Some(delay) = onegrant::failpoint::delay_of("during_finalize") {
        // Die with the finalize transaction in flight: it may or may not land.
        tokio::select! {
            _ = deps.store.finalize(&claim, &result, deps.clock.now()) => {}
            () = tokio::time::sleep(delay) => {}
        }
        onegrant::failpoint::hit("during_finalize");
        return Ok(Dispatched::Lost);
    }
    // WeChat's answer is known now and must be recorded: a finalize that fails (the
    // table throttling past the write budget, a step after the settlement failing) is
    // tried again while the invocation has time, rather than leaving the answer for the
    // sweep to record as `unknown`. Each try is guarded, and one that finds its own
    // settlement landed finishes what follows it.
    let finalized = match retried(&budget, "finalize", || {
        deps.store.finalize(&claim, &result, deps.clock.now())
    })
    .await
    {
        Ok(finalized) => finalized,
        Err(e) => {
            // Out of time or tries: the answer is kept on the delivery (one
            // single-item write, tried a few times), so the sweep settles by it
            // rather than declare the send `unknown`.
            let room = budget.left().saturating_sub(Duration::from_millis(500));
            if tokio::time::timeout(room, Box::pin(keep_answer(deps, &claim, &result)))
                .await
                .is_err()
            {
                tracing::error!(delivery_id = %claim.delivery_id, "no time left to keep WeChat's answer");
            }
            return Err(e);
        }
    };
    let class = finalized.settlement.class;
    if finalized.superseded {
        tracing::warn!(delivery_id = %claim.delivery_id, "the sweep settled this send first");
    }
    // A sent event that came while this send was in flight, kept pending: it may be
    // this send's (now `unknown`), or another unknown send's it no longer blocks.
    settle_pending(deps, &claim).await;
    match class {
        OutcomeClass::Config => tracing::error!(
            openid = %openid_hash(claim.openid.as_str()),
            template = %claim.template_id,
            delivery_id = %claim.delivery_id,
            errcode = ?result.errcode(),
            "WeChat refused the template or content: fix the configuration"
        ),
        OutcomeClass::Sent
        | OutcomeClass::Retryable
        | OutcomeClass::Refused
        | OutcomeClass::User
        | OutcomeClass::Unknown => tracing::info!(
            openid = %openid_hash(claim.openid.as_str()),
            template = %claim.template_id,
            delivery_id = %claim.delivery_id,
            errcode = ?result.errcode(),
            outcome = class.as_str(),
            late = finalized.late,
            latency_ms,
            "delivery finalized"
        ),
    }
    // A reminder that used up the user's grants: the refill notice, once.
    let room = budget.left().saturating_sub(FINALIZE_MARGIN);
    // (Boxed: its ingest would grow every item's future past a test thread's stack.)
    let refill = Box::pin(crate::refill::after_send(deps, &claim, &finalized, room)).await;
    Ok(Dispatched::Done {
        finalized,
        latency_ms,
        refill,
    })
}

/// Keeps WeChat's definite answer on a delivery whose finalize did not land
/// ([`onegrant::store::Store::keep_answer`]), trying a few times; a failure is logged.
pub(crate) async fn keep_answer(deps: &Deps, claim: &Claim, result: &SendResult) {
    if onegrant::domain::settle::KeptAnswer::of(result).is_none() {
        // An uncertain answer: nothing to keep; the sweep records it `unknown`.
        return;
    }
    for attempt in 1..=KEEP_TRIES {
        match deps.store.keep_answer(claim, result).await {
            Ok(true) => {
                tracing::warn!(
                    delivery_id = %claim.delivery_id,
                    "the finalize did not land: WeChat's answer kept for the sweep"
                );
                return;
            }
            Ok(false) => {
                // No longer live: a sweep declared it `unknown` meanwhile. The answer
                // still wins, as a late answer (or the finalize landed after all, and
                // this finds its own settlement).
                match deps.store.finalize(claim, result, deps.clock.now()).await {
                    Ok(finalized) => tracing::warn!(
                        delivery_id = %claim.delivery_id,
                        late = finalized.late,
                        "WeChat's answer recorded after the sweep"
                    ),
                    Err(e) => tracing::error!(
                        error = %error_chain(&e),
                        delivery_id = %claim.delivery_id,
                        "WeChat's answer could not be recorded: the send stays unknown"
                    ),
                }
                return;
            }
            Err(e) if attempt < KEEP_TRIES => {
                tracing::warn!(error = %error_chain(&e), attempt, "keeping the answer failed; trying again");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            Err(e) => {
                tracing::error!(
                    error = %error_chain(&e),
                    delivery_id = %claim.delivery_id,
                    "WeChat's answer could not be kept: the sweep will record the send unknown"
                );
            }
        }
    }
}

/// How often a kept answer's write is tried.
pub(crate) const KEEP_TRIES: u32 = 3;

/// Runs `attempt` (a finalize or a release) until it succeeds, at most
/// `FINALIZE_TRIES` times and while the invocation has `FINALIZE_RETRY_ROOM` left.
pub(crate) async fn retried<F, Fut>(
    budget: &Budget,
    what: &'static str,
    mut attempt: F,
) -> Result<onegrant::store::dispatch::Finalized, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<onegrant::store::dispatch::Finalized, StoreError>>,
{
    // Each try ends in time to keep WeChat's answer should it fail (`KEEP_ROOM`): a
    // try cut short may have landed unseen, which the next try, or keeping the
    // answer, finds.
    let bounded = |attempt: Fut| async move {
        let room = budget
            .left()
            .saturating_sub(KEEP_ROOM)
            .max(Duration::from_secs(1));
        // Boxed: the finalize's future is large, and a debug build's test thread has
        // a 2 MB stack.
        tokio::time::timeout(room, Box::pin(attempt))
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    format!("{what}: out of time").into(),
                ))
            })
    };
    let mut outcome = bounded(attempt()).await;
    let mut tries = 1;
    while let Err(e) = &outcome {
        if tries >= FINALIZE_TRIES || budget.left() < FINALIZE_RETRY_ROOM {
            break;
        }
        tracing::warn!(error = %error_chain(e), tries, what, "failed; trying again");
        tokio::time::sleep(Duration::from_millis(200 * u64::from(tries))).await;
        tries += 1;
        outcome = bounded(attempt()).await;
    }
    outcome
}

/// The time a finalize's tries leave for keeping WeChat's answer on the delivery.
pub(crate) const KEEP_ROOM: Duration = Duration::from_secs(3);

/// With the message push configured: the sent events of the claim's template kept
/// pending while it was in flight, matched again now that it is not.
pub(crate) async fn settle_pending(deps: &Deps, claim: &Claim) {
    let config = &deps.config;
    if config.limits.push_events {
        deps.store
            .settle_pending_events(&claim.openid, &claim.template_id, deps.clock.now())
            .await;
    }
}

/// The message for a claim: a reminder's content rendered for the user, or a push's
/// data as ingested, fitted to the template's keyword rules.
pub(crate) fn message(deps: &Deps, claim: &Claim) -> Result<Message, SendResult> {
    let template = deps
        .config
        .templates
        .get(claim.template_id.as_str())
        .ok_or_else(|| SendResult::Invalid {
            reason: format!("template {} is not configured", claim.template_id),
        })?;
    let (values, page) = match &claim.source {
        ClaimSource::Plan { kind, plan } => {
            let schedule = plan.settings.schedule;
            let local = claim.due_at.with_timezone(&schedule.timezone().tz());
            let values = ContentValues {
                due_time: local.format("%H:%M").to_string(),
                due_date: local.format("%Y年%-m月%-d日").to_string(),
                count: plan.count_on(schedule.waking_day(claim.due_at)),
                goal: plan.settings.daily_goal,
            };
            (kind.render(&values), template.page.clone())
        }
        ClaimSource::Outbox(outbox) => (outbox.data.clone(), outbox.page.clone()),
    };
    let data = fit_all(template, &values).map_err(|e| SendResult::Invalid {
        reason: e.to_string(),
    })?;
    Ok(Message {
        touser: claim.openid.clone(),
        template_id: template.id.to_string(),
        page,
        data,
    })
}

/// Publishes the scheduled notification `item` the ordinary way: its push's due entry
/// to claim next, or how it ended without one.
async fn publish(
    deps: &Deps,
    item: &DueItem,
    published: &AtomicBool,
) -> Result<Result<DueItem, Dispatched>, StoreError> {
    let (pk, sk) = item.key();
    Ok(
        match deps
            .store
            .publish(pk, sk, item.due_at, deps.clock.now())
            .await?
        {
            Published::Done { push, expired } => {
                published.store(true, Ordering::Relaxed);
                match item.published_push() {
                    Some(next) if push => Ok(next),
                    _ if expired => Err(Dispatched::Unsent {
                        tally: Tally::Expired,
                        refill: Refill::Nothing,
                    }),
                    _ => Err(Dispatched::Published),
                }
            }
            Published::Gone => Err(Dispatched::Lost),
            Published::Unreadable(why) => {
                tracing::error!(why = %why, "unreadable scheduled notification taken off the due index");
                deps.store.quarantine_due(item, deps.clock.now()).await?;
                Err(Dispatched::Unreadable)
            }
        },
    )
}

/// The user's turn, a permit and the token, with the time to claim and send.
type Ready<'a> = (
    onegrant::wechat::Turn,
    tokio::sync::SemaphorePermit<'a>,
    String,
);

/// The user's turn, then a permit (tasks queued behind one user hold no permit), then
/// the token, each within the time left; else why not (nothing claimed or reserved:
/// the item stays due for the next tick).
async fn ready<'a>(
    deps: &Deps,
    openid: &OpenId,
    permits: &'a Semaphore,
    budget: &Budget,
) -> Result<Ready<'a>, Dispatched> {
    let turn_by = budget.left().saturating_sub(budget.after_turn);
    let Ok(turn) = tokio::time::timeout(turn_by, deps.wechat.turn(openid)).await else {
        return Err(Dispatched::Deferred);
    };
    let Ok(permit) = permits.acquire().await else {
        return Err(Dispatched::Deferred);
    };
    if budget.after_turn > budget.left() {
        return Err(Dispatched::Deferred);
    }
    let Ok(token) = deps.wechat.token().await else {
        return Err(Dispatched::NoToken);
    };
    if budget.after_claim > budget.left() {
        return Err(Dispatched::Deferred);
    }
    Ok((turn, permit, token))
}

/// [`ready`] without waiting: `None` unless all of it is to be had now.
fn ready_at_once<'a>(
    deps: &Deps,
    openid: &OpenId,
    permits: &'a Semaphore,
    budget: &Budget,
) -> Option<Ready<'a>> {
    if budget.after_turn > budget.left() || budget.after_claim > budget.left() {
        return None;
    }
    let turn = deps.wechat.turn(openid).now_or_never()?;
    let permit = permits.try_acquire().ok()?;
    let token = deps.wechat.token().now_or_never()?.ok()?;
    Some((turn, permit, token))
}
