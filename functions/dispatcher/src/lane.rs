//! One shard's lane: pages of due items read while the sends already in flight are
//! driven, each item started when it is due.

use chrono::Utc;
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use onegrant::Deps;
use onegrant::domain::dispatch::OutcomeClass;
use onegrant::store::StoreError;
use onegrant::store::audit::attributed;
use onegrant::store::dispatch::DueItem;
use onegrant::telemetry::{error_chain, openid_hash};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::refill::Refill;
use crate::send::{Dispatched, dispatch_one};
use crate::summary::Summary;
use crate::{Budget, FINALIZE_MARGIN};

/// Due-index entries one query reads from one shard.
pub(crate) const DUE_PAGE: usize = 50;

/// How many times one page of a shard is read before the shard is left for the next
/// tick (each read is the SDK's own attempts), and the pause before the next read
/// (doubling).
const PAGE_READS: u32 = 3;
const PAGE_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// Everything due by the next tick: each item waited for, claimed, sent, finalized.
/// Every shard is worked on at once, page by page.
pub(crate) async fn dispatch_due(
    deps: &Deps,
    deadline: Instant,
    shards: &[u32],
    now: chrono::DateTime<Utc>,
) -> Result<Summary, StoreError> {
    let config = &deps.config;
    let claimer = uuid::Uuid::new_v4().simple().to_string();
    let horizon = now + chrono::Duration::from_std(config.dispatch.lookahead).unwrap_or_default();
    let after_claim = deps.wechat.send_window() + FINALIZE_MARGIN;
    let budget = Budget {
        deadline,
        after_claim,
        after_turn: deps.wechat.call_timeout() + after_claim,
    };
    // Too little time to send even one: no page is read this tick (said, not silent).
    if !shards.is_empty() && budget.after_turn >= budget.left() {
        tracing::warn!(
            left_ms = u64::try_from(budget.left().as_millis()).unwrap_or(u64::MAX),
            needs_ms = u64::try_from(budget.after_turn.as_millis()).unwrap_or(u64::MAX),
            "no time to send one message: the due index is not read this tick"
        );
    }
    let permits = Semaphore::new(config.dispatch.concurrency);
    let summary = Mutex::new(Summary::default());
    let lane = Lane {
        deps,
        horizon,
        claimer: &claimer,
        budget,
        permits: &permits,
        summary: &summary,
    };
    join_all(shards.iter().map(|shard| lane.run(*shard))).await;
    Ok(summary.into_inner())
}

/// What every shard's lane of one tick shares.
#[derive(Clone, Copy)]
pub(crate) struct Lane<'a> {
    pub(crate) deps: &'a Deps,
    pub(crate) horizon: chrono::DateTime<Utc>,
    pub(crate) claimer: &'a str,
    pub(crate) budget: Budget,
    pub(crate) permits: &'a Semaphore,
    pub(crate) summary: &'a Mutex<Summary>,
}

