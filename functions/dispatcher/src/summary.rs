//! What one tick did: the counts it answers with, logs and writes as metrics.

use onegrant::domain::dispatch::claim::Tally;
use serde::Serialize;

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
    /// Scheduled notifications published at their `send_at`.
    pub published: u32,
    /// Pushes not sent because their `expires_at` passed.
    pub expired: u32,
    /// Pushes not sent because the user muted their type.
    pub muted: u32,
    /// Pushes not sent because the user's settings keep their template refused.
    pub turned_off: u32,
    /// Pushes held by the user's quiet hours (due again at their end).
    pub held: u32,
    /// Pushes waiting for a grant of their template (none available, or a better push
    /// waits for those there are): pending until a grant wakes them.
    pub grant_waits: u32,
    /// Pushes woken by their template's wake entry (a grant given while they waited,
    /// whether or not its writer woke them).
    pub woken: u32,
    /// Reminders and pushes past the user's daily cap, due again on their next day.
    pub cap_waits: u32,
    /// Pushes past the user's daily cap that expire first: inbox-only (`capped`).
    pub capped: u32,
    /// Refill notices published: reminders that used up a user's grants of a template
    /// naming a refill template, while the user held a refill grant.
    pub refills: u32,
    /// Such depletions with no refill grant held: nothing could tell the user.
    pub refills_without_grant: u32,
    /// Steps of users' erasures (`Store::erase_due`), and the erasures they finished.
    pub erasure_steps: u32,
    pub erasures_done: u32,
    /// Steps of erasures still pending an hour after they began.
    pub erasures_stalled: u32,
    /// Pushes cancelled at their claim (the cancel came while an attempt was in flight).
    pub cancelled: u32,
    /// Pushes replaced at their claim (a newer notification of their `collapse_key`
    /// came while an attempt was in flight).
    pub replaced: u32,
    pub lost: u32,
    /// Left due for the next tick: no time left, or the user's turn came too late.
    pub deferred: u32,
    /// Left due for the next tick: no access token could be had.
    pub no_token: u32,
    /// Items that could not be read or written (logged, skipped).
    pub skipped: u32,
    /// Due entries of reminder kinds this deployment does not configure, moved out of
    /// the way (`Store::park_due`), and by kind (logged once per kind per tick).
    pub parked: u32,
    #[serde(skip)]
    pub parked_kinds: std::collections::BTreeMap<String, u32>,
    /// Workers this tick invoked for its shards (0: it did them all itself).
    pub workers: u32,
    /// Shard groups whose worker could not be invoked, so this tick did them.
    pub inline: u32,
    /// Milliseconds from each due instant to its send's answer.
    #[serde(skip)]
    pub latencies_ms: Vec<i64>,
}

impl Summary {
    /// Counts an item not sent (`domain::dispatch::claim::Unsent::tally`).
    pub fn count_unsent(&mut self, tally: Tally) {
        let counter = match tally {
            Tally::NoGrant => &mut self.no_grant,
            Tally::GrantWaits => &mut self.grant_waits,
            Tally::Expired => &mut self.expired,
            Tally::Muted => &mut self.muted,
            Tally::TurnedOff => &mut self.turned_off,
            Tally::Held => &mut self.held,
            Tally::CapWaits => &mut self.cap_waits,
            Tally::Capped => &mut self.capped,
            Tally::Cancelled => &mut self.cancelled,
            Tally::Replaced => &mut self.replaced,
        };
        *counter += 1;
    }

