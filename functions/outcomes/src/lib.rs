//! `outcomes`: tells each publisher what became of its pushes. Every end of a push is
//! an outcome item written in the same transaction as the status change
//! (`store::items::outcome`); this function, on its own schedule, puts the due ones on
//! the stack's bus (`detail-type: onegrant.push.outcome`, source `onegrant`, when
//! `OUTCOME_BUS` is set) and posts them to their publisher's webhook, signed in the
//! publisher API's scheme (publisher `onegrant`, the publisher's current key), and
//! deletes each once both took it (a leg taken is kept, not repeated). A failed leg is
//! tried again with doubling waits (`domain::outcome::retry_at`) for a day, then given
//! up: kept off the index with `dead_at`, counted and alarmed.
//!
//! Apart from the dispatcher, so that a slow or dead webhook never delays a send: each
//! post waits at most [`POST_TIMEOUT`], the publishers are served side by side, and a
//! publisher whose webhook failed is not tried again in the same tick.
//!
//! At least once: a process that dies between a post and the delete posts the outcome
//! again, with the same `outcome_id`.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use onegrant::Deps;
use onegrant::domain::outcome::{self, SHARDS};
use onegrant::domain::publisher::Publisher;
use onegrant::domain::publisher::signature::{
    self, ONEGRANT, PUBLISHER_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use onegrant::events::EventError;
use onegrant::store::StoreError;
use onegrant::store::outcomes::{Legs, Move, OutcomeItem};
use onegrant::telemetry::error_chain;
use serde::Serialize;
use tokio::time::Instant;

/// How long one post may take (connect and answer).
pub const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// The most outcomes read from each shard of each publisher's queue in one tick.
pub const PER_SHARD: usize = 50;

/// The `detail-type` of an outcome on the bus (source `onegrant`).
pub const OUTCOME_DETAIL_TYPE: &str = "onegrant.push.outcome";

/// What a tick did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Posted and answered 2xx, and on the bus (deleted).
    pub delivered: u32,
    /// Of a publisher with no webhook: on the bus only (deleted).
    pub unaddressed: u32,
    /// Posted and refused or unanswered: due again later.
    pub retried: u32,
    /// Given up after a day of tries.
    pub dead: u32,
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        onegrant::aws::http_client_builder()
            .timeout(POST_TIMEOUT)
            .connect_timeout(POST_TIMEOUT)
            .build()
            .unwrap_or_default()
    })
}

/// How one outcome's webhook leg went this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    /// Taken (2xx), or taken by an earlier tick.
    Done,
    /// Its publisher has no webhook: nobody to post to.
    None,
    /// Posted and refused or unanswered.
    Failed,
    /// Not posted this tick (its publisher's webhook failed first, or time ran out).
    Waiting,
}

