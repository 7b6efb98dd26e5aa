//! The DynamoDB single-table store.
//!
//! All user-owned items share `pk = USER#<openid>`, so one query answers any screen
//! (docs/design.md §6). Every state change is a conditional write or a single
//! `TransactWriteItems`; replays are answered from `ReturnValuesOnConditionCheckFailure =
//! ALL_OLD` without a second read. Item mapping (serde_dynamo) stays inside this module.
//!
//! Plumbing, which every feature uses and which uses no feature:
//! - [`keys`]: the key formats, in one place.
//! - `items`: the typed items (plan, grant, quota, outbox, recorded event) in and out,
//!   and the writes that move them; attribute names and state strings live there.
//! - `tx`: the transaction engine (one token per transaction, the answer sorted).
//! - `snapshot`: loading a plan with its quota item in one round trip.
//! - `open_grants`: voiding a template's open grants, repairing their lists.
//! - `consent`: plans moved by a user's choice (a report, a refusal).
//! - `taps`: pairing reported taps with WeChat's popup events.
//! - [`audit`]: the audit trail written with every change, and its reader.
//!
//! Features, one per handler, each depending only on the plumbing and the domain:
//! - [`grants`]: grant reports and quota counters.
//! - [`reminders`]: plans, settings and check-ins.
//! - [`inbox`]: notifications, the unread counter and the outbox.
//! - [`dispatch`]: due items, claims, finalizes and the sweep.
//! - [`callback`]: WeChat's pushed events, recorded once and applied in WeChat's order.

pub mod audit;
pub mod callback;
mod consent;
pub mod dispatch;
pub mod erasure;
pub mod export;
pub mod grants;
pub mod inbox;
mod items;
pub mod keys;
mod open_grants;
pub mod outcomes;
pub mod reminders;
mod retry;
mod snapshot;
mod sweep;
mod taps;
mod tx;

use crate::domain::dispatch::RetryPolicy;
use crate::domain::reminders::ReminderKinds;
use crate::store::items::is_there;

use aws_sdk_dynamodb::error::SdkError;

pub use crate::config::{Limits, Retention};
pub use crate::domain::grants::{GrantEntry, GrantsRecorded};
pub use crate::store::consent::Stood;
pub use crate::store::items::outbox::Publication;
pub use crate::store::items::wechat_ips::{StoredWechatIps, WECHAT_IPS_KEPT_FOR};
pub(crate) use retry::{
    Attempt, MAX_WRITE_ATTEMPTS, Tries, backoff, retry_carrying, retry_contended,
};

/// The single-table store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    client: aws_sdk_dynamodb::Client,
    table: String,
    /// Partitions of the due and lease indexes (docs/design.md §6).
    shards: u32,
    limits: Limits,
    /// The configured reminder kinds: which plan a due item, a report or a refusal
    /// names (shared by every clone).
    kinds: std::sync::Arc<ReminderKinds>,
    /// How failed sends are retried.
    policy: RetryPolicy,
    /// Shared by every clone: caps the index queries a tick has in flight (see
    /// [`INDEX_QUERIES_IN_FLIGHT`]).
    index_queries: std::sync::Arc<tokio::sync::Semaphore>,
    /// What time it is where the store itself reads it (an audit entry's time, a lease
    /// taken, an answer kept).
    clock: crate::clock::Clock,
    /// This deployment's salt for openids' tags (an erasure's tombstone).
    openid_salt: std::sync::Arc<str>,
    /// WeChat's push addresses as this container last read them.
    wechat_ips_seen: items::wechat_ips::WechatIpsSeen,
}

/// The most index queries one process has in flight at once. A tick queries the due
/// and lease indexes once per partition, and after a change of `DUE_SHARDS` (or with
/// the registry unreadable) that is up to 256 partitions each: all at once, that
/// would be over 500 connections from one Lambda container, against its 1,024 file
/// descriptors, and a burst no emulator's listen queue holds. At the default 16
/// shards a tick's 32 queries still all go at once.
pub const INDEX_QUERIES_IN_FLIGHT: usize = 32;

/// The due and lease indexes' shard count when none is configured.
pub const DEFAULT_SHARDS: u32 = 16;

/// What a store operation can fail with, in the terms callers act on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An idempotency key was reused with a different payload (invariant I3).
    #[error("idempotency key reused with a different payload: {0}")]
    IdempotencyConflict(String),
    /// DynamoDB is throttling, contended past our retries, or unreachable: try later.
    #[error("DynamoDB is unavailable or contended")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A guard against a runaway client refused the write; nothing was stored.
    #[error("refused by a limit: {0:?}")]
    Limited(Limit),
    /// A stored item does not have the shape this code writes.
    #[error("stored item is unreadable: {0}")]
    Corrupt(String),
    /// Anything else the SDK reported (a bug or misconfiguration on our side).
    #[error("DynamoDB request failed")]
    Sdk(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Which guard refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The user already holds [`Limits::max_open_grants`] available grants of the
    /// template.
    OpenGrants,
    /// The user made [`Limits::reports_per_minute`] reports this minute; the next
    /// minute starts in `retry_after` seconds.
    Rate { retry_after: u64 },
}

