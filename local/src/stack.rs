//! Wires the local stack together: emulator, table, stand-in, config, and the two
//! routers. Shared by the `onegrant-local` binary and the tests, so both run the same
//! wiring.

use std::collections::HashMap;

use onegrant::{Config, Deps};

use crate::standin::StandinConfig;

/// The stand-in's identity in local runs and tests.
pub const LOCAL_APPID: &str = "wx_onegrant_local";
pub const LOCAL_SECRET: &str = "local-app-secret";
/// The templates local runs use unless `ONEGRANT_TEMPLATES` is set.
pub const LOCAL_TEMPLATES: &str = include_str!("../../config/local.templates.json");
/// The reminder kinds local runs use unless `ONEGRANT_REMINDERS` is set.
pub const LOCAL_REMINDERS: &str = include_str!("../../config/local.reminders.json");
/// The publisher the local stack serves unless `ONEGRANT_PUBLISHERS` is set: its
/// `source` and development-only key.
pub const LOCAL_PUBLISHER: (&str, &str) = ("com.example.shop", "local-publisher-secret");

/// [`LOCAL_PUBLISHER`] as `ONEGRANT_PUBLISHERS` lists it.
pub fn local_publishers() -> String {
    serde_json::json!([{"source": LOCAL_PUBLISHER.0, "key": LOCAL_PUBLISHER.1}]).to_string()
}

/// A development-only session key; a deployment always sets its own.
pub const LOCAL_SESSION_SECRET: &str = "local-development-session-secret-not-for-production";

/// Builds a [`Config`] from `overrides` first, then the process environment, then the
/// local defaults above.
pub fn local_config(overrides: &HashMap<&str, String>) -> anyhow::Result<Config> {
    let defaults: HashMap<&str, String> = HashMap::from([
        ("TABLE_NAME", "onegrant-local".to_string()),
        ("WECHAT_APPID", LOCAL_APPID.to_string()),
        ("WECHAT_SECRET", LOCAL_SECRET.to_string()),
        ("SESSION_SECRET", LOCAL_SESSION_SECRET.to_string()),
        ("ONEGRANT_TEMPLATES", LOCAL_TEMPLATES.to_string()),
        ("ONEGRANT_REMINDERS", LOCAL_REMINDERS.to_string()),
        ("MINIPROGRAM_STATE", "developer".to_string()),
        ("ONEGRANT_PUBLISHERS", local_publishers()),
    ]);
    Ok(Config::from_lookup(|name| {
        overrides
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
            .or_else(|| defaults.get(name).cloned())
    })?)
}

/// The message-push settings of local runs: the stand-in seals its pushes with them
/// and the callback opens them. Development-only values.
pub const LOCAL_PUSH: [(&str, &str); 5] = [
    ("WECHAT_PUSH_TOKEN", "local-push-token"),
    ("WECHAT_ORIGINAL_ID", crate::standin::push::DEFAULT_TO_USER),
    (
        "WECHAT_PUSH_AES_KEY",
        "LocalPushKeyForDevelopmentOnlyNotProduction",
    ),
    ("WECHAT_PUSH_MODE", "safe"),
    ("WECHAT_PUSH_FORMAT", "json"),
];

/// Where the stand-in pushes for a stack config serving its API at `api_base`: the
/// callback route, with the config's push token and key (none without a push token).
pub fn standin_push(config: &Config, api_base: &str) -> Option<crate::standin::PushTarget> {
    let push = config.push.as_ref()?;
    Some(crate::standin::PushTarget {
        url: format!("{api_base}/wechat/callback"),
        token: push.token.expose().to_string(),
        aes_key: push
            .aes_key
            .as_ref()
            .filter(|_| push.mode != onegrant::config::PushMode::Plain)
            .map(|k| k.expose().to_string()),
        mode: (push.mode == onegrant::config::PushMode::Compatible).then(|| "compatible".into()),
        format: Some(
            match push.format {
                onegrant::domain::callback::Format::Json => "json",
                onegrant::domain::callback::Format::Xml => "xml",
            }
            .to_string(),
        ),
        delay_ms: None,
        copies: None,
        to_user: Some(push.original_id.clone()),
    })
}

/// The stand-in's config for a stack config: same appid, secret and templates.
pub fn standin_config(config: &Config) -> StandinConfig {
    StandinConfig {
        appid: config.wechat.appid.clone(),
        secret: config
            .wechat
            .secret
            .as_ref()
            .map_or_else(String::new, |s| s.expose().to_string()),
        templates: config.templates.clone(),
        push: None,
        clock: onegrant::Clock::system(),
    }
}

/// Creates the table if it does not exist yet.
pub async fn ensure_table(client: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<()> {
    let exists = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .is_ok();
    if !exists {
        crate::template::create_table(client, table).await?;
    }
    Ok(())
}

/// Builds the dependencies the functions get, on a given DynamoDB client.
pub fn deps(config: Config, dynamodb: aws_sdk_dynamodb::Client) -> anyhow::Result<Deps> {
    Ok(Deps::new(config, dynamodb)?)
}

/// Like [`deps`], reading `clock` (a test's, which it moves).
pub fn deps_on(
    config: Config,
    dynamodb: aws_sdk_dynamodb::Client,
    clock: onegrant::Clock,
) -> anyhow::Result<Deps> {
    Ok(Deps::with_clock(config, dynamodb, clock)?)
}
