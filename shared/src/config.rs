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
//! | `CHECKINS_PER_MINUTE` | most new check-ins of one reminder kind per user and minute (1–600); past it 429 | 60 |
//! | `HANDLER_BUDGET_MS` | how long an HTTP handler works before answering 503 with `Retry-After` (1000–900000): under the function's timeout (10 s in `template.yaml`) | 9000 |
//! | `AUDIT_TRAIL` | `true`: every change of a grant, delivery or plan also writes a history entry in its transaction (README, "Audit trail"); `false` saves those writes | `true` |
//! | `PUSH_EVENTS` | `true` where WeChat's message push is configured: grant reports and check-ins leave marks for popup events to confirm their grants (one more read per accepted template), and every settled send looks for a sent event kept pending for it (one more read per send) | `true` when `WECHAT_PUSH_TOKEN` is set, else `false` |
//!
//! Secrets are held in [`Secret`], whose `Debug` prints `***`, so a logged config never
//! leaks them. Deployed, no secret is in the environment: each secret variable `X` is
//! given as `X_ARN`, a Secrets Manager secret read once per cold start by
//! [`Config::load`] (`SESSION_SECRET_ARN` also gives `SESSION_SECRET_PREVIOUS`, its
//! `AWSPREVIOUS` version). Each function is given only the secrets it uses and checks
//! at its cold start that it has them ([`Config::require`]).

use std::fmt;
use std::time::Duration;

use crate::domain::Templates;
use crate::domain::reminder::{ReminderConfigError, ReminderKinds};
use crate::domain::template::TemplateConfigError;

/// A secret string: usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Which build of the mini-program a message opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MiniprogramState {
    Formal,
    Trial,
    Developer,
}

impl MiniprogramState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Formal => "formal",
            Self::Trial => "trial",
            Self::Developer => "developer",
        }
    }
}

/// The WeChat client's settings.
#[derive(Debug, Clone)]
pub struct WechatConfig {
    /// Without a trailing slash.
    pub api_base: String,
    pub appid: String,
    /// The AppSecret; `None` in a function that never calls WeChat.
    pub secret: Option<Secret>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub miniprogram_state: MiniprogramState,
    pub lang: String,
}

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
}

/// Everything configurable, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    pub wechat: WechatConfig,
    pub session: SessionConfig,
    pub templates: Templates,
    pub reminders: ReminderKinds,
    /// How many partitions the due and lease indexes are spread over (DESIGN.md §6).
    pub due_shards: u32,
    pub dispatch: DispatchConfig,
    /// Retention of finished items and the guards against runaway clients.
    pub limits: Limits,
    /// WeChat's message push (`/wechat/callback`), when configured.
    pub push: Option<PushConfig>,
    /// The publishers (`source`s) `notify` accepts; `None`: any.
    pub notify_sources: Option<Vec<String>>,
}

