//! Fan-out: with `DISPATCH_WORKERS` above 1, the scheduled tick splits the due and
//! lease shards into that many contiguous groups and invokes the function itself once
//! per group, asynchronously (`InvocationType: Event`), with the group as its payload.
//! Each worker sweeps and dispatches its own shards within its own invocation's time,
//! so throughput grows with the workers (and the shard count bounds them). A group
//! whose worker cannot be invoked is done by the tick itself, so a missing permission
//! or an Invoke API outage slows dispatch down but never stops it.

use chrono::{DateTime, Utc};
use onegrant::Deps;
use onegrant::invoke::Invoker;
use onegrant::store::StoreError;
use onegrant::store::dispatch::ShardSpan;
use onegrant::telemetry::error_chain;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::run::run_shards;
use crate::summary::Summary;

/// The key of a worker invocation's payload (a scheduled event never has it).
const WORK: &str = "onegrant_dispatch_shards";

/// A worker's share of a tick: shards `from..to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    pub from: u32,
    pub to: u32,
}

/// A worker event that names no shards it could work on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a worker event with unusable shards: {0}")]
pub struct BadWork(String);

impl Work {
    /// The work an invocation's event names: `Ok(None)` for any other event (a
    /// schedule, a manual invocation), an error for a worker event that cannot be
    /// worked on — never a whole tick, which would fan out again.
    pub fn of(event: &Value) -> Result<Option<Self>, BadWork> {
        let Some(raw) = event.get(WORK) else {
            return Ok(None);
        };
        let work: Self =
            serde_json::from_value(raw.clone()).map_err(|_| BadWork(raw.to_string()))?;
        if work.from < work.to && work.to <= onegrant::store::dispatch::shards::MAX_SHARDS {
            Ok(Some(work))
        } else {
            Err(BadWork(raw.to_string()))
        }
    }

    pub fn shards(self) -> Vec<u32> {
        (self.from..self.to).collect()
    }

    /// The event that hands this work to a worker.
    pub fn event(self) -> Value {
        json!({ WORK: self })
    }
}

/// `0..span` in `workers` contiguous groups as even as can be (fewer when there are
/// fewer shards than workers).
pub fn groups(span: u32, workers: u32) -> Vec<Work> {
    let workers = workers.clamp(1, span.max(1));
    (0..workers)
        .map(|i| Work {
            from: span * i / workers,
            to: span * (i + 1) / workers,
        })
        .filter(|w| w.from < w.to)
        .collect()
}

/// Invokes one worker per group; the groups no worker took are run here.
pub async fn fan_out(
    deps: &Deps,
    invoker: &Invoker,
    shards: &ShardSpan,
    deadline: Instant,
    now: DateTime<Utc>,
) -> Result<Summary, StoreError> {
    let groups = groups(shards.span, deps.config.dispatch.workers);
    let invoked = futures::future::join_all(groups.iter().map(|work| async move {
        let sent = invoker.invoke_event(&work.event()).await;
        if let Err(e) = &sent {
            tracing::error!(from = work.from, to = work.to, error = %error_chain(e), "worker not invoked; this tick does its shards");
        }
        (*work, sent.is_ok())
    }))
    .await;
    let left: Vec<Work> = invoked
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(w, _)| *w)
        .collect();
    let mut summary = Summary {
        workers: u32::try_from(invoked.len() - left.len()).unwrap_or(0),
        inline: u32::try_from(left.len()).unwrap_or(0),
        ..Summary::default()
    };
    // The groups left run here as one, sharing one concurrency limit.
    if !left.is_empty() {
        let shards: Vec<u32> = left.iter().flat_map(|w| w.shards()).collect();
        summary.absorb(run_shards(deps, deadline, &shards, now).await?);
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_cover_every_shard_once_and_evenly() {
        for span in [1u32, 2, 5, 16, 17, 256] {
            for workers in [1u32, 2, 3, 4, 16, 64] {
                let g = groups(span, workers);
                let covered: Vec<u32> = g.iter().flat_map(|w| w.shards()).collect();
                assert_eq!(covered, (0..span).collect::<Vec<_>>(), "{span}/{workers}");
                let sizes: Vec<u32> = g.iter().map(|w| w.to - w.from).collect();
                let (least, most) = (sizes.iter().min(), sizes.iter().max());
                assert!(
                    most.zip(least).is_some_and(|(m, l)| m - l <= 1),
                    "{sizes:?}"
                );
                assert_eq!(g.len() as u32, workers.min(span));
            }
        }
    }

    #[test]
    fn only_a_well_formed_worker_event_is_work() {
        let work = Work { from: 4, to: 8 };
        assert_eq!(Work::of(&work.event()), Ok(Some(work)));
        assert_eq!(
            Work::of(&json!({"detail-type": "Scheduled Event"})),
            Ok(None)
        );
        assert_eq!(Work::of(&json!(null)), Ok(None));
        for event in [
            json!({WORK: {"from": 8, "to": 4}}),
            json!({WORK: {"from": 0, "to": 100000}}),
            json!({WORK: "all"}),
            json!({WORK: null}),
        ] {
            assert!(Work::of(&event).is_err(), "{event}");
        }
    }
}
