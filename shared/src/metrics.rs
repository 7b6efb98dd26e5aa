//! Metrics, as CloudWatch Embedded Metric Format lines on stdout: recorded through the
//! `metrics` facade, written by `metrics_cloudwatch_embedded` after each invocation
//! ([`flush`]), turned into CloudWatch metrics by Lambda's log pipeline. Namespace
//! `onegrant`, dimension `Function` (the function's short name, e.g. `dispatcher`) and
//! the labels named below. Every name is here, once: the functions record with these
//! constants and `template.yaml`'s alarms and dashboard are checked against [`ALL`].
//!
//! Without [`init`] (the tests' in-process functions, the local stack) recording is a
//! no-op.

use std::sync::OnceLock;

/// The metric names.
pub mod name {
    // Per dispatcher invocation (a tick or a worker's shards).
    /// Invocations that ran (a missing minute means a missed tick).
    pub const TICKS: &str = "Ticks";
    /// Due items read.
    pub const DUE: &str = "Due";
    /// Items claimed (a grant reserved for a send).
    pub const CLAIMED: &str = "Claimed";
    /// Messages WeChat took.
    pub const SENT: &str = "Sent";
    /// Sends WeChat refused or that never left (grant restored or voided).
    pub const FAILED: &str = "Failed";
    /// Failed sends by outcome class (label `Class`: retryable, config, refused, user).
    pub const FAILED_BY_CLASS: &str = "FailedByClass";
    /// Sends whose answer was lost: left `unknown`, never resent.
    pub const UNKNOWN: &str = "Unknown";
    /// Due items without a grant: nothing sent (plan paused, push skipped).
    pub const NO_GRANT: &str = "NoGrant";
    /// Grants given back after a send that did not go (or a release).
    pub const RESTORED: &str = "Restored";
    /// Claims the sweep recovered from a vanished dispatcher.
    pub const RECOVERED: &str = "Recovered";
    /// Sends refused for template, page or content: plans paused `config_error`.
    pub const CONFIG_ERRORS: &str = "ConfigErrors";
    /// Items left for the next tick (time or the user's turn ran out).
    pub const DEFERRED: &str = "Deferred";
    /// Items another dispatcher took first.
    pub const LOST: &str = "Lost";
    /// Items that could not be read or written (logged).
    pub const SKIPPED: &str = "Skipped";
    /// Lease-index entries the sweep took off the index for an operator (unreadable,
    /// or failed too often): each also in the audit trail.
    pub const QUARANTINED: &str = "Quarantined";
    /// Deliveries the sweep settled by the answer their finalize kept (not `unknown`).
    pub const KEPT: &str = "KeptAnswers";
    /// Recorded WeChat events no try applied, applied by the sweep.
    pub const EVENTS_APPLIED_LATE: &str = "EventsAppliedLate";
    /// Scheduled notifications published at their `send_at`.
    pub const PUBLISHED: &str = "Published";
    /// Pushes not sent because their `expires_at` passed (no grant spent).
    pub const EXPIRED: &str = "Expired";
    /// Pushes not sent because the user muted their notification type.
    pub const MUTED: &str = "Muted";
    /// Pushes not sent because the user's settings keep their template refused (a kept
    /// reject, a ban, the main switch off).
    pub const TURNED_OFF: &str = "TurnedOff";
    /// Pushes held by the user's quiet hours (due again at their end).
    pub const HELD: &str = "Held";
    /// Pushes that wait for a grant of their template (none available, or a better push
    /// waits for those there are): pending until a grant wakes them (no grant spent).
    pub const GRANT_WAITS: &str = "GrantWaits";
    /// Waiting pushes woken by their template's wake entry on the due index (a grant
    /// given beside them, whether or not its writer woke them).
    pub const PUSHES_WOKEN: &str = "PushesWoken";
    /// Reminders and pushes past the user's daily cap (`PUSHES_PER_DAY`), due again on
    /// their next day (no grant spent).
    pub const CAP_WAITS: &str = "CapWaits";
    /// Pushes past the user's daily cap that expire before the next day: inbox-only
    /// (`capped`, no grant spent).
    pub const CAPPED: &str = "Capped";
    /// Refill notices published: a reminder used up the user's grants of a template
    /// naming a refill template, and the user held a refill grant.
    pub const REFILLS: &str = "RefillNotices";
    /// Such depletions with no refill grant held, or the refill template refused by the
    /// user's settings: the user was not told.
    pub const REFILLS_WITHOUT_GRANT: &str = "DepletionsWithoutRefillGrant";
    /// Pushes cancelled at their claim: the cancel came while an earlier attempt was in
    /// flight, and that attempt did not go out.
    pub const CANCELLED: &str = "CancelledAtClaim";
    /// Pushes replaced at their claim: a newer notification of their `collapse_key` came
    /// while an earlier attempt was in flight, and that attempt did not go out.
    pub const REPLACED: &str = "ReplacedAtClaim";
    /// Steps of users' erasures the dispatcher took (each bounded: a long history takes
    /// several), and the erasures they finished.
    pub const ERASURE_STEPS: &str = "ErasureSteps";
    pub const ERASURES_DONE: &str = "ErasuresDone";
    /// Steps of erasures still pending an hour after they began (alarmed).
    pub const ERASURES_STALLED: &str = "ErasuresStalled";
    /// Due entries of plans whose reminder kind the deployment does not configure
    /// (removed, or a rollback), moved an hour ahead each time a tick meets them.
    pub const PARKED_NO_KIND: &str = "ParkedNoKind";
    /// Milliseconds from a due instant to WeChat's answer (a distribution).
    pub const SEND_LAG: &str = "SendLag";
    // Per HTTP request.
    /// Answers, by label `Route` (API Gateway's route key) and `Status` (2xx, 4xx, 429, 5xx).
    pub const REQUESTS: &str = "Requests";
    /// Template results newly recorded by grant reports (replays not counted), and
    /// check-ins' carried results that were recorded.
    pub const GRANTS_REPORTED: &str = "GrantsReported";
    /// Check-ins recorded.
    pub const CHECK_INS: &str = "CheckIns";
    /// Writes tried again after losing a race or a throttle (label `What`).
    pub const CONTENDED_RETRIES: &str = "ContendedRetries";
    // Per notify event.
    /// Events, by label `Outcome`: created, duplicate, conflict, invalid, refused, erased.
    pub const EVENTS: &str = "Events";
    /// Pushes refused before sending (unknown template, data no rule can fit).
    pub const PUSHES_REJECTED: &str = "PushesRejected";
    /// Pushes refused at ingest because their user had `PUSHES_PENDING_MAX` open pushes
    /// from the event's publisher (also counted in `PushesRejected`).
    pub const PUSHES_TOO_MANY_PENDING: &str = "PushesTooManyPending";
    // The publisher API.
    /// Publisher API requests refused before anything was read, by label `Reason`:
    /// missing, unknown_publisher, stale, signature.
    pub const PUBLISHER_REFUSALS: &str = "PublisherRefusals";
    // Outcomes told back.
    /// Outcomes posted to their publisher's webhook and answered 2xx.
    pub const OUTCOMES_DELIVERED: &str = "OutcomesDelivered";
    /// Outcomes of a publisher with no webhook: put on the bus only, and done.
    pub const OUTCOMES_ON_BUS_ONLY: &str = "OutcomesOnBusOnly";
    /// Outcome posts that failed and wait to be tried again.
    pub const OUTCOMES_RETRIED: &str = "OutcomesRetried";
    /// Outcomes given up after a day of tries (kept with `dead_at`).
    pub const OUTCOMES_DEAD: &str = "OutcomesDeadLettered";
    // WeChat.
    /// Access token fetches, by label `Outcome` (ok, failed).
    pub const TOKEN_FETCHES: &str = "TokenFetches";
    /// Reads of WeChat's push addresses, by label `Outcome` (kept: a list taken;
    /// failed: WeChat not read; refused: a list not taken, the one in use kept).
    pub const WECHAT_IPS: &str = "WechatIps";
    /// Pushes refused at WeChat's door: from an address not in WeChat's list.
    pub const PUSHES_FROM_OUTSIDE: &str = "PushesFromOutside";
    // The edge protection.
    /// Requests refused for not coming through the stack's CloudFront distribution.
    pub const FROM_ELSEWHERE: &str = "RequestsAroundEdge";
    // Sessions.
    /// Session keys a warm container could not read again (the keys held kept).
    pub const SESSION_KEY_READS_FAILED: &str = "SessionKeyReadsFailed";
}