impl Lane<'_> {
    /// One shard of the due index, page by page, earliest first: the next page is
    /// read once fewer than a page of this shard's items are in flight and while the
    /// invocation still has time to send one, so memory and reads stay bounded by
    /// what the tick can do, whatever the backlog.
    pub(crate) async fn run(self, shard: u32) {
        let mut running = FuturesUnordered::new();
        let mut from = None;
        let mut more = true;
        let mut failed = 0;
        loop {
            while more && running.len() < DUE_PAGE && self.budget.after_turn < self.budget.left() {
                // The sends in flight are driven while the page is read: a slow or
                // throttled due-index query never holds up their finalizes (nor past
                // their leases, where a sweep would record a truthful answer unknown).
                let cursor = from.take();
                let fetch = self
                    .deps
                    .store
                    .due_page(self.horizon, shard, cursor.clone(), DUE_PAGE);
                tokio::pin!(fetch);
                let fetched = loop {
                    tokio::select! {
                        page = &mut fetch => break page,
                        Some(()) = running.next(), if !running.is_empty() => {}
                    }
                };
                let page = match fetched {
                    Ok(page) => {
                        failed = 0;
                        page
                    }
                    Err(e) if failed + 1 < PAGE_READS => {
                        // Read again from the same cursor: nothing of this page was
                        // handed out, and a slow or throttled index usually answers the
                        // next read. The sends in flight are driven meanwhile.
                        failed += 1;
                        tracing::warn!(shard, error = %error_chain(&e), "due-index page unreadable; reading it again");
                        from = cursor;
                        let pause = tokio::time::sleep(PAGE_PAUSE * 2u32.pow(failed - 1));
                        tokio::pin!(pause);
                        loop {
                            tokio::select! {
                                () = &mut pause => break,
                                Some(()) = running.next(), if !running.is_empty() => {}
                            }
                        }
                        continue;
                    }
                    Err(e) => {
                        // One shard that cannot be read does not stop the others; it
                        // waits for the next tick.
                        tracing::error!(shard, error = %error_chain(&e), "due-index shard unreadable; skipped this tick");
                        self.summary.lock().await.skipped += 1;
                        more = false;
                        break;
                    }
                };
                more = page.next.is_some();
                from = page.next;
                {
                    let mut s = self.summary.lock().await;
                    s.due += u32::try_from(page.items.len()).unwrap_or(u32::MAX);
                    s.skipped += page.unreadable;
                }
                let mut items = page.items;
                // Among items due at the same instant, a random order, so that
                // dispatchers running at once mostly start on different items
                // instead of all racing for the same one.
                items.sort_by_cached_key(|item| (item.due_at, uuid::Uuid::new_v4()));
                running.extend(items.into_iter().map(|item| self.one(item)));
                if !more {
                    break;
                }
            }
            if running.next().await.is_none() {
                return;
            }
        }
    }

    pub(crate) async fn one(self, item: DueItem) {
        // Every line about this item carries its user's hash, once, on the span.
        // At ERROR level: enabled whenever anything is logged, so warnings and errors
        // keep these fields whatever the level.
        let span = tracing::error_span!(
            "item",
            openid = %item.openid().map(|o| openid_hash(o.as_str())).unwrap_or_default(),
            delivery_id = tracing::field::Empty
        );
        let published = std::sync::atomic::AtomicBool::new(false);
        let outcome = tracing::Instrument::instrument(
            attributed(
                "dispatcher",
                dispatch_one(
                    self.deps,
                    &item,
                    self.claimer,
                    self.budget,
                    self.permits,
                    &published,
                ),
            ),
            span,
        )
        .await;
        let mut s = self.summary.lock().await;
        s.published += u32::from(published.load(std::sync::atomic::Ordering::Relaxed));
        match outcome {
            Ok(Dispatched::Deferred) => s.deferred += 1,
            Ok(Dispatched::NoToken) => s.no_token += 1,
            Ok(Dispatched::Lost) => s.lost += 1,
            Ok(Dispatched::NoGrant) => s.no_grant += 1,
            Ok(Dispatched::WaitGrant { refill }) => {
                s.grant_waits += 1;
                count_refill(&mut s, refill);
            }
            Ok(Dispatched::Woken(n)) => s.woken += n,
            // (Counted with every publication, below.)
            Ok(Dispatched::Published) => {}
            Ok(Dispatched::Expired) => s.expired += 1,
            Ok(Dispatched::Muted) => s.muted += 1,
            Ok(Dispatched::TurnedOff) => s.turned_off += 1,
            Ok(Dispatched::Held) => s.held += 1,
            Ok(Dispatched::Capped { waits: true }) => s.cap_waits += 1,
            Ok(Dispatched::Capped { waits: false }) => s.capped += 1,
            Ok(Dispatched::Cancelled) => s.cancelled += 1,
            Ok(Dispatched::Replaced) => s.replaced += 1,
            Ok(Dispatched::Unreadable) => s.skipped += 1,
            Ok(Dispatched::Parked(kind)) => {
                s.parked += 1;
                *s.parked_kinds.entry(kind).or_default() += 1;
            }
            Ok(Dispatched::Released(finalized)) => {
                s.claimed += 1;
                if finalized.superseded {
                    s.superseded += 1;
                } else {
                    s.released += 1;
                    s.restored += u32::from(finalized.restored);
                }
            }
            Ok(Dispatched::Done {
                finalized,
                latency_ms,
                refill,
            }) => {
                s.claimed += 1;
                count_refill(&mut s, refill);
                s.latencies_ms.push(latency_ms);
                if finalized.superseded {
                    // The sweep had settled it; its outcome is counted there.
                    s.superseded += 1;
                    return;
                }
                s.restored += u32::from(finalized.restored);
                s.late += u32::from(finalized.late);
                match finalized.settlement.class {
                    OutcomeClass::Sent => s.sent += 1,
                    OutcomeClass::Unknown => s.unknown += 1,
                    OutcomeClass::Config => {
                        s.config_errors += 1;
                        s.failed += 1;
                    }
                    OutcomeClass::Retryable | OutcomeClass::Refused | OutcomeClass::User => {
                        s.failed += 1
                    }
                }
                if !matches!(
                    finalized.settlement.class,
                    OutcomeClass::Sent | OutcomeClass::Unknown
                ) {
                    onegrant::metrics::count_by(
                        onegrant::metrics::name::FAILED_BY_CLASS,
                        "Class",
                        finalized.settlement.class.as_str().to_string(),
                        1,
                    );
                }
            }
            Err(e) => {
                // Left for the sweep (claimed) or the next tick (not claimed).
                tracing::error!(
                    error = %error_chain(&e),
                    openid = %item.openid().map(|o| openid_hash(o.as_str())).unwrap_or_default(),
                    "dispatch failed; item skipped"
                );
                s.skipped += 1;
            }
        }
    }
}

/// Counts what a send or a wait left for a refill notice.
fn count_refill(s: &mut Summary, refill: Refill) {
    match refill {
        Refill::Published => s.refills += 1,
        Refill::NoRefillGrant => s.refills_without_grant += 1,
        Refill::Nothing => {}
    }
}
