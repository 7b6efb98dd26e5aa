//! # onegrant
//!
//! The library behind every onegrant Lambda function. Functions are thin binaries: they
//! build [`Deps`] once per cold start and hand each event to a handler that decodes it,
//! calls one operation here, and maps the result.
//!
//! ## Layout
//! - [`domain`]: pure types and rules — validated ids, templates, subscription results,
//!   grant states, quota arithmetic. No I/O; takes `now` as an argument.
//! - [`store`]: the DynamoDB single-table store. Every state change is a conditional
//!   write or one `TransactWriteItems`; item mapping stays inside this module.
//! - [`wechat`]: the WeChat server API client: login code exchange, access tokens,
//!   subscription-message sends.
//! - [`session`]: signed, expiring bearer tokens (HS256) carrying the user's openid.
//! - [`events`]: plumbing shared by the non-HTTP functions (one handler shape).
//! - [`http`]: HTTP plumbing shared by the HTTP functions — the error type mapped to a
//!   status in one place, body limits, JSON decoding, bearer authentication.
//! - [`config`]: typed configuration read once per cold start; secrets are redacted.
//! - [`aws`]: AWS SDK client construction (rustls with ring, no AWS-LC build).
//! - [`clock`]: the one source of `now`, which tests move instead of waiting.
//! - [`telemetry`]: tracing set-up (JSON in Lambda) and the openid hash used in logs.
//! - [`failpoint`]: named crash points, armed only by the crash-injection tests.

pub mod aws;
#[cfg(feature = "store")]
pub mod bus;
pub mod clock;
pub mod config;
pub mod domain;
#[cfg(feature = "store")]
pub mod events;
pub mod failpoint;
pub mod http;
#[cfg(feature = "store")]
pub mod invoke;
pub mod metrics;
pub mod secrets;
pub mod session;
#[cfg(feature = "store")]
mod signed;
#[cfg(feature = "store")]
pub mod store;
pub mod telemetry;
#[cfg(feature = "store")]
pub mod waf;
pub mod wechat;

use std::sync::Arc;

pub use clock::Clock;
pub use config::Config;

/// What every function needs: config, the WeChat client and the session keys. A
/// function that never touches the table (the session function) is built on this
/// alone, so whatever the workspace's features, it never reaches the AWS SDK and
/// link-time optimisation leaves the SDK out of its binary.
#[derive(Clone)]
pub struct Core {
    pub config: Arc<Config>,
    pub wechat: wechat::WechatClient,
    pub sessions: session::Sessions,
    /// What time it is, for every handler, the dispatcher, the sweep and the store.
    pub clock: Clock,
}

impl Core {
    /// On the system clock.
    pub fn new(config: Arc<Config>) -> Result<Self, DepsError> {
        Self::with_clock(config, Clock::system())
    }

    /// On `clock` (a test's, which it moves).
    pub fn with_clock(config: Arc<Config>, clock: Clock) -> Result<Self, DepsError> {
        // Logs name users by a tag only this deployment can make (the first salt set in
        // a process is kept: one deployment per process).
        telemetry::salt_openid_tags(&config.openid_salt);
        let wechat = wechat::WechatClient::new(config.wechat.clone())
            .map_err(DepsError::Wechat)?
            .with_clock(clock.clone());
        let sessions = session::Sessions::new(&config.session)
            .map_err(DepsError::Session)?
            .with_clock(clock.clone());
        Ok(Self {
            config,
            wechat,
            sessions,
            clock,
        })
    }

    /// A cold start: reads the config (secrets from Secrets Manager), checks it holds
    /// the secrets in `needs`, and builds the clients.
    pub async fn from_env(needs: &[config::Need]) -> Result<Self, DepsError> {
        let config = Config::load().await.map_err(DepsError::Config)?;
        config.require(needs).map_err(DepsError::Config)?;
        Self::new(Arc::new(config))
    }
}

/// Everything a handler of the table needs, built once per cold start and borrowed by
/// each request: the [`Core`] (reached through `Deref`) and the store.
#[cfg(feature = "store")]
#[derive(Clone)]
pub struct Deps {
    pub core: Core,
    pub store: store::Store,
    /// The dispatcher's way to its workers, when it has more than one.
    pub invoker: Option<invoke::Invoker>,
    /// The stack's bus, where outcomes are told (`OUTCOME_BUS`); `None`: not told there.
    pub bus: Option<bus::Bus>,
    /// The edge's IP set of WeChat's push addresses (`WECHAT_IP_SET`), which the
    /// `wechat-ips` function keeps; `None`: the table's copy only.
    pub wechat_ip_set: Option<waf::IpSet>,
}