/// Every metric name onegrant records.
pub const ALL: [&str; 52] = [
    name::TICKS,
    name::DUE,
    name::CLAIMED,
    name::SENT,
    name::FAILED,
    name::FAILED_BY_CLASS,
    name::UNKNOWN,
    name::NO_GRANT,
    name::RESTORED,
    name::RECOVERED,
    name::CONFIG_ERRORS,
    name::DEFERRED,
    name::LOST,
    name::SKIPPED,
    name::QUARANTINED,
    name::KEPT,
    name::EVENTS_APPLIED_LATE,
    name::PUBLISHED,
    name::EXPIRED,
    name::MUTED,
    name::TURNED_OFF,
    name::HELD,
    name::GRANT_WAITS,
    name::PUSHES_WOKEN,
    name::CAP_WAITS,
    name::CAPPED,
    name::REFILLS,
    name::REFILLS_WITHOUT_GRANT,
    name::CANCELLED,
    name::REPLACED,
    name::ERASURE_STEPS,
    name::ERASURES_DONE,
    name::ERASURES_STALLED,
    name::PARKED_NO_KIND,
    name::SEND_LAG,
    name::REQUESTS,
    name::GRANTS_REPORTED,
    name::CHECK_INS,
    name::CONTENDED_RETRIES,
    name::EVENTS,
    name::PUSHES_REJECTED,
    name::PUSHES_TOO_MANY_PENDING,
    name::PUBLISHER_REFUSALS,
    name::OUTCOMES_DELIVERED,
    name::OUTCOMES_ON_BUS_ONLY,
    name::OUTCOMES_RETRIED,
    name::OUTCOMES_DEAD,
    name::TOKEN_FETCHES,
    name::WECHAT_IPS,
    name::PUSHES_FROM_OUTSIDE,
    name::FROM_ELSEWHERE,
    name::SESSION_KEY_READS_FAILED,
];

