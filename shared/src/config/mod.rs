//! Typed configuration, read once per cold start from the environment.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TABLE_NAME` | the DynamoDB table | required |
//! | `WECHAT_API_BASE` | WeChat server API base URL | `https://api.weixin.qq.com` |
//! | `WECHAT_APPID` | the mini-program's AppID | required |
//! | `WECHAT_SECRET` | the AppSecret, where WeChat is called (session, dispatcher) | required there |
//! | `WECHAT_CONNECT_TIMEOUT_MS`, `WECHAT_TIMEOUT_MS` | client timeouts | 1000, 3000 |
//! | `MINIPROGRAM_STATE` | `formal`, `trial` or `developer` | `formal` |
//! | `WECHAT_LANG` | `zh_CN`, `en_US`, `zh_HK`, `zh_TW` | `zh_CN` |
//! | `SESSION_SECRET` | HS256 key for session tokens, at least 32 bytes, where tokens are issued or checked | required there |
//! | `SESSION_SECRET_PREVIOUS` | the key before the last rotation: tokens it signed are still accepted | none |
//! | `SESSION_TTL_SECONDS` | session token lifetime | 7200 |
//! | `ONEGRANT_TEMPLATES` | JSON array of templates (see [`Templates::from_json`]) | required |
//! | `ONEGRANT_REMINDERS` | JSON array of reminder kinds (see [`ReminderKinds::from_json`]); `water` required | required |
//! | `DUE_SHARDS` | shards of the due index and the lease index (1–256) | 16 |
//! | `DISPATCH_LEASE_SECONDS` | the least a claim is held before the sweep may recover it (10–900); a claim is always held for its send's window (4 × (connect + answer timeout)) plus 5 s for the finalize, when that is longer | 10 |
//! | `DISPATCH_LOOKAHEAD_SECONDS` | how far ahead a tick claims (waiting until each is due) (0–300) | 60 |
//! | `DISPATCH_MAX_ATTEMPTS` | retryable failures before a plan pauses (1–20) | 5 |
//! | `DISPATCH_RETRY_BASE_SECONDS` | first retry delay, doubled per attempt (1–3600) | 60 |
//! | `DISPATCH_CONCURRENCY` | sends in flight per invocation (1–256) | 32 |
//! | `WRITE_BUDGET_MS` | how long a contended or throttled write keeps trying before 503 (500–60000); with the last SDK call (5 s at most) it stays inside the API functions' 10 s | 4000 |
//! | `NOTIFY_SOURCES` | comma-separated EventBridge `source`s `notify` accepts (the stack sets its `NotifyPublishers`' sources); unset: any | any |
//! | `PUBLISHER_LANES` | `source=account[;account…]`, comma-separated: the accounts that may put each source's events on the bus (the stack's `PublisherLanes`); a source with no lane is the stack's own account's alone; unset: any account (the local stack) | any |
//! | `STACK_ACCOUNT` | the stack's own AWS account id (the template sets it), for `PUBLISHER_LANES` | none |
//! | `ONEGRANT_PUBLISHERS` | JSON list of `{"source", "key", "previous_key"?, "webhook"?}`: who may call the publisher API, with which keys (see `domain::publisher`); deployed, a secret (`ONEGRANT_PUBLISHERS_ARN`) | none: the publisher API refuses all |
//! | `OUTCOME_BUS` | the EventBridge bus each outcome is also put on (`detail-type: onegrant.push.outcome`, source `onegrant`; the stack sets its own bus); `AWS_ENDPOINT_URL_EVENTS` an emulator's endpoint | none: outcomes go to webhooks only |
//! | `PUBLISHER_REQUESTS_PER_MINUTE` | most publisher API calls of one publisher in a minute (1–60000: one counter item, under a partition's 1,000 writes a second); past it 429 with `Retry-After` | 6000 |
//! | `CHECKINS_PER_MINUTE` | most new check-ins of one reminder kind per user and minute (1–600); past it 429 | 60 |
//! | `CHANGES_PER_MINUTE` | most changes one user makes in a minute through the other write routes — plan settings, preferences, marking notifications read (a read-all call counts once) — (1–600); past it 429 with `Retry-After`, checked on the read before any write; a request that changes nothing neither counts nor writes | 60 |
//! | `READS_PER_MINUTE` | most read calls one user makes in a minute — listing notifications, the unread count, preferences, grants, a plan — (0–6000; 0: no limit); past it 429 with `Retry-After`, nothing read; each call is counted by one small write | 120 |
//! | `PUSHES_PER_DAY` | most messages of one template one user is sent in one of their days (the zone of their quiet hours, else Asia/Shanghai), reminders and pushes alike (0–1000; 0: no cap); past it a push waits for the next day (inbox-only, `capped`, if it expires first) and a reminder is due again on the next day's first waking moment, no grant spent | 0 |
//! | `PUSHES_PENDING_MAX` | most open pushes one user has at once from one publisher — pending, waiting for a grant, scheduled or in flight — (1–10000); past it an event's push is recorded `rejected` (`too_many_pending`), its notification stored all the same | 1000 |
//! | `HANDLER_BUDGET_MS` | how long an HTTP handler works before answering 503 with `Retry-After` (1000–900000): under the function's timeout (10 s in `template.yaml`) | 9000 |
//! | `AUDIT_TRAIL` | `true`: every change of a grant, delivery or plan also writes a history entry in its transaction (docs/operations.md, "Audit trail"); `false` saves those writes | `true` |
//! | `PUSH_EVENTS` | `true` where WeChat's message push is configured: grant reports and check-ins leave marks for popup events to confirm their grants (one more read per accepted template), and every settled send looks for a sent event kept pending for it (one more read per send) | `true` when `WECHAT_PUSH_TOKEN` is set, else `false` |
//!
//! Secrets are held in [`Secret`], whose `Debug` prints `***`, so a logged config never
//! leaks them. Deployed, no secret is in the environment: each secret variable `X` is
//! given as `X_ARN`, a Secrets Manager secret read once per cold start by
//! [`Config::load`] (`SESSION_SECRET_ARN` also gives `SESSION_SECRET_PREVIOUS`, its
//! `AWSPREVIOUS` version). Each function is given only the secrets it uses and checks
//! at its cold start that it has them ([`Config::require`]).

