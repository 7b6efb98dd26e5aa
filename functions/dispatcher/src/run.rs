//! One worker's share of a tick: the sweep of its shards' leases beside the dispatch of
//! what is due on them.

use onegrant::Deps;
use onegrant::store::StoreError;
use onegrant::store::audit::attributed;
use tokio::time::Instant;

use crate::budget::FINALIZE_MARGIN;
use crate::lane::dispatch_due;
use crate::summary::Summary;

/// The sweep of `shards`' leases beside the dispatch of what is due on them.
pub(crate) async fn run_shards(
    deps: &Deps,
    deadline: Instant,
    shards: &[u32],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Summary, StoreError> {
    let config = &deps.config;
    // The sweep settles other dispatchers' leftovers; it runs beside this tick's sends
    // rather than before them, so it never delays a reminder that is due.
    // Bounded by the invocation too: what it does not reach, the next tick does.
    let sweeping = tokio::time::timeout_at(
        deadline.checked_sub(FINALIZE_MARGIN).unwrap_or(deadline),
        attributed(
            "sweep",
            deps.store
                .sweep(&config.templates, shards.iter().copied(), now),
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