/// The labels (EMF dimensions besides `Function`) each labelled metric is recorded
/// with; every other metric has `Function` alone.
pub const LABELS: [(&str, &[&str]); 8] = [
    (name::FAILED_BY_CLASS, &["Class"]),
    (name::REQUESTS, &["Route", "Status"]),
    (name::CONTENDED_RETRIES, &["What"]),
    (name::EVENTS, &["Outcome"]),
    (name::TOKEN_FETCHES, &["Outcome"]),
    (name::WECHAT_IPS, &["Outcome"]),
    (name::PUBLISHER_REFUSALS, &["Reason"]),
    (name::PUSHES_REJECTED, &[]),
];

/// The dimension names metric `name` is written with.
pub fn dimensions(name: &str) -> Vec<&'static str> {
    let mut all = vec!["Function"];
    if let Some((_, labels)) = LABELS.iter().find(|(n, _)| *n == name) {
        all.extend_from_slice(labels);
    }
    all
}

/// The CloudWatch namespace.
pub const NAMESPACE: &str = "onegrant";

/// Most samples of a distribution one invocation writes (one EMF document holds 100).
pub const MAX_SAMPLES: usize = 100;

static COLLECTOR: OnceLock<&'static metrics_cloudwatch_embedded::Collector> = OnceLock::new();

/// Installs the recorder for function `function` (a cold start; idempotent).
pub fn init(function: &'static str) {
    if COLLECTOR.get().is_some() {
        return;
    }
    match metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(NAMESPACE)
        .with_dimension("Function", function)
        .init()
    {
        Ok(collector) => {
            let _ = COLLECTOR.set(collector);
            metrics::describe_histogram!(
                name::SEND_LAG,
                metrics::Unit::Milliseconds,
                "from a due instant to WeChat's answer"
            );
        }
        // Another recorder is installed (a test harness): metrics go there.
        Err(e) => tracing::warn!(error = %e, "metrics recorder not installed"),
    }
}

/// Writes what was recorded since the last flush as EMF lines on stdout (after each
/// invocation).
pub fn flush() {
    if let Some(collector) = COLLECTOR.get()
        && let Err(e) = collector.flush(std::io::stdout().lock())
    {
        tracing::warn!(error = %e, "metrics not written");
    }
}

/// Adds `n` to counter `name`.
pub fn count(name: &'static str, n: u32) {
    if n > 0 {
        metrics::counter!(name).increment(u64::from(n));
    }
}

/// Adds `n` to counter `name` with one label.
pub fn count_by(name: &'static str, label: &'static str, value: String, n: u32) {
    if n > 0 {
        metrics::counter!(name, label => value).increment(u64::from(n));
    }
}

/// Records `samples` of distribution `name`: all of them, or when there are more than
/// one document holds, [`MAX_SAMPLES`] evenly spaced order statistics (so the
/// percentiles CloudWatch computes stay those of the whole set).
pub fn distribution(name: &'static str, samples: &[i64]) {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let picked: Vec<i64> = if sorted.len() <= MAX_SAMPLES {
        sorted
    } else {
        (0..MAX_SAMPLES)
            .filter_map(|i| {
                sorted
                    .get(i * (sorted.len() - 1) / (MAX_SAMPLES - 1))
                    .copied()
            })
            .collect()
    };
    let histogram = metrics::histogram!(name);
    for sample in picked {
        #[allow(clippy::cast_precision_loss)]
        histogram.record(sample as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names = ALL.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }
}