use std::time::Duration;

use crate::domain::Templates;
use crate::domain::reminders::{ReminderConfigError, ReminderKinds};
use crate::domain::template::TemplateConfigError;
use crate::secrets::Secret;

mod limits;
mod load;

pub use limits::{Limits, Retention};
// The WeChat client's settings and the session key's minimum live with what uses them
// (both below this module): named here too, as every other setting is.
pub use crate::secrets::MIN_SESSION_SECRET_BYTES;
pub use crate::wechat::{MiniprogramState, WechatConfig};

/// Session token settings.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Signs new tokens and checks them; `None` in a function that has no sessions.
    pub secret: Option<Secret>,
    /// The key before the last rotation: its tokens are still accepted until they
    /// expire, so a rotation signs nobody out.
    pub previous: Option<Secret>,
    /// The key a rotation is about to make current (`AWSPENDING`): its tokens are
    /// accepted already, so no function is left behind when signing switches to it.
    pub pending: Option<Secret>,
    pub ttl: Duration,
    /// Where the keys were read from (`SESSION_SECRET_ARN`), so a container reads them
    /// again after a rotation; `None` when given directly (nothing to re-read).
    pub source: Option<SessionKeySource>,
}

/// The session key's secret, to read again after a rotation.
#[derive(Debug, Clone)]
pub struct SessionKeySource {
    pub arn: String,
    /// `SESSION_SECRET_PENDING_VERSION`: the only pending version trusted.
    pub pending_version: Option<String>,
    pub reader: std::sync::Arc<crate::secrets::SecretsReader>,
}

/// Everything configurable, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    pub wechat: WechatConfig,
    pub session: SessionConfig,
    pub templates: Templates,
    pub reminders: ReminderKinds,
    /// How many partitions the due and lease indexes are spread over (docs/design.md §6).
    pub due_shards: u32,
    pub dispatch: DispatchConfig,
    /// Retention of finished items and the guards against runaway clients.
    pub limits: Limits,
    /// WeChat's message push (`/wechat/callback`), when configured.
    pub push: Option<PushConfig>,
    /// The publishers (`source`s) `notify` accepts; `None`: any.
    pub notify_sources: Option<Vec<String>>,
    /// Which accounts may publish as which source on the bus (`PUBLISHER_LANES`);
    /// `None`: any (the local stack).
    pub lanes: Option<crate::domain::publisher::Lanes>,
    /// The stack's own account (`STACK_ACCOUNT`): a source with no lane is its alone.
    pub stack_account: String,
    /// Who may call the publisher API (`ONEGRANT_PUBLISHERS`); empty: nobody.
    pub publishers: crate::domain::publisher::Publishers,
    /// The EventBridge bus outcomes are told on (`OUTCOME_BUS`, the stack's own);
    /// `None`: not told on a bus (the local stack unless set).
    pub outcome_bus: Option<String>,
    /// EventBridge's endpoint when not the region's (`AWS_ENDPOINT_URL_EVENTS`: an
    /// emulator).
    pub events_endpoint: Option<String>,
    /// The edge's WAF IP set the `wechat-ips` function keeps WeChat's list in
    /// (`WECHAT_IP_SET`); `None`: only the table's copy (the function's check).
    pub wechat_ip_set: Option<String>,
    /// AWS WAF's endpoint when not the IP set's region's (`AWS_ENDPOINT_URL_WAFV2`: an
    /// emulator).
    pub wafv2_endpoint: Option<String>,
    /// The value the stack's CloudFront distribution adds to every request
    /// (`ORIGIN_SECRET`, the edge protection): a request without it is refused.
    /// `None`: the API is served directly.
    pub origin: Option<Secret>,
    /// `ORIGIN_CHECK`: `enforce` (the default) refuses a request without the origin
    /// secret; `count` only counts it (while clients move to the edge's address).
    pub origin_enforced: bool,
    /// `OPENID_SALT`: this deployment's salt for openids' tags (an erasure's
    /// tombstone), at least 16 characters; [`DEFAULT_OPENID_SALT`] when unset (the
    /// local stack; the deployed stack always sets one).
    pub openid_salt: String,
}