/// One tick: the due outcomes of every shard, put on the bus (in batches) beside each
/// publisher's webhook posts (side by side), then each moved as its two legs went.
pub async fn tick(deps: &Deps, deadline: Instant) -> Result<Summary, StoreError> {
    let now = deps.clock.now();
    // The queue every outcome is written to, and the own queue of each publisher whose
    // webhook failed (or ran out of time), where its outcomes move: out of the way of
    // the other publishers'. Read with time left for the posts and the moves.
    let registered = deps.store.outcome_queues().await?;
    let mut due: Vec<OutcomeItem> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut empty: Vec<&str> = Vec::new();
    for queue in std::iter::once(None).chain(registered.iter().map(|s| Some(s.as_str()))) {
        if Instant::now() + 2 * POST_TIMEOUT > deadline {
            break;
        }
        let mut found = 0;
        for shard in 0..SHARDS {
            for item in deps
                .store
                .due_outcomes(queue, shard, now, PER_SHARD)
                .await?
            {
                found += 1;
                // (Read twice when it moved between queues as they were read.)
                if seen.insert(item.outcome_id.clone()) {
                    due.push(item);
                }
            }
        }
        if let Some(source) = queue
            && found == 0
        {
            empty.push(source);
        }
    }
    // An own queue with nothing due whose publisher can no longer fail (no webhook
    // now): forgotten if it holds nothing at all, since no outcome can move there again.
    for source in empty {
        let hooked = deps
            .config
            .publishers
            .get(source)
            .is_some_and(|p| p.webhook.is_some());
        if !hooked && let Err(e) = deps.store.unregister_outcome_queue(source).await {
            tracing::warn!(error = %error_chain(&e), "an empty outcome queue could not be forgotten");
        }
    }
    due.sort_by_key(|i| i.first_at);
    let mut by_publisher: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, item) in due.iter().enumerate() {
        by_publisher
            .entry(item.publisher.as_str())
            .or_default()
            .push(i);
    }
    let due = &due;
    let hooks = futures::future::join_all(
        by_publisher
            .into_iter()
            .map(|(source, items)| hooks(deps, source, items, due, now, deadline)),
    );
    let (hooks, on_bus) = futures::join!(hooks, bus(deps, due));
    let mut hook = vec![Hook::Waiting; due.len()];
    for (i, went) in hooks.into_iter().flatten() {
        hook[i] = went;
    }
    // A publisher whose webhook failed this tick: when its failed outcome is tried
    // again, its others (not tried) wait until then too, off the head of the index.
    let mut retry_of: BTreeMap<&str, DateTime<Utc>> = BTreeMap::new();
    let mut moves = Vec::with_capacity(due.len());
    for (i, item) in due.iter().enumerate() {
        let legs = Legs {
            bus: on_bus[i],
            hook: matches!(hook[i], Hook::Done | Hook::None),
        };
        let to = if legs.bus && legs.hook {
            None
        } else if !legs.bus || hook[i] == Hook::Failed {
            let first = DateTime::from_timestamp_millis(item.first_at).unwrap_or(now);
            let retry = outcome::retry_at(item.attempts + 1, first, now);
            if hook[i] == Hook::Failed {
                retry_of.insert(item.publisher.as_str(), retry.unwrap_or(now));
            }
            Some(Move::Retry(retry))
        } else {
            Some(Move::Keep)
        };
        moves.push((legs, to));
    }
    // Its webhook failed, or time ran out before its post: into its publisher's own
    // queue (registered first, so nothing moves where no tick reads), behind nobody
    // else's outcomes.
    let own_queue: Vec<bool> = due
        .iter()
        .enumerate()
        .map(|(i, item)| matches!(hook[i], Hook::Failed | Hook::Waiting) && !item.in_own_queue())
        .collect();
    let mut queued: BTreeMap<&str, bool> = BTreeMap::new();
    for (i, item) in due.iter().enumerate() {
        let source = item.publisher.as_str();
        if own_queue[i] && !queued.contains_key(source) {
            let known = registered.iter().any(|r| r == source)
                || match deps.store.register_outcome_queue(source).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), "an outcome queue could not be registered");
                        false
                    }
                };
            queued.insert(source, known);
        }
    }
    let mut summary = Summary::default();
    for (i, item) in due.iter().enumerate() {
        if Instant::now() > deadline {
            // Left as they are: read again next tick (a post taken is posted again,
            // with its outcome_id).
            break;
        }
        let own_queue = own_queue[i] && queued.get(item.publisher.as_str()) == Some(&true);
        let (legs, to) = moves[i];
        let to = match (to, retry_of.get(item.publisher.as_str())) {
            (Some(Move::Keep), Some(&at)) if hook[i] == Hook::Waiting => {
                let first = DateTime::from_timestamp_millis(item.first_at).unwrap_or(now);
                Some(if outcome::given_up(first, now) {
                    Move::Retry(None)
                } else {
                    Move::Defer(at)
                })
            }
            _ => to,
        };
        let moved = match to {
            None => {
                summary.delivered += u32::from(hook[i] == Hook::Done);
                summary.unaddressed += u32::from(hook[i] == Hook::None);
                deps.store.outcome_delivered(item).await
            }
            Some(Move::Keep)
                if !own_queue
                    && legs
                        == (Legs {
                            bus: item.bus_done,
                            hook: item.hook_done,
                        }) =>
            {
                Ok(())
            }
            Some(to) => {
                match to {
                    Move::Retry(Some(_)) => summary.retried += 1,
                    Move::Retry(None) => {
                        summary.dead += 1;
                        tracing::error!(
                            publisher = item.publisher.as_str(),
                            outcome_id = item.outcome_id.as_str(),
                            on_bus = legs.bus,
                            "an outcome was given up after a day of tries"
                        );
                    }
                    Move::Keep | Move::Defer(_) => {}
                }
                deps.store
                    .outcome_progress(item, legs, to, own_queue, now)
                    .await
            }
        };
        if let Err(e) = moved {
            // Left as it was: the next tick tries it again (same outcome_id).
            tracing::error!(error = %error_chain(&e), "an outcome could not be moved");
        }
    }
    Ok(summary)
}

