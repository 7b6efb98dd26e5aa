//! One shard's lane: pages of due items read while the sends already in flight are
//! driven, each item started when it is due.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

use chrono::Utc;
use futures::StreamExt;
use futures::future::{BoxFuture, join_all};
use futures::stream::FuturesUnordered;
use onegrant::Deps;
use onegrant::domain::settle::OutcomeClass;
use onegrant::store::StoreError;
use onegrant::store::audit::attributed;
use onegrant::store::dispatch::DueItem;
use onegrant::telemetry::{error_chain, openid_hash};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::budget::{Budget, FINALIZE_MARGIN};
use crate::refill::Refill;
use crate::send::{Dispatched, dispatch_one};
use crate::summary::Summary;

/// Due-index entries one query reads from one shard, and the most of a shard's items
/// in flight at once.
pub(crate) const DUE_PAGE: usize = 50;

/// Most of one shard's items queued behind another item of the same user (keys only,
/// ~200 bytes each). They are not in flight and hold none of the lane's slots, so a
/// lane reads on past one user's burst: a thousand of one user's pushes due at once
/// never delay another user's. Past this many the lane reads no further until some
/// have had their turn. A user's open pushes are capped at ingest
/// (`PUSHES_PENDING_MAX`, 1,000 by default), so with the default 16 shards one user
/// alone fills about a sixteenth of it.
pub(crate) const TURN_QUEUE: usize = 1000;

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
    /// read once fewer than a page of this shard's items are in flight (one per user,
    /// the rest queued behind it, see [`Flight`]) and while the invocation still has
    /// time to send one, so memory and reads stay bounded by what the tick can do,
    /// whatever the backlog.
    pub(crate) async fn run(self, shard: u32) {
        let mut running = Flight::new(self);
        let mut from = None;
        let mut more = true;
        let mut failed = 0;
        loop {
            while more && running.has_room() && self.budget.after_turn < self.budget.left() {
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
                        Some(()) = running.next(), if running.any() => {}
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
                                Some(()) = running.next(), if running.any() => {}
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
                for item in items {
                    running.start(item);
                }
                if !more {
                    break;
                }
            }
            if running.next().await.is_none() {
                return;
            }
        }
    }

    /// Dispatches `item`; then hands back `user` (the user it was started for).
    async fn one(self, item: DueItem, user: Option<String>) -> Option<String> {
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
        tally(&mut s, outcome, &item);
        user
    }
}

/// Counts how one item ended.
fn tally(s: &mut Summary, outcome: Result<Dispatched, StoreError>, item: &DueItem) {
    match outcome {
        Ok(Dispatched::Deferred) => s.deferred += 1,
        Ok(Dispatched::NoToken) => s.no_token += 1,
        Ok(Dispatched::Lost) => s.lost += 1,
        Ok(Dispatched::Unsent { tally, refill }) => {
            s.count_unsent(tally);
            count_refill(s, refill);
        }
        Ok(Dispatched::Woken(n)) => s.woken += n,
        Ok(Dispatched::Erasure { done, stalled }) => {
            s.erasure_steps += 1;
            s.erasures_done += u32::from(done);
            s.erasures_stalled += u32::from(stalled);
        }
        // (Counted with every publication, below.)
        Ok(Dispatched::Published) => {}
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
            count_refill(s, refill);
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

/// One lane's items in flight — at most one per user, that user's later items queued
/// behind it (started as it ends, in due order) — so an item waiting for its user's
/// turn never holds one of the lane's [`DUE_PAGE`] slots. Scheduled notifications
/// (published at their instant, whatever their push waits for) and wake entries (no
/// send) start at once.
struct Flight<'a> {
    lane: Lane<'a>,
    running: FuturesUnordered<BoxFuture<'a, Option<String>>>,
    /// Per user with an item in flight: their items queued behind it.
    behind: HashMap<String, VecDeque<DueItem>>,
    queued: usize,
}

impl<'a> Flight<'a> {
    fn new(lane: Lane<'a>) -> Self {
        Self {
            lane,
            running: FuturesUnordered::new(),
            behind: HashMap::new(),
            queued: 0,
        }
    }

    /// Whether the lane may read another page.
    fn has_room(&self) -> bool {
        self.running.len() < DUE_PAGE && self.queued < TURN_QUEUE
    }

    /// Whether any item is in flight.
    fn any(&self) -> bool {
        !self.running.is_empty()
    }

    /// Starts `item`, or queues it behind its user's item in flight.
    fn start(&mut self, item: DueItem) {
        let user = item
            .openid()
            .filter(|_| !item.is_scheduled_note() && !item.is_wake());
        let Some(user) = user else {
            return self.run(item, None);
        };
        match self.behind.entry(user.to_string()) {
            Entry::Occupied(mut queue) => {
                queue.get_mut().push_back(item);
                self.queued += 1;
            }
            Entry::Vacant(queue) => {
                let user = queue.key().clone();
                queue.insert(VecDeque::new());
                self.run(item, Some(user));
            }
        }
    }

    fn run(&mut self, item: DueItem, user: Option<String>) {
        self.running.push(Box::pin(self.lane.one(item, user)));
    }

    /// Drives the items in flight until one ends (its user's next item then started);
    /// `None` once none is in flight. Cancel-safe: nothing is lost if dropped.
    async fn next(&mut self) -> Option<()> {
        let ended = self.running.next().await?;
        if let Some(user) = ended {
            match self.behind.get_mut(&user).and_then(VecDeque::pop_front) {
                Some(item) => {
                    self.queued -= 1;
                    self.run(item, Some(user));
                }
                None => {
                    self.behind.remove(&user);
                }
            }
        }
        Some(())
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