/// The salt of openids' tags where none is configured (the local stack and tests).
pub const DEFAULT_OPENID_SALT: &str = "onegrant-local-openid-salt";

/// How WeChat's message push is set up in the MP console (消息推送配置).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    /// The mini-program's original id (`gh_…`, `WECHAT_ORIGINAL_ID`): a push whose
    /// `ToUserName` is another is refused, in every mode.
    pub original_id: String,
    /// The Token: signs every push.
    pub token: Secret,
    /// The EncodingAESKey (43 characters): safe and compatible mode.
    pub aes_key: Option<Secret>,
    pub mode: PushMode,
    pub format: crate::domain::callback::Format,
    /// `WECHAT_IPS_CHECK`: `on` (the default) refuses a push from an address not in
    /// WeChat's list (as the `wechat-ips` function last read it; none read yet: no
    /// refusal), unless the edge keeps the door (`ORIGIN_SECRET`: its web ACL's IP set
    /// does, before the request reaches API Gateway); `off` refuses none.
    pub wechat_ips_check: bool,
}

/// The console's 消息加密方式.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMode {
    /// 明文: plain bodies, `signature` only.
    Plain,
    /// 兼容: either; a body with `Encrypt` is checked as in safe mode.
    Compatible,
    /// 安全: encrypted bodies only, checked by `msg_signature`.
    Safe,
}

/// The dispatcher's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchConfig {
    /// Workers a scheduled tick fans its shards out to (1: the tick does it all); never
    /// more than the dispatcher's reserved concurrency leaves room for (that less 2: the
    /// tick itself and an overlapping one).
    pub workers: u32,
    /// `DISPATCH_WORKERS` as configured, when the reserved concurrency
    /// (`DISPATCHER_RESERVED_CONCURRENCY`) made `workers` fewer: a misconfiguration
    /// every tick logs.
    pub workers_configured: Option<u32>,
    /// The function a tick invokes for its workers: itself (`AWS_LAMBDA_FUNCTION_NAME`,
    /// or `DISPATCH_FUNCTION_NAME` locally).
    pub function: Option<String>,
    /// The Invoke API's endpoint when not Lambda's own (`AWS_ENDPOINT_URL_LAMBDA`).
    pub lambda_endpoint: Option<String>,
    pub lease: Duration,
    pub lookahead: Duration,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub concurrency: usize,
}

impl DispatchConfig {
    /// How failed sends are retried.
    pub fn retry_policy(&self) -> crate::domain::settle::RetryPolicy {
        crate::domain::settle::RetryPolicy {
            max_attempts: self.max_attempts,
            retry_base: self.retry_base,
        }
    }
}

/// Why the configuration cannot be used. Names the variable, never its value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("{name} is invalid: {reason}")]
    Invalid { name: &'static str, reason: String },
    #[error("ONEGRANT_TEMPLATES is invalid")]
    Templates(#[source] TemplateConfigError),
    #[error("ONEGRANT_REMINDERS is invalid")]
    Reminders(#[source] ReminderConfigError),
    #[error("a secret could not be read")]
    Secret(#[source] crate::secrets::SecretsError),
}

/// A secret a function uses: its cold start fails without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `SESSION_SECRET`: the function issues or checks session tokens.
    SessionKey,
    /// `WECHAT_SECRET`: the function calls WeChat's server API.
    AppSecret,
    /// `WECHAT_PUSH_TOKEN`: the function receives WeChat's message push.
    PushToken,
}

/// The secret variables that may be given by ARN: (variable, the variable holding the
/// secret's ARN, the Secrets Manager stage read for it).
const SECRET_VARIABLES: [(&str, &str, &str); 8] = [
    (
        "ONEGRANT_PUBLISHERS",
        "ONEGRANT_PUBLISHERS_ARN",
        "AWSCURRENT",
    ),
    ("ORIGIN_SECRET", "ORIGIN_SECRET_ARN", "AWSCURRENT"),
    ("SESSION_SECRET", "SESSION_SECRET_ARN", "AWSCURRENT"),
    ("SESSION_SECRET_PENDING", "SESSION_SECRET_ARN", "AWSPENDING"),
    (
        "SESSION_SECRET_PREVIOUS",
        "SESSION_SECRET_ARN",
        "AWSPREVIOUS",
    ),
    ("WECHAT_SECRET", "WECHAT_SECRET_ARN", "AWSCURRENT"),
    ("WECHAT_PUSH_TOKEN", "WECHAT_PUSH_TOKEN_ARN", "AWSCURRENT"),
    (
        "WECHAT_PUSH_AES_KEY",
        "WECHAT_PUSH_AES_KEY_ARN",
        "AWSCURRENT",
    ),
];

#[cfg(test)]
mod tests;
