//! The dispatcher: every minute, recover stale claims, then claim each due reminder or
//! notification push, send it at most once, and finalize it — on time to the second.
//!
//! One tick:
//! 1. **Sweep** the lease index: deliveries past their lease become `unknown`; plans a
//!    settled delivery left `sending` move on. Bounded; a bad item is skipped.
//! 2. **Query** every shard of the due index in parallel for items due before the next
//!    tick (now + lookahead).
//! 3. For each, **wait until it is due**, then wait for the user's **turn** (one send
//!    per openid at a time), a concurrency permit and an **access token** — only then
//!    **claim** it (one transaction writing the delivery `sending` with a lease that
//!    covers the send and the finalize), **send** it (outside any transaction) and
//!    **finalize** it by the outcome table. A delivery is therefore `sending` only while
//!    its POST can really be in flight, and no claim ever waits in a queue.
//! 4. Never start what the invocation's remaining time cannot finish: an item whose
//!    turn or token does not come in time stays on the due index for the next tick.
//!
//! Any number of dispatchers may run at once: a claim is a conditional transaction, so
//! exactly one wins each item and the others move on; a 43108 from another container's
//! send to the same user is retried within the send's window without spending an
//! attempt.

use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use futures::future::{BoxFuture, join_all};
use futures::stream::FuturesUnordered;
use onegrant::Deps;
use onegrant::domain::keywords::fit_all;
use onegrant::domain::outcome::{OutcomeClass, SendResult};
use onegrant::domain::reminder::ContentValues;
use onegrant::store::StoreError;
use onegrant::store::dispatch::{Claim, ClaimOutcome, ClaimSource, DueItem, Finalized, ShardSpan};
use onegrant::store::history::attributed;
use onegrant::telemetry::{error_chain, openid_hash};
use onegrant::wechat::Message;
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

/// Time kept back, beyond the send's window, for a finalize after the last send.
pub mod fanout;

const FINALIZE_MARGIN: Duration = Duration::from_secs(5);

/// How many times a finalize is tried, while the invocation has at least
/// `FINALIZE_RETRY_ROOM` left (a try's own write budget is 4 s).
const FINALIZE_TRIES: u32 = 3;
const FINALIZE_RETRY_ROOM: Duration = Duration::from_secs(5);

/// What one tick did. Also logged, and emitted as CloudWatch EMF metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub due: u32,
    pub claimed: u32,
    pub sent: u32,
    pub failed: u32,
    pub unknown: u32,
    /// Deliveries the sweep settled `unknown`.
    pub recovered: u32,
    /// Plans the sweep moved on after their delivery had settled without them.
    pub advanced: u32,
    /// Recorded WeChat events that no try applied, applied by the sweep.
    pub events_applied: u32,
    /// Lease-index entries the sweep quarantined (unreadable, or failed too often).
    pub quarantined: u32,
    /// Deliveries the sweep settled by WeChat's answer their finalize kept (or whose
    /// 43101 voiding it finished): the truth, not `unknown`.
    pub kept: u32,
    /// Sends a sweep had declared `unknown` that WeChat's late answer settled.
    pub late: u32,
    /// Claims given back unsent for want of time (grant restored, due again).
    pub released: u32,
    /// Finalizes that found the delivery already settled by a sweep and wrote nothing.
    pub superseded: u32,
    pub restored: u32,
    pub config_errors: u32,
    pub no_grant: u32,
    pub lost: u32,
    /// Left due for the next tick: no time left, or the user's turn came too late.
    pub deferred: u32,
    /// Left due for the next tick: no access token could be had.
    pub no_token: u32,
    /// Items that could not be read or written (logged, skipped).
    pub skipped: u32,
    /// Workers this tick invoked for its shards (0: it did them all itself).
    pub workers: u32,
    /// Shard groups whose worker could not be invoked, so this tick did them.
    pub inline: u32,
    /// Milliseconds from each due instant to its send's answer.
    #[serde(skip)]
    pub latencies_ms: Vec<i64>,
}