/// How WeChat's message push is set up in the MP console (消息推送配置).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    /// The Token: signs every push.
    pub token: Secret,
    /// The EncodingAESKey (43 characters): safe and compatible mode.
    pub aes_key: Option<Secret>,
    pub mode: PushMode,
    pub format: crate::domain::push_event::Format,
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
    pub fn retry_policy(&self) -> crate::domain::outcome::RetryPolicy {
        crate::domain::outcome::RetryPolicy {
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
const SECRET_VARIABLES: [(&str, &str, &str); 6] = [
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

/// The minimum HS256 key length we accept (RFC 7518 §3.2: at least the hash size).
pub const MIN_SESSION_SECRET_BYTES: usize = 32;

impl Config {
    /// Reads and validates the configuration from the process environment, without
    /// secrets given by ARN (the local stack and the tools).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// A function's cold start: the environment, with every secret given as `<X>_ARN`
    /// read from Secrets Manager (one request each).
    pub async fn load() -> Result<Self, ConfigError> {
        Self::load_from(|name| std::env::var(name).ok()).await
    }

    /// [`Config::load`] through `lookup`.
    pub async fn load_from(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut wanted = Vec::new();
        for (name, arn_name, stage) in SECRET_VARIABLES {
            let Some(arn) = lookup(arn_name).filter(|a| !a.trim().is_empty()) else {
                continue;
            };
            if lookup(name).is_some_and(|v| !v.is_empty()) {
                return Err(ConfigError::Invalid {
                    name,
                    reason: format!("set either {name} or {arn_name}, not both"),
                });
            }
            wanted.push((name, arn, stage));
        }
        let mut read = std::collections::HashMap::new();
        if !wanted.is_empty() {
            let reader =
                crate::secrets::SecretsReader::from_lookup(&lookup).map_err(ConfigError::Secret)?;
            // At once: a cold start waits for the slowest read, not for their sum.
            let values = futures::future::try_join_all(
                wanted
                    .iter()
                    .map(|(name, arn, stage)| reader.read(name, arn, stage)),
            )
            .await
            .map_err(ConfigError::Secret)?;
            for ((name, _, _), value) in wanted.iter().zip(values) {
                if let Some(secret) = value {
                    read.insert(*name, secret.expose().to_string());
                }
            }
        }
        Self::from_lookup(|name| read.get(name).cloned().or_else(|| lookup(name)))
    }

    /// Whether this config holds every secret in `needs` (a function's cold start).
    pub fn require(&self, needs: &[Need]) -> Result<(), ConfigError> {
        for need in needs {
            let (present, name) = match need {
                Need::SessionKey => (self.session.secret.is_some(), "SESSION_SECRET"),
                Need::AppSecret => (self.wechat.secret.is_some(), "WECHAT_SECRET"),
                Need::PushToken => (self.push.is_some(), "WECHAT_PUSH_TOKEN"),
            };
            if !present {
                return Err(ConfigError::Missing(name));
            }
        }
        Ok(())
    }

    /// Reads and validates the configuration through `lookup` (the environment, or a
    /// map in tests and the local stack).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let required = |name: &'static str| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or(ConfigError::Missing(name))
        };
        let millis = |name: &'static str, default: u64| -> Result<Duration, ConfigError> {
            match lookup(name) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| (1..=60_000).contains(ms))
                    .map(Duration::from_millis)
                    .ok_or(ConfigError::Invalid {
                        name,
                        reason: "expected milliseconds between 1 and 60000".into(),
                    }),
            }
        };

        let api_base = lookup("WECHAT_API_BASE")
            .unwrap_or_else(|| "https://api.weixin.qq.com".to_string())
            .trim_end_matches('/')
            .to_string();
        // The AppSecret and access tokens travel to this URL: https, except to this
        // machine (the local stack's stand-in and the tests).
        let loopback = api_base.strip_prefix("http://").is_some_and(|rest| {
            let authority = rest.split('/').next().unwrap_or_default();
            let host = authority
                .rsplit_once(':')
                .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
                .map_or(authority, |(host, _)| host);
            matches!(host, "127.0.0.1" | "localhost" | "[::1]")
        });
        if !(api_base.starts_with("https://") || loopback) {
            return Err(ConfigError::Invalid {
                name: "WECHAT_API_BASE",
                reason: "expected an https:// URL (http:// only to 127.0.0.1, localhost or [::1])"
                    .into(),
            });
        }
        let miniprogram_state = match lookup("MINIPROGRAM_STATE").as_deref() {
            None | Some("formal") => MiniprogramState::Formal,
            Some("trial") => MiniprogramState::Trial,
            Some("developer") => MiniprogramState::Developer,
            Some(_) => {
                return Err(ConfigError::Invalid {
                    name: "MINIPROGRAM_STATE",
                    reason: "expected formal, trial or developer".into(),
                });
            }
        };
        let lang = lookup("WECHAT_LANG").unwrap_or_else(|| "zh_CN".to_string());
        if !["zh_CN", "en_US", "zh_HK", "zh_TW"].contains(&lang.as_str()) {
            return Err(ConfigError::Invalid {
                name: "WECHAT_LANG",
                reason: "expected zh_CN, en_US, zh_HK or zh_TW".into(),
            });
        }
        let session_key = |name: &'static str| -> Result<Option<Secret>, ConfigError> {
            match lookup(name).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(key) if key.len() < MIN_SESSION_SECRET_BYTES => Err(ConfigError::Invalid {
                    name,
                    reason: format!("must be at least {MIN_SESSION_SECRET_BYTES} bytes"),
                }),
                Some(key) => Ok(Some(Secret::new(key))),
            }
        };
        let session_secret = session_key("SESSION_SECRET")?;
        let session_previous = session_key("SESSION_SECRET_PREVIOUS")?;
        let session_pending = session_key("SESSION_SECRET_PENDING")?;
        let ttl = match lookup("SESSION_TTL_SECONDS") {
            None => Duration::from_secs(7200),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|s| (60..=30 * 86_400).contains(s))
                .map(Duration::from_secs)
                .ok_or(ConfigError::Invalid {
                    name: "SESSION_TTL_SECONDS",
                    reason: "expected seconds between 60 and 2592000".into(),
                })?,
        };
        let templates = Templates::from_json(&required("ONEGRANT_TEMPLATES")?)
            .map_err(ConfigError::Templates)?;
        let reminders = ReminderKinds::from_json(&required("ONEGRANT_REMINDERS")?, &templates)
            .map_err(ConfigError::Reminders)?;
        let due_shards = match lookup("DUE_SHARDS") {
            None => 16,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=256).contains(n))
                .ok_or(ConfigError::Invalid {
                    name: "DUE_SHARDS",
                    reason: "expected a whole number from 1 to 256".into(),
                })?,
        };

        let number =
            |name: &'static str, default: u64, range: std::ops::RangeInclusive<u64>| match lookup(
                name,
            ) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().ok().filter(|n| range.contains(n)).ok_or(
                    ConfigError::Invalid {
                        name,
                        reason: format!(
                            "expected a whole number from {} to {}",
                            range.start(),
                            range.end()
                        ),
                    },
                ),
            };
        let configured = u32::try_from(number("DISPATCH_WORKERS", 1, 1..=64)?).unwrap_or(1);
        // Workers past the reserved concurrency would be throttled and their shards
        // left for the next tick: the tick fans out to as many as fit.
        let fit = match lookup("DISPATCHER_RESERVED_CONCURRENCY") {
            Some(_) => u32::try_from(number("DISPATCHER_RESERVED_CONCURRENCY", 1, 1..=10_000)?)
                .unwrap_or(1)
                .saturating_sub(2)
                .max(1),
            None => configured,
        };
        let dispatch = DispatchConfig {
            workers: configured.min(fit),
            workers_configured: (configured > fit).then_some(configured),
            function: lookup("DISPATCH_FUNCTION_NAME")
                .or_else(|| lookup("AWS_LAMBDA_FUNCTION_NAME"))
                .filter(|f| !f.trim().is_empty()),
            lambda_endpoint: lookup("AWS_ENDPOINT_URL_LAMBDA").filter(|e| !e.trim().is_empty()),
            lease: Duration::from_secs(number("DISPATCH_LEASE_SECONDS", 10, 10..=900)?),
            lookahead: Duration::from_secs(number("DISPATCH_LOOKAHEAD_SECONDS", 60, 0..=300)?),
            max_attempts: u32::try_from(number("DISPATCH_MAX_ATTEMPTS", 5, 1..=20)?).unwrap_or(5),
            retry_base: Duration::from_secs(number("DISPATCH_RETRY_BASE_SECONDS", 60, 1..=3600)?),
            concurrency: usize::try_from(number("DISPATCH_CONCURRENCY", 32, 1..=256)?)
                .unwrap_or(32),
        };

        let days_from = |name: &'static str, default: chrono::Duration, least: u64| {
            let default = u64::try_from(default.num_days()).unwrap_or(least);
            number(name, default, least..=3650)
                .map(|d| chrono::Duration::days(i64::try_from(d).unwrap_or(1)))
        };
        let days = |name: &'static str, default: chrono::Duration| days_from(name, default, 1);
        let defaults = Limits::default();
        let kept = defaults.retention;
        let limits = Limits {
            retention: Retention {
                grants: days("RETENTION_GRANTS_DAYS", kept.grants)?,
                deliveries: days("RETENTION_DELIVERIES_DAYS", kept.deliveries)?,
                outbox: days("RETENTION_OUTBOX_DAYS", kept.outbox)?,
                // At least a week: longer than a push's whole retry schedule (at most
                // 20 attempts 6 h apart), so a read note outlives its pending push.
                read_notes: days_from("RETENTION_READ_NOTES_DAYS", kept.read_notes, 7)?,
                actions: days("RETENTION_ACTIONS_DAYS", kept.actions)?,
                events: days("RETENTION_EVENTS_DAYS", kept.events)?,
            },
            max_open_grants: u32::try_from(number(
                "MAX_OPEN_GRANTS",
                u64::from(defaults.max_open_grants),
                1..=1000,
            )?)
            .unwrap_or(defaults.max_open_grants),
            reports_per_minute: u32::try_from(number(
                "REPORTS_PER_MINUTE",
                u64::from(defaults.reports_per_minute),
                1..=600,
            )?)
            .unwrap_or(defaults.reports_per_minute),
            checkins_per_minute: u32::try_from(number(
                "CHECKINS_PER_MINUTE",
                u64::from(defaults.checkins_per_minute),
                1..=600,
            )?)
            .unwrap_or(defaults.checkins_per_minute),
            write_budget: Duration::from_millis(number(
                "WRITE_BUDGET_MS",
                u64::try_from(defaults.write_budget.as_millis()).unwrap_or(4000),
                500..=60_000,
            )?),
            handler_budget: Duration::from_millis(number(
                "HANDLER_BUDGET_MS",
                u64::try_from(defaults.handler_budget.as_millis()).unwrap_or(9000),
                1000..=900_000,
            )?),
            audit: match lookup("AUDIT_TRAIL").as_deref() {
                None | Some("true") => true,
                Some("false") => false,
                Some(_) => {
                    return Err(ConfigError::Invalid {
                        name: "AUDIT_TRAIL",
                        reason: "expected true or false".into(),
                    });
                }
            },
            push_events: match lookup("PUSH_EVENTS").as_deref() {
                None => lookup("WECHAT_PUSH_TOKEN").is_some_and(|t| !t.trim().is_empty()),
                Some("true") => true,
                Some("false") => false,
                Some(_) => {
                    return Err(ConfigError::Invalid {
                        name: "PUSH_EVENTS",
                        reason: "expected true or false".into(),
                    });
                }
            },
        };

        let notify_sources = match lookup("NOTIFY_SOURCES").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(list) => {
                let sources: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                if !sources
                    .iter()
                    .all(|s| crate::domain::inbox::is_publisher(s))
                {
                    return Err(ConfigError::Invalid {
                        name: "NOTIFY_SOURCES",
                        reason: "expected comma-separated sources of printable ASCII without '#'"
                            .into(),
                    });
                }
                Some(sources)
            }
        };
        let push = match lookup("WECHAT_PUSH_TOKEN").filter(|t| !t.trim().is_empty()) {
            None => None,
            Some(token) => {
                let mode = match lookup("WECHAT_PUSH_MODE").as_deref() {
                    None | Some("safe") => PushMode::Safe,
                    Some("compatible") => PushMode::Compatible,
                    Some("plain") => PushMode::Plain,
                    Some(_) => {
                        return Err(ConfigError::Invalid {
                            name: "WECHAT_PUSH_MODE",
                            reason: "expected safe, compatible or plain".into(),
                        });
                    }
                };
                let format = match lookup("WECHAT_PUSH_FORMAT").as_deref() {
                    None | Some("xml") => crate::domain::push_event::Format::Xml,
                    Some("json") => crate::domain::push_event::Format::Json,
                    Some(_) => {
                        return Err(ConfigError::Invalid {
                            name: "WECHAT_PUSH_FORMAT",
                            reason: "expected xml or json".into(),
                        });
                    }
                };
                let aes_key = lookup("WECHAT_PUSH_AES_KEY").filter(|k| !k.trim().is_empty());
                let usable = |k: &String| {
                    crate::wechat::push::PushCrypto::new(Secret::new(""), k, "").is_ok()
                };
                if mode != PushMode::Plain && !aes_key.as_ref().is_some_and(usable) {
                    return Err(ConfigError::Invalid {
                        name: "WECHAT_PUSH_AES_KEY",
                        reason: "safe and compatible mode need the 43-character EncodingAESKey"
                            .into(),
                    });
                }
                Some(PushConfig {
                    token: Secret::new(token),
                    aes_key: aes_key.map(Secret::new),
                    mode,
                    format,
                })
            }
        };

        Ok(Self {
            limits,
            table_name: required("TABLE_NAME")?,
            wechat: WechatConfig {
                api_base,
                appid: required("WECHAT_APPID")?,
                secret: lookup("WECHAT_SECRET")
                    .filter(|v| !v.trim().is_empty())
                    .map(Secret::new),
                connect_timeout: millis("WECHAT_CONNECT_TIMEOUT_MS", 1000)?,
                timeout: millis("WECHAT_TIMEOUT_MS", 3000)?,
                miniprogram_state,
                lang,
            },
            session: SessionConfig {
                secret: session_secret,
                previous: session_previous,
                pending: session_pending,
                ttl,
            },
            templates,
            reminders,
            due_shards,
            dispatch,
            push,
            notify_sources,
        })
    }
}