impl Store {
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            shards: DEFAULT_SHARDS,
            limits: Limits::default(),
            kinds: std::sync::Arc::new(ReminderKinds::none()),
            policy: RetryPolicy::default(),
            index_queries: std::sync::Arc::new(tokio::sync::Semaphore::new(
                INDEX_QUERIES_IN_FLIGHT,
            )),
            clock: crate::clock::Clock::system(),
            openid_salt: std::sync::Arc::from(crate::config::DEFAULT_OPENID_SALT),
            wechat_ips_seen: Default::default(),
        }
    }

    /// This store reading `clock` (a test's, which it moves).
    pub fn with_clock(mut self, clock: crate::clock::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The store's clock.
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.clock
    }

    /// A query of the due index's partition `due_pk` for what is due by `horizon`,
    /// oldest first, at most `limit` entries (run within an [`Store::index_turn`]).
    pub(crate) fn due_query(
        &self,
        due_pk: String,
        horizon: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        items::query::partition("due_pk", items::s(due_pk))
            .range(
                "due_at",
                items::query::Range::UpTo(items::n(horizon.timestamp_millis())),
            )
            .on(self
                .client
                .query()
                .table_name(&self.table)
                .index_name("due"))
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
    }

    /// A turn to query an index, held until dropped (see [`INDEX_QUERIES_IN_FLIGHT`]).
    /// The semaphore is never closed; were it, the query would go unbounded rather
    /// than not at all.
    pub(crate) async fn index_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.index_queries.acquire().await.ok()
    }

    /// This store with `limits` (retention and guards) instead of the defaults.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// This store with the configured reminder kinds (by default none: a store built
    /// without the configuration, an operator's tool, knows no plan's kind).
    pub fn with_reminders(mut self, kinds: ReminderKinds) -> Self {
        self.kinds = std::sync::Arc::new(kinds);
        self
    }

    /// This store retrying failed sends by `policy`.
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// This store with the due and lease indexes spread over `shards` partitions.
    pub fn with_shards(mut self, shards: u32) -> Self {
        self.shards = shards.max(1);
        self
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.client
    }

    /// One item, strongly consistent.
    pub(crate) async fn get(&self, pk: &str, sk: &str) -> Result<Option<items::Item>, StoreError> {
        Ok(self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(items::key(pk, sk)))
            .consistent_read(true)
            .send()
            .await?
            .item)
    }

    /// Adds `member` to the string set `name` of an existing item.
    pub(crate) async fn add_member(
        &self,
        pk: &str,
        sk: &str,
        name: &str,
        member: String,
    ) -> Result<(), StoreError> {
        let added = items::change::change().add(
            name,
            aws_sdk_dynamodb::types::AttributeValue::Ss(vec![member]),
        );
        // (Nothing to do if the item is gone.)
        items::change::update(&self.table, items::key(pk, sk), added)
            .when(is_there())
            .apply(&self.client)
            .await?;
        Ok(())
    }

    /// Removes members from string sets of an existing item (`(attribute, members)`;
    /// nothing if there are none, nor if the item is gone).
    pub(crate) async fn delete_members(
        &self,
        pk: &str,
        sk: &str,
        sets: &[(&str, Vec<String>)],
    ) -> Result<(), StoreError> {
        let mut gone = items::change::change();
        for (name, members) in sets {
            if !members.is_empty() {
                gone = gone.delete(
                    *name,
                    aws_sdk_dynamodb::types::AttributeValue::Ss(members.clone()),
                );
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        items::change::update(&self.table, items::key(pk, sk), gone)
            .when(is_there())
            .apply(&self.client)
            .await?;
        Ok(())
    }
}

/// A `ClientRequestToken` for one `TransactWriteItems` call. The SDK retries a call
/// (a timeout, a dropped connection, a 500) with the same input, so with the same token:
/// DynamoDB answers a retry of a transaction that committed with its first answer for
/// 10 minutes instead of running it again. (The SDK would fill in a token itself — the
/// field is an idempotency token in DynamoDB's model — but the protocol depends on it,
/// so it is set here, where it is visible.)
fn request_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Sorts an SDK failure into "try later" or "our fault". `service_unavailable` says
/// whether the operation's own error is a throttle or conflict.
fn classify_sdk_error<E>(
    err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    service_unavailable: impl Fn(&E) -> bool,
) -> StoreError
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + Send + Sync + 'static,
{
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Unavailable(Box::new(err))
        }
        SdkError::ServiceError(ref service)
            if service_unavailable(service.err())
                || transient(service.err().code(), service.raw().status().as_u16()) =>
        {
            StoreError::Unavailable(Box::new(err))
        }
        other => StoreError::Sdk(Box::new(other)),
    }
}

/// Any other operation's failure, sorted by [`classify_sdk_error`] with no error of its
/// own counted as "not now": so `?` maps a read's or a single write's failure.
impl<E> From<SdkError<E, aws_smithy_runtime_api::http::Response>> for StoreError
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + Send + Sync + 'static,
{
    fn from(err: SdkError<E, aws_smithy_runtime_api::http::Response>) -> Self {
        classify_sdk_error(err, |_| false)
    }
}

/// A request the SDK would not build (a required field left out): our fault.
impl From<aws_sdk_dynamodb::error::BuildError> for StoreError {
    fn from(err: aws_sdk_dynamodb::error::BuildError) -> Self {
        StoreError::Sdk(Box::new(err))
    }
}

/// Whether DynamoDB's answer means "not now" for any operation, reads included: a
/// throttle, a conflict, a request still in progress, or a server error (500, and the
/// 503s its front end may answer unmodelled) that outlasted the SDK's retries. The
/// caller answers 503 with `Retry-After` (API.md), never 500.
fn transient(code: Option<&str>, status: u16) -> bool {
    (500..600).contains(&status)
        || matches!(
            code,
            Some(
                "ThrottlingException"
                    | "Throttling"
                    | "ProvisionedThroughputExceededException"
                    | "RequestLimitExceeded"
                    | "LimitExceededException"
                    | "TooManyRequestsException"
                    | "InternalServerError"
                    | "ServiceUnavailable"
                    | "TransactionInProgressException"
                    | "TransactionConflictException"
            )
        )
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {err}"))
}