/// The time budget of one item: what must be left before each step.
impl Summary {
    /// Adds `other`'s counts to these (a tick doing a worker's shards itself).
    fn absorb(&mut self, other: Summary) {
        let Summary {
            due,
            claimed,
            sent,
            failed,
            unknown,
            recovered,
            advanced,
            events_applied,
            quarantined,
            kept,
            late,
            released,
            superseded,
            restored,
            config_errors,
            no_grant,
            lost,
            deferred,
            no_token,
            skipped,
            workers,
            inline,
            latencies_ms,
        } = other;
        self.due += due;
        self.claimed += claimed;
        self.sent += sent;
        self.failed += failed;
        self.unknown += unknown;
        self.recovered += recovered;
        self.advanced += advanced;
        self.events_applied += events_applied;
        self.kept += kept;
        self.quarantined += quarantined;
        self.late += late;
        self.released += released;
        self.superseded += superseded;
        self.restored += restored;
        self.config_errors += config_errors;
        self.no_grant += no_grant;
        self.lost += lost;
        self.deferred += deferred;
        self.no_token += no_token;
        self.skipped += skipped;
        self.workers += workers;
        self.inline += inline;
        self.latencies_ms.extend(latencies_ms);
    }
}

#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: Instant,
    /// From a claim: the send's window and the finalize.
    after_claim: Duration,
    /// From the turn: a token fetch, then as from a claim.
    after_turn: Duration,
}

