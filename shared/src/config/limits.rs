//! Retention and the guards against a runaway client, with their defaults.

use std::time::Duration;

/// How long finished items are kept, and the guards against a runaway client.
/// The defaults are what docs/configuration.md documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub retention: Retention,
    /// Most available grants one user holds of one template: each is ~30 bytes on the
    /// quota item, which every claim rewrites.
    pub max_open_grants: u32,
    /// Most grant reports one user makes in one minute.
    pub reports_per_minute: u32,
    /// Most new check-ins one user makes of one reminder kind in a minute (a replay is
    /// never counted): enough for a day's offline queue to drain in one minute.
    pub checkins_per_minute: u32,
    /// Most changes one user makes in a minute through the other write routes (plan
    /// settings, preferences, marking notifications read): a request that changes
    /// nothing is not counted, and writes nothing.
    pub changes_per_minute: u32,
    /// Most read calls one user makes in a minute (listing notifications, the unread
    /// count, preferences, grants, a plan): each is counted by one small write before
    /// it reads. 0: no limit, and no write.
    pub reads_per_minute: u32,
    /// Most publisher API calls one publisher makes in a minute, each counted by one
    /// small write before anything else is read.
    pub publisher_requests_per_minute: u32,
    /// Whether WeChat's message push is configured: reported grants are paired with
    /// popup events (the store's tap marks) and settled sends look for sent
    /// events kept pending for them.
    pub push_events: bool,
    /// How long a write contended by other writers (or a throttling database) keeps
    /// trying before it is answered 503 with `Retry-After`: well inside an API
    /// function's 10-second timeout, which API Gateway would answer with a bare 5xx.
    pub write_budget: Duration,
    /// How long an HTTP handler works before it answers 503 (under the function's
    /// timeout, so a client always gets the error shape and `Retry-After`).
    pub handler_budget: Duration,
    /// Whether changes of grants, deliveries and plans write history entries.
    pub audit: bool,
    /// Most messages of one template one user is sent in one of their days, reminders
    /// and pushes alike (`domain::dispatch::cap`); None: no cap.
    pub pushes_per_day: Option<u32>,
    /// Most open pushes (pending, waiting for a grant, scheduled or in flight) one user
    /// has at once from one publisher: past it an event's push is recorded `rejected`
    /// (`too_many_pending`), its notification stored all the same.
    pub pushes_pending_max: u32,
    /// Days without a signed-in request after which a user is forgotten by the same
    /// erasure as `DELETE /v1/me` (`domain::erasure`); 0: never.
    pub inactive_user_days: u32,
}

/// How long each kind of finished item stays before DynamoDB's TTL removes it
/// (`expires_at`, epoch seconds). Open items (available or reserved grants, plans,
/// unread notifications, pending pushes, deliveries in flight) never expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Consumed or invalid grants and recorded refusals, from when they ended. Also
    /// the replay window of a grant report: a report replayed later than this after
    /// its grant ended would be taken as new.
    pub grants: chrono::Duration,
    /// Settled deliveries (`sent`, `failed`, `unknown`), from when they settled.
    pub deliveries: chrono::Duration,
    /// Finished pushes (outbox items), from when they finished.
    pub outbox: chrono::Duration,
    /// Notifications, from when they were read.
    pub read_notes: chrono::Duration,
    /// Check-in action records (the replay window of a check-in), from the check-in.
    pub actions: chrono::Duration,
    /// Event idempotency records (the replay window of a publisher), from ingestion.
    pub events: chrono::Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            grants: chrono::Duration::days(400),
            deliveries: chrono::Duration::days(90),
            outbox: chrono::Duration::days(90),
            read_notes: chrono::Duration::days(90),
            actions: chrono::Duration::days(35),
            events: chrono::Duration::days(35),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            retention: Retention::default(),
            max_open_grants: 100,
            reports_per_minute: 30,
            checkins_per_minute: 60,
            changes_per_minute: 60,
            reads_per_minute: 120,
            publisher_requests_per_minute: 6000,
            push_events: false,
            // The last attempt may start just before the budget ends and take one SDK
            // call (its attempts and backoff): 4 s leaves that room inside 10 s.
            write_budget: Duration::from_secs(4),
            handler_budget: Duration::from_secs(9),
            audit: true,
            pushes_per_day: None,
            pushes_pending_max: 1000,
            inactive_user_days: 0,
        }
    }
}
