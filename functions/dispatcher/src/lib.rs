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

use futures::future::BoxFuture;
use onegrant::Deps;
use onegrant::events::EventError;
use onegrant::store::StoreError;
use onegrant::store::dispatch::ShardSpan;
use onegrant::telemetry::error_chain;
use tokio::time::Instant;

use crate::run::run_shards;
use crate::summary::report;

mod budget;
pub mod fanout;
mod lane;
mod refill;
mod run;
mod send;
mod summary;

pub use summary::Summary;

/// Runs one tick that must finish by `deadline`.
pub async fn tick(deps: &Deps, deadline: Instant) -> Result<Summary, StoreError> {
    let now = deps.clock.now();
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
    if let Err(e) = deps.store.drain_shards(&shards, deps.clock.now()).await {
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
    let summary = run_shards(deps, deadline, shards, deps.clock.now()).await?;
    report(&summary, false);
    Ok(summary)
}

/// The dispatcher as its Lambda `main` and the local Invoke API call it: one tick with
/// `budget` of time (the invocation's), answering the summary.
pub fn invoke(
    deps: &Deps,
    event: serde_json::Value,
    budget: Duration,
) -> BoxFuture<'_, Result<serde_json::Value, EventError>> {
    Box::pin(async move {
        let deadline = Instant::now() + budget;
        // A worker's event never runs a whole tick, so a worker never fans out again.
        let summary = match fanout::Work::of(&event) {
            Ok(Some(work)) => tick_shards(deps, deadline, &work.shards()).await,
            Ok(None) => tick(deps, deadline).await,
            Err(e) => return Err(EventError::Event(Box::new(e))),
        }
        .map_err(EventError::Store)?;
        serde_json::to_value(summary).map_err(EventError::Answer)
    })
}