impl Budget {
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// Runs one tick that must finish by `deadline`.
pub async fn tick(deps: &Deps, deadline: Instant) -> Result<Summary, StoreError> {
    let now = Utc::now();
    // Every partition that may hold items, old shard counts included.
    let shards = match deps.store.shard_span(now).await {
        Ok(shards) => shards,
        Err(e) => {
            tracing::error!(error = %error_chain(&e), "shard registry unreadable; this tick queries its own shards only");
            ShardSpan::only(deps.store.shards(), now)
        }
    };
    if let Some(configured) = deps.config.dispatch.workers_configured {
        tracing::error!(
            configured,
            workers = deps.config.dispatch.workers,
            "DISPATCH_WORKERS exceeds the dispatcher's reserved concurrency less 2 \
             (DispatcherConcurrency); fanning out to fewer workers"
        );
    }
    let summary = match &deps.invoker {
        Some(invoker) if deps.config.dispatch.workers > 1 => {
            fanout::fan_out(deps, invoker, &shards, deadline, now).await?
        }
        _ => {
            let all: Vec<u32> = (0..shards.span).collect();
            run_shards(deps, deadline, &all, now).await?
        }
    };
    if let Err(e) = deps.store.drain_shards(&shards, Utc::now()).await {
        tracing::error!(error = %error_chain(&e), "old shards not checked for empty");
    }
    report(&summary, true);
    Ok(summary)
}

/// A worker's tick: the shards `shards` only (the scheduled tick that invoked it
/// checks the registry and the drain).
pub async fn tick_shards(
    deps: &Deps,
    deadline: Instant,
    shards: &[u32],
) -> Result<Summary, StoreError> {
    let summary = run_shards(deps, deadline, shards, Utc::now()).await?;
    report(&summary, false);
    Ok(summary)
}

/// The sweep of `shards`' leases beside the dispatch of what is due on them.
async fn run_shards(
    deps: &Deps,
    deadline: Instant,
    shards: &[u32],
    now: chrono::DateTime<Utc>,
) -> Result<Summary, StoreError> {
    let config = &deps.config;
    // The sweep settles other dispatchers' leftovers; it runs beside this tick's sends
    // rather than before them, so it never delays a reminder that is due.
    let policy = config.dispatch.retry_policy();
    // Bounded by the invocation too: what it does not reach, the next tick does.
    let sweeping = tokio::time::timeout_at(
        deadline.checked_sub(FINALIZE_MARGIN).unwrap_or(deadline),
        attributed(
            "sweep",
            deps.store.sweep(
                &config.templates,
                &config.reminders,
                &policy,
                shards.iter().copied(),
                now,
            ),
        ),
    );
    let (swept, dispatched) = tokio::join!(sweeping, dispatch_due(deps, deadline, shards, now));
    let mut summary = dispatched?;
    match swept {
        Ok(swept) => {
            summary.recovered = swept.recovered;
            summary.advanced = swept.advanced;
            summary.events_applied = swept.events_applied;
            summary.kept = swept.kept;
            summary.quarantined = swept.quarantined;
            summary.skipped += swept.skipped;
        }
        Err(_) => {
            tracing::warn!("the sweep ran out of the invocation's time; the next tick goes on")
        }
    }
    Ok(summary)
}

/// One log line and the metrics of a tick (`scheduled`: the minute's own tick, not a
/// worker's share of it).
fn report(summary: &Summary, scheduled: bool) {
    tracing::info!(
        due = summary.due,
        claimed = summary.claimed,
        sent = summary.sent,
        failed = summary.failed,
        unknown = summary.unknown,
        recovered = summary.recovered,
        advanced = summary.advanced,
        late = summary.late,
        released = summary.released,
        superseded = summary.superseded,
        restored = summary.restored,
        deferred = summary.deferred,
        no_token = summary.no_token,
        skipped = summary.skipped,
        workers = summary.workers,
        "dispatcher tick"
    );
    emit_metrics(summary, scheduled);
}

/// Due-index entries one query reads from one shard.
const DUE_PAGE: usize = 50;

/// Everything due by the next tick: each item waited for, claimed, sent, finalized.
/// Every shard is worked on at once, page by page.
async fn dispatch_due(
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
struct Lane<'a> {
    deps: &'a Deps,
    horizon: chrono::DateTime<Utc>,
    claimer: &'a str,
    budget: Budget,
    permits: &'a Semaphore,
    summary: &'a Mutex<Summary>,
}

impl Lane<'_> {
    /// One shard of the due index, page by page, earliest first: the next page is
    /// read once fewer than a page of this shard's items are in flight and while the
    /// invocation still has time to send one, so memory and reads stay bounded by
    /// what the tick can do, whatever the backlog.
    async fn run(self, shard: u32) {
        let mut running = FuturesUnordered::new();
        let mut from = None;
        let mut more = true;
        loop {
            while more && running.len() < DUE_PAGE && self.budget.after_turn < self.budget.left() {
                // The sends in flight are driven while the page is read: a slow or
                // throttled due-index query never holds up their finalizes (nor past
                // their leases, where a sweep would record a truthful answer unknown).
                let fetch = self
                    .deps
                    .store
                    .due_page(self.horizon, shard, from.take(), DUE_PAGE);
                tokio::pin!(fetch);
                let fetched = loop {
                    tokio::select! {
                        page = &mut fetch => break page,
                        Some(()) = running.next(), if !running.is_empty() => {}
                    }
                };
                let page = match fetched {
                    Ok(page) => page,
                    Err(e) => {
                        // One shard that cannot be read does not stop the others.
                        // Not read again this tick: its cursor is spent, and starting over
                        // would hand out items already in flight a second time.
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

    async fn one(self, item: DueItem) {
        // Every line about this item carries its user's hash, once, on the span.
        // At ERROR level: enabled whenever anything is logged, so warnings and errors
        // keep these fields whatever the level.
        let span = tracing::error_span!(
            "item",
            openid = %item.openid().map(|o| openid_hash(o.as_str())).unwrap_or_default(),
            delivery_id = tracing::field::Empty
        );
        let outcome = tracing::Instrument::instrument(
            attributed(
                "dispatcher",
                dispatch_one(self.deps, &item, self.claimer, self.budget, self.permits),
            ),
            span,
        )
        .await;
        let mut s = self.summary.lock().await;
        match outcome {
            Ok(Dispatched::Deferred) => s.deferred += 1,
            Ok(Dispatched::NoToken) => s.no_token += 1,
            Ok(Dispatched::Lost) => s.lost += 1,
            Ok(Dispatched::NoGrant) => s.no_grant += 1,
            Ok(Dispatched::Unreadable) => s.skipped += 1,
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
            }) => {
                s.claimed += 1;
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

enum Dispatched {
    Done {
        finalized: Finalized,
        latency_ms: i64,
    },
    Released(Finalized),
    Unreadable,
    Lost,
    NoGrant,
    Deferred,
    NoToken,
}

async fn dispatch_one(
    deps: &Deps,
    item: &DueItem,
    claimer: &str,
    budget: Budget,
    permits: &Semaphore,
) -> Result<Dispatched, StoreError> {
    let config = &deps.config;
    let Some(openid) = item.openid() else {
        tracing::error!("due item outside any user partition taken off the due index");
        deps.store.quarantine_due(item, Utc::now()).await?;
        return Ok(Dispatched::Unreadable);
    };
    let wait = (item.due_at - Utc::now()).to_std().unwrap_or_default();
    if wait + budget.after_turn > budget.left() {
        return Ok(Dispatched::Deferred);
    }
    tokio::time::sleep(wait).await;
    // The user's turn, then a permit: tasks queued behind one user hold no permit.
    let turn_by = budget.left().saturating_sub(budget.after_turn);
    let Ok(turn) = tokio::time::timeout(turn_by, deps.wechat.turn(&openid)).await else {
        return Ok(Dispatched::Deferred);
    };
    let Ok(_permit) = permits.acquire().await else {
        return Ok(Dispatched::Deferred);
    };
    if budget.after_turn > budget.left() {
        return Ok(Dispatched::Deferred);
    }
    let token = match deps.wechat.token().await {
        Ok(token) => token,
        // Nothing claimed, nothing reserved: the item stays due for the next tick.
        Err(_) => return Ok(Dispatched::NoToken),
    };
    if budget.after_claim > budget.left() {
        return Ok(Dispatched::Deferred);
    }
    // The lease covers the send's window and the finalize, and never less than the
    // configured lease.
    let lease = config.dispatch.lease.max(budget.after_claim);
    let claim = match deps
        .store
        .claim(item, &config.reminders, claimer, lease, Utc::now())
        .await?
    {
        ClaimOutcome::Claimed(claim) => claim,
        ClaimOutcome::Lost => return Ok(Dispatched::Lost),
        ClaimOutcome::NoGrant => return Ok(Dispatched::NoGrant),
        ClaimOutcome::Unreadable(why) => {
            // It can never be claimed as it is: off the due index, for an operator.
            tracing::error!(why = %why, "unreadable due item taken off the due index");
            deps.store.quarantine_due(item, Utc::now()).await?;
            return Ok(Dispatched::Unreadable);
        }
    };
    // From here on every line about this item names its delivery (on the span).
    tracing::Span::current().record("delivery_id", claim.delivery_id.as_str());
    onegrant::failpoint::hit("after_claim");
    // The send must end inside the lease and the invocation, before the finalize's
    // margin: measured now, on the wall clock for the lease, so a process that stalled
    // after claiming gives the claim back instead of sending late.
    let lease_left = (claim.lease_until - Utc::now())
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
                .release(&claim, "no time left to send", Utc::now())
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
    let latency_ms = (Utc::now() - claim.due_at).num_milliseconds();
    onegrant::failpoint::hit("after_send");
    let policy = config.dispatch.retry_policy();
    if let Some(delay) = onegrant::failpoint::delay_of("during_finalize") {
        // Die with the finalize transaction in flight: it may or may not land.
        tokio::select! {
            _ = deps.store.finalize(&claim, &result, &policy, Utc::now()) => {}
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
        deps.store.finalize(&claim, &result, &policy, Utc::now())
    })
    .await
    {
        Ok(finalized) => finalized,
        Err(e) => {
            // Out of time or tries: the answer is kept on the delivery (one
            // single-item write, tried a few times), so the sweep settles by it
            // rather than declare the send `unknown`.
            let room = budget.left().saturating_sub(Duration::from_millis(500));
            if tokio::time::timeout(room, Box::pin(keep_answer(deps, &claim, &result, &policy)))
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
    Ok(Dispatched::Done {
        finalized,
        latency_ms,
    })
}

/// Keeps WeChat's definite answer on a delivery whose finalize did not land
/// ([`onegrant::store::Store::keep_answer`]), trying a few times; a failure is logged.
async fn keep_answer(
    deps: &Deps,
    claim: &Claim,
    result: &SendResult,
    policy: &onegrant::domain::outcome::RetryPolicy,
) {
    if onegrant::domain::outcome::KeptAnswer::of(result).is_none() {
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
                match deps.store.finalize(claim, result, policy, Utc::now()).await {
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
const KEEP_TRIES: u32 = 3;

/// Runs `attempt` (a finalize or a release) until it succeeds, at most
/// `FINALIZE_TRIES` times and while the invocation has `FINALIZE_RETRY_ROOM` left.
async fn retried<F, Fut>(
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
const KEEP_ROOM: Duration = Duration::from_secs(3);

/// With the message push configured: the sent events of the claim's template kept
/// pending while it was in flight, matched again now that it is not.
async fn settle_pending(deps: &Deps, claim: &Claim) {
    let config = &deps.config;
    if config.limits.push_events {
        deps.store
            .settle_pending_events(
                &claim.openid,
                &claim.template_id,
                &config.reminders,
                &config.dispatch.retry_policy(),
                Utc::now(),
            )
            .await;
    }
}

/// The message for a claim: a reminder's content rendered for the user, or a push's
/// data as ingested, fitted to the template's keyword rules.
fn message(deps: &Deps, claim: &Claim) -> Result<Message, SendResult> {
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

/// A tick's metrics (written as EMF lines when the invocation ends).
fn emit_metrics(summary: &Summary, scheduled: bool) {
    use onegrant::metrics::{count, distribution, name};
    // One per scheduled minute: workers are not ticks (they would hide missed ones).
    count(name::TICKS, u32::from(scheduled));
    // The sweep's recoveries are uncertain sends too (I4): counted with them.
    count(name::UNKNOWN, summary.recovered);
    count(name::DUE, summary.due);
    count(name::CLAIMED, summary.claimed);
    count(name::SENT, summary.sent);
    count(name::FAILED, summary.failed);
    count(name::UNKNOWN, summary.unknown);
    count(name::NO_GRANT, summary.no_grant);
    count(name::RESTORED, summary.restored);
    count(name::RECOVERED, summary.recovered);
    count(name::QUARANTINED, summary.quarantined);
    count(name::KEPT, summary.kept);
    count(name::EVENTS_APPLIED_LATE, summary.events_applied);
    count(name::CONFIG_ERRORS, summary.config_errors);
    count(name::DEFERRED, summary.deferred + summary.no_token);
    count(name::LOST, summary.lost);
    count(name::SKIPPED, summary.skipped);
    distribution(name::SEND_LAG, &summary.latencies_ms);
}

/// The dispatcher as its Lambda `main` and the local Invoke API call it: one tick with
/// `budget` of time (the invocation's), answering the summary.
pub fn invoke(
    deps: &Deps,
    event: serde_json::Value,
    budget: Duration,
) -> BoxFuture<'_, Result<serde_json::Value, String>> {
    Box::pin(async move {
        let deadline = Instant::now() + budget;
        // A worker's event never runs a whole tick, so a worker never fans out again.
        let summary = match fanout::Work::of(&event) {
            Ok(Some(work)) => tick_shards(deps, deadline, &work.shards()).await,
            Ok(None) => tick(deps, deadline).await,
            Err(e) => return Err(e.to_string()),
        }
        .map_err(|e| e.to_string())?;
        serde_json::to_value(summary).map_err(|e| e.to_string())
    })
}