    /// Adds `other`'s counts to these (a tick doing a worker's shards itself).
    pub fn absorb(&mut self, other: Summary) {
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
            published,
            expired,
            muted,
            turned_off,
            held,
            grant_waits,
            woken,
            cap_waits,
            capped,
            refills,
            refills_without_grant,
            erasure_steps,
            erasures_done,
            erasures_stalled,
            cancelled,
            replaced,
            lost,
            deferred,
            no_token,
            skipped,
            parked,
            parked_kinds,
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
        self.published += published;
        self.expired += expired;
        self.muted += muted;
        self.turned_off += turned_off;
        self.held += held;
        self.grant_waits += grant_waits;
        self.woken += woken;
        self.cap_waits += cap_waits;
        self.capped += capped;
        self.refills += refills;
        self.refills_without_grant += refills_without_grant;
        self.erasure_steps += erasure_steps;
        self.erasures_done += erasures_done;
        self.erasures_stalled += erasures_stalled;
        self.cancelled += cancelled;
        self.replaced += replaced;
        self.lost += lost;
        self.deferred += deferred;
        self.no_token += no_token;
        self.skipped += skipped;
        self.parked += parked;
        for (kind, n) in parked_kinds {
            *self.parked_kinds.entry(kind).or_default() += n;
        }
        self.workers += workers;
        self.inline += inline;
        self.latencies_ms.extend(latencies_ms);
    }
}

/// One log line and the metrics of a tick (`scheduled`: the minute's own tick, not a
/// worker's share of it).
pub(crate) fn report(summary: &Summary, scheduled: bool) {
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
        published = summary.published,
        expired = summary.expired,
        muted = summary.muted,
        turned_off = summary.turned_off,
        held = summary.held,
        grant_waits = summary.grant_waits,
        woken = summary.woken,
        cap_waits = summary.cap_waits,
        capped = summary.capped,
        refills = summary.refills,
        refills_without_grant = summary.refills_without_grant,
        erasure_steps = summary.erasure_steps,
        erasures_done = summary.erasures_done,
        erasures_stalled = summary.erasures_stalled,
        cancelled = summary.cancelled,
        replaced = summary.replaced,
        deferred = summary.deferred,
        no_token = summary.no_token,
        skipped = summary.skipped,
        parked = summary.parked,
        workers = summary.workers,
        "dispatcher tick"
    );
    for (kind, entries) in &summary.parked_kinds {
        tracing::error!(
            kind = %kind,
            entries,
            "due plans of a reminder kind this deployment does not configure, moved an hour ahead (ParkedNoKind)"
        );
    }
    emit_metrics(summary, scheduled);
}

/// A tick's metrics (written as EMF lines when the invocation ends).
pub(crate) fn emit_metrics(summary: &Summary, scheduled: bool) {
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
    count(name::PUBLISHED, summary.published);
    count(name::EXPIRED, summary.expired);
    count(name::MUTED, summary.muted);
    count(name::TURNED_OFF, summary.turned_off);
    count(name::HELD, summary.held);
    count(name::GRANT_WAITS, summary.grant_waits);
    count(name::PUSHES_WOKEN, summary.woken);
    count(name::CAP_WAITS, summary.cap_waits);
    count(name::CAPPED, summary.capped);
    count(name::REFILLS, summary.refills);
    count(name::REFILLS_WITHOUT_GRANT, summary.refills_without_grant);
    count(name::ERASURE_STEPS, summary.erasure_steps);
    count(name::ERASURES_DONE, summary.erasures_done);
    count(name::ERASURES_STALLED, summary.erasures_stalled);
    count(name::CANCELLED, summary.cancelled);
    count(name::REPLACED, summary.replaced);
    count(name::RESTORED, summary.restored);
    count(name::RECOVERED, summary.recovered);
    count(name::QUARANTINED, summary.quarantined);
    count(name::KEPT, summary.kept);
    count(name::EVENTS_APPLIED_LATE, summary.events_applied);
    count(name::CONFIG_ERRORS, summary.config_errors);
    count(name::DEFERRED, summary.deferred + summary.no_token);
    count(name::LOST, summary.lost);
    count(name::SKIPPED, summary.skipped);
    count(name::PARKED_NO_KIND, summary.parked);
    distribution(name::SEND_LAG, &summary.latencies_ms);
}