/// Puts every due outcome not on the bus yet on it, ten at a time: whether each is on
/// it now (all, when no bus is configured: nothing to put).
async fn bus(deps: &Deps, due: &[OutcomeItem]) -> Vec<bool> {
    let mut on = due.iter().map(|i| i.bus_done).collect::<Vec<bool>>();
    let Some(bus) = &deps.bus else {
        return vec![true; due.len()];
    };
    let waiting: Vec<usize> = (0..due.len()).filter(|&i| !on[i]).collect();
    for batch in waiting.chunks(onegrant::bus::MAX_BATCH) {
        let details: Vec<serde_json::Value> = batch
            .iter()
            .filter_map(|&i| serde_json::to_value(due[i].outcome()).ok())
            .collect();
        match bus.put(ONEGRANT, OUTCOME_DETAIL_TYPE, &details).await {
            Ok(taken) => {
                for (&i, taken) in batch.iter().zip(taken) {
                    on[i] = taken;
                }
            }
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "outcomes could not be put on the bus");
            }
        }
    }
    on
}

/// One publisher's due outcomes (indexes into `due`, oldest first) posted to its
/// webhook, until one fails.
async fn hooks(
    deps: &Deps,
    source: &str,
    items: Vec<usize>,
    due: &[OutcomeItem],
    now: DateTime<Utc>,
    deadline: Instant,
) -> Vec<(usize, Hook)> {
    let webhook = deps
        .config
        .publishers
        .get(source)
        .and_then(|p| p.webhook.as_deref().map(|url| (p, url)));
    let mut went = Vec::new();
    // Once its webhook failed (or time ran out), the rest are not posted this tick;
    // those whose post was taken before are still marked so.
    let mut stopped = false;
    for i in items {
        let item = &due[i];
        if item.hook_done {
            went.push((i, Hook::Done));
            continue;
        }
        // A publisher with no webhook (or no longer configured): nobody to post to.
        let Some((publisher, url)) = webhook else {
            went.push((i, Hook::None));
            continue;
        };
        if stopped || Instant::now() + POST_TIMEOUT > deadline {
            stopped = true;
            continue;
        }
        match post(publisher, url, item, now).await {
            Ok(()) => went.push((i, Hook::Done)),
            Err(why) => {
                tracing::warn!(
                    publisher = source,
                    outcome_id = item.outcome_id.as_str(),
                    attempts = item.attempts + 1,
                    why,
                    "an outcome's webhook post failed"
                );
                went.push((i, Hook::Failed));
                // Its webhook is unwell: the rest wait for a later tick.
                stopped = true;
            }
        }
    }
    went
}

/// Posts `item`'s outcome to `url`, signed with `publisher`'s current key at `now`.
async fn post(
    publisher: &Publisher,
    url: &str,
    item: &OutcomeItem,
    now: DateTime<Utc>,
) -> Result<(), String> {
    let body = serde_json::to_vec(&item.outcome()).map_err(|e| e.to_string())?;
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    // The publisher API's target: the path percent-decoded (a URL keeps it encoded),
    // then the query as sent; a receiver checks it as onegrant checks its requests.
    let target = signature::target(parsed.path(), parsed.query());
    let timestamp = now.timestamp();
    let signed = signature::sign(
        publisher.current_key(),
        timestamp,
        &signature::Request {
            method: "POST",
            target: &target,
            body: &body,
        },
    );
    let answer = client()
        .post(parsed)
        .header("content-type", "application/json")
        .header(PUBLISHER_HEADER, ONEGRANT)
        .header(TIMESTAMP_HEADER, timestamp.to_string())
        .header(SIGNATURE_HEADER, signed)
        .body(body)
        .send()
        .await
        // (Without the URL: a webhook's query may hold the publisher's own token.)
        .map_err(|e| format!("not answered: {}", error_chain(&e.without_url())))?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(format!("answered {}", answer.status().as_u16()))
    }
}

/// The handler as its Lambda `main` and the local Invoke API take it.
pub fn invoke(
    deps: &Deps,
    _event: serde_json::Value,
    budget: Duration,
) -> BoxFuture<'_, Result<serde_json::Value, EventError>> {
    Box::pin(async move {
        // A little before the invocation's end: the last writes land inside it.
        let deadline = Instant::now() + budget.saturating_sub(Duration::from_secs(2));
        let summary = tick(deps, deadline).await.map_err(EventError::Store)?;
        use onegrant::metrics::{count, name};
        count(name::OUTCOMES_DELIVERED, summary.delivered);
        count(name::OUTCOMES_ON_BUS_ONLY, summary.unaddressed);
        count(name::OUTCOMES_RETRIED, summary.retried);
        count(name::OUTCOMES_DEAD, summary.dead);
        tracing::info!(?summary, "outcomes tick");
        serde_json::to_value(summary).map_err(EventError::Answer)
    })
}