#[cfg(feature = "store")]
impl std::ops::Deref for Deps {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

#[cfg(feature = "store")]
impl Deps {
    /// Builds the dependencies from a config and an already-built DynamoDB client; an
    /// invoker, if the config asks for workers, signs with local dummy credentials (the
    /// local stack and the tests).
    pub fn new(config: Config, dynamodb: aws_sdk_dynamodb::Client) -> Result<Self, DepsError> {
        Self::with_clock(config, dynamodb, Clock::system())
    }

    /// Like [`Deps::new`], on `clock` (a test's, which it moves).
    pub fn with_clock(
        config: Config,
        dynamodb: aws_sdk_dynamodb::Client,
        clock: Clock,
    ) -> Result<Self, DepsError> {
        let local = aws_credential_types::provider::SharedCredentialsProvider::new(
            aws_credential_types::Credentials::new("local", "local", None, None, "local"),
        );
        Self::with_credentials(config, dynamodb, "us-east-1", local, clock)
    }

    fn with_credentials(
        config: Config,
        dynamodb: aws_sdk_dynamodb::Client,
        region: &str,
        credentials: aws_credential_types::provider::SharedCredentialsProvider,
        clock: Clock,
    ) -> Result<Self, DepsError> {
        let core = Core::with_clock(Arc::new(config), clock.clone())?;
        let store = store::Store::new(dynamodb, core.config.table_name.clone())
            .with_clock(clock)
            .with_shards(core.config.due_shards)
            .with_limits(core.config.limits)
            .with_reminders(core.config.reminders.clone())
            .with_openid_salt(core.config.openid_salt.clone())
            .with_retry_policy(core.config.dispatch.retry_policy());
        let dispatch = &core.config.dispatch;
        let invoker = match &dispatch.function {
            Some(function) if dispatch.workers > 1 => invoke::Invoker::new(
                region,
                credentials.clone(),
                function,
                dispatch.lambda_endpoint.as_deref(),
            ),
            _ => None,
        };
        let bus = core.config.outcome_bus.as_ref().and_then(|name| {
            bus::Bus::new(
                region,
                credentials.clone(),
                name,
                core.config.events_endpoint.as_deref(),
            )
        });
        let wechat_ip_set = core
            .config
            .wechat_ip_set
            .as_deref()
            .map(|arn| {
                waf::IpSet::new(
                    arn,
                    credentials.clone(),
                    core.config.wafv2_endpoint.as_deref(),
                )
            })
            .transpose()
            .map_err(DepsError::WechatIpSet)?;
        Ok(Self {
            core,
            store,
            invoker,
            bus,
            wechat_ip_set,
        })
    }

    /// Reads the config (secrets from Secrets Manager), checks it holds the secrets in
    /// `needs`, and builds every client on Lambda's environment
    /// ([`aws::function_sdk_config`]): a function's `main` calls this once.
    pub async fn from_env(needs: &[config::Need]) -> Result<Self, DepsError> {
        Self::from_env_on(needs, aws::function_sdk_config()).await
    }

    /// The same on `sdk`: an operator's tool passes [`aws::sdk_config`], the SDK's
    /// whole credential chain (a profile, SSO, an assumed role).
    pub async fn from_env_on(
        needs: &[config::Need],
        sdk: aws_config::SdkConfig,
    ) -> Result<Self, DepsError> {
        let config = Config::load().await.map_err(DepsError::Config)?;
        config.require(needs).map_err(DepsError::Config)?;
        let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
        let region = sdk
            .region()
            .map_or_else(|| "us-east-1".into(), |r| r.to_string());
        match sdk.credentials_provider() {
            Some(credentials) => {
                Self::with_credentials(config, dynamodb, &region, credentials, Clock::system())
            }
            // No credentials to sign with: no fan-out (the tick does every shard).
            None => Self::new(config, dynamodb).map(|deps| Self {
                invoker: None,
                bus: None,
                wechat_ip_set: None,
                ..deps
            }),
        }
    }
}

/// Why a cold start could not build its dependencies.
#[derive(Debug, thiserror::Error)]
pub enum DepsError {
    #[error("configuration is invalid")]
    Config(#[source] config::ConfigError),
    #[error("the WeChat client could not be built")]
    Wechat(#[source] wechat::WechatError),
    #[error("the session keys could not be built")]
    Session(#[source] session::SessionError),
    #[cfg(feature = "store")]
    #[error("WECHAT_IP_SET is invalid")]
    WechatIpSet(#[source] waf::WafError),
}
