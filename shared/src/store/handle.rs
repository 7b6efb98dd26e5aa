//! The store's handle: the client, the table and what every clone shares (the
//! configuration it was built with, the index queries in flight, its clock, the
//! container's copy of WeChat's addresses). Every feature's methods are `impl Store`
//! blocks in its own module.

use chrono::{DateTime, Utc};

use crate::config::Limits;
use crate::domain::reminders::ReminderKinds;
use crate::domain::settle::RetryPolicy;
use crate::domain::wechat_ips::WechatIps;

/// The single-table store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(in crate::store) client: aws_sdk_dynamodb::Client,
    pub(in crate::store) table: String,
    /// Partitions of the due and lease indexes (docs/design.md §6).
    pub(in crate::store) shards: u32,
    pub(in crate::store) limits: Limits,
    /// The configured reminder kinds: which plan a due item, a report or a refusal
    /// names (shared by every clone).
    pub(in crate::store) kinds: std::sync::Arc<ReminderKinds>,
    /// How failed sends are retried.
    pub(in crate::store) policy: RetryPolicy,
    /// Shared by every clone: caps the index queries a tick has in flight (see
    /// [`INDEX_QUERIES_IN_FLIGHT`]).
    pub(in crate::store) index_queries: std::sync::Arc<tokio::sync::Semaphore>,
    /// What time it is where the store itself reads it (an audit entry's time, a lease
    /// taken, an answer kept).
    pub(in crate::store) clock: crate::clock::Clock,
    /// This deployment's salt for openids' tags (an erasure's tombstone).
    pub(in crate::store) openid_salt: std::sync::Arc<str>,
    /// WeChat's push addresses as this container last read them.
    pub(in crate::store) wechat_ips_seen: WechatIpsSeen,
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

/// The list of WeChat's push addresses in use and when it was read from WeChat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredWechatIps {
    pub ips: WechatIps,
    pub fetched_at: DateTime<Utc>,
}

/// The list a container read, and when (shared by the store's clones).
pub(crate) type WechatIpsSeen =
    std::sync::Arc<tokio::sync::Mutex<Option<(Option<StoredWechatIps>, DateTime<Utc>)>>>;

impl Store {
    /// This store tagging openids with `salt` (`domain::erasure::subject`).
    pub fn with_openid_salt(mut self, salt: impl Into<String>) -> Self {
        self.openid_salt = std::sync::Arc::from(salt.into());
        self
    }

    /// `openid`'s tag in this deployment.
    pub fn subject(&self, openid: &crate::domain::OpenId) -> String {
        crate::domain::erasure::subject(&self.openid_salt, openid)
    }

    /// The salted tag of `text` naming a user.
    pub(crate) fn tag(&self, text: &str) -> String {
        crate::domain::erasure::tag(&self.openid_salt, text)
    }

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
}

/// A `ClientRequestToken` for one `TransactWriteItems` call. The SDK retries a call
/// (a timeout, a dropped connection, a 500) with the same input, so with the same token:
/// DynamoDB answers a retry of a transaction that committed with its first answer for
/// 10 minutes instead of running it again. (The SDK would fill in a token itself — the
/// field is an idempotency token in DynamoDB's model — but the protocol depends on it,
/// so it is set here, where it is visible.)
pub(crate) fn request_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