/// How long finished items are kept, and the guards against a runaway client.
/// The defaults are what the README documents.
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
    /// Whether WeChat's message push is configured: reported grants are paired with
    /// popup events ([`store::taps`](crate::store)) and settled sends look for sent
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
            push_events: false,
            // The last attempt may start just before the budget ends and take one SDK
            // call (its attempts and backoff): 4 s leaves that room inside 10 s.
            write_budget: Duration::from_secs(4),
            handler_budget: Duration::from_secs(9),
            audit: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env() -> HashMap<&'static str, String> {
        HashMap::from([
            ("TABLE_NAME", "t".to_string()),
            ("WECHAT_APPID", "wx1".to_string()),
            ("WECHAT_SECRET", "very-secret-value".to_string()),
            ("SESSION_SECRET", "s".repeat(32)),
            (
                "ONEGRANT_TEMPLATES",
                r#"[{"id":"T","title":"t","keywords":[{"key":"thing1"}]}]"#.to_string(),
            ),
            (
                "ONEGRANT_REMINDERS",
                r#"[{"kind":"water","template_id":"T","content":{"thing1":"drink"}}]"#.to_string(),
            ),
        ])
    }

    #[test]
    fn a_complete_environment_parses_with_defaults() {
        let e = env();
        let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
        assert_eq!(c.wechat.api_base, "https://api.weixin.qq.com");
        assert_eq!(c.wechat.timeout, Duration::from_millis(3000));
        assert_eq!(c.session.ttl, Duration::from_secs(7200));
        assert_eq!(c.wechat.miniprogram_state, MiniprogramState::Formal);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.limits.retention.grants, chrono::Duration::days(400));
    }

    #[test]
    fn the_message_push_is_optional_and_checked_when_set() {
        let e = env();
        let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
        assert_eq!(c.push, None);
        let with = |pairs: &[(&'static str, &str)]| {
            let mut e = env();
            e.insert("WECHAT_PUSH_TOKEN", "token".into());
            for (k, v) in pairs {
                e.insert(k, v.to_string());
            }
            Config::from_lookup(|k| e.get(k).cloned())
        };
        let safe = with(&[("WECHAT_PUSH_AES_KEY", &"A".repeat(43))]).expect("safe");
        let push = safe.push.expect("push");
        assert_eq!(push.mode, PushMode::Safe);
        assert_eq!(push.format, crate::domain::push_event::Format::Xml);
        let plain = with(&[
            ("WECHAT_PUSH_MODE", "plain"),
            ("WECHAT_PUSH_FORMAT", "json"),
        ])
        .expect("plain needs no key");
        assert_eq!(plain.push.map(|p| p.mode), Some(PushMode::Plain));
        for (pairs, name) in [
            (vec![], "WECHAT_PUSH_AES_KEY"),
            (
                vec![("WECHAT_PUSH_AES_KEY", "short")],
                "WECHAT_PUSH_AES_KEY",
            ),
            (
                vec![(
                    "WECHAT_PUSH_AES_KEY",
                    "*******************************************",
                )],
                "WECHAT_PUSH_AES_KEY",
            ),
            (vec![("WECHAT_PUSH_MODE", "loud")], "WECHAT_PUSH_MODE"),
            (
                vec![
                    ("WECHAT_PUSH_MODE", "plain"),
                    ("WECHAT_PUSH_FORMAT", "yaml"),
                ],
                "WECHAT_PUSH_FORMAT",
            ),
        ] {
            let err = with(&pairs).expect_err("must fail");
            assert!(err.to_string().contains(name), "{pairs:?}: {err}");
        }
        let printed = format!("{:?}", with(&[("WECHAT_PUSH_AES_KEY", &"Z".repeat(43))]));
        assert!(!printed.contains("ZZZZ") && !printed.contains("token\""));
    }

    #[test]
    fn retention_and_guards_are_configurable() {
        let mut e = env();
        e.insert("RETENTION_READ_NOTES_DAYS", "7".into());
        e.insert("RETENTION_OUTBOX_DAYS", "3".into());
        e.insert("MAX_OPEN_GRANTS", "5".into());
        e.insert("REPORTS_PER_MINUTE", "2".into());
        let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
        assert_eq!(c.limits.retention.read_notes, chrono::Duration::days(7));
        assert_eq!(c.limits.retention.outbox, chrono::Duration::days(3));
        assert_eq!(c.limits.retention.deliveries, chrono::Duration::days(90));
        assert_eq!(c.limits.max_open_grants, 5);
        assert_eq!(c.limits.reports_per_minute, 2);
    }

    #[test]
    fn workers_never_outnumber_what_the_reserved_concurrency_leaves_room_for() {
        let with = |workers: &str, reserved: Option<&str>| {
            let mut e = env();
            e.insert("DISPATCH_WORKERS", workers.into());
            if let Some(reserved) = reserved {
                e.insert("DISPATCHER_RESERVED_CONCURRENCY", reserved.into());
            }
            let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
            (c.dispatch.workers, c.dispatch.workers_configured)
        };
        assert_eq!(with("8", None), (8, None));
        assert_eq!(with("8", Some("10")), (8, None));
        assert_eq!(with("8", Some("9")), (7, Some(8)));
        assert_eq!(with("4", Some("3")), (1, Some(4)));
        assert_eq!(with("1", Some("1")), (1, None));
        let mut e = env();
        e.insert("DISPATCHER_RESERVED_CONCURRENCY", "none".into());
        assert!(Config::from_lookup(|k| e.get(k).cloned()).is_err());
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        let e = env();
        let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
        let printed = format!("{c:?}");
        assert!(!printed.contains("very-secret-value"));
        assert!(!printed.contains(&"s".repeat(32)));
    }

    #[test]
    fn wechat_is_reached_over_https_and_plain_http_only_on_this_machine() {
        for (base, ok) in [
            ("https://api.weixin.qq.com", true),
            ("http://127.0.0.1:3002", true),
            ("http://localhost:3002/", true),
            ("http://[::1]:8080", true),
            ("http://api.weixin.qq.com", false),
            ("http://localhost.evil.com", false),
        ] {
            let mut e = env();
            e.insert("WECHAT_API_BASE", base.to_string());
            assert_eq!(
                Config::from_lookup(|k| e.get(k).cloned()).is_ok(),
                ok,
                "{base}"
            );
        }
    }

    #[test]
    fn each_bad_variable_is_named() {
        let cases: Vec<(&str, Option<&str>, &str)> = vec![
            (
                "DISPATCH_LEASE_SECONDS",
                Some("1"),
                "DISPATCH_LEASE_SECONDS",
            ),
            ("ONEGRANT_REMINDERS", None, "ONEGRANT_REMINDERS"),
            (
                "ONEGRANT_REMINDERS",
                Some(r#"[{"kind":"tea","template_id":"T"}]"#),
                "ONEGRANT_REMINDERS",
            ),
            ("DUE_SHARDS", Some("0"), "DUE_SHARDS"),
            ("TABLE_NAME", None, "TABLE_NAME"),
            ("SESSION_SECRET", Some("short"), "SESSION_SECRET"),
            ("MINIPROGRAM_STATE", Some("prod"), "MINIPROGRAM_STATE"),
            ("WECHAT_TIMEOUT_MS", Some("0"), "WECHAT_TIMEOUT_MS"),
            ("ONEGRANT_TEMPLATES", Some("{"), "ONEGRANT_TEMPLATES"),
            ("RETENTION_GRANTS_DAYS", Some("0"), "RETENTION_GRANTS_DAYS"),
            (
                "RETENTION_READ_NOTES_DAYS",
                Some("6"),
                "RETENTION_READ_NOTES_DAYS",
            ),
            (
                "RETENTION_EVENTS_DAYS",
                Some("ten"),
                "RETENTION_EVENTS_DAYS",
            ),
            ("MAX_OPEN_GRANTS", Some("1001"), "MAX_OPEN_GRANTS"),
            ("REPORTS_PER_MINUTE", Some("0"), "REPORTS_PER_MINUTE"),
            (
                "WECHAT_API_BASE",
                Some("http://api.weixin.qq.com"),
                "WECHAT_API_BASE",
            ),
            (
                "WECHAT_API_BASE",
                Some("http://127.0.0.1.evil.com"),
                "WECHAT_API_BASE",
            ),
            (
                "WECHAT_API_BASE",
                Some("http://localhost@evil.com"),
                "WECHAT_API_BASE",
            ),
            (
                "WECHAT_API_BASE",
                Some("ftp://127.0.0.1"),
                "WECHAT_API_BASE",
            ),
            ("HANDLER_BUDGET_MS", Some("500"), "HANDLER_BUDGET_MS"),
            ("NOTIFY_SOURCES", Some("ok,bad#source"), "NOTIFY_SOURCES"),
        ];
        for (name, value, want) in cases {
            let mut e = env();
            match value {
                Some(v) => e.insert(name, v.to_string()),
                None => e.remove(name),
            };
            let err = Config::from_lookup(|k| e.get(k).cloned()).expect_err("must fail");
            assert!(err.to_string().contains(want), "{name}: {err}");
        }
    }
}
