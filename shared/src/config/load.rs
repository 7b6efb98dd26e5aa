//! Reading and validating the configuration: the environment, and secrets by ARN.

use super::*;

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
            // The key a rotation stages is trusted only while that rotation is named
            // (its version id): an AWSPENDING someone else staged is not read.
            let version = if name == "SESSION_SECRET_PENDING" {
                match lookup("SESSION_SECRET_PENDING_VERSION").filter(|v| !v.trim().is_empty()) {
                    Some(version) => Some(version),
                    None => continue,
                }
            } else {
                None
            };
            wanted.push((name, arn, stage, version));
        }
        let mut read = std::collections::HashMap::new();
        if !wanted.is_empty() {
            let reader =
                crate::secrets::SecretsReader::from_lookup(&lookup).map_err(ConfigError::Secret)?;
            // At once: a cold start waits for the slowest read, not for their sum.
            let values =
                futures::future::try_join_all(wanted.iter().map(|(name, arn, stage, version)| {
                    reader.read(name, arn, stage, version.as_deref())
                }))
                .await
                .map_err(ConfigError::Secret)?;
            for ((name, _, _, _), value) in wanted.iter().zip(values) {
                if let Some(secret) = value {
                    read.insert(*name, secret.expose().to_string());
                }
            }
            // The session keys are read again after a rotation (crate::session).
            let session_source = wanted
                .iter()
                .find(|(name, ..)| *name == "SESSION_SECRET")
                .map(|(_, arn, ..)| arn.clone());
            let reader = std::sync::Arc::new(reader);
            let pending_version =
                lookup("SESSION_SECRET_PENDING_VERSION").filter(|v| !v.trim().is_empty());
            let mut config =
                Self::from_lookup(|name| read.get(name).cloned().or_else(|| lookup(name)))?;
            // An origin secret given by ARN but empty would turn the check off.
            if config.origin.is_none() && wanted.iter().any(|(name, ..)| *name == "ORIGIN_SECRET") {
                return Err(ConfigError::Invalid {
                    name: "ORIGIN_SECRET",
                    reason: "the secret ORIGIN_SECRET_ARN names is empty".into(),
                });
            }
            config.session.source = session_source.map(|arn| super::SessionKeySource {
                arn,
                pending_version,
                reader,
            });
            return Ok(config);
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
        let origin = session_key("ORIGIN_SECRET")?;
        let openid_salt = match lookup("OPENID_SALT").filter(|v| !v.trim().is_empty()) {
            None => DEFAULT_OPENID_SALT.to_string(),
            Some(salt) if salt.trim().len() >= 16 => salt,
            Some(_) => {
                return Err(ConfigError::Invalid {
                    name: "OPENID_SALT",
                    reason: "at least 16 characters".into(),
                });
            }
        };
        let origin_enforced = match lookup("ORIGIN_CHECK").as_deref() {
            None | Some("" | "enforce") => true,
            Some("count") => false,
            Some(_) => {
                return Err(ConfigError::Invalid {
                    name: "ORIGIN_CHECK",
                    reason: "expected enforce or count".into(),
                });
            }
        };
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

        // The retry policy's defaults are the domain's (one place for the numbers).
        let retry = crate::domain::settle::RetryPolicy::default();
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
        // left for the next tick: the tick fans out to as many as fit. 0: nothing is
        // reserved (the account's unreserved pool serves the dispatcher).
        let fit = match lookup("DISPATCHER_RESERVED_CONCURRENCY") {
            Some(_) => match number("DISPATCHER_RESERVED_CONCURRENCY", 1, 0..=10_000)? {
                0 => configured,
                reserved => u32::try_from(reserved)
                    .unwrap_or(1)
                    .saturating_sub(2)
                    .max(1),
            },
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
            max_attempts: u32::try_from(number(
                "DISPATCH_MAX_ATTEMPTS",
                u64::from(retry.max_attempts),
                1..=20,
            )?)
            .unwrap_or(retry.max_attempts),
            retry_base: Duration::from_secs(number(
                "DISPATCH_RETRY_BASE_SECONDS",
                retry.retry_base.as_secs(),
                1..=3600,
            )?),
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
                // 20 attempts 6 h apart). Quiet hours can hold a pending push longer
                // than that after its note was read; every write of a push's status to
                // its note then drops the note write and lands the rest, so a removed
                // note never blocks the push's claim, cancel or replacement.
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
            changes_per_minute: u32::try_from(number(
                "CHANGES_PER_MINUTE",
                u64::from(defaults.changes_per_minute),
                1..=600,
            )?)
            .unwrap_or(defaults.changes_per_minute),
            reads_per_minute: u32::try_from(number(
                "READS_PER_MINUTE",
                u64::from(defaults.reads_per_minute),
                0..=6000,
            )?)
            .unwrap_or(defaults.reads_per_minute),
            publisher_requests_per_minute: u32::try_from(number(
                "PUBLISHER_REQUESTS_PER_MINUTE",
                u64::from(defaults.publisher_requests_per_minute),
                1..=60_000,
            )?)
            .unwrap_or(defaults.publisher_requests_per_minute),
            pushes_per_day: match number("PUSHES_PER_DAY", 0, 0..=1000)? {
                0 => None,
                cap => u32::try_from(cap).ok(),
            },
            pushes_pending_max: u32::try_from(number(
                "PUSHES_PENDING_MAX",
                u64::from(defaults.pushes_pending_max),
                1..=10_000,
            )?)
            .unwrap_or(defaults.pushes_pending_max),
            inactive_user_days: u32::try_from(number(
                "INACTIVE_USER_DAYS",
                u64::from(defaults.inactive_user_days),
                0..=3650,
            )?)
            .unwrap_or(defaults.inactive_user_days),
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
        let lanes = lookup("PUBLISHER_LANES")
            .map(|list| crate::domain::publisher::Lanes::parse(&list))
            .transpose()
            .map_err(|reason| ConfigError::Invalid {
                name: "PUBLISHER_LANES",
                reason,
            })?;
        let publishers = lookup("ONEGRANT_PUBLISHERS")
            .filter(|v| !v.trim().is_empty())
            .map(|json| crate::domain::publisher::Publishers::parse(&json))
            .transpose()
            .map_err(|reason| ConfigError::Invalid {
                name: "ONEGRANT_PUBLISHERS",
                reason,
            })?
            .unwrap_or_default();
        let push = match lookup("WECHAT_PUSH_TOKEN").filter(|t| !t.trim().is_empty()) {
            None => None,
            Some(token) => {
                let mode = match lookup("WECHAT_PUSH_MODE").as_deref() {
                    None | Some("safe") => PushMode::Safe,
                    Some("compatible") => PushMode::Compatible,
                    Some("plain") => {
                        // Plain mode's `signature` covers no body: anyone who sees
                        // one signed push can send any event under its query.
                        if lookup("WECHAT_PUSH_INSECURE_PLAIN").as_deref() != Some("true") {
                            return Err(ConfigError::Invalid {
                                name: "WECHAT_PUSH_MODE",
                                reason: "plain mode signs no body, so one captured push \
                                         lets anyone forge events; use safe mode, or set \
                                         WECHAT_PUSH_INSECURE_PLAIN=true to accept that"
                                    .into(),
                            });
                        }
                        PushMode::Plain
                    }
                    Some(_) => {
                        return Err(ConfigError::Invalid {
                            name: "WECHAT_PUSH_MODE",
                            reason: "expected safe, compatible or plain".into(),
                        });
                    }
                };
                let format = match lookup("WECHAT_PUSH_FORMAT").as_deref() {
                    None | Some("xml") => crate::domain::callback::Format::Xml,
                    Some("json") => crate::domain::callback::Format::Json,
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
                // Every push names the account it is for: one for another is refused.
                let original_id = lookup("WECHAT_ORIGINAL_ID")
                    .map(|v| v.trim().to_string())
                    .filter(|v| crate::domain::callback::is_original_id(v))
                    .ok_or(ConfigError::Invalid {
                        name: "WECHAT_ORIGINAL_ID",
                        reason: "needed with WECHAT_PUSH_TOKEN: the mini-program's original \
                                 id (gh_ and letters or digits), which every push names as \
                                 ToUserName"
                            .into(),
                    })?;
                let wechat_ips_check = match lookup("WECHAT_IPS_CHECK").as_deref() {
                    None | Some("" | "on") => true,
                    Some("off") => false,
                    Some(_) => {
                        return Err(ConfigError::Invalid {
                            name: "WECHAT_IPS_CHECK",
                            reason: "expected on or off".into(),
                        });
                    }
                };
                Some(PushConfig {
                    wechat_ips_check,
                    original_id,
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
                source: None,
            },
            templates,
            reminders,
            due_shards,
            dispatch,
            push,
            notify_sources,
            lanes,
            stack_account: lookup("STACK_ACCOUNT").unwrap_or_default(),
            publishers,
            outcome_bus: lookup("OUTCOME_BUS").filter(|b| !b.trim().is_empty()),
            events_endpoint: lookup("AWS_ENDPOINT_URL_EVENTS").filter(|e| !e.trim().is_empty()),
            wechat_ip_set: lookup("WECHAT_IP_SET").filter(|e| !e.trim().is_empty()),
            wafv2_endpoint: lookup("AWS_ENDPOINT_URL_WAFV2").filter(|e| !e.trim().is_empty()),
            origin,
            origin_enforced,
            openid_salt,
        })
    }
}
